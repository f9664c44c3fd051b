"""RV32's "p16" GEMM (runtime_c/mcuforge_rv.h: two channels a mul in 16-bit lanes, the taps cut
into chunks the schedule proves safe) and its schedule (codegen_c/kernels/rv.py), byte for byte
against a numpy model of TFLM's int8 reference kernels (tests/test_nn_gemm.py's, written
independently of the packing code).

1. C harness: host gcc with ASan/UBSan and at -O0/-O2/-Os/-O3, riscv32-virt (QEMU) at
   -O0/-O2/-Os/-O3 (all -std=c99 -pedantic -Wall -Wextra -Werror); random shapes
   with tails (rows not a multiple of 3, O not a multiple of 4, odd K), random zero points,
   clamps, rounding ties, row gaps; full-scale weights (chunks of one or two taps) with inputs
   at a channel's extreme (the lanes at the edge of their window), tiny weights (one chunk).
   Depthwise 3x3: mf_rv_dw3 (padded planes) and mf_rv_dwd (straight from NHWC) on the image
   and its transpose, with and without delayed rows, and as the schedule calls it (rv.dwd_choice)
   with its output over its input at the shift its access schedule declares.
2. The proof is tight: a stream whose chunk is one tap longer than chunks_p16 allows gives wrong
   bytes in C for the extreme input, and the mirror refuses it.
3. Schedule: the loop-IR evaluator runs the scheduled kernel for a RISC-V target and gets the
   reference kernel's outputs. (End to end: tests/test_board_riscv.py, MLPerf on riscv32-virt
   against tflite-micro.)"""
from __future__ import annotations

import subprocess

import numpy as np
import pytest

from conftest import require_tools
from mcuforge.codegen_c import pack
from mcuforge.codegen_c.kernels import rv
from tests.nn_bench import harness
from test_nn_gemm import conv_geometry, quantize_multiplier, tflm_conv, tflm_outputs
from test_nn_scalar import c_array, check, dw_case, layer

SENTINEL = 0x55


def extreme_rows(w, rows, k, rng):
    """Inputs that drive a random channel's lane to the end of its range (x = 127 where w > 0,
    -128 where w < 0, or the opposite)."""
    xs = rng.integers(-128, 128, (rows, k))
    for r in range(rows):
        ch, sign = int(rng.integers(0, len(w))), (1, -1)[r % 2]
        xs[r] = np.where(w[ch] * sign > 0, 127, -128)
    return xs


def big_scales(L):
    """Multipliers that keep accumulators of full-scale weights inside the output range."""
    bound = 128 * np.abs(L["w"]).sum(axis=1) + 1
    ms = [quantize_multiplier(90.0 / b) for b in bound]
    L.update(mults=[m for m, _ in ms], shifts=[s for _, s in ms], lo=-128, hi=127, y_zp=0)


def upscale(L, rng):
    """Output scales above 1 on odd channels: TFLM shift > 0 (mf_rq's pre >= 2, mode bit 1 of
    the kernel); weights in [-2, 2], small biases (with inputs near the zero point the outputs
    stay inside the int8 range)."""
    L["w"] = L["w"] // 64
    L["bias"] = L["bias"] // 300
    ms = [quantize_multiplier(float(2.0 ** rng.uniform(0.2, 2.5)) if c % 2 else 0.05)
          for c in range(len(L["w"]))]
    relu = len(L["w"]) % 2 == 0  # (one case each: the sign term or none)
    L.update(mults=[m for m, _ in ms], shifts=[s for _, s in ms], y_zp=0,
             lo=0 if relu else -128, hi=127)


def sweep_case(rng):
    """One tap, every int8 x as a row, weights 1..8, scales below 1 (the fast outputs: no
    shift) and ties, y_zp -128, ReLU: each channel's accumulators step by its weight through
    its threshold (the largest accumulator at lo and the next one are both reached: a low one
    higher by 1 gives wrong bytes, checked by hand)."""
    L = relu_layer(layer(rng, 8, 1))
    L["w"] = np.arange(1, 9).reshape(8, 1) * np.array([1, -1] * 4).reshape(8, 1)
    L["x_zp"], L["bias"] = 0, rng.integers(-20, 20, 8)
    ms = [quantize_multiplier(v) for v in (0.5, 0.25, 0.99, 0.75, 0.3, 0.45, 0.125, 0.6)]
    L.update(mults=[m for m, _ in ms], shifts=[t for _, t in ms])
    xs = np.arange(-128, 128).reshape(256, 1)
    y = tflm_outputs(xs, L["w"], L["bias"], L["x_zp"], L["mults"], L["shifts"], L["y_zp"],
                     L["lo"], L["hi"])
    return dict(kind="gemm", L=L, x=xs, rows=256, k=1, o=8, xs=1, y=y, low=True)


