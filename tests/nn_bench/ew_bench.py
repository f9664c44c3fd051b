"""Build and run the element-wise micro-kernels (runtime_c/mcuforge_ew.h) on the host or on
QEMU mps2-an386 / mps2-an385, for the correctness test (tests/test_nn_ew.py) and as an
instruction bench (SysTick under -icount shift=0: 40 instructions per tick).

    python tests/nn_bench/ew_bench.py            # ResNet-8 / KWS / VWW shapes at -O2, -Os, -O3
    python tests/nn_bench/ew_bench.py -O2        # other flags
"""
from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(HERE))
import dw_bench  # noqa: E402  (the toolchain, QEMU and start-up files the depthwise bench uses)
from mcuforge.codegen_c import pack_ew, qparams  # noqa: E402
from mcuforge.codegen_c.micro_ew import POOL_GEOM  # noqa: E402

TICK = dw_bench.TICK


def cases_header(cases) -> str:
    """cases: dicts with kind 'add' / 'add_inplace' (a = big input, b = small input, tab,
    q = mult add post signfix lo hi) or 'pool' / 'maxpool' (a = x [h, w, c], geom dict,
    q[4:6] = lo hi), want or None."""
    arr = dw_bench._arr
    out = ["#include <stdint.h>\n",
           "typedef void (*ew_fn)(const int8_t *, const int8_t *, int8_t *);\n",
           "typedef struct { int32_t kind; const int8_t *a, *b; int32_t n; const int32_t *tab;"
           " int32_t q[9]; mf_pool_geom g; const int8_t *want; ew_fn fn; } ew_case;\n"]
    ymax = 1
    for i, c in enumerate(cases):
        out.append(arr(f"a{i}", "int8_t", c["a"]))
        if c["kind"] in ("add", "add_inplace", "mul"):
            out.append(arr(f"b{i}", "int8_t", c["b"]))
            if c["kind"] != "mul":
                out.append(arr(f"t{i}", "int32_t", c["tab"], 8))
        if c.get("want") is not None:
            out.append(arr(f"y{i}", "int8_t", c["want"]))
        if c.get("literal"):  # the call as the generated C makes it: every argument a literal
            q = c["q"]
            out.append(f"static void f{i}(const int8_t *a, const int8_t *b, int8_t *y) {{\n"
                       f"    mf_ew_add_s8(a, b, y, {c['n']}, t{i}, {q[0]}, {q[1]}, {q[2]}, "
                       f"{q[3]}, {q[4]}, {q[5]});\n}}\n")
        ymax = max(ymax, c["n"])
    out.append(f"#define EW_NCASES {len(cases)}\n#define EW_YMAX {ymax}\n")
    out.append("static const ew_case ew_cases[EW_NCASES] = {\n")
    for i, c in enumerate(cases):
        add = c["kind"] in ("add", "add_inplace", "mul")
        g = ", ".join(str(int(c["geom"][f])) for f in POOL_GEOM) if not add else "0"
        q = ", ".join(str(int(v)) for v in c["q"])
        kind = {"add": 0, "pool": 1, "add_inplace": 2, "maxpool": 3, "mul": 4}[c["kind"]]
        out.append(f"  {{{kind}, a{i}, {f'b{i}' if add else '0'}, {c['n']}, "
                   f"{f't{i}' if add and c['kind'] != 'mul' else '0'}, {{{q}}}, {{{g}}}, "
                   f"{f'y{i}' if c.get('want') is not None else '0'}, "
                   f"{f'f{i}' if c.get('literal') else '0'}}},\n")
    out.append("};\n")
    return "".join(out)


def build(cases, kind: str, flags, workdir) -> Path:
    return dw_bench.compile_harness("ew", cases_header(cases), kind, flags, workdir)


run = dw_bench.run


def add_case(a, b, p, want=None, inplace=False, literal=False) -> dict:
    """ADD of int8 arrays a (input 1), b (input 2) with qparams.add_params p; inplace: the
    output overwrites the big input; literal: called with literal arguments, as generated code
    calls it (the constant-shift path)."""
    c = pack_ew.add_constants(p)
    assert c is not None
    big, small = (a, b) if c["big"] == 0 else (b, a)
    q = [c[k] for k in ("mult", "add", "post", "signfix", "lo", "hi")] + [0, 0, 0]
    return dict(kind="add_inplace" if inplace else "add", a=big, b=small, tab=c["tab"], q=q,
                n=int(np.size(a)), want=want, literal=literal)


