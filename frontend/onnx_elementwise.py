"""ONNX element-wise converters: see frontend/onnx_registry.py for the conventions.

Float Add/Mul/Relu/Sigmoid/Tanh/LeakyRelu/HardSwish/Softmax become the IR ops TFLite models use
("add", "relu", "logistic", ...), so the same passes and lowerings serve both frontends; the
rest become the generic "unary", "binary", "where", "cast", "log_softmax" and "hardmax".
Registered from the oldest opset whose semantics the converter handles (Add before 7
broadcast differently, so it starts at 7).
"""
from __future__ import annotations

import numpy as np

from .onnx_registry import Unsupported, onnx_op

F = "float32"


def _float_only(ctx, *tensors):
    for t in tensors:
        if t is not None and t.dtype != F:
            raise Unsupported(f"{ctx.node.op_type} on {t.dtype} tensors")


def _unary(ctx, x, fn: str, float_only: bool = True, **params):
    if float_only:
        _float_only(ctx, x)
    ctx.emit("unary", [x], fn=fn, **params)


# ---- activations --------------------------------------------------------------------------

@onnx_op("Relu", since=6)
def Relu(ctx, x):
    if x.dtype == F:
        ctx.emit("relu", [x])
    else:  # integer Relu (opset 14)
        ctx.emit("unary", [x], fn="clip", min=0, max=None)


@onnx_op("LeakyRelu", since=6)
def LeakyRelu(ctx, x, alpha=0.01):
    _float_only(ctx, x)
    ctx.emit("leaky_relu", [x], alpha=float(alpha))


@onnx_op("PRelu", since=7)
def PRelu(ctx, x, slope):
    ctx.emit("binary", [x, slope], fn="prelu")


@onnx_op("Sigmoid", since=6)
def Sigmoid(ctx, x):
    _float_only(ctx, x)
    ctx.emit("logistic", [x])


@onnx_op("Tanh", since=6)
def Tanh(ctx, x):
    _float_only(ctx, x)
    ctx.emit("tanh", [x])


@onnx_op("HardSwish", since=14)
def HardSwish(ctx, x):
    _float_only(ctx, x)
    ctx.emit("hard_swish", [x])


@onnx_op("HardSigmoid", since=6)
def HardSigmoid(ctx, x, alpha=0.2, beta=0.5):
    _unary(ctx, x, "hard_sigmoid", alpha=float(alpha), beta=float(beta))


@onnx_op("Selu", since=6)
def Selu(ctx, x, alpha=1.67326319217681884765625, gamma=1.05070102214813232421875):
    _unary(ctx, x, "selu", alpha=float(alpha), gamma=float(gamma))


@onnx_op("Elu", since=6)
def Elu(ctx, x, alpha=1.0):
    _unary(ctx, x, "elu", alpha=float(alpha))


@onnx_op("Celu", since=12)
def Celu(ctx, x, alpha=1.0):
    _unary(ctx, x, "celu", alpha=float(alpha))


@onnx_op("Softplus", since=1)
def Softplus(ctx, x):
    _unary(ctx, x, "softplus")


@onnx_op("Softsign", since=1)
def Softsign(ctx, x):
    _unary(ctx, x, "softsign")


@onnx_op("Gelu", since=20)
def Gelu(ctx, x, approximate="none"):
    if approximate not in ("none", "tanh"):
        raise Unsupported(f"Gelu approximate={approximate!r}")
    _unary(ctx, x, "gelu", approximate=approximate)


def _clip(ctx, x, lo, hi):
    """Constant bounds (None: unbounded); float [0, 6] and [0, inf) are TFLite's activations."""
    if x.dtype == F and lo == 0 and hi in (6, None):
        return ctx.emit("relu6" if hi == 6 else "relu", [x])
    num = float if x.dtype == F else int
    ctx.emit("unary", [x], fn="clip", min=None if lo is None else num(lo),
             max=None if hi is None else num(hi))


@onnx_op("Clip", since=6)
def Clip_6(ctx, x, min=None, max=None):
    _float_only(ctx, x)
    _clip(ctx, x, min, max)


