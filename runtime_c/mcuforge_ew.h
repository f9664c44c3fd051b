/* mcuforge_ew.h: micro-kernels for int8 ADD and MUL (same-shape inputs), AVERAGE_POOL_2D and
 * MAX_POOL_2D with TFLM's numerics, called by the schedules of codegen_c/kernels/eltwise.py on
 * constants that codegen_c/pack_ew.py computes and proves at compile time. One DSP body
 * (MF_USE_DSP: SMMLAR, SSAT, SXTAB16, SSUB8/SEL) and one portable C99 body per kernel, reading
 * the same data; both are checked byte for byte against a numpy model of TFLM
 * (tests/test_nn_ew.py).
 *
 * Instructions on the Cortex-M4 (QEMU mps2-an386, tests/nn_bench/ew_bench.py), -O2 / -Os:
 *   ADD, no sign term, no clamp (ResNet-8's residuals)   7.5 / 7.5 per element
 *   ADD with the sign term (activation none), or a clamp 9.5 / 9.5-10.3 per element
 *   (the generated call, literal arguments; through mf_ew_add_s8_rt 1 more per element)
 *   MUL (C intrinsics, no asm)                           14.8 / 17.0 per element
 *   avg pool global 25x5x64 (KWS)                        1.22 / 2.38 per tap
 *   avg pool global 8x8x64 (ResNet-8), 3x3x256 (VWW)     1.31, 2.27 / 2.50, 3.87 per tap
 *   max pool global 8x8x64                               1.21 / 1.46 per tap
 * (TFLM's reference ADD as mcuforge compiled it: ~58 per element.) The generated Makefile's
 * -O2 is the right choice for these kernels.
 */
#ifndef MCUFORGE_EW_H
#define MCUFORGE_EW_H

#include "mcuforge_nn.h" /* MF_USE_DSP, MF_MICRO, MF_INLINE, <arm_acle.h> */

/* ==== int8 ADD, same-shape inputs ==========================================================
 * TFLM: y = clamp(zp + MBQM_lt1(F1(x1) + F2(x2), mo, so), lo, hi) with
 * F_k(x) = MBQM_lt1((x - zp_k) << 20, m_k, s_k). The input with the larger scale ("big") has
 * real multiplier 1/2 exactly, m = 2^30, s = 0, so F_big(x) = (x - zp_big) << 19. With the
 * other input ("small") through a table of 256 int32 indexed by its byte,
 *   T[u] = 2 F_small(u) - (zp_big << 20),   2S = (x_big << 20) + T[x_small],
 *   h = SMMULR(2S, mo) = SRDHM(S, mo),       y = (h + add + signfix * (h >> 31)) >> post
 * (mf_rq_apply with pre = 1: add = 2^(post-1) + (zp << post), or zp when post = 0), then SSAT
 * to int8 and the activation clamp. pack_ew.add_constants checks all 65536 input pairs against
 * TFLM's arithmetic (and that nothing overflows int32) before the schedule uses it.
 * Per element on the DSP extension, without sign term or clamp: LDRSB, LDRB, LDR (table),
 * ADD (lsl #20), SMMLAR, SSAT (asr #post), STRB: 7 instructions, 7.5 with the loop. */

#if MF_USE_DSP
static inline int32_t mf_smmlar_acc(int32_t a, int32_t b, int32_t acc) {
#if defined(__GNUC__)
    int32_t r;
    __asm__("smmlar %0, %1, %2, %3" : "=r"(r) : "r"(a), "r"(b), "r"(acc));
    return r;
#else
    return __smmlar(a, b, acc);
#endif
}
#endif

/* One element before the activation clamp: in [-128, 127]. */
MF_INLINE int32_t mf_ew_add1(int32_t big, uint32_t small, const int32_t *tab, int32_t mult,
                             int32_t add, int32_t post, int32_t signfix) {
    int32_t s2 = tab[small] + big * (1 << 20);
#if MF_USE_DSP
    int32_t v;
    if (signfix) {
        int32_t h = mf_smmlar(s2, mult);
        v = h + add + (h >> 31);
    } else {
        v = mf_smmlar_acc(s2, mult, add);
    }
    return __ssat(v >> post, 8);
#else
    int32_t h = (int32_t)(((int64_t)s2 * mult + (INT64_C(1) << 31)) >> 32);
    int32_t v = h + add;
    if (signfix && h < 0) v -= 1;
    v >>= post;
    return v < -128 ? -128 : (v > 127 ? 127 : v);
#endif
}

