"""Flash as a budget (--flash-budget) on Armv7-M without DSP (Cortex-M3, mps2-an385): the scalar
schedule's "l64" kernels keep two channels' weights in one int32 lane word (2x the int8
bytes); under a budget the compiler gives layers int8 weights ("m8") until the model fits, the
layer saving the most bytes per extra instruction first, says so, refuses a budget it cannot
meet, and stays bit-exact with tflite-micro (tests/test_flash_budget.py does the same for the
M4's int16 weights)."""
from __future__ import annotations


import numpy as np

from mcuforge.codegen_c.kernels.budget import CODE_ALLOWANCE
from test_flash_budget import _cli, narrowed_layer_schedules
from conftest import mlperf_model, require_tflm, require_tools
from mcuforge import runner
from mcuforge.api import compile as compile_model, load
from mcuforge.tools import tflm
from mcuforge.tools.info import model_info

M3 = "mps2-an385"


def int8_weight_bytes(model) -> int:
    """The model's int8 weights in bytes, counted from the graph (not from mcuforge's build)."""
    g = load(model)
    return sum(t.data.nbytes for t in g.tensors.values() if t.is_const and t.dtype == "int8")


def test_budget_narrows_just_enough_on_m3():
    model = mlperf_model("ad01_int8")  # ten fully connected layers, 270 KB of int8 weights
    w8 = int8_weight_bytes(model)
    full = model_info(model, board=M3)["weight_bytes"]
    assert full > 1.9 * w8  # lane words: two channels a 4-byte word
    # the largest layer's lane words: 128 x 640 weights, half of them saved when narrowed
    most = 128 * 640
    previous = full
    for budget in (full + CODE_ALLOWANCE, 520_000, 450_000, 380_000, 320_000):
        info = model_info(model, board=M3, flash_budget=budget)
        assert info["weight_bytes"] + CODE_ALLOWANCE <= budget
        assert info["weight_bytes"] <= previous
        # never narrower than needed: at most one layer's saving below the budget
        assert info["weight_bytes"] + CODE_ALLOWANCE > budget - most
        previous = info["weight_bytes"]
    # every layer narrowed: the int8 weights (4-channel blocks: AD's widths are multiples of
    # 4) plus mf_sc_rec, 20 B a channel (a channel: one int32 bias)
    g = load(model)
    channels = sum(t.data.size for t in g.tensors.values() if t.is_const and t.dtype == "int32")
    info = model_info(model, board=M3, flash_budget=320_000)
    assert w8 + 20 * channels <= info["weight_bytes"] < 1.01 * (w8 + 20 * channels)


def test_narrows_most_bytes_per_instruction_first():
    """Two 1x1 layers, the same weights' bytes: the one over fewer pixels (fewer extra
    instructions for the bytes it saves) goes to int8 weights alone when that is enough."""
    from dataclasses import replace

    from mcuforge.codegen_c.kernels import budget, lower_node
    from mcuforge.frontend.tflite import load_tflite
    from mcuforge.ir.target import Target
    from test_sched_layers import layer_model
    m3 = Target(M3, "cortex-m3")
    few, _ = layer_model(1, "CONV_2D", hw=(1, 3), c=64, o=64, k=(1, 1), act="relu", y_zp=-128)
    many, _ = layer_model(2, "CONV_2D", hw=(8, 8), c=64, o=64, k=(1, 1), act="relu", y_zp=-128)
    lowered = {}
    for name, model in (("few", few), ("many", many)):
        g = load_tflite(model)
        lowered[name] = lower_node(g.nodes[0], g, name, m3)
        assert lowered[name].schedule == "mf_sc_gemm_l64"
    full = budget.flash_bytes(lowered.values())
    # 64 x 64 lane words -> int8 saves 64 * 64 bytes: 100 bytes short narrows one layer
    got = budget.fit(replace(m3, flash_budget=full - 100), lowered)
    assert got.narrow_weights == frozenset({"few"})
    g = load_tflite(few)
    k = lower_node(g.nodes[0], g, "few", replace(m3, narrow_weights=frozenset(g.nodes[0].outputs)))
    assert k.schedule == "mf_sc_gemm_m8"
    saved = full - budget.flash_bytes([k, lowered["many"]])
    assert saved == 64 * 64
    # both when one is not enough
    got = budget.fit(replace(m3, flash_budget=full - 64 * 64 - 1), lowered)
    assert got.narrow_weights == frozenset({"few", "many"})


def test_narrowed_layers_equal_the_reference():
    """A layer the budget keeps narrow runs m8 on the M3 (one, two and more rows, convolution
    through im2col), its outputs those of the reference kernel (loop-IR evaluator)."""
    from mcuforge.ir.target import Target
    cases = [("CONV_2D", kw) for kw in (
        dict(hw=(1, 1), c=40, o=6, k=(1, 1)), dict(hw=(1, 2), c=24, o=9, k=(1, 1)),
        dict(hw=(5, 3), c=16, o=8, k=(1, 1)), dict(hw=(6, 5), c=3, o=5, k=(3, 3)))]
    for wide, narrow in narrowed_layer_schedules(cases, 40, Target(M3, "cortex-m3")):
        assert wide.endswith("_l64") and narrow.endswith("_m8"), (wide, narrow)


def test_budget_reported_and_refused_on_m3(tmp_path):
    model = str(mlperf_model("ad01_int8"))
    r = _cli("compile", model, "-o", str(tmp_path / "a"), "--board", M3, "--flash-budget", "450K")
    assert r.returncode == 0, r.stderr
    assert "flash budget:" in r.stdout and "keep int8 weights" in r.stdout, r.stdout
    assert "lane words" in r.stdout
    r = _cli("compile", model, "-o", str(tmp_path / "b"), "--board", M3, "--flash-budget", "250K")
    assert r.returncode == 2 and "over the flash budget of 256,000 bytes" in r.stderr, r.stderr
    assert r.stderr.count("mcuforge: error:") == 1 and "Traceback" not in r.stderr


def test_mixed_weight_forms_bit_exact_on_m3(tmp_path):
    require_tflm()
    require_tools("arm-none-eabi-gcc", "qemu-system-arm")
    model = mlperf_model("kws_ref_model")
    g = load(model)
    x = np.random.default_rng(5).integers(-128, 128, (2, *g.tensors[g.inputs[0]].shape))
    x = x.astype(np.int8)
    full = model_info(model, board=M3)["weight_bytes"]
    budget = full + CODE_ALLOWANCE - 9_000  # some layers (not all) go back to int8 weights
    r = compile_model(model, tmp_path / "kws", board=M3, flash_budget=budget)
    assert r.weight_bytes + CODE_ALLOWANCE <= budget
    kinds = [c.schedule for c in r.schedules]
    assert any(s.endswith("_m8") for s in kinds) and any(s.endswith("_l64") for s in kinds)
    got = runner.run(model, x, board=M3, flash_budget=budget)
    np.testing.assert_array_equal(got, tflm.run(model.read_bytes(), [x])[0])
