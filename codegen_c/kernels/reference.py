"""In-place declarations of reference kernels (the loop IR of codegen_c/lower/ kept as it is
where no schedule took the layer), after every other schedule: each one checks that the loops
are the lowering's own (the access schedule in inplace.py mirrors them), else declares
nothing."""
from __future__ import annotations

from .. import loop_ir as ir
from ..lower import OpContext
from . import inplace, schedules

ITEM = {"int8": 1, "uint8": 1, "int16": 2, "int32": 4, "float32": 4}


def _nest(body) -> list:
    """(variable, extent) of the plain loops (from 0 by 1) the body opens with, outermost
    first."""
    out = []
    while len(body) == 1 and isinstance(body[0], ir.Loop) and body[0].start == 0 \
            and body[0].step == 1:
        out.append((body[0].var, body[0].extent))
        body = body[0].body
    return out


@schedules("depthwise_conv2d")
def reference_depthwise(ctx: OpContext, ref: ir.Kernel, target) -> ir.Kernel | None:
    x, w, y = ctx.input(0), ctx.input(1), ctx.output()
    if ref.schedule or ref.in_place or len(x.shape) != 4 or x.shape[0] != 1 or len(y.shape) != 4:
        return None
    _, h, wd, c = x.shape
    _, oh, ow, o = y.shape
    loops = [(v, n) for v, n in (("n", 1), ("oy", oh), ("ox", ow), ("ic", c), ("m", o // c))
             if n > 1]  # (ir.loops emits no loop of extent 1)
    if _nest(ref.body)[:len(loops)] != loops or o % c \
            or x.dtype not in ITEM or y.dtype not in ITEM \
            or [b.name for b in ref.params if b.kind != "scratch"][:1] != ["x"]:
        return None
    stores = [s.buf for s in ir.walk(ref.body) if isinstance(s, ir.Store)]
    if set(stores) != {"y"}:
        return None
    kh, kw = w.shape[1:3]
    pt, _, pl, _ = ctx.attrs["padding"]
    acc = inplace.reference_depthwise(h, wd, c, oh, ow, o // c, kh, kw,
                                      tuple(ctx.attrs["stride"]),
                                      tuple(ctx.attrs.get("dilation", (1, 1))), pt, pl,
                                      ITEM[x.dtype], ITEM[y.dtype])
    return inplace.declare(ref, "x", acc)
