"""int8 convolutions and fully connected layers on RV32's "p16" GEMM (runtime_c/mcuforge_rv.h,
mirrored in codegen_c/micro_rv.py): two channels' weights in one int32 word w_a + 2^16 w_b,
one mul + one add for two MACs, the taps cut into chunks inside which both 16-bit lanes
provably hold their sums (chunks_p16). Tried before scalar.py on RISC-V targets; it takes the
layers scalar.py's m8 would (gemm.gemm_layer's TFLM int8 arithmetic) when the chunks are long
enough to beat m8, and declines the rest (m8 then takes them)."""
from __future__ import annotations

import numpy as np

from .. import loop_ir as ir
from .. import pack
from ..lower import OpContext
from . import conv_geometry, inplace, schedules
from ..micro_rv import dwd_ok
from .gemm import gemm_layer

OFF = 2**15  # MF_RV_OFF: a chunk accumulator's start
MIN_CHUNK = 2.0  # mean taps a chunk below which m8 is as fast (see rv_gemm)


def is_rv(target) -> bool:
    return target.cpu.startswith("rv") and not (target.host or target.dsp or target.mve)


def _lane_ok(pos, neg) -> np.ndarray:
    """Per channel: a chunk whose positive weights sum to pos, negative to -neg keeps
    sum x * w in [-2^15, 2^15) for every x in [-128, 127]."""
    return (127 * pos + 128 * neg <= OFF - 1) & (128 * pos + 127 * neg <= OFF)


