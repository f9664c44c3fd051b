"""Real boards without the hardware: `make flash` and `mcuforge run --port`'s command lines
(fake flash tools on PATH that record their arguments), the serial path read by pyserial from
a pty pair replaying a firmware transcript captured under QEMU, and the NUCLEO-L4R5ZI's 120 MHz
clock code run on the host against simulated registers, its values checked against RM0432's
formulas computed here."""
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from conftest import require, require_tools
from mcuforge.ir.errors import BuildError, McuforgeError
from mcuforge import cli
from mcuforge.board import board_dir, load_board

serial = require("serial")  # the `boards` extra (and the test extra): CI fails without it

CROSS = "arm-none-eabi-"
W = (np.arange(12, dtype=np.float32).reshape(4, 3) - 5) / 8  # exact in binary: sums are exact
# The flash tools' documented command lines, per board (pyOCD target names: ST's CMSIS packs'
# device names for the STM32L4R5ZITx and STM32F746NGHx; nrfjprog: the nRF52 family).
FLASH = {"nucleo-l4r5zi": ["pyocd", "flash", "-t", "stm32l4r5zitx", "tiny.elf"],
         "stm32f746g-disco": ["pyocd", "flash", "-t", "stm32f746nghx", "tiny.elf"],
         "nrf52840dk": ["nrfjprog", "-f", "NRF52", "--program", "tiny.hex", "--sectorerase",
                        "--verify", "--reset"]}


