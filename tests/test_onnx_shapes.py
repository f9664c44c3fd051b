"""ONNX shapes: mcuforge computes every node's output shape itself (frontend/onnx_shapes.py),
checks the operands against each other and against the shapes the model declares, and agrees
with onnxruntime where onnx's own shape inference does not (ceil-mode pooling, IR < 4 models,
QDQ models with com.microsoft Q/DQ, shapes computed by Shape chains); --input-shape may set only
the dimensions a model leaves open.

Every model is built with onnx.helper (or onnxruntime's quantizer on one) and compared with
onnxruntime, or refused with a ModelError naming the node / input.
"""
from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from mcuforge.frontend import load_model
from mcuforge.frontend.onnx import load_onnx
from mcuforge import runner
from mcuforge.ir.errors import ModelError

ort = pytest.importorskip("onnxruntime")


def _model(nodes, inputs: dict, inits: dict = None, outputs=None, opset=17, ir_version=8,
           elem=TensorProto.FLOAT):
    """outputs: {name: declared shape or None}."""
    outputs = outputs or {"y": None}
    g = helper.make_graph(
        nodes, "m", [helper.make_tensor_value_info(n, elem, s) for n, s in inputs.items()],
        [helper.make_tensor_value_info(n, elem, s) for n, s in outputs.items()],
        [numpy_helper.from_array(np.asarray(v), k) for k, v in (inits or {}).items()])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)],
                             ir_version=ir_version)


def _ort(model, feeds: dict) -> list:
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


def _check(model, feeds: dict, rtol=1e-5, atol=1e-5, **kw):
    ref = _ort(model, feeds)
    got = runner.run(model.SerializeToString(), feeds, **kw)
    got = list(got.values()) if isinstance(got, dict) else [got]
    assert len(got) == len(ref)
    for g, r in zip(got, ref):
        assert g.shape == r.shape
        np.testing.assert_allclose(g, r, rtol=rtol, atol=atol)


# ---- item: ceil-mode pooling drops a window that would start in the end padding -------------

POOLS = [  # (input shape, attributes)
    ((1, 1, 1, 8), dict(kernel_shape=[1, 1], strides=[1, 2])),  # the case: 4 windows
    ((1, 2, 7, 9), dict(kernel_shape=[2, 3], strides=[2, 2])),
    ((1, 2, 7, 9), dict(kernel_shape=[3, 3], strides=[3, 2], pads=[1, 1, 1, 1])),
    ((1, 2, 6, 6), dict(kernel_shape=[2, 2], strides=[2, 2], pads=[1, 1, 1, 1])),
    ((1, 2, 10, 11), dict(kernel_shape=[2, 2], strides=[3, 3], dilations=[2, 2], pads=[0, 1, 0, 1])),
    ((1, 3, 10), dict(kernel_shape=[3], strides=[4], pads=[1, 1])),  # 1-D
]


@pytest.mark.parametrize("op", ["MaxPool", "AveragePool", "AveragePool-count-pad"])
@pytest.mark.parametrize("k", range(len(POOLS)))
def test_ceil_mode_pool(op, k):
    shape, attrs = POOLS[k]
    attrs = dict(attrs, ceil_mode=1)
    if op == "AveragePool-count-pad":
        op, attrs["count_include_pad"] = "AveragePool", 1
    node = helper.make_node(op, ["x"], ["y"], **attrs)
    model = _model([node], {"x": list(shape)}, opset=19)
    x = np.random.default_rng(k).normal(size=shape).astype(np.float32)
    assert np.all(np.isfinite(_ort(model, {"x": x})[0]))
    _check(model, {"x": x})


