"""Post-training int8 quantization of an optimized float graph, following TFLite's
quantization specification exactly as mcuforge's int8 kernels (and TFLM's) expect:

  - weights: int8, symmetric per output channel (zero point 0, scale = max|w| / 127; axis 0 for
    conv2d / fully_connected, axis 3 for depthwise_conv2d), values in [-127, 127]; rounded
    with calibration data (rounding="gptq": error-compensating rounding, see rounding.py) or to
    nearest (rounding="nearest");
  - bias: int32, scale = input_scale * weight_scale per channel, zero point 0; with
    bias_correction (the default) it also absorbs the mean output error of the rounded weights
    on the calibration data (a layer without a bias gets one), and the last weighted layers
    (no weighted layer after them) absorb the whole mean error of their int8 input, measured
    by running the int8 graph on the calibration data;
  - activations: int8, asymmetric per tensor, scale and zero point from the calibrated range
    (which always includes 0); with the "mse" method, a tensor only softmax reads keeps its
    maximum but its low end only reaches as far as can still move softmax's int8 output
    (calibrate.softmax_input_range);
  - fixed outputs: softmax and logistic (1/256, -128), tanh (1/128, 0);
  - max/avg pool, reshape, transpose, pad, slice and relu6 keep their input's parameters;
    concat inputs share one range (the union), and an input quantized otherwise is requantized
    by a "quantize" node;
  - batch_norm, softmax off the last axis and clip are first rewritten in float into ops that
    have int8 kernels (int8_forms.py); clip's max / min against a constant keep their input's
    parameters, the constant quantized with them (so the clamp is exact on the integers);
  - add / mul inputs may differ; constant operands of add / mul are quantized per tensor;
  - reduce mean becomes the int8 mean op (own output range);
  - a few activations may stay int16 instead (TFLite's 16x8 scheme, which TFLM runs): those
    whose measured effect on the output is largest, within an arena budget (int16.py). An
    int16 activation is symmetric (zero point 0) over its whole calibrated range; the layers
    producing or reading it run their int16 kernels (int8 weights as above, int64 bias at
    input_scale * weight_scale; softmax / logistic / tanh output 2^-15, or 2^-16 with zero
    point -32768 for softmax of an int8 input), and "quantize" nodes convert between int8
    (exactly: scale / 128) and int16 (to the tensor's calibrated int8 parameters).

io="int8" makes the graph inputs and outputs int8 (quantize inputs with their scale / zero
point); io="float" keeps float32 inputs and outputs with quantize / dequantize nodes at the
edges; either way the tensors at the edges are int8. Guarantees: the returned graph
verifies, keeps the input and output names, and every node is one the int8 / int16 lowering
and TFLite's int8 / 16x8 kernels accept; a node that cannot be quantized raises McuforgeError
naming it, before any calibration work.
"""
from __future__ import annotations

import numpy as np

from mcuforge.ir.errors import McuforgeError
from mcuforge.ir.graph import Graph, Node, Quant, Tensor, verify

from . import calibrate, int16, int8_forms
from .int16 import is_global_pool
from .calibrate import METHODS, asymmetric_params
from .rounding import gptq_round, output_error

DEFAULT_METHOD = "mse"
ROUNDINGS = ("gptq", "nearest")
DEFAULT_ROUNDING = "gptq"
IO_MODES = ("int8", "float")
WEIGHTED = {"conv2d": 0, "depthwise_conv2d": 3, "fully_connected": 0}  # op -> channel axis
KEEP_INPUT_QUANT = ("avg_pool2d", "max_pool2d", "reshape", "pad", "relu6", "transpose", "slice",
                    "binary")  # binary: max / min with a constant (clip, int8_forms.py)
FIXED_OUTPUT = {"softmax": Quant((1.0 / 256,), (-128,)), "logistic": Quant((1.0 / 256,), (-128,)),
                "tanh": Quant((1.0 / 128,), (0,))}
OWN_RANGE = ("add", "mul", "mean", "relu", "leaky_relu", "hard_swish", "concat")
SUPPORTED = tuple(WEIGHTED) + KEEP_INPUT_QUANT + tuple(FIXED_OUTPUT) + OWN_RANGE + ("reduce",)
INT32_MAX = 2**31 - 1
BIAS_TYPE = {"int8": "int32", "int16": "int64"}  # the bias of an int8 / int16 (16x8) layer
BIAS_MAX = {"int32": INT32_MAX, "int64": 2**63 - 1024}  # (float64 can hold 2^63 - 1024)


