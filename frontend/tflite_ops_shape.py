"""TFLite converters: shape and slicing operators (SLICE, STRIDED_SLICE, SPLIT, SPLIT_V, PACK,
UNPACK, EXPAND_DIMS, SHAPE, FILL, BROADCAST_ARGS, BROADCAST_TO, TILE).

Registered in `tflite_ops.CONVERTERS` by `@op`; see tflite_ops for the conventions. These
operators only move or replicate elements, so they map onto the generic IR ops (slice, concat,
reshape, broadcast_to, tile) and quantization travels with the tensors (TFLM copies raw values).

Shapes are static, so shape computations fold at import: SHAPE always becomes a constant, and
every operator here whose data input is a constant is computed with numpy (`ctx.set_const`), so
a chain like SHAPE -> STRIDED_SLICE -> PACK -> RESHAPE leaves only the reshape. Operands that
only restate the output shape (FILL's dims, BROADCAST_TO's shape, TILE's multiples, SPLIT_V's
size_splits) are checked when constant and otherwise not needed; operands that choose elements
(begin, end, strides, axes) must be constants.
"""
from __future__ import annotations

import numpy as np
import tflite

from mcuforge.ir.graph import Node

from .tflite_ops import Unsupported, op


def _ints(ctx, i, what) -> list:
    """Constant input i as a flat list of ints; Unsupported when it is computed at run time."""
    t = ctx.input(i)
    if not t.is_const:
        raise Unsupported(f"{what} computed at run time (mcuforge needs a constant)")
    return [int(v) for v in np.asarray(t.data).reshape(-1)]


def _axis(ctx, axis, rank, what="axis") -> int:
    if not -rank <= axis < rank:
        raise ctx.error(f"{what} {axis} out of range for rank {rank}")
    return axis % rank


def _check_shape(ctx, expected, i=0):
    y = ctx.output(i)
    if tuple(y.shape) != tuple(expected):
        raise ctx.error(f"output {i} has shape {tuple(y.shape)}, the operator gives "
                        f"{tuple(expected)}")


def _same_type(ctx, tensors, y):
    """Copies keep the element type; quantization may differ (TFLM copies the raw values,
    and so do the generic lowerings)."""
    if any(t.dtype != y.dtype for t in tensors):
        raise ctx.error("inputs and output differ in type")


def _alias(ctx, x, i=0) -> list:
    """Output i holds x's elements in x's order: a zero-copy reshape, or for a constant x a
    constant (an alias of flash data would need arena memory nobody writes)."""
    y = ctx.output(i)
    if x.size != y.size or x.dtype != y.dtype:
        raise ctx.error(f"cannot reshape {x.dtype}{list(x.shape)} to {y.dtype}{list(y.shape)}")
    if x.is_const:
        ctx.set_const(i, x.data)
        return []
    return [Node("reshape", (x.name,), (y.name,), {})]


def _take(ctx, x, i, starts, stops, steps) -> list:
    """Output i = x[start:stop:step] on every axis, then reshaped to output i's shape (which may
    drop size-1 axes). stop -1 with a negative step means "past element 0"."""
    y = ctx.output(i)
    _same_type(ctx, [x], y)
    index = tuple(slice(b, None if e < 0 else e, s) for b, e, s in zip(starts, stops, steps))
    full = tuple(len(range(b, e, s)) for b, e, s in zip(starts, stops, steps))
    if int(np.prod(full, dtype=np.int64)) != y.size:
        raise ctx.error(f"the slice has shape {full}, output {i} has {tuple(y.shape)}")
    if x.is_const:
        ctx.set_const(i, np.asarray(x.data)[index])
        return []
    if full == tuple(x.shape):  # everything, in order: no copy
        return _alias(ctx, x, i)
    attrs = {"starts": tuple(starts), "ends": tuple(None if e < 0 else e for e in stops),
             "steps": tuple(steps)}
    if full == tuple(y.shape):
        return [Node("slice", (x.name,), (y.name,), attrs)]
    mid = ctx.new_tensor(f"slice{i}", full, y.dtype, quant=y.quant)
    return [Node("slice", (x.name,), (mid,), attrs), Node("reshape", (mid,), (y.name,), {})]


