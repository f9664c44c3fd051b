"""Quantized ONNX -> int8 graph IR ops (TFLite/TFLM quantization conventions): the QOperator
converters QuantizeLinear, DequantizeLinear, QLinearConv, QLinearMatMul, QGemm, QLinearAdd,
QLinearMul, QLinearAveragePool, QLinearGlobalAveragePool and QLinearConcat, and the shared
helpers (quantization operands, int8 twins of uint8 tensors) the other quantized converters use.

QOperator format: QuantizeLinear, DequantizeLinear, QLinearConv, QLinearMatMul become the
graph IR's int8 conv2d / depthwise_conv2d / fully_connected with the tensors' quantization
(ir.graph.Quant) read from the scale and zero-point operands.
QDQ format: `fuse_qdq(model)` (frontend/onnx_qdq.py, re-exported here) rewrites
DequantizeLinear -> Conv/Gemm/MatMul -> QuantizeLinear (and quantization-preserving ops between
DQ and Q) into QLinearConv / QLinearMatMul before import, so the same converters run.

QLinearMatMul with a right operand that is batched, computed at run time or has per-column
zero points becomes the graph IR's int8 matmul with requant="onnxruntime"
(codegen_c/lower/matmul_ort.py: onnxruntime's int32 sums and float32 rescale); a constant 2-D
one fully_connected as before.

uint8 tensors: the int8 kernels are int8-only, so a uint8 tensor q_u (scale s, zero point z)
is carried as its int8 twin q_i = q_u - 128 with zero point z - 128 (same real values,
exact). The twin is made by a binary sub (uint8 - 128 -> int8, in range: no wrap) and turned
back by a binary add where the uint8 tensor itself is needed (a graph output); unused
conversions are dead code the optimizer removes.

conv2d / depthwise_conv2d / fully_connected carry requant="onnxruntime": their kernels rescale
as onnxruntime does (float32 scale, round half to even), not with TFLM's fixed-point multiplier.
So do the avg_pool2d of QLinearAveragePool / QLinearGlobalAveragePool (and of QDQ AveragePool /
GlobalAveragePool): onnxruntime's CPU kernels in one rounding (codegen_c/lower/pool_ort.py),
with the attribute zp_offset (128 when onnxruntime rounds with a uint8 zero point).

QLinearSigmoid, QLinearLeakyRelu, QLinearWhere and QLinearSoftmax (lookup-table converters)
are in frontend/onnx_quant_lut.py.

QuantizeLinear computes onnxruntime's formula exactly with generic float ops:
saturate(round_half_even(x / scale) + zero_point).

Version followed: onnxruntime 1.31.1, the version pinned in pyproject.toml's test extra
(tests/test_onnx_quant.py compares with it bit for bit); recheck these formulas when the pin
moves (1.32.0 computes com.microsoft QLinearSoftmax differently).
"""
from __future__ import annotations

import numpy as np

from mcuforge.ir.errors import ModelError
from mcuforge.ir.graph import Quant, Tensor

from .onnx_registry import Unsupported, from_nhwc, onnx_op, to_nhwc
from .onnx_layers import _window
from .onnx_qdq import (ORT_S8_TO_U8, float32_scales, fuse_qdq,  # noqa: F401  (re-exported)
                       record_shapes)

_INT8_RANGE = {"int8": (-128, 127), "uint8": (0, 255)}


# ---- quantization operands -----------------------------------------------------------------

def _qparams(scale, zp, what: str, axis: int | None = None, rank: int | None = None):
    """(float32 scales, int zero points as stored, axis) from constant operands."""
    if scale is None or not scale.is_const:
        raise Unsupported(f"{what}: the scale must be a constant")
    if zp is not None and not zp.is_const:
        raise Unsupported(f"{what}: the zero point must be a constant")
    s = np.asarray(scale.data, dtype=np.float32).reshape(-1)
    z = (np.zeros(s.shape, np.int64) if zp is None
         else np.asarray(zp.data).astype(np.int64).reshape(-1))
    if z.size == 1 and s.size > 1:
        z = np.repeat(z, s.size)
    if z.size != s.size:
        raise Unsupported(f"{what}: {s.size} scales but {z.size} zero points")
    ax = 0
    if s.size > 1 and axis is not None and rank is not None:
        ax = axis % rank
    return s, z, ax


