"""Generic data movement: slice, tile, broadcast_to, gather, gather_elements, depth_to_space,
space_to_depth and resize. Any element type; every source index is an expression of the loop
variables, a run-time index load, or a load from a small constant table computed here."""
from __future__ import annotations

import numpy as np

from .. import loop_ir as ir
from . import OpContext, const, describe, lowers
from .elementwise import broadcast_index, operand_names


def _copy(ctx: OpContext, src_index, extra: str = "") -> ir.Kernel:
    """y[idx] = x[src_index(idx)] over the output's index space (x may be a constant)."""
    x, y = ctx.input(0), ctx.output()
    names, consts = operand_names(ctx)
    shape = tuple(y.shape)

    def body(*idx):
        return [ir.Store("y", ir.flat_index(list(idx), shape),
                         ir.Load(names[0], src_index(list(idx)), x.dtype))]
    loop = ir.loops([(f"i{d}", n) for d, n in enumerate(shape)], body)
    consts = [c for c in consts if c.name == "c0"]
    return ir.Kernel(ctx.name, tuple(ctx.io_buffers() + consts), loop, describe(ctx, extra))


@lowers("slice")
def slice_(ctx: OpContext) -> ir.Kernel:
    x = ctx.input(0)
    starts, steps = ctx.attrs["starts"], ctx.attrs["steps"]
    return _copy(ctx, lambda idx: ir.flat_index(
        [s + i * st if st > 0 else s - i * -st for i, s, st in zip(idx, starts, steps)],
        x.shape), f"starts {tuple(starts)}, steps {tuple(steps)}")


@lowers("broadcast_to")
def broadcast_to(ctx: OpContext) -> ir.Kernel:
    x, y = ctx.input(0), ctx.output()
    if x.size == y.size:
        return _copy(ctx, lambda idx: ir.flat_index(idx, y.shape))
    return _copy(ctx, lambda idx: broadcast_index(x.shape, y.shape, idx))


@lowers("tile")
def tile(ctx: OpContext) -> ir.Kernel:
    """Loops over (repeat, element) per axis: output coordinate = repeat * n + element."""
    x, y = ctx.input(0), ctx.output()
    reps = ctx.attrs["repeats"]
    names, consts = operand_names(ctx)
    extents = [e for d, (n, r) in enumerate(zip(x.shape, reps))
               for e in ((f"r{d}", r), (f"i{d}", n))]

    def body(*v):
        rs, idx = v[0::2], list(v[1::2])
        out = [r * n + i for r, n, i in zip(rs, x.shape, idx)]
        return [ir.Store("y", ir.flat_index(out, y.shape),
                         ir.Load(names[0], ir.flat_index(idx, x.shape), x.dtype))]
    return ir.Kernel(ctx.name, tuple(ctx.io_buffers() + consts), ir.loops(extents, body),
                     describe(ctx, f"repeats {tuple(reps)}"))


def _index(ctx: OpContext, i: int, flat: ir.Expr, n: int, tables: list) -> tuple:
    """(statements, expr): input i's index at `flat` into an axis of n, negative values counting
    from the end. Constant indices become a normalised table; run-time ones are wrapped and
    clamped so that a bad index cannot read outside the buffer."""
    t = ctx.input(i)
    if t.is_const:
        v = np.asarray(t.data).reshape(-1).astype(np.int64)
        v = np.where(v < 0, v + n, v)
        if ((v < 0) | (v >= n)).any():
            raise ValueError(f"{ctx.node.op} index out of range [{-n}, {n})")
        if (v == v[0]).all():
            return [], ir.Const(int(v[0]))
        tables.append(const("k", v, "int32", "indices, negative ones wrapped"))
        return [], ir.Load("k", flat, "int32")
    names, _ = operand_names(ctx)
    k = ir.Var("k")
    load = ir.cast(ir.Load(names[i], flat, t.dtype), "int32")
    return [ir.Decl("k", "int32", load)], ir.clamp(ir.select(k.lt(0), k + n, k), 0, n - 1)


