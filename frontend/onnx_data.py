"""ONNX converters for data movement and reductions: reshapes, transpose, concat, pad, slice,
split, tile, expand, gathers, depth/space rearrangements, resize, cumsum, reductions.

Parameters that decide the shape of the generated loops (reshape shapes, pads, slice bounds,
axes, repeats, resize scales) must be constants; a parameter computed at run time makes the
node Unsupported. Output shapes always come from ONNX shape inference. See
frontend/onnx_registry.py for the converter conventions.
"""
from __future__ import annotations

import math

import numpy as np

from .onnx_registry import Unsupported, from_nhwc, onnx_op, to_nhwc


def _values(t, what: str):
    """The data of an optional constant parameter input (None when absent)."""
    if t is None:
        return None
    if not t.is_const:
        raise Unsupported(f"{what} is computed at run time; it must be a constant")
    return np.asarray(t.data)


def _axis(a, rank: int) -> int:
    a = int(a)
    if not -rank <= a < rank:
        raise Unsupported(f"axis {a} is out of range for rank {rank}")
    return a + rank if a < 0 else a


def _alias(ctx, x) -> None:
    """The output is the input with another shape: the zero-copy reshape."""
    out = ctx.out()
    if x.size != out.size or x.dtype != out.dtype:
        raise Unsupported(f"reshape changes size or type: {x.shape} -> {out.shape}")
    if x.is_const:  # an alias of flash data would need arena memory nobody writes
        _constant(ctx, np.asarray(x.data))
    else:
        ctx.emit("reshape", [x])


def _constant(ctx, value) -> None:
    """Write a compile-time value into the output (a copy kernel: outputs are arena tensors)."""
    out = ctx.out()
    data = np.asarray(value).astype(out.dtype)
    data = data.reshape(out.shape) if data.size == out.size else np.broadcast_to(data, out.shape)
    ctx.emit("broadcast_to", [ctx.const(np.ascontiguousarray(data), out.dtype)])


@onnx_op("Reshape")
def Reshape(ctx, x, shape_input=None, shape=None, allowzero=0, consumed_inputs=None):
    _alias(ctx, x)


@onnx_op("Flatten")
def Flatten(ctx, x, axis=1):
    _alias(ctx, x)


@onnx_op("Squeeze")
def Squeeze(ctx, x, axes_input=None, axes=None):
    _alias(ctx, x)


@onnx_op("Unsqueeze")
def Unsqueeze(ctx, x, axes_input=None, axes=None):
    _alias(ctx, x)


@onnx_op("Transpose")
def Transpose(ctx, x, perm=None):
    rank = len(x.shape)
    perm = tuple(int(p) for p in perm) if perm else tuple(reversed(range(rank)))
    ctx.emit("transpose", [x], perm=tuple(_axis(p, rank) for p in perm))


@onnx_op("Concat")
def Concat(ctx, *xs, axis=1):
    ctx.emit("concat", list(xs), axis=_axis(axis, len(ctx.out().shape)), activation="none")


@onnx_op("Pad", since=1)
def Pad_2(ctx, x, pads=None, paddings=None, mode="constant", value=0.0):
    """Pad-1/2: pads and value are attributes."""
    _pad(ctx, x, pads if pads is not None else paddings, mode, value, None)


@onnx_op("Pad", since=11)
def Pad(ctx, x, pads, constant_value=None, axes=None, mode="constant"):
    value = _values(constant_value, "Pad's constant_value")
    _pad(ctx, x, _values(pads, "Pad's pads"), mode,
         None if value is None or value.size == 0 else value.reshape(-1)[0],
         _values(axes, "Pad's axes"))


def _pad(ctx, x, pads, mode: str, value, axes) -> None:
    rank = len(x.shape)
    if mode not in ("constant", "reflect", "edge", "wrap"):
        raise Unsupported(f"Pad mode '{mode}'")
    pads = [int(p) for p in np.asarray(pads).reshape(-1)]
    axes = [_axis(a, rank) for a in (range(rank) if axes is None else axes.reshape(-1))]
    if len(pads) != 2 * len(axes):
        raise Unsupported(f"Pad: {len(pads)} pads for {len(axes)} axes")
    per_dim = [(0, 0)] * rank
    for k, a in enumerate(axes):
        per_dim[a] = (pads[k], pads[k + len(axes)])
    inputs = [x, None]
    if mode == "constant" and value is not None:
        inputs.append(ctx.const(np.asarray(value).astype(x.dtype).reshape(1), x.dtype))
    ctx.emit("pad", inputs, pads=tuple(per_dim), mode=mode)


