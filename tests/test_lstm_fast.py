"""The integer LSTM's fast requantization (mf_seq_rq in runtime_c/mcuforge_seq.h, its Python
mirror in codegen_c/micro_seq.py, the bound proofs in codegen_c/lower/state.py `_requant`).

TFLM computes every gate's FC outputs, the cell products and the hidden state with
MultiplyByQuantizedMultiplier; the scheduled LSTM uses one rounding high multiply and a shift
where pack.requant_params proves it exact for the accumulator's bound. Checks:
1. mf_seq_rq's mirror == qmath.mf_mbqm (TFLM's arithmetic, checked against TFLM elsewhere) on
   every accumulator up to the largest bound the proof accepts, incl. rounding ties; the bound
   one above is rejected;
2. the C function on the same cases: host (portable, sanitizers), Cortex-M4 (DSP SMMULR) at
   -O0/-O2/-Os/-O3, the portable body on the M4 and on the Cortex-M3;
3. the scheduled kernel == the reference lowering in the loop-IR evaluator on inputs and states
   at the extremes of the proof's ranges (the mirror raises where C would overflow), and a
   layer whose bounds cannot be proven keeps mf_mbqm for those gates and still equals
   tflite-micro (host, M4, portable M3).
"""
from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

from mcuforge.codegen_c import loop_ir as ir
from mcuforge.codegen_c import pack, qparams
from mcuforge.codegen_c.evaluate import run_kernel
from mcuforge.codegen_c.kernels import lower_node
from mcuforge.codegen_c.lower import reference_kernel
from mcuforge.codegen_c.micro_seq import INTRINSICS
from mcuforge.codegen_c.qmath import mf_mbqm
from conftest import require_tflm, require_tools
from mcuforge.frontend.tflite import load_tflite
from mcuforge.ir.target import Target
from mcuforge import runner
from mcuforge.tools import tflm
from test_sched_seq import lstm_model

_spec = importlib.util.spec_from_file_location(
    "harness", Path(__file__).parent / "nn_bench" / "harness.py")
harness = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(harness)

M4 = Target("mps2-an386", "cortex-m4", frozenset({"dsp"}))
rq_mirror = INTRINSICS["mf_seq_rq"]


def largest_bound(mult, shift, zp):
    """The largest accumulator bound requant_params accepts (binary search; 0: none)."""
    lo, hi = 0, 2**31
    if pack.requant_params([mult], [shift], zp, [0]) is None:
        return None
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if pack.requant_params([mult], [shift], zp, [mid]) is not None \
            else (lo, mid)
    return lo


def rq_cases():
    """(mult, shift, zp) of the LSTM's requantizations: the gates' FC scales (shift < 0 and,
    for coarse input scales, > 0), the cell products (powers of two: many rounding ties) and
    the hidden state (with its zero point); random ones besides."""
    out = [(*qparams.quantize_multiplier(2.0**-15), 0), (*qparams.quantize_multiplier(2.0**-19), 0),
           (*qparams.quantize_multiplier(2.0**-30 / (1 / 128)), 5),
           (*qparams.quantize_multiplier(0.6 * 0.01 * 4096), 0),
           (*qparams.quantize_multiplier(0.3), 0), (*qparams.quantize_multiplier(0.5), -3)]
    rng = np.random.default_rng(7)
    for _ in range(10):
        out.append((*qparams.quantize_multiplier(float(2.0 ** rng.uniform(-24, 6))),
                    int(rng.integers(-20, 20))))
    return out


def accumulators(bound, rng, n=400):
    """Both ends of [-bound, bound], values near 0, multiples of powers of two (rounding
    ties of the power-of-two multipliers) and random values."""
    edge = [bound, bound - 1, -bound, -bound + 1, 0, 1, -1, 2, -2]
    ties = [s * (k << e) + d for e in (1, 13, 14, 16, 17, 22) for k in (1, 3, 5)
            for s in (1, -1) for d in (0, 1, -1)]
    rand = rng.integers(-bound, bound + 1, n).tolist()
    return [a for a in edge + ties + rand if -bound <= a <= bound]


