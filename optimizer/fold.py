"""Constant folding: a node whose inputs are all constants becomes a constant, computed with
numpy, for the ops numpy evaluates exactly as the generated C does (data movement, casts and
plain arithmetic). Others (transcendental functions beyond exp/log/sqrt, reductions, layers)
are left to the generated code."""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from mcuforge.ir.graph import Graph, Node, subgraphs

from .passes import constant

UNARY = {
    "abs": np.abs, "neg": np.negative, "exp": np.exp, "log": np.log, "sqrt": np.sqrt,
    "floor": np.floor, "ceil": np.ceil, "round": np.round,  # numpy rounds half to even, as ONNX
    "sign": np.sign, "not": np.logical_not,
}
# Ops that only move elements: on quantized tensors they copy the raw values whatever the
# quantizations (as TFLite's kernels do; concat aside, see _exact), so folding them is exact
MOVES = {"transpose", "slice", "concat", "tile", "reshape", "broadcast_to"}
# Ops whose lowerings take a constant input 0 (they name constant operands as such); the
# others read input 0 from the arena, so a constant there (a folded FILL of an initial
# state, the data of a layer whose shape arithmetic folded) is first copied into the arena
CONST_INPUT_OK = {"add", "mul", "sub", "div", "binary", "unary", "add_n", "concat",
                  "broadcast_to", "gather", "gather_elements", "where", "matmul", "logistic",
                  "tanh", "leaky_relu", "hard_swish", "relu", "relu6", "quantize", "dequantize",
                  "cast", "slice", "tile", "reshape"}
FLOAT_ONLY = {"exp", "log", "sqrt", "floor", "ceil", "round", "reciprocal", "div"}
BINARY = {
    "add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.divide,
    "max": np.maximum, "min": np.minimum,
    "equal": np.equal, "less": np.less, "greater": np.greater, "less_equal": np.less_equal,
    "greater_equal": np.greater_equal,
    "and": np.logical_and, "or": np.logical_or, "xor": np.logical_xor,
}


def _evaluate(node, args: list, node_shape=()):
    """The node's output as a numpy array, or None when this pass does not fold it."""
    op, a = node.op, node.attrs
    fn = a.get("fn")
    if op == "transpose":
        return np.transpose(args[0], a["perm"])
    if op == "slice":  # data movement of shape computations (SHAPE -> slice -> concat)
        return args[0][tuple(map(slice, a["starts"], a["ends"], a["steps"]))]
    if op == "concat" and a.get("activation", "none") == "none":
        return np.concatenate(args, a["axis"])
    if op == "tile":
        return np.tile(args[0], a["repeats"])
    if op == "broadcast_to":
        return np.broadcast_to(args[0], node_shape) if len(args) == 1 else None
    if op in ("reshape", "cast"):
        return args[0]  # reshaped and cast to the output below
    if op in ("add", "mul") and a.get("activation", "none") == "none":
        fn, op = op, "binary"
    if op == "relu":
        return np.maximum(args[0], np.zeros((), args[0].dtype))
    if op == "unary" and fn == "reciprocal" and args[0].dtype.kind == "f":
        return np.reciprocal(args[0])
    if op == "unary" and fn == "clip":
        lo, hi = a.get("min"), a.get("max")
        x = args[0]
        x = x if lo is None else np.maximum(x, np.asarray(lo, x.dtype))
        return x if hi is None else np.minimum(x, np.asarray(hi, x.dtype))
    if fn in FLOAT_ONLY and args[0].dtype.kind != "f":
        return None
    if op == "unary" and fn in UNARY:
        return UNARY[fn](args[0])
    if op == "binary" and fn in BINARY and len(args) == 2 and args[0].dtype == args[1].dtype:
        return BINARY[fn](args[0], args[1])
    return None


def _exact(n, ins, out) -> bool:
    """Whether numpy's value is the run time's: no quantization anywhere, or a move of raw
    values (TFLite's kernels copy them whatever the quantizations; a concat only when its
    inputs are quantized like its output, else it requantizes or is refused)."""
    if n.op in MOVES:
        return n.op != "concat" or all(t.quant == out.quant for t in ins)
    return all(t.quant is None for t in ins + [out])


def fold_constants(g: Graph) -> Graph:
    """Replace each node whose inputs are all constant (transpose, reshape, cast, relu, clip,
    unary and binary arithmetic, in one sweep in graph order so chains fold too) by a constant
    output tensor. Guarantees: quantized tensors fold only through ops that move elements
    (`_exact`); their arithmetic is the runtime's. A move whose output is a graph output (or
    next state) becomes a copy of the folded constant: lowerings expect an arena input, and
    a reshape of a constant would alias arena memory nobody writes. Other graph outputs stay
    computed by their node (generated code returns outputs from the arena). The folded
    values are numpy's in the output dtype."""
    tensors, nodes = dict(g.tensors), []
    sinks = g.sinks()
    for n in g.nodes:
        ins = [tensors[t] for t in n.inputs if t]
        outs = [tensors[t] for t in n.outputs]
        value = None
        if (ins and len(outs) == 1 and all(t.is_const for t in ins)
                and _exact(n, ins, outs[0])
                and (n.op in MOVES or outs[0].name not in sinks)
                and not (n.op == "broadcast_to" and outs[0].name in sinks)):  # the copy itself
            with np.errstate(all="ignore"):
                value = _evaluate(n, [t.data for t in ins], outs[0].shape)
                value = None if value is None else np.asarray(value).astype(outs[0].dtype)
        if value is None or value.size != outs[0].size:
            nodes.append(n)
            continue
        out = outs[0]
        name = out.name
        if name in sinks:
            name = f"{out.name}/value"
            while name in tensors:
                name += "_"
            nodes.append(Node("broadcast_to", (name,), (out.name,), {}, n.name))
        tensors[name] = replace(constant(name, value.reshape(out.shape), dtype=out.dtype),
                                quant=out.quant)
    return g.replace(nodes=_copy_constant_inputs(nodes, tensors), tensors=tensors)


def _copy_constant_inputs(nodes, tensors) -> list:
    """A copy into the arena before each node whose input 0 is a constant its lowering cannot
    take (not in CONST_INPUT_OK)."""
    out = []
    for n in nodes:
        src = (tensors.get(n.inputs[0]) if n.op not in CONST_INPUT_OK and not subgraphs(n)
               and n.inputs and n.inputs[0] else None)  # (if / while read constants)
        if src is not None and src.is_const:
            name = f"{src.name}/copy"
            while name in tensors and tensors[name].is_const:
                name += "_"
            if name not in tensors:
                tensors[name] = replace(src, name=name, data=None)
                out.append(Node("broadcast_to", (src.name,), (name,), {}))
            n = Node(n.op, (name,) + tuple(n.inputs[1:]), n.outputs, n.attrs, n.name)
        out.append(n)
    return out
