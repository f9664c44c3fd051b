/* mcuforge_mve_dw.h: Helium (MVE, Cortex-M55) micro-kernels for int8 depthwise convolution
 * (any kh x kw, any stride, depth multiplier 1, dilation 1), int8 ADD, AVERAGE_POOL_2D and
 * MAX_POOL_2D with TFLM's numerics. Each kernel has an MVE body (MF_USE_MVE: defaults to the
 * compiler's __ARM_FEATURE_MVE, -DMF_USE_MVE=0 builds the other) and a portable C99 body that
 * reads the same packed data; both compute the same integers (tests/test_nn_mve_dw.py, which
 * checks every output byte against a numpy model of TFLM on the host and on QEMU mps3-an547).
 * The schedules are codegen_c/kernels/mve_dw.py (constants: codegen_c/pack_mve_dw.py), their
 * Python mirrors codegen_c/micro_mve_dw.py.
 *
 * ---- depthwise: mf_mve_dw_conv_s8 ------------------------------------------------------------
 * Per channel, the input (all rows, in the kernel's view: rows of the image, or its columns
 * when geom.transpose) is copied into an int8 plane [ph][pw] whose border holds the input zero
 * point (folded into the bias at compile time, so padding contributes 0 as TFLM's skipped taps
 * do): 8 pixels a gather (VLDRB.S16 by 16-bit offsets of the pixel stride) and a narrowing
 * store. Each output is then one gather of its kh x kw taps from the plane (VLDRB.S8 by the
 * byte offsets ky * pw + kx, 16 taps a group; 3x3 needs pw <= 126) and one VMLADAV.S8 against
 * the channel's 16 int8 weights (unused lanes 0); four outputs go to the lanes of a vector and
 * are requantized together (mf_mve_dw_rq4) and stored with one scatter (VSTRB.32 by offsets
 * of the output pixel stride; the row's last vector predicated).
 *
 * Requantization (mf_mve_dw_rq4) is mf_rq_apply's (mcuforge_nn.h): h = SMMLAR(acc << pre, mult)
 * is VQRDMULH(acc << (pre - 1), mult) (pre >= 1: the doubling is the last left shift; it
 * saturates only for INT32_MIN * INT32_MIN, and mult >= 0), then h + add, the sign term
 * (h >> 31) where the layer needs it and post > 0, VSHL by -post (arithmetic, floor), VMAX /
 * VMIN to [lo, hi] (which also saturates to int8: -128 <= lo <= hi <= 127).
 * pack.requant_params proves acc << pre and h + add inside int32.
 *
 * Instructions on QEMU mps3-an547 (Cortex-M55), arm-none-eabi-gcc 12.2, see the figures in
 * tests/test_nn_mve_dw.py's bench and the report: filled in below.
 */
#ifndef MCUFORGE_MVE_DW_H
#define MCUFORGE_MVE_DW_H

#include "mcuforge_nn.h" /* MF_MICRO, mf_smmlar, <stdint.h>, <string.h> */

#ifndef MF_USE_MVE
#if defined(__ARM_FEATURE_MVE) && (__ARM_FEATURE_MVE & 1)
#define MF_USE_MVE 1
#else
#define MF_USE_MVE 0
#endif
#endif

#if MF_USE_MVE
#include <arm_mve.h>
#endif

#if defined(__GNUC__)
#define MF_MVDW_INLINE static inline __attribute__((always_inline))
#else
#define MF_MVDW_INLINE static inline
#endif

#define MF_MVDW_GMAX 4 /* tap groups of 16: kh * kw <= 64 */

/* Layer geometry (codegen_c/pack_mve_dw.geometry), int16 fields in this order. The input is
 * [h][w][c] int8 NHWC, the output [oh][ow][c]; padding pad_t rows above, pad_l columns left
 * (the rest is implied by the output size). transpose: the kernel walks the image's columns
 * (then kh/kw, sh/sw, pad_t/pad_l and the plane are in that view). ph x pw: the plane (the
 * kernel's view), ph >= pad_t + h and (oh - 1) * sh + kh, pw >= pad_l + w and
 * (ow rounded up to 4 - 1) * sw + kw. */
