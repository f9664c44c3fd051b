"""concat, pad, and the reductions (TFLite's int8 mean; generic reduce, arg_reduce, cumsum)
over static shapes."""
from __future__ import annotations

import numpy as np

from .. import loop_ir as ir
from .. import qparams as qp
from . import OpContext, const, describe, lowers
from .elementwise import operand_names


def _same_quant(a, b) -> bool:
    if a.quant is None or b.quant is None:
        return a.quant is b.quant
    return (np.allclose(a.quant.scale, b.quant.scale, rtol=0, atol=0)
            and tuple(a.quant.zero_point) == tuple(b.quant.zero_point))


def _rescale_uint8(t, y):
    """The value a concat input contributes: its raw value, or for a uint8 input quantized
    unlike the output LiteRT's ConcatenationWithScaling: roundf(q * (s_in * (1 / s_out)) +
    -zp_in * that) + zp_out, clamped to [0, 255], in float32 (legacy uint8 models)."""
    if y.dtype != "uint8" or _same_quant(t, y):
        return lambda v: v
    f = np.float32
    scale = f(t.quant.scale[0]) * (f(1.0) / f(y.quant.scale[0]))
    bias = f(-int(t.quant.zero_point[0])) * scale

    def value(v):
        r = ir.call("mf_roundf", ir.cast(v, "float32") * ir.Const(float(scale), "float32")
                    + ir.Const(float(bias), "float32"), dtype="float32")
        q = ir.cast(r, "int32") + int(y.quant.zero_point[0])
        return ir.cast(ir.clamp(q, ir.Const(0), ir.Const(255)), "uint8")
    return value


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
        value = _rescale_uint8(t, y)
        if y.dtype in ("int8", "int16") and not _same_quant(t, y):
            raise NotImplementedError(f"{y.dtype} concat of inputs quantized unlike the output "
                                      "(TFLM and LiteRT require equal scales and zero points)")
        inner = int(np.prod(t.shape[axis:], dtype=np.int64))
        def copy(o, j, nm=nm, inner=inner, off=offset, t=t, value=value):
            return [ir.Store("y", o * out_inner + off + j,
                             value(ir.Load(nm, o * inner + j, t.dtype)))]
        body += ir.loops([("o", outer), ("j", inner)], copy)
        offset += inner
    return ir.Kernel(ctx.name, tuple(ctx.io_buffers() + consts), tuple(body),
                     describe(ctx, f"axis {axis}"))


@lowers("pad")
def pad(ctx: OpContext) -> ir.Kernel:
    """constant: fill, then copy the input's kept part; a negative pad crops. reflect, edge,
    wrap: every output element reads the input through a per-axis table of source indices."""
    x, y = ctx.input(0), ctx.output()
    pads = ctx.attrs["pads"]
    mode = ctx.attrs.get("mode", "constant")
    if mode != "constant":
        return _pad_tables(ctx, mode)
    value_t = ctx.input(2)
    if value_t is not None:
        value = value_t.data.reshape(-1)[0]
    elif y.quant is not None:
        value = y.quant.zero_point[0]
    else:
        value = 0
    fill = ir.Const(float(value), "float32") if y.dtype == "float32" else ir.Const(int(value))
    shape = tuple(x.shape)
    kept = [(max(0, -b), min(n, n + a)) for n, (b, a) in zip(shape, pads)]  # input ranges
    body = []
    if int(np.prod([hi - lo for lo, hi in kept], dtype=np.int64)) != y.size:
        body += ir.loops([("i", y.size)], lambda i: [ir.Store("y", i, fill)])

    def copy(*idx):
        src = [i + lo for i, (lo, _) in zip(idx, kept)]
        out_idx = [i + before for i, (before, _) in zip(src, pads)]
        return [ir.Store("y", ir.flat_index(out_idx, y.shape),
                         ir.Load("x", ir.flat_index(src, shape), x.dtype))]
    if all(hi > lo for lo, hi in kept):
        body += ir.loops([(f"i{d}", hi - lo) for d, (lo, hi) in enumerate(kept)], copy)
    return ir.Kernel(ctx.name, tuple(ctx.io_buffers()), tuple(body),
                     describe(ctx, f"pads {[tuple(p) for p in pads]}, value {value}"))


