"""Conformance cases: layer operators (BATCH_MATMUL, TRANSPOSE_CONV, L2_POOL_2D, RESIZE_*).

Quantization as the TFLite converter writes it: int8 activations asymmetric, constant int8
weights symmetric (per output channel for TRANSPOSE_CONV, axis 0), int32 biases at
input_scale * weight_scale, int16 tensors with zero point 0 and int64 biases. Output scales are
chosen so that the random inputs use much of the output range without saturating it all.
"""
from __future__ import annotations

import zlib

import numpy as np

from mcuforge.ir.graph import Quant

from . import cases, q, single, tensor, uniform


def _rng(name: str) -> np.random.Generator:
    return np.random.default_rng(zlib.crc32(name.encode()))


def _weights(name: str, shape, lo=-127, hi=127) -> np.ndarray:
    return _rng(name).integers(lo, hi + 1, shape)


# ---- BATCH_MATMUL --------------------------------------------------------------------------

_MM_QUANT = {  # dtype -> (lhs, rhs, output) quantization
    "int8": (q(0.05, 3), q(0.04, -7), q(0.6, -4)),
    "int16": (q(0.001), q(0.0008), q(0.07)),
}


def _matmul(variant: str, dtype: str, a_shape, b_shape, y_shape, adj_x=False, adj_y=False,
            const_rhs=False):
    qa, qb, qy = _MM_QUANT.get(dtype, (None, None, None))
    if const_rhs:  # constant weights: symmetric, as the converter writes them
        qb = q(qb.scale[0]) if qb is not None else None
        if dtype == "float32":
            data = _rng(f"bmm_{variant}").uniform(-2, 2, b_shape)
        else:
            data = _weights(f"bmm_{variant}", b_shape, *((-127, 127) if dtype == "int8"
                                                          else (-32767, 32767)))
        b = tensor("b", b_shape, dtype, qb, data=data)
    else:
        b = tensor("b", b_shape, dtype, qb)
    return single("BATCH_MATMUL", variant, [tensor("a", a_shape, dtype, qa), b],
                  [tensor("y", y_shape, dtype, qy)], {"adj_x": adj_x, "adj_y": adj_y})


@cases("BATCH_MATMUL")
def batch_matmul_cases():
    out = []
    for dtype in ("float32", "int8", "int16"):
        out += [
            _matmul(f"{dtype}", dtype, (2, 3, 4), (2, 4, 5), (2, 3, 5)),
            _matmul(f"{dtype}_adj_x", dtype, (2, 4, 3), (2, 4, 5), (2, 3, 5), adj_x=True),
            _matmul(f"{dtype}_adj_y", dtype, (2, 3, 4), (2, 5, 4), (2, 3, 5), adj_y=True),
            _matmul(f"{dtype}_adj_xy", dtype, (1, 4, 3), (1, 5, 4), (1, 3, 5), True, True),
            # batch axes broadcast both ways, ranks differ
            _matmul(f"{dtype}_broadcast", dtype, (2, 1, 3, 4), (3, 4, 2), (2, 3, 3, 2)),
            _matmul(f"{dtype}_rank2", dtype, (3, 6), (6, 4), (3, 4)),
            _matmul(f"{dtype}_rank5", dtype, (2, 1, 2, 3, 4), (3, 1, 4, 2), (2, 3, 2, 3, 2)),
            _matmul(f"{dtype}_const_rhs", dtype, (1, 2, 3, 8), (8, 5), (1, 2, 3, 5),
                    const_rhs=True),
            _matmul(f"{dtype}_const_rhs_adj_y", dtype, (2, 3, 8), (1, 5, 8), (2, 3, 5),
                    adj_y=True, const_rhs=True),
        ]
    return out


# ---- TRANSPOSE_CONV ------------------------------------------------------------------------

