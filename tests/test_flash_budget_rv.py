"""Flash as a budget (--flash-budget) on RV32 (riscv32-virt): kernels/rv.py's "p16" kernels keep
two channels' weights in one int32 word (over 2x the int8 bytes: VWW 505,978 bytes of constants
against 219,072 of int8 weights); under a budget the compiler gives layers int8 weights
(scalar.py's "m8", batch-1 fully connected layers gemm.py's mf_gemm_w8) until the model fits,
the layer costing the fewest extra instructions per byte saved first, says so, refuses a budget
it cannot meet, and stays bit-exact with tflite-micro (tests/test_flash_budget_m3.py does the
same for the Cortex-M3's lane words)."""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from test_flash_budget import _cli, narrowed_layer_schedules
from conftest import mlperf_model, require_tflm, require_tools
from mcuforge.api import compile as compile_model, load
from mcuforge.board import load_board
from mcuforge.codegen_c.kernels.budget import CODE_ALLOWANCE, P16
from mcuforge.tools import tflm
from mcuforge.tools.info import model_info

RV = "riscv32-virt"
NARROW = ("mf_sc_gemm_m8", "mf_sc_conv_m8", "mf_gemm_w8")


def int8_weight_bytes(model) -> int:
    """The model's int8 weights in bytes, counted from the graph (not from mcuforge's build)."""
    g = load(model)
    return sum(t.data.nbytes for t in g.tensors.values() if t.is_const and t.dtype == "int8")


def rv_target(**kw):
    return replace(load_board(RV).target(), **kw)


def test_budget_narrows_p16_just_enough(tmp_path):
    """VWW and KWS fit each budget they can, the constants shrinking as the budget does, never
    narrower than needed (within the largest single layer's saving), and the layers reported:
    some narrowed to int8 kernels, the others still p16."""
    # (the p16 records are 28 bytes a channel: below 320,000 VWW keeps no p16 layer)
    for stem, budgets in (("vww_96_int8", (384_000, 330_000)),
                          ("kws_ref_model", (75_000, 67_000))):
        model = mlperf_model(stem)
        w8 = int8_weight_bytes(model)
        full = model_info(model, board=RV)["weight_bytes"]
        assert full > 2 * w8  # p16 words: two channels a 4-byte word, plus the chunk words
        g = load(model)
        # the largest layer's int8 weights: what narrowing one layer saves, about
        most = max(t.data.nbytes for t in g.tensors.values()
                   if t.is_const and t.dtype == "int8")
        previous = full
        for budget in (full + CODE_ALLOWANCE, *budgets):
            r = compile_model(model, tmp_path / f"{stem}_{budget}", board=RV, flash_budget=budget)
            assert r.weight_bytes + CODE_ALLOWANCE <= budget, (stem, budget)
            assert r.weight_bytes <= previous
            assert r.weight_bytes + CODE_ALLOWANCE > budget - 2 * most - 4096, (stem, budget)
            kinds = [c.schedule for c in r.schedules]
            if budget == full + CODE_ALLOWANCE:
                assert not any(s in NARROW for s in kinds), kinds
            else:
                assert any(s in NARROW for s in kinds) and any(s in P16 for s in kinds), kinds
            previous = r.weight_bytes