@op("SLICE")
def slice_(ctx):
    """begin and size per axis; size -1 takes the rest of the axis. TFLM neither wraps
    negative begins nor clamps, so anything outside the input is a malformed model."""
    x = ctx.input(0)
    rank = len(x.shape)
    begin, size = _ints(ctx, 1, "SLICE's begin"), _ints(ctx, 2, "SLICE's size")
    if len(begin) != rank or len(size) != rank:
        raise ctx.error(f"begin {begin} and size {size} need {rank} entries")
    stops = [n if s == -1 else b + s for b, s, n in zip(begin, size, x.shape)]
    if any(b < 0 or e < b or e > n for b, e, n in zip(begin, stops, x.shape)):
        raise ctx.error(f"begin {begin}, size {size} reach outside the input {x.shape}")
    _check_shape(ctx, [e - b for b, e in zip(begin, stops)])
    return _take(ctx, x, 0, begin, stops, [1] * rank)


def _strided_start(begin, stride, n, masked) -> int:
    """TFLM's StridedSliceStartForAxis: wrap a negative index, clamp, then the begin_mask."""
    start = begin + n if begin < 0 else begin
    start = min(max(start, 0), n) if stride > 0 else min(max(start, -1), n - 1)
    if masked:
        start = 0 if stride > 0 else n - 1
    return start


def _strided_stop(end, start, stride, n, masked, offset) -> int:
    """StridedSliceEndForAxis (shrunk axes aside); with `offset` end counts from start."""
    stop = end + start if offset else end
    stop = stop + n if stop < 0 else stop
    stop = min(max(stop, 0), n) if stride > 0 else min(max(stop, -1), n - 1)
    if masked:
        stop = n if stride > 0 else -1
    return stop


@op("STRIDED_SLICE")
def strided_slice(ctx):
    """begin/end/strides with begin_mask, end_mask and shrink_axis_mask as TFLM's kernel
    computes them; offset (end relative to begin) as LiteRT: TFLM ignores it, but whenever its
    output shape check accepts such a model the start, stride and count, hence the elements,
    are the same. TFLM zeroes ellipsis_mask and new_axis_mask (it would slice differently
    from TensorFlow), so models using them are refused."""
    o = ctx.options(tflite.StridedSliceOptions)
    if o.EllipsisMask() or o.NewAxisMask():
        raise Unsupported("ellipsis_mask / new_axis_mask (TFLM's kernel zeroes them and "
                          "slices unlike TensorFlow)")
    x = ctx.input(0)
    rank = len(x.shape)
    begin = _ints(ctx, 1, "STRIDED_SLICE's begin")
    end = _ints(ctx, 2, "STRIDED_SLICE's end")
    strides = _ints(ctx, 3, "STRIDED_SLICE's strides")
    if not len(begin) == len(end) == len(strides) == rank:
        raise ctx.error(f"begin {begin}, end {end}, strides {strides} need {rank} entries")
    starts, stops, kept = [], [], []
    for d, (b, e, s, n) in enumerate(zip(begin, end, strides, x.shape)):
        if s == 0:
            raise ctx.error(f"stride 0 on axis {d}")
        start = _strided_start(b, s, n, o.BeginMask() >> d & 1)
        if o.ShrinkAxisMask() >> d & 1:
            if s < 0:  # TFLM's loop then runs from start to start + 1 backwards: no element
                raise Unsupported(f"shrink_axis_mask with a negative stride on axis {d} "
                                  "(TFLM writes no output)")
            if not 0 <= start < n:
                raise ctx.error(f"shrunk axis {d}: index {b} outside [{-n}, {n})")
            stop = start + 1
        else:
            stop = _strided_stop(e, start, s, n, o.EndMask() >> d & 1, o.Offset())
            kept.append(len(range(start, stop, s)))
        starts.append(start)
        stops.append(stop)
    _check_shape(ctx, kept)
    return _take(ctx, x, 0, starts, stops, strides)


