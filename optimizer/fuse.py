"""Fusions into the layer that produces a tensor: BatchNorm into the weights and bias of a
convolution or fully-connected layer, and a following clamp (relu, relu6, clip) into the
layer's fused activation. Float only: int8 models from TFLite arrive fused, and a clamp after
an int8 layer works on different quantization parameters."""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from mcuforge.graph import Graph

from .passes import constant, fresh_name, only_consumer, producers, use_counts

WEIGHTED = ("conv2d", "depthwise_conv2d", "fully_connected")
# output channel axis of the weights: conv2d OHWI, depthwise 1HW(C*M), fully_connected [out, in]
CHANNEL_AXIS = {"conv2d": 0, "depthwise_conv2d": 3, "fully_connected": 0}
ACTIVATED = ("conv2d", "depthwise_conv2d", "fully_connected", "add", "avg_pool2d", "max_pool2d")


def _float(*tensors) -> bool:
    return all(t.dtype == "float32" and t.quant is None for t in tensors)


def fold_batch_norms(g: Graph) -> Graph:
    """batch_norm(layer(x)) -> layer'(x) when the layer is a float conv2d, depthwise_conv2d or
    fully_connected without fused activation whose output only the batch_norm reads, and the
    batch_norm's scale, bias, mean and var are constants: with s = scale / sqrt(var + eps),
    the weights' output channels are scaled by s and the bias becomes bias * s + (beta -
    mean * s) (created when absent). Guarantees: the layer writes the batch_norm's output
    tensor; other readers of the original weights keep them (new constants are made); the
    arithmetic is done in float64 and rounded once to float32."""
    uses = use_counts(g)
    for bn in [n for n in g.nodes if n.op == "batch_norm"]:
        prod = producers(g)
        layer = prod.get(bn.inputs[0])
        if (layer is None or layer.op not in WEIGHTED
                or only_consumer(g, bn.inputs[0], uses) is not bn):
            continue
        stats = [g.tensors[t] if t else None for t in bn.inputs[1:5]]
        w = g.tensors[layer.inputs[1]]
        b = g.tensors[layer.inputs[2]] if len(layer.inputs) > 2 and layer.inputs[2] else None
        y = g.tensors[bn.outputs[0]]
        if (layer.attrs.get("activation", "none") != "none" or None in stats
                or not all(t.is_const for t in stats) or not w.is_const
                or (b is not None and not b.is_const)
                or not _float(g.tensors[bn.inputs[0]], y, w, *stats, *([b] if b else []))):
            continue
        g = _fold_one(g, layer, bn, w, b, stats)
        uses = use_counts(g)
    return g


def _fold_one(g: Graph, layer, bn, w, b, stats) -> Graph:
    channels = g.tensors[bn.outputs[0]].shape[-1]
    scale, beta, mean, var = (np.broadcast_to(t.data.astype(np.float64).reshape(-1), (channels,))
                              for t in stats)
    s = scale / np.sqrt(var + np.float64(bn.attrs["epsilon"]))
    axis = CHANNEL_AXIS[layer.op]
    if w.shape[axis] != channels:
        return g
    shape = [1] * len(w.shape)
    shape[axis] = channels
    w_new = constant(fresh_name(g, f"{w.name}__bn"), w.data.astype(np.float64) * s.reshape(shape),
                     w)
    bias = b.data.astype(np.float64).reshape(-1) if b is not None else np.zeros(channels)
    b_new = constant(fresh_name(g, f"{(b.name if b else bn.outputs[0])}__bn_bias"),
                     bias * s + (beta - mean * s), dtype="float32")
    fused = replace(layer, inputs=(layer.inputs[0], w_new.name, b_new.name, *layer.inputs[3:]),
                    outputs=bn.outputs)
    nodes = [fused if n is layer else n for n in g.nodes if n is not bn]
    tensors = {k: v for k, v in g.tensors.items() if k != bn.inputs[0]}
    tensors[w_new.name], tensors[b_new.name] = w_new, b_new
    return g.replace(nodes=nodes, tensors=tensors)


def _clamp_activation(n) -> str | None:
    """The fused activation equal to node n, or None."""
    if n.op in ("relu", "relu6"):
        return n.op
    if n.op == "unary" and n.attrs.get("fn") == "clip":
        lo, hi = n.attrs.get("min"), n.attrs.get("max")
        bounds = (None if lo is None else float(lo), None if hi is None else float(hi))
        return {(0.0, None): "relu", (0.0, 6.0): "relu6", (-1.0, 1.0): "relu_n1_to_1"}.get(bounds)
    return None


def fuse_activations(g: Graph) -> Graph:
    """act(layer(x)) -> layer(x) with activation=act, for act a relu, relu6, or clip to [0, 6],
    [-1, 1] or [0, inf), after a float conv2d, depthwise_conv2d, fully_connected, add,
    avg_pool2d or max_pool2d without a fused activation whose output only act reads.
    Guarantees: the layer writes the activation's output tensor; float tensors only, so no
    clamp crosses a change of quantization."""
    uses = use_counts(g)
    for act in list(g.nodes):
        kind = _clamp_activation(act)
        if kind is None:
            continue
        prod = producers(g)
        layer = prod.get(act.inputs[0])
        if (layer is None or layer.op not in ACTIVATED or len(layer.outputs) != 1
                or layer.attrs.get("activation", "none") != "none"
                or only_consumer(g, act.inputs[0], uses) is not act
                or not _float(g.tensors[act.inputs[0]], g.tensors[act.outputs[0]])
                or g.tensors[act.inputs[0]].shape != g.tensors[act.outputs[0]].shape):
            continue
        fused = replace(layer, attrs={**layer.attrs, "activation": kind}, outputs=act.outputs)
        g = g.replace(nodes=[fused if n is layer else n for n in g.nodes if n is not act],
                      tensors={k: v for k, v in g.tensors.items() if k != act.inputs[0]})
        uses = use_counts(g)
    return g
