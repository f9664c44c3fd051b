"""Instructions of the row-paired convolution (mf_convrp*_w16_n<NW>, mcuforge_nn.h) on QEMU
mps2-an386 for the MLPerf Tiny first layers, and of its widening alone (VWW's 48 output rows):

    PYTHONPATH=$PWD python -m tests.nn_bench.convrp_bench [-O2 -Os ...]

Fused ReLU (output zero point -128: no sign term), one call after a warm-up; figures include the
widening, requantization and call. arm-none-eabi-gcc 12.2, VWW 3x3 s2 3->8 96x96 / KWS 10x4 s2
1->64 49x10 / ResNet-8 3x3 s1 3->16 32x32 (VWW's widening alone): -O2 498K / 271K / 436K (54K),
-Os 498K / 285K / 444K, -O3 496K / 264K / 425K; in the models (-O2, gcc sees the constant
geometry) 497.5K / 269.5K / 436.2K.
"""
from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import numpy as np

from mcuforge.codegen_c import pack
from tests.nn_bench import harness

# name, mf_conv_geom, O
SHAPES = [("VWW 3x3 s2 3->8", (96, 96, 3, 3, 3, 2, 2, 0, 0, 48, 48), 8),
          ("KWS 10x4 s2 1->64", (49, 10, 1, 10, 4, 2, 2, 4, 1, 25, 5), 64),
          ("RN8 3x3 s1 3->16", (32, 32, 3, 3, 3, 1, 1, 1, 1, 32, 32), 16)]


def program(rng) -> str:
    src = ['#include "mcuforge_nn.h"\n#include "bench.h"\n']
    body, scratch = [], 0
    for i, (name, g, o) in enumerate(SHAPES):
        h, w_, c, kh, kw, sh, sw, pt, pl, oh, ow = g
        w = rng.integers(-127, 128, (o, kh * kw * c))
        bias = pack.fold_bias(rng.integers(-2000, 2000, o), w, -128)
        rq = pack.requant_params([1518500250] * o, [-9] * o, -128, pack.acc_bounds(bias, w))
        table = pack.pack_convrp(*pack.fold_pre(w, bias, rq), kh, kw, c, sw)
        scratch = max(scratch, pack.convrp_scratch_bytes(kh, kw, c, sw, ow, w_))
        vals = ",".join(str(int(v)) for v in table)
        src.append(f"static const int32_t p{i}[] __attribute__((aligned(4))) = {{{vals}}};\n"
                   f"static int8_t x{i}[{h * w_ * c}], y{i}[{oh * ow * o}];\n"
                   f"static const mf_conv_geom g{i} = {{{','.join(map(str, g))}}};\n")
        fn = (f"mf_convrp{'2' if sw * c % 2 else ''}_w16_n{pack.convrp_words(kh, kw, c)}"
              f"{'' if o % 8 else '_x8'}")
        call = f"{fn}(x{i}, &g{i}, -128, p{i}, {o}, {pack.PRE0}, y{i}, scratch)"
        body.append(f"    for (i = 0; i < (int32_t)sizeof x{i}; ++i) x{i}[i] = (int8_t)(i * 7);\n"
                    f"    {call};\n    t0 = bench_counter_read();\n    {call};\n"
                    f"    t1 = bench_counter_read();\n    bench_puts(\"{name}: \");\n"
                    "    bench_put_i64((int64_t)(t1 - t0) * 40); bench_puts(\"\\n\");\n")
    src.append(f"static int16_t scratch[{(scratch + 1) // 2 + 8}] __attribute__((aligned(4)));\n"
               "int main(void) {\n    uint64_t t0, t1;\n    int32_t i;\n"
               "    bench_counter_start();\n")
    src.extend(body)
    src.append("    t0 = bench_counter_read();\n"
               "    for (i = 0; i < 48; ++i) mf_crp_widen(x0, &g0, i, -128, x0, 144, scratch, 0);\n"
               "    t1 = bench_counter_read();\n    bench_puts(\"VWW widening: \");\n"
               "    bench_put_i64((int64_t)(t1 - t0) * 40); bench_puts(\"\\n\");\n"
               "    return 0;\n}\n")
    return "".join(src)


def main(argv):
    opts = [a for a in argv if a.startswith("-O")] or ["-O2"]
    with tempfile.TemporaryDirectory() as d:
        src = Path(d) / "convrp_bench.c"
        src.write_text(program(np.random.default_rng(1)))
        for opt in opts:
            exe = harness.build(src, "m4", opt, Path(d))
            print(opt, harness.run(exe, "m4").strip().replace("\n", " | "))


if __name__ == "__main__":
    main(sys.argv[1:])