def mul_case(a, b, p, want=None) -> dict:
    """MUL of int8 arrays a, b with qparams.mul_params p."""
    c = pack_ew.mul_constants(p)
    assert c is not None
    q = [c[k] for k in ("mult", "add", "post", "signfix", "lo", "hi", "off1", "off2", "pre")]
    return dict(kind="mul", a=a, b=b, q=q, n=int(np.size(a)), want=want)


def pool_case(x, geom, lo, hi, want=None, kind="pool") -> dict:
    """kind "pool" (average) or "maxpool"."""
    return dict(kind=kind, a=x, geom=geom, q=[0, 0, 0, 0, lo, hi, 0, 0, 0],
                n=int(geom["oh"] * geom["ow"] * geom["c"]), want=want)


def global_geom(h, w, c):
    return dict(h=h, w=w, c=c, fh=h, fw=w, sh=h, sw=w, pt=0, pl=0, oh=1, ow=1)


SHAPES = [  # name, what
    ("ResNet-8 ADD 32x32x16", ("add", (16384, (0.0394, -128, 0.1042, 4, 0.0509, -128, "relu")))),
    ("ResNet-8 ADD 8x8x64", ("add", (4096, (0.0839, 38, 0.2172, -2, 0.1271, -128, "relu")))),
    ("ADD none (sign term)", ("add", (4096, (0.05, 3, 0.07, -9, 0.1, 5, "none")))),
    ("ADD relu6 (clamp)", ("add", (4096, (0.05, 3, 0.07, -9, 0.1, 5, "relu6")))),
    ("MUL none", ("mul", (4096, (0.05, 3, 0.07, -9, 0.01, 5, "none")))),
    ("KWS avg pool 25x5x64", ("pool", (25, 5, 64))),
    ("ResNet-8 avg pool 8x8x64", ("pool", (8, 8, 64))),
    ("VWW avg pool 3x3x256", ("pool", (3, 3, 256))),
    ("max pool global 8x8x64", ("maxpool", (8, 8, 64))),
]


def bench_cases(rng):
    out = []
    for _, (kind, arg) in SHAPES:
        if kind in ("add", "mul"):
            n, qa = arg
            a, b = rng.integers(-128, 128, n), rng.integers(-128, 128, n)
            out.append(add_case(a, b, qparams.add_params(*qa), literal=True) if kind == "add"
                       else mul_case(a, b, qparams.mul_params(*qa)))
        else:
            h, w, c = arg
            out.append(pool_case(rng.integers(-128, 128, (h, w, c)), global_geom(h, w, c),
                                 -128, 127, kind=kind))
    return out


def main(argv):
    """ew_bench.py [--kind m4|m4-portable|m3] [gcc flags...]"""
    args = list(argv[1:])
    kind = "m4"
    if args[:1] == ["--kind"]:
        kind, args = args[1], args[2:]
    flag_sets = [args] if args else [["-O2"], ["-Os"], ["-O3"]]
    cases = bench_cases(np.random.default_rng(0))
    with tempfile.TemporaryDirectory() as tmp:
        for flags in flag_sets:
            exe = build(cases, kind, flags, tmp)
            rows, ok, log = run(exe, kind)
            assert len(rows) == len(cases), log
            print(f"{kind} {' '.join(flags)}: kernel code "
                  f"{dw_bench.text_size(exe, 'mf_ew')} bytes")
            for (name, (k, arg)), (ticks, _), c in zip(SHAPES, rows, cases):
                ew = k in ("add", "mul")
                elems = c["n"] if ew else int(np.prod(arg))
                print(f"  {name:26s} {'elements' if ew else 'taps':8s} {elems:6d}  "
                      f"instr ~{ticks * TICK:7d}  {ticks * TICK / elems:5.2f} per "
                      f"{'element' if ew else 'tap'}")


if __name__ == "__main__":
    main(sys.argv)
