"""Python mirror of runtime_c/mcuforge_rt.h: the executable definition of every runtime intrinsic.

Each function takes and returns Python ints (floats as numpy.float32) and returns exactly what the
C function returns, wrap-around included. The C header documents which TFLM / gemmlowp function
each one mirrors; names are the C names. `INTRINSICS` maps C name -> function for the loop-IR
evaluator (codegen_c/evaluate.py).
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

def mf_softmax_s8(row: np.ndarray, input_beta_multiplier: int, input_beta_left_shift: int,
                  diff_min: int) -> np.ndarray:
    """One softmax row, int8 in -> int8 out (the C version writes into `out` instead)."""
    vals = [int(v) for v in np.asarray(row).reshape(-1)]
    max_in_row = max([INT8_MIN] + vals)
    exps = []
    for v in vals:
        diff = v - max_in_row
        if diff >= diff_min:
            scaled = mf_mbqm_gt1(diff, input_beta_multiplier, input_beta_left_shift)
            exps.append(mf_exp_on_negative_values(scaled, 5))
        else:
            exps.append(None)
    sum_of_exps = 0
    for e in exps:
        if e is not None:
            sum_of_exps = wrap32(sum_of_exps + mf_rdbpot(e, 12))
    shifted_scale, num_bits_over_unit = mf_get_reciprocal(sum_of_exps, 12)
    exponent = mf_clamp(num_bits_over_unit + 31 - 8, 0, 31)
    out = [INT8_MIN if e is None else
           mf_clamp(mf_rdbpot(mf_srdhm(shifted_scale, e), exponent) - 128, INT8_MIN, INT8_MAX)
           for e in exps]
    return np.array(out, dtype=np.int8)


def _softmax_s8_call(inp, out, n, input_beta_multiplier, input_beta_left_shift, diff_min):
    """mf_softmax_s8 with the C signature: inp/out are buffer views, `out` written in place."""
    out[:n] = mf_softmax_s8(inp[:n], input_beta_multiplier, input_beta_left_shift, diff_min)


# ---- inverse square root and log (RSQRT, L2_NORMALIZATION, LOG_SOFTMAX) ----------------------

def mf_sat_add_i32(a, b):
    return max(INT32_MIN, min(INT32_MAX, a + b))


def mf_sat_sub_i32(a, b):
    return max(INT32_MIN, min(INT32_MAX, a - b))


def mf_inv_sqrt_multiplier_exp(x):
    """Returns (multiplier, shift); C returns the shift through a pointer."""
    if x <= 1:
        return INT32_MAX, 0
    right = 11
    while x >= 1 << 29:
        x = _tdiv(x, 4)
        right += 1
    pairs = (mf_clz_u32(x) - 1) // 2 - 1
    right -= pairs
    x <<= 2 * pairs
    half_input = mf_rdbpot(x >> 1, 1)
    half_three = (1 << 28) + (1 << 27)
    r = 1 << 28
    for _ in range(5):
        x3 = mf_srmbpot(mf_srdhm(mf_srdhm(r, r), r), 6)
        r = mf_srmbpot(wrap32(mf_srdhm(half_three, r) - mf_srdhm(half_input, x3)), 3)
    mult = mf_srdhm(r, 1518500250)
    if right < 0:
        mult, right = wrap32(mult << -right), 0
    return mult, -right


def mf_rsqrt_q(x, input_offset, output_offset, mult, shift, qmin, qmax):
    value = x - input_offset
    if value == 0:
        return qmax
    inv, inv_shift = mf_inv_sqrt_multiplier_exp(value)
    data = mf_mbqm(1, inv, inv_shift + 20)
    return mf_clamp(wrap32(mf_mbqm(data, mult, shift - 20) + output_offset), qmin, qmax)


def mf_log_x_for_x_greater_than_or_equal_to_1(a, input_ib, output_ib):
    log_2, sqrt_sqrt_half, sqrt_half = 1488522236, 1805811301, 1518500250
    alpha_n, alpha_d, alpha_i, alpha_f = 117049297, 127690142, 1057819769, 638450708
    accum_ib = output_ib + 1
    shifted_quarter = mf_srmbpot(536870912, -accum_ib)
    za_hp1 = mf_clz_u32(a)
    r_a = mf_srmbpot(mf_srdhm(mf_srmbpot(a, za_hp1 - 1), sqrt_half), 1)
    za_adj = mf_sat_add_i32(mf_srmbpot(input_ib - za_hp1, 31 - accum_ib), shifted_quarter)
    zb_headroom = mf_clz_u32(mf_srdhm(a, sqrt_half)) - 1
    r_b = mf_srmbpot(a, zb_headroom)
    zb_adj = mf_sat_sub_i32(mf_srmbpot(input_ib - zb_headroom, 31 - accum_ib), shifted_quarter)
    r = min(r_a, r_b)
    z_pow_2_adj = max(za_adj, zb_adj)
    p = mf_rounding_half_sum(r, sqrt_sqrt_half)
    q = wrap32(r - sqrt_sqrt_half)
    q = wrap32(q + q)
    common_sq = mf_srdhm(q, q)
    num = wrap32(mf_srdhm(q, r) + mf_srdhm(mf_srdhm(q, common_sq), alpha_n))
    denom_minus_one = wrap32(
        mf_srdhm(p, wrap32(wrap32(alpha_i + q) + mf_srdhm(alpha_d, common_sq)))
        + mf_srdhm(alpha_f, q))
    recip_denom = mf_one_over_one_plus_x_for_x_in_0_1(denom_minus_one)
    total = wrap32(mf_srdhm(z_pow_2_adj, log_2)
                   + mf_srdhm(mf_srmbpot(num, -accum_ib), recip_denom))
    return mf_srmbpot(total, accum_ib - output_ib)


def mf_l2norm_s8(row: np.ndarray, input_zero_point: int) -> np.ndarray:
    """One L2-normalised int8 row (the C version writes into `out` instead)."""
    diffs = [int(v) - int(input_zero_point) for v in np.asarray(row).reshape(-1)]
    acc = 0
    for d in diffs:
        acc = wrap32(acc + d * d)
    mult, shift = mf_inv_sqrt_multiplier_exp(acc)
    return np.array([mf_clamp(mf_mbqm(d, mult, shift + 7), INT8_MIN, INT8_MAX) for d in diffs],
                    dtype=np.int8)


def mf_log_softmax_s8(row: np.ndarray, input_multiplier: int, input_left_shift: int,
                      reverse_scaling_divisor: int, reverse_scaling_shift: int,
                      diff_min: int) -> np.ndarray:
    """One int8 log-softmax row (the C version writes into `out` instead)."""
    vals = [int(v) for v in np.asarray(row).reshape(-1)]
    max_in_row = max([INT8_MIN] + vals)
    sum_of_exps = 0
    for v in vals:
        if v - max_in_row >= diff_min:
            q5 = mf_mbqm(v - max_in_row, input_multiplier, input_left_shift)
            sum_of_exps = wrap32(sum_of_exps + mf_rdbpot(mf_exp_on_negative_values(q5, 5), 12))
    log_sum = mf_log_x_for_x_greater_than_or_equal_to_1(sum_of_exps, 12, 5)
    adjusted = max(diff_min - 1, mf_mbqm(wrap32(log_sum + INT32_MIN), reverse_scaling_divisor,
                                         reverse_scaling_shift))
    out = []
    for v in vals:
        if v - max_in_row > adjusted:
            q5 = mf_mbqm(v - max_in_row, input_multiplier, input_left_shift)
            out.append(mf_clamp(mf_rdbpot(wrap32(q5 - log_sum), 22) + 127, INT8_MIN, INT8_MAX))
        else:
            out.append(INT8_MIN)
    return np.array(out, dtype=np.int8)


def _l2norm_s8_call(inp, out, n, input_zero_point):
    out[:n] = mf_l2norm_s8(inp[:n], input_zero_point)


def _log_softmax_s8_call(inp, out, n, *params):
    out[:n] = mf_log_softmax_s8(inp[:n], *params)


# ---- binary ops (SUB, DIV, comparisons, SQUARED_DIFFERENCE, ADD_N, FLOOR_DIV) ----------------

def mf_rescale_q(x, offset, left_shift, mult, shift):
    return mf_mbqm_lt1(wrap32(wrap32(offset + x) << left_shift), mult, shift)


def mf_clsb_i32(x):
    return mf_clz_u32(~x if x < 0 else x) - 1


def mf_div_q(x, y, input1_offset, input2_offset, output_multiplier, output_shift,
             output_offset, act_min, act_max):
    num, den = wrap32(input1_offset + x), wrap32(input2_offset + y)
    if den < 0:
        num, den = wrap32(-num), wrap32(-den)
    recip, recip_shift = mf_get_reciprocal(den, 31)
    headroom = mf_clsb_i32(num)
    scaled = mf_srdhm(mf_mbqm_gt1(num, recip, headroom), output_multiplier)
    exponent = recip_shift + headroom - output_shift
    if exponent > 31:  # TFLM's undefined shift as x86 executes it (see the C)
        out = wrap32((scaled >> (exponent & 31)) + (1 if scaled >= 0 else 0))
    else:
        out = mf_rdbpot(scaled, exponent)
    return mf_clamp(wrap32(out + output_offset), act_min, act_max)


def mf_floor_div_f32(a, b):
    with np.errstate(all="ignore"):  # b = 0: an infinity or NaN, as in C
        return np.float32(np.floor(np.float64(np.float32(a)) / np.float64(np.float32(b))))


# ---- int16 sigmoid and tanh (the integer LSTM's gates) ----------------------------------------

SIGMOID_TABLE_U16 = (  # TFLM's sigmoid_table_uint16: sigmoid(i / 24) in Q0.16 (its data)
    32768, 33451, 34133, 34813, 35493, 36169, 36843, 37513, 38180, 38841, 39498, 40149,
    40794, 41432, 42064, 42688, 43304, 43912, 44511, 45102, 45683, 46255, 46817, 47369,
    47911, 48443, 48964, 49475, 49975, 50464, 50942, 51409, 51865, 52311, 52745, 53169,
    53581, 53983, 54374, 54755, 55125, 55485, 55834, 56174, 56503, 56823, 57133, 57433,
    57724, 58007, 58280, 58544, 58800, 59048, 59288, 59519, 59743, 59959, 60168, 60370,
    60565, 60753, 60935, 61110, 61279, 61441, 61599, 61750, 61896, 62036, 62172, 62302,
    62428, 62549, 62666, 62778, 62886, 62990, 63090, 63186, 63279, 63368, 63454, 63536,
    63615, 63691, 63765, 63835, 63903, 63968, 64030, 64090, 64148, 64204, 64257, 64308,
    64357, 64405, 64450, 64494, 64536, 64576, 64614, 64652, 64687, 64721, 64754, 64786,
    64816, 64845, 64873, 64900, 64926, 64950, 64974, 64997, 65019, 65039, 65060, 65079,
    65097, 65115, 65132, 65149, 65164, 65179, 65194, 65208, 65221, 65234, 65246, 65258,
    65269, 65280, 65291, 65301, 65310, 65319, 65328, 65337, 65345, 65352, 65360, 65367,
    65374, 65381, 65387, 65393, 65399, 65404, 65410, 65415, 65420, 65425, 65429, 65433,
    65438, 65442, 65445, 65449, 65453, 65456, 65459, 65462, 65465, 65468, 65471, 65474,
    65476, 65479, 65481, 65483, 65485, 65488, 65489, 65491, 65493, 65495, 65497, 65498,
    65500, 65501, 65503, 65504, 65505, 65507, 65508, 65509, 65510, 65511, 65512, 65513,
    65514, 65515, 65516, 65517, 65517, 65518, 65519, 65520, 65520, 65521, 65522, 65522,
    65523, 65523, 65524, 65524, 65525, 65525, 65526, 65526, 65526, 65527, 65527, 65528,
    65528, 65528, 65529, 65529, 65529, 65529, 65530, 65530, 65530, 65530, 65531, 65531,
    65531, 65531, 65531, 65532, 65532, 65532, 65532, 65532, 65532, 65533, 65533, 65533,
    65533, 65533, 65533, 65533, 65533, 65534, 65534, 65534, 65534, 65534, 65534, 65534,
    65534, 65534, 65534, 65535)


def mf_sigmoid_table_u16(i):
    return SIGMOID_TABLE_U16[i]


def mf_lut_input_s16(x, input_multiplier, input_left_shift):
    if input_multiplier == 0:  # TFLM's power-of-two case
        input_multiplier, input_left_shift = 3 << input_left_shift, 0
    round_ = 1 << (input_left_shift - 1) if input_left_shift > 0 else 0
    return (x * input_multiplier + round_) >> input_left_shift


def mf_logistic_s16(x, input_multiplier, input_left_shift):
    v = mf_lut_input_s16(x, input_multiplier, input_left_shift)
    a = abs(v)
    index = a >> 9
    if index >= 255:
        result = 0x7FFF << 10
    else:
        lo, hi = SIGMOID_TABLE_U16[index], SIGMOID_TABLE_U16[index + 1]
        result = (lo << 9) + (a & 0x1FF) * (hi - lo)
    result = result + (1 << 9) if v >= 0 else (1 << 25) - result + (1 << 9) - 1
    return wrap16(result >> 10)


def mf_tanh_s16(x, input_multiplier, input_left_shift):
    v = mf_lut_input_s16(x, input_multiplier, input_left_shift)
    a = abs(v)
    index = a >> 8
    if index >= 255:
        result = 0xFFFF << 8
    else:
        lo, hi = SIGMOID_TABLE_U16[index], SIGMOID_TABLE_U16[index + 1]
        result = (lo << 8) + (a & 0xFF) * (hi - lo)
    result = result - (1 << 23) + (1 << 7) if v >= 0 else -result + (1 << 23) + (1 << 7) - 1
    return wrap16(result >> 8)


# ---- int16 softmax (TFLite's 16x8 quantization) -----------------------------------------------

def mf_lut_s16(lut, value):
    index = 256 + (value >> 7)
    slope = wrap16(int(lut[index + 1]) - int(lut[index]))
    return wrap16(int(lut[index]) + ((slope * (value & 0x7F) + 64) >> 7))


def mf_softmax_s16(row: np.ndarray, input_multiplier: int, input_left_shift: int,
                   exp_lut, recip_lut) -> np.ndarray:
    """One int16 softmax row (the C version writes into `out` instead)."""
    vals = [int(v) for v in np.asarray(row).reshape(-1)]
    max_in_row = max([INT16_MIN] + vals)
    exps = []
    for v in vals:
        scaled = mf_mbqm(v - max_in_row, input_multiplier, input_left_shift)
        sym = mf_clamp(wrap32(scaled + 32767), INT16_MIN, INT16_MAX)
        exps.append(mf_lut_s16(exp_lut, sym))
    total = sum(exps)
    headroom_plus_one = mf_clz_u32(total)
    shifted_sum = ((total << (headroom_plus_one - 1)) + (1 << 13)) >> 14
    reciprocal = mf_lut_s16(recip_lut, mf_clamp(shifted_sum - ((1 << 15) + (1 << 16)),
                                                 INT16_MIN, INT16_MAX))
    right_shift = 31 - headroom_plus_one
    out = [mf_clamp((e * reciprocal + (1 << (right_shift - 1))) >> right_shift, 0, INT16_MAX)
           for e in exps]
    return np.array(out, dtype=np.int16)


def mf_softmax_s8_s16(row: np.ndarray, input_beta_multiplier: int, input_beta_left_shift: int,
                      diff_min: int) -> np.ndarray:
    """One softmax row, int8 in -> int16 out (the C version writes into `out` instead)."""
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
    exponent = mf_clamp(num_bits_over_unit + 31 - 16, 0, 31)
    out = [INT16_MIN if e is None else
           mf_clamp(mf_rdbpot(mf_srdhm(shifted_scale, e), exponent) - 32768, INT16_MIN, INT16_MAX)
           for e in exps]
    return np.array(out, dtype=np.int16)


def _softmax_s16_call(inp, out, n, *params):
    out[:n] = mf_softmax_s16(inp[:n], *params)


def _softmax_s8_s16_call(inp, out, n, *params):
    out[:n] = mf_softmax_s8_s16(inp[:n], *params)


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

# C name -> Python function, for the loop-IR evaluator. Scalar intrinsics return their value.
# Row intrinsics (mf_softmax_s8) are called for effect with the C argument list
# (in_ptr, out_ptr, n, ...) and write into the out view. mf_get_reciprocal is left out: its C
# form returns a second value through a pointer.
INTRINSICS = {
    name: fn for name, fn in list(globals().items())
    if name.startswith("mf_") and callable(fn)
    and name not in ("mf_softmax_s8", "mf_get_reciprocal")
}
INTRINSICS["mf_softmax_s8"] = _softmax_s8_call
# the same for the rows and the pointer-returning helper of the RSQRT/L2/LOG_SOFTMAX section
del INTRINSICS["mf_inv_sqrt_multiplier_exp"]
INTRINSICS["mf_l2norm_s8"] = _l2norm_s8_call
INTRINSICS["mf_log_softmax_s8"] = _log_softmax_s8_call
# the int16 softmax rows (TFLite's 16x8 quantization)
INTRINSICS["mf_softmax_s16"] = _softmax_s16_call
INTRINSICS["mf_softmax_s8_s16"] = _softmax_s8_s16_call
