"""runtime_c/mcuforge_rt.h vs its Python mirror codegen_c/qmath.py, and both vs TFLite Micro.

1. A C program built with -Werror -pedantic and ASan/UBSan (any UB aborts it) evaluates every
   intrinsic on random and edge-case inputs; the Python mirror must give identical results.
2. qparams: QuantizeMultiplier properties and hand-derived values.
3. End to end: single-op int8 models run by the tflite-micro interpreter must match the
   mirrors bit for bit.
"""
from __future__ import annotations

import re
import subprocess
from pathlib import Path

import numpy as np
import pytest

from mcuforge.codegen_c import qmath as m
from mcuforge.codegen_c import qparams as qp

ROOT = Path(__file__).resolve().parents[1]
HEADER = ROOT / "runtime_c" / "mcuforge_rt.h"
STRICT = ["-std=c99", "-Wall", "-Wextra", "-Werror", "-pedantic"]
I32_MIN, I32_MAX = -2**31, 2**31 - 1

# ---------------------------------------------------------------------------------------------
# The C side: one line per call, "name arg...", floats passed and returned as uint32 bit
# patterns. Arity and argument kinds per function: i = int32, b = int8, h = int16, u = uint32,
# l = int64, f = float.

SIGS = {
    "mf_u2s_i32": "u", "mf_wrap_add_i32": "ii", "mf_wrap_sub_i32": "ii", "mf_wrap_mul_i32": "ii",
    "mf_wrap_shl_i32": "ii", "mf_asr_i32": "ii", "mf_wrap_i16": "i",
    "mf_max_i32": "ii", "mf_min_i32": "ii", "mf_max_i64": "ll", "mf_min_i64": "ll",
    "mf_clamp": "iii", "mf_div_round_i32": "ii",
    "mf_max_f32": "ff", "mf_min_f32": "ff", "mf_max_nan_f32": "ff", "mf_min_nan_f32": "ff",
    "mf_srdhm": "ii", "mf_rdbpot": "ii", "mf_srmbpot": "ii", "mf_rounding_half_sum": "ii",
    "mf_mbqm": "iii", "mf_mbqm_lt1": "iii", "mf_mbqm_gt1": "iii",
    "mf_mbqm_i64": "lii",
    "mf_exp_on_interval_between_negative_one_quarter_and_0_excl": "i",
    "mf_exp_on_negative_values": "ii", "mf_one_over_one_plus_x_for_x_in_0_1": "i",
    "mf_one_minus_x_over_one_plus_x_for_x_in_0_1": "i", "mf_logistic_q": "ii", "mf_tanh_q": "ii",
    "mf_clz_u32": "u", "mf_get_reciprocal": "ii",
    "mf_logistic_s8": "biiii", "mf_tanh_s8": "biiii",
    "mf_srdhm_i16": "hh", "mf_sdhm_i16": "hh", "mf_sat_shl_i16": "hi", "mf_rdbpot_i16": "hi",
    "mf_hard_swish_s8": "biihihi", "mf_leaky_relu_s8": "biiiiii", "mf_relu_s8": "biiiiii",
    "mf_relu6_s8": "bbb", "mf_requantize_s8": "biiii", "mf_add_s8": "bbiiiiiiiiiiii",
    "mf_mul_s8": "bbiiiiiii", "mf_mean_s8": "iiiiii",
    "mf_roundf": "f", "mf_round_even_f32_to_i32": "f", "mf_quantize_f32_s8": "ffi",
    "mf_dequantize_s8_f32": "bfi",
    "mf_softmax_s8": None,  # "n mult shift diff_min v0 .. v(n-1)"
    "mf_sat_add_i32": "ii", "mf_sat_sub_i32": "ii", "mf_inv_sqrt_multiplier_exp": "i",
    "mf_rsqrt_q": "iiiiiii", "mf_log_x_for_x_greater_than_or_equal_to_1": "iii",
    "mf_l2norm_s8": None,  # "n zero_point v0 .. v(n-1)"
    "mf_log_softmax_s8": None,  # "n mult shift divisor divisor_shift diff_min v0 .. v(n-1)"
    "mf_rescale_q": "iiiii", "mf_clsb_i32": "i", "mf_div_q": "iiiiiiiii",
    "mf_floor_div_f32": "ff",
    "mf_sigmoid_table_u16": "i", "mf_lut_input_s16": "hii", "mf_logistic_s16": "hii",
    "mf_tanh_s16": "hii",
    "mf_lut_s16": None,  # "value lut0 .. lut512"
    "mf_softmax_s16": None,  # "n mult shift exp_lut[513] recip_lut[513] v0 .. v(n-1)"
    "mf_softmax_s8_s16": None,  # "n mult shift diff_min v0 .. v(n-1)"
}
FLOAT_RESULT = {"mf_max_f32", "mf_min_f32", "mf_max_nan_f32", "mf_min_nan_f32", "mf_roundf", "mf_dequantize_s8_f32"}
FLOAT_RESULT |= {"mf_floor_div_f32"}

