"""Conformance cases: shape and slicing operators (SLICE, STRIDED_SLICE, SPLIT, SPLIT_V, PACK,
UNPACK, EXPAND_DIMS, SHAPE, FILL, BROADCAST_ARGS, BROADCAST_TO, TILE, RESHAPE, SQUEEZE) and a
shape computation that must fold at compile time.

These kernels copy elements without arithmetic, so quantized outputs keep the input's
quantization, as the TFLite converter writes them (int16 zero points 0). Index operands are
constants, as TFLM requires for most of them. The element types per operator are those TFLM's
kernel accepts (LiteRT's for TILE, which TFLM lacks).
"""
from __future__ import annotations

import numpy as np

from mcuforge.frontend.tflite_flatbuffer import TflOp, TflSubgraph

from . import TflCase, cases, q, single, tensor

QUANT = {"float32": None, "int8": q(0.05, -7), "int16": q(0.002), "int32": None,
         "int64": None, "bool": None}


def _t(name, shape, dtype):
    return tensor(name, shape, dtype, QUANT[dtype])


def _c(name, values, dtype="int32"):
    values = np.asarray(values)
    return tensor(name, values.shape, dtype, data=values)


def _ones_or_threes(rng, shape):
    """Shape vectors that always broadcast against each other: every entry 1 or 3."""
    return rng.choice([1, 3], shape)


# ---- SLICE ----

SLICES = {  # name: (input shape, begin, size)
    "rank4": ((2, 4, 5, 3), (1, 1, 0, 1), (1, 2, -1, 2)),
    "rank2": ((6, 7), (2, 0), (3, 7)),
    "rank5": ((2, 3, 2, 4, 3), (0, 1, 1, 2, 0), (2, -1, 1, 2, 2)),
}


@cases("SLICE")
def slice_cases():
    out = []
    for dtype in ("float32", "int8", "int16", "int32", "bool"):
        for name, (shape, begin, size) in SLICES.items():
            if name == "rank5" and dtype in ("int32", "bool"):
                continue
            y = [n - b if s == -1 else s for n, b, s in zip(shape, begin, size)]
            out.append(single("SLICE", f"{dtype}_{name}",
                              [_t("x", shape, dtype), _c("begin", begin), _c("size", size)],
                              [_t("y", y, dtype)]))
    shape, begin, size = SLICES["rank4"]
    out.append(single("SLICE", "float32_int64_begin_size",
                      [_t("x", shape, "float32"), _c("begin", begin, "int64"),
                       _c("size", size, "int64")], [_t("y", (1, 2, 5, 2), "float32")]))
    return out


# ---- STRIDED_SLICE ----

def _strided_shape(shape, begin, end, strides, options):
    """The output shape by TensorFlow's rules (begin/end masks, shrink, offset)."""
    out = []
    for d, (n, b, e, s) in enumerate(zip(shape, begin, end, strides)):
        if options.get("shrink_axis_mask", 0) >> d & 1:
            continue
        if options.get("offset"):
            e = (b + n if b < 0 else b) + e
        lo, hi = (0, n) if s > 0 else (-1, n - 1)
        b = b + n if b < 0 else b
        e = e + n if e < 0 else e
        b, e = min(max(b, lo), hi), min(max(e, lo), hi)
        if options.get("begin_mask", 0) >> d & 1:
            b = 0 if s > 0 else n - 1
        if options.get("end_mask", 0) >> d & 1:
            e = n if s > 0 else -1
        out.append(len(range(b, e, s)))
    return out


STRIDED = {  # name: (input shape, begin, end, strides, options)
    "basic": ((3, 4, 5), (1, 0, 1), (3, 4, 5), (1, 2, 2), {}),
    "negative_indices": ((3, 4, 5), (-2, -4, 0), (-1, -1, -2), (1, 1, 1), {}),
    "negative_strides": ((3, 4, 5), (2, -1, 4), (0, 0, 0), (-1, -2, -1), {"end_mask": 4}),
    "masks": ((2, 6, 4, 3), (1, 2, 1, 0), (0, 5, 3, 2), (1, 2, 1, 1),
              {"begin_mask": 5, "end_mask": 9}),
    "shrink_axis": ((3, 4, 5), (1, 0, -1), (2, 4, 0), (1, 1, 1), {"shrink_axis_mask": 5}),
    "clamped": ((4, 6), (-9, 2), (9, 100), (2, 1), {}),
    # TFLM ignores offset; where its output shape check passes both meanings agree
    "offset": ((4, 6), (0, 2), (2, 10), (1, 1), {"offset": True}),
}