def tiny_model(path: Path) -> Path:
    """y = x @ W: float, one layer, quick to build."""
    g = helper.make_graph([helper.make_node("MatMul", ["x", "W"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3])],
                          [numpy_helper.from_array(W, "W")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8
    onnx.save(m, path)
    return path


def fake_tool(bin_dir: Path, name: str, log: Path) -> None:
    """A stand-in flash tool: appends its argv (and its working directory) to `log`."""
    bin_dir.mkdir(exist_ok=True)
    script = bin_dir / name
    script.write_text(f"#!{sys.executable}\nimport os, sys, json\n"
                      f"open({str(log)!r}, 'a').write(json.dumps([os.getcwd()] + sys.argv[1:])"
                      f" + '\\n')\n")
    script.chmod(0o755)


@pytest.fixture
def arm_gcc():
    require_tools(CROSS + "gcc")


# ---- make flash --------------------------------------------------------------------------------

@pytest.mark.parametrize("board", sorted(FLASH))
def test_make_flash_runs_the_boards_tool(board, tmp_path, arm_gcc):
    import json
    model = tiny_model(tmp_path / "tiny.onnx")
    out = tmp_path / "fw"
    assert cli.main(["compile", str(model), "-o", str(out), "--board", board]) == 0
    log = tmp_path / "log.jsonl"
    fake_tool(tmp_path / "bin", FLASH[board][0], log)
    env = dict(os.environ, PATH=f"{tmp_path / 'bin'}:{os.environ['PATH']}")
    r = subprocess.run(["make", "-C", str(out), "flash"], capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stdout + r.stderr  # -Werror build of the firmware, then flash
    (cwd, *argv), = [json.loads(line) for line in log.read_text().splitlines()]
    assert [FLASH[board][0], *argv] == FLASH[board] and Path(cwd) == out
    image = out / next(a for a in FLASH[board] if a.startswith("tiny."))
    head = image.read_bytes()[:4]
    if image.suffix == ".hex":  # Intel hex records
        assert head[:1] == b":" and all(re.fullmatch(r":[0-9A-F]+", line)
                                        for line in image.read_text().split())
    else:
        assert head == b"\x7fELF"
    # the tool missing: one line saying what to install, and make fails
    env["PATH"] = "/usr/bin:/bin"
    r = subprocess.run(["make", "-C", str(out), "flash"], capture_output=True, text=True, env=env)
    assert r.returncode != 0
    want = "pip install 'mcuforge[boards]'" if FLASH[board][0] == "pyocd" else "nrfjprog"
    assert f"{FLASH[board][0]} not found" in r.stdout and want in r.stdout


@pytest.mark.parametrize("board", sorted(FLASH))
def test_run_port_flashes_with_the_same_command(board, tmp_path, monkeypatch, arm_gcc):
    """hardware.flash (what `run --port` calls) runs make flash's command in the project, the
    image (the nrf's Intel hex made first) in place; a missing tool is one clear error."""
    import json
    from mcuforge import hardware
    from mcuforge.target import build_firmware
    b = load_board(board)
    model = tiny_model(tmp_path / "tiny.onnx")
    project, _, _ = build_firmware(model, b, [[np.zeros((1, 4), np.float32)]], tmp_path / "fw",
                                   name="tiny")
    log = tmp_path / "log.jsonl"
    fake_tool(tmp_path / "bin", FLASH[board][0], log)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{os.environ['PATH']}")
    hardware.flash(b, project, "tiny")
    (cwd, *argv), = [json.loads(line) for line in log.read_text().splitlines()]
    assert [FLASH[board][0], *argv] == FLASH[board] and Path(cwd) == project
    assert (project / next(a for a in FLASH[board] if a.startswith("tiny."))).is_file()
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    with pytest.raises(McuforgeError, match=rf"{FLASH[board][0]} not found \(it flashes "
                                            rf"{board}\)"):
        hardware.flash(b, project, "tiny")


def test_emulated_boards_have_no_flash_target(tmp_path):
    model = tiny_model(tmp_path / "tiny.onnx")
    assert cli.main(["compile", str(model), "-o", str(tmp_path / "fw"), "--board",
                     "mps2-an386"]) == 0
    assert "flash:" not in (tmp_path / "fw" / "Makefile").read_text()


# ---- the serial port: a pty pair plays the board ------------------------------------------------

@pytest.fixture(scope="module")
def transcript(tmp_path_factory):
    """The tiny model's firmware output for two inputs, captured under QEMU (mps2-an386: the
    same harness as the real boards'), then as a UART sends it (CR LF) from nucleo-l4r5zi."""
    require_tools(CROSS + "gcc", "qemu-system-arm")
    from mcuforge.target import build_firmware, run_elf
    tmp = tmp_path_factory.mktemp("qemu")
    model = tiny_model(tmp / "tiny.onnx")
    x = np.array([[[1, 2, 3, 4]], [[-0.5, 0.25, 8, -3]]], np.float32)
    board = load_board("mps2-an386")
    _, elf, _ = build_firmware(model, board, [[v] for v in x], tmp / "fw")
    text = run_elf(board, elf, timeout=120)
    start = text.index("mcuforge: model on mps2-an386")
    text = text[start:].replace("mps2-an386", "nucleo-l4r5zi")
    assert text.rstrip().endswith("done")
    return model, x, text.replace("\n", "\r\n").encode()


@pytest.fixture
def pty_port():
    """(master fd, slave fd, slave name): pyserial opens the slave as it would /dev/ttyACM0."""
    master, slave = os.openpty()
    yield master, slave, os.ttyname(slave)
    os.close(master)
    os.close(slave)


def opened(slave: int):
    """True once pyserial has opened the port (it sets raw mode: no ICANON, no echo)."""
    import termios
    return lambda: not termios.tcgetattr(slave)[3] & termios.ICANON


def feed_after(master: int, data: bytes, when, chunk: int = 7):
    """Writes `data` to the pty's master side in small pieces once `when()` holds (and the
    reader had a moment to flush its input buffer)."""
    def go():
        deadline = time.monotonic() + 60
        while not when() and time.monotonic() < deadline:
            time.sleep(0.02)
        time.sleep(0.3)
        for i in range(0, len(data), chunk):
            os.write(master, data[i:i + chunk])
            time.sleep(0.001)
    t = threading.Thread(target=go, daemon=True)
    t.start()
    return t


def test_run_port_flashes_then_reads_the_uart(transcript, pty_port, tmp_path, monkeypatch,
                                              capsys):
    """`mcuforge run --board nucleo-l4r5zi --port PTY`: builds, calls pyOCD as `make flash`
    does, and reads the results the "board" prints once flashed, after a previous run's tail
    and line noise; they equal x @ W computed by numpy."""
    import json
    model, x, text = transcript
    master, _, port = pty_port
    log = tmp_path / "log.jsonl"
    fake_tool(tmp_path / "bin", "pyocd", log)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{os.environ['PATH']}")
    noise = b"ks 12\r\nout0 0011\r\ndone\r\n\x00\xff\xfe garbage \r\n\x00"
    feeder = feed_after(master, noise + text, when=log.exists)
    np.save(tmp_path / "x.npy", x)
    status = cli.main(["run", str(model), "--board", "nucleo-l4r5zi", "--port", port,
                       "--input", str(tmp_path / "x.npy"), "--output", str(tmp_path / "y.npy"),
                       "--timeout", "20"])
    feeder.join()
    assert status == 0, capsys.readouterr().err
    (cwd, *argv), = [json.loads(line) for line in log.read_text().splitlines()]
    assert argv == ["flash", "-t", "stm32l4r5zitx", "model.elf"]
    assert (Path(cwd) / "model.elf").read_bytes()[:4] == b"\x7fELF"
    y = np.load(tmp_path / "y.npy")
    np.testing.assert_array_equal(y, x @ W)  # exact: W is in eighths, x in quarters


def test_no_flash_reads_without_calling_the_tool(transcript, pty_port, tmp_path, monkeypatch,
                                                 capsys):
    model, x, text = transcript
    master, slave, port = pty_port
    monkeypatch.setenv("PATH", "/usr/bin:/bin")  # no pyocd: --no-flash must not need it
    feeder = feed_after(master, text, when=opened(slave))
    np.save(tmp_path / "x.npy", x)
    status = cli.main(["run", str(model), "--board", "nucleo-l4r5zi", "--port", port,
                       "--no-flash", "--input", str(tmp_path / "x.npy"),
                       "--output", str(tmp_path / "y.npy"), "--timeout", "20"])
    feeder.join()
    assert status == 0
    assert "press its reset button" in capsys.readouterr().err
    np.testing.assert_array_equal(np.load(tmp_path / "y.npy"), x @ W)


def read(port: str, timeout: float) -> str:
    from mcuforge.hardware import open_port, read_transcript
    ser = open_port(port)
    try:
        return read_transcript(ser, port, "mcuforge: model on nucleo-l4r5zi", timeout)
    finally:
        ser.close()


def test_transcript_after_garbage(transcript, pty_port):
    _, _, text = transcript
    master, slave, port = pty_port
    feeder = feed_after(master, b"\xff\xfe\x00 boot noise mcuforge: model on\r\n" + text,
                        opened(slave))
    got = read(port, 10)
    feeder.join()
    assert got.splitlines()[0] == "mcuforge: model on nucleo-l4r5zi"
    assert got.splitlines()[-1] == "done" and "\r" not in got
    assert "noise" not in got


def test_truncated_transcript_is_a_clear_error(transcript, pty_port):
    _, _, text = transcript
    master, slave, port = pty_port
    cut = text[:text.index(b"out0") + 10]  # dies in the middle of the first output line
    feeder = feed_after(master, cut, opened(slave))
    with pytest.raises(BuildError, match=rf"output on {re.escape(port)} stopped after 2 lines "
                                         r".*before its last line 'done'"):
        read(port, 1.5)
    feeder.join()


def test_silent_port_times_out_naming_it(pty_port):
    _, _, port = pty_port
    t0 = time.monotonic()
    with pytest.raises(BuildError, match=rf"nothing from the firmware on {re.escape(port)} "
                                         r"within 1 s"):
        read(port, 1.0)
    assert time.monotonic() - t0 < 5


def test_firmware_error_line_is_reported(pty_port):
    master, slave, port = pty_port
    feeder = feed_after(master, b"mcuforge: model on nucleo-l4r5zi\r\nmcuforge: hard fault\r\n",
                        opened(slave))
    with pytest.raises(BuildError, match="reported on .*: mcuforge: hard fault"):
        read(port, 5)
    feeder.join()


def test_missing_port_is_one_clear_error(tmp_path, capsys, arm_gcc, monkeypatch):
    model = tiny_model(tmp_path / "tiny.onnx")
    np.save(tmp_path / "x.npy", np.zeros((1, 4), np.float32))
    port = str(tmp_path / "ttyACM9")
    assert cli.main(["run", str(model), "--board", "nucleo-l4r5zi", "--port", port,
                     "--input", str(tmp_path / "x.npy"), "--output",
                     str(tmp_path / "y.npy")]) == 2
    err = capsys.readouterr().err
    assert f"cannot open the serial port {port}" in err and "Traceback" not in err


def test_without_pyserial_the_error_says_what_to_install(monkeypatch):
    from mcuforge import hardware
    monkeypatch.setitem(sys.modules, "serial", None)  # import serial -> ImportError
    with pytest.raises(McuforgeError, match=r"pip install 'mcuforge\[boards\]'"):
        hardware.open_port("/dev/ttyACM0")


def test_port_on_an_emulated_board_is_refused(tmp_path, capsys):
    model = tiny_model(tmp_path / "tiny.onnx")
    np.save(tmp_path / "x.npy", np.zeros((1, 4), np.float32))
    assert cli.main(["run", str(model), "--board", "mps2-an386", "--port", "/dev/null",
                     "--input", str(tmp_path / "x.npy"), "--output",
                     str(tmp_path / "y.npy")]) == 2
    assert "--port is for real boards" in capsys.readouterr().err


# ---- the NUCLEO-L4R5ZI clock: clock.c on simulated registers ----------------------------------

RCC, PWR, FLASH_R = 0x40021000, 0x40007000, 0x40022000
RCC_CR, RCC_CFGR, RCC_PLLCFGR, RCC_APB1ENR1 = RCC, RCC + 0x08, RCC + 0x0C, RCC + 0x58
PWR_CR1, PWR_SR2, PWR_CR5, FLASH_ACR = PWR, PWR + 0x14, PWR + 0x80, FLASH_R
# RM0432's reset values of the registers the code reads
RESET = {RCC_CR: 0x63, RCC_CFGR: 0, RCC_PLLCFGR: 0x1000, RCC_APB1ENR1: 0x400,
         PWR_CR1: 0x200, PWR_SR2: 0, PWR_CR5: 0x100, FLASH_ACR: 0x600}

SIM = r"""
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
static uint32_t addr_of[16], value_of[16];
static int used;
static uint32_t *reg(uint32_t a) {
    int i;
    for (i = 0; i < used; ++i) if (addr_of[i] == a) return &value_of[i];
    fprintf(stderr, "unexpected register 0x%08x\n", (unsigned)a);
    exit(3);
}
static void seed(uint32_t a, uint32_t v) { addr_of[used] = a; value_of[used++] = v; }
/* hardware status bits follow their control bits: HSIRDY <- HSION, PLLRDY <- PLLON,
 * SWS <- SW */
static uint32_t sim_read(uint32_t a) {
    uint32_t v = *reg(a);
    if (a == 0x40021000u) {
        v = (v & ~((1u << 10) | (1u << 25))) | (((v >> 8) & 1u) << 10) | (((v >> 24) & 1u) << 25);
    } else if (a == 0x40021008u) {
        v = (v & ~0xCu) | ((v & 3u) << 2);
    }
    return v;
}
static void sim_write(uint32_t a, uint32_t v) {
    *reg(a) = v;
    printf("W %08x %08x\n", (unsigned)a, (unsigned)v);
}
#define MF_REG_READ(a) sim_read(a)
#define MF_REG_WRITE(a, v) sim_write((a), (v))
#include "clock.c"
int main(void) {
%SEEDS%
    mf_clock_init();
    return 0;
}
"""


def field(v: int, lo: int, width: int) -> int:
    return (v >> lo) & ((1 << width) - 1)


def test_clock_registers_follow_rm0432(tmp_path):
    require_tools("gcc")
    seeds = "\n".join(f"    seed(0x{a:08x}u, 0x{v:x}u);" for a, v in RESET.items())
    (tmp_path / "sim.c").write_text(SIM.replace("%SEEDS%", seeds))
    exe = tmp_path / "sim"
    r = subprocess.run(["gcc", "-std=c99", "-Wall", "-Wextra", "-Werror", "-I",
                        str(board_dir("nucleo-l4r5zi")), "-o", str(exe), str(tmp_path / "sim.c")],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    r = subprocess.run([str(exe)], capture_output=True, text=True, timeout=10)
    assert r.returncode == 0, r.stderr
    writes = [(int(a, 16), int(v, 16)) for _, a, v in (line.split() for line in
                                                      r.stdout.splitlines())]
    state = dict(RESET)
    switched = None
    for i, (a, v) in enumerate(writes):
        if a == RCC_CFGR and field(v, 0, 2) == 3 and field(state[RCC_CFGR], 0, 2) != 3:
            switched = i  # the write that moves SYSCLK onto the PLL
            pll, cr, acr = state[RCC_PLLCFGR], state[RCC_CR], state[FLASH_ACR]
            # PLL configured, on (and so locked, in the simulation) before the switch
            assert cr >> 24 & 1 and cr >> 8 & 1  # PLLON, HSION
            # RM0432 "Dynamic voltage scaling management": range 1 (VOS = 01), boost
            # (R1MODE = 0), HCLK halved (HPRE = 1000) while switching above 80 MHz
            assert field(state[PWR_CR1], 9, 2) == 1 and field(state[PWR_CR5], 8, 1) == 0
            assert field(v, 4, 4) == 0b1000
            # flash wait states for the new frequency already set
            f_in = {2: 16e6}[field(pll, 0, 2)]  # PLLSRC 10: HSI16
            m, n = field(pll, 4, 4) + 1, field(pll, 8, 7)
            r_div = {0: 2, 1: 4, 2: 6, 3: 8}[field(pll, 25, 2)]
            assert field(pll, 24, 1) == 1  # PLLREN: the R output feeds SYSCLK
            assert 2.66e6 <= f_in / m <= 16e6  # VCO input
            assert 8 <= n <= 127 and 64e6 <= f_in / m * n <= 344e6  # VCO output
            sysclk = f_in / m * n / r_div
            assert sysclk == 120e6
            # RM0432 "Number of wait states according to CPU clock (HCLK) frequency", range 1:
            # 0 WS up to 20 MHz, each further 20 MHz one more
            ws_needed = int(np.ceil(sysclk / 20e6)) - 1
            assert ws_needed == 5 and field(acr, 0, 4) >= ws_needed
        if a == PWR_CR5 or a == PWR_CR1:
            assert state[RCC_APB1ENR1] >> 28 & 1  # PWREN before touching PWR
        if a == RCC_PLLCFGR:
            assert not state[RCC_CR] >> 24 & 1  # PLL off while configured
        state[a] = v
    assert switched is not None, "SYSCLK never switched to the PLL"
    # afterwards HCLK = SYSCLK (HPRE back to /1), SYSCLK still the PLL, 5 WS kept
    assert field(state[RCC_CFGR], 4, 4) == 0 and field(state[RCC_CFGR], 0, 2) == 3
    assert any(a == RCC_CFGR for a, _ in writes[switched + 1:])
    assert field(state[FLASH_ACR], 0, 4) == 5 and state[FLASH_ACR] & 0x600 == 0x600  # caches on
    # the board's SysTick figures use the real frequency
    assert load_board("nucleo-l4r5zi").clock_hz == 120_000_000


def test_firmware_calls_the_clock_code_first(tmp_path, arm_gcc):
    """The board's firmware builds -Werror clean with clock.c, in UART and semihosting mode,
    and mf_board_init calls mf_clock_init (the strong one) before mf_uart_init."""
    model = tiny_model(tmp_path / "tiny.onnx")
    out = tmp_path / "fw"
    assert cli.main(["compile", str(model), "-o", str(out), "--board", "nucleo-l4r5zi"]) == 0
    for mode in ("0", "1"):
        r = subprocess.run(["make", "-C", str(out), f"SEMIHOSTING={mode}"], capture_output=True,
                           text=True)
        assert r.returncode == 0 and "warning" not in r.stdout + r.stderr, r.stdout + r.stderr
        nm = subprocess.run([CROSS + "nm", str(out / "tiny.elf")], capture_output=True,
                            text=True).stdout
        assert re.search(r"^[0-9a-f]+ T mf_clock_init$", nm, re.M)  # clock.c's, not the weak
        dis = subprocess.run([CROSS + "objdump", "-d", str(out / "tiny.elf")],
                             capture_output=True, text=True).stdout
        body = dis.split("<mf_board_init>:\n")[1].split("\n\n")[0]
        calls = re.findall(r"\tb(?:l|\.w)?\s+[0-9a-f]+ <(\w+)>", body)
        want = ["mf_clock_init", "mf_uart_init"] if mode == "0" else ["mf_clock_init"]
        assert calls == want, body