HARNESS = r"""
#include <stdio.h>
#include <stdlib.h>
#include "mcuforge_rt.h"

static long long args[4200];

static int32_t I(int k) { return (int32_t)args[k]; }
static float F(int k) { uint32_t u = (uint32_t)args[k]; float f; memcpy(&f, &u, 4); return f; }
static unsigned long FB(float f) { uint32_t u; memcpy(&u, &f, 4); return (unsigned long)u; }

int main(void) {
    static char line[65536];
    static int8_t row_in[4096], row_out[4096];
    static int16_t row16_in[4096], row16_out[4096], lut_a[513], lut_b[513];
    while (fgets(line, sizeof line, stdin)) {
        char *tok = strtok(line, " \n"), *name = tok;
        int n = 0;
        if (!name) continue;
        while ((tok = strtok(NULL, " \n")) != NULL) args[n++] = strtoll(tok, NULL, 10);
#define IS(s) (strcmp(name, s) == 0)
#define OUT(v) printf("%ld\n", (long)(v))
        if (IS("mf_u2s_i32")) OUT(mf_u2s_i32((uint32_t)args[0]));
        else if (IS("mf_wrap_add_i32")) OUT(mf_wrap_add_i32(I(0), I(1)));
        else if (IS("mf_wrap_sub_i32")) OUT(mf_wrap_sub_i32(I(0), I(1)));
        else if (IS("mf_wrap_mul_i32")) OUT(mf_wrap_mul_i32(I(0), I(1)));
        else if (IS("mf_wrap_shl_i32")) OUT(mf_wrap_shl_i32(I(0), I(1)));
        else if (IS("mf_asr_i32")) OUT(mf_asr_i32(I(0), I(1)));
        else if (IS("mf_wrap_i16")) OUT(mf_wrap_i16(I(0)));
        else if (IS("mf_max_i32")) OUT(mf_max_i32(I(0), I(1)));
        else if (IS("mf_min_i32")) OUT(mf_min_i32(I(0), I(1)));
        else if (IS("mf_max_i64")) printf("%lld\n", (long long)mf_max_i64(args[0], args[1]));
        else if (IS("mf_min_i64")) printf("%lld\n", (long long)mf_min_i64(args[0], args[1]));
        else if (IS("mf_clamp")) OUT(mf_clamp(I(0), I(1), I(2)));
        else if (IS("mf_div_round_i32")) OUT(mf_div_round_i32(I(0), I(1)));
        else if (IS("mf_max_f32")) printf("%lu\n", FB(mf_max_f32(F(0), F(1))));
        else if (IS("mf_min_f32")) printf("%lu\n", FB(mf_min_f32(F(0), F(1))));
        else if (IS("mf_max_nan_f32")) printf("%lu\n", FB(mf_max_nan_f32(F(0), F(1))));
        else if (IS("mf_min_nan_f32")) printf("%lu\n", FB(mf_min_nan_f32(F(0), F(1))));
        else if (IS("mf_srdhm")) OUT(mf_srdhm(I(0), I(1)));
        else if (IS("mf_rdbpot")) OUT(mf_rdbpot(I(0), I(1)));
        else if (IS("mf_srmbpot")) OUT(mf_srmbpot(I(0), I(1)));
        else if (IS("mf_rounding_half_sum")) OUT(mf_rounding_half_sum(I(0), I(1)));
        else if (IS("mf_mbqm")) OUT(mf_mbqm(I(0), I(1), I(2)));
        else if (IS("mf_mbqm_lt1")) OUT(mf_mbqm_lt1(I(0), I(1), I(2)));
        else if (IS("mf_mbqm_gt1")) OUT(mf_mbqm_gt1(I(0), I(1), I(2)));
        else if (IS("mf_mbqm_i64")) OUT(mf_mbqm_i64(args[0], I(1), I(2)));
        else if (IS("mf_exp_on_interval_between_negative_one_quarter_and_0_excl"))
            OUT(mf_exp_on_interval_between_negative_one_quarter_and_0_excl(I(0)));
        else if (IS("mf_exp_on_negative_values")) OUT(mf_exp_on_negative_values(I(0), I(1)));
        else if (IS("mf_one_over_one_plus_x_for_x_in_0_1"))
            OUT(mf_one_over_one_plus_x_for_x_in_0_1(I(0)));
        else if (IS("mf_one_minus_x_over_one_plus_x_for_x_in_0_1"))
            OUT(mf_one_minus_x_over_one_plus_x_for_x_in_0_1(I(0)));
        else if (IS("mf_logistic_q")) OUT(mf_logistic_q(I(0), I(1)));
        else if (IS("mf_tanh_q")) OUT(mf_tanh_q(I(0), I(1)));
        else if (IS("mf_clz_u32")) OUT(mf_clz_u32((uint32_t)args[0]));
        else if (IS("mf_get_reciprocal")) {
            int32_t bits, r = mf_get_reciprocal(I(0), I(1), &bits);
            printf("%ld %ld\n", (long)r, (long)bits);
        }
        else if (IS("mf_logistic_s8")) OUT(mf_logistic_s8((int8_t)I(0), I(1), I(2), I(3), I(4)));
        else if (IS("mf_tanh_s8")) OUT(mf_tanh_s8((int8_t)I(0), I(1), I(2), I(3), I(4)));
        else if (IS("mf_srdhm_i16")) OUT(mf_srdhm_i16((int16_t)I(0), (int16_t)I(1)));
        else if (IS("mf_sdhm_i16")) OUT(mf_sdhm_i16((int16_t)I(0), (int16_t)I(1)));
        else if (IS("mf_sat_shl_i16")) OUT(mf_sat_shl_i16((int16_t)I(0), I(1)));
        else if (IS("mf_rdbpot_i16")) OUT(mf_rdbpot_i16((int16_t)I(0), I(1)));
        else if (IS("mf_hard_swish_s8"))
            OUT(mf_hard_swish_s8((int8_t)I(0), I(1), I(2), (int16_t)I(3), I(4), (int16_t)I(5),
                                 I(6)));
        else if (IS("mf_leaky_relu_s8"))
            OUT(mf_leaky_relu_s8((int8_t)I(0), I(1), I(2), I(3), I(4), I(5), I(6)));
        else if (IS("mf_relu_s8"))
            OUT(mf_relu_s8((int8_t)I(0), I(1), I(2), I(3), I(4), I(5), I(6)));
        else if (IS("mf_relu6_s8")) OUT(mf_relu6_s8((int8_t)I(0), (int8_t)I(1), (int8_t)I(2)));
        else if (IS("mf_requantize_s8"))
            OUT(mf_requantize_s8((int8_t)I(0), I(1), I(2), I(3), I(4)));
        else if (IS("mf_add_s8"))
            OUT(mf_add_s8((int8_t)I(0), (int8_t)I(1), I(2), I(3), I(4), I(5), I(6), I(7), I(8),
                          I(9), I(10), I(11), I(12), I(13)));
        else if (IS("mf_mul_s8"))
            OUT(mf_mul_s8((int8_t)I(0), (int8_t)I(1), I(2), I(3), I(4), I(5), I(6), I(7), I(8)));
        else if (IS("mf_mean_s8")) OUT(mf_mean_s8(I(0), I(1), I(2), I(3), I(4), I(5)));
        else if (IS("mf_roundf")) printf("%lu\n", FB(mf_roundf(F(0))));
        else if (IS("mf_round_even_f32_to_i32")) OUT(mf_round_even_f32_to_i32(F(0)));
        else if (IS("mf_quantize_f32_s8")) OUT(mf_quantize_f32_s8(F(0), F(1), I(2)));
        else if (IS("mf_dequantize_s8_f32"))
            printf("%lu\n", FB(mf_dequantize_s8_f32((int8_t)I(0), F(1), I(2))));
        else if (IS("mf_softmax_s8")) {
            int32_t k, len = I(0);
            for (k = 0; k < len; ++k) row_in[k] = (int8_t)I(4 + k);
            mf_softmax_s8(row_in, row_out, len, I(1), I(2), I(3));
            for (k = 0; k < len; ++k) printf(k ? " %d" : "%d", row_out[k]);
            printf("\n");
        }
        else if (IS("mf_sat_add_i32")) OUT(mf_sat_add_i32(I(0), I(1)));
        else if (IS("mf_sat_sub_i32")) OUT(mf_sat_sub_i32(I(0), I(1)));
        else if (IS("mf_inv_sqrt_multiplier_exp")) {
            int32_t shift, r = mf_inv_sqrt_multiplier_exp(I(0), &shift);
            printf("%ld %ld\n", (long)r, (long)shift);
        }
        else if (IS("mf_rsqrt_q")) OUT(mf_rsqrt_q(I(0), I(1), I(2), I(3), I(4), I(5), I(6)));
        else if (IS("mf_log_x_for_x_greater_than_or_equal_to_1"))
            OUT(mf_log_x_for_x_greater_than_or_equal_to_1(I(0), I(1), I(2)));
        else if (IS("mf_l2norm_s8") || IS("mf_log_softmax_s8")) {
            int32_t k, len = I(0), first = IS("mf_l2norm_s8") ? 2 : 6;
            for (k = 0; k < len; ++k) row_in[k] = (int8_t)I(first + k);
            if (first == 2) mf_l2norm_s8(row_in, row_out, len, I(1));
            else mf_log_softmax_s8(row_in, row_out, len, I(1), I(2), I(3), I(4), I(5));
            for (k = 0; k < len; ++k) printf(k ? " %d" : "%d", row_out[k]);
            printf("\n");
        }
        else if (IS("mf_rescale_q")) OUT(mf_rescale_q(I(0), I(1), I(2), I(3), I(4)));
        else if (IS("mf_clsb_i32")) OUT(mf_clsb_i32(I(0)));
        else if (IS("mf_div_q"))
            OUT(mf_div_q(I(0), I(1), I(2), I(3), I(4), I(5), I(6), I(7), I(8)));
        else if (IS("mf_floor_div_f32")) printf("%lu\n", FB(mf_floor_div_f32(F(0), F(1))));
        else if (IS("mf_sigmoid_table_u16")) OUT(mf_sigmoid_table_u16(I(0)));
        else if (IS("mf_lut_input_s16")) OUT(mf_lut_input_s16((int16_t)I(0), I(1), I(2)));
        else if (IS("mf_logistic_s16")) OUT(mf_logistic_s16((int16_t)I(0), I(1), I(2)));
        else if (IS("mf_tanh_s16")) OUT(mf_tanh_s16((int16_t)I(0), I(1), I(2)));
        else if (IS("mf_lut_s16")) {
            int32_t k;
            for (k = 0; k < 513; ++k) lut_a[k] = (int16_t)I(1 + k);
            OUT(mf_lut_s16(lut_a, (int16_t)I(0)));
        }
        else if (IS("mf_softmax_s16") || IS("mf_softmax_s8_s16")) {
            int32_t k, len = I(0);
            if (IS("mf_softmax_s16")) {
                for (k = 0; k < 513; ++k) lut_a[k] = (int16_t)I(3 + k);
                for (k = 0; k < 513; ++k) lut_b[k] = (int16_t)I(516 + k);
                for (k = 0; k < len; ++k) row16_in[k] = (int16_t)I(1029 + k);
                mf_softmax_s16(row16_in, row16_out, len, I(1), I(2), lut_a, lut_b);
            } else {
                for (k = 0; k < len; ++k) row_in[k] = (int8_t)I(4 + k);
                mf_softmax_s8_s16(row_in, row16_out, len, I(1), I(2), I(3));
            }
            for (k = 0; k < len; ++k) printf(k ? " %d" : "%d", row16_out[k]);
            printf("\n");
        }
        else { fprintf(stderr, "unknown %s\n", name); return 2; }
    }
    return 0;
}
"""


