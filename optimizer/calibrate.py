"""Calibration for post-training quantization: run the float graph on sample inputs, record
every activation tensor's values and choose a real range [lo, hi] per tensor.

The float graph is compiled once by mcuforge itself with every node output as an extra graph
output, and all samples run through the executable in batches, so the recorded values are
exactly what the float C code computes. Ranges always include 0 (TFLite's convention, so that
0.0 -- padding, relu's floor -- is exactly representable).
"""
from __future__ import annotations

import os
import tempfile
from pathlib import Path

import numpy as np

from mcuforge.errors import McuforgeError
from mcuforge.graph import Graph

METHODS = ("minmax", "percentile", "mse")
PERCENTILE = 99.99
SAMPLE_CAP = 1 << 20  # values kept per tensor for percentile / mse (exact min/max always kept)
CHUNK = 16  # samples per run of the executable (one progress bar step)


# ---------------------------------------------------------------------------------------------
# Running a graph (float or int8) as mcuforge's generated C on the host


def build_graph(g: Graph, workdir) -> tuple:
    """Compile `g` into a host C project in `workdir` and build it; returns (executable, the
    graph as compiled)."""
    from mcuforge.api import generate_project, write_files
    from mcuforge.runner import build
    files, _, _, compiled = generate_project(g, "model")
    write_files(Path(workdir), files)
    return build(Path(workdir), "model"), compiled


def run_graph(g: Graph, arrays: list, exe=None) -> list:
    """Run `g` on [N, ...] arrays (one per graph input) in generated C; one [N, ...] array per
    graph output. Without `exe` (from build_graph), builds in a temporary directory."""
    from mcuforge.runner import run_executable
    arrays = [np.ascontiguousarray(a) for a in arrays]
    if exe is not None:
        return run_executable(exe, g, arrays)
    with tempfile.TemporaryDirectory(prefix="mcuforge-run-") as d:
        exe, g = build_graph(g, d)
        return run_executable(exe, g, arrays)


# ---------------------------------------------------------------------------------------------
# Samples


def stack_samples(g: Graph, samples: list) -> list:
    """A list of {input name: array} -> one float32 [N, *shape] array per graph input."""
    if not samples:
        raise McuforgeError("calibration needs at least one sample")
    out = []
    for name in g.inputs:
        shape = tuple(g.tensors[name].shape)
        rows = []
        for i, s in enumerate(samples):
            if name not in s:
                raise McuforgeError(f"calibration sample {i} has no input '{name}' "
                                    f"(it has {sorted(s)})")
            a = np.asarray(s[name], dtype=np.float32)
            if a.size != int(np.prod(shape)):
                raise McuforgeError(f"calibration sample {i}: input '{name}' has shape "
                                    f"{a.shape}, the model expects {shape}")
            rows.append(a.reshape(shape))
        out.append(np.stack(rows))
    return out


def load_samples(data, g: Graph) -> list:
    """Calibration data -> a list of {input name: array}. `data` is a .npy path (a batch along
    axis 0), a .npz path (keyed by input name, batch along axis 0), a folder of .npy files (each
    one sample or a batch), an array, a {name: batch} dict or already a list of dicts."""
    if isinstance(data, list) and all(isinstance(s, dict) for s in data):
        return data
    if isinstance(data, (str, os.PathLike)):
        data = _read(Path(data), g)
    if isinstance(data, np.ndarray):
        if len(g.inputs) != 1:
            raise McuforgeError(f"the model has {len(g.inputs)} inputs: give calibration data "
                                f"as a .npz keyed by input name ({', '.join(g.inputs)})")
        data = {g.inputs[0]: data}
    if not isinstance(data, dict):
        raise McuforgeError("calibration data must be a .npy/.npz file, a folder of .npy "
                            "files, an array, a dict of arrays or a list of dicts")
    batches = {}
    for name in g.inputs:
        if name not in data:
            raise McuforgeError(f"calibration data has no input '{name}' "
                                f"(it has {sorted(data)})")
        batches[name] = _as_batch(np.asarray(data[name]), tuple(g.tensors[name].shape), name)
    n = {len(b) for b in batches.values()}
    if len(n) != 1:
        raise McuforgeError(f"calibration inputs have different sample counts: "
                            f"{ {k: len(v) for k, v in batches.items()} }")
    return [{k: v[i] for k, v in batches.items()} for i in range(n.pop())]


