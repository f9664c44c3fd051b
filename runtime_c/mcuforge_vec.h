/* mcuforge_vec.h: micro-kernels for the host (x86-64, AArch64 hosts: wide SIMD units), int8
 * layers with TFLM numerics.
 *
 * Plain C99 written for gcc's auto-vectoriser (no intrinsics): every inner loop runs over
 * contiguous memory with no loop-carried dependence other than a sum, so at -O3 (or -O2
 * -ftree-vectorize) gcc turns the int16 dot products into pmaddwd / vpmaddwd (vpdpwssd with
 * AVX-512 VNNI) and the per-channel requantization into vector multiplies. The Cortex-M
 * kernels (mcuforge_nn.h, mcuforge_dw.h) keep their own packed layouts; these kernels read
 * natural ones (codegen_c/kernels/host.py packs them, codegen_c/micro_vec.py mirrors them):
 *   GEMM weights: int16 [O][Kp], row o = output channel o's K taps in TFLite's order
 *     (k = (ky * k_w + kx) * in_c + c for a convolution), Kp = MF_VEC_KPAD(K), zero tail;
 *     mf_vec_gemm_t (K <= 16): int16 [ceil(O / 16)][K][16], lanes = channels.
 *   Depthwise weights: int16 [k_h * k_w][tw * C], TFLite's [1][k_h][k_w][C] tiled tw times.
 *   rq: int32 [4][O] (structure of arrays: mult[O], add[O], pre[O], post[O]), the fields of
 *     mcuforge_nn.h's mf_rq: y = clamp((h + add [+ (h >> 31)]) >> post, lo, hi) with
 *     h = round_high_mul(acc << pre, mult); exact for the accumulator bounds that
 *     codegen_c/pack.py proves per layer (requant_params).
 * Accumulation: the input zero point folded into the GEMM bias (pack.fold_bias, padding taps
 * of an im2col patch are x_zp); the depthwise kernel skips padding taps and subtracts x_zp.
 */
#ifndef MCUFORGE_VEC_H
#define MCUFORGE_VEC_H

#include <stdint.h>
#include <string.h>

/* Every kernel is inlined into its layer's function, whose call passes the shapes as
 * constants: gcc then specialises the loops per layer (known trip counts, no vector epilogues
 * where K is a multiple of the vector, geometry read from constant tables): -25% on ResNet-8. */
#if defined(__GNUC__)
#define MF_VEC_FN static inline __attribute__((unused, always_inline))
#define MF_VEC_INLINE static inline __attribute__((always_inline))
#else
#define MF_VEC_FN static
#define MF_VEC_INLINE static inline
#endif

#define MF_VEC_KPAD(K) (((K) + 7) & ~7) /* one 128-bit vector of int16 */

/* y[o] = clamp(requant(acc[o], rq), lo, hi) for o < n: a loop over channels gcc vectorises
 * (variable shifts, a widening multiply). sf: 1 when the sign term applies (pack.needs_signfix).
 * The rounding high multiply is taken as the low word of (p + 2^31) >> 32, computed unsigned
 * (the same bits as the arithmetic shift, and a shift the vector units have). */
MF_VEC_INLINE void mf_vec_requant(const int32_t *acc, const int32_t *rq,
                                  int32_t n, int32_t lo, int32_t hi, int32_t sf,
                                  int32_t rq_stride, int8_t *y) {
    const int32_t *mult = rq, *add = rq + rq_stride;
    const int32_t *pre = rq + 2 * rq_stride, *post = rq + 3 * rq_stride;
    const int32_t sfmask = sf ? -1 : 0;
    int32_t o;
    for (o = 0; o < n; ++o) {
        const int32_t a = (int32_t)((uint32_t)acc[o] << pre[o]);
        const uint64_t p = (uint64_t)((int64_t)a * mult[o]) + (UINT64_C(1) << 31);
        const int32_t h = (int32_t)(uint32_t)(p >> 32);
        int32_t v = h + add[o] + ((h >> 31) & sfmask & -(int32_t)(post[o] > 0));
        v >>= post[o];
        v = v < lo ? lo : v;
        v = v > hi ? hi : v;
        y[o] = (int8_t)v;
    }
}

