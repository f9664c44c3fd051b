"""int8 convolutions and fully connected layers on Helium (MVE) targets: the GEMM micro-kernels
of runtime_c/mcuforge_mve.h (mirrors in codegen_c/micro_mve.py). A 1x1 stride-1 convolution or
a fully connected layer is one mf_mve_gemm call over its rows (a single row too: AD's layers),
a strided 1x1 convolution without padding one call per output row, any other convolution
(groups 1, dilation 1; also a depthwise convolution of one input channel, which gemm_layer maps
to the convolution 1 -> M) one mf_mve_conv call per image (im2col, two patches in scratch).
The entries called are those of the layer's flags (mf_mve_gemm_f<F>: sign term, left shift);
1x1 layers with K <= 32, flags 0 and the upper clamp 127 call mf_mve_gemm_k32 (one row loop per
block of 4 channels, the requantization in Q registers; stride 1: K32_ROWS rows a call, so that
its output may go over its input: inplace.block_rows).

Same proofs as gemm.py (gemm_layer: the input zero point folded into the bias, constant
channels, requant_params' int32 bounds); the schedule declines where they fail, and the DSP
schedules (gemm.py) or the reference loops stay. Weights stay int8 in the stream (1x flash:
the flash budget, budget.py, never narrows these layers)."""
from __future__ import annotations

from .. import loop_ir as ir
from .. import micro_mve  # noqa: F401  (registers the mirrors)
from .. import pack_mve
from ..lower import OpContext
from . import conv_geometry, inplace, schedules

K32_ROWS = 64  # rows per mf_mve_gemm_k32 call of a stride-1 layer (see mve_gemm)