def fbits(x) -> int:
    return int(np.float32(x).view(np.uint32))


def bits_f(u: int) -> np.float32:
    return np.array([u], dtype=np.uint32).view(np.float32)[0]


def expected(name, args):
    """What the Python mirror returns for one C-harness line, formatted as the harness prints."""
    if name == "mf_softmax_s8":
        n, mult, shift, diff_min, *row = args
        out = m.mf_softmax_s8(np.array(row, np.int8), mult, shift, diff_min)
        return " ".join(str(v) for v in out)
    if name == "mf_lut_s16":
        return str(m.mf_lut_s16(args[1:], args[0]))
    if name == "mf_softmax_s16":
        n, mult, shift = args[:3]
        out = m.mf_softmax_s16(np.array(args[1029:], np.int16), mult, shift, args[3:516],
                               args[516:1029])
        return " ".join(str(v) for v in out)
    if name == "mf_softmax_s8_s16":
        n, mult, shift, diff_min, *row = args
        out = m.mf_softmax_s8_s16(np.array(row, np.int8), mult, shift, diff_min)
        return " ".join(str(v) for v in out)
    if name in ("mf_l2norm_s8", "mf_log_softmax_s8"):
        n, *rest = args
        params, row = rest[:len(rest) - n], rest[len(rest) - n:]
        out = getattr(m, name)(np.array(row, np.int8), *params)
        return " ".join(str(v) for v in out)
    pyargs = [bits_f(a) if k == "f" else a for a, k in zip(args, SIGS[name])]
    if name in ("mf_get_reciprocal", "mf_inv_sqrt_multiplier_exp"):
        r, bits = getattr(m, name)(*pyargs)
        return f"{r} {bits}"
    r = getattr(m, name)(*pyargs)
    return str(fbits(r)) if name in FLOAT_RESULT else str(int(r))


# ---------------------------------------------------------------------------------------------
# Inputs

EDGE = [I32_MIN, I32_MIN + 1, -2**30 - 1, -2**30, -65536, -32769, -256, -129, -2, -1, 0, 1, 2,
        127, 255, 32767, 2**20, 2**30 - 1, 2**30, I32_MAX - 1, I32_MAX]
MULTS = [0, 1, 2**30, 2**30 + 1, 1518500250, 2**31 - 2, 2**31 - 1]


