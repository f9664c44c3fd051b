"""Compile-time quantization parameters, computed exactly as TFLite Micro's Prepare functions do.

Bit-exactness depends on doing each step in the precision TFLM uses: tensor scales are float32
(so every scale is first rounded to float32 here), some products and quotients are formed in
float32 and only then widened, others are formed in double. Each docstring names the TFLM
function mirrored and says which. Results feed the runtime_c/mcuforge_rt.h intrinsics (see
codegen_c/qmath.py for their Python mirrors).

TFLM's default build leaves TFLITE_SINGLE_ROUNDING undefined, so QuantizeMultiplier neither
caps the shift at 30 nor limits PreprocessSoftmaxScaling to 2^30 - 1; both follow that build.
"""
from __future__ import annotations

import math

import numpy as np

from .qmath import round_half_away

INT8_MIN, INT8_MAX = -128, 127


def f32(x) -> float:
    """A value as TFLM holds a tensor scale or builtin float option: float32, widened to double."""
    return float(np.float32(x))


def quantize_multiplier(real: float) -> tuple:
    """tflite::QuantizeMultiplier (quantization_util.cc): real ~= mult * 2^(shift - 31) with mult
    in [2^30, 2^31) (negative for negative real), or (0, 0) for 0 and for |real| < ~2^-32."""
    real = float(real)
    if real == 0.0:
        return 0, 0
    q, shift = math.frexp(real)
    q_fixed = round_half_away(q * (1 << 31))
    if q_fixed > (1 << 31):
        raise ValueError(f"QuantizeMultiplier({real}): q_fixed overflow")
    if q_fixed == (1 << 31):
        q_fixed //= 2
        shift += 1
    if shift < -31:  # every bit would be shifted out: flush to zero
        return 0, 0
    return int(q_fixed), int(shift)


def quantize_multiplier_smaller_than_one_exp(real: float) -> tuple:
    """tflite::QuantizeMultiplierSmallerThanOneExp: requires 0 < real < 1, shift <= 0."""
    if not 0.0 < real < 1.0:
        raise ValueError(f"QuantizeMultiplierSmallerThanOneExp needs 0 < {real} < 1")
    mult, shift = quantize_multiplier(real)
    if shift > 0:
        raise ValueError(f"QuantizeMultiplierSmallerThanOneExp({real}): shift {shift} > 0")
    return mult, shift


def quantize_multiplier_greater_than_one(real: float) -> tuple:
    """tflite::QuantizeMultiplierGreaterThanOne: requires real > 1, shift >= 0."""
    if not real > 1.0:
        raise ValueError(f"QuantizeMultiplierGreaterThanOne needs {real} > 1")
    mult, shift = quantize_multiplier(real)
    if shift < 0:
        raise ValueError(f"QuantizeMultiplierGreaterThanOne({real}): shift {shift} < 0")
    return mult, shift


def calculate_input_radius(input_integer_bits: int, input_left_shift: int,
                           total_signed_bits: int = 31) -> int:
    """tflite::CalculateInputRadius (double arithmetic, floored)."""
    max_input_rescaled = (1.0 * ((1 << input_integer_bits) - 1)
                          * float(1 << (total_signed_bits - input_integer_bits))
                          / float(1 << input_left_shift))
    return int(math.floor(max_input_rescaled))


def downscale_int32_to_int16_multiplier(mult: int) -> int:
    """tflite::DownScaleInt32ToInt16Multiplier (common.h): round a Q31 multiplier to Q15."""
    if mult < 0:
        raise ValueError("DownScaleInt32ToInt16Multiplier needs mult >= 0")
    if mult >= 2**31 - 1 - (1 << 15):
        return 2**15 - 1
    return (mult + (1 << 15)) >> 16


def _tflite_quantize(scale: float, zero_point: int, f: float) -> int:
    """kernel_util.cc's anonymous Quantize(): zero_point + TfLiteRound(f / scale), in float32."""
    tmp = np.float32(f) / np.float32(scale)
    if not (np.float32(-2**31) <= tmp <= np.float32(2**31 - 1)):  # also rejects nan
        raise ValueError(f"activation bound {f} / scale {scale} overflows int32")
    return int(zero_point) + round_half_away(tmp)


