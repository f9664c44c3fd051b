"""Quantized ONNX models (onnxruntime's quantize_static, QDQ and QOperator formats) compiled to
int8 kernels, against onnxruntime on the same model.

Imported conv2d / depthwise_conv2d / fully_connected carry requant="onnxruntime" and rescale
as onnxruntime does (float32 scale, round half to even): conv, depthwise, MatMul, Gemm and the
3-conv stack match onnxruntime exactly (measured: 0 LSB; with TFLM's fixed-point rounding they
were within 1 LSB per layer, 2 LSB after three layers). Pools, Add/Mul and concat keep TFLM's
fixed-point rounding: within 1 LSB.
The ONNX backend node tests (QuantizeLinear, DequantizeLinear, QLinearConv, QLinearMatMul) run
exactly in tests/test_onnx_conformance.py; the cases below re-check them here.
"""
import numpy as np
import onnx
import pytest
from onnx import TensorProto as TP, helper, numpy_helper

import codegen_c.model  # noqa: F401  (imported before onnxruntime.quantization, which puts
import optimizer.pipeline  # noqa: F401  onnxruntime/transformers, with its optimizer.py, on sys.path)
from frontend.onnx_quant import fuse_qdq
from mcuforge.runner import run

ort = pytest.importorskip("onnxruntime")
from onnxruntime.quantization import (CalibrationDataReader, QuantFormat,  # noqa: E402
                                      QuantType, quantize_static)

X_SHAPE = (1, 3, 8, 8)


def _f(rng, name, shape, std):
    return numpy_helper.from_array(rng.normal(0, std, shape).astype(np.float32), name)


