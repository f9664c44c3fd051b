/* mcuforge_dw.h: int8 depthwise 3x3 convolution micro-kernel (TFLM numerics, per-channel
 * quantization, depth multiplier 1, dilation 1, stride 1 or 2, explicit top/left padding).
 *
 * Technique: a band of input rows of 4 channels at a time is widened from NHWC int8 to planar
 * int16 rows whose borders hold the input zero point (the zero point is folded into the bias at
 * compile time, so padding contributes 0 exactly as TFLM's skipped taps); each kernel row's
 * weights are stored as two int16 pairs [w0,w1] and [w1,w2], so two adjacent outputs of one
 * kernel row cost one word load and four multiply-accumulates (SMLAD, SMLATB, SMLABT, SMLAD).
 * The requantization's left shift is folded into the weights and the bias at compile time;
 * the rest is mf_rq_apply's SMMLAR form (see mcuforge_nn.h). The portable body reads the same
 * packed data and scratch layout and computes the same integers.
 *
 * Measured on QEMU mps2-an386 (Cortex-M4, arm-none-eabi-gcc 12.2), instructions per MAC with
 * the relayout included (tests/nn_bench/dw_bench.py): see the figures in the report of the
 * commit that added them and at mf_dw3x3_s8 below.
 */
#ifndef MCUFORGE_DW_H
#define MCUFORGE_DW_H

/* gcc 12's <arm_acle.h> has no __smmlar, which mcuforge_nn.h's DSP path calls: until that file
 * provides its own, supply the one instruction here (a no-op once mcuforge_nn.h stops using it). */
#if defined(__GNUC__) && defined(__ARM_FEATURE_DSP) && __ARM_FEATURE_DSP && !defined(__smmlar)
static inline int mf_dw_smmlar_asm(int a, int b, int c) {
    int r;
    __asm__("smmlar %0, %1, %2, %3" : "=r"(r) : "r"(a), "r"(b), "r"(c));
    return r;
}
#define __smmlar(a, b, c) mf_dw_smmlar_asm((a), (b), (c))
#define MF_DW_SMMLAR_SHIM 1
#endif
#include "mcuforge_nn.h"

#if defined(__GNUC__)
#define MF_DW_INLINE static inline __attribute__((always_inline))
typedef uint32_t mf_dw_u32 __attribute__((may_alias));
#else
#define MF_DW_INLINE static inline
typedef uint32_t mf_dw_u32;
#endif

#define MF_DW_CB 4   /* channels widened together (one 32-bit load of NHWC int8 per pixel) */
#define MF_DW_REC 10 /* int32 per channel in the packed array, see mf_dw3x3_s8 */

/* Layer geometry; codegen_c/pack_dw.py computes pw and rows (the scratch shape). */
typedef struct {
    int16_t h, w, c;       /* input [h][w][c] int8 */
    int16_t oh, ow;        /* output [oh][ow][c] int8 */
    int16_t stride;        /* 1 or 2, both directions */
    int16_t pad_t, pad_l;  /* zero-point rows above / columns left of the input */
    int16_t pw;            /* int16 elements per scratch row: even, >= pad_l + w, >= s*(ow rounded up to even) + 2 */
    int16_t rows;          /* scratch rows per channel: (band - 1) * stride + 3 */
} mf_dw_geom;

