"""Lowerings: TFLite's 16x8 quantization (int16 activations, int8 weights), bit-exact with TFLM.

Registered with `@lowers(op, when=...)` for the nodes whose activations are int16 (see
codegen_c/lower/__init__.py); the int8 and float32 forms of these ops live in conv.py, pool.py,
elementwise.py, softmax.py and datamove.py. Parameters are computed here as TFLM's Prepare
functions compute them, in the precision they use (the docstrings say which).

- conv2d / depthwise_conv2d / fully_connected: int8 weights, sums of x * w in int64 with an
  int64 bias, requantized by the int64 MultiplyByQuantizedMultiplier (16-bit multiplier);
  CONV_2D and FULLY_CONNECTED with an int32 bias (or none and quantized_bias_type INT32,
  attr acc="int32") sum in int32 and requantize with the 32-bit one. CONV_2D and
  DEPTHWISE_CONV_2D ignore the zero points; FULLY_CONNECTED applies them.
- avg_pool2d / max_pool2d: TFLM's int16 kernels, the same as the int8 ones but for the range.
- add: the general rescaling path (left shift 15) TFLM always takes for int16 (it never uses
  the power-of-two shortcut LiteRT has); mul: int32 product, MultiplyByQuantizedMultiplier.
- softmax: int16 -> int16 with the exp and 1/(1+x) tables (mf_softmax_s16), and
  int8 -> int16 (mf_softmax_s8_s16).
- logistic / tanh: the sigmoid table interpolation (mf_logistic_s16 / mf_tanh_s16).
- relu / relu6 / leaky_relu, mean, quantize (int requantization, float -> int16), dequantize.
"""
from __future__ import annotations

import functools
import math

import numpy as np

from .. import loop_ir as ir
from .. import qparams as qp
from ..qmath import round_half_away
from . import OpContext, const, describe, lowers, per_channel
from .elementwise import _elementwise
from .pool import _counts
from .window import Window

I16 = "int16"
F32 = np.float32
LIMITS = {"int8": (-128, 127), "uint8": (0, 255), "int16": (-32768, 32767),
          "int32": (-2**31, 2**31 - 1)}


def _int16_in(ctx: OpContext) -> bool:
    x = ctx.input(0)
    return x is not None and x.dtype == I16


def _c(v) -> ir.Const:
    return ir.Const(int(v))


def _q(t) -> tuple:
    return float(F32(t.quant.scale[0])), int(t.quant.zero_point[0])


def _roundf(x) -> F32:
    """TfLiteRound on a float32 (roundf: half away from zero), as a float32."""
    return F32(round_half_away(F32(x)))


def activation_range(act: str, scale: float, zero_point: int, dtype: str = I16) -> tuple:
    """CalculateActivationRangeQuantized (kernel_util.cc): the type's range narrowed by the
    fused activation, its bounds quantized as zero_point + TfLiteRound(f / scale) in float32."""
    lo, hi = LIMITS[dtype]
    quant = lambda f: int(zero_point) + round_half_away(F32(f) / F32(scale))  # noqa: E731
    bounds = {"none": (None, None), "relu": (0.0, None), "relu6": (0.0, 6.0),
              "relu_n1_to_1": (-1.0, 1.0)}[act]
    return (lo if bounds[0] is None else max(lo, quant(bounds[0])),
            hi if bounds[1] is None else min(hi, quant(bounds[1])))


# ---- conv2d, depthwise_conv2d, fully_connected -----------------------------------------------

def _accumulator(ctx: OpContext) -> str:
    """TFLM's accumulator: int32 for an int32 bias, or without a bias when the converter asked
    for int32 (quantized_bias_type, carried as acc="int32"); int64 otherwise."""
    bias = ctx.input(2)
    if bias is not None:
        return "int32" if bias.dtype == "int32" else "int64"
    return "int32" if ctx.attrs.get("acc") == "int32" else "int64"