def _slice_axis(start: int, end: int, step: int, n: int) -> tuple:
    """(start, end, count) of one axis, clamped as ONNX defines (end -1 = before element 0)."""
    start = start + n if start < 0 else start
    end = end + n if end < 0 else end
    if step > 0:
        start, end = min(max(start, 0), n), min(max(end, 0), n)
    else:
        start, end = min(max(start, 0), n - 1), min(max(end, -1), n - 1)
    return start, end, max(0, math.ceil((end - start) / step))


def _slice(ctx, x, starts, ends, axes, steps) -> None:
    rank = len(x.shape)
    starts = [int(v) for v in np.asarray(starts).reshape(-1)]
    ends = [int(v) for v in np.asarray(ends).reshape(-1)]
    axes = list(range(len(starts))) if axes is None else [int(a) for a in np.reshape(axes, -1)]
    steps = [1] * len(starts) if steps is None else [int(v) for v in np.reshape(steps, -1)]
    if not len(starts) == len(ends) == len(axes) == len(steps):
        raise Unsupported("Slice: starts, ends, axes and steps differ in length")
    begin, stop, step = [0] * rank, list(x.shape), [1] * rank
    for s, e, a, st in zip(starts, ends, axes, steps):
        a = _axis(a, rank)
        if st == 0:
            raise Unsupported("Slice step 0")
        b, en, count = _slice_axis(s, e, st, x.shape[a])
        if count != ctx.out().shape[a]:
            raise Unsupported(f"Slice: axis {a} gives {count} elements, shape inference says "
                              f"{ctx.out().shape[a]}")
        begin[a], stop[a], step[a] = b, (None if en < 0 else en), st
    ctx.emit("slice", [x], starts=tuple(begin), ends=tuple(stop), steps=tuple(step))


@onnx_op("Slice", since=1)
def Slice_1(ctx, x, starts=None, ends=None, axes=None):
    """Slice-1: starts, ends and axes are attributes."""
    _slice(ctx, x, starts, ends, axes, None)


@onnx_op("Slice", since=10)
def Slice(ctx, x, starts, ends, axes=None, steps=None):
    _slice(ctx, x, _values(starts, "Slice's starts"), _values(ends, "Slice's ends"),
           _values(axes, "Slice's axes"), _values(steps, "Slice's steps"))


@onnx_op("Split")
def Split(ctx, x, split=None, axis=0, num_outputs=None):
    """One slice per output; the part sizes are the outputs' inferred shapes."""
    rank = len(x.shape)
    a = _axis(axis, rank)
    offset = 0
    for out in ctx.outputs:
        if out is None:
            raise Unsupported("Split with an unnamed output")
        n = out.shape[a]
        if n == x.shape[a]:
            ctx.emit("reshape", [x], [out])
        else:
            begin, stop = [0] * rank, list(x.shape)
            begin[a], stop[a] = offset, offset + n
            ctx.emit("slice", [x], [out], starts=tuple(begin), ends=tuple(stop),
                     steps=(1,) * rank)
        offset += n
    if offset != x.shape[a]:
        raise Unsupported(f"Split: parts of {offset} elements for an axis of {x.shape[a]}")


@onnx_op("Tile", since=6)
def Tile(ctx, x, repeats):
    reps = tuple(int(r) for r in _values(repeats, "Tile's repeats").reshape(-1))
    ctx.emit("tile", [x], repeats=reps)


@onnx_op("Expand", since=8)
def Expand(ctx, x, shape):
    ctx.emit("broadcast_to", [x])


@onnx_op("Gather")
def Gather(ctx, data, indices, axis=0):
    ctx.emit("gather", [data, indices], axis=_axis(axis, len(data.shape)))


@onnx_op("GatherElements", since=11)
def GatherElements(ctx, data, indices, axis=0):
    ctx.emit("gather_elements", [data, indices], axis=_axis(axis, len(data.shape)))


