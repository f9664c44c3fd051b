"""Lowerings: TFLite layer ops (batch matmul, transpose conv, resize), bit-exact with TFLM.

Registered with `@lowers(op, when=...)` so they serve only the nodes they accept; see
codegen_c/lower/__init__.py. They take the matmul / conv_transpose2d / resize nodes the TFLite
frontend marks `tflm=True` (float32 included: TFLM's float kernels sum in an order of their own
and compute resize coordinates in float32) and any quantized node of those ops.

- matmul: reference_ops::BatchMatMul. int8: int32 sums of (a - a_zp) * (b - b_zp), then
  MultiplyByQuantizedMultiplier; int16: int64 sums and the int64 MultiplyByQuantizedMultiplier
  (mf_mbqm_i64). adj_x / adj_y read an operand with its last two axes swapped.
- conv_transpose2d: TFLM scatters every input pixel into the outputs it reaches; here each
  output gathers its taps instead, in the order the scatter adds them (input rows, then
  columns, ascending; channels inner), from per-axis tables of the contributing input
  coordinates. The bias is added after the sum, as TFLM does.
- resize: nearest reads through per-axis index tables; bilinear float32 uses per-axis float32
  weight tables (ComputeInterpolationValues), int8/int16 the 10-bit fixed-point weights of
  ResizeBilinearInteger with its int64 rounding division.
"""
from __future__ import annotations

import numpy as np

from .. import loop_ir as ir
from .. import qparams as qp
from ..qmath import round_half_away
from . import OpContext, const, describe, float_activation, lowers, per_channel
from .elementwise import broadcast_index, operand_names

_RANGE = {"int8": (-128, 127), "int16": (-32768, 32767)}
_ACC = {"float32": "float32", "int8": "int32", "int16": "int64"}  # TFLM's accumulator types
_F32 = np.float32


def _tflm(ctx: OpContext) -> bool:
    x = ctx.input(0)
    return bool(ctx.attrs.get("tflm")) or (x is not None and x.quant is not None)


def _sq(t) -> tuple:
    return float(t.quant.scale[0]), int(t.quant.zero_point[0])


def activation_range(act: str, dtype: str, scale: float, zero_point: int) -> tuple:
    """tflite::CalculateActivationRangeQuantized for an int8 or int16 output: the type's range,
    narrowed by the fused activation's bounds quantized as zero_point + round(f / scale) in
    float32."""
    if dtype == "int8":
        return qp.activation_range_int8(act, scale, zero_point)
    qmin, qmax = _RANGE[dtype]

    def quant(f):
        return int(zero_point) + round_half_away(_F32(f) / _F32(scale))
    lo, hi = {"none": (None, None), "relu": (0.0, None), "relu6": (0.0, 6.0),
              "relu_n1_to_1": (-1.0, 1.0)}[act]
    return (qmin if lo is None else max(qmin, quant(lo)),
            qmax if hi is None else min(qmax, quant(hi)))


def _rescale(acc: ir.Expr, dtype: str, mult, shift) -> ir.Expr:
    """MultiplyByQuantizedMultiplier of the accumulator: the int32 form for int8 layers, the
    int64 one (16-bit reduced multiplier) for int16 layers."""
    return ir.call("mf_mbqm_i64" if dtype == "int16" else "mf_mbqm", acc, mult, shift)


def _nest(extents: list, body: tuple) -> tuple:
    """Wrap `body` in loops over (var, extent), innermost last; a loop of extent 1 is not
    emitted, its variable becomes 0 (as ir.loops does)."""
    for var, n in reversed(extents):
        body = ir.substitute(body, {var: ir.Const(0)}) if n == 1 else (ir.Loop(var, n, body),)
    return body


# ---- matmul ----------------------------------------------------------------------------------

