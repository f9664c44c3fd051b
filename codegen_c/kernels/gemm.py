"""int8 convolutions and fully connected layers on the GEMM micro-kernels (mcuforge_nn.h):
a 1x1 stride-1 convolution or a fully connected layer is one mf_gemm_<fmt> call over its rows
of pixels, any other convolution (groups 1, dilation 1; also a depthwise convolution of one
input channel) one mf_conv_<fmt> call per image (im2col). The input zero point is folded into the bias at compile time, the weights are packed
in the order the kernel reads them and the requantization constants are precomputed; the
schedule declines (the reference loops stay) where TFLM's arithmetic could not be reproduced
exactly (pack.py's proofs) or the layer is not a TFLM int8 one.

1x1 convolutions and fully connected layers over 2+ rows with O even, the clamp the int8 range
and 2^pre folded into the weights take mf_gemm2_w16 (2 channels x 2 rows; K = 8:
mf_gemm1k8_w16, the row in registers), whose one int32 stream holds weights, bias and mf_rq.

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
from . import conv_geometry, inplace, schedules, tflm_int8_layer

def gemm_layer(ctx: OpContext) -> dict | None:
    """The compile-time data of the layer's GEMM form, or None when it has none: weights as
    [O, K] rows, folded bias, mf_rq rows, clamp and sign term."""
    x, w, bias, y = ctx.input(0), ctx.input(1), ctx.input(2), ctx.output()
    if ctx.node.op != "fully_connected":
        if len(x.shape) != 4 or tuple(ctx.attrs.get("dilation", (1, 1))) != (1, 1):
            return None  # dilated
        # grouped convolutions decline; a depthwise convolution of a single input channel
        # (depth multiplier M: micro_speech's first layer) is the convolution 1 -> M
        inner = w.shape[-1] if ctx.node.op == "conv2d" else 1
        if inner != x.shape[-1]:
            return None
    if not tflm_int8_layer(ctx):
        return None
    if ctx.node.op == "depthwise_conv2d":  # [1, KH, KW, M] -> rows [M, KH * KW]
        rows = np.asarray(w.data).reshape(-1, w.shape[-1]).T.copy()
    else:
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
    zero_acc = ~rows.any(axis=1) & (folded == 0)
    return dict(rows=rows, bias=folded, rq=rq, lo=int(lo), hi=int(hi), x_zp=x_zp,
                signfix=pack.signfix_mode(y_zp, int(lo), rq, zero_acc))


def weight_format(ctx: OpContext, target) -> str:
    wide = target.dsp and ctx.node.outputs[0] not in target.narrow_weights
    return "w16" if wide else "w8"


@schedules("conv2d", "fully_connected", "depthwise_conv2d")
def gemm(ctx: OpContext, ref: ir.Kernel, target) -> ir.Kernel | None:
    if target.host:  # its own kernels (host.py), on the same proofs
        return None
    layer = gemm_layer(ctx)
    if layer is None:
        return None
    x, y = ctx.input(0), ctx.output()
    fmt = weight_format(ctx, target)
    rows, bias, rq, signfix = layer["rows"], layer["bias"], layer["rq"], layer["signfix"]
    o, k = rows.shape
    folded = pack.fold_pre(rows, bias, rq) if fmt == "w16" else None
    if folded is not None:  # int16 weights hold 2^pre too: no shift before the multiply
        (rows, bias, rq), signfix = folded, signfix | pack.PRE0
    # a band of a --memory-priority stage asking for its least scratch ("lean": set by
    # optimizer/patch.py where the RAM pays for the instructions) takes im2col without the row
    # cache (mf_conv_lean_*: a patch gathered from the input per pixel, 3 Kp bytes of scratch)
    lean = bool(ctx.attrs.get("lean"))
    rp = None if lean else convrp(ctx, ref, layer, fmt, folded is not None, rows, bias, rq,
                                  signfix)
    if rp is not None:
        return rp
    # a convolution with its patch read from widened rows (mf_convp_*) where windows overlap
    # (k_w >= 2) and stride_w is 1 or in_c a multiple of 4 (rows widened as whole groups):
    # widening every input row once per output row is then cheaper than widening (and
    # gathering) every patch. Measured in whole models on the M4: ResNet-8's 3x3 layers
    # 0.94 -> 0.89 instr/MAC (stride 2: 0.88 -> 0.87), its first layer 1.55 -> 1.38; stride 2
    # with 1 or 3 channels lost 1-6 % and stays with im2col (the first layers of VWW, KWS and
    # ResNet-8 take mf_convrp above)
    pair = None
    if ctx.node.op != "fully_connected" and k != x.shape[-1] and not lean:
        kh, kw = ctx.input(1).shape[1:3]
        if kw >= 2 and (ctx.attrs["stride"][1] == 1 or x.shape[-1] % 4 == 0):
            pair = (kh, kw, x.shape[-1])
            rows = pack.pair_rows(rows, *pair)
    packed, _ = pack.pack_gemm_weights(rows, fmt)
    wdt = "int16" if fmt == "w16" else "int8"
    consts = [ir.Buffer("w", wdt, packed.size, "const", packed, "weights, packed"),
              ir.Buffer("bias", "int32", o, "const", bias,
                        "bias - x_zp * sum(w): the input zero point folded in"
                        + (", times 2^pre" if folded is not None else "")),
              ir.Buffer("rq", "int32", 4 * o, "const", rq.reshape(-1),
                        "mf_rq per channel: mult, add, pre, post")]
    common = (ir.Ptr("w", ir.Const(0)), ir.Ptr("bias", ir.Const(0)),
              ir.Ptr("rq", ir.Const(0), ctype="const mf_rq *"), ir.Const(o),
              ir.Const(layer["lo"]), ir.Const(layer["hi"]), ir.Const(signfix))
    # the entries specialised on K (K loop unrolled) where their fast path applies
    g = pack.kpad(rows.shape[1]) // 4
    entry = f"{fmt}_g{g}" if folded is not None and g <= pack.MAX_UNROLLED_GROUPS and (
        layer["lo"], layer["hi"]) == (-128, 127) else fmt
    one_by_one = ctx.node.op == "fully_connected" or (
        k == x.shape[-1] and tuple(ctx.attrs["stride"]) == (1, 1)
        and not any(ctx.attrs["padding"]))
    sat = (layer["lo"], layer["hi"]) == (-128, 127)
    strided = not one_by_one and k == x.shape[-1] and not any(ctx.attrs["padding"])
    if (one_by_one or strided) and k8(fmt, folded is not None, sat, signfix, k):
        return gemm2_kernel(ctx, ref, x, y, rows, bias, rq, signfix, "mf_gemm1k8_w16")
    if (one_by_one or strided) and pair2(fmt, folded is not None, sat, signfix, o, k,
                                         y.shape[2] if strided else x.size // k):
        return gemm2_kernel(ctx, ref, x, y, rows, bias, rq, signfix)
    if one_by_one:
        n_rows = x.size // k
        scratch = pack.gemm_scratch_bytes(k)
        body = (ir.CallStmt(f"mf_gemm_{entry}", (
            ir.Ptr("x", ir.Const(0)), ir.Const(n_rows), ir.Const(k), ir.Const(k), *common,
            ir.Ptr("y", ir.Const(0)), ir.Const(o), ir.Ptr("scratch", ir.Const(0)))),)
        how = f"{n_rows} rows x {k} taps"
        access = inplace.gemm_rows([(0, 0, n_rows, k, k, o, o)], x.nbytes, y.nbytes, 1)
    elif k == x.shape[-1] and not any(ctx.attrs["padding"]):
        # a strided 1x1 convolution: per output row, one call over every stride_w-th pixel
        n, h, w_, c = x.shape
        _, oh, ow, _ = y.shape
        sh, sw = ctx.attrs["stride"]
        scratch = pack.gemm_scratch_bytes(k)
        body = ir.loops([("n", n), ("oy", oh)], lambda b, oy: [ir.CallStmt(f"mf_gemm_{entry}", (
            ir.Ptr("x", b * (h * w_ * c) + oy * (sh * w_ * c)), ir.Const(ow), ir.Const(sw * c),
            ir.Const(k), *common, ir.Ptr("y", b * (oh * ow * o) + oy * (ow * o)), ir.Const(o),
            ir.Ptr("scratch", ir.Const(0))))])
        how = f"{oh} output rows x {ow} pixels x {k} taps, input stride {sw} pixels"
        one_by_one = True
        access = None if n != 1 else inplace.gemm_rows(
            [(oy * sh * w_ * c, oy * ow * o, ow, sw * c, k, o, o) for oy in range(oh)],
            x.nbytes, y.nbytes, 1)
    else:
        n, geom, buf = conv_geometry(ctx)
        h, w_, c, kh, kw, sh, sw, _, _, oh, ow = (int(v) for v in geom)
        consts.append(buf)
        conv = "convp" if pair else "conv_lean" if lean else "conv"
        if lean:  # no row cache: the patch gathered from the input per pixel
            entry, scratch = fmt, pack.conv_lean_scratch_bytes(kh * kw * c)
        else:
            scratch = (pack.convp_scratch_bytes if pair else pack.conv_scratch_bytes)(
                kh, kw, c, sw, ow)
        body = ir.loops([("n", n)], lambda b: [ir.CallStmt(f"mf_{conv}_{entry}", (
            ir.Ptr("x", b * (h * w_ * c)), ir.Ptr("geom", ir.Const(0), ctype="const mf_conv_geom *"),
            ir.Const(layer["x_zp"]), *common, ir.Ptr("y", b * (oh * ow * o)),
            ir.Ptr("scratch", ir.Const(0))))])
        how = (f"patches from rows widened once per output row, {oh * ow} x {rows.shape[1]} taps"
               if pair else f"im2col, {oh * ow} patches x {k} taps"
               + (", each gathered from the input (no row cache)" if lean else ""))
        # (mf_conv_lean_* declares nothing: not among inplace.VERIFIED's tested kernels)
        access = None if n != 1 or lean else inplace.conv_rows(h, w_, c, oh, ow, o, kh, sh,
                                                                 int(geom[7]))
    bufs = [b for b in ref.params if b.kind != "scratch"] + consts + [
        ir.Buffer("scratch", "int16", (scratch + 1) // 2, "scratch")]
    why = " (int8: the flash budget)" if fmt == "w8" and target.dsp else ""
    name = f"mf_{'gemm' if one_by_one else conv}_{entry}"
    doc = (f"{ref.doc}\nscheduled: {name} ({how}), weights "
           f"{fmt}{why} packed 4 channels x 4 taps ({packed.nbytes} bytes), {scratch} bytes "
           f"scratch")
    return inplace.declare(ir.Kernel(ctx.name, tuple(bufs), tuple(body), doc, ref.macs, name),
                           "x", access)


# mf_gemm2_w16 (2 channels x 2 rows, 10 instructions per 16 MACs in its K loop against 11)
# where it is measured faster than the 4 x 1 entries (mf_gemm_w16_g<G>, mf_gemm_w16):
# K >= GEMM2_MIN_K, O even, at least two rows per call, clamp = the int8 range, 2^pre folded
GEMM2_MIN_K = 1


def pair2(fmt: str, pre0: bool, sat: bool, signfix: int, o: int, k: int, rows: int) -> bool:
    return (fmt == "w16" and pre0 and sat and signfix & 3 != 1 and o % 2 == 0 and rows >= 2
            and k >= GEMM2_MIN_K)


# mf_gemm1k8_w16 (K = 8: the row in registers, one LDM per channel, 9 instructions an output
# against 11 in mf_gemm2_w16), same conditions less O even and 2+ rows
def k8(fmt: str, pre0: bool, sat: bool, signfix: int, k: int) -> bool:
    return fmt == "w16" and pre0 and sat and signfix & 3 != 1 and k == 8


def gemm2_kernel(ctx: OpContext, ref: ir.Kernel, x, y, rows, bias, rq, signfix,
                 kernel="mf_gemm2_w16") -> ir.Kernel:
    """mf_gemm2_w16 / mf_gemm1k8_w16 calls: one over every pixel (stride 1) or fully connected
    row, else one per output row of a strided 1x1 convolution."""
    o, k = rows.shape
    if kernel == "mf_gemm1k8_w16":
        stream, scratch = pack.pack_gemm1k8(rows, bias, rq), 4  # (no scratch used)
        what = "per channel: bias, weights, mf_rq less pre (int32 words)"
    else:
        stream, scratch = pack.pack_gemm2(rows, bias, rq), pack.gemm2_scratch_bytes(k)
        what = "per pair of channels: bias twice, weights, mf_rq less pre (int32 words)"
    consts = [ir.Buffer("w", "int32", stream.size, "const", stream, what)]
    tail = (ir.Ptr("w", ir.Const(0)), ir.Const(o), ir.Const(signfix))
    entry = f"{kernel}_s{signfix & 3}"  # the code of one sign-term mode (0 or 2)
    if ctx.node.op == "fully_connected" or tuple(ctx.attrs["stride"]) == (1, 1):
        n_rows = x.size // k
        body = (ir.CallStmt(entry, (
            ir.Ptr("x", ir.Const(0)), ir.Const(n_rows), ir.Const(k), ir.Const(k), *tail,
            ir.Ptr("y", ir.Const(0)), ir.Const(o), ir.Ptr("scratch", ir.Const(0)))),)
        how = f"{n_rows} rows x {k} taps"
        calls = [(0, 0, n_rows, k, k, o, o)]
    else:
        n, h, w_, c = x.shape
        _, oh, ow, _ = y.shape
        sh, sw = ctx.attrs["stride"]
        body = ir.loops([("n", n), ("oy", oh)], lambda b, oy: [ir.CallStmt(entry, (
            ir.Ptr("x", b * (h * w_ * c) + oy * (sh * w_ * c)), ir.Const(ow), ir.Const(sw * c),
            ir.Const(k), *tail, ir.Ptr("y", b * (oh * ow * o) + oy * (ow * o)), ir.Const(o),
            ir.Ptr("scratch", ir.Const(0))))])
        how = f"{oh} output rows x {ow} pixels x {k} taps, input stride {sw} pixels"
        calls = None if n != 1 else [(oy * sh * w_ * c, oy * ow * o, ow, sw * c, k, o, o)
                                     for oy in range(oh)]
    bufs = [b for b in ref.params if b.kind != "scratch"] + consts + [
        ir.Buffer("scratch", "int16", (scratch + 1) // 2, "scratch")]
    # mf_gemm2_body: rows in pairs; mf_gemm1k8_body: one row at a time
    access = calls and inplace.gemm_rows(calls, x.nbytes, y.nbytes,
                                         1 if kernel == "mf_gemm1k8_w16" else 2)
    block = "1 channel x 1 row" if kernel == "mf_gemm1k8_w16" else "2 channels x 2 rows"
    doc = (f"{ref.doc}\nscheduled: {entry} ({how}), {block}, weights w16 in one stream with "
           f"bias and mf_rq ({stream.nbytes} bytes), {scratch} bytes scratch")
    return inplace.declare(ir.Kernel(ctx.name, tuple(bufs), tuple(body), doc, ref.macs, entry),
                           "x", access)


def convrp(ctx: OpContext, ref: ir.Kernel, layer: dict, fmt: str, pre0: bool, rows, bias, rq,
           signfix) -> ir.Kernel | None:
    """A first layer with few input channels (in_c <= 3: RGB, audio features) through
    mf_convrp_w16_n<NW> (mf_convrp2_* for odd stride_w * in_c; no im2col, kernel rows paired,
    4 channels x 1 pixel asm), where it applies: int16 weights with 2^pre folded in, the
    int8-range clamp with signfix 0 or 2, O a multiple of 4, NW <= 32 words per window.
    Measured on the M4 (whole models, instructions of the layer): VWW's 3x3 s2 3->8 805K ->
    498K (im2col before), KWS's 10x4 s2 1->64 299K -> 269K and ResNet-8's 3x3 s1 3->16 611K
    -> 436K (mf_convp before)."""
    x, y, w = ctx.input(0), ctx.output(), ctx.input(1)
    if ctx.node.op == "fully_connected" or fmt != "w16" or not pre0 or len(x.shape) != 4:
        return None
    c = x.shape[-1]
    kh, kw = w.shape[1:3]
    o = rows.shape[0]
    sw = ctx.attrs["stride"][1]
    nw = pack.convrp_words(kh, kw, c)
    if (c > 3 or o % 4 or kh > 16 or nw > pack.MAX_CONVRP_WORDS
            or (layer["lo"], layer["hi"]) != (-128, 127) or signfix & 3 == 1
            or rows.shape[1] == c):
        return None
    n, geom, gbuf = conv_geometry(ctx)
    h, w_, _, _, _, _, _, _, _, oh, ow = (int(v) for v in geom)
    table = pack.pack_convrp(rows, bias, rq, kh, kw, c, sw)
    scratch = pack.convrp_scratch_bytes(kh, kw, c, sw, ow, w_)
    name = f"mf_convrp{'2' if sw * c % 2 else ''}_w16_n{nw}{'' if o % 8 else '_x8'}"
    body = ir.loops([("n", n)], lambda b: [ir.CallStmt(name, (
        ir.Ptr("x", b * (h * w_ * c)),
        ir.Ptr("geom", ir.Const(0), ctype="const mf_conv_geom *"),
        ir.Const(layer["x_zp"]), ir.Ptr("pk", ir.Const(0)), ir.Const(o), ir.Const(signfix),
        ir.Ptr("y", b * (oh * ow * o)), ir.Ptr("scratch", ir.Const(0))))])
    bufs = [b for b in ref.params if b.kind != "scratch"] + [
        ir.Buffer("pk", "int32", table.size, "const", table,
                  "per 4 channels: bias (x_zp folded in, x 2^pre), weights x 2^pre as int16 "
                  "pairs in the row-paired tap order, (mult, add, post) per channel"),
        gbuf, ir.Buffer("scratch", "int16", (scratch + 1) // 2, "scratch")]
    doc = (f"{ref.doc}\nscheduled: {name} (kernel rows paired, {oh * ow} pixels x {nw} words, "
           f"no im2col), table {table.nbytes} bytes, {scratch} bytes scratch")
    access = None if n != 1 else inplace.conv_rows(h, w_, c, oh, ow, o, kh,
                                                     ctx.attrs["stride"][0], int(geom[7]))
    return inplace.declare(ir.Kernel(ctx.name, tuple(bufs), tuple(body), doc, ref.macs, name),
                           "x", access)
