"""The real-data demo (`mcuforge demo`): a CNN trained on scikit-learn's 8x8 digits,
compiled to C as float and int8, run on the 360 held-out images."""
import importlib.util
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest

from mcuforge.tools import digits_demo
from conftest import unavailable

TRAIN_SCRIPT = Path(__file__).parent / "models" / "train_digits.py"


@pytest.fixture(scope="module")
def result(tmp_path_factory):
    return digits_demo.evaluate(tmp_path_factory.mktemp("digits"), log=lambda line: None)


def test_float_c_is_accurate_and_matches_onnxruntime(result):
    assert result.images == 360
    assert result.float_accuracy >= 0.95
    assert result.ort_agreement == 1.0  # the same digit as onnxruntime on every image
    assert result.float_accuracy == result.ort_accuracy


def test_int8_within_one_point_of_float(result):
    if not digits_demo.quantizer_available():
        unavailable("mcuforge's quantizer (optimizer.quantize) is not in this tree")
    assert result.int8_accuracy >= result.float_accuracy - 0.01
    assert result.tflm_equal  # the int8 C logits equal tflite-micro's on every image
    # int8 weights, int32 bias: < 1/3 of float's on a microcontroller; the host build keeps its
    # GEMM weights as int16 (runtime_c/mcuforge_vec.h, 2x faster there than int8), still < 2/3
    assert result.int8_weight_bytes < result.float_weight_bytes / 1.5
    assert result.int8_arena_bytes < result.float_arena_bytes
    assert digits_demo.verdict(result)[0] == 0


def test_verdict_fails_on_a_large_int8_drop(result):
    worse = digits_demo.DigitsResult(**{**vars(result), "int8_accuracy": 0.90})
    status, line = digits_demo.verdict(worse)
    assert status == 1 and line.startswith("FAIL")
    differs = digits_demo.DigitsResult(**{**vars(result), "int8_accuracy": 1.0,
                                          "tflm_equal": False})
    assert digits_demo.verdict(differs)[0] == 1


def test_demo_digits_command(tmp_path):
    r = subprocess.run([sys.executable, "-m", "mcuforge.cli", "demo",
                        "-o", str(tmp_path / "d")], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "PASS" in r.stdout.splitlines()[-1]
    assert (tmp_path / "d" / "float" / "digits").is_file()


def test_committed_model_is_small_and_plain():
    model = onnx.load(str(digits_demo.MODEL))
    assert digits_demo.MODEL.stat().st_size < 100_000
    assert [n.op_type for n in model.graph.node] == ["Conv", "Relu", "Conv", "Relu", "Flatten",
                                                     "Gemm"]


def test_training_is_deterministic():
    """Two short runs of the training script's code give the same ONNX bytes (the committed
    model is a full run; its bytes may depend on the machine's BLAS, so they are not compared)."""
    spec = importlib.util.spec_from_file_location("train_digits", TRAIN_SCRIPT)
    train = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(train)
    x, y, _, _ = digits_demo.digits_data()
    x = x[:256].astype(np.float64)
    runs = [train.to_onnx(train.train(x, y[:256], epochs=2)).SerializeToString()
            for _ in range(2)]
    assert runs[0] == runs[1]
