"""Conformance cases: TFLite's 16x8 quantization (int16 activations, int8 weights) in the
layer and elementwise operators whose tflite-micro kernels take int16: CONV_2D,
DEPTHWISE_CONV_2D, FULLY_CONNECTED, AVERAGE_POOL_2D, MAX_POOL_2D, ADD, MUL, SOFTMAX,
LOGISTIC, TANH, RELU, RELU6, LEAKY_RELU, MEAN, QUANTIZE and DEQUANTIZE.

Quantization as the converter writes it for 16x8: int16 tensors symmetric (zero point 0),
weights int8 symmetric (per output channel, or per tensor), biases int64 (int32 where TFLM
also takes one) at input_scale * weight_scale. Outputs TFLM fixes carry exactly those
parameters (SOFTMAX 2^-15; LOGISTIC / TANH 2^-15). Output scales of the layers are chosen so
the random inputs (the whole int16 range) use much of the output range.
"""
from __future__ import annotations

import zlib

import numpy as np
import tflite

from mcuforge.frontend.tflite_ops import resolve_padding
from mcuforge.ir.graph import Quant

from . import cases, integers, q, single, tensor, uniform

I16 = "int16"
X_SCALE = 0.0005  # int16 activations: +-16.4


def _rng(name: str) -> np.random.Generator:
    return np.random.default_rng(zlib.crc32(name.encode()))


def _act(name: str) -> dict:
    return {"fused_activation_function": name}


def _weights(name, shape, axis, per_channel, bias, bias_dtype="int64"):
    """int8 weights (symmetric, per channel along `axis` or per tensor), the bias at
    x_scale * w_scale per channel, and the typical size of an output channel's sum."""
    rng = _rng(name)
    n = shape[axis]
    w_scales = rng.uniform(0.002, 0.01, n) if per_channel else np.array([0.005])
    w_q = Quant(tuple(float(np.float32(s)) for s in w_scales), (0,) * len(w_scales), axis)
    w = tensor("w", shape, "int8", w_q, rng.integers(-127, 128, shape))
    b = None
    if bias:
        b_q = Quant(tuple(float(np.float32(X_SCALE * s)) for s in np.broadcast_to(w_scales, n)),
                    (0,) * n)
        limit = 2**20 if bias_dtype == "int64" else 2**18
        b = tensor("b", (n,), bias_dtype, b_q, rng.integers(-limit, limit + 1, n))
    return w, b, float(np.max(w_scales))


def _out_scale(w_scale: float, fan_in: int) -> float:
    """The sums of fan_in products of uniform int16 inputs and int8 weights have a standard
    deviation of ~1.4e6 * sqrt(fan_in) raw units: map a few of those onto the int16 range."""
    return X_SCALE * w_scale * 1.4e6 * np.sqrt(fan_in) * 2.5 / 32768


# ---- CONV_2D, DEPTHWISE_CONV_2D, FULLY_CONNECTED ----------------------------------------------

def _conv(variant, in_shape, cout, filt, stride=(1, 1), dilation=(1, 1), padding="SAME",
          act="NONE", per_channel=True, bias=True, bias_dtype="int64", options=None):
    n, h, w_, c = in_shape
    w, b, ws = _weights(f"conv_{variant}", (cout, *filt, c), 0, per_channel, bias, bias_dtype)
    pad = tflite.Padding.SAME if padding == "SAME" else tflite.Padding.VALID
    _, (oh, ow) = resolve_padding(pad, (h, w_), filt, stride, dilation)
    opts = {"padding": padding, "stride_h": stride[0], "stride_w": stride[1],
            "dilation_h_factor": dilation[0], "dilation_w_factor": dilation[1], **_act(act),
            **(options or {})}
    y_q = q(_out_scale(ws, filt[0] * filt[1] * c))
    return single("CONV_2D", variant, [tensor("x", in_shape, I16, q(X_SCALE)), w, b],
                  [tensor("y", (n, oh, ow, cout), I16, y_q)], opts)


