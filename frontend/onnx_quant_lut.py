"""Quantized ONNX lookup-table converters: QLinearSigmoid, QLinearLeakyRelu, QLinearSoftmax
and QLinearWhere (and the QDQ patterns fuse_qdq fuses into them, frontend/onnx_qdq.py).

They become the graph IR's int8 logistic / leaky_relu / where / softmax with
requant="onnxruntime" (codegen_c/lower/lut_ort.py): onnxruntime's 256-entry lookup tables built
at compile time in its float32 arithmetic, and its softmax kernel (float exp table, float sum).
uint8 operands are carried as int8 twins (frontend/onnx_quant.py).

Version followed: onnxruntime 1.31.1, the version pinned in pyproject.toml's test extra
(tests/test_onnx_quant.py compares with it bit for bit); recheck these formulas when the pin
moves (1.32.0 computes com.microsoft QLinearSoftmax differently).
"""
from __future__ import annotations

import numpy as np

from mcuforge.ir.graph import Tensor

from .onnx_registry import Unsupported, onnx_op
from .onnx_quant import _act_quant, _emit_first, _zp_offset, as_int8, out_int8


# ---- com.microsoft QLinearSigmoid / QLinearLeakyRelu / QLinearSoftmax / QLinearWhere --------
# All become the graph IR's int8 op with requant="onnxruntime" (codegen_c/lower/lut_ort.py:
# onnxruntime's lookup tables, built at compile time in its float32 arithmetic; QLinearSoftmax
# as its float table-and-sum kernel). Input and output may be int8 or uint8 (int8 twins);
# onnxruntime's kernels take one type, but the result is the same bytes either way, which lets
# fuse_qdq route DQ -> Sigmoid | LeakyRelu | Where -> Q of mixed types through them too.

def _unary_lut(ctx, op: str, X, x_scale, x_zp, y_scale, y_zp, **attrs):
    what = ctx.node.op_type
    if y_scale is None:
        raise Unsupported(f"{what}: no output scale")
    out = ctx.out()
    start = len(ctx.b.nodes)
    x8 = as_int8(ctx, X, _act_quant(X, x_scale, x_zp, what))
    y8 = out_int8(ctx, out, _act_quant(out, y_scale, y_zp, what))
    ctx.emit(op, [x8], [y8], requant="onnxruntime", **attrs)
    _emit_first(ctx, start)


@onnx_op("QLinearSigmoid")
def QLinearSigmoid(ctx, X, X_scale, X_zero_point=None, Y_scale=None, Y_zero_point=None):
    """int8 logistic, requant="onnxruntime": onnxruntime's 256-entry table of MLAS's logistic."""
    _unary_lut(ctx, "logistic", X, X_scale, X_zero_point, Y_scale, Y_zero_point)


@onnx_op("QLinearLeakyRelu")
def QLinearLeakyRelu(ctx, X, X_scale, X_zero_point=None, Y_scale=None, Y_zero_point=None,
                     alpha=0.01):
    """int8 leaky_relu, requant="onnxruntime": onnxruntime's 256-entry table."""
    _unary_lut(ctx, "leaky_relu", X, X_scale, X_zero_point, Y_scale, Y_zero_point,
               alpha=float(np.float32(alpha)))


@onnx_op("QLinearSoftmax")
def QLinearSoftmax(ctx, X, X_scale, x_zero_point=None, y_scale=None, y_zero_point=None,
                   axis=-1, opset=None):
    """int8 softmax with requant="onnxruntime" (onnxruntime's table-and-sum kernel). The
    attribute opset (required, as by onnxruntime) picks the rows: 13 and up along axis, below
    13 over everything from axis on (reshaped to 2-D around the softmax). axis defaults to the
    schema's -1 whatever opset says: onnxruntime reads that default (quantize_static's opset-11
    files leave axis out; onnxruntime then runs the last axis, measured). zp_offset as for the
    pools: 128 where onnxruntime runs the kernel on uint8 (it matters where its arithmetic
    overflows, codegen_c/lower/lut_ort.py)."""
    what = "QLinearSoftmax"
    if opset is None:
        raise Unsupported(f"{what} without its opset attribute (onnxruntime requires it)")
    if X.dtype != ctx.out().dtype:
        raise Unsupported(f"{what}: {X.dtype} input, {ctx.out().dtype} output")
    if y_scale is None:
        raise Unsupported(f"{what}: no output scale")
    out = ctx.out()
    rank = len(X.shape)
    if rank == 0:
        raise Unsupported(f"{what} of a scalar")
    ax = axis % rank
    start = len(ctx.b.nodes)
    x8 = as_int8(ctx, X, _act_quant(X, X_scale, x_zero_point, what))
    y8 = out_int8(ctx, out, _act_quant(out, y_scale, y_zero_point, what))
    zp_offset = _zp_offset(ctx, out, y_zero_point)
    if opset >= 13 or ax == rank - 1:
        ctx.emit("softmax", [x8], [y8], beta=1.0, axis=ax, requant="onnxruntime",
                 zp_offset=zp_offset)
    else:  # rows of everything from axis on
        shape = (int(np.prod(X.shape[:ax])), int(np.prod(X.shape[ax:])))
        x2 = ctx.b.add_tensor(Tensor(ctx.tmp(shape, "int8", "rows").name, shape, "int8",
                                     quant=x8.quant))
        ctx.emit("reshape", [x8], [x2])
        y2 = ctx.b.add_tensor(Tensor(ctx.tmp(shape, "int8", "sm").name, shape, "int8",
                                     quant=y8.quant))
        ctx.emit("softmax", [x2], [y2], beta=1.0, axis=1, requant="onnxruntime",
                 zp_offset=zp_offset)
        ctx.emit("reshape", [y2], [y8])
    _emit_first(ctx, start)


@onnx_op("QLinearWhere")
def QLinearWhere(ctx, condition, X, x_scale, x_zero_point, Y, y_scale, y_zero_point, z_scale,
                 z_zero_point):
    """int8 where with requant="onnxruntime": each operand through onnxruntime's identity
    lookup table to the output's quantization (none where it is quantized alike)."""
    what = "QLinearWhere"
    if condition.dtype != "bool":
        raise Unsupported(f"{what}: a {condition.dtype} condition")
    out = ctx.out()
    start = len(ctx.b.nodes)
    x8 = as_int8(ctx, X, _act_quant(X, x_scale, x_zero_point, what))
    y8 = as_int8(ctx, Y, _act_quant(Y, y_scale, y_zero_point, what))
    z8 = out_int8(ctx, out, _act_quant(out, z_scale, z_zero_point, what))
    ctx.emit("where", [condition, x8, y8], [z8], requant="onnxruntime")
    _emit_first(ctx, start)