/* The DSP loop as asm where gcc optimises (it spends ~1 more instruction per element on
 * pointer increments and merges the byte stores with BFI): one pointer walks `big`, the other
 * arrays are reached at fixed register offsets from it. 8 instructions per element (10 with
 * the sign term) and 2 per 4 elements for the loop; 7 (9) when the schedule's constant `post`
 * reaches the asm as an immediate (SSAT's own shift: see mf_ew_add_s8 below). */
#if MF_USE_DSP && defined(__GNUC__) && defined(__OPTIMIZE__) && defined(__thumb2__)
#define MF_EW_ASM 1
#define MF_EW_ADD_STEP(REQ, SAT)                                                            \
    "ldrsb  %[b], [%[p]], #1\n\t"                                                           \
    "ldrb   %[s], [%[p], %[ds]]\n\t"                                                        \
    "ldr    %[s], [%[tab], %[s], lsl #2]\n\t"                                               \
    "add    %[s], %[s], %[b], lsl #20\n\t" REQ SAT "strb   %[s], [%[p], %[dy]]\n\t"
#define MF_EW_REQ_PLAIN "smmlar %[s], %[s], %[mult], %[add]\n\t"
#define MF_EW_REQ_SIGN                                                                      \
    "smmulr %[b], %[s], %[mult]\n\t"                                                        \
    "add    %[s], %[b], %[add]\n\t"                                                         \
    "add    %[s], %[s], %[b], asr #31\n\t"
#define MF_EW_SAT_REG "asr    %[s], %[s], %[post]\n\tssat   %[s], #8, %[s]\n\t"
#define MF_EW_SAT_IMM "ssat   %[s], #8, %[s], asr %[post]\n\t"
#define MF_EW_ADD_LOOP(REQ, SAT, POST)                                                      \
    __asm__ volatile("1:\n\t" MF_EW_ADD_STEP(REQ, SAT) MF_EW_ADD_STEP(REQ, SAT)             \
                     MF_EW_ADD_STEP(REQ, SAT) MF_EW_ADD_STEP(REQ, SAT)                      \
                     "subs   %[n], %[n], #1\n\t"                                            \
                     "bne    1b\n\t"                                                        \
                     : [p] "+r"(p), [n] "+r"(quads), [b] "=&r"(b), [s] "=&r"(t)             \
                     : [ds] "r"(ds), [dy] "r"(dy), [tab] "r"(tab), [mult] "r"(mult),        \
                       [add] "r"(add), [post] POST(post)                                    \
                     : "cc", "memory")
#define MF_EW_ADD_ASM(SAT, POST)                                                            \
    do {                                                                                    \
        const int8_t *p = big;                                                              \
        int32_t quads = n >> 2, b, t;                                                       \
        /* byte distances from the walking pointer (already advanced by one) */             \
        const int32_t ds = (int32_t)((uintptr_t)small - (uintptr_t)big) - 1;               \
        const int32_t dy = (int32_t)((uintptr_t)y - (uintptr_t)big) - 1;                   \
        if (signfix)                                                                        \
            MF_EW_ADD_LOOP(MF_EW_REQ_SIGN, SAT, POST);                                      \
        else                                                                                \
            MF_EW_ADD_LOOP(MF_EW_REQ_PLAIN, SAT, POST);                                     \
    } while (0)
#else
#define MF_EW_ASM 0
#endif

/* Clamp n int8 to [lo, hi], 4 per word on the DSP extension (SSUB8 sets a GE flag per byte,
 * SEL picks by them). */