def _nchw_block_op(ctx, x, op: str, block, mode: str) -> None:
    """ONNX's NCHW DepthToSpace/SpaceToDepth as the NHWC graph op between two transposes."""
    if len(x.shape) != 4 or block is None:
        raise Unsupported(f"{op} needs a 4-D input and a blocksize")
    if mode not in ("DCR", "CRD"):
        raise Unsupported(f"{op} mode '{mode}'")
    out = ctx.out()
    n, c, h, w = out.shape
    y = ctx.tmp((n, h, w, c), out.dtype, "nhwc_out")
    ctx.emit(op, [to_nhwc(ctx, x)], [y], block=int(block), mode=mode)
    from_nhwc(ctx, y, out)


@onnx_op("DepthToSpace")
def DepthToSpace(ctx, x, blocksize=None, mode="DCR"):
    _nchw_block_op(ctx, x, "depth_to_space", blocksize, mode)


@onnx_op("SpaceToDepth")
def SpaceToDepth(ctx, x, blocksize=None, mode="DCR"):
    _nchw_block_op(ctx, x, "space_to_depth", blocksize, mode)


@onnx_op("Resize", since=11)
def Resize(ctx, x, roi=None, scales=None, sizes=None, mode="nearest",
           coordinate_transformation_mode="half_pixel", nearest_mode="round_prefer_floor",
           cubic_coeff_a=-0.75, exclude_outside=0, extrapolation_value=0.0, antialias=0,
           axes=None, keep_aspect_ratio_policy="stretch"):
    rank = len(x.shape)
    axes = list(range(rank)) if axes is None else [_axis(a, rank) for a in axes]
    scales, sizes = _values(scales, "Resize's scales"), _values(sizes, "Resize's sizes")
    out = ctx.out()
    full = [1.0] * rank
    if scales is not None and scales.size:
        for a, s in zip(axes, scales.reshape(-1)):
            full[a] = float(s)
    elif sizes is not None and sizes.size:
        ratios = [out.shape[a] / x.shape[a] for a in axes]
        if keep_aspect_ratio_policy != "stretch":
            ratios = [(min if keep_aspect_ratio_policy == "not_larger" else max)(
                int(s) / x.shape[a] for a, s in zip(axes, sizes.reshape(-1)))] * len(axes)
        for a, r in zip(axes, ratios):
            full[a] = r
    else:
        raise Unsupported("Resize without scales or sizes")
    box = [(0.0, 1.0)] * rank
    if coordinate_transformation_mode == "tf_crop_and_resize":
        if roi is None:
            raise Unsupported("Resize tf_crop_and_resize without roi")
        r = _values(roi, "Resize's roi").reshape(-1).astype(float)
        for k, a in enumerate(axes):
            box[a] = (float(r[k]), float(r[k + len(axes)]))
    _resize(ctx, x, mode, coordinate_transformation_mode, nearest_mode, cubic_coeff_a, full,
            box, exclude_outside, extrapolation_value, antialias)


@onnx_op("Resize", since=10)
def Resize_10(ctx, x, scales, mode="nearest"):
    """Resize-10 (and Upsample): asymmetric coordinates, nearest rounds down."""
    s = _values(scales, "Resize's scales").reshape(-1)
    _resize(ctx, x, mode, "asymmetric", "floor", -0.75, [float(v) for v in s],
            [(0.0, 1.0)] * len(x.shape), 0, 0.0, 0)


@onnx_op("Upsample", since=7)
def Upsample(ctx, x, scales_input=None, scales=None, mode="nearest"):
    s = scales if scales is not None else _values(scales_input, "Upsample's scales")
    _resize(ctx, x, mode, "asymmetric", "floor", -0.75, [float(v) for v in np.reshape(s, -1)],
            [(0.0, 1.0)] * len(x.shape), 0, 0.0, 0)


def _resize(ctx, x, mode, ctm, nearest_mode, cubic_a, scales, roi, exclude_outside,
            extrapolation_value, antialias) -> None:
    if mode == "bilinear":
        mode = "linear"
    if mode not in ("nearest", "linear", "cubic"):
        raise Unsupported(f"Resize mode '{mode}'")
    if mode != "nearest" and x.dtype != "float32":
        raise Unsupported(f"Resize mode '{mode}' on {x.dtype}")
    if mode == "nearest" and antialias:
        raise Unsupported("Resize nearest with antialias")
    if ctm not in ("half_pixel", "half_pixel_symmetric", "pytorch_half_pixel", "align_corners",
                   "asymmetric", "tf_crop_and_resize"):
        raise Unsupported(f"Resize coordinate_transformation_mode '{ctm}'")
    if nearest_mode not in ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil"):
        raise Unsupported(f"Resize nearest_mode '{nearest_mode}'")
    if len(scales) != len(x.shape) or any(s <= 0 for s in scales):
        raise Unsupported(f"Resize scales {scales}")
    ctx.emit("resize", [x], mode=mode, coordinate_transformation=ctm, nearest_mode=nearest_mode,
             cubic_coeff_a=float(cubic_a), scales=tuple(scales), roi=tuple(roi),
             exclude_outside=bool(exclude_outside),
             extrapolation_value=float(extrapolation_value), antialias=bool(antialias))