def make_cases(rng) -> list:
    cases = []
    add = lambda name, *a: cases.append((name, [int(v) for v in a]))  # noqa: E731
    r32 = lambda k: rng.integers(I32_MIN, I32_MAX, k, endpoint=True)  # noqa: E731
    rmult = lambda k: rng.integers(2**30, 2**31, k)  # noqa: E731

    for a in EDGE:
        add("mf_u2s_i32", a & 0xFFFFFFFF)
        add("mf_clz_u32", a & 0xFFFFFFFF)
        add("mf_wrap_i16", a)
        for s in range(32):
            add("mf_wrap_shl_i32", a, s)
            add("mf_asr_i32", a, s)
            add("mf_rdbpot", a, s)
        for e in range(-31, 32):
            add("mf_srmbpot", a, e)
        for b in EDGE:
            for fn in ("mf_srdhm", "mf_wrap_add_i32", "mf_wrap_sub_i32", "mf_wrap_mul_i32",
                       "mf_max_i32", "mf_min_i32", "mf_rounding_half_sum"):
                add(fn, a, b)
        for mult in MULTS:
            for shift in range(-31, 31):
                add("mf_mbqm", a, mult, shift)
            for shift in range(-31, 1):
                add("mf_mbqm_lt1", a, mult, shift)
            for shift in range(0, 31):
                add("mf_mbqm_gt1", a, mult, shift)
    i64 = [-2**63, -2**63 + 1, -2**40, -1, 0, 1, 2**40, 2**63 - 1]
    for a in i64 + list(rng.integers(-2**63, 2**63 - 1, 30)):
        for b in i64:
            add("mf_max_i64", a, b)
            add("mf_min_i64", b, a)
    for a, b in zip(r32(3000), r32(3000)):
        add("mf_srdhm", a, b)
        add("mf_rounding_half_sum", a, b)
        add("mf_wrap_mul_i32", a, b)
    for x, mult, shift in zip(r32(6000), rmult(6000), rng.integers(-31, 31, 6000)):
        add("mf_mbqm", x, mult, shift)
        add("mf_mbqm_lt1", x, mult, min(shift, 0))
        add("mf_mbqm_gt1", x, mult, max(shift, 0))
        add("mf_rdbpot", x, abs(shift))
        add("mf_srmbpot", x, shift)
    # int64 accumulators (int16 layers) within TFLM's contract: |x| < 2^47, shift -31..7
    r64 = np.random.default_rng(47)
    for x in [-2**47 + 1, -2**40, -65537, -1, 0, 1, 65535, 2**40, 2**47 - 1] + \
            list(r64.integers(-2**47 + 1, 2**47, 1500)) + list(r64.integers(-2**20, 2**20, 500)):
        for mult, shift in [(int(r64.integers(0, 2**31)), int(r64.integers(-31, 8))),
                            (0x7FFF0000, -20), (2**31 - 1, -31), (2**30, 0), (0, 7)]:
            add("mf_mbqm_i64", x, mult, shift)
    for x, lo, hi in zip(r32(500), rng.integers(-300, 0, 500), rng.integers(0, 300, 500)):
        add("mf_clamp", x, lo, hi)
    sums = list(rng.integers(-2**24, 2**24, 2000)) + EDGE
    counts = list(rng.integers(1, 300, 2000)) + [1, 3, 7] * 7
    for s, c in zip(sums, counts):
        add("mf_div_round_i32", s, c)
    # fixed-point math
    neg = list(-rng.integers(0, 2**31, 3000, endpoint=True))
    neg += [0, -1, I32_MIN, -2**27, -2**26, -(2**26) * 31]
    for a in neg:
        for ib in (0, 1, 4, 5, 6, 12, 29):
            add("mf_exp_on_negative_values", a, ib)
        add("mf_exp_on_interval_between_negative_one_quarter_and_0_excl", max(a, -2**29))
    for a in list(rng.integers(0, 2**31, 2000)) + [0, 1, I32_MAX]:
        add("mf_one_over_one_plus_x_for_x_in_0_1", a)
        add("mf_one_minus_x_over_one_plus_x_for_x_in_0_1", a)
        add("mf_get_reciprocal", a, 12)
    for a in list(r32(3000)) + EDGE:
        for ib in (4, 5):
            add("mf_logistic_q", a, ib)
            add("mf_tanh_q", a, ib)
    for a in list(r32(300)) + EDGE:
        add("mf_get_reciprocal", a, int(rng.integers(0, 31)))
    # int16 helpers, edge values included
    i16 = [-32768, -32767, -16384, -1, 0, 1, 16384, 32766, 32767]
    for a in i16 + list(rng.integers(-32768, 32768, 200)):
        for b in i16 + list(rng.integers(-32768, 32768, 10)):
            add("mf_srdhm_i16", a, b)
            add("mf_sdhm_i16", a, b)
        for s in range(32):
            add("mf_rdbpot_i16", a, s)
        for s in list(range(18)) + [31, 32, 40]:
            add("mf_sat_shl_i16", a, s)
    # int8 kernels with TFLM-prepared parameters
    allx = range(-128, 128)
    for _ in range(25):
        s_in, s_out = (float(np.float32(10 ** rng.uniform(-3.5, 0.5))) for _ in range(2))
        zi, zo = (int(v) for v in rng.integers(-128, 128, 2))
        lp, tp = qp.logistic_params(s_in, zi), qp.tanh_params(s_in, zi)
        rp, r6 = qp.relu_params(s_in, zi, s_out, zo), qp.relu6_params(s_in, zi)
        lk = qp.leaky_relu_params(s_in, zi, s_out, zo, float(rng.uniform(-2, 2)))
        rq = qp.requantize_params(s_in, zi, s_out, zo)
        try:
            hs = qp.hard_swish_params(s_in, zi, s_out, zo)
        except ValueError:
            hs = None
        for x in allx:
            add("mf_logistic_s8", x, *lp.values())
            add("mf_tanh_s8", x, *tp.values())
            add("mf_relu_s8", x, *rp.values())
            add("mf_relu6_s8", x, *r6.values())
            add("mf_leaky_relu_s8", x, *lk.values())
            add("mf_requantize_s8", x, *rq.values())
            if hs:
                add("mf_hard_swish_s8", x, *hs.values())
    # hard swish with raw parameters: exercises the int16 saturation and wrap paths
    for x, zi, zo, rm, re_, om, oe in zip(
            rng.integers(-128, 128, 4000), rng.integers(-128, 128, 4000),
            rng.integers(-128, 128, 4000), rng.integers(0, 32768, 4000),
            rng.integers(-31, 32, 4000), rng.integers(0, 32768, 4000), rng.integers(-31, 1, 4000)):
        add("mf_hard_swish_s8", x, zi, zo, rm, re_, om, oe)
    for _ in range(40):
        s1, s2, so = (float(np.float32(10 ** rng.uniform(-3, 0))) for _ in range(3))
        z1, z2, zo = (int(v) for v in rng.integers(-128, 128, 3))
        act = ["none", "relu", "relu6", "relu_n1_to_1"][int(rng.integers(4))]
        ap = qp.add_params(s1, z1, s2, z2, so, zo, act)
        mp = qp.mul_params(s1, z1, s2, z2, so, zo, act)
        for x, y in zip(rng.integers(-128, 128, 100), rng.integers(-128, 128, 100)):
            add("mf_add_s8", x, y, *ap.values())
            add("mf_mul_s8", x, y, *mp.values())
        count = int(rng.integers(1, 5000))
        mn = qp.mean_params(s1, z1, so, zo, count)
        for total in rng.integers(-128 * count, 128 * count, 50, endpoint=True):
            add("mf_mean_s8", total, *mn.values())
    # floats
    specials = [0.0, -0.0, 0.5, -0.5, 1.5, -1.5, 2.5, -2.5, 0.49999997, 8388607.5, 8388608.0,
                -8388609.0, 1e30, -1e30, np.inf, -np.inf, np.nan, 1e-45, 3.4e38]
    wide = rng.standard_normal(3000) * 10 ** rng.uniform(-3, 7, 3000)
    floats = specials + list(wide.astype(np.float32))
    floats += list(rng.integers(-2000, 2000, 1000) / np.float32(2))  # exact halves
    for f in floats:
        add("mf_roundf", fbits(f))
        add("mf_round_even_f32_to_i32", fbits(f))
    for f in [2147483520.0, -2147483520.0, 2147483648.0, -2147483648.0, 16777215.5, 0.5000001,
              -0.4999999, 3.5, -3.5, 4.5, -4.5]:
        add("mf_round_even_f32_to_i32", fbits(f))
    for f in floats[:1500]:
        add("mf_max_f32", fbits(f), fbits(floats[int(rng.integers(len(floats)))]))
        add("mf_min_f32", fbits(floats[int(rng.integers(len(floats)))]), fbits(f))
        add("mf_max_nan_f32", fbits(f), fbits(floats[int(rng.integers(len(floats)))]))
        add("mf_max_nan_f32", fbits(floats[int(rng.integers(len(floats)))]), fbits(f))
        add("mf_min_nan_f32", fbits(f), fbits(floats[int(rng.integers(len(floats)))]))
        add("mf_min_nan_f32", fbits(floats[int(rng.integers(len(floats)))]), fbits(f))
        scale = np.float32(10 ** rng.uniform(-4, 1))
        add("mf_quantize_f32_s8", fbits(f), fbits(scale), int(rng.integers(-128, 128)))
        tie = np.float32(rng.integers(-300, 300) + 0.5) * scale
        add("mf_quantize_f32_s8", fbits(tie), fbits(scale), 0)
    for q in range(-128, 128):
        for _ in range(8):
            scale = np.float32(10 ** rng.uniform(-10, 3))
            add("mf_dequantize_s8_f32", q, fbits(scale), int(rng.integers(-128, 128)))
    # softmax rows with TFLM-prepared parameters
    _softmax_s8_rows(rng, cases, "mf_softmax_s8", 4000)
    _math_family_cases(rng, add, cases)
    _binary_family_cases(rng, add)
    _stateful_family_cases(add)
    _int16_family_cases(rng, cases)
    return cases


