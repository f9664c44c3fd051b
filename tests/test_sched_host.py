"""The host's schedule (codegen_c/kernels/host.py, runtime_c/mcuforge_vec.h): int8 layers on
the host run the vectorisable kernels, which compute exactly what the reference lowering and
tflite-micro compute; boards without Cortex-M features other than the host (Cortex-M3, RISC-V)
keep the portable Cortex-M kernels.

Layers (tests/test_sched_layers.py's builder, the `tflite` package's builders) aimed at the
host kernels' edges: odd numbers of rows and pixels (the last one outside a pair; a single one, whose
scratch is half a pair's), channel
counts off the blocks of 4 and 16, K off the 8-tap padding, K on both sides of the short-row
kernel's limit (16), depthwise layers with dilation, 5x5 and
1x1 kernels, VALID padding that leaves input columns unread, stride 2 with odd widths, and
rows wider than one chunk of tiled constants (tw < out_w). Checks: the loop-IR evaluator
(scheduled == reference, scratch starting as noise) and the built C against tflite-micro."""
from __future__ import annotations

import numpy as np
import pytest

from mcuforge.codegen_c.evaluate import run_kernel
from mcuforge.codegen_c.kernels import host as host_sched
from mcuforge.codegen_c.kernels import lower_node
from mcuforge.codegen_c.lower import reference_kernel
from conftest import require_tflm, require_tools
from mcuforge.frontend.tflite import load_tflite
from mcuforge.ir.target import HOST, Target
from mcuforge import runner
from mcuforge.tools import tflm
from test_sched_layers import VALID, layer_model

CASES = [
    ("fc_odd_rows", "FULLY_CONNECTED", dict(c=37, o=9, batch=3, act="relu")),
    ("fc_one", "FULLY_CONNECTED", dict(c=5, o=1)),
    ("fc_single_row", "FULLY_CONNECTED", dict(c=40, o=9, act="relu")),
    ("conv_one_px", "CONV_2D", dict(hw=(3, 3), c=5, o=6, k=(3, 3), pad=VALID)),
    ("conv1x1_odd", "CONV_2D", dict(hw=(3, 5), c=13, o=7, k=(1, 1), act="relu6")),
    ("conv1x1_lanes", "CONV_2D", dict(hw=(3, 3), c=16, o=37, k=(1, 1), act="relu")),
    ("fc_lanes", "FULLY_CONNECTED", dict(c=8, o=17, batch=2, per_channel=False)),
    ("conv1x1_dots", "CONV_2D", dict(hw=(2, 3), c=17, o=20, k=(1, 1))),
    ("conv3x3_odd_px", "CONV_2D", dict(hw=(5, 3), c=3, o=6, k=(3, 3), stride=(2, 2))),
    ("conv_valid", "CONV_2D", dict(hw=(7, 6), c=5, o=11, k=(2, 3), stride=(2, 1), pad=VALID,
                                   per_channel=False)),
    ("conv_wide_k", "CONV_2D", dict(hw=(4, 4), c=40, o=5, k=(3, 3), act="relu")),
    ("dw_dil", "DEPTHWISE_CONV_2D", dict(hw=(9, 8), c=6, dilation=(2, 3), act="relu")),
    ("dw_dil_valid", "DEPTHWISE_CONV_2D", dict(hw=(9, 10), c=5, dilation=(2, 2), pad=VALID)),
    ("dw5x5_s2", "DEPTHWISE_CONV_2D", dict(hw=(11, 9), c=7, k=(5, 5), stride=(2, 2))),
    ("dw1x1", "DEPTHWISE_CONV_2D", dict(hw=(3, 4), c=9, k=(1, 1), act="relu6")),
    ("dw_valid_s2", "DEPTHWISE_CONV_2D", dict(hw=(8, 9), c=4, stride=(2, 2), pad=VALID)),
    ("dw_s21", "DEPTHWISE_CONV_2D", dict(hw=(7, 7), c=3, stride=(2, 1), per_channel=False)),
    ("dw_chunks", "DEPTHWISE_CONV_2D", dict(hw=(5, 9), c=300, stride=(1, 1))),
    ("dw_chunks_s2", "DEPTHWISE_CONV_2D", dict(hw=(6, 11), c=200, stride=(2, 2), act="relu")),
    ("dw_dead", "DEPTHWISE_CONV_2D", dict(hw=(5, 6), c=5, dead=True)),
]


def _layer(name, op, kw):
    model, x = layer_model(sum(map(ord, name)) + 7, op, **kw)
    return model, x, load_tflite(model)


@pytest.mark.parametrize("name,op,kw", CASES, ids=[c[0] for c in CASES])
def test_host_kernel_equals_reference(name, op, kw):
    _, x, g = _layer(name, op, kw)
    node = g.nodes[0]
    ref = reference_kernel(node, g, "k")
    k = lower_node(node, g, "k", HOST)
    assert k.schedule.startswith("mf_vec_"), k.schedule
    if "lanes" in name or "dots" in name:  # K <= 16: lanes = channels; K = 17: dot products
        assert (k.schedule == "mf_vec_gemm_t") == ("lanes" in name), k.schedule
    if name == "dw_chunks":
        geom = next(b for b in k.consts if b.name == "geom").data
        assert geom[-1] < geom[-2], "tw should split the output row"
    rng = np.random.default_rng(1)
    for xi in x:
        want = np.zeros(g.tensors[g.outputs[0]].size, np.int8)
        run_kernel(ref, {"x": xi.reshape(-1).copy(), "y": want})
        got = rng.integers(-128, 128, want.size).astype(np.int8)  # outputs start as noise
        run_kernel(k, {"x": xi.reshape(-1).copy(), "y": got})
        assert got.tolist() == want.tolist()


