"""Conformance cases: elementwise math (ABS ... SQUARE, ELU, LOGICAL_NOT, CAST, ZEROS_LIKE), the
row ops L2_NORMALIZATION and LOG_SOFTMAX, and PRELU, in every type tflite-micro's kernels take.

Quantization is what a converter writes: int8 asymmetric with the zero point where the value
range puts it, int16 symmetric (zero point 0); outputs TFLM fixes (LOG_SOFTMAX int8: 16/256,
127; L2_NORMALIZATION int8: 1/128, 0) carry exactly those parameters.
"""
from __future__ import annotations

import numpy as np

from . import cases, integers, q, single, tensor, uniform


def _unary(op, variant, shape, dtype="float32", qx=None, qy=None, gen=None, out_dtype=None):
    return single(op, variant, [tensor("x", shape, dtype, qx)],
                  [tensor("y", shape, out_dtype or dtype, qy)],
                  gens={"x": gen} if gen is not None else None)


SPECIALS = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 0.5, -0.5, 1.5, -2.5, 1e30, -1e-30,
                     8388607.5, -8388609.0], np.float32)


def specials(lo=-4.0, hi=4.0):
    """Half the values from SPECIALS (signed zeros, infinities, NaN, ties, huge), half uniform."""
    def gen(rng, shape):
        pick = rng.choice(SPECIALS, shape)
        return np.where(rng.random(shape) < 0.5, pick, rng.uniform(lo, hi, shape))
    return gen


def some_of(values, lo, hi):
    """Half the values from `values`, half integers in [lo, hi]."""
    def gen(rng, shape):
        pick = rng.choice(np.asarray(values), shape)
        return np.where(rng.random(shape) < 0.5, pick, rng.integers(lo, hi + 1, shape))
    return gen


# inputs whose result tells a multiplier formed in double (as the tflite-micro release does)
# from one formed from a float32 quotient (as the mirrored source reads), for these scales
ABS_INT16_SCALES = (0.0007572289, 0.0007535551)
ABS_INT16_TELLING = [-32716, -32511, -31075, -30870, -30665, -29229, -29024, -27383, -27178,
                     -25742, -25537, -23896, -23691, -22050, -20409, -20204, -18563, -16717]
RSQRT_INT16_SCALES, RSQRT_INT16_TELLING = (0.00025, 0.0013), [977]


def quarters(lo, hi):
    """Multiples of 1/4: exact ties for rounding, and small negatives that round to zero."""
    return lambda rng, shape: rng.integers(lo * 4, hi * 4 + 1, shape) / 4.0


@cases("ABS")
def abs_cases():
    s = (2, 3, 5)
    return [
        _unary("ABS", "float32", s),
        _unary("ABS", "float32_specials", s, gen=specials()),
        _unary("ABS", "int8", s, "int8", q(0.05, -10), q(0.03, -128)),
        _unary("ABS", "int8_same_scale", s, "int8", q(0.04, 5), q(0.04, 5)),
        _unary("ABS", "int16", s, "int16", q(0.001, 0), q(0.0008, 0)),
        _unary("ABS", "int16_same_scale", s, "int16", q(0.002, 0), q(0.002, 0)),
        _unary("ABS", "int16_close_scales", s, "int16", q(ABS_INT16_SCALES[0], 0),
               q(ABS_INT16_SCALES[1], 0), gen=some_of(ABS_INT16_TELLING, -32768, 32767)),
        _unary("ABS", "int16_unquantized", s, "int16"),
    ]


FLOAT_UNARY = {  # op -> generator of its float32 inputs
    "CEIL": uniform(-5, 5), "FLOOR": uniform(-5, 5), "NEG": uniform(-5, 5),
    "COS": uniform(-10, 10), "SIN": uniform(-10, 10), "EXP": uniform(-6, 6),
    "LOG": uniform(0.01, 20), "SQRT": uniform(0, 20), "SQUARE": uniform(-8, 8),
}


@cases(*FLOAT_UNARY)
def float_unary_cases():
    out = [_unary(op, "float32", (1, 4, 6), gen=gen) for op, gen in FLOAT_UNARY.items()]
    out += [_unary(op, "float32_specials", (3, 9), gen=specials())
            for op in ("CEIL", "FLOOR", "NEG", "LOG", "SQRT", "SQUARE")]
    return out


@cases("ROUND")
def round_cases():
    return [_unary("ROUND", "float32", (2, 3, 5)),
            _unary("ROUND", "float32_ties", (4, 17), gen=quarters(-4, 4)),
            _unary("ROUND", "float32_specials", (3, 9), gen=specials())]


@cases("RSQRT")
def rsqrt_cases():
    s = (2, 3, 5)
    return [
        _unary("RSQRT", "float32", s, gen=uniform(0.01, 10)),
        # TFLM fails on inputs below the input zero point: none are generated
        _unary("RSQRT", "int8", s, "int8", q(0.05, -128), q(0.04, -128)),
        _unary("RSQRT", "int8_zero_point", s, "int8", q(0.02, -100), q(0.05, -120),
               gen=integers(-100, 127)),
        _unary("RSQRT", "int16", s, "int16", q(0.0005, 0), q(0.0012, 0),
               gen=integers(0, 32767)),
        _unary("RSQRT", "int16_double_multiplier", s, "int16", q(RSQRT_INT16_SCALES[0], 0),
               q(RSQRT_INT16_SCALES[1], 0), gen=some_of(RSQRT_INT16_TELLING, 0, 32767)),
    ]


