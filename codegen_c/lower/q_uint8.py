"""Legacy uint8-quantized TFLite (the converters before int8: MobileNet v1 quant) as LiteRT's
reference kernels compute it; tflite-micro refuses these models.

Requantization is MultiplyByQuantizedMultiplier as tflite-micro's (`mbqm`), except in
FULLY_CONNECTED, whose LiteRT uint8 kernel rounds once (measured on 5120 outputs: single
rounding matched all, double rounding missed 43 ties; conv, depthwise, ADD, MUL, RELU,
LEAKY_RELU and requantize matched double rounding on thousands of values). CONV_2D,
DEPTHWISE_CONV_2D and FULLY_CONNECTED take conv.py's loops with `activation_range`,
`uint8_multiplier` and `mbqm` from here; ADD, MUL, RELU(6), LEAKY_RELU and uint8 -> uint8
QUANTIZE are written here; HARD_SWISH and QUANTIZE float -> uint8 reuse the int8 routines on
values shifted by 128 (a uint8 value v with zero point z is the int8 v - 128 with z - 128).
LOGISTIC and TANH are LiteRT's 256-entry lookup tables (PopulateLookupTable, float32); the
pools take pool.py's loops with `activation_range`.
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
    """LiteRT's uint8 CONV_2D / DEPTHWISE_CONV_2D / FULLY_CONNECTED multiplier
    (GetQuantizedConvolutionMultipler): double(input_scale) * double(filter_scale) /
    double(output_scale), per-tensor filters only. (TFLM's int8 FULLY_CONNECTED forms the
    product in float32; LiteRT's uint8 kernels do not: measured, a tie rounds apart.)"""
    if np.size(filter_scale) != 1:
        raise NotImplementedError("uint8 weights quantized per channel (LiteRT takes per-tensor)")
    return qp.conv_output_multipliers(input_scale, np.ravel(filter_scale), output_scale)


def _to_s8(v: ir.Expr) -> ir.Expr:
    return ir.cast(ir.cast(v, "int32") - 128, "int8")


def _to_u8(v: ir.Expr) -> ir.Expr:
    return ir.cast(ir.cast(v, "int32") + 128, U8)


def _shifted(t) -> tuple:
    s, z = _q(t)
    return s, z - 128 if t.dtype == U8 else z


SINGLE = {"fully_connected"}  # ops whose LiteRT kernels round once (see the module doc)


def mbqm(x: ir.Expr, mult: int, shift: int, op: str) -> ir.Expr:
    """MultiplyByQuantizedMultiplier as LiteRT's uint8 kernel of `op` rounds."""
    if op in SINGLE:
        return mbqm_single(x, mult, shift)
    return ir.call("mf_mbqm", x, ir.Const(int(mult)), ir.Const(int(shift)))


def mbqm_single(x: ir.Expr, mult: int, shift: int) -> ir.Expr:
    """MultiplyByQuantizedMultiplier with TFLITE_SINGLE_ROUNDING: (x * mult + 2^(30 - shift))
    >> (31 - shift) in int64."""
    total = 31 - int(shift)
    v = ir.cast(x, "int64") * ir.Const(int(mult), "int64") + ir.Const(1 << (total - 1), "int64")
    return ir.cast(ir.binop(">>", v, ir.Const(total)), "int32")


def _v(p: ir.Expr) -> ir.Expr:
    return ir.cast(p, "int32")


def _store_u8(v: ir.Expr, lo: int, hi: int) -> ir.Expr:
    return ir.cast(ir.clamp(v, ir.Const(lo), ir.Const(hi)), U8)


@lowers("add", "mul", when=lambda ctx: ctx.output().dtype == U8)
def add_mul_uint8(ctx: OpContext) -> ir.Kernel:
    """reference_ops::Add / Mul (uint8): offsets, ADD's inputs shifted left 20 and rescaled to
    twice the larger input scale, then the output multiplier; parameters as LiteRT's Prepare
    (the int8 ones, computed on the shifted zero points, with the range shifted back)."""
    a, b, y = ctx.input(0), ctx.input(1), ctx.output()
    if a.dtype != U8 or b.dtype != U8:
        raise NotImplementedError(f"{ctx.node.op} {a.dtype}, {b.dtype} -> uint8")
    act = ctx.attrs["activation"]
    (s1, z1), (s2, z2), (so, zo) = _q(a), _q(b), _q(y)
    lo, hi = activation_range(act, so, zo, U8)
    op = ctx.node.op
    if ctx.node.op == "add":
        p = qp.add_params(s1, z1, s2, z2, so, zo)

        def value(x1, x2):
            one = mbqm((_v(x1) - z1) * (1 << p["left_shift"]), p["input1_multiplier"],
                       p["input1_shift"], op)
            two = mbqm((_v(x2) - z2) * (1 << p["left_shift"]), p["input2_multiplier"],
                       p["input2_shift"], op)
            out = mbqm(one + two, p["output_multiplier"], p["output_shift"], op) + zo
            return _store_u8(out, lo, hi)
    else:
        p = qp.mul_params(s1, z1, s2, z2, so, zo)

        def value(x1, x2):
            prod = (_v(x1) - z1) * (_v(x2) - z2)
            return _store_u8(mbqm(prod, p["output_multiplier"], p["output_shift"], op) + zo,
                             lo, hi)
    return _elementwise(ctx, value, f"activation {act} ([{lo}, {hi}]), single rounding")


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
    p = qp.relu_params(si, zi, so, zo)
    lo = max(0, zo + qp.round_half_away(np.float32(0.0) / np.float32(so)))
    hi = 255
    if ctx.node.op == "relu6":
        hi = min(255, zo + qp.round_half_away(np.float32(6.0) / np.float32(so)))
    return _elementwise(ctx, lambda v: _store_u8(
        mbqm(_v(v) - zi, p["output_multiplier"], p["output_shift"], "relu") + zo, lo, hi),
        f"clamped to [{lo}, {hi}], single rounding")


@lowers("leaky_relu", when=_uint8_unary)
def leaky_relu_uint8(ctx: OpContext) -> ir.Kernel:
    """reference_ops::QuantizeLeakyRelu (uint8): x - zero point requantized by the identity
    multiplier when >= 0, else by the alpha one; + output zero point, clamped."""
    x, y = ctx.input(0), ctx.output()
    (si, zi), (so, zo) = _q(x), _q(y)
    p = qp.leaky_relu_params(si, zi, so, zo, ctx.attrs["alpha"])

    def value(v):
        d = _v(v) - zi
        pos = mbqm(d, p["output_multiplier_identity"], p["output_shift_identity"], "leaky_relu")
        neg = mbqm(d, p["output_multiplier_alpha"], p["output_shift_alpha"], "leaky_relu")
        return _store_u8(ir.select(d.ge(ir.Const(0)), pos, neg) + zo, 0, 255)
    return _elementwise(ctx, value, f"alpha {ctx.attrs['alpha']}, single rounding")


@lowers("quantize", when=lambda ctx: ctx.input(0).dtype == U8 and ctx.output().dtype == U8)
def requantize_uint8(ctx: OpContext) -> ir.Kernel:
    """reference_ops::Requantize (uint8 -> uint8): MultiplyByQuantizedMultiplier of x - input
    zero point by QuantizeMultiplier(double(s_in) / double(s_out)), + output zero point."""
    x, y = ctx.input(0), ctx.output()
    (si, zi), (so, zo) = _q(x), _q(y)
    mult, shift = qp.quantize_multiplier(qp.f32(si) / qp.f32(so))
    return _elementwise(ctx, lambda v: _store_u8(mbqm(_v(v) - zi, mult, shift, "quantize") + zo,
                                                 0, 255), "single rounding")


@lowers("hard_swish", when=_uint8_unary)
def hard_swish_uint8(ctx: OpContext) -> ir.Kernel:
    x, y = ctx.input(0), ctx.output()
    return _shifted_unary(ctx, "mf_hard_swish_s8", qp.hard_swish_params(*_shifted(x),
                                                                         *_shifted(y)), "")
