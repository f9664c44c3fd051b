"""Calibration for post-training quantization: run the float graph on sample inputs, record
every activation tensor's values and choose a real range [lo, hi] per tensor.

The float graph is compiled once by mcuforge itself with every node output as an extra graph
output, and all samples run through the executable in batches, so the recorded values are
exactly what the float C code computes. Ranges always include 0 (TFLite's convention, so that
0.0 -- padding, relu's floor -- is exactly representable).
"""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from mcuforge.ir.errors import McuforgeError
from mcuforge.ir.graph import Graph

METHODS = ("minmax", "percentile", "mse")
PERCENTILE = 99.99
SAMPLE_CAP = 1 << 20  # values kept per tensor for percentile / mse (exact min/max always kept)
CHUNK = 16  # samples per run of the executable (one progress bar step)


# ---------------------------------------------------------------------------------------------
# Running a graph: the caller's `run`
#
# Calibration and the searches after it execute graphs. The optimizer cannot compile C (that is
# the layers above it), so every function here that executes a graph takes `run`: a callable
# run(graph, [N, ...] arrays, one per graph input) -> {output tensor name: [N, ...] array}, in
# the order of the outputs as compiled. `record` calls it many times with one graph object, so
# a runner should build each graph once (mcuforge.api.GraphRunner does).


