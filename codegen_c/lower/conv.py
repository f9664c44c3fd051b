"""conv2d, depthwise_conv2d and fully_connected, int8 as TFLM's reference integer kernels:
acc = bias + sum((x - x_zp) * w), then per-channel MultiplyByQuantizedMultiplier, + y_zp, clamp.
Nodes with requant="onnxruntime" (quantized ONNX imports) rescale as onnxruntime does instead:
float32 acc * scale, round half to even (see _requant_ort).
Float tensors take the same loops with float arithmetic. conv2d may be grouped (ONNX): weights
OHWI with I = C / groups, output channel group g reading input channels g*I .. g*I + I-1.

Version followed: onnxruntime 1.31.1, the version pinned in pyproject.toml's test extra
(tests/test_onnx_quant.py compares with it bit for bit); recheck these formulas when the pin
moves (1.32.0 computes com.microsoft QLinearSoftmax differently).
"""
from __future__ import annotations

import numpy as np

from .. import loop_ir as ir
from .. import qparams as qp
from . import OpContext, const, describe, float_activation, lowers, operand, per_channel
from .q_uint8 import activation_range, mbqm, uint8_multiplier
from .window import Window


def requant_and_store(ctx: OpContext, acc: ir.Expr, channel: ir.Expr, out_index: ir.Expr,
                      bufs: list, n_out: int) -> list:
    """The output stage shared by all three ops: rescale, add the zero point, clamp, store."""
    x, w, y = ctx.input(0), ctx.input(1), ctx.output()
    act = ctx.attrs.get("activation", "none")
    if y.dtype == "float32":
        return [ir.Store("y", out_index, float_activation(acc, act))]
    _need_quant(ctx)
    w_scales = np.asarray(w.quant.scale, dtype=np.float32)
    if ctx.attrs.get("requant") == "onnxruntime":
        return _requant_ort(ctx, acc, channel, out_index, bufs, n_out, w_scales)
    mults, shifts = output_multipliers(ctx, n_out)
    m, b1 = per_channel(mults, "mult", channel)
    s, b2 = per_channel(shifts, "shift", channel)
    bufs += b1 + b2
    qmin, qmax = activation_range(act, y.quant.scale[0], y.quant.zero_point[0], y.dtype)
    if x.dtype == "uint8":  # LiteRT's rounding (per-tensor: one multiplier)
        v = mbqm(acc, int(mults[0]), int(shifts[0]), ctx.node.op) + int(y.quant.zero_point[0])
        return [ir.Store("y", out_index, ir.cast(ir.clamp(v, qmin, qmax), y.dtype))]
    v = ir.call("mf_mbqm", acc, m, s) + int(y.quant.zero_point[0])
    return [ir.Store("y", out_index, ir.cast(ir.clamp(v, qmin, qmax), y.dtype))]


def output_multipliers(ctx: OpContext, n_out: int) -> tuple:
    """TFLM's (LiteRT's for uint8) per-channel output multipliers and shifts of an integer
    conv2d / depthwise_conv2d / fully_connected, broadcast to n_out channels."""
    x, w, bias, y = ctx.input(0), ctx.input(1), ctx.input(2), ctx.output()
    w_scales = np.asarray(w.quant.scale, dtype=np.float32)
    bias_scale = bias.quant.scale[0] if bias is not None and bias.quant else None
    if x.dtype == "uint8":  # legacy uint8 models: LiteRT's per-tensor multiplier
        mults, shifts = uint8_multiplier(x.quant.scale[0], w_scales, y.quant.scale[0],
                                         bias_scale)
    elif ctx.node.op == "fully_connected":
        mults, shifts = qp.fc_output_multipliers(x.quant.scale[0], w_scales, y.quant.scale[0],
                                                 bias_scale)
    else:
        mults, shifts = qp.conv_output_multipliers(x.quant.scale[0], w_scales, y.quant.scale[0])
    return np.broadcast_to(mults, n_out), np.broadcast_to(shifts, n_out)


