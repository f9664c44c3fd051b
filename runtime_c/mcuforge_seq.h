/* mcuforge_seq.h: the inner products of the sequence layers (SVDF, the integer LSTM), called
 * by the schedule of codegen_c/kernels/seq.py in place of their reference loops, and the
 * integer LSTM's requantization (mf_seq_rq, mf_seq_sat16 below); the rest of the layers' TFLM
 * arithmetic (gates, state) stays in the generated loops.
 *
 *   mf_seq_dot_s8(w, v, n, off) = sum_{k<n} w[k] * (v[k] + off)
 *
 * w an int8 weight row, v an int8 activation row, off the negated zero point of v (|v + off|
 * <= 255). The schedule uses it only where the reference lowering proved that no partial sum
 * can leave int32 (every order of the same products is then exact). DSP body: four products
 * per step, the weights widened by SXTB16, the activations by SXTAB16 onto the offset in both
 * halfwords, two SMLAD; the portable body is the plain loop.
 *
 *   mf_seq_mv_s8(w4, v, n, off, rows, out, work): out[r] = sum_{k<n} W[r][k] * (v[k] + off)
 *
 * for r < rows: the same dot products hoisted out of a loop over the rows of W (a gate's
 * weights for all units, SVDF's feature weights for all filters). W is packed at compile time
 * (codegen_c/micro_seq.py pack_rows4) in blocks of 4 rows; per block, per group of 4 taps, the
 * 4 rows' taps: 16 bytes; rows and taps padded with zero weights to multiples of 4. The vector
 * is widened once into `work` (n rounded up to 4 int16, 4-byte aligned; zeros past n) in
 * SXTB16's lane order [v0 v2] [v1 v3]; per block and group of taps the DSP body reads 2 words
 * of vector and 4 of weights, 8 SXTB16 and 8 SMLAD: 16 MACs in ~22 instructions.
 *
 *   mf_seq_mv_w16(w16, v, n, off, rows, out, work): the same with the weights widened to
 *   int16 at compile time (pack_rows4_w16: per row and group of 4 taps [w0 w2] [w1 w3], the
 *   vector's lane order), twice the flash: 8 words of weights and 8 SMLAD per 16 MACs, no
 *   SXTB16. The schedule picks it on the DSP extension unless the flash budget keeps the
 *   layer's weights int8 (codegen_c/kernels/budget.py); mf_seq_mv_w16_g<G> (same arguments)
 *   for vectors of at most G <= 8 groups of 4 taps, the groups unrolled.
 *   Instructions per MAC on QEMU mps2-an386, arm-none-eabi-gcc 12.2, incl. the widening and
 *   the call (-O2; -Os within 0.5 %): rows x taps 80x28 (g7) 0.77, 80x20 (g5) 0.80, 320x80
 *   0.77, 512x128 0.75, 320x257 0.75, 512x257 0.75 (the asm: 11 per 16 MACs). */
#ifndef MCUFORGE_SEQ_H
#define MCUFORGE_SEQ_H

#include "mcuforge_nn.h" /* MF_USE_DSP, MF_INLINE, <arm_acle.h>, <string.h> */
#if defined(__ARM_FEATURE_SAT) && __ARM_FEATURE_SAT
#include <arm_acle.h> /* __ssat */
#endif

/* The LSTM's requantizations (codegen_c/lower/state.py, fast form): TFLM's
 * MultiplyByQuantizedMultiplier(acc, mult, shift) + zp as mcuforge_nn.h's mf_rq_apply computes
 * it with the sign term, from the constants of codegen_c/pack.py requant_params:
 *   h = SMMULR(acc << pre, mult), y = (h + add + (post ? h >> 31 : 0)) >> post.
 * Exact while acc << pre and h + add stay in int32: the lowering proves that from the bound
 * of acc (the weights over the int8 input ranges; the int16 gate products) and keeps mf_mbqm
 * where it cannot. The arguments are constants, so the call folds to 4-5 instructions. */
static inline int32_t mf_seq_rq(int32_t acc, int32_t mult, int32_t add, int32_t pre,
                                int32_t post) {
    int32_t h = mf_smmlar((int32_t)((uint32_t)acc << pre), mult);
    int32_t v = h + add;
    if (post) v += h >> 31;
    return v >> post;
}

/* v clamped to int16: one SSAT where the core has it (v7-M, v7E-M; gcc 12 turns few of the
 * LSTM's clamps into SSAT by itself). */
