"""The loop IR: what every operator is lowered to before it becomes C.

A `Kernel` is one C function: buffers it reads and writes (pointer parameters), constant
buffers (weights, per-channel multipliers; `static const` in flash) and a body of statements.
Statements are loops with constant bounds, stores, scalar locals, conditionals and calls to
runtime intrinsics; expressions are constants, variables, loads, arithmetic, casts, selects and
intrinsic calls. Everything is a frozen dataclass, so schedules (split, reorder, unroll,
replacing a loop nest by a micro-kernel call) are functions that rebuild trees.

Integer semantics are C's on a 32-bit-int target: int8/int16/uint8 values promote to int32,
division truncates toward zero, >> is arithmetic. `evaluate.py` is the executable definition.
"""
from __future__ import annotations

import operator
from dataclasses import dataclass, fields, replace
from typing import Optional, Union

import numpy as np

INT_DTYPES = ("int8", "uint8", "int16", "int32", "int64", "bool")
BIN_OPS = ("+", "-", "*", "/", "%", "<<", ">>", "&", "|", "^",
           "<", "<=", ">", ">=", "==", "!=", "&&", "||", "max", "min")
COMPARE_OPS = ("<", "<=", ">", ">=", "==", "!=", "&&", "||")


def _wrap(x) -> "Expr":
    if isinstance(x, Expr):
        return x
    if isinstance(x, (bool, np.bool_)):
        return Const(int(x), "int32")
    if isinstance(x, (int, np.integer)):
        return Const(int(x), "int32")
    if isinstance(x, (float, np.floating)):
        return Const(float(np.float32(x)), "float32")
    raise TypeError(f"cannot use {x!r} in the loop IR")


class UndefinedBehaviour(ArithmeticError):
    """What C leaves undefined (signed overflow, ...) happened in the evaluator or a mirror."""


class Expr:
    """Base of expressions; arithmetic operators build (and constant-fold) Bin nodes."""

    dtype: str

    def __add__(self, o): return binop("+", self, o)
    def __radd__(self, o): return binop("+", o, self)
    def __sub__(self, o): return binop("-", self, o)
    def __rsub__(self, o): return binop("-", o, self)
    def __mul__(self, o): return binop("*", self, o)
    def __rmul__(self, o): return binop("*", o, self)
    def __lshift__(self, o): return binop("<<", self, o)
    def __rshift__(self, o): return binop(">>", self, o)
    def lt(self, o): return binop("<", self, o)
    def le(self, o): return binop("<=", self, o)
    def gt(self, o): return binop(">", self, o)
    def ge(self, o): return binop(">=", self, o)
    def eq(self, o): return binop("==", self, o)
    def ne(self, o): return binop("!=", self, o)
    def div(self, o): return binop("/", self, o)
    def mod(self, o): return binop("%", self, o)


@dataclass(frozen=True)
class Const(Expr):
    value: Union[int, float]
    dtype: str = "int32"


@dataclass(frozen=True)
class Var(Expr):
    """A loop index or a scalar local declared by `Decl`."""
    name: str
    dtype: str = "int32"


@dataclass(frozen=True)
class Load(Expr):
    buf: str
    index: Expr
    dtype: str


@dataclass(frozen=True)
class Bin(Expr):
    op: str
    a: Expr
    b: Expr
    dtype: str


@dataclass(frozen=True)
class Unary(Expr):
    op: str  # "-", "!"
    a: Expr
    dtype: str


@dataclass(frozen=True)
class Cast(Expr):
    a: Expr
    dtype: str


@dataclass(frozen=True)
class Select(Expr):
    cond: Expr
    a: Expr
    b: Expr
    dtype: str


@dataclass(frozen=True)
class Call(Expr):
    """A runtime intrinsic (runtime_c/mcuforge_rt.h) returning a scalar."""
    fn: str
    args: tuple
    dtype: str


@dataclass(frozen=True)
class Ptr(Expr):
    """&buf[offset], passed to row intrinsics and micro-kernels; `ctype` casts it to another
    C pointer type (a table of int32 read as `const mf_rq *`)."""
    buf: str
    offset: Expr
    dtype: str = "ptr"
    ctype: str = ""


class Stmt:
    """Base of statements."""


@dataclass(frozen=True)
class Loop(Stmt):
    var: str
    extent: int  # iterates var = start, start+step, ... < start + extent*step
    body: tuple
    start: int = 0
    step: int = 1
    unroll: bool = False


@dataclass(frozen=True)
class Store(Stmt):
    buf: str
    index: Expr
    value: Expr


@dataclass(frozen=True)
class Decl(Stmt):
    var: str
    dtype: str
    init: Expr


@dataclass(frozen=True)
class Assign(Stmt):
    var: str
    value: Expr


@dataclass(frozen=True)
class If(Stmt):
    cond: Expr
    then: tuple
    orelse: tuple = ()


@dataclass(frozen=True)
class CallStmt(Stmt):
    """A runtime intrinsic called for its effect (e.g. a softmax row)."""
    fn: str
    args: tuple


@dataclass(frozen=True)
class Comment(Stmt):
    text: str


@dataclass(frozen=True, eq=False)
class Buffer:
    """A buffer a kernel touches. kind: 'in' / 'out' (pointer parameters into the arena),
    'scratch' (a pointer parameter to working memory in the arena, live during the call only,
    its contents undefined on entry; after the ins and outs) or 'const' (static const data
    emitted next to the kernel). `size` counts elements of `dtype`."""
    name: str
    dtype: str
    size: int
    kind: str
    data: Optional[np.ndarray] = None
    comment: str = ""


