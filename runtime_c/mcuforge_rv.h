/* mcuforge_rv.h: GEMM micro-kernels for RV32IM (no multiply-accumulate, no SIMD), portable
 * C99, TFLM int8 numerics. The schedule (codegen_c/kernels/rv.py, mirrored in
 * codegen_c/micro_rv.py) picks them on RISC-V targets; tests/test_nn_rv.py checks every output
 * byte against a numpy model of TFLM on the host and riscv32-virt.
 *
 * Same contract as mcuforge_scalar.h's GEMM: for r < rows, o < O (input zero point folded into
 * the bias)
 *   y[r * y_stride + o] = clamp(mf_rq_apply(bias[o] + sum_{k<K} x_r[k] * w[o][k]), lo, hi)
 *
 * "p16" (two channels a mul): a pair of channels a, b is one int32 word W = w_a + 2^16 w_b; for
 * int8 x, x * W = x w_a + 2^16 x w_b, so one mul + one add does two MACs. The taps are cut
 * into chunks (per block of 4 channels, chosen by the schedule from the weights) inside which
 * both lanes' sums A, B provably stay in [-2^15, 2^15) for every int8 x. A chunk's
 * accumulator starts at 2^15, so after the chunk c = A + 2^15 + 2^16 B (mod 2^32) with the
 * low half in [0, 2^16): c >> 16 (arithmetic) is B exactly. Per chunk: SB += c >> 16,
 * SA += c (mod 2^32); with SB starting at bias_b and SA at bias_a - n 2^15 + 2^16 bias_b (the
 * n chunks' offsets taken out: mf_rv_rec.init), channel b = SB and channel a = SA - 2^16 SB,
 * each with its bias.
 * Layout (int32 words, blocks of 4 channels, zero channels pad, blocks one after the other):
 *   per segment of a chunk (<= 8 taps, see MF_RV_SEG) its word MF_RV_EOFF(e) + 1, then per
 *   tap the words of channels (0, 1) and (2, 3); after the block's last segment the end word.
 * Block: 3 rows x 4 channels (6 chunk accumulators + 12 sums in registers): per tap 3 lb, 2 lw,
 * 6 mul, 6 add for 12 MACs. The 3 rows are first interleaved into xs[3 K] (x of tap k, row r
 * at 3 k + r: one pointer, immediate offsets); rows past the end re-read a row of the block
 * (not stored). The channels may be reordered in the blocks (mode bit 4: the schedule groups
 * channels of alike chunks; mf_rv_rec.out gives each one's output).
 * Measured (gcc 12 -O2, riscv32-virt): the C loop 18.5 instructions a tap (two taps a step)
 * and ~29-33 a chunk; the RV32 assembly of MF_RV_SEGS3 (segment words are entries' offsets,
 * the taps unrolled) 17 a tap and 24 a chunk. The MLPerf layers have 2.9 (ResNet-8's 1x1
 * 16 -> 32) to 105 (VWW's last 1x1) taps a chunk, KWS's 1x1 3.8. Outputs: ~11.5 instructions
 * (mf_rv_out: mul, mulhsu, srli, add, add, sra, 3 for the saturation, sb; + 2 for channel a),
 * ~3 for an accumulator at most the record's low in ReLU layers (mode bit 3: about half).
 * KWS's 1x1 layers 1,235 K -> 1,106..1,144 K instructions (0.45 MAC/instr): taps 64 %,
 * chunks 24 %, outputs and loops 12 %. Whole models on riscv32-virt (bench's input): KWS
 * 7.16 M -> 6.68 M, VWW 19.42 M -> 18.51 M, ResNet-8 29.01 M -> 26.6 M. (VWW's 1x1 layers
 * of K = 8 and 16 lost 65 K and 14 K: their blocks' loop costs more than the assembly saves.)
 * What limits it: the lanes' 16 bits (a chunk holds sum |w| <= 256 for any int8 x: 3-6 taps
 * of these models' int8 weights, the 4 channels of a block sharing the cuts; cuts per pair
 * of channels would need a dispatch per pair's fold: more than they save), the depthwise
 * layers (~33 instructions an output: 22.5 for the 9 MACs, ~10 requantization; the lane trick
 * along the row does not apply: these models' per-channel int8 weights sum |w| > 256 over
 * one kernel row for 15-60 % of the channels). Tried, not kept: the int8 saturation as one
 * unsigned compare of y + 128 (add raised by 128 << post): ReLU layers saturate half their
 * outputs, whose fix-up then costs 3 instead of 1 (KWS +10 K a 1x1 layer).
 * Code: MF_RV_SEGS3's assembly is ~1.9 KB (the entries 828 bytes, two chains of 8 taps),
 * once, in mf_rv_block3 (shared by mf_rv_gemm_p16 and mf_rv_conv_p16). (Segments of 16 taps
 * were 1.8 KB more, for ~6 instructions less per 8 taps past the first 8 of a chunk.)
 * rq[O] (mf_rv_rec) per channel slot, unpadded; mode: bit 0 the sign term (mf_rq's signfix),
 * bit 1 some channel's pre1 != 0, bit 3 the records' low used, bit 4 the channels reordered
 * (bit 2, the full int8 clamp, is set by the C entries: MF_RV_MODE). */
#ifndef MCUFORGE_RV_H
#define MCUFORGE_RV_H

#include <stdint.h>
#include <string.h>

#include "mcuforge_scalar.h" /* mf_sc_im2col, MF_SC_NOSCHED */

/* one copy of the 3-row block for mf_rv_gemm_p16 and mf_rv_conv_p16 (inlined in both it was
 * 11 KB each; a call per 3 rows costs little beside its O x K MACs) */
#if defined(__GNUC__)
#define MF_RV_SHARED static __attribute__((unused, noinline, noclone))
#else
#define MF_RV_SHARED static
#endif
#define MF_RV_OFF 0x8000u /* a chunk accumulator's start: the low lane's offset */

/* an empty asm hides a value from gcc: mf_rv_block1's tap loop keeps its two pointers
 * (gcc would derive one from the other after the loop), mf_rv_block3's fast outputs their y
 * pointer in one register (gcc reloaded it from the stack at each store) */
#if defined(__GNUC__)
#define MF_RV_OPAQUE(p) __asm__("" : "+r"(p))
#else
#define MF_RV_OPAQUE(p) ((void)0)
#endif

/* the 3 rows x0, x1, x2 (K bytes each) interleaved into xs[3 K] */
MF_INLINE void mf_rv_interleave3(const int8_t *x0, const int8_t *x1, const int8_t *x2,
                                 int32_t K, int8_t *xs) {
    int32_t k;
#define MF_RV_IL(J)                                                                           \
    do {                                                                                      \
        xs[3 * (J)] = x0[k + (J)];                                                            \
        xs[3 * (J) + 1] = x1[k + (J)];                                                        \
        xs[3 * (J) + 2] = x2[k + (J)];                                                        \
    } while (0)
    for (k = 0; k + 8 <= K; k += 8, xs += 24) { /* eight taps a step: immediate offsets */
        MF_RV_IL(0);
        MF_RV_IL(1);
        MF_RV_IL(2);
        MF_RV_IL(3);
        MF_RV_IL(4);
        MF_RV_IL(5);
        MF_RV_IL(6);
        MF_RV_IL(7);
    }
#undef MF_RV_IL
    for (; k + 4 <= K; k += 4, xs += 12) { /* four taps a step */
        int8_t a0 = x0[k], a1 = x1[k], a2 = x2[k], b0 = x0[k + 1], b1 = x1[k + 1],
               b2 = x2[k + 1], c0 = x0[k + 2], c1 = x1[k + 2], c2 = x2[k + 2], d0 = x0[k + 3],
               d1 = x1[k + 3], d2 = x2[k + 3];
        xs[0] = a0;
        xs[1] = a1;
        xs[2] = a2;
        xs[3] = b0;
        xs[4] = b1;
        xs[5] = b2;
        xs[6] = c0;
        xs[7] = c1;
        xs[8] = c2;
        xs[9] = d0;
        xs[10] = d1;
        xs[11] = d2;
    }
    for (; k < K; k++, xs += 3) {
        int8_t v0 = x0[k], v1 = x1[k], v2 = x2[k];
        xs[0] = v0;
        xs[1] = v1;
        xs[2] = v2;
    }
}

/* a finished chunk accumulator c into the sums sa (a lane and b lane mixed), sb (b lane) */
#define MF_RV_FOLD(c, sa, sb)                                                                 \
    do {                                                                                      \
        sb += (uint32_t)((int32_t)(c) >> 16);                                                 \
        sa += (c);                                                                            \
    } while (0)

/* the kernels' mode (bits 0, 1, 3, 4 from the schedule) with bit 2 set for the full int8
 * clamp */
#define MF_RV_MODE(mode, lo, hi) (((mode) & 27) | ((lo) == -128 && (hi) == 127 ? 4 : 0))

/* channel a of a pair from its sums */
#define MF_RV_A(sa, sb) ((int32_t)((sa) - ((sb) << 16)))

/* Per channel output record: init (the channel's sums start there: its folded bias; a pair's
 * channel a: bias_a - n 2^15 + 2^16 bias_b mod 2^32), m2 = 2 mult (< 2^32), add, pre1 =
 * pre - 1, post (mf_rq's fields): (acc << pre) * mult = (acc << pre1) * m2, the high word by
 * mulhsu (no shift for pre = 1, the usual case). */
