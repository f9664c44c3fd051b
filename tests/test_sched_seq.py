"""The schedule of the sequence layers (codegen_c/kernels/seq.py): int8 SVDF and the integer
LSTM with their inner products on mf_seq_dot_s8 (runtime_c/mcuforge_seq.h) compute exactly what
their reference lowerings compute, and the compiled C equals tflite-micro bit for bit.

Layers are random one-operator models built with tests/tfl_build.py (the `tflite` package's
builders, not mcuforge's writer): odd sizes (dot lengths off the kernel's groups of 4), random
zero points, int8 and int16 SVDF memory (int16: only the feature products are scheduled), time
and batch major LSTMs, a cell clip. Checks:
1. the loop-IR evaluator: scheduled kernel for the host and for a DSP target == reference
   kernel on random inputs and states;
2. the generated C on the host (portable body) == tflite-micro over several invocations (the
   state carries);
3. a few layers, and tflite-micro's own example models, on the emulated Cortex-M4 (DSP body)
   == tflite-micro.
"""
from __future__ import annotations

import os

import numpy as np
import pytest

from mcuforge.codegen_c.evaluate import run_kernel
from mcuforge.codegen_c.kernels import lower_node
from mcuforge.codegen_c.kernels.seq import seq as seq_schedule
from mcuforge.codegen_c.lower import OpContext, reference_kernel
from conftest import require_tflm, require_tools
from mcuforge.frontend.tflite import load_tflite
from mcuforge.ir.target import HOST, Target
from mcuforge import runner
from mcuforge.tools import tflm
from tfl_build import Model

M4 = Target("mps2-an386", "cortex-m4", frozenset({"dsp"}))
FN, MV, MV16 = "mf_seq_dot_s8", "mf_seq_mv_s8", "mf_seq_mv_w16"
INVOCATIONS = 6


def svdf_model(seed, batch=1, inputs=9, units=5, rank=1, memory=6, state="int8"):
    """x [batch, inputs] -> y [batch, units] through one SVDF with an int8 or int16 memory,
    quantized as the converter writes it (see mcuforge/tools/tflite_cases/stateful.py)."""
    rng = np.random.default_rng(seed)
    m = Model()
    f = units * rank
    sx, zx = float(rng.uniform(0.02, 0.06)), int(rng.integers(-128, 128))
    xi = m.tensor("x", (batch, inputs), "int8", scale=sx, zero_point=zx)
    wf = m.tensor("weights_feature", (f, inputs), "int8", rng.integers(-127, 128, (f, inputs)),
                  scale=float(rng.uniform(0.002, 0.01)), zero_point=0)
    if state == "int8":
        s_s, z_s, s_wt = float(rng.uniform(0.05, 0.2)), int(rng.integers(-60, 60)), 0.5 / 127
        wt_data = rng.integers(-127, 128, (f, memory))
    else:
        s_s, z_s, s_wt = 0.0005, 0, 0.5 / 32767
        wt_data = rng.integers(-32767, 32768, (f, memory))
    wt = m.tensor("weights_time", (f, memory), state, wt_data, scale=s_wt, zero_point=0)
    s_b = s_s * s_wt
    bi = m.tensor("bias", (units,), "int32",
                  np.round(rng.uniform(-1, 1, units) / s_b), scale=s_b, zero_point=0)
    st = m.tensor("state", (batch, f * memory), state, scale=s_s, zero_point=z_s, variable=True)
    yi = m.tensor("y", (batch, units), "int8", scale=float(rng.uniform(0.05, 0.15)),
                  zero_point=int(rng.integers(-20, 20)))
    m.op("SVDF", [xi, wf, wt, bi, st], [yi], "SVDFOptions", Rank=rank,
         FusedActivationFunction=0)
    m.io([xi], [yi])
    x = rng.integers(-128, 128, (INVOCATIONS, batch, inputs)).astype(np.int8)
    return m.build(), x


GATES = ("input", "forget", "cell", "output")


