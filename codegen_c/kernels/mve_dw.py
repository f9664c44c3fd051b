"""Helium (MVE) schedules for the Cortex-M55: int8 depthwise convolution on mf_mve_dw_conv_s8
(runtime_c/mcuforge_mve_dw.h; any kh x kw and stride, depth multiplier 1: per channel a
zero-point-bordered int8 plane, tap gathers and VMLADAV, four outputs requantized a vector)
and int8 ADD on mf_mve_dw_add_s8. Registered before the DSP schedules (depthwise.py,
eltwise.py) and tried only when the target has `mve`; each declines (None) where its packing cannot prove the fast
form exact, and the next schedule (the DSP kernel, then the reference loops) takes the layer."""
from __future__ import annotations

import dataclasses

import numpy as np

from .. import loop_ir as ir
from .. import pack, pack_mve_dw
from ..lower import OpContext
from ..lower.conv import output_multipliers
from ..lower.q_uint8 import activation_range
from . import inplace, schedules, tflm_int8_layer


@schedules("depthwise_conv2d")
def depthwise(ctx: OpContext, ref: ir.Kernel, target) -> ir.Kernel | None:
    if not target.mve or not tflm_int8_layer(ctx):
        return None
    x, w, bias, y = ctx.input(0), ctx.input(1), ctx.input(2), ctx.output()
    if len(x.shape) != 4 or len(w.shape) != 4 or w.shape[0] != 1:
        return None
    n, h, wd, c = x.shape
    _, oh, ow, o = y.shape
    kh, kw = w.shape[1:3]
    if w.shape[3] != c or o != c:  # depth multiplier 1
        return None
    pt, _, pl, _ = ctx.attrs["padding"]
    geom = pack_mve_dw.geometry(h, wd, c, oh, ow, (kh, kw), tuple(ctx.attrs["stride"]), pt, pl,
                                dilation=tuple(ctx.attrs.get("dilation", (1, 1))))
    if geom is None:
        return None
    x_zp, y_zp = int(x.quant.zero_point[0]), int(y.quant.zero_point[0])
    weights = np.asarray(w.data).reshape(kh, kw, c).astype(np.int64).copy()
    b = np.zeros(c, np.int64) if bias is None else np.asarray(bias.data, np.int64).copy()
    mults, shifts = (a.copy() for a in output_multipliers(ctx, c))
    lo, hi = activation_range(ctx.attrs.get("activation", "none"), y.quant.scale[0], y_zp, "int8")
    rows = weights.reshape(kh * kw, c).T
    folded = pack.fold_bias(b, rows, x_zp)
    if folded is None:
        return None
    const = pack.constant_channels(folded, rows, mults, shifts, y_zp, lo, hi)
    for ch in const:  # computed as 0 and set by the constant (see gemm.py)
        weights[:, :, ch], b[ch], mults[ch], shifts[ch] = 0, 0, 0, 0
    packed = pack_mve_dw.pack_dw(weights, b, x_zp, mults, shifts, y_zp, geom["transpose"],
                                 geom["pair"], pack_mve_dw.view_kernel(geom)[2])
    if packed is None:
        return None
    for ch, value in const.items():  # bias 0, mult 0, add = the constant, post 0, pre 1
        packed[ch, :5] = (0, 0, value, 0, 1)
    g = np.array([geom[f] for f in pack_mve_dw.GEOM_FIELDS], np.int16)
    scratch = pack_mve_dw.scratch_bytes(geom)
    signfix = pack.needs_signfix(y_zp, int(lo))
    fn = "mf_mve_dw_conv_s8"
    consts = [ir.Buffer("pk", "int32", packed.size, "const", packed.reshape(-1),
                        "per channel: bias', mult, add, post, pre, int8 weights (vectors of "
                        "16 lanes)"),
              ir.Buffer("geom", "int16", g.size, "const", g,
                        "mf_mve_dw_geom: " + " ".join(pack_mve_dw.GEOM_FIELDS))]
    body = ir.loops([("n", n)], lambda i: [ir.CallStmt(fn, (
        ir.Ptr("x", i * (h * wd * c)), ir.Ptr("y", i * (oh * ow * c)), ir.Ptr("pk", ir.Const(0)),
        ir.Ptr("geom", ir.Const(0), ctype="const mf_mve_dw_geom *"), ir.Const(x_zp),
        ir.Const(int(lo)), ir.Const(int(hi)), ir.Const(signfix),
        ir.Ptr("scratch", ir.Const(0))))])
    bufs = [b_ for b_ in ref.params if b_.kind != "scratch"] + consts + [
        ir.Buffer("scratch", "int8", scratch, "scratch")]
    doc = (f"{ref.doc}\nscheduled: {fn} (Helium), a {geom['ph']}x{geom['pw']} int8 plane per "
           f"channel ({scratch} bytes scratch), one tap gather + VMLADAV per output")
    return inplace.declare(ir.Kernel(ctx.name, tuple(bufs), tuple(body), doc, ref.macs, fn),
                           "x", None if n != 1 else inplace.channels(
                               h, wd, c, oh, ow, geom["cg"] if geom["cg"] > 1 else 1))


