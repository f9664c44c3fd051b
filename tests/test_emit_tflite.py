"""`--emit-tflite`: the int8 model mcuforge writes runs in tflite-micro bit-exactly like the C
mcuforge generates for it, and every node the writer accepts means in TFLite what it means in
the graph (an attribute TFLite cannot express is refused, naming the node, never dropped).

References: onnxruntime for the float meaning of each ONNX model (within a few int8 steps of
the output scale), tflite-micro for the emitted file, and LiteRT for float files.
"""
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from frontend.tflite_writer import write_tflite
from mcuforge import tflm
from mcuforge.api import load
from mcuforge.cli import main
from mcuforge.errors import McuforgeError
from optimizer.calibrate import run_graph
from optimizer.pipeline import optimize
from optimizer.quantize import quantize_for_compile

pytestmark = pytest.mark.skipif(not tflm.available(), reason="tflite-micro not installed")
MODELS = Path(__file__).parent / "models"


def onnx_model(nodes, x_shape, y_shape, inits=(), opset=18) -> bytes:
    g = helper.make_graph(
        nodes, "m", [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, y_shape)],
        [numpy_helper.from_array(np.asarray(v), k) for k, v in inits])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    onnx.checker.check_model(m)
    return m.SerializeToString()


def ort_run(model: bytes, x: np.ndarray) -> np.ndarray:
    s = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    return np.stack([s.run(None, {"x": row})[0] for row in x])  # x: a batch of model inputs


def emit(model: bytes, cal: np.ndarray, tmp_path) -> tuple:
    """(int8 graph, emitted .tflite bytes) as `compile --quantize int8 --emit-tflite` makes."""
    path = tmp_path / "q.tflite"
    q = quantize_for_compile(load(model), "int8", cal, emit_tflite=path)
    return q, path.read_bytes()


def check_emitted(model: bytes, x_shape, tmp_path, seed=0, steps=3.0, lo=-2.0, hi=2.0):
    """C == tflite-micro on the emitted file, byte for byte; both within `steps` output
    steps of onnxruntime's float result. Returns the int8 graph."""
    rng = np.random.default_rng(seed)
    cal = rng.uniform(lo, hi, (40,) + tuple(x_shape)).astype(np.float32)
    test = rng.uniform(lo, hi, (8,) + tuple(x_shape)).astype(np.float32)
    q, tfl = emit(model, cal, tmp_path)
    iq, oq = q.tensors[q.inputs[0]].quant, q.tensors[q.outputs[0]].quant
    x8 = np.clip(np.round(test / iq.scale[0]) + iq.zero_point[0], -128, 127).astype(np.int8)
    c_out = run_graph(q, [x8])[0]
    ref = tflm.run(tfl, [x8])[0]
    np.testing.assert_array_equal(c_out, ref.reshape(c_out.shape))
    # float meaning: dequantized input through onnxruntime vs the dequantized int8 output
    xf = ((x8.astype(np.float32) - iq.zero_point[0]) * np.float32(iq.scale[0]))
    want = ort_run(model, xf.reshape(test.shape))
    got = (c_out.astype(np.float64) - oq.zero_point[0]) * oq.scale[0]
    err = np.max(np.abs(got.reshape(want.shape) - want)) / oq.scale[0]
    assert err <= steps, f"{err:.2f} output steps from onnxruntime"
    return q


# ---------------------------------------------------------------------------------------------
# Pad modes (item: reflect / edge used to be written as a zero PAD)


def pad_model(mode: str, pads) -> bytes:
    return onnx_model([helper.make_node("Pad", ["x", "p"], ["y"], mode=mode)], [1, 5, 6],
                      [1, 5 + pads[1] + pads[4], 6 + pads[2] + pads[5]],
                      [("p", np.array(pads, np.int64))])


