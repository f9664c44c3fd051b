"""The GEMM micro-kernels of runtime_c/mcuforge_nn.h (mf_gemm_w16/w8: 1x1 convolutions and fully
connected layers; mf_conv_w16/w8: im2col convolutions) with codegen_c/pack.py's weight packing,
byte for byte against a numpy model of TFLM's int8 reference kernels written here (input zero
point subtracted, bias added, MultiplyByQuantizedMultiplier as SaturatingRoundingDoublingHighMul
+ RoundingDivideByPOT, output zero point, activation clamp).

Builds: host gcc (portable C, with ASan/UBSan), Cortex-M4 on QEMU mps2-an386 with the DSP body
at -O0/-O2/-Os, the portable body on the M4 (MF_USE_DSP=0) and on a Cortex-M3 (mps2-an385).
Shapes are random with tails: odd row counts, O not a multiple of 4, K not a multiple of 4,
row strides wider than the rows; channels with power-of-two scales force rounding ties; relu,
relu6-like and no clamps; both weight formats."""
from __future__ import annotations

import math

import numpy as np
import pytest

from mcuforge.codegen_c import pack
from tests.nn_bench import harness
from conftest import require_tflm, require_tools

INT32_MIN, INT32_MAX = -2**31, 2**31 - 1
SENTINEL = 0x55  # bytes of y the kernel must not write (row gaps)


# ---- numpy model of TFLM's int8 arithmetic --------------------------------------------------
def quantize_multiplier(real: float):
    """TFLM QuantizeMultiplier: real = mult * 2^(shift - 31), mult in [2^30, 2^31)."""
    q, shift = math.frexp(real)
    mult = math.floor(q * 2**31 + 0.5)  # TfLiteRound: half away from zero (q > 0)
    if mult == 2**31:
        mult //= 2
        shift += 1
    return mult, shift


