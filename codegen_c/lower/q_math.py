"""Lowerings: TFLite's math family where TFLM computes differently from the generic lowerings,
bit-exact with TFLM:
  - quantized unary ABS (int8/int16), RSQRT (int8: a 256-entry table; int16: mf_rsqrt_q per
    element) and ELU (int8: TFLM's own 256-entry table, built here the same way),
  - unary marked "tflm" on float: ROUND (RoundToNearest) and ELU (expm1),
  - quantized PRELU (TFLM's two multipliers; alpha int8, broadcast),
  - int8 LOG_SOFTMAX (one mf_log_softmax_s8 call per row),
  - l2_normalization, float (TFLM's reference loop) and int8 (one mf_l2norm_s8 call per row).
Compile-time parameters are computed here as TFLM's Prepare computes them (float32 where TFLM
divides floats, double where it widens first).

Registered with `@lowers(op, when=...)` so they serve only the nodes they accept; see
codegen_c/lower/__init__.py.
"""
from __future__ import annotations

import numpy as np

from .. import loop_ir as ir
from .. import mathmirror, qmath
from .. import qparams as qp
from . import OpContext, const, describe, lowers
from .elementwise import broadcast_index, operand_names

LIMITS = {"int8": (-128, 127), "int16": (-32768, 32767)}
F = "float32"


def _q(t):
    return float(np.float32(t.quant.scale[0])), int(t.quant.zero_point[0])


def _f(v) -> ir.Const:
    return ir.Const(float(np.float32(v)), F)


def _i(v) -> ir.Const:
    return ir.Const(int(v))


def _minus(zero_point: int, name: str = "x") -> str:
    """'x - 3' / 'x + 10' / 'x': a value less its zero point, for kernel comments."""
    if zero_point == 0:
        return name
    return f"{name} {'-' if zero_point > 0 else '+'} {abs(zero_point)}"


def _store_all(ctx: OpContext, body_fn, extra: str = "", consts=()) -> ir.Kernel:
    """for every element i: body_fn(x_i, i) -> statements (x and y of the same shape)."""
    x, y = ctx.input(0), ctx.output()
    loop = ir.loops([("i", y.size)], lambda i: body_fn(ir.Load("x", i, x.dtype), i))
    return ir.Kernel(ctx.name, tuple(ctx.io_buffers() + list(consts)), loop,
                     describe(ctx, extra))


def _table(ctx: OpContext, values, extra: str) -> ir.Kernel:
    """y[i] = lut[x[i] + 128]: an int8 -> int8 function tabulated at compile time."""
    lut = const("lut", values, "int8", "output for each input value -128..127")
    return _store_all(ctx, lambda v, i: [ir.Store("y", i, ir.Load("lut", v + 128, "int8"))],
                      extra, [lut])


# ---- quantized unary: ABS, RSQRT, ELU ------------------------------------------------------

def _quantized_unary(ctx: OpContext) -> bool:
    return ctx.attrs["fn"] in ("abs", "rsqrt", "elu") and ctx.input(0).quant is not None


@lowers("unary", when=_quantized_unary)
def quantized_unary(ctx: OpContext) -> ir.Kernel:
    return {"abs": _abs, "rsqrt": _rsqrt, "elu": _elu}[ctx.attrs["fn"]](ctx)


def _abs(ctx: OpContext) -> ir.Kernel:
    """AbsEvalQuantized: |x - zp_in| requantized by QuantizeMultiplier(s_in / s_out) when the
    scales differ (else only shifted to the output zero point), clamped to the type. The ratio
    is formed in double: the tflite-micro release the conformance suite runs does so (int16
    outputs show it), where elementwise.cc of the mirrored source divides the floats first."""
    x, y = ctx.input(0), ctx.output()
    (si, zi), (so, zo) = _q(x), _q(y)
    lo, hi = LIMITS[y.dtype]
    d, v = ir.Var("d"), ir.Var("v")
    if si != so:
        mult, shift = qp.quantize_multiplier(si / so)
        scaled = ir.call("mf_mbqm", v, mult, shift)
        extra = f"|{_minus(zi)}| * {mult} * 2^({shift} - 31)"
    else:
        scaled, extra = v, f"|{_minus(zi)}| (equal scales: no rescale)"
    out = ir.clamp(ir.call("mf_wrap_add_i32", scaled, zo), lo, hi)
    magnitude = ir.select(d.lt(0), ir.Unary("-", d, "int32"), d)
    return _store_all(ctx, lambda xv, i: [
        ir.Decl("d", "int32", xv - zi), ir.Decl("v", "int32", magnitude),
        ir.Store("y", i, ir.cast(out, y.dtype))], f"{extra}, plus the output zero point {zo}")


def rsqrt_params(input_scale: float, output_scale: float) -> tuple:
    """SetRsqrtOutputMultiplier: QuantizeMultiplier(1 / (sqrt(s_in) * s_out)) in double, as
    the tflite-micro release the conformance suite runs computes it (the mirrored source takes
    the square root and product in float32; int16 outputs tell the two apart)."""
    return qp.quantize_multiplier(1.0 / (float(np.sqrt(qp.f32(input_scale)))
                                         * qp.f32(output_scale)))


