"""avg_pool2d and max_pool2d as TFLM's reference kernels: windows clipped to the input (padding
is not counted), int8 average rounds half away from zero, then the activation clamp.

Optional attributes (ONNX): "dilation" (h, w), and for avg_pool2d "count_include_pad" (divide by
the taps inside the padded input, as ONNX's count_include_pad=1). Integer tensors without
quantization (ONNX uint8/int8 MaxPool) are pooled as plain integers."""
from __future__ import annotations

import numpy as np

from .. import loop_ir as ir
from .. import qparams as qp
from . import OpContext, const, describe, float_activation, lowers
from .q_uint8 import activation_range
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

    bufs = list(ctx.io_buffers())
    if kind == "avg":
        count_y = _counts(ctx, win, 0, "count_h", bufs)
        count_x = _counts(ctx, win, 1, "count_w", bufs)

    def body(n, oy, ox, c):
        def tap(iy, ix, fy, fx):
            v = ir.cast(ir.Load("x", ir.flat_index([n, iy, ix, c], [N, H, W, C]), x.dtype), acc_dtype)
            return [ir.Assign("acc", acc + v if kind == "avg" else ir.vmax(acc, v))]
        stmts = [ir.Decl("acc", acc_dtype, init), *win.taps(oy, ox, tap, ("fy", "fx"))]
        if kind == "avg":
            count = count_y(oy) * count_x(ox)
            mean = ir.binop("/", acc, ir.cast(count, "float32")) if is_float else \
                ir.call("mf_div_round_i32", acc, count)
            stmts.append(ir.Assign("acc", mean))
        if is_float:
            val = float_activation(acc, act)
        elif y.quant is None:  # plain integers (ONNX): no requantization
            if act != "none":
                raise NotImplementedError(f"{ctx.node.op} {y.dtype} with activation {act}")
            val = ir.cast(acc, y.dtype)
        else:
            qmin, qmax = activation_range(act, y.quant.scale[0], y.quant.zero_point[0],
                                          y.dtype)
            val = ir.cast(ir.clamp(acc, qmin, qmax), y.dtype)
        return stmts + [ir.Store("y", ir.flat_index([n, oy, ox, c], [N, OH, OW, C]), val)]

    loop = ir.loops([("n", N), ("oy", OH), ("ox", OW), ("c", C)], body)
    (fh, fw), (sh, sw) = win.filter_hw, win.stride
    extra = f"filter {fh}x{fw}, stride {sh}x{sw}, padding {ctx.attrs['padding']}, activation {act}"
    if win.dilation != (1, 1):
        extra += f", dilation {win.dilation[0]}x{win.dilation[1]}"
    if ctx.attrs.get("count_include_pad"):
        extra += ", padding counted"
    return ir.Kernel(ctx.name, tuple(bufs), loop, describe(ctx, extra))


def _counts(ctx: OpContext, win: Window, axis: int, name: str, bufs: list):
    """Taps of each window along `axis` that the average divides by, as a function of the output
    coordinate: those inside the input (TFLM), or inside the padded input with count_include_pad.
    A constant unless windows clip, else a small const table (bufs gets it)."""
    f, s, d, size = win.filter_hw[axis], win.stride[axis], win.dilation[axis], win.in_hw[axis]
    before, after = ctx.attrs["padding"][2 * axis: 2 * axis + 2]
    lo, hi = (-before, size + after) if ctx.attrs.get("count_include_pad") else (0, size)
    counts = [sum(lo <= o * s - before + k * d < hi for k in range(f))
              for o in range(win.out_hw[axis])]
    if all(c == counts[0] for c in counts):
        return lambda o: ir.Const(counts[0])
    bufs.append(const(name, counts, "int32"))
    return lambda o: ir.Load(name, o, "int32")


@lowers("avg_pool2d")
def avg_pool2d(ctx: OpContext) -> ir.Kernel:
    return _pool(ctx, "avg")


@lowers("max_pool2d")
def max_pool2d(ctx: OpContext) -> ir.Kernel:
    return _pool(ctx, "max")
