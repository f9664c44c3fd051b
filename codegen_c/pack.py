"""Compile-time data of the micro-kernels in runtime_c/mcuforge_nn.h: requantization constants,
folded biases and the proofs that the fast forms stay exact.

The kernels compute with the input zero point folded into the bias (padding is then filled with
the zero point instead of being skipped) and with TFLM's MultiplyByQuantizedMultiplier rewritten
as one rounding high multiply plus one shift (see mcuforge_nn.h). Both are exact only while no
intermediate overflows int32; `requant_params` and `fold_bias` return None when that cannot be
proven from the weights, and the layer then keeps its reference lowering.
"""
from __future__ import annotations

import numpy as np

INT32_MIN, INT32_MAX = -2**31, 2**31 - 1
RQ_FIELDS = ("mult", "add", "pre", "post")  # mf_rq, in struct order


def fold_bias(bias, w_rows: np.ndarray, x_zp: int):
    """bias[o] - x_zp * sum_k w[o, k] as int32 (w_rows: [O, K] int weights), or None when a
    folded bias leaves int32."""
    w = np.asarray(w_rows, dtype=np.int64).reshape(len(w_rows), -1)
    b = np.zeros(len(w), np.int64) if bias is None else np.asarray(bias, np.int64).reshape(-1)
    folded = b - int(x_zp) * w.sum(axis=1)
    if folded.min(initial=0) < INT32_MIN or folded.max(initial=0) > INT32_MAX:
        return None
    return folded.astype(np.int32)


def acc_bounds(bias, w_rows: np.ndarray, x_lo: int = -128, x_hi: int = 127) -> np.ndarray:
    """Per output channel the largest |bias + sum_k x_k * w[o, k]| over inputs x_k in
    [x_lo, x_hi] (raw stored values, zero point not subtracted): [O] int64."""
    w = np.asarray(w_rows, dtype=np.int64).reshape(len(w_rows), -1)
    b = np.zeros(len(w), np.int64) if bias is None else np.asarray(bias, np.int64).reshape(-1)
    hi = b + np.where(w > 0, w * x_hi, w * x_lo).sum(axis=1)
    lo = b + np.where(w > 0, w * x_lo, w * x_hi).sum(axis=1)
    return np.maximum(np.abs(hi), np.abs(lo))


def constant_channels(bias, w_rows, mults, shifts, zp: int, lo: int, hi: int) -> dict:
    """{channel: output} for the channels whose output is the same for every int8 input: TFLM's
    clamp(zp + MultiplyByQuantizedMultiplier(acc)) is monotone in acc, so equal values at both
    ends of the accumulator's range prove it. Such channels (a multiplier so small that the
    product rounds to 0, a dead filter) need no arithmetic, and their often huge accumulator
    bounds would otherwise keep the whole layer off the fast requantization."""
    from .qmath import mf_mbqm
    w = np.asarray(w_rows, dtype=np.int64).reshape(len(w_rows), -1)
    b = np.zeros(len(w), np.int64) if bias is None else np.asarray(bias, np.int64).reshape(-1)
    top = b + np.where(w > 0, w * 127, w * -128).sum(axis=1)
    bottom = b + np.where(w > 0, w * -128, w * 127).sum(axis=1)
    out = {}
    for c, (m, sh, a0, a1) in enumerate(zip(np.asarray(mults).tolist(),
                                             np.asarray(shifts).tolist(),
                                             bottom.tolist(), top.tolist())):
        if m < 0 or not INT32_MIN <= a0 <= a1 <= INT32_MAX:
            continue
        y0, y1 = (min(max(zp + mf_mbqm(a, m, sh), lo), hi) for a in (a0, a1))
        if y0 == y1:
            out[c] = y0
    return out


def requant_params(mults, shifts, zp: int, acc_bound) -> np.ndarray | None:
    """[O, 4] int32 rows of mf_rq (mult, add, pre, post) for TFLM's per-channel (mult, shift),
    or None when some channel is outside the fast form's exact range: a negative multiplier, an
    accumulator (|acc| <= acc_bound[o]) whose `acc << pre` or `h + add` leaves int32."""
    mults = np.asarray(mults, np.int64).reshape(-1)
    shifts = np.broadcast_to(np.asarray(shifts, np.int64).reshape(-1), mults.shape)
    bound = np.broadcast_to(np.asarray(acc_bound, np.int64).reshape(-1), mults.shape)
    rows = []
    for m, s, a in zip(mults.tolist(), shifts.tolist(), bound.tolist()):
        if m < 0 or s > 30 or s < -31:
            return None
        pre, post = max(s, 0) + 1, max(-s, 0)
        add = ((1 << (post - 1)) + (zp << post)) if post else zp
        h = (a << pre) * m // 2**32 + 1  # |SMMLAR(acc << pre, m)| <= h
        if (a << pre) > INT32_MAX or not INT32_MIN <= add - h - 1 <= add + h <= INT32_MAX:
            return None
        rows.append((m, add, pre, post))
    return np.array(rows, dtype=np.int32).reshape(-1, 4)


