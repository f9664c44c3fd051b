"""Static memory planning: every activation tensor gets an offset in one arena.

`plan` is a pure function of (name, size, first use, last use) requests; `plan_graph` derives
the requests from a graph (aliases such as reshape share their source's buffer) and reports
the layer-wise lower bound beside the arena size. State tensors (values kept across
invocations) are not in the arena: they get offsets in a state block of their own, and their
next values are planned like outputs (alive until the end of the invocation, then copied),
except where the kernel updates its state in place (in_place_states: the next value shares
the state's address, nothing is copied).

Control flow (if / while nodes): each subgraph is planned by the same planner on its own, and
the node's scratch, one request as large as the largest of its subgraphs' arenas and live
during the node only, holds them: the subgraphs of a node run one at a time, so they share it,
their offsets relative to its start. The plan of a nested subgraph nests the same way.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from mcuforge.ir.graph import ALIAS_OPS, Graph, is_alias, subgraphs

ALIGN = 4  # every offset is a multiple of 4, and of 8 for 8-byte elements (int64, float64):
# C requires an int64_t * to be 8-aligned (gcc may vectorize on it; UBSan reports it)
WIDE = frozenset({"int64", "uint64", "float64"})


def alignment(dtype: str) -> int:
    return 8 if dtype in WIDE else ALIGN


@dataclass(frozen=True)
class Request:
    name: str
    size: int  # bytes
    first: int  # step that writes it (graph inputs: 0)
    last: int  # last step that reads it (graph outputs: len(nodes))
    align: int = ALIGN  # its offset is a multiple of this


@dataclass(frozen=True)
class MemoryPlan:
    offsets: dict  # tensor name -> byte offset (aliases included)
    arena_size: int
    lower_bound: int  # max over steps of the bytes that must be live at once
    requests: tuple
    state_offsets: dict = field(default_factory=dict)  # state tensor (or an alias of one) -> offset in the state block
    state_size: int = 0
    # control flow: node index -> (offset of its scratch, (plan of each subgraph, ...)); the
    # scratch is a request of its own, named '<first output>/scratch', in offsets too
    subplans: dict = field(default_factory=dict)

    def kernel_scratch(self, g: Graph, node) -> int | None:
        """Arena offset of the node's kernel scratch (plan_graph's scratch_of), or None."""
        return self.offsets.get(_scratch_name(g, node, "kernel"))


def _align(n: int, to: int = ALIGN) -> int:
    return (n + to - 1) // to * to


def _live_together(a: Request, b: Request) -> bool:
    return a.first <= b.last and b.first <= a.last


def _first_fit(order: list, offsets: dict | None = None, placed: list | None = None) -> dict:
    """Each request of `order` at the lowest offset free for its lifetime, around those
    already `placed` ((offset, request) pairs, their offsets in `offsets`)."""
    placed = list(placed or [])  # (offset, request)
    offsets = dict(offsets or {})
    for r in order:
        busy = sorted((o, o + _align(p.size)) for o, p in placed if _live_together(p, r))
        offset = 0
        for start, end in busy:
            if offset + _align(r.size) <= start:
                break
            offset = _align(max(offset, end), r.align)
        offsets[r.name] = offset
        placed.append((offset, r))
    return offsets


def arena_size(requests, offsets: dict) -> int:
    return max((offsets[r.name] + r.size for r in requests), default=0)


def plan(requests) -> dict:
    """Offsets for the requests: greedy first fit under several orders (largest first, then by
    lifetime start, then longest-lived first), keeping the smallest arena. Ties are broken by
    name, so the plan is deterministic."""
    requests = sorted(requests, key=lambda r: r.name)
    orders = [
        sorted(requests, key=lambda r: (-r.size, r.name)),
        sorted(requests, key=lambda r: (r.first, -r.size, r.name)),
        sorted(requests, key=lambda r: (-(r.last - r.first), -r.size, r.name)),
        sorted(requests, key=lambda r: (-r.size * (r.last - r.first + 1), r.name)),
    ]
    best = None
    for order in orders:
        offsets = _first_fit(order)
        if best is None or arena_size(requests, offsets) < arena_size(requests, best):
            best = offsets
    return best or {}


def overlaps(requests, offsets: dict) -> list:
    """Pairs of requests live at the same time whose byte ranges intersect (must be empty)."""
    bad = []
    rs = list(requests)
    for i, a in enumerate(rs):
        for b in rs[i + 1:]:
            if _live_together(a, b):
                oa, ob = offsets[a.name], offsets[b.name]
                if oa < ob + b.size and ob < oa + a.size:
                    bad.append((a.name, b.name))
    return bad


def lower_bound(requests) -> int:
    steps = {s for r in requests for s in (r.first, r.last)}
    return max((sum(r.size for r in requests if r.first <= s <= r.last) for s in steps), default=0)


# op -> (input, output): the node's next value of the state it reads at `input` may be written
# over that state itself, because its kernel reads each element before writing over it (SVDF:
# the memory moves one step older front to back, then only its newest entries are written)
IN_PLACE_STATE = {"svdf": (4, 1)}


def in_place_states(g: Graph) -> dict:
    """{next value: state} for the IN_PLACE_STATE nodes whose state and next value no other
    node reads (nor the graph outputs): the next value is then planned at the state's own
    address, and the invocation copies nothing back."""
    readers = {}
    for n in g.nodes:
        for t in n.inputs:
            if t:
                readers[t] = readers.get(t, 0) + 1
    out = {}
    for n in g.nodes:
        io = IN_PLACE_STATE.get(n.op)
        if io is None or io[0] >= len(n.inputs) or io[1] >= len(n.outputs):
            continue
        state, nxt = n.inputs[io[0]], n.outputs[io[1]]
        if state and state in g.state and g.state[state] == nxt and readers.get(state) == 1 \
                and not readers.get(nxt) and nxt not in g.outputs and nxt not in g.state:
            out[nxt] = state
    return out


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


def requests_of(g: Graph) -> tuple:
    """(requests, alias map): one request per buffer; alias outputs map to their root (the
    next values of in_place_states to their state); views(g) has their byte offsets."""
    root = {t: r for t, (r, _) in views(g).items()}
    first, last = {}, {}
    for name in g.inputs:
        first[name] = last[name] = 0
    end = len(g.nodes)
    for i, n in enumerate(g.nodes):
        for t in n.inputs:
            if t and not g.tensors[t].is_const:
                r = root.get(t, t)
                last[r] = max(last.get(r, i), i)
        for t in n.outputs:
            r = root.get(t, t)
            first.setdefault(r, i)
            last[r] = max(last.get(r, i), i)
    for name in list(g.outputs) + list(g.state.values()):
        last[root.get(name, name)] = end
    root.update(in_place_states(g))
    reqs = tuple(Request(name, g.tensors[name].nbytes, first[name], last[name],
                         alignment(g.tensors[name].dtype))
                 for name in sorted(first) if name not in g.state and name not in root)
    return reqs, root


def plan_graph(g: Graph, scratch_of=None) -> MemoryPlan:
    """The plan of `g`. `scratch_of(graph, node)`, when given, is the (bytes, alignment) of
    working memory the node's kernel needs while it runs, or None: kernel scratch (im2col
    rows, widened activations), a request named '<first output>/kernel' live during that node
    only, in the arena and in its size. Subgraphs are asked the same way."""
    reqs, root = requests_of(g)
    subplans, scratch = {}, []
    for i, n in enumerate(g.nodes):
        subs = subgraphs(n)
        need = scratch_of(g, n) if scratch_of is not None and not subs else None
        if need and need[0] > 0:
            scratch.append(Request(_scratch_name(g, n, "kernel"), need[0], i, i,
                                   max(need[1], ALIGN)))
        if subs:
            plans = tuple(plan_graph(s, scratch_of) for s in subs)
            name = _scratch_name(g, n)
            # aligned for the subgraphs' widest element (nested scratch requests included)
            align = max((r.align for p in plans for r in p.requests), default=ALIGN)
            scratch.append(Request(name, max(p.arena_size for p in plans), i, i, align))
            subplans[i] = (name, plans)
    offsets = _plan_with_scratch(reqs, scratch)
    reqs += tuple(scratch)
    state, size = {}, 0
    for name in g.state:  # model order keeps the block deterministic
        size = _align(size, alignment(g.tensors[name].dtype))
        state[name] = size
        size += _align(g.tensors[name].nbytes)
    delta = views(g)
    for alias, src in root.items():
        at = delta.get(alias, (src, 0))[1]
        if src in state:
            state[alias] = state[src] + at
        else:
            offsets[alias] = offsets[src] + at
    return MemoryPlan(dict(sorted(offsets.items())), arena_size(reqs, offsets),
                      lower_bound(reqs), reqs, dict(sorted(state.items())), size,
                      {i: (offsets[name], plans) for i, (name, plans) in subplans.items()})


def _scratch_name(g: Graph, node, kind: str = "scratch") -> str:
    name = f"{node.outputs[0]}/{kind}"
    while name in g.tensors:
        name += "_"
    return name


def _plan_with_scratch(reqs: tuple, scratch: list) -> dict:
    """Offsets for the graph's requests and its control-flow scratch: planned together, or
    the scratch fitted around the graph's own plan, whichever arena is smaller. The second
    bounds the arena by the graph's own plus its largest scratch."""
    if not scratch:
        return plan(reqs)
    together = plan(reqs + tuple(scratch))
    own = plan(reqs)
    around = _first_fit(sorted(scratch, key=lambda r: (-r.size, r.name)), own,
                        [(own[r.name], r) for r in reqs])
    everything = reqs + tuple(scratch)
    if arena_size(everything, around) < arena_size(everything, together):
        return around
    return together
