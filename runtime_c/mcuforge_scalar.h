/* mcuforge_scalar.h: GEMM micro-kernels for cores without SIMD (Cortex-M3 / v7-M without the
 * DSP extension, RV32IMAC), portable C99, TFLM int8 numerics. The schedule
 * (codegen_c/kernels/scalar.py, mirrored in codegen_c/micro_scalar.py) picks them for targets
 * without `dsp` that are not the host; tests/test_nn_scalar.py checks every output byte
 * against a numpy model of TFLM on the host, QEMU mps2-an385 and riscv32-virt.
 *
 * For r < rows, o < O (input zero point folded into the bias, as in mcuforge_nn.h):
 *   y[r * y_stride + o] = clamp(mf_rq_apply(bias[o] + sum_{k<K} x_r[k] * w[o][k], &rq[o],
 *                                           signfix), lo, hi)
 *
 * Two weight formats (codegen_c/kernels/scalar.py packs them):
 *  - "l64" (v7-M: SMLAL, one instruction for a 32x32 -> 64-bit multiply-accumulate): two
 *    channels a, b in one int32 lane word w_a + w_b * 2^MF_SC_S; x * word summed into an int64
 *    gives sum x w_a + 2^S sum x w_b, two MACs a SMLAL. The low lane's sum stays inside its
 *    S-bit window while every chunk of L taps has sum |w_a| * 128 < 2^(S-1), which the
 *    schedule proves from the weights (else it shortens L, else declines); after each chunk
 *    the lanes are taken apart: low = the low S bits sign-extended, high = (acc - low) >> S.
 *    Layout: channels in blocks of 4 (zero channels pad the last), per block per tap k two
 *    words (channels 0+1, 2+3): word index (o / 4) * 2K + 2k + (o % 4) / 2.
 *    Block: 4 channels x 1 row (four int64 = 8 registers of the 13 of a v7-M core).
 *  - "m8" (RV32IMAC: no multiply-accumulate, 27 free registers): int8 weights, channels in
 *    blocks of 4, per block per tap the 4 channels' weights: index (o / 4) * 4K + 4k + o % 4;
 *    block 4 channels x 3 rows, 12 int32 accumulators, mul + add per MAC, 7 loads per 12 MACs.
 * rq[O] (mf_sc_rec: folded bias, mult, add, pre, post) per channel, unpadded.
 *
 * Convolutions (mf_sc_conv_*): per batch of P output pixels the int8 patches (im2col, padding
 * = x_zp, K bytes each) are gathered into scratch[P * K] and run as P rows.
 *
 * Measured (instructions; QEMU -icount; generated Makefile -O2), beside TFLM's reference
 * kernels on the Cortex-M4 (KWS 43.0 M, IC 107.4 M, VWW 100.3 M, AD 1.95 M): see the commit
 * log and the table at the end of this comment once filled in.
 * Cortex-M3 (mps2-an385, l64 with LDRD lane words, SSAT clamps), whole models, MAC/instr:
 *   KWS 5.12 M (0.518), ResNet-8 18.98 M (0.659), VWW 16.10 M (0.465), AD 0.360 M (0.734);
 *   l64 GEMM inner loop 19 instructions per 16 MACs (a 4-channel block, 4 taps); 3x3 convs
 *   0.66-0.79 MAC/instr, 1x1 K >= 64 0.63-0.78, depthwise 0.09-0.26 (its 4-output step:
 *   ~119 instructions, ~27 of them spills: 9 weights, 4 sums and the record exceed 13
 *   registers). Under --flash-budget the narrowed layers run m8 (12 accumulators spill on
 *   the M3): ~1.56 instructions a MAC more. */
#ifndef MCUFORGE_SCALAR_H
#define MCUFORGE_SCALAR_H

#include <stdint.h>
#include <string.h>

#include "mcuforge_nn.h" /* mf_rq, mf_conv_geom, MF_MICRO, MF_INLINE */

/* gcc's pre-register-allocation scheduler hoists the block's weight loads and spills
 * accumulators (rv32, 4 x 3 block: 93 instructions per 24 MACs in the loop, 69 without it) */
