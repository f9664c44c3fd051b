"""Lowerings: TFLite's binary family (SUB, DIV, comparisons, MAXIMUM / MINIMUM, FLOOR_DIV,
FLOOR_MOD, SQUARED_DIFFERENCE, ADD_N; float and int32 ADD / MUL), bit-exact with TFLM's
reference kernels.

"sub", "div" and "add_n" are lowered here for every type; "binary" nodes only when the TFLite
frontend marked them "tflm" (frontend/tflite_ops_binary.py); "add" / "mul" for int32, and for
float32 when marked "tflm" (frontend/tflite_ops.py); int8 ADD / MUL stay in elementwise.py.
Quantized operands go through TFLM's integer pipelines: each input rescaled by
mf_rescale_q (offset, left shift, multiplier) onto a common scale, combined in int32, then
requantized to the output with the parameters TFLM's Prepare computes (computed here, in the
precision TFLM uses: double for SUB, ADD_N and SQUARED_DIFFERENCE, a float32 ratio for DIV).
Fused activations clamp as TFLM's ActivationFunctionWithMinMax: min(max(v, lo), hi) with
std::max / std::min, so NaN passes through and a float "none" still clamps to +-FLT_MAX.
Registered with `@lowers` (see codegen_c/lower/__init__.py).
"""
from __future__ import annotations

import numpy as np

from .. import loop_ir as ir
from .. import qmath
from .. import qparams as qp
from . import OpContext, describe, lowers
from .elementwise import broadcast_index, operand_names

F = "float32"
FLT_MAX = float(np.finfo(np.float32).max)
QMIN = {"int8": -128, "int16": -32768}
QMAX = {"int8": 127, "int16": 32767}
COMPARE = {"equal": "==", "not_equal": "!=", "greater": ">", "greater_equal": ">=",
           "less": "<", "less_equal": "<="}


# ---- the loop nest ---------------------------------------------------------------------------

def _kernel(ctx: OpContext, body, extra: str = "") -> ir.Kernel:
    """y[i] = body(operand values...) over the output, operands broadcast to it (numpy rules).
    body returns the value, or (statements, value) when it needs locals."""
    y = ctx.output()
    names, consts = operand_names(ctx)
    ins = [(nm, ctx.input(i)) for i, nm in enumerate(names) if nm is not None]
    shape = tuple(y.shape)

    def store(index, loads):
        out = body(*loads)
        stmts, value = out if isinstance(out, tuple) else ((), out)
        return [*stmts, ir.Store("y", index, value)]

    if all(t.size in (y.size, 1) for _, t in ins):  # no broadcasting but of scalars: flat
        extents = [("i", y.size)]

        def loop_body(i):
            return store(i, [ir.Load(nm, i if t.size == y.size else ir.Const(0), t.dtype)
                             for nm, t in ins])
    else:
        extents = [(f"i{d}", n) for d, n in enumerate(shape)]

        def loop_body(*idx):
            return store(ir.flat_index(list(idx), shape),
                         [ir.Load(nm, broadcast_index(t.shape, shape, list(idx)), t.dtype)
                          for nm, t in ins])
    return ir.Kernel(ctx.name, tuple(ctx.io_buffers() + consts), ir.loops(extents, loop_body),
                     describe(ctx, extra))


def _c(v) -> ir.Const:
    return ir.Const(int(v))


def _f(v) -> ir.Const:
    return ir.Const(float(np.float32(v)), F)


def _q(t):
    return float(np.float32(t.quant.scale[0])), int(t.quant.zero_point[0])


# ---- activations -----------------------------------------------------------------------------

FLOAT_RANGE = {"none": (-FLT_MAX, FLT_MAX), "relu": (0.0, FLT_MAX), "relu6": (0.0, 6.0),
               "relu_n1_to_1": (-1.0, 1.0)}
INT32_RANGE = {"none": (None, None), "relu": (0, None), "relu6": (0, 6),
               "relu_n1_to_1": (-1, 1)}  # CalculateActivationRange<int32_t>


def _float_clamped(value: ir.Expr, act: str):
    """(statements, value): v = value; ActivationFunctionWithMinMax(v, lo, hi) as TFLM spells
    it, v < lo ? lo : v then hi < v ? hi : v (NaN passes, -0 stays -0)."""
    lo, hi = (_f(b) for b in FLOAT_RANGE[act])
    v = ir.Var("v", F)
    return ([ir.Decl("v", F, value), ir.Assign("v", ir.select(v.lt(lo), lo, v))],
            ir.select(hi.lt(v), hi, v))


def _range_text(act: str) -> str:
    return "[%s, %s]" % tuple({FLT_MAX: "FLT_MAX", -FLT_MAX: "-FLT_MAX"}.get(b, f"{b:g}")
                               for b in FLOAT_RANGE[act])