typedef struct {
    int32_t init;
    uint32_t m2;
    int32_t add, pre1, post;
    int32_t low; /* acc <= low: the output is lo (mode bit 3; see rv.py's rv_lows) */
    int32_t out; /* its output index less its block's first (mode bit 4: channels reordered) */
} mf_rv_rec;

/* clamp(mf_rq_apply(acc)) (acc with its bias); mode bit 0: the sign term, bit 1: the shift,
 * bit 2: lo, hi = -128, 127 (MF_RV_FULL: int8 saturation, 3 instructions without branches
 * taken for a value in range, against 4-5 for the two compares); constants where inlined */
MF_INLINE int8_t mf_rv_out(int32_t acc, const mf_rv_rec *q, int32_t mode, int32_t lo,
                           int32_t hi) {
    int32_t t = mode & 2 ? (int32_t)((uint32_t)acc << q->pre1) : acc;
    int64_t p = (int64_t)t * (int64_t)q->m2;
    int32_t h = (int32_t)(p >> 32) + (int32_t)((uint32_t)p >> 31);
    int32_t v = h + q->add;
    if (mode & 1) v += h >> 31 & -(q->post != 0);
    v >>= q->post;
    if (mode & 4) {
        if (v >> 7 != v >> 31) v = v >> 31 ^ 127; /* outside int8: -128 or 127 by the sign */
        return (int8_t)v;
    }
    v = v < lo ? lo : v;
    return (int8_t)(v > hi ? hi : v);
}

/* ---- the stream's segments ----------------------------------------------------------------
 * A chunk is one segment of L <= MF_RV_SEG taps, or (longer) a first segment of MF_RV_SEG taps,
 * middle ones of MF_RV_SEG and a last one of 1..MF_RV_SEG. Each segment: its word
 * MF_RV_EOFF(e) + 1, then its L taps' 2 words; after the block's last segment the word of
 * e = MF_RV_E_END. e < 8: a whole chunk of e + 1 taps (accumulators start, fold at the end);
 * 8 <= e < 16: the last e - 7 taps of a chunk (fold); 16: a chunk's first 8 (start);
 * 17: 8 more. The word is also the entry's byte offset in the RV32 code below (bit 0, set so
 * that no word is 0, is dropped by jalr): the entries that start a chunk (e < 8, then 16)
 * are 80 bytes (20 instructions: the first tap), the others (8..15, then 17) 12 (3: the
 * pointer steps and a jump), the end after them (828 bytes). */
#define MF_RV_SEG 8
#define MF_RV_ESZ 80   /* a starting entry's bytes */
#define MF_RV_FSZ 12   /* the others' */
#define MF_RV_F0 720   /* the first of the others: after 9 starting entries */
#define MF_RV_E_END 18
#define MF_RV_EOFF(e)                                                                         \
    ((e) < MF_RV_SEG ? MF_RV_ESZ * (e)                                                        \
     : (e) == 2 * MF_RV_SEG ? MF_RV_ESZ * MF_RV_SEG                                           \
     : (e) < 2 * MF_RV_SEG ? MF_RV_F0 + MF_RV_FSZ * ((e) - MF_RV_SEG)                         \
                           : MF_RV_F0 + MF_RV_FSZ * ((e) - MF_RV_SEG - 1))
/* a segment word's e */
MF_INLINE int32_t mf_rv_entry(int32_t word) {
    uint32_t o = (uint32_t)word - 1u, j;
    if (o < MF_RV_F0) return o == MF_RV_ESZ * MF_RV_SEG ? 2 * MF_RV_SEG : (int32_t)(o / MF_RV_ESZ);
    j = (o - MF_RV_F0) / MF_RV_FSZ;
    return (int32_t)(j < MF_RV_SEG ? j + MF_RV_SEG : j + MF_RV_SEG + 1);
}

#if defined(__GNUC__) && defined(__riscv) && __riscv_xlen == 32 && defined(__riscv_mul) &&      \
    defined(__OPTIMIZE__) && !defined(MF_RV_NOASM)
#define MF_RV_ASM 1 /* the segments' code in RV32 assembly (the C below: -O0, hosts) */
#else
#define MF_RV_ASM 0
#endif

#if MF_RV_ASM
/* Per segment: the dispatch (lw, add, jr), the entry (two pointer steps, the first tap where
 * the accumulators start: mul + add of MF_RV_OFF, then j into a chain), 17 instructions a tap
 * (2 lw, 3 lb, 6 mul, 6 add: offsets from the segment's end, no loop counter), the fold (18:
 * srai, add, add per accumulator): 17 L + 24 a chunk of L <= 8 taps (C: ~17 L + 28 + 1.5 L). */
/* fixed registers (more operands than gcc's 30 otherwise): the chunk accumulators, two weight
 * words, x, a product, the entries' base */
#define MF_RV_Rc00 "t0"
#define MF_RV_Rc01 "t1"
#define MF_RV_Rc10 "t2"
#define MF_RV_Rc11 "t3"
#define MF_RV_Rc20 "t4"
#define MF_RV_Rc21 "t5"
#define MF_RV_Ru0 "t6"
#define MF_RV_Ru1 "a6"
#define MF_RV_Rv "a7"
#define MF_RV_Rt "a5"
#define MF_RV_Rbs "a4"
#define MF_RV_CLOBBERS "t0", "t1", "t2", "t3", "t4", "t5", "t6", "a4", "a5", "a6", "a7", "memory"
#define MF_RV_TAPX(P, R, A, B, INIT)                                                          \
    "lb " MF_RV_Rv ",-3*" #P "+" #R "(%[x])\n\t" INIT(A, u0) INIT(B, u1)
#define MF_RV_ACC(C, U)                                                                       \
    "mul " MF_RV_Rt "," MF_RV_Rv "," MF_RV_R##U "\n\tadd " MF_RV_R##C "," MF_RV_R##C "," MF_RV_Rt \
    "\n\t"
#define MF_RV_INI(C, U)                                                                       \
    "mul " MF_RV_R##C "," MF_RV_Rv "," MF_RV_R##U "\n\tadd " MF_RV_R##C "," MF_RV_R##C         \
    ",%[off]\n\t"
#define MF_RV_TAPA(P, INIT)                                                                   \
    "lw " MF_RV_Ru0 ",-8*" #P "(%[w])\n\tlw " MF_RV_Ru1 ",-8*" #P "+4(%[w])\n\t"              \
    MF_RV_TAPX(P, 0, c00, c01, INIT) MF_RV_TAPX(P, 1, c10, c11, INIT)                         \
    MF_RV_TAPX(P, 2, c20, c21, INIT)
#define MF_RV_LA(P) ".Lrv%=A" #P ":\n\t" MF_RV_TAPA(P, MF_RV_ACC)
#define MF_RV_LB(P) ".Lrv%=B" #P ":\n\t" MF_RV_TAPA(P, MF_RV_ACC)
#define MF_RV_CHAIN(T)                                                                        \
    T(8) T(7) T(6) T(5) T(4) T(3) T(2) T(1)
#define MF_RV_FOLDA(C, A, B)                                                                  \
    "srai " MF_RV_Rt "," MF_RV_R##C ",16\n\tadd %[" #B "],%[" #B "]," MF_RV_Rt "\n\tadd %[" #A \
    "],%[" #A "]," MF_RV_R##C "\n\t"
#define MF_RV_DISPATCH                                                                        \
    "lw " MF_RV_Rt ",0(%[w])\n\tadd " MF_RV_Rt "," MF_RV_Rt "," MF_RV_Rbs "\n\tjr " MF_RV_Rt "\n\t"
/* entries (MF_RV_EOFF): STEP the pointer steps of L taps */
#define MF_RV_STEP(L) "addi %[w],%[w],8*" #L "+4\n\taddi %[x],%[x],3*" #L "\n\t"
#define MF_RV_EW(L, N) /* a whole chunk of L taps: its first, then chain A from tap N = L-1 */ \
    MF_RV_STEP(L) MF_RV_TAPA(L, MF_RV_INI) "j .Lrv%=A" #N "\n\t"
#define MF_RV_EF(L) MF_RV_STEP(L) "j .Lrv%=A" #L "\n\t" /* a chunk's last L */
#define MF_RV_ENTRIES                                                                         \
    MF_RV_EW(1, 0) MF_RV_EW(2, 1) MF_RV_EW(3, 2) MF_RV_EW(4, 3) MF_RV_EW(5, 4) MF_RV_EW(6, 5)  \
    MF_RV_EW(7, 6) MF_RV_EW(8, 7)                                                             \
    MF_RV_STEP(8) MF_RV_TAPA(8, MF_RV_INI) "j .Lrv%=B7\n\t" /* 16: a start */                 \
    MF_RV_EF(1) MF_RV_EF(2) MF_RV_EF(3) MF_RV_EF(4) MF_RV_EF(5) MF_RV_EF(6) MF_RV_EF(7)       \
    MF_RV_EF(8) MF_RV_STEP(8) "j .Lrv%=B8\n\t" /* 17: middle */
#endif

