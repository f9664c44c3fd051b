"""The depthwise 3x3 micro-kernel mf_dw3x3_s8 (runtime_c/mcuforge_dw.h, constants from
codegen_c/pack_dw.py) against TFLM's reference int8 DepthwiseConv2D written here in numpy (and
that model against tflite-micro itself): every output byte, on the host (portable C, with
sanitizers), on QEMU mps2-an386 with the DSP body at -O0/-O2/-Os/-O3 and with the portable
body, on mps2-an500 (Cortex-M7) and mps2-an385 (Cortex-M3, portable); random shapes (odd sizes,
channel counts not a multiple of 4, stride 2 on odd inputs, SAME and VALID, bands of one output
row), random zero points, none/relu/relu6 clamps and rounding ties."""
from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

import numpy as np
import pytest

from mcuforge.codegen_c import pack_dw, qparams
from conftest import require_tools

_spec = importlib.util.spec_from_file_location(
    "dw_bench", Path(__file__).parent / "nn_bench" / "dw_bench.py")
dw_bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(dw_bench)


# ---- TFLM's reference integer depthwise convolution, independent of the kernel's packing ----
def mbqm(acc, mult, shift):
    """tflite::MultiplyByQuantizedMultiplier, elementwise on int64 arrays (per-channel last)."""
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


def tflm_depthwise(x, w, bias, x_zp, mult, shift, y_zp, lo, hi, s, pad_t, pad_l, oh, ow):
    """x [H, W, C] int8, w [3, 3, C]: out-of-image taps are skipped, as in TFLM."""
    h, wd, c = x.shape
    acc = np.zeros((oh, ow, c), np.int64) + np.asarray(bias, np.int64)
    for ky in range(3):
        iy = np.arange(oh) * s - pad_t + ky
        for kx in range(3):
            ix = np.arange(ow) * s - pad_l + kx
            ok = ((iy >= 0) & (iy < h))[:, None] & ((ix >= 0) & (ix < wd))[None, :]
            v = x[np.clip(iy, 0, h - 1)][:, np.clip(ix, 0, wd - 1)].astype(np.int64) - x_zp
            acc += np.where(ok[..., None], v * w[ky, kx].astype(np.int64), 0)
    assert (np.abs(acc) < 2**31).all()
    return np.clip(mbqm(acc, mult, shift) + y_zp, lo, hi).astype(np.int8)