def _qdtype(t, zp, what: str) -> str:
    dt = t.dtype if t is not None else (zp.dtype if zp is not None else "uint8")
    if dt not in _INT8_RANGE:
        raise Unsupported(f"{what}: {dt} quantized tensors (int8 and uint8 only)")
    return dt


def _quant8(s, z, dtype: str, axis: int = 0) -> Quant:
    """The int8 twin's quantization of a (u)int8 tensor's scale and zero point."""
    off = 128 if dtype == "uint8" else 0
    return Quant(tuple(float(v) for v in s), tuple(int(v) - off for v in z), axis)


def _twins(ctx) -> dict:
    """uint8 tensor name -> its int8 twin, per import."""
    return ctx.b.__dict__.setdefault("_int8_twins", {})


def as_int8(ctx, t: Tensor, quant: Quant) -> Tensor:
    """An int8 tensor holding `t` (int8 or uint8) with `quant` (already int8-shifted)."""
    if t.is_const:
        data = np.asarray(t.data).astype(np.int32) - (128 if t.dtype == "uint8" else 0)
        c = ctx.const(data.astype(np.int8), "int8", "q")
        return ctx.b.add_tensor(Tensor(c.name, c.shape, "int8", c.data, quant))
    if t.dtype == "int8" and t.quant == quant:
        return t
    src = _twins(ctx).get(t.name, t) if t.dtype == "uint8" else t
    if src.dtype == "int8" and src.quant == quant:
        return src
    y = ctx.b.add_tensor(Tensor(ctx.tmp(t.shape, "int8", "i8").name, t.shape, "int8",
                                quant=quant))
    if src.dtype == "int8":  # the same bytes under other quantization parameters
        ctx.emit("reshape", [src], [y])
    else:  # uint8 - 128: exact, within int8
        ctx.emit("binary", [src, ctx.const(np.int16(128), "int16", "u8off")], [y], fn="sub")
    if t.dtype == "uint8":
        _twins(ctx)[t.name] = y
    return y


def out_int8(ctx, out: Tensor, quant: Quant, shape=None) -> Tensor:
    """The int8 tensor a converter writes for its (u)int8 output `out`; a uint8 output is
    produced from it by + 128. `shape` gives an NHWC intermediate instead (the caller then
    transposes into the returned tensor's consumer)."""
    if out.dtype == "int8":
        return ctx.b.add_tensor(Tensor(out.name, out.shape, "int8", quant=quant))
    y = ctx.b.add_tensor(Tensor(ctx.tmp(out.shape, "int8", "i8").name, out.shape, "int8",
                                quant=quant))
    ctx.emit("binary", [y, ctx.const(np.int16(128), "int16", "u8off")], [out], fn="add")
    _twins(ctx)[out.name] = y
    return y


def _emit_first(ctx, n_before: int):
    """Move the nodes emitted after index n_before to the end (keeps producer order)."""
    nodes = ctx.b.nodes
    tail = nodes[n_before:]
    # the conversion nodes emitted by out_int8 read the converter's result: put them last
    conv = [n for n in tail if n.op == "binary" and n.attrs.get("fn") == "add"
            and n.outputs[0] in {o.name for o in ctx.outputs if o is not None}]
    rest = [n for n in tail if n not in conv]
    nodes[n_before:] = rest + conv


# ---- QuantizeLinear / DequantizeLinear ------------------------------------------------------

_RANGES = {**_INT8_RANGE, "int16": (-32768, 32767)}


