"""Lowering of graph nodes to loop-IR kernels: one function per op, registered by `lowers`.

A lowering gets an `OpContext` (the node, its tensors, the kernel name) and returns a
`loop_ir.Kernel` whose parameter buffers are named `x`, `x1`, ... for activation inputs and
`y`, `y1`, ... for outputs, in the node's order. Aliases (reshape, view slice / concat:
ir/graph.py is_alias) have no kernel.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from mcuforge.ir.graph import Graph, Node, Tensor, is_alias

from .. import loop_ir as ir

LOWERINGS = {}  # op -> the default lowering
SPECIAL = {}  # op -> [(predicate on OpContext, lowering)]: tried first, in registration order


def lowers(*ops, when=None):
    """Register a lowering for `ops`. With `when` (OpContext -> bool) it serves only the nodes
    it accepts (say, quantized ones) and is tried before the default, so a variant of an op can
    live in a file of its own."""
    def register(fn):
        for op in ops:
            if when is None:
                LOWERINGS[op] = fn
            else:
                SPECIAL.setdefault(op, []).append((when, fn))
        return fn
    return register


@dataclass
class OpContext:
    node: Node
    graph: Graph
    name: str  # C name of the kernel

    def input(self, i: int) -> Tensor | None:
        names = self.node.inputs
        return self.graph.tensors[names[i]] if i < len(names) and names[i] else None

    def output(self, i: int = 0) -> Tensor:
        return self.graph.tensors[self.node.outputs[i]]

    @property
    def attrs(self) -> dict:
        return self.node.attrs

    def io_buffers(self) -> list:
        """Parameter buffers for the node's non-constant inputs and its outputs."""
        bufs, k = [], 0
        for n in self.node.inputs:
            t = self.graph.tensors[n] if n else None
            if t is not None and not t.is_const:
                bufs.append(ir.Buffer("x" if k == 0 else f"x{k}", t.dtype, t.size, "in",
                                      comment=t.name))
                k += 1
        for i, n in enumerate(self.node.outputs):
            t = self.graph.tensors[n]
            bufs.append(ir.Buffer("y" if i == 0 else f"y{i}", t.dtype, t.size, "out",
                                  comment=t.name))
        return bufs


def const(name: str, data, dtype: str, comment: str = "") -> ir.Buffer:
    if data is None:  # an operand the lowering reads as a table is computed at run time
        raise NotImplementedError(f"operand '{comment or name}' is computed at run time; this "
                                  "layer needs it constant")
    arr = np.ascontiguousarray(np.asarray(data).astype(dtype)).reshape(-1)
    return ir.Buffer(name, dtype, arr.size, "const", arr, comment)


def operand(ctx: OpContext, i: int, name: str, dtype: str | None = None):
    """(buffer name, buffers to add) of input i read as a table: a const table `name` when the
    input is constant, else its parameter buffer (x<k>, as io_buffers names it): run-time
    weights are read from the arena. Integer layers need constant weights (their arithmetic
    is fixed at compile time)."""
    t = ctx.input(i)
    if t.is_const:
        return name, [const(name, t.data, dtype or t.dtype, t.name)]
    if t.dtype != "float32":
        raise NotImplementedError(f"operand '{t.name}' ({t.dtype}) is computed at run time; "
                                  "this layer needs it constant")
    k = sum(1 for n in ctx.node.inputs[:i] if n and not ctx.graph.tensors[n].is_const)
    return ("x" if k == 0 else f"x{k}"), []


def per_channel(values, name: str, index: ir.Expr, dtype: str = "int32"):
    """A Const when all channels share the value, else a load from a const table.
    Returns (expr, buffers-to-add)."""
    values = np.asarray(values).reshape(-1)
    if np.all(values == values[0]):
        return ir.Const(int(values[0]), dtype), []
    return ir.Load(name, index, dtype), [const(name, values, dtype)]


def qinfo(t: Tensor) -> str:
    if t.quant is None:
        return f"{t.dtype}{list(t.shape)}"
    q = t.quant
    if q.per_axis:
        return f"{t.dtype}{list(t.shape)} per-channel scales (axis {q.axis})"
    return f"{t.dtype}{list(t.shape)} scale {q.scale[0]:.9g} zero point {q.zero_point[0]}"


def describe(ctx: OpContext, extra: str = "") -> str:
    lines = [f"{ctx.node.op} '{ctx.node.name or ctx.node.outputs[0]}'"]
    for i, n in enumerate(ctx.node.inputs):
        if n:
            lines.append(f"in{i}: {qinfo(ctx.graph.tensors[n])}")
    for n in ctx.node.outputs:
        lines.append(f"out: {qinfo(ctx.graph.tensors[n])}")
    if extra:
        lines.append(extra)
    return "\n".join(lines)


def float_activation(v: ir.Expr, activation: str) -> ir.Expr:
    """A fused activation applied to a float value: the clamp to its range."""
    lo, hi = {"none": (None, None), "relu": (0.0, None), "relu6": (0.0, 6.0),
              "relu_n1_to_1": (-1.0, 1.0)}[activation]
    v = v if lo is None else ir.vmax(v, ir.Const(lo, "float32"))
    return v if hi is None else ir.vmin(v, ir.Const(hi, "float32"))


def reference_kernel(node: Node, graph: Graph, name: str) -> ir.Kernel | None:
    """The node's reference lowering: the loop IR that defines its numerics (None: an alias,
    no kernel)."""
    if is_alias(node):
        return None
    _load_all()
    ctx = OpContext(node, graph, name)
    for when, fn in SPECIAL.get(node.op, ()):
        if when(ctx):
            return fn(ctx)
    if node.op not in LOWERINGS:
        raise NotImplementedError(f"no lowering for op {node.op}")
    return LOWERINGS[node.op](ctx)



def _load_all():
    from . import (conv, datamove, elementwise, generic_data, generic_elementwise,  # noqa: F401
                   layers_float, lut_ort, matmul_ort, pool, pool_ort, q_binary, q_data, q_int16,
                   q_layers, q_math, q_reduce, q_uint8, softmax, state,
                   transpose)  # (each registers its lowerings)
