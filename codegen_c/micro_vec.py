"""Python mirrors of the host kernels in runtime_c/mcuforge_vec.h, for the loop-IR evaluator:
each takes the C arguments (pointer arguments as numpy views starting at the pointer), decodes
the natural layouts the header describes and writes its outputs in place; where the C code
would overflow int32 they raise UndefinedBehaviour (micro.requantize). Registered into
qmath.INTRINSICS on import."""
from __future__ import annotations

import numpy as np

from .micro import GEOM_FIELDS, _fits, im2col, requantize
from .qmath import INTRINSICS

DW_FIELDS = ("h", "w", "c", "k_h", "k_w", "stride_h", "stride_w", "dil_h", "dil_w", "pad_t",
             "pad_l", "out_h", "out_w", "tw")


def _kpad(k: int) -> int:
    return (k + 7) // 8 * 8


def _rq(rq, o: int) -> np.ndarray:
    """[O, 4] (mult, add, pre, post) rows from the [4][O] arrays."""
    return np.asarray(rq[:4 * o], np.int64).reshape(4, o).T


def _weights(w, o: int, k: int) -> np.ndarray:
    kp = _kpad(k)
    return np.asarray(w[:o * kp], np.int64).reshape(o, kp)[:, :k]


def _check_dots(acc_nobias, where: str):
    _fits(acc_nobias, f"the dot products of {where}")


def _gemm(x, rows, x_stride, k, w, bias, rq, o, lo, hi, signfix, y, y_stride, scratch):
    xs = np.stack([np.asarray(x[r * x_stride:r * x_stride + k], np.int64) for r in range(rows)])
    dots = xs @ _weights(w, o, k).T
    _check_dots(dots, "mf_vec_gemm")
    out = requantize(dots + np.asarray(bias[:o], np.int64), _rq(rq, o), signfix, lo, hi)
    for r in range(rows):
        y[r * y_stride:r * y_stride + o] = out[r]


def _gemm_t(x, rows, x_stride, k, w, bias, rq, o, lo, hi, signfix, y, y_stride, scratch):
    """Weights [ceil(O/16)][K][16] (lanes = output channels), bias padded to 16 per block."""
    nb = -(-o // 16)
    wm = np.asarray(w[:nb * k * 16], np.int64).reshape(nb, k, 16).transpose(0, 2, 1)
    wm = wm.reshape(nb * 16, k)[:o]
    xs = np.stack([np.asarray(x[r * x_stride:r * x_stride + k], np.int64) for r in range(rows)])
    acc = _fits(xs @ wm.T + np.asarray(bias[:o], np.int64), "mf_vec_gemm_t")
    out = requantize(acc, _rq(rq, o), signfix, lo, hi)
    for r in range(rows):
        y[r * y_stride:r * y_stride + o] = out[r]


def _conv(x, geom, x_zp, w, bias, rq, o, lo, hi, signfix, y, scratch):
    g = dict(zip(GEOM_FIELDS, (int(v) for v in geom[:len(GEOM_FIELDS)])))
    k = g["k_h"] * g["k_w"] * g["in_c"]
    dots = im2col(x, g, x_zp) @ _weights(w, o, k).T
    _check_dots(dots, "mf_vec_conv")
    out = requantize(dots + np.asarray(bias[:o], np.int64), _rq(rq, o), signfix, lo, hi)
    y[:out.size] = out.reshape(-1)


def _dw(x, geom, x_zp, w, bias, rq, lo, hi, signfix, y, scratch):
    """Taps inside the image only: acc = bias + sum (x - x_zp) * w; the constants are tiled
    tw times (lane j: channel j % C), which must agree."""
    g = dict(zip(DW_FIELDS, (int(v) for v in geom[:len(DW_FIELDS)])))
    h, wd, c, kh, kw = g["h"], g["w"], g["c"], g["k_h"], g["k_w"]
    oh, ow, n = g["out_h"], g["out_w"], g["tw"] * g["c"]
    tiled = np.asarray(w[:kh * kw * n], np.int64).reshape(kh * kw, g["tw"], c)
    brow = np.asarray(bias[:n], np.int64).reshape(g["tw"], c)
    rq4 = np.asarray(rq[:4 * n], np.int64).reshape(4, g["tw"], c)
    for t in (tiled, brow[None], rq4):
        assert (t == t[:, :1]).all(), "mf_vec_dw: tiled constants differ between pixels"
    taps = tiled[:, 0].reshape(kh, kw, c)
    bias, rq = brow[0], rq4[:, 0].reshape(-1)
    img = np.asarray(x[:h * wd * c], np.int64).reshape(h, wd, c) - x_zp
    acc = np.broadcast_to(np.asarray(bias[:c], np.int64), (oh, ow, c)).copy()
    oy, ox = np.arange(oh), np.arange(ow)
    for ky in range(kh):
        iy = oy * g["stride_h"] - g["pad_t"] + ky * g["dil_h"]
        for kx in range(kw):
            ix = ox * g["stride_w"] - g["pad_l"] + kx * g["dil_w"]
            vy, vx = (iy >= 0) & (iy < h), (ix >= 0) & (ix < wd)
            vals = np.zeros((oh, ow, c), np.int64)
            vals[np.ix_(vy, vx)] = img[np.ix_(iy[vy], ix[vx])]
            acc += vals * taps[ky, kx]
            _fits(acc, "the depthwise accumulator")
    out = requantize(acc.reshape(-1, c), _rq(rq, c), signfix, lo, hi)
    y[:out.size] = out.reshape(-1)


INTRINSICS.update({"mf_vec_gemm": _gemm, "mf_vec_gemm_t": _gemm_t, "mf_vec_conv": _conv, "mf_vec_dw": _dw})
