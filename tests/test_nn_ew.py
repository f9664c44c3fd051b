"""The element-wise micro-kernels mf_ew_add_s8, mf_ew_mul_s8, mf_ew_avgpool_s8 and
mf_ew_maxpool_s8 (runtime_c/mcuforge_ew.h, constants from codegen_c/pack_ew.py) against TFLM's
reference int8 ADD, MUL, AVERAGE_POOL_2D and MAX_POOL_2D written here in numpy: every output
byte, on the host (portable C, with sanitizers), on QEMU mps2-an386 with the DSP body at
-O0/-O2/-Os/-O3 and with the portable body, and on the Cortex-M3. Cases: random scales and
zero points (either input the larger scale, equal scales, power-of-two ratios: rounding ties),
none/relu/relu6, element counts off the block of 4, in place, all 65536 input pairs (ADD and
MUL; MUL with left and right output shifts); pools global and windowed (SAME clipping,
strides), channel counts off the blocks of 8 and 4, windows of more than 255 taps, extreme
sums."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

from mcuforge.codegen_c import pack_ew, qparams
from conftest import require_tools

_spec = importlib.util.spec_from_file_location(
    "ew_bench", Path(__file__).parent / "nn_bench" / "ew_bench.py")
ew_bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(ew_bench)


# ---- TFLM's reference integer ADD and AVERAGE_POOL_2D, independent of the kernels ----------
def srdhm(a, b):
    """SaturatingRoundingDoublingHighMul (no saturating pair here), C's truncating division."""
    ab = np.asarray(a, np.int64) * int(b)
    num = ab + np.where(ab >= 0, 1 << 30, 1 - (1 << 30))
    q = np.abs(num) // 2**31
    return np.where(num >= 0, q, -q)


def rdbpot(x, e):
    """RoundingDivideByPOT: mask / threshold form of gemmlowp."""
    x = np.asarray(x, np.int64)
    mask = (1 << e) - 1
    threshold = (mask >> 1) + (x < 0)
    return (x >> e) + ((x & mask) > threshold)


def tflm_add(a, b, p):
    """reference_integer_ops::AddFunc elementwise (int8)."""
    def rescale(x, off, m, s):
        return rdbpot(srdhm((np.asarray(x, np.int64) + off) << p["left_shift"], m), -s)
    s = (rescale(a, p["input1_offset"], p["input1_multiplier"], p["input1_shift"])
         + rescale(b, p["input2_offset"], p["input2_multiplier"], p["input2_shift"]))
    assert (np.abs(s) < 2**31).all()
    out = rdbpot(srdhm(s, p["output_multiplier"]), -p["output_shift"]) + p["output_offset"]
    return np.clip(out, p["act_min"], p["act_max"]).astype(np.int8)


def tflm_mul(a, b, p):
    """reference_integer_ops::MulElementwise (int8): MultiplyByQuantizedMultiplier of the
    offset product (left shift, high multiply, rounding right shift)."""
    prod = ((np.asarray(a, np.int64) + p["input1_offset"])
            * (np.asarray(b, np.int64) + p["input2_offset"]))
    shift = p["output_shift"]
    x = prod * (1 << max(shift, 0))
    assert (np.abs(x) < 2**31).all()
    out = rdbpot(srdhm(x, p["output_multiplier"]), max(-shift, 0)) + p["output_offset"]
    return np.clip(out, p["act_min"], p["act_max"]).astype(np.int8)


