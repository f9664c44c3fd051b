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
    int32_t pre;  /* left shift before the high multiply, >= 1 (0: pack.fold_pre scaled the
                   * weights and bias by 2^pre) */
    int32_t post; /* arithmetic right shift after it, 0..31 */
} mf_rq;

static inline int32_t mf_smmlar(int32_t a, int32_t b) {
#if MF_USE_DSP && defined(__GNUC__)
    int32_t r; /* gcc 12's <arm_acle.h> has no __smmlar: SMMULR is SMMLAR with a zero addend */
    __asm__("smmulr %0, %1, %2" : "=r"(r) : "r"(a), "r"(b));
    return r;
#elif MF_USE_DSP
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

/* ==== GEMM micro-kernels: int8 1x1 convolutions, im2col convolutions, fully connected ======
 *
 * For r < rows, o < O (TFLM int8; the input zero point folded into the bias by pack.fold_bias):
 *   y[r * y_stride + o] = clamp(mf_rq_apply(bias[o] + sum_{k<K} x_r[k] * w[o][k], &rq[o],
 *                                           signfix), lo, hi)
 * with x_r the raw stored int8 values of activation row r.
 *
 * Layouts (codegen_c/pack.py builds them: pack_gemm_weights; scratch: gemm_scratch_bytes,
 * conv_scratch_bytes; flash: gemm_flash_bytes; mf_conv_geom: conv_geom):
 *   Kp = MF_KPAD(K), K rounded up to a multiple of 4; G = Kp / 4 groups of 4 taps.
 *   Widened activations (scratch, int16): per group [x0, x2, x1, x3] -- the two words SXTB16
 *     makes of the bytes x0..x3: (x0, x2) and (x1, x3) -- taps K..Kp-1 are 0.
 *   Weights: output channels in blocks of 4 (the last block padded with zero rows), then per
 *     block, per group, per channel of the block, 4 taps:
 *       MF_W16 (int16, 2x flash, fastest): [w0, w2, w1, w3]  (8 bytes: the lane order above)
 *       MF_W8  (int8, 1x flash):           [w0, w1, w2, w3]  (4 bytes; SXTB16 and SXTB16 of
 *                                           the word rotated by 8 give (w0, w2), (w1, w3))
 *     element index of w[o][4g + j]: ((o / 4) * G + g) * 16 + (o % 4) * 4 + lane(j), with
 *     lane = (0, 2, 1, 3) for MF_W16 and the identity for MF_W8; taps K..Kp-1 are 0.
 *   bias[O] (int32, input zero point folded in) and rq[O] are per channel, unpadded.
 * Register block: 4 channels x 1 row (an LDRD gives a group's activations, an LDM of 4 words
 * two channels' 4 taps); the K loop runs 16 taps per iteration after peeling G mod 4 groups,
 * with no per-tap branch. 2 ch x 2 rows was not taken: 4 LDRD + 8 SMLAD per 16 MACs against
 * 1 LDRD + 2 LDM + 8 SMLAD here, for half an mf_rq load per output less (the feasibility
 * study measured 0.91 against 0.83 instr/MAC). Both bodies (MF_USE_DSP or portable C) read
 * the same packed data.
 * Entry points: mf_gemm_w16 / mf_gemm_w8 (rows of activations), mf_conv_w16 / mf_conv_w8
 * (im2col); each comment gives arguments, layouts, scratch and alignment.
 *
 * Instructions per MAC on QEMU mps2-an386 (Cortex-M4), arm-none-eabi-gcc 12.2 -O2, including
 * widening / im2col, requantization and the call (tests/nn_bench: bench.py, README.md), clamp =
 * int8 range without sign term (TFLite's fused ReLU), w16 general entries / the K-specialised
 * (_g<G>, pre folded) entries the schedule uses / w8: 1x1 64->64 over 125 px 0.91 / 0.82 /
 * 1.41, FC 64->12 1.14 / 0.97 / 1.64, 1x1 8->16 (VWW) 2.51 / 1.94 / 3.01; convolutions through
 * mf_convp_w16[_g<G>] (no im2col): conv 3x3 16->16 on 32x32 0.89, 3x3 3->16 (ResNet-8's first)
 * 1.38, 10x4 1->64 s2 (KWS's first) 1.00. -Os within 1-10 %, -fno-schedule-insns no effect
 * (the hot loops are asm). The sign term adds ~1 (signfix 2) or ~4 (signfix 1) and a clamp
 * narrower than int8 ~5 instructions per output. */

#if MF_USE_DSP && defined(__ARMEB__)
#error "mcuforge_nn.h: the DSP kernels assume little-endian memory; build with -DMF_USE_DSP=0"
#endif
#define MF_KPAD(K) (((K) + 3) & ~3)
#if defined(__GNUC__)
#define MF_INLINE static inline __attribute__((always_inline)) /* keep accumulators in registers */
#else
#define MF_INLINE static inline
#endif
#define MF_W16 16
#define MF_W8 8
#define MF_W16Z 17 /* MF_W16 with every mf_rq.pre 0 (signfix has MF_PRE0) */

#if defined(__GNUC__)
typedef int32_t __attribute__((__may_alias__)) mf_word; /* int16 pairs / int8 quads as words */
#else
typedef int32_t mf_word;
#endif

/* Asm where gcc optimises (mf_gemm_blocks_asm: a row's full channel blocks; mf_dot4: the K
 * loop of a tail block; the widening loop); at -O0 gcc keeps r7 as the frame pointer and
 * cannot give the asm 13 registers, so the intrinsics bodies are used. Define MF_GEMM_ASM 0
 * to build the intrinsics bodies everywhere. */
#if MF_USE_DSP && defined(__GNUC__) && defined(__OPTIMIZE__) && defined(__thumb2__)
#ifndef MF_GEMM_ASM
#define MF_GEMM_ASM 1
#endif
#else
#undef MF_GEMM_ASM
#define MF_GEMM_ASM 0
#endif

#if MF_USE_DSP
static inline int32_t mf_sxtb16_ror8(int32_t v) {
#if defined(__GNUC__)
    int32_t r;
    __asm__("sxtb16 %0, %1, ror #8" : "=r"(r) : "r"(v)); /* gcc does not fold the rotation */
    return r;
#else
    return (int32_t)__sxtb16(__ror((uint32_t)v, 8));
#endif
}

/* acc + the sign-extended bytes 1 and 3 of v (SXTAB16 with the rotation folded in) */
static inline int32_t mf_sxtab16_ror8(int32_t acc, int32_t v) {
#if defined(__GNUC__)
    int32_t r;
    __asm__("sxtab16 %0, %1, %2, ror #8" : "=r"(r) : "r"(acc), "r"(v));
    return r;
#else
    return (int32_t)__sxtab16((uint32_t)acc, __ror((uint32_t)v, 8));
#endif
}
#endif

/* Four consecutive int32 (a bias block, one mf_rq) by one LDM: gcc would issue 2-4 loads. */
typedef struct {
    int32_t v[4];
} mf_quad;
#if MF_GEMM_ASM
#define MF_LDM4(p, a, b, c, d)                                                              \
    do {                                                                                    \
        register int32_t r8_ __asm__("r8");                                                 \
        register int32_t r9_ __asm__("r9");                                                 \
        register int32_t r10_ __asm__("r10");                                               \
        register int32_t r11_ __asm__("r11");                                               \
        __asm__("ldm %4, {r8, r9, r10, r11}"                                                \
                : "=r"(r8_), "=r"(r9_), "=r"(r10_), "=r"(r11_)                              \
                : "r"(p), "m"(*(const mf_quad *)(const void *)(p)));                        \
        (a) = r8_;                                                                          \
        (b) = r9_;                                                                          \
        (c) = r10_;                                                                         \
        (d) = r11_;                                                                         \
    } while (0)
#else
#define MF_LDM4(p, a, b, c, d)                                                              \
    do {                                                                                    \
        const mf_quad *q_ = (const mf_quad *)(const void *)(p);                             \
        (a) = q_->v[0];                                                                     \
        (b) = q_->v[1];                                                                     \
        (c) = q_->v[2];                                                                     \
        (d) = q_->v[3];                                                                     \
    } while (0)
#endif

/* Widen n4 whole groups (4 * n4 int8, any alignment) into xw (lane order, 4-byte aligned). */
MF_INLINE void mf_widen_groups(const int8_t *x, int32_t n4, int16_t *xw) {
#if MF_USE_DSP
    mf_word *d = (mf_word *)(void *)xw;
#if MF_GEMM_ASM && defined(__ARM_FEATURE_UNALIGNED)
    if (n4 >= 2) { /* 10 instructions per 8 bytes: two unaligned LDR, 4 SXTB16, 2 STRD */
        int32_t n8 = n4 >> 1, v, u, a, b;
        __asm__ volatile("1:\n\t"
                         "ldr %[v], [%[x]], #4\n\t"
                         "ldr %[u], [%[x]], #4\n\t"
                         "sxtb16 %[a], %[v]\n\t"
                         "sxtb16 %[b], %[v], ror #8\n\t"
                         "strd %[a], %[b], [%[d]], #8\n\t"
                         "sxtb16 %[a], %[u]\n\t"
                         "sxtb16 %[b], %[u], ror #8\n\t"
                         "strd %[a], %[b], [%[d]], #8\n\t"
                         "subs %[n], %[n], #1\n\t"
                         "bne 1b\n\t"
                         : [x] "+r"(x), [d] "+r"(d), [n] "+r"(n8), [v] "=&r"(v), [u] "=&r"(u),
                           [a] "=&r"(a), [b] "=&r"(b)
                         :
                         : "cc", "memory");
        n4 &= 1;
    }
#endif
    for (; n4 >= 2; n4 -= 2) { /* two unaligned LDR, four SXTB16, four STR per 8 */
        int32_t v, u;
        memcpy(&v, x, 4);
        memcpy(&u, x + 4, 4);
        d[0] = (int32_t)__sxtb16(v);
        d[1] = mf_sxtb16_ror8(v);
        d[2] = (int32_t)__sxtb16(u);
        d[3] = mf_sxtb16_ror8(u);
        d += 4;
        x += 8;
    }
    if (n4) {
        int32_t v;
        memcpy(&v, x, 4);
        d[0] = (int32_t)__sxtb16(v);
        d[1] = mf_sxtb16_ror8(v);
    }
#else
    for (; n4 > 0; --n4, x += 4, xw += 4) {
        xw[0] = x[0];
        xw[1] = x[2];
        xw[2] = x[1];
        xw[3] = x[3];
    }
#endif
}

/* Widen one row of K int8 activations into xw[Kp] (lane order above, zero tail). x needs no
 * alignment; xw 4-byte aligned. */
static inline void mf_widen_row(const int8_t *x, int32_t K, int16_t *xw) {
    const int32_t k = K & ~3, r = K & 3;
    mf_widen_groups(x, K >> 2, xw);
    if (r > 0) {
        xw[k] = x[k];
        xw[k + 1] = (int16_t)(r > 2 ? x[k + 2] : 0);
        xw[k + 2] = (int16_t)(r > 1 ? x[k + 1] : 0);
        xw[k + 3] = 0;
    }
}

/* mf_widen_row for the rows of a GEMM call: word-aligned rows by LDM (in the im2col loop its
 * 8 clobbered registers cost more than it saves) */
static inline void mf_widen_row_a(const int8_t *x, int32_t K, int16_t *xw) {
    int32_t done = 0;
#if MF_GEMM_ASM
    if (K >= 16 && ((uintptr_t)x & 3) == 0) { /* 13 instructions per 16 bytes: LDM, 8 SXTB16,
                                                * 2 STM (activation rows are word-aligned) */
        const int8_t *xs = x;
        mf_word *d = (mf_word *)(void *)xw;
        int32_t n16 = K >> 4;
        __asm__ volatile("1:\n\t"
                         "ldmia %[x]!, {r8, r9, r10, r11}\n\t"
                         "sxtb16 r0, r8\n\t"
                         "sxtb16 r1, r8, ror #8\n\t"
                         "sxtb16 r2, r9\n\t"
                         "sxtb16 r3, r9, ror #8\n\t"
                         "stmia %[d]!, {r0, r1, r2, r3}\n\t"
                         "sxtb16 r0, r10\n\t"
                         "sxtb16 r1, r10, ror #8\n\t"
                         "sxtb16 r2, r11\n\t"
                         "sxtb16 r3, r11, ror #8\n\t"
                         "stmia %[d]!, {r0, r1, r2, r3}\n\t"
                         "subs %[n], %[n], #1\n\t"
                         "bne 1b\n\t"
                         : [x] "+r"(xs), [d] "+r"(d), [n] "+r"(n16)
                         :
                         : "r0", "r1", "r2", "r3", "r8", "r9", "r10", "r11", "cc", "memory");
        done = K & ~15;
    }
#endif
    mf_widen_row(x + done, K - done, xw + done);
}

/* acc[0..3] += the 4 channels of one weight block dotted with xw (G groups). */
MF_INLINE void mf_dot4(const int16_t *xw, const void *wblock, int32_t G, int32_t fmt,
                      int32_t acc[4]) {
#if MF_USE_DSP
    const mf_word *xp = (const mf_word *)(const void *)xw;
    const mf_word *wp = (const mf_word *)wblock;
    int32_t a0 = acc[0], a1 = acc[1], a2 = acc[2], a3 = acc[3];
#if MF_GEMM_ASM
    if (fmt == MF_W16) {
        register int32_t wa __asm__("r8");
        register int32_t wb __asm__("r9");
        register int32_t wc __asm__("r10");
        register int32_t wd __asm__("r11");
        int32_t x0, x1, n = G;
#define MF_G16                                                                             \
    "ldrd %[x0], %[x1], [%[xp]], #8\n\t"                                                   \
    "ldmia %[wp]!, {r8, r9, r10, r11}\n\t"                                                 \
    "smlad %[a0], %[x0], r8, %[a0]\n\t"                                                    \
    "smlad %[a0], %[x1], r9, %[a0]\n\t"                                                    \
    "smlad %[a1], %[x0], r10, %[a1]\n\t"                                                   \
    "smlad %[a1], %[x1], r11, %[a1]\n\t"                                                   \
    "ldmia %[wp]!, {r8, r9, r10, r11}\n\t"                                                 \
    "smlad %[a2], %[x0], r8, %[a2]\n\t"                                                    \
    "smlad %[a2], %[x1], r9, %[a2]\n\t"                                                    \
    "smlad %[a3], %[x0], r10, %[a3]\n\t"                                                   \
    "smlad %[a3], %[x1], r11, %[a3]\n\t"
        /* G = 4q + r: peel r's low bit, then its high bit (flags of LSRS survive the
         * groups), then q iterations of 4 groups */
        __asm__("lsrs %[n], %[n], #1\n\t"
                "bcc 1f\n\t" MF_G16 "1:\n\t"
                "lsrs %[n], %[n], #1\n\t"
                "bcc 2f\n\t" MF_G16 MF_G16 "2:\n\t"
                "beq 3f\n"
                "4:\n\t" MF_G16 MF_G16 MF_G16 MF_G16 "subs %[n], %[n], #1\n\t"
                "bne 4b\n"
                "3:\n"
                : [a0] "+r"(a0), [a1] "+r"(a1), [a2] "+r"(a2), [a3] "+r"(a3), [xp] "+r"(xp),
                  [wp] "+r"(wp), [n] "+r"(n), [x0] "=&r"(x0), [x1] "=&r"(x1), "=&r"(wa),
                  "=&r"(wb), "=&r"(wc), "=&r"(wd)
                :
                : "cc", "memory");
#undef MF_G16
    } else
#endif
    {
        int32_t g;
        for (g = 0; g < G; ++g) {
            int32_t x0 = xp[0], x1 = xp[1];
            xp += 2;
            if (fmt == MF_W16) {
                a0 = __smlad(x0, wp[0], a0);
                a0 = __smlad(x1, wp[1], a0);
                a1 = __smlad(x0, wp[2], a1);
                a1 = __smlad(x1, wp[3], a1);
                a2 = __smlad(x0, wp[4], a2);
                a2 = __smlad(x1, wp[5], a2);
                a3 = __smlad(x0, wp[6], a3);
                a3 = __smlad(x1, wp[7], a3);
                wp += 8;
            } else {
                int32_t w0 = wp[0], w1 = wp[1], w2 = wp[2], w3 = wp[3];
                a0 = __smlad(x0, (int32_t)__sxtb16(w0), a0);
                a0 = __smlad(x1, mf_sxtb16_ror8(w0), a0);
                a1 = __smlad(x0, (int32_t)__sxtb16(w1), a1);
                a1 = __smlad(x1, mf_sxtb16_ror8(w1), a1);
                a2 = __smlad(x0, (int32_t)__sxtb16(w2), a2);
                a2 = __smlad(x1, mf_sxtb16_ror8(w2), a2);
                a3 = __smlad(x0, (int32_t)__sxtb16(w3), a3);
                a3 = __smlad(x1, mf_sxtb16_ror8(w3), a3);
                wp += 4;
            }
        }
    }
    acc[0] = a0;
    acc[1] = a1;
    acc[2] = a2;
    acc[3] = a3;
#else
    /* each group's 4 activations loaded once for the 4 channels, accumulators in registers */
    int32_t g, a0 = acc[0], a1 = acc[1], a2 = acc[2], a3 = acc[3];
    for (g = 0; g < G; ++g, xw += 4) {
        const int32_t x0 = xw[0], x1 = xw[1], x2 = xw[2], x3 = xw[3];
        if (fmt == MF_W16) { /* lanes (w0, w2, w1, w3), like the activations */
            const int16_t *w = (const int16_t *)wblock + g * 16;
            a0 += x0 * w[0] + x1 * w[1] + x2 * w[2] + x3 * w[3];
            a1 += x0 * w[4] + x1 * w[5] + x2 * w[6] + x3 * w[7];
            a2 += x0 * w[8] + x1 * w[9] + x2 * w[10] + x3 * w[11];
            a3 += x0 * w[12] + x1 * w[13] + x2 * w[14] + x3 * w[15];
        } else { /* natural tap order: activation lane 1 holds tap 2, lane 2 tap 1 */
            const int8_t *w = (const int8_t *)wblock + g * 16;
            a0 += x0 * w[0] + x1 * w[2] + x2 * w[1] + x3 * w[3];
            a1 += x0 * w[4] + x1 * w[6] + x2 * w[5] + x3 * w[7];
            a2 += x0 * w[8] + x1 * w[10] + x2 * w[9] + x3 * w[11];
            a3 += x0 * w[12] + x1 * w[14] + x2 * w[13] + x3 * w[15];
        }
    }
    acc[0] = a0;
    acc[1] = a1;
    acc[2] = a2;
    acc[3] = a3;
#endif
}

/* Requantize and clamp one accumulator. mode (a constant after inlining): bit 0 the sign
 * term (signfix), bit 1 set when [lo, hi] is the whole int8 range (one SSAT; the usual case:
 * TFLite's fused ReLU/ReLU6 give the output zero point -128 and no clamp left inside int8),
 * bit 2 (with bit 0; signfix 2) the sign term taken from the accumulator instead of h:
 *   v = (h + add + (acc >> 31)) >> post
 * which folds into SMMLAR's addend (add + (acc >> 31), before the multiply). Equal to the sign
 * term of h: acc >= 0 gives h >= 0; acc < 0 gives h <= 0, and where h = 0 both give zp as
 * (2^(post-1) - 1 + (zp << post)) >> post = zp for post >= 1. So signfix 2 needs post >= 1 in
 * every channel whose accumulator can be negative (pack: signfix_mode). */
#define MF_MODE_SF 1
#define MF_MODE_SAT 2
#define MF_MODE_SFA 4
MF_INLINE int8_t mf_rq_clamp(int32_t acc, const mf_rq *q, int32_t mode, int32_t lo,
                                 int32_t hi) {
    int32_t mult, add, pre, post, h, v;
    MF_LDM4(q, mult, add, pre, post); /* then mf_rq_apply(acc, q, mode & MF_MODE_SF) */
    h = mf_smmlar((int32_t)((uint32_t)acc << pre), mult);
    v = h + add;
    if (mode & MF_MODE_SFA) {
        v += acc >> 31;
    } else if ((mode & MF_MODE_SF) && post) {
        v += h >> 31;
    }
    v >>= post;
    if (mode & MF_MODE_SAT) {
#if MF_USE_DSP
        v = __ssat(v, 8);
#else
        v = v < -128 ? -128 : v;
        v = v > 127 ? 127 : v;
#endif
    } else {
        v = v < lo ? lo : v;
        v = v > hi ? hi : v;
    }
    return (int8_t)v;
}

/* The mode constant of a call: the general clamp keeps the sign term of h (always exact). */
#define MF_DISPATCH(BODY)                                                                   \
    do {                                                                                    \
        if (lo == -128 && hi == 127) {                                                      \
            if ((signfix & 3) == 2) {                                                       \
                BODY(MF_MODE_SF | MF_MODE_SFA | MF_MODE_SAT);                               \
            } else if (signfix & 3) {                                                       \
                BODY(MF_MODE_SF | MF_MODE_SAT);                                             \
            } else {                                                                        \
                BODY(MF_MODE_SAT);                                                          \
            }                                                                               \
        } else {                                                                            \
            BODY(MF_MODE_SF);                                                               \
        }                                                                                   \
    } while (0)

static inline void mf_gemm_row(const int16_t *xw, int32_t G, const void *w, int32_t fmt,
                               const int32_t *bias, const mf_rq *rq, int32_t O, int32_t lo,
                               int32_t hi, int32_t mode, int8_t *y);

#if MF_GEMM_ASM
/* The full 4-channel blocks of one row in one asm routine (DSP, optimised builds, clamp = the
 * int8 range): gcc 12 spills around a K-loop asm block that takes 13 registers, so the block
 * loop, the bias LDM and the requantization are written here too, the loop state in memory
 * operands. Registers: r0-r3 accumulators, r4/r5 activation words, r6 activation pointer (rq
 * pointer in the epilogue), r8-r11 weight words (mult, add, pre, post in the epilogue), r12
 * weight pointer, lr the group count; r7 (the Thumb frame pointer) is left alone. */
#define MF_A_G16                                                                            \
    "ldrd r4, r5, [r6], #8\n\t"                                                             \
    "ldmia r12!, {r8, r9, r10, r11}\n\t"                                                    \
    "smlad r0, r4, r8, r0\n\t"                                                              \
    "smlad r0, r5, r9, r0\n\t"                                                              \
    "smlad r1, r4, r10, r1\n\t"                                                             \
    "smlad r1, r5, r11, r1\n\t"                                                             \
    "ldmia r12!, {r8, r9, r10, r11}\n\t"                                                    \
    "smlad r2, r4, r8, r2\n\t"                                                              \
    "smlad r2, r5, r9, r2\n\t"                                                              \
    "smlad r3, r4, r10, r3\n\t"                                                             \
    "smlad r3, r5, r11, r3\n\t"
#define MF_A_G8_2(A, B)                                                                     \
    "ldrd r8, r9, [r12], #8\n\t"                                                            \
    "sxtb16 r10, r8\n\t"                                                                    \
    "sxtb16 r11, r8, ror #8\n\t"                                                            \
    "smlad " A ", r4, r10, " A "\n\t"                                                       \
    "smlad " A ", r5, r11, " A "\n\t"                                                       \
    "sxtb16 r10, r9\n\t"                                                                    \
    "sxtb16 r11, r9, ror #8\n\t"                                                            \
    "smlad " B ", r4, r10, " B "\n\t"                                                       \
    "smlad " B ", r5, r11, " B "\n\t"
#define MF_A_G8 "ldrd r4, r5, [r6], #8\n\t" MF_A_G8_2("r0", "r1") MF_A_G8_2("r2", "r3")
/* G = 4q + r groups: r's low bit, its high bit (LSRS flags survive the groups), q x 4 */
#define MF_A_KLOOP(GR)                                                                      \
    "lsrs lr, lr, #1\n\t"                                                                   \
    "bcc 5f\n\t" GR "5:\n\t"                                                                \
    "lsrs lr, lr, #1\n\t"                                                                   \
    "bcc 6f\n\t" GR GR "6:\n\t"                                                             \
    "beq 7f\n"                                                                              \
    "8:\n\t" GR GR GR GR "subs lr, lr, #1\n\t"                                               \
    "bne 8b\n"                                                                              \
    "7:\n\t"
/* y = ssat8((h + add [+ (h >> 31) if post]) >> post), h = SMMULR(acc << pre, mult) */
#define MF_A_SF(A) "cmp r11, #0\n\tit ne\n\taddne r9, r9, " A ", asr #31\n\t"
/* the clamp: SSAT for the int8 range, else [lo, hi] held in r5 / lr during the epilogue */
#define MF_A_SAT(A) "ssat " A ", #8, " A "\n\t"
#define MF_A_CLAMP(A)                                                                       \
    "cmp " A ", r5\n\tit lt\n\tmovlt " A ", r5\n\t"                                           \
    "cmp " A ", lr\n\tit gt\n\tmovgt " A ", lr\n\t"
/* (h + add) >> post from acc << pre in A (mult, add, post in r8, r9, r11): without the sign
 * term SMMLAR adds `add` in the high multiply itself (add * 2^32 + p + 2^31, high word: exact);
 * with it, h is needed alone */
#define MF_A_H(A) "smmlar " A ", " A ", r8, r9\n\tasr " A ", " A ", r11\n\t"
#define MF_A_HSF(A)                                                                         \
    "smmulr " A ", " A ", r8\n\tadd r9, r9, " A "\n\t" MF_A_SF(A) "asr " A ", r9, r11\n\t"
/* signfix 2: the sign of acc << pre into the addend, then as without the sign term */
#define MF_A_HSFA(A) "add r9, r9, " A ", asr #31\n\t" MF_A_H(A)
#define MF_A_RQ(A, H, CL)                                                                   \
    "ldmia r6!, {r8, r9, r10, r11}\n\t"                                                     \
    "lsl " A ", " A ", r10\n\t" H CL "strb " A ", [r4], #1\n\t"
/* the same when every pre is 0 (MF_W16Z: 2^pre folded into the weights) */
#define MF_A_RQZ(A, H, CL) "ldmia r6!, {r8, r9, r10, r11}\n\t" H CL "strb " A ", [r4], #1\n\t"
#define MF_A_ROW(GR, H0, H1, H2, H3, LDCL, CL0, CL1, CL2, CL3)                               \
    MF_A_ROW_RQ(MF_A_RQ, GR, H0, H1, H2, H3, LDCL, CL0, CL1, CL2, CL3)
#define MF_A_ROWZ(GR, H0, H1, H2, H3, LDCL, CL0, CL1, CL2, CL3)                              \
    MF_A_ROW_RQ(MF_A_RQZ, GR, H0, H1, H2, H3, LDCL, CL0, CL1, CL2, CL3)
#define MF_A_ROW_RQ(RQ, GR, H0, H1, H2, H3, LDCL, CL0, CL1, CL2, CL3)                        \
    "ldr r12, %[wp]\n"                                                                      \
    "9:\n\t"                                                                                \
    "ldr r6, %[xw]\n\t"                                                                     \
    "ldr r8, %[bias]\n\t"                                                                   \
    "ldmia r8!, {r0, r1, r2, r3}\n\t"                                                       \
    "str r8, %[bias]\n\t"                                                                   \
    "ldr lr, %[G]\n\t" MF_A_KLOOP(GR) "ldr r6, %[rq]\n\t"                                   \
    "ldr r4, %[y]\n\t" LDCL RQ("r0", H0, CL0) RQ("r1", H1, CL1) RQ("r2", H2, CL2)            \
        RQ("r3", H3, CL3) "str r6, %[rq]\n\t"                                                 \
    "str r4, %[y]\n\t"                                                                      \
    "ldr lr, %[nb]\n\t"                                                                     \
    "subs lr, lr, #1\n\t"                                                                   \
    "str lr, %[nb]\n\t"                                                                     \
    "bne 9b\n\t"                                                                            \
    "str r12, %[wp]\n\t"
#define MF_A_OPS                                                                            \
    : [bias] "+m"(bias), [rq] "+m"(rq), [y] "+m"(y), [wp] "+m"(wp), [nb] "+m"(nb)           \
    : [xw] "m"(xw), [G] "m"(G), [lo] "m"(lo), [hi] "m"(hi)                                  \
    : "r0", "r1", "r2", "r3", "r4", "r5", "r6", "r8", "r9", "r10", "r11", "r12", "lr", "cc", \
      "memory"

#define MF_A_SF4 MF_A_HSF("r0"), MF_A_HSF("r1"), MF_A_HSF("r2"), MF_A_HSF("r3")
#define MF_A_NOSF4 MF_A_H("r0"), MF_A_H("r1"), MF_A_H("r2"), MF_A_H("r3")
#define MF_A_SFA4 MF_A_HSFA("r0"), MF_A_HSFA("r1"), MF_A_HSFA("r2"), MF_A_HSFA("r3")
#define MF_A_SAT4 "", MF_A_SAT("r0"), MF_A_SAT("r1"), MF_A_SAT("r2"), MF_A_SAT("r3")
#define MF_A_CLAMP4                                                                         \
    "ldr r5, %[lo]\n\tldr lr, %[hi]\n\t", MF_A_CLAMP("r0"), MF_A_CLAMP("r1"), MF_A_CLAMP("r2"), \
        MF_A_CLAMP("r3")
#define MF_A_ROW_X(...) MF_A_ROW(__VA_ARGS__) /* expands the 4-tuples into 4 arguments */
#define MF_A_ROWZ_X(...) MF_A_ROWZ(__VA_ARGS__)
#define MF_A_MODES(GR)                                                                      \
    if (mode == (MF_MODE_SF | MF_MODE_SFA | MF_MODE_SAT)) {                                 \
        __asm__ volatile(MF_A_ROW_X(GR, MF_A_SFA4, MF_A_SAT4) MF_A_OPS);                      \
    } else if (mode == (MF_MODE_SF | MF_MODE_SAT)) {                                        \
        __asm__ volatile(MF_A_ROW_X(GR, MF_A_SF4, MF_A_SAT4) MF_A_OPS);                       \
    } else if (mode == MF_MODE_SAT) {                                                       \
        __asm__ volatile(MF_A_ROW_X(GR, MF_A_NOSF4, MF_A_SAT4) MF_A_OPS);                    \
    } else {                                                                                \
        __asm__ volatile(MF_A_ROW_X(GR, MF_A_SF4, MF_A_CLAMP4) MF_A_OPS);                     \
    }

/* nb >= 1 full blocks; advances *pbias, *prq, *py, *pw past them. mode: see mf_rq_clamp (the
 * general clamp always with the sign term). */
MF_INLINE void mf_gemm_blocks_asm(const int16_t *xw, int32_t G, int32_t nb, int32_t fmt,
                                  int32_t mode, int32_t lo, int32_t hi, const int8_t **pw,
                                  const int32_t **pbias, const mf_rq **prq, int8_t **py) {
    const int8_t *wp = *pw;
    const int32_t *bias = *pbias;
    const mf_rq *rq = *prq;
    int8_t *y = *py;
    if (fmt == MF_W16Z && mode == (MF_MODE_SF | MF_MODE_SFA | MF_MODE_SAT)) {
        __asm__ volatile(MF_A_ROWZ_X(MF_A_G16, MF_A_SFA4, MF_A_SAT4) MF_A_OPS);
    } else if (fmt == MF_W16Z && mode == MF_MODE_SAT) {
        __asm__ volatile(MF_A_ROWZ_X(MF_A_G16, MF_A_NOSF4, MF_A_SAT4) MF_A_OPS);
    } else if (fmt != MF_W8) {
        MF_A_MODES(MF_A_G16)
    } else {
        MF_A_MODES(MF_A_G8)
    }
    *pw = wp;
    *pbias = bias;
    *prq = rq;
    *py = y;
}

/* The full blocks of one row when G is known at compile time (the mf_*_w16_g<G> entries, w16
 * weights, clamp = the int8 range, rq[].pre = 0: MF_PRE0): the K loop is unrolled, which frees
 * two registers: lr holds the bias pointer, r6 the widened row for the whole row (rewound after
 * each block), so a block costs 9 instructions besides its K loop and requantization (the
 * loop above: ~18); the requantization has no LSL (2^pre is in the weights and bias) and no
 * ADD (in SMMLAR's addend): 5 instructions an output. Registers as above; r4 / r5 the mf_rq
 * and y pointers in the epilogue. */
#define MF_K_RQ(A, H)                                                                       \
    "ldmia r4!, {r8, r9, r10, r11}\n\t" H "ssat " A ", #8, " A "\n\t"                      \
    "strb " A ", [r5], #1\n\t"
#define MF_K_ROW(H0, H1, H2, H3)                                                            \
    "ldr r12, %[wp]\n\t"                                                                    \
    "ldr lr, %[bias]\n\t"                                                                   \
    "ldr r6, %[xw]\n"                                                                        \
    "9:\n\t"                                                                                \
    "ldmia lr!, {r0, r1, r2, r3}\n\t"                                                       \
    ".rept %c[G]\n\t" MF_A_G16 ".endr\n\t"                                                 \
    "sub r6, r6, %[G8]\n\t"                                                                 \
    "ldr r4, %[rq]\n\t"                                                                     \
    "ldr r5, %[y]\n\t" MF_K_RQ("r0", H0) MF_K_RQ("r1", H1) MF_K_RQ("r2", H2)                 \
        MF_K_RQ("r3", H3) "str r4, %[rq]\n\t"                                                \
    "str r5, %[y]\n\t"                                                                      \
    "ldr r4, %[wend]\n\t"                                                                   \
    "cmp r12, r4\n\t"                                                                       \
    "bne 9b\n\t"                                                                            \
    "str lr, %[bias]\n\t"                                                                   \
    "str r12, %[wp]\n\t"
#define MF_K_ROW_X(...) MF_K_ROW(__VA_ARGS__)
#define MF_K_OPS                                                                            \
    : [bias] "+m"(bias), [rq] "+m"(rq), [y] "+m"(y), [wp] "+m"(wp)                          \
    : [xw] "m"(xw), [wend] "m"(wend), [G] "i"(G), [G8] "i"(8 * G)                           \
    : "r0", "r1", "r2", "r3", "r4", "r5", "r6", "r8", "r9", "r10", "r11", "r12", "lr", "cc", \
      "memory"

/* All O outputs of one widened row (G groups, G a constant after inlining), clamp = the int8
 * range, every rq[].pre 0; sf: the signfix argument less MF_PRE0 (0 or 2 here; 1 takes the
 * general row). */
MF_INLINE void mf_gemm_row_g(const int16_t *xw, const int32_t G, const int16_t *w,
                             const int32_t *bias, const mf_rq *rq, int32_t O, int32_t sf,
                             int8_t *y) {
    const int16_t *wp = w;
    if (sf == 1) {
        mf_gemm_row(xw, G, w, MF_W16, bias, rq, O, -128, 127, MF_MODE_SF | MF_MODE_SAT, y);
        return;
    }
    if (O >= 4) {
        const int16_t *wend = w + (O >> 2) * G * 16;
        if (sf) {
            __asm__ volatile(MF_K_ROW_X(MF_A_SFA4) MF_K_OPS);
        } else {
            __asm__ volatile(MF_K_ROW_X(MF_A_NOSF4) MF_K_OPS);
        }
    }
    if (O & 3) {
        mf_gemm_row(xw, G, wp, MF_W16, bias, rq, O & 3, -128, 127,
                    sf ? MF_MODE_SF | MF_MODE_SFA | MF_MODE_SAT : MF_MODE_SAT, y);
    }
}
#endif

/* All O outputs of one widened row xw (G groups) into y[0..O-1]. fmt: MF_W16, MF_W8 or
 * MF_W16Z (w16 with every rq[].pre 0: the asm skips the shift). */
static inline void mf_gemm_row(const int16_t *xw, int32_t G, const void *w, int32_t fmtz,
                               const int32_t *bias, const mf_rq *rq, int32_t O, int32_t lo,
                               int32_t hi, int32_t mode, int8_t *y) {
    const int8_t *wb = (const int8_t *)w;
    const int32_t fmt = fmtz == MF_W16Z ? MF_W16 : fmtz;
    const int32_t bstep = G * (fmt == MF_W16 ? 32 : 16); /* bytes per block of 4 channels */
    int32_t n = O, acc[4];
#if MF_GEMM_ASM
    if (n >= 4) {
        mf_gemm_blocks_asm(xw, G, n >> 2, fmtz, mode, lo, hi, &wb, &bias, &rq, &y);
        n &= 3;
    }
#endif
    for (; n >= 4; n -= 4) {
        MF_LDM4(bias, acc[0], acc[1], acc[2], acc[3]);
        mf_dot4(xw, wb, G, fmt, acc);
        y[0] = mf_rq_clamp(acc[0], &rq[0], mode, lo, hi);
        y[1] = mf_rq_clamp(acc[1], &rq[1], mode, lo, hi);
        y[2] = mf_rq_clamp(acc[2], &rq[2], mode, lo, hi);
        y[3] = mf_rq_clamp(acc[3], &rq[3], mode, lo, hi);
        bias += 4;
        rq += 4;
        y += 4;
        wb += bstep;
    }
    if (n > 0) { /* last 1..3 channels: the block's zero rows are computed, not stored */
        acc[0] = bias[0];
        acc[1] = n > 1 ? bias[1] : 0;
        acc[2] = n > 2 ? bias[2] : 0;
        acc[3] = 0;
        mf_dot4(xw, wb, G, fmt, acc);
        y[0] = mf_rq_clamp(acc[0], &rq[0], mode, lo, hi);
        if (n > 1) {
            y[1] = mf_rq_clamp(acc[1], &rq[1], mode, lo, hi);
        }
        if (n > 2) {
            y[2] = mf_rq_clamp(acc[2], &rq[2], mode, lo, hi);
        }
    }
}

static inline void mf_gemm_body(const int8_t *x, int32_t rows, int32_t x_stride, int32_t K,
                                const void *w, int32_t fmt, const int32_t *bias,
                                const mf_rq *rq, int32_t O, int32_t lo, int32_t hi,
                                int32_t mode, int8_t *y, int32_t y_stride,
                                int16_t *scratch) {
    const int32_t G = MF_KPAD(K) >> 2;
    int32_t r;
    for (r = 0; r < rows; ++r) {
        mf_widen_row_a(x + r * x_stride, K, scratch);
        mf_gemm_row(scratch, G, w, fmt, bias, rq, O, lo, hi, mode, y + r * y_stride);
    }
}

/* mf_gemm_w16 / mf_gemm_w8: y = requant(x . w^T) for `rows` rows: a 1x1 stride-1 convolution
 * over H*W pixels (rows = H*W, x_stride = K = C_in, y_stride = O), a fully connected layer over
 * B rows, or rows the caller built (a strided 1x1 convolution may pass x_stride = C_in per
 * pixel row and call once per output row).
 *   x        int8 rows x K, row r at x + r * x_stride; any alignment; x_stride >= K
 *   rows     >= 0; K >= 1 taps per output; O >= 1 output channels
 *   w        packed weights (layout above), 4-byte aligned: mf_gemm_w16 int16_t[Op * Kp],
 *            mf_gemm_w8 int8_t[Op * Kp] (Op = O rounded up to 4) = pack.pack_gemm_weights(
 *            w[O][K], "w16" / "w8")
 *   bias     int32_t[O], input zero point folded in (pack.fold_bias)
 *   rq       mf_rq[O] (pack.requant_params; its int32 exactness proof must hold)
 *   lo, hi   the output clamp, -128 <= lo <= hi <= 127 (lo = -128, hi = 127 is fastest)
 *   signfix  pack.needs_signfix(y_zp, lo) (0 or 1; 1 is always exact) or 2 where
 *            pack.signfix_mode allows it (the sign term from the accumulator, see mf_rq_clamp),
 *            plus MF_PRE0 (4) when every rq[].pre is 0 (pack.fold_pre; used by the _g<G> entries)
 *   y        int8 outputs, row r at y + r * y_stride, y_stride >= O (gaps untouched)
 *   scratch  pack.gemm_scratch_bytes(K) bytes (int16_t[Kp]), 4-byte aligned
 *   x, y and scratch must not overlap. */
MF_MICRO void mf_gemm_w16(const int8_t *x, int32_t rows, int32_t x_stride, int32_t K,
                          const int16_t *w, const int32_t *bias, const mf_rq *rq, int32_t O,
                          int32_t lo, int32_t hi, int32_t signfix, int8_t *y,
                          int32_t y_stride, int16_t *scratch) {
#define MF_BODY(mode)                                                                       \
    mf_gemm_body(x, rows, x_stride, K, w, signfix & 4 ? MF_W16Z : MF_W16, bias, rq, O, lo, hi, \
                 mode, y, y_stride, scratch)
    MF_DISPATCH(MF_BODY);
#undef MF_BODY
}

MF_MICRO void mf_gemm_w8(const int8_t *x, int32_t rows, int32_t x_stride, int32_t K,
                         const int8_t *w, const int32_t *bias, const mf_rq *rq, int32_t O,
                         int32_t lo, int32_t hi, int32_t signfix, int8_t *y, int32_t y_stride,
                         int16_t *scratch) {
#define MF_BODY(mode)                                                                       \
    mf_gemm_body(x, rows, x_stride, K, w, MF_W8, bias, rq, O, lo, hi, mode, y, y_stride, scratch)
    MF_DISPATCH(MF_BODY);
#undef MF_BODY
}

/* ---- im2col convolution --------------------------------------------------------------------
 * Geometry of one NHWC int8 convolution, batch 1, dilation 1; pad_t/pad_l are the top/left
 * padding (SAME or VALID as TFLM computes it); out_h/out_w the output size. */
typedef struct {
    int32_t in_h, in_w, in_c;
    int32_t k_h, k_w, stride_h, stride_w;
    int32_t pad_t, pad_l;
    int32_t out_h, out_w;
} mf_conv_geom;

/* Byte copy / fill for the im2col patch: words where possible (unaligned LDR/STR are fine on
 * v7-M; the portable build goes through memcpy, which compilers turn into the same). The empty
 * asm hides the loops from gcc's pattern matching, which would call newlib-nano's byte-wise
 * memcpy / memset instead. */
#if defined(__GNUC__)
#define MF_OPAQUE(v) __asm__("" : "+r"(v))
#else
#define MF_OPAQUE(v) (void)0
#endif
static inline void mf_copy8(int8_t *d, const int8_t *s, int32_t n) {
    for (; n >= 4; n -= 4, d += 4, s += 4) {
        int32_t t;
        memcpy(&t, s, 4);
        MF_OPAQUE(t);
        memcpy(d, &t, 4);
    }
    for (; n > 0; --n) {
        int32_t t = *s++;
        MF_OPAQUE(t);
        *d++ = (int8_t)t;
    }
}

static inline void mf_fill8(int8_t *d, int32_t v, int32_t n) {
    uint32_t t = 0x01010101u * (uint8_t)v;
    for (; n >= 4; n -= 4, d += 4) {
        MF_OPAQUE(t);
        memcpy(d, &t, 4);
    }
    for (; n > 0; --n) {
        MF_OPAQUE(t);
        *d++ = (int8_t)t;
    }
}

/* im2col through a row cache: for each output row, the k_h input rows it reads are copied
 * once, padded with x_zp to the width the windows span (wpad = (out_w - 1) * stride_w + k_w),
 * into rows[k_h][wpad * in_c]; every window is then inside the cache. Its k_h row pieces are
 * widened straight into xw when a kernel row is a whole number of groups (k_w * in_c % 4 == 0),
 * else gathered as int8 into patch[Kp] (word copies) and widened once. The cache costs about
 * k_h * wpad * in_c byte copies per output row, a small part of the widening. */
typedef void (*mf_row_fn)(const int16_t *xw, const int16_t *w, const int32_t *bias,
                          const mf_rq *rq, int32_t O, int32_t sf, int8_t *y);

/* rowg: the G-specialised row of a mf_conv_w16_g<G> entry (clamp = the int8 range), or 0 */
static inline void mf_conv_body(const int8_t *x, const mf_conv_geom *g, int32_t x_zp,
                                const void *w, int32_t fmt, const int32_t *bias,
                                const mf_rq *rq, int32_t O, int32_t lo, int32_t hi,
                                int32_t mode, int8_t *y, int16_t *scratch, mf_row_fn rowg) {
    const int32_t c = g->in_c, seg = g->k_w * c, K = g->k_h * seg, Kp = MF_KPAD(K);
    const int32_t G = Kp >> 2, wpad = (g->out_w - 1) * g->stride_w + g->k_w;
    const int32_t rowb = wpad * c, left = g->pad_l * c;
    const int32_t ncopy = (g->in_w < wpad - g->pad_l ? g->in_w : wpad - g->pad_l) * c;
    int8_t *patch = (int8_t *)(scratch + Kp);
    int8_t *rows = patch + Kp;
    int32_t oy, ox, ky;
    for (oy = 0; oy < g->out_h; ++oy) {
        const int32_t iy0 = oy * g->stride_h - g->pad_t;
        for (ky = 0; ky < g->k_h; ++ky) {
            const int32_t iy = iy0 + ky;
            int8_t *r = rows + ky * rowb;
            if (iy >= 0 && iy < g->in_h) {
                mf_fill8(r, x_zp, left);
                mf_copy8(r + left, x + iy * g->in_w * c, ncopy);
                mf_fill8(r + left + ncopy, x_zp, rowb - left - ncopy);
            } else {
                mf_fill8(r, x_zp, rowb);
            }
        }
        for (ox = 0; ox < g->out_w; ++ox) {
            const int8_t *win = rows + ox * g->stride_w * c;
            if ((seg & 3) == 0) {
                for (ky = 0; ky < g->k_h; ++ky) {
                    mf_widen_groups(win + ky * rowb, seg >> 2, scratch + ky * seg);
                }
            } else {
                for (ky = 0; ky < g->k_h; ++ky) {
                    mf_copy8(patch + ky * seg, win + ky * rowb, seg);
                }
                mf_widen_row(patch, K, scratch);
            }
            if (rowg && (mode & MF_MODE_SAT)) {
                rowg(scratch, (const int16_t *)w, bias, rq, O,
                     mode & MF_MODE_SFA ? 2 : mode & MF_MODE_SF, y);
            } else {
                mf_gemm_row(scratch, G, w, fmt, bias, rq, O, lo, hi, mode, y);
            }
            y += O;
        }
    }
}

/* mf_conv_w16 / mf_conv_w8: a KxK int8 convolution (any stride, SAME/VALID padding, dilation
 * 1), NHWC, batch 1 (call per batch), by im2col + the GEMM above.
 *   x       int8 [in_h][in_w][in_c], any alignment; g: the geometry (pad_t/pad_l as TFLM
 *           computes them; the bottom/right padding follows from out_h/out_w)
 *   x_zp    the input zero point: padding taps read it, so with the folded bias they add 0
 *   w       pack.pack_gemm_weights(w[O][k_h][k_w][in_c] reshaped to [O, K], "w16" / "w8"),
 *           K = k_h * k_w * in_c (TFLM's OHWI order), 4-byte aligned
 *   bias, rq, O, lo, hi, signfix: as mf_gemm_w16
 *   y       int8 [out_h][out_w][O], must not overlap x
 *   scratch pack.conv_scratch_bytes(...) bytes, 4-byte aligned: int16_t[Kp] widened patch,
 *           int8_t[Kp] patch, int8_t[k_h][((out_w - 1) * stride_w + k_w) * in_c] row cache */
MF_MICRO void mf_conv_w16(const int8_t *x, const mf_conv_geom *g, int32_t x_zp,
                          const int16_t *w, const int32_t *bias, const mf_rq *rq, int32_t O,
                          int32_t lo, int32_t hi, int32_t signfix, int8_t *y,
                          int16_t *scratch) {
#define MF_BODY(mode)                                                                       \
    mf_conv_body(x, g, x_zp, w, signfix & 4 ? MF_W16Z : MF_W16, bias, rq, O, lo, hi, mode, y,   \
                 scratch, 0)
    MF_DISPATCH(MF_BODY);
#undef MF_BODY
}

MF_MICRO void mf_conv_w8(const int8_t *x, const mf_conv_geom *g, int32_t x_zp,
                         const int8_t *w, const int32_t *bias, const mf_rq *rq, int32_t O,
                         int32_t lo, int32_t hi, int32_t signfix, int8_t *y,
                         int16_t *scratch) {
#define MF_BODY(mode) mf_conv_body(x, g, x_zp, w, MF_W8, bias, rq, O, lo, hi, mode, y, scratch, 0)
    MF_DISPATCH(MF_BODY);
#undef MF_BODY
}

/* mf_conv_lean_w16 / mf_conv_lean_w8: mf_conv_*'s convolution without the row cache, for a
 * --memory-priority band where the RAM matters more than the instructions: each patch is
 * gathered straight from x (its rows' pieces copied, taps past the image's edges x_zp), then
 * widened and multiplied as in mf_conv_body (the same patch values, the same arithmetic).
 * Same arguments as mf_conv_*; scratch pack.conv_lean_scratch_bytes(K) = int16_t[Kp] widened
 * patch, int8_t[Kp] patch. */
static inline void mf_conv_lean_body(const int8_t *x, const mf_conv_geom *g, int32_t x_zp,
                                     const void *w, int32_t fmt, const int32_t *bias,
                                     const mf_rq *rq, int32_t O, int32_t lo, int32_t hi,
                                     int32_t mode, int8_t *y, int16_t *scratch) {
    const int32_t c = g->in_c, seg = g->k_w * c, K = g->k_h * seg, Kp = MF_KPAD(K);
    int8_t *patch = (int8_t *)(scratch + Kp);
    int32_t oy, ox, ky, kx;
    for (oy = 0; oy < g->out_h; ++oy) {
        const int32_t iy0 = oy * g->stride_h - g->pad_t;
        for (ox = 0; ox < g->out_w; ++ox) {
            const int32_t ix0 = ox * g->stride_w - g->pad_l;
            const int32_t inside = ix0 >= 0 && ix0 + g->k_w <= g->in_w;
            for (ky = 0; ky < g->k_h; ++ky) {
                const int32_t iy = iy0 + ky;
                int8_t *d = patch + ky * seg;
                if (iy < 0 || iy >= g->in_h) {
                    mf_fill8(d, x_zp, seg);
                } else if (inside) {
                    mf_copy8(d, x + (iy * g->in_w + ix0) * c, seg);
                } else {
                    for (kx = 0; kx < g->k_w; ++kx) {
                        const int32_t ix = ix0 + kx;
                        if (ix < 0 || ix >= g->in_w) {
                            mf_fill8(d + kx * c, x_zp, c);
                        } else {
                            mf_copy8(d + kx * c, x + (iy * g->in_w + ix) * c, c);
                        }
                    }
                }
            }
            mf_widen_row(patch, K, scratch);
            mf_gemm_row(scratch, Kp >> 2, w, fmt, bias, rq, O, lo, hi, mode, y);
            y += O;
        }
    }
}

MF_MICRO void mf_conv_lean_w16(const int8_t *x, const mf_conv_geom *g, int32_t x_zp,
                               const int16_t *w, const int32_t *bias, const mf_rq *rq,
                               int32_t O, int32_t lo, int32_t hi, int32_t signfix, int8_t *y,
                               int16_t *scratch) {
#define MF_BODY(mode)                                                                       \
    mf_conv_lean_body(x, g, x_zp, w, signfix & 4 ? MF_W16Z : MF_W16, bias, rq, O, lo, hi, mode, \
                      y, scratch)
    MF_DISPATCH(MF_BODY);
#undef MF_BODY
}

MF_MICRO void mf_conv_lean_w8(const int8_t *x, const mf_conv_geom *g, int32_t x_zp,
                              const int8_t *w, const int32_t *bias, const mf_rq *rq, int32_t O,
                              int32_t lo, int32_t hi, int32_t signfix, int8_t *y,
                              int16_t *scratch) {
#define MF_BODY(mode) mf_conv_lean_body(x, g, x_zp, w, MF_W8, bias, rq, O, lo, hi, mode, y, scratch)
    MF_DISPATCH(MF_BODY);
#undef MF_BODY
}

/* ---- im2col-free convolution: the patch read straight from widened rows ----------------------
 * mf_convp_w16 / mf_convp_w8 (and mf_convp_w16_g<G>): the convolution of mf_conv_*, with the
 * patch taps in another order so that no patch is gathered or widened per output pixel. For
 * each output row the k_h input rows (padded with x_zp as in mf_conv_body) are widened once
 * into int16 pairs (e_2p, e_2p+1) of the padded row, stored interleaved over the kernel rows:
 * word p * k_h + ky. A window starting at element s = ox * stride_w * in_c (s even) then covers
 * n * k_h consecutive words from (s / 2) * k_h, n = ceil(k_w * in_c / 2); odd starts (stride_w
 * * in_c odd) read a second copy widened from the row shifted by one element. Those words are
 * the GEMM's activation groups as they are: group g = words 2g, 2g + 1, so its taps (lanes
 * 0, 2 / 1, 3) are the pairs' elements; pack.conv_pair_order gives, per tap of the K' = 4 *
 * ceil(n * k_h / 2) taps, the original tap (ky * k_w + kx) * in_c + ci or none (weight 0:
 * the odd element of a row piece, the last group's word past the patch), and
 * pack.pack_gemm_weights packs the reordered [O, K'] weights as usual.
 * Scratch (pack.convp_scratch_bytes): int32 words [copies][npos * k_h], npos = ceil(wpad * in_c
 * / 2) + 1 (wpad as in mf_conv_body; copies = 2 when stride_w * in_c is odd), then int8
 * [wpad * in_c + 8] for one padded input row. */
#define MF_CONVP_SLACK 8 /* x_zp bytes past a padded row: the last pairs read into them */

/* d[p * kh] = the pair (r[2p], r[2p + 1]) as int16 lanes, p < npairs; r any alignment */
static inline void mf_widen_pairs(const int8_t *r, int32_t npairs, int32_t kh, int16_t *d16) {
#if MF_USE_DSP
    mf_word *d = (mf_word *)(void *)d16;
    const int32_t kh2 = 2 * kh;
    for (; npairs >= 2; npairs -= 2, r += 4, d += kh2) {
        int32_t v, a, b, lo, hi;
        memcpy(&v, r, 4);
        a = (int32_t)__sxtb16(v);   /* (r0, r2) */
        b = mf_sxtb16_ror8(v);      /* (r1, r3) */
#if defined(__GNUC__)
        __asm__("pkhbt %0, %1, %2, lsl #16" : "=r"(lo) : "r"(a), "r"(b)); /* (r0, r1) */
        __asm__("pkhtb %0, %1, %2, asr #16" : "=r"(hi) : "r"(b), "r"(a)); /* (r2, r3) */
#else
        lo = (int32_t)(((uint32_t)a & 0xFFFFu) | ((uint32_t)b << 16));
        hi = (int32_t)(((uint32_t)b & 0xFFFF0000u) | (((uint32_t)a >> 16) & 0xFFFFu));
#endif
        d[0] = lo;
        d[kh] = hi;
    }
    if (npairs) {
        int16_t *e = (int16_t *)(void *)d;
        e[0] = r[0];
        e[1] = r[1];
    }
#else
    int32_t p;
    for (p = 0; p < npairs; ++p) {
        d16[2 * p * kh] = r[2 * p];
        d16[2 * p * kh + 1] = r[2 * p + 1];
    }
#endif
}

/* in_c % 4 == 0 ("quads"): every window starts on a group of 4 elements, so the rows are
 * widened as whole groups in the GEMM's own lane order (SXTB16, no PKH), interleaved over the
 * kernel rows per group: group q of row ky at words (q * k_h + ky) * 2, 2 + 1; a window's
 * patch is the k_w * in_c / 4 * k_h groups from (s / 4) * k_h, taps in the order (q, ky, 4)
 * (pack.conv_pair_order) with no padding taps. d[(q * kh) * 2 + 0, 1] = group q of r. */
static inline void mf_widen_quads(const int8_t *r, int32_t ngroups, int32_t kh, int16_t *d16) {
#if MF_USE_DSP
    mf_word *d = (mf_word *)(void *)d16;
    const int32_t st = 2 * kh;
    for (; ngroups >= 2; ngroups -= 2, r += 8, d += 2 * st) {
        int32_t v, u;
        memcpy(&v, r, 4);
        memcpy(&u, r + 4, 4);
        d[0] = (int32_t)__sxtb16(v);
        d[1] = mf_sxtb16_ror8(v);
        d[st] = (int32_t)__sxtb16(u);
        d[st + 1] = mf_sxtb16_ror8(u);
    }
    if (ngroups) {
        int32_t v;
        memcpy(&v, r, 4);
        d[0] = (int32_t)__sxtb16(v);
        d[1] = mf_sxtb16_ror8(v);
    }
#else
    int32_t q;
    for (q = 0; q < ngroups; ++q, r += 4, d16 += 4 * kh) {
        d16[0] = r[0];
        d16[1] = r[2];
        d16[2] = r[1];
        d16[3] = r[3];
    }
#endif
}

/* The K-groups of mf_convp_*'s patch: k_h * k_w * in_c / 4 for in_c % 4 == 0, else
 * ceil(n * k_h / 2) with n = ceil(k_w * in_c / 2) pair words per kernel row */
static inline int32_t mf_convp_groups(const mf_conv_geom *g) {
    if ((g->in_c & 3) == 0) {
        return (g->k_h * g->k_w * g->in_c) >> 2;
    }
    return (((g->k_w * g->in_c + 1) >> 1) * g->k_h + 1) >> 1;
}

static inline void mf_convp_body(const int8_t *x, const mf_conv_geom *g, int32_t x_zp,
                                 const void *w, int32_t fmt, const int32_t *bias,
                                 const mf_rq *rq, int32_t O, int32_t lo, int32_t hi,
                                 int32_t mode, int8_t *y, int16_t *scratch, mf_row_fn rowg) {
    const int32_t c = g->in_c, kh = g->k_h, quad = (c & 3) == 0;
    const int32_t G = mf_convp_groups(g), wpad = (g->out_w - 1) * g->stride_w + g->k_w;
    const int32_t rowb = wpad * c, left = g->pad_l * c, npos = ((rowb + 1) >> 1) + 1;
    const int32_t ncopy = (g->in_w < wpad - g->pad_l ? g->in_w : wpad - g->pad_l) * c;
    const int32_t two = (g->stride_w * c) & 1, step = g->stride_w * c;
    /* int16 elements of one copy: pairs (npos words per kernel row) or quads (rowb) */
    const int32_t celems = quad ? rowb * kh : 2 * npos * kh;
    int16_t *cache_a = scratch, *cache_b = scratch + celems;
    int8_t *row = (int8_t *)(cache_a + celems * (1 + two));
    int32_t oy, ox, ky;
    for (oy = 0; oy < g->out_h; ++oy) {
        const int32_t iy0 = oy * g->stride_h - g->pad_t;
        for (ky = 0; ky < kh; ++ky) {
            const int32_t iy = iy0 + ky;
            if (iy >= 0 && iy < g->in_h) {
                mf_fill8(row, x_zp, left);
                mf_copy8(row + left, x + iy * g->in_w * c, ncopy);
                mf_fill8(row + left + ncopy, x_zp, rowb + MF_CONVP_SLACK - left - ncopy);
            } else {
                mf_fill8(row, x_zp, rowb + MF_CONVP_SLACK);
            }
            if (quad) {
                mf_widen_quads(row, rowb >> 2, kh, cache_a + 4 * ky);
                continue;
            }
            mf_widen_pairs(row, npos, kh, cache_a + 2 * ky);
            if (two) {
                mf_widen_pairs(row + 1, npos, kh, cache_b + 2 * ky);
            }
        }
        for (ox = 0; ox < g->out_w; ++ox) {
            const int32_t s = ox * step;
            const int16_t *xw = quad      ? cache_a + (s >> 2) * 4 * kh
                                : (s & 1) ? cache_b + (s >> 1) * 2 * kh
                                          : cache_a + (s >> 1) * 2 * kh;
            if (rowg && (mode & MF_MODE_SAT)) {
                rowg(xw, (const int16_t *)w, bias, rq, O, mode & MF_MODE_SFA ? 2 : mode & MF_MODE_SF,
                     y);
            } else {
                mf_gemm_row(xw, G, w, fmt, bias, rq, O, lo, hi, mode, y);
            }
            y += O;
        }
    }
}

MF_MICRO void mf_convp_w16(const int8_t *x, const mf_conv_geom *g, int32_t x_zp,
                           const int16_t *w, const int32_t *bias, const mf_rq *rq, int32_t O,
                           int32_t lo, int32_t hi, int32_t signfix, int8_t *y,
                           int16_t *scratch) {
#define MF_BODY(mode)                                                                       \
    mf_convp_body(x, g, x_zp, w, signfix & 4 ? MF_W16Z : MF_W16, bias, rq, O, lo, hi, mode, y,  \
                  scratch, 0)
    MF_DISPATCH(MF_BODY);
#undef MF_BODY
}

MF_MICRO void mf_convp_w8(const int8_t *x, const mf_conv_geom *g, int32_t x_zp,
                          const int8_t *w, const int32_t *bias, const mf_rq *rq, int32_t O,
                          int32_t lo, int32_t hi, int32_t signfix, int8_t *y,
                          int16_t *scratch) {
#define MF_BODY(mode) mf_convp_body(x, g, x_zp, w, MF_W8, bias, rq, O, lo, hi, mode, y, scratch, 0)
    MF_DISPATCH(MF_BODY);
#undef MF_BODY
}

/* ---- entries specialised on K at compile time ------------------------------------------------
 * mf_gemm_w16_g<G> / mf_conv_w16_g<G> / mf_convp_w16_g<G>, G = 1..16: the same arguments and
 * results as mf_gemm_w16 / mf_conv_w16 / mf_convp_w16 (w16 weights). When MF_KPAD(K) == 4 * G
 * (K' for convp), the clamp is the int8 range and signfix has MF_PRE0 set (every rq[].pre is
 * 0: pack.fold_pre put 2^pre into the weights and bias) the DSP build runs each row's full
 * channel blocks with the K loop unrolled (mf_gemm_row_g), else the general entry's code.
 * The schedule picks G = MF_KPAD(K) / 4.
 * Instructions per MAC on mps2-an386, -O2 (tests/nn_bench): see tests/nn_bench/README.md. */
#define MF_PRE0 4 /* signfix flag: rq[].pre = 0 in every channel (the w16 asm skips the shift) */
#if MF_GEMM_ASM
#define MF_GEMM_G(G)                                                                        \
    static __attribute__((unused, noinline)) void mf_row_g##G(                              \
        const int16_t *xw, const int16_t *w, const int32_t *bias, const mf_rq *rq, int32_t O, \
        int32_t sf, int8_t *y) {                                                            \
        mf_gemm_row_g(xw, G, w, bias, rq, O, sf & 3, y);                                    \
    }                                                                                       \
    MF_MICRO void mf_gemm_w16_g##G(const int8_t *x, int32_t rows, int32_t x_stride, int32_t K, \
                                   const int16_t *w, const int32_t *bias, const mf_rq *rq,   \
                                   int32_t O, int32_t lo, int32_t hi, int32_t signfix,       \
                                   int8_t *y, int32_t y_stride, int16_t *scratch) {          \
        int32_t r;                                                                          \
        if (MF_KPAD(K) != 4 * (G) || lo != -128 || hi != 127 || !(signfix & MF_PRE0)) {     \
            mf_gemm_w16(x, rows, x_stride, K, w, bias, rq, O, lo, hi, signfix, y, y_stride,  \
                        scratch);                                                           \
            return;                                                                         \
        }                                                                                   \
        for (r = 0; r < rows; ++r) {                                                        \
            mf_widen_row_a(x + r * x_stride, K, scratch);                                   \
            mf_gemm_row_g(scratch, G, w, bias, rq, O, signfix & 3, y + r * y_stride);       \
        }                                                                                   \
    }                                                                                       \
    MF_MICRO void mf_conv_w16_g##G(const int8_t *x, const mf_conv_geom *g, int32_t x_zp,    \
                                   const int16_t *w, const int32_t *bias, const mf_rq *rq,   \
                                   int32_t O, int32_t lo, int32_t hi, int32_t signfix,       \
                                   int8_t *y, int16_t *scratch) {                            \
        const mf_row_fn rowg = MF_KPAD(g->k_h * g->k_w * g->in_c) == 4 * (G) &&            \
                                       (signfix & MF_PRE0) ? mf_row_g##G : (mf_row_fn)0;    \
        MF_DISPATCH(MF_CONV_G_BODY);                                                        \
    }                                                                                       \
    MF_MICRO void mf_convp_w16_g##G(const int8_t *x, const mf_conv_geom *g, int32_t x_zp,   \
                                    const int16_t *w, const int32_t *bias, const mf_rq *rq,  \
                                    int32_t O, int32_t lo, int32_t hi, int32_t signfix,      \
                                    int8_t *y, int16_t *scratch) {                           \
        const mf_row_fn rowg =                                                              \
            mf_convp_groups(g) == (G) && (signfix & MF_PRE0) ? mf_row_g##G : (mf_row_fn)0;  \
        MF_DISPATCH(MF_CONVP_G_BODY);                                                       \
    }
