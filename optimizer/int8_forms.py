"""Float rewrites, run by the quantizer before calibration, that put a few ops into the forms
TFLite's int8 kernels (and mcuforge's) have, each exact in float:

  - batch_norm (not folded into a conv) -> mul by scale / sqrt(var + eps), add bias - mean *
    that (TFLite's converter does the same): per-channel constants on the last axis;
  - softmax on another axis than the last -> transpose (that axis <-> last), softmax on the
    last axis, the same transpose back;
  - clip (unary "clip") -> binary max with the lower bound, then min with the upper bound
    (TFLite's MAXIMUM / MINIMUM; in int8 both operands share the input's quantization, so the
    clamp is exact on the integers).

The graph keeps its input and output names; calibration then sees the tensors the int8 graph
has, so each gets its own range.
"""
from __future__ import annotations

import numpy as np

from mcuforge.ir.graph import Graph, Node, Tensor


def rewrite(g: Graph) -> Graph:
    tensors, nodes = dict(g.tensors), []
    names = set(tensors)

    def fresh(base: str, shape, data=None) -> str:
        name = base
        while name in names:
            name += "_"
        names.add(name)
        tensors[name] = Tensor(name, tuple(shape), "float32", data=data)
        return name

    for n in g.nodes:
        where = n.name or n.outputs[0]
        x = g.tensors[n.inputs[0]] if n.inputs and n.inputs[0] else None
        rank = len(x.shape) if x is not None else 0
        if n.op == "batch_norm" and all(g.tensors[t].is_const for t in n.inputs[1:5]):
            scale, bias, mean, var = (g.tensors[t].data.astype(np.float64).reshape(-1)
                                      for t in n.inputs[1:5])
            a = scale / np.sqrt(var + float(n.attrs["epsilon"]))
            b = bias - mean * a
            ca = fresh(where + "/bn_scale", a.shape, a.astype(np.float32))
            cb = fresh(where + "/bn_shift", b.shape, b.astype(np.float32))
            mid = fresh(where + "/bn_scaled", x.shape)
            nodes.append(Node("mul", (x.name, ca), (mid,), {"activation": "none"}, mid))
            nodes.append(Node("add", (mid, cb), n.outputs, {"activation": "none"}, n.name))
        elif n.op == "softmax" and n.attrs.get("axis", rank - 1) % max(rank, 1) != rank - 1:
            axis = n.attrs["axis"] % rank
            perm = list(range(rank))
            perm[axis], perm[-1] = rank - 1, axis
            shape = [x.shape[p] for p in perm]
            t_in = fresh(where + "/to_last", shape)
            t_out = fresh(where + "/softmax_last", shape)
            attrs = {k: v for k, v in n.attrs.items() if k != "axis"}
            nodes.append(Node("transpose", (x.name,), (t_in,), {"perm": tuple(perm)}, t_in))
            nodes.append(Node("softmax", (t_in,), (t_out,), attrs, n.name))
            nodes.append(Node("transpose", (t_out,), n.outputs, {"perm": tuple(perm)},
                              t_out + "/back"))
        elif n.op == "unary" and n.attrs["fn"] == "clip" and x.dtype == "float32":
            cur = x.name
            bounds = [(fn, n.attrs.get(k)) for fn, k in (("max", "min"), ("min", "max"))]
            bounds = [(fn, v) for fn, v in bounds if v is not None]
            if not bounds:
                nodes.append(Node("reshape", (cur,), n.outputs, {}, n.name))  # identity
                continue
            for i, (fn, v) in enumerate(bounds):
                c = fresh(f"{where}/clip_{fn}", (1,), np.array([v], np.float32))
                out = n.outputs[0] if i == len(bounds) - 1 else fresh(where + "/clip_lo",
                                                                      x.shape)
                nodes.append(Node("binary", (cur, c), (out,), {"fn": fn}, f"{where}/{fn}"))
                cur = out
        else:
            nodes.append(n)
    return g.replace(tensors=tensors, nodes=nodes)
