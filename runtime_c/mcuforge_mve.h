/* mcuforge_mve.h: GEMM micro-kernels for Helium (the Arm M-profile Vector Extension, MVE:
 * Cortex-M55, M85): int8 1x1 convolutions and fully connected layers over rows of
 * activations (mf_mve_gemm) and im2col convolutions (mf_mve_conv), TFLM's int8 numerics.
 *
 * For r < rows, o < O (the input zero point folded into the bias, pack.fold_bias):
 *   y[r * y_stride + o] = clamp(mf_rq_apply(bias[o] + sum_{k<K} x_r[k] * w[o][k], rq[o],
 *                                           signfix), lo, hi)
 * with x_r the raw int8 values of row r (mcuforge_nn.h's mf_rq_apply, exact vs TFLM's
 * MultiplyByQuantizedMultiplier under the bounds pack.requant_params proves).
 *
 * Layout (codegen_c/pack_mve.py: pack_mve builds it, words sizes it): one int32 stream, per
 * block of 4 output channels (the last block padded with zero channels) MF_MVE_BLOCK_WORDS(K)
 * words:
 *   bias[4]                    int32, input zero point folded in
 *   weights[C][4][16]          int8: chunk c of channel j is w[4b + j][16c .. 16c + 15],
 *                              C = MF_MVE_CHUNKS(K) = ceil(K / 16), taps K..16C-1 are 0
 *   mult[4], add[4]            mf_rq's mult and add
 *   shl[4]                     mf_rq's pre - 1 (VQRDMULH doubles: SMMLAR(a << pre, m) =
 *                              VQRDMULH(a << (pre - 1), m), exact while a << pre fits)
 *   nshr[4]                    -post (VSHL by a negative count: arithmetic right shift)
 *   sfm[4]                     -1 where the sign term applies (signfix and post >= 1), else 0
 * Weights stay int8 (1x flash). The activations are read as they are (any alignment); the
 * last chunk of a row is loaded under a VCTP predicate, so no byte past x_r[K-1] is read.
 *
 * flags (the `signfix` argument): bit 0 (MF_MVE_SIGN): some channel has the sign term (sfm),
 * bit 1 (MF_MVE_SHL): some channel has shl != 0. Both only skip work that would compute the
 * same values. mf_mve_gemm_f<F> / mf_mve_conv_f<F> are the code of flags F (what the schedule,
 * codegen_c/kernels/mve.py, calls); mf_mve_gemm / mf_mve_conv test the flags at run time.
 *
 * The MVE body (MF_USE_MVE, default: the compiler's __ARM_FEATURE_MVE): VMLADAVA.S8 (16 MACs
 * into a scalar whose register must be even-numbered: r0-r12 and lr, 8 of them), register
 * blocks of 4 channels x 2 rows (mf_mve_dot4x2: per 16 taps 2 + 4 loads and 8 VMLADAVA; the
 * odd last row 4 x 1, mf_mve_dot4: WLS/LE loop), the K loop as inline asm (gcc 12's
 * intrinsics loops spill Q registers and cannot hold 8 accumulators), the accumulators moved
 * into Q registers and requantized 4 at a time (mf_mve_rq4: VQRDMULH, VADD, sign term, VSHL,
 * VMAX, VMIN, narrowing VSTRB.32; the weights' and requantization vectors loaded once for two
 * rows). im2col (mf_mve_conv): two patches at a time in scratch (2 * K bytes), copies and
 * fills as tail-predicated loops (WLSTP/LETP). At -O0 (gcc keeps r7 for the frame) or with
 * MF_MVE_ASM 0 the intrinsics body is used. The portable C body (MF_USE_MVE 0: host, tests,
 * other cores) reads the same stream. tests/test_nn_mve.py checks every body and -O level.
 *
 * mf_mve_gemm_k32 (1x1 layers with K <= 32, flags 0, hi = 127, >= 2 rows: VWW's K = 8 / 16
 * / 32) swaps the loops: per block one loop over all rows with the requantization (K <= 16:
 * and the block's weights) in Q registers (mf_mve_rows16, mf_mve_rows32). Convolutions whose
 * kernel rows are <= 16 bytes (first layers) copy windows inside the image by predicated row
 * loads and stores (mf_mve_patch16) instead of mf_mve_im2col.
 *
 * Measured on QEMU mps3-an547 (-icount, arm-none-eabi-gcc 12.2 -O2, the generated firmware:
 * `mcuforge bench MODEL --board mps3-an547 --per-layer`), per layer incl. im2col,
 * requantization and the call, MAC per instruction:
 *   KWS: 1x1 64->64 over 125 px 5.21, first conv 10x4 s2 1->64 (im2col) 3.21, FC 64->12 3.43;
 *     its GEMM layers 0.493 M instructions for 2.37 M MACs (4.81)
 *   ResNet-8: 3x3 16->16 (im2col, K = 144) 5.0-5.2, 3x3 s2 / 32->32 / 64->64 5.7-7.2,
 *     first conv 3x3 3->16 2.17, strided 1x1 shortcuts (K = 16, 32; sign term) 2.0 / 3.2;
 *     GEMM layers 2.32 M for 12.5 M MACs (5.40)
 *   VWW: 1x1 with K = 8 / 16 / 32 1.88 / 3.74 / 4.2, K >= 64 5.1-6.8, first conv 3x3 s2
 *     3->8 2.03; GEMM layers 1.47 M for 6.69 M MACs (4.57)
 *   AD (single-row FC): 640->128 5.97, 128->128 4.7, 128->8 4.0, 8->128 0.82, 128->640 4.6
 * A block of 4 channels x 2 rows costs about 40 instructions beside its 14 per 16 taps
 * (requantization, moves, loop and spills); mf_mve_gemm_k32's blocks cost 17-19 (K <= 16,
 * 4 VMLADAVA) and 30-31 (K <= 32, 8 VMLADAVA) instructions a row: VWW's K = 8 layer is bound
 * by VMLADAVA's 16 taps (half of them zero). -Os costs 2-6 % more instructions, -O3 1-2 %
 * fewer for twice the code (see the issue-13 report).
 */
#ifndef MCUFORGE_MVE_H
#define MCUFORGE_MVE_H

#include <stdint.h>
#include <string.h>

#include "mcuforge_nn.h"

#ifndef MF_USE_MVE
#if defined(__ARM_FEATURE_MVE) && (__ARM_FEATURE_MVE & 1)
#define MF_USE_MVE 1
#else
#define MF_USE_MVE 0
#endif
#endif

#if MF_USE_MVE
#include <arm_mve.h>
#if defined(__ARMEB__)
#error "mcuforge_mve.h: the MVE kernels assume little-endian memory; build with -DMF_USE_MVE=0"
#endif
#endif

