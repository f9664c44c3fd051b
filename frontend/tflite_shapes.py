"""Static shapes for TFLite models with dynamic dimensions (-1 in shape_signature).

A converter stores a placeholder (usually 1) in `shape` where `shape_signature` says -1, so once
the inputs' shapes are fixed (by `--input-shape`, or a dynamic batch taken as 1) every other
activation's shape must be recomputed. `infer_shapes` walks subgraph 0's operators in order and
computes each output's shape from its inputs, for the operators of image and sequence models;
small int32/int64 tensors of shape arithmetic (SHAPE -> STRIDED_SLICE -> PACK -> RESHAPE) are
evaluated along the way so their consumers know the values. An operator without a rule keeps
its stored output shapes only when its inputs kept theirs; otherwise it is a ModelError naming
it (mcuforge cannot know its shape).
"""
from __future__ import annotations

import numpy as np
import tflite

from mcuforge.ir.errors import ModelError

from .input_shapes import check_input_shapes

from .tflite_ops import _defaults, resolve_padding

SAME_SHAPE = {
    "LOGISTIC", "TANH", "RELU", "RELU6", "RELU_N1_TO_1", "RELU_0_TO_1", "HARD_SWISH",
    "LEAKY_RELU", "PRELU", "SOFTMAX", "LOG_SOFTMAX", "QUANTIZE", "DEQUANTIZE", "CAST", "ABS",
    "NEG", "EXP", "LOG", "SQRT", "RSQRT", "SQUARE", "SIN", "COS", "FLOOR", "CEIL", "ROUND",
    "ELU", "GELU", "L2_NORMALIZATION", "LOCAL_RESPONSE_NORMALIZATION", "ZEROS_LIKE",
    "ONES_LIKE", "LOGICAL_NOT", "SIGN",
}
BROADCAST = {
    "ADD", "SUB", "MUL", "DIV", "MAXIMUM", "MINIMUM", "SQUARED_DIFFERENCE", "POW", "FLOOR_DIV",
    "FLOOR_MOD", "EQUAL", "NOT_EQUAL", "LESS", "LESS_EQUAL", "GREATER", "GREATER_EQUAL",
    "LOGICAL_AND", "LOGICAL_OR",
}
_OP_NAMES = {v: k for k, v in vars(tflite.BuiltinOperator).items() if not k.startswith("_")}
_INT_FNS = {"ADD": np.add, "SUB": np.subtract, "MUL": np.multiply, "MAXIMUM": np.maximum,
            "MINIMUM": np.minimum, "FLOOR_DIV": np.floor_divide}


def is_dynamic(raw_tensors, inputs) -> bool:
    """Whether any model input has a -1 in its shape signature."""
    for i in inputs:
        t = raw_tensors[i]
        if t.ShapeSignatureLength() and (t.ShapeSignatureAsNumpy() == -1).any():
            return True
    return False


def input_shape(raw, name, given) -> tuple:
    """The shape of a model input: `given` (from --input-shape) checked against the signature's
    static dims, else the signature with a dynamic batch (axis 0) taken as 1."""
    stored = tuple(int(d) for d in raw.ShapeAsNumpy()) if raw.ShapeLength() else ()
    sig = ([int(d) for d in raw.ShapeSignatureAsNumpy()] if raw.ShapeSignatureLength()
           else list(stored))
    if given is not None:  # names, ranks and static dims: checked by infer_shapes
        given = tuple(int(d) for d in given)
        if min(given, default=1) < 1:
            raise ModelError(f"--input-shape {name}={','.join(map(str, given))}: every "
                             "dimension must be at least 1")
        return given
    if any(d == -1 for d in sig[1:]):
        raise ModelError(f"input '{name}' has dynamic shape {sig}; give its shape with "
                         f"--input-shape {name}=" + ",".join("N" if d == -1 else str(d)
                                                             for d in sig))
    return tuple(1 if d == -1 else d for d in sig)


class _Op:
    def __init__(self, model, raw, shapes, values):
        c = model.OperatorCodes(raw.OpcodeIndex())
        self.code = _OP_NAMES.get(max(c.BuiltinCode(), c.DeprecatedBuiltinCode()), "CUSTOM")
        self.raw, self.shapes, self.values = raw, shapes, values
        self.ins = [int(j) for j in (raw.InputsAsNumpy() if raw.InputsLength() else [])]
        self.outs = [int(j) for j in (raw.OutputsAsNumpy() if raw.OutputsLength() else [])]

    def shape(self, k):
        return self.shapes[self.ins[k]]

    def value(self, k):
        v = self.values.get(self.ins[k]) if k < len(self.ins) and self.ins[k] >= 0 else None
        if v is None:
            raise _Unknown(f"operand {k} of {self.code} is computed at run time")
        return v

    def options(self, cls):
        table = self.raw.BuiltinOptions()
        if table is None:
            return _defaults(cls)  # the schema's defaults, as the converters read them
        opts = cls()
        opts.Init(table.Bytes, table.Pos)
        return opts


