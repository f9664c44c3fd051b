"""Schedule transformations keep a lowered kernel's results: evaluator before == after."""
from dataclasses import replace

import numpy as np
import pytest

import op_models
from mcuforge.codegen_c import loop_ir as ir
from mcuforge.codegen_c import schedule
from mcuforge.codegen_c.evaluate import run_kernel
from mcuforge.codegen_c.lower import reference_kernel
from mcuforge.frontend.tflite import load_tflite
from mcuforge.frontend.tflite_writer import write_tflite

CASES = dict(op_models.all_cases())


def _conv_kernel(case="conv2d_3x3_s2_same_none_pc"):
    g = load_tflite(write_tflite(CASES[case]))
    return g, reference_kernel(g.nodes[0], g, "k")


def _run(g, k):
    x = op_models.random_inputs(g, 3)[0].reshape(-1)
    y = np.zeros(g.tensors[g.outputs[0]].size, np.int8)
    run_kernel(k, {"x": x, "y": y})
    return y


def test_split_reorder_unroll_preserve_results():
    g, k = _conv_kernel()
    before = _run(g, k)
    oc = schedule.find_loop(k.body, "oc").extent
    body = schedule.split(k.body, "oc", 2 if oc % 2 == 0 else 1)
    body = schedule.reorder(body, "oy", "ox")
    body = schedule.unroll(body, "kx")
    after = replace(k, body=body)
    assert _run(g, after).tolist() == before.tolist()
    loops = [s.var for s in ir.walk(body) if isinstance(s, ir.Loop)]
    assert loops.index("ox") < loops.index("oy") and "oc_o" in loops and "kx" not in loops


@pytest.mark.parametrize("factor", [2, 3, 4, 7, 64])
def test_split_with_tails_preserves_results(factor):
    """Any factor with `tail`: the main loops plus a tail loop store the same values."""
    g, k = _conv_kernel()
    before = _run(g, k)
    n = schedule.find_loop(k.body, "oc").extent
    body = schedule.split(k.body, "oc", factor, tail=True)
    assert _run(g, replace(k, body=body)).tolist() == before.tolist()
    loops = {s.var: s.extent for s in ir.walk(body) if isinstance(s, ir.Loop)}
    assert "oc" not in loops
    assert loops.get("oc_t", 0) == n % factor and loops.get("oc_o", 0) == n // factor


def test_transformations_refuse_what_would_change_meaning():
    g, k = _conv_kernel()
    with pytest.raises(ValueError):
        schedule.split(k.body, "oc", 7)  # does not divide the extent
    with pytest.raises(ValueError):
        schedule.unroll(k.body, "oc")  # body declares the accumulator
    with pytest.raises(ValueError):
        schedule.reorder(k.body, "oc", "ky")  # not perfectly nested
    with pytest.raises(KeyError):
        schedule.split(k.body, "nope", 2)
