"""ONNX layer operators (float32) end to end: Conv, ConvTranspose, Gemm, MatMul, BatchNormalization,
InstanceNormalization, LayerNormalization, MaxPool, AveragePool, GlobalAveragePool, GlobalMaxPool,
LSTM and GRU.

1. Models built with onnx.helper, compiled to C, built and run on the host, against onnxruntime.
2. ONNX's own backend node tests for these operators through the same path: every case that
   imports without UnsupportedOpError must pass; the cases that may not import are listed below
   with the reason.
3. The loop-IR evaluator runs the new lowerings and agrees with the generated C.
"""
import zlib

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper
from conftest import require, unavailable

from mcuforge.codegen_c.evaluate_graph import run_graph
from mcuforge.frontend.onnx import CONVERTERS, load_onnx
from mcuforge import runner
from mcuforge.ir.errors import ModelError, UnsupportedOpError

ort = require("onnxruntime")

RTOL, ATOL = 1e-4, 1e-5


def _model(nodes, inputs: dict, inits: dict, outputs=("y",), opset=17):
    info = lambda name, shape: helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)
    g = helper.make_graph(
        nodes, "m", [info(n, s) for n, s in inputs.items()], [info(n, None) for n in outputs],
        [numpy_helper.from_array(np.asarray(v, np.float32), k) for k, v in inits.items()])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)


def _run_both(model, feeds: dict, reference="onnxruntime"):
    """(ours, the reference's): lists of output arrays in graph order. The reference is
    onnxruntime, or onnx's own evaluator where onnxruntime lacks a variant."""
    if reference == "onnx":
        from onnx.reference import ReferenceEvaluator
        ref = ReferenceEvaluator(model).run(None, feeds)
    else:
        sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
        ref = sess.run(None, feeds)
    got = runner.run(model.SerializeToString(), feeds)
    got = list(got.values()) if isinstance(got, dict) else [got]
    return got, ref


def _check(model, feeds: dict, reference="onnxruntime"):
    got, ref = _run_both(model, feeds, reference)
    assert len(got) == len(ref)
    for g, r in zip(got, ref):
        assert g.shape == r.shape
        np.testing.assert_allclose(g, r, rtol=RTOL, atol=ATOL)


def _rng(name: str):
    return np.random.default_rng(zlib.crc32(name.encode()))


def _needs(*ops):
    """Models mixing in operators other converters provide run when those exist."""
    missing = [op for op in ops if op not in CONVERTERS]
    if missing:
        unavailable(f"no converter for {missing} in this tree")


# ---- single-operator models -------------------------------------------------------------

def case(name, op, x_shape, params=None, opset=17, outputs=("y",), **attrs):
    """A one-node model: input x, then `params` in order: name -> shape of a constant, RT(shape)
    for a runtime input, VAR(n) for a positive constant vector (a variance)."""
    return pytest.param(op, x_shape, params or {}, outputs, opset, attrs, id=name)


def RT(*shape):
    return ("runtime", shape)


def VAR(n):
    return ("variance", (n,))