def _as_batch(a: np.ndarray, shape: tuple, name: str) -> np.ndarray:
    """[N, *shape], or [N, *shape[1:]] when the model's batch is 1, or one sample."""
    if a.shape == shape and shape[0] == 1 or shape and shape[0] == 1 and a.shape == shape[1:]:
        return a.reshape(shape)[None].astype(np.float32)
    if a.shape[1:] == shape:
        return a.astype(np.float32)
    if shape and shape[0] == 1 and a.shape[1:] == shape[1:]:
        return a[:, None].astype(np.float32)
    raise McuforgeError(f"calibration data for input '{name}' has shape {a.shape}: expected "
                        f"(N, {', '.join(map(str, shape))}) with the batch along axis 0")


def _read(path: Path, g: Graph):
    if path.is_dir():
        files = sorted(path.glob("*.npy"))
        if not files:
            raise McuforgeError(f"calibration folder {path} has no .npy files")
        if len(g.inputs) != 1:
            raise McuforgeError("a folder of .npy files calibrates single-input models only; "
                                "use a .npz keyed by input name")
        shape = tuple(g.tensors[g.inputs[0]].shape)
        return np.concatenate([_as_batch(_load(f), shape, g.inputs[0]) for f in files])
    return _load(path)


def _load(path: Path):
    try:
        data = np.load(path, allow_pickle=False)
    except (OSError, ValueError) as e:
        raise McuforgeError(f"cannot read calibration data from {path}: "
                            f"{getattr(e, 'strerror', None) or e}") from None
    if isinstance(data, np.lib.npyio.NpzFile):
        with data:
            return {k: data[k] for k in data.files}
    return data


# ---------------------------------------------------------------------------------------------
# Recording activations


def record(g: Graph, samples: list, progress=None, seed: int = 0) -> dict:
    """{tensor name: Stats} for every node output of the float graph `g` over all samples."""
    arrays = stack_samples(g, samples)
    names = list(dict.fromkeys(t for n in g.nodes for t in n.outputs
                               if g.tensors[t].dtype == "float32"))
    names += [t for t in g.inputs if t not in names]
    probe = g.replace(outputs=[t for t in names if t not in g.inputs])
    bar = _Bar(progress, len(arrays[0]))
    stats = {t: Stats(SAMPLE_CAP, seed) for t in names}
    total = len(arrays[0])
    with tempfile.TemporaryDirectory(prefix="mcuforge-calib-") as d:
        exe, compiled = build_graph(probe, d)
        for start in range(0, total, CHUNK):
            part = [a[start:start + CHUNK] for a in arrays]
            outs = run_graph(compiled, part, exe)
            for t, v in zip(compiled.outputs, outs):
                stats[t].add(v, total)
            for t, v in zip(g.inputs, part):
                stats[t].add(v, total)
            bar.step(len(part[0]))
    bar.done()
    return stats