def tflm_padding(h, w, s, same):
    """Output size and top/left padding as TFLM's ComputePaddingHeightWidth gives them."""
    if same:
        oh, ow = -(-h // s), -(-w // s)
    else:
        oh, ow = (h - 3) // s + 1, (w - 3) // s + 1
    return oh, ow, max((oh - 1) * s + 3 - h, 0) // 2, max((ow - 1) * s + 3 - w, 0) // 2


def random_case(rng, h, w, c, s, same, act, budget, small=False):
    """small: tiny weights, inputs near the zero point and multipliers >= 0.5 on some channels,
    so that outputs without a rounding shift (post = 0) land inside the int8 range."""
    oh, ow, pt, pl = tflm_padding(h, w, s, same)
    wmax = 1 if small else int(rng.choice([3, 40, 127]))
    wts = rng.integers(-wmax, wmax + 1, (3, 3, c))
    bias = rng.integers(-20, 20, c) if small else rng.integers(-30000, 30000, c)
    x_zp, y_zp = (int(v) for v in rng.integers(-128, 128, 2))
    if small:
        x_zp, y_zp = int(rng.integers(-20, 20)), int(rng.integers(-20, 20))
    mult = rng.integers(2**30, 2**31, c)
    shift = rng.integers(-14, 2, c)
    tie = rng.random(c) < 0.3  # power-of-two scales: many accumulators round half way
    mult[tie], shift[tie] = 2**30, rng.integers(-7, 0, tie.sum())
    if small:
        shift = np.where(np.arange(c) % 3 == 0, 0, rng.integers(-3, 0, c))
    lo, hi = -128, 127
    if act == "relu":
        lo = max(-128, y_zp)
    elif act == "relu6":
        lo, hi = max(-128, y_zp), min(127, y_zp + int(rng.integers(5, 120)))
    x = rng.integers(-128, 128, (h, w, c))
    if small:
        x = np.clip(x_zp + rng.integers(-6, 7, (h, w, c)), -128, 127)
    geom = pack_dw.geometry(h, w, c, oh, ow, s, pt, pl, budget=budget)
    pk = pack_dw.pack_dw(wts, bias, x_zp, mult, shift, y_zp, geom["transpose"])
    assert geom is not None and pk is not None
    want = tflm_depthwise(x, wts, bias, x_zp, mult, shift, y_zp, lo, hi, s, pt, pl, oh, ow)
    return dict(geom=geom, x=x, pk=pk, x_zp=x_zp, lo=lo, hi=hi,
                signfix=pack_dw.pack.needs_signfix(y_zp, lo), want=want)


def make_cases(seed=0, n=28):
    rng = np.random.default_rng(seed)
    fixed = [(1, 1, 1, 1, True), (3, 3, 4, 1, False), (5, 7, 5, 2, True), (7, 9, 3, 2, False),
             (25, 5, 13, 1, True), (6, 6, 17, 1, True), (9, 11, 6, 2, True), (2, 3, 9, 2, True),
             (5, 6, 47, 1, True),  # small image, more channels than one pass holds
             (3, 3, 5, 1, True), (2, 2, 6, 1, True),  # rows of 3 and 2 outputs at stride 1
             (6, 6, 5, 2, True), (4, 13, 7, 2, True)]  # rows of 3 and 7 at stride 2
    shapes = fixed + [(int(rng.integers(3, 14)), int(rng.integers(3, 14)),
                       int(rng.integers(1, 20)), int(rng.integers(1, 3)), bool(rng.random() < .6))
                      for _ in range(n - len(fixed))]
    acts = ["none", "relu", "relu6"]
    out = [random_case(rng, h, w, c, s, same, acts[i % 3], [0, 300, 4096][i % 3 if i > 2 else 2])
           for i, (h, w, c, s, same) in enumerate(shapes)]
    for c in out[len(fixed)::3]:  # these through the generic entry, the others their named one
        c["generic"] = True
    # channels with and without a rounding shift side by side, outputs not clamped away
    return out + [random_case(rng, 7, 6, 7, s, True, "none", 4096, small=True) for s in (1, 2)]


@pytest.fixture(scope="module")
def cases():
    return make_cases()


def check(cases, kind, flags, tmp_path):
    Path(tmp_path).mkdir(parents=True, exist_ok=True)
    exe = dw_bench.build(cases, kind, flags, tmp_path)
    rows, ok, log = dw_bench.run(exe, kind)
    assert len(rows) == len(cases), log
    bad = [(i, b) for i, (_, b) in enumerate(rows) if b]
    assert not bad and ok, (bad, log[-500:])


def test_cases_cover_the_edges(cases):
    geoms = [c["geom"] for c in cases]
    assert any(g["c"] % 4 for g in geoms) and any(g["stride"] == 2 and g["w"] % 2 for g in geoms)
    assert any(g["rows"] == 3 and g["oh"] > 1 for g in geoms)  # bands of one output row
    assert any(g["ow"] % 2 for g in geoms) and any(c["lo"] > -128 for c in cases)
    # every row-width class of the DSP body (the kernel's view): pairs, pairs and a last output,
    # four at a time (both strides, with a clamp and with the sign term)
    vow = [(g["oh"] if g["transpose"] else g["ow"], g["stride"], c) for g, c in zip(geoms, cases)]
    assert {w % 4 for w, _, _ in vow} == {0, 1, 2, 3}
    quads = [(s, c) for w, s, c in vow if w % 4 == 0]
    assert {s for s, _ in quads} == {1, 2} and any(c["lo"] > -128 for _, c in quads)
    assert any(c["signfix"] for _, c in quads)
    # every row shape (pack_dw.entry's k: quads, then a pair, then a single) at both strides,
    # through its named entry
    shapes = {(g["stride"], pack_dw.entry(g, c["signfix"], c["lo"], c["hi"])[-1])
              for g, c in zip(geoms, cases) if not c.get("generic")}
    assert shapes == {(s, str(k)) for s in (1, 2) for k in range(1, 8)}
    # the DSP widening of 4 channels: a first pixel alone (odd left padding) or not, then 4
    # pixels an iteration, 2 and 1 left over
    wid = {(pl & 1, (w - (pl & 1)) % 4) for w, pl in
           ((g["h"], g["pad_t"]) if g["transpose"] else (g["w"], g["pad_l"]) for g in geoms
            if g["c"] >= 4)}
    assert wid == {(h, r) for h in (0, 1) for r in range(4)}
    # small images: passes of more than 4 channels, a last pass with a partial group of 4
    assert any(g["cg"] > 4 and g["c"] > g["cg"] and g["c"] % g["cg"] % 4 for g in geoms)
    assert any(g["cg"] > 4 and g["c"] < g["cg"] for g in geoms)
    assert any(c["signfix"] for c in cases) and any(g["pad_l"] == 0 for g in geoms)
    assert any(g["transpose"] for g in geoms) and not all(g["transpose"] for g in geoms)
    # a sign term on, with channels of post = 0 (no rounding) whose outputs are not all clamped
    assert any(c["signfix"] and (c["pk"][:, 9] == 0).any() and (c["pk"][:, 9] != 0).any()
               and (np.abs(c["want"].astype(int)) < 100).mean() > .5 for c in cases)


@pytest.mark.parametrize("opt", ["-O0", "-O2"])
def test_host_portable(cases, opt, tmp_path):
    require_tools("gcc")
    check(cases, "host", [opt, "-fsanitize=address,undefined", "-fno-sanitize-recover=all"],
          tmp_path)


ARM = [("m4", "-O0"), ("m4", "-O2"), ("m4", "-Os"), ("m4", "-O3"), ("m4-portable", "-O2"),
       ("m7", "-O2")]  # Cortex-M7 (mps2-an500): the same DSP body


@pytest.mark.parametrize("kind,opt", ARM, ids=[f"{k}{o}" for k, o in ARM])
def test_arm_qemu(cases, kind, opt, tmp_path):
    require_tools("arm-none-eabi-gcc", "qemu-system-arm")
    check(cases, kind, [opt], tmp_path)


def test_arm_m3_portable(tmp_path):
    """Cortex-M3 (no DSP extension): MF_USE_DSP defaults to 0 and the portable body runs."""
    require_tools("arm-none-eabi-gcc", "qemu-system-arm")
    check(make_cases(seed=1, n=10), "m3", ["-O2"], tmp_path)


def test_pack_refusals():
    w = np.ones((3, 3, 4), np.int64)
    ok = pack_dw.geometry(8, 8, 4, 8, 8, 1, 1, 1)
    assert ok is not None and pack_dw.scratch_bytes(ok) % 4 == 0
    assert pack_dw.geometry(8, 8, 4, 8, 8, 1, 1, 1, kernel=(5, 5)) is None
    assert pack_dw.geometry(8, 8, 4, 8, 8, 1, 1, 1, dilation=(2, 2)) is None
    assert pack_dw.geometry(8, 8, 4, 8, 8, 1, 1, 1, depth_multiplier=2) is None
    assert pack_dw.geometry(8, 8, 4, 3, 3, 3, 0, 0) is None
    assert pack_dw.geometry(8, 8, 4, 4, 8, (2, 1), 0, 1) is None
    assert pack_dw.pack_dw(w, None, 0, [2**30] * 4, [0] * 4, 0) is not None
    assert pack_dw.pack_dw(np.ones((5, 5, 4)), None, 0, [2**30] * 4, [0] * 4, 0) is None
    # a left shift of 9 makes the weights 2^10 times larger: 127 * 1024 leaves int16
    assert pack_dw.pack_dw(w * 127, None, 0, [2**30] * 4, [9] * 4, 0) is None
    assert pack_dw.pack_dw(w, [2**31 - 10] * 4, -100, [2**30] * 4, [0] * 4, 0) is None


def test_scratch_budget():
    """VWW's widest layer stays inside the default budget; KWS's (walked by columns: 5 rows of
    25 + 2 padding) fits in one band."""
    g = pack_dw.geometry(48, 48, 8, 48, 48, 1, 1, 1)
    assert pack_dw.scratch_bytes(g) <= pack_dw.DEFAULT_BUDGET and g["rows"] < 48
    g = pack_dw.geometry(25, 5, 64, 25, 5, 1, 1, 1)
    assert g["transpose"] and g["rows"] == 7 and pack_dw.scratch_bytes(g) < 2048


# ---- the numpy model above against tflite-micro, and the kernel against both ----------------
def tflm_model(h, w, c, s, same, act, rng):
    from tests import tfl_build as tb
    sx, sy = 0.05, 0.09
    ws = rng.uniform(0.002, 0.02, c).astype(np.float32)
    x_zp, y_zp = -7, 11
    wts = rng.integers(-127, 128, (1, 3, 3, c)).astype(np.int8)
    bias = rng.integers(-2000, 2000, c).astype(np.int32)
    m = tb.Model()
    x = m.tensor("x", (1, h, w, c), "int8", scale=sx, zero_point=x_zp)
    wt = m.tensor("w", (1, 3, 3, c), "int8", data=wts, scale=list(ws), zero_point=[0] * c, axis=3)
    b = m.tensor("b", (c,), "int32", data=bias, scale=list(ws * np.float32(sx)),
                 zero_point=[0] * c)
    oh, ow, pt, pl = tflm_padding(h, w, s, same)
    y = m.tensor("y", (1, oh, ow, c), "int8", scale=sy, zero_point=y_zp)
    m.op("DEPTHWISE_CONV_2D", [x, wt, b], [y], "DepthwiseConv2DOptions",
         Padding=0 if same else 1, StrideW=s, StrideH=s, DepthMultiplier=1,
         FusedActivationFunction={"none": 0, "relu": 1, "relu6": 3}[act], version=2)
    m.io([x], [y])
    mult, shift = qparams.conv_output_multipliers(sx, ws, sy)
    lo, hi = qparams.activation_range_int8(act, sy, y_zp)
    return m.build(), dict(w=wts[0], bias=bias, x_zp=x_zp, mult=mult, shift=shift, y_zp=y_zp,
                           lo=lo, hi=hi, s=s, pt=pt, pl=pl, oh=oh, ow=ow)


def test_against_tflite_micro(tmp_path):
    runtime = pytest.importorskip("tflite_micro.python.tflite_micro.runtime")
    rng = np.random.default_rng(7)
    cases = []
    for h, w, c, s, same, act in [(9, 7, 6, 1, True, "relu6"), (11, 8, 5, 2, True, "none"),
                                  (7, 9, 3, 2, False, "relu")]:
        model, p = tflm_model(h, w, c, s, same, act, rng)
        x = rng.integers(-128, 128, (h, w, c)).astype(np.int8)
        it = runtime.Interpreter.from_bytes(model, arena_size=1 << 20)
        it.set_input(x[None], 0)
        it.invoke()
        got = np.asarray(it.get_output(0))[0]
        ref = tflm_depthwise(x, p["w"], p["bias"], p["x_zp"], p["mult"], p["shift"], p["y_zp"],
                             p["lo"], p["hi"], p["s"], p["pt"], p["pl"], p["oh"], p["ow"])
        assert (ref == got).all()
        geom = pack_dw.geometry(h, w, c, p["oh"], p["ow"], s, p["pt"], p["pl"])
        pk = pack_dw.pack_dw(p["w"], p["bias"], p["x_zp"], p["mult"], p["shift"], p["y_zp"],
                             geom["transpose"])
        cases.append(dict(geom=geom, x=x, pk=pk, x_zp=p["x_zp"], lo=p["lo"], hi=p["hi"],
                          signfix=pack_dw.pack.needs_signfix(p["y_zp"], p["lo"]), want=got))
    check(cases, "host", ["-O2"], tmp_path / "host")
    if shutil.which("arm-none-eabi-gcc") and shutil.which("qemu-system-arm"):
        check(cases, "m4", ["-O2"], tmp_path / "m4")


def test_benchmarked_shapes_m4(tmp_path):
    """The layers dw_bench.py measures (KWS, VWW), full size, DSP body at -O2: bit-exact."""
    require_tools("arm-none-eabi-gcc", "qemu-system-arm")
    rng = np.random.default_rng(11)
    acts = ["relu", "none", "relu6"]
    cases = [random_case(rng, h, w, c, s, True, acts[i % 3], pack_dw.DEFAULT_BUDGET)
             for i, (_, h, w, c, s) in enumerate(dw_bench.SHAPES)]
    check(cases, "m4", ["-O2"], tmp_path)


@pytest.mark.parametrize("entry,kind", [("mf_dw3x3_s8_1_4", "m4"), ("mf_dw3x3_s8_2fc_6", "m4"),
                                        ("mf_dw3x3_s8_1c_3", "m4-portable")])
def test_an_entry_links_only_its_variant(entry, kind, tmp_path):
    """A model whose layers name one entry carries that variant's channel function only (a
    stride-1 model no stride-2 code, no clamp or sign-term code and no row shape it does not
    use); an entry with the sign term also the plain one (channels of post = 0)."""
    require_tools("arm-none-eabi-gcc")
    src = tmp_path / "one.c"
    src.write_text('#include "mcuforge_dw.h"\n'
                   "void run(const int8_t *x, int8_t *y, const int32_t *pk, const mf_dw_geom *g,"
                   " int16_t *s);\n"
                   "void run(const int8_t *x, int8_t *y, const int32_t *pk, const mf_dw_geom *g,"
                   f" int16_t *s) {{ {entry}(x, y, pk, g, 0, -128, 127, 0, s); }}\n")
    obj = tmp_path / "one.o"
    for opt in ("-O2", "-Os"):
        dw_bench.subprocess.run(
            ["arm-none-eabi-gcc", "-mthumb", *dw_bench.CPU[kind], *dw_bench.WARN, opt, "-c",
             "-I", str(dw_bench.ROOT / "runtime_c"), str(src), "-o", str(obj)], check=True)
        nm = dw_bench.subprocess.run(["arm-none-eabi-nm", str(obj)], capture_output=True,
                                     text=True, check=True).stdout
        chans = sorted(ln.split()[-1] for ln in nm.splitlines() if "mf_dw_chans" in ln)
        v = entry[len("mf_dw3x3_s8_"):]  # <s>[f][c]_<k>
        want = sorted({f"mf_dw_chans_{v}", f"mf_dw_chans_{v.replace('f', '')}"})
        assert chans == want, (opt, nm)
        assert "mf_dw3x3_s8" not in nm.replace(entry, ""), nm  # not the generic entry either