/* The segments of one block of 4 channels (the block's stream from w) for 3 interleaved rows
 * xs into the 12 sums s (sa00 sb00 sa01 sb01 sa10 ... sb21: row r, pair p at 4 r + 2 p);
 * returns w at the block's end word. */
#define MF_RV_SEGS3(xs, w, sa00, sb00, sa01, sb01, sa10, sb10, sa11, sb11, sa20, sb20, sa21,    \
                    sb21)                                                                     \
    MF_RV_SEGS3_BODY(xs, w, sa00, sb00, sa01, sb01, sa10, sb10, sa11, sb11, sa20, sb20, sa21,   \
                     sb21)
#if MF_RV_ASM
/* (-pedantic: the template is longer than C99's 4095 characters) */
#define MF_RV_SEGS3_BODY(xs, w, sa00, sb00, sa01, sb01, sa10, sb10, sa11, sb11, sa20, sb20,     \
                         sa21, sb21)                                                          \
    do {                                                                                      \
        const int8_t *xp_ = (xs);                                                             \
        _Pragma("GCC diagnostic push") _Pragma("GCC diagnostic ignored \"-Woverlength-strings\"") \
        __asm__ volatile(                                                                     \
            ".option push\n\t.option norvc\n\t.option norelax\n\t"                            \
            "lla " MF_RV_Rbs ",.Lrv%=E\n\t" MF_RV_DISPATCH                                            \
            MF_RV_CHAIN(MF_RV_LB) MF_RV_DISPATCH                                              \
            MF_RV_CHAIN(MF_RV_LA) ".Lrv%=A0:\n\t"                                             \
            MF_RV_FOLDA(c00, a00, b00) MF_RV_FOLDA(c01, a01, b01) MF_RV_FOLDA(c10, a10, b10)  \
            MF_RV_FOLDA(c11, a11, b11) MF_RV_FOLDA(c20, a20, b20) MF_RV_FOLDA(c21, a21, b21)  \
            MF_RV_DISPATCH ".Lrv%=E:\n\t" MF_RV_ENTRIES ".option pop\n\t"                     \
            : [a00] "+r"(sa00), [b00] "+r"(sb00), [a01] "+r"(sa01), [b01] "+r"(sb01),         \
              [a10] "+r"(sa10), [b10] "+r"(sb10), [a11] "+r"(sa11), [b11] "+r"(sb11),         \
              [a20] "+r"(sa20), [b20] "+r"(sb20), [a21] "+r"(sa21), [b21] "+r"(sb21),         \
              [x] "+r"(xp_), [w] "+r"(w)                                                      \
            : [off] "r"(MF_RV_OFF)                                                            \
            : MF_RV_CLOBBERS);                                                                \
        _Pragma("GCC diagnostic pop")                                                         \
    } while (0)
#else
#define MF_RV_SEGS3_BODY(xs, w, sa00, sb00, sa01, sb01, sa10, sb10, sa11, sb11, sa20, sb20,     \
                         sa21, sb21)                                                          \
    do {                                                                                      \
        const int8_t *xp = (xs);                                                              \
        uint32_t c00 = 0, c01 = 0, c10 = 0, c11 = 0, c20 = 0, c21 = 0;                        \
        for (;;) {                                                                            \
            int32_t e = mf_rv_entry(*w), L, j;                                                \
            if (e >= MF_RV_E_END) break;                                                      \
            L = e < MF_RV_SEG ? e + 1 : e < 2 * MF_RV_SEG ? e - MF_RV_SEG + 1 : MF_RV_SEG;    \
            w++;                                                                              \
            if (e < MF_RV_SEG || e == 2 * MF_RV_SEG)                                          \
                c00 = c01 = c10 = c11 = c20 = c21 = MF_RV_OFF;                                \
            for (j = 0; j < L; j++, xp += 3, w += 2) {                                        \
                int32_t w0 = w[0], w1 = w[1], v;                                              \
                v = xp[0];                                                                    \
                c00 += (uint32_t)(v * w0);                                                    \
                c01 += (uint32_t)(v * w1);                                                    \
                v = xp[1];                                                                    \
                c10 += (uint32_t)(v * w0);                                                    \
                c11 += (uint32_t)(v * w1);                                                    \
                v = xp[2];                                                                    \
                c20 += (uint32_t)(v * w0);                                                    \
                c21 += (uint32_t)(v * w1);                                                    \
            }                                                                                 \
            if (e < 2 * MF_RV_SEG) {                                                          \
                MF_RV_FOLD(c00, sa00, sb00);                                                  \
                MF_RV_FOLD(c01, sa01, sb01);                                                  \
                MF_RV_FOLD(c10, sa10, sb10);                                                  \
                MF_RV_FOLD(c11, sa11, sb11);                                                  \
                MF_RV_FOLD(c20, sa20, sb20);                                                  \
                MF_RV_FOLD(c21, sa21, sb21);                                                  \
            }                                                                                 \
        }                                                                                     \
    } while (0)
#endif

/* one output of a full block: mode bit 3, an accumulator at most the record's low gives lo
 * without the requantization (ReLU layers: about half their outputs) */
#define MF_RV_Y1(dst, ACC, MODE)                                                              \
    do {                                                                                      \
        int32_t a_ = (ACC);                                                                   \
        if ((MODE) & 8 && a_ <= r.low)                                                        \
            dst = (int8_t)lo;                                                                 \
        else                                                                                  \
            dst = mf_rv_out(a_, &r, (MODE) & 7, lo, hi);                                      \
    } while (0)

/* the 12 outputs of a full block (4 channels, 3 rows) in one mode */
/* channel C's 3 outputs (accumulators A0..A2): at yo + C, or (mode bit 4) yo + its out */
#define MF_RV_OUT3C(C, A0, A1, A2, MODE)                                                     \
    do {                                                                                      \
        r = q[C];                                                                             \
        if ((MODE) & 16) {                                                                    \
            int8_t *yc = yb + r.out;                                                          \
            MF_RV_Y1(yc[0], A0, MODE);                                                        \
            MF_RV_Y1(yc[ys], A1, MODE);                                                       \
            MF_RV_Y1(yc[2 * ys], A2, MODE);                                                   \
        } else {                                                                              \
            MF_RV_Y1(yb[C], A0, MODE);                                                        \
            MF_RV_Y1(yb[ys + (C)], A1, MODE);                                                 \
            MF_RV_Y1(yb[2 * ys + (C)], A2, MODE);                                             \
        }                                                                                     \
    } while (0)
#define MF_RV_OUT12(MODE)                                                                     \
    do {                                                                                      \
        mf_rv_rec r;                                                                          \
        MF_RV_OUT3C(0, MF_RV_A(sa00, sb00), MF_RV_A(sa10, sb10), MF_RV_A(sa20, sb20), MODE);  \
        MF_RV_OUT3C(1, (int32_t)sb00, (int32_t)sb10, (int32_t)sb20, MODE);                    \
        MF_RV_OUT3C(2, MF_RV_A(sa01, sb01), MF_RV_A(sa11, sb11), MF_RV_A(sa21, sb21), MODE);  \
        MF_RV_OUT3C(3, (int32_t)sb01, (int32_t)sb11, (int32_t)sb21, MODE);                    \
    } while (0)
/* a full block's outputs in mode M */
#define MF_RV_FAST(M)                                                                         \
    else if (fast == (M)) {                                                                   \
        int8_t *yb = yo; /* (one register for the 12 stores) */                               \
        MF_RV_OPAQUE(yb);                                                                     \
        MF_RV_OUT12(M);                                                                       \
    }

/* Every block of 4 channels (the last n = O % 4 real ones, zero channels pad) for 3
 * interleaved rows xs: w the layer's stream; y rows y_stride apart, nr <= 3 of them stored.
 * (One copy for both entries: the segments' code once.) */