def need_runner(run) -> None:
    if run is None:
        raise McuforgeError("quantization runs the float graph on the calibration data: pass "
                            "run= (mcuforge.api.GraphRunner, as mcuforge.api.compile does)")


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
    one sample or a batch), an array, a {name: batch} dict or already a list of dicts. A
    single-input model also takes a .npz / dict whose one array of the input's shape has
    another key (`images` beside `labels`, say). Values of any numeric dtype become float32
    as they are (uint8 pixels 0-255 stay 0.0-255.0: scale them yourself if the model expects
    otherwise)."""
    if isinstance(data, list) and all(isinstance(s, dict) for s in data):
        return data
    if isinstance(data, (str, os.PathLike)):
        data = _read(Path(data), g)
    if isinstance(data, dict) and len(g.inputs) == 1 and g.inputs[0] not in data:
        data = _only_batch_of_input(data, g)
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


def _only_batch_of_input(data: dict, g: Graph) -> dict:
    """{input name: the one array of `data` shaped like a batch of the single input}, or the
    error naming the keys."""
    name = g.inputs[0]
    shape = tuple(g.tensors[name].shape)
    fits = [k for k, v in data.items() if _fits(np.shape(v), shape)]
    if len(fits) != 1:
        why = "none has" if not fits else f"{', '.join(sorted(fits))} all have"
        raise McuforgeError(f"calibration data has no input '{name}' (it has {sorted(data)}) "
                            f"and {why} the input's shape (N, {', '.join(map(str, shape))}): "
                            f"key the batch '{name}'")
    return {name: data[fits[0]]}


def _fits(a_shape: tuple, shape: tuple) -> bool:
    """Whether an array of `a_shape` is something _as_batch takes for `shape`."""
    a_shape = tuple(a_shape)
    return (a_shape == shape and bool(shape) and shape[0] == 1 or a_shape[1:] == shape
            or bool(shape) and shape[0] == 1 and (a_shape == shape[1:]
                                                  or a_shape[1:] == shape[1:]))


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


def record(g: Graph, samples: list, run, progress=None, seed: int = 0, moments: bool = False,
           keep: dict | None = None, keep_samples: int | None = None):
    """{tensor name: Stats} for every node output of the float graph `g` over all samples.
    A tensor that only softmax reads keeps its whole rows too (Stats.rows). With `moments`,
    returns (stats, {weighted node's output: InputMoments of its input patches}). `keep`, a
    dict keyed by tensor names, gets each of those tensors' values on all samples ([N, ...]),
    or on the first `keep_samples`. `run`: executes graphs (see above)."""
    need_runner(run)
    arrays = stack_samples(g, samples)
    names = list(dict.fromkeys(t for n in g.nodes for t in n.outputs
                               if g.tensors[t].dtype == "float32"))
    names += [t for t in g.inputs if t not in names]
    probe = g.replace(outputs=[t for t in names if t not in g.inputs])
    bar = _Bar(progress, len(arrays[0]))
    rows = softmax_inputs(g)
    stats = {t: Stats(SAMPLE_CAP, seed, keep_rows=t in rows) for t in names}
    layers = {}
    if moments:
        for n in g.nodes:
            m = InputMoments.of(g, n)
            if m is not None:
                layers[n.outputs[0]] = (n.inputs[0], m)
    total, parts = len(arrays[0]), {}
    for start in range(0, total, CHUNK):
        part = [a[start:start + CHUNK] for a in arrays]
        values = dict(run(probe, part))
        values.update(zip(g.inputs, part))
        for t, v in values.items():
            stats[t].add(v, total)
        for x, m in layers.values():
            m.add(values[x])
        room = total if keep_samples is None else max(0, keep_samples - start)
        for t in keep or ():
            parts.setdefault(t, []).append(np.asarray(values[t])[:room])
        bar.step(len(part[0]))
    bar.done()
    if keep is not None:
        keep.update({t: np.concatenate(v) for t, v in parts.items()})
    if moments:
        return stats, {t: m for t, (_, m) in layers.items()}
    return stats


def softmax_inputs(g: Graph) -> set:
    """Tensors that softmax nodes read and nothing else does (not graph outputs either)."""
    readers = {}
    for n in g.nodes:
        for t in n.inputs:
            readers.setdefault(t, set()).add(n.op)
    return {t for t, ops in readers.items() if ops == {"softmax"} and t not in g.outputs}


class Stats:
    """Exact min/max of a tensor plus a uniform random subsample of at most `cap` values; with
    `keep_rows`, also the first `cap` values as whole rows along the last axis (`rows()`)."""

    def __init__(self, cap: int, seed: int, keep_rows: bool = False):
        self.lo, self.hi = np.inf, -np.inf
        self.cap, self.rng, self.kept = cap, np.random.default_rng(seed), []
        self.keep_rows, self.row_list, self.row_values = keep_rows, [], 0

    def add(self, v: np.ndarray, total_samples: int) -> None:
        """Record a batch [rows, ...] out of `total_samples`: keeps rows/total of the cap."""
        rows, batch = max(1, len(v)), v
        v = np.asarray(v, dtype=np.float32).reshape(-1)
        if not np.all(np.isfinite(v)):
            raise McuforgeError("calibration produced non-finite activations (inf or nan): "
                                "check the calibration data")
        self.lo, self.hi = min(self.lo, float(v.min())), max(self.hi, float(v.max()))
        keep = -(-self.cap * rows // total_samples)
        self.kept.append(v if keep >= v.size else self.rng.choice(v, keep, replace=False))
        if self.keep_rows and self.row_values < self.cap:
            width = int(np.asarray(batch).shape[-1]) if np.ndim(batch) else 1
            self.row_list.append(v.reshape(-1, width))
            self.row_values += v.size

    def values(self) -> np.ndarray:
        return np.concatenate(self.kept) if self.kept else np.zeros(1, np.float32)

    def rows(self):
        """The kept rows [n, last axis], or None when the tensor keeps no rows."""
        return np.concatenate(self.row_list) if self.row_list else None


class InputMoments:
    """First and second moments of the input patches a weighted node (conv2d, depthwise_conv2d,
    fully_connected) multiplies its weights with, over all calibration samples and output
    positions: a weight row w of group g computes w . p for each patch p, so a weight error dw
    shifts the output's mean by dw . mean()[g] and adds dw cov()[g] dw' to its mean square.

    Patches are [groups, K]: conv2d group g reads input channels g*I .. g*I+I-1 and K runs over
    (kh, kw, i) like its OHWI weights; depthwise_conv2d has one group per input channel and K
    runs over (kh, kw); fully_connected has one group of K = input features. Padding taps read
    0.0, as in the float and int8 kernels. The second moments are kept only while they are
    small (groups * K * K <= OUTER_CAP), from at most OUTER_ROWS patches of each batch (a
    fixed random choice); the mean uses every patch."""

    OUTER_CAP = 1 << 22
    OUTER_ROWS = 4096

    def __init__(self, op: str, attrs: dict, w_shape: tuple, x_shape: tuple, y_shape: tuple):
        self.op, self.attrs = op, attrs
        self.w_shape, self.x_shape, self.y_shape = tuple(w_shape), tuple(x_shape), tuple(y_shape)
        if op == "fully_connected":
            self.groups, self.k = 1, int(w_shape[1])
        elif op == "conv2d":
            self.groups, self.k = int(x_shape[-1]) // int(w_shape[3]), int(np.prod(w_shape[1:]))
        else:
            self.groups, self.k = int(x_shape[-1]), int(w_shape[1] * w_shape[2])
        self.count, self.sum = 0, np.zeros((self.groups, self.k))
        small = self.groups * self.k * self.k <= self.OUTER_CAP
        self.outer = np.zeros((self.groups, self.k, self.k)) if small else None
        self.outer_count, self.outer_sum = 0, np.zeros((self.groups, self.k))
        self.rng = np.random.default_rng(0)

    @staticmethod
    def of(g: Graph, n) -> "InputMoments | None":
        """The moments of a weighted node's input, or None for any other node (or a layout it
        does not recognise)."""
        if n.op not in ("conv2d", "depthwise_conv2d", "fully_connected") or len(n.inputs) < 2:
            return None
        w, x, y = g.tensors[n.inputs[1]], g.tensors[n.inputs[0]], g.tensors[n.outputs[0]]
        if w.data is None or (n.op != "fully_connected" and (len(x.shape) != 4 or
                                                              len(w.shape) != 4)):
            return None
        if n.op == "conv2d" and x.shape[-1] % w.shape[3]:
            return None
        if n.op == "fully_connected" and int(np.prod(x.shape)) % w.shape[1]:
            return None
        return InputMoments(n.op, dict(n.attrs), w.shape, x.shape, y.shape)

    def patches(self, x: np.ndarray) -> np.ndarray:
        """[groups, P, K] patches of a batch of inputs [rows, *input shape]."""
        x = np.asarray(x, np.float32)
        if self.op == "fully_connected":
            return x.reshape(1, -1, self.k)
        x = x.reshape((-1,) + self.x_shape[1:])
        kh, kw = (self.w_shape[1], self.w_shape[2])
        (sh, sw), (dh, dw) = self.attrs["stride"], self.attrs.get("dilation", (1, 1))
        top, _, left, _ = self.attrs["padding"]
        oh, ow = self.y_shape[1], self.y_shape[2]
        iy = np.arange(oh)[:, None] * sh - top + np.arange(kh)[None] * dh  # [oh, kh]
        ix = np.arange(ow)[:, None] * sw - left + np.arange(kw)[None] * dw  # [ow, kw]
        n, h, w_, c = x.shape
        # one zero row / column stands for every padding tap
        xp = np.zeros((n, h + 1, w_ + 1, c), np.float32)
        xp[:, :h, :w_] = x
        iy = np.where((iy >= 0) & (iy < h), iy, h)
        ix = np.where((ix >= 0) & (ix < w_), ix, w_)
        p = xp[:, iy[:, :, None, None], ix[None, None]]  # [n, oh, kh, ow, kw, c]
        p = p.transpose(0, 1, 3, 2, 4, 5).reshape(-1, kh * kw, c)  # [P, kh*kw, c]
        if self.op == "depthwise_conv2d":
            return p.transpose(2, 0, 1)  # [c, P, kh*kw]
        ci = c // self.groups
        return p.reshape(len(p), kh * kw, self.groups, ci).transpose(2, 0, 1, 3) \
            .reshape(self.groups, len(p), kh * kw * ci)

    def add(self, x: np.ndarray) -> None:
        p = self.patches(x)
        self.count += p.shape[1]
        self.sum += p.sum(1, dtype=np.float64)
        if self.outer is None:
            return
        if p.shape[1] > self.OUTER_ROWS:
            p = p[:, np.sort(self.rng.choice(p.shape[1], self.OUTER_ROWS, replace=False))]
        p = np.ascontiguousarray(p.transpose(0, 2, 1))  # [G, K, P]
        self.outer_count += p.shape[2]
        self.outer_sum += p.sum(2, dtype=np.float64)
        self.outer += np.matmul(p, p.transpose(0, 2, 1))  # float32 per batch, summed in float64

    def mean(self) -> np.ndarray:
        """[groups, K]: the mean patch."""
        return self.sum / max(1, self.count)

    def cov(self, centered: bool = True):
        """[groups, K, K]: the patches' covariance (or, not centered, their second moment), or
        None when not kept."""
        if self.outer is None or not self.outer_count:
            return None
        if not centered:
            return self.outer / self.outer_count
        mu = self.outer_sum / self.outer_count
        return self.outer / self.outer_count - mu[:, :, None] * mu[:, None, :]

    def rows(self, w: np.ndarray) -> np.ndarray:
        """The node's weights as [groups, rows per group, K], each row one output channel."""
        if self.op == "fully_connected":
            return w.reshape(1, w.shape[0], self.k)
        if self.op == "conv2d":
            return w.reshape(self.groups, w.shape[0] // self.groups, self.k)
        _, kh, kw, o = w.shape  # depthwise: output channel c*M + m reads input channel c
        return w.reshape(kh * kw, self.groups, o // self.groups).transpose(1, 2, 0)

    def unrows(self, r: np.ndarray) -> np.ndarray:
        """Inverse of rows()."""
        if self.op != "depthwise_conv2d":
            return r.reshape(self.w_shape)
        return r.transpose(2, 0, 1).reshape(self.w_shape)

    def channels(self, per_row: np.ndarray) -> np.ndarray:
        """[groups, rows per group] -> one value per output channel, in output order."""
        return per_row.reshape(-1)


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
    return choose_range_of((lo, hi))


def choose_range_of(r: tuple) -> tuple:
    """A chosen range as quantization needs it: lo <= 0 <= hi, hi > lo."""
    lo, hi = min(float(r[0]), 0.0), max(float(r[1]), 0.0)
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
    if hi - lo < 1e-8:  # all zero (relu of negatives): no scale to search; choose_range_of
        return lo, hi   # widens it (the search's 0 / 0 scale was a NaN zero point)
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


def softmax_input_range(rows: np.ndarray, lo: float, hi: float, beta: float = 1.0) -> tuple:
    """The range [lo, hi] of a tensor that only softmax reads (rows along its last axis, n
    values each). Softmax depends on each value's distance below its row's maximum, and a value
    T = ln(256 * (n - 1)) / beta or more below it has probability at most 1 / (256 * (n - 1)):
    all of them together move no output by more than 1 / 256, the int8 softmax's output step.
    So the low end only needs to reach T below the smallest row maximum of the calibration
    data (never below the calibrated minimum); the step between the values that decide the
    output becomes finer. The high end stays the calibrated maximum: clipping the largest
    values of a row would merge the classes that decide it."""
    rows = np.asarray(rows, np.float64)
    n = rows.shape[-1]
    if n < 2 or beta <= 0:
        return lo, hi
    reach = float(rows.max(-1).min()) - np.log(256.0 * (n - 1)) / beta
    return max(lo, min(reach, 0.0)), hi
