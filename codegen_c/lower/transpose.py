"""transpose: a copy loop nest over the output, reading the input through the permutation."""
from __future__ import annotations

from .. import loop_ir as ir
from . import OpContext, describe, lowers


@lowers("transpose")
def transpose(ctx: OpContext) -> ir.Kernel:
    x, y = ctx.input(0), ctx.output()
    perm = tuple(ctx.attrs["perm"])
    out_shape = tuple(y.shape)

    def body(*idx):
        src = [0] * len(perm)
        for out_axis, in_axis in enumerate(perm):
            src[in_axis] = idx[out_axis]
        return [ir.Store("y", ir.flat_index(list(idx), out_shape),
                         ir.Load("x", ir.flat_index(src, x.shape), x.dtype))]

    loop = ir.loops([(f"i{d}", n) for d, n in enumerate(out_shape)], body)
    return ir.Kernel(ctx.name, tuple(ctx.io_buffers()), loop, describe(ctx, f"perm {perm}"))
