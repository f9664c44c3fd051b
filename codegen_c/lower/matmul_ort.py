"""int8 matmul with requant="onnxruntime" (quantized ONNX imports: QLinearMatMul, and QDQ MatMul
fused into it, whose right operand is batched or computed at run time): computed as
onnxruntime's CPU QLinearMatMul (quantize_linear_matmul.cc), one MLAS gemm per batch
matrix, then MLAS's requantization.

- acc = sum over k of (a - a_zp) * (b - b_zp) in int32 (MLAS sums a * b and subtracts the zero
  point terms; in int32 arithmetic that is the same number);
- MlasRequantizeOutput: (float)acc * scale in float32, clamped to the output range less y_zp,
  rounded half to even (mf_round_even_f32_to_i32), plus y_zp. scale = a_scale * b_scale /
  y_scale in float32, per column of b when b_scale is.

Numpy matmul semantics: batch dimensions broadcast, a 1-D left operand is a row and a 1-D right
operand a column. Operands and result are int8: a uint8 tensor of the ONNX model arrives as its
int8 twin (zero point - 128, frontend/onnx_quant.py), which changes neither the differences
(x - zp) nor, since the zero point is added after the rounding, the output (the clamp bounds
move with the zero point).

Quantization read from the tensors (ir.graph.Quant): a and y per tensor; b per tensor or
per column, i.e. per axis on its last axis (scales and zero points N long). No new node
attribute: the node carries only requant="onnxruntime".

Version followed: onnxruntime 1.31.1, the version pinned in pyproject.toml's test extra
(tests/test_onnx_quant.py compares with it bit for bit); recheck these formulas when the pin
moves (1.32.0 computes com.microsoft QLinearSoftmax differently).
"""
from __future__ import annotations

import numpy as np

from .. import loop_ir as ir
from . import OpContext, SPECIAL, const, describe, lowers
from .elementwise import broadcast_index, operand_names


def _ort(ctx: OpContext) -> bool:
    return ctx.attrs.get("requant") == "onnxruntime"


def _column_table(values, name: str, n: ir.Expr, dtype: str, bufs: list) -> ir.Expr:
    """values[n]: a constant when every column has the same value, else a load from a table."""
    values = np.asarray(values).reshape(-1)
    if np.all(values == values[0]):
        return ir.Const(float(values[0]) if dtype == "float32" else int(values[0]), dtype)
    bufs.append(const(name, values, dtype))
    return ir.Load(name, n, dtype)


@lowers("matmul", when=_ort)
def matmul_ort(ctx: OpContext) -> ir.Kernel:
    a, b, y = ctx.input(0), ctx.input(1), ctx.output()
    if any(t.dtype != "int8" or t.quant is None for t in (a, b, y)) \
            or a.quant.per_axis or y.quant.per_axis:
        raise NotImplementedError(describe(ctx, 'matmul with requant="onnxruntime" takes int8 '
                                                "operands, a and y quantized per tensor"))
    sa = (1,) + tuple(a.shape) if len(a.shape) == 1 else tuple(a.shape)
    sb = tuple(b.shape) + (1,) if len(b.shape) == 1 else tuple(b.shape)
    M, K, N = sa[-2], sa[-1], sb[-1]
    if sb[-2] != K:
        raise NotImplementedError(describe(ctx, f"inner dimensions {K} and {sb[-2]}"))
    batch = tuple(np.broadcast_shapes(sa[:-2], sb[:-2]))
    if y.size != int(np.prod(batch, dtype=np.int64)) * M * N:
        raise NotImplementedError(describe(ctx, f"output of {y.size} values"))
    bq = b.quant
    if bq.per_axis and (len(b.shape) < 2 or bq.axis != len(b.shape) - 1
                        or len(bq.scale) != N or len(bq.zero_point) != N):
        raise NotImplementedError(describe(ctx, "b quantized per axis other than per column"))
    f32 = np.float32
    b_scales = np.asarray(bq.scale, dtype=f32)
    # onnxruntime: a_scale * b_scale[i] / y_scale, float32 at each step
    scales = (f32(a.quant.scale[0]) * b_scales / f32(y.quant.scale[0])).astype(f32)
    b_zps = np.broadcast_to(np.asarray(bq.zero_point, dtype=np.int64), scales.shape)
    az, yz = int(a.quant.zero_point[0]), int(y.quant.zero_point[0])
    qmin, qmax = -128, 127

    (na, nb), consts = operand_names(ctx)
    bufs = list(ctx.io_buffers()) + consts
    acc = ir.Var("acc", "int32")

    def body(*idx):
        *bi, m, n = idx
        a_row = broadcast_index(sa[:-2], batch, bi) * M + m
        b_mat = broadcast_index(sb[:-2], batch, bi) * K
        bz = _column_table(b_zps, "b_zp", n, "int32", bufs)
        sc = _column_table(scales, "oscale", n, "float32", bufs)

        def mac(k):
            av = ir.cast(ir.Load(na, a_row * K + k, "int8"), "int32") - az
            bv = ir.cast(ir.Load(nb, (b_mat + k) * N + n, "int8"), "int32") - bz
            return [ir.Assign("acc", acc + av * bv)]
        v = ir.cast(acc, "float32") * sc
        v = ir.call("mf_min_f32", ir.call("mf_max_f32", v, float(qmin - yz), dtype="float32"),
                    float(qmax - yz), dtype="float32")
        q = ir.call("mf_round_even_f32_to_i32", v) + yz
        return [ir.Decl("acc", "int32", ir.Const(0)), *ir.loops([("k", K)], mac),
                ir.Store("y", ir.flat_index(list(idx), [*batch, M, N]), ir.cast(q, "int8"))]

    extents = [(f"b{d}", n) for d, n in enumerate(batch)] + [("m", M), ("n", N)]
    loop = ir.loops(extents, body)
    seen, unique = set(), []
    for buf in bufs:  # the column tables are added once per body built
        if buf.name not in seen:
            seen.add(buf.name)
            unique.append(buf)
    macs = int(np.prod(batch, dtype=np.int64)) * M * N * K
    per = "per column" if len(set(scales.tolist())) > 1 else f"{float(scales[0]):.9g}"
    extra = (f"onnxruntime's QLinearMatMul: int32 sums of (a - {az}) * (b - b_zp), times "
             f"float32 scale {per}, clamped to [{qmin - yz}, {qmax - yz}], rounded half to "
             f"even, + {yz}; {macs} MACs")
    return ir.Kernel(ctx.name, tuple(unique), loop, describe(ctx, extra), macs)


# q_layers' TFLM batch matmul also claims quantized matmul nodes: serve ours first, whatever
# the order the lowering modules were imported in
SPECIAL["matmul"].sort(key=lambda entry: entry[1] is not matmul_ort)
