"""Conformance cases: state kept across invocations (resource variables, CALL_ONCE)."""
from __future__ import annotations

import numpy as np

from mcuforge.frontend.tflite_flatbuffer import TflOp, TflSubgraph

from . import TflCase, cases, q, tensor


def _accumulator(variant: str, dtype: str, quant=None, init=None, reset_at=0) -> TflCase:
    """acc += x each invocation; the output is the new sum. With `init`, a CALL_ONCE
    subgraph assigns the starting value."""
    shape = (1, 6)
    main = [tensor("x", shape, dtype, quant), tensor("acc", (), "resource"),
            tensor("old", shape, dtype, quant), tensor("sum", shape, dtype, quant),
            tensor("y", shape, dtype, quant)]
    ops = [TflOp("VAR_HANDLE", (), ("acc",), {"shared_name": "acc"}),
           TflOp("READ_VARIABLE", ("acc",), ("old",)),
           TflOp("ADD", ("old", "x"), ("sum",)),
           TflOp("ASSIGN_VARIABLE", ("acc", "sum"), ()),
           TflOp("READ_VARIABLE", ("acc",), ("y",))]
    subgraphs = [TflSubgraph(main, ops, ["x"], ["y"])]
    if init is not None:
        ops.insert(0, TflOp("CALL_ONCE", (), (), {"init_subgraph_index": 1}))
        init_sg = TflSubgraph(
            [tensor("h", (), "resource"), tensor("c", shape, dtype, quant, data=init)],
            [TflOp("VAR_HANDLE", (), ("h",), {"shared_name": "acc"}),
             TflOp("ASSIGN_VARIABLE", ("h", "c"), ())], [], [], "init")
        subgraphs.append(init_sg)
    return TflCase("ASSIGN_VARIABLE", variant, subgraphs, invocations=40 if reset_at else 20,
                   reset_at=reset_at)


@cases("ASSIGN_VARIABLE")
def variable_cases():
    start = np.arange(6, dtype=np.float32).reshape(1, 6) - 2.5
    return [_accumulator("float32_accumulator", "float32"),
            _accumulator("float32_call_once_init", "float32", init=start),
            _accumulator("float32_call_once_init_reset", "float32", init=start, reset_at=20),
            # int8: the variable starts (and resets) at its zero point, i.e. real 0
            _accumulator("int8_reset", "int8", q(0.02, -7), reset_at=20),
            _accumulator("int8_call_once_init", "int8", q(0.02, -7),
                         init=np.array([[-100, -50, 0, 20, 90, 127]], np.int8))]
