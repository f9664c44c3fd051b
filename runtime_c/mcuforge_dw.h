/* mcuforge_dw.h: int8 depthwise 3x3 convolution micro-kernel (TFLM reference numerics,
 * per-channel quantization, depth multiplier 1, dilation 1, stride 1 or 2 in both directions,
 * explicit top/left padding: SAME or VALID as TFLM computes them, or any other).
 *
 * Technique: a band of input rows of 4 channels (more a pass on small images, g->cg) is widened
 * from NHWC int8 to planar int16 rows whose borders hold the input zero point (the zero point is
 * folded into the bias at compile time, so padding contributes 0 exactly like TFLM's skipped
 * taps); each kernel row's weights are stored as two int16 pairs [w0,w1] and [w1,w2], so two
 * adjacent outputs of one kernel row cost one 64-bit load and four multiply-accumulates (SMLAD,
 * SMLATB, SMLABT, SMLAD: 12 MAC instructions for 18 MACs). The requantization's left shift is
 * folded into the weights and the bias at compile time; the rest is mf_rq_apply's form
 * (mcuforge_nn.h): SMMLAR (rounding and zero point in its accumulate operand), ASR, SSAT, and
 * the activation clamp only when the layer has one. Some images are walked by columns
 * (geom.transpose: KWS's 25x5). The DSP body is asm (widening; channels x rows x outputs: a
 * row is its quads, then a pair and/or a single output by the width mod 4), the portable body
 * plain C on the same packed data and scratch layout; both compute the same integers
 * (tests/test_nn_dw.py).
 *
 * Entries: the generated code calls mf_dw3x3_s8_<s>[f][c]_<k> (codegen_c/pack_dw.entry: stride,
 * sign term, clamp, row shape), which links only that variant's asm: a model carries the
 * variants its layers use (VWW: 6 of the 56, KWS: 1). mf_dw3x3_s8 takes any layer.
 *
 * Instructions per MAC on QEMU mps2-an386 (Cortex-M4), arm-none-eabi-gcc 12.2, widening and
 * all overheads included, default 4 KB scratch budget (tests/nn_bench/dw_bench.py):
 *                                 -O2    -Os                               scratch
 *   KWS  25x5x64   s1 SAME       1.84   1.84                             1568 B
 *   VWW  48x48x8   s1 SAME       1.78   1.78                             4000 B
 *   VWW  48x48x16  s2 SAME       2.54   2.54                             3600 B
 *   VWW  6x6x256   s1 SAME       2.11   2.12                             4096 B
 *   other VWW layers (-O2): 24x24x32 s1 1.84, s2 2.70; 12x12x64 s1 1.89, s2 2.84; 6x6x128 s1
 *   2.12, s2 3.76; 3x3x256 s1 2.93 (per-row and per-channel costs dominate there)
 * The flags hardly matter (the hot loops are asm; the driver's C is compiled for size). Same
 * counts on Cortex-M7 (mps2-an500). Portable body on the M4 (-DMF_USE_DSP=0, -O2): 5.4 / 5.5 /
 * 8.3 / 6.2.
 * Where it goes: 54 instructions per 4 outputs at stride 1 (LDMDB, 3 x (LDRD + LDR + 8 MAC),
 * LDRD, LDM, 4 SMMLAR, 4 ASR, 4 SSAT, 4 STRB, 2 ADD, SUBS, STRD, BNE; stride 2: 57), a row's
 * pair 27 (28), its single output 17, 9 per output row, ~23 per channel and band; widening 24
 * per 4 pixels of 4 channels (STRD; a first pixel alone when the left padding is odd) + ~15 per
 * row. That is ~14 per output at stride 1 and ~23 at stride 2, whose outputs each need 4 input
 * pixels widened; 6 MAC and 4 requantization instructions per output are the floor of this
 * form. Cycles on a real M4 are higher than instructions: each LDMDB/LDM of 8 registers takes 9
 * cycles, LDRD 2-3, a taken branch 2-4: about 100 cycles per quad, ~2.8 cycles per MAC.
 * Code: VWW links 3.9 KB of it (widening 0.5, driver 0.9, 6 channel functions 2.2, entries),
 * KWS 1.9 KB (main: 3.5 KB for any model).
 * Stack: ~300 bytes.
 */
#ifndef MCUFORGE_DW_H
#define MCUFORGE_DW_H

#include "mcuforge_nn.h"

#if defined(__GNUC__)
#define MF_DW_INLINE static inline __attribute__((always_inline))
typedef uint32_t mf_dw_u32 __attribute__((may_alias));
typedef uint32_t mf_dw_u32u __attribute__((may_alias, aligned(1))); /* STR on v7-M, no call */
#define MF_DW_PUT32(p, v) (*(mf_dw_u32u *)(void *)(p) = (v))
#else
#define MF_DW_INLINE static inline
#define MF_DW_PUT32(p, v) do { uint32_t v_ = (v); memcpy((p), &v_, 4); } while (0)
#endif

/* the driver's C (per band and pass, not per output) is compiled for size */
#if defined(__GNUC__) && !defined(__clang__)
#define MF_DW_SMALL __attribute__((optimize("Os")))
#else
#define MF_DW_SMALL
#endif

#define MF_DW_CB 4   /* channels widened together (one 32-bit load of NHWC int8 per pixel) */
#define MF_DW_REC 10 /* int32 per channel in the packed array, see mf_dw3x3_s8 */

/* Layer geometry; codegen_c/pack_dw.py computes pw and rows (the scratch shape). */
typedef struct {
    int16_t h, w, c;       /* input [h][w][c] int8 */
    int16_t oh, ow;        /* output [oh][ow][c] int8 */
    int16_t stride;        /* 1 or 2, both directions */
    int16_t pad_t, pad_l;  /* zero-point rows above / columns left of the input */
    int16_t transpose;     /* 1: the kernel walks columns (narrow images: fewer, longer rows) */
    /* the scratch, in the kernel's view (h, w, oh, ow, pad_t, pad_l swapped when transpose): */
    int16_t pw;            /* int16 per row: even, >= pad_l + w, >= s * (ow rounded to even) + 2 */
    int16_t rows;          /* rows per channel: (output rows per band - 1) * stride + 3 */
    int16_t cg;            /* channels per pass, a multiple of MF_DW_CB: more than 4 only when
                            * one band holds the image (small images: per-pass costs shared) */
} mf_dw_geom;

