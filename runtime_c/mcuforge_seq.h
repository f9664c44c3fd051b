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

#if MF_USE_DSP
/* v[0..n) + off widened into int16 pairs in SMLAD's lane order, [x0 x2] [x1 x3] [x4 x6] ...,
 * the last partial group padded with zeros (MF_KPAD(n) / 2 words at vw) */
MF_INLINE void mf_seq_widen(const int8_t *v, int32_t n, int32_t off, int32_t *vw) {
    int32_t off2 = (int32_t)(((uint32_t)off & 0xFFFFu) * 0x10001u), k;
    for (k = 0; k + 4 <= n; k += 4) {
        int32_t vq;
        memcpy(&vq, v + k, 4);
        vw[k / 2] = (int32_t)__sxtab16(off2, vq);
        vw[k / 2 + 1] = mf_sxtab16_ror8(off2, vq);
    }
    if (k < n) {
        int16_t t[4] = {0, 0, 0, 0};
        for (int32_t i = 0; k + i < n; i++) t[i] = (int16_t)(v[k + i] + off);
        vw[k / 2] = (int32_t)(((uint32_t)(uint16_t)t[2] << 16) | (uint16_t)t[0]);
        vw[k / 2 + 1] = (int32_t)(((uint32_t)(uint16_t)t[3] << 16) | (uint16_t)t[1]);
    }
}
#endif