@schedules("conv2d", "fully_connected", "depthwise_conv2d")
def mve_gemm(ctx: OpContext, ref: ir.Kernel, target) -> ir.Kernel | None:
    if not target.mve:
        return None
    from .gemm import gemm_layer  # (here: importing gemm first would register it first)
    layer = gemm_layer(ctx)
    if layer is None:
        return None
    x, y = ctx.input(0), ctx.output()
    rows = layer["rows"]
    o, k = rows.shape
    stream, flags = pack_mve.pack_mve(rows, layer["bias"], layer["rq"],
                                      1 if layer["signfix"] else 0)
    consts = [ir.Buffer("pk", "int32", stream.size, "const", stream,
                        "per 4 channels: bias (x_zp folded in), int8 weights in 16-tap chunks, "
                        "mult, add, pre - 1, -post, sign mask")]
    tail = (ir.Ptr("pk", ir.Const(0)), ir.Const(o), ir.Const(layer["lo"]),
            ir.Const(layer["hi"]), ir.Const(flags))
    padded = ctx.node.op != "fully_connected" and any(ctx.attrs["padding"])
    calls, access = None, None  # (gemm_blocks' calls of the GEMM forms)
    pointwise = ctx.node.op == "fully_connected" or (k == x.shape[-1] and not padded)
    # K <= 32 without sign term or shift, clamp up to 127, rows per call >= 2 (AD's single-row
    # 8 -> 128 layer: 1,255 instructions on mf_mve_gemm_f0, 1,724 on it): one row loop per
    # block of 4 channels
    stride1 = ctx.node.op == "fully_connected" or tuple(ctx.attrs["stride"]) == (1, 1)
    n_rows = x.size // k if stride1 else y.shape[2]
    gemm = "mf_mve_gemm_k32" if k <= 32 and flags == 0 and layer["hi"] == 127 and n_rows >= 2 \
        else f"mf_mve_gemm_f{flags}"
    if pointwise and stride1 and gemm == "mf_mve_gemm_k32" and n_rows > 2 * K32_ROWS:
        # mf_mve_gemm_k32 reads every row again per block of 4 channels: over the whole
        # image, its output could not go over its input (inplace.block_rows); in calls of
        # K32_ROWS rows, over the input of the rows already done. VWW on QEMU mps3-an547:
        # arena 55,296 -> 39,880 bytes for +18,031 instructions (+0.8 %; its K = 8 layer
        # +6 %); 32 rows a call: 39,624 bytes for +37,156
        name, scratch = gemm, 0
        full, last = divmod(n_rows, K32_ROWS)
        step = lambda i, r: (ir.Ptr("x", i * (K32_ROWS * k)), ir.Const(r), ir.Const(k),
                             ir.Const(k), *tail, ir.Ptr("y", i * (K32_ROWS * o)), ir.Const(o))
        body = ir.loops([("i", full)], lambda i: [ir.CallStmt(name, step(i, K32_ROWS))])
        if last:
            body += (ir.CallStmt(name, step(ir.Const(full), last)),)
        how = f"{n_rows} rows x {k} taps, {K32_ROWS} rows a call"
        calls = [(i * K32_ROWS * k, i * K32_ROWS * o, min(K32_ROWS, n_rows - i * K32_ROWS), k,
                  k, o, o) for i in range(-(-n_rows // K32_ROWS))]
    elif pointwise and stride1:
        name, scratch = gemm, 0
        body = (ir.CallStmt(name, (ir.Ptr("x", ir.Const(0)), ir.Const(n_rows), ir.Const(k),
                                   ir.Const(k), *tail, ir.Ptr("y", ir.Const(0)), ir.Const(o))),)
        how = f"{n_rows} rows x {k} taps"
        calls = [(0, 0, n_rows, k, k, o, o)]
    elif pointwise:  # strided 1x1: per output row, every stride_w-th pixel
        n, h, w_, c = x.shape
        _, oh, ow, _ = y.shape
        sh, sw = ctx.attrs["stride"]
        name, scratch = gemm, 0
        body = ir.loops([("n", n), ("oy", oh)], lambda b, oy: [ir.CallStmt(name, (
            ir.Ptr("x", b * (h * w_ * c) + oy * (sh * w_ * c)), ir.Const(ow), ir.Const(sw * c),
            ir.Const(k), *tail, ir.Ptr("y", b * (oh * ow * o) + oy * (ow * o)), ir.Const(o)))])
        how = f"{oh} output rows x {ow} pixels x {k} taps, input stride {sw} pixels"
        calls = None if n != 1 else [(oy * sh * w_ * c, oy * ow * o, ow, sw * c, k, o, o)
                                     for oy in range(oh)]
    else:
        n, geom, gbuf = conv_geometry(ctx)
        h, w_, c, _, _, _, _, _, _, oh, ow = (int(v) for v in geom)
        consts.append(gbuf)
        name, scratch = f"mf_mve_conv_f{flags}", 2 * k  # two patches
        body = ir.loops([("n", n)], lambda b: [ir.CallStmt(name, (
            ir.Ptr("x", b * (h * w_ * c)), ir.Ptr("geom", ir.Const(0), ctype="const mf_conv_geom *"),
            ir.Const(layer["x_zp"]), *tail, ir.Ptr("y", b * (oh * ow * o)),
            ir.Ptr("scratch", ir.Const(0))))])
        how = f"im2col, {oh * ow} patches x {k} taps"
        access = inplace.conv_batches(geom, o, 2) if n == 1 else None
    if calls:  # the Helium body (pairs of rows, blocks of 4), the portable one (see inplace)
        access = [inplace.gemm_blocks(calls, x.nbytes, y.nbytes, 2),
                  inplace.gemm_blocks(calls, x.nbytes, y.nbytes, 1, 1)]
        if name == "mf_mve_gemm_k32":  # its asm body (blocks outer); else mf_mve_gemm's
            access.append(inplace.block_rows(calls, x.nbytes, y.nbytes))
    bufs = [b for b in ref.params if b.kind != "scratch"] + consts
    if scratch:
        bufs.append(ir.Buffer("scratch", "int8", scratch, "scratch"))
    doc = (f"{ref.doc}\nscheduled: {name} (Helium, {how}), 4 channels x 1 row, int8 weights in "
           f"one stream ({stream.nbytes} bytes){f', {scratch} bytes scratch' if scratch else ''}")
    return inplace.declare(ir.Kernel(ctx.name, tuple(bufs), tuple(body), doc, ref.macs, name),
                           "x", access)