/* ---- the portable body's primitives: the DSP instructions' integers in C --------------- */
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
/* one aligned word of the scratch (two int16) */
MF_DW_INLINE uint32_t mf_dw_ld(const int16_t *p, int i) {
#if defined(__GNUC__)
    return ((const mf_dw_u32 *)(const void *)p)[i];
#else
    uint32_t v;
    memcpy(&v, p + 2 * i, 4);
    return v;
#endif
}

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

MF_DW_INLINE void mf_dw_put32(int16_t *p, uint32_t v) { MF_DW_PUT32(p, v); }

/* n int16 of the zero point (zz: two of them) from d on, d 2-byte aligned. */
MF_DW_INLINE void mf_dw_fill(int16_t *d, int n, uint32_t zz) {
#if MF_USE_DSP && defined(__GNUC__)
    if (n >= 8 && !((uintptr_t)d & 3)) { /* the whole scratch: STM of 4 words, 3 per 8 int16 */
        int q = n >> 3;
        __asm__ volatile("mov r4, %[z]\n\t"
                         "mov r5, %[z]\n\t"
                         "mov r6, %[z]\n\t"
                         "mov r8, %[z]\n"
                         "1:\n\t"
                         "stm %[d]!, {r4, r5, r6, r8}\n\t"
                         "subs %[q], %[q], #1\n\t"
                         "bne 1b\n\t"
                         : [d] "+r"(d), [q] "+r"(q)
                         : [z] "r"(zz)
                         : "r4", "r5", "r6", "r8", "memory", "cc");
        n &= 7;
    }
#endif
    for (; n >= 2; n -= 2, d += 2) mf_dw_put32(d, zz);
    if (n) *d = (int16_t)zz;
}

/* Widen one row of w pixels (pixel stride xp bytes, nc <= 4 channels from x) into nc planar
 * int16 rows at dst, dst + plane, ... (the portable body; the DSP one is below) */
MF_DW_INLINE void mf_dw_widen(const int8_t *x, int w, int xp, int nc, int16_t *dst, int plane) {
    for (; w > 0; --w, ++dst, x += xp) {
        int k;
        for (k = 0; k < nc; ++k) dst[k * plane] = x[k];
    }
}

/* Copy n words from s to d (both 4-byte aligned, s >= d: forward overlap allowed). */
MF_DW_INLINE void mf_dw_copy(int16_t *d, const int16_t *s, int n) {
#if MF_USE_DSP && defined(__GNUC__)
    if (n >= 4) {
        int q = n >> 2;
        __asm__ volatile("1:\n\t" /* fixed registers: an LDM list must be ascending */
                         "ldm %[s]!, {r4, r5, r6, r8}\n\t"
                         "stm %[d]!, {r4, r5, r6, r8}\n\t"
                         "subs %[q], %[q], #1\n\t"
                         "bne 1b\n\t"
                         : [s] "+r"(s), [d] "+r"(d), [q] "+r"(q)
                         :
                         : "r4", "r5", "r6", "r8", "memory", "cc");
        n &= 3;
    }
#endif
    for (; n > 0; --n, d += 2, s += 2) {
        int16_t t0 = s[0], t1 = s[1];
        d[0] = t0, d[1] = t1;
    }
}