/* ---- the DSP primitives, and their portable twins (same integers) ------------------------ */
#if MF_USE_DSP
#define mf_dw_smlad(a, b, c) __smlad((int32_t)(a), (int32_t)(b), (c))
#define mf_dw_smlatb(a, b, c) __smlatb((int32_t)(a), (int32_t)(b), (c))
#define mf_dw_smlabt(a, b, c) __smlabt((int32_t)(a), (int32_t)(b), (c))
#define mf_dw_sat8(v) __ssat((v), 8)
#else
MF_DW_INLINE int32_t mf_dw_lo(uint32_t a) { return (int32_t)(int16_t)(a & 0xFFFFu); }
MF_DW_INLINE int32_t mf_dw_hi(uint32_t a) { return (int32_t)(int16_t)(a >> 16); }
/* Every partial sum is an accumulator of some input (see pack_dw.py), so int32 cannot overflow. */
MF_DW_INLINE int32_t mf_dw_smlad(uint32_t a, uint32_t b, int32_t c) {
    return c + mf_dw_lo(a) * mf_dw_lo(b) + mf_dw_hi(a) * mf_dw_hi(b);
}
MF_DW_INLINE int32_t mf_dw_smlatb(uint32_t a, uint32_t b, int32_t c) {
    return c + mf_dw_hi(a) * mf_dw_lo(b);
}
MF_DW_INLINE int32_t mf_dw_smlabt(uint32_t a, uint32_t b, int32_t c) {
    return c + mf_dw_lo(a) * mf_dw_hi(b);
}
MF_DW_INLINE int32_t mf_dw_sat8(int32_t v) { return v < -128 ? -128 : v > 127 ? 127 : v; }
#endif

/* mf_rq_apply with the left shift already in the accumulator, then the clamp. */
MF_DW_INLINE int32_t mf_dw_rq(int32_t acc, int32_t mult, int32_t add, int32_t post, int sf,
                              int clamp, int32_t lo, int32_t hi) {
    int32_t h = mf_smmlar(acc, mult);
    int32_t v = h + add;
    if (sf) v += h >> 31;
    v = mf_dw_sat8(v >> post);
    if (clamp) {
        v = v < lo ? lo : v;
        v = v > hi ? hi : v;
    }
    return v;
}

MF_DW_INLINE void mf_dw_put32(int16_t *p, uint32_t v) { memcpy(p, &v, 4); }

/* Widen one NHWC row (w pixels, nc <= 4 channels from x, pixel stride c bytes) into nc planar
 * int16 rows at dst, dst + plane, ... */
MF_DW_INLINE void mf_dw_widen(const int8_t *x, int w, int c, int nc, int16_t *dst, int plane) {
    int px = 0;
#if MF_USE_DSP
    if (nc == MF_DW_CB) {
        int16_t *d0 = dst, *d1 = dst + plane, *d2 = dst + 2 * plane, *d3 = dst + 3 * plane;
        for (; px + 2 <= w; px += 2) {
            uint32_t a, b, a02, a13, b02, b13, t;
            memcpy(&a, x, 4);
            memcpy(&b, x + c, 4);
            x += 2 * c;
            a02 = (uint32_t)__sxtb16((int32_t)a);
            b02 = (uint32_t)__sxtb16((int32_t)b);
            __asm__("sxtb16 %0, %1, ror #8" : "=r"(a13) : "r"(a));
            __asm__("sxtb16 %0, %1, ror #8" : "=r"(b13) : "r"(b));
            mf_dw_put32(d0, (a02 & 0xFFFFu) | (b02 << 16));
            __asm__("pkhtb %0, %1, %2, asr #16" : "=r"(t) : "r"(b02), "r"(a02));
            mf_dw_put32(d2, t);
            mf_dw_put32(d1, (a13 & 0xFFFFu) | (b13 << 16));
            __asm__("pkhtb %0, %1, %2, asr #16" : "=r"(t) : "r"(b13), "r"(a13));
            mf_dw_put32(d3, t);
            d0 += 2, d1 += 2, d2 += 2, d3 += 2;
        }
        dst += px;
    }
#endif
    for (; px < w; ++px, ++dst, x += c) {
        int k;
        for (k = 0; k < nc; ++k) dst[k * plane] = x[k];
    }
}

/* All output rows of one channel in the band: rows r0 (3 kernel rows at r0, r0 + pw, r0 + 2pw),
 * the next output row s * pw further; outputs to y, y + c, ... (NHWC). */