def _int16_family_cases(rng, cases):
    """TFLite's 16x8 softmax: the 513-entry table lookup (TFLM's two tables and a random one)
    and the int16 and int8 -> int16 rows, with the tables and parameters of TFLM's Prepare."""
    from mcuforge.codegen_c.lower.q_int16 import softmax_int16_luts, softmax_int16_params
    exp_lut, recip_lut = (t.tolist() for t in softmax_int16_luts())
    for lut in (exp_lut, recip_lut, rng.integers(-32768, 32768, 513).tolist()):
        for v in list(range(-32768, 32768, 61)) + [-32768, -129, -128, -1, 0, 127, 32767]:
            cases.append(("mf_lut_s16", [v, *lut]))
    for _ in range(150):
        mult, shift = softmax_int16_params(float(10 ** rng.uniform(-4.5, -1)),
                                           float(rng.uniform(0.2, 3)))
        n = int(rng.integers(1, 200))
        row = rng.integers(-32768, 32768, n)
        if rng.random() < 0.2:
            row[:] = row[0]
        cases.append(("mf_softmax_s16", [n, mult, shift, *exp_lut, *recip_lut, *row.tolist()]))
    _softmax_s8_rows(rng, cases, "mf_softmax_s8_s16", 3000)


def _softmax_s8_rows(rng, cases, name, long_row):
    """int8 softmax rows with TFLM-prepared parameters: short random rows (a fifth constant)
    and one row of `long_row` values."""
    for _ in range(150):
        params = qp.softmax_params(float(10 ** rng.uniform(-3, 1)), float(rng.uniform(0.1, 3)))
        n = int(rng.integers(1, 64))
        row = rng.integers(-128, 128, n)
        if rng.random() < 0.2:
            row[:] = row[0]
        cases.append((name, [n, *params, *row.tolist()]))
    row = rng.integers(-128, 128, long_row)
    cases.append((name, [long_row, *qp.softmax_params(0.05, 1.0), *row.tolist()]))


def _stateful_family_cases(add):
    """The int16 sigmoid / tanh of the integer LSTM: every int16 input, for the (multiplier,
    shift) pairs TFLM passes (0, s) for power-of-two scales, and general multipliers."""
    for i in range(256):
        add("mf_sigmoid_table_u16", i)
    params = [(0, 0), (0, 1), (0, 3), (0, 4), (3, 3), (3, 1), (24576, 2), (19661, 5)]
    for x in range(-32768, 32768, 7):
        for mult, shift in params:
            add("mf_lut_input_s16", x, mult, shift)
            add("mf_logistic_s16", x, mult, shift)
            add("mf_tanh_s16", x, mult, shift)
    for x in (-32768, -32767, -1, 0, 1, 32767):
        for mult, shift in params:
            add("mf_logistic_s16", x, mult, shift)
            add("mf_tanh_s16", x, mult, shift)


def _binary_family_cases(rng, add):
    """Rescaled operands (SUB, comparisons, SQUARED_DIFFERENCE, ADD_N), int8 DIV, FLOOR_DIV."""
    for a in EDGE + list(rng.integers(I32_MIN, I32_MAX, 300, endpoint=True)):
        add("mf_clsb_i32", a)
    for _ in range(60):
        ratio = float(rng.uniform(0.01, 0.5)) if rng.random() < 0.8 else 0.5
        mult, shift = qp.quantize_multiplier_smaller_than_one_exp(ratio)
        left_shift = int(rng.choice([0, 7, 8, 15, 20]))
        wide = left_shift <= 15 and rng.random() < 0.5  # int16 operands
        lim = 32768 if wide else 128
        offset = 0 if wide else int(rng.integers(-127, 129))
        for x in rng.integers(-lim, lim, 60):
            add("mf_rescale_q", x, offset, left_shift, mult, shift)
    for _ in range(40):
        s1, s2, so = (np.float32(10 ** rng.uniform(-3, 0)) for _ in range(3))
        mult, shift = qp.quantize_multiplier(float(s1 / (s2 * so)))  # float32 ratio, as TFLM
        z1, z2, zo = (int(v) for v in rng.integers(-128, 128, 3))
        lo, hi = (-128, 127) if rng.random() < 0.7 else (zo, 127)
        for x, y in zip(rng.integers(-128, 128, 150), rng.integers(-128, 128, 150)):
            if y != z2:
                add("mf_div_q", x, y, -z1, -z2, mult, shift, zo, lo, hi)
    pairs = [(7.0, 2.0), (-7.0, 2.0), (7.0, -2.0), (1.0, 1 / 3), (-1.0, 1 / 3), (0.0, 3.0),
             (-0.0, 3.0), (0.0, -3.0), (1e30, 1e-30), (-5.0, 0.0), (5.0, np.inf), (-5.0, np.inf),
             (np.nan, 2.0), (3e38, 0.5), (9007199254740993.0, 1.0), (-1.5, 1.0), (4.5e15, 1.5)]
    for a, b in pairs + list(zip(rng.standard_normal(2000) * 10 ** rng.uniform(-3, 8, 2000),
                                 rng.standard_normal(2000) * 10 ** rng.uniform(-3, 3, 2000))):
        add("mf_floor_div_f32", fbits(a), fbits(b))