def lstm_model(seed, time_major=True, batch=2, steps=3, inputs=7, hidden=5, cell_clip=0.0,
               x_scale=None, w_scale=0.01):
    """One integer (8x8 -> 16) UNIDIRECTIONAL_SEQUENCE_LSTM without peepholes, projection or
    layer normalisation, quantized as the converter writes it."""
    rng = np.random.default_rng(seed)
    m = Model()
    sx, zx = float(rng.uniform(0.02, 0.06)), int(rng.integers(-128, 128))
    sx = sx if x_scale is None else x_scale
    sh, zh = 1 / 128, int(rng.integers(-10, 10))
    sw = w_scale
    x_shape = (steps, batch, inputs) if time_major else (batch, steps, inputs)
    xi = m.tensor("x", x_shape, "int8", scale=sx, zero_point=zx)
    ins = [xi]
    for name, n in (("input_to", inputs), ("recurrent_to", hidden)):
        ins += [m.tensor(f"{name}_{g}_w", (hidden, n), "int8",
                         rng.integers(-127, 128, (hidden, n)), scale=sw, zero_point=0)
                for g in GATES]
    ins += [-1] * 3  # peepholes
    ins += [m.tensor(f"{g}_gate_bias", (hidden,), "int32",
                     np.round(rng.uniform(-0.5, 0.5, hidden) / (sx * sw)), scale=sx * sw,
                     zero_point=0) for g in GATES]
    ins += [-1] * 2  # projection
    ins += [m.tensor("hidden_state", (batch, hidden), "int8", scale=sh, zero_point=zh,
                     variable=True),
            m.tensor("cell_state", (batch, hidden), "int16", scale=2.0**-11, zero_point=0,
                     variable=True)]
    ins += [-1] * 4  # layer normalisation
    yi = m.tensor("y", x_shape[:2] + (hidden,), "int8", scale=sh, zero_point=zh)
    m.op("UNIDIRECTIONAL_SEQUENCE_LSTM", ins, [yi], "UnidirectionalSequenceLSTMOptions",
         FusedActivationFunction=4, CellClip=cell_clip, TimeMajor=time_major)
    m.io([xi], [yi])
    x = rng.integers(-128, 128, (INVOCATIONS, *x_shape)).astype(np.int8)
    return m.build(), x


CASES = [
    ("svdf_int8", svdf_model, dict()),
    ("svdf_int8_rank2_batch2", svdf_model, dict(batch=2, inputs=13, units=3, rank=2, memory=5)),
    ("svdf_int8_wide", svdf_model, dict(inputs=32, units=8, memory=8)),
    ("svdf_int8_memory1", svdf_model, dict(inputs=4, memory=1)),
    ("svdf_int16", svdf_model, dict(batch=2, inputs=11, state="int16")),
    ("lstm_time_major", lstm_model, dict()),
    ("lstm_batch_major", lstm_model, dict(time_major=False, inputs=9, hidden=6)),
    ("lstm_clip_batch1", lstm_model, dict(batch=1, steps=4, inputs=3, hidden=8, cell_clip=0.8)),
    ("lstm_wide", lstm_model, dict(batch=1, steps=2, inputs=28, hidden=20)),
    # vectors of more than 8 groups of 4 taps: mf_seq_mv_w16's looped asm (G - 1 = 9 and 11:
    # every peel of its group loop), the shorter ones its unrolled entries
    ("lstm_long", lstm_model, dict(batch=1, steps=2, inputs=37, hidden=11)),
    ("svdf_long", svdf_model, dict(inputs=45, units=3, rank=2, memory=4)),
]


def _build(name, fn, kw):
    return fn(sum(map(ord, name)), **kw)


@pytest.mark.parametrize("name,fn,kw", CASES, ids=[c[0] for c in CASES])
def test_scheduled_kernel_equals_reference(name, fn, kw):
    model, _ = _build(name, fn, kw)
    g = load_tflite(model)
    node = g.nodes[0]
    ref = reference_kernel(node, g, "k")
    rng = np.random.default_rng(len(name))
    inputs = {b.name: rng.integers(np.iinfo(b.dtype).min, np.iinfo(b.dtype).max + 1,
                                   b.size).astype(b.dtype)
              for b in ref.params if b.kind == "in"}
    results = []
    for target in (None, HOST, M4):
        k = ref if target is None else lower_node(node, g, "k", target)
        if k.schedule.startswith("mf_seq_svdf"):  # the whole int8 SVDF (test_sched_svdf.py)
            k = seq_schedule(OpContext(node, g, "k"), ref, target)  # here: its fallback
        if target is not None:
            assert k.schedule == (MV16 if target is M4 else MV), "the schedule should hoist"
        arrays = {b.name: np.zeros(b.size, b.dtype) for b in k.params if b.kind == "out"}
        arrays.update({n: v.copy() for n, v in inputs.items()})
        run_kernel(k, arrays)
        results.append({n: v.tolist() for n, v in arrays.items()})
    assert results[1] == results[0] and results[2] == results[0]