def relu_layer(L):
    """A ReLU with y_zp -128 (the int8 clamp), the bias centred: about half the outputs -128."""
    L.update(y_zp=-128, lo=-128, hi=127)
    return L


def gemm_case(rng, rows, k, o, gap=0, scale=None, extreme=False, up=False, relu=False):
    L = layer(rng, o, k, big=scale is not None)
    if up:
        upscale(L, rng)
    if relu:
        relu_layer(L)
    if scale is not None:  # weights of about this magnitude: chunk lengths from 1 to K
        L["w"] = np.clip(np.round(rng.standard_normal((o, k)) * scale), -127, 127).astype(int)
        big_scales(L)
    xs = rng.integers(-128, 128, (rows, k + gap))
    if up:
        xs = np.clip(L["x_zp"] + rng.integers(-4, 5, (rows, k + gap)), -128, 127)
    if extreme:
        xs[:, :k] = extreme_rows(L["w"], rows, k, rng)
    y = tflm_outputs(xs[:, :k], L["w"], L["bias"], L["x_zp"], L["mults"], L["shifts"],
                     L["y_zp"], L["lo"], L["hi"])
    return dict(kind="gemm", L=L, x=xs, rows=rows, k=k, o=o, xs=k + gap, y=y)


def conv_case(rng, h, wd, c, kh, kw, s, padding, o, scale=None, relu=False):
    L = layer(rng, o, kh * kw * c)
    if relu:
        relu_layer(L)
    if scale is not None:
        L["w"] = np.clip(np.round(rng.standard_normal((o, kh * kw * c)) * scale), -127,
                         127).astype(int)
        big_scales(L)
    x = rng.integers(-128, 128, (h, wd, c))
    w4 = L["w"].reshape(o, kh, kw, c)
    y = tflm_conv(x, w4, L["bias"], L["x_zp"], s, padding, L["mults"], L["shifts"], L["y_zp"],
                  L["lo"], L["hi"])
    oh, ow, pt, pl = conv_geometry(h, wd, kh, kw, s, padding)
    geom = (h, wd, c, kh, kw, s, s, pt, pl, oh, ow)
    return dict(kind="conv", L=L, x=x, geom=geom, o=o, y=y)


