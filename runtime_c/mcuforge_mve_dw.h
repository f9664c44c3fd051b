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
 * of the output pixel stride; the row's last vector predicated). Where kh * (kw + sw) <= 16
 * (3x3 at stride 1 or 2) one gather holds the windows of two neighbouring outputs, weighed by
 * two weight vectors: 2 gathers and 4 VMLADAV per 4 outputs.
 *
 * Requantization (mf_mve_dw_rq4) is mf_rq_apply's (mcuforge_nn.h): h = SMMLAR(acc << pre, mult)
 * is VQRDMULH(acc << (pre - 1), mult) (pre >= 1: the doubling is the last left shift; it
 * saturates only for INT32_MIN * INT32_MIN, and mult >= 0), then h + add, the sign term
 * (h >> 31) where the layer needs it and post > 0, VSHL by -post (arithmetic, floor), VMAX /
 * VMIN to [lo, hi] (which also saturates to int8: -128 <= lo <= hi <= 127).
 * pack.requant_params proves acc << pre and h + add inside int32.
 *
 * At every -O level the channels whose constants allow it (pair layout,
 * pre = 1, stride 1 or 2) run asm loops: along a row, 19 instructions for 4 outputs (2 gathers,
 * 4 VMLADAV, 2 two-lane VMOVs, the requantization, a scatter store), a row's last 1..3 outputs
 * as one more quad ending at the row's end; or, for small layers (flat), from a table of
 * window offsets: 20 (pairs of neighbours) or 25 (single windows) for 4 outputs; +2 with the
 * sign term. The one-plane copy is an asm loop too. At -O0 too (VWW at -O0: 27.3 M
 * instructions, 36.9 M with the C loops). -DMF_MVDW_NO_ASM: the C loops (intrinsics).
 *
 * Instructions on QEMU mps3-an547 (Cortex-M55), arm-none-eabi-gcc 12.2, the layers of
 * tests/nn_bench/mve_dw_bench.py (random constants), -O2 / -Os:
 *   KWS 25x5x64 s1   63,125 / 72,094  (1.14 / 1.00 MAC/instr)
 *   VWW 48x48x8 s1  101,562 / 105,750 (1.63 / 1.57)   48x48x16 s2  65,688 / 69,875 (1.26)
 *   VWW 24x24x32 s1 118,312 / 126,656 (1.40 / 1.31)   24x24x32 s2  42,281 / 43,281 (0.98)
 *   VWW 12x12x64 s1  60,062 / 65,344  (1.38 / 1.27)   12x12x64 s2  25,688 / 30,812 (0.81)
 *   VWW 6x6x128 s1   38,719 / 41,656  (1.07 / 1.00)   6x6x128 s2   29,156 / 31,781 (0.36)
 *   VWW 3x3x256 s1   50,688 / 52,281  (0.41 / 0.40)
 * (-Os before the asm loops ran there: 85,625 for KWS's layer, 159,875 for VWW's 48x48x8.)
 * Per output: ~4.75 instructions in the quads; the rest is per row, per channel (weights,
 * constants, the plane copy: ~50-100 a channel), which dominates the small layers.
 * Recommended: -O2 (or -O3).
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

/* the asm loops (gcc, every -O level; -DMF_MVDW_NO_ASM turns them off). Their core-register
 * operands sit in fixed registers (MF_MVDW_FIXED_REGS), so they compile at -O0, -O2, -O3 and
 * -Os with or without -fno-omit-frame-pointer (tests/test_nn_mve_dw.py runs them on QEMU,
 * tests/test_mve_fp.py compiles the generated models). */
#if MF_USE_MVE && defined(__GNUC__) && !defined(MF_MVDW_NO_ASM)
#define MF_MVDW_HAVE_ASM 1
#else
#define MF_MVDW_HAVE_ASM 0
#endif

/* always inlined when optimizing; at -O0 each helper is one function (inlined there, every
 * caller kept a copy of every branch: VWW's code no longer fit the M55's 512 KB flash) */
#if defined(__GNUC__) && defined(__OPTIMIZE__)
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
 * (ow rounded up to 4 - 1) * sw + kw (the quads' gathers stay in a row; the pair layout's
 * single-window gathers may not: see the scratch argument of mf_mve_dw_conv_s8). pair: see
 * MF_MVDW_REC. cg: channels a pass (1, or 8 where 8 planes are small: they are copied together,
 * 8 channels of a pixel a load). flat (small images, transpose 0): the outputs walked as one
 * sequence, four a vector whatever their rows, their windows from a table in the scratch (no
 * per-row cost, no per-row tail). */
typedef struct {
    int16_t h, w, c, oh, ow, kh, kw, sh, sw, pad_t, pad_l, transpose, ph, pw, pair, cg, flat;
} mf_mve_dw_geom;

/* Packed per channel (codegen_c/pack_mve_dw.pack_dw), as int32 words: the folded bias
 * (bias - x_zp * sum w), mult, add, post, pre, then the int8 weights. With geom.pair
 * (kh * (kw + sw) <= 16, sw <= 4: one gather holds the windows of two neighbouring outputs) a
 * zero word and one vector of 16, w[ky][kx] at lane ky * (kw + sw) + kx (the second output's
 * weights are the same 16 bytes loaded sw bytes earlier: lane ky * (kw + sw) + kx + sw, zeros
 * from the zero word); 10 words. Else G = ceil(kh * kw / 16) groups of 16 (tap t = ky * kw + kx
 * at lane t mod 16 of group t / 16); 5 + 4 G words. Unused lanes 0; kh, kw, sw of the view. */
#define MF_MVDW_REC(PAIR, G) ((PAIR) ? 10 : 4 * (G) + 5)
#define MF_MVDW_W(PAIR) ((PAIR) ? 6 : 5) /* the weights' first word */

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
    int h, w, oh, ow, kh, kw, sh, sw, pt, pl, xr, xp, yr, yp, ph, pw, c, taps, groups, pair, cg;
    int flat, units2; /* units2: the flat walk's table holds pairs of neighbours (ow even) */
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
    v->taps = v->kh * v->kw, v->groups = (v->taps + 15) / 16, v->pair = g->pair;
    v->cg = g->cg, v->flat = g->flat, v->units2 = g->flat && g->pair && !(v->ow & 1);
}

/* The flat walk's table (int32, 4-byte aligned after the planes): the window offset in the
 * plane of each unit (a pair of neighbours, or one output), padded to whole quads with copies
 * of the last unit (the unpredicated asm walk stores their outputs again at the same place). */
MF_MVDW_INLINE int32_t *mf_mve_dw_table(const mf_mve_dw_view *v, int8_t *scratch) {
    int32_t *t = (int32_t *)(void *)(((uintptr_t)(scratch + v->cg * v->ph * v->pw) + 3u)
                                     & ~(uintptr_t)3u);
    const int total = v->oh * v->ow, step = v->units2 ? 2 : 1;
    const int n = (total + 3) / 4 * (4 / step);
    int u, i;
    for (u = 0, i = 0; u < n; ++u, i += step) {
        const int j = i < total ? i : total - step; /* the last unit */
        t[u] = (j / v->ow) * v->sh * v->pw + (j % v->ow) * v->sw;
    }
    return t;
}

/* The gather offsets of tap group k (byte offsets in the plane from its base row) and the base
 * rows: off[k * 16 + lane], base[k] (unused lanes 0). */
