"""The random graphs of `mcuforge fuzz` and their references: float32 ONNX graphs of 2-12 nodes
over 30-odd operator types with random shapes (square ones often) and attributes, built with
onnx.helper, onnx's own shape inference and numpy only, and run by onnxruntime (float32) and
onnx.reference (float64). Nothing here imports mcuforge, so a mistake in mcuforge's shape or
attribute handling cannot hide on both sides (mcuforge/tools/fuzz.py does the checking).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17
IR_VERSION = 8  # opset 17's: onnxruntime rejects newer IR versions than it knows
MAX_NODES = 12
MAX_ELEMENTS = 4096  # per tensor: keeps the C small and the build fast
HUGE = 1e4  # an intermediate beyond this (or not finite) makes the generator draw again

FLOAT_OPS = ("Add", "Sub", "Mul", "Div", "Max", "Min", "Relu", "Sigmoid", "Tanh", "Abs", "Neg",
             "Exp", "SqrtAbs", "LeakyRelu", "Clip", "Softmax", "MatMul", "Gemm", "Conv",
             "MaxPool", "AveragePool", "GlobalAveragePool", "BatchNormalization", "Transpose",
             "Reshape", "Flatten", "Concat", "Slice", "Pad", "Squeeze", "Unsqueeze",
             "ReduceMean", "ReduceMax")
# what mcuforge's int8 quantizer takes (optimizer/quantize.py: SUPPORTED), in ONNX terms
# (ReduceMax has no int8 kernel; Softmax is int8 on the last axis only, BatchNormalization
# only folded into a Conv: the generator draws those forms)
INT8_OPS = ("Add", "Mul", "Relu", "Sigmoid", "Tanh", "LeakyRelu", "Relu6", "Softmax", "MatMul",
            "Gemm", "Conv", "Conv", "MaxPool", "AveragePool", "GlobalAveragePool",
            "BatchNormalization", "Transpose", "Reshape", "Flatten", "Concat", "Pad", "Squeeze",
            "Unsqueeze", "ReduceMean")

# Generator features that hit a known, unfixed mcuforge bug: feature -> the bug. The suite set
# excludes them; a sweep keeps them unless told otherwise. Remove an entry once fixed.
KNOWN: dict = {
    # (empty: pooling with ceil_mode=1 keeping a last window that starts past the input, seeds
    # 1096 and 1212, is fixed by the frontend's own pool shape rule)
}
# Known limits no generator feature isolates:
# - float: onnx's shape inference (which the generator uses to declare intermediate shapes)
#   keeps the past-the-end window of a ceil_mode pool; mcuforge refuses a declared shape that
#   its operands contradict, so such a graph is "refused", not compiled.


# ---- the generator: onnx.helper + numpy only ------------------------------------------------

class _Builder:
    """A graph under construction: nodes, constants, and every tensor's shape (from onnx's shape
    inference, run after each node)."""

    def __init__(self, rng: np.random.Generator, int8: bool, exclude):
        self.rng, self.int8, self.exclude = rng, int8, set(exclude)
        self.nodes, self.inits, self.inputs = [], [], []
        self.shape = {}  # tensor name -> shape tuple
        self.consumed = set()
        self.count = 0

    def fresh(self, prefix: str) -> str:
        self.count += 1
        return f"{prefix}{self.count}"

    def allow(self, feature: str) -> bool:
        return feature not in self.exclude

    def chance(self, p: float) -> bool:
        return bool(self.rng.random() < p)

    def const(self, value, dtype=np.float32, prefix="c") -> str:
        name = self.fresh(prefix)
        self.inits.append(numpy_helper.from_array(np.asarray(value, dtype), name))
        return name

    def weights(self, shape, fan_in: int) -> str:
        w = self.rng.normal(0.0, 1.0 / np.sqrt(max(fan_in, 1)), shape)
        return self.const(w.astype(np.float32), prefix="w")

    def add_input(self, shape) -> str:
        name = f"x{len(self.inputs)}"
        self.inputs.append(name)
        self.shape[name] = tuple(shape)
        return name

    def node(self, op: str, inputs, **attrs) -> str | None:
        """Append op(inputs); its output's name, or None (node dropped) when onnx rejects it or
        the output is empty or too large."""
        out = self.fresh("t")
        n = helper.make_node(op, list(inputs), [out], name=self.fresh(op.lower() + "_"), **attrs)
        self.nodes.append(n)
        try:
            inferred = onnx.shape_inference.infer_shapes(self.model([]), strict_mode=True)
        except Exception:
            self.nodes.pop()
            return None
        shapes = {v.name: v.type.tensor_type.shape for v in inferred.graph.value_info}
        dims = shapes.get(out)
        shape = tuple(d.dim_value if d.HasField("dim_value") else -1 for d in dims.dim) \
            if dims is not None else None
        if not shape or any(d <= 0 for d in shape) or int(np.prod(shape)) > MAX_ELEMENTS:
            self.nodes.pop()
            return None
        self.shape[out] = shape
        self.consumed.update(i for i in inputs if i)
        return out

    def model(self, outputs) -> onnx.ModelProto:
        ins = [helper.make_tensor_value_info(n, TensorProto.FLOAT, self.shape[n])
               for n in self.inputs]
        outs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, self.shape[n])
                for n in outputs]
        g = helper.make_graph(self.nodes, "fuzz", ins, outs, self.inits)
        return helper.make_model(g, opset_imports=[helper.make_opsetid("", OPSET)],
                                 producer_name="mcuforge.tools.fuzz", ir_version=IR_VERSION)

    def pick(self, pred=lambda s: True) -> str | None:
        """A tensor whose shape satisfies pred; recent and unconsumed ones preferred, so the
        graph is mostly a chain with branches."""
        names = [t for t in self.shape if pred(self.shape[t])]
        if not names:
            return None
        fresh = [t for t in names if t not in self.consumed]
        if fresh and self.chance(0.8):
            names = fresh
        weights = np.arange(1, len(names) + 1, dtype=float) ** 2
        return names[self.rng.choice(len(names), p=weights / weights.sum())]

    def dim(self, lo=1, hi=8) -> int:
        return int(self.rng.integers(lo, hi + 1))


def _random_shape(b: _Builder) -> tuple:
    """An input shape: NCHW feature maps most often (square half the time), else rank 2 or 3."""
    kind = b.rng.choice(["nchw", "nchw", "nchw", "2d", "3d"])
    if kind == "nchw":
        h = b.dim(1, 10)
        w = h if b.chance(0.5) else b.dim(1, 10)
        return (1 if b.chance(0.85) else 2, b.dim(1, 6), h, w)
    if kind == "2d":
        n = b.dim(1, 12)
        return (n, n if b.chance(0.4) else b.dim(1, 16))
    return (b.dim(1, 3), b.dim(1, 8), b.dim(1, 8))


def _op_unary(b: _Builder, op: str):
    x = b.pick()
    if op == "LeakyRelu":
        return b.node(op, [x], alpha=float(b.rng.choice([0.01, 0.1, 0.2, 0.3])))
    if op == "Exp":
        return b.node(op, [x])
    if op == "SqrtAbs":
        a = b.node("Abs", [x])
        return a and b.node("Sqrt", [a])
    if op == "Relu6":
        return b.node("Clip", [x, b.const(0.0), b.const(6.0)])
    if op == "Clip":
        lo, hi = sorted(b.rng.uniform(-2, 2, 2).round(3))
        form = b.rng.choice(["both", "min", "max"])
        ins = [x, b.const(lo) if form != "max" else "", b.const(hi) if form != "min" else ""]
        while ins[-1] == "":
            ins.pop()
        return b.node(op, ins)
    if op == "Softmax":
        r = len(b.shape[x])
        return b.node(op, [x], axis=-1 if b.int8 else int(b.rng.integers(-r, r)))
    return b.node(op, [x])


def _broadcast_partner(b: _Builder, shape) -> str:
    """A second operand broadcastable with `shape`: another tensor of the graph when one fits,
    else a constant whose shape drops leading axes and sets some to 1."""
    others = [t for t in b.shape if _broadcastable(b.shape[t], shape) and b.chance(0.5)]
    if others and b.chance(0.5):
        return others[-1]
    keep = int(b.rng.integers(0, len(shape) + 1))
    cshape = tuple(1 if b.chance(0.4) else d for d in shape[len(shape) - keep:])
    value = b.rng.uniform(-1.5, 1.5, cshape)
    return b.const(value.astype(np.float32))


def _broadcastable(a, b) -> bool:
    try:
        return np.broadcast_shapes(a, b) == tuple(b)  # the other operand must not grow x
    except ValueError:
        return False


def _op_binary(b: _Builder, op: str):
    x = b.pick()
    y = _broadcast_partner(b, b.shape[x])
    if op == "Div":  # a divisor kept away from zero: |y| + 0.5, or a constant in +-[0.5, 2]
        if y in b.shape:
            a = b.node("Abs", [y])
            y = a and b.node("Add", [a, b.const(0.5)])
            if y is None:
                return None
        else:
            y = b.const(np.sign(b.rng.uniform(-1, 1)) * b.rng.uniform(0.5, 2.0))
    return b.node(op, [y, x] if b.chance(0.3) and op != "Div" else [x, y])


def _op_matmul(b: _Builder):
    x = b.pick(lambda s: len(s) >= 2)
    if x is None:
        return None
    s = b.shape[x]
    k = s[-1]
    if not b.int8 and b.chance(0.3):  # both operands computed: x times a tensor [.., K, N]
        ys = [t for t in b.shape if len(b.shape[t]) >= 2 and b.shape[t][-2] == k and t != x]
        if ys:
            return b.node("MatMul", [x, ys[-1]])
        if len(s) == 2 and s[0] == s[1]:  # square: x @ x^T
            xt = b.node("Transpose", [x], perm=[1, 0])
            return xt and b.node("MatMul", [x, xt])
    return b.node("MatMul", [x, b.weights((k, b.dim(1, 12)), k)])


def _op_gemm(b: _Builder):
    x = b.pick(lambda s: len(s) == 2)
    if x is None:
        x = b.pick(lambda s: len(s) >= 2)
        if x is None:
            return None
        x = b.node("Flatten", [x], axis=1)
        if x is None:
            return None
    m, k = b.shape[x]
    trans_a = int(b.chance(0.15) and not b.int8)
    if trans_a:
        m, k = k, m
    n = b.dim(1, 12)
    trans_b = int(b.chance(0.5))
    w = b.weights((n, k) if trans_b else (k, n), k)
    ins = [x, w]
    cshape = [None, (n,), (1, n), (m, n), (1,)][int(b.rng.integers(0, 5))]
    if cshape is not None:
        ins.append(b.const(b.rng.uniform(-1, 1, cshape).astype(np.float32)))
    attrs = {"transA": trans_a, "transB": trans_b}
    if not b.int8 and b.chance(0.3):
        attrs.update(alpha=float(b.rng.choice([0.5, 2.0])), beta=float(b.rng.choice([0.5, 2.0])))
    return b.node("Gemm", ins, **attrs)


def _spatial(b: _Builder, ranks=(4,)):
    return b.pick(lambda s: len(s) in ranks)


def _op_conv(b: _Builder):
    x = _spatial(b, (3, 4) if not b.int8 else (4,))
    if x is None:
        return None
    s = b.shape[x]
    c, sp = s[1], s[2:]
    group = 1
    if c > 1 and b.chance(0.3):
        group = c if b.chance(0.6) else int(b.rng.choice([g for g in range(1, c + 1) if c % g == 0]))
    m = group * b.dim(1, 3) if group > 1 else b.dim(1, 8)
    k = [b.dim(1, min(3, d + 1)) for d in sp]
    if b.chance(0.4):
        k = [k[0]] * len(k)
    attrs = {"kernel_shape": k, "strides": [b.dim(1, 2) for _ in sp]}
    if b.chance(0.15):
        attrs["dilations"] = [b.dim(1, 2) for _ in sp]
    if b.int8:  # TFLite has SAME and VALID padding only (other pads: a writer refusal)
        attrs["auto_pad"] = str(b.rng.choice(["SAME_UPPER", "VALID", "NOTSET"]))
    elif b.chance(0.2):
        attrs["auto_pad"] = str(b.rng.choice(["SAME_UPPER", "SAME_LOWER", "VALID"]))
    else:
        attrs["pads"] = [b.dim(0, kk - 1) if kk > 1 else 0 for kk in k] * 2
        if b.chance(0.3):  # asymmetric
            attrs["pads"] = [b.dim(0, kk - 1) if kk > 1 else 0 for kk in k * 2]
    if group > 1:
        attrs["group"] = group
    fan_in = c // group * int(np.prod(k))
    ins = [x, b.weights((m, c // group, *k), fan_in)]
    if b.chance(0.7):
        ins.append(b.const(b.rng.uniform(-0.5, 0.5, m).astype(np.float32)))
    return b.node("Conv", ins, **attrs)


def _op_pool(b: _Builder, op: str):
    x = _spatial(b, (3, 4) if not b.int8 else (4,))
    if x is None:
        return None
    sp = b.shape[x][2:]
    k = [b.dim(1, min(3, d)) for d in sp]
    if b.chance(0.4):
        k = [min(k[0], d) for d in sp]
    attrs = {"kernel_shape": k, "strides": [b.dim(1, 2) for _ in sp]}
    if b.int8 and b.chance(0.5):
        attrs["auto_pad"] = "SAME_UPPER"
    elif b.chance(0.4) and not b.int8:
        attrs["pads"] = [b.dim(0, kk - 1) if kk > 1 else 0 for kk in k * 2]
    if op == "AveragePool" and b.chance(0.5):
        attrs["count_include_pad"] = 1
    if b.allow("ceil_mode") and b.chance(0.2):
        attrs["ceil_mode"] = 1
    if op == "MaxPool" and b.chance(0.1) and not b.int8:
        attrs["dilations"] = [b.dim(1, 2) for _ in sp]
    return b.node(op, [x], **attrs)


def _op_gap(b: _Builder):
    x = _spatial(b, (3, 4) if not b.int8 else (4,))
    return x and b.node("GlobalAveragePool", [x])


def _op_batchnorm(b: _Builder):
    x = _op_conv(b) if b.int8 else b.pick(lambda s: len(s) >= 2)
    if x is None:
        return None
    c = b.shape[x][1]
    scale = b.const(b.rng.uniform(0.5, 1.5, c).astype(np.float32))
    bias = b.const(b.rng.uniform(-0.5, 0.5, c).astype(np.float32))
    mean = b.const(b.rng.uniform(-0.5, 0.5, c).astype(np.float32))
    var = b.const(b.rng.uniform(0.25, 2.0, c).astype(np.float32))
    return b.node("BatchNormalization", [x, scale, bias, mean, var],
                  epsilon=float(b.rng.choice([1e-5, 1e-3])))


def _op_transpose(b: _Builder):
    x = b.pick(lambda s: len(s) >= 2)
    return x and b.node("Transpose", [x], perm=[int(p) for p in b.rng.permutation(len(b.shape[x]))])


def _op_reshape(b: _Builder):
    x = b.pick()
    s = b.shape[x]
    total = int(np.prod(s))
    dims = []
    rest = total
    for _ in range(int(b.rng.integers(1, 5)) - 1):
        divisors = [d for d in range(1, min(rest, 16) + 1) if rest % d == 0]
        d = int(b.rng.choice(divisors))
        dims.append(d)
        rest //= d
    dims.append(rest)
    b.rng.shuffle(dims)
    if b.chance(0.3):
        dims[int(b.rng.integers(0, len(dims)))] = -1
    elif b.chance(0.2) and len(dims) <= len(s) and dims[0] == s[0]:
        dims[0] = 0  # 0: copy the input's dimension
    return b.node("Reshape", [x, b.const(np.array(dims, np.int64), np.int64)])


def _op_flatten(b: _Builder):
    x = b.pick()
    r = len(b.shape[x])
    return b.node("Flatten", [x], axis=int(b.rng.integers(-r, r + 1)))


def _op_concat(b: _Builder):
    x = b.pick()
    s = b.shape[x]
    axis = int(b.rng.integers(0, len(s)))
    fits = [t for t in b.shape if t != x and len(b.shape[t]) == len(s)
            and all(d == e for i, (d, e) in enumerate(zip(b.shape[t], s)) if i != axis)]
    ins = [x]
    for _ in range(int(b.rng.integers(1, 3))):
        if fits and b.chance(0.6):
            ins.append(fits[int(b.rng.integers(0, len(fits)))])
        elif b.chance(0.3):
            ins.append(x)
        else:
            cs = list(s)
            cs[axis] = b.dim(1, 4)
            ins.append(b.const(b.rng.uniform(-1, 1, cs).astype(np.float32)))
    b.rng.shuffle(ins)
    return b.node("Concat", ins, axis=axis - len(s) if b.chance(0.3) else axis)


def _op_slice(b: _Builder):
    x = b.pick()
    s = b.shape[x]
    axes = sorted(b.rng.choice(len(s), size=int(b.rng.integers(1, len(s) + 1)), replace=False))
    starts, ends, steps = [], [], []
    for a in axes:
        d = s[a]
        step = int(b.rng.choice([1, 1, 1, 2, -1] if b.allow("slice_negative_step") else [1, 2]))
        lo = int(b.rng.integers(0, d))
        hi = int(b.rng.integers(lo + 1, d + 1))
        if step > 0:
            start, end = lo, hi
            if b.chance(0.2):
                end = d + 5  # past the end: clamped
            if b.chance(0.2):
                start -= d  # negative: counted from the end
        else:
            start, end = hi - 1, lo - 1
            if end < 0:
                end = -d - 1  # "before the first element"
        starts.append(start)
        ends.append(end)
        steps.append(step)
    ins = [x, b.const(np.array(starts, np.int64), np.int64),
           b.const(np.array(ends, np.int64), np.int64)]
    if b.chance(0.8):
        ins.append(b.const(np.array(axes, np.int64), np.int64))
        if any(st != 1 for st in steps) or b.chance(0.3):
            ins.append(b.const(np.array(steps, np.int64), np.int64))
    else:  # axes omitted: the first len(starts) axes, with steps 1
        ins[1] = b.const(np.array([0] * len(s), np.int64), np.int64)
        ins[2] = b.const(np.array([max(1, d - 1) for d in s], np.int64), np.int64)
    return b.node("Slice", ins)


def _op_pad(b: _Builder):
    x = b.pick()
    s = b.shape[x]
    mode = "constant" if b.int8 else str(b.rng.choice(["constant", "constant", "reflect", "edge"]))
    pads = []
    for d in s * 2:
        hi = min(2, d - 1) if mode == "reflect" else 2
        pads.append(b.dim(0, hi) if b.chance(0.6) else 0)
    if len(s) == 4 and b.chance(0.5):  # spatial padding only, the usual case
        pads = [0, 0, pads[2], pads[3], 0, 0, pads[6], pads[7]]
    ins = [x, b.const(np.array(pads, np.int64), np.int64)]
    if mode == "constant" and b.chance(0.5) and not b.int8:
        ins.append(b.const(np.float32(b.rng.uniform(-1, 1))))
    return b.node("Pad", ins, mode=mode)


def _op_squeeze(b: _Builder):
    x = b.pick(lambda s: 1 in s and len(s) >= 2)
    if x is None:
        return None
    ones = [i for i, d in enumerate(b.shape[x]) if d == 1]
    if b.chance(0.2):
        return b.node("Squeeze", [x])
    axes = sorted(b.rng.choice(ones, size=int(b.rng.integers(1, len(ones) + 1)), replace=False))
    axes = [int(a) - len(b.shape[x]) if b.chance(0.3) else int(a) for a in axes]
    return b.node("Squeeze", [x, b.const(np.array(axes, np.int64), np.int64)])


def _op_unsqueeze(b: _Builder):
    x = b.pick(lambda s: len(s) <= 3)
    if x is None:
        return None
    r = len(b.shape[x])
    axis = int(b.rng.integers(-(r + 1), r + 1))
    return b.node("Unsqueeze", [x, b.const(np.array([axis], np.int64), np.int64)])


def _op_reduce(b: _Builder, op: str):
    x = b.pick()
    r = len(b.shape[x])
    attrs = {"keepdims": int(b.chance(0.5))}
    if b.chance(0.85):
        n = int(b.rng.integers(1, r + 1))
        axes = sorted(int(a) for a in b.rng.choice(r, size=n, replace=False))
        attrs["axes"] = [a - r if b.chance(0.3) else a for a in axes]
    if not attrs["keepdims"] and len(attrs.get("axes", range(r))) == r:
        attrs["keepdims"] = 1  # keep at least rank 1
    return b.node(op, [x], **attrs)


GENERATORS = {
    **{op: (lambda op: lambda b: _op_binary(b, op))(op)
       for op in ("Add", "Sub", "Mul", "Div", "Max", "Min")},
    **{op: (lambda op: lambda b: _op_unary(b, op))(op)
       for op in ("Relu", "Sigmoid", "Tanh", "Abs", "Neg", "Exp", "SqrtAbs", "LeakyRelu", "Clip",
                  "Relu6", "Softmax")},
    "MatMul": _op_matmul, "Gemm": _op_gemm, "Conv": _op_conv,
    "MaxPool": lambda b: _op_pool(b, "MaxPool"), "AveragePool": lambda b: _op_pool(b, "AveragePool"),
    "GlobalAveragePool": _op_gap, "BatchNormalization": _op_batchnorm,
    "Transpose": _op_transpose, "Reshape": _op_reshape, "Flatten": _op_flatten,
    "Concat": _op_concat, "Slice": _op_slice, "Pad": _op_pad, "Squeeze": _op_squeeze,
    "Unsqueeze": _op_unsqueeze, "ReduceMean": lambda b: _op_reduce(b, "ReduceMean"),
    "ReduceMax": lambda b: _op_reduce(b, "ReduceMax"),
}


@dataclass
class Generated:
    model: bytes  # serialized ModelProto
    inputs: dict  # name -> float32 array of the input's shape
    seed: int
    int8: bool
    ops: tuple  # op_type of every node


def make_model(seed: int, int8: bool = False, exclude=()) -> Generated:
    """The graph of `seed` (the same every time): 2-12 nodes, finite and moderate values in
    onnxruntime on its inputs. `exclude`: generator features to leave out (see KNOWN)."""
    for attempt in range(50):
        g = _try_make(np.random.default_rng([seed, int(int8), attempt]), int8, exclude)
        if g is not None:
            return Generated(g[0].SerializeToString(), g[1], seed, int8,
                             tuple(n.op_type for n in g[0].graph.node))
    raise RuntimeError(f"fuzz: no usable graph for seed {seed} in 50 attempts")


def _try_make(rng, int8: bool, exclude):
    b = _Builder(rng, int8, exclude)
    x = b.add_input(_random_shape(b))
    nhwc = int8 and len(b.shape[x]) == 4 and b.chance(0.8)
    if nhwc:  # int8: NHWC at the edges (as Keras / tf2onnx export), so no layout transpose
        n, c, h, w = b.shape[x]  # is left for the .tflite (the TFLite writer has no TRANSPOSE)
        b.shape[x] = (n, h, w, c)
        b.node("Transpose", [x], perm=[0, 3, 1, 2])
    if b.chance(0.25):  # a second input: same shape, or a broadcastable one
        s = b.shape["x0"]
        b.add_input(s if b.chance(0.5) else tuple(1 if b.chance(0.5) else d for d in s))
    ops = INT8_OPS if int8 else FLOAT_OPS
    target = int(rng.integers(2, MAX_NODES + 1))
    for _ in range(4 * MAX_NODES):
        if len(b.nodes) >= target:
            break
        before = len(b.nodes)
        op = str(rng.choice(ops))
        if GENERATORS[op](b) is None:
            del b.nodes[before:]  # a composite op (Div, SqrtAbs, ...) half built
    if len(b.nodes) < 2:
        return None
    produced = [o for n in b.nodes for o in n.output]
    outputs = [t for t in produced if t not in b.consumed][-3:]  # at most the last three
    if nhwc:
        outputs = [b.node("Transpose", [t], perm=[0, 2, 3, 1]) or t
                   if len(b.shape[t]) == 4 else t for t in outputs]
    model = _prune_model(b.model(outputs))
    if not 2 <= len(model.graph.node) <= MAX_NODES:
        return None
    try:
        onnx.checker.check_model(model, full_check=True)
    except Exception:
        return None
    inputs = {v.name: rng.uniform(-2, 2, b.shape[v.name]).astype(np.float32)
              for v in model.graph.input}
    if not _values_sane(model, inputs, b.shape):
        return None
    return model, inputs


def _prune(nodes, outputs) -> list:
    """The nodes the outputs depend on."""
    need, kept = set(outputs), []
    for n in reversed(nodes):
        if need & set(n.output):
            kept.append(n)
            need.update(i for i in n.input if i)
    return kept[::-1]


def _prune_model(model):
    """Only the nodes, constants and inputs the outputs depend on."""
    g = model.graph
    nodes = _prune(list(g.node), [o.name for o in g.output])
    used = {i for n in nodes for i in n.input}
    inits = [t for t in g.initializer if t.name in used]
    inputs = [v for v in g.input if v.name in used]
    new = helper.make_graph(nodes, g.name, inputs, list(g.output), inits)
    return helper.make_model(new, opset_imports=list(model.opset_import),
                             producer_name=model.producer_name, ir_version=IR_VERSION)


def _values_sane(model, inputs, shapes) -> bool:
    """Every tensor finite and below HUGE in onnxruntime."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    have = {o.name for o in m.graph.output}
    for n in m.graph.node:
        for o in n.output:
            if o not in have:
                m.graph.output.append(helper.make_tensor_value_info(o, TensorProto.FLOAT,
                                                                    shapes[o]))
    try:
        outs = ort_run(m.SerializeToString(), inputs)
    except Exception:
        return False
    return all(np.isfinite(v).all() and np.abs(v).max(initial=0) < HUGE for v in outs.values())


# ---- the references ---------------------------------------------------------------------

def ort_run(model: bytes, inputs: dict) -> dict:
    """onnxruntime's outputs by name (one thread, graph optimizations off: the plain kernels)."""
    import onnxruntime as ort
    ort.set_default_logger_severity(4)  # a graph it rejects is drawn again: no log needed
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.inter_op_num_threads = 1
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.log_severity_level = 4
    sess = ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    return dict(zip(names, sess.run(names, inputs)))


def float64_run(model: bytes, inputs: dict) -> dict | None:
    """The graph evaluated in float64 by onnx.reference (every float constant and value made
    double), or None when that is not possible."""
    from onnx.reference import ReferenceEvaluator
    m = onnx.load_from_string(model)
    for t in m.graph.initializer:
        if t.data_type == TensorProto.FLOAT:
            t.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(t).astype(np.float64),
                                               t.name))
    for v in list(m.graph.input) + list(m.graph.output):
        v.type.tensor_type.elem_type = TensorProto.DOUBLE
    try:
        ref = ReferenceEvaluator(m)
        names = [o.name for o in m.graph.output]
        outs = ref.run(names, {k: v.astype(np.float64) for k, v in inputs.items()})
        return dict(zip(names, outs))
    except Exception:
        return None