def _float_model(kind: str):
    rng = np.random.default_rng(len(kind))
    mk = helper.make_node
    if kind == "conv_relu":
        nodes = [mk("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]), mk("Relu", ["c"], ["y"])]
        inits, out = [_f(rng, "w", (4, 3, 3, 3), .3), _f(rng, "b", (4,), .1)], (1, 4, 8, 8)
    elif kind == "depthwise":
        nodes = [mk("Conv", ["x", "w", "b"], ["y"], pads=[1, 1, 1, 1], group=3, strides=[2, 2])]
        inits, out = [_f(rng, "w", (3, 1, 3, 3), .3), _f(rng, "b", (3,), .1)], (1, 3, 4, 4)
    elif kind == "gemm":
        nodes = [mk("Flatten", ["x"], ["f"]), mk("Gemm", ["f", "w", "b"], ["y"], transB=1)]
        inits, out = [_f(rng, "w", (10, 192), .1), _f(rng, "b", (10,), .1)], (1, 10)
    elif kind == "matmul":
        nodes = [mk("Flatten", ["x"], ["f"]), mk("MatMul", ["f", "w"], ["y"])]
        inits, out = [_f(rng, "w", (192, 10), .1)], (1, 10)
    elif kind in ("add", "mul"):  # with a per-channel constant, broadcast
        nodes = [mk(kind.capitalize(), ["x", "c"], ["y"])]
        inits, out = [_f(rng, "c", (3, 1, 1), 1.)], X_SHAPE
    elif kind == "concat":  # inputs quantized unlike the output: requantized
        nodes = [mk("Mul", ["x", "c"], ["m"]), mk("Concat", ["x", "m"], ["y"], axis=1)]
        inits, out = [_f(rng, "c", (3, 1, 1), 1.)], (1, 6, 8, 8)
    elif kind.startswith("conv_"):  # quantize_static quantizes pools after a quantized op
        pool = {"conv_avgpool": mk("AveragePool", ["c"], ["y"], kernel_shape=[2, 2],
                                   strides=[2, 2]),
                "conv_avgpad": mk("AveragePool", ["c"], ["y"], kernel_shape=[3, 3],
                                  pads=[1, 1, 1, 1]),
                "conv_gap": mk("GlobalAveragePool", ["c"], ["y"]),
                "conv_maxpool": mk("MaxPool", ["c"], ["y"], kernel_shape=[2, 2],
                                   strides=[2, 2])}[kind]
        nodes = [mk("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]), pool]
        inits = [_f(rng, "w", (3, 3, 3, 3), .3), _f(rng, "b", (3,), .1)]
        out = {"conv_avgpool": (1, 3, 4, 4), "conv_maxpool": (1, 3, 4, 4),
               "conv_gap": (1, 3, 1, 1)}.get(kind, X_SHAPE)
    elif kind == "residual":  # conv, relu, conv, residual add, relu, global average pool
        nodes = [mk("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
                 mk("Relu", ["c1"], ["r"]),
                 mk("Conv", ["r", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1]),
                 mk("Add", ["c2", "x"], ["a"]), mk("Relu", ["a"], ["r2"]),
                 mk("GlobalAveragePool", ["r2"], ["y"])]
        inits = [_f(rng, "w1", (3, 3, 3, 3), .3), _f(rng, "b1", (3,), .1),
                 _f(rng, "w2", (3, 3, 3, 3), .3), _f(rng, "b2", (3,), .1)]
        out = (1, 3, 1, 1)
    else:  # three convs: conv+relu, depthwise, pointwise
        nodes = [mk("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
                 mk("Relu", ["c1"], ["r"]),
                 mk("Conv", ["r", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1], group=4),
                 mk("Conv", ["c2", "w3", "b3"], ["y"])]
        inits = [_f(rng, "w1", (4, 3, 3, 3), .3), _f(rng, "b1", (4,), .1),
                 _f(rng, "w2", (4, 1, 3, 3), .3), _f(rng, "b2", (4,), .1),
                 _f(rng, "w3", (6, 4, 1, 1), .3), _f(rng, "b3", (6,), .1)]
        out = (1, 6, 8, 8)
    g = helper.make_graph(nodes, kind, [helper.make_tensor_value_info("x", TP.FLOAT, X_SHAPE)],
                          [helper.make_tensor_value_info("y", TP.FLOAT, out)], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8
    return m


class _Reader(CalibrationDataReader):
    def __init__(self):
        rng = np.random.default_rng(1)
        self.it = iter([{"x": rng.normal(0, 1, X_SHAPE).astype(np.float32)} for _ in range(16)])

    def get_next(self):
        return next(self.it, None)


def _quantized(tmp_path, kind, fmt, act, per_channel):
    src, dst = tmp_path / "f.onnx", tmp_path / "q.onnx"
    onnx.save(_float_model(kind), src)
    quantize_static(str(src), str(dst), _Reader(), quant_format=fmt, activation_type=act,
                    weight_type=QuantType.QInt8, per_channel=per_channel)
    return onnx.load(str(dst))


def _lsb_diff(model) -> float:
    """Max |mcuforge - onnxruntime| on random inputs, in units of the output's scale."""
    fused = fuse_qdq(model)
    out_dq = next(n for n in fused.graph.node if n.output[0] == "y")
    scale = next(numpy_helper.to_array(i) for i in fused.graph.initializer
                 if i.name == out_dq.input[1])
    x = np.random.default_rng(2).normal(0, 1, (16, *X_SHAPE)).astype(np.float32)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    ref = np.stack([sess.run(None, {"x": xi})[0] for xi in x])
    got = run(fused.SerializeToString(), x)
    return float(np.round(np.abs(got - ref).max() / scale, 3))


FORMATS = [(f, a, pc) for f in (QuantFormat.QDQ, QuantFormat.QOperator)
           for a in (QuantType.QInt8, QuantType.QUInt8) for pc in (True, False)]


def _id(p):
    return f"{p[0].name}-{p[1].name}-{'per_channel' if p[2] else 'per_tensor'}"


@pytest.mark.parametrize("kind", ["conv_relu", "depthwise", "matmul"])
@pytest.mark.parametrize("fmt", FORMATS, ids=_id)
def test_single_layer_exact(tmp_path, kind, fmt):
    assert _lsb_diff(_quantized(tmp_path, kind, *fmt)) == 0.0


@pytest.mark.parametrize("fmt", [f for f in FORMATS if f[0] == QuantFormat.QDQ], ids=_id)
def test_qdq_gemm_exact(tmp_path, fmt):
    """QDQ Gemm becomes com.microsoft QGemm (QOperator QGemm files lack its output shape)."""
    assert _lsb_diff(_quantized(tmp_path, "gemm", *fmt)) == 0.0


ACTIVATIONS = [f for f in FORMATS if f[2]]  # per-channel is moot without weights


@pytest.mark.parametrize("kind", ["add", "mul", "concat"])
@pytest.mark.parametrize("fmt", ACTIVATIONS, ids=_id)
def test_elementwise_and_concat_within_one_lsb(tmp_path, kind, fmt):
    """QLinearAdd / QLinearMul / QLinearConcat (QOperator) and their QDQ patterns."""
    m = _quantized(tmp_path, kind, *fmt)
    ops = {n.op_type for n in fuse_qdq(m).graph.node}
    assert {"add": "QLinearAdd", "mul": "QLinearMul", "concat": "QLinearConcat"}[kind] in ops
    assert _lsb_diff(m) <= 1.0


@pytest.mark.parametrize("kind", ["conv_avgpool", "conv_gap", "conv_maxpool"])
@pytest.mark.parametrize("fmt", ACTIVATIONS, ids=_id)
def test_conv_then_pool_within_one_lsb(tmp_path, kind, fmt):
    """Pools on int8 (avg pool as a unit-weight depthwise conv: one rounding); measured: 1
    LSB, the average pool's (TFLM rounding); 0 with max pool."""
    m = fuse_qdq(_quantized(tmp_path, kind, *fmt))
    assert not {"AveragePool", "GlobalAveragePool"} & {n.op_type for n in m.graph.node}
    assert [n.op_type for n in m.graph.node].count("QuantizeLinear") == 1
    assert _lsb_diff(m) <= 1.0


@pytest.mark.parametrize("fmt", [ACTIVATIONS[0], ACTIVATIONS[3]], ids=_id)
def test_padded_avg_pool_within_two_lsb(tmp_path, fmt):
    """Padding not counted: int8 avg_pool2d then a requantize, two roundings (measured: 2 LSB
    for QOperator uint8, 1 for QDQ int8)."""
    assert _lsb_diff(_quantized(tmp_path, "conv_avgpad", *fmt)) <= 2.0


@pytest.mark.parametrize("fmt", [ACTIVATIONS[0], ACTIVATIONS[3]], ids=_id)
def test_residual_block_within_one_lsb(tmp_path, fmt):
    """conv, relu, conv, residual add, relu, global average pool; measured: 1 LSB."""
    assert _lsb_diff(_quantized(tmp_path, "residual", *fmt)) <= 1.0


@pytest.mark.parametrize("fmt", [f for f in FORMATS if f[0] == QuantFormat.QOperator][::2],
                         ids=_id)
def test_qoperator_qgemm_exact(tmp_path, fmt):
    """com.microsoft QGemm files: fuse_qdq records the output shape onnx cannot infer."""
    assert _lsb_diff(_quantized(tmp_path, "gemm", *fmt)) == 0.0


@pytest.mark.parametrize("fmt", [FORMATS[0], FORMATS[6]], ids=_id)
def test_three_convs_exact(tmp_path, fmt):
    """conv+relu, depthwise, pointwise: onnxruntime's rounding in every layer, so exact (it
    was 2 LSB with TFLM's fixed-point rounding)."""
    assert _lsb_diff(_quantized(tmp_path, "three_convs", *fmt)) == 0.0


def test_fused_qdq_runs_int8_kernels(tmp_path):
    from mcuforge.api import load
    from optimizer.pipeline import optimize
    m = fuse_qdq(_quantized(tmp_path, "conv_relu", *FORMATS[2]))
    assert [n.op_type for n in m.graph.node] == ["QuantizeLinear", "QLinearConv",
                                                 "DequantizeLinear"]
    g = optimize(load(m.SerializeToString()))
    conv = next(n for n in g.nodes if n.op == "conv2d")
    x, w, b = (g.tensors[t] for t in conv.inputs)
    assert (x.dtype, w.dtype, b.dtype) == ("int8", "int8", "int32")
    assert w.quant.per_axis and set(w.quant.zero_point) == {0}
    assert conv.attrs.get("requant") == "onnxruntime"
    assert fuse_qdq(m) == m or [n.op_type for n in fuse_qdq(m).graph.node] == \
        [n.op_type for n in m.graph.node]  # idempotent


@pytest.mark.parametrize("name", ["test_qlinearconv", "test_qlinearmatmul_2D_uint8_float32",
                                  "test_qlinearmatmul_2D_int8_float32", "test_quantizelinear",
                                  "test_quantizelinear_axis", "test_dequantizelinear",
                                  "test_dequantizelinear_axis"])
def test_onnx_node_cases_exact(name):
    from mcuforge import conformance
    cases = [c for c in conformance.load_cases("node", name) if c.name == name]
    (r,) = conformance.run_cases(cases)
    assert r.status == "passed", r.reason