def all_cases(seed=0):
    rng = np.random.default_rng(seed)
    cases = []
    for rows, k, o in ((1, 1, 1), (3, 5, 6), (4, 8, 3), (7, 64, 12), (5, 63, 13), (2, 3, 9),
                       (6, 17, 4), (3, 128, 8)):
        cases.append(gemm_case(rng, rows, k, o, gap=int(rng.integers(0, 3))))
    for _ in range(6):
        cases.append(gemm_case(rng, int(rng.integers(1, 11)), int(rng.integers(1, 90)),
                               int(rng.integers(1, 20)), gap=int(rng.integers(0, 4))))
    # one row through mf_rv_gemm_p16 (the others of one row: mf_rv_fc_p16)
    cases.append(dict(gemm_case(rng, 1, 10, 5), rows_entry=True))
    # positive shifts (pre > 1)
    for rows, k, o in ((4, 7, 5), (3, 12, 8)):
        cases.append(gemm_case(rng, rows, k, o, up=True))
    # full-scale weights at the extremes (chunks of 1-2 taps); tiny weights (one long chunk)
    for rows, k, o, scale in ((4, 40, 6, 127.0), (5, 33, 5, 60.0), (3, 200, 4, 1.0),
                              (4, 96, 7, 20.0)):
        cases.append(gemm_case(rng, rows, k, o, scale=scale, extreme=True))
    for geo in ((12, 6, 1, 10, 4, 2, "SAME", 8), (9, 8, 3, 3, 3, 1, "SAME", 5),
                (9, 7, 3, 3, 3, 2, "VALID", 6), (6, 6, 16, 3, 3, 1, "SAME", 7),
                (7, 5, 4, 1, 1, 2, "VALID", 9), (5, 9, 2, 3, 2, 2, "SAME", 4)):
        cases.append(conv_case(rng, *geo))
    cases.append(conv_case(rng, 5, 6, 64, 3, 3, 1, "SAME", 5, scale=40.0))
    # depthwise 3x3 (mf_rv_dw3): strides 1 and 2 (and mixed), SAME / VALID, planes transposed
    # or not, one column or row, KWS's 25x5 (test_nn_scalar's dw_case: numpy TFLM model)
    for h, wd, c, sh, sw, pad in ((5, 6, 3, 1, 1, "SAME"), (7, 4, 5, 2, 2, "SAME"),
                                  (25, 5, 4, 1, 1, "SAME"), (6, 9, 2, 2, 2, "VALID"),
                                  (1, 7, 3, 1, 1, "SAME"), (8, 1, 2, 1, 1, "SAME"),
                                  (9, 8, 3, 2, 1, "SAME"), (5, 11, 6, 1, 2, "VALID"),
                                  (3, 3, 9, 1, 1, "SAME"), (12, 12, 2, 2, 2, "SAME")):
        cases.append(dw_case(rng, h, wd, c, sh, sw, pad))
    # mf_rv_dwd's row tails (interior outputs 4k + 1, 2, 3 at stride 1, odd at stride 2), no
    # padding at all, odd sizes at stride 2 (padding on all four sides), tiny images (one
    # output with kernel rows and columns off on both sides)
    for h, wd, c, sh, sw, pad in ((4, 9, 3, 1, 1, "SAME"), (3, 8, 2, 1, 1, "SAME"),
                                  (7, 10, 2, 1, 1, "VALID"), (9, 9, 2, 2, 2, "SAME"),
                                  (2, 2, 3, 1, 1, "SAME"), (2, 2, 3, 2, 2, "SAME"),
                                  (1, 1, 4, 1, 1, "SAME"), (3, 13, 5, 1, 2, "SAME")):
        cases.append(dw_case(rng, h, wd, c, sh, sw, pad))
    dw = dw_case(rng, 6, 7, 4, 1, 1, "SAME")  # positive shifts (mode bit 1)
    upscale(dw["L"], rng)
    dw["x"] = np.clip(dw["L"]["x_zp"] + rng.integers(-3, 4, dw["x"].shape), -128, 127)
    cases.append(dw_redo(dw))
    # ReLU-like layers with the records' low (mode bit 3): the first outputs of every other
    # GEMM/conv case again with it, plus ReLU clamps at y_zp -128 (about half the outputs at lo)
    more = [dict(c, low=True) for c in cases[::2] if c["kind"] != "dw"]
    for rows, k, o in ((6, 40, 8), (9, 64, 12), (7, 23, 9)):
        c = gemm_case(rng, rows, k, o, relu=True)
        more += [dict(c, low=True), c]
    more.append(dict(gemm_case(rng, 6, 9, 8, up=True, relu=True), low=True))
    more.append(dict(gemm_case(rng, 6, 9, 7, up=True), low=True))  # with the sign term
    for geo in ((12, 6, 1, 10, 4, 2, "SAME", 8), (9, 8, 3, 3, 3, 1, "SAME", 5)):
        more.append(dict(conv_case(rng, *geo, relu=True), low=True))
    more.append(sweep_case(rng))
    # channels reordered in the blocks (mode bit 4): random orders (full blocks of 3 rows and
    # the tails), with and without low; one-row cases stay in order (mf_rv_fc_p16)
    for i, c in enumerate(cases + more):
        if c["kind"] != "dw" and c["o"] > 1 and c.get("rows", 3) > 1 and i % 3 == 0:
            more.append(dict(c, order=rng.permutation(c["o"])))
    # every segment entry: chunks of 8 to 24 taps (a whole chunk of 8, then a first 8 and a
    # last 1..8, then a first 8, 8 more and a last 1..8; shorter chunks than chunks_p16's stay
    # inside the lane bound), 3 rows and a tail
    r2 = np.random.default_rng(seed + 99)
    lens = list(range(rv.SEG, 3 * rv.SEG + 1))
    c = gemm_case(r2, 4, sum(lens), 4, scale=1.0, extreme=True)
    more += [dict(c, chunks=[lens]), dict(c, chunks=[lens], low=True, order=[2, 0, 3, 1])]
    return cases + more