def _strided(dtype, name, shape, begin, end, strides, options, reference="tflm", note=""):
    y = _strided_shape(shape, begin, end, strides, options)
    return single("STRIDED_SLICE", f"{dtype}_{name}",
                  [_t("x", shape, dtype), _c("begin", begin), _c("end", end),
                   _c("strides", strides)], [_t("y", y, dtype)], options,
                  reference=reference, note=note)


@cases("STRIDED_SLICE")
def strided_slice_cases():
    out = []
    for dtype in ("float32", "int8", "int16", "int32", "bool"):
        names = STRIDED if dtype in ("float32", "int8") else ("basic", "shrink_axis")
        out += [_strided(dtype, n, *STRIDED[n]) for n in names]
    # a shape vector's first entry as a scalar (the usual batch-size computation)
    out.append(_strided("int32", "vector_to_scalar", (4,), (0,), (1,), (1,),
                        {"shrink_axis_mask": 1}))
    # offset=true with an end relative to begin: TFLM ignores offset and rejects the model
    # (its output shape check fails), LiteRT honours it
    out.append(_strided("float32", "offset_relative_end", (4, 6), (1, -4), (2, 3), (1, 1),
                        {"offset": True}, reference="litert",
                        note="TFLM ignores offset (its Prepare refuses this model)"))
    return out


# ---- SPLIT, SPLIT_V, PACK, UNPACK ----

SPLIT_TYPES = ("float32", "int8", "int16", "int32")


@cases("SPLIT")
def split_cases():
    out = []
    for dtype in SPLIT_TYPES:
        for name, shape, axis, parts in (("axis1", (2, 6, 3), 1, 3),
                                          ("axis_negative", (2, 3, 4), -1, 2),
                                          ("axis0_rank4", (4, 2, 3, 2), 0, 4)):
            a = axis % len(shape)
            part = list(shape)
            part[a] //= parts
            out.append(single("SPLIT", f"{dtype}_{name}",
                              [_c("axis", [axis]), _t("x", shape, dtype)],
                              [_t(f"y{i}", part, dtype) for i in range(parts)],
                              {"num_splits": parts}))
    return out


@cases("SPLIT_V")
def split_v_cases():
    out = []
    for dtype in SPLIT_TYPES:
        for name, shape, axis, sizes in (("axis1", (2, 7, 3), 1, (2, 4, 1)),
                                         ("rest_negative_axis", (3, 2, 6), -1, (1, -1, 2)),
                                         ("one_part", (3, 4), 0, (3,))):
            a = axis % len(shape)
            real = [shape[a] - (sum(sizes) + 1) if s == -1 else s for s in sizes]
            outs = [_t(f"y{i}", shape[:a] + (s,) + shape[a + 1:], dtype)
                    for i, s in enumerate(real)]
            out.append(single("SPLIT_V", f"{dtype}_{name}",
                              [_t("x", shape, dtype), _c("size_splits", sizes),
                               _c("axis", [axis])], outs, {"num_splits": len(sizes)}))
    return out


@cases("PACK")
def pack_cases():
    out = []
    shape = (2, 3)
    for dtype in ("float32", "int8", "int16", "int32", "int64"):
        for name, axis, count in (("axis0", 0, 3), ("axis1", 1, 2), ("axis_last", -1, 3)):
            a = axis % (len(shape) + 1)
            y = shape[:a] + (count,) + shape[a:]
            out.append(single("PACK", f"{dtype}_{name}",
                              [_t(f"x{i}", shape, dtype) for i in range(count)],
                              [_t("y", y, dtype)], {"values_count": count, "axis": axis}))
    # a constant among the inputs, as shape computations have (batch, -1)
    out.append(single("PACK", "int32_with_constant",
                      [_t("x0", (2,), "int32"), _c("x1", [7, -1])], [_t("y", (2, 2), "int32")],
                      {"values_count": 2, "axis": 1}))
    return out


