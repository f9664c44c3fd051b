"""int8 avg_pool2d with requant="onnxruntime" (quantized ONNX imports): computed as onnxruntime's
CPU kernels for com.microsoft QLinearAveragePool and QLinearGlobalAveragePool, which are what
runs for quantize_static's QOperator files and for its QDQ files too (with the default session
options onnxruntime fuses DequantizeLinear -> AveragePool | GlobalAveragePool -> QuantizeLinear
into them). One rounding, from the input's quantization straight to the output's.

Two paths, chosen as onnxruntime chooses them:
- a window over the whole plane without padding (QLinearGlobalAveragePool, and
  QLinearAveragePool's fallback to it): MLAS's integer path, acc = sum(x) - x_zp * count in
  int32, then MlasRequantizeOutput: (float)acc * scale, scale = x_scale / (y_scale * (float)count)
  in float32, clamped to the output range less y_zp, rounded half to even, plus y_zp;
- any other window (qlinear_pool.cc): float32, each input dequantized as x_scale * (float)(x -
  x_zp), summed over the window's taps inside the input in row order from 0.0f, divided by
  (float)count (the kernel's size when padding is counted, else the taps inside the input),
  then nearbyintf(mean / y_scale + (float)y_zp) clamped to the output type. y_zp is the ONNX
  zero point: a uint8 output's int8 twin carries y_zp - 128, and the node's attribute
  "zp_offset" (128) gives it back, since adding 128 in float before rounding is not always the
  same as adding it after.

The float path keeps the product and the sum in separate statements, so no compiler contracts
them into a fused multiply-add (onnxruntime's x86 build does not). No libm: the rounding is
mf_round_even_f32_to_i32. The fused activation, if any, is the clamp of the int8 result.

Version followed: onnxruntime 1.31.1, the version pinned in pyproject.toml's test extra
(tests/test_onnx_quant.py compares with it bit for bit); recheck these formulas when the pin
moves (1.32.0 computes com.microsoft QLinearSoftmax differently).
"""
from __future__ import annotations

import numpy as np

from .. import loop_ir as ir
from .. import qparams as qp
from . import OpContext, const, describe, lowers
from .window import Window


def _ort(ctx: OpContext) -> bool:
    return ctx.attrs.get("requant") == "onnxruntime"


def _counts(win: Window, padding: tuple, axis: int) -> list:
    """Taps of each window along `axis` inside the input (onnxruntime's hend - hstart)."""
    f, s, size = win.filter_hw[axis], win.stride[axis], win.in_hw[axis]
    before = padding[2 * axis]
    return [sum(0 <= o * s - before + k < size for k in range(f)) for o in range(win.out_hw[axis])]


def _table(counts: list, name: str, bufs: list):
    """o -> counts[o]: a constant when all are equal, else a load from a const table."""
    if all(c == counts[0] for c in counts):
        return lambda o: ir.Const(int(counts[0]))
    bufs.append(const(name, counts, "int32"))
    return lambda o: ir.Load(name, o, "int32")


