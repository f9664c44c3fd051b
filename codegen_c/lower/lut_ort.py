"""int8 logistic / leaky_relu / where / softmax with requant="onnxruntime" (quantized ONNX
imports: com.microsoft QLinearSigmoid, QLinearLeakyRelu, QLinearWhere, QLinearSoftmax, and
the QDQ patterns onnxruntime fuses into them): computed as onnxruntime's CPU kernels.

Node attributes (besides the op's own; the tables come from the tensors' quantization,
ir.graph.Quant, per tensor; softmax takes its rows along "axis" as the float op does):
  requant="onnxruntime"  selects these lowerings (the default int8 ones are TFLM's);
  zp_offset (softmax only; 0 or 128, default 0) = 128 when onnxruntime runs the kernel on
    uint8 (a uint8 output, or int8 QDQ that onnxruntime's x86 build converts to uint8): the
    int8 twin's zero point lacks it. It matters only where the kernel overflows (below).

Table lookups, built here at compile time with onnxruntime's float32 arithmetic (exact):
- logistic, leaky_relu (qlinear_lookup_table.cc, QlinearBuildLookupTable): for each of the 256
  input values q, d = x_scale * (float)(q - x_zp); f = fn(d); MlasQuantizeLinear:
  round_half_even(f / y_scale) + y_zp, clamped. fn is leaky_relu's `d >= 0 ? d : alpha * d` in
  float32, and logistic is MlasComputeLogistic: not expf, but Eigen's rational approximation
  (x clamped to [-18, 18], p(x^2) * x / q(x^2) + 0.5, clamped below at 0) evaluated with fused
  multiply-adds, as MLAS's FMA3 kernel (x86-64, the build onnxruntime uses here) and its NEON
  path (ARM64, vfmaq_f32) do. The FMA is computed exactly in numpy (float64 TwoSum, then the
  float32 rounding corrected at ties). Without FMA (MLAS's SSE2-only kernel) about 8% of the
  float results differ by an ulp, and the table changes when one of them sits on a rounding
  boundary: measured against onnxruntime 1.31 on this machine, the FMA table matched in 40 of
  40 such cases, the non-FMA one in none.
  The kernel is y[i] = table[x[i] + 128]: one const int8 table of 256 entries.
- where (qlinear_where.cc): each value operand goes through the identity table of its
  quantization to the output's (dequantize, MlasQuantizeLinear), the condition picks. Operands
  quantized as the output need no table (onnxruntime copies them).

Softmax (qlinear_softmax.cc, EXP_OUT_DTYPE float), rows along "axis":
- a 256-entry float32 table t[i] = (float)exp(((double)i - 255 + bit_shift) * x_scale) in double,
  bit_shift = max(0, log(FLT_MAX / D) - 5) / x_scale, D the row length; the log is logf of
  the float32 FLT_MAX / D (onnxruntime calls log on a float: measured, the double log
  mismatches where logf matches), computed here as the float32 rounding of Python's double
  log, which equals glibc's logf for every D below 60594 (checked for all of them); exp is
  Python's math.exp, the C library's exp that onnxruntime calls.
- per row: m = max(x); vsum = float32 sum of t[255 + x - m] in row order from 0;
  y = nearbyintf((t[255 + x - m] * (float)floor(1.0f / y_scale)) / vsum) + y_zp, at most the
  type's largest value (onnxruntime 1.31's int8 and uint8 kernels alike: measured; the sum is
  non-negative so nothing goes below the zero point). The int8 twin of a uint8 output carries
  y_zp - 128 and the same bound less 128: the same bytes less 128.
- where t * floor(1 / y_scale) overflows float32 (t grows with the index, so from a threshold
  index on, known here; rows of one element with y_scale 1/256, or y_scale below about
  1 / (148 D)), onnxruntime converts an infinity to an integer: undefined behaviour in C++,
  which its x86-64 build turns into the zero point (uint8: (uint32_t)inf is 0) or, int8, 127
  for a negative zero point and -128 otherwise (INT_MIN + y_zp, wrapped, then clamped). The
  kernel gives those values there (measured: equal to onnxruntime x86-64; ARM builds convert
  otherwise).

Index arithmetic stays in int32; the float statements are single operations (no contraction).

Version followed: onnxruntime 1.31.1, the version pinned in pyproject.toml's test extra
(tests/test_onnx_quant.py compares with it bit for bit); recheck these formulas when the pin
moves (1.32.0 computes com.microsoft QLinearSoftmax differently).
"""
from __future__ import annotations