@lowers("matmul", when=_tflm)
def batch_matmul(ctx: OpContext) -> ir.Kernel:
    a, b, y = ctx.input(0), ctx.input(1), ctx.output()
    adj_x, adj_y = bool(ctx.attrs.get("adj_x")), bool(ctx.attrs.get("adj_y"))
    (na, nb), consts = operand_names(ctx)
    if len(a.shape) < 2 or len(b.shape) < 2:
        raise NotImplementedError("matmul with a 1-D operand")
    M, K = (a.shape[-1], a.shape[-2]) if adj_x else (a.shape[-2], a.shape[-1])
    N = b.shape[-2] if adj_y else b.shape[-1]
    batch = tuple(y.shape[:-2])
    dtype, acc_dtype = y.dtype, _ACC.get(y.dtype)
    if acc_dtype is None or a.dtype != dtype or b.dtype != dtype:
        raise NotImplementedError(f"matmul {a.dtype} x {b.dtype} -> {dtype}")
    bufs = ctx.io_buffers() + consts
    acc = ir.Var("acc", acc_dtype)

    def operand(name, t, bi, row, col, rows, cols, adj):
        """Element (row, col) of the operand's matrix at batch index bi (stored transposed
        when adj)."""
        at = col * rows + row if adj else row * cols + col
        v = ir.Load(name, broadcast_index(t.shape[:-2], batch, bi) * (rows * cols) + at, t.dtype)
        if dtype == "float32":
            return v
        zp = int(t.quant.zero_point[0])
        return ir.cast(v, "int32") - zp

    if dtype == "float32":
        result, extra = acc, ""
    else:  # GetQuantizedConvolutionMultipler: float32 a_scale * b_scale, / y_scale in double
        mults, shifts = qp.fc_output_multipliers(a.quant.scale[0], [b.quant.scale[0]],
                                                 y.quant.scale[0])
        lo, hi = _RANGE[dtype]
        scaled = _rescale(acc, dtype, int(mults[0]), int(shifts[0])) + int(y.quant.zero_point[0])
        result = ir.cast(ir.clamp(scaled, lo, hi), dtype)
        extra = f"multiplier {int(mults[0])}, shift {int(shifts[0])}, "

    def body(*idx):
        *bi, m, n = idx

        def mac(k):
            return [ir.Assign("acc", acc + operand(na, a, bi, m, k, M, K, adj_x)
                              * operand(nb, b, bi, k, n, K, N, adj_y))]
        zero = ir.Const(0.0, "float32") if dtype == "float32" else ir.Const(0, acc_dtype)
        return [ir.Decl("acc", acc_dtype, zero), *ir.loops([("k", K)], mac),
                ir.Store("y", ir.flat_index(list(idx), [*batch, M, N]), result)]

    extents = [(f"b{d}", n) for d, n in enumerate(batch)] + [("m", M), ("n", N)]
    macs = int(np.prod(batch, dtype=np.int64)) * M * N * K
    extra += f"adj_x {adj_x}, adj_y {adj_y}, {_ACC[dtype]} sums, {macs} MACs"
    return ir.Kernel(ctx.name, tuple(bufs), ir.loops(extents, body), describe(ctx, extra), macs)


# ---- conv_transpose2d ------------------------------------------------------------------------

def transpose_conv_sources(n_in: int, n_out: int, k: int, stride: int, pad: int) -> np.ndarray:
    """[n_out, T] input coordinates whose taps reach each output coordinate o (i * stride - pad +
    tap == o for a tap in [0, k)), ascending as TFLM's scatter adds them; -1 pads short rows."""
    rows = [[i for i in range(n_in) if 0 <= o + pad - i * stride < k] for o in range(n_out)]
    width = max(1, max(len(r) for r in rows))
    return np.array([r + [-1] * (width - len(r)) for r in rows], dtype=np.int32)


