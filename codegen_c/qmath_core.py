"""Python mirror of runtime_c/mcuforge_rt.h, part one: the plumbing (int ranges, wrap-around,
truncating division) and the intrinsics of the core runtime (gemmlowp fixed point, requantize,
int8 activations and arithmetic, rounding, the int8 softmax row).

Each function takes and returns Python ints (floats as numpy.float32) and returns exactly what the
C function returns, wrap-around included. The C header documents which TFLM / gemmlowp function
each one mirrors; names are the C names. Import them from codegen_c.qmath, which re-exports every
name here and those of codegen_c/qmath_ops.py (the TFLite operator families, built on this
module) and holds `INTRINSICS`, the C name -> function map of the loop-IR evaluator.
"""
from __future__ import annotations

import functools
import math

import numpy as np

INT32_MIN, INT32_MAX = -2**31, 2**31 - 1
INT16_MIN, INT16_MAX = -2**15, 2**15 - 1
INT8_MIN, INT8_MAX = -128, 127


# ---- plumbing ------------------------------------------------------------------------------

def wrap32(x: int) -> int:
    """int -> int32 modulo 2^32."""
    return ((int(x) + 2**31) & 0xFFFFFFFF) - 2**31


def wrap16(x: int) -> int:
    return ((int(x) + 2**15) & 0xFFFF) - 2**15


def _tdiv(a: int, b: int) -> int:
    """C integer division (truncates toward zero)."""
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b >= 0) else -q


def mf_u2s_i32(u):
    return wrap32(u)


def mf_wrap_add_i32(a, b):
    return wrap32(a + b)


def mf_wrap_sub_i32(a, b):
    return wrap32(a - b)


def mf_wrap_mul_i32(a, b):
    return wrap32(a * b)


def mf_wrap_shl_i32(x, s):
    return wrap32(x << s)


def mf_asr_i32(x, s):
    return x >> s  # Python's >> on ints is an arithmetic shift


def mf_wrap_i16(x):
    return wrap16(x)


# ---- min / max / clamp ---------------------------------------------------------------------

def mf_max_i32(a, b):
    return a if a > b else b


def mf_min_i32(a, b):
    return a if a < b else b


mf_max_i64, mf_min_i64 = mf_max_i32, mf_min_i32


def mf_max_f32(a, b):
    a, b = np.float32(a), np.float32(b)
    return b if np.isnan(a) else (b if b > a else a)


def mf_min_f32(a, b):
    a, b = np.float32(a), np.float32(b)
    return b if np.isnan(a) else (b if b < a else a)


def mf_max_nan_f32(a, b):
    a, b = np.float32(a), np.float32(b)
    return a if (a > b or np.isnan(a)) else b


def mf_min_nan_f32(a, b):
    a, b = np.float32(a), np.float32(b)
    return a if (a < b or np.isnan(a)) else b


def mf_clamp(x, lo, hi):
    return mf_min_i32(mf_max_i32(x, lo), hi)


