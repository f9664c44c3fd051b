"""TFLite converters for state kept across invocations: resource variables (VAR_HANDLE,
READ_VARIABLE, ASSIGN_VARIABLE, CALL_ONCE) and the book of variable tensors that stateful
kernels (SVDF, LSTM) update.

The graph IR is functional: a state tensor holds the value an invocation starts with, and
`Graph.state` names the tensor holding its value at the end (the generated code copies it
back). Within one invocation, TFLite's reads and assignments are resolved at import time:
READ_VARIABLE aliases the variable's current value, ASSIGN_VARIABLE makes a tensor the
current value. CALL_ONCE's init subgraph runs at compile time and may only assign constants:
they become the variables' initial (reset) values.
"""
from __future__ import annotations

import tflite

from mcuforge.ir.graph import Tensor

from .tflite_ops import Unsupported, op


class VariableBook:
    """The model's state: variable tensors (is_variable) and resource variables."""

    def __init__(self):
        self.state = {}  # state tensor -> its current value (a tensor name)
        self.init = {}  # state tensor -> initial value
        self.resources = {}  # resource tensor name -> variable key
        self.variables = {}  # variable key -> state tensor name
        self.pending_init = {}  # variable key -> initial value set before its first use

    def variable_tensor(self, t: Tensor) -> None:
        """A tensor the model marks is_variable: state from the start. tflite-micro resets
        it to its default before the first invoke, so a buffer it may have is not used."""
        self.state.setdefault(t.name, t.name)

    def update(self, name: str, value: str) -> None:
        """A stateful kernel wrote the next value of variable tensor `name`."""
        if name not in self.state:
            raise KeyError(name)
        self.state[name] = value

    def bind(self, resource: str, key) -> None:
        self.resources[resource] = key

    def key(self, ctx, resource: str):
        if resource not in self.resources:
            raise ctx.error(f"resource tensor '{resource}' does not come from a VAR_HANDLE")
        return self.resources[resource]

    def variable(self, key, like: Tensor, add_tensor) -> str:
        """The state tensor of variable `key`, made on first use with `like`'s type."""
        if key not in self.variables:
            name = "variable/" + (key[1] or str(key[2]))
            add_tensor(Tensor(name, like.shape, like.dtype, None, like.quant))
            self.variables[key] = name
            self.state[name] = name
            if key in self.pending_init:
                self.init[name] = self.pending_init.pop(key)
        return self.variables[key]


def _key(ctx):
    o = ctx.options(tflite.VarHandleOptions)
    container = (o.Container() or b"").decode()
    shared = (o.SharedName() or b"").decode()
    # handles without a name are distinct variables
    return (container, shared, None if (container or shared) else ctx.outputs[0])


@op("VAR_HANDLE")
def var_handle(ctx):
    ctx.book.bind(ctx.outputs[0], _key(ctx))
    return []


@op("READ_VARIABLE")
def read_variable(ctx):
    out = ctx.output(0)
    name = ctx.book.variable(ctx.book.key(ctx, ctx.inputs[0]), out, ctx.add_tensor)
    current = ctx.tensor(ctx.book.state[name])
    if (current.shape, current.dtype) != (out.shape, out.dtype):
        raise ctx.error(f"reads {out.dtype}{list(out.shape)} from a variable holding "
                        f"{current.dtype}{list(current.shape)}")
    return ctx.node("reshape", {}, inputs=(current.name,))


@op("ASSIGN_VARIABLE")
def assign_variable(ctx):
    value = ctx.input(1)
    name = ctx.book.variable(ctx.book.key(ctx, ctx.inputs[0]), value, ctx.add_tensor)
    var = ctx.tensor(name)
    if (var.shape, var.dtype, var.quant) != (value.shape, value.dtype, value.quant):
        raise ctx.error(f"assigns {value.dtype}{list(value.shape)} to a variable holding "
                        f"{var.dtype}{list(var.shape)} (or with other quantization)")
    ctx.book.update(name, value.name)
    return []


@op("CALL_ONCE")
def call_once(ctx):
    index = ctx.options(tflite.CallOnceOptions).InitSubgraphIndex()
    for code, ins, outs, raw, const in ctx.subgraph(index):
        if code == "VAR_HANDLE":
            sub = type(ctx)(code, 0, ins, outs, None, raw)
            ctx.book.bind((index, outs[0]), _key(sub))  # resources named per subgraph
        elif code == "ASSIGN_VARIABLE" and const(1) is not None:
            key = ctx.book.resources.get((index, ins[0]))
            if key is None:
                raise Unsupported(f"init subgraph {index}: ASSIGN_VARIABLE of a resource "
                                  "that no VAR_HANDLE of that subgraph made")
            if key in ctx.book.variables:
                ctx.book.init[ctx.book.variables[key]] = const(1)
            else:
                ctx.book.pending_init[key] = const(1)
        else:
            raise Unsupported(f"init subgraph {index}: {code} (only VAR_HANDLE and "
                              "ASSIGN_VARIABLE of constants run at compile time)")
    return []