#if defined(__GNUC__) && !defined(__clang__)
#define MF_SC_NOSCHED __attribute__((optimize("no-schedule-insns")))
#else
#define MF_SC_NOSCHED
#endif

/* ... on RV32 only for the depthwise rows (VWW's depthwise layers 5.38 M -> 4.49 M
 * instructions there; on the M3 it costs 2.5 %) */
#if defined(__riscv)
#define MF_SC_NOSCHED_RV MF_SC_NOSCHED
#else
#define MF_SC_NOSCHED_RV
#endif

#define MF_SC_S 23 /* lane width of "l64": w_b * 2^23 + w_a fits int32 for int8 weights */

/* (a * b + 2^31) >> 32 without a 64-bit add: the high word plus bit 31 of the low word. */
static inline int32_t mf_sc_smmlar(int32_t a, int32_t b) {
    int64_t p = (int64_t)a * b;
    return (int32_t)(p >> 32) + (int32_t)((uint32_t)p >> 31);
}

/* Per channel output record (codegen_c/kernels/scalar.py rq_records): the folded bias and
 * mf_rq's fields. */
typedef struct {
    int32_t bias, mult, add, pre, post;
} mf_sc_rec;

/* Armv7-M (and every core with ACLE's saturation): the clamp to the whole int8 range is one
 * SSAT (gcc 12 emits two compares and two conditional moves for it). MF_SC_SAT8 versions the
 * kernels on lo = -128, hi = 127 (VWW's, KWS's and ResNet-8's layers) where it pays. */
#if defined(__GNUC__) && defined(__ARM_FEATURE_SAT) && defined(__arm__)
#include <arm_acle.h>
#define MF_SC_SAT8 1
#define MF_SC_FULL(lo, hi) ((lo) == -128 && (hi) == 127)
#else
#define MF_SC_SAT8 0
#define MF_SC_FULL(lo, hi) 0
#endif

/* clamp(mf_rq_apply(acc + bias)) (mcuforge_nn.h's form with a cheaper high multiply); SF: the
 * sign term, a constant where it is inlined */
MF_INLINE int8_t mf_sc_out(int32_t acc, const mf_sc_rec *q, int32_t SF, int32_t lo,
                           int32_t hi) {
    int32_t h = mf_sc_smmlar((int32_t)((uint32_t)(acc + q->bias) << q->pre), q->mult);
    int32_t v = h + q->add;
    if (SF) v += h >> 31 & -(q->post != 0);
    v >>= q->post;
#if MF_SC_SAT8
    if (lo == -128 && hi == 127) return (int8_t)__ssat(v, 8);
#endif
    v = v < lo ? lo : v;
    return (int8_t)(v > hi ? hi : v);
}

/* n <= 4 outputs of accumulators a0..a3 into y (records q), SF constant after inlining */
MF_INLINE void mf_sc_out4(int8_t *y, int32_t a0, int32_t a1, int32_t a2, int32_t a3,
                          const mf_sc_rec *q, int32_t n, int32_t SF, int32_t lo, int32_t hi) {
    if (n == 4) {
        y[0] = mf_sc_out(a0, q, SF, lo, hi);
        y[1] = mf_sc_out(a1, q + 1, SF, lo, hi);
        y[2] = mf_sc_out(a2, q + 2, SF, lo, hi);
        y[3] = mf_sc_out(a3, q + 3, SF, lo, hi);
        return;
    }
    y[0] = mf_sc_out(a0, q, SF, lo, hi);
    if (n > 1) y[1] = mf_sc_out(a1, q + 1, SF, lo, hi);
    if (n > 2) y[2] = mf_sc_out(a2, q + 2, SF, lo, hi);
}

MF_INLINE void mf_sc_store4(int8_t *y, int32_t a0, int32_t a1, int32_t a2, int32_t a3,
                            const mf_sc_rec *q, int32_t n, int32_t signfix, int32_t lo,
                            int32_t hi) {
    if (MF_SC_FULL(lo, hi)) { /* SSAT (constants after inlining) */
        if (signfix)
            mf_sc_out4(y, a0, a1, a2, a3, q, n, 1, -128, 127);
        else
            mf_sc_out4(y, a0, a1, a2, a3, q, n, 0, -128, 127);
    } else if (signfix)
        mf_sc_out4(y, a0, a1, a2, a3, q, n, 1, lo, hi);
    else
        mf_sc_out4(y, a0, a1, a2, a3, q, n, 0, lo, hi);
}

