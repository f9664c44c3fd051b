"""TFLite converters: layer operators (BATCH_MATMUL, TRANSPOSE_CONV, L2_POOL_2D, RESIZE_*).

Registered in `tflite_ops.CONVERTERS` by `@op`; see tflite_ops for the conventions.

BATCH_MATMUL, TRANSPOSE_CONV and the RESIZE ops map onto the generic IR ops matmul,
conv_transpose2d and resize with the attribute `tflm=True`: codegen_c/lower/q_layers.py then
computes them exactly as TFLM's reference kernels do (float summation order, float32 or 10-bit
fixed-point resize coordinates, int32/int64 accumulators), for float32 as well as int8/int16.
L2_POOL_2D is a chain of existing float ops: x * x, average pool, square root, clamp.
"""
from __future__ import annotations

import numpy as np
import tflite

from mcuforge.ir.graph import Node

from .tflite_ops import Unsupported, activation, op, resolve_padding

_FLOAT, _INT8, _INT16 = "float32", "int8", "int16"


def _check_types(ctx, allowed: dict, *tensors):
    """The dtypes of `tensors` (a tuple) must be one of the keys of `allowed`, the combinations
    TFLM's kernel accepts; returns the matching value."""
    kinds = tuple(t.dtype for t in tensors)
    if kinds not in allowed:
        raise Unsupported(f"{ctx.code} on {'/'.join(kinds)} (TFLM accepts "
                          + ", ".join("/".join(k) for k in allowed) + ")")
    return allowed[kinds]


def _per_tensor(ctx, *tensors):
    for t in tensors:
        if t.quant is None:
            raise ctx.error(f"quantized tensor '{t.name}' has no quantization parameters")
        if t.quant.per_axis:
            raise Unsupported(f"per-channel quantization of '{t.name}'")


# ---- BATCH_MATMUL --------------------------------------------------------------------------

@op("BATCH_MATMUL")
def batch_matmul(ctx):
    """numpy matmul of the two inputs (batch axes broadcast); adj_x / adj_y transpose the last two
    axes of an operand first. TFLM: both inputs and the output of one type (float32, int8,
    int16 with zero points 0), ranks 2 to 5, per-tensor quantization."""
    o = ctx.options(tflite.BatchMatMulOptions)
    a, b, y = ctx.input(0), ctx.input(1), ctx.output()
    _check_types(ctx, {(_FLOAT,) * 3: 0, (_INT8,) * 3: 0, (_INT16,) * 3: 0}, a, b, y)
    if not (2 <= len(a.shape) <= 5 and 2 <= len(b.shape) <= 5):
        raise Unsupported(f"operand ranks {len(a.shape)} and {len(b.shape)} (TFLM: 2 to 5)")
    if a.dtype != _FLOAT:
        _per_tensor(ctx, a, b, y)
        if a.dtype == _INT16 and any(t.quant.zero_point[0] != 0 for t in (a, b, y)):
            raise Unsupported("int16 BATCH_MATMUL with a non-zero zero point (TFLM rejects it)")
    adj_x, adj_y = bool(o.AdjX()), bool(o.AdjY())
    sa, sb = list(a.shape), list(b.shape)
    if adj_x:
        sa[-2:] = sa[-1], sa[-2]
    if adj_y:
        sb[-2:] = sb[-1], sb[-2]
    if sa[-1] != sb[-2]:
        raise ctx.error(f"inner dimensions differ: {a.shape} x {b.shape} "
                        f"(adj_x {adj_x}, adj_y {adj_y})")
    try:
        batch = tuple(np.broadcast_shapes(tuple(sa[:-2]), tuple(sb[:-2])))
    except ValueError:
        raise ctx.error(f"batch dimensions of {a.shape} and {b.shape} do not broadcast") from None
    if tuple(y.shape) != batch + (sa[-2], sb[-1]):
        raise ctx.error(f"output shape {y.shape} is not {batch + (sa[-2], sb[-1])}")
    return ctx.node("matmul", {"tflm": True, "adj_x": adj_x, "adj_y": adj_y})


# ---- TRANSPOSE_CONV ------------------------------------------------------------------------