def quantize_graph(g: Graph, samples: list, method: str = DEFAULT_METHOD, io: str = "int8",
                   progress=None, rounding: str = DEFAULT_ROUNDING,
                   bias_correction: bool = True, int16_budget_bytes: int | None = 0,
                   int16_tensors=None, run=None) -> Graph:
    """Quantize the optimized float graph `g` to int8, calibrated on `samples` (a list of
    {input name: array}). `progress`: a text stream for the calibration progress bar (and a
    line on the activations kept in int16).
    `rounding` ("gptq" or "nearest") and `bias_correction`: how weights are rounded and whether
    biases absorb the mean output error of quantization (both use the calibration data; see
    the module docstring). `int16_budget_bytes`: how many bytes the arena may grow by to keep
    the activations that matter most for the output in int16 (chosen by their measured
    effect, see int16.py); 0, the default: every activation int8, as TFLite's int8 scheme;
    None: int16.DEFAULT_BUDGET of the all-int8 graph's arena. `int16_tensors`: instead of that search, the activations
    to keep in int16 (names of the float graph's tensors; int16.moves lists the candidates;
    the layers reading them go to int16 too). `run`: executes graphs on the calibration data
    (see calibrate.py; mcuforge.api.GraphRunner)."""
    calibrate.need_runner(run)
    if method not in METHODS:
        raise McuforgeError(f"unknown calibration method '{method}': use one of "
                            f"{', '.join(METHODS)}")
    if io not in IO_MODES:
        raise McuforgeError(f"quantize io must be one of {', '.join(IO_MODES)}, not '{io}'")
    if rounding not in ROUNDINGS:
        raise McuforgeError(f"unknown weight rounding '{rounding}': use one of "
                            f"{', '.join(ROUNDINGS)}")
    budget = int16_budget_bytes
    if budget is not None and (not isinstance(budget, (int, np.integer)) or budget < 0):
        raise McuforgeError(f"the int16 budget must be a number of bytes >= 0 (or None), "
                            f"not {budget!r}")
    g = int8_forms.rewrite(g)
    check_quantizable(g)
    wide = None if int16_tensors is None else _moves_of(g, int16_tensors)
    if wide is not None:
        budget = 0  # no search
    with _one_blas_thread():  # small matrices: threads only contend (with each other, tests)
        moments, keep = {}, None
        if budget != 0:
            keep = dict.fromkeys(list(g.outputs) + [n.inputs[0] for n in _final_weighted(g)])
        if rounding == "gptq" or bias_correction:
            stats, moments = calibrate.record(g, samples, run, progress, moments=True, keep=keep,
                                              keep_samples=int16.EVAL_SAMPLES)
        else:
            stats = calibrate.record(g, samples, run, progress, keep=keep,
                                     keep_samples=int16.EVAL_SAMPLES)
        ranges = {t: calibrate.choose_range(s, method) for t, s in stats.items()}
        if method == "mse":
            _softmax_input_ranges(g, stats, ranges)
        _share_concat_ranges(g, ranges)
        extent = {t: (s.lo, s.hi) for t, s in stats.items()}
        cache = {}

        def build(wide):
            return _Quantizer(g, ranges, moments, rounding, bias_correction, wide, extent,
                              cache).run()

        if budget != 0:
            q = int16.with_int16(g, samples, moments, bias_correction, keep, build, budget,
                                 progress, _final_weighted, _float_edges,
                                 _correct_final_biases, run)
        else:
            q = build(wide or frozenset())
            if bias_correction:
                q = _correct_final_biases(g, q, samples, moments, run)
    if io == "float":
        q = _float_edges(q)
    return verify(q)


def _moves_of(g: Graph, names) -> frozenset:
    """The int16 tensors keeping `names` in int16 means (int16.moves), or McuforgeError."""
    cands = int16.moves(g)
    for t in names:
        if t not in cands:
            why = "not a tensor of the graph" if t not in g.tensors else (
                "a graph input or output" if t in g.inputs or t in g.outputs else
                "not the output of a layer with an int16 kernel computing a new value")
            raise McuforgeError(f"cannot keep '{t}' in int16: {why} (candidates: "
                                f"{', '.join(cands) or 'none'})")
    return frozenset().union(*(cands[t] for t in names))


