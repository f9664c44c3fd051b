"""An independent proof of a memory plan (optimizer/memory_plan.py): no two buffers live at the
same step share a byte, every offset is aligned, every buffer lies inside its arena.

Lifetimes are recomputed from the graph's nodes, not read from the planner's requests, so a
planner bug shows: a buffer is live from the step that writes it (graph inputs: step 0) to the
last step that reads it (graph outputs and next state values: the end); kernel scratch during
its node only. The overlaps allowed are the planner's rules only: an alias (ALIAS_OPS, e.g.
reshape) is its source's buffer, a view slice's output the bytes of its input from its first
element on, a view concat's inputs the bytes of its output where their elements land (ir/graph.py
is_alias; the offsets recomputed here from element coordinates), an in-place state's next value
(in_place_states) is the state's own bytes, and a node's output may share bytes with one of its
inputs where the node's kernel declares it (`declared`: node index -> ((input tensor, shift),
...), from the kernels, not from the plan): at exactly output offset = input offset + shift,
when that input is a buffer of its own or a view at offset 0, its buffer is last read by this
node (its lifetime recomputed here), is neither a graph output nor a state (nor a graph input
when the model keeps its input), and the output is born at that node. A view concat's output
(a stage computed in bands, optimizer/patch.py) may take the bytes of another buffer where, byte
by byte, every kernel access to that buffer is over before the output's first write
(_overlay_pairs). Any two buffers may share bytes where no shared byte is used by both at a
common step, a byte used from the first to the last step a kernel touches it (_byte_times:
the pieces of memory_plan.buffer_pieces). State tensors live in a block of their own, always
live.
"""
from __future__ import annotations

import bisect

import numpy as np

from mcuforge.ir.errors import McuforgeError
from mcuforge.ir.graph import ALIAS_OPS, Graph, is_alias, subgraphs
from mcuforge.optimizer import memory_plan as mp


class PlanError(McuforgeError):
    """The memory plan is wrong: an internal error of the compiler, never of the model."""


def _fail(msg: str):
    raise PlanError(f"internal error: memory plan: {msg} (please report this bug)")


