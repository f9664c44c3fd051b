"""The int8 SVDF schedule (codegen_c/kernels/svdf.py): one mf_seq_svdf_s8 call per batch row
(runtime_c/mcuforge_seq.h) computes exactly what the reference lowering (lower/state.py)
computes, and the compiled C equals tflite-micro bit for bit over several invocations (the
memory carries).

Layers are random one-operator models built with tests/tfl_build.py (the `tflite` package's
builders): memories of 8 and 32 (the DSP body's whole words) and of 5, 6 and 1 (the portable
loop), rank 1 and 2, batch 2, relu (the general clamp), and the proofs' boundary cases: zero
points at the ends of int8, weights at +-127 throughout (the largest sums the folds allow), and
biases near the int32 limits as keyword_scrambled has them (units whose output is constant:
their bias is replaced by a sum giving that constant). Checks:
1. the loop-IR evaluator: scheduled kernel for the host and for a DSP target == reference
   kernel on random inputs and memories, also with extreme inputs;
2. the generated C on the host (portable body) == tflite-micro;
3. the emulated Cortex-M4 (DSP body) and Cortex-M3 (portable body) == tflite-micro, and
   tflite-micro's keyword_scrambled example (7 SVDFs) on the M4.
"""
from __future__ import annotations

import os

import numpy as np
import pytest

from mcuforge.codegen_c.evaluate import run_kernel
from mcuforge.codegen_c.kernels import lower_node
from mcuforge.codegen_c.lower import reference_kernel
from conftest import require_tflm, require_tools
from mcuforge.frontend.tflite import load_tflite
from mcuforge.ir.target import HOST, Target
from mcuforge import runner
from mcuforge.tools import tflm
from tfl_build import Model

M4 = Target("mps2-an386", "cortex-m4", frozenset({"dsp"}))
INVOCATIONS = 6


def svdf_model(seed, batch=1, inputs=9, units=5, rank=1, memory=8, act=0, extreme=False,
               huge_bias=False, zx=None, zs=None):
    """x [batch, inputs] -> y [batch, units] through one int8 SVDF with an int8 memory."""
    rng = np.random.default_rng(seed)
    m = Model()
    f = units * rank
    sx = float(rng.uniform(0.02, 0.06))
    zx = int(rng.integers(-128, 128)) if zx is None else zx
    xi = m.tensor("x", (batch, inputs), "int8", scale=sx, zero_point=zx)
    wf_data = rng.choice([-127, 127], (f, inputs)) if extreme \
        else rng.integers(-127, 128, (f, inputs))
    wf = m.tensor("weights_feature", (f, inputs), "int8", wf_data,
                  scale=float(rng.uniform(0.002, 0.01)), zero_point=0)
    s_s = float(rng.uniform(0.05, 0.2))
    zs = int(rng.integers(-60, 60)) if zs is None else zs
    wt_data = rng.choice([-127, 127], (f, memory)) if extreme \
        else rng.integers(-127, 128, (f, memory))
    s_wt = 0.5 / 127
    wt = m.tensor("weights_time", (f, memory), "int8", wt_data, scale=s_wt, zero_point=0)
    s_b = s_s * s_wt
    b = np.round(rng.uniform(-1, 1, units) / s_b)
    if huge_bias:  # keyword_scrambled's: near the int32 limits, either sign
        reach = np.abs(wt_data).reshape(units, -1).sum(axis=1) * 256
        b = np.where(rng.random(units) < 0.5, -1, 1) * (2**31 - 1 - reach
                                                       - rng.integers(0, 1000, units))
    bi = m.tensor("bias", (units,), "int32", b, scale=s_b, zero_point=0)
    st = m.tensor("state", (batch, f * memory), "int8", scale=s_s, zero_point=zs, variable=True)
    yi = m.tensor("y", (batch, units), "int8", scale=float(rng.uniform(0.05, 0.15)),
                  zero_point=int(rng.integers(-20, 20)))
    m.op("SVDF", [xi, wf, wt, bi, st], [yi], "SVDFOptions", Rank=rank,
         FusedActivationFunction=act)
    m.io([xi], [yi])
    x = rng.integers(-128, 128, (INVOCATIONS, batch, inputs)).astype(np.int8)
    if extreme:
        x[::2] = rng.choice([-128, 127], x[::2].shape)
    return m.build(), x


CASES = [
    ("m8", dict(inputs=16, units=12)),
    ("m32", dict(inputs=32, units=6, memory=32)),
    ("m8_odd_inputs_rank2_batch2", dict(batch=2, inputs=13, units=3, rank=2)),
    ("m6_portable", dict(inputs=7, units=5, memory=6)),
    ("m5_rank2", dict(inputs=11, units=4, rank=2, memory=5)),
    ("m1", dict(inputs=4, memory=1)),
    ("m8_relu", dict(inputs=10, units=9, act=1)),
    ("m8_extreme", dict(inputs=40, units=8, extreme=True, zx=-128, zs=59)),
    ("m12_extreme_zp", dict(inputs=9, units=7, memory=12, extreme=True, zx=127, zs=-60)),
    ("m8_huge_bias", dict(inputs=16, units=16, huge_bias=True)),
    ("m8_huge_bias_rank2", dict(inputs=12, units=6, rank=2, huge_bias=True)),
]