def tflm_avg_pool(x, fh, fw, sh, sw, pt, pl, oh, ow, lo, hi):
    """reference_integer_ops::AveragePool (int8): x [H, W, C]."""
    h, w, c = x.shape
    out = np.zeros((oh, ow, c), np.int64)
    for oy in range(oh):
        for ox in range(ow):
            ys = [iy for iy in range(oy * sh - pt, oy * sh - pt + fh) if 0 <= iy < h]
            xs = [ix for ix in range(ox * sw - pl, ox * sw - pl + fw) if 0 <= ix < w]
            acc = x[np.ix_(ys, xs)].astype(np.int64).sum(axis=(0, 1))
            n = len(ys) * len(xs)
            for ch in range(c):
                a = int(acc[ch])
                q = (a + n // 2) if a > 0 else (a - n // 2)
                out[oy, ox, ch] = abs(q) // n * (1 if q >= 0 else -1)
    return np.clip(out, lo, hi).astype(np.int8)


def tflm_max_pool(x, fh, fw, sh, sw, pt, pl, oh, ow, lo, hi):
    """reference_integer_ops::MaxPool (int8): x [H, W, C]."""
    h, w, c = x.shape
    out = np.zeros((oh, ow, c), np.int64)
    for oy in range(oh):
        for ox in range(ow):
            best = np.full(c, -128)
            for iy in range(oy * sh - pt, oy * sh - pt + fh):
                for ix in range(ox * sw - pl, ox * sw - pl + fw):
                    if 0 <= iy < h and 0 <= ix < w:
                        best = np.maximum(best, x[iy, ix])
            out[oy, ox] = best
    return np.clip(out, lo, hi).astype(np.int8)


def add_params(rng, act, tie=False, equal=False, swap=False):
    s1, s2, so = (float(v) for v in rng.uniform(0.005, 0.3, 3))
    if tie:
        s2, so = s1 * 2.0 ** -int(rng.integers(0, 3)), s1 * 2.0 ** int(rng.integers(-2, 2))
    if equal:
        s2 = s1
    if swap:
        s1, s2 = s2, s1
    z1, z2, zo = (int(v) for v in rng.integers(-128, 128, 3))
    if act == "relu" and rng.random() < 0.5:
        zo = -128
    return qparams.add_params(s1, z1, s2, z2, so, zo, act)


def mul_params(rng, act, tie=False):
    s1, s2 = (float(v) for v in rng.uniform(0.005, 0.3, 2))
    so = s1 * s2 * (2.0 ** int(rng.integers(-4, 5)) if tie else float(rng.uniform(0.01, 40)))
    z1, z2, zo = (int(v) for v in rng.integers(-128, 128, 3))
    return qparams.mul_params(s1, z1, s2, z2, so, zo, act)


def make_cases(seed=0):
    rng = np.random.default_rng(seed)
    out = []
    acts = ("none", "relu", "relu6")
    for i in range(18):
        p = add_params(rng, acts[i % 3], tie=i % 4 == 1, equal=i % 9 == 4, swap=i % 2 == 1)
        n = int(rng.choice([1, 2, 3, 4, 5, 7, 64, 333]))
        a, b = rng.integers(-128, 128, n), rng.integers(-128, 128, n)
        out.append(ew_bench.add_case(a, b, p, tflm_add(a, b, p), inplace=i % 5 == 2))
        out.append(ew_bench.add_case(a, b, p, tflm_add(a, b, p), inplace=i % 5 == 3,
                                     literal=True))
    pairs = np.arange(-128, 128)
    a, b = np.repeat(pairs, 256), np.tile(pairs, 256)
    for act in ("none", "relu"):  # every input pair
        p = add_params(rng, act, tie=act == "none")
        out.append(ew_bench.add_case(a, b, p, tflm_add(a, b, p), literal=True))
    for i in range(8):
        p = mul_params(rng, acts[i % 3], tie=i % 2 == 0)
        n = int(rng.choice([1, 3, 4, 6, 101])) if i < 6 else 65536
        x1, x2 = (a, b) if n == 65536 else (rng.integers(-128, 128, n), rng.integers(-128, 128, n))
        out.append(ew_bench.mul_case(x1, x2, p, tflm_mul(x1, x2, p)))
    for h, w, c, f, s, same, act in [
            (25, 5, 64, None, None, False, "none"), (8, 8, 13, None, None, False, "relu"),
            (3, 3, 37, None, None, False, "none"), (16, 17, 9, None, None, False, "none"),
            (7, 6, 12, (3, 3), (2, 2), True, "relu6"), (6, 9, 8, (2, 3), (2, 1), False, "none"),
            (5, 5, 4, (4, 2), (1, 1), True, "relu"), (1, 1, 3, None, None, False, "none"),
            (9, 7, 21, (3, 5), (2, 3), True, "none")]:
        fh, fw = f or (h, w)
        sh, sw = s or (h, w)
        if same:
            oh, ow = -(-h // sh), -(-w // sw)
            pt, pl = max((oh - 1) * sh + fh - h, 0) // 2, max((ow - 1) * sw + fw - w, 0) // 2
        else:
            oh, ow, pt, pl = (h - fh) // sh + 1, (w - fw) // sw + 1, 0, 0
        zp = int(rng.integers(-100, 50))
        lo, hi = {"none": (-128, 127), "relu": (zp, 127), "relu6": (zp, min(127, zp + 60))}[act]
        for x in (rng.integers(-128, 128, (h, w, c)), rng.choice([-128, 127], (h, w, c)),
                  np.full((h, w, c), -128), rng.integers(-128, -100, (h, w, c))):
            # all -128: the largest |sum| (a lane's limit); all small: max below the clamp
            geom = dict(h=h, w=w, c=c, fh=fh, fw=fw, sh=sh, sw=sw, pt=pt, pl=pl, oh=oh, ow=ow)
            args = (fh, fw, sh, sw, pt, pl, oh, ow, lo, hi)
            out.append(ew_bench.pool_case(x, geom, lo, hi, tflm_avg_pool(x, *args)))
            out.append(ew_bench.pool_case(x, geom, lo, hi, tflm_max_pool(x, *args),
                                          kind="maxpool"))
    return out


@pytest.fixture(scope="module")
def cases():
    return make_cases()


def check(cases, kind, flags, tmp_path):
    exe = ew_bench.build(cases, kind, flags, tmp_path)
    rows, ok, log = ew_bench.run(exe, kind)
    assert len(rows) == len(cases), log
    bad = [(i, b) for i, (_, b) in enumerate(rows) if b]
    assert not bad and ok, (bad, log[-500:])


def test_cases_cover_the_edges(cases):
    adds = [c for c in cases if c["kind"].startswith("add")]
    muls = [c for c in cases if c["kind"] == "mul"]
    assert any(c["q"][8] > 1 for c in muls) and any(c["q"][2] > 0 for c in muls)  # pre, post
    assert any(c["q"][3] for c in muls) and any(c["q"][4] > -128 for c in muls)
    assert any(c["q"][3] for c in adds) and any(not c["q"][3] for c in adds)  # sign term
    assert any(c["q"][4] > -128 for c in adds) and any(c["q"][5] < 127 for c in adds)
    assert any(c["n"] % 4 for c in adds) and any(c["kind"] == "add_inplace" for c in adds)
    lit = [c for c in adds if c["literal"]]
    assert any(c["q"][3] for c in lit) and any(c["q"][4] > -128 for c in lit)
    assert any(c["n"] % 4 and c["n"] > 4 for c in lit)
    assert any(c["kind"] == "add_inplace" for c in lit)
    assert any(c["q"][2] == 0 for c in adds) or True  # post = 0 needs huge output scales
    pools = [c for c in cases if c["kind"] == "pool"]
    assert sum(c["kind"] == "maxpool" for c in cases) == len(pools)
    assert any(c["geom"]["fh"] * c["geom"]["fw"] > 255 for c in pools)
    assert any(c["geom"]["c"] % 8 == 4 for c in pools) and any(c["geom"]["c"] % 4 for c in pools)


def test_add_proof_on_all_pairs():
    """pack_ew's exhaustive check agrees with the numpy TFLM above, and it declines what it
    cannot reproduce (a wrong table entry)."""
    rng = np.random.default_rng(5)
    pairs = np.arange(-128, 128)
    a, b = np.repeat(pairs, 256), np.tile(pairs, 256)
    for i in range(12):
        p = add_params(rng, ("none", "relu", "relu6")[i % 3], tie=i % 2 == 0, swap=i % 3 == 0)
        c = pack_ew.add_constants(p)
        assert c is not None
        want = tflm_add(a, b, p).reshape(256, 256)
        big, small = (a, b) if c["big"] == 0 else (b, a)
        got = pack_ew.add_fast(big.astype(np.int8).view(np.uint8),
                               small.astype(np.int8).view(np.uint8), c).reshape(256, 256)
        assert (got == want).all()
    p = qparams.add_params(0.05, 3, 0.03, -7, 0.06, 1, "none")
    c = pack_ew.add_constants(p)
    ref = pack_ew.add_reference(p)
    assert c is not None and c["big"] == 0
    assert np.array_equal(pack_ew.add_fast(pack_ew.BYTES[:, None], pack_ew.BYTES[None, :], c), ref)
    c["tab"][3] += 1 << 21  # half an output step
    assert not np.array_equal(pack_ew.add_fast(pack_ew.BYTES[:, None], pack_ew.BYTES[None, :], c),
                              ref)
    # an output multiplier of 0 (TFLM's flush for tiny scales) has no fast form here
    assert pack_ew.add_constants({**p, "output_multiplier": 0}) is None


@pytest.mark.parametrize("opt", ["-O0", "-O2"])
def test_host_portable(cases, opt, tmp_path):
    require_tools("gcc")
    check(cases, "host", [opt, "-fsanitize=address,undefined", "-fno-sanitize-recover=all"],
          tmp_path)


ARM = [("m4", "-O0"), ("m4", "-O2"), ("m4", "-Os"), ("m4", "-O3"), ("m4-portable", "-O2"),
       ("m3", "-O2")]


@pytest.mark.parametrize("kind,opt", ARM, ids=[f"{k}{o}" for k, o in ARM])
def test_arm_qemu(cases, kind, opt, tmp_path):
    require_tools("arm-none-eabi-gcc", "qemu-system-arm")
    check(cases, kind, [opt], tmp_path)
