"""Static memory planning: every activation tensor gets an offset in one arena.

`plan` is a pure function of (name, size, first use, last use) requests; `plan_graph` derives
the requests from a graph (aliases such as reshape share their source's buffer) and reports
the layer-wise lower bound beside the arena size. State tensors (values kept across
invocations) are not in the arena: they get offsets in a state block of their own, and their
next values are planned like outputs (alive until the end of the invocation, then copied),
except where the kernel updates its state in place (in_place_states: the next value shares
the state's address, nothing is copied).

In place (plan_graph's in_place_of): a kernel may declare that its output can be written over
one of its inputs at a byte shift (output offset = input offset + shift), derived from the
order in which it reads and writes (codegen_c/kernels/inplace.py). The planner uses such a link
only when that input's last reader is the node and it is neither a graph output nor a state
(nor, with keep_input, a graph input); linked buffers are placed as one group at fixed relative
offsets. Links that make the arena larger (a chain of expanding layers drifts downwards) are
dropped one by one while that helps.

Pieces (buffer_pieces): a buffer the kernels touch piece by piece through views (a
--memory-priority stage's input, read band by band, and its output, written band by band) is
planned as its byte ranges, each live only from the first to the last step a kernel touches
it, at fixed offsets in one group: other buffers may take the bytes of a piece while it is not
live. plan_check proves such sharing byte by byte.

Control flow (if / while nodes): each subgraph is planned by the same planner on its own, and
the node's scratch, one request as large as the largest of its subgraphs' arenas and live
during the node only, holds them: the subgraphs of a node run one at a time, so they share it,
their offsets relative to its start. The plan of a nested subgraph nests the same way.
"""
from __future__ import annotations

import bisect
from dataclasses import dataclass, field, replace


from mcuforge.ir.graph import Graph, is_alias, subgraphs

from .plan_pieces import buffer_pieces, views  # noqa: F401 (callers' too)

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
    # in place: output tensor -> (input root it overwrites, byte shift), the links planned
    in_place: dict = field(default_factory=dict)
    redzone: int = 0  # bytes kept free after every buffer (plan_graph's redzone)

    def kernel_scratch(self, g: Graph, node) -> int | None:
        """Arena offset of the node's kernel scratch (plan_graph's scratch_of), or None."""
        return self.offsets.get(_scratch_name(g, node, "kernel"))


def _align(n: int, to: int = ALIGN) -> int:
    return (n + to - 1) // to * to


def _live_together(a: Request, b: Request) -> bool:
    return a.first <= b.last and b.first <= a.last


def _first_fit(order: list, offsets: dict | None = None, placed: list | None = None,
               groups: dict | None = None) -> dict:
    """Each request of `order` at the lowest offset free for its lifetime, around those
    already `placed` ((offset, request) pairs, their offsets in `offsets`). `groups`: request
    name -> its group's ((relative offset, request), ...); a group is placed as a whole, at the
    lowest base where every member is free, when its first member comes in `order`."""
    placed = list(placed or [])  # (offset, request)
    offsets = dict(offsets or {})
    groups = groups or {}
    for r in order:
        if r.name in offsets:
            continue
        members = groups.get(r.name, ((0, r),))
        align = max(m.align for _, m in members)
        forbidden = []  # open intervals of bases
        for rel, m in members:
            for o, p in placed:
                if _live_together(p, m):
                    forbidden.append((o - rel - _align(m.size), o + _align(p.size) - rel))
        forbidden.sort()
        base = 0
        for lo, hi in forbidden:
            if base <= lo:
                break
            if base < hi:
                base = _align(hi, align)
        for rel, m in members:
            offsets[m.name] = base + rel
            placed.append((base + rel, m))
    return offsets


def arena_size(requests, offsets: dict) -> int:
    return max((offsets[r.name] + r.size for r in requests), default=0)


