/* mcuforge_nn.h: micro-kernels the schedule stage calls (int8 layers, TFLM numerics).
 *
 * Every kernel has one body per instruction set: the Arm DSP extension (v7E-M: Cortex-M4,
 * M7, M33 with DSP) when MF_USE_DSP is 1, else portable C99 (host, Cortex-M3, RISC-V).
 * Both compute the same integers; tests/test_nn_kernels.py checks them against each other
 * and against a numpy model of TFLM. MF_USE_DSP defaults to the compiler's
 * __ARM_FEATURE_DSP; define it to 0 to build the portable path on any core.
 */
#ifndef MCUFORGE_NN_H
#define MCUFORGE_NN_H

#include <stdint.h>
#include <string.h>

#ifndef MF_USE_DSP
#if defined(__ARM_FEATURE_DSP) && __ARM_FEATURE_DSP
#define MF_USE_DSP 1
#else
#define MF_USE_DSP 0
#endif
#endif

#if MF_USE_DSP
#include <arm_acle.h>
#endif

#if defined(__GNUC__)
#define MF_MICRO static __attribute__((unused, noinline))
#else
#define MF_MICRO static
#endif

/* ---- requantization of an int32 accumulator to int8 ----------------------------------------
 * TFLM computes y = clamp(zp + MultiplyByQuantizedMultiplier(acc, mult, shift), lo, hi), i.e.
 * RoundingDivideByPOT(SaturatingRoundingDoublingHighMul(acc << left, mult), right) with
 * left = max(shift, 0), right = max(-shift, 0). For mult > 0,
 *   SRDHM(a, mult) = floor((a * mult + 2^30) / 2^31) = floor(((a << 1) * mult + 2^31) / 2^32),
 * one SMMLAR on the doubled value, and for right >= 1
 *   RDBPOT(h, right) = floor((h + 2^(right-1) - [h < 0]) / 2^right),
 * so with the rounding and the zero point folded into one constant:
 *   h = SMMLAR(acc << pre, mult)           pre  = left + 1
 *   y = (h + add + (h >> 31)) >> post      post = right, add = 2^(post-1) + (zp << post)
 * The sign term (h >> 31) is -1 for h < 0 and is left out when post = 0 (add = zp) or when the
 * lower clamp lo >= zp (a negative h then lands below lo either way: `signfix` 0).
 * Exact while acc << pre and h + add do not overflow int32: the compiler proves that per layer
 * from the weights' magnitudes (codegen_c/pack.py) before choosing these kernels. */
typedef struct {
    int32_t mult; /* TFLM's quantized multiplier, in [2^30, 2^31) */
    int32_t add;  /* 2^(post-1) + (zp << post), or zp when post = 0 */
    int32_t pre;  /* left shift before the high multiply, >= 1 */
    int32_t post; /* arithmetic right shift after it, 0..31 */
} mf_rq;

static inline int32_t mf_smmlar(int32_t a, int32_t b) {
#if MF_USE_DSP
    return __smmlar(a, b, 0);
#else
    return (int32_t)(((int64_t)a * b + (INT64_C(1) << 31)) >> 32);
#endif
}

/* The requantized value before the clamp. signfix: 1 unless lo >= zp (see above). */
static inline int32_t mf_rq_apply(int32_t acc, const mf_rq *q, int32_t signfix) {
    int32_t h = mf_smmlar((int32_t)((uint32_t)acc << q->pre), q->mult);
    int32_t v = h + q->add;
    if (signfix && q->post) v += h >> 31;
    return v >> q->post;
}

#endif /* MCUFORGE_NN_H */