#define MF_CONV_G_BODY(mode)                                                                \
    mf_conv_body(x, g, x_zp, w, signfix & 4 ? MF_W16Z : MF_W16, bias, rq, O, lo, hi, mode, y,   \
                 scratch, rowg)
#define MF_CONVP_G_BODY(mode)                                                               \
    mf_convp_body(x, g, x_zp, w, signfix & 4 ? MF_W16Z : MF_W16, bias, rq, O, lo, hi, mode, y,  \
                  scratch, rowg)
#else
#define MF_GEMM_G(G)                                                                        \
    MF_MICRO void mf_gemm_w16_g##G(const int8_t *x, int32_t rows, int32_t x_stride, int32_t K, \
                                   const int16_t *w, const int32_t *bias, const mf_rq *rq,   \
                                   int32_t O, int32_t lo, int32_t hi, int32_t signfix,       \
                                   int8_t *y, int32_t y_stride, int16_t *scratch) {          \
        mf_gemm_w16(x, rows, x_stride, K, w, bias, rq, O, lo, hi, signfix, y, y_stride,      \
                    scratch);                                                               \
    }                                                                                       \
    MF_MICRO void mf_conv_w16_g##G(const int8_t *x, const mf_conv_geom *g, int32_t x_zp,    \
                                   const int16_t *w, const int32_t *bias, const mf_rq *rq,   \
                                   int32_t O, int32_t lo, int32_t hi, int32_t signfix,       \
                                   int8_t *y, int16_t *scratch) {                            \
        mf_conv_w16(x, g, x_zp, w, bias, rq, O, lo, hi, signfix, y, scratch);               \
    }                                                                                       \
    MF_MICRO void mf_convp_w16_g##G(const int8_t *x, const mf_conv_geom *g, int32_t x_zp,   \
                                    const int16_t *w, const int32_t *bias, const mf_rq *rq,  \
                                    int32_t O, int32_t lo, int32_t hi, int32_t signfix,      \
                                    int8_t *y, int16_t *scratch) {                           \
        mf_convp_w16(x, g, x_zp, w, bias, rq, O, lo, hi, signfix, y, scratch);              \
    }