@cases("CONV_2D")
def conv_2d_cases():
    s = (1, 6, 6, 3)
    return [
        _conv("int16", s, 4, (3, 3)),
        _conv("int16_valid_stride2", (2, 7, 7, 2), 3, (3, 3), (2, 2), padding="VALID"),
        _conv("int16_dilation2", (1, 7, 6, 2), 3, (2, 3), dilation=(2, 1)),
        _conv("int16_1x1_per_tensor", s, 5, (1, 1), per_channel=False),
        _conv("int16_relu", s, 4, (3, 3), act="RELU"),
        _conv("int16_relu6", s, 4, (2, 2), (2, 1), act="RELU6"),
        _conv("int16_relu_n1_to_1", s, 2, (3, 3), act="RELU_N1_TO_1"),
        _conv("int16_no_bias", s, 4, (3, 3), bias=False),
        _conv("int16_bias_int32", s, 4, (3, 3), bias_dtype="int32"),
        # no bias, but the int32 accumulator an int32 bias selects (TensorType INT32 = 2)
        _conv("int16_no_bias_int32_accumulator", s, 4, (3, 3), bias=False,
              options={"quantized_bias_type": 2}),
    ]


def _depthwise(variant, in_shape, mult, filt, stride=(1, 1), dilation=(1, 1), padding="SAME",
               act="NONE", per_channel=True, bias=True):
    n, h, w_, c = in_shape
    w, b, ws = _weights(f"dw_{variant}", (1, *filt, c * mult), 3, per_channel, bias)
    pad = tflite.Padding.SAME if padding == "SAME" else tflite.Padding.VALID
    _, (oh, ow) = resolve_padding(pad, (h, w_), filt, stride, dilation)
    opts = {"padding": padding, "stride_h": stride[0], "stride_w": stride[1],
            "dilation_h_factor": dilation[0], "dilation_w_factor": dilation[1],
            "depth_multiplier": mult, **_act(act)}
    y_q = q(_out_scale(ws, filt[0] * filt[1]))
    # no bias: two inputs; TFLM's DEPTHWISE_CONV_2D crashes on an absent third one (index -1)
    ins = [tensor("x", in_shape, I16, q(X_SCALE)), w] + ([b] if bias else [])
    return single("DEPTHWISE_CONV_2D", variant, ins,
                  [tensor("y", (n, oh, ow, c * mult), I16, y_q)], opts)


@cases("DEPTHWISE_CONV_2D")
def depthwise_conv_2d_cases():
    s = (1, 6, 6, 3)
    return [
        _depthwise("int16", s, 1, (3, 3)),
        _depthwise("int16_multiplier2", s, 2, (3, 3)),
        _depthwise("int16_valid_stride2", (2, 7, 7, 2), 1, (3, 3), (2, 2), padding="VALID"),
        _depthwise("int16_dilation2", (1, 7, 7, 2), 2, (2, 2), dilation=(2, 2)),
        _depthwise("int16_per_tensor", s, 1, (3, 3), per_channel=False),
        _depthwise("int16_relu6", s, 1, (3, 3), act="RELU6"),
        _depthwise("int16_no_bias", s, 1, (3, 3), bias=False),
    ]


def _fc(variant, in_shape, units, act="NONE", per_channel=False, bias=True, bias_dtype="int64",
        out_shape=None, options=None):
    depth = in_shape[-1]
    w, b, ws = _weights(f"fc_{variant}", (units, depth), 0, per_channel, bias, bias_dtype)
    rows = int(np.prod(in_shape)) // depth
    y_q = q(_out_scale(ws, depth))
    return single("FULLY_CONNECTED", variant, [tensor("x", in_shape, I16, q(X_SCALE)), w, b],
                  [tensor("y", out_shape or (rows, units), I16, y_q)],
                  {**_act(act), **(options or {})})


