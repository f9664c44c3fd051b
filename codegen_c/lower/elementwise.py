"""Element-wise ops: binary add/mul with broadcasting, and the unary activations and
(de)quantization. int8 elements go through one runtime intrinsic each, whose arguments are the
compile-time parameters that qparams computes exactly as TFLM's Prepare does; float32 elements
are plain arithmetic in TFLM's reference formulas, with mcuforge_math.h for exp and tanh."""
from __future__ import annotations

import numpy as np

from .. import loop_ir as ir
from .. import mathmirror  # noqa: F401  (registers the mfm_ mirrors for the evaluator)
from .. import qparams as qp
from . import OpContext, const, describe, float_activation, lowers


def operand_names(ctx: OpContext) -> tuple:
    """Buffer name per node input: activations are parameters x, x1, ...; constants become
    const buffers c0, c1, ... Returns (names, const buffers)."""
    names, consts, k = [], [], 0
    for i, n in enumerate(ctx.node.inputs):
        t = ctx.graph.tensors[n] if n else None
        if t is None:
            names.append(None)
        elif t.is_const:
            names.append(f"c{i}")
            consts.append(const(f"c{i}", t.data, t.dtype, t.name))
        else:
            names.append("x" if k == 0 else f"x{k}")
            k += 1
    return names, consts


def broadcast_index(in_shape, out_shape, idx: list) -> ir.Expr:
    """Flat index into an input broadcast (numpy rules) to out_shape at multi-index idx."""
    in_shape = (1,) * (len(out_shape) - len(in_shape)) + tuple(in_shape)
    return ir.flat_index([i if n > 1 else 0 for i, n in zip(idx, in_shape)], in_shape)


def _elementwise(ctx: OpContext, value_fn, extra: str = "") -> ir.Kernel:
    """y[i] = value_fn(loads...) over the output, inputs broadcast to it."""
    y = ctx.output()
    names, consts = operand_names(ctx)
    ins = [(nm, ctx.input(i)) for i, nm in enumerate(names) if nm is not None]
    shape = tuple(y.shape)
    if all(t.size in (y.size, 1) for _, t in ins):
        extents = [("i", y.size)]  # no broadcasting but of scalars: one flat loop

        def body(i):
            loads = [ir.Load(nm, i if t.size == y.size else ir.Const(0), t.dtype)
                     for nm, t in ins]
            return [ir.Store("y", i, value_fn(*loads))]
    else:
        extents = [(f"i{d}", n) for d, n in enumerate(shape)]

        def body(*idx):
            loads = [ir.Load(nm, broadcast_index(t.shape, shape, list(idx)), t.dtype)
                     for nm, t in ins]
            return [ir.Store("y", ir.flat_index(list(idx), shape), value_fn(*loads))]
    loop = ir.loops(extents, body)
    return ir.Kernel(ctx.name, tuple(ctx.io_buffers() + consts), loop, describe(ctx, extra))


def _q(t):
    if t.quant is None:  # an integer operand of quantized arithmetic needs its scale
        raise NotImplementedError(f"tensor '{t.name}' ({t.dtype}) has no quantization "
                                  "parameters")
    return float(t.quant.scale[0]), int(t.quant.zero_point[0])


def _binary(ctx: OpContext, fn: str, params_fn, float_op: str) -> ir.Kernel:
    a, b, y = ctx.input(0), ctx.input(1), ctx.output()
    act = ctx.attrs["activation"]
    if y.dtype == "float32":
        return _elementwise(ctx, lambda p, q: float_activation(ir.binop(float_op, p, q), act),
                            f"activation {act}")
    if y.dtype != "int8":
        raise NotImplementedError(f"{ctx.node.op} {y.dtype}")
    params = params_fn(*_q(a), *_q(b), *_q(y), act)
    args = [ir.Const(int(v)) for v in params.values()]
    return _elementwise(ctx, lambda p, q: ir.call(fn, p, q, *args, dtype="int8"),
                        f"activation {act}")


@lowers("add")
def add(ctx: OpContext) -> ir.Kernel:
    return _binary(ctx, "mf_add_s8", qp.add_params, "+")


@lowers("mul")
def mul(ctx: OpContext) -> ir.Kernel:
    return _binary(ctx, "mf_mul_s8", qp.mul_params, "*")


def _unary_int8(ctx: OpContext, fn: str, params: dict) -> ir.Kernel:
    args = [ir.Const(int(v)) for v in params.values()]
    return _elementwise(ctx, lambda p: ir.call(fn, p, *args, dtype="int8"))


