"""Conformance cases: unary elementwise operators."""
from __future__ import annotations

from . import cases, q, single, tensor, uniform


@cases("ABS")
def abs_cases():
    shape = (2, 3, 5)
    return [
        single("ABS", "float32", [tensor("x", shape, "float32")],
               [tensor("y", shape, "float32")]),
    ]


@cases("EXP")
def exp_cases():
    shape = (1, 4, 6)
    return [single("EXP", "float32", [tensor("x", shape, "float32")],
                   [tensor("y", shape, "float32")], gens={"x": uniform(-6, 6)})]
