"""Python mirror of runtime_c/mcuforge_seq.h for the loop-IR evaluator (see micro.py).
Registered into qmath.INTRINSICS on import."""
from __future__ import annotations

import numpy as np

from .loop_ir import UndefinedBehaviour
from .qmath import INTRINSICS


def _dot_s8(w, v, n, off):
    """mf_seq_dot_s8: sum w[k] * (v[k] + off); raises where a partial sum (in any order the
    C code may take: the bound is the sum of the products' magnitudes) leaves int32."""
    if len(w) < n or len(v) < n:
        raise UndefinedBehaviour("mf_seq_dot_s8 reads past its buffers")
    prods = np.asarray(w[:n], np.int64) * (np.asarray(v[:n], np.int64) + off)
    if np.abs(prods).sum() >= 2**31:
        raise UndefinedBehaviour("int32 overflow in mf_seq_dot_s8")
    return int(prods.sum())


INTRINSICS["mf_seq_dot_s8"] = _dot_s8
