"""The scalar GEMM micro-kernels of runtime_c/mcuforge_scalar.h (cores without SIMD: "l64" lane
words for Armv7-M's SMLAL, "m8" int8 weights for RV32) and their schedule
(codegen_c/kernels/scalar.py), byte for byte against a numpy model of TFLM's int8 reference
kernels (tests/test_nn_gemm.py's, written independently of the packing code).

1. C harness: host gcc with ASan/UBSan, Cortex-M3 on QEMU mps2-an385 at -O0/-O2/-Os/-O3,
   riscv32-virt at -O2/-Os; random shapes with tails (rows not a multiple of 3, O not a
   multiple of 4, odd K), random zero points, clamps, rounding ties, row gaps, weights large
   enough that the lane proof needs chunks (L < K) and a K whose weights no chunk of 4 passes
   (the schedule declines: lane_chunk is None).
2. Schedule: the loop-IR evaluator runs the scheduled kernel for an M3 and a RISC-V target and
   gets the reference kernel's outputs (test_sched_layers' layers).
3. End to end: the MLPerf models on mps2-an385 (and, for RISC-V, tests/test_board_riscv.py)
   equal tflite-micro."""
from __future__ import annotations

import subprocess

import numpy as np
import pytest

from conftest import MLPERF_INT8, mlperf_model, require_tflm, require_tools
from mcuforge.codegen_c import pack
from mcuforge.codegen_c.kernels import scalar
from tests.nn_bench import harness
from test_nn_gemm import conv_geometry, quantize_multiplier, tflm_conv, tflm_outputs

SENTINEL = 0x55


def layer(rng, o, k, big=False):
    """Weights, bias, zero points, scales (some powers of two: ties), clamp."""
    w = rng.integers(-127, 128, (o, k))
    if not big:
        w = w // int(rng.integers(1, 4))
    bias = rng.integers(-3000, 3000, o)
    x_zp, y_zp = int(rng.integers(-128, 128)), int(rng.integers(-100, 100))
    act = ("none", "relu", "relu6")[int(rng.integers(0, 3))]
    if act != "none" and rng.random() < 0.4:
        y_zp = -128
    spread = 128 * 60 * np.sqrt(k)
    scales = [2.0 ** -int(rng.integers(1, 8)) if rng.random() < 0.3
              else float(60 / spread * np.exp(rng.uniform(-1.5, 1.5))) for _ in range(o)]
    ms = [quantize_multiplier(s) for s in scales]
    lo, hi = (-128, 127) if act == "none" else (max(-128, y_zp), 127 if act == "relu" else
                                               min(127, y_zp + int(rng.integers(5, 60))))
    return dict(w=w, bias=bias, x_zp=x_zp, y_zp=y_zp, mults=[m for m, _ in ms],
                shifts=[s for _, s in ms], lo=lo, hi=hi)


def kernel_data(L, fmt):
    """What the schedule passes: packed weights, folded bias, mf_rq rows, signfix, chunk."""
    w = L["w"]
    folded = pack.fold_bias(L["bias"], w, L["x_zp"])
    rq = pack.requant_params(L["mults"], L["shifts"], L["y_zp"], pack.acc_bounds(folded, w))
    assert folded is not None and rq is not None
    chunk = scalar.lane_chunk(w) if fmt == "l64" else w.shape[1]
    packed = scalar.pack_l64(w) if fmt == "l64" else scalar.pack_m8(w)
    return packed, folded, rq, pack.needs_signfix(L["y_zp"], L["lo"]), chunk