/* acc[o] = bias[o] + xw . w[o] for o < O: blocks of 4 channels share each load of xw (four
 * vector sums in one loop), the last 1-3 channels one at a time. */
MF_VEC_INLINE void mf_vec_dots(const int16_t *xw, int32_t Kp,
                               const int16_t *w, const int32_t *bias,
                               int32_t O, int32_t *acc) {
    int32_t o = 0, k;
    for (; o + 4 <= O; o += 4) {
        const int16_t *w0 = w + (int64_t)o * Kp, *w1 = w0 + Kp, *w2 = w1 + Kp, *w3 = w2 + Kp;
        int32_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
        for (k = 0; k < Kp; ++k) {
            const int32_t xv = xw[k];
            s0 += xv * w0[k];
            s1 += xv * w1[k];
            s2 += xv * w2[k];
            s3 += xv * w3[k];
        }
        acc[o] = bias[o] + s0;
        acc[o + 1] = bias[o + 1] + s1;
        acc[o + 2] = bias[o + 2] + s2;
        acc[o + 3] = bias[o + 3] + s3;
    }
    for (; o < O; ++o) {
        const int16_t *w0 = w + (int64_t)o * Kp;
        int32_t s0 = 0;
        for (k = 0; k < Kp; ++k) {
            s0 += xw[k] * w0[k];
        }
        acc[o] = bias[o] + s0;
    }
}

/* mf_vec_dots for two rows xa, xb at once: each weight load serves both (the weights of a
 * large layer stream from L2 once per pair of pixels, not per pixel). */
MF_VEC_INLINE void mf_vec_dots2(const int16_t *xa, const int16_t *xb,
                                int32_t Kp, const int16_t *w,
                                const int32_t *bias, int32_t O,
                                int32_t *acc_a, int32_t *acc_b) {
    int32_t o = 0, k;
    for (; o + 4 <= O; o += 4) {
        const int16_t *w0 = w + (int64_t)o * Kp, *w1 = w0 + Kp, *w2 = w1 + Kp, *w3 = w2 + Kp;
        int32_t s0 = 0, s1 = 0, s2 = 0, s3 = 0, t0 = 0, t1 = 0, t2 = 0, t3 = 0;
        for (k = 0; k < Kp; ++k) {
            const int32_t a = xa[k], b = xb[k];
            s0 += a * w0[k];
            s1 += a * w1[k];
            s2 += a * w2[k];
            s3 += a * w3[k];
            t0 += b * w0[k];
            t1 += b * w1[k];
            t2 += b * w2[k];
            t3 += b * w3[k];
        }
        acc_a[o] = bias[o] + s0;
        acc_a[o + 1] = bias[o + 1] + s1;
        acc_a[o + 2] = bias[o + 2] + s2;
        acc_a[o + 3] = bias[o + 3] + s3;
        acc_b[o] = bias[o] + t0;
        acc_b[o + 1] = bias[o + 1] + t1;
        acc_b[o + 2] = bias[o + 2] + t2;
        acc_b[o + 3] = bias[o + 3] + t3;
    }
    for (; o < O; ++o) {
        const int16_t *w0 = w + (int64_t)o * Kp;
        int32_t s0 = 0, t0 = 0;
        for (k = 0; k < Kp; ++k) {
            s0 += xa[k] * w0[k];
            t0 += xb[k] * w0[k];
        }
        acc_a[o] = bias[o] + s0;
        acc_b[o] = bias[o] + t0;
    }
}

