"""Conformance cases: reductions (SUM, MEAN, REDUCE_MAX/MIN/ALL), arg-reductions, CUMSUM and
the lookups GATHER, GATHER_ND, EMBEDDING_LOOKUP, in every type tflite-micro's kernels take.

Axis operands are int32 constants (TFLM's kernels require int32; mcuforge requires constants).
Quantization is what a converter writes: int8 asymmetric, int16 symmetric (zero point 0); the
output of a sum has a wider range than its input, of a mean about the same.
"""
from __future__ import annotations

import numpy as np

from . import cases, integers, q, single, tensor


def _axes(values):
    return tensor("axes", (len(values),), "int32", data=values)


def _reduction(op, variant, x_shape, axes, keep, dtype, y_shape, qx=None, qy=None, **kw):
    return single(op, variant, [tensor("x", x_shape, dtype, qx), _axes(axes)],
                  [tensor("y", y_shape, dtype, qy)], {"keep_dims": keep}, **kw)


@cases("SUM")
def sum_cases():
    return [
        _reduction("SUM", "float32_axis1", (2, 5, 3), [1], False, "float32", (2, 3)),
        _reduction("SUM", "float32_axes02_keep_dims", (2, 3, 4), [0, 2], True, "float32",
                   (1, 3, 1)),
        _reduction("SUM", "float32_negative_repeated_axes", (3, 4, 2), [-1, 2, 0], False,
                   "float32", (4,)),
        _reduction("SUM", "float32_all", (2, 3, 4), [0, 1, 2], False, "float32", ()),
        _reduction("SUM", "int8_axis_last", (2, 3, 6), [-1], False, "int8", (2, 3),
                   q(0.02, 5), q(0.07, -3)),
        _reduction("SUM", "int8_axes12_keep_dims", (1, 4, 5, 3), [1, 2], True, "int8",
                   (1, 1, 1, 3), q(0.05, -20), q(0.4, 10)),
        _reduction("SUM", "int8_same_scale_saturating", (3, 8), [1], False, "int8", (3,),
                   q(0.1, 0), q(0.1, 0)),
        _reduction("SUM", "int16_axis0", (6, 5), [0], False, "int16", (5,),
                   q(0.001, 0), q(0.004, 0)),
        _reduction("SUM", "int16_axes13_keep_dims", (2, 3, 4, 5), [1, 3], True, "int16",
                   (2, 1, 4, 1), q(0.0005, 0), q(0.003, 0)),
    ]


@cases("MEAN")
def mean_cases():
    return [
        _reduction("MEAN", "float32_axes12_keep_dims", (1, 4, 5, 3), [1, 2], True, "float32",
                   (1, 1, 1, 3)),
        _reduction("MEAN", "float32_axes21", (2, 4, 3, 3), [2, 1], False, "float32", (2, 3)),
        _reduction("MEAN", "float32_axis_last", (3, 7), [-1], False, "float32", (3,)),
        _reduction("MEAN", "float32_axes02_keep_dims", (2, 3, 5), [0, 2], True, "float32",
                   (1, 3, 1)),
        _reduction("MEAN", "float32_all", (2, 3, 4), [0, 1, 2], False, "float32", ()),
        _reduction("MEAN", "int8_axes12_keep_dims", (1, 4, 5, 3), [1, 2], True, "int8",
                   (1, 1, 1, 3), q(0.05, -20), q(0.03, 4)),
        _reduction("MEAN", "int8_axes12", (2, 3, 3, 4), [1, 2], False, "int8", (2, 4),
                   q(0.04, 11), q(0.04, 11)),
        _reduction("MEAN", "int8_axis_last", (3, 6), [-1], False, "int8", (3,),
                   q(0.02, -7), q(0.015, 3)),
        _reduction("MEAN", "int8_axis0_keep_dims", (5, 2, 3), [0], True, "int8", (1, 2, 3),
                   q(0.1, 0), q(0.06, -5)),
        _reduction("MEAN", "int8_all", (2, 3, 4), [0, 1, 2], False, "int8", (),
                   q(0.03, 2), q(0.01, -1)),
    ]


def _specials(first):
    """Mostly `first` (-inf for max, inf for min) and NaN: TFLM's max/min start from the lowest
    (highest) float and never take a NaN, so such rows come out as -FLT_MAX (FLT_MAX)."""
    values = np.array([first, np.nan, -first, 0.0, -0.0, 1.5], np.float32)
    return lambda rng, shape: rng.choice(values, shape, p=[0.4, 0.3, 0.05, 0.1, 0.1, 0.05])