static inline void mf_ew_clamp_s8(int8_t *y, int32_t n, int32_t lo, int32_t hi) {
    int32_t i = 0;
#if MF_USE_DSP && defined(__GNUC__)
    const uint32_t lo4 = (uint8_t)lo * 0x01010101u, hi4 = (uint8_t)hi * 0x01010101u;
    for (; i + 4 <= n; i += 4) {
        uint32_t w, t;
        memcpy(&w, y + i, 4);
        __asm__("ssub8 %1, %0, %2\n\tsel %0, %0, %2\n\tssub8 %1, %0, %3\n\tsel %0, %3, %0"
                : "+r"(w), "=&r"(t)
                : "r"(lo4), "r"(hi4)
                : "cc");
        memcpy(y + i, &w, 4);
    }
#endif
    for (; i < n; ++i) y[i] = (int8_t)(y[i] < lo ? lo : (y[i] > hi ? hi : y[i]));
}

/* y[i] = clamp(ADD(big[i], small[i]), lo, hi) for i < n; y may be one of the inputs. */
MF_MICRO void mf_ew_add_s8_rt(const int8_t *big, const int8_t *small, int8_t *y, int32_t n,
                              const int32_t *tab, int32_t mult, int32_t add, int32_t post,
                              int32_t signfix, int32_t lo, int32_t hi) {
    const uint8_t *u = (const uint8_t *)small; /* the table's index: the byte */
    int32_t i = 0;
#if MF_EW_ASM
    if (n >= 4) {
        MF_EW_ADD_ASM(MF_EW_SAT_REG, "r");
        i = n & ~3;
    }
#else
    for (; i + 4 <= n; i += 4) {
        int32_t v0 = mf_ew_add1(big[i], u[i], tab, mult, add, post, signfix);
        int32_t v1 = mf_ew_add1(big[i + 1], u[i + 1], tab, mult, add, post, signfix);
        int32_t v2 = mf_ew_add1(big[i + 2], u[i + 2], tab, mult, add, post, signfix);
        int32_t v3 = mf_ew_add1(big[i + 3], u[i + 3], tab, mult, add, post, signfix);
        y[i] = (int8_t)v0;
        y[i + 1] = (int8_t)v1;
        y[i + 2] = (int8_t)v2;
        y[i + 3] = (int8_t)v3;
    }
#endif
    for (; i < n; ++i) y[i] = (int8_t)mf_ew_add1(big[i], u[i], tab, mult, add, post, signfix);
    if (lo > -128 || hi < 127) mf_ew_clamp_s8(y, n, lo, hi);
}

/* The call the schedule emits (its arguments are constants): inlined, so that where the
 * compiler sees `post` as a constant the loop shifts inside SSAT; otherwise mf_ew_add_s8_rt. */
MF_INLINE void mf_ew_add_s8(const int8_t *big, const int8_t *small, int8_t *y, int32_t n,
                            const int32_t *tab, int32_t mult, int32_t add, int32_t post,
                            int32_t signfix, int32_t lo, int32_t hi) {
#if MF_EW_ASM
    if (__builtin_constant_p(post) && post >= 1 && post <= 31 && n >= 4) {
        const int32_t done = n & ~3;
        MF_EW_ADD_ASM(MF_EW_SAT_IMM, "i");
        if (done < n)
            mf_ew_add_s8_rt(big + done, small + done, y + done, n - done, tab, mult, add, post,
                            signfix, lo, hi);
        if (lo > -128 || hi < 127) mf_ew_clamp_s8(y, done, lo, hi);
        return;
    }
#endif
    mf_ew_add_s8_rt(big, small, y, n, tab, mult, add, post, signfix, lo, hi);
}

/* ==== int8 MUL, same-shape inputs =========================================================
 * TFLM: y = clamp(zp + MBQM((x1 + off1) * (x2 + off2), mult, shift), lo, hi). |product| <=
 * 2^16, so the requantization is mf_rq_apply's (h = SMMULR(p << pre, mult), then
 * (h + add + signfix * (h >> 31)) >> post), checked on all 65536 input pairs by
 * pack_ew.mul_constants. */
MF_INLINE int32_t mf_ew_mul1(int32_t a, int32_t b, int32_t off1, int32_t off2, int32_t mult,
                             int32_t add, int32_t pre, int32_t post, int32_t signfix) {
    int32_t p = (a + off1) * (b + off2);
    int32_t h = mf_smmlar((int32_t)((uint32_t)p << pre), mult);
    int32_t v = h + add;
    if (signfix) v += h >> 31;
    v >>= post;
#if MF_USE_DSP
    return __ssat(v, 8);
#else
    return v < -128 ? -128 : (v > 127 ? 127 : v);
#endif
}

