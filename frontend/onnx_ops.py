"""ONNX operator converters: one function per op, named as the op, attributes as keyword
arguments with the spec's defaults. The modules below register themselves on import."""
from __future__ import annotations

import numpy as np

from .onnx_registry import Unsupported, onnx_op


@onnx_op("Identity")
def Identity(ctx, x):
    """A copy the optimizer removes (the output becomes an alias of the input)."""
    ctx.emit("reshape", [x])


@onnx_op("Dropout")
def Dropout(ctx, x, ratio=None, training_mode=None, *, seed=None, is_test=None,
            consumed_inputs=None):
    """Inference: the identity. Training mode drops at random, which a compiled model
    cannot reproduce. (Before opset 12, ratio is an attribute, not an input.)"""
    if training_mode is not None and not training_mode.is_const:
        raise Unsupported("Dropout's training_mode is computed at run time; it must be a "
                          "constant")
    training = training_mode is not None and bool(np.asarray(training_mode.data).reshape(-1)[0])
    if ratio is not None and not isinstance(ratio, float):
        ratio = float(np.asarray(ratio.data)) if ratio.is_const else None
    zero_ratio = ratio == 0.0
    if training and not zero_ratio:
        raise Unsupported("Dropout in training mode (random) is not supported")
    if len(ctx.outputs) > 1 and ctx.outputs[1] is not None:
        raise Unsupported("Dropout's mask output is not supported")
    ctx.emit("reshape", [x], [ctx.out(0)])


from . import onnx_data, onnx_dynquant, onnx_elementwise, onnx_layers, onnx_quant  # noqa: E402,F401,E501  (register converters)
