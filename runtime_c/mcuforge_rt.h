/* mcuforge_rt.h: integer arithmetic of TFLite Micro's reference kernels, bit-exact.
 *
 * Every function mirrors one TFLM / gemmlowp function (named in its comment) as TFLM builds it
 * by default: TFLITE_SINGLE_ROUNDING is not defined, so MultiplyByQuantizedMultiplier is the
 * "double rounding" gemmlowp form (SaturatingRoundingDoublingHighMul then RoundingDivideByPOT).
 *
 * C99, no allocation, no recursion. Where TFLM's C++ leans on wrap-around or on arithmetic
 * right shifts of negative values, this file spells them out with fully defined operations
 * (uint32 arithmetic, mf_asr_i32) so the results equal what TFLM computes on gcc/clang while
 * staying free of undefined and implementation-defined behaviour.
 * codegen_c/qmath.py holds a Python mirror of every function here; keep the two in step.
 */
#ifndef MCUFORGE_RT_H
#define MCUFORGE_RT_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* IEEE 754 constants for generated code (Annex F arithmetic, no <math.h> needed). */
#define MF_INF (1.0f / 0.0f)
#define MF_NAN (0.0f / 0.0f)

/* Every kernel stays a function of its own (as tflite-micro's kernels are) instead of being
 * inlined into the invoke function. With all of a model's kernels inlined into one function,
 * arm-none-eabi-gcc 12.2 code for the Cortex-M55 (MVE float) at -O3 and at -O2 -funroll-loops
 * gave wrong transposes under QEMU (values from unwritten stack, a 7.4 KB frame of SLP
 * temporaries); -fno-schedule-insns, -fno-tree-slp-vectorize or no MVE float avoided it,
 * dropping restrict or strict aliasing did not. Separate kernels also ran in fewer
 * instructions (MLPerf Tiny int8 on the Cortex-M4: 0.7% to 16% fewer).
 * noipa rather than noinline: gcc 12.2 -O2 still clones a noinline kernel for the constant
 * arena addresses it is called with (ipa-cp), and such clones computed wrong results (Conv ->
 * ReduceSum: off by 17; a transposed input read by two branches: off by 5.3), right at -O0,
 * -O1, -O3 and with -fno-ipa-cp (tests/test_onnx_models.py, tests/test_fuzz_graphs.py). A kernel
 * opaque to interprocedural analysis cannot be specialised on its call sites. */
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 8
#define MF_KERNEL __attribute__((noipa))
#elif defined(__GNUC__)
#define MF_KERNEL __attribute__((noinline))
#else
#define MF_KERNEL
#endif

/* Constant tables of the generated code (weights, packed for the micro-kernels): 8-aligned,
 * because the kernels read them with LDRD / LDM, which fault on a misaligned address, and a
 * compiler may place an int16 or int8 array on any 2- or 1-byte boundary (at -Os, say). */
#if defined(__GNUC__)
#define MF_TABLE __attribute__((aligned(8)))
#else
#define MF_TABLE
#endif

/* Placement of a model's arena and tables (NAME_ARENA_SECTION, NAME_WEIGHTS_SECTION and
 * NAME_ARENA_ALIGN in the generated NAME.c): GNU C attributes, which gcc, clang and armclang
 * take; other compilers place data through their linker configuration instead. */
#if defined(__GNUC__)
#define MF_ALIGNED(n) __attribute__((aligned(n)))
#define MF_SECTION(name) __attribute__((section(name)))
#else
#define MF_ALIGNED(n)
#define MF_SECTION(name)
#endif

/* ---- plumbing: defined wrap-around and shifts ------------------------------------------ */

/* uint32 -> int32 modulo 2^32 (what a C++ static_cast does on every TFLM target). */
static inline int32_t mf_u2s_i32(uint32_t u) {
    return u <= (uint32_t)INT32_MAX ? (int32_t)u : (int32_t)(u - 2147483648u) + INT32_MIN;
}

static inline int32_t mf_wrap_add_i32(int32_t a, int32_t b) {
    return mf_u2s_i32((uint32_t)a + (uint32_t)b);
}

static inline int32_t mf_wrap_sub_i32(int32_t a, int32_t b) {
    return mf_u2s_i32((uint32_t)a - (uint32_t)b);
}

static inline int32_t mf_wrap_mul_i32(int32_t a, int32_t b) {
    return mf_u2s_i32((uint32_t)a * (uint32_t)b);
}

/* x * 2^s modulo 2^32, 0 <= s <= 31: TFLM's `x * (1 << s)`. */
static inline int32_t mf_wrap_shl_i32(int32_t x, int32_t s) {
    return mf_u2s_i32((uint32_t)x << s);
}

/* Arithmetic (sign-filling) right shift, 0 <= s <= 31: C++ `x >> s` on TFLM targets. */
static inline int32_t mf_asr_i32(int32_t x, int32_t s) {
    return x >= 0 ? (x >> s) : ~(~x >> s);
}

/* int32 -> int16 modulo 2^16 (C++ static_cast<int16_t>). */
static inline int16_t mf_wrap_i16(int32_t x) {
    uint32_t u = (uint32_t)x & 0xFFFFu;
    return u <= 0x7FFFu ? (int16_t)u : (int16_t)((int32_t)u - 65536);
}

/* ---- min / max / clamp -------------------------------------------------------------------- */

static inline int32_t mf_max_i32(int32_t a, int32_t b) { return a > b ? a : b; }
static inline int32_t mf_min_i32(int32_t a, int32_t b) { return a < b ? a : b; }
static inline int64_t mf_max_i64(int64_t a, int64_t b) { return a > b ? a : b; }
static inline int64_t mf_min_i64(int64_t a, int64_t b) { return a < b ? a : b; }

/* Float max/min for generated code: a NaN first operand yields b (as fmaxf/fminf would). */
static inline float mf_max_f32(float a, float b) { return a != a ? b : (b > a ? b : a); }
static inline float mf_min_f32(float a, float b) { return a != a ? b : (b < a ? b : a); }

/* Float max/min of the model's values (fused and standalone activations, max pooling, reduce
 * max/min, softmax's row maximum): NaN in either operand gives NaN, as IEEE 754-2019 maximum
 * and minimum, onnxruntime's Relu/Clip/Max/Min and TFLite's std::min(std::max(x, lo), hi) on a
 * NaN x do. mf_max_f32/mf_min_f32 above drop a NaN, for clamps before a float -> int
 * conversion, which must never see one. */
static inline float mf_max_nan_f32(float a, float b) { return (a > b || a != a) ? a : b; }
static inline float mf_min_nan_f32(float a, float b) { return (a < b || a != a) ? a : b; }

/* ActivationFunctionWithMinMax / std::min(std::max(x, lo), hi). */
static inline int32_t mf_clamp(int32_t x, int32_t lo, int32_t hi) {
    return mf_min_i32(mf_max_i32(x, lo), hi);
}