def _requant_ort(ctx: OpContext, acc: ir.Expr, channel: ir.Expr, out_index: ir.Expr,
                 bufs: list, n_out: int, w_scales) -> list:
    """onnxruntime's MlasRequantizeOutput: (float)acc * scale in float32, clamped to the
    output range less the zero point, rounded half to even, plus the zero point. scale is
    x_scale * w_scale / y_scale in float32, as QLinearConv / QLinearMatMul / QGemm compute it."""
    x, y, act = ctx.input(0), ctx.output(), ctx.attrs.get("activation", "none")
    f32 = np.float32
    scales = np.broadcast_to(f32(x.quant.scale[0]) * w_scales / f32(y.quant.scale[0]), n_out)
    scales = scales.astype(np.float32)
    if np.all(scales == scales[0]):
        sc = ir.Const(float(scales[0]), "float32")
    else:
        sc = ir.Load("oscale", channel, "float32")
        bufs.append(const("oscale", scales, "float32"))
    zp = int(y.quant.zero_point[0])
    qmin, qmax = qp.activation_range_int8(act, y.quant.scale[0], zp)
    v = ir.cast(acc, "float32") * sc
    v = ir.call("mf_min_f32", ir.call("mf_max_f32", v, float(qmin - zp), dtype="float32"),
                float(qmax - zp), dtype="float32")
    q = ir.call("mf_round_even_f32_to_i32", v) + zp
    return [ir.Store("y", out_index, ir.cast(q, y.dtype))]


def _acc_init(ctx: OpContext, bias, channel: ir.Expr, bufs: list):
    float_path = ctx.output().dtype == "float32"
    acc_dtype = "float32" if float_path else "int32"
    if bias is None:
        return ir.Const(0.0 if float_path else 0, acc_dtype), acc_dtype
    name, table = operand(ctx, 2, "bias")
    bufs += table
    return ir.cast(ir.Load(name, channel, bias.dtype), acc_dtype), acc_dtype


def _need_quant(ctx: OpContext) -> None:
    """Integer layers compute with the scales of their input, weights and output."""
    x, w, y = ctx.input(0), ctx.input(1), ctx.output()
    if x.dtype == "float32" and y.dtype == "float32":
        return
    for t in (x, w, y):
        if t.quant is None:
            raise NotImplementedError(f"tensor '{t.name}' ({t.dtype}) has no quantization "
                                      "parameters")


def _x_term(ctx: OpContext, idx: ir.Expr) -> ir.Expr:
    x = ctx.input(0)
    v = ir.Load("x", idx, x.dtype)
    if x.dtype == "float32":
        return v
    return ir.cast(v, "int32") - int(x.quant.zero_point[0])


def _w_term(w, idx: ir.Expr, buf: str = "w") -> ir.Expr:
    v = ir.Load(buf, idx, w.dtype)
    if w.dtype == "float32":
        return v
    zp = int(w.quant.zero_point[0]) if w.quant else 0
    return ir.cast(v, "int32") - zp


@lowers("conv2d")
def conv2d(ctx: OpContext) -> ir.Kernel:
    _need_quant(ctx)
    x, w, bias, y = ctx.input(0), ctx.input(1), ctx.input(2), ctx.output()
    N, H, W, C = x.shape
    O, KH, KW, CI = w.shape
    _, OH, OW, _ = y.shape
    G = C // CI  # groups: output channel group g reads input channels g*CI .. g*CI + CI-1
    if G * CI != C or O % G:
        raise NotImplementedError(f"conv2d: {C} input channels, weights of {CI}, {O} outputs")
    win = Window.of(ctx, (KH, KW))
    wb, wconst = operand(ctx, 1, "w")
    bufs = ctx.io_buffers() + wconst

    def body(n, oy, ox, g, oc):
        acc0, acc_dtype = _acc_init(ctx, bias, oc, bufs)
        acc = ir.Var("acc", acc_dtype)

        def tap(iy, ix, ky, kx):
            return ir.loops([("ic", CI)], lambda ic: [ir.Assign("acc", acc + _x_term(
                ctx, ir.flat_index([n, iy, ix, g * CI + ic], [N, H, W, C])) * _w_term(
                w, ir.flat_index([oc, ky, kx, ic], [O, KH, KW, CI]), wb))])
        out = ir.flat_index([n, oy, ox, oc], [N, OH, OW, O])
        return [ir.Decl("acc", acc_dtype, acc0), *win.taps(oy, ox, tap),
                *requant_and_store(ctx, acc, oc, out, bufs, O)]

    if G == 1:
        loop = ir.loops([("n", N), ("oy", OH), ("ox", OW), ("oc", O)],
                        lambda n, oy, ox, oc: body(n, oy, ox, ir.Const(0), oc))
    else:
        OG = O // G
        loop = ir.loops([("n", N), ("oy", OH), ("ox", OW), ("g", G), ("og", OG)],
                        lambda n, oy, ox, g, og: body(n, oy, ox, g, g * OG + og))
    macs = N * OH * OW * O * KH * KW * CI
    return ir.Kernel(ctx.name, tuple(_dedup(bufs)), loop, _doc(ctx, win, macs), macs)


