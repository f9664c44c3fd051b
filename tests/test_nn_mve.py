"""The Helium (MVE) GEMM micro-kernels of runtime_c/mcuforge_mve.h (mf_mve_gemm: 1x1
convolutions and fully connected layers over rows; mf_mve_conv: im2col convolutions) with
codegen_c/pack_mve.py's stream, byte for byte against the numpy model of TFLM's int8
reference kernels of tests/test_nn_gemm.py (input zero point subtracted, bias added,
SaturatingRoundingDoublingHighMul + RoundingDivideByPOT, output zero point, clamp).

Builds: Cortex-M55 on QEMU mps3-an547 with the MVE body at -O0 (intrinsics) / -O2 / -Os / -O3
(asm K loop), the intrinsics body optimised (MF_MVE_ASM=0), the portable body on the M55
(MF_USE_MVE=0), and host gcc with ASan/UBSan (portable). Shapes with tails: odd row counts,
O not a multiple of 4, K not a multiple of 16 and K < 16, gaps between rows; random zero
points; relu / relu6-like / no clamps; power-of-two scales (rounding ties); channels with
left shifts (shift > 0: pre > 1) and right shifts."""
from __future__ import annotations

import numpy as np
import pytest

from mcuforge.codegen_c import pack, pack_mve
from tests.nn_bench import harness
from tests.test_nn_gemm import (SENTINEL, c_array, conv_geometry, random_layer, tflm_conv,
                                tflm_outputs)
from conftest import require_tools


def layer_args(L, w_rows):
    """What the MVE schedule passes: folded bias, mf_rq rows, the sign term (pack.py)."""
    folded = pack.fold_bias(L["bias"], w_rows, L["x_zp"])
    rq = pack.requant_params(L["mults"], L["shifts"], L["y_zp"], pack.acc_bounds(folded, w_rows))
    assert folded is not None and rq is not None
    return pack_mve.pack_mve(w_rows, folded, rq, pack.needs_signfix(L["y_zp"], L["lo"]))


def gemm_case(rng, rows, k, o, act, x_gap=0, y_gap=0, fused=False, post0=True):
    L = random_layer(rng, o, k, act, fused, post0)
    xs, ys = k + x_gap, o + y_gap
    x = rng.integers(-128, 128, rows * xs).astype(np.int8)
    x_rows = np.stack([x[r * xs:r * xs + k] for r in range(rows)])
    y = tflm_outputs(x_rows, L["w"], L["bias"], L["x_zp"], L["mults"], L["shifts"], L["y_zp"],
                     L["lo"], L["hi"])
    want = np.full(rows * ys - y_gap, SENTINEL, np.int8)
    for r in range(rows):
        want[r * ys:r * ys + o] = y[r]
    stream, flags = layer_args(L, L["w"])
    return dict(kind="gemm", x=x, rows=rows, xs=xs, k=k, o=o, ys=ys, pk=stream, flags=flags,
                lo=L["lo"], hi=L["hi"], want=want)


def conv_case(rng, h, wd, c, kh, kw, stride, padding, o, act, fused=False, post0=True):
    L = random_layer(rng, o, kh * kw * c, act, fused, post0)
    x = rng.integers(-128, 128, (h, wd, c))
    y = tflm_conv(x, L["w"].reshape(o, kh, kw, c), L["bias"], L["x_zp"], stride, padding,
                  L["mults"], L["shifts"], L["y_zp"], L["lo"], L["hi"])
    oh, ow, pt, pl = conv_geometry(h, wd, kh, kw, stride, padding)
    sh, sw = (stride, stride) if np.isscalar(stride) else stride
    stream, flags = layer_args(L, L["w"])
    return dict(kind="conv", x=x.reshape(-1).astype(np.int8), k=kh * kw * c, o=o,
                geom=(h, wd, c, kh, kw, sh, sw, pt, pl, oh, ow), x_zp=L["x_zp"], pk=stream,
                flags=flags, lo=L["lo"], hi=L["hi"], want=y.reshape(-1))


