"""Conformance cases: binary elementwise, comparison and logical operators (ADD, MUL, SUB, DIV,
EQUAL, NOT_EQUAL, GREATER, GREATER_EQUAL, LESS, LESS_EQUAL, LOGICAL_AND, LOGICAL_OR, MAXIMUM,
MINIMUM, FLOOR_DIV, FLOOR_MOD, SQUARED_DIFFERENCE, SELECT_V2, ADD_N).

One case per element type TFLM's kernel accepts, plus broadcasting (scalars, inner and outer
axes, rank 5), constant operands and fused activations. Quantization is what a converter
would write: int8 asymmetric with the output scale covering the result's range, int16 with
zero point 0. (int16 ADD / MUL are another family's.)"""
from __future__ import annotations

import numpy as np

from . import cases, integers, q, single, tensor, uniform

F, I32 = "float32", "int32"
ACTS = ("RELU", "RELU6", "RELU_N1_TO_1")
# (a, b) -> output shapes broadcasting exercises: an inner axis, a scalar, outer axes, rank 5
BROADCASTS = {
    "broadcast": ((2, 3, 4), (3, 1), (2, 3, 4)),
    "broadcast_scalar": ((1,), (2, 5), (2, 5)),
    "broadcast_both": ((2, 1, 4), (1, 3, 1), (2, 3, 4)),
    "broadcast_rank5": ((2, 1, 3, 1, 2), (2, 1, 4, 1), (2, 2, 3, 4, 2)),
}
SHAPE = (2, 3, 5)


def _t(name, shape, dtype, quant=None, data=None):
    return tensor(name, shape, dtype, quant, data)


def _two(op, variant, dtype, shapes=(SHAPE, SHAPE, SHAPE), quants=(None, None, None),
         options=None, gens=None, out_dtype=None, const_b=None):
    """A model of one two-input operator; const_b makes the second input a constant."""
    (sa, sb, sy), (qa, qb, qy) = shapes, quants
    b = _t("b", sb, dtype, qb, const_b)
    return single(op, variant, [_t("a", sa, dtype, qa), b],
                  [_t("y", sy, out_dtype or dtype, qy)], options, gens)


def _act(name):
    return {"fused_activation_function": name}


def _nonzero(lo, hi):
    """Integers in [lo, hi] except 0 (divisors)."""
    def gen(rng, shape):
        v = rng.integers(lo, hi + 1, shape)
        return np.where(v == 0, 1, v)
    return gen


EXTREMES = np.array([0.0, -0.0, 1.5, -2.5, 3e38, -3e38, 1e20, -1e20, 1e-40, np.inf, -np.inf,
                     np.nan], np.float32)


def _extreme(rng, shape):
    """Floats that overflow, signed zeros, a denormal, infinities and NaN, among ordinary
    ones: what TFLM's clamps and C ternaries decide."""
    return np.where(rng.random(shape) < 0.7, rng.choice(EXTREMES, shape),
                    rng.uniform(-4, 4, shape))


def _extreme_nonzero(rng, shape):
    v = _extreme(rng, shape)
    return np.where(v == 0, 0.5, v)


def _float_divisor(rng, shape):
    """Floats of magnitude [0.25, 4), either sign: TFLM's FLOOR_DIV refuses 0."""
    return rng.uniform(0.25, 4, shape) * rng.choice([-1, 1], shape)


def _except(value, dtype_range=(-128, 127)):
    """Quantized divisors: anything but the zero point (TFLM requires a non-zero real)."""
    def gen(rng, shape):
        v = rng.integers(dtype_range[0], dtype_range[1] + 1, shape)
        return np.where(v == value, value + 1, v)
    return gen


# ---- ADD, MUL (float32, int32, int8 broadcasting; int8 same-shape is covered elsewhere) -------

def _add_mul(op):
    qa, qb, qy = (q(0.05, 3), q(0.04, -6), q(0.09, 1)) if op == "ADD" else \
        (q(0.05, 3), q(0.04, -6), q(0.6, -2))
    out = [_two(op, "float32", F), _two(op, "int32", I32),
           _two(op, "int32_relu", I32, options=_act("RELU"),
                gens={"a": integers(-100, 100), "b": integers(-100, 100)}),
           _two(op, "float32_const", F, const_b=np.linspace(-2, 2, 30).reshape(SHAPE)),
           _two(op, "int8_relu", "int8", quants=(qa, qb, qy), options=_act("RELU"))]
    out += [_two(op, f"float32_{a.lower()}", F, options=_act(a)) for a in ACTS]
    out += [_two(op, "float32_extremes", F, gens={"a": _extreme, "b": _extreme}),
            _two(op, "float32_relu_extremes", F, options=_act("RELU"),
                 gens={"a": _extreme, "b": _extreme})]
    for name, shapes in BROADCASTS.items():
        out.append(_two(op, f"float32_{name}", F, shapes))
        out.append(_two(op, f"int32_{name}", I32, shapes))
    for name in ("broadcast", "broadcast_scalar", "broadcast_rank5"):
        out.append(_two(op, f"int8_{name}", "int8", BROADCASTS[name], (qa, qb, qy)))
    return out