/* Widen nrows rows (xr bytes apart in x, pw int16 apart in dst) of w pixels of nc channels. */
MF_DW_INLINE void mf_dw_widen_rows(const int8_t *x, int xr, int nrows, int w, int xp, int nc,
                                   int16_t *dst, int pw, int plane) {
#if MF_USE_DSP && defined(__GNUC__)
    if (nc == MF_DW_CB) { /* one asm block: gcc's row loop cost ~50 instructions a row */
        /* per row: a first pixel alone when dst is not word-aligned (odd left padding), so
         * that the rest goes 4 pixels an iteration with STRD (24 instructions for 16 int16),
         * then 2 pixels and 1 as left over; the pointers step from row to row by constants */
        const int head = (int)((uintptr_t)dst >> 1) & 1, rest = w - head;
        int32_t m[11];
        m[0] = (int32_t)(uintptr_t)x, m[1] = xp, m[2] = (int32_t)(uintptr_t)dst;
        m[3] = 2 * plane, m[4] = xr - w * xp, m[5] = 2 * (pw - w);
        m[6] = (int32_t)((uintptr_t)x + (uintptr_t)(nrows * xr)), m[7] = head; /* x's end */
        m[8] = rest >> 2, m[9] = rest & 2, m[10] = rest & 1;
        __asm__ volatile(
            "push {r0-r12, lr}\n\t"
            "mov lr, %0\n\t"
            "ldm lr, {r0, r1, r2, r6}\n\t" /* x xp d0 plane */
            "add r3, r2, r6\n\t"
            "add r4, r3, r6\n\t"
            "add r5, r4, r6\n"
            "1:\n\t" /* a row */
            "ldr r6, [lr, #28]\n\t"
            "cbz r6, 2f\n\t"
            "ldr r7, [r0]\n\t" /* the first pixel alone */
            "add r0, r0, r1\n\t"
            "sxtb16 r8, r7\n\t"
            "sxtb16 r7, r7, ror #8\n\t"
            "strh r8, [r2], #2\n\t"
            "strh r7, [r3], #2\n\t"
            "lsrs r8, r8, #16\n\t"
            "lsrs r7, r7, #16\n\t"
            "strh r8, [r4], #2\n\t"
            "strh r7, [r5], #2\n"
            "2:\n\t"
            "ldr r6, [lr, #32]\n\t"
            "cbz r6, 4f\n"
            "3:\n\t" /* pixels a b c d: c0..c3 each */
            "ldr r9, [r0]\n\t"
            "ldr r10, [r0, r1]\n\t"
            "add r0, r0, r1, lsl #1\n\t"
            "ldr r11, [r0]\n\t"
            "ldr r12, [r0, r1]\n\t"
            "add r0, r0, r1, lsl #1\n\t"
            "pkhbt r7, r9, r10, lsl #16\n\t"   /* a.c0 a.c1 b.c0 b.c1 */
            "pkhtb r10, r10, r9, asr #16\n\t"  /* a.c2 a.c3 b.c2 b.c3 */
            "pkhbt r8, r11, r12, lsl #16\n\t"
            "pkhtb r12, r12, r11, asr #16\n\t"
            "sxtb16 r9, r7\n\t"                /* (a.c0, b.c0) */
            "sxtb16 r11, r8\n\t"               /* (c.c0, d.c0) */
            "strd r9, r11, [r2], #8\n\t"
            "sxtb16 r9, r7, ror #8\n\t"
            "sxtb16 r11, r8, ror #8\n\t"
            "strd r9, r11, [r3], #8\n\t"
            "sxtb16 r9, r10\n\t"
            "sxtb16 r11, r12\n\t"
            "strd r9, r11, [r4], #8\n\t"
            "sxtb16 r9, r10, ror #8\n\t"
            "sxtb16 r11, r12, ror #8\n\t"
            "strd r9, r11, [r5], #8\n\t"
            "subs r6, r6, #1\n\t"
            "bne 3b\n"
            "4:\n\t"
            "ldrd r6, r7, [lr, #36]\n\t" /* two pixels more? one more? */
            "cbz r6, 5f\n\t"
            "ldr r9, [r0]\n\t"
            "ldr r10, [r0, r1]\n\t"
            "add r0, r0, r1, lsl #1\n\t"
            "pkhbt r8, r9, r10, lsl #16\n\t"
            "pkhtb r10, r10, r9, asr #16\n\t"
            "sxtb16 r9, r8\n\t"
            "str r9, [r2], #4\n\t"
            "sxtb16 r9, r8, ror #8\n\t"
            "str r9, [r3], #4\n\t"
            "sxtb16 r9, r10\n\t"
            "str r9, [r4], #4\n\t"
            "sxtb16 r9, r10, ror #8\n\t"
            "str r9, [r5], #4\n"
            "5:\n\t"
            "cbz r7, 6f\n\t"
            "ldr r7, [r0]\n\t"
            "add r0, r0, r1\n\t"
            "sxtb16 r8, r7\n\t"
            "sxtb16 r7, r7, ror #8\n\t"
            "strh r8, [r2], #2\n\t"
            "strh r7, [r3], #2\n\t"
            "lsrs r8, r8, #16\n\t"
            "lsrs r7, r7, #16\n\t"
            "strh r8, [r4], #2\n\t"
            "strh r7, [r5], #2\n"
            "6:\n\t" /* the next row, until x reaches its end */
            "ldrd r6, r7, [lr, #16]\n\t" /* dx dd */
            "add r0, r0, r6\n\t"
            "add r2, r2, r7\n\t"
            "add r3, r3, r7\n\t"
            "add r4, r4, r7\n\t"
            "add r5, r5, r7\n\t"
            "ldr r6, [lr, #24]\n\t"
            "cmp r0, r6\n\t"
            "bne 1b\n\t"
            "pop {r0-r12, lr}\n\t"
            :
            : "r"(m)
            : "memory", "cc");
        return;
    }
#endif
    for (; nrows > 0; --nrows, x += xr, dst += pw) mf_dw_widen(x, w, xp, nc, dst, plane);
}

/* nc channels in groups of 4 (one 32-bit load a pixel), each group its planes further on. */
MF_MICRO void mf_dw_widen_group(const int8_t *x, int xr, int nrows, int w, int xp, int nc,
                                int16_t *dst, int pw, int plane) {
    for (; nc > 0; nc -= MF_DW_CB, x += MF_DW_CB, dst += MF_DW_CB * plane)
        mf_dw_widen_rows(x, xr, nrows, w, xp, nc < MF_DW_CB ? nc : MF_DW_CB, dst, pw, plane);
}

/* Two adjacent outputs of one kernel row: stride 1 reads columns x..x+3 (words u, v), stride 2
 * columns 2x..2x+5 (u, v, t). */
#define MF_DW_ROW1(p, k01, k12)                                                              \
    do {                                                                                       \
        uint32_t u_ = mf_dw_ld(p, 0), v_ = mf_dw_ld(p, 1);                                     \
        a0 = mf_dw_smlad(u_, k01, a0), a1 = mf_dw_smlatb(u_, k01, a1);                         \
        a0 = mf_dw_smlabt(v_, k12, a0), a1 = mf_dw_smlad(v_, k12, a1);                         \
    } while (0)
#define MF_DW_ROW2(p, k01, k12)                                                              \
    do {                                                                                       \
        uint32_t u_ = mf_dw_ld(p, 0), v_ = mf_dw_ld(p, 1), t_ = mf_dw_ld(p, 2);                \
        a0 = mf_dw_smlad(u_, k01, a0), a1 = mf_dw_smlad(v_, k01, a1);                          \
        a0 = mf_dw_smlabt(v_, k12, a0), a1 = mf_dw_smlabt(t_, k12, a1);                        \
    } while (0)

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
        const int16_t *p0 = r0, *p1 = r0 + pw, *p2 = r0 + 2 * pw;
        const int16_t *end = p0 + 2 * s * npairs;
        int8_t *o = y;
        int32_t a0, a1;
        for (; p0 != end; p0 += 2 * s, p1 += 2 * s, p2 += 2 * s, o += 2 * c) {
            a0 = bias, a1 = bias;
            if (s == 1) {
                MF_DW_ROW1(p0, k01a, k12a); MF_DW_ROW1(p1, k01b, k12b); MF_DW_ROW1(p2, k01c, k12c);
            } else {
                MF_DW_ROW2(p0, k01a, k12a); MF_DW_ROW2(p1, k01b, k12b); MF_DW_ROW2(p2, k01c, k12c);
            }
            o[0] = (int8_t)mf_dw_rq(a0, mult, add, post, sf, clamp, lo, hi);
            o[c] = (int8_t)mf_dw_rq(a1, mult, add, post, sf, clamp, lo, hi);
        }
        if (ow & 1) { /* the last output, as a pair whose second half reads zero-point columns */
            a0 = bias, a1 = bias;
            if (s == 1) {
                MF_DW_ROW1(p0, k01a, k12a); MF_DW_ROW1(p1, k01b, k12b); MF_DW_ROW1(p2, k01c, k12c);
            } else {
                MF_DW_ROW2(p0, k01a, k12a); MF_DW_ROW2(p1, k01b, k12b); MF_DW_ROW2(p2, k01c, k12c);
            }
            o[0] = (int8_t)mf_dw_rq(a0, mult, add, post, sf, clamp, lo, hi);
        }
    }
}