/* reference_integer_ops::AveragePool's rounding division, count > 0. int64 keeps the
 * `sum +/- count/2` step from overflowing; for every int8 pooling sum it equals int32. */
static inline int32_t mf_div_round_i32(int32_t sum, int32_t count) {
    int64_t s = sum, c = count;
    return (int32_t)(s > 0 ? (s + c / 2) / c : (s - c / 2) / c);
}

/* ---- gemmlowp fixed-point primitives ------------------------------------------------------ */

/* gemmlowp::SaturatingRoundingDoublingHighMul<int32_t>: round(a*b / 2^31), saturating. */
static inline int32_t mf_srdhm(int32_t a, int32_t b) {
    int64_t ab, nudge;
    if (a == b && a == INT32_MIN) return INT32_MAX;
    ab = (int64_t)a * (int64_t)b;
    nudge = ab >= 0 ? (INT64_C(1) << 30) : 1 - (INT64_C(1) << 30);
    return (int32_t)((ab + nudge) / (INT64_C(1) << 31)); /* C division truncates, as C++ */
}

/* gemmlowp::RoundingDivideByPOT<int32_t>: x / 2^exponent rounded half away from zero,
 * 0 <= exponent <= 31. */
static inline int32_t mf_rdbpot(int32_t x, int32_t exponent) {
    int32_t mask = (int32_t)((INT64_C(1) << exponent) - 1);
    int32_t remainder = x & mask;
    int32_t threshold = (mask >> 1) + (x < 0 ? 1 : 0);
    return mf_asr_i32(x, exponent) + (remainder > threshold ? 1 : 0);
}

/* gemmlowp::SaturatingRoundingMultiplyByPOT<exponent> (and TFLM's ...POTParam):
 * x * 2^exponent, saturating for exponent > 0, rounding for exponent < 0 (-31..31). */
static inline int32_t mf_srmbpot(int32_t x, int32_t exponent) {
    int32_t threshold;
    if (exponent == 0) return x;
    if (exponent < 0) return mf_rdbpot(x, -exponent);
    threshold = (int32_t)((INT64_C(1) << (31 - exponent)) - 1);
    if (x > threshold) return INT32_MAX;
    if (x < -threshold) return INT32_MIN;
    return mf_wrap_shl_i32(x, exponent);
}

/* gemmlowp::RoundingHalfSum<int32_t>: (a + b) / 2 rounded half away from zero. */
static inline int32_t mf_rounding_half_sum(int32_t a, int32_t b) {
    int64_t sum = (int64_t)a + (int64_t)b;
    return (int32_t)((sum + (sum >= 0 ? 1 : -1)) / 2);
}

/* ---- MultiplyByQuantizedMultiplier family (tensorflow/lite/kernels/internal/common.*) ---- */

/* tflite::MultiplyByQuantizedMultiplier(int32_t, int32_t, int), double-rounding build:
 * shift > 0 shifts left before the multiply (wrapping, like TFLM), shift < 0 rounds right. */
static inline int32_t mf_mbqm(int32_t x, int32_t mult, int32_t shift) {
    int32_t left = shift > 0 ? shift : 0;
    int32_t right = shift > 0 ? 0 : -shift;
    return mf_rdbpot(mf_srdhm(mf_wrap_shl_i32(x, left), mult), right);
}

/* tflite::MultiplyByQuantizedMultiplierSmallerThanOneExp (shift <= 0). */
static inline int32_t mf_mbqm_lt1(int32_t x, int32_t mult, int32_t shift) {
    return mf_rdbpot(mf_srdhm(x, mult), -shift);
}

/* tflite::MultiplyByQuantizedMultiplierGreaterThanOne (shift >= 0). */
static inline int32_t mf_mbqm_gt1(int32_t x, int32_t mult, int32_t shift) {
    return mf_srdhm(mf_wrap_shl_i32(x, shift), mult);
}

/* tflite::MultiplyByQuantizedMultiplier(int64_t, int32_t, int) (int64 accumulators of int16
 * layers; the same in both rounding builds): the multiplier rounded to 16 bits, then
 * (x * reduced + 2^(total_shift-1)) >> total_shift with total_shift = 15 - shift, truncated to
 * int32. TFLM's contract: mult >= 0, -31 <= shift <= 7, |x| < 2^47 (so nothing overflows). */
static inline int32_t mf_mbqm_i64(int64_t x, int32_t mult, int32_t shift) {
    int32_t reduced = mult < 0x7FFF0000 ? mf_asr_i32(mult + (1 << 15), 16) : 0x7FFF;
    int32_t total_shift = 15 - shift;
    int64_t r = x * reduced + (INT64_C(1) << (total_shift - 1));
    r = r >= 0 ? r >> total_shift : ~(~r >> total_shift); /* arithmetic shift, defined */
    return mf_u2s_i32((uint32_t)((uint64_t)r & 0xFFFFFFFFu));
}

/* ---- gemmlowp fixed-point math (raw int32 values; `ib` = the format's integer bits) ------- */

/* gemmlowp::exp_on_interval_between_negative_one_quarter_and_0_excl (Q0.31 in and out). */
static inline int32_t mf_exp_on_interval_between_negative_one_quarter_and_0_excl(int32_t a) {
    const int32_t constant_term = 1895147668;    /* exp(-1/8) */
    const int32_t constant_1_over_3 = 715827883; /* 1/3 */
    int32_t x = mf_wrap_add_i32(a, INT32_C(1) << 28); /* a + 1/8 */
    int32_t x2 = mf_srdhm(x, x);
    int32_t x3 = mf_srdhm(x2, x);
    int32_t x4 = mf_srdhm(x2, x2);
    int32_t x4_over_4 = mf_rdbpot(x4, 2);
    int32_t poly = mf_rdbpot(
        mf_wrap_add_i32(mf_srdhm(mf_wrap_add_i32(x4_over_4, x3), constant_1_over_3), x2), 1);
    return mf_wrap_add_i32(constant_term, mf_srdhm(constant_term, mf_wrap_add_i32(x, poly)));
}

/* gemmlowp::exp_on_negative_values<int32_t, ib>: a in Q(ib).(31-ib), a <= 0; result Q0.31.
 * Valid for 0 <= ib <= 29 (TFLM uses ib = 4 and 5). */
