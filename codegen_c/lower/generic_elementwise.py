"""Generic element-wise ops (any rank, numpy broadcasting): unary, binary, where, cast; and the
float row ops softmax (any axis), log_softmax and hardmax.

Float math calls the mfm_ functions of runtime_c/mcuforge_math.h. Integer arithmetic follows
onnxruntime: results wrap to the output type, division truncates. int32 sums, products and
quotients are computed in int64 so that C never overflows (the store wraps); int8/int16/uint8
already promote to int32 in C. int64 overflow and integer division by zero stay undefined, as
the ONNX spec leaves them.
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from .. import loop_ir as ir
from .. import mathmirror  # noqa: F401  (registers the mfm_ mirrors for the evaluator)
from . import OpContext, describe, lowers
from . import softmax as softmax_s8  # registered first: the float softmax below takes over
from .elementwise import _elementwise

F = "float32"


def fconst(v) -> ir.Const:
    return ir.Const(float(np.float32(v)), F)


def fcall(fn: str, *args) -> ir.Expr:
    return ir.call(fn, *args, dtype=F)


def _exp(x):
    return fcall("mfm_expf", x)


def _clip_float(x, lo, hi):
    """NaN-propagating clamp; lo > hi gives hi (ONNX Clip)."""
    x = x if lo is None else fcall("mfm_maxf", x, fconst(lo))
    return x if hi is None else fcall("mfm_minf", x, fconst(hi))


def _gelu(x, a):
    if a.get("approximate", "none") == "tanh":
        inner = fconst(np.sqrt(2 / np.pi)) * (x + fconst(0.044715) * x * x * x)
        return fconst(0.5) * x * (fconst(1.0) + fcall("mfm_tanhf", inner))
    return fconst(0.5) * x * (fconst(1.0) + fcall("mfm_erff", x * fconst(np.sqrt(0.5))))


def _sign(x, zero, one, minus_one):
    """1, -1 or x itself (0, -0 or NaN)."""
    return ir.select(x.gt(zero), one, ir.select(x.lt(zero), minus_one, x))


FLOAT_UNARY = {
    "abs": lambda x, a: fcall("mfm_fabsf", x),
    "neg": lambda x, a: ir.Unary("-", x, F),
    "exp": lambda x, a: _exp(x),
    "log": lambda x, a: fcall("mfm_logf", x),
    "sqrt": lambda x, a: fcall("mfm_sqrtf", x),
    "reciprocal": lambda x, a: ir.binop("/", fconst(1.0), x),
    "rsqrt": lambda x, a: ir.binop("/", fconst(1.0), fcall("mfm_sqrtf", x)),
    "floor": lambda x, a: fcall("mfm_floorf", x),
    "ceil": lambda x, a: fcall("mfm_ceilf", x),
    "round": lambda x, a: fcall("mfm_roundf", x),
    "sign": lambda x, a: _sign(x, fconst(0.0), fconst(1.0), fconst(-1.0)),
    "sin": lambda x, a: fcall("mfm_sinf", x),
    "cos": lambda x, a: fcall("mfm_cosf", x),
    "erf": lambda x, a: fcall("mfm_erff", x),
    "elu": lambda x, a: ir.select(x.gt(fconst(0.0)), x,
                                  fconst(a["alpha"]) * (_exp(x) - fconst(1.0))),
    "selu": lambda x, a: fconst(a["gamma"]) * ir.select(
        x.gt(fconst(0.0)), x, fconst(a["alpha"]) * _exp(x) - fconst(a["alpha"])),
    "celu": lambda x, a: ir.select(x.gt(fconst(0.0)), x, fconst(a["alpha"]) * (
        _exp(ir.binop("/", x, fconst(a["alpha"]))) - fconst(1.0))),
    "hard_sigmoid": lambda x, a: _clip_float(fconst(a["alpha"]) * x + fconst(a["beta"]),
                                             0.0, 1.0),
    # log(1 + e^x) without overflow: x + log1p(e^-x) for positive x
    "softplus": lambda x, a: ir.select(x.gt(fconst(0.0)),
                                       x + fcall("mfm_log1pf", _exp(ir.Unary("-", x, F))),
                                       fcall("mfm_log1pf", _exp(x))),
    "softsign": lambda x, a: ir.binop("/", x, fconst(1.0) + fcall("mfm_fabsf", x)),
    "gelu": _gelu,
    "clip": lambda x, a: _clip_float(x, a.get("min"), a.get("max")),
}


def _wide(e: ir.Expr, dtype: str) -> ir.Expr:
    """int32 operands widened to int64, where their result could overflow int32."""
    return ir.cast(e, "int64") if dtype == "int32" else e


def _int_unary(fn: str, x: ir.Expr, a: dict, dtype: str) -> ir.Expr:
    w = _wide(x, dtype)
    kind = "int64" if w.dtype == "int64" else "int32"
    if dtype == "uint8" and fn in ("abs", "sign"):  # (x < 0 would not compile: -Wtype-limits)
        return x if fn == "abs" else x.ne(0)
    if fn == "abs":
        return ir.select(x.lt(0), ir.Unary("-", w, kind), x)
    if fn == "neg":
        return ir.Unary("-", w, kind)
    if fn == "sign":
        return _sign(x, ir.Const(0, kind), ir.Const(1, kind), ir.Const(-1, kind))
    if fn == "not":
        return ir.Unary("!", x, "int32")
    if fn == "clip":
        lo, hi = a.get("min"), a.get("max")
        x = x if lo is None else ir.vmax(x, ir.Const(int(lo), kind))
        return x if hi is None else ir.vmin(x, ir.Const(int(hi), kind))
    raise NotImplementedError(f"unary {fn} on {dtype}")


@lowers("unary")
def unary(ctx: OpContext) -> ir.Kernel:
    fn, attrs, dtype = ctx.attrs["fn"], ctx.attrs, ctx.input(0).dtype
    params = ", ".join(f"{k} {v}" for k, v in attrs.items() if k != "fn")
    if dtype == F:
        return _elementwise(ctx, lambda x: FLOAT_UNARY[fn](x, attrs), f"{fn} {params}".strip())
    return _elementwise(ctx, lambda x: _int_unary(fn, x, attrs, dtype), f"{fn} {params}".strip())


COMPARE = {"equal": "==", "less": "<", "greater": ">", "less_equal": "<=",
           "greater_equal": ">="}
LOGIC = {"and": "&&", "or": "||", "xor": "!="}


def _prelu(x, slope, zero):
    return ir.select(x.lt(zero), slope * x, x)


def _float_binary(fn: str, a, b, attrs) -> ir.Expr:
    if fn in ("add", "sub", "mul", "div"):
        return ir.binop({"add": "+", "sub": "-", "mul": "*", "div": "/"}[fn], a, b)
    if fn in ("max", "min"):
        return fcall(f"mfm_{fn}f", a, b)
    if fn == "pow":
        return fcall("mfm_powf", a, ir.cast(b, F))
    if fn == "mod":
        return fcall("mfm_fmodf" if attrs.get("fmod", 0) else "mfm_floor_modf", a, b)
    if fn == "prelu":
        return _prelu(a, b, fconst(0.0))
    raise NotImplementedError(f"binary {fn} on float32")


def _int_binary(fn: str, a, b, attrs, dtype: str, out_dtype: str) -> ir.Expr:
    wa, wb = _wide(a, dtype), _wide(b, dtype)
    if fn in ("add", "sub", "mul", "div"):
        return ir.binop({"add": "+", "sub": "-", "mul": "*", "div": "/"}[fn], wa, wb)
    if fn in ("max", "min"):
        return (ir.vmax if fn == "max" else ir.vmin)(a, b)
    if fn == "mod":
        if attrs.get("fmod", 0):
            return ir.binop("%", wa, wb)
        return ir.call("mfm_mod_i64" if dtype == "int64" else "mfm_mod_i32", a, b,
                       dtype="int64" if dtype == "int64" else "int32")
    if fn == "pow":
        if b.dtype == F:  # integer base, float exponent: computed in float, truncated
            return ir.cast(fcall("mfm_powf", ir.cast(a, F), b),
                           "int64" if out_dtype == "int64" else "int32")
        return ir.call("mfm_ipow_i64", ir.cast(a, "int64"), ir.cast(b, "int64"), dtype="int64")
    if fn == "prelu":
        return _prelu(wa, wb, 0)
    raise NotImplementedError(f"binary {fn} on {dtype}")


def _square(ctx: OpContext) -> ir.Kernel:
    """x ** 2 as x * x (what exporters make of x.pow(2)): exact like powf, and far cheaper."""
    k = _elementwise(ctx, lambda a, b: a * a, "pow 2: x * x")
    return replace(k, buffers=tuple(b for b in k.buffers if b.name != "c1"))  # the exponent


@lowers("binary")
def binary(ctx: OpContext) -> ir.Kernel:
    fn, attrs = ctx.attrs["fn"], ctx.attrs
    dtype, out_dtype = ctx.input(0).dtype, ctx.output().dtype
    e = ctx.input(1)
    if fn == "pow" and dtype == F and e.is_const and np.all(e.data == 2):
        return _square(ctx)
    if fn in COMPARE:
        return _elementwise(ctx, lambda a, b: ir.binop(COMPARE[fn], a, b), fn)
    if fn in LOGIC:
        return _elementwise(ctx, lambda a, b: ir.binop(LOGIC[fn], a, b), fn)
    extra = f"{fn}" + (f" fmod {attrs['fmod']}" if "fmod" in attrs else "")
    if dtype == F:
        return _elementwise(ctx, lambda a, b: _float_binary(fn, a, b, attrs), extra)
    return _elementwise(ctx, lambda a, b: _int_binary(fn, a, b, attrs, dtype, out_dtype), extra)


@lowers("where")
def where(ctx: OpContext) -> ir.Kernel:
    return _elementwise(ctx, lambda c, a, b: ir.select(c, a, b))


def _cast_value(p: ir.Expr, src: str, dst: str) -> ir.Expr:
    if dst == "bool":
        return p.ne(fconst(0.0) if src == F else 0)
    if src == F and dst != F:
        # truncation toward zero; narrow types wrap from int32 as onnxruntime's static_cast
        wide = ir.Cast(p, "int64" if dst == "int64" else "int32")
        return ir.cast(wide, dst)
    return ir.cast(p, dst)


@lowers("cast")
def cast(ctx: OpContext) -> ir.Kernel:
    src, dst = ctx.input(0).dtype, ctx.output().dtype
    return _elementwise(ctx, lambda p: _cast_value(p, src, dst), f"{src} -> {dst}")


# ---- row ops: along one axis, the others are independent rows ----

def _rows(ctx: OpContext, row_fn, extra: str = "") -> ir.Kernel:
    """Loops over every position but `axis`; row_fn(at, n) gives the statements of one row,
    at(k) being the flat index of its k-th element."""
    x, y = ctx.input(0), ctx.output()
    if x.dtype != F or y.dtype != F:
        raise NotImplementedError(f"{ctx.node.op} {x.dtype} -> {y.dtype}")
    shape = tuple(x.shape)
    axis = ctx.attrs.get("axis", len(shape) - 1)
    outer, n, inner = (int(np.prod(shape[:axis])), shape[axis],
                       int(np.prod(shape[axis + 1:])))

    def body(o, i):
        return row_fn(lambda k: o * (n * inner) + k * inner + i, n)

    loop = ir.loops([("o", outer), ("i", inner)], body)
    extra = f"axis {axis}: {outer * inner} rows of {n}" + (f", {extra}" if extra else "")
    return ir.Kernel(ctx.name, tuple(ctx.io_buffers()), loop, describe(ctx, extra))


def _row_max(at, n) -> list:
    """float m = the row's maximum."""
    m = ir.Var("m", F)
    out = [ir.Decl("m", F, ir.Load("x", at(0), F))]
    if n > 1:
        x = ir.Load("x", at(ir.Var("k")), F)
        out.append(ir.Loop("k", n - 1, (ir.Assign("m", ir.vmax(m, x)),), start=1))
    return out


