"""TFLite converters: binary elementwise, comparison and logical operators (SUB, DIV, EQUAL, ...).

Registered in `tflite_ops.CONVERTERS` by `@op`; see tflite_ops for the conventions.

SUB and DIV become the IR ops "sub" / "div", which carry the fused activation as "add" and "mul"
do; ADD_N becomes "add_n"; SELECT_V2 is the generic "where". Everything else is a generic
"binary" node marked "tflm": True, so that codegen_c/lower/q_binary.py computes it as TFLM's
reference kernel does (int8 comparison operands rescaled, float MAXIMUM as a > b ? a : b, ...).
Each converter accepts exactly the element types TFLM's kernel accepts and raises Unsupported
for the others.
"""
from __future__ import annotations

import numpy as np
import tflite

from .tflite_ops import Unsupported, activation, op

COMPARE = {"EQUAL": "equal", "NOT_EQUAL": "not_equal", "GREATER": "greater",
           "GREATER_EQUAL": "greater_equal", "LESS": "less", "LESS_EQUAL": "less_equal"}
LOGICAL = {"LOGICAL_AND": "and", "LOGICAL_OR": "or"}
MAX_MIN = {"MAXIMUM": "max", "MINIMUM": "min"}

# element types each TFLM kernel accepts (its Eval's switch)
TYPES = {
    "SUB": ("float32", "int32", "int8", "int16"),
    "DIV": ("float32", "int32", "int8"),
    "EQUAL": ("bool", "float32", "int32", "int64", "int8"),
    "NOT_EQUAL": ("bool", "float32", "int32", "int64", "int8"),
    "GREATER": ("float32", "int32", "int64", "int8"),  # int16: see greater_int16 below
    "GREATER_EQUAL": ("float32", "int32", "int64", "int8"),
    "LESS": ("float32", "int32", "int64", "int8"),
    "LESS_EQUAL": ("float32", "int32", "int64", "int8"),
    "LOGICAL_AND": ("bool",),
    "LOGICAL_OR": ("bool",),
    "MAXIMUM": ("float32", "int8", "int16", "int32", "int64"),
    "MINIMUM": ("float32", "int8", "int16", "int32", "int64"),
    "FLOOR_DIV": ("float32",),
    "FLOOR_MOD": ("float32",),
    "SQUARED_DIFFERENCE": ("float32", "int32", "int8", "int16"),
    "SELECT_V2": ("float32", "int8", "int16"),
    "ADD_N": ("float32", "int8"),
}
QUANTIZED = ("int8", "int16")


def _check(ctx, operands, out_dtype=None, shaped=None, rescaled=True):
    """Inputs `operands` share an element type TFLM's kernel accepts; the output has
    `out_dtype` (default: that type) and the numpy broadcast shape of the inputs `shaped`
    (default: `operands`); with `rescaled` (the kernel does arithmetic on real values), their
    int8/int16 tensors are quantized per tensor. Returns the element type."""
    ins = [ctx.input(i) for i in operands]
    dtype = ins[0].dtype
    if any(t.dtype != dtype for t in ins):
        raise ctx.error(f"inputs of different types {[t.dtype for t in ins]}")
    if dtype not in TYPES[ctx.code]:
        if ctx.code == "GREATER" and dtype == "int16":
            raise Unsupported("int16 input: TFLM's GREATER reads int16 operands with rescaling "
                              "parameters its Prepare never sets (its results are garbage)")
        raise Unsupported(f"{dtype} input (TFLM's {ctx.code} takes {', '.join(TYPES[ctx.code])})")
    y = ctx.output()
    if y.dtype != (out_dtype or dtype):
        raise ctx.error(f"output type {y.dtype}, expected {out_dtype or dtype}")
    try:
        shape = np.broadcast_shapes(*[tuple(ctx.input(i).shape)
                                      for i in (operands if shaped is None else shaped)])
    except ValueError:
        raise ctx.error("the input shapes do not broadcast") from None
    if tuple(y.shape) != tuple(shape) and not (y.size == 1 and np.prod(shape) == 1):
        raise ctx.error(f"output shape {y.shape}, the inputs broadcast to {shape}")
    if rescaled:
        for t in [t for t in ins + [y] if t.dtype in QUANTIZED]:
            if t.quant is None or t.quant.per_axis:
                raise Unsupported(f"{dtype} tensor '{t.name}' without per-tensor quantization")
    return dtype


def _binary(ctx, fn, **attrs):
    return ctx.node("binary", {"fn": fn, "tflm": True, **attrs})


@op("SUB")
def sub(ctx):
    _check(ctx, (0, 1))
    act = activation(ctx.options(tflite.SubOptions).FusedActivationFunction())
    return ctx.node("sub", {"activation": act})


@op("DIV")
def div(ctx):
    _check(ctx, (0, 1))
    act = activation(ctx.options(tflite.DivOptions).FusedActivationFunction())
    return ctx.node("div", {"activation": act})


@op(*COMPARE)
def compare(ctx):
    dtype = _check(ctx, (0, 1), out_dtype="bool")
    if dtype == "int8":
        for t in (ctx.input(0), ctx.input(1)):
            if not 0 < t.quant.scale[0] < 1:
                raise Unsupported(f"input scale {t.quant.scale[0]}: TFLM rescales int8 "
                                  "comparison operands by their scale and requires it in (0, 1)")
    return _binary(ctx, COMPARE[ctx.code])


@op(*LOGICAL)
def logical(ctx):
    _check(ctx, (0, 1))
    return _binary(ctx, LOGICAL[ctx.code])


@op(*MAX_MIN)
def maximum_minimum(ctx):
    """The raw values are compared, whatever the quantization (TFLM does not rescale)."""
    _check(ctx, (0, 1), rescaled=False)
    return _binary(ctx, MAX_MIN[ctx.code])


@op("FLOOR_DIV")
def floor_div(ctx):
    _check(ctx, (0, 1))
    return _binary(ctx, "floor_div")


@op("FLOOR_MOD")
def floor_mod(ctx):
    _check(ctx, (0, 1))
    return _binary(ctx, "mod", fmod=0)


@op("SQUARED_DIFFERENCE")
def squared_difference(ctx):
    dtype = _check(ctx, (0, 1))
    tensors = (ctx.input(0), ctx.input(1), ctx.output())
    if dtype == "int16" and any(t.quant.zero_point[0] for t in tensors):
        raise Unsupported("int16 tensors with a zero point other than 0 (TFLM requires 0)")
    return _binary(ctx, "squared_difference")


@op("SELECT_V2")
def select_v2(ctx):
    """Raw values are selected: quantized x and y are copied as they are (TFLM does not
    requantize)."""
    if ctx.input(0).dtype != "bool":
        raise ctx.error(f"condition of type {ctx.input(0).dtype}, expected bool")
    _check(ctx, (1, 2), shaped=(0, 1, 2), rescaled=False)
    return ctx.node("where", {})


@op("ADD_N")
def add_n(ctx):
    """int8: TFLM requires every input to share one scale and zero point."""
    ins = [ctx.input(i) for i in range(len(ctx.inputs))]
    if len(ins) < 2:
        raise ctx.error(f"{len(ins)} input(s), ADD_N needs at least 2")
    dtype = _check(ctx, range(len(ins)))
    if any(tuple(t.shape) != tuple(ins[0].shape) for t in ins):
        raise ctx.error(f"inputs of different shapes {[t.shape for t in ins]}")
    if dtype == "int8" and any(t.quant != ins[0].quant for t in ins):
        raise Unsupported("int8 inputs with different quantization (TFLM requires one)")
    return ctx.node("add_n", {})