def _rsqrt(ctx: OpContext) -> ir.Kernel:
    """RsqrtEvalQuantized per value; int8 tabulated. TFLM fails at run time on a value below
    the input zero point; such values here give what the formula gives."""
    x, y = ctx.input(0), ctx.output()
    (si, zi), (so, zo) = _q(x), _q(y)
    mult, shift = rsqrt_params(si, so)
    lo, hi = LIMITS[y.dtype]
    extra = f"1/sqrt({_minus(zi)}) requantized by multiplier {mult}, shift {shift}"
    if x.dtype == "int8":
        return _table(ctx, [qmath.mf_rsqrt_q(v, zi, zo, mult, shift, lo, hi)
                            for v in range(-128, 128)], extra)
    return _store_all(ctx, lambda xv, i: [ir.Store("y", i, ir.cast(ir.call(
        "mf_rsqrt_q", xv, zi, zo, mult, shift, lo, hi), y.dtype))], extra)


def elu_table(input_scale, input_zero_point, output_scale, output_zero_point) -> list:
    """TFLM ELU's PopulateLookupTable<int8_t>, all in float32: dequantize, x < 0 ? expf(x) - 1
    : x, times 1 / s_out, TfLiteRound, plus the zero point, clamped."""
    s_in, inverse_scale = np.float32(input_scale), np.float32(1.0) / np.float32(output_scale)
    out = []
    for v in range(-128, 128):
        deq = s_in * np.float32(v - input_zero_point)
        t = np.float32(mathmirror.mfm_expf(deq) - np.float32(1.0)) if deq < 0 else deq
        q = qmath.round_half_away(np.float32(t * inverse_scale)) + output_zero_point
        out.append(min(127, max(-128, q)))
    return out


def _elu(ctx: OpContext) -> ir.Kernel:
    x, y = ctx.input(0), ctx.output()
    if x.dtype != "int8":
        raise NotImplementedError(f"ELU on {x.dtype}")
    return _table(ctx, elu_table(*_q(x), *_q(y)), "TFLM's ELU lookup table")


# ---- float unary computed as TFLM: ROUND, ELU ----------------------------------------------

def _tflm_float_unary(ctx: OpContext) -> bool:
    return bool(ctx.attrs.get("tflm")) and ctx.attrs["fn"] in ("round", "elu") \
        and ctx.input(0).dtype == F


@lowers("unary", when=_tflm_float_unary)
def tflm_float_unary(ctx: OpContext) -> ir.Kernel:
    if ctx.attrs["fn"] == "elu":  # reference_ops::Elu
        return _store_all(ctx, lambda v, i: [ir.Store("y", i, ir.select(
            v.lt(_f(0.0)), ir.call("mfm_expm1f", v, dtype=F), v))], "x < 0 ? expm1(x) : x")
    fl, d = ir.Var("f", F), ir.Var("d", F)
    even = ir.call("mfm_fmodf", fl, _f(2.0), dtype=F).eq(_f(0.0))
    down = ir.binop("||", d.lt(_f(0.5)), ir.binop("&&", d.eq(_f(0.5)), even))
    return _store_all(ctx, lambda v, i: [  # RoundToNearest: a tie goes to the even neighbour
        ir.Decl("f", F, ir.call("mfm_floorf", v, dtype=F)), ir.Decl("d", F, v - fl),
        ir.Store("y", i, ir.select(down, fl, fl + _f(1.0)))], "round half to even (TFLM)")


# ---- quantized PRELU -----------------------------------------------------------------------

def prelu_params(input_scale, alpha_scale, output_scale) -> tuple:
    """CalculatePreluParams: QuantizeMultiplier of s_in / s_out and s_in * s_alpha / s_out,
    in double. Returns ((mult1, shift1), (mult2, shift2))."""
    si, sa, so = (qp.f32(s) for s in (input_scale, alpha_scale, output_scale))
    return qp.quantize_multiplier(si / so), qp.quantize_multiplier(si * sa / so)


@lowers("binary", when=lambda ctx: ctx.attrs["fn"] == "prelu"
        and ctx.input(0).quant is not None)
