"""int8 convolutions and fully connected layers on the scalar GEMM micro-kernels
(runtime_c/mcuforge_scalar.h, mirrored in codegen_c/micro_scalar.py) for cores without SIMD:
targets without `dsp` or `mve` that are not the host (Cortex-M3, RV32IMAC). Tried before
gemm.py; it takes the same layers (gemm.gemm_layer: TFLM int8 arithmetic, the input zero point
folded into the bias, the fast requantization proven exact) and declines the rest.

Weight format by core: "l64" on Armv7-M (SMLAL: two channels' weights in one int32 lane word
w_a + w_b * 2^S, two MACs an instruction) where the lane proof holds (lane_chunk) and the flash
budget (kernels/budget.py) does not keep the layer's weights int8, "m8" (int8
weights, 4 channels x 4 rows of int32 accumulators, mul + add per MAC) on RISC-V and on cores
whose 64-bit multiply-accumulate is a library call (v6-M, v8-M Baseline)."""
from __future__ import annotations

import numpy as np

from .. import loop_ir as ir
from ..lower import OpContext
from . import conv_geometry, inplace, schedules
from .gemm import gemm_layer

S = 23  # MF_SC_S: the low lane's width in an "l64" word
NO_SMLAL = ("cortex-m0", "cortex-m0plus", "cortex-m1", "cortex-m23")  # no 32x32->64 MAC
PATCH_BYTES = 1024  # im2col: about this many bytes of patches a batch (at least 4 patches)


def weight_format(target) -> str:
    """l64 on every Armv7-M core (since its taps load their lane words by LDRD it beats m8 at
    every K there: m8's 12 accumulators spill on a 14-register core; VWW's 1x1 8 -> 16 on the
    M3 1.81 M -> 1.53 M instructions), m8 elsewhere and under the flash budget (fit)."""
    smlal = target.cpu.startswith("cortex-m") and target.cpu not in NO_SMLAL
    return "l64" if smlal else "m8"


def lane_ok(rows: np.ndarray, k0: int, k1: int) -> bool:
    """Every channel's sum of x_k * w[o, k] over taps k0..k1-1, x in [-128, 127], inside the
    low lane's window [-2^(S-1), 2^(S-1)): 128 * sum |w| < 2^(S-1) suffices."""
    return bool((np.abs(rows[:, k0:k1]).sum(axis=1) * 128 < 2**(S - 1)).all())