#endif
MF_GEMM_G(1)
MF_GEMM_G(2)
MF_GEMM_G(3)
MF_GEMM_G(4)
MF_GEMM_G(5)
MF_GEMM_G(6)
MF_GEMM_G(7)
MF_GEMM_G(8)
MF_GEMM_G(9)
MF_GEMM_G(10)
MF_GEMM_G(11)
MF_GEMM_G(12)
MF_GEMM_G(13)
MF_GEMM_G(14)
MF_GEMM_G(15)
MF_GEMM_G(16)
#undef MF_GEMM_G

/* ---- 2 channels x 2 rows: mf_gemm2_w16 ---------------------------------------------------------
 * The GEMM of mf_gemm_w16 (1x1 convolutions, strided ones by rows, fully connected layers over
 * 2+ rows) for O even, the clamp the int8 range and every mf_rq.pre 0 (pack.fold_pre), with a
 * 2-channel x 2-row register block: per group of 4 taps one LDM of the two rows' 4 activation
 * words, one LDM of the two channels' 4 weight words and 8 SMLAD: 10 instructions per 16 MACs
 * (mf_gemm_w16: 11), and one LDM of the requantization constants serves both rows.
 * Stream (pack.pack_gemm2, int32 words; bias and mf_rq live in it, so one pointer walks them):
 * per channel pair p (channels 2p, 2p + 1), 10 + 4G words:
 *   [b0, b1, b0, b1]  the folded bias (times 2^pre), twice: one LDM fills the 4 accumulators
 *   per group g < G: [ (w0, w2), (w1, w3) of channel 2p, the same of 2p + 1 ], each word two
 *                    int16 lanes (lane 0 = low half), taps K..Kp-1 zero
 *   [mult0, add0, post0, mult1, add1, post1]  mf_rq of the two channels less pre
 * Scratch (pack.gemm2_scratch_bytes): int16 [2 * Kp], the two rows widened and interleaved
 * per group: words 4g, 4g + 1 row r's group g (lane order of mf_widen_row), 4g + 2, 4g + 3
 * row r + 1's. An odd last row runs alone (MF_P_ROW1 in the asm; the C bodies compute it
 * twice into the same outputs, row stride 0).
 * The asm (optimised DSP builds) takes all 14 registers r0-r12, lr in the K loop, r7 included:
 * it pushes r7 (gcc's Thumb frame pointer at -O0 or with -fno-omit-frame-pointer) with its
 * control words (56 bytes of stack), reads no memory operand after the push, pops them. It
 * runs the row pairs' loop too, widening each pair itself when K % 8 == 0 on word-aligned
 * rows (else mf_widen2 in C, one call per pair). Per pair of channels and rows: the K loop
 * (16 copies of a group entered by TBH; G > 16: 3 instructions per pass to test the end)
 * plus 24 instructions: control LDRD (sp), bias LDM, TBH, rq LDM, SMMLAR + ASR + SSAT per
 * output (+1 ADD per output for the sign term from the accumulator, signfix 2), control LDM,
 * 4 STRB, STR, CMP, BNE. Measured on mps2-an386
 * (tests/nn_bench/gemm2_bench.py, -O2, clamp = int8 range; -Os within 1 %), MACs per
 * instruction against mf_gemm_w16[_g<G>]: VWW's 1x1 16->32 x 576 rows 0.96 (0.79), 32->32
 * 1.18 (1.01), 64->64 x 144 1.36 (1.21), 128->128 x 36 1.45 (1.24), 256->256 x 9 1.46
 * (1.32); KWS's 64->64 x 125 1.36 (1.21). */
