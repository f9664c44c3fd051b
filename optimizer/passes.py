"""Small graph passes. Each is a function Graph -> Graph; the docstring says what it guarantees.
Passes never modify their input graph: they build new node lists and tensor dicts.

Also the helpers the other pass modules share: consumer counts, renaming, bypassing a node."""
from __future__ import annotations

from dataclasses import replace
from itertools import count

import numpy as np

from mcuforge.ir.graph import Graph, Node, Tensor


def remove_dead_nodes(g: Graph) -> Graph:
    """Drop nodes none of whose outputs reach a graph output, and tensors nothing references.
    Guarantees: the graph's outputs and their whole producing cone are kept, order unchanged."""
    needed = g.sinks()
    kept = []
    for n in reversed(g.nodes):
        if any(t in needed for t in n.outputs):
            kept.append(n)
            needed.update(t for t in n.inputs if t)
    kept.reverse()
    used = g.sources() | g.sinks() | {t for n in kept for t in (*n.inputs, *n.outputs) if t}
    tensors = {k: v for k, v in g.tensors.items() if k in used}
    return g.replace(nodes=kept, tensors=tensors)


def remove_identities(g: Graph) -> Graph:
    """Remove "reshape" nodes whose output has the input's shape, dtype and quantization: their
    consumers read the input instead (or, for a graph output, the input's producer writes the
    output directly). Guarantees: graph inputs and outputs keep their names; a reshape from a
    graph input (or a constant) straight to a graph output stays; values are unchanged."""
    kept = set()  # outputs of identities that must stay
    while True:
        n = next((n for n in g.nodes if n.op == "reshape" and n.outputs[0] not in kept
                  and same_value_type(g.tensors[n.inputs[0]], g.tensors[n.outputs[0]])), None)
        if n is None:
            return g
        h = bypass(g, n)
        if h is g:
            kept.add(n.outputs[0])
        g = h


# ---- helpers -------------------------------------------------------------------------------

def same_value_type(a: Tensor, b: Tensor) -> bool:
    return tuple(a.shape) == tuple(b.shape) and a.dtype == b.dtype and a.quant == b.quant


def use_counts(g: Graph) -> dict:
    """tensor -> number of node inputs reading it, plus one if it is a graph output or a next
    state value."""
    uses = {}
    for n in g.nodes:
        for t in n.inputs:
            if t:
                uses[t] = uses.get(t, 0) + 1
    for t in list(g.outputs) + list(g.state.values()):
        uses[t] = uses.get(t, 0) + 1
    return uses


def producers(g: Graph) -> dict:
    """tensor -> the node writing it."""
    return {t: n for n in g.nodes for t in n.outputs}


def only_consumer(g: Graph, tensor: str, uses: dict | None = None):
    """The single node reading `tensor` when nothing else reads it (nor is it a graph
    output), else None."""
    uses = use_counts(g) if uses is None else uses
    if uses.get(tensor, 0) != 1 or tensor in g.sinks():
        return None
    readers = [n for n in g.nodes if tensor in n.inputs]
    return readers[0] if len(readers) == 1 and readers[0].inputs.count(tensor) == 1 else None


def rename_inputs(nodes, old: str, new: str) -> list:
    """Nodes with every input `old` read as `new`."""
    return [n if old not in n.inputs else
            replace(n, inputs=tuple(new if t == old else t for t in n.inputs)) for n in nodes]


def bypass(g: Graph, node: Node) -> Graph:
    """Remove a node whose output holds the same values as its first input.
    Consumers read the input; when the output is a graph output, the input tensor takes the
    output's name instead. Returns g unchanged when neither is possible (the input is a graph
    input, a constant or a graph output itself, and the output is a graph output)."""
    src, dst = node.inputs[0], node.outputs[0]
    nodes = [n for n in g.nodes if n is not node]
    if dst not in g.sinks():
        return g.replace(nodes=rename_inputs(nodes, dst, src),
                         tensors={k: v for k, v in g.tensors.items() if k != dst})
    if src in g.sources() or src in g.sinks() or g.tensors[src].is_const:
        return g
    # the producer of src writes dst directly; src's other readers read dst
    nodes = [replace(n, outputs=tuple(dst if t == src else t for t in n.outputs))
             if src in n.outputs else n for n in nodes]
    return g.replace(nodes=rename_inputs(nodes, src, dst),
                     tensors={k: v for k, v in g.tensors.items() if k != src})


def fresh_name(g: Graph, hint: str, taken: set | None = None) -> str:
    """A tensor name not used in g, derived from `hint`."""
    taken = taken if taken is not None else set()
    if hint not in g.tensors and hint not in taken:
        return hint
    for i in count(1):
        name = f"{hint}_{i}"
        if name not in g.tensors and name not in taken:
            return name
    raise AssertionError("unreachable")


def constant(name: str, data, like: Tensor | None = None, dtype: str | None = None) -> Tensor:
    """A constant tensor holding `data` (cast to the dtype of `like`, or `dtype`)."""
    dtype = dtype or like.dtype
    arr = np.ascontiguousarray(np.asarray(data).astype(dtype))
    return Tensor(name, tuple(int(d) for d in arr.shape), dtype, arr)
