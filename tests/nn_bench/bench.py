"""Instructions per MAC of the GEMM micro-kernels on QEMU mps2-an386 (Cortex-M4).

    PYTHONPATH=$PWD python -m tests.nn_bench.bench [--act=relu|none|relu6] [--target=m4|m3|m4-nodsp]
                                                   [-O2 -Os ...]

Each shape runs once to warm up, then `reps` times between two SysTick reads (40 instructions
per tick under -icount shift=0); the figure includes widening / im2col, requantization, the
clamp and the call. Shapes: KWS's 1x1 64->64 over 125 pixels, its FC 64->12, its first conv
10x4 1->64 stride 2 on 49x10 (output 25x5), ResNet-8's 3x3 16->16 on 32x32.
"""
from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import numpy as np

from mcuforge.codegen_c import pack
from tests.nn_bench import harness

# name, kind, geometry, O, reps
SHAPES = [
    ("1x1 64->64 x125 px", "gemm", dict(rows=125, k=64), 64, 1),
    ("FC 64->12", "gemm", dict(rows=1, k=64), 12, 50),
    ("conv 10x4 1->64 s2 49x10", "conv", (49, 10, 1, 10, 4, 2, 2, 4, 1, 25, 5), 64, 1),
    ("conv 3x3 16->16 s1 32x32", "conv", (32, 32, 16, 3, 3, 1, 1, 1, 1, 32, 32), 16, 1),
    ("1x1 8->16 x2304 px (VWW)", "gemm", dict(rows=2304, k=8), 16, 1),
    ("conv 3x3 3->16 s1 32x32 (RN8 1st)", "conv", (32, 32, 3, 3, 3, 1, 1, 1, 1, 32, 32), 16, 1),
    ("conv 3x3 3->8 s2 96x96 (VWW 1st)", "conv", (96, 96, 3, 3, 3, 2, 2, 0, 0, 48, 48), 8, 1),
    ("conv 3x3 16->32 s2 32x32 (RN8)", "conv", (32, 32, 16, 3, 3, 2, 2, 0, 0, 16, 16), 32, 1),
    ("conv 3x3 64->64 s1 8x8 (RN8)", "conv", (8, 8, 64, 3, 3, 1, 1, 1, 1, 8, 8), 64, 1),
]


def _layer(rng, o, k):
    w = rng.integers(-127, 128, (o, k))
    bias = pack.fold_bias(rng.integers(-2000, 2000, o), w, -3)
    mult, shift = 1518500250, -9  # a typical scale, ~0.0014
    rq = pack.requant_params([mult] * o, [shift] * o, -5, pack.acc_bounds(bias, w))
    return w, bias, rq