#if MF_USE_MVE && defined(__GNUC__) && defined(__OPTIMIZE__) && defined(__thumb2__)
#ifndef MF_MVE_ASM
#define MF_MVE_ASM 1
#endif
#else
#undef MF_MVE_ASM
#define MF_MVE_ASM 0
#endif

/* the helpers: always inlined when optimizing (accumulators in registers, the flags folded);
 * at -O0 each is one function: inlined there, every entry (mf_mve_conv_f0..f3, gemm_f0..f3)
 * kept a copy of every branch and VWW's code took 522 KB of the M55's 512 KB flash (now
 * 338 KB) */
#if defined(__GNUC__) && defined(__OPTIMIZE__)
#define MF_MVE_INLINE static inline __attribute__((always_inline))
#else
#define MF_MVE_INLINE static inline
#endif

/* mf_mve_dot4x2's asm takes all 8 even core registers (r0 r2 r4 r6 r8 r10 r12 lr) for its
 * accumulators, and 4 more. gcc 12's register allocator reloads a spilled operand into a low
 * register (r0-r7: the 16-bit LDR from the stack); with a frame pointer in r7
 * (-fno-omit-frame-pointer) only r1 r3 r5 are left low, and with 4 operands in the "r" class
 * it failed ("impossible constraints") at -Os, -O3 and -O2 alike. So two operands take the
 * low class ("l") and two the high one ("h": r9 r11 are left there), or, at -Os, all four
 * are pinned to r1 r3 r5 r9 (MF_MVE_PIN), which costs fewer moves there (ResNet-8: 58 K fewer
 * instructions than "l"/"h"; at -O2 pinned costs 12-15 K more, "l"/"h" nothing). */
#if defined(__OPTIMIZE_SIZE__)
#define MF_MVE_PIN(R) __asm__(R)
#define MF_MVE_LO "r"
#define MF_MVE_HI "r"
#else
#define MF_MVE_PIN(R)
#define MF_MVE_LO "l"
#define MF_MVE_HI "h"
#endif

#define MF_MVE_CHUNKS(K) (((K) + 15) >> 4)
#define MF_MVE_BLOCK_WORDS(K) (24 + 16 * MF_MVE_CHUNKS(K))
#define MF_MVE_SIGN 1 /* flags: some channel has the sign term */
#define MF_MVE_SHL 2  /* flags: some channel shifts left before the multiply */

#if MF_USE_MVE
/* Requantization of 4 accumulators (mf_rq_apply + clamp, lane by lane); p: mult, add, shl,
 * nshr, sfm of the 4 channels (4 words each). */
MF_MVE_INLINE int32x4_t mf_mve_rq4(int32x4_t acc, const int32_t *p, int32_t flags, int32x4_t lo,
                                   int32x4_t hi) {
    int32x4_t h, v;
    if (flags & MF_MVE_SHL) acc = vshlq_s32(acc, vldrwq_s32(p + 8));
    h = vqrdmulhq_s32(acc, vldrwq_s32(p));
    v = vaddq_s32(h, vldrwq_s32(p + 4));
    if (flags & MF_MVE_SIGN) v = vaddq_s32(v, vandq_s32(vshrq_n_s32(h, 31), vldrwq_s32(p + 16)));
    v = vshlq_s32(v, vldrwq_s32(p + 12));
    return vminq_s32(vmaxq_s32(v, lo), hi);
}

/* The accumulators of 4 channels x 1 row: bias + x . w over K taps; *pk advances to the
 * block's requantization words. */
MF_MVE_INLINE int32x4_t mf_mve_dot4(const int8_t *x, int32_t k, const int32_t **pk) {
#if MF_MVE_ASM
    const int32_t *w = *pk;
    int32_t r = k;
    register int32_t a0 __asm__("r0");
    register int32_t a1 __asm__("r2");
    register int32_t a2 __asm__("r4");
    register int32_t a3 __asm__("r6");
    int8x16_t a, u, v;
    int32x4_t o;
#define MF_MVE_CHUNK(LOAD)                                                                 \
    LOAD "\n\t"                                                                             \
    "vldrb.u8 %q[u], [%[w]], #16\n\t"                                                       \
    "vmladava.s8 %[a0], %q[a], %q[u]\n\t"                                                   \
    "vldrb.u8 %q[v], [%[w]], #16\n\t"                                                       \
    "vmladava.s8 %[a1], %q[a], %q[v]\n\t"                                                   \
    "vldrb.u8 %q[u], [%[w]], #16\n\t"                                                       \
    "vmladava.s8 %[a2], %q[a], %q[u]\n\t"                                                   \
    "vldrb.u8 %q[v], [%[w]], #16\n\t"                                                       \
    "vmladava.s8 %[a3], %q[a], %q[v]\n\t"
    /* the accumulators in fixed even registers (VMLADAVA's Rda). The 4 lanes are then set by
     * single-lane moves (the two-lane VMOV's lane order differs between QEMU 7.2 and LLVM's
     * reading of the architecture) */
    /* lr counts the full chunks ((K - 1) / 16, low-overhead loop WLS/LE), r the tail's taps
     * ((K - 1) % 16 + 1) */
    __asm__("ldm %[w]!, {%[a0], %[a1], %[a2], %[a3]}\n\t"
            "subs %[r], %[r], #1\n\t"
            "lsr lr, %[r], #4\n\t"
            "and %[r], %[r], #15\n\t"
            "add %[r], %[r], #1\n\t"
            "wls lr, lr, 2f\n"
            "1:\n\t" MF_MVE_CHUNK("vldrb.u8 %q[a], [%[x]], #16")
            "le lr, 1b\n"
            "2:\n\t"
            "vctp.8 %[r]\n\t"
            "vpst\n\t" MF_MVE_CHUNK("vldrbt.u8 %q[a], [%[x]]")
            : [a0] "=&r"(a0), [a1] "=&r"(a1), [a2] "=&r"(a2), [a3] "=&r"(a3), [a] "=&w"(a),
              [u] "=&w"(u), [v] "=&w"(v), [x] "+r"(x), [w] "+r"(w), [r] "+r"(r)
            :
            : "cc", "lr", "p0", "memory"); /* p0: VPR, which VCTP sets */
#undef MF_MVE_CHUNK
    *pk = w;
    o = vdupq_n_s32(a0);
    o = vsetq_lane_s32(a1, o, 1);
    o = vsetq_lane_s32(a2, o, 2);
    return vsetq_lane_s32(a3, o, 3);
#else
    const int32_t *b = *pk;
    const int8_t *w = (const int8_t *)(b + 4);
    int32_t a0 = b[0], a1 = b[1], a2 = b[2], a3 = b[3], n = k;
    int32_t t[4];
    while (n > 0) {
        mve_pred16_t p = vctp8q((uint32_t)n);
        int8x16_t xv = vldrbq_z_s8(x, p);
        a0 = vmladavaq_s8(a0, xv, vldrbq_s8(w));
        a1 = vmladavaq_s8(a1, xv, vldrbq_s8(w + 16));
        a2 = vmladavaq_s8(a2, xv, vldrbq_s8(w + 32));
        a3 = vmladavaq_s8(a3, xv, vldrbq_s8(w + 48));
        x += 16;
        w += 64;
        n -= 16;
    }
    t[0] = a0;
    t[1] = a1;
    t[2] = a2;
    t[3] = a3;
    *pk = (const int32_t *)(const void *)w;
    return vldrwq_s32(t);
#endif
}

