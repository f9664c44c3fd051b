"""mcuforge's own int8 post-training quantizer (optimizer/quantize.py).

The key property: the int8 graph mcuforge compiles, written with --emit-tflite, gives in
tflite-micro exactly the bytes the generated C gives. Accuracy is measured as the SQNR of the
dequantized int8 output against the float model on held-out inputs, printed beside the SQNR
of MLCommons' own int8 model on the same inputs.
"""
from pathlib import Path

import numpy as np
import pytest
from conftest import mlperf_model

from frontend.tflite_writer import write_tflite
from mcuforge import tflm
from mcuforge.api import load
from mcuforge.cli import main
from mcuforge.errors import McuforgeError
from mcuforge.graph import Graph, Node, Tensor
from optimizer.calibrate import run_graph
from optimizer.pipeline import optimize
from optimizer.quantize import quantize_for_compile, quantize_graph

pytestmark = pytest.mark.skipif(not tflm.available(), reason="tflite-micro not installed")
MODELS = Path(__file__).parent / "models"
N_CAL, N_TEST = 50, 20
# float model -> (MLCommons' int8 model, SQNR floor in dB). Measured with the default method
# on these inputs: ad01 36.1, kws 23.0, resnet 18.6, vww 56.6 (MLCommons' int8: 21.2, -1.3,
# 19.6, 30.9; their kws int8 model does not come from the same float weights).
MLPERF = {
    "ad01_fp32": ("ad01_int8", 30.0),
    "kws_ref_model_float32": ("kws_ref_model", 18.0),
    "pretrainedResnet": ("pretrainedResnet_quant", 15.0),
    "vww_96_float": ("vww_96_int8", 40.0),
}


def sqnr(ref: np.ndarray, got: np.ndarray) -> float:
    ref, got = ref.astype(np.float64), got.astype(np.float64)
    return float(10 * np.log10(np.sum(ref ** 2) / max(np.sum((ref - got) ** 2), 1e-30)))


def quantize_input(x: np.ndarray, q) -> np.ndarray:
    return np.clip(np.round(x / q.scale[0]) + q.zero_point[0], -128, 127).astype(np.int8)


def dequantize(y: np.ndarray, q) -> np.ndarray:
    return (y.astype(np.float32) - q.zero_point[0]) * np.float32(q.scale[0])


def int8_input_range(path: Path) -> tuple:
    """The real input range MLCommons' int8 model quantizes to: the data's range."""
    g = load(path)
    q = g.tensors[g.inputs[0]].quant
    return q.scale[0] * (-128 - q.zero_point[0]), q.scale[0] * (127 - q.zero_point[0])


def data(g: Graph, lo: float, hi: float, seed: int) -> tuple:
    """(calibration batch, held-out batch), uniform over the data range."""
    rng = np.random.default_rng(seed)
    shape = (N_CAL + N_TEST,) + tuple(g.tensors[g.inputs[0]].shape)
    x = rng.uniform(lo, hi, size=shape).astype(np.float32)
    return x[:N_CAL], x[N_CAL:]


def check_bit_exact(qg: Graph, tflite: bytes, x_int8: np.ndarray) -> np.ndarray:
    """The generated C of `qg` and TFLM on the emitted file agree byte for byte."""
    c_out = run_graph(qg, [x_int8])[0]
    ref = tflm.run(tflite, [x_int8])[0]
    assert c_out.dtype == ref.dtype == np.int8
    np.testing.assert_array_equal(c_out, ref.reshape(c_out.shape))
    return c_out


@pytest.mark.parametrize("stem", sorted(MLPERF))
def test_mlperf_float_models(stem, tmp_path, capsys):
    int8_stem, floor = MLPERF[stem]
    int8_path = mlperf_model(int8_stem)
    g = optimize(load(mlperf_model(stem)))
    cal, test = data(g, *int8_input_range(int8_path), seed=1)
    emitted = tmp_path / "q.tflite"
    qg = quantize_for_compile(g, "int8", cal, emit_tflite=emitted)
    iq, oq = qg.tensors[qg.inputs[0]].quant, qg.tensors[qg.outputs[0]].quant
    c_out = check_bit_exact(qg, emitted.read_bytes(), quantize_input(test, iq))

    f_out = run_graph(g, [test])[0]
    ours = sqnr(f_out, dequantize(c_out, oq))
    theirs_g = load(int8_path)
    tq, toq = theirs_g.tensors[theirs_g.inputs[0]].quant, theirs_g.tensors[theirs_g.outputs[0]].quant
    theirs = tflm.run(int8_path.read_bytes(), [quantize_input(test, tq)])[0]
    theirs = sqnr(f_out, dequantize(theirs, toq).reshape(f_out.shape))
    with capsys.disabled():
        print(f"\n{stem}: SQNR mcuforge int8 {ours:.1f} dB, MLCommons {int8_stem} {theirs:.1f} dB")
    assert ours > floor


def _strip_input_transposes(qg: Graph) -> tuple:
    """The int8 graph without the NCHW -> NHWC transposes right after its inputs (the TFLite
    writer has no TRANSPOSE): returns (graph, {old input: new input})."""
    moved, nodes = {}, list(qg.nodes)
    for n in qg.nodes:
        if n.op == "transpose" and n.inputs[0] in qg.inputs:
            moved[n.inputs[0]] = (n.outputs[0], n.attrs["perm"])
            nodes.remove(n)
    inputs = [moved.get(i, (i,))[0] for i in qg.inputs]
    return qg.replace(nodes=nodes, inputs=inputs), moved


