"""ONNX dynamic quantization as onnxruntime's `quantize_dynamic` writes it: DynamicQuantizeLinear
(uint8 activations quantized with a range measured at run time) feeding MatMulInteger with
constant int8 / uint8 weights, then Cast, Mul by the scales and Add of the bias (those three
are ordinary float ops).

Both become float graph ops computing exactly what the spec and onnxruntime's CPU kernels
compute:
- DynamicQuantizeLinear: lo = min(0, min(x)), hi = max(0, max(x)); scale = (hi - lo) / 255
  (1 when hi == lo, as onnxruntime); zero point = round(clip(0 - lo / scale, 0, 255)); y =
  clip(round(x / scale) + zero point, 0, 255); rounding half to even, float32 throughout.
- MatMulInteger: the integer products summed in float32, which is exact while every partial
  sum stays below 2**24 in magnitude. The bound 255 * max over columns of sum |w - w_zp| is
  checked at compile time; a layer that could exceed it is refused (Unsupported).
"""
from __future__ import annotations

import numpy as np

from .onnx_registry import OnnxContext, Unsupported, onnx_op

EXACT = 2 ** 24  # float32 holds every integer of smaller magnitude


def _binary(ctx, fn, a, b, shape, hint, dtype="float32"):
    y = ctx.tmp(shape, dtype, hint)
    ctx.emit("binary", [a, b], [y], fn=fn)
    return y


@onnx_op("DynamicQuantizeLinear", since=11)
def DynamicQuantizeLinear(ctx, x):
    if x.dtype != "float32":
        raise Unsupported(f"DynamicQuantizeLinear of {x.dtype} (float32 only)")
    y, y_scale, y_zp = (ctx.out(i) for i in range(3))
    axes = tuple(range(len(x.shape)))
    scalar = tuple(y_scale.shape)
    f = lambda v, hint: ctx.const(np.float32(v).reshape(scalar), "float32", hint)  # noqa: E731
    zero, one, top = f(0.0, "zero"), f(1.0, "one"), f(255.0, "qmax")
    lo, hi = ctx.tmp(scalar, "float32", "min"), ctx.tmp(scalar, "float32", "max")
    ctx.emit("reduce", [x], [lo], fn="min", axes=axes, keep_dims=False)
    ctx.emit("reduce", [x], [hi], fn="max", axes=axes, keep_dims=False)
    lo = _binary(ctx, "min", lo, zero, scalar, "lo")
    hi = _binary(ctx, "max", hi, zero, scalar, "hi")
    span = _binary(ctx, "sub", hi, lo, scalar, "span")
    flat = _binary(ctx, "equal", span, zero, scalar, "flat", "bool")
    ctx.emit("where", [flat, one, _binary(ctx, "div", span, top, scalar, "s")], [y_scale])
    zp = _binary(ctx, "sub", zero, _binary(ctx, "div", lo, y_scale, scalar, "ls"), scalar, "z")
    zp = _round(ctx, _clip(ctx, zp, zero, top, scalar), scalar)
    ctx.emit("cast", [zp], [y_zp])
    q = _round(ctx, _binary(ctx, "div", x, y_scale, x.shape, "xs"), x.shape)
    q = _clip(ctx, _binary(ctx, "add", q, zp, x.shape, "xz"), zero, top, x.shape)
    ctx.emit("cast", [q], [y])


def _clip(ctx, v, lo, hi, shape):
    return _binary(ctx, "max", _binary(ctx, "min", v, hi, shape, "ch"), lo, shape, "cl")


def _round(ctx, v, shape):
    y = ctx.tmp(shape, "float32", "r")
    ctx.emit("unary", [v], [y], fn="round")  # half to even
    return y


@onnx_op("MatMulInteger", since=10)
def MatMulInteger(ctx, a, b, a_zero_point=None, b_zero_point=None):
    out = ctx.out()
    if not (b.is_const and len(b.shape) == 2) or a.is_const:
        raise Unsupported("MatMulInteger needs constant 2-D weights (right operand)")
    if b_zero_point is not None and not b_zero_point.is_const:
        raise Unsupported("MatMulInteger with a weight zero point computed at run time")
    if a.dtype not in ("uint8", "int8") or b.dtype not in ("uint8", "int8"):
        raise Unsupported(f"MatMulInteger of {a.dtype} and {b.dtype}")
    w = b.data.astype(np.int64)
    if b_zero_point is not None:
        w = w - np.asarray(b_zero_point.data, np.int64).reshape(-1)[None, :] \
            if np.size(b_zero_point.data) > 1 else w - int(np.asarray(b_zero_point.data).flat[0])
    _check_exact(w.T, "MatMulInteger")
    af = _minus_zero_point(ctx, a, a_zero_point, "a")
    acc = ctx.tmp(out.shape, "float32", "acc")
    weights = ctx.const(np.ascontiguousarray(w.T.astype(np.float32)), hint="w")
    ctx.emit("fully_connected", [af, weights], [acc], activation="none")
    ctx.emit("cast", [acc], [out])


def _check_exact(w: np.ndarray, what: str) -> None:
    """Sums of |x - x_zp| <= 255 times one output's weights (axis 0) stay exact in float32."""
    bound = 255 * int(np.abs(w).reshape(w.shape[0], -1).sum(axis=1).max(initial=0))
    if bound >= EXACT:
        raise Unsupported(f"{what} whose sums may reach {bound}, past float32's exact "
                          "integers (2**24)")


def _minus_zero_point(ctx, x, zero_point, hint: str):
    """x - zero_point in float32: exact, both are 8-bit integers."""
    xf = ctx.tmp(x.shape, "float32", hint + "f")
    ctx.emit("cast", [x], [xf])
    if zero_point is None:
        return xf
    zf = ctx.tmp(zero_point.shape, "float32", hint + "zp")
    ctx.emit("cast", [zero_point], [zf])
    return _binary(ctx, "sub", xf, zf, x.shape, hint + "c")


@onnx_op("ConvInteger", since=10)
def ConvInteger(ctx, x, w, x_zero_point=None, w_zero_point=None, auto_pad="NOTSET",
                dilations=None, group=1, kernel_shape=None, pads=None, strides=None):
    """(x - x_zp) conv (w - w_zp), padded with zeros of that difference (x's zero point, as
    the spec and onnxruntime pad), through the float Conv converter: exact as MatMulInteger."""
    from .onnx_layers import Conv
    if not w.is_const or x.is_const:
        raise Unsupported("ConvInteger needs constant weights")
    if w_zero_point is not None and not w_zero_point.is_const:
        raise Unsupported("ConvInteger with a weight zero point computed at run time")
    if x.dtype not in ("uint8", "int8") or w.dtype not in ("uint8", "int8"):
        raise Unsupported(f"ConvInteger of {x.dtype} and {w.dtype}")
    wi = w.data.astype(np.int64)
    if w_zero_point is not None:
        zp = np.asarray(w_zero_point.data, np.int64).reshape(-1)
        wi = wi - (zp.reshape(-1, *[1] * (wi.ndim - 1)) if zp.size > 1 else zp[0])
    _check_exact(wi, "ConvInteger")
    xf = _minus_zero_point(ctx, x, x_zero_point, "x")
    out = ctx.out()
    acc = ctx.tmp(out.shape, "float32", "acc")
    Conv(OnnxContext(ctx.b, ctx.node, [acc]), xf, ctx.const(wi.astype(np.float32), hint="w"),
         None, auto_pad=auto_pad, dilations=dilations, group=group, kernel_shape=kernel_shape,
         pads=pads, strides=strides)
    ctx.emit("cast", [acc], [out])
