"""write_onnx: the exported ONNX model, run in onnxruntime, computes what the graph computes.

References independent of the writer:
  - the four float MLPerf Tiny models: LiteRT running the original .tflite file (the hybrid
    KWS model, which LiteRT runs with activations quantized on the fly, is also checked against
    LiteRT running the same float graph written by frontend/tflite_writer);
  - small hand-built graphs, one per mapped op and option (strides, dilations, explicit and
    asymmetric pads, depth multipliers, groups, ceil-mode windows, ...): mcuforge's own float C
    (optimizer.calibrate.run_graph), and LiteRT on the graph written as TFLite whenever TFLite
    can express it.
Plus: the bytes are deterministic, the model passes onnx.checker, and what cannot be written
exactly raises ValueError naming the node or tensor.
"""
import zlib

import numpy as np
import onnx
import pytest

from conftest import mlperf_model, require  # tests/ has no __init__.py: pytest puts it on sys.path
from mcuforge.frontend.onnx_writer import write_onnx
from mcuforge.frontend.tflite_writer import write_tflite
from mcuforge.api import load
from mcuforge.ir.graph import Graph, Node, Quant, Tensor, verify
from mcuforge.runner import run_graph
from mcuforge.optimizer.pipeline import optimize

ort = require("onnxruntime")

TOLERANCE = 1e-5  # of max|reference output|
MLPERF = ["ad01_fp32", "kws_ref_model_float32", "pretrainedResnet", "vww_96_float"]
HYBRID_TOLERANCE = 2e-2  # LiteRT quantizes the hybrid KWS model's activations on the fly


# ----------------------------------------------------------------------------------------------
# Runners


def run_onnx(model: bytes, x: np.ndarray) -> np.ndarray:
    sess = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    name = sess.get_inputs()[0].name
    return np.stack([sess.run(None, {name: row})[0] for row in x])


def run_litert(model, x: np.ndarray) -> np.ndarray:
    """LiteRT on a .tflite path or flatbuffer bytes, one row of `x` per invocation."""
    from ai_edge_litert.interpreter import Interpreter
    it = (Interpreter(model_content=model) if isinstance(model, bytes)
          else Interpreter(model_path=str(model)))
    it.allocate_tensors()
    i, o = it.get_input_details()[0]["index"], it.get_output_details()[0]["index"]
    rows = []
    for row in x:
        it.set_tensor(i, row)
        it.invoke()
        rows.append(it.get_tensor(o).copy())
    return np.stack(rows)


def assert_close(got, ref, tolerance, what):
    got = got.reshape(ref.shape)
    err = np.abs(got.astype(np.float64) - ref).max() / max(np.abs(ref).max(), 1e-30)
    assert err <= tolerance, f"{what}: max error {err:.2e} of max|reference output|"


def random_rows(g: Graph, n: int, seed: int, scale: float = 1.0) -> np.ndarray:
    shape = g.tensors[g.inputs[0]].shape
    return (scale * np.random.default_rng(seed).standard_normal((n, *shape))).astype(np.float32)


# ----------------------------------------------------------------------------------------------
# The MLPerf Tiny float models against LiteRT


@pytest.fixture(scope="module")
def exported():
    """stem -> (optimized graph, ONNX bytes), built once per module."""
    cache = {}

    def get(stem):
        if stem not in cache:
            g = optimize(load(mlperf_model(stem)))
            cache[stem] = (g, write_onnx(g))
        return cache[stem]
    return get


@pytest.mark.parametrize("stem", MLPERF)
def test_mlperf_export_matches_litert(stem, exported):
    path = mlperf_model(stem)
    g, model = exported(stem)
    x = random_rows(g, 4, seed=7)
    got = run_onnx(model, x)
    if stem == "kws_ref_model_float32":
        # the same float graph written as TFLite runs LiteRT's float kernels
        assert_close(got, run_litert(write_tflite(g), x), TOLERANCE, f"{stem} (float weights)")
        assert_close(got, run_litert(path, x), HYBRID_TOLERANCE, f"{stem} (hybrid)")
    else:
        assert_close(got, run_litert(path, x), TOLERANCE, stem)