@cases("ADD")
def add_cases():
    return _add_mul("ADD")


@cases("MUL")
def mul_cases():
    out = _add_mul("MUL")
    out.append(_two("MUL", "int32_relu6", I32, options=_act("RELU6"),
                    gens={"a": integers(-4, 4), "b": integers(-4, 4)}))
    return out


# ---- SUB, DIV ----------------------------------------------------------------------------------

@cases("SUB")
def sub_cases():
    q8 = (q(0.05, 3), q(0.04, -6), q(0.09, 1))
    q16 = (q(0.0004), q(0.0003), q(0.0007))
    out = [_two("SUB", "float32", F), _two("SUB", "int32", I32), _two("SUB", "int8", "int8",
                                                                      quants=q8),
           _two("SUB", "int16", "int16", quants=q16),
           _two("SUB", "float32_const", F, const_b=np.linspace(-2, 2, 30).reshape(SHAPE)),
           _two("SUB", "int8_const", "int8", quants=q8,
                const_b=np.arange(-60, 90, 5).reshape(SHAPE)),
           _two("SUB", "int8_same_scale", "int8", quants=(q(0.05, 3), q(0.05, 3), q(0.1, 0))),
           _two("SUB", "float32_extremes", F, gens={"a": _extreme, "b": _extreme}),
           _two("SUB", "float32_relu6_extremes", F, options=_act("RELU6"),
                gens={"a": _extreme, "b": _extreme})]
    for a in ACTS:
        out.append(_two("SUB", f"float32_{a.lower()}", F, options=_act(a)))
        out.append(_two("SUB", f"int32_{a.lower()}", I32, options=_act(a),
                        gens={"a": integers(-3, 3), "b": integers(-3, 3)}))
        out.append(_two("SUB", f"int8_{a.lower()}", "int8", quants=(q8[0], q8[1], q(0.02, -5)),
                        options=_act(a)))
        out.append(_two("SUB", f"int16_{a.lower()}", "int16", quants=q16, options=_act(a)))
    for name, shapes in BROADCASTS.items():
        out.append(_two("SUB", f"float32_{name}", F, shapes))
        out.append(_two("SUB", f"int32_{name}", I32, shapes))
        out.append(_two("SUB", f"int8_{name}", "int8", shapes, q8))
        out.append(_two("SUB", f"int16_{name}", "int16", shapes, q16))
    return out


@cases("DIV")
def div_cases():
    q8 = (q(0.05, 3), q(0.04, -6), q(0.08, 1))
    i32 = {"a": integers(-100, 100), "b": _nonzero(-12, 12)}
    i8 = {"b": _except(-6)}
    out = [_two("DIV", "float32", F), _two("DIV", "int32", I32, gens=i32),
           _two("DIV", "int8", "int8", quants=q8, gens=i8),
           _two("DIV", "int8_small_output_scale", "int8",
                quants=(q(0.1, -20), q(0.02, 10), q(0.01, 0)), gens={"b": _except(10)}),
           _two("DIV", "float32_const", F, const_b=np.linspace(0.5, 3, 30).reshape(SHAPE)),
           _two("DIV", "int8_const", "int8", quants=q8,
                const_b=np.arange(-70, 80, 5).reshape(SHAPE)),
           _two("DIV", "float32_extremes", F, gens={"a": _extreme, "b": _extreme}),
           _two("DIV", "float32_relu_extremes", F, options=_act("RELU"),
                gens={"a": _extreme, "b": _extreme})]
    for a in ACTS:
        out.append(_two("DIV", f"float32_{a.lower()}", F, options=_act(a)))
        out.append(_two("DIV", f"int32_{a.lower()}", I32, options=_act(a),
                        gens={"a": integers(-12, 12), "b": _nonzero(-4, 4)}))
        out.append(_two("DIV", f"int8_{a.lower()}", "int8", quants=(q8[0], q8[1], q(0.02, -5)),
                        options=_act(a), gens=i8))
    for name, shapes in BROADCASTS.items():
        out.append(_two("DIV", f"float32_{name}", F, shapes))
        out.append(_two("DIV", f"int32_{name}", I32, shapes, gens=i32))
        out.append(_two("DIV", f"int8_{name}", "int8", shapes, q8, gens=i8))
    return out