@dataclass(frozen=True, eq=False)
class Kernel:
    name: str
    buffers: tuple  # Buffer, parameters first in call order, then constants
    body: tuple
    doc: str = ""  # shapes and quantization, printed above the function
    macs: int = 0
    schedule: str = ""  # the micro-kernel a schedule chose (e.g. "mf_gemm_w16"); "" reference
    # ((input buffer, byte shift, a tighter shift that is unsafe or None), ...): the output buffer may be written over that input at
    # output = input + shift, which the kernel's access order makes safe (kernels/inplace.py);
    # empty: never (the default; every kernel that declares nothing keeps separate buffers)
    in_place: tuple = ()
    # file-scope C definitions the body calls (e.g. a micro-kernel's copy for one constant
    # geometry), printed once per model file before the first kernel using them
    shared: tuple = ()

    @property
    def params(self) -> list:
        """Pointer parameters in call order: ins and outs as listed, then scratch."""
        return [b for b in self.buffers if b.kind in ("in", "out")] + self.scratch

    @property
    def scratch(self) -> list:
        return [b for b in self.buffers if b.kind == "scratch"]

    @property
    def scratch_bytes(self) -> int:
        """Arena bytes the call needs as working memory (each scratch buffer 8-aligned)."""
        return sum((b.size * np.dtype(b.dtype if b.dtype != 'bool' else 'uint8').itemsize + 7) // 8 * 8 for b in self.scratch)

    @property
    def consts(self) -> list:
        return [b for b in self.buffers if b.kind == "const"]


# ---- builders that keep the trees small (constant folding of index arithmetic) ----

def result_dtype(a: Expr, b: Expr) -> str:
    if "float32" in (a.dtype, b.dtype):
        return "float32"
    if "int64" in (a.dtype, b.dtype):
        return "int64"
    return "int32"


def binop(op: str, a, b) -> Expr:
    a, b = _wrap(a), _wrap(b)
    dtype = "int32" if op in COMPARE_OPS else result_dtype(a, b)
    if isinstance(a, Const) and isinstance(b, Const) and dtype == "int32" and op in "+-*":
        return Const(_FOLD[op](a.value, b.value), "int32")
    # x - (-c) -> x + c and x + (-c) -> x - c: reads as the arithmetic it is
    if op in ("+", "-") and isinstance(b, Const) and dtype == "int32" and -2**31 < b.value < 0:
        return binop("-" if op == "+" else "+", a, -b.value)
    if op == "+" and _is(b, 0) or op == "-" and _is(b, 0) or op == "*" and _is(b, 1):
        return a
    if op == "+" and _is(a, 0) or op == "*" and _is(a, 1):
        return b
    if op == "*" and (_is(a, 0) or _is(b, 0)) and dtype == "int32":
        return Const(0, "int32")
    # (x +- c1) +- c2 -> x + (+-c1 +- c2): keeps unrolled index expressions readable
    if op in ("+", "-") and isinstance(b, Const) and isinstance(a, Bin) and a.op in ("+", "-") \
            and isinstance(a.b, Const) and dtype == "int32":
        total = (a.b.value if a.op == "+" else -a.b.value) + (b.value if op == "+" else -b.value)
        return binop("+", a.a, total)
    return Bin(op, a, b, dtype)


_FOLD = {"+": operator.add, "-": operator.sub, "*": operator.mul}


def _is(e: Expr, v) -> bool:
    return isinstance(e, Const) and e.value == v


def cast(a, dtype: str) -> Expr:
    a = _wrap(a)
    return a if a.dtype == dtype else Cast(a, dtype)


def call(fn: str, *args, dtype: str = "int32") -> Call:
    return Call(fn, tuple(_wrap(x) for x in args), dtype)


def select(cond, a, b) -> Expr:
    a, b = _wrap(a), _wrap(b)
    return Select(_wrap(cond), a, b, result_dtype(a, b))


def vmax(a, b) -> Expr:
    return binop("max", a, b)


def vmin(a, b) -> Expr:
    return binop("min", a, b)


def clamp(x, lo, hi) -> Expr:
    return vmin(vmax(x, lo), hi)


def loops(extents: list, body_fn) -> tuple:
    """Nest of loops over (var, extent) pairs, outermost first; body_fn(*vars) -> statements.
    A loop of extent 1 is not emitted: its variable is the constant 0."""
    vars_ = [Var(v) if n > 1 else Const(0) for v, n in extents]
    body = tuple(body_fn(*vars_))
    for (v, n) in reversed(extents):
        if n > 1:
            body = (Loop(v, n, body),)
    return body


def flat_index(idx: list, shape: list) -> Expr:
    """Row-major flat index of a multi-index (list of Expr or int) into `shape`."""
    out: Expr = Const(0)
    for i, n in zip(idx, shape):
        out = out * n + i
    return out


def walk(stmts) -> list:
    """All statements of a body, depth first (for analyses and tests)."""
    out = []
    for s in stmts:
        out.append(s)
        if isinstance(s, Loop):
            out += walk(s.body)
        elif isinstance(s, If):
            out += walk(s.then) + walk(s.orelse)
    return out


def substitute(node, values: dict):
    """Rebuild a statement/expression tree with Var(name) replaced by values[name]."""
    if isinstance(node, tuple):
        return tuple(substitute(s, values) for s in node)
    if isinstance(node, Var):
        return values.get(node.name, node)
    if isinstance(node, Bin):
        return binop(node.op, substitute(node.a, values), substitute(node.b, values))
    if isinstance(node, (Expr, Stmt)):
        changes = {f.name: substitute(getattr(node, f.name), values) for f in fields(node)
                   if isinstance(getattr(node, f.name), (Expr, Stmt, tuple))}
        return replace(node, **changes)
    return node
