"""Build and run the depthwise micro-kernel (runtime_c/mcuforge_dw.h) on the host or on QEMU
mps2-an386 / mps2-an385, for the correctness test (tests/test_nn_dw.py) and as an instruction
bench. Counts come from SysTick under `-icount shift=0` (40 instructions per tick, see
/work/shared/notes/measuring-on-qemu.md).

    python tests/nn_bench/dw_bench.py        # KWS/VWW shapes, -O2, -Os, -O2 -fno-schedule-insns
    python tests/nn_bench/dw_bench.py -O3        # other flags
"""
from __future__ import annotations

import re
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
sys.path.insert(0, str(ROOT))
from mcuforge.codegen_c import pack_dw  # noqa: E402

ARM = ["arm-none-eabi-gcc", "-mthumb", "-mfloat-abi=soft", "--specs=nano.specs", "-nostartfiles",
       "-Wa,--fatal-warnings", "-T", str(HERE / "dw_link.ld")]
CPU = {"m4": ["-mcpu=cortex-m4"], "m4-portable": ["-mcpu=cortex-m4", "-DMF_USE_DSP=0"],
       "m3": ["-mcpu=cortex-m3"], "m7": ["-mcpu=cortex-m7"]}
MACHINE = {"m4": "mps2-an386", "m4-portable": "mps2-an386", "m3": "mps2-an385",
           "m7": "mps2-an500"}
WARN = ["-std=c99", "-Wall", "-Wextra", "-Werror", "-pedantic"]
TICK = 40  # instructions per SysTick tick on mps2 with -icount shift=0


def _arr(name, ctype, values, per_line=16):
    vals = [str(int(v)) for v in np.asarray(values).reshape(-1)]
    body = ",\n".join(", ".join(vals[i:i + per_line]) for i in range(0, len(vals), per_line))
    return f"static const {ctype} {name}[{max(len(vals), 1)}] = {{\n{body or '0'}\n}};\n"