CONV = [
    case("conv_pads_strides", "Conv", (1, 4, 7, 6), {"w": (6, 4, 3, 3), "b": (6,)},
         pads=[1, 0, 1, 2], strides=[2, 1]),
    case("conv_no_bias_dilated", "Conv", (2, 3, 9, 9), {"w": (5, 3, 3, 2)}, dilations=[2, 3]),
    case("conv_same_upper_s2", "Conv", (1, 3, 8, 7), {"w": (4, 3, 4, 3), "b": (4,)},
         auto_pad="SAME_UPPER", strides=[2, 2]),
    case("conv_same_lower_s2", "Conv", (1, 3, 8, 7), {"w": (4, 3, 4, 3), "b": (4,)},
         auto_pad="SAME_LOWER", strides=[2, 2]),
    case("conv_valid", "Conv", (1, 2, 6, 6), {"w": (3, 2, 3, 3), "b": (3,)}, auto_pad="VALID"),
    case("conv_grouped", "Conv", (1, 6, 5, 5), {"w": (4, 3, 3, 3), "b": (4,)}, group=2,
         pads=[1, 1, 1, 1]),
    case("conv_grouped_3", "Conv", (1, 6, 5, 5), {"w": (9, 2, 1, 1)}, group=3),
    case("conv_depthwise", "Conv", (1, 5, 6, 6), {"w": (5, 1, 3, 3), "b": (5,)}, group=5,
         pads=[1, 1, 1, 1]),
    case("conv_depthwise_multiplier2", "Conv", (1, 3, 7, 5), {"w": (6, 1, 3, 3), "b": (6,)},
         group=3, strides=[2, 2], auto_pad="SAME_UPPER"),
    case("conv_1d", "Conv", (2, 3, 11), {"w": (4, 3, 3), "b": (4,)}, pads=[2, 1], strides=[2]),
    case("conv_1d_depthwise_dilated", "Conv", (1, 4, 12), {"w": (4, 1, 3)}, group=4,
         dilations=[2], pads=[2, 1]),
]

CONV_TRANSPOSE = [
    case("convtranspose_basic", "ConvTranspose", (1, 3, 4, 5), {"w": (3, 2, 3, 3), "b": (2,)}),
    case("convtranspose_strides_pads", "ConvTranspose", (1, 2, 4, 4), {"w": (2, 3, 3, 3)},
         strides=[2, 3], pads=[1, 0, 1, 2]),
    case("convtranspose_output_padding", "ConvTranspose", (1, 2, 3, 4),
         {"w": (2, 2, 3, 3), "b": (2,)}, strides=[2, 2], output_padding=[1, 0]),
    case("convtranspose_output_shape", "ConvTranspose", (1, 2, 3, 3), {"w": (2, 2, 3, 3)},
         strides=[3, 2], output_shape=[10, 8]),
    case("convtranspose_output_shape_cropped", "ConvTranspose", (1, 2, 4, 4), {"w": (2, 3, 3, 4)},
         strides=[2, 2], output_shape=[6, 5]),
    case("convtranspose_same_upper", "ConvTranspose", (1, 2, 3, 3), {"w": (2, 3, 3, 3)},
         strides=[2, 2], auto_pad="SAME_UPPER"),
    case("convtranspose_same_lower", "ConvTranspose", (1, 2, 4, 4), {"w": (2, 3, 3, 4)},
         strides=[3, 2], auto_pad="SAME_LOWER"),
    case("convtranspose_dilations", "ConvTranspose", (1, 1, 4, 4), {"w": (1, 2, 2, 2)},
         dilations=[2, 2]),
    case("convtranspose_group", "ConvTranspose", (1, 4, 3, 3), {"w": (4, 3, 3, 3), "b": (6,)},
         group=2, strides=[2, 1]),
    case("convtranspose_1d", "ConvTranspose", (1, 2, 5), {"w": (2, 3, 4)}, strides=[3],
         pads=[1, 1]),
]

GEMM = [
    case("gemm_const_b_vector_c", "Gemm", (3, 5), {"b": (5, 4), "c": (4,)}),
    case("gemm_transb_alpha_beta", "Gemm", (2, 6), {"b": (3, 6), "c": (1, 3)}, transB=1,
         alpha=0.5, beta=2.0),
    case("gemm_transa_matrix_c", "Gemm", (5, 3), {"b": (5, 4), "c": (3, 4)}, transA=1, beta=0.5),
    case("gemm_scalar_c", "Gemm", (2, 3), {"b": (3, 4), "c": ()}),
    case("gemm_column_c", "Gemm", (3, 4), {"b": (4, 2), "c": (3, 1)}),
    case("gemm_runtime_b", "Gemm", (3, 4), {"b": RT(2, 4), "c": (2,)}, transB=1, alpha=1.5),
    case("gemm_runtime_c", "Gemm", (3, 4), {"b": (4, 2), "c": RT(3, 2)}, beta=0.25),
    case("gemm_runtime_all", "Gemm", (4, 3), {"b": RT(4, 5), "c": RT(5)}, transA=1,
         alpha=2.0, beta=3.0),
    case("gemm_no_c", "Gemm", (2, 7), {"b": (7, 3)}, alpha=0.1),
]