/* The two lanes of an "l64" chunk sum added into *pa, *pb. */
MF_INLINE void mf_sc_split(int64_t s, int32_t *pa, int32_t *pb) {
    int32_t lo = (int32_t)((uint32_t)s << (32 - MF_SC_S)) >> (32 - MF_SC_S);
    *pa += lo;
    *pb += (int32_t)((s - lo) >> MF_SC_S);
}

/* "l64": x rows (x_stride bytes apart, K taps), pw lane words, chunks of L taps (L >= 1;
 * L = K: one chunk). No scratch. */
/* adds the sum over n taps of x * the lane words to *ps0 (channels 0, 1) and *ps1 (2, 3);
 * advances *pw */
/* a tap's two lane words a = w[0], b = w[1], w += 2: one LDRD with post-increment on Thumb-2
 * (gcc 12 emits two LDRs with offsets and a pointer add: 24 -> 19 instructions per 4 taps of
 * a 4-channel block; M3 VWW 19.88 M -> 17.54 M, ResNet-8 23.52 M -> 19.44 M), plain C elsewhere */
#if defined(__GNUC__) && defined(__thumb2__)
#define MF_SC_LD2(a, b, w)                                                                    \
    __asm__("ldrd %0, %1, [%2], #8"                                                           \
            : "=&r"(a), "=&r"(b), "+r"(w)                                                    \
            : "m"(*(const int32_t(*)[2])(w)))
#else
#define MF_SC_LD2(a, b, w) ((a) = (w)[0], (b) = (w)[1], (w) += 2)
#endif

MF_INLINE void mf_sc_l64_taps(const int8_t *xp, int32_t n, const int32_t **pw, int64_t *ps0,
                              int64_t *ps1) {
    const int32_t *w = *pw;
    const int8_t *x4 = xp + (n & ~3), *xe = xp + n;
    int64_t s0 = *ps0, s1 = *ps1;
    int32_t wa, wb;
    for (; xp != x4; xp += 4) {
        int32_t v0 = xp[0], v1 = xp[1], v2 = xp[2], v3 = xp[3];
        MF_SC_LD2(wa, wb, w);
        s0 += (int64_t)v0 * wa;
        s1 += (int64_t)v0 * wb;
        MF_SC_LD2(wa, wb, w);
        s0 += (int64_t)v1 * wa;
        s1 += (int64_t)v1 * wb;
        MF_SC_LD2(wa, wb, w);
        s0 += (int64_t)v2 * wa;
        s1 += (int64_t)v2 * wb;
        MF_SC_LD2(wa, wb, w);
        s0 += (int64_t)v3 * wa;
        s1 += (int64_t)v3 * wb;
    }
    for (; xp != xe; xp++) {
        int32_t v0 = xp[0];
        MF_SC_LD2(wa, wb, w);
        s0 += (int64_t)v0 * wa;
        s1 += (int64_t)v0 * wb;
    }
    *pw = w;
    *ps0 = s0;
    *ps1 = s1;
}

MF_MICRO void mf_sc_gemm_l64(const int8_t *x, int32_t rows, int32_t x_stride, int32_t K,
                             int32_t L, const int32_t *pw, const mf_sc_rec *rq, int32_t O,
                             int32_t lo, int32_t hi, int32_t signfix, int8_t *y,
                             int32_t y_stride) {
    int32_t r, o;
    for (r = 0; r < rows; r++) {
        const int8_t *xr = x + r * x_stride;
        const int32_t *w = pw;
        for (o = 0; o < O; o += 4) {
            int32_t a0 = 0, a1 = 0, a2 = 0, a3 = 0;
            int64_t s0 = 0, s1 = 0;
            if (L >= K) { /* one chunk: the lanes split once */
                mf_sc_l64_taps(xr, K, &w, &s0, &s1);
                mf_sc_split(s0, &a0, &a1);
                mf_sc_split(s1, &a2, &a3);
            } else {
                int32_t k0;
                for (k0 = 0; k0 < K; k0 += L) {
                    s0 = s1 = 0;
                    mf_sc_l64_taps(xr + k0, K - k0 < L ? K - k0 : L, &w, &s0, &s1);
                    mf_sc_split(s0, &a0, &a1);
                    mf_sc_split(s1, &a2, &a3);
                }
            }
            mf_sc_store4(y + r * y_stride + o, a0, a1, a2, a3, rq + o, O - o < 4 ? O - o : 4,
                         signfix, lo, hi);
        }
    }
}

