"""Lowerings: TFLite's quantized reductions and arg-reductions, bit-exact with TFLM.

Registered with `@lowers(op, when=...)` so they serve only the nodes they accept; see
codegen_c/lower/__init__.py. Here:
  - reduce sum of int8/int16 (TFLM's QuantizedMeanOrSum with compute_sum),
  - reduce max/min marked "tflm" (TFLM's reducers, which start from the type's lowest /
    highest value instead of the first element),
  - int8 cumsum (TFLM's quantized CumSum, with its 20-bit left shift),
  - gather with "batch_dims" (TFLite GATHER's leading dimensions shared by data and indices).
The float and plain-integer variants of these ops are the generic lowerings (datamove.py,
generic_data.py).
"""
from __future__ import annotations

import numpy as np

from .. import loop_ir as ir
from .. import qmath
from .. import qparams as qp
from . import OpContext, describe, lowers
from .elementwise import operand_names
from .generic_data import _index

LIMITS = {"int8": (-128, 127), "int16": (-32768, 32767)}
FLT_MAX = float(np.finfo(np.float32).max)


def _q(t):
    return float(t.quant.scale[0]), int(t.quant.zero_point[0])


def _reduction(ctx: OpContext, acc_t: str, init, update, final, extra: str) -> ir.Kernel:
    """One accumulator per output element: `acc = init`, `acc = update(acc, x)` for every input
    element reduced into it (in the input's row-major order, as TFLM's Reduce visits them),
    then y = final(acc)."""
    x, y = ctx.input(0), ctx.output()
    axes, shape = tuple(ctx.attrs["axes"]), tuple(x.shape)
    kept = [d for d in range(len(shape)) if d not in axes]
    acc = ir.Var("acc", acc_t)

    def element(*out_idx):
        idx = dict(zip(kept, out_idx))

        def step(*red_idx):
            full = {**idx, **dict(zip(axes, red_idx))}
            v = ir.Load("x", ir.flat_index([full[d] for d in range(len(shape))], shape), x.dtype)
            return [ir.Decl("v", x.dtype, v), ir.Assign("acc", update(acc, ir.Var("v", x.dtype)))]
        body = [ir.Decl("acc", acc_t, init)]
        body += ir.loops([(f"r{d}", shape[d]) for d in axes], step)
        flat = ir.flat_index(list(out_idx), [shape[d] for d in kept])
        return body + [ir.Store("y", flat, final(acc))]

    loop = ir.loops([(f"i{d}", shape[d]) for d in kept], element)
    return ir.Kernel(ctx.name, tuple(ctx.io_buffers()), loop, describe(
        ctx, f"{extra}, axes {axes}, keep_dims {ctx.attrs['keep_dims']}"))


def _count(ctx: OpContext) -> int:
    shape = ctx.input(0).shape
    return int(np.prod([shape[d] for d in ctx.attrs["axes"]], dtype=np.int64))


@lowers("reduce", when=lambda ctx: ctx.attrs["fn"] == "sum" and ctx.input(0).quant is not None
        and ctx.input(0).dtype in LIMITS)
def quantized_sum(ctx: OpContext) -> ir.Kernel:
    """int32 sum of the raw values, then (TFLM's QuantizedMeanOrSum, compute_sum):
        y = clamp(MBQM(sum - input_zp * count, mult, shift) + output_zp)
    with mult/shift = QuantizeMultiplier(double(input_scale) / double(output_scale)). The
    subtraction is TFLM's int64 one narrowed to int32, i.e. modulo 2^32."""
    x, y = ctx.input(0), ctx.output()
    if y.dtype != x.dtype or y.quant is None:
        raise NotImplementedError(f"quantized sum {x.dtype} -> {y.dtype}")
    (s_in, zp_in), (s_out, zp_out) = _q(x), _q(y)
    mult, shift = qp.quantize_multiplier(qp.f32(s_in) / qp.f32(s_out))
    count = _count(ctx)
    lo, hi = LIMITS[x.dtype]
    offset = qmath.wrap32(zp_in * count)
    # the int32 sum wraps in TFLM; plain C addition only where it provably cannot overflow
    exact = count * max(-lo, hi) < 2**31

    def update(acc, v):
        v = ir.cast(v, "int32")
        return acc + v if exact else ir.call("mf_wrap_add_i32", acc, v)

    def final(acc):
        shifted = acc if offset == 0 else ir.call("mf_wrap_sub_i32", acc, ir.Const(offset))
        out = ir.call("mf_mbqm", shifted, ir.Const(mult), ir.Const(shift))
        if zp_out:
            out = ir.call("mf_wrap_add_i32", out, ir.Const(zp_out))
        return ir.cast(ir.clamp(out, lo, hi), y.dtype)
    return _reduction(ctx, "int32", ir.Const(0), update, final,
                      f"sum of {count}: input_zp * count = {offset}, mult {mult}, "
                      f"shift {shift}")


def _f(v) -> ir.Const:
    return ir.Const(float(np.float32(v)), "float32")


@lowers("reduce", when=lambda ctx: ctx.attrs["fn"] in ("max", "min") and ctx.attrs.get("tflm"))
def reduce_extreme_tflm(ctx: OpContext) -> ir.Kernel:
    """TFLM's ReduceGeneric max/min: acc = lowest (highest) value of the type, then
    acc = (x > acc) ? x : acc (< for min). NaN inputs never replace the accumulator, and a
    float row of -inf (+inf for min) gives -FLT_MAX (FLT_MAX)."""
    x, fn = ctx.input(0), ctx.attrs["fn"]
    if x.dtype == "float32":
        acc_t, lowest, highest = "float32", -FLT_MAX, FLT_MAX
    elif x.dtype in LIMITS:
        acc_t, (lowest, highest) = "int32", LIMITS[x.dtype]
    else:
        raise NotImplementedError(f"TFLM reduce {fn} on {x.dtype}")
    init = lowest if fn == "max" else highest
    better = "gt" if fn == "max" else "lt"
    start = _f(init) if acc_t == "float32" else ir.Const(init)
    return _reduction(ctx, acc_t, start,
                      lambda acc, v: ir.select(getattr(v, better)(acc), v, acc),
                      lambda acc: ir.cast(acc, x.dtype), f"{fn} starting from {init:.9g}")