def _extreme_cases(op):
    first = -np.inf if op == "REDUCE_MAX" else np.inf
    return [
        _reduction(op, "float32_infinities_and_nans", (8, 2), [1], False, "float32", (8,),
                   gens={"x": _specials(first)}),
        _reduction(op, "float32_axis1", (2, 5, 3), [1], False, "float32", (2, 3)),
        _reduction(op, "float32_axes02_keep_dims", (2, 3, 4), [0, 2], True, "float32",
                   (1, 3, 1)),
        _reduction(op, "float32_negative_axis", (3, 4), [-1], False, "float32", (3,)),
        _reduction(op, "int8_axis_last", (2, 3, 6), [-1], False, "int8", (2, 3),
                   q(0.02, 5), q(0.02, 5)),
        _reduction(op, "int8_axes12_keep_dims", (1, 4, 5, 3), [1, 2], True, "int8",
                   (1, 1, 1, 3), q(0.05, -20), q(0.05, -20)),
    ]


@cases("REDUCE_MAX")
def reduce_max_cases():
    return _extreme_cases("REDUCE_MAX")


@cases("REDUCE_MIN")
def reduce_min_cases():
    return _extreme_cases("REDUCE_MIN")


@cases("REDUCE_ALL")
def reduce_all_cases():
    mostly_true = {"x": lambda rng, shape: rng.random(shape) < 0.85}
    return [
        _reduction("REDUCE_ALL", "bool_axis1", (3, 4, 2), [1], False, "bool", (3, 2),
                   gens=mostly_true),
        _reduction("REDUCE_ALL", "bool_axes02_keep_dims", (2, 3, 2), [0, -1], True, "bool",
                   (1, 3, 1), gens=mostly_true),
    ]


def _arg(op, variant, x_shape, axis, dtype, y_shape, qx=None, **kw):
    return single(op, variant, [tensor("x", x_shape, dtype, qx),
                                tensor("axis", (1,), "int32", data=[axis])],
                  [tensor("y", y_shape, "int32")], {"output_type": 2}, **kw)  # 2: INT32


def _with_nans(rng, shape):
    x = rng.uniform(-4, 4, shape)
    return np.where(rng.random(shape) < 0.3, np.nan, x)


def _arg_cases(op):
    return [
        _arg(op, "float32_axis_last", (2, 3, 7), -1, "float32", (2, 3)),
        _arg(op, "float32_axis1", (2, 5, 3), 1, "float32", (2, 3)),
        _arg(op, "float32_ties", (4, 6), 0, "float32", (6,), gens={"x": integers(-2, 2)}),
        _arg(op, "float32_vector", (9,), 0, "float32", ()),
        _arg(op, "float32_nans", (3, 4), 1, "float32", (3,), gens={"x": _with_nans}),
        _arg(op, "int8_axis0", (6, 2, 3), 0, "int8", (2, 3), q(0.05, 3)),
        _arg(op, "int8_ties", (3, 8), 1, "int8", (3,), q(0.05, 3), gens={"x": integers(-3, 3)}),
        _arg(op, "int8_classifier", (1, 10), -1, "int8", (1,), q(0.1, -128)),
    ]


@cases("ARG_MAX")
def arg_max_cases():
    return _arg_cases("ARG_MAX")


@cases("ARG_MIN")
def arg_min_cases():
    return _arg_cases("ARG_MIN")


def _cumsum(variant, shape, axis, dtype, qx=None, qy=None, **options):
    return single("CUMSUM", variant, [tensor("x", shape, dtype, qx),
                                      tensor("axis", (), "int32", data=axis)],
                  [tensor("y", shape, dtype, qy)], options)


@cases("CUMSUM")
def cumsum_cases():
    return [
        _cumsum("float32_axis1", (2, 5, 3), 1, "float32"),
        _cumsum("float32_axis0_exclusive", (4, 3), 0, "float32", exclusive=True),
        _cumsum("float32_negative_axis_reverse", (2, 3, 6), -1, "float32", reverse=True),
        _cumsum("float32_exclusive_reverse", (3, 5), 1, "float32", exclusive=True,
                reverse=True),
        _cumsum("int8_axis_last", (2, 6), -1, "int8", q(0.05, -4), q(0.2, 2)),
        _cumsum("int8_axis0_exclusive", (5, 2, 3), 0, "int8", q(0.03, 10), q(0.1, -7),
                exclusive=True),
        _cumsum("int8_reverse_zero_points_0", (3, 7), 1, "int8", q(0.02, 0), q(0.08, 0),
                reverse=True),
        _cumsum("int8_exclusive_reverse_long", (1, 40), 1, "int8", q(0.05, 30), q(0.5, -10),
                exclusive=True, reverse=True),
    ]