#define MF_GEMM2_WORDS(G) (10 + 4 * (G)) /* int32 words of one channel pair's record */

/* the two rows' groups interleaved: xw words 4g, 4g + 1 from x0, 4g + 2, 4g + 3 from x1 */
static inline void mf_widen2(const int8_t *x0, const int8_t *x1, int32_t K, int16_t *xw) {
    int32_t n = K >> 2, g = 0;
#if MF_USE_DSP
    mf_word *d = (mf_word *)(void *)xw;
#if MF_GEMM_ASM
    if (n >= 2 && (((uintptr_t)x0 | (uintptr_t)x1) & 3) == 0) { /* word-aligned rows: two
        * LDRD, 8 SXTB16, 2 STM per 2 groups of both rows (7 instructions a group) */
        const int8_t *a = x0, *b = x1;
        int32_t m = n >> 1;
        __asm__ volatile("1:\n\t"
                         "ldrd r8, r9, [%[a]], #8\n\t"
                         "ldrd r10, r11, [%[b]], #8\n\t"
                         "sxtb16 r0, r8\n\t"
                         "sxtb16 r1, r8, ror #8\n\t"
                         "sxtb16 r2, r10\n\t"
                         "sxtb16 r3, r10, ror #8\n\t"
                         "stmia %[d]!, {r0, r1, r2, r3}\n\t"
                         "sxtb16 r0, r9\n\t"
                         "sxtb16 r1, r9, ror #8\n\t"
                         "sxtb16 r2, r11\n\t"
                         "sxtb16 r3, r11, ror #8\n\t"
                         "stmia %[d]!, {r0, r1, r2, r3}\n\t"
                         "subs %[m], %[m], #1\n\t"
                         "bne 1b\n\t"
                         : [a] "+r"(a), [b] "+r"(b), [d] "+r"(d), [m] "+r"(m)
                         :
                         : "r0", "r1", "r2", "r3", "r8", "r9", "r10", "r11", "cc", "memory");
        g = n & ~1;
    }
#endif
#if MF_GEMM_ASM && defined(__ARM_FEATURE_UNALIGNED)
    if (g < n) { /* 9 instructions per group of both rows */
        const int8_t *a = x0 + 4 * g, *b = x1 + 4 * g;
        int32_t m = n - g;
        __asm__ volatile("1:\n\t"
                         "ldr r8, [%[a]], #4\n\t"
                         "ldr r9, [%[b]], #4\n\t"
                         "sxtb16 r0, r8\n\t"
                         "sxtb16 r1, r8, ror #8\n\t"
                         "sxtb16 r2, r9\n\t"
                         "sxtb16 r3, r9, ror #8\n\t"
                         "stmia %[d]!, {r0, r1, r2, r3}\n\t"
                         "subs %[m], %[m], #1\n\t"
                         "bne 1b\n\t"
                         : [a] "+r"(a), [b] "+r"(b), [d] "+r"(d), [m] "+r"(m)
                         :
                         : "r0", "r1", "r2", "r3", "r8", "r9", "cc", "memory");
        g = n;
    }
#endif
    for (; g < n; ++g, d += 4) {
        int32_t v, u;
        memcpy(&v, x0 + 4 * g, 4);
        memcpy(&u, x1 + 4 * g, 4);
        d[0] = (int32_t)__sxtb16(v);
        d[1] = mf_sxtb16_ror8(v);
        d[2] = (int32_t)__sxtb16(u);
        d[3] = mf_sxtb16_ror8(u);
    }
#else
    for (; g < n; ++g) {
        mf_widen_row(x0 + 4 * g, 4, xw + 8 * g);
        mf_widen_row(x1 + 4 * g, 4, xw + 8 * g + 4);
    }
#endif
    if (K & 3) { /* the last group, zero-padded */
        mf_widen_row(x0 + 4 * n, K & 3, xw + 8 * n);
        mf_widen_row(x1 + 4 * n, K & 3, xw + 8 * n + 4);
    }
}

