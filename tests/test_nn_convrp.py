"""The row-paired convolution of runtime_c/mcuforge_nn.h (mf_convrp_w16_n<NW>; for odd
stride_w * in_c mf_convrp2_w16_n<NW>; the suffix _x8 for O a multiple of 8: first layers with
few input channels, no im2col) with codegen_c/pack.py's table (pack_convrp), byte for byte
against the numpy model of TFLM's int8 convolution in tests/test_nn_gemm.py (input zero point
subtracted, MultiplyByQuantizedMultiplier as SRDHM + RDBPOT, output zero point, clamp).

Shapes: VWW's first layer (3x3 stride 2 on RGB), KWS's (10x4 stride 2 on one channel) and
ResNet-8's (3x3 stride 1 on RGB) on small images, then random kernels (k_h 1-5: odd and even
numbers of kernel rows), odd and even stride_w * in_c, SAME / VALID padding (left padding of
an odd element count too), stride_h 1-3, 4-16 output channels, rows narrower and wider than
the widening's steps, odd and even step counts, NW = 1, 2, 4, 5 (every first-chunk and tail
form); the sign term from the accumulator (signfix 2) and none (fused ReLU, zero point -128).
Builds: host gcc (portable body, ASan/UBSan), Cortex-M4 DSP at -O0 and -O2 -DMF_GEMM_ASM=0
(intrinsics + C rows), -O2, -Os, -O3 (asm), and the portable body on the M4 and the M3. Each
case runs through its entry, the entry for the other O % 8 form, one unrolled for another NW
and the other stride parity's (the last two compute the same in C).
"""
from __future__ import annotations

import numpy as np
import pytest

from mcuforge.codegen_c import pack
from conftest import require_tools
from tests.nn_bench import harness
from tests.test_nn_gemm import (CHECK_MAIN, MAIN_END, c_array, conv_geometry, random_layer,
                                 tflm_conv)

SENTINEL = 0x55


def convrp_case(rng, h, wd, c, kh, kw, stride, padding, o, fused):
    """One layer: input, geometry, packed table, expected output (the numpy TFLM model)."""
    while True:  # a layer these kernels take: int8-range clamp, signfix 0 or 2 (a small K can
        # draw a channel without a right shift, which would need the classic sign term)
        L = random_layer(rng, o, kh * kw * c, "relu" if fused else "none", fused=fused,
                         post0=fused)
        folded = pack.fold_bias(L["bias"], L["w"], L["x_zp"])
        rq = pack.requant_params(L["mults"], L["shifts"], L["y_zp"],
                                 pack.acc_bounds(folded, L["w"]))
        sf = pack.signfix_mode(L["y_zp"], -128, rq)
        f = pack.fold_pre(L["w"], folded, rq)
        if f is not None and sf != 1:
            break
    x = rng.integers(-128, 128, (h, wd, c))
    sh, sw = (stride, stride) if np.isscalar(stride) else stride
    y = tflm_conv(x, L["w"].reshape(o, kh, kw, c), L["bias"], L["x_zp"], (sh, sw), padding,
                  L["mults"], L["shifts"], L["y_zp"], -128, 127)
    oh, ow, pt, pl = conv_geometry(h, wd, kh, kw, (sh, sw), padding)
    w, b, rq0 = f
    return dict(x=x.reshape(-1).astype(np.int8), geom=(h, wd, c, kh, kw, sh, sw, pt, pl, oh, ow),
                x_zp=L["x_zp"], o=o, pk=pack.pack_convrp(w, b, rq0, kh, kw, c, sw),
                sf=sf | pack.PRE0, nw=pack.convrp_words(kh, kw, c), want=y.reshape(-1))