/* "m8": 4 channels x 3 rows (4 x 4 spills on gcc 12 rv32: 16 accumulators, 4 row pointers,
 * 4 weights and temporaries exceed its 27 free registers); rows past the end re-read the
 * last row (not stored). */
MF_MICRO MF_SC_NOSCHED void mf_sc_gemm_m8(const int8_t *x, int32_t rows, int32_t x_stride, int32_t K,
                            int32_t L, const int8_t *pw, const mf_sc_rec *rq, int32_t O,
                            int32_t lo, int32_t hi, int32_t signfix, int8_t *y,
                            int32_t y_stride) {
    int32_t r, o;
    (void)L;
    for (r = 0; r < rows; r += 3) {
        int32_t nr = rows - r < 3 ? rows - r : 3;
        const int8_t *x0 = x + r * x_stride;
        const int8_t *x1 = x0 + (nr > 1 ? x_stride : 0);
        const int8_t *x2 = x0 + (nr > 2 ? 2 * x_stride : 0);
        const int8_t *w = pw;
        for (o = 0; o < O; o += 4) {
            int32_t a00 = 0, a01 = 0, a02 = 0, a03 = 0, a10 = 0, a11 = 0, a12 = 0, a13 = 0;
            int32_t a20 = 0, a21 = 0, a22 = 0, a23 = 0;
            const int8_t *p0 = x0, *p1 = x1, *p2 = x2;
            const int8_t *wend = w + 4 * (K & ~1);
#define MF_SC_TAP(J)                                                                          \
    do {                                                                                      \
        int32_t w0 = w[4 * (J)], w1 = w[4 * (J) + 1], w2 = w[4 * (J) + 2], w3 = w[4 * (J) + 3]; \
        int32_t v = p0[J];                                                                    \
        a00 += v * w0; a01 += v * w1; a02 += v * w2; a03 += v * w3;                           \
        v = p1[J];                                                                            \
        a10 += v * w0; a11 += v * w1; a12 += v * w2; a13 += v * w3;                           \
        v = p2[J];                                                                            \
        a20 += v * w0; a21 += v * w1; a22 += v * w2; a23 += v * w3;                           \
    } while (0)
            while (w != wend) { /* 2 taps, immediate offsets, one pointer step each */
                MF_SC_TAP(0);
                MF_SC_TAP(1);
                w += 8;
                p0 += 2;
                p1 += 2;
                p2 += 2;
            }
            if (K & 1) {
                MF_SC_TAP(0);
                w += 4;
            }
#undef MF_SC_TAP
            {
                int32_t n = O - o < 4 ? O - o : 4;
                int8_t *yo = y + r * y_stride + o;
                mf_sc_store4(yo, a00, a01, a02, a03, rq + o, n, signfix, lo, hi);
                if (nr > 1) mf_sc_store4(yo + y_stride, a10, a11, a12, a13, rq + o, n, signfix, lo, hi);
                if (nr > 2)
                    mf_sc_store4(yo + 2 * y_stride, a20, a21, a22, a23, rq + o, n, signfix, lo, hi);
            }
        }
    }
}

