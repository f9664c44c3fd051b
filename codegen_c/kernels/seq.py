"""int8 SVDF and integer LSTM (8x8 -> 16): their inner products on mf_seq_dot_s8
(runtime_c/mcuforge_seq.h). The reference kernel (codegen_c/lower/state.py) keeps everything
else (requantization, gates, state updates); each innermost loop of the form

    acc = acc + W[w0 + k] * (V[v0 + k] + c)      (W, V int8, acc int32, k < n)

becomes acc = acc + mf_seq_dot_s8(&W[w0], &V[v0], n, c). The reference writes its sums that
way only where it proved them free of int32 overflow (else through mf_wrap_add_i32, a form
left alone), so the micro-kernel's order of the same products is exact. The kernel has a
portable body, so the schedule serves every target."""
from __future__ import annotations

from dataclasses import replace

from .. import loop_ir as ir
from ..lower import OpContext
from . import schedules

FN = "mf_seq_dot_s8"


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


@schedules("svdf", "lstm_tflite")
def seq(ctx: OpContext, ref: ir.Kernel, target) -> ir.Kernel | None:
    if ctx.input(0).dtype != "int8":
        return None
    body = _replace_dots(ref.body)
    n = sum(1 for s in ir.walk(body) if isinstance(s, ir.Assign)
            and isinstance(s.value, ir.Bin) and isinstance(s.value.b, ir.Call)
            and s.value.b.fn == FN)
    if not n:
        return None
    doc = f"{ref.doc}\nscheduled: {n} inner products on {FN}"
    return ir.Kernel(ctx.name, ref.buffers, body, doc, ref.macs, FN)

