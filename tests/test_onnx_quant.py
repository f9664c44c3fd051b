"""Quantized ONNX models (onnxruntime's quantize_static, QDQ and QOperator formats) compiled to
int8 kernels, against onnxruntime on the same model.

Imported conv2d / depthwise_conv2d / fully_connected carry requant="onnxruntime" and rescale
as onnxruntime does (float32 scale, round half to even): conv, depthwise, MatMul, Gemm and the
3-conv stack match onnxruntime exactly (measured: 0 LSB; with TFLM's fixed-point rounding they
were within 1 LSB per layer, 2 LSB after three layers). Average pools (AveragePool,
GlobalAveragePool, QLinearAveragePool, QLinearGlobalAveragePool) carry requant="onnxruntime"
too and compute as onnxruntime's com.microsoft kernels (codegen_c/lower/pool_ort.py): exact
(measured: 0 LSB for every case below; with TFLM's avg_pool2d + requantize they were 1, and 2
with padding not counted). Add/Mul and concat keep TFLM's fixed-point rounding: within 1 LSB.
onnxruntime's x86 / x64 builds run int8 QDQ activations as uint8 (QDQS8ToU8Transformer), which
moves the float pool's rounding ties: fuse_qdq mirrors them by default (s8_to_u8), and the
tests ask for onnxruntime's ARM behaviour on ARM hosts.
QLinearMatMul whose right operand is batched, computed at run time or has per-column zero
points (and QDQ MatMul of two activations) is the int8 matmul with requant="onnxruntime"
(codegen_c/lower/matmul_ort.py): exact (measured: 0 LSB for every case below, 2-D to 4-D with
broadcasting, int8, uint8 and uint8 x int8, rounding ties included; before, it was refused).
Float16 scales are read as float32 (exact).
QLinearSigmoid, QLinearLeakyRelu, QLinearWhere (lookup tables) and QLinearSoftmax, from
QOperator files and from the QDQ patterns onnxruntime fuses into them, are the int8 logistic /
leaky_relu / where / softmax with requant="onnxruntime" (codegen_c/lower/lut_ort.py): exact
(measured: 0 LSB in every case below; before, QOperator files were refused and QDQ ran in float,
Softmax 1 LSB off). What quantize_static keeps as plain ops on (u)int8 tensors (MaxPool,
Transpose, Reshape, Flatten, Resize nearest, Split, Pad; Slice / Gather in QDQ) is exact too.
Not covered: Resize linear on (u)int8 (QOperator: refused; onnxruntime runs its integer bilinear
kernel) and QDQ Resize linear (onnxruntime keeps it float: 1 LSB, the float resize's rounding).
The ONNX backend node tests (QuantizeLinear, DequantizeLinear, QLinearConv, QLinearMatMul,
float16 scales and 3-D ones included) run exactly in tests/test_onnx_conformance.py; the cases
below re-check them here.
"""
import platform

import numpy as np
import onnx
import pytest
from onnx import TensorProto as TP, helper, numpy_helper
from conftest import require

import mcuforge.codegen_c.model  # noqa: F401  (imported before onnxruntime.quantization, which puts
import mcuforge.optimizer.pipeline  # noqa: F401  onnxruntime/transformers, with its optimizer.py, on sys.path)
from mcuforge.frontend.onnx_quant import ORT_S8_TO_U8, fuse_qdq
from mcuforge.runner import run

ort = require("onnxruntime")
from onnxruntime.quantization import (CalibrationDataReader, QuantFormat,  # noqa: E402
                                      QuantType, quantize_static)

X_SHAPE = (1, 3, 8, 8)
# onnxruntime runs int8 QDQ activations as uint8 except on ARM (QDQIsInt8Allowed())
S8_TO_U8 = not platform.machine().lower().startswith(("arm", "aarch64"))
# conv then AveragePool (attributes, output shape): padding counted or not, explicit symmetric
# and asymmetric pads, SAME_UPPER, ceil_mode, and a window over the whole plane (onnxruntime's
# integer global-pool path)
AVG_POOLS = {
    "conv_avgpool": (dict(kernel_shape=[2, 2], strides=[2, 2]), (1, 3, 4, 4)),
    "conv_avgpad": (dict(kernel_shape=[3, 3], pads=[1, 1, 1, 1]), X_SHAPE),
    "conv_avgpad_incl": (dict(kernel_shape=[3, 3], pads=[1, 1, 1, 1], count_include_pad=1),
                         X_SHAPE),
    "conv_avg_same": (dict(kernel_shape=[3, 3], strides=[2, 2], auto_pad="SAME_UPPER"),
                      (1, 3, 4, 4)),
    "conv_avg_same_incl": (dict(kernel_shape=[3, 3], strides=[2, 2], auto_pad="SAME_UPPER",
                                count_include_pad=1), (1, 3, 4, 4)),
    "conv_avg_asym": (dict(kernel_shape=[3, 2], strides=[2, 1], pads=[1, 0, 2, 1]),
                      (1, 3, 5, 8)),
    "conv_avg_asym_incl": (dict(kernel_shape=[3, 2], strides=[2, 1], pads=[1, 0, 2, 1],
                                count_include_pad=1), (1, 3, 5, 8)),
    "conv_avg_ceil": (dict(kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1), (1, 3, 4, 4)),
    "conv_avg_global": (dict(kernel_shape=[8, 8]), (1, 3, 1, 1)),
}


def _f(rng, name, shape, std):
    return numpy_helper.from_array(rng.normal(0, std, shape).astype(np.float32), name)


def _i64(name, values):
    return numpy_helper.from_array(np.array(values, np.int64), name)