@pytest.mark.parametrize("op", ["AveragePool", "MaxPool"])
@pytest.mark.parametrize("k", [0, 1, 2, 3, 4, 5])
def test_ceil_mode_qdq_pool(op, k):
    """QDQ pools: AveragePool fused into onnxruntime's QLinearAveragePool (which has no
    dilations), MaxPool on the int8 values."""
    shape, attrs = POOLS[k]
    if op == "AveragePool" and "dilations" in attrs:
        pytest.skip("onnxruntime fuses it into QLinearAveragePool anyway and refuses the model")
    scale, zp = np.float32(0.05), np.int8(3)
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["xq"]),
             helper.make_node("DequantizeLinear", ["xq", "s", "z"], ["xd"]),
             helper.make_node(op, ["xd"], ["p"], ceil_mode=1, **attrs),
             helper.make_node("QuantizeLinear", ["p", "s", "z"], ["pq"]),
             helper.make_node("DequantizeLinear", ["pq", "s", "z"], ["y"])]
    model = _model(nodes, {"x": list(shape)}, {"s": scale, "z": zp}, opset=19)
    x = np.random.default_rng(k).normal(size=shape).astype(np.float32)
    _check(model, {"x": x}, rtol=0, atol=float(scale) * 1.01)


# ---- item: operand shapes are checked; declared shapes must agree --------------------------

def _refused(model, *words):
    with pytest.raises(ModelError) as e:
        load_onnx(model)
    for w in words:
        assert w in str(e.value)
    with pytest.raises(Exception):  # onnxruntime refuses it too
        _ort(model, {i.name: np.zeros([d.dim_value for d in i.type.tensor_type.shape.dim],
                                      np.float32) for i in model.graph.input})


def test_matmul_inner_dims_refused():
    """x[1,32] @ W[16,4] declared [1,4]: it used to compile into a loop past its output."""
    node = helper.make_node("MatMul", ["x", "W"], ["y"], name="mm")
    model = _model([node], {"x": [1, 32]}, {"W": np.ones((16, 4), np.float32)}, {"y": [1, 4]})
    _refused(model, "'mm'", "MatMul", "[1, 32]", "[16, 4]")


BAD = [  # (nodes, inputs, initializers, declared outputs, words the error must contain)
    ([helper.make_node("Conv", ["x", "w"], ["y"], name="conv")], {"x": [1, 3, 8, 8]},
     {"w": np.ones((4, 2, 3, 3), np.float32)}, {"y": None}, ["'conv'", "channels"]),
    ([helper.make_node("Gemm", ["x", "w"], ["y"], name="fc", transB=1)], {"x": [2, 5]},
     {"w": np.ones((3, 4), np.float32)}, {"y": None}, ["'fc'", "inner"]),
    ([helper.make_node("Add", ["x", "b"], ["y"], name="add")], {"x": [2, 5]},
     {"b": np.ones(4, np.float32)}, {"y": None}, ["'add'", "broadcast"]),
    ([helper.make_node("Concat", ["x", "b"], ["y"], name="cat", axis=1)], {"x": [2, 5]},
     {"b": np.ones((3, 1), np.float32)}, {"y": None}, ["'cat'"]),
    ([helper.make_node("Reshape", ["x", "s"], ["y"], name="rs")], {"x": [2, 5]},
     {"s": np.array([3, -1], np.int64)}, {"y": None}, ["'rs'", "reshape"]),
    ([helper.make_node("BatchNormalization", ["x", "s", "s", "s", "v"], ["y"], name="bn")],
     {"x": [1, 3, 4, 4]}, {"s": np.ones(3, np.float32), "v": np.ones(2, np.float32)},
     {"y": None}, ["'bn'"]),
]


@pytest.mark.parametrize("k", range(len(BAD)))
def test_mismatched_operands_refused(k):
    nodes, inputs, inits, outs, words = BAD[k]
    _refused(_model(nodes, inputs, inits, outs), *words)


def test_declared_output_shape_must_agree():
    """A Relu declared [1, 7] on a [1, 8] input: onnxruntime runs it (with a warning), but C
    sized from the declaration would be wrong, so it is refused with both shapes named."""
    node = helper.make_node("Relu", ["x"], ["y"], name="act")
    model = _model([node], {"x": [1, 8]}, outputs={"y": [1, 7]})
    with pytest.raises(ModelError, match=r"'act'.*\[1, 7\].*\[1, 8\]"):
        load_onnx(model)


