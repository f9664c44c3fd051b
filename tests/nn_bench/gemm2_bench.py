"""MACs per instruction of the 1x1 / fully connected kernels on the 1x1 layers of VWW and KWS
(QEMU mps2-an386, Cortex-M4): what the schedule took before (mf_gemm_w16_g<G> for Kp <= 64,
else mf_gemm_w16; 4 channels x 1 row) against what it takes now (mf_gemm2_w16: 2 channels x
2 rows; mf_gemm1k8_w16 for K = 8).

    PYTHONPATH=$PWD python -m tests.nn_bench.gemm2_bench [-O2 -Os ...]

Each shape runs once to warm up, then once between two SysTick reads (40 instructions a
tick); figures include widening, requantization and the call. Activation "relu" (clamp =
int8 range, no sign term: every layer of these models) and "none" (signfix 2).
"""
from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import numpy as np

from mcuforge.codegen_c import pack
from tests.nn_bench import harness
from tests.nn_bench.bench import _layer

# name, rows, K, O
SHAPES = [
    ("VWW l02 8->16 x2304", 2304, 8, 16),
    ("VWW l04 16->32 x576", 576, 16, 32),
    ("VWW l06 32->32 x576", 576, 32, 32),
    ("VWW l08 32->64 x144", 144, 32, 64),
    ("VWW l10 64->64 x144", 144, 64, 64),
    ("VWW l12 64->128 x36", 36, 64, 128),
    ("VWW l14 128->128 x36", 36, 128, 128),
    ("VWW l24 128->256 x9", 9, 128, 256),
    ("VWW l26 256->256 x9", 9, 256, 256),
    ("KWS 64->64 x125", 125, 64, 64),
]
FORMS = ("before", "now")


def program(form: str, sf: int, rng) -> str:
    src = ['#include "mcuforge_nn.h"\n#include "bench.h"\n',
           f"static volatile int32_t v_sf = {sf | pack.PRE0};\n"]
    body, scratch = [], 0
    for i, (name, rows, k, o) in enumerate(SHAPES):
        w, bias, rq = pack.fold_pre(*_layer(rng, o, k))
        src.append(f"static int8_t x{i}[{rows * k}];\nstatic int8_t y{i}[{rows * o}];\n")
        if form == "before":
            g = pack.kpad(k) // 4
            entry = f"mf_gemm_w16_g{g}" if g <= pack.MAX_UNROLLED_GROUPS else "mf_gemm_w16"
            packed, _ = pack.pack_gemm_weights(w, "w16")
            need = pack.gemm_scratch_bytes(k)
            src.append(f"static const int16_t w{i}[] __attribute__((aligned(4))) = {{"
                       + ",".join(map(str, packed.tolist())) + "};\n")
            src.append(f"static const int32_t b{i}[] = {{" + ",".join(map(str, bias.tolist()))
                       + "};\n")
            src.append(f"static const mf_rq rq{i}[] = {{" + ",".join(
                "{%d,%d,%d,%d}" % tuple(r) for r in rq.tolist()) + "};\n")
            call = (f"{entry}(x{i}, {rows}, {k}, {k}, w{i}, b{i}, rq{i}, {o}, -128, 127, v_sf, "
                    f"y{i}, {o}, scratch)")
        else:
            k8 = k == 8
            stream = pack.pack_gemm1k8(w, bias, rq) if k8 else pack.pack_gemm2(w, bias, rq)
            need = 4 if k8 else pack.gemm2_scratch_bytes(k)
            entry = "mf_gemm1k8_w16" if k8 else "mf_gemm2_w16"
            src.append(f"static const int32_t w{i}[] __attribute__((aligned(4))) = {{"
                       + ",".join(map(str, stream.tolist())) + "};\n")
            call = f"{entry}(x{i}, {rows}, {k}, {k}, w{i}, {o}, v_sf, y{i}, {o}, scratch)"
        scratch = max(scratch, (need + 1) // 2)
        body.append(f"""    for (j = 0; j < {rows * k}; ++j) x{i}[j] = (int8_t)(j * 37 + 11);
    {call};
    t0 = bench_counter_read();
    {call};
    t1 = bench_counter_read();
    bench_puts("{name}|{rows * k * o}|"); bench_put_i64((int64_t)(t1 - t0)); bench_puts("\\n");
""")
    src.append(f"static int16_t scratch[{scratch}] __attribute__((aligned(8)));\n")
    src.append("int main(void) {\n    int32_t j;\n    uint64_t t0, t1;\n"
               "    bench_counter_start();\n" + "".join(body) + "    return 0;\n}\n")
    return "".join(src)


def measure(opts):
    """{(form, act, opt): [MACs per instruction per shape]}"""
    res = {}
    with tempfile.TemporaryDirectory() as d:
        for form in FORMS:
            for act, sf in (("relu", 0), ("none", 2)):
                src = Path(d) / f"g2_{form}_{act}.c"
                src.write_text(program(form, sf, np.random.default_rng(0)))
                for opt in opts:
                    out = harness.run(harness.build(src, "m4", opt, Path(d)), "m4")
                    res[(form, act, opt)] = [
                        int(m) / (int(t) * harness.TICK)
                        for _, m, t in (ln.split("|") for ln in out.strip().splitlines())]
    return res


def main(argv):
    opts = argv or ["-O2", "-Os"]
    res = measure(opts)
    print("MACs per instruction, mps2-an386 (Cortex-M4)")
    print(f"{'shape':24s}" + "".join(f"{f + ' ' + a + ' ' + o:>20s}" for f, a, o in res))
    for i, (name, *_) in enumerate(SHAPES):
        print(f"{name:24s}" + "".join(f"{v[i]:20.3f}" for v in res.values()))


if __name__ == "__main__":
    main(sys.argv[1:])