def gemm_case(rng, fmt, rows, k, o, gap=0, big=False):
    L = layer(rng, o, k, big)
    xs = rng.integers(-128, 128, (rows, k + gap))
    if big:  # rows at a channel's extreme (the lanes at the edge of their window), scales
        # that keep such accumulators inside the output range
        for r in range(0, rows, 2):
            ch, sign = int(rng.integers(0, o)), (1, -1)[r // 2 % 2]
            xs[r, :k] = np.where(L["w"][ch] * sign > 0, 127, -128)
        bound = 128 * np.abs(L["w"]).sum(axis=1) + 1
        ms = [quantize_multiplier(90.0 / b) for b in bound]
        L.update(mults=[m for m, _ in ms], shifts=[s for _, s in ms], lo=-128, hi=127,
                 y_zp=0)
    y = tflm_outputs(xs[:, :k], L["w"], L["bias"], L["x_zp"], L["mults"], L["shifts"],
                     L["y_zp"], L["lo"], L["hi"])
    return dict(kind="gemm", fmt=fmt, L=L, x=xs, rows=rows, k=k, o=o, xs=k + gap, y=y)


def conv_case(rng, fmt, h, wd, c, kh, kw, s, padding, o, big=False):
    L = layer(rng, o, kh * kw * c, big)
    x = rng.integers(-128, 128, (h, wd, c))
    w4 = L["w"].reshape(o, kh, kw, c)
    y = tflm_conv(x, w4, L["bias"], L["x_zp"], s, padding, L["mults"], L["shifts"], L["y_zp"],
                  L["lo"], L["hi"])
    oh, ow, pt, pl = conv_geometry(h, wd, kh, kw, s, padding)
    geom = (h, wd, c, kh, kw, s, s, pt, pl, oh, ow)
    p = scalar.patches_per_batch(kh * kw * c, oh * ow)
    return dict(kind="conv", fmt=fmt, L=L, x=x, geom=geom, o=o, p=p, y=y)


def tflm_dw(x, w, bias, x_zp, sh, sw, pt, pl, oh, ow, mults, shifts, y_zp, lo, hi):
    """TFLM's int8 depthwise 3x3 (multiplier 1): x [H, W, C], w [3, 3, C] -> [OH, OW, C]."""
    h, wd, c = x.shape
    xp = np.full((h + 3 + sh * oh, wd + 3 + sw * ow, c), x_zp, np.int64)
    xp[pt:pt + h, pl:pl + wd] = x
    acc = np.zeros((oh, ow, c), np.int64) + bias
    for ky in range(3):
        for kx in range(3):
            acc += (xp[ky:ky + sh * oh:sh, kx:kx + sw * ow:sw] - x_zp) * w[ky, kx]
    from test_nn_gemm import mbqm
    y = np.stack([mbqm(acc[..., ch], mults[ch], shifts[ch]) for ch in range(c)], -1)
    return np.clip(y + y_zp, lo, hi).astype(np.int8)


def dw_case(rng, h, wd, c, sh, sw, padding):
    L = layer(rng, c, 9)
    x = rng.integers(-128, 128, (h, wd, c))
    oh, ow, pt, pl = conv_geometry(h, wd, 3, 3, (sh, sw), padding)
    w = L["w"].T.reshape(3, 3, c)  # rows [C, 9] in (ky, kx) order
    y = tflm_dw(x, w, L["bias"], L["x_zp"], sh, sw, pt, pl, oh, ow, L["mults"], L["shifts"],
                L["y_zp"], L["lo"], L["hi"])
    g = scalar.dw_geometry(h, wd, c, oh, ow, sh, sw, pt, pl)
    return dict(kind="dw", fmt="dw", L=L, x=x, geom=g, o=c, y=y, transpose=ow < oh)


def all_cases(seed=0):
    rng = np.random.default_rng(seed)
    cases = []
    for fmt in ("l64", "m8"):
        for rows, k, o in ((1, 1, 1), (3, 5, 6), (4, 8, 3), (7, 64, 12), (5, 63, 13),
                           (2, 3, 9), (6, 17, 4)):
            cases.append(gemm_case(rng, fmt, rows, k, o, gap=int(rng.integers(0, 3))))
        for _ in range(6):
            cases.append(gemm_case(rng, fmt, int(rng.integers(1, 9)), int(rng.integers(1, 90)),
                                   int(rng.integers(1, 20)), gap=int(rng.integers(0, 4))))
        # large K with full-scale weights: the low lane needs chunks (L < K)
        for rows, k, o in ((3, 600, 5), (2, 1030, 6)):
            cases.append(gemm_case(rng, fmt, rows, k, o, big=True))
        for geo in ((12, 6, 1, 10, 4, 2, "SAME", 8), (9, 8, 3, 3, 3, 1, "SAME", 5),
                    (9, 7, 3, 3, 3, 2, "VALID", 6), (6, 6, 16, 3, 3, 1, "SAME", 7),
                    (7, 5, 4, 1, 1, 2, "VALID", 9), (5, 9, 2, 3, 2, 2, "SAME", 4)):
            cases.append(conv_case(rng, fmt, *geo))
        # full-scale weights over K = 576: lane chunks (l64 falls back to im2col rows)
        cases.append(conv_case(rng, fmt, 5, 6, 64, 3, 3, 1, "SAME", 5, big=True))
    # depthwise: strides 1 and 2 (and mixed), SAME / VALID, planes transposed or not, one
    # column or row, KWS's 25x5
    for h, wd, c, sh, sw, pad in ((5, 6, 3, 1, 1, "SAME"), (7, 4, 5, 2, 2, "SAME"),
                                  (25, 5, 4, 1, 1, "SAME"), (6, 9, 2, 2, 2, "VALID"),
                                  (1, 7, 3, 1, 1, "SAME"), (8, 1, 2, 1, 1, "SAME"),
                                  (9, 8, 3, 2, 1, "SAME"), (5, 11, 6, 1, 2, "VALID"),
                                  (3, 3, 9, 1, 1, "SAME"), (12, 12, 2, 2, 2, "SAME")):
        cases.append(dw_case(rng, h, wd, c, sh, sw, pad))
    return cases


def test_lane_chunk_shortens_then_declines():
    """L = K where 128 * sum|w| fits the 22-bit window, a multiple of 4 below it, None where
    not even 4 taps fit (int16-range weights: the schedule declines)."""
    w = np.full((2, 100), 127)
    assert scalar.lane_chunk(w) == 100  # 100 * 127 * 128 = 1,625,600 < 2^22
    assert scalar.lane_chunk(np.full((1, 600), 127)) == 256  # 258 * 16256 >= 2^22 > 256 * ...
    assert scalar.lane_chunk(np.full((1, 9), 9000)) is None


def test_cases_exercise_chunks():
    ls = [kernel_data(c["L"], "l64")[4] for c in all_cases() if c["fmt"] == "l64"]
    assert any(ln < c for ln, c in zip(ls, [c["k"] for c in all_cases() if c.get("k")
                                             and c["fmt"] == "l64"]))


# ---- the C program ---------------------------------------------------------------------------
def c_array(ctype, name, values):
    vals = ",".join(str(int(v)) for v in np.asarray(values).reshape(-1))
    return f"static const {ctype} {name}[] = {{{vals}}};\n"


def check(i, n, call, puts, puti) -> str:
    """C: run case i's call into ybuf (sentinel-filled), count bytes off the expected y<i>."""
    return f"""    memset(ybuf, {SENTINEL}, sizeof ybuf);
    memset(scratch, 0x77, sizeof scratch);
    {call}
    bad = 0;
    for (j = 0; j < {n}; j++) bad += ybuf[j] != y{i}[j];
    for (j = {n}; j < (int)sizeof ybuf; j++) bad += ybuf[j] != {SENTINEL};
    if (bad) {{ {puts}("case {i} bad "); {puti}((uint64_t)bad); {puts}("\\n"); total += bad; }}
"""


def program(cases, out: str) -> str:
    """A C program running every case; `out` is "bench" (tests/nn_bench) or "mf" (a riscv32
    project's mf_board.h)."""
    puts, puti = ("bench_puts", "bench_put_i64") if out == "bench" else ("mf_puts", "mf_put_u64")
    head = ['#include <stdint.h>\n#include <string.h>\n#include "mcuforge_scalar.h"\n',
            '#include "bench.h"\n' if out == "bench" else '#include "mf_board.h"\n']
    body = []
    ymax = max(c["y"].size + 8 for c in cases)
    smax = max([c["p"] * c["geom"][3] * c["geom"][4] * c["geom"][2] for c in cases
                if c["kind"] == "conv"] + [int(c["geom"][13] * c["geom"][14]) for c in cases
                                           if c["kind"] == "dw"] + [4])
    head.append(f"static int8_t ybuf[{ymax}];\nstatic int8_t scratch[{smax}];\n")
    for i, c in enumerate(cases):
        fmt = c["fmt"]
        if c["kind"] == "dw":
            L = c["L"]
            folded = pack.fold_bias(L["bias"], L["w"], L["x_zp"])
            rq = pack.requant_params(L["mults"], L["shifts"], L["y_zp"],
                                     pack.acc_bounds(folded, L["w"]))
            pk = scalar.pack_dw3(L["w"], folded, rq, c["transpose"])
            head += [c_array("int32_t", f"w{i}", pk), c_array("int32_t", f"g{i}", c["geom"]),
                     c_array("int8_t", f"x{i}", c["x"]), c_array("int8_t", f"y{i}", c["y"])]
            call = (f"mf_sc_dw3(x{i}, ybuf, w{i}, g{i}, {L['x_zp']}, {L['lo']}, {L['hi']}, "
                    f"{pack.needs_signfix(L['y_zp'], L['lo'])}, scratch);")
            body.append(check(i, c["y"].size, call, puts, puti))
            continue
        packed, folded, rq, sf, chunk = kernel_data(c["L"], fmt)
        wt = "int32_t" if fmt == "l64" else "int8_t"
        lo, hi, o = c["L"]["lo"], c["L"]["hi"], c["o"]
        head += [c_array(wt, f"w{i}", packed),
                 c_array("int32_t", f"q{i}", scalar.rq_records(folded, rq)), c_array("int8_t", f"x{i}", c["x"]),
                 c_array("int8_t", f"y{i}", c["y"])]
        n = c["y"].size
        if c["kind"] == "gemm":
            call = (f"mf_sc_gemm_{fmt}(x{i}, {c['rows']}, {c['xs']}, {c['k']}, {chunk}, w{i}, "
                    f"(const mf_sc_rec *)q{i}, {o}, {lo}, {hi}, {sf}, ybuf, {o});")
        else:
            head.append(c_array("int32_t", f"g{i}", c["geom"]))
            call = (f"mf_sc_conv_{fmt}(x{i}, (const mf_conv_geom *)g{i}, {c['L']['x_zp']}, "
                    f"{c['p']}, {chunk}, w{i}, (const mf_sc_rec *)q{i}, {o}, {lo}, {hi}, "
                    f"{sf}, ybuf, scratch);")
        body.append(check(i, n, call, puts, puti))
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


def check_output(text: str, n_cases: int):
    assert "total 0\n" in text and "bad" not in text, text[-2000:]


CASES = all_cases()


@pytest.fixture(scope="module")
def main_c(tmp_path_factory):
    d = tmp_path_factory.mktemp("scalar")
    p = d / "scalar_main.c"
    p.write_text(program(CASES, "bench"))
    return p


def test_host_sanitizers(main_c, tmp_path):
    exe = harness.build(main_c, "host", "-O1", tmp_path,
                        extra=["-fsanitize=address,undefined", "-fno-sanitize-recover=all",
                               "-g"])
    check_output(harness.run(exe, "host"), len(CASES))


@pytest.mark.parametrize("opt", ["-O0", "-O2", "-Os", "-O3"])
def test_cortex_m3(main_c, tmp_path, opt):
    if not harness.have_arm():
        pytest.skip("arm-none-eabi-gcc / qemu-system-arm not installed")
    exe = harness.build(main_c, "m3", opt, tmp_path)
    check_output(harness.run(exe, "m3"), len(CASES))


@pytest.fixture(scope="module")
def riscv_project(tmp_path_factory):
    """A riscv32-virt firmware project (the demo model's, for its start-up code, linker script
    and mf_board) whose main.c is the harness."""
    require_tools("riscv64-unknown-elf-gcc", "qemu-system-riscv32")
    from mcuforge.api import compile as compile_model
    from mcuforge.tools.demo import demo_tflite_bytes
    from mcuforge.runtime_c import __file__ as rt
    from pathlib import Path
    d = tmp_path_factory.mktemp("rv")
    compile_model(demo_tflite_bytes(), d, board="riscv32-virt", name="demo")
    for h in ("mcuforge_nn.h", "mcuforge_scalar.h"):
        (d / h).write_text((Path(rt).parent / h).read_text())
    (d / "main.c").write_text(program(CASES, "mf"))
    return d


@pytest.mark.parametrize("opt", ["-O2", "-Os"])
def test_riscv(riscv_project, opt):
    from mcuforge.board import load_board
    from mcuforge.target import run_elf
    d = riscv_project
    subprocess.run(["make", "-s", "-C", str(d), "clean"], capture_output=True)
    r = subprocess.run(["make", "-s", "-C", str(d), f"OPT={opt}"], capture_output=True,
                       text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    check_output(run_elf(load_board("riscv32-virt"), d / "demo.elf", timeout=300), len(CASES))


# ---- the schedule: scheduled kernel == reference kernel in the loop-IR evaluator ---------------
def _sched_cases():
    from test_sched_layers import CASES as LAYERS
    return [c for c in LAYERS if not c[0].startswith("dw")][::2] + [
        c for c in LAYERS if c[0].startswith("dw")]


M3 = None


@pytest.mark.parametrize("name,op,kw", _sched_cases(), ids=[c[0] for c in _sched_cases()])
def test_scheduled_equals_reference(name, op, kw):
    from mcuforge.ir.target import Target
    from test_sched_layers import scheduled_and_reference
    for target, fmt in ((Target("mps2-an385", "cortex-m3"), "l64"),
                        (Target("riscv32-virt", "rv32imac"), "m8")):
        k, y, ref, y0 = scheduled_and_reference(name, op, target, **kw)
        # which kernel: l64 on the M3 (declined where no lane chunk passes), m8 declines one- and
        # two-row GEMMs (a 3-row block would compute them 1.5-3x), mf_sc_dw3 (RV32: mf_rv_dwd, or
        # mf_rv_dw3 past 1 of padding) takes every 3x3 depthwise layer of depth multiplier 1;
        # declined layers keep gemm.py / depthwise.py
        assert k is not ref
        if op == "DEPTHWISE_CONV_2D" and kw.get("mult", 1) == 1:  # (RV32: mcuforge_rv.h's)
            assert k.schedule in (("mf_sc_dw3",) if fmt == "l64" else ("mf_rv_dwd",
                                                                       "mf_rv_dw3")), k.schedule
        elif fmt == "l64" and k.schedule.startswith("mf_sc_"):
            assert k.schedule.endswith(("l64", "m8")), k.schedule
        elif fmt == "m8" and k.schedule.startswith("mf_sc_"):
            assert k.schedule.endswith("m8"), k.schedule
        assert y.tolist() == y0.tolist(), target.name


# ---- end to end on the Cortex-M3 (RISC-V: tests/test_board_riscv.py) -----------------------------
@pytest.mark.parametrize("stem", [s for s in MLPERF_INT8 if s != "str_ww_ref_model"])
def test_mlperf_m3_matches_tflm(stem):
    require_tflm()
    require_tools("arm-none-eabi-gcc", "qemu-system-arm")
    from mcuforge import runner
    from mcuforge.api import load
    from mcuforge.tools import tflm
    path = mlperf_model(stem)
    g = load(path)
    t = g.tensors[g.inputs[0]]
    rng = np.random.default_rng(3)
    zp = int(t.quant.zero_point[0]) if t.quant is not None else 0
    # one input over the full int8 range, one near the zero point (KWS's softmax saturates
    # on the first kind: the second keeps its outputs sensitive to every layer)
    x = np.stack([rng.integers(-128, 128, size=t.shape),
                  np.clip(zp + rng.integers(-25, 26, size=t.shape), -128, 127)]).astype(t.dtype)
    y = runner.run(path, x, board="mps2-an385")
    ref = tflm.run(path.read_bytes(), [x])[0]
    assert np.array_equal(y, ref), f"{np.sum(y != ref)} bytes differ from tflite-micro"


@pytest.mark.parametrize("c,target,want", [
    (64, "cortex-m3", "mf_sc_gemm_l64"), (8, "cortex-m3", "mf_sc_gemm_l64"),
    (64, "rv32imac", "mf_rv_gemm_p16"), (8, "rv32imac", "mf_rv_gemm_p16")])
def test_kernel_choice(c, target, want):
    """1x1 layers over 15 pixels: l64 (SMLAL) on Armv7-M at every K; on RV32 p16
    (mcuforge_rv.h) where its chunks average 2 taps or more (these weights: yes), else m8."""
    from mcuforge.codegen_c.kernels import lower_node
    from mcuforge.frontend.tflite import load_tflite
    from mcuforge.ir.target import Target
    from test_sched_layers import layer_model
    model, _ = layer_model(7, "CONV_2D", hw=(3, 5), c=c, o=8, k=(1, 1), act="relu")
    g = load_tflite(model)
    k = lower_node(g.nodes[0], g, "k", Target("b", target))
    assert k.schedule == want
