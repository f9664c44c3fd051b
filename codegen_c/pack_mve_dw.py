"""Compile-time data of the Helium depthwise kernel mf_mve_dw_conv_s8
(runtime_c/mcuforge_mve_dw.h): the geometry with the plane (scratch) shape and the packed
per-channel constants.

Both return None where the kernel does not apply (dilation, a depth multiplier other than 1,
more than 64 taps, a plane too wide for the 8-bit gather offsets of a tap group, a pixel stride
beyond the 16-bit offsets of the plane copy) or where the fast integers cannot be proven exact
(the folded bias or `acc << pre` leaving int32: pack.requant_params); the layer then keeps the
next schedule (the DSP kernel of pack_dw.py, or the reference loops).

    g = geometry(h, w, c, oh, ow, (kh, kw), (sh, sw), pad_t, pad_l)
    pk = pack_dw(weights [kh, kw, C], bias, x_zp, mults, shifts, y_zp, g["transpose"],
                 g["pair"], view_kernel(g)[2])
    # C: static const mf_mve_dw_geom G = {<g[f] for f in GEOM_FIELDS>};
    #    mf_mve_dw_conv_s8(x, y, PK, &G, x_zp, lo, hi, pack.needs_signfix(y_zp, lo), scratch)
    # with scratch_bytes(g) bytes of int8 scratch (any alignment).
"""
from __future__ import annotations

import numpy as np

from mcuforge.codegen_c import pack

GMAX = 4  # MF_MVDW_GMAX: groups of 16 taps
GEOM_FIELDS = ("h", "w", "c", "oh", "ow", "kh", "kw", "sh", "sw", "pad_t", "pad_l",
               "transpose", "ph", "pw", "pair", "cg", "flat")  # mf_mve_dw_geom, in order
FLATMAX = 256  # outputs a channel up to which a layer may walk them flat (a table of <= 1 KB)
CG = 8  # channels a pass where CG planes fit in PLANES8 bytes: copied 8 channels a load
PLANES8 = 4096


def groups(taps: int) -> int:
    return (taps + 15) // 16


def rec(taps: int, pair: int = 0) -> int:
    """int32 words per channel: MF_MVDW_REC(pair, G)."""
    return 10 if pair else 4 * groups(taps) + 5


def weights_at(pair: int) -> int:
    """The first word of a channel's weights: MF_MVDW_W(pair)."""
    return 6 if pair else 5


def view_kernel(geom: dict) -> tuple:
    """(kh, kw, sw) of the kernel's view."""
    t = geom["transpose"]
    return (geom["kw"], geom["kh"], geom["sh"]) if t else (geom["kh"], geom["kw"], geom["sw"])


