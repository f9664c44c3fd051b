"""Python mirrors of the RV32 micro-kernels in runtime_c/mcuforge_rv.h for the loop-IR
evaluator: they decode the "p16" stream from the header's description (per block of 4
channels, the chunks' segments: a word MF_RV_EOFF(e) + 1 then L taps of pair words; an end
word), check the lane proof the C relies on (every chunk's lane sums inside [-2^15, 2^15) for
any int8 x, else UndefinedBehaviour) and compute TFLM's arithmetic on whole arrays. Registered
into qmath.INTRINSICS on import."""
from __future__ import annotations

import numpy as np

from .loop_ir import UndefinedBehaviour
from .micro import GEOM_FIELDS, im2col, requantize
from .qmath import INTRINSICS


SEG, E_END = 8, 18  # MF_RV_SEG, MF_RV_E_END (mcuforge_rv.h)
F0 = 80 * (SEG + 1)  # MF_RV_F0
# segment word -> entry: MF_RV_EOFF(e) + 1, the starting entries 80 bytes each (e < SEG, then
# 2 SEG), the others 12 after them (F0 + 12 j: SEG..2 SEG - 1, then 2 SEG + 1, then the end)
_OFFSETS = [80 * e for e in range(SEG)] + [80 * SEG] + [F0 + 12 * j for j in range(SEG + 2)]
_ENTRY = {o + 1: e for o, e in zip(_OFFSETS, [*range(SEG), 2 * SEG, *range(SEG, 2 * SEG),
                                              2 * SEG + 1, E_END])}


def _segment(word) -> tuple[int, int, bool, bool] | None:
    """A segment word: (entry, taps, starts a chunk, ends it with a fold), None for the block's
    end word; raises for a word that is neither."""
    e = _ENTRY.get(int(word))
    if e is None:
        raise UndefinedBehaviour("mf_rv_gemm_p16: a segment word off the entries")
    if e == E_END:
        return None
    taps = e + 1 if e < SEG else e - SEG + 1 if e < 2 * SEG else SEG
    return e, taps, e < SEG or e == 2 * SEG, e < 2 * SEG


def unpack_p16(pw, o: int, k: int):
    """([O, K] weights, chunks per block) from a "p16" stream; raises where a chunk's lane
    could leave its 16 bits or the segments do not make whole chunks."""
    pw = np.asarray(pw, np.int64)
    ob = (o + 3) // 4
    w = np.zeros((ob * 4, k), np.int64)
    nch, i = [], 0
    for b in range(ob):
        a, n, start = 0, 0, None  # start: the open chunk's first tap
        while True:
            if i >= pw.size:
                raise UndefinedBehaviour("mf_rv_gemm_p16: a block without its end word")
            seg = _segment(pw[i])
            if seg is None:
                break
            e, ln, first, fold = seg
            if first != (start is None) or a + ln > k:
                raise UndefinedBehaviour("mf_rv_gemm_p16: segments off the chunks or taps")
            start = a if first else start
            words = pw[i + 1:i + 1 + 2 * ln].reshape(ln, 2)
            low = ((words & 0xFFFF) ^ 0x8000) - 0x8000
            high = (words - low) >> 16
            if (np.abs(high) > 128).any():
                raise UndefinedBehaviour("mf_rv_gemm_p16: a pair word is not two int8 lanes")
            w[4 * b:4 * b + 2, a:a + ln] = np.stack([low[:, 0], high[:, 0]])
            w[4 * b + 2:4 * b + 4, a:a + ln] = np.stack([low[:, 1], high[:, 1]])
            a += ln
            i += 1 + 2 * ln
            if fold:  # the chunk [start, a): both lanes' sums in 16 bits for any int8 x
                blk = w[4 * b:4 * b + 4, start:a]
                pos = np.where(blk > 0, blk, 0).sum(1)
                neg = np.where(blk < 0, -blk, 0).sum(1)
                if ((127 * pos + 128 * neg > 2**15 - 1) | (128 * pos + 127 * neg > 2**15)).any():
                    raise UndefinedBehaviour("mf_rv_gemm_p16: a chunk's lane may overflow")
                n += 1
                start = None
        if a != k or start is not None:
            raise UndefinedBehaviour("mf_rv_gemm_p16: a block's chunks do not cover the taps")
        i += 1
        nch.append(n)
    return w[:o], np.repeat(np.array(nch, np.int64), 4)[:o]


