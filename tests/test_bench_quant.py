"""`mcuforge bench-quant`: mcuforge's int8 quantization is at least as close to float as
onnxruntime's quantize_static (QDQ, per channel) on the same calibration data, and classifiers
keep their top-1 on at least 99% of the eval inputs. For the float MLPerf Tiny TFLite models
the table has all three columns: mcuforge, onnxruntime (on the model's ONNX export) and
MLCommons' int8 model."""
import json
from pathlib import Path

import numpy as np
import pytest

# mcuforge first (it imports its `optimizer` package before onnxruntime.quantization can hide it)
from conftest import in_ci, mlperf_model, require  # noqa: E402
from mcuforge.tools.bench_quant import (bench_model, format_table, sqnr_db,  # noqa: E402
                                  top1_agreement)
from mcuforge.cli import main  # noqa: E402

require("onnxruntime.quantization")

MODELS = Path(__file__).parent / "models"
MLPERF = ["ad01_fp32", "kws_ref_model_float32", "pretrainedResnet", "vww_96_float"]
CASES = ["torch_lenet.onnx", "keras_small_cnn.onnx", "torch_mobile_block.onnx",
         "keras2_small_cnn.onnx", "torch_resblock_evalfold.onnx", "torch_conv_bn_relu.onnx"]


def test_figures():
    ref = np.array([[1.0, 2.0], [3.0, -1.0]])
    assert sqnr_db(ref, ref) == float("inf")
    assert sqnr_db(ref, ref * 1.1) == pytest.approx(20.0)  # noise = 0.1 * signal
    assert top1_agreement(ref, np.array([[0.0, 1.0], [0.0, 1.0]])) == 0.5
    assert top1_agreement(ref[:, :1], ref[:, :1]) is None  # one value per row: no top-1


def test_classifier_means_classes_not_reconstructions():
    from mcuforge.api import load
    from mcuforge.tools.bench_quant import is_classifier
    assert not is_classifier(load(mlperf_model("ad01_fp32")))  # autoencoder: 640 in, 640 out
    assert is_classifier(load(mlperf_model("kws_ref_model_float32")))
    assert is_classifier(load(MODELS / "torch_lenet.onnx"))


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
    assert r["onnxruntime_on"] == "model" and r["mlcommons"] is None
    ours, ort = r["mcuforge"], r["onnxruntime"]
    assert ours["sqnr_db"] >= ort["sqnr_db"], (model, ours, ort)
    if ours["top1"] is not None:  # a classifier
        assert ours["top1"] >= 0.99, (model, ours, ort)


@pytest.mark.parametrize("stem", MLPERF)
def test_mlperf_tflite_has_all_three_columns(stem):
    """Small sets keep it fast; the figures only need to be real: an ONNX export that computed
    something else would put onnxruntime's SQNR near or below 0 dB."""
    from mcuforge.tools import tflm
    r = bench_model(mlperf_model(stem), n_cal=16, n_eval=16)
    assert not r["errors"], r["errors"]
    assert r["onnxruntime_on"] == "onnx_writer export"
    assert r["mcuforge"]["sqnr_db"] > 15 and r["onnxruntime"]["sqnr_db"] > 15, r
    if tflm.available() or in_ci():
        assert r["mlcommons_model"] is not None and r["mlcommons"] is not None
    table = format_table([r])
    for col in ("mcuforge SQNR dB", "onnxruntime SQNR dB", "mlcommons SQNR dB"):
        assert col in table
    assert f"{r['onnxruntime']['sqnr_db']:.2f}" in table.splitlines()[2]


def test_format_table_columns():
    row = {"model": "m.tflite", "calibration": 4, "eval": 8, "errors": {"mlcommons": "boom"},
           "mcuforge": {"sqnr_db": 30.0, "top1": 0.5}, "onnxruntime": {"sqnr_db": 25.125,
                                                                      "top1": None},
           "onnxruntime_on": "onnx_writer export", "mlcommons": None, "mlcommons_model": None}
    lines = format_table([row]).splitlines()
    assert lines[0].split() == ["model", "cal/eval", "mcuforge", "SQNR", "dB", "top-1",
                                "onnxruntime", "SQNR", "dB", "top-1", "mlcommons", "SQNR", "dB",
                                "top-1"]
    assert lines[2].split() == ["m.tflite", "4/8", "30.00", "50.0%", "25.12", "-", "-", "-"]
    assert lines[-1] == "m.tflite: mlcommons: boom"