/* Up to p patches of output pixels q0.. (row-major) gathered into buf[p][K]: padding x_zp. */
MF_INLINE void mf_sc_im2col(const int8_t *x, const mf_conv_geom *g, int32_t x_zp, int32_t q0,
                            int32_t p, int8_t *buf) {
    int32_t i, ky;
    int32_t c = g->in_c, seg = g->k_w * c;
    for (i = 0; i < p; i++) {
        int32_t oy = (q0 + i) / g->out_w, ox = (q0 + i) % g->out_w;
        int32_t iy0 = oy * g->stride_h - g->pad_t, ix0 = ox * g->stride_w - g->pad_l;
        int32_t xa = ix0 < 0 ? -ix0 : 0;
        int32_t xb = ix0 + g->k_w > g->in_w ? g->in_w - ix0 : g->k_w;
        for (ky = 0; ky < g->k_h; ky++) {
            int8_t *d = buf + ky * seg;
            int32_t iy = iy0 + ky;
            if (iy < 0 || iy >= g->in_h || xb <= xa) {
                memset(d, x_zp, (size_t)seg);
                continue;
            }
            if (xa > 0) memset(d, x_zp, (size_t)(xa * c));
            memcpy(d + xa * c, x + ((size_t)iy * g->in_w + ix0 + xa) * c, (size_t)((xb - xa) * c));
            if (xb < g->k_w) memset(d + xb * c, x_zp, (size_t)((g->k_w - xb) * c));
        }
        buf += g->k_h * seg;
    }
}

/* Convolutions: P patches a batch through the GEMM of the format; scratch: P * K bytes. */
#define MF_SC_CONV(NAME, GEMM, WT)                                                            \
    MF_MICRO void NAME(const int8_t *x, const mf_conv_geom *g, int32_t x_zp, int32_t P,       \
                       int32_t L, const WT *pw, const mf_sc_rec *rq, int32_t O,              \
                       int32_t lo, int32_t hi, int32_t signfix, int8_t *y,          \
                       int8_t *scratch) {                                                     \
        int32_t K = g->k_h * g->k_w * g->in_c, n = g->out_h * g->out_w, q;                    \
        for (q = 0; q < n; q += P) {                                                          \
            int32_t p = n - q < P ? n - q : P;                                                \
            mf_sc_im2col(x, g, x_zp, q, p, scratch);                                          \
            GEMM(scratch, p, K, K, L, pw, rq, O, lo, hi, signfix, y + q * O, O);         \
        }                                                                                     \
    }
MF_SC_CONV(mf_sc_conv_l64_im2col, mf_sc_gemm_l64, int32_t)
MF_SC_CONV(mf_sc_conv_m8, mf_sc_gemm_m8, int8_t)
#undef MF_SC_CONV

/* "l64" convolution without im2col where the lanes need one chunk (L >= K): a patch inside
 * the image is read in place, k_h row segments of k_w * in_c bytes (only patches touching the
 * padding are gathered into scratch); the same sums in the same tap order as the GEMM.
 * Measured on the M3 (VWW's 3x3 s2 3 -> 8): im2col alone cost 400 K of 1.84 M. */
#define MF_SC_MAX_KH 16
MF_MICRO void mf_sc_conv_l64(const int8_t *x, const mf_conv_geom *g, int32_t x_zp, int32_t P,
                             int32_t L, const int32_t *pw, const mf_sc_rec *rq, int32_t O,
                             int32_t lo, int32_t hi, int32_t signfix, int8_t *y,
                             int8_t *scratch) {
    int32_t kh = g->k_h, c = g->in_c, seg = g->k_w * c, rowb = g->in_w * c;
    int32_t oy, ox, o, ky;
    const int8_t *rows[MF_SC_MAX_KH];
    if (L < kh * seg || kh > MF_SC_MAX_KH) {
        mf_sc_conv_l64_im2col(x, g, x_zp, P, L, pw, rq, O, lo, hi, signfix, y, scratch);
        return;
    }
    for (oy = 0; oy < g->out_h; oy++) {
        int32_t iy0 = oy * g->stride_h - g->pad_t;
        for (ox = 0; ox < g->out_w; ox++, y += O) {
            int32_t ix0 = ox * g->stride_w - g->pad_l;
            const int32_t *w = pw;
            if (iy0 >= 0 && iy0 + kh <= g->in_h && ix0 >= 0 && ix0 + g->k_w <= g->in_w) {
                const int8_t *b = x + iy0 * rowb + ix0 * c;
                for (ky = 0; ky < kh; ky++) rows[ky] = b + ky * rowb;
            } else {
                mf_sc_im2col(x, g, x_zp, oy * g->out_w + ox, 1, scratch);
                for (ky = 0; ky < kh; ky++) rows[ky] = scratch + ky * seg;
            }
            for (o = 0; o < O; o += 4) {
                int32_t a0 = 0, a1 = 0, a2 = 0, a3 = 0;
                int64_t s0 = 0, s1 = 0;
                for (ky = 0; ky < kh; ky++) mf_sc_l64_taps(rows[ky], seg, &w, &s0, &s1);
                mf_sc_split(s0, &a0, &a1);
                mf_sc_split(s1, &a2, &a3);
                mf_sc_store4(y + o, a0, a1, a2, a3, rq + o, O - o < 4 ? O - o : 4, signfix, lo,
                             hi);
            }
        }
    }
}