def dw_redo(c):
    """A dw_case's expected output again after its layer or input changed."""
    from test_nn_scalar import tflm_dw
    L, (h, wd, ch) = c["L"], c["x"].shape
    g = [int(v) for v in c["geom"]]
    if c["transpose"]:  # plane rows = image columns: dw_geometry's fields swapped
        oh, ow, sh, sw, pt, pl = g[4], g[3], g[6], g[5], g[8], g[7]
    else:
        oh, ow, sh, sw, pt, pl = g[3], g[4], g[5], g[6], g[7], g[8]
    w = L["w"].T.reshape(3, 3, ch)
    c["y"] = tflm_dw(c["x"], w, L["bias"], L["x_zp"], sh, sw, pt, pl, oh, ow, L["mults"],
                     L["shifts"], L["y_zp"], L["lo"], L["hi"])
    return c


def direct_geometry(c):
    """A dw_case's (VH, VW, C, VOH, VOW, sy, sx, pad_y, pad_x) in the image's own order
    (mf_rv_dwd's)."""
    g = [int(v) for v in c["geom"]]
    h, wd, ch = c["x"].shape
    if c["transpose"]:
        return h, wd, ch, g[4], g[3], g[6], g[5], g[8], g[7]
    return h, wd, ch, g[3], g[4], g[5], g[6], g[7], g[8]


IP_BYTES = 8192  # the in-place buffer


def in_place_check(i, c, d, mode, puts, puti, cmp=0) -> str:
    """C: case i through mf_rv_dwd as the schedule calls it (rv.dwd_choice: plane, delayed
    rows; cmp: 1 one row body, 2 the walk, mf_rv_dwd_x's CMP) with y at x + the shift its
    access schedule allows (inplace.best_shift; the walk's own: inplace.rv_dwd's walk), in one
    buffer: every output byte must still come out right."""
    from mcuforge.codegen_c.kernels import inplace
    L, n_in, n_out = c["L"], c["x"].size, c["y"].size
    tr, dly, acc = rv.dwd_choice(d, n_in, n_out)
    if cmp == 2:
        acc = inplace.rv_dwd(*rv.dwd_plane(d, tr), tr, dly, n_in, n_out, walk=True)
    shift = inplace.best_shift(acc)
    x0 = max(0, -shift)
    assert x0 + max(n_in, n_out + shift) <= IP_BYTES and shift <= 0
    args = ", ".join(map(str, rv.dwd_plane(d, tr)))
    return f"""    memset(ipbuf, {SENTINEL}, sizeof ipbuf);
    memcpy(ipbuf + {x0}, x{i}, {n_in});
    mf_rv_dwd_x(ipbuf + {x0}, ipbuf + {x0 + shift}, wd{i}_{tr}, {args}, {L['x_zp']},
                {L['lo']}, {L['hi']}, {mode}, {tr}, {dly}, {cmp}, scratch);
    bad = 0;
    for (j = 0; j < {n_out}; j++) bad += ipbuf[{x0 + shift} + j] != y{i}[j];
    if (bad) {{ {puts}("case {i} in place bad "); {puti}((uint64_t)bad); {puts}("\\n"); total += bad; }}
"""


def kernel_data(L, chunks=None, low=False, order=None):
    """What the schedule passes: the p16 stream, the records, the mode (low: with the records'
    low, mode bit 3, as for a ReLU layer; order: the channels in this order in the blocks,
    mode bit 4)."""
    w = L["w"]
    folded = pack.fold_bias(L["bias"], w, L["x_zp"])
    rq = pack.requant_params(L["mults"], L["shifts"], L["y_zp"], pack.acc_bounds(folded, w))
    assert folded is not None and rq is not None
    perm = np.arange(len(w)) if order is None else np.asarray(order)
    w, folded, rq = w[perm], folded[perm], rq[perm]
    chunks = rv.chunks_p16(w) if chunks is None else chunks
    mode = rv.rv_mode(pack.needs_signfix(L["y_zp"], L["lo"]), rq, low, order is not None)
    lows = rv.rv_lows(rq, mode & 1, L["lo"], L["hi"], pack.acc_bounds(folded, w)) if low else None
    return rv.pack_p16(w, chunks), rv.rv_records(folded, rq, chunks, lows, perm), mode


