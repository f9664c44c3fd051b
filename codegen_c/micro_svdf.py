"""Python mirror of mf_seq_svdf_s8 (runtime_c/mcuforge_seq.h) for the loop-IR evaluator, and
the layout of its mf_svdf_geom. Registered into qmath.INTRINSICS on import."""
from __future__ import annotations

import numpy as np

from .loop_ir import UndefinedBehaviour
from .micro import requantize, unpack_gemm
from .qmath import INTRINSICS

GEOM_FIELDS = ("n_in", "n_filter", "n_memory", "rank", "fmt", "zp_in", "zp_state", "lo", "hi",
               "rq_state.mult", "rq_state.add", "rq_state.pre", "rq_state.post",
               "rq_out.mult", "rq_out.add", "rq_out.pre", "rq_out.post", "sf_state", "sf_out")
FMT = {16: "w16", 8: "w8"}  # MF_W16, MF_W8


def _kpad(n: int) -> int:
    return (n + 3) // 4 * 4


def work_words(n_in: int, n_filter: int) -> int:
    """int32 words of mf_seq_svdf_s8's work: the feature products (then the time sums), the
    newest entries (bytes), the widened input (int16)."""
    return _kpad(n_filter) + _kpad(n_filter) // 4 + _kpad(n_in) // 2


def _svdf(x, old, state, y, wf, wt, bias, geom, work):
    g = dict(zip(GEOM_FIELDS, (int(v) for v in geom[:len(GEOM_FIELDS)])))
    n, f, m, r = g["n_in"], g["n_filter"], g["n_memory"], g["rank"]
    u = f // r
    if work.nbytes < 4 * work_words(n, f):
        raise UndefinedBehaviour("mf_seq_svdf_s8: work area too small")
    if len(old) < f * m or len(state) < f * m or len(y) < u or len(x) < n:
        raise UndefinedBehaviour("mf_seq_svdf_s8 reaches past its buffers")
    w = unpack_gemm(wf, FMT[g["fmt"]], f, n)
    xs = np.asarray(x[:n], np.int64) - g["zp_in"]
    if (np.abs(w) * np.abs(xs)).sum(axis=1).max(initial=0) >= 2**31:
        raise UndefinedBehaviour("int32 overflow in mf_seq_svdf_s8's feature products")
    dot = w @ xs
    rq1 = np.tile(np.array([g["rq_state.mult"], g["rq_state.add"], g["rq_state.pre"],
                            g["rq_state.post"]], np.int64), (f, 1))
    newest = requantize(dot, rq1, g["sf_state"], -128, 127) + g["zp_state"]
    newest = ((newest + 128) % 256 - 128).astype(np.int64)  # the int8 store wraps (as TFLM's)
    rows = np.asarray(old[:f * m], np.int64).reshape(f, m).copy()  # (state may be old)
    new = np.concatenate([rows[:, 1:], newest[:, None]], axis=1)
    state[:f * m] = new.reshape(-1)
    prods = new * np.asarray(wt[:f * m], np.int64).reshape(f, m)
    b = np.asarray(bias[:u], np.int64)
    if (np.abs(b) + np.abs(prods).reshape(u, -1).sum(axis=1)).max(initial=0) >= 2**31:
        raise UndefinedBehaviour("int32 overflow in mf_seq_svdf_s8's time sums")
    acc = b + prods.reshape(u, -1).sum(axis=1)
    rq2 = np.tile(np.array([g["rq_out.mult"], g["rq_out.add"], g["rq_out.pre"],
                            g["rq_out.post"]], np.int64), (u, 1))
    y[:u] = requantize(acc, rq2, g["sf_out"], g["lo"], g["hi"])


INTRINSICS["mf_seq_svdf_s8"] = _svdf


def _quantize_s16_s8(x, y, n, x_zp, q, sfx):
    """mf_seq_quantize_s16_s8: the fast requantization of int16 inputs to int8."""
    if len(x) < n or len(y) < n:
        raise UndefinedBehaviour("mf_seq_quantize_s16_s8 reaches past its buffers")
    acc = np.asarray(x[:n], np.int64) - int(x_zp)
    y[:n] = requantize(acc, np.tile(np.asarray(q[:4], np.int64), (n, 1)), int(sfx), -128, 127)


INTRINSICS["mf_seq_quantize_s16_s8"] = _quantize_s16_s8