def _view(h, w, oh, ow, kh, kw, sh, sw, pt, pl, c, t):
    """The kernel's view (rows of the image, or its columns when t) with the plane shape, or
    None where the gathers' offsets cannot reach."""
    if t:
        h, w, oh, ow, kh, kw, sh, sw, pt, pl = w, h, ow, oh, kw, kh, sw, sh, pl, pt
    ow4 = -(-ow // 4) * 4
    ph = max(pt + h, (oh - 1) * sh + kh)
    pw = max(pl + w, (ow4 - 1) * sw + kw)
    taps = kh * kw
    for k in range(groups(taps)):  # each group's byte offsets from its first row
        last = min(16 * k + 16, taps) - 1
        if (last // kw - (16 * k) // kw) * pw + kw - 1 > 255:
            return None
    xp = h * c if t else c  # pixel stride along a view row (original W = the view's h)
    if 7 * xp > 65535:
        return None
    # two neighbours' windows in one gather of 16 byte offsets
    pair = int(kh * (kw + sw) <= 16 and sw <= 4 and (kh - 1) * pw + kw + sw - 1 <= 255)
    copy = h * (3 + 2 * -(-w // 8))  # the plane
    if pair:  # instructions measured at -O2 (the asm loops): a row's full quads 19 each, its
        # last partial quad ~30 (predicated, C), ~14 a row; the flat walk's quads 20 (pairs of
        # neighbours, ow even) or 25 (single windows), ~20 a channel
        cost = oh * (ow // 4 * 19 + (30 if ow % 4 else 0) + 14) + copy
        fcost = -(-(oh * ow) // 4) * (20 if ow % 2 == 0 else 25) + 20 + copy
    else:
        quad = 6 * groups(taps) + 18  # instructions per 4 outputs, roughly
        cost = oh * (-(-ow // 4) * quad + 20) + copy
        fcost = -(-(oh * ow) // 4) * (quad + 10) + 30 + copy
    flat = 0
    if not t and oh * ow <= FLATMAX and fcost < cost:  # one walk over all outputs (NHWC)
        cost, flat = fcost, 1
    return dict(ph=ph, pw=pw, cost=cost, pair=pair, flat=flat)


def geometry(h: int, w: int, c: int, oh: int, ow: int, kernel=(3, 3), stride=(1, 1),
             pad_t: int = 0, pad_l: int = 0, dilation=(1, 1),
             depth_multiplier: int = 1) -> dict | None:
    """mf_mve_dw_geom's fields for an NHWC [h, w, c] -> [oh, ow, c] layer, or None."""
    kh, kw = (int(v) for v in kernel)
    sh, sw = (stride, stride) if np.isscalar(stride) else (int(v) for v in stride)
    if tuple(dilation) != (1, 1) or depth_multiplier != 1 or kh * kw > 16 * GMAX:
        return None
    if min(h, w, c, oh, ow, kh, kw, sh, sw) < 1 or pad_t < 0 or pad_l < 0:
        return None
    best = None
    for t in (0, 1):
        v = _view(h, w, oh, ow, kh, kw, sh, sw, pad_t, pad_l, c, t)
        if v is not None and (best is None or v["cost"] < best[1]["cost"]):
            best = (t, v)
    if best is None:
        return None
    t, v = best
    g = dict(h=h, w=w, c=c, oh=oh, ow=ow, kh=kh, kw=kw, sh=sh, sw=sw, pad_t=pad_t,
             pad_l=pad_l, transpose=t, ph=v["ph"], pw=v["pw"], pair=v["pair"],
             cg=CG if c > 1 and CG * v["ph"] * v["pw"] <= PLANES8 else 1, flat=v["flat"])
    if max(g.values()) > 2**15 - 1 or g["ph"] * g["pw"] > 2**31 - 1 \
            or oh * ow * c > 2**31 - 1 or h * w * c > 2**31 - 1:
        return None
    return g


def reach(geom: dict) -> int:
    """One past the last scratch byte a body of mf_mve_dw_conv_s8 reads in the planes: the
    last plane's last window row, up to the widest of its gathers. Tap groups and the MVE
    quads (four outputs, the ow rounded up to 4 of pw) stay inside the plane's rows; but in the
    pair layout a window's gather spans kw + sw columns (its neighbour's too, weighed by 0),
    and the portable body gathers it for every output: for the last one sw bytes past pw
    where pw is (ow - 1) * sw + kw (ow a multiple of 4), past the last plane. (The MVE flat
    walk gathers single windows only where ow is odd: inside pw.)"""
    _, kw, sw = view_kernel(geom)
    t = geom["transpose"]
    kh, sh = (geom["kw"], geom["sw"]) if t else (geom["kh"], geom["sh"])
    oh, ow = (geom["ow"], geom["oh"]) if t else (geom["oh"], geom["ow"])
    ph, pw = geom["ph"], geom["pw"]
    row = (geom["cg"] - 1) * ph * pw + ((oh - 1) * sh + kh - 1) * pw
    return max(geom["cg"] * ph * pw, row + (ow - 1) * sw + kw + (sw if geom["pair"] else 0))


def scratch_bytes(geom: dict) -> int:
    """Bytes of int8 scratch mf_mve_dw_conv_s8 needs: the planes (and what its gathers read
    past the last one: reach), then (flat) the 4-byte aligned int32 table."""
    planes = geom["cg"] * geom["ph"] * geom["pw"]
    if not geom.get("flat"):
        return reach(geom)
    # (the portable body's <= 4 bytes past the planes read the alignment or the table)
    return max(reach(geom), planes + 3 + 16 * (-(-(geom["oh"] * geom["ow"]) // 4)))


def pack_dw(weights, bias, x_zp: int, mults, shifts, y_zp: int, transpose: int = 0,
            pair: int = 0, sw: int = 1) -> np.ndarray | None:
    """[C, rec(kh * kw, pair)] int32 constants, or None when the integers are outside the
    kernel's exact range. weights: int [kh, kw, C] (TFLite's [1, kh, kw, C] accepted), bias [C]
    or None, mults/shifts TFLM's per-channel (or per-tensor) multiplier and shift; transpose,
    pair: the geometry's; sw: the stride along the kernel's view rows (pair layout)."""
    w = np.asarray(weights, np.int64)
    if w.ndim == 4 and w.shape[0] == 1:
        w = w[0]
    if w.ndim != 3 or w.min(initial=0) < -128 or w.max(initial=0) > 127:
        return None
    if transpose:
        w = w.transpose(1, 0, 2)
    kh, kw, c = w.shape
    taps = kh * kw
    if taps > 16 * GMAX:
        return None
    rows = w.reshape(taps, c).T  # [C, taps]
    folded = pack.fold_bias(bias, rows, x_zp)
    if folded is None:
        return None
    rq = pack.requant_params(np.broadcast_to(np.asarray(mults, np.int64).reshape(-1), (c,)),
                             np.broadcast_to(np.asarray(shifts, np.int64).reshape(-1), (c,)),
                             int(y_zp), pack.acc_bounds(folded, rows))
    if rq is None:
        return None
    g = 1 if pair else groups(taps)  # vectors of 16 int8
    wb = np.zeros((c, 16 * g), np.int64)
    if pair:  # kh rows of kw + sw lanes (the kernel loads the second output's sw bytes earlier)
        n = kw + sw
        if kh * n > 16 or sw > 4:
            return None
        for ky in range(kh):
            wb[:, ky * n:ky * n + kw] = w[ky].T
    else:
        wb[:, :taps] = rows
    words = (wb & 0xFF).reshape(c, 4 * g, 4) << np.array([0, 8, 16, 24], np.int64)
    at = weights_at(pair)
    out = np.zeros((c, at + 4 * g), np.int64)  # bias, mult, add, post, pre, [0], weights
    out[:, 0] = folded
    out[:, 1:5] = rq[:, [0, 1, 3, 2]]  # mult, add, post, pre
    out[:, at:] = words.sum(axis=2)
    return ((out + 2**31) % 2**32 - 2**31).astype(np.int32)