@lowers("gather")
def gather(ctx: OpContext) -> ir.Kernel:
    data, ind, y = ctx.input(0), ctx.input(1), ctx.output()
    axis = ctx.attrs["axis"]
    names, consts = operand_names(ctx)
    outer, inner = data.shape[:axis], data.shape[axis + 1:]
    tables = []

    def at(*v):  # outer coordinates, then indices coordinates; copy the inner block
        o, j = list(v[:len(outer)]), list(v[len(outer):])
        pre, k = _index(ctx, 1, ir.flat_index(j, ind.shape), data.shape[axis], tables)
        copy = ir.loops([(f"i{d}", n) for d, n in enumerate(inner)], lambda *i: [
            ir.Store("y", ir.flat_index(o + j + list(i), y.shape),
                     ir.Load(names[0], ir.flat_index(o + [k] + list(i), data.shape),
                             data.dtype))])
        return pre + list(copy)
    body = ir.loops([(f"o{d}", n) for d, n in enumerate(outer)]
                    + [(f"j{d}", n) for d, n in enumerate(ind.shape)], at)
    consts = [c for c in consts if c.name != "c1"]
    return ir.Kernel(ctx.name, tuple(ctx.io_buffers() + consts + tables), body,
                     describe(ctx, f"axis {axis}"))


@lowers("gather_elements")
def gather_elements(ctx: OpContext) -> ir.Kernel:
    """y[i] = data[i with the axis coordinate replaced by indices[i]]."""
    data, y = ctx.input(0), ctx.output()
    axis = ctx.attrs["axis"]
    names, consts = operand_names(ctx)
    tables = []

    def body(*idx):
        flat = ir.flat_index(list(idx), y.shape)
        pre, k = _index(ctx, 1, flat, data.shape[axis], tables)
        src = list(idx)
        src[axis] = k
        return pre + [ir.Store("y", flat, ir.Load(names[0], ir.flat_index(src, data.shape),
                                                  data.dtype))]
    loop = ir.loops([(f"i{d}", n) for d, n in enumerate(y.shape)], body)
    consts = [c for c in consts if c.name != "c1"]
    return ir.Kernel(ctx.name, tuple(ctx.io_buffers() + consts + tables), loop,
                     describe(ctx, f"axis {axis}"))


def _block_channel(mode: str, dh, dw, c, b: int, channels: int) -> ir.Expr:
    """Channel of the deep tensor holding block offset (dh, dw) of channel c of the shallow one:
    DCR orders blocks before channels, CRD channels before blocks."""
    if mode == "CRD":
        return (c * b + dh) * b + dw
    return (dh * b + dw) * channels + c


@lowers("depth_to_space")
def depth_to_space(ctx: OpContext) -> ir.Kernel:
    x, y = ctx.input(0), ctx.output()
    b, mode = ctx.attrs["block"], ctx.attrs.get("mode", "DCR")
    n, h, w, c = x.shape
    co = c // (b * b)
    extents = [("n", n), ("h", h), ("dh", b), ("w", w), ("dw", b), ("c", co)]

    def body(vn, vh, vdh, vw, vdw, vc):
        src = [vn, vh, vw, _block_channel(mode, vdh, vdw, vc, b, co)]
        return [ir.Store("y", ir.flat_index([vn, vh * b + vdh, vw * b + vdw, vc], y.shape),
                         ir.Load("x", ir.flat_index(src, x.shape), x.dtype))]
    return ir.Kernel(ctx.name, tuple(ctx.io_buffers()), ir.loops(extents, body),
                     describe(ctx, f"block {b}, mode {mode}"))


