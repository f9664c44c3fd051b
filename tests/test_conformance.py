"""Per-operator conformance: every single-op model of op_models, written as a .tflite by our
writer, compiled to C, built with gcc and run, is bit-exact with tflite-micro's interpreter.
The loop-IR evaluator (Python) runs the same lowering and must agree too."""
import numpy as np
import pytest

import op_models
from op_models import random_inputs, run_tflm
from mcuforge.codegen_c.evaluate_graph import run_graph
from mcuforge.frontend.tflite import load_tflite
from mcuforge.frontend.tflite_writer import write_tflite
from mcuforge import runner

CASES = op_models.all_cases()
SEEDS = (0, 1, 2)


def _batched(g, seeds):
    per_seed = [random_inputs(g, s) for s in seeds]
    return [np.stack([inputs[k] for inputs in per_seed]) for k in range(len(g.inputs))]


@pytest.mark.parametrize("name,graph", CASES, ids=[c[0] for c in CASES])
def test_generated_c_is_bit_exact_with_tflm(name, graph):
    model = write_tflite(graph)
    g = load_tflite(model)
    xs = _batched(g, SEEDS)
    ours = runner.run(model, dict(zip(g.inputs, xs)) if len(xs) > 1 else xs[0])
    ours = list(ours.values()) if isinstance(ours, dict) else [ours]
    for i, seed in enumerate(SEEDS):
        ref = run_tflm(model, [x[i] for x in xs])
        for k, r in enumerate(ref):
            got = ours[k][i]
            assert got.dtype == r.dtype and got.shape == r.shape, name
            if got.dtype == np.float32:
                assert np.array_equal(got.view(np.uint32), r.view(np.uint32)), name
            else:
                mism = np.flatnonzero(got.reshape(-1) != r.reshape(-1))
                assert mism.size == 0, (f"{name} seed {seed}: {mism.size}/{got.size} differ, "
                                        f"first at {mism[0]}: {got.reshape(-1)[mism[0]]} vs "
                                        f"{r.reshape(-1)[mism[0]]}")


@pytest.mark.parametrize("name,graph", CASES, ids=[c[0] for c in CASES])
def test_loop_ir_evaluator_matches_tflm(name, graph):
    model = write_tflite(graph)
    g = load_tflite(model)
    xs = random_inputs(g, 0)
    ref = run_tflm(model, xs)
    values = run_graph(g, dict(zip(g.inputs, xs)))
    for out, r in zip(g.outputs, ref):
        assert np.array_equal(values[out].reshape(-1), r.reshape(-1)), name