def test_mirror_equals_mbqm_up_to_the_proven_bound():
    rng = np.random.default_rng(1)
    for mult, shift, zp in rq_cases():
        bound = largest_bound(mult, shift, zp)
        assert bound is not None and bound > 2**20, (mult, shift)
        assert pack.requant_params([mult], [shift], zp, [bound + 1]) is None
        rq = [int(v) for v in pack.requant_params([mult], [shift], zp, [bound])[0]]
        for a in accumulators(bound, rng):
            assert rq_mirror(a, *rq) == mf_mbqm(a, mult, shift) + zp, (a, mult, shift, zp)


def test_mirror_breaks_where_the_proof_says_it_would():
    """Past the proven bound the fast form is not TFLM's (the shift or the addend overflows):
    the mirror raises there, so an unsound proof cannot pass the evaluator silently."""
    from mcuforge.codegen_c.loop_ir import UndefinedBehaviour
    mult, shift = qparams.quantize_multiplier(0.6 * 0.01 * 4096)  # shift > 0: pre > 1
    bound = largest_bound(mult, shift, 0)
    rq = [int(v) for v in pack.requant_params([mult], [shift], 0, [bound])[0]]
    with pytest.raises(UndefinedBehaviour):
        for a in range(bound, bound + 2**rq[2] + 2):
            rq_mirror(a, *rq)


SAT_VALUES = [-2**31, -2**31 + 1, -65536, -32769, -32768, -32767, -1, 0, 1, 32766, 32767, 32768,
              65535, 2**31 - 1]


def _c_program(rows) -> str:
    """mf_seq_rq on every row (acc, mult, add, pre, post, expected) and mf_seq_sat16 on
    SAT_VALUES (expected: numpy's clip); prints the number of mismatches."""
    def c(v):  # (C has no int32 literal -2147483648)
        return "INT32_MIN" if v == -2**31 else str(int(v))
    data = ",\n".join("{" + ", ".join(map(c, r)) + "}" for r in rows)
    sat = ", ".join(f"{{{c(v)}, {c(np.clip(v, -32768, 32767))}}}" for v in SAT_VALUES)
    return f"""#include <stdint.h>
#include "mcuforge_seq.h"
#include "bench.h"
static const int32_t cases[][6] = {{
{data}
}};
static const int32_t sat[][2] = {{{sat}}};
int main(void) {{
    int32_t i, bad = 0;
    volatile int32_t n = (int32_t)(sizeof cases / sizeof cases[0]);
    volatile int32_t ns = (int32_t)(sizeof sat / sizeof sat[0]);
    for (i = 0; i < n; i++) {{
        const int32_t *c = cases[i];
        if (mf_seq_rq(c[0], c[1], c[2], c[3], c[4]) != c[5]) bad++;
    }}
    for (i = 0; i < ns; i++) {{
        if (mf_seq_sat16(sat[i][0]) != sat[i][1]) bad++;
    }}
    bench_puts("bad ");
    bench_put_i64(bad);
    bench_puts(" of ");
    bench_put_i64(n);
    bench_puts("\\n");
    bench_exit(0);
    return 0;
}}
"""


@pytest.fixture(scope="module")
def c_rows():
    rng = np.random.default_rng(2)
    rows = []
    for mult, shift, zp in rq_cases():
        bound = largest_bound(mult, shift, zp)
        rq = [int(v) for v in pack.requant_params([mult], [shift], zp, [bound])[0]]
        rows += [(a, *rq, mf_mbqm(a, mult, shift) + zp) for a in accumulators(bound, rng, 60)]
    return rows


C_TARGETS = [("host", "-O0"), ("host", "-O2"), ("m4", "-O0"), ("m4", "-O2"), ("m4", "-Os"),
             ("m4", "-O3"), ("m4-nodsp", "-O2"), ("m3", "-O2")]


@pytest.mark.parametrize("target,opt", C_TARGETS, ids=[f"{t}{o}" for t, o in C_TARGETS])
def test_c_rq_equals_mbqm(target, opt, c_rows, tmp_path):
    require_tools("gcc") if target == "host" else require_tools("arm-none-eabi-gcc",
                                                                "qemu-system-arm")
    main = tmp_path / "rq_main.c"
    main.write_text(_c_program(c_rows))
    extra = ["-fsanitize=address,undefined", "-fno-sanitize-recover=all"] \
        if target == "host" else []
    out = harness.run(harness.build(main, target, opt, tmp_path, extra), target)
    assert out.strip() == f"bad 0 of {len(c_rows)}"  # (sat16's cases count only if bad)