def test_narrows_fewest_instructions_per_byte_first():
    """Two 1x1 layers, the same weights: the one over fewer pixels (fewer extra instructions
    for the bytes it saves) goes to int8 weights alone when that is enough; its m8 weights are
    ceil(O/4) * 4 * K int8 bytes, saving at least half the p16 words (fit's estimate)."""
    from mcuforge.codegen_c.kernels import budget, lower_node
    from mcuforge.frontend.tflite import load_tflite
    from test_sched_layers import layer_model
    rv = rv_target()
    few, _ = layer_model(1, "CONV_2D", hw=(1, 3), c=64, o=64, k=(1, 1), act="relu", y_zp=-128)
    many, _ = layer_model(2, "CONV_2D", hw=(8, 8), c=64, o=64, k=(1, 1), act="relu", y_zp=-128)
    lowered = {}
    for name, model in (("few", few), ("many", many)):
        g = load_tflite(model)
        lowered[name] = lower_node(g.nodes[0], g, name, rv)
        assert lowered[name].schedule == "mf_rv_gemm_p16"
    p16_bytes = [next(b.data.nbytes for b in k.consts if b.name == "w") for k in lowered.values()]
    full = budget.flash_bytes(lowered.values())
    got = budget.fit(replace(rv, flash_budget=full - 100), lowered)
    assert got.narrow_weights == frozenset({"few"})
    g = load_tflite(few)
    k = lower_node(g.nodes[0], g, "few", replace(rv, narrow_weights=frozenset(g.nodes[0].outputs)))
    assert k.schedule == "mf_sc_gemm_m8"
    w = next(b for b in k.consts if b.name == "w")
    assert w.dtype == "int8" and w.data.nbytes == 64 * 64
    saved = full - budget.flash_bytes([k, lowered["many"]])
    assert saved >= p16_bytes[0] // 2
    # both when one is not enough
    got = budget.fit(replace(rv, flash_budget=full - saved - 1), lowered)
    assert got.narrow_weights == frozenset({"few", "many"})


def test_narrowed_layers_equal_the_reference():
    """A layer the budget narrows leaves p16 on RV32 (one, two and more rows, a convolution
    through im2col), its outputs those of the reference kernel (loop-IR evaluator)."""
    cases = [("FULLY_CONNECTED", dict(c=40, o=6)), ("FULLY_CONNECTED", dict(c=24, o=9, batch=2)),
             ("CONV_2D", dict(hw=(5, 3), c=16, o=8, k=(1, 1))),
             ("CONV_2D", dict(hw=(6, 5), c=3, o=5, k=(3, 3)))]
    for (wide, narrow), (_, kw) in zip(narrowed_layer_schedules(cases, 60, rv_target()), cases):
        assert wide in P16 and narrow in NARROW, (kw, wide, narrow)


def test_budget_reported_and_refused_on_rv(tmp_path):
    model = str(mlperf_model("vww_96_int8"))
    r = _cli("compile", model, "-o", str(tmp_path / "a"), "--board", RV,
             "--flash-budget", "384000")
    assert r.returncode == 0, r.stderr
    assert "flash budget:" in r.stdout and "keep int8 weights" in r.stdout, r.stdout
    assert "p16 words" in r.stdout
    # VWW's int8 weights (219,072 bytes), their records and the depthwise tables: over 256 KB
    r = _cli("compile", model, "-o", str(tmp_path / "b"), "--board", RV, "--flash-budget", "256K")
    assert r.returncode == 2 and "over the flash budget of 262,144 bytes" in r.stderr, r.stderr
    assert r.stderr.count("mcuforge: error:") == 1 and "Traceback" not in r.stderr


def _layers(model, budget):
    """Per kernel name: (schedule, bytes of constants) as built for RV under `budget`."""
    from mcuforge.codegen_c.model import generate
    gen = generate(load(model), "model", load_board(RV).target(budget))
    return {k.name: (k.schedule, sum(b.data.nbytes for b in k.consts)) for k in gen.kernels}


def test_vww_under_budgets_bit_exact_in_measured_order():
    """VWW on QEMU at its default build and under 384,000 and 320,000 bytes: bit-exact with
    tflite-micro; the layers narrowed at 384,000 are the cheapest in instructions (measured per
    layer) per byte saved: none costs more than 1.5x any p16 layer it kept (the estimate is one
    cost per MAC; layers of one shape measure within 1.4x of each other)."""
    require_tflm()
    require_tools("riscv64-unknown-elf-gcc", "qemu-system-riscv32")
    from mcuforge.target import run_on_board
    model = mlperf_model("vww_96_int8")
    g = load(model)
    x = np.random.default_rng(7).integers(-128, 128, (1, *g.tensors[g.inputs[0]].shape))
    x = x.astype(np.int8)
    want = tflm.run(model.read_bytes(), [x])[0]
    runs, layers = {}, {}
    for budget in (None, 384_000, 320_000):
        run = run_on_board(model, [x], RV, flash_budget=budget, profile=True)
        np.testing.assert_array_equal(run.outputs[0], want, err_msg=str(budget))
        runs[budget] = dict(zip(run.profile.names, run.profile.ticks[0]))  # ticks = instructions
        layers[budget] = _layers(model, budget)
    cost = {}  # layer -> measured extra instructions per byte saved
    for name, (s, nbytes) in layers[320_000].items():
        if s in NARROW and layers[None][name][0] in P16:
            cost[name] = (runs[320_000][name] - runs[None][name]) / (layers[None][name][1] - nbytes)
    narrowed = [n for n, (s, _) in layers[384_000].items() if s in NARROW]
    kept = [n for n, (s, _) in layers[384_000].items() if s in P16 and n in cost]
    assert narrowed and kept and set(narrowed) <= set(cost)
    assert max(cost[n] for n in narrowed) <= 1.5 * min(cost[n] for n in kept), cost


