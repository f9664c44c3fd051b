"""ONNX layer converters (float32): Conv, ConvTranspose, Gemm, MatMul, the normalisations and the
pools. See frontend/onnx_registry.py for the conventions.

ONNX layers are NCHW; the graph IR's are NHWC, so each goes between to_nhwc / from_nhwc (a layout
pass cancels the transposes between consecutive layers). A 1-D layer (N, C, L) runs as a 2-D one
of height 1. Weights are converted at import: conv OIHW -> OHWI, depthwise -> 1HW(C*M),
fully_connected [out, in].
"""
from __future__ import annotations

import numpy as np


from .onnx_registry import Unsupported, from_nhwc, onnx_op, to_nhwc

SAME = ("SAME_UPPER", "SAME_LOWER")


def _float(*ts):
    for t in ts:
        if t is not None and t.dtype != "float32":
            raise Unsupported(f"{t.dtype} tensors are not supported (float32 only)")


def _const(t, what: str):
    if t is not None and not t.is_const:
        raise Unsupported(f"a non-constant {what} is not supported")
    return t


def _spatial(x) -> int:
    n = len(x.shape) - 2
    if n not in (1, 2):
        raise Unsupported(f"{n}-D spatial input (shape {x.shape}): only 1-D and 2-D")
    return n


def _window(x, out, kernel, strides, dilations, pads, auto_pad) -> tuple:
    """(IR attrs stride, dilation, padding (top, bottom, left, right); 2-D kernel) of a 1-D or
    2-D sliding window; 1-D gets a unit height. SAME pads come from the inferred output size."""
    n = _spatial(x)
    kernel, s, d = list(kernel), list(strides or [1] * n), list(dilations or [1] * n)
    if auto_pad in SAME:
        pairs = []
        for i in range(n):
            total = max(0, (out.shape[2 + i] - 1) * s[i] + (kernel[i] - 1) * d[i] + 1
                        - x.shape[2 + i])
            head = total // 2 if auto_pad == "SAME_UPPER" else total - total // 2
            pairs.append((head, total - head))
    elif auto_pad == "VALID":
        pairs = [(0, 0)] * n
    elif auto_pad == "NOTSET":
        p = list(pads or [0] * 2 * n)
        pairs = [(p[i], p[i + n]) for i in range(n)]
    else:
        raise Unsupported(f"auto_pad {auto_pad}")
    if min(min(pr) for pr in pairs) < 0:
        raise Unsupported(f"negative pads {pads}")
    if n == 1:
        kernel, s, d, pairs = [1] + kernel, [1] + s, [1] + d, [(0, 0)] + pairs
    return dict(stride=tuple(s), dilation=tuple(d), padding=(*pairs[0], *pairs[1])), tuple(kernel)


def _nhwc_in(ctx, x):
    """NCHW -> NHWC; NCL -> N1LC."""
    y = to_nhwc(ctx, x)
    if len(x.shape) == 3:
        n, length, c = y.shape
        y4 = ctx.tmp((n, 1, length, c), x.dtype, "nhwc")
        ctx.emit("reshape", [y], [y4])
        y = y4
    return y


def _emit_nhwc(ctx, op: str, inputs: list, out, **attrs):
    """Emit the NHWC layer op, then convert its result to the node's NCHW (or NCL) output."""
    n, c, *sp = out.shape
    y = ctx.tmp((n, *([1] * (2 - len(sp)) + sp), c), out.dtype, "nhwc")
    ctx.emit(op, [t for t in inputs if t is not None], [y], **attrs)
    if len(sp) == 1:
        y3 = ctx.tmp((n, sp[0], c), out.dtype, "nlc")
        ctx.emit("reshape", [y], [y3])
        y = y3
    from_nhwc(ctx, y, out)


def _weights_nhwc(ctx, w, perm: tuple):
    """Conv weights [a, b, *kernel] as 4-D [a, b, KH, KW] (1-D: KH = 1) permuted by perm: at
    import when constant, else by reshape and transpose nodes (run-time weights, float)."""
    if w.is_const:
        return ctx.const(_weights_2d(w).transpose(perm), hint="w")
    w4 = w
    if len(w.shape) == 3:
        w4 = ctx.tmp((*w.shape[:2], 1, w.shape[2]), w.dtype, "w4")
        ctx.emit("reshape", [w], [w4])
    y = ctx.tmp(tuple(w4.shape[p] for p in perm), w.dtype, "w")
    ctx.emit("transpose", [w4], [y], perm=tuple(perm))
    return y