def plan(requests, links: dict | None = None, pieces: dict | None = None) -> dict:
    """Offsets for the requests: greedy first fit under several orders (largest first, then by
    lifetime start, then longest-lived first), keeping the smallest arena. Ties are broken by
    name, so the plan is deterministic. `links`: {output: (input, shift)} pairs that must sit
    at output offset = input offset + shift (in place); each chain of them is one group.
    `pieces`: {request name: ((lo, hi, first, last), ...)} (buffer_pieces): that buffer's bytes
    [lo, hi) are live over steps first..last only, so other requests may take its bytes
    outside those steps (each piece a request of its own, all at fixed offsets in one group)."""
    if pieces:
        return _plan_pieces(requests, links or {}, pieces)
    requests = sorted(requests, key=lambda r: r.name)
    groups = _groups(requests, links or {})
    items = {}  # one entry per group: its first member's request stands for it in the orders
    for r in requests:
        members = groups.get(r.name, ((0, r),))
        items.setdefault(members[0][1].name, (r, members))
    keys = []
    for head, members in items.values():
        span = max(rel + m.size for rel, m in members)
        first = min(m.first for _, m in members)
        last = max(m.last for _, m in members)
        keys.append((head, span, first, last))
    orders = [
        sorted(keys, key=lambda k: (-k[1], k[0].name)),
        sorted(keys, key=lambda k: (k[2], -k[1], k[0].name)),
        sorted(keys, key=lambda k: (-(k[3] - k[2]), -k[1], k[0].name)),
        sorted(keys, key=lambda k: (-k[1] * (k[3] - k[2] + 1), k[0].name)),
    ]
    best = None
    for order in orders:
        offsets = _first_fit([k[0] for k in order], groups=groups)
        if best is None or arena_size(requests, offsets) < arena_size(requests, best):
            best = offsets
    return best or {}


def _piece_name(name: str, k: int) -> str:
    return f"{name}#piece{k}"


def _plan_pieces(requests, links: dict, pieces: dict) -> dict:
    """plan() with the requests named in `pieces` split into their pieces: piece 0 (at byte 0)
    stands for the buffer in the links, the others are linked to it at their byte offset."""
    out, ls = [], {}
    rename = {}
    for r in requests:
        ps = pieces.get(r.name)
        if not ps or ps[0][0] != 0:
            out.append(r)
            continue
        rename[r.name] = _piece_name(r.name, 0)
        for k, (lo, hi, first, last) in enumerate(ps):
            out.append(Request(_piece_name(r.name, k), hi - lo, first, last,
                               r.align if k == 0 else ALIGN))
            if k:
                ls[_piece_name(r.name, k)] = (rename[r.name], lo)
    for y, (x, shift) in links.items():
        ls[rename.get(y, y)] = (rename.get(x, x), shift)
    offsets = plan(out, ls)
    for name, head in rename.items():
        offsets[name] = offsets[head]
    names = {r.name for r in requests}
    return {n: o for n, o in offsets.items() if n in names}


def _groups(requests, links: dict) -> dict:
    """name -> ((relative offset, request), ...) of its group of in-place links (relative
    offsets from 0), for the members of groups of two or more. A link {y: (x, shift)} puts y
    at x + shift; every y has one x, so following x from any member reaches the group's root."""
    by_name = {r.name: r for r in requests}
    links = {y: xs for y, xs in links.items() if xs[0] in by_name and y in by_name}
    pos = {}  # name -> (root, offset relative to the root)

    for y in sorted(links):
        chain = [y]  # y, its input, that one's input, ... up to a placed one or the root
        while chain[-1] not in pos and chain[-1] in links:
            chain.append(links[chain[-1]][0])
        if chain[-1] not in pos:
            pos[chain[-1]] = (chain[-1], 0)
        for t in reversed(chain[:-1]):
            root, at = pos[links[t][0]]
            pos[t] = (root, at + links[t][1])
    members = {}
    for t, (root, at) in pos.items():
        members.setdefault(root, []).append((at, by_name[t]))
    out = {}
    for ms in members.values():
        low = min(at for at, _ in ms)
        group = tuple(sorted(((at - low, r) for at, r in ms), key=lambda m: (m[1].first, m[1].name)))
        for _, r in group:
            out[r.name] = group
    return out


def overlaps(requests, offsets: dict, in_place: dict | None = None) -> list:
    """Pairs of requests live at the same time whose byte ranges intersect (must be empty),
    less the in-place links ({output: (input, shift)}) planned at their shift."""
    bad = []
    rs = list(requests)
    allowed = {frozenset((y, x)) for y, (x, s) in (in_place or {}).items()
               if offsets.get(y) == offsets.get(x, 0) + s}
    for i, a in enumerate(rs):
        for b in rs[i + 1:]:
            if _live_together(a, b) and frozenset((a.name, b.name)) not in allowed:
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