def needs_signfix(zp: int, lo: int) -> int:
    """1 unless the lower clamp already hides the rounding of negative values (lo >= zp)."""
    return 0 if lo >= zp else 1


def signfix_mode(zp: int, lo: int, rq, zero_acc=None) -> int:
    """The GEMM kernels' signfix argument: 0 when lo >= zp; 2 (the sign term taken from the
    accumulator, cheaper: see mf_rq_clamp) when every channel has post >= 1 or an accumulator
    that is always 0 (zero_acc[o]: zero weights and bias); else 1."""
    if not needs_signfix(zp, lo):
        return 0
    post = np.asarray(rq, np.int64).reshape(-1, 4)[:, 3]
    ok = post >= 1
    if zero_acc is not None:
        ok |= np.asarray(zero_acc, bool)
    return 2 if ok.all() else 1


# ---- GEMM micro-kernels (mf_gemm_w16/w8, mf_conv_w16/w8 in mcuforge_nn.h) -------------------
GEMM_FORMATS = ("w16", "w8")  # int16 pre-widened (2x flash, fastest), int8 widened in the loop
_LANES = {"w16": (0, 2, 1, 3), "w8": (0, 1, 2, 3)}  # tap order within a group of 4


def kpad(k: int) -> int:
    """K rounded up to the kernels' group of 4 taps (MF_KPAD)."""
    return (int(k) + 3) // 4 * 4


