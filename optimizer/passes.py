"""Small graph passes. Each is a function Graph -> Graph; the docstring says what it guarantees."""
from __future__ import annotations

from mcuforge.graph import Graph


def remove_dead_nodes(g: Graph) -> Graph:
    """Drop nodes none of whose outputs reach a graph output, and tensors nothing references.
    Guarantees: the graph's outputs and their whole producing cone are kept, order unchanged."""
    needed = set(g.outputs)
    kept = []
    for n in reversed(g.nodes):
        if any(t in needed for t in n.outputs):
            kept.append(n)
            needed.update(t for t in n.inputs if t)
    kept.reverse()
    used = set(g.inputs) | set(g.outputs) | {t for n in kept for t in (*n.inputs, *n.outputs) if t}
    tensors = {k: v for k, v in g.tensors.items() if k in used}
    return g.replace(nodes=kept, tensors=tensors)