/* y = ssat8((SMMLAR(acc, mult) + add [+ sign term]) >> post); sf as mf_gemm_w16's signfix & 3 */
MF_INLINE int8_t mf_rq2(int32_t acc, const int32_t *q, int32_t sf) {
    const int32_t h = mf_smmlar(acc, q[0]);
    int32_t v = h + q[1];
    if (sf == 2) {
        v += acc >> 31;
    } else if (sf == 1 && q[2]) {
        v += h >> 31;
    }
    v >>= q[2];
#if MF_USE_DSP
    return (int8_t)__ssat(v, 8);
#else
    return (int8_t)(v < -128 ? -128 : v > 127 ? 127 : v);
#endif
}

/* One row pair in C (portable, intrinsics, and the sign term of h, sf 1, under the asm) */
static inline void mf_gemm2_rows_c(const int16_t *xw, int32_t G, const int32_t *w, int32_t O,
                                   int32_t sf, int8_t *y0, int8_t *y1) {
    int32_t p, g;
    for (p = 0; p < O; p += 2, w += MF_GEMM2_WORDS(G)) {
        int32_t a0 = w[0], a1 = w[1], a2 = w[0], a3 = w[1];
        const int32_t *wg = w + 4;
#if MF_USE_DSP
        const mf_word *xp = (const mf_word *)(const void *)xw;
        for (g = 0; g < G; ++g, xp += 4, wg += 4) {
            a0 = __smlad(xp[0], wg[0], a0);
            a0 = __smlad(xp[1], wg[1], a0);
            a1 = __smlad(xp[0], wg[2], a1);
            a1 = __smlad(xp[1], wg[3], a1);
            a2 = __smlad(xp[2], wg[0], a2);
            a2 = __smlad(xp[3], wg[1], a2);
            a3 = __smlad(xp[2], wg[2], a3);
            a3 = __smlad(xp[3], wg[3], a3);
        }
#else
        const int16_t *xp = xw;
        for (g = 0; g < G; ++g, xp += 8, wg += 4) {
            int32_t j;
            for (j = 0; j < 4; ++j) { /* lane j: word j / 2, half j % 2 */
                const int32_t wa = wg[j >> 1], wb = wg[2 + (j >> 1)];
                const int32_t c0 = (j & 1) ? wa >> 16 : (int32_t)(int16_t)(uint16_t)wa;
                const int32_t c1 = (j & 1) ? wb >> 16 : (int32_t)(int16_t)(uint16_t)wb;
                a0 += xp[j] * c0;
                a1 += xp[j] * c1;
                a2 += xp[4 + j] * c0;
                a3 += xp[4 + j] * c1;
            }
        }
#endif
        /* row 1 first: an odd last row has y1 = y0 (the same values) */
        y1[p] = mf_rq2(a2, wg, sf);
        y1[p + 1] = mf_rq2(a3, wg + 3, sf);
        y0[p] = mf_rq2(a0, wg, sf);
        y0[p + 1] = mf_rq2(a1, wg + 3, sf);
    }
}

#if MF_GEMM_ASM
#define MF_P_G                                                                              \
    "ldmia r12!, {r4, r5, r6, r7}\n\t"                                                      \
    "ldmia lr!, {r8, r9, r10, r11}\n\t"                                                     \
    "smlad r0, r4, r8, r0\n\t"                                                              \
    "smlad r0, r5, r9, r0\n\t"                                                              \
    "smlad r1, r4, r10, r1\n\t"                                                             \
    "smlad r1, r5, r11, r1\n\t"                                                             \
    "smlad r2, r6, r8, r2\n\t"                                                              \
    "smlad r2, r7, r9, r2\n\t"                                                              \
    "smlad r3, r6, r10, r3\n\t"                                                             \
    "smlad r3, r7, r11, r3\n\t"
/* the accumulator A of a channel with mult, add, post in M, D, P */
#define MF_P_RQ(A, M, D, P)                                                                 \
    "smmlar " A ", " A ", " M ", " D "\n\tasr " A ", " A ", " P "\n\tssat " A ", #8, " A "\n\t"
#define MF_P_RQS(A, M, D, P)                                                                \
    "add r10, " D ", " A ", asr #31\n\t"                                                    \
    "smmlar " A ", " A ", " M ", r10\n\tasr " A ", " A ", " P "\n\tssat " A ", #8, " A "\n\t"
/* The K loop: 16 copies of a group, entered by TBH at copy (16 - G % 16) % 16; G <= 16 makes
 * one pass (KEND ""), G > 16 passes until r12 reaches xend (KEND MF_P_KEND: 3 instructions
 * a pass) */
#define MF_P_KEND "ldr r4, [sp, #20]\n\tcmp r12, r4\n\tbne 60b\n\t"
#define MF_P_K16(KEND)                                                                      \
    "tbh [pc, r4, lsl #1]\n"                                                                \
    "70:\n\t"                                                                               \
    ".hword (60f - 70b) / 2, (61f - 70b) / 2, (62f - 70b) / 2, (63f - 70b) / 2\n\t"         \
    ".hword (64f - 70b) / 2, (65f - 70b) / 2, (66f - 70b) / 2, (67f - 70b) / 2\n\t"         \
    ".hword (80f - 70b) / 2, (81f - 70b) / 2, (82f - 70b) / 2, (83f - 70b) / 2\n\t"         \
    ".hword (84f - 70b) / 2, (85f - 70b) / 2, (86f - 70b) / 2, (87f - 70b) / 2\n"           \
    "60:\n\t" MF_P_G "61:\n\t" MF_P_G "62:\n\t" MF_P_G "63:\n\t" MF_P_G                     \
    "64:\n\t" MF_P_G "65:\n\t" MF_P_G "66:\n\t" MF_P_G "67:\n\t" MF_P_G                     \
    "80:\n\t" MF_P_G "81:\n\t" MF_P_G "82:\n\t" MF_P_G "83:\n\t" MF_P_G                     \
    "84:\n\t" MF_P_G "85:\n\t" MF_P_G "86:\n\t" MF_P_G "87:\n\t" MF_P_G KEND
/* All channel pairs of one row pair. The control words go to the stack with r7 (gcc's frame
 * pointer under -fno-omit-frame-pointer: no memory operand is read after the push): [sp] =
 * y, ys, yend, rem (the K loop's entry copy), xw, xend, r6 (padding: sp stays 8-aligned), r7 */
#define MF_P_PUSH                                                                           \
    "ldr r0, %[y]\n\t"                                                                      \
    "ldr r1, %[ys]\n\t"                                                                     \
    "ldr r2, %[yend]\n\t"                                                                   \
    "ldr r3, %[rem]\n\t"                                                                    \
    "ldr r4, %[xw]\n\t"                                                                     \
    "ldr r5, %[xend]\n\t"                                                                   \
    "ldr lr, %[w]\n\t"                                                                      \
    "push {r0, r1, r2, r3, r4, r5, r6, r7}\n"
/* The row pairs' loop: the control words above plus [24] x (the pair's first row), [28] r7,
 * [32] x_stride, [36] nk (G / 2: the asm widens the rows, 2 groups per LDRD pair; 0: the
 * caller did), [40] O, [44] xlast (x past the last pair), [48] w, [52] padding */
#define MF_P_PUSH2                                                                          \
    "ldr r0, %[y]\n\t"                                                                      \
    "ldr r1, %[ys]\n\t"                                                                     \
    "ldr r2, %[yend]\n\t"                                                                   \
    "ldr r3, %[rem]\n\t"                                                                    \
    "ldr r4, %[xw]\n\t"                                                                     \
    "ldr r5, %[xend]\n\t"                                                                   \
    "ldr r6, %[x]\n\t"                                                                      \
    "ldr r8, %[xs]\n\t"                                                                     \
    "ldr r9, %[nk]\n\t"                                                                     \
    "ldr r10, %[o]\n\t"                                                                     \
    "ldr r11, %[xlast]\n\t"                                                                 \
    "ldr r12, %[w]\n\t"                                                                     \
    "push {r0, r1, r2, r3, r4, r5, r6, r7, r8, r9, r10, r11, r12, lr}\n"
