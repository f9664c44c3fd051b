"""int8 convolutions, fully connected and depthwise layers on the host's kernels
(runtime_c/mcuforge_vec.h, mirrored in codegen_c/micro_vec.py): plain C in natural layouts
that gcc vectorises on x86-64 / AArch64 hosts, where the Cortex-M kernels' 4-channel blocks and
lane-permuted weights would only cost time.

Only for the host target (Target.host); Cortex-M and RISC-V boards keep gemm.py and
depthwise.py. The exactness proofs are the Cortex-M schedules' (pack.py: the input zero point
folded into the bias, constant channels, the fast requantization's bounds), so both schedules
decline the same layers (the reference loops stay).

GEMM weights: int16 [O][Kp] rows (Kp = K rounded up to 8), one row per output channel, so the
inner loop is a contiguous int16 dot product (pmaddwd / vpdpwssd); activations are widened once
per row or im2col patch, pixels go in pairs. 1x1 and fully connected layers with K <= 16 use
lanes = output channels instead (weights [O/16][K][16], mf_vec_gemm_t): their dot products
would be shorter than the horizontal sums that end them. Depthwise: input rows widened once
into a ring, each tap one loop over a row's pixels x channels, on weights, bias and
requantization constants tiled along the row (int16 [KH*KW][tw*C]).

On x86-64 with AVX-512 (-march=native, templates/host/Makefile.j2) and the MLPerf Tiny models,
against LiteRT's built-in kernels (one thread, no XNNPACK): see the commit log for the figures;
the remaining cost is mostly the horizontal sums of the dot products and the requantization
(64-bit multiplies), which plain C cannot make cheaper without intrinsics."""
from __future__ import annotations

import numpy as np

from .. import loop_ir as ir
from .. import pack
from ..lower import OpContext
from ..lower.conv import output_multipliers
from ..lower.q_uint8 import activation_range
from . import conv_geometry, inplace, schedules
from .gemm import gemm_layer

DW_GEOM = ("h", "w", "c", "k_h", "k_w", "stride_h", "stride_w", "dil_h", "dil_w", "pad_t",
           "pad_l", "out_h", "out_w", "tw")  # mf_vec_dw's geometry, in order
T_MAX_K = 16  # mf_vec_gemm_t for K <= this: 1.5-3.6x faster than the dot products (K 16, 8)
DW_LANES = 1024  # at most this many lanes (pixels x channels) per depthwise chunk: tw


def kpad(k: int) -> int:
    """K rounded up to 8 taps (MF_VEC_KPAD: one 128-bit vector of int16)."""
    return (int(k) + 7) // 8 * 8


def pack_rows(rows) -> np.ndarray:
    """[O, K] int8-valued weights -> int16 [O, Kp] with a zero tail."""
    w = np.asarray(rows, np.int64).reshape(len(rows), -1)
    out = np.zeros((w.shape[0], kpad(w.shape[1])), np.int16)
    out[:, :w.shape[1]] = w
    return out


