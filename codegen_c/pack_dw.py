"""Compile-time data of the depthwise 3x3 micro-kernel mf_dw3x3_s8 (runtime_c/mcuforge_dw.h):
the layer geometry with the scratch shape, and the packed per-channel constants.

Both return None when the kernel does not apply (kernel not 3x3, stride not 1 or 2 in both
directions, dilation, or a layer whose integers the fast form cannot prove exact: the folded
bias or `acc << pre` leaving int32, weights * 2^pre leaving int16); the layer then keeps its
reference loops (geometry also refuses a depth multiplier other than 1).

Use (per layer; TFLite weights [1, 3, 3, C], TFLM's per-channel mult/shift, activation lo/hi):

    g = pack_dw.geometry(h, w, c, oh, ow, stride, pad_t, pad_l, budget=free_bytes)
    pk = pack_dw.pack_dw(weights, bias, x_zp, mults, shifts, y_zp, g["transpose"])
    # C: static const mf_dw_geom G = {<g[f] for f in GEOM_FIELDS>};
    #    static const int32_t PK[C * REC] = {<pk>};
    #    static int32_t SCRATCH[scratch_bytes(g) / 4];       (4-byte aligned, or arena space)
    #    <entry(g, signfix, lo, hi)>(x, y, PK, &G, x_zp, lo, hi, signfix,
    #                                (int16_t *)(void *)SCRATCH);
    # with signfix = pack.needs_signfix(y_zp, lo); entry() names the variant of mf_dw3x3_s8
    # (stride, sign term, clamp, row shape) so that the model links only the code it runs.

Scratch: the kernel widens a band of input rows of 4 channels (MF_DW_CB) to planar int16 rows
with zero-point borders. 4 channels is the unit of one 32-bit NHWC load; small images (at most
SMALL outputs a channel, one band) take cg channels a pass, as many as the budget holds, which
shares the per-pass set-up; elsewhere more channels would cost RAM for ~1% of instructions. The
band holds as many output rows as `budget` bytes allow (all of them when the layer is small: KWS
1.6 KB, VWW 6x6x256 0.5 KB for 4 channels; small images fill the budget with channels), at
least one (3 rows of 4 channels). The rows two bands share are
copied, not widened again; the price of a small budget is per-band overhead. Measured on VWW's
48x48x8 s1 / 48x48x16 s2 layers (instructions per MAC, -O2): budget 1 KB 2.22 / 3.33, 2 KB
1.99 / 3.04, 4 KB (default) 1.93 / 2.91, 8 KB 1.92 / 2.88. Pass the bytes the memory plan has
free at that layer.
"""
from __future__ import annotations

import numpy as np

from mcuforge.codegen_c import pack

CB = 4      # MF_DW_CB
REC = 10    # MF_DW_REC: 6 weight pairs, bias, mult, add, post
DEFAULT_BUDGET = 4096
# Outputs per channel up to which a layer widens more than 4 channels a pass (geometry's cg): a
# pass costs ~130 instructions of set-up (widening and kernel calls), ~6% of 4 channels' work at
# 6x6 outputs (VWW 6x6x128: -2.7 K instructions a layer, 3x3x256: -8.8 K), ~1% at 12x12 or KWS's
# 25x5, where the larger scratch would cost RAM for nothing.
SMALL = 64
GEOM_FIELDS = ("h", "w", "c", "oh", "ow", "stride", "pad_t", "pad_l", "transpose", "pw",
               "rows", "cg")  # mf_dw_geom, in struct order