MF_RV_SHARED MF_SC_NOSCHED void mf_rv_block3(const int8_t *xs, const int32_t *w,
                                         const mf_rv_rec *rq, int32_t O, int32_t lo,
                                         int32_t hi, int32_t mode, int8_t *y,
                                         int32_t y_stride, int32_t nr) {
    const mf_rv_rec *q, *qe = rq + O;
    int8_t *yo = y;
    int32_t ys = y_stride;
    /* the full blocks' outputs without checks where the int8 clamp and no shift (pre = 1):
     * two copies, each storing through the records' out (channels in order or not: ~2
     * instructions a channel, the same code for both), ReLU layers (28: the records' low, no
     * sign term) and the others (21: the sign term, always exact, also for modes 4 and 20);
     * a ReLU with the sign term (13, 29: none in MLPerf Tiny) through the loop below. Code:
     * 8 copies (one per mode) were 4.4 KB more for +-0.05 % instructions (KWS -2.7 K, VWW
     * +5 K, ResNet-8 -5 K with 2). */
    int32_t fast = nr != 3 || (mode & 6) != 4 ? 0 : (mode & 9) == 8 ? 28 : mode & 8 ? 0 : 21;
    for (q = rq; q < qe; q += 4, yo += 4) {
        int32_t n = qe - q < 4 ? (int32_t)(qe - q) : 4;
        uint32_t sa00 = (uint32_t)q[0].init, sb00 = n > 1 ? (uint32_t)q[1].init : 0;
        uint32_t sa01 = n > 2 ? (uint32_t)q[2].init : 0;
        uint32_t sb01 = n > 3 ? (uint32_t)q[3].init : 0;
        uint32_t sa10 = sa00, sb10 = sb00, sa11 = sa01, sb11 = sb01, sa20 = sa00, sb20 = sb00,
                 sa21 = sa01, sb21 = sb01;
        MF_RV_SEGS3(xs, w, sa00, sb00, sa01, sb01, sa10, sb10, sa11, sb11, sa20, sb20, sa21,
                    sb21);
        w++; /* the block's end word */
        if (n != 4 || !fast) { /* a short block, fewer rows or another mode: checked */
            int32_t a[3][4], r, c;
            a[0][0] = MF_RV_A(sa00, sb00);
            a[1][0] = MF_RV_A(sa10, sb10);
            a[2][0] = MF_RV_A(sa20, sb20);
            a[0][1] = (int32_t)sb00;
            a[1][1] = (int32_t)sb10;
            a[2][1] = (int32_t)sb20;
            a[0][2] = MF_RV_A(sa01, sb01);
            a[1][2] = MF_RV_A(sa11, sb11);
            a[2][2] = MF_RV_A(sa21, sb21);
            a[0][3] = (int32_t)sb01;
            a[1][3] = (int32_t)sb11;
            a[2][3] = (int32_t)sb21;
            for (c = 0; c < n; c++)
                for (r = 0; r < nr; r++)
                    yo[r * ys + q[c].out] = mf_rv_out(a[r][c], q + c, mode, lo, hi);
        }
        MF_RV_FAST(28) MF_RV_FAST(21) /* (ReLU layers first) */
    }
}
#undef MF_RV_OUT12
#undef MF_RV_OUT3C
#undef MF_RV_FAST
#undef MF_RV_Y1

/* One row x (K taps, in place) against every channel (mf_rv_block3's stream and sums, 1 row:
 * per tap 1 lb, 2 lw, 2 mul, 2 add for 4 MACs, two taps a step). */
MF_INLINE MF_SC_NOSCHED void mf_rv_block1(const int8_t *x, const int32_t *w,
                                          const mf_rv_rec *rq, int32_t O, int32_t lo,
                                          int32_t hi, int32_t mode, int8_t *y) {
    int32_t o;
    for (o = 0; o < O; o += 4) {
        int32_t n = O - o < 4 ? O - o : 4;
        uint32_t sa0 = (uint32_t)rq[o].init, sb0 = n > 1 ? (uint32_t)rq[o + 1].init : 0;
        uint32_t sa1 = n > 2 ? (uint32_t)rq[o + 2].init : 0;
        uint32_t sb1 = n > 3 ? (uint32_t)rq[o + 3].init : 0;
        uint32_t c0 = 0, c1 = 0;
        const int8_t *xp = x;
        for (;;) {
            uint32_t e = (uint32_t)mf_rv_entry(*w);
            const int32_t *we;
            if (e < MF_RV_SEG) { /* a whole chunk of e + 1 taps */
                c0 = c1 = MF_RV_OFF;
                we = w + 2 * e + 3;
            } else if (e < 2 * MF_RV_SEG) { /* a chunk's last e - 7 */
                we = w + 2 * (e - MF_RV_SEG) + 3;
            } else if (e < MF_RV_E_END) { /* a chunk's first 8 (e = 16) or 8 more */
                if (e == 2 * MF_RV_SEG) c0 = c1 = MF_RV_OFF;
                we = w + 2 * MF_RV_SEG + 1;
            } else {
                break;
            }
            w++;
            if ((we - w) & 2) { /* an odd count: one tap, then two a step */
                int32_t v = *xp;
                c0 += (uint32_t)(v * w[0]);
                c1 += (uint32_t)(v * w[1]);
                xp++;
                w += 2;
            }
            while (w != we) {
                int32_t v = xp[0], u = xp[1];
                c0 += (uint32_t)(v * w[0]);
                c1 += (uint32_t)(v * w[1]);
                c0 += (uint32_t)(u * w[2]);
                c1 += (uint32_t)(u * w[3]);
                xp += 2;
                w += 4;
                MF_RV_OPAQUE(xp);
                MF_RV_OPAQUE(w);
            }
            if (e < 2 * MF_RV_SEG) {
                MF_RV_FOLD(c0, sa0, sb0);
                MF_RV_FOLD(c1, sa1, sb1);
            }
        }
        w++;
        {
            mf_rv_rec r = rq[o];
            y[o + r.out] = mf_rv_out(MF_RV_A(sa0, sb0), &r, mode, lo, hi);
            if (n > 1) {
                r = rq[o + 1];
                y[o + r.out] = mf_rv_out((int32_t)sb0, &r, mode, lo, hi);
            }
            if (n > 2) {
                r = rq[o + 2];
                y[o + r.out] = mf_rv_out(MF_RV_A(sa1, sb1), &r, mode, lo, hi);
            }
            if (n > 3) {
                r = rq[o + 3];
                y[o + r.out] = mf_rv_out((int32_t)sb1, &r, mode, lo, hi);
            }
        }
    }
}

/* One row (a fully connected layer of batch 1): y[o] for o < O from x[K] (read in place).
 * (Its own entry: calls from mf_rv_gemm_p16 cost its 3-row code 1 %, gcc then specialising
 * fewer of its arguments.) */
MF_MICRO void mf_rv_fc_p16(const int8_t *x, const int32_t *pw, const mf_rv_rec *rq, int32_t O,
                           int32_t lo, int32_t hi, int32_t mode, int8_t *y) {
    switch (MF_RV_MODE(mode, lo, hi) & 7) {
    case 0: mf_rv_block1(x, pw, rq, O, lo, hi, 0, y); break;
    case 1: mf_rv_block1(x, pw, rq, O, lo, hi, 1, y); break;
    case 2: mf_rv_block1(x, pw, rq, O, lo, hi, 2, y); break;
    case 3: mf_rv_block1(x, pw, rq, O, lo, hi, 3, y); break;
    case 4: mf_rv_block1(x, pw, rq, O, lo, hi, 4, y); break;
    case 5: mf_rv_block1(x, pw, rq, O, lo, hi, 5, y); break;
    case 6: mf_rv_block1(x, pw, rq, O, lo, hi, 6, y); break;
    default: mf_rv_block1(x, pw, rq, O, lo, hi, 7, y); break;
    }
}

MF_MICRO void mf_rv_gemm_p16(const int8_t *x, int32_t rows, int32_t x_stride, int32_t K,
                             const int32_t *pw, const mf_rv_rec *rq, int32_t O, int32_t lo,
                             int32_t hi, int32_t mode, int8_t *y, int32_t y_stride,
                             int8_t *xs) {
    int32_t r;
    mode = MF_RV_MODE(mode, lo, hi);
    for (r = 0; r < rows; r += 3) {
        int32_t nr = rows - r < 3 ? rows - r : 3;
        const int8_t *x0 = x + r * x_stride;
        const int8_t *x1 = x0 + (nr > 1 ? x_stride : 0);
        const int8_t *x2 = x0 + (nr > 2 ? 2 * x_stride : 0);
        mf_rv_interleave3(x0, x1, x2, K, xs);
        mf_rv_block3(xs, pw, rq, O, lo, hi, mode, y + r * y_stride, y_stride, nr);
    }
}

/* Convolution: per 3 output pixels (row-major) their patches gathered straight into the
 * interleaved rows xs = scratch[0, 3 K) (k_h row segments of k_w * in_c bytes each, read in
 * place; a patch touching the padding is first built by im2col in scratch[3 K, 6 K)), then
 * mf_rv_block3; pixels past the end repeat the last one (not stored). */
MF_MICRO void mf_rv_conv_p16(const int8_t *x, const mf_conv_geom *g, int32_t x_zp,
                             const int32_t *pw, const mf_rv_rec *rq, int32_t O, int32_t lo,
                             int32_t hi, int32_t mode, int8_t *y, int8_t *scratch) {
    int32_t kh = g->k_h, seg = g->k_w * g->in_c, rowb = g->in_w * g->in_c;
    int32_t K = kh * seg, n = g->out_h * g->out_w, q, r, ky;
    int8_t *tmp = scratch + 3 * K;
    mode = MF_RV_MODE(mode, lo, hi);
    for (q = 0; q < n; q += 3) {
        int32_t nr = n - q < 3 ? n - q : 3;
        const int8_t *b[3];
        int32_t bs[3];
        for (r = 0; r < 3; r++) {
            int32_t p = q + (r < nr ? r : nr - 1);
            int32_t oy = p / g->out_w, ox = p % g->out_w;
            int32_t iy0 = oy * g->stride_h - g->pad_t, ix0 = ox * g->stride_w - g->pad_l;
            if (iy0 >= 0 && iy0 + kh <= g->in_h && ix0 >= 0 && ix0 + g->k_w <= g->in_w) {
                b[r] = x + iy0 * rowb + ix0 * g->in_c;
                bs[r] = rowb;
            } else {
                mf_sc_im2col(x, g, x_zp, p, 1, tmp + r * K);
                b[r] = tmp + r * K;
                bs[r] = seg;
            }
        }
        for (ky = 0; ky < kh; ky++)
            mf_rv_interleave3(b[0] + ky * bs[0], b[1] + ky * bs[1], b[2] + ky * bs[2], seg,
                              scratch + 3 * ky * seg);
        mf_rv_block3(scratch, pw, rq, O, lo, hi, mode, y + q * O, O, nr);
    }
}

