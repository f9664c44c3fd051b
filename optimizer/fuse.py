"""Fusions into the layer that produces a tensor: BatchNorm into the weights and bias of a
convolution or fully-connected layer, and a following clamp (relu, relu6, clip) into the
layer's fused activation. Float only: int8 models from TFLite arrive fused, and a clamp after
an int8 layer works on different quantization parameters."""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from mcuforge.ir.graph import Graph

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
    return _scale_shift(g, layer, bn, bn.inputs[0], s, beta - mean * s, "bn")


def _scale_shift(g: Graph, layer, node, between: str, s, t, tag: str) -> Graph:
    """layer'(x) = layer(x) * s + t (per output channel, float64 vectors), written to node's
    output; `between` is the layer's output that node read. g unchanged when the weights have
    another number of output channels."""
    w = g.tensors[layer.inputs[1]]
    b = g.tensors[layer.inputs[2]] if len(layer.inputs) > 2 and layer.inputs[2] else None
    channels = len(s)
    axis = CHANNEL_AXIS[layer.op]
    if w.shape[axis] != channels:
        return g
    shape = [1] * len(w.shape)
    shape[axis] = channels
    w_new = constant(fresh_name(g, f"{w.name}__{tag}"),
                     w.data.astype(np.float64) * s.reshape(shape), w)
    bias = b.data.astype(np.float64).reshape(-1) if b is not None else np.zeros(channels)
    b_new = constant(fresh_name(g, f"{(b.name if b else node.outputs[0])}__{tag}_bias"),
                     bias * s + t, dtype="float32")
    fused = replace(layer, inputs=(layer.inputs[0], w_new.name, b_new.name, *layer.inputs[3:]),
                    outputs=node.outputs)
    nodes = [fused if n is layer else n for n in g.nodes if n is not node]
    tensors = {k: v for k, v in g.tensors.items() if k != between}
    tensors[w_new.name], tensors[b_new.name] = w_new, b_new
    return g.replace(nodes=nodes, tensors=tensors)


def _per_channel(c, out_shape) -> np.ndarray | None:
    """A constant's values as one float64 per channel (the last axis of out_shape) when it
    broadcasts along that axis alone (or is a scalar) without growing the output, else None."""
    rank = len(out_shape)
    if len(c.shape) > rank:
        return None
    full = (1,) * (rank - len(c.shape)) + tuple(c.shape)
    if any(d != 1 for d in full[:-1]) or full[-1] not in (1, out_shape[-1]):
        return None
    return np.broadcast_to(c.data.astype(np.float64).reshape(-1), (out_shape[-1],))


def fold_scale_shift(g: Graph) -> Graph:
    """mul(layer(x), c), add(layer(x), c) and layer(x) - c -> layer'(x), for c a float
    constant per output channel (shape (..., 1, C) or a scalar) and the layer a float conv2d,
    depthwise_conv2d or fully_connected without fused activation whose output only that node
    reads: its weights' output channels scaled by c (mul) and c added to (sub: taken from) its
    bias, created when absent. This is a BatchNorm that a converter wrote as Mul and Add (tf2onnx
    from Keras 3). Guarantees: the layer writes the node's output tensor; only nodes without a
    fused activation; other readers of the original weights keep them; float64 arithmetic,
    rounded once to float32."""
    while True:
        uses, prod = use_counts(g), producers(g)
        for n in g.nodes:
            if n.op in ("mul", "add") and n.attrs.get("activation", "none") == "none":
                sides = (0, 1)
            elif n.op == "binary" and n.attrs.get("fn") == "sub":
                sides = (0,)  # layer(x) - c only
            else:
                continue
            out = g.tensors[n.outputs[0]]
            h = g
            for k in sides:
                layer, c = prod.get(n.inputs[k]), g.tensors[n.inputs[1 - k]]
                if (layer is None or layer.op not in WEIGHTED or not c.is_const
                        or layer.attrs.get("activation", "none") != "none"
                        or only_consumer(g, n.inputs[k], uses) is not n
                        or g.tensors[n.inputs[k]].shape != out.shape
                        or not g.tensors[layer.inputs[1]].is_const
                        or not _float(g.tensors[n.inputs[k]], out, c,
                                      g.tensors[layer.inputs[1]])):
                    continue
                b = layer.inputs[2] if len(layer.inputs) > 2 else ""
                if b and not (g.tensors[b].is_const and _float(g.tensors[b])):
                    continue
                v = _per_channel(c, out.shape)
                if v is None:
                    continue
                one, zero = np.ones_like(v), np.zeros_like(v)
                s, t = (v, zero) if n.op == "mul" else (one, v) if n.op == "add" else (one, -v)
                h = _scale_shift(g, layer, n, n.inputs[k], s, t, "affine")
                if h is not g:
                    break
            if h is not g:
                g = h
                break
        else:
            return g


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
