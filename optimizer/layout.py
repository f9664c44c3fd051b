"""Layout passes: the ONNX frontend wraps every NHWC layer op in explicit transposes
(NCHW -> NHWC before, back after). These passes remove the pairs that meet, so a chain of
layers keeps its activations in NHWC and only the graph's ends transpose.

transpose(x, p) has shape[i] = x.shape[p[i]]; transpose(transpose(x, p), q) = transpose(x, p[q])."""
from __future__ import annotations

import numpy as np

from mcuforge.ir.graph import Graph, Node, Tensor

from .passes import bypass, fresh_name, producers, remove_dead_nodes, use_counts

# ops computing each output element from the same element of every input (numpy broadcasting),
# whatever the layout: a transpose commutes with them
ELEMENTWISE = frozenset({"relu", "relu6", "leaky_relu", "logistic", "tanh", "hard_swish",
                         "unary", "cast", "add", "mul", "binary", "where"})


def inverse(perm) -> tuple:
    inv = [0] * len(perm)
    for i, p in enumerate(perm):
        inv[p] = i
    return tuple(inv)


def compose(first, then) -> tuple:
    """The permutation of transpose(transpose(x, first), then)."""
    return tuple(first[i] for i in then)


def is_identity(perm) -> bool:
    return tuple(perm) == tuple(range(len(perm)))


def merge_transposes(g: Graph) -> Graph:
    """A transpose of a transpose becomes one transpose of the original tensor (composed
    permutation); a transpose with the identity permutation is removed (its readers read its
    input), so a transpose followed by its inverse cancels. Guarantees: values and graph
    input/output names unchanged; the first transpose of a pair stays only while something
    else reads it; never more transposes than before."""
    changed, kept = False, set()
    while True:
        prod = producers(g)
        for n in g.nodes:
            if n.op != "transpose" or n.outputs[0] in kept:
                continue
            src = prod.get(n.inputs[0])
            if src is not None and src.op == "transpose":
                merged = Node("transpose", src.inputs, n.outputs,
                              {**n.attrs, "perm": compose(src.attrs["perm"], n.attrs["perm"])},
                              n.name)
                g = g.replace(nodes=[merged if m is n else m for m in g.nodes])
                break
            if is_identity(n.attrs["perm"]):
                h = bypass(g, n)
                if h is g:
                    kept.add(n.outputs[0])
                    continue
                g = h
                break
        else:
            return remove_dead_nodes(g) if changed else g
        changed = True


def transposes_to_reshapes(g: Graph) -> Graph:
    """A transpose that keeps the order of the axes longer than 1 (NHWC (1, 1, 1, C) -> NCHW
    (1, C, 1, 1) before a flatten) moves no data: it becomes a zero-copy reshape.
    Guarantees: values, shapes and names unchanged; quantized tensors too (same bytes);
    constants stay transposed (a reshape aliases arena memory)."""
    nodes = []
    for n in g.nodes:
        if n.op == "transpose" and not g.tensors[n.inputs[0]].is_const:
            shape = g.tensors[n.inputs[0]].shape
            moved = [a for a in n.attrs["perm"] if shape[a] > 1]
            if moved == sorted(moved):
                n = Node("reshape", n.inputs, n.outputs, {}, n.name)
        nodes.append(n)
    return g.replace(nodes=nodes)


