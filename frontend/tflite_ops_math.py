"""TFLite converters: elementwise math (ABS, EXP, RSQRT, ROUND, ELU, CAST, ...) and the row ops
L2_NORMALIZATION and LOG_SOFTMAX, float and quantized; PRELU.

Registered in `tflite_ops.CONVERTERS` by `@op`; see tflite_ops for the conventions. Every op
maps onto a generic IR op (unary, binary, cast, broadcast_to, log_softmax) or onto
l2_normalization; quantization stays on the tensors and the lowerings in
codegen_c/lower/q_math.py reproduce TFLM's integer arithmetic for them. Each converter accepts
exactly the element types TFLM's kernel accepts: a model TFLM cannot run is Unsupported here.
"""
from __future__ import annotations

import numpy as np
import tflite

from .tflite_ops import Unsupported, activation, op

# TFLite op -> (unary fn, element types TFLM's kernel accepts)
UNARY = {
    "CEIL": ("ceil", ("float32",)),
    "COS": ("cos", ("float32",)),
    "EXP": ("exp", ("float32",)),
    "FLOOR": ("floor", ("float32",)),
    "LOG": ("log", ("float32",)),
    "NEG": ("neg", ("float32",)),
    "SIN": ("sin", ("float32",)),
    "SQRT": ("sqrt", ("float32",)),
    "LOGICAL_NOT": ("not", ("bool",)),
    "ABS": ("abs", ("float32", "int8", "int16")),
    "RSQRT": ("rsqrt", ("float32", "int8", "int16")),
    # TFLM's own formulas, which round differently from the generic ones (see graph.OPS)
    "ROUND": ("round", ("float32",)),
    "ELU": ("elu", ("float32", "int8")),
}
EXTRA_ATTRS = {"ROUND": {"tflm": True}, "ELU": {"alpha": 1.0, "tflm": True}}


def _types(ctx, allowed, *tensors):
    """Unsupported unless every tensor has an element type in `allowed`."""
    for t in tensors:
        if t.dtype not in allowed:
            raise Unsupported(f"{t.dtype} tensor '{t.name}': TFLM's {ctx.code} takes "
                              f"{' / '.join(allowed)}")


def _quantized(ctx, x, y):
    """int8 / int16 tensors must be quantized (TFLM: per-tensor; int16 zero points 0), except
    ABS on int16, which TFLM also evaluates unquantized (both tensors then plain)."""
    if x.dtype == "float32" or x.dtype == "bool":
        return
    if ctx.code == "ABS" and x.dtype == "int16" and x.quant is None and y.quant is None:
        return
    for t in (x, y):
        if t.quant is None:
            raise Unsupported(f"{t.dtype} tensor '{t.name}' without quantization")
        if t.quant.per_axis:
            raise Unsupported(f"per-axis quantization of '{t.name}'")
        if t.dtype == "int16" and t.quant.zero_point[0] != 0:
            raise Unsupported(f"int16 tensor '{t.name}' with zero point {t.quant.zero_point[0]}")


@op(*UNARY)
def unary(ctx):
    fn, allowed = UNARY[ctx.code]
    x, y = ctx.input(0), ctx.output()
    _types(ctx, allowed, x, y)
    if x.dtype != y.dtype or x.shape != y.shape:
        raise ctx.error(f"{x.dtype}{list(x.shape)} -> {y.dtype}{list(y.shape)}")
    _quantized(ctx, x, y)
    return ctx.node("unary", {"fn": fn, **EXTRA_ATTRS.get(ctx.code, {})})


@op("SQUARE")
def square(ctx):
    """x * x: pow(x, 2), which the generic lowering emits as the product."""
    x = ctx.input(0)
    _types(ctx, ("float32",), x, ctx.output())
    two = ctx.new_tensor("two", (), "float32", data=np.float32(2.0))
    return ctx.node("binary", {"fn": "pow"}, inputs=(ctx.inputs[0], two))