def all_cases(seed=0):
    rng = np.random.default_rng(seed)
    out = []
    for geo in ((12, 14, 3, 3, 3, 2, "SAME", 8),     # VWW's first layer, smaller
                (11, 9, 3, 3, 3, 2, "VALID", 8),
                (14, 10, 1, 10, 4, 2, "SAME", 12),    # KWS's first (left padding 1 element)
                (9, 8, 2, 3, 3, 1, "SAME", 4),        # stride 1, 2 channels: step 2
                (7, 13, 4, 2, 2, 1, "VALID", 8),      # even k_h: pairs only
                (8, 9, 6, 3, 1, (2, 1), "SAME", 4),   # k_w 1
                (5, 5, 1, 1, 4, 2, "SAME", 16),       # k_h 1: one single row
                (3, 3, 3, 3, 3, 2, "SAME", 4),        # a row narrower than one widening step
                (6, 7, 3, 5, 3, (3, 2), "SAME", 8),   # odd k_h 5
                # odd stride_w * in_c: two widened copies (mf_convrp2_*)
                (10, 11, 3, 3, 3, 1, "SAME", 16),     # ResNet-8's first layer, smaller
                (9, 10, 3, 3, 3, 1, "SAME", 4),       # an even output width
                (13, 7, 1, 10, 4, 1, "VALID", 8),     # one channel, stride 1
                (7, 12, 3, 2, 2, (2, 3), "SAME", 4),  # stride_w 3 (step 9)
                (6, 9, 1, 3, 3, 1, "SAME", 8),        # left padding of one element
                (5, 7, 3, 3, 3, 1, "VALID", 4),       # an odd number of widening steps
                (7, 8, 3, 3, 3, 2, "VALID", 8),       # the same for an even step
                # NW = 1, 2 (the first chunk is the tail), 4, 5 (three words and a tail)
                (5, 6, 2, 1, 1, 2, "SAME", 4), (6, 9, 1, 1, 4, 2, "VALID", 8),
                (4, 12, 1, 1, 7, 2, "VALID", 4), (5, 11, 1, 1, 9, 2, "SAME", 4)):
        h, wd, c, kh, kw, s, pad, o = geo
        for fused in (False, True):
            out.append(convrp_case(rng, h, wd, c, kh, kw, s, pad, o, fused))
    while len(out) < 40:
        kh, kw = int(rng.integers(1, 6)), int(rng.integers(1, 5))
        c = int(rng.integers(1, 5))
        sw = int(rng.integers(1, 4))
        if pack.convrp_words(kh, kw, c) > pack.MAX_CONVRP_WORDS:
            continue
        h, wd = int(rng.integers(kh, kh + 8)), int(rng.integers(kw, kw + 12))
        out.append(convrp_case(rng, h, wd, c, kh, kw, (int(rng.integers(1, 4)), sw),
                               ("SAME", "VALID")[int(rng.integers(0, 2))],
                               4 * int(rng.integers(1, 5)), bool(rng.integers(0, 2))))
    return out


def c_program(cases) -> str:
    scratch = max(pack.convrp_scratch_bytes(*c["geom"][3:5], c["geom"][2], c["geom"][6],
                                            c["geom"][10], c["geom"][1]) for c in cases)
    out = ["#include <string.h>\n#include \"mcuforge_nn.h\"\n#include \"bench.h\"\n",
           f"#define SCRATCH {(scratch + 1) // 2}\n",
           "static int16_t scratch[SCRATCH + 8] __attribute__((aligned(4)));\n"]
    calls = []
    for i, c in enumerate(cases):
        out.append(c_array("int8_t", f"x{i}", c["x"]))
        out.append(c_array("int32_t", f"p{i}", c["pk"], align=True))
        out.append(c_array("int8_t", f"e{i}", c["want"]))
        out.append(f"static int8_t y{i}[{len(c['want'])}];\n")
        out.append(f"static const mf_conv_geom g{i} = {{{','.join(map(str, c['geom']))}}};\n")
        need = (pack.convrp_scratch_bytes(*c["geom"][3:5], c["geom"][2], c["geom"][6],
                                          c["geom"][10], c["geom"][1]) + 1) // 2
        two = "2" if c["geom"][2] * c["geom"][6] % 2 else ""
        # the entry for the layer, the one for O % 8 == 4 or 0 (blocks one or two at a time,
        # both asm when O % 8 == 0; _x8 with O % 8 == 4 runs the C rows), one unrolled for
        # another NW and the other parity's (the C rows)
        for fn in (f"mf_convrp{two}_w16_n{c['nw']}", f"mf_convrp{two}_w16_n{c['nw']}_x8",
                   f"mf_convrp{two}_w16_n{1 if c['nw'] != 1 else 2}",
                   f"mf_convrp{'' if two else '2'}_w16_n{c['nw']}"):
            calls.append(f"    memset(y{i}, {SENTINEL}, sizeof y{i});\n"
                         f"    for (j = {need}; j < SCRATCH + 8; ++j) scratch[j] = 0x1234;\n"
                         f"    {fn}(x{i}, &g{i}, {c['x_zp']}, p{i}, {c['o']}, "
                         f"{c['sf']}, y{i}, scratch);\n"
                         f"    bad += check({i}, y{i}, e{i}, (int32_t)sizeof y{i}, {need});\n")
    out.append(CHECK_MAIN)
    out.extend(calls)
    out.append(MAIN_END)
    return "".join(out)


