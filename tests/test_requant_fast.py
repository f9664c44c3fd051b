"""The micro-kernels' requantization (runtime_c/mcuforge_nn.h, constants from codegen_c/pack.py)
against TFLM's MultiplyByQuantizedMultiplier as codegen_c/qmath.py mirrors it (itself checked
against tflite-micro in test_runtime_arith.py): equal on every accumulator the bound admits,
rounding ties included, and refused where the fast form could overflow."""
from __future__ import annotations

import numpy as np
import pytest

from mcuforge.codegen_c import pack
from mcuforge.codegen_c import qmath as m
from mcuforge.codegen_c import qparams as qp


def fast(acc: int, row, signfix: int) -> int:
    """mf_rq_apply in Python integers: SMMLAR then add, sign term, arithmetic shift."""
    mult, add, pre, post = (int(v) for v in row)
    h = ((acc << pre) * mult + 2**31) >> 32
    v = h + add + (-1 if signfix and post and h < 0 else 0)
    return v >> post


@pytest.mark.parametrize("seed", range(6))
def test_fast_requant_equals_tflm(seed):
    rng = np.random.default_rng(seed)
    for _ in range(300):
        real = float(np.exp(rng.uniform(np.log(1e-6), np.log(4.0))))
        mult, shift = qp.quantize_multiplier(real)
        zp = int(rng.integers(-128, 128))
        bound = int(rng.integers(1, 2**21))
        rows = pack.requant_params([mult], [shift], zp, [bound])
        assert rows is not None
        accs = rng.integers(-bound, bound + 1, 40).tolist()
        # ties: accumulators whose product lands exactly half way between two outputs
        if shift < 0:
            step = 2**(-shift)
            accs += [a for a in (step // 2, -step // 2, 3 * step // 2) if abs(a) <= bound]
        lo = int(rng.integers(-128, 0))
        for acc in accs:
            want = m.mf_clamp(m.mf_mbqm(acc, mult, shift) + zp, lo, 127)
            assert m.mf_clamp(fast(acc, rows[0], 1), lo, 127) == want, (acc, mult, shift, zp)
            if lo >= zp:  # the sign term may go where the clamp hides it
                assert m.mf_clamp(fast(acc, rows[0], 0), lo, 127) == want


def test_exhaustive_small_accumulators():
    mult, shift = qp.quantize_multiplier(0.0123)
    rows = pack.requant_params([mult], [shift], -5, [5000])
    for acc in range(-5000, 5001):
        assert fast(acc, rows[0], 1) == m.mf_mbqm(acc, mult, shift) - 5


def test_overflowing_ranges_are_refused():
    mult, shift = qp.quantize_multiplier(0.5)
    assert pack.requant_params([mult], [shift], 0, [2**30]) is None  # acc << 1 overflows
    mult, shift = qp.quantize_multiplier(3.0)  # shift 2: acc << 3
    assert pack.requant_params([mult], [shift], 0, [2**28 - 1]) is not None
    assert pack.requant_params([mult], [shift], 0, [2**28]) is None


def test_fold_bias_and_bounds():
    rng = np.random.default_rng(1)
    w = rng.integers(-127, 128, (5, 9))
    b = rng.integers(-1000, 1000, 5)
    x = rng.integers(-128, 128, (50, 9))
    folded = pack.fold_bias(b, w, -7)
    want = b + ((x + 7) @ w.T)  # TFLM: bias + sum (x - zp) * w
    assert (folded + x @ w.T == want).all()
    bound = pack.acc_bounds(b, w)
    assert (np.abs(b + x @ w.T) <= bound).all()
    assert pack.fold_bias(b, np.full((5, 9), 127), -2**27) is None
