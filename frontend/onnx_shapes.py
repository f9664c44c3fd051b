"""Static output shapes of the ONNX operators mcuforge converts, computed from the input shapes,
constant inputs and attributes (ONNX's rules, with onnxruntime's where they differ: ceil-mode
pooling drops a window that would start in the end padding).

onnx.shape_inference cannot be trusted alone: it sees no folded initializer of an IR < 4 model,
gives up on shapes computed at run time by Shape chains, and accepts operands that do not fit.
`output_shapes` checks the operands against each other (ShapeError names what disagrees) and
gives each output's shape, or None where it depends on a value not known at compile time.
"""
from __future__ import annotations

import math

import numpy as np


class ShapeError(Exception):
    """The node's operand shapes or attributes do not fit together."""


class In:
    """What a shape function sees of one input: its shape (None if unknown) and its constant
    value (None unless known at compile time)."""

    def __init__(self, shape, value=None):
        self.shape = None if shape is None else tuple(int(d) for d in shape)
        self.value = value


SHAPES: dict = {}  # op_type -> fn(ins, attrs, opset) -> [shape or None per output]


def shape_fn(*ops):
    def register(fn):
        for op in ops:
            SHAPES[op] = fn
        return fn
    return register


def output_shapes(op_type: str, ins: list, attrs: dict, opset: int, n_outputs: int = 1):
    """[shape or None] per output, or None when the op has no shape function or an input
    shape it needs is unknown."""
    fn = SHAPES.get(op_type)
    if fn is None:
        return None
    try:
        out = fn(ins, {**attrs, "_op": op_type, "_n_outputs": n_outputs}, opset)
    except _Unknown:
        return None
    return [None if s is None else tuple(int(d) for d in s) for s in out]


class _Unknown(Exception):
    pass


def _shape(ins, i, required=True):
    """The shape of input i; None when absent and optional; _Unknown when not known."""
    if i >= len(ins) or ins[i] is None:
        if required:
            raise ShapeError(f"input {i} is missing")
        return None
    if ins[i].shape is None:
        raise _Unknown
    return ins[i].shape


def _value(ins, i):
    """The constant value of input i (flattened ints), None when absent; _Unknown when computed
    at run time."""
    if i >= len(ins) or ins[i] is None:
        return None
    if ins[i].value is None:
        raise _Unknown
    return [int(v) for v in np.asarray(ins[i].value).reshape(-1)]


def _axis(a: int, rank: int, what: str = "axis") -> int:
    if not -rank <= a < max(rank, 1):
        raise ShapeError(f"{what} {a} is out of range for rank {rank}")
    return a % max(rank, 1)


def broadcast(*shapes) -> tuple:
    """numpy broadcasting of the shapes; ShapeError when they do not broadcast."""
    rank = max(len(s) for s in shapes)
    out = []
    for k in range(rank):
        dims = {s[k - rank + len(s)] for s in shapes if k - rank + len(s) >= 0}
        dims.discard(1)
        if len(dims) > 1:
            raise ShapeError("shapes " + " and ".join(str(list(s)) for s in shapes)
                             + " do not broadcast")
        out.append(dims.pop() if dims else 1)
    return tuple(out)


# ---- elementwise ---------------------------------------------------------------------------

_SAME = ("Abs", "Ceil", "Celu", "Clip", "Cos", "Elu", "Erf", "Exp", "Floor", "Gelu",
         "HardSigmoid", "HardSwish", "Identity", "LeakyRelu", "Log", "Neg", "Not", "Reciprocal",
         "Relu", "Round", "Selu", "Sigmoid", "Sign", "Sin", "Softplus", "Softsign", "Sqrt",
         "Tanh", "Cast", "CastLike", "Softmax", "LogSoftmax", "Hardmax", "CumSum",
         "QuantizeLinear", "DequantizeLinear", "QLinearSigmoid", "QLinearLeakyRelu",
         "QLinearSoftmax", "Dropout")


@shape_fn(*_SAME)
def _same(ins, attrs, opset):
    x = _shape(ins, 0)
    return [x, x]  # Dropout's mask has x's shape too