def _affine(ctx, x, scale, zp, axis: int, block_size: int, what: str):
    """Constant float32 scale and zero-point arrays broadcastable to x: per tensor, per axis,
    or per block of `block_size` along the axis (repeated out at import)."""
    if not scale.is_const or (zp is not None and not zp.is_const):
        raise Unsupported(f"{what}: the scale and zero point must be constants")
    s = np.asarray(scale.data, dtype=np.float32)
    z = np.zeros(s.shape, np.float32) if zp is None else np.asarray(zp.data).astype(np.float32)
    rank = len(x.shape)
    ax = axis % rank if rank else 0
    what = f"{what} node '{ctx.name}'"
    if z.size != s.size:  # the spec requires the same shape (found by fuzz-files)
        raise ModelError(f"{what}: {z.size} zero points for {s.size} scales; they must have "
                         "the same shape")
    if not block_size and s.size > 1 and (s.ndim != 1 or not rank or s.size != x.shape[ax]):
        raise ModelError(f"{what}: {s.size} scales along axis {ax} of a tensor of shape "
                         f"{list(x.shape)}")
    if block_size:
        if s.ndim != rank:
            raise Unsupported(f"{what}: blocked scales of rank {s.ndim} for rank {rank}")
        s = np.repeat(s, block_size, axis=ax).take(range(x.shape[ax]), axis=ax)
        z = np.repeat(z, block_size, axis=ax).take(range(x.shape[ax]), axis=ax)
    elif s.size > 1:
        shape = [1] * rank
        shape[ax] = s.size
        s, z = s.reshape(shape), z.reshape(shape)
    else:
        s, z = s.reshape(()), z.reshape(())
    return s, z, ax


@onnx_op("QuantizeLinear", since=10)
def QuantizeLinear(ctx, x, y_scale, y_zero_point=None, axis=1, saturate=1, block_size=0,
                   output_dtype=0, precision=0):
    """float32 -> (u)int8 | int16 as onnxruntime: saturate(round_half_even(x / s) + zp), per
    tensor, per axis or per block. (u)int8 results carry their quantization (int8 twin)."""
    if x.dtype != "float32":
        raise Unsupported(f"QuantizeLinear of {x.dtype}")
    out = ctx.out()
    dt = out.dtype
    if dt not in _RANGES:
        raise Unsupported(f"QuantizeLinear to {dt} (int8, uint8 and int16 only)")
    f32 = lambda hint: ctx.tmp(x.shape, "float32", hint)
    start = len(ctx.b.nodes)
    if y_scale.is_const and (y_zero_point is None or y_zero_point.is_const):
        s, z, ax = _affine(ctx, x, y_scale, y_zero_point, axis, block_size, "QuantizeLinear")
        s_t, z_t = ctx.const(s, "float32", "s"), ctx.const(z, "float32", "zp")
    elif y_scale.size == 1 and not block_size:  # computed at run time: no int8 twin
        s, z, ax, s_t = None, None, 0, y_scale
        z_t = ctx.const(np.float32(0), "float32", "zp")
        if y_zero_point is not None:
            z_t = ctx.tmp(y_zero_point.shape, "float32", "zpf")
            ctx.emit("cast", [y_zero_point], [z_t])
    else:
        raise Unsupported("QuantizeLinear: per-axis scales computed at run time")
    q = f32("div")
    ctx.emit("binary", [x, s_t], [q], fn="div")
    r = f32("round")
    ctx.emit("unary", [q], [r], fn="round")
    v = f32("zp")
    ctx.emit("binary", [r, z_t], [v], fn="add")
    lo, hi = _RANGES[dt]
    c1 = f32("lo")
    ctx.emit("binary", [v, ctx.const(np.float32(lo), "float32", "lo")], [c1], fn="max")
    c2 = f32("hi")
    ctx.emit("binary", [c1, ctx.const(np.float32(hi), "float32", "hi")], [c2], fn="min")
    quant = (_quant8(s.reshape(-1), z.reshape(-1).astype(np.int64), dt, ax)
             if s is not None and dt in _INT8_RANGE and not block_size else None)
    if dt == "int8" and quant is not None:
        ctx.emit("cast", [c2], [out_int8(ctx, out, quant)])
    elif dt == "uint8" and quant is not None:
        ctx.emit("cast", [c2], [out])
        # the int8 twin straight from the float value: q - 128 is in range
        c3 = f32("i8")
        ctx.emit("binary", [c2, ctx.const(np.float32(128), "float32", "off")], [c3], fn="sub")
        y8 = ctx.b.add_tensor(Tensor(ctx.tmp(out.shape, "int8", "i8").name, out.shape, "int8",
                                     quant=quant))
        ctx.emit("cast", [c3], [y8])
        _twins(ctx)[out.name] = y8
    else:
        ctx.emit("cast", [c2], [out])
    _emit_first(ctx, start)