def _int32_clamped(value: ir.Expr, act: str) -> ir.Expr:
    lo, hi = INT32_RANGE[act]
    value = value if lo is None else ir.vmax(value, _c(lo))
    return value if hi is None else ir.vmin(value, _c(hi))


def _quantized_range(act: str, scale: float, zero_point: int, dtype: str) -> tuple:
    """CalculateActivationRangeQuantized (kernel_util.cc) for an int8/int16 output."""
    if dtype == "int8":
        return qp.activation_range_int8(act, scale, zero_point)
    lo, hi = QMIN[dtype], QMAX[dtype]

    def quantize(f):  # zero_point + TfLiteRound(f / scale), in float32
        return zero_point + qmath.round_half_away(np.float32(f) / np.float32(scale))
    bounds = {"none": (None, None), "relu": (0.0, None), "relu6": (0.0, 6.0),
              "relu_n1_to_1": (-1.0, 1.0)}[act]
    return (lo if bounds[0] is None else max(lo, quantize(bounds[0])),
            hi if bounds[1] is None else min(hi, quantize(bounds[1])))


def _requantized(value: ir.Expr, mult: int, shift: int, zero_point: int, lo: int, hi: int,
                 fn: str = "mf_mbqm_lt1") -> ir.Expr:
    """clamp(MultiplyByQuantizedMultiplier...(value) + output zero point, lo, hi)."""
    return ir.clamp(ir.call(fn, value, _c(mult), _c(shift)) + _c(zero_point), _c(lo), _c(hi))


def _rescale(x: ir.Expr, zero_point: int, left_shift: int, mult: int, shift: int) -> ir.Expr:
    return ir.call("mf_rescale_q", x, _c(-zero_point), _c(left_shift), _c(mult), _c(shift))


def _smaller_than_one(real: float, what: str) -> tuple:
    try:
        return qp.quantize_multiplier_smaller_than_one_exp(real)
    except ValueError:
        raise NotImplementedError(f"{what} multiplier {real} is not in (0, 1) (TFLM aborts)")


# ---- SUB -------------------------------------------------------------------------------------

def sub_params(s1: float, s2: float, so: float, left_shift: int) -> dict:
    """CalculateOpDataSub (micro/kernels/sub_common.cc): both inputs rescaled to twice the
    larger input scale, the difference back to the output scale, every ratio in double as
    ADD's. (The mirrored TFLM source forms SUB's ratios in float32; the reference interpreter,
    tflite-micro 0.dev20261023, matches the double ratios on every int8 input pair and not the
    float32 ones.)"""
    s1, s2, so = float(np.float32(s1)), float(np.float32(s2)), float(np.float32(so))
    twice_max = 2.0 * max(s1, s2)
    m1, sh1 = _smaller_than_one(s1 / twice_max, "SUB input 1")
    m2, sh2 = _smaller_than_one(s2 / twice_max, "SUB input 2")
    mo, sho = _smaller_than_one(twice_max / ((1 << left_shift) * so), "SUB output")
    return dict(m1=m1, sh1=sh1, m2=m2, sh2=sh2, mo=mo, sho=sho)


@lowers("sub")
def sub(ctx: OpContext) -> ir.Kernel:
    a, b, y = ctx.input(0), ctx.input(1), ctx.output()
    act = ctx.attrs["activation"]
    if y.dtype == F:
        return _kernel(ctx, lambda p, q: _float_clamped(p - q, act),
                       f"a - b, activation {act}: clamped to {_range_text(act)} as TFLM")
    if y.dtype == "int32":
        return _kernel(ctx, lambda p, q: _int32_clamped(ir.call("mf_wrap_sub_i32", p, q), act),
                       f"a - b (wrapping), activation {act}")
    (s1, z1), (s2, z2), (so, zo) = _q(a), _q(b), _q(y)
    left_shift = 20 if y.dtype == "int8" else 15
    p = sub_params(s1, s2, so, left_shift)
    lo, hi = _quantized_range(act, so, zo, y.dtype)
    r1, r2 = ir.Var("r1"), ir.Var("r2")

    def body(x1, x2):
        return ([ir.Decl("r1", "int32", _rescale(x1, z1, left_shift, p["m1"], p["sh1"])),
                 ir.Decl("r2", "int32", _rescale(x2, z2, left_shift, p["m2"], p["sh2"]))],
                _requantized(r1 - r2, p["mo"], p["sho"], zo, lo, hi))
    return _kernel(ctx, body, f"TFLM quantized SUB: inputs << {left_shift} rescaled to a common "
                              f"scale, difference requantized; activation {act} = [{lo}, {hi}]")


# ---- DIV -------------------------------------------------------------------------------------