def activation_range_int8(activation: str, scale: float, zero_point: int) -> tuple:
    """tflite::CalculateActivationRangeQuantized (kernel_util.cc) for an int8 output:
    (qmin, qmax) of the fused activation ('none', 'relu', 'relu6', 'relu_n1_to_1')."""
    qmin, qmax = INT8_MIN, INT8_MAX
    if activation == "none":
        return qmin, qmax
    if activation == "relu":
        return max(qmin, _tflite_quantize(scale, zero_point, 0.0)), qmax
    if activation == "relu6":
        return (max(qmin, _tflite_quantize(scale, zero_point, 0.0)),
                min(qmax, _tflite_quantize(scale, zero_point, 6.0)))
    if activation == "relu_n1_to_1":
        return (max(qmin, _tflite_quantize(scale, zero_point, -1.0)),
                min(qmax, _tflite_quantize(scale, zero_point, 1.0)))
    raise ValueError(f"unknown activation {activation!r}")


def conv_output_multipliers(input_scale: float, filter_scales, output_scale: float,
                            num_channels: int | None = None) -> tuple:
    """tflite::PopulateConvolutionQuantizationParams (kernel_util.cc), used by TFLM's CONV_2D and
    DEPTHWISE_CONV_2D (per-tensor filters included: their one scale is broadcast) and by
    FULLY_CONNECTED with per-channel filters. Per channel:
    QuantizeMultiplier(double(input_scale) * double(filter_scale) / double(output_scale)).
    Returns (int32 multipliers, int32 shifts) as numpy arrays, one entry per filter scale, or
    num_channels entries when a single per-tensor scale is given with num_channels."""
    fs = np.atleast_1d(np.asarray(filter_scales, dtype=np.float32))
    if num_channels is not None and fs.size == 1:
        fs = np.repeat(fs, num_channels)
    pairs = [quantize_multiplier(f32(input_scale) * float(s) / f32(output_scale)) for s in fs]
    return (np.array([m for m, _ in pairs], dtype=np.int32),
            np.array([s for _, s in pairs], dtype=np.int32))


def fc_output_multipliers(input_scale: float, filter_scales, output_scale: float,
                          bias_scale: float | None = None) -> tuple:
    """TFLM FullyConnected Prepare (micro/kernels/fully_connected_common.cc). Per-channel filters:
    as conv_output_multipliers. A per-tensor filter goes through GetQuantizedConvolutionMultipler,
    which forms input_scale * filter_scale in *float32* before widening to double, and (with a
    bias) rejects |input_scale*filter_scale - bias_scale| / output_scale > 0.02.
    Returns (int32 multipliers, int32 shifts) arrays of length 1 for a per-tensor filter."""
    fs = np.atleast_1d(np.asarray(filter_scales, dtype=np.float32))
    if fs.size > 1:
        return conv_output_multipliers(input_scale, fs, output_scale)
    if bias_scale is not None:
        scale_diff = abs(f32(input_scale) * float(fs[0]) - f32(bias_scale))
        if scale_diff / f32(output_scale) > 0.02:
            raise ValueError("bias scale differs from input_scale * filter_scale (TFLM rejects)")
    product = float(np.float32(input_scale) * fs[0])  # float32 product
    mult, shift = quantize_multiplier(product / f32(output_scale))
    return np.array([mult], dtype=np.int32), np.array([shift], dtype=np.int32)


def add_params(in1_scale, in1_zero_point, in2_scale, in2_zero_point, out_scale, out_zero_point,
               activation: str = "none") -> dict:
    """TFLM CalculateOpDataAdd (micro/kernels/add_common.cc), int8: inputs rescaled to a common
    2 * max(input scale) after a left shift of 20, in double. Keys are mf_add_s8's arguments."""
    s1, s2, so = f32(in1_scale), f32(in2_scale), f32(out_scale)
    left_shift = 20
    twice_max_input_scale = 2 * max(s1, s2)
    m1, sh1 = quantize_multiplier_smaller_than_one_exp(s1 / twice_max_input_scale)
    m2, sh2 = quantize_multiplier_smaller_than_one_exp(s2 / twice_max_input_scale)
    mo, sho = quantize_multiplier_smaller_than_one_exp(
        twice_max_input_scale / ((1 << left_shift) * so))
    act_min, act_max = activation_range_int8(activation, out_scale, out_zero_point)
    return dict(input1_offset=-int(in1_zero_point), input2_offset=-int(in2_zero_point),
                left_shift=left_shift, input1_multiplier=m1, input1_shift=sh1,
                input2_multiplier=m2, input2_shift=sh2, output_multiplier=mo, output_shift=sho,
                output_offset=int(out_zero_point), act_min=act_min, act_max=act_max)


