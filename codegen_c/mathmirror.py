"""Python mirrors of runtime_c/mcuforge_math.h, registered into qmath.INTRINSICS on import so
the loop-IR evaluator can run float kernels.

Scalar in, scalar out. The <math.h> wrappers are mirrored by the double-precision function
rounded to float32: the correctly rounded result in all but rare cases, which is what a good
libm (glibc's) returns too, so a mirror and C may differ at most in the last bit. The functions
with semantics of their own (rounding, modulo, max/min, integer power) are exact.
"""
from __future__ import annotations

import math

import numpy as np

from . import qmath

f32 = np.float32


def _quiet(fn):
    """fn in double precision on float32 arguments, rounded to float32; no warnings (inf and
    NaN are values here, as in C)."""
    def wrapped(*args):
        with np.errstate(all="ignore"):
            return f32(fn(*(np.float64(f32(a)) for a in args)))
    wrapped.__name__ = getattr(fn, "__name__", "fn")
    return wrapped


mfm_expf = _quiet(np.exp)
mfm_expm1f = _quiet(np.expm1)
mfm_logf = _quiet(np.log)
mfm_log1pf = _quiet(np.log1p)
mfm_sqrtf = _quiet(np.sqrt)
mfm_sinf = _quiet(np.sin)
mfm_cosf = _quiet(np.cos)
mfm_tanhf = _quiet(np.tanh)
mfm_erff = _quiet(math.erf)
mfm_powf = _quiet(np.power)
mfm_floorf = _quiet(np.floor)
mfm_ceilf = _quiet(np.ceil)
mfm_fabsf = _quiet(np.abs)
mfm_fmodf = _quiet(np.fmod)
mfm_floor_modf = _quiet(np.mod)  # numpy.mod is the floored modulo, signed zero included
mfm_roundf = _quiet(np.round)  # half to even


def mfm_maxf(a, b):
    a, b = f32(a), f32(b)
    return a if (a > b or a != a) else b


def mfm_minf(a, b):
    a, b = f32(a), f32(b)
    return a if (a < b or a != a) else b


def _floor_mod(a: int, b: int) -> int:
    if b == 0:
        raise ArithmeticError("modulo by zero")  # C: undefined behaviour
    return a % b  # Python's % is the floored modulo


mfm_mod_i32 = _floor_mod
mfm_mod_i64 = _floor_mod


def mfm_ipow_i64(base: int, e: int) -> int:
    if e < 0:
        return 1 if base == 1 else ((1 if e % 2 == 0 else -1) if base == -1 else 0)
    r = pow(int(base), int(e), 2**64)
    return r - 2**64 if r >= 2**63 else r


INTRINSICS = {name: fn for name, fn in list(globals().items())
              if name.startswith("mfm_") and callable(fn)}
qmath.INTRINSICS.update(INTRINSICS)
