"""Instruction bench of the Helium depthwise kernel (runtime_c/mcuforge_mve_dw.h) on QEMU
mps3-an547 at the MLPerf layers' shapes (KWS, VWW), bit-exact check included:

    python tests/nn_bench/mve_dw_bench.py [-O2 ...]
"""
from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent.parent), str(HERE.parent)]
import mve_harness as H  # noqa: E402
from test_nn_mve_dw import dw_c, dw_case  # noqa: E402

SHAPES = [("KWS 25x5x64 s1", 25, 5, 64, 1), ("VWW 48x48x8 s1", 48, 48, 8, 1),
          ("VWW 48x48x16 s2", 48, 48, 16, 2), ("VWW 24x24x32 s1", 24, 24, 32, 1),
          ("VWW 24x24x32 s2", 24, 24, 32, 2), ("VWW 12x12x64 s1", 12, 12, 64, 1),
          ("VWW 12x12x64 s2", 12, 12, 64, 2), ("VWW 6x6x128 s1", 6, 6, 128, 1),
          ("VWW 6x6x128 s2", 6, 6, 128, 2), ("VWW 3x3x256 s1", 3, 3, 256, 1)]
COUNT = {"KWS 25x5x64 s1": 4, "VWW 6x6x128 s1": 5}  # layers of that shape in the model


def main(flags):
    rng = np.random.default_rng(1)
    cases, macs = [], []
    for i, (_, h, w, c, s) in enumerate(SHAPES):
        case = dw_case(rng, h, w, c, (3, 3), (s, s), True, "relu")
        cases.append(dw_c(i, case))
        macs.append(case["oh"] * case["ow"] * c * 9)
    with tempfile.TemporaryDirectory() as d:
        exe = H.build(cases, "m55", flags, d)
        rows, ok, log = H.run(exe, "m55")
    assert ok, log
    tot = {"KWS": 0.0, "VWW": 0.0}
    for (name, *_), (ticks, bad), m in zip(SHAPES, rows, macs):
        instr = ticks * H.TICK
        tot[name[:3]] += instr * COUNT.get(name, 1)
        print(f"{name:18s} {instr:9.0f} instr  {m / instr:5.2f} MAC/instr  bad {bad}")
    print("in the models: " + ", ".join(f"{k} {v:,.0f}" for k, v in tot.items()))


if __name__ == "__main__":
    main(sys.argv[1:] or ["-O2"])