/* The accumulators of 4 channels x 2 rows (x0, x1): VMLADAVA's 8 even registers r0-r12 and
 * lr (no low-overhead loop then: SUBS/BGT on the taps left), 4 more registers for the
 * pointers and the count (at -fno-omit-frame-pointer r1 r3 r5 r9 r11 are left: see
 * MF_MVE_PIN). The bias is loaded into both rows' accumulators by two LDMs; the 8 sums leave
 * through the stack (one PUSH, two VLDRW: a buffer of our own would need a sixth register). */
MF_MVE_INLINE void mf_mve_dot4x2(const int8_t *x0, const int8_t *x1, int32_t k, const int32_t **pk,
                                 int32x4_t *y0, int32x4_t *y1) {
#if MF_MVE_ASM
    register const int8_t *px0 MF_MVE_PIN("r1") = x0;
    register const int8_t *px1 MF_MVE_PIN("r3") = x1;
    register const int32_t *w MF_MVE_PIN("r5") = *pk;
    register int32_t r MF_MVE_PIN("r9") = k; /* taps left: full chunks, then the VCTP tail */
    register int32_t a0 __asm__("r0");
    register int32_t a1 __asm__("r2");
    register int32_t a2 __asm__("r4");
    register int32_t a3 __asm__("r6");
    register int32_t b0 __asm__("r8");
    register int32_t b1 __asm__("r10");
    register int32_t b2 __asm__("r12");
    register int32_t b3 __asm__("lr");
    int32x4_t a, b, u, v;
#define MF_MVE_CHUNK2(LOAD)                                                                \
    LOAD                                                                                    \
    "vldrb.u8 %q[u], [%[w]], #16\n\t"                                                       \
    "vmladava.s8 %[a0], %q[a], %q[u]\n\t"                                                   \
    "vmladava.s8 %[b0], %q[b], %q[u]\n\t"                                                   \
    "vldrb.u8 %q[v], [%[w]], #16\n\t"                                                       \
    "vmladava.s8 %[a1], %q[a], %q[v]\n\t"                                                   \
    "vmladava.s8 %[b1], %q[b], %q[v]\n\t"                                                   \
    "vldrb.u8 %q[u], [%[w]], #16\n\t"                                                       \
    "vmladava.s8 %[a2], %q[a], %q[u]\n\t"                                                   \
    "vmladava.s8 %[b2], %q[b], %q[u]\n\t"                                                   \
    "vldrb.u8 %q[v], [%[w]], #16\n\t"                                                       \
    "vmladava.s8 %[a3], %q[a], %q[v]\n\t"                                                   \
    "vmladava.s8 %[b3], %q[b], %q[v]\n\t"
    __asm__("ldm %[w], {%[a0], %[a1], %[a2], %[a3]}\n\t"
            "ldm %[w]!, {%[b0], %[b1], %[b2], %[b3]}\n\t"
            "subs %[r], %[r], #16\n\t"
            "ble 2f\n"
            "1:\n\t" MF_MVE_CHUNK2("vldrb.u8 %q[a], [%[x0]], #16\n\t"
                                   "vldrb.u8 %q[b], [%[x1]], #16\n\t")
            "subs %[r], %[r], #16\n\t"
            "bgt 1b\n"
            "2:\n\t"
            "adds %[r], %[r], #16\n\t"
            "vctp.8 %[r]\n\t"
            "vpstt\n\t" MF_MVE_CHUNK2("vldrbt.u8 %q[a], [%[x0]]\n\t"
                                      "vldrbt.u8 %q[b], [%[x1]]\n\t")
            "push {%[a0], %[a1], %[a2], %[a3], %[b0], %[b1], %[b2], %[b3]}\n\t"
            "vldrw.u32 %q[a], [sp]\n\t"
            "vldrw.u32 %q[b], [sp, #16]\n\t"
            "add sp, sp, #32"
            : [a0] "=&r"(a0), [a1] "=&r"(a1), [a2] "=&r"(a2), [a3] "=&r"(a3),
              [b0] "=&r"(b0), [b1] "=&r"(b1), [b2] "=&r"(b2), [b3] "=&r"(b3),
              [a] "=&w"(a), [b] "=&w"(b), [u] "=&w"(u), [v] "=&w"(v),
              [x0] "+" MF_MVE_LO(px0), [x1] "+" MF_MVE_HI(px1), [w] "+" MF_MVE_LO(w),
              [r] "+" MF_MVE_HI(r)
            :
            : "cc", "p0", "memory");
#undef MF_MVE_CHUNK2
    (void)a0, (void)a1, (void)a2, (void)a3, (void)b0, (void)b1, (void)b2, (void)b3;
    (void)px0, (void)px1;
    *pk = w;
    *y0 = a; /* one PUSH and two loads instead of eight lane moves */
    *y1 = b;
#else
    const int32_t *p = *pk;
    *y0 = mf_mve_dot4(x0, k, &p);
    *y1 = mf_mve_dot4(x1, k, pk);
#endif
}
#endif

/* One row of K activations through every block: y[0..O-1]. */
MF_MVE_INLINE void mf_mve_row(const int8_t *x, int32_t k, const int32_t *pk, int32_t o,
                              int32_t lo, int32_t hi, int32_t flags, int8_t *y) {
#if MF_USE_MVE
    int32x4_t vlo = vdupq_n_s32(lo), vhi = vdupq_n_s32(hi);
    for (; o > 0; o -= 4, y += 4) {
        int32x4_t v = mf_mve_dot4(x, k, &pk);
        v = mf_mve_rq4(v, pk, flags, vlo, vhi);
        if (o >= 4)
            vstrbq_s32(y, v);
        else
            vstrbq_p_s32(y, v, vctp32q((uint32_t)o));
        pk += 20;
    }
#else
    int32_t c = MF_MVE_CHUNKS(k);
    for (; o > 0; o -= 4, y += 4, pk += MF_MVE_BLOCK_WORDS(k)) {
        const int8_t *w = (const int8_t *)(pk + 4);
        const int32_t *p = pk + 4 + 16 * c;
        int32_t j, i;
        for (j = 0; j < 4 && j < o; ++j) {
            int32_t acc = pk[j], h, v;
            for (i = 0; i < k; ++i) acc += x[i] * w[(i >> 4) * 64 + j * 16 + (i & 15)];
            /* mf_rq_apply: SMMLAR(acc << pre, mult) with pre = shl + 1 */
            h = mf_smmlar((int32_t)((uint32_t)acc << (p[8 + j] + 1)), p[j]);
            v = h + p[4 + j];
            if (flags & MF_MVE_SIGN) v += (h >> 31) & p[16 + j];
            v >>= -p[12 + j];
            y[j] = (int8_t)(v < lo ? lo : v > hi ? hi : v);
        }
    }
#endif
}