/* ==== depthwise 3x3, depth multiplier 1 (any stride, any padding) ============================
 * Per channel: the input plane (with its padding, = x_zp) copied once into scratch as int8
 * [PH][PW], so the 9 taps of an output are plain loads with immediate offsets (no bounds checks
 * in the tap loop); the channel's 9 weights and its record stay in registers across its plane.
 * The plane may be the image transposed (rows of the kernel = columns of the image: KWS's 25x5
 * walks rows of 25), set by the strides in the geometry:
 *   g[0..14] = VH, VW (the plane's source image), C, VOH, VOW, stride_y, stride_x, pad_y, pad_x,
 *              in_ys, in_xs (bytes between source rows / columns in x), out_ys, out_xs (bytes
 *              between output rows / columns in y), PH, PW (the plane: (VOH-1)*sy+3,
 *              (VOW-1)*sx+3).
 * pk per channel 14 int32: the 9 weights in plane order (ky, kx), then mf_sc_rec.
 * scratch: PH * PW bytes. */
#define MF_SC_DW_REC 14

/* The image's part of a channel's plane (the border, x_zp, is the same for every channel:
 * mf_sc_dw3 fills the whole plane once). */
MF_INLINE void mf_sc_dw_plane(const int8_t *x, const int32_t *g, int8_t *p) {
    int32_t vh = g[0], vw = g[1], pt = g[7], pl = g[8], ys = g[9], xs = g[10];
    int32_t ph = g[13], pw = g[14];
    int32_t xa = pl < pw ? pl : pw;                       /* first image column in the plane */
    int32_t xb = pl + vw < pw ? pl + vw : pw;             /* its end */
    int32_t ya = pt < ph ? pt : ph, yb = pt + vh < ph ? pt + vh : ph, py;
    for (py = ya; py < yb; py++) {
        const int8_t *src = x + (py - pt) * ys + (xa - pl) * xs;
        int8_t *d = p + py * pw + xa, *e = p + py * pw + xb;
        for (; d + 2 <= e; d += 2, src += 2 * xs) {
            int8_t v0 = src[0], v1 = src[xs];
            d[0] = v0;
            d[1] = v1;
        }
        if (d < e) *d = *src;
    }
}

/* one kernel row (weights u0..u2) of 4 adjacent outputs a..d at stride 1: columns 0..5 */
#define MF_SC_DW_ROW4(q, u0, u1, u2)                                                          \
    do {                                                                                      \
        const int8_t *q_ = (q);                                                               \
        int32_t k0 = (u0), k1 = (u1), k2 = (u2), v;                                           \
        v = q_[0]; a += v * k0;                                                               \
        v = q_[1]; a += v * k1; b += v * k0;                                                  \
        v = q_[2]; a += v * k2; b += v * k1; c += v * k0;                                     \
        v = q_[3]; b += v * k2; c += v * k1; d += v * k0;                                     \
        v = q_[4]; c += v * k2; d += v * k1;                                                  \
        v = q_[5]; d += v * k2;                                                               \
    } while (0)
/* one kernel row of 2 outputs a, b at stride 2: columns 0..4 */
#define MF_SC_DW_ROW2S2(q, u0, u1, u2)                                                        \
    do {                                                                                      \
        const int8_t *q_ = (q);                                                               \
        int32_t k0 = (u0), k1 = (u1), k2 = (u2), v;                                           \
        v = q_[0]; a += v * k0;                                                               \
        v = q_[1]; a += v * k1;                                                               \
        v = q_[2]; a += v * k2; b += v * k0;                                                  \
        v = q_[3]; b += v * k1;                                                               \
        v = q_[4]; b += v * k2;                                                               \
    } while (0)