def check_plan(g: Graph, plan, in_place: dict | None = None, declared: dict | None = None,
               keep_input: bool = False) -> None:
    """Raises PlanError on the first violation. `in_place`: {next value: state} pairs allowed to
    share bytes (default: the planner's rule, memory_plan.in_place_states). `declared`: the
    kernels' in-place declarations, node index -> ((input tensor, byte shift), ...);
    `keep_input`: graph inputs must never be overwritten."""
    in_place = mp.in_place_states(g) if in_place is None else in_place
    root, delta = _views(g)
    end = len(g.nodes)
    first, last = {}, {}
    for t in g.inputs:
        first[t] = last[t] = 0
    for i, n in enumerate(g.nodes):
        for t in n.inputs:
            if t and not g.tensors[t].is_const:
                first.setdefault(t, i)
                last[t] = max(last.get(t, i), i)
        for t in n.outputs:
            first.setdefault(t, i)
            last[t] = max(last.get(t, i), i)
    for t in list(g.outputs) + list(g.state.values()) + (list(g.inputs) if keep_input else []):
        first.setdefault(t, 0)
        last[t] = end
    sizes = {r.name: r.size for r in plan.requests}
    aligns = {r.name: r.align for r in plan.requests}  # the alignment each scratch asked for

    # state block: states always live, their in-place next values and aliases at their bytes
    state_of = {nxt: st for nxt, st in in_place.items()}
    buffers = []  # (name, lo, hi, first, last, group)
    for t in g.state:
        _place(g, t, plan.state_offsets, plan.state_size, "state block")
        o = plan.state_offsets[t]
        buffers.append((t, o, o + g.tensors[t].nbytes, 0, end, t))
    for t, o in plan.state_offsets.items():
        if t in g.state:
            continue
        src = state_of.get(t) or root.get(t)
        if src is None or plan.state_offsets.get(src) != o:
            _fail(f"'{t}' is in the state block at {o} but is neither an in-place next value "
                  f"nor an alias of a state there")
    _disjoint(buffers, 0, end, "state block")

    # arena: every non-state, non-constant tensor, with its alias group's lifetime
    arena = []
    for t in sorted(first):
        if t in g.state or t in plan.state_offsets:
            continue
        if t not in plan.offsets:
            _fail(f"'{t}' (live at steps {first[t]}..{last[t]}) has no offset")
        _place(g, t, plan.offsets, plan.arena_size, "arena")
        r = root.get(t, t)
        if r in plan.offsets and plan.offsets[r] + delta.get(t, 0) != plan.offsets[t]:
            _fail(f"alias '{t}' at {plan.offsets[t]}, but its bytes begin {delta.get(t, 0)} "
                  f"bytes into its source '{r}' at {plan.offsets[r]}")
        if r in plan.offsets and plan.offsets[t] + g.tensors[t].nbytes > \
                plan.offsets[r] + g.tensors[r].nbytes:
            _fail(f"alias '{t}' at {plan.offsets[t]} runs past its source '{r}'")
        o = plan.offsets[t]
        arena.append((t, o, o + g.tensors[t].nbytes, first[t], last[t], r))
    for i, n in enumerate(g.nodes):
        for kind in ("kernel", "scratch"):
            name = mp._scratch_name(g, n, kind)
            if name not in plan.offsets:
                continue
            o, size = plan.offsets[name], sizes.get(name, 0)
            align = max(aligns.get(name, mp.ALIGN), mp.ALIGN)
            if o % align or o < 0 or o + size > plan.arena_size:
                _fail(f"scratch '{name}' at [{o}, {o + size}) is misaligned (to {align}) or "
                      f"outside the arena of {plan.arena_size} bytes")
            arena.append((name, o, o + size, i, i, name))
        if i in plan.subplans:
            offset, subs = plan.subplans[i]
            for sub, sub_plan in zip(subgraphs(n), subs):
                if sub_plan.arena_size > sizes.get(mp._scratch_name(g, n), 0):
                    _fail(f"subgraph of node {i} needs {sub_plan.arena_size} bytes, "
                          f"its scratch has {sizes.get(mp._scratch_name(g, n), 0)}")
                check_plan(sub, sub_plan)
    allowed = _allowed_pairs(g, plan, root, delta, first, declared or {}, keep_input)
    allowed |= _overlay_pairs(g, plan, root, delta, keep_input)
    _disjoint(arena, 0, end, "arena", allowed, _byte_times(g, plan, root, keep_input))


def _allowed_pairs(g: Graph, plan, root: dict, delta: dict, first: dict, declared: dict,
                   keep_input: bool) -> set:
    """{frozenset((input buffer, output))} the in-place rule allows in this plan."""
    sinks = {root.get(t, t) for t in list(g.outputs) + list(g.state.values())}
    last_reader = {}  # buffer (alias group) -> the last node reading it
    for k, m in enumerate(g.nodes):
        for u in m.inputs:
            if u:
                last_reader[root.get(u, u)] = k
    out = set()
    for i, decl in declared.items():
        n = g.nodes[i]
        y = n.outputs[0]
        if y in root or first.get(y) != i or y not in plan.offsets:
            continue
        for t, shift in decl:
            x = root.get(t, t)
            if t not in n.inputs or x not in plan.offsets or x in sinks or x in g.state \
                    or (keep_input and x in g.inputs) or x == y or delta.get(t, 0):
                continue
            if last_reader.get(x) != i:  # over the whole alias group
                continue
            if plan.offsets[y] == plan.offsets[x] + shift:
                out.add(frozenset((x, y)))
    return out