def _output_stage(ctx: OpContext, acc: ir.Expr, acc_t: str, channel: ir.Expr, out: ir.Expr,
                  bufs: list, n_out: int, output_offset: int = 0) -> list:
    """acc + bias, MultiplyByQuantizedMultiplier per output channel (the int64 form for int64
    sums), + output_offset, clamped to the activation range, stored as int16."""
    x, w, bias, y = ctx.input(0), ctx.input(1), ctx.input(2), ctx.output()
    if bias is not None:
        bufs.append(const("bias", bias.data, bias.dtype, bias.name))
        acc = acc + ir.cast(ir.Load("bias", channel, bias.dtype), acc_t)
    (sx, _), (sy, zy) = _q(x), _q(y)
    if ctx.node.op == "fully_connected":
        bias_scale = bias.quant.scale[0] if bias is not None and bias.quant else None
        try:
            mults, shifts = qp.fc_output_multipliers(sx, w.quant.scale, sy, bias_scale)
        except ValueError as e:
            raise NotImplementedError(f"int16 fully_connected: {e}")
    else:
        mults, shifts = qp.conv_output_multipliers(sx, w.quant.scale, sy)
    if acc_t == "int64" and not (np.all(shifts <= 7) and np.all(shifts >= -31)):
        raise NotImplementedError("int16 layer: output shift outside [-31, 7], beyond TFLM's "
                                  "int64 MultiplyByQuantizedMultiplier")
    m, b1 = per_channel(np.broadcast_to(mults, n_out), "mult", channel)
    s, b2 = per_channel(np.broadcast_to(shifts, n_out), "shift", channel)
    bufs += b1 + b2
    lo, hi = activation_range(ctx.attrs.get("activation", "none"), sy, zy)
    v = ir.call("mf_mbqm_i64" if acc_t == "int64" else "mf_mbqm", acc, m, s)
    if output_offset:
        v = v + output_offset
    return [ir.Store("y", out, ir.cast(ir.clamp(v, _c(lo), _c(hi)), I16))]


def _product(x_index: ir.Expr, w_index: ir.Expr, x_offset: int = 0, w_offset: int = 0):
    """(x + x_offset) * (w + w_offset) as TFLM forms it: an int32 product of the raw values."""
    xv = ir.cast(ir.Load("x", x_index, I16), "int32")
    wv = ir.cast(ir.Load("w", w_index, "int8"), "int32")
    return (wv + w_offset) * (xv + x_offset)


def _doc(ctx: OpContext, win: Window, acc_t: str, macs: int, more: str = "") -> str:
    (sh, sw), (dh, dw) = win.stride, win.dilation
    return describe(ctx, f"stride {sh}x{sw}, dilation {dh}x{dw}, padding {ctx.attrs['padding']}, "
                         f"{more}activation {ctx.attrs['activation']}, {acc_t} accumulator, "
                         f"{macs} MACs")


def _dedup(bufs: list) -> list:
    seen = set()
    return [b for b in bufs if not (b.name in seen or seen.add(b.name))]


@lowers("conv2d", when=_int16_in)
def conv2d_int16(ctx: OpContext) -> ir.Kernel:
    """reference_integer_ops::ConvPerChannel<AccumScalar> (int16): zero points ignored."""
    x, w, y = ctx.input(0), ctx.input(1), ctx.output()
    N, H, W, C = x.shape
    O, KH, KW, CI = w.shape
    _, OH, OW, _ = y.shape
    if CI != C:
        raise NotImplementedError("grouped int16 conv2d")
    acc_t = _accumulator(ctx)
    acc = ir.Var("acc", acc_t)
    win = Window.of(ctx, (KH, KW))
    bufs = ctx.io_buffers() + [const("w", w.data, "int8", w.name)]

    def body(n, oy, ox, oc):
        def tap(iy, ix, ky, kx):
            return ir.loops([("ic", CI)], lambda ic: [ir.Assign("acc", acc + _product(
                ir.flat_index([n, iy, ix, ic], [N, H, W, C]),
                ir.flat_index([oc, ky, kx, ic], [O, KH, KW, CI])))])
        out = ir.flat_index([n, oy, ox, oc], [N, OH, OW, O])
        return [ir.Decl("acc", acc_t, ir.Const(0, acc_t)), *win.taps(oy, ox, tap),
                *_output_stage(ctx, acc, acc_t, oc, out, bufs, O)]

    loop = ir.loops([("n", N), ("oy", OH), ("ox", OW), ("oc", O)], body)
    macs = N * OH * OW * O * KH * KW * CI
    return ir.Kernel(ctx.name, tuple(_dedup(bufs)), loop, _doc(ctx, win, acc_t, macs), macs)