def _math_family_cases(rng, add, cases):
    """Inverse square root, log and the int8 L2-normalisation / log-softmax rows."""
    for a in EDGE + list(rng.integers(I32_MIN, I32_MAX, 500, endpoint=True)):
        add("mf_sat_add_i32", a, EDGE[int(rng.integers(len(EDGE)))])
        add("mf_sat_sub_i32", EDGE[int(rng.integers(len(EDGE)))], a)
    inputs = list(range(-3, 70000)) + [2**27 - 1, 2**27, 2**29 - 1, 2**29, 2**30, I32_MAX]
    inputs += list(rng.integers(0, 2**31, 3000))
    for x in inputs:
        add("mf_inv_sqrt_multiplier_exp", x)
    for a in list(rng.integers(1, 2**31, 3000)) + [1, 2, 2**19, 2**30, I32_MAX]:
        for in_ib, out_ib in ((12, 5), (5, 5), (0, 1), (20, 6)):
            add("mf_log_x_for_x_greater_than_or_equal_to_1", a, in_ib, out_ib)
    for _ in range(20):
        s_in, s_out = (float(np.float32(10 ** rng.uniform(-4, 0))) for _ in range(2))
        mult, shift = qp.quantize_multiplier(1.0 / float(np.sqrt(np.float32(s_in))
                                                         * np.float32(s_out)))
        zi, zo = (int(v) for v in rng.integers(-128, 128, 2))
        for x in range(-128, 128):
            add("mf_rsqrt_q", x, zi, zo, mult, shift, -128, 127)
        for x in rng.integers(-32768, 32768, 300):
            add("mf_rsqrt_q", x, 0, 0, mult, shift, -32768, 32767)
    for _ in range(150):
        n = int(rng.integers(1, 300))
        row = rng.integers(-128, 128, n)
        if rng.random() < 0.2:
            row[:] = row[0]
        cases.append(("mf_l2norm_s8", [n, int(rng.integers(-128, 128)), *row.tolist()]))
        scale = float(np.float32(10 ** rng.uniform(-3, 1)))
        mult, shift, diff_min = qp.softmax_params(scale, 1.0)
        divisor, divisor_shift = qp.quantize_multiplier_smaller_than_one_exp(
            (1 << (31 - shift)) / mult)
        cases.append(("mf_log_softmax_s8", [n, mult, shift, divisor, divisor_shift, diff_min,
                                            *row.tolist()]))


# ---------------------------------------------------------------------------------------------
# Fixtures


