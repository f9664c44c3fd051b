"""Compile-time data of the Helium (MVE) GEMM micro-kernels (runtime_c/mcuforge_mve.h:
mf_mve_gemm, mf_mve_conv): one int32 stream per layer, per block of 4 output channels the
folded bias, the int8 weights in 16-tap chunks and the requantization vectors. The numbers
come from pack.py (fold_bias, requant_params: the exactness proofs); this module only lays
them out as the header's comment describes."""
from __future__ import annotations

import numpy as np

SIGN, SHL = 1, 2  # MF_MVE_SIGN, MF_MVE_SHL: the kernels' flags


def chunks(k: int) -> int:
    """MF_MVE_CHUNKS: K in chunks of 16 taps."""
    return (int(k) + 15) // 16


def block_words(k: int) -> int:
    """MF_MVE_BLOCK_WORDS: int32 words of one block of 4 channels."""
    return 24 + 16 * chunks(k)


def words(o: int, k: int) -> int:
    return (int(o) + 3) // 4 * block_words(k)


def pack_mve(w_rows, bias, rq, signfix: int):
    """(stream int32[words(O, K)], flags) for weights [O, K] (int8 values), the folded bias
    [O] and mf_rq rows [O, 4] (mult, add, pre, post; pre >= 1) of pack.requant_params;
    signfix: 1 when the layer needs the sign term (pack.needs_signfix)."""
    w = np.asarray(w_rows, np.int64).reshape(len(w_rows), -1)
    o, k = w.shape
    rq = np.asarray(rq, np.int64).reshape(o, 4)
    if (rq[:, 2] < 1).any():
        raise ValueError("pack_mve: every mf_rq.pre must be >= 1 (requant_params)")
    ob, c = (o + 3) // 4, chunks(k)
    wp = np.zeros((ob * 4, 16 * c), np.int64)
    wp[:o, :k] = w
    # [block, channel, chunk, 16] -> [block, chunk, channel, 16] as bytes -> int32 words
    wb = wp.reshape(ob, 4, c, 16).transpose(0, 2, 1, 3).reshape(ob, 16 * c * 4)
    wwords = wb.astype(np.int8).view(np.uint8).reshape(ob, -1, 4).astype(np.int64)
    wwords = (wwords * (1 << np.arange(0, 32, 8))).sum(-1)
    wwords = np.where(wwords >= 2**31, wwords - 2**32, wwords)
    pad = np.zeros((ob * 4, 4), np.int64)
    pad[:, 2] = 1  # zero channels: mult 0, add 0, pre 1, post 0
    pad[:o] = rq
    b = np.zeros(ob * 4, np.int64)
    b[:o] = np.asarray(bias, np.int64).reshape(-1)
    sfm = np.where((pad[:, 3] > 0) & bool(signfix), -1, 0)
    tail = np.stack([pad[:, 0], pad[:, 1], pad[:, 2] - 1, -pad[:, 3], sfm], 1)  # [4 * ob, 5]
    tail = tail.reshape(ob, 4, 5).transpose(0, 2, 1).reshape(ob, 20)
    stream = np.concatenate([b.reshape(ob, 4), wwords, tail], axis=1).reshape(-1)
    flags = (SIGN if sfm.any() else 0) | (SHL if (pad[:, 2] > 1).any() else 0)
    return stream.astype(np.int32), flags


def unpack_mve(stream, o: int, k: int):
    """(weights [O, K], bias [O], rq [O, 4], sfm [O]) from pack_mve's stream (the loop-IR
    evaluator's mirror reads the packed data through this)."""
    ob, c = (o + 3) // 4, chunks(k)
    rec = np.asarray(stream[:words(o, k)], np.int64).reshape(ob, block_words(k))
    bias = rec[:, :4].reshape(-1)[:o]
    wbytes = (rec[:, 4:4 + 16 * c].astype(np.int64)[..., None] >> np.arange(0, 32, 8)) & 0xFF
    wbytes = ((wbytes ^ 0x80) - 0x80).reshape(ob, c, 4, 16).transpose(0, 2, 1, 3)
    w = wbytes.reshape(ob * 4, 16 * c)[:o]
    t = rec[:, 4 + 16 * c:].reshape(ob, 5, 4).transpose(0, 2, 1).reshape(ob * 4, 5)[:o]
    rq = np.stack([t[:, 0], t[:, 1], t[:, 2] + 1, -t[:, 3]], 1)
    return w[:, :k], w[:, k:], bias, rq, t[:, 4]