def _one_blas_thread():
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:  # scikit-learn brings it; without it, numpy's own threading
        import contextlib
        return contextlib.nullcontext()
    return threadpool_limits(1, user_api="blas")


def check_quantizable(g: Graph) -> None:
    """Raise McuforgeError naming the first node the int8 quantizer cannot handle (in a graph
    int8_forms.rewrite has rewritten)."""
    for name in list(g.inputs) + list(g.outputs):
        if g.tensors[name].dtype != "float32":
            raise McuforgeError(f"graph input/output '{name}' is {g.tensors[name].dtype}: "
                                "only float32 models can be quantized")
    for n in g.nodes:
        where = f"{n.op} node '{n.name or n.outputs[0]}'"
        if n.op not in SUPPORTED:
            raise McuforgeError(f"cannot quantize {where} to int8: {n.op} has no int8 kernel "
                                f"(quantizable ops: {', '.join(sorted(SUPPORTED))})")
        if n.op in WEIGHTED and not g.tensors[n.inputs[1]].is_const:
            raise McuforgeError(f"cannot quantize {where}: its weights are not constant")
        if n.op == "softmax":
            rank = len(g.tensors[n.inputs[0]].shape)
            if n.attrs.get("axis", rank - 1) not in (-1, rank - 1):
                raise McuforgeError(f"cannot quantize {where}: int8 softmax works on the last "
                                    "axis only")
        if n.op == "binary" and (n.attrs["fn"] not in ("max", "min") or len(n.inputs) != 2
                                 or not g.tensors[n.inputs[1]].is_const
                                 or g.tensors[n.inputs[1]].size != 1):
            raise McuforgeError(f"cannot quantize {where}: of the binary ops only max / min "
                                "with a constant scalar (a clip) have an int8 kernel")
        if n.op == "reduce" and n.attrs["fn"] != "mean":
            raise McuforgeError(f"cannot quantize {where}: reduce {n.attrs['fn']} has no int8 "
                                "kernel (reduce mean has)")
        if n.op in ("pad", "mean", "reshape"):
            continue  # their shape / axes operands are constants kept as they are
        for t in n.inputs:
            if t and g.tensors[t].dtype != "float32":
                raise McuforgeError(f"cannot quantize {where}: input '{t}' is "
                                    f"{g.tensors[t].dtype}, not float32")


def _softmax_input_ranges(g: Graph, stats: dict, ranges: dict) -> None:
    """A tensor only softmax reads: the range calibrate.softmax_input_range gives (the int8
    softmax needs no particular input range)."""
    beta = {n.inputs[0]: float(n.attrs.get("beta", 1.0)) for n in g.nodes if n.op == "softmax"}
    for t in calibrate.softmax_inputs(g):
        s = stats.get(t)
        rows = s.rows() if s is not None else None
        if rows is not None and rows.shape[-1] > 1:
            ranges[t] = calibrate.choose_range_of(
                calibrate.softmax_input_range(rows, s.lo, s.hi, beta.get(t, 1.0)))


def _share_concat_ranges(g: Graph, ranges: dict) -> None:
    """Every concat's inputs and output get one range, the union of theirs (TFLite's int8
    concat needs equal parameters; inputs that still differ are requantized later). The range
    also goes back through the transposes / reshapes that lead to an input (the layout
    transposes of an NCHW model), which keep their input's parameters, when nothing else reads
    what they move: otherwise such an input would always need requantizing."""
    producer = {t: n for n in g.nodes for t in n.outputs}
    readers = {}
    for n in g.nodes:
        for t in n.inputs:
            readers[t] = readers.get(t, 0) + 1
    for n in g.nodes:
        if n.op != "concat":
            continue
        group = [t for t in n.inputs if t in ranges] + [n.outputs[0]]
        for t in n.inputs:
            p = producer.get(t)
            while p is not None and p.op in ("transpose", "reshape") and p.inputs[0] in ranges \
                    and readers.get(p.inputs[0]) == 1 and p.inputs[0] not in g.outputs:
                group.append(p.inputs[0])
                p = producer.get(p.inputs[0])
        lo = min(ranges[t][0] for t in group)
        hi = max(ranges[t][1] for t in group)
        for t in group:
            ranges[t] = (lo, hi)