/* Two rows (x0 -> y0, x1 -> y1) through every block: the weights and the requantization
 * vectors loaded once for both. */
MF_MVE_INLINE void mf_mve_row2(const int8_t *x0, const int8_t *x1, int32_t k, const int32_t *pk,
                               int32_t o, int32_t lo, int32_t hi, int32_t flags, int8_t *y0,
                               int8_t *y1) {
#if MF_USE_MVE
    int32x4_t vlo = vdupq_n_s32(lo), vhi = vdupq_n_s32(hi);
    for (; o > 0; o -= 4, y0 += 4, y1 += 4) {
        int32x4_t v0, v1;
        mf_mve_dot4x2(x0, x1, k, &pk, &v0, &v1);
        v0 = mf_mve_rq4(v0, pk, flags, vlo, vhi);
        v1 = mf_mve_rq4(v1, pk, flags, vlo, vhi);
        if (o >= 4) {
            vstrbq_s32(y0, v0);
            vstrbq_s32(y1, v1);
        } else {
            mve_pred16_t p = vctp32q((uint32_t)o);
            vstrbq_p_s32(y0, v0, p);
            vstrbq_p_s32(y1, v1, p);
        }
        pk += 20;
    }
#else
    mf_mve_row(x0, k, pk, o, lo, hi, flags, y0);
    mf_mve_row(x1, k, pk, o, lo, hi, flags, y1);
#endif
}

/* Rows two at a time through every block (mf_mve_row2), the odd last row alone. */
MF_MVE_INLINE void mf_mve_gemm_rows(const int8_t *x, int32_t rows, int32_t x_stride, int32_t k,
                                    const int32_t *pk, int32_t o, int32_t lo, int32_t hi,
                                    int32_t flags, int8_t *y, int32_t y_stride) {
    for (; rows >= 2; rows -= 2, x += 2 * x_stride, y += 2 * y_stride)
        mf_mve_row2(x, x + x_stride, k, pk, o, lo, hi, flags, y, y + y_stride);
    if (rows) mf_mve_row(x, k, pk, o, lo, hi, flags, y);
}

#if MF_MVE_ASM
/* K <= 16, flags 0, hi = 127: per block of 4 channels one low-overhead loop over all rows,
 * the 4 weight vectors, mult and -post in Q registers (8 Q registers in all: 4 weights, the
 * row, mult, -post, lo); per row 17-19 instructions (the row's load, the bias by LDM, 4
 * VMLADAVA, STM/VLDRW into a vector, VQRDMULH, VRSHL (rounding right shift: the same as
 * mf_rq's add of 2^(post-1) then floor shift), VADD of y_zp as a scalar, VQSHL #24 / VSHR #24
 * (the int8 saturation: hi = 127 and lo >= -128), VMAX lo unless lo = -128, VSTRB.32) against
 * ~27 in mf_mve_row2. The rows whose 16-byte load stays inside the input (up to its last
 * row's K-th byte) are loaded whole, the last `tail` ones under a VCTP predicate. Full blocks
 * only (the store is not predicated). strides: x_stride | y_stride << 16 (one register for
 * both: UXTAH and ADD LSR #16). One block a call, not inlined, and 9 general operands: with
 * the block loop's values live around it, or with 10 operands at -fno-omit-frame-pointer, gcc
 * found no registers for the asm ("impossible constraints"). */
#define MF_MVE_ROW16(CLAMP)                                                                 \
    "uxtah %[x], %[x], %[st]\n\t"                                                           \
    "ldm %[w], {%[a0], %[a1], %[a2], %[a3]}\n\t"                                            \
    "vmladava.s8 %[a0], %q[v], %q[w0]\n\t"                                                  \
    "vmladava.s8 %[a1], %q[v], %q[w1]\n\t"                                                  \
    "vmladava.s8 %[a2], %q[v], %q[w2]\n\t"                                                  \
    "vmladava.s8 %[a3], %q[v], %q[w3]\n\t"                                                  \
    "stm sp, {%[a0], %[a1], %[a2], %[a3]}\n\t"                                              \
    "vldrw.u32 %q[v], [sp]\n\t"                                                             \
    "vqrdmulh.s32 %q[v], %q[v], %q[m]\n\t"                                                  \
    "vrshl.s32 %q[v], %q[v], %q[s]\n\t"                                                     \
    "vadd.i32 %q[v], %q[v], %[zp]\n\t"                                                      \
    "vqshl.s32 %q[v], %q[v], #24\n\t"                                                       \
    "vshr.s32 %q[v], %q[v], #24\n\t" CLAMP                                                  \
    "vstrb.32 %q[v], [%[y]]\n\t"                                                            \
    "add %[y], %[y], %[st], lsr #16\n\t"
/* a0: VCTP's count, a1: the whole rows (WLS), a2: VDUP's lo, a3: the tail rows (kept on the
 * stack over the first loop); then the accumulators. */