def all_cases(seed=0):
    rng = np.random.default_rng(seed)
    acts = ("none", "relu", "relu6")
    cases = []
    # hand-picked: K < 16, = 16, 17, KWS's 64 -> 64, VWW's K = 8, AD's single rows, tails
    for i, (rows, k, o) in enumerate(((1, 1, 1), (3, 5, 6), (2, 8, 16), (4, 16, 8),
                                      (5, 17, 5), (7, 64, 64), (5, 63, 13), (1, 640, 13),
                                      (1, 128, 8), (2, 31, 3), (3, 144, 10), (1, 33, 2))):
        for fused, post0 in ((False, True), (True, False)):
            cases.append(gemm_case(rng, rows, k, o, acts[i % 3], i % 3, i % 2 * 3,
                                   fused=fused, post0=post0))
    for _ in range(10):
        rows, k, o = (int(rng.integers(1, 9)), int(rng.integers(1, 100)),
                      int(rng.integers(1, 22)))
        cases.append(gemm_case(rng, rows, k, o, acts[int(rng.integers(0, 3))],
                               int(rng.integers(0, 3)) * int(rng.integers(0, 7)),
                               int(rng.integers(0, 2)) * int(rng.integers(0, 5))))
    # mf_mve_rows16 / rows32 (K <= 32, flags 0, hi 127, >= 2 rows, full blocks, then the rest):
    # VWW's K = 8 -> 16 and 16 -> 32, K = 1 / 3 / 15, O not a multiple of 4, gaps, relu with
    # y_zp above -128 (its VMAX) and the fused int8 range
    # (the rows whose 16-byte load would pass the input's end loaded under a predicate: 40 x 3
    # and 20 x 1 run both loops)
    for i, (rows, k, o) in enumerate(((9, 8, 16), (6, 16, 32), (5, 1, 4), (4, 3, 7),
                                      (3, 15, 9), (2, 16, 5), (11, 8, 12), (7, 13, 6),
                                      (40, 3, 8), (20, 1, 4),
                                      # mf_mve_rows32: VWW's K = 32, 17..31 (tail rows)
                                      (7, 32, 16), (6, 17, 8), (9, 24, 7), (12, 31, 4))):
        for act, fused in (("relu", False), ("none", True), ("relu", False)):
            cases.append(gemm_case(rng, rows, k, o, act, i % 3 * 5, i % 2 * 3, fused=fused,
                                   post0=False))
    # convolutions: KWS's 10x4 s2 1 channel, 3x3 of 3 channels s1/s2 (ResNet-8's and VWW's
    # first), 3x3 16 channels, strided 1x1, odd kernels and strides, both paddings
    for geo in ((12, 6, 1, 10, 4, 2, "SAME", 8), (9, 8, 3, 3, 3, 1, "SAME", 16),
                (9, 7, 3, 3, 3, 2, "VALID", 6), (10, 9, 3, 3, 3, 2, "SAME", 8),
                (6, 6, 16, 3, 3, 1, "SAME", 7), (7, 5, 4, 1, 1, 2, "VALID", 9),
                (5, 9, 2, 3, 2, 2, "SAME", 4), (4, 4, 5, 4, 4, 3, "SAME", 3),
                (9, 8, 4, 3, 2, (1, 2), "SAME", 6), (8, 7, 2, 2, 3, (3, 1), "VALID", 5),
                (3, 3, 1, 5, 5, 1, "SAME", 2),
                # kernel rows of 32 / 96 bytes (mf_mve_patch16's 16-byte row copies)
                (8, 8, 16, 2, 2, 2, "VALID", 5), (9, 9, 32, 3, 3, 2, "SAME", 4)):
        h, wd, c, kh, kw, s, pad, o = geo
        for fused, post0 in ((False, True), (True, False)):
            cases.append(conv_case(rng, h, wd, c, kh, kw, s, pad, o,
                                   acts[int(rng.integers(0, 3))], fused, post0))
    for _ in range(5):
        kh, kw, s = int(rng.integers(1, 5)), int(rng.integers(1, 5)), int(rng.integers(1, 4))
        h, wd = int(rng.integers(kh, 10)), int(rng.integers(kw, 10))
        cases.append(conv_case(rng, h, wd, int(rng.integers(1, 9)), kh, kw, s,
                               ("SAME", "VALID")[int(rng.integers(0, 2))],
                               int(rng.integers(1, 11)), acts[int(rng.integers(0, 3))]))
    return cases


