"""Legacy uint8-quantized TFLite (the converters before int8: MobileNet v1 quant) as LiteRT's
reference kernels compute it; tflite-micro refuses these models.

Most of LiteRT's uint8 kernels compute on differences from zero points, so a uint8 value v
with zero point z gives the results of the int8 kernel on v - 128 with zero point z - 128, and
the int8 result r is the uint8 result r + 128: ADD, MUL and QUANTIZE (float -> uint8) reuse
the int8 runtime routines on shifted values. LOGISTIC and TANH are LiteRT's 256-entry lookup
tables (PopulateLookupTable, float32). CONV_2D, DEPTHWISE_CONV_2D, FULLY_CONNECTED and the
pools take conv.py's and pool.py's loops with `activation_range` and `uint8_multiplier` here.
"""
from __future__ import annotations

import math

import numpy as np

from .. import loop_ir as ir
from .. import qparams as qp
from . import OpContext, const, lowers
from .elementwise import _elementwise, _q

U8 = "uint8"


def activation_range(act: str, scale: float, zero_point: int, dtype: str) -> tuple:
    """CalculateActivationRangeQuantized for an int8 or uint8 output."""
    if dtype == U8:
        lo, hi = qp.activation_range_int8(act, scale, zero_point - 128)
        return lo + 128, hi + 128
    return qp.activation_range_int8(act, scale, zero_point)


def uint8_multiplier(input_scale, filter_scale, output_scale, bias_scale=None) -> tuple:
    """LiteRT's uint8 CONV_2D / DEPTHWISE_CONV_2D / FULLY_CONNECTED multiplier:
    GetQuantizedConvolutionMultipler (input_scale * filter_scale in float32, widened, divided
    by the output scale in double); per-tensor filters only."""
    if np.size(filter_scale) != 1:
        raise NotImplementedError("uint8 weights quantized per channel (LiteRT takes per-tensor)")
    return qp.fc_output_multipliers(input_scale, np.ravel(filter_scale), output_scale,
                                    bias_scale)


def _to_s8(v: ir.Expr) -> ir.Expr:
    return ir.cast(ir.cast(v, "int32") - 128, "int8")


def _to_u8(v: ir.Expr) -> ir.Expr:
    return ir.cast(ir.cast(v, "int32") + 128, U8)


def _shifted(t) -> tuple:
    s, z = _q(t)
    return s, z - 128 if t.dtype == U8 else z


@lowers("add", "mul", when=lambda ctx: ctx.output().dtype == U8)
def add_mul_uint8(ctx: OpContext) -> ir.Kernel:
    """reference_ops::Add / Mul (uint8): offsets, left shift 20 for ADD, as int8."""
    a, b, y = ctx.input(0), ctx.input(1), ctx.output()
    if a.dtype != U8 or b.dtype != U8:
        raise NotImplementedError(f"{ctx.node.op} {a.dtype}, {b.dtype} -> uint8")
    act = ctx.attrs["activation"]
    params_fn, fn = ((qp.add_params, "mf_add_s8") if ctx.node.op == "add"
                     else (qp.mul_params, "mf_mul_s8"))
    args = [ir.Const(int(v)) for v in
            params_fn(*_shifted(a), *_shifted(b), *_shifted(y), act).values()]
    return _elementwise(ctx, lambda p, q: _to_u8(ir.call(fn, _to_s8(p), _to_s8(q), *args,
                                                          dtype="int8")),
                        f"activation {act}, uint8 as int8 shifted by 128")


@lowers("quantize", when=lambda ctx: ctx.input(0).dtype == "float32"
        and ctx.output().dtype == U8)
def quantize_float_uint8(ctx: OpContext) -> ir.Kernel:
    """reference_ops::AffineQuantize: round(x / scale) + zero point, clamped to [0, 255]."""
    s, zp = _shifted(ctx.output())
    return _elementwise(ctx, lambda p: _to_u8(ir.call(
        "mf_quantize_f32_s8", p, ir.Const(s, "float32"), ir.Const(zp), dtype="int8")))