#define MF_MVE_ROWS16_ASM(CLAMP)                                                            \
    __asm__ volatile("vctp.8 %[a0]\n\t"                                                     \
                     "vdup.32 %q[vlo], %[a2]\n\t"                                           \
                     "vldrw.u32 %q[w0], [%[w], #16]\n\t"                                    \
                     "vldrw.u32 %q[w1], [%[w], #32]\n\t"                                    \
                     "vldrw.u32 %q[w2], [%[w], #48]\n\t"                                    \
                     "vldrw.u32 %q[w3], [%[w], #64]\n\t"                                    \
                     "vldrw.u32 %q[m], [%[w], #80]\n\t"                                     \
                     "vldrw.u32 %q[s], [%[w], #128]\n\t"                                    \
                     "sub sp, sp, #24\n\t"                                                  \
                     "str %[a3], [sp, #16]\n\t"                                             \
                     "wls lr, %[a1], 2f\n"                                                  \
                     "1:\n\t"                                                               \
                     "vldrb.u8 %q[v], [%[x]]\n\t" MF_MVE_ROW16(CLAMP)                       \
                     "le lr, 1b\n"                                                          \
                     "2:\n\t"                                                               \
                     "ldr %[a1], [sp, #16]\n\t"                                             \
                     "wls lr, %[a1], 4f\n"                                                  \
                     "3:\n\t"                                                               \
                     "vpst\n\t"                                                             \
                     "vldrbt.u8 %q[v], [%[x]]\n\t" MF_MVE_ROW16(CLAMP)                      \
                     "le lr, 3b\n"                                                          \
                     "4:\n\t"                                                               \
                     "add sp, sp, #24"                                                      \
                     : [a0] "+r"(a0), [a1] "+r"(a1), [a2] "+r"(a2), [a3] "+r"(a3),          \
                       [v] "=&w"(v), [w0] "=&w"(w0), [w1] "=&w"(w1), [w2] "=&w"(w2),        \
                       [w3] "=&w"(w3), [m] "=&w"(m), [s] "=&w"(s), [vlo] "=&w"(vlo),        \
                       [x] "+r"(x), [y] "+r"(yr)                                            \
                     : [w] "r"(pk), [st] "r"(strides), [zp] "r"(zp)                         \
                     : "cc", "lr", "p0", "memory")
static __attribute__((unused, noinline)) void mf_mve_rows16(const int8_t *x, int32_t rows,
                                                            int32_t strides, int32_t k,
                                                            const int32_t *pk, int32_t lo,
                                                            int32_t zp, int8_t *y) {
    /* tail: the last rows r with r * x_stride + 16 > (rows - 1) * x_stride + K */
    int32_t xs = strides & 0xffff, tail = k < 16 ? (16 - k + xs - 1) / xs : 0;
    register int32_t a0 __asm__("r0") = k;
    register int32_t a1 __asm__("r2");
    register int32_t a2 __asm__("r4") = lo;
    register int32_t a3 __asm__("r6");
    register int8_t *yr __asm__("r1") = y; /* VSTRB.32 takes a low register (r0-r7) */
    int8x16_t v, w0, w1, w2, w3;
    int32x4_t m, s, vlo;
    if (tail > rows) tail = rows;
    a1 = rows - tail;
    a3 = tail;
    /* volatile: its outputs are unused (it works through memory) */
    if (lo == -128)
        MF_MVE_ROWS16_ASM("");
    else
        MF_MVE_ROWS16_ASM("vmax.s32 %q[v], %q[v], %q[vlo]\n\t");
    (void)a0, (void)a1, (void)a2, (void)a3;
}
#undef MF_MVE_ROWS16_ASM
#undef MF_MVE_ROW16

/* 16 < K <= 32, the same conditions: the two chunks of the row in Q registers, the block's
 * weights loaded per row (8 VLDRW + 8 VMLADAVA), mult, -post, lo kept; 30-31 instructions a
 * row against ~35 in mf_mve_row2 (which loads the weights once for two rows but spends ~20 a
 * row on moves, requantization and loop). The last ceil((32 - K) / x_stride) rows load their
 * second chunk under a VCTP predicate (K - 16 bytes). */
#define MF_MVE_ROW32(CLAMP)                                                                 \
    "uxtah %[x], %[x], %[st]\n\t"                                                           \
    "ldm %[w], {%[a0], %[a1], %[a2], %[a3]}\n\t"                                            \
    "vldrw.u32 %q[t], [%[w], #16]\n\t"                                                      \
    "vmladava.s8 %[a0], %q[v0], %q[t]\n\t"                                                  \
    "vldrw.u32 %q[u], [%[w], #32]\n\t"                                                      \
    "vmladava.s8 %[a1], %q[v0], %q[u]\n\t"                                                  \
    "vldrw.u32 %q[t], [%[w], #48]\n\t"                                                      \
    "vmladava.s8 %[a2], %q[v0], %q[t]\n\t"                                                  \
    "vldrw.u32 %q[u], [%[w], #64]\n\t"                                                      \
    "vmladava.s8 %[a3], %q[v0], %q[u]\n\t"                                                  \
    "vldrw.u32 %q[t], [%[w], #80]\n\t"                                                      \
    "vmladava.s8 %[a0], %q[v1], %q[t]\n\t"                                                  \
    "vldrw.u32 %q[u], [%[w], #96]\n\t"                                                      \
    "vmladava.s8 %[a1], %q[v1], %q[u]\n\t"                                                  \
    "vldrw.u32 %q[t], [%[w], #112]\n\t"                                                     \
    "vmladava.s8 %[a2], %q[v1], %q[t]\n\t"                                                  \
    "vldrw.u32 %q[u], [%[w], #128]\n\t"                                                     \
    "vmladava.s8 %[a3], %q[v1], %q[u]\n\t"                                                  \
    "stm sp, {%[a0], %[a1], %[a2], %[a3]}\n\t"                                              \
    "vldrw.u32 %q[v0], [sp]\n\t"                                                            \
    "vqrdmulh.s32 %q[v0], %q[v0], %q[m]\n\t"                                                \
    "vrshl.s32 %q[v0], %q[v0], %q[s]\n\t"                                                   \
    "vadd.i32 %q[v0], %q[v0], %[zp]\n\t"                                                    \
    "vqshl.s32 %q[v0], %q[v0], #24\n\t"                                                     \
    "vshr.s32 %q[v0], %q[v0], #24\n\t" CLAMP                                                \
    "vstrb.32 %q[v0], [%[y]]\n\t"                                                           \
    "add %[y], %[y], %[st], lsr #16\n\t"
/* a0: VCTP's count (K - 16), a1: the whole rows, a2: lo, a3: the tail rows */
#define MF_MVE_ROWS32_ASM(CLAMP)                                                            \
    __asm__ volatile("vctp.8 %[a0]\n\t"                                                     \
                     "vdup.32 %q[vlo], %[a2]\n\t"                                           \
                     "vldrw.u32 %q[m], [%[w], #144]\n\t"                                    \
                     "vldrw.u32 %q[s], [%[w], #192]\n\t"                                    \
                     "sub sp, sp, #24\n\t"                                                  \
                     "str %[a3], [sp, #16]\n\t"                                             \
                     "wls lr, %[a1], 2f\n"                                                  \
                     "1:\n\t"                                                               \
                     "vldrb.u8 %q[v0], [%[x]]\n\t"                                          \
                     "vldrb.u8 %q[v1], [%[x], #16]\n\t" MF_MVE_ROW32(CLAMP)                 \
                     "le lr, 1b\n"                                                          \
                     "2:\n\t"                                                               \
                     "ldr %[a1], [sp, #16]\n\t"                                             \
                     "wls lr, %[a1], 4f\n"                                                  \
                     "3:\n\t"                                                               \
                     "vldrb.u8 %q[v0], [%[x]]\n\t"                                          \
                     "vpst\n\t"                                                             \
                     "vldrbt.u8 %q[v1], [%[x], #16]\n\t" MF_MVE_ROW32(CLAMP)                \
                     "le lr, 3b\n"                                                          \
                     "4:\n\t"                                                               \
                     "add sp, sp, #24"                                                      \
                     : [a0] "+r"(a0), [a1] "+r"(a1), [a2] "+r"(a2), [a3] "+r"(a3),          \
                       [v0] "=&w"(v0), [v1] "=&w"(v1), [t] "=&w"(t), [u] "=&w"(u),          \
                       [m] "=&w"(m), [s] "=&w"(s), [vlo] "=&w"(vlo), [x] "+r"(x),           \
                       [y] "+r"(yr)                                                         \
                     : [w] "r"(pk), [st] "r"(strides), [zp] "r"(zp)                         \
                     : "cc", "lr", "p0", "memory")