@lowers("depthwise_conv2d", when=_int16_in)
def depthwise_conv2d_int16(ctx: OpContext) -> ir.Kernel:
    """reference_integer_ops::DepthwiseConvPerChannel (int16): int64 sums, zero points
    ignored."""
    x, w, y = ctx.input(0), ctx.input(1), ctx.output()
    N, H, W, C = x.shape
    _, KH, KW, O = w.shape
    _, OH, OW, _ = y.shape
    M = O // C
    acc = ir.Var("acc", "int64")
    win = Window.of(ctx, (KH, KW))
    bufs = ctx.io_buffers() + [const("w", w.data, "int8", w.name)]

    def body(n, oy, ox, ic, m):
        oc = ic * M + m

        def tap(iy, ix, ky, kx):
            return [ir.Assign("acc", acc + _product(ir.flat_index([n, iy, ix, ic], [N, H, W, C]),
                                                    ir.flat_index([ky, kx, oc], [KH, KW, O])))]
        out = ir.flat_index([n, oy, ox, oc], [N, OH, OW, O])
        return [ir.Decl("acc", "int64", ir.Const(0, "int64")), *win.taps(oy, ox, tap),
                *_output_stage(ctx, acc, "int64", oc, out, bufs, O)]

    loop = ir.loops([("n", N), ("oy", OH), ("ox", OW), ("ic", C), ("m", M)], body)
    macs = N * OH * OW * O * KH * KW
    return ir.Kernel(ctx.name, tuple(_dedup(bufs)), loop,
                     _doc(ctx, win, "int64", macs, f"depth multiplier {M}, "), macs)


@lowers("fully_connected", when=_int16_in)
def fully_connected_int16(ctx: OpContext) -> ir.Kernel:
    """reference_integer_ops::FullyConnected / FullyConnectedPerChannel (int16): these apply
    the input and output zero points (0 in the 16x8 scheme), the per-tensor form also the
    weights' (0: symmetric)."""
    x, w, y = ctx.input(0), ctx.input(1), ctx.output()
    O, I = w.shape
    B = x.size // I
    acc_t = _accumulator(ctx)
    acc = ir.Var("acc", acc_t)
    x_off = -_q(x)[1]
    w_off = 0 if w.quant.per_axis else -int(w.quant.zero_point[0])
    bufs = ctx.io_buffers() + [const("w", w.data, "int8", w.name)]

    def body(b, o):
        mac = lambda i: [ir.Assign("acc", acc + _product(b * I + i, o * I + i, x_off, w_off))]
        return [ir.Decl("acc", acc_t, ir.Const(0, acc_t)), *ir.loops([("i", I)], mac),
                *_output_stage(ctx, acc, acc_t, o, b * O + o, bufs, O, _q(y)[1])]

    loop = ir.loops([("b", B), ("o", O)], body)
    macs = B * O * I
    extra = f"activation {ctx.attrs['activation']}, {acc_t} accumulator, {macs} MACs"
    return ir.Kernel(ctx.name, tuple(_dedup(bufs)), loop, describe(ctx, extra), macs)


# ---- avg_pool2d, max_pool2d ------------------------------------------------------------------