@pytest.mark.parametrize("path", sorted(MODELS.glob("*.onnx")), ids=lambda p: p.stem)
def test_onnx_models(path):
    g = optimize(load(path))
    cal, test = data(g, -2.0, 2.0, seed=2)
    try:
        qg = quantize_graph(g, [{g.inputs[0]: c} for c in cal])
    except McuforgeError as e:  # an op without an int8 kernel: the error names the node
        assert "cannot quantize" in str(e) and "node '" in str(e)
        return
    iq, oq = qg.tensors[qg.inputs[0]].quant, qg.tensors[qg.outputs[0]].quant
    x8 = quantize_input(test, iq)
    c_out = run_graph(qg, [x8])[0]
    assert sqnr(run_graph(g, [test])[0], dequantize(c_out, oq)) > 25.0
    stripped, moved = _strip_input_transposes(qg)
    try:
        tfl = write_tflite(stripped)
    except ValueError as e:  # explicit padding TFLite cannot express: said so
        assert "neither SAME" in str(e)
        return
    if moved:
        x8 = np.transpose(x8, (0,) + tuple(1 + p for p in moved[qg.inputs[0]][1]))
    ref = tflm.run(tfl, [x8])[0]
    np.testing.assert_array_equal(c_out, ref.reshape(c_out.shape))


@pytest.mark.parametrize("method", ["minmax", "percentile", "mse"])
def test_methods_bit_exact(method):
    int8_path = mlperf_model("kws_ref_model")
    g = optimize(load(mlperf_model("kws_ref_model_float32")))
    cal, test = data(g, *int8_input_range(int8_path), seed=3)
    qg = quantize_graph(g, [{g.inputs[0]: c} for c in cal], method=method)
    iq, oq = qg.tensors[qg.inputs[0]].quant, qg.tensors[qg.outputs[0]].quant
    c_out = check_bit_exact(qg, write_tflite(qg), quantize_input(test, iq))
    assert sqnr(run_graph(g, [test])[0], dequantize(c_out, oq)) > 15.0


def test_float_io_end_to_end():
    """io="float": float32 in and out, same numbers as the int8 graph dequantized, and TFLM
    agrees on the emitted file (quantize / dequantize at the edges)."""
    g = optimize(load(mlperf_model("kws_ref_model_float32")))
    cal, test = data(g, *int8_input_range(mlperf_model("kws_ref_model")), seed=4)
    samples = [{g.inputs[0]: c} for c in cal]
    qf = quantize_graph(g, samples, io="float")
    assert qf.inputs == g.inputs and qf.outputs == g.outputs
    assert all(qf.tensors[t].dtype == "float32" for t in qf.inputs + qf.outputs)
    out = run_graph(qf, [test])[0]
    q8 = quantize_graph(g, samples, io="int8")
    iq, oq = q8.tensors[q8.inputs[0]].quant, q8.tensors[q8.outputs[0]].quant
    np.testing.assert_array_equal(out, dequantize(run_graph(q8, [quantize_input(test, iq)])[0],
                                                  oq))
    np.testing.assert_array_equal(out, tflm.run(write_tflite(qf), [test])[0].reshape(out.shape))
    assert sqnr(run_graph(g, [test])[0], out) > 15.0


def test_cli_compile_quantized(tmp_path, capsys):
    model = mlperf_model("kws_ref_model_float32")
    folder = tmp_path / "cal"
    folder.mkdir()
    rng = np.random.default_rng(5)
    for i in range(6):  # a folder of single samples without the batch axis
        np.save(folder / f"{i}.npy", rng.uniform(-120, 25, (49, 10, 1)).astype(np.float32))
    out = tmp_path / "kws.tflite"
    rc = main(["compile", str(model), "-o", str(tmp_path / "proj"), "--quantize", "int8",
               "--calibration", str(folder), "--calibration-method", "minmax",
               "--emit-tflite", str(out)])
    text = capsys.readouterr()
    assert rc == 0, text.err
    assert "input 'input_1': int8, int8 scale" in text.out
    assert "calibrating [" in text.err and "6/6 samples" in text.err
    assert load(out).tensors["input_1"].dtype == "int8"
    rc = main(["compile", str(model), "-o", str(tmp_path / "p2"), "--calibration", str(folder)])
    assert rc == 2 and "need --quantize int8" in capsys.readouterr().err


def test_unquantizable_op_is_named():
    x = Tensor("x", (1, 4), "float32")
    y = Tensor("y", (1, 4), "float32")
    g = Graph({"x": x, "y": y}, [Node("unary", ("x",), ("y",), {"fn": "exp"}, "my_exp")],
              ["x"], ["y"])
    with pytest.raises(McuforgeError, match="cannot quantize unary node 'my_exp'"):
        quantize_graph(g, [{"x": np.zeros((1, 4), np.float32)}])


def test_calibration_data_errors(tmp_path):
    g = optimize(load(mlperf_model("ad01_fp32")))
    np.save(tmp_path / "bad.npy", np.zeros((3, 7), np.float32))
    with pytest.raises(McuforgeError, match="expected \\(N, 1, 640\\)"):
        quantize_for_compile(g, "int8", str(tmp_path / "bad.npy"))
    with pytest.raises(McuforgeError, match="needs --calibration"):
        quantize_for_compile(g, "int8", None)