static __attribute__((unused, noinline)) void mf_mve_rows32(const int8_t *x, int32_t rows,
                                                            int32_t strides, int32_t k,
                                                            const int32_t *pk, int32_t lo,
                                                            int32_t zp, int8_t *y) {
    int32_t xs = strides & 0xffff, tail = k < 32 ? (32 - k + xs - 1) / xs : 0;
    register int32_t a0 __asm__("r0") = k - 16;
    register int32_t a1 __asm__("r2");
    register int32_t a2 __asm__("r4") = lo;
    register int32_t a3 __asm__("r6");
    register int8_t *yr __asm__("r1") = y; /* VSTRB.32 takes a low register (r0-r7) */
    int8x16_t v0, v1, t, u;
    int32x4_t m, s, vlo;
    if (tail > rows) tail = rows;
    a1 = rows - tail;
    a3 = tail;
    if (lo == -128)
        MF_MVE_ROWS32_ASM("");
    else
        MF_MVE_ROWS32_ASM("vmax.s32 %q[v0], %q[v0], %q[vlo]\n\t");
    (void)a0, (void)a1, (void)a2, (void)a3;
}
#undef MF_MVE_ROWS32_ASM
#undef MF_MVE_ROW32

#endif

/* 1x1 convolution / fully connected layer: `rows` rows of K int8 activations, row r at
 * x + r * x_stride, output row r at y + r * y_stride (O bytes). pk: the stream above. */
MF_MVE_INLINE void mf_mve_gemm_body(const int8_t *x, int32_t rows, int32_t x_stride, int32_t k,
                                    const int32_t *pk, int32_t o, int32_t lo, int32_t hi,
                                    int32_t flags, int8_t *y, int32_t y_stride) {
    mf_mve_gemm_rows(x, rows, x_stride, k, pk, o, lo, hi, flags, y, y_stride);
}

/* The entries of one value of flags (the schedule calls these: no test of the flags per block,
 * and only the code of the layer's variant is linked); the flags argument is ignored. */
#define MF_MVE_GEMM_ENTRY(F)                                                                \
    MF_MICRO void mf_mve_gemm_f##F(const int8_t *x, int32_t rows, int32_t x_stride,        \
                                   int32_t k, const int32_t *pk, int32_t o, int32_t lo,     \
                                   int32_t hi, int32_t flags, int8_t *y, int32_t y_stride) { \
        (void)flags;                                                                        \
        mf_mve_gemm_body(x, rows, x_stride, k, pk, o, lo, hi, F, y, y_stride);              \
    }
MF_MVE_GEMM_ENTRY(0)
MF_MVE_GEMM_ENTRY(1)
MF_MVE_GEMM_ENTRY(2)
MF_MVE_GEMM_ENTRY(3)
#undef MF_MVE_GEMM_ENTRY

/* flags at run time: the entry of its value */
MF_MICRO void mf_mve_gemm(const int8_t *x, int32_t rows, int32_t x_stride, int32_t k,
                          const int32_t *pk, int32_t o, int32_t lo, int32_t hi, int32_t flags,
                          int8_t *y, int32_t y_stride) {
    switch (flags & 3) {
    case 0: mf_mve_gemm_f0(x, rows, x_stride, k, pk, o, lo, hi, 0, y, y_stride); break;
    case 1: mf_mve_gemm_f1(x, rows, x_stride, k, pk, o, lo, hi, 1, y, y_stride); break;
    case 2: mf_mve_gemm_f2(x, rows, x_stride, k, pk, o, lo, hi, 2, y, y_stride); break;
    default: mf_mve_gemm_f3(x, rows, x_stride, k, pk, o, lo, hi, 3, y, y_stride); break;
    }
}

/* K <= 32, flags 0, hi = 127 (the schedule calls it for such layers, >= 2 rows):
 * mf_mve_rows16 / mf_mve_rows32 over the full blocks, mf_mve_row over the last O % 4
 * channels; y_zp read back from block 0's add: 2^(post-1) + (y_zp << post) (y_zp when
 * post = 0) shifted right by post. Any other layer, and the bodies without the asm:
 * mf_mve_gemm. */
MF_MICRO void mf_mve_gemm_k32(const int8_t *x, int32_t rows, int32_t x_stride, int32_t k,
                              const int32_t *pk, int32_t o, int32_t lo, int32_t hi,
                              int32_t flags, int8_t *y, int32_t y_stride) {
#if MF_MVE_ASM
    if (k <= 32 && flags == 0 && hi == 127 && lo >= -128 && (uint32_t)x_stride < 0x10000 &&
        (uint32_t)y_stride < 0x8000) {
        int32_t c = MF_MVE_CHUNKS(k), bw = MF_MVE_BLOCK_WORDS(k);
        int32_t zp = pk[4 + 16 * c + 4] >> -pk[4 + 16 * c + 12];
        for (; o >= 4; o -= 4, pk += bw, y += 4) {
            if (c == 1)
                mf_mve_rows16(x, rows, x_stride | y_stride << 16, k, pk, lo, zp, y);
            else
                mf_mve_rows32(x, rows, x_stride | y_stride << 16, k, pk, lo, zp, y);
        }
        for (; o && rows > 0; --rows, x += x_stride, y += y_stride)
            mf_mve_row(x, k, pk, o, lo, 127, 0, y);
        return;
    }
#endif
    mf_mve_gemm(x, rows, x_stride, k, pk, o, lo, hi, flags, y, y_stride);
}

/* Byte copy and fill of the im2col patch: tail-predicated low-overhead loops (WLSTP/LETP: 3
 * instructions per 16 bytes, none per call beyond the setup); newlib-nano's are byte-wise. */