MF_INLINE void mf_sc_dw_rows(const int8_t *p, int8_t *y, const int32_t *q, const int32_t *g,
                             int32_t SF, int32_t lo, int32_t hi) {
    int32_t voh = g[3], vow = g[4], sy = g[5], sx = g[6], oys = g[11], oxs = g[12];
    int32_t pw = g[14], oy, ox;
    /* locals: the int8 stores could alias the table, which gcc would then reload */
    int32_t w0 = q[0], w1 = q[1], w2 = q[2], w3 = q[3], w4 = q[4], w5 = q[5], w6 = q[6],
            w7 = q[7], w8 = q[8];
    mf_sc_rec rec;
    rec.bias = q[9];
    rec.mult = q[10];
    rec.add = q[11];
    rec.pre = q[12];
    rec.post = q[13];
    for (oy = 0; oy < voh; oy++) {
        const int8_t *r = p + oy * sy * pw;
        int8_t *yo = y + oy * oys;
        ox = 0;
        if (sx == 1) { /* four outputs a step: 6 loads and 3 weights a kernel row */
            for (; ox + 4 <= vow; ox += 4, r += 4, yo += 4 * oxs) {
                int32_t a = 0, b = 0, c = 0, d = 0;
                MF_SC_DW_ROW4(r, w0, w1, w2);
                MF_SC_DW_ROW4(r + pw, w3, w4, w5);
                MF_SC_DW_ROW4(r + 2 * pw, w6, w7, w8);
                yo[0] = mf_sc_out(a, &rec, SF, lo, hi);
                yo[oxs] = mf_sc_out(b, &rec, SF, lo, hi);
                yo[2 * oxs] = mf_sc_out(c, &rec, SF, lo, hi);
                yo[3 * oxs] = mf_sc_out(d, &rec, SF, lo, hi);
            }
        } else if (sx == 2) { /* two outputs a step: 5 loads a kernel row */
            for (; ox + 2 <= vow; ox += 2, r += 4, yo += 2 * oxs) {
                int32_t a = 0, b = 0;
                MF_SC_DW_ROW2S2(r, w0, w1, w2);
                MF_SC_DW_ROW2S2(r + pw, w3, w4, w5);
                MF_SC_DW_ROW2S2(r + 2 * pw, w6, w7, w8);
                yo[0] = mf_sc_out(a, &rec, SF, lo, hi);
                yo[oxs] = mf_sc_out(b, &rec, SF, lo, hi);
            }
        }
        for (; ox < vow; ox++, r += sx, yo += oxs) {
            int32_t acc = r[0] * w0 + r[1] * w1 + r[2] * w2;
            acc += r[pw] * w3 + r[pw + 1] * w4 + r[pw + 2] * w5;
            acc += r[2 * pw] * w6 + r[2 * pw + 1] * w7 + r[2 * pw + 2] * w8;
            *yo = mf_sc_out(acc, &rec, SF, lo, hi);
        }
    }
}

MF_MICRO MF_SC_NOSCHED_RV void mf_sc_dw3(const int8_t *x, int8_t *y, const int32_t *pk, const int32_t *g,
                        int32_t x_zp, int32_t lo, int32_t hi, int32_t signfix, int8_t *scratch) {
    int32_t c, nc = g[2];
    memset(scratch, x_zp, (size_t)(g[13] * g[14])); /* the border of every channel's plane */
    for (c = 0; c < nc; c++, pk += MF_SC_DW_REC) {
        mf_sc_dw_plane(x + c, g, scratch);
        if (MF_SC_FULL(lo, hi)) { /* SSAT */
            if (signfix)
                mf_sc_dw_rows(scratch, y + c, pk, g, 1, -128, 127);
            else
                mf_sc_dw_rows(scratch, y + c, pk, g, 0, -128, 127);
        } else if (signfix)
            mf_sc_dw_rows(scratch, y + c, pk, g, 1, lo, hi);
        else
            mf_sc_dw_rows(scratch, y + c, pk, g, 0, lo, hi);
    }
}

#endif