@lowers("avg_pool2d", when=_ort)
def avg_pool2d_ort(ctx: OpContext) -> ir.Kernel:
    x, y = ctx.input(0), ctx.output()
    if x.dtype != "int8" or y.dtype != "int8" or x.quant is None or y.quant is None \
            or x.quant.per_axis or y.quant.per_axis:
        raise NotImplementedError(describe(ctx, 'requant="onnxruntime" takes per-tensor int8'))
    N, H, W, C = x.shape
    _, OH, OW, _ = y.shape
    win = Window.of(ctx, ctx.attrs["filter"])
    if win.dilation != (1, 1):
        raise NotImplementedError(describe(ctx, 'requant="onnxruntime" without dilation'))
    padding = tuple(ctx.attrs["padding"])
    act = ctx.attrs.get("activation", "none")
    f32 = np.float32
    xs, ys = f32(x.quant.scale[0]), f32(y.quant.scale[0])
    xz, yz = int(x.quant.zero_point[0]), int(y.quant.zero_point[0])
    qmin, qmax = qp.activation_range_int8(act, float(ys), yz)
    bufs = list(ctx.io_buffers())
    fh, fw = win.filter_hw
    is_global = (fh, fw) == (H, W) and not any(padding)

    def load(n, iy, ix, c):
        return ir.cast(ir.Load("x", ir.flat_index([n, iy, ix, c], [N, H, W, C]), "int8"), "int32")

    if is_global:
        count = fh * fw
        scale = xs / (ys * f32(count))
        acc = ir.Var("acc", "int32")

        def body(n, oy, ox, c):
            tap = lambda iy, ix, ky, kx: [ir.Assign("acc", acc + load(n, iy, ix, c))]
            v = ir.cast(acc - xz * count, "float32") * ir.Const(float(scale), "float32")
            v = ir.call("mf_min_f32", ir.call("mf_max_f32", v, float(qmin - yz), dtype="float32"),
                        float(qmax - yz), dtype="float32")
            q = ir.call("mf_round_even_f32_to_i32", v) + yz
            return [ir.Decl("acc", "int32", ir.Const(0)), *win.taps(oy, ox, tap, ("fy", "fx")),
                    ir.Store("y", ir.flat_index([n, oy, ox, c], [N, OH, OW, C]),
                             ir.cast(q, "int8"))]
        how = (f"onnxruntime's global average pool: int32 sum - {xz} * {count}, times float32 "
               f"scale {float(scale):.9g}, rounded half to even, + {yz}")
    else:
        off = int(ctx.attrs.get("zp_offset", 0))
        if ctx.attrs.get("count_include_pad"):
            cy, cx = [fh] * OH, [fw] * OW
        else:
            cy, cx = _counts(win, padding, 0), _counts(win, padding, 1)
        count_y, count_x = _table(cy, "count_h", bufs), _table(cx, "count_w", bufs)
        count_of = lambda oy, ox: ir.cast(count_y(oy) * count_x(ox), "float32")
        acc = ir.Var("acc", "float32")

        def body(n, oy, ox, c):
            def tap(iy, ix, ky, kx):
                d = ir.cast(load(n, iy, ix, c) - xz, "float32") * ir.Const(float(xs), "float32")
                return [ir.Decl("xf", "float32", d),
                        ir.Assign("acc", acc + ir.Var("xf", "float32"))]
            v = ir.binop("/", acc, ir.Const(float(ys), "float32")) + ir.Const(float(yz + off),
                                                                              "float32")
            q = ir.call("mf_round_even_f32_to_i32", v) - off
            return [ir.Decl("acc", "float32", ir.Const(0.0, "float32")),
                    *win.taps(oy, ox, tap, ("fy", "fx")),
                    ir.Assign("acc", ir.binop("/", acc, count_of(oy, ox))),
                    ir.Store("y", ir.flat_index([n, oy, ox, c], [N, OH, OW, C]),
                             ir.cast(ir.clamp(q, qmin, qmax), "int8"))]
        counted = "padding counted" if ctx.attrs.get("count_include_pad") else "taps inside"
        how = (f"onnxruntime's QLinearAveragePool: float32 sum of {float(xs):.9g} * (x - {xz}), "
               f"/ count ({counted}), nearbyintf(mean / {float(ys):.9g} + {yz + off}) - {off}")

    loop = ir.loops([("n", N), ("oy", OH), ("ox", OW), ("c", C)], body)
    (sh, sw) = win.stride
    extra = (f"filter {fh}x{fw}, stride {sh}x{sw}, padding {padding}, activation {act}; {how}; "
             f"clamped to [{qmin}, {qmax}]")
    return ir.Kernel(ctx.name, tuple(bufs), loop, describe(ctx, extra))