def test_cases_exercise_entries():
    """Both one-row entries and the others are in the cases."""
    rows = [(c["rows"], bool(c.get("rows_entry"))) for c in CASES if c["kind"] == "gemm"]
    assert (1, True) in rows and (1, False) in rows and any(r > 3 for r, _ in rows)


def test_cases_exercise_modes():
    """The cases cover the four modes (sign term, shift)."""
    modes = {kernel_data(c["L"], low=c.get("low", False), order=c.get("order"))[2]
             for c in CASES if c["kind"] != "dw"}
    assert {0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 24, 25} <= modes, modes
    # with the int8 clamp (MF_RV_MODE's bit 2) and full blocks of 3 rows: mf_rv_block3's two
    # unchecked copies (28: ReLU with low; 21: the sign term, also taking 4 and 20) and the
    # modes left to its checked loop (13, 29)
    full = {kernel_data(c["L"], low=c.get("low", False), order=c.get("order"))[2] | 4
            for c in CASES if c["kind"] != "dw" and c.get("rows", 3) >= 3
            and (c["L"]["lo"], c["L"]["hi"]) == (-128, 127)}
    assert {4, 5, 12, 13, 20, 21, 28, 29} <= full, full
    dw = [c["L"] for c in CASES if c["kind"] == "dw"]
    assert any(min(L["shifts"]) < 0 < max(L["shifts"]) for L in dw)


def test_entry_offsets():
    """The segment words are the entries' byte offsets + 1 in the RV32 code (norvc: 4 bytes an
    instruction): 9 entries of 20 instructions (2 pointer steps, a tap's 17, a jump) for
    e = 0..7 then 16, then 10 of 3 (the steps and a jump) for e = 8..15, 17 and the end
    (18) right after the last one: 9 * 80 + 9 * 12 = 828."""
    want = {0: 0, 1: 80, 7: 560, 16: 640, 8: 720, 9: 732, 15: 804, 17: 816, 18: 828}
    assert {e: rv.entry_offset(e) for e in want} == want
    assert sorted(rv.entry_offset(e) for e in range(19)) == sorted(
        [80 * i for i in range(9)] + [720 + 12 * j for j in range(10)])


def test_cases_use_every_entry():
    """The streams of the cases hold every segment word (each entry of the assembly taken in
    the riscv32-virt runs below)."""
    words = set()
    for c in CASES:
        if c["kind"] != "dw":
            words |= set(kernel_data(c["L"], c.get("chunks"))[0].tolist())
    assert {rv.entry_offset(e) + 1 for e in range(2 * rv.SEG + 3)} <= words


def test_chunks_follow_the_lane_bound():
    """A chunk's lane sum must stay in [-2^15, 2^15) for x in [-128, 127]: weights 127 fit 2
    taps (128 * 254 = 32512 <= 32768, 3 taps: 48768); weights 64 fit 4 (128 * 256 = 32768:
    the lower end exactly; x = 127: 127 * 256 = 32512 <= 32767); weights 1: 256 taps; weights
    -1: 255 (x = -128 gives +128 a tap: 128 * 255 = 32640 <= 32767 < 128 * 256)."""
    assert rv.chunks_p16(np.full((4, 6), 127)) == [[2, 2, 2]]
    assert rv.chunks_p16(np.full((4, 6), 64)) == [[4, 2]]
    assert rv.chunks_p16(np.full((3, 600), 1)) == [[256, 256, 88]]
    assert rv.chunks_p16(np.full((1, 600), -1)) == [[255, 255, 90]]
    w = np.zeros((6, 10), np.int64)
    w[5, :] = 127  # block 1 (channels 4, 5) has its own chunks
    assert rv.chunks_p16(w) == [[10], [2] * 5]


