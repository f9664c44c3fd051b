"""TFLite converters: control flow (IF, WHILE).

Each branch, condition and body subgraph is converted into a Graph of its own by the same
reader (`ctx.subgraph_graph`) and held in the node's attributes (graph IR ops "if" and
"while", ir/graph.py). The checks are those of tflite-micro's Prepare and of the copies
its Eval makes (kernels/if.cc, while.cc, kernel_util.cc): values move between the node and a
subgraph by memcpy, so counts must agree and each pair must have the same type and byte size;
shapes and quantization may differ (the bytes are not requantized).
"""
from __future__ import annotations

import tflite

from .tflite_ops import Unsupported, op


def _pairs(ctx, inner: list, outer: tuple, what: str) -> None:
    """Tensors `inner` (of a subgraph, or the operator's outputs) against the operator's
    tensors named `outer`, pairwise: same count, and per pair the same type and byte size."""
    if len(inner) != len(outer):
        raise ctx.error(f"{what}: {len(inner)} tensors for the operator's {len(outer)}")
    for k, (b, name) in enumerate(zip(inner, outer)):
        if not name:
            raise ctx.error(f"{what} {k}: the operator's tensor is absent")
        a = ctx.tensor(name)
        if (a.dtype, a.nbytes) != (b.dtype, b.nbytes):
            raise ctx.error(f"{what} {k}: '{b.name}' {b.dtype}{list(b.shape)} and the "
                            f"operator's '{name}' {a.dtype}{list(a.shape)} differ in type "
                            "or size")


def _ports(sub, names) -> list:
    return [sub.tensors[t] for t in names]


@op("IF")
def if_(ctx):
    """IF(cond, operands...): tflite-micro runs the then or else subgraph on the operands;
    its Prepare requires a bool condition with one element."""
    o = ctx.options(tflite.IfOptions)
    if not ctx.inputs:
        raise ctx.error("has no inputs; the first is the condition")
    cond = ctx.input(0)
    if cond.dtype != "bool" or cond.size != 1:
        raise ctx.error(f"condition '{cond.name}' is {cond.dtype}{list(cond.shape)}; "
                        "tflite-micro takes a bool with one element")
    attrs = {}
    for what, index in (("then", o.ThenSubgraphIndex()), ("else", o.ElseSubgraphIndex())):
        sub = ctx.subgraph_graph(index)
        _pairs(ctx, _ports(sub, sub.inputs), ctx.inputs[1:], f"{what} subgraph {index} input")
        if not sub.outputs:  # TFLM copies nothing back: the outputs would keep stale values
            raise Unsupported(f"{what} subgraph {index} has no outputs")
        _pairs(ctx, _ports(sub, sub.outputs), ctx.outputs,
               f"{what} subgraph {index} output")
        attrs[f"{what}_graph"] = sub
    return ctx.node("if", attrs)


@op("WHILE")
def while_(ctx):
    """WHILE(values...): the operator's outputs start as its inputs; while the cond
    subgraph's first output (a bool, element 0) is true, the body maps them to their next
    values. Inputs, outputs and both subgraphs' inputs, and the body's outputs, pair up."""
    o = ctx.options(tflite.WhileOptions)
    cond_index, body_index = o.CondSubgraphIndex(), o.BodySubgraphIndex()
    _pairs(ctx, [ctx.output(i) for i in range(len(ctx.outputs))], ctx.inputs, "output")
    cond = ctx.subgraph_graph(cond_index)
    body = ctx.subgraph_graph(body_index)
    _pairs(ctx, _ports(cond, cond.inputs), ctx.inputs, f"cond subgraph {cond_index} input")
    _pairs(ctx, _ports(body, body.inputs), ctx.inputs, f"body subgraph {body_index} input")
    _pairs(ctx, _ports(body, body.outputs), ctx.outputs, f"body subgraph {body_index} output")
    if not cond.outputs or cond.tensors[cond.outputs[0]].dtype != "bool":
        raise ctx.error(f"cond subgraph {cond_index}: the first output must be a bool")
    # tflite-micro reads element 0 of the first output; the others are never used
    cond = cond.replace(outputs=cond.outputs[:1])
    return ctx.node("while", {"cond_graph": cond, "body_graph": body})
