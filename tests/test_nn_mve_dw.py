"""The Helium kernels of runtime_c/mcuforge_mve_dw.h against numpy models of TFLM's int8
reference kernels written here (DepthwiseConv2D; the depthwise model also against tflite-micro
itself): every output byte, on the host (portable body, ASan/UBSan), on QEMU mps3-an547 with the
MVE body at -O0/-O2/-Os/-O3 and with the portable body (-DMF_USE_MVE=0); random shapes (channel
counts not a multiple of 4, odd sizes, strides 1 and 2 and mixed, SAME and VALID, kernels 3x3
and others incl. more than 16 taps), random zero points, none/relu/relu6 clamps, rounding ties.
And both bodies with exactly the scratch the schedule requests, ending where readable memory
ends (ASan on the host; the end of the ITCM on QEMU, where a read past it faults).
"""
from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

import numpy as np
import pytest

from mcuforge.codegen_c import pack, pack_mve_dw
from conftest import require_tools

_spec = importlib.util.spec_from_file_location(
    "mve_harness", Path(__file__).parent / "nn_bench" / "mve_harness.py")
H = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(H)


# ---- TFLM's reference integer arithmetic, independent of the kernels' packing ---------------
def mbqm(acc, mult, shift):
    """tflite::MultiplyByQuantizedMultiplier on int64 arrays (per-channel values last)."""
    acc, mult, shift = (np.asarray(v, np.int64) for v in (acc, mult, shift))
    left, right = np.maximum(shift, 0), np.maximum(-shift, 0)
    a = acc * (np.int64(1) << left)
    assert (np.abs(a) < 2**31).all()
    ab = a * mult  # SaturatingRoundingDoublingHighMul: (ab + nudge) / 2^31, C division
    num = ab + np.where(ab >= 0, 1 << 30, 1 - (1 << 30))
    high = np.where(num >= 0, num // 2**31, -((-num) // 2**31))
    mask = (np.int64(1) << right) - 1  # RoundingDivideByPOT
    threshold = (mask >> 1) + (high < 0)
    return (high >> right) + ((high & mask) > threshold)


def tflm_depthwise(x, w, bias, x_zp, mult, shift, y_zp, lo, hi, sh, sw, pt, pl, oh, ow):
    """x [H, W, C] int8, w [kh, kw, C]: taps outside the image are skipped, as in TFLM."""
    h, wd, c = x.shape
    kh, kw = w.shape[:2]
    acc = np.zeros((oh, ow, c), np.int64) + np.asarray(bias, np.int64)
    for ky in range(kh):
        iy = np.arange(oh) * sh - pt + ky
        for kx in range(kw):
            ix = np.arange(ow) * sw - pl + kx
            ok = ((iy >= 0) & (iy < h))[:, None] & ((ix >= 0) & (ix < wd))[None, :]
            v = x[np.clip(iy, 0, h - 1)][:, np.clip(ix, 0, wd - 1)].astype(np.int64) - x_zp
            acc += np.where(ok[..., None], v * w[ky, kx].astype(np.int64), 0)
    assert (np.abs(acc) < 2**31).all()
    return np.clip(mbqm(acc, mult, shift) + y_zp, lo, hi).astype(np.int8)


def tflm_padding(size, k, s, same):
    """(output size, padding before) as TFLM's ComputePaddingHeightWidth gives them."""
    out = -(-size // s) if same else (size - k) // s + 1
    return out, max((out - 1) * s + k - size, 0) // 2


# ---- depthwise cases --------------------------------------------------------------------------
def dw_case(rng, h, w, c, k=(3, 3), s=(1, 1), same=True, act="none", small=False):
    kh, kw = k
    oh, pt = tflm_padding(h, kh, s[0], same)
    ow, pl = tflm_padding(w, kw, s[1], same)
    wmax = 1 if small else int(rng.choice([3, 40, 127]))
    wts = rng.integers(-wmax, wmax + 1, (kh, kw, c))
    bias = rng.integers(-20, 20, c) if small else rng.integers(-30000, 30000, c)
    x_zp, y_zp = (int(v) for v in rng.integers(-128, 128, 2))
    if small:
        x_zp, y_zp = int(rng.integers(-20, 20)), int(rng.integers(-20, 20))
    mult = rng.integers(2**30, 2**31, c)
    shift = rng.integers(-14, 2, c)
    tie = rng.random(c) < 0.3  # power-of-two scales: many accumulators round half way
    mult[tie], shift[tie] = 2**30, rng.integers(-7, 0, tie.sum())
    if small:  # channels with post = 0 (no rounding shift) beside others, outputs not clamped
        shift = np.where(np.arange(c) % 3 == 0, 0, rng.integers(-3, 0, c))
    lo, hi = -128, 127
    if act == "relu":
        lo = max(-128, y_zp)
    elif act == "relu6":
        lo, hi = max(-128, y_zp), min(127, y_zp + int(rng.integers(5, 120)))
    x = rng.integers(-128, 128, (h, w, c))
    if small:
        x = np.clip(x_zp + rng.integers(-6, 7, (h, w, c)), -128, 127)
    want = tflm_depthwise(x, wts, bias, x_zp, mult, shift, y_zp, lo, hi, s[0], s[1], pt, pl,
                          oh, ow)
    return dict(x=x, wts=wts, bias=bias, x_zp=x_zp, mult=mult, shift=shift, y_zp=y_zp, lo=lo,
                hi=hi, s=s, pt=pt, pl=pl, oh=oh, ow=ow, want=want)


def dw_c(i, case, transpose=None):
    """The harness case calling mf_mve_dw_conv_s8 (packing with pack_mve_dw)."""
    h, w, c = case["x"].shape
    kh, kw = case["wts"].shape[:2]
    g = pack_mve_dw.geometry(h, w, c, case["oh"], case["ow"], (kh, kw), case["s"], case["pt"],
                             case["pl"])
    assert g is not None
    if transpose is not None and transpose != g["transpose"]:  # force the other view
        g2 = dict(g, transpose=transpose)
        v = pack_mve_dw._view(h, w, case["oh"], case["ow"], kh, kw, *case["s"], case["pt"],
                              case["pl"], c, transpose)
        assert v is not None
        g = dict(g2, ph=v["ph"], pw=v["pw"], pair=v["pair"], flat=v["flat"])
        g["cg"] = (pack_mve_dw.CG if c > 1 and pack_mve_dw.CG * g["ph"] * g["pw"]
                   <= pack_mve_dw.PLANES8 else 1)
    pk = pack_mve_dw.pack_dw(case["wts"], case["bias"], case["x_zp"], case["mult"],
                             case["shift"], case["y_zp"], g["transpose"], g["pair"],
                             pack_mve_dw.view_kernel(g)[2])
    assert pk is not None
    sf = pack.needs_signfix(case["y_zp"], case["lo"])
    geom = ", ".join(str(int(g[f])) for f in pack_mve_dw.GEOM_FIELDS)
    decls = (H.arr(f"x{i}", "int8_t", case["x"]) + H.arr(f"k{i}", "int32_t", pk, 8)
             + f"static const mf_mve_dw_geom g{i} = {{{geom}}};\n")
    call = (f"mf_mve_dw_conv_s8(x{i}, y, k{i}, &g{i}, {case['x_zp']}, {case['lo']}, "
            f"{case['hi']}, {sf}, s8)")
    return dict(decls=decls, call=call, want=case["want"], n=case["want"].size,
                sn=pack_mve_dw.scratch_bytes(g), geom=g, pk=pk, sf=sf)


def dw_cases(seed=0, n=30):
    rng = np.random.default_rng(seed)
    acts = ["none", "relu", "relu6"]
    fixed = [  # h, w, c, kernel, stride, same
        (1, 1, 1, (3, 3), (1, 1), True), (3, 3, 4, (3, 3), (1, 1), False),
        (5, 7, 5, (3, 3), (2, 2), True), (7, 9, 3, (3, 3), (2, 2), False),
        (25, 5, 13, (3, 3), (1, 1), True), (6, 6, 17, (3, 3), (1, 1), True),
        (9, 11, 6, (3, 3), (2, 2), True), (2, 3, 9, (3, 3), (2, 2), True),
        (10, 4, 7, (5, 5), (1, 1), True), (11, 9, 5, (5, 3), (2, 1), True),
        (8, 13, 6, (1, 7), (1, 2), False), (12, 10, 3, (7, 7), (1, 1), True),
        (9, 9, 4, (2, 2), (2, 2), False), (6, 40, 3, (3, 3), (1, 1), True),
        (48, 6, 9, (3, 3), (2, 2), True), (17, 17, 20, (4, 4), (3, 3), True),
        (13, 14, 5, (2, 2), (3, 4), False), (9, 16, 6, (1, 3), (1, 4), True)]  # pairs, sw > 2
    shapes = fixed + [(int(rng.integers(1, 15)), int(rng.integers(1, 15)),
                       int(rng.integers(1, 21)), (3, 3), (int(rng.integers(1, 3)),) * 2,
                       bool(rng.random() < .6)) for _ in range(n - len(fixed))]
    out = []
    for i, (h, w, c, k, s, same) in enumerate(shapes):
        if not same and (h < k[0] or w < k[1]):
            same = True
        out.append(dw_case(rng, h, w, c, k, s, same, acts[i % 3]))
    out += [dw_case(rng, 7, 6, 7, (3, 3), (s, s), True, "none", small=True) for s in (1, 2)]
    # flat walks of single windows (ow odd) ending in a quad of 1, 2 or 3 outputs (the asm
    # walk repeats the last output in the unused lanes), with and without the sign term
    out += [dw_case(rng, h, w, c, (3, 3), (s, s), True, act) for h, w, c, s, act in
            [(3, 3, 19, 1, "none"), (5, 5, 6, 1, "relu"), (3, 5, 21, 1, "none"),
             (5, 7, 9, 1, "relu6"), (6, 6, 12, 2, "none"), (6, 10, 5, 2, "relu"),
             (3, 3, 33, 1, "relu")]]
    # planes copied one channel at a time (cg 1), rows of whole groups of 8 pixels and not
    out += [dw_case(rng, h, w, c, (3, 3), (s, s), True, act) for h, w, c, s, act in
            [(24, 24, 3, 1, "relu"), (23, 25, 2, 2, "none"), (26, 17, 3, 1, "relu6"),
             (32, 32, 1, 1, "relu")]]
    # walks by rows whose last quad ends at the row's end (ow % 4 = 1, 2, 3; strides 1, 2)
    out += [dw_case(rng, h, w, 1, (3, 3), (s, s), True, act) for h, w, s, act in
            [(20, 19, 1, "none"), (21, 18, 1, "relu"), (48, 22, 2, "none"), (44, 18, 2, "relu"),
             (50, 26, 2, "relu6"), (19, 23, 1, "relu6"), (30, 9, 1, "none"),
             (60, 10, 2, "none"), (21, 19, 1, "none"), (45, 46, 2, "none"),
             (21, 21, 1, "none"), (46, 46, 2, "relu"), (66, 18, 2, "none")]]
    return out


@pytest.fixture(scope="module")
def dwc():
    cases = dw_cases()
    hs = [dw_c(i, c) for i, c in enumerate(cases)]
    # both views of a few layers: walked by rows and by columns
    hs += [dw_c(len(hs) + j, cases[k], transpose=t)
           for j, (k, t) in enumerate([(4, 0), (4, 1), (9, 1), (10, 1), (13, 0), (14, 1)])]
    return hs


def check(cases, kind, flags, tmp_path):
    exe = H.build(cases, kind, flags, tmp_path)
    rows, ok, log = H.run(exe, kind)
    assert len(rows) == len(cases), log[-2000:]
    bad = [(i, b) for i, (_, b) in enumerate(rows) if b]
    assert not bad and ok, (bad, log[-500:])
    return rows


def test_dw_cases_cover_the_edges(dwc):
    gs = [c["geom"] for c in dwc]
    assert any(g["c"] % 4 for g in gs) and any(g["ow"] % 4 == 0 for g in gs)
    assert {g["ow"] % 4 for g in gs if not g["transpose"]} == {0, 1, 2, 3}
    assert any(g["transpose"] for g in gs) and not all(g["transpose"] for g in gs)
    assert any(g["kh"] * g["kw"] > 16 for g in gs) and any(g["kh"] * g["kw"] > 32 for g in gs)
    assert any(g["sh"] != g["sw"] for g in gs) and any(g["sh"] == 3 for g in gs)
    assert any(c["sf"] for c in dwc) and any(not c["sf"] for c in dwc)
    # a sign term with channels of post = 0 beside others, outputs mostly unclamped
    assert any(c["sf"] and (c["pk"][:, 3] == 0).any() and (c["pk"][:, 3] != 0).any()
               and (np.abs(c["want"].astype(int)) < 100).mean() > .5 for c in dwc)
    assert any((c["pk"][:, 4] > 1).any() for c in dwc)  # pre > 1: a left shift before VQRDMULH
    assert any(g["pair"] for g in gs) and any(not g["pair"] for g in gs)
    assert any(g["pair"] and pack_mve_dw.view_kernel(g)[2] > 2 for g in gs)
    # passes of 8 planes copied together, a last pass of fewer; passes of one plane
    assert any(g["cg"] == 8 and g["c"] > 8 and g["c"] % 8 for g in gs)
    assert any(g["cg"] == 8 and g["c"] < 8 for g in gs) and any(g["cg"] == 1 for g in gs)
    # one plane at a time: rows of 8 pixels and more, with and without a last 1..7
    # walks by rows (asm at -O2/-O3): each ow % 4, strides 1 and 2, with and without the sign
    # term (a row's last 1..3 outputs: a quad ending at the row's end)
    rows = {((g["oh"] if g["transpose"] else g["ow"]) % 4, pack_mve_dw.view_kernel(g)[2],
             c["sf"]) for g, c in zip(gs, dwc)
            if g["pair"] and not g["flat"] and (g["oh"] if g["transpose"] else g["ow"]) >= 4}
    assert {(r, s, f) for r in range(4) for s in (1, 2) for f in (0, 1)} <= rows
    # (the asm copy: 16 pixels a gather where the pixel stride is <= 17, else 8)
    w1 = set()
    for g in gs:
        if g["cg"] == 1:
            w, xp = (g["h"], g["w"] * g["c"]) if g["transpose"] else (g["w"], g["c"])
            b = 16 if 15 * xp <= 255 else 8
            w1.add((b, w >= b, w % b > 0))
    assert {(16, True, False), (16, True, True), (8, True, False), (8, True, True)} <= w1
    # the flat walk: pairs (ow even), single windows of the pair layout (ow odd), tap groups;
    # a last partial quad; and layers walked by rows
    flat = [g for g in gs if g["flat"]]
    assert any(g["pair"] and g["ow"] % 2 == 0 for g in flat)
    assert any(g["pair"] and g["ow"] % 2 for g in flat) and any(not g["pair"] for g in flat)
    assert any(g["oh"] * g["ow"] % 4 for g in flat) and any(not g["flat"] for g in gs)
    flat1 = [(g["oh"] * g["ow"] % 4, c["sf"]) for g, c in zip(gs, dwc)
             if g["flat"] and g["pair"] and g["ow"] % 2]
    assert {(r, sf) for r in range(4) for sf in (0, 1)} <= set(flat1)
    assert {(2, 0), (2, 1)} <= {(g["oh"] * g["ow"] % 4, c["sf"]) for g, c in zip(gs, dwc)
                                if g["flat"] and g["pair"] and g["ow"] % 2 == 0}
    assert any(g["pair"] and g["transpose"] for g in gs) and any(g["pair"] and g["sw"] == 2 for g in gs)


@pytest.mark.parametrize("opt", ["-O0", "-O2"])
def test_dw_host_portable(dwc, opt, tmp_path):
    require_tools("gcc")
    check(dwc, "host", [opt, "-fsanitize=address,undefined", "-fno-sanitize-recover=all"],
          tmp_path)


# with a frame pointer: the asm loops' operands sit in fixed registers (gcc 12 failed with
# "impossible constraints" at -Os and -O3 when it chose them)
M55 = [("m55", "-O0"), ("m55", "-O2"), ("m55", "-Os"), ("m55", "-O3"), ("m55-portable", "-O2"),
       ("m55", "-Os -fno-omit-frame-pointer"), ("m55", "-O3 -fno-omit-frame-pointer")]


# the C loops (intrinsics) where the asm ones run at every -O level
M55DW = M55 + [("m55", "-O2 -DMF_MVDW_NO_ASM")]


@pytest.mark.parametrize("kind,opt", M55DW, ids=[f"{k}{o.replace(' ', '')}" for k, o in M55DW])
def test_dw_m55_qemu(dwc, kind, opt, tmp_path):
    require_tools("arm-none-eabi-gcc", "qemu-system-arm")
    check(dwc, kind, opt.split(), tmp_path)


# ---- the scratch the schedule requests, and not a byte more -------------------------------
# Pair layouts whose last plane ends exactly where the last output's window does (VALID, the
# view's ow a multiple of 4, channels filling the last pass): each output's 16-lane gather
# spans kw + sw columns (its neighbour's window too), sw past the plane's end for the last one.
# (h, w, c, kernel, stride, transpose): the view's stride along its rows is sw = 1..4
TIGHT = [(30, 1, 40, (3, 1), (1, 1), 1),  # the wakeword model's first depthwise layer
         (17, 1, 16, (3, 1), (2, 1), 1), (24, 5, 8, (3, 2), (3, 1), 1),
         (30, 6, 8, (2, 2), (4, 2), 1), (29, 3, 3, (3, 3), (1, 1), 1),
         (12, 30, 8, (1, 3), (1, 1), 0), (40, 24, 8, (2, 3), (1, 3), 0),
         (66, 30, 3, (2, 2), (2, 4), 0),
         (5, 10, 8, (3, 3), (1, 1), 0)]  # flat: the portable body reads into the table


@pytest.fixture(scope="module")
def tight():
    rng = np.random.default_rng(7)
    cases = [dw_c(i, dw_case(rng, h, w, c, k, s, False, ("none", "relu")[i % 2]), transpose=t)
             for i, (h, w, c, k, s, t) in enumerate(TIGHT)]
    for c, (h, w, ch, k, s, t) in zip(cases, TIGHT):  # the layouts meant
        g = c["geom"]
        assert g["transpose"] == t and g["pair"] and g["flat"] == (c is cases[-1]), g
    sws = {pack_mve_dw.view_kernel(c["geom"])[2] for c in cases if c["geom"]["transpose"]}
    assert sws == {1, 2, 3, 4}
    return cases


@pytest.mark.parametrize("opt", ["-O0", "-O2"])
def test_dw_scratch_exact_host(tight, opt, tmp_path):
    """The portable body with its scratch at the end of an array of exactly the bytes the
    schedule requests: ASan reports any read past it."""
    require_tools("gcc")
    exe = H.build(tight, "host", [opt, "-fsanitize=address,undefined",
                                  "-fno-sanitize-recover=all"], tmp_path, tail=True)
    rows, ok, log = H.run(exe, "host")
    assert ok and len(rows) == len(tight) and not any(b for _, b in rows), log[-3000:]


M55T = [("m55", "-O0"), ("m55", "-O2"), ("m55", "-Os"), ("m55", "-O3"), ("m55-portable", "-O2"),
        ("m55", "-O0 -DMF_MVDW_NO_ASM")]


@pytest.mark.parametrize("kind,opt", M55T, ids=[f"{k}{o.replace(' ', '')}" for k, o in M55T])
def test_dw_scratch_exact_m55(tight, kind, opt, tmp_path):
    """Both bodies on QEMU with each scratch ending at the end of the ITCM: a read past it
    (a plain load or a byte of a 16-lane gather) raises a BusFault (the harness prints FAULT)."""
    require_tools("arm-none-eabi-gcc", "qemu-system-arm")
    exe = H.build(tight, kind, opt.split(), tmp_path, tail=True)
    rows, ok, log = H.run(exe, kind)
    assert ok and len(rows) == len(tight) and not any(b for _, b in rows), log[-2000:]


def test_dw_geometry_refusals():
    assert pack_mve_dw.geometry(8, 8, 4, 8, 8, (3, 3), 1, 1, 1) is not None
    assert pack_mve_dw.geometry(8, 8, 4, 8, 8, (3, 3), 1, 1, 1, dilation=(2, 2)) is None
    assert pack_mve_dw.geometry(8, 8, 4, 8, 8, (3, 3), 1, 1, 1, depth_multiplier=2) is None
    assert pack_mve_dw.geometry(20, 20, 4, 20, 20, (9, 9), 1, 4, 4) is None  # 81 taps
    # a 3x3 gather reaches 2 * pw + 2 bytes: planes wider than 126 in both views decline
    assert pack_mve_dw.geometry(200, 200, 4, 200, 200, (3, 3), 1, 1, 1) is None
    g = pack_mve_dw.geometry(200, 20, 4, 200, 20, (3, 3), 1, 1, 1)
    assert g is not None and g["pw"] <= 126
    w = np.ones((3, 3, 4), np.int64)
    assert pack_mve_dw.pack_dw(w, None, 0, [2**30] * 4, [0] * 4, 0) is not None
    assert pack_mve_dw.pack_dw(w, [2**31 - 10] * 4, -100, [2**30] * 4, [0] * 4, 0) is None
    assert pack_mve_dw.pack_dw(w * 200, None, 0, [2**30] * 4, [0] * 4, 0) is None  # not int8


# ---- the numpy model against tflite-micro --------------------------------------------------
def test_dw_model_against_tflite_micro(tmp_path):
    runtime = pytest.importorskip("tflite_micro.python.tflite_micro.runtime")
    from mcuforge.codegen_c import qparams
    from tests import tfl_build as tb
    rng = np.random.default_rng(7)
    hs = []
    for h, w, c, k, s, same, act in [(9, 7, 6, (3, 3), (1, 1), True, "relu6"),
                                     (11, 8, 5, (3, 3), (2, 2), True, "none"),
                                     (10, 9, 3, (5, 3), (2, 1), False, "relu")]:
        sx, sy = 0.05, 0.09
        ws = rng.uniform(0.002, 0.02, c).astype(np.float32)
        x_zp, y_zp = -7, 11
        wts = rng.integers(-127, 128, (1, *k, c)).astype(np.int8)
        bias = rng.integers(-2000, 2000, c).astype(np.int32)
        m = tb.Model()
        x = m.tensor("x", (1, h, w, c), "int8", scale=sx, zero_point=x_zp)
        wt = m.tensor("w", (1, *k, c), "int8", data=wts, scale=list(ws), zero_point=[0] * c,
                      axis=3)
        b = m.tensor("b", (c,), "int32", data=bias, scale=list(ws * np.float32(sx)),
                     zero_point=[0] * c)
        oh, pt = tflm_padding(h, k[0], s[0], same)
        ow, pl = tflm_padding(w, k[1], s[1], same)
        y = m.tensor("y", (1, oh, ow, c), "int8", scale=sy, zero_point=y_zp)
        m.op("DEPTHWISE_CONV_2D", [x, wt, b], [y], "DepthwiseConv2DOptions",
             Padding=0 if same else 1, StrideW=s[1], StrideH=s[0], DepthMultiplier=1,
             FusedActivationFunction={"none": 0, "relu": 1, "relu6": 3}[act], version=2)
        m.io([x], [y])
        mult, shift = qparams.conv_output_multipliers(sx, ws, sy)
        lo, hi = qparams.activation_range_int8(act, sy, y_zp)
        xv = rng.integers(-128, 128, (h, w, c)).astype(np.int8)
        it = runtime.Interpreter.from_bytes(m.build(), arena_size=1 << 20)
        it.set_input(xv[None], 0)
        it.invoke()
        got = np.asarray(it.get_output(0))[0]
        ref = tflm_depthwise(xv, wts[0], bias, x_zp, mult, shift, y_zp, lo, hi, s[0], s[1], pt,
                             pl, oh, ow)
        assert (ref == got).all()
        case = dict(x=xv, wts=wts[0], bias=bias, x_zp=x_zp, mult=mult, shift=shift, y_zp=y_zp,
                    lo=lo, hi=hi, s=s, pt=pt, pl=pl, oh=oh, ow=ow, want=got)
        hs.append(dw_c(len(hs), case))
    check(hs, "host", ["-O2"], tmp_path / "host")
    if shutil.which("arm-none-eabi-gcc") and shutil.which("qemu-system-arm"):
        check(hs, "m55", ["-O2"], tmp_path / "m55")


# ---- the schedules: loop-IR evaluator, scheduled == reference, for the Cortex-M55 -------------
M55_TARGET = None


def m55():
    from mcuforge.ir.target import Target
    return Target("mps3-an547", "cortex-m55", frozenset({"dsp", "mve"}))


def sched_dw_cases():
    out = []
    for i in range(10):
        rng = np.random.default_rng(300 + i)
        hw = (int(rng.integers(1, 12)), int(rng.integers(1, 12)))
        k = ((3, 3), (3, 3), (5, 5), (1, 3), (3, 3))[i % 5]
        valid = (i // 2) % 2 == 1 and hw[0] >= k[0] and hw[1] >= k[1]
        out.append((f"dw_{i}", dict(hw=hw, c=int(rng.integers(1, 11)), k=k,
                                    stride=((1, 1), (2, 2), (2, 1))[i % 3], pad=int(valid),
                                    act=("none", "relu", "relu6")[i % 3], per_channel=i != 5)))
    out += [("dw_kws", dict(hw=(25, 5), c=8, act="relu")),
            ("dw_vww_s2", dict(hw=(12, 12), c=6, stride=(2, 2), act="relu", y_zp=-128)),
            ("dw_dead", dict(hw=(6, 7), c=5, stride=(2, 2), dead=True)),
            ("dw_wide", dict(hw=(5, 6), c=70, act="relu"))]
    return out


SCHED_DW = sched_dw_cases()


@pytest.mark.parametrize("name,kw", SCHED_DW, ids=[c[0] for c in SCHED_DW])
def test_dw_schedule_equals_reference(name, kw):
    from mcuforge.codegen_c.evaluate import run_kernel
    from mcuforge.codegen_c.kernels import lower_node
    from mcuforge.codegen_c.lower import reference_kernel
    from mcuforge.frontend.tflite import load_tflite
    from test_sched_layers import layer_model
    model, x = layer_model(sum(map(ord, name)), "DEPTHWISE_CONV_2D", **kw)
    g = load_tflite(model)
    node = g.nodes[0]
    ref = reference_kernel(node, g, "k")
    k = lower_node(node, g, "k", m55())
    assert k.schedule == "mf_mve_dw_conv_s8", k.schedule
    ys = []
    for kern in (ref, k):
        y = np.zeros(g.tensors[g.outputs[0]].size, np.int8)
        run_kernel(kern, {"x": x[0].reshape(-1).copy(), "y": y})
        ys.append(y)
    assert ys[1].tolist() == ys[0].tolist()


def test_dw_schedule_only_for_mve():
    from mcuforge.codegen_c.kernels import lower_node
    from mcuforge.frontend.tflite import load_tflite
    from mcuforge.ir.target import Target
    from test_sched_layers import layer_model
    model, _ = layer_model(5, "DEPTHWISE_CONV_2D", hw=(6, 6), c=4)
    g = load_tflite(model)
    m4 = Target("mps2-an386", "cortex-m4", frozenset({"dsp"}))
    assert lower_node(g.nodes[0], g, "k", m4).schedule.startswith("mf_dw3x3_s8")
    assert lower_node(g.nodes[0], g, "k", m55()).schedule == "mf_mve_dw_conv_s8"


# ---- end to end on QEMU mps3-an547 against tflite-micro ------------------------------------
E2E_DW = [c for c in SCHED_DW if c[0] in ("dw_0", "dw_2", "dw_4", "dw_kws", "dw_vww_s2",
                                           "dw_dead")]


@pytest.mark.parametrize("name,kw", E2E_DW, ids=[c[0] for c in E2E_DW])
def test_dw_layer_m55_equals_tflm(name, kw):
    from conftest import require_tflm
    from mcuforge import runner
    from mcuforge.tools import tflm
    from test_sched_layers import layer_model
    require_tflm()
    require_tools("arm-none-eabi-gcc", "qemu-system-arm")
    model, x = layer_model(sum(map(ord, name)), "DEPTHWISE_CONV_2D", **kw)
    np.testing.assert_array_equal(runner.run(model, x, board="mps3-an547"),
                                  tflm.run(model, [x])[0])


# ---- int8 ADD -------------------------------------------------------------------------------
def quantize_multiplier(real: float):
    """tflite::QuantizeMultiplier: (q in [2^30, 2^31), shift) with real = q * 2^(shift - 31)."""
    if real == 0:
        return 0, 0
    frac, exp = np.frexp(real)
    q = int(round(frac * 2**31))
    if q == 2**31:
        q, exp = q // 2, exp + 1
    return q, int(exp)


def srdhm(a, b):
    ab = np.asarray(a, np.int64) * np.int64(b)
    num = ab + np.where(ab >= 0, 1 << 30, 1 - (1 << 30))
    return np.where(num >= 0, num // 2**31, -((-num) // 2**31))


def rdbpot(x, e):
    x = np.asarray(x, np.int64)
    mask = (np.int64(1) << e) - 1
    return (x >> e) + ((x & mask) > (mask >> 1) + (x < 0))


def tflm_add_params(s1, z1, s2, z2, so, zo, lo, hi):
    """TFLM's CalculateOpDataAdd for int8 (scales as float32, arithmetic in double)."""
    s1, s2, so = (float(np.float32(v)) for v in (s1, s2, so))
    twice = 2 * max(s1, s2)
    m1, e1 = quantize_multiplier(s1 / twice)
    m2, e2 = quantize_multiplier(s2 / twice)
    mo, eo = quantize_multiplier(twice / ((1 << 20) * so))
    return dict(input1_offset=-z1, input2_offset=-z2, left_shift=20, input1_multiplier=m1,
                input1_shift=e1, input2_multiplier=m2, input2_shift=e2, output_multiplier=mo,
                output_shift=eo, output_offset=zo, act_min=lo, act_max=hi)


def tflm_add(a, b, p):
    """reference_integer_ops::AddElementwise (int8)."""
    def scaled(x, off, m, e):
        return rdbpot(srdhm((np.asarray(x, np.int64) + off) << p["left_shift"], m), -e)
    s = scaled(a, p["input1_offset"], p["input1_multiplier"], p["input1_shift"]) \
        + scaled(b, p["input2_offset"], p["input2_multiplier"], p["input2_shift"])
    out = rdbpot(srdhm(s, p["output_multiplier"]), -p["output_shift"]) + p["output_offset"]
    return np.clip(out, p["act_min"], p["act_max"]).astype(np.int8)


def add_case(rng, n, act="none", ties=False):
    from mcuforge.codegen_c import pack_ew
    for _ in range(100):
        s1, s2 = rng.uniform(0.01, 0.2, 2)
        if ties:  # power-of-two scale ratios: many sums land half way
            s2, so = s1 * 2.0 ** int(rng.integers(-2, 3)), s1 * 2.0 ** int(rng.integers(-1, 3))
        else:
            so = float(rng.uniform(0.02, 0.4))
        z1, z2, zo = (int(v) for v in rng.integers(-128, 128, 3))
        lo, hi = -128, 127
        if act == "relu":
            lo = zo
        elif act == "relu6":
            lo, hi = zo, min(127, zo + int(rng.integers(5, 100)))
        p = tflm_add_params(s1, z1, s2, z2, so, zo, lo, hi)
        c = pack_ew.add_constants(p)
        if c is not None:
            break
    a, b = rng.integers(-128, 128, (2, n))
    return dict(a=a, b=b, p=p, c=c, want=tflm_add(a, b, p))


def add_c(i, case):
    c = case["c"]
    big, small = ("a", "b") if c["big"] == 0 else ("b", "a")
    n = case["a"].size
    decls = (H.arr(f"a{i}", "int8_t", case["a"]) + H.arr(f"b{i}", "int8_t", case["b"])
             + H.arr(f"tab{i}", "int32_t", c["tab"], 8))
    call = (f"mf_mve_dw_add_s8({big}{i}, {small}{i}, y, {n}, tab{i}, {c['mult']}, {c['add']}, "
            f"{c['post']}, {c['signfix']}, {c['lo']}, {c['hi']})")
    return dict(decls=decls, call=call, want=case["want"], n=n, sn=0, c=c, case=case)


@pytest.fixture(scope="module")
def addc():
    rng = np.random.default_rng(5)
    acts = ["none", "relu", "relu6"]
    cases = [add_case(rng, n, acts[i % 3], ties=i % 4 == 3)
             for i, n in enumerate([1, 2, 3, 4, 5, 7, 16, 33, 100, 257, 1000, 4099, 64, 31, 8,
                                    12])]
    cases += [add_case(rng, 999, "none", ties=True) for _ in range(3)]  # the sign term bites
    return [add_c(i, c) for i, c in enumerate(cases)]


def test_add_cases_cover_the_edges(addc):
    cs = [c["c"] for c in addc]
    assert {c["n"] % 4 for c in addc} == {0, 1, 2, 3}
    assert any(c["signfix"] for c in cs) and any(not c["signfix"] for c in cs)
    assert {c["big"] for c in cs} == {0, 1} and any(c["lo"] > -128 for c in cs)
    assert any(c["hi"] < 127 for c in cs)
    # ties below zero: outputs that only the sign term gets right (TFLM rounds half away from 0)
    assert any(c["signfix"] and not np.array_equal(_add_without_sign(t), t["want"])
               for c, t in zip(cs, addc))


def _add_without_sign(t):
    """The kernel's arithmetic (pack_ew.add_fast) on the case's inputs with the sign term off."""
    from mcuforge.codegen_c import pack_ew
    c = t["c"]
    a, b = t["case"]["a"] & 0xFF, t["case"]["b"] & 0xFF
    big, small = (a, b) if c["big"] == 0 else (b, a)
    return pack_ew.add_fast(big, small, dict(c, signfix=0)).astype(np.int8)


@pytest.mark.parametrize("opt", ["-O0", "-O2"])
def test_add_host_portable(addc, opt, tmp_path):
    require_tools("gcc")
    check(addc, "host", [opt, "-fsanitize=address,undefined", "-fno-sanitize-recover=all"],
          tmp_path)


@pytest.mark.parametrize("kind,opt", M55, ids=[f"{k}{o.replace(' ', '')}" for k, o in M55])
def test_add_m55_qemu(addc, kind, opt, tmp_path):
    require_tools("arm-none-eabi-gcc", "qemu-system-arm")
    check(addc, kind, opt.split(), tmp_path)


def test_add_model_against_tflite_micro():
    """The numpy ADD above (and its parameters) equal tflite-micro's int8 ADD."""
    runtime = pytest.importorskip("tflite_micro.python.tflite_micro.runtime")
    from tests import tfl_build as tb
    rng = np.random.default_rng(3)
    for act in ("none", "relu"):
        (s1, s2, so), (z1, z2, zo) = rng.uniform(0.01, 0.2, 3), rng.integers(-100, 100, 3)
        m = tb.Model()
        a = m.tensor("a", (1, 4, 5, 6), "int8", scale=float(s1), zero_point=int(z1))
        b = m.tensor("b", (1, 4, 5, 6), "int8", scale=float(s2), zero_point=int(z2))
        y = m.tensor("y", (1, 4, 5, 6), "int8", scale=float(so), zero_point=int(zo))
        m.op("ADD", [a, b], [y], "AddOptions",
             FusedActivationFunction={"none": 0, "relu": 1}[act])
        m.io([a, b], [y])
        xa, xb = rng.integers(-128, 128, (2, 1, 4, 5, 6)).astype(np.int8)
        it = runtime.Interpreter.from_bytes(m.build(), arena_size=1 << 16)
        it.set_input(xa, 0)
        it.set_input(xb, 1)
        it.invoke()
        got = np.asarray(it.get_output(0))
        lo = max(-128, int(zo)) if act == "relu" else -128
        p = tflm_add_params(s1, int(z1), s2, int(z2), so, int(zo), lo, 127)
        assert (tflm_add(xa, xb, p) == got).all()


# ---- AVERAGE_POOL_2D and MAX_POOL_2D ----------------------------------------------------------
def tflm_pool(x, fh, fw, sh, sw, pt, pl, oh, ow, lo, hi, op):
    """reference_integer_ops::AveragePool / MaxPool (int8): windows clipped to the image;
    the average rounds half away from zero (C division of sum +- count / 2)."""
    h, w, c = x.shape
    out = np.zeros((oh, ow, c), np.int64)
    for oy in range(oh):
        for ox in range(ow):
            y0, x0 = oy * sh - pt, ox * sw - pl
            win = x[max(y0, 0):min(y0 + fh, h), max(x0, 0):min(x0 + fw, w)].astype(np.int64)
            win = win.reshape(-1, c)
            if op == "max":
                out[oy, ox] = win.max(axis=0)
            else:
                n, sm = len(win), win.sum(axis=0)
                q = np.where(sm > 0, sm + n // 2, sm - n // 2)
                out[oy, ox] = np.sign(q) * (np.abs(q) // n)
    return np.clip(out, lo, hi).astype(np.int8)


def pool_case(rng, h, w, c, f=None, s=(1, 1), same=False, act="none", op="avg"):
    fh, fw = f or (h, w)
    oh, pt = tflm_padding(h, fh, s[0], same)
    ow, pl = tflm_padding(w, fw, s[1], same)
    zo = int(rng.integers(-128, 100))
    lo, hi = -128, 127
    if act == "relu":
        lo = zo
    elif act == "relu6":
        lo, hi = zo, min(127, zo + int(rng.integers(5, 100)))
    x = rng.integers(-128, 128, (h, w, c))
    if rng.random() < 0.3:  # sums of one sign, ties of the rounding
        x = np.minimum(np.abs(x), 127) * (1 if rng.random() < 0.5 else -1)
    return dict(x=x, g=(h, w, c, fh, fw, s[0], s[1], pt, pl, oh, ow), lo=lo, hi=hi, op=op,
                want=tflm_pool(x, fh, fw, s[0], s[1], pt, pl, oh, ow, lo, hi, op))


def pool_c(i, case):
    geom = ", ".join(str(int(v)) for v in case["g"])
    decls = (H.arr(f"x{i}", "int8_t", case["x"])
             + f"static const mf_mve_dw_pool_geom g{i} = {{{geom}}};\n")
    call = f"mf_mve_dw_{case['op']}pool_s8(x{i}, y, &g{i}, {case['lo']}, {case['hi']})"
    return dict(decls=decls, call=call, want=case["want"], n=case["want"].size, sn=0,
                case=case)


@pytest.fixture(scope="module")
def poolc():
    rng = np.random.default_rng(9)
    acts = ["none", "relu", "relu6"]
    shapes = [(25, 5, 64, None, (1, 1), False), (8, 8, 64, None, (1, 1), False),
              (3, 3, 256, None, (1, 1), False), (1, 1, 1, None, (1, 1), False),
              (5, 7, 13, (3, 3), (2, 2), True), (6, 9, 8, (2, 3), (2, 1), False),
              (7, 6, 17, (4, 2), (1, 1), True), (16, 17, 9, None, (1, 1), False),  # 272 taps
              (4, 4, 31, (2, 2), (2, 2), False), (9, 5, 7, (3, 3), (1, 1), True),
              (2, 3, 25, None, (1, 1), False), (15, 17, 3, None, (1, 1), False)]  # 255 taps
    out = []
    for i, (h, w, c, f, st, same) in enumerate(shapes):
        for op in ("avg", "max"):
            out.append(pool_c(len(out), pool_case(rng, h, w, c, f, st, same, acts[i % 3], op)))
    return out


def test_pool_division_by_multiply_is_exact():
    """|q| = (|sum| + count / 2) * ceil(2^32 / count) >> 32 equals the C division for every
    count 2..255 and every |sum| <= 128 * count (the MVE average pool's division)."""
    for count in range(2, 256):
        a = np.arange(0, 128 * count + count // 2 + 1, dtype=np.uint64)
        recip = np.uint64((2**32 - 1) // count + 1)
        assert ((a * recip) >> np.uint64(32) == a // np.uint64(count)).all(), count


def test_pool_cases_cover_the_edges(poolc):
    gs = [c["case"]["g"] for c in poolc]
    assert any(g[2] % 16 and g[2] % 16 <= 8 for g in gs) and any(g[2] % 16 > 8 for g in gs)
    assert any(g[3] * g[4] > 255 for g in gs) and any(g[3] * g[4] == 255 for g in gs)
    assert any(g[9] * g[10] > 1 for g in gs) and any(c["case"]["lo"] > -128 for c in poolc)


@pytest.mark.parametrize("opt", ["-O0", "-O2"])
def test_pool_host_portable(poolc, opt, tmp_path):
    require_tools("gcc")
    check(poolc, "host", [opt, "-fsanitize=address,undefined", "-fno-sanitize-recover=all"],
          tmp_path)


@pytest.mark.parametrize("kind,opt", M55, ids=[f"{k}{o.replace(' ', '')}" for k, o in M55])
def test_pool_m55_qemu(poolc, kind, opt, tmp_path):
    require_tools("arm-none-eabi-gcc", "qemu-system-arm")
    check(poolc, kind, opt.split(), tmp_path)


# ---- ADD and pools through their schedules (the models of test_sched_eltwise) ----------------
def _ew_cases():
    import test_sched_eltwise as te
    return [c for c in te.CASES if not c[0].startswith("mul")]


EW = _ew_cases()
MVE_FN = {"add": "mf_mve_dw_add_s8", "avg_pool2d": "mf_mve_dw_avgpool_s8",
          "max_pool2d": "mf_mve_dw_maxpool_s8"}


@pytest.mark.parametrize("name,kind,kw", EW, ids=[c[0] for c in EW])
def test_ew_schedule_equals_reference(name, kind, kw):
    import test_sched_eltwise as te
    from mcuforge.codegen_c.evaluate import run_kernel
    from mcuforge.codegen_c.kernels import lower_node
    from mcuforge.codegen_c.lower import reference_kernel
    from mcuforge.frontend.tflite import load_tflite
    model, inputs = te.build(name, kind, kw)
    g = load_tflite(model)
    node = g.nodes[0]
    ref = reference_kernel(node, g, "k")
    k = lower_node(node, g, "k", m55())
    want_fn = MVE_FN.get(node.op)
    if want_fn and name not in te.DECLINED:
        assert k.schedule == want_fn, k.schedule
    arrays = {p.name: inputs[g.tensors[t].name] for p, t in
              zip([b for b in ref.params if b.kind == "in"], node.inputs)}
    for row in range(2):
        ys = []
        for kern in (ref, k):
            y = np.zeros(g.tensors[g.outputs[0]].size, np.int8)
            run_kernel(kern, {**{n: a[row].reshape(-1).copy() for n, a in arrays.items()},
                              "y": y})
            ys.append(y)
        assert ys[1].tolist() == ys[0].tolist()


E2E_EW = [c for c in EW if c[0] in ("add_1", "add_2", "add_resnet", "add_tail", "pool_kws",
                                      "pool_big", "pool_same", "max_pool_same", "max_pool_vww",
                                      "pool_resnet")]


@pytest.mark.parametrize("name,kind,kw", E2E_EW, ids=[c[0] for c in E2E_EW])
def test_ew_m55_equals_tflm(name, kind, kw):
    import test_sched_eltwise as te
    from conftest import require_tflm
    from mcuforge import runner
    require_tflm()
    require_tools("arm-none-eabi-gcc", "qemu-system-arm")
    model, inputs = te.build(name, kind, kw)
    want = te.tflm_run(model, inputs)
    got = runner.run(model, inputs if len(inputs) > 1 else next(iter(inputs.values())),
                     board="mps3-an547")
    np.testing.assert_array_equal(got, want)


# ---- the MLPerf models on QEMU mps3-an547 against tflite-micro -------------------------------
@pytest.mark.parametrize("stem", ["kws_ref_model", "vww_96_int8", "pretrainedResnet_quant"])
def test_mlperf_m55_equals_tflm(stem):
    """KWS and VWW (depthwise, average pool) and ResNet-8 (ADD, average pool) on the emulated
    Cortex-M55 through the Helium kernels: every output byte of random inputs (3; VWW one, its
    inputs are firmware constants and 512 KB of flash hold one beside the weights) equals
    tflite-micro's, and the kernels are the ones linked."""
    from conftest import mlperf_model, require_tflm
    from mcuforge import runner
    from mcuforge.api import load
    from mcuforge.codegen_c.kernels import lower_node
    from mcuforge.optimizer.pipeline import optimize
    from mcuforge.tools import tflm
    require_tflm()
    require_tools("arm-none-eabi-gcc", "qemu-system-arm")
    path = mlperf_model(stem)
    g = optimize(load(path))
    used = {lower_node(n, g, "k", m55()).schedule for n in g.nodes
            if n.op in ("depthwise_conv2d", "add", "avg_pool2d")}
    want = {"kws_ref_model": {"mf_mve_dw_conv_s8", "mf_mve_dw_avgpool_s8"},
            "vww_96_int8": {"mf_mve_dw_conv_s8", "mf_mve_dw_avgpool_s8"},
            "pretrainedResnet_quant": {"mf_mve_dw_add_s8", "mf_mve_dw_avgpool_s8"}}[stem]
    assert used == want, used
    t = g.tensors[g.inputs[0]]
    n = 1 if stem == "vww_96_int8" else 3
    x = np.random.default_rng(21).integers(-128, 128, (n, *t.shape)).astype(np.int8)
    y = runner.run(path, x, board="mps3-an547")
    ref = tflm.run(path.read_bytes(), [x])[0]
    assert np.array_equal(y, ref), f"{np.sum(y != ref)} of {y.size} bytes differ"
