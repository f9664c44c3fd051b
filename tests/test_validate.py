"""`mcuforge validate`: the figures it prints are the ones computed here independently (numpy on
the reference runtime's own outputs), an int8 model mcuforge compiles correctly is reported
bit-exact, a deliberately corrupted weight makes `--per-layer` name exactly its layer, and the
float ResNet-8 quantized by mcuforge on CIFAR-10 reports the float model's accuracy as LiteRT
gives it here."""
import contextlib
import dataclasses
import io
import json
from pathlib import Path

import numpy as np
import pytest
from conftest import mlperf_model, require, require_tflm

import mcuforge.api
from mcuforge.cli import main

MODELS = Path(__file__).parent / "models"


def validate(*args) -> tuple:
    """(exit status, stdout, stderr) of `mcuforge validate ...` run in this process."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = main(["validate", *map(str, args)])
    return status, out.getvalue(), err.getvalue()


def litert(model: Path, x: np.ndarray) -> np.ndarray:
    from ai_edge_litert.interpreter import Interpreter
    it = Interpreter(model_path=str(model))
    it.allocate_tensors()
    inp, out = it.get_input_details()[0], it.get_output_details()[0]
    rows = []
    for xi in x:
        it.set_tensor(inp["index"], xi.reshape(inp["shape"]).astype(inp["dtype"]))
        it.invoke()
        rows.append(it.get_tensor(out["index"]).reshape(-1).copy())
    return np.stack(rows)


def cifar(n: int):
    data = mlperf_model("pretrainedResnet").parents[2] / "data" / "cifar10"
    if not (data / "eval.npz").is_file():
        pytest.skip(f"{data} not found")
    ev = np.load(data / "eval.npz")
    return ev["images"][:n], ev["labels"][:n], data / "calibration.npz"


def corrupt_weight(monkeypatch, tensor: str) -> None:
    """Every C project generated from now on has the first weight of the node producing
    `tensor` replaced by a far-off value: one wrong layer, as a lowering bug would make it."""
    original = mcuforge.api.generate_project

    def broken(graph, *args, **kwargs):
        node = next((n for n in graph.nodes if tensor in n.outputs), None)
        if node is not None:
            w = graph.tensors[node.inputs[1]]
            data = w.data.copy()
            flat = data.reshape(-1)
            flat[0] = -127 if flat[0] > 0 else 127
            graph = graph.replace(tensors={**graph.tensors,
                                           w.name: dataclasses.replace(w, data=data)})
        return original(graph, *args, **kwargs)
    monkeypatch.setattr(mcuforge.api, "generate_project", broken)


# ---------------------------------------------------------------------------------------------
# int8 TFLite: bit-exact against tflite-micro


@pytest.fixture(scope="module")
def int8_resnet(tmp_path_factory):
    """(model, inputs .npz, labels .npy, tflite-micro's outputs) on 20 CIFAR-10 images."""
    require_tflm()
    from mcuforge.tools import tflm
    images, labels, _ = cifar(20)
    model = mlperf_model("pretrainedResnet_quant")
    x = (images.astype(np.int16) - 128).astype(np.int8)  # input scale 1, zero point -128
    d = tmp_path_factory.mktemp("val")
    np.savez(d / "x.npz", x=x)
    np.save(d / "y.npy", labels)
    ref = tflm.run(model.read_bytes(), [x[:, None]])[0].reshape(len(x), -1)
    return model, d / "x.npz", d / "y.npy", labels, ref


def test_int8_model_is_bit_exact(int8_resnet):
    model, x, y, labels, ref = int8_resnet
    status, out, _ = validate(model, "--data", x, "--labels", y, "--per-layer", "--json")
    assert status == 0
    r = json.loads(out)
    assert r["reference"] == "tflite-micro" and r["samples"] == 20
    (o,) = r["outputs"]
    assert o["bit_exact"] is True and o["sqnr_db"] == "inf" and o["max_abs_error"] == 0
    assert o["top1_agreement"] == 1.0
    assert o["reference_accuracy"] == pytest.approx(np.mean(ref.argmax(1) == labels))
    assert o["accuracy"] == o["reference_accuracy"]
    p = r["per_layer"]
    assert p["first_divergence"] is None and p["compared"] >= 10, p
    assert "tflite-micro" in p["reference"]
    status, text, _ = validate(model, "--data", x, "--limit", "5")
    assert status == 0 and "bit-exact" in text and "NOT" not in text and "5 samples" in text


def test_per_layer_names_the_corrupted_int8_layer(int8_resnet, monkeypatch):
    from mcuforge.api import load
    model, x, *_ = int8_resnet
    g = load(model)
    convs = [(k, n) for k, n in enumerate(g.nodes) if n.op == "conv2d"]
    k, node = convs[3]  # a conv in the middle of the network
    corrupt_weight(monkeypatch, node.outputs[0])
    status, out, _ = validate(model, "--data", x, "--per-layer", "--json")
    assert status == 0
    r = json.loads(out)
    assert r["outputs"][0]["bit_exact"] is False
    d = r["per_layer"]["first_divergence"]
    assert d is not None
    # the TFLite operator index is the graph's node index here (one node per operator)
    assert (d["node"], d["op"], d["tensor"]) == (k, "CONV_2D", node.outputs[0]), d
    assert (d["mcuforge_node"], d["mcuforge_op"]) == (k, "conv2d")
    import tflite
    sg = tflite.Model.GetRootAsModel(model.read_bytes(), 0).Subgraphs(0)
    t = sg.Operators(k).Outputs(0)  # the name as the file has it, read here independently
    assert d["model_tensor"] == f"{sg.Tensors(t).Name().decode()} (tensor {t})"
    assert d["kind"] == "integer" and d["differing_values"] > 0 and d["first_input"] == 0


# ---------------------------------------------------------------------------------------------
# float ONNX against onnxruntime


@pytest.fixture(scope="module")
def lenet(tmp_path_factory):
    require("onnxruntime")
    import onnxruntime as ort
    model = MODELS / "torch_lenet.onnx"
    x = np.random.default_rng(0).standard_normal((12, 3, 32, 32)).astype(np.float32)
    d = tmp_path_factory.mktemp("val")
    np.savez(d / "x.npz", input=x)
    sess = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    ref = np.stack([sess.run(None, {"input": xi[None]})[0].reshape(-1) for xi in x])
    return model, d / "x.npz", x, ref


def test_float_onnx_figures_are_numpys(lenet):
    from mcuforge.runner import run
    model, npz, x, ref = lenet
    ours = np.asarray(run(model, x[:, None]), np.float64).reshape(ref.shape)
    status, out, _ = validate(model, "--data", npz, "--per-layer", "--json")
    assert status == 0
    r = json.loads(out)
    (o,) = r["outputs"]
    assert r["reference"] == "onnxruntime" and o["bit_exact"] is None
    err = np.abs(ours - ref)
    sqnr = 10 * np.log10(np.sum(ref.astype(np.float64) ** 2) / np.sum(err ** 2))
    assert o["sqnr_db"] == pytest.approx(sqnr, abs=0.01)
    assert o["max_abs_error"] == pytest.approx(err.max(), rel=1e-6)
    assert o["mean_abs_error"] == pytest.approx(err.mean(), rel=1e-6)
    assert o["top1_agreement"] == np.mean(ours.argmax(1) == ref.argmax(1))
    assert r["per_layer"]["first_divergence"] is None


def test_float_tflite_against_litert(tmp_path):
    """A float model compiled float: uint8 pixels in the .npz are taken as the float values
    the model reads (0-255, its README), as LiteRT is given them here."""
    from mcuforge.runner import run
    images, labels, _ = cifar(10)
    model = mlperf_model("pretrainedResnet")
    np.savez(tmp_path / "x.npz", images=images)
    np.save(tmp_path / "y.npy", labels)
    x = images.astype(np.float32)
    ref = litert(model, x).astype(np.float64)
    ours = np.asarray(run(model, x[:, None]), np.float64).reshape(ref.shape)
    status, out, _ = validate(model, "--data", tmp_path / "x.npz", "--labels",
                              tmp_path / "y.npy", "--per-layer", "--json")
    assert status == 0
    r = json.loads(out)
    (o,) = r["outputs"]
    assert r["reference"] == "LiteRT" and o["bit_exact"] is None
    sqnr = 10 * np.log10(np.sum(ref ** 2) / np.sum((ours - ref) ** 2))
    assert o["sqnr_db"] == pytest.approx(sqnr, abs=0.01) and o["sqnr_db"] > 80
    assert o["accuracy"] == np.mean(ours.argmax(1) == labels)
    assert o["reference_accuracy"] == np.mean(ref.argmax(1) == labels)
    assert r["per_layer"]["first_divergence"] is None
    assert "LiteRT" in r["per_layer"]["reference"]


def test_per_layer_names_the_corrupted_float_layer(lenet, monkeypatch):
    from mcuforge.api import load
    import onnx
    model, npz, _, _ = lenet
    onnx_convs = [(k, n) for k, n in enumerate(onnx.load(str(model)).graph.node)
                  if n.op_type == "Conv"]
    k, conv = onnx_convs[1]  # the second convolution, as onnx itself lists them
    ours = [n for n in load(model).nodes if n.op == "conv2d"][1]
    corrupt_weight(monkeypatch, ours.outputs[0])
    status, out, _ = validate(model, "--data", npz, "--per-layer", "--json")
    assert status == 0
    d = json.loads(out)["per_layer"]["first_divergence"]
    assert d is not None, out
    assert (d["node"], d["op"], d["node_name"], d["tensor"]) == \
        (k, "Conv", conv.name, conv.output[0]), d
    assert d["kind"] == "float" and d["relative_error"] > 1e-4


def test_bad_inputs_are_one_clear_error(lenet, tmp_path):
    model = lenet[0]
    np.savez(tmp_path / "shape.npz", input=np.zeros((4, 3, 28, 28), np.float32))
    status, _, err = validate(model, "--data", tmp_path / "shape.npz")
    assert status == 2 and "Traceback" not in err
    assert "input 'input'" in err and "(N, 1, 3, 32, 32) or (N, 3, 32, 32)" in err, err
    np.savez(tmp_path / "name.npz", a=np.zeros((4, 3, 32, 32)), b=np.zeros((4, 3, 32, 32)))
    status, _, err = validate(model, "--data", tmp_path / "name.npz")
    assert status == 2 and "no array for input 'input'" in err, err
    np.save(tmp_path / "y.npy", np.arange(3))
    status, _, err = validate(model, "--data", lenet[1], "--labels", tmp_path / "y.npy")
    assert status == 2 and "3 labels for 12 samples" in err, err
    np.savez(tmp_path / "int.npz", x=np.zeros((2, 32, 32, 3), np.uint8))
    status, _, err = validate(mlperf_model("pretrainedResnet_quant"), "--data",
                              tmp_path / "int.npz")
    assert status == 2 and "takes int8, got uint8" in err and "round(x / 1.0) + -128" in err, err


# ---------------------------------------------------------------------------------------------
# CIFAR-10: the float ResNet-8 quantized by mcuforge


def test_cifar_resnet_quantized_by_mcuforge(tmp_path):
    """50 eval images, calibrated on calibration.npz as compile takes it. For scale, on the
    whole eval set mcuforge's int8 keeps the float top-1 on >= 99% (test_cifar_quant.py)."""
    images, labels, cal = cifar(50)
    model = mlperf_model("pretrainedResnet")
    np.savez(tmp_path / "eval.npz", images=images, labels=labels)  # labels read from the .npz
    ref = litert(model, images.astype(np.float32))
    ref_acc = float(np.mean(ref.argmax(1) == labels))
    status, out, _ = validate(model, "--data", tmp_path / "eval.npz", "--quantize", "int8",
                              "--calibration", cal, "--per-layer", "--json")
    assert status == 0
    r = json.loads(out)
    (o,) = r["outputs"]
    assert r["reference"] == "LiteRT" and "quantized int8 by mcuforge" in r["compiled"]
    assert o["reference_accuracy"] == pytest.approx(ref_acc)
    assert o["top1_agreement"] >= 0.96, o  # at most 2 of 50 images change class
    assert abs(o["accuracy"] - ref_acc) <= 0.04 + 1e-9, o
    assert 20 < o["sqnr_db"] < 60, o  # int8 noise: neither exact nor garbage
    assert r["per_layer"]["first_divergence"] is None, r["per_layer"]  # the int8 C vs TFLM
    noise = {x["tensor"]: x for x in r["per_layer"]["quantization"]}
    assert len(noise) >= 10 and all(x["sqnr_db"] > 10 for x in noise.values()), noise
    # the model's output, dequantized at the edge, is the output compared above
    assert noise["Identity"]["sqnr_db"] == pytest.approx(o["sqnr_db"], abs=1e-9)


def test_help(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    assert "\n  mcuforge validate " in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["validate", "--help"])
    text = capsys.readouterr().out
    for w in ("reference runtime", "--data", "--labels", "--board", "--per-layer", "--limit",
              "--quantize", "--calibration", "--json"):
        assert w in text, w


def test_on_an_emulated_board(int8_resnet, tmp_path):
    """Through the runner's emulated board: the int8 model bit-exact there too; a float model
    quantized by mcuforge (its emitted int8 .tflite compiled for the board) gives the host's
    figures, the int8 C being the same arithmetic."""
    from conftest import require_tools
    require_tools("qemu-system-arm", "arm-none-eabi-gcc")
    model, x, *_ = int8_resnet
    status, out, _ = validate(model, "--data", x, "--limit", "3", "--board", "mps2-an386",
                              "--json")
    assert status == 0
    r = json.loads(out)
    assert r["board"] == "mps2-an386" and r["samples"] == 3 and r["outputs"][0]["bit_exact"]
    status, _, err = validate(model, "--data", x, "--board", "mps2-an386", "--per-layer")
    assert status == 2 and "host only" in err
    images, labels, cal = cifar(3)
    np.savez(tmp_path / "x.npz", images=images)
    figures = []
    for board in ("host", "mps2-an386"):
        status, out, _ = validate(mlperf_model("pretrainedResnet"), "--data", tmp_path / "x.npz",
                                  "--quantize", "int8", "--calibration", cal, "--board", board,
                                  "--json")
        assert status == 0
        figures.append(json.loads(out)["outputs"][0])
    assert figures[0]["sqnr_db"] == figures[1]["sqnr_db"] < 60
    assert figures[0]["max_abs_error"] == figures[1]["max_abs_error"]


def test_two_inputs_by_name(tmp_path):
    """Arrays are matched to the inputs by name, whatever their order in the .npz."""
    require("onnxruntime")
    import onnx
    from onnx import TensorProto, helper
    a = helper.make_tensor_value_info("a", TensorProto.FLOAT, [1, 6])
    b = helper.make_tensor_value_info("b", TensorProto.FLOAT, [1, 6])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 6])
    g = helper.make_graph([helper.make_node("Sub", ["a", "b"], ["d"]),
                           helper.make_node("Mul", ["d", "a"], ["y"])], "g", [a, b], [y])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8
    onnx.save(m, tmp_path / "two.onnx")
    rng = np.random.default_rng(1)
    xa, xb = rng.standard_normal((2, 5, 6)).astype(np.float32)
    np.savez(tmp_path / "x.npz", b=xb, a=xa)  # b first: the names decide
    status, out, _ = validate(tmp_path / "two.onnx", "--data", tmp_path / "x.npz", "--per-layer",
                              "--json")
    assert status == 0
    r = json.loads(out)
    (o,) = r["outputs"]
    assert o["max_abs_error"] <= 1e-6 * np.abs((xa - xb) * xa).max(), o  # not (b - a) * b
    assert o["top1_agreement"] is None  # as many values as its first input: no class
    assert r["per_layer"]["compared"] == 2 and r["per_layer"]["first_divergence"] is None
    np.savez(tmp_path / "bad.npz", a=xa, c=xb)
    status, _, err = validate(tmp_path / "two.onnx", "--data", tmp_path / "bad.npz")
    assert status == 2 and "no array for input 'b'" in err and "['a', 'c']" in err, err