MF_MICRO void mf_ew_mul_s8(const int8_t *x1, const int8_t *x2, int8_t *y, int32_t n,
                           int32_t off1, int32_t off2, int32_t mult, int32_t add, int32_t pre,
                           int32_t post, int32_t signfix, int32_t lo, int32_t hi) {
    int32_t i = 0;
    for (; i + 4 <= n; i += 4) {
        int32_t v0 = mf_ew_mul1(x1[i], x2[i], off1, off2, mult, add, pre, post, signfix);
        int32_t v1 = mf_ew_mul1(x1[i + 1], x2[i + 1], off1, off2, mult, add, pre, post, signfix);
        int32_t v2 = mf_ew_mul1(x1[i + 2], x2[i + 2], off1, off2, mult, add, pre, post, signfix);
        int32_t v3 = mf_ew_mul1(x1[i + 3], x2[i + 3], off1, off2, mult, add, pre, post, signfix);
        y[i] = (int8_t)v0;
        y[i + 1] = (int8_t)v1;
        y[i + 2] = (int8_t)v2;
        y[i + 3] = (int8_t)v3;
    }
    for (; i < n; ++i)
        y[i] = (int8_t)mf_ew_mul1(x1[i], x2[i], off1, off2, mult, add, pre, post, signfix);
    if (lo > -128 || hi < 127) mf_ew_clamp_s8(y, n, lo, hi);
}

/* ==== int8 AVERAGE_POOL_2D =================================================================
 * TFLM: per output pixel and channel, the sum of the raw int8 inputs in the window clipped to
 * the image, divided by the number of those taps rounding half away from zero, clamped to
 * [lo, hi]. The DSP body sums 4 channels per word with SXTAB16 into 16-bit lanes (exact while
 * a window has at most 255 taps: |sum| <= 128 * 255 < 2^15), 8 channels per pass; larger
 * windows and the channel tail take the portable loop. */
typedef struct {
    int16_t h, w, c, fh, fw, sh, sw, pt, pl, oh, ow;
} mf_pool_geom;

/* TFLM's rounding division, sum > 0 ? (sum + count/2) / count : (sum - count/2) / count,
 * branch-free (for sum = 0 both give 0), then the clamp when it can bite (a mean of int8
 * values is inside [-128, 127] already). */
MF_INLINE int8_t mf_ew_pool_out(int32_t sum, int32_t count, int32_t half, int32_t lo,
                                    int32_t hi) {
    int32_t m = sum >> 31; /* -1 for sum < 0 */
    int32_t v = (sum + ((half ^ m) - m)) / count;
    if (lo > -128 || hi < 127) {
        v = v < lo ? lo : v;
        v = v > hi ? hi : v;
    }
    return (int8_t)v;
}

#if MF_USE_DSP
/* acc[0..3] = the sums of 8 channels over a window of rows x cols pixels starting at p (rows
 * `stride` bytes apart, pixels C bytes apart), as int16 lane pairs (c0,c2) (c1,c3) (c4,c6)
 * (c5,c7). */
MF_INLINE void mf_ew_sum8(const int8_t *p, int32_t rows, int32_t cols, int32_t C,
                          int32_t stride, int32_t acc[4]) {
    int32_t a0 = 0, a1 = 0, a2 = 0, a3 = 0, r, k;
    for (r = 0; r < rows; ++r, p += stride) {
        const int8_t *q = p;
        for (k = cols; k > 0; --k, q += C) {
            int32_t w0, w1;
            memcpy(&w0, q, 4); /* unaligned LDRs */
            memcpy(&w1, q + 4, 4);
            a0 = (int32_t)__sxtab16(a0, w0);
            a1 = mf_sxtab16_ror8(a1, w0);
            a2 = (int32_t)__sxtab16(a2, w1);
            a3 = mf_sxtab16_ror8(a3, w1);
        }
    }
    acc[0] = a0, acc[1] = a1, acc[2] = a2, acc[3] = a3;
}