def _pad_tables(ctx: OpContext, mode: str) -> ir.Kernel:
    x, y = ctx.input(0), ctx.output()
    pads = ctx.attrs["pads"]
    tables, src = [], {}
    for d, (n, (b, a)) in enumerate(zip(x.shape, pads)):
        if (b, a) == (0, 0):
            continue
        kept = np.arange(max(-b, 0), n - max(-a, 0))  # negative pads crop first
        t = np.pad(kept, (max(b, 0), max(a, 0)), mode=mode)
        tables.append(const(f"t{d}", t, "int32", f"axis {d}: source indices"))
        src[d] = f"t{d}"

    def body(*idx):
        s = [ir.Load(src[d], i, "int32") if d in src else i for d, i in enumerate(idx)]
        return [ir.Store("y", ir.flat_index(list(idx), y.shape),
                         ir.Load("x", ir.flat_index(s, x.shape), x.dtype))]
    loop = ir.loops([(f"i{d}", n) for d, n in enumerate(y.shape)], body)
    return ir.Kernel(ctx.name, tuple(ctx.io_buffers() + tables), loop,
                     describe(ctx, f"pads {[tuple(p) for p in pads]}, mode {mode}"))


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


# ---- generic reductions: one accumulator per output element ----

def _acc_dtype(dtype: str, fn: str) -> str:
    """float32 for floats; sums and products of integers in int64 (wrapping like numpy on the
    final cast); extremes in the input's own range."""
    if dtype == "float32":
        return "float32"
    return "int64" if dtype == "int64" or fn not in ("max", "min") else "int32"


def _zero(dtype: str, v=0):
    return ir.Const(float(v), "float32") if dtype == "float32" else ir.Const(v, dtype)


def _float_call(fn: str, v: ir.Expr) -> ir.Expr:
    return ir.call(fn, v, dtype="float32")


@lowers("reduce")
def reduce(ctx: OpContext) -> ir.Kernel:
    x, y = ctx.input(0), ctx.output()
    fn, axes = ctx.attrs["fn"], tuple(ctx.attrs["axes"])
    shape = tuple(x.shape)
    kept = [d for d in range(len(shape)) if d not in axes]
    count = int(np.prod([shape[d] for d in axes], dtype=np.int64))
    acc_t = _acc_dtype(x.dtype, fn)
    acc = ir.Var("acc", acc_t)

    def element(*out_idx):
        idx = dict(zip(kept, out_idx))

        def load(red_idx):
            full = {**idx, **dict(zip(axes, red_idx))}
            flat = ir.flat_index([full[d] for d in range(len(shape))], shape)
            return ir.cast(ir.Load("x", flat, x.dtype), acc_t)

        def over(update):  # loops over the reduced axes
            return list(ir.loops([(f"r{d}", shape[d]) for d in axes],
                                 lambda *r: [update(load(r))]))
        def extreme(name: str, op: str) -> list:
            var = ir.Var(name, acc_t)
            return [ir.Decl(name, acc_t, load([ir.Const(0)] * len(axes)))] + over(
                lambda v: ir.Assign(name, ir.binop(op, var, v)))
        if fn in ("max", "min"):
            stmts = extreme("acc", fn)
        elif fn == "log_sum_exp":  # log(sum(exp(x - max))) + max, as onnxruntime
            m = ir.Var("m", acc_t)
            stmts = extreme("m", "max") + [ir.Decl("acc", acc_t, _zero(acc_t))]
            stmts += over(lambda v: ir.Assign("acc", acc + _float_call("mfm_expf", v - m)))
        else:
            term = {"l1": lambda v: ir.select(v.lt(_zero(acc_t)), _zero(acc_t) - v, v),
                    "l2": lambda v: v * v, "sum_square": lambda v: v * v}.get(fn, lambda v: v)
            op = "*" if fn == "prod" else "+"
            stmts = [ir.Decl("acc", acc_t, _zero(acc_t, 1 if fn == "prod" else 0))]
            stmts += over(lambda v: ir.Assign("acc", ir.binop(op, acc, term(v))))
        value = {
            "mean": lambda: ir.binop("/", acc, _zero(acc_t, count)),
            "l2": lambda: _float_call("mfm_sqrtf", acc),
            "log_sum": lambda: _float_call("mfm_logf", acc),
            "log_sum_exp": lambda: _float_call("mfm_logf", acc) + ir.Var("m", acc_t),
        }.get(fn, lambda: acc)()
        flat = ir.flat_index(list(out_idx), [shape[d] for d in kept])
        return stmts + [ir.Store("y", flat, ir.cast(value, y.dtype))]

    loop = ir.loops([(f"i{d}", shape[d]) for d in kept], element)
    return ir.Kernel(ctx.name, tuple(ctx.io_buffers()), loop,
                     describe(ctx, f"{fn} over axes {axes}, keep_dims {ctx.attrs['keep_dims']}"))


