"""int8 SVDF and integer LSTM (8x8 -> 16): their inner products on mf_seq_dot_s8
(runtime_c/mcuforge_seq.h). The reference kernel (codegen_c/lower/state.py) keeps everything
else (gates, state updates; the LSTM's is lowered with fast=True: its requantizations on
mf_seq_rq where their bounds prove it exact); each innermost loop of the form

    acc = acc + W[w0 + k] * (V[v0 + k] + c)      (W, V int8, acc int32, k < n)

becomes acc = acc + mf_seq_dot_s8(&W[w0], &V[v0], n, c). The reference writes its sums that
way only where it proved them free of int32 overflow (else through mf_wrap_add_i32, a form
left alone), so the micro-kernel's order of the same products is exact.

Where such a product reads row j of a constant W inside the loop over j, and its vector
neither depends on j nor is written in that loop (the LSTM's gates for all units, SVDF's
feature products for all filters), the products of all rows are hoisted before the loop as
one matrix-vector call into scratch, and the loop reads them from there: mf_seq_mv_w16 on
the DSP extension (the rows widened to int16 at compile time, twice their flash, unless the
flash budget keeps the layer narrow; mf_seq_mv_w16_g<G> for vectors of at most 8 groups of 4
taps), mf_seq_mv_s8 elsewhere; both on rows packed in blocks of 4 (micro_seq.pack_rows4*). The
kernels have portable bodies, so the schedule serves every target."""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from .. import loop_ir as ir
from ..micro_seq import pack_rows4, pack_rows4_w16
from ..lower import OpContext
from ..lower.state import lstm_tflite
from . import schedules

FN = "mf_seq_dot_s8"
MV = "mf_seq_mv_s8"  # (mf_seq_mv_w16: the weights pre-widened, on the DSP extension)
MV16_UNROLLED = 8  # mf_seq_mv_w16_g<G>: vectors of at most 4 G taps, the groups unrolled
SCRATCH = "seq_scratch"  # int32 words: the hoisted products, then one widened vector


def _row_start(index: ir.Expr, var: str):
    """w0 when index is w0 + var (var absent from w0), else None."""
    if index == ir.Var(var):
        return ir.Const(0)
    if isinstance(index, ir.Bin) and index.op == "+" and index.b == ir.Var(var) \
            and var not in _vars(index.a):
        return index.a
    return None


def _vars(e) -> set:
    out = set()

    def visit(x):
        if isinstance(x, ir.Var):
            out.add(x.name)
        elif isinstance(x, ir.Expr):
            for f in getattr(x, "__dataclass_fields__", {}):
                visit(getattr(x, f))
        elif isinstance(x, tuple):
            for y in x:
                visit(y)
    visit(e)
    return out


def dot_call(loop: ir.Loop):
    """The statement replacing `loop` by one mf_seq_dot_s8 call, or None when the loop is not
    of the form above."""
    if loop.start != 0 or loop.step != 1 or len(loop.body) != 1:
        return None
    s = loop.body[0]
    if not isinstance(s, ir.Assign) or not isinstance(s.value, ir.Bin) or s.value.op != "+" \
            or s.value.a != ir.Var(s.var) or s.value.dtype != "int32":
        return None
    prod = s.value.b
    if not isinstance(prod, ir.Bin) or prod.op != "*" or not isinstance(prod.a, ir.Load):
        return None
    w, v, off = prod.a, prod.b, 0
    if isinstance(v, ir.Bin) and v.op in "+-" and isinstance(v.b, ir.Const):
        v, off = v.a, (v.b.value if v.op == "+" else -v.b.value)
    if not isinstance(v, ir.Load) or w.dtype != "int8" or v.dtype != "int8" \
            or not -128 <= off <= 128:
        return None
    w0, v0 = _row_start(w.index, loop.var), _row_start(v.index, loop.var)
    if w0 is None or v0 is None:
        return None
    dot = ir.call(FN, ir.Ptr(w.buf, w0), ir.Ptr(v.buf, v0), loop.extent, off)
    return ir.Assign(s.var, ir.Var(s.var) + dot)


