"""Python mirrors of the Helium kernels in runtime_c/mcuforge_mve_dw.h for the loop-IR evaluator
(see micro.py): the C arguments in, outputs written in place; they decode the packed layouts of
pack_mve_dw.py / pack_mve_ew.py and compute the kernels' integers (mf_rq_apply's requantization)
on whole arrays, raising UndefinedBehaviour where the C would overflow int32 or reach past its
scratch. Registered into qmath.INTRINSICS on import."""
from __future__ import annotations

import numpy as np

from . import pack_mve_dw
from .loop_ir import UndefinedBehaviour
from .qmath import INTRINSICS

I32 = (-2**31, 2**31 - 1)


def _fits(a, what):
    if a.size and (a.min() < I32[0] or a.max() > I32[1]):
        raise UndefinedBehaviour(f"int32 overflow in {what}")
    return a


def rq(acc, mult, add, post, pre, sf, lo, hi):
    """mf_rq_apply (the sign term on channels with post > 0 when sf) and the clamp, int64."""
    _fits(acc, "the accumulator")
    h = (_fits(acc << pre, "acc << pre") * mult + (1 << 31)) >> 32
    v = _fits(h + add, "h + add")
    v = v + np.where((h < 0) & (post > 0) & (sf != 0), -1, 0)
    return np.clip(v >> post, lo, hi)


def _dw(x, y, pk, geom, x_zp, lo, hi, signfix, scratch):
    """mf_mve_dw_conv_s8: per channel G groups of 16 int8 weights (the view's taps in order),
    then bias, mult, add, post, pre; the view is the image's columns when `transpose`."""
    g = dict(zip(pack_mve_dw.GEOM_FIELDS, (int(v) for v in geom[:len(pack_mve_dw.GEOM_FIELDS)])))
    if scratch.nbytes < pack_mve_dw.scratch_bytes(g):
        raise UndefinedBehaviour("mf_mve_dw_conv_s8: scratch smaller than its planes "
                                 "and the bytes its gathers read past them")
    h, w, c, t = g["h"], g["w"], g["c"], g["transpose"]
    kh, kw = (g["kw"], g["kh"]) if t else (g["kh"], g["kw"])  # the view's kernel
    taps, pair = kh * kw, g["pair"]
    ng = 1 if pair else pack_mve_dw.groups(taps)  # weight vectors of 16 lanes
    rec = np.asarray(pk[:c * pack_mve_dw.rec(taps, pair)], np.int64).reshape(c, -1)
    at = pack_mve_dw.weights_at(pair)
    if pair and (rec[:, 5] != 0).any():
        raise UndefinedBehaviour("mf_mve_dw_conv_s8: the word before the weights must be 0")
    b = rec[:, at:at + 4 * ng].astype(np.uint32).view(np.uint8).reshape(c, 16 * ng)
    b = b.view(np.int8)
    if pair:  # kh rows of kw + sw lanes, the first kw of each the taps
        n = kw + pack_mve_dw.view_kernel(g)[2]
        k = np.stack([b[:, ky * n:ky * n + kw] for ky in range(kh)]).astype(np.int64)
        k = k.transpose(0, 2, 1)  # [kh, kw, c]
    else:
        k = b[:, :taps].astype(np.int64).T.reshape(kh, kw, c)
    if t:
        k = k.transpose(1, 0, 2)
    img = np.asarray(x[:h * w * c], np.int64).reshape(h, w, c)
    oh, ow, sh, sw = g["oh"], g["ow"], g["sh"], g["sw"]
    kh, kw = g["kh"], g["kw"]
    pad = np.full((g["pad_t"] + h + kh + sh * oh, g["pad_l"] + w + kw + sw * ow, c), x_zp,
                  np.int64)
    pad[g["pad_t"]:g["pad_t"] + h, g["pad_l"]:g["pad_l"] + w] = img
    q = rec[:, :5]  # bias mult add post pre
    acc = np.broadcast_to(q[:, 0], (oh, ow, c)).copy()
    for ky in range(kh):
        for kx in range(kw):
            acc += pad[ky:ky + sh * oh:sh, kx:kx + sw * ow:sw] * k[ky, kx]
    y[:acc.size] = rq(acc, q[:, 1], q[:, 2], q[:, 3], q[:, 4], signfix, lo, hi).reshape(-1)


INTRINSICS["mf_mve_dw_conv_s8"] = _dw


def _add(*args):
    """mf_mve_dw_add_s8: the arithmetic of mf_ew_add_s8 (micro_ew), four elements a vector."""
    from . import micro_ew
    micro_ew.INTRINSICS["mf_ew_add_s8"](*args)


INTRINSICS["mf_mve_dw_add_s8"] = _add


def _pool(name):
    def run(*args):
        """mf_mve_dw_avgpool_s8 / maxpool: mf_ew_avgpool_s8's / maxpool's integers."""
        from . import micro_ew
        micro_ew.INTRINSICS[name](*args)
    return run


INTRINSICS["mf_mve_dw_avgpool_s8"] = _pool("mf_ew_avgpool_s8")
INTRINSICS["mf_mve_dw_maxpool_s8"] = _pool("mf_ew_maxpool_s8")