def test_lows_are_the_largest_accumulators_at_lo():
    """rv_lows against TFLM's arithmetic (test_nn_gemm's mbqm, independent of pack/micro) over
    every accumulator of small bounds: low = the largest acc whose output is lo."""
    from test_nn_gemm import mbqm
    rng = np.random.default_rng(3)
    for _ in range(40):
        m, s = quantize_multiplier(float(2.0 ** rng.uniform(-9, 1)))
        zp = int(rng.integers(-128, 100))
        lo, hi = (max(zp, -128), 127) if rng.random() < 0.5 else (-128, 127)
        b = int(rng.integers(1, 3000))
        rq = pack.requant_params([m], [s], zp, [b])
        acc = np.arange(-b, b + 1)
        y = np.clip(mbqm(acc, m, s) + zp, lo, hi)
        at_lo = acc[y == lo]
        want = int(at_lo.max()) if at_lo.size else -2**31
        sign = pack.needs_signfix(zp, lo)
        assert rv.rv_lows(rq, sign, lo, hi, [b]).tolist() == [want]


# ---- the C program ---------------------------------------------------------------------------
def program(cases, out: str) -> str:
    """A C program running every case; `out` is "bench" (tests/nn_bench) or "mf" (a riscv32
    project's mf_board.h)."""
    puts, puti = ("bench_puts", "bench_put_i64") if out == "bench" else ("mf_puts", "mf_put_u64")
    head = ['#include <stdint.h>\n#include <string.h>\n#include "mcuforge_rv.h"\n',
            '#include "bench.h"\n' if out == "bench" else '#include "mf_board.h"\n']
    body = []
    ymax = max(c["y"].size + 8 for c in cases)
    smax = max([6 * c["geom"][3] * c["geom"][4] * c["geom"][2] for c in cases
                if c["kind"] == "conv"] + [3 * c["k"] for c in cases if c["kind"] == "gemm"]
               + [int(c["geom"][13] * c["geom"][14]) for c in cases if c["kind"] == "dw"])
    head.append(f"static int8_t ybuf[{ymax}];\nstatic int8_t scratch[{smax}];\n")
    if any(c["kind"] == "dw" for c in cases):
        head.append(f"static int8_t ipbuf[{IP_BYTES}];\n")
    for i, c in enumerate(cases):
        if c["kind"] == "dw":
            L = c["L"]
            folded = pack.fold_bias(L["bias"], L["w"], L["x_zp"])
            rq = pack.requant_params(L["mults"], L["shifts"], L["y_zp"],
                                     pack.acc_bounds(folded, L["w"]))
            pk = rv.pack_rv_dw3(L["w"], folded, rq, c["transpose"])
            mode = rv.rv_mode(pack.needs_signfix(L["y_zp"], L["lo"]), rq)
            head += [c_array("int32_t", f"w{i}", pk), c_array("int32_t", f"g{i}", c["geom"]),
                     c_array("int8_t", f"x{i}", c["x"]), c_array("int8_t", f"y{i}", c["y"])]
            call = (f"mf_rv_dw3(x{i}, ybuf, w{i}, g{i}, {L['x_zp']}, {L['lo']}, {L['hi']}, "
                    f"{mode}, scratch);")
            body.append(check(i, c["y"].size, call, puts, puti))
            for tr in (0, 1):  # straight from NHWC, the image or its transpose
                d = rv.dwd_plane(direct_geometry(c), tr)
                if not rv.dwd_ok(*d):
                    continue
                head.append(c_array("int32_t", f"wd{i}_{tr}",
                                    rv.pack_rv_dw3(L["w"], folded, rq, bool(tr))))
                for dly in (0, 1):  # without and with the delayed rows
                    call = (f"mf_rv_dwd(x{i}, ybuf, wd{i}_{tr}, {', '.join(map(str, d))}, "
                            f"{L['x_zp']}, {L['lo']}, {L['hi']}, {mode}, {tr}, {dly}, "
                            "scratch);")
                    body.append(check(i, c["y"].size, call, puts, puti))
                    # one row body for every row (rv.py's depthwise code budget)
                    call = (f"mf_rv_dwd_x(x{i}, ybuf, wd{i}_{tr}, {', '.join(map(str, d))}, "
                            f"{L['x_zp']}, {L['lo']}, {L['hi']}, {mode}, {tr}, {dly}, 1, "
                            "scratch);")
                    body.append(check(i, c["y"].size, call, puts, puti))
                    # the shared copies' walk (MF_RV_DWD_DEFG): the plane's sizes unknown to
                    # the compiler (read from a volatile array), the strides (1, 2 along the
                    # rows) and padding not
                    if d[6] > 2:
                        continue
                    call = (f"mf_rv_dwd_x(x{i}, ybuf, wd{i}_{tr}, "
                            + ", ".join(f"dv{i}_{tr}[{j}]" for j in range(5))
                            + f", {', '.join(map(str, d[5:]))}, {L['x_zp']}, {L['lo']}, "
                            f"{L['hi']}, {mode}, {tr}, {dly}, 2, scratch);")
                    body.append(check(i, c["y"].size, call, puts, puti))
                if d[6] <= 2:
                    head.append(f"static volatile int32_t dv{i}_{tr}[5] = "
                                f"{{{', '.join(map(str, d[:5]))}}};\n")
            d = direct_geometry(c)
            if rv.dwd_ok(*d):  # the schedule's choice, its output over its input
                body.append(in_place_check(i, c, d, mode, puts, puti))
                body.append(in_place_check(i, c, d, mode, puts, puti, cmp=1))
                if d[6] <= 2:
                    body.append(in_place_check(i, c, d, mode, puts, puti, cmp=2))
            continue
        packed, rec, mode = kernel_data(c["L"], c.get("chunks"), c.get("low", False),
                                        c.get("order"))
        lo, hi, o = c["L"]["lo"], c["L"]["hi"], c["o"]
        head += [c_array("int32_t", f"w{i}", packed), c_array("int32_t", f"q{i}", rec),
                 c_array("int8_t", f"x{i}", c["x"]), c_array("int8_t", f"y{i}", c["y"])]
        if c["kind"] == "gemm" and c["rows"] == 1 and not c.get("rows_entry"):
            call = (f"mf_rv_fc_p16(x{i}, w{i}, (const mf_rv_rec *)q{i}, {o}, {lo}, {hi}, "
                    f"{mode}, ybuf);")
        elif c["kind"] == "gemm":
            call = (f"mf_rv_gemm_p16(x{i}, {c['rows']}, {c['xs']}, {c['k']}, w{i}, "
                    f"(const mf_rv_rec *)q{i}, {o}, {lo}, {hi}, {mode}, ybuf, {o}, scratch);")
        else:
            head.append(c_array("int32_t", f"g{i}", c["geom"]))
            call = (f"mf_rv_conv_p16(x{i}, (const mf_conv_geom *)g{i}, {c['L']['x_zp']}, "
                    f"w{i}, (const mf_rv_rec *)q{i}, {o}, {lo}, {hi}, {mode}, ybuf, "
                    f"scratch);")
        body.append(check(i, c["y"].size, call, puts, puti))
    return "".join(head) + f"""
int main(void) {{
    int j, bad;
    int total = 0;
{''.join(body)}    {puts}("total ");
    {puti}((uint64_t)total);
    {puts}("\\ndone\\n");
    return 0;
}}
"""