def chunks_p16(rows: np.ndarray) -> list[list[int]]:
    """Per block of 4 channels (rows [O, K], zero channels pad) the chunk lengths, greedy:
    each chunk as long as every channel of the block passes _lane_ok (one tap always does:
    |x w| <= 2^14)."""
    o, k = rows.shape
    w = np.zeros(((o + 3) // 4 * 4, k), np.int64)
    w[:o] = rows
    out = []
    for b in range(0, len(w), 4):
        blk = w[b:b + 4]
        cpos = np.concatenate([np.zeros((4, 1), np.int64),
                               np.cumsum(np.where(blk > 0, blk, 0), 1)], 1)
        cneg = np.concatenate([np.zeros((4, 1), np.int64),
                               np.cumsum(np.where(blk < 0, -blk, 0), 1)], 1)
        lens, a = [], 0
        while a < k:
            e = a + 1
            while e < k and _lane_ok(cpos[:, e + 1] - cpos[:, a],
                                     cneg[:, e + 1] - cneg[:, a]).all():
                e += 1
            lens.append(e - a)
            a = e
        out.append(lens)
    return out


SEG, ESZ, E_END = 8, 80, 18  # MF_RV_SEG, MF_RV_ESZ, MF_RV_E_END
FSZ, F0 = 12, 720  # MF_RV_FSZ, MF_RV_F0


def entry_offset(e: int) -> int:
    """MF_RV_EOFF: entry e's byte offset in the RV32 code (the segment word less 1): the
    entries starting a chunk (e < SEG, then 2 SEG) ESZ bytes each, the others FSZ after them."""
    if e < SEG:
        return ESZ * e
    if e == 2 * SEG:
        return ESZ * SEG
    return F0 + FSZ * (e - SEG if e < 2 * SEG else e - SEG - 1)
REC_WORDS = 7  # mf_rv_rec's int32 words


def segments(n: int) -> list[tuple[int, int]]:
    """A chunk of n taps as the stream's segments (entry e, taps): one of n <= SEG taps
    (e = n - 1), else SEG taps (e = 2 SEG), SEG more (2 SEG + 1) as long as more than SEG
    remain, the last 1..SEG (e = SEG - 1 + taps)."""
    if n <= SEG:
        return [(n - 1, n)]
    out, left = [(2 * SEG, SEG)], n - SEG
    while left > SEG:
        out.append((2 * SEG + 1, SEG))
        left -= SEG
    return out + [(SEG - 1 + left, left)]


def pack_p16(rows: np.ndarray, chunks) -> np.ndarray:
    """The "p16" stream (mcuforge_rv.h): per block of 4 channels, per segment of L taps of a
    chunk the word entry_offset(e) + 1 (segments()), then per tap the words w0 + 2^16 w1,
    w2 + 2^16 w3; the word of E_END ends the block: int32."""
    o, k = rows.shape
    w = np.zeros(((o + 3) // 4 * 4, k), np.int64)
    w[:o] = rows
    words = []
    for bi, lens in enumerate(chunks):
        blk = w[4 * bi:4 * bi + 4]
        pair = np.stack([blk[0] + blk[1] * 2**16, blk[2] + blk[3] * 2**16], 1)  # [K, 2]
        a = 0
        for n in lens:
            for e, ln in segments(n):
                words.append(np.array([entry_offset(e) + 1], np.int64))
                words.append(pair[a:a + ln].reshape(-1))
                a += ln
        words.append(np.array([entry_offset(E_END) + 1], np.int64))
    return np.concatenate(words).astype(np.int32)


def rv_lows(rq, signfix, lo: int, hi: int, bound) -> np.ndarray:
    """Per channel the largest accumulator in [-bound, bound] whose output (mf_rq_apply +
    clamp, micro.requantize: non-decreasing in acc) is lo, -2^31 where none is: mf_rv_rec.low
    (mode bit 3: an accumulator at most low gives lo without the requantization)."""
    from ..micro import requantize
    rq = np.asarray(rq, np.int64).reshape(-1, 4)
    bound = np.broadcast_to(np.asarray(bound, np.int64).reshape(-1), (len(rq),))
    out = []
    for row, b in zip(rq, bound.tolist()):
        def y(a):
            return int(requantize(np.array([[a]], np.int64), row[None], signfix, lo, hi)[0, 0])
        a, e = -b, b  # y(a) == lo, y(e) > lo (bisection on the largest)
        if y(a) != lo:
            out.append(-2**31)
            continue
        if y(e) == lo:
            out.append(e)
            continue
        while e - a > 1:
            m = (a + e) // 2
            a, e = (m, e) if y(m) == lo else (a, m)
        out.append(a)
    return np.array(out, np.int64)


def channel_order(rows: np.ndarray) -> np.ndarray | None:
    """An order of the output channels (slot -> channel) whose blocks of 4 need fewer chunks
    than the layer's own (the chunks follow the heaviest channel of a block: channels sorted by
    their own chunk count then sum |w|, or by sum |w|), None where the saving does not pay
    the outputs' scattered stores (2 instructions a channel, a chunk ~24) and the mode's
    branches (a model with reordered and plain layers: mf_rv_gemm_p16 not specialised to one
    mode by gcc): 3 chunks saved per 2 blocks (measured on KWS and VWW, riscv32-virt)."""
    rows = np.asarray(rows, np.int64)
    o = len(rows)
    if o < 8:
        return None
    size = np.abs(rows).sum(1)
    own = np.array([len(chunks_p16(rows[c:c + 1])[0]) for c in range(o)])
    base = sum(len(c) for c in chunks_p16(rows))
    best, order = base, None
    for p in (np.lexsort((size, own)), np.argsort(size, kind="stable")):
        n = sum(len(c) for c in chunks_p16(rows[p]))
        if n < best:
            best, order = n, p
    return order if order is not None and 3 * (base - best) > 2 * ((o + 3) // 4) else None


def rv_records(bias, rq, chunks, lows=None, out=None) -> np.ndarray:
    """mf_rv_rec per channel (mcuforge_rv.h): init, m2, add, pre1, post, low, out as int32
    [O * 7] (m2 and init as their 32-bit patterns). init: channel b of a pair (odd) its folded
    bias; channel a bias_a - n 2^15 + 2^16 bias_b (mod 2^32; bias_b = 0 past the last
    channel), n its block's chunks; low: rv_lows (-2^31 when not given); out: the output
    index (the slot's own when not given) less the block's first slot."""
    b = np.asarray(bias, np.int64).reshape(-1)
    o = len(b)
    rq = np.asarray(rq, np.int64).reshape(-1, 4)
    init = b.copy()
    for ch in range(0, o, 2):
        nb = b[ch + 1] if ch + 1 < o else 0
        init[ch] = b[ch] - len(chunks[ch // 4]) * OFF + nb * 2**16
    low = np.full(o, -2**31, np.int64) if lows is None else np.asarray(lows, np.int64)
    out = np.arange(o) if out is None else np.asarray(out, np.int64)
    out = out - np.arange(o) // 4 * 4  # relative to the block's first slot
    rec = np.stack([init, rq[:, 0] * 2, rq[:, 1], rq[:, 2] - 1, rq[:, 3], low, out], 1)
    return ((rec + 2**31) % 2**32 - 2**31).reshape(-1).astype(np.int32)


def rv_mode(signfix, rq, low: bool = False, order: bool = False) -> int:
    """mf_rv_gemm_p16's mode: bit 0 the sign term, bit 1 some channel shifts (pre != 1), bit 3
    the records' low (rv_lows) tested first, bit 4 the channels reordered (records' out)."""
    pre = np.asarray(rq, np.int64).reshape(-1, 4)[:, 2]
    return ((1 if signfix else 0) | (2 if (pre != 1).any() else 0) | (8 if low else 0)
            | (16 if order else 0))


@schedules("conv2d", "fully_connected")
def rv_gemm(ctx: OpContext, ref: ir.Kernel, target) -> ir.Kernel | None:
    """Measured (gcc 12 -O2, the disassembly): per tap of a 3 x 4 block 17 instructions for
    12 MACs (2 lw, 3 lb, 6 mul, 6 add: the RV32 assembly, 18.5 in the C body), 24 a chunk
    (18 for its 12 sums, 6 for its segment's dispatch): 17 + 24 / L per 12 MACs against m8's
    ~34.5, so p16 from about 2 taps a chunk (the MLPerf layers have 2.9-105). ReLU layers
    get the records' low (rv_lows: half their outputs without requantization); layers whose
    chunks a reorder of the channels cuts enough get it (channel_order)."""
    if not is_rv(target) or ctx.node.outputs[0] in target.narrow_weights:
        return None  # (the flash budget, kernels/budget.py: scalar.py's m8, int8 weights)
    layer = gemm_layer(ctx)
    if layer is None:
        return None
    rows = np.asarray(layer["rows"], np.int64)
    o, k = rows.shape
    x, y = ctx.input(0), ctx.output()
    one_by_one = ctx.node.op == "fully_connected" or (
        k == x.shape[-1] and tuple(ctx.attrs["stride"]) == (1, 1)
        and not any(ctx.attrs["padding"]))
    n_rows = x.size // k
    # channels reordered in the blocks (not for one row: mf_rv_fc_p16's in-place schedule
    # stores the channels in order)
    order = channel_order(rows) if n_rows > 1 else None
    perm = np.arange(o) if order is None else order
    rows, bias, rq = rows[perm], np.asarray(layer["bias"], np.int64).reshape(-1)[perm], \
        np.asarray(layer["rq"]).reshape(-1, 4)[perm]
    chunks = chunks_p16(rows)
    if k * len(chunks) / sum(len(c) for c in chunks) < MIN_CHUNK:
        return None
    packed = pack_p16(rows, chunks)
    # ReLU layers: about half the outputs at lo, known from the accumulator alone
    relu = ctx.attrs.get("activation", "none") in ("relu", "relu6", "relu_n1_to_1")
    mode = rv_mode(layer["signfix"], rq, relu, order is not None)
    lows = rv_lows(rq, mode & 1, layer["lo"], layer["hi"],
                   pack.acc_bounds(bias, rows)) if relu else None
    consts = [ir.Buffer("w", "int32", packed.size, "const", packed,
                        "p16: per block of 4 channels, per segment of a chunk MF_RV_EOFF(e) + 1 "
                        "then its taps' words w0 + 2^16 w1, w2 + 2^16 w3, then "
                        "MF_RV_EOFF(34) + 1"),
              ir.Buffer("rq", "int32", REC_WORDS * o, "const",
                        rv_records(bias, rq, chunks, lows, perm),
                        "mf_rv_rec per channel: the sums' start (bias - x_zp * sum(w); even "
                        "channels less n 2^15 plus 2^16 the next one's), 2 mult, add, pre - 1, "
                        "post, the largest accumulator giving lo, the output index")]
    tail = (ir.Ptr("w", ir.Const(0)), ir.Ptr("rq", ir.Const(0), ctype="const mf_rv_rec *"),
            ir.Const(o), ir.Const(layer["lo"]), ir.Const(layer["hi"]), ir.Const(mode))
    if one_by_one and n_rows == 1:  # batch-1 fully connected: one row in place, no scratch
        scratch = 0
        body = (ir.CallStmt("mf_rv_fc_p16", (
            ir.Ptr("x", ir.Const(0)), *tail[:2], *tail[2:], ir.Ptr("y", ir.Const(0)))),)
        how, name = f"1 row x {k} taps", "mf_rv_fc_p16"
        access = inplace.gemm_blocks([(0, 0, 1, k, k, o, o)], x.nbytes, y.nbytes, 1)
    elif one_by_one:
        scratch = 3 * k
        body = (ir.CallStmt("mf_rv_gemm_p16", (
            ir.Ptr("x", ir.Const(0)), ir.Const(n_rows), ir.Const(k), ir.Const(k), *tail,
            ir.Ptr("y", ir.Const(0)), ir.Const(o), ir.Ptr("scratch", ir.Const(0)))),)
        how, name = f"{n_rows} rows x {k} taps", "mf_rv_gemm_p16"
        access = inplace.gemm_rows([(0, 0, n_rows, k, k, o, o)], x.nbytes, y.nbytes, 3)
    else:  # (a strided 1x1 too: its pixels gathered 3 at a time, no short blocks per row)
        n, geom, gbuf = conv_geometry(ctx)
        h, w_, c, _, _, _, _, _, _, oh, ow = (int(v) for v in geom)
        consts.append(gbuf)
        scratch = 6 * k
        name = "mf_rv_conv_p16"
        body = ir.loops([("n", n)], lambda b: [ir.CallStmt(name, (
            ir.Ptr("x", b * (h * w_ * c)), ir.Ptr("geom", ir.Const(0), ctype="const mf_conv_geom *"),
            ir.Const(layer["x_zp"]), *tail,
            ir.Ptr("y", b * (oh * ow * o)), ir.Ptr("scratch", ir.Const(0))))])
        how = f"{oh * ow} patches x {k} taps gathered 3 at a time"
        access = inplace.conv_batches(geom, o, 3) if n == 1 else None
    bufs = [b for b in ref.params if b.kind != "scratch"] + consts + (
        [ir.Buffer("scratch", "int8", scratch, "scratch")] if scratch else [])
    mean = k * len(chunks) / sum(len(c) for c in chunks)
    how += ", channels reordered in the blocks" if order is not None else ""
    doc = (f"{ref.doc}\nscheduled: {name} ({how}), weights p16 ({packed.nbytes} bytes), "
           f"{mean:.1f} taps a chunk, {scratch} bytes scratch")
    return inplace.declare(ir.Kernel(ctx.name, tuple(bufs), tuple(body), doc, ref.macs, name),
                           "x", access)


def pack_rv_dw3(rows, bias, rq, transpose: bool) -> np.ndarray:
    """mf_rv_dw3's table: per channel the 9 weights (rows [C, 9] in (ky, kx) order; (kx, ky)
    for a transposed plane), then mf_rv_rec (bias, 2 mult, add, pre - 1, post): int32 [C * 14]."""
    c = len(rows)
    taps = np.asarray(rows, np.int64).reshape(c, 3, 3)
    if transpose:
        taps = taps.transpose(0, 2, 1)
    rq = np.asarray(rq, np.int64).reshape(-1, 4)
    rec = np.stack([np.asarray(bias, np.int64).reshape(-1), rq[:, 0] * 2, rq[:, 1],
                    rq[:, 2] - 1, rq[:, 3]], 1)
    pk = np.concatenate([taps.reshape(c, 9), rec], axis=1)
    return ((pk + 2**31) % 2**32 - 2**31).reshape(-1).astype(np.int32)


def dwd_plane(geo: tuple, tr: int) -> tuple:
    """mf_rv_dwd's plane (VH, VW, C, VOH, VOW, sy, sx, pad_y, pad_x) of an image geometry
    (h, w, c, oh, ow, sh, sw, pt, pl): the image, or with tr its transpose (plane rows = image
    columns)."""
    h, w, c, oh, ow, sh, sw, pt, pl = geo
    return (w, h, c, ow, oh, sw, sh, pl, pt) if tr else geo


@schedules("depthwise_conv2d")
def rv_dw(ctx: OpContext, ref: ir.Kernel, target) -> ir.Kernel | None:
    """A 3x3 depthwise layer (depth multiplier 1, dilation 1): mf_rv_dwd straight from NHWC
    where the padding is at most 1 a side, else mf_rv_dw3 (scalar.py's mf_sc_dw3 planes with
    mf_rv_rec records)."""
    from .scalar import dw3_kernel, dw3_layer
    if not is_rv(target):
        return None
    L = dw3_layer(ctx)
    if L is None:
        return None
    geo = tuple(int(L[k]) for k in ("h", "wd", "c", "oh", "ow", "sh", "sw", "pt", "pl"))
    if not dwd_ok(*geo):  # (the transposed plane too: the bounds are symmetric)
        return dw3_kernel(ctx, ref, "mf_rv_dw3", pack_rv_dw3, rv_mode,
                          "2 mult, add, pre - 1, post",
                          lambda g, x, y: inplace.rv_dw3(g, x.nbytes, y.nbytes))
    return dwd_kernel(ctx, ref, L, geo)


def dwd_choice(geo: tuple, n_in: int, n_out: int) -> tuple:
    """(TR, DLY, access schedule) of mf_rv_dwd for an image geometry (batch 1): the plane
    transposed where the image has fewer output columns than rows, the rows delayed where
    that gives a higher in-place shift."""
    tr = int(geo[4] < geo[3])
    acc = [inplace.rv_dwd(*dwd_plane(geo, tr), tr, d, n_in, n_out) for d in (0, 1)]
    dly = int(inplace.best_shift(acc[1]) > inplace.best_shift(acc[0]))
    return tr, dly, acc[dly]


def dwd_kernel(ctx: OpContext, ref: ir.Kernel, L: dict, geo: tuple) -> ir.Kernel:
    """mf_rv_dwd on the image, transposed (TR) where it has fewer output columns than rows
    (longer rows: KWS's 25x5 walks rows of 25), with the delayed rows (DLY, 2 VOW bytes of
    scratch) only where they let the output lie over the input at a higher shift (at stride 1:
    the row above an output row is read by the next one)."""
    x, y, n = L["x"], L["y"], L["n"]
    h, wd, c, oh, ow = geo[:5]
    tr, dly, acc = dwd_choice(geo, x.nbytes, y.nbytes) if n == 1 else (int(ow < oh), 0, None)
    plane = dwd_plane(geo, tr)
    pk = pack_rv_dw3(L["rows"], L["folded"], L["rq"], bool(tr))
    mode = rv_mode(L["signfix"], L["rq"])
    consts = [ir.Buffer("pk", "int32", pk.size, "const", pk,
                        "per channel: 9 weights (plane order), bias - x_zp * sum(w), 2 mult, "
                        "add, pre - 1, post")]
    bufs = [b_ for b_ in ref.params if b_.kind != "scratch"] + consts
    if dly:
        bufs.append(ir.Buffer("scratch", "int8", 2 * plane[4], "scratch"))
    kind = dwd_kinds(ctx.graph).get(dwd_key(plane, L, mode, tr, dly), "full")
    fn, shared = dwd_copy(plane, int(L["lo"]), int(L["hi"]), mode, tr, dly, kind)
    if kind == "walk" and n == 1:  # (its own order: one output a unit)
        acc = inplace.rv_dwd(*plane, tr, dly, x.nbytes, y.nbytes, walk=True)
    sizes = tuple(ir.Const(v) for v in plane[:5]) if kind == "walk" else ()
    body = ir.loops([("n", n)], lambda i: [ir.CallStmt(fn, (
        ir.Ptr("x", i * (h * wd * c)), ir.Ptr("y", i * (oh * ow * c)), ir.Ptr("pk", ir.Const(0)),
        ir.Const(L["x_zp"]),
        ir.Ptr("scratch" if dly else "y", ir.Const(0)), *sizes))])  # (buf unused without DLY)
    doc = (f"{ref.doc}\nscheduled: mf_rv_dwd, straight from NHWC"
           + (", the image transposed" if tr else "")
           + {"full": "", "compact": ", one row body (the model's depthwise code budget)",
              "walk": ", a copy shared by the layers of its stride and padding, the sizes as "
                      "arguments (the model's depthwise code budget)"}[kind]
           + (f", output rows delayed through {2 * plane[4]} bytes scratch" if dly else ""))
    return inplace.declare(
        ir.Kernel(ctx.name, tuple(bufs), tuple(body), doc, ref.macs, "mf_rv_dwd",
                  shared=(shared,)),
        "x", acc)


def dwd_copy(plane: tuple, lo: int, hi: int, mode: int, tr: int, dly: int,
             kind: str = "full") -> tuple:
    """(name, C definition) of mf_rv_dwd's copy for one constant geometry (kind "full":
    MF_RV_DWD_DEF, "compact": MF_RV_DWD_DEFC, one row body for the top, middle and bottom rows)
    or ("walk": MF_RV_DWD_DEFG) for one stride, padding, mode, clamp, TR and DLY with the plane's
    sizes as arguments: named by its constants, so the layers with the same ones share one copy
    in the model file (model.py prints each Kernel.shared once) and the name is the same on
    every run; the evaluator's mirror is registered under that name."""
    from .. import micro_rv
    vh, vw, c, voh, vow, sy, sx, py, px = plane
    if kind == "walk":
        name = (f"mf_rv_dwg_s{sy}x{sx}_p{py}x{px}_q{mode}_{lo}_{hi}_t{tr}d{dly}"
                .replace("-", "m"))
        consts = (sy, sx, py, px, lo, hi, mode, tr, dly)
        micro_rv.register_dwd_walk(name, consts)
        return name, f"MF_RV_DWD_DEFG({name}, {', '.join(str(v) for v in consts)})"
    compact = kind == "compact"
    name = (f"mf_rv_dwd_{vh}x{vw}x{c}_{voh}x{vow}_s{sy}x{sx}_p{py}x{px}_q{mode}_{lo}_{hi}"
            f"_t{tr}d{dly}" + ("c" if compact else "")).replace("-", "m")
    consts = (*plane, lo, hi, mode, tr, dly)
    micro_rv.register_dwd_copy(name, consts)
    return name, (f"MF_RV_DWD_DEF{'C' if compact else ''}({name}, "
                  f"{', '.join(str(v) for v in consts)})")


# The model's depthwise code budget (bytes of -O2 code, riscv32-virt): mf_rv_dwd's copies are
# one per distinct geometry, with four row bodies (the top row, the middle ones, the bottom
# one, a single row: kernel rows off as constants) or, compact, one (the rows' kind as
# arguments: a few branches a step), or one shared copy per stride, padding, mode, clamp, TR
# and DLY with the sizes as arguments ("walk": mf_rv_dwd_walk, the rows walked column by
# column). Measured (gcc 12 -O2, nm): full copies 2,944 bytes at stride 1 (2,048 for 6x6, 1,104
# for 3x3 outputs; KWS's transposed 25x5: 3,310), 1,152 at stride 2 (816 for 3x3); compact
# 1,502-1,524 at stride 1 (1,180 for 6x6, 750), 760 at stride 2 (602); shared 1,256 at stride
# 1, 814 at stride 2. Instructions an output over a full copy: compact ~2.5 (KWS +73 K = 2.3,
# VWW +234 K = 2.6 for 88,704 outputs); shared (VWW's layers, vs compact + 2.5) at stride 1
# 6.2, 6.6, 7.4, 15.5, 22.5 for rows of 48, 24, 12, 6, 3 outputs, at stride 2 13.7, 15.1, 17.3,
# 25.5 for 24, 12, 6, 3 (the steps of XS every load needs, the rows' set-up): walk_extra.
# The rest of a model's code (the p16 GEMM, softmax, the harness) is 9.3-10.7 KB (KWS, VWW,
# ResNet-8 without depthwise layers), so the copies have DWD_BUDGET bytes for the whole to
# stay under 16 KB with ~600 bytes to spare: the layers start on the shared copies, then the
# upgrades (to compact, to full) with the most saved instructions per byte are taken while the
# total fits. (A generic copy with the geometry, stride and mode as arguments was tried: 3,844
# bytes, VWW 20.00 M instructions; the shared copies specialised per stride walk the columns
# instead: 2,070 bytes, 18.65 M with every layer on them.)
DWD_BUDGET = 5120
DWD_COMPACT_EXTRA = 2.5  # instructions an output over a full copy
WALK_BYTES = {1: 1300, 2: 820}  # a shared copy's code by stride


def walk_extra(plane: tuple) -> float:
    """The estimated instructions an output of a shared copy over a full one (measured, above):
    a part per output and one per row (its set-up, the edges) over its outputs."""
    vow, sx = plane[4], plane[6]
    return 5.5 + 50 / vow if sx == 1 else 12 + 40 / vow


def dwd_extra(plane: tuple, kind: str) -> float:
    """The estimated instructions an output of a copy of this kind over a full one."""
    if kind == "walk":
        return walk_extra(plane)
    return DWD_COMPACT_EXTRA if kind == "compact" else 0.0


def dwd_bytes(plane: tuple, kind: str) -> int:
    """The estimated -O2 code of a copy of one geometry (measured, above)."""
    voh, vow, sx = plane[3], plane[4], plane[6]
    size = 0 if vow <= 3 and voh <= 3 else 1 if vow <= 6 and voh <= 6 else 2  # small, mid, big
    if sx == 1:
        return ((1110, 2050, 3350) if kind == "full" else (750, 1180, 1530))[size]
    return ((820, 1160, 1160) if kind == "full" else (610, 760, 760))[size]


def dwd_key(plane: tuple, L: dict, mode: int, tr: int, dly: int) -> tuple:
    return (*plane, int(L["lo"]), int(L["hi"]), mode, tr, dly)


def dwd_class(key: tuple) -> tuple:
    """The shared copy a geometry's layers may use: stride, padding, lo, hi, mode, TR, DLY."""
    return key[5:]


def dwd_total(kinds: dict) -> int:
    """The estimated code of the copies: own copies, one shared copy per class in use."""
    walks = {dwd_class(k) for k, v in kinds.items() if v == "walk"}
    return (sum(dwd_bytes(k[:9], v) for k, v in kinds.items() if v != "walk")
            + sum(WALK_BYTES.get(w[1], WALK_BYTES[2]) for w in walks))


_KINDS: dict = {}


def dwd_kinds(graph) -> dict:
    """Per copy (dwd_key) its kind ("full", "compact", "walk") under the model's depthwise code
    budget: every one "walk" (the shared copies; "compact" past stride 2 along the plane's
    rows), then, while one fits DWD_BUDGET, the upgrade
    of one copy (to compact or full) with the most saved instructions (its layers' outputs x
    dwd_extra's difference) per added byte, ties in key order. Depends on the graph alone
    (deterministic); cached per graph (and its depthwise layers' shapes: a graph changed since
    gets its own)."""
    sig = tuple((n.outputs[0], tuple(graph.tensors[n.inputs[0]].shape)) for n in graph.nodes
                if n.op == "depthwise_conv2d")
    hit = _KINDS.get(id(graph))
    if hit is not None and hit[0] is graph and hit[1] == sig:
        return hit[2]
    from .scalar import dw3_layer
    outs = {}
    for node in graph.nodes:
        if node.op != "depthwise_conv2d":
            continue
        L = dw3_layer(OpContext(node, graph, "k"))
        if L is None:
            continue
        geo = tuple(int(L[k]) for k in ("h", "wd", "c", "oh", "ow", "sh", "sw", "pt", "pl"))
        if not dwd_ok(*geo):
            continue
        x, y = L["x"], L["y"]
        tr, dly, _ = dwd_choice(geo, x.nbytes, y.nbytes) if L["n"] == 1 else (
            int(geo[4] < geo[3]), 0, None)
        key = dwd_key(dwd_plane(geo, tr), L, rv_mode(L["signfix"], L["rq"]), tr, dly)
        outs[key] = outs.get(key, 0) + int(L["n"]) * geo[2] * geo[3] * geo[4]
    # (the walk takes strides 1 and 2 along the plane's rows: the others start compact)
    kinds = {k: "walk" if k[6] <= 2 else "compact" for k in outs}
    while True:
        now, best = dwd_total(kinds), None
        for k in sorted(outs):
            for up in ("compact", "full"):
                gain = dwd_extra(k[:9], kinds[k]) - dwd_extra(k[:9], up)
                if gain <= 0:
                    continue
                trial = {**kinds, k: up}
                total = dwd_total(trial)
                if total > DWD_BUDGET:
                    continue
                score = outs[k] * gain / max(1, total - now)
                if best is None or score > best[0]:
                    best = (score, k, up)
        if best is None:
            break
        kinds[best[1]] = best[2]
    _KINDS[id(graph)] = (graph, sig, kinds)
    return kinds
