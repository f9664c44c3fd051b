"""The real boards (NUCLEO-L4R5ZI, STM32F746G-DISCO, nRF52840 DK), built and size-checked, not
run: there is no hardware here and QEMU emulates none of them.

Every MLPerf Tiny int8 model that fits a board is compiled for it once and built with `make`
(output through the board's uart.c) and, for KWS and VWW, also with `make SEMIHOSTING=1`. Each
ELF must lie inside the board's flash and RAM as board.toml gives them: allocated sections and
load addresses in their region, the vector table at the start of flash with the initial stack
pointer at the top of RAM and the reset vector on Reset_Handler in flash, flash use (text +
rodata + data) within the flash size and RAM use (data + bss) plus a 4 KB stack within the RAM
size. A model that does not fit must be refused by `mcuforge compile` with exit status 2 and the
numbers; all five fit all three boards, so a board shrunk to one byte too small stands in."""
import dataclasses
import re
import shutil
import struct
import subprocess
from pathlib import Path

import pytest

import mcuforge.api
from conftest import MLPERF_INT8, mlperf_model, require_tools
from mcuforge import cli
from mcuforge.codegen_c.kernels.budget import CODE_ALLOWANCE
from mcuforge.api import check_fits, default_name, load
from mcuforge.codegen_c.model import generate
from mcuforge.optimizer.pipeline import optimize
from mcuforge.tools.info import model_info
from mcuforge.board import board_dir, load_board
from mcuforge.ir.errors import McuforgeError

REAL_BOARDS = ("nucleo-l4r5zi", "stm32f746g-disco", "nrf52840dk")
SEMIHOSTING_MODELS = ("kws_ref_model", "vww_96_int8")  # `make SEMIHOSTING=1` too
CROSS = "arm-none-eabi-"
STACK = 4096  # RAM kept free for the stack, at least


@pytest.fixture
def arm_gcc():
    require_tools(CROSS + "gcc")


def tool(*args) -> str:
    r = subprocess.run([CROSS + args[0], *map(str, args[1:])], capture_output=True, text=True)
    assert r.returncode == 0, f"{CROSS}{args[0]} failed:\n{r.stderr}"
    return r.stdout


def compile_cli(model: Path, out: Path, board: str, capsys) -> tuple:
    """`mcuforge compile` in-process: (exit status, stderr)."""
    capsys.readouterr()
    status = cli.main(["compile", str(model), "-o", str(out), "--board", board])
    return status, capsys.readouterr().err


# ---- the board definitions ---------------------------------------------------------------------

@pytest.mark.parametrize("name", REAL_BOARDS)
def test_board_definition(name):
    b = load_board(name)
    assert (b.family, b.output, b.fpu, b.hardware_tested) == ("cortex-m", "uart", True, False)
    assert not b.emulated and "uart.c" in b.extra_sources
    assert b.extra_sources == (("clock.c", "uart.c") if name == "nucleo-l4r5zi" else ("uart.c",))
    assert b.probe_tool and b.probe_target  # `make flash` (tests/test_real_boards_serial.py)
    assert b.clock_hz and b.flash_size and b.ram_size and b.min_stack >= STACK
    assert any(f.startswith("-mcpu=cortex-m") for f in b.cflags)
    assert {"-mthumb", "-mfloat-abi=hard"} <= set(b.cflags)
    assert any(f.startswith("-mfpu=") for f in b.cflags)
    text = (board_dir(name) / "board.toml").read_text()
    assert "NOT YET RUN ON HARDWARE" in text  # said plainly, where people look
    assert "[qemu]" not in text and "qemu =" not in text


# ---- every model that fits: build, then check the ELF against the memory map -------------------

def sections(elf: Path) -> list:
    """Allocated sections from `readelf -S`: (name, type, address, size, flags)."""
    rows = re.findall(r"^\s*\[\s*\d+\]\s+(\S+)\s+(\S+)\s+([0-9a-f]{8})\s+[0-9a-f]+\s+"
                      r"([0-9a-f]+)\s+[0-9a-f]+\s+([A-Za-z]*)\s+\d+\s+\d+\s+\d+\s*$",
                      tool("readelf", "-S", "-W", elf), re.M)
    return [(n, t, int(a, 16), int(s, 16), f) for n, t, a, s, f in rows if "A" in f]


