"""concat, pad and mean: copies and reductions over static shapes."""
from __future__ import annotations

import numpy as np

from .. import loop_ir as ir
from .. import qparams as qp
from . import OpContext, describe, lowers
from .elementwise import operand_names


def _same_quant(a, b) -> bool:
    if a.quant is None or b.quant is None:
        return a.quant is b.quant
    return (np.allclose(a.quant.scale, b.quant.scale, rtol=0, atol=0)
            and tuple(a.quant.zero_point) == tuple(b.quant.zero_point))


@lowers("concat")
def concat(ctx: OpContext) -> ir.Kernel:
    y = ctx.output()
    axis = ctx.attrs["axis"]
    if ctx.attrs.get("activation", "none") != "none":
        raise NotImplementedError("concat with a fused activation")
    names, consts = operand_names(ctx)
    outer = int(np.prod(y.shape[:axis], dtype=np.int64))
    out_inner = int(np.prod(y.shape[axis:], dtype=np.int64))
    body, offset = [], 0
    for i, nm in enumerate(names):
        t = ctx.input(i)
        if y.dtype == "int8" and not _same_quant(t, y):
            raise NotImplementedError("int8 concat of inputs quantized unlike the output "
                                      "(TFLM requires equal scales and zero points)")
        inner = int(np.prod(t.shape[axis:], dtype=np.int64))
        body += ir.loops([("o", outer), ("j", inner)], lambda o, j, nm=nm, inner=inner, off=offset: [
            ir.Store("y", o * out_inner + off + j, ir.Load(nm, o * inner + j, t.dtype))])
        offset += inner
    return ir.Kernel(ctx.name, tuple(ctx.io_buffers() + consts), tuple(body),
                     describe(ctx, f"axis {axis}"))


@lowers("pad")
def pad(ctx: OpContext) -> ir.Kernel:
    x, y = ctx.input(0), ctx.output()
    pads = ctx.attrs["pads"]
    value_t = ctx.input(2)
    if value_t is not None:
        value = value_t.data.reshape(-1)[0]
    elif y.quant is not None:
        value = y.quant.zero_point[0]
    else:
        value = 0
    fill = ir.Const(float(value), "float32") if y.dtype == "float32" else ir.Const(int(value))
    body = list(ir.loops([("i", y.size)], lambda i: [ir.Store("y", i, fill)]))
    shape = tuple(x.shape)

    def copy(*idx):
        out_idx = [i + before for i, (before, _) in zip(idx, pads)]
        return [ir.Store("y", ir.flat_index(out_idx, y.shape),
                         ir.Load("x", ir.flat_index(list(idx), shape), x.dtype))]
    body += ir.loops([(f"i{d}", n) for d, n in enumerate(shape)], copy)
    return ir.Kernel(ctx.name, tuple(ctx.io_buffers()), tuple(body),
                     describe(ctx, f"pads {[tuple(p) for p in pads]}, value {value}"))


@lowers("mean")
def mean(ctx: OpContext) -> ir.Kernel:
    x, y = ctx.input(0), ctx.output()
    axes = tuple(ctx.attrs["axes"])
    shape = tuple(x.shape)
    kept = [d for d in range(len(shape)) if d not in axes]
    count = int(np.prod([shape[d] for d in axes], dtype=np.int64))
    is_float = x.dtype == "float32"
    acc_dtype = "float32" if is_float else "int32"

    def body(*out_idx):
        idx = dict(zip(kept, out_idx))

        def add(*red_idx):
            full = {**idx, **dict(zip(axes, red_idx))}
            v = ir.cast(ir.Load("x", ir.flat_index([full[d] for d in range(len(shape))], shape),
                                x.dtype), acc_dtype)
            return [ir.Assign("acc", ir.Var("acc", acc_dtype) + v)]
        zero = ir.Const(0.0, "float32") if is_float else ir.Const(0)
        stmts = [ir.Decl("acc", acc_dtype, zero)]
        stmts += ir.loops([(f"r{d}", shape[d]) for d in axes], add)
        acc = ir.Var("acc", acc_dtype)
        if is_float:
            value = ir.binop("/", acc, ir.Const(float(count), "float32"))
        else:
            p = qp.mean_params(*_q(x), *_q(y), count)
            value = ir.call("mf_mean_s8", acc, *[ir.Const(int(v)) for v in p.values()],
                            dtype="int8")
        return stmts + [ir.Store("y", ir.flat_index(list(out_idx), [shape[d] for d in kept]), value)]

    loop = ir.loops([(f"i{d}", shape[d]) for d in kept], body)
    return ir.Kernel(ctx.name, tuple(ctx.io_buffers()), loop,
                     describe(ctx, f"axes {axes}, keep_dims {ctx.attrs['keep_dims']}, {count} each"))


def _q(t):
    return float(t.quant.scale[0]), int(t.quant.zero_point[0])
