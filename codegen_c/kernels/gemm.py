"""int8 convolutions and fully connected layers on the GEMM micro-kernels (mcuforge_nn.h):
a 1x1 stride-1 convolution or a fully connected layer is one mf_gemm_<fmt> call over its rows
of pixels, any other convolution (groups 1, dilation 1) one mf_conv_<fmt> call per image
(im2col). The input zero point is folded into the bias at compile time, the weights are packed
in the order the kernel reads them and the requantization constants are precomputed; the
schedule declines (the reference loops stay) where TFLM's arithmetic could not be reproduced
exactly (pack.py's proofs) or the layer is not a TFLM int8 one.

Weight format: "w16" (pre-widened, 2x flash, fastest on the DSP extension) on targets with
`dsp` except the layers the flash budget keeps narrow (Target.narrow_weights), "w8" (widened
in the loop) elsewhere."""
from __future__ import annotations

import numpy as np

from .. import loop_ir as ir
from .. import pack
from ..lower import OpContext
from ..lower.conv import output_multipliers
from ..lower.q_uint8 import activation_range
from . import schedules

def gemm_layer(ctx: OpContext) -> dict | None:
    """The compile-time data of the layer's GEMM form, or None when it has none: weights as
    [O, K] rows, folded bias, mf_rq rows, clamp and sign term."""
    x, w, bias, y = ctx.input(0), ctx.input(1), ctx.input(2), ctx.output()
    if ctx.node.op == "conv2d":
        if len(x.shape) != 4 or w.shape[-1] != x.shape[-1] \
                or tuple(ctx.attrs.get("dilation", (1, 1))) != (1, 1):
            return None  # grouped or dilated
    if x.dtype != "int8" or y.dtype != "int8" or w.dtype != "int8" or not w.is_const \
            or ctx.attrs.get("requant") == "onnxruntime":
        return None
    if any(t.quant is None for t in (x, w, y)) or len(x.quant.zero_point) != 1 \
            or np.any(np.asarray(w.quant.zero_point) != 0):
        return None
    if bias is not None and (not bias.is_const or bias.dtype != "int32"):
        return None
    rows = np.asarray(w.data).reshape(w.shape[0], -1).copy()
    x_zp, y_zp = int(x.quant.zero_point[0]), int(y.quant.zero_point[0])
    folded = pack.fold_bias(None if bias is None else bias.data, rows, x_zp)
    if folded is None:
        return None
    mults, shifts = (a.copy() for a in output_multipliers(ctx, rows.shape[0]))
    lo, hi = activation_range(ctx.attrs.get("activation", "none"), y.quant.scale[0], y_zp, "int8")
    const = pack.constant_channels(folded, rows, mults, shifts, y_zp, lo, hi)
    for c in const:  # computed as 0 * x + 0, the output set by the constant below
        rows[c], folded[c], mults[c], shifts[c] = 0, 0, 0, 0
    rq = pack.requant_params(mults, shifts, y_zp, pack.acc_bounds(folded, rows))
    if rq is None:
        return None
    for c, value in const.items():  # mult 0: h = 0, y = add
        rq[c] = (0, value, 1, 0)
    return dict(rows=rows, bias=folded, rq=rq, lo=int(lo), hi=int(hi), x_zp=x_zp,
                signfix=pack.needs_signfix(y_zp, int(lo)))


def weight_format(ctx: OpContext, target) -> str:
    wide = target.dsp and ctx.node.outputs[0] not in target.narrow_weights
    return "w16" if wide else "w8"


@schedules("conv2d", "fully_connected")
def gemm(ctx: OpContext, ref: ir.Kernel, target) -> ir.Kernel | None:
    if target.host:  # its own kernels (host.py), on the same proofs
        return None
    layer = gemm_layer(ctx)
    if layer is None:
        return None
    x, y = ctx.input(0), ctx.output()
    fmt = weight_format(ctx, target)
    rows = layer["rows"]
    o, k = rows.shape
    packed, _ = pack.pack_gemm_weights(rows, fmt)
    wdt = "int16" if fmt == "w16" else "int8"
    consts = [ir.Buffer("w", wdt, packed.size, "const", packed, "weights, packed"),
              ir.Buffer("bias", "int32", o, "const", layer["bias"],
                        "bias - x_zp * sum(w): the input zero point folded in"),
              ir.Buffer("rq", "int32", 4 * o, "const", layer["rq"].reshape(-1),
                        "mf_rq per channel: mult, add, pre, post")]
    common = (ir.Ptr("w", ir.Const(0)), ir.Ptr("bias", ir.Const(0)),
              ir.Ptr("rq", ir.Const(0), ctype="const mf_rq *"), ir.Const(o),
              ir.Const(layer["lo"]), ir.Const(layer["hi"]), ir.Const(layer["signfix"]))
    one_by_one = ctx.node.op == "fully_connected" or (
        rows.shape[1] == x.shape[-1] and tuple(ctx.attrs["stride"]) == (1, 1)
        and not any(ctx.attrs["padding"]))
    if one_by_one:
        n_rows = x.size // k
        scratch = pack.gemm_scratch_bytes(k)
        body = (ir.CallStmt(f"mf_gemm_{fmt}", (
            ir.Ptr("x", ir.Const(0)), ir.Const(n_rows), ir.Const(k), ir.Const(k), *common,
            ir.Ptr("y", ir.Const(0)), ir.Const(o), ir.Ptr("scratch", ir.Const(0)))),)
        how = f"{n_rows} rows x {k} taps"
    else:
        n, h, w_, c = x.shape
        _, oh, ow, _ = y.shape
        kh, kw = ctx.input(1).shape[1:3]
        (sh, sw), (pt, _, pl, _) = ctx.attrs["stride"], ctx.attrs["padding"]
        geom = np.array([h, w_, c, kh, kw, sh, sw, pt, pl, oh, ow], np.int32)
        consts.append(ir.Buffer("geom", "int32", geom.size, "const", geom,
                                "mf_conv_geom: input h w c, kernel h w, stride h w, pad t l, "
                                "output h w"))
        scratch = pack.gemm_scratch_bytes(k, im2col=True)
        body = ir.loops([("n", n)], lambda b: [ir.CallStmt(f"mf_conv_{fmt}", (
            ir.Ptr("x", b * (h * w_ * c)), ir.Ptr("geom", ir.Const(0), ctype="const mf_conv_geom *"),
            ir.Const(layer["x_zp"]), *common, ir.Ptr("y", b * (oh * ow * o)),
            ir.Ptr("scratch", ir.Const(0))))])
        how = f"im2col, {oh * ow} patches x {k} taps"
    bufs = [b for b in ref.params if b.kind != "scratch"] + consts + [
        ir.Buffer("scratch", "int16", (scratch + 1) // 2, "scratch")]
    why = " (int8: the flash budget)" if fmt == "w8" and target.dsp else ""
    doc = (f"{ref.doc}\nscheduled: mf_{'gemm' if one_by_one else 'conv'}_{fmt} ({how}), weights "
           f"{fmt}{why} packed 4 channels x 4 taps ({packed.nbytes} bytes), {scratch} bytes "
           f"scratch")
    return ir.Kernel(ctx.name, tuple(bufs), tuple(body), doc, ref.macs,
                     f"mf_{'gemm' if one_by_one else 'conv'}_{fmt}")