@lowers("depthwise_conv2d")
def depthwise_conv2d(ctx: OpContext) -> ir.Kernel:
    _need_quant(ctx)
    x, w, bias, y = ctx.input(0), ctx.input(1), ctx.input(2), ctx.output()
    N, H, W, C = x.shape
    _, KH, KW, O = w.shape
    _, OH, OW, _ = y.shape
    M = O // C
    win = Window.of(ctx, (KH, KW))
    wb, wconst = operand(ctx, 1, "w")
    bufs = ctx.io_buffers() + wconst

    def body(n, oy, ox, ic, m):
        oc = ic * M + m
        acc0, acc_dtype = _acc_init(ctx, bias, oc, bufs)
        acc = ir.Var("acc", acc_dtype)

        def tap(iy, ix, ky, kx):
            return [ir.Assign("acc", acc + _x_term(ctx, ir.flat_index([n, iy, ix, ic], [N, H, W, C]))
                              * _w_term(w, ir.flat_index([ky, kx, oc], [KH, KW, O]), wb))]
        out = ir.flat_index([n, oy, ox, oc], [N, OH, OW, O])
        return [ir.Decl("acc", acc_dtype, acc0), *win.taps(oy, ox, tap),
                *requant_and_store(ctx, acc, oc, out, bufs, O)]

    loop = ir.loops([("n", N), ("oy", OH), ("ox", OW), ("ic", C), ("m", M)], body)
    macs = N * OH * OW * O * KH * KW
    return ir.Kernel(ctx.name, tuple(_dedup(bufs)), loop,
                     _doc(ctx, win, macs, f"depth multiplier {M}, "), macs)


def _doc(ctx: OpContext, win: Window, macs: int, more: str = "") -> str:
    (sh, sw), (dh, dw) = win.stride, win.dilation
    return describe(ctx, f"stride {sh}x{sw}, dilation {dh}x{dw}, padding "
                         f"{ctx.attrs['padding']}, {more}activation {ctx.attrs['activation']}, "
                         f"{macs} MACs")


@lowers("fully_connected")
def fully_connected(ctx: OpContext) -> ir.Kernel:
    _need_quant(ctx)
    x, w, bias = ctx.input(0), ctx.input(1), ctx.input(2)
    O, I = w.shape
    B = x.size // I
    wb, wconst = operand(ctx, 1, "w")
    bufs = ctx.io_buffers() + wconst

    def body(b, o):
        acc0, acc_dtype = _acc_init(ctx, bias, o, bufs)
        mac = lambda i: [ir.Assign("acc", ir.Var("acc", acc_dtype)
                                   + _x_term(ctx, b * I + i) * _w_term(w, o * I + i, wb))]
        stmts = [ir.Decl("acc", acc_dtype, acc0)] + list(ir.loops([("i", I)], mac))
        return stmts + requant_and_store(ctx, ir.Var("acc", acc_dtype), o, b * O + o, bufs, O)

    loop = ir.loops([("b", B), ("o", O)], body)
    macs = B * O * I
    extra = f"activation {ctx.attrs['activation']}, {macs} MACs"
    return ir.Kernel(ctx.name, tuple(_dedup(bufs)), loop, describe(ctx, extra), macs)


def _dedup(bufs: list) -> list:
    seen, out = set(), []
    for b in bufs:
        if b.name not in seen:
            seen.add(b.name)
            out.append(b)
    return out
