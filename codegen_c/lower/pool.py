"""avg_pool2d and max_pool2d as TFLM's reference kernels: windows clipped to the input (padding
is not counted), int8 average rounds half away from zero, then the activation clamp."""
from __future__ import annotations

from .. import loop_ir as ir
from .. import qparams as qp
from . import OpContext, float_range, describe, lowers
from .conv import window_check


def _pool(ctx: OpContext, kind: str) -> ir.Kernel:
    x, y = ctx.input(0), ctx.output()
    N, H, W, C = x.shape
    _, OH, OW, _ = y.shape
    FH, FW = ctx.attrs["filter"]
    sh, sw = ctx.attrs["stride"]
    pt, _, pl, _ = ctx.attrs["padding"]
    act = ctx.attrs["activation"]
    is_float = x.dtype == "float32"
    acc_dtype = "float32" if is_float else "int32"

    def body(n, oy, ox, c):
        iy, cy = window_check(OH, sh, pt, FH, 1, H, oy, ir.Var("fy"))
        ix, cx = window_check(OW, sw, pl, FW, 1, W, ox, ir.Var("fx"))
        v = ir.cast(ir.Load("x", ir.flat_index([n, iy, ix, c], [N, H, W, C]), x.dtype), acc_dtype)
        acc = ir.Var("acc", acc_dtype)
        step = (ir.Assign("acc", acc + v if kind == "avg" else ir.vmax(acc, v)),)
        fx_body = (ir.If(cx, step),) if cx is not None else step
        fx_loop = ir.loops([("fx", FW)], lambda fx: fx_body)
        fy_body = (ir.If(cy, fx_loop),) if cy is not None else fx_loop
        if kind == "avg":
            init = ir.Const(0.0, "float32") if is_float else ir.Const(0)
        else:
            init = ir.Const(float("-inf"), "float32") if is_float else ir.Const(-128 if x.dtype == "int8" else -32768)
        stmts = [ir.Decl("acc", acc_dtype, init)] + list(ir.loops([("fy", FH)], lambda fy: fy_body))
        stmts = list(ir.substitute(tuple(stmts), {v: ir.Const(0) for v, k in (("fy", FH), ("fx", FW)) if k == 1}))
        if kind == "avg":
            count = _count(oy, ox, sh, sw, pt, pl, FH, FW, H, W, OH, OW)
            if is_float:
                stmts.append(ir.Assign("acc", ir.binop("/", acc, ir.cast(count, "float32"))))
            else:
                stmts.append(ir.Assign("acc", ir.call("mf_div_round_i32", acc, count)))
        out = ir.flat_index([n, oy, ox, c], [N, OH, OW, C])
        if is_float:
            lo, hi = float_range(act)
            val = acc
            if lo is not None:
                val = ir.vmax(val, ir.Const(lo, "float32"))
            if hi is not None:
                val = ir.vmin(val, ir.Const(hi, "float32"))
        else:
            qmin, qmax = qp.activation_range_int8(act, y.quant.scale[0], y.quant.zero_point[0])
            val = ir.cast(ir.clamp(acc, qmin, qmax), y.dtype)
        return stmts + [ir.Store("y", out, val)]

    loop = ir.loops([("n", N), ("oy", OH), ("ox", OW), ("c", C)], body)
    extra = f"filter {FH}x{FW}, stride {sh}x{sw}, padding {ctx.attrs['padding']}, activation {act}"
    return ir.Kernel(ctx.name, tuple(ctx.io_buffers()), loop, describe(ctx, extra))


def _count(oy, ox, sh, sw, pt, pl, FH, FW, H, W, OH, OW) -> ir.Expr:
    """Number of window elements inside the input: a constant when no window is clipped."""
    def extent(o, s, p, f, size, n_out):
        origin = o * s - p
        if isinstance(origin, ir.Const):
            return ir.Const(min(f, size - origin.value) - max(0, -origin.value))
        if p == 0 and (n_out - 1) * s + f <= size:
            return ir.Const(f)
        return ir.vmin(ir.Const(f), size - origin) - ir.vmax(ir.Const(0), 0 - origin)
    return extent(oy, sh, pt, FH, H, OH) * extent(ox, sw, pl, FW, W, OW)


@lowers("avg_pool2d")
def avg_pool2d(ctx: OpContext) -> ir.Kernel:
    return _pool(ctx, "avg")


@lowers("max_pool2d")
def max_pool2d(ctx: OpContext) -> ir.Kernel:
    return _pool(ctx, "max")
