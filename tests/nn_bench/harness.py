"""Build and run a kernel test/bench program on the host or on QEMU's mps2 Cortex-M machines.

    exe = build(main_c, "m4", "-O2", workdir)      # targets: TARGETS
    out = run(exe, "m4")                           # the program's stdout (semihosting)

The Arm builds link startup.c + link.ld from this folder (no vendor files, newlib-nano for
memcpy/memset); under `-icount shift=0` the SysTick counter of startup.c counts 40 executed
instructions per tick (mps2: 25 MHz clock), so bench_counter_read() * 40 is an instruction count.
"""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

HERE = Path(__file__).resolve().parent
RUNTIME = HERE.parent.parent / "runtime_c"
WARN = ["-std=c99", "-Wall", "-Wextra", "-Werror", "-pedantic"]
# name: (compiler flags, QEMU machine); None machine = run on the host
TARGETS = {
    "host": ([], None),
    "m4": (["-mcpu=cortex-m4", "-mthumb", "-mfloat-abi=soft"], "mps2-an386"),
    "m4-nodsp": (["-mcpu=cortex-m4", "-mthumb", "-mfloat-abi=soft", "-DMF_USE_DSP=0"],
                 "mps2-an386"),
    "m3": (["-mcpu=cortex-m3", "-mthumb", "-mfloat-abi=soft"], "mps2-an385"),
    # Cortex-M55 with Helium (MVE); startup.c enables the FPU/MVE coprocessors
    "m55": (["-mcpu=cortex-m55", "-mthumb", "-mfloat-abi=hard"], "mps3-an547"),
}
LINK = {"m55": "link_an547.ld"}  # the linker script where not link.ld (mps2's memory map)
TICK = 40  # instructions per SysTick tick on mps2 under -icount shift=0


def have_arm() -> bool:
    return bool(shutil.which("arm-none-eabi-gcc") and shutil.which("qemu-system-arm"))


def build(main_c: Path, target: str, opt: str, workdir: Path, extra=()) -> Path:
    """Compile main_c (which includes mcuforge_nn.h and bench.h) for target at opt."""
    flags, machine = TARGETS[target]
    exe = Path(workdir) / f"{Path(main_c).stem}-{target}{opt.replace(' ', '')}.elf"
    inc = [f"-I{RUNTIME}", f"-I{HERE}"]
    if machine is None:
        cmd = ["gcc", *WARN, opt, *extra, *inc, str(main_c), str(HERE / "host.c"), "-o", str(exe)]
    else:
        cmd = ["arm-none-eabi-gcc", *WARN, *flags, opt.split()[0], *opt.split()[1:], *extra,
               *inc, "--specs=nano.specs", "-nostartfiles", "-ffunction-sections",
               f"-T{HERE / LINK.get(target, 'link.ld')}", "-Wl,--gc-sections", str(main_c),
               str(HERE / "startup.c"), "-o", str(exe)]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        raise RuntimeError(f"build failed: {' '.join(cmd)}\n{p.stderr}")
    return exe


def run(exe: Path, target: str, timeout: float = 120) -> str:
    """Run exe; its stdout. Raises on a non-zero exit status."""
    machine = TARGETS[target][1]
    if machine is None:
        cmd = [str(exe)]
    else:
        cmd = ["qemu-system-arm", "-M", machine, "-nographic", "-serial", "null",
               "-monitor", "none", "-chardev", "stdio,id=semi",
               "-semihosting-config", "enable=on,target=native,chardev=semi",
               "-icount", "shift=0,align=off,sleep=off", "-kernel", str(exe)]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if p.returncode != 0:
        raise RuntimeError(f"{exe.name} exited {p.returncode}:\n{p.stdout}\n{p.stderr}")
    return p.stdout