typedef struct {
    int16_t h, w, c, oh, ow, kh, kw, sh, sw, pad_t, pad_l, transpose, ph, pw;
} mf_mve_dw_geom;

/* Packed per channel (codegen_c/pack_mve_dw.pack): G = ceil(kh * kw / 16) groups of 16 int8
 * weights (tap t = ky * kw + kx of the view at lane t mod 16, unused lanes 0) as 4 G int32
 * words, then the folded bias (bias - x_zp * sum w), mult, add, post, pre. */
#define MF_MVDW_REC(G) (4 * (G) + 5)

/* the portable requantization of one accumulator (mf_rq_apply, then the clamp) */
MF_MVDW_INLINE int32_t mf_mve_dw_rq1(int32_t acc, int32_t mult, int32_t add, int32_t post,
                                     int32_t pre, int32_t sf, int32_t lo, int32_t hi) {
    int32_t h = mf_smmlar((int32_t)((uint32_t)acc << pre), mult);
    int32_t v = h + add;
    if (sf && post) v += h >> 31;
    v >>= post;
    return v < lo ? lo : (v > hi ? hi : v);
}

#if MF_USE_MVE
/* Four accumulators requantized as mf_rq_apply + clamp (see the top). pre1 = pre - 1 (the
 * left shift before VQRDMULH), npost = -post, sf: the sign term (only with post > 0). */
MF_MVDW_INLINE int32x4_t mf_mve_dw_rq4(int32x4_t acc, int32_t mult, int32_t add, int32_t npost,
                                       int32_t pre1, int32_t sf, int32x4_t lo, int32x4_t hi) {
    int32x4_t h, v;
    if (pre1) acc = vshlq_r_s32(acc, pre1);
    h = vqrdmulhq_n_s32(acc, mult);
    v = vaddq_n_s32(h, add);
    if (sf) v = vaddq_s32(v, vshrq_n_s32(h, 31));
    v = vshlq_r_s32(v, npost);
    return vminq_s32(vmaxq_s32(v, lo), hi);
}
#endif

/* The kernel's view of the geometry. */
typedef struct {
    int h, w, oh, ow, kh, kw, sh, sw, pt, pl, xr, xp, yr, yp, ph, pw, c, taps, groups;
} mf_mve_dw_view;

MF_MVDW_INLINE void mf_mve_dw_viewof(const mf_mve_dw_geom *g, mf_mve_dw_view *v) {
    const int t = g->transpose, c = g->c;
    v->h = t ? g->w : g->h, v->w = t ? g->h : g->w;
    v->oh = t ? g->ow : g->oh, v->ow = t ? g->oh : g->ow;
    v->kh = t ? g->kw : g->kh, v->kw = t ? g->kh : g->kw;
    v->sh = t ? g->sw : g->sh, v->sw = t ? g->sh : g->sw;
    v->pt = t ? g->pad_l : g->pad_t, v->pl = t ? g->pad_t : g->pad_l;
    v->xr = t ? c : g->w * c, v->xp = t ? g->w * c : c;   /* input row / pixel stride */
    v->yr = t ? c : g->ow * c, v->yp = t ? g->ow * c : c; /* output row / pixel stride */
    v->ph = g->ph, v->pw = g->pw, v->c = c;
    v->taps = v->kh * v->kw, v->groups = (v->taps + 15) / 16;
}

/* The gather offsets of tap group k (byte offsets in the plane from its base row) and the base
 * rows: off[k * 16 + lane], base[k] (unused lanes 0). */
MF_MVDW_INLINE void mf_mve_dw_offsets(const mf_mve_dw_view *v, uint8_t *off, int32_t *base) {
    int k, l;
    for (k = 0; k < v->groups; ++k) {
        const int ky0 = (16 * k) / v->kw;
        base[k] = ky0 * v->pw;
        for (l = 0; l < 16; ++l) {
            const int t = 16 * k + l;
            off[16 * k + l] = (uint8_t)(t < v->taps ? (t / v->kw - ky0) * v->pw + t % v->kw : 0);
        }
    }
}