MATMUL = [
    case("matmul_const_2d", "MatMul", (3, 5), {"b": (5, 4)}),
    case("matmul_const_2d_batched_a", "MatMul", (2, 3, 5), {"b": (5, 4)}),
    case("matmul_const_1d_a", "MatMul", (5,), {"b": (5, 4)}),
    case("matmul_runtime_batched", "MatMul", (2, 3, 4), {"b": RT(2, 4, 5)}),
    case("matmul_runtime_broadcast", "MatMul", (2, 1, 3, 4), {"b": RT(3, 4, 2)}),
    case("matmul_runtime_1d_b", "MatMul", (2, 3, 4), {"b": RT(4)}),
    case("matmul_runtime_1d_a", "MatMul", (4,), {"b": RT(2, 4, 3)}),
    case("matmul_const_3d_b", "MatMul", (2, 3, 4), {"b": (2, 4, 5)}),
]

NORMS = [
    case("batchnorm_4d", "BatchNormalization", (2, 3, 4, 5),
         {"s": (3,), "bias": (3,), "mean": (3,), "var": VAR(3)}, epsilon=1e-3),
    case("batchnorm_2d", "BatchNormalization", (4, 6),
         {"s": (6,), "bias": (6,), "mean": (6,), "var": VAR(6)}),
    case("batchnorm_3d", "BatchNormalization", (2, 3, 7),
         {"s": (3,), "bias": (3,), "mean": (3,), "var": VAR(3)}),
    case("instancenorm_4d", "InstanceNormalization", (2, 3, 4, 5), {"s": (3,), "bias": (3,)},
         epsilon=1e-3),
    case("instancenorm_3d_runtime_params", "InstanceNormalization", (2, 4, 6),
         {"s": RT(4), "bias": RT(4)}),
    case("layernorm_last_axis", "LayerNormalization", (2, 3, 8), {"w": (8,), "b": (8,)}),
    case("layernorm_axis1_stats", "LayerNormalization", (2, 3, 4, 5), {"w": (3, 4, 5), "b": (5,)},
         outputs=("y", "mean", "inv"), axis=1, epsilon=1e-2),
    case("layernorm_no_bias_inv_only", "LayerNormalization", (3, 6), {"w": (6,)},
         outputs=("y", "", "inv"), axis=-1),
    case("layernorm_large_values", "LayerNormalization", (2, 16), {"w": (16,)}, axis=0,
         scale_x=1e6),
]

POOLS = [
    case("maxpool_pads_strides", "MaxPool", (1, 3, 7, 6), kernel_shape=[3, 2], pads=[1, 0, 1, 1],
         strides=[2, 2]),
    case("maxpool_ceil", "MaxPool", (1, 2, 7, 7), kernel_shape=[2, 2], strides=[2, 2],
         ceil_mode=1),
    case("maxpool_dilations", "MaxPool", (1, 2, 8, 8), kernel_shape=[2, 3], dilations=[2, 2],
         pads=[1, 1, 1, 1]),
    case("maxpool_same_lower", "MaxPool", (1, 2, 6, 5), kernel_shape=[3, 3], strides=[2, 2],
         auto_pad="SAME_LOWER"),
    case("maxpool_1d", "MaxPool", (2, 3, 10), kernel_shape=[3], strides=[2], pads=[1, 1]),
    case("avgpool_pads_exclude", "AveragePool", (1, 3, 6, 7), kernel_shape=[3, 3],
         pads=[1, 1, 1, 1], strides=[2, 2]),
    case("avgpool_pads_include", "AveragePool", (1, 3, 6, 7), kernel_shape=[3, 3],
         pads=[1, 2, 1, 0], strides=[2, 2], count_include_pad=1),
    case("avgpool_ceil_include", "AveragePool", (1, 2, 7, 7), kernel_shape=[3, 3],
         pads=[1, 1, 1, 1], strides=[3, 3], ceil_mode=1, count_include_pad=1),
    case("avgpool_same_upper", "AveragePool", (1, 2, 5, 6), kernel_shape=[2, 3],
         auto_pad="SAME_UPPER", strides=[2, 2]),
    case("avgpool_1d", "AveragePool", (1, 3, 9), kernel_shape=[4], strides=[2], pads=[1, 2]),
    case("avgpool_dilations_opset19", "AveragePool", (1, 2, 9, 9), opset=19, kernel_shape=[2, 2],
         dilations=[2, 3], pads=[1, 1, 0, 1]),
    case("globalavgpool", "GlobalAveragePool", (2, 5, 4, 3)),
    case("globalmaxpool", "GlobalMaxPool", (2, 5, 4, 3)),
    case("globalavgpool_1d", "GlobalAveragePool", (1, 4, 9)),
    case("globalmaxpool_3d", "GlobalMaxPool", (1, 3, 2, 3, 4)),
]


