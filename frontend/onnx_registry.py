"""The ONNX converter API: the converter registry and what a converter works with. The op
modules (frontend/onnx_ops.py and the modules it imports, frontend/onnx_quant_lut.py) import it;
frontend/onnx.py imports them, so their converters register, and runs the converters.

Operators are converter functions registered with `@onnx_op("Conv", since=11)`, named as the op,
attributes as keyword arguments with the spec's defaults; the newest registration not newer
than the model's opset is used (`converter`). A converter gets an OnnxContext (the node, its
output tensors, the Builder collecting graph IR tensors and nodes) and the input tensors, and
raises Unsupported for a variant it cannot express. to_nhwc / from_nhwc put the transposes
around a layer, ONNX being NCHW and the graph IR NHWC.
"""
from __future__ import annotations

import numpy as np

from mcuforge.ir.graph import Node, Tensor

CONVERTERS: dict = {}  # op_type -> [(since_version, fn)], sorted by version


def onnx_op(*names, since: int = 1):
    def register(fn):
        for name in names:
            CONVERTERS.setdefault(name, []).append((since, fn))
            CONVERTERS[name].sort(key=lambda p: p[0])
        return fn
    return register


def converter(op_type: str, opset: int):
    best = None
    for since, fn in CONVERTERS.get(op_type, []):
        if since <= opset:
            best = fn
    return best


class Unsupported(Exception):
    """Raised by a converter for an op variant (attribute, dtype) it cannot express."""


class Builder:
    """Collects graph IR tensors and nodes while converters run."""

    def __init__(self, opset: int):
        self.opset = opset
        self.tensors: dict = {}
        self.nodes: list = []
        self._fresh = 0

    def tensor(self, name: str) -> Tensor:
        return self.tensors[name]

    def add_tensor(self, t: Tensor) -> Tensor:
        self.tensors[t.name] = t
        return t

    def fresh(self, hint: str, shape, dtype: str, data=None) -> Tensor:
        """A new tensor with a unique name derived from `hint`."""
        while True:
            self._fresh += 1
            name = f"{hint}__{self._fresh}"
            if name not in self.tensors:
                break
        if data is not None:
            data = np.ascontiguousarray(np.asarray(data).astype(dtype).reshape(shape))
        return self.add_tensor(Tensor(name, tuple(int(d) for d in shape), dtype, data))

    def const(self, hint: str, value, dtype: str | None = None) -> Tensor:
        arr = np.asarray(value)
        dtype = dtype or _np_dtype_name(arr.dtype)
        return self.fresh(hint, arr.shape, dtype, arr)

    def emit(self, op: str, inputs, outputs, name: str = "", **attrs) -> Node:
        node = Node(op, tuple(t.name if isinstance(t, Tensor) else (t or "") for t in inputs),
                    tuple(t.name if isinstance(t, Tensor) else t for t in outputs), attrs, name)
        self.nodes.append(node)
        return node


class OnnxContext:
    """What a converter sees: the node, its output tensors (shapes known), the builder."""

    def __init__(self, b: Builder, node, outputs: list):
        self.b = b
        self.node = node
        self.outputs = outputs
        self.name = node.name or (node.output[0] if node.output else node.op_type)

    @property
    def opset(self) -> int:
        return self.b.opset

    def out(self, i: int = 0) -> Tensor:
        return self.outputs[i]

    def emit(self, op: str, inputs, outputs=None, **attrs) -> Node:
        return self.b.emit(op, inputs, outputs if outputs is not None else [self.out()],
                           self.name, **attrs)

    def tmp(self, shape, dtype: str, hint: str = "t") -> Tensor:
        return self.b.fresh(f"{self.out().name}_{hint}", shape, dtype)

    def const(self, value, dtype: str | None = None, hint: str = "c") -> Tensor:
        return self.b.const(f"{self.out().name}_{hint}", value, dtype)


def _np_dtype_name(dt) -> str:
    name = np.dtype(dt).name
    return "bool" if name == "bool" else name


def to_nhwc(ctx: OnnxContext, x: Tensor) -> Tensor:
    """NCHW -> NHWC through an explicit transpose (the layout pass cancels pairs of them)."""
    n, c, *hw = x.shape
    y = ctx.tmp((n, *hw, c), x.dtype, "nhwc")
    ctx.emit("transpose", [x], [y], perm=(0, *range(2, len(x.shape)), 1))
    return y


def from_nhwc(ctx: OnnxContext, y_nhwc: Tensor, out: Tensor) -> None:
    """NHWC result -> the node's NCHW output through a transpose."""
    rank = len(y_nhwc.shape)
    ctx.emit("transpose", [y_nhwc], [out], perm=(0, rank - 1, *range(1, rank - 1)))