class _Unknown(Exception):
    pass


def infer_shapes(model, sg, raw_tensors, names, input_shapes, data_of) -> dict:
    """{tensor index: shape} for subgraph `sg` with its inputs' shapes fixed; data_of(i) gives
    tensor i's constant data or None."""
    given = dict(input_shapes or {})
    declared = {}
    for i in (int(j) for j in sg.InputsAsNumpy()):
        t = raw_tensors[i]
        dims = t.ShapeSignatureAsNumpy() if t.ShapeSignatureLength() else t.ShapeAsNumpy()
        declared[names[i]] = [None if int(d) < 0 else int(d)
                              for d in (dims if t.ShapeLength() else [])]
    check_input_shapes(declared, given)
    shapes, values = {}, {}
    for i, t in enumerate(raw_tensors):
        shapes[i] = tuple(int(d) for d in t.ShapeAsNumpy()) if t.ShapeLength() else ()
        data = data_of(i)
        if data is not None and data.dtype.kind in "iu" and data.size <= 64:
            values[i] = np.asarray(data).astype(np.int64)
    changed = set()
    for i in (int(j) for j in sg.InputsAsNumpy()):
        shape = input_shape(raw_tensors[i], names[i], given.pop(names[i], None))
        if shape != shapes[i]:
            changed.add(i)
        shapes[i] = shape
    for n in range(sg.OperatorsLength()):
        op = _Op(model, sg.Operators(n), shapes, values)
        try:
            outs = _infer(op)
        except _Unknown as e:
            outs = None
            reason = str(e)
        else:
            reason = f"mcuforge has no shape rule for {op.code}"
        if outs is None:
            if any(i in changed for i in op.ins if i >= 0):
                raise ModelError(f"node {n} ({op.code}, output '{names[op.outs[0]]}'): its "
                                 f"output shape depends on the input shapes and cannot be "
                                 f"computed ({reason})")
            continue
        for i, (shape, value) in zip(op.outs, outs):
            shape = tuple(int(d) for d in shape)
            if shape != shapes[i]:
                changed.add(i)
            shapes[i] = shape
            if value is not None:
                values[i] = np.asarray(value, np.int64).reshape(shape)
    return shapes