def load_segments(elf: Path) -> list:
    """LOAD segments from `readelf -l`: (virtual address, load address, file size, memory size)."""
    rows = re.findall(r"^\s*LOAD\s+0x[0-9a-f]+\s+0x([0-9a-f]+)\s+0x([0-9a-f]+)\s+"
                      r"0x([0-9a-f]+)\s+0x([0-9a-f]+)\s", tool("readelf", "-l", "-W", elf), re.M)
    return [tuple(int(x, 16) for x in row) for row in rows]


def symbols(elf: Path) -> dict:
    return {m[2]: int(m[0], 16) for m in re.findall(r"^([0-9a-f]+) (\w) (\S+)$",
                                                    tool("nm", elf), re.M)}


def check_elf(board, elf: Path, uart: bool, tmp_path: Path) -> tuple:
    """The ELF against the board's memory map; (flash bytes, RAM bytes)."""
    flash = (board.flash_origin, board.flash_origin + board.flash_size)
    ram = (board.ram_origin, board.ram_origin + board.ram_size)

    def inside(region, start, size):
        return region[0] <= start and start + size <= region[1]

    secs = sections(elf)
    names = [s[0] for s in secs]
    assert names[0] == ".text" and secs[0][2] == board.flash_origin and ".bss" in names, secs
    for name, _, addr, size, flags in secs:
        region = ram if "W" in flags else flash  # code and constants in flash, variables in RAM
        assert inside(region, addr, size), f"{name} at {addr:#x}+{size:#x} is outside " \
            f"{'RAM' if 'W' in flags else 'flash'} {region[0]:#x}..{region[1]:#x}"
    text = sum(s[3] for s in secs if "W" not in s[4])  # .text (with .rodata), .ARM.exidx
    data = sum(s[3] for s in secs if "W" in s[4] and s[1] != "NOBITS")
    bss = sum(s[3] for s in secs if "W" in s[4] and s[1] == "NOBITS")
    assert tool("size", "-B", elf).splitlines()[1].split()[:3] == [str(text), str(data), str(bss)]
    segments = load_segments(elf)
    assert segments, f"no LOAD segments in {elf}"
    for vaddr, paddr, filesz, memsz in segments:
        assert inside(flash, paddr, filesz), f"segment loaded at {paddr:#x} is not in flash"
        assert inside(flash, vaddr, memsz) or inside(ram, vaddr, memsz)
    flash_use, ram_use = text + data, data + bss
    assert flash_use <= board.flash_size, f"{flash_use:,} bytes of flash > {board.flash_size:,}"
    assert ram_use + STACK <= board.ram_size, \
        f"{ram_use:,} bytes of RAM used + {STACK:,} of stack > {board.ram_size:,}"

    # The vector table opens the flash image: initial SP, then the reset vector (Thumb).
    image = tmp_path / (elf.stem + ".bin")
    tool("objcopy", "-O", "binary", elf, image)
    raw = image.read_bytes()
    assert text <= len(raw) <= flash_use + 8 and len(raw) <= board.flash_size
    sp, reset = struct.unpack_from("<II", raw)
    assert sp == board.ram_origin + board.ram_size, f"initial SP {sp:#x} is not the top of RAM"
    syms = symbols(elf)
    assert reset & 1 and inside(flash, reset & ~1, 2), f"reset vector {reset:#x} not in flash"
    assert reset & ~1 == syms["Reset_Handler"] & ~1
    entry = re.search(r"Entry point address:\s+0x([0-9a-f]+)", tool("readelf", "-h", elf))
    assert int(entry[1], 16) & ~1 == reset & ~1
    for i, v in enumerate(struct.unpack_from("<16I", raw)[1:], 1):  # exception handlers
        assert v == 0 or (v & 1 and inside(flash, v & ~1, 2)), f"vector {i} = {v:#x}"

    # The board's UART driver is linked in UART mode and left out under semihosting.
    has_uart = {"mf_uart_init", "mf_uart_putc"} <= syms.keys()
    assert has_uart == uart, f"mf_uart_* {'missing' if uart else 'linked'} in {elf}"
    if uart:
        assert inside(flash, syms["mf_uart_init"], 2)
    return flash_use, ram_use