@lowers("cumsum", when=lambda ctx: ctx.input(0).quant is not None)
def quantized_cumsum(ctx: OpContext) -> ir.Kernel:
    """TFLM's int8 CumSum: every input is rescaled to a common fixed-point form,
        scaled(v) = MBQM_lt1((v - input_zp) << 20, input_mult, input_shift)
    (input multiplier 0.5: input_scale / (2 * input_scale)), accumulated in int32, and each
    running sum is requantized: y = clamp(MBQM_lt1(acc, output_mult, output_shift) + output_zp)
    with output multiplier 2 * input_scale / (2^20 * output_scale). TFLM starts the
    accumulator at scaled(0), i.e. MBQM_lt1(-input_zp << 20, ...), not at zero: with a nonzero
    input zero point every running sum carries that extra term, and so does this kernel."""
    x, y = ctx.input(0), ctx.output()
    if x.dtype != "int8" or y.dtype != "int8":
        raise NotImplementedError(f"quantized cumsum {x.dtype} -> {y.dtype}")
    (s_in, zp_in), (s_out, zp_out) = _q(x), _q(y)
    left_shift = 20
    twice = 2 * qp.f32(s_in)
    in_mult, in_shift = qp.quantize_multiplier_smaller_than_one_exp(qp.f32(s_in) / twice)
    out_mult, out_shift = qp.quantize_multiplier_smaller_than_one_exp(
        twice / ((1 << left_shift) * qp.f32(s_out)))
    start = qmath.mf_mbqm_lt1(-zp_in * (1 << left_shift), in_mult, in_shift)
    axis, exclusive, reverse = ctx.attrs["axis"], ctx.attrs["exclusive"], ctx.attrs["reverse"]
    shape = tuple(x.shape)
    outer = int(np.prod(shape[:axis], dtype=np.int64))
    n, inner = shape[axis], int(np.prod(shape[axis + 1:], dtype=np.int64))
    acc, scaled = ir.Var("acc"), ir.Var("scaled")

    def element(o, i):
        def step(k):
            at = (o * n + ((n - 1) - k if reverse else k)) * inner + i
            v = ir.cast(ir.Load("x", at, "int8"), "int32") - zp_in  # |v| <= 255
            add = ir.Assign("acc", ir.call("mf_wrap_add_i32", acc, scaled))
            out = ir.call("mf_mbqm_lt1", acc, ir.Const(out_mult), ir.Const(out_shift)) + zp_out
            store = ir.Store("y", at, ir.cast(ir.clamp(out, -128, 127), "int8"))
            return [ir.Decl("scaled", "int32", ir.call(
                "mf_mbqm_lt1", v * (1 << left_shift), ir.Const(in_mult), ir.Const(in_shift))),
                *([store, add] if exclusive else [add, store])]
        return [ir.Decl("acc", "int32", ir.Const(start)), *ir.loops([("k", n)], step)]
    loop = ir.loops([("o", outer), ("i", inner)], element)
    return ir.Kernel(ctx.name, tuple(ctx.io_buffers()), loop, describe(
        ctx, f"axis {axis}, exclusive {exclusive}, reverse {reverse}; input mult {in_mult} "
             f"shift {in_shift}, output mult {out_mult} shift {out_shift}, start {start}"))


@lowers("gather", when=lambda ctx: ctx.attrs.get("batch_dims", 0) > 0)
def gather_batched(ctx: OpContext) -> ir.Kernel:
    """TFLite GATHER with batch_dims b: data [B.., O.., n, I..], indices [B.., C..] ->
    y[B.., O.., C.., I..] = data[B.., O.., indices[B.., C..], I..]."""
    data, ind, y = ctx.input(0), ctx.input(1), ctx.output()
    axis, b = ctx.attrs["axis"], ctx.attrs["batch_dims"]
    names, consts = operand_names(ctx)
    batch, outer = data.shape[:b], data.shape[b:axis]
    coords, inner = ind.shape[b:], data.shape[axis + 1:]
    tables = []

    def at(*v):
        bs, os_ = list(v[:b]), list(v[b:axis])
        cs = list(v[axis:])
        pre, k = _index(ctx, 1, ir.flat_index(bs + cs, ind.shape), data.shape[axis], tables)
        copy = ir.loops([(f"i{d}", n) for d, n in enumerate(inner)], lambda *i: [
            ir.Store("y", ir.flat_index(bs + os_ + cs + list(i), y.shape),
                     ir.Load(names[0], ir.flat_index(bs + os_ + [k] + list(i), data.shape),
                             data.dtype))])
        return pre + list(copy)
    body = ir.loops([(f"b{d}", n) for d, n in enumerate(batch)]
                    + [(f"o{d}", n) for d, n in enumerate(outer)]
                    + [(f"j{d}", n) for d, n in enumerate(coords)], at)
    consts = [c for c in consts if c.name != "c1"]
    return ir.Kernel(ctx.name, tuple(ctx.io_buffers() + consts + tables), body,
                     describe(ctx, f"axis {axis}, batch_dims {b}"))
