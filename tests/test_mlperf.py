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
