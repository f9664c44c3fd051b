"""TFLite operators -> mcuforge nodes, one converter function per TFLite op.

A converter takes an `OpContext` and returns a `Node` (or a list of them, with intermediates
made by `ctx.new_tensor`, or [] after `ctx.set_const` folded its output); `@op("NAME")`
registers it in `CONVERTERS`, so supporting a new operator is writing one function. Families of
operators live in `tflite_ops_<family>.py` beside this file. A converter raises
`Unsupported(reason)` for an option mcuforge cannot compile (it is reported with the
unsupported ops) and `ModelError` for a malformed operator.

Constant operands that attributes are read from (RESHAPE's shape, MEAN's axes, PAD's
paddings) stay in `Node.inputs` at their TFLite positions; the attribute is authoritative.
"""
from __future__ import annotations

import flatbuffers
import numpy as np
import tflite

from mcuforge.ir.errors import ModelError
from mcuforge.ir.graph import Node, Quant, Tensor

CONVERTERS = {}  # TFLite builtin op name -> converter


def op(*names):
    """Register the decorated function as the converter of the TFLite ops `names`."""

    def register(fn):
        for n in names:
            CONVERTERS[n] = fn
        return fn

    return register


class Unsupported(Exception):
    """The operator is known but uses an option mcuforge cannot compile."""


class OpContext:
    """One TFLite operator as the converters see it.

    code: TFLite op name; index: node index; inputs/outputs: mcuforge tensor names ("" for an
    absent optional input); tensor(name) -> graph Tensor; raw: the tflite.Operator.
    """

    def __init__(self, code, index, inputs, outputs, tensor, raw, add_tensor=None, reader=None):
        self.code, self.index, self.raw = code, index, raw
        self.inputs, self.outputs = tuple(inputs), tuple(outputs)
        self._tensor, self._add_tensor, self._reader = tensor, add_tensor, reader

    @property
    def book(self):
        """The model's VariableBook (state tensors and resource variables)."""
        return self._reader.book

    def tensor(self, name) -> Tensor:
        return self._tensor(name)

    def add_tensor(self, t: Tensor) -> str:
        return self._add_tensor(t)

    def subgraph(self, index: int):
        """Operators of subgraph `index` (see frontend.tflite._Reader.subgraph_ops)."""
        return self._reader.subgraph_ops(index)

    def subgraph_graph(self, index: int):
        """Subgraph `index` converted into a Graph (frontend.tflite._Reader.subgraph_graph)."""
        return self._reader.subgraph_graph(index)

    def new_tensor(self, suffix, shape, dtype, data=None, quant=None) -> str:
        """Add a tensor the conversion needs (an intermediate of a multi-node conversion, or
        a constant); named after the node's first output so names stay unique and readable."""
        name = f"{self.outputs[0]}/{suffix}"
        return self._add_tensor(Tensor(name, tuple(shape), dtype, data, quant))

    def set_const(self, i, data):
        """Make output i a constant holding `data` (a shape computation folded at import);
        the converter then returns no node for it."""
        t = self.output(i)
        data = np.asarray(data).astype(t.dtype).reshape(t.shape)
        self._add_tensor(Tensor(t.name, t.shape, t.dtype, data, t.quant))

    def error(self, msg):
        out = self.outputs[0] if self.outputs else "?"
        return ModelError(f"node {self.index} ({self.code}, output '{out}'): {msg}")

    def input(self, i):
        """The Tensor of input i; ModelError when absent."""
        if i >= len(self.inputs) or not self.inputs[i]:
            raise self.error(f"input {i} is missing")
        return self._tensor(self.inputs[i])

    def output(self, i=0):
        if i >= len(self.outputs):
            raise self.error(f"output {i} is missing")
        return self._tensor(self.outputs[i])

    def const(self, i):
        """The constant data of input i; ModelError when it is not a constant."""
        t = self.input(i)
        if not t.is_const:
            raise self.error(f"input {i} ('{t.name}') must be a constant")
        return t.data

    def options(self, cls):
        """The builtin options as `cls`; schema defaults when the model omits them."""
        kind = self.raw.BuiltinOptionsType()
        table = self.raw.BuiltinOptions()
        if kind == 0 or table is None:
            return _defaults(cls)
        if kind != getattr(tflite.BuiltinOptions, cls.__name__):
            raise self.error(f"options have type {kind}, expected {cls.__name__} (the operator "
                             "code and its options disagree)")
        opts = cls()
        opts.Init(table.Bytes, table.Pos)
        return opts

    def node(self, kind, attrs, inputs=None):
        return Node(kind, tuple(self.inputs if inputs is None else inputs), self.outputs, attrs)


