"""Python mirrors of the scalar micro-kernels in runtime_c/mcuforge_scalar.h for the loop-IR
evaluator: they decode the packed weights from the header's description, check the lane proof
the C relies on ("l64": each chunk's low lane inside its window, else UndefinedBehaviour) and
compute TFLM's arithmetic on whole arrays. Registered into qmath.INTRINSICS on import."""
from __future__ import annotations

import numpy as np

from .loop_ir import UndefinedBehaviour
from .micro import GEOM_FIELDS, _fits, im2col, requantize
from .qmath import INTRINSICS

S = 23  # MF_SC_S


def unpack_l64(pw, o: int, k: int, chunk: int) -> np.ndarray:
    """[O, K] weights from "l64" lane words; raises where a chunk could overflow the low lane."""
    ob = (o + 3) // 4
    words = np.asarray(pw[:ob * 2 * k], np.int64).reshape(ob, k, 2)
    low = ((words & (2**S - 1)) ^ 2**(S - 1)) - 2**(S - 1)
    high = (words - low) >> S
    w = np.stack([low[..., 0], high[..., 0], low[..., 1], high[..., 1]], 1)  # [B, 4, K]
    w = w.reshape(ob * 4, k)
    for k0 in range(0, k, max(int(chunk), 1)):
        if (np.abs(w[:, k0:k0 + chunk]).sum(axis=1) * 128 >= 2**(S - 1)).any():
            raise UndefinedBehaviour("mf_sc_gemm_l64: a chunk's low lane may overflow")
    return w[:o]


def unpack_m8(pw, o: int, k: int) -> np.ndarray:
    ob = (o + 3) // 4
    return np.asarray(pw[:ob * 4 * k], np.int64).reshape(ob, k, 4).transpose(0, 2, 1).reshape(
        ob * 4, k)[:o]


def _weights(fmt, pw, o, k, chunk):
    return unpack_l64(pw, o, k, chunk) if fmt == "l64" else unpack_m8(pw, o, k)


def _records(rq, o):
    """(bias [O], mf_rq rows [O, 4]) from mf_sc_rec records (bias, mult, add, pre, post)."""
    rec = np.asarray(rq[:5 * o], np.int64).reshape(o, 5)
    return rec[:, 0], rec[:, 1:]


def _gemm(fmt):
    def kernel(x, rows, x_stride, k, chunk, pw, rq, o, lo, hi, signfix, y, y_stride):
        wm = _weights(fmt, pw, o, k, chunk)
        bias, rq = _records(rq, o)
        xs = np.stack([np.asarray(x[r * x_stride:r * x_stride + k], np.int64)
                       for r in range(rows)])
        _fits(np.abs(xs) @ np.abs(wm).T, "the accumulator")
        acc = xs @ wm.T + bias
        out = requantize(acc, rq, 1 if signfix else 0, lo, hi)
        for r in range(rows):
            y[r * y_stride:r * y_stride + o] = out[r]
    return kernel


def _conv(fmt):
    def kernel(x, geom, x_zp, p, chunk, pw, rq, o, lo, hi, signfix, y, scratch):
        g = dict(zip(GEOM_FIELDS, (int(v) for v in geom[:len(GEOM_FIELDS)])))
        k = g["k_h"] * g["k_w"] * g["in_c"]
        if scratch.nbytes < p * k:
            raise UndefinedBehaviour(f"mf_sc_conv: {scratch.nbytes} bytes of scratch, "
                                     f"needs {p * k}")
        patches = im2col(x, g, x_zp)
        wm = _weights(fmt, pw, o, k, chunk)
        bias, rq = _records(rq, o)
        out = requantize(patches @ wm.T + bias, rq, 1 if signfix else 0, lo, hi)
        y[:out.size] = out.reshape(-1)
    return kernel


INTRINSICS.update({f"mf_sc_gemm_{f}": _gemm(f) for f in ("l64", "m8")})
INTRINSICS.update({f"mf_sc_conv_{f}": _conv(f) for f in ("l64", "m8")})


def _dw3(x, y, pk, g, x_zp, lo, hi, signfix, scratch):
    """mf_sc_dw3: per channel a padded plane of the (possibly transposed) image, 9 weights in
    plane order, then mf_sc_rec."""
    vh, vw, c, voh, vow, sy, sx, pt, pl, iys, ixs, oys, oxs, ph, pw = (int(v) for v in g[:15])
    if scratch.nbytes < ph * pw:
        raise UndefinedBehaviour(f"mf_sc_dw3: {scratch.nbytes} bytes of scratch, needs {ph * pw}")
    rec = np.asarray(pk[:14 * c], np.int64).reshape(c, 14)
    xv = np.asarray(x, np.int64)
    iy, ix = np.arange(vh)[:, None], np.arange(vw)[None, :]
    img = np.stack([xv[iy * iys + ix * ixs + ch] for ch in range(c)], -1)  # [VH, VW, C]
    pad = np.full((ph + 3, pw + 3, c), x_zp, np.int64)
    pad[pt:pt + vh, pl:pl + vw] = img[:max(0, min(vh, ph + 3 - pt)), :max(0, min(vw, pw + 3 - pl))]
    acc = np.zeros((voh, vow, c), np.int64)
    for ky in range(3):
        for kx in range(3):
            acc += pad[ky:ky + sy * voh:sy, kx:kx + sx * vow:sx] * rec[:, 3 * ky + kx]
    _fits(acc, "the depthwise accumulator")
    out = requantize(acc + rec[:, 9], rec[:, 10:], 1 if signfix else 0, lo, hi)
    oy, ox = np.arange(voh)[:, None], np.arange(vow)[None, :]
    for ch in range(c):
        y[oy * oys + ox * oxs + ch] = out[:, :, ch]


INTRINSICS["mf_sc_dw3"] = _dw3