def _lookup(fn, x, y) -> np.ndarray:
    """LiteRT's PopulateLookupTable<uint8_t>: dequantize (float32), transform, round half away
    from zero of transformed / output scale, plus the zero point, clamped."""
    f = np.float32
    (si, zi), (so, zo) = _q(x), _q(y)
    inverse = f(1.0) / f(so)
    table = []
    for v in range(256):
        t = fn(f(si) * f(v - zi))
        r = float(f(t) * inverse)
        r = math.copysign(math.floor(abs(r) + 0.5), r)
        table.append(min(max(int(f(r) + f(zo)), 0), 255))
    return np.asarray(table, np.uint8)


def _logistic(v):
    return np.float32(1.0) / (np.float32(1.0) + np.float32(math.exp(-float(v))))


def _tanh(v):
    return np.float32(math.tanh(float(v)))


@lowers("logistic", "tanh", when=lambda ctx: ctx.input(0).dtype == U8)
def logistic_tanh_uint8(ctx: OpContext) -> ir.Kernel:
    x, y = ctx.input(0), ctx.output()
    if y.dtype != U8:
        raise NotImplementedError(f"{ctx.node.op} uint8 -> {y.dtype}")
    table = _lookup(_logistic if ctx.node.op == "logistic" else _tanh, x, y)
    k = _elementwise(ctx, lambda p: ir.Load("table", ir.cast(p, "int32"), U8),
                     "LiteRT's 256-entry lookup table")
    return ir.Kernel(k.name, k.buffers + (const("table", table, U8),), k.body, k.doc)


def _shifted_unary(ctx: OpContext, fn: str, params: dict, doc: str) -> ir.Kernel:
    args = [ir.Const(int(v)) for v in params.values()]
    return _elementwise(ctx, lambda p: _to_u8(ir.call(fn, _to_s8(p), *args, dtype="int8")),
                        doc + ", uint8 as int8 shifted by 128")


def _uint8_unary(ctx: OpContext) -> bool:
    return ctx.input(0).dtype == U8 and ctx.output().dtype == U8


@lowers("relu", "relu6", when=_uint8_unary)
def relu_uint8(ctx: OpContext) -> ir.Kernel:
    """LiteRT's QuantizedReluX<uint8_t> (RELU and RELU6 alike): requantized by
    QuantizeMultiplier(float32 input_scale / output_scale), clamped to [0 or 6] quantized with
    the output's scale (roundf) and zero point, within [0, 255]."""
    x, y = ctx.input(0), ctx.output()
    (si, zi), (so, zo) = _q(x), _q(y)
    params = qp.relu_params(si, zi - 128, so, zo - 128)
    lo = max(0, zo + qp.round_half_away(np.float32(0.0) / np.float32(so)))
    hi = 255
    if ctx.node.op == "relu6":
        hi = min(255, zo + qp.round_half_away(np.float32(6.0) / np.float32(so)))
    params.update(act_min=lo - 128, act_max=hi - 128)
    return _shifted_unary(ctx, "mf_relu_s8", params, f"clamped to [{lo}, {hi}]")


@lowers("leaky_relu", when=_uint8_unary)
def leaky_relu_uint8(ctx: OpContext) -> ir.Kernel:
    x, y = ctx.input(0), ctx.output()
    params = qp.leaky_relu_params(*_shifted(x), *_shifted(y), ctx.attrs["alpha"])
    return _shifted_unary(ctx, "mf_leaky_relu_s8", params, f"alpha {ctx.attrs['alpha']}")


@lowers("hard_swish", when=_uint8_unary)
def hard_swish_uint8(ctx: OpContext) -> ir.Kernel:
    x, y = ctx.input(0), ctx.output()
    return _shifted_unary(ctx, "mf_hard_swish_s8", qp.hard_swish_params(*_shifted(x),
                                                                         *_shifted(y)), "")