def cases_header(cases) -> str:
    """cases: dicts with geom (pack_dw.geometry), x [h,w,c] int8, pk [c,REC] int32, x_zp, lo, hi,
    signfix, want [oh,ow,c] int8 or None."""
    out = ["#include <stdint.h>\n",
           "typedef void (*dw_fn)(const int8_t *, int8_t *, const int32_t *, const mf_dw_geom *,"
           " int32_t, int32_t, int32_t, int32_t, int16_t *);\n"
           "typedef struct { mf_dw_geom g; const int8_t *x; const int32_t *pk; int32_t x_zp, lo,"
           " hi, signfix; const int8_t *want; dw_fn fn; } dw_case;\n"]
    ymax = smax = 0
    for i, c in enumerate(cases):
        out.append(_arr(f"x{i}", "int8_t", c["x"]))
        out.append(_arr(f"k{i}", "int32_t", c["pk"], 8))
        if c.get("want") is not None:
            out.append(_arr(f"y{i}", "int8_t", c["want"]))
        g = c["geom"]
        ymax = max(ymax, g["oh"] * g["ow"] * g["c"])
        smax = max(smax, pack_dw.scratch_bytes(g) // 2)
    out.append(f"#define DW_NCASES {len(cases)}\n#define DW_YMAX {ymax}\n#define DW_SMAX {smax}\n")
    out.append("static const dw_case dw_cases[DW_NCASES] = {\n")
    for i, c in enumerate(cases):
        g = ", ".join(str(int(c["geom"][f])) for f in pack_dw.GEOM_FIELDS)
        want = f"y{i}" if c.get("want") is not None else "0"
        # the entry the schedule would name (pack_dw.entry), or the generic one (c["generic"])
        fn = "mf_dw3x3_s8" if c.get("generic") else pack_dw.entry(
            c["geom"], c["signfix"], c["lo"], c["hi"])
        out.append(f"  {{{{{g}}}, x{i}, k{i}, {c['x_zp']}, {c['lo']}, {c['hi']}, "
                   f"{c['signfix']}, {want}, {fn}}},\n")
    out.append("};\n")
    return "".join(out)


def compile_harness(prefix: str, header: str, kind: str, flags, workdir) -> Path:
    """Compile <prefix>_main.c with its cases header (<prefix>_cases.h) for kind 'host', 'm4'
    (DSP), 'm4-portable' or 'm3' (the Arm ones on dw_crt.c's start-up code)."""
    workdir = Path(workdir)
    (workdir / f"{prefix}_cases.h").write_text(header)
    inc = ["-I", str(workdir), "-I", str(HERE), "-I", str(ROOT / "runtime_c")]
    exe = workdir / f"{prefix}_{kind}.elf"
    main = str(HERE / f"{prefix}_main.c")
    if kind == "host":
        cmd = ["gcc", *WARN, *flags, *inc, main, "-o", str(exe)]
    else:
        cmd = [*ARM, *CPU[kind], *WARN, *flags, *inc, main, str(HERE / "dw_crt.c"), "-o",
               str(exe)]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode:
        raise RuntimeError(f"{' '.join(cmd)}\n{p.stderr}")
    return exe


def build(cases, kind: str, flags, workdir) -> Path:
    return compile_harness("dw", cases_header(cases), kind, flags, workdir)


def run(exe: Path, kind: str, timeout=120):
    """[(ticks, bad)] per case, and whether the firmware reported PASS."""
    if kind == "host":
        cmd = [str(exe)]
    else:
        cmd = ["qemu-system-arm", "-M", MACHINE[kind], "-nographic", "-serial", "null",
               "-monitor", "none", "-semihosting-config", "enable=on,target=native",
               "-icount", "shift=0,align=off,sleep=off", "-kernel", str(exe)]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    out = p.stdout + p.stderr  # semihosting output may land on either
    rows = [(int(t), int(b)) for t, b in re.findall(r"case \d+ ticks (\d+) bad (\d+)", out)]
    return rows, "PASS" in out and p.returncode == 0, out


def text_size(exe: Path, symbol_prefix="mf_dw") -> int:
    """Bytes of code of the kernel's functions in an Arm build."""
    nm = subprocess.run(["arm-none-eabi-nm", "-S", str(exe)], capture_output=True, text=True,
                        check=True).stdout
    return sum(int(sz, 16) for _, sz, t, name in
               (line.split() for line in nm.splitlines() if len(line.split()) == 4)
               if t in "tT" and name.startswith(symbol_prefix))


# ---- the bench -------------------------------------------------------------------------------
SHAPES = [  # name, h, w, c, stride (SAME padding as TFLite computes it)
    ("KWS 25x5x64 s1", 25, 5, 64, 1),
    ("VWW 48x48x8 s1", 48, 48, 8, 1),
    ("VWW 48x48x16 s2", 48, 48, 16, 2),
    ("VWW 6x6x256 s1", 6, 6, 256, 1),
    ("24x24x32 s1 (extra)", 24, 24, 32, 1),   # the other VWW (MobileNet v1 0.25) layers
    ("24x24x32 s2 (extra)", 24, 24, 32, 2),
    ("12x12x64 s1 (extra)", 12, 12, 64, 1),
    ("12x12x64 s2 (extra)", 12, 12, 64, 2),
    ("6x6x128 s1 (extra)", 6, 6, 128, 1),
    ("6x6x128 s2 (extra)", 6, 6, 128, 2),
    ("3x3x256 s1 (extra)", 3, 3, 256, 1),
]


def same_padding(h, w, s):
    oh, ow = -(-h // s), -(-w // s)
    return oh, ow, max((oh - 1) * s + 3 - h, 0) // 2, max((ow - 1) * s + 3 - w, 0) // 2


def bench_case(h, w, c, s, rng, budget=pack_dw.DEFAULT_BUDGET):
    oh, ow, pt, pl = same_padding(h, w, s)
    geom = pack_dw.geometry(h, w, c, oh, ow, s, pt, pl, budget=budget)
    wts = rng.integers(-127, 128, (3, 3, c))
    bias = rng.integers(-5000, 5000, c)
    mults = rng.integers(2**30, 2**31 - 1, c)
    shifts = rng.integers(-10, -6, c)
    pk = pack_dw.pack_dw(wts, bias, -3, mults, shifts, -128, geom["transpose"])
    x = rng.integers(-128, 128, (h, w, c))
    case = dict(geom=geom, x=x, pk=pk, x_zp=-3, lo=-128, hi=127, signfix=0, want=None)
    return case, oh * ow * c * 9


def main(argv):
    """dw_bench.py [--kind m4|m4-portable|m3] [--budget BYTES] [gcc flags...]"""
    args = list(argv[1:])
    kind, budget = "m4", pack_dw.DEFAULT_BUDGET
    while args and args[0] in ("--kind", "--budget"):
        opt, val = args.pop(0), args.pop(0)
        kind, budget = (val, budget) if opt == "--kind" else (kind, int(val))
    flag_sets = [args] if args else [["-O2"], ["-Os"], ["-O2", "-fno-schedule-insns"]]
    rng = np.random.default_rng(0)
    cases, macs = zip(*(bench_case(h, w, c, s, rng, budget) for _, h, w, c, s in SHAPES))
    with tempfile.TemporaryDirectory() as tmp:
        for flags in flag_sets:
            exe = build(cases, kind, flags, tmp)
            rows, ok, log = run(exe, kind)
            assert len(rows) == len(cases), log
            print(f"{kind} {' '.join(flags)}: kernel code {text_size(exe)} bytes")
            for (name, *_), (ticks, _), m, cs in zip(SHAPES, rows, macs, cases):
                sb = pack_dw.scratch_bytes(cs["geom"])
                print(f"  {name:19s} MACs {m:7d}  instr ~{ticks * TICK:8d}  "
                      f"{ticks * TICK / m:5.2f} instr/MAC  scratch {sb} B")


if __name__ == "__main__":
    main(sys.argv)