@onnx_op("DequantizeLinear", since=10)
def DequantizeLinear(ctx, x, x_scale, x_zero_point=None, axis=1, block_size=0,
                     output_dtype=0):
    """(u)int8 | int16 | int32 -> float32: (x - zp) * s in float32 like onnxruntime, per
    tensor, per axis or per block."""
    if x.dtype not in ("int8", "uint8", "int16", "int32"):
        raise Unsupported(f"DequantizeLinear of {x.dtype}")
    out = ctx.out()
    if out.dtype != "float32":
        raise Unsupported(f"DequantizeLinear to {out.dtype}")
    s, z, _ = _affine(ctx, x, x_scale, x_zero_point, axis, block_size, "DequantizeLinear")
    xf = ctx.tmp(x.shape, "float32", "f")
    ctx.emit("cast", [x], [xf])
    d = ctx.tmp(x.shape, "float32", "d")
    ctx.emit("binary", [xf, ctx.const(z, "float32", "zp")], [d], fn="sub")
    ctx.emit("binary", [d, ctx.const(s, "float32", "s")], [out], fn="mul")


# ---- QLinearConv / QLinearMatMul -------------------------------------------------------------

def _weights(w, w_scale, w_zp, what: str, axis: int):
    """(int8 weight data (uint8 shifted by 128), float32 scales, int8 zero point); refuses
    per-channel zero points, which the int8 kernels cannot express."""
    if not w.is_const:
        raise Unsupported(f"{what}: the weights must be a constant (they are computed at run "
                          "time)")
    s, z, _ = _qparams(w_scale, w_zp, what)
    data = np.asarray(w.data).astype(np.int32)
    if w.dtype == "uint8":
        data, z = data - 128, z - 128
    elif w.dtype != "int8":
        raise Unsupported(f"{what}: {w.dtype} weights")
    if np.any(z != z[0]):
        raise Unsupported(f"{what}: per-channel weight zero points {z.tolist()} (the int8 "
                          "kernels take one weight zero point)")
    return data.astype(np.int8), s, int(z[0])


def _wquant(ws, wz: int, n: int, axis: int) -> Quant:
    """Weight quantization: per channel over n outputs (zero point wz) or per tensor."""
    if ws.size > 1:
        return Quant(tuple(float(v) for v in np.broadcast_to(ws, (n,))), (wz,) * n, axis)
    return Quant((float(ws[0]),), (wz,), axis)


def _bias(ctx, b, x_s, w_s, n: int, what: str):
    if b is None:
        return None
    if not b.is_const or b.dtype != "int32":
        raise Unsupported(f"{what}: the bias must be a constant int32 tensor")
    scales = np.broadcast_to(np.float32(x_s) * w_s.astype(np.float32), (n,))
    quant = Quant(tuple(float(v) for v in scales), (0,) * n, 0)
    c = ctx.const(np.asarray(b.data).reshape(-1).astype(np.int32), "int32", "bias")
    return ctx.b.add_tensor(Tensor(c.name, c.shape, "int32", c.data, quant))


def _to_nhwc_q(ctx, x: Tensor) -> Tensor:
    y = to_nhwc(ctx, x)
    y = ctx.b.add_tensor(Tensor(y.name, y.shape, y.dtype, quant=x.quant))
    if len(x.shape) == 3:  # NCL -> N1LC
        n, length, c = y.shape
        y4 = ctx.b.add_tensor(Tensor(ctx.tmp((n, 1, length, c), "int8", "nhwc").name,
                                     (n, 1, length, c), "int8", quant=x.quant))
        ctx.emit("reshape", [y], [y4])
        y = y4
    return y