def srdhm(a: np.ndarray, b: int) -> np.ndarray:
    """SaturatingRoundingDoublingHighMul (b > 0 here, so no saturation case)."""
    ab = a.astype(np.int64) * b
    nudge = np.where(ab >= 0, 1 << 30, 1 - (1 << 30))
    t = ab + nudge
    return np.where(t >= 0, t // 2**31, -((-t) // 2**31))  # C division truncates


def rdbpot(x: np.ndarray, e: int) -> np.ndarray:
    mask = (1 << e) - 1
    rem = x & mask
    threshold = (mask >> 1) + (x < 0)
    return (x >> e) + (rem > threshold)


def mbqm(acc: np.ndarray, mult: int, shift: int) -> np.ndarray:
    left, right = max(shift, 0), max(-shift, 0)
    return rdbpot(srdhm(acc * (1 << left), mult), right)


def tflm_outputs(x_rows, w, bias, x_zp, mults, shifts, y_zp, lo, hi):
    """[rows, O] int8: clamp(y_zp + MBQM(bias + sum (x - x_zp) * w), lo, hi)."""
    acc = (x_rows.astype(np.int64) - x_zp) @ w.astype(np.int64).T + bias
    y = np.stack([mbqm(acc[:, o], mults[o], shifts[o]) for o in range(w.shape[0])], axis=1)
    return np.clip(y + y_zp, lo, hi).astype(np.int8)


def tflm_conv(x, w, bias, x_zp, stride, padding, mults, shifts, y_zp, lo, hi):
    """x [H, W, C], w [O, KH, KW, C] -> [OH, OW, O] like TFLM's reference Conv (dilation 1);
    stride: one number or (stride_h, stride_w)."""
    h, wd, c = x.shape
    o, kh, kw, _ = w.shape
    sh, sw = (stride, stride) if np.isscalar(stride) else stride
    oh, ow, pt, pl = conv_geometry(h, wd, kh, kw, (sh, sw), padding)
    ph = max((oh - 1) * sh + kh - h, 0)
    pw = max((ow - 1) * sw + kw - wd, 0)
    xp = np.full((h + ph + kh, wd + pw + kw, c), x_zp, np.int64)
    xp[pt:pt + h, pl:pl + wd] = x
    rows = np.array([xp[oy * sh:oy * sh + kh, ox * sw:ox * sw + kw].reshape(-1)
                     for oy in range(oh) for ox in range(ow)])
    y = tflm_outputs(rows, w.reshape(o, -1), bias, x_zp, mults, shifts, y_zp, lo, hi)
    return y.reshape(oh, ow, o)


def conv_geometry(h, w, kh, kw, stride, padding):
    """TFLM's output size and top/left padding for SAME / VALID, dilation 1."""
    sh, sw = (stride, stride) if np.isscalar(stride) else stride
    if padding == "VALID":
        oh, ow = (h - kh + sh) // sh, (w - kw + sw) // sw
    else:
        oh, ow = (h + sh - 1) // sh, (w + sw - 1) // sw
    pt = max((oh - 1) * sh + kh - h, 0) // 2
    pl = max((ow - 1) * sw + kw - w, 0) // 2
    return oh, ow, pt, pl


# ---- random layers ---------------------------------------------------------------------------
def random_layer(rng, o, k, act, fused=False, post0=True):
    """Weights, bias, zero points, per-channel scales (some powers of two: rounding ties) and
    the clamp of one layer. fused: output zero point -128 (TFLite's fused ReLU); post0: some
    channels with scale >= 0.5 (no right shift)."""
    w = rng.integers(-127, 128, (o, k))
    if rng.random() < 0.3:
        w[:, rng.integers(0, k)] = 127  # extreme taps
    bias = rng.integers(-3000, 3000, o)
    x_zp, y_zp = int(rng.integers(-128, 128)), int(rng.integers(-100, 100))
    if fused or (act != "none" and rng.random() < 0.4):
        y_zp = -128  # TFLite's fused ReLU: the clamp is the int8 range, no sign term needed
    spread = 128 * 80 * math.sqrt(k)  # rough |acc|
    scales = []
    for i in range(o):
        r = rng.random()
        if r < 0.3:
            scales.append(2.0 ** -int(rng.integers(1, 8)))  # exact halves: ties
        elif r < 0.4 and post0:
            # shift 0 (no right shift), or up to 7 (pre up to 8: weights << 8 in int16)
            scales.append(float(rng.uniform(0.5, 0.99)) * 2.0 ** int(rng.integers(0, 8)))
            w[i] = 0  # and a small accumulator, so that the output is not all clamped
            w[i, rng.integers(0, k)] = rng.choice([-1, 1])
            bias[i] = rng.integers(-50, 50)
        else:
            scales.append(float(60 / spread * np.exp(rng.uniform(-1.5, 1.5))))
    ms = [quantize_multiplier(s) for s in scales]
    if act == "relu":
        lo, hi = max(-128, y_zp), 127
    elif act == "relu6":
        lo, hi = max(-128, y_zp), min(127, y_zp + int(rng.integers(5, 60)))
    else:
        lo, hi = -128, 127
    # signfix: mostly what the compiler passes (pack.signfix_mode: 2 = the sign term from the
    # accumulator where every channel shifts right), sometimes the classic 1
    return dict(w=w, bias=bias, x_zp=x_zp, y_zp=y_zp, mults=[m for m, _ in ms],
                shifts=[s for _, s in ms], lo=lo, hi=hi, classic_sf=bool(rng.random() < 0.3),
                fold_pre=bool(rng.random() < 0.5))


def kernel_args(L, w_rows, fmt="w16"):
    """What the compiler passes (pack.py): weight rows, folded bias, mf_rq rows, signfix; for
    "w16g" (and half the "w16" layers) 2^pre folded into weights and bias, flag MF_PRE0."""
    folded, rq, sf = _kernel_args(L, w_rows)
    if fmt in ("w16g", "w16pg", "w16x2", "w16k8") or (fmt == "w16" and L.get("fold_pre")):
        f = pack.fold_pre(w_rows, folded, rq)
        assert f is not None
        return (*f, sf | pack.PRE0)
    return w_rows, folded, rq, sf


def _kernel_args(L, w_rows):
    folded = pack.fold_bias(L["bias"], w_rows, L["x_zp"])
    rq = pack.requant_params(L["mults"], L["shifts"], L["y_zp"], pack.acc_bounds(folded, w_rows))
    assert folded is not None and rq is not None
    if L.get("classic_sf"):
        return folded, rq, pack.needs_signfix(L["y_zp"], L["lo"])
    return folded, rq, pack.signfix_mode(L["y_zp"], L["lo"], rq)


def gemm_case(rng, rows, k, o, fmt, act, x_gap=0, y_gap=0, fused=False, post0=True):
    L = random_layer(rng, o, k, act, fused, post0)
    xs, ys = k + x_gap, o + y_gap
    x = rng.integers(-128, 128, rows * xs).astype(np.int8)
    x_rows = np.stack([x[r * xs:r * xs + k] for r in range(rows)])
    want = np.full(rows * ys - y_gap, SENTINEL, np.int8)
    y = tflm_outputs(x_rows, L["w"], L["bias"], L["x_zp"], L["mults"], L["shifts"], L["y_zp"],
                     L["lo"], L["hi"])
    for r in range(rows):
        want[r * ys:r * ys + o] = y[r]
    w, folded, rq, sf = kernel_args(L, L["w"], fmt)
    return dict(kind="gemm", fmt=fmt, x=x, rows=rows, xs=xs, k=k, o=o, ys=ys, w=w,
                bias=folded, rq=rq, sf=sf, lo=L["lo"], hi=L["hi"], want=want)


def conv_case(rng, h, wd, c, kh, kw, stride, padding, o, fmt, act, fused=False,
              post0=True):
    L = random_layer(rng, o, kh * kw * c, act, fused, post0)
    x = rng.integers(-128, 128, (h, wd, c))
    w4 = L["w"].reshape(o, kh, kw, c)
    y = tflm_conv(x, w4, L["bias"], L["x_zp"], stride, padding, L["mults"], L["shifts"],
                  L["y_zp"], L["lo"], L["hi"])
    oh, ow, pt, pl = conv_geometry(h, wd, kh, kw, stride, padding)
    w, folded, rq, sf = kernel_args(L, L["w"], fmt)
    sh, sw = (stride, stride) if np.isscalar(stride) else stride
    geom = (h, wd, c, kh, kw, sh, sw, pt, pl, oh, ow)
    return dict(kind="conv", fmt=fmt, x=x.reshape(-1).astype(np.int8), geom=geom,
                x_zp=L["x_zp"], k=kh * kw * c, o=o, w=w, bias=folded, rq=rq, sf=sf,
                lo=L["lo"], hi=L["hi"], want=y.reshape(-1))


# "w16g": w16 weights through the entries specialised on K (mf_gemm_w16_g<G>, G = Kp / 4 <= 16)
FORMATS = (*pack.GEMM_FORMATS, "w16g")
# convolutions also through mf_convp_* (no im2col): "w16p", "w8p", "w16pg" (mf_convp_w16_g<G>),
# and mf_conv_lean_* (im2col without the row cache): "w16l", "w8l"
CONVP_FORMATS = ("w16p", "w8p", "w16pg")


def packed_k(c) -> int:
    """The taps per output the packed weights hold (Kp, or K' of the pair order)."""
    if "p" in c["fmt"]:
        h, wd, ch, kh, kw = c["geom"][:5]
        return len(pack.conv_pair_order(kh, kw, ch))
    return pack.kpad(c["k"])


def entry(c) -> str:
    """The kernel a case calls: mf_<kind>_<fmt>, mf_convp_<fmt>, or a K-specialised entry."""
    if c["fmt"] in ("w16x2", "w16k8"):  # the general entry or the one of the sign-term mode
        mode, name = c["sf"] & 3, "mf_gemm2_w16" if c["fmt"] == "w16x2" else "mf_gemm1k8_w16"
        return f"{name}_s{mode}" if c.get("moded") and mode != 1 else name
    g = packed_k(c) // 4
    base = "w8" if c["fmt"].startswith("w8") else "w16"
    if c["fmt"].endswith("l"):
        return f"mf_conv_lean_{base}"
    fmt = f"{base}_g{g}" if "g" in c["fmt"] and g <= 16 else base
    return f"mf_{c['kind']}{'p' if 'p' in c['fmt'] else ''}_{fmt}"


def packed_weights(c):
    w = c["w"]
    if c["fmt"] == "w16x2":  # weights, bias and mf_rq in one int32 stream
        s = pack.pack_gemm2(w, c["bias"], c["rq"])
        return s, s.nbytes
    if c["fmt"] == "w16k8":
        s = pack.pack_gemm1k8(w, c["bias"], c["rq"])
        return s, s.nbytes
    if "p" in c["fmt"]:
        h, wd, ch, kh, kw = c["geom"][:5]
        w = pack.pair_rows(w, kh, kw, ch)
    return pack.pack_gemm_weights(w, "w8" if c["fmt"].startswith("w8") else "w16")


def all_cases(seed=0):
    rng = np.random.default_rng(seed)
    cases = []
    acts = ("none", "relu", "relu6")
    for fmt in FORMATS:
        # hand-picked tails, then random shapes
        for rows, k, o in ((1, 1, 1), (1, 4, 4), (3, 5, 6), (2, 8, 3), (7, 64, 12),
                           (5, 63, 13), (1, 64, 12), (4, 2, 9)):
            cases.append(gemm_case(rng, rows, k, o, fmt, acts[len(cases) % 3]))
        for _ in range(8):
            rows, k, o = (int(rng.integers(1, 10)), int(rng.integers(1, 90)),
                          int(rng.integers(1, 22)))
            cases.append(gemm_case(rng, rows, k, o, fmt, acts[int(rng.integers(0, 3))],
                                   int(rng.integers(0, 3)) * int(rng.integers(0, 7)),
                                   int(rng.integers(0, 2)) * int(rng.integers(0, 5))))
        # convolutions: first layers with 1..3 channels, KWS's 10x4 stride 2, 3x3, 1x1 strided
        for geo in ((12, 6, 1, 10, 4, 2, "SAME", 8), (9, 8, 3, 3, 3, 1, "SAME", 5),
                    (9, 7, 3, 3, 3, 2, "VALID", 6), (6, 6, 16, 3, 3, 1, "SAME", 7),
                    (7, 5, 4, 1, 1, 2, "VALID", 9), (5, 9, 2, 3, 2, 2, "SAME", 4),
                    (4, 4, 5, 4, 4, 3, "SAME", 3), (9, 8, 4, 3, 2, (1, 2), "SAME", 6),
                    (8, 7, 2, 2, 3, (3, 1), "VALID", 5)):
            h, wd, c, kh, kw, s, pad, o = geo
            cases.append(conv_case(rng, h, wd, c, kh, kw, s, pad, o, fmt,
                                   acts[int(rng.integers(0, 3))]))
        for _ in range(4):
            kh, kw, s = int(rng.integers(1, 5)), int(rng.integers(1, 5)), int(rng.integers(1, 4))
            h, wd = int(rng.integers(kh, 10)), int(rng.integers(kw, 10))
            cases.append(conv_case(rng, h, wd, int(rng.integers(1, 9)), kh, kw, s,
                                   ("SAME", "VALID")[int(rng.integers(0, 2))],
                                   int(rng.integers(1, 11)), fmt, acts[int(rng.integers(0, 3))]))
    # the K-specialised entries' fast path (clamp = the int8 range), with and without the sign
    # term: VWW's small-K 1x1 shapes, KWS's 64->64, K = 4G - 1..4G - 3, channel tails, gaps;
    # then first layers with 1-3 channels
    for i, (rows, k, o) in enumerate(((3, 8, 16), (4, 16, 8), (2, 32, 12), (3, 64, 9),
                                      (5, 27, 5), (2, 62, 4), (1, 1, 7), (6, 13, 3),
                                      (2, 44, 20))):
        for fused, post0 in ((False, True), (False, False), (True, True)):
            cases.append(gemm_case(rng, rows, k, o, "w16g", "relu" if fused else "none",
                                   i % 3, i % 2, fused=fused, post0=post0))
    for i, geo in enumerate(((12, 6, 1, 10, 4, 2, "SAME", 8), (9, 8, 3, 3, 3, 1, "SAME", 16),
                             (9, 7, 3, 3, 3, 2, "VALID", 6), (10, 9, 3, 3, 3, 2, "SAME", 8),
                             (7, 5, 4, 1, 1, 2, "VALID", 9))):
        h, wd, c, kh, kw, s, pad, o = geo
        for fused, post0 in ((False, True), (False, False), (True, True)):
            cases.append(conv_case(rng, h, wd, c, kh, kw, s, pad, o, "w16g",
                                   "relu" if fused else "none", fused=fused, post0=post0))
    # every format's general row (K beyond the unrolled entries) with the sign term from the
    # accumulator (no channel without a right shift: signfix 2 unless classic_sf)
    for fmt in FORMATS:
        for rows, k, o in ((3, 144, 8), (2, 70, 11), (4, 9, 6)):
            cases.append(gemm_case(rng, rows, k, o, fmt, "none", post0=False))
        cases.append(conv_case(rng, 6, 6, 16, 3, 3, 1, "SAME", 7, fmt, "none", post0=False))
    # "w16gu": the K-specialised entries given an mf_rq with pre != 0 (no MF_PRE0): the
    # general code must run
    for fused in (False, True):
        cases.append(gemm_case(rng, 3, 8, 16, "w16gu", "relu" if fused else "none", fused=fused))
        cases.append(conv_case(rng, 9, 8, 3, 3, 3, 1, "SAME", 16, "w16gu",
                               "relu" if fused else "none", fused=fused))
    # mf_gemm2_w16 (2 channels x 2 rows, O even, clamp = the int8 range): odd and even row
    # counts, K = 1..4G + 3 around the unrolled 8 groups (TBB entries 0..7), gaps, the three
    # sign terms (classic_sf: 1, the C body), VWW's and KWS's shapes
    for i, (rows, k, o) in enumerate(((1, 8, 16), (2, 8, 16), (3, 16, 32), (5, 32, 2),
                                      (4, 29, 6), (7, 64, 64), (2, 128, 4), (3, 131, 8),
                                      (6, 1, 2), (2, 3, 10), (9, 36, 4), (4, 60, 12),
                                      (3, 100, 2), (5, 256, 4), (2, 20, 14), (3, 124, 6))):
        for fused, post0 in ((False, True), (False, False), (True, True)):
            cases.append(dict(gemm_case(rng, rows, k, o, "w16x2", "relu" if fused else "none",
                                        i % 3 * (i % 4), i % 2 * 3, fused=fused, post0=post0),
                              moded=bool(rng.random() < 0.6)))
    # the asm's own widening: K % 8 == 0 on word-aligned rows (x_stride % 4 == 0), G even and
    # 1..20, odd and even row counts, y gaps
    for i, (rows, k, o) in enumerate(((4, 8, 4), (6, 16, 8), (7, 48, 6), (10, 32, 4),
                                      (5, 80, 2), (4, 160, 10), (2, 24, 2), (3, 40, 4))):
        cases.append(dict(gemm_case(rng, rows, k, o, "w16x2", ("relu", "none")[i % 2],
                                    4 * (i % 3), i % 3, fused=i % 2 == 0),
                          moded=bool(i % 4 < 2)))
    # mf_gemm1k8_w16 (K = 8, a row in registers): any O (entries of the 8-channel loop 0..7),
    # any row count, gaps, unaligned rows (x_stride odd), the three sign terms
    for i, (rows, o) in enumerate(((1, 1), (2, 16), (3, 3), (5, 2), (1, 7), (4, 12), (3, 5),
                                   (2, 9), (7, 16), (2, 6), (3, 4), (1, 8), (2, 23))):
        for fused, post0 in ((False, True), (False, False), (True, True)):
            cases.append(dict(gemm_case(rng, rows, 8, o, "w16k8", "relu" if fused else "none",
                                        i % 3, i % 2 * 2, fused=fused, post0=post0),
                              moded=bool(rng.random() < 0.6)))
    # mf_convp_*: every convolution case again through the pair layout, in each of its formats
    for c in [c for c in cases if c["kind"] == "conv"]:
        fmt = {"w16": "w16p", "w8": "w8p", "w16g": "w16pg", "w16gu": "w16pgu"}[c["fmt"]]
        cases.append(dict(c, fmt=fmt))
    # mf_conv_lean_*: the im2col convolution cases again without the row cache
    for c in [c for c in cases if c["kind"] == "conv" and c["fmt"] in ("w16", "w8")]:
        cases.append(dict(c, fmt=c["fmt"] + "l"))
    return cases


# ---- the C program ---------------------------------------------------------------------------
def c_array(ctype, name, values, align=False):
    vals = ",".join(str(int(v)) for v in np.asarray(values).reshape(-1))
    attr = " __attribute__((aligned(4)))" if align else ""
    return f"static const {ctype} {name}[]{attr} = {{{vals}}};\n"


def scratch_bytes(c) -> int:
    if c["fmt"] == "w16x2":
        return pack.gemm2_scratch_bytes(c["k"])
    if c["fmt"] == "w16k8":
        return 0
    if c["kind"] == "gemm":
        return pack.gemm_scratch_bytes(c["k"])
    h, wd, ch, kh, kw, sh, sw, pt, pl, oh, ow = c["geom"]
    if "p" in c["fmt"]:
        return pack.convp_scratch_bytes(kh, kw, ch, sw, ow)
    if c["fmt"].endswith("l"):
        return pack.conv_lean_scratch_bytes(c["k"])
    return pack.conv_scratch_bytes(kh, kw, ch, sw, ow)


# the C harness's byte check (outputs against the expected, the scratch past its documented
# need untouched) and main's frame around the calls; tests/test_nn_convrp.py uses them too
CHECK_MAIN = """
static int32_t check(int32_t id, const int8_t *y, const int8_t *e, int32_t n, int32_t need) {
    int32_t j, bad = 0, first = -1;
    for (j = 0; j < n; ++j) {
        if (y[j] != e[j]) { if (first < 0) first = j; ++bad; }
    }
    for (j = need; j < SCRATCH + 8; ++j) {
        if (scratch[j] != 0x1234) { bench_puts("scratch overrun\\n"); ++bad; break; }
    }
    if (bad) {
        bench_puts("case "); bench_put_i64(id); bench_puts(": "); bench_put_i64(bad);
        bench_puts(" bad, first "); bench_put_i64(first); bench_puts(" got ");
        bench_put_i64(y[first]); bench_puts(" want "); bench_put_i64(e[first]); bench_puts("\\n");
    }
    return bad != 0;
}

int main(void) {
    int32_t j, bad = 0;
"""
MAIN_END = ('    bench_puts(bad ? "FAIL " : "OK "); bench_put_i64(bad); bench_puts("\\n");\n'
            "    (void)j;\n    return 0;\n}\n")


def c_program(cases) -> str:
    scratch = (max(scratch_bytes(c) for c in cases) + 1) // 2
    out = ["#include <string.h>\n#include \"mcuforge_nn.h\"\n#include \"bench.h\"\n",
           f"#define SCRATCH {scratch}\n",
           "static int16_t scratch[SCRATCH + 8] __attribute__((aligned(4)));\n"]
    calls = []
    for i, c in enumerate(cases):
        packed, nbytes = packed_weights(c)
        assert nbytes == packed.nbytes
        wt = ("int8_t" if c["fmt"].startswith("w8") else
              "int32_t" if c["fmt"] in ("w16x2", "w16k8") else "int16_t")
        out.append(c_array("int8_t", f"x{i}", c["x"], align=True))  # rows with K % 4 == 0 aligned
        out.append(c_array(wt, f"w{i}", packed, align=True))
        if c["fmt"] not in ("w16x2", "w16k8"):  # (their streams hold them)
            out.append(c_array("int32_t", f"b{i}", c["bias"]))
            rq = ",".join("{%d,%d,%d,%d}" % tuple(int(v) for v in r) for r in c["rq"])
            out.append(f"static const mf_rq rq{i}[] = {{{rq}}};\n")
        out.append(c_array("int8_t", f"e{i}", c["want"]))
        out.append(f"static int8_t y{i}[{len(c['want'])}];\n")
        common = f"b{i}, rq{i}, {c['o']}, {c['lo']}, {c['hi']}, {c['sf']}, y{i}"
        if c["fmt"] in ("w16x2", "w16k8"):
            call = (f"{entry(c)}(x{i}, {c['rows']}, {c['xs']}, {c['k']}, w{i}, {c['o']}, "
                    f"{c['sf']}, y{i}, {c['ys']}, scratch)")
        elif c["kind"] == "gemm":
            call = (f"{entry(c)}(x{i}, {c['rows']}, {c['xs']}, {c['k']}, w{i}, {common}, "
                    f"{c['ys']}, scratch)")
        else:
            geom = ",".join(map(str, c["geom"]))
            out.append(f"static const mf_conv_geom g{i} = {{{geom}}};\n")
            call = f"{entry(c)}(x{i}, &g{i}, {c['x_zp']}, w{i}, {common}, scratch)"
        need = (scratch_bytes(c) + 1) // 2
        calls.append(f"    memset(y{i}, {SENTINEL}, sizeof y{i});\n"
                     f"    for (j = {need}; j < SCRATCH + 8; ++j) scratch[j] = 0x1234;\n"
                     f"    {call};\n"
                     f"    bad += check({i}, y{i}, e{i}, (int32_t)sizeof y{i}, {need});\n")
    out.append(CHECK_MAIN)
    out.extend(calls)
    out.append(MAIN_END)
    return "".join(out)


@pytest.fixture(scope="module")
def program(tmp_path_factory):
    d = tmp_path_factory.mktemp("gemm")
    cases = all_cases()
    src = d / "gemm_test.c"
    src.write_text(c_program(cases))
    return src, len(cases)


def check_build(program, target, opt, extra=()):
    src, n = program
    exe = harness.build(src, target, opt, src.parent, extra)
    out = harness.run(exe, target)
    assert out.strip().splitlines()[-1] == "OK 0", out


@pytest.mark.parametrize("opt", ["-O0", "-O2"])
def test_host_portable(program, opt):
    san = ["-fsanitize=address,undefined", "-fno-sanitize-recover=all"]
    check_build(program, "host", opt, san if opt == "-O2" else ())


needs_arm = pytest.mark.usefixtures("arm_tools")


@pytest.fixture
def arm_tools():
    """The Arm cross compiler and QEMU: skipped locally without them, a failure under CI."""
    require_tools("arm-none-eabi-gcc", "qemu-system-arm")


@needs_arm
@pytest.mark.parametrize("opt", ["-O0", "-O2", "-Os", "-O2 -fno-schedule-insns", "-O3",
                                 "-O2 -fno-omit-frame-pointer"])  # r7: gcc's frame pointer
def test_m4_dsp(program, opt):
    check_build(program, "m4", opt)


@needs_arm
def test_m4_dsp_intrinsics_only(program):
    """The DSP intrinsics bodies optimised (what -O0 builds), without the asm routines."""
    check_build(program, "m4", "-O2", ["-DMF_GEMM_ASM=0"])


@needs_arm
@pytest.mark.parametrize("target", ["m4-nodsp", "m3"])
def test_arm_portable(program, target):
    check_build(program, target, "-O2")


def test_packing_layout():
    """pack_gemm_weights puts w[o][k] where the layout comment of mcuforge_nn.h says."""
    rng = np.random.default_rng(3)
    o, k = 6, 7
    w = rng.integers(-127, 128, (o, k))
    kp = pack.kpad(k)
    for fmt, lanes in (("w16", (0, 2, 1, 3)), ("w8", (0, 1, 2, 3))):
        packed, nbytes = pack.pack_gemm_weights(w, fmt)
        assert nbytes == 8 * kp * (2 if fmt == "w16" else 1)  # 2 blocks of 4 channels
        for oo in range(8):
            for kk in range(kp):
                idx = ((oo // 4) * (kp // 4) + kk // 4) * 16 + (oo % 4) * 4 + lanes.index(kk % 4)
                assert packed[idx] == (w[oo, kk] if oo < o and kk < k else 0)
    assert pack.gemm_scratch_bytes(7) == 16 and pack.gemm_scratch_bytes(64) == 128
    # KWS's first conv: Kp = 40, row cache 10 rows x (4 * 2 + 4) taps of 1 channel
    assert pack.conv_scratch_bytes(10, 4, 1, 2, 5) == 3 * 40 + 10 * 12
    for o, k in ((6, 7), (64, 64), (12, 40)):
        for fmt in pack.GEMM_FORMATS:
            assert pack.gemm_flash_bytes(o, k, fmt) == pack.pack_gemm_weights(w[:1].repeat(o, 0)[
                :, :1].repeat(k, 1), fmt)[1]


def test_pair_stream_layouts():
    """pack_gemm2 / pack_gemm1k8 put bias, weights and mf_rq where mcuforge_nn.h's comments
    say: word of taps (a, b) = a's int16 in the low half, b's in the high half."""
    rng = np.random.default_rng(4)

    def word(a, b):
        return int(np.int32(np.uint32((int(a) & 0xFFFF) | ((int(b) & 0xFFFF) << 16))))
    o, k = 6, 13
    g = pack.kpad(k) // 4
    w = rng.integers(-3000, 3000, (o, k))
    wp = np.zeros((o, 4 * g), np.int64)
    wp[:, :k] = w
    bias = rng.integers(-10**6, 10**6, o)
    rq = np.stack([rng.integers(2**30, 2**31, o), rng.integers(-999, 999, o), np.zeros(o, int),
                   rng.integers(0, 31, o)], 1)
    s = pack.pack_gemm2(w, bias, rq)
    assert s.dtype == np.int32 and s.size == o // 2 * (10 + 4 * g) == pack.gemm2_words(o, k)
    for p in range(o // 2):
        rec = s[p * (10 + 4 * g):(p + 1) * (10 + 4 * g)].tolist()
        assert rec[:4] == [bias[2 * p], bias[2 * p + 1], bias[2 * p], bias[2 * p + 1]]
        for gg in range(g):
            for c in range(2):
                t = wp[2 * p + c, 4 * gg:4 * gg + 4]
                assert rec[4 + 4 * gg + 2 * c:6 + 4 * gg + 2 * c] == [word(t[0], t[2]),
                                                                      word(t[1], t[3])]
        for c in range(2):
            r = rq[2 * p + c]
            assert rec[4 + 4 * g + 3 * c:7 + 4 * g + 3 * c] == [r[0], r[1], r[3]]
    w8 = rng.integers(-3000, 3000, (3, 8))
    s = pack.pack_gemm1k8(w8, bias[:3], rq[:3])
    for c in range(3):
        assert s[8 * c:8 * c + 8].tolist() == [
            bias[c], word(w8[c, 0], w8[c, 2]), word(w8[c, 1], w8[c, 3]),
            word(w8[c, 4], w8[c, 6]), word(w8[c, 5], w8[c, 7]), rq[c, 0], rq[c, 1], rq[c, 3]]
    assert pack.gemm2_scratch_bytes(13) == 4 * 16  # two widened rows
    for bad in ((w[:5], bias[:5], rq[:5]), (w, bias, np.where(np.arange(4) == 2, 1, rq))):
        with pytest.raises(ValueError):
            pack.pack_gemm2(*bad)


def test_conv_geom_matches_tflm_padding():
    """pack.conv_geom against this file's TFLM geometry (and KWS's first layer by hand: 49x10,
    10x4 stride 2 SAME -> 25x5, total padding 9 rows / 2 columns, top 4, left 1)."""
    assert pack.conv_geom(49, 10, 1, 10, 4, 2, 2, "SAME") == (49, 10, 1, 10, 4, 2, 2, 4, 1, 25, 5)
    rng = np.random.default_rng(5)
    for _ in range(200):
        kh, kw = int(rng.integers(1, 6)), int(rng.integers(1, 6))
        h, wd = int(rng.integers(kh, 40)), int(rng.integers(kw, 40))
        sh, sw = int(rng.integers(1, 4)), int(rng.integers(1, 4))
        pad = ("SAME", "VALID")[int(rng.integers(0, 2))]
        oh, ow, pt, pl = conv_geometry(h, wd, kh, kw, (sh, sw), pad)
        assert pack.conv_geom(h, wd, 3, kh, kw, sh, sw, pad) == (h, wd, 3, kh, kw, sh, sw, pt, pl,
                                                                 oh, ow)


# ---- against tflite-micro itself: real CONV_2D layer shapes ------------------------------------
TFLM_LAYERS = [  # (H, W, C, KH, KW, stride, padding, O, fused activation)
    (49, 10, 1, 10, 4, 2, "SAME", 64, "RELU"),   # KWS DS-CNN's first convolution
    (8, 8, 16, 3, 3, 1, "SAME", 16, "RELU"),     # a ResNet-8 3x3 (on a smaller image)
    (9, 9, 3, 3, 3, 2, "VALID", 8, "NONE"),      # a first layer on RGB, no activation
]


def tflm_conv_case(rng, layer, fmt):
    """A CONV_2D model built with tests/tfl_build.py, run in tflite-micro; the kernel's case
    with TFLM's output as the expected bytes (and the numpy model checked against it too)."""
    import tflite
    from tflite_micro.python.tflite_micro import runtime

    from tests.tfl_build import Model
    h, wd, c, kh, kw, stride, padding, o, act = layer
    sx, zx = 0.05, int(rng.integers(-20, 20))
    sw = rng.uniform(0.002, 0.01, o).astype(np.float32)
    sy = np.float32(0.05 * 0.006 * math.sqrt(kh * kw * c) * 40)
    zy = -128 if act == "RELU" else int(rng.integers(-10, 10))
    w = rng.integers(-127, 128, (o, kh, kw, c)).astype(np.int8)
    bias = rng.integers(-2000, 2000, o).astype(np.int32)
    x = rng.integers(-128, 128, (1, h, wd, c)).astype(np.int8)
    m = Model()
    xi = m.tensor("x", x.shape, "int8", scale=sx, zero_point=zx)
    wi = m.tensor("w", w.shape, "int8", data=w, scale=sw.tolist(), zero_point=[0] * o, axis=0)
    bi = m.tensor("b", (o,), "int32", data=bias, scale=(np.float32(sx) * sw).tolist(),
                  zero_point=[0] * o)
    oh, ow, pt, pl = conv_geometry(h, wd, kh, kw, stride, padding)
    yi = m.tensor("y", (1, oh, ow, o), "int8", scale=float(sy), zero_point=zy)
    m.op("CONV_2D", [xi, wi, bi], [yi], "Conv2DOptions",
         Padding=getattr(tflite.Padding, padding), StrideW=stride, StrideH=stride,
         FusedActivationFunction=getattr(tflite.ActivationFunctionType, act),
         DilationWFactor=1, DilationHFactor=1)
    m.io([xi], [yi])
    it = runtime.Interpreter.from_bytes(m.build(), arena_size=1 << 20)
    it.set_input(x, 0)
    it.invoke()
    want = np.array(it.get_output(0)).reshape(-1)
    # TFLM's multipliers: float32 scales, effective scale in double
    ms = [quantize_multiplier(float(np.float64(np.float32(sx)) * float(sw[i]) / float(sy)))
          for i in range(o)]
    lo, hi = (max(-128, zy), 127) if act == "RELU" else (-128, 127)
    L = dict(w=w.reshape(o, -1).astype(np.int64), bias=bias, x_zp=zx, y_zp=zy,
             mults=[a for a, _ in ms], shifts=[b for _, b in ms], lo=lo, hi=hi)
    mine = tflm_conv(x[0], w, bias, zx, stride, padding, L["mults"], L["shifts"], zy, lo, hi)
    assert (mine.reshape(-1) == want).all()  # the numpy model of this file agrees with TFLM
    assert len(set(want.tolist())) > 20  # outputs spread over the range, not all clamped
    wk, folded, rq, sf = kernel_args(L, L["w"], fmt)
    return dict(kind="conv", fmt=fmt, x=x.reshape(-1), geom=(h, wd, c, kh, kw, stride, stride,
                pt, pl, oh, ow), x_zp=zx, k=kh * kw * c, o=o, w=wk, bias=folded, rq=rq,
                sf=sf, lo=lo, hi=hi, want=want)


@pytest.mark.parametrize("target", ["host", "m4"])
def test_against_tflite_micro(tmp_path, target):
    require_tflm()
    if target == "m4":
        require_tools("arm-none-eabi-gcc", "qemu-system-arm")
    rng = np.random.default_rng(11)
    cases = [tflm_conv_case(rng, layer, fmt) for layer in TFLM_LAYERS
             for fmt in (*pack.GEMM_FORMATS, "w16g", *CONVP_FORMATS)]
    src = tmp_path / "tflm_conv.c"
    src.write_text(c_program(cases))
    check_build((src, len(cases)), target, "-O2")


def test_sign_term_from_the_accumulator():
    """signfix 2 (mf_rq_clamp's MF_MODE_SFA): (h + add + (acc >> 31)) >> post equals TFLM's
    MultiplyByQuantizedMultiplier + zero point for post >= 1, including acc = -1 with the
    multiplier 2^30 (scale a power of two), where h = 0 while acc < 0; with post = 0 it does
    not (which is why pack.signfix_mode requires post >= 1)."""
    rng = np.random.default_rng(8)
    acc = np.concatenate([np.arange(-3000, 3000), rng.integers(-2**22, 2**22, 20000)])
    for real in (2.0**-12, 0.37 * 2.0**-9, 2.0**-3, 0.7, 0.9):
        mult, shift = quantize_multiplier(real)
        zp = int(rng.integers(-100, 100))
        rq = pack.requant_params([mult], [shift], zp, [2**23])[0].astype(np.int64)
        m, add, pre, post = rq.tolist()
        h = ((acc << pre) * m + 2**31) >> 32
        fast = (h + add + np.where(acc < 0, -1, 0)) >> post
        want = zp + mbqm(acc, mult, shift)
        if mult == 2**30:  # acc = -1 gives h = 0: the one case where the two signs differ
            assert ((h == 0) & (acc < 0)).any()
        if post >= 1:
            np.testing.assert_array_equal(fast, want)
        else:
            assert (fast != want).any()
    assert pack.signfix_mode(-128, -128, [[1, 0, 1, 3]]) == 0
    assert pack.signfix_mode(5, -128, [[1, 0, 1, 3], [1, 0, 1, 1]]) == 2
    assert pack.signfix_mode(5, -128, [[1, 0, 1, 3], [1, 0, 1, 0]]) == 1
    assert pack.signfix_mode(5, -128, [[1, 0, 1, 3], [0, 7, 1, 0]], [False, True]) == 2


def test_conv_pair_order():
    """pack.conv_pair_order: every original tap exactly once, the rest -1; by hand for RGB 3x3
    (segment 9 taps, n = 5 words per kernel row, 15 words -> 8 groups): group 0 = words 0
    (row 0, taps 0, 1) and 1 (row 1, taps 9, 10) in lane order (4g, 4g+1, 4g+2, 4g+3) = (word 0
    low, word 1 low, word 0 high, word 1 high)."""
    idx = pack.conv_pair_order(3, 3, 3)
    assert len(idx) == 32 and idx[:8].tolist() == [0, 9, 1, 10, 18, 2, 19, 3]
    assert idx[24:].tolist() == [8, 17, -1, -1, 26, -1, -1, -1]
    for kh, kw, c in ((3, 3, 3), (10, 4, 1), (3, 3, 16), (2, 3, 5), (1, 2, 1), (4, 1, 3), (2, 2, 8)):
        idx = pack.conv_pair_order(kh, kw, c)
        assert sorted(idx[idx >= 0].tolist()) == list(range(kh * kw * c))
        assert len(idx) % 4 == 0
    assert pack.convp_scratch_bytes(3, 3, 3, 1, 32) == 4 * 52 * 3 * 2 + 102 + 8
    # in_c % 4 == 0: groups of 4 consecutive taps, (group along the row piece, kernel row)
    idx = pack.conv_pair_order(3, 3, 16)
    assert len(idx) == 144 and idx[:16].tolist() == [*range(4), *range(48, 52), *range(96, 100),
                                                     *range(4, 8)]
    assert pack.convp_scratch_bytes(3, 3, 16, 1, 32) == 2 * 34 * 16 * 3 + 34 * 16 + 8
