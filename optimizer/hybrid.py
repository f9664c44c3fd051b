"""Hybrid models (int8 weights, float activations, as TFLite's dynamic-range quantization
writes them): TFLM refuses them; mcuforge dequantizes the weights at compile time."""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from mcuforge.ir.graph import Graph

WEIGHTED_OPS = ("conv2d", "depthwise_conv2d", "fully_connected")


def dequantize(t) -> np.ndarray:
    """scale * (q - zero_point) in float32, per axis when the quantization is per axis."""
    q = t.quant
    data = t.data.astype(np.float32)
    scale = np.asarray(q.scale, dtype=np.float32)
    zp = np.asarray(q.zero_point, dtype=np.float32)
    if q.per_axis:
        shape = [1] * data.ndim
        shape[q.axis] = -1
        scale, zp = scale.reshape(shape), zp.reshape(shape)
    return ((data - zp) * scale).astype(np.float32)


def dequantize_hybrid_weights(g: Graph) -> Graph:
    """Float layers with quantized constant weights or bias get float32 constants instead.
    Guarantees: no conv2d/depthwise_conv2d/fully_connected mixes a float32 input with
    quantized constants; int8 layers and float layers with float weights are unchanged."""
    tensors = dict(g.tensors)
    for n in g.nodes:
        if n.op not in WEIGHTED_OPS or tensors[n.inputs[0]].dtype != "float32":
            continue
        for name in n.inputs[1:]:
            t = tensors.get(name) if name else None
            if t is not None and t.is_const and t.dtype != "float32" and t.quant is not None:
                tensors[name] = replace(t, dtype="float32", data=dequantize(t), quant=None)
    return g.replace(tensors=tensors)