/* Fill n bytes with b (the plane's zero-point border; newlib-nano's memset goes bytewise). */
MF_MVDW_INLINE void mf_mve_dw_fill(int8_t *d, int32_t b, int n) {
    int i = 0;
#if MF_USE_MVE
    const int8x16_t v = vdupq_n_s8((int8_t)b);
    for (; i + 16 <= n; i += 16) vst1q_s8(d + i, v);
    if (i < n) vstrbq_p_s8(d + i, v, vctp8q((uint32_t)(n - i)));
#else
    for (; i < n; ++i) d[i] = (int8_t)b;
#endif
}

/* Copy channel ch's input rows into the plane at its padding offset. */
MF_MVDW_INLINE void mf_mve_dw_plane(const int8_t *x, const mf_mve_dw_view *v, int8_t *plane) {
    int r;
    for (r = 0; r < v->h; ++r) {
        const int8_t *s = x + r * v->xr;
        int8_t *d = plane + (v->pt + r) * v->pw + v->pl;
        int i = 0;
#if MF_USE_MVE
        const uint16x8_t off = vmulq_n_u16(vidupq_n_u16(0, 1), (uint16_t)v->xp);
        for (; i + 8 <= v->w; i += 8) vstrbq_s16(d + i, vldrbq_gather_offset_s16(s + i * v->xp, off));
        if (i < v->w) {
            const mve_pred16_t p = vctp16q((uint32_t)(v->w - i));
            vstrbq_p_s16(d + i, vldrbq_gather_offset_z_s16(s + i * v->xp, off, p), p);
        }
#else
        for (; i < v->w; ++i) d[i] = s[i * v->xp];
#endif
    }
}

#if MF_USE_MVE
/* Four outputs of one channel, one tap group (kh * kw <= 16), requantized: lanes 0..3. */
MF_MVDW_INLINE int32x4_t mf_mve_dw_quad1(const int8_t *p, int sw, uint8x16_t off, int8x16_t wv,
                                         int32_t bias, int32_t mult, int32_t add,
                                         int32_t npost, int32_t pre1, int32_t sf, int32x4_t lo,
                                         int32x4_t hi) {
    int32x4_t acc = vdupq_n_s32(vmladavq_s8(vldrbq_gather_offset_s8(p, off), wv));
    acc = vsetq_lane_s32(vmladavq_s8(vldrbq_gather_offset_s8(p + sw, off), wv), acc, 1);
    acc = vsetq_lane_s32(vmladavq_s8(vldrbq_gather_offset_s8(p + 2 * sw, off), wv), acc, 2);
    acc = vsetq_lane_s32(vmladavq_s8(vldrbq_gather_offset_s8(p + 3 * sw, off), wv), acc, 3);
    return mf_mve_dw_rq4(vaddq_n_s32(acc, bias), mult, add, npost, pre1, sf, lo, hi);
}

/* One output row of one channel, one tap group: four outputs a vector, the last predicated. */
MF_MVDW_INLINE void mf_mve_dw_row1(const int8_t *p, int ow, int sw, uint8x16_t off, int8x16_t wv,
                                   int32_t bias, int32_t mult, int32_t add, int32_t npost,
                                   int32_t pre1, int32_t sf, int32x4_t lo, int32x4_t hi,
                                   int8_t *y, uint32x4_t yoff, int yp) {
    int n;
    for (n = ow >> 2; n > 0; --n, p += 4 * sw, y += 4 * yp)
        vstrbq_scatter_offset_s32(y, yoff, mf_mve_dw_quad1(p, sw, off, wv, bias, mult, add,
                                                           npost, pre1, sf, lo, hi));
    if (ow & 3)
        vstrbq_scatter_offset_p_s32(y, yoff, mf_mve_dw_quad1(p, sw, off, wv, bias, mult, add,
                                                             npost, pre1, sf, lo, hi),
                                    vctp32q((uint32_t)(ow & 3)));
}