def _acc(xs, pw, rq, o, k, mode):
    """The accumulators with their biases (decoded from the records' init) and the mf_rq rows
    (mult = m2 / 2, pre = pre1 + 1)."""
    wm, nch = unpack_p16(pw, o, k)
    rec = np.asarray(rq[:7 * o], np.int64).reshape(o, 7)
    init, m2 = rec[:, 0], rec[:, 1] % 2**32
    if (m2 % 2).any() or (rec[:, 3] < 0).any():
        raise UndefinedBehaviour("mf_rv_rec: m2 odd or pre1 < 0")
    if not int(mode) & 2 and (rec[:, 3] != 0).any():
        raise UndefinedBehaviour("mf_rv_gemm_p16: a channel shifts (pre1 != 0) in mode 0/1")
    bias = init.copy()
    for ch in range(0, o, 2):  # channel a: init = bias_a - n 2^15 + 2^16 bias_b (mod 2^32)
        nb = init[ch + 1] if ch + 1 < o else 0
        v = (init[ch] + nch[ch] * 2**15 - nb * 2**16) % 2**32
        bias[ch] = v - 2**32 if v >= 2**31 else v
    rqr = np.stack([m2 // 2, rec[:, 2], rec[:, 3] + 1, rec[:, 4]], 1)
    idx = rec[:, 6] + np.arange(o) // 4 * 4  # out: relative to the block's first slot
    if sorted(idx.tolist()) != list(range(o)):
        raise UndefinedBehaviour("mf_rv_rec.out: the output indices are not the channels")
    if not int(mode) & 16 and (idx != np.arange(o)).any():
        raise UndefinedBehaviour("mf_rv_rec.out: channels reordered without mode bit 4")
    return xs @ wm.T + bias, rqr, rec[:, 5], idx


def _out(acc, rqr, low, mode, lo, hi):
    """The outputs; mode bit 3: every accumulator at most its channel's low must give lo (the
    C stores lo for those without requantizing)."""
    out = requantize(acc, rqr, int(mode) & 1, lo, hi)
    if int(mode) & 8 and ((acc <= low) & (out != lo)).any():
        raise UndefinedBehaviour("mf_rv_rec.low: an accumulator at most low not giving lo")
    return out


def _gemm(x, rows, x_stride, k, pw, rq, o, lo, hi, mode, y, y_stride, scratch):
    if scratch.nbytes < 3 * k:
        raise UndefinedBehaviour(f"mf_rv_gemm_p16: {scratch.nbytes} bytes of scratch, "
                                 f"needs {3 * k}")
    xs = np.stack([np.asarray(x[r * x_stride:r * x_stride + k], np.int64) for r in range(rows)])
    acc, rqr, low, idx = _acc(xs, pw, rq, o, k, mode)
    out = np.zeros_like(acc)
    out[:, idx] = _out(acc, rqr, low, mode, lo, hi)  # slot s -> output channel idx[s]
    for r in range(rows):
        y[r * y_stride:r * y_stride + o] = out[r]


def _conv(x, geom, x_zp, pw, rq, o, lo, hi, mode, y, scratch):
    g = dict(zip(GEOM_FIELDS, (int(v) for v in geom[:len(GEOM_FIELDS)])))
    k = g["k_h"] * g["k_w"] * g["in_c"]
    if scratch.nbytes < 6 * k:
        raise UndefinedBehaviour(f"mf_rv_conv_p16: {scratch.nbytes} bytes of scratch, "
                                 f"needs {6 * k}")
    acc, rqr, low, idx = _acc(im2col(x, g, x_zp), pw, rq, o, k, mode)
    out = np.zeros_like(acc)
    out[:, idx] = _out(acc, rqr, low, mode, lo, hi)
    y[:out.size] = out.reshape(-1)


def _stream_k(pw) -> int:
    """The taps of a p16 stream: its first block's segments summed (the C kernel reads
    segments up to the block's end word)."""
    pw = np.asarray(pw, np.int64)
    i = k = 0
    while i < pw.size:
        seg = _segment(pw[i])
        if seg is None:
            return k
        k += seg[1]
        i += 1 + 2 * seg[1]
    raise UndefinedBehaviour("mf_rv_fc_p16: a block without its end word")


def _fc(x, pw, rq, o, lo, hi, mode, y):
    """mf_rv_fc_p16: one row, K taps from the stream."""
    k = _stream_k(pw)
    if len(x) < k:
        raise UndefinedBehaviour(f"mf_rv_fc_p16: reads {k} bytes of x, has {len(x)}")
    _gemm(x, 1, k, k, pw, rq, o, lo, hi, mode, y, o, np.zeros(3 * k, np.int8))


INTRINSICS["mf_rv_gemm_p16"] = _gemm
INTRINSICS["mf_rv_fc_p16"] = _fc
INTRINSICS["mf_rv_conv_p16"] = _conv


def _dw3(x, y, pk, g, x_zp, lo, hi, mode, scratch):
    """mf_rv_dw3: mf_sc_dw3 (micro_scalar's mirror) with mf_rv_rec records (init = bias,
    m2 = 2 mult, pre1 = pre - 1) and mode (bit 0 the sign term, bit 1 the shift)."""
    from .micro_scalar import _dw3 as sc_dw3
    c = int(g[2])
    rec = np.asarray(pk[:14 * c], np.int64).reshape(c, 14).copy()
    m2 = rec[:, 10] % 2**32
    if (m2 % 2).any() or (rec[:, 12] < 0).any():
        raise UndefinedBehaviour("mf_rv_dw3: m2 odd or pre1 < 0")
    if not int(mode) & 2 and (rec[:, 12] != 0).any():
        raise UndefinedBehaviour("mf_rv_dw3: a channel shifts (pre1 != 0) in mode 0/1")
    rec[:, 10], rec[:, 12] = m2 // 2, rec[:, 12] + 1
    sc_dw3(x, y, rec.reshape(-1), g, x_zp, lo, hi, int(mode) & 1, scratch)


INTRINSICS["mf_rv_dw3"] = _dw3


def dwd_ok(h, w, c, oh, ow, sh, sw, pt, pl) -> bool:
    """mf_rv_dwd's geometry: padding at most 1 on every side (the middle kernel row and column
    then always inside the image), strides >= 1."""
    pb, pr = (oh - 1) * sh + 3 - h - pt, (ow - 1) * sw + 3 - w - pl
    return min(oh, ow, sh, sw, c) >= 1 and 0 <= pt <= 1 and 0 <= pl <= 1 and pb <= 1 \
        and pr <= 1


def _dwd(x, y, pk, h, w, c, oh, ow, sh, sw, pt, pl, x_zp, lo, hi, mode, tr, dly, buf):
    """mf_rv_dwd: mf_rv_dw3's arithmetic on the plane (h, w, ... : the image, or with tr its
    transpose), padding at most 1 a side; buf holds 2 VOW bytes when dly."""
    geo = tuple(int(v) for v in (h, w, c, oh, ow, sh, sw, pt, pl))
    if not dwd_ok(*geo):
        raise UndefinedBehaviour(f"mf_rv_dwd: geometry {geo} (padding > 1 a side)")
    if dly and buf.nbytes < 2 * geo[4]:
        raise UndefinedBehaviour(f"mf_rv_dwd: {buf.nbytes} bytes of buf, needs {2 * geo[4]}")
    h, w, c, oh, ow, sh, sw, pt, pl = geo
    ys, xs = (c, h * c) if tr else (w * c, c)
    oys, oxs = (c, oh * c) if tr else (ow * c, c)
    g = np.array([h, w, c, oh, ow, sh, sw, pt, pl, ys, xs, oys, oxs, (oh - 1) * sh + 3,
                  (ow - 1) * sw + 3], np.int32)  # mf_sc_dw3's geometry of that plane
    _dw3(x, y, pk, g, x_zp, lo, hi, mode, np.zeros(int(g[13]) * int(g[14]), np.int8))


INTRINSICS["mf_rv_dwd"] = _dwd


def register_dwd_copy(name: str, consts: tuple) -> None:
    """The mirror of one constant-geometry copy of mf_rv_dwd (consts: plane, lo, hi, mode, tr,
    dly), registered here so every mirror stays in a micro module."""
    INTRINSICS[name] = lambda x, y, pk, x_zp, buf: _dwd(x, y, pk, *consts[:9], x_zp,
                                                       *consts[9:], buf)


def register_dwd_walk(name: str, consts: tuple) -> None:
    """The mirror of one shared copy of mf_rv_dwd (consts: sy, sx, pt, pl, lo, hi, mode, tr,
    dly; the plane's sizes h, w, c, oh, ow are its last arguments)."""
    sy, sx, pt, pl = consts[:4]
    INTRINSICS[name] = lambda x, y, pk, x_zp, buf, h, w, c, oh, ow: _dwd(
        x, y, pk, h, w, c, oh, ow, sy, sx, pt, pl, x_zp, *consts[4:], buf)