@lowers("conv_transpose2d", when=_tflm)
def transpose_conv(ctx: OpContext) -> ir.Kernel:
    x, w, bias, y = ctx.input(0), ctx.input(1), ctx.input(2), ctx.output()
    N, H, W, C = x.shape
    O, KH, KW, CI = w.shape
    _, OH, OW, _ = y.shape
    if CI != C or tuple(ctx.attrs["dilation"]) != (1, 1):
        raise NotImplementedError("grouped or dilated conv_transpose2d")
    dtype, acc_dtype = y.dtype, _ACC.get(y.dtype)
    if acc_dtype is None:
        raise NotImplementedError(f"conv_transpose2d on {dtype}")
    (sh, sw), act = ctx.attrs["stride"], ctx.attrs["activation"]
    pt, _, pl, _ = ctx.attrs["padding"]
    src_y = transpose_conv_sources(H, OH, KH, sh, pt)
    src_x = transpose_conv_sources(W, OW, KW, sw, pl)
    ty, tx = src_y.shape[1], src_x.shape[1]
    (nx, nw, nb), consts = operand_names(ctx)  # weights and bias may be computed at run time
    bufs = ctx.io_buffers() + consts + [
        const("src_y", src_y, "int32", "input row of output row, tap"),
        const("src_x", src_x, "int32", "input column of output column, tap")]
    acc = ir.Var("acc", acc_dtype)
    iy, ix, ky, kx = ir.Var("iy"), ir.Var("ix"), ir.Var("ky"), ir.Var("kx")
    n, oy, ox, oc = ir.Var("n"), ir.Var("oy"), ir.Var("ox"), ir.Var("oc")

    xv = ir.Load(nx, ir.flat_index([n, iy, ix, ir.Var("ic")], [N, H, W, C]), x.dtype)
    wv = ir.Load(nw, ir.flat_index([oc, ky, kx, ir.Var("ic")], [O, KH, KW, C]), w.dtype)
    if dtype == "float32":
        term = xv * wv
    elif dtype == "int8":  # TFLM ignores the filter zero point (symmetric weights)
        term = (ir.cast(xv, "int32") - int(x.quant.zero_point[0])) * ir.cast(wv, "int32")
    else:  # int16: TFLM ignores the input zero point (0 by the 16x8 scheme)
        term = ir.cast(xv, "int32") * ir.cast(wv, "int32")
    channels = _nest([("ic", C)], (ir.Assign("acc", acc + term),))
    cols = (ir.Decl("ix", "int32", ir.Load("src_x", ox * tx + ir.Var("jx"), "int32")),
            ir.If(ix.ge(0), (ir.Decl("kx", "int32", ox + pl - ix * sw), *channels)))
    rows = (ir.Decl("iy", "int32", ir.Load("src_y", oy * ty + ir.Var("jy"), "int32")),
            ir.If(iy.ge(0), (ir.Decl("ky", "int32", oy + pt - iy * sh),
                             *_nest([("jx", tx)], cols))))
    zero = ir.Const(0.0, "float32") if dtype == "float32" else ir.Const(0, acc_dtype)
    body = [ir.Decl("acc", acc_dtype, zero), *_nest([("jy", ty)], rows)]
    if bias is not None:
        body.append(ir.Assign("acc", acc + ir.cast(ir.Load(nb, oc, bias.dtype), acc_dtype)))
    out = ir.flat_index([n, oy, ox, oc], [N, OH, OW, O])
    if dtype == "float32":
        body.append(ir.Store("y", out, float_activation(acc, act)))
        extra = ""
    else:
        x_scale, _ = _sq(x)
        y_scale, y_zp = _sq(y)
        mults, shifts = qp.conv_output_multipliers(x_scale, np.asarray(w.quant.scale, np.float32),
                                                   y_scale, num_channels=O)
        mults, shifts = np.broadcast_to(mults, O), np.broadcast_to(shifts, O)
        m, b1 = per_channel(mults, "mult", oc)
        s, b2 = per_channel(shifts, "shift", oc)
        bufs += b1 + b2
        lo, hi = activation_range(act, dtype, y_scale, y_zp)
        v = _rescale(acc, dtype, m, s)
        if dtype == "int8":  # the int16 kernel adds no output zero point (0 by the scheme)
            v = v + y_zp
        body.append(ir.Store("y", out, ir.cast(ir.clamp(v, lo, hi), dtype)))
        extra = f"{_ACC[dtype]} sums, "
    loop = _nest([("n", N), ("oy", OH), ("ox", OW), ("oc", O)], tuple(body))
    macs = N * H * W * C * KH * KW * O
    extra += (f"stride {sh}x{sw}, padding top {pt} left {pl}, taps in input order (as TFLM's "
              f"scatter), activation {act}, {macs} MACs")
    return ir.Kernel(ctx.name, tuple(bufs), loop, describe(ctx, extra), macs)