static inline int32_t mf_exp_on_negative_values(int32_t a, int32_t ib) {
    /* exp(-2^k) in Q0.31 for k = -2..4, applied per set bit of the remainder */
    static const int32_t barrel[7] = {1672461947, 1302514674, 790015084, 290630308,
                                      39332535,   720401,     242};
    const int32_t frac_bits = 31 - ib;
    const int32_t one_quarter = INT32_C(1) << (frac_bits - 2);
    int32_t a_mod_quarter_minus_one_quarter = (a & (one_quarter - 1)) - one_quarter;
    int32_t result = mf_exp_on_interval_between_negative_one_quarter_and_0_excl(
        mf_srmbpot(a_mod_quarter_minus_one_quarter, ib));
    int32_t remainder = mf_wrap_sub_i32(a_mod_quarter_minus_one_quarter, a);
    int32_t k;
    for (k = -2; k <= 4; ++k) {
        if (ib > k && ((uint32_t)remainder & ((uint32_t)1 << (frac_bits + k))) != 0) {
            result = mf_srdhm(result, barrel[k + 2]);
        }
    }
    if (ib > 5 && a < -(INT32_C(1) << (36 - ib))) result = 0; /* a < -32 */
    if (a == 0) result = INT32_MAX;
    return result;
}

/* gemmlowp::one_over_one_plus_x_for_x_in_0_1 (Q0.31 in and out): Newton-Raphson 1/(1+a). */
static inline int32_t mf_one_over_one_plus_x_for_x_in_0_1(int32_t a) {
    const int32_t f2_one = INT32_C(1) << 29;
    int32_t half_denominator = mf_rounding_half_sum(a, INT32_MAX);
    int32_t x = mf_wrap_add_i32(1515870810, mf_srdhm(half_denominator, -1010580540)); /* Q2 */
    int i;
    for (i = 0; i < 3; ++i) {
        int32_t one_minus_hdx = mf_wrap_sub_i32(f2_one, mf_srdhm(half_denominator, x));
        x = mf_wrap_add_i32(x, mf_srmbpot(mf_srdhm(x, one_minus_hdx), 2));
    }
    return mf_srmbpot(x, 1); /* x/2 in Q1 rescaled to Q0 */
}

/* gemmlowp::one_minus_x_over_one_plus_x_for_x_in_0_1 (Q0.31 in and out). */
static inline int32_t mf_one_minus_x_over_one_plus_x_for_x_in_0_1(int32_t a) {
    const int32_t f2_one = INT32_C(1) << 29;
    int32_t half_denominator = mf_rounding_half_sum(a, INT32_MAX);
    int32_t x = mf_wrap_add_i32(1515870810, mf_srdhm(half_denominator, -1010580540));
    int i;
    for (i = 0; i < 3; ++i) {
        int32_t one_minus_hdx = mf_wrap_sub_i32(f2_one, mf_srdhm(half_denominator, x));
        x = mf_wrap_add_i32(x, mf_srmbpot(mf_srdhm(x, one_minus_hdx), 2));
    }
    return mf_srmbpot(mf_wrap_sub_i32(x, f2_one), 2);
}

/* gemmlowp::logistic<int32_t, ib>: a in Q(ib).(31-ib), result Q0.31. */
static inline int32_t mf_logistic_q(int32_t a, int32_t ib) {
    int32_t abs_a, pos;
    if (a == 0) return INT32_C(1) << 30; /* 0.5 */
    abs_a = a > 0 ? a : mf_wrap_sub_i32(0, a);
    pos = mf_one_over_one_plus_x_for_x_in_0_1(
        mf_exp_on_negative_values(mf_wrap_sub_i32(0, abs_a), ib));
    return a > 0 ? pos : mf_wrap_sub_i32(INT32_MAX, pos);
}

/* gemmlowp::tanh<int32_t, ib>: a in Q(ib).(31-ib), result Q0.31. */
static inline int32_t mf_tanh_q(int32_t a, int32_t ib) {
    int32_t n, t;
    if (a == 0) return 0;
    n = a < 0 ? a : mf_wrap_sub_i32(0, a);
    /* neg_tanh_on_negative_values: ExactMulByPot<1> keeps the raw value, adds an integer bit */
    t = mf_one_minus_x_over_one_plus_x_for_x_in_0_1(mf_exp_on_negative_values(n, ib + 1));
    return a < 0 ? mf_wrap_sub_i32(0, t) : t;
}

/* tflite::CountLeadingZeros<uint32_t> (32 for 0). */
static inline int32_t mf_clz_u32(uint32_t x) {
    int32_t n = 0;
    if (x == 0) return 32;
    while ((x & 0x80000000u) == 0) {
        x <<= 1;
        ++n;
    }
    return n;
}

/* tflite::GetReciprocal: 1/x for x in Q(x_integer_digits); returns Q0.31 of
 * 1/(x * 2^-num_bits_over_unit), i.e. the result is scaled by 2^-num_bits_over_unit. */
static inline int32_t mf_get_reciprocal(int32_t x, int32_t x_integer_digits,
                                        int32_t *num_bits_over_unit) {
    int32_t headroom_plus_one = mf_clz_u32((uint32_t)x);
    uint32_t shifted = headroom_plus_one >= 32 ? 0u : (uint32_t)x << headroom_plus_one;
    *num_bits_over_unit = x_integer_digits - headroom_plus_one;
    return mf_one_over_one_plus_x_for_x_in_0_1(mf_u2s_i32(shifted - 0x80000000u));
}

/* ---- int8 element-wise kernels ------------------------------------------------------------ */

/* reference_integer_ops::Logistic (int8 in, int8 out; output zero point fixed at -128). */
static inline int8_t mf_logistic_s8(int8_t x, int32_t input_zero_point, int32_t input_range_radius,
                                    int32_t input_multiplier, int32_t input_left_shift) {
    int32_t input = (int32_t)x - input_zero_point;
    int32_t q4, out;
    if (input <= -input_range_radius) return INT8_MIN;
    if (input >= input_range_radius) return INT8_MAX;
    q4 = mf_mbqm(input, input_multiplier, input_left_shift);
    out = mf_rdbpot(mf_logistic_q(q4, 4), 31 - 8);
    return (int8_t)mf_clamp(out - 128, INT8_MIN, INT8_MAX);
}

/* reference_integer_ops::Tanh (int8 in, int8 out). TFLM adds no output zero point: the
 * output is taken to be scale 1/128, zero point 0 whatever the tensor says. */
static inline int8_t mf_tanh_s8(int8_t x, int32_t input_zero_point, int32_t input_range_radius,
                                int32_t input_multiplier, int32_t input_shift) {
    int32_t input = (int32_t)x - input_zero_point;
    int32_t q4, out;
    if (input <= -input_range_radius) return INT8_MIN;
    if (input >= input_range_radius) return INT8_MAX;
    q4 = mf_mbqm(input, input_multiplier, input_shift);
    out = mf_rdbpot(mf_tanh_q(q4, 4), 31 - 7);
    return (int8_t)mf_clamp(out, INT8_MIN, INT8_MAX);
}

/* gemmlowp::SaturatingRoundingDoublingHighMul<int16_t>. */
static inline int16_t mf_srdhm_i16(int16_t a, int16_t b) {
    int32_t ab;
    if (a == b && a == INT16_MIN) return INT16_MAX;
    ab = (int32_t)a * (int32_t)b;
    return (int16_t)((ab + (ab >= 0 ? (1 << 14) : 1 - (1 << 14))) / (1 << 15));
}