@lowers("div")
def div(ctx: OpContext) -> ir.Kernel:
    a, b, y = ctx.input(0), ctx.input(1), ctx.output()
    act = ctx.attrs["activation"]
    if y.dtype == F:
        return _kernel(ctx, lambda p, q: _float_clamped(ir.binop("/", p, q), act),
                       f"a / b, activation {act}: clamped to {_range_text(act)} as TFLM")
    if y.dtype == "int32":  # C division truncates, as TFLM's; b = 0 is undefined there too
        return _kernel(ctx, lambda p, q: _int32_clamped(ir.binop("/", p, q), act),
                       f"a / b (truncating), activation {act}")
    (s1, z1), (s2, z2), (so, zo) = _q(a), _q(b), _q(y)
    # CalculateOpDataDiv: QuantizeMultiplier(double(s1 / (s2 * s_out))), a float32 ratio
    mult, shift = qp.quantize_multiplier(
        float(np.float32(s1) / (np.float32(s2) * np.float32(so))))
    if not -24 <= shift <= 23:
        raise NotImplementedError(f"int8 DIV output shift {shift} outside [-24, 23]")
    lo, hi = _quantized_range(act, so, zo, "int8")
    args = [_c(v) for v in (-z1, -z2, mult, shift, zo, lo, hi)]
    return _kernel(ctx, lambda p, q: ir.call("mf_div_q", p, q, *args),
                   f"TFLM int8 DIV (reciprocal of the divisor); activation {act} = [{lo}, {hi}]")


# ---- "binary" nodes from TFLite --------------------------------------------------------------

def _comparison(ctx: OpContext, fn: str) -> ir.Kernel:
    a, b = ctx.input(0), ctx.input(1)
    op = COMPARE[fn]
    if a.quant is None:
        return _kernel(ctx, lambda p, q: ir.binop(op, p, q), f"a {op} b")
    # ComparisonsPrepare: each operand << 8, times QuantizeMultiplierSmallerThanOneExp(scale)
    (s1, z1), (s2, z2) = _q(a), _q(b)
    (m1, sh1), (m2, sh2) = (_smaller_than_one(s, "comparison input") for s in (s1, s2))
    return _kernel(ctx, lambda p, q: ir.binop(op, _rescale(p, z1, 8, m1, sh1),
                                              _rescale(q, z2, 8, m2, sh2)),
                   f"a {op} b on the int8 operands rescaled by their scales, as TFLM")


def _floor_mod(p: ir.Expr, q: ir.Expr):
    """FloorMod<float>: r = fmodf(a, b), plus b when r is non-zero and their signs differ
    (r = -0 stays, unlike numpy's floored modulo)."""
    r = ir.Var("r", F)
    zero = _f(0.0)
    # (b < 0) != (r < 0), spelt with ^ so that the printer parenthesises both comparisons
    fix = ir.binop("&&", r.ne(zero), ir.binop("^", q.lt(zero), r.lt(zero)))
    return [ir.Decl("r", F, ir.call("mfm_fmodf", p, q, dtype=F))], ir.select(fix, r + q, r)


def _squared_difference(ctx: OpContext) -> ir.Kernel:
    a, b, y = ctx.input(0), ctx.input(1), ctx.output()
    d = ir.Var("d", "int32" if y.dtype != F else F)
    if y.dtype == F:
        return _kernel(ctx, lambda p, q: ([ir.Decl("d", F, p - q)], d * d), "(a - b) * (a - b)")
    if y.dtype == "int32":
        return _kernel(ctx, lambda p, q: ([ir.Decl("d", "int32", ir.call("mf_wrap_sub_i32", p, q))],
                                          ir.call("mf_wrap_mul_i32", d, d)),
                       "(a - b) * (a - b), wrapping")
    # SquaredDifferencePrepare's PrepareQuantized, in double: inputs rescaled to 2 * max scale
    # after << left_shift, the square back to the output scale
    (s1, z1), (s2, z2), (so, zo) = _q(a), _q(b), _q(y)
    left_shift = 7 if y.dtype == "int8" else 0
    twice_max = 2.0 * max(s1, s2)
    m1, sh1 = _smaller_than_one(s1 / twice_max, "SQUARED_DIFFERENCE input 1")
    m2, sh2 = _smaller_than_one(s2 / twice_max, "SQUARED_DIFFERENCE input 2")
    mo, sho = qp.quantize_multiplier(
        twice_max * twice_max / float(np.float32(1 << (2 * left_shift)) * np.float32(so)))
    lo, hi = QMIN[y.dtype], QMAX[y.dtype]

    def body(p, q):
        return ([ir.Decl("d", "int32", _rescale(p, z1, left_shift, m1, sh1)
                         - _rescale(q, z2, left_shift, m2, sh2))],
                _requantized(d * d, mo, sho, zo, lo, hi, fn="mf_mbqm"))
    return _kernel(ctx, body, f"TFLM quantized SQUARED_DIFFERENCE: inputs << {left_shift} "
                              "rescaled to a common scale, the squared difference requantized")


