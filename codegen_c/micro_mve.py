"""Python mirrors of the Helium GEMM micro-kernels of runtime_c/mcuforge_mve.h (mf_mve_gemm,
mf_mve_conv) for the loop-IR evaluator: they read pack_mve's stream and compute what the C
computes, step by step of mf_mve_rq4 (VSHL, VQRDMULH, VADD, sign term, VSHL, clamp), raising
UndefinedBehaviour where the C would overflow int32. Registered into qmath.INTRINSICS."""
from __future__ import annotations

import numpy as np

from .loop_ir import UndefinedBehaviour
from .micro import GEOM_FIELDS, _fits, _scratch, im2col
from .pack_mve import SHL, SIGN, unpack_mve
from .qmath import INTRINSICS


def rq4(acc, rq, sfm, flags: int, lo: int, hi: int) -> np.ndarray:
    """mf_mve_rq4 on int64 accumulators [..., O]; rq [O, 4] (mult, add, pre, post)."""
    mult, add, pre, post = (rq[:, i].astype(np.int64) for i in range(4))
    a = _fits(np.asarray(acc, np.int64), "the accumulator")
    if flags & SHL:
        a = _fits(a << (pre - 1), "acc << (pre - 1)")
    elif (pre != 1).any():
        raise UndefinedBehaviour("mf_mve: a channel with pre > 1 but no MF_MVE_SHL flag")
    if ((a == -2**31) & (mult == -2**31)).any():
        raise UndefinedBehaviour("VQRDMULH saturates")
    h = (2 * a * mult + (1 << 31)) >> 32  # VQRDMULH
    v = _fits(h + add, "h + add")
    if flags & SIGN:
        v = v + np.where(h < 0, sfm, 0)
    return np.clip(v >> post, lo, hi)


def _outputs(patches, pk, o, k, lo, hi, flags):
    w, pad, bias, rq, sfm = unpack_mve(pk, o, k)
    if pad.any():
        raise UndefinedBehaviour("mf_mve: nonzero weights on the padding taps past K")
    acc = patches @ w.T + bias
    return rq4(acc, rq, sfm, int(flags), int(lo), int(hi))


def _gemm(x, rows, x_stride, k, pk, o, lo, hi, flags, y, y_stride):
    xs = np.stack([np.asarray(x[r * x_stride:r * x_stride + k], np.int64) for r in range(rows)])
    out = _outputs(xs, pk, o, k, lo, hi, flags)
    for r in range(rows):
        y[r * y_stride:r * y_stride + o] = out[r]


def _conv(x, geom, x_zp, pk, o, lo, hi, flags, y, scratch):
    g = dict(zip(GEOM_FIELDS, (int(v) for v in geom[:len(GEOM_FIELDS)])))
    k = g["k_h"] * g["k_w"] * g["in_c"]
    _scratch(scratch, 2 * k, "mf_mve_conv")  # two patches
    out = _outputs(im2col(x, g, int(x_zp)), pk, o, k, lo, hi, flags)
    y[:out.size] = out.reshape(-1)


# mf_mve_gemm_k32 computes mf_mve_gemm's outputs (its fallback for other flags/clamps)
INTRINSICS.update({"mf_mve_gemm": _gemm, "mf_mve_gemm_k32": _gemm, "mf_mve_conv": _conv})


def _entry(fn, flags: int):
    """mf_mve_<kind>_f<F>: the code of flags F, whatever the flags argument says."""
    def run(*a):
        a = list(a)
        a[8 if fn is _gemm else 7] = flags
        fn(*a)
    return run


for _f in range(4):
    INTRINSICS[f"mf_mve_gemm_f{_f}"] = _entry(_gemm, _f)
    INTRINSICS[f"mf_mve_conv_f{_f}"] = _entry(_conv, _f)
