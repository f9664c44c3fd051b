"""TFLite converters: reductions and arg-reductions (SUM, REDUCE_MAX, ARG_MAX, CUMSUM, ...) and
the index lookups GATHER, GATHER_ND and EMBEDDING_LOOKUP.

Registered in `tflite_ops.CONVERTERS` by `@op`; see tflite_ops for the conventions. Types are
those tflite-micro's kernels accept; anything else is `Unsupported` (there would be no
reference to be bit-exact with). Axis operands are read at compile time: TFLM reads them at
run time, so a non-constant one is `Unsupported`. Quantized reductions keep their quantization
on the tensors and are lowered by codegen_c/lower/q_reduce.py.
"""
from __future__ import annotations

import numpy as np
import tflite

from mcuforge.ir.graph import Node

from .tflite_ops import Unsupported, op

def _types(ctx, i, allowed, what="input"):
    """The dtype of input i, or Unsupported when TFLM's kernel does not take it."""
    dtype = ctx.input(i).dtype
    if dtype not in allowed:
        raise Unsupported(f"{what} of type {dtype} (tflite-micro takes {', '.join(allowed)})")
    return dtype


def _same_type_quantized(ctx):
    """Input 0 and output 0 share a dtype; an integer one is quantized per tensor on both
    (TFLM's integer kernels rescale with the scales and zero points)."""
    x, y = ctx.input(0), ctx.output()
    if x.dtype != y.dtype:
        raise ctx.error(f"input {x.dtype} and output {y.dtype} differ")
    if x.dtype in ("int8", "int16") and any(t.quant is None or t.quant.per_axis for t in (x, y)):
        raise Unsupported(f"{x.dtype} tensors without per-tensor quantization")


def _const_ints(ctx, i, what):
    """The int32 constant operand i as a flat list; Unsupported when it is computed at run
    time (mcuforge's loops are laid out at compile time)."""
    t = ctx.input(i)
    if t.dtype != "int32":
        raise Unsupported(f"{what} of type {t.dtype} (tflite-micro takes int32)")
    if not t.is_const:
        raise Unsupported(f"{what} computed at run time: mcuforge needs a constant {what}")
    return [int(v) for v in np.asarray(t.data).reshape(-1)]


def _axes(ctx):
    """Reduction axes: negatives wrapped and repeats dropped, as TFLM's ResolveAxis, then
    sorted (the order TFLM visits the elements of each output in: the input's row-major order)."""
    rank = len(ctx.input(0).shape)
    axes = _const_ints(ctx, 1, "axis")
    if any(not -rank <= a < rank for a in axes):
        raise ctx.error(f"axes {axes} out of range for rank {rank}")
    return tuple(sorted({a % rank for a in axes}))


def _reduce(ctx, fn, **extra):
    x, y = ctx.input(0), ctx.output()
    _same_type_quantized(ctx)
    keep = bool(ctx.options(tflite.ReducerOptions).KeepDims())
    axes = _axes(ctx)
    kept = int(np.prod([d for i, d in enumerate(x.shape) if i not in axes], dtype=np.int64))
    if kept != y.size:
        raise ctx.error(f"output {y.shape} does not hold the reduction of {x.shape} over {axes}")
    return ctx.node("reduce", {"fn": fn, "axes": axes, "keep_dims": keep, **extra})


@op("SUM")
def sum_(ctx):
    _types(ctx, 0, ("float32", "int8", "int16"))
    return _reduce(ctx, "sum")


@op("REDUCE_MAX", "REDUCE_MIN")
def reduce_max_min(ctx):
    dtype = _types(ctx, 0, ("float32", "int8"))
    x, y = ctx.input(0), ctx.output()
    if dtype == "int8" and x.quant != y.quant:  # TFLM's Eval refuses: it compares raw values
        raise Unsupported("int8 input and output quantized differently (tflite-micro "
                          "requires the same scale and zero point)")
    # TFLM starts every output at the type's lowest (highest) value, not at its first element,
    # and replaces it only by a strictly greater (smaller) input: for floats, NaNs never win
    return _reduce(ctx, "max" if ctx.code == "REDUCE_MAX" else "min", tflm=True)