@pytest.fixture(scope="module")
def c_results(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("rt")
    src, exe = tmp / "harness.c", tmp / "harness"
    src.write_text(HARNESS)
    subprocess.run(["gcc", *STRICT, "-O2", "-fsanitize=address,undefined",
                    "-fno-sanitize-recover=all", "-I", str(HEADER.parent), str(src),
                    "-o", str(exe)], check=True, capture_output=True, text=True)
    cases = make_cases(np.random.default_rng(20240501))
    text = "".join(f"{name} {' '.join(map(str, args))}\n" for name, args in cases)
    run = subprocess.run([str(exe)], input=text, capture_output=True, text=True,
                         env={"ASAN_OPTIONS": "detect_leaks=0",
                              "UBSAN_OPTIONS": "print_stacktrace=1"})
    assert run.returncode == 0, run.stderr[-3000:]
    lines = run.stdout.splitlines()
    assert len(lines) == len(cases)
    by_name = {}
    for (name, args), out in zip(cases, lines):
        by_name.setdefault(name, []).append((args, out))
    return by_name


# ---------------------------------------------------------------------------------------------
# C header vs Python mirror


def test_header_is_strict_c99(tmp_path):
    includes = re.findall(r"#include\s*(\S+)", HEADER.read_text())
    assert sorted(includes) == ["<stddef.h>", "<stdint.h>", "<string.h>"]
    src = tmp_path / "t.c"
    src.write_text('#include "mcuforge_rt.h"\nint main(void) { return 0; }\n')
    subprocess.run(["gcc", *STRICT, "-Wconversion", "-I", str(HEADER.parent), "-c", str(src),
                    "-o", str(tmp_path / "t.o")], check=True, capture_output=True)


def test_every_c_function_is_mirrored_and_tested():
    c_names = set(re.findall(r"static inline [\w\s\*]+?\b(mf_\w+)\(", HEADER.read_text()))
    py_names = {n for n in dir(m) if n.startswith("mf_")}
    assert c_names == py_names
    assert c_names == set(SIGS)
    # mcuforge_math.h's mfm_ mirrors join INTRINSICS too (codegen_c/mathmirror.py)
    # (the micro-kernels' mirrors, codegen_c/micro*.py, join it too: mcuforge_nn.h and friends)
    assert {n for n, f in m.INTRINSICS.items() if n.startswith("mf_")
            and not f.__module__.startswith("mcuforge.codegen_c.micro")} == \
        c_names - {"mf_get_reciprocal", "mf_inv_sqrt_multiplier_exp"}


@pytest.mark.parametrize("name", sorted(SIGS))
def test_c_matches_python(c_results, name):
    results = c_results.get(name)
    assert results, f"no cases for {name}"
    bad = [(args, out, exp) for args, out in results if out != (exp := expected(name, args))]
    assert not bad, f"{len(bad)}/{len(results)} mismatches, first: {bad[:3]}"


def test_mbqm_array_matches_scalar():
    rng = np.random.default_rng(7)
    x = np.concatenate([rng.integers(I32_MIN, I32_MAX, 20000, endpoint=True), EDGE])
    mult = rng.integers(2**30, 2**31, x.size)
    mult[:50] = 2**31 - 1
    shift = rng.integers(-31, 31, x.size)
    got = m.mbqm_array(x, mult, shift)
    want = [m.mf_mbqm(int(a), int(b), int(c)) for a, b, c in zip(x, mult, shift)]
    assert got.tolist() == want


def test_softmax_intrinsic_calling_convention():
    """INTRINSICS['mf_softmax_s8'] takes the C argument list and writes into the out view."""
    params = qp.softmax_params(0.1, 1.0)
    buf_in = np.array([0, 5, 1, 2, 3, 9], np.int8)
    buf_out = np.zeros(8, np.int8)
    m.INTRINSICS["mf_softmax_s8"](buf_in[1:], buf_out[2:], 4, *params)
    assert buf_out[2:6].tolist() == m.mf_softmax_s8(buf_in[1:5], *params).tolist()
    assert buf_out[:2].tolist() == [0, 0] and buf_out[6:].tolist() == [0, 0]


def test_numpy_integer_arguments():
    assert m.mf_srdhm(np.int32(2**30), np.int32(2**30)) == 2**29
    assert m.mf_mbqm(np.int32(1000), np.int32(2**31 - 1), np.int32(3)) == 8000


# ---------------------------------------------------------------------------------------------
# qparams


def test_quantize_multiplier_properties():
    rng = np.random.default_rng(3)
    reals = list(10 ** rng.uniform(-9.5, 6, 5000)) + [1e-9, 0.5, 1.0, 2.0, 0.999999999, 1 - 2**-40]
    for real in reals + [-r for r in reals[:500]]:
        mult, shift = qp.quantize_multiplier(real)
        assert 2**30 <= abs(mult) < 2**31
        approx = mult * 2.0 ** (shift - 31)
        assert abs(approx - real) <= 1e-9 * abs(real)
    assert qp.quantize_multiplier(0.0) == (0, 0)
    assert qp.quantize_multiplier(2.0**-33) == (0, 0)  # shift < -31 flushes to zero
    assert qp.quantize_multiplier(2.0**-32) == (2**30, -31)
    assert qp.quantize_multiplier(0.5) == (2**30, 0)
    assert qp.quantize_multiplier(1.0) == (2**30, 1)
    assert qp.quantize_multiplier(0.75) == (3 * 2**29, 0)
    assert qp.quantize_multiplier(1 - 2**-40) == (2**30, 1)  # rounds to 2^31: halved, shift+1


def test_qparams_hand_derived():
    # beta * scale * 2^26 = 2^22 -> (2^30, 23); radius = floor(31 * 2^26 / 2^23) = 248
    assert qp.softmax_params(2.0**-4, 1.0) == (2**30, 23, -248)
    # scale * 2^27 = 2^22 -> frexp (0.5, 23); radius = floor(15 * 2^27 / 2^23) = 240
    assert qp.logistic_params(2.0**-5, 7) == dict(input_zero_point=7, input_range_radius=240,
                                                  input_multiplier=2**30, input_left_shift=23)
    assert qp.activation_range_int8("relu6", 6 / 255, -128) == (-128, 127)
    assert qp.activation_range_int8("relu", 0.1, 10) == (10, 127)
    assert qp.activation_range_int8("relu_n1_to_1", 0.25, 0) == (-4, 4)
    assert qp.activation_range_int8("relu6", 0.02, 5) == (5, 127)
    mults, shifts = qp.conv_output_multipliers(0.5, [0.25, 0.75], 1.0)
    assert mults.tolist() == [2**30, 3 * 2**29] and shifts.tolist() == [-2, -1]
    mults, shifts = qp.conv_output_multipliers(0.5, [0.25], 1.0, num_channels=3)
    assert mults.tolist() == [2**30] * 3 and shifts.tolist() == [-2] * 3
    p = qp.add_params(0.5, 1, 0.25, -2, 1.0, 3)
    assert (p["input1_multiplier"], p["input1_shift"]) == (2**30, 0)  # 0.5
    assert (p["input2_multiplier"], p["input2_shift"]) == (2**30, -1)  # 0.25
    assert (p["output_multiplier"], p["output_shift"]) == (2**30, -19)  # 1 / 2^20
    assert qp.relu6_params(6 / 127, -1) == dict(lower=-1, upper=126)
    assert qp.downscale_int32_to_int16_multiplier(2**31 - 1) == 32767
    assert qp.downscale_int32_to_int16_multiplier(2**30) == 16384


def test_fc_per_tensor_uses_float32_product():
    """GetQuantizedConvolutionMultipler rounds input_scale * filter_scale to float32 first."""
    rng = np.random.default_rng(11)
    seen_difference = False
    for _ in range(2000):
        si, sf, so = (float(np.float32(10 ** rng.uniform(-4, 0))) for _ in range(3))
        fc = qp.fc_output_multipliers(si, [sf], so)
        conv = qp.conv_output_multipliers(si, [sf], so)
        want = qp.quantize_multiplier(float(np.float32(si) * np.float32(sf)) / so)
        assert (int(fc[0][0]), int(fc[1][0])) == want
        seen_difference |= int(fc[0][0]) != int(conv[0][0])
    assert seen_difference


def test_mean_params_folds_count():
    for count in (1, 2, 3, 7, 49, 64, 1000, 4096, 12345):
        p = qp.mean_params(0.03, 0, 0.02, 0, count)
        approx = p["mult"] * 2.0 ** (p["shift"] - 31)
        real = float(np.float32(0.03)) / float(np.float32(0.02)) / count
        assert abs(approx - real) < 1e-8 * real + 2.0**-31


# ---------------------------------------------------------------------------------------------
# End to end against the TFLM interpreter


@pytest.fixture(scope="module")
def tflm():
    from tflite_micro.python.tflite_micro import runtime

    from mcuforge.frontend.tflite_writer import write_tflite
    from mcuforge.ir.graph import Graph, Node, Quant, Tensor

    def run(op, inputs, out, attrs, *arrays):
        """inputs: [(dtype, scale, zp)], out: (dtype, scale, zp); arrays share one shape."""
        def tensor(name, dt, s, z, shape):
            return Tensor(name, shape, dt, quant=None if s is None else Quant((s,), (z,)))
        shape = tuple(attrs.pop("_out_shape", arrays[0].shape))
        names = [f"x{i}" for i in range(len(inputs))]
        ts = {n: tensor(n, *q, a.shape) for n, q, a in zip(names, inputs, arrays)}
        ts["y"] = tensor("y", *out, shape)
        graph = Graph(ts, [Node(op, tuple(names), ("y",), attrs)], names, ["y"])
        it = runtime.Interpreter.from_bytes(write_tflite(graph), arena_size=1 << 20)
        for i, a in enumerate(arrays):
            it.set_input(a, i)
        it.invoke()
        return it.get_output(0)
    return run


ALL_INT8 = np.arange(-128, 128, dtype=np.int8).reshape(1, 256)


def _scales(rng, k, lo=-3.5, hi=0.5):
    return [float(np.float32(10 ** rng.uniform(lo, hi))) for _ in range(k)]


def test_tflm_unary_ops(tflm):
    rng = np.random.default_rng(5)
    for trial in range(30):
        s_in, s_out = _scales(rng, 2)
        zi, zo = (int(v) for v in rng.integers(-128, 128, 2))
        x = ALL_INT8
        checks = [
            ("logistic", (1 / 256, -128), {}, m.mf_logistic_s8, qp.logistic_params(s_in, zi)),
            ("tanh", (1 / 128, 0), {}, m.mf_tanh_s8, qp.tanh_params(s_in, zi)),
            ("relu", (s_out, zo), {}, m.mf_relu_s8, qp.relu_params(s_in, zi, s_out, zo)),
            ("relu6", (s_out, zo), {}, m.mf_relu6_s8, qp.relu6_params(s_in, zi)),
            ("quantize", (s_out, zo), {}, m.mf_requantize_s8,
             qp.requantize_params(s_in, zi, s_out, zo)),
        ]
        alpha = float(np.float32(rng.uniform(-1.5, 1.5)))
        checks.append(("leaky_relu", (s_out, zo), {"alpha": alpha}, m.mf_leaky_relu_s8,
                       qp.leaky_relu_params(s_in, zi, s_out, zo, alpha)))
        try:
            checks.append(("hard_swish", (s_out, zo), {}, m.mf_hard_swish_s8,
                           qp.hard_swish_params(s_in, zi, s_out, zo)))
        except ValueError:
            pass
        for op, (os_, oz), attrs, fn, params in checks:
            ref = tflm(op, [("int8", s_in, zi)], ("int8", os_, oz), dict(attrs), x)
            mine = [fn(int(v), *params.values()) for v in x[0]]
            assert ref[0].tolist() == mine, (op, s_in, zi, s_out, zo, params)


def test_tflm_softmax(tflm):
    rng = np.random.default_rng(6)
    for trial in range(30):
        s_in, beta = _scales(rng, 1, -3, 1)[0], float(np.float32(rng.uniform(0.1, 3)))
        n = int(rng.integers(1, 300))
        x = rng.integers(-128, 128, size=(4, n)).astype(np.int8)
        x[1] = x[1, 0]
        zi = int(rng.integers(-128, 128))
        ref = tflm("softmax", [("int8", s_in, zi)], ("int8", 1 / 256, -128), {"beta": beta}, x)
        params = qp.softmax_params(s_in, beta)
        mine = np.stack([m.mf_softmax_s8(r, *params) for r in x])
        assert np.array_equal(ref, mine), (s_in, beta, n)


def test_tflm_add_mul(tflm):
    rng = np.random.default_rng(8)
    a = np.repeat(np.arange(-128, 128, 5, dtype=np.int8), 52).reshape(1, -1)
    b = np.tile(np.arange(-128, 128, 5, dtype=np.int8), 52).reshape(1, -1)
    for trial in range(16):
        s1, s2, so = _scales(rng, 3, -3, 0)
        z1, z2, zo = (int(v) for v in rng.integers(-128, 128, 3))
        act = ["none", "relu", "relu6", "relu_n1_to_1"][trial % 4]
        for op, fn, pf in (("add", m.mf_add_s8, qp.add_params),
                           ("mul", m.mf_mul_s8, qp.mul_params)):
            ref = tflm(op, [("int8", s1, z1), ("int8", s2, z2)], ("int8", so, zo),
                       {"activation": act}, a, b)
            params = pf(s1, z1, s2, z2, so, zo, act)
            mine = [fn(int(x), int(y), *params.values()) for x, y in zip(a[0], b[0])]
            assert ref[0].tolist() == mine, (op, s1, z1, s2, z2, so, zo, act)


def test_tflm_mean(tflm):
    rng = np.random.default_rng(9)
    for trial in range(20):
        s1, so = _scales(rng, 2, -3, 0)
        z1, zo = (int(v) for v in rng.integers(-128, 128, 2))
        h, w, c = (int(v) for v in rng.integers(1, 12, 3))
        x = rng.integers(-128, 128, size=(1, h, w, c)).astype(np.int8)
        ref = tflm("mean", [("int8", s1, z1)], ("int8", so, zo),
                   {"axes": (1, 2), "keep_dims": True, "_out_shape": (1, 1, 1, c)}, x)
        params = qp.mean_params(s1, z1, so, zo, h * w)
        sums = x.astype(np.int32).sum(axis=(0, 1, 2))
        assert ref.reshape(-1).tolist() == [m.mf_mean_s8(int(t), *params.values()) for t in sums]


def test_tflm_quantize_dequantize(tflm):
    rng = np.random.default_rng(10)
    for trial in range(10):
        scale = _scales(rng, 1, -3, 0)[0]
        zp = int(rng.integers(-128, 128))
        xf = (rng.standard_normal((1, 400)) * rng.uniform(0.01, 100)).astype(np.float32)
        xf[0, :40] = (np.arange(40) - 20 + 0.5).astype(np.float32) * np.float32(scale)  # ties
        ref = tflm("quantize", [("float32", None, None)], ("int8", scale, zp), {}, xf)
        assert ref[0].tolist() == [m.mf_quantize_f32_s8(v, scale, zp) for v in xf[0]]
        ref = tflm("dequantize", [("int8", scale, zp)], ("float32", None, None), {}, ALL_INT8)
        mine = np.array([m.mf_dequantize_s8_f32(int(v), scale, zp) for v in ALL_INT8[0]],
                        np.float32)
        assert ref[0].view(np.uint32).tolist() == mine.view(np.uint32).tolist()


def test_tflm_int16_logistic_tanh():
    """int16 LOGISTIC / TANH in TFLM (power-of-two scales, so multiplier 0 as in the LSTM) on
    every int16 value: the table and the interpolation of mf_logistic_s16 / mf_tanh_s16."""
    from tflite_micro.python.tflite_micro import runtime

    from mcuforge.tools.tflite_cases import q, single, tensor
    x = np.arange(-32768, 32768, dtype=np.int16).reshape(1, -1)
    for op, fn, in_scale, shift in (("LOGISTIC", m.mf_logistic_s16, 2.0**-12, 0),
                                    ("TANH", m.mf_tanh_s16, 2.0**-12, 0),
                                    ("TANH", m.mf_tanh_s16, 2.0**-11, 1)):
        c = single(op, "", [tensor("x", x.shape, "int16", q(in_scale))],
                   [tensor("y", x.shape, "int16", q(2.0**-15))])
        it = runtime.Interpreter.from_bytes(c.model(), arena_size=1 << 20)
        it.set_input(x, 0)
        it.invoke()
        mine = [fn(int(v), 0, shift) for v in x.reshape(-1)]
        assert it.get_output(0).reshape(-1).tolist() == mine, (op, in_scale)