# ---- the scheduled LSTM in the evaluator, at the extremes ---------------------------------

def _extreme_inputs(k, rng):
    """Inputs and states that drive the accumulators to their bounds: int8 vectors of the
    range's ends (all low, all high, the sign pattern of random weight rows), int16 cell
    states at +-32767, and random ones."""
    inputs = []
    for pattern in range(6):
        arrays = {}
        for b in k.params:
            if b.kind != "in":
                continue
            info = np.iinfo(b.dtype)
            if pattern == 0:
                v = np.full(b.size, info.min)
            elif pattern == 1:
                v = np.full(b.size, info.max)
            elif pattern in (2, 3):
                v = np.where(rng.random(b.size) < 0.5, info.min, info.max)
            else:
                v = rng.integers(info.min, info.max + 1, b.size)
            arrays[b.name] = v.astype(b.dtype)
        inputs.append(arrays)
    return inputs


def _equal_in_evaluator(model):
    g = load_tflite(model)
    node = g.nodes[0]
    ref = reference_kernel(node, g, "k")
    fast = lower_node(node, g, "k", M4)
    rng = np.random.default_rng(11)
    for inputs in _extreme_inputs(ref, rng):
        results = []
        for k in (ref, fast):
            arrays = {b.name: np.zeros(b.size, b.dtype) for b in k.params if b.kind == "out"}
            arrays.update({n: v.copy() for n, v in inputs.items()})
            run_kernel(k, arrays)
            results.append({n: v.tolist() for n, v in arrays.items()})
        assert results[0] == results[1]
    return fast


def _calls(kernel) -> list:
    """The names of the functions the kernel's expressions call, once per call site."""
    out = []

    def visit(x):
        if isinstance(x, ir.Call):
            out.append(x.fn)
        if isinstance(x, tuple):
            for y in x:
                visit(y)
        elif hasattr(x, "__dataclass_fields__") and not isinstance(x, (ir.Const, ir.Var)):
            for f in x.__dataclass_fields__:
                visit(getattr(x, f))
    visit(kernel.body)
    return out


def saturating_lstm(seed, **kw):
    """An LSTM whose input FC scale is > 1 (s_x * s_w > 2^-12: shift > 0, so pre > 1) with
    257 inputs of full-range weights: |acc| << pre leaves int32, the gates' x products cannot
    take the fast form; the other requantizations can."""
    return lstm_model(seed, inputs=257, hidden=6, batch=1, steps=3, x_scale=0.6,
                      w_scale=0.4, **kw)


@pytest.mark.parametrize("cell_clip", [0.0, 0.5, 100.0])
def test_scheduled_lstm_equals_reference_at_the_extremes(cell_clip):
    """(a clip of 100 is beyond the int16 cell state's range: the clamp keeps only its lower
    end, -32767; the cell state inputs include -32768)"""
    model, _ = lstm_model(5, batch=2, steps=3, inputs=19, hidden=12, cell_clip=cell_clip)
    fast = _equal_in_evaluator(model)
    calls = _calls(fast)
    assert "mf_seq_rq" in calls and "mf_mbqm" not in calls, "every requantization provable"


def test_unprovable_gates_keep_mbqm_and_equal_reference_and_tflm():
    model, x = saturating_lstm(9)
    fast = _equal_in_evaluator(model)
    calls = _calls(fast)
    assert calls.count("mf_mbqm") == 4, "the four x-side gate requantizations"
    assert calls.count("mf_seq_rq") == 4 + 3, "the h side, the cell products, the hidden state"
    require_tflm()
    want = tflm.run(model, [x])[0]
    np.testing.assert_array_equal(runner.run(model, x), want)