RECURRENT = [
    case("lstm_forward", "LSTM", (5, 2, 3), {"w": (1, 16, 3), "r": (1, 16, 4), "b": (1, 32)},
         outputs=("y", "y_h", "y_c"), hidden_size=4),
    case("lstm_states_peepholes", "LSTM", (4, 3, 2),
         {"w": (1, 12, 2), "r": (1, 12, 3), "b": (1, 24), "seq": None, "h0": RT(1, 3, 3),
          "c0": RT(1, 3, 3), "p": (1, 9)}, outputs=("y", "y_h", "y_c"), hidden_size=3),
    case("lstm_reverse_clip", "LSTM", (6, 1, 3), {"w": (1, 8, 3), "r": (1, 8, 2)},
         outputs=("", "y_h"), direction="reverse", clip=0.7, hidden_size=2),
    case("lstm_bidirectional_batchwise", "LSTM", (2, 4, 3),
         {"w": (2, 12, 3), "r": (2, 12, 3), "b": (2, 24), "seq": None, "h0": RT(2, 2, 3)},
         outputs=("y", "y_h", "y_c"), direction="bidirectional", layout=1, hidden_size=3),
    case("lstm_input_forget", "LSTM", (3, 2, 2), {"w": (1, 8, 2), "r": (1, 8, 2), "b": (1, 16)},
         outputs=("y",), input_forget=1, hidden_size=2),
    case("gru_forward", "GRU", (5, 2, 3), {"w": (1, 12, 3), "r": (1, 12, 4), "b": (1, 24)},
         outputs=("y", "y_h"), hidden_size=4),
    case("gru_linear_before_reset_h0", "GRU", (4, 2, 3),
         {"w": (1, 9, 3), "r": (1, 9, 3), "b": (1, 18), "seq": None, "h0": RT(1, 2, 3)},
         outputs=("y", "y_h"), linear_before_reset=1, hidden_size=3),
    case("gru_bidirectional_h0", "GRU", (3, 2, 2),
         {"w": (2, 9, 2), "r": (2, 9, 3), "b": (2, 18), "seq": None, "h0": RT(2, 2, 3)},
         outputs=("y", "y_h"), direction="bidirectional", hidden_size=3),
    case("gru_reverse_clip", "GRU", (5, 2, 3), {"w": (1, 6, 3), "r": (1, 6, 2)},
         outputs=("y", "y_h"), direction="reverse", clip=0.5, hidden_size=2),
    case("gru_batchwise_lbr", "GRU", (2, 5, 3), {"w": (1, 6, 3), "r": (1, 6, 2), "b": (1, 12)},
         outputs=("y", "y_h"), layout=1, linear_before_reset=1, hidden_size=2),
]