/* reference_ops::SaturatingDoublingHighMul (int16, truncating: SQDMULH). */
static inline int16_t mf_sdhm_i16(int16_t a, int16_t b) {
    if (a == b && a == INT16_MIN) return INT16_MAX;
    return (int16_t)(((int32_t)a * (int32_t)b) / (1 << 15));
}

/* reference_ops::SaturatingLeftShift (int16), amount >= 0. */
static inline int16_t mf_sat_shl_i16(int16_t value, int32_t amount) {
    int64_t r;
    if (value == 0) return 0;
    if (amount > 31) return value > 0 ? INT16_MAX : INT16_MIN;
    r = (int64_t)value * (INT64_C(1) << amount);
    return (int16_t)(r > INT16_MAX ? INT16_MAX : (r < INT16_MIN ? INT16_MIN : r));
}

/* gemmlowp::RoundingDivideByPOT<int16_t>, 0 <= exponent <= 31, int16 wrap-around included. */
static inline int16_t mf_rdbpot_i16(int16_t x, int32_t exponent) {
    int16_t mask = mf_wrap_i16((int32_t)((INT64_C(1) << exponent) - 1));
    int16_t remainder = (int16_t)(x & mask);
    int16_t threshold = mf_wrap_i16(mf_asr_i32(mask, 1) + (x < 0 ? 1 : 0));
    return mf_wrap_i16(mf_asr_i32(x, exponent) + (remainder > threshold ? 1 : 0));
}

/* reference_ops::HardSwish<int8_t> for one element (16-bit fixed-point pipeline). */
static inline int8_t mf_hard_swish_s8(int8_t x, int32_t input_zero_point,
                                      int32_t output_zero_point,
                                      int16_t reluish_multiplier_fixedpoint_int16,
                                      int32_t reluish_multiplier_exponent,
                                      int16_t output_multiplier_fixedpoint_int16,
                                      int32_t output_multiplier_exponent) {
    int16_t input_value = mf_wrap_i16((int32_t)x - input_zero_point);
    int16_t hires = mf_wrap_i16((int32_t)input_value * 128);
    int16_t preshift_output = mf_srdhm_i16(hires, output_multiplier_fixedpoint_int16);
    int16_t reluish = hires;
    int16_t out;
    if (reluish_multiplier_exponent > 0) {
        reluish = mf_sat_shl_i16(reluish, reluish_multiplier_exponent - 1);
    }
    reluish = mf_srdhm_i16(reluish, reluish_multiplier_fixedpoint_int16);
    if (reluish_multiplier_exponent > 0) reluish = mf_sat_shl_i16(reluish, 1);
    if (reluish_multiplier_exponent < 0) {
        reluish = mf_rdbpot_i16(reluish, -reluish_multiplier_exponent);
    }
    reluish = (int16_t)(((int32_t)reluish + 32768) >> 1); /* [-1, 1] -> [0, 1] */
    out = mf_rdbpot_i16(mf_sdhm_i16(reluish, preshift_output), -output_multiplier_exponent);
    out = mf_wrap_i16((int32_t)out + output_zero_point);
    return (int8_t)mf_clamp(out, INT8_MIN, INT8_MAX);
}

/* reference_ops::QuantizeLeakyRelu<int8_t> for one element. output_multiplier_alpha carries
 * alpha's sign (QuantizeMultiplier of a negative real gives a negative multiplier). */
static inline int8_t mf_leaky_relu_s8(int8_t x, int32_t input_offset, int32_t output_offset,
                                      int32_t output_multiplier_identity,
                                      int32_t output_shift_identity,
                                      int32_t output_multiplier_alpha,
                                      int32_t output_shift_alpha) {
    int32_t input_value = (int32_t)x - input_offset;
    int32_t out = output_offset;
    if (input_value >= 0) {
        out = mf_wrap_add_i32(out, mf_mbqm(input_value, output_multiplier_identity,
                                           output_shift_identity));
    } else {
        int32_t negative = output_multiplier_alpha < 0;
        int32_t m = negative ? mf_wrap_sub_i32(0, output_multiplier_alpha)
                             : output_multiplier_alpha;
        int32_t scaled = mf_mbqm(input_value, m, output_shift_alpha);
        out = mf_wrap_add_i32(out, negative ? mf_wrap_sub_i32(0, scaled) : scaled);
    }
    return (int8_t)mf_clamp(out, INT8_MIN, INT8_MAX);
}

/* tflite::ReluQuantized<int8_t> for one element (TFLM's RELU requantizes). */
static inline int8_t mf_relu_s8(int8_t x, int32_t input_offset, int32_t output_offset,
                                int32_t output_multiplier, int32_t output_shift,
                                int32_t act_min, int32_t act_max) {
    int32_t v = mf_wrap_add_i32(
        output_offset, mf_mbqm((int32_t)x - input_offset, output_multiplier, output_shift));
    return (int8_t)mf_clamp(v, act_min, act_max);
}

/* tflite::Relu6Quantized<int8_t>: TFLM's RELU6 does not requantize, it clamps the input to
 * [quantized 0, quantized 6] of the input's own quantization. */
static inline int8_t mf_relu6_s8(int8_t x, int8_t lower, int8_t upper) {
    return x > upper ? upper : (x < lower ? lower : x);
}

/* reference_ops::Requantize<int8_t, int8_t> for one element (int8 -> int8 QUANTIZE). */
static inline int8_t mf_requantize_s8(int8_t x, int32_t input_zero_point,
                                      int32_t output_zero_point, int32_t mult, int32_t shift) {
    int32_t v = mf_wrap_add_i32(mf_mbqm((int32_t)x - input_zero_point, mult, shift),
                                output_zero_point);
    return (int8_t)mf_clamp(v, INT8_MIN, INT8_MAX);
}

/* reference_integer_ops::AddFunc (int8). */
static inline int8_t mf_add_s8(int8_t x, int8_t y, int32_t input1_offset, int32_t input2_offset,
                               int32_t left_shift, int32_t input1_multiplier,
                               int32_t input1_shift, int32_t input2_multiplier,
                               int32_t input2_shift, int32_t output_multiplier,
                               int32_t output_shift, int32_t output_offset, int32_t act_min,
                               int32_t act_max) {
    int32_t a = mf_wrap_shl_i32(mf_wrap_add_i32(input1_offset, x), left_shift);
    int32_t b = mf_wrap_shl_i32(mf_wrap_add_i32(input2_offset, y), left_shift);
    int32_t sum = mf_wrap_add_i32(mf_mbqm_lt1(a, input1_multiplier, input1_shift),
                                  mf_mbqm_lt1(b, input2_multiplier, input2_shift));
    int32_t out = mf_wrap_add_i32(mf_mbqm_lt1(sum, output_multiplier, output_shift),
                                  output_offset);
    return (int8_t)mf_clamp(out, act_min, act_max);
}

