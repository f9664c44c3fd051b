"""RV32 depthwise code size (riscv32-virt): mf_rv_dwd is compiled once per distinct constant
geometry, not once per layer (runtime_c/mcuforge_rv.h MF_RV_DWD_DEF, codegen_c/kernels/rv.py
dwd_copy):

1. The generated C of VWW (13 depthwise layers, five of them 6x6x128 at stride 1) and KWS (four
   25x5x64 layers) defines one copy per distinct geometry of its depthwise layers, counted here
   from the graph (input and output shapes, strides, padding), every layer calls one, and the
   -O2 ELF holds that many mf_rv_dwd functions (nm).
2. The names are deterministic: the CLI run twice with different hash seeds writes the same C.
3. The copies stay bit-exact with tflite-micro where the header builds them differently:
   -O0 and -Os (one generic mf_rv_dwd under the copies), -O3 (inlined as at -O2, tested by
   test_mlperf / test_board_riscv).
4. The depthwise code budget (rv.dwd_kinds): the layers start on shared copies (MF_RV_DWD_DEFG:
   one per stride, padding, mode, clamp, TR, DLY, the plane's sizes as arguments), then the
   upgrades to own copies (compact MF_RV_DWD_DEFC, full MF_RV_DWD_DEF) with the most saved
   instructions per byte while rv.DWD_BUDGET holds (KWS: its full copy; VWW: its two shared
   copies and three compact); the copies' real -O2 bytes (nm) stay within the budget; bit-exact
   with tflite-micro either way (VWW at -O2 by test_mlperf; KWS with its copy shared, compact
   and full below; the kernels' own bytes by test_nn_rv).
5. The goal they serve: KWS, ResNet-8 and VWW at most 16 KB of code, at least 0.4 MAC an
   instruction (bench's figures; VWW had 21,642 bytes before the shared copies)."""
import os
import re
import subprocess
import sys

import numpy as np
import pytest

from conftest import mlperf_model, require_tools
from mcuforge import runner
from mcuforge.api import compile as compile_model, load
from mcuforge.tools import tflm

BOARD = "riscv32-virt"
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _geometries(path) -> list:
    """Per depthwise layer: (input shape, output shape, strides, padding) from the graph."""
    g = load(path)
    out = []
    for n in g.nodes:
        if n.op != "depthwise_conv2d":
            continue
        a = n.attrs
        out.append((tuple(g.tensors[n.inputs[0]].shape), tuple(g.tensors[n.outputs[0]].shape),
                    tuple(a["stride"]), tuple(a["padding"])))
    return out


@pytest.mark.parametrize("stem,layers,distinct", [("vww_96_int8", 13, 9),
                                                  ("kws_ref_model", 4, 1)])
