"""Graph + memory plan -> the C sources of a model (model.c, model.h) through the templates."""
from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from mcuforge.errors import UnsupportedOpError
from mcuforge.graph import Graph, Tensor
from mcuforge.resources import render
from optimizer.memory_plan import MemoryPlan

from . import printer
from .lower import lower_node


MATH_PREFIX = "mfm_"  # runtime functions of runtime_c/mcuforge_math.h


@dataclass
class Port:
    """A model input or output as the generated API exposes it."""
    index: int
    name: str  # the model's tensor name
    ctype: str
    dtype: str
    shape: tuple
    size: int  # elements
    nbytes: int
    offset: int
    scale: float | None
    zero_point: int | None

    @property
    def scale_c(self) -> str:
        return printer.c_float(self.scale)


@dataclass
class LayerCall:
    kernel_name: str
    comment: str
    args: list  # C expressions, one per kernel parameter


@dataclass
class StateCopy:
    """End of an invocation: a state tensor takes its next value."""
    comment: str
    dst: str  # C expression of the state buffer
    src: str  # C expression of the next value
    nbytes: int


@dataclass
class StateInit:
    comment: str
    dst: str
    default: int  # the byte reset fills the buffer with
    src: str | None  # a const array init copies in after the reset; None: the default
    nbytes: int


@dataclass
class GeneratedModel:
    name: str
    files: dict  # file name -> text
    kernels: list
    macs: int
    weight_bytes: int
    inputs: list  # Port
    outputs: list


def c_identifier(text: str, limit: int = 40) -> str:
    s = re.sub(r"[^0-9A-Za-z]+", "_", text).strip("_")
    return (s[:limit].rstrip("_") or "t")


def short_name(tensor_name: str) -> str:
    """A readable C fragment of a framework tensor name ('a/b/Relu;a/b/BiasAdd' -> 'b_Relu')."""
    first = tensor_name.split(";")[0]
    parts = [p for p in first.split("/") if p]
    return c_identifier("_".join(parts[-2:]) if parts else first, 32)


def _port(g: Graph, name: str, index: int, offset: int) -> Port:
    t: Tensor = g.tensors[name]
    q = t.quant
    return Port(index, name, printer.C_TYPES[t.dtype], t.dtype, tuple(t.shape), t.size, t.nbytes,
                offset, float(q.scale[0]) if q else None, int(q.zero_point[0]) if q else None)


def generate(g: Graph, plan: MemoryPlan, name: str) -> GeneratedModel:
    kernels, calls, consts = [], [], []
    for i, node in enumerate(g.nodes):
        kname = f"l{i:02d}_{node.op}_{short_name(node.outputs[0])}"
        try:
            k = lower_node(node, g, kname)
        except (NotImplementedError, ValueError) as e:
            raise UnsupportedOpError(
                f"node {i} ({node.op}, output '{node.outputs[0]}') cannot be compiled: {e}. "
                f"Change the model so this layer avoids it, or report it as a missing "
                f"feature.") from e
        if k is None:
            continue
        kernels.append(k)
        names = {b.name: f"{k.name}_{b.name}" for b in k.consts}
        consts += [printer.print_array(names[b.name], b.dtype, b.data) for b in k.consts]
        args = []
        tensors = [t for t in node.inputs if t and not g.tensors[t].is_const] + list(node.outputs)
        for b, tname in zip(k.params, tensors):
            const = "const " if b.kind == "in" else ""
            args.append(f"({const}{printer.C_TYPES[b.dtype]} *){_address(plan, tname)}")
        comment = f"{node.op} -> {node.outputs[0]}"
        calls.append(LayerCall(k.name, comment.replace("*/", "* /"), args))
        consts.append(printer.print_kernel(k, names))
    state_copies, state_inits = _state(g, plan, consts)
    inputs = [_port(g, n, i, plan.offsets[n]) for i, n in enumerate(g.inputs)]
    outputs = [_port(g, n, i, plan.offsets[n]) for i, n in enumerate(g.outputs)]
    macs = sum(k.macs for k in kernels)
    weight_bytes = sum(b.data.nbytes for k in kernels for b in k.consts)
    # float math (expf, erff, ...) comes from mcuforge_math.h, included only when used: int8
    # models need nothing beyond <stdint.h>, <stddef.h> and <string.h>
    uses_math = any(MATH_PREFIX in d for d in consts)
    ctx = dict(name=name, NAME=name.upper(), graph=g, plan=plan, inputs=inputs, outputs=outputs,
               calls=calls, definitions=consts, macs=macs, weight_bytes=weight_bytes,
               uses_math=uses_math, state_copies=state_copies, state_inits=state_inits,
               state_size=plan.state_size, ops=sorted({n.op for n in g.nodes}))
    files = {
        f"{name}.h": render("model.h.j2", ctx),
        f"{name}.c": render("model.c.j2", ctx),
    }
    return GeneratedModel(name, files, kernels, macs, weight_bytes, inputs, outputs)


def _address(plan: MemoryPlan, tensor: str) -> str:
    if tensor in plan.state_offsets:
        return f"&state.bytes[{plan.state_offsets[tensor]}]"
    return f"&arena.bytes[{plan.offsets[tensor]}]"


def _state(g: Graph, plan: MemoryPlan, consts: list) -> tuple:
    """The copies that end an invocation (next values into the state block) and the reset
    values. Copies reading the state block come first, so each reads the value the
    invocation started with."""
    copies, inits = [], []
    for k, (name, nxt) in enumerate(g.state.items()):
        t = g.tensors[name]
        dst = _address(plan, name)
        label = f"state '{name}' {t.dtype}{list(t.shape)}"
        if g.tensors[nxt].is_const:
            src = f"state{k}_next"
            consts.append(printer.print_array(src, t.dtype, g.tensors[nxt].data))
        else:
            src = _address(plan, nxt)
        if src != dst:
            copies.append(StateCopy(f"{label} <- '{nxt}'", dst, src, t.nbytes))
        # tflite-micro's default: the zero point byte for int8 state, else zeros
        default = int(t.quant.zero_point[0]) & 0xFF if t.dtype == "int8" and t.quant else 0
        init = g.state_init.get(name)
        src = None
        if init is not None:
            src = f"state{k}_init"
            consts.append(printer.print_array(src, t.dtype, np.asarray(init)))
        inits.append(StateInit(label, dst, default, src, t.nbytes))
    copies.sort(key=lambda c: not c.src.startswith("&state."))
    for i, c in enumerate(copies):
        if c.src.startswith("&state.") and any(c.src == d.dst for d in copies[:i]):
            raise UnsupportedOpError(f"state update {c.comment}: the next values of two state "
                                     "tensors read each other (a swap); not supported")
    return copies, inits


def io_dtypes(g: Graph) -> tuple:
    return ([np.dtype(g.tensors[n].dtype) for n in g.inputs],
            [np.dtype(g.tensors[n].dtype) for n in g.outputs])
