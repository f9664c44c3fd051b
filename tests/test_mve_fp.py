"""The generated C for the Cortex-M55 (mps3-an547, Helium) at the -O levels a user may pick.

- It compiles with a frame pointer (-fno-omit-frame-pointer) at -O2, -O3 and -Os: the asm
  loops of runtime_c/mcuforge_mve.h (mf_mve_dot4x2: 12 core registers) and mcuforge_mve_dw.h
  (10-11) once failed there with gcc 12's "impossible constraints" (-Os: mf_mve_dot4x2 in
  mf_mve_conv_f0, -O3: mf_mve_dot4x2 and the depthwise row loops).
- VWW links at -O0 into the board's 512 KB flash (its always-inline helpers were copied into
  every kernel entry: 72 bytes too many).
- At -Os and -O0, where the depthwise asm loops now run too, KWS and VWW equal tflite-micro.
"""
import shutil
import subprocess

import numpy as np
import pytest

from conftest import mlperf_model, require_tools
from mcuforge import runner
from mcuforge.api import compile as compile_model, load
from mcuforge.board import load_board
from mcuforge.tools import tflm

BOARD = "mps3-an547"


@pytest.fixture(autouse=True)
def _tools():
    require_tools("arm-none-eabi-gcc")


@pytest.fixture(scope="module")
def projects(tmp_path_factory):
    """model stem -> its generated project for the M55 (compiled once for the module)."""
    made = {}

    def get(stem):
        if stem not in made:
            out = tmp_path_factory.mktemp(stem)
            compile_model(str(mlperf_model(stem)), out, board=BOARD, name=stem)
            made[stem] = out
        return made[stem]
    return get


@pytest.mark.parametrize("stem", ["vww_96_int8", "kws_ref_model", "pretrainedResnet_quant"])
@pytest.mark.parametrize("opt", ["-Os", "-O2", "-O3"])
def test_compiles_with_a_frame_pointer(projects, stem, opt, tmp_path):
    d = projects(stem)
    board = load_board(BOARD)
    cmd = (["arm-none-eabi-gcc", *board.cflags, opt, "-fno-omit-frame-pointer", "-std=c99",
            "-Wall", "-Wextra", "-Werror", "-pedantic", "-ffunction-sections",
            "-fdata-sections", "-c", f"{stem}.c", "-o", str(tmp_path / f"{stem}.o")])
    r = subprocess.run(cmd, cwd=d, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-3000:]


def test_vww_links_at_O0(projects, tmp_path):
    """The whole firmware at -O0, linked with the board's script: it fits the flash."""
    d = tmp_path / "vww"
    shutil.copytree(projects("vww_96_int8"), d)
    r = subprocess.run(["make", "-s", "-C", str(d), "OPT=-O0"], capture_output=True, text=True)
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    size = subprocess.run(["arm-none-eabi-size", str(d / "vww_96_int8.elf")], capture_output=True,
                          text=True, check=True).stdout.splitlines()[1].split()
    flash = load_board(BOARD).flash_size
    assert int(size[0]) + int(size[1]) <= flash


@pytest.mark.parametrize("stem,opt", [("kws_ref_model", "-Os"), ("vww_96_int8", "-Os"),
                                      ("vww_96_int8", "-O0")])
def test_equals_tflite_micro_at(stem, opt, monkeypatch):
    require_tools("qemu-system-arm")
    monkeypatch.setenv("MCUFORGE_OPT", opt)
    path = mlperf_model(stem)
    g = load(path)
    t = g.tensors[g.inputs[0]]
    x = np.random.default_rng(11).integers(-128, 128, size=(3, *t.shape)).astype(t.dtype)
    y = runner.run(path, x, board=BOARD)
    ref = tflm.run(path.read_bytes(), [x])[0]
    assert np.array_equal(y, ref), f"{stem} at {opt}: {np.sum(y != ref)} bytes differ"
