"""--memory-priority: the first stage of a network computed patch by patch (MCUNetV2's idea).

The first layers of a CNN hold its largest activations. `patch_stage(g, k, P)` computes the
first k nodes in P bands of rows of the stage's output: each band reads only the rows of the
input its receptive field needs (the halo is recomputed by the neighbouring band), so only
the input, the stage's output and one band's small intermediate tensors are live at once.
Only the padding changes per band (the model's at the image's top and bottom, none where the
halo provides the rows), so every value is computed by the same arithmetic as before: the
outputs are bit-exact with the unpatched graph.

Nothing is copied: a band reads its input rows through a view slice and writes its rows of the
stage's output through a view concat (ir/graph.py is_alias; the memory planner places the
bands inside the output). Only a band whose first input row would start at a byte the planner
cannot align (odd row sizes) copies those few rows.

Two ways to band (patch_stage's `reuse`): every band computes all the rows it reads, the halo
recomputed (extra MACs), or each row is computed once and the halo rows a band shares with the
next are copied from one to the other (row by row: no extra MACs, a few rows kept per layer).
`choose` tries every stage, band count and way and keeps the smallest arena (as the caller
measures it: the real planner with the kernels' scratch) whose extra MACs stay within a bound.
Two forms shrink a band's working set further: its halo copies made after the band's readers
of the rows (`late`: not live beside them), and its convolutions on the kernels with the
least scratch (`lean`: im2col; the band depthwise always takes one output row of scratch),
in every band or, where that keeps the arena, only in the first few (`lean_bands`: the input
is still whole there; later bands find room for the kernels' scratch in its dead rows).
The planner also lets the bands use the input's bytes no later band reads and the output's
bytes no band has written yet (memory_plan.buffer_pieces). Around the stage, `choose` also
picks the order of residual branches (stage_orders: in ResNet-8's block 3 the 1x1 shortcut
run before the 3x3 branch's second conv, not beside it) and gives the layers
after the stage kernels with less scratch (lean_tail) where either makes the arena smaller.

A pointwise (1x1) convolution feeding a depthwise one expands a band's working set most (VWW:
8 -> 16 channels of 48 columns). `split` computes such a pair in channel groups
(split_pairs): each group's 1x1 convolution computes only its output channels (its weights,
bias and per-channel scales sliced), its depthwise layer only those channels, and a channel
concat joins the groups' outputs; per-channel arithmetic is independent, so the values are the
same. Only one group's 1x1 output is live at a time; its halo rows are recomputed by the next
band rather than kept (a 1x1 layer's rows are cheap, and its halo would be one kept copy per
group).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

from mcuforge.ir.graph import Graph, Node, Quant, Tensor, verify

from .memory_plan import alignment
from .passes import fresh_name

WINDOW_OPS = ("conv2d", "depthwise_conv2d", "avg_pool2d", "max_pool2d")
# ops computing each output element from the same element of their same-shape inputs
POINTWISE_OPS = ("add", "mul", "sub", "relu", "relu6", "leaky_relu", "logistic", "tanh",
                 "hard_swish", "quantize", "dequantize", "unary")


LATE = ("", "all", "strided")  # patch_stage's `late`
# patch_stage's `lean`: the band layers' kernels as they are, the convolutions on im2col, the
# depthwise layers on the reference loops too, or the convolutions also (no scratch at all)
LEAN = ("", "im2col", "bare_dw", "bare")
SPLITS = (2, 4)  # channel groups of the stage's 1x1 -> depthwise pairs (`split`) choose tries
# The reference loops of a "bare" band run far more instructions a MAC than the scheduled
# kernels (M4: ResNet-8's stage +54.8 M instructions for 8.7 M bare MACs, VWW's +11.2 M for
# 0.75 M): against choose's bound each MAC a bare layer runs counts BARE_COST MACs more, so the
# form is taken only where the user allows that cost (--memory-priority-max-macs)
BARE_COST = 6


def _lean_of(g: Graph, n: Node, lean: str) -> str:
    """The kernel form (a node's "lean" attribute: codegen_c/kernels) patch_stage's `lean`
    gives band node n, or ""."""
    if lean == "bare":
        return "bare" if _bare(g, n) else ""
    if lean in ("im2col", "bare_dw") and n.op == "conv2d":
        return "im2col"
    return "bare" if lean == "bare_dw" and n.op == "depthwise_conv2d" else ""


def _bare(g: Graph, n: Node) -> bool:
    """Whether lean="bare" puts n on the reference loops: its depthwise layers and
    convolutions with a window (1x1 convolutions keep their GEMM, whose scratch is small)."""
    return n.op == "depthwise_conv2d" or (
        n.op == "conv2d" and g.tensors[n.inputs[1]].shape[1:3] != (1, 1))


def _window_macs(g: Graph, n: Node) -> int:
    w, y = g.tensors[n.inputs[1]], g.tensors[n.outputs[0]]
    return y.size * (math.prod(w.shape[1:]) if n.op == "conv2d" else math.prod(w.shape[1:3]))


def bare_macs(g: Graph) -> int:
    """MACs of the layers patch_stage put on the reference loops (lean="bare")."""
    return sum(_window_macs(g, n) for n in g.nodes if n.attrs.get("lean") == "bare")


class NotPatchable(Exception):
    """This stage and band count cannot be computed in bands (a candidate to skip)."""


def stage_lengths(g: Graph) -> list:
    """The k for which the first k nodes form a stage: window and pointwise ops on 4-D NHWC
    tensors with one image, reading the graph's only input, constants and each other, with
    exactly one tensor read after them (their output), which is not the input."""
    if len(g.inputs) != 1 or g.state:
        return []
    x = g.tensors[g.inputs[0]]
    if len(x.shape) != 4 or x.shape[0] != 1 or x.name in g.outputs:
        return []
    made, out = {x.name}, []
    for k, n in enumerate(g.nodes):
        if not _patchable(g, n) or any(t and t not in made and not g.tensors[t].is_const
                                       for t in n.inputs):
            break
        made.update(n.outputs)
        if _escaping(g, k + 1) is not None:
            out.append(k + 1)
    return out


def _patchable(g: Graph, n: Node) -> bool:
    if len(n.outputs) != 1 or n.attrs.get("view"):
        return False
    y = g.tensors[n.outputs[0]]
    acts = [g.tensors[t] for t in n.inputs if t and not g.tensors[t].is_const]
    if len(y.shape) != 4 or y.shape[0] != 1 or not acts:
        return False
    if n.op in WINDOW_OPS:
        return len(acts) == 1 and acts[0] is g.tensors[n.inputs[0]]
    if n.op == "concat":  # along the channels: each row of the output from the same rows
        return n.attrs["axis"] in (3, -1) and n.attrs.get("activation", "none") == "none" \
            and len(acts) == len(n.inputs) and all(
                len(t.shape) == 4 and tuple(t.shape[:3]) == tuple(y.shape[:3]) for t in acts)
    if n.op in POINTWISE_OPS:  # constants (a per-channel scale) must not vary along rows
        return all(tuple(t.shape) == tuple(y.shape) for t in acts) and all(
            len(g.tensors[t].shape) < 3 or g.tensors[t].shape[-3] == 1
            for t in n.inputs if t and g.tensors[t].is_const)
    return False


def _escaping(g: Graph, k: int):
    """The one tensor of the first k nodes read after them (or a graph output), else None."""
    later = {t for n in g.nodes[k:] for t in n.inputs} | set(g.outputs)
    out = {t for n in g.nodes[:k] for t in n.outputs if t in later}
    return out.pop() if len(out) == 1 else None


def _window(g: Graph, n: Node):
    """(stride, span, top padding) of a window op along the rows."""
    a = n.attrs
    if n.op in ("conv2d", "depthwise_conv2d"):
        size = g.tensors[n.inputs[1]].shape[1]
    else:
        size = a["filter"][0]
    dil = a.get("dilation", (1, 1))[0]
    return a["stride"][0], (size - 1) * dil + 1, a["padding"][0]


def _input_rows(g: Graph, n: Node, rows: tuple) -> tuple:
    """The rows of the node's (first) input that its output rows [a, b) read, clipped."""
    if n.op not in WINDOW_OPS:
        return rows
    s, span, top = _window(g, n)
    h = g.tensors[n.inputs[0]].shape[1]
    lo, hi = max(0, rows[0] * s - top), min(h, (rows[1] - 1) * s - top + span)
    if lo >= hi:
        raise NotPatchable("a band reads only padding")
    return lo, hi


def bands(h: int, count: int, step: int = 1) -> list:
    """`count` bands of rows [a, b) covering h rows, as even as integers allow, each starting
    at a multiple of `step` rows."""
    cuts = [min(h, (p * h // count + step - 1) // step * step) for p in range(count)] + [h]
    if len(set(cuts)) != len(cuts):
        raise NotPatchable(f"{count} bands of {h} rows in steps of {step}")
    return list(zip(cuts, cuts[1:]))


def row_step(t: Tensor) -> int:
    """The fewest rows of t whose bytes are a multiple of its alignment: a view may start
    only there."""
    row, align = t.nbytes // t.shape[1], alignment(t.dtype)
    return align // math.gcd(row, align)


def patch_stage(g: Graph, k: int, count: int, reuse: bool = False, late: str = "",
                lean: str = "", split: int = 1, lean_bands: int | None = None) -> Graph:
    """The graph with its first k nodes (a stage: stage_lengths) computed in `count` bands of
    the stage output's rows. Guarantees: the graph's inputs, outputs and values are unchanged
    (each band's nodes are the original ones with their rows and padding cut to the band; the
    same arithmetic on the same values); the nodes after the stage are untouched; the band
    tensors are views of the input and of the stage's output, so no data is copied (but the
    few rows a band reads at a misaligned start: a copy). The bands of the output start at
    aligned rows (row_step). Raises NotPatchable when they cannot, or a band would read only
    padding.

    `reuse`: no row is computed twice. A band computes only rows no band before it has; the
    rows of each tensor the next band reads too are copied out as soon as they are computed
    (a few rows: the halo) and copied back in front of the next band's new rows. No extra
    MACs; a few rows kept per layer between bands, and the copies, instead. NotPatchable where
    the new rows would start at a misaligned byte. `late` (with reuse): which halo copies wait
    until the band's last reader of the tensor has run (LATE: "" none, "all", "strided": the
    tensors a strided window op reads), so the copy is not live beside that reader (the
    reader then cannot write over its input in place). `lean` (LEAN): the band convolutions
    ask their kernels for less scratch ("im2col": codegen_c/kernels/gemm.py), and the band
    depthwise layers run the reference loops, which need none ("bare_dw":
    codegen_c/kernels/schedule_kernel), or the convolutions with a window too ("bare"), for
    more instructions. `split` > 1: the stage's
    1x1 -> depthwise pairs computed in that many channel groups first (split_pairs; NotPatchable
    where there is none), the 1x1 layers' halo rows recomputed (with reuse too).
    `lean_bands`: only the first that many bands lean (the first bands are the tightest: the
    input is still whole), the others on their own kernels (fewer instructions); None: all."""
    if late not in LATE or lean not in LEAN or split < 1:
        raise ValueError(f"late={late!r}, lean={lean!r}, split={split}: one of {LATE}, {LEAN}"
                         ", >= 1")
    if k not in stage_lengths(g):
        raise NotPatchable(f"the first {k} nodes are not a stage")
    again = set()  # tensors whose halo rows each band recomputes (with reuse)
    if split > 1:
        g, k, again = split_pairs(g, k, split)
    stage = g.nodes[:k]
    out = _escaping(g, k)
    y = g.tensors[out]
    if not 1 < count <= y.shape[1]:
        raise NotPatchable(f"{count} bands of {y.shape[1]} rows")
    tensors, nodes, taken = dict(g.tensors), [], set()

    def new(hint, like: Tensor, rows: int) -> str:
        name = fresh_name(g, hint, taken)
        taken.add(name)
        tensors[name] = Tensor(name, (1, rows, *like.shape[2:]), like.dtype, quant=like.quant)
        return name

    def rows_of(src: str, held: str, band: tuple, rows: tuple, copy: bool = False) -> str:
        """A tensor holding rows [lo, hi) of `src`, of which `held` holds the band [a, b)."""
        if rows == band and not copy:
            return held
        t = g.tensors[src]
        name = new(f"{src}/rows{rows[0]}_{rows[1]}", t, rows[1] - rows[0])
        # a view where its first row is aligned, else a copy of the (few) rows
        copy = copy or (rows[0] - band[0]) % row_step(t) != 0
        nodes.append(Node("slice", (held,), (name,), {
            "starts": (0, rows[0] - band[0], 0, 0), "ends": (1, rows[1] - band[0], *t.shape[2:]),
            "steps": (1, 1, 1, 1), **({} if copy else {"view": True})}, name))
        return name

    def compute(n: Node, r: tuple, need: dict, have: dict, p: int) -> str:
        """Node n's output rows [a, b) into a new tensor, read from this band's tensors."""
        o = n.outputs[0]
        reads = _input_rows(g, n, r)
        ins = tuple(rows_of(t, have[t], need[t], reads) if t and not g.tensors[t].is_const
                    else t for t in n.inputs)
        attrs = dict(n.attrs, band_of=o)  # codegen shares the bands' tables and code
        if (lean_bands is None or p < lean_bands) and _lean_of(g, n, lean):
            attrs["lean"] = _lean_of(g, n, lean)
        if n.op in WINDOW_OPS:
            s, span, top = _window(g, n)
            first, last = r[0] * s - top, (r[1] - 1) * s - top + span
            pl, pr = n.attrs["padding"][2:]
            attrs["padding"] = (reads[0] - first, last - reads[1], pl, pr)
        name = new(f"{o}/band{p}", g.tensors[o], r[1] - r[0])
        nodes.append(replace(n, inputs=ins, outputs=(name,), attrs=attrs,
                             name=f"{n.name or o}/band{p}"))
        return name

    x = g.inputs[0]
    plans = _reuse_plans(g, stage, out, bands(y.shape[1], count, row_step(y)), again) if reuse \
        else _recompute_plans(g, stage, out, bands(y.shape[1], count, row_step(y)))
    parts, carry = [], {}  # carry: tensor -> the copy of its rows later bands read
    # the stage node reading each tensor last: a late halo copy waits for it
    last_reader = {t: j for j, n in enumerate(stage) for t in n.inputs if t}
    strided = {n.inputs[0] for n in stage if n.op in WINDOW_OPS and _window(g, n)[0] > 1}
    waits = lambda t: late == "all" or (late == "strided" and t in strided)  # noqa: E731
    for p, (need, fresh) in enumerate(plans):
        have = {x: x}  # tensor -> the band tensor holding need[tensor] of it
        pending = []  # (tensor, its band tensor, rows held, rows to copy): late halo copies
        for j, n in enumerate(stage):
            for t, held, r, rows in [c for c in pending if last_reader.get(c[0], -1) < j]:
                carry[t] = rows_of(t, held, r, rows, copy=True)
            pending = [c for c in pending if last_reader.get(c[0], -1) >= j]
            o = n.outputs[0]
            if o not in need:
                continue
            r, c = need[o], fresh.get(o)
            kept = carry.pop(o, None)
            if kept is None:
                have[o] = compute(n, c, need, have, p)
            elif c is None:  # every row computed already
                have[o] = kept
            else:  # the rows kept, then the new ones, one after the other in one buffer
                if (c[0] - r[0]) % row_step(g.tensors[o]):
                    raise NotPatchable(f"new rows of '{o}' would start at a misaligned byte")
                halo = rows_of(o, kept, (r[0], c[0]), (r[0], c[0]), copy=True)
                have[o] = new(f"{o}/band{p}_all", g.tensors[o], r[1] - r[0])
                nodes.append(Node("concat", (halo, compute(n, c, need, have, p)),
                                  (have[o],), {"axis": 1, "activation": "none", "view": True},
                                  have[o]))
            later = plans[p + 1][0].get(o) if reuse and p + 1 < len(plans) and o not in again \
                else None
            if later is not None and later[0] < r[1]:  # rows the next band takes over
                if later[0] < r[0]:
                    raise NotPatchable(f"band {p + 1} reads rows of '{o}' before band {p}'s")
                if waits(o):  # after this band's readers of o: not live beside them
                    pending.append((o, have[o], r, (later[0], r[1])))
                else:
                    carry[o] = rows_of(o, have[o], r, (later[0], r[1]), copy=True)
        for t, held, r, rows in pending:
            carry[t] = rows_of(t, held, r, rows, copy=True)
        parts.append(have[out])
    nodes.append(Node("concat", tuple(parts), (out,), {"axis": 1, "activation": "none",
                                                      "view": True}, out))
    h = g.replace(nodes=nodes + list(g.nodes[k:]), tensors=tensors)
    return verify(h)


def split_pairs(g: Graph, k: int, groups: int) -> tuple:
    """(graph, its stage length, the groups' 1x1 outputs): g with each 1x1 convolution (stride
    1, not grouped) of its first k nodes whose output only a depthwise layer (multiplier 1) of
    the stage reads computed in `groups` channel groups: per group, the 1x1 layer with its
    output channels' weights, bias and per-channel quantization, then the depthwise layer on
    those channels; a channel concat joins the groups' depthwise outputs into the original
    tensor (same quantization: a plain copy). The values are unchanged: each output channel is
    computed from the same operands. NotPatchable when no pair can be split so."""
    readers = {}
    for n in g.nodes:
        for t in n.inputs:
            readers.setdefault(t, []).append(n)
    readers.update({t: readers.get(t, []) + [None] for t in g.outputs})
    tensors, nodes, taken, again = dict(g.tensors), [], set(), set()

    def part(t: Tensor, axis: int, j: int, hint: str) -> str:
        """Channel group j of constant t (along axis), its per-channel scales with it."""
        c = t.shape[axis] // groups
        pick = slice(j * c, (j + 1) * c)
        q = t.quant
        if q is not None and q.per_axis:
            q = Quant(tuple(q.scale[pick]), tuple(q.zero_point[pick]), q.axis)
        data = t.data[(slice(None),) * axis + (pick,)]
        name = fresh_name(g, f"{hint}/group{j}of{groups}", taken)
        taken.add(name)
        tensors[name] = Tensor(name, tuple(data.shape), t.dtype, data=data, quant=q)
        return name

    def act(like: Tensor, hint: str, j: int) -> str:
        name = fresh_name(g, f"{hint}/group{j}of{groups}", taken)
        taken.add(name)
        tensors[name] = Tensor(name, (*like.shape[:3], like.shape[3] // groups), like.dtype,
                               quant=like.quant)
        return name

    skip, made = set(), 0
    for i, n in enumerate(g.nodes):
        if i in skip:
            continue
        d = g.nodes[i + 1] if i + 1 < k else None
        if d is None or not _splittable(g, n, d, readers, groups):
            nodes.append(n)
            continue
        skip.add(i + 1)
        y, z = g.tensors[n.outputs[0]], g.tensors[d.outputs[0]]
        parts = []
        for j in range(groups):
            w, b = g.tensors[n.inputs[1]], n.inputs[2] if len(n.inputs) > 2 else ""
            yj = act(y, y.name, j)
            again.add(yj)
            nodes.append(replace(n, inputs=(n.inputs[0], part(w, 0, j, w.name),
                                            part(g.tensors[b], 0, j, b) if b else ""),
                                 outputs=(yj,), name=f"{n.name or y.name}/group{j}of{groups}"))
            dw, db = g.tensors[d.inputs[1]], d.inputs[2] if len(d.inputs) > 2 else ""
            zj = act(z, z.name, j)
            nodes.append(replace(d, inputs=(yj, part(dw, 3, j, dw.name),
                                            part(g.tensors[db], 0, j, db) if db else ""),
                                 outputs=(zj,), name=f"{d.name or z.name}/group{j}of{groups}"))
            parts.append(zj)
        nodes.append(Node("concat", tuple(parts), (z.name,), {"axis": 3, "activation": "none"},
                          f"{d.name or z.name}/groups"))
        del tensors[y.name]
        for t in n.inputs[1:] + d.inputs[1:]:  # the whole weights, when no one else reads them
            if t and all(r in (n, d) for r in readers[t]):
                tensors.pop(t, None)
        made += 1
    if not made:
        raise NotPatchable(f"no 1x1 -> depthwise pair in the first {k} nodes splits in "
                           f"{groups} channel groups")
    return verify(g.replace(nodes=nodes, tensors=tensors)), k + made * (2 * groups - 1), again


def _splittable(g: Graph, n: Node, d: Node, readers: dict, groups: int) -> bool:
    """n a 1x1 convolution (stride 1, not grouped) read by the depthwise layer d only
    (multiplier 1, no other activation input), their channels a multiple of `groups`."""
    if n.op != "conv2d" or d.op != "depthwise_conv2d" or len(n.inputs) < 2 \
            or len(d.inputs) < 2 or d.inputs[0] != n.outputs[0]:
        return False
    w, dw = g.tensors[n.inputs[1]], g.tensors[d.inputs[1]]
    x, y = g.tensors[n.inputs[0]], g.tensors[n.outputs[0]]
    if not (w.is_const and dw.is_const) or any(
            t and not g.tensors[t].is_const for t in n.inputs[1:] + d.inputs[1:]):
        return False
    c = y.shape[-1]
    return (tuple(w.shape[1:3]) == (1, 1) and w.shape[3] == x.shape[-1]
            and tuple(n.attrs["stride"]) == (1, 1) and tuple(n.attrs["padding"]) == (0, 0, 0, 0)
            and d.attrs.get("depth_multiplier", 1) == 1 and dw.shape[3] == c
            and readers.get(n.outputs[0]) == [d] and c % groups == 0
            and all(not g.tensors[t].quant or not g.tensors[t].quant.per_axis
                    or g.tensors[t].quant.axis == ax for t, ax in
                    ((n.inputs[1], 0), (d.inputs[1], 3))
                    + tuple((b, 0) for b in (n.inputs[2:3] + d.inputs[2:3]) if b)))


def _recompute_plans(g: Graph, stage: list, out: str, rows: list) -> list:
    """Per band: ({tensor: rows its band tensor holds}, {tensor: rows computed}); every band
    computes every row it reads (the input: whole)."""
    plans = []
    for band in rows:
        need = {out: band}
        for n in reversed(stage):
            if n.outputs[0] in need:
                _read(g, n, _input_rows(g, n, need[n.outputs[0]]), need)
        need[g.inputs[0]] = (0, g.tensors[g.inputs[0]].shape[1])
        plans.append((need, {t: r for t, r in need.items() if t != g.inputs[0]}))
    return plans


def _reuse_plans(g: Graph, stage: list, out: str, rows: list, again=frozenset()) -> list:
    """As _recompute_plans, but a band computes only the rows no band before it has: it holds
    the rows its consumers read from the first one on, those computed before taken over
    (band p+1's first rows come from band p), and computes the rest; the tensors in `again`
    it computes whole (their halo recomputed)."""
    done, plans = {}, []  # done: tensor -> the rows below this are computed
    for band in rows:
        read, fresh = {out: band}, {}
        for n in reversed(stage):
            o = n.outputs[0]
            if o not in read:
                continue
            start = read[o][0] if o in again else max(read[o][0], done.get(o, 0))
            if start < read[o][1]:
                fresh[o] = (start, read[o][1])
                _read(g, n, _input_rows(g, n, fresh[o]), read)
        need = {t: r if t in again else (r[0], max(r[1], done.get(t, 0)))
                for t, r in read.items()}
        need[g.inputs[0]] = (0, g.tensors[g.inputs[0]].shape[1])
        for t, r in need.items():
            done[t] = r[1]
        plans.append((need, fresh))
    return plans


def _read(g: Graph, n: Node, rows: tuple, need: dict) -> None:
    """Node n reads `rows` of each activation input: widen need to cover them."""
    for t in n.inputs:
        if t and not g.tensors[t].is_const:
            o = need.get(t, rows)
            need[t] = (min(o[0], rows[0]), max(o[1], rows[1]))


@dataclass(frozen=True)
class Choice:
    """What `choose` decided: k = 0 when the graph stays as it was."""
    graph: Graph
    k: int
    count: int
    arena: int
    macs: int
    base_arena: int
    base_macs: int
    reuse: bool = False  # patch_stage's: halo rows copied between bands, not recomputed
    late: str = ""  # patch_stage's: the halo copies made after the band's readers (LATE)
    lean: str = ""  # patch_stage's: the band layers on kernels with less scratch (LEAN)
    split: int = 1  # patch_stage's: the 1x1 -> depthwise pairs in this many channel groups
    order: tuple = ()  # g's nodes in this topological order before patching (empty: g's)
    tail_lean: tuple = ()  # (output, LEAN) of layers after the stage on leaner kernels
    lean_bands: int | None = None  # patch_stage's: only the first bands lean (None: all)

    @property
    def overhead(self) -> float:
        """Extra MACs in percent of the unpatched graph's."""
        return 100.0 * (self.macs - self.base_macs) / self.base_macs if self.base_macs else 0.0


def choose(g: Graph, cost, max_overhead: float = 10.0, max_bands: int = 64,
           quick=None, finalists: int = 4, progress=None) -> Choice:
    """The patched graph with the smallest arena whose MACs exceed g's by at most
    `max_overhead` percent (a bare form's MACs on the reference loops counted BARE_COST times
    more); `cost(graph)` -> (arena bytes, MACs) measures a candidate (every
    stage, band count, halos recomputed or reused; reused, the halo copies made at once or
    late, the band convolutions lean or not: patch_stage). `quick(graph)`, when given, is a
    cheaper estimate of cost that ranks the candidates by their leanest form the bound allows
    (late="all", the leanest of "bare", "bare_dw", "im2col"); the best of each stage length, the `finalists` best of those, are then measured by
    `cost` in every form. Ties go to fewer MACs, then fewer bands, then a shorter stage, then
    recomputing, then the form listed first (halo copies at once, not lean: fewer
    instructions) (deterministic). The finalists also include, per finalist stage length,
    the best estimate with the layers after the stage on their leanest kernels; _forms then
    picks the order of g's branches and those layers' kernels. When nothing beats g's own
    arena, g itself (k = 0).
    `progress(line)`, when given, hears one line per stage length tried and per finalist."""
    quick = quick or cost
    base_arena, base_macs = cost(g)
    best = Choice(g, 0, 1, base_arena, base_macs, base_arena, base_macs)
    rank = lambda c: (c.arena, c.macs, c.count, c.k or 1 << 30, c.reuse)  # noqa: E731
    limit = base_macs * (1 + max_overhead / 100.0)
    ranked = []
    for k in stage_lengths(g):
        out = g.tensors[_escaping(g, k)]
        rows = out.shape[1]
        if max(g.tensors[g.inputs[0]].nbytes, out.nbytes) >= best.arena:
            continue  # both are live while the last band runs (the output may take the
            # input's bytes the bands are done with, memory_plan.overlay_links): no gain
        top = min(rows // row_step(out), max_bands)
        if progress is not None and top >= 2:
            progress(f"stage of {k} layers: up to {top} bands of rows")
        # the leanest form within the bound
        lean = next(f for f in ("bare", "bare_dw", "im2col") if f == "im2col" or base_macs
                    + BARE_COST * sum(_window_macs(g, n) for n in g.nodes[:k]
                                      if _lean_of(g, n, f) == "bare") <= limit)
        for count in range(2, top + 1):
            for reuse in (False, True):
                try:
                    h = patch_stage(g, k, count, reuse, "all" if reuse else "", lean)
                except NotPatchable:
                    continue
                arena, macs = quick(h)
                c = Choice(h, k, count, arena, macs, base_arena, base_macs, reuse)
                # the estimate may exceed the full plan (its links all or none): the best
                # estimates go to the full plan even when they do not beat g's
                if macs <= limit:
                    ranked.append(c)
    ranked.sort(key=rank)
    # the finalists: the best estimate of each stage length (those of one stage's band
    # counts often tie), the `finalists` best of those
    heads = [c for i, c in enumerate(ranked) if all(d.k != c.k for d in ranked[:i])]
    heads = heads[:finalists]
    # and of those stage lengths, the best estimate with the layers after the stage on
    # their leanest kernels (_forms gives them those where it pays): there the bands' own
    # arena ranks the band counts, which the layers after the stage may hide
    more = []
    for head in heads:
        tail = len(g.nodes) - head.k
        if not lean_tail(head.graph, tail, "bare"):
            continue
        lean = min((replace(c, arena=a, macs=m) for c in ranked if c.k == head.k
                    for a, m in [quick(lean_layers(c.graph, lean_tail(c.graph, tail, "bare")))]),
                   key=rank)
        if lean.count != head.count or lean.reuse != head.reuse:
            more.append(lean)
    for c in heads + more:
        c = _forms(g, c, cost, limit, progress)
        if c is not None and rank(c) < rank(best):
            best = c
    return _fewer_lean(g, best, cost, limit)


def _fewer_lean(g: Graph, c: Choice, cost, limit: float) -> Choice:
    """The choice with only its first 1, 2, 4, ... bands lean, the fewest that keep its arena
    (lean kernels cost instructions; the later bands, with the input's first rows dead, often
    have room for the others' scratch), or the choice as it was."""
    if not c.k or not c.lean or c.lean_bands is not None:
        return c
    m = 1
    while m < c.count:
        h = _variant(g, c, m)
        arena, macs = cost(h)
        if (arena, macs) <= (c.arena, c.macs) and macs + BARE_COST * bare_macs(h) <= limit:
            return replace(c, graph=h, arena=arena, macs=macs, lean_bands=m)
        m *= 2
    return c


def _variant(g: Graph, c: Choice, lean_bands) -> Graph:
    """c's graph (its branch order, band form and leaner layers after the stage) with only
    the first `lean_bands` bands lean."""
    h = patch_stage(reordered(g, c.order), c.k, c.count, c.reuse, c.late, c.lean, c.split,
                    lean_bands)
    return lean_layers(h, dict(c.tail_lean))


def _forms(g: Graph, c: Choice, cost, limit: float, progress=None):
    """The candidate's stage and bands in the form with the smallest arena as `cost` measures
    it within `limit` MACs (a bare layer's MACs counted BARE_COST times more), or None. Three
    choices, one after the other, the bands first: their form (patch_stage's late, lean,
    split; ties keep the form listed first: lean costs instructions, late ones copy nothing
    more, channel groups recompute their 1x1 halos), then g's residual branches in another
    order (stage_orders: which branch runs first decides what is live beside what; ties keep
    g's own), both measured with the layers after the stage on kernels without scratch so
    that those do not hide the bands' arena; then those layers: each keeps its own kernel
    unless a leaner one (lean_tail: more instructions) makes the arena smaller."""
    tail = len(g.nodes) - c.k
    measured = 0

    def measure(h):
        """The smaller of h's arena as it is and with the layers after the stage lean (a
        lean tail may also cost bytes: VWW in channel groups 29,184 -> 33,312)."""
        nonlocal measured
        measured += 2
        return min(cost(h), cost(lean_layers(h, lean_tail(h, tail, "bare"))))

    def within(h, macs) -> bool:
        return macs + BARE_COST * bare_macs(h) <= limit
    best, at = None, None
    lates = LATE if c.reuse else ("",)
    # the channel groups only with the lean kernels: a form that pays where the bands'
    # working set is what is left to shrink
    forms = [(late, lean, 1) for lean in LEAN for late in lates] + \
        [(late, lean, split) for split in SPLITS for lean in LEAN[1:] for late in lates]
    for late, lean, split in forms:
        try:
            h = patch_stage(g, c.k, c.count, c.reuse, late, lean, split)
        except NotPatchable:
            continue
        bands = None
        if not within(h, c.macs):  # bare in every band is over the bound: in the first few
            if "bare" not in lean:
                continue
            score = measure(h)
            if at is not None and score >= at:
                continue
            for m in (2 ** i for i in range(c.count.bit_length())):
                few = patch_stage(g, c.k, c.count, c.reuse, late, lean, split, m)
                if m >= c.count or not within(few, c.macs):
                    break
                if measure(few) == score:
                    h, bands = few, m
                    break
            if bands is None:
                continue
        score = measure(h)
        if within(h, score[1]) and (at is None or score < at):
            best, at = replace(c, graph=h, late=late, lean=lean, split=split,
                               lean_bands=bands), score
    if best is None:
        return None
    for order in stage_orders(g, c.k)[1:]:
        try:
            h = patch_stage(reordered(g, order), c.k, c.count, c.reuse, best.late, best.lean,
                            best.split, best.lean_bands)
        except NotPatchable:
            continue
        score = measure(h)
        if score < at:
            best, at = replace(best, graph=h, order=order), score
    # the layers after the stage: as they are, all on the reference loops or the convolutions
    # on im2col, the smallest (ties: as they are); then each given its own kernel back where
    # the arena stays (the reference loops only as far as the bound allows)
    plain = best.graph
    leans, arena, macs = None, None, None
    for option in ({}, lean_tail(plain, tail, "bare"), lean_tail(plain, tail, "im2col")):
        h = lean_layers(plain, option)
        if (leans is None or option != leans) and within(h, at[1]):
            score = cost(h)
            measured += 1
            if leans is None or score < (arena, macs):
                leans, (arena, macs) = option, score
    if leans:
        for t in list(leans):
            fewer = {u: v for u, v in leans.items() if u != t}
            score = cost(lean_layers(plain, fewer))
            measured += 1
            if score <= (arena, macs):
                leans, (arena, macs) = fewer, score
    best = replace(best, graph=lean_layers(plain, leans), arena=arena, macs=macs,
                   tail_lean=tuple(leans.items()))
    if progress is not None:
        progress(f"{c.k} layers in {c.count} bands: arena {best.arena:,} bytes "
                 f"({measured} forms measured)")
    return best


def stage_orders(g: Graph, k: int, limit: int = 16) -> list:
    """Topological orders of g's nodes (node indices, g's own first) that keep its first k
    nodes the first k: the residual branches inside the stage and after it in each order
    (memory_plan.topological_orders, at most `limit`)."""
    from .memory_plan import topological_orders
    index = {id(n): i for i, n in enumerate(g.nodes)}
    head = set(range(k))
    out = []
    for nodes in topological_orders(g, limit):
        order = tuple(index[id(n)] for n in nodes)
        if set(order[:k]) == head:
            out.append(order)
    return out


def reordered(g: Graph, order: tuple) -> Graph:
    """g with its nodes in `order` (node indices; a topological order)."""
    return g.replace(nodes=[g.nodes[i] for i in order]) if order else g


def lean_tail(g: Graph, tail: int, kind: str) -> dict:
    """{output: LEAN} for the last `tail` nodes of g that a lean form gives less scratch:
    convolutions with a window on `kind` (im2col or bare), depthwise layers bare (the forms
    patch_stage's `lean` gives the band layers)."""
    out = {}
    for n in g.nodes[len(g.nodes) - tail:]:
        if n.attrs.get("lean") or n.attrs.get("view") or len(n.outputs) != 1:
            continue
        if n.op == "conv2d" and g.tensors[n.inputs[1]].shape[1:3] != (1, 1):
            out[n.outputs[0]] = kind
        elif n.op == "depthwise_conv2d":
            out[n.outputs[0]] = "bare"
    return out


def lean_layers(g: Graph, leans: dict) -> Graph:
    """g with the layers writing the tensors of `leans` ({output: LEAN}) asking their
    kernels for less scratch (the same arithmetic: codegen_c/kernels/schedule_kernel)."""
    return g.replace(nodes=[replace(n, attrs=dict(n.attrs, lean=leans[n.outputs[0]]))
                            if n.outputs and n.outputs[0] in leans else n for n in g.nodes])