@lowers("avg_pool2d", "max_pool2d", when=_int16_in)
def pool_int16(ctx: OpContext) -> ir.Kernel:
    """reference_integer_ops::AveragePool / MaxPool (int16): windows clipped to the input, the
    average an int32 sum divided with rounding half away from zero; the output keeps the
    input's quantization (TFLM checks it), clamped to the fused activation's range."""
    x, y = ctx.input(0), ctx.output()
    N, H, W, C = x.shape
    _, OH, OW, _ = y.shape
    avg = ctx.node.op == "avg_pool2d"
    win = Window.of(ctx, ctx.attrs["filter"])
    act = ctx.attrs["activation"]
    lo, hi = activation_range(act, *_q(y))
    acc = ir.Var("acc")
    bufs = list(ctx.io_buffers())
    if avg:
        count_y = _counts(ctx, win, 0, "count_h", bufs)
        count_x = _counts(ctx, win, 1, "count_w", bufs)

    def body(n, oy, ox, c):
        def tap(iy, ix, fy, fx):
            v = ir.cast(ir.Load("x", ir.flat_index([n, iy, ix, c], [N, H, W, C]), I16), "int32")
            return [ir.Assign("acc", acc + v if avg else ir.vmax(acc, v))]
        stmts = [ir.Decl("acc", "int32", _c(0 if avg else LIMITS[I16][0])),
                 *win.taps(oy, ox, tap, ("fy", "fx"))]
        if avg:
            stmts.append(ir.Assign("acc", ir.call("mf_div_round_i32", acc,
                                                  count_y(oy) * count_x(ox))))
        out = ir.flat_index([n, oy, ox, c], [N, OH, OW, C])
        return stmts + [ir.Store("y", out, ir.cast(ir.clamp(acc, _c(lo), _c(hi)), I16))]

    loop = ir.loops([("n", N), ("oy", OH), ("ox", OW), ("c", C)], body)
    (fh, fw), (sh, sw) = win.filter_hw, win.stride
    extra = (f"filter {fh}x{fw}, stride {sh}x{sw}, padding {ctx.attrs['padding']}, "
             f"activation {act} = [{lo}, {hi}]")
    return ir.Kernel(ctx.name, tuple(bufs), loop, describe(ctx, extra))


# ---- add, mul --------------------------------------------------------------------------------

def _smaller_than_one(real: float) -> tuple:
    try:
        return qp.quantize_multiplier_smaller_than_one_exp(real)
    except ValueError:
        raise NotImplementedError(f"int16 ADD multiplier {real} is not in (0, 1) (TFLM aborts)")


@lowers("add", when=lambda ctx: ctx.output().dtype == I16)
def add_int16(ctx: OpContext) -> ir.Kernel:
    """CalculateOpDataAdd (micro/kernels/add_common.cc) with left_shift 15, ratios in double,
    evaluated by reference_ops::AddElementwise / BroadcastAdd6DSlow (TFLM passes
    pot_scale=false, so even power-of-two scales take this general path)."""
    (s1, z1), (s2, z2), (so, zo) = _q(ctx.input(0)), _q(ctx.input(1)), _q(ctx.output())
    act = ctx.attrs["activation"]
    twice_max = 2.0 * max(s1, s2)
    m1, sh1 = _smaller_than_one(s1 / twice_max)
    m2, sh2 = _smaller_than_one(s2 / twice_max)
    mo, sho = _smaller_than_one(twice_max / ((1 << 15) * so))
    lo, hi = activation_range(act, so, zo)

    def value(a, b):
        r1 = ir.call("mf_rescale_q", a, _c(-z1), _c(15), _c(m1), _c(sh1))
        r2 = ir.call("mf_rescale_q", b, _c(-z2), _c(15), _c(m2), _c(sh2))
        v = ir.call("mf_mbqm_lt1", r1 + r2, _c(mo), _c(sho)) + zo
        return ir.cast(ir.clamp(v, _c(lo), _c(hi)), I16)
    return _elementwise(ctx, value, f"TFLM int16 ADD: inputs << 15 rescaled to a common scale, "
                                    f"the sum requantized; activation {act} = [{lo}, {hi}]")


@lowers("mul", when=lambda ctx: ctx.output().dtype == I16)
def mul_int16(ctx: OpContext) -> ir.Kernel:
    """CalculateOpDataMul (micro/kernels/mul_common.cc): QuantizeMultiplier(double(s1) *
    double(s2) / double(s_out)); MulElementwise / BroadcastMul6DSlow with zero points 0 (TFLM
    requires them)."""
    (s1, z1), (s2, z2), (so, zo) = _q(ctx.input(0)), _q(ctx.input(1)), _q(ctx.output())
    if z1 or z2 or zo:
        raise NotImplementedError("int16 MUL with a non-zero zero point (TFLM rejects it)")
    act = ctx.attrs["activation"]
    mult, shift = qp.quantize_multiplier(s1 * s2 / so)
    lo, hi = activation_range(act, so, zo)

    def value(a, b):
        v = ir.call("mf_mbqm", ir.cast(a, "int32") * ir.cast(b, "int32"), _c(mult), _c(shift))
        return ir.cast(ir.clamp(v, _c(lo), _c(hi)), I16)
    return _elementwise(ctx, value, f"TFLM int16 MUL: the int32 product requantized; "
                                    f"activation {act} = [{lo}, {hi}]")