def check_output(text: str):
    assert "total 0\n" in text and "bad" not in text, text[-2000:]


CASES = all_cases()


def broken_case():
    """Weights 127, x = 127: chunks_p16 gives chunks of 2 taps; a stream whose first chunk
    has 3 overflows the low lane (3 * 127 * 127 = 48387 >= 2^15)."""
    rng = np.random.default_rng(7)
    L = layer(rng, 4, 6)
    L["w"] = np.full((4, 6), 127)
    big_scales(L)
    x = np.full((3, 6), 127)
    y = tflm_outputs(x, L["w"], L["bias"], L["x_zp"], L["mults"], L["shifts"], L["y_zp"],
                     L["lo"], L["hi"])
    assert rv.chunks_p16(L["w"]) == [[2, 2, 2]]
    return dict(kind="gemm", L=L, x=x, rows=3, k=6, o=4, xs=6, y=y, chunks=[[3, 1, 2]])


@pytest.fixture(scope="module")
def main_c(tmp_path_factory):
    d = tmp_path_factory.mktemp("rv")
    p = d / "rv_main.c"
    p.write_text(program(CASES, "bench"))
    return p


def test_host_sanitizers(main_c, tmp_path):
    exe = harness.build(main_c, "host", "-O1", tmp_path,
                        extra=["-fsanitize=address,undefined", "-fno-sanitize-recover=all",
                               "-g"])
    check_output(harness.run(exe, "host"))