def _from_nhwc_q(ctx, op: str, inputs: list, y: Tensor, **attrs):
    """Emit the NHWC layer op writing into the NCHW (or NCL) int8 tensor y."""
    n, c, *sp = y.shape
    shape = (n, *([1] * (2 - len(sp)) + sp), c)
    t = ctx.b.add_tensor(Tensor(ctx.tmp(shape, "int8", "nhwc").name, shape, "int8",
                                quant=y.quant))
    ctx.emit(op, [i for i in inputs if i is not None], [t], **attrs)
    _back_to_nchw(ctx, t, y)


def _back_to_nchw(ctx, t: Tensor, y: Tensor) -> None:
    """An NHWC int8 result back into the node's NCHW (or NCL: a unit H is dropped) output."""
    n, c, *sp = y.shape
    if len(sp) == 1:
        t3 = ctx.b.add_tensor(Tensor(ctx.tmp((n, sp[0], c), "int8", "nlc").name,
                                     (n, sp[0], c), "int8", quant=y.quant))
        ctx.emit("reshape", [t], [t3])
        t = t3
    from_nhwc(ctx, t, y)


@onnx_op("QLinearConv", since=10)
def QLinearConv(ctx, x, x_scale, x_zero_point, w, w_scale, w_zero_point, y_scale, y_zero_point,
                B=None, auto_pad="NOTSET", dilations=None, group=1, kernel_shape=None, pads=None,
                strides=None):
    what = "QLinearConv"
    if len(x.shape) not in (3, 4):
        raise Unsupported(f"{what}: {len(x.shape) - 2}-D input (1-D and 2-D only)")
    xs, xz, _ = _qparams(x_scale, x_zero_point, what)
    ys, yz, _ = _qparams(y_scale, y_zero_point, what)
    if xs.size != 1 or ys.size != 1:
        raise Unsupported(f"{what}: per-channel activation quantization")
    wd, ws, wz = _weights(w, w_scale, w_zero_point, what, 0)
    out = ctx.out()
    attrs, _ = _window(x, out, w.shape[2:], strides, dilations, pads, auto_pad)
    if wd.ndim == 3:
        wd = wd[:, :, None, :]
    O, I = wd.shape[:2]
    C = x.shape[1]
    if ws.size not in (1, O):
        raise Unsupported(f"{what}: {ws.size} weight scales for {O} output channels")
    start = len(ctx.b.nodes)
    x8 = as_int8(ctx, x, _quant8(xs, xz, _qdtype(x, x_zero_point, what)))
    y8 = out_int8(ctx, out, _quant8(ys, yz, _qdtype(out, y_zero_point, what)))
    bias = _bias(ctx, B, xs[0], ws, O, what)
    xi = _to_nhwc_q(ctx, x8)
    depthwise = group > 1 and group == C and I == 1
    wq = _wquant(ws, wz, O, 3 if depthwise else 0)
    if depthwise:
        wc = ctx.const(np.ascontiguousarray(wd.transpose(1, 2, 3, 0)), "int8", "w")
        wc = ctx.b.add_tensor(Tensor(wc.name, wc.shape, "int8", wc.data, wq))
        _from_nhwc_q(ctx, "depthwise_conv2d", [xi, wc, bias], y8, **attrs,
                     depth_multiplier=O // C, activation="none", requant="onnxruntime")
    else:
        wc = ctx.const(np.ascontiguousarray(wd.transpose(0, 2, 3, 1)), "int8", "w")
        wc = ctx.b.add_tensor(Tensor(wc.name, wc.shape, "int8", wc.data, wq))
        _from_nhwc_q(ctx, "conv2d", [xi, wc, bias], y8, **attrs, activation="none",
                     requant="onnxruntime")
    _emit_first(ctx, start)


def _fc(ctx, what, a, as_, az, wd, ws, wz, bias_data, ys, yz, a_zp, y_zp):
    """fully_connected int8 with weights [out, in] (per-channel scales over out)."""
    out = ctx.out()
    O = wd.shape[0]
    if ws.size not in (1, O):
        raise Unsupported(f"{what}: {ws.size} weight scales for {O} outputs")
    start = len(ctx.b.nodes)
    a8 = as_int8(ctx, a, _quant8(as_, az, _qdtype(a, a_zp, what)))
    y8 = out_int8(ctx, out, _quant8(ys, yz, _qdtype(out, y_zp, what)))
    wq = _wquant(ws, wz, O, 0)
    wc = ctx.const(np.ascontiguousarray(wd), "int8", "w")
    wc = ctx.b.add_tensor(Tensor(wc.name, wc.shape, "int8", wc.data, wq))
    ctx.emit("fully_connected", [a8, wc, bias_data], [y8], activation="none",
             requant="onnxruntime")
    _emit_first(ctx, start)


@onnx_op("QLinearMatMul", since=10)
def QLinearMatMul(ctx, a, a_scale, a_zero_point, b, b_scale, b_zero_point, y_scale,
                  y_zero_point):
    """A constant 2-D right operand with one zero point: fully_connected (per-column scales:
    per channel). Otherwise (batched, computed at run time, per-column zero points): int8
    matmul with requant="onnxruntime" (codegen_c/lower/matmul_ort.py), numpy broadcasting of
    the batch dimensions; b per tensor or per column."""
    what = "QLinearMatMul"
    as_, az, _ = _qparams(a_scale, a_zero_point, what)
    ys, yz, _ = _qparams(y_scale, y_zero_point, what)
    bs, bz, _ = _qparams(b_scale, b_zero_point, what)
    if as_.size != 1 or ys.size != 1:
        raise Unsupported(f"{what}: per-axis activation quantization")
    if b.is_const and len(b.shape) == 2 and np.all(bz == bz[0]):
        wd, ws, wz = _weights(b, b_scale, b_zero_point, what, 1)
        _fc(ctx, what, a, as_, az, np.ascontiguousarray(wd.T), ws, wz, None, ys, yz,
            a_zero_point, y_zero_point)
        return
    n = b.shape[-1] if len(b.shape) > 1 else 1
    if bs.size > 1:  # per column: [N], or b's rank with every dimension but the last 1
        shape = tuple(b_scale.shape)
        if len(b.shape) < 2 or bs.size != n or len(shape) > len(b.shape) \
                or any(d != 1 for d in shape[:-1]):
            raise Unsupported(f"{what}: b quantized with scales of shape {list(shape)} for b "
                              f"of shape {list(b.shape)} (per tensor or per column only)")
    out = ctx.out()
    start = len(ctx.b.nodes)
    a8 = as_int8(ctx, a, _quant8(as_, az, _qdtype(a, a_zero_point, what)))
    b8 = as_int8(ctx, b, _quant8(bs, bz, _qdtype(b, b_zero_point, what),
                                 len(b.shape) - 1 if bs.size > 1 else 0))
    y8 = out_int8(ctx, out, _quant8(ys, yz, _qdtype(out, y_zero_point, what)))
    ctx.emit("matmul", [a8, b8], [y8], requant="onnxruntime")
    _emit_first(ctx, start)


@onnx_op("QGemm")
def QGemm(ctx, a, a_scale, a_zero_point, b, b_scale, b_zero_point, c=None, y_scale=None,
          y_zero_point=None, alpha=1.0, transA=0, transB=0):
    """com.microsoft QGemm (quantize_static's QOperator Gemm): int32 bias C, int8 output."""
    what = "QGemm"
    if y_scale is None or transA or alpha != 1.0 or not b.is_const or len(b.shape) != 2:
        raise Unsupported(f"{what}: only a quantized output, transA=0, alpha=1 and a constant "
                          "B")
    as_, az, _ = _qparams(a_scale, a_zero_point, what)
    ys, yz, _ = _qparams(y_scale, y_zero_point, what)
    wd, ws, wz = _weights(b, b_scale, b_zero_point, what, 0)
    wd = wd if transB else np.ascontiguousarray(wd.T)
    bias = _bias(ctx, c, as_[0], ws, wd.shape[0], what)
    _fc(ctx, what, a, as_, az, wd, ws, wz, bias, ys, yz, a_zero_point, y_zero_point)


# ---- com.microsoft QLinearAdd / QLinearMul / pools / QLinearConcat --------------------------

def _act_quant(t, scale, zp, what: str) -> Quant:
    """Per-tensor int8-twin quantization of an activation operand."""
    s, z, _ = _qparams(scale, zp, what)
    if s.size != 1:
        raise Unsupported(f"{what}: per-axis activation quantization")
    return _quant8(s, z, _qdtype(t, zp, what))


def requantize(ctx, t8: Tensor, quant: Quant) -> Tensor:
    """t8 (int8) under `quant`: itself, or an int8 -> int8 "quantize" (TFLM's Requantize)."""
    if t8.quant == quant:
        return t8
    y = ctx.b.add_tensor(Tensor(ctx.tmp(t8.shape, "int8", "rq").name, t8.shape, "int8",
                                quant=quant))
    ctx.emit("quantize", [t8], [y])
    return y


def _binary_q(ctx, op: str, a, a_scale, a_zp, b, b_scale, b_zp, c_scale, c_zp):
    what = ctx.node.op_type
    out = ctx.out()
    start = len(ctx.b.nodes)
    a8 = as_int8(ctx, a, _act_quant(a, a_scale, a_zp, what))
    b8 = as_int8(ctx, b, _act_quant(b, b_scale, b_zp, what))
    y8 = out_int8(ctx, out, _act_quant(out, c_scale, c_zp, what))
    ctx.emit(op, [a8, b8], [y8], activation="none")
    _emit_first(ctx, start)


@onnx_op("QLinearAdd")
def QLinearAdd(ctx, A, A_scale, A_zero_point, B, B_scale, B_zero_point, C_scale,
               C_zero_point=None):
    """com.microsoft QLinearAdd -> int8 add (TFLM's kernel; broadcasting)."""
    _binary_q(ctx, "add", A, A_scale, A_zero_point, B, B_scale, B_zero_point, C_scale,
              C_zero_point)


@onnx_op("QLinearMul")
def QLinearMul(ctx, A, A_scale, A_zero_point, B, B_scale, B_zero_point, C_scale,
               C_zero_point=None):
    """com.microsoft QLinearMul -> int8 mul (TFLM's kernel; broadcasting)."""
    _binary_q(ctx, "mul", A, A_scale, A_zero_point, B, B_scale, B_zero_point, C_scale,
              C_zero_point)


def _zp_offset(ctx, t, zp) -> int:
    """What the int8 twin's zero point lacks of the one onnxruntime rounds with: 128 for a
    uint8 output or an int8 QDQ pool that onnxruntime runs as uint8 (fuse_qdq), else 0."""
    if _qdtype(t, zp, ctx.node.op_type) == "uint8" or ctx.node.doc_string == ORT_S8_TO_U8:
        return 128
    return 0


@onnx_op("QLinearAveragePool")
def QLinearAveragePool(ctx, X, x_scale, x_zero_point, y_scale, y_zero_point=None,
                       auto_pad="NOTSET", ceil_mode=0, channels_last=0, count_include_pad=0,
                       kernel_shape=None, pads=None, strides=None):
    """int8 avg_pool2d with requant="onnxruntime": onnxruntime's QLinearAveragePool (CPU) in
    one rounding, in and out quantization alike or not (codegen_c/lower/pool_ort.py). A window
    over the whole plane without padding takes its global-average-pool integer path; others its
    float one, padding counted or not, every window clipped to the input (SAME, explicit pads,
    ceil_mode). zp_offset = 128 for a uint8 output, or an int8 QDQ pool onnxruntime runs as
    uint8 (fuse_qdq's ORT_S8_TO_U8): onnxruntime adds the uint8 zero point in float before
    rounding. Refused: channels_last, dilations (the com.microsoft op has none)."""
    what = "QLinearAveragePool"
    if channels_last or len(X.shape) not in (3, 4):
        raise Unsupported(f"{what}: channels_last or a {len(X.shape) - 2}-D input")
    out = ctx.out()
    attrs, kernel = _window(X, out, kernel_shape, strides, None, pads, auto_pad)
    start = len(ctx.b.nodes)
    x8 = as_int8(ctx, X, _act_quant(X, x_scale, x_zero_point, what))
    y8 = out_int8(ctx, out, _act_quant(out, y_scale, y_zero_point, what))
    _from_nhwc_q(ctx, "avg_pool2d", [_to_nhwc_q(ctx, x8)], y8, filter=kernel, **attrs,
                 activation="none", count_include_pad=bool(count_include_pad),
                 requant="onnxruntime", zp_offset=_zp_offset(ctx, out, y_zero_point))
    _emit_first(ctx, start)


@onnx_op("QLinearGlobalAveragePool")
def QLinearGlobalAveragePool(ctx, X, x_scale, x_zero_point, y_scale, y_zero_point=None,
                             channels_last=0):
    """int8 avg_pool2d over the whole plane (other spatial ranks flattened to 1 x S) with
    requant="onnxruntime": onnxruntime's integer path, int32 sum less the zero point times the
    count, times the float32 scale x_scale / (y_scale * count), rounded half to even."""
    what = "QLinearGlobalAveragePool"
    if len(X.shape) < 3:
        raise Unsupported(f"{what}: rank-{len(X.shape)} input")
    start = len(ctx.b.nodes)
    x8 = as_int8(ctx, X, _act_quant(X, x_scale, x_zero_point, what))
    out = ctx.out()
    y8 = out_int8(ctx, out, _act_quant(out, y_scale, y_zero_point, what))
    if channels_last:
        n, *sp, c = X.shape
        xt = x8
    else:
        n, c, *sp = X.shape
        xt = to_nhwc(ctx, x8)
        xt = ctx.b.add_tensor(Tensor(xt.name, xt.shape, "int8", quant=x8.quant))
    plane = tuple(sp) if len(sp) == 2 else (1, int(np.prod(sp)))
    if len(sp) != 2:
        flat = ctx.b.add_tensor(Tensor(ctx.tmp((n, *plane, c), "int8", "plane").name,
                                       (n, *plane, c), "int8", quant=x8.quant))
        ctx.emit("reshape", [xt], [flat])
        xt = flat
    if channels_last and len(sp) == 2:
        t = y8
    else:
        t = ctx.b.add_tensor(Tensor(ctx.tmp((n, 1, 1, c), "int8", "pool").name, (n, 1, 1, c),
                                    "int8", quant=y8.quant))
    ctx.emit("avg_pool2d", [xt], [t], filter=plane, stride=(1, 1), dilation=(1, 1),
             padding=(0, 0, 0, 0), activation="none", requant="onnxruntime",
             zp_offset=_zp_offset(ctx, out, y_zero_point))
    if channels_last and len(sp) != 2:
        ctx.emit("reshape", [t], [y8])
    elif not channels_last:
        if len(sp) != 2:
            shape = (n, *[1] * len(sp), c)
            t2 = ctx.b.add_tensor(Tensor(ctx.tmp(shape, "int8", "nhwc").name, shape, "int8",
                                         quant=y8.quant))
            ctx.emit("reshape", [t], [t2])
            t = t2
        from_nhwc(ctx, t, y8)
    _emit_first(ctx, start)


@onnx_op("QLinearConcat")
def QLinearConcat(ctx, Y_scale, Y_zero_point, *inputs, axis=1):
    """int8 concat; inputs quantized unlike the output are requantized to it first."""
    what = "QLinearConcat"
    if len(inputs) % 3:
        raise Unsupported(f"{what}: inputs are not (tensor, scale, zero point) triples")
    out = ctx.out()
    start = len(ctx.b.nodes)
    y8 = out_int8(ctx, out, _act_quant(out, Y_scale, Y_zero_point, what))
    xs = [requantize(ctx, as_int8(ctx, x, _act_quant(x, s, z, what)), y8.quant)
          for x, s, z in zip(inputs[::3], inputs[1::3], inputs[2::3])]
    ctx.emit("concat", xs, [y8], axis=axis % len(out.shape), activation="none")
    _emit_first(ctx, start)