def _build(name, kw):
    return svdf_model(sum(map(ord, name)), **kw)


@pytest.mark.parametrize("name,kw", CASES, ids=[c[0] for c in CASES])
def test_scheduled_kernel_equals_reference(name, kw):
    model, _ = _build(name, kw)
    g = load_tflite(model)
    node = g.nodes[0]
    ref = reference_kernel(node, g, "k")
    rng = np.random.default_rng(len(name))
    for trial in range(3):
        inputs = {}
        for b in ref.params:
            if b.kind == "in":
                v = rng.integers(-128, 128, b.size)
                if trial == 2:  # the ends of int8
                    v = rng.choice([-128, 127], b.size)
                inputs[b.name] = v.astype(np.int8)
        results = []
        for target in (None, HOST, M4):
            k = ref if target is None else lower_node(node, g, "k", target)
            if target is not None:
                want = "mf_seq_svdf_w16" if target is M4 else "mf_seq_svdf_w8"
                assert k.schedule == want, "the SVDF schedule should apply"
            arrays = {b.name: np.zeros(b.size, b.dtype) for b in k.params if b.kind == "out"}
            arrays.update({n: v.copy() for n, v in inputs.items()})
            run_kernel(k, arrays)
            results.append({n: v.tolist() for n, v in arrays.items()})
        assert results[1] == results[0] and results[2] == results[0]


@pytest.mark.parametrize("name,kw", CASES, ids=[c[0] for c in CASES])
def test_host_c_equals_tflm(name, kw):
    require_tflm()
    model, x = _build(name, kw)
    np.testing.assert_array_equal(runner.run(model, x), tflm.run(model, [x])[0])


ARM_CASES = ("m8", "m32", "m8_odd_inputs_rank2_batch2", "m6_portable", "m8_relu",
             "m8_extreme", "m8_huge_bias_rank2")


@pytest.mark.parametrize("board", ["mps2-an386", "mps2-an385"])
def test_arm_equals_tflm(board):
    require_tflm()
    require_tools("arm-none-eabi-gcc", "qemu-system-arm")
    for name, kw in CASES:
        if name in ARM_CASES:
            model, x = _build(name, kw)
            np.testing.assert_array_equal(runner.run(model, x, board=board),
                                          tflm.run(model, [x])[0], err_msg=name)


def test_keyword_scrambled_on_m4_equals_tflm():
    require_tflm()
    require_tools("arm-none-eabi-gcc", "qemu-system-arm")
    path = os.path.join(os.environ.get("MCUFORGE_TFLM_MODELS", "/tmp"),
                        "keyword_scrambled_8bit.tflite")
    if not os.path.exists(path):
        pytest.skip(f"{path} not present")
    model = open(path, "rb").read()
    g = load_tflite(model)
    assert all(lower_node(n, g, "k", M4).schedule == "mf_seq_svdf_w16" for n in g.nodes
               if n.op == "svdf")
    t = g.tensors[g.inputs[0]]
    x = np.random.default_rng(5).integers(-32768, 32768, (4, *t.shape)).astype(t.dtype)
    for board in ("mps2-an386", "mps2-an385"):
        np.testing.assert_array_equal(runner.run(model, x, board=board),
                                      tflm.run(model, [x])[0], err_msg=board)


def test_memory_planned_in_place_without_copies():
    """The SVDF's next memory is planned at the memory's own address (no arena bytes, no copy
    at the end of the invocation); where the graph also reads the next memory (an output
    here), it keeps its own buffer and the copy."""
    from mcuforge.codegen_c.model import generate
    from mcuforge.optimizer.memory_plan import in_place_states, plan_graph
    model, _ = _build("m8", dict(inputs=16, units=12))
    g = load_tflite(model)
    (state, nxt), = g.state.items()
    assert in_place_states(g) == {nxt: state}
    p = plan_graph(g)
    assert p.state_offsets[nxt] == p.state_offsets[state] and nxt not in p.offsets
    c = next(v for k, v in generate(g, "m", M4).files.items() if k.endswith(".c"))
    assert "memcpy(&state" not in c
    g.outputs.append(nxt)
    assert in_place_states(g) == {}
    p = plan_graph(g)
    assert nxt in p.offsets and nxt not in p.state_offsets
    c = next(v for k, v in generate(g, "m", M4).files.items() if k.endswith(".c"))
    assert "memcpy(&state" in c