@schedules("add")
def add(ctx: OpContext, ref: ir.Kernel, target) -> ir.Kernel | None:
    """int8 ADD of same-shape activations on mf_mve_dw_add_s8: the constants and the proof of
    the DSP schedule (eltwise.add: pack_ew.add_constants, all 65536 input pairs), four elements
    a vector."""
    if not target.mve:
        return None
    from . import eltwise
    k = eltwise.add(ctx, ref, target)
    if k is None or k.schedule != "mf_ew_add_s8":
        return None
    fn = "mf_mve_dw_add_s8"
    body = tuple(dataclasses.replace(s, fn=fn) if isinstance(s, ir.CallStmt) else s
                 for s in k.body)
    doc = k.doc.replace("scheduled: mf_ew_add_s8", f"scheduled: {fn} (Helium)")
    # its own declaration (the DSP kernel's was checked against mf_ew_add_s8): four elements
    # a vector, each read before it is written
    k = dataclasses.replace(k, body=body, doc=doc, schedule=fn, in_place=())
    n = ctx.output().size
    return inplace.declare(inplace.declare(k, "x", inplace.elementwise(n)), "x1",
                           inplace.elementwise(n))


def _pool(ctx: OpContext, ref: ir.Kernel, target, dsp, fn: str) -> ir.Kernel | None:
    """The DSP schedule's pool kernel (eltwise.py: same checks, same geometry) calling fn."""
    if not target.mve:
        return None
    k = dsp(ctx, ref, target)
    if k is None:
        return None

    def call(s):
        if not isinstance(s, ir.CallStmt):
            return s
        args = tuple(dataclasses.replace(a, ctype="const mf_mve_dw_pool_geom *")
                     if isinstance(a, ir.Ptr) and a.buf == "geom" else a for a in s.args)
        return dataclasses.replace(s, fn=fn, args=args)

    body = tuple(_walk_replace(s, call) for s in k.body)
    doc = k.doc.split("\nscheduled:")[0] + f"\nscheduled: {fn} (Helium: channels in lanes)"
    return dataclasses.replace(k, body=body, doc=doc, schedule=fn)


def _walk_replace(s, f):
    """s with f applied to every statement inside loops (the batch loop of the pool calls)."""
    if isinstance(s, ir.Loop):
        return dataclasses.replace(s, body=tuple(_walk_replace(b, f) for b in s.body))
    return f(s)


@schedules("avg_pool2d")
def avg_pool(ctx: OpContext, ref: ir.Kernel, target) -> ir.Kernel | None:
    from . import eltwise
    return _pool(ctx, ref, target, eltwise.avg_pool, "mf_mve_dw_avgpool_s8")


@schedules("max_pool2d")
def max_pool(ctx: OpContext, ref: ir.Kernel, target) -> ir.Kernel | None:
    from . import eltwise
    return _pool(ctx, ref, target, eltwise.max_pool, "mf_mve_dw_maxpool_s8")