def test_symbolic_output_dims_filled():
    node = helper.make_node("MatMul", ["x", "W"], ["y"])
    model = _model([node], {"x": ["N", 6]}, {"W": np.ones((6, 3), np.float32)},
                   {"y": ["N", "M"]})
    x = np.random.default_rng(0).normal(size=(1, 6)).astype(np.float32)
    _check(model, {"x": x})


# ---- item: IR version 3 / opset 8 (the classic ONNX-zoo MNIST CNN) --------------------------

def mnist_ir3():
    """The ONNX zoo's MNIST CNN layout: IR 3, opset 8, every initializer also a graph input
    (IR < 4 requires it); the FC weights [16, 4, 4, 10] reshaped to [256, 10] by a Reshape
    whose folded result onnx's shape inference cannot see, so MatMul had no shape."""
    r = np.random.default_rng(0)
    inits = {"W1": r.normal(0, .3, (8, 1, 5, 5)), "B1": r.normal(0, .1, (8, 1, 1)),
             "W2": r.normal(0, .1, (16, 8, 5, 5)), "B2": r.normal(0, .1, (16, 1, 1)),
             "S": np.array([1, 256]), "W3": r.normal(0, .1, (16, 4, 4, 10)),
             "S3": np.array([256, 10]), "B3": r.normal(0, .1, (1, 10))}
    inits = {k: v.astype(np.int64 if k.startswith("S") else np.float32)
             for k, v in inits.items()}
    N = helper.make_node
    nodes = [N("Conv", ["x", "W1"], ["c1"], kernel_shape=[5, 5], strides=[1, 1],
               pads=[2, 2, 2, 2], auto_pad="NOTSET"),
             N("Add", ["c1", "B1"], ["a1"]), N("Relu", ["a1"], ["r1"]),
             N("MaxPool", ["r1"], ["p1"], kernel_shape=[2, 2], strides=[2, 2], pads=[0] * 4),
             N("Conv", ["p1", "W2"], ["c2"], kernel_shape=[5, 5], strides=[1, 1],
               pads=[2, 2, 2, 2]),
             N("Add", ["c2", "B2"], ["a2"]), N("Relu", ["a2"], ["r2"]),
             N("MaxPool", ["r2"], ["p2"], kernel_shape=[3, 3], strides=[3, 3], pads=[0] * 4),
             N("Reshape", ["p2", "S"], ["f"]), N("Reshape", ["W3", "S3"], ["W3r"]),
             N("MatMul", ["f", "W3r"], ["mm"]), N("Add", ["mm", "B3"], ["y"])]
    ins = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 28, 28])] + [
        helper.make_tensor_value_info(k, TensorProto.INT64 if k.startswith("S")
                                      else TensorProto.FLOAT, v.shape)
        for k, v in inits.items()]
    g = helper.make_graph(nodes, "mnist", ins,
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 10])],
                          [numpy_helper.from_array(v, k) for k, v in inits.items()])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 8)], ir_version=3)


def test_mnist_ir3_opset8():
    import onnx
    model = mnist_ir3()
    onnx.checker.check_model(model)
    x = np.random.default_rng(1).normal(size=(1, 1, 28, 28)).astype(np.float32)
    _check(model, {"x": x}, rtol=1e-4, atol=1e-4)


# ---- item: --input-shape may set only the dimensions the model leaves open ------------------

LENET = Path(__file__).parent / "models" / "torch_lenet.onnx"  # input 'input' [1, 3, 32, 32]