@lowers("space_to_depth")
def space_to_depth(ctx: OpContext) -> ir.Kernel:
    x, y = ctx.input(0), ctx.output()
    b, mode = ctx.attrs["block"], ctx.attrs.get("mode", "DCR")
    n, h, w, c = y.shape
    ci = x.shape[3]
    extents = [("n", n), ("h", h), ("w", w), ("dh", b), ("dw", b), ("c", ci)]

    def body(vn, vh, vw, vdh, vdw, vc):
        dst = [vn, vh, vw, _block_channel(mode, vdh, vdw, vc, b, ci)]
        return [ir.Store("y", ir.flat_index(dst, y.shape),
                         ir.Load("x", ir.flat_index([vn, vh * b + vdh, vw * b + vdw, vc], x.shape),
                                 x.dtype))]
    return ir.Kernel(ctx.name, tuple(ctx.io_buffers()), ir.loops(extents, body),
                     describe(ctx, f"block {b}, mode {mode}"))


# ---- resize: per axis, each output coordinate reads T taps (source index, weight) ----

def _source_coords(ctm: str, n_in: int, n_out: int, scale: float, roi) -> np.ndarray:
    """The input coordinate of every output coordinate along one axis (the ONNX formulas)."""
    y = np.arange(n_out, dtype=np.float64)
    width = scale * n_in  # the fractional output length
    if ctm == "align_corners":  # integer lengths, as the spec text and onnxruntime
        return np.zeros(n_out) if n_out == 1 else y * (n_in - 1) / (n_out - 1)
    if ctm == "asymmetric":
        return y / scale
    if ctm == "tf_crop_and_resize":
        start, end = roi
        if n_out == 1:
            return np.full(n_out, (end - start) * (n_in - 1) / 2 + start * (n_in - 1))
        return y * (end - start) * (n_in - 1) / (n_out - 1) + start * (n_in - 1)
    if ctm == "pytorch_half_pixel" and n_out == 1:
        return np.full(n_out, -0.5)
    offset = 0.0
    if ctm == "half_pixel_symmetric":
        offset = n_in / 2 * (1 - n_out / width)
    return offset + (y + 0.5) / scale - 0.5


def _coeffs(attrs: dict, ratio: float, scale: float) -> np.ndarray:
    """Weights of the taps around a coordinate whose distance past its left tap is ratio."""
    mode, a = attrs["mode"], attrs["cubic_coeff_a"]
    if mode == "nearest":
        up = {"round_prefer_floor": ratio > 0.5, "round_prefer_ceil": ratio >= 0.5,
              "floor": ratio == 1, "ceil": True}[attrs["nearest_mode"]]
        return np.array([not up, up], dtype=np.float64)
    if attrs.get("antialias") and scale < 1:
        reach = 1 if mode == "linear" else 2
        start = int(np.floor(-reach / scale) + 1)
        args = np.abs((np.arange(start, 2 - start) - ratio) * scale)
        if mode == "linear":
            w = np.clip(1 - args, 0, 1)
        else:
            w = np.where(args <= 1, ((a + 2) * args - (a + 3)) * args * args + 1,
                         np.where(args < 2, ((a * args - 5 * a) * args + 8 * a) * args - 4 * a, 0))
        return w / w.sum()
    if mode == "linear":
        return np.array([1 - ratio, ratio])
    d = np.array([1 + ratio, ratio, 1 - ratio, 2 - ratio])
    near = ((a + 2) * d - (a + 3)) * d * d + 1
    far = ((a * d - 5 * a) * d + 8 * a) * d - 4 * a
    return np.where(d <= 1, near, far)