@cases("FULLY_CONNECTED")
def fully_connected_cases():
    return [
        _fc("int16", (1, 16), 6),
        _fc("int16_per_channel", (2, 12), 5, per_channel=True),
        _fc("int16_batches_keep_num_dims", (2, 3, 8), 4, out_shape=(2, 3, 4),
            options={"keep_num_dims": True}),
        _fc("int16_rank3_flattened", (2, 3, 8), 4),
        _fc("int16_relu", (3, 10), 4, act="RELU"),
        _fc("int16_relu6_per_channel", (2, 10), 4, act="RELU6", per_channel=True),
        _fc("int16_no_bias", (2, 10), 4, bias=False),
        _fc("int16_bias_int32", (2, 10), 4, bias_dtype="int32"),
        _fc("int16_bias_int32_per_channel", (2, 10), 4, per_channel=True, bias_dtype="int32"),
        _fc("int16_no_bias_int32_accumulator", (2, 10), 4, bias=False,
            options={"quantized_bias_type": 2}),
    ]


# ---- AVERAGE_POOL_2D, MAX_POOL_2D ---------------------------------------------------------------

def _pool(op, variant, in_shape, filt, stride, padding, act="NONE"):
    n, h, w, c = in_shape
    pad = tflite.Padding.SAME if padding == "SAME" else tflite.Padding.VALID
    _, (oh, ow) = resolve_padding(pad, (h, w), filt, stride, (1, 1))
    qx = q(X_SCALE)  # TFLM checks that input and output share the quantization
    return single(op, variant, [tensor("x", in_shape, I16, qx)],
                  [tensor("y", (n, oh, ow, c), I16, qx)],
                  {"padding": padding, "stride_h": stride[0], "stride_w": stride[1],
                   "filter_height": filt[0], "filter_width": filt[1], **_act(act)})


@cases("AVERAGE_POOL_2D", "MAX_POOL_2D")
def pool_cases():
    out = []
    for op in ("AVERAGE_POOL_2D", "MAX_POOL_2D"):
        out += [
            _pool(op, "int16", (1, 6, 6, 3), (2, 2), (2, 2), "VALID"),
            _pool(op, "int16_same_clipped", (2, 5, 7, 2), (3, 3), (2, 2), "SAME"),
            _pool(op, "int16_stride1", (1, 5, 5, 2), (3, 2), (1, 1), "SAME"),
            _pool(op, "int16_relu6", (1, 6, 6, 2), (2, 2), (1, 1), "VALID", act="RELU6"),
            _pool(op, "int16_relu", (1, 4, 6, 3), (3, 3), (1, 2), "SAME", act="RELU"),
        ]
    return out


# ---- ADD, MUL -------------------------------------------------------------------------------

ACTS = ("RELU", "RELU6", "RELU_N1_TO_1")
BROADCASTS = {  # name -> (a, b, output) shapes; TFLM broadcasts up to 6-D
    "broadcast": ((2, 3, 4), (3, 1), (2, 3, 4)),
    "broadcast_scalar": ((1,), (2, 5), (2, 5)),
    "broadcast_both": ((2, 1, 4), (1, 3, 1), (2, 3, 4)),
    "broadcast_rank5": ((2, 1, 3, 1, 2), (2, 1, 4, 1), (2, 2, 3, 4, 2)),
}
SHAPE = (2, 3, 5)


def _binary(op, variant, quants, shapes=(SHAPE, SHAPE, SHAPE), act="NONE", const_b=False):
    (sa, sb, sy), (qa, qb, qy) = shapes, quants
    data = _rng(f"{op}_{variant}").integers(-32768, 32768, sb) if const_b else None
    return single(op, variant, [tensor("a", sa, I16, qa), tensor("b", sb, I16, qb, data)],
                  [tensor("y", sy, I16, qy)], _act(act))


@cases("ADD")
def add_cases():
    qs = (q(0.0004), q(0.0003), q(0.0008))
    out = [_binary("ADD", "int16", qs),
           _binary("ADD", "int16_same_scale", (q(0.0005), q(0.0005), q(0.001))),
           _binary("ADD", "int16_pot_scales", (q(2**-11), q(2**-12), q(2**-10))),
           _binary("ADD", "int16_saturating", (q(0.001), q(0.002), q(0.0005))),
           _binary("ADD", "int16_const", qs, const_b=True)]
    out += [_binary("ADD", f"int16_{a.lower()}", (q(0.0004), q(0.0003), q(0.0003)), act=a)
            for a in ACTS]
    out += [_binary("ADD", f"int16_{n}", qs, s) for n, s in BROADCASTS.items()]
    return out