/* The same for 4 channels: acc[0..1]. */
MF_INLINE void mf_ew_sum4(const int8_t *p, int32_t rows, int32_t cols, int32_t C,
                          int32_t stride, int32_t acc[2]) {
    int32_t a0 = 0, a1 = 0, r, k;
    for (r = 0; r < rows; ++r, p += stride) {
        const int8_t *q = p;
        for (k = cols; k > 0; --k, q += C) {
            int32_t w0;
            memcpy(&w0, q, 4);
            a0 = (int32_t)__sxtab16(a0, w0);
            a1 = mf_sxtab16_ror8(a1, w0);
        }
    }
    acc[0] = a0, acc[1] = a1;
}

/* Lanes (c0, c2) and (c1, c3) of a SXTAB16 pair out to 4 channels. */
MF_INLINE void mf_ew_pool_out4(int32_t a02, int32_t a13, int32_t count, int32_t half,
                                   int32_t lo, int32_t hi, int8_t *y) {
    y[0] = mf_ew_pool_out((int16_t)a02, count, half, lo, hi);
    y[1] = mf_ew_pool_out((int16_t)a13, count, half, lo, hi);
    y[2] = mf_ew_pool_out(a02 >> 16, count, half, lo, hi);
    y[3] = mf_ew_pool_out(a13 >> 16, count, half, lo, hi);
}
#endif

MF_MICRO void mf_ew_avgpool_s8(const int8_t *x, int8_t *y, const mf_pool_geom *g, int32_t lo,
                               int32_t hi) {
    const int32_t C = g->c, W = g->w, stride = W * C;
    int32_t oy, ox;
    for (oy = 0; oy < g->oh; ++oy) {
        int32_t y0 = oy * g->sh - g->pt, y1 = y0 + g->fh;
        y0 = y0 < 0 ? 0 : y0;
        y1 = y1 > g->h ? g->h : y1;
        for (ox = 0; ox < g->ow; ++ox) {
            int32_t x0 = ox * g->sw - g->pl, x1 = x0 + g->fw;
            int32_t rows, cols, count, half, c = 0;
            const int8_t *p;
            x0 = x0 < 0 ? 0 : x0;
            x1 = x1 > W ? W : x1;
            rows = y1 - y0, cols = x1 - x0;
            count = rows * cols, half = count / 2;
            p = x + (y0 * W + x0) * C;
            if (cols == W) { /* whole rows: one run of pixels */
                cols *= rows;
                rows = 1;
            }
#if MF_USE_DSP
            if (count <= 255) { /* |sum| <= 128 * 255 fits an int16 lane */
                int32_t acc[4];
                for (; c + 8 <= C; c += 8) {
                    mf_ew_sum8(p + c, rows, cols, C, stride, acc);
                    mf_ew_pool_out4(acc[0], acc[1], count, half, lo, hi, y + c);
                    mf_ew_pool_out4(acc[2], acc[3], count, half, lo, hi, y + c + 4);
                }
                if (c + 4 <= C) {
                    mf_ew_sum4(p + c, rows, cols, C, stride, acc);
                    mf_ew_pool_out4(acc[0], acc[1], count, half, lo, hi, y + c);
                    c += 4;
                }
            }
#endif
            for (; c < C; ++c) {
                int32_t sum = 0, r, k;
                for (r = 0; r < rows; ++r) {
                    const int8_t *q = p + r * stride + c;
                    for (k = 0; k < cols; ++k, q += C) sum += *q;
                }
                y[c] = mf_ew_pool_out(sum, count, half, lo, hi);
            }
            y += C;
        }
    }
}

/* ==== int8 MAX_POOL_2D =====================================================================
 * TFLM: per output pixel and channel, the largest raw int8 input in the window clipped to the
 * image, clamped to [lo, hi]. The DSP body keeps 4 channels per word: SSUB8 sets a GE flag per
 * byte where the new value is >= the running maximum, SEL takes it (8 channels per pass). */
#if MF_USE_DSP && defined(__GNUC__)
static inline uint32_t mf_ew_max4(uint32_t m, uint32_t w) {
    uint32_t t;
    __asm__("ssub8 %1, %2, %0\n\tsel %0, %2, %0" : "+r"(m), "=&r"(t) : "r"(w) : "cc");
    return m;
}
#endif