def _transpose_conv(variant: str, dtype: str, x_shape, w_shape, y_shape, stride, padding,
                    bias=True, act="NONE", per_channel=True, bias_dtype=None, runtime_w=False):
    oc = w_shape[0]
    rng = _rng(f"tconv_{variant}")
    if dtype == "float32":
        qx = qw = qy = qbias = None
        w = tensor("w", w_shape, "float32", data=rng.uniform(-1, 1, w_shape))
        b_data = rng.uniform(-1, 1, oc)
        bias_dtype = "float32"
    else:
        sx = 0.05 if dtype == "int8" else 0.0005
        qx = q(sx, -5 if dtype == "int8" else 0)
        w_scales = rng.uniform(0.004, 0.02, oc if per_channel else 1).astype(np.float32)
        qw = Quant(tuple(float(s) for s in w_scales), (0,) * len(w_scales), 0)
        w = tensor("w", w_shape, "int8", qw, data=_weights(f"tconv_{variant}_w", w_shape))
        # sums of ~ k*k*c / stride^2 taps of x w, whose stds are about (std_q sx)(74 sw) with
        # std_q the std of uniformly random values of the type: pick the output scale
        taps = w_shape[1] * w_shape[2] * w_shape[3] / (stride[0] * stride[1])
        std_q = 74 if dtype == "int8" else 18900
        spread = std_q * sx * 74 * float(w_scales.mean()) * np.sqrt(taps) * 4
        qy = q(spread / (127 if dtype == "int8" else 32767), 6 if dtype == "int8" else 0)
        bias_scales = np.broadcast_to(np.float32(sx) * w_scales, (oc,))
        qbias = Quant(tuple(float(s) for s in bias_scales), (0,) * oc, 0) if per_channel else \
            q(float(bias_scales[0]))
        b_data = rng.integers(-3000, 3000, oc)
        bias_dtype = bias_dtype or ("int32" if dtype == "int8" else "int64")
    if runtime_w:  # weights computed by the model: a model input here
        w = tensor("w", w_shape, w.dtype, w.quant)
    ins = [tensor("output_shape", (4,), "int32", data=np.array(y_shape)), w,
           tensor("x", x_shape, dtype, qx)]
    if bias:
        ins.append(tensor("bias", (oc,), bias_dtype, qbias, data=b_data))
    options = {"padding": padding, "stride_h": stride[0], "stride_w": stride[1],
               "fused_activation_function": act}
    return single("TRANSPOSE_CONV", variant, ins, [tensor("y", y_shape, dtype, qy)], options)


@cases("TRANSPOSE_CONV")
def transpose_conv_cases():
    out = []
    for dtype in ("float32", "int8", "int16"):
        out += [
            _transpose_conv(f"{dtype}_same_stride2", dtype, (1, 3, 3, 2), (3, 3, 3, 2),
                            (1, 6, 6, 3), (2, 2), "SAME"),
            _transpose_conv(f"{dtype}_valid_stride2", dtype, (1, 3, 4, 2), (2, 3, 3, 2),
                            (1, 7, 9, 2), (2, 2), "VALID"),
            _transpose_conv(f"{dtype}_same_stride1_no_bias", dtype, (2, 4, 4, 3),
                            (4, 3, 3, 3), (2, 4, 4, 4), (1, 1), "SAME", bias=False),
            _transpose_conv(f"{dtype}_valid_stride_2x3", dtype, (1, 3, 2, 2), (2, 2, 4, 2),
                            (1, 6, 7, 2), (2, 3), "VALID"),
            _transpose_conv(f"{dtype}_same_stride2_relu", dtype, (1, 4, 3, 2), (3, 4, 4, 2),
                            (1, 8, 6, 3), (2, 2), "SAME", act="RELU"),
        ]
    out += [
        _transpose_conv("int8_per_tensor", "int8", (1, 3, 3, 2), (3, 3, 3, 2), (1, 6, 6, 3),
                        (2, 2), "SAME", per_channel=False),
        _transpose_conv("int16_bias_int16", "int16", (1, 3, 3, 2), (3, 3, 3, 2), (1, 5, 5, 3),
                        (2, 2), "SAME", bias_dtype="int16"),
        _transpose_conv("int8_same_stride2_relu6", "int8", (1, 3, 3, 2), (2, 3, 3, 2),
                        (1, 6, 6, 2), (2, 2), "SAME", act="RELU6"),
        _transpose_conv("float32_runtime_weights", "float32", (1, 3, 3, 2), (3, 3, 3, 2),
                        (1, 6, 6, 3), (2, 2), "SAME", runtime_w=True),
        _transpose_conv("int8_runtime_weights", "int8", (1, 3, 3, 2), (3, 3, 3, 2),
                        (1, 6, 6, 3), (2, 2), "SAME", per_channel=False, runtime_w=True),
    ]
    return out