@pytest.mark.parametrize("given, words", [
    ({"input": (1, 1, 32, 32)}, ["'input'", "[1, 3, 32, 32]", "input=1,1,32,32"]),
    ({"input": (1, 3, 32)}, ["'input'", "[1, 3, 32, 32]", "input=1,3,32"]),
    ({"image": (1, 3, 32, 32)}, ["no input 'image'", "'input' [1, 3, 32, 32]"]),
])
def test_input_shape_conflicts_refused(given, words):
    """A static dimension given otherwise (LeNet's 3 channels as 1 used to build a grouped
    convolution), another rank, or an unknown name: one ModelError naming it."""
    with pytest.raises(ModelError) as e:
        load_model(LENET, input_shapes=given)
    for w in words:
        assert w in str(e.value)


def test_input_shape_as_declared_accepted():
    g = load_model(LENET, input_shapes={"input": (1, 3, 32, 32)})
    assert g.tensors["input"].shape == (1, 3, 32, 32)


def test_input_shape_sets_open_dims():
    """Symbolic batch and length set from --input-shape; the result agrees with
    onnxruntime on that shape."""
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1]),
             helper.make_node("Relu", ["c"], ["y"])]
    w = np.random.default_rng(0).normal(size=(4, 2, 3)).astype(np.float32)
    model = _model(nodes, {"x": ["N", 2, "L"]}, {"w": w}, {"y": ["N", 4, "L"]})
    x = np.random.default_rng(1).normal(size=(3, 2, 7)).astype(np.float32)
    ref = _ort(model, {"x": x})[0]
    got = runner.run(model.SerializeToString(), x[:, None],  # a batch of 3 [1, 2, 7] inputs
                     input_shapes={"x": (1, 2, 7)})
    np.testing.assert_allclose(got[:, 0], ref, rtol=1e-5, atol=1e-5)
    with pytest.raises(ModelError, match=r"'x' is declared \[\?, 2, \?\]"):
        load_onnx(model, input_shapes={"x": (1, 3, 7)})


def test_input_shape_of_an_initializer_input():
    """An input with an initializer is that constant: its own shape may be given (ONNX's
    conformance harness does), another is refused."""
    node = helper.make_node("Add", ["x", "b"], ["y"])
    model = _model([node], {"x": [1, 3], "b": [3]}, {"b": np.ones(3, np.float32)})
    assert load_onnx(model, input_shapes={"x": (1, 3), "b": (3,)}).tensors["y"].shape == (1, 3)
    with pytest.raises(ModelError, match=r"'b' is declared \[3\]"):
        load_onnx(model, input_shapes={"b": (4,)})


def test_input_shape_cli_error(tmp_path):
    from test_cli_errors import assert_user_error, mcuforge
    r = mcuforge("compile", LENET, "-o", tmp_path / "out", "--input-shape", "input=1,1,32,32",
                 cwd=tmp_path)
    assert_user_error(r, "'input'", "[1, 3, 32, 32]")
    assert not (tmp_path / "out").exists()


def test_input_shape_tflite():
    """.tflite: an unknown name or a static dimension given otherwise is an error too (the
    batch, -1 in shape_signature, is open)."""
    from conftest import mlperf_model
    path = mlperf_model("ad01_int8")  # input_1 [1, 640], signature [-1, 640]
    with pytest.raises(ModelError, match=r"no input 'x'.*'input_1' \[\?, 640\]"):
        load_model(path, input_shapes={"x": (1, 640)})
    with pytest.raises(ModelError, match=r"'input_1' is declared \[\?, 640\]"):
        load_model(path, input_shapes={"input_1": (1, 64)})
    assert load_model(path, input_shapes={"input_1": (1, 640)}).tensors["input_1"].shape \
        == (1, 640)


# ---- item: QDQ detectors: every DequantizeLinear of a constant is a constant; shape chains fold