def requests_of(g: Graph, keep_input: bool = False) -> tuple:
    """(requests, alias map): one request per buffer; alias outputs map to their root (the
    next values of in_place_states to their state); views(g) has their byte offsets.
    `keep_input`: the graph inputs stay live to the end (no layer writes over them)."""
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
    for name in list(g.outputs) + list(g.state.values()) + (list(g.inputs) if keep_input else []):
        last[root.get(name, name)] = end
    root.update(in_place_states(g))
    reqs = tuple(Request(name, g.tensors[name].nbytes, first[name], last[name],
                         alignment(g.tensors[name].dtype))
                 for name in sorted(first) if name not in g.state and name not in root)
    return reqs, root


def plan_graph(g: Graph, scratch_of=None, in_place_of=None, keep_input: bool = False,
               search: bool = True, redzone: int = 0, granule: int = 8) -> MemoryPlan:
    """The plan of `g`. `scratch_of(graph, node)`, when given, is the (bytes, alignment) of
    working memory the node's kernel needs while it runs, or None: kernel scratch (im2col
    rows, widened activations), a request named '<first output>/kernel' live during that node
    only, in the arena and in its size. Subgraphs are asked the same way. `in_place_of(graph,
    node)`, when given, is the node's kernel's declaration: ((input tensor, byte shift), ...)
    its first output may be written over (see in_place_links); `keep_input`: graph inputs are
    never overwritten; `search`: look for links better dropped (else every link or none, a
    quicker plan to compare node orders by). `redzone` > 0 (the checked build's,
    codegen_c/arena_check.py): every buffer, state included, starts at a multiple of `granule`
    (8: an ASan shadow granule; the plain-C check of the boards compares bytes and takes
    ALIGN, so no in-place link is lost) and the `redzone` bytes after it are kept free while
    it is live, so an overrun of a few bytes lands in bytes nothing owns (in-place links at a
    shift that is not a multiple of `granule` are dropped). The requests keep their true
    sizes; the arena and state block grow."""
    reqs, root = requests_of(g, keep_input)
    subplans, scratch = {}, []
    for i, n in enumerate(g.nodes):
        subs = subgraphs(n)
        need = scratch_of(g, n) if scratch_of is not None and not subs else None
        if need and need[0] > 0:
            scratch.append(Request(_scratch_name(g, n, "kernel"), need[0], i, i,
                                   max(need[1], ALIGN)))
        if subs:
            # (no in-place links inside: the kernels' declarations are the top graph's)
            plans = tuple(plan_graph(s, scratch_of, redzone=redzone, granule=granule)
                          for s in subs)
            name = _scratch_name(g, n)
            # aligned for the subgraphs' widest element (nested scratch requests included)
            align = max((r.align for p in plans for r in p.requests), default=ALIGN)
            scratch.append(Request(name, max(p.arena_size for p in plans), i, i, align))
            subplans[i] = (name, plans)
    links = in_place_links(g, in_place_of, keep_input) if in_place_of is not None else {}
    if redzone:  # the members of a group stay on granules
        links = {y: v for y, v in links.items() if v[1] % granule == 0}
    overlays = overlay_links(g, keep_input, redzone, granule)
    links = _with_overlays(links, overlays, reqs)
    overlaid = {y: links[y] for y in overlays if links.get(y) == overlays[y]}
    padded = _padded(reqs, redzone, granule), _padded(scratch, redzone, granule)
    # byte ranges of the buffers touched piece by piece (not with red-zones: each buffer
    # keeps its bytes whole there, so the checked build poisons whole buffers)
    pieces = buffer_pieces(g, reqs, keep_input) if not redzone else {}
    offsets, links = _plan_links(*padded, links, search, overlaid, pieces)
    reqs += tuple(scratch)
    size_of = arena_size(padded[0] + padded[1], offsets)
    state, size = {}, 0
    for name in g.state:  # model order keeps the block deterministic
        size = _align(size, max(alignment(g.tensors[name].dtype), granule if redzone else 0))
        state[name] = size
        size += _align(g.tensors[name].nbytes) + redzone
    if redzone:  # whole granules: ASan leaves a partial last one of a region unpoisoned
        size, size_of = _align(size, granule), _align(size_of, granule)
    delta = views(g)
    for alias, src in root.items():
        at = delta.get(alias, (src, 0))[1]
        if src in state:
            state[alias] = state[src] + at
        else:
            offsets[alias] = offsets[src] + at
    return MemoryPlan(dict(sorted(offsets.items())), size_of,
                      lower_bound(reqs), reqs, dict(sorted(state.items())), size,
                      {i: (offsets[name], plans) for i, (name, plans) in subplans.items()},
                      dict(sorted(links.items())), redzone)