@cases("ELU")
def elu_cases():
    s = (2, 4, 5)
    return [_unary("ELU", "float32", s, gen=uniform(-6, 4)),
            _unary("ELU", "float32_specials", s, gen=specials()),
            _unary("ELU", "int8", s, "int8", q(0.04, 20), q(0.0208, -80))]


@cases("LOGICAL_NOT")
def logical_not_cases():
    return [_unary("LOGICAL_NOT", "bool", (3, 7), "bool")]


CASTS = [("float32", "int8"), ("float32", "int16"), ("float32", "int32"), ("float32", "bool"),
         ("int8", "float32"), ("int8", "int16"), ("int8", "int32"), ("int8", "bool"),
         ("int16", "float32"), ("int16", "int8"), ("int16", "int32"),
         ("int32", "float32"), ("int32", "int8"), ("int32", "int16"), ("int32", "bool"),
         ("bool", "float32"), ("bool", "int8"), ("bool", "int32")]


@cases("CAST")
def cast_cases():
    """Narrowing integer casts wrap (int32 inputs span beyond int16); float -> integer
    truncates toward zero (inputs within the target's range: beyond it C++ is undefined)."""
    gens = {"int32": integers(-100000, 100000), "float32": uniform(-100, 100)}
    return [_unary("CAST", f"{a}_to_{b}", (2, 3, 4), a, gen=gens.get(a), out_dtype=b)
            for a, b in CASTS]


@cases("ZEROS_LIKE")
def zeros_like_cases():
    s = (2, 3, 4)
    return [_unary("ZEROS_LIKE", "float32", s),
            _unary("ZEROS_LIKE", "int8", s, "int8", q(0.1, 7), q(0.1, 7)),
            _unary("ZEROS_LIKE", "int32", s, "int32"),
            _unary("ZEROS_LIKE", "int64", s, "int64")]


@cases("L2_NORMALIZATION")
def l2_normalization_cases():
    out_q = q(1 / 128, 0)
    return [
        _unary("L2_NORMALIZATION", "float32", (3, 8)),
        _unary("L2_NORMALIZATION", "float32_rank4", (1, 2, 3, 5)),
        _unary("L2_NORMALIZATION", "int8", (3, 8), "int8", q(0.05, 3), out_q),
        _unary("L2_NORMALIZATION", "int8_rank4", (1, 2, 3, 16), "int8", q(0.02, -7), out_q),
        # rows at or next to the zero point: the reciprocal square root of 0 and 1
        _unary("L2_NORMALIZATION", "int8_near_zero_point", (6, 2), "int8", q(0.05, 3), out_q,
               gen=integers(2, 4)),
    ]


@cases("LOG_SOFTMAX")
def log_softmax_cases():
    out_q = q(16 / 256, 127)
    return [
        _unary("LOG_SOFTMAX", "float32", (4, 10), gen=uniform(-8, 8)),
        _unary("LOG_SOFTMAX", "float32_rank4", (1, 2, 3, 6)),
        _unary("LOG_SOFTMAX", "int8", (4, 10), "int8", q(0.1, -5), out_q),
        _unary("LOG_SOFTMAX", "int8_long_rows", (2, 40), "int8", q(0.02, 12), out_q),
        _unary("LOG_SOFTMAX", "int8_rank3", (2, 3, 5), "int8", q(0.25, 0), out_q),
    ]


def _prelu(variant, x_shape, a_shape, dtype, qx=None, qa=None, qy=None, const_alpha=True):
    a_dtype = "float32" if dtype == "float32" else "int8"
    data = None
    if const_alpha:
        rng = np.random.default_rng(len(variant))
        data = (rng.uniform(-0.5, 1.0, a_shape) if dtype == "float32"
                else rng.integers(-128, 128, a_shape))
    return single("PRELU", variant, [tensor("x", x_shape, dtype, qx),
                                     tensor("alpha", a_shape, a_dtype, qa, data=data)],
                  [tensor("y", x_shape, dtype, qy)])


@cases("PRELU")
def prelu_cases():
    x = (1, 4, 4, 3)
    return [
        _prelu("float32_channel_alpha", x, (1, 1, 3), "float32"),
        _prelu("float32_runtime_alpha", (2, 3, 4), (2, 3, 4), "float32", const_alpha=False),
        _prelu("float32_scalar_alpha", (3, 5), (1,), "float32"),
        _prelu("int8_channel_alpha", x, (1, 1, 3), "int8", q(0.05, 10), q(0.004, -128),
               q(0.04, -60)),
        _prelu("int8_runtime_alpha", (2, 3, 4), (2, 3, 4), "int8", q(0.03, -4), q(0.01, 20),
               q(0.02, 3), const_alpha=False),
        _prelu("int8_row_alpha", (2, 3, 4), (3, 1), "int8", q(0.06, 0), q(0.008, -30),
               q(0.05, -20)),
        _prelu("int16_channel_alpha", x, (1, 1, 3), "int16", q(0.0005, 0), q(0.004, -128),
               q(0.0004, 0)),
    ]
