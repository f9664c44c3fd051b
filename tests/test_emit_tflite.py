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

from mcuforge.frontend.tflite_writer import write_tflite
from mcuforge.tools import tflm
from mcuforge.api import load
from mcuforge.cli import main
from mcuforge.ir.errors import McuforgeError
from mcuforge.runner import GraphRunner, run_graph
from mcuforge.optimizer.pipeline import optimize
from mcuforge.optimizer.quantize import quantize_for_compile

RUN = GraphRunner()  # the quantizer's graph runner: builds each graph once

pytestmark = pytest.mark.skipif(not tflm.available(), reason="tflite-micro not installed")
MODELS = Path(__file__).parent / "models"


def onnx_model(nodes, x_shape, y_shape, inits=(), opset=18, infos=()) -> bytes:
    g = helper.make_graph(
        nodes, "m", [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, y_shape)],
        [numpy_helper.from_array(np.asarray(v), k) for k, v in inits],
        value_info=[helper.make_tensor_value_info(k, TensorProto.FLOAT, v) for k, v in infos])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    onnx.checker.check_model(m)
    return m.SerializeToString()


def ort_run(model: bytes, x: np.ndarray) -> np.ndarray:
    s = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    name = s.get_inputs()[0].name
    return np.stack([s.run(None, {name: row})[0] for row in x])  # x: a batch of model inputs


def emit(model: bytes, cal: np.ndarray, tmp_path) -> tuple:
    """(int8 graph, emitted .tflite bytes) as `compile --quantize int8 --emit-tflite` makes."""
    path = tmp_path / "q.tflite"
    q = quantize_for_compile(load(model), "int8", cal, "minmax", emit_tflite=path, run=RUN)
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


def _float_file_equals_onnxruntime(m: bytes, shape) -> None:
    """The float graph as written to .tflite, run by LiteRT, equals onnxruntime on the model."""
    from ai_edge_litert.interpreter import Interpreter
    it = Interpreter(model_content=write_tflite(optimize(load(m))))
    it.allocate_tensors()
    x = np.random.default_rng(1).normal(size=shape).astype(np.float32)
    it.set_tensor(it.get_input_details()[0]["index"], x)
    it.invoke()
    got = it.get_tensor(it.get_output_details()[0]["index"])
    np.testing.assert_array_equal(got, ort_run(m, x[None])[0])


@pytest.mark.parametrize("pads", [(0, 2, 1, 0, 1, 3), (0, 0, 4, 0, 4, 0)])
def test_pad_reflect_is_mirror_pad(pads, tmp_path):
    m = pad_model("reflect", pads)
    onnx.checker.check_model(onnx.load_from_string(m))
    check_emitted(m, (1, 5, 6), tmp_path, steps=0.5)
    _float_file_equals_onnxruntime(m, (1, 5, 6))


@pytest.mark.parametrize("mode,pads,opset", [("edge", (0, 2, 1, 0, 1, 3), 18),
                                             ("edge", (0, 0, 0, 0, 3, 0), 18),
                                             ("wrap", (0, 2, 1, 0, 3, 6), 19)])
def test_pad_edge_and_wrap_are_written_as_slices_and_concat(mode, pads, opset, tmp_path):
    """TFLite has no edge / wrap pad: the writer spells them with STRIDED_SLICE and
    CONCATENATION, exact data movement (int8: bit-exact; float: equal to onnxruntime)."""
    m = onnx.load_from_string(pad_model(mode, pads))
    m.opset_import[0].version = opset
    m = m.SerializeToString()
    check_emitted(m, (1, 5, 6), tmp_path, steps=0.5)
    _float_file_equals_onnxruntime(m, (1, 5, 6))


def test_unwritable_node_is_refused_by_name_in_the_cli(tmp_path, capsys):
    """An average pool counting its padded taps (count_include_pad=1): the C is right, TFLite
    leaves padded taps out, so --emit-tflite refuses naming the node, writes no file."""
    node = helper.make_node("AveragePool", ["x"], ["y"], kernel_shape=[3, 3], pads=[1, 1, 1, 1],
                            count_include_pad=1, name="avg_with_pads")
    path = tmp_path / "m.onnx"
    path.write_bytes(onnx_model([node], [1, 2, 6, 6], [1, 2, 6, 6]))
    cal = tmp_path / "cal.npy"
    np.save(cal, np.random.default_rng(0).normal(size=(4, 1, 2, 6, 6)).astype(np.float32))
    rc = main(["compile", str(path), "-o", str(tmp_path / "out"), "--quantize", "int8",
               "--calibration", str(cal), "--emit-tflite", str(tmp_path / "q.tflite")])
    err = capsys.readouterr().err
    assert rc != 0 and "Traceback" not in err
    assert "mcuforge: error:" in err and "avg_with_pads" in err and "count_include_pad" in err
    assert not (tmp_path / "q.tflite").exists()


