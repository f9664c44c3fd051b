"""ONNX operator converters: one function per op, named as the op, attributes as keyword
arguments with the spec's defaults. The modules below register themselves on import."""
from __future__ import annotations

from .onnx import onnx_op


@onnx_op("Identity", "Dropout")
def Identity(ctx, x, *rest, seed=None, ratio=None, training_mode=None):
    """A copy the optimizer removes (the output becomes an alias of the input)."""
    ctx.emit("reshape", [x])
    if len(ctx.outputs) > 1 and ctx.outputs[1] is not None:
        raise_unsupported("Dropout's mask output")


def raise_unsupported(what: str):
    from .onnx import Unsupported
    raise Unsupported(f"{what} is not supported")


from . import onnx_data, onnx_elementwise, onnx_layers  # noqa: E402,F401  (register converters)