# ---- softmax ---------------------------------------------------------------------------------

def lut_int16(input_scale, input_zero_point, output_scale, output_zero_point, fn) -> np.ndarray:
    """LUTPopulateInt16<float> (kernels/internal/common.h): 512 samples of fn over the input
    range plus the end point, each corrected by half the error of linear interpolation at the
    segment's midpoint; every step in float32, fn included (float32 in, float32 out)."""
    f = F32
    in_min = f(input_scale) * f(-32768 - input_zero_point)
    in_max = f(input_scale) * f(32767 - input_zero_point)
    out_min = f(output_scale) * f(-32768 - output_zero_point)
    out_max = f(output_scale) * f(32767 - output_zero_point)
    step = (in_max - in_min) / f(512)
    half_step = step / f(2)
    inv = f(65536) / (out_max - out_min)
    clamp = lambda v: int(min(max(v, f(-32768)), f(32767)))  # noqa: E731
    lut = []
    for i in range(512):
        val = fn(in_min + f(i) * step)
        val_mid = fn(in_min + f(i) * step + half_step)
        val_next = fn(in_min + f(i + 1) * step)
        sample = _roundf(val * inv)
        interpolated = _roundf((val_next * inv + _roundf(val * inv)) / f(2))
        bias = _roundf((interpolated - _roundf(val_mid * inv)) / f(2))
        lut.append(clamp(sample - bias))
    lut.append(clamp(_roundf(fn(in_max) * inv)))
    return np.array(lut, dtype=np.int16)


def _expf(v) -> F32:
    """std::exp on a float: the double result rounded to float32. glibc's expf differs from
    it in the last bit for ~0.1% of arguments, but the tables come out identical (checked)."""
    return F32(math.exp(float(F32(v))))


@functools.lru_cache(maxsize=None)
def softmax_int16_luts() -> tuple:
    """InitializeLutForInt16 (micro/kernels/softmax_common.cc): exp on [-10, 0] (input scale
    10 / 65535, zero point 32767) and 1 / (1 + x) on [0, 1] (scale 1 / 65535, zero point
    -32768), both to scale 2 / 65535. The same for every model."""
    span = F32(65535)
    exp_lut = lut_int16(F32(10.0) / span, 32767, F32(2.0) / span, 0, _expf)
    recip_lut = lut_int16(F32(1.0) / span, -32768, F32(2.0) / span, 0,
                          lambda v: F32(1.0) / (F32(1.0) + F32(v)))
    return exp_lut, recip_lut


def softmax_int16_params(input_scale: float, beta: float) -> tuple:
    """CalculateSoftmaxParams, int16 input: QuantizeMultiplier(double(input_scale) *
    double(beta) / (10.0 / 65535.0)), so that differences of [-65535, 0] span [-10, 0]."""
    return qp.quantize_multiplier(float(F32(input_scale)) * float(F32(beta)) / (10.0 / 65535.0))


def _rows(ctx: OpContext, fn: str, args: list, consts: list, extra: str) -> ir.Kernel:
    x = ctx.input(0)
    n = x.shape[-1]
    rows = x.size // n
    body = ir.loops([("r", rows)], lambda r: [
        ir.CallStmt(fn, (ir.Ptr("x", r * n), ir.Ptr("y", r * n), _c(n), *args))])
    return ir.Kernel(ctx.name, tuple(ctx.io_buffers() + consts), body,
                     describe(ctx, f"{extra}, {rows} rows of {n}"))


def _check_softmax_output(x, y):
    """CalculateSoftmaxParams' checks: int16 in -> zero points 0 and output scale 2^-15;
    int8 in -> output zero point -32768 and scale 2^-16 (both within 0.1%)."""
    zero, scale = (0, 1.0 / 32768) if x.dtype == I16 else (-32768, 1.0 / 65536)
    zy, sy = _q(y)[1], float(F32(y.quant.scale[0]))
    if (x.dtype == I16 and _q(x)[1]) or zy != zero or abs(sy - scale) > 0.001 * scale:
        raise NotImplementedError(f"{x.dtype} -> int16 softmax with output scale {sy} and zero "
                                  f"point {zy} (TFLM requires {scale}, {zero})")