# ---- comparisons, logical ----------------------------------------------------------------------

COMPARISONS = ("EQUAL", "NOT_EQUAL", "GREATER", "GREATER_EQUAL", "LESS", "LESS_EQUAL")


def _comparison(op):
    """Operands drawn from few values, so that equal pairs occur; int8 operands of different
    scales (0.1 vs 0.05: raw b = 2 * raw a compares equal)."""
    small_f = {"a": lambda rng, s: rng.integers(-3, 4, s) / 2,
               "b": lambda rng, s: rng.integers(-3, 4, s) / 2}
    small_i = {"a": integers(-3, 3), "b": integers(-3, 3)}
    q8 = (q(0.1, 2), q(0.05, -2), None)
    small_8 = {"a": integers(-4, 6), "b": integers(-8, 8)}

    def c(variant, dtype, shapes=(SHAPE, SHAPE, SHAPE), quants=(None, None, None), gens=None):
        return _two(op, variant, dtype, shapes, quants, gens=gens, out_dtype="bool")
    out = [c("float32", F, gens=small_f), c("int32", I32, gens=small_i),
           c("int64", "int64", gens=small_i), c("int8", "int8", quants=q8, gens=small_8),
           c("int8_full_range", "int8", quants=(q(0.02, -10), q(0.03, 5), None)),
           _two(op, "float32_const", F, out_dtype="bool", gens=small_f,
                const_b=np.tile([-1.5, -0.5, 0.0, 0.5, 1.5], 6).reshape(SHAPE)),
           c("float32_broadcast", F, BROADCASTS["broadcast"], gens=small_f),
           c("int32_broadcast_scalar", I32, BROADCASTS["broadcast_scalar"], gens=small_i),
           c("int8_broadcast_both", "int8", BROADCASTS["broadcast_both"], q8, gens=small_8),
           c("float32_extremes", F, gens={"a": _extreme, "b": _extreme})]
    if op in ("EQUAL", "NOT_EQUAL"):
        out.append(c("bool", "bool"))
        out.append(c("bool_broadcast", "bool", BROADCASTS["broadcast_both"]))
    return out


for _op in COMPARISONS:
    cases(_op)(lambda _op=_op: _comparison(_op))


@cases("LOGICAL_AND", "LOGICAL_OR")
def logical_cases():
    out = []
    for op in ("LOGICAL_AND", "LOGICAL_OR"):
        out.append(_two(op, "bool", "bool"))
        out.append(_two(op, "bool_broadcast", "bool", BROADCASTS["broadcast_both"]))
        out.append(_two(op, "bool_broadcast_scalar", "bool", BROADCASTS["broadcast_scalar"]))
    return out


# ---- MAXIMUM, MINIMUM ------------------------------------------------------------------------

@cases("MAXIMUM", "MINIMUM")
def maximum_minimum_cases():
    """TFLM compares raw values: the quantized inputs and output share one quantization."""
    out = []
    for op in ("MAXIMUM", "MINIMUM"):
        q8, q16 = (q(0.05, -3),) * 3, (q(0.001),) * 3
        out += [_two(op, "float32", F), _two(op, "int32", I32), _two(op, "int64", "int64"),
                _two(op, "int8", "int8", quants=q8), _two(op, "int16", "int16", quants=q16),
                _two(op, "float32_const", F, const_b=np.linspace(-2, 2, 30).reshape(SHAPE)),
                _two(op, "float32_signed_zeros", F,
                     gens={"a": lambda rng, s: rng.choice([0.0, -0.0, 1.0], s),
                           "b": lambda rng, s: rng.choice([0.0, -0.0, -1.0], s)}),
                _two(op, "float32_extremes", F, gens={"a": _extreme, "b": _extreme})]
        for name in ("broadcast", "broadcast_scalar", "broadcast_rank5"):
            out.append(_two(op, f"float32_{name}", F, BROADCASTS[name]))
            out.append(_two(op, f"int8_{name}", "int8", BROADCASTS[name], q8))
    return out


# ---- FLOOR_DIV, FLOOR_MOD (float32 only in TFLM) ----------------------------------------------