def test_kws_mixed_weight_forms_bit_exact_on_rv(tmp_path):
    require_tflm()
    require_tools("riscv64-unknown-elf-gcc", "qemu-system-riscv32")
    from mcuforge import runner
    model = mlperf_model("kws_ref_model")
    g = load(model)
    x = np.random.default_rng(5).integers(-128, 128, (1, *g.tensors[g.inputs[0]].shape))
    x = x.astype(np.int8)
    budget = 75_000
    r = compile_model(model, tmp_path / "kws", board=RV, flash_budget=budget)
    assert r.weight_bytes + CODE_ALLOWANCE <= budget
    kinds = [c.schedule for c in r.schedules]
    assert any(s in NARROW for s in kinds) and any(s in P16 for s in kinds)
    got = runner.run(model, x, board=RV, flash_budget=budget)
    np.testing.assert_array_equal(got, tflm.run(model.read_bytes(), [x])[0])


def two_fc(seed: int, k: int = 5):
    """Two batch-1 int8 FULLY_CONNECTED layers k -> k -> k (tests/tfl_build.py)."""
    from tfl_build import Model
    rng = np.random.default_rng(seed)
    m = Model()
    scales = [0.03, 0.05, 0.04]
    xs = [m.tensor(f"t{i}", (1, k), "int8", scale=s, zero_point=int(rng.integers(-20, 20)))
          for i, s in enumerate(scales)]
    for i in range(2):
        sw = rng.uniform(0.002, 0.02, k)
        w = m.tensor(f"w{i}", (k, k), "int8", rng.integers(-127, 128, (k, k)), scale=sw,
                     zero_point=np.zeros(k, int), axis=0)
        b = m.tensor(f"b{i}", (k,), "int32", rng.integers(-3000, 3000, k), scale=scales[i] * sw,
                     zero_point=np.zeros(k, int))
        m.op("FULLY_CONNECTED", [xs[i], w, b], [xs[i + 1]], "FullyConnectedOptions",
             FusedActivationFunction=1)
    m.io([xs[0]], [xs[2]])
    return m.build()


def test_fits_again_when_the_estimate_falls_short():
    """A batch-1 fully connected layer with K = 5 narrows to gemm.py's mf_gemm_w8, whose taps
    padded to 8 save less than fit's estimate (half the p16 words): a budget met by that
    estimate of one layer alone takes a second layer, not a model over the budget."""
    from mcuforge.codegen_c.model import generate
    from mcuforge.frontend.tflite import load_tflite
    g = load_tflite(two_fc(3))
    full = generate(g, "m", rv_target())
    assert [c.schedule for c in full.schedules] == ["mf_rv_fc_p16"] * 2
    # fit's estimate: half the p16 words and the records' bytes beyond mf_gemm_w8's 20 a
    # channel (mf_rv_rec: 28)
    estimates = [next(b.data.nbytes for b in k.consts if b.name == "w") // 2
                 + next(b.data.nbytes for b in k.consts if b.name == "rq") * 8 // 28
                 for k in full.kernels if k.schedule]
    limit = full.weight_bytes + CODE_ALLOWANCE - min(estimates)
    got = generate(g, "m", rv_target(flash_budget=limit))
    assert got.weight_bytes + CODE_ALLOWANCE <= limit
    assert [c.schedule for c in got.schedules] == ["mf_gemm_w8"] * 2
