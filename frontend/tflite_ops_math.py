"""TFLite converters: unary elementwise operators (ABS, EXP, RSQRT, ...), float and quantized.

Registered in `tflite_ops.CONVERTERS` by `@op`; see tflite_ops for the conventions.
"""
from __future__ import annotations

from .tflite_ops import op  # noqa: F401


FLOAT_UNARY = {"ABS": "abs", "EXP": "exp"}


@op(*FLOAT_UNARY)
def float_unary(ctx):
    if ctx.input(0).dtype != "float32":
        from .tflite_ops import Unsupported
        raise Unsupported(f"{ctx.input(0).dtype} input")
    return ctx.node("unary", {"fn": FLOAT_UNARY[ctx.code]})