def quant_of_range(lo: float, hi: float) -> Quant:
    scale, zp = asymmetric_params(lo, hi)
    return Quant((scale,), (zp,))


def _int16_quant(lo: float, hi: float) -> Quant:
    """int16 as the 16x8 scheme has it: symmetric, zero point 0, max(|lo|, |hi|) at 32767."""
    amax = max(abs(float(lo)), abs(float(hi)))
    return Quant((float(np.float32(amax if amax > 0 else 1e-3) / np.float32(32767)),), (0,))


class _Quantizer:
    """One pass over the nodes in order: each node's inputs are quantized before it.

    `wide`: the tensors kept in int16 (TFLite's 16x8 scheme; see int16.py). A node whose
    output is one of them runs its int16 kernel: it reads int16 versions of its inputs (a
    lossless int8 -> int16 "quantize" copy for an int8 one) and writes int16; an int8 node
    reading an int16 tensor reads an int8 copy of it (its calibrated int8 quantization).
    `extent`: each tensor's calibrated (min, max), the range of an int16 one. `cache`: the
    weight rounding of each layer, shared between quantizers of one graph (it does not depend
    on which activations are int16)."""

    def __init__(self, g: Graph, ranges: dict, moments=None, rounding: str = "nearest",
                 bias_correction: bool = False, wide=(), extent=None, cache=None):
        self.g, self.ranges = g, ranges
        self.moments, self.rounding, self.bias_correction = moments or {}, rounding, \
            bias_correction
        self.wide, self.extent = frozenset(wide), extent or {}
        self.cache = {} if cache is None else cache
        self.tensors = dict(g.tensors)
        self.nodes = []
        self.quant = {}  # activation tensor -> its Quant (int8 or int16)
        self.copies = {}  # (tensor, dtype) -> its converted copy
        self.names = set(g.tensors)

    def run(self) -> Graph:
        for name in self.g.inputs:
            self._set(name, quant_of_range(*self.ranges[name]))
        for n in self.g.nodes:
            getattr(self, "_" + n.op, self._own_range)(n)
        return self.g.replace(tensors=self.tensors, nodes=self.nodes)

    # -- helpers -------------------------------------------------------------------------------

    def _set(self, name: str, quant: Quant, dtype: str = "int8") -> None:
        t = self.tensors[name]
        self.tensors[name] = Tensor(t.name, t.shape, dtype, quant=quant)
        self.quant[name] = quant

    def _fresh(self, base: str) -> str:
        name = base
        while name in self.names:
            name += "_"
        self.names.add(name)
        return name

    def _const(self, base: str, data: np.ndarray, dtype: str, quant: Quant) -> str:
        name = self._fresh(base)
        self.tensors[name] = Tensor(name, tuple(data.shape), dtype, data=data.astype(dtype),
                                    quant=quant)
        return name

    def _dtype(self, n: Node) -> str:
        return "int16" if n.outputs[0] in self.wide else "int8"

    def _as(self, name: str, dtype: str) -> str:
        """Activation tensor `name` in `dtype`: itself, or a converted copy made by a quantize
        node (once per tensor and dtype). int8 -> int16 is exact: scale / 128, zero point 0
        (|q - zero point| <= 255, times 128 fits int16, and the requantization multiplier is
        exactly 128); int16 -> int8 takes the tensor's calibrated int8 quantization."""
        t = self.tensors[name]
        if t.dtype == dtype:
            return name
        if (name, dtype) not in self.copies:
            if dtype == "int16":
                quant = Quant((float(np.float32(t.quant.scale[0]) / np.float32(128)),), (0,))
            else:
                quant = self._range_quant(name)
            copy = self._fresh(f"{name}/{dtype}")
            self.tensors[copy] = Tensor(copy, t.shape, dtype, quant=quant)
            self.quant[copy] = quant
            self.nodes.append(Node("quantize", (name,), (copy,), {}, copy))
            self.copies[(name, dtype)] = copy
        return self.copies[(name, dtype)]

    def _activation_input(self, name: str, dtype: str = "int8") -> str:
        """An activation input in `dtype`, or a constant one quantized per tensor over its own
        range (int16: symmetric, zero point 0)."""
        if name in self.quant:
            return self._as(name, dtype)
        t = self.g.tensors[name]
        if not t.is_const:
            raise McuforgeError(f"tensor '{name}' has no quantization")  # unreachable: checked
        data = t.data.astype(np.float32)
        if dtype == "int16":
            q = _int16_quant(float(data.min(initial=0.0)), float(data.max(initial=0.0)))
            values = np.clip(np.round(data / q.scale[0]), -32768, 32767)
            return self._const(name + "/int16", values, "int16", q)
        q = quant_of_range(float(data.min(initial=0.0)), float(data.max(initial=0.0)))
        values = np.clip(np.round(data / q.scale[0]) + q.zero_point[0], -128, 127)
        return self._const(name + "/int8", values, "int8", q)

    def _emit(self, n: Node, inputs, out_quant: Quant, dtype: str = "int8") -> None:
        self._set(n.outputs[0], out_quant, dtype)
        self.nodes.append(Node(n.op, tuple(inputs), n.outputs, dict(n.attrs), n.name))

    def _range_quant(self, name: str) -> Quant:
        return quant_of_range(*self.ranges[name])

    def _out_quant(self, name: str, dtype: str) -> Quant:
        """int8: the calibrated range; int16: symmetric over everything calibration saw."""
        if dtype == "int16":
            return _int16_quant(*self.extent.get(name, self.ranges[name]))
        return self._range_quant(name)

    # -- ops -----------------------------------------------------------------------------------

    def _own_range(self, n: Node) -> None:
        """add, mul, mean, relu, leaky_relu, hard_swish: the output's calibrated range."""
        dtype = self._dtype(n)
        ins = [self._activation_input(t, dtype) if t else t for t in n.inputs]
        self._emit(n, ins, self._out_quant(n.outputs[0], dtype), dtype)

    def _reduce(self, n: Node) -> None:
        """reduce mean (ONNX ReduceMean, GlobalAveragePool) -> the int8 mean op."""
        attrs = dict(axes=tuple(n.attrs["axes"]), keep_dims=bool(n.attrs["keep_dims"]))
        self._mean(Node("mean", n.inputs[:1], n.outputs, attrs, n.name))

    def _mean(self, n: Node) -> None:
        dtype = self._dtype(n)  # inputs[1]: the axes, kept as they are
        self._emit(n, (self._as(n.inputs[0], dtype),) + tuple(n.inputs[1:]),
                   self._out_quant(n.outputs[0], dtype), dtype)

    def _keep(self, n: Node) -> None:
        """pools, reshape, pad, relu6, transpose, slice, max / min with a constant: the output
        is quantized like the input (their kernels move or compare bytes; no requantizing)."""
        dtype = self._dtype(n)
        ins = list(n.inputs)
        ins[0] = self._as(ins[0], dtype)
        q = self.quant[ins[0]]
        # the pad value, clip's bound: a constant quantized like x
        k = 2 if n.op == "pad" else 1 if n.op == "binary" else None
        if k is not None and len(ins) > k and ins[k]:
            v = self.g.tensors[ins[k]].data.astype(np.float32)
            lo, hi = (-128, 127) if dtype == "int8" else (-32768, 32767)
            ins[k] = self._const(ins[k] + "/" + dtype,
                                 np.clip(np.round(v / q.scale[0]) + q.zero_point[0], lo, hi),
                                 dtype, q)
        self._emit(n, ins, q, dtype)

    def _avg_pool2d(self, n: Node) -> None:
        """A global average pool becomes the int8 mean op, whose output gets its own (finer)
        range; other average pools keep their input's quantization, as TFLite requires."""
        if not is_global_pool(self.g, n):
            return self._keep(n)
        self._mean(Node("mean", n.inputs[:1], n.outputs, dict(axes=(1, 2), keep_dims=True),
                        n.name))

    _max_pool2d = _reshape = _pad = _relu6 = _transpose = _slice = _binary = _keep

    def _fixed(self, n: Node) -> None:
        """softmax, logistic, tanh: the output quantization their kernels fix. In int16:
        scale 2^-15, zero point 0 -- but softmax of an int8 input (TFLM's int8 -> int16
        softmax) 2^-16, zero point -32768."""
        if self._dtype(n) == "int8":
            return self._emit(n, (self._as(n.inputs[0], "int8"),), FIXED_OUTPUT[n.op])
        x = n.inputs[0]
        if n.op == "softmax" and self.tensors[x].dtype == "int8":
            return self._emit(n, (x,), Quant((1.0 / 65536,), (-32768,)), "int16")
        self._emit(n, (self._as(x, "int16"),), Quant((1.0 / 32768,), (0,)), "int16")

    _softmax = _logistic = _tanh = _fixed

    def _concat(self, n: Node) -> None:
        out_q = self._range_quant(n.outputs[0])
        ins = []
        for t in n.inputs:
            if not (t in self.quant and self.tensors[t].dtype == "int16"):
                t = self._activation_input(t)  # (an int16 input is requantized in one step)
            if self.tensors[t].quant != out_q or self.tensors[t].dtype != "int8":
                r = self._fresh(t + "/requant")
                self.tensors[r] = Tensor(r, self.tensors[t].shape, "int8", quant=out_q)
                self.nodes.append(Node("quantize", (t,), (r,), {}, r))
                t = r
            ins.append(t)
        self._emit(n, ins, out_q)

    def _weighted(self, n: Node) -> None:
        dtype = self._dtype(n)
        x = self._as(n.inputs[0], dtype)
        in_scale = np.float32(self.quant[x].scale[0])
        w = self.g.tensors[n.inputs[1]].data.astype(np.float32)
        axis = WEIGHTED[n.op]
        bias_name = n.inputs[2] if len(n.inputs) > 2 else ""
        b = self.g.tensors[bias_name].data.astype(np.float32).reshape(-1) if bias_name else None
        # an int64 bias (int16 layers) always fits: no weight scale needs widening for it
        wq, w_scale = quantize_weights(w, axis, in_scale, b if dtype == "int8" else None)
        m = self.moments.get(n.outputs[0])
        if m is not None:
            key = (n.outputs[0], w_scale.tobytes())
            if key not in self.cache:  # the rounding does not depend on the input's scale
                self.cache[key] = self._with_calibration(m, w, wq, w_scale, b)
            wq, b = self.cache[key]
            if b is not None and not bias_name:
                bias_name = self._fresh(n.outputs[0] + "/bias")
        w_quant = Quant(tuple(float(s) for s in w_scale), (0,) * len(w_scale), axis)
        ins = [x, self._const(n.inputs[1], wq, "int8", w_quant)]
        if b is not None:
            b_scale = in_scale * w_scale  # float32, as TFLite forms it
            b_type = BIAS_TYPE[dtype]
            bq = np.clip(np.round(b.astype(np.float64) / b_scale.astype(np.float64)),
                         -BIAS_MAX[b_type], BIAS_MAX[b_type])
            b_quant = Quant(tuple(float(s) for s in b_scale), (0,) * len(b_scale), 0)
            ins.append(self._const(bias_name, bq, b_type, b_quant))
        self._emit(n, ins, self._out_quant(n.outputs[0], dtype), dtype)

    _conv2d = _depthwise_conv2d = _fully_connected = _weighted

    def _with_calibration(self, m, w: np.ndarray, wq: np.ndarray, w_scale: np.ndarray, b):
        """(int8 weights, float bias) using the calibration moments of the node's input:
        error-compensating rounding on the same grid, then bias correction."""
        rows = m.rows(w.astype(np.float64))
        srows = w_scale.astype(np.float64).reshape(rows.shape[:2])
        # with bias correction the mean error is removed anyway: only its spread counts
        cov = m.cov(centered=self.bias_correction) if self.rounding == "gptq" else None
        if cov is not None:
            wq = m.unrows(gptq_round(rows, srows, cov))
        if not self.bias_correction:
            return wq, b
        dw = m.rows(wq.astype(np.float64)) * srows[..., None] - rows
        shift = m.channels(output_error(dw, m.mean(), None)[0])
        base = np.zeros(len(shift)) if b is None else b.astype(np.float64)
        return wq, (base - shift).astype(np.float32)


