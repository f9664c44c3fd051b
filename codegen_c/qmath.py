"""Python mirror of runtime_c/mcuforge_rt.h: the executable definition of every runtime intrinsic.

Each function takes and returns Python ints (floats as numpy.float32) and returns exactly what the
C function returns, wrap-around included. The C header documents which TFLM / gemmlowp function
each one mirrors; names are the C names. The mirrors live in two modules below this one:
codegen_c/qmath_core.py (plumbing, gemmlowp fixed point, requantize, int8 activations and
arithmetic, the int8 softmax row) and codegen_c/qmath_ops.py (the TFLite operator families:
RSQRT, L2 / log-softmax, DIV and friends, int16 sigmoid/tanh/softmax), which builds on
qmath_core. This module re-exports every name of both, so callers import them from here, and
holds `INTRINSICS`, which maps C name -> function for the loop-IR evaluator
(codegen_c/evaluate.py); the micro-kernel mirrors (codegen_c/micro*.py, mathmirror.py) add theirs.
"""
from __future__ import annotations

from .qmath_core import (
    INT32_MIN, INT32_MAX, INT16_MIN, INT16_MAX, INT8_MIN, INT8_MAX, wrap32, wrap16, mf_u2s_i32,
    mf_wrap_add_i32, mf_wrap_sub_i32, mf_wrap_mul_i32, mf_wrap_shl_i32, mf_asr_i32, mf_wrap_i16,
    mf_max_i32, mf_min_i32, mf_max_i64, mf_min_i64, mf_max_f32, mf_min_f32, mf_max_nan_f32,
    mf_min_nan_f32, mf_clamp, mf_div_round_i32, mf_srdhm, mf_rdbpot, mf_srmbpot,
    mf_rounding_half_sum, mf_mbqm, mf_mbqm_lt1, mf_mbqm_gt1, mf_mbqm_i64, mbqm_array,
    mf_exp_on_interval_between_negative_one_quarter_and_0_excl, mf_exp_on_negative_values,
    mf_one_over_one_plus_x_for_x_in_0_1, mf_one_minus_x_over_one_plus_x_for_x_in_0_1,
    mf_logistic_q, mf_tanh_q, mf_clz_u32, mf_get_reciprocal, mf_logistic_s8, mf_tanh_s8,
    mf_srdhm_i16, mf_sdhm_i16, mf_sat_shl_i16, mf_rdbpot_i16, mf_hard_swish_s8, mf_leaky_relu_s8,
    mf_relu_s8, mf_relu6_s8, mf_requantize_s8, mf_add_s8, mf_mul_s8, mf_mean_s8, round_half_away,
    mf_roundf, mf_round_even_f32_to_i32, mf_quantize_f32_s8, mf_dequantize_s8_f32, softmax_s8_row,
    mf_softmax_s8, _softmax_s8_call)
from .qmath_ops import (
    SIGMOID_TABLE_U16, _l2norm_s8_call, _log_softmax_s8_call, _softmax_s8_s16_call,
    _softmax_s16_call, mf_clsb_i32, mf_div_q, mf_floor_div_f32, mf_inv_sqrt_multiplier_exp,
    mf_l2norm_s8, mf_log_softmax_s8, mf_log_x_for_x_greater_than_or_equal_to_1, mf_logistic_s16,
    mf_lut_input_s16, mf_lut_s16, mf_rescale_q, mf_rsqrt_q, mf_sat_add_i32, mf_sat_sub_i32,
    mf_sigmoid_table_u16, mf_softmax_s8_s16, mf_softmax_s16, mf_tanh_s16)

# the names callers import from here (the mirrors of both modules and INTRINSICS)
__all__ = [
    "INT32_MIN", "INT32_MAX", "INT16_MIN", "INT16_MAX", "INT8_MIN", "INT8_MAX", "wrap32", "wrap16",
    "mf_u2s_i32", "mf_wrap_add_i32", "mf_wrap_sub_i32", "mf_wrap_mul_i32", "mf_wrap_shl_i32",
    "mf_asr_i32", "mf_wrap_i16", "mf_max_i32", "mf_min_i32", "mf_max_i64", "mf_min_i64",
    "mf_max_f32", "mf_min_f32", "mf_max_nan_f32", "mf_min_nan_f32", "mf_clamp", "mf_div_round_i32",
    "mf_srdhm", "mf_rdbpot", "mf_srmbpot", "mf_rounding_half_sum", "mf_mbqm", "mf_mbqm_lt1",
    "mf_mbqm_gt1", "mf_mbqm_i64", "mbqm_array",
    "mf_exp_on_interval_between_negative_one_quarter_and_0_excl", "mf_exp_on_negative_values",
    "mf_one_over_one_plus_x_for_x_in_0_1", "mf_one_minus_x_over_one_plus_x_for_x_in_0_1",
    "mf_logistic_q", "mf_tanh_q", "mf_clz_u32", "mf_get_reciprocal", "mf_logistic_s8",
    "mf_tanh_s8", "mf_srdhm_i16", "mf_sdhm_i16", "mf_sat_shl_i16", "mf_rdbpot_i16",
    "mf_hard_swish_s8", "mf_leaky_relu_s8", "mf_relu_s8", "mf_relu6_s8", "mf_requantize_s8",
    "mf_add_s8", "mf_mul_s8", "mf_mean_s8", "round_half_away", "mf_roundf",
    "mf_round_even_f32_to_i32", "mf_quantize_f32_s8", "mf_dequantize_s8_f32", "softmax_s8_row",
    "mf_softmax_s8", "_softmax_s8_call", "SIGMOID_TABLE_U16", "_l2norm_s8_call",
    "_log_softmax_s8_call", "_softmax_s8_s16_call", "_softmax_s16_call", "mf_clsb_i32", "mf_div_q",
    "mf_floor_div_f32", "mf_inv_sqrt_multiplier_exp", "mf_l2norm_s8", "mf_log_softmax_s8",
    "mf_log_x_for_x_greater_than_or_equal_to_1", "mf_logistic_s16", "mf_lut_input_s16",
    "mf_lut_s16", "mf_rescale_q", "mf_rsqrt_q", "mf_sat_add_i32", "mf_sat_sub_i32",
    "mf_sigmoid_table_u16", "mf_softmax_s8_s16", "mf_softmax_s16", "mf_tanh_s16", "INTRINSICS"]

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
