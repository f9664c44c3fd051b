"""The optimizer pipeline: one flat, named sequence of Graph -> Graph passes.

Every pass keeps the graph's values, input and output names; each documents what it
guarantees. int8 graphs from TFLite go through the same sequence: the float-only fusions and
the layout passes (TFLite graphs are NHWC already) leave them as they are.
"""
from __future__ import annotations

from dataclasses import replace

from mcuforge.ir.graph import SUBGRAPH_ATTRS, Graph, verify

from .fold import fold_constants
from .fuse import fold_batch_norms, fold_scale_shift, fuse_activations
from .hybrid import dequantize_hybrid_weights
from .layout import (merge_transposes, sink_transposes, transposes_into_weights,
                     transposes_to_reshapes)
from .passes import remove_dead_nodes, remove_identities


def fixpoint(*passes, limit: int = 32):
    """A pass running `passes` in order until the graph stops changing."""
    def run(g: Graph) -> Graph:
        for _ in range(limit):
            before = signature(g)
            for p in passes:
                g = p(g)
            if signature(g) == before:
                break
        return g
    run.__name__ = "fixpoint(" + ", ".join(p.__name__ for p in passes) + ")"
    run.__doc__ = "Until nothing changes: " + " Then: ".join(
        (p.__doc__ or p.__name__).strip().splitlines()[0] for p in passes)
    return run


def signature(g: Graph) -> list:
    return [(n.op, n.inputs, n.outputs, repr(sorted(n.attrs.items()))) for n in g.nodes]


def optimize_subgraphs(g: Graph) -> Graph:
    """The subgraphs of control-flow nodes (if / while) through this same pipeline, each on
    its own (the passes above treat those nodes as opaque and never fold them). Guarantees:
    every subgraph keeps its input and output names, so it still matches its node."""
    nodes = []
    for n in g.nodes:
        if n.op in SUBGRAPH_ATTRS:
            n = replace(n, attrs={**n.attrs, **{a: optimize(n.attrs[a])
                                                for a in SUBGRAPH_ATTRS[n.op]}})
        nodes.append(n)
    return g.replace(nodes=nodes)


PIPELINE = [
    remove_dead_nodes,  # nodes whose outputs nothing reads
    dequantize_hybrid_weights,  # int8 weights of float layers (hybrid TFLite) -> float32
    fold_constants,  # all-constant nodes (weight transposes, shape arithmetic) -> constants
    remove_identities,  # same-shape reshapes (ONNX Identity, Dropout) -> their input
    # layout: the NCHW <-> NHWC transposes the ONNX frontend puts around every layer meet
    # and cancel, so activations stay NHWC between layers
    fixpoint(merge_transposes, sink_transposes),
    transposes_to_reshapes,  # transposes that only move size-1 axes -> zero-copy reshapes
    transposes_into_weights,  # NCHW flatten -> fully_connected: weights' columns permuted instead
    fold_batch_norms,  # conv/fc -> batch_norm: scale and shift folded into weights and bias
    fold_scale_shift,  # conv/fc -> mul/add/sub by per-channel constants: the same, unfused BN
    fuse_activations,  # conv/fc/add/pool -> relu/relu6/clip: the layer's fused activation
    remove_dead_nodes,  # what the passes above left unread
    optimize_subgraphs,  # if / while: their subgraphs through this whole list, recursively
]


def optimize(g: Graph, check: bool = True, passes=None) -> Graph:
    """Run every pass in order; with `check`, verify the IR after each one."""
    for p in PIPELINE if passes is None else passes:
        g = p(g)
        if check:
            verify(g)
    return g