MF_MVE_INLINE void mf_mve_copy(int8_t *d, const int8_t *s, int32_t n) {
#if MF_MVE_ASM
    /* (mf_mve_im2col passes n >= 1) */
    int8x16_t t;
    __asm__ volatile("wlstp.8 lr, %[n], 2f\n"
                     "1:\n\t"
                     "vldrb.u8 %q[t], [%[s]], #16\n\t"
                     "vstrb.8 %q[t], [%[d]], #16\n\t"
                     "letp lr, 1b\n"
                     "2:"
                     : [t] "=&w"(t), [s] "+r"(s), [d] "+r"(d)
                     : [n] "r"(n)
                     : "lr", "memory");
#elif MF_USE_MVE
    for (; n > 0; n -= 16, d += 16, s += 16) {
        mve_pred16_t p = vctp8q((uint32_t)n);
        vstrbq_p_s8(d, vldrbq_z_s8(s, p), p);
    }
#else
    if (n > 0) memcpy(d, s, (size_t)n);
#endif
}

MF_MVE_INLINE void mf_mve_fill(int8_t *d, int32_t v, int32_t n) {
#if MF_MVE_ASM
    int8x16_t t;
    __asm__ volatile("vdup.8 %q[t], %[v]\n\t"
                     "wlstp.8 lr, %[n], 2f\n"
                     "1:\n\t"
                     "vstrb.8 %q[t], [%[d]], #16\n\t"
                     "letp lr, 1b\n"
                     "2:"
                     : [t] "=&w"(t), [d] "+r"(d)
                     : [n] "r"(n), [v] "r"(v)
                     : "lr", "memory");
#elif MF_USE_MVE
    int8x16_t f = vdupq_n_s8((int8_t)v);
    for (; n > 0; n -= 16, d += 16) vstrbq_p_s8(d, f, vctp8q((uint32_t)n));
#else
    if (n > 0) memset(d, v, (size_t)n);
#endif
}

/* The patch of output pixel (oy, ox): [k_h][k_w][in_c] int8, x_zp where outside the image.
 * The kernel rows above and below the image are one fill each (contiguous in the patch); the
 * columns inside the image are the same for every row: left (padding), mid (copied), right
 * (padding) bytes. */
MF_MVE_INLINE void mf_mve_im2col(const int8_t *x, const mf_conv_geom *g, int32_t x_zp, int32_t oy,
                                 int32_t ox, int8_t *patch) {
    int32_t c = g->in_c, seg = g->k_w * c, kh = g->k_h;
    int32_t ix0 = ox * g->stride_w - g->pad_l, iy0 = oy * g->stride_h - g->pad_t;
    int32_t left = ix0 < 0 ? -ix0 : 0;
    int32_t right = ix0 + g->k_w > g->in_w ? ix0 + g->k_w - g->in_w : 0;
    int32_t lb = left * c, mb = (g->k_w - left - right) * c, rb = right * c;
    int32_t ky0 = iy0 < 0 ? -iy0 : 0, ky1 = g->in_h - iy0 < kh ? g->in_h - iy0 : kh, ky;
    const int8_t *src;
    if (mb <= 0 || ky1 <= ky0) { /* the window misses the image */
        mf_mve_fill(patch, x_zp, kh * seg);
        return;
    }
    if (ky0) mf_mve_fill(patch, x_zp, ky0 * seg);
    src = x + ((iy0 + ky0) * g->in_w + ix0 + left) * c;
    for (ky = ky0; ky < ky1; ++ky, src += g->in_w * c) {
        int8_t *row = patch + ky * seg;
        if (lb) mf_mve_fill(row, x_zp, lb);
        mf_mve_copy(row + lb, src, mb);
        if (rb) mf_mve_fill(row + lb + mb, x_zp, rb);
    }
    if (ky1 < kh) mf_mve_fill(patch + ky1 * seg, x_zp, (kh - ky1) * seg);
}

#if MF_USE_MVE
/* The patch of output pixel (oy, ox) when the kernel's rows (k_w * in_c bytes) are <= 16
 * bytes (first layers: 3x3x3, 10x4x1) or a multiple of 16 (ResNet-8's 3x3x16, 3x3x32): a
 * window inside the image is k_h row copies (<= 16: VPSTT VLDRBT VSTRBT, 6 instructions a
 * row; multiples of 16: VLDRB/VSTRB 16 bytes at a time, 3 an iteration and 5 a row), any
 * other one mf_mve_im2col (~130 instructions for 3 rows of 48 bytes), called. */
/* (a call: inlined, its border arithmetic was computed before the test for every window) */
static __attribute__((unused, noinline)) void mf_mve_im2col_border(const int8_t *x,
                                                                   const mf_conv_geom *g,
                                                                   int32_t x_zp, int32_t oy,
                                                                   int32_t ox, int8_t *patch) {
    mf_mve_im2col(x, g, x_zp, oy, ox, patch);
}

MF_MVE_INLINE void mf_mve_patch16(const int8_t *x, const mf_conv_geom *g, int32_t x_zp, int32_t oy,
                                  int32_t ox, int8_t *patch, int32_t inside, int32_t off,
                                  int32_t seg, int32_t step, int32_t kh) {
    const int8_t *src;
    if (!inside) {
        mf_mve_im2col_border(x, g, x_zp, oy, ox, patch);
        return;
    }
    src = x + off;
#if MF_MVE_ASM
    if (seg <= 16) {
        int8x16_t t;
        __asm__ volatile("vctp.8 %[seg]\n\t"
                         "wls lr, %[kh], 2f\n"
                         "1:\n\t"
                         "vpstt\n\t"
                         "vldrbt.u8 %q[t], [%[s]]\n\t"
                         "vstrbt.8 %q[t], [%[d]]\n\t"
                         "add %[s], %[s], %[step]\n\t"
                         "add %[d], %[d], %[seg]\n\t"
                         "le lr, 1b\n"
                         "2:"
                         : [t] "=&w"(t), [s] "+r"(src), [d] "+r"(patch), [kh] "+r"(kh)
                         : [seg] "r"(seg), [step] "r"(step)
                         : "lr", "p0", "memory");
    } else {
        int8x16_t t;
        const int8_t *s;
        __asm__ volatile("1:\n\t"
                         "mov %[s], %[src]\n\t"
                         "dls lr, %[n]\n"
                         "2:\n\t"
                         "vldrb.u8 %q[t], [%[s]], #16\n\t"
                         "vstrb.8 %q[t], [%[d]], #16\n\t"
                         "le lr, 2b\n\t"
                         "add %[src], %[src], %[step]\n\t"
                         "subs %[kh], %[kh], #1\n\t"
                         "bne 1b"
                         : [t] "=&w"(t), [s] "=&r"(s), [src] "+r"(src), [d] "+r"(patch),
                           [kh] "+r"(kh)
                         : [n] "r"(seg >> 4), [step] "r"(step)
                         : "cc", "lr", "memory");
    }
#else
    if (seg <= 16) {
        mve_pred16_t p = vctp8q((uint32_t)seg);
        for (; kh > 0; --kh, src += step, patch += seg)
            vstrbq_p_s8(patch, vldrbq_z_s8(src, p), p);
    } else {
        int32_t j;
        for (; kh > 0; --kh, src += step)
            for (j = 0; j < seg; j += 16, patch += 16) vstrbq_s8(patch, vldrbq_s8(src + j));
    }
#endif
}
#endif