@lowers("relu")
def relu(ctx: OpContext) -> ir.Kernel:
    x, y = ctx.input(0), ctx.output()
    if y.dtype == "float32":  # TFLM's `x < 0 ? 0 : x`: NaN and -0 pass through
        zero = ir.Const(0.0, "float32")
        return _elementwise(ctx, lambda p: ir.select(p.lt(zero), zero, p))
    return _unary_int8(ctx, "mf_relu_s8", qp.relu_params(*_q(x), *_q(y)))


@lowers("relu6")
def relu6(ctx: OpContext) -> ir.Kernel:
    x, y = ctx.input(0), ctx.output()
    if y.dtype == "float32":
        return _elementwise(ctx, lambda p: float_activation(p, "relu6"))
    return _unary_int8(ctx, "mf_relu6_s8", qp.relu6_params(*_q(x)))


@lowers("leaky_relu")
def leaky_relu(ctx: OpContext) -> ir.Kernel:
    x, y = ctx.input(0), ctx.output()
    alpha = ctx.attrs["alpha"]
    if y.dtype == "float32":
        a = ir.Const(float(np.float32(alpha)), "float32")
        return _elementwise(ctx, lambda p: ir.select(p.gt(ir.Const(0.0, "float32")), p, p * a))
    return _unary_int8(ctx, "mf_leaky_relu_s8", qp.leaky_relu_params(*_q(x), *_q(y), alpha))


def _f(v) -> ir.Const:
    return ir.Const(float(np.float32(v)), "float32")


@lowers("hard_swish")
def hard_swish(ctx: OpContext) -> ir.Kernel:
    x, y = ctx.input(0), ctx.output()
    if y.dtype == "float32":  # TFLM: x * min(6, max(0, x + 3)) / 6
        return _elementwise(ctx, lambda p: ir.binop(
            "/", p * float_activation(p + _f(3.0), "relu6"), _f(6.0)))
    return _unary_int8(ctx, "mf_hard_swish_s8", qp.hard_swish_params(*_q(x), *_q(y)))


def _float_logistic(p: ir.Expr) -> ir.Expr:
    """TFLM's float logistic: 1 / (1 + e^-x), with its cut-offs where that is 1 or e^x."""
    exp = ir.call("mfm_expf", p, dtype="float32")
    exp_neg = ir.call("mfm_expf", ir.Unary("-", p, "float32"), dtype="float32")
    return ir.select(p.gt(_f(16.619047164916992188)), _f(1.0),
                     ir.select(p.lt(_f(-9.0)), exp, ir.binop("/", _f(1.0), _f(1.0) + exp_neg)))


@lowers("logistic")
def logistic(ctx: OpContext) -> ir.Kernel:
    x, y = ctx.input(0), ctx.output()
    if y.dtype == "float32":
        return _elementwise(ctx, _float_logistic)
    return _unary_int8(ctx, "mf_logistic_s8", qp.logistic_params(*_q(x), _q(y)[1]))


@lowers("tanh")
def tanh(ctx: OpContext) -> ir.Kernel:
    x, y = ctx.input(0), ctx.output()
    if y.dtype == "float32":
        return _elementwise(ctx, lambda p: ir.call("mfm_tanhf", p, dtype="float32"))
    return _unary_int8(ctx, "mf_tanh_s8", qp.tanh_params(*_q(x)))


@lowers("quantize")
def quantize(ctx: OpContext) -> ir.Kernel:
    x, y = ctx.input(0), ctx.output()
    if x.dtype == "float32" and y.dtype == "int8":
        s, zp = _q(y)
        return _elementwise(ctx, lambda p: ir.call("mf_quantize_f32_s8", p, ir.Const(s, "float32"),
                                                   ir.Const(zp), dtype="int8"))
    if x.dtype == "int8" and y.dtype == "int8":
        return _unary_int8(ctx, "mf_requantize_s8", qp.requantize_params(*_q(x), *_q(y)))
    raise NotImplementedError(f"quantize {x.dtype} -> {y.dtype}")


@lowers("dequantize")
def dequantize(ctx: OpContext) -> ir.Kernel:
    x, y = ctx.input(0), ctx.output()
    if x.dtype != "int8" or y.dtype != "float32":
        raise NotImplementedError(f"dequantize {x.dtype} -> {y.dtype}")
    s, zp = _q(x)
    return _elementwise(ctx, lambda p: ir.call("mf_dequantize_s8_f32", p, ir.Const(s, "float32"),
                                               ir.Const(zp), dtype="float32"))