# ---- resize ----------------------------------------------------------------------------------

def _scale(n_in: int, n_out: int, align: bool) -> np.float32:
    """The float32 ratio TFLM maps output to input coordinates with."""
    if align and n_out > 1:
        return _F32(n_in - 1) / _F32(n_out - 1)
    return _F32(n_in) / _F32(n_out)


def nearest_sources(n_in: int, n_out: int, align: bool, half: bool) -> np.ndarray:
    """reference_ops GetNearestNeighbor for every output coordinate: (o + offset) * scale in
    float32, rounded half away (align_corners) or floored, clamped to the input."""
    scale, offset = _scale(n_in, n_out, align), _F32(0.5 if half else 0.0)
    out = []
    for o in range(n_out):
        v = (_F32(o) + offset) * scale
        i = min(round_half_away(v) if align else int(np.floor(v)), n_in - 1)
        out.append(max(i, 0) if half else i)
    return np.array(out, dtype=np.int32)


def bilinear_float_taps(n_in: int, n_out: int, align: bool, half: bool) -> tuple:
    """ComputeInterpolationValues per output coordinate: (lower, upper, weight of lower,
    weight of upper), the weights 1 - (v - lower) and v - lower in float32 as TFLM forms them."""
    scale = _scale(n_in, n_out, align)
    lo, hi, w0, w1 = [], [], [], []
    for o in range(n_out):
        v = (_F32(o) + _F32(0.5)) * scale - _F32(0.5) if half else _F32(o) * scale
        lo.append(max(int(np.floor(v)), 0))
        hi.append(min(int(np.ceil(v)), n_in - 1))
        d = _F32(v - _F32(lo[-1]))
        w1.append(d)
        w0.append(_F32(_F32(1.0) - d))
    return (np.array(lo, np.int32), np.array(hi, np.int32), np.array(w0, np.float32),
            np.array(w1, np.float32))


def _tdiv(a: int, b: int) -> int:
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b >= 0) else -q


