"""Compile-time constants of the element-wise micro-kernels (runtime_c/mcuforge_ew.h) and the
proof that they reproduce TFLM.

int8 ADD and MUL have only 2^16 input pairs, so the proofs are exhaustive (mul_constants does
the same for MUL): add_constants evaluates TFLM's
integer pipeline (reference_integer_ops::AddFunc with the parameters of qparams.add_params) and
the kernel's fast form (the table, SMMULR, the folded rounding constant, SSAT) on every pair in
int64, checks that each int32 intermediate of the fast form stays in range, and returns None
(the schedule declines) unless all 65536 outputs are equal."""
from __future__ import annotations

import numpy as np

INT32_MIN, INT32_MAX = -2**31, 2**31 - 1
BYTES = np.arange(256, dtype=np.int64)
VALUES = np.where(BYTES < 128, BYTES, BYTES - 256)  # the int8 value of each byte u

POOL_GEOM = ("h", "w", "c", "fh", "fw", "sh", "sw", "pt", "pl", "oh", "ow")  # mf_pool_geom


def srdhm(a, b):
    """gemmlowp SaturatingRoundingDoublingHighMul on int64 arrays (no saturating pair occurs:
    callers keep |a| < 2^31 - 1 or b > 0)."""
    ab = np.asarray(a, np.int64) * np.int64(b)
    num = ab + np.where(ab >= 0, 1 << 30, 1 - (1 << 30))
    return np.where(num >= 0, num // 2**31, -((-num) // 2**31))  # C division truncates


def rdbpot(x, e: int):
    """gemmlowp RoundingDivideByPOT: x / 2^e rounded half away from zero."""
    x = np.asarray(x, np.int64)
    mask = (1 << e) - 1
    return (x >> e) + ((x & mask) > (mask >> 1) + (x < 0))


def wrap32(v):
    return ((np.asarray(v, np.int64) + 2**31) & 0xFFFFFFFF) - 2**31


def add_rescaled(offset: int, mult: int, shift: int):
    """F(x) = MBQM_lt1((x + offset) << 20, mult, shift) for every byte u (index u)."""
    return rdbpot(srdhm(wrap32((VALUES + offset) << 20), mult), -shift)


def add_reference(p: dict):
    """TFLM's int8 ADD on all pairs: [256, 256] int64 outputs indexed by the bytes of
    (input 1, input 2). p: qparams.add_params."""
    f1 = add_rescaled(p["input1_offset"], p["input1_multiplier"], p["input1_shift"])
    f2 = add_rescaled(p["input2_offset"], p["input2_multiplier"], p["input2_shift"])
    s = wrap32(f1[:, None] + f2[None, :])
    out = wrap32(rdbpot(srdhm(s, p["output_multiplier"]), -p["output_shift"])
                 + p["output_offset"])
    return np.clip(out, p["act_min"], p["act_max"])


def _fits(v) -> bool:
    return bool(v.min() >= INT32_MIN and v.max() <= INT32_MAX)


def add_fast(big_bytes, small_bytes, c: dict):
    """The kernel's arithmetic (mf_ew_add1 + clamp) on int64 arrays of bytes, or None where
    an int32 intermediate would overflow."""
    xb = VALUES[np.asarray(big_bytes)]
    s2 = c["tab"].astype(np.int64)[np.asarray(small_bytes)] + xb * (1 << 20)
    if not _fits(s2):
        return None
    h = (s2 * c["mult"] + (1 << 31)) >> 32
    v = h + c["add"]
    if not _fits(v):
        return None
    v = v - ((h < 0) & (c["signfix"] != 0))
    if not _fits(v):
        return None
    v = np.clip(v >> c["post"], -128, 127)
    return np.clip(v, c["lo"], c["hi"])


def add_constants(p: dict) -> dict | None:
    """mf_ew_add_s8's constants for qparams.add_params `p`, or None when no exact fast form
    exists: big (0 or 1: which input goes unscaled, the one whose rescale is exactly
    (x - zp) << 19), tab [256] int32, mult, add, post, signfix, lo, hi."""
    if p["left_shift"] != 20 or p["output_shift"] > 0 or p["output_multiplier"] <= 0:
        return None
    f = [add_rescaled(p[f"input{k}_offset"], p[f"input{k}_multiplier"], p[f"input{k}_shift"])
         for k in (1, 2)]
    want = add_reference(p)
    for big in (0, 1):
        zp_big = -p[f"input{big + 1}_offset"]
        if not np.array_equal(f[big], (VALUES - zp_big) << 19):
            continue
        tab = 2 * f[1 - big] - (zp_big << 20)
        if not _fits(tab):
            continue
        post = -p["output_shift"]
        zp, lo, hi = p["output_offset"], p["act_min"], p["act_max"]
        c = dict(big=big, tab=tab.astype(np.int32), mult=p["output_multiplier"],
                 add=((1 << (post - 1)) + (zp << post)) if post else zp, post=post,
                 signfix=int(post > 0 and lo < zp), lo=lo, hi=hi)
        if not INT32_MIN <= c["add"] <= INT32_MAX:
            continue
        # every pair: rows indexed by the big input's byte, columns by the small one's
        got = add_fast(BYTES[:, None], BYTES[None, :], c)
        ref = want if big == 0 else want.T
        if got is not None and np.array_equal(got, ref):
            return c
    return None


# ---- int8 MUL ---------------------------------------------------------------------------------

def mul_reference(p: dict):
    """TFLM's int8 MUL (reference_integer_ops::MulElementwise) on all pairs: [256, 256] by the
    bytes of (input 1, input 2). p: qparams.mul_params."""
    prod = wrap32((VALUES[:, None] + p["input1_offset"]) * (VALUES[None, :] + p["input2_offset"]))
    shift = p["output_shift"]
    x = wrap32(prod << max(shift, 0))
    out = wrap32(rdbpot(srdhm(x, p["output_multiplier"]), max(-shift, 0)) + p["output_offset"])
    return np.clip(out, p["act_min"], p["act_max"])


def mul_fast(a_bytes, b_bytes, c: dict):
    """mf_ew_mul1 + clamp on int64 arrays of bytes, or None where int32 would overflow."""
    prod = (VALUES[np.asarray(a_bytes)] + c["off1"]) * (VALUES[np.asarray(b_bytes)] + c["off2"])
    x = prod << c["pre"]
    if not _fits(prod) or not _fits(x):
        return None
    h = (x * c["mult"] + (1 << 31)) >> 32
    v = h + c["add"]
    if not _fits(v):
        return None
    v = v - ((h < 0) & (c["signfix"] != 0))
    v = np.clip(v >> c["post"], -128, 127)
    return np.clip(v, c["lo"], c["hi"])


def mul_constants(p: dict) -> dict | None:
    """mf_ew_mul_s8's constants for qparams.mul_params `p` (off1, off2, mult, add, pre, post,
    signfix, lo, hi), or None unless they reproduce TFLM on all 65536 input pairs."""
    m, shift = p["output_multiplier"], p["output_shift"]
    if m < 0 or not -31 <= shift <= 30:
        return None
    pre, post = max(shift, 0) + 1, max(-shift, 0)
    zp, lo, hi = p["output_offset"], p["act_min"], p["act_max"]
    add = ((1 << (post - 1)) + (zp << post)) if post else zp
    if not INT32_MIN <= add <= INT32_MAX:
        return None
    c = dict(off1=p["input1_offset"], off2=p["input2_offset"], mult=m, add=add, pre=pre,
             post=post, signfix=int(post > 0 and lo < zp), lo=lo, hi=hi)
    got = mul_fast(BYTES[:, None], BYTES[None, :], c)
    return c if got is not None and np.array_equal(got, mul_reference(p)) else None