def _overlay_pairs(g: Graph, plan, root: dict, delta: dict, keep_input: bool) -> set:
    """{frozenset((x, y))}: a view concat's output y sharing bytes with a buffer x where, byte
    by byte at their planned offsets, every kernel access to x (read or write; alias nodes
    touch nothing) comes before the first kernel write of y to that byte (so each byte of x is
    dead before y takes it, and y's bytes are never touched by x again); x is neither a graph
    output, a state, nor a kept input."""
    sinks = {root.get(t, t) for t in list(g.outputs) + list(g.state.values())}
    ys = {n.outputs[0] for n in g.nodes if n.op == "concat" and is_alias(n)}
    ys = {y for y in ys if y not in root and y in plan.offsets}
    if not ys:
        return set()
    access, writes = {}, {}  # buffer -> [(step, absolute lo, absolute hi)]
    for i, n in enumerate(g.nodes):
        if is_alias(n):
            continue
        for t, out in [(t, False) for t in n.inputs] + [(t, True) for t in n.outputs]:
            if not t or g.tensors[t].is_const or t not in plan.offsets:
                continue
            b = root.get(t, t)
            span = (i, plan.offsets[t], plan.offsets[t] + g.tensors[t].nbytes)
            access.setdefault(b, []).append(span)
            if out:
                writes.setdefault(b, []).append(span)
    out = set()
    for y in sorted(ys):
        ylo, yhi = plan.offsets[y], plan.offsets[y] + g.tensors[y].nbytes
        for x in sorted(access):
            if x == y or x in root or x in sinks or x in g.state or x not in plan.offsets \
                    or (keep_input and x in g.inputs):
                continue
            xlo, xhi = plan.offsets[x], plan.offsets[x] + g.tensors[x].nbytes
            if not (xlo < yhi and ylo < xhi):
                continue
            if all(not (c < b and a < d) for sw, a, b in writes.get(y, ())
                   for sx, c, d in access[x] if sx >= sw):
                out.add(frozenset((x, y)))
    return out


def _byte_times(g: Graph, plan, root: dict, keep_input: bool):
    """fine(a, b) for two buffers (alias groups or kernel scratch) that share bytes while both
    are live: True when no byte they share is used by both at a common step. A buffer uses a
    byte from the first to the last step a kernel reads or writes it (through any of its views;
    alias nodes touch nothing); a graph input's bytes from step -1 (written before the first
    node), a graph output's, state's next value's or kept input's to the end; a kernel
    scratch's at its node. (A buffer whose pieces die or are born at different steps: a
    --memory-priority stage's input and output, memory_plan.buffer_pieces.)"""
    end = len(g.nodes)
    access = {}  # buffer -> [(step, absolute lo, absolute hi)]
    for i, n in enumerate(g.nodes):
        for kind in ("kernel", "scratch"):
            name = mp._scratch_name(g, n, kind)
            if name in plan.offsets:
                size = next((r.size for r in plan.requests if r.name == name), 0)
                access.setdefault(name, []).append((i, plan.offsets[name],
                                                    plan.offsets[name] + size))
        if is_alias(n):
            continue
        for t in list(n.inputs) + list(n.outputs):
            if t and not g.tensors[t].is_const and t in plan.offsets:
                access.setdefault(root.get(t, t), []).append(
                    (i, plan.offsets[t], plan.offsets[t] + g.tensors[t].nbytes))
    for t in g.inputs:
        if t in plan.offsets:
            access.setdefault(t, []).append((-1, plan.offsets[t],
                                             plan.offsets[t] + g.tensors[t].nbytes))
    for t in list(g.outputs) + list(g.state.values()) + (list(g.inputs) if keep_input else []):
        if t in plan.offsets:
            access.setdefault(root.get(t, t), []).append(
                (end, plan.offsets[t], plan.offsets[t] + g.tensors[t].nbytes))

    def times(b, lo, hi):
        first = np.full(hi - lo, 1 << 30, np.int64)
        last = np.full(hi - lo, -(1 << 30), np.int64)
        for s, a, z in access.get(b, ()):
            a, z = max(a, lo), min(z, hi)
            if a < z:
                np.minimum(first[a - lo:z - lo], s, out=first[a - lo:z - lo])
                np.maximum(last[a - lo:z - lo], s, out=last[a - lo:z - lo])
        return first, last

    def fine(a: tuple, b: tuple) -> bool:
        """a, b: (name, lo, hi, first, last) of two groups."""
        if a[0] not in access or b[0] not in access:
            return False
        lo, hi = max(a[1], b[1]), min(a[2], b[2])
        fa, la = times(a[0], lo, hi)
        fb, lb = times(b[0], lo, hi)
        used = (la >= fa) & (lb >= fb)  # bytes both use
        return bool(np.all(~used | (la < fb) | (lb < fa)))
    return fine