import math

import numpy as np

from .. import loop_ir as ir
from . import OpContext, const, describe, lowers
from .elementwise import broadcast_index

F = "float32"
_F32_MAX = np.float32(np.finfo(np.float32).max)


def _ort(ctx: OpContext) -> bool:
    return ctx.attrs.get("requant") == "onnxruntime"


def _per_tensor(ctx: OpContext, *tensors) -> list:
    """[(scale as float32, zero point)] of per-tensor int8 tensors, else NotImplementedError."""
    out = []
    for t in tensors:
        if t.dtype != "int8" or t.quant is None or t.quant.per_axis:
            raise NotImplementedError(describe(ctx, 'requant="onnxruntime" takes per-tensor '
                                                    "quantized int8 tensors"))
        out.append((np.float32(t.quant.scale[0]), int(t.quant.zero_point[0])))
    return out


# ---- float32 arithmetic of onnxruntime's table builders ---------------------------------

def fma_f32(a, b, c) -> np.ndarray:
    """float32 a * b + c with one rounding (vectorized). a * b is exact in float64; TwoSum
    gives the exact sum as s + err; rounding s to float32 is the correct rounding unless s is
    exactly halfway between two floats and err breaks the tie."""
    a, b, c = (np.asarray(v, np.float32).astype(np.float64) for v in (a, b, c))
    p = a * b
    s = p + c
    bb = s - p
    err = (p - (s - bb)) + (c - bb)
    r = s.astype(np.float32)
    r64 = r.astype(np.float64)
    toward = np.where(s > r64, np.float32(np.inf), np.float32(-np.inf)).astype(np.float32)
    other = np.nextafter(r, toward)
    tie = (r64 != s) & (s == (r64 + other.astype(np.float64)) / 2) & (err != 0)
    pick = tie & ((other > r) == (err > 0))
    return np.where(pick, other, r).astype(np.float32)


_LOGISTIC = {k: np.float32(v) for k, v in dict(
    a9=4.37031012579801e-11, a7=1.15627324459942e-07, a5=6.08574864600143e-05,
    a3=8.51377133304701e-03, a1=2.48287947061529e-01, b10=6.10247389755681e-13,
    b8=5.76102136993427e-09, b6=6.29106785017040e-06, b4=1.70198817374094e-03,
    b2=1.16817656904453e-01, b0=9.93151921023180e-01).items()}


def mlas_logistic(x) -> np.ndarray:
    """MlasComputeLogistic (MlasLogisticKernelFma3; NEON's MlasLogisticKernel alike)."""
    c = _LOGISTIC
    v = np.minimum(np.maximum(np.asarray(x, np.float32), np.float32(-18)), np.float32(18))
    v2 = v * v
    p = fma_f32(v2, c["a9"], c["a7"])
    for k in ("a5", "a3", "a1"):
        p = fma_f32(p, v2, c[k])
    p = p * v
    q = fma_f32(v2, c["b10"], c["b8"])
    for k in ("b6", "b4", "b2", "b0"):
        q = fma_f32(q, v2, c[k])
    return np.maximum(p / q + np.float32(0.5), np.float32(0)).astype(np.float32)


def _leaky(alpha: float):
    a = np.float32(alpha)
    return lambda v: np.where(v >= 0, v, a * v).astype(np.float32)