def test_one_copy_per_geometry(stem, layers, distinct, tmp_path):
    """At most one copy per geometry (the layers of one geometry call the same one), every
    layer calls a defined copy, the ELF holds exactly those, and their bytes fit the budget."""
    from mcuforge.codegen_c.kernels import rv
    path = mlperf_model(stem)
    geos = _geometries(path)
    assert (len(geos), len(set(geos))) == (layers, distinct)  # (what the model has)
    compile_model(path, tmp_path, board=BOARD, name="m")
    c = (tmp_path / "m.c").read_text()
    defs = re.findall(r"^MF_RV_DWD_DEF[CG]?\((\w+),", c, re.M)
    calls = re.findall(r"^    (mf_rv_dw[dg]_\w+)\(x, y, ", c, re.M)
    assert len(defs) == len(set(defs)) <= distinct, defs
    assert len(calls) == layers and set(calls) == set(defs)
    by_geo = {}
    for geo, fn in zip(geos, calls):
        by_geo.setdefault(geo, set()).add(fn)
    assert all(len(v) == 1 for v in by_geo.values()), by_geo
    require_tools("riscv64-unknown-elf-gcc")
    r = subprocess.run(["make", "-s", "-C", str(tmp_path), "m.elf"], capture_output=True,
                       text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    nm = subprocess.run(["riscv64-unknown-elf-nm", "-S", "-t", "d", str(tmp_path / "m.elf")],
                        capture_output=True, text=True, check=True).stdout
    rows = [line.split() for line in nm.splitlines() if re.search(r" [tT] mf_rv_dw[dg]_", line)]
    assert {row[-1].split(".")[0] for row in rows} == set(defs)
    assert sum(int(row[1]) for row in rows) <= rv.DWD_BUDGET


def test_names_are_deterministic(tmp_path):
    path = mlperf_model("vww_96_int8")
    texts = []
    for seed in ("1", "2"):
        (tmp_path / seed).mkdir()  # (the banner quotes the command: the same relative -o)
        env = dict(os.environ, PYTHONHASHSEED=seed, PYTHONPATH=ROOT)
        subprocess.run([sys.executable, "-m", "mcuforge.cli", "compile", str(path), "-o",
                        "out", "--board", BOARD, "--name", "m"], check=True, env=env,
                       capture_output=True, cwd=tmp_path / seed)
        texts.append((tmp_path / seed / "out" / "m.c").read_text())
    assert "MF_RV_DWD_DEFG(" in texts[0] and texts[0] == texts[1]


@pytest.mark.parametrize("opt", ["-O0", "-Os", "-O3"])
def test_copies_bit_exact_at_opt_levels(opt):
    require_tools("riscv64-unknown-elf-gcc", "qemu-system-riscv32")
    path = mlperf_model("kws_ref_model")
    g = load(path)
    t = g.tensors[g.inputs[0]]
    x = np.random.default_rng(13).integers(-128, 128, size=(2, *t.shape)).astype(t.dtype)
    y = runner.run(path, x, board=BOARD, opt=opt)
    ref = tflm.run(path.read_bytes(), [x])[0]
    assert np.array_equal(y, ref), f"{np.sum(y != ref)} bytes differ from tflite-micro"


def test_budget_kinds(monkeypatch):
    """KWS's one copy is full. VWW's kinds fit the budget and no further upgrade would (the
    greedy stops only when full); its layers keep both shared copies (stride 1 and 2) and the
    five 6x6x128 layers (the most outputs, counted here from the graph's shapes) get their own.
    With no budget every layer is on the shared copies; with an unbounded one every copy is
    full."""
    from mcuforge.codegen_c.kernels import rv
    from mcuforge.optimizer.pipeline import optimize
    kws, vww = (optimize(load(mlperf_model(s))) for s in ("kws_ref_model", "vww_96_int8"))
    rv._KINDS.clear()
    assert list(rv.dwd_kinds(kws).values()) == ["full"]
    kinds = rv.dwd_kinds(vww)
    outs = {}
    for n in vww.nodes:
        if n.op == "depthwise_conv2d":
            y = vww.tensors[n.outputs[0]].shape
            key = next(k for k in kinds if k[3:5] == (y[1], y[2]) and k[2] == y[3]
                       and k[6] == n.attrs["stride"][1])
            outs[key] = outs.get(key, 0) + y[1] * y[2] * y[3]
    assert len(outs) == 9 and set(kinds) == set(outs)
    top = max(outs, key=outs.get)
    assert top[:5] == (6, 6, 128, 6, 6) and kinds[top] != "walk"
    assert {rv.dwd_class(k)[:2] for k, v in kinds.items() if v == "walk"} == {(1, 1), (2, 2)}
    assert rv.dwd_total(kinds) <= rv.DWD_BUDGET
    for k, v in kinds.items():
        for up in ("compact", "full"):
            if rv.dwd_extra(k[:9], up) < rv.dwd_extra(k[:9], v):
                assert rv.dwd_total({**kinds, k: up}) > rv.DWD_BUDGET, (k, up)
    for budget, want in ((0, "walk"), (10**6, "full")):
        monkeypatch.setattr(rv, "DWD_BUDGET", budget)
        rv._KINDS.clear()
        assert set(rv.dwd_kinds(vww).values()) == {want}, budget
    rv._KINDS.clear()


@pytest.mark.parametrize("kind", ["walk", "compact", "full"])
def test_kws_kinds_bit_exact(kind, monkeypatch):
    """KWS at -O2 with its copy shared (budget 0), compact (the budget its compact copy's
    estimate) and full (unbounded): tflite-micro's bytes."""
    from mcuforge.codegen_c.kernels import rv
    from mcuforge.optimizer.pipeline import optimize
    require_tools("riscv64-unknown-elf-gcc", "qemu-system-riscv32")
    path = mlperf_model("kws_ref_model")
    rv._KINDS.clear()
    (key,) = rv.dwd_kinds(optimize(load(path)))
    budget = {"walk": 0, "compact": rv.dwd_bytes(key[:9], "compact"), "full": 10**6}[kind]
    monkeypatch.setattr(rv, "DWD_BUDGET", budget)
    rv._KINDS.clear()
    assert list(rv.dwd_kinds(optimize(load(path))).values()) == [kind]
    g = load(path)
    t = g.tensors[g.inputs[0]]
    x = np.random.default_rng(17).integers(-128, 128, size=(2, *t.shape)).astype(t.dtype)
    y = runner.run(path, x, board=BOARD)
    ref = tflm.run(path.read_bytes(), [x])[0]
    assert np.array_equal(y, ref), f"{np.sum(y != ref)} bytes differ from tflite-micro"
    rv._KINDS.clear()


def _dw_sched_cases():
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from test_sched_layers import CASES as LAYERS
    return [c for c in LAYERS if c[1] == "DEPTHWISE_CONV_2D"]


@pytest.mark.parametrize("name,op,kw", _dw_sched_cases(), ids=[c[0] for c in _dw_sched_cases()])
def test_shared_copy_mirror_equals_reference(name, op, kw, monkeypatch):
    """With no budget the depthwise layers mf_rv_dwd takes go on a shared copy; its evaluator
    mirror (sizes as the last arguments) gives the reference loops' bytes."""
    from mcuforge.codegen_c.kernels import rv
    from mcuforge.ir.target import Target
    from test_sched_layers import scheduled_and_reference
    monkeypatch.setattr(rv, "DWD_BUDGET", 0)
    rv._KINDS.clear()
    k, y, _, y0 = scheduled_and_reference(name, op, Target("riscv32-virt", "rv32imac"), **kw)
    rv._KINDS.clear()
    assert y.tolist() == y0.tolist(), k.schedule
    if k.schedule == "mf_rv_dwd":
        assert any("MF_RV_DWD_DEFG(" in s for s in k.shared), k.shared


def test_shared_copies_are_taken(monkeypatch):
    """Some of the cases above take the shared copies (else they check nothing of them)."""
    from mcuforge.codegen_c.kernels import lower_node, rv
    from mcuforge.frontend.tflite import load_tflite
    from mcuforge.ir.target import Target
    from test_sched_layers import layer_model
    monkeypatch.setattr(rv, "DWD_BUDGET", 0)
    rv._KINDS.clear()
    taken = 0
    for name, op, kw in _dw_sched_cases():
        g = load_tflite(layer_model(sum(map(ord, name)), op, **kw)[0])
        k = lower_node(g.nodes[0], g, "k", Target("riscv32-virt", "rv32imac"))
        taken += any("MF_RV_DWD_DEFG(" in s for s in k.shared)
    rv._KINDS.clear()
    assert taken >= 3, taken


@pytest.mark.parametrize("stem", ["kws_ref_model", "pretrainedResnet_quant", "vww_96_int8"])
def test_code_and_speed_targets(stem):
    """The RV32 goal on riscv32-virt (bench's figures: code = flash less weights and the input
    vector, instructions of one invoke under QEMU): at most 16 KB of code and at least 0.4 MAC
    an instruction for KWS, ResNet-8 and VWW."""
    require_tools("riscv64-unknown-elf-gcc", "qemu-system-riscv32")
    from mcuforge.tools.bench import bench_board
    row = bench_board(str(mlperf_model(stem)), BOARD, with_tflm=False)
    assert row["code_bytes"] <= 16384, row["code_bytes"]
    assert row["macs"] >= 0.4 * row["instructions"], (row["macs"], row["instructions"])


def test_stride_3_keeps_its_own_copy(monkeypatch):
    """The walk takes strides 1 and 2 only: a stride-3 depthwise layer gets its own copy even
    with no budget, and stays equal to the reference loops."""
    from mcuforge.codegen_c.evaluate import run_kernel
    from mcuforge.codegen_c.kernels import lower_node, rv
    from mcuforge.codegen_c.lower import reference_kernel
    from mcuforge.frontend.tflite import load_tflite
    from mcuforge.ir.target import Target
    from test_sched_layers import VALID, layer_model
    monkeypatch.setattr(rv, "DWD_BUDGET", 0)
    rv._KINDS.clear()
    model, x = layer_model(33, "DEPTHWISE_CONV_2D", hw=(10, 11), c=3, stride=(3, 3), pad=VALID)
    g = load_tflite(model)
    node = g.nodes[0]
    k = lower_node(node, g, "k", Target("riscv32-virt", "rv32imac"))
    assert k.schedule == "mf_rv_dwd" and any("MF_RV_DWD_DEFC(" in s for s in k.shared)
    ref = reference_kernel(node, g, "k")
    y0 = np.zeros(g.tensors[g.outputs[0]].size, np.int8)
    run_kernel(ref, {"x": x[0].reshape(-1).copy(), "y": y0})
    y = np.zeros_like(y0)
    run_kernel(k, {"x": x[0].reshape(-1).copy(), "y": y})
    rv._KINDS.clear()
    assert y.tolist() == y0.tolist()