def test_flash_budget_keeps_feature_weights_int8_and_m4_still_equals_tflm():
    """A budget the int16 feature weights exceed keeps them int8 (mf_dot4's int8 path on the
    DSP extension), and the result is still tflite-micro's."""
    from dataclasses import replace

    from mcuforge.codegen_c.kernels import budget
    model, x = _build("m32", dict(inputs=32, units=6, memory=32))
    g = load_tflite(model)
    node = g.nodes[0]
    wide = lower_node(node, g, "k", M4)
    assert wide.schedule == "mf_seq_svdf_w16"
    tight = replace(M4, flash_budget=budget.flash_bytes([wide]) - 1)
    narrowed = budget.fit(tight, {node.outputs[0]: wide})
    assert node.outputs[0] in narrowed.narrow_weights
    narrow = lower_node(node, g, "k", narrowed)
    assert narrow.schedule == "mf_seq_svdf_w8"
    assert budget.flash_bytes([narrow]) < budget.flash_bytes([wide])
    require_tflm()
    require_tools("arm-none-eabi-gcc", "qemu-system-arm")
    got = runner.run(model, x, board="mps2-an386", flash_budget=budget.flash_bytes([narrow]) + 64)
    np.testing.assert_array_equal(got, tflm.run(model, [x])[0])


@pytest.mark.parametrize("opt", ["-O0", "-Os", "-O3"])
def test_m4_other_optimisation_levels_equal_tflm(opt, monkeypatch):
    """-O0 builds the DSP body without its asm (MF_GEMM_ASM 0); -Os and -O3 the asm."""
    require_tflm()
    require_tools("arm-none-eabi-gcc", "qemu-system-arm")
    monkeypatch.setenv("MCUFORGE_OPT", opt)
    for name, kw in CASES:
        if name in ("m8", "m32", "m12_extreme_zp", "m8_odd_inputs_rank2_batch2"):
            model, x = _build(name, kw)
            np.testing.assert_array_equal(runner.run(model, x, board="mps2-an386"),
                                          tflm.run(model, [x])[0], err_msg=name)


OTHER = [("mps2-an500", "qemu-system-arm"), ("mps3-an547", "qemu-system-arm"),
         ("riscv32-virt", "qemu-system-riscv32")]


@pytest.mark.parametrize("board,qemu", OTHER, ids=[b for b, _ in OTHER])
def test_other_cores_equal_tflm(board, qemu):
    """The DSP bodies on the M7 and M55, the portable one on RISC-V."""
    require_tflm()
    require_tools(qemu, "riscv64-unknown-elf-gcc" if "riscv" in board else "arm-none-eabi-gcc")
    for name, kw in CASES:
        if name in ("m8", "m32", "m6_portable"):
            model, x = _build(name, kw)
            np.testing.assert_array_equal(runner.run(model, x, board=board),
                                          tflm.run(model, [x])[0], err_msg=name)


def test_svdf_beside_an_element_wise_kernel_builds_on_m4():
    """An SVDF (mcuforge_seq.h) and a tabulated LOGISTIC (mcuforge_ew.h) in one model: both
    headers in one translation unit (they once both defined mf_sxtab16_ror8: a build error)."""
    require_tflm()
    require_tools("arm-none-eabi-gcc", "qemu-system-arm")
    rng = np.random.default_rng(11)
    m = Model()
    xi = m.tensor("x", (1, 12), "int8", scale=0.03, zero_point=-5)
    wf = m.tensor("weights_feature", (40, 12), "int8", rng.integers(-127, 128, (40, 12)),
                  scale=0.005, zero_point=0)
    wt = m.tensor("weights_time", (40, 8), "int8", rng.integers(-127, 128, (40, 8)),
                  scale=0.5 / 127, zero_point=0)
    bi = m.tensor("bias", (40,), "int32", rng.integers(-2000, 2000, 40),
                  scale=0.1 * 0.5 / 127, zero_point=0)
    st = m.tensor("state", (1, 320), "int8", scale=0.1, zero_point=3, variable=True)
    h = m.tensor("h", (1, 40), "int8", scale=0.08, zero_point=-2)
    yi = m.tensor("y", (1, 40), "int8", scale=1 / 256, zero_point=-128)
    m.op("SVDF", [xi, wf, wt, bi, st], [h], "SVDFOptions", Rank=1, FusedActivationFunction=0)
    m.op("LOGISTIC", [h], [yi])
    m.io([xi], [yi])
    model = m.build()
    g = load_tflite(model)
    assert [lower_node(n, g, "k", M4).schedule for n in g.nodes] == ["mf_seq_svdf_w16",
                                                                      "mf_ew_lut8"]
    x = rng.integers(-128, 128, (INVOCATIONS, 1, 12)).astype(np.int8)
    np.testing.assert_array_equal(runner.run(model, x, board="mps2-an386"),
                                  tflm.run(model, [x])[0])