@shape_fn("Add", "Sub", "Mul", "Div", "Pow", "Mod", "And", "Or", "Xor", "Equal", "Greater",
          "GreaterOrEqual", "Less", "LessOrEqual", "Max", "Min", "Mean", "Sum", "Where",
          "PRelu")
def _broadcasting(ins, attrs, opset):
    return [broadcast(*[_shape(ins, i) for i in range(len(ins)) if ins[i] is not None])]


@shape_fn("QLinearAdd", "QLinearMul")
def _q_binary(ins, attrs, opset):
    return [broadcast(_shape(ins, 0), _shape(ins, 3))]


@shape_fn("QLinearWhere")
def _q_where(ins, attrs, opset):
    return [broadcast(_shape(ins, 0), _shape(ins, 1), _shape(ins, 4))]


# ---- layers --------------------------------------------------------------------------------

def _batch_channels_space(x: tuple, what: str) -> None:
    """x is [N, C, spatial...] with at least one spatial dimension (conv, pool layouts)."""
    if len(x) < 3:
        raise ShapeError(f"{what} needs an input [N, C, spatial...], not {list(x)}")


def _window_out(x: tuple, kernel, attrs, ceil: bool = False) -> list:
    """Spatial output sizes of a sliding window (conv, pool) over x's dims 2.."""
    n = len(x) - 2
    if n < 1:
        raise ShapeError(f"a rank-{len(x)} input has no spatial dimensions")
    kernel = list(kernel)
    if len(kernel) != n:
        raise ShapeError(f"kernel {kernel} for {n} spatial dimensions")
    s = list(attrs.get("strides") or [1] * n)
    d = list(attrs.get("dilations") or [1] * n)
    pads = list(attrs.get("pads") or [0] * 2 * n)
    if len(s) != n or len(d) != n or len(pads) != 2 * n:
        raise ShapeError(f"strides {s}, dilations {d} or pads {pads} do not fit "
                         f"{n} spatial dimensions")
    if min(s) < 1 or min(d) < 1 or min(kernel) < 1:
        raise ShapeError(f"kernel {kernel}, strides {s} and dilations {d} must be positive")
    auto_pad = attrs.get("auto_pad", "NOTSET")
    out = []
    for i in range(n):
        size, span = x[2 + i], (kernel[i] - 1) * d[i] + 1
        if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
            out.append(-(-size // s[i]))
            continue
        pb, pe = (0, 0) if auto_pad == "VALID" else (pads[i], pads[i + n])
        room = size + pb + pe - span
        if room < 0:
            raise ShapeError(f"the window ({span} wide) is larger than the padded input "
                             f"({size + pb + pe}) along spatial axis {i}")
        o = (-(-room // s[i]) if ceil else room // s[i]) + 1
        if ceil and (o - 1) * s[i] >= size + pb:
            o -= 1  # the last window would start in the end padding: onnxruntime drops it
        out.append(o)
    return out


def _conv(x, w, b, attrs):
    _batch_channels_space(x, "a convolution")
    if len(w) != len(x):
        raise ShapeError(f"weight {list(w)} and input {list(x)} differ in rank")
    group = int(attrs.get("group", 1))
    if group < 1 or x[1] != w[1] * group or w[0] % group:
        raise ShapeError(f"input {list(x)} has {x[1]} channels; weight {list(w)} with "
                         f"group {group} needs {w[1] * group} (and {w[0]} output channels "
                         f"divisible by the group)")
    if attrs.get("kernel_shape") is not None and list(attrs["kernel_shape"]) != list(w[2:]):
        raise ShapeError(f"kernel_shape {list(attrs['kernel_shape'])} differs from the "
                         f"weight's {list(w[2:])}")
    if b is not None and tuple(b) != (w[0],):
        raise ShapeError(f"bias {list(b)} for {w[0]} output channels")
    return [(x[0], w[0], *_window_out(x, w[2:], attrs))]


@shape_fn("Conv")
def _conv_shape(ins, attrs, opset):
    return _conv(_shape(ins, 0), _shape(ins, 1), _shape(ins, 2, False), attrs)


@shape_fn("QLinearConv")
def _qconv_shape(ins, attrs, opset):
    return _conv(_shape(ins, 0), _shape(ins, 3), _shape(ins, 8, False), attrs)


@shape_fn("ConvTranspose")
def _conv_transpose(ins, attrs, opset):
    x, w, b = _shape(ins, 0), _shape(ins, 1), _shape(ins, 2, False)
    _batch_channels_space(x, "ConvTranspose")
    n = len(x) - 2
    group = int(attrs.get("group", 1))
    if len(w) != len(x) or x[1] != w[0] or n < 1:
        raise ShapeError(f"input {list(x)} has {x[1]} channels; weight {list(w)} needs {w[0]}")
    if b is not None and tuple(b) != (w[1] * group,):
        raise ShapeError(f"bias {list(b)} for {w[1] * group} output channels")
    if attrs.get("output_shape") is not None:
        sp = list(attrs["output_shape"])[-n:]
    else:
        s = list(attrs.get("strides") or [1] * n)
        d = list(attrs.get("dilations") or [1] * n)
        op = list(attrs.get("output_padding") or [0] * n)
        pads = list(attrs.get("pads") or [0] * 2 * n)
        auto_pad = attrs.get("auto_pad", "NOTSET")
        sp = []
        for i in range(n):
            if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
                sp.append(x[2 + i] * s[i])
            else:
                pb, pe = (0, 0) if auto_pad == "VALID" else (pads[i], pads[i + n])
                sp.append(s[i] * (x[2 + i] - 1) + op[i] + (w[2 + i] - 1) * d[i] + 1 - pb - pe)
    if min(sp) < 1:
        raise ShapeError(f"the output would be {sp} (pads larger than the result)")
    return [(x[0], w[1] * group, *sp)]


@shape_fn("MaxPool", "AveragePool", "QLinearAveragePool")
def _pool(ins, attrs, opset):
    x = _shape(ins, 0)
    if attrs.get("channels_last"):
        raise _Unknown
    _batch_channels_space(x, "a pool")
    if attrs.get("kernel_shape") is None:
        raise ShapeError("kernel_shape is missing")
    y = (x[0], x[1], *_window_out(x, attrs["kernel_shape"], attrs,
                                  bool(attrs.get("ceil_mode", 0))))
    return [y, y]  # MaxPool's Indices: Y's shape


@shape_fn("GlobalAveragePool", "GlobalMaxPool", "QLinearGlobalAveragePool")
def _global_pool(ins, attrs, opset):
    x = _shape(ins, 0)
    if len(x) < 3:
        raise ShapeError(f"a rank-{len(x)} input has no spatial dimensions")
    if attrs.get("channels_last"):
        return [(x[0], *[1] * (len(x) - 2), x[-1])]
    return [(x[0], x[1], *[1] * (len(x) - 2))]


def matmul(a: tuple, b: tuple) -> tuple:
    """numpy.matmul's result shape (1-D operands promoted and the added axis dropped)."""
    if not a or not b:
        raise ShapeError("MatMul of a scalar")
    a2, b2 = (1, *a) if len(a) == 1 else a, (*b, 1) if len(b) == 1 else b
    if a2[-1] != b2[-2]:
        raise ShapeError(f"inner dimensions differ: {list(a)} @ {list(b)}")
    out = (*broadcast(a2[:-2], b2[:-2]), a2[-2], b2[-1])
    if len(a) == 1:
        out = out[:-2] + out[-1:]
    if len(b) == 1:
        out = out[:-1]
    return out


@shape_fn("MatMul")
def _matmul(ins, attrs, opset):
    return [matmul(_shape(ins, 0), _shape(ins, 1))]


@shape_fn("QLinearMatMul")
def _qmatmul(ins, attrs, opset):
    return [matmul(_shape(ins, 0), _shape(ins, 3))]


def _gemm(a, b, c, attrs):
    if len(a) != 2 or len(b) != 2:
        raise ShapeError(f"Gemm of {list(a)} and {list(b)}: both must be 2-D")
    (m, k) = a[::-1] if attrs.get("transA") else a
    (k2, n) = b[::-1] if attrs.get("transB") else b
    if k != k2:
        raise ShapeError(f"inner dimensions differ: {k} (A {list(a)}) and {k2} (B {list(b)})")
    if c is not None and broadcast(c, (m, n)) != (m, n):
        raise ShapeError(f"C {list(c)} does not broadcast to [{m}, {n}]")
    return [(m, n)]


@shape_fn("Gemm")
def _gemm_shape(ins, attrs, opset):
    return _gemm(_shape(ins, 0), _shape(ins, 1), _shape(ins, 2, False), attrs)


@shape_fn("QGemm")
def _qgemm_shape(ins, attrs, opset):
    return _gemm(_shape(ins, 0), _shape(ins, 3), _shape(ins, 6, False), attrs)


def _channel_params(ins, first: int, what: str):
    x = _shape(ins, 0)
    c = x[1] if len(x) > 1 else 1
    for i in range(first, len(ins)):
        p = _shape(ins, i, False)
        if p is not None and tuple(p) != (c,):
            raise ShapeError(f"{what} input {i} has shape {list(p)}, not [{c}] (the channels)")
    return x


@shape_fn("BatchNormalization")
def _batch_norm(ins, attrs, opset):
    x = _channel_params(ins, 1, "BatchNormalization")
    if len(x) < 2:
        raise ShapeError(f"BatchNormalization needs an input [N, C, ...], not {list(x)}")
    return [x, (x[1],), (x[1],), (x[1],), (x[1],)]


@shape_fn("InstanceNormalization")
def _instance_norm(ins, attrs, opset):
    return [_channel_params(ins, 1, "InstanceNormalization")]


@shape_fn("LayerNormalization")
def _layer_norm(ins, attrs, opset):
    x = _shape(ins, 0)
    axis = _axis(int(attrs.get("axis", -1)), len(x))
    for i in (1, 2):
        p = _shape(ins, i, False)
        if p is not None and broadcast(p, x[axis:]) != tuple(x[axis:]):
            raise ShapeError(f"input {i} {list(p)} does not broadcast to {list(x[axis:])}")
    stat = (*x[:axis], *[1] * (len(x) - axis))
    return [x, stat, stat]


def _recurrent(ins, attrs, gates: int):
    x, w = _shape(ins, 0), _shape(ins, 1)
    if len(x) != 3 or len(w) != 3:
        raise ShapeError(f"X {list(x)} and W {list(w)} must be 3-D")
    layout = int(attrs.get("layout", 0))
    seq, batch = (x[1], x[0]) if layout else (x[0], x[1])
    dirs = 2 if attrs.get("direction", "forward") == "bidirectional" else 1
    hidden = int(attrs.get("hidden_size") or w[1] // gates)
    if w != (dirs, gates * hidden, x[2]):
        raise ShapeError(f"W {list(w)} for {dirs} direction(s), {gates} gates of "
                         f"{hidden} and input size {x[2]}")
    r = _shape(ins, 2)
    if r != (dirs, gates * hidden, hidden):
        raise ShapeError(f"R {list(r)} for {dirs} direction(s), {gates} gates of {hidden}")
    y = (batch, seq, dirs, hidden) if layout else (seq, dirs, batch, hidden)
    state = (batch, dirs, hidden) if layout else (dirs, batch, hidden)
    return [y, state, state]


@shape_fn("LSTM")
def _lstm(ins, attrs, opset):
    return _recurrent(ins, attrs, 4)


@shape_fn("GRU")
def _gru(ins, attrs, opset):
    return _recurrent(ins, attrs, 3)


# ---- data movement -------------------------------------------------------------------------

@shape_fn("Reshape")
def _reshape(ins, attrs, opset):
    x = _shape(ins, 0)
    target = list(attrs["shape"]) if opset < 5 and "shape" in attrs else _value(ins, 1)
    if target is None:
        raise ShapeError("Reshape has no shape")
    allowzero = int(attrs.get("allowzero", 0))
    out = [x[i] if v == 0 and not allowzero and i < len(x) else v for i, v in enumerate(target)]
    size = int(np.prod(x, dtype=np.int64))
    if out.count(-1) > 1 or any(v < -1 for v in out):
        raise ShapeError(f"shape {target} is not a valid Reshape target")
    if -1 in out:
        rest = int(np.prod([v for v in out if v != -1], dtype=np.int64))
        if rest == 0 or size % rest:
            raise ShapeError(f"cannot reshape {list(x)} to {target}")
        out[out.index(-1)] = size // rest
    if int(np.prod(out, dtype=np.int64)) != size:
        raise ShapeError(f"cannot reshape {list(x)} ({size} elements) to {target}")
    return [out]


@shape_fn("Flatten")
def _flatten(ins, attrs, opset):
    x = _shape(ins, 0)
    axis = int(attrs.get("axis", 1))
    if not -len(x) <= axis <= len(x):
        raise ShapeError(f"axis {axis} is out of range for rank {len(x)}")
    axis += len(x) if axis < 0 else 0
    return [(int(np.prod(x[:axis], dtype=np.int64)), int(np.prod(x[axis:], dtype=np.int64)))]


@shape_fn("Transpose")
def _transpose(ins, attrs, opset):
    x = _shape(ins, 0)
    perm = list(attrs.get("perm") or range(len(x) - 1, -1, -1))
    if sorted(perm) != list(range(len(x))):
        raise ShapeError(f"perm {perm} is not a permutation of {len(x)} axes")
    return [tuple(x[p] for p in perm)]


def _axes(ins, attrs, opset, since: int, pos: int = 1):
    """Axes from the attribute (before opset `since`) or the input at `pos`."""
    if opset < since:
        a = attrs.get("axes")
        return None if a is None else list(a)
    return _value(ins, pos)


@shape_fn("Squeeze")
def _squeeze(ins, attrs, opset):
    x = _shape(ins, 0)
    axes = _axes(ins, attrs, opset, 13)
    if axes is None:
        return [tuple(d for d in x if d != 1)]
    axes = {_axis(a, len(x)) for a in axes}
    if any(x[a] != 1 for a in axes):
        raise ShapeError(f"cannot squeeze axes {sorted(axes)} of {list(x)}: not of size 1")
    return [tuple(d for i, d in enumerate(x) if i not in axes)]


@shape_fn("Unsqueeze")
def _unsqueeze(ins, attrs, opset):
    x = _shape(ins, 0)
    axes = _axes(ins, attrs, opset, 13)
    if axes is None:
        raise ShapeError("Unsqueeze has no axes")
    rank = len(x) + len(axes)
    axes = sorted({_axis(a, rank) for a in axes})
    out, it = [], iter(x)
    for i in range(rank):
        out.append(1 if i in axes else next(it))
    return [out]


@shape_fn("Concat")
def _concat(ins, attrs, opset):
    return [_concat_shapes([_shape(ins, i) for i in range(len(ins)) if ins[i] is not None],
                           int(attrs.get("axis", 1)))]


@shape_fn("QLinearConcat")
def _qconcat(ins, attrs, opset):
    return [_concat_shapes([_shape(ins, i) for i in range(2, len(ins), 3)],
                           int(attrs.get("axis", 1)))]


def _concat_shapes(shapes, axis):
    rank = len(shapes[0])
    axis = _axis(axis, rank)
    for s in shapes:
        if len(s) != rank or any(s[k] != shapes[0][k] for k in range(rank) if k != axis):
            raise ShapeError("inputs " + ", ".join(str(list(t)) for t in shapes)
                             + f" differ outside axis {axis}")
    return (*shapes[0][:axis], sum(s[axis] for s in shapes), *shapes[0][axis + 1:])


@shape_fn("Split")
def _split(ins, attrs, opset):
    x = _shape(ins, 0)
    axis = _axis(int(attrs.get("axis", 0)), len(x))
    split = list(attrs["split"]) if opset < 13 and attrs.get("split") is not None \
        else _value(ins, 1)
    n = attrs.get("_n_outputs", 1)
    if split is None:
        parts = int(attrs.get("num_outputs", n))
        size = -(-x[axis] // parts)
        split = [min(size, x[axis] - size * k) for k in range(parts)]
        if opset < 18 and x[axis] % parts:
            raise ShapeError(f"axis {axis} of {list(x)} does not split into {parts} equal parts")
    if sum(split) != x[axis] or min(split) < 0:
        raise ShapeError(f"split {split} does not add up to {x[axis]} (axis {axis} of {list(x)})")
    return [(*x[:axis], p, *x[axis + 1:]) for p in split]


@shape_fn("Slice")
def _slice(ins, attrs, opset):
    x = _shape(ins, 0)
    if opset < 10:
        starts, ends = list(attrs["starts"]), list(attrs["ends"])
        axes, steps = attrs.get("axes"), None
    else:
        starts, ends, axes, steps = (_value(ins, i) for i in (1, 2, 3, 4))
    axes = list(axes) if axes is not None else list(range(len(starts)))
    steps = steps or [1] * len(starts)
    if not len(starts) == len(ends) == len(axes) == len(steps) or 0 in steps:
        raise ShapeError(f"starts {starts}, ends {ends}, axes {axes}, steps {steps} do not fit")
    out = list(x)
    for st, en, ax, sp in zip(starts, ends, axes, steps):
        ax = _axis(ax, len(x))
        out[ax] = len(range(*slice(st, en, sp).indices(x[ax])))  # ONNX clamps as Python does
    return [out]


@shape_fn("Gather")
def _gather(ins, attrs, opset):
    x, idx = _shape(ins, 0), _shape(ins, 1)
    axis = _axis(int(attrs.get("axis", 0)), len(x))
    return [(*x[:axis], *idx, *x[axis + 1:])]


@shape_fn("GatherElements")
def _gather_elements(ins, attrs, opset):
    x, idx = _shape(ins, 0), _shape(ins, 1)
    if len(x) != len(idx):
        raise ShapeError(f"indices {list(idx)} and data {list(x)} differ in rank")
    return [idx]


@shape_fn("Expand")
def _expand(ins, attrs, opset):
    return [broadcast(_shape(ins, 0), tuple(_value(ins, 1)))]


@shape_fn("Tile")
def _tile(ins, attrs, opset):
    x, reps = _shape(ins, 0), _value(ins, 1)
    if len(reps) != len(x) or min(reps, default=0) < 0:
        raise ShapeError(f"repeats {reps} for a rank-{len(x)} input")
    return [tuple(d * r for d, r in zip(x, reps))]


@shape_fn("Pad")
def _pad(ins, attrs, opset):
    x = _shape(ins, 0)
    if opset < 11:
        pads = list(attrs.get("pads", attrs.get("paddings", [])))
        axes = None
    else:
        pads, axes = _value(ins, 1), _value(ins, 3)
    axes = [_axis(a, len(x)) for a in axes] if axes is not None else list(range(len(x)))
    if len(pads) != 2 * len(axes):
        raise ShapeError(f"pads {pads} for {len(axes)} axes")
    out = list(x)
    for k, a in enumerate(axes):
        out[a] += pads[k] + pads[k + len(axes)]
    if min(out) < 1:
        raise ShapeError(f"pads {pads} leave nothing of {list(x)}")
    return [out]


@shape_fn("DepthToSpace")
def _depth_to_space(ins, attrs, opset):
    x, b = _shape(ins, 0), int(attrs.get("blocksize", 0))
    if len(x) != 4 or b < 1 or x[1] % (b * b):
        raise ShapeError(f"blocksize {b} does not divide the channels of {list(x)}")
    return [(x[0], x[1] // (b * b), x[2] * b, x[3] * b)]


@shape_fn("SpaceToDepth")
def _space_to_depth(ins, attrs, opset):
    x, b = _shape(ins, 0), int(attrs.get("blocksize", 0))
    if len(x) != 4 or b < 1 or x[2] % b or x[3] % b:
        raise ShapeError(f"blocksize {b} does not divide the plane of {list(x)}")
    return [(x[0], x[1] * b * b, x[2] // b, x[3] // b)]


@shape_fn("Resize", "Upsample")
def _resize(ins, attrs, opset):
    x = _shape(ins, 0)
    if attrs.get("axes") is not None or attrs.get("keep_aspect_ratio_policy",
                                                   "stretch") != "stretch":
        raise _Unknown
    if opset < 9 and "scales" in attrs:  # Upsample-7: an attribute
        scales = list(attrs["scales"])
    else:
        pos_scales = 1 if opset < 11 else 2
        sizes = _value(ins, 3) if opset >= 11 and len(ins) > 3 and ins[3] is not None else None
        if sizes:
            if len(sizes) != len(x):
                raise ShapeError(f"sizes {sizes} for a rank-{len(x)} input")
            return [sizes]
        if pos_scales >= len(ins) or ins[pos_scales] is None \
                or ins[pos_scales].value is None:
            raise _Unknown
        scales = [float(v) for v in np.asarray(ins[pos_scales].value).reshape(-1)]
    if len(scales) != len(x):
        raise ShapeError(f"scales {scales} for a rank-{len(x)} input")
    return [tuple(int(math.floor(d * s)) for d, s in zip(x, scales))]


_REDUCE_INPUT_AXES = {"ReduceSum": 13}  # the others take axes as an input from opset 18


@shape_fn("ReduceL1", "ReduceL2", "ReduceLogSum", "ReduceLogSumExp", "ReduceMax", "ReduceMean",
          "ReduceMin", "ReduceProd", "ReduceSum", "ReduceSumSquare")
def _reduce(ins, attrs, opset):
    x = _shape(ins, 0)
    axes = _axes(ins, attrs, opset, _REDUCE_INPUT_AXES.get(attrs.get("_op"), 18))
    if not axes:
        if attrs.get("noop_with_empty_axes"):
            return [x]
        axes = range(len(x))
    axes = {_axis(a, len(x)) for a in axes}
    keep = int(attrs.get("keepdims", 1))
    return [tuple(1 if i in axes else d for i, d in enumerate(x) if keep or i not in axes)]


@shape_fn("ArgMax", "ArgMin")
def _arg_reduce(ins, attrs, opset):
    x = _shape(ins, 0)
    axis = _axis(int(attrs.get("axis", 0)), len(x))
    keep = int(attrs.get("keepdims", 1))
    return [tuple(1 if i == axis else d for i, d in enumerate(x) if keep or i != axis)]


# ---- element types (ONNX TensorProto numbers) of outputs onnx's inference left untyped ------

_BOOL = ("Equal", "Greater", "GreaterOrEqual", "Less", "LessOrEqual", "Not", "And", "Or", "Xor")
_OUT_ZP = {"QLinearConv": 7, "QLinearMatMul": 7, "QGemm": 8, "QLinearAdd": 7, "QLinearMul": 7,
           "QLinearAveragePool": 4, "QLinearGlobalAveragePool": 4, "QLinearConcat": 1,
           "QLinearSigmoid": 4, "QLinearLeakyRelu": 4, "QLinearSoftmax": 4, "QLinearWhere": 8}


def output_elem(op_type: str, elems: list, attrs: dict):
    """The element type of the node's first outputs from its inputs' (None where unknown)."""
    first = next((e for e in elems if e), None)
    if op_type in _BOOL:
        return 9
    if op_type in ("ArgMax", "ArgMin", "Shape", "Size"):
        return 7
    if op_type == "Cast":
        return int(attrs["to"])
    if op_type == "CastLike":
        return elems[1] if len(elems) > 1 else None
    if op_type == "Where":
        return elems[1] if len(elems) > 1 else None
    if op_type == "DequantizeLinear":
        return elems[1] if len(elems) > 1 else 1
    if op_type == "QuantizeLinear":
        return elems[2] if len(elems) > 2 and elems[2] else 2
    if op_type in _OUT_ZP:
        k = _OUT_ZP[op_type]
        if op_type == "QGemm" and (len(elems) <= k or not elems[k]):
            return 1  # no output quantization: float
        return elems[k] if k < len(elems) else None
    return first