@lowers("binary", when=lambda ctx: ctx.attrs.get("tflm", False) and ctx.attrs["fn"] in (
    *COMPARE, "and", "or", "max", "min", "mod", "floor_div", "squared_difference"))
def tflm_binary(ctx: OpContext) -> ir.Kernel:
    fn = ctx.attrs["fn"]
    if fn in COMPARE:
        return _comparison(ctx, fn)
    if fn in ("and", "or"):
        op = "&&" if fn == "and" else "||"
        return _kernel(ctx, lambda p, q: ir.binop(op, p, q), f"a {op} b")
    if fn in ("max", "min"):  # MaximumOp / MinimumOp: el1 > el2 ? el1 : el2 on raw values
        op = ">" if fn == "max" else "<"
        return _kernel(ctx, lambda p, q: ir.select(ir.binop(op, p, q), p, q),
                       f"a {op} b ? a : b (raw values, as TFLM)")
    if fn == "mod":
        return _kernel(ctx, _floor_mod, "TFLM FloorMod: fmodf, sign fixed to the divisor's")
    if fn == "floor_div":
        return _kernel(ctx, lambda p, q: ir.call("mf_floor_div_f32", p, q, dtype=F),
                       "TFLM FloorDiv: floor of the double quotient")
    return _squared_difference(ctx)


# ---- float and int32 ADD / MUL, ADD_N ---------------------------------------------------------

@lowers("add", "mul", when=lambda ctx: ctx.output().dtype == F and ctx.attrs.get("tflm", False))
def add_mul_float(ctx: OpContext) -> ir.Kernel:
    """TFLite's float ADD / MUL: the fused activation as TFLM clamps it (+-FLT_MAX for
    "none", where the generic lowering lets an infinity through)."""
    act = ctx.attrs["activation"]
    op = "+" if ctx.node.op == "add" else "*"
    return _kernel(ctx, lambda p, q: _float_clamped(ir.binop(op, p, q), act),
                   f"a {op} b, activation {act}: clamped to {_range_text(act)} as TFLM")


@lowers("add", "mul", when=lambda ctx: ctx.output().dtype == "int32")
def add_mul_int32(ctx: OpContext) -> ir.Kernel:
    """TFLM's int32 ADD clamps to the int32 range whatever the fused activation; MUL applies
    CalculateActivationRange<int32_t>. Both wrap on overflow."""
    if ctx.node.op == "add":
        return _kernel(ctx, lambda p, q: ir.call("mf_wrap_add_i32", p, q),
                       "a + b (wrapping; TFLM ignores an int32 ADD's fused activation)")
    act = ctx.attrs["activation"]
    return _kernel(ctx, lambda p, q: _int32_clamped(ir.call("mf_wrap_mul_i32", p, q), act),
                   f"a * b (wrapping), activation {act}")


@lowers("add_n")
def add_n(ctx: OpContext) -> ir.Kernel:
    y = ctx.output()
    n = len(ctx.node.inputs)
    if y.dtype == F:  # AddN<float>: T x = 0; x += input_j[i], in input order
        s = ir.Var("s", F)

        def body(*loads):
            return ([ir.Decl("s", F, _f(0.0)), *[ir.Assign("s", s + v) for v in loads]], s)
        return _kernel(ctx, body, f"sum of {n} inputs from 0.0f, in input order")
    # int8 AddN: every input rescaled (<< 20, times 1/2) and summed in int32, starting from
    # the rescaled input offset (TFLM starts from `x = input1_offset`, the value of a raw 0,
    # not from 0), then requantized to the output
    s_in, z_in = _q(ctx.input(0))
    so, zo = _q(y)
    m_in, sh_in = _smaller_than_one(s_in / (2.0 * s_in), "ADD_N input")
    mo, sho = _smaller_than_one(2.0 * s_in / ((1 << 20) * so), "ADD_N output")
    start = qmath.mf_rescale_q(0, -z_in, 20, m_in, sh_in)
    acc = ir.Var("acc")

    def body_q(*loads):
        return ([ir.Decl("acc", "int32", _c(start)),
                 *[ir.Assign("acc", ir.call("mf_wrap_add_i32", acc,
                                            _rescale(v, z_in, 20, m_in, sh_in)))
                   for v in loads]],
                _requantized(acc, mo, sho, zo, -128, 127))
    return _kernel(ctx, body_q, f"TFLM int8 ADD_N of {n} inputs: rescaled sum from {start} "
                                "(the rescaled input offset), requantized")
