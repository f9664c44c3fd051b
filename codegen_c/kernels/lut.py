"""8-bit unary element-wise layers as a 256-entry table (int8 / uint8 in and out).

A reference kernel of the form

    for i < n: (local declarations ...) y[i] = f(x[i])

whose value depends only on the input byte (the loop body reads x at i and constant tables
at indices free of i, nothing else; logistic, tanh, hard_swish, leaky_relu, relu, relu6, a
requantizing quantize, abs, an ADD / MUL / SUB of a constant scalar, ... whatever the lowerings
write that way) becomes y[i] = lut[x[i] + 128] (uint8: lut[x[i]]): one mf_ew_lut8 call
(runtime_c/mcuforge_ew.h, four bytes a word). The table is the reference body itself run by
the loop-IR evaluator at compile time on all 256 input values, so it holds exactly what the
reference C computes; an input byte on which the reference would hit undefined behaviour
declines the schedule.

It pays where the loop's work outweighs 256 bytes of flash: the reference calls a runtime
function per element (a requantization at least, ~30 instructions on a Cortex-M4; logistic
~345) and the table costs ~4 a byte. Estimated saving n * (30 * calls + other nodes - 6)
instructions; the table is used when that is at least 512 (2 instructions per byte of table),
so from ~20 elements for one call. Serves every target (plain C)."""
from __future__ import annotations

import numpy as np

from .. import loop_ir as ir
from .. import micro_ew  # noqa: F401  (registers the mirror)
from ..lower import OpContext
from . import schedules

EIGHT_BIT = {"int8": -128, "uint8": 0}  # dtype -> its smallest value (the table's first entry)
CALL_COST, TABLE_COST, MIN_SAVING = 30, 6, 512
FN = "mf_ew_lut8"  # runtime_c/mcuforge_ew.h (mirror micro_ew.py)
OPS = ("relu", "relu6", "leaky_relu", "hard_swish", "logistic", "tanh", "quantize", "unary",
       "dequantize", "cast",
       # binary ops whose other operand is one constant (x + 3, x * 0.5): the constant is read
       # at an index free of i (a broadcast constant tensor is not: declined)
       "add", "mul", "sub", "div", "binary")


def _exprs(node):
    """Every expression node under node (statements and expressions)."""
    out = []

    def visit(x):
        if isinstance(x, tuple):
            for y in x:
                visit(y)
        elif isinstance(x, (ir.Expr, ir.Stmt)):
            if isinstance(x, ir.Expr):
                out.append(x)
            for f in x.__dataclass_fields__:
                visit(getattr(x, f))
    visit(node)
    return out


def _vars(e) -> set:
    return {x.name for x in _exprs(e) if isinstance(x, ir.Var)}


def byte_function(ref: ir.Kernel):
    """(loop, x buffer, y buffer) when ref computes y[i] from x[i] alone (see above), else
    None."""
    ins = [b for b in ref.buffers if b.kind == "in"]
    outs = [b for b in ref.buffers if b.kind == "out"]
    if len(ins) != 1 or len(outs) != 1 or ref.scratch or len(ref.body) != 1 \
            or not isinstance(ref.body[0], ir.Loop):
        return None
    x, y, loop = ins[0], outs[0], ref.body[0]
    if x.dtype not in EIGHT_BIT or y.dtype not in EIGHT_BIT or loop.start != 0 \
            or loop.step != 1 or loop.extent != x.size or x.size != y.size:
        return None
    i = ir.Var(loop.var)
    consts = {b.name for b in ref.consts}
    stores = 0
    for s in ir.walk(loop.body):
        if isinstance(s, (ir.Loop, ir.If, ir.CallStmt)):
            return None  # (an inner loop or branch: not the flat form)
        if isinstance(s, ir.Store):
            if s.buf != y.name or s.index != i:
                return None
            stores += 1
    if stores != 1:
        return None
    for e in _exprs(loop.body):
        if isinstance(e, ir.Load):
            if e.buf == x.name:
                if e.index != i:
                    return None
            elif e.buf not in consts or loop.var in _vars(e.index):
                return None
        elif isinstance(e, ir.Ptr):
            return None
    return loop, x, y


def saving(loop: ir.Loop) -> int:
    """Estimated instructions the table saves over the reference loop (see above)."""
    es = _exprs(loop.body)
    calls = sum(isinstance(e, ir.Call) for e in es)
    return loop.extent * (CALL_COST * calls + len(es) - calls - TABLE_COST)


def tabulate(ref: ir.Kernel, loop: ir.Loop, x: ir.Buffer, y: ir.Buffer) -> np.ndarray | None:
    """The reference body on the 256 input values, by the loop-IR evaluator; None where it
    has undefined behaviour."""
    from ..evaluate import run_kernel
    lo = EIGHT_BIT[x.dtype]
    bufs = tuple(ir.Buffer(b.name, b.dtype, 256, b.kind) if b.kind in ("in", "out") else b
                 for b in ref.buffers)
    k = ir.Kernel(ref.name, bufs, (ir.Loop(loop.var, 256, loop.body),))
    xs = np.arange(lo, lo + 256).astype(x.dtype)
    ys = np.zeros(256, y.dtype)
    try:
        run_kernel(k, {x.name: xs, y.name: ys})
    except (ArithmeticError, IndexError, ValueError):
        return None
    return ys


@schedules(*OPS)
def lut(ctx: OpContext, ref: ir.Kernel, target) -> ir.Kernel | None:
    found = byte_function(ref)
    if found is None:
        return None
    loop, x, y = found
    if saving(loop) < MIN_SAVING:
        return None
    table = tabulate(ref, loop, x, y)
    if table is None:
        return None
    lo = EIGHT_BIT[x.dtype]
    # indexed by the byte's bits: an int8 v's byte ^ 0x80 is v + 128, its place in the table
    flip = 0x80 if x.dtype == "int8" else 0
    tab = ir.Buffer("lut", y.dtype, 256, "const", table,
                    f"the reference's output for each input value {lo}..{lo + 255}")
    body = (ir.CallStmt(FN, (ir.Ptr(x.name, ir.Const(0), ctype="const uint8_t *"),
                             ir.Ptr(y.name, ir.Const(0), ctype="uint8_t *"),
                             ir.Const(loop.extent),
                             ir.Ptr("lut", ir.Const(0), ctype="const uint8_t *"),
                             ir.Const(flip))),)
    doc = f"{ref.doc}\nscheduled: {FN}, a 256-entry table of the reference's values " \
          f"(computed at compile time)"
    return ir.Kernel(ctx.name, tuple(ref.params) + (tab,), body, doc, ref.macs, FN)