/* xw[0..Kp) = the K int8 values of x widened, zero tail. */
MF_VEC_INLINE void mf_vec_widen(const int8_t *x, int32_t K, int32_t Kp,
                                int16_t *xw) {
    int32_t k;
    for (k = 0; k < K; ++k) {
        xw[k] = x[k];
    }
    for (; k < Kp; ++k) {
        xw[k] = 0;
    }
}

/* mf_vec_gemm: y = requant(x . w^T) for `rows` rows (1x1 convolution over pixels, fully
 * connected layer over batch rows).
 *   x        rows x K int8, row r at x + r * x_stride
 *   w        int16 [O][Kp] (layout above); bias int32 [O], x_zp folded in; rq int32 [4][O]
 *   lo, hi   output clamp; signfix: pack.needs_signfix
 *   y        int8, row r at y + r * y_stride
 *   scratch  2 x (int32 [O] accumulators, int16 [Kp] row), the second only for rows > 1
 *            (host.scratch_words) */
MF_VEC_FN void mf_vec_gemm(const int8_t *x, int32_t rows, int32_t x_stride, int32_t K,
                           const int16_t *w, const int32_t *bias, const int32_t *rq, int32_t O,
                           int32_t lo, int32_t hi, int32_t signfix, int8_t *y,
                           int32_t y_stride, int32_t *scratch) {
    const int32_t Kp = MF_VEC_KPAD(K);
    int32_t *acc = scratch, *acc2 = scratch + O + Kp / 2; /* a single row: half of it */
    int16_t *xw = (int16_t *)(void *)(acc + O), *xw2 = (int16_t *)(void *)(acc2 + O);
    int32_t r = 0;
    for (; r + 2 <= rows; r += 2) {
        mf_vec_widen(x + (int64_t)r * x_stride, K, Kp, xw);
        mf_vec_widen(x + (int64_t)(r + 1) * x_stride, K, Kp, xw2);
        mf_vec_dots2(xw, xw2, Kp, w, bias, O, acc, acc2);
        mf_vec_requant(acc, rq, O, lo, hi, signfix, O, y + (int64_t)r * y_stride);
        mf_vec_requant(acc2, rq, O, lo, hi, signfix, O, y + (int64_t)(r + 1) * y_stride);
    }
    if (r < rows) {
        mf_vec_widen(x + (int64_t)r * x_stride, K, Kp, xw);
        mf_vec_dots(xw, Kp, w, bias, O, acc);
        mf_vec_requant(acc, rq, O, lo, hi, signfix, O, y + (int64_t)r * y_stride);
    }
}

/* mf_vec_gemm_t: mf_vec_gemm for short rows (K <= 16, host.T_MAX_K), where the dot products
 * above would spend more on their horizontal sums than on the products: lanes are output
 * channels instead, 16 named accumulators per block that gcc vectorises as one group.
 *   w        int16 [ceil(O / 16)][K][16]: block b, tap k, lane j = channel 16 b + j (zero
 *            channels pad the last block); bias int32 [16 * ceil(O / 16)], zero padded
 *   scratch  int32 [16 * ceil(O / 16)]; the other arguments as mf_vec_gemm */
#define MF_VEC_R16(M) M(0) M(1) M(2) M(3) M(4) M(5) M(6) M(7) M(8) M(9) M(10) M(11) M(12) \
    M(13) M(14) M(15)