@pytest.mark.parametrize("board", ["mps2-an386", "mps2-an385"])
def test_lstm_on_arm_equals_tflm(board):
    """The fast requantization on the M4 (SMMULR) and portably on the M3, a provable layer and
    one with unprovable gates."""
    require_tflm()
    require_tools("arm-none-eabi-gcc", "qemu-system-arm")
    for model, x in (lstm_model(21, time_major=False, batch=2, steps=4, inputs=13, hidden=9,
                                cell_clip=0.5), saturating_lstm(4)):
        np.testing.assert_array_equal(runner.run(model, x, board=board), tflm.run(model, [x])[0])


# ---- the matrix-vector kernels on their own ----------------------------------------------

MV_SHAPES = [(4, 1), (6, 3), (8, 4), (13, 5), (80, 28), (80, 20), (12, 32), (5, 33), (16, 37),
             (9, 45), (20, 64), (80, 257)]


def _mv_program(seed: int) -> tuple:
    """A C program calling mf_seq_mv_s8, mf_seq_mv_w16 and (G <= 8) mf_seq_mv_w16_g<G> on
    random rows and vectors (weights and vector entries at the int8 extremes included, the
    offset any negated zero point), comparing every output with numpy's int64 products."""
    from mcuforge.codegen_c.kernels.seq import MV16_UNROLLED
    from mcuforge.codegen_c.micro_seq import pack_rows4, pack_rows4_w16
    rng = np.random.default_rng(seed)
    parts, calls, checks = [], [], 0
    for i, (rows, n) in enumerate(MV_SHAPES):
        w = rng.integers(-128, 128, (rows, n))
        w[rng.random((rows, n)) < 0.2] = -128
        v = rng.integers(-128, 128, n)
        v[rng.random(n) < 0.3] = -128 if i % 2 else 127
        off = int(rng.choice([-127, 0, 128, int(rng.integers(-127, 129))]))
        want = (w * (v + off)).sum(axis=1)
        g = (n + 3) // 4

        def arr(name, ctype, values):
            return (f"static const {ctype} {name}[] __attribute__((aligned(8))) = "
                    f"{{{', '.join(str(int(x)) for x in values)}}};\n")
        parts += [arr(f"w8_{i}", "int8_t", pack_rows4(w.astype(np.int8))),
                  arr(f"w16_{i}", "int16_t", pack_rows4_w16(w.astype(np.int8))),
                  arr(f"v_{i}", "int8_t", v), arr(f"want_{i}", "int32_t", want)]
        fns = [("mf_seq_mv_s8", f"w8_{i}"), ("mf_seq_mv_w16", f"w16_{i}")]
        if g <= MV16_UNROLLED:
            fns.append((f"mf_seq_mv_w16_g{g}", f"w16_{i}"))
        for fn, wname in fns:
            calls.append(f"    memset(out, 0x5A, sizeof out);\n"
                         f"    {fn}({wname}, v_{i}, {n}, {off}, {rows}, out, (int16_t *)work);\n"
                         f"    for (i = 0; i < {rows}; i++) bad += out[i] != want_{i}[i];\n"
                         f"    bad += out[{rows}] != 0x5A5A5A5A; /* nothing past the rows */\n")
            checks += rows + 1
    src = ('#include <stdint.h>\n#include <string.h>\n#include "mcuforge_seq.h"\n'
           '#include "bench.h"\n' + "".join(parts)
           + "static int32_t out[96], work[160];\nint main(void) {\n    int32_t i, bad = 0;\n"
           + "".join(calls)
           + '    bench_puts("bad ");\n    bench_put_i64(bad);\n    bench_puts("\\n");\n'
           "    bench_exit(0);\n    return 0;\n}\n")
    return src, checks


@pytest.mark.parametrize("target,opt", C_TARGETS, ids=[f"{t}{o}" for t, o in C_TARGETS])
def test_c_mv_kernels_equal_numpy(target, opt, tmp_path):
    require_tools("gcc") if target == "host" else require_tools("arm-none-eabi-gcc",
                                                                "qemu-system-arm")
    src, checks = _mv_program(3)
    main = tmp_path / "mv_main.c"
    main.write_text(src)
    extra = ["-fsanitize=address,undefined", "-fno-sanitize-recover=all"] \
        if target == "host" else []
    out = harness.run(harness.build(main, target, opt, tmp_path, extra), target)
    assert checks > 0 and out.strip() == "bad 0"