@pytest.mark.parametrize("opt", ["-O0", "-O2", "-Os", "-O3"])
def test_host_opt_levels(main_c, tmp_path, opt):
    """-std=c99 -pedantic -Wall -Wextra -Werror at every level (harness.WARN), same bytes."""
    check_output(harness.run(harness.build(main_c, "host", opt, tmp_path), "host"))


def test_a_chunk_past_the_bound_fails(tmp_path):
    """The C gives wrong bytes for a chunk one tap longer than proven, and the mirror refuses
    the stream (the schedule's bound is what makes the kernel exact)."""
    from mcuforge.codegen_c.loop_ir import UndefinedBehaviour
    from mcuforge.codegen_c.micro_rv import unpack_p16
    c = broken_case()
    p = tmp_path / "broken.c"
    p.write_text(program([c], "bench"))
    out = harness.run(harness.build(p, "host", "-O2", tmp_path), "host")
    assert "case 0 bad" in out, out
    with pytest.raises(UndefinedBehaviour):
        unpack_p16(kernel_data(c["L"], c["chunks"])[0], 4, 6)


@pytest.fixture(scope="module")
def riscv_project(tmp_path_factory):
    """A riscv32-virt firmware project (the demo model's, for its start-up code, linker script
    and mf_board) whose main.c is the harness."""
    require_tools("riscv64-unknown-elf-gcc", "qemu-system-riscv32")
    from pathlib import Path

    from mcuforge.api import compile as compile_model
    from mcuforge.runtime_c import __file__ as rt
    from mcuforge.tools.demo import demo_tflite_bytes
    d = tmp_path_factory.mktemp("rvq")
    compile_model(demo_tflite_bytes(), d, board="riscv32-virt", name="demo")
    for h in ("mcuforge_nn.h", "mcuforge_scalar.h", "mcuforge_rv.h"):
        (d / h).write_text((Path(rt).parent / h).read_text())
    (d / "main.c").write_text(program(CASES, "mf"))
    return d


@pytest.mark.parametrize("opt", ["-O0", "-O2", "-Os", "-O3"])
def test_riscv(riscv_project, opt):
    from mcuforge.board import load_board
    from mcuforge.target import run_elf
    d = riscv_project
    subprocess.run(["make", "-s", "-C", str(d), "clean"], capture_output=True)
    r = subprocess.run(["make", "-s", "-C", str(d), f"OPT={opt}"], capture_output=True,
                       text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    check_output(run_elf(load_board("riscv32-virt"), d / "demo.elf", timeout=300))


# ---- the schedule: scheduled kernel == reference kernel in the loop-IR evaluator ---------------
def _sched_cases():
    from test_sched_layers import CASES as LAYERS
    return [c for c in LAYERS if c[1] in ("CONV_2D", "FULLY_CONNECTED", "DEPTHWISE_CONV_2D")]


@pytest.mark.parametrize("name,op,kw", _sched_cases(), ids=[c[0] for c in _sched_cases()])
def test_scheduled_equals_reference(name, op, kw):
    from mcuforge.ir.target import Target
    from test_sched_layers import scheduled_and_reference
    k, y, ref, y0 = scheduled_and_reference(name, op, Target("riscv32-virt", "rv32imac"), **kw)
    assert k is not ref
    assert y.tolist() == y0.tolist(), k.schedule


def test_some_layers_take_p16():
    """The schedule cases include layers on p16 (else the test above checks nothing of it)."""
    from mcuforge.codegen_c.kernels import lower_node
    from mcuforge.frontend.tflite import load_tflite
    from mcuforge.ir.target import Target
    from test_sched_layers import layer_model
    names = []
    for name, op, kw in _sched_cases():
        g = load_tflite(layer_model(sum(map(ord, name)), op, **kw)[0])
        names.append(lower_node(g.nodes[0], g, "k", Target("riscv32-virt", "rv32imac")).schedule)
    assert {"mf_rv_gemm_p16", "mf_rv_conv_p16", "mf_rv_dwd", "mf_rv_fc_p16"} <= set(names), names