def _without(shape, axis) -> tuple:
    return tuple(shape[:axis]) + tuple(shape[axis + 1:])


def _split(ctx, x, axis) -> list:
    """One slice per output along `axis`, each as long as that output (as TFLM's kernel)."""
    rank = len(x.shape)
    axis = _axis(ctx, axis, rank)
    nodes, offset = [], 0
    for i in range(len(ctx.outputs)):
        y = ctx.output(i)
        if len(y.shape) != rank or _without(y.shape, axis) != _without(x.shape, axis):
            raise ctx.error(f"output {i} {tuple(y.shape)} is not a part of {tuple(x.shape)} "
                            f"along axis {axis}")
        n = y.shape[axis]
        starts, stops = [0] * rank, list(x.shape)
        starts[axis], stops[axis] = offset, offset + n
        nodes += _take(ctx, x, i, starts, stops, [1] * rank)
        offset += n
    if offset != x.shape[axis]:
        raise ctx.error(f"the outputs cover {offset} of the {x.shape[axis]} elements of axis "
                        f"{axis}")
    return nodes


@op("SPLIT")
def split(ctx):
    """Inputs (axis, x); num_splits equal parts."""
    x = ctx.input(1)
    [axis] = _ints(ctx, 0, "SPLIT's axis")
    parts = len(ctx.outputs)
    if ctx.options(tflite.SplitOptions).NumSplits() not in (0, parts):
        raise ctx.error(f"num_splits {ctx.options(tflite.SplitOptions).NumSplits()} but "
                        f"{parts} outputs")
    axis = _axis(ctx, axis, len(x.shape))
    if x.shape[axis] % parts:
        raise ctx.error(f"axis {axis} of {x.shape[axis]} does not split into {parts} parts")
    return _split(ctx, x, axis)


@op("SPLIT_V")
def split_v(ctx):
    """Inputs (x, size_splits, axis). TFLM sizes the parts by the output shapes; constant
    size_splits (one may be -1: the rest) are checked against them."""
    x = ctx.input(0)
    [axis] = _ints(ctx, 2, "SPLIT_V's axis")
    axis = _axis(ctx, axis, len(x.shape))
    if ctx.input(1).is_const:
        sizes = _ints(ctx, 1, "size_splits")
        if sizes.count(-1) == 1:
            sizes[sizes.index(-1)] = x.shape[axis] - (sum(sizes) + 1)
        outs = [ctx.output(i).shape[axis] if len(ctx.output(i).shape) > axis else None
                for i in range(len(ctx.outputs))]
        if sizes != outs:
            raise ctx.error(f"size_splits {sizes} disagree with the outputs' sizes {outs}")
    return _split(ctx, x, axis)


