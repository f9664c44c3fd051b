"""Small single-operator int8 models, one per option variant, for per-operator conformance.

Each `<op>_cases()` returns [(case_name, Graph)]; `all_cases()` returns them all. Every case is
deterministic: its random numbers come from a generator seeded by the case name. Quantization
follows what the TFLite converter produces and what TFLM's int8 kernels accept:
per-channel weights are symmetric (zero point 0, axis 0 for conv, 3 for depthwise), int32 biases
have scale input_scale * filter_scale and zero point 0, softmax/logistic outputs use
1/256 and -128, tanh outputs 1/128 and 0, and ops that TFLM does not requantize (pooling,
reshape, concat, pad, relu6) keep the input's quantization on the output.
"""
from __future__ import annotations

import zlib

import numpy as np

from mcuforge.ir.graph import Graph, Node, Quant, Tensor, verify

ACT_RANGES = {"relu": (0.0, None), "relu6": (0.0, 6.0), "relu_n1_to_1": (-1.0, 1.0)}


def rng_for(name: str) -> np.random.Generator:
    return np.random.default_rng(zlib.crc32(name.encode()))


def quant_for_range(lo: float, hi: float) -> Quant:
    """Asymmetric int8 quantization of [lo, hi] (widened to hold 0), like the TFLite converter."""
    lo, hi = min(lo, 0.0), max(hi, 0.0)
    scale = max(hi - lo, 1e-6) / 255.0
    zp = int(np.clip(round(-128 - lo / scale), -128, 127))
    return Quant((float(np.float32(scale)),), (zp,))


def random_quant(rng) -> Quant:
    """An activation quantization with a random range that straddles zero unevenly."""
    width = rng.uniform(2.0, 8.0)
    lo = -width * rng.uniform(0.2, 0.8)
    return quant_for_range(lo, lo + width)


def output_quant(rng, std: float, mean: float = 0.0, activation: str = "none") -> Quant:
    """Quantization for a value of about this mean and std, clipped like the fused activation."""
    lo, hi = mean - 3.5 * std * rng.uniform(0.8, 1.2), mean + 3.5 * std * rng.uniform(0.8, 1.2)
    if activation in ACT_RANGES:
        amin, amax = ACT_RANGES[activation]
        lo = max(lo, amin)
        hi = max(min(hi, amax) if amax is not None else hi, lo + 1e-3)
    return quant_for_range(lo, hi)


def real_stats(q: Quant) -> tuple:
    """Mean and std of the real values of uniformly random int8 data under `q`."""
    return q.scale[0] * (-0.5 - q.zero_point[0]), q.scale[0] * 73.9


class Builder:
    """Collects tensors and nodes for one case, then checks the result with `verify`."""

    def __init__(self, name: str):
        self.name, self.rng = name, rng_for(name)
        self.tensors, self.nodes, self.inputs, self.outputs = {}, [], [], []

    def input(self, name, shape, quant=None, dtype="int8"):
        quant = quant if quant is not None or dtype != "int8" else random_quant(self.rng)
        self.tensors[name] = Tensor(name, tuple(shape), dtype, quant=quant)
        self.inputs.append(name)
        return self.tensors[name]

    def tensor(self, name, shape, quant, dtype="int8"):
        self.tensors[name] = Tensor(name, tuple(shape), dtype, quant=quant)
        return self.tensors[name]

    def const(self, name, data, dtype, quant=None):
        data = np.asarray(data).astype(dtype)
        self.tensors[name] = Tensor(name, tuple(data.shape), dtype, data=data, quant=quant)
        return self.tensors[name]

    def node(self, op, inputs, outputs, **attrs):
        self.nodes.append(Node(op, tuple(inputs), tuple(outputs), attrs, name=outputs[0]))

    def weights(self, name, shape, axis, per_channel, fan_in):
        """Symmetric int8 weights (zero point 0) from He-like float weights."""
        w = self.rng.normal(0.0, 1.0 / np.sqrt(fan_in), size=shape)
        if per_channel:
            amax = np.abs(w).max(axis=tuple(i for i in range(w.ndim) if i != axis))
            scale = np.maximum(amax, 1e-8) / 127.0
            shaped = scale.reshape([-1 if i == axis else 1 for i in range(w.ndim)])
        else:
            scale = np.array([max(np.abs(w).max(), 1e-8) / 127.0])
            shaped = scale[0]
        scale = scale.astype(np.float32)
        q = np.clip(np.round(w / shaped), -127, 127)
        quant = Quant(tuple(float(s) for s in scale), (0,) * len(scale), axis if per_channel else 0)
        return self.const(name, q, "int8", quant)

    def bias(self, name, n, in_quant, w_quant, std):
        """int32 bias with scale input_scale * filter_scale (per channel when the filter is)."""
        scales = (np.float32(in_quant.scale[0]) * np.asarray(w_quant.scale, np.float32))
        scales = scales.astype(np.float32)
        b = self.rng.normal(0.0, std, size=n)
        q = np.round(b / scales).astype(np.int64)  # broadcasts a per-tensor scale
        quant = Quant(tuple(float(s) for s in scales), (0,) * len(scales), 0)
        return self.const(name, q, "int32", quant)

    def graph(self, outputs) -> Graph:
        g = Graph(dict(self.tensors), list(self.nodes), list(self.inputs), list(outputs),
                  name=self.name)
        return verify(g)