def lookup_table(fn, x_quant, y_quant) -> np.ndarray:
    """onnxruntime's QlinearBuildLookupTable over the int8 values -128..127 (a uint8 tensor's
    int8 twin: same real values): int8 results, index q + 128."""
    (xs, xz), (ys, yz) = x_quant, y_quant
    q = np.arange(-128, 128)
    d = (np.float32(xs) * (q - xz).astype(np.float32)).astype(np.float32)
    f = np.asarray(fn(d), np.float32)
    r = np.rint(f / np.float32(ys)).astype(np.float64) + yz  # MlasQuantizeLinear
    return np.clip(r, -128, 127).astype(np.int8)


def _identity(v):
    return v


def softmax_table(x_scale: float, d: int) -> np.ndarray:
    """QlinearBuildLookupTableUint32 with EXP_OUT_DTYPE float: 256 float32 values."""
    xs = float(np.float32(x_scale))
    ratio = np.float32(_F32_MAX / np.float32(d))
    bit_shift = float(np.float32(math.log(float(ratio))))  # logf(FLT_MAX / D)
    bit_shift = max(0.0, bit_shift - 5.0) / xs
    return np.array([np.float32(math.exp((i - 255 + bit_shift) * xs)) for i in range(256)],
                    np.float32)


# ---- kernels -------------------------------------------------------------------------------

def _table_kernel(ctx: OpContext, table: np.ndarray, extra: str) -> ir.Kernel:
    n = ctx.output().size

    def body(i):
        k = ir.cast(ir.Load("x", i, "int8"), "int32") + 128
        return [ir.Store("y", i, ir.Load("lut", k, "int8"))]
    bufs = (*ctx.io_buffers(), const("lut", table, "int8", "onnxruntime's lookup table"))
    return ir.Kernel(ctx.name, bufs, ir.loops([("i", n)], body), describe(ctx, extra))


@lowers("logistic", "leaky_relu", when=_ort)
def lut_unary_ort(ctx: OpContext) -> ir.Kernel:
    x, y = ctx.input(0), ctx.output()
    xq, yq = _per_tensor(ctx, x, y)
    if ctx.node.op == "logistic":
        fn, what = mlas_logistic, "MlasComputeLogistic (FMA)"
    else:
        alpha = float(np.float32(ctx.attrs["alpha"]))
        fn, what = _leaky(alpha), f"x >= 0 ? x : {alpha:.9g} * x"
    table = lookup_table(fn, xq, yq)
    return _table_kernel(ctx, table, f"onnxruntime's 256-entry lookup table of {what}, "
                                     "dequantized and quantized in float32")


@lowers("where", when=_ort)
def where_ort(ctx: OpContext) -> ir.Kernel:
    """QLinearWhere: cond ? table_a[a] : table_b[b] (a table only where the quantization
    differs from the output's), numpy broadcasting."""
    c, a, b = (ctx.input(i) for i in range(3))
    y = ctx.output()
    (yq,) = _per_tensor(ctx, y)
    aq, bq = _per_tensor(ctx, a, b)
    bufs = list(ctx.io_buffers())
    names, k = [], 0
    for i, t in enumerate((c, a, b)):
        if t.is_const:
            names.append(f"c{i}")
            bufs.append(const(f"c{i}", t.data, t.dtype, t.name))
        else:
            names.append("x" if k == 0 else f"x{k}")
            k += 1
    tables = []
    for nm, t, q in (("lut_a", a, aq), ("lut_b", b, bq)):
        if q == yq:
            tables.append(None)
        else:
            bufs.append(const(nm, lookup_table(_identity, q, yq), "int8",
                              "onnxruntime's requantization table"))
            tables.append(nm)
    shape = tuple(y.shape)
    ext = [(f"i{d}", n) for d, n in enumerate(shape)]

    def body(*idx):
        def load(pos, t):
            return ir.Load(names[pos], broadcast_index(t.shape, shape, list(idx)), t.dtype)
        vals = []
        for pos, t, tab in ((1, a, tables[0]), (2, b, tables[1])):
            v = load(pos, t)
            vals.append(ir.Load(tab, ir.cast(v, "int32") + 128, "int8") if tab else v)
        return [ir.Store("y", ir.flat_index(list(idx), shape), ir.select(load(0, c), *vals))]
    extra = ("onnxruntime's QLinearWhere: operands requantized to the output by lookup tables"
             f" ({'a' if tables[0] else ''}{'b' if tables[1] else ''}"
             f"{'none' if tables == [None, None] else ''})")
    return ir.Kernel(ctx.name, tuple(bufs), ir.loops(ext, body), describe(ctx, extra))