def _single(name, op, x_shape, params, outputs, opset, attrs):
    rng = _rng(name)
    attrs = dict(attrs)
    scale_x = attrs.pop("scale_x", 1.0)
    inits, inputs = {}, {"x": x_shape}
    feeds = {"x": (scale_x * rng.standard_normal(x_shape)).astype(np.float32)}
    for k, spec in params.items():
        if spec is None:  # an absent optional input
            continue
        kind, shape = spec if spec and isinstance(spec[0], str) else ("const", spec)
        if kind == "runtime":
            inputs[k] = shape
            feeds[k] = rng.standard_normal(shape).astype(np.float32)
        else:
            inits[k] = rng.uniform(0.5, 2.0, shape) if kind == "variance" \
                else rng.standard_normal(shape)
    node = helper.make_node(op, ["x", *[k if v is not None else "" for k, v in params.items()]],
                            list(outputs), **attrs)
    return _model([node], inputs, inits, [o for o in outputs if o], opset), feeds


@pytest.mark.parametrize("op,x_shape,params,outputs,opset,attrs",
                         CONV + CONV_TRANSPOSE + GEMM + MATMUL + NORMS + POOLS + RECURRENT)
def test_single_op_matches_onnxruntime(request, op, x_shape, params, outputs, opset, attrs):
    # onnxruntime has no batch-major (layout 1) recurrent layers
    reference = "onnx" if attrs.get("layout") else "onnxruntime"
    _check(*_single(request.node.callspec.id, op, x_shape, params, outputs, opset, attrs),
           reference)


def test_conv_batchnorm_relu():
    _needs("Relu")
    rng = _rng("cbr")
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("BatchNormalization", ["c", "s", "bb", "m", "v"], ["n"]),
             helper.make_node("Relu", ["n"], ["y"])]
    inits = dict(w=rng.standard_normal((8, 3, 3, 3)), b=rng.standard_normal(8),
                 s=rng.standard_normal(8), bb=rng.standard_normal(8), m=rng.standard_normal(8),
                 v=rng.uniform(0.5, 2, 8))
    x = rng.standard_normal((1, 3, 10, 10)).astype(np.float32)
    _check(_model(nodes, {"x": x.shape}, inits), {"x": x})