def _final_weighted(g: Graph) -> list:
    """The weighted nodes no other weighted node depends on (the last layer of a classifier)."""
    readers = {}
    for n in g.nodes:
        for t in n.inputs:
            readers.setdefault(t, []).append(n)
    feeds = {}  # tensor -> whether a weighted node reads it, directly or further down

    def leads(t):
        return feeds.get(t, False)

    for n in reversed(g.nodes):
        for t in n.outputs:
            feeds[t] = any(r.op in WEIGHTED or any(leads(o) for o in r.outputs)
                           for r in readers.get(t, ()))
    return [n for n in g.nodes if n.op in WEIGHTED and not any(leads(t) for t in n.outputs)]


def _final_targets(g: Graph, q: Graph, moments: dict) -> list:
    """(float node, quantized node, input moments) of the last weighted layers whose bias
    _correct_final_biases sets."""
    made = {n.outputs[0]: n for n in q.nodes}
    todo = []
    for n in _final_weighted(g):
        m, qn = moments.get(n.outputs[0]), made.get(n.outputs[0])
        if m is None or qn is None or len(qn.inputs) < 3 or not qn.inputs[2] \
                or qn.inputs[0] in q.inputs or qn.inputs[0] in q.outputs:
            continue
        todo.append((n, qn, m))
    return todo