def mf_div_round_i32(total, count):
    return _tdiv(total + count // 2, count) if total > 0 else _tdiv(total - count // 2, count)


# ---- gemmlowp fixed-point primitives -------------------------------------------------------

def mf_srdhm(a, b):
    if a == b == INT32_MIN:
        return INT32_MAX
    ab = a * b
    nudge = (1 << 30) if ab >= 0 else 1 - (1 << 30)
    return _tdiv(ab + nudge, 1 << 31)


def mf_rdbpot(x, exponent):
    mask = (1 << exponent) - 1
    remainder = x & mask
    threshold = (mask >> 1) + (1 if x < 0 else 0)
    return (x >> exponent) + (1 if remainder > threshold else 0)


def mf_srmbpot(x, exponent):
    if exponent == 0:
        return x
    if exponent < 0:
        return mf_rdbpot(x, -exponent)
    threshold = (1 << (31 - exponent)) - 1
    if x > threshold:
        return INT32_MAX
    if x < -threshold:
        return INT32_MIN
    return x << exponent


def mf_rounding_half_sum(a, b):
    s = a + b
    return _tdiv(s + (1 if s >= 0 else -1), 2)


# ---- MultiplyByQuantizedMultiplier family --------------------------------------------------

def mf_mbqm(x, mult, shift):
    left = shift if shift > 0 else 0
    right = 0 if shift > 0 else -shift
    return mf_rdbpot(mf_srdhm(wrap32(x << left), mult), right)


def mf_mbqm_lt1(x, mult, shift):
    return mf_rdbpot(mf_srdhm(x, mult), -shift)


def mf_mbqm_gt1(x, mult, shift):
    return mf_srdhm(wrap32(x << shift), mult)


def mf_mbqm_i64(x, mult, shift):
    reduced = (mult + (1 << 15)) >> 16 if mult < 0x7FFF0000 else 0x7FFF
    total_shift = 15 - shift
    return wrap32((x * reduced + (1 << (total_shift - 1))) >> total_shift)


def mbqm_array(x, mult, shift) -> np.ndarray:
    """Vectorised mf_mbqm over numpy arrays (mult/shift scalars or broadcastable arrays)."""
    x = np.asarray(x, dtype=np.int64)
    mult = np.asarray(mult, dtype=np.int64)
    shift = np.asarray(shift, dtype=np.int64)
    left = np.maximum(shift, 0)
    right = np.maximum(-shift, 0)
    xs = ((x << left) + 2**31) % 2**32 - 2**31  # wrap to int32
    ab = xs * mult  # |ab| <= 2^62: fits int64
    sat = (xs == INT32_MIN) & (mult == INT32_MIN)
    nudge = np.where(ab >= 0, 1 << 30, 1 - (1 << 30))
    num = ab + nudge
    high = np.where(num >= 0, num >> 31, -((-num) >> 31))  # truncating division by 2^31
    high = np.where(sat, INT32_MAX, high)
    mask = (np.int64(1) << right) - 1
    threshold = (mask >> 1) + (high < 0)
    return ((high >> right) + ((high & mask) > threshold)).astype(np.int32)


# ---- gemmlowp fixed-point math -------------------------------------------------------------

def mf_exp_on_interval_between_negative_one_quarter_and_0_excl(a):
    constant_term = 1895147668
    constant_1_over_3 = 715827883
    x = wrap32(a + (1 << 28))
    x2 = mf_srdhm(x, x)
    x3 = mf_srdhm(x2, x)
    x4 = mf_srdhm(x2, x2)
    x4_over_4 = mf_rdbpot(x4, 2)
    poly = mf_rdbpot(wrap32(mf_srdhm(wrap32(x4_over_4 + x3), constant_1_over_3) + x2), 1)
    return wrap32(constant_term + mf_srdhm(constant_term, wrap32(x + poly)))


_BARREL = (1672461947, 1302514674, 790015084, 290630308, 39332535, 720401, 242)


def mf_exp_on_negative_values(a, ib):
    frac_bits = 31 - ib
    one_quarter = 1 << (frac_bits - 2)
    a_mod = (a & (one_quarter - 1)) - one_quarter
    result = mf_exp_on_interval_between_negative_one_quarter_and_0_excl(mf_srmbpot(a_mod, ib))
    remainder = wrap32(a_mod - a)
    for k in range(-2, 5):
        if ib > k and remainder & (1 << (frac_bits + k)):
            result = mf_srdhm(result, _BARREL[k + 2])
    if ib > 5 and a < -(1 << (36 - ib)):
        result = 0
    if a == 0:
        result = INT32_MAX
    return result


def _newton_reciprocal_q2(a):
    """The Newton-Raphson loop shared by the two x_in_0_1 functions: ~1/(1+a)*2 in Q2.29."""
    f2_one = 1 << 29
    half_denominator = mf_rounding_half_sum(a, INT32_MAX)
    x = wrap32(1515870810 + mf_srdhm(half_denominator, -1010580540))
    for _ in range(3):
        one_minus_hdx = wrap32(f2_one - mf_srdhm(half_denominator, x))
        x = wrap32(x + mf_srmbpot(mf_srdhm(x, one_minus_hdx), 2))
    return x


def mf_one_over_one_plus_x_for_x_in_0_1(a):
    return mf_srmbpot(_newton_reciprocal_q2(a), 1)


def mf_one_minus_x_over_one_plus_x_for_x_in_0_1(a):
    return mf_srmbpot(wrap32(_newton_reciprocal_q2(a) - (1 << 29)), 2)


def mf_logistic_q(a, ib):
    if a == 0:
        return 1 << 30
    abs_a = a if a > 0 else wrap32(-a)
    pos = mf_one_over_one_plus_x_for_x_in_0_1(mf_exp_on_negative_values(wrap32(-abs_a), ib))
    return pos if a > 0 else wrap32(INT32_MAX - pos)


def mf_tanh_q(a, ib):
    if a == 0:
        return 0
    n = a if a < 0 else wrap32(-a)
    t = mf_one_minus_x_over_one_plus_x_for_x_in_0_1(mf_exp_on_negative_values(n, ib + 1))
    return wrap32(-t) if a < 0 else t


def mf_clz_u32(x):
    return 32 - (x & 0xFFFFFFFF).bit_length()


def mf_get_reciprocal(x, x_integer_digits):
    """Returns (reciprocal, num_bits_over_unit); C returns the second through a pointer."""
    headroom_plus_one = mf_clz_u32(x)
    shifted = 0 if headroom_plus_one >= 32 else ((x & 0xFFFFFFFF) << headroom_plus_one) & 0xFFFFFFFF
    recip = mf_one_over_one_plus_x_for_x_in_0_1(wrap32(shifted - 0x80000000))
    return recip, x_integer_digits - headroom_plus_one


# ---- int8 element-wise kernels -------------------------------------------------------------

def mf_logistic_s8(x, input_zero_point, input_range_radius, input_multiplier, input_left_shift):
    inp = x - input_zero_point
    if inp <= -input_range_radius:
        return INT8_MIN
    if inp >= input_range_radius:
        return INT8_MAX
    q4 = mf_mbqm(inp, input_multiplier, input_left_shift)
    return mf_clamp(mf_rdbpot(mf_logistic_q(q4, 4), 23) - 128, INT8_MIN, INT8_MAX)


def mf_tanh_s8(x, input_zero_point, input_range_radius, input_multiplier, input_shift):
    inp = x - input_zero_point
    if inp <= -input_range_radius:
        return INT8_MIN
    if inp >= input_range_radius:
        return INT8_MAX
    q4 = mf_mbqm(inp, input_multiplier, input_shift)
    return mf_clamp(mf_rdbpot(mf_tanh_q(q4, 4), 24), INT8_MIN, INT8_MAX)


def mf_srdhm_i16(a, b):
    if a == b == INT16_MIN:
        return INT16_MAX
    ab = a * b
    return _tdiv(ab + ((1 << 14) if ab >= 0 else 1 - (1 << 14)), 1 << 15)


def mf_sdhm_i16(a, b):
    if a == b == INT16_MIN:
        return INT16_MAX
    return _tdiv(a * b, 1 << 15)


def mf_sat_shl_i16(value, amount):
    if value == 0:
        return 0
    if amount > 31:
        return INT16_MAX if value > 0 else INT16_MIN
    return max(INT16_MIN, min(INT16_MAX, value << amount))


def mf_rdbpot_i16(x, exponent):
    mask = wrap16((1 << exponent) - 1)
    remainder = x & mask
    threshold = wrap16((mask >> 1) + (1 if x < 0 else 0))
    return wrap16((x >> exponent) + (1 if remainder > threshold else 0))


def mf_hard_swish_s8(x, input_zero_point, output_zero_point,
                     reluish_multiplier_fixedpoint_int16, reluish_multiplier_exponent,
                     output_multiplier_fixedpoint_int16, output_multiplier_exponent):
    input_value = wrap16(x - input_zero_point)
    hires = wrap16(input_value * 128)
    preshift_output = mf_srdhm_i16(hires, output_multiplier_fixedpoint_int16)
    reluish = hires
    if reluish_multiplier_exponent > 0:
        reluish = mf_sat_shl_i16(reluish, reluish_multiplier_exponent - 1)
    reluish = mf_srdhm_i16(reluish, reluish_multiplier_fixedpoint_int16)
    if reluish_multiplier_exponent > 0:
        reluish = mf_sat_shl_i16(reluish, 1)
    if reluish_multiplier_exponent < 0:
        reluish = mf_rdbpot_i16(reluish, -reluish_multiplier_exponent)
    reluish = (reluish + 32768) >> 1
    out = mf_rdbpot_i16(mf_sdhm_i16(reluish, preshift_output), -output_multiplier_exponent)
    return mf_clamp(wrap16(out + output_zero_point), INT8_MIN, INT8_MAX)


def mf_leaky_relu_s8(x, input_offset, output_offset, output_multiplier_identity,
                     output_shift_identity, output_multiplier_alpha, output_shift_alpha):
    input_value = x - input_offset
    if input_value >= 0:
        out = wrap32(output_offset + mf_mbqm(input_value, output_multiplier_identity,
                                             output_shift_identity))
    else:
        negative = output_multiplier_alpha < 0
        m = wrap32(-output_multiplier_alpha) if negative else output_multiplier_alpha
        scaled = mf_mbqm(input_value, m, output_shift_alpha)
        out = wrap32(output_offset + (wrap32(-scaled) if negative else scaled))
    return mf_clamp(out, INT8_MIN, INT8_MAX)


def mf_relu_s8(x, input_offset, output_offset, output_multiplier, output_shift, act_min, act_max):
    v = wrap32(output_offset + mf_mbqm(x - input_offset, output_multiplier, output_shift))
    return mf_clamp(v, act_min, act_max)


def mf_relu6_s8(x, lower, upper):
    return upper if x > upper else (lower if x < lower else x)


def mf_requantize_s8(x, input_zero_point, output_zero_point, mult, shift):
    v = wrap32(mf_mbqm(x - input_zero_point, mult, shift) + output_zero_point)
    return mf_clamp(v, INT8_MIN, INT8_MAX)


def mf_add_s8(x, y, input1_offset, input2_offset, left_shift, input1_multiplier, input1_shift,
              input2_multiplier, input2_shift, output_multiplier, output_shift, output_offset,
              act_min, act_max):
    a = wrap32(wrap32(input1_offset + x) << left_shift)
    b = wrap32(wrap32(input2_offset + y) << left_shift)
    total = wrap32(mf_mbqm_lt1(a, input1_multiplier, input1_shift)
                   + mf_mbqm_lt1(b, input2_multiplier, input2_shift))
    out = wrap32(mf_mbqm_lt1(total, output_multiplier, output_shift) + output_offset)
    return mf_clamp(out, act_min, act_max)


def mf_mul_s8(x, y, input1_offset, input2_offset, output_multiplier, output_shift,
              output_offset, act_min, act_max):
    prod = wrap32(wrap32(input1_offset + x) * wrap32(input2_offset + y))
    out = wrap32(output_offset + mf_mbqm(prod, output_multiplier, output_shift))
    return mf_clamp(out, act_min, act_max)


def mf_mean_s8(total, input_zero_point, count, mult, shift, output_zero_point):
    shifted = wrap32(total - input_zero_point * count)
    return mf_clamp(wrap32(mf_mbqm(shifted, mult, shift) + output_zero_point), INT8_MIN, INT8_MAX)


# ---- float <-> int8 ------------------------------------------------------------------------

def round_half_away(x: float) -> int:
    """TfLiteRound / std::round / roundf of a finite value, as an exact int."""
    a = abs(float(x))
    f = math.floor(a)
    r = f + 1 if a - f >= 0.5 else f  # a - f is exact in binary floating point
    return -r if x < 0 else r


def mf_roundf(x):
    x = np.float32(x)
    a = -x if x < 0 else x
    if not a < np.float32(8388608.0):
        return x
    r = np.float32(int(float(a) + 0.5))  # same steps as the C, so -0.3 gives -0.0 there too
    return -r if x < 0 else r


def mf_round_even_f32_to_i32(x):
    """nearbyintf (round half to even) of a float32 as an int32; saturates, NaN -> 0."""
    x = np.float32(x)
    if np.isnan(x):
        return 0
    if x >= np.float32(2.0**31):
        return INT32_MAX
    if x <= np.float32(-2.0**31):
        return INT32_MIN
    return int(round(float(x)))  # Python's round() is half to even, exact on floats


def mf_quantize_f32_s8(x, scale, zero_point):
    with np.errstate(all="ignore"):  # x / 0 is inf or nan, as in C
        r = mf_roundf(np.float32(x) / np.float32(scale))
    q = 0 if np.isnan(r) else (-1000000 if r < -1e6 else (1000000 if r > 1e6 else int(r)))
    return mf_clamp(wrap32(q + zero_point), INT8_MIN, INT8_MAX)


def mf_dequantize_s8_f32(q, scale, zero_point):
    with np.errstate(all="ignore"):
        return np.float32(scale) * np.float32(q - zero_point)


# ---- rows ----------------------------------------------------------------------------------

def softmax_s8_row(row, input_beta_multiplier: int, input_beta_left_shift: int, diff_min: int,
                   bits: int) -> list:
    """mfi_softmax_s8_row: one softmax row, int8 in, `bits` (8 or 16) wide out, as ints."""
    vals = [int(v) for v in np.asarray(row).reshape(-1)]
    max_in_row = max([INT8_MIN] + vals)
    exps = [mf_exp_on_negative_values(mf_mbqm_gt1(v - max_in_row, input_beta_multiplier,
                                                  input_beta_left_shift), 5)
            if v - max_in_row >= diff_min else None for v in vals]
    sum_of_exps = 0
    for e in exps:
        if e is not None:
            sum_of_exps = wrap32(sum_of_exps + mf_rdbpot(e, 12))
    shifted_scale, num_bits_over_unit = mf_get_reciprocal(sum_of_exps, 12)
    exponent = mf_clamp(num_bits_over_unit + 31 - bits, 0, 31)
    lo, hi = -(1 << (bits - 1)), (1 << (bits - 1)) - 1
    return [lo if e is None else
            mf_clamp(mf_rdbpot(mf_srdhm(shifted_scale, e), exponent) + lo, lo, hi)
            for e in exps]


def mf_softmax_s8(row: np.ndarray, input_beta_multiplier: int, input_beta_left_shift: int,
                  diff_min: int) -> np.ndarray:
    """One softmax row, int8 in -> int8 out (the C version writes into `out` instead)."""
    return np.array(softmax_s8_row(row, input_beta_multiplier, input_beta_left_shift,
                                   diff_min, 8), dtype=np.int8)


def _softmax_s8_call(inp, out, n, input_beta_multiplier, input_beta_left_shift, diff_min):
    """mf_softmax_s8 with the C signature: inp/out are buffer views, `out` written in place."""
    out[:n] = mf_softmax_s8(inp[:n], input_beta_multiplier, input_beta_left_shift, diff_min)


def _int_args(fn):
    """numpy integers -> Python ints: under NumPy 2 promotion `int * np.int32` stays int32 and
    would overflow inside these exact-arithmetic functions."""
    @functools.wraps(fn)
    def call(*args):
        return fn(*[int(a) if isinstance(a, np.integer) else a for a in args])
    return call


for _name, _fn in list(globals().items()):
    if _name.startswith("mf_") and callable(_fn) and _name != "mf_softmax_s8":
        globals()[_name] = _int_args(_fn)
