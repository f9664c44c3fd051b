"""Conformance cases: legacy uint8 quantization (the converters before int8, MobileNet v1
quant): CONV_2D, DEPTHWISE_CONV_2D, FULLY_CONNECTED, AVERAGE_POOL_2D, MAX_POOL_2D, ADD, MUL,
SOFTMAX, LOGISTIC, TANH, RELU, RELU6, LEAKY_RELU, HARD_SWISH, CONCATENATION, RESHAPE, QUANTIZE
(float -> uint8, uint8 -> uint8; DEQUANTIZE and uint8 <-> int8 are in int16.py, TFLM runs them).

tflite-micro refuses uint8, so the reference is LiteRT's reference kernels ("litert_ref").
Quantization as those converters wrote it: uint8 activations and weights with zero points
(per-tensor), int32 biases at input_scale * weight_scale; SOFTMAX / LOGISTIC outputs 1/256
with zero point 0, TANH 1/128 with 128.
"""
from __future__ import annotations

import zlib

import numpy as np

from . import cases, q, single, tensor

U8 = "uint8"
QX = q(0.05, 120)


def _rng(name):
    return np.random.default_rng(zlib.crc32(name.encode()))


def _u8(name, shape, scale, zp, rng):
    return tensor(name, shape, U8, q(scale, zp), rng.integers(0, 256, shape))


def _bias(n, w_scale, rng):
    return tensor("b", (n,), "int32", q(0.05 * w_scale, 0), rng.integers(-800, 801, n))


def _case(*args, **kw):
    return single(*args, reference="litert_ref", **kw)


@cases("CONV_2D", "DEPTHWISE_CONV_2D", "FULLY_CONNECTED")
def layer_cases():
    out = []
    for stride, padding, act in [(1, "SAME", "RELU6"), (2, "VALID", "NONE"), (2, "SAME", "RELU")]:
        rng = _rng(f"conv{stride}{padding}{act}")
        hw = -(-7 // stride) if padding == "SAME" else (7 - 3) // stride + 1
        opts = {"padding": padding, "stride_h": stride, "stride_w": stride,
                "fused_activation_function": act}
        w = _u8("w", (4, 3, 3, 3), 0.02, 135, rng)
        out.append(_case("CONV_2D", f"uint8_s{stride}_{padding.lower()}_{act.lower()}",
                         [tensor("x", (1, 7, 7, 3), U8, QX), w, _bias(4, 0.02, rng)],
                         [tensor("y", (1, hw, hw, 4), U8, q(0.25, 118))], opts))
        w = _u8("w", (1, 3, 3, 6), 0.03, 128, rng)
        out.append(_case("DEPTHWISE_CONV_2D", f"uint8_s{stride}_{padding.lower()}_"
                         f"{act.lower()}", [tensor("x", (1, 7, 7, 3), U8, QX), w,
                                            _bias(6, 0.03, rng)],
                         [tensor("y", (1, hw, hw, 6), U8, q(0.12, 110))],
                         {**opts, "depth_multiplier": 2}))
    rng = _rng("fc")
    out.append(_case("FULLY_CONNECTED", "uint8", [tensor("x", (2, 8), U8, QX),
                                                   _u8("w", (5, 8), 0.02, 128, rng),
                                                   _bias(5, 0.02, rng)],
                     [tensor("y", (2, 5), U8, q(0.15, 100))],
                     {"fused_activation_function": "RELU"}))
    return out


@cases("AVERAGE_POOL_2D", "MAX_POOL_2D")
def pool_cases():
    out = []
    for op in ("AVERAGE_POOL_2D", "MAX_POOL_2D"):
        for padding, act in [("SAME", "NONE"), ("VALID", "RELU6")]:
            w = 3 if padding == "SAME" else 2  # 6x5 input, 2x3 windows, stride 2
            out.append(_case(op, f"uint8_{padding.lower()}_{act.lower()}",
                             [tensor("x", (1, 6, 5, 2), U8, QX)],
                             [tensor("y", (1, 3, w, 2), U8, QX)],
                             {"padding": padding, "stride_h": 2, "stride_w": 2,
                              "filter_height": 2, "filter_width": 3,
                              "fused_activation_function": act}))
    return out


@cases("ADD", "MUL")
def binary_cases():
    out = []
    for op, yq in (("ADD", q(0.1, 125)), ("MUL", q(0.3, 125))):
        rng = _rng(op)
        out.append(_case(op, "uint8", [tensor("a", (1, 4, 4), U8, QX),
                                       tensor("b", (1, 4, 4), U8, q(0.07, 131))],
                         [tensor("y", (1, 4, 4), U8, yq)]))
        out.append(_case(op, "uint8_broadcast_relu",
                         [tensor("a", (1, 2, 2, 4), U8, QX), _u8("b", (4,), 0.07, 131, rng)],
                         [tensor("y", (1, 2, 2, 4), U8, yq)],
                         {"fused_activation_function": "RELU"}))
    return out


@cases("SOFTMAX", "LOGISTIC", "TANH", "RELU", "RELU6", "LEAKY_RELU", "HARD_SWISH")
def unary_cases():
    x = tensor("x", (2, 40), U8, q(0.06, 128))
    soft = q(1 / 256, 0)
    return [
        _case("SOFTMAX", "uint8", [x], [tensor("y", (2, 40), U8, soft)], {"beta": 1.0}),
        _case("LOGISTIC", "uint8", [x], [tensor("y", (2, 40), U8, soft)]),
        _case("TANH", "uint8", [x], [tensor("y", (2, 40), U8, q(1 / 128, 128))]),
        _case("RELU", "uint8", [x], [tensor("y", (2, 40), U8, q(0.03, 10))]),
        _case("RELU6", "uint8", [x], [tensor("y", (2, 40), U8, q(0.025, 3))]),
        _case("LEAKY_RELU", "uint8", [x], [tensor("y", (2, 40), U8, q(0.05, 140))],
              {"alpha": 0.2}),
        _case("HARD_SWISH", "uint8", [x], [tensor("y", (2, 40), U8, q(0.04, 30))]),
    ]


@cases("CONCATENATION", "RESHAPE", "QUANTIZE")
def data_cases():
    rng = _rng("data")
    return [
        _case("CONCATENATION", "uint8_two_scales",
              [tensor("a", (1, 3, 4), U8, QX), _u8("b", (1, 2, 4), 0.03, 90, rng)],
              [tensor("y", (1, 5, 4), U8, q(0.07, 131))], {"axis": 1}),
        _case("RESHAPE", "uint8", [tensor("x", (1, 2, 6), U8, QX),
                                   tensor("s", (2,), "int32", data=np.array([3, 4]))],
              [tensor("y", (3, 4), U8, QX)], {"new_shape": [3, 4]}),
        _case("QUANTIZE", "float_to_uint8", [tensor("x", (3, 16), "float32")],
              [tensor("y", (3, 16), U8, QX)]),
        _case("QUANTIZE", "uint8_to_uint8", [tensor("x", (3, 16), U8, QX)],
              [tensor("y", (3, 16), U8, q(0.07, 131))]),
    ]
