"""Flash as a budget (--flash-budget): on a DSP core the GEMM kernels widen weights to int16,
doubling their bytes; under a budget the compiler keeps layers' weights int8 until the model
fits, says which, refuses a budget it cannot meet, and stays bit-exact with tflite-micro."""
from __future__ import annotations

import subprocess
import sys

import numpy as np

from mcuforge.codegen_c.kernels.budget import CODE_ALLOWANCE
from conftest import mlperf_model, require_tflm, require_tools
from mcuforge import runner
from mcuforge.api import load
from mcuforge.tools import tflm
from mcuforge.tools.info import model_info


def constant_bytes(model) -> int:
    """The model's own constants (int8 weights, int32 biases) in bytes, counted from the graph:
    what any int8-weight form of it holds at least."""
    g = load(model)
    return sum(t.data.nbytes for t in g.tensors.values() if t.is_const)


def test_budget_narrows_just_enough():
    model = mlperf_model("ad01_int8")  # ten fully connected layers, 270 KB of int8 weights
    full = model_info(model, board="mps2-an386")
    assert full["weight_bytes"] > 1.8 * constant_bytes(model)
    previous = None
    for budget in (full["weight_bytes"] + CODE_ALLOWANCE, 480_000, 400_000, 330_000):
        info = model_info(model, board="mps2-an386", flash_budget=budget)
        assert info["weight_bytes"] + CODE_ALLOWANCE <= budget
        # never narrower than needed: one layer less narrowed would not fit (checked by size)
        if previous is not None:
            assert info["weight_bytes"] <= previous
        previous = info["weight_bytes"]


def test_helium_weights_stay_int8():
    """On the M55 (Helium) the GEMM layers keep int8 weights (mcuforge_mve.h's stream: 1x flash
    plus 24 bytes of bias and requantization per channel), so the model is about the size of
    the portable build and a budget the M4 meets only by narrowing needs nothing here."""
    model = mlperf_model("ad01_int8")
    g = load(model)
    weights = sum(t.data.nbytes for t in g.tensors.values() if t.is_const and t.dtype == "int8")
    channels = sum(t.data.size for t in g.tensors.values() if t.is_const and t.dtype == "int32")
    m55 = model_info(model, board="mps3-an547")["weight_bytes"]
    # int8 weights (padded to 16-tap chunks, 4-channel blocks: 1% at most) + 24 B a channel
    assert weights + 24 * channels <= m55 < 1.01 * (weights + 24 * channels)
    budget = m55 + CODE_ALLOWANCE
    assert model_info(model, board="mps2-an386", flash_budget=480_000)["weight_bytes"] > m55
    assert model_info(model, board="mps3-an547", flash_budget=budget)["weight_bytes"] == m55


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "mcuforge.cli", *args], capture_output=True,
                          text=True)


def narrowed_layer_schedules(cases, seed: int, target) -> list:
    """Per (op, layer_model keywords) case: the layer's schedule on `target` and with its
    weights narrowed by the budget, after checking that the narrowed kernel's outputs are
    the reference kernel's (loop-IR evaluator); shared by the M3 and RV32 budget tests."""
    from dataclasses import replace

    from mcuforge.codegen_c.evaluate import run_kernel
    from mcuforge.codegen_c.kernels import lower_node
    from mcuforge.codegen_c.lower import reference_kernel
    from mcuforge.frontend.tflite import load_tflite
    from test_sched_layers import layer_model
    out = []
    for i, (op, kw) in enumerate(cases):
        model, x = layer_model(seed + i, op, act="relu", **kw)
        g = load_tflite(model)
        node = g.nodes[0]
        y0 = np.zeros(g.tensors[g.outputs[0]].size, np.int8)
        run_kernel(reference_kernel(node, g, "k"), {"x": x[0].reshape(-1).copy(), "y": y0})
        k = lower_node(node, g, "k", replace(target, narrow_weights=frozenset(node.outputs)))
        y = np.zeros_like(y0)
        run_kernel(k, {"x": x[0].reshape(-1).copy(), "y": y})
        assert y.tolist() == y0.tolist(), kw
        out.append((lower_node(node, g, "k", target).schedule, k.schedule))
    return out