@pytest.mark.parametrize("name,fn,kw", CASES, ids=[c[0] for c in CASES])
def test_host_c_equals_tflm(name, fn, kw):
    require_tflm()
    model, x = _build(name, fn, kw)
    np.testing.assert_array_equal(runner.run(model, x), tflm.run(model, [x])[0])


M4_CASES = [c for c in CASES if c[0] in ("svdf_int8_rank2_batch2", "svdf_int16",
                                         "lstm_batch_major", "lstm_clip_batch1", "lstm_long",
                                         "svdf_long")]


@pytest.mark.parametrize("name,fn,kw", M4_CASES, ids=[c[0] for c in M4_CASES])
def test_m4_dsp_equals_tflm(name, fn, kw):
    require_tflm()
    require_tools("arm-none-eabi-gcc", "qemu-system-arm")
    model, x = _build(name, fn, kw)
    np.testing.assert_array_equal(runner.run(model, x, board="mps2-an386"),
                                  tflm.run(model, [x])[0])


# tflite-micro's example models with these layers (keyword_scrambled: 7 SVDFs; the LSTM of
# its MNIST example), where the environment provides them
EXAMPLES = ("keyword_scrambled_8bit.tflite", "trained_lstm_int8.tflite")


# and the LSTM models of tflite-micro's source tree (DTLN: two LSTMs of one step, 128 units;
# micro_speech_lstm: 49 steps, 80 units), where a checkout is present
TFLM_TREE = os.environ.get("MCUFORGE_TFLM_TREE", "/tmp/ys/pinned/tflite-micro")
TREE_EXAMPLES = ("tensorflow/lite/micro/examples/dtln/dtln_noise_suppression.tflite",
                 "third_party/xtensa/examples/micro_speech_lstm/micro_speech_lstm.tflite")


@pytest.mark.parametrize("file,board", [(f, "mps2-an386") for f in EXAMPLES + TREE_EXAMPLES]
                         + [(f, "mps2-an385") for f in TREE_EXAMPLES])
def test_tflm_example_models_on_arm_equal_tflm(file, board):
    """(the M3 runs the portable bodies)"""
    require_tflm()
    require_tools("arm-none-eabi-gcc", "qemu-system-arm")
    path = os.path.join(TFLM_TREE if "/" in file
                        else os.environ.get("MCUFORGE_TFLM_MODELS", "/tmp"), file)
    if not os.path.exists(path):
        pytest.skip(f"{path} not present")
    model = open(path, "rb").read()
    g = load_tflite(model)
    t = g.tensors[g.inputs[0]]
    info = np.iinfo(t.dtype)  # (keyword_scrambled takes int16 features)
    x = np.random.default_rng(3).integers(info.min, info.max + 1, (3, *t.shape)).astype(t.dtype)
    np.testing.assert_array_equal(runner.run(model, x, board=board), tflm.run(model, [x])[0])


def _hoisted(body, consts):
    from mcuforge.codegen_c.kernels import seq
    h = seq._Hoist({b.name: b for b in consts}, False)
    return h.body(seq._replace_dots(body)), h


def _row_dot(acc, w, row, n, v, v0, k="k"):
    """acc = acc + w[row * n + k] * (v[v0 + k] + 3) over k < n, as state.py writes it."""
    from mcuforge.codegen_c import loop_ir as ir
    kv = ir.Var(k)
    return ir.Loop(k, n, (ir.Assign(acc, ir.Var(acc) + ir.Load(w, row * n + kv, "int8")
                                    * (ir.Load(v, v0 + kv, "int8") + 3)),))