def bilinear_int_taps(n_in: int, n_out: int, align: bool, half: bool) -> tuple:
    """ComputeInterpolationValuesInteger per output coordinate: the coordinate in 1/1024ths from
    a rounded 10-bit scale, (lower, upper, 1024 - frac, frac) with C's truncating division."""
    if align and n_out > 1:
        scale = ((1 << 10) * (n_in - 1) + (n_out - 1) // 2) // (n_out - 1)
    else:
        scale = ((1 << 10) * n_in + n_out // 2) // n_out
    lo, hi, w0, w1 = [], [], [], []
    for o in range(n_out):
        v = o * scale + scale // 2 - (1 << 9) if half else o * scale
        lo.append(max(_tdiv(v, 1 << 10), 0))
        hi.append(min(_tdiv(v + (1 << 10) - 1, 1 << 10), n_in - 1))
        w1.append(v - (1 << 10) * lo[-1])
        w0.append((1 << 10) - w1[-1])
    return tuple(np.array(t, np.int32) for t in (lo, hi, w0, w1))


class _Resize:
    """The loop variables, output index and input loads shared by the two resize kernels."""

    def __init__(self, ctx: OpContext):
        self.x, self.y = ctx.input(0), ctx.output()
        self.align = bool(ctx.attrs["align_corners"])
        self.half = bool(ctx.attrs["half_pixel_centers"])
        self.n, self.oy, self.ox, self.c = (ir.Var(v) for v in ("n", "oy", "ox", "c"))
        self.out = ir.flat_index([self.n, self.oy, self.ox, self.c], self.y.shape)
        self.flags = f"align_corners {self.align}, half_pixel_centers {self.half}"

    def at(self, iy, ix) -> ir.Expr:
        return ir.Load("x", ir.flat_index([self.n, iy, ix, self.c], self.x.shape), self.x.dtype)


@lowers("resize", when=lambda ctx: bool(ctx.attrs.get("tflm")))
def resize(ctx: OpContext) -> ir.Kernel:
    r = _Resize(ctx)
    N, H, W, C = r.x.shape
    _, OH, OW, _ = r.y.shape
    bufs = list(ctx.io_buffers())
    if ctx.attrs["mode"] == "nearest":
        body, extra = _nearest(r, bufs), f"nearest, {r.flags}"
        loop = _nest([("n", N), ("oy", OH), ("ox", OW), ("c", C)], body)
    else:
        loop, extra = _bilinear(r, bufs), f"bilinear, {r.flags}"
    return ir.Kernel(ctx.name, tuple(bufs), loop, describe(ctx, extra))


def _nearest(r: _Resize, bufs: list) -> tuple:
    """y = x at the nearest source row and column: index tables, or the loop variable for an
    axis the resize leaves as it is."""
    coords = []
    for axis, var, n_in, n_out in (("y", r.oy, r.x.shape[1], r.y.shape[1]),
                                   ("x", r.ox, r.x.shape[2], r.y.shape[2])):
        t = nearest_sources(n_in, n_out, r.align, r.half)
        if n_in == n_out and (t == np.arange(n_out)).all():
            coords.append(var)
        else:
            bufs.append(const(f"src_{axis}", t, "int32", f"nearest input {axis} per output"))
            coords.append(ir.Load(f"src_{axis}", var, "int32"))
    return (ir.Store("y", r.out, r.at(*coords)),)


def _bilinear(r: _Resize, bufs: list) -> tuple:
    """Per output row and column, locals y0, y1, wy0, wy1 (x0, x1, wx0, wx1) from the tables;
    per channel the four corners weighted as TFLM's reference: float32 products summed left to
    right (+ 0.0f), or 10-bit weights in int64, divided by 2^20 rounding half away from zero."""
    is_float = r.x.dtype == "float32"
    taps, wdt = (bilinear_float_taps, "float32") if is_float else (bilinear_int_taps, "int32")
    decls = {}
    for axis, var, n_in, n_out in (("y", r.oy, r.x.shape[1], r.y.shape[1]),
                                   ("x", r.ox, r.x.shape[2], r.y.shape[2])):
        lo, hi, w0, w1 = taps(n_in, n_out, r.align, r.half)
        if (lo >= n_in).any():  # TFLM would read outside the input (a 10-bit scale rounded up)
            raise NotImplementedError(f"bilinear resize of {n_in} to {n_out}: TFLM reads past "
                                      f"the input")
        decls[axis] = []
        for name, data, dt in ((f"{axis}0", lo, "int32"), (f"{axis}1", hi, "int32"),
                               (f"w{axis}0", w0, wdt), (f"w{axis}1", w1, wdt)):
            bufs.append(const(f"t_{name}", data, dt, f"bilinear {name} per output {axis}"))
            decls[axis].append(ir.Decl(name, dt, ir.Load(f"t_{name}", var, dt)))
    terms = []
    for cy, cx in (("y0", "x0"), ("y1", "x0"), ("y0", "x1"), ("y1", "x1")):
        v = r.at(ir.Var(cy), ir.Var(cx))
        v = v if is_float else ir.cast(v, "int64")
        terms.append(v * ir.Var("w" + cy, wdt) * ir.Var("w" + cx, wdt))
    total = terms[0] + terms[1] + terms[2] + terms[3]
    if is_float:  # TFLM adds its rounding offset, 0.0f for float, which turns -0.0 into +0.0;
        # a local keeps the IR's constant folding from dropping the addition
        inner = (ir.Store("y", r.out, total + ir.Var("rounding_offset", "float32")),)
    else:
        acc = ir.Var("acc", "int64")
        rounded = ir.binop("/", acc + ir.select(acc.gt(0), 1 << 19, -(1 << 19)), 1 << 20)
        inner = (ir.Decl("acc", "int64", total), ir.Store("y", r.out, ir.cast(rounded,
                                                                              r.y.dtype)))
    N, OH, OW, C = r.y.shape
    body = tuple(decls["x"]) + _nest([("c", C)], inner)
    body = tuple(decls["y"]) + _nest([("ox", OW)], body)
    offset = (ir.Decl("rounding_offset", "float32", ir.Const(0.0, "float32")),) if is_float else ()
    return offset + _nest([("n", N), ("oy", OH)], body)
