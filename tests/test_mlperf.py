"""The five MLPerf Tiny int8 models: 50 random inputs each through `mcuforge run`, every output
byte equal to tflite-micro's; the same under AddressSanitizer and UBSan; valid arena plans."""
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import MLPERF_INT8, mlperf_model
from mcuforge import runner
from mcuforge.tools import tflm
from mcuforge.api import load
from mcuforge.optimizer.memory_plan import overlaps, plan_graph
from mcuforge.optimizer.pipeline import optimize

N_INPUTS = 50


def random_batch(path: Path, n: int, seed: int) -> np.ndarray:
    g = load(path)
    t = g.tensors[g.inputs[0]]
    info = np.iinfo(t.dtype)
    rng = np.random.default_rng(seed)
    return rng.integers(info.min, info.max + 1, size=(n, *t.shape)).astype(t.dtype)


def assert_equal_to_tflm(path: Path, x: np.ndarray, y: np.ndarray):
    ref = tflm.run(path.read_bytes(), [x])[0]
    assert y.shape == ref.shape and y.dtype == ref.dtype
    bad = np.argwhere(y != ref)
    assert bad.size == 0, f"{len(bad)} of {y.size} output bytes differ, first at {bad[0]}"
    assert len(np.unique(ref.reshape(len(ref), -1), axis=0)) > 1  # inputs make a difference


@pytest.mark.parametrize("stem", MLPERF_INT8)
def test_mcuforge_run_is_bit_exact_with_tflm(stem, tmp_path):
    path = mlperf_model(stem)
    x = random_batch(path, N_INPUTS, seed=1234)
    np.save(tmp_path / "in.npy", x)
    cli = [sys.executable, "-m", "mcuforge.cli", "run", str(path), "--input",
           str(tmp_path / "in.npy"), "--output", str(tmp_path / "out.npy")]
    subprocess.run(cli, check=True, capture_output=True)
    assert_equal_to_tflm(path, x, np.load(tmp_path / "out.npy"))


@pytest.mark.parametrize("stem", MLPERF_INT8)
def test_bit_exact_under_sanitizers(stem):
    path = mlperf_model(stem)
    x = random_batch(path, N_INPUTS, seed=99)
    assert_equal_to_tflm(path, x, runner.run(path, x, sanitize=True))


@pytest.mark.parametrize("stem", MLPERF_INT8)
def test_arena_plan_has_no_overlaps(stem):
    g = optimize(load(mlperf_model(stem)))
    plan = plan_graph(g)
    assert overlaps(plan.requests, plan.offsets) == []
    assert plan.lower_bound <= plan.arena_size
    sizes = {t: g.tensors[t].nbytes for t in plan.offsets}
    assert all(plan.offsets[t] + sizes[t] <= plan.arena_size for t in plan.offsets)


@pytest.mark.parametrize("stem", MLPERF_INT8)
def test_keep_input_is_bit_exact_and_keeps_the_input(stem):
    """--keep-input: the same outputs, with a plan where nothing overlaps the input."""
    from mcuforge.codegen_c.model import generate
    path = mlperf_model(stem)
    x = random_batch(path, 8, seed=5)
    assert_equal_to_tflm(path, x, runner.run(path, x, keep_input=True))
    g = optimize(load(path))
    plan = generate(g, "m", keep_input=True).plan
    t = g.inputs[0]
    lo, hi = plan.offsets[t], plan.offsets[t] + g.tensors[t].nbytes
    assert all(plan.offsets[r.name] >= hi or plan.offsets[r.name] + r.size <= lo
               for r in plan.requests if r.name != t)


@pytest.mark.parametrize("stem", ["kws_ref_model", "str_ww_ref_model", "pretrainedResnet_quant"])
def test_in_place_bit_exact_on_the_m4(stem):
    """In place (the default) on QEMU mps2-an386: the DSP kernels written over their inputs."""
    from conftest import require_tools
    require_tools("arm-none-eabi-gcc", "qemu-system-arm")
    path = mlperf_model(stem)
    x = random_batch(path, 4, seed=11)
    assert_equal_to_tflm(path, x, runner.run(path, x, board="mps2-an386"))


IN_PLACE_BOARDS = {"mps3-an547": "qemu-system-arm", "mps2-an385": "qemu-system-arm",
                   "riscv32-virt": "qemu-system-riscv32"}


@pytest.mark.parametrize("board", list(IN_PLACE_BOARDS))
@pytest.mark.parametrize("stem", MLPERF_INT8)
def test_in_place_bit_exact_on_the_board(stem, board):
    """In place on the Helium (M55) and scalar (M3, RV32) kernels, on QEMU: the plan links
    their outputs over their inputs, and the outputs are tflite-micro's (one input over the
    full range, one near the zero point, whose outputs stay sensitive to every layer)."""
    from conftest import require_tools
    from mcuforge.board import load_board
    from mcuforge.codegen_c.model import generate
    require_tools(IN_PLACE_BOARDS[board])
    path = mlperf_model(stem)
    g = optimize(load(path))
    gen = generate(g, "m", load_board(board).target(None))
    ours = {gen.graph.nodes[i].outputs[0] for i in gen.declared
            if gen.kernels and any(k.name.startswith(f"l{i:02d}_") and k.schedule.startswith(
                ("mf_mve_", "mf_sc_")) for k in gen.kernels)}
    if stem != "ad01_int8":  # (AD's links do not pay on the M3: its plan keeps none)
        assert set(gen.plan.in_place) & ours, "no Helium / scalar kernel planned in place"
    t = g.tensors[g.inputs[0]]
    zp = int(t.quant.zero_point[0])
    rng = np.random.default_rng(21)
    x = np.stack([rng.integers(-128, 128, size=t.shape),
                  np.clip(zp + rng.integers(-25, 26, size=t.shape), -128, 127)]).astype(t.dtype)
    assert_equal_to_tflm(path, x, runner.run(path, x, board=board))
    # and with the input kept (--keep-input): the same outputs, a plan that never writes it
    kept = generate(g, "m", load_board(board).target(None), keep_input=True).plan
    lo, hi = kept.offsets[g.inputs[0]], kept.offsets[g.inputs[0]] + t.nbytes
    assert not any(x_ == g.inputs[0] for x_, _ in kept.in_place.values())
    assert all(kept.offsets[r.name] >= hi or kept.offsets[r.name] + r.size <= lo
               for r in kept.requests if r.name != g.inputs[0])
    assert_equal_to_tflm(path, x, runner.run(path, x, board=board, keep_input=True))