def scratch_words(o: int, k: int, rows: int) -> int:
    """int32 words of mf_vec_gemm / mf_vec_conv scratch: per row of a pair (pixels go in pairs,
    a single row or pixel needs one) O accumulators and an int16 [Kp] row."""
    return (o + kpad(k) // 2) * (2 if rows > 1 else 1)


def dw_chunk(ow: int, c: int) -> int:
    """mf_vec_dw's tw: output pixels per chunk, the whole row when it has <= DW_LANES lanes."""
    return max(1, min(ow, DW_LANES // c))


def dw_scratch_words(geom: dict) -> int:
    """int32 words of mf_vec_dw scratch: ring tags, accumulators, the ring of widened rows."""
    g = geom
    r = (g["k_h"] - 1) * g["dil_h"] + 1
    wq = (g["out_w"] - 1) * g["stride_w"] + (g["k_w"] - 1) * g["dil_w"] + 1
    pw = -(-wq // g["stride_w"])
    return r + g["tw"] * g["c"] + (r * g["stride_w"] * pw * g["c"] + 1) // 2


def pack_lanes(rows) -> np.ndarray:
    """[O, K] weights -> int16 [ceil(O/16), K, 16] (mf_vec_gemm_t: lanes = output channels)."""
    w = np.asarray(rows, np.int64).reshape(len(rows), -1)
    o, k = w.shape
    nb = -(-o // 16)
    out = np.zeros((nb * 16, k), np.int64)
    out[:o] = w
    return out.reshape(nb, 16, k).transpose(0, 2, 1).astype(np.int16)


def rq_soa(rq: np.ndarray) -> np.ndarray:
    """pack.requant_params' [O, 4] rows as the [4, O] arrays the vector loop reads, flat."""
    return np.ascontiguousarray(np.asarray(rq, np.int32).T).reshape(-1)


def _bufs(ref, consts, scratch_n):
    return tuple([b for b in ref.params if b.kind != "scratch"] + consts
                 + [ir.Buffer("scratch", "int32", scratch_n, "scratch")])


@schedules("conv2d", "fully_connected", "depthwise_conv2d")  # (depthwise: one input channel)
def host_gemm(ctx: OpContext, ref: ir.Kernel, target) -> ir.Kernel | None:
    if not target.host:
        return None
    layer = gemm_layer(ctx)
    if layer is None:
        return None
    x, y = ctx.input(0), ctx.output()
    rows = layer["rows"]
    o, k = rows.shape
    if k * 128 * 127 > 2**31 - 1:  # the dot products start at 0, the bias added after them
        return None
    one_by_one = ctx.node.op == "fully_connected" or (
        k == x.shape[-1] and tuple(ctx.attrs["stride"]) == (1, 1)
        and not any(ctx.attrs["padding"]))
    lanes = one_by_one and k <= T_MAX_K
    w = pack_lanes(rows) if lanes else pack_rows(rows)
    bias = layer["bias"]
    if lanes:
        bias = np.zeros(w.shape[0] * 16, np.int32)
        bias[:o] = layer["bias"]
    consts = [ir.Buffer("w", "int16", w.size, "const", w.reshape(-1),
                        f"weights int16 [{']['.join(map(str, w.shape))}]"),
              ir.Buffer("bias", "int32", bias.size, "const", bias,
                        "bias - x_zp * sum(w): the input zero point folded in"),
              ir.Buffer("rq", "int32", 4 * o, "const", rq_soa(layer["rq"]),
                        "requantization: mult[O], add[O], pre[O], post[O]")]
    common = (ir.Ptr("w", ir.Const(0)), ir.Ptr("bias", ir.Const(0)), ir.Ptr("rq", ir.Const(0)),
              ir.Const(o), ir.Const(layer["lo"]), ir.Const(layer["hi"]),
              ir.Const(layer["signfix"]))
    if one_by_one:
        n_rows = x.size // k
        fn = "mf_vec_gemm_t" if lanes else "mf_vec_gemm"
        body = (ir.CallStmt(fn, (
            ir.Ptr("x", ir.Const(0)), ir.Const(n_rows), ir.Const(k), ir.Const(k), *common,
            ir.Ptr("y", ir.Const(0)), ir.Const(o), ir.Ptr("scratch", ir.Const(0)))),)
        how = f"{n_rows} rows x {k} taps"
        # mf_vec_gemm: rows in pairs (a last one alone); mf_vec_gemm_t: one row at a time
        access = inplace.gemm_rows([(0, 0, n_rows, k, k, o, o)], x.nbytes, y.nbytes,
                                   1 if lanes else 2)
    else:
        n, geom, buf = conv_geometry(ctx)
        h, w_, c, _, _, _, _, _, _, oh, ow = (int(v) for v in geom)
        consts.append(buf)
        body = ir.loops([("n", n)], lambda b: [ir.CallStmt("mf_vec_conv", (
            ir.Ptr("x", b * (h * w_ * c)), ir.Ptr("geom", ir.Const(0)), ir.Const(layer["x_zp"]),
            *common, ir.Ptr("y", b * (oh * ow * o)), ir.Ptr("scratch", ir.Const(0))))])
        fn, how = "mf_vec_conv", f"im2col, {oh * ow} patches x {k} taps"
        access = inplace.vec_conv(geom, o) if n == 1 else None
    scratch = w.shape[0] * 16 if lanes else scratch_words(o, k, x.size // k if one_by_one
                                                          else y.shape[1] * y.shape[2])
    doc = (f"{ref.doc}\nscheduled: {fn} ({how}), weights int16 ({w.nbytes} bytes), "
           f"{4 * scratch} bytes scratch")
    return inplace.declare(ir.Kernel(ctx.name, _bufs(ref, consts, scratch), tuple(body), doc,
                                     ref.macs, fn), "x", access)


@schedules("depthwise_conv2d")
def host_depthwise(ctx: OpContext, ref: ir.Kernel, target) -> ir.Kernel | None:
    if not target.host:
        return None
    x, w, bias, y = ctx.input(0), ctx.input(1), ctx.input(2), ctx.output()
    if x.dtype != "int8" or y.dtype != "int8" or w.dtype != "int8" or not w.is_const \
            or ctx.attrs.get("requant") == "onnxruntime" or len(x.shape) != 4:
        return None
    if any(t.quant is None for t in (x, w, y)) or len(x.quant.zero_point) != 1 \
            or np.any(np.asarray(w.quant.zero_point) != 0):
        return None
    if bias is not None and (not bias.is_const or bias.dtype != "int32"):
        return None
    n, h, wd, c = x.shape
    _, oh, ow, o = y.shape
    if len(w.shape) != 4 or w.shape[0] != 1 or w.shape[3] != c or o != c:  # multiplier 1
        return None
    kh, kw = w.shape[1:3]
    taps = np.asarray(w.data).reshape(kh * kw, c).astype(np.int64).copy()  # [tap, C]
    b = np.zeros(c, np.int64) if bias is None else np.asarray(bias.data, np.int64).copy()
    x_zp, y_zp = int(x.quant.zero_point[0]), int(y.quant.zero_point[0])
    mults, shifts = (a.copy() for a in output_multipliers(ctx, c))
    lo, hi = activation_range(ctx.attrs.get("activation", "none"), y.quant.scale[0], y_zp, "int8")
    # The accumulator b + sum over taps inside the image of (x - x_zp) * w equals the folded
    # bias plus every tap's raw value times w with padding taps read as x_zp: pack's bounds
    # over int8 inputs cover it.
    folded = pack.fold_bias(b, taps.T, x_zp)
    if folded is None:
        return None
    const = pack.constant_channels(folded, taps.T, mults, shifts, y_zp, lo, hi)
    for ch in const:  # computed as 0 and set by the constant (as in gemm.py)
        taps[:, ch], b[ch], folded[ch], mults[ch], shifts[ch] = 0, 0, 0, 0, 0
    rq = pack.requant_params(mults, shifts, y_zp, pack.acc_bounds(folded, taps.T))
    if rq is None:
        return None
    for ch, value in const.items():
        rq[ch] = (0, value, 1, 0)
    (sh, sw), (pt, _, pl, _) = ctx.attrs["stride"], ctx.attrs["padding"]
    dh, dw = ctx.attrs.get("dilation", (1, 1))
    tw = dw_chunk(ow, c)
    geom = dict(zip(DW_GEOM, (h, wd, c, kh, kw, sh, sw, dh, dw, pt, pl, oh, ow, tw)))
    if max(geom.values()) > 2**31 // max(8 * tw * c, 8 * wd * c):
        return None  # keep the C's int32 index arithmetic far from overflow
    scratch = dw_scratch_words(geom)
    geom = np.array([geom[f] for f in DW_GEOM], np.int32)
    wt = np.tile(taps[:, None, :], (1, tw, 1)).astype(np.int16).reshape(-1)
    consts = [ir.Buffer("w", "int16", wt.size, "const", wt,
                        f"weights int16 [{kh * kw}][{tw} x {c}]: each tap tiled {tw} times"),
              ir.Buffer("bias", "int32", tw * c, "const", np.tile(b, tw).astype(np.int32),
                        f"bias, tiled {tw} times"),
              ir.Buffer("rq", "int32", 4 * tw * c, "const", rq_soa(np.tile(rq, (tw, 1))),
                        f"requantization: mult, add, pre, post [{tw} x {c}] each"),
              ir.Buffer("geom", "int32", geom.size, "const", geom,
                        "geometry: " + " ".join(DW_GEOM))]
    body = ir.loops([("n", n)], lambda i: [ir.CallStmt("mf_vec_dw", (
        ir.Ptr("x", i * (h * wd * c)), ir.Ptr("geom", ir.Const(0)), ir.Const(x_zp),
        ir.Ptr("w", ir.Const(0)), ir.Ptr("bias", ir.Const(0)), ir.Ptr("rq", ir.Const(0)),
        ir.Const(int(lo)), ir.Const(int(hi)), ir.Const(pack.needs_signfix(y_zp, int(lo))),
        ir.Ptr("y", i * (oh * ow * c)), ir.Ptr("scratch", ir.Const(0))))])
    doc = (f"{ref.doc}\nscheduled: mf_vec_dw, rows of {tw} pixels x {c} channels, "
           f"{4 * scratch} bytes scratch")
    access = inplace.vec_dw(h, wd, c, oh, ow, kh, sh, dh, pt) if n == 1 else None
    return inplace.declare(ir.Kernel(ctx.name, _bufs(ref, consts, scratch), tuple(body), doc,
                                     ref.macs, "mf_vec_dw"), "x", access)
