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
 * halfwords, two SMLAD; the portable body is the plain loop. */
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

#endif /* MCUFORGE_SEQ_H */