/* ==== depthwise 3x3, depth multiplier 1 (mf_sc_dw3's planes and geometry) =================
 * As mf_sc_dw3 (mcuforge_scalar.h: per channel the padded int8 plane in scratch, g[15] the
 * geometry) with mf_rv_rec records (accumulators start at the bias, mulhsu, mode as
 * mf_rv_gemm_p16's): KWS's depthwise layers 348 K -> 337 K instructions each. (Two output rows
 * a step, 24 loads for 72 MACs instead of 36, measured no faster: gcc 12 spills the 8
 * accumulators, 9 weights and the record, 309 instructions per 8 outputs.)
 * pk per channel 14 int32: the 9 weights in plane order (ky, kx), then mf_rv_rec. */

/* input row q (6 columns) into the 4 outputs a..d with kernel row k0..k2 */
#define MF_RV_DW_ROW(q, k0, k1, k2, a, b, c, d)                                               \
    do {                                                                                      \
        int32_t v_;                                                                           \
        v_ = (q)[0]; a += v_ * k0;                                                            \
        v_ = (q)[1]; a += v_ * k1; b += v_ * k0;                                              \
        v_ = (q)[2]; a += v_ * k2; b += v_ * k1; c += v_ * k0;                                \
        v_ = (q)[3]; b += v_ * k2; c += v_ * k1; d += v_ * k0;                                \
        v_ = (q)[4]; c += v_ * k2; d += v_ * k1;                                              \
        v_ = (q)[5]; d += v_ * k2;                                                            \
    } while (0)
/* input row q (4 columns) into the 2 outputs a, b */
#define MF_RV_DW_ROW2(q, k0, k1, k2, a, b)                                                    \
    do {                                                                                      \
        int32_t v_;                                                                           \
        v_ = (q)[0]; a += v_ * k0;                                                            \
        v_ = (q)[1]; a += v_ * k1; b += v_ * k0;                                              \
        v_ = (q)[2]; a += v_ * k2; b += v_ * k1;                                              \
        v_ = (q)[3]; b += v_ * k2;                                                            \
    } while (0)
MF_INLINE void mf_rv_dw_rows(const int8_t *p, int8_t *y, const int32_t *q, const int32_t *g,
                             int32_t MODE, int32_t lo, int32_t hi) {
    int32_t voh = g[3], vow = g[4], sy = g[5], sx = g[6], oys = g[11], oxs = g[12];
    int32_t pw = g[14], oy, ox;
    int32_t w0 = q[0], w1 = q[1], w2 = q[2], w3 = q[3], w4 = q[4], w5 = q[5], w6 = q[6],
            w7 = q[7], w8 = q[8];
    mf_rv_rec rec;
    rec.init = q[9];
    rec.m2 = (uint32_t)q[10];
    rec.add = q[11];
    rec.pre1 = q[12];
    rec.post = q[13];
    for (oy = 0; oy < voh; oy++) {
        const int8_t *r = p + oy * sy * pw;
        int8_t *yo = y + oy * oys;
        ox = 0;
        if (sx == 1) {
            for (; ox + 4 <= vow; ox += 4, r += 4, yo += 4 * oxs) {
                int32_t a = rec.init, b = a, c = a, d = a;
                MF_RV_DW_ROW(r, w0, w1, w2, a, b, c, d);
                MF_RV_DW_ROW(r + pw, w3, w4, w5, a, b, c, d);
                MF_RV_DW_ROW(r + 2 * pw, w6, w7, w8, a, b, c, d);
                yo[0] = mf_rv_out(a, &rec, MODE, lo, hi);
                yo[oxs] = mf_rv_out(b, &rec, MODE, lo, hi);
                yo[2 * oxs] = mf_rv_out(c, &rec, MODE, lo, hi);
                yo[3 * oxs] = mf_rv_out(d, &rec, MODE, lo, hi);
            }
            if (ox + 2 <= vow) { /* a pair left: 12 loads instead of 18 for two singles */
                int32_t a = rec.init, b = a;
                MF_RV_DW_ROW2(r, w0, w1, w2, a, b);
                MF_RV_DW_ROW2(r + pw, w3, w4, w5, a, b);
                MF_RV_DW_ROW2(r + 2 * pw, w6, w7, w8, a, b);
                yo[0] = mf_rv_out(a, &rec, MODE, lo, hi);
                yo[oxs] = mf_rv_out(b, &rec, MODE, lo, hi);
                ox += 2;
                r += 2;
                yo += 2 * oxs;
            }
        } else if (sx == 2) { /* two outputs a step: 5 loads a kernel row */
            for (; ox + 2 <= vow; ox += 2, r += 4, yo += 2 * oxs) {
                int32_t a = rec.init, b = a;
                MF_SC_DW_ROW2S2(r, w0, w1, w2);
                MF_SC_DW_ROW2S2(r + pw, w3, w4, w5);
                MF_SC_DW_ROW2S2(r + 2 * pw, w6, w7, w8);
                yo[0] = mf_rv_out(a, &rec, MODE, lo, hi);
                yo[oxs] = mf_rv_out(b, &rec, MODE, lo, hi);
            }
        }
        for (; ox < vow; ox++, r += sx, yo += oxs) {
            int32_t acc = rec.init + r[0] * w0 + r[1] * w1 + r[2] * w2;
            acc += r[pw] * w3 + r[pw + 1] * w4 + r[pw + 2] * w5;
            acc += r[2 * pw] * w6 + r[2 * pw + 1] * w7 + r[2 * pw + 2] * w8;
            *yo = mf_rv_out(acc, &rec, MODE, lo, hi);
        }
    }
}
#undef MF_RV_DW_ROW
#undef MF_RV_DW_ROW2

/* mf_sc_dw_plane with 4 bytes a step (the copy is 4 plane bytes an output at stride 2) */
MF_INLINE void mf_rv_dw_plane(const int8_t *x, const int32_t *g, int8_t *p) {
    int32_t vh = g[0], vw = g[1], pt = g[7], pl = g[8], ys = g[9], xs = g[10];
    int32_t ph = g[13], pw = g[14];
    int32_t xa = pl < pw ? pl : pw, xb = pl + vw < pw ? pl + vw : pw;
    int32_t ya = pt < ph ? pt : ph, yb = pt + vh < ph ? pt + vh : ph, py;
    for (py = ya; py < yb; py++) {
        const int8_t *src = x + (py - pt) * ys + (xa - pl) * xs;
        int8_t *d = p + py * pw + xa, *e = p + py * pw + xb;
        for (; d + 4 <= e; d += 4) {
            int8_t v0, v1, v2, v3;
            v0 = *src;
            src += xs;
            v1 = *src;
            src += xs;
            v2 = *src;
            src += xs;
            v3 = *src;
            src += xs;
            d[0] = v0;
            d[1] = v1;
            d[2] = v2;
            d[3] = v3;
        }
        for (; d < e; d++, src += xs) *d = *src;
    }
}

MF_MICRO MF_SC_NOSCHED void mf_rv_dw3(const int8_t *x, int8_t *y, const int32_t *pk,
                                      const int32_t *g, int32_t x_zp, int32_t lo, int32_t hi,
                                      int32_t mode, int8_t *scratch) {
    int32_t c, nc = g[2];
    memset(scratch, x_zp, (size_t)(g[13] * g[14])); /* the border of every channel's plane */
    for (c = 0; c < nc; c++, pk += MF_SC_DW_REC) {
        mf_rv_dw_plane(x + c, g, scratch);
        switch (mode & 3) {
        case 0: mf_rv_dw_rows(scratch, y + c, pk, g, 0, lo, hi); break;
        case 1: mf_rv_dw_rows(scratch, y + c, pk, g, 1, lo, hi); break;
        case 2: mf_rv_dw_rows(scratch, y + c, pk, g, 2, lo, hi); break;
        default: mf_rv_dw_rows(scratch, y + c, pk, g, 3, lo, hi); break;
        }
    }
}

/* ==== depthwise 3x3 straight from NHWC (mf_rv_dwd) =========================================
 * mf_rv_dw3's arithmetic (pk: per channel the 9 weights in plane order, then mf_rv_rec;
 * accumulators start at init = bias - x_zp * sum(w)) without the padded plane: per channel, per
 * output row, the taps are read where they are in x (one pointer; kernel rows YS bytes apart,
 * columns XS: immediate offsets once the call's constant geometry is inlined). TR: the plane
 * is the image transposed (its rows the image's columns: KWS's 25x5 walks rows of 25). A tap
 * in the padding (pad <= 1 a side) is not read: its x_zp * w is added to the output's start
 * instead (the top row's outputs start at init + x_zp (w0 + w1 + w2), ...), so the top row,
 * the bottom rows and the two edge columns are their own code with fewer MACs. Outputs 4 a
 * step at stride 1 (6 loads a kernel row), 2 at stride 2 (5 loads).
 * DLY: each output row goes to buf (2 VOW bytes, alternating) and reaches y only after the
 * next row is done, so y may be x itself (the row above is read by the next output row);
 * the schedule asks for it only where it raises the in-place shift (stride 1). It costs VWW
 * 267 K instructions and KWS 113 K, against arenas of 46,032 / 16,000 bytes without it.
 * Measured (gcc 12 -O2, riscv32-virt, the disassembly): a step of 4 outputs at stride 1 is 138
 * instructions (18 lb, 36 mul + 36 add, 4 x 9 for the requantization and store, 3 loop), of
 * 2 at stride 2 76; per layer 33-40 instructions an output (mf_rv_dw3: 39-89): VWW's 13
 * depthwise layers 4.28 M -> 3.26 M, KWS's four 1.33 M -> 1.12 M; at -Os (one generic copy,
 * below) 8.49 M and 2.46 M (mf_rv_dw3 at -Os: 4.93 M, 1.53 M). */