def _correct_final_biases(g: Graph, q: Graph, samples: list, moments: dict, run,
                          values: dict | None = None) -> Graph:
    """Empirical bias correction of the last weighted layers: run the int8 graph on the
    calibration samples, take the mean patch mu_q of what such a layer really reads, and give
    it the bias b + W mu - Wq mu_q, so that its pre-activation output has the float layer's
    mean (mu: the float input's mean patch). This also absorbs the mean error that activation
    quantization (clipping, rounding through ReLUs) piles up on the way; layers further up
    keep the analytic correction, so that no correction is counted twice. `values`: what
    those layers read on the calibration samples ({tensor: [N, ...]}), when already run."""
    todo = _final_targets(g, q, moments)
    if not todo:
        return q
    if values is None:
        probe = _float_edges(q).replace(
            outputs=list(dict.fromkeys(qn.inputs[0] for _, qn, _ in todo)))
        arrays = calibrate.stack_samples(g, samples)
        values = dict(zip(probe.outputs, run(probe, arrays).values()))
    tensors = dict(q.tensors)
    for n, qn, m in todo:
        xq = q.tensors[qn.inputs[0]].quant
        x = (values[qn.inputs[0]].astype(np.float64) - xq.zero_point[0]) * xq.scale[0]
        p = m.patches(x.astype(np.float32))
        mu_q = p.sum(1, dtype=np.float64) / p.shape[1]
        wt, bt = q.tensors[qn.inputs[1]], q.tensors[qn.inputs[2]]
        wq = m.rows(wt.data.astype(np.float64)) * np.asarray(wt.quant.scale).reshape(
            m.groups, -1)[..., None]
        w = m.rows(g.tensors[n.inputs[1]].data.astype(np.float64))
        b = (g.tensors[n.inputs[2]].data.astype(np.float64).reshape(-1)
             if len(n.inputs) > 2 and n.inputs[2] else 0.0)
        b = b + m.channels(np.einsum("grk,gk->gr", w, m.mean())
                           - np.einsum("grk,gk->gr", wq, mu_q))
        bq = np.clip(np.round(b / np.asarray(bt.quant.scale, np.float64)),
                     -BIAS_MAX[bt.dtype], BIAS_MAX[bt.dtype])
        tensors[bt.name] = Tensor(bt.name, bt.shape, bt.dtype, data=bq.astype(bt.dtype),
                                  quant=bt.quant)
    return q.replace(tensors=tensors)