def mul_params(in1_scale, in1_zero_point, in2_scale, in2_zero_point, out_scale, out_zero_point,
               activation: str = "none") -> dict:
    """TFLM CalculateOpDataMul (micro/kernels/mul_common.cc), int8:
    QuantizeMultiplier(double(s1) * double(s2) / double(s_out)). Keys are mf_mul_s8's arguments."""
    mult, shift = quantize_multiplier(f32(in1_scale) * f32(in2_scale) / f32(out_scale))
    act_min, act_max = activation_range_int8(activation, out_scale, out_zero_point)
    return dict(input1_offset=-int(in1_zero_point), input2_offset=-int(in2_zero_point),
                output_multiplier=mult, output_shift=shift, output_offset=int(out_zero_point),
                act_min=act_min, act_max=act_max)


def softmax_params(input_scale: float, beta: float) -> tuple:
    """TFLM CalculateSoftmaxParams (micro/kernels/softmax_common.cc), int8 in -> int8 out:
    tflite::PreprocessSoftmaxScaling(beta, input_scale, kScaledDiffIntegerBits=5) then
    diff_min = -CalculateInputRadius(5, left_shift). TFLM also requires the output to be
    zero point -128, scale exactly 1/256. Returns (input_beta_multiplier,
    input_beta_left_shift, diff_min) for mf_softmax_s8."""
    scaled_diff_integer_bits = 5
    real = min(f32(beta) * f32(input_scale) * float(1 << (31 - scaled_diff_integer_bits)),
               float((1 << 31) - 1))
    mult, left_shift = quantize_multiplier_greater_than_one(real)
    diff_min = -calculate_input_radius(scaled_diff_integer_bits, left_shift)
    return mult, left_shift, diff_min


def _fixed_point_input_params(input_scale: float, input_zero_point: int) -> dict:
    """The int8 branch shared by TFLM's LOGISTIC and TANH Prepare: input rescaled to Q4.27 with a
    bare frexp (not QuantizeMultiplier: no 2^31 fix-up, no flush), radius from
    CalculateInputRadius(4, shift, 31)."""
    input_integer_bits = 4
    q, shift = math.frexp(f32(input_scale) * float(1 << (31 - input_integer_bits)))
    mult = round_half_away(q * (1 << 31))
    if mult >= 2**31:
        raise ValueError("input multiplier overflows int32")
    return dict(input_zero_point=int(input_zero_point),
                input_range_radius=calculate_input_radius(input_integer_bits, shift, 31),
                input_multiplier=int(mult), input_left_shift=int(shift))


def logistic_params(input_scale: float, input_zero_point: int,
                    output_zero_point: int | None = None) -> dict:
    """TFLM CalculateArithmeticOpDataLogistic (micro/kernels/logistic_common.cc), int8. TFLM
    requires output zero point -128 (the output scale is assumed 1/256, not checked).
    Keys are mf_logistic_s8's arguments."""
    if output_zero_point is not None and output_zero_point != INT8_MIN:
        raise ValueError("TFLM int8 LOGISTIC requires output zero point -128")
    return _fixed_point_input_params(input_scale, input_zero_point)


def tanh_params(input_scale: float, input_zero_point: int) -> dict:
    """TFLM TanhPrepare / CalculateArithmeticOpData (micro/kernels/tanh.cc), int8. TFLM checks
    nothing about the output: the kernel always produces scale 1/128, zero point 0.
    Keys are mf_tanh_s8's arguments (input_left_shift is its input_shift)."""
    return _fixed_point_input_params(input_scale, input_zero_point)


def hard_swish_params(input_scale, input_zero_point, output_scale, output_zero_point) -> dict:
    """TFLM HardSwishPrepare (micro/kernels/hard_swish_common.cc), int8. The scale ratios are
    float32 divisions; each QuantizeMultiplier result is rounded to a Q15 int16 multiplier by
    DownScaleInt32ToInt16Multiplier. Requires output exponent <= 0 (as TFLM).
    Keys are mf_hard_swish_s8's arguments."""
    hires_input_scale = np.float32(1.0 / 128.0) * np.float32(input_scale)
    reluish_scale = np.float32(3.0) / np.float32(32768.0)
    out_m, out_e = quantize_multiplier(float(hires_input_scale / np.float32(output_scale)))
    if out_e > 0:
        raise ValueError("HARD_SWISH output multiplier exponent > 0 (TFLM rejects)")
    rel_m, rel_e = quantize_multiplier(float(hires_input_scale / reluish_scale))
    return dict(input_zero_point=int(input_zero_point), output_zero_point=int(output_zero_point),
                reluish_multiplier_fixedpoint_int16=downscale_int32_to_int16_multiplier(rel_m),
                reluish_multiplier_exponent=rel_e,
                output_multiplier_fixedpoint_int16=downscale_int32_to_int16_multiplier(out_m),
                output_multiplier_exponent=out_e)