def _views(g: Graph) -> tuple:
    """({tensor: root buffer}, {tensor: byte offset in it}) of the graph's aliases: a view's
    offset is the flat index of its first element in the bigger tensor, times the element
    size (a concat input's first element sits at the sum of the earlier inputs' extents along
    the axis)."""
    up = {}  # tensor -> (bigger tensor, offset)
    for n in g.nodes:
        if not is_alias(n):
            continue
        if n.op in ALIAS_OPS:
            up[n.outputs[0]] = (n.inputs[0], 0)
            continue
        if n.op == "slice":
            x = g.tensors[n.inputs[0]]
            up[n.outputs[0]] = (n.inputs[0], int(np.ravel_multi_index(
                tuple(n.attrs["starts"]), x.shape)) * np.dtype(x.dtype).itemsize)
            continue
        y, axis, at = g.tensors[n.outputs[0]], n.attrs["axis"], 0
        for t in n.inputs:
            corner = [0] * len(y.shape)
            corner[axis] = at
            up[t] = (n.outputs[0], int(np.ravel_multi_index(tuple(corner), y.shape))
                     * np.dtype(y.dtype).itemsize)
            at += g.tensors[t].shape[axis]
    root, delta = {}, {}
    for t in up:
        r, o = t, 0
        while r in up:
            o += up[r][1]
            r = up[r][0]
        root[t], delta[t] = r, o
    return root, delta


def _place(g: Graph, t: str, offsets: dict, size: int, where: str) -> None:
    o, n = offsets[t], g.tensors[t].nbytes
    align = mp.alignment(g.tensors[t].dtype)
    if o % align:
        _fail(f"'{t}' at offset {o} in the {where} is not a multiple of {align}")
    if o < 0 or o + n > size:
        _fail(f"'{t}' at [{o}, {o + n}) lies outside the {where} of {size} bytes")


def _disjoint(buffers: list, start: int, end: int, where: str, allowed=frozenset(),
              fine=None) -> None:
    """No two buffers live at a common step share a byte, except the `allowed` pairs (of group
    names) and those `fine(a, b)` clears byte by byte (_byte_times). Pairwise, one numpy row
    per buffer."""
    import numpy as np

    groups = {}  # an alias group is one buffer: its members' union lifetime
    for name, lo, hi, f, la, grp in buffers:
        if hi <= lo:
            continue
        if grp in groups:
            g0 = groups[grp]
            groups[grp] = (g0[0], min(g0[1], lo), max(g0[2], hi), min(g0[3], f), max(g0[4], la))
        else:
            groups[grp] = (name, lo, hi, f, la)
    keys = sorted(groups, key=lambda k: (groups[k][3], groups[k][1], groups[k][0]))
    if not keys:
        return
    lo = np.array([groups[k][1] for k in keys], np.int64)
    hi = np.array([groups[k][2] for k in keys], np.int64)
    f = np.array([groups[k][3] for k in keys], np.int64)
    la = np.array([groups[k][4] for k in keys], np.int64)
    for i in range(len(keys)):
        j = np.arange(i + 1, len(keys))
        hit = (lo[j] < hi[i]) & (lo[i] < hi[j]) & (f[j] <= la[i]) & (f[i] <= la[j])
        for k in j[hit]:
            if frozenset((keys[i], keys[k])) in allowed:
                continue
            a, b = groups[keys[k]], groups[keys[i]]
            if fine is not None and fine((keys[k],) + a[1:], (keys[i],) + b[1:]):
                continue
            _fail(f"'{a[0]}' [{a[1]}, {a[2]}) and '{b[0]}' [{b[1]}, {b[2]}) share bytes in the "
                  f"{where} while both are live at step {max(a[3], b[3])}")
