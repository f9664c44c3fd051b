"""Lowerings: data movement and slicing kernels for TFLite's operators (any element type).

Registered with `@lowers(op, when=...)` so they serve only the nodes they accept; see
codegen_c/lower/__init__.py.
"""
from __future__ import annotations

from . import lowers  # noqa: F401


# ---- data family: PADV2 whose constant_values is a run-time input ----------------------------

def _runtime_pad_value(ctx) -> bool:
    v = ctx.input(2)
    return ctx.attrs.get("mode", "constant") == "constant" and v is not None and not v.is_const


@lowers("pad", when=_runtime_pad_value)
def pad_runtime_value(ctx):
    """Constant padding with a value read at run time from a one-element input (TFLM's PADV2
    reads constant_values at every invoke): fill the output with it, then copy the input into
    its place. Pads are non-negative, as TFLite's are."""
    from .. import loop_ir as ir
    from . import describe
    from .elementwise import operand_names

    x, y = ctx.input(0), ctx.output()
    pads = ctx.attrs["pads"]
    if any(b < 0 or a < 0 for b, a in pads):
        raise NotImplementedError("negative pads with a run-time pad value")
    names, consts = operand_names(ctx)  # x is a buffer or (rarely) the constant c0
    src, value = names[0], names[2]
    body = [ir.Decl("v", y.dtype, ir.Load(value, ir.Const(0), y.dtype))]
    body += ir.loops([("i", y.size)], lambda i: [ir.Store("y", i, ir.Var("v", y.dtype))])
    body += ir.loops([(f"i{d}", n) for d, n in enumerate(x.shape)], lambda *idx: [
        ir.Store("y", ir.flat_index([i + b for i, (b, _) in zip(idx, pads)], y.shape),
                 ir.Load(src, ir.flat_index(list(idx), x.shape), x.dtype))])
    consts = [c for c in consts if c.name == "c0"]
    return ir.Kernel(ctx.name, tuple(ctx.io_buffers() + consts), tuple(body),
                     describe(ctx, f"pads {[tuple(p) for p in pads]}, value {value}[0] at "
                                   "run time"))