@lowers("softmax", when=lambda ctx: ctx.output().dtype == I16)
def softmax_int16(ctx: OpContext) -> ir.Kernel:
    x, y = ctx.input(0), ctx.output()
    beta = ctx.attrs["beta"]
    _check_softmax_output(x, y)
    if x.dtype == "int8":  # reference_ops::Softmax<int8_t, int16_t>: int8's parameters
        mult, shift, diff_min = qp.softmax_params(x.quant.scale[0], beta)
        return _rows(ctx, "mf_softmax_s8_s16", [_c(mult), _c(shift), _c(diff_min)], [],
                     f"beta {beta}")
    mult, shift = softmax_int16_params(x.quant.scale[0], beta)
    exp_lut, recip_lut = softmax_int16_luts()
    luts = [const("exp_lut", exp_lut, I16, "exp(x) on [-10, 0], 513 points"),
            const("recip_lut", recip_lut, I16, "1 / (1 + x) on [0, 1], 513 points")]
    return _rows(ctx, "mf_softmax_s16", [_c(mult), _c(shift), ir.Ptr("exp_lut", _c(0)),
                                          ir.Ptr("recip_lut", _c(0))], luts, f"beta {beta}")


# ---- logistic, tanh --------------------------------------------------------------------------

def _checked_log2(x: float) -> tuple:
    """tflite::CheckedLog2 (quantization_util.cc), float32 throughout: (round(log2 x), whether
    x is within 1e-3 of that power of two in log2)."""
    log2 = F32(math.log(float(F32(x)))) * (F32(1.0) / F32(math.log(2.0)))
    rounded = _roundf(log2)
    return int(rounded), bool(abs(log2 - rounded) < F32(1e-3))


def lut_input_params(op: str, input_scale: float) -> tuple:
    """The int16 branch of LOGISTIC's / TANH's Prepare: (input_multiplier, input_left_shift)
    bringing the input to units of 1 / (3 * 4096). A power-of-two scale of 2^-12 (TANH also
    2^-11) gives multiplier 0 (mf_lut_input_s16 makes it 3 << shift); any other scale a
    multiplier doubled (double) while <= 32767 / 2, then truncated."""
    log2, pot = _checked_log2(input_scale)
    shift = 12 + log2
    if pot and shift in ((0,) if op == "logistic" else (0, 1)):
        return 0, shift
    mult, shift = float(F32(input_scale)) * 4096.0 * 3.0, 0
    while mult <= 32767.0 / 2.0 and shift <= 30:
        shift += 1
        mult *= 2.0
    return int(mult), shift


@lowers("logistic", "tanh", when=_int16_in)
def logistic_tanh_int16(ctx: OpContext) -> ir.Kernel:
    x, y = ctx.input(0), ctx.output()
    op = ctx.node.op
    if _q(x)[1] or _q(y)[1]:
        raise NotImplementedError(f"int16 {op} with a non-zero zero point (TFLM rejects it)")
    if _checked_log2(y.quant.scale[0]) != (-15, True):
        raise NotImplementedError(f"int16 {op} output scale {y.quant.scale[0]} is not 2^-15 "
                                  "(TFLM rejects it)")
    mult, shift = lut_input_params(op, x.quant.scale[0])
    fn = "mf_logistic_s16" if op == "logistic" else "mf_tanh_s16"
    return _elementwise(ctx, lambda p: ir.call(fn, p, _c(mult), _c(shift), dtype=I16),
                        f"input multiplier {mult}, shift {shift}; output scale 2^-15")


# ---- relu, relu6, leaky_relu -----------------------------------------------------------------