def c_program(cases) -> str:
    scratch = max([2 * c["k"] for c in cases if c["kind"] == "conv"] + [1])
    out = ["#include <string.h>\n#include \"mcuforge_mve.h\"\n#include \"bench.h\"\n",
           f"#define SCRATCH {scratch}\n", "static int8_t scratch[SCRATCH + 32];\n"]
    calls = []
    for i, c in enumerate(cases):
        out.append(c_array("int8_t", f"x{i}", c["x"]))
        out.append(c_array("int32_t", f"w{i}", c["pk"], align=True))
        out.append(c_array("int8_t", f"e{i}", c["want"]))
        out.append(f"static int8_t y{i}[{len(c['want'])}];\n")
        tail = f"w{i}, {c['o']}, {c['lo']}, {c['hi']}, {c['flags']}, y{i}"
        # every other case through the entry of its flags (what the schedule calls)
        suffix = f"_f{c['flags']}" if i % 2 else ""
        if c["kind"] == "gemm":
            # mf_mve_gemm_k32 where the schedule calls it (K <= 32, flags 0, hi 127), and its
            # fallback (mf_mve_gemm) on every third other case
            if (c["k"] <= 32 and c["flags"] == 0 and c["hi"] == 127) or i % 3 == 2:
                suffix = "_k32"
            call = f"mf_mve_gemm{suffix}(x{i}, {c['rows']}, {c['xs']}, {c['k']}, {tail}, {c['ys']})"
            need = 0
        else:
            out.append(f"static const mf_conv_geom g{i} = {{{','.join(map(str, c['geom']))}}};\n")
            call = f"mf_mve_conv{suffix}(x{i}, &g{i}, {c['x_zp']}, {tail}, scratch)"
            need = 2 * c["k"]
        calls.append(f"    memset(y{i}, {SENTINEL}, sizeof y{i});\n"
                     f"    memset(scratch + {need}, 0x5a, SCRATCH + 32 - {need});\n"
                     f"    {call};\n"
                     f"    bad += check({i}, y{i}, e{i}, (int32_t)sizeof y{i}, {need});\n")
    out.append("""
static int32_t check(int32_t id, const int8_t *y, const int8_t *e, int32_t n, int32_t need) {
    int32_t j, bad = 0, first = -1;
    for (j = 0; j < n; ++j) {
        if (y[j] != e[j]) { if (first < 0) first = j; ++bad; }
    }
    for (j = need; j < SCRATCH + 32; ++j) {
        if (scratch[j] != 0x5a) { bench_puts("scratch overrun\\n"); ++bad; break; }
    }
    if (bad) {
        bench_puts("case "); bench_put_i64(id); bench_puts(": "); bench_put_i64(bad);
        bench_puts(" bad, first "); bench_put_i64(first); bench_puts(" got ");
        bench_put_i64(y[first]); bench_puts(" want "); bench_put_i64(e[first]); bench_puts("\\n");
    }
    return bad != 0;
}

/* noinline: main itself runs no vector instruction before startup.c enabled the MVE */
static __attribute__((noinline)) int32_t run_all(void) {
    int32_t bad = 0;
""")
    out.extend(calls)
    out.append("    return bad;\n}\n\nint main(void) {\n    int32_t bad = run_all();\n"
               '    bench_puts(bad ? "FAIL " : "OK "); bench_put_i64(bad); bench_puts("\\n");\n'
               "    return 0;\n}\n")
    return "".join(out)


@pytest.fixture(scope="module")
def program(tmp_path_factory):
    d = tmp_path_factory.mktemp("mve")
    src = d / "mve_test.c"
    src.write_text(c_program(all_cases()))
    return src


def check_build(src, target, opt, extra=()):
    exe = harness.build(src, target, opt, src.parent, extra)
    out = harness.run(exe, target)
    assert out.strip().splitlines()[-1] == "OK 0", out


@pytest.mark.parametrize("opt", ["-O0", "-O2"])
def test_host_portable(program, opt):
    san = ["-fsanitize=address,undefined", "-fno-sanitize-recover=all"]
    check_build(program, "host", opt, san)


@pytest.fixture
def arm_tools():
    require_tools("arm-none-eabi-gcc", "qemu-system-arm")


@pytest.mark.usefixtures("arm_tools")
@pytest.mark.parametrize("opt,extra", [("-O0", ()), ("-O2", ()), ("-Os", ()), ("-O3", ()),
                                       ("-O2 -fno-omit-frame-pointer", ()),
                                       ("-Os -fno-omit-frame-pointer", ()),
                                       ("-O3 -fno-omit-frame-pointer", ()),
                                       ("-O2", ("-DMF_MVE_ASM=0",)),
                                       ("-O2", ("-DMF_USE_MVE=0",))])
def test_m55(program, opt, extra):
    check_build(program, "m55", opt, extra)


def test_stream_layout():
    """pack_mve puts each number where mcuforge_mve.h's layout comment says, and unpack_mve
    (the evaluator's reader) inverts it."""
    rng = np.random.default_rng(5)
    o, k = 6, 19
    w = rng.integers(-127, 128, (o, k))
    bias = rng.integers(-1000, 1000, o)
    rq = np.stack([rng.integers(2**30, 2**31, o), rng.integers(-99, 99, o),
                   rng.integers(1, 4, o), rng.integers(0, 3, o)], 1)
    s, flags = pack_mve.pack_mve(w, bias, rq, 1)
    bw = 24 + 16 * 2
    assert s.size == 2 * bw
    raw = s.view(np.uint8).view(np.int8)
    for ch in range(o):
        b, j = divmod(ch, 4)
        blk = s[b * bw:(b + 1) * bw]
        assert blk[j] == bias[ch]
        for tap in range(32):
            want = w[ch, tap] if tap < k else 0
            assert raw[4 * (b * bw + 4) + (tap // 16) * 64 + j * 16 + tap % 16] == want
        p = blk[4 + 32:]
        assert (p[j], p[4 + j], p[8 + j], p[12 + j]) == (rq[ch, 0], rq[ch, 1], rq[ch, 2] - 1,
                                                         -rq[ch, 3])
        assert p[16 + j] == (-1 if rq[ch, 3] > 0 else 0)
    assert flags == (pack_mve.SIGN if (rq[:, 3] > 0).any() else 0) | (
        pack_mve.SHL if (rq[:, 2] > 1).any() else 0)
    w2, pad, b2, rq2, _ = pack_mve.unpack_mve(s, o, k)
    assert (w2 == w).all() and not pad.any() and (b2 == bias).all() and (rq2 == rq).all()