/* One pass of nch channels (planes `plane` int16 apart, records pk, outputs y, y + 1, ...),
 * nrows output rows of ow each, as mf_dw_drive hands it to a channel function (below). */
typedef struct {
#if MF_USE_DSP && defined(__GNUC__)
    int32_t b[30]; /* the asm's state block, base b + 10 (mf_dw_state) */
#else
    const int16_t *r0;
    const int32_t *pk;
    int8_t *y;
    int plane, nch, pw, nrows, ow, c, ystride;
    int32_t lo, hi;
#endif
} mf_dw_job;
typedef void (*mf_dw_chans_fn)(mf_dw_job *j);

#if MF_USE_DSP && defined(__GNUC__)
/* The DSP body of a band of up to cg channels, one asm block per stride, sign term, clamp and
 * row shape: gcc 12 cannot keep the weight pairs, accumulators, row pointers and data words in
 * registers (it spilled ~25 instructions per output pair) and splits the 64-bit loads. All 14
 * registers are saved and used; the state lives in a word block addressed by lr, reloaded with
 * one LDM where a phase needs it:
 *   lr[-10..-9] k01c k12c   lr[-8..-1] k01a k12a k01b k12b bias x 4   (LDMDB: r0-r7)
 *   lr[0..7]    mult add post c o n lo hi                           (LDM: r0-r3, r11, r12)
 *   lr[8..11]   dp do nquads end: row-to-row steps of the pointers (bytes) and of o, the end
 *               of r8 (row 0's pointer after the channel's last row)
 *   lr[12..19]  record plane channels rowbase0 y0 pwb nquads rowbytes (the channel loop)
 * A row is its quads (four outputs an iteration, accumulators r4-r7, data words r11, r12),
 * then, by the row width mod 4, a pair and/or a single output (accumulators r4, r5, data r6,
 * r7; o stays in r11). Row pointers r8-r10. Per 4 outputs at stride 1: 54 instructions
 * (LDMDB, 3 x (LDRD + LDR + 8 MAC), LDRD, LDM, 4 SMMLAR, 4 ASR, 4 SSAT, 4 STRB, 2 ADD, SUBS,
 * STRD, BNE; stride 2: 57); a pair 27 (28), a single 17; per output row 10, per channel 21. */
#define MF_DW_Q1(P, KA, KB)                                                                    \
    "ldrd r11, r12, [" P "], #8\n\t" /* columns x..x+3 */                                      \
    "smlad r4, r11, " KA ", r4\n\t"                                                            \
    "smlatb r5, r11, " KA ", r5\n\t"                                                           \
    "smlabt r4, r12, " KB ", r4\n\t"                                                           \
    "smlad r5, r12, " KB ", r5\n\t"                                                            \
    "smlad r6, r12, " KA ", r6\n\t"                                                            \
    "smlatb r7, r12, " KA ", r7\n\t"                                                           \
    "ldr r11, [" P "]\n\t" /* x+4, x+5 */                                                      \
    "smlabt r6, r11, " KB ", r6\n\t"                                                           \
    "smlad r7, r11, " KB ", r7\n\t"
#define MF_DW_Q2(P, KA, KB)                                                                    \
    "ldrd r11, r12, [" P "], #8\n\t" /* columns 2x..2x+3 */                                    \
    "smlad r4, r11, " KA ", r4\n\t"                                                            \
    "smlabt r4, r12, " KB ", r4\n\t"                                                           \
    "smlad r5, r12, " KA ", r5\n\t"                                                            \
    "ldrd r11, r12, [" P "], #8\n\t" /* 2x+4..2x+7 */                                          \
    "smlabt r5, r11, " KB ", r5\n\t"                                                           \
    "smlad r6, r11, " KA ", r6\n\t"                                                            \
    "smlabt r6, r12, " KB ", r6\n\t"                                                           \
    "smlad r7, r12, " KA ", r7\n\t"                                                            \
    "ldr r11, [" P "]\n\t" /* 2x+8 */                                                          \
    "smlabt r7, r11, " KB ", r7\n\t"
#define MF_DW_QSF0                                                                             \
    "smmlar r4, r4, r0, r1\n\tsmmlar r5, r5, r0, r1\n\t"                                        \
    "smmlar r6, r6, r0, r1\n\tsmmlar r7, r7, r0, r1\n\t"
#define MF_DW_QSF1                                                                             \
    "smmulr r4, r4, r0\n\tsmmulr r5, r5, r0\n\tsmmulr r6, r6, r0\n\tsmmulr r7, r7, r0\n\t"       \
    "add r4, r4, r4, asr #31\n\tadd r5, r5, r5, asr #31\n\t"                                    \
    "add r6, r6, r6, asr #31\n\tadd r7, r7, r7, asr #31\n\t"                                    \
    "add r4, r4, r1\n\tadd r5, r5, r1\n\tadd r6, r6, r1\n\tadd r7, r7, r1\n\t"
#define MF_DW_QCLR(R)                                                                          \
    "cmp " R ", r0\n\tit lt\n\tmovlt " R ", r0\n\tcmp " R ", r1\n\tit gt\n\tmovgt " R ", r1\n\t"
#define MF_DW_QCL1                                                                             \
    "ldrd r0, r1, [lr, #24]\n\t" MF_DW_QCLR("r4") MF_DW_QCLR("r5") MF_DW_QCLR("r6")             \
    MF_DW_QCLR("r7")