def _gather(variant, x_shape, ind_shape, y_shape, dtype="float32", qx=None, data=None,
            options=None, n=None):
    """GATHER of x by int32 positions: constant when `data` is given, else random in
    [0, n - 1] (n: the gathered axis' size)."""
    ind = tensor("positions", ind_shape, "int32", data=data)
    gens = {} if data is not None else {"positions": integers(0, n - 1)}
    return single("GATHER", variant, [tensor("x", x_shape, dtype, qx), ind],
                  [tensor("y", y_shape, dtype, qx)], options or {}, gens=gens)


@cases("GATHER")
def gather_cases():
    return [
        _gather("float32_axis0", (5, 3), (4,), (4, 3), n=5),
        _gather("float32_axis1_2d_positions", (2, 6, 3), (2, 2), (2, 2, 2, 3),
                options={"axis": 1}, n=6),
        _gather("float32_negative_axis_const_positions", (2, 3, 5), (3,), (2, 3, 3),
                data=[4, 0, 4], options={"axis": -1}),
        _gather("float32_batch_dims1", (2, 5, 3), (2, 4), (2, 4, 3),
                options={"axis": 1, "batch_dims": 1}, n=5),
        _gather("float32_batch_dims1_axis2", (2, 3, 4, 2), (2, 3), (2, 3, 3, 2),
                options={"axis": 2, "batch_dims": 1}, n=4),
        _gather("float32_batch_dims_negative_const", (3, 4), (3, 2), (3, 2),
                data=[3, 0, 1, 1, 2, 3], options={"axis": 1, "batch_dims": -1}),
        _gather("float32_scalar_position", (3, 4, 2), (), (3, 2), data=2, options={"axis": 1}),
        _gather("int8_axis0", (6, 4), (3,), (3, 4), "int8", q(0.05, -2), n=6),
        _gather("int8_axis_last_const_positions", (2, 5), (2,), (2, 2), "int8", q(0.1, 3),
                data=[1, 4], options={"axis": 1}),
    ]


def _gather_nd(variant, x_shape, ind_shape, y_shape, dtype="float32", qx=None, data=None,
               bounds=None):
    """GATHER_ND with int32 indices: constant `data`, or random per column below `bounds`."""
    ind = tensor("indices", ind_shape, "int32", data=data)
    gens = {}
    if data is None:
        def gen(rng, shape):
            return rng.integers(0, bounds, shape)  # bounds broadcast along the last axis
        gens = {"indices": gen}
    return single("GATHER_ND", variant, [tensor("x", x_shape, dtype, qx), ind],
                  [tensor("y", y_shape, dtype, qx)], gens=gens)


@cases("GATHER_ND")
def gather_nd_cases():
    return [
        _gather_nd("float32_elements", (3, 4), (5, 2), (5,), bounds=(3, 4)),
        _gather_nd("float32_rows", (4, 3, 2), (2, 1), (2, 3, 2), bounds=(4,)),
        _gather_nd("float32_slices_2d_indices", (3, 4, 5), (2, 3, 2), (2, 3, 5),
                   bounds=(3, 4)),
        _gather_nd("float32_one_index_row", (3, 4), (2,), (), bounds=(3, 4)),
        _gather_nd("float32_const_indices", (2, 3, 4), (2, 3), (2,),
                   data=[1, 2, 3, 0, 0, 1]),
        _gather_nd("int8_elements", (4, 5), (3, 2), (3,), "int8", q(0.05, 7), bounds=(4, 5)),
        _gather_nd("int8_rows", (5, 6), (4, 1), (4, 6), "int8", q(0.02, -1), bounds=(5,)),
    ]


@cases("EMBEDDING_LOOKUP")
def embedding_lookup_cases():
    rows = integers(0, 5)
    table = [[(i * 7 + j * 3) % 11 - 5 for j in range(4)] for i in range(6)]
    return [
        single("EMBEDDING_LOOKUP", "float32", [tensor("ids", (3,), "int32"),
                                               tensor("table", (6, 4), "float32")],
               [tensor("y", (3, 4), "float32")], gens={"ids": rows}),
        single("EMBEDDING_LOOKUP", "float32_const_table_3d",
               [tensor("ids", (4,), "int32"),
                tensor("table", (6, 2, 2), "float32", data=[[v * 0.25 for v in r]
                                                              for r in table])],
               [tensor("y", (4, 2, 2), "float32")], gens={"ids": rows}),
        single("EMBEDDING_LOOKUP", "int8", [tensor("ids", (3,), "int32"),
                                            tensor("table", (6, 4), "int8", q(0.1, 3))],
               [tensor("y", (3, 4), "int8", q(0.1, 3))], gens={"ids": rows}),
        single("EMBEDDING_LOOKUP", "int8_table_float32_out",
               [tensor("ids", (5,), "int32"),
                tensor("table", (6, 4), "int8", q(0.037, 0), data=[[v * 11 for v in r]
                                                                  for r in table])],
               [tensor("y", (5, 4), "float32")], gens={"ids": rows}),
    ]
