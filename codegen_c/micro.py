"""Python mirrors of the micro-kernels in runtime_c/mcuforge_nn.h, for the loop-IR evaluator:
each takes the C arguments (pointer arguments as numpy views starting at the pointer) and
writes its outputs in place. They decode the packed layouts from the header's description and
compute the TFLM arithmetic on whole arrays; where the C code would overflow int32 they raise
UndefinedBehaviour, as the evaluator does. Registered into qmath.INTRINSICS on import."""
from __future__ import annotations

import numpy as np

from . import pack_dw
from .loop_ir import UndefinedBehaviour
from .qmath import INTRINSICS

I32 = (-2**31, 2**31 - 1)
_LANES = {"w16": (0, 2, 1, 3), "w8": (0, 1, 2, 3)}  # tap j of a group sits at lane _LANES[j]


def _fits(a: np.ndarray, what: str) -> np.ndarray:
    if a.size and (a.min() < I32[0] or a.max() > I32[1]):
        raise UndefinedBehaviour(f"int32 overflow in {what}")
    return a


def unpack_gemm(w: np.ndarray, fmt: str, o: int, k: int) -> np.ndarray:
    """[O, K] int64 weights from the packed layout: blocks of 4 channels, per block groups of 4
    taps, per group the 4 channels' taps in lane order."""
    op, kp = (o + 3) // 4 * 4, (k + 3) // 4 * 4
    blocks = np.asarray(w[:op * kp], np.int64).reshape(op // 4, kp // 4, 4, 4)
    taps = blocks[..., list(_LANES[fmt])]  # lane order -> tap order (the lane maps are involutions)
    return taps.transpose(0, 2, 1, 3).reshape(op, kp)[:o, :k]


def requantize(acc: np.ndarray, rq: np.ndarray, signfix: int, lo: int, hi: int) -> np.ndarray:
    """mf_rq_apply + clamp on int64 accumulators [..., O]; rq: [O, 4] (mult, add, pre, post)."""
    mult, add, pre, post = (rq[:, i].astype(np.int64) for i in range(4))
    _fits(acc, "the accumulator")
    shifted = _fits(acc << pre, "acc << pre")
    h = (shifted * mult + (1 << 31)) >> 32
    v = _fits(h + add, "h + add")
    signfix = int(signfix) & 3  # less the MF_PRE0 flag (pre = 0 is in the table itself)
    if signfix == 2 and (lo, hi) == (-128, 127):  # the sign term from the accumulator
        v = v + np.where(acc < 0, -1, 0)
    else:
        v = v + np.where((h < 0) & (post > 0) & (signfix != 0), -1, 0)
    return np.clip(v >> post, lo, hi)


def _scratch(scratch: np.ndarray, need: int, what: str) -> None:
    """The kernel's documented scratch must fit in what the schedule declared."""
    if scratch.nbytes < need:
        raise UndefinedBehaviour(f"{what}: {scratch.nbytes} bytes of scratch, needs {need}")


def _gemm(fmt):
    def kernel(x, rows, x_stride, k, w, bias, rq, o, lo, hi, signfix, y, y_stride, scratch):
        _scratch(scratch, 2 * ((k + 3) // 4 * 4), "mf_gemm")  # the widened row
        wm = unpack_gemm(w, fmt, o, k)
        xs = np.stack([np.asarray(x[r * x_stride:r * x_stride + k], np.int64)
                       for r in range(rows)])
        acc = xs @ wm.T + np.asarray(bias[:o], np.int64)
        out = requantize(acc, np.asarray(rq[:4 * o]).reshape(o, 4), signfix, lo, hi)
        for r in range(rows):
            y[r * y_stride:r * y_stride + o] = out[r]
    return kernel


def unpack_gemm2(w: np.ndarray, o: int, k: int):
    """(weights [O, K], bias [O], rq [O, 4] with pre 0) from mf_gemm2_w16's record stream."""
    g = (k + 3) // 4
    rec = np.asarray(w[:o // 2 * (10 + 4 * g)], np.int64).reshape(o // 2, 10 + 4 * g)
    if (rec[:, 0:2] != rec[:, 2:4]).any():
        raise UndefinedBehaviour("mf_gemm2_w16: the two copies of a pair's bias differ")
    words = rec[:, 4:4 + 4 * g].reshape(o // 2, g, 2, 2).transpose(0, 2, 1, 3)  # [p, ch, g, 2]
    lo = ((words & 0xFFFF) ^ 0x8000) - 0x8000
    lanes = np.stack([lo[..., 0], words[..., 0] >> 16, lo[..., 1], words[..., 1] >> 16], -1)
    taps = lanes[..., list(_LANES["w16"])].reshape(o, 4 * g)[:, :k]
    tail = rec[:, 4 + 4 * g:].reshape(o, 3)
    rq = np.stack([tail[:, 0], tail[:, 1], np.zeros(o, np.int64), tail[:, 2]], 1)
    return taps, rec[:, 0:2].reshape(o), rq


def _gemm2(x, rows, x_stride, k, w, o, signfix, y, y_stride, scratch):
    if o % 2:
        raise UndefinedBehaviour("mf_gemm2_w16: O must be even")
    _scratch(scratch, 4 * ((k + 3) // 4 * 4), "mf_gemm2")  # two widened rows
    wm, bias, rq = unpack_gemm2(w, o, k)
    xs = np.stack([np.asarray(x[r * x_stride:r * x_stride + k], np.int64) for r in range(rows)])
    out = requantize(xs @ wm.T + bias, rq, signfix, -128, 127)
    for r in range(rows):
        y[r * y_stride:r * y_stride + o] = out[r]


INTRINSICS["mf_gemm2_w16"] = _gemm2
# the entries of one sign-term mode ignore the signfix argument
INTRINSICS["mf_gemm2_w16_s0"] = lambda *a: _gemm2(*a[:6], 0, *a[7:])
INTRINSICS["mf_gemm2_w16_s2"] = lambda *a: _gemm2(*a[:6], 2, *a[7:])


def unpack_gemm1k8(w: np.ndarray, o: int):
    """(weights [O, 8], bias [O], rq [O, 4] with pre 0) from mf_gemm1k8_w16's records."""
    rec = np.asarray(w[:8 * o], np.int64).reshape(o, 8)
    words = rec[:, 1:5]
    lo = ((words & 0xFFFF) ^ 0x8000) - 0x8000
    lanes = np.stack([lo, words >> 16], -1).reshape(o, 2, 4)  # per group: lanes 0..3
    taps = lanes[..., list(_LANES["w16"])].reshape(o, 8)
    rq = np.stack([rec[:, 5], rec[:, 6], np.zeros(o, np.int64), rec[:, 7]], 1)
    return taps, rec[:, 0], rq


def _gemm1k8(x, rows, x_stride, k, w, o, signfix, y, y_stride, scratch):
    if k != 8:
        raise UndefinedBehaviour("mf_gemm1k8_w16: K must be 8")
    wm, bias, rq = unpack_gemm1k8(w, o)
    xs = np.stack([np.asarray(x[r * x_stride:r * x_stride + k], np.int64) for r in range(rows)])
    out = requantize(xs @ wm.T + bias, rq, signfix, -128, 127)
    for r in range(rows):
        y[r * y_stride:r * y_stride + o] = out[r]


INTRINSICS["mf_gemm1k8_w16"] = _gemm1k8
INTRINSICS["mf_gemm1k8_w16_s0"] = lambda *a: _gemm1k8(*a[:6], 0, *a[7:])
INTRINSICS["mf_gemm1k8_w16_s2"] = lambda *a: _gemm1k8(*a[:6], 2, *a[7:])


GEOM_FIELDS = ("in_h", "in_w", "in_c", "k_h", "k_w", "stride_h", "stride_w", "pad_t", "pad_l",
               "out_h", "out_w")  # mf_conv_geom, in struct order


def im2col(x: np.ndarray, geom: dict, x_zp: int) -> np.ndarray:
    """[out_h * out_w, k_h * k_w * in_c] patches of NHWC x (batch 1), padding = x_zp."""
    g = geom
    img = np.asarray(x[:g["in_h"] * g["in_w"] * g["in_c"]], np.int64).reshape(
        g["in_h"], g["in_w"], g["in_c"])
    pad = np.full((g["in_h"] + 2 * g["k_h"] + g["stride_h"] * g["out_h"],
                   g["in_w"] + 2 * g["k_w"] + g["stride_w"] * g["out_w"], g["in_c"]), x_zp,
                  np.int64)
    top, left = g["k_h"], g["k_w"]  # room for any padding
    pad[top:top + g["in_h"], left:left + g["in_w"]] = img
    rows = []
    for oy in range(g["out_h"]):
        for ox in range(g["out_w"]):
            iy = oy * g["stride_h"] - g["pad_t"] + top
            ix = ox * g["stride_w"] - g["pad_l"] + left
            rows.append(pad[iy:iy + g["k_h"], ix:ix + g["k_w"]].reshape(-1))
    return np.stack(rows)


def _conv(fmt, cache: bool = True):
    """mf_conv_*, or without the row cache mf_conv_lean_* (the same patches)."""
    def kernel(x, geom, x_zp, w, bias, rq, o, lo, hi, signfix, y, scratch):
        g = dict(zip(GEOM_FIELDS, (int(v) for v in geom[:len(GEOM_FIELDS)])))
        k = g["k_h"] * g["k_w"] * g["in_c"]
        row_cache = g["k_h"] * ((g["out_w"] - 1) * g["stride_w"] + g["k_w"]) * g["in_c"]
        _scratch(scratch, 3 * ((k + 3) // 4 * 4) + (row_cache if cache else 0),
                 "mf_conv" if cache else "mf_conv_lean")  # patches (and the row cache)
        patches = im2col(x, g, x_zp)
        acc = patches @ unpack_gemm(w, fmt, o, k).T + np.asarray(bias[:o], np.int64)
        out = requantize(acc, np.asarray(rq[:4 * o]).reshape(o, 4), signfix, lo, hi)
        y[:out.size] = out.reshape(-1)
    return kernel


def _convp(fmt):
    """mf_convp_*: the weights packed in conv_pair_order's tap order (K' taps)."""
    from .pack import conv_pair_order, convp_scratch_bytes

    def kernel(x, geom, x_zp, w, bias, rq, o, lo, hi, signfix, y, scratch):
        g = dict(zip(GEOM_FIELDS, (int(v) for v in geom[:len(GEOM_FIELDS)])))
        _scratch(scratch, convp_scratch_bytes(g["k_h"], g["k_w"], g["in_c"], g["stride_w"],
                                              g["out_w"]), "mf_convp")
        idx = conv_pair_order(g["k_h"], g["k_w"], g["in_c"])
        patches = im2col(x, g, x_zp)
        ordered = np.where(idx >= 0, patches[:, np.maximum(idx, 0)], 0)
        acc = ordered @ unpack_gemm(w, fmt, o, len(idx)).T + np.asarray(bias[:o], np.int64)
        out = requantize(acc, np.asarray(rq[:4 * o]).reshape(o, 4), signfix, lo, hi)
        y[:out.size] = out.reshape(-1)
    return kernel


INTRINSICS.update({"mf_convp_w16": _convp("w16"), "mf_convp_w8": _convp("w8")})


def unpack_convrp(pk: np.ndarray, o: int, nw: int):
    """(bias [O], weights [O, NW, 2] (low, high lane), rq [O, 4] with pre 0, control words
    [O / 4, 2]) from the table of mf_convrp_*: per block of 4 channels bias[4], the NW words in
    chunks of 3 (per chunk per channel its words), (mult, add, post) x 2, the window
    adjustment, the last-block flag, (mult, add, post) x 2."""
    t = np.asarray(pk, np.int64)
    bias, rq = np.zeros(o, np.int64), np.zeros((o, 4), np.int64)
    w = np.zeros((o, nw), np.int64)
    ctl = np.zeros((o // 4, 2), np.int64)
    i = 0
    for b in range(o // 4):
        bias[4 * b:4 * b + 4] = t[i:i + 4]
        i += 4
        for c0 in range(0, nw, 3):
            cs = min(3, nw - c0)
            w[4 * b:4 * b + 4, c0:c0 + cs] = t[i:i + 4 * cs].reshape(4, cs)
            i += 4 * cs
        r = t[i:i + 14]
        trip = np.stack([r[0:3], r[3:6], r[8:11], r[11:14]])
        rq[4 * b:4 * b + 4] = np.stack([trip[:, 0], trip[:, 1], 0 * trip[:, 0], trip[:, 2]], 1)
        ctl[b] = r[6], r[7]
        i += 14
    lo = ((w & 0xFFFF) ^ 0x8000) - 0x8000
    hi = (((w >> 16) & 0xFFFF) ^ 0x8000) - 0x8000
    return bias, np.stack([lo, hi], -1), rq, ctl


def _convrp(x, geom, x_zp, pk, o, signfix, y, scratch):
    """mf_convrp_w16_n<NW> / mf_convrp2_w16_n<NW>: TFLM's convolution on the row-paired table
    (int8-range clamp)."""
    from .pack import convrp_order, convrp_scratch_bytes, convrp_step_bytes
    g = dict(zip(GEOM_FIELDS, (int(v) for v in geom[:len(GEOM_FIELDS)])))
    kh, kw, c = g["k_h"], g["k_w"], g["in_c"]
    _scratch(scratch, convrp_scratch_bytes(kh, kw, c, g["stride_w"], g["out_w"], g["in_w"]),
             "mf_convrp")
    if o % 4 or int(signfix) & 3 == 1:
        raise UndefinedBehaviour("mf_convrp: O % 4 or signfix 1")
    idx = convrp_order(kh, kw, c).reshape(-1)
    nw = len(idx) // 2
    bias, wl, rq, ctl = unpack_convrp(pk, o, nw)
    want = [(-4 * nw + (convrp_step_bytes(kh, c, g["stride_w"]) if b == o // 4 - 1 else 0),
             int(b == o // 4 - 1)) for b in range(o // 4)]
    if ctl.tolist() != [list(v) for v in want]:  # the asm would walk off the window / table
        raise UndefinedBehaviour("mf_convrp: the table's control words do not fit the geometry")
    wk = np.zeros((o, kh * kw * c), np.int64)
    lanes = wl.reshape(o, -1)
    assert not lanes[:, idx < 0].any(), "a weight on a tap outside the kernel"
    wk[:, idx[idx >= 0]] = lanes[:, idx >= 0]
    acc = im2col(x, g, x_zp) @ wk.T + bias
    y[:acc.size] = requantize(acc, rq, signfix, -128, 127).reshape(-1)


for _n in range(1, 33):
    for _e in ("", "_x8"):  # _x8: O a multiple of 8 (the asm's blocks in pairs)
        INTRINSICS[f"mf_convrp_w16_n{_n}{_e}"] = INTRINSICS[f"mf_convrp2_w16_n{_n}{_e}"] = _convrp
INTRINSICS.update({"mf_gemm_w16": _gemm("w16"), "mf_gemm_w8": _gemm("w8"),
                   "mf_conv_w16": _conv("w16"), "mf_conv_w8": _conv("w8"),
                   "mf_conv_lean_w16": _conv("w16", False), "mf_conv_lean_w8": _conv("w8", False)})
# the entries specialised on K compute the same (w16 weights; any K, falling back in C)
for _g in range(1, 17):
    INTRINSICS[f"mf_gemm_w16_g{_g}"] = INTRINSICS["mf_gemm_w16"]
    INTRINSICS[f"mf_conv_w16_g{_g}"] = INTRINSICS["mf_conv_w16"]
    INTRINSICS[f"mf_convp_w16_g{_g}"] = INTRINSICS["mf_convp_w16"]


DW_GEOM = ("h", "w", "c", "oh", "ow", "stride", "pad_t", "pad_l", "transpose", "pw", "rows",
           "cg")


def _dw3x3(x, y, pk, geom, x_zp, lo, hi, signfix, scratch):
    """mf_dw3x3_s8: per channel 10 int32 (weight pairs [w0,w1], [w1,w2] of kernel rows 0-2,
    scaled by 2^pre; bias << pre; mult, add, post); the kernel's rows are the image's columns
    when `transpose`."""
    g = dict(zip(DW_GEOM, (int(v) for v in geom[:len(DW_GEOM)])))
    h, w, c, s = g["h"], g["w"], g["c"], g["stride"]
    _scratch(scratch, g["cg"] * g["rows"] * g["pw"] * 2, "mf_dw3x3_s8")  # a band of cg channels
    rec = np.asarray(pk[:10 * c], np.int64).reshape(c, 10)

    def half(v, upper):
        v = (v >> 16) if upper else v
        return ((v & 0xFFFF) ^ 0x8000) - 0x8000
    k = np.zeros((3, 3, c), np.int64)
    for r in range(3):
        k[r, 0], k[r, 1] = half(rec[:, 2 * r], False), half(rec[:, 2 * r], True)
        k[r, 2] = half(rec[:, 2 * r + 1], True)
        assert (half(rec[:, 2 * r + 1], False) == k[r, 1]).all(), "inconsistent weight pairs"
    if g["transpose"]:
        k = k.transpose(1, 0, 2)
    img = np.asarray(x[:h * w * c], np.int64).reshape(h, w, c)
    pad = np.full((h + 4 + s * g["oh"], w + 4 + s * g["ow"], c), x_zp, np.int64)
    pad[2:2 + h, 2:2 + w] = img
    acc = np.broadcast_to(rec[:, 6], (g["oh"], g["ow"], c)).copy()
    for ky in range(3):
        for kx in range(3):
            y0, x0 = 2 - g["pad_t"] + ky, 2 - g["pad_l"] + kx
            acc += pad[y0:y0 + s * g["oh"]:s, x0:x0 + s * g["ow"]:s] * k[ky, kx]
    _fits(acc, "the depthwise accumulator")
    hh = (acc * rec[:, 7] + (1 << 31)) >> 32
    v = _fits(hh + rec[:, 8], "h + add")
    v = v + np.where((hh < 0) & (rec[:, 9] > 0) & (signfix != 0), -1, 0)
    y[:acc.size] = np.clip(v >> rec[:, 9], lo, hi).reshape(-1)


INTRINSICS["mf_dw3x3_s8"] = _dw3x3


def _dw_entry(name):
    """mf_dw3x3_s8_<s>[f][c]_<k>: as mf_dw3x3_s8, on the layers its name promises (the C entry
    links only that variant's code: a mismatch would compute without the clamp or the sign term,
    or with another row shape)."""
    def run(x, y, pk, geom, x_zp, lo, hi, signfix, scratch):
        g = dict(zip(DW_GEOM, (int(v) for v in geom[:len(DW_GEOM)])))
        want = pack_dw.entry(g, int(signfix), int(lo), int(hi))
        assert name == want, f"{name} called for a layer of {want}"
        _dw3x3(x, y, pk, geom, x_zp, lo, hi, signfix, scratch)
    return run


for _s in (1, 2):
    for _v in ("", "c", "f", "fc"):
        for _k in range(1, 8):
            _n = f"mf_dw3x3_s8_{_s}{_v}_{_k}"
            INTRINSICS[_n] = _dw_entry(_n)
