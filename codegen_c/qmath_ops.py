"""Python mirrors of the runtime intrinsics added for TFLite operator families, built on the
primitives of codegen_c/qmath_core.py. codegen_c/qmath.py re-exports every name here and
registers the mirrors (and the `_*_call` row helpers) in its INTRINSICS; import them from there.

RSQRT / L2_NORMALIZATION / LOG_SOFTMAX (inverse square root, log), the binary ops' helpers
(rescale, DIV, FLOOR_DIV), int16 sigmoid/tanh (the integer LSTM's gates) and the int16 softmax
rows of TFLite's 16x8 quantization. Same conventions as qmath_core: names are the C names of
runtime_c/mcuforge_rt.h, Python ints in and out, wrap-around included; the `_*_call` helpers are
the row intrinsics with the C argument list.
"""
from __future__ import annotations

import numpy as np

from .qmath_core import (INT8_MAX, INT8_MIN, INT16_MAX, INT16_MIN, INT32_MAX, INT32_MIN,
                         _int_args, _tdiv, mf_clamp, mf_clz_u32, mf_exp_on_negative_values,
                         mf_get_reciprocal, mf_mbqm, mf_mbqm_gt1, mf_mbqm_lt1,
                         mf_one_over_one_plus_x_for_x_in_0_1, mf_rdbpot, mf_rounding_half_sum,
                         mf_srdhm, mf_srmbpot, softmax_s8_row, wrap16, wrap32)


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
    return np.array(softmax_s8_row(row, input_beta_multiplier, input_beta_left_shift,
                                   diff_min, 16), dtype=np.int16)


def _softmax_s16_call(inp, out, n, *params):
    out[:n] = mf_softmax_s16(inp[:n], *params)


def _softmax_s8_s16_call(inp, out, n, *params):
    out[:n] = mf_softmax_s8_s16(inp[:n], *params)


for _name, _fn in list(globals().items()):  # the mirrors defined here, as qmath_core does its own
    if _name.startswith("mf_") and callable(_fn) and _fn.__module__ == __name__:
        globals()[_name] = _int_args(_fn)