# conv, then one op on its (quantized) output: kind -> (nodes reading "c", initializers, output
# shape). quantize_static writes com.microsoft QLinearSigmoid / QLinearLeakyRelu /
# QLinearSoftmax for the first three (QOperator), and QDQ around them that onnxruntime fuses
# into the same; the others are kept as plain ops on the (u)int8 tensors (QOperator), or have
# their DequantizeLinear / QuantizeLinear dropped by onnxruntime (QDQ; Pad stays float there).
CONV_THEN = {
    "conv_sigmoid": (lambda mk: [mk("Sigmoid", ["c"], ["y"])], [], X_SHAPE),
    "conv_leaky_relu": (lambda mk: [mk("LeakyRelu", ["c"], ["y"], alpha=0.15)], [], X_SHAPE),
    "conv_softmax": (lambda mk: [mk("Softmax", ["c"], ["y"], axis=1)], [], X_SHAPE),
    "conv_softmax_last": (lambda mk: [mk("Softmax", ["c"], ["y"])], [], X_SHAPE),
    "conv_clip": (lambda mk: [mk("Clip", ["c", "lo", "hi"], ["y"])],
                  [numpy_helper.from_array(np.float32(0), "lo"),
                   numpy_helper.from_array(np.float32(1), "hi")], X_SHAPE),
    "conv_transpose": (lambda mk: [mk("Transpose", ["c"], ["y"], perm=[0, 2, 3, 1])], [],
                       (1, 8, 8, 3)),
    "conv_reshape": (lambda mk: [mk("Reshape", ["c", "s"], ["y"])], [_i64("s", [1, 24, 8])],
                     (1, 24, 8)),
    "conv_flatten": (lambda mk: [mk("Flatten", ["c"], ["y"])], [], (1, 192)),
    "conv_resize": (lambda mk: [mk("Resize", ["c", "", "sc"], ["y"], mode="nearest")],
                    [numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), "sc")],
                    (1, 3, 16, 16)),
    "conv_split": (lambda mk: [mk("Split", ["c", "sp"], ["y", "s2"], axis=1)],
                   [_i64("sp", [1, 2])], (1, 1, 8, 8)),
    "conv_slice": (lambda mk: [mk("Slice", ["c", "st", "en", "ax"], ["y"])],
                   [_i64("st", [1]), _i64("en", [7]), _i64("ax", [3])], (1, 3, 8, 6)),
    "conv_gather": (lambda mk: [mk("Gather", ["c", "ix"], ["y"], axis=1)], [_i64("ix", [2, 0])],
                    (1, 2, 8, 8)),
    "conv_pad": (lambda mk: [mk("Pad", ["c", "p"], ["y"])], [_i64("p", [0, 0, 1, 2, 0, 0, 2, 1])],
                 (1, 3, 11, 11)),
    "conv_where": (lambda mk: [mk("Greater", ["c", "z"], ["g"]),
                               mk("Where", ["g", "c", "x"], ["y"])],
                   [numpy_helper.from_array(np.float32(0), "z")], X_SHAPE),
}