MF_DW_INLINE void mf_dw_chan(const int16_t *r0, int pw, int nrows, int ow, int c,
                             const int32_t *k, int8_t *y, int ystride, const int s,
                             const int sf, const int clamp, int32_t lo, int32_t hi) {
    const uint32_t k01a = (uint32_t)k[0], k12a = (uint32_t)k[1];
    const uint32_t k01b = (uint32_t)k[2], k12b = (uint32_t)k[3];
    const uint32_t k01c = (uint32_t)k[4], k12c = (uint32_t)k[5];
    const int32_t bias = k[6], mult = k[7], add = k[8], post = k[9];
    const int npairs = ow >> 1;
    int row;
    for (row = 0; row < nrows; ++row, r0 += s * pw, y += ystride) {
        const mf_dw_u32 *p0 = (const mf_dw_u32 *)(const void *)r0;
        const mf_dw_u32 *p1 = (const mf_dw_u32 *)(const void *)(r0 + pw);
        const mf_dw_u32 *p2 = (const mf_dw_u32 *)(const void *)(r0 + 2 * pw);
        int8_t *o = y;
        int i;
        /* one more pass for an odd ow: it reads zero-point columns and stores one output */
        for (i = 0; i < npairs + (ow & 1); ++i) {
            int32_t a0, a1;
            uint32_t u, v, t;
            if (s == 1) { /* outputs x, x+1 from columns x..x+3 = words u, v */
                u = p0[0], v = p0[1], ++p0;
                a0 = mf_dw_smlad(u, k01a, bias), a1 = mf_dw_smlatb(u, k01a, bias);
                a0 = mf_dw_smlabt(v, k12a, a0), a1 = mf_dw_smlad(v, k12a, a1);
                u = p1[0], v = p1[1], ++p1;
                a0 = mf_dw_smlad(u, k01b, a0), a1 = mf_dw_smlatb(u, k01b, a1);
                a0 = mf_dw_smlabt(v, k12b, a0), a1 = mf_dw_smlad(v, k12b, a1);
                u = p2[0], v = p2[1], ++p2;
                a0 = mf_dw_smlad(u, k01c, a0), a1 = mf_dw_smlatb(u, k01c, a1);
                a0 = mf_dw_smlabt(v, k12c, a0), a1 = mf_dw_smlad(v, k12c, a1);
            } else { /* outputs x, x+1 from columns 2x..2x+4 = words u, v, t */
                u = p0[0], v = p0[1], t = p0[2], p0 += 2;
                a0 = mf_dw_smlad(u, k01a, bias), a1 = mf_dw_smlad(v, k01a, bias);
                a0 = mf_dw_smlabt(v, k12a, a0), a1 = mf_dw_smlabt(t, k12a, a1);
                u = p1[0], v = p1[1], t = p1[2], p1 += 2;
                a0 = mf_dw_smlad(u, k01b, a0), a1 = mf_dw_smlad(v, k01b, a1);
                a0 = mf_dw_smlabt(v, k12b, a0), a1 = mf_dw_smlabt(t, k12b, a1);
                u = p2[0], v = p2[1], t = p2[2], p2 += 2;
                a0 = mf_dw_smlad(u, k01c, a0), a1 = mf_dw_smlad(v, k01c, a1);
                a0 = mf_dw_smlabt(v, k12c, a0), a1 = mf_dw_smlabt(t, k12c, a1);
            }
            o[0] = (int8_t)mf_dw_rq(a0, mult, add, post, sf, clamp, lo, hi);
            if (i < npairs) o[c] = (int8_t)mf_dw_rq(a1, mult, add, post, sf, clamp, lo, hi);
            o += 2 * c;
        }
    }
}

/* The 8 specialisations of mf_dw_chan (stride, sign term, clamp), chosen per channel. */
MF_MICRO void mf_dw_chan_any(const int16_t *r0, int pw, int nrows, int ow, int c, const int32_t *k,
                           int8_t *y, int ystride, int s, int sf, int clamp, int32_t lo,
                           int32_t hi) {
    switch ((s == 2 ? 4 : 0) + (sf ? 2 : 0) + (clamp ? 1 : 0)) {
    case 0: mf_dw_chan(r0, pw, nrows, ow, c, k, y, ystride, 1, 0, 0, lo, hi); break;
    case 1: mf_dw_chan(r0, pw, nrows, ow, c, k, y, ystride, 1, 0, 1, lo, hi); break;
    case 2: mf_dw_chan(r0, pw, nrows, ow, c, k, y, ystride, 1, 1, 0, lo, hi); break;
    case 3: mf_dw_chan(r0, pw, nrows, ow, c, k, y, ystride, 1, 1, 1, lo, hi); break;
    case 4: mf_dw_chan(r0, pw, nrows, ow, c, k, y, ystride, 2, 0, 0, lo, hi); break;
    case 5: mf_dw_chan(r0, pw, nrows, ow, c, k, y, ystride, 2, 0, 1, lo, hi); break;
    case 6: mf_dw_chan(r0, pw, nrows, ow, c, k, y, ystride, 2, 1, 0, lo, hi); break;
    default: mf_dw_chan(r0, pw, nrows, ow, c, k, y, ystride, 2, 1, 1, lo, hi); break;
    }
}