#define MF_P_PAIRS(RQ, KLOOP)                                                               \
    MF_P_PUSH2                                                                              \
    "1:\n\t"                                                                                \
    "ldr r2, [sp, #36]\n\t"                                                                 \
    "cbz r2, 3f\n\t"                                                                        \
    "ldr r0, [sp, #24]\n\t"                                                                 \
    "ldr r1, [sp, #32]\n\t"                                                                 \
    "add r1, r0, r1\n\t"                                                                    \
    "ldr r3, [sp, #16]\n"                                                                   \
    "2:\n\t"                                                                                \
    "ldrd r8, r9, [r0], #8\n\t"                                                             \
    "ldrd r10, r11, [r1], #8\n\t"                                                           \
    "sxtb16 r4, r8\n\t"                                                                     \
    "sxtb16 r5, r8, ror #8\n\t"                                                             \
    "sxtb16 r6, r10\n\t"                                                                    \
    "sxtb16 r7, r10, ror #8\n\t"                                                            \
    "stmia r3!, {r4, r5, r6, r7}\n\t"                                                       \
    "sxtb16 r4, r9\n\t"                                                                     \
    "sxtb16 r5, r9, ror #8\n\t"                                                             \
    "sxtb16 r6, r11\n\t"                                                                    \
    "sxtb16 r7, r11, ror #8\n\t"                                                            \
    "stmia r3!, {r4, r5, r6, r7}\n\t"                                                       \
    "subs r2, r2, #1\n\t"                                                                   \
    "bne 2b\n"                                                                              \
    "3:\n\t"                                                                                \
    "ldr lr, [sp, #48]\n"                                                                   \
    "9:\n\t"                                                                                \
    "ldrd r4, r12, [sp, #12]\n\t"                                                           \
    "ldmia lr!, {r0, r1, r2, r3}\n\t" KLOOP                                                 \
    "ldmia lr!, {r4, r5, r6, r7, r8, r9}\n\t"                                               \
    RQ("r0", "r4", "r5", "r6") RQ("r2", "r4", "r5", "r6")                                   \
    RQ("r1", "r7", "r8", "r9") RQ("r3", "r7", "r8", "r9")                                   \
    "ldmia sp, {r4, r5, r6}\n\t"                                                            \
    "strb r2, [r4, r5]\n\t"                                                                 \
    "strb r0, [r4], #1\n\t"                                                                 \
    "strb r3, [r4, r5]\n\t"                                                                 \
    "strb r1, [r4], #1\n\t"                                                                 \
    "str r4, [sp]\n\t"                                                                      \
    "cmp r4, r6\n\t"                                                                        \
    "bne 9b\n\t"                                                                            \
    "add r6, r6, r5, lsl #1\n\t"                                                            \
    "ldr r0, [sp, #40]\n\t"                                                                 \
    "sub r4, r6, r0\n\t"                                                                    \
    "stmia sp, {r4, r5, r6}\n\t"                                                            \
    "ldr r0, [sp, #24]\n\t"                                                                 \
    "ldr r1, [sp, #32]\n\t"                                                                 \
    "add r0, r0, r1, lsl #1\n\t"                                                            \
    "str r0, [sp, #24]\n\t"                                                                 \
    "ldr r1, [sp, #44]\n\t"                                                                 \
    "cmp r0, r1\n\t"                                                                        \
    "bne 1b\n\t"                                                                            \
    "pop {r0, r1, r2, r3, r4, r5, r6, r7, r8, r9, r10, r11, r12, lr}\n\t"
/* An odd last row alone: per group one LDRD of its 2 words (row 1's are skipped), the
 * channel pair's LDM and 4 SMLAD; 8 copies entered by TBB at (8 - G % 8) % 8, the end tested
 * after each pass; the block's 2 outputs stored */
#define MF_P_G1                                                                             \
    "ldrd r4, r5, [r12], #16\n\t"                                                            \
    "ldmia lr!, {r8, r9, r10, r11}\n\t"                                                     \
    "smlad r0, r4, r8, r0\n\t"                                                              \
    "smlad r0, r5, r9, r0\n\t"                                                              \
    "smlad r1, r4, r10, r1\n\t"                                                             \
    "smlad r1, r5, r11, r1\n\t"
#define MF_P_ROW1(RQ)                                                                       \
    MF_P_PUSH                                                                               \
    "9:\n\t"                                                                                \
    "ldrd r4, r12, [sp, #12]\n\t"                                                           \
    "ldmia lr!, {r0, r1, r2, r3}\n\t"                                                       \
    "tbb [pc, r4]\n"                                                                        \
    "70:\n\t"                                                                               \
    ".byte (80f - 70b) / 2, (81f - 70b) / 2, (82f - 70b) / 2, (83f - 70b) / 2\n\t"          \
    ".byte (84f - 70b) / 2, (85f - 70b) / 2, (86f - 70b) / 2, (87f - 70b) / 2\n"            \
    "80:\n\t" MF_P_G1 "81:\n\t" MF_P_G1 "82:\n\t" MF_P_G1 "83:\n\t" MF_P_G1                 \
    "84:\n\t" MF_P_G1 "85:\n\t" MF_P_G1 "86:\n\t" MF_P_G1 "87:\n\t" MF_P_G1                 \
    "ldr r4, [sp, #20]\n\t"                                                                 \
    "cmp r12, r4\n\t"                                                                       \
    "bne 80b\n\t"                                                                           \
    "ldmia lr!, {r4, r5, r6, r7, r8, r9}\n\t"                                               \
    RQ("r0", "r4", "r5", "r6") RQ("r1", "r7", "r8", "r9")                                   \
    "ldmia sp, {r4, r5, r6}\n\t"                                                            \
    "strb r0, [r4], #1\n\t"                                                                 \
    "strb r1, [r4], #1\n\t"                                                                 \
    "str r4, [sp]\n\t"                                                                      \
    "cmp r4, r6\n\t"                                                                        \
    "bne 9b\n\t"                                                                            \
    "pop {r0, r1, r2, r3, r4, r5, r6, r7}\n\t"
#define MF_P_OPS                                                                            \
    : : [w] "m"(w), [y] "m"(y), [ys] "m"(ys), [yend] "m"(yend), [rem] "m"(rem),             \
      [xw] "m"(scratch), [xend] "m"(xend), [x] "m"(x), [xs] "m"(x_stride), [nk] "m"(nk),      \
      [o] "m"(O), [xlast] "m"(xlast)                                                        \
    : "r0", "r1", "r2", "r3", "r4", "r5", "r6", "r8", "r9", "r10", "r11", "r12", "lr", "cc",  \
      "memory"
#endif

static inline void mf_gemm2_body(const int8_t *x, int32_t rows, int32_t x_stride, int32_t K,
                                 const int32_t *w, int32_t O, int32_t sf, int8_t *y,
                                 int32_t y_stride, int16_t *scratch) {
    const int32_t G = MF_KPAD(K) >> 2;
    int32_t r;
#if MF_GEMM_ASM
    if (sf != 1) {
        const int16_t *xend = scratch + 8 * G;
        const int32_t x2 = 2 * x_stride, y2 = 2 * y_stride;
        /* K % 8 == 0 on word-aligned rows: one call, the asm widens every pair itself */
        const int32_t fast = (K & 7) == 0 && (((uintptr_t)x | (uintptr_t)x_stride) & 3) == 0;
        int32_t ys = y_stride, rem = (16 - (G & 15)) & 15; /* the K loop's entry copy */
        int32_t n, nk = fast ? G >> 1 : 0;
        const int8_t *yend, *xlast;
        for (r = rows >> 1; r > 0; r -= n, x = xlast, y += n * y2) {
            n = fast ? r : 1;
            if (!fast) {
                mf_widen2(x, x + x_stride, K, scratch);
            }
            yend = y + O;
            xlast = x + n * x2;
            if (sf && G > 16) {
                __asm__ volatile(MF_P_PAIRS(MF_P_RQS, MF_P_K16(MF_P_KEND)) MF_P_OPS);
            } else if (sf) {
                __asm__ volatile(MF_P_PAIRS(MF_P_RQS, MF_P_K16("")) MF_P_OPS);
            } else if (G > 16) {
                __asm__ volatile(MF_P_PAIRS(MF_P_RQ, MF_P_K16(MF_P_KEND)) MF_P_OPS);
            } else {
                __asm__ volatile(MF_P_PAIRS(MF_P_RQ, MF_P_K16("")) MF_P_OPS);
            }
        }
        if (rows & 1) { /* the last row, alone */
            mf_widen2(x, x, K, scratch);
            yend = y + O;
            xlast = x;
            ys = 0;
            rem = (8 - (G & 7)) & 7;
            if (sf) {
                __asm__ volatile(MF_P_ROW1(MF_P_RQS) MF_P_OPS);
            } else {
                __asm__ volatile(MF_P_ROW1(MF_P_RQ) MF_P_OPS);
            }
        }
        return;
    }
#endif
    for (r = 0; r < rows; r += 2) {
        const int32_t two = r + 1 < rows, ys = two ? y_stride : 0;
        int8_t *y0 = y + r * y_stride;
        mf_widen2(x + r * x_stride, x + (r + two) * x_stride, K, scratch);
        mf_gemm2_rows_c(scratch, G, w, O, sf, y0, y0 + ys);
    }
}

/* mf_gemm2_w16: y = requant(x . w^T) as mf_gemm_w16 computes it, for O even, the clamp the
 * int8 range (lo = -128, hi = 127) and 2^pre folded into weights and bias (every pre 0):
 *   x, rows, x_stride, K, y, y_stride: as mf_gemm_w16 (rows >= 1)
 *   w        pack.pack_gemm2(rows, bias, rq): the weights, bias and mf_rq (less pre) per pair
 *            of channels (stream above), 4-byte aligned
 *   signfix  0, 1 or 2 as mf_gemm_w16 (MF_PRE0 may be set; 1 runs the C body)
 *   scratch  pack.gemm2_scratch_bytes(K) bytes (int16_t[2 * Kp]), 4-byte aligned
 * mf_gemm2_w16_s0 / mf_gemm2_w16_s2: the same for signfix 0 / 2 only (one mode's code) */
MF_MICRO void mf_gemm2_w16_s0(const int8_t *x, int32_t rows, int32_t x_stride, int32_t K,
                              const int32_t *w, int32_t O, int32_t signfix, int8_t *y,
                              int32_t y_stride, int16_t *scratch) {
    (void)signfix;
    mf_gemm2_body(x, rows, x_stride, K, w, O, 0, y, y_stride, scratch);
}

MF_MICRO void mf_gemm2_w16_s2(const int8_t *x, int32_t rows, int32_t x_stride, int32_t K,
                              const int32_t *w, int32_t O, int32_t signfix, int8_t *y,
                              int32_t y_stride, int16_t *scratch) {
    (void)signfix;
    mf_gemm2_body(x, rows, x_stride, K, w, O, 2, y, y_stride, scratch);
}

MF_MICRO void mf_gemm2_w16(const int8_t *x, int32_t rows, int32_t x_stride, int32_t K,
                           const int32_t *w, int32_t O, int32_t signfix, int8_t *y,
                           int32_t y_stride, int16_t *scratch) {
    if ((signfix & 3) == 2) {
        mf_gemm2_w16_s2(x, rows, x_stride, K, w, O, 2, y, y_stride, scratch);
    } else if (signfix & 3) {
        mf_gemm2_body(x, rows, x_stride, K, w, O, 1, y, y_stride, scratch);
    } else {
        mf_gemm2_w16_s0(x, rows, x_stride, K, w, O, 0, y, y_stride, scratch);
    }
}

/* ---- K = 8, one row in registers: mf_gemm1k8_w16 ---------------------------------------------
 * The GEMM of mf_gemm2_w16 for K = 8 taps (VWW's first 1x1 layer), any O and row count: the
 * row's 8 activations are widened straight into 4 registers and every channel is one LDM of
 * its 8-word record [bias, (w0, w2), (w1, w3), (w4, w6), (w5, w7), mult, add, post]
 * (pack.pack_gemm1k8; int16 lanes, lane 0 in the low half) + 4 SMLAD + SMMLAR, ASR, SSAT,
 * STRB: 9 instructions per output of 8 MACs (mf_gemm2_w16: 11), channels unrolled by 8,
 * the row loop in the asm too: VWW's 8 -> 16 over 48 x 48 pixels 0.77 MAC per instruction.
 * Arguments as mf_gemm2_w16 with K = 8 (no scratch); x rows any alignment. */
#define MF_K8_CH(RQ)                                                                        \
    "ldmia lr!, {r0, r1, r2, r3, r8, r9, r10, r11}\n\t"                                     \
    "smlad r0, r4, r1, r0\n\t"                                                              \
    "smlad r0, r5, r2, r0\n\t"                                                              \
    "smlad r0, r6, r3, r0\n\t"                                                              \
    "smlad r0, r7, r8, r0\n\t" RQ                                                           \
    "asr r0, r0, r11\n\t"                                                                   \
    "ssat r0, #8, r0\n\t"                                                                   \
    "strb r0, [r12], #1\n\t"
#define MF_K8_RQ "smmlar r0, r0, r9, r10\n\t"
#define MF_K8_RQS "add r10, r10, r0, asr #31\n\tsmmlar r0, r0, r9, r10\n\t"
/* every row: widen, then the channels (entered at copy (8 - O % 8) % 8 of the 8-channel
 * loop, which ends at the records' end); the row loop's state pushed with r7 (the asm reads
 * no memory operand after the push: r7 may be gcc's frame pointer, sp moved) */
#define MF_K8_ROWS(RQ)                                                                      \
    "ldr r0, %[x]\n\t"                                                                      \
    "ldr r1, %[xs]\n\t"                                                                     \
    "ldr r2, %[xend]\n\t"                                                                   \
    "ldr r3, %[ygap]\n\t"                                                                   \
    "ldr r4, %[w]\n\t"                                                                      \
    "ldr r5, %[rem]\n\t"                                                                    \
    "ldr r6, %[wend]\n\t"                                                                   \
    "ldr r12, %[y]\n\t"                                                                     \
    "push {r0, r1, r2, r3, r4, r5, r6, r7}\n\t"                                             \
    "mov r1, r0\n"                                                                          \
    "1:\n\t"                                                                                \
    "ldr r0, [r1]\n\t"                                                                      \
    "ldr r1, [r1, #4]\n\t"                                                                  \
    "sxtb16 r4, r0\n\t"                                                                     \
    "sxtb16 r5, r0, ror #8\n\t"                                                             \
    "sxtb16 r6, r1\n\t"                                                                     \
    "sxtb16 r7, r1, ror #8\n\t"                                                             \
    "ldr lr, [sp, #16]\n\t"                                                                 \
    "ldr r0, [sp, #20]\n\t"                                                                 \
    "tbb [pc, r0]\n"                                                                        \
    "70:\n\t"                                                                               \
    ".byte (80f - 70b) / 2, (81f - 70b) / 2, (82f - 70b) / 2, (83f - 70b) / 2\n\t"          \
    ".byte (84f - 70b) / 2, (85f - 70b) / 2, (86f - 70b) / 2, (87f - 70b) / 2\n"            \
    "80:\n\t" MF_K8_CH(RQ) "81:\n\t" MF_K8_CH(RQ) "82:\n\t" MF_K8_CH(RQ)                    \
    "83:\n\t" MF_K8_CH(RQ) "84:\n\t" MF_K8_CH(RQ) "85:\n\t" MF_K8_CH(RQ)                    \
    "86:\n\t" MF_K8_CH(RQ) "87:\n\t" MF_K8_CH(RQ)                                          \
    "ldr r1, [sp, #24]\n\t"                                                                 \
    "cmp lr, r1\n\t"                                                                        \
    "bne 80b\n\t"                                                                           \
    "ldr r0, [sp, #12]\n\t"                                                                 \
    "add r12, r12, r0\n\t"                                                                  \
    "ldr r1, [sp]\n\t"                                                                      \
    "ldr r0, [sp, #4]\n\t"                                                                  \
    "add r1, r1, r0\n\t"                                                                    \
    "str r1, [sp]\n\t"                                                                      \
    "ldr r0, [sp, #8]\n\t"                                                                  \
    "cmp r1, r0\n\t"                                                                        \
    "bne 1b\n\t"                                                                            \
    "pop {r0, r1, r2, r3, r4, r5, r6, r7}\n\t"
#define MF_K8_OPS                                                                           \
    : : [x] "m"(x), [w] "m"(w), [y] "m"(y), [wend] "m"(wend), [rem] "m"(rem),               \
      [ygap] "m"(ygap), [xs] "m"(x_stride), [xend] "m"(xend)                                \
    : "r0", "r1", "r2", "r3", "r4", "r5", "r6", "r8", "r9", "r10", "r11", "r12", "lr", "cc",  \
      "memory"