def test_depthwise_separable_residual_gemm_head():
    """Depthwise + pointwise conv with a residual add, pooling and a Gemm classifier head."""
    _needs("Relu", "Add", "Flatten")
    rng = _rng("dsr")
    nodes = [helper.make_node("Conv", ["x", "w0", "b0"], ["c0"], pads=[1, 1, 1, 1], strides=[2, 2]),
             helper.make_node("Relu", ["c0"], ["r0"]),
             helper.make_node("Conv", ["r0", "dw", "db"], ["c1"], group=8, pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node("Conv", ["r1", "pw", "pb"], ["c2"]),
             helper.make_node("Add", ["c2", "r0"], ["s"]),
             helper.make_node("MaxPool", ["s"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
             helper.make_node("GlobalAveragePool", ["p"], ["g"]),
             helper.make_node("Flatten", ["g"], ["f"]),
             helper.make_node("Gemm", ["f", "fw", "fb"], ["y"], transB=1)]
    inits = dict(w0=rng.standard_normal((8, 3, 3, 3)), b0=rng.standard_normal(8),
                 dw=rng.standard_normal((8, 1, 3, 3)), db=rng.standard_normal(8),
                 pw=rng.standard_normal((8, 8, 1, 1)), pb=rng.standard_normal(8),
                 fw=rng.standard_normal((10, 8)), fb=rng.standard_normal(10))
    x = rng.standard_normal((1, 3, 16, 16)).astype(np.float32)
    _check(_model(nodes, {"x": x.shape}, inits), {"x": x})


def test_unsupported_variants_are_reported():
    rng = _rng("unsupported")
    pool_idx = helper.make_node("MaxPool", ["x"], ["y", "i"], kernel_shape=[2, 2])
    conv3d = helper.make_node("Conv", ["x", "w"], ["y"])
    bn_train = helper.make_node("BatchNormalization", ["x", "s", "b", "m", "v"],
                                ["y", "running_mean", "running_var"], training_mode=1)
    for node, inits, shape in (
            (pool_idx, {}, (1, 1, 4, 4)),
            (conv3d, {"w": rng.standard_normal((1, 1, 2, 2, 2))}, (1, 1, 3, 3, 3)),
            (bn_train, {k: np.ones(2) for k in "sbmv"}, (1, 2, 3, 3))):
        model = _model([node], {"x": shape}, inits, list(node.output))
        with pytest.raises(UnsupportedOpError):
            load_onnx(model)


# ---- the loop-IR evaluator agrees with the generated C ----------------------------------

@pytest.mark.parametrize("name", ["conv_grouped", "convtranspose_group", "matmul_runtime_broadcast",
                                  "instancenorm_4d", "layernorm_axis1_stats", "batchnorm_3d",
                                  "avgpool_ceil_include", "maxpool_dilations",
                                  "lstm_states_peepholes", "gru_bidirectional_h0"])
def test_loop_ir_evaluator_matches_c(name):
    (param,) = [p for p in CONV + CONV_TRANSPOSE + MATMUL + NORMS + POOLS + RECURRENT
                if p.id == name]
    model, feeds = _single(name, *param.values)
    g = load_onnx(model)
    values = run_graph(g, feeds)
    got = runner.run(model.SerializeToString(), feeds)
    got = list(got.values()) if isinstance(got, dict) else [got]
    for out, c_result in zip(g.outputs, got):
        # expf and tanhf: numpy's and the C library's may differ in the last bit
        np.testing.assert_allclose(values[out].reshape(c_result.shape), c_result,
                                   rtol=1e-6 if param.values[0] in ("LSTM", "GRU") else 0,
                                   atol=1e-7 if param.values[0] in ("LSTM", "GRU") else 0)


# ---- ONNX backend node tests ------------------------------------------------------------

PREFIXES = ("test_conv", "test_convtranspose", "test_gemm", "test_matmul", "test_batchnorm",
            "test_instancenorm", "test_layer_normalization", "test_maxpool", "test_averagepool",
            "test_globalaveragepool", "test_globalmaxpool", "test_lstm", "test_gru")
MY_OPS = {"Conv", "ConvTranspose", "Gemm", "MatMul", "BatchNormalization",
          "InstanceNormalization", "LayerNormalization", "MaxPool", "AveragePool",
          "GlobalAveragePool", "GlobalMaxPool", "LSTM", "GRU"}
# graph inputs (by position) that are parameters: mcuforge compiles them in as constants (the
# node tests feed weights as inputs); "runtime" variants keep them as inputs
PARAMS = {"test_conv": (1, 2), "test_convtranspose": (1, 2), "test_batchnorm": (1, 2, 3, 4),
          "test_instancenorm": (1, 2), "test_layer_normalization": (1, 2), "test_gemm": (1, 2),
          "test_matmul": (1,), "test_lstm": (1, 2, 3, 4, 5, 6, 7), "test_gru": (1, 2, 3, 4, 5)}
RUNTIME_VARIANTS = ("test_gemm", "test_matmul", "test_instancenorm", "test_lstm", "test_gru")
# Cases of these operators that may not import (UnsupportedOpError), each with its reason. Any
# other case of MY_OPS that fails to import is a failure.
UNSUPPORTED = {
    "test_averagepool_3d_default": "3-D pooling",
    "test_averagepool_3d_dilations_small": "3-D pooling",
    "test_averagepool_3d_dilations_large_count_include_pad_is_0_ceil_mode_is_True": "3-D pooling",
    "test_averagepool_3d_dilations_large_count_include_pad_is_0_ceil_mode_is_False": "3-D pooling",
    "test_averagepool_3d_dilations_large_count_include_pad_is_1_ceil_mode_is_True": "3-D pooling",
    "test_averagepool_3d_dilations_large_count_include_pad_is_1_ceil_mode_is_False": "3-D pooling",
    "test_maxpool_3d_default": "3-D pooling",
    "test_maxpool_3d_dilations": "3-D pooling",
    "test_maxpool_3d_dilations_use_ref_impl": "3-D pooling",
    "test_maxpool_3d_dilations_use_ref_impl_large": "3-D pooling",
    "test_convtranspose_3d": "3-D convolution",
    "test_maxpool_with_argmax_2d_precomputed_pads": "MaxPool's Indices output",
    "test_maxpool_with_argmax_2d_precomputed_strides": "MaxPool's Indices output",
    "test_batchnorm_example_training_mode": "training mode (running statistics outputs)",
    "test_batchnorm_epsilon_training_mode": "training mode (running statistics outputs)",
    "test_convinteger_with_padding": "ConvInteger: a quantized op, not a float layer",
    "test_convinteger_without_padding": "ConvInteger: a quantized op, not a float layer",
    "test_matmulinteger": "MatMulInteger: a quantized op, not a float layer",
    "test_lstm_with_peepholes[runtime]": "a runtime sequence_lens (must be constant and full)",
}
# Cases that import but are not run, each with its reason: none at present.
EXCLUDED = {}


def _node_cases():
    from onnx.backend.test.loader import load_model_tests
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cases = [c for c in load_model_tests(kind="node") if c.name.startswith(PREFIXES)]
    out = []
    for c in sorted(cases, key=lambda c: c.name):
        out.append(pytest.param(c, False, id=c.name))
        if c.name.startswith(tuple(p + "_" for p in RUNTIME_VARIANTS)):
            out.append(pytest.param(c, True, id=c.name + "[runtime]"))
    return out


def _bake(case, runtime: bool):
    """The case's model with its parameter inputs turned into initializers, and the data sets
    as (feeds, expected outputs)."""
    from onnx import ModelProto
    model = ModelProto()
    model.CopyFrom(case.model)
    positions = () if runtime else next((v for k, v in PARAMS.items()
                                         if case.name.startswith(k + "_") or case.name == k), ())
    inputs = list(model.graph.input)
    baked = {i for i in positions if i < len(inputs)}
    sets = []
    for ins, outs in case.data_sets:
        feeds = {inp.name: np.asarray(v) for k, (inp, v) in enumerate(zip(inputs, ins))
                 if k not in baked}
        sets.append((feeds, outs))
    if baked and case.data_sets:
        ins = case.data_sets[0][0]
        for k in sorted(baked):
            model.graph.initializer.append(numpy_helper.from_array(np.asarray(ins[k]),
                                                                   inputs[k].name))
        del model.graph.input[:]
        model.graph.input.extend([inp for k, inp in enumerate(inputs) if k not in baked])
    return model, sets


@pytest.mark.parametrize("case,runtime", _node_cases())
def test_onnx_node(case, runtime):
    name = case.name + ("[runtime]" if runtime else "")
    if name in EXCLUDED:
        pytest.skip(EXCLUDED[name])
    model, sets = _bake(case, runtime)
    ops = {n.op_type for n in model.graph.node}
    try:
        g = load_onnx(model)
    except UnsupportedOpError:
        if ops <= MY_OPS and name not in UNSUPPORTED:
            raise
        pytest.skip(f"unsupported: {UNSUPPORTED.get(name) or sorted(ops - MY_OPS)}")
    except ModelError as e:
        # the *_expanded cases are LayerNormalization's function body: the shape arithmetic
        # (Shape -> Slice -> Concat -> Reshape) of other converters and the frontend core
        if ops <= MY_OPS:
            raise
        pytest.skip(f"import fails outside the layer converters: {str(e)[:120]}")
    data = model.SerializeToString()
    for feeds, expected in sets:
        got = runner.run(data, feeds if len(feeds) > 1 else next(iter(feeds.values())))
        got = [got[o] for o in g.outputs] if isinstance(got, dict) else [got]
        for out, ref in zip(got, expected):
            np.testing.assert_allclose(out, ref, rtol=case.rtol, atol=case.atol)