/* reference_integer_ops::MulElementwise (int8), one element. */
static inline int8_t mf_mul_s8(int8_t x, int8_t y, int32_t input1_offset, int32_t input2_offset,
                               int32_t output_multiplier, int32_t output_shift,
                               int32_t output_offset, int32_t act_min, int32_t act_max) {
    int32_t prod = mf_wrap_mul_i32(mf_wrap_add_i32(input1_offset, x),
                                   mf_wrap_add_i32(input2_offset, y));
    int32_t out = mf_wrap_add_i32(output_offset,
                                  mf_mbqm(prod, output_multiplier, output_shift));
    return (int8_t)mf_clamp(out, act_min, act_max);
}

/* reference_ops::QuantizedMeanOrSum (int8 mean), final step for one output: `sum` is the
 * int32 sum of `count` raw inputs; mult/shift already fold 1/count in (qparams.mean_params). */
static inline int8_t mf_mean_s8(int32_t sum, int32_t input_zero_point, int32_t count,
                                int32_t mult, int32_t shift, int32_t output_zero_point) {
    int32_t shifted = mf_u2s_i32((uint32_t)((int64_t)sum - (int64_t)input_zero_point * count));
    int32_t out = mf_wrap_add_i32(mf_mbqm(shifted, mult, shift), output_zero_point);
    return (int8_t)mf_clamp(out, INT8_MIN, INT8_MAX);
}

/* ---- float <-> int8 ---------------------------------------------------------------------- */

/* TfLiteRound on float = roundf: half away from zero. Adding 0.5 in double is exact for every
 * float below 2^23, and floats from 2^23 up are already integers. */
static inline float mf_roundf(float x) {
    float a = x < 0 ? -x : x;
    float r;
    if (!(a < 8388608.0f)) return x; /* large, inf or nan */
    r = (float)(int32_t)((double)a + 0.5);
    return x < 0 ? -r : r;
}

/* nearbyintf in the default rounding mode, as an int32: round half to even (onnxruntime's
 * MlasRequantizeOutput). Exact for |x| < 2^31 (truncation and the fraction are exact there;
 * floats from 2^23 up are integers); beyond that it saturates, and NaN gives 0. */
static inline int32_t mf_round_even_f32_to_i32(float x) {
    float a = x < 0 ? -x : x;
    int32_t i;
    float d;
    if (a != a) return 0;
    if (!(a < 2147483648.0f)) return x < 0 ? INT32_MIN : INT32_MAX;
    i = (int32_t)a;
    d = a - (float)i;
    if (d > 0.5f || (d == 0.5f && (i & 1))) i += 1; /* d > 0 only below 2^23: no overflow */
    return x < 0 ? -i : i;
}

/* reference_ops::AffineQuantize<float, int8_t>: round(x / scale) + zero_point, clamped.
 * Float division as TFLM. Out-of-int32-range values saturate (and NaN gives zero_point),
 * where the C++ float->int conversion would be undefined. */
static inline int8_t mf_quantize_f32_s8(float x, float scale, int32_t zero_point) {
    float r = mf_roundf(x / scale);
    int32_t q = r != r ? 0 : (r < -1.0e6f ? -1000000 : (r > 1.0e6f ? 1000000 : (int32_t)r));
    return (int8_t)mf_clamp(mf_wrap_add_i32(q, zero_point), INT8_MIN, INT8_MAX);
}

/* reference_ops::Dequantize<int8_t, float>: (float)((double)scale * (q - zero_point)).
 * A float product is bit-identical: scale has 24 significant bits and q - zero_point at most
 * 9, so both forms round the exact product to float exactly once. */
static inline float mf_dequantize_s8_f32(int8_t q, float scale, int32_t zero_point) {
    return scale * (float)((int32_t)q - zero_point);
}

/* ---- rows ------------------------------------------------------------------------------- */

/* reference_ops::Softmax with int8 input for one row of n values, into out8 (int8, zero point
 * -128, scale 1/256) or out16 (int16, zero point -32768, scale 1/65536); the other is NULL.
 * Fixed-point exp in Q5.26, sum in Q12.19, reciprocal via GetReciprocal. Internal (no mf_
 * prefix): tested through mf_softmax_s8 and mf_softmax_s8_s16. */
static inline void mfi_softmax_s8_row(const int8_t *in, int8_t *out8, int16_t *out16,
                                      int32_t n, int32_t input_beta_multiplier,
                                      int32_t input_beta_left_shift, int32_t diff_min) {
    int32_t max_in_row = INT8_MIN, sum_of_exps = 0, num_bits_over_unit, shifted_scale, exponent;
    int32_t lo = out8 ? INT8_MIN : INT16_MIN, hi = out8 ? INT8_MAX : INT16_MAX;
    int32_t c;
    for (c = 0; c < n; ++c) max_in_row = mf_max_i32(max_in_row, in[c]);
    for (c = 0; c < n; ++c) {
        int32_t diff = (int32_t)in[c] - max_in_row;
        if (diff >= diff_min) {
            int32_t scaled = mf_mbqm_gt1(diff, input_beta_multiplier, input_beta_left_shift);
            sum_of_exps = mf_wrap_add_i32(
                sum_of_exps, mf_rdbpot(mf_exp_on_negative_values(scaled, 5), 12));
        }
    }
    shifted_scale = mf_get_reciprocal(sum_of_exps, 12, &num_bits_over_unit);
    /* TFLM aborts (TFLITE_CHECK) outside [0, 31]: only for rows of 512+ (int8 out) or 2^17+
     * (int16 out) values at the max */
    exponent = mf_clamp(num_bits_over_unit + 31 - (out8 ? 8 : 16), 0, 31);
    for (c = 0; c < n; ++c) {
        int32_t diff = (int32_t)in[c] - max_in_row, v = lo;
        if (diff >= diff_min) {
            int32_t scaled = mf_mbqm_gt1(diff, input_beta_multiplier, input_beta_left_shift);
            int32_t e = mf_exp_on_negative_values(scaled, 5);
            v = mf_clamp(mf_rdbpot(mf_srdhm(shifted_scale, e), exponent) + lo, lo, hi);
        }
        if (out8) {
            out8[c] = (int8_t)v;
        } else {
            out16[c] = (int16_t)v;
        }
    }
}

/* reference_ops::Softmax<int8_t, int8_t> for one row of n values (output zero point -128,
 * scale 1/256). */
static inline void mf_softmax_s8(const int8_t *in, int8_t *out, int32_t n,
                                 int32_t input_beta_multiplier, int32_t input_beta_left_shift,
                                 int32_t diff_min) {
    mfi_softmax_s8_row(in, out, NULL, n, input_beta_multiplier, input_beta_left_shift,
                       diff_min);
}