def program(fmt: str, rng, act: str = "relu") -> str:
    """act: "relu" (clamp = int8 range, no sign term: TFLite's fused ReLU with zero point -128),
    "none" (int8 range, sign term from the accumulator: signfix 2), "relu6" (a narrower clamp [-128, 100], sign term)."""
    # "none": signfix 2, what pack.signfix_mode gives for these channels (all shift right)
    lo, hi, sf = {"relu": (-128, 127, 0), "none": (-128, 127, 2), "relu6": (-128, 100, 1)}[act]
    # volatile: the clamp reaches the kernel as in a model whose layers differ (no IPA constants)
    src = ['#include "mcuforge_nn.h"\n#include "bench.h"\n',
           f"static volatile int32_t v_lo = {lo}, v_hi = {hi}, "
           f"v_sf = {sf | pack.PRE0 if fmt in ('w16g', 'w16pg') else sf};\n"]
    body = []
    scratch = 0
    for i, (name, kind, geo, o, reps) in enumerate(SHAPES):
        k = geo["k"] if kind == "gemm" else geo[3] * geo[4] * geo[2]
        pair = kind == "conv" and fmt == "w16pg"  # mf_convp_w16_g<G> (no im2col)
        need = (pack.gemm_scratch_bytes(k) if kind == "gemm" else
                pack.convp_scratch_bytes(geo[3], geo[4], geo[2], geo[6], geo[10]) if pair else
                pack.conv_scratch_bytes(geo[3], geo[4], geo[2], geo[6], geo[10]))
        scratch = max(scratch, (need + 1) // 2)
        w, bias, rq = _layer(rng, o, k)
        if fmt in ("w16g", "w16pg"):  # the K-specialised entries want 2^pre folded (MF_PRE0)
            w, bias, rq = pack.fold_pre(w, bias, rq)
        kp = pack.kpad(k)
        if pair:
            w = pack.pair_rows(w, geo[3], geo[4], geo[2])
            kp = w.shape[1]
        packed, _ = pack.pack_gemm_weights(w, "w8" if fmt == "w8" else "w16")
        wt = "int8_t" if fmt == "w8" else "int16_t"
        # "w16g" / "w16pg": the entries specialised on K (mf_*_w16_g<G>)
        name_fmt = f"w16_g{kp // 4}" if fmt in ("w16g", "w16pg") and kp <= 64 else (
            "w16" if fmt in ("w16g", "w16pg") else fmt)
        if kind == "gemm":
            nx, ny, macs = geo["rows"] * k, geo["rows"] * o, geo["rows"] * k * o
        else:
            nx, ny = geo[0] * geo[1] * geo[2], geo[9] * geo[10] * o
            macs = geo[9] * geo[10] * k * o
        src.append(f"static int8_t x{i}[{nx}];\nstatic int8_t y{i}[{ny}];\n")
        src.append(f"static const {wt} w{i}[] __attribute__((aligned(4))) = {{"
                   + ",".join(map(str, packed.tolist())) + "};\n")
        src.append(f"static const int32_t b{i}[] = {{" + ",".join(map(str, bias.tolist())) + "};\n")
        src.append(f"static const mf_rq rq{i}[] = {{" + ",".join(
            "{%d,%d,%d,%d}" % tuple(r) for r in rq.tolist()) + "};\n")
        tail = f"w{i}, b{i}, rq{i}, {o}, v_lo, v_hi, v_sf, y{i}"
        if kind == "gemm":
            call = f"mf_gemm_{name_fmt}(x{i}, {geo['rows']}, {k}, {k}, {tail}, {o}, scratch)"
        else:
            src.append(f"static const mf_conv_geom g{i} = {{{','.join(map(str, geo))}}};\n")
            call = f"mf_conv{'p' if pair else ''}_{name_fmt}(x{i}, &g{i}, -3, {tail}, scratch)"
        body.append(f"""    for (j = 0; j < {nx}; ++j) x{i}[j] = (int8_t)(j * 37 + 11);
    {call};
    t0 = bench_counter_read();
    for (r = 0; r < {reps}; ++r) {call};
    t1 = bench_counter_read();
    bench_puts("{name}|{macs * reps}|"); bench_put_i64((int64_t)(t1 - t0)); bench_puts("\\n");
""")
    src.append(f"static int16_t scratch[{scratch}] __attribute__((aligned(8)));\n")
    src.append("int main(void) {\n    int32_t j, r;\n    uint64_t t0, t1;\n"
               "    bench_counter_start();\n" + "".join(body) + "    return 0;\n}\n")
    return "".join(src)


def measure(opts, fmts=("w16", "w16g", "w16pg", "w8"), act="relu", target="m4"):
    """{(fmt, opt): [(shape, instr/MAC)]}"""
    results = {}
    with tempfile.TemporaryDirectory() as d:
        for fmt in fmts:
            src = Path(d) / f"bench_{fmt}.c"
            src.write_text(program(fmt, np.random.default_rng(0), act))
            for opt in opts:
                out = harness.run(harness.build(src, target, opt, Path(d)), target)
                rows = []
                for line in out.strip().splitlines():
                    name, macs, ticks = line.split("|")
                    rows.append((name, int(ticks) * harness.TICK / int(macs)))
                results[(fmt, opt)] = rows
    return results


def main(argv):
    act, target = "relu", "m4"
    while argv and argv[0].startswith("--"):
        key, _, value = argv[0][2:].partition("=")
        act, target = (value, target) if key == "act" else (act, value)
        argv = argv[1:]
    opts = argv or ["-O2", "-Os", "-O2 -fno-schedule-insns", "-Os -fno-schedule-insns"]
    res = measure(opts, act=act, target=target)
    names = [s[0] for s in SHAPES]
    print(f"instructions per MAC, {harness.TARGETS[target][1]} ({target}), activation {act}")
    width = max(len(n) for n in names) + 2
    print(f"{'fmt / flags':30s}" + "".join(f"{n:>{width}s}" for n in names))
    for (fmt, opt), rows in res.items():
        print(f"{fmt + ' ' + opt:30s}" + "".join(f"{v:{width}.3f}" for _, v in rows))


if __name__ == "__main__":
    main(sys.argv[1:])