/* the entry and its parts inlined with the call's constants (into one MF_RV_DWD_DEF copy per
 * distinct geometry) where gcc optimizes for speed; at -O0 (no constants propagated) and at
 * -Os one generic copy each. Measured (riscv32-virt, code without weights, instructions):
 * VWW -Os per-geometry copies 26,378 B / 20.05 M, generic 14,698 B / 25.30 M; KWS 12,528 B /
 * 7.60 M vs 11,808 B / 8.93 M: -Os takes the generic copy (the code under 16 KB); -O2 keeps
 * the copies (VWW 26,454 B / 18.39 M, KWS 11,836 B / 6.95 M), compact ones (CMP, one row
 * body) where a model's copies pass rv.py's DWD_BUDGET: VWW's nine 16,834 -> 9,340 bytes for
 * +234 K instructions (17.68 M -> 17.92 M). Now the layers start on shared copies
 * (MF_RV_DWD_DEFG, one per stride: 2,070 bytes) and own copies come within the budget: VWW
 * 4,770 bytes of depthwise code, 15,414 B / 18.32 M in all at -O2 (-Os: 17,018 B / 22.47 M). */
#if defined(__GNUC__) && defined(__OPTIMIZE__) && !defined(__OPTIMIZE_SIZE__)
#define MF_RV_DWI static inline __attribute__((always_inline, unused))
#elif defined(__GNUC__)
#define MF_RV_DWI static __attribute__((unused))
#else
#define MF_RV_DWI static
#endif

/* clamp(mf_rq_apply(acc)) as mf_rv_out (sfm = -(post != 0)), the int8 range check by one
 * unsigned compare */
MF_RV_DWI int8_t mf_rv_dwq(int32_t acc, uint32_t m2, int32_t add, int32_t pre1, int32_t post,
                           int32_t sfm, int32_t MODE, int32_t lo, int32_t hi) {
    int32_t t = MODE & 2 ? (int32_t)((uint32_t)acc << pre1) : acc;
    int64_t p = (int64_t)t * (int64_t)m2;
    int32_t h = (int32_t)(p >> 32) + (int32_t)((uint32_t)p >> 31);
    int32_t v = h + add;
    if (MODE & 1) v += h >> 31 & sfm;
    v >>= post;
    if (MODE & 4) {
        if ((uint32_t)v + 128u > 255u) v = v >> 31 ^ 127;
        return (int8_t)v;
    }
    v = v < lo ? lo : v;
    return (int8_t)(v > hi ? hi : v);
}

#define MF_RV_DWQ(acc) mf_rv_dwq(acc, m2, add, pre1, post, sfm, MODE, lo, hi)

/* one output, q at its middle tap; kernel rows T (top), B (bottom) and columns L, R read only
 * when set */
#define MF_RV_DWD_1(q, L, R, acc)                                                             \
    do {                                                                                      \
        if (T) {                                                                              \
            if (L) acc += (q)[-YS - XS] * w0;                                                  \
            acc += (q)[-YS] * w1;                                                             \
            if (R) acc += (q)[-YS + XS] * w2;                                                  \
        }                                                                                     \
        if (L) acc += (q)[-XS] * w3;                                                           \
        acc += (q)[0] * w4;                                                                   \
        if (R) acc += (q)[XS] * w5;                                                            \
        if (B) {                                                                              \
            if (L) acc += (q)[YS - XS] * w6;                                                   \
            acc += (q)[YS] * w7;                                                              \
            if (R) acc += (q)[YS + XS] * w8;                                                   \
        }                                                                                     \
    } while (0)
/* stride 1: one kernel row (offset o, weights k0..k2) of 4 / 3 / 2 adjacent outputs */
#define MF_RV_DWD_R4(o, k0, k1, k2)                                                           \
    do {                                                                                      \
        int32_t v;                                                                            \
        v = q[(o) - XS]; a0 += v * k0;                                                         \
        v = q[(o)]; a0 += v * k1; a1 += v * k0;                                               \
        v = q[(o) + XS]; a0 += v * k2; a1 += v * k1; a2 += v * k0;                             \
        v = q[(o) + 2 * XS]; a1 += v * k2; a2 += v * k1; a3 += v * k0;                         \
        v = q[(o) + 3 * XS]; a2 += v * k2; a3 += v * k1;                                       \
        v = q[(o) + 4 * XS]; a3 += v * k2;                                                     \
    } while (0)
#define MF_RV_DWD_R3(o, k0, k1, k2)                                                           \
    do {                                                                                      \
        int32_t v;                                                                            \
        v = q[(o) - XS]; a0 += v * k0;                                                         \
        v = q[(o)]; a0 += v * k1; a1 += v * k0;                                               \
        v = q[(o) + XS]; a0 += v * k2; a1 += v * k1; a2 += v * k0;                             \
        v = q[(o) + 2 * XS]; a1 += v * k2; a2 += v * k1;                                       \
        v = q[(o) + 3 * XS]; a2 += v * k2;                                                     \
    } while (0)
#define MF_RV_DWD_R2(o, k0, k1, k2)                                                           \
    do {                                                                                      \
        int32_t v;                                                                            \
        v = q[(o) - XS]; a0 += v * k0;                                                         \
        v = q[(o)]; a0 += v * k1; a1 += v * k0;                                               \
        v = q[(o) + XS]; a0 += v * k2; a1 += v * k1;                                           \
        v = q[(o) + 2 * XS]; a1 += v * k2;                                                     \
    } while (0)
/* stride 2: one kernel row of 2 outputs (columns -1..3) */
#define MF_RV_DWD_S2(o, k0, k1, k2)                                                           \
    do {                                                                                      \
        int32_t v;                                                                            \
        v = q[(o) - XS]; a0 += v * k0;                                                         \
        v = q[(o)]; a0 += v * k1;                                                             \
        v = q[(o) + XS]; a0 += v * k2; a1 += v * k0;                                           \
        v = q[(o) + 2 * XS]; a1 += v * k1;                                                     \
        v = q[(o) + 3 * XS]; a1 += v * k2;                                                     \
    } while (0)
/* the kernel rows one after the other: gcc's scheduler would hoist every load of the step
 * first and spill (the empty asm with its memory clobber keeps a row's loads after the
 * previous row's sums) */
#if defined(__GNUC__)
#define MF_RV_DWD_SYNC4 __asm__("" : "+r"(a0), "+r"(a1), "+r"(a2), "+r"(a3) : : "memory")
#define MF_RV_DWD_SYNC3 __asm__("" : "+r"(a0), "+r"(a1), "+r"(a2) : : "memory")
#define MF_RV_DWD_SYNC2 __asm__("" : "+r"(a0), "+r"(a1) : : "memory")
#else
#define MF_RV_DWD_SYNC4 ((void)0)
#define MF_RV_DWD_SYNC3 ((void)0)
#define MF_RV_DWD_SYNC2 ((void)0)
#endif
#define MF_RV_DWD_ROWS(M, n)                                                                  \
    do {                                                                                      \
        if (T) {                                                                              \
            M(-YS, w0, w1, w2);                                                               \
            MF_RV_DWD_SYNC##n;                                                                \
        }                                                                                     \
        M(0, w3, w4, w5);                                                                     \
        MF_RV_DWD_SYNC##n;                                                                    \
        if (B) {                                                                              \
            M(YS, w6, w7, w8);                                                                \
            MF_RV_DWD_SYNC##n;                                                                \
        }                                                                                     \
    } while (0)

/* One output row: p at the middle tap of output 0 (x column -PL + 1), outputs to yq, yqs
 * apart; a the outputs' start, aL / aR / aLR the left / right / only column's (taps in the
 * padding counted). The unit order (left edge, steps of 4 / 2, the rest, right edge) is
 * inplace.rv_dwd's. */