def _infer(op):
    """[(shape, value or None)] per output, or None without a rule."""
    code = op.code
    if code in SAME_SHAPE:
        return [(op.shape(0), None)]
    if code in BROADCAST:
        shape = np.broadcast_shapes(op.shape(0), op.shape(1))
        a, b = (op.values.get(op.ins[k]) for k in (0, 1))
        value = _INT_FNS[code](a, b) if code in _INT_FNS and a is not None and b is not None \
            else None
        return [(shape, value)]
    if code in ("CONV_2D", "DEPTHWISE_CONV_2D", "AVERAGE_POOL_2D", "MAX_POOL_2D", "L2_POOL_2D"):
        return [(_window(op), None)]
    if code == "FULLY_CONNECTED":
        x, w = op.shape(0), op.shape(1)
        o = op.options(tflite.FullyConnectedOptions)
        if o is not None and o.KeepNumDims():
            return [(tuple(x[:-1]) + (w[0],), None)]
        return [((int(np.prod(x)) // w[1], w[0]), None)]
    if code == "RESHAPE":
        return [_reshape(op)]
    if code == "SQUEEZE":
        x = op.shape(0)
        o = op.options(tflite.SqueezeOptions)
        dims = [d % len(x) for d in o.SqueezeDimsAsNumpy()] if o is not None and \
            o.SqueezeDimsLength() else [k for k, d in enumerate(x) if d == 1]
        return [(tuple(d for k, d in enumerate(x) if k not in dims), None)]
    if code in ("MEAN", "SUM", "REDUCE_MAX", "REDUCE_MIN", "REDUCE_PROD"):
        x = op.shape(0)
        axes = {int(a) % len(x) for a in op.value(1).reshape(-1)}
        o = op.options(tflite.ReducerOptions)
        keep = o is not None and o.KeepDims()
        return [(tuple(1 if k in axes else d for k, d in enumerate(x) if keep or k not in axes),
                 None)]
    if code == "CONCATENATION":
        shapes = [op.shape(k) for k in range(len(op.ins))]
        axis = op.options(tflite.ConcatenationOptions).Axis() % len(shapes[0])
        out = list(shapes[0])
        out[axis] = sum(s[axis] for s in shapes)
        vals = [op.values.get(i) for i in op.ins]
        value = np.concatenate(vals, axis) if all(v is not None for v in vals) else None
        return [(tuple(out), value)]
    if code in ("PAD", "PADV2", "MIRROR_PAD"):
        pads = op.value(1).reshape(-1, 2)
        return [(tuple(d + int(a) + int(b) for d, (a, b) in zip(op.shape(0), pads)), None)]
    if code == "SHAPE":
        x = op.shape(0)
        return [((len(x),), np.asarray(x))]
    if code == "PACK":
        vals = [op.values.get(i) for i in op.ins]
        o = op.options(tflite.PackOptions)
        x = op.shape(0)
        axis = o.Axis() % (len(x) + 1)
        value = np.stack(vals, axis) if all(v is not None for v in vals) else None
        return [(tuple(x[:axis]) + (len(op.ins),) + tuple(x[axis:]), value)]
    if code in ("STRIDED_SLICE", "SLICE", "GATHER"):
        return _slice_values(op)
    if code in ("RESIZE_BILINEAR", "RESIZE_NEAREST_NEIGHBOR"):
        x, size = op.shape(0), op.value(1).reshape(-1)
        return [((x[0], int(size[0]), int(size[1]), x[3]), None)]
    if code == "TRANSPOSE":
        x = op.shape(0)
        return [(tuple(x[int(p)] for p in op.value(1).reshape(-1)), None)]
    if code == "EXPAND_DIMS":
        x = op.shape(0)
        axis = int(op.value(1).reshape(-1)[0]) % (len(x) + 1)
        return [(tuple(x[:axis]) + (1,) + tuple(x[axis:]), None)]
    if code == "FILL":
        dims = op.value(0).reshape(-1)
        return [(tuple(int(d) for d in dims), None)]
    return None


def _window(op):
    x = op.shape(0)
    if op.code in ("CONV_2D", "DEPTHWISE_CONV_2D"):
        w = op.shape(1)
        cls = tflite.Conv2DOptions if op.code == "CONV_2D" else tflite.DepthwiseConv2DOptions
        o = op.options(cls)
        filt, dil = w[1:3], (o.DilationHFactor(), o.DilationWFactor())
        channels = w[0] if op.code == "CONV_2D" else w[3]
    else:
        o = op.options(tflite.Pool2DOptions)
        filt, dil, channels = (o.FilterHeight(), o.FilterWidth()), (1, 1), x[3]
    _, (oh, ow) = resolve_padding(o.Padding(), x[1:3], filt, (o.StrideH(), o.StrideW()), dil)
    return (x[0], oh, ow, channels)


def _reshape(op):
    x = op.shape(0)
    if len(op.ins) > 1 and op.ins[1] >= 0:
        target = [int(d) for d in op.value(1).reshape(-1)]
    else:
        o = op.options(tflite.ReshapeOptions)
        if o is None or not o.NewShapeLength():
            raise _Unknown("RESHAPE without a shape")
        target = [int(d) for d in o.NewShapeAsNumpy()]
    size = int(np.prod(x))
    if target.count(-1) == 1:
        rest = int(np.prod([d for d in target if d != -1]))
        target[target.index(-1)] = size // rest if rest else 0
    if int(np.prod(target)) != size:
        raise _Unknown(f"RESHAPE of {x} to {target}")
    value = op.values.get(op.ins[0])
    return tuple(target), None if value is None else value.reshape(target)


def _slice_values(op):
    """Slices of known small int tensors (shape arithmetic); others need a constant result."""
    x = op.values.get(op.ins[0])
    if op.code == "GATHER":
        if x is None:
            raise _Unknown("GATHER of run-time data")
        axis = op.options(tflite.GatherOptions).Axis() % x.ndim
        v = np.take(x, op.value(1), axis=axis)
        return [(v.shape, v)]
    shape = op.shape(0)
    if op.code == "SLICE":
        begin, size = op.value(1).reshape(-1), op.value(2).reshape(-1)
        idx = tuple(slice(int(b), None if s == -1 else int(b + s)) for b, s in zip(begin, size))
    else:
        from .tflite_ops_shape import _strided_start, _strided_stop
        o = op.options(tflite.StridedSliceOptions)
        if o.EllipsisMask() or o.NewAxisMask():
            raise _Unknown("STRIDED_SLICE with ellipsis / new axis masks")
        begin, end, strides = (op.value(k).reshape(-1) for k in (1, 2, 3))
        idx = []
        for d, (b, e, s, n) in enumerate(zip(begin, end, strides, shape)):
            start = _strided_start(int(b), int(s), n, o.BeginMask() >> d & 1)
            if o.ShrinkAxisMask() >> d & 1:
                idx.append(start)
                continue
            stop = _strided_stop(int(e), start, int(s), n, o.EndMask() >> d & 1, o.Offset())
            idx.append(slice(start, None if stop < 0 else stop, int(s)))
        idx = tuple(idx)
    dummy = np.zeros(shape, np.int8)[idx]
    return [(dummy.shape, None if x is None else x[idx])]