/* mf_dw3x3_s8: y = depthwise 3x3 of x, TFLM reference int8 semantics.
 *   x        input [g->h][g->w][g->c] int8 (NHWC, batch 1); any alignment
 *   y        output [g->oh][g->ow][g->c] int8; must not overlap x
 *   pk       packed constants, MF_DW_REC int32 per channel (codegen_c/pack_dw.py): for kernel
 *            rows 0..2 the int16 pairs [w0,w1] and [w1,w2] (low half first) of the weights times
 *            2^pre, then bias' = (bias - x_zp * sum w) << pre, then mf_rq's mult, add, post
 *   x_zp     input zero point (fills the padding)
 *   lo, hi   output clamp (activation), -128 <= lo <= hi <= 127
 *   signfix  pack.needs_signfix(y_zp, lo)
 *   scratch  int16 [MF_DW_CB][g->rows][g->pw], 4-byte aligned: pack_dw.scratch_bytes(...)
 * Padding bottom/right is whatever the output size needs (zero-point filled).
 * Instructions per MAC on mps2-an386 incl. the relayout: see tests/nn_bench/dw_bench.py. */
MF_MICRO void mf_dw3x3_s8(const int8_t *x, int8_t *y, const int32_t *pk, const mf_dw_geom *g,
                          int32_t x_zp, int32_t lo, int32_t hi, int32_t signfix,
                          int16_t *scratch) {
    const int h = g->h, w = g->w, c = g->c, oh = g->oh, ow = g->ow, s = g->stride;
    const int pw = g->pw, rows = g->rows, plane = g->rows * g->pw;
    const int band = (rows - 3) / s + 1; /* output rows per band */
    const int clamp = lo > -128 || hi < 127;
    const uint32_t zz = ((uint32_t)x_zp & 0xFFFFu) * 0x10001u;
    int c0, oy0, i;
    /* every border column is x_zp for good; data columns are rewritten per row */
    for (i = 0; i < MF_DW_CB * plane; i += 2) mf_dw_put32(scratch + i, zz);
    for (c0 = 0; c0 < c; c0 += MF_DW_CB) {
        const int nc = c - c0 < MF_DW_CB ? c - c0 : MF_DW_CB;
        for (oy0 = 0; oy0 < oh; oy0 += band) {
            const int nb = oh - oy0 < band ? oh - oy0 : band;
            const int iy0 = oy0 * s - g->pad_t;
            int r, k;
            for (r = 0; r < (nb - 1) * s + 3; ++r) {
                const int iy = iy0 + r;
                int16_t *d = scratch + r * pw + g->pad_l;
                if (iy >= 0 && iy < h) {
                    mf_dw_widen(x + (iy * w) * c + c0, w, c, nc, d, plane);
                } else {
                    for (k = 0; k < nc; ++k) {
                        int j;
                        for (j = 0; j < w; ++j) d[k * plane + j] = (int16_t)x_zp;
                    }
                }
            }
            for (k = 0; k < nc; ++k) {
                const int32_t *kk = pk + (c0 + k) * MF_DW_REC;
                mf_dw_chan_any(scratch + k * plane, pw, nb, ow, c, kk,
                               y + (oy0 * ow) * c + c0 + k, ow * c, s,
                               signfix && kk[9] != 0, clamp, lo, hi);
            }
        }
    }
}

#endif /* MCUFORGE_DW_H */