def _each(n, fn) -> tuple:
    return ir.loops([("k", n)], fn)


@lowers("softmax")
def softmax(ctx: OpContext) -> ir.Kernel:
    """Float: exp((x - max) * beta) / sum, along any axis; int8 stays TFLM's row kernel."""
    if ctx.input(0).dtype != F:
        axis = ctx.attrs.get("axis", len(ctx.input(0).shape) - 1)
        if axis != len(ctx.input(0).shape) - 1:
            raise NotImplementedError(f"int8 softmax along axis {axis} (not the last)")
        return softmax_s8.softmax(ctx)
    beta = fconst(ctx.attrs["beta"])
    m, s, e = ir.Var("m", F), ir.Var("s", F), ir.Var("e", F)

    def row(at, n):
        return [*_row_max(at, n), ir.Decl("s", F, fconst(0.0)),
                *_each(n, lambda k: [
                    ir.Decl("e", F, _exp((ir.Load("x", at(k), F) - m) * beta)),
                    ir.Store("y", at(k), e), ir.Assign("s", s + e)]),
                *_each(n, lambda k: [
                    ir.Store("y", at(k), ir.binop("/", ir.Load("y", at(k), F), s))])]
    return _rows(ctx, row, f"beta {ctx.attrs['beta']}")


@lowers("log_softmax")
def log_softmax(ctx: OpContext) -> ir.Kernel:
    """(x - max) - log(sum(exp(x - max)))."""
    m, s = ir.Var("m", F), ir.Var("s", F)

    def row(at, n):
        return [*_row_max(at, n), ir.Decl("s", F, fconst(0.0)),
                *_each(n, lambda k: [ir.Assign("s", s + _exp(ir.Load("x", at(k), F) - m))]),
                ir.Decl("l", F, fcall("mfm_logf", s)),
                *_each(n, lambda k: [ir.Store("y", at(k),
                                              ir.Load("x", at(k), F) - m - ir.Var("l", F))])]
    return _rows(ctx, row)


@lowers("hardmax")
def hardmax(ctx: OpContext) -> ir.Kernel:
    """1 at the first maximum of the row, 0 elsewhere."""
    m, j = ir.Var("m", F), ir.Var("j")

    def row(at, n):
        out = [ir.Decl("m", F, ir.Load("x", at(0), F)), ir.Decl("j", "int32", ir.Const(0))]
        if n > 1:
            k = ir.Var("k")
            x = ir.Load("x", at(k), F)
            out.append(ir.Loop("k", n - 1, (ir.If(x.gt(m), (ir.Assign("m", x),
                                                               ir.Assign("j", k))),), start=1))
        return out + list(_each(n, lambda k: [
            ir.Store("y", at(k), ir.select(ir.binop("==", k, j), fconst(1.0), fconst(0.0)))]))
    return _rows(ctx, row)