MF_MICRO void mf_ew_maxpool_s8(const int8_t *x, int8_t *y, const mf_pool_geom *g, int32_t lo,
                               int32_t hi) {
    const int32_t C = g->c, W = g->w, stride = W * C;
    int32_t oy, ox;
    for (oy = 0; oy < g->oh; ++oy) {
        int32_t y0 = oy * g->sh - g->pt, y1 = y0 + g->fh;
        y0 = y0 < 0 ? 0 : y0;
        y1 = y1 > g->h ? g->h : y1;
        for (ox = 0; ox < g->ow; ++ox) {
            int32_t x0 = ox * g->sw - g->pl, x1 = x0 + g->fw;
            int32_t rows, cols, c = 0, r, k;
            const int8_t *p;
            x0 = x0 < 0 ? 0 : x0;
            x1 = x1 > W ? W : x1;
            rows = y1 - y0, cols = x1 - x0;
            p = x + (y0 * W + x0) * C;
            if (cols == W) { /* whole rows: one run of pixels */
                cols *= rows;
                rows = 1;
            }
#if MF_USE_DSP && defined(__GNUC__)
            for (; c + 8 <= C; c += 8) {
                uint32_t m0 = 0x80808080u, m1 = 0x80808080u;
                for (r = 0; r < rows; ++r) {
                    const int8_t *q = p + r * stride + c;
                    for (k = cols; k > 0; --k, q += C) {
                        uint32_t w0, w1;
                        memcpy(&w0, q, 4); /* unaligned LDRs */
                        memcpy(&w1, q + 4, 4);
                        m0 = mf_ew_max4(m0, w0);
                        m1 = mf_ew_max4(m1, w1);
                    }
                }
                memcpy(y + c, &m0, 4);
                memcpy(y + c + 4, &m1, 4);
            }
            for (; c + 4 <= C; c += 4) {
                uint32_t m0 = 0x80808080u;
                for (r = 0; r < rows; ++r) {
                    const int8_t *q = p + r * stride + c;
                    for (k = cols; k > 0; --k, q += C) {
                        uint32_t w0;
                        memcpy(&w0, q, 4);
                        m0 = mf_ew_max4(m0, w0);
                    }
                }
                memcpy(y + c, &m0, 4);
            }
#endif
            for (; c < C; ++c) {
                int32_t m = -128;
                for (r = 0; r < rows; ++r) {
                    const int8_t *q = p + r * stride + c;
                    for (k = 0; k < cols; ++k, q += C) m = *q > m ? *q : m;
                }
                y[c] = (int8_t)m;
            }
            if (lo > -128 || hi < 127) mf_ew_clamp_s8(y, C, lo, hi);
            y += C;
        }
    }
}

/* ---- a 256-entry table per byte (codegen_c/kernels/lut.py) ---------------------------------
 *
 *   mf_ew_lut8(x, y, n, lut, flip): y[i] = lut[x[i] ^ flip], i < n, on bytes (flip 0x80: int8
 *   values as the table's index 0..255, 0 for uint8). Four bytes a word: one load, one EOR,
 *   four table loads, one store (~4 instructions a byte on the Cortex-M4, the plain loop ~6).
 *   y may be x itself. */
MF_MICRO void mf_ew_lut8(const uint8_t *x, uint8_t *y, int32_t n, const uint8_t *lut,
                         int32_t flip) {
    const uint32_t f4 = (uint32_t)flip * 0x01010101u;
    int32_t i = 0;
    for (; i + 4 <= n; i += 4) {
        uint32_t v, w;
        memcpy(&v, x + i, 4);
        v ^= f4;
        w = (uint32_t)lut[v & 0xFFu] | ((uint32_t)lut[(v >> 8) & 0xFFu] << 8)
            | ((uint32_t)lut[(v >> 16) & 0xFFu] << 16) | ((uint32_t)lut[v >> 24] << 24);
        memcpy(y + i, &w, 4);
    }
    for (; i < n; ++i) y[i] = lut[x[i] ^ (uint32_t)flip];
}

#endif /* MCUFORGE_EW_H */