def _float_model(kind: str, opset: int = 13):
    rng = np.random.default_rng(len(kind))
    mk = helper.make_node
    if kind in CONV_THEN:
        then, extra, out = CONV_THEN[kind]
        nodes = [mk("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]), *then(mk)]
        inits = [_f(rng, "w", (3, 3, 3, 3), .3), _f(rng, "b", (3,), .1), *extra]
    elif kind == "conv_relu":
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
        if kind in AVG_POOLS:
            attrs, out = AVG_POOLS[kind]
            pool = mk("AveragePool", ["c"], ["y"], **attrs)
        else:
            pool = {"conv_gap": mk("GlobalAveragePool", ["c"], ["y"]),
                    "conv_maxpool": mk("MaxPool", ["c"], ["y"], kernel_shape=[2, 2],
                                       strides=[2, 2])}[kind]
            out = {"conv_maxpool": (1, 3, 4, 4), "conv_gap": (1, 3, 1, 1)}[kind]
        nodes = [mk("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]), pool]
        inits = [_f(rng, "w", (3, 3, 3, 3), .3), _f(rng, "b", (3,), .1)]
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
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    return m


class _Reader(CalibrationDataReader):
    def __init__(self):
        rng = np.random.default_rng(1)
        self.it = iter([{"x": rng.normal(0, 1, X_SHAPE).astype(np.float32)} for _ in range(16)])

    def get_next(self):
        return next(self.it, None)


def _quantized(tmp_path, kind, fmt, act, per_channel, opset=13, **extra_options):
    src, dst = tmp_path / "f.onnx", tmp_path / "q.onnx"
    onnx.save(_float_model(kind, opset), src)
    quantize_static(str(src), str(dst), _Reader(), quant_format=fmt, activation_type=act,
                    weight_type=QuantType.QInt8, per_channel=per_channel,
                    extra_options=extra_options)
    return onnx.load(str(dst))


def _out_scale(model) -> float:
    """The scale of the DequantizeLinear y comes from (through data-movement ops)."""
    prod = {o: n for n in model.graph.node for o in n.output}
    n = prod["y"]
    while n.op_type != "DequantizeLinear":
        n = prod[n.input[0]]
    return next(float(numpy_helper.to_array(i)) for i in model.graph.initializer
                if i.name == n.input[1])


def _lsb_diff(model, x=None, s8_to_u8: bool = S8_TO_U8) -> float:
    """Max |mcuforge - onnxruntime| on random inputs (or x, a batch), in units of the output's
    scale."""
    fused = fuse_qdq(model, s8_to_u8)
    scale = _out_scale(fused)
    if x is None:
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
def test_conv_then_pool_exact(tmp_path, kind, fmt):
    """Pools on int8 in one rounding: average pools as onnxruntime's QLinearAveragePool /
    QLinearGlobalAveragePool (measured: 0 LSB; 1 with TFLM's rounding), max pool on the
    quantized values (0)."""
    m = _quantized(tmp_path, kind, *fmt)
    fused = fuse_qdq(m)
    assert not {"AveragePool", "GlobalAveragePool"} & {n.op_type for n in fused.graph.node}
    assert [n.op_type for n in fused.graph.node].count("QuantizeLinear") == 1
    assert _lsb_diff(m) == 0.0


@pytest.mark.parametrize("kind", [k for k in AVG_POOLS if k != "conv_avgpool"])
@pytest.mark.parametrize("fmt", ACTIVATIONS, ids=_id)
def test_avg_pool_exact(tmp_path, kind, fmt):
    """AveragePool, padding counted (count_include_pad=1) or not, explicit, asymmetric and
    SAME_UPPER pads, ceil_mode, a whole-plane window: exactly onnxruntime. QDQ files have the
    same quantization in and out, QOperator ones different. Measured before requant=
    "onnxruntime": 1 LSB for QDQ, 2 for QOperator with padding not counted (avg_pool2d then a
    requantize: two roundings), 1 otherwise (0 for the QDQ whole-plane window); now 0."""
    m = _quantized(tmp_path, kind, *fmt)
    pool = next(n for n in fuse_qdq(m).graph.node if n.op_type == "QLinearAveragePool")
    assert pool.domain == "com.microsoft"
    assert _lsb_diff(m) == 0.0


def test_qdq_int8_pool_runs_as_uint8_in_onnxruntime(tmp_path):
    """onnxruntime's x86 build runs int8 QDQ as uint8: zero points + 128, added in float
    before QLinearAveragePool rounds. fuse_qdq marks the pool; unmarked, the ties round
    elsewhere (measured: 1 LSB)."""
    m = _quantized(tmp_path, "conv_avgpad", *ACTIVATIONS[0])
    (pool,) = [n for n in fuse_qdq(m).graph.node if n.op_type == "QLinearAveragePool"]
    assert pool.doc_string == ORT_S8_TO_U8
    assert not [n for n in fuse_qdq(m, s8_to_u8=False).graph.node if n.doc_string]
    if S8_TO_U8:
        assert _lsb_diff(m, s8_to_u8=False) == 1.0


def _qlinear_pool_model(op: str, shape, dtype, scales, zps, **attrs):
    """x (float) -> QuantizeLinear -> com.microsoft op -> DequantizeLinear -> y."""
    (xs, ys), (xz, yz) = scales, zps
    inits = [numpy_helper.from_array(np.array(v, np.float32), n) for n, v in
             (("xs", xs), ("ys", ys))] + \
        [numpy_helper.from_array(np.array(v, dtype), n) for n, v in (("xz", xz), ("yz", yz))]
    nodes = [helper.make_node("QuantizeLinear", ["x", "xs", "xz"], ["q"]),
             helper.make_node(op, ["q", "xs", "xz", "ys", "yz"], ["p"], domain="com.microsoft",
                              **attrs),
             helper.make_node("DequantizeLinear", ["p", "ys", "yz"], ["y"])]
    g = helper.make_graph(nodes, op, [helper.make_tensor_value_info("x", TP.FLOAT, shape)],
                          [helper.make_tensor_value_info("y", TP.FLOAT, None)], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13),
                                            helper.make_opsetid("com.microsoft", 1)])
    m.ir_version = 8
    return m


def _on_grid(shape, scale, zp, dtype, n=8):
    """n inputs quantizing exactly to random values of the whole (u)int8 range: windows of 2
    and 4 taps average to halves, the rounding ties."""
    lo, hi = (-128, 127) if dtype == "int8" else (0, 255)
    q = np.random.default_rng(3).integers(lo, hi + 1, (n, *shape))
    return (np.float32(scale) * (q - zp)).astype(np.float32)


POOL_QUANT = {"same": ((0.05, 0.05), (3, 3)), "other": ((0.05, 0.02), (3, -7))}


@pytest.mark.parametrize("quant", POOL_QUANT)
@pytest.mark.parametrize("dtype", ["int8", "uint8"])
@pytest.mark.parametrize("case", [
    ("QLinearAveragePool", (1, 3, 6, 6), dict(kernel_shape=[2, 2], strides=[2, 2])),
    ("QLinearAveragePool", (1, 3, 7, 7), dict(kernel_shape=[2, 2], pads=[1, 0, 0, 1])),
    ("QLinearAveragePool", (1, 3, 7, 7), dict(kernel_shape=[3, 3], strides=[2, 2],
                                              pads=[1, 1, 1, 1], count_include_pad=1)),
    ("QLinearAveragePool", (1, 4, 16), dict(kernel_shape=[3], strides=[2], pads=[1, 1])),
    ("QLinearAveragePool", (1, 3, 6, 6), dict(kernel_shape=[6, 6])),
    ("QLinearGlobalAveragePool", (1, 3, 6, 6), {}),
    ("QLinearGlobalAveragePool", (1, 6, 5, 5), dict(channels_last=1)),
    ("QLinearGlobalAveragePool", (1, 4, 10), {}),
    ("QLinearGlobalAveragePool", (1, 2, 3, 4, 4), {}),
], ids=lambda c: "-".join([c[0], "x".join(map(str, c[1]))] + [f"{k}{v}" for k, v in c[2].items()]))
def test_qlinear_pool_nodes_exact(case, dtype, quant):
    """com.microsoft QLinearAveragePool / QLinearGlobalAveragePool on inputs covering the whole
    (u)int8 range, quantization alike in and out (ties) or not: exactly onnxruntime (1-D,
    channels_last, rank 5 too)."""
    op, shape, attrs = case
    (xs, ys), (xz, yz) = POOL_QUANT[quant]
    off = 128 if dtype == "uint8" else 0
    m = _qlinear_pool_model(op, shape, dtype, (xs, ys), (xz + off, yz + off), **attrs)
    assert _lsb_diff(m, _on_grid(shape, xs, xz + off, dtype)) == 0.0


@pytest.mark.parametrize("fmt", [ACTIVATIONS[0], ACTIVATIONS[3]], ids=_id)
def test_residual_block_within_one_lsb(tmp_path, fmt):
    """conv, relu, conv, residual add, relu, global average pool; measured: 0 LSB (1 before the
    pool rounded as onnxruntime; the add keeps TFLM's rounding)."""
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
    from mcuforge.optimizer.pipeline import optimize
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


@pytest.mark.parametrize("name", ["test_qlinearconv", "test_quantizelinear",
                                  "test_quantizelinear_axis", "test_dequantizelinear",
                                  "test_dequantizelinear_axis"] + [
    f"test_qlinearmatmul_{r}_{t}_{s}" for r in ("2D", "3D") for t in ("int8", "uint8")
    for s in ("float32", "float16")])
def test_onnx_node_cases_exact(name):
    from mcuforge.tools import conformance
    cases = [c for c in conformance.load_cases("node", name) if c.name == name]
    (r,) = conformance.run_cases(cases)
    assert r.status == "passed", r.reason


# ---- QLinearMatMul: batched, run-time and per-column right operands --------------------------

_NP = {"int8": np.int8, "uint8": np.uint8}
_ELEM = {"int8": TP.INT8, "uint8": TP.UINT8, "float32": TP.FLOAT, "float16": TP.FLOAT16}


def _full_range(rng, shape, dtype):
    info = np.iinfo(_NP[dtype])
    return rng.integers(info.min, info.max + 1, shape).astype(_NP[dtype])


def _qlinear_matmul_model(a_shape, b_shape, dtypes, b_const, scales, seed=0, b_scale_shape=(),
                          b_zp_per_column=False, scale_type="float32"):
    """a [, b] (quantized graph inputs; b an initializer when b_const) -> QLinearMatMul -> y.
    scales: (a_scale, b_scale or per-column scales, y_scale)."""
    rng = np.random.default_rng(seed)
    (ta, tb, ty), (a_s, b_s, y_s) = dtypes, scales
    off = {"int8": 0, "uint8": 128}
    zp = lambda t, shape=(): np.asarray(rng.integers(-12, 13, shape) + off[t]).astype(_NP[t])
    inits = [numpy_helper.from_array(np.asarray(v, np.dtype(scale_type)).reshape(shape), n)
             for n, v, shape in (("a_s", a_s, ()), ("b_s", b_s, b_scale_shape), ("y_s", y_s, ()))]
    inits += [numpy_helper.from_array(zp(ta), "a_z"), numpy_helper.from_array(zp(ty), "y_z"),
              numpy_helper.from_array(zp(tb, b_scale_shape if b_zp_per_column else ()), "b_z")]
    ins = [helper.make_tensor_value_info("a", _ELEM[ta], a_shape)]
    if b_const:
        inits.append(numpy_helper.from_array(_full_range(rng, b_shape, tb), "b"))
    else:
        ins.append(helper.make_tensor_value_info("b", _ELEM[tb], b_shape))
    node = helper.make_node("QLinearMatMul",
                            ["a", "a_s", "a_z", "b", "b_s", "b_z", "y_s", "y_z"], ["y"])
    g = helper.make_graph([node], "qlinear_matmul", ins,
                          [helper.make_tensor_value_info("y", _ELEM[ty], None)], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8
    return m


def _int_lsb_diff(model, feeds: list, reference=None) -> int:
    """Max |mcuforge - reference| of the (u)int8 output over the feeds (dicts by input name);
    the reference is onnxruntime on `reference` (default: the model itself)."""
    sess = ort.InferenceSession((reference or model).SerializeToString(),
                                providers=["CPUExecutionProvider"])
    ref = np.stack([sess.run(None, f)[0] for f in feeds])
    names = list(feeds[0])
    batch = {n: np.stack([f[n] for f in feeds]) for n in names}
    got = run(model.SerializeToString(), batch if len(names) > 1 else batch[names[0]])
    assert (got.dtype, got.shape) == (ref.dtype, ref.shape)
    return int(np.abs(got.astype(np.int32) - ref.astype(np.int32)).max())


def _feeds(model, rng, n=6) -> list:
    ins = [(i.name, tuple(d.dim_value for d in i.type.tensor_type.shape.dim),
            {TP.INT8: "int8", TP.UINT8: "uint8"}[i.type.tensor_type.elem_type])
           for i in model.graph.input]
    return [{nm: _full_range(rng, shape, t) for nm, shape, t in ins} for _ in range(n)]


def _y_scale(k: int, a_s=0.02, b_s=0.02) -> float:
    """An output scale that keeps most sums of k full-range products inside the output range
    (so that the rescale and rounding are what is compared, not the saturation)."""
    return float(a_s * b_s * 74 * 74 * np.sqrt(k) / 40)


MATMUL_SHAPES = [  # (a, b): 2-D, batched 3-D, 4-D broadcasting both ways, 3-D x 2-D, 1-D
    ((4, 16), (16, 5)), ((2, 3, 16), (2, 16, 5)), ((2, 1, 3, 16), (1, 3, 16, 5)),
    ((2, 3, 16), (16, 5)), ((16,), (2, 16, 5)), ((3, 16), (16,)),
]
MATMUL_TYPES = [("int8",) * 3, ("uint8",) * 3, ("uint8", "int8", "uint8")]


@pytest.mark.parametrize("b_const", [False, True], ids=["runtime_b", "const_b"])
@pytest.mark.parametrize("dtypes", MATMUL_TYPES, ids="-".join)
@pytest.mark.parametrize("shapes", MATMUL_SHAPES,
                         ids=lambda s: "x".join(map(str, s[0])) + "@" + "x".join(map(str, s[1])))
def test_qlinear_matmul_exact(shapes, dtypes, b_const):
    """QLinearMatMul on full-range operands: a constant 2-D right operand is fully_connected,
    anything else (run time, batched, 1-D) the int8 matmul with requant="onnxruntime"
    (codegen_c/lower/matmul_ort.py): int32 sums, float32 rescale, round half to even. Exactly
    onnxruntime (measured: 0 LSB in every case; before, all but the constant 2-D operand were
    refused)."""
    a_shape, b_shape = shapes
    m = _qlinear_matmul_model(a_shape, b_shape, dtypes, b_const,
                              (0.02, 0.02, _y_scale(a_shape[-1])), seed=len(a_shape))
    assert _int_lsb_diff(m, _feeds(m, np.random.default_rng(4))) == 0


@pytest.mark.parametrize("dtype", ["int8", "uint8"])
def test_qlinear_matmul_rounding_ties_exact(dtype):
    """a_scale * b_scale / y_scale = 1/2 and operands near their zero points: about half the
    sums land on a half, which onnxruntime rounds to even (TFLM's fixed point: away from
    zero)."""
    m = _qlinear_matmul_model((2, 4, 16), (2, 16, 6), (dtype,) * 3, False, (0.5, 0.25, 0.25))
    zp = {i.name: int(numpy_helper.to_array(i)) for i in m.graph.initializer}
    rng = np.random.default_rng(5)
    near = lambda z, shape: rng.integers(z - 6, z + 7, shape).astype(_NP[dtype])
    feeds = [{"a": near(zp["a_z"], (2, 4, 16)), "b": near(zp["b_z"], (2, 16, 6))}
             for _ in range(8)]
    ties = sum(int(np.sum(np.matmul(f["a"].astype(int) - zp["a_z"],
                                    f["b"].astype(int) - zp["b_z"]) % 2)) for f in feeds)
    assert ties > 100
    assert _int_lsb_diff(m, feeds) == 0


@pytest.mark.parametrize("dtype", ["int8", "uint8"])
@pytest.mark.parametrize("scale_shape", [(5,), (1, 5)])
def test_qlinear_matmul_per_column_exact(dtype, scale_shape):
    """Constant 2-D b with per-column scales and zero points (onnxruntime's PerColumnZeroPoints):
    the fully_connected kernels take one weight zero point, so this is the matmul kernel with
    per-column tables."""
    rng = np.random.default_rng(6)
    scales = (0.02, rng.uniform(0.01, 0.03, scale_shape), _y_scale(16))
    m = _qlinear_matmul_model((4, 16), (16, 5), (dtype,) * 3, True, scales,
                              b_scale_shape=scale_shape, b_zp_per_column=True)
    from mcuforge.api import load
    assert [n.op for n in load(m.SerializeToString()).nodes if n.op == "matmul"] == ["matmul"]
    assert _int_lsb_diff(m, _feeds(m, rng)) == 0


@pytest.mark.parametrize("dtypes", MATMUL_TYPES[:2], ids="-".join)
def test_qlinear_matmul_float16_scales_exact(dtypes):
    """Float16 scales (QLinearMatMul-21) are read as float32, exactly: the model computes as
    the same model with the float32 values does in onnxruntime (which has no kernel for float16
    QLinearMatMul scales)."""
    args = ((2, 3, 16), (2, 16, 5), dtypes, False)
    scales = tuple(float(np.float16(v)) for v in (0.02, 0.0175, _y_scale(16)))
    m16 = _qlinear_matmul_model(*args, scales, scale_type="float16")
    m16.opset_import[0].version = 21
    m32 = _qlinear_matmul_model(*args, scales)
    assert _int_lsb_diff(m16, _feeds(m32, np.random.default_rng(7)), reference=m32) == 0


def test_float32_scales_only_where_float32_is_computed():
    """float32_scales reads float16 scales as float32 for the QLinear* ops and for Quantize /
    DequantizeLinear computing in float32 (precision / output_dtype FLOAT), and leaves those
    that compute in float16 alone. The float32 ones match onnx's reference exactly."""
    from onnx.reference import ReferenceEvaluator

    from mcuforge.frontend.onnx_quant import float32_scales
    s = numpy_helper.from_array(np.array(0.0137, np.float16), "s")
    z = numpy_helper.from_array(np.array(3, np.int8), "z")
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"], precision=TP.FLOAT),
             helper.make_node("DequantizeLinear", ["q", "s", "z"], ["y"], output_dtype=TP.FLOAT),
             helper.make_node("DequantizeLinear", ["q", "s", "z"], ["h"])]
    g = helper.make_graph(nodes, "qdq", [helper.make_tensor_value_info("x", TP.FLOAT, (4, 16))],
                          [helper.make_tensor_value_info("y", TP.FLOAT, (4, 16))], [s, z])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 23)])
    m.ir_version = 10
    conv = float32_scales(onnx.ModelProto.FromString(m.SerializeToString()))
    assert [n.input[1] for n in conv.graph.node] == ["s_f32", "s_f32", "s"]
    del m.graph.node[2:]  # a float16 output: not for mcuforge
    x = np.random.default_rng(0).normal(0, 1, (4, 16)).astype(np.float32)
    ref = ReferenceEvaluator(m).run(None, {"x": x})[0]
    assert np.array_equal(run(m.SerializeToString(), x), ref)