def lane_chunk(rows: np.ndarray) -> int | None:
    """The taps per chunk L of mf_sc_gemm_l64 for weights [O, K]: K when the whole row passes
    lane_ok, else the largest multiple of 4 whose every chunk does; None when not even 4 taps
    do (the schedule declines)."""
    k = rows.shape[1]
    cands = [k] + list(range(k // 4 * 4, 3, -4))
    for n in cands:
        if all(lane_ok(rows, k0, min(k0 + n, k)) for k0 in range(0, k, n)):
            return n
    return None


def pack_l64(rows: np.ndarray) -> np.ndarray:
    """"l64" lane words: channels in blocks of 4 (zero channels pad), per block per tap the
    words (w0 + w1 * 2^S, w2 + w3 * 2^S): int32 [ceil(O/4) * 2K]."""
    o, k = rows.shape
    op = (o + 3) // 4 * 4
    w = np.zeros((op, k), np.int64)
    w[:o] = rows
    blk = w.reshape(op // 4, 4, k)
    words = blk[:, 0::2] + blk[:, 1::2] * 2**S  # [B, 2, K]: pairs (0, 1), (2, 3)
    return words.transpose(0, 2, 1).reshape(-1).astype(np.int32)


def pack_m8(rows: np.ndarray) -> np.ndarray:
    """"m8" weights: channels in blocks of 4 (zero channels pad), per block per tap the 4
    channels' weights: int8 [ceil(O/4) * 4K]."""
    o, k = rows.shape
    op = (o + 3) // 4 * 4
    w = np.zeros((op, k), np.int64)
    w[:o] = rows
    return w.reshape(op // 4, 4, k).transpose(0, 2, 1).reshape(-1).astype(np.int8)


def rq_records(bias, rq) -> np.ndarray:
    """mf_sc_rec per channel: (folded bias, mult, add, pre, post) as int32 [O * 5]."""
    rq = np.asarray(rq, np.int64).reshape(-1, 4)
    rec = np.concatenate([np.asarray(bias, np.int64).reshape(-1, 1), rq], axis=1)
    return rec.reshape(-1).astype(np.int32)


def patches_per_batch(k: int, n: int) -> int:
    """P: im2col patches gathered per GEMM call (a multiple of 3, the m8 row block: a batch
    of 4 would run a second block of 3 rows for one)."""
    return max(1, min(n, max(3, PATCH_BYTES // k // 3 * 3)))


@schedules("depthwise_conv2d")  # (ahead of scalar_gemm: a 3x3 one-channel layer here)
def scalar_dw(ctx: OpContext, ref: ir.Kernel, target) -> ir.Kernel | None:
    """A 3x3 depthwise layer (depth multiplier 1, dilation 1) on mf_sc_dw3. VWW's depthwise
    layers against depthwise.py's portable mf_dw3x3_s8: M3 5.16 M -> 4.69 M instructions,
    RV32 ~6.3 M -> 4.49 M."""
    if target.host or target.dsp or target.mve:
        return None
    return dw3_kernel(ctx, ref, "mf_sc_dw3", pack_dw3, lambda signfix, rq: signfix,
                      "mult, add, pre, post",
                      lambda g, x, y: inplace.channels(*x.shape[1:], *y.shape[1:3]))


def dw3_layer(ctx: OpContext) -> dict | None:
    """A 3x3 depthwise layer (depth multiplier 1, dilation 1) with TFLM int8 arithmetic, as the
    per-channel kernels take it (mf_sc_dw3, rv.py's mf_rv_dw3 and mf_rv_dwd): its shapes,
    strides, padding, weights rows [C, 9] in (ky, kx) order, folded bias, requantization and
    clamp; None when it is not one."""
    from .. import pack
    from ..lower.conv import output_multipliers
    from ..lower.q_uint8 import activation_range
    from . import tflm_int8_layer
    if not tflm_int8_layer(ctx):
        return None
    x, w, bias, y = ctx.input(0), ctx.input(1), ctx.input(2), ctx.output()
    if len(x.shape) != 4 or tuple(w.shape[1:3]) != (3, 3) \
            or tuple(ctx.attrs.get("dilation", (1, 1))) != (1, 1):
        return None
    n, h, wd, c = x.shape
    _, oh, ow, o = y.shape
    if w.shape[3] != c or o != c:
        return None
    (sh, sw), (pt, _, pl, _) = ctx.attrs["stride"], ctx.attrs["padding"]
    rows = np.asarray(w.data, np.int64).reshape(9, c).T.copy()  # [C, 9] in (ky, kx) order
    x_zp, y_zp = int(x.quant.zero_point[0]), int(y.quant.zero_point[0])
    folded = pack.fold_bias(None if bias is None else bias.data, rows, x_zp)
    if folded is None:
        return None
    mults, shifts = (a.copy() for a in output_multipliers(ctx, c))
    lo, hi = activation_range(ctx.attrs.get("activation", "none"), y.quant.scale[0], y_zp, "int8")
    const = pack.constant_channels(folded, rows, mults, shifts, y_zp, lo, hi)
    for ch in const:
        rows[ch], folded[ch], mults[ch], shifts[ch] = 0, 0, 0, 0
    rq = pack.requant_params(mults, shifts, y_zp, pack.acc_bounds(folded, rows))
    if rq is None:
        return None
    for ch, value in const.items():
        rq[ch] = (0, value, 1, 0)
    return dict(x=x, y=y, n=n, h=h, wd=wd, c=c, oh=oh, ow=ow, sh=sh, sw=sw, pt=pt, pl=pl,
                rows=rows, folded=folded, rq=rq, x_zp=x_zp, lo=int(lo), hi=int(hi),
                signfix=pack.needs_signfix(y_zp, int(lo)))


def dw3_kernel(ctx: OpContext, ref: ir.Kernel, fn: str, pack_fn, flags_of, rq_doc: str,
               access_of) -> ir.Kernel | None:
    """The kernel of a 3x3 depthwise layer (dw3_layer) on a padded int8 plane per channel,
    `fn` (mf_sc_dw3, rv.py's mf_rv_dw3): the geometry and call they share; `pack_fn(rows,
    folded, rq, transpose)` their table, `flags_of(signfix, rq)` its flags argument, `rq_doc`
    its record's fields, `access_of(geometry, x, y)` its in-place access schedule (batch 1)."""
    L = dw3_layer(ctx)
    if L is None:
        return None
    x, y, n, h, wd, c, oh, ow = (L[k] for k in ("x", "y", "n", "h", "wd", "c", "oh", "ow"))
    g = dw_geometry(h, wd, c, oh, ow, L["sh"], L["sw"], L["pt"], L["pl"])
    transpose = ow < oh
    x_zp, lo, hi = L["x_zp"], L["lo"], L["hi"]
    pk = pack_fn(L["rows"], L["folded"], L["rq"], transpose)
    flags = flags_of(L["signfix"], L["rq"])
    scratch = int(g[13]) * int(g[14])
    consts = [ir.Buffer("pk", "int32", pk.size, "const", pk,
                        f"per channel: 9 weights (plane order), bias - x_zp * sum(w), {rq_doc}"),
              ir.Buffer("geom", "int32", g.size, "const", g,
                        f"{fn}: VH VW C VOH VOW sy sx pad_y pad_x in_ys in_xs out_ys out_xs "
                        "PH PW")]
    body = ir.loops([("n", n)], lambda i: [ir.CallStmt(fn, (
        ir.Ptr("x", i * (h * wd * c)), ir.Ptr("y", i * (oh * ow * c)), ir.Ptr("pk", ir.Const(0)),
        ir.Ptr("geom", ir.Const(0)), ir.Const(x_zp), ir.Const(int(lo)), ir.Const(int(hi)),
        ir.Const(flags), ir.Ptr("scratch", ir.Const(0))))])
    bufs = [b_ for b_ in ref.params if b_.kind != "scratch"] + consts + [
        ir.Buffer("scratch", "int8", scratch, "scratch")]
    doc = (f"{ref.doc}\nscheduled: {fn}, per channel a padded int8 plane "
           f"{'(transposed) ' if transpose else ''}of {scratch} bytes scratch")
    return inplace.declare(ir.Kernel(ctx.name, tuple(bufs), tuple(body), doc, ref.macs, fn),
                           "x", access_of(g, x, y) if n == 1 else None)


@schedules("conv2d", "fully_connected", "depthwise_conv2d")
def scalar_gemm(ctx: OpContext, ref: ir.Kernel, target) -> ir.Kernel | None:
    if target.host or target.dsp or target.mve:
        return None
    layer = gemm_layer(ctx)
    if layer is None:
        return None
    rows = np.asarray(layer["rows"], np.int64)
    o, k = rows.shape
    if 128 * int(np.abs(rows).sum(axis=1).max(initial=0)) > 2**31 - 1:
        return None  # a partial sum could leave int32
    fmt = weight_format(target)
    narrowed = fmt == "l64" and ctx.node.outputs[0] in target.narrow_weights
    if narrowed:  # the flash budget (kernels/budget.py): int8 weights, half the lane words
        fmt = "m8"
    chunk = k
    if fmt == "l64":
        chunk = lane_chunk(rows)
        if chunk is None:
            return None
        packed = pack_l64(rows)
        wbuf = ir.Buffer("w", "int32", packed.size, "const", packed,
                         f"lane words w_a + w_b * 2^{S} per block of 4 channels and tap")
    else:
        packed = pack_m8(rows)
        wbuf = ir.Buffer("w", "int8", packed.size, "const", packed,
                         "int8 weights per block of 4 channels and tap")
    x, y = ctx.input(0), ctx.output()
    signfix = 1 if layer["signfix"] else 0
    consts = [wbuf,
              ir.Buffer("rq", "int32", 5 * o, "const", rq_records(layer["bias"], layer["rq"]),
                        "mf_sc_rec per channel: bias - x_zp * sum(w), mult, add, pre, post")]
    tail = (ir.Ptr("w", ir.Const(0)), ir.Ptr("rq", ir.Const(0), ctype="const mf_sc_rec *"),
            ir.Const(o),
            ir.Const(layer["lo"]), ir.Const(layer["hi"]), ir.Const(signfix))
    gemm_fn, scratch = f"mf_sc_gemm_{fmt}", 0
    block = 1 if fmt == "l64" else 3  # rows a block of the GEMM (inplace.gemm_blocks)
    one_by_one = ctx.node.op == "fully_connected" or (
        k == x.shape[-1] and tuple(ctx.attrs["stride"]) == (1, 1)
        and not any(ctx.attrs["padding"]))
    if one_by_one and fmt == "m8" and x.size // k < 3 and not narrowed:
        return None  # m8 computes 3 rows a block: one or two rows cost it 1.5-3x (measured:
        # AD's batch-1 fully connected layers 0.27 -> 0.26 MAC/instr on RV32)
    if one_by_one:
        n_rows = x.size // k
        body = (ir.CallStmt(gemm_fn, (ir.Ptr("x", ir.Const(0)), ir.Const(n_rows), ir.Const(k),
                                      ir.Const(k), ir.Const(chunk), *tail,
                                      ir.Ptr("y", ir.Const(0)), ir.Const(o))),)
        how, name = f"{n_rows} rows x {k} taps", gemm_fn
        access = inplace.gemm_blocks([(0, 0, n_rows, k, k, o, o)], x.nbytes, y.nbytes, block)
    elif k == x.shape[-1] and not any(ctx.attrs["padding"]):  # strided 1x1: per output row
        n, h, w_, c = x.shape
        _, oh, ow, _ = y.shape
        sh, sw = ctx.attrs["stride"]
        body = ir.loops([("n", n), ("oy", oh)], lambda b, oy: [ir.CallStmt(gemm_fn, (
            ir.Ptr("x", b * (h * w_ * c) + oy * (sh * w_ * c)), ir.Const(ow), ir.Const(sw * c),
            ir.Const(k), ir.Const(chunk), *tail, ir.Ptr("y", b * (oh * ow * o) + oy * (ow * o)),
            ir.Const(o)))])
        how, name = f"{oh} output rows x {ow} pixels x {k} taps, stride {sw}", gemm_fn
        access = None if n != 1 else inplace.gemm_blocks(
            [(oy * sh * w_ * c, oy * ow * o, ow, sw * c, k, o, o) for oy in range(oh)],
            x.nbytes, y.nbytes, block)
    else:
        n, geom, gbuf = conv_geometry(ctx)
        h, w_, c, _, _, _, _, _, _, oh, ow = (int(v) for v in geom)
        consts.append(gbuf)
        p = patches_per_batch(k, oh * ow)
        scratch = p * k
        name = f"mf_sc_conv_{fmt}"
        body = ir.loops([("n", n)], lambda b: [ir.CallStmt(name, (
            ir.Ptr("x", b * (h * w_ * c)), ir.Ptr("geom", ir.Const(0), ctype="const mf_conv_geom *"),
            ir.Const(layer["x_zp"]), ir.Const(p), ir.Const(chunk), *tail,
            ir.Ptr("y", b * (oh * ow * o)), ir.Ptr("scratch", ir.Const(0))))])
        how = f"im2col, {oh * ow} patches x {k} taps, {p} a batch"
        access = None if n != 1 else (inplace.sc_conv_l64(geom, o, p, chunk) if fmt == "l64"
                                      else inplace.conv_batches(geom, o, p))
    bufs = [b for b in ref.params if b.kind != "scratch"] + consts
    if scratch:
        bufs.append(ir.Buffer("scratch", "int8", scratch, "scratch"))
    doc = (f"{ref.doc}\nscheduled: {name} ({how}), weights {fmt} ({packed.nbytes} bytes)"
           + (f", lane chunks of {chunk} taps" if fmt == "l64" else "")
           + (f", {scratch} bytes scratch" if scratch else ""))
    return inplace.declare(ir.Kernel(ctx.name, tuple(bufs), tuple(body), doc, ref.macs, name),
                           "x", access)


def dw_geometry(h, w, c, oh, ow, sh, sw, pt, pl) -> np.ndarray:
    """mf_sc_dw3's geometry (15 int32, mcuforge_scalar.h), the plane transposed when the image
    has fewer output columns than rows (longer inner loops: KWS's 25x5 walks rows of 25)."""
    if ow < oh:  # plane rows = image columns
        g = [w, h, c, ow, oh, sw, sh, pl, pt, c, w * c, c, ow * c]
    else:
        g = [h, w, c, oh, ow, sh, sw, pt, pl, w * c, c, ow * c, c]
    g += [(g[3] - 1) * g[5] + 3, (g[4] - 1) * g[6] + 3]
    return np.array(g, np.int32)


def pack_dw3(rows, bias, rq, transpose: bool) -> np.ndarray:
    """mf_sc_dw3's table: per channel the 9 weights (rows [C, 9] in (ky, kx) order; (kx, ky)
    for a transposed plane), then mf_sc_rec (bias, mult, add, pre, post): int32 [C * 14]."""
    c = len(rows)
    taps = np.asarray(rows, np.int64).reshape(c, 3, 3)
    if transpose:
        taps = taps.transpose(0, 2, 1)
    pk = np.concatenate([taps.reshape(c, 9),
                         rq_records(bias, rq).reshape(c, 5).astype(np.int64)], axis=1)
    return pk.reshape(-1).astype(np.int32)