def _defaults(cls):
    """An options object over an empty table: every field reads as its schema default."""
    b = flatbuffers.Builder(16)
    getattr(tflite, cls.__name__ + "Start")(b)
    b.Finish(getattr(tflite, cls.__name__ + "End")(b))
    return cls.GetRootAs(b.Output(), 0)


_AF = tflite.ActivationFunctionType
ACTIVATIONS = {_AF.NONE: "none", _AF.RELU: "relu", _AF.RELU6: "relu6",
               _AF.RELU_N1_TO_1: "relu_n1_to_1"}
_AF_NAMES = {v: k for k, v in vars(_AF).items() if not k.startswith("_")}


def activation(code):
    if code not in ACTIVATIONS:
        raise Unsupported(f"fused activation {_AF_NAMES.get(code, code)}")
    return ACTIVATIONS[code]


def resolve_padding(padding, in_hw, filter_hw, stride, dilation):
    """SAME/VALID -> ((top, bottom, left, right), (out_h, out_w)), as TFLite computes it."""
    pads, outs = [], []
    for size, f, s, d in zip(in_hw, filter_hw, stride, dilation):
        eff = (f - 1) * d + 1
        if padding == tflite.Padding.SAME:
            out = (size + s - 1) // s
        elif padding == tflite.Padding.VALID:
            out = (size - eff + s) // s
        else:
            raise ModelError(f"unknown padding type {padding}")
        total = max((out - 1) * s + eff - size, 0)
        pads += [total // 2, total - total // 2]
        outs.append(out)
    return tuple(pads), tuple(outs)


def _window(ctx, opts, filter_hw, dilation):
    """Stride, dilation and explicit padding of a conv/pool op; checks the output size."""
    x, y = ctx.input(0), ctx.output()
    if len(x.shape) != 4 or len(y.shape) != 4:
        raise ctx.error(f"expects 4-D NHWC input and output, got {x.shape} -> {y.shape}")
    stride = (opts.StrideH(), opts.StrideW())
    if min(stride) < 1 or min(dilation) < 1 or min(filter_hw) < 1:
        raise ctx.error(f"invalid stride {stride}, dilation {dilation} or filter {filter_hw}")
    pads, out = resolve_padding(opts.Padding(), x.shape[1:3], filter_hw, stride, dilation)
    if tuple(y.shape[1:3]) != out:
        raise ctx.error(f"output size {tuple(y.shape[1:3])} disagrees with the computed {out}")
    return {"stride": stride, "dilation": tuple(dilation), "padding": pads}


def _int16_layer(ctx, attrs, bias_types=("int32", "int64"), o=None):
    """TFLite's 16x8 layers (int16 activations): TFLM takes int8 weights only, a bias of
    `bias_types` (DEPTHWISE_CONV_2D reads any bias as int64), and without a bias accumulates
    in int32 when the options ask for an int32 bias (quantized_bias_type), carried as
    acc="int32" (codegen_c/lower/q_int16.py)."""
    if ctx.input(0).dtype != "int16":
        return attrs
    if ctx.input(1).dtype != "int8":
        raise Unsupported(f"int16 input with {ctx.input(1).dtype} weights (TFLM takes int8)")
    bias = ctx.input(2) if len(ctx.inputs) > 2 and ctx.inputs[2] else None
    if bias is not None and bias.dtype not in bias_types:
        raise Unsupported(f"int16 input with an {bias.dtype} bias (TFLM takes "
                          f"{' or '.join(bias_types)})")
    if bias is None and o is not None and o.QuantizedBiasType() == tflite.TensorType.INT32:
        attrs["acc"] = "int32"
    return attrs


@op("CONV_2D")
def conv_2d(ctx):
    o = ctx.options(tflite.Conv2DOptions)
    w = ctx.input(1)
    if len(w.shape) != 4:
        raise ctx.error(f"weights must be 4-D OHWI, got {w.shape}")
    if w.shape[3] != ctx.input(0).shape[-1]:
        raise Unsupported("grouped convolution")
    attrs = _window(ctx, o, w.shape[1:3], (o.DilationHFactor(), o.DilationWFactor()))
    attrs["activation"] = activation(o.FusedActivationFunction())
    return ctx.node("conv2d", _int16_layer(ctx, attrs, o=o))


@op("DEPTHWISE_CONV_2D")
def depthwise_conv_2d(ctx):
    o = ctx.options(tflite.DepthwiseConv2DOptions)
    w, channels = ctx.input(1), ctx.input(0).shape[-1]
    if len(w.shape) != 4 or w.shape[0] != 1 or w.shape[3] % channels:
        raise ctx.error(f"weights {w.shape} are not 1HW(C*M) for {channels} input channels")
    multiplier = w.shape[3] // channels
    if o.DepthMultiplier() not in (0, multiplier):
        raise ctx.error(f"depth_multiplier {o.DepthMultiplier()} disagrees with the shapes")
    attrs = _window(ctx, o, w.shape[1:3], (o.DilationHFactor(), o.DilationWFactor()))
    attrs["depth_multiplier"] = multiplier
    attrs["activation"] = activation(o.FusedActivationFunction())
    return ctx.node("depthwise_conv2d", _int16_layer(ctx, attrs, ("int64",)))


@op("FULLY_CONNECTED")
def fully_connected(ctx):
    o = ctx.options(tflite.FullyConnectedOptions)
    if o.WeightsFormat() != tflite.FullyConnectedOptionsWeightsFormat.DEFAULT:
        raise Unsupported("shuffled weights format")
    w = ctx.input(1)
    if len(w.shape) != 2:
        raise ctx.error(f"weights must be 2-D [out, in], got {w.shape}")
    attrs = {"activation": activation(o.FusedActivationFunction())}
    return ctx.node("fully_connected", _int16_layer(ctx, attrs, o=o))


@op("ADD")
def add(ctx):
    o = ctx.options(tflite.AddOptions)
    # tflm: float results clamped as TFLM's (to +-FLT_MAX without an activation; q_binary.py)
    return ctx.node("add", {"activation": activation(o.FusedActivationFunction()), "tflm": True})


@op("MUL")
def mul(ctx):
    o = ctx.options(tflite.MulOptions)
    return ctx.node("mul", {"activation": activation(o.FusedActivationFunction()), "tflm": True})


@op("AVERAGE_POOL_2D", "MAX_POOL_2D")
def pool_2d(ctx):
    o = ctx.options(tflite.Pool2DOptions)
    size = (o.FilterHeight(), o.FilterWidth())
    attrs = _window(ctx, o, size, (1, 1))
    del attrs["dilation"]
    attrs["filter"] = size
    attrs["activation"] = activation(o.FusedActivationFunction())
    kind = "avg_pool2d" if ctx.code == "AVERAGE_POOL_2D" else "max_pool2d"
    return ctx.node(kind, attrs)


@op("RESHAPE")
def reshape(ctx):
    _same_size(ctx)
    return ctx.node("reshape", {})


@op("SQUEEZE")
def squeeze(ctx):
    _same_size(ctx)
    return ctx.node("reshape", {}, inputs=ctx.inputs[:1])


def _same_size(ctx):
    x, y = ctx.input(0), ctx.output()
    if x.size != y.size or x.dtype != y.dtype:
        raise ctx.error(f"reshape changes size or type: {x.shape} -> {y.shape}")


@op("SOFTMAX")
def softmax(ctx):
    attrs = {"beta": float(ctx.options(tflite.SoftmaxOptions).Beta())}
    x, y = ctx.input(0), ctx.output()
    if x.dtype == y.dtype == "uint8" and x.quant and y.quant:
        return _softmax_uint8(ctx, x, y, attrs)
    return ctx.node("softmax", attrs)


def _softmax_uint8(ctx, x, y, attrs):
    """Legacy uint8 SOFTMAX: LiteRT's kernel is the int8 one on values shifted by 128 (it
    reads differences from the row's maximum, and adds the output type's minimum), so the
    int8 softmax runs between two exact uint8 <-> int8 shifts."""
    def shifted(t):
        return Quant(t.quant.scale, tuple(z - 128 for z in t.quant.zero_point), t.quant.axis)
    x8 = ctx.new_tensor("input_int8", x.shape, "int8", quant=shifted(x))
    y8 = ctx.new_tensor("output_int8", y.shape, "int8", quant=shifted(y))
    return [Node("quantize", (x.name,), (x8,), {}),
            Node("softmax", (x8,), (y8,), attrs),
            Node("quantize", (y8,), (y.name,), {})]


@op("CONCATENATION")
def concatenation(ctx):
    o = ctx.options(tflite.ConcatenationOptions)
    rank = len(ctx.output().shape)
    axis = o.Axis() + rank if o.Axis() < 0 else o.Axis()
    if not 0 <= axis < rank:
        raise ctx.error(f"axis {o.Axis()} out of range for rank {rank}")
    return ctx.node("concat", {"axis": axis,
                               "activation": activation(o.FusedActivationFunction())})


@op("PAD", "PADV2")
def pad(ctx):
    rank = len(ctx.input(0).shape)
    pads = np.asarray(ctx.const(1))
    if pads.shape != (rank, 2) or (pads < 0).any():
        raise ctx.error(f"paddings {pads.tolist()} are not non-negative [{rank}, 2]")
    if ctx.code == "PADV2" and ctx.input(2).size != 1:
        raise ctx.error("constant_values must have one element")
    return ctx.node("pad", {"pads": tuple((int(a), int(b)) for a, b in pads)})


@op("MEAN")
def mean(ctx):
    if ctx.input(0).dtype == "uint8":  # LiteRT's uint8 MEAN has kernels of its own
        raise Unsupported("uint8 MEAN (legacy quantization; requantize the model to int8)")
    rank = len(ctx.input(0).shape)
    axes = [int(a) for a in np.asarray(ctx.const(1)).reshape(-1)]
    if any(not -rank <= a < rank for a in axes):
        raise ctx.error(f"axes {axes} out of range for rank {rank}")
    axes = tuple(sorted({a % rank for a in axes}))
    keep = bool(ctx.options(tflite.ReducerOptions).KeepDims())
    return ctx.node("mean", {"axes": axes, "keep_dims": keep})


@op("LEAKY_RELU")
def leaky_relu(ctx):
    return ctx.node("leaky_relu", {"alpha": float(ctx.options(tflite.LeakyReluOptions).Alpha())})


SIMPLE = {"LOGISTIC": "logistic", "TANH": "tanh", "RELU": "relu", "RELU6": "relu6",
          "HARD_SWISH": "hard_swish", "QUANTIZE": "quantize", "DEQUANTIZE": "dequantize"}


@op(*SIMPLE)
def simple(ctx):
    """Ops without attributes: only the name changes."""
    if ctx.code == "HARD_SWISH" and ctx.input(0).dtype == "int16":
        raise Unsupported("int16 HARD_SWISH (tflite-micro's kernel takes float32 and int8)")
    return ctx.node(SIMPLE[ctx.code], {})
