"""The optimizer pipeline: one flat, named sequence of Graph -> Graph passes."""
from __future__ import annotations

from mcuforge.graph import Graph, verify

from .passes import remove_dead_nodes


def optimize(g: Graph, check: bool = True) -> Graph:
    """Run every pass in order; with `check`, verify the IR after each one."""
    pipeline = [
        remove_dead_nodes,  # nodes whose outputs nothing reads
    ]
    for p in pipeline:
        g = p(g)
        if check:
            verify(g)
    return g