MF_RV_DWI void mf_rv_dwd_row(const int8_t *p, int8_t *yq, int32_t yqs, int32_t T, int32_t B,
                             int32_t w0, int32_t w1, int32_t w2, int32_t w3, int32_t w4,
                             int32_t w5, int32_t w6, int32_t w7, int32_t w8, int32_t a,
                             int32_t aL, int32_t aR, int32_t aLR, uint32_t m2, int32_t add,
                             int32_t pre1, int32_t post, int32_t sfm, int32_t XS, int32_t YS,
                             int32_t VOW, int32_t SX, int32_t PL, int32_t RE, int32_t MODE,
                             int32_t lo, int32_t hi) {
    int32_t ox = 0, end = RE ? VOW - 1 : VOW;
    const int8_t *q = p;
    if (PL) { /* left edge: column -1 in the padding */
        int32_t acc = VOW == 1 && RE ? aLR : aL;
        if (VOW == 1 && RE)
            MF_RV_DWD_1(q, 0, 0, acc);
        else
            MF_RV_DWD_1(q, 0, 1, acc);
        yq[0] = MF_RV_DWQ(acc);
        ox = 1;
        q += SX * XS;
    }
    if (SX == 1) {
        for (; ox + 4 <= end; ox += 4, q += 4 * XS) {
            int32_t a0 = a, a1 = a, a2 = a, a3 = a;
            MF_RV_DWD_ROWS(MF_RV_DWD_R4, 4);
            yq[ox * yqs] = MF_RV_DWQ(a0);
            yq[(ox + 1) * yqs] = MF_RV_DWQ(a1);
            yq[(ox + 2) * yqs] = MF_RV_DWQ(a2);
            yq[(ox + 3) * yqs] = MF_RV_DWQ(a3);
        }
        if (ox + 3 == end) {
            int32_t a0 = a, a1 = a, a2 = a;
            MF_RV_DWD_ROWS(MF_RV_DWD_R3, 3);
            yq[ox * yqs] = MF_RV_DWQ(a0);
            yq[(ox + 1) * yqs] = MF_RV_DWQ(a1);
            yq[(ox + 2) * yqs] = MF_RV_DWQ(a2);
            ox += 3;
            q += 3 * XS;
        } else if (ox + 2 == end) {
            int32_t a0 = a, a1 = a;
            MF_RV_DWD_ROWS(MF_RV_DWD_R2, 2);
            yq[ox * yqs] = MF_RV_DWQ(a0);
            yq[(ox + 1) * yqs] = MF_RV_DWQ(a1);
            ox += 2;
            q += 2 * XS;
        }
    } else if (SX == 2) {
        for (; ox + 2 <= end; ox += 2, q += 4 * XS) {
            int32_t a0 = a, a1 = a;
            MF_RV_DWD_ROWS(MF_RV_DWD_S2, 2);
            yq[ox * yqs] = MF_RV_DWQ(a0);
            yq[(ox + 1) * yqs] = MF_RV_DWQ(a1);
        }
    }
    for (; ox < end; ox++, q += SX * XS) {
        int32_t acc = a;
        MF_RV_DWD_1(q, 1, 1, acc);
        yq[ox * yqs] = MF_RV_DWQ(acc);
    }
    if (RE && ox < VOW) { /* right edge: column +1 in the padding */
        int32_t acc = aR;
        MF_RV_DWD_1(q, 1, 0, acc);
        yq[ox * yqs] = MF_RV_DWQ(acc);
    }
}

/* ---- the shared copies (MF_RV_DWD_DEFG: the plane's sizes as arguments) ------------------
 * With XS and YS unknown at compile time every tap at its own offset costs an add (RV32 loads
 * take an immediate offset only), so a row is walked column by column instead: t, m, b (the
 * kernel rows' pointers) step XS, and each column's 3 bytes are loaded once for every output
 * that uses them (3 at stride 1, 1 or 2 at stride 2). A kernel row off (padding) is read from
 * the middle row with zero weights (its x_zp terms are in the start a, as in mf_rv_dwd_row),
 * so every row is one body. P: the current output (its left and middle columns summed), Q,
 * R the next ones; l, r: the left / right padding column's terms. SX 1 or 2 only (rv.py's
 * dwd_kinds gives the other strides their own copies). */
#define MF_RV_DWG_LD                                                                          \
    do {                                                                                      \
        v0 = *t;                                                                              \
        v1 = *m;                                                                              \
        v2 = *b;                                                                              \
        t += XS;                                                                              \
        m += XS;                                                                              \
        b += XS;                                                                              \
        MF_RV_OPAQUE(t);                                                                      \
        MF_RV_OPAQUE(m);                                                                      \
        MF_RV_OPAQUE(b);                                                                      \
    } while (0)
#define MF_RV_DWG_L(acc) acc = a + v0 * w0 + v1 * w3 + v2 * w6
#define MF_RV_DWG_M(acc) acc += v0 * w1 + v1 * w4 + v2 * w7
#define MF_RV_DWG_R(acc) acc += v0 * w2 + v1 * w5 + v2 * w8
#define MF_RV_DWG_OUT(acc)                                                                    \
    do {                                                                                      \
        *yq = MF_RV_DWQ(acc);                                                                 \
        yq += yqs;                                                                            \
    } while (0)
/* stride 1: column c + 1 finishes P, adds to Q, starts R */
#define MF_RV_DWG_S1(P, Q, R)                                                                 \
    do {                                                                                      \
        MF_RV_DWG_LD;                                                                         \
        MF_RV_DWG_R(P);                                                                       \
        MF_RV_DWG_M(Q);                                                                       \
        MF_RV_DWG_L(R);                                                                       \
        MF_RV_DWG_OUT(P);                                                                     \
    } while (0)
/* stride 2: columns c (middle) and c + 1 (right of P, left of Q) */
#define MF_RV_DWG_S2(P, Q)                                                                    \
    do {                                                                                      \
        MF_RV_DWG_LD;                                                                         \
        MF_RV_DWG_M(P);                                                                       \
        MF_RV_DWG_LD;                                                                         \
        MF_RV_DWG_R(P);                                                                       \
        MF_RV_DWG_L(Q);                                                                       \
        MF_RV_DWG_OUT(P);                                                                     \
    } while (0)
MF_RV_DWI void mf_rv_dwd_walk(const int8_t *t, const int8_t *m, const int8_t *b, int8_t *yq,
                              int32_t yqs, int32_t w0, int32_t w1, int32_t w2, int32_t w3,
                              int32_t w4, int32_t w5, int32_t w6, int32_t w7, int32_t w8,
                              int32_t a, int32_t l, int32_t r, uint32_t m2, int32_t add,
                              int32_t pre1, int32_t post, int32_t sfm, int32_t XS, int32_t VOW,
                              int32_t SX, int32_t PL, int32_t RE, int32_t MODE, int32_t lo,
                              int32_t hi) {
    int32_t P, Q, R, v0, v1, v2, n = RE ? VOW - 1 : VOW; /* outputs before the right edge */
    if (SX == 1) {
        if (PL) { /* column 0 is output 0's middle */
            P = a + l;
            MF_RV_DWG_LD;
            MF_RV_DWG_M(P);
            MF_RV_DWG_L(Q);
        } else {
            MF_RV_DWG_LD;
            MF_RV_DWG_L(P);
            MF_RV_DWG_LD;
            MF_RV_DWG_M(P);
            MF_RV_DWG_L(Q);
        }
        for (;;) { /* three outputs a round: the sums' roles turn */
            if (n <= 0) break;
            MF_RV_DWG_S1(P, Q, R);
            if (--n <= 0) {
                P = Q;
                break;
            }
            MF_RV_DWG_S1(Q, R, P);
            if (--n <= 0) {
                P = R;
                break;
            }
            MF_RV_DWG_S1(R, P, Q);
            --n;
        }
        if (RE) { /* the last output: its right column in the padding */
            P += r;
            MF_RV_DWG_OUT(P);
        }
    } else {
        if (PL) {
            P = a + l;
        } else {
            MF_RV_DWG_LD;
            MF_RV_DWG_L(P);
        }
        for (;;) {
            if (n <= 0) break;
            MF_RV_DWG_S2(P, Q);
            if (--n <= 0) {
                P = Q;
                break;
            }
            MF_RV_DWG_S2(Q, P);
            --n;
        }
        if (RE) {
            MF_RV_DWG_LD;
            MF_RV_DWG_M(P);
            P += r;
            MF_RV_DWG_OUT(P);
        }
    }
}
#undef MF_RV_DWG_LD
#undef MF_RV_DWG_L
#undef MF_RV_DWG_M
#undef MF_RV_DWG_R
#undef MF_RV_DWG_OUT
#undef MF_RV_DWG_S1
#undef MF_RV_DWG_S2

/* a delayed row from buf to y (columns C apart) */
MF_RV_DWI void mf_rv_dwd_put(const int8_t *b, int8_t *y, int32_t n, int32_t C) {
    int32_t j = 0;
    for (; j + 4 <= n; j += 4, y += 4 * C) {
        int8_t v0 = b[j], v1 = b[j + 1], v2 = b[j + 2], v3 = b[j + 3];
        y[0] = v0;
        y[C] = v1;
        y[2 * C] = v2;
        y[3 * C] = v3;
    }
    for (; j < n; j++, y += C) *y = b[j];
}

/* one row of type (T, B) with its starts: zl..zr the padding's terms of the columns, the
 * corner ones taken out when a kernel row is off too */