def leaky_relu_params(input_scale, input_zero_point, output_scale, output_zero_point,
                      alpha: float) -> dict:
    """TFLM CalculateOpDataLeakyRelu (micro/kernels/leaky_relu_common.cc), int8: two multipliers,
    input_scale * alpha / output_scale and input_scale / output_scale, both formed in float32.
    A negative alpha gives a negative alpha multiplier. Keys are mf_leaky_relu_s8's arguments."""
    si, so, a = np.float32(input_scale), np.float32(output_scale), np.float32(alpha)
    m_alpha, s_alpha = quantize_multiplier(float(si * a / so))
    m_id, s_id = quantize_multiplier(float(si / so))
    return dict(input_offset=int(input_zero_point), output_offset=int(output_zero_point),
                output_multiplier_identity=m_id, output_shift_identity=s_id,
                output_multiplier_alpha=m_alpha, output_shift_alpha=s_alpha)


def relu_params(input_scale, input_zero_point, output_scale, output_zero_point) -> dict:
    """TFLM CalculateReluOpData<int8_t> (micro/kernels/activations_common.cc): requantizes with
    QuantizeMultiplier(float32 input_scale / output_scale); act_min = max(-128, out zp + 0),
    act_max = 127. Keys are mf_relu_s8's arguments."""
    mult, shift = quantize_multiplier(float(np.float32(input_scale) / np.float32(output_scale)))
    return dict(input_offset=int(input_zero_point), output_offset=int(output_zero_point),
                output_multiplier=mult, output_shift=shift,
                act_min=max(INT8_MIN, int(output_zero_point)), act_max=INT8_MAX)


def relu6_params(input_scale, input_zero_point) -> dict:
    """TFLM Relu6Prepare (micro/kernels/activations_common.cc), int8: no requantization at all,
    the output reuses the input's quantization. lower = input zero point,
    upper = FloatToQuantizedType<int8_t>(6.0f, input_scale, zero point), i.e.
    clamp(round(6.0f / scale) + zp). Keys are mf_relu6_s8's arguments."""
    six = round_half_away(np.float32(6.0) / np.float32(input_scale)) + int(input_zero_point)
    return dict(lower=max(INT8_MIN, min(INT8_MAX, int(input_zero_point))),
                upper=max(INT8_MIN, min(INT8_MAX, six)))


def requantize_params(input_scale, input_zero_point, output_scale, output_zero_point) -> dict:
    """TFLM PrepareQuantizeReference (micro/kernels/quantize_common.cc), int8 -> int8:
    QuantizeMultiplier(double(input_scale) / double(output_scale)), evaluated by
    reference_ops::Requantize. Keys are mf_requantize_s8's arguments."""
    mult, shift = quantize_multiplier(f32(input_scale) / f32(output_scale))
    return dict(input_zero_point=int(input_zero_point), output_zero_point=int(output_zero_point),
                mult=mult, shift=shift)


def mean_params(input_scale, input_zero_point, output_scale, output_zero_point,
                count: int) -> dict:
    """TFLM int8 MEAN: PrepareMeanOrSumHelper (micro/kernels/reduce_common.cc) computes
    QuantizeMultiplier(double(input_scale) / double(output_scale)); at Eval every int8 MEAN goes
    to reference_ops::QuantizedMeanOrSum (kernels/internal/reference/reduce.h), which sums the
    raw int8 values in int32 and folds 1/count into the multiplier:
        shift = min(floor(log2(count)), 32, 31 + output_shift)
        mult  = (int64(mult) << shift) / count     (truncating)
        out   = clamp(MBQM(sum - input_zp * count, mult, output_shift - shift) + output_zp).
    count is the number of elements reduced into each output. The fold is done here, at compile
    time. Keys are mf_mean_s8's arguments (besides the sum)."""
    if count <= 0:
        raise ValueError("mean over zero elements")
    mult, shift = quantize_multiplier(f32(input_scale) / f32(output_scale))
    count = int(count)
    # floor(log2(count)), capped; >= 0 because QuantizeMultiplier keeps shift >= -31
    fold = min(count.bit_length() - 1, 32, 31 + shift)
    mult = (mult << fold) // count  # mult >= 0, so floor division == C's truncation
    return dict(input_zero_point=int(input_zero_point), count=int(count), mult=int(mult),
                shift=int(shift - fold), output_zero_point=int(output_zero_point))
