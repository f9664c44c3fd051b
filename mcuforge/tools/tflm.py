"""TFLM, the reference: run a .tflite with tflite-micro's interpreter, read its arena, time it."""
from __future__ import annotations

import re
import subprocess
import sys
import time

import numpy as np

from mcuforge.ir.errors import McuforgeError


def available() -> bool:
    try:
        from tflite_micro.python.tflite_micro import runtime  # noqa: F401
        return True
    except ImportError:
        return False


def _interpreter(model: bytes):
    try:
        from tflite_micro.python.tflite_micro import runtime
    except ImportError as e:
        raise McuforgeError("tflite-micro is not installed: pip install tflite-micro") from e
    return runtime.Interpreter.from_bytes(model)


def run(model: bytes, inputs: list, reset_at: int = 0) -> list:
    """Outputs of one inference per row, in sequence on one interpreter (state carries over):
    `inputs` is a list (one per model input) of [N, ...] arrays; returns a list (one per
    output) of [N, ...] arrays. With reset_at > 0 the interpreter is reset before that row."""
    it = _interpreter(model)
    n_out = _io_counts(model)[1]
    outs = [[] for _ in range(n_out)]
    for i in range(len(inputs[0])):
        if i and i == reset_at:
            it.reset()
        for k, arr in enumerate(inputs):
            it.set_input(arr[i], k)
        it.invoke()
        for k in range(n_out):
            outs[k].append(np.array(it.get_output(k)))
    return [np.stack(o) for o in outs]


def _io_counts(model: bytes) -> tuple:
    """(inputs, outputs) of subgraph 0, read from the flatbuffer: tflite-micro prints an error
    when probed past the end."""
    import tflite
    g = tflite.Model.GetRootAsModel(model, 0).Subgraphs(0)
    return g.InputsLength(), g.OutputsLength()


def arena_bytes(model_path: str) -> dict:
    """TFLM's arena for the model: {'head': planned activation bytes, 'total': whole arena}.
    Read from its recording allocator, in a subprocess because it prints from C++."""
    code = ("import sys\nfrom tflite_micro.python.tflite_micro import runtime\n"
            "runtime.Interpreter.from_file(sys.argv[1]).print_allocations()\n")
    r = subprocess.run([sys.executable, "-c", code, str(model_path)], capture_output=True,
                       text=True)
    text = r.stdout + r.stderr
    found = {k: int(v) for k, v in re.findall(r"Arena allocation (head|total) (\d+) bytes", text)}
    if "head" not in found:
        raise McuforgeError(f"tflite-micro did not report its arena:\n{text[-2000:]}")
    return found


def latency_us(model: bytes, iterations: int = 20) -> float:
    """Best-of-3 mean time of TFLM's invoke (reference kernels, as the pip package ships)."""
    it = _interpreter(model)
    inputs = []
    for i in range(_io_counts(model)[0]):
        d = it.get_input_details(i)
        inputs.append(np.zeros(d["shape"], dtype=d["dtype"]))
    best = None
    for _ in range(3):
        t0 = time.perf_counter()
        for _ in range(iterations):
            for k, x in enumerate(inputs):
                it.set_input(x, k)
            it.invoke()
        dt = (time.perf_counter() - t0) / iterations * 1e6
        best = dt if best is None else min(best, dt)
    return best
