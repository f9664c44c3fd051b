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
4. The depthwise code budget (rv.dwd_compact): full copies (MF_RV_DWD_DEF) while they fit
   rv.DWD_BUDGET (KWS's one), else compact ones (MF_RV_DWD_DEFC: one row body), the copies
   saving the fewest instructions per byte first (VWW: all nine); bit-exact with
   tflite-micro either way (VWW's compact copies at -O2 by test_mlperf; KWS with every copy
   compact and full below; the kernels' own bytes by test_nn_rv)."""
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
    path = mlperf_model(stem)
    geos = _geometries(path)
    assert (len(geos), len(set(geos))) == (layers, distinct)  # (what the model has)
    compile_model(path, tmp_path, board=BOARD, name="m")
    c = (tmp_path / "m.c").read_text()
    defs = re.findall(r"^MF_RV_DWD_DEFC?\((\w+),", c, re.M)
    calls = re.findall(r"^    (mf_rv_dwd_\w+)\(x, y, ", c, re.M)
    assert len(defs) == len(set(defs)) == distinct, defs
    assert len(calls) == layers and set(calls) == set(defs)
    require_tools("riscv64-unknown-elf-gcc")
    r = subprocess.run(["make", "-s", "-C", str(tmp_path), "m.elf"], capture_output=True,
                       text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    nm = subprocess.run(["riscv64-unknown-elf-nm", str(tmp_path / "m.elf")],
                        capture_output=True, text=True, check=True).stdout
    fns = {line.split()[-1].split(".")[0] for line in nm.splitlines()
           if re.search(r" [tT] mf_rv_dwd", line)}
    assert fns == set(defs), fns


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
    assert "MF_RV_DWD_DEFC(" in texts[0] and texts[0] == texts[1]


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


def test_budget_makes_copies_compact(monkeypatch):
    """KWS's one full copy fits the budget; VWW's nine do not (17 KB estimated): all compact.
    With the budget just under the full copies' total, exactly one goes compact: the one whose
    layers have the fewest outputs (saved instructions) per byte it saves, counted here from
    the graph's shapes; with no budget, every copy."""
    from mcuforge.codegen_c.kernels import rv
    from mcuforge.optimizer.pipeline import optimize
    kws, vww = (optimize(load(mlperf_model(s))) for s in ("kws_ref_model", "vww_96_int8"))
    assert rv.dwd_compact(kws) == frozenset()
    assert len(rv.dwd_compact(vww)) == 9
    outs = {}  # per copy (plane, ..., dly): its layers' outputs
    for n in vww.nodes:
        if n.op == "depthwise_conv2d":
            y = vww.tensors[n.outputs[0]].shape
            key = next(k for k in rv.dwd_compact(vww) if k[3:5] == (y[1], y[2])
                       and k[2] == y[3] and k[6] == n.attrs["stride"][1])
            outs[key] = outs.get(key, 0) + y[1] * y[2] * y[3]
    per_byte = {k: v / (rv.dwd_bytes(k[:9], False) - rv.dwd_bytes(k[:9], True))
                for k, v in outs.items()}
    total = sum(rv.dwd_bytes(k[:9], False) for k in outs)
    for budget, want in ((total, set()), (total - 1, {min(per_byte, key=per_byte.get)}),
                         (0, set(outs))):
        monkeypatch.setattr(rv, "DWD_BUDGET", budget)
        rv._COMPACT.clear()
        assert rv.dwd_compact(vww) == want, budget


@pytest.mark.parametrize("budget", [0, 10**6])
def test_kws_compact_and_full_bit_exact(budget, monkeypatch):
    """KWS at -O2 with its copy compact (budget 0) and full: tflite-micro's bytes."""
    from mcuforge.codegen_c.kernels import rv
    require_tools("riscv64-unknown-elf-gcc", "qemu-system-riscv32")
    monkeypatch.setattr(rv, "DWD_BUDGET", budget)
    rv._COMPACT.clear()
    path = mlperf_model("kws_ref_model")
    g = load(path)
    t = g.tensors[g.inputs[0]]
    x = np.random.default_rng(17).integers(-128, 128, size=(2, *t.shape)).astype(t.dtype)
    y = runner.run(path, x, board=BOARD)
    ref = tflm.run(path.read_bytes(), [x])[0]
    assert np.array_equal(y, ref), f"{np.sum(y != ref)} bytes differ from tflite-micro"