@cases("UNPACK")
def unpack_cases():
    out = []
    shape = (3, 2, 4)
    for dtype in SPLIT_TYPES:
        for name, axis in (("axis0", 0), ("axis1", 1), ("axis_last", -1)):
            a = axis % len(shape)
            part = shape[:a] + shape[a + 1:]
            out.append(single("UNPACK", f"{dtype}_{name}", [_t("x", shape, dtype)],
                              [_t(f"y{i}", part, dtype) for i in range(shape[a])],
                              {"num": shape[a], "axis": axis}))
    return out


# ---- EXPAND_DIMS, SHAPE, FILL, BROADCAST_ARGS, BROADCAST_TO, TILE ----

@cases("EXPAND_DIMS")
def expand_dims_cases():
    out = []
    shape = (2, 3, 4)
    for dtype in ("float32", "int8", "int16"):
        for name, axis in (("axis0", 0), ("axis2", 2), ("axis_negative", -1)):
            a = axis % (len(shape) + 1)
            out.append(single("EXPAND_DIMS", f"{dtype}_{name}",
                              [_t("x", shape, dtype), _c("axis", [axis])],
                              [_t("y", shape[:a] + (1,) + shape[a:], dtype)]))
    return out


@cases("SHAPE")
def shape_cases():
    """TFLM's SHAPE writes int32 only."""
    return [single("SHAPE", f"{dtype}_rank{len(shape)}", [_t("x", shape, dtype)],
                   [_t("y", (len(shape),), "int32")], {"out_type": 2})
            for dtype, shape in (("float32", (1, 5, 4, 3)), ("int8", (2, 7)),
                                 ("int16", (3,)))]


@cases("FILL")
def fill_cases():
    """TFLM fills float32, int32 and int8; the value is a run-time scalar input."""
    out = []
    for dtype, dims_type in (("float32", "int32"), ("int32", "int32"), ("int8", "int32"),
                             ("float32", "int64")):
        dims = (2, 3, 4) if dims_type == "int32" else (5, 2)
        out.append(single("FILL", f"{dtype}_dims_{dims_type}",
                          [_c("dims", dims, dims_type), _t("value", (), dtype)],
                          [_t("y", dims, dtype)]))
    return out


@cases("BROADCAST_ARGS")
def broadcast_args_cases():
    out = []
    for dtype in ("int32", "int64"):
        for name, (n0, n1) in (("same_length", (4, 4)), ("first_shorter", (2, 5)),
                               ("second_shorter", (3, 1))):
            out.append(single("BROADCAST_ARGS", f"{dtype}_{name}",
                              [_t("s0", (n0,), dtype), _t("s1", (n1,), dtype)],
                              [_t("y", (max(n0, n1),), dtype)],
                              gens={"s0": _ones_or_threes, "s1": _ones_or_threes}))
    out.append(single("BROADCAST_ARGS", "int32_one_constant",
                      [_t("s0", (3,), "int32"), _c("s1", [3, 1])], [_t("y", (3,), "int32")],
                      gens={"s0": _ones_or_threes}))
    return out


BROADCASTS = {  # name: (input shape, output shape)
    "rank3": ((3, 1), (2, 3, 4)),
    "rank4_inner": ((1, 1, 4, 1), (2, 3, 4, 2)),
    "rank5": ((2, 1, 3, 1, 1), (2, 2, 3, 2, 3)),
    "scalar": ((), (3, 2)),
}


@cases("BROADCAST_TO")
def broadcast_to_cases():
    """TFLM copies raw bytes of any element type."""
    out = []
    for dtype in ("float32", "int8", "int16", "int32", "int64", "bool"):
        for name, (shape, to) in BROADCASTS.items():
            if dtype not in ("float32", "int8") and name != "rank3":
                continue
            out.append(single("BROADCAST_TO", f"{dtype}_{name}",
                              [_t("x", shape, dtype), _c("shape", to)], [_t("y", to, dtype)]))
    out.append(single("BROADCAST_TO", "float32_shape_int64",
                      [_t("x", (3, 1), "float32"), _c("shape", (2, 3, 4), "int64")],
                      [_t("y", (2, 3, 4), "float32")]))
    return out