@pytest.fixture(scope="module")
def program(tmp_path_factory):
    d = tmp_path_factory.mktemp("convrp")
    src = d / "convrp_test.c"
    src.write_text(c_program(all_cases()))
    return src


def check_build(src, target, opt, extra=()):
    exe = harness.build(src, target, opt, src.parent, extra)
    out = harness.run(exe, target)
    assert out.strip().splitlines()[-1] == "OK 0", out


def test_host_portable(program):
    check_build(program, "host", "-O2", ["-fsanitize=address,undefined",
                                         "-fno-sanitize-recover=all"])


@pytest.mark.parametrize("opt", ["-O0", "-O2", "-Os", "-O3"])
def test_m4_dsp(program, opt):
    require_tools("arm-none-eabi-gcc", "qemu-system-arm")
    check_build(program, "m4", opt)


def test_m4_dsp_intrinsics_only(program):
    """The DSP widening in C intrinsics and the C rows, optimised, without the asm."""
    require_tools("arm-none-eabi-gcc", "qemu-system-arm")
    check_build(program, "m4", "-O2", ["-DMF_GEMM_ASM=0"])


@pytest.mark.parametrize("target", ["m4-nodsp", "m3"])
def test_arm_portable(program, target):
    require_tools("arm-none-eabi-gcc", "qemu-system-arm")
    check_build(program, target, "-O2")


def test_convrp_order():
    """The window's words by hand for VWW's 3x3x3 (segment 9 taps per kernel row, taps of row
    ky at 9 ky + e): groups [P(2q) = rows 0/1 of element 2q, S(q) = row 2 elements 2q, 2q + 1,
    P(2q + 1)], the last group without P(9); and every tap exactly once for other shapes."""
    idx = pack.convrp_order(3, 3, 3)
    assert pack.convrp_words(3, 3, 3) == 14 and idx.shape == (14, 2)
    assert idx[:6].tolist() == [[0, 9], [18, 19], [1, 10], [2, 11], [20, 21], [3, 12]]
    assert idx[12:].tolist() == [[8, 17], [26, -1]]
    assert pack.convrp_words(10, 4, 1) == 20 and pack.convrp_words(1, 4, 1) == 2
    for kh, kw, c in ((3, 3, 3), (10, 4, 1), (2, 2, 4), (5, 3, 3), (1, 3, 1), (4, 1, 6)):
        i = pack.convrp_order(kh, kw, c).reshape(-1)
        assert sorted(i[i >= 0].tolist()) == list(range(kh * kw * c))
    # VWW: 146 pair groups of 3 words for a 48-pixel output row, and a 288-byte zero-point row;
    # ResNet-8 (stride 1: two copies of (31 * 3 + 1) / 2 + 5 = 52 groups), a 96-byte row
    assert pack.convrp_scratch_bytes(3, 3, 3, 2, 48, 96) == 4 * 146 * 3 + 288
    assert pack.convrp_scratch_bytes(3, 3, 3, 1, 32, 32) == 2 * 4 * 52 * 3 + 96