@cases("MUL")
def mul_cases():
    qs = (q(0.0004), q(0.0003), q(0.003))
    out = [_binary("MUL", "int16", qs),
           _binary("MUL", "int16_saturating", (q(0.001), q(0.002), q(0.0005))),
           _binary("MUL", "int16_pot_scales", (q(2**-11), q(2**-12), q(2**-10))),
           _binary("MUL", "int16_const", qs, const_b=True)]
    out += [_binary("MUL", f"int16_{a.lower()}", (q(0.0004), q(0.0003), q(0.004)), act=a)
            for a in ACTS]
    out += [_binary("MUL", f"int16_{n}", qs, s) for n, s in BROADCASTS.items()]
    return out


# ---- SOFTMAX, LOGISTIC, TANH ------------------------------------------------------------------

def _unary(op, variant, shape, qx, qy, dtype=I16, out_dtype=I16, options=None, gen=None):
    return single(op, variant, [tensor("x", shape, dtype, qx)],
                  [tensor("y", shape, out_dtype, qy)], options,
                  {"x": gen} if gen is not None else None)


@cases("SOFTMAX")
def softmax_cases():
    qy = q(1.0 / 32768)  # TFLM: int16 softmax output scale 2^-15, zero point 0
    return [
        _unary("SOFTMAX", "int16", (3, 10), q(0.0005), qy, options={"beta": 1.0}),
        _unary("SOFTMAX", "int16_beta", (2, 3, 7), q(0.0003), qy, options={"beta": 0.6}),
        _unary("SOFTMAX", "int16_wide_scale", (4, 16), q(0.004), qy, options={"beta": 1.0}),
        _unary("SOFTMAX", "int16_narrow_inputs", (5, 9), q(0.0002), qy, options={"beta": 2.0},
               gen=integers(-3000, 3000)),
        _unary("SOFTMAX", "int16_one_column", (4, 1), q(0.0005), qy, options={"beta": 1.0}),
        _unary("SOFTMAX", "int16_long_row", (2, 120), q(0.001), qy, options={"beta": 1.0}),
        # int8 in, int16 out (TFLM: output zero point -32768, scale 1/65536)
        _unary("SOFTMAX", "int8_to_int16", (3, 10), q(0.05, -7), q(1.0 / 65536, -32768),
               dtype="int8", options={"beta": 1.0}),
        _unary("SOFTMAX", "int8_to_int16_beta", (2, 3, 8), q(0.1, 20), q(1.0 / 65536, -32768),
               dtype="int8", options={"beta": 0.5}),
    ]


@cases("LOGISTIC", "TANH")
def logistic_tanh_cases():
    qy = q(1.0 / 32768)  # TFLM requires output scale 2^-15, zero point 0
    s = (2, 3, 50)
    out = []
    for op in ("LOGISTIC", "TANH"):
        out += [
            _unary(op, "int16", s, q(0.0005), qy),
            _unary(op, "int16_wide_scale", s, q(0.003), qy),
            _unary(op, "int16_narrow_scale", s, q(0.00002), qy),
            # 2^-12 is TFLM's power-of-two path (multiplier 3, no shift); for TANH also 2^-11
            _unary(op, "int16_pot_scale", s, q(2.0**-12), qy),
            _unary(op, "int16_pot_scale_2e-10", s, q(2.0**-10), qy),
        ]
    out.append(_unary("TANH", "int16_pot_scale_2e-11", s, q(2.0**-11), qy))
    return out


# ---- RELU, RELU6, LEAKY_RELU --------------------------------------------------------------------