def _replace_dots(body: tuple) -> tuple:
    """Every loop of the form above replaced (any loop variable), the others kept."""
    out = []
    for s in body:
        if isinstance(s, ir.Loop):
            call = dot_call(s)
            out.append(call if call is not None else replace(s, body=_replace_dots(s.body)))
        elif isinstance(s, ir.If):
            out.append(replace(s, then=_replace_dots(s.then), orelse=_replace_dots(s.orelse)))
        else:
            out.append(s)
    return tuple(out)


def _written(body) -> set:
    """Buffers stored to, loop variables and locals declared or assigned in body."""
    out = set()
    for s in ir.walk(body):
        if isinstance(s, ir.Loop):
            out.add(s.var)
        elif isinstance(s, ir.Store):
            out.add(s.buf)
        elif isinstance(s, (ir.Decl, ir.Assign)):
            out.add(s.var)
    return out


def _dot_calls(e, found: list):
    """The mf_seq_dot_s8 calls in expression e."""
    if isinstance(e, ir.Call) and e.fn == FN:
        found.append(e)
    elif isinstance(e, ir.Expr):
        for f in getattr(e, "__dataclass_fields__", {}):
            v = getattr(e, f)
            if isinstance(v, ir.Expr):
                _dot_calls(v, found)
            elif isinstance(v, tuple):
                for x in v:
                    _dot_calls(x, found)