def _float_head(seed=0):
    """A float SSD-like detector: backbone convs (one depthwise), two feature maps, box / class
    convs whose outputs are reshaped to [N, -1, 4] / [N, -1, 3] with targets computed from
    Shape -> Gather -> Concat chains, concatenated; scores through a Sigmoid."""
    r = np.random.default_rng(seed)
    inits, nodes = {"i0": np.array([0], np.int64), "m1_4": np.array([-1, 4], np.int64),
                    "m1_3": np.array([-1, 3], np.int64)}, []

    def conv(x, cin, cout, k, s, name, group=1, relu=True):
        fan = cin // group * k * k
        inits[name + "_w"] = (r.normal(0, 1, (cout, cin // group, k, k)) / np.sqrt(fan)) \
            .astype(np.float32)
        inits[name + "_b"] = r.normal(0, 0.1, cout).astype(np.float32)
        nodes.append(helper.make_node("Conv", [x, name + "_w", name + "_b"], [name], name=name,
                                      kernel_shape=[k, k], strides=[s, s], pads=[k // 2] * 4,
                                      group=group))
        if not relu:
            return name
        nodes.append(helper.make_node("Relu", [name], [name + "_r"]))
        return name + "_r"

    def flat(t, last, name):
        nodes.extend([
            helper.make_node("Shape", [t], [name + "_s"]),
            helper.make_node("Gather", [name + "_s", "i0"], [name + "_n"], axis=0),
            helper.make_node("Concat", [name + "_n", f"m1_{last}"], [name + "_shape"], axis=0),
            helper.make_node("Transpose", [t], [name + "_t"], perm=[0, 2, 3, 1]),
            helper.make_node("Reshape", [name + "_t", name + "_shape"], [name + "_f"])])
        return name + "_f"

    x = conv(conv("x", 3, 8, 3, 2, "c1"), 8, 8, 3, 1, "dw1", group=8)
    f1 = conv(x, 8, 16, 1, 1, "pw1")
    f2 = conv(conv(f1, 16, 16, 3, 2, "dw2", group=16), 16, 16, 1, 1, "pw2")
    boxes, scores = [], []
    for i, f in enumerate((f1, f2)):
        boxes.append(flat(conv(f, 16, 8, 3, 1, f"box{i}", relu=False), 4, f"bf{i}"))
        scores.append(flat(conv(f, 16, 6, 3, 1, f"cls{i}", relu=False), 3, f"cf{i}"))
    nodes += [helper.make_node("Concat", boxes, ["boxes"], axis=1),
              helper.make_node("Concat", scores, ["logits"], axis=1),
              helper.make_node("Sigmoid", ["logits"], ["scores"])]
    return _model(nodes, {"x": ["N", 3, 32, 32]}, inits,
                  {"boxes": ["N", "A", 4], "scores": ["N", "A", 3]}, opset=13)


@pytest.mark.parametrize("contrib", [False, True], ids=["onnx-qdq", "com.microsoft-qdq"])
def test_quantize_static_per_channel_detector(tmp_path, contrib):
    """onnxruntime's quantize_static (QDQ, per-channel int8 weights; with UseQDQContribOps its
    Q / DQ are com.microsoft ops): every conv imports (before: 'non-constant Conv weight' for
    each conv whose weight DequantizeLinear had to fold) and agrees with onnxruntime."""
    import onnx
    from onnxruntime.quantization import (CalibrationDataReader, QuantFormat, QuantType,
                                          quantize_static)
    rng = np.random.default_rng(3)
    samples = [rng.normal(size=(1, 3, 32, 32)).astype(np.float32) for _ in range(9)]

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.it = iter(samples[:8])

        def get_next(self):
            x = next(self.it, None)
            return None if x is None else {"x": x}
    onnx.save(_float_head(), tmp_path / "f.onnx")
    quantize_static(tmp_path / "f.onnx", tmp_path / "q.onnx", Reader(),
                    quant_format=QuantFormat.QDQ, per_channel=True,
                    activation_type=QuantType.QInt8, weight_type=QuantType.QInt8,
                    extra_options={"UseQDQContribOps": contrib})
    model = onnx.load(tmp_path / "q.onnx")
    assert any(n.domain == ("com.microsoft" if contrib else "") and
               n.op_type == "DequantizeLinear" for n in model.graph.node)
    g = load_onnx(model)
    assert [g.tensors[o].shape for o in g.outputs] == [(1, 640, 4), (1, 640, 3)]
    ref = _ort(model, {"x": samples[8]})
    got = runner.run(model.SerializeToString(), {"x": samples[8]})
    for name, r in zip(("boxes", "scores"), ref):
        assert got[name].shape == r.shape
        step = np.min(np.diff(np.unique(r)))  # the output's quantization step
        assert np.max(np.abs(got[name] - r)) <= step * 1.01, name


def _dq_conv_head(opset):
    """Hand-built QDQ detector head as an exporter writes it: per-channel int8 weights
    DequantizeLinear(int8 initializer, axis 0) -> Conv whose float output is read twice (Shape
    and Transpose), so nothing fuses it; the Reshape target is Shape -> Slice -> ReduceProd
    (Shape -> Mul) -> Concat: [N, H * W * 2, 4]."""
    r = np.random.default_rng(7)
    w = r.integers(-127, 128, (8, 4, 3, 3)).astype(np.int8)
    ws = (r.uniform(0.5, 1.5, 8) / 127 / 6).astype(np.float32)
    inits = {"w": w, "ws": ws, "wz": np.zeros(8, np.int8),
             "b": (r.normal(0, 0.1, 8)).astype(np.float32),
             "xs": np.float32(0.02), "xz": np.int8(-3),
             "two": np.array([2], np.int64), "n4": np.array([4], np.int64),
             "s0": np.array([0], np.int64), "s1": np.array([1], np.int64),
             "s2": np.array([2], np.int64), "s4": np.array([4], np.int64)}
    N = helper.make_node
    nodes = [N("QuantizeLinear", ["x", "xs", "xz"], ["xq"]),
             N("DequantizeLinear", ["xq", "xs", "xz"], ["xd"]),
             N("DequantizeLinear", ["w", "ws", "wz"], ["wd"], axis=0),
             N("Conv", ["xd", "wd", "b"], ["c"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
             N("Shape", ["c"], ["cs"]),
             N("Slice", ["cs", "s0", "s1"], ["n"]),
             N("Slice", ["cs", "s2", "s4"], ["hw"]),
             N("ReduceProd", ["hw"], ["hw1"], keepdims=1),
             N("Mul", ["hw1", "two"], ["anchors"]),
             N("Concat", ["n", "anchors", "n4"], ["target"], axis=0),
             N("Transpose", ["c"], ["ct"], perm=[0, 2, 3, 1]),
             N("Reshape", ["ct", "target"], ["y"])]
    return _model(nodes, {"x": ["N", 4, 6, 5]}, inits, {"y": ["N", None, 4]}, opset=opset)


@pytest.mark.parametrize("opset", [13, 19])
def test_dq_constant_weights_and_shape_chain(opset):
    model = _dq_conv_head(opset)
    g = load_onnx(model)
    assert g.tensors["y"].shape == (1, 60, 4)
    x = np.random.default_rng(0).normal(size=(1, 4, 6, 5)).astype(np.float32)
    _check(model, {"x": x}, rtol=1e-5, atol=1e-5)


# ---- the graph IR's own shape checks (ir.graph.verify), whatever the frontend ---------

def _tflite_one_op(op, tensors, n_inputs):
    from test_frontend_tflite import build
    ins, outs = list(range(n_inputs)), list(range(n_inputs, len(tensors)))
    return build(tensors, [(op, ins, outs)], [i for i in ins if tensors[i].get("data") is None],
                 outs)


TFLITE_BAD = [  # (op, tensors, n_inputs): outputs declared with a shape LiteRT does not give
    # (FULLY_CONNECTED: it reads x as 2 rows of 16 and resizes y to [2, 4]); compiled as
    # declared, the C wrote past y
    ("FULLY_CONNECTED", [("x", [1, 32]), ("w", [4, 16], np.ones((4, 16), np.float32)),
                         ("y", [1, 4])], 2),
    ("ADD", [("a", [1, 8]), ("b", [1, 6]), ("y", [1, 8])], 2),
]


@pytest.mark.parametrize("k", range(len(TFLITE_BAD)))
def test_tflite_mismatched_operands_refused(k):
    from ai_edge_litert.interpreter import Interpreter
    from test_frontend_tflite import T
    op, specs, n_inputs = TFLITE_BAD[k]
    tensors = [T(s[0], s[1], "FLOAT32", **({"data": s[2]} if len(s) > 2 else {}))
               for s in specs]
    model = _tflite_one_op(op, tensors, n_inputs)
    try:  # LiteRT refuses the model, or resizes the output to another shape than declared
        interp = Interpreter(model_content=model)
        interp.allocate_tensors()
        interp.invoke()
        out = interp.get_output_details()[0]
        assert tuple(interp.get_tensor(out["index"]).shape) != tuple(specs[-1][1])
    except (RuntimeError, ValueError):
        pass
    with pytest.raises(ModelError, match=r"node 0 \(\w+ 'y'\)"):
        load_model(model)


def test_graph_verify_checks_shapes():
    """Graphs built directly (as passes and frontends do): each malformed node is a GraphError
    naming it; the well-formed twin passes."""
    from mcuforge.ir.graph import Graph, GraphError, Node, Tensor, verify

    def graph(op, shapes, attrs, consts=()):
        ts = {f"t{i}": Tensor(f"t{i}", s, "float32",
                              np.zeros(s, np.float32) if i in consts else None)
              for i, s in enumerate(shapes)}
        names = list(ts)
        return Graph(ts, [Node(op, tuple(names[:-1]), (names[-1],), attrs, "n")],
                     [n for i, n in enumerate(names[:-1]) if i not in consts], [names[-1]])
    conv = dict(stride=(1, 1), dilation=(1, 1), padding=(1, 1, 1, 1), activation="none")
    pool = dict(filter=(1, 1), stride=(1, 2), padding=(0, 0, 0, 0), activation="none")
    cases = [  # (op, good shapes, bad shapes, attrs, constant positions)
        ("reshape", [(2, 6), (3, 4)], [(2, 6), (3, 5)], {}, ()),
        ("matmul", [(1, 32), (32, 4), (1, 4)], [(1, 32), (16, 4), (1, 4)], {}, ()),
        ("fully_connected", [(1, 32), (4, 32), (1, 4)], [(1, 32), (4, 16), (1, 4)],
         {"activation": "none"}, (1,)),
        ("add", [(1, 8), (8,), (1, 8)], [(1, 8), (6,), (1, 8)], {"activation": "none"}, ()),
        ("conv2d", [(1, 5, 5, 3), (4, 3, 3, 3), (1, 5, 5, 4)],
         [(1, 5, 5, 3), (4, 3, 3, 3), (1, 6, 5, 4)], conv, (1,)),
        ("conv2d", [(1, 5, 5, 3), (4, 3, 3, 3), (1, 5, 5, 4)],
         [(1, 5, 5, 2), (4, 3, 3, 3), (1, 5, 5, 4)], conv, (1,)),
        ("max_pool2d", [(1, 1, 8, 1), (1, 1, 4, 1)], [(1, 1, 8, 1), (1, 1, 5, 1)], pool, ()),
        ("concat", [(1, 2), (1, 3), (1, 5)], [(1, 2), (1, 3), (1, 6)],
         {"axis": 1, "activation": "none"}, ()),
    ]
    for op, good, bad, attrs, consts in cases:
        verify(graph(op, good, attrs, consts))
        with pytest.raises(GraphError, match=rf"node 0 \({op} 'n'\)"):
            verify(graph(op, bad, attrs, consts))