#define MF_RV_DWD_ROW(T_, B_)                                                                 \
    do {                                                                                      \
        int32_t a_ = init + ((T_) ? 0 : zt) + ((B_) ? 0 : zb);                                \
        int32_t l_ = zl - ((T_) ? 0 : x_zp * w0) - ((B_) ? 0 : x_zp * w6);                    \
        int32_t r_ = zr - ((T_) ? 0 : x_zp * w2) - ((B_) ? 0 : x_zp * w8);                    \
        const int8_t *p_ = x + (oy * SY - PT + 1) * YS + (1 - PL) * XS + c;                   \
        int8_t *yq_ = DLY ? buf + (oy & 1) * VOW : y + oy * OYS + c;                          \
        mf_rv_dwd_row(p_, yq_, DLY ? 1 : OXS, T_, B_, w0, w1, w2, w3, w4, w5, w6, w7, w8, a_,   \
                      a_ + l_, a_ + r_, a_ + l_ + r_, m2, add, pre1, post, sfm, XS, YS, VOW,  \
                      SX, PL, RE, MODE, lo, hi);                                              \
        if (DLY && oy > 0)                                                                    \
            mf_rv_dwd_put(buf + ((oy - 1) & 1) * VOW, y + (oy - 1) * OYS + c, VOW, OXS);     \
    } while (0)

/* x [VH][VW][C] -> y [VOH][VOW][C], stride SY x SX (SX 1 or 2), padding PT, PL (and at the
 * bottom and right) at most 1; buf: 2 VOW bytes when DLY. CMP 1: one row body for every row
 * (which kernel rows are off as values: half the code of a copy, ~2.5 instructions more an
 * output) instead of one per kind of row (top, middle, bottom, a single one); 2: the rows
 * walked column by column (mf_rv_dwd_walk: for copies whose sizes are arguments). */
MF_RV_DWI void mf_rv_dwd_x(const int8_t *x, int8_t *y, const int32_t *pk, int32_t VH,
                           int32_t VW, int32_t C, int32_t VOH, int32_t VOW, int32_t SY,
                           int32_t SX, int32_t PT, int32_t PL, int32_t x_zp, int32_t lo,
                           int32_t hi, int32_t mode, int32_t TR, int32_t DLY, int32_t CMP,
                           int8_t *buf) {
    int32_t MODE = MF_RV_MODE(mode, lo, hi), c;
    int32_t XS = TR ? VH * C : C, YS = TR ? C : VW * C; /* plane column, row steps in x */
    int32_t OXS = TR ? VOH * C : C, OYS = TR ? C : VOW * C; /* and in y */
    int32_t RE = (VOW - 1) * SX - PL + 2 >= VW;        /* the last output's column +1 padded */
    int32_t top = PT ? 1 : 0;                           /* rows with kernel row 0 padded */
    int32_t mid = (VH - 2 + PT + SY - 1) / SY;          /* rows before those with row 2 padded */
    mid = mid < top ? top : mid > VOH ? VOH : mid;
    for (c = 0; c < C; c++, pk += MF_SC_DW_REC) {
        int32_t w0 = pk[0], w1 = pk[1], w2 = pk[2], w3 = pk[3], w4 = pk[4], w5 = pk[5];
        int32_t w6 = pk[6], w7 = pk[7], w8 = pk[8], init = pk[9];
        uint32_t m2 = (uint32_t)pk[10];
        int32_t add = pk[11], pre1 = pk[12], post = pk[13], sfm = -(post != 0), oy = 0;
        int32_t zt = x_zp * (w0 + w1 + w2), zb = x_zp * (w6 + w7 + w8);
        int32_t zl = x_zp * (w0 + w3 + w6), zr = x_zp * (w2 + w5 + w8);
        if (CMP == 2) {
            for (; oy < VOH; oy++) {
                int32_t T = !(top && oy == 0), B = oy < mid && !(!T && 2 - PT >= VH);
                int32_t a_ = init + (T ? 0 : zt) + (B ? 0 : zb);
                int32_t l_ = zl - (T ? 0 : x_zp * w0) - (B ? 0 : x_zp * w6);
                int32_t r_ = zr - (T ? 0 : x_zp * w2) - (B ? 0 : x_zp * w8);
                const int8_t *m_ = x + (oy * SY - PT + 1) * YS + c;
                int8_t *yq_ = DLY ? buf + (oy & 1) * VOW : y + oy * OYS + c;
                mf_rv_dwd_walk(T ? m_ - YS : m_, m_, B ? m_ + YS : m_, yq_, DLY ? 1 : OXS,
                               T ? w0 : 0, T ? w1 : 0, T ? w2 : 0, w3, w4, w5, B ? w6 : 0,
                               B ? w7 : 0, B ? w8 : 0, a_, l_, r_, m2, add, pre1, post, sfm,
                               XS, VOW, SX, PL, RE, MODE, lo, hi);
                if (DLY && oy > 0)
                    mf_rv_dwd_put(buf + ((oy - 1) & 1) * VOW, y + (oy - 1) * OYS + c, VOW, OXS);
            }
        } else if (CMP) {
            for (; oy < VOH; oy++) {
                int32_t t0 = top && oy == 0;
                MF_RV_DWD_ROW(!t0, oy < mid && !(t0 && 2 - PT >= VH));
            }
        } else {
            if (top) {
                if (2 - PT >= VH) /* (one input row: both kernel rows off) */
                    MF_RV_DWD_ROW(0, 0);
                else
                    MF_RV_DWD_ROW(0, 1);
                oy = 1;
            }
            for (; oy < mid; oy++) MF_RV_DWD_ROW(1, 1);
            for (; oy < VOH; oy++) MF_RV_DWD_ROW(1, 0);
        }
        if (DLY) mf_rv_dwd_put(buf + ((VOH - 1) & 1) * VOW, y + (VOH - 1) * OYS + c, VOW, OXS);
    }
}

MF_RV_DWI void mf_rv_dwd(const int8_t *x, int8_t *y, const int32_t *pk, int32_t VH, int32_t VW,
                         int32_t C, int32_t VOH, int32_t VOW, int32_t SY, int32_t SX,
                         int32_t PT, int32_t PL, int32_t x_zp, int32_t lo, int32_t hi,
                         int32_t mode, int32_t TR, int32_t DLY, int8_t *buf) {
    mf_rv_dwd_x(x, y, pk, VH, VW, C, VOH, VOW, SY, SX, PT, PL, x_zp, lo, hi, mode, TR, DLY, 0,
                buf);
}

/* One copy of mf_rv_dwd for one constant geometry (plane, stride, padding, mode, lo, hi, TR,
 * DLY; x_zp stays an argument: it only sets the per-channel starts): the generated code
 * defines one per distinct geometry with this macro (codegen_c/kernels/rv.py dwd_kernel) and
 * the layers that have it call it, instead of one inlined copy per layer. Not inlined where
 * mf_rv_dwd is (the point is one body for several callers). */
#if defined(__GNUC__) && defined(__OPTIMIZE__)
#define MF_RV_DWS static __attribute__((noinline))
#else
#define MF_RV_DWS static
#endif
#define MF_RV_DWD_DEF(name, VH, VW, C, VOH, VOW, SY, SX, PT, PL, lo, hi, mode, TR, DLY)      \
    MF_RV_DWS void name(const int8_t *x, int8_t *y, const int32_t *pk, int32_t x_zp,         \
                        int8_t *buf) {                                                        \
        mf_rv_dwd_x(x, y, pk, VH, VW, C, VOH, VOW, SY, SX, PT, PL, x_zp, lo, hi, mode, TR,    \
                    DLY, 0, buf);                                                             \
    }
/* the same with one row body (mf_rv_dwd_x's CMP; rv.py's depthwise code budget) */
#define MF_RV_DWD_DEFC(name, VH, VW, C, VOH, VOW, SY, SX, PT, PL, lo, hi, mode, TR, DLY)     \
    MF_RV_DWS void name(const int8_t *x, int8_t *y, const int32_t *pk, int32_t x_zp,         \
                        int8_t *buf) {                                                        \
        mf_rv_dwd_x(x, y, pk, VH, VW, C, VOH, VOW, SY, SX, PT, PL, x_zp, lo, hi, mode, TR,    \
                    DLY, 1, buf);                                                             \
    }

/* one shared copy per stride, padding, mode, clamp, TR and DLY with the plane's sizes (VH, VW,
 * C, VOH, VOW) as arguments: the rows walked column by column (mf_rv_dwd_walk; rv.py's
 * depthwise code budget puts the layers whose own copies do not fit on these) */
#define MF_RV_DWD_DEFG(name, SY, SX, PT, PL, lo, hi, mode, TR, DLY)                          \
    MF_RV_DWS void name(const int8_t *x, int8_t *y, const int32_t *pk, int32_t x_zp,         \
                        int8_t *buf, int32_t VH, int32_t VW, int32_t C, int32_t VOH,          \
                        int32_t VOW) {                                                        \
        mf_rv_dwd_x(x, y, pk, VH, VW, C, VOH, VOW, SY, SX, PT, PL, x_zp, lo, hi, mode, TR,    \
                    DLY, 2, buf);                                                             \
    }

#undef MF_RV_DWD_ROW
#undef MF_RV_DWD_ROWS
#undef MF_RV_DWD_SYNC4
#undef MF_RV_DWD_SYNC3
#undef MF_RV_DWD_SYNC2
#undef MF_RV_DWD_1
#undef MF_RV_DWD_R4
#undef MF_RV_DWD_R3
#undef MF_RV_DWD_R2
#undef MF_RV_DWD_S2
#undef MF_RV_DWQ
#undef MF_RV_DWI

#endif