static inline int32_t mf_seq_sat16(int32_t v) {
#if defined(__ARM_FEATURE_SAT) && __ARM_FEATURE_SAT
    return __ssat(v, 16);
#else
    return v < -32768 ? -32768 : v > 32767 ? 32767 : v;
#endif
}

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

MF_MICRO void mf_seq_mv_s8(const int8_t *w4, const int8_t *v, int32_t n, int32_t off,
                           int32_t rows, int32_t *out, int16_t *work) {
    int32_t n4 = (n + 3) & ~3, r, k;
#if MF_USE_DSP
    int32_t off2 = (int32_t)(((uint32_t)off & 0xFFFFu) * 0x10001u);
    int32_t *vw = (int32_t *)(void *)work; /* [x0 x2] [x1 x3] [x4 x6] ... */
    for (k = 0; k + 4 <= n; k += 4) {
        int32_t vq;
        memcpy(&vq, v + k, 4);
        vw[k / 2] = (int32_t)__sxtab16(off2, vq);
        vw[k / 2 + 1] = mf_sxtab16_ror8(off2, vq);
    }
    if (k < n) { /* the last, partial group: zeros past n */
        int16_t t[4] = {0, 0, 0, 0};
        for (int32_t i = 0; k + i < n; i++) t[i] = (int16_t)(v[k + i] + off);
        vw[k / 2] = (int32_t)(((uint32_t)(uint16_t)t[2] << 16) | (uint16_t)t[0]);
        vw[k / 2 + 1] = (int32_t)(((uint32_t)(uint16_t)t[3] << 16) | (uint16_t)t[1]);
    }
    const int32_t *xend = vw + n4 / 2;
    for (r = 0; r < rows; r += 4) {
        int32_t a0 = 0, a1 = 0, a2 = 0, a3 = 0;
        const int32_t *xp = vw;
        do {
            int32_t x02 = xp[0], x13 = xp[1], q0, q1, q2, q3;
            memcpy(&q0, w4, 4);
            memcpy(&q1, w4 + 4, 4);
            memcpy(&q2, w4 + 8, 4);
            memcpy(&q3, w4 + 12, 4);
            w4 += 16;
            xp += 2;
            a0 = __smlad((int32_t)__sxtb16(q0), x02, a0);
            a0 = __smlad(mf_sxtb16_ror8(q0), x13, a0);
            a1 = __smlad((int32_t)__sxtb16(q1), x02, a1);
            a1 = __smlad(mf_sxtb16_ror8(q1), x13, a1);
            a2 = __smlad((int32_t)__sxtb16(q2), x02, a2);
            a2 = __smlad(mf_sxtb16_ror8(q2), x13, a2);
            a3 = __smlad((int32_t)__sxtb16(q3), x02, a3);
            a3 = __smlad(mf_sxtb16_ror8(q3), x13, a3);
        } while (xp < xend);
        out[r] = a0;
        if (r + 1 < rows) out[r + 1] = a1;
        if (r + 2 < rows) out[r + 2] = a2;
        if (r + 3 < rows) out[r + 3] = a3;
    }
#else
    (void)work;
    for (r = 0; r < rows; r++) {
        const int8_t *blk = w4 + (r / 4) * 4 * n4 + (r % 4) * 4;
        int32_t acc = 0;
        for (k = 0; k < n; k++) acc += (int32_t)blk[(k / 4) * 16 + k % 4] * ((int32_t)v[k] + off);
        out[r] = acc;
    }
#endif
}

/* The full blocks of 4 rows of mf_seq_mv_w16 in one asm routine (DSP, optimised Thumb-2
 * builds): per group of 4 taps one LDRD of the widened vector, two LDM of 4 weight words,
 * 8 SMLAD (11 instructions for 16 MACs; a block's first group SMUAD, so no zeroing), the
 * other groups unrolled by 4 with the remainder peeled by the low bits of the count; the
 * block loop's state in memory operands (gcc 12 spills around an asm block of 13 registers).
 * Registers: r0-r3 accumulators, r4/r5 vector words, r6 vector pointer, r8-r11 weight words,
 * r12 weight pointer, lr the group count; r7 (the Thumb frame pointer) is left alone. */