def test_failing_model_keeps_the_others(tmp_path, capsys):
    """A missing and a broken model each get a row with their error; the good model's figures
    stay, and the exit status says something failed. Without data: a warning (random inputs)."""
    broken = tmp_path / "broken.onnx"
    broken.write_bytes(b"not a model")
    good = MODELS / "torch_lenet.onnx"
    status = main(["bench-quant", str(tmp_path / "missing.tflite"), str(good), str(broken),
                   "--calibration", "16", "--eval", "16"])
    out = capsys.readouterr().out
    assert status == 1
    lines = out.splitlines()
    assert lines[2].split()[:3] == ["missing.tflite", "-", "-"]
    assert lines[3].split()[0] == "torch_lenet.onnx" and lines[3].split()[2] != "-"
    assert lines[4].split()[:3] == ["broken.onnx", "-", "-"]
    assert any(x.startswith("missing.tflite: model: ") and "does not exist" in x for x in lines)
    assert any(x.startswith("broken.onnx: model: ") for x in lines)
    assert any(x.startswith("warning: torch_lenet.onnx: no calibration / eval data given")
               for x in lines)


def test_user_data_with_labels(tmp_path, capsys):
    """The user's calibration and eval sets (an .npz with `images` and `labels`): no random-input
    warning, and the accuracy against the labels of the float model, mcuforge and MLCommons'
    int8 model, each checked against argmax computed here from LiteRT / tflite-micro."""
    from ai_edge_litert.interpreter import Interpreter
    model = mlperf_model("pretrainedResnet")
    data = model.parents[2] / "data" / "cifar10"
    if not (data / "eval.npz").is_file():
        pytest.skip(f"{data} not found")
    ev = np.load(data / "eval.npz")
    images, labels = ev["images"][:24], ev["labels"][:24]
    cal = np.load(data / "calibration.npz")["images"][:24]
    np.savez(tmp_path / "cal.npz", images=cal)
    np.savez(tmp_path / "eval.npz", images=images, labels=labels)
    status = main(["bench-quant", str(model), "--calibration", str(tmp_path / "cal.npz"),
                   "--eval", str(tmp_path / "eval.npz"), "--json"])
    captured = capsys.readouterr()
    assert status == 0 and "warning" not in captured.err
    r = json.loads(captured.out)[0]
    assert not r["errors"] and r["labels"] and not r["random_inputs"]
    assert (r["calibration"], r["eval"]) == (24, 24)
    it = Interpreter(model_path=str(model))
    it.allocate_tensors()
    inp, outp = it.get_input_details()[0], it.get_output_details()[0]
    top = []
    for x in images:
        it.set_tensor(inp["index"], x[None].astype(np.float32))  # raw pixels 0-255
        it.invoke()
        top.append(int(it.get_tensor(outp["index"]).argmax()))
    assert r["float"]["accuracy"] == pytest.approx(np.mean(np.array(top) == labels))
    for col in ("mcuforge", "onnxruntime", "mlcommons"):
        acc, agree = r[col]["accuracy"], r[col]["top1"]
        # accuracy and agreement of one model on the same rows: they differ by at most
        # the rows where it disagrees with float
        assert abs(acc - r["float"]["accuracy"]) <= 1 - agree + 1e-9, (col, r[col])
    from mcuforge.tools import tflm
    if tflm.available():  # MLCommons' int8 model: input pixel - 128 (scale 1, zero point -128)
        y = tflm.run((model.parent / "pretrainedResnet_quant.tflite").read_bytes(),
                     [(images.astype(np.int16) - 128).astype(np.int8)[:, None]])[0]
        ml = np.asarray(y).reshape(len(images), -1).argmax(1)
        assert r["mlcommons"]["accuracy"] == pytest.approx(np.mean(ml == labels))


def test_data_for_one_set_only_is_one_error(tmp_path, capsys):
    np.save(tmp_path / "cal.npy", np.zeros((2, 1, 28, 28), np.float32))
    status = main(["bench-quant", str(MODELS / "torch_lenet.onnx"),
                   "--calibration", str(tmp_path / "cal.npy")])
    err = capsys.readouterr().err
    assert status == 2 and err.count("mcuforge: error:") == 1 and "--eval DATA" in err