@cases("RELU", "RELU6", "LEAKY_RELU")
def activation_cases():
    s = (2, 4, 6)
    return [
        _unary("RELU", "int16", s, q(0.0005), q(0.0003)),
        _unary("RELU", "int16_same_scale", s, q(0.0005), q(0.0005)),
        # TFLM's RELU6 clamps in the input's quantization; the output's is not used
        _unary("RELU6", "int16", s, q(0.0005), q(0.0005)),
        _unary("RELU6", "int16_narrow_scale", s, q(0.0001), q(0.0001)),
        _unary("LEAKY_RELU", "int16", s, q(0.0005), q(0.0004), options={"alpha": 0.2}),
        _unary("LEAKY_RELU", "int16_alpha_above_one", s, q(0.0005), q(0.001),
               options={"alpha": 1.7}),
        _unary("LEAKY_RELU", "int16_negative_alpha", s, q(0.0005), q(0.0005),
               options={"alpha": -0.3}),
    ]


# ---- MEAN -----------------------------------------------------------------------------------

def _mean(variant, shape, axes, keep, out_shape, qx, qy):
    axis = tensor("axis", (len(axes),), "int32", data=axes)
    return single("MEAN", variant, [tensor("x", shape, I16, qx), axis],
                  [tensor("y", out_shape, I16, qy)], {"keep_dims": keep})


@cases("MEAN")
def mean_cases():
    return [
        _mean("int16_axes12_keep_dims", (1, 4, 5, 3), [1, 2], True, (1, 1, 1, 3), q(0.0005),
              q(0.0002)),
        _mean("int16_axis_last", (3, 7), [-1], False, (3,), q(0.0005), q(0.0005)),
        _mean("int16_axis0", (5, 2, 3), [0], False, (2, 3), q(0.0004), q(0.0001)),
        _mean("int16_all", (2, 3, 4), [0, 1, 2], False, (), q(0.0005), q(0.00005)),
    ]


# ---- QUANTIZE, DEQUANTIZE -----------------------------------------------------------------------

@cases("QUANTIZE")
def quantize_cases():
    s = (2, 3, 7)
    return [
        _unary("QUANTIZE", "float32_to_int16", s, None, q(0.0002), dtype="float32",
               gen=uniform(-8, 8)),
        _unary("QUANTIZE", "float32_to_int16_saturating", s, None, q(0.00005),
               dtype="float32", gen=uniform(-4, 4)),
        _unary("QUANTIZE", "int8_to_int16", s, q(0.05, -7), q(0.0004), dtype="int8"),
        _unary("QUANTIZE", "int16_to_int8", s, q(0.0005), q(0.07, 3), out_dtype="int8"),
        _unary("QUANTIZE", "int16_to_int16", s, q(0.0005), q(0.0003)),
        _unary("QUANTIZE", "int16_to_int16_narrowing", s, q(0.0005), q(0.002)),
        _unary("QUANTIZE", "int16_to_int32", s, q(0.0005), q(0.0001), out_dtype="int32"),
        _unary("QUANTIZE", "int32_to_int16", s, q(0.0001), q(0.0005), dtype="int32",
               gen=integers(-200000, 200000)),
        _unary("QUANTIZE", "int32_to_int8", s, q(0.0001), q(0.05, 4), dtype="int32",
               out_dtype="int8", gen=integers(-70000, 70000)),
        _unary("QUANTIZE", "int8_to_int32", s, q(0.05, -7), q(0.001), dtype="int8",
               out_dtype="int32"),
        _unary("QUANTIZE", "int8_to_uint8", s, q(0.05, -7), q(0.05, 121), dtype="int8",
               out_dtype="uint8"),
        _unary("QUANTIZE", "int8_to_uint8_rescaled", s, q(0.05, -7), q(0.08, 130),
               dtype="int8", out_dtype="uint8"),
        _unary("QUANTIZE", "uint8_to_int8", s, q(0.05, 128), q(0.05, 0), dtype="uint8",
               out_dtype="int8"),
    ]


@cases("DEQUANTIZE")
def dequantize_cases():
    s = (2, 3, 7)
    return [
        _unary("DEQUANTIZE", "int16", s, q(0.0005), None, out_dtype="float32"),
        _unary("DEQUANTIZE", "int16_tiny_scale", s, q(1.3e-9), None, out_dtype="float32"),
        _unary("DEQUANTIZE", "uint8", s, q(0.05, 128), None, dtype="uint8",
               out_dtype="float32"),
    ]