MF_MICRO void mf_seq_mv_s8(const int8_t *w4, const int8_t *v, int32_t n, int32_t off,
                           int32_t rows, int32_t *out, int16_t *work) {
    int32_t n4 = (n + 3) & ~3, r;
#if MF_USE_DSP
    int32_t *vw = (int32_t *)(void *)work;
    mf_seq_widen(v, n, off, vw);
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
        for (int32_t k = 0; k < n; k++) acc += (int32_t)blk[(k / 4) * 16 + k % 4] * ((int32_t)v[k] + off);
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
#if MF_GEMM_ASM /* (mcuforge_nn.h: DSP, optimised Thumb-2 gcc builds; 0 forces intrinsics) */
#define MF_SEQ_ASM 1
/* a block's first group; the others are mcuforge_nn.h's MF_A_G16 (the same registers) */
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
        "bcc 5f\n\t" MF_A_G16 "5:\n\t"
        "lsrs lr, lr, #1\n\t"
        "bcc 6f\n\t" MF_A_G16 MF_A_G16 "6:\n\t"
        "beq 7f\n"
        "8:\n\t" MF_A_G16 MF_A_G16 MF_A_G16 MF_A_G16 "subs lr, lr, #1\n\t"
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
        ".rept %c[G] - 1\n\t" MF_A_G16 ".endr\n\t"
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
    int32_t n4 = (n + 3) & ~3, r;
    (void)G0; /* (portable and -O0 builds: the general body) */
#if MF_USE_DSP
    int32_t *vw = (int32_t *)(void *)work;
    mf_seq_widen(v, n, off, vw);
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
        for (int32_t k = 0; k < n; k++)
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

/* ---- the whole int8 SVDF step (codegen_c/kernels/svdf.py) ----------------------------------
 *
 *   mf_seq_svdf_s8(x, old, state, y, wf, wt, bias, g, work): one batch row of TFLM's
 *   EvalIntegerSvdfReference<int8_t> with an int8 memory of n_memory entries per filter:
 *
 *   dot[f]   = sum_k Wf[f][k] * (x[k] - zp_in)
 *   newest_f = (int8)(clamp(rq(dot[f], rq_state), -128, 127) + zp_state)
 *   state[f] = old[f] moved one entry older (old[f][1..M-1]), then newest_f
 *   y[u]     = clamp(rq(bias[u] + sum_{r<rank} sum_m wt[f][m] * state[f][m], rq_out), lo, hi)
 *              with f = u * rank + r and bias = TFLM's bias - zp_state * sum wt over the unit
 *              (a unit whose output is the same for every memory: any bias giving it)
 *
 * rq is mf_rq_apply (its exactness, as the zero-point folds', proven at compile time). Wf is
 * packed as the GEMM kernels read it (pack.pack_gemm_weights, g->fmt MF_W16 or MF_W8) and
 * multiplied by mf_dot4 on x - zp_in widened once (mf_svdf_widen); wt stays int8 [F][M] as
 * TFLite stores it. state may be old itself (the memory updated in place: each word of the
 * memory is read before the word before it is written) or a disjoint buffer. The DSP body takes the
 * memory by words when n_memory % 4 == 0 and old and state are 4-byte aligned: per word one
 * shift-and-insert, two SXTB16 of the memory, two of the weights and two SMLAD; otherwise
 * the portable loop. work: int32[MF_KPAD(n_filter)] (the feature products, then the time
 * sums), int8[MF_KPAD(n_filter)] (the newest entries), int16[MF_KPAD(n_in)]; 4-byte aligned.
 * mps2-an386, keyword_scrambled's layers (instructions per call, -O2 / -Os): 16 inputs, 64
 * filters, memory 8: 4,534 / 5,773 (was 9,974 with the reference's loops around
 * mf_seq_mv_w16); 96 inputs, 64 filters, memory 8: 8,414 / 9,573; 32 inputs, 32 filters,
 * memory 32: 5,254 / 6,013. */
typedef struct {
    int32_t n_in, n_filter, n_memory, rank, fmt, zp_in, zp_state, lo, hi;
    mf_rq rq_state; /* the feature product to the memory's scale (zero point 0: TFLM clamps
                     * to int8 before adding it) */
    mf_rq rq_out;   /* the unit's sum to the output, its zero point in add */
    int32_t sf_state, sf_out; /* mf_rq_apply's signfix of each */
} mf_svdf_geom;

MF_INLINE int32_t mf_svdf_sat8(int32_t v) {
#if MF_USE_DSP
    return __ssat(v, 8);
#else
    return v < -128 ? -128 : v > 127 ? 127 : v;
#endif
}

/* out[i] = (int8)(sat8(mf_rq_apply(in[i], q, sfx)) + zp), i < n; sfx: the sign term applies
 * (signfix and post != 0), a constant after inlining */
MF_INLINE void mf_svdf_newest(const int32_t *in, int8_t *out, int32_t n, const mf_rq *q,
                              int32_t sfx, int32_t zp) {
    const int32_t mult = q->mult, add = q->add, pre = q->pre, post = q->post;
    const int32_t *end = in + n;
    while (in < end) {
        const int32_t h = mf_smmlar((int32_t)((uint32_t)*in++ << pre), mult);
        int32_t v = h + add;
        if (sfx) v += h >> 31;
        *out++ = (int8_t)(uint8_t)(uint32_t)(mf_svdf_sat8(v >> post) + zp); /* (wraps as TFLM) */
    }
}

/* y[u] = clamp(mf_rq_apply(bias[u] + sum_{r<R} d[u * R + r], q, signfix), lo, hi), u < U;
 * fast (a constant after inlining): R = 1, the int8 range and sfx the sign term's use */
MF_INLINE void mf_svdf_units(const int32_t *d, const int32_t *bias, int8_t *y, int32_t U,
                             int32_t R, const mf_rq *q, int32_t sfx, int32_t fast, int32_t lo,
                             int32_t hi) {
    const int32_t mult = q->mult, add = q->add, pre = q->pre, post = q->post;
    const int8_t *end = y + U;
    while (y < end) {
        int32_t acc = *bias++, r, h, v;
        if (fast) {
            acc += *d++;
        } else {
            for (r = 0; r < R; ++r) acc += *d++;
        }
        h = mf_smmlar((int32_t)((uint32_t)acc << pre), mult);
        v = h + add;
        if (fast ? sfx : sfx && post) v += h >> 31;
        v >>= post;
        if (fast) {
            v = mf_svdf_sat8(v);
        } else {
            v = v < lo ? lo : v > hi ? hi : v;
        }
        *y++ = (int8_t)v;
    }
}

/* acc += the 8 int8 of new words cur, n1 times the next 8 int8 weights (w advanced) */
#define MF_SVDF_DOT2                                                                        \
    "ldr %[p], [%[w]], #4\n\t"                                                             \
    "sxtb16 %[t], %[cur]\n\t"                                                              \
    "sxtb16 %[q], %[p]\n\t"                                                                \
    "smlad %[acc], %[t], %[q], %[acc]\n\t"                                                 \
    "sxtb16 %[cur], %[cur], ror #8\n\t"                                                    \
    "sxtb16 %[p], %[p], ror #8\n\t"                                                        \
    "smlad %[acc], %[cur], %[p], %[acc]\n\t"                                               \
    "ldr %[p], [%[w]], #4\n\t"                                                             \
    "sxtb16 %[t], %[n1]\n\t"                                                               \
    "sxtb16 %[q], %[p]\n\t"                                                                \
    "smlad %[acc], %[t], %[q], %[acc]\n\t"                                                 \
    "sxtb16 %[n1], %[n1], ror #8\n\t"                                                      \
    "sxtb16 %[p], %[p], ror #8\n\t"                                                        \
    "smlad %[acc], %[n1], %[p], %[acc]\n\t"

/* xw = x[0..n) + off widened to int16 in the GEMM kernels' lane order ([x0 x2] [x1 x3] per
 * group of 4), zeros past n up to MF_KPAD(n); xw 4-byte aligned, |x + off| <= 255. */
static inline void mf_svdf_widen(const int8_t *x, int32_t n, int32_t off, int16_t *xw) {
    int32_t k = 0, i;
#if MF_USE_DSP
    const int32_t off2 = (int32_t)(((uint32_t)off & 0xFFFFu) * 0x10001u);
    mf_word *d = (mf_word *)(void *)xw;
#if MF_GEMM_ASM && defined(__ARM_FEATURE_UNALIGNED)
    if (n >= 8) { /* 10 instructions per 8 bytes: two LDR, four SXTAB16, two STRD */
        int32_t n8 = n >> 3, v, u, a, b;
        const int8_t *xs = x;
        mf_word *ds = d;
        __asm__ volatile("1:\n\t"
                         "ldr %[v], [%[x]], #4\n\t"
                         "ldr %[u], [%[x]], #4\n\t"
                         "sxtab16 %[a], %[o2], %[v]\n\t"
                         "sxtab16 %[b], %[o2], %[v], ror #8\n\t"
                         "strd %[a], %[b], [%[d]], #8\n\t"
                         "sxtab16 %[a], %[o2], %[u]\n\t"
                         "sxtab16 %[b], %[o2], %[u], ror #8\n\t"
                         "strd %[a], %[b], [%[d]], #8\n\t"
                         "subs %[n], %[n], #1\n\t"
                         "bne 1b\n\t"
                         : [x] "+r"(xs), [d] "+r"(ds), [n] "+r"(n8), [v] "=&r"(v), [u] "=&r"(u),
                           [a] "=&r"(a), [b] "=&r"(b)
                         : [o2] "r"(off2)
                         : "cc", "memory");
        k = n & ~7;
    }
#endif
    for (; k + 4 <= n; k += 4) {
        int32_t vq;
        memcpy(&vq, x + k, 4);
        d[k >> 1] = (int32_t)__sxtab16(off2, vq);
        d[(k >> 1) + 1] = mf_sxtab16_ror8(off2, vq);
    }
#endif
    for (; k < MF_KPAD(n); k += 4) {
        for (i = 0; i < 4; ++i) { /* tap k + i sits at lane (0, 2, 1, 3)[i] */
            xw[k + ((i & 1) << 1) + (i >> 1)] = (int16_t)(k + i < n ? x[k + i] + off : 0);
        }
    }
}

/* mf_seq_svdf_s8's memory step by words on the DSP extension: returns 0 (nothing done) unless
 * n_memory % 4 == 0 and old, state and wt are 4-byte aligned. Per filter f: the M / 4 words of
 * old[f] become state[f] moved one entry older with newest[f] last, and d[f] their dot
 * product with wt[f]. In place (state == old) each word is read before the one before it is
 * written. */
static inline int32_t mf_svdf_words(const int8_t *old, int8_t *state, const int8_t *wt,
                                    const int8_t *newest, int32_t *d, int32_t F, int32_t M) {
#if MF_USE_DSP
    const mf_word *o = (const mf_word *)(const void *)old;
    mf_word *s = (mf_word *)(void *)state;
    const int8_t *w = wt, *nb = newest;
    const int32_t words = M >> 2;
    int32_t f;
    if ((M & 3) != 0 || (((uintptr_t)old | (uintptr_t)state | (uintptr_t)wt) & 3) != 0) {
        return 0;
    }
#if MF_GEMM_ASM
    if (words == 2) { /* the usual memory of 8: 23 instructions a filter */
        int32_t n = F, a, b, c, p, q, acc;
        __asm__ volatile("1:\n\t"
                         "ldrd %[a], %[b], [%[o]], #8\n\t"
                         "ldrb %[c], [%[nb]], #1\n\t"
                         "lsrs %[a], %[a], #8\n\t"
                         "orr %[a], %[a], %[b], lsl #24\n\t"
                         "lsrs %[b], %[b], #8\n\t"
                         "orr %[b], %[b], %[c], lsl #24\n\t"
                         "strd %[a], %[b], [%[s]], #8\n\t"
                         "ldrd %[p], %[q], [%[w]], #8\n\t"
                         "sxtb16 %[c], %[a]\n\t"
                         "sxtb16 %[a], %[a], ror #8\n\t"
                         "sxtb16 %[acc], %[p]\n\t"
                         "smuad %[acc], %[c], %[acc]\n\t"
                         "sxtb16 %[p], %[p], ror #8\n\t"
                         "smlad %[acc], %[a], %[p], %[acc]\n\t"
                         "sxtb16 %[c], %[b]\n\t"
                         "sxtb16 %[a], %[q]\n\t"
                         "smlad %[acc], %[c], %[a], %[acc]\n\t"
                         "sxtb16 %[b], %[b], ror #8\n\t"
                         "sxtb16 %[q], %[q], ror #8\n\t"
                         "smlad %[acc], %[b], %[q], %[acc]\n\t"
                         "str %[acc], [%[d]], #4\n\t"
                         "subs %[n], %[n], #1\n\t"
                         "bne 1b\n\t"
                         : [o] "+r"(o), [s] "+r"(s), [w] "+r"(w), [nb] "+r"(nb), [d] "+r"(d),
                           [n] "+r"(n), [a] "=&r"(a), [b] "=&r"(b), [c] "=&r"(c),
                           [p] "=&r"(p), [q] "=&r"(q), [acc] "=&r"(acc)
                         :
                         : "cc", "memory");
        return 1;
    }
    if ((words & 1) == 0) { /* two words a step (LDRD / STRD): 23 instructions, gcc's C 27 */
        for (f = 0; f < F; ++f) {
            int32_t k = (words >> 1) - 1, acc = 0, cur, n1, n2, p, q, t;
            const int32_t newest_f = (uint8_t)*nb++;
            __asm__ volatile("ldr %[cur], [%[o]], #4\n\t"
                             "1:\n\t"
                             "ldrd %[n1], %[n2], [%[o]], #8\n\t"
                             "lsrs %[cur], %[cur], #8\n\t"
                             "orr %[cur], %[cur], %[n1], lsl #24\n\t"
                             "lsrs %[n1], %[n1], #8\n\t"
                             "orr %[n1], %[n1], %[n2], lsl #24\n\t"
                             "strd %[cur], %[n1], [%[s]], #8\n\t"
                             MF_SVDF_DOT2
                             "mov %[cur], %[n2]\n\t"
                             "subs %[k], %[k], #1\n\t"
                             "bne 1b\n\t"
                             /* the last two words: the newest entry last */
                             "ldr %[n1], [%[o]], #4\n\t"
                             "lsrs %[cur], %[cur], #8\n\t"
                             "orr %[cur], %[cur], %[n1], lsl #24\n\t"
                             "lsrs %[n1], %[n1], #8\n\t"
                             "orr %[n1], %[n1], %[nw], lsl #24\n\t"
                             "strd %[cur], %[n1], [%[s]], #8\n\t"
                             MF_SVDF_DOT2
                             : [o] "+r"(o), [s] "+r"(s), [w] "+r"(w), [k] "+r"(k),
                               [acc] "+r"(acc), [cur] "=&r"(cur), [n1] "=&r"(n1),
                               [n2] "=&r"(n2), [p] "=&r"(p), [q] "=&r"(q), [t] "=&r"(t)
                             : [nw] "r"(newest_f)
                             : "cc", "memory");
            *d++ = acc;
        }
        return 1;
    }
#endif
    for (f = 0; f < F; ++f) { /* a word a step */
        uint32_t cur = (uint32_t)*o++;
        int32_t acc = 0, k, nw, wq;
        for (k = 1; k < words; ++k) {
            const uint32_t nxt = (uint32_t)*o++;
            nw = (int32_t)((cur >> 8) | (nxt << 24));
            memcpy(&wq, w, 4);
            w += 4;
            *s++ = nw;
            acc = __smlad((int32_t)__sxtb16(nw), (int32_t)__sxtb16(wq), acc);
            acc = __smlad(mf_sxtb16_ror8(nw), mf_sxtb16_ror8(wq), acc);
            cur = nxt;
        }
        nw = (int32_t)((cur >> 8) | ((uint32_t)(uint8_t)*nb++ << 24));
        memcpy(&wq, w, 4);
        w += 4;
        *s++ = nw;
        acc = __smlad((int32_t)__sxtb16(nw), (int32_t)__sxtb16(wq), acc);
        *d++ = __smlad(mf_sxtb16_ror8(nw), mf_sxtb16_ror8(wq), acc);
    }
    return 1;
#else
    (void)old, (void)state, (void)wt, (void)newest, (void)d, (void)F, (void)M;
    return 0;
#endif
}

MF_MICRO void mf_seq_svdf_s8(const int8_t *x, const int8_t *old, int8_t *state, int8_t *y,
                             const void *wf, const int8_t *wt, const int32_t *bias,
                             const mf_svdf_geom *g, int32_t *work) {
    const int32_t F = g->n_filter, M = g->n_memory, R = g->rank, G = MF_KPAD(g->n_in) >> 2;
    const int32_t fmt = g->fmt, F4 = MF_KPAD(F);
    int32_t *dots = work; /* the feature products, then each filter's time sum */
    int8_t *newest = (int8_t *)(void *)(work + F4);
    int16_t *xw = (int16_t *)(void *)(work + F4 + (F4 >> 2));
    int32_t f;
    mf_svdf_widen(x, g->n_in, -g->zp_in, xw);
    for (f = 0; f < F; f += 4) { /* the feature products, 4 filters at a time */
        int32_t acc[4] = {0, 0, 0, 0};
        const void *blk = fmt == MF_W16 ? (const void *)((const int16_t *)wf + f * G * 4)
                                        : (const void *)((const int8_t *)wf + f * G * 4);
        mf_dot4(xw, blk, G, fmt, acc);
        memcpy(dots + f, acc, sizeof acc);
    }
    if (g->sf_state && g->rq_state.post) { /* requantized to the newest entries */
        mf_svdf_newest(dots, newest, F, &g->rq_state, 1, g->zp_state);
    } else {
        mf_svdf_newest(dots, newest, F, &g->rq_state, 0, g->zp_state);
    }
    /* the memory one entry older with the newest last, dotted with weights_time */
    if (!mf_svdf_words(old, state, wt, newest, dots, F, M)) {
        for (f = 0; f < F; ++f) {
            const int8_t *o = old + f * M, *w = wt + f * M;
            int8_t *s = state + f * M;
            int32_t acc = 0, m;
            for (m = 0; m + 1 < M; ++m) {
                const int8_t e = o[m + 1];
                s[m] = e;
                acc += (int32_t)w[m] * e;
            }
            s[M - 1] = newest[f];
            dots[f] = acc + (int32_t)w[M - 1] * newest[f];
        }
    }
    /* each unit: its bias and its filters' sums */
    if (R != 1 || g->lo != -128 || g->hi != 127) {
        mf_svdf_units(dots, bias, y, F / R, R, &g->rq_out, g->sf_out, 0, g->lo, g->hi);
    } else if (g->sf_out && g->rq_out.post) {
        mf_svdf_units(dots, bias, y, F, 1, &g->rq_out, 1, 1, -128, 127);
    } else {
        mf_svdf_units(dots, bias, y, F, 1, &g->rq_out, 0, 1, -128, 127);
    }
}

/* ---- QUANTIZE int16 -> int8 (codegen_c/kernels/requant.py) ---------------------------------
 *
 *   mf_seq_quantize_s16_s8(x, y, n, x_zp, q, sfx): y[i] = sat8(mf_rq_apply(x[i] - x_zp, q,
 *   signfix)) for i < n: TFLM's Requantize (MultiplyByQuantizedMultiplier(x - x_zp) + the
 *   output zero point, clamped to int8) in the fast form the schedule proved exact on every
 *   int16 input; the output zero point is in q->add. sfx: signfix and post != 0.
 *   mps2-an386, 96 elements: 774 instructions at -O2, 853 at -Os (the reference 3,454). */
MF_MICRO void mf_seq_quantize_s16_s8(const int16_t *x, int8_t *y, int32_t n, int32_t x_zp,
                                     const mf_rq *q, int32_t sfx) {
    const int32_t mult = q->mult, add = q->add, pre = q->pre, post = q->post;
    const int16_t *end = x + n;
    if (sfx) {
        while (x < end) {
            const int32_t h = mf_smmlar((int32_t)((uint32_t)(*x++ - x_zp) << pre), mult);
            *y++ = (int8_t)mf_svdf_sat8((h + add + (h >> 31)) >> post);
        }
    } else {
        while (x < end) {
            const int32_t h = mf_smmlar((int32_t)((uint32_t)(*x++ - x_zp) << pre), mult);
            *y++ = (int8_t)mf_svdf_sat8((h + add) >> post);
        }
    }
}

#endif /* MCUFORGE_SEQ_H */