#define MF_VEC_T_DECL(j) int32_t s##j = bb[j];
#define MF_VEC_T_MAC(j) s##j += xv * wk[j];
#define MF_VEC_T_STORE(j) acc[16 * b + j] = s##j;
MF_VEC_FN void mf_vec_gemm_t(const int8_t *x, int32_t rows, int32_t x_stride, int32_t K,
                             const int16_t *w, const int32_t *bias, const int32_t *rq,
                             int32_t O, int32_t lo, int32_t hi, int32_t signfix, int8_t *y,
                             int32_t y_stride, int32_t *scratch) {
    const int32_t nb = (O + 15) / 16;
    int32_t *acc = scratch;
    int32_t r, b, k;
    for (r = 0; r < rows; ++r) {
        const int8_t *xr = x + (int64_t)r * x_stride;
        for (b = 0; b < nb; ++b) {
            const int32_t *bb = bias + 16 * b;
            MF_VEC_R16(MF_VEC_T_DECL)
            for (k = 0; k < K; ++k) {
                const int32_t xv = xr[k];
                const int16_t *wk = w + ((int64_t)b * K + k) * 16;
                MF_VEC_R16(MF_VEC_T_MAC)
            }
            MF_VEC_R16(MF_VEC_T_STORE)
        }
        mf_vec_requant(acc, rq, O, lo, hi, signfix, O, y + (int64_t)r * y_stride);
    }
}
#undef MF_VEC_T_DECL
#undef MF_VEC_T_MAC
#undef MF_VEC_T_STORE

/* Geometry of mf_vec_conv, int32 [11]: in_h in_w in_c k_h k_w stride_h stride_w pad_t pad_l
 * out_h out_w (mcuforge_nn.h's mf_conv_geom, same order). */
enum { MF_VC_H, MF_VC_W, MF_VC_C, MF_VC_KH, MF_VC_KW, MF_VC_SH, MF_VC_SW, MF_VC_PT, MF_VC_PL,
       MF_VC_OH, MF_VC_OW };

/* The widened patch of output pixel (oy, ox): taps in the weights' order, padding x_zp. */
MF_VEC_INLINE void mf_vec_patch(const int8_t *x, const int32_t *g, int32_t x_zp,
                                int32_t oy, int32_t ox, int32_t Kp, int16_t *xw) {
    const int32_t C = g[MF_VC_C], KW = g[MF_VC_KW], seg = KW * C;
    const int32_t iy0 = oy * g[MF_VC_SH] - g[MF_VC_PT], ix0 = ox * g[MF_VC_SW] - g[MF_VC_PL];
    const int32_t lo = ix0 < 0 ? -ix0 : 0;
    int32_t hi = g[MF_VC_W] - ix0, ky, i, k = 0;
    hi = hi > KW ? KW : hi;
    for (ky = 0; ky < g[MF_VC_KH]; ++ky, k += seg) {
        const int32_t iy = iy0 + ky;
        int16_t *d = xw + k;
        if (iy < 0 || iy >= g[MF_VC_H] || lo >= hi) {
            for (i = 0; i < seg; ++i) {
                d[i] = (int16_t)x_zp;
            }
        } else if (lo == 0 && hi == KW) { /* inside the image: seg is a constant once inlined */
            const int8_t *s = x + ((int64_t)iy * g[MF_VC_W] + ix0) * C;
            for (i = 0; i < seg; ++i) {
                d[i] = s[i];
            }
        } else {
            const int8_t *s = x + ((int64_t)iy * g[MF_VC_W] + ix0 + lo) * C;
            const int32_t n = (hi - lo) * C;
            for (i = 0; i < lo * C; ++i) {
                d[i] = (int16_t)x_zp;
            }
            d += lo * C;
            for (i = 0; i < n; ++i) {
                d[i] = s[i];
            }
            for (i = n; i < seg - lo * C; ++i) {
                d[i] = (int16_t)x_zp;
            }
        }
    }
    for (; k < Kp; ++k) {
        xw[k] = 0;
    }
}

/* mf_vec_conv: a k_h x k_w int8 convolution (any stride, SAME/VALID, dilation 1), NHWC,
 * batch 1, by im2col (one widened patch per output pixel) and mf_vec_gemm's dot products.
 *   x int8 [in_h][in_w][in_c]; g: the geometry; x_zp the input zero point
 *   w, bias, rq, lo, hi, signfix as mf_vec_gemm (K = k_h * k_w * in_c); y int8 [out_h][out_w][O]
 *   scratch as mf_vec_gemm's, the second half only for more than one output pixel */