/* the pair after a row's quads (accumulators r4, r5, data r6, r7): stride 1 columns x..x+3,
 * stride 2 columns 2x..2x+5 */
#define MF_DW_P1(P, KA, KB)                                                                    \
    "ldrd r6, r7, [" P "], #4\n\t"                                                             \
    "smlad r4, r6, " KA ", r4\n\t"                                                             \
    "smlatb r5, r6, " KA ", r5\n\t"                                                            \
    "smlabt r4, r7, " KB ", r4\n\t"                                                            \
    "smlad r5, r7, " KB ", r5\n\t"
#define MF_DW_P2(P, KA, KB)                                                                    \
    "ldrd r6, r7, [" P "], #8\n\t"                                                             \
    "smlad r4, r6, " KA ", r4\n\t"                                                             \
    "smlabt r4, r7, " KB ", r4\n\t"                                                            \
    "smlad r5, r7, " KA ", r5\n\t"                                                             \
    "ldr r6, [" P "]\n\t"                                                                      \
    "smlabt r5, r6, " KB ", r5\n\t"
/* the last output alone (accumulator r4): columns s*x..s*x+3, the pointers stay */
#define MF_DW_S1(P, KA, KB)                                                                    \
    "ldrd r6, r7, [" P "]\n\t"                                                                 \
    "smlad r4, r6, " KA ", r4\n\t"                                                             \
    "smlabt r4, r7, " KB ", r4\n\t"
#define MF_DW_PSF0 "smmlar r4, r4, r0, r1\n\tsmmlar r5, r5, r0, r1\n\t"
#define MF_DW_PSF1                                                                             \
    "smmulr r4, r4, r0\n\tsmmulr r5, r5, r0\n\t"                                                \
    "add r4, r4, r4, asr #31\n\tadd r5, r5, r5, asr #31\n\tadd r4, r4, r1\n\tadd r5, r5, r1\n\t"
#define MF_DW_PCL1 "ldrd r0, r1, [lr, #24]\n\t" MF_DW_QCLR("r4") MF_DW_QCLR("r5")
#define MF_DW_SSF0 "smmlar r4, r4, r0, r1\n\t"
#define MF_DW_SSF1 "smmulr r4, r4, r0\n\tadd r4, r4, r4, asr #31\n\tadd r4, r4, r1\n\t"
#define MF_DW_SCL1 "ldrd r0, r1, [lr, #24]\n\t" MF_DW_QCLR("r4")

#define MF_DW_QUADS(ROW, SF, CL) /* the row's quads: label 2 is the row's start */              \
    "ldmdb lr, {r0-r7}\n\t"                                                                    \
    ROW("r8", "r0", "r1") ROW("r9", "r2", "r3")                                                \
    "ldrd r0, r1, [lr, #-40]\n\t"                                                              \
    ROW("r10", "r0", "r1")                                                                     \
    "ldm lr, {r0-r3, r11, r12}\n\t" /* mult add post c o n */                                 \
    SF                                                                                         \
    "asr r4, r4, r2\n\tasr r5, r5, r2\n\tasr r6, r6, r2\n\tasr r7, r7, r2\n\t"                  \
    "ssat r4, #8, r4\n\tssat r5, #8, r5\n\tssat r6, #8, r6\n\tssat r7, #8, r7\n\t"              \
    CL                                                                                         \
    "strb r4, [r11]\n\t"                                                                       \
    "strb r5, [r11, r3]\n\t"                                                                   \
    "add r11, r11, r3, lsl #1\n\t"                                                             \
    "strb r6, [r11]\n\t"                                                                       \
    "strb r7, [r11, r3]\n\t"                                                                   \
    "add r11, r11, r3, lsl #1\n\t"                                                             \
    "subs r12, r12, #1\n\t"                                                                    \
    "strd r11, r12, [lr, #16]\n\t"                                                             \
    "bne 2b\n\t"
#define MF_DW_PAIR(ROW, SF, CL)                                                                \
    "ldmdb lr, {r0-r7}\n\t"                                                                    \
    ROW("r8", "r0", "r1") ROW("r9", "r2", "r3")                                                \
    "ldrd r0, r1, [lr, #-40]\n\t"                                                              \
    ROW("r10", "r0", "r1")                                                                     \
    "ldm lr, {r0-r3}\n\t" /* mult add post c */                                                \
    SF                                                                                         \
    "asr r4, r4, r2\n\tasr r5, r5, r2\n\tssat r4, #8, r4\n\tssat r5, #8, r5\n\t"                \
    CL                                                                                         \
    "strb r4, [r11]\n\t"                                                                       \
    "strb r5, [r11, r3]\n\t"                                                                   \
    "add r11, r11, r3, lsl #1\n\t"
#define MF_DW_SINGLE(SF, CL)                                                                   \
    "ldmdb lr, {r0-r7}\n\t"                                                                    \
    MF_DW_S1("r8", "r0", "r1") MF_DW_S1("r9", "r2", "r3")                                      \
    "ldrd r0, r1, [lr, #-40]\n\t"                                                              \
    MF_DW_S1("r10", "r0", "r1")                                                                \
    "ldm lr, {r0-r3}\n\t"                                                                      \
    SF                                                                                         \
    "asr r4, r4, r2\n\tssat r4, #8, r4\n\t"                                                    \
    CL                                                                                         \
    "strb r4, [r11]\n\t"                                                                       \
    "add r11, r11, r3\n\t"