class _AttentionReader(CalibrationDataReader):
    def __init__(self):
        rng = np.random.default_rng(1)
        self.it = iter([{"x": rng.normal(0, 1, ATTN_SHAPE).astype(np.float32)}
                        for _ in range(16)])

    def get_next(self):
        return next(self.it, None)


ATTN_SHAPE = (1, 2, 6, 8)  # batch, heads, tokens, features


def _attention_model():
    """q = x Wq, k = x Wk, v = x Wv; y = (q k^T) v: two MatMuls of two activations (4-D)."""
    rng = np.random.default_rng(5)
    mk = helper.make_node
    nodes = [mk("MatMul", ["x", "wq"], ["q"]), mk("MatMul", ["x", "wk"], ["k"]),
             mk("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]),
             mk("MatMul", ["q", "kt"], ["s"]), mk("MatMul", ["x", "wv"], ["v"]),
             mk("MatMul", ["s", "v"], ["y"])]
    g = helper.make_graph(nodes, "attention",
                          [helper.make_tensor_value_info("x", TP.FLOAT, ATTN_SHAPE)],
                          [helper.make_tensor_value_info("y", TP.FLOAT, ATTN_SHAPE)],
                          [_f(rng, w, (8, 8), .3) for w in ("wq", "wk", "wv")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8
    return m


@pytest.mark.parametrize("fmt", ACTIVATIONS, ids=_id)
def test_activation_matmuls_exact(tmp_path, fmt):
    """quantize_static's QDQ and QOperator files of an attention-like block: MatMul of two
    activations becomes QLinearMatMul (fuse_qdq routes DequantizeLinear'd activations on both
    sides, as onnxruntime fuses them), then the int8 matmul with requant="onnxruntime".
    Measured: 0 LSB, int8 and uint8."""
    src, dst = tmp_path / "f.onnx", tmp_path / "q.onnx"
    onnx.save(_attention_model(), src)
    quantize_static(str(src), str(dst), _AttentionReader(), quant_format=fmt[0],
                    activation_type=fmt[1], weight_type=QuantType.QInt8, per_channel=False)
    m = onnx.load(str(dst))
    assert [n.op_type for n in fuse_qdq(m).graph.node].count("QLinearMatMul") == 5
    x = np.random.default_rng(2).normal(0, 1, (16, *ATTN_SHAPE)).astype(np.float32)
    assert _lsb_diff(m, x) == 0.0


# ---- QLinearSigmoid / QLinearLeakyRelu / QLinearSoftmax / QLinearWhere ------------------------

def _ms_model(op, shape, dtype, scales, zps, out_dtype=None, **attrs):
    """x ((u)int8 graph input) -> com.microsoft op (x, x_scale, x_zp, y_scale, y_zp) -> y."""
    out_dtype = out_dtype or dtype
    inits = [numpy_helper.from_array(np.array(v, np.float32), n)
             for n, v in zip(("xs", "ys"), scales)]
    inits += [numpy_helper.from_array(np.array(v, _NP[t]), n)
              for n, v, t in zip(("xz", "yz"), zps, (dtype, out_dtype))]
    node = helper.make_node(op, ["x", "xs", "xz", "ys", "yz"], ["y"], domain="com.microsoft",
                            **attrs)
    g = helper.make_graph([node], op, [helper.make_tensor_value_info("x", _ELEM[dtype], shape)],
                          [helper.make_tensor_value_info("y", _ELEM[out_dtype], None)], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13),
                                            helper.make_opsetid("com.microsoft", 1)])
    m.ir_version = 8
    return m


def _all_values(dtype):
    info = np.iinfo(_NP[dtype])
    return {"x": np.arange(info.min, info.max + 1).astype(_NP[dtype])}


def _ort_table(op, dtype, scales, zps, **attrs):
    m = _ms_model(op, (256,), dtype, scales, zps, **attrs)
    sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, _all_values(dtype))[0].astype(np.int32)


