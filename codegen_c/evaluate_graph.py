"""The loop-IR evaluator over a whole graph: every node lowered (reference or scheduled for a
target) and run in order by evaluate.run_kernel. Apart from evaluate.py because lowering
consults the schedules, and a schedule (kernels/lut.py) runs the evaluator itself."""
from __future__ import annotations

import numpy as np

from .evaluate import run_kernel
from .kernels import lower_node


def run_graph(g, inputs: dict, target=None) -> dict:
    """Run every node's lowered kernel in order on numpy arrays: the whole graph through the
    executable definition, no C compiler involved. Returns {output name: array} shaped and
    typed as the graph's outputs. `target` (ir.target.Target, default the host): whose
    scheduled kernels run."""
    def flat(a):
        a = np.ascontiguousarray(a).reshape(-1)
        return a.view(np.uint8) if a.dtype == bool else a  # C holds bool as uint8_t
    values = {n: flat(inputs[n]).copy() for n in g.inputs}
    for i, node in enumerate(g.nodes):
        k = lower_node(node, g, f"k{i}", target)
        if k is None:  # alias: the same bytes (a view: some of them, or all joined)
            if node.op == "concat":
                values[node.outputs[0]] = np.concatenate([values[t] for t in node.inputs])
            elif node.op == "slice":
                x = g.tensors[node.inputs[0]]
                at = int(np.ravel_multi_index(tuple(node.attrs["starts"]), x.shape))
                values[node.outputs[0]] = values[node.inputs[0]][
                    at:at + g.tensors[node.outputs[0]].size]
            else:
                values[node.outputs[0]] = values[node.inputs[0]]
            continue
        tensors = [t for t in node.inputs if t and not g.tensors[t].is_const] + list(node.outputs)
        for b, t in zip(k.params, tensors):
            if b.kind == "out":
                values[t] = flat(np.zeros(g.tensors[t].size, dtype=g.tensors[t].dtype))
        run_kernel(k, {b.name: values[t] for b, t in zip(k.params, tensors)})  # scratch: noise
    out = {}
    for n in g.outputs:
        t = g.tensors[n]
        v = t.data if t.is_const else values[n].view(np.dtype(t.dtype))
        out[n] = np.asarray(v).reshape(t.shape)
    return out