def quantized_prelu(ctx: OpContext) -> ir.Kernel:
    """BroadcastPrelu4DSlow: x - zp >= 0 ? MBQM(x - zp, m1) : MBQM((x - zp) * (a - zp_a), m2),
    plus the output zero point, clamped to the type."""
    x, alpha, y = ctx.input(0), ctx.input(1), ctx.output()
    (si, zi), (sa, za), (so, zo) = _q(x), _q(alpha), _q(y)
    (m1, s1), (m2, s2) = prelu_params(si, sa, so)
    lo, hi = LIMITS[y.dtype]
    names, consts = operand_names(ctx)
    v = ir.Var("v")

    def body(out_index, in_index, alpha_index):
        a = ir.Load(names[1], alpha_index, alpha.dtype) - za
        out = ir.select(v.ge(0), ir.call("mf_mbqm", v, m1, s1),
                        ir.call("mf_mbqm", v * a, m2, s2))
        return [ir.Decl("v", "int32", ir.Load(names[0], in_index, x.dtype) - zi),
                ir.Store("y", out_index, ir.cast(ir.clamp(
                    ir.call("mf_wrap_add_i32", out, zo), lo, hi), y.dtype))]
    shape = tuple(y.shape)
    if x.size == y.size and alpha.size in (1, y.size):  # one flat loop
        loop = ir.loops([("i", y.size)], lambda i: body(
            i, i, i if alpha.size == y.size else ir.Const(0)))
    else:
        loop = ir.loops([(f"i{d}", n) for d, n in enumerate(shape)], lambda *idx: body(
            ir.flat_index(list(idx), shape), broadcast_index(x.shape, shape, list(idx)),
            broadcast_index(alpha.shape, shape, list(idx))))
    extra = (f"v = {_minus(zi)}; v >= 0: v * {m1} * 2^({s1} - 31); v < 0: v * "
             f"({_minus(za, 'alpha')}) * {m2} * 2^({s2} - 31); plus the output zero point {zo}")
    return ir.Kernel(ctx.name, tuple(ctx.io_buffers() + consts), loop, describe(ctx, extra))


# ---- rows: int8 LOG_SOFTMAX, L2_NORMALIZATION ------------------------------------------------

def _rows(ctx: OpContext, fn: str, params: list, extra: str) -> ir.Kernel:
    """One runtime row call per row of the last axis: fn(&x[r*n], &y[r*n], n, *params)."""
    x = ctx.input(0)
    n = x.shape[-1]
    rows = x.size // n
    body = ir.loops([("r", rows)], lambda r: [ir.CallStmt(fn, (
        ir.Ptr("x", r * n), ir.Ptr("y", r * n), _i(n), *[_i(p) for p in params]))])
    return ir.Kernel(ctx.name, tuple(ctx.io_buffers()), body,
                     describe(ctx, f"{extra}, {rows} rows of {n}"))


def log_softmax_params(input_scale: float) -> list:
    """LogSoftmax Prepare: PreprocessLogSoftmaxScalingExp(beta 1, s_in, 5 integer bits) and
    diff_min = -CalculateInputRadius(5, left shift). Returns mf_log_softmax_s8's parameters
    (input_multiplier, input_left_shift, reverse_scaling_divisor, reverse_scaling_shift,
    diff_min)."""
    mult, left_shift, diff_min = qp.softmax_params(input_scale, 1.0)
    divisor, divisor_shift = qp.quantize_multiplier_smaller_than_one_exp(
        float(1 << (31 - left_shift)) / float(mult))
    return [mult, left_shift, divisor, divisor_shift, diff_min]


@lowers("log_softmax", when=lambda ctx: ctx.input(0).quant is not None)
def quantized_log_softmax(ctx: OpContext) -> ir.Kernel:
    x = ctx.input(0)
    if x.dtype != "int8" or ctx.attrs.get("axis", len(x.shape) - 1) != len(x.shape) - 1:
        raise NotImplementedError(f"log_softmax {x.dtype} along axis {ctx.attrs.get('axis')}")
    return _rows(ctx, "mf_log_softmax_s8", log_softmax_params(_q(x)[0]),
                 "output scale 16/256, zero point 127")


@lowers("l2_normalization")
def l2_normalization(ctx: OpContext) -> ir.Kernel:
    x = ctx.input(0)
    if x.dtype == "int8":  # the output is taken as scale 1/128, zero point 0 (TFLM)
        return _rows(ctx, "mf_l2norm_s8", [_q(x)[1]], "output scale 1/128, zero point 0")
    if x.dtype != F:
        raise NotImplementedError(f"l2_normalization on {x.dtype}")
    n = x.shape[-1]
    s, norm = ir.Var("s", F), ir.Var("norm", F)
    eps = _f(ctx.attrs["epsilon"])

    def row(r):  # reference_ops::L2Normalization: float sum, sqrt, max with epsilon, divide
        at = lambda k: r * n + k  # noqa: E731
        v = ir.Var("v", F)
        return [ir.Decl("s", F, _f(0.0)),
                *ir.loops([("k", n)], lambda k: [ir.Decl("v", F, ir.Load("x", at(k), F)),
                                                 ir.Assign("s", s + v * v)]),
                ir.Decl("norm", F, ir.call("mfm_sqrtf", s, dtype=F)),
                ir.Assign("norm", ir.select(norm.lt(eps), eps, norm)),
                *ir.loops([("k", n)], lambda k: [ir.Store("y", at(k), ir.binop(
                    "/", ir.Load("x", at(k), F), norm))])]
    rows = x.size // n
    return ir.Kernel(ctx.name, tuple(ctx.io_buffers()), ir.loops([("r", rows)], row),
                     describe(ctx, f"epsilon {ctx.attrs['epsilon']:g}, {rows} rows of {n}"))