# ---- L2_POOL_2D ----------------------------------------------------------------------------

def _l2_pool(variant, x_shape, y_shape, filt, stride, padding, act="NONE", gen=None):
    options = {"padding": padding, "stride_h": stride[0], "stride_w": stride[1],
               "filter_height": filt[0], "filter_width": filt[1],
               "fused_activation_function": act}
    return single("L2_POOL_2D", variant, [tensor("x", x_shape, "float32")],
                  [tensor("y", y_shape, "float32")], options, gens={"x": gen} if gen else None)


@cases("L2_POOL_2D")
def l2_pool_cases():
    return [
        _l2_pool("float32_valid_2x2", (1, 6, 6, 3), (1, 3, 3, 3), (2, 2), (2, 2), "VALID"),
        _l2_pool("float32_same_3x3_stride2", (2, 5, 7, 2), (2, 3, 4, 2), (3, 3), (2, 2), "SAME"),
        _l2_pool("float32_same_3x2_stride1", (1, 4, 5, 3), (1, 4, 5, 3), (3, 2), (1, 1), "SAME"),
        _l2_pool("float32_relu6", (1, 6, 6, 2), (1, 3, 3, 2), (3, 3), (2, 2), "SAME", "RELU6",
                 uniform(-12, 12)),
        _l2_pool("float32_relu_n1_to_1", (1, 4, 4, 2), (1, 2, 2, 2), (2, 2), (2, 2), "VALID",
                 "RELU_N1_TO_1", uniform(-1.5, 1.5)),
    ]


# ---- RESIZE_BILINEAR / RESIZE_NEAREST_NEIGHBOR ---------------------------------------------

_RESIZE_QUANT = {"float32": None, "int8": q(0.05, -3), "int16": q(0.001)}
_FLAGS = {"": {}, "_align_corners": {"align_corners": True},
          "_half_pixel": {"half_pixel_centers": True}}
_SIZES = [  # (suffix, input shape, output size)
    ("_up", (1, 3, 4, 2), (5, 7)),
    ("_down", (2, 7, 6, 3), (3, 4)),
    ("_mixed", (1, 4, 5, 2), (8, 3)),
    ("_same_h", (1, 4, 5, 2), (4, 10)),
]


def _resize(op, variant, dtype, x_shape, hw, flags, **kw):
    qx = _RESIZE_QUANT[dtype]
    y_shape = (x_shape[0], *hw, x_shape[3])
    return single(op, variant, [tensor("x", x_shape, dtype, qx),
                                tensor("size", (2,), "int32", data=np.array(hw))],
                  [tensor("y", y_shape, dtype, qx)], flags, **kw)


@cases("RESIZE_NEAREST_NEIGHBOR")
def resize_nearest_cases():
    out = []
    for dtype in ("float32", "int8", "int16"):
        for flag, options in _FLAGS.items():
            for size, x_shape, hw in _SIZES:
                out.append(_resize("RESIZE_NEAREST_NEIGHBOR", f"{dtype}{flag}{size}", dtype,
                                   x_shape, hw, options))
    # TFLM's nearest kernel also takes both flags: rounding of (o + 0.5) * align-corners scale
    both = {"align_corners": True, "half_pixel_centers": True}
    out += [_resize("RESIZE_NEAREST_NEIGHBOR", f"int8_align_corners_half_pixel{size}", "int8",
                    x_shape, hw, both) for size, x_shape, hw in _SIZES]
    return out


@cases("RESIZE_BILINEAR")
def resize_bilinear_cases():
    out = []
    for dtype in ("float32", "int8", "int16"):
        # TFLM's kernel takes float32 and int8; int16 is TFLite's ResizeBilinearInteger, which
        # LiteRT runs
        kw = {"reference": "litert"} if dtype == "int16" else {}
        for flag, options in _FLAGS.items():
            for size, x_shape, hw in _SIZES:
                out.append(_resize("RESIZE_BILINEAR", f"{dtype}{flag}{size}", dtype, x_shape, hw,
                                   options, **kw))
    return out