#if MF_USE_DSP && defined(__GNUC__) && defined(__OPTIMIZE__) && defined(__thumb2__)
#define MF_SEQ_ASM 1
#define MF_S_G16                                                                            \
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
#define MF_S_G16_FIRST                                                                      \
    "ldrd r4, r5, [r6], #8\n\t"                                                             \
    "ldmia r12!, {r8, r9, r10, r11}\n\t"                                                    \
    "smuad r0, r4, r8\n\t"                                                                  \
    "smlad r0, r5, r9, r0\n\t"                                                              \
    "smuad r1, r4, r10\n\t"                                                                 \
    "smlad r1, r5, r11, r1\n\t"                                                             \
    "ldmia r12!, {r8, r9, r10, r11}\n\t"                                                    \
    "smuad r2, r4, r8\n\t"                                                                  \
    "smlad r2, r5, r9, r2\n\t"                                                              \
    "smuad r3, r4, r10\n\t"                                                                 \
    "smlad r3, r5, r11, r3\n\t"
static inline void mf_seq_mv_w16_blocks(const int16_t *w16, const int32_t *vw, int32_t G,
                                        int32_t nb, int32_t *out) {
    int32_t G1 = G - 1; /* (the first group by SMUAD: no zeroing) */
    __asm__ volatile(
        "ldr r12, %[wp]\n"
        "9:\n\t"
        "ldr r6, %[vw]\n\t" MF_S_G16_FIRST
        "ldr lr, %[G1]\n\t"
        "lsrs lr, lr, #1\n\t" /* G - 1 = 4q + r: r's low bit, its high bit, then q x 4 */
        "bcc 5f\n\t" MF_S_G16 "5:\n\t"
        "lsrs lr, lr, #1\n\t"
        "bcc 6f\n\t" MF_S_G16 MF_S_G16 "6:\n\t"
        "beq 7f\n"
        "8:\n\t" MF_S_G16 MF_S_G16 MF_S_G16 MF_S_G16 "subs lr, lr, #1\n\t"
        "bne 8b\n"
        "7:\n\t"
        "ldr r4, %[out]\n\t"
        "stmia r4!, {r0, r1, r2, r3}\n\t"
        "str r4, %[out]\n\t"
        "ldr lr, %[nb]\n\t"
        "subs lr, lr, #1\n\t"
        "str lr, %[nb]\n\t"
        "bne 9b\n\t"
        : [out] "+m"(out), [nb] "+m"(nb)
        : [wp] "m"(w16), [vw] "m"(vw), [G1] "m"(G1)
        : "r0", "r1", "r2", "r3", "r4", "r5", "r6", "r8", "r9", "r10", "r11", "r12", "lr",
          "cc", "memory");
}
/* The same for a group count G known at compile time (mf_seq_mv_w16_g<G>): the groups
 * unrolled, lr the output pointer, the vector pointer rewound by an immediate: 5
 * instructions a block besides the groups' 11 each (the loop above: ~16). */
MF_INLINE void mf_seq_mv_w16_blocks_g(const int16_t *w16, const int32_t *vw, const int32_t G,
                                      int32_t nb, int32_t *out) {
    const int16_t *wend = w16 + nb * G * 16;
    __asm__ volatile(
        "ldr r6, %[vw]\n\t"
        "ldr r12, %[wp]\n\t"
        "ldr lr, %[out]\n"
        "9:\n\t" MF_S_G16_FIRST
        ".rept %c[G] - 1\n\t" MF_S_G16 ".endr\n\t"
        "sub r6, r6, %[G8]\n\t"
        "stmia lr!, {r0, r1, r2, r3}\n\t"
        "ldr r4, %[wend]\n\t"
        "cmp r12, r4\n\t"
        "bne 9b\n\t"
        :
        : [wp] "m"(w16), [vw] "m"(vw), [out] "m"(out), [wend] "m"(wend), [G] "i"(G),
          [G8] "i"(8 * G)
        : "r0", "r1", "r2", "r3", "r4", "r5", "r6", "r8", "r9", "r10", "r11", "r12", "lr",
          "cc", "memory");
}
#else
#define MF_SEQ_ASM 0
#endif

/* mf_seq_mv_w16's body; G0 > 0: n known to have G0 groups of 4 taps (a constant: the
 * unrolled asm), 0: any n. */
