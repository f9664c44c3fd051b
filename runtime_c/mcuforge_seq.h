/* mcuforge_seq.h: the inner products of the sequence layers (SVDF, the integer LSTM), called
 * by the schedule of codegen_c/kernels/seq.py in place of their reference loops; the rest of
 * the layers' TFLM arithmetic (requantization, gates, state) stays in the generated loops.
 *
 *   mf_seq_dot_s8(w, v, n, off) = sum_{k<n} w[k] * (v[k] + off)
 *
 * w an int8 weight row, v an int8 activation row, off the negated zero point of v (|v + off|
 * <= 255). The schedule uses it only where the reference lowering proved that no partial sum
 * can leave int32 (every order of the same products is then exact). DSP body: four products
 * per step, the weights widened by SXTB16, the activations by SXTAB16 onto the offset in both
 * halfwords, two SMLAD; the portable body is the plain loop.
 *
 *   mf_seq_mv_s8(w, v, n, off, rows, out, work): out[r] = mf_seq_dot_s8(&w[r * n], v, n, off)
 *
 * for r < rows: the same dot products hoisted out of a loop over the rows of w (a gate's
 * weights for all units, SVDF's feature weights for all filters). The vector is widened once
 * into `work` (n rounded up to 4 int16, 4-byte aligned) in SXTB16's lane order, then the rows
 * go four at a time, each group of 4 weights read as one word and widened by SXTB16: per 4
 * rows x 4 taps 2 + 4 x 5 instructions. */
#ifndef MCUFORGE_SEQ_H
#define MCUFORGE_SEQ_H

#include "mcuforge_nn.h" /* MF_USE_DSP, MF_INLINE, <arm_acle.h>, <string.h> */

#if MF_USE_DSP
static inline int32_t mf_sxtab16_ror8(int32_t a, int32_t v) {
#if defined(__GNUC__)
    int32_t r;
    __asm__("sxtab16 %0, %1, %2, ror #8" : "=r"(r) : "r"(a), "r"(v));
    return r;
#else
    return (int32_t)__sxtab16((uint32_t)a, __ror((uint32_t)v, 8));
#endif
}
#endif

MF_INLINE int32_t mf_seq_dot_s8(const int8_t *w, const int8_t *v, int32_t n, int32_t off) {
    int32_t acc = 0, k = 0;
#if MF_USE_DSP
    int32_t off2 = (int32_t)(((uint32_t)off & 0xFFFFu) * 0x10001u);
    for (; k + 4 <= n; k += 4) {
        int32_t wq, vq;
        memcpy(&wq, w + k, 4);
        memcpy(&vq, v + k, 4);
        acc = __smlad((int32_t)__sxtb16(wq), (int32_t)__sxtab16(off2, vq), acc);
        acc = __smlad(mf_sxtb16_ror8(wq), mf_sxtab16_ror8(off2, vq), acc);
    }
#endif
    for (; k < n; k++) acc += (int32_t)w[k] * ((int32_t)v[k] + off);
    return acc;
}

MF_MICRO void mf_seq_mv_s8(const int8_t *w, const int8_t *v, int32_t n, int32_t off,
                           int32_t rows, int32_t *out, int16_t *work) {
    int32_t r = 0, n4 = n & ~3;
#if MF_USE_DSP
    int32_t off2 = (int32_t)(((uint32_t)off & 0xFFFFu) * 0x10001u), k;
    int32_t *vw = (int32_t *)(void *)work; /* [x0 x2] [x1 x3] [x4 x6] ... */
    for (k = 0; k < n4; k += 4) {
        int32_t vq;
        memcpy(&vq, v + k, 4);
        vw[k / 2] = (int32_t)__sxtab16(off2, vq);
        vw[k / 2 + 1] = mf_sxtab16_ror8(off2, vq);
    }
    for (; r + 4 <= rows; r += 4) {
        const int8_t *w0 = w + r * n;
        int32_t a0 = 0, a1 = 0, a2 = 0, a3 = 0;
        const int32_t *xp = vw;
        for (k = 0; k < n4; k += 4, xp += 2) {
            int32_t x02 = xp[0], x13 = xp[1], wq;
            memcpy(&wq, w0 + k, 4);
            a0 = __smlad((int32_t)__sxtb16(wq), x02, a0);
            a0 = __smlad(mf_sxtb16_ror8(wq), x13, a0);
            memcpy(&wq, w0 + n + k, 4);
            a1 = __smlad((int32_t)__sxtb16(wq), x02, a1);
            a1 = __smlad(mf_sxtb16_ror8(wq), x13, a1);
            memcpy(&wq, w0 + 2 * n + k, 4);
            a2 = __smlad((int32_t)__sxtb16(wq), x02, a2);
            a2 = __smlad(mf_sxtb16_ror8(wq), x13, a2);
            memcpy(&wq, w0 + 3 * n + k, 4);
            a3 = __smlad((int32_t)__sxtb16(wq), x02, a3);
            a3 = __smlad(mf_sxtb16_ror8(wq), x13, a3);
        }
        for (; k < n; k++) {
            int32_t x = (int32_t)v[k] + off;
            a0 += (int32_t)w0[k] * x;
            a1 += (int32_t)w0[n + k] * x;
            a2 += (int32_t)w0[2 * n + k] * x;
            a3 += (int32_t)w0[3 * n + k] * x;
        }
        out[r] = a0;
        out[r + 1] = a1;
        out[r + 2] = a2;
        out[r + 3] = a3;
    }
#else
    (void)work;
    (void)n4;
#endif
    for (w += r * n, out += r; r < rows; r++, w += n) *out++ = mf_seq_dot_s8(w, v, n, off);
}

#endif /* MCUFORGE_SEQ_H */