def same_pads(in_hw, filt_hw, stride, dilation=(1, 1)):
    """Explicit (top, bottom, left, right) pads and output size of TFLite SAME padding."""
    pads, out = [], []
    for i, f, s, d in zip(in_hw, filt_hw, stride, dilation):
        o = -(-i // s)
        total = max((o - 1) * s + (f - 1) * d + 1 - i, 0)
        pads += [total // 2, total - total // 2]
        out.append(o)
    return tuple(pads), tuple(out)


def valid_out(in_hw, filt_hw, stride, dilation=(1, 1)):
    return tuple((i - (f - 1) * d - 1) // s + 1 for i, f, s, d in zip(in_hw, filt_hw, stride,
                                                                        dilation))


def _window(in_hw, filt, stride, dilation, padding):
    if padding == "same":
        return same_pads(in_hw, filt, stride, dilation)
    return (0, 0, 0, 0), valid_out(in_hw, filt, stride, dilation)


# ----------------------------------------------------------------------------------------------
# Convolutions and fully connected


def conv_case(name, in_shape, cout, filt, stride=(1, 1), dilation=(1, 1), padding="same",
              activation="none", per_channel=True, bias=True):
    b = Builder(name)
    x = b.input("x", in_shape)
    cin = in_shape[3]
    pads, out_hw = _window(in_shape[1:3], filt, stride, dilation, padding)
    fan_in = filt[0] * filt[1] * cin
    w = b.weights("w", (cout,) + tuple(filt) + (cin,), 0, per_channel, fan_in)
    inputs = ["x", "w", b.bias("b", cout, x.quant, w.quant, 0.1).name if bias else ""]
    mean, std = real_stats(x.quant)
    b.tensor("y", (in_shape[0],) + out_hw + (cout,),
             output_quant(b.rng, np.hypot(mean, std) * 1.1, 0.0, activation))
    b.node("conv2d", inputs, ["y"], stride=stride, dilation=dilation, padding=pads,
           activation=activation)
    return name, b.graph(["y"])


def conv2d_cases():
    s = (1, 8, 8, 4)
    return [
        conv_case("conv2d_3x3_s1_same_relu_pc", s, 8, (3, 3), activation="relu"),
        conv_case("conv2d_3x3_s2_same_none_pc", s, 8, (3, 3), stride=(2, 2)),
        conv_case("conv2d_3x3_s1_valid_relu6_pc", s, 6, (3, 3), padding="valid",
                  activation="relu6"),
        conv_case("conv2d_3x3_s2_valid_none_pt", s, 8, (3, 3), stride=(2, 2), padding="valid",
                  per_channel=False),
        conv_case("conv2d_3x3_s1_same_relu_n1_to_1_pc", s, 4, (3, 3),
                  activation="relu_n1_to_1"),
        conv_case("conv2d_3x3_dil2_same_none_pc", s, 8, (3, 3), dilation=(2, 2)),
        conv_case("conv2d_3x3_dil2_valid_relu_pt", s, 8, (3, 3), dilation=(2, 2),
                  padding="valid", activation="relu", per_channel=False),
        conv_case("conv2d_1x1_s1_valid_none_pc", s, 16, (1, 1), padding="valid"),
        conv_case("conv2d_1x1_s2_same_relu6_pt", s, 8, (1, 1), stride=(2, 2),
                  activation="relu6", per_channel=False),
        conv_case("conv2d_3x3_s1_same_nobias_pc", s, 8, (3, 3), bias=False),
        conv_case("conv2d_1x1_s1_valid_nobias_pt", s, 8, (1, 1), padding="valid",
                  bias=False, per_channel=False),
        # non-square input, filter and stride: catches swapped H and W
        conv_case("conv2d_5x3_s2x1_same_none_pc_9x7", (1, 9, 7, 3), 5, (5, 3), stride=(2, 1)),
        conv_case("conv2d_3x3_s2_same_relu_pc_batch2", (2, 7, 7, 3), 4, (3, 3), stride=(2, 2),
                  activation="relu"),
    ]


def depthwise_case(name, in_shape, mult, filt, stride=(1, 1), dilation=(1, 1), padding="same",
                   activation="none", per_channel=True, bias=True):
    b = Builder(name)
    x = b.input("x", in_shape)
    cout = in_shape[3] * mult
    pads, out_hw = _window(in_shape[1:3], filt, stride, dilation, padding)
    w = b.weights("w", (1,) + tuple(filt) + (cout,), 3, per_channel, filt[0] * filt[1])
    inputs = ["x", "w", b.bias("b", cout, x.quant, w.quant, 0.1).name if bias else ""]
    mean, std = real_stats(x.quant)
    b.tensor("y", (in_shape[0],) + out_hw + (cout,),
             output_quant(b.rng, np.hypot(mean, std) * 1.1, 0.0, activation))
    b.node("depthwise_conv2d", inputs, ["y"], stride=stride, dilation=dilation, padding=pads,
           depth_multiplier=mult, activation=activation)
    return name, b.graph(["y"])


def depthwise_conv2d_cases():
    s = (1, 8, 8, 4)
    return [
        depthwise_case("dw_3x3_m1_s1_same_relu6_pc", s, 1, (3, 3), activation="relu6"),
        depthwise_case("dw_3x3_m2_s1_same_none_pc", s, 2, (3, 3)),
        depthwise_case("dw_3x3_m2_s1_valid_relu_pt", s, 2, (3, 3), padding="valid",
                       activation="relu", per_channel=False),
        depthwise_case("dw_3x3_m1_s2_same_relu_pc", s, 1, (3, 3), stride=(2, 2),
                       activation="relu"),
        depthwise_case("dw_3x3_m1_s2_valid_none_pc", s, 1, (3, 3), stride=(2, 2),
                       padding="valid"),
        depthwise_case("dw_3x3_m1_dil2_same_none_pc", s, 1, (3, 3), dilation=(2, 2)),
        depthwise_case("dw_3x3_m1_s1_same_nobias_pt", s, 1, (3, 3), bias=False,
                       per_channel=False),
        depthwise_case("dw_5x3_m1_s2x1_same_none_pc_9x7", (1, 9, 7, 3), 1, (5, 3),
                       stride=(2, 1)),
    ]


def fc_case(name, in_shape, units, activation="none", bias=True, per_channel=False):
    b = Builder(name)
    x = b.input("x", in_shape)
    depth = in_shape[-1]
    batch = int(np.prod(in_shape)) // depth
    if len(in_shape) > 2:  # keep_num_dims False: everything but the last dim is flattened
        depth, batch = int(np.prod(in_shape[1:])), in_shape[0]
    w = b.weights("w", (units, depth), 0, per_channel, depth)
    inputs = ["x", "w", b.bias("b", units, x.quant, w.quant, 0.1).name if bias else ""]
    mean, std = real_stats(x.quant)
    b.tensor("y", (batch, units), output_quant(b.rng, np.hypot(mean, std) * 1.1, 0.0,
                                               activation))
    b.node("fully_connected", inputs, ["y"], activation=activation)
    return name, b.graph(["y"])


def fully_connected_cases():
    return [
        fc_case("fc_bias_none", (1, 16), 8),
        fc_case("fc_bias_relu", (1, 16), 8, activation="relu"),
        fc_case("fc_bias_relu6", (1, 32), 10, activation="relu6"),
        fc_case("fc_nobias_none", (1, 16), 8, bias=False),
        fc_case("fc_batch3_none", (3, 12), 5),
        fc_case("fc_4d_flatten_none", (1, 2, 2, 8), 10),
        fc_case("fc_per_channel_none", (1, 16), 8, per_channel=True),
    ]


# ----------------------------------------------------------------------------------------------
# Elementwise binary ops


def binary_case(name, op, shape_a, shape_b, activation="none", const_b=False):
    b = Builder(name)
    a = b.input("a", shape_a)
    if const_b:
        qb = random_quant(b.rng)
        b.const("b", b.rng.integers(-128, 128, size=shape_b), "int8", qb)
    else:
        qb = b.input("b", shape_b).quant
    (ma, sa), (mb, sb) = real_stats(a.quant), real_stats(qb)
    if op == "add":
        mean, std = ma + mb, np.hypot(sa, sb)
    else:  # product of two independent values
        mean, std = ma * mb, np.sqrt((sa * sb) ** 2 + (ma * sb) ** 2 + (mb * sa) ** 2)
    out_shape = tuple(np.broadcast_shapes(shape_a, shape_b))
    b.tensor("y", out_shape, output_quant(b.rng, std, mean, activation))
    b.node(op, ["a", "b"], ["y"], activation=activation)
    return name, b.graph(["y"])


def add_cases():
    s = (1, 4, 4, 8)
    return [
        binary_case("add_same_none", "add", s, s),
        binary_case("add_same_relu", "add", s, s, activation="relu"),
        binary_case("add_same_relu6", "add", s, s, activation="relu6"),
        binary_case("add_bcast_channel_none", "add", s, (1, 1, 1, 8)),
        binary_case("add_bcast_spatial_relu", "add", (1, 1, 1, 8), s, activation="relu"),
        binary_case("add_bcast_hw1_none", "add", s, (1, 4, 4, 1)),
        binary_case("add_const_none", "add", s, (1, 1, 1, 8), const_b=True),
    ]


def mul_cases():
    s = (1, 4, 4, 8)
    return [
        binary_case("mul_same_none", "mul", s, s),
        binary_case("mul_same_relu", "mul", s, s, activation="relu"),
        binary_case("mul_same_relu6", "mul", s, s, activation="relu6"),
        binary_case("mul_bcast_channel_none", "mul", s, (1, 1, 1, 8)),
        binary_case("mul_bcast_scalar_none", "mul", s, (1, 1, 1, 1)),
        binary_case("mul_const_none", "mul", s, (1, 1, 1, 8), const_b=True),
    ]


# ----------------------------------------------------------------------------------------------
# Pooling and shape ops (TFLM does not requantize these: output quant == input quant)


def pool_case(name, op, in_shape, filt, stride, padding, activation="none"):
    b = Builder(name)
    x = b.input("x", in_shape)
    pads, out_hw = _window(in_shape[1:3], filt, stride, (1, 1), padding)
    b.tensor("y", (in_shape[0],) + out_hw + (in_shape[3],), x.quant)
    b.node(op, ["x"], ["y"], filter=filt, stride=stride, padding=pads, activation=activation)
    return name, b.graph(["y"])


def pool_cases():
    s = (1, 8, 8, 4)
    cases = []
    for op, tag in (("avg_pool2d", "avgpool"), ("max_pool2d", "maxpool")):
        cases += [
            pool_case(f"{tag}_2x2_s2_valid_none", op, s, (2, 2), (2, 2), "valid"),
            pool_case(f"{tag}_3x3_s1_same_none", op, s, (3, 3), (1, 1), "same"),
            pool_case(f"{tag}_3x3_s2_same_relu_7x7", op, (1, 7, 7, 4), (3, 3), (2, 2), "same",
                      "relu"),
            pool_case(f"{tag}_global_6x5_relu6", op, (1, 6, 5, 8), (6, 5), (1, 1), "valid",
                      "relu6"),
            pool_case(f"{tag}_3x2_s2x1_valid_none", op, (1, 9, 7, 3), (3, 2), (2, 1), "valid"),
        ]
    return cases


def reshape_case(name, in_shape, out_shape):
    b = Builder(name)
    x = b.input("x", in_shape)
    b.tensor("y", out_shape, x.quant)
    b.node("reshape", ["x"], ["y"])
    return name, b.graph(["y"])


def reshape_cases():
    return [
        reshape_case("reshape_4d_to_2d", (1, 4, 4, 8), (1, 128)),
        reshape_case("reshape_2d_to_4d", (1, 32), (1, 2, 2, 8)),
        reshape_case("reshape_4d_to_4d", (1, 4, 6, 2), (1, 8, 3, 2)),
    ]


def concat_case(name, shapes, axis):
    b = Builder(name)
    q = random_quant(b.rng)  # TFLM int8 concat: every input must share the output's quant
    names = [b.input(f"x{i}", s, q).name for i, s in enumerate(shapes)]
    out = list(shapes[0])
    out[axis] = sum(s[axis] for s in shapes)
    b.tensor("y", tuple(out), q)
    b.node("concat", names, ["y"], axis=axis, activation="none")
    return name, b.graph(["y"])


def concat_cases():
    return [
        concat_case("concat_axis3_2in", [(1, 4, 4, 3), (1, 4, 4, 5)], 3),
        concat_case("concat_axis1_2in", [(1, 2, 4, 8), (1, 3, 4, 8)], 1),
        concat_case("concat_axis3_3in", [(1, 2, 2, 4), (1, 2, 2, 1), (1, 2, 2, 3)], 3),
        concat_case("concat_axis1_2d", [(1, 6), (1, 10)], 1),
    ]


def pad_case(name, in_shape, pads, value=None):
    b = Builder(name)
    x = b.input("x", in_shape)
    out = tuple(d + lo + hi for d, (lo, hi) in zip(in_shape, pads))
    b.tensor("y", out, x.quant)
    inputs = ["x"]
    if value is not None:  # PADV2: the value must be quantized like the output
        b.const("value", np.array([value]), "int8", x.quant)
        inputs = ["x", "", "value"]
    b.node("pad", inputs, ["y"], pads=tuple(tuple(p) for p in pads))
    return name, b.graph(["y"])


def pad_cases():
    return [
        pad_case("pad_hw_sym", (1, 4, 4, 3), ((0, 0), (1, 1), (1, 1), (0, 0))),
        pad_case("pad_hw_asym", (1, 5, 3, 2), ((0, 0), (0, 2), (3, 1), (0, 0))),
        pad_case("pad_channels", (1, 2, 2, 3), ((0, 0), (0, 0), (0, 0), (1, 4))),
        pad_case("pad_2d", (2, 5), ((1, 0), (2, 3))),
        pad_case("padv2_value", (1, 4, 4, 3), ((0, 0), (1, 2), (2, 1), (0, 0)), value=-100),
    ]


def mean_case(name, in_shape, axes, keep_dims, requant=True):
    b = Builder(name)
    x = b.input("x", in_shape)
    out = [1 if i in axes else d for i, d in enumerate(in_shape)]
    out = tuple(out) if keep_dims else tuple(d for i, d in enumerate(out) if i not in axes)
    mean, std = real_stats(x.quant)
    n = int(np.prod([in_shape[a] for a in axes]))
    q = output_quant(b.rng, std / np.sqrt(n) * 2, mean) if requant else x.quant
    b.tensor("y", out, q)
    b.node("mean", ["x"], ["y"], axes=tuple(axes), keep_dims=keep_dims)
    return name, b.graph(["y"])


def mean_cases():
    s = (1, 6, 5, 8)
    return [
        mean_case("mean_hw_keep_samequant", s, (1, 2), True, requant=False),
        mean_case("mean_hw_keep_requant", s, (1, 2), True),
        mean_case("mean_hw_nokeep_requant", s, (1, 2), False),
        mean_case("mean_hw_nokeep_samequant", s, (1, 2), False, requant=False),
    ]


# ----------------------------------------------------------------------------------------------
# Unary ops


def real_range(q: Quant) -> tuple:
    return q.scale[0] * (-128 - q.zero_point[0]), q.scale[0] * (127 - q.zero_point[0])


def unary_case(name, op, shape=(1, 4, 4, 8), out_quant=None, same_quant=False, fn=None,
               **attrs):
    """`fn` maps the input's real range to the output's; without it the output quant is random."""
    b = Builder(name)
    x = b.input("x", shape)
    if same_quant:
        out_quant = x.quant
    elif fn is not None:
        lo, hi = fn(*real_range(x.quant))
        out_quant = quant_for_range(lo, hi * b.rng.uniform(0.85, 1.1))
    elif out_quant is None:
        out_quant = random_quant(b.rng)
    b.tensor("y", shape, out_quant)
    b.node(op, ["x"], ["y"], **attrs)
    return name, b.graph(["y"])


def softmax_cases():
    q = Quant((1.0 / 256,), (-128,))  # TFLM int8 softmax output requirement
    return [
        unary_case("softmax_beta1", "softmax", (1, 10), q, beta=1.0),
        unary_case("softmax_beta05", "softmax", (1, 10), q, beta=0.5),
        unary_case("softmax_4d_beta1", "softmax", (1, 2, 2, 8), q, beta=1.0),
    ]


def activation_cases():
    return [
        unary_case("logistic", "logistic", out_quant=Quant((1.0 / 256,), (-128,))),
        unary_case("tanh", "tanh", out_quant=Quant((1.0 / 128,), (0,))),
        unary_case("relu_requant", "relu", fn=lambda lo, hi: (0.0, hi)),
        unary_case("relu_samequant", "relu", same_quant=True),
        unary_case("relu6_samequant", "relu6", same_quant=True),  # TFLM ignores relu6's out quant
        unary_case("leaky_relu_a0.2", "leaky_relu", alpha=0.2, fn=lambda lo, hi: (0.2 * lo, hi)),
        unary_case("leaky_relu_a0.01_samequant", "leaky_relu", same_quant=True, alpha=0.01),
        unary_case("hard_swish", "hard_swish",
                   fn=lambda lo, hi: (-0.375, hi * min(max(hi + 3, 0), 6) / 6)),
    ]


def quantize_cases():
    cases = []
    b = Builder("quantize_f32_to_i8")
    b.input("x", (1, 4, 4, 3), dtype="float32")
    b.tensor("y", (1, 4, 4, 3), random_quant(b.rng))
    b.node("quantize", ["x"], ["y"])
    cases.append((b.name, b.graph(["y"])))
    cases.append(unary_case("quantize_i8_to_i8", "quantize"))
    b = Builder("dequantize_i8_to_f32")
    b.input("x", (1, 4, 4, 3))
    b.tensor("y", (1, 4, 4, 3), None, dtype="float32")
    b.node("dequantize", ["x"], ["y"])
    cases.append((b.name, b.graph(["y"])))
    return cases


def all_cases() -> list:
    """Every conformance case as (name, Graph), in a fixed order."""
    groups = (conv2d_cases, depthwise_conv2d_cases, fully_connected_cases, add_cases, mul_cases,
              pool_cases, reshape_cases, softmax_cases, concat_cases, pad_cases, mean_cases,
              activation_cases, quantize_cases)
    return [case for group in groups for case in group()]


# ----------------------------------------------------------------------------------------------
# Running a model in TensorFlow Lite for Microcontrollers


def run_tflm(tflite_bytes: bytes, inputs: list) -> list:
    """Run the model in tflite-micro's interpreter and return its outputs in order."""
    import tflite
    from tflite_micro.python.tflite_micro import runtime

    model = tflite.Model.GetRootAsModel(tflite_bytes, 0)
    n_out = model.Subgraphs(0).OutputsLength()
    # The default arena (10x the model size) is too small for models with few weights.
    it = runtime.Interpreter.from_bytes(tflite_bytes, arena_size=len(tflite_bytes) * 4 + (1 << 20))
    for i, x in enumerate(inputs):
        it.set_input(np.ascontiguousarray(x), i)
    it.invoke()
    return [np.array(it.get_output(i)) for i in range(n_out)]


def random_inputs(g: Graph, seed: int = 0) -> list:
    """One random array per graph input: full int range, or normal floats."""
    rng = np.random.default_rng(seed)
    out = []
    for name in g.inputs:
        t = g.tensors[name]
        if t.dtype == "float32":
            out.append(rng.normal(0.0, 1.5, size=t.shape).astype(np.float32))
        else:
            info = np.iinfo(t.dtype)
            out.append(rng.integers(info.min, info.max + 1, size=t.shape).astype(t.dtype))
    return out