@lowers("softmax", when=_ort)
def softmax_ort(ctx: OpContext) -> ir.Kernel:
    x, y = ctx.input(0), ctx.output()
    (xs, _), (ys, yz) = _per_tensor(ctx, x, y)
    shape = tuple(x.shape)
    axis = ctx.attrs.get("axis", len(shape) - 1)
    outer, n, inner = (int(np.prod(shape[:axis])), shape[axis], int(np.prod(shape[axis + 1:])))
    table = softmax_table(float(xs), n)
    ysf = np.float32(np.floor(np.float32(1.0) / np.float32(ys)))
    with np.errstate(over="ignore"):
        over = np.flatnonzero(~np.isfinite((table * ysf).astype(np.float32)))
    first_over = int(over[0]) if over.size else None
    off = int(ctx.attrs.get("zp_offset", 0))
    # onnxruntime x86-64 where t * ysf is infinite (see above), as the int8 twin's value
    at_inf = yz if off else (127 if yz < 0 else -128)
    m, s = ir.Var("m", "int32"), ir.Var("s", F)

    def body(o, i):
        at = lambda k: o * (n * inner) + k * inner + i
        xk = lambda k: ir.cast(ir.Load("x", at(k), "int8"), "int32")
        idx = lambda k: xk(k) - m + 255
        e = lambda k: ir.Load("t", idx(k), F)
        k = ir.Var("k")
        out = [ir.Decl("m", "int32", xk(0))]
        if n > 1:
            out.append(ir.Loop("k", n - 1, (ir.Assign("m", ir.vmax(m, xk(k))),), start=1))
        out.append(ir.Decl("s", F, ir.Const(0.0, F)))
        out.append(ir.Loop("k", n, (ir.Assign("s", s + e(k)),)))
        v = ir.Var("v", F)
        r = ir.cast(ir.vmin(ir.call("mf_round_even_f32_to_i32", ir.binop("/", v, s)) + yz, 127),
                    "int8")
        if first_over is None:
            row = (ir.Decl("v", F, e(k) * ir.Const(float(ysf), F)), ir.Store("y", at(k), r))
        else:  # t * ysf is not computed where it overflows
            row = (ir.If(idx(k).ge(first_over), (ir.Store("y", at(k), ir.Const(at_inf, "int8")),),
                         (ir.Decl("v", F, e(k) * ir.Const(float(ysf), F)),
                          ir.Store("y", at(k), r))),)
        out.append(ir.Loop("k", n, row))
        return out

    loop = ir.loops([("o", outer), ("i", inner)], body)
    extra = (f"axis {axis}: {outer * inner} rows of {n}; onnxruntime's QLinearSoftmax: float32 "
             f"exp table (x_scale {float(xs):.9g}), row sum in order, "
             f"nearbyintf(t * {float(ysf):.9g} / sum) + {yz}, at most 127" +
             ("" if first_over is None else
              f"; {at_inf} from table index {first_over} on (the product overflows)"))
    bufs = (*ctx.io_buffers(), const("t", table, F, "onnxruntime's exp table"))
    return ir.Kernel(ctx.name, bufs, loop, describe(ctx, extra))