@lowers("relu", when=_int16_in)
def relu_int16(ctx: OpContext) -> ir.Kernel:
    """CalculateReluOpData<int16_t> / ReluQuantized: requantized by QuantizeMultiplier(float32
    input_scale / output_scale), clamped to [max(-32768, zero point), 32767]."""
    (si, zi), (so, zo) = _q(ctx.input(0)), _q(ctx.output())
    if zi or zo:
        raise NotImplementedError("int16 RELU with a non-zero zero point (TFLM rejects it)")
    mult, shift = qp.quantize_multiplier(float(F32(si) / F32(so)))
    lo = max(-32768, zo + int(_roundf(F32(0.0) / F32(so))))
    return _elementwise(ctx, lambda p: ir.cast(ir.clamp(
        ir.call("mf_mbqm", ir.cast(p, "int32") - zi, _c(mult), _c(shift)) + zo, _c(lo),
        _c(32767)), I16), f"requantized, clamped to [{lo}, 32767]")


@lowers("relu6", when=_int16_in)
def relu6_int16(ctx: OpContext) -> ir.Kernel:
    """Relu6Prepare / Relu6Quantized<int16_t>: no requantization; the input clamped as
    `x > six ? six : x < zero ? zero : x`, zero = the input zero point, six =
    FloatToQuantizedType<int16_t>(6.0f, input scale, zero point)."""
    si, zi = _q(ctx.input(0))
    six = min(32767, max(-32768, round_half_away(F32(6.0) / F32(si)) + zi))

    def value(p):  # a bound at the type's limit clamps nothing (and C warns of the test)
        v = p if zi <= -32768 else ir.select(p.lt(_c(zi)), _c(zi), p)
        return ir.cast(v if six >= 32767 else ir.select(p.gt(_c(six)), _c(six), v), I16)
    return _elementwise(ctx, value, f"clamped to [{zi}, {six}] (the input's quantization)")


@lowers("leaky_relu", when=_int16_in)
def leaky_relu_int16(ctx: OpContext) -> ir.Kernel:
    """QuantizeLeakyRelu<int16_t>: x - zero point >= 0 requantized by the identity multiplier,
    else by the alpha one (its sign taken out first, as TFLM does), plus the output zero
    point, clamped to int16. Multipliers as qparams.leaky_relu_params (float32 ratios)."""
    x, y = ctx.input(0), ctx.output()
    p = qp.leaky_relu_params(*_q(x), *_q(y), ctx.attrs["alpha"])
    m_alpha = p["output_multiplier_alpha"]
    negative = m_alpha < 0
    zi, zo = p["input_offset"], p["output_offset"]

    def value(v):
        d = ir.cast(v, "int32") - zi
        pos = ir.call("mf_mbqm", d, _c(p["output_multiplier_identity"]),
                      _c(p["output_shift_identity"]))
        neg = ir.call("mf_mbqm", d, _c(abs(m_alpha)), _c(p["output_shift_alpha"]))
        neg = ir.Unary("-", neg, "int32") if negative else neg
        return ir.cast(ir.clamp(ir.select(d.ge(0), pos, neg) + zo, _c(-32768), _c(32767)), I16)
    return _elementwise(ctx, value, f"alpha {ctx.attrs['alpha']}")


# ---- mean ------------------------------------------------------------------------------------

@lowers("mean", when=_int16_in)
def mean_int16(ctx: OpContext) -> ir.Kernel:
    """reference_ops::QuantizedMeanOrSum<int16_t, int32_t> (compute_sum false): raw values
    summed in int32, then MultiplyByQuantizedMultiplier with 1/count folded into the
    multiplier (qparams.mean_params), + output zero point, clamped to int16."""
    x, y = ctx.input(0), ctx.output()
    axes = tuple(ctx.attrs["axes"])
    shape = tuple(x.shape)
    kept = [d for d in range(len(shape)) if d not in axes]
    count = int(np.prod([shape[d] for d in axes], dtype=np.int64))
    p = qp.mean_params(*_q(x), *_q(y), count)
    acc = ir.Var("acc")

    def body(*out_idx):
        idx = dict(zip(kept, out_idx))

        def add(*red_idx):
            full = {**idx, **dict(zip(axes, red_idx))}
            v = ir.Load("x", ir.flat_index([full[d] for d in range(len(shape))], shape), I16)
            return [ir.Assign("acc", acc + ir.cast(v, "int32"))]
        total = acc - p["input_zero_point"] * count
        v = ir.call("mf_mbqm", total, _c(p["mult"]), _c(p["shift"])) + p["output_zero_point"]
        out = ir.flat_index(list(out_idx), [shape[d] for d in kept])
        return [ir.Decl("acc", "int32", _c(0)), *ir.loops([(f"r{d}", shape[d]) for d in axes], add),
                ir.Store("y", out, ir.cast(ir.clamp(v, _c(-32768), _c(32767)), I16))]

    loop = ir.loops([(f"i{d}", shape[d]) for d in kept], body)
    return ir.Kernel(ctx.name, tuple(ctx.io_buffers()), loop,
                     describe(ctx, f"axes {axes}, keep_dims {ctx.attrs['keep_dims']}, "
                                   f"{count} each"))