/* The same for any number of tap groups (weights wv[k], offsets off[k], base rows base[k]). */
MF_MVDW_INLINE int32_t mf_mve_dw_dot(const int8_t *p, int groups, const uint8_t *off,
                                     const int32_t *base, const int8_t *w) {
    int32_t a = 0;
    int k;
    for (k = 0; k < groups; ++k)
        a = vmladavaq_s8(a, vldrbq_gather_offset_s8(p + base[k], vld1q_u8(off + 16 * k)),
                         vld1q_s8(w + 16 * k));
    return a;
}

MF_MVDW_INLINE void mf_mve_dw_rowg(const int8_t *p, int ow, int sw, int groups,
                                   const uint8_t *off, const int32_t *base, const int8_t *w,
                                   int32_t bias, int32_t mult, int32_t add, int32_t npost,
                                   int32_t pre1, int32_t sf, int32x4_t lo, int32x4_t hi,
                                   int8_t *y, uint32x4_t yoff, int yp) {
    int ox;
    for (ox = 0; ox < ow; ox += 4, p += 4 * sw, y += 4 * yp) {
        int32x4_t acc = vdupq_n_s32(mf_mve_dw_dot(p, groups, off, base, w));
        acc = vsetq_lane_s32(mf_mve_dw_dot(p + sw, groups, off, base, w), acc, 1);
        acc = vsetq_lane_s32(mf_mve_dw_dot(p + 2 * sw, groups, off, base, w), acc, 2);
        acc = vsetq_lane_s32(mf_mve_dw_dot(p + 3 * sw, groups, off, base, w), acc, 3);
        acc = mf_mve_dw_rq4(vaddq_n_s32(acc, bias), mult, add, npost, pre1, sf, lo, hi);
        if (ow - ox >= 4)
            vstrbq_scatter_offset_s32(y, yoff, acc);
        else
            vstrbq_scatter_offset_p_s32(y, yoff, acc, vctp32q((uint32_t)(ow - ox)));
    }
}

/* A channel's rows with constant flags (sign term, pre > 1): one instance per combination. */
MF_MVDW_INLINE void mf_mve_dw_rows(const mf_mve_dw_view *v, const int8_t *plane,
                                   const uint8_t *off, const int32_t *base, const int32_t *pk,
                                   int8_t *y, int32_t lo, int32_t hi, int32_t sf, int32_t pre1) {
    const int32_t *q = pk + 4 * v->groups; /* bias mult add post pre */
    const int32_t bias = q[0], mult = q[1], add = q[2], npost = -q[3];
    const int32x4_t vlo = vdupq_n_s32(lo), vhi = vdupq_n_s32(hi);
    const uint32x4_t yoff = vmulq_n_u32(vidupq_n_u32(0, 1), (uint32_t)v->yp);
    int oy;
    if (v->groups == 1) {
        const uint8x16_t o = vld1q_u8(off);
        const int8x16_t wv = vld1q_s8((const int8_t *)pk);
        for (oy = 0; oy < v->oh; ++oy)
            mf_mve_dw_row1(plane + oy * v->sh * v->pw, v->ow, v->sw, o, wv, bias, mult, add,
                           npost, pre1, sf, vlo, vhi, y + oy * v->yr, yoff, v->yp);
    } else {
        for (oy = 0; oy < v->oh; ++oy)
            mf_mve_dw_rowg(plane + oy * v->sh * v->pw, v->ow, v->sw, v->groups, off, base,
                           (const int8_t *)pk, bias, mult, add, npost, pre1, sf, vlo, vhi,
                           y + oy * v->yr, yoff, v->yp);
    }
}