def transposes_into_weights(g: Graph) -> Graph:
    """transpose(x) -> reshape* -> fully_connected with constant weights, each tensor between
    read by the next node alone: the transpose becomes a zero-copy reshape of x and the weights'
    columns are permuted at compile time, so the layer reads x in x's own order. This is
    PyTorch's Flatten of an NCHW feature map before a Linear (the NHWC map needs no transpose).
    Only when every row of the layer's [batch, in] input comes from the same row of x.
    Guarantees: names and shapes unchanged; the same products summed (a float sum in another
    order: equal up to rounding); other readers of the weights keep them; never more nodes."""
    prod, uses = producers(g), use_counts(g)
    nodes, tensors = list(g.nodes), dict(g.tensors)
    changed = False
    for fc in g.nodes:
        if fc.op != "fully_connected" or not g.tensors[fc.inputs[1]].is_const:
            continue
        t = fc.inputs[0]
        while (prod.get(t) is not None and prod[t].op == "reshape" and uses.get(t) == 1
               and t not in g.sinks()):
            t = prod[t].inputs[0]
        tr = prod.get(t)
        if tr is None or tr.op != "transpose" or uses.get(t) != 1 or t in g.sinks():
            continue
        x, w = g.tensors[tr.inputs[0]], g.tensors[fc.inputs[1]]
        if x.is_const or x.quant != g.tensors[t].quant or (_per_axis(w) and w.quant.axis != 0):
            continue
        n_in = w.shape[1]
        # flat index into x of each element of the layer's [rows, n_in] input
        idx = np.transpose(np.arange(x.size).reshape(x.shape), tr.attrs["perm"])
        idx = idx.reshape(-1, n_in)
        rows = np.arange(idx.shape[0])[:, None]
        if not (idx // n_in == rows).all() or not (idx % n_in == idx[:1] % n_in).all():
            continue
        sigma = idx[0] % n_in  # input column i reads x's column sigma[i]
        w_new = np.empty_like(w.data)
        w_new[:, sigma] = w.data
        name = fresh_name(g, f"{w.name}__cols", set(tensors))
        tensors[name] = Tensor(name, w.shape, w.dtype, w_new, w.quant)
        nodes = [Node("reshape", tr.inputs, tr.outputs, {}, tr.name) if n is tr
                 else Node(n.op, (n.inputs[0], name, *n.inputs[2:]), n.outputs, n.attrs, n.name)
                 if n is fc else n for n in nodes]
        changed = True
    return remove_dead_nodes(g.replace(nodes=nodes, tensors=tensors)) if changed else g


def sink_transposes(g: Graph, limit: int | None = None) -> Graph:
    """Move transposes below elementwise ops: E(transpose(x, p), c) becomes
    transpose(E(x, c'), p), with constant operands c transposed at compile time (c' =
    c transposed by the inverse of p) and other operands required to be transposes by the
    same p. A transpose also moves below a reduce that is its only reader, the reduced axes
    renamed: reduce(transpose(x, p), axes) = transpose(reduce(x, p[axes]), q), and q is the
    identity when the reduce keeps no dimensions and the kept axes stay in order (NCHW global
    pooling as ReduceMean over (2, 3) then needs no transpose at all). A transpose moves only
    when it is the sole reader's input, so the number of transposes never grows; moved down, it
    meets its inverse for merge_transposes to cancel.
    Guarantees: values and graph input/output names unchanged (a reduce visits the elements in
    the same order: it moves only when the renamed axes stay in increasing order); per-axis
    quantized tensors are left alone; terminates (every step moves a transpose strictly
    downstream)."""
    limit = limit if limit is not None else 4 * len(g.nodes) + 8
    for _ in range(limit):
        uses, prod = use_counts(g), producers(g)
        for n in g.nodes:
            if n.op == "reduce":
                plan = _reduce_plan(g, n, prod, uses)
                if plan is not None:
                    g = _sink_reduce(g, n, *plan)
                    break
                continue
            plan = _sink_plan(g, n, prod, uses) if n.op in ELEMENTWISE else None
            if plan is not None:
                g = _sink(g, n, *plan)
                break
        else:
            return g
    return g


def _reduce_plan(g: Graph, n: Node, prod: dict, uses: dict):
    """(the transpose, reduced axes of its input, permutation of the reduced result) when
    reduce(transpose(x, p)) can become transpose(reduce(x)), else None."""
    t = n.inputs[0]
    p = prod.get(t)
    if p is None or p.op != "transpose" or uses.get(t, 0) != 1 or t in g.sinks():
        return None
    if _per_axis(g.tensors[t]) or _per_axis(g.tensors[n.outputs[0]]):
        return None
    perm, axes = tuple(p.attrs["perm"]), tuple(n.attrs["axes"])
    new_axes = tuple(perm[a] for a in axes)
    if list(new_axes) != sorted(new_axes):  # another loop order: float sums could round apart
        return None
    if n.attrs["keep_dims"]:
        after = perm
    else:  # the kept axes: x's order after the reduce, the transpose's order before
        kept = [i for i in range(len(perm)) if i not in axes]
        src_kept = sorted(perm[k] for k in kept)
        after = tuple(src_kept.index(perm[k]) for k in kept)
    return p, new_axes, after


def _sink_reduce(g: Graph, n: Node, p: Node, new_axes, after) -> Graph:
    src, out = g.tensors[p.inputs[0]], g.tensors[n.outputs[0]]
    keep = n.attrs["keep_dims"]
    shape = tuple(1 if d in new_axes else s for d, s in enumerate(src.shape)
                  if keep or d not in new_axes)
    tensors = {k: v for k, v in g.tensors.items() if k != p.outputs[0]}
    attrs = {**n.attrs, "axes": new_axes}
    if is_identity(after):
        replaced = [Node("reduce", (src.name,), n.outputs, attrs, n.name)]
    else:
        mid = Tensor(fresh_name(g, f"{out.name}__sunk"), shape, out.dtype, None, out.quant)
        tensors[mid.name] = mid
        replaced = [Node("reduce", (src.name,), (mid.name,), attrs, n.name),
                    Node("transpose", (mid.name,), n.outputs, {"perm": after}, n.name)]
    nodes = []
    for m in g.nodes:
        if m is p:
            continue
        nodes.extend(replaced if m is n else [m])
    return g.replace(nodes=nodes, tensors=tensors)


def _per_axis(t: Tensor) -> bool:
    return t.quant is not None and t.quant.per_axis


def _sink_plan(g: Graph, n: Node, prod: dict, uses: dict):
    """(perm, new inputs, new constants, transposes to drop) when n can take the transposes'
    sources directly, else None."""
    if len(n.outputs) != 1:
        return None
    out = g.tensors[n.outputs[0]]
    rank = len(out.shape)
    perm = None
    for t in n.inputs:
        p = prod.get(t) if t else None
        if p is not None and p.op == "transpose":
            perm = perm or tuple(p.attrs["perm"])
    if perm is None or len(perm) != rank or _per_axis(out):
        return None
    inv = inverse(perm)
    inputs, consts, dropped = [], [], []
    for t in n.inputs:
        if not t:
            inputs.append(t)
            continue
        tensor, p = g.tensors[t], prod.get(t)
        if _per_axis(tensor):
            return None
        if p is not None and p.op == "transpose" and tuple(p.attrs["perm"]) == perm \
                and tuple(tensor.shape) == tuple(out.shape):
            inputs.append(p.inputs[0])
            if uses.get(t, 0) == n.inputs.count(t) and t not in g.sinks():
                dropped.append(p)
        elif tensor.is_const and len(tensor.shape) <= rank:
            if tensor.size == 1:  # a scalar broadcasts the same in any layout
                inputs.append(t)
                continue
            full = tensor.data.reshape((1,) * (rank - len(tensor.shape)) + tuple(tensor.shape))
            name = fresh_name(g, f"{t}__t", {c.name for c in consts})
            data = np.ascontiguousarray(np.transpose(full, inv))
            consts.append(Tensor(name, tuple(data.shape), tensor.dtype, data, tensor.quant))
            inputs.append(name)
        else:
            return None
    if not dropped:
        return None
    return perm, inputs, consts, dropped


def _sink(g: Graph, n: Node, perm, inputs, consts, dropped) -> Graph:
    out = g.tensors[n.outputs[0]]
    inv = inverse(perm)
    mid = Tensor(fresh_name(g, f"{out.name}__sunk"), tuple(out.shape[i] for i in inv),
                 out.dtype, None, out.quant)
    moved = Node(n.op, tuple(inputs), (mid.name,), n.attrs, n.name)
    after = Node("transpose", (mid.name,), n.outputs, {"perm": perm}, n.name)
    nodes = []
    for m in g.nodes:
        if any(m is d for d in dropped):
            continue
        nodes.extend([moved, after] if m is n else [m])
    tensors = dict(g.tensors)
    tensors[mid.name] = mid
    tensors.update((c.name, c) for c in consts)
    for d in dropped:
        tensors.pop(d.outputs[0], None)
    return g.replace(nodes=nodes, tensors=tensors)
