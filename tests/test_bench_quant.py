"""`mcuforge bench-quant`: mcuforge's int8 quantization is at least as close to float as
onnxruntime's quantize_static (QDQ, per channel) on the same calibration data, and classifiers
keep their top-1 on at least 99% of the eval inputs."""
import json
from pathlib import Path

import numpy as np
import pytest

# mcuforge first (it imports its `optimizer` package before onnxruntime.quantization can hide it)
from mcuforge.bench_quant import sqnr_db, top1_agreement  # noqa: E402
from mcuforge.cli import main  # noqa: E402

pytest.importorskip("onnxruntime.quantization")

MODELS = Path(__file__).parent / "models"
CASES = ["torch_lenet.onnx", "keras_small_cnn.onnx", "torch_mobile_block.onnx",
         "keras2_small_cnn.onnx", "torch_resblock_evalfold.onnx", "torch_conv_bn_relu.onnx"]


def test_figures():
    ref = np.array([[1.0, 2.0], [3.0, -1.0]])
    assert sqnr_db(ref, ref) == float("inf")
    assert sqnr_db(ref, ref * 1.1) == pytest.approx(20.0)  # noise = 0.1 * signal
    assert top1_agreement(ref, np.array([[0.0, 1.0], [0.0, 1.0]])) == 0.5
    assert top1_agreement(ref[:, :1], ref[:, :1]) is None  # one value per row: no top-1


@pytest.fixture(scope="module")
def rows():
    import contextlib
    import io
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        status = main(["bench-quant", *(str(MODELS / m) for m in CASES),
                       "--calibration", "200", "--eval", "360", "--json"])
    assert status == 0
    return {r["model"]: r for r in json.loads(out.getvalue())}


@pytest.mark.parametrize("model", CASES)
def test_mcuforge_at_least_onnxruntime(rows, model):
    r = rows[model]
    assert not r["errors"], r["errors"]
    assert r["reference_kind"] == "onnxruntime"
    ours, ort = r["mcuforge"], r["reference"]
    assert ours["sqnr_db"] >= ort["sqnr_db"], (model, ours, ort)
    if ours["top1"] is not None:  # a classifier
        assert ours["top1"] >= 0.99, (model, ours, ort)