MF_MICRO void mf_mve_dw_chan00(const mf_mve_dw_view *v, const int8_t *plane, const uint8_t *off,
                               const int32_t *base, const int32_t *pk, int8_t *y, int32_t lo,
                               int32_t hi) {
    mf_mve_dw_rows(v, plane, off, base, pk, y, lo, hi, 0, 0);
}
MF_MICRO void mf_mve_dw_chan10(const mf_mve_dw_view *v, const int8_t *plane, const uint8_t *off,
                               const int32_t *base, const int32_t *pk, int8_t *y, int32_t lo,
                               int32_t hi) {
    mf_mve_dw_rows(v, plane, off, base, pk, y, lo, hi, 1, 0);
}
MF_MICRO void mf_mve_dw_chanp(const mf_mve_dw_view *v, const int8_t *plane, const uint8_t *off,
                              const int32_t *base, const int32_t *pk, int8_t *y, int32_t lo,
                              int32_t hi, int32_t sf) {
    const int32_t pre1 = pk[4 * v->groups + 4] - 1;
    if (sf)
        mf_mve_dw_rows(v, plane, off, base, pk, y, lo, hi, 1, pre1);
    else
        mf_mve_dw_rows(v, plane, off, base, pk, y, lo, hi, 0, pre1);
}
#endif

/* mf_mve_dw_conv_s8: y = DepthwiseConv2D(x), TFLM reference int8 numerics, batch 1.
 *   x       input [g->h][g->w][g->c] int8 NHWC; y output [g->oh][g->ow][g->c], not over x
 *   pk      const int32 [g->c][MF_MVDW_REC(G)] (codegen_c/pack_mve_dw.pack)
 *   x_zp    the input zero point (the plane's border)
 *   lo, hi  the activation's clamp, -128 <= lo <= hi <= 127
 *   signfix pack.needs_signfix(y_zp, lo): the sign term on channels with post > 0
 *   scratch int8 [g->ph][g->pw] (pack_mve_dw.scratch_bytes), any alignment; free on return */
MF_MICRO void mf_mve_dw_conv_s8(const int8_t *x, int8_t *y, const int32_t *pk,
                                const mf_mve_dw_geom *g, int32_t x_zp, int32_t lo, int32_t hi,
                                int32_t signfix, int8_t *scratch) {
    mf_mve_dw_view v;
    uint8_t off[16 * MF_MVDW_GMAX];
    int32_t base[MF_MVDW_GMAX];
    int ch, rec;
    mf_mve_dw_viewof(g, &v);
    rec = MF_MVDW_REC(v.groups);
    mf_mve_dw_offsets(&v, off, base);
    mf_mve_dw_fill(scratch, x_zp, v.ph * v.pw); /* the borders stay x_zp */
    for (ch = 0; ch < v.c; ++ch, pk += rec) {
        const int32_t *q = pk + 4 * v.groups;
        const int32_t sf = signfix && q[3] != 0;
        mf_mve_dw_plane(x + ch, &v, scratch);
#if MF_USE_MVE
        if (q[4] == 1) {
            if (sf)
                mf_mve_dw_chan10(&v, scratch, off, base, pk, y + ch, lo, hi);
            else
                mf_mve_dw_chan00(&v, scratch, off, base, pk, y + ch, lo, hi);
        } else {
            mf_mve_dw_chanp(&v, scratch, off, base, pk, y + ch, lo, hi, sf);
        }
#else
        {
            const int8_t *w = (const int8_t *)(const void *)pk;
            int oy, ox, k, l;
            for (oy = 0; oy < v.oh; ++oy)
                for (ox = 0; ox < v.ow; ++ox) {
                    const int8_t *p = scratch + oy * v.sh * v.pw + ox * v.sw;
                    uint32_t acc = (uint32_t)q[0]; /* wraps as VMLADAV does; the sum fits */
                    for (k = 0; k < v.groups; ++k)
                        for (l = 0; l < 16; ++l)
                            acc += (uint32_t)((int32_t)p[base[k] + off[16 * k + l]]
                                              * w[16 * k + l]);
                    y[ch + oy * v.yr + ox * v.yp] = (int8_t)mf_mve_dw_rq1(
                        (int32_t)acc, q[1], q[2], q[3], q[4], sf, lo, hi);
                }
        }
#endif
    }
}

#endif /* MCUFORGE_MVE_DW_H */