def geometry(h: int, w: int, c: int, oh: int, ow: int, stride, pad_t: int, pad_l: int,
             kernel=(3, 3), dilation=(1, 1), budget: int = DEFAULT_BUDGET,
             depth_multiplier: int = 1) -> dict | None:
    """mf_dw_geom's fields (in GEOM_FIELDS order) for an NHWC [h, w, c] -> [oh, ow, c] layer, or
    None when the kernel does not handle it. stride: an int or (sh, sw)."""
    sh, sw = (stride, stride) if np.isscalar(stride) else tuple(stride)
    if (tuple(kernel) != (3, 3) or tuple(dilation) != (1, 1) or sh != sw or sh not in (1, 2)
            or depth_multiplier != 1):
        return None
    s = int(sh)
    if min(h, w, c, oh, ow) < 1 or pad_t < 0 or pad_l < 0:
        return None
    # Walk the columns instead of the rows when that is cheaper (KWS 25x5: 5 rows of 25).
    transpose = int(_cost(w, h, ow, oh, s) < _cost(h, w, oh, ow, s))
    vw, vow, vpl = (h, oh, pad_t) if transpose else (w, ow, pad_l)  # the kernel's rows
    voh = ow if transpose else oh
    owe = vow + (vow & 1)
    pw = max(vpl + vw, s * owe + 2)
    pw += pw & 1
    row_bytes = CB * pw * 2
    band = max(1, min(voh, ((budget // row_bytes) - 3) // s + 1))
    rows = (band - 1) * s + 3
    cg = CB
    if band >= voh and oh * ow <= SMALL:  # a small image: as many channels a pass as fit
        cg = max(CB, min(-(-c // CB) * CB, budget // (rows * pw * 2) // CB * CB))
    g = dict(h=h, w=w, c=c, oh=oh, ow=ow, stride=s, pad_t=pad_t, pad_l=pad_l,
             transpose=transpose, pw=pw, rows=rows, cg=cg)
    if max(g.values()) > 2**15 - 1 or (oh * ow * c) > 2**31 - 1:
        return None
    return g


def _cost(rows: int, width: int, out_rows: int, out_w: int, s: int) -> float:
    """Instructions per channel of mf_dw3x3_s8's DSP body walking `out_rows` rows of out_w
    outputs (instruction counts of the asm, checked on mps2-an386): per output row 10 of set-up,
    54 (stride 1) or 57 (stride 2) per 4 outputs, then 27 (28) for a pair when out_w mod 4 >= 2
    and 17 for a single output when out_w is odd; widening ~16 per input row + 6 per pixel, for
    4 channels."""
    row = ((54 if s == 1 else 57) * (out_w // 4) + ((27 if s == 1 else 28) if out_w & 2 else 0)
           + (17 if out_w & 1 else 0))
    return out_rows * (10 + row) + rows * (16 + 6 * width) / CB


def entry(geom: dict, signfix: int, lo: int, hi: int) -> str:
    """The mf_dw3x3_s8 entry a layer calls, mf_dw3x3_s8_<stride>[f][c]_<k> (f: the sign term, c:
    a clamp, k: the row shape, (ow mod 4) + (4 if ow >= 4) in the kernel's view), so that a model
    links only the kernel variants its layers use."""
    ow = geom["oh"] if geom["transpose"] else geom["ow"]
    k = (ow & 3) + (4 if ow >= 4 else 0)
    return (f"mf_dw3x3_s8_{int(geom['stride'])}{'f' if signfix else ''}"
            f"{'c' if lo > -128 or hi < 127 else ''}_{k}")


def scratch_bytes(geom: dict) -> int:
    """Bytes of the int16 scratch mf_dw3x3_s8 needs (4-byte aligned)."""
    return geom["cg"] * geom["rows"] * geom["pw"] * 2


def pack_dw(weights, bias, x_zp: int, mults, shifts, y_zp: int,
            transpose: int = 0) -> np.ndarray | None:
    """[C, REC] int32 constants for mf_dw3x3_s8, or None when the layer's integers are outside
    the kernel's exact range. weights: int [3, 3, C] (TFLite's [1, 3, 3, C] accepted), bias: [C]
    int32 or None, mults/shifts: TFLM's per-channel (or per-tensor) multiplier and shift,
    transpose: the geometry's (the kernel then reads the weights' columns as rows)."""
    w = np.asarray(weights, np.int64)
    if w.ndim == 4 and w.shape[0] == 1:
        w = w[0]
    if w.ndim != 3 or w.shape[:2] != (3, 3):
        return None
    if transpose:
        w = w.transpose(1, 0, 2)
    c = w.shape[2]
    rows = w.reshape(9, c).T  # [C, 9]
    folded = pack.fold_bias(bias, rows, x_zp)
    if folded is None:
        return None
    bound = pack.acc_bounds(folded, rows)  # raw inputs, padding = x_zp, both in [-128, 127]
    mults = np.broadcast_to(np.asarray(mults, np.int64).reshape(-1), (c,))
    shifts = np.broadcast_to(np.asarray(shifts, np.int64).reshape(-1), (c,))
    rq = pack.requant_params(mults, shifts, int(y_zp), bound)
    if rq is None:
        return None
    pre = rq[:, 2].astype(np.int64)
    ws = w * (np.int64(1) << pre)[None, None, :]  # the left shift, folded into the weights
    if np.abs(ws).max(initial=0) > 2**15 - 1:
        return None
    bs = folded.astype(np.int64) << pre  # |bias| <= bound and bound << pre fits (requant_params)

    def pair(lo, hi):
        return (lo & 0xFFFF) | ((hi & 0xFFFF) << 16)

    out = np.zeros((c, REC), np.int64)
    for ky in range(3):
        out[:, 2 * ky] = pair(ws[ky, 0], ws[ky, 1])
        out[:, 2 * ky + 1] = pair(ws[ky, 1], ws[ky, 2])
    out[:, 6] = bs
    out[:, 7] = rq[:, 0]
    out[:, 8] = rq[:, 1]
    out[:, 9] = rq[:, 3]
    return ((out + 2**31) % 2**32 - 2**31).astype(np.int32)  # the pairs as int32 words