@pytest.mark.parametrize("name,op,kw", CASES, ids=[c[0] for c in CASES])
def test_host_c_equals_tflm(name, op, kw):
    require_tflm()
    model, x, _ = _layer(name, op, kw)
    want = tflm.run(model, [x])[0]
    got = runner.run(model, x)
    np.testing.assert_array_equal(got, want)


def test_only_the_host_gets_host_kernels():
    cases = {c[0]: c[1:] for c in CASES}
    _, _, g = _layer("conv1x1_dots", *cases["conv1x1_dots"])
    _, _, gd = _layer("dw_s21", *cases["dw_s21"])
    for target, gemm, dw in (
            (HOST, "mf_vec_gemm", "mf_vec_dw"),
            (Target("mps2-an385", "cortex-m3"), "mf_sc_gemm_", "mf_sc_dw3"),  # (scalar.py)
            (Target("riscv32-virt", "rv32imac"), ("mf_sc_gemm_", "mf_rv_"), ("mf_rv_dw3",
                                                                          "mf_rv_dwd")),
            (Target("mps2-an386", "cortex-m4", frozenset({"dsp"})),
             ("mf_gemm_w16", "mf_gemm2_w16", "mf_gemm1k8_w16"), "mf_dw3x3_s8")):
        # (the M4 takes one of its int16-weight GEMM blocks: 4x1 K-specialised, 2x2, K = 8)
        assert lower_node(g.nodes[0], g, "k", target).schedule.startswith(gemm), target.name
        # dw_s21 has stride (2, 1), which mf_dw3x3_s8 refuses: the reference stays on the M4;
        # the host and the cores without SIMD take any stride
        k = lower_node(gd.nodes[0], gd, "k", target)
        assert k.schedule in ((dw,) if isinstance(dw, str) else dw) if (
            target.host or not target.dsp) else k.schedule == "", target.name


def test_dw_scratch_matches_the_kernel():
    """dw_scratch_words: tags, accumulators and the ring of phase-split rows (hand-computed:
    3x3, stride 2, 11 outputs of 9 channels -> wq = 10 * 2 + 2 + 1 = 23 columns, 12 per
    phase, ring of 3 rows: 3 + 99 + 3 * 2 * 12 * 9 / 2 words)."""
    g = dict(k_h=3, k_w=3, dil_h=1, dil_w=1, stride_w=2, out_w=11, c=9, tw=11)
    assert host_sched.dw_scratch_words(g) == 3 + 99 + 324


def _harness(k) -> str:
    """A C program running kernel `k` alone: its constants as arrays, x read from stdin, y and
    the scratch on the heap, each exactly as large as the kernel declares (so AddressSanitizer
    sees any access past them, which inside the model's arena it could not)."""
    from mcuforge.codegen_c.printer import print_array, print_kernel
    names = {b.name: f"k_{b.name}" for b in k.consts}
    arrays = "\n".join(print_array(names[b.name], b.dtype, b.data) for b in k.consts)
    params = {b.name: b for b in k.params}
    ctype = {"int8": "int8_t", "int16": "int16_t", "int32": "int32_t"}
    allocs = "\n".join(f"    {ctype[b.dtype]} *{b.name} = malloc({b.size} * sizeof *{b.name});"
                       for b in params.values())
    return f"""#include <stdio.h>
#include <stdlib.h>
#include "mcuforge_rt.h"
#include "mcuforge_vec.h"
{arrays}
{print_kernel(k, names)}
int main(void) {{
{allocs}
    if (fread(x, 1, {params['x'].size}, stdin) != {params['x'].size}) return 2;
    memset(scratch, 0x5a, {params['scratch'].size} * sizeof *scratch);
    {k.name}({', '.join(params)});
    fwrite(y, 1, {params['y'].size}, stdout);
    free(x); free(y); free(scratch);
    return 0;
}}
"""


@pytest.mark.parametrize("name,op,kw", CASES, ids=[c[0] for c in CASES])
def test_kernel_alone_under_sanitizers(name, op, kw, tmp_path):
    """The kernel with exactly its declared scratch, under ASan/UBSan, == the evaluator."""
    import subprocess
    from pathlib import Path
    require_tools("gcc")
    _, x, g = _layer(name, op, kw)
    k = lower_node(g.nodes[0], g, "k", HOST)
    src = tmp_path / "k.c"
    src.write_text(_harness(k))
    runtime = Path(__file__).resolve().parent.parent / "runtime_c"
    exe = tmp_path / "k"
    subprocess.run(["gcc", "-std=c99", "-Wall", "-Wextra", "-Werror", "-O1", "-g",
                    "-fsanitize=address,undefined", "-fno-sanitize-recover=all",
                    f"-I{runtime}", "-o", str(exe), str(src)], check=True)
    for xi in x:
        r = subprocess.run([str(exe)], input=xi.tobytes(), capture_output=True)
        assert r.returncode == 0, r.stderr.decode()
        want = np.zeros(g.tensors[g.outputs[0]].size, np.int8)
        run_kernel(reference_kernel(g.nodes[0], g, "k"), {"x": xi.reshape(-1).copy(),
                                                          "y": want})
        assert np.frombuffer(r.stdout, np.int8).tolist() == want.tolist()