def quantize_weights(w: np.ndarray, axis: int, in_scale: float, bias=None) -> tuple:
    """Symmetric per-channel int8 weights along `axis`: (int8 data, float32 scales). scale =
    max|w| / 127, raised where needed so that bias / (in_scale * scale) fits int32; an all-zero
    channel gets scale 1."""
    other = tuple(i for i in range(w.ndim) if i != axis)
    amax = np.max(np.abs(w), axis=other).astype(np.float32)
    scale = amax / np.float32(127)
    if bias is not None:  # TFLite's converter widens the weight scale for huge biases too
        need = np.abs(bias).astype(np.float32) / (np.float32(in_scale) * np.float32(INT32_MAX))
        scale = np.maximum(scale, need * np.float32(1.01))
    scale = np.where(scale > 0, scale, np.float32(1.0)).astype(np.float32)
    shape = [1] * w.ndim
    shape[axis] = -1
    wq = np.clip(np.round(w / scale.reshape(shape)), -127, 127)
    return wq, scale


def _float_edges(g: Graph) -> Graph:
    """Float32 graph inputs / outputs around the int8 graph: quantize after each input,
    dequantize before each output; the names stay the graph's."""
    tensors, rename = dict(g.tensors), {}
    head, tail = [], []
    names = set(tensors)

    def fresh(base):
        name = base
        while name in names:
            name += "_"
        names.add(name)
        return name

    for name in g.inputs:
        t = tensors[name]
        inner = fresh(name + "/int8")
        tensors[inner] = Tensor(inner, t.shape, "int8", quant=t.quant)
        tensors[name] = Tensor(name, t.shape, "float32")
        rename[name] = inner
        head.append(Node("quantize", (name,), (inner,), {}, inner))
    out_rename = {}
    for name in g.outputs:
        t = tensors[name]
        inner = rename.get(name) or fresh(name + "/int8")
        if name not in rename:
            tensors[inner] = Tensor(inner, t.shape, "int8", quant=t.quant)
            out_rename[name] = inner
        tensors[name] = Tensor(name, t.shape, "float32")
        tail.append(Node("dequantize", (inner,), (name,), {}, name))
    rename.update(out_rename)

    def sub(names_):
        return tuple(rename.get(t, t) for t in names_)

    nodes = [Node(n.op, sub(n.inputs), sub(n.outputs), n.attrs, n.name) for n in g.nodes]
    return g.replace(tensors=tensors, nodes=head + nodes + tail)