@cases("TILE")
def tile_cases():
    """TFLM has no TILE: LiteRT is the reference."""
    out = []
    for dtype in ("float32", "int8", "int16", "int32", "int64", "bool"):
        for name, shape, reps in (("rank3", (2, 1, 3), (2, 3, 1)),
                                  ("rank1", (4,), (3,)), ("rank4", (1, 2, 2, 3), (2, 1, 2, 2))):
            if dtype not in ("float32", "int8") and name != "rank3":
                continue
            y = [n * r for n, r in zip(shape, reps)]
            out.append(single("TILE", f"{dtype}_{name}",
                              [_t("x", shape, dtype), _c("multiples", reps)], [_t("y", y, dtype)],
                              reference="litert"))
    out.append(single("TILE", "float32_multiples_int64",
                      [_t("x", (2, 3), "float32"), _c("multiples", (2, 2), "int64")],
                      [_t("y", (4, 6), "float32")], reference="litert"))
    return out


# ---- RESHAPE, SQUEEZE (int8 is covered elsewhere) ----

@cases("RESHAPE")
def reshape_cases():
    out = []
    for dtype in ("float32", "int16", "int32"):
        out.append(single("RESHAPE", f"{dtype}_shape_input",
                          [_t("x", (2, 3, 4), dtype), _c("shape", (4, -1))],
                          [_t("y", (4, 6), dtype)]))
        out.append(single("RESHAPE", f"{dtype}_new_shape_option", [_t("x", (1, 6, 2), dtype)],
                          [_t("y", (3, 4), dtype)], {"new_shape": [3, 4]}))
    return out


@cases("SQUEEZE")
def squeeze_cases():
    out = []
    for dtype in ("float32", "int16", "int32"):
        out.append(single("SQUEEZE", f"{dtype}_all", [_t("x", (1, 3, 1, 4), dtype)],
                          [_t("y", (3, 4), dtype)]))
        out.append(single("SQUEEZE", f"{dtype}_dims", [_t("x", (1, 3, 1, 4, 1), dtype)],
                          [_t("y", (1, 3, 4), dtype)], {"squeeze_dims": [2, -1]}))
    return out


# ---- a shape computation: folded at compile time ----

def flatten_by_shape_case() -> TflCase:
    """y = RESHAPE(x, PACK(STRIDED_SLICE(SHAPE(x), [0], [1], [1], shrink), -1)): Keras'
    Flatten with a dynamic batch. mcuforge folds all but the reshape."""
    tensors = [_t("x", (2, 3, 4), "float32"), _t("shape", (3,), "int32"),
               _c("begin", [0]), _c("end", [1]), _c("strides", [1]), _t("batch", (), "int32"),
               _c("minus_one", np.int32(-1)), _t("new_shape", (2,), "int32"),
               _t("y", (2, 12), "float32")]
    ops = [TflOp("SHAPE", ("x",), ("shape",), {"out_type": 2}),
           TflOp("STRIDED_SLICE", ("shape", "begin", "end", "strides"), ("batch",),
                 {"shrink_axis_mask": 1}),
           TflOp("PACK", ("batch", "minus_one"), ("new_shape",), {"values_count": 2, "axis": 0}),
           TflOp("RESHAPE", ("x", "new_shape"), ("y",))]
    return TflCase("RESHAPE", "float32_flatten_by_shape",
                   [TflSubgraph(tensors, ops, ["x"], ["y"])])


def flatten_by_concat_case() -> TflCase:
    """The same with the batch kept as a 1-vector and CONCATENATION instead of PACK: the
    frontend folds SHAPE and STRIDED_SLICE, the optimizer the concat."""
    tensors = [_t("x", (3, 2, 5), "float32"), _t("shape", (3,), "int32"),
               _c("begin", [0]), _c("end", [1]), _c("strides", [1]), _t("batch", (1,), "int32"),
               _c("minus_one", [-1]), _t("new_shape", (2,), "int32"),
               _t("y", (3, 10), "float32")]
    ops = [TflOp("SHAPE", ("x",), ("shape",), {"out_type": 2}),
           TflOp("STRIDED_SLICE", ("shape", "begin", "end", "strides"), ("batch",)),
           TflOp("CONCATENATION", ("batch", "minus_one"), ("new_shape",), {"axis": 0}),
           TflOp("RESHAPE", ("x", "new_shape"), ("y",))]
    return TflCase("RESHAPE", "float32_flatten_by_concat",
                   [TflSubgraph(tensors, ops, ["x"], ["y"])])


@cases("RESHAPE")
def shape_computation_cases():
    return [flatten_by_shape_case(), flatten_by_concat_case()]