class _Hoist:
    """Hoists row products out of loops over rows (see the module docstring)."""

    def __init__(self, consts: dict, wide: bool):
        self.consts = consts  # const buffer name -> Buffer
        self.wide = wide  # int16 weights (mf_seq_mv_w16)
        self.fn = "mf_seq_mv_w16" if wide else MV
        self.packed = {}  # (buffers, rows, n) -> the packed Buffer
        self.words = 0  # int32 words of scratch for the hoisted products
        self.work = 0  # int32 words for the widened vector (shared by all calls)
        self.calls = 0
        self.products = 0  # (hoisted products, several per call where they share a vector)

    def body(self, body: tuple) -> tuple:
        out = []
        for s in body:
            if isinstance(s, ir.Loop):
                s = replace(s, body=self.body(s.body))
                out += self.loop(s)
            elif isinstance(s, ir.If):
                out.append(replace(s, then=self.body(s.then), orelse=self.body(s.orelse)))
            else:
                out.append(s)
        return tuple(out)

    def loop(self, loop: ir.Loop) -> list:
        if loop.start != 0 or loop.step != 1:
            return [loop]
        written = _written(loop.body) | {loop.var}
        calls = []
        for s in ir.walk(loop.body):
            for e in vars(s).values() if hasattr(s, "__dataclass_fields__") else ():
                if isinstance(e, ir.Expr):
                    _dot_calls(e, calls)
        # the hoistable calls, grouped by vector: the rows of one group (the LSTM's four gates
        # on x, or on h) are stacked into one matrix, so the vector is widened once
        groups = {}
        for c in dict.fromkeys(calls):
            (wp, vp, n, off) = c.args
            n = n.value
            w = self.consts.get(wp.buf)
            if w is None or w.dtype != "int8" or w.size < loop.extent * n \
                    or wp.offset != ir.Var(loop.var) * n or vp.buf in written \
                    or _vars(vp.offset) & written:
                continue
            groups.setdefault((vp, off, n), []).append(c)
        hoisted, pre = {}, []
        for (vp, off, n), members in groups.items():
            names = [c.args[0].buf for c in members]
            key = (tuple(names), loop.extent, n)
            if key not in self.packed:
                rows = np.concatenate([np.asarray(self.consts[m].data, np.int8).reshape(-1)
                                       [:loop.extent * n].reshape(loop.extent, n)
                                       for m in names])
                data = (pack_rows4_w16 if self.wide else pack_rows4)(rows)
                self.packed[key] = ir.Buffer(
                    f"{names[0]}_rows4" if len(names) == 1 else f"{names[0]}_{len(names)}_rows4",
                    str(data.dtype), data.size, "const", data,
                    f"{', '.join(names)}: {len(rows)} rows x {n} taps, in blocks of 4 rows x "
                    f"4 taps ({self.fn})")
            slot = self.words
            self.words += len(names) * loop.extent
            self.work = max(self.work, (n + 3) // 4 * 2)
            fn = self.fn  # (a short vector: the entry with its groups unrolled)
            if self.wide and (n + 3) // 4 <= MV16_UNROLLED:
                fn = f"{self.fn}_g{(n + 3) // 4}"
            pre.append(ir.CallStmt(fn, (
                ir.Ptr(self.packed[key].name, ir.Const(0)), vp, ir.Const(n), off,
                ir.Const(len(names) * loop.extent), ir.Ptr(SCRATCH, ir.Const(slot)),
                ir.Ptr(SCRATCH, ir.Const(-1), ctype="int16_t *"))))  # work: set below
            for g, c in enumerate(members):
                hoisted[c] = ir.Load(SCRATCH, ir.Var(loop.var) + (slot + g * loop.extent),
                                     "int32")
        if not hoisted:
            return [loop]
        self.calls += len(pre)
        self.products += len(hoisted)
        return pre + [replace(loop, body=_substitute_calls(loop.body, hoisted))]


def _substitute_calls(node, table: dict):
    if isinstance(node, tuple):
        return tuple(_substitute_calls(x, table) for x in node)
    if isinstance(node, ir.Call) and node in table:
        return table[node]
    if hasattr(node, "__dataclass_fields__") and not isinstance(node, (ir.Const, ir.Var)):
        return replace(node, **{f: _substitute_calls(getattr(node, f), table)
                                for f in node.__dataclass_fields__
                                if isinstance(getattr(node, f), (ir.Expr, ir.Stmt, tuple))})
    return node


def _buffers_used(node, out=None) -> set:
    out = set() if out is None else out
    if isinstance(node, tuple):
        for x in node:
            _buffers_used(x, out)
    elif hasattr(node, "__dataclass_fields__"):
        if isinstance(node, (ir.Load, ir.Ptr, ir.Store)):
            out.add(node.buf)
        for f in node.__dataclass_fields__:
            v = getattr(node, f)
            if isinstance(v, (ir.Expr, ir.Stmt, tuple)):
                _buffers_used(v, out)
    return out


def _set_work(node, offset: int):
    """The work pointers (offset -1 above) point past the hoisted products."""
    if isinstance(node, tuple):
        return tuple(_set_work(x, offset) for x in node)
    if isinstance(node, ir.Ptr) and node.buf == SCRATCH and node.offset == ir.Const(-1):
        return replace(node, offset=ir.Const(offset))
    if hasattr(node, "__dataclass_fields__") and not isinstance(node, (ir.Const, ir.Var)):
        return replace(node, **{f: _set_work(getattr(node, f), offset)
                                for f in node.__dataclass_fields__
                                if isinstance(getattr(node, f), (ir.Expr, ir.Stmt, tuple))})
    return node


@schedules("svdf", "lstm_tflite")
def seq(ctx: OpContext, ref: ir.Kernel, target) -> ir.Kernel | None:
    if ctx.input(0).dtype != "int8":
        return None
    if ctx.node.op == "lstm_tflite":  # its requantizations in the fast form where proven
        ref = lstm_tflite(ctx, fast=True)
    body = _replace_dots(ref.body)
    n = sum(1 for s in ir.walk(body) if isinstance(s, ir.Assign)
            and isinstance(s.value, ir.Bin) and isinstance(s.value.b, ir.Call)
            and s.value.b.fn == FN)
    if not n:
        return None
    bufs = ref.buffers
    wide = target.dsp and ctx.node.outputs[0] not in target.narrow_weights
    h = _Hoist({b.name: b for b in ref.consts}, wide)
    if not ref.scratch and not any(b.name == SCRATCH for b in bufs):
        body = h.body(body)
    how = f"{n} inner products on {FN}"
    if h.calls:
        body = _set_work(body, h.words)
        used = _buffers_used(body)  # (constants only the hoisted calls read are replaced)
        bufs = tuple(b for b in bufs if b.kind != "const" or b.name in used) \
            + tuple(h.packed.values()) \
            + (ir.Buffer(SCRATCH, "int32", h.words + h.work, "scratch"),)
        how += (f", {h.products} of them hoisted out of their loop over rows as {h.calls} "
                f"{h.fn} calls ({4 * (h.words + h.work)} bytes scratch)")
    doc = f"{ref.doc}\nscheduled: {how}"
    return ir.Kernel(ctx.name, tuple(bufs), body, doc, ref.macs, h.fn if h.calls else FN)