def test_budget_reported_and_refused(tmp_path):
    model = str(mlperf_model("ad01_int8"))
    r = _cli("compile", model, "-o", str(tmp_path / "a"), "--board", "mps2-an386",
             "--flash-budget", "400K")
    assert r.returncode == 0, r.stderr
    assert "flash budget:" in r.stdout and "keep int8 weights" in r.stdout
    r = _cli("compile", model, "-o", str(tmp_path / "b"), "--board", "mps2-an386",
             "--flash-budget", "100K")
    assert r.returncode == 2 and "over the flash budget of 102,400 bytes" in r.stderr
    assert "Traceback" not in r.stderr
    r = _cli("compile", model, "-o", str(tmp_path / "c"), "--flash-budget", "lots")
    assert r.returncode == 2 and "not a number of bytes" in r.stderr


def test_mixed_weight_forms_bit_exact_on_m4():
    require_tflm()
    require_tools("arm-none-eabi-gcc", "qemu-system-arm")
    model = mlperf_model("kws_ref_model")
    g = load(model)
    x = np.random.default_rng(3).integers(-128, 128, (2, *g.tensors[g.inputs[0]].shape))
    x = x.astype(np.int8)
    full = model_info(model, board="mps2-an386")["weight_bytes"]
    budget = full + CODE_ALLOWANCE - 5_000  # some layers must go back to int8 weights
    info = model_info(model, board="mps2-an386", flash_budget=budget)
    assert info["weight_bytes"] < full
    got = runner.run(model, x, board="mps2-an386", flash_budget=budget)
    np.testing.assert_array_equal(got, tflm.run(model.read_bytes(), [x])[0])


def test_budget_counts_the_pair_kernel_stream():
    """KWS's 1x1 layers run mf_gemm2_w16, whose int32 stream holds the int16 weights beside
    bias and mf_rq: under a budget each narrowed layer saves exactly what the budget logic
    counted (the model fits, and no tighter than one layer's saving below the budget)."""
    model = mlperf_model("kws_ref_model")
    full = model_info(model, board="mps2-an386")["weight_bytes"]
    narrow = constant_bytes(model)
    for cut in (1_000, 9_000, 17_000):
        budget = full + CODE_ALLOWANCE - cut
        info = model_info(model, board="mps2-an386", flash_budget=budget)
        assert narrow <= info["weight_bytes"] + CODE_ALLOWANCE <= budget
        # a 1x1 64->64 layer saves 64 * 64 bytes: never more than one layer's worth too narrow
        assert info["weight_bytes"] + CODE_ALLOWANCE > budget - 64 * 64 - 1


def test_budget_never_narrows_a_layer_that_would_grow():
    """mf_gemm1k8_w16 with O = 2 (32 bytes a channel) takes less flash than mf_gemm_w8 would
    (O padded to 4, bias and mf_rq apart): under a budget only layers that save bytes go back to
    int8 weights, the one that saves the most per extra instruction first."""
    from dataclasses import replace

    from mcuforge.codegen_c.kernels import budget, lower_node
    from mcuforge.frontend.tflite import load_tflite
    from mcuforge.ir.target import Target
    from test_sched_layers import layer_model
    m4 = Target("mps2-an386", "cortex-m4", frozenset({"dsp"}))
    # few MACs: the small layer would come first by extra instructions per byte saved
    small, _ = layer_model(1, "CONV_2D", hw=(1, 1), c=8, o=2, k=(1, 1), act="relu", y_zp=-128)
    big, _ = layer_model(2, "CONV_2D", hw=(8, 8), c=64, o=64, k=(1, 1), act="relu", y_zp=-128)
    lowered = {}
    for name, model in (("small", small), ("big", big)):
        g = load_tflite(model)
        lowered[name] = lower_node(g.nodes[0], g, name, m4)
    assert lowered["small"].schedule.startswith("mf_gemm1k8_w16")
    assert lowered["big"].schedule.startswith("mf_gemm2_w16")
    full = budget.flash_bytes(lowered.values())
    # 64 x 64 int16 -> int8 saves 4096 bytes: a budget 100 bytes short narrows it alone
    got = budget.fit(replace(m4, flash_budget=full - 100), lowered)
    assert got.narrow_weights == frozenset({"big"})