/* ---- inverse square root and log (RSQRT, L2_NORMALIZATION, LOG_SOFTMAX) ------------------- */

/* SaturatingAddNonGemmlowp<int32_t> (common.h): a + b clamped to int32. */
static inline int32_t mf_sat_add_i32(int32_t a, int32_t b) {
    int64_t s = (int64_t)a + (int64_t)b;
    return (int32_t)(s > INT32_MAX ? INT32_MAX : (s < INT32_MIN ? INT32_MIN : s));
}

/* SaturatingSub<int32_t> (common.h): a - b clamped to int32. */
static inline int32_t mf_sat_sub_i32(int32_t a, int32_t b) {
    int64_t d = (int64_t)a - (int64_t)b;
    return (int32_t)(d > INT32_MAX ? INT32_MAX : (d < INT32_MIN ? INT32_MIN : d));
}

/* tflite::GetInvSqrtQuantizedMultiplierExp(input, kReverseShift = -1, ...) (common.h):
 * 1/sqrt(input) as a multiplier (returned) and a shift for mf_mbqm (through `shift`).
 * input <= 1 (0 included) gives INT32_MAX, 0. The input is normalised to [2^27, 2^29) by
 * pairs of bits, then five Newton-Raphson steps run in Q3.28. */
static inline int32_t mf_inv_sqrt_multiplier_exp(int32_t input, int32_t *shift) {
    const int32_t half_three = (INT32_C(1) << 28) + (INT32_C(1) << 27); /* 1.5 in Q3.28 */
    int32_t right = 11, pairs, half_input, x, mult, i;
    if (input <= 1) {
        *shift = 0;
        return INT32_MAX;
    }
    while (input >= (INT32_C(1) << 29)) {
        input /= 4;
        ++right;
    }
    pairs = (mf_clz_u32((uint32_t)input) - 1) / 2 - 1; /* >= 0: input < 2^29 here */
    right -= pairs;
    input <<= 2 * pairs; /* now in [2^27, 2^29): no overflow */
    half_input = mf_rdbpot(input >> 1, 1); /* Q3.28 input / 2 */
    x = INT32_C(1) << 28;                  /* 1.0 in Q3.28 */
    for (i = 0; i < 5; ++i) {
        /* x^3 is Q9.22, rescaled to Q3.28; the products below are Q6.25, rescaled too */
        int32_t x3 = mf_srmbpot(mf_srdhm(mf_srdhm(x, x), x), 6);
        x = mf_srmbpot(mf_wrap_sub_i32(mf_srdhm(half_three, x), mf_srdhm(half_input, x3)), 3);
    }
    mult = mf_srdhm(x, 1518500250); /* * sqrt(2) / 2 */
    if (right < 0) {
        mult = mf_wrap_shl_i32(mult, -right);
        right = 0;
    }
    *shift = -right;
    return mult;
}

/* RsqrtEvalQuantized (micro/kernels/elementwise.cc) for one int8/int16 value, clamped to
 * [qmin, qmax]: mult/shift are Prepare's QuantizeMultiplier(1 / (sqrt(s_in) * s_out)).
 * A value at the input zero point gives qmax; TFLM rejects values below it (here they give
 * what the formula gives: 1/sqrt of a value <= 1 is taken as 1). */
static inline int32_t mf_rsqrt_q(int32_t x, int32_t input_offset, int32_t output_offset,
                                 int32_t mult, int32_t shift, int32_t qmin, int32_t qmax) {
    int32_t value = x - input_offset, inv_shift, inv, data;
    if (value == 0) return qmax;
    inv = mf_inv_sqrt_multiplier_exp(value, &inv_shift);
    data = mf_mbqm(1, inv, inv_shift + 20); /* 1/sqrt(value) * 2^20 */
    return mf_clamp(mf_wrap_add_i32(mf_mbqm(data, mult, shift - 20), output_offset), qmin, qmax);
}

/* tflite::log_x_for_x_greater_than_or_equal_to_1<output_ib>(FixedPoint<input_ib>) (common.h):
 * log(a) for a > 0 in Q(input_ib), result in Q(output_ib); a minimax rational approximation
 * around the power of two found from the headroom, accumulated with one extra integer bit. */
static inline int32_t mf_log_x_for_x_greater_than_or_equal_to_1(int32_t a, int32_t input_ib,
                                                                 int32_t output_ib) {
    const int32_t log_2 = 1488522236, sqrt_sqrt_half = 1805811301, sqrt_half = 1518500250;
    const int32_t alpha_n = 117049297, alpha_d = 127690142, alpha_i = 1057819769;
    const int32_t alpha_f = 638450708;
    const int32_t accum_ib = output_ib + 1;
    const int32_t shifted_quarter = mf_srmbpot(536870912, -accum_ib); /* 1/4 in Q(accum_ib) */
    int32_t z_a_headroom_plus_1 = mf_clz_u32((uint32_t)a);
    int32_t r_a = mf_srmbpot(mf_srdhm(mf_srmbpot(a, z_a_headroom_plus_1 - 1), sqrt_half), 1);
    int32_t z_a_pow_2_adj = mf_sat_add_i32(
        mf_srmbpot(input_ib - z_a_headroom_plus_1, 31 - accum_ib), shifted_quarter);
    int32_t z_b_headroom = mf_clz_u32((uint32_t)mf_srdhm(a, sqrt_half)) - 1;
    int32_t r_b = mf_srmbpot(a, z_b_headroom);
    int32_t z_b_pow_2_adj = mf_sat_sub_i32(
        mf_srmbpot(input_ib - z_b_headroom, 31 - accum_ib), shifted_quarter);
    int32_t r = mf_min_i32(r_a, r_b);
    int32_t z_pow_2_adj = mf_max_i32(z_a_pow_2_adj, z_b_pow_2_adj);
    int32_t p = mf_rounding_half_sum(r, sqrt_sqrt_half);
    int32_t q = mf_wrap_sub_i32(r, sqrt_sqrt_half);
    int32_t common_sq, num, denom_minus_one, recip_denom;
    q = mf_wrap_add_i32(q, q);
    common_sq = mf_srdhm(q, q);
    num = mf_wrap_add_i32(mf_srdhm(q, r), mf_srdhm(mf_srdhm(q, common_sq), alpha_n));
    denom_minus_one = mf_wrap_add_i32(
        mf_srdhm(p, mf_wrap_add_i32(mf_wrap_add_i32(alpha_i, q), mf_srdhm(alpha_d, common_sq))),
        mf_srdhm(alpha_f, q));
    recip_denom = mf_one_over_one_plus_x_for_x_in_0_1(denom_minus_one);
    return mf_srmbpot(mf_wrap_add_i32(mf_srdhm(z_pow_2_adj, log_2),
                                      mf_srdhm(mf_srmbpot(num, -accum_ib), recip_denom)),
                      accum_ib - output_ib);
}