#define MF_DW_ASM(ROWS)                                                                        \
    "push {r0-r12, lr}\n\t"                                                                    \
    "mov lr, %0\n"                                                                             \
    "5:\n\t" /* channel: its record to lr[-10..2]; row pointers, o, n, rows */                 \
    "ldr r12, [lr, #48]\n\t"                                                                   \
    "ldm r12!, {r0-r6}\n\t"                                                                    \
    "strd r4, r5, [lr, #-40]\n\t"                                                              \
    "mov r4, r6\n\t"                                                                           \
    "mov r5, r6\n\t"                                                                           \
    "mov r7, r6\n\t"                                                                           \
    "stmdb lr, {r0-r7}\n\t"                                                                    \
    "ldm r12!, {r0-r2}\n\t"                                                                    \
    "str r12, [lr, #48]\n\t"                                                                   \
    "stm lr, {r0-r2}\n\t"                                                                      \
    "add r0, lr, #52\n\t"                                                                      \
    "ldm r0, {r1-r7}\n\t" /* plane channels rowbase0 y0 pwb nquads rowbytes */                \
    "mov r8, r3\n\t"                                                                           \
    "add r9, r3, r5\n\t"                                                                       \
    "add r10, r9, r5\n\t"                                                                      \
    "strd r4, r6, [lr, #16]\n\t"                                                               \
    "add r7, r7, r3\n\t" /* r8 after the last row */                                         \
    "str r7, [lr, #44]\n\t"                                                                    \
    "mov r11, r4\n\t"                                                                          \
    "add r3, r3, r1\n\t"                                                                       \
    "add r4, r4, #1\n\t"                                                                       \
    "subs r2, r2, #1\n\t"                                                                      \
    "stm r0, {r1-r4}\n"                                                                         \
    "2:\n\t" /* a row */                                                                       \
    ROWS                                                                                       \
    "add r0, lr, #32\n\t" /* the next row: pointers and o by constant steps, n again */        \
    "ldm r0, {r1-r4}\n\t" /* dp do nquads end */                                               \
    "add r8, r8, r1\n\t"                                                                       \
    "add r9, r9, r1\n\t"                                                                       \
    "add r10, r10, r1\n\t"                                                                     \
    "add r11, r11, r2\n\t"                                                                     \
    "strd r11, r3, [lr, #16]\n\t"                                                              \
    "cmp r8, r4\n\t"                                                                           \
    "bne 2b\n\t"                                                                               \
    "ldr r0, [lr, #56]\n\t"                                                                    \
    "cmp r0, #0\n\t"                                                                           \
    "bne 5b\n\t"                                                                               \
    "pop {r0-r12, lr}\n\t"

/* The asm's state block for a job (see MF_DW_ASM). */
MF_DW_INLINE void mf_dw_state(int32_t *b, const int16_t *r0, int plane, int nch, int pw,
                              int nrows, int ow, int c, const int32_t *pk, int8_t *y,
                              int ystride, int32_t lo, int32_t hi, int s) {
    int32_t *m = b + 10;
    const int nq = ow >> 2;
    m[3] = c, m[6] = lo, m[7] = hi, m[8] = 2 * s * pw - 8 * s * nq - 4 * s * ((ow >> 1) & 1);
    m[9] = ystride - c * ow, m[10] = nq, m[12] = (int32_t)(uintptr_t)pk, m[13] = 2 * plane;
    m[14] = nch, m[15] = (int32_t)(uintptr_t)r0, m[16] = (int32_t)(uintptr_t)y, m[17] = 2 * pw;
    m[18] = nq, m[19] = 2 * s * pw * nrows; /* the row pointers' step over the band */
}

/* One pass of nch channels (planes `plane` int16 apart, records pk, outputs y, y + 1, ...),
 * nrows output rows of ow each: mf_dw_chans_<s>[f][c]_<k> for stride s, the sign term f, a
 * clamp c and the row shape k = (ow mod 4) + (4 if ow >= 4): quads, then a pair (ow mod 4 >=
 * 2), then a single output (ow odd). One function each, so that a model links only the ones its
 * layers name (the entries below). */
#define MF_DW_CHANS(NAME, S, ROWS)                                                             \
    MF_MICRO void NAME(mf_dw_job *j) {                                                         \
        __asm__ volatile(MF_DW_ASM(ROWS) : : "r"(j->b + 10) : "memory", "cc");                 \
    }
