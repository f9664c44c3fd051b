"""Rounding int8 weights with calibration data: error-compensating rounding (GPTQ / OBQ) and
bias correction.

A weight row w (one output channel) meets input patches p; rounding it to q = w + dw changes
the layer's output by dw . p. Over the calibration patches (mean mu, covariance C, see
calibrate.InputMoments) that error has mean dw . mu and variance dw C dw'.

  - bias correction (Nagel et al. 2019, "Data-Free Quantization Through Weight Equalization
    and Bias Correction", Sec. 4.2, with the empirical input mean): the bias absorbs -dw . mu,
    so the output's expected value is the float layer's;
  - error-compensating rounding (Frantar et al. 2022, "GPTQ", after Optimal Brain
    Quantization): weights are rounded one column at a time (largest input variance first),
    and each rounding error is spread over the columns not rounded yet, as the inverse of C
    says, so that dw C dw' -- the output's mean square error left after bias correction -- is
    small, not each |dw|. The grid stays the same (symmetric per channel, scale max|w| / 127,
    values in [-127, 127]), so the result is an ordinary TFLite int8 weight tensor.
"""
from __future__ import annotations

import numpy as np

DAMP = 0.01  # ridge added to C's diagonal, as a fraction of its mean diagonal (GPTQ's default)


def gptq_round(rows: np.ndarray, scale: np.ndarray, cov: np.ndarray, qmax: int = 127,
               damp: float = DAMP) -> np.ndarray:
    """Integer weights [groups, R, K] (values in [-qmax, qmax]) for float weight rows
    [groups, R, K] with per-row scales [groups, R], minimising sum over rows of dw C_g dw' for
    the input covariance cov [groups, K, K] of each group. A group whose covariance is
    degenerate (no variance at all, or not positive definite after damping) is rounded to
    nearest. All groups are rounded together, column by column."""
    rows = np.array(rows, dtype=np.float64)
    s = np.asarray(scale, np.float64)[..., None]  # [G, R, 1]
    u, order = _inverse_factors(np.asarray(cov, np.float64), damp)
    w = np.take_along_axis(rows, order[:, None, :], axis=2)
    q = np.empty_like(w)
    for j in range(w.shape[2]):
        q[:, :, j] = np.clip(np.round(w[:, :, j] / s[..., 0]), -qmax, qmax)
        err = (w[:, :, j] - q[:, :, j] * s[..., 0]) / u[:, j, j][:, None]  # [G, R]
        w[:, :, j + 1:] -= err[:, :, None] * u[:, None, j, j + 1:]
    out = np.empty_like(q)
    np.put_along_axis(out, np.broadcast_to(order[:, None, :], q.shape), q, axis=2)
    # a row keeps rounding to nearest where that is no worse on the same objective (the
    # damping makes the search approximate: this keeps it from ever losing)
    nearest = np.clip(np.round(rows / s), -qmax, qmax)
    worse = _quadratic(out * s - rows, cov) > _quadratic(nearest * s - rows, cov)
    return np.where(worse[..., None], nearest, out)


def _quadratic(dw: np.ndarray, cov: np.ndarray) -> np.ndarray:
    """[groups, R]: dw C dw' of each row."""
    return np.einsum("grk,gkl,grl->gr", dw, cov, dw)


def _inverse_factors(cov: np.ndarray, damp: float) -> tuple:
    """(U [G, K, K], order [G, K]): per group, the column order of decreasing variance and the
    upper Cholesky factor of the damped covariance's inverse in that order (C^-1 = U'U). A
    group that cannot be used gets U = identity, which makes the rounding plain rounding."""
    g, k, _ = cov.shape
    u = np.broadcast_to(np.eye(k), (g, k, k)).copy()
    order = np.broadcast_to(np.arange(k), (g, k)).copy()
    for i in range(g):
        c = cov[i].copy()
        d = np.diag(c).copy()
        if not np.all(np.isfinite(c)) or d.max(initial=0.0) <= 0.0:
            continue
        dead = d <= 0.0  # inputs that never vary: their columns only need rounding
        c[dead, :] = 0.0
        c[:, dead] = 0.0
        c[np.diag_indices_from(c)] = np.where(dead, 1.0, d) + damp * d[~dead].mean()
        o = np.argsort(-np.where(dead, -1.0, d), kind="stable")
        try:
            f = np.linalg.cholesky(np.linalg.inv(c[np.ix_(o, o)])).T
        except np.linalg.LinAlgError:
            continue
        if np.all(np.isfinite(f)):
            u[i], order[i] = f, o
    return u, order


def output_error(dw_rows: np.ndarray, mean: np.ndarray, cov) -> tuple:
    """(mean error [groups, R], mean square error left after removing the mean [groups, R] or
    None without a covariance) of the output for weight errors dw_rows [groups, R, K]."""
    bias = np.einsum("grk,gk->gr", dw_rows, mean)
    return bias, None if cov is None else _quadratic(dw_rows, cov)