@cases("FLOOR_DIV", "FLOOR_MOD")
def floor_cases():
    """Random operands, and whole numbers over divisors like 1/3 whose float quotients land
    next to integers (FLOOR_DIV floors the double quotient) or divide exactly (FLOOR_MOD
    gives a signed zero)."""
    whole = {"a": lambda rng, s: rng.integers(-12, 13, s).astype(float),
             "b": lambda rng, s: rng.choice([1 / 3, -1 / 3, 0.1, -0.1, 2.0, -3.0, 0.5], s)}
    out = []
    for op in ("FLOOR_DIV", "FLOOR_MOD"):
        out += [_two(op, "float32", F, gens={"a": uniform(-10, 10), "b": _float_divisor}),
                _two(op, "float32_whole_numbers", F, gens=whole),
                _two(op, "float32_extremes", F, gens={"a": _extreme, "b": _extreme_nonzero}),
                _two(op, "float32_const", F, gens={"a": uniform(-10, 10)},
                     const_b=np.tile([0.3, -0.7, 1.5, -2.0, 3.0], 6).reshape(SHAPE))]
        for name in ("broadcast", "broadcast_scalar", "broadcast_both"):
            out.append(_two(op, f"float32_{name}", F, BROADCASTS[name],
                            gens={"a": uniform(-10, 10), "b": _float_divisor}))
    return out


# ---- SQUARED_DIFFERENCE ------------------------------------------------------------------------

@cases("SQUARED_DIFFERENCE")
def squared_difference_cases():
    q8 = (q(0.05, 3), q(0.04, -6), q(0.3, -128))
    q16 = (q(0.0004), q(0.0003), q(0.006))
    out = [_two("SQUARED_DIFFERENCE", "float32", F), _two("SQUARED_DIFFERENCE", "int32", I32),
           _two("SQUARED_DIFFERENCE", "float32_extremes", F,
                gens={"a": _extreme, "b": _extreme}),
           _two("SQUARED_DIFFERENCE", "int8", "int8", quants=q8),
           _two("SQUARED_DIFFERENCE", "int8_same_scale", "int8",
                quants=(q(0.02, 0), q(0.02, 0), q(0.01, -100))),
           _two("SQUARED_DIFFERENCE", "int16", "int16", quants=q16),
           _two("SQUARED_DIFFERENCE", "int8_const", "int8", quants=q8,
                const_b=np.arange(-60, 90, 5).reshape(SHAPE))]
    for name in ("broadcast", "broadcast_scalar", "broadcast_rank5"):
        out.append(_two("SQUARED_DIFFERENCE", f"float32_{name}", F, BROADCASTS[name]))
        out.append(_two("SQUARED_DIFFERENCE", f"int8_{name}", "int8", BROADCASTS[name], q8))
        out.append(_two("SQUARED_DIFFERENCE", f"int16_{name}", "int16", BROADCASTS[name], q16))
    return out


# ---- SELECT_V2 ---------------------------------------------------------------------------------

@cases("SELECT_V2")
def select_v2_cases():
    """Raw values are selected: x, y and the output share one quantization, as a converter
    writes them."""
    layouts = {"": (SHAPE, SHAPE, SHAPE, SHAPE),
               "_broadcast": ((1, 4), (3, 1), (3, 4), (3, 4)),
               "_scalar_condition": ((1,), SHAPE, SHAPE, SHAPE),
               "_broadcast_rank4": ((2, 1, 1, 3), (1, 4, 1, 1), (1, 1, 2, 3), (2, 4, 2, 3)),
               # one element each in ranks that disagree: TFLM keeps the output's own shape
               "_mixed_scalars": ((1,), (1, 1), (), (1,))}
    out = []
    for dtype, quant in ((F, None), ("int8", q(0.05, -3)), ("int16", q(0.001))):
        for suffix, (sc, sx, sy, so) in layouts.items():
            out.append(single("SELECT_V2", f"{dtype}{suffix}",
                              [_t("cond", sc, "bool"), _t("x", sx, dtype, quant),
                               _t("y_in", sy, dtype, quant)], [_t("y", so, dtype, quant)]))
    return out


# ---- ADD_N -------------------------------------------------------------------------------------

@cases("ADD_N")
def add_n_cases():
    """int8: every input shares one quantization (TFLM requires it)."""
    def model(variant, dtype, n, quant_in=None, quant_out=None, const=False):
        ins = [_t(f"x{k}", SHAPE, dtype, quant_in) for k in range(n)]
        if const:
            data = np.arange(30).reshape(SHAPE) % 7 - 3 if dtype == F else \
                np.arange(-60, 90, 5).reshape(SHAPE)
            ins[-1] = _t(f"x{n - 1}", SHAPE, dtype, quant_in, data)
        return single("ADD_N", variant, ins, [_t("y", SHAPE, dtype, quant_out)])
    return [model("float32", F, 3), model("float32_two", F, 2), model("float32_five", F, 5),
            model("float32_const", F, 3, const=True),
            model("int8", "int8", 3, q(0.05, -3), q(0.12, 4)),
            model("int8_two", "int8", 2, q(0.02, 10), q(0.05, -10)),
            model("int8_zero_point_0", "int8", 4, q(0.03, 0), q(0.1, 0)),
            model("int8_const", "int8", 3, q(0.05, -3), q(0.12, 4), const=True)]