def test_pad_reflect_wider_than_the_mirror_is_refused():
    # numpy / onnxruntime reflect a pad wider than size - 1 again; MIRROR_PAD cannot
    m = pad_model("reflect", (0, 0, 6, 0, 0, 0))
    g = optimize(load(m))
    with pytest.raises(ValueError, match="MIRROR_PAD mirrors at most 5"):
        write_tflite(g)


def _graph(op, attrs, x_shape=(1, 4, 4, 2), y_shape=(1, 4, 4, 2), consts=()):
    from mcuforge.ir.graph import Graph, Node, Tensor
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
    "wrap_pad_too_wide": (lambda: _graph("pad", dict(pads=((0, 0), (5, 0), (0, 0), (0, 0)),
                                                     mode="wrap"), y_shape=(1, 9, 4, 2)),
                          "'wrap': a wrap takes at most 4"),
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


# ---------------------------------------------------------------------------------------------
# Layout transposes and every op the quantizer produces (item: NCHW models could not be emitted)


def conv_w(rng, cout, cin, k):
    return rng.normal(0, 0.4, (cout, cin, k, k)).astype(np.float32)


def single_op_models():
    """name -> (ONNX model, NCHW input shape): one of each op the quantizer writes."""
    rng = np.random.default_rng(7)
    x4, y4 = [1, 3, 8, 8], [1, 4, 8, 8]
    conv = helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1])
    cw = [("w", conv_w(rng, 4, 3, 3)), ("b", rng.normal(0, 0.3, 4).astype(np.float32))]

    def after_conv(nodes, y_shape, inits=(), opset=18):
        return onnx_model([conv] + nodes, x4, y_shape, cw + list(inits), opset), x4

    def unary(op, **kw):  # on the input itself: only the op's own rounding is compared
        return onnx_model([helper.make_node(op, ["x"], ["y"], **kw)], x4, x4), x4

    m = {
        "conv_relu": after_conv([helper.make_node("Relu", ["c"], ["y"])], y4),
        "conv_relu6": after_conv([helper.make_node("Clip", ["c", "lo", "hi"], ["y"])], y4,
                                 [("lo", np.float32(0)), ("hi", np.float32(6))]),
        "sigmoid": unary("Sigmoid"), "tanh": unary("Tanh"),
        "leaky_relu": unary("LeakyRelu", alpha=0.2), "hard_swish": unary("HardSwish"),
        "softmax_channels_last": (onnx_model(
            [helper.make_node("Softmax", ["x"], ["y"], axis=-1)], [2, 10], [2, 10]), [2, 10]),
        "conv_stride2_pads": (onnx_model(
            [helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1], strides=[2, 2])],
            x4, [1, 4, 4, 4], [("w", conv_w(rng, 4, 3, 3))]), x4),
        "depthwise_stride2": (onnx_model(
            [helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1], strides=[2, 2],
                              group=3)], x4, [1, 3, 4, 4], [("w", conv_w(rng, 3, 1, 3))]), x4),
        "maxpool_pads": (onnx_model(
            [helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=[3, 3], strides=[2, 2],
                              pads=[1, 1, 1, 1])], x4, [1, 3, 4, 4]), x4),
        "avgpool": (onnx_model(
            [helper.make_node("AveragePool", ["x"], ["y"], kernel_shape=[2, 2], strides=[2, 2])],
            x4, [1, 3, 4, 4]), x4),
        "global_avgpool": after_conv([helper.make_node("GlobalAveragePool", ["c"], ["y"])],
                                     [1, 4, 1, 1]),
        "add_mul": after_conv([helper.make_node("Mul", ["c", "x0"], ["m"]),
                               helper.make_node("Add", ["m", "c"], ["y"])], y4,
                              [("x0", rng.normal(0, 1, (1, 4, 1, 1)).astype(np.float32))]),
        "concat": after_conv([helper.make_node("Relu", ["c"], ["r"]),
                              helper.make_node("Concat", ["c", "r"], ["y"], axis=1)],
                             [1, 8, 8, 8]),
        "pad_constant": after_conv([helper.make_node("Pad", ["c", "p"], ["y"])], [1, 4, 10, 9],
                                   [("p", np.array([0, 0, 1, 0, 0, 0, 1, 1], np.int64))]),
        "transpose_flatten_gemm": after_conv(
            [helper.make_node("Flatten", ["c"], ["f"]),
             helper.make_node("Gemm", ["f", "fw", "fb"], ["y"], transB=1)], [1, 5],
            [("fw", rng.normal(0, 0.1, (5, 256)).astype(np.float32)),
             ("fb", rng.normal(0, 0.1, 5).astype(np.float32))]),
    }
    return m