#define MF_DW_VARIANT(V, S, Q, P, QSF, QCL, PSF, PCL, SSF, SCL)                                \
    MF_DW_CHANS(mf_dw_chans_##V##_1, S, MF_DW_SINGLE(SSF, SCL))                                \
    MF_DW_CHANS(mf_dw_chans_##V##_2, S, MF_DW_PAIR(P, PSF, PCL))                               \
    MF_DW_CHANS(mf_dw_chans_##V##_3, S, MF_DW_PAIR(P, PSF, PCL) MF_DW_SINGLE(SSF, SCL))        \
    MF_DW_CHANS(mf_dw_chans_##V##_4, S, MF_DW_QUADS(Q, QSF, QCL))                              \
    MF_DW_CHANS(mf_dw_chans_##V##_5, S, MF_DW_QUADS(Q, QSF, QCL) MF_DW_SINGLE(SSF, SCL))       \
    MF_DW_CHANS(mf_dw_chans_##V##_6, S, MF_DW_QUADS(Q, QSF, QCL) MF_DW_PAIR(P, PSF, PCL))      \
    MF_DW_CHANS(mf_dw_chans_##V##_7, S,                                                        \
                MF_DW_QUADS(Q, QSF, QCL) MF_DW_PAIR(P, PSF, PCL) MF_DW_SINGLE(SSF, SCL))
MF_DW_VARIANT(1, 1, MF_DW_Q1, MF_DW_P1, MF_DW_QSF0, "", MF_DW_PSF0, "", MF_DW_SSF0, "")
MF_DW_VARIANT(1c, 1, MF_DW_Q1, MF_DW_P1, MF_DW_QSF0, MF_DW_QCL1, MF_DW_PSF0, MF_DW_PCL1,
              MF_DW_SSF0, MF_DW_SCL1)
MF_DW_VARIANT(1f, 1, MF_DW_Q1, MF_DW_P1, MF_DW_QSF1, "", MF_DW_PSF1, "", MF_DW_SSF1, "")
MF_DW_VARIANT(1fc, 1, MF_DW_Q1, MF_DW_P1, MF_DW_QSF1, MF_DW_QCL1, MF_DW_PSF1, MF_DW_PCL1,
              MF_DW_SSF1, MF_DW_SCL1)
MF_DW_VARIANT(2, 2, MF_DW_Q2, MF_DW_P2, MF_DW_QSF0, "", MF_DW_PSF0, "", MF_DW_SSF0, "")
MF_DW_VARIANT(2c, 2, MF_DW_Q2, MF_DW_P2, MF_DW_QSF0, MF_DW_QCL1, MF_DW_PSF0, MF_DW_PCL1,
              MF_DW_SSF0, MF_DW_SCL1)
MF_DW_VARIANT(2f, 2, MF_DW_Q2, MF_DW_P2, MF_DW_QSF1, "", MF_DW_PSF1, "", MF_DW_SSF1, "")
MF_DW_VARIANT(2fc, 2, MF_DW_Q2, MF_DW_P2, MF_DW_QSF1, MF_DW_QCL1, MF_DW_PSF1, MF_DW_PCL1,
              MF_DW_SSF1, MF_DW_SCL1)
#else
/* the portable body: one function per stride, sign term and clamp; every row shape the same */
#define MF_DW_CHANS_C(NAME, S, SF, CL)                                                         \
    MF_MICRO void NAME(mf_dw_job *j) {                                                         \
        int k;                                                                                 \
        for (k = 0; k < j->nch; ++k)                                                           \
            mf_dw_chan(j->r0 + k * j->plane, j->pw, j->nrows, j->ow, j->c,                     \
                       j->pk + k * MF_DW_REC, j->y + k, j->ystride, S, SF, CL, j->lo, j->hi);  \
    }
#define MF_DW_VARIANT(V, S, SF, CL)                                                            \
    MF_DW_CHANS_C(mf_dw_chans_##V##_1, S, SF, CL)                                              \
    MF_DW_CHANS_C(mf_dw_chans_##V##_2, S, SF, CL)                                              \
    MF_DW_CHANS_C(mf_dw_chans_##V##_3, S, SF, CL)                                              \
    MF_DW_CHANS_C(mf_dw_chans_##V##_4, S, SF, CL)                                              \
    MF_DW_CHANS_C(mf_dw_chans_##V##_5, S, SF, CL)                                              \
    MF_DW_CHANS_C(mf_dw_chans_##V##_6, S, SF, CL)                                              \
    MF_DW_CHANS_C(mf_dw_chans_##V##_7, S, SF, CL)
MF_DW_VARIANT(1, 1, 0, 0)
MF_DW_VARIANT(1c, 1, 0, 1)
MF_DW_VARIANT(1f, 1, 1, 0)
MF_DW_VARIANT(1fc, 1, 1, 1)
MF_DW_VARIANT(2, 2, 0, 0)
MF_DW_VARIANT(2c, 2, 0, 1)
MF_DW_VARIANT(2f, 2, 1, 0)
MF_DW_VARIANT(2fc, 2, 1, 1)
#endif

MF_DW_INLINE void mf_dw_job_set(mf_dw_job *j, const int16_t *r0, int plane, int nch, int pw,
                                int nrows, int ow, int c, const int32_t *pk, int8_t *y,
                                int ystride, int32_t lo, int32_t hi, int s) {
#if MF_USE_DSP && defined(__GNUC__)
    mf_dw_state(j->b, r0, plane, nch, pw, nrows, ow, c, pk, y, ystride, lo, hi, s);
#else
    (void)s;
    j->r0 = r0, j->pk = pk, j->y = y, j->plane = plane, j->nch = nch, j->pw = pw;
    j->nrows = nrows, j->ow = ow, j->c = c, j->ystride = ystride, j->lo = lo, j->hi = hi;
#endif
}

/* mf_dw3x3_s8: y = DepthwiseConv2D 3x3 of x, TFLM reference int8 semantics, batch 1.
 *   x        input [g->h][g->w][g->c] int8, NHWC; any alignment (unaligned LDR: the core must
 *            allow unaligned word access, the v7-M default)
 *   y        output [g->oh][g->ow][g->c] int8, NHWC; any alignment; must not overlap x
 *   pk       const int32 [g->c][MF_DW_REC] from codegen_c/pack_dw.pack_dw (weights in the
 *            geometry's orientation): kernel rows 0..2 as int16 pairs [w0,w1], [w1,w2] (low
 *            half first) of w * 2^pre, then (bias - x_zp * sum w) << pre, then mf_rq's mult,
 *            add and post (pre is folded away); 4-byte aligned
 *   g        geometry from pack_dw.geometry (mf_dw_geom: sizes, stride, padding, orientation,
 *            scratch shape)
 *   x_zp     input zero point: fills the padding
 *   lo, hi   output clamp of the fused activation, -128 <= lo <= hi <= 127
 *   signfix  pack.needs_signfix(y_zp, lo)
 *   scratch  int16 [g->cg][g->rows][g->pw], caller-provided, 4-BYTE ALIGNED (LDRD faults
 *            otherwise): pack_dw.scratch_bytes(g) bytes; free again on return
 * Padding bottom/right is whatever the output size implies (zero point as well). The entries
 * mf_dw3x3_s8_<s>[f][c]_<k> below take the same arguments. */

/* their body; f0 runs the channels, f1 those with the sign term (signfix, post > 0) */
MF_MICRO MF_DW_SMALL void mf_dw_drive(const int8_t *x, int8_t *y, const int32_t *pk,
                                      const mf_dw_geom *g, int32_t x_zp, int32_t lo, int32_t hi,
                                      int32_t signfix, int16_t *scratch, mf_dw_chans_fn f0,
                                      mf_dw_chans_fn f1) {
    /* the kernel's view: rows of the image, or its columns when g->transpose */
    const int t = g->transpose, c = g->c, s = g->stride;
    const int h = t ? g->w : g->h, w = t ? g->h : g->w, oh = t ? g->ow : g->oh;
    const int ow = t ? g->oh : g->ow, pad_t = t ? g->pad_l : g->pad_t;
    const int pad_l = t ? g->pad_t : g->pad_l;
    const int xr = t ? c : g->w * c, xp = t ? g->w * c : c;      /* input row / pixel stride */
    const int yr = t ? c : g->ow * c, yp = t ? g->ow * c : c;    /* output row / pixel stride */
    const int pw = g->pw, rows = g->rows, plane = g->rows * g->pw;
    const int band = (rows - 3) / s + 1; /* output rows per band */
    const uint32_t zz = ((uint32_t)x_zp & 0xFFFFu) * 0x10001u;
    mf_dw_job job;
    int c0, oy0;
    /* every border column is x_zp for good; data columns are rewritten per row, and rows of
     * zero-point padding refilled unless the layer is one band (its padding rows never change) */
    mf_dw_fill(scratch, g->cg * plane, zz);
    for (c0 = 0; c0 < c; c0 += g->cg) {
        const int nc = c - c0 < g->cg ? c - c0 : g->cg;
        for (oy0 = 0; oy0 < oh; oy0 += band) {
            const int nb = oh - oy0 < band ? oh - oy0 : band;
            const int iy0 = oy0 * s - pad_t;
            int r, k;
            const int nr = (nb - 1) * s + 3;                  /* rows of this band */
            const int keep = oy0 ? 3 - s : 0;                 /* rows the last band had too */
            const int rin = iy0 < 0 ? -iy0 : 0;               /* first row inside the input */
            const int r0 = rin > keep ? rin : keep;           /* first row to widen */
            const int r1 = h - iy0 < nr ? h - iy0 : nr;
            for (k = 0; keep && k < nc; ++k) /* copied (LDM/STM) rather than widened again */
                mf_dw_copy(scratch + k * plane, scratch + k * plane + band * s * pw,
                           keep * pw / 2);
            if (r1 > r0)
                mf_dw_widen_group(x + (iy0 + r0) * xr + c0, xr, r1 - r0, w, xp, nc,
                                  scratch + r0 * pw + pad_l, pw, plane);
            for (r = keep; r < nr && band < oh; ++r) /* zero-point rows where data was before */
                if (r < r0 || r >= r1)
                    for (k = 0; k < nc; ++k)
                        mf_dw_fill(scratch + r * pw + pad_l + k * plane, w, zz);
            /* channels whose sign term differs from the layer's (post = 0) run on their own */
            for (k = 0; k < nc;) {
                const int32_t *kk = pk + (c0 + k) * MF_DW_REC;
                const int sf = signfix && kk[9] != 0;
                int n = 1;
                while (k + n < nc && (signfix && kk[n * MF_DW_REC + 9] != 0) == sf) ++n;
                mf_dw_job_set(&job, scratch + k * plane, plane, n, pw, nb, ow, yp, kk,
                              y + oy0 * yr + c0 + k, yr, lo, hi, s);
                (sf ? f1 : f0)(&job);
                k += n;
            }
        }
    }
}

/* The entries the generated code calls: mf_dw3x3_s8_<s>[f][c]_<k> (pack_dw.entry), s the stride,
 * f the sign term (signfix: channels with post > 0 take it), c a clamp (lo > -128 or hi < 127),
 * k the row shape (see mf_dw_chans); each links only its own channel functions. Arguments as
 * mf_dw3x3_s8's, which takes any layer (and links them all). */
#define MF_DW_ENTRY(NAME, F0, F1)                                                              \
    MF_MICRO void NAME(const int8_t *x, int8_t *y, const int32_t *pk, const mf_dw_geom *g,     \
                       int32_t x_zp, int32_t lo, int32_t hi, int32_t signfix,                  \
                       int16_t *scratch) {                                                     \
        mf_dw_drive(x, y, pk, g, x_zp, lo, hi, signfix, scratch, F0, F1);                      \
    }
#define MF_DW_ENTRIES(S, K)                                                                    \
    MF_DW_ENTRY(mf_dw3x3_s8_##S##_##K, mf_dw_chans_##S##_##K, mf_dw_chans_##S##_##K)           \
    MF_DW_ENTRY(mf_dw3x3_s8_##S##c_##K, mf_dw_chans_##S##c_##K, mf_dw_chans_##S##c_##K)        \
    MF_DW_ENTRY(mf_dw3x3_s8_##S##f_##K, mf_dw_chans_##S##_##K, mf_dw_chans_##S##f_##K)         \
    MF_DW_ENTRY(mf_dw3x3_s8_##S##fc_##K, mf_dw_chans_##S##c_##K, mf_dw_chans_##S##fc_##K)
#define MF_DW_ENTRIES_K(S)                                                                     \
    MF_DW_ENTRIES(S, 1) MF_DW_ENTRIES(S, 2) MF_DW_ENTRIES(S, 3) MF_DW_ENTRIES(S, 4)            \
    MF_DW_ENTRIES(S, 5) MF_DW_ENTRIES(S, 6) MF_DW_ENTRIES(S, 7)
MF_DW_ENTRIES_K(1)
MF_DW_ENTRIES_K(2)

#define MF_DW_FN4(S, K)                                                                        \
    {{mf_dw_chans_##S##_##K, mf_dw_chans_##S##f_##K},                                          \
     {mf_dw_chans_##S##c_##K, mf_dw_chans_##S##fc_##K}}
#define MF_DW_FN28(S)                                                                          \
    {MF_DW_FN4(S, 1), MF_DW_FN4(S, 2), MF_DW_FN4(S, 3), MF_DW_FN4(S, 4), MF_DW_FN4(S, 5),      \
     MF_DW_FN4(S, 6), MF_DW_FN4(S, 7)}
MF_MICRO void mf_dw3x3_s8(const int8_t *x, int8_t *y, const int32_t *pk, const mf_dw_geom *g,
                          int32_t x_zp, int32_t lo, int32_t hi, int32_t signfix,
                          int16_t *scratch) {
    static const mf_dw_chans_fn fn[2][7][2][2] = {MF_DW_FN28(1), MF_DW_FN28(2)};
    const int ow = g->transpose ? g->oh : g->ow, k = (ow & 3) + (ow >= 4 ? 4 : 0);
    const int cl = lo > -128 || hi < 127, s = g->stride == 2;
    mf_dw_drive(x, y, pk, g, x_zp, lo, hi, signfix, scratch, fn[s][k - 1][cl][0],
                fn[s][k - 1][cl][1]);
}

#endif /* MCUFORGE_DW_H */