def _weights_2d(w) -> np.ndarray:
    """Constant conv weights [a, b, *kernel] as float32 [a, b, KH, KW] (1-D: KH = 1)."""
    data = np.asarray(w.data, dtype=np.float32)
    return data.reshape(*data.shape[:2], 1, data.shape[2]) if data.ndim == 3 else data


@onnx_op("Conv")
def Conv(ctx, x, w, b=None, auto_pad="NOTSET", dilations=None, group=1, kernel_shape=None,
         pads=None, strides=None):
    _float(x, w, b)
    _spatial(x)
    out = ctx.out()
    attrs, _ = _window(x, out, w.shape[2:], strides, dilations, pads, auto_pad)
    O, I = w.shape[:2]
    C = x.shape[1]
    xi = _nhwc_in(ctx, x)
    if group > 1 and group == C and I == 1:  # depthwise: output channel o reads channel o // M
        weights = _weights_nhwc(ctx, w, (1, 2, 3, 0))
        _emit_nhwc(ctx, "depthwise_conv2d", [xi, weights, b], out, **attrs,
                   depth_multiplier=O // C, activation="none")
    else:  # conv2d, grouped when I < C
        weights = _weights_nhwc(ctx, w, (0, 2, 3, 1))
        _emit_nhwc(ctx, "conv2d", [xi, weights, b], out, **attrs, activation="none")


@onnx_op("ConvTranspose")
def ConvTranspose(ctx, x, w, b=None, auto_pad="NOTSET", dilations=None, group=1,
                  kernel_shape=None, output_padding=None, output_shape=None, pads=None,
                  strides=None):
    _float(x, w, b)
    n = _spatial(x)
    out = ctx.out()
    s, d = list(strides or [1] * n), list(dilations or [1] * n)
    op = list(output_padding or [0] * n)
    w4 = (*w.shape[:2], 1, w.shape[2]) if n == 1 else tuple(w.shape)
    k = w4[2 + 2 - n:]
    if output_shape is not None or auto_pad in SAME:
        # the padding that gives the inferred output size: onnx's rule (SAME_UPPER puts the
        # smaller half first), none when the output is larger than the full result
        pairs = []
        for i in range(n):
            total = max(0, s[i] * (x.shape[2 + i] - 1) + op[i] + (k[i] - 1) * d[i] + 1
                        - out.shape[2 + i])
            head = total // 2 if auto_pad == "SAME_UPPER" else total - total // 2
            pairs.append((head, total - head))
        pads = [p[0] for p in pairs] + [p[1] for p in pairs]
    attrs, _ = _window(x, out, k, s, d, pads, "VALID" if auto_pad == "VALID" else "NOTSET")
    attrs["output_padding"] = (0, *op) if n == 1 else tuple(op)
    C, OG = w4[:2]
    CI = C // group
    # ONNX [C, O/group, KH, KW] -> OHWI with I = C / group: output channel g*OG + o of group g
    grouped, ohwi = (group, CI, OG, *w4[2:]), (group * OG, *w4[2:], CI)
    if w.is_const:
        weights = ctx.const(_weights_2d(w).reshape(grouped).transpose(0, 2, 3, 4, 1)
                            .reshape(ohwi), hint="w")
    else:  # run-time weights (float): the same rearrangement as nodes
        w5 = ctx.tmp(grouped, w.dtype, "w5")
        ctx.emit("reshape", [w], [w5])
        wt = ctx.tmp((group, OG, *w4[2:], CI), w.dtype, "wt")
        ctx.emit("transpose", [w5], [wt], perm=(0, 2, 3, 4, 1))
        weights = ctx.tmp(ohwi, w.dtype, "w")
        ctx.emit("reshape", [wt], [weights])
    _emit_nhwc(ctx, "conv_transpose2d", [_nhwc_in(ctx, x), weights, b],
               out, **attrs, activation="none")


def _transposed(ctx, t):
    """A 2-D tensor transposed: at import when constant, else by a transpose node."""
    if t.is_const:
        return ctx.const(np.ascontiguousarray(t.data.T), hint="t")
    y = ctx.tmp(t.shape[::-1], t.dtype, "t")
    ctx.emit("transpose", [t], [y], perm=(1, 0))
    return y


def _chain(ctx, y0, steps: list):
    """Emit binary steps [(op, operand)] after y0, the last one writing the node's output."""
    y = y0
    for i, (op, operand) in enumerate(steps):
        dst = ctx.out() if i == len(steps) - 1 else ctx.tmp(ctx.out().shape, "float32", op)
        ctx.emit(op, [y, operand], [dst], activation="none")
        y = dst


@onnx_op("Gemm")
def Gemm(ctx, a, b, c=None, alpha=1.0, beta=1.0, transA=0, transB=0, broadcast=None):
    """alpha * A' B' + beta * C. A constant B becomes fully_connected weights (alpha folded in)
    and a constant C that is the same for every row its bias; the rest is matmul + mul/add."""
    _float(a, b, c)
    out = ctx.out()
    M, N = out.shape
    a = _transposed(ctx, a) if transA else a
    steps, bias = [], None
    if c is not None and c.is_const:
        cv = np.broadcast_to(np.float32(beta) * c.data.astype(np.float32), (M, N))
        same_rows = bool(np.all(cv == cv[0]))
        if b.is_const and same_rows:
            bias = ctx.const(np.ascontiguousarray(cv[0]), hint="bias")
        elif np.any(cv != 0):  # added after the product (one row when the rows agree)
            steps.append(("add", ctx.const(np.ascontiguousarray(cv[0] if same_rows else cv),
                                           hint="c")))
    elif c is not None:
        if beta != 1.0:
            scaled = ctx.tmp(c.shape, "float32", "beta_c")
            ctx.emit("mul", [c, ctx.const(np.float32(beta), hint="beta")], [scaled],
                     activation="none")
            c = scaled
        steps.append(("add", c))
    if b.is_const:
        w = b.data.astype(np.float32)
        w = np.ascontiguousarray(np.float32(alpha) * (w if transB else w.T))
        y = ctx.tmp((M, N), "float32", "fc") if steps else out
        ctx.emit("fully_connected", [a, ctx.const(w, hint="w"), bias], [y], activation="none")
    else:
        b = _transposed(ctx, b) if transB else b
        if alpha != 1.0:
            steps.insert(0, ("mul", ctx.const(np.float32(alpha), hint="alpha")))
        y = ctx.tmp((M, N), "float32", "mm") if steps else out
        ctx.emit("matmul", [a, b], [y])
    _chain(ctx, y, steps)


@onnx_op("MatMul")
def MatMul(ctx, a, b):
    """A 2-D constant right operand makes fully_connected weights; anything else is matmul."""
    _float(a, b)
    if b.is_const and len(b.shape) == 2 and not a.is_const:
        w = np.ascontiguousarray(b.data.astype(np.float32).T)
        ctx.emit("fully_connected", [a, ctx.const(w, hint="w")], activation="none")
    else:
        ctx.emit("matmul", [a, b])


def _channels_last(ctx, op: str, x, params: list, **attrs):
    """Emit a per-channel op on channels-last data: NCHW-like inputs go through to_nhwc."""
    out = ctx.out()
    if len(x.shape) == 2:
        ctx.emit(op, [x, *params], **attrs)
        return
    y = ctx.tmp((out.shape[0], *out.shape[2:], out.shape[1]), out.dtype, "nhwc")
    ctx.emit(op, [to_nhwc(ctx, x), *params], [y], **attrs)
    from_nhwc(ctx, y, out)


@onnx_op("BatchNormalization")
def BatchNormalization(ctx, x, scale, b, mean, var, epsilon=1e-5, momentum=0.9,
                       training_mode=0, spatial=1, is_test=None, consumed_inputs=None):
    """Inference mode: per channel (x - mean) * scale / sqrt(var + eps) + b on channels-last
    data; constant statistics fold into a preceding conv (a pass), run-time ones are read from
    the arena."""
    _float(x, scale, b, mean, var)
    if training_mode or any(o is not None for o in ctx.outputs[1:]):
        raise Unsupported("BatchNormalization in training mode")
    if spatial != 1:
        raise Unsupported("BatchNormalization with spatial=0")
    for t, what in ((scale, "scale"), (b, "bias"), (mean, "mean"), (var, "variance")):
        if t.size not in (1, x.shape[1]):
            raise Unsupported(f"BatchNormalization {what} of shape {t.shape} for "
                              f"{x.shape[1]} channels")
    if len(x.shape) < 2:
        raise Unsupported(f"BatchNormalization of a rank-{len(x.shape)} input")
    _channels_last(ctx, "batch_norm", x, [scale, b, mean, var], epsilon=float(epsilon))


@onnx_op("InstanceNormalization")
def InstanceNormalization(ctx, x, scale, b, epsilon=1e-5):
    _float(x, scale, b)
    if len(x.shape) < 3:
        raise Unsupported(f"InstanceNormalization of a rank-{len(x.shape)} input")
    _channels_last(ctx, "instance_norm", x, [scale, b], epsilon=float(epsilon))


@onnx_op("LayerNormalization", since=17)
def LayerNormalization(ctx, x, scale, b=None, axis=-1, epsilon=1e-5, stash_type=1):
    """Outputs Y, and optionally Mean and InvStdDev (Mean gets a scratch tensor when only
    InvStdDev is wanted: the IR op's outputs are positional)."""
    _float(x, scale, b)
    outs = [o for o in ctx.outputs]
    if len(outs) > 2 and outs[2] is not None and outs[1] is None:
        outs[1] = ctx.tmp(outs[2].shape, "float32", "mean")
    while outs and outs[-1] is None:
        outs.pop()
    ctx.emit("layer_norm", [x, scale, b], outs, axis=axis % len(x.shape), epsilon=float(epsilon))


def _pool(ctx, op: str, x, kernel_shape, strides, pads, auto_pad, dilations, **extra):
    attrs, kernel = _window(x, ctx.out(), kernel_shape, strides, dilations, pads, auto_pad)
    _emit_nhwc(ctx, op, [_nhwc_in(ctx, x)], ctx.out(), filter=kernel, **attrs,
               activation="none", **extra)


@onnx_op("MaxPool")
def MaxPool(ctx, x, auto_pad="NOTSET", ceil_mode=0, dilations=None, kernel_shape=None,
            pads=None, storage_order=0, strides=None):
    """ceil_mode needs nothing: the inferred output size says how many windows there are."""
    if x.dtype not in ("float32", "int8", "uint8"):
        raise Unsupported(f"MaxPool on {x.dtype}")
    if len(ctx.outputs) > 1 and ctx.outputs[1] is not None:
        raise Unsupported("MaxPool's Indices output")
    _pool(ctx, "max_pool2d", x, kernel_shape, strides, pads, auto_pad, dilations)


@onnx_op("AveragePool")
def AveragePool(ctx, x, auto_pad="NOTSET", ceil_mode=0, count_include_pad=0, dilations=None,
                kernel_shape=None, pads=None, strides=None):
    _float(x)
    _pool(ctx, "avg_pool2d", x, kernel_shape, strides, pads, auto_pad, dilations,
          count_include_pad=bool(count_include_pad))


def _global_pool(ctx, op: str, x):
    """A pool whose filter is the whole plane; other spatial ranks are flattened to 1 x S."""
    n, c, *sp = x.shape
    if not sp:
        raise Unsupported(f"global pooling of a rank-{len(x.shape)} input")
    xt = to_nhwc(ctx, x)
    plane = tuple(sp) if len(sp) == 2 else (1, int(np.prod(sp)))
    if len(sp) != 2:
        flat = ctx.tmp((n, *plane, c), x.dtype, "plane")
        ctx.emit("reshape", [xt], [flat])
        xt = flat
    y = ctx.tmp((n, 1, 1, c), x.dtype, "nhwc")
    ctx.emit(op, [xt], [y], filter=plane, stride=(1, 1), dilation=(1, 1), padding=(0, 0, 0, 0),
             activation="none")
    if len(sp) != 2:
        y_sp = ctx.tmp((n, *[1] * len(sp), c), x.dtype, "nhwc")
        ctx.emit("reshape", [y], [y_sp])
        y = y_sp
    from_nhwc(ctx, y, ctx.out())


@onnx_op("GlobalAveragePool")
def GlobalAveragePool(ctx, x):
    _float(x)
    _global_pool(ctx, "avg_pool2d", x)


@onnx_op("GlobalMaxPool")
def GlobalMaxPool(ctx, x):
    if x.dtype not in ("float32", "int8", "uint8"):
        raise Unsupported(f"GlobalMaxPool on {x.dtype}")
    _global_pool(ctx, "max_pool2d", x)


# ---- recurrent layers: graph IR ops "lstm" and "gru" (see codegen_c/lower/layers_float.py) ----
_GATE_FNS = {"LSTM": ["Sigmoid", "Tanh", "Tanh"], "GRU": ["Sigmoid", "Tanh"]}


def _recurrent(ctx, op: str, x, params: list, states: list, extra: list, direction,
               hidden_size, layout, activations, sequence_lens, **attrs):
    """Emit the IR op on [seq, batch, ...] data; layout 1 ([batch, seq, ...]) is transposed in
    and out. Outputs the node does not use get scratch tensors: y and the states hold the
    recurrence."""
    _float(x, *params, *states, *extra)
    dirs = 2 if direction == "bidirectional" else 1
    if direction not in ("forward", "reverse", "bidirectional"):
        raise Unsupported(f"direction {direction}")
    if activations is not None and list(activations) != _GATE_FNS[ctx.node.op_type] * dirs:
        raise Unsupported(f"activations {list(activations)} (only ONNX's defaults)")
    seq, batch = (x.shape[1], x.shape[0]) if layout else x.shape[:2]
    if sequence_lens is not None:
        _const(sequence_lens, "sequence_lens")
        if np.any(sequence_lens.data != seq):
            raise Unsupported("sequence_lens shorter than the sequence")
    hidden = int(hidden_size or params[1].shape[-1])
    if seq == 1 and states[0] is None:  # the recurrent weights multiply a zero state: unused
        params = [params[0], None, params[2]]
    tmp = lambda shape, hint: ctx.b.fresh(f"{ctx.name or op}_{hint}", shape, "float32")

    def swap01(t):  # [a, b, ...] <-> [b, a, ...]
        if t is None or not layout:
            return t
        y = tmp((t.shape[1], t.shape[0], *t.shape[2:]), "seq_major")
        ctx.emit("transpose", [t], [y], perm=(1, 0, *range(2, len(t.shape))))
        return y
    shapes = [(seq, dirs, batch, hidden)] + [(dirs, batch, hidden)] * (
        len(_GATE_FNS[ctx.node.op_type]) - 1)
    outs = [ctx.outputs[i] if i < len(ctx.outputs) else None for i in range(len(shapes))]
    ir_outs = [o if o is not None and not layout else tmp(s, f"out{i}")
               for i, (o, s) in enumerate(zip(outs, shapes))]
    ctx.emit(op, [swap01(x), *params, *[swap01(t) for t in states], *extra], ir_outs,
             hidden_size=hidden, direction=direction, **attrs)
    for i, (o, t) in enumerate(zip(outs, ir_outs)):
        if o is not None and t is not o:  # layout 1: Y [batch, seq, dirs, H], states [batch, ...]
            ctx.emit("transpose", [t], [o], perm=(2, 0, 1, 3) if i == 0 else (1, 0, 2))


@onnx_op("LSTM")
def LSTM(ctx, x, w, r, b=None, sequence_lens=None, initial_h=None, initial_c=None, p=None,
         activation_alpha=None, activation_beta=None, activations=None, clip=None,
         direction="forward", hidden_size=None, input_forget=0, layout=0):
    _recurrent(ctx, "lstm", x, [w, r, b], [initial_h, initial_c], [p], direction, hidden_size,
               layout, activations, sequence_lens, clip=clip, input_forget=int(input_forget))


@onnx_op("GRU")
def GRU(ctx, x, w, r, b=None, sequence_lens=None, initial_h=None, activation_alpha=None,
        activation_beta=None, activations=None, clip=None, direction="forward",
        hidden_size=None, layout=0, linear_before_reset=0):
    _recurrent(ctx, "gru", x, [w, r, b], [initial_h], [], direction, hidden_size, layout,
               activations, sequence_lens, clip=clip,
               linear_before_reset=int(linear_before_reset))