def pack_gemm_weights(w_rows, fmt: str):
    """The weights [O, K] (int8 values; a conv's OHWI weights reshaped to [O, KH*KW*C]) in the
    order mf_gemm_<fmt> reads them: channels in blocks of 4 (zero rows pad the last block),
    then per block, group of 4 taps, channel: 4 taps, in lane order (w0, w2, w1, w3) for "w16"
    and (w0, w1, w2, w3) for "w8"; taps K..Kp-1 are zero. Returns (flat int16 or int8 array,
    flash bytes)."""
    if fmt not in GEMM_FORMATS:
        raise ValueError(f"unknown GEMM weight format {fmt!r}; expected one of {GEMM_FORMATS}")
    w = np.asarray(w_rows, dtype=np.int64).reshape(len(w_rows), -1)
    o, k = w.shape
    op, kp = (o + 3) // 4 * 4, kpad(k)
    padded = np.zeros((op, kp), np.int64)
    padded[:o, :k] = w
    # [block, channel-in-block, group, tap] -> [block, group, channel-in-block, lane]
    blocks = padded.reshape(op // 4, 4, kp // 4, 4)[..., list(_LANES[fmt])]
    flat = blocks.transpose(0, 2, 1, 3).reshape(-1)
    arr = flat.astype(np.int16 if fmt == "w16" else np.int8)
    return arr, arr.nbytes


PRE0 = 4  # MF_PRE0: the signfix flag saying every mf_rq.pre is 0


def fold_pre(w_rows, bias, rq):
    """2^pre of each channel moved into its weights and bias (mf_rq.pre becomes 0), so the
    kernels skip the shift: (rows, bias, rq) with the same products, or None when a weight
    would leave int16 (pre > 8) or a bias int32. Exact: acc << pre is what the kernels
    computed, and requant_params proved it fits int32."""
    rq = np.array(rq, np.int64).reshape(-1, 4)
    pre = rq[:, 2]
    w = np.asarray(w_rows, np.int64).reshape(len(rq), -1) << pre[:, None]
    b = np.asarray(bias, np.int64).reshape(-1) << pre
    if w.size and (w.min() < -2**15 or w.max() >= 2**15):
        return None
    if b.size and (b.min() < INT32_MIN or b.max() > INT32_MAX):
        return None
    rq[:, 2] = 0
    return w, b.astype(np.int32), rq.astype(np.int32)


MAX_UNROLLED_GROUPS = 16  # mf_gemm_w16_g<G> / mf_conv_w16_g<G> exist for G = 1..16


def gemm_scratch_bytes(k: int) -> int:
    """Scratch bytes one mf_gemm_* call needs for K taps per output: the widened row
    (int16[Kp]). 4-byte aligned."""
    return 2 * kpad(k)


def conv_scratch_bytes(k_h: int, k_w: int, in_c: int, stride_w: int, out_w: int) -> int:
    """Scratch bytes one mf_conv_* (im2col) call needs: the widened patch int16[Kp], an int8
    patch [Kp] and the row cache int8[k_h][((out_w - 1) * stride_w + k_w) * in_c]."""
    kp = kpad(k_h * k_w * in_c)
    return 3 * kp + k_h * ((out_w - 1) * stride_w + k_w) * in_c


def conv_lean_scratch_bytes(k: int) -> int:
    """Scratch bytes of one mf_conv_lean_* call (K taps): the widened patch int16[Kp] and the
    int8 patch [Kp]."""
    return 3 * kpad(k)


def gemm_flash_bytes(o: int, k: int, fmt: str) -> int:
    """Flash bytes of pack_gemm_weights for O x K weights in `fmt`, without packing them (the
    per-layer format choice under a flash budget): Op * Kp elements of 2 ("w16") or 1 ("w8")
    bytes."""
    if fmt not in GEMM_FORMATS:
        raise ValueError(f"unknown GEMM weight format {fmt!r}; expected one of {GEMM_FORMATS}")
    return (int(o) + 3) // 4 * 4 * kpad(k) * (2 if fmt == "w16" else 1)


def pack_gemm2(w_rows, bias, rq):
    """The record stream of mf_gemm2_w16 (O even, 2^pre folded: fold_pre's output): per pair
    of channels 2p, 2p + 1, int32 words [b0, b1, b0, b1], then per group of 4 taps the two
    channels' (w0, w2), (w1, w3) as int16 lane pairs (lane 0 in the low half), then [mult0,
    add0, post0, mult1, add1, post1]. Returns the int32 array."""
    w = np.asarray(w_rows, np.int64).reshape(len(w_rows), -1)
    o, k = w.shape
    rq = np.asarray(rq, np.int64).reshape(o, 4)
    if o % 2 or (rq[:, 2] != 0).any():
        raise ValueError("pack_gemm2: O must be even and every mf_rq.pre 0 (fold_pre)")
    kp = kpad(k)
    padded = np.zeros((o, kp), np.int64)
    padded[:, :k] = w
    lanes = padded.reshape(o, kp // 4, 4)[..., list(_LANES["w16"])]  # [O, G, lane]
    words = (lanes[..., 0::2] & 0xFFFF) | (lanes[..., 1::2] << 16)  # [O, G, 2]
    words = words.reshape(o // 2, 2, kp // 4, 2).transpose(0, 2, 1, 3).reshape(o // 2, -1)
    b = np.asarray(bias, np.int64).reshape(o // 2, 2)
    tail = rq[:, [0, 1, 3]].reshape(o // 2, 6)
    rec = np.concatenate([b, b, words, tail], axis=1)
    rec = np.where(rec >= 2**31, rec - 2**32, rec)  # low-half lanes read back as int32
    return rec.reshape(-1).astype(np.int32)


def pack_gemm1k8(w_rows, bias, rq):
    """The records of mf_gemm1k8_w16 (K = 8, 2^pre folded): per channel 8 int32 words [bias,
    (w0, w2), (w1, w3), (w4, w6), (w5, w7), mult, add, post], weights as int16 lane pairs (lane
    0 in the low half). Returns the int32 array."""
    w = np.asarray(w_rows, np.int64).reshape(len(w_rows), -1)
    o, k = w.shape
    rq = np.asarray(rq, np.int64).reshape(o, 4)
    if k != 8 or (rq[:, 2] != 0).any():
        raise ValueError("pack_gemm1k8: K must be 8 and every mf_rq.pre 0 (fold_pre)")
    lanes = w.reshape(o, 2, 4)[..., list(_LANES["w16"])].reshape(o, 8)
    words = (lanes[:, 0::2] & 0xFFFF) | (lanes[:, 1::2] << 16)
    rec = np.concatenate([np.asarray(bias, np.int64).reshape(o, 1), words, rq[:, [0, 1, 3]]], 1)
    return rec.reshape(-1).astype(np.int32)


def gemm2_words(o: int, k: int) -> int:
    """int32 words of pack_gemm2's stream (MF_GEMM2_WORDS per pair of channels)."""
    return int(o) // 2 * (10 + kpad(k))


def gemm2_scratch_bytes(k: int) -> int:
    """Scratch bytes of one mf_gemm2_w16 call: two rows widened (int16[2 * Kp])."""
    return 4 * kpad(k)


CONV_GEOM_FIELDS = ("in_h", "in_w", "in_c", "k_h", "k_w", "stride_h", "stride_w", "pad_t",
                    "pad_l", "out_h", "out_w")  # mf_conv_geom, in struct order


def conv_geom(in_h: int, in_w: int, in_c: int, k_h: int, k_w: int, stride_h: int,
              stride_w: int, padding: str) -> tuple:
    """mf_conv_geom's fields for a TFLite-style SAME / VALID convolution (dilation 1): TFLM's
    output size and top/left padding (the larger half of an odd total goes bottom/right)."""
    if padding == "VALID":
        out_h, out_w = (in_h - k_h) // stride_h + 1, (in_w - k_w) // stride_w + 1
    elif padding == "SAME":
        out_h, out_w = -(-in_h // stride_h), -(-in_w // stride_w)
    else:
        raise ValueError(f"padding {padding!r}: expected 'SAME' or 'VALID'")
    pad_t = max((out_h - 1) * stride_h + k_h - in_h, 0) // 2
    pad_l = max((out_w - 1) * stride_w + k_w - in_w, 0) // 2
    return (in_h, in_w, in_c, k_h, k_w, stride_h, stride_w, pad_t, pad_l, out_h, out_w)


# ---- im2col-free convolution (mf_convp_*): the patch read from widened rows ------------------
def conv_pair_order(k_h: int, k_w: int, in_c: int) -> np.ndarray:
    """Per tap of mf_convp_*'s K' = 4 * ceil(n * k_h / 2) taps (n = ceil(k_w * in_c / 2)), the
    original tap (ky * k_w + kx) * in_c + ci it multiplies, or -1 (weight 0). The kernel's
    activation words are pairs (e_2p, e_2p+1) of each kernel row's piece, word m = p * k_h + ky;
    group g holds words 2g (lanes 0, 2: taps 4g, 4g + 2) and 2g + 1 (taps 4g + 1, 4g + 3).
    For in_c % 4 == 0 the groups are 4 consecutive elements of one row piece instead (K' = K),
    group m = q * k_h + ky."""
    seg = k_w * in_c
    if in_c % 4 == 0:  # quads: tap order (group q of the row piece, kernel row, 4 taps)
        t = np.arange(k_h * seg)
        q, ky = t // 4 // k_h, t // 4 % k_h
        return ky * seg + 4 * q + t % 4
    n = (seg + 1) // 2
    groups = (n * k_h + 1) // 2
    t = np.arange(4 * groups)
    m = 2 * (t // 4) + (t % 4) % 2
    e = 2 * (m // k_h) + (t % 4) // 2
    ky = m % k_h
    return np.where(e < seg, ky * seg + e, -1)


def pair_rows(w_rows, k_h: int, k_w: int, in_c: int) -> np.ndarray:
    """Conv weights [O, K] (OHWI flattened) reordered for mf_convp_*: [O, K'], zero where
    conv_pair_order is -1; pack them with pack_gemm_weights."""
    w = np.asarray(w_rows, dtype=np.int64).reshape(len(w_rows), -1)
    idx = conv_pair_order(k_h, k_w, in_c)
    return np.where(idx >= 0, w[:, np.maximum(idx, 0)], 0)


def convp_scratch_bytes(k_h: int, k_w: int, in_c: int, stride_w: int, out_w: int) -> int:
    """Scratch bytes of one mf_convp_* call: int32 [copies][npos * k_h] widened rows (npos =
    ceil(wpad * in_c / 2) + 1, copies 2 when stride_w * in_c is odd; for in_c % 4 == 0 int16
    [wpad * in_c * k_h]) and one padded int8 row of wpad * in_c + 8 bytes (wpad = (out_w - 1)
    * stride_w + k_w)."""
    rowb = ((out_w - 1) * stride_w + k_w) * in_c
    if in_c % 4 == 0:  # quads: int16 [rowb * k_h]
        return 2 * rowb * k_h + rowb + 8
    npos = (rowb + 1) // 2 + 1
    copies = 2 if (stride_w * in_c) % 2 else 1
    return 4 * npos * k_h * copies + rowb + 8


# ---- row-paired convolution (mf_convrp_w16_n<NW>): few input channels ------------------------
MAX_CONVRP_WORDS = 32  # mf_convrp_w16_n<NW> exist for NW = 1..32


def convrp_words(k_h: int, k_w: int, in_c: int) -> int:
    """NW: the int16-pair words of one window (mf_crp_words): kernel rows in pairs, the odd one
    last, ceil(k_w * in_c / 2) pair groups of gs = 2 * (k_h // 2) + k_h % 2 words, less the
    P words of the element past an odd-length window."""
    j, o, seg = k_h // 2, k_h % 2, k_w * in_c
    return (2 * j + o) * ((seg + 1) // 2) - (j if seg % 2 else 0)


def convrp_order(k_h: int, k_w: int, in_c: int) -> np.ndarray:
    """[NW, 2]: the original tap (ky * k_w + kx) * in_c + ci of each lane (low, high) of the
    window's words in mcuforge_nn.h's row-paired layout, or -1 (weight 0). Word m of a window:
    pair group q = m // gs, i = m % gs; i < J: P_i of element 2q (rows 2i, 2i + 1); i == J when
    k_h is odd: S (row k_h - 1, elements 2q, 2q + 1); else P_(i-J-o) of element 2q + 1."""
    j_, o, seg = k_h // 2, k_h % 2, k_w * in_c
    gs = 2 * j_ + o
    out = []
    for m in range(convrp_words(k_h, k_w, in_c)):
        q, i = divmod(m, gs)
        if i < j_:
            lanes = ((2 * i, 2 * q), (2 * i + 1, 2 * q))
        elif o and i == j_:
            lanes = ((k_h - 1, 2 * q), (k_h - 1, 2 * q + 1))
        else:
            r = i - j_ - o
            lanes = ((2 * r, 2 * q + 1), (2 * r + 1, 2 * q + 1))
        out.append([ky * seg + e if e < seg else -1 for ky, e in lanes])
    return np.array(out, np.int64).reshape(-1, 2)


def pack_convrp(w_rows, bias, rq, k_h: int, k_w: int, in_c: int, stride_w: int) -> np.ndarray:
    """The int32 table of mf_convrp_w16_n<NW> from weights [O, K] (OHWI flattened, O a multiple
    of 4, 2^pre already folded in: fold_pre), bias [O] and mf_rq rows [O, 4] (pre 0): per block
    of 4 channels bias[4], the NW words in chunks of 3 (per chunk per channel its words, an
    int16 pair (low, high) each), (mult, add, post) of channels 0 and 1, the window's pointer
    adjustment (-4 NW bytes, plus the pixel step in the last block), the last-block flag,
    (mult, add, post) of channels 2 and 3."""
    w = np.asarray(w_rows, np.int64).reshape(len(w_rows), -1)
    rq = np.asarray(rq, np.int64).reshape(-1, 4)
    o = w.shape[0]
    if o % 4 or (rq[:, 2] != 0).any():
        raise ValueError("pack_convrp: O must be a multiple of 4 and every mf_rq.pre 0")
    idx = convrp_order(k_h, k_w, in_c)
    lanes = np.where(idx >= 0, w[:, np.maximum(idx, 0)], 0)  # [O, NW, 2]
    words = (lanes[..., 0] & 0xFFFF) | (lanes[..., 1] << 16)  # int16 pairs as int32 values
    nw = len(idx)
    step = convrp_step_bytes(k_h, in_c, stride_w)
    out = []
    for b in range(o // 4):
        ch = slice(4 * b, 4 * b + 4)
        last = b == o // 4 - 1
        out.extend(np.asarray(bias, np.int64).reshape(-1)[ch])
        for c0 in range(0, nw, 3):
            out.extend(words[ch, c0:c0 + 3].reshape(-1))
        r = rq[ch][:, [0, 1, 3]]
        out.extend([*r[0], *r[1], -4 * nw + (step if last else 0), int(last), *r[2], *r[3]])
    return np.array(out, np.int64).astype(np.int32)


def convrp_step_bytes(k_h: int, in_c: int, stride_w: int) -> int:
    """Bytes between the windows one run of mf_convrp's asm visits: the next pixel's, or for odd
    stride_w * in_c (two widened copies, even and odd pixels in separate runs) the one after."""
    gs, step = 2 * (k_h // 2) + k_h % 2, stride_w * in_c
    return 4 * gs * (step if step % 2 else step // 2)


def convrp_scratch_bytes(k_h: int, k_w: int, in_c: int, stride_w: int, out_w: int,
                         in_w: int) -> int:
    """Scratch bytes of one mf_convrp* call: the widened rows int16 [copies][npairs * gs * 2]
    (npairs = ((out_w - 1) * stride_w * in_c + 1) // 2 + ceil(k_w * in_c / 2), copies 2 when
    stride_w * in_c is odd) and an int8 row of x_zp [in_w * in_c], rounded up to 4."""
    gs, step = 2 * (k_h // 2) + k_h % 2, stride_w * in_c
    npairs = ((out_w - 1) * step + 1) // 2 + (k_w * in_c + 1) // 2
    return 4 * npairs * gs * (1 + step % 2) + (in_w * in_c + 3) // 4 * 4