def _table(op, dtype, scales, zps, **attrs):
    """lut_ort's table as the (u)int8 values of the model's own types."""
    from mcuforge.codegen_c.lower import lut_ort
    off = 128 if dtype == "uint8" else 0
    fn = lut_ort.mlas_logistic if op == "QLinearSigmoid" else lut_ort._leaky(attrs["alpha"])
    t = lut_ort.lookup_table(fn, (scales[0], zps[0] - off), (scales[1], zps[1] - off))
    return t.astype(np.int32) + off


# (x_scale, y_scale) where a table entry's logistic, computed with FMA or without, lands on
# either side of a rounding boundary (x_zp 0: the entry at q = 1 is x_scale itself)
FMA_SENSITIVE = [(2.1052145957946777, 0.3565635681152344),
                 (12.198953628540039, 0.22222109138965607),
                 (8.093452453613281, 0.22215433418750763),
                 (9.61940860748291, 0.09523176401853561),
                 (15.565351486206055, 0.3999999165534973)]


def test_lookup_tables_are_onnxruntimes(monkeypatch):
    """lut_ort's compile-time tables equal onnxruntime's QLinearSigmoid / QLinearLeakyRelu on all
    256 inputs for 120 random quantizations, int8 and uint8 (scales over three decades, zero
    points anywhere, softmax-like outputs 1/256 too). MLAS's logistic is its FMA kernel: the
    tables differ from the unfused arithmetic's in the FMA_SENSITIVE cases, and there
    onnxruntime (x86-64 FMA3, ARM64 NEON) is the fused one."""
    from mcuforge.codegen_c.lower import lut_ort
    rng = np.random.default_rng(8)
    for k in range(120):
        dtype = ("int8", "uint8")[k % 2]
        off = 128 if dtype == "uint8" else 0
        scales = (float(np.float32(10 ** rng.uniform(-3, 0))),
                  1 / 256 if k % 5 == 0 else float(np.float32(10 ** rng.uniform(-3.5, -1))))
        zps = (int(rng.integers(-128, 128)) + off,
               -128 + off if k % 5 == 0 else int(rng.integers(-128, 128)) + off)
        for op, attrs in (("QLinearSigmoid", {}),
                          ("QLinearLeakyRelu", {"alpha": float(rng.uniform(0.001, 0.5))})):
            assert np.array_equal(_table(op, dtype, scales, zps, **attrs),
                                  _ort_table(op, dtype, scales, zps, **attrs)), (op, scales, zps)
    for scales in FMA_SENSITIVE:
        ref = _ort_table("QLinearSigmoid", "int8", scales, (0, -128))
        assert np.array_equal(_table("QLinearSigmoid", "int8", scales, (0, -128)), ref)
        unfused = lambda a, b, c: (np.float32(a) * np.float32(b) + np.float32(c)).astype(np.float32)
        with monkeypatch.context() as mp:
            mp.setattr(lut_ort, "fma_f32", unfused)
            assert not np.array_equal(_table("QLinearSigmoid", "int8", scales, (0, -128)), ref)