class Stats:
    """Exact min/max of a tensor plus a uniform random subsample of at most `cap` values."""

    def __init__(self, cap: int, seed: int):
        self.lo, self.hi = np.inf, -np.inf
        self.cap, self.rng, self.kept = cap, np.random.default_rng(seed), []

    def add(self, v: np.ndarray, total_samples: int) -> None:
        """Record a batch [rows, ...] out of `total_samples`: keeps rows/total of the cap."""
        rows = max(1, len(v))
        v = np.asarray(v, dtype=np.float32).reshape(-1)
        if not np.all(np.isfinite(v)):
            raise McuforgeError("calibration produced non-finite activations (inf or nan): "
                                "check the calibration data")
        self.lo, self.hi = min(self.lo, float(v.min())), max(self.hi, float(v.max()))
        keep = -(-self.cap * rows // total_samples)
        self.kept.append(v if keep >= v.size else self.rng.choice(v, keep, replace=False))

    def values(self) -> np.ndarray:
        return np.concatenate(self.kept) if self.kept else np.zeros(1, np.float32)


class _Bar:
    """A one-line text progress bar: `calibrating [#####-----] 25/50 samples`."""

    def __init__(self, stream, total: int, width: int = 30):
        self.stream, self.total, self.width, self.n = stream, total, width, 0
        self._draw()

    def step(self, k: int) -> None:
        self.n += k
        self._draw()

    def _draw(self) -> None:
        if self.stream is None:
            return
        # redrawn in place on a terminal; in a log, only the finished bar
        if not (getattr(self.stream, "isatty", lambda: False)() or self.n == self.total):
            return
        filled = self.width * self.n // max(1, self.total)
        self.stream.write(f"\rcalibrating [{'#' * filled}{'-' * (self.width - filled)}] "
                          f"{self.n}/{self.total} samples")
        self.stream.flush()

    def done(self) -> None:
        if self.stream is not None:
            self.stream.write("\n")
            self.stream.flush()


# ---------------------------------------------------------------------------------------------
# Choosing ranges


def choose_range(s: Stats, method: str) -> tuple:
    """The real range [lo, hi] (lo <= 0 <= hi, hi > lo) to quantize a tensor to."""
    if method == "minmax":
        lo, hi = s.lo, s.hi
    elif method == "percentile":
        v = s.values()
        lo, hi = np.percentile(v, [100 - PERCENTILE, PERCENTILE])
        lo, hi = max(float(lo), s.lo), min(float(hi), s.hi)
    elif method == "mse":
        lo, hi = _mse_range(s.values(), s.lo, s.hi)
    else:
        raise McuforgeError(f"unknown calibration method '{method}': use one of "
                            f"{', '.join(METHODS)}")
    lo, hi = min(float(lo), 0.0), max(float(hi), 0.0)
    if hi - lo < 1e-8:  # an all-zero tensor: any small scale represents it exactly
        hi = lo + 1e-3
    return lo, hi


def asymmetric_params(lo: float, hi: float) -> tuple:
    """(scale, zero point) of int8 for [lo, hi], as TFLite's GetAsymmetricQuantizationParams:
    scale = (hi - lo) / 255 in float32, zero point from whichever end is closer, rounded."""
    lo, hi = np.float32(min(lo, 0.0)), np.float32(max(hi, 0.0))
    qmin, qmax = np.float32(-128), np.float32(127)
    scale = (hi - lo) / (qmax - qmin)
    zp_min, zp_max = qmin - lo / scale, qmax - hi / scale
    err_min = abs(qmin) + abs(lo / scale)
    err_max = abs(qmax) + abs(hi / scale)
    zp = zp_min if err_min < err_max else zp_max
    zp = int(np.clip(np.round(zp), -128, 127))
    return float(scale), zp


def quant_error(v: np.ndarray, lo: float, hi: float) -> float:
    """Mean squared error of quantizing `v` to int8 over [lo, hi]."""
    scale, zp = asymmetric_params(lo, hi)
    q = np.clip(np.round(v / scale) + zp, -128, 127)
    return float(np.mean(((q - zp) * scale - v) ** 2))


def _mse_range(v: np.ndarray, lo: float, hi: float) -> tuple:
    """Shrink [lo, hi] to the range of least quantization MSE over the recorded values: first
    one common factor on both ends, then each end on its own (coordinate search)."""
    lo, hi = min(lo, 0.0), max(hi, 0.0)
    if len(v) > 1 << 17:
        v = np.random.default_rng(0).choice(v, 1 << 17, replace=False)
    grid = np.linspace(0.2, 1.0, 41)
    best = min(grid, key=lambda a: quant_error(v, a * lo, a * hi))
    blo, bhi = best * lo, best * hi
    for _ in range(2):
        if lo < 0:
            blo = min((a * lo for a in grid), key=lambda x: quant_error(v, x, bhi))
        if hi > 0:
            bhi = min((a * hi for a in grid), key=lambda x: quant_error(v, blo, x))
    return blo, bhi