static inline void mf_gemm1k8_body(const int8_t *x, int32_t rows, int32_t x_stride,
                                   const int32_t *w, int32_t O, int32_t sf, int8_t *y,
                                   int32_t y_stride) {
    int32_t r, o;
#if MF_GEMM_ASM && defined(__ARM_FEATURE_UNALIGNED)
    if (sf != 1 && rows > 0) {
        const int32_t *wend = w + 8 * O, rem = (8 - (O & 7)) & 7, ygap = y_stride - O;
        const int8_t *xend = x + rows * x_stride;
        if (sf) {
            __asm__ volatile(MF_K8_ROWS(MF_K8_RQS) MF_K8_OPS);
        } else {
            __asm__ volatile(MF_K8_ROWS(MF_K8_RQ) MF_K8_OPS);
        }
        return;
    }
#endif
    for (r = 0; r < rows; ++r) {
        const int8_t *xr = x + r * x_stride;
        int8_t *yr = y + r * y_stride;
        const int32_t *q = w;
        {
#if MF_USE_DSP
            int32_t v, u, a0, a1, a2, a3;
            memcpy(&v, xr, 4);
            memcpy(&u, xr + 4, 4);
            a0 = (int32_t)__sxtb16(v);
            a1 = mf_sxtb16_ror8(v);
            a2 = (int32_t)__sxtb16(u);
            a3 = mf_sxtb16_ror8(u);
            for (o = 0; o < O; ++o, q += 8) {
                int32_t acc = __smlad(a0, q[1], q[0]);
                acc = __smlad(a1, q[2], acc);
                acc = __smlad(a2, q[3], acc);
                acc = __smlad(a3, q[4], acc);
                yr[o] = mf_rq2(acc, q + 5, sf);
            }
#else
            int16_t xw[8];
            mf_widen_row(xr, 8, xw);
            for (o = 0; o < O; ++o, q += 8) {
                int32_t acc = q[0], j;
                for (j = 0; j < 8; ++j) { /* lane j: word 1 + j / 2, half j % 2 */
                    const int32_t v = q[1 + (j >> 1)];
                    acc += xw[j] * ((j & 1) ? v >> 16 : (int32_t)(int16_t)(uint16_t)v);
                }
                yr[o] = mf_rq2(acc, q + 5, sf);
            }
#endif
        }
    }
}

MF_MICRO void mf_gemm1k8_w16_s0(const int8_t *x, int32_t rows, int32_t x_stride, int32_t K,
                                const int32_t *w, int32_t O, int32_t signfix, int8_t *y,
                                int32_t y_stride, int16_t *scratch) {
    (void)K, (void)signfix, (void)scratch;
    mf_gemm1k8_body(x, rows, x_stride, w, O, 0, y, y_stride);
}

MF_MICRO void mf_gemm1k8_w16_s2(const int8_t *x, int32_t rows, int32_t x_stride, int32_t K,
                                const int32_t *w, int32_t O, int32_t signfix, int8_t *y,
                                int32_t y_stride, int16_t *scratch) {
    (void)K, (void)signfix, (void)scratch;
    mf_gemm1k8_body(x, rows, x_stride, w, O, 2, y, y_stride);
}

MF_MICRO void mf_gemm1k8_w16(const int8_t *x, int32_t rows, int32_t x_stride, int32_t K,
                             const int32_t *w, int32_t O, int32_t signfix, int8_t *y,
                             int32_t y_stride, int16_t *scratch) {
    (void)K, (void)scratch;
    if ((signfix & 3) == 2) {
        mf_gemm1k8_w16_s2(x, rows, x_stride, 8, w, O, 2, y, y_stride, scratch);
    } else if (signfix & 3) {
        mf_gemm1k8_body(x, rows, x_stride, w, O, 1, y, y_stride);
    } else {
        mf_gemm1k8_w16_s0(x, rows, x_stride, 8, w, O, 0, y, y_stride, scratch);
    }
}

/* ==== row-paired convolution: first layers with few input channels (mf_convrp_*) ==========
 * The convolution of mf_conv_* (TFLM int8, input zero point folded into the bias, padding =
 * x_zp) for layers whose kernel row spans few values (k_w * in_c small: RGB or 1-channel
 * inputs), with no im2col and no padding copy: per output row, the k_h input rows it reads are
 * widened once into int16 words laid out so that every output pixel's patch is NW consecutive
 * words, and one asm loop runs the row's pixels x blocks of 4 channels.
 *
 * Layout of the widened row (pack.convrp_order gives the taps of a window's words): kernel rows
 * go in pairs (2j, 2j + 1), j < J = k_h / 2, plus a single row k_h - 1 when k_h is odd (o = 1).
 * Element e of the padded row (e = (ix + pad_l) * in_c + ci, values outside the image x_zp),
 * pairs of elements p = (2p, 2p + 1); pair p is a group of gs = 2J + o words:
 *   P_j(2p), .., S(p), .., P_j(2p + 1)    P_j(e) = (row 2j [e], row 2j+1 [e]),
 *                                         S(p)   = (row k_h-1 [2p], row k_h-1 [2p + 1])
 * (low lane first; the P words of 2p, then S, then the P words of 2p + 1). The window of pixel
 * ox starts at element s = ox * stride_w * in_c, i.e. at word gs * s / 2 when s is even (odd s:
 * in a second copy widened from element 1, mf_convrp2_*), and covers n = ceil(k_w * in_c / 2)
 * groups less the trailing
 * P words of the element past the window when k_w * in_c is odd: NW = gs * n - J (odd) or
 * gs * n words, weight 0 on any tap outside the kernel. VWW's 3x3x3: 14 words (27 taps + 1),
 * against 16 through mf_convp and 28 taps through im2col; KWS's 10x4x1: 20 (40 taps).
 *
 * Packed table (int32 words, pack.pack_convrp), O a multiple of 4, per block of 4 channels:
 *   bias[4] (the input zero point folded in, times 2^pre),
 *   the NW words in chunks of 3 (the last 1-2), per chunk per channel its words, each an int16
 *     pair (low lane, high lane) of weights times 2^pre (pack.fold_pre: mf_rq.pre = 0),
 *   (mult, add, post) of channels 0, 1 (mf_rq less pre), the window adjustment in bytes (-4 NW,
 *   in the last block + the pixel step), the last-block flag (0 or 1), (mult, add, post) of
 *   channels 2, 3.
 * Requantization: y = ssat8((SMMLAR(acc, mult, add [+ (acc >> 31) if signfix 2])) >> post),
 * the int8-range clamp (the schedule takes these kernels only then; signfix 0 or 2).
 * Register block: 4 channels x 1 pixel; a chunk is one LDM of 3 activation words, 3 LDM of 4
 * weight words and 12 SMLAD (a third of a load per SMLAD; a block's bias comes in one LDM with
 * its first 4 weight words); bias, requantization constants and loop control come from the
 * weights' pointer, so the loop keeps 4 accumulators, 7 operands, the output pointer and 2
 * pointers in 14 registers (r7 saved and restored by the asm). For O a multiple of 8 (the _x8
 * entries) blocks go in pairs.
 * Instructions on QEMU mps2-an386 (-O2; -Os within 1-5 %), whole layer in the model: VWW's first
 * (96x96x3 -> 48x48x8, 3x3 s2) 497.5K for 497.7K MACs (1.00 MAC/instr; im2col: 805K): per pixel
 * of 8 channels 192 for MACs and requantization (112 SMLAD, 38 loads with the bias, 36 of
 * requantization, 6 of pointers and loop), 22.5 widening (15 per 4 columns of 3 rows), ~1.5
 * per-row overhead;
 * ResNet-8's first (32x32x3 -> 16, 3x3 s1, two copies) 436K (1.01; mf_convp: 611K); KWS's
 * (49x10x1 -> 25x5x64, 10x4 s2) 269K (1.19; mf_convp: 299K). */

/* Words of a window (NW) and of a pair group (gs) */
static inline int32_t mf_crp_words(const mf_conv_geom *g) {
    const int32_t J = g->k_h >> 1, o = g->k_h & 1, seg = g->k_w * g->in_c;
    return (2 * J + o) * ((seg + 1) >> 1) - ((seg & 1) ? J : 0);
}

/* Element e of a padded row (input row r: len values from element left; r 0: all x_zp) */
static inline int32_t mf_crp_at(const int8_t *r, int32_t e, int32_t left, int32_t len,
                                int32_t zp) {
    e -= left;
    return r && e >= 0 && e < len ? r[e] : zp;
}

/* The pair groups [p0, p1) of the widened row d (int16) from the k_h row pointers, one value
 * at a time (padding and the portable build) */
static inline void mf_crp_groups(int16_t *d, const int8_t *const *rows, int32_t kh, int32_t p0,
                                 int32_t p1, int32_t left, int32_t len, int32_t zp) {
    const int32_t J = kh >> 1, o = kh & 1, gs = 2 * J + o;
    const int16_t z = (int16_t)zp;
    int32_t p, j;
    for (p = p0; p < p1; ++p) {
        int16_t *w = d + 2 * gs * p;
        if (2 * p + 1 < left || 2 * p >= left + len) { /* padding only */
            for (j = 0; j < 2 * gs; ++j) {
                w[j] = z;
            }
            continue;
        }
        for (j = 0; j < gs; ++j) { /* word j: P_j(2p), S(p), P_(j-J-o)(2p + 1) */
            const int32_t s = j == J && o, r = j < J ? 2 * j : s ? kh - 1 : 2 * (j - J - o);
            const int32_t e = j < J || s ? 2 * p : 2 * p + 1;
            w[2 * j] = (int16_t)mf_crp_at(rows[r], e, left, len, zp);
            w[2 * j + 1] = (int16_t)mf_crp_at(rows[s ? r : r + 1], e + s, left, len, zp);
        }
    }
}

#if MF_GEMM_ASM
/* one step of the k_h = 3 widening: 4 elements of rows ra, rb, rc into the 6 words P(e0),
 * S(e0, e1), P(e1), P(e2), S(e2, e3), P(e3) at w (14 instructions) */
#define MF_CRP_W3                                                                           \
    "ldr r4, [%[ra]], #4\n\t"                                                               \
    "ldr r5, [%[rb]], #4\n\t"                                                               \
    "ldr r6, [%[rc]], #4\n\t"                                                               \
    "pkhbt r8, r4, r5, lsl #16\n\t"                                                         \
    "pkhtb r10, r5, r4, asr #16\n\t"                                                        \
    "sxtb16 r4, r8\n\t"                                                                     \
    "sxtb16 r5, r6\n\t"                                                                     \
    "sxtb16 r11, r6, ror #8\n\t"                                                            \
    "sxtb16 r6, r8, ror #8\n\t"                                                             \
    "sxtb16 r8, r10\n\t"                                                                    \
    "sxtb16 r10, r10, ror #8\n\t"                                                           \
    "pkhtb r9, r11, r5, asr #16\n\t"                                                        \
    "pkhbt r5, r5, r11, lsl #16\n\t"                                                        \
    "stmia %[w]!, {r4, r5, r6, r8, r9, r10}\n\t"
#endif

/* Widen output row oy's input rows into d: groups [0, npairs) of the padded row from element
 * `shift` (0, or 1 for the odd windows' copy; the caller fills the groups right of the
 * image). zrow: len bytes of x_zp (rows outside the image). Interior groups (4 elements of
 * every row inside the image) by SXTB16 /
 * PKH on words: P_j(e..e+3) from rows a, b: PKHBT(a, b << 16) = (a0 a1 b0 b1), PKHTB(b, a >> 16)
 * = (a2 a3 b2 b3), whose SXTB16 and SXTB16 ror 8 are (a0, b0), (a1, b1) and (a2, b2), (a3, b3);
 * S from row c: SXTB16 (c0, c2), (c1, c3), PKH to (c0, c1), (c2, c3). */
MF_INLINE void mf_crp_widen(const int8_t *x, const mf_conv_geom *g, int32_t oy, int32_t zp,
                            const int8_t *zrow, int32_t npairs, int16_t *d, int32_t shift) {
    const int32_t kh = g->k_h, len = g->in_w * g->in_c, left = g->pad_l * g->in_c - shift;
    const int8_t *rows[16];
    int32_t ky, p = 0;
    for (ky = 0; ky < kh; ++ky) {
        const int32_t iy = oy * g->stride_h - g->pad_t + ky;
        rows[ky] = iy >= 0 && iy < g->in_h ? x + iy * len : zrow;
    }
#if MF_USE_DSP
    {
        const int32_t J = kh >> 1, o = kh & 1, gs = 2 * J + o;
        int32_t p0 = (left + 1) >> 1, j;
        if (p0 > 0) {
            mf_crp_groups(d, rows, kh, 0, p0, left, len, zp);
        }
        p = p0;
#if MF_GEMM_ASM && defined(__ARM_FEATURE_UNALIGNED)
        if (kh == 3) { /* 15 instructions per 4 elements of 3 rows (P, S, P, P, S, P) */
            int32_t n = (npairs - p0) >> 1, lim = (len + left - 2 * p0) >> 2;
            n = n < lim ? n : lim;
            if (n > 0) {
                const int8_t *ra = rows[0] + 2 * p0 - left, *rb = rows[1] + 2 * p0 - left;
                const int8_t *rc = rows[2] + 2 * p0 - left;
                mf_word *w = (mf_word *)(void *)(d + 6 * p0);
                p = p0 + 2 * n;
                __asm__ volatile("lsrs %[n], %[n], #1\n\t" /* an odd step first, then pairs */
                                 "bcc 1f\n\t" MF_CRP_W3 "1:\n\t"
                                 "beq 3f\n"
                                 "2:\n\t" MF_CRP_W3 MF_CRP_W3 "subs %[n], %[n], #1\n\t"
                                 "bne 2b\n"
                                 "3:\n\t"
                                 : [ra] "+r"(ra), [rb] "+r"(rb), [rc] "+r"(rc), [w] "+r"(w),
                                   [n] "+r"(n)
                                 :
                                 : "r4", "r5", "r6", "r8", "r9", "r10", "r11", "cc", "memory");
            }
        } else
#endif
        for (; p + 1 < npairs && 2 * p + 3 - left < len; p += 2) {
            mf_word *w = (mf_word *)(void *)(d + 2 * gs * p);
            const int32_t e = 2 * p - left;
            for (j = 0; j < J; ++j) {
                int32_t a, b, lo, hi;
                memcpy(&a, rows[2 * j] + e, 4);
                memcpy(&b, rows[2 * j + 1] + e, 4);
#if defined(__GNUC__)
                __asm__("pkhbt %0, %1, %2, lsl #16" : "=r"(lo) : "r"(a), "r"(b));
                __asm__("pkhtb %0, %1, %2, asr #16" : "=r"(hi) : "r"(b), "r"(a));
#else
                lo = (int32_t)(((uint32_t)a & 0xFFFFu) | ((uint32_t)b << 16));
                hi = (int32_t)(((uint32_t)b & 0xFFFF0000u) | (((uint32_t)a >> 16) & 0xFFFFu));
#endif
                w[j] = (int32_t)__sxtb16(lo);
                w[J + o + j] = mf_sxtb16_ror8(lo);
                w[gs + j] = (int32_t)__sxtb16(hi);
                w[gs + J + o + j] = mf_sxtb16_ror8(hi);
            }
            if (o) {
                int32_t c, c02, c13, lo, hi;
                memcpy(&c, rows[kh - 1] + e, 4);
                c02 = (int32_t)__sxtb16(c);
                c13 = mf_sxtb16_ror8(c);
#if defined(__GNUC__)
                __asm__("pkhbt %0, %1, %2, lsl #16" : "=r"(lo) : "r"(c02), "r"(c13));
                __asm__("pkhtb %0, %1, %2, asr #16" : "=r"(hi) : "r"(c13), "r"(c02));
#else
                lo = (int32_t)(((uint32_t)c02 & 0xFFFFu) | ((uint32_t)c13 << 16));
                hi = (int32_t)(((uint32_t)c13 & 0xFFFF0000u) | (((uint32_t)c02 >> 16) & 0xFFFFu));
#endif
                w[J] = lo;
                w[gs + J] = hi;
            }
        }
    }
#endif
    if (p < npairs) {
        mf_crp_groups(d, rows, kh, p, npairs, left, len, zp);
    }
}

/* (x_zp, x_zp) into the int16 pairs [from, to) of d: the groups right of the image, the same in
 * every row, written once a call */
static inline void mf_crp_fill(int16_t *d, int32_t from, int32_t to, int32_t zp) {
    mf_word *w = (mf_word *)(void *)(d + 2 * from);
    const int32_t zz = (int32_t)(((uint32_t)(uint16_t)zp << 16) | (uint16_t)zp);
    for (; from < to; ++from) {
        *w++ = zz;
    }
}

/* npx pixels x nb blocks of one output row, portable C on the packed table (any NW; the
 * table's pointer adjustments are not needed here: windows are stepw words apart, outputs
 * 4 nb + skip bytes). */
