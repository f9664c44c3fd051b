"""int8 depthwise 3x3 convolutions (stride 1 or 2, depth multiplier 1) on mf_dw3x3_s8
(runtime_c/mcuforge_dw.h): channels in bands of 4 (more a pass on small images) widened to
planar int16 rows with the zero point as their border, weights packed per kernel row as int16
pairs; the call names the entry of the layer's variant (pack_dw.entry: stride, sign term,
clamp, row shape), so a model links only the kernel code its layers use. The schedule
declines (the reference loops stay) where codegen_c/pack_dw.py cannot prove the fast form exact
or the layer is not a TFLM int8 one."""
from __future__ import annotations

import numpy as np

from .. import loop_ir as ir
from .. import pack, pack_dw
from ..lower import OpContext
from ..lower.conv import output_multipliers
from ..lower.q_uint8 import activation_range
from . import inplace, schedules, tflm_int8_layer


@schedules("depthwise_conv2d")
def depthwise(ctx: OpContext, ref: ir.Kernel, target) -> ir.Kernel | None:
    if target.host:  # its own kernels (host.py)
        return None
    x, w, bias, y = ctx.input(0), ctx.input(1), ctx.input(2), ctx.output()
    if not tflm_int8_layer(ctx) or len(x.shape) != 4:
        return None
    n, h, wd, c = x.shape
    _, oh, ow, o = y.shape
    if w.shape[3] != c or o != c:  # depth multiplier 1
        return None
    pt, _, pl, _ = ctx.attrs["padding"]
    # a band of a --memory-priority stage (optimizer/patch.py): the least scratch (one output
    # row, 4 channels a pass), since it is live beside the stage's input at the arena's peak
    budget = 0 if ctx.attrs.get("band_of") is not None else pack_dw.DEFAULT_BUDGET
    geom = pack_dw.geometry(h, wd, c, oh, ow, tuple(ctx.attrs["stride"]), pt, pl,
                            kernel=w.shape[1:3], dilation=tuple(ctx.attrs.get("dilation", (1, 1))),
                            budget=budget)
    if geom is None:
        return None
    x_zp, y_zp = int(x.quant.zero_point[0]), int(y.quant.zero_point[0])
    weights = np.asarray(w.data).reshape(3, 3, c).astype(np.int64).copy()
    b = np.zeros(c, np.int64) if bias is None else np.asarray(bias.data, np.int64).copy()
    mults, shifts = (a.copy() for a in output_multipliers(ctx, c))
    lo, hi = activation_range(ctx.attrs.get("activation", "none"), y.quant.scale[0], y_zp, "int8")
    folded = pack.fold_bias(b, weights.reshape(9, c).T, x_zp)
    if folded is None:
        return None
    const = pack.constant_channels(folded, weights.reshape(9, c).T, mults, shifts, y_zp, lo, hi)
    for ch in const:  # computed as 0 and set by the constant (see gemm.py)
        weights[:, :, ch], b[ch], mults[ch], shifts[ch] = 0, 0, 0, 0
    packed = pack_dw.pack_dw(weights, b, x_zp, mults, shifts, y_zp, geom["transpose"])
    if packed is None:
        return None
    for ch, value in const.items():  # mult 0, add = the constant, post 0
        packed[ch, 6:] = (0, 0, value, 0)
    g = np.array([geom[f] for f in pack_dw.GEOM_FIELDS], np.int16)
    scratch = pack_dw.scratch_bytes(geom)
    signfix = pack.needs_signfix(y_zp, int(lo))
    entry = pack_dw.entry(geom, signfix, int(lo), int(hi))
    consts = [ir.Buffer("pk", "int32", packed.size, "const", packed.reshape(-1),
                        "per channel: weight pairs [w0,w1] [w1,w2] of rows 0-2 (x 2^pre), "
                        "bias', mult, add, post"),
              ir.Buffer("geom", "int16", g.size, "const", g,
                        "mf_dw_geom: " + " ".join(pack_dw.GEOM_FIELDS))]
    body = ir.loops([("n", n)], lambda i: [ir.CallStmt(entry, (
        ir.Ptr("x", i * (h * wd * c)), ir.Ptr("y", i * (oh * ow * c)), ir.Ptr("pk", ir.Const(0)),
        ir.Ptr("geom", ir.Const(0), ctype="const mf_dw_geom *"), ir.Const(x_zp),
        ir.Const(int(lo)), ir.Const(int(hi)), ir.Const(signfix),
        ir.Ptr("scratch", ir.Const(0))))])
    bufs = [b_ for b_ in ref.params if b_.kind != "scratch"] + consts + [
        ir.Buffer("scratch", "int16", (scratch + 1) // 2, "scratch")]
    doc = (f"{ref.doc}\nscheduled: {entry}, {geom['cg']} channels a pass widened to "
           f"planar int16 rows ({scratch} bytes scratch), weights as int16 pairs")
    return inplace.declare(ir.Kernel(ctx.name, tuple(bufs), tuple(body), doc, ref.macs, entry),
                           "x", inplace.dw3x3(geom) if n == 1 else None)