/* reference_integer_ops::L2Normalization (int8) for one row of n values: x - zp scaled by
 * 1/sqrt(sum of squares) into the output's fixed scale 1/128, zero point 0. */
static inline void mf_l2norm_s8(const int8_t *in, int8_t *out, int32_t n,
                                int32_t input_zero_point) {
    int32_t acc = 0, mult, shift, c;
    for (c = 0; c < n; ++c) {
        int32_t d = (int32_t)in[c] - input_zero_point;
        acc = mf_wrap_add_i32(acc, d * d); /* each square < 2^16 */
    }
    mult = mf_inv_sqrt_multiplier_exp(acc, &shift);
    for (c = 0; c < n; ++c) {
        int32_t d = (int32_t)in[c] - input_zero_point;
        out[c] = (int8_t)mf_clamp(mf_mbqm(d, mult, shift + 7), INT8_MIN, INT8_MAX);
    }
}

/* reference_ops::LogSoftmaxQuantized<int8_t> for one row of n values (output scale 16/256,
 * zero point 127): exp sums in Q12.19 from Q5.26 differences, their log in Q5.26.
 * reverse_scaling_shift is QuantizeMultiplierSmallerThanOneExp's (<= 0) shift. */
static inline void mf_log_softmax_s8(const int8_t *in, int8_t *out, int32_t n,
                                     int32_t input_multiplier, int32_t input_left_shift,
                                     int32_t reverse_scaling_divisor,
                                     int32_t reverse_scaling_shift, int32_t diff_min) {
    int32_t max_in_row = INT8_MIN, sum_of_exps = 0, log_sum, adjusted_diff_min, c;
    for (c = 0; c < n; ++c) max_in_row = mf_max_i32(max_in_row, in[c]);
    for (c = 0; c < n; ++c) {
        int32_t diff = (int32_t)in[c] - max_in_row;
        if (diff >= diff_min) {
            int32_t q5 = mf_mbqm(diff, input_multiplier, input_left_shift);
            sum_of_exps = mf_wrap_add_i32(
                sum_of_exps, mf_rdbpot(mf_exp_on_negative_values(q5, 5), 12));
        }
    }
    log_sum = mf_log_x_for_x_greater_than_or_equal_to_1(sum_of_exps, 12, 5);
    /* differences at or below this give the minimum output (note > below, >= above) */
    adjusted_diff_min = mf_max_i32(
        diff_min - 1, mf_mbqm(mf_wrap_add_i32(log_sum, INT32_MIN), reverse_scaling_divisor,
                              reverse_scaling_shift));
    for (c = 0; c < n; ++c) {
        int32_t diff = (int32_t)in[c] - max_in_row;
        if (diff > adjusted_diff_min) {
            int32_t q5 = mf_mbqm(diff, input_multiplier, input_left_shift);
            int32_t v = mf_rdbpot(mf_wrap_sub_i32(q5, log_sum), 31 - 5 - 4) + 127;
            out[c] = (int8_t)mf_clamp(v, INT8_MIN, INT8_MAX);
        } else {
            out[c] = INT8_MIN;
        }
    }
}

/* ---- binary ops (SUB, DIV, comparisons, SQUARED_DIFFERENCE, ADD_N, FLOOR_DIV) ------------ */

/* The input step of TFLM's quantized ADD / SUB / comparisons / SQUARED_DIFFERENCE / ADD_N:
 * MultiplyByQuantizedMultiplierSmallerThanOneExp((offset + x) * 2^left_shift, mult, shift),
 * x an int8 or int16 value, so that operands of different scales meet on one scale. */
static inline int32_t mf_rescale_q(int32_t x, int32_t offset, int32_t left_shift, int32_t mult,
                                   int32_t shift) {
    return mf_mbqm_lt1(mf_wrap_shl_i32(mf_wrap_add_i32(offset, x), left_shift), mult, shift);
}

/* tflite::CountLeadingSignBits<int32_t>: the redundant sign bits (31 for 0 and -1). */
static inline int32_t mf_clsb_i32(int32_t x) {
    return mf_clz_u32((uint32_t)(x < 0 ? ~x : x)) - 1;
}

/* reference_ops::DivElementwise for one int8 element: x / y through GetReciprocal of the
 * divisor, the dividend normalised by its headroom first. TFLM requires y != its zero point.
 * The final RoundingDivideByPOT exponent (recip_shift + headroom - output_shift) exceeds 31
 * for quotients far below one output step, which is undefined behaviour in TFLM's C++; the
 * reference interpreter (x86) then shifts by the exponent mod 32 under an all-ones mask, and
 * that is what this computes, so results match it. output_shift in [-24, 23] keeps the
 * exponent in [0, 63] (checked at compile time). */
static inline int32_t mf_div_q(int32_t x, int32_t y, int32_t input1_offset,
                               int32_t input2_offset, int32_t output_multiplier,
                               int32_t output_shift, int32_t output_offset, int32_t act_min,
                               int32_t act_max) {
    int32_t num = mf_wrap_add_i32(input1_offset, x), den = mf_wrap_add_i32(input2_offset, y);
    int32_t recip_shift, recip, headroom, exponent, scaled, out;
    if (den < 0) { /* the reciprocal needs a positive divisor */
        num = mf_wrap_sub_i32(0, num);
        den = mf_wrap_sub_i32(0, den);
    }
    recip = mf_get_reciprocal(den, 31, &recip_shift);
    headroom = mf_clsb_i32(num);
    scaled = mf_srdhm(mf_mbqm_gt1(num, recip, headroom), output_multiplier);
    exponent = recip_shift + headroom - output_shift;
    if (exponent > 31) {
        out = mf_wrap_add_i32(mf_asr_i32(scaled, exponent & 31), scaled >= 0 ? 1 : 0);
    } else {
        out = mf_rdbpot(scaled, exponent);
    }
    return mf_clamp(mf_wrap_add_i32(out, output_offset), act_min, act_max);
}

/* reference_ops::FloorDiv<float>: floor of the quotient formed in double, rounded to float
 * (1 / 0.33333334f gives 2, where floorf(1.0f / b) gives 3). floor without libm: from 2^52 up
 * a double is an integer; below, truncation through int64 is exact. */
static inline float mf_floor_div_f32(float a, float b) {
    double q = (double)a / (double)b;
    double t;
    if (!(q > -4503599627370496.0 && q < 4503599627370496.0) || q == 0.0) {
        return (float)q; /* integral, infinite, NaN or a signed zero */
    }
    t = (double)(int64_t)q;
    return (float)(t > q ? t - 1.0 : t);
}

/* ---- int16 sigmoid and tanh (the integer LSTM's gates; TFLM's int16 LOGISTIC / TANH) ------ */