@op("REDUCE_ALL")
def reduce_all(ctx):
    _types(ctx, 0, ("bool",))
    return _reduce(ctx, "min")  # the minimum of booleans is their conjunction


def _axis(ctx, i, rank, what="axis"):
    values = _const_ints(ctx, i, what)
    if len(values) != 1 or not -rank <= values[0] < rank:
        raise ctx.error(f"{what} {values} is not one axis of a rank-{rank} tensor")
    return values[0] % rank


@op("ARG_MAX", "ARG_MIN")
def arg_max_min(ctx):
    _types(ctx, 0, ("float32", "int8"))
    if ctx.output().dtype != "int32":
        raise Unsupported(f"output of type {ctx.output().dtype} (tflite-micro writes int32)")
    axis = _axis(ctx, 1, len(ctx.input(0).shape))
    # TFLM keeps the first extreme: a later value replaces it only when strictly better
    return ctx.node("arg_reduce", {"fn": "max" if ctx.code == "ARG_MAX" else "min",
                                   "axis": axis, "keep_dims": False,
                                   "select_last_index": False})


@op("CUMSUM")
def cumsum(ctx):
    _types(ctx, 0, ("float32", "int8"))
    _same_type_quantized(ctx)
    o = ctx.options(tflite.CumsumOptions)
    axis = _axis(ctx, 1, len(ctx.input(0).shape))
    return ctx.node("cumsum", {"axis": axis, "exclusive": bool(o.Exclusive()),
                               "reverse": bool(o.Reverse())})


# ---- lookups -------------------------------------------------------------------------------

def _check_indices(ctx, i, n):
    """Constant indices must address the axis of n: TFLM does not check them at run time."""
    t = ctx.input(i)
    if t.is_const:
        v = np.asarray(t.data)
        if v.size and (v.min() < 0 or v.max() >= n):
            raise ctx.error(f"indices {v.reshape(-1).tolist()} out of range [0, {n})")


@op("GATHER")
def gather(ctx):
    data, ind = ctx.input(0), ctx.input(1)
    _types(ctx, 0, ("float32", "int8"))
    _types(ctx, 1, ("int32",), "positions")
    o = ctx.options(tflite.GatherOptions)
    rank = len(data.shape)
    axis = o.Axis() + rank if o.Axis() < 0 else o.Axis()
    batch = o.BatchDims() + len(ind.shape) if o.BatchDims() < 0 else o.BatchDims()
    if not 0 <= axis < rank or not 0 <= batch <= min(axis, len(ind.shape), rank - 1):
        raise ctx.error(f"axis {o.Axis()} / batch_dims {o.BatchDims()} out of range")
    if tuple(data.shape[:batch]) != tuple(ind.shape[:batch]):
        raise ctx.error(f"batch dimensions of {data.shape} and {ind.shape} differ")
    _exact_shape(ctx, data.shape[:axis] + ind.shape[batch:] + data.shape[axis + 1:],
                 data.dtype)
    _check_indices(ctx, 1, data.shape[axis])
    attrs = {"axis": axis}
    if batch:  # leading dimensions shared by data and indices: codegen_c/lower/q_reduce.py
        attrs["batch_dims"] = batch
    return ctx.node("gather", attrs)