def transpose_conv_padding(padding, out_size: int, filter_size: int, stride: int) -> int:
    """TFLM's padding before the first output row/column: ComputePaddingHeightWidth run on the
    *output* size as if it were a convolution's input (the transposed conv's input size plays
    no part), the odd pixel of the total going after."""
    (before, _), _ = resolve_padding(padding, (out_size,), (filter_size,), (stride,), (1,))
    return before


@op("TRANSPOSE_CONV")
def transpose_conv(ctx):
    """Inputs (output_shape, weights OHWI, x, bias?). TFLM takes the output size from the
    output tensor (output_shape is not read at run time); weights and bias may be activations.
    Types: float32; int8 with int8 weights (per-channel or per-tensor) and an int32 bias; int16
    with int8 weights and an int64 (or int16) bias."""
    o = ctx.options(tflite.TransposeConvOptions)
    w, x, y = ctx.input(1), ctx.input(2), ctx.output()
    bias = ctx.input(3) if len(ctx.inputs) > 3 and ctx.inputs[3] else None
    bias_types = _check_types(ctx, {(_FLOAT, _FLOAT, _FLOAT): (_FLOAT,),
                                    (_INT8, _INT8, _INT8): ("int32",),
                                    (_INT16, _INT8, _INT16): ("int64", "int16")}, x, w, y)
    if bias is not None and bias.dtype not in bias_types:
        raise Unsupported(f"{bias.dtype} bias with {x.dtype} input (TFLM: {bias_types})")
    if len(x.shape) != 4 or len(w.shape) != 4 or len(y.shape) != 4:
        raise ctx.error(f"expects 4-D input, weights and output: {x.shape}, {w.shape}, {y.shape}")
    n, h, wd, c = x.shape
    out_c, kh, kw, in_c = w.shape
    if in_c != c or y.shape[0] != n or y.shape[3] != out_c:
        raise ctx.error(f"shapes do not agree: input {x.shape}, weights {w.shape}, "
                        f"output {y.shape}")
    if bias is not None and bias.size != out_c:
        raise ctx.error(f"bias has {bias.size} values for {out_c} output channels")
    if x.dtype != _FLOAT:
        _per_tensor(ctx, x, y)
        if w.quant is None or len(w.quant.scale) not in (1, out_c) or \
                (w.quant.per_axis and w.quant.axis != 0):
            raise Unsupported("weights quantization that is neither per-tensor nor per output "
                              "channel (axis 0)")
    stride = (o.StrideH(), o.StrideW())
    if min(stride) < 1:
        raise ctx.error(f"invalid stride {stride}")
    pads = []
    for size_in, size_out, k, s in zip((h, wd), y.shape[1:3], (kh, kw), stride):
        before = transpose_conv_padding(o.Padding(), size_out, k, s)
        after = (size_in - 1) * s + k - before - size_out  # what the IR's output size implies
        pads.append((before, max(after, 0), max(-after, 0)))
    attrs = {"stride": stride, "dilation": (1, 1),
             "padding": (pads[0][0], pads[0][1], pads[1][0], pads[1][1]),
             "output_padding": (pads[0][2], pads[1][2]),
             "activation": activation(o.FusedActivationFunction()), "tflm": True}
    inputs = (ctx.inputs[2], ctx.inputs[1], bias.name if bias is not None else "")
    return ctx.node("conv_transpose2d", attrs, inputs=inputs)


# ---- L2_POOL_2D ----------------------------------------------------------------------------

_CLAMPS = {"relu": (0.0, None), "relu6": (0.0, 6.0), "relu_n1_to_1": (-1.0, 1.0)}