@onnx_op("Clip", since=11)
def Clip(ctx, x, lo=None, hi=None):
    if all(t is None or t.is_const for t in (lo, hi)):
        return _clip(ctx, x, *(None if t is None else t.data.item() for t in (lo, hi)))
    # variable bounds: min(max(x, lo), hi) is Clip, NaN and lo > hi included
    if lo is not None and hi is not None:
        mid = ctx.tmp(ctx.out().shape, x.dtype)
        ctx.emit("binary", [x, lo], [mid], fn="max")
        ctx.emit("binary", [mid, hi], fn="min")
    else:
        ctx.emit("binary", [x, lo if hi is None else hi], fn="max" if hi is None else "min")


# ---- math --------------------------------------------------------------------------------

# ONNX op -> (unary fn of the graph IR, first opset, integer inputs allowed)
MATH = {
    "Abs": ("abs", 6, True), "Neg": ("neg", 6, True), "Sign": ("sign", 9, True),
    "Exp": ("exp", 6, False), "Log": ("log", 6, False), "Sqrt": ("sqrt", 6, False),
    "Reciprocal": ("reciprocal", 6, False), "Floor": ("floor", 6, False),
    "Ceil": ("ceil", 6, False), "Round": ("round", 11, False), "Sin": ("sin", 7, False),
    "Cos": ("cos", 7, False), "Erf": ("erf", 9, False),
}


def _math_converter(op: str, fn: str, since: int, any_type: bool):
    def convert(ctx, x):
        _unary(ctx, x, fn, float_only=not any_type)
    convert.__name__ = convert.__qualname__ = op
    onnx_op(op, since=since)(convert)


for _op, (_fn, _since, _any) in MATH.items():
    _math_converter(_op, _fn, _since, _any)


# ---- binary arithmetic --------------------------------------------------------------------

@onnx_op("Add", since=7)
def Add(ctx, a, b):
    if ctx.out().dtype == F:
        ctx.emit("add", [a, b], activation="none")
    else:
        ctx.emit("binary", [a, b], fn="add")


@onnx_op("Mul", since=7)
def Mul(ctx, a, b):
    if ctx.out().dtype == F:
        ctx.emit("mul", [a, b], activation="none")
    else:
        ctx.emit("binary", [a, b], fn="mul")


@onnx_op("Mod", since=10)
def Mod(ctx, a, b, fmod=0):
    ctx.emit("binary", [a, b], fn="mod", fmod=int(fmod))


def _chain(ctx, inputs, emit_pair, out=None):
    """A variadic op as a chain of binary nodes, left to right, into `out` (default the
    node's output); a single input is a copy."""
    out = out or ctx.out()
    if len(inputs) == 1:
        ctx.emit("reshape", [inputs[0]], [out])
        return
    acc = inputs[0]
    for k, t in enumerate(inputs[1:]):
        last = k == len(inputs) - 2
        dst = out if last else ctx.tmp(np.broadcast_shapes(acc.shape, t.shape), out.dtype)
        emit_pair(acc, t, dst)
        acc = dst


def _add(ctx, a, b, dst):
    if dst.dtype == F:
        ctx.emit("add", [a, b], [dst], activation="none")
    else:
        ctx.emit("binary", [a, b], [dst], fn="add")


@onnx_op("Sum", since=6)
def Sum(ctx, *inputs):
    _chain(ctx, inputs, lambda a, b, dst: _add(ctx, a, b, dst))


@onnx_op("Mean", since=6)
def Mean(ctx, *inputs):
    _float_only(ctx, *inputs)
    total = ctx.tmp(ctx.out().shape, F, "sum") if len(inputs) > 1 else ctx.out()
    _chain(ctx, inputs, lambda a, b, dst: _add(ctx, a, b, dst), total)
    if len(inputs) > 1:
        ctx.emit("binary", [total, ctx.const(np.float32(len(inputs)))], fn="div")


@onnx_op("Max", since=6)
def Max(ctx, *inputs):
    _chain(ctx, inputs, lambda a, b, dst: ctx.emit("binary", [a, b], [dst], fn="max"))