def in_place_links(g: Graph, in_place_of, keep_input: bool = False) -> dict:
    """{output: (input buffer, shift)}: the in-place declarations the graph allows. A node's
    kernel declares ((input tensor, shift), ...); the first allowed one is taken when the
    input's buffer (its alias root) is read last by this node, is not a graph output, a state
    or its next value (nor a graph input with keep_input), and both buffers are arena requests
    of the default alignment with the shift a multiple of it. plan_check.allowed_in_place
    recomputes the same rule on its own."""
    reqs, root = requests_of(g, keep_input)
    by_name = {r.name: r for r in reqs}
    sinks = {root.get(t, t) for t in list(g.outputs) + list(g.state.values())}
    at = {t: o for t, (_, o) in views(g).items()}
    out = {}
    for i, n in enumerate(g.nodes):
        if subgraphs(n) or not n.outputs:
            continue
        y = n.outputs[0]
        if y in root or y not in by_name or by_name[y].align != ALIGN:
            continue
        for t, shift in in_place_of(g, n) or ():
            x = root.get(t, t)
            r = by_name.get(x)
            if r is None or r.last != i or x in sinks or x in g.state or r.align != ALIGN \
                    or shift % ALIGN or (keep_input and x in g.inputs) or x == y \
                    or at.get(t, 0):  # (a view inside x: its shift is not x's)
                continue
            out[y] = (x, int(shift))
            break
    return out


def overlay_links(g: Graph, keep_input: bool = False, redzone: int = 0,
                  granule: int = 8) -> dict:
    """{y: (x, shift)}: a buffer y written piece by piece through views (a view concat's
    output: optimizer/patch.py's bands) placed over a buffer x still being read piece by piece
    (the input the bands read), at y offset = x offset + shift, where no byte of y is written
    at or before a step that still touches the same byte of x (so x's bytes are each dead
    before y takes them). The accesses are the kernels' (alias nodes touch nothing) at byte
    granularity: views(g) gives where each tensor lies in its buffer. x must be born before
    y and be neither a graph output, a state, nor a kept input. `redzone`: the checked build's
    red-zone after each buffer counts as written by y when y is born and read by x until x
    dies, and the shift is a multiple of `granule` (plan_graph's). plan_check recomputes the
    rule on its own."""
    reqs, root = requests_of(g, keep_input)
    by_name = {r.name: r for r in reqs}
    at = views(g)
    sinks = {root.get(t, t) for t in list(g.outputs) + list(g.state.values())}
    concats = {n.outputs[0] for n in g.nodes if n.op == "concat" and is_alias(n)}
    # the largest only (a stage's output): overlays of the bands' own small concats make
    # rigid groups the first fit places worse
    ys = sorted((y for y in concats if y in by_name), key=lambda y: (-by_name[y].size, y))[:1]
    if not ys:
        return {}
    touched = {}  # buffer -> [(step, lo, hi)] of its bytes a kernel reads or writes
    written = {}  # buffer -> [(step, lo, hi)] of its bytes a kernel writes
    for i, n in enumerate(g.nodes):
        if is_alias(n) or subgraphs(n):
            continue
        for t, out in [(t, False) for t in n.inputs] + [(t, True) for t in n.outputs]:
            if not t or g.tensors[t].is_const:
                continue
            r, o = at.get(t, (t, 0))
            span = (i, o, o + g.tensors[t].nbytes)
            touched.setdefault(r, []).append(span)
            if out:
                written.setdefault(r, []).append(span)
    align = max(ALIGN, granule if redzone else 0)
    out = {}
    for y in ys:
        ry = by_name[y]
        writes = list(written.get(y, ()))
        if not writes or len(writes) < 2:
            continue
        if redzone:
            writes.append((ry.first, ry.size, ry.size + redzone))
        best = None
        for x in sorted(by_name):
            rx = by_name[x]
            if x == y or x in sinks or x in g.state or (keep_input and x in g.inputs) \
                    or rx.first >= ry.first or rx.last < ry.first or rx.align > align \
                    or ry.align > align or x not in touched:
                continue
            reads = list(touched[x]) + ([(rx.last, rx.size, rx.size + redzone)] if redzone
                                        else [])
            shift = _overlay_shift(writes, reads, rx.size + redzone, ry.size + redzone, align)
            if shift is None:
                continue
            span = max(rx.size, shift + ry.size) - min(0, shift)
            key = (span - rx.size - ry.size, abs(shift), x)  # the most bytes shared
            if best is None or key < best[0]:
                best = (key, x, shift)
        if best is not None and best[0][0] < 0:
            out[y] = (best[1], best[2])
    return out