MF_VEC_FN void mf_vec_conv(const int8_t *x, const int32_t *g, int32_t x_zp, const int16_t *w,
                           const int32_t *bias, const int32_t *rq, int32_t O, int32_t lo,
                           int32_t hi, int32_t signfix, int8_t *y, int32_t *scratch) {
    const int32_t Kp = MF_VEC_KPAD(g[MF_VC_KH] * g[MF_VC_KW] * g[MF_VC_C]);
    const int32_t OW = g[MF_VC_OW], n = g[MF_VC_OH] * OW;
    int32_t *acc = scratch, *acc2 = scratch + O + Kp / 2; /* a single pixel: half of it */
    int16_t *xw = (int16_t *)(void *)(acc + O), *xw2 = (int16_t *)(void *)(acc2 + O);
    int32_t p = 0;
    for (; p + 2 <= n; p += 2) { /* pixels in pairs, in row-major order */
        mf_vec_patch(x, g, x_zp, p / OW, p % OW, Kp, xw);
        mf_vec_patch(x, g, x_zp, (p + 1) / OW, (p + 1) % OW, Kp, xw2);
        mf_vec_dots2(xw, xw2, Kp, w, bias, O, acc, acc2);
        mf_vec_requant(acc, rq, O, lo, hi, signfix, O, y);
        mf_vec_requant(acc2, rq, O, lo, hi, signfix, O, y + O);
        y += 2 * O;
    }
    if (p < n) {
        mf_vec_patch(x, g, x_zp, p / OW, p % OW, Kp, xw);
        mf_vec_dots(xw, Kp, w, bias, O, acc);
        mf_vec_requant(acc, rq, O, lo, hi, signfix, O, y);
    }
}

/* Geometry of mf_vec_dw, int32 [14]: h w c k_h k_w stride_h stride_w dil_h dil_w pad_t pad_l
 * out_h out_w tw (tw: output pixels per chunk, the period of the tiled constants). */
enum { MF_VD_H, MF_VD_W, MF_VD_C, MF_VD_KH, MF_VD_KW, MF_VD_SH, MF_VD_SW, MF_VD_DH, MF_VD_DW,
       MF_VD_PT, MF_VD_PL, MF_VD_OH, MF_VD_OW, MF_VD_TW };

/* Input row iy as int16 x - x_zp over the padded columns q = ix + pad_l < wq, split by the
 * column stride into sw phases of pw pixels (phase q % sw, position q / sw); padding is 0. */
MF_VEC_INLINE void mf_vec_dw_row(const int8_t *x, const int32_t *g, int32_t x_zp,
                                 int32_t iy, int32_t wq, int32_t pw, int16_t *d) {
    const int32_t C = g[MF_VD_C], W = g[MF_VD_W], SW = g[MF_VD_SW], PL = g[MF_VD_PL];
    const int8_t *row = x + (int64_t)iy * W * C;
    int32_t p, pos, c;
    if (SW == 1) { /* one contiguous run: zeros, the row, zeros */
        const int32_t a = PL < wq ? PL : wq, b = PL + W < wq ? PL + W : wq;
        for (c = 0; c < a * C; ++c) {
            d[c] = 0;
        }
        for (c = 0; c < (b - a) * C; ++c) {
            d[a * C + c] = (int16_t)(row[c] - x_zp);
        }
        for (c = b * C; c < pw * C; ++c) {
            d[c] = 0;
        }
        return;
    }
    for (p = 0; p < SW; ++p) {
        for (pos = 0; pos < pw; ++pos) {
            const int32_t q = pos * SW + p, ix = q - PL;
            int16_t *o = d + (p * pw + pos) * C;
            if (q < wq && ix >= 0 && ix < W) {
                for (c = 0; c < C; ++c) {
                    o[c] = (int16_t)(row[ix * C + c] - x_zp);
                }
            } else {
                for (c = 0; c < C; ++c) {
                    o[c] = 0;
                }
            }
        }
    }
}