@pytest.mark.parametrize("stem", MLPERF)
def test_mlperf_export_is_deterministic_and_checked(stem, exported):
    g, model = exported(stem)
    assert write_onnx(optimize(load(mlperf_model(stem)))) == model  # a fresh load, same bytes
    proto = onnx.load_from_string(model)
    onnx.checker.check_model(proto, full_check=True)
    # inputs and outputs keep the graph's names and NHWC shapes
    dims = [[d.dim_value for d in v.type.tensor_type.shape.dim] for v in proto.graph.input]
    assert [v.name for v in proto.graph.input] == g.inputs
    assert dims == [list(g.tensors[t].shape) for t in g.inputs]
    assert [v.name for v in proto.graph.output] == g.outputs


# ----------------------------------------------------------------------------------------------
# Hand-built graphs, one per op and option


class Builder:
    """A single-input float32 graph built node by node; output shapes of windowed ops are
    computed from their attributes (floor rounding unless given)."""

    def __init__(self, name: str, shape):
        self.name = name
        self.rng = np.random.default_rng(zlib.crc32(name.encode()))  # stable across runs
        self.tensors = {"x": Tensor("x", tuple(shape), "float32")}
        self.nodes = []
        self.last = "x"

    def const(self, shape, scale=1.0) -> str:
        name = f"c{len(self.tensors)}"
        data = (scale * self.rng.standard_normal(shape)).astype(np.float32)
        self.tensors[name] = Tensor(name, tuple(shape), "float32", data=data)
        return name

    def node(self, op, inputs, shape, **attrs) -> str:
        out = f"t{len(self.nodes)}_{op}"
        self.tensors[out] = Tensor(out, tuple(shape), "float32")
        self.nodes.append(Node(op, tuple(inputs), (out,), attrs, name=out))
        self.last = out
        return out

    def shape(self, name):
        return self.tensors[name].shape

    def conv(self, x, cout, k, stride=(1, 1), dilation=(1, 1), padding=(0, 0, 0, 0),
             activation="none", groups=1, bias=True) -> str:
        n, h, w, c = self.shape(x)
        wt = self.const((cout, *k, c // groups), 1.0 / np.sqrt(k[0] * k[1] * c // groups))
        ins = (x, wt, self.const((cout,), 0.1)) if bias else (x, wt)
        oh, ow = window_out((h, w), k, stride, dilation, padding)
        return self.node("conv2d", ins, (n, oh, ow, cout), stride=stride, dilation=dilation,
                         padding=padding, activation=activation)

    def depthwise(self, x, mult, k, stride=(1, 1), dilation=(1, 1), padding=(0, 0, 0, 0),
                  activation="none") -> str:
        n, h, w, c = self.shape(x)
        ins = (x, self.const((1, *k, c * mult), 1.0 / k[0]), self.const((c * mult,), 0.1))
        oh, ow = window_out((h, w), k, stride, dilation, padding)
        return self.node("depthwise_conv2d", ins, (n, oh, ow, c * mult), stride=stride,
                         dilation=dilation, padding=padding, depth_multiplier=mult,
                         activation=activation)

    def pool(self, op, x, k, stride, padding=(0, 0, 0, 0), activation="none", ceil=False,
             **extra) -> str:
        n, h, w, c = self.shape(x)
        oh, ow = window_out((h, w), k, stride, (1, 1), padding, ceil)
        return self.node(op, (x,), (n, oh, ow, c), filter=k, stride=stride, padding=padding,
                         activation=activation, **extra)

    def graph(self) -> Graph:
        return verify(Graph(dict(self.tensors), list(self.nodes), ["x"], [self.last],
                            name=self.name))


def window_out(in_hw, k, stride, dilation, padding, ceil=False) -> tuple:
    top, bottom, left, right = padding
    out = []
    for size, kk, s, d, pad in zip(in_hw, k, stride, dilation, (top + bottom, left + right)):
        span = size + pad - (kk - 1) * d - 1
        out.append((-(-span // s) if ceil else span // s) + 1)
    return tuple(out)


def case_conv_same_stride2_relu6():
    b = Builder("conv_same_stride2_relu6", (1, 8, 8, 3))
    b.conv("x", 5, (3, 3), stride=(2, 2), padding=(0, 1, 0, 1), activation="relu6")
    return b.graph()


def case_conv_same_dilated_relu():
    b = Builder("conv_same_dilated_relu", (1, 10, 9, 4))
    b.conv("x", 6, (3, 3), dilation=(2, 2), padding=(2, 2, 2, 2), activation="relu")
    return b.graph()


def case_conv_rect_valid_no_bias():
    b = Builder("conv_rect_valid_no_bias", (1, 12, 7, 2))
    b.conv("x", 4, (4, 2), stride=(2, 1), bias=False)
    return b.graph()


def case_conv_asymmetric_pads():  # neither SAME nor VALID
    b = Builder("conv_asymmetric_pads", (1, 7, 9, 2))
    b.conv("x", 3, (3, 2), stride=(2, 1), dilation=(1, 2), padding=(2, 0, 1, 3),
           activation="relu_n1_to_1")
    return b.graph()


def case_conv_grouped():
    b = Builder("conv_grouped", (1, 6, 6, 4))
    b.conv("x", 6, (3, 3), padding=(1, 1, 1, 1), groups=2)
    return b.graph()


def case_depthwise_multiplier2_stride2_relu():
    b = Builder("depthwise_multiplier2_stride2_relu", (1, 9, 9, 3))
    b.depthwise("x", 2, (3, 3), stride=(2, 2), padding=(1, 1, 1, 1), activation="relu")
    return b.graph()


def case_depthwise_dilated_valid_clamp():
    b = Builder("depthwise_dilated_valid_clamp", (1, 8, 8, 4))
    b.depthwise("x", 1, (3, 3), dilation=(2, 2), activation="relu_n1_to_1")
    return b.graph()


def case_depthwise_asymmetric_pads():
    b = Builder("depthwise_asymmetric_pads", (1, 7, 6, 2))
    b.depthwise("x", 3, (2, 3), stride=(1, 2), padding=(0, 2, 1, 0))
    return b.graph()


def case_max_pool_same_relu():
    b = Builder("max_pool_same_relu", (1, 7, 7, 3))
    b.pool("max_pool2d", "x", (3, 3), (2, 2), padding=(1, 1, 1, 1), activation="relu")
    return b.graph()


def case_avg_pool_same():  # padded taps do not count, as in TFLite
    b = Builder("avg_pool_same", (1, 7, 6, 3))
    b.pool("avg_pool2d", "x", (3, 2), (2, 2), padding=(1, 1, 0, 0))
    return b.graph()


def case_avg_pool_global():  # what the MLPerf models end with
    b = Builder("avg_pool_global", (1, 5, 3, 4))
    b.pool("avg_pool2d", "x", (5, 3), (5, 3))
    return b.graph()


def case_avg_pool_count_include_pad():
    b = Builder("avg_pool_count_include_pad", (1, 6, 6, 2))
    b.pool("avg_pool2d", "x", (3, 3), (2, 2), padding=(1, 0, 1, 0), count_include_pad=True)
    return b.graph()


def case_max_pool_ceil_dilated():
    b = Builder("max_pool_ceil_dilated", (1, 8, 8, 2))
    b.pool("max_pool2d", "x", (2, 2), (2, 2), ceil=True, dilation=(2, 2))
    return b.graph()


def case_fully_connected_rank4_relu():  # the input is flattened to [1, H*W*C]
    b = Builder("fully_connected_rank4_relu", (1, 2, 2, 3))
    b.node("fully_connected", ("x", b.const((5, 12), 0.3), b.const((5,), 0.1)), (1, 5),
           activation="relu")
    return b.graph()


def case_fully_connected_keep_dims_no_bias():
    b = Builder("fully_connected_keep_dims_no_bias", (1, 3, 6))
    b.node("fully_connected", ("x", b.const((4, 6), 0.3)), (1, 3, 4), activation="relu6")
    return b.graph()


def case_add_mul_broadcast():
    b = Builder("add_mul_broadcast", (1, 4, 4, 3))
    y = b.node("add", ("x", b.const((3,))), (1, 4, 4, 3), activation="relu")
    b.node("mul", (y, b.const((1, 1, 1, 3))), (1, 4, 4, 3), activation="relu6")
    return b.graph()


def case_add_two_branches():  # one tensor read by two layers, then joined
    b = Builder("add_two_branches", (1, 6, 6, 4))
    left = b.conv("x", 4, (3, 3), padding=(1, 1, 1, 1), activation="relu")
    right = b.conv("x", 4, (1, 1))
    b.node("add", (left, right), (1, 6, 6, 4), activation="none")
    return b.graph()


def case_concat():
    b = Builder("concat", (1, 3, 3, 2))
    b.node("concat", (b.const((1, 3, 3, 1)), "x"), (1, 3, 3, 3), axis=3, activation="none")
    return b.graph()


def case_concat_relu6():
    b = Builder("concat_relu6", (1, 3, 3, 2))
    r = b.node("relu", ("x",), (1, 3, 3, 2))
    b.node("concat", ("x", r, b.const((1, 3, 3, 1))), (1, 3, 3, 5), axis=3, activation="relu6")
    return b.graph()


def case_reshape_softmax_beta():
    b = Builder("reshape_softmax_beta", (1, 2, 2, 3))
    r = b.node("reshape", ("x",), (1, 12))
    b.node("softmax", (r,), (1, 12), beta=0.5)
    return b.graph()


def case_softmax_axis():
    b = Builder("softmax_axis", (1, 3, 4, 5))
    b.node("softmax", ("x",), (1, 3, 4, 5), beta=1.0, axis=2)
    return b.graph()


def case_pad_constant():
    b = Builder("pad_constant", (1, 3, 3, 2))
    b.node("pad", ("x",), (1, 6, 5, 2), pads=((0, 0), (1, 2), (2, 0), (0, 0)))
    return b.graph()


def case_pad_value():
    b = Builder("pad_value", (1, 3, 3, 2))
    b.tensors["v"] = Tensor("v", (1,), "float32", data=np.array([0.75], np.float32))
    b.node("pad", ("x", "", "v"), (1, 4, 6, 2), pads=((0, 0), (0, 1), (1, 2), (0, 0)))
    return b.graph()


def case_pad_reflect():
    b = Builder("pad_reflect", (1, 4, 4, 2))
    b.node("pad", ("x",), (1, 6, 5, 2), pads=((0, 0), (1, 1), (0, 1), (0, 0)), mode="reflect")
    return b.graph()


def case_mean_keep_dims():
    b = Builder("mean_keep_dims", (1, 4, 5, 3))
    b.node("mean", ("x",), (1, 1, 1, 3), axes=(1, 2), keep_dims=True)
    return b.graph()


def case_mean_drop_dims():
    b = Builder("mean_drop_dims", (1, 4, 5, 3))
    b.node("mean", ("x",), (1, 4, 3), axes=(2,), keep_dims=False)
    return b.graph()


def case_reduce_sum_max():
    b = Builder("reduce_sum_max", (1, 4, 5, 3))
    s = b.node("reduce", ("x",), (1, 4, 1, 3), fn="sum", axes=(2,), keep_dims=True)
    b.node("reduce", (s,), (1, 3), fn="max", axes=(1, 2), keep_dims=False)
    return b.graph()


def case_transpose():
    b = Builder("transpose", (1, 2, 3, 4))
    b.node("transpose", ("x",), (1, 4, 2, 3), perm=(0, 3, 1, 2))
    return b.graph()


def unary_case(op, **attrs):
    def build():
        b = Builder(op, (1, 4, 4, 3))
        b.node(op, ("x",), (1, 4, 4, 3), **attrs)
        return b.graph()
    build.__name__ = f"case_{op}"
    return build


BOTH, C_ONLY = ("c", "litert"), ("c",)
# (builder, references): "c" = mcuforge's float C, "litert" = LiteRT on the graph written by
# frontend/tflite_writer (only where TFLite expresses the op: SAME / VALID windows, no groups,
# ...). concat with a fused activation has a test of its own below.
CASES = [
    (case_conv_same_stride2_relu6, BOTH), (case_conv_same_dilated_relu, BOTH),
    (case_conv_rect_valid_no_bias, BOTH), (case_conv_asymmetric_pads, C_ONLY),
    (case_conv_grouped, C_ONLY), (case_depthwise_multiplier2_stride2_relu, BOTH),
    (case_depthwise_dilated_valid_clamp, BOTH), (case_depthwise_asymmetric_pads, C_ONLY),
    (case_max_pool_same_relu, BOTH), (case_avg_pool_same, BOTH), (case_avg_pool_global, BOTH),
    (case_avg_pool_count_include_pad, C_ONLY), (case_max_pool_ceil_dilated, C_ONLY),
    (case_fully_connected_rank4_relu, BOTH), (case_fully_connected_keep_dims_no_bias, BOTH),
    (case_add_mul_broadcast, BOTH), (case_add_two_branches, BOTH), (case_concat, BOTH),
    (case_reshape_softmax_beta, BOTH),
    (case_softmax_axis, C_ONLY), (case_pad_constant, BOTH), (case_pad_value, BOTH),
    (case_pad_reflect, C_ONLY), (case_mean_keep_dims, BOTH), (case_mean_drop_dims, BOTH),
    (case_reduce_sum_max, C_ONLY), (case_transpose, C_ONLY),
    (unary_case("logistic"), BOTH), (unary_case("tanh"), BOTH), (unary_case("relu"), BOTH),
    (unary_case("relu6"), BOTH), (unary_case("leaky_relu", alpha=0.2), BOTH),
    (unary_case("hard_swish"), BOTH),
]


@pytest.mark.parametrize("build,references", CASES, ids=[c[0].__name__[5:] for c in CASES])
def test_op_matches_float_c_and_litert(build, references):
    g = build()
    model = write_onnx(g)
    x = random_rows(g, 3, seed=3, scale=2.0)
    got = run_onnx(model, x)
    if "c" in references:
        assert_close(got, run_graph(g, [x])[0].astype(np.float64), TOLERANCE,
                     f"{g.name} against mcuforge's float C")
    if "litert" in references:
        assert_close(got, run_litert(write_tflite(g), x).astype(np.float64), TOLERANCE,
                     f"{g.name} against LiteRT")


def test_concat_fused_activation_matches_numpy():
    """mcuforge's C cannot compile concat with a fused activation and LiteRT leaves the
    activation out, so numpy is the reference here."""
    g = case_concat_relu6()
    x = random_rows(g, 3, seed=3, scale=2.0)
    const = next(t.data for t in g.tensors.values() if t.is_const)
    parts = [x, np.maximum(x, 0.0), np.broadcast_to(const, x.shape[:-1] + (1,))]
    ref = np.clip(np.concatenate(parts, axis=-1), 0.0, 6.0).astype(np.float64)
    assert_close(run_onnx(write_onnx(g), x), ref, TOLERANCE, g.name)


def test_layout_contract():
    """The layout contract: 2-D convs and pools are wrapped in NHWC <-> NCHW transposes with
    ONNX's pad order, fused activations sit inside them, weights are OIHW / (C*M)1HW."""
    model = onnx.load_from_string(write_onnx(case_depthwise_asymmetric_pads()))
    ops = [n.op_type for n in model.graph.node]
    assert ops == ["Transpose", "Conv", "Transpose"]
    conv = model.graph.node[1]
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in conv.attribute}
    assert attrs["pads"] == [0, 1, 2, 0] and attrs["group"] == 2 and attrs["strides"] == [1, 2]
    weights = {i.name: onnx.numpy_helper.to_array(i) for i in model.graph.initializer}
    assert weights[conv.input[1]].shape == (6, 1, 2, 3)
    relu6 = onnx.load_from_string(write_onnx(case_conv_same_stride2_relu6()))
    assert [n.op_type for n in relu6.graph.node] == ["Transpose", "Conv", "Clip", "Transpose"]


# ----------------------------------------------------------------------------------------------
# Determinism and errors


@pytest.mark.parametrize("build", [c[0] for c in CASES[:6]] + [case_concat_relu6])
def test_deterministic(build):
    assert write_onnx(build()) == write_onnx(build())


def test_int8_graph_is_refused_naming_the_tensor():
    g = case_fully_connected_rank4_relu()
    w = next(n for n in g.nodes).inputs[1]
    q = np.round(g.tensors[w].data * 100).astype(np.int8)
    g.tensors[w] = Tensor(w, g.tensors[w].shape, "int8", data=q, quant=Quant((0.01,), (0,)))
    with pytest.raises(ValueError, match=f"fully_connected '.*': tensor '{w}' is quantized int8"):
        write_onnx(g)


def test_unmapped_op_is_refused_naming_the_node():
    b = Builder("cumsum", (1, 4))
    b.node("cumsum", ("x",), (1, 4), axis=1, exclusive=False, reverse=False)
    with pytest.raises(ValueError, match="cumsum 't0_cumsum': op 'cumsum' has no ONNX mapping"):
        write_onnx(b.graph())


def test_window_onnx_cannot_express_is_refused():
    g = case_conv_same_stride2_relu6()
    node = g.nodes[0]
    out = g.tensors[node.outputs[0]]  # one row too many for the pads
    g.tensors[out.name] = Tensor(out.name, (1, 5, 4, 5), "float32")
    # graph.verify, which write_onnx runs first, refuses the output size too
    with pytest.raises(ValueError, match=r"conv2d 't0_conv2d'.*output"):
        write_onnx(g)