@op("GATHER_ND")
def gather_nd(ctx):
    """params[indices[..., :]]: each index row picks a slice params[i0, ..., ik-1, ...]. Lowered
    as GATHER along axis 0 of params viewed as [rows, *slice] with one flat row number per
    index row, row = sum(index_j * stride_j): TFLM's own arithmetic, so rows it accepts (it
    checks only the flat position) are the same rows here."""
    params, ind, y = ctx.input(0), ctx.input(1), ctx.output()
    _types(ctx, 0, ("float32", "int8"))
    _types(ctx, 1, ("int32",), "indices")
    if not ind.shape or not params.shape:
        raise ctx.error("params and indices must be at least vectors")
    nd = ind.shape[-1]
    if nd > len(params.shape) or nd > 5:
        raise ctx.error(f"index rows of {nd} for params of rank {len(params.shape)} "
                        "(at most the rank, and at most 5)")
    lead, rest = tuple(ind.shape[:-1]), tuple(params.shape[nd:])
    _exact_shape(ctx, lead + rest, params.dtype)
    rows = int(np.prod(params.shape[:nd], dtype=np.int64))
    strides = [int(np.prod(params.shape[j + 1:nd], dtype=np.int64)) for j in range(nd)]
    nodes = []
    if params.is_const:
        table = ctx.new_tensor("rows_of_params", (rows,) + rest, params.dtype,
                               data=params.data.reshape((rows,) + rest), quant=params.quant)
    else:
        table = ctx.new_tensor("rows_of_params", (rows,) + rest, params.dtype,
                               quant=params.quant)
        nodes.append(Node("reshape", (params.name,), (table,), {}))  # zero-copy view
    if ind.is_const:  # the row numbers, computed here
        flat = np.asarray(ind.data, np.int64).reshape(-1, nd) @ np.asarray(strides, np.int64)
        if flat.size and (flat.min() < 0 or flat.max() >= rows):
            raise ctx.error(f"indices {ind.data.tolist()} out of range for {params.shape}")
        row = ctx.new_tensor("row", lead, "int32", data=flat.astype(np.int32).reshape(lead))
    elif nd == 1:  # the index rows are the row numbers
        row = ctx.new_tensor("row", lead, "int32")
        nodes.append(Node("reshape", (ind.name,), (row,), {}))
    else:  # row = sum over the last axis of indices * strides
        stride = ctx.new_tensor("strides", (nd,), "int32", data=np.asarray(strides, np.int32))
        scaled = ctx.new_tensor("index_times_stride", ind.shape, "int32")
        row = ctx.new_tensor("row", lead, "int32")
        nodes += [Node("binary", (ind.name, stride), (scaled,), {"fn": "mul"}),
                  Node("reduce", (scaled,), (row,), {"fn": "sum", "axes": (len(lead),),
                                                     "keep_dims": False})]
    nodes.append(Node("gather", (table, row), ctx.outputs, {"axis": 0}))
    return nodes


def _exact_shape(ctx, shape, dtype=None):
    """The generic gather indexes its output by its own shape: it must be the gathered one (of
    the data's type, unless the caller converts)."""
    y = ctx.output()
    if tuple(y.shape) != tuple(shape):
        raise ctx.error(f"output shape {y.shape} is not the gathered {shape}")
    if dtype is not None and y.dtype != dtype:
        raise ctx.error(f"output of type {y.dtype} gathered from {dtype} data")


@op("EMBEDDING_LOOKUP")
def embedding_lookup(ctx):
    """GATHER of rows of the value table (input 1) by the lookup (input 0); an int8 table with
    a float32 output (TFLM's hybrid path) is dequantized after the gather: (q - 0) * scale."""
    lookup, value, y = ctx.input(0), ctx.input(1), ctx.output()
    _types(ctx, 0, ("int32",), "lookup")
    dtype = _types(ctx, 1, ("float32", "int8"), "value")
    if len(lookup.shape) != 1 or len(value.shape) < 2:
        raise ctx.error(f"lookup must be 1-D and value at least 2-D, got {lookup.shape}, "
                        f"{value.shape}")
    _exact_shape(ctx, lookup.shape + value.shape[1:])
    _check_indices(ctx, 0, value.shape[0])
    if y.dtype == dtype:
        return ctx.node("gather", {"axis": 0}, inputs=(value.name, lookup.name))
    if (dtype, y.dtype) != ("int8", "float32"):
        raise Unsupported(f"{dtype} value with a {y.dtype} output")
    if value.quant is None or value.quant.per_axis or value.quant.zero_point[0] != 0:
        raise Unsupported("hybrid lookup needs a per-tensor int8 table of zero point 0")
    rows = ctx.new_tensor("rows", (lookup.shape[0],) + tuple(value.shape[1:]), "int8",
                          quant=value.quant)
    return [Node("gather", (value.name, lookup.name), (rows,), {"axis": 0}),
            Node("dequantize", (rows,), ctx.outputs, {})]