MF_INLINE void mf_seq_mv_w16_body(const int16_t *w16, const int8_t *v, int32_t n, int32_t off,
                                  int32_t rows, int32_t *out, int16_t *work, const int32_t G0) {
    int32_t n4 = (n + 3) & ~3, r, k;
    (void)G0; /* (portable and -O0 builds: the general body) */
#if MF_USE_DSP
    int32_t off2 = (int32_t)(((uint32_t)off & 0xFFFFu) * 0x10001u);
    int32_t *vw = (int32_t *)(void *)work; /* [x0 x2] [x1 x3] [x4 x6] ... */
    for (k = 0; k + 4 <= n; k += 4) {
        int32_t vq;
        memcpy(&vq, v + k, 4);
        vw[k / 2] = (int32_t)__sxtab16(off2, vq);
        vw[k / 2 + 1] = mf_sxtab16_ror8(off2, vq);
    }
    if (k < n) { /* the last, partial group: zeros past n */
        int16_t t[4] = {0, 0, 0, 0};
        for (int32_t i = 0; k + i < n; i++) t[i] = (int16_t)(v[k + i] + off);
        vw[k / 2] = (int32_t)(((uint32_t)(uint16_t)t[2] << 16) | (uint16_t)t[0]);
        vw[k / 2 + 1] = (int32_t)(((uint32_t)(uint16_t)t[3] << 16) | (uint16_t)t[1]);
    }
    const int32_t *xend = vw + n4 / 2;
    r = 0;
#if MF_SEQ_ASM
    if (rows >= 4 && G0 > 0 && n4 / 4 == G0) {
        mf_seq_mv_w16_blocks_g(w16, vw, G0 > 0 ? G0 : 1, rows / 4, out);
        r = rows & ~3;
        w16 += r * n4;
    } else if (rows >= 4) {
        mf_seq_mv_w16_blocks(w16, vw, n4 / 4, rows / 4, out);
        r = rows & ~3;
        w16 += r * n4;
    }
#endif
    for (; r < rows; r += 4) {
        int32_t a0 = 0, a1 = 0, a2 = 0, a3 = 0;
        const int32_t *xp = vw;
        do {
            int32_t x02 = xp[0], x13 = xp[1], q[8];
            memcpy(q, w16, 32);
            w16 += 16;
            xp += 2;
            a0 = __smlad(q[0], x02, a0);
            a0 = __smlad(q[1], x13, a0);
            a1 = __smlad(q[2], x02, a1);
            a1 = __smlad(q[3], x13, a1);
            a2 = __smlad(q[4], x02, a2);
            a2 = __smlad(q[5], x13, a2);
            a3 = __smlad(q[6], x02, a3);
            a3 = __smlad(q[7], x13, a3);
        } while (xp < xend);
        out[r] = a0;
        if (r + 1 < rows) out[r + 1] = a1;
        if (r + 2 < rows) out[r + 2] = a2;
        if (r + 3 < rows) out[r + 3] = a3;
    }
#else
    static const int8_t lane[4] = {0, 2, 1, 3};
    (void)work;
    for (r = 0; r < rows; r++) {
        const int16_t *blk = w16 + (r / 4) * 4 * n4 + (r % 4) * 4;
        int32_t acc = 0;
        for (k = 0; k < n; k++)
            acc += (int32_t)blk[(k / 4) * 16 + lane[k % 4]] * ((int32_t)v[k] + off);
        out[r] = acc;
    }
#endif
}

MF_MICRO void mf_seq_mv_w16(const int16_t *w16, const int8_t *v, int32_t n, int32_t off,
                            int32_t rows, int32_t *out, int16_t *work) {
    mf_seq_mv_w16_body(w16, v, n, off, rows, out, work, 0);
}

/* mf_seq_mv_w16 for n in (4 (G - 1), 4 G] (the schedule's choice for G <= 8). */
#define MF_SEQ_MV_W16_G(G)                                                                  \
    MF_MICRO void mf_seq_mv_w16_g##G(const int16_t *w16, const int8_t *v, int32_t n,          \
                                     int32_t off, int32_t rows, int32_t *out, int16_t *work) { \
        mf_seq_mv_w16_body(w16, v, n, off, rows, out, work, G);                             \
    }
MF_SEQ_MV_W16_G(1)
MF_SEQ_MV_W16_G(2)
MF_SEQ_MV_W16_G(3)
MF_SEQ_MV_W16_G(4)
MF_SEQ_MV_W16_G(5)
MF_SEQ_MV_W16_G(6)
MF_SEQ_MV_W16_G(7)
MF_SEQ_MV_W16_G(8)

#endif /* MCUFORGE_SEQ_H */
