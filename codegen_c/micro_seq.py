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


def _mv_s8(w, v, n, off, rows, out, work):
    """mf_seq_mv_s8: out[r] = the dot product of row r of w [rows, n] with v + off."""
    if work.nbytes < 2 * ((n + 3) // 4 * 4):
        raise UndefinedBehaviour("mf_seq_mv_s8: work area too small")
    if len(out) < rows:
        raise UndefinedBehaviour("mf_seq_mv_s8 writes past its output")
    for r in range(rows):
        out[r] = _dot_s8(w[r * n:], v, n, off)


INTRINSICS["mf_seq_dot_s8"] = _dot_s8
INTRINSICS["mf_seq_mv_s8"] = _mv_s8