/* mf_vec_dw: a depthwise int8 convolution (depth multiplier 1, any kernel, stride, dilation,
 * SAME/VALID), NHWC, batch 1. Each input row is widened once (x - x_zp, padding 0: TFLM skips
 * padding taps, which is the same) into a ring of (k_h - 1) * dil_h + 1 rows; per output row
 * and chunk of tw pixels, each tap is then one loop over tw * C contiguous lanes
 * acc[j] += row[j + offset] * w[tap][j], with the weights, bias and rq tiled tw times so that
 * lane j holds channel j % C.
 *   x int8 [h][w][c]; g: the geometry; w int16 [k_h * k_w][tw * c]; bias int32 [tw * c] (not
 *   folded); rq int32 [4][tw * c]; lo, hi, signfix as mf_vec_gemm; y int8 [out_h][out_w][c]
 *   scratch int32: ring tags [R], acc [tw * c], then the int16 rows (host.dw_scratch_words) */
MF_VEC_FN void mf_vec_dw(const int8_t *x, const int32_t *g, int32_t x_zp, const int16_t *w,
                         const int32_t *bias, const int32_t *rq, int32_t lo, int32_t hi,
                         int32_t signfix, int8_t *y, int32_t *scratch) {
    const int32_t C = g[MF_VD_C], KH = g[MF_VD_KH], KW = g[MF_VD_KW], SW = g[MF_VD_SW];
    const int32_t DH = g[MF_VD_DH], DW = g[MF_VD_DW], OW = g[MF_VD_OW], TW = g[MF_VD_TW];
    const int32_t R = (KH - 1) * DH + 1, wq = (OW - 1) * SW + (KW - 1) * DW + 1;
    const int32_t pw = (wq + SW - 1) / SW, slot = SW * pw * C, n_all = TW * C;
    int32_t *tags = scratch, *acc = scratch + R;
    int16_t *rows = (int16_t *)(void *)(acc + n_all);
    int32_t oy, ox0, ky, kx, j;
    for (j = 0; j < R; ++j) {
        tags[j] = -1;
    }
    for (oy = 0; oy < g[MF_VD_OH]; ++oy) {
        const int32_t iy0 = oy * g[MF_VD_SH] - g[MF_VD_PT];
        for (ky = 0; ky < KH; ++ky) {
            const int32_t iy = iy0 + ky * DH;
            if (iy >= 0 && iy < g[MF_VD_H] && tags[iy % R] != iy) {
                mf_vec_dw_row(x, g, x_zp, iy, wq, pw, rows + (iy % R) * slot);
                tags[iy % R] = iy;
            }
        }
        for (ox0 = 0; ox0 < OW; ox0 += TW) {
            const int32_t n = (OW - ox0 < TW ? OW - ox0 : TW) * C;
            for (j = 0; j < n; ++j) {
                acc[j] = bias[j];
            }
            for (ky = 0; ky < KH; ++ky) {
                const int32_t iy = iy0 + ky * DH;
                if (iy < 0 || iy >= g[MF_VD_H]) {
                    continue;
                }
                for (kx = 0; kx < KW; ++kx) {
                    const int16_t *src = rows + (iy % R) * slot + ((kx * DW) % SW) * pw * C
                                         + (ox0 + (kx * DW) / SW) * C;
                    const int16_t *wt = w + (ky * KW + kx) * n_all;
                    for (j = 0; j < n; ++j) {
                        acc[j] += src[j] * wt[j];
                    }
                }
            }
            mf_vec_requant(acc, rq, n, lo, hi, signfix, n_all,
                           y + ((int64_t)oy * OW + ox0) * C);
        }
    }
}

#endif /* MCUFORGE_VEC_H */