LUT_QUANT = {"alike": ((0.05, 0.05), (3, 3)), "other": ((0.08, 1 / 256), (-7, -128))}


@pytest.mark.parametrize("quant", LUT_QUANT)
@pytest.mark.parametrize("dtype", ["int8", "uint8"])
@pytest.mark.parametrize("op", ["QLinearSigmoid", "QLinearLeakyRelu"])
def test_qlinear_lut_nodes_exact(op, dtype, quant):
    """com.microsoft QLinearSigmoid / QLinearLeakyRelu on every (u)int8 value: the int8
    logistic / leaky_relu with requant="onnxruntime" (one table lookup per element), exactly
    onnxruntime (measured: 0; before, refused)."""
    from mcuforge.api import load
    scales, zps = LUT_QUANT[quant]
    off = 128 if dtype == "uint8" else 0
    attrs = {"alpha": 0.2} if op == "QLinearLeakyRelu" else {}
    m = _ms_model(op, (4, 64), dtype, scales, (zps[0] + off, zps[1] + off), **attrs)
    (node,) = [n for n in load(m.SerializeToString()).nodes if n.op in ("logistic", "leaky_relu")]
    assert node.attrs["requant"] == "onnxruntime"
    x = _all_values(dtype)["x"].reshape(4, 64)
    assert _int_lsb_diff(m, [{"x": x}, {"x": x[::-1].copy()}]) == 0


SOFTMAX_CASES = [  # (shape, attrs)
    ((6, 10), dict(opset=13)),
    ((2, 5, 3, 4), dict(opset=13, axis=1)),
    ((3, 7), dict(opset=13, axis=0)),
    ((2, 5, 3, 4), dict(opset=11, axis=1)),  # rows of everything from axis on
    ((2, 5, 3, 4), dict(opset=11)),  # the schema's default axis -1, as onnxruntime reads it
    ((4, 300), dict(opset=13)),
]
SOFTMAX_QUANT = {"1/256": ((0.07, 1 / 256), (3, -128)), "1/255": ((0.2, 1 / 255), (-20, -128)),
                 "fine": ((0.013, 0.0011), (0, -100))}


@pytest.mark.parametrize("quant", SOFTMAX_QUANT)
@pytest.mark.parametrize("dtype", ["int8", "uint8"])
@pytest.mark.parametrize("case", SOFTMAX_CASES,
                         ids=lambda c: "x".join(map(str, c[0])) + "-" +
                         "-".join(f"{k}{v}" for k, v in c[1].items()))