@onnx_op("CumSum", since=11)
def CumSum(ctx, x, axis, exclusive=0, reverse=0):
    if x.dtype not in ("float32", "int32", "int64"):
        raise Unsupported(f"CumSum on {x.dtype}")
    a = _axis(_values(axis, "CumSum's axis").reshape(-1)[0], len(x.shape))
    ctx.emit("cumsum", [x], axis=a, exclusive=bool(exclusive), reverse=bool(reverse))


REDUCE_FNS = {"ReduceMean": "mean", "ReduceMax": "max", "ReduceMin": "min", "ReduceSum": "sum",
              "ReduceProd": "prod", "ReduceL1": "l1", "ReduceL2": "l2",
              "ReduceSumSquare": "sum_square", "ReduceLogSum": "log_sum",
              "ReduceLogSumExp": "log_sum_exp"}


@onnx_op(*REDUCE_FNS)
def Reduce(ctx, x, axes=None, keepdims=1, noop_with_empty_axes=0):
    """Every Reduce*: axes as an attribute (older opsets) or a constant input."""
    fn = REDUCE_FNS[ctx.node.op_type]
    rank = len(x.shape)
    if axes is not None and not isinstance(axes, (list, tuple)):
        axes = _values(axes, f"{ctx.node.op_type}'s axes")
    axes = [] if axes is None else [_axis(a, rank) for a in np.reshape(axes, -1)]
    if not axes and noop_with_empty_axes:
        _alias(ctx, x)
        return
    if x.dtype == "bool" and fn not in ("max", "min") or x.dtype not in (
            "float32", "bool") and fn in ("l2", "log_sum", "log_sum_exp"):
        raise Unsupported(f"{ctx.node.op_type} on {x.dtype}")
    ctx.emit("reduce", [x], fn=fn, axes=tuple(sorted(set(axes or range(rank)))),
             keep_dims=bool(keepdims))


@onnx_op("ArgMax", "ArgMin")
def ArgMax(ctx, x, axis=0, keepdims=1, select_last_index=0):
    """ArgMax and ArgMin: the index (int64) of the first (or last) extreme along the axis."""
    ctx.emit("arg_reduce", [x], fn="max" if ctx.node.op_type == "ArgMax" else "min",
             axis=_axis(axis, len(x.shape)), keep_dims=bool(keepdims),
             select_last_index=bool(select_last_index))


@onnx_op("Constant")
def Constant(ctx, value=None, value_float=None, value_floats=None, value_int=None,
             value_ints=None, value_string=None, value_strings=None, sparse_value=None):
    """Constant nodes have no inputs, so the importer folds them; only a value the reference
    evaluator cannot produce (strings, sparse tensors) gets here."""
    raise Unsupported("a Constant the importer could not evaluate")


@onnx_op("Range", since=11)
def Range(ctx, start, limit, delta):
    """Folded at import when its inputs are constants; from run-time values its length is
    unknown (shape inference would have stopped the import before)."""
    raise Unsupported("Range of values computed at run time")


# Shapes are static: these are compile-time values even when their input is computed at run
# time (with constant inputs the importer has already folded them).
@onnx_op("Shape")
def Shape(ctx, x, start=0, end=None):
    _constant(ctx, np.array(x.shape[slice(start, end)], dtype=np.int64))


@onnx_op("Size")
def Size(ctx, x):
    _constant(ctx, np.array(x.size, dtype=np.int64))


@onnx_op("ConstantOfShape", since=9)
def ConstantOfShape(ctx, shape, value=None):
    from onnx import numpy_helper
    _constant(ctx, 0 if value is None else numpy_helper.to_array(value).reshape(-1)[0])