/* TFLM's sigmoid_table_uint16 (common.h): sigmoid(i / 24) in Q0.16 for i = 0..255, the one
 * table the int16 logistic and tanh interpolate in (tanh(x) = 2 sigmoid(2x) - 1). The values
 * are TFLM's data, not a formula: plain rounding of 65536 sigmoid(i / 24) differs in 44 of
 * them, and bit-exactness needs these. */
static inline uint32_t mf_sigmoid_table_u16(int32_t i) {
    static const uint16_t table[256] = {
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
        65534, 65534, 65534, 65535};
    return table[i];
}

/* The input step shared by both: x * input_multiplier rounded right by input_left_shift;
 * multiplier 0 is TFLM's power-of-two case, x * (3 << input_left_shift). The result has
 * 2^9 (logistic) or 2^8 (tanh) steps per table entry. */
static inline int32_t mf_lut_input_s16(int16_t x, int32_t input_multiplier,
                                       int32_t input_left_shift) {
    int32_t round;
    if (input_multiplier == 0) {
        input_multiplier = 3 << input_left_shift;
        input_left_shift = 0;
    }
    round = input_left_shift > 0 ? 1 << (input_left_shift - 1) : 0;
    return mf_asr_i32(x * input_multiplier + round, input_left_shift);
}

/* reference_integer_ops::Logistic(int16): Q3.12 in (with the multiplier 0 and shift 0 the
 * LSTM uses), Q0.15 out; the table interpolated on |x|, mirrored for negative x. */
static inline int16_t mf_logistic_s16(int16_t x, int32_t input_multiplier,
                                      int32_t input_left_shift) {
    int32_t v = mf_lut_input_s16(x, input_multiplier, input_left_shift);
    uint32_t a = (uint32_t)(v < 0 ? -v : v), index = a >> 9, result;
    if (index >= 255) {
        result = UINT32_C(0x7FFF) << 10;
    } else {
        uint32_t lo = mf_sigmoid_table_u16((int32_t)index);
        uint32_t hi = mf_sigmoid_table_u16((int32_t)index + 1);
        result = (lo << 9) + (a & 0x1FF) * (hi - lo);
    }
    result = v >= 0 ? result + (1u << 9) : (UINT32_C(1) << 25) - result + (1u << 9) - 1;
    return (int16_t)(result >> 10);
}

/* reference_integer_ops::Tanh(int16): Q3.12 in for multiplier 0 and shift 0 (the LSTM passes
 * other shifts for its cell state), Q0.15 out; tanh(x) = 2 sigmoid(2x) - 1 from the same table
 * at twice the resolution. */
static inline int16_t mf_tanh_s16(int16_t x, int32_t input_multiplier, int32_t input_left_shift) {
    int32_t v = mf_lut_input_s16(x, input_multiplier, input_left_shift), result;
    uint32_t a = (uint32_t)(v < 0 ? -v : v), index = a >> 8;
    if (index >= 255) {
        result = INT32_C(0xFFFF) << 8;
    } else {
        uint32_t lo = mf_sigmoid_table_u16((int32_t)index);
        uint32_t hi = mf_sigmoid_table_u16((int32_t)index + 1);
        result = (int32_t)((lo << 8) + (a & 0xFF) * (hi - lo));
    }
    result = v >= 0 ? result - (1 << 23) + (1 << 7) : -result + (1 << 23) + (1 << 7) - 1;
    return (int16_t)mf_asr_i32(result, 8);
}

/* ---- int16 softmax (TFLite's 16x8 quantization) ---------------------------------------- */

/* LUTLookup(int16_t, const int16_t *) (common.h): lut has 513 entries over the int16 range;
 * the top 9 bits of value pick one, the low 7 interpolate towards the next (int16 slope and
 * sum, wrapping as TFLM's casts do). */
static inline int16_t mf_lut_s16(const int16_t *lut, int16_t value) {
    int32_t index = 256 + mf_asr_i32(value, 7);
    int32_t offset = value & 0x7F;
    int32_t slope = mf_wrap_i16(lut[index + 1] - lut[index]);
    return mf_wrap_i16(lut[index] + mf_asr_i32(slope * offset + 64, 7));
}

/* reference_ops::SoftmaxInt16 for one row of n values (zero points 0, output scale 2^-15).
 * exp_lut holds exp on [-10, 0] and recip_lut 1 / (1 + x) on [0, 1] (LUTPopulate<int16_t>,
 * computed at compile time). The exps are kept in `out`, their Q16.15 sum normalised to
 * [1, 2) for the reciprocal lookup, then each exp is scaled by it with rounding. */
static inline void mf_softmax_s16(const int16_t *in, int16_t *out, int32_t n,
                                  int32_t input_multiplier, int32_t input_left_shift,
                                  const int16_t *exp_lut, const int16_t *recip_lut) {
    int32_t max_in_row = INT16_MIN, sum_of_exps = 0, headroom_plus_one, shifted_sum;
    int32_t right_shift, c;
    int16_t reciprocal;
    for (c = 0; c < n; ++c) max_in_row = mf_max_i32(max_in_row, in[c]);
    for (c = 0; c < n; ++c) {
        int32_t scaled = mf_mbqm((int32_t)in[c] - max_in_row, input_multiplier,
                                 input_left_shift);
        int32_t sym = mf_clamp(mf_wrap_add_i32(scaled, 32767), INT16_MIN, INT16_MAX);
        out[c] = mf_lut_s16(exp_lut, (int16_t)sym);
        sum_of_exps += out[c]; /* n * 32767 < 2^31 for every row TFLM accepts */
    }
    headroom_plus_one = mf_clz_u32((uint32_t)sum_of_exps);
    shifted_sum = (int32_t)((((int64_t)sum_of_exps << (headroom_plus_one - 1)) +
                             (1 << 13)) >> 14); /* sum_of_exps > 0: the max's exp is ~1 */
    reciprocal = mf_lut_s16(recip_lut, (int16_t)mf_clamp(shifted_sum - ((1 << 15) + (1 << 16)),
                                                          INT16_MIN, INT16_MAX));
    right_shift = 31 - headroom_plus_one;
    for (c = 0; c < n; ++c) {
        int64_t r = (int64_t)out[c] * reciprocal + (INT64_C(1) << (right_shift - 1));
        r = r >= 0 ? r >> right_shift : ~(~r >> right_shift); /* arithmetic shift, defined */
        out[c] = (int16_t)mf_clamp((int32_t)r, 0, INT16_MAX); /* |r| < 2^30 */
    }
}

/* reference_ops::Softmax<int8_t, int16_t> for one row (output zero point -32768, scale
 * 1/65536). */
static inline void mf_softmax_s8_s16(const int8_t *in, int16_t *out, int32_t n,
                                     int32_t input_beta_multiplier,
                                     int32_t input_beta_left_shift, int32_t diff_min) {
    mfi_softmax_s8_row(in, NULL, out, n, input_beta_multiplier, input_beta_left_shift,
                       diff_min);
}

#endif /* MCUFORGE_RT_H */