def test_qlinear_softmax_exact(case, dtype, quant):
    """com.microsoft QLinearSoftmax: onnxruntime's kernel (float32 exp table from double exp with
    logf's bit shift, float32 row sum in order, nearbyintf(t * floor(1 / y_scale) / sum) + y_zp,
    at most the type's maximum), along any axis, opset 11 rows, long rows; inputs over the whole
    range and rows near their maximum (many ties of the max). Measured: 0 LSB (before: refused)."""
    shape, attrs = case
    scales, zps = SOFTMAX_QUANT[quant]
    off = 128 if dtype == "uint8" else 0
    m = _ms_model("QLinearSoftmax", shape, dtype, scales, (zps[0] + off, zps[1] + off), **attrs)
    rng = np.random.default_rng(9)
    info = np.iinfo(_NP[dtype])
    feeds = _feeds(m, rng, n=4) + [
        {"x": np.clip(info.max - rng.integers(0, 12, shape), info.min, info.max).astype(_NP[dtype])}
        for _ in range(4)]
    assert _int_lsb_diff(m, feeds) == 0


@pytest.mark.parametrize("dtype", ["int8", "uint8"])
@pytest.mark.parametrize("y_zp", [-128, -3, 0, 90])
def test_qlinear_softmax_overflow_as_onnxruntime_x86(dtype, y_zp):
    """Rows of one element with y_scale 1/256, or rows of 5 with y_scale 1/1000: onnxruntime's
    exp table times floor(1 / y_scale) overflows float32 near the row maximum and its float ->
    int conversion of the infinity, undefined in C++, gives on x86-64 the zero point (uint8)
    or 127 / -128 (int8, zero point negative / not): the kernel gives the same there (and
    computes the rest). Measured: 0."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        pytest.skip("onnxruntime's result is x86-64's conversion of an infinity")
    off = 128 if dtype == "uint8" else 0
    zps = (3 + off, max(y_zp, -128) + off)
    rng = np.random.default_rng(12)
    for shape, ys in (((6, 1), 1 / 256), ((6, 5), 0.001)):
        m = _ms_model("QLinearSoftmax", shape, dtype, (0.05, ys), zps, opset=13)
        assert _int_lsb_diff(m, _feeds(m, rng, n=4)) == 0


def _where_model(shapes, dtype, scales, zps):
    """(cond, a, b) graph inputs -> QLinearWhere -> y; scales / zero points of a, b, y."""
    names = ("a", "b", "y")
    inits = [numpy_helper.from_array(np.array(s, np.float32), f"{n}_s")
             for n, s in zip(names, scales)]
    inits += [numpy_helper.from_array(np.array(z, _NP[dtype]), f"{n}_z")
              for n, z in zip(names, zps)]
    node = helper.make_node("QLinearWhere", ["c", "a", "a_s", "a_z", "b", "b_s", "b_z", "y_s",
                                             "y_z"], ["y"], domain="com.microsoft")
    ins = [helper.make_tensor_value_info("c", TP.BOOL, shapes[0])] + \
        [helper.make_tensor_value_info(n, _ELEM[dtype], s) for n, s in zip("ab", shapes[1:])]
    g = helper.make_graph([node], "where", ins,
                          [helper.make_tensor_value_info("y", _ELEM[dtype], None)], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13),
                                            helper.make_opsetid("com.microsoft", 1)])
    m.ir_version = 8
    return m


@pytest.mark.parametrize("quant", ["alike", "other"])
@pytest.mark.parametrize("dtype", ["int8", "uint8"])
def test_qlinear_where_exact(dtype, quant):
    """com.microsoft QLinearWhere, broadcasting condition and operands: each operand through
    onnxruntime's requantization table (none when quantized as the output). Measured: 0."""
    off = 128 if dtype == "uint8" else 0
    scales, zps = {"alike": ((0.03, 0.03, 0.03), (5, 5, 5)),
                   "other": ((0.03, 0.011, 0.02), (5, -40, 17))}[quant]
    shapes = ((2, 1, 6), (2, 3, 6), (3, 1))
    m = _where_model(shapes, dtype, scales, tuple(z + off for z in zps))
    rng = np.random.default_rng(10)
    feeds = [{"c": rng.integers(0, 2, shapes[0]).astype(bool),
              "a": _full_range(rng, shapes[1], dtype), "b": _full_range(rng, shapes[2], dtype)}
             for _ in range(6)]
    assert _int_lsb_diff(m, feeds) == 0


@pytest.mark.parametrize("kind", ["conv_sigmoid", "conv_leaky_relu", "conv_softmax",
                                  "conv_softmax_last"])
@pytest.mark.parametrize("fmt", ACTIVATIONS, ids=_id)
def test_quantized_activations_exact(tmp_path, kind, fmt):
    """quantize_static's QOperator files (QLinearSigmoid / QLinearLeakyRelu / QLinearSoftmax)
    and QDQ files (DQ -> op -> Q, which onnxruntime fuses into the same ops: fuse_qdq does too),
    int8 and uint8: exactly onnxruntime (measured: 0 LSB; before, QOperator was refused and QDQ
    ran in float: Sigmoid / LeakyRelu 0 on these inputs, Softmax 1)."""
    from mcuforge.api import load
    m = _quantized(tmp_path, kind, *fmt)
    op = {"conv_sigmoid": "QLinearSigmoid", "conv_leaky_relu": "QLinearLeakyRelu"}.get(
        kind, "QLinearSoftmax")
    assert op in [n.op_type for n in fuse_qdq(m).graph.node]
    ir_op = {"QLinearSigmoid": "logistic", "QLinearLeakyRelu": "leaky_relu"}.get(op, "softmax")
    g = load(m.SerializeToString())
    (node,) = [n for n in g.nodes if n.op == ir_op]
    assert node.attrs["requant"] == "onnxruntime" and g.tensors[node.outputs[0]].dtype == "int8"
    assert _lsb_diff(m) == 0.0


@pytest.mark.parametrize("kind", ["conv_softmax", "conv_softmax_last"])
@pytest.mark.parametrize("fmt", [f for f in FORMATS if not f[2]], ids=_id)  # (per channel: 13+)
def test_quantized_softmax_opset11_exact(tmp_path, kind, fmt):
    """Opset-11 Softmax (rows: everything from axis on; axis 1 by default). QDQ: onnxruntime's
    fusion writes opset 11 and the axis (1 by default); QOperator: quantize_static writes
    opset 11 and only an explicit axis, and onnxruntime then reads the schema's default -1 (the
    last axis, not the float op's 1): mirrored (measured: 0)."""
    m = _quantized(tmp_path, kind, *fmt, opset=11)
    (sm,) = [n for n in fuse_qdq(m).graph.node if n.op_type == "QLinearSoftmax"]
    assert {a.name: a.i for a in sm.attribute}["opset"] == 11
    assert _lsb_diff(m) == 0.0


