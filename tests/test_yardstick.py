"""The TFLM + CMSIS-NN yardstick (tests/yardstick/) reproduces the figures bench.py records and
computes what LiteRT computes. Opt-in: it needs the fetched TFLM, CMSIS-NN, ... trees, given as
MCUFORGE_TFLM_SOURCES=<folder> in the layout of tests/yardstick/README.md (a first build of the
needed objects takes minutes; later runs reuse MCUFORGE_TFLM_BUILD, default /tmp/tflm_yardstick)."""
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import MLPERF_DIR, REPO
from mcuforge.tools.bench import TFLM_CMSIS_INSTRUCTIONS

SOURCES = os.environ.get("MCUFORGE_TFLM_SOURCES")
pytestmark = pytest.mark.skipif(not SOURCES, reason="MCUFORGE_TFLM_SOURCES not set (opt-in)")
KWS = MLPERF_DIR / "kws_ref_model.tflite"


def yardstick(tmp_path, board: str, model: Path, x: np.ndarray) -> tuple:
    np.save(tmp_path / "x.npy", x)
    r = subprocess.run(
        [sys.executable, str(REPO / "tests/yardstick/tflm_yardstick.py"), "--sources", SOURCES,
         "--build", os.environ.get("MCUFORGE_TFLM_BUILD", "/tmp/tflm_yardstick"),
         "--objects", str(REPO / "tests/yardstick/objects.txt"), "--board", board,
         "--input", str(tmp_path / "x.npy"), "--save", str(tmp_path), str(model)],
        capture_output=True, text=True, timeout=3600)
    assert r.returncode == 0, r.stderr[-3000:]
    row = json.loads(r.stdout.splitlines()[-1])
    assert "error" not in row, row["error"]
    return row, np.load(tmp_path / f"{model.stem}.{board}.out0.npy")


@pytest.mark.parametrize("board", ["mps2-an386", "mps2-an500"])
def test_kws_count_and_output(tmp_path, board):
    if not KWS.exists():
        pytest.skip(f"{KWS} missing")
    from ai_edge_litert.interpreter import Interpreter
    # bench.py's input: seed 0, the int8 range (counts depend on the data through branches)
    x = np.random.default_rng(0).integers(-128, 128, size=(1, 49, 10, 1)).astype(np.int8)
    row, y = yardstick(tmp_path, board, KWS, x)
    recorded = TFLM_CMSIS_INSTRUCTIONS[board][hashlib.sha256(KWS.read_bytes()).hexdigest()[:16]]
    # one SysTick tick either way (40 instructions): the resolution of the measurement
    assert abs(row["instructions"] - recorded) <= 40, (row["instructions"], recorded)
    assert row["arena_bytes"] == 22_820  # shared/notes/measuring-on-qemu.md
    it = Interpreter(model_path=str(KWS))
    it.allocate_tensors()
    it.set_tensor(it.get_input_details()[0]["index"], x)
    it.invoke()
    np.testing.assert_array_equal(y, it.get_tensor(it.get_output_details()[0]["index"]))