def quantize_for_compile(g: Graph, scheme, calibration, method=None, io: str = "int8",
                         emit_tflite=None, progress=None, rounding: str = DEFAULT_ROUNDING,
                         bias_correction: bool = True,
                         int16_budget_bytes: int | None = 0, run=None) -> Graph:
    """What `mcuforge compile --quantize int8 --calibration DATA ...` does to the loaded graph:
    optimize, calibrate and quantize (`int16_budget_bytes`: see quantize_graph); with
    `emit_tflite` also write the int8 graph as a .tflite (the graph mcuforge compiles, so TFLM
    runs the same arithmetic). `run`: executes graphs (see calibrate.py)."""
    from .pipeline import optimize
    if scheme is None:
        if calibration is not None or emit_tflite is not None or method is not None:
            raise McuforgeError("--calibration, --calibration-method and --emit-tflite need "
                                "--quantize int8")
        return g
    if scheme != "int8":
        raise McuforgeError(f"--quantize {scheme}: only int8 is supported")
    if calibration is None:
        raise McuforgeError("--quantize int8 needs --calibration DATA (a .npy, .npz or a folder "
                            "of .npy files with sample inputs)")
    g = optimize(g)
    samples = calibrate.load_samples(calibration, g)
    q = quantize_graph(g, samples, method or DEFAULT_METHOD, io, progress, rounding,
                       bias_correction, int16_budget_bytes, run=run)
    if emit_tflite is not None:
        from mcuforge.frontend.tflite_writer import write_tflite
        try:
            data = write_tflite(q)
        except ValueError as e:
            raise McuforgeError(f"cannot write the int8 model as TFLite: {e}") from None
        try:
            with open(emit_tflite, "wb") as f:
                f.write(data)
        except OSError as e:
            raise McuforgeError(f"cannot write {emit_tflite}: {e.strerror or e}") from None
    return q


def io_params(g: Graph) -> list:
    """(kind, tensor name, dtype, int8 Quant) of each graph input and output of a quantized
    graph: the tensor's own quantization, or with io="float" the int8 tensor at its edge."""
    rows = []
    for kind, names, op, side in (("input", g.inputs, "quantize", 0),
                                  ("output", g.outputs, "dequantize", 1)):
        for name in names:
            t, q = g.tensors[name], g.tensors[name].quant
            for n in g.nodes:
                if q is None and n.op == op and (n.inputs, n.outputs)[side][0] == name:
                    q = g.tensors[(n.outputs, n.inputs)[side][0]].quant
            rows.append((kind, name, t.dtype, q))
    return rows