@pytest.mark.parametrize("pads", [(0, 2, 1, 0, 1, 3), (0, 0, 4, 0, 4, 0)])
def test_pad_reflect_is_mirror_pad(pads, tmp_path):
    m = pad_model("reflect", pads)
    onnx.checker.check_model(onnx.load_from_string(m))
    check_emitted(m, (1, 5, 6), tmp_path, steps=0.5)
    # the float file too, against onnxruntime through LiteRT
    from ai_edge_litert.interpreter import Interpreter
    it = Interpreter(model_content=write_tflite(optimize(load(m))))
    it.allocate_tensors()
    x = np.random.default_rng(1).normal(size=(1, 5, 6)).astype(np.float32)
    it.set_tensor(it.get_input_details()[0]["index"], x)
    it.invoke()
    got = it.get_tensor(it.get_output_details()[0]["index"])
    np.testing.assert_array_equal(got, ort_run(m, x[None])[0])


def test_pad_edge_is_refused_naming_the_node(tmp_path, capsys):
    m = onnx.load_from_string(pad_model("edge", (0, 1, 1, 0, 1, 1)))
    m.graph.node[0].name = "edge_pad"
    path = tmp_path / "m.onnx"
    onnx.save(m, path)
    cal = tmp_path / "cal.npy"
    np.save(cal, np.random.default_rng(0).normal(size=(4, 1, 5, 6)).astype(np.float32))
    rc = main(["compile", str(path), "-o", str(tmp_path / "out"), "--quantize", "int8",
               "--calibration", str(cal), "--emit-tflite", str(tmp_path / "q.tflite")])
    err = capsys.readouterr().err
    assert rc != 0 and "Traceback" not in err
    assert "mcuforge: error:" in err and "edge_pad" in err and "'edge'" in err
    assert not (tmp_path / "q.tflite").exists()


def test_pad_reflect_wider_than_the_mirror_is_refused():
    # numpy / onnxruntime reflect a pad wider than size - 1 again; MIRROR_PAD cannot
    m = pad_model("reflect", (0, 0, 6, 0, 0, 0))
    g = optimize(load(m))
    with pytest.raises(ValueError, match="MIRROR_PAD mirrors at most 5"):
        write_tflite(g)


def _graph(op, attrs, x_shape=(1, 4, 4, 2), y_shape=(1, 4, 4, 2), consts=()):
    from mcuforge.graph import Graph, Node, Tensor
    ts = {"x": Tensor("x", x_shape, "float32"), "y": Tensor("y", y_shape, "float32")}
    for name, arr in consts:
        ts[name] = Tensor(name, arr.shape, "float32", data=arr)
    return Graph(ts, [Node(op, ("x",) + tuple(c for c, _ in consts), ("y",), attrs, "n1")],
                 ["x"], ["y"])


POOL = dict(filter=(3, 3), stride=(1, 1), padding=(1, 1, 1, 1), activation="none")
UNWRITABLE = {  # each would have been written as something else
    "count_include_pad": (lambda: _graph("avg_pool2d", dict(POOL, count_include_pad=True)),
                          "count_include_pad"),
    "pool_dilation": (lambda: _graph("max_pool2d", dict(POOL, dilation=(2, 2),
                                                        padding=(2, 2, 2, 2))), "dilation"),
    "softmax_axis": (lambda: _graph("softmax", dict(beta=1.0, axis=2)), "last axis"),
    "negative_pad": (lambda: _graph("pad", dict(pads=((0, 0), (-1, 0), (0, 0), (0, 0))),
                                    y_shape=(1, 3, 4, 2)), "negative"),
    "wrap_pad": (lambda: _graph("pad", dict(pads=((0, 0), (1, 0), (0, 0), (0, 0)), mode="wrap"),
                                y_shape=(1, 5, 4, 2)), "'wrap'"),
    "grouped_conv": (lambda: _graph("conv2d", dict(stride=(1, 1), dilation=(1, 1),
                                                   padding=(0, 0, 0, 0), activation="none"),
                                    x_shape=(1, 4, 4, 4),
                                    consts=[("w", np.ones((2, 1, 1, 2), np.float32))]),
                     "grouped"),
    "ort_requant": (lambda: _graph("logistic", dict(requant="onnxruntime")), "onnxruntime"),
}


@pytest.mark.parametrize("case", sorted(UNWRITABLE))
def test_every_unwritable_attribute_is_refused(case):
    """The writer's class of bug: an attribute it does not write."""
    make, words = UNWRITABLE[case]
    with pytest.raises(ValueError, match=f"node 'n1'.*{words}"):
        write_tflite(make())