def resize_taps(attrs: dict, n_in: int, n_out: int, scale: float, roi) -> tuple:
    """(indices [n_out, T], weights [n_out, T], extrapolated [n_out] or None) of one axis.
    Taps are the T inputs nearest the source coordinate, the left one preferred; indices past
    the edges are clamped (edge padding) or, with exclude_outside, weighted 0."""
    x = _source_coords(attrs["coordinate_transformation"], n_in, n_out, scale, roi)
    left = np.floor(x)
    ratio = np.where(x == left, 1.0, x - left)  # in (0, 1]: an exact hit is the right tap
    w = np.stack([_coeffs(attrs, r, scale) for r in ratio])
    t = w.shape[1]
    first = left.astype(np.int64) - (t // 2 - 1) - (ratio == 1)  # even T: around the centre
    idx = first[:, None] + np.arange(t)[None, :]
    if attrs.get("exclude_outside"):
        w = np.where((idx < 0) | (idx >= n_in), 0.0, w)
        w = w / np.where(w.sum(axis=1, keepdims=True) == 0, 1, w.sum(axis=1, keepdims=True))
    idx = np.clip(idx, 0, n_in - 1)
    outside = None
    if attrs["coordinate_transformation"] == "tf_crop_and_resize":
        outside = (x < 0) | (x > n_in - 1)
    return idx, w, outside


@lowers("resize")
def resize(ctx: OpContext) -> ir.Kernel:
    """Separable: per axis a table of source indices (and for linear/cubic weights); an axis
    the resize leaves unchanged reads its loop variable directly."""
    x, y = ctx.input(0), ctx.output()
    attrs = ctx.attrs
    rank = len(x.shape)
    scales = attrs.get("scales") or [y.shape[d] / x.shape[d] for d in range(rank)]
    roi = attrs.get("roi") or [(0.0, 1.0)] * rank
    nearest = attrs["mode"] == "nearest"
    axes, bufs, masks = [], [], []  # axes: (dim, taps per output coordinate) of the resized
    for d in range(rank):
        idx, w, outside = resize_taps(attrs, x.shape[d], y.shape[d], scales[d], roi[d])
        if nearest or ((w == 0) | (w == 1)).all():  # one tap of weight 1: an index table
            idx, w = idx[np.arange(len(idx)), np.argmax(w, axis=1)][:, None], None
        if outside is not None and outside.any():
            masks.append(d)
            bufs.append(const(f"e{d}", outside, "uint8", f"axis {d}: extrapolated"))
        if w is None and x.shape[d] == y.shape[d] and (idx[:, 0] == np.arange(y.shape[d])).all():
            continue  # identity
        if w is not None:
            bufs.append(const(f"w{d}", w.astype(np.float32), "float32", f"axis {d}: weights"))
        bufs.append(const(f"t{d}", idx, "int32", f"axis {d}: source indices"))
        axes.append((d, idx.shape[1]))
    taps = {d: t for d, t in axes}

    def body(*o):
        def src(k):  # source coordinate per axis for tap numbers k[d]
            return [ir.Load(f"t{d}", o[d] * taps[d] + k.get(d, 0), "int32") if d in taps
                    else o[d] for d in range(rank)]
        flat = ir.flat_index(list(o), y.shape)
        weighted = [d for d, t in axes if t > 1]
        if not weighted:
            value = ir.Load("x", ir.flat_index(src({}), x.shape), x.dtype)
            stmts = []
        else:
            def add(*ks):
                k = dict(zip(weighted, ks))
                v = ir.Load("x", ir.flat_index(src(k), x.shape), "float32")
                for d in weighted:
                    v = ir.Load(f"w{d}", o[d] * taps[d] + k[d], "float32") * v
                return [ir.Assign("acc", ir.Var("acc", "float32") + v)]
            stmts = [ir.Decl("acc", "float32", ir.Const(0.0, "float32"))]
            stmts += ir.loops([(f"k{d}", taps[d]) for d in weighted], add)
            value = ir.Var("acc", "float32")
        if masks:
            cond = ir.Load(f"e{masks[0]}", o[masks[0]], "uint8")
            for d in masks[1:]:
                cond = ir.binop("||", cond, ir.Load(f"e{d}", o[d], "uint8"))
            value = ir.select(cond, ir.Const(attrs.get("extrapolation_value", 0.0), "float32"),
                              value)
        return stmts + [ir.Store("y", flat, value)]
    loop = ir.loops([(f"i{d}", n) for d, n in enumerate(y.shape)], body)
    extra = (f"{attrs['mode']}, {attrs['coordinate_transformation']}"
             + (f", {attrs['nearest_mode']}" if nearest else "")
             + f", scales {tuple(round(float(s), 6) for s in scales)}")
    return ir.Kernel(ctx.name, tuple(ctx.io_buffers() + bufs), loop, describe(ctx, extra))