def assert_justified_refusal(err: str, board) -> None:
    """A refusal names the board's size, and the model's need really exceeds it."""
    num = r"([\d,]+)"
    ram = re.search(rf"needs {num} bytes of arena plus {num} of stack, but \S+ has {num} bytes "
                    r"of RAM", err)
    flash = re.search(rf"{num} in all, but \S+ has {num} bytes of flash", err)
    assert ram or flash, err
    n = [int(x.replace(",", "")) for x in (ram or flash).groups()]
    if ram:
        assert n[2] == board.ram_size and n[0] + n[1] > n[2], err
    else:
        assert n[1] == board.flash_size and n[0] > n[1], err


@pytest.mark.parametrize("stem", MLPERF_INT8)
@pytest.mark.parametrize("name", REAL_BOARDS)
def test_mlperf_model_builds_and_fits(name, stem, tmp_path, capsys, arm_gcc):
    board = load_board(name)
    path = mlperf_model(stem)
    out = tmp_path / "fw"
    status, err = compile_cli(path, out, name, capsys)
    if status == 2:  # does not fit: refused, with the numbers, and nothing written
        assert_justified_refusal(err, board)
        assert not out.exists()
        return
    assert status == 0, err

    builds = [(out, [])]
    if stem in SEMIHOSTING_MODELS:
        shutil.copytree(out, tmp_path / "fw-semihosting")
        builds.append((tmp_path / "fw-semihosting", ["SEMIHOSTING=1"]))
    for project, args in builds:
        r = subprocess.run(["make", "-s", "-C", str(project), *args], capture_output=True,
                           text=True)
        assert r.returncode == 0, f"make {' '.join(args)} failed:\n{r.stdout}{r.stderr}"
        elf = project / f"{default_name(path)}.elf"
        flash_use, ram_use = check_elf(board, elf, uart=not args, tmp_path=tmp_path)
        print(f"{name} {stem} {' '.join(args) or 'UART'}: flash {flash_use:,} of "
              f"{board.flash_size:,}, RAM {ram_use:,} + stack of {board.ram_size:,}")


# ---- a model that does not fit is refused ------------------------------------------------------

def test_model_too_big_for_the_board_is_refused(tmp_path, capsys, monkeypatch):
    """KWS fits every real board, so shrink one to a byte less than KWS needs: check_fits
    raises, and `mcuforge compile` exits 2 with the numbers and writes nothing. At exactly
    what it needs, it compiles."""
    path = mlperf_model("kws_ref_model")
    real = load_board("nucleo-l4r5zi")
    r = mcuforge.api.compile(path, tmp_path / "fits", board=real.name)
    # the least flash KWS can take on this board: every layer's weights int8 (what the flash
    # budget can narrow at most), plus the code allowance; with less, nothing makes it fit
    g = optimize(load(path))
    every = frozenset(n.outputs[0] for n in g.nodes)
    narrowest = generate(g, "model", dataclasses.replace(
        real.target(None), narrow_weights=every)).weight_bytes
    need_ram, need_flash = r.arena_bytes + real.min_stack, narrowest + CODE_ALLOWANCE

    small_ram = dataclasses.replace(real, ram_size=need_ram - 1)
    small_flash = dataclasses.replace(real, flash_size=need_flash - 1)
    exact = dataclasses.replace(real, ram_size=need_ram, flash_size=need_flash)
    for small, weights in ((small_ram, r.weight_bytes), (small_flash, narrowest)):
        with pytest.raises(McuforgeError):
            check_fits(small, r.arena_bytes, weights)
    check_fits(exact, r.arena_bytes, narrowest)

    for board, numbers in ((small_ram, (r.arena_bytes, real.min_stack, need_ram - 1)),
                           (small_flash, (need_flash, need_flash - 1)), (exact, None)):
        monkeypatch.setattr(mcuforge.api, "load_board", lambda name, b=board: b)
        out = tmp_path / f"out-{board.ram_size}-{board.flash_size}"
        status, err = compile_cli(path, out, real.name, capsys)
        if numbers is None:
            assert status == 0, err
            continue
        assert status == 2 and "Traceback" not in err, err
        assert all(f"{n:,}" in err for n in numbers), err
        assert_justified_refusal(err, board)
        assert not out.exists()