static inline void mf_crp_row_c(const int16_t *xw, const int32_t *pk, int32_t nb, int32_t NW,
                                int32_t npx, int32_t stepw, int32_t sfa, int8_t *y,
                                int32_t skip) {
    int32_t px, b, c0, ch, i;
    for (px = 0; px < npx; ++px, xw += 2 * stepw, y += skip) {
        const int32_t *t = pk;
        for (b = 0; b < nb; ++b) {
            int32_t acc[4];
            for (ch = 0; ch < 4; ++ch) {
                acc[ch] = t[ch];
            }
            t += 4;
            for (c0 = 0; c0 < NW; c0 += 3) {
                const int32_t cs = NW - c0 < 3 ? NW - c0 : 3;
                for (ch = 0; ch < 4; ++ch, t += cs) {
                    for (i = 0; i < cs; ++i) {
                        const int16_t *a = xw + 2 * (c0 + i);
                        const int32_t wl = (int16_t)(t[i] & 0xFFFF), wh = (int32_t)(t[i] >> 16);
                        acc[ch] += a[0] * wl + a[1] * wh;
                    }
                }
            }
            for (ch = 0; ch < 4; ++ch) { /* (mult, add, post) at 0, 3, 8, 11 of 14 words */
                const int32_t *r = t + 3 * ch + (ch >> 1) * 2;
                int32_t v = mf_smmlar(acc[ch], r[0]) + r[1] + (sfa ? acc[ch] >> 31 : 0);
                v >>= r[2];
                *y++ = (int8_t)(v < -128 ? -128 : v > 127 ? 127 : v);
            }
            t += 14;
        }
    }
}

#if MF_GEMM_ASM
/* The same in asm for a compile-time NW: r0-r3 accumulators, r4-r6 activation words, r7 the
 * output pointer, r8-r11 weight words, r12 the table, lr the window. Per block of 4 channels:
 * LDM bias, NW / 3 chunks of 16 instructions (LDM of 3 activation words, 3 LDM of 4 weight
 * words, 12 SMLAD) and the tail, 2 LDM + 16 of requantization, 3 of pointer / loop control
 * from the table's control words; per pixel 4 more. */
#define MF_CRP_W "ldmia r12!, {r8, r9, r10, r11}\n\t"
/* a chunk of 3 words (C3) or the tail of 1 or 2 (T1, T2); _F: the block's first chunk, whose
 * first weights came with the bias */
#define MF_CRP_C3_F "ldmia lr!, {r4, r5, r6}\n\t" MF_CRP_C3_REST
#define MF_CRP_C3 "ldmia lr!, {r4, r5, r6}\n\t" MF_CRP_W MF_CRP_C3_REST
#define MF_CRP_C3_REST                                                                      \
    "smlad r0, r4, r8, r0\n\t"                                                              \
    "smlad r0, r5, r9, r0\n\t"                                                              \
    "smlad r0, r6, r10, r0\n\t"                                                             \
    "smlad r1, r4, r11, r1\n\t" MF_CRP_W                                                    \
    "smlad r1, r5, r8, r1\n\t"                                                              \
    "smlad r1, r6, r9, r1\n\t"                                                              \
    "smlad r2, r4, r10, r2\n\t"                                                             \
    "smlad r2, r5, r11, r2\n\t" MF_CRP_W                                                    \
    "smlad r2, r6, r8, r2\n\t"                                                              \
    "smlad r3, r4, r9, r3\n\t"                                                              \
    "smlad r3, r5, r10, r3\n\t"                                                             \
    "smlad r3, r6, r11, r3\n\t"
#define MF_CRP_T1_F "ldr r4, [lr], #4\n\t" MF_CRP_T1_REST
#define MF_CRP_T1 "ldr r4, [lr], #4\n\t" MF_CRP_W MF_CRP_T1_REST
#define MF_CRP_T1_REST                                                                      \
    "smlad r0, r4, r8, r0\n\t"                                                              \
    "smlad r1, r4, r9, r1\n\t"                                                              \
    "smlad r2, r4, r10, r2\n\t"                                                             \
    "smlad r3, r4, r11, r3\n\t"
#define MF_CRP_T2_2(A, B)                                                                   \
    "smlad " A ", r4, r8, " A "\n\t"                                                        \
    "smlad " A ", r5, r9, " A "\n\t"                                                        \
    "smlad " B ", r4, r10, " B "\n\t"                                                       \
    "smlad " B ", r5, r11, " B "\n\t"
#define MF_CRP_T2_F                                                                         \
    "ldrd r4, r5, [lr], #8\n\t" MF_CRP_T2_2("r0", "r1") MF_CRP_W MF_CRP_T2_2("r2", "r3")
#define MF_CRP_T2 "ldrd r4, r5, [lr], #8\n\t" MF_CRP_W MF_CRP_T2_2("r0", "r1") MF_CRP_W       \
    MF_CRP_T2_2("r2", "r3")
/* two outputs: (mult, add, post) of A in r4-r6, of B in r8-r10, then the window adjustment
 * in r11 (RQ2); or the last-block flag in r4, (mult, add, post) of A in r5, r6, r8, of B in
 * r9-r11 (RQ2F: the flag in a low register, for CBNZ) */
#define MF_CRP_RQ2(A, B, SA, SB)                                                            \
    "ldmia r12!, {r4, r5, r6, r8, r9, r10, r11}\n\t" SA SB "smmlar " A ", " A ", r4, r5\n\t" \
    "smmlar " B ", " B ", r8, r9\n\t"                                                       \
    "asr " A ", " A ", r6\n\t"                                                              \
    "asr " B ", " B ", r10\n\t" MF_CRP_ST(A, B)
#define MF_CRP_RQ2F(A, B, SA, SB)                                                           \
    "ldmia r12!, {r4, r5, r6, r8, r9, r10, r11}\n\t" SA SB "smmlar " A ", " A ", r5, r6\n\t" \
    "smmlar " B ", " B ", r9, r10\n\t"                                                      \
    "asr " A ", " A ", r8\n\t"                                                              \
    "asr " B ", " B ", r11\n\t" MF_CRP_ST(A, B)
#define MF_CRP_ST(A, B)                                                                     \
    "ssat " A ", #8, " A "\n\t"                                                             \
    "ssat " B ", #8, " B "\n\t"                                                             \
    "strb " A ", [r7], #1\n\t"                                                              \
    "strb " B ", [r7], #1\n\t"
/* one block of 4 channels: bias, MACs, requantization, the window adjustment (RQB leaves the
 * last-block flag in r4) */
#define MF_CRP_BLOCK(RQA, RQB)                                                              \
    "ldmia r12!, {r0, r1, r2, r3, r8, r9, r10, r11}\n\t" /* bias, first weights */         \
    ".if %c[nc]\n\t" MF_CRP_C3_F ".rept %c[nc] - 1\n\t" MF_CRP_C3 ".endr\n\t"              \
    ".if %c[t] == 1\n\t" MF_CRP_T1 ".endif\n\t"                                             \
    ".if %c[t] == 2\n\t" MF_CRP_T2 ".endif\n\t"                                             \
    ".else\n\t"                                                                             \
    ".if %c[t] == 1\n\t" MF_CRP_T1_F ".endif\n\t"                                           \
    ".if %c[t] == 2\n\t" MF_CRP_T2_F ".endif\n\t"                                           \
    ".endif\n\t" RQA                                                                         \
    "add lr, lr, r11\n\t" /* back to the window, or on to the next pixel's */ RQB
/* PAIR (O a multiple of 8): blocks two at a time, the first's flag (0) not tested */
#define MF_CRP_ROW(RQA, RQB)                                                                \
    "push {r7}\n\t"                                                                         \
    "ldm r0, {r1, r2, r3, r4, r5}\n\t"                                                      \
    "push {r2, r3, r5}\n\t" /* sp: table, y end, skip */                                     \
    "mov lr, r1\n\t"                                                                        \
    "mov r7, r4\n\t"                                                                        \
    "mov r12, r2\n"                                                                         \
    "2:\n\t"                                                                                \
    ".if %c[pair]\n\t" MF_CRP_BLOCK(RQA, RQB) ".endif\n\t" MF_CRP_BLOCK(RQA, RQB)          \
    "cbnz r4, 3f\n\t" /* 0: another block of this pixel */                                  \
    "b 2b\n"                                                                                \
    "3:\n\t"                                                                                \
    ".if %c[split]\n\t"                                                                     \
    "ldr r4, [sp, #8]\n\t"                                                                  \
    "add r7, r7, r4\n\t" /* every other pixel: skip the other one's outputs */            \
    ".endif\n\t"                                                                            \
    "ldrd r12, r4, [sp]\n\t" /* the table again, the row's end */                           \
    "cmp r7, r4\n\t"                                                                        \
    "bne 2b\n\t"                                                                            \
    "add sp, sp, #12\n\t"                                                                   \
    "pop {r7}\n\t"
#define MF_CRP_SF(A, R) "add " R ", " R ", " A ", asr #31\n\t"
#define MF_CRP_OPS                                                                          \
    : "+r"(st)                                                                              \
    : "m"(*(const int32_t(*)[5])st), [nc] "i"(NW / 3), [t] "i"(NW % 3), [split] "i"(SPLIT),  \
      [pair] "i"(PAIR)                                                                      \
    : "r1", "r2", "r3", "r4", "r5", "r6", "r8", "r9", "r10", "r11", "r12", "lr", "cc", "memory"

MF_INLINE void mf_crp_row_asm(const int16_t *xw, const int32_t *pk, const int32_t NW,
                              int32_t npx, int32_t nb, int32_t sfa, int8_t *y,
                              const int32_t SPLIT, const int32_t PAIR) {
    int32_t s[5];
    register int32_t *st __asm__("r0") = s;
    s[0] = (int32_t)(uintptr_t)xw;
    s[1] = (int32_t)(uintptr_t)pk;
    s[2] = (int32_t)(uintptr_t)(y + npx * (4 * nb + SPLIT * 4 * nb));
    s[3] = (int32_t)(uintptr_t)y;
    s[4] = 4 * nb;
    if (sfa) {
#define MF_CRP_RQA MF_CRP_RQ2("r0", "r1", MF_CRP_SF("r0", "r5"), MF_CRP_SF("r1", "r9"))
#define MF_CRP_RQB MF_CRP_RQ2F("r2", "r3", MF_CRP_SF("r2", "r6"), MF_CRP_SF("r3", "r10"))
        __asm__ volatile(MF_CRP_ROW(MF_CRP_RQA, MF_CRP_RQB) MF_CRP_OPS);
#undef MF_CRP_RQA
#undef MF_CRP_RQB
    } else {
        __asm__ volatile(MF_CRP_ROW(MF_CRP_RQ2("r0", "r1", "", ""), MF_CRP_RQ2F("r2", "r3", "", ""))
                             MF_CRP_OPS);
    }
}
#endif

/* Scratch (pack.convrp_scratch_bytes): int16 [copies][npairs * gs * 2] widened rows, npairs =
 * ((out_w - 1) * stride_w * in_c + 1) / 2 + ceil(k_w * in_c / 2), copies 2 when stride_w *
 * in_c is odd (the odd pixels' windows start on odd elements: a second copy from element 1,
 * each copy's pixels 2 stride_w in_c elements apart), then int8 [in_w * in_c] of x_zp.
 * SPLIT: the entry for odd stride_w * in_c (its asm skips every other pixel's outputs). */
MF_INLINE void mf_crp_body(const int8_t *x, const mf_conv_geom *g, int32_t x_zp,
                           const int32_t *pk, int32_t O, int32_t signfix, int8_t *y,
                           int16_t *scratch, const int32_t NWc, const int32_t SPLIT,
                           const int32_t PAIR) {
    const int32_t kh = g->k_h, gs = 2 * (kh >> 1) + (kh & 1), NW = mf_crp_words(g);
    const int32_t step = g->stride_w * g->in_c, two = step & 1;
    const int32_t stepw = gs * (two ? step : step >> 1);
    const int32_t npairs = ((g->out_w - 1) * step + 1) / 2 + ((g->k_w * g->in_c + 1) >> 1);
    const int32_t len = g->in_w * g->in_c, nb = O >> 2, sfa = (signfix & 3) == 2;
    int16_t *copy_b = scratch + 2 * gs * npairs;
    int8_t *zrow = (int8_t *)(copy_b + (two ? 2 * gs * npairs : 0));
    const int32_t neven = two ? (g->out_w + 1) >> 1 : g->out_w, nodd = g->out_w - neven;
    /* groups p >= pz hold padding only (2p >= left + len), in either copy */
    const int32_t left = g->pad_l * g->in_c, pz = (left + len + 1) >> 1;
    const int32_t pa = pz < npairs ? pz : npairs;
    const int32_t pb = (left + len) >> 1 < npairs ? (left + len) >> 1 : npairs;
    int32_t oy, r;
    mf_fill8(zrow, x_zp, len);
    mf_crp_fill(scratch, gs * pa, gs * npairs, x_zp);
    if (two) {
        mf_crp_fill(copy_b, gs * pb, gs * npairs, x_zp);
    }
    for (oy = 0; oy < g->out_h; ++oy, y += g->out_w * O) {
        for (r = 0; r <= two; ++r) {
            mf_crp_widen(x, g, oy, x_zp, zrow, r ? pb : pa, r ? copy_b : scratch, r);
        }
        for (r = 0; r <= two && (r == 0 || nodd > 0); ++r) { /* even, then odd windows */
            const int16_t *xw = r ? copy_b + 2 * gs * ((step - 1) >> 1) : scratch;
            const int32_t npx = r ? nodd : neven;
#if MF_GEMM_ASM
            if (NW == NWc && two == SPLIT && (nb & PAIR) == 0) {
                mf_crp_row_asm(xw, pk, NWc, npx, nb, sfa, y + r * O, SPLIT, PAIR);
                continue;
            }
#endif
            mf_crp_row_c(xw, pk, nb, NW, npx, stepw, sfa, y + r * O, two ? O : 0);
        }
    }
    (void)NWc;
    (void)SPLIT;
    (void)PAIR;
}

/* mf_convrp_w16_n<NW> (stride_w * in_c even) / mf_convrp2_w16_n<NW> (odd), and the same with
 * the suffix _x8 for O a multiple of 8 (the asm takes blocks in pairs): the convolution of
 * mf_conv_w16 for layers with O a multiple of 4, k_h <= 16, the int8-range clamp (lo = -128,
 * hi = 127) and signfix 0 or 2 (+ MF_PRE0: pre folded into the table).
 *   x        int8 [in_h][in_w][in_c], any alignment; g: as mf_conv_w16
 *   pk       pack.pack_convrp(...) int32 table, 4-byte aligned
 *   y        int8 [out_h][out_w][O]; scratch pack.convrp_scratch_bytes(...) bytes, 4-aligned
 * NW (mf_crp_words of the geometry), the parity of stride_w * in_c and O % 8 select the entry
 * whose asm is unrolled for it; another entry computes the same in C. */
#define MF_CRP_ENTRY(NW)                                                                    \
    MF_CRP_ENTRY1(mf_convrp_w16_n##NW, NW, 0, 0)                                            \
    MF_CRP_ENTRY1(mf_convrp2_w16_n##NW, NW, 1, 0)                                           \
    MF_CRP_ENTRY1(mf_convrp_w16_n##NW##_x8, NW, 0, 1)                                       \
    MF_CRP_ENTRY1(mf_convrp2_w16_n##NW##_x8, NW, 1, 1)
#define MF_CRP_ENTRY1(NAME, NW, SPLIT, PAIR)                                                \
    MF_MICRO void NAME(const int8_t *x, const mf_conv_geom *g, int32_t x_zp, const int32_t *pk, \
                       int32_t O, int32_t signfix, int8_t *y, int16_t *scratch) {              \
        mf_crp_body(x, g, x_zp, pk, O, signfix, y, scratch, NW, SPLIT, PAIR);               \
    }
MF_CRP_ENTRY(1)
MF_CRP_ENTRY(2)
MF_CRP_ENTRY(3)
MF_CRP_ENTRY(4)
MF_CRP_ENTRY(5)
MF_CRP_ENTRY(6)
MF_CRP_ENTRY(7)
MF_CRP_ENTRY(8)
MF_CRP_ENTRY(9)
MF_CRP_ENTRY(10)
MF_CRP_ENTRY(11)
MF_CRP_ENTRY(12)
MF_CRP_ENTRY(13)
MF_CRP_ENTRY(14)
MF_CRP_ENTRY(15)
MF_CRP_ENTRY(16)
MF_CRP_ENTRY(17)
MF_CRP_ENTRY(18)
MF_CRP_ENTRY(19)
MF_CRP_ENTRY(20)
MF_CRP_ENTRY(21)
MF_CRP_ENTRY(22)
MF_CRP_ENTRY(23)
MF_CRP_ENTRY(24)
MF_CRP_ENTRY(25)
MF_CRP_ENTRY(26)
MF_CRP_ENTRY(27)
MF_CRP_ENTRY(28)
MF_CRP_ENTRY(29)
MF_CRP_ENTRY(30)
MF_CRP_ENTRY(31)
MF_CRP_ENTRY(32)
#undef MF_CRP_ENTRY
#undef MF_CRP_ENTRY1

#endif /* MCUFORGE_NN_H */
