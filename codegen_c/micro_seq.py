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


def _ceil4(v: int) -> int:
    return (v + 3) // 4 * 4


def pack_rows4(w: np.ndarray) -> np.ndarray:
    """[rows, n] int8 weights in mf_seq_mv_s8's layout: blocks of 4 rows, per block groups of
    4 taps, per group the 4 rows' taps; zero weights pad rows and taps to multiples of 4."""
    rows, n = w.shape
    p = np.zeros((_ceil4(rows), _ceil4(n)), np.int8)
    p[:rows, :n] = w
    return p.reshape(-1, 4, p.shape[1] // 4, 4).transpose(0, 2, 1, 3).reshape(-1).copy()


W16_LANES = [0, 2, 1, 3]  # tap order of a row's group of 4 in pack_rows4_w16 (an involution)


def pack_rows4_w16(w: np.ndarray) -> np.ndarray:
    """pack_rows4's layout as int16, each row's group of 4 taps as [w0 w2] [w1 w3]."""
    p = pack_rows4(w).astype(np.int16).reshape(-1, 4)
    return p[:, W16_LANES].reshape(-1).copy()


def unpack_rows4(w4: np.ndarray, rows: int, n: int, w16: bool = False) -> np.ndarray:
    r4, n4 = _ceil4(rows), _ceil4(n)
    if len(w4) < r4 * n4:
        raise UndefinedBehaviour("mf_seq_mv reads past its weights")
    blocks = np.asarray(w4[:r4 * n4], np.int64).reshape(r4 // 4, n4 // 4, 4, 4)
    if w16:
        blocks = blocks[..., W16_LANES]
    return blocks.transpose(0, 2, 1, 3).reshape(r4, n4)[:rows, :n]


def _mv(w16: bool):
    def kernel(w4, v, n, off, rows, out, work):
        """mf_seq_mv_*: out[r] = the dot product of row r of the packed weights with v + off."""
        if work.nbytes < 2 * _ceil4(n):
            raise UndefinedBehaviour("mf_seq_mv: work area too small")
        if len(out) < rows:
            raise UndefinedBehaviour("mf_seq_mv writes past its output")
        w = unpack_rows4(w4, rows, n, w16)
        for r in range(rows):
            out[r] = _dot_s8(w[r], v, n, off)
    return kernel


def _rq(acc, mult, add, pre, post):
    """mf_seq_rq: (h + add + (post ? h >> 31 : 0)) >> post, h = SMMULR(acc << pre, mult);
    raises where C would overflow int32 (the lowering's bound proof failed)."""
    shifted = acc << pre
    if not -2**31 <= shifted < 2**31:
        raise UndefinedBehaviour("int32 overflow in mf_seq_rq's shift")
    h = (shifted * mult + 2**31) >> 32
    v = h + add + ((-1 if h < 0 else 0) if post else 0)
    if not -2**31 <= h + add < 2**31 or not -2**31 <= v < 2**31:
        raise UndefinedBehaviour("int32 overflow in mf_seq_rq's addend")
    return v >> post


INTRINSICS["mf_seq_rq"] = _rq
INTRINSICS["mf_seq_sat16"] = lambda v: min(max(v, -32768), 32767)
INTRINSICS["mf_seq_dot_s8"] = _dot_s8
INTRINSICS["mf_seq_mv_s8"] = _mv(False)
INTRINSICS["mf_seq_mv_w16"] = _mv(True)


def _mv_g(groups: int):
    mv = _mv(True)

    def kernel(w4, v, n, off, rows, out, work):
        """mf_seq_mv_w16_g<G>: mf_seq_mv_w16 for n in (4 (G - 1), 4 G]."""
        if (n + 3) // 4 != groups:
            raise UndefinedBehaviour(f"mf_seq_mv_w16_g{groups} called with n = {n}")
        mv(w4, v, n, off, rows, out, work)
    return kernel


for _g in range(1, 9):
    INTRINSICS[f"mf_seq_mv_w16_g{_g}"] = _mv_g(_g)