@op("PACK")
def pack(ctx):
    """N tensors of one shape stacked along a new axis: each input gets the size-1 axis (a
    zero-copy reshape), then one concat."""
    o = ctx.options(tflite.PackOptions)
    xs = [ctx.input(i) for i in range(len(ctx.inputs))]
    y = ctx.output()
    if o.ValuesCount() != len(xs):
        raise ctx.error(f"values_count {o.ValuesCount()} but {len(xs)} inputs")
    shape = tuple(xs[0].shape)
    if any(tuple(x.shape) != shape for x in xs):
        raise ctx.error(f"inputs differ in shape: {[tuple(x.shape) for x in xs]}")
    axis = _axis(ctx, o.Axis(), len(shape) + 1)
    _same_type(ctx, xs, y)
    if any(x.quant != y.quant for x in xs):  # the concat lowering would refuse int8 ones
        raise Unsupported("inputs quantized unlike the output (TFLM copies the raw values)")
    _check_shape(ctx, shape[:axis] + (len(xs),) + shape[axis:])
    if all(x.is_const for x in xs):
        ctx.set_const(0, np.stack([x.data for x in xs], axis))
        return []
    if len(xs) == 1:
        return _alias(ctx, xs[0])
    part = shape[:axis] + (1,) + shape[axis:]
    nodes, names = [], []
    for i, x in enumerate(xs):
        if x.is_const:
            names.append(ctx.new_tensor(f"part{i}", part, x.dtype, np.reshape(x.data, part),
                                        x.quant))
        else:
            names.append(ctx.new_tensor(f"part{i}", part, x.dtype, quant=x.quant))
            nodes.append(Node("reshape", (x.name,), (names[-1],), {}))
    return nodes + [ctx.node("concat", {"axis": axis, "activation": "none"}, inputs=names)]


@op("UNPACK")
def unpack(ctx):
    """num outputs, one per index of `axis`, that axis removed."""
    o = ctx.options(tflite.UnpackOptions)
    x = ctx.input(0)
    rank = len(x.shape)
    axis = _axis(ctx, o.Axis(), rank)
    count = len(ctx.outputs)
    if o.Num() != count or x.shape[axis] != count:
        raise ctx.error(f"num {o.Num()}, {count} outputs, axis {axis} of {x.shape[axis]}")
    _same_type(ctx, [ctx.output(i) for i in range(count)], x)
    nodes = []
    for i in range(count):
        _check_shape(ctx, _without(x.shape, axis), i)
        starts, stops = [0] * rank, list(x.shape)
        starts[axis], stops[axis] = i, i + 1
        nodes += _take(ctx, x, i, starts, stops, [1] * rank)
    return nodes


@op("EXPAND_DIMS")
def expand_dims(ctx):
    x, y = ctx.input(0), ctx.output()
    rank = len(x.shape)
    if ctx.input(1).is_const:
        [axis] = _ints(ctx, 1, "EXPAND_DIMS's axis")
        axis = _axis(ctx, axis, rank + 1)
        _check_shape(ctx, x.shape[:axis] + (1,) + x.shape[axis:])
    elif len(y.shape) != rank + 1:
        raise ctx.error(f"output rank {len(y.shape)}, expected {rank + 1}")
    return _alias(ctx, x)


@op("SHAPE")
def shape(ctx):
    """Shapes are static: the output is a constant (int32, or int64 by out_type)."""
    x = ctx.input(0)
    _check_shape(ctx, [len(x.shape)])
    if ctx.output().dtype not in ("int32", "int64"):
        raise ctx.error(f"out_type {ctx.output().dtype}")
    ctx.set_const(0, np.asarray(x.shape, np.int64))
    return []


@op("FILL")
def fill(ctx):
    """Inputs (dims, value): value (a scalar of the output's type) everywhere."""
    value, y = ctx.input(1), ctx.output()
    if ctx.input(0).is_const:
        _check_shape(ctx, _ints(ctx, 0, "FILL's dims"))
    if value.size != 1 or value.dtype != y.dtype:
        raise ctx.error(f"value {value.dtype}{list(value.shape)} is not one {y.dtype}")
    if value.is_const:
        ctx.set_const(0, np.full(y.shape, np.asarray(value.data).reshape(())))
        return []
    return ctx.node("broadcast_to", {}, inputs=ctx.inputs[1:2])


def _broadcast_args(a, b) -> list:
    """TFLM's BroadcastArgs, from the last axis: a 1 takes the other side's size."""
    n = max(len(a), len(b))
    a, b = [1] * (n - len(a)) + list(a), [1] * (n - len(b)) + list(b)
    if any(p != q and 1 not in (p, q) for p, q in zip(a, b)):
        raise ValueError(f"shapes {a} and {b} do not broadcast")
    return [q if p == 1 else p for p, q in zip(a, b)]