def test_qdq_softmax_left_float_where_onnxruntime_does():
    """onnxruntime's x86 build converts int8 Q -> DQ pairs to uint8 pair by pair; a Softmax
    whose input is converted and output not (its Q has two readers) has mixed types and is not
    fused: fuse_qdq leaves it too (QLinearSoftmax's arithmetic is not the float softmax's)."""
    s = numpy_helper.from_array(np.float32(0.05), "s")
    z = numpy_helper.from_array(np.int8(0), "z")
    so = numpy_helper.from_array(np.float32(1 / 256), "so")
    zo = numpy_helper.from_array(np.int8(-128), "zo")
    mk = helper.make_node
    nodes = [mk("QuantizeLinear", ["x", "s", "z"], ["q"]),
             mk("DequantizeLinear", ["q", "s", "z"], ["d"]), mk("Softmax", ["d"], ["p"]),
             mk("QuantizeLinear", ["p", "so", "zo"], ["pq"]),
             mk("DequantizeLinear", ["pq", "so", "zo"], ["y"]),
             mk("DequantizeLinear", ["pq", "so", "zo"], ["y2"])]
    g = helper.make_graph(nodes, "sm", [helper.make_tensor_value_info("x", TP.FLOAT, (2, 8))],
                          [helper.make_tensor_value_info(n, TP.FLOAT, (2, 8)) for n in ("y", "y2")],
                          [s, z, so, zo])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    ops = lambda model: [n.op_type for n in model.graph.node]
    assert "Softmax" in ops(fuse_qdq(m, s8_to_u8=True))
    assert "QLinearSoftmax" in ops(fuse_qdq(m, s8_to_u8=False))


@pytest.mark.parametrize("fmt", [(QuantFormat.QDQ, QuantType.QUInt8),
                                 (QuantFormat.QOperator, QuantType.QInt8),
                                 (QuantFormat.QOperator, QuantType.QUInt8)],
                         ids=lambda f: f[0].name + "-" + f[1].name)
def test_quantized_where_exact(tmp_path, fmt):
    """Where of a conv's output and the input: QLinearWhere (QOperator with
    ForceQuantizeNoInputCheck; QDQ uint8, which onnxruntime fuses). Measured: 0. (int8 QDQ is
    left out: onnxruntime's x86 build leaves the conv reading the shared input in float.)"""
    m = _quantized(tmp_path, "conv_where", *fmt, False, ForceQuantizeNoInputCheck=True)
    assert "QLinearWhere" in [n.op_type for n in fuse_qdq(m).graph.node]
    assert _lsb_diff(m) == 0.0


@pytest.mark.parametrize("kind", ["conv_clip", "conv_transpose", "conv_reshape", "conv_flatten",
                                  "conv_resize", "conv_split", "conv_slice", "conv_gather",
                                  "conv_pad"])
@pytest.mark.parametrize("fmt", ACTIVATIONS, ids=_id)
def test_quantized_data_movement_exact(tmp_path, kind, fmt):
    """What quantize_static keeps as plain ops on the quantized tensors (QOperator: Transpose,
    Reshape, Flatten, Resize nearest, Split, Pad on (u)int8; Clip / Relu folded into the conv's
    output range; Slice and Gather left float) and their QDQ forms (onnxruntime drops the Q / DQ
    around the data movement, keeps Pad float): exactly onnxruntime (measured: 0)."""
    assert _lsb_diff(_quantized(tmp_path, kind, *fmt)) == 0.0


@pytest.mark.parametrize("op", ["Sigmoid", "LeakyRelu"])
def test_qdq_lut_mixed_types_exact(op):
    """DQ (int8) -> Sigmoid | LeakyRelu -> Q (uint8): onnxruntime does not fuse mixed types and
    runs DequantizeLinear, the float op (MLAS's logistic) and MlasQuantizeLinear, which is
    its lookup table's arithmetic: fuse_qdq fuses it anyway and the table is exact (measured:
    0; mcuforge's float logistic, TFLM's formula with expf, is not MLAS's)."""
    mk = helper.make_node
    inits = [numpy_helper.from_array(np.float32(0.06), "s"),
             numpy_helper.from_array(np.int8(-9), "z"),
             numpy_helper.from_array(np.float32(0.0041), "so"),
             numpy_helper.from_array(np.uint8(20), "zo")]
    nodes = [mk("QuantizeLinear", ["x", "s", "z"], ["q"]),
             mk("DequantizeLinear", ["q", "s", "z"], ["d"]),
             mk(op, ["d"], ["p"], **({"alpha": 0.3} if op == "LeakyRelu" else {})),
             mk("QuantizeLinear", ["p", "so", "zo"], ["pq"]),
             mk("DequantizeLinear", ["pq", "so", "zo"], ["y"])]
    g = helper.make_graph(nodes, "mixed", [helper.make_tensor_value_info("x", TP.FLOAT, X_SHAPE)],
                          [helper.make_tensor_value_info("y", TP.FLOAT, X_SHAPE)], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8
    assert f"QLinear{op}" in [n.op_type for n in fuse_qdq(m).graph.node]
    assert _lsb_diff(m, _on_grid(X_SHAPE, 0.06, -9, "int8", n=4)) == 0.0


def test_int16_qdq_activations_stay_float():
    """int16 QDQ: no QLinear* op takes int16, so DQ -> Sigmoid | Softmax -> Q is left as it is
    and imports (in float)."""
    from mcuforge.api import load
    mk = helper.make_node
    inits = [numpy_helper.from_array(np.float32(0.001), "s"),
             numpy_helper.from_array(np.int16(0), "z")]
    for op in ("Sigmoid", "Softmax"):
        nodes = [mk("QuantizeLinear", ["x", "s", "z"], ["q"]),
                 mk("DequantizeLinear", ["q", "s", "z"], ["d"]), mk(op, ["d"], ["p"]),
                 mk("QuantizeLinear", ["p", "s", "z"], ["pq"]),
                 mk("DequantizeLinear", ["pq", "s", "z"], ["y"])]
        g = helper.make_graph(nodes, "i16", [helper.make_tensor_value_info("x", TP.FLOAT, (2, 8))],
                              [helper.make_tensor_value_info("y", TP.FLOAT, (2, 8))], inits)
        m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)])
        m.ir_version = 10
        assert op in [n.op_type for n in fuse_qdq(m).graph.node]
        load(m.SerializeToString())
