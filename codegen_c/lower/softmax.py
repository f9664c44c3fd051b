"""softmax over the last axis: one runtime row call per row (TFLM's fixed-point int8 softmax)."""
from __future__ import annotations

from .. import loop_ir as ir
from .. import qparams as qp
from . import OpContext, describe, lowers


@lowers("softmax")
def softmax(ctx: OpContext) -> ir.Kernel:
    x, y = ctx.input(0), ctx.output()
    n = x.shape[-1]
    rows = x.size // n
    if x.dtype != "int8" or y.dtype != "int8":
        raise NotImplementedError(f"softmax {x.dtype} -> {y.dtype}")
    mult, shift, diff_min = qp.softmax_params(x.quant.scale[0], ctx.attrs["beta"])
    body = ir.loops([("r", rows)], lambda r: [
        ir.CallStmt("mf_softmax_s8", (ir.Ptr("x", r * n), ir.Ptr("y", r * n), ir.Const(n),
                                      ir.Const(mult), ir.Const(shift), ir.Const(diff_min)))])
    extra = f"beta {ctx.attrs['beta']}, {rows} rows of {n}"
    return ir.Kernel(ctx.name, tuple(ctx.io_buffers()), body, describe(ctx, extra))