@op("BROADCAST_ARGS")
def broadcast_args(ctx):
    """The broadcast of two shape vectors. Constant: folded. At run time: both padded in
    front with 1s, then y = where(a == 1, b, a) (TFLM checks equality of the rest)."""
    a, b, y = ctx.input(0), ctx.input(1), ctx.output()
    if not a.dtype == b.dtype == y.dtype or a.dtype not in ("int32", "int64"):
        raise ctx.error("shapes and output must be all int32 or all int64")
    if len(a.shape) != 1 or len(b.shape) != 1:
        raise ctx.error("shapes must be vectors")
    n = max(a.size, b.size)
    _check_shape(ctx, [n])
    if a.is_const and b.is_const:
        try:
            ctx.set_const(0, _broadcast_args(a.data.tolist(), b.data.tolist()))
        except ValueError as e:
            raise ctx.error(str(e)) from None
        return []
    nodes, padded = [], []
    for i, t in enumerate((a, b)):
        if t.size == n:
            padded.append(t.name)
        elif t.is_const:
            data = np.concatenate([np.ones(n - t.size, t.dtype), t.data])
            padded.append(ctx.new_tensor(f"padded{i}", [n], t.dtype, data))
        else:
            one = ctx.new_tensor(f"one{i}", [1], t.dtype, np.ones(1, t.dtype))
            padded.append(ctx.new_tensor(f"padded{i}", [n], t.dtype))
            nodes.append(Node("pad", (t.name, "", one), (padded[-1],),
                              {"pads": ((n - t.size, 0),)}))
    one = ctx.new_tensor("one", [], a.dtype, np.ones((), a.dtype))
    is_one = ctx.new_tensor("a_is_one", [n], "bool")
    nodes.append(Node("binary", (padded[0], one), (is_one,), {"fn": "equal"}))
    return nodes + [ctx.node("where", {}, inputs=(is_one, padded[1], padded[0]))]


@op("BROADCAST_TO")
def broadcast_to(ctx):
    """Inputs (x, shape): numpy broadcasting to the output's (static) shape."""
    x, y = ctx.input(0), ctx.output()
    if ctx.input(1).is_const:
        _check_shape(ctx, _ints(ctx, 1, "BROADCAST_TO's shape"))
    lead = len(y.shape) - len(x.shape)
    if lead < 0 or any(n not in (1, m) for n, m in zip(x.shape, y.shape[lead:])):
        raise ctx.error(f"{tuple(x.shape)} does not broadcast to {tuple(y.shape)}")
    _same_type(ctx, [x], y)
    if x.is_const:
        ctx.set_const(0, np.broadcast_to(x.data, y.shape))
        return []
    if x.size == y.size:
        return _alias(ctx, x)
    return ctx.node("broadcast_to", {}, inputs=ctx.inputs[:1])


@op("TILE")
def tile(ctx):
    """Inputs (x, multiples); the repeats follow from the static shapes (and are checked
    against constant multiples)."""
    x, y = ctx.input(0), ctx.output()
    if len(x.shape) != len(y.shape) or any(m % n for n, m in zip(x.shape, y.shape)):
        raise ctx.error(f"{tuple(y.shape)} is not a tiling of {tuple(x.shape)}")
    reps = tuple(m // n for n, m in zip(x.shape, y.shape))
    if ctx.input(1).is_const and tuple(_ints(ctx, 1, "TILE's multiples")) != reps:
        raise ctx.error(f"multiples {_ints(ctx, 1, 'multiples')}, the shapes say {reps}")
    _same_type(ctx, [x], y)
    if x.is_const:
        ctx.set_const(0, np.tile(x.data, reps))
        return []
    if x.size == y.size:
        return _alias(ctx, x)
    return ctx.node("tile", {"repeats": reps}, inputs=ctx.inputs[:1])