MF_MVDW_INLINE void mf_mve_dw_offsets(const mf_mve_dw_view *v, uint8_t *off, int32_t *base) {
    int k, l;
    if (v->pair) { /* kh rows of kw + sw taps: the windows of two neighbouring outputs */
        const int n = v->kw + v->sw;
        base[0] = 0;
        for (l = 0; l < 16; ++l)
            off[l] = (uint8_t)(l < v->kh * n ? (l / n) * v->pw + l % n : 0);
        return;
    }
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

/* Copy one channel's input rows (x: its first byte) into the plane at its padding offset. The
 * view's fields go to locals first: the int8 stores could alias *v and force reloads. */
MF_MVDW_INLINE void mf_mve_dw_plane(const int8_t *x, const mf_mve_dw_view *v, int8_t *plane) {
    const int h = v->h, w = v->w, xr = v->xr, xp = v->xp, pw = v->pw;
    int8_t *d = plane + v->pt * pw + v->pl;
    int r;
#if MF_MVDW_HAVE_ASM
    /* all rows in one asm loop: 7 instructions a row and 4 every 16 pixels (pixel stride
     * <= 17: byte gathers of 16 lanes) or 8 (halfword lanes), +4 for the row's last ones
     * (predicated), where gcc's loops spend ~16 a row and 4 every 8 pixels. The narrowing
     * VSTRB.16's base must be a low register (r0-r7): the "l" constraint. */
    /* pinned registers, as the loops below (MF_MVDW_FIXED_REGS); e low for the VSTRB.16 */
    register const int8_t *rx __asm__("r1") = x;
    register int8_t *rd __asm__("r3") = d;
    register int rr __asm__("r4");
    register const int8_t *s __asm__("r5");
    register int8_t *e __asm__("r6");
    register int rxr __asm__("r9") = xr, rpw __asm__("r10") = pw;
#define MF_MVDW_PLANE_ASM(LD, ST, NB, Q, OFF, TAIL, ...)                                       \
    __asm__ volatile("2:\n\t"                                                                  \
                     "mov    %[s], %[x]\n\t"                                                  \
                     "mov    %[e], %[d]\n\t"                                                  \
                     "wls    lr, %[full], 4f\n"                                               \
                     "3:\n\t"                                                                  \
                     LD "  %q[q], [%[s], %q[o]]\n\t"                                           \
                     "add    %[s], %[s], %[st]\n\t"                                           \
                     ST "  %q[q], [%[e]], %[n]\n\t"                                            \
                     "le     lr, 3b\n"                                                         \
                     "4:\n\t" TAIL                                                             \
                     "add    %[x], %[x], %[xr]\n\t"                                           \
                     "add    %[d], %[d], %[pw]\n\t"                                           \
                     "subs   %[h], %[h], #1\n\t"                                              \
                     "bne    2b"                                                              \
                     : [x] "+r"(rx), [d] "+r"(rd), [h] "+r"(rr), [s] "=&r"(s), [e] "=&l"(e), \
                       [q] "=&w"(Q)                                                           \
                     : [full] "r"(rfull), [xr] "r"(rxr), [pw] "r"(rpw), [st] "r"(rstep),    \
                       [o] "w"(OFF), [n] "i"(NB)__VA_ARGS__                                   \
                     : "lr", "cc", "memory")
    rr = h;
    if (rr <= 0) return;
    if (15 * xp <= 255) { /* 16 pixels a gather (8-bit offsets) */
        const uint8x16_t off = vmulq_n_u8(vidupq_n_u8(0, 1), (uint8_t)xp);
        const int tail = w & 15;
        register const int rfull __asm__("r8") = w >> 4, rstep __asm__("r12") = 16 * xp;
        uint8x16_t q;
        if (tail) {
            const mve_pred16_t p = vctp8q((uint32_t)tail);
            MF_MVDW_PLANE_ASM("vldrb.u8", "vstrb.8", 16, q, off,
                              "vpst\n\tvldrbt.u8  %q[q], [%[s], %q[o]]\n\t"
                              "vpst\n\tvstrbt.8  %q[q], [%[e]]\n\t", , [p] "Up"(p));
        } else {
            MF_MVDW_PLANE_ASM("vldrb.u8", "vstrb.8", 16, q, off, "", );
        }
        (void)q;
    } else {
        const uint16x8_t off = vmulq_n_u16(vidupq_n_u16(0, 1), (uint16_t)xp);
        const int tail = w & 7;
        register const int rfull __asm__("r8") = w >> 3, rstep __asm__("r12") = 8 * xp;
        uint16x8_t q;
        if (tail) {
            const mve_pred16_t p = vctp16q((uint32_t)tail);
            MF_MVDW_PLANE_ASM("vldrb.u16", "vstrb.16", 8, q, off,
                              "vpst\n\tvldrbt.u16  %q[q], [%[s], %q[o]]\n\t"
                              "vpst\n\tvstrbt.16  %q[q], [%[e]]\n\t", , [p] "Up"(p));
        } else {
            MF_MVDW_PLANE_ASM("vldrb.u16", "vstrb.16", 8, q, off, "", );
        }
        (void)q;
    }
#undef MF_MVDW_PLANE_ASM
    (void)s, (void)e, (void)r, (void)rx, (void)rd;
#elif MF_USE_MVE
    const uint16x8_t off = vmulq_n_u16(vidupq_n_u16(0, 1), (uint16_t)xp);
    const int full = w >> 3, tail = w & 7, step = 8 * xp;
    const mve_pred16_t p = vctp16q((uint32_t)tail);
    for (r = h; r > 0; --r, x += xr, d += pw) {
        const int8_t *s = x;
        int8_t *e = d;
        int n;
        for (n = full; n > 0; --n, s += step, e += 8)
            vstrbq_s16(e, vldrbq_gather_offset_s16(s, off));
        if (tail) vstrbq_p_s16(e, vldrbq_gather_offset_z_s16(s, off, p), p);
    }
#else
    for (r = h; r > 0; --r, x += xr, d += pw) {
        int i;
        for (i = 0; i < w; ++i) d[i] = x[i * xp];
    }
#endif
}

/* Copy nc <= 8 channels' input rows (x: the first channel's first byte) into nc planes of
 * ph * pw bytes from plane: a pixel's channels one load, one scatter store (offsets of a plane). */
MF_MVDW_INLINE void mf_mve_dw_planes8(const int8_t *x, const mf_mve_dw_view *v, int8_t *plane,
                                      int nc) {
    const int h = v->h, w = v->w, xr = v->xr, xp = v->xp, pw = v->pw, size = v->ph * v->pw;
    int8_t *d = plane + v->pt * pw + v->pl;
    int r;
#if MF_USE_MVE
    const uint16x8_t off = vmulq_n_u16(vidupq_n_u16(0, 1), (uint16_t)size);
    const mve_pred16_t p = vctp16q((uint32_t)nc);
    for (r = h; r > 0; --r, x += xr, d += pw) {
        const int8_t *s = x;
        int8_t *e = d;
        int n;
        if (nc == 8)
            for (n = w; n > 0; --n, s += xp, ++e)
                vstrbq_scatter_offset_s16(e, off, vldrbq_s16(s));
        else
            for (n = w; n > 0; --n, s += xp, ++e)
                vstrbq_scatter_offset_p_s16(e, off, vldrbq_z_s16(s, p), p);
    }
#else
    for (r = h; r > 0; --r, x += xr, d += pw) {
        int i, k;
        for (i = 0; i < w; ++i)
            for (k = 0; k < nc; ++k) d[k * size + i] = x[i * xp + k];
    }
#endif
}

#if MF_USE_MVE
/* lanes 0..3 of a vector from four registers. Single-lane moves: the two-lane VMOV
 * (Qd[2], Qd[0], Rt, Rt2) would save two instructions a quad, but gcc 12 (vcreateq: lane 2 from
 * Rt) and QEMU 7.2 (lane 0 from Rt) disagree about its lane order. */
MF_MVDW_INLINE int32x4_t mf_mve_dw_lanes(int32_t a0, int32_t a1, int32_t a2, int32_t a3) {
    int32x4_t v = vdupq_n_s32(a0);
    v = vsetq_lane_s32(a1, v, 1);
    v = vsetq_lane_s32(a2, v, 2);
    return vsetq_lane_s32(a3, v, 3);
}

/* Four outputs of one channel from p (the first one's window), before requantization.
 * pair: one gather holds the windows of two neighbours (kh rows of kw + sw taps), weighed by wa
 * (the first's taps) and wb (the second's); else one gather a window and group (off, base, w:
 * the groups' offsets, base rows, weights). */
MF_MVDW_INLINE int32x4_t mf_mve_dw_quad_pair(const int8_t *p, int sw, uint8x16_t o, int8x16_t wa,
                                             int8x16_t wb) {
    const int8x16_t g0 = vldrbq_gather_offset_s8(p, o);
    const int8x16_t g1 = vldrbq_gather_offset_s8(p + 2 * sw, o);
    return mf_mve_dw_lanes(vmladavq_s8(g0, wa), vmladavq_s8(g0, wb), vmladavq_s8(g1, wa),
                           vmladavq_s8(g1, wb));
}

MF_MVDW_INLINE int32x4_t mf_mve_dw_quad_groups(const int8_t *p, int sw, int groups,
                                               const uint8_t *off, const int32_t *base,
                                               const int8_t *w) {
    int32_t a[4] = {0, 0, 0, 0};
    int j, k;
    for (j = 0; j < 4; ++j)
        for (k = 0; k < groups; ++k)
            a[j] = vmladavaq_s8(a[j], vldrbq_gather_offset_s8(p + j * sw + base[k],
                                                              vld1q_u8(off + 16 * k)),
                                vld1q_s8(w + 16 * k));
    return mf_mve_dw_lanes(a[0], a[1], a[2], a[3]);
}

#if MF_MVDW_HAVE_ASM
/* The asm loops below put two VMLADAV results into a vector with one VMOV of two lanes
 * (VMOV Qd[2], Qd[0], Rt, Rt2, then Qd[3], Qd[1]): outputs 0 and 1 of a quad go to lanes
 * {0, 2}, outputs 2 and 3 to lanes {1, 3}. Which of the two lanes takes Rt is left open (gcc 12
 * and QEMU 7.2 disagree): the store's offset vector is built by the same two instructions from
 * the outputs' offsets (mf_mve_dw_yoff2), so each value lands beside its own offset either way,
 * and no lane is predicated off (a quad's unused lanes repeat a used one, offset and value). */
MF_MVDW_INLINE uint32x4_t mf_mve_dw_yoff2(uint32_t o0, uint32_t o1, uint32_t o2, uint32_t o3) {
    uint32x4_t q = vdupq_n_u32(0);
    __asm__("vmov  %q[q][2], %q[q][0], %[a], %[b]\n\t"
            "vmov  %q[q][3], %q[q][1], %[c], %[d]"
            : [q] "+w"(q)
            : [a] "r"(o0), [b] "r"(o1), [c] "r"(o2), [d] "r"(o3));
    return q;
}

/* The requantization of the quad in %q[A] (mf_mve_dw_rq4 with pre = 1) and its store. */
#define MF_MVDW_RQ_ASM(SF, A)                                                                  \
    "vadd.i32  %q[" A "], %q[" A "], %[bias]\n\t"                                              \
    "vqrdmulh.s32  %q[" A "], %q[" A "], %[mult]\n\t"                                          \
    SF                                                                                         \
    "vadd.i32  %q[" A "], %q[" A "], %[add]\n\t"                                               \
    "vshl.s32  %q[" A "], %[np]\n\t"                                                           \
    "vmax.s32  %q[" A "], %q[" A "], %q[lo]\n\t"                                               \
    "vmin.s32  %q[" A "], %q[" A "], %q[hi]\n\t"                                               \
    "vstrb.32  %q[" A "], [%[y], %q[yo]]\n\t"
/* the sign term: on the accumulator %q[a] (temporary %q[g]), or the other way round */
#define MF_MVDW_SF_ASM "vshr.s32  %q[g], %q[a], #31\n\tvadd.i32  %q[a], %q[a], %q[g]\n\t"
#define MF_MVDW_SF_ASM_G "vshr.s32  %q[a], %q[g], #31\n\tvadd.i32  %q[g], %q[g], %q[a]\n\t"

/* The asm loops' core-register operands sit in fixed registers: r0 and r2 (VMLADAV's even
 * destinations), lr (the loop count), the pointer P (p or t) r1, y r3, the constants r4 r5 r6
 * r8, the output step r9 (the flat walk's plane r10); r7 (the Thumb frame pointer), r11 and
 * r12 are left to gcc. Left to gcc's choice ("r"), its register allocator reloads a spilled
 * operand into a low register (r0-r7, for the 16-bit LDR from the stack), ran out of them
 * and failed with "impossible constraints" at -Os, and with -fno-omit-frame-pointer at -O2
 * and -O3 too. Pinned, the loops compile at every -O level with or without a frame pointer
 * (VWW at -O2: 2,151,125 instructions against 2,152,906 unpinned). */
#define MF_MVDW_FIXED_REGS(T, P, Y)                                                             \
    register T rp __asm__("r1") = (P);                                                         \
    register int8_t *ry __asm__("r3") = (Y);                                                   \
    register int32_t rbias __asm__("r4") = bias, rmult __asm__("r5") = mult;                   \
    register int32_t radd __asm__("r6") = add, rnp __asm__("r8") = npost;                      \
    register int rys __asm__("r9") = ystep

/* n >= 1 quads of the pair layout along a row as one asm loop: 19 instructions for 4 outputs,
 * 21 with the sign term. VMLADAV needs an even accumulator register: r0 and r2, reused (r0
 * also as the second window's address). SF: the sign term; SW: the stride, an immediate. */
#define MF_MVDW_PAIR_ASM(SF, SW)                                                               \
    __asm__ volatile("dls    lr, lr\n"                                                         \
                     "1:\n\t"                                                                  \
                     "vldrb.u8  %q[g], [%[p], %q[o]]\n\t"                                      \
                     "vmladav.s8  r0, %q[g], %q[wa]\n\t"                                       \
                     "vmladav.s8  r2, %q[g], %q[wb]\n\t"                                       \
                     "vmov  %q[a][2], %q[a][0], r0, r2\n\t"                                    \
                     "add    r0, %[p], %[s2]\n\t"                                             \
                     "vldrb.u8  %q[g], [r0, %q[o]]\n\t"                                        \
                     "vmladav.s8  r0, %q[g], %q[wa]\n\t"                                       \
                     "vmladav.s8  r2, %q[g], %q[wb]\n\t"                                       \
                     "vmov  %q[a][3], %q[a][1], r0, r2\n\t"                                    \
                     MF_MVDW_RQ_ASM(SF, "a")                                                   \
                     "add    %[p], %[p], %[s4]\n\t"                                           \
                     "add    %[y], %[y], %[ys]\n\t"                                            \
                     "le     lr, 1b\n\t"                                                       \
                     : [p] "+r"(rp), [y] "+r"(ry), [g] "=&w"(g), [a] "=&w"(a), "+r"(cnt)      \
                     : [o] "w"(o), [wa] "w"(wa), [wb] "w"(wb), [lo] "w"(lo), [hi] "w"(hi),    \
                       [yo] "w"(yoff), [bias] "r"(rbias), [mult] "r"(rmult), [add] "r"(radd), \
                       [np] "r"(rnp), [s2] "i"(2 * SW), [s4] "i"(4 * SW), [ys] "r"(rys)       \
                     : "r0", "r2", "memory")
/* yoff: mf_mve_dw_yoff2 of the four outputs' offsets */
MF_MVDW_INLINE void mf_mve_dw_pairs_asm(const int8_t *p, int n, int sw, uint8x16_t o,
                                        int8x16_t wa, int8x16_t wb, int32_t bias, int32_t mult,
                                        int32_t add, int32_t npost, int32_t sf, int32x4_t lo,
                                        int32x4_t hi, int8_t *y, uint32x4_t yoff, int ystep) {
    MF_MVDW_FIXED_REGS(const int8_t *, p, y);
    register int cnt __asm__("lr") = n;
    int8x16_t g;
    int32x4_t a;
    if (sf && sw == 1)
        MF_MVDW_PAIR_ASM(MF_MVDW_SF_ASM, 1);
    else if (sw == 1)
        MF_MVDW_PAIR_ASM("", 1);
    else if (sf)
        MF_MVDW_PAIR_ASM(MF_MVDW_SF_ASM, 2);
    else
        MF_MVDW_PAIR_ASM("", 2);
    (void)g, (void)a, (void)rp, (void)ry, (void)cnt;
}

/* n >= 1 quads of the flat walk from the table t (offsets in the plane pl): 20 instructions
 * for 4 outputs from pairs of neighbours (two table entries a quad), 25 from single windows
 * (four); 2 more with the sign term. The quad is built in %q[g] (the gathers alternate). */
#define MF_MVDW_FLAT2_ASM(SF)                                                                  \
    __asm__ volatile("dls    lr, lr\n"                                                         \
                     "1:\n\t"                                                                  \
                     "ldrd   r0, r2, [%[t]], #8\n\t"                                           \
                     "add    r0, r0, %[pl]\n\t"                                               \
                     "add    r2, r2, %[pl]\n\t"                                               \
                     "vldrb.u8  %q[g], [r0, %q[o]]\n\t"                                        \
                     "vldrb.u8  %q[a], [r2, %q[o]]\n\t"                                        \
                     "vmladav.s8  r0, %q[g], %q[wa]\n\t"                                       \
                     "vmladav.s8  r2, %q[g], %q[wb]\n\t"                                       \
                     "vmov  %q[g][2], %q[g][0], r0, r2\n\t"                                    \
                     "vmladav.s8  r0, %q[a], %q[wa]\n\t"                                       \
                     "vmladav.s8  r2, %q[a], %q[wb]\n\t"                                       \
                     "vmov  %q[g][3], %q[g][1], r0, r2\n\t"                                    \
                     MF_MVDW_RQ_ASM(SF, "g")                                                   \
                     "add    %[y], %[y], %[ys]\n\t"                                            \
                     "le     lr, 1b\n\t"                                                       \
                     : [t] "+r"(rp), [y] "+r"(ry), [g] "=&w"(g), [a] "=&w"(a), "+r"(cnt)      \
                     : [pl] "r"(rpl), [o] "w"(o), [wa] "w"(wa), [wb] "w"(wb), [lo] "w"(lo),   \
                       [hi] "w"(hi), [yo] "w"(yoff), [bias] "r"(rbias), [mult] "r"(rmult),    \
                       [add] "r"(radd), [np] "r"(rnp), [ys] "r"(rys)                          \
                     : "r0", "r2", "memory")
#define MF_MVDW_FLAT1_ASM(SF)                                                                  \
    __asm__ volatile("dls    lr, lr\n"                                                         \
                     "1:\n\t"                                                                  \
                     "ldrd   r0, r2, [%[t]], #8\n\t"                                           \
                     "add    r0, r0, %[pl]\n\t"                                               \
                     "add    r2, r2, %[pl]\n\t"                                               \
                     "vldrb.u8  %q[g], [r0, %q[o]]\n\t"                                        \
                     "vldrb.u8  %q[a], [r2, %q[o]]\n\t"                                        \
                     "vmladav.s8  r0, %q[g], %q[wa]\n\t"                                       \
                     "vmladav.s8  r2, %q[a], %q[wa]\n\t"                                       \
                     "vmov  %q[g][2], %q[g][0], r0, r2\n\t"                                    \
                     "ldrd   r0, r2, [%[t]], #8\n\t"                                           \
                     "add    r0, r0, %[pl]\n\t"                                               \
                     "add    r2, r2, %[pl]\n\t"                                               \
                     "vldrb.u8  %q[a], [r0, %q[o]]\n\t"                                        \
                     "vmladav.s8  r0, %q[a], %q[wa]\n\t"                                       \
                     "vldrb.u8  %q[a], [r2, %q[o]]\n\t"                                        \
                     "vmladav.s8  r2, %q[a], %q[wa]\n\t"                                       \
                     "vmov  %q[g][3], %q[g][1], r0, r2\n\t"                                    \
                     MF_MVDW_RQ_ASM(SF, "g")                                                   \
                     "add    %[y], %[y], %[ys]\n\t"                                            \
                     "le     lr, 1b\n\t"                                                       \
                     : [t] "+r"(rp), [y] "+r"(ry), [g] "=&w"(g), [a] "=&w"(a), "+r"(cnt)      \
                     : [pl] "r"(rpl), [o] "w"(o), [wa] "w"(wa), [lo] "w"(lo), [hi] "w"(hi),   \
                       [yo] "w"(yoff), [bias] "r"(rbias), [mult] "r"(rmult), [add] "r"(radd), \
                       [np] "r"(rnp), [ys] "r"(rys)                                           \
                     : "r0", "r2", "memory")
MF_MVDW_INLINE void mf_mve_dw_flat_asm(const int8_t *plane, const int32_t *t, int n, int units2,
                                       uint8x16_t o, int8x16_t wa, int8x16_t wb, int32_t bias,
                                       int32_t mult, int32_t add, int32_t npost, int32_t sf,
                                       int32x4_t lo, int32x4_t hi, int8_t *y, uint32x4_t yoff,
                                       int ystep) {
    MF_MVDW_FIXED_REGS(const int32_t *, t, y);
    register const int8_t *rpl __asm__("r10") = plane;
    register int cnt __asm__("lr") = n;
    int8x16_t g;
    int32x4_t a;
    if (units2 && sf)
        MF_MVDW_FLAT2_ASM(MF_MVDW_SF_ASM_G);
    else if (units2)
        MF_MVDW_FLAT2_ASM("");
    else if (sf)
        MF_MVDW_FLAT1_ASM(MF_MVDW_SF_ASM_G);
    else
        MF_MVDW_FLAT1_ASM("");
    (void)g, (void)a, (void)wb, (void)rp, (void)ry, (void)rpl, (void)cnt;
}
#endif

/* nch channels from x (planes copied one at a time), records pk, outputs y: four outputs a
 * vector, each row's last vector predicated. pair layouts with stride sw (1 or 2 in the fast
 * instances), the sign term sf and pre = 1 constant there; `gen` (the general instance):
 * any layout, sf and pre per channel. */
/* Four flat-walk outputs from the table entries t: pairs (units2) or single windows. */
MF_MVDW_INLINE int32x4_t mf_mve_dw_quad_flat(const int8_t *plane, const int32_t *t, int units2,
                                             int pair, int groups, uint8x16_t o, int8x16_t wa,
                                             int8x16_t wb, const uint8_t *off,
                                             const int32_t *base, const int8_t *w) {
    if (units2) {
        const int8x16_t g0 = vldrbq_gather_offset_s8(plane + t[0], o);
        const int8x16_t g1 = vldrbq_gather_offset_s8(plane + t[1], o);
        return mf_mve_dw_lanes(vmladavq_s8(g0, wa), vmladavq_s8(g0, wb), vmladavq_s8(g1, wa),
                               vmladavq_s8(g1, wb));
    }
    if (pair || groups == 1) /* the pair layout's first window is the output's */
        return mf_mve_dw_lanes(vmladavq_s8(vldrbq_gather_offset_s8(plane + t[0], o), wa),
                               vmladavq_s8(vldrbq_gather_offset_s8(plane + t[1], o), wa),
                               vmladavq_s8(vldrbq_gather_offset_s8(plane + t[2], o), wa),
                               vmladavq_s8(vldrbq_gather_offset_s8(plane + t[3], o), wa));
    {
        int32_t a[4] = {0, 0, 0, 0};
        int j, k;
        for (j = 0; j < 4; ++j)
            for (k = 0; k < groups; ++k)
                a[j] = vmladavaq_s8(a[j], vldrbq_gather_offset_s8(plane + t[j] + base[k],
                                                                  vld1q_u8(off + 16 * k)),
                                    vld1q_s8(w + 16 * k));
        return mf_mve_dw_lanes(a[0], a[1], a[2], a[3]);
    }
}

/* The flat walk of one channel (units2 constant in each instance). */
MF_MVDW_INLINE void mf_mve_dw_flat(const mf_mve_dw_view *v, const int8_t *plane,
                                   const int32_t *t, int units2, int pair, uint8x16_t o,
                                   int8x16_t wa, int8x16_t wb, const uint8_t *off,
                                   const int32_t *base, const int8_t *w, int32_t bias,
                                   int32_t mult, int32_t add, int32_t npost, int32_t pre1,
                                   int32_t sf, int32x4_t lo, int32x4_t hi, int8_t *y,
                                   uint32x4_t yoff, int ystep) {
    const int total = v->oh * v->ow, groups = v->groups;
    int n;
    for (n = total >> 2; n > 0; --n, t += units2 ? 2 : 4, y += ystep)
        vstrbq_scatter_offset_s32(
            y, yoff,
            mf_mve_dw_rq4(vaddq_n_s32(mf_mve_dw_quad_flat(plane, t, units2, pair, groups, o, wa,
                                                          wb, off, base, w),
                                      bias),
                          mult, add, npost, pre1, sf, lo, hi));
    if (total & 3)
        vstrbq_scatter_offset_p_s32(
            y, yoff,
            mf_mve_dw_rq4(vaddq_n_s32(mf_mve_dw_quad_flat(plane, t, units2, pair, groups, o, wa,
                                                          wb, off, base, w),
                                      bias),
                          mult, add, npost, pre1, sf, lo, hi),
            vctp32q((uint32_t)(total & 3)));
}

MF_MVDW_INLINE void mf_mve_dw_chans(const mf_mve_dw_view *v, const int8_t *x, int8_t *y,
                                    const int32_t *pk, int nch, int8_t *plane, int pstep,
                                    const uint8_t *off, const int32_t *base, int32_t lo,
                                    int32_t hi, int32_t signfix, int gen, int sw, int32_t sf,
                                    const int32_t *table) {
    const int pair = gen ? v->pair : 1, rec = MF_MVDW_REC(pair, v->groups);
    const uint8x16_t o = vld1q_u8(off);
    const int32x4_t vlo = vdupq_n_s32(lo), vhi = vdupq_n_s32(hi);
    const uint32x4_t yoff = vmulq_n_u32(vidupq_n_u32(0, 1), (uint32_t)v->yp);
    const int ow = v->ow, ystep = 4 * v->yp, step = v->sh * v->pw, nq = ow >> 2, tail = ow & 3;
    int k;
#if MF_MVDW_HAVE_ASM
    /* the asm walks' store offsets (mf_mve_dw_yoff2): a full quad, and the flat walk's last
     * quad of r = total % 4 outputs (its unused lanes repeat the last output, or pair) */
    const uint32_t yp = (uint32_t)v->yp, r = (uint32_t)(v->oh * v->ow) & 3u;
    const uint32x4_t yoff2 = mf_mve_dw_yoff2(0u, yp, 2u * yp, 3u * yp);
    const uint32x4_t ytail = v->units2 ? mf_mve_dw_yoff2(0u, yp, 0u, yp)
                             : mf_mve_dw_yoff2(0u, (r > 1u ? 1u : 0u) * yp,
                                               (r > 2u ? 2u : r - 1u) * yp, (r - 1u) * yp);
#endif
    if (gen) sw = v->sw;
#if MF_MVDW_HAVE_ASM
    if (!gen && v->flat) { /* the fast flat walks: little more than the asm a channel */
        const int total = v->oh * v->ow, nq = total >> 2, u2 = v->units2;
        const int32_t *tt = table + nq * (u2 ? 2 : 4);
        for (k = 0; k < nch; ++k, pk += MF_MVDW_REC(1, 1), ++x, ++y, plane += pstep) {
            const int8_t *w = (const int8_t *)(pk + MF_MVDW_W(1));
            const int8x16_t wa = vld1q_s8(w), wb = vld1q_s8(w - sw);
            if (!pstep) mf_mve_dw_plane(x, v, plane);
            if (nq)
                mf_mve_dw_flat_asm(plane, table, nq, u2, o, wa, wb, pk[0], pk[1], pk[2], -pk[3],
                                   sf, vlo, vhi, y, yoff2, ystep);
            if (r)
                mf_mve_dw_flat_asm(plane, tt, 1, u2, o, wa, wb, pk[0], pk[1], pk[2], -pk[3], sf,
                                   vlo, vhi, y + nq * ystep, ytail, ystep);
        }
        return;
    }
    if (!gen && ow >= 4) { /* the fast rows: the asm quads, and a row's last 1..3 outputs as
                            * one more quad ending at its end (the outputs it repeats are
                            * stored again, the same values) */
        const int back = ow - 4, yp = v->yp, yrs = v->yr;
        for (k = 0; k < nch; ++k, pk += MF_MVDW_REC(1, 1), ++x, ++y, plane += pstep) {
            const int8_t *w = (const int8_t *)(pk + MF_MVDW_W(1));
            const int8x16_t wa = vld1q_s8(w), wb = vld1q_s8(w - sw);
            const int32_t bias = pk[0], mult = pk[1], add = pk[2], npost = -pk[3];
            const int8_t *row = plane;
            int8_t *yr = y;
            int oy;
            if (!pstep) mf_mve_dw_plane(x, v, plane);
            for (oy = v->oh; oy > 0; --oy, row += step, yr += yrs) {
                mf_mve_dw_pairs_asm(row, nq, sw, o, wa, wb, bias, mult, add, npost, sf, vlo, vhi,
                                    yr, yoff2, ystep);
                if (tail)
                    mf_mve_dw_pairs_asm(row + back * sw, 1, sw, o, wa, wb, bias, mult, add, npost,
                                        sf, vlo, vhi, yr + back * yp, yoff2, ystep);
            }
        }
        return;
    }
#endif
    for (k = 0; k < nch; ++k, pk += rec, ++x, ++y, plane += pstep) {
        const int8_t *w = (const int8_t *)(pk + MF_MVDW_W(pair));
        const int8x16_t wa = vld1q_s8(w), wb = pair ? vld1q_s8(w - sw) : wa; /* MF_MVDW_REC */
        const int32_t *q = pk; /* bias mult add post pre */
        const int32_t bias = q[0], mult = q[1], add = q[2], npost = -q[3];
        const int32_t csf = gen ? signfix && q[3] != 0 : sf, pre1 = gen ? q[4] - 1 : 0;
        const int8_t *row = plane;
        int8_t *yr = y;
        int oy;
        if (!pstep) mf_mve_dw_plane(x, v, plane); /* one plane: copied here */
        if (v->flat) { /* one walk over all outputs: consecutive, yp apart */
#if MF_MVDW_HAVE_ASM
            if (!gen) { /* the fast instances: the pair layout, pre = 1 */
                const int total = v->oh * v->ow, nq = total >> 2;
                if (nq)
                    mf_mve_dw_flat_asm(plane, table, nq, v->units2, o, wa, wb, bias, mult, add,
                                       npost, csf, vlo, vhi, yr, yoff2, ystep);
                if (r)
                    mf_mve_dw_flat_asm(plane, table + nq * (v->units2 ? 2 : 4), 1, v->units2,
                                       o, wa, wb, bias, mult, add, npost, csf, vlo, vhi,
                                       yr + nq * ystep, ytail, ystep);
                continue;
            }
#endif
            if (v->units2)
                mf_mve_dw_flat(v, plane, table, 1, pair, o, wa, wb, off, base, w, bias, mult,
                               add, npost, pre1, csf, vlo, vhi, yr, yoff, ystep);
            else
                mf_mve_dw_flat(v, plane, table, 0, pair, o, wa, wb, off, base, w, bias, mult,
                               add, npost, pre1, csf, vlo, vhi, yr, yoff, ystep);
            continue;
        }
        for (oy = v->oh; oy > 0; --oy, row += step, yr += v->yr) {
            const int8_t *p = row;
            int8_t *yy = yr;
            int n;
#if MF_MVDW_HAVE_ASM
            if (!gen && nq) { /* the fast instances: the pair layout, pre = 1 */
                mf_mve_dw_pairs_asm(p, nq, sw, o, wa, wb, bias, mult, add, npost, csf, vlo, vhi,
                                    yy, yoff2, ystep);
                p += 4 * sw * nq, yy += ystep * nq, n = 0;
            } else {
                n = nq;
            }
#else
            n = nq;
#endif
            for (; n > 0; --n, p += 4 * sw, yy += ystep) {
                int32x4_t acc = pair ? mf_mve_dw_quad_pair(p, sw, o, wa, wb)
                                     : mf_mve_dw_quad_groups(p, sw, v->groups, off, base, w);
                acc = mf_mve_dw_rq4(vaddq_n_s32(acc, bias), mult, add, npost, pre1, csf, vlo,
                                    vhi);
                vstrbq_scatter_offset_s32(yy, yoff, acc);
            }
            if (tail) {
                int32x4_t acc = pair ? mf_mve_dw_quad_pair(p, sw, o, wa, wb)
                                     : mf_mve_dw_quad_groups(p, sw, v->groups, off, base, w);
                acc = mf_mve_dw_rq4(vaddq_n_s32(acc, bias), mult, add, npost, pre1, csf, vlo,
                                    vhi);
                vstrbq_scatter_offset_p_s32(yy, yoff, acc, vctp32q((uint32_t)tail));
            }
        }
    }
}

typedef void (*mf_mve_dw_chans_fn)(const mf_mve_dw_view *, const int8_t *, int8_t *,
                                   const int32_t *, int, int8_t *, int, const uint8_t *,
                                   const int32_t *, int32_t, int32_t, int32_t, const int32_t *);
#define MF_MVDW_CHANS(NAME, GEN, SW, SF)                                                       \
    MF_MICRO void NAME(const mf_mve_dw_view *v, const int8_t *x, int8_t *y, const int32_t *pk,   \
                       int nch, int8_t *plane, int pstep, const uint8_t *off,                   \
                       const int32_t *base, int32_t lo, int32_t hi, int32_t signfix,            \
                       const int32_t *table) {                                                 \
        mf_mve_dw_chans(v, x, y, pk, nch, plane, pstep, off, base, lo, hi, signfix, GEN, SW,    \
                        SF, table);                                                            \
    }
MF_MVDW_CHANS(mf_mve_dw_chans_gen, 1, 1, 0)
MF_MVDW_CHANS(mf_mve_dw_chans_p1, 0, 1, 0)
MF_MVDW_CHANS(mf_mve_dw_chans_p1f, 0, 1, 1)
MF_MVDW_CHANS(mf_mve_dw_chans_p2, 0, 2, 0)
MF_MVDW_CHANS(mf_mve_dw_chans_p2f, 0, 2, 1)
#endif

/* mf_mve_dw_conv_s8: y = DepthwiseConv2D(x), TFLM reference int8 numerics, batch 1.
 *   x       input [g->h][g->w][g->c] int8 NHWC; y output [g->oh][g->ow][g->c]. y may overlap
 *           x as codegen_c/kernels/inplace.channels allows: channels are walked in passes
 *           (g->cg channels, or one), each pass reads all its channels' input into the planes
 *           before it writes any of their outputs, and reads no other channel's input
 *   pk      const int32 [g->c][MF_MVDW_REC(g->pair, G)] (codegen_c/pack_mve_dw.pack_dw)
 *   x_zp    the input zero point (the plane's border)
 *   lo, hi  the activation's clamp, -128 <= lo <= hi <= 127
 *   signfix pack.needs_signfix(y_zp, lo): the sign term on channels with post > 0
 *   scratch int8 [g->cg][g->ph][g->pw], then (flat) the table: pack_mve_dw.scratch_bytes,
 *           any alignment; free on return. With the pair layout the gathers read up to sw
 *           bytes past the last plane (a window's gather spans kw + sw columns and the
 *           portable body gathers it for every output: the last one's ends sw bytes past pw
 *           where pw = (ow - 1) * sw + kw); those bytes are weighed by 0 but must exist:
 *           scratch_bytes counts them (pack_mve_dw.reach; flat: they are the table's) */
MF_MICRO void mf_mve_dw_conv_s8(const int8_t *x, int8_t *y, const int32_t *pk,
                                const mf_mve_dw_geom *g, int32_t x_zp, int32_t lo, int32_t hi,
                                int32_t signfix, int8_t *scratch) {
    mf_mve_dw_view v;
    uint8_t off[16 * MF_MVDW_GMAX];
    int32_t base[MF_MVDW_GMAX];
    int c0, rec, size;
#if MF_USE_MVE
    const int32_t *table;
#endif
    mf_mve_dw_viewof(g, &v);
    rec = MF_MVDW_REC(v.pair, v.groups);
    size = v.ph * v.pw;
    mf_mve_dw_offsets(&v, off, base);
    mf_mve_dw_fill(scratch, x_zp, v.cg * size); /* the borders stay x_zp */
#if MF_USE_MVE
    table = v.flat ? mf_mve_dw_table(&v, scratch) : 0;
#endif
    /* cg > 1: passes of cg channels whose planes are copied together; else one pass of all
     * channels, each plane copied by its channel's loop */
    for (c0 = 0; c0 < v.c; c0 += v.cg > 1 ? v.cg : v.c) {
        const int pstep = v.cg > 1 ? size : 0;
        const int nc = !pstep ? v.c : v.c - c0 < v.cg ? v.c - c0 : v.cg;
        int ch;
        if (pstep) mf_mve_dw_planes8(x + c0, &v, scratch, nc);
#if MF_USE_MVE
        /* runs of channels of one instance: pair layout, pre = 1 and stride 1 or 2 take the
         * fast ones (sign term by channel: signfix and post > 0), the rest the general one */
        for (ch = 0; ch < nc;) {
            const int32_t *q = pk;
            const int fast = v.pair && q[4] == 1 && (v.sw == 1 || v.sw == 2);
            const int sf = signfix && q[3] != 0;
            mf_mve_dw_chans_fn fn = !fast ? mf_mve_dw_chans_gen
                                  : v.sw == 1 ? (sf ? mf_mve_dw_chans_p1f : mf_mve_dw_chans_p1)
                                              : (sf ? mf_mve_dw_chans_p2f : mf_mve_dw_chans_p2);
            int n = 1;
            while (ch + n < nc) {
                const int32_t *r = pk + n * rec;
                if ((v.pair && r[4] == 1 && (v.sw == 1 || v.sw == 2)) != fast
                    || (fast && (signfix && r[3] != 0) != sf))
                    break;
                ++n;
            }
            fn(&v, x + c0 + ch, y + c0 + ch, pk, n, scratch + ch * pstep, pstep, off, base, lo,
               hi, signfix, table);
            ch += n, pk += n * rec;
        }
#else
        for (ch = 0; ch < nc; ++ch, pk += rec) {
            const int32_t *q = pk; /* bias mult add post pre */
            const int32_t sf = signfix && q[3] != 0;
            const int8_t *w = (const int8_t *)(const void *)(pk + MF_MVDW_W(v.pair));
            const int8_t *plane = scratch + ch * pstep;
            int oy, ox, k, l;
            if (!pstep) mf_mve_dw_plane(x + c0 + ch, &v, scratch);
            for (oy = 0; oy < v.oh; ++oy)
                for (ox = 0; ox < v.ow; ++ox) {
                    const int8_t *p = plane + oy * v.sh * v.pw + ox * v.sw;
                    uint32_t acc = (uint32_t)q[0]; /* wraps as VMLADAV does; the sum fits */
                    for (k = 0; k < (v.pair ? 1 : v.groups); ++k)
                        for (l = 0; l < 16; ++l)
                            acc += (uint32_t)((int32_t)p[base[k] + off[16 * k + l]]
                                              * w[16 * k + l]);
                    y[c0 + ch + oy * v.yr + ox * v.yp] = (int8_t)mf_mve_dw_rq1(
                        (int32_t)acc, q[1], q[2], q[3], q[4], sf, lo, hi);
                }
        }
#endif
    }
}

/* ---- int8 ADD, same-shape inputs: mf_mve_dw_add_s8 ------------------------------------------
 * The arithmetic of mf_ew_add_s8 (mcuforge_ew.h; constants from pack_ew.add_constants, which
 * proves them on all 65536 input pairs): s2 = T[small byte] + (big << 20), h = SMMLAR(s2, mult),
 * y = clamp((h + add + sf * (h >> 31)) >> post, lo, hi) with the int8 saturation. On MVE four
 * elements a step: VLDRB.S32 (big), VLDRB.U32 (small: the table index), VLDRW gather of the
 * table, VMLA by 2^20, VRMULH, VADD, VSHL by -post, VMAX, VMIN, VSTRB.32 (the sign term 2 more);
 * the last step predicated. y may be one of the inputs. */
#if MF_USE_MVE
MF_MVDW_INLINE int32x4_t mf_mve_dw_add4(int32x4_t tb, int32x4_t b, int32x4_t vm, int32_t add,
                                        int32_t npost, int32_t sf, int32x4_t lo, int32x4_t hi) {
    const int32x4_t h = vrmulhq_s32(vmlaq_n_s32(tb, b, 1 << 20), vm);
    int32x4_t v = vaddq_n_s32(h, add);
    if (sf) v = vaddq_s32(v, vshrq_n_s32(h, 31));
    return vminq_s32(vmaxq_s32(vshlq_r_s32(v, npost), lo), hi);
}

/* the loop with the sign term constant (one instance each) */
MF_MVDW_INLINE void mf_mve_dw_add_loop(const int8_t *big, const uint8_t *u, int8_t *y, int32_t n,
                                       const int32_t *tab, int32_t mult, int32_t add,
                                       int32_t post, int32_t sf, int32_t lo, int32_t hi) {
    const int32x4_t vm = vdupq_n_s32(mult), vlo = vdupq_n_s32(lo), vhi = vdupq_n_s32(hi);
    const int32_t npost = -post;
    int32_t k;
    for (k = n >> 2; k > 0; --k, big += 4, u += 4, y += 4)
        vstrbq_s32(y, mf_mve_dw_add4(vldrwq_gather_shifted_offset_s32(tab, vldrbq_u32(u)),
                                     vldrbq_s32(big), vm, add, npost, sf, vlo, vhi));
    if (n & 3) {
        const mve_pred16_t pr = vctp32q((uint32_t)(n & 3));
        vstrbq_p_s32(y, mf_mve_dw_add4(vldrwq_gather_shifted_offset_z_s32(
                                           tab, vldrbq_z_u32(u, pr), pr),
                                       vldrbq_z_s32(big, pr), vm, add, npost, sf, vlo, vhi),
                     pr);
    }
}
#endif

MF_MICRO void mf_mve_dw_add_s8(const int8_t *big, const int8_t *small, int8_t *y, int32_t n,
                               const int32_t *tab, int32_t mult, int32_t add, int32_t post,
                               int32_t signfix, int32_t lo, int32_t hi) {
    const uint8_t *u = (const uint8_t *)small; /* the table's index: the byte */
    const int32_t l = lo < -128 ? -128 : lo, m = hi > 127 ? 127 : hi;
#if MF_USE_MVE
    if (signfix)
        mf_mve_dw_add_loop(big, u, y, n, tab, mult, add, post, 1, l, m);
    else
        mf_mve_dw_add_loop(big, u, y, n, tab, mult, add, post, 0, l, m);
#else
    int32_t i;
    for (i = 0; i < n; ++i) {
        const int32_t s2 = (int32_t)((uint32_t)tab[u[i]] + ((uint32_t)(int32_t)big[i] << 20));
        const int32_t h = mf_smmlar(s2, mult);
        int32_t v = h + add;
        if (signfix) v += h >> 31;
        v >>= post;
        y[i] = (int8_t)(v < l ? l : (v > m ? m : v));
    }
#endif
}

/* ---- AVERAGE_POOL_2D and MAX_POOL_2D: mf_mve_dw_avgpool_s8, mf_mve_dw_maxpool_s8 -----------
 * TFLM's int8 reference: per output pixel and channel the window clipped to the image; average:
 * the sum divided by the number of taps inside, rounding half away from zero, then the clamp;
 * max: the largest input, then the clamp. Channels in lanes. Average: 16 channels a step into
 * int16 lanes (two VLDRB.S16 and two VADD a pixel; exact while a window has at most 255 taps:
 * |sum| <= 128 * 255), then per 4 lanes the division as a multiply: |q| = (|sum| + count / 2) *
 * ceil(2^32 / count) >> 32 (VMULH.U32; exact for every |sum| + count / 2 < 2^16 and count <= 255,
 * tests/test_nn_mve_dw.py checks them all), the sign back, the clamp, a narrowing scatter
 * store; larger windows take the portable loop. Max: 16 channels a VLDRB.S8 and a VMAX.S8 a
 * pixel. The geometry is mf_pool_geom's (mcuforge_ew.h), fields in the same order. */
typedef struct {
    int16_t h, w, c, fh, fw, sh, sw, pt, pl, oh, ow;
} mf_mve_dw_pool_geom;

/* the window of output (oy, ox) clipped to the image: first pixel, rows, columns */
MF_MVDW_INLINE const int8_t *mf_mve_dw_window(const int8_t *x, const mf_mve_dw_pool_geom *g,
                                              int oy, int ox, int *rows, int *cols) {
    int y0 = oy * g->sh - g->pt, x0 = ox * g->sw - g->pl;
    int y1 = y0 + g->fh, x1 = x0 + g->fw;
    y0 = y0 < 0 ? 0 : y0, x0 = x0 < 0 ? 0 : x0;
    y1 = y1 > g->h ? g->h : y1, x1 = x1 > g->w ? g->w : x1;
    *rows = y1 - y0, *cols = x1 - x0;
    return x + (y0 * g->w + x0) * g->c;
}

/* TFLM's rounding division of one sum, then the clamp */
MF_MVDW_INLINE int8_t mf_mve_dw_avg1(int32_t sum, int32_t count, int32_t lo, int32_t hi) {
    int32_t v = (sum > 0 ? sum + count / 2 : sum - count / 2) / count;
    return (int8_t)(v < lo ? lo : (v > hi ? hi : v));
}

#if MF_USE_MVE
/* (s rounded-divided by count, as TFLM), clamped; recip = ceil(2^32 / count), count >= 2 */
MF_MVDW_INLINE int32x4_t mf_mve_dw_div4(int32x4_t s, int32_t half, uint32_t recip,
                                        int32x4_t lo, int32x4_t hi) {
    const int32x4_t m = vshrq_n_s32(s, 31);
    const uint32x4_t a = vreinterpretq_u32_s32(vaddq_n_s32(vabsq_s32(s), half));
    const int32x4_t q = vreinterpretq_s32_u32(vmulhq_u32(a, vdupq_n_u32(recip)));
    return vminq_s32(vmaxq_s32(vsubq_s32(veorq_s32(q, m), m), lo), hi);
}
#endif

MF_MICRO void mf_mve_dw_avgpool_s8(const int8_t *x, int8_t *y, const mf_mve_dw_pool_geom *g,
                                   int32_t lo, int32_t hi) {
    const int C = g->c, stride = g->w * g->c;
    int oy, ox;
    for (oy = 0; oy < g->oh; ++oy)
        for (ox = 0; ox < g->ow; ++ox, y += C) {
            int rows, cols, c = 0, r, k;
            const int8_t *p = mf_mve_dw_window(x, g, oy, ox, &rows, &cols);
            const int32_t count = rows * cols;
            if (cols == g->w) /* whole rows: one run of pixels */
                cols *= rows, rows = 1;
#if MF_USE_MVE
            if (count <= 255) {
                const int32_t half = count / 2;
                const uint32_t recip = count > 1 ? 0xFFFFFFFFu / (uint32_t)count + 1u : 0u;
                const int32x4_t vlo = vdupq_n_s32(lo), vhi = vdupq_n_s32(hi);
                const uint32x4_t even = vidupq_n_u32(0, 2);
                for (; c < C; c += 16) {
                    const int n = C - c < 16 ? C - c : 16;
                    const mve_pred16_t p0 = vctp16q((uint32_t)n);
                    const mve_pred16_t p1 = vctp16q((uint32_t)(n > 8 ? n - 8 : 0));
                    int16x8_t a0 = vdupq_n_s16(0), a1 = vdupq_n_s16(0);
                    int32x4_t s;
                    for (r = 0; r < rows; ++r) {
                        const int8_t *q = p + r * stride + c;
                        if (n == 16) /* unpredicated: a VPST less per load */
                            for (k = cols; k > 0; --k, q += C) {
                                a0 = vaddq_s16(a0, vldrbq_s16(q));
                                a1 = vaddq_s16(a1, vldrbq_s16(q + 8));
                            }
                        else
                            for (k = cols; k > 0; --k, q += C) {
                                a0 = vaddq_s16(a0, vldrbq_z_s16(q, p0));
                                a1 = vaddq_s16(a1, vldrbq_z_s16(q + 8, p1));
                            }
                    }
                    /* channels c + 2j (bottom halves) and c + 2j + 1 (top) of each 8 */
#define MF_MVDW_AVG_OUT(A, MOV, OFS, N)                                                         \
    s = MOV(A);                                                                                \
    if (count > 1) s = mf_mve_dw_div4(s, half, recip, vlo, vhi);                               \
    else s = vminq_s32(vmaxq_s32(s, vlo), vhi);                                                \
    vstrbq_scatter_offset_p_s32(y + c + (OFS), even, s, vctp32q((uint32_t)(N)));
                    MF_MVDW_AVG_OUT(a0, vmovlbq_s16, 0, (n + 1) / 2)
                    MF_MVDW_AVG_OUT(a0, vmovltq_s16, 1, n / 2)
                    if (n > 8) {
                        MF_MVDW_AVG_OUT(a1, vmovlbq_s16, 8, (n - 7) / 2)
                        MF_MVDW_AVG_OUT(a1, vmovltq_s16, 9, (n - 8) / 2)
                    }
#undef MF_MVDW_AVG_OUT
                }
            }
#endif
            for (; c < C; ++c) {
                int32_t sum = 0;
                for (r = 0; r < rows; ++r) {
                    const int8_t *q = p + r * stride + c;
                    for (k = 0; k < cols; ++k, q += C) sum += *q;
                }
                y[c] = mf_mve_dw_avg1(sum, count, lo, hi);
            }
        }
}

MF_MICRO void mf_mve_dw_maxpool_s8(const int8_t *x, int8_t *y, const mf_mve_dw_pool_geom *g,
                                   int32_t lo, int32_t hi) {
    const int C = g->c, stride = g->w * g->c;
    int oy, ox;
    for (oy = 0; oy < g->oh; ++oy)
        for (ox = 0; ox < g->ow; ++ox, y += C) {
            int rows, cols, c = 0, r, k;
            const int8_t *p = mf_mve_dw_window(x, g, oy, ox, &rows, &cols);
            if (cols == g->w) /* whole rows: one run of pixels */
                cols *= rows, rows = 1;
#if MF_USE_MVE
            {
                const int8x16_t vlo = vdupq_n_s8((int8_t)lo), vhi = vdupq_n_s8((int8_t)hi);
                for (; c < C; c += 16) {
                    const mve_pred16_t pr = vctp8q((uint32_t)(C - c));
                    int8x16_t m = vdupq_n_s8(-128);
                    for (r = 0; r < rows; ++r) {
                        const int8_t *q = p + r * stride + c;
                        if (C - c >= 16)
                            for (k = cols; k > 0; --k, q += C) m = vmaxq_s8(m, vldrbq_s8(q));
                        else
                            for (k = cols; k > 0; --k, q += C)
                                m = vmaxq_s8(m, vldrbq_z_s8(q, pr));
                    }
                    vstrbq_p_s8(y + c, vminq_s8(vmaxq_s8(m, vlo), vhi), pr);
                }
            }
#else
            for (; c < C; ++c) {
                int32_t m = -128;
                for (r = 0; r < rows; ++r) {
                    const int8_t *q = p + r * stride + c;
                    for (k = 0; k < cols; ++k, q += C) m = *q > m ? *q : m;
                }
                y[c] = (int8_t)(m < lo ? lo : (m > hi ? hi : m));
            }
#endif
        }
}

#endif /* MCUFORGE_MVE_DW_H */