@op("L2_POOL_2D")
def l2_pool_2d(ctx):
    """sqrt(mean of the squares over the window), float32 only (as TFLM). TFLM's reference sums
    val * val in window order and divides by the taps inside the input: exactly mcuforge's
    float avg_pool2d of x * x, so the op becomes mul -> avg_pool2d -> sqrt (-> clip)."""
    o = ctx.options(tflite.Pool2DOptions)
    x, y = ctx.input(0), ctx.output()
    _check_types(ctx, {(_FLOAT, _FLOAT): 0}, x, y)
    if len(x.shape) != 4 or len(y.shape) != 4:
        raise ctx.error(f"expects 4-D NHWC input and output, got {x.shape} -> {y.shape}")
    size, stride = (o.FilterHeight(), o.FilterWidth()), (o.StrideH(), o.StrideW())
    if min(size) < 1 or min(stride) < 1:
        raise ctx.error(f"invalid filter {size} or stride {stride}")
    pads, out = resolve_padding(o.Padding(), x.shape[1:3], size, stride, (1, 1))
    if tuple(y.shape) != (x.shape[0], *out, x.shape[3]):
        raise ctx.error(f"output shape {y.shape} disagrees with the computed size {out}")
    act = activation(o.FusedActivationFunction())
    squares = ctx.new_tensor("squares", x.shape, _FLOAT)
    mean = ctx.new_tensor("mean_squares", y.shape, _FLOAT)
    root = ctx.new_tensor("root", y.shape, _FLOAT) if act != "none" else y.name
    nodes = [Node("binary", (x.name, x.name), (squares,), {"fn": "mul"}),
             Node("avg_pool2d", (squares,), (mean,), {"filter": size, "stride": stride,
                                                       "padding": pads, "activation": "none"}),
             Node("unary", (mean,), (root,), {"fn": "sqrt"})]
    if act != "none":  # TFLM clamps the root, not the mean
        lo, hi = _CLAMPS[act]
        nodes.append(Node("unary", (root,), (y.name,), {"fn": "clip", "min": lo, "max": hi}))
    return nodes


# ---- RESIZE_BILINEAR / RESIZE_NEAREST_NEIGHBOR ---------------------------------------------

# TFLite's flags -> the closest ONNX coordinate transformation and nearest mode (the generic
# meaning of the IR op); the flags themselves stay in the attributes and are what the TFLM
# lowering computes with.
_NEAREST = {(False, False): ("asymmetric", "floor"),
            (True, False): ("align_corners", "round_prefer_ceil"),
            (False, True): ("half_pixel", "round_prefer_ceil"),
            (True, True): ("align_corners", "round_prefer_ceil")}
_LINEAR = {(False, False): "asymmetric", (True, False): "align_corners",
           (False, True): "half_pixel"}


@op("RESIZE_BILINEAR", "RESIZE_NEAREST_NEIGHBOR")
def resize(ctx):
    """Resize of the H and W axes of NHWC data to the constant int32 `size` (TFLM requires it
    constant). Output values are the input's quantized values interpolated (no requantization,
    as TFLM). TFLM: bilinear float32 / int8 (and align_corners excludes half_pixel_centers);
    nearest float32 / int8 / int16. int16 bilinear is TFLite's integer kernel (LiteRT)."""
    bilinear = ctx.code == "RESIZE_BILINEAR"
    o = ctx.options(tflite.ResizeBilinearOptions if bilinear
                    else tflite.ResizeNearestNeighborOptions)
    x, size, y = ctx.input(0), ctx.input(1), ctx.output()
    _check_types(ctx, {(t, t): 0 for t in (_FLOAT, _INT8, _INT16)}, x, y)
    if len(x.shape) != 4 or len(y.shape) != 4:
        raise ctx.error(f"expects 4-D NHWC input and output, got {x.shape} -> {y.shape}")
    if size.dtype != "int32" or size.shape != (2,):
        raise ctx.error(f"size must be int32 [2], got {size.dtype} {list(size.shape)}")
    if not size.is_const:
        raise Unsupported("size computed at run time (TFLM requires a constant)")
    hw = tuple(int(v) for v in size.data)
    if tuple(y.shape) != (x.shape[0], *hw, x.shape[3]):
        raise ctx.error(f"output shape {y.shape} disagrees with size {list(hw)}")
    if x.quant != y.quant:
        raise Unsupported("output quantization differs from the input's (TFLM does not "
                          "requantize)")
    flags = (bool(o.AlignCorners()), bool(o.HalfPixelCenters()))
    attrs = {"cubic_coeff_a": -0.75, "tflm": True, "align_corners": flags[0],
             "half_pixel_centers": flags[1]}
    if bilinear:
        if flags == (True, True):
            raise ctx.error("align_corners and half_pixel_centers are both set (TFLM rejects)")
        attrs.update(mode="linear", coordinate_transformation=_LINEAR[flags],
                     nearest_mode="floor")
    else:
        ctm, nearest = _NEAREST[flags]
        attrs.update(mode="nearest", coordinate_transformation=ctm, nearest_mode=nearest)
    return ctx.node("resize", attrs, inputs=ctx.inputs[:1])