def _with_overlays(links: dict, overlays: dict, reqs: tuple) -> dict:
    """links plus the overlays that keep every group sound: the planner places a group as a
    whole and checks its members against other buffers only, so two members of one group not
    linked to each other directly must never be live together."""
    by_name = {r.name: r for r in reqs}
    out = dict(links)
    for y, (x, shift) in sorted(overlays.items()):
        if y in out:
            continue
        trial = dict(out)
        trial[y] = (x, shift)
        direct = {frozenset((a, b)) for a, (b, _) in trial.items()}
        members = {}
        for name, grp in _groups(reqs, trial).items():
            members[id(grp)] = grp
        sound = all(frozenset((a.name, b.name)) in direct or not _live_together(a, b)
                    for grp in members.values() for i, (_, a) in enumerate(grp)
                    for _, b in grp[i + 1:])
        if sound and x in by_name and y in by_name:
            out = trial
    return out


def _overlay_shift(writes: list, reads: list, x_size: int, y_size: int, align: int):
    """The shift (a multiple of `align`) putting y at x + shift such that no write of y
    [(step, lo, hi)] meets a read of x at the same or a later step, the one sharing the most
    bytes (then nearest 0); None when none shares any."""
    bad = sorted((c - b + 1, d - a - 1) for sw, a, b in writes for sx, c, d in reads
                 if sx >= sw)  # overlap iff c - b < shift < d - a: closed [c-b+1, d-a-1]
    merged = []
    for lo, hi in bad:
        if merged and lo <= merged[-1][1] + 1:
            merged[-1][1] = max(merged[-1][1], hi)
        else:
            merged.append([lo, hi])

    def free(s):
        k = bisect.bisect_right([m[0] for m in merged], s) - 1
        return k < 0 or s > merged[k][1]
    cands = {0} | {_align(hi + 1, align) for _, hi in merged} | \
        {(lo - 1) // align * align for lo, _ in merged}
    ok = [s for s in sorted(cands) if free(s) and -y_size < s < x_size]
    if not ok:
        return None
    return min(ok, key=lambda s: (max(x_size, s + y_size) - min(0, s), abs(s), s))


def _plan_links(reqs: tuple, scratch: tuple, links: dict, search: bool = True,
                overlaid: dict | None = None, pieces: dict | None = None) -> tuple:
    """(offsets, the links kept): the plan with every link, then, while that makes the arena
    smaller (DROPS times at most), the link whose removal helps most dropped (ties: the first
    by name); a chain of links is one rigid group, and one that drifts (expanding layers step
    downwards) is better cut; the plan without links where that is smaller still.
    Deterministic."""
    everything = reqs + scratch

    def size_of(ls):
        offsets = _plan_with_scratch(reqs, list(scratch), ls, pieces)
        return arena_size(everything, offsets), offsets
    best, offsets = size_of(links)
    kept = dict(links)
    starts = [(best, 0, offsets, kept)]
    if overlaid and overlaid != links:
        # the overlays alone (a stage's output over its input: the one that pays most), and
        # the kernels' links but those chained to an overlay's buffers (a rigid group
        # drifting out of the input's bytes): the search starts from the best of these
        size, at = size_of(overlaid)
        starts.append((size, 2, at, dict(overlaid)))
        ends = {t for y, (x, _) in overlaid.items() for t in (x, y)}
        apart = {y: v for y, v in links.items()
                 if y in overlaid or (y not in ends and v[0] not in ends)}
        if apart != overlaid and apart != links:
            size, at = size_of(apart)
            starts.append((size, 3, at, apart))
        best, _, offsets, kept = min(starts, key=lambda t: (t[0], t[1]))
    if links and (not search or len(everything) > ORDER_NODES):  # those, or none
        none, none_at = size_of({})
        _, _, offsets, kept = min(starts + [(none, 1, none_at, {})],
                                  key=lambda t: (t[0], t[1]))
        return offsets, kept
    def drops(best, offsets, kept, left):
        # the candidates to cut, bounded so that large graphs plan in time: a chain drifts
        # at its shifted links and its head may be better alone, so those first
        cuts = sorted(kept, key=lambda y: (kept[y][1] == 0 and kept[y][0] in kept, y))[:CUTS]
        trials = []
        for y in cuts:
            trial = {k: v for k, v in kept.items() if k != y}
            trials.append((*size_of(trial), y, trial))
        trials.sort(key=lambda t: (t[0], t[2]))
        if not left or not trials or trials[0][0] >= best:
            return best, offsets, kept
        # equally good cuts may lead on differently: the first TIES of them followed (the
        # first by name is the greedy path, kept on ties of the end result)
        ends = [drops(t[0], t[1], t[3], left - 1) for t in trials[:TIES]
                if t[0] == trials[0][0]]
        return min(ends, key=lambda e: e[0])
    best, offsets, kept = drops(best, offsets, kept, DROPS)
    if kept:  # a chain drifting at every link (AD's 4-byte overlaps) may be worse than none
        size, without = size_of({})
        if size < best:
            return without, {}
    return offsets, kept


ORDERS = 32  # topological orders tried at most (a bounded search)
ORDER_NODES = 200  # graphs of more nodes keep their order
DROPS, CUTS = 4, 32  # in-place links dropped at most, candidates tried per drop
TIES = 2  # equally good drops followed on (VWW on RV32: dropping the link of the layer after
# a stride-2 depthwise rather than the depthwise's own, then the first depthwise's, 46,148 ->
# 36,960 bytes)


def topological_orders(g: Graph, limit: int = ORDERS) -> list:
    """Up to `limit` topological orders of g's nodes, the graph's own first, then the others a
    depth-first search finds taking ready nodes in the graph's order (deterministic). A chain
    has one."""
    producer = {t: i for i, n in enumerate(g.nodes) for t in n.outputs}
    deps = [sorted({producer[t] for t in n.inputs if t in producer and producer[t] != i})
            for i, n in enumerate(g.nodes)]
    users = [[] for _ in g.nodes]
    for i, ds in enumerate(deps):
        for d in ds:
            users[d].append(i)
    out = []
    waiting = [len(ds) for ds in deps]
    order = []

    def walk():
        if len(out) >= limit:
            return
        if len(order) == len(g.nodes):
            out.append([g.nodes[i] for i in order])
            return
        for i in range(len(g.nodes)):
            if waiting[i] == 0 and i not in placed:
                placed.add(i)
                order.append(i)
                for u in users[i]:
                    waiting[u] -= 1
                walk()
                for u in users[i]:
                    waiting[u] += 1
                order.pop()
                placed.discard(i)
                if len(out) >= limit:
                    return
    placed = set()
    walk()
    return out


def _padded(requests, redzone: int, granule: int = 8) -> tuple:
    """The requests as the planner places them: with `redzone`, `granule`-aligned and that
    much larger."""
    if not redzone:
        return tuple(requests)
    return tuple(replace(r, size=r.size + redzone, align=max(r.align, granule))
                 for r in requests)


def _scratch_name(g: Graph, node, kind: str = "scratch") -> str:
    name = f"{node.outputs[0]}/{kind}"
    while name in g.tensors:
        name += "_"
    return name


def _plan_with_scratch(reqs: tuple, scratch: list, links: dict | None = None,
                       pieces: dict | None = None) -> dict:
    """Offsets for the graph's requests and its control-flow scratch: planned together, or
    the scratch fitted around the graph's own plan, whichever arena is smaller. The second
    bounds the arena by the graph's own plus its largest scratch."""
    def planned(rs):
        return plan(rs, links, pieces) if pieces else plan(rs, links)
    if not scratch:
        return planned(reqs)
    together = planned(reqs + tuple(scratch))
    own = planned(reqs)
    around = _first_fit(sorted(scratch, key=lambda r: (-r.size, r.name)), own,
                        [(own[r.name], r) for r in reqs])
    everything = reqs + tuple(scratch)
    if arena_size(everything, around) < arena_size(everything, together):
        return around
    return together