/* Output pixels in pairs (see mf_mve_conv_body); small: kernel rows <= 16 bytes or a
 * multiple of 16 (mf_mve_patch16). */
MF_MVE_INLINE void mf_mve_conv_pairs(const int8_t *x, const mf_conv_geom *g, int32_t x_zp,
                                     const int32_t *pk, int32_t o, int32_t lo, int32_t hi,
                                     int32_t flags, int8_t *y, int8_t *scratch, int32_t small) {
    int32_t k = g->k_h * g->k_w * g->in_c, n = g->out_h * g->out_w, oy = 0, ox = 0;
#if MF_USE_MVE
    if (small) {
        /* windows inside the image: ox in [oxa, oxb], oy in [oya, oyb]; off: the window's
         * first byte in x (kept along the output row: + stride_w * in_c a pixel) */
        int32_t sw = g->stride_w, sh = g->stride_h, c = g->in_c, kh = g->k_h;
        int32_t seg = g->k_w * c, step = g->in_w * c, dx = sw * c;
        int32_t limx = g->in_w - g->k_w + g->pad_l, limy = g->in_h - kh + g->pad_t;
        int32_t oxa = (g->pad_l + sw - 1) / sw, oxb = limx >= 0 ? limx / sw : -1;
        int32_t oya = (g->pad_t + sh - 1) / sh, oyb = limy >= 0 ? limy / sh : -1;
        int32_t off = -g->pad_t * step - g->pad_l * c, rin = oya <= 0 && 0 <= oyb;
#define MF_MVE_PATCH(P)                                                                     \
    mf_mve_patch16(x, g, x_zp, oy, ox, P, rin && ox >= oxa && ox <= oxb, off, seg, step, kh)
#define MF_MVE_NEXT()                                                                       \
    do {                                                                                    \
        if (++ox == g->out_w) {                                                             \
            ox = 0, ++oy;                                                                   \
            off = (oy * sh - g->pad_t) * step - g->pad_l * c;                               \
            rin = oya <= oy && oy <= oyb;                                                   \
        } else {                                                                            \
            off += dx;                                                                      \
        }                                                                                   \
    } while (0)
        for (; n >= 2; n -= 2, y += 2 * o) {
            MF_MVE_PATCH(scratch);
            MF_MVE_NEXT();
            MF_MVE_PATCH(scratch + k);
            MF_MVE_NEXT();
            mf_mve_row2(scratch, scratch + k, k, pk, o, lo, hi, flags, y, y + o);
        }
        if (n) {
            MF_MVE_PATCH(scratch);
            mf_mve_row(scratch, k, pk, o, lo, hi, flags, y);
        }
#undef MF_MVE_NEXT
#undef MF_MVE_PATCH
        return;
    }
#else
    (void)small;
#endif
    for (; n >= 2; n -= 2, y += 2 * o) {
        mf_mve_im2col(x, g, x_zp, oy, ox, scratch);
        if (++ox == g->out_w) ox = 0, ++oy;
        mf_mve_im2col(x, g, x_zp, oy, ox, scratch + k);
        if (++ox == g->out_w) ox = 0, ++oy;
        mf_mve_row2(scratch, scratch + k, k, pk, o, lo, hi, flags, y, y + o);
    }
    if (n) {
        mf_mve_im2col(x, g, x_zp, oy, ox, scratch);
        mf_mve_row(scratch, k, pk, o, lo, hi, flags, y);
    }
}

/* im2col convolution (groups 1, dilation 1, batch 1): output pixels in pairs, their two
 * patches in scratch (2 * k_h * k_w * in_c bytes, any alignment), then both rows through every
 * block (the last pixel of an odd count alone). y: NHWC. */
MF_MVE_INLINE void mf_mve_conv_body(const int8_t *x, const mf_conv_geom *g, int32_t x_zp,
                                   const int32_t *pk, int32_t o, int32_t lo, int32_t hi,
                                   int32_t flags, int8_t *y, int8_t *scratch) {
#if MF_USE_MVE && defined(__OPTIMIZE__) /* (at -O0 a second copy of the loop: VWW's code
                                             * no longer fit the M55's 512 KB flash) */
    if (g->k_w * g->in_c <= 16 || !(g->k_w * g->in_c & 15)) {
        mf_mve_conv_pairs(x, g, x_zp, pk, o, lo, hi, flags, y, scratch, 1);
        return;
    }
#endif
    mf_mve_conv_pairs(x, g, x_zp, pk, o, lo, hi, flags, y, scratch, 0);
}

#define MF_MVE_CONV_ENTRY(F)                                                                \
    MF_MICRO void mf_mve_conv_f##F(const int8_t *x, const mf_conv_geom *g, int32_t x_zp,   \
                                   const int32_t *pk, int32_t o, int32_t lo, int32_t hi,    \
                                   int32_t flags, int8_t *y, int8_t *scratch) {             \
        (void)flags;                                                                        \
        mf_mve_conv_body(x, g, x_zp, pk, o, lo, hi, F, y, scratch);                         \
    }
MF_MVE_CONV_ENTRY(0)
MF_MVE_CONV_ENTRY(1)
MF_MVE_CONV_ENTRY(2)
MF_MVE_CONV_ENTRY(3)
#undef MF_MVE_CONV_ENTRY

MF_MICRO void mf_mve_conv(const int8_t *x, const mf_conv_geom *g, int32_t x_zp,
                          const int32_t *pk, int32_t o, int32_t lo, int32_t hi, int32_t flags,
                          int8_t *y, int8_t *scratch) {
    switch (flags & 3) {
    case 0: mf_mve_conv_f0(x, g, x_zp, pk, o, lo, hi, 0, y, scratch); break;
    case 1: mf_mve_conv_f1(x, g, x_zp, pk, o, lo, hi, 1, y, scratch); break;
    case 2: mf_mve_conv_f2(x, g, x_zp, pk, o, lo, hi, 2, y, scratch); break;
    default: mf_mve_conv_f3(x, g, x_zp, pk, o, lo, hi, 3, y, scratch); break;
    }
}

#endif
