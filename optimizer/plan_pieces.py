"""Where tensors lie inside other buffers (views: reshapes, view slices and concats), and the
pieces of a --memory-priority stage's buffers (memory_plan.plan_graph plans each piece as live
only while a kernel touches it)."""
from __future__ import annotations

import numpy as np

from mcuforge.ir.graph import ALIAS_OPS, Graph, is_alias, subgraphs


def views(g: Graph) -> dict:
    """{tensor: (root, byte offset)} for the tensors that are bytes of another buffer: a
    reshape's output (offset 0), a view slice's output (its first element's offset in its
    input), a view concat's inputs (one after another in its output); chains resolved to the
    buffer that has a request of its own."""
    parent = {}
    for n in g.nodes:
        if not is_alias(n):
            continue
        if n.op in ALIAS_OPS:
            parent[n.outputs[0]] = (n.inputs[0], 0)
        elif n.op == "slice":
            x = g.tensors[n.inputs[0]]
            inner = x.nbytes // x.size  # bytes of one element, then of one step of each axis
            offset = 0
            for start, d in reversed(list(zip(n.attrs["starts"], x.shape))):
                offset += start * inner
                inner *= d
            parent[n.outputs[0]] = (n.inputs[0], offset)
        else:
            offset = 0
            for t in n.inputs:
                parent[t] = (n.outputs[0], offset)
                offset += g.tensors[t].nbytes

    def resolve(t):
        r, o = t, 0
        while r in parent:
            r, step = parent[r]
            o += step
        return r, o
    return {t: resolve(t) for t in parent}


def buffer_pieces(g: Graph, reqs: tuple, keep_input: bool = False) -> dict:
    """{buffer: ((lo, hi, first, last), ...)}: the byte ranges (4-byte words, merged where
    equal) of the buffers the kernels touch piece by piece through views (a --memory-priority
    stage, optimizer/patch.py: the graph's input, read band by band, and the largest view
    concat's output, written band by band) with the steps each is live: from the first kernel
    access of one of its bytes (a graph input: 0) to the last (a graph output, state or kept
    input: the end). Other buffers may then take a piece's bytes while it is not live;
    plan_check proves it byte by byte. Empty where no buffer is touched so."""
    by_name = {r.name: r for r in reqs}
    at = views(g)
    concats = [n.outputs[0] for n in g.nodes if n.op == "concat" and is_alias(n)]
    ys = sorted((y for y in concats if y in by_name), key=lambda y: (-by_name[y].size, y))[:1]
    xs = [x for x in g.inputs if x in by_name and not keep_input
          and any(at.get(t, ("",))[0] == x for t in at)]
    wanted = set(xs) | set(ys)
    if not wanted:
        return {}
    sinks = {at.get(t, (t, 0))[0] for t in list(g.outputs) + list(g.state.values())}
    end = len(g.nodes)
    span = {}  # buffer -> (first, last) step per 4-byte word
    for b in wanted:
        words = (by_name[b].size + 3) // 4
        span[b] = (np.full(words, 0 if b in g.inputs else 1 << 30, np.int64),
                   np.full(words, -1, np.int64))
    for i, n in enumerate(g.nodes):
        if is_alias(n) or subgraphs(n):
            continue
        for t in list(n.inputs) + list(n.outputs):
            if not t or g.tensors[t].is_const:
                continue
            b, o = at.get(t, (t, 0))
            if b not in span:
                continue
            first, last = span[b]
            lo, hi = o // 4, (o + g.tensors[t].nbytes + 3) // 4
            np.minimum(first[lo:hi], i, out=first[lo:hi])
            np.maximum(last[lo:hi], i, out=last[lo:hi])
    out = {}
    for b, (first, last) in span.items():
        r = by_name[b]
        untouched = last < 0  # live with the buffer's first step only
        first = np.maximum(np.where(untouched, r.first, first), r.first)
        last = np.full_like(last, end) if b in sinks else np.maximum(last, first)
        cuts = np.flatnonzero((first[1:] != first[:-1]) | (last[1:] != last[:-1])) + 1
        starts = [0] + cuts.tolist()
        ps = tuple((4 * a, min(r.size, 4 * z), int(first[a]), int(last[a]))
                   for a, z in zip(starts, starts[1:] + [len(first)]))
        if len(ps) > 1:
            out[b] = ps
    return out