SINGLE = single_op_models()


@pytest.mark.parametrize("name", sorted(SINGLE))
def test_every_quantizer_op_is_emitted_bit_exact(name, tmp_path):
    model, shape = SINGLE[name]
    check_emitted(model, shape, tmp_path, steps=3.0, lo=-3.0, hi=3.0)


def test_float_io_edges_are_emitted(tmp_path):
    """io="float": QUANTIZE / DEQUANTIZE at the edges of an NCHW conv."""
    from mcuforge.optimizer.quantize import quantize_graph
    model, shape = SINGLE["conv_relu"]
    rng = np.random.default_rng(3)
    cal = rng.uniform(-3, 3, (30,) + tuple(shape)).astype(np.float32)
    q = quantize_graph(optimize(load(model)), [{"x": c} for c in cal], io="float", run=RUN)
    test = cal[:6]
    c_out = run_graph(q, [test])[0]
    np.testing.assert_array_equal(c_out, tflm.run(write_tflite(q), [test])[0].reshape(
        c_out.shape))


def sqnr(ref, got):
    ref, got = ref.astype(np.float64), got.astype(np.float64).reshape(ref.shape)
    return 10 * np.log10(np.sum(ref ** 2) / max(np.sum((ref - got) ** 2), 1e-30))


@pytest.mark.parametrize("stem", ["torch_lenet", "torch_mobile_block", "torch_resblock",
                                  "torch_conv_bn_relu"])
def test_readme_quantize_workflow_on_cnns(stem, tmp_path, capsys):
    """`mcuforge compile model.onnx -o out/ --quantize int8 --calibration samples.npy
    --emit-tflite q.tflite` on NCHW CNNs: the .tflite runs in tflite-micro, bit-exact with
    the C mcuforge compiles, and close to onnxruntime's float model."""
    path = MODELS / f"{stem}.onnx"
    shape = [d.dim_value for d in onnx.load(path).graph.input[0].type.tensor_type.shape.dim]
    rng = np.random.default_rng(11)
    samples = rng.uniform(-2, 2, (40,) + tuple(shape)).astype(np.float32)
    np.save(tmp_path / "samples.npy", samples)
    out = tmp_path / "q.tflite"
    rc = main(["compile", str(path), "-o", str(tmp_path / "out"), "--quantize", "int8",
               "--calibration", str(tmp_path / "samples.npy"), "--emit-tflite", str(out)])
    assert rc == 0, capsys.readouterr().err
    emitted = load(out)  # the emitted model, read back: int8 in and out
    iq = emitted.tensors[emitted.inputs[0]].quant
    oq = emitted.tensors[emitted.outputs[0]].quant
    test = rng.uniform(-2, 2, (6,) + tuple(shape)).astype(np.float32)
    x8 = np.clip(np.round(test / iq.scale[0]) + iq.zero_point[0], -128, 127).astype(np.int8)
    ref = tflm.run(out.read_bytes(), [x8])[0]
    from mcuforge.runner import build, run_executable
    exe = build(tmp_path / "out", stem)  # the C project the same command wrote
    c_out = run_executable(exe, emitted, [x8])[0]
    np.testing.assert_array_equal(c_out, ref.reshape(c_out.shape))
    want = ort_run(path.read_bytes(), test)
    got = (c_out.astype(np.float64) - oq.zero_point[0]) * oq.scale[0]
    assert sqnr(want, got) > 25.0
