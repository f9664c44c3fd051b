"""int8 accuracy on real images: MLPerf Tiny's float ResNet-8 quantized by mcuforge with the
default options, calibrated on 500 CIFAR-10 training images (../shared/data/cifar10/
calibration.npz, given to the CLI as it is: uint8 `images` beside `labels`), keeps the float
model's top-1 on at least 99% of 500 CIFAR-10 test images (eval.npz), and the C it compiles
gives byte for byte what tflite-micro gives on the --emit-tflite file.

The float reference is LiteRT on the float model (input: raw pixels 0-255 as float32). For
scale: MLCommons' own int8 ResNet-8 agrees with the float model on 97.6% of these images in
tflite-micro (97.2% in LiteRT); the figures of each run are in the assertion messages, and
`mcuforge bench-quant` prints them all (README).
"""
from pathlib import Path

import numpy as np
import pytest
from conftest import mlperf_model

from mcuforge.tools import tflm
from mcuforge.api import load
from mcuforge.cli import main
from mcuforge.runner import build, run_executable

GOAL = 0.99  # top-1 agreement with the float model on eval.npz


@pytest.fixture(scope="module")
def cifar():
    """(float model path, calibration.npz path, eval images uint8 [N, 32, 32, 3], labels,
    float model's output on them [N, 10] from LiteRT)."""
    from ai_edge_litert.interpreter import Interpreter
    model = mlperf_model("pretrainedResnet")
    data = model.parents[2] / "data" / "cifar10"
    if not (data / "eval.npz").is_file():
        pytest.skip(f"{data} not found")
    ev = np.load(data / "eval.npz")
    images, labels = ev["images"], ev["labels"]
    it = Interpreter(model_path=str(model))
    it.allocate_tensors()
    inp, out = it.get_input_details()[0], it.get_output_details()[0]
    ref = []
    for x in images:
        it.set_tensor(inp["index"], x[None].astype(np.float32))
        it.invoke()
        ref.append(it.get_tensor(out["index"]).reshape(-1).copy())
    return model, data / "calibration.npz", images, labels, np.stack(ref)


def compile_and_run(tmp_path: Path, cifar, *options) -> tuple:
    """`mcuforge compile --quantize int8` as a user runs it; the eval images through the
    built C in one process. Returns (int8 outputs [N, 10], the emitted .tflite, int8 inputs)."""
    model, cal, images, _, _ = cifar
    project, emitted = tmp_path / "proj", tmp_path / "q.tflite"
    assert main(["compile", str(model), "-o", str(project), "--name", "model",
                 "--quantize", "int8", "--calibration", str(cal),
                 "--emit-tflite", str(emitted), *options]) == 0
    q = load(emitted)
    qi = q.tensors[q.inputs[0]].quant
    x = np.clip(np.round(images.astype(np.float32) / np.float32(qi.scale[0]))
                + qi.zero_point[0], -128, 127).astype(np.int8)[:, None]
    y = run_executable(build(project, "model"), q, [x])[0]
    return y.reshape(len(images), -1), emitted, x


def report(cifar, y: np.ndarray) -> tuple:
    _, _, _, labels, ref = cifar
    agree = float(np.mean(y.argmax(1) == ref.argmax(1)))
    acc, float_acc = float(np.mean(y.argmax(1) == labels)), float(np.mean(ref.argmax(1) == labels))
    return agree, f"agreement {agree:.1%}, top-1 {acc:.1%} (float {float_acc:.1%})"


@pytest.mark.skipif(not tflm.available(), reason="tflite-micro not installed")
def test_int8_default_keeps_float_top1_and_matches_tflm(tmp_path, cifar):
    y, emitted, x = compile_and_run(tmp_path, cifar)
    agree, text = report(cifar, y)
    assert agree >= GOAL, text
    ref = np.asarray(tflm.run(emitted.read_bytes(), [x])[0]).reshape(y.shape)
    assert ref.dtype == y.dtype == np.int8
    np.testing.assert_array_equal(y, ref)


def test_int16_auto_keeps_float_top1(tmp_path, cifar):
    y, _, _ = compile_and_run(tmp_path, cifar, "--int16-budget", "auto")
    agree, text = report(cifar, y)
    assert agree >= GOAL, text