@onnx_op("Min", since=6)
def Min(ctx, *inputs):
    _chain(ctx, inputs, lambda a, b, dst: ctx.emit("binary", [a, b], [dst], fn="min"))


# ---- comparisons and logic ----------------------------------------------------------------

# ONNX op -> (binary fn of the graph IR, first opset): numpy broadcasting, any allowed type
BINARY = {
    "Sub": ("sub", 7), "Div": ("div", 7), "Pow": ("pow", 7), "Equal": ("equal", 7),
    "Less": ("less", 7), "Greater": ("greater", 7), "LessOrEqual": ("less_equal", 12),
    "GreaterOrEqual": ("greater_equal", 12), "And": ("and", 7), "Or": ("or", 7),
    "Xor": ("xor", 7),
}


def _binary_converter(op: str, fn: str, since: int):
    def convert(ctx, a, b):
        ctx.emit("binary", [a, b], fn=fn)
    convert.__name__ = convert.__qualname__ = op
    onnx_op(op, since=since)(convert)


for _op, (_fn, _since) in BINARY.items():
    _binary_converter(_op, _fn, _since)


@onnx_op("Not", since=1)
def Not(ctx, x):
    ctx.emit("unary", [x], fn="not")


@onnx_op("Where", since=9)
def Where(ctx, cond, a, b):
    ctx.emit("where", [cond, a, b])


@onnx_op("Cast", since=6)
def Cast(ctx, x, to=None, saturate=1, round_mode="up"):
    """`saturate` and `round_mode` only concern float8/float4 targets, which have no IR dtype
    (the import already refused them)."""
    ctx.emit("cast", [x])


@onnx_op("CastLike", since=15)
def CastLike(ctx, x, like, saturate=1, round_mode="up"):
    ctx.emit("cast", [x])


# ---- along an axis -----------------------------------------------------------------------

def _axis_op(ctx, x, op: str, axis: int, coerce_2d: bool, **attrs):
    """softmax / log_softmax / hardmax. Before opset 13 the input is coerced to 2-D at `axis`
    and the op runs along the flattened [axis:] dims: a reshape around a last-axis op."""
    if x.dtype != F:
        raise Unsupported(f"{ctx.node.op_type} on {x.dtype} tensors")
    rank = len(x.shape)
    axis = axis + rank if axis < 0 else axis
    if not 0 <= axis < max(rank, 1):
        raise Unsupported(f"{ctx.node.op_type} axis {axis} of a rank-{rank} tensor")
    if not coerce_2d or axis == rank - 1:
        ctx.emit(op, [x], axis=axis, **attrs)
        return
    rows = int(np.prod(x.shape[:axis]))
    flat = ctx.tmp((rows, int(np.prod(x.shape[axis:]))), F, "2d")
    res = ctx.tmp(flat.shape, F, "res")
    ctx.emit("reshape", [x], [flat])
    ctx.emit(op, [flat], [res], axis=1, **attrs)
    ctx.emit("reshape", [res])


@onnx_op("Softmax", since=1)
def Softmax_1(ctx, x, axis=1):
    _axis_op(ctx, x, "softmax", axis, True, beta=1.0)


@onnx_op("Softmax", since=13)
def Softmax(ctx, x, axis=-1):
    _axis_op(ctx, x, "softmax", axis, False, beta=1.0)


@onnx_op("LogSoftmax", since=1)
def LogSoftmax_1(ctx, x, axis=1):
    _axis_op(ctx, x, "log_softmax", axis, True)


@onnx_op("LogSoftmax", since=13)
def LogSoftmax(ctx, x, axis=-1):
    _axis_op(ctx, x, "log_softmax", axis, False)


@onnx_op("Hardmax", since=1)
def Hardmax_1(ctx, x, axis=1):
    _axis_op(ctx, x, "hardmax", axis, True)


@onnx_op("Hardmax", since=13)
def Hardmax(ctx, x, axis=-1):
    _axis_op(ctx, x, "hardmax", axis, False)