# ---- quantize, dequantize --------------------------------------------------------------------

# the integer -> integer QUANTIZE pairs TFLM's kernel takes, but int8 -> int8 (elementwise.py)
REQUANTIZE = {("int16", "int8"), ("int8", "uint8"), ("uint8", "int8"), ("int8", "int16"),
              ("int8", "int32"), ("int16", "int16"), ("int16", "int32"), ("int32", "int8"),
              ("int32", "int16")}


def _requantize_case(ctx: OpContext) -> bool:
    return (ctx.input(0).dtype, ctx.output().dtype) in REQUANTIZE


@lowers("quantize", when=_requantize_case)
def requantize(ctx: OpContext) -> ir.Kernel:
    """PrepareQuantizeReference: QuantizeMultiplier(double(input_scale) / double(output_scale));
    reference_ops::Requantize: MultiplyByQuantizedMultiplier(x - input zero point) + output
    zero point, clamped to the output type (its int8 <-> uint8 shortcut gives the same)."""
    x, y = ctx.input(0), ctx.output()
    (si, zi), (so, zo) = _q(x), _q(y)
    mult, shift = qp.quantize_multiplier(si / so)
    lo, hi = LIMITS[y.dtype]

    def value(v):
        d = ir.call("mf_wrap_sub_i32", v, _c(zi)) if x.dtype == "int32" else \
            ir.cast(v, "int32") - zi
        out = ir.call("mf_wrap_add_i32", ir.call("mf_mbqm", d, _c(mult), _c(shift)), _c(zo))
        return ir.cast(out if y.dtype == "int32" else ir.clamp(out, _c(lo), _c(hi)), y.dtype)
    return _elementwise(ctx, value, f"requantized: multiplier {mult}, shift {shift}")


@lowers("quantize", when=lambda ctx: ctx.input(0).dtype == "float32"
        and ctx.output().dtype == I16)
def quantize_float_int16(ctx: OpContext) -> ir.Kernel:
    """reference_ops::AffineQuantize<float, int16_t>: TfLiteRound(x / scale) (float32 division,
    roundf) + zero point, clamped. Rounded values beyond +-1e6 are clamped there before the
    int conversion, so huge values and infinities saturate and NaN gives the lowest value
    (TFLM's float -> int32 conversion is undefined for them)."""
    s, zp = _q(ctx.output())
    big = ir.Const(1e6, "float32")

    def value(v):
        r = ir.call("mf_roundf", ir.binop("/", v, ir.Const(float(F32(s)), "float32")),
                    dtype="float32")
        r = ir.call("mf_min_f32", ir.call("mf_max_f32", r, ir.Unary("-", big, "float32"),
                                          dtype="float32"), big, dtype="float32")
        return ir.cast(ir.clamp(ir.cast(r, "int32") + zp, _c(-32768), _c(32767)), I16)
    return _elementwise(ctx, value, f"round(x / {s:.9g}) + {zp}, clamped to int16")


@lowers("dequantize", when=lambda ctx: ctx.input(0).dtype in ("int16", "uint8"))
def dequantize_int(ctx: OpContext) -> ir.Kernel:
    """reference_ops::Dequantize: (float)(double(scale) * (x - zero point)); one float32
    product gives the same bits (both round the exact product once)."""
    s, zp = _q(ctx.input(0))
    sc = ir.Const(float(F32(s)), "float32")
    return _elementwise(ctx, lambda v: sc * ir.cast(ir.cast(v, "int32") - zp, "float32"),
                        f"{s:.9g} * (x - {zp})")
