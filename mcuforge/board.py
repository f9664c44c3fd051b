"""Board definitions: boards/<name>/board.toml, data rather than code.

A board names its family (host, cortex-m, riscv), which decides the project files generated
from templates/; the board file adds CPU flags, memory, clock, output channel and the QEMU
machine that emulates it, if any. C files in the board's folder (a UART driver) are copied
into the project."""
from __future__ import annotations

import math

import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from mcuforge.ir.errors import McuforgeError
from mcuforge.ir.target import Target
from mcuforge.codegen_c.resources import data_dir

_FIRMWARE = {"main.c": "firmware/main.c.j2", "inputs.h": "firmware/inputs.h.j2",
             "mf_board.h": "firmware/mf_board.h.j2", "Makefile": "firmware/Makefile.j2"}
FAMILIES = {
    "host": dict(files={"main.c": "host/main.c.j2", "Makefile": "host/Makefile.j2"}),
    "cortex-m": dict(
        files={**_FIRMWARE, "mf_board.c": "cortex_m/mf_board.c.j2",
               "startup.c": "cortex_m/startup.c.j2", "link.ld": "cortex_m/link.ld.j2"},
        cross="arm-none-eabi-", qemu="qemu-system-arm",
        ldflags=["-nostartfiles", "--specs=nano.specs"], ldlibs=["-lm"]),
    "riscv": dict(
        files={**_FIRMWARE, "mf_board.c": "riscv/mf_board.c.j2", "startup.S": "riscv/startup.S.j2",
               "link.ld": "riscv/link.ld.j2", "mf_libc.c": "riscv/mf_libc.c.j2",
               "string.h": "riscv/string.h.j2"},  # no C library: the project's own
        cross="riscv64-unknown-elf-", qemu="qemu-system-riscv32",
        ldflags=["-nostdlib", "-nostartfiles", "-ffreestanding"], ldlibs=["-lgcc"]),
}


@dataclass(frozen=True)
class Board:
    name: str
    description: str
    family: str
    cpu: str = "host"
    cflags: tuple = ()
    features: tuple = ()  # ir.target.FEATURES the CPU has
    fpu: bool = False
    flash_origin: int = 0
    flash_size: int | None = None
    ram_origin: int = 0
    ram_size: int | None = None
    clock_hz: int | None = None
    output: str = "stdio"  # stdio (host), semihosting, uart
    qemu_machine: str | None = None
    qemu_args: tuple = ()
    hardware_tested: bool = False
    min_stack: int = 4096
    extra_sources: tuple = ()  # C files from the board's folder
    files: dict = field(default_factory=dict)  # project file -> template
    cross: str = ""
    ldflags: tuple = ()
    ldlibs: tuple = ()
    qemu_binary: str = ""
    probe_tool: str = ""  # what `make flash` runs (board.toml's probe): pyocd, nrfjprog
    probe_target: str = ""
    probe_pack: bool = False  # pyOCD's target comes from a CMSIS pack

    @property
    def emulated(self) -> bool:
        return self.qemu_machine is not None

    @property
    def counter_unit(self) -> str:
        return "processor clock cycles (instructions under QEMU -icount)"

    @property
    def qemu_command(self) -> list:
        """QEMU with one virtual nanosecond per instruction, output by semihosting."""
        return [self.qemu_binary, "-M", self.qemu_machine, *self.qemu_args, "-nographic",
                "-monitor", "none", "-serial", "null",
                "-semihosting-config", "enable=on,target=native",
                "-icount", "shift=0,align=off,sleep=off"]

    @property
    def flash_image(self) -> str:
        """The file the flash tool takes: nrfjprog an Intel hex file, pyOCD the ELF."""
        return "hex" if self.probe_tool == "nrfjprog" else "elf"

    def flash_command(self, name: str) -> list:
        """The command that programs NAME.elf / NAME.hex and resets the board to run it."""
        image = f"{name}.{self.flash_image}"
        if self.probe_tool == "pyocd":
            return ["pyocd", "flash", "-t", self.probe_target, image]
        if self.probe_tool == "nrfjprog":
            return ["nrfjprog", "-f", self.probe_target, "--program", image, "--sectorerase",
                    "--verify", "--reset"]
        return []

    def flash_hint(self) -> str:
        """How to install the flash tool."""
        if self.probe_tool == "pyocd":
            pack = (f", then `pyocd pack install {self.probe_target}` (its CMSIS pack)"
                    if self.probe_pack else "")
            return f"pip install 'mcuforge[boards]' (pyOCD){pack}"
        if self.probe_tool == "nrfjprog":
            return ("install Nordic's nRF Command Line Tools (nrfjprog) and SEGGER's J-Link "
                    "software from nordicsemi.com")
        return ""

    def target(self, flash_budget: int | None = None) -> Target:
        """What the compiler generates code for on this board."""
        return Target(self.name, self.cpu, frozenset(self.features), 4, self.flash_size,
                      self.ram_size, flash_budget)

    def tick_ratio(self) -> tuple | None:
        """(num, shift) with instructions per tick = num / 2^shift (1e9 / clock_hz), or None
        where the clock is no power-of-two fraction of 1 GHz: the firmware then converts by a
        multiply and a shift, not a 64-bit division (a 700-byte libgcc routine)."""
        g = math.gcd(1_000_000_000, self.clock_hz)
        num, den = 1_000_000_000 // g, self.clock_hz // g
        return (num, den.bit_length() - 1) if den & (den - 1) == 0 else None

    def instructions(self, ticks: int) -> int:
        """Counter ticks -> executed instructions under QEMU -icount shift=0 (1 ns each)."""
        return round(ticks * 1_000_000_000 / self.clock_hz)


def board_names() -> list:
    return sorted(p.parent.name for p in data_dir("boards").glob("*/board.toml"))


def board_dir(name: str) -> Path:
    return data_dir("boards") / name


def load_board(name: str) -> Board:
    path = board_dir(name) / "board.toml"
    if not path.is_file():
        raise McuforgeError(f"unknown board '{name}'; known boards: {', '.join(board_names())}")
    d = tomllib.loads(path.read_text())
    fam = FAMILIES[d.get("family", "host")]
    flash, ram, qemu = d.get("flash", {}), d.get("ram", {}), d.get("qemu", {})
    return Board(
        name=d["name"], description=d.get("description", ""), family=d.get("family", "host"),
        cpu=d.get("cpu", "host"), cflags=tuple(d.get("cflags", ())), fpu=d.get("fpu", False),
        features=tuple(d.get("features", ())),
        flash_origin=flash.get("origin", 0), flash_size=flash.get("size"),
        ram_origin=ram.get("origin", 0), ram_size=ram.get("size"),
        clock_hz=d.get("clock_hz"), output=d.get("output", "stdio"),
        qemu_machine=qemu.get("machine"), qemu_args=tuple(qemu.get("args", ())),
        hardware_tested=d.get("hardware_tested", False), min_stack=d.get("min_stack", 4096),
        extra_sources=tuple(sorted(p.name for p in board_dir(name).glob("*.c"))),
        files=dict(fam["files"]), cross=fam.get("cross", ""),
        ldflags=tuple(fam.get("ldflags", ())), ldlibs=tuple(fam.get("ldlibs", ())),
        qemu_binary=fam.get("qemu", ""), probe_tool=d.get("probe", {}).get("tool", ""),
        probe_target=d.get("probe", {}).get("target", ""),
        probe_pack=d.get("probe", {}).get("pack", False))