def test_hoisting_keeps_products_whose_vector_the_row_loop_changes_or_indexes():
    """Row products move out of the loop over rows only when their vector is the same for
    every row: not when it is indexed by an inner loop's variable or written in the loop."""
    from mcuforge.codegen_c import loop_ir as ir
    w = ir.Buffer("w", "int8", 4 * 6, "const", np.arange(24, dtype=np.int8) - 12)
    j, r = ir.Var("j"), ir.Var("r")
    # 1: the vector row r of x, r an inner loop's variable: the call stays in the loop
    inner = (ir.Loop("j", 4, (ir.Loop("r", 2, (
        ir.Decl("acc", "int32", ir.Const(0)), _row_dot("acc", "w", j, 6, "x", r * 6),
        ir.Store("y", j * 2 + r, ir.Var("acc")))),)),)
    # 2: the vector is y1, written in the loop: stays
    written = (ir.Loop("j", 4, (
        ir.Decl("acc", "int32", ir.Const(0)), _row_dot("acc", "w", j, 6, "y1", ir.Const(0)),
        ir.Store("y1", j, ir.cast(ir.Var("acc"), "int8")))),)
    # 3: the vector x, the same for every row: hoisted
    fine = (ir.Loop("j", 4, (
        ir.Decl("acc", "int32", ir.Const(0)), _row_dot("acc", "w", j, 6, "x", ir.Const(6)),
        ir.Store("y", j, ir.Var("acc")))),)
    for body, hoists in ((inner, False), (written, False), (fine, True)):
        new, h = _hoisted(body, [w])
        assert bool(h.calls) == hoists
        calls = [s for s in ir.walk(new) if isinstance(s, ir.CallStmt)]
        assert len(calls) == (1 if hoists else 0)
        if hoists:  # evaluated: equal to the loops
            from mcuforge.codegen_c.kernels.seq import SCRATCH, _set_work
            new = _set_work(new, h.words)
            bufs = (ir.Buffer("x", "int8", 12, "in"), ir.Buffer("y", "int32", 8, "out"), w,
                    *h.packed.values(), ir.Buffer(SCRATCH, "int32", h.words + h.work, "scratch"))
            x = np.random.default_rng(0).integers(-128, 128, 12).astype(np.int8)
            got, want = np.zeros(8, np.int32), np.zeros(8, np.int32)
            run_kernel(ir.Kernel("k", bufs, new), {"x": x, "y": got})
            run_kernel(ir.Kernel("k", bufs[:3], body), {"x": x, "y": want})
            assert got.tolist() == want.tolist()


def test_flash_budget_keeps_sequence_weights_int8_and_m4_still_equals_tflm():
    """The int16 weights double a layer's flash; a budget they exceed keeps them int8
    (mf_seq_mv_s8, its DSP body), and the result is still tflite-micro's."""
    from dataclasses import replace

    from mcuforge.codegen_c.kernels import budget
    model, x = _build("lstm_wide", lstm_model, dict(batch=1, steps=2, inputs=28, hidden=20))
    g = load_tflite(model)
    node = g.nodes[0]
    wide = lower_node(node, g, "k", M4)
    assert wide.schedule == MV16
    tight = replace(M4, flash_budget=budget.flash_bytes([wide]) - 1)
    narrowed = budget.fit(tight, {node.outputs[0]: wide})
    assert node.outputs[0] in narrowed.narrow_weights
    narrow = lower_node(node, g, "k", narrowed)
    assert narrow.schedule == MV and budget.flash_bytes([narrow]) < budget.flash_bytes([wide])
    require_tflm()
    require_tools("arm-none-eabi-gcc", "qemu-system-arm")
    got = runner.run(model, x, board="mps2-an386", flash_budget=budget.flash_bytes([narrow]) + 64)
    np.testing.assert_array_equal(got, tflm.run(model, [x])[0])


@pytest.mark.parametrize("opt", ["-O0", "-Os", "-O3"])
def test_m4_optimisation_levels_equal_tflm(opt, monkeypatch):
    """The DSP bodies at other optimisation levels: -O0 builds the intrinsics bodies (no asm),
    -Os / -O3 the asm of mf_seq_mv_w16 and its unrolled entries (an SVDF with 6 rows adds a
    tail block)."""
    require_tflm()
    require_tools("arm-none-eabi-gcc", "qemu-system-arm")
    monkeypatch.setenv("MCUFORGE_OPT", opt)
    for name in ("svdf_int8_rank2_batch2", "lstm_batch_major", "lstm_long"):
        fn, kw = {c[0]: (c[1], c[2]) for c in CASES}[name]
        model, x = _build(name, fn, kw)
        np.testing.assert_array_equal(runner.run(model, x, board="mps2-an386"),
                                      tflm.run(model, [x])[0])
