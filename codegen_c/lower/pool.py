"""avg_pool2d and max_pool2d as TFLM's reference kernels: windows clipped to the input (padding
is not counted), int8 average rounds half away from zero, then the activation clamp."""
from __future__ import annotations

import numpy as np

from .. import loop_ir as ir
from .. import qparams as qp
from . import OpContext, describe, float_activation, lowers
from .window import Window


def _pool(ctx: OpContext, kind: str) -> ir.Kernel:
    x, y = ctx.input(0), ctx.output()
    N, H, W, C = x.shape
    _, OH, OW, _ = y.shape
    win = Window.of(ctx, ctx.attrs["filter"])
    act = ctx.attrs["activation"]
    is_float = x.dtype == "float32"
    acc_dtype = "float32" if is_float else "int32"
    acc = ir.Var("acc", acc_dtype)
    if kind == "avg":
        init = ir.Const(0.0, "float32") if is_float else ir.Const(0)
    else:
        init = ir.Const(float("-inf"), "float32") if is_float else \
            ir.Const(int(np.iinfo(x.dtype).min))

    def body(n, oy, ox, c):
        def tap(iy, ix, fy, fx):
            v = ir.cast(ir.Load("x", ir.flat_index([n, iy, ix, c], [N, H, W, C]), x.dtype), acc_dtype)
            return [ir.Assign("acc", acc + v if kind == "avg" else ir.vmax(acc, v))]
        stmts = [ir.Decl("acc", acc_dtype, init), *win.taps(oy, ox, tap, ("fy", "fx"))]
        if kind == "avg":
            count = _count(win, oy, ox)
            mean = ir.binop("/", acc, ir.cast(count, "float32")) if is_float else \
                ir.call("mf_div_round_i32", acc, count)
            stmts.append(ir.Assign("acc", mean))
        if is_float:
            val = float_activation(acc, act)
        else:
            qmin, qmax = qp.activation_range_int8(act, y.quant.scale[0], y.quant.zero_point[0])
            val = ir.cast(ir.clamp(acc, qmin, qmax), y.dtype)
        return stmts + [ir.Store("y", ir.flat_index([n, oy, ox, c], [N, OH, OW, C]), val)]

    loop = ir.loops([("n", N), ("oy", OH), ("ox", OW), ("c", C)], body)
    (fh, fw), (sh, sw) = win.filter_hw, win.stride
    extra = f"filter {fh}x{fw}, stride {sh}x{sw}, padding {ctx.attrs['padding']}, activation {act}"
    return ir.Kernel(ctx.name, tuple(ctx.io_buffers()), loop, describe(ctx, extra))


def _count(win: Window, oy: ir.Expr, ox: ir.Expr) -> ir.Expr:
    """Number of taps inside the input (TFLM divides by it): a constant unless windows clip."""
    def extent(axis, o):
        f, size = win.filter_hw[axis], win.in_hw[axis]
        origin = o * win.stride[axis] - win.pad[axis]
        if isinstance(origin, ir.Const):
            return ir.Const(min(f, size - origin.value) - max(0, -origin.value))
        if not win.clipped(axis):
            return ir.Const(f)
        return ir.vmin(ir.Const(f), size - origin) - ir.vmax(ir.Const(0), 0 - origin)
    return extent(0, oy) * extent(1, ox)


@lowers("avg_pool2d")
def avg_pool2d(ctx: OpContext) -> ir.Kernel:
    return _pool(ctx, "avg")


@lowers("max_pool2d")
def max_pool2d(ctx: OpContext) -> ir.Kernel:
    return _pool(ctx, "max")