def _outer_inner(shape, axis: int) -> tuple:
    return (int(np.prod(shape[:axis], dtype=np.int64)), shape[axis],
            int(np.prod(shape[axis + 1:], dtype=np.int64)))


@lowers("arg_reduce")
def arg_reduce(ctx: OpContext) -> ir.Kernel:
    """The first (or with select_last_index the last) position of the max/min along the axis."""
    x, y = ctx.input(0), ctx.output()
    axis, fn = ctx.attrs["axis"], ctx.attrs["fn"]
    outer, n, inner = _outer_inner(tuple(x.shape), axis)
    better = {("max", False): "gt", ("max", True): "ge", ("min", False): "lt",
              ("min", True): "le"}[fn, bool(ctx.attrs["select_last_index"])]
    val_t = _acc_dtype(x.dtype, "max")
    best = ir.Var("best", val_t)

    def element(o, i):
        at = lambda k: ir.cast(ir.Load("x", (o * n + k) * inner + i, x.dtype), val_t)  # noqa
        stmts = [ir.Decl("best", val_t, at(ir.Const(0))), ir.Decl("pos", "int32", ir.Const(0))]
        if n > 1:
            k = ir.Var("k")
            stmts.append(ir.Loop("k", n - 1, (
                ir.Decl("v", val_t, at(k)),
                ir.If(getattr(ir.Var("v", val_t), better)(best),
                      (ir.Assign("best", ir.Var("v", val_t)), ir.Assign("pos", k))),
            ), start=1))
        return stmts + [ir.Store("y", o * inner + i, ir.cast(ir.Var("pos"), y.dtype))]
    loop = ir.loops([("o", outer), ("i", inner)], element)
    return ir.Kernel(ctx.name, tuple(ctx.io_buffers()), loop,
                     describe(ctx, f"arg{fn} over axis {axis}, select_last_index "
                                   f"{ctx.attrs['select_last_index']}"))


@lowers("cumsum")
def cumsum(ctx: OpContext) -> ir.Kernel:
    x, y = ctx.input(0), ctx.output()
    axis = ctx.attrs["axis"]
    exclusive, reverse = ctx.attrs["exclusive"], ctx.attrs["reverse"]
    outer, n, inner = _outer_inner(tuple(x.shape), axis)
    acc_t = _acc_dtype(x.dtype, "sum")
    acc = ir.Var("acc", acc_t)

    def element(o, i):
        def step(k):
            at = (o * n + ((n - 1) - k if reverse else k)) * inner + i
            add = ir.Assign("acc", acc + ir.cast(ir.Load("x", at, x.dtype), acc_t))
            store = ir.Store("y", at, ir.cast(acc, y.dtype))
            return [store, add] if exclusive else [add, store]
        return [ir.Decl("acc", acc_t, _zero(acc_t)), *ir.loops([("k", n)], step)]
    loop = ir.loops([("o", outer), ("i", inner)], element)
    return ir.Kernel(ctx.name, tuple(ctx.io_buffers()), loop,
                     describe(ctx, f"axis {axis}, exclusive {exclusive}, reverse {reverse}"))