# TFLM's CAST: static_cast between these (uint32, which mcuforge lacks, aside)
CAST_FROM = ("int8", "int16", "int32", "float32", "bool")
CAST_TO = ("int8", "int16", "int32", "float32", "bool")


@op("CAST")
def cast(ctx):
    """Raw values converted as C does (quantization is ignored, as TFLM ignores it)."""
    x, y = ctx.input(0), ctx.output()
    _types(ctx, CAST_FROM, x)
    _types(ctx, CAST_TO, y)
    if x.size != y.size:
        raise ctx.error(f"shapes {list(x.shape)} -> {list(y.shape)}")
    return ctx.node("cast", {})


@op("ZEROS_LIKE")
def zeros_like(ctx):
    """Zeros of the input's shape: raw 0 whatever the quantization (TFLM writes 0, not the
    zero point), broadcast from a one-element constant."""
    x, y = ctx.input(0), ctx.output()
    _types(ctx, ("int8", "int32", "int64", "float32"), x, y)
    zero = ctx.new_tensor("zero", (), y.dtype, data=np.zeros((), y.dtype), quant=y.quant)
    return ctx.node("broadcast_to", {}, inputs=(zero,))


@op("LOG_SOFTMAX")
def log_softmax(ctx):
    """Along the last axis. int8: TFLM requires the output scale 16/256 and zero point 127."""
    x, y = ctx.input(0), ctx.output()
    _types(ctx, ("float32", "int8"), x, y)
    if x.shape != y.shape:
        raise ctx.error(f"shapes {list(x.shape)} -> {list(y.shape)}")
    if x.dtype == "int8":
        _quantized(ctx, x, y)
        if np.float32(y.quant.scale[0]) != np.float32(16 / 256) or y.quant.zero_point[0] != 127:
            raise Unsupported("int8 output not at scale 16/256, zero point 127 (TFLM's)")
    return ctx.node("log_softmax", {"axis": len(x.shape) - 1})


@op("L2_NORMALIZATION")
def l2_normalization(ctx):
    """Along the last axis, epsilon 1e-6 as TFLM hard-codes; int8 output at scale 1/128."""
    x, y = ctx.input(0), ctx.output()
    _types(ctx, ("float32", "int8"), x, y)
    if x.shape != y.shape or len(x.shape) > 4:
        raise ctx.error(f"shapes {list(x.shape)} -> {list(y.shape)} (TFLM: rank <= 4)")
    act = activation(ctx.options(tflite.L2NormOptions).FusedActivationFunction())
    if act != "none":
        raise Unsupported(f"fused activation {act} (TFLM accepts none)")
    if x.dtype == "int8":
        _quantized(ctx, x, y)
    return ctx.node("l2_normalization", {"epsilon": 1e-6})


@op("PRELU")
def prelu(ctx):
    """x >= 0 ? x : x * alpha, alpha broadcast (numpy rules, TFLM: rank <= 4). float32, or
    int8 / int16 input with an int8 alpha, requantized with TFLM's two multipliers."""
    x, alpha, y = ctx.input(0), ctx.input(1), ctx.output()
    _types(ctx, ("float32", "int8", "int16"), x)
    want = "float32" if x.dtype == "float32" else "int8"
    if alpha.dtype != want or y.dtype != x.dtype:
        raise Unsupported(f"{x.dtype} input with {alpha.dtype} alpha and {y.dtype} output")
    try:
        shape = np.broadcast_shapes(tuple(x.shape), tuple(alpha.shape))
    except ValueError:
        raise ctx.error(f"alpha {list(alpha.shape)} does not broadcast to {list(x.shape)}")
    if tuple(shape) != tuple(y.shape) or len(shape) > 4:
        raise ctx.error(f"output {list(y.shape)} for {list(x.shape)} and {list(alpha.shape)}")
    if x.dtype != "float32":
        _quantized(ctx, x, y)
        if alpha.quant is None or alpha.quant.per_axis:
            raise Unsupported("alpha without per-tensor quantization")
    return ctx.node("binary", {"fn": "prelu"})
