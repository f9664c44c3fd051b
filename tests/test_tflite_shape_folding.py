"""Shape computations fold at compile time: SHAPE -> STRIDED_SLICE -> PACK (or CONCATENATION)
-> RESHAPE compiles to the reshape alone (a zero-copy alias), and the output equals TFLM's."""
from __future__ import annotations

import numpy as np
import pytest

from mcuforge.frontend.tflite import load_tflite
from mcuforge.tools import conformance, conformance_tflite
from mcuforge.ir.graph import Graph, Node, Tensor
from mcuforge.tools.tflite_cases import shape as shape_cases
from mcuforge.optimizer.fold import fold_constants
from mcuforge.optimizer.pipeline import optimize
from conftest import require_tflm

CASES = [shape_cases.flatten_by_shape_case(), shape_cases.flatten_by_concat_case()]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_only_the_reshape_is_left(case):
    g = optimize(load_tflite(case.model()))
    assert [n.op for n in g.nodes] == ["reshape"]
    [node] = g.nodes
    assert node.inputs[0] == "x" and node.outputs == ("y",)
    shape = g.tensors[node.inputs[1]]  # the folded shape operand, read by nobody at run time
    assert shape.is_const and shape.data.tolist() == list(g.tensors["y"].shape[:1]) + [-1]


def test_the_frontend_folds_shape_strided_slice_and_pack():
    """No node but the reshape even before the optimizer runs: the converters folded them."""
    g = load_tflite(shape_cases.flatten_by_shape_case().model())
    assert [n.op for n in g.nodes] == ["reshape"]


def test_a_shape_output_is_written_by_a_copy():
    """SHAPE straight to a graph output: the folded constant is copied into the arena."""
    [case] = [c for c in shape_cases.shape_cases() if c.name == "shape_int8_rank2"]
    g = optimize(load_tflite(case.model()))
    [node] = g.nodes
    assert node.op == "broadcast_to" and node.outputs == ("y",)
    assert g.tensors[node.inputs[0]].data.tolist() == [2, 7]


def test_the_optimizer_folds_slice_concat_and_tile():
    """Shape arithmetic other converters leave as nodes folds too, in one sweep."""
    c = np.array([4, 3, 2, 1], np.int32)
    t = {n: Tensor(n, s, "int32", d) for n, s, d in [
        ("c", (4,), c), ("minus", (1,), np.array([-1], np.int32)), ("x", (6,), None),
        ("a", (2,), None), ("b", (3,), None), ("d", (6,), None), ("y", (6,), None)]}
    nodes = [Node("slice", ("c",), ("a",), {"starts": (2,), "ends": (None,), "steps": (-2,)}),
             Node("concat", ("a", "minus"), ("b",), {"axis": 0, "activation": "none"}),
             Node("tile", ("b",), ("d",), {"repeats": (2,)}),
             Node("binary", ("x", "d"), ("y",), {"fn": "add"})]
    g = fold_constants(Graph(t, nodes, ["x"], ["y"]))
    assert [n.op for n in g.nodes] == ["binary"]
    assert g.tensors["d"].data.tolist() == [2, 4, -1, 2, 4, -1]


def test_outputs_equal_tflm():
    require_tflm()
    cases = conformance_tflite.load_cases("flatten_by")
    assert sorted(c.name for c in cases) == sorted(c.name for c in CASES)
    for c in cases:  # the reference really is the input reshaped
        for inputs, outputs in c.data_sets:
            np.testing.assert_array_equal(outputs[0], inputs[0].reshape(outputs[0].shape))
    results = conformance.run_cases(cases, jobs=1)
    assert [r.status for r in results] == ["passed"] * len(CASES), [r.reason for r in results]
