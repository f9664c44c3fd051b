"""TFLite converters: data movement operators (TRANSPOSE, MIRROR_PAD, REVERSE_V2,
SPACE_TO_BATCH_ND, BATCH_TO_SPACE_ND, SPACE_TO_DEPTH, DEPTH_TO_SPACE).

Registered in `tflite_ops.CONVERTERS` by `@op`; see tflite_ops for the conventions. Every one
maps onto existing IR ops (transpose, pad, slice, reshape, depth_to_space, space_to_depth):
these kernels only move elements, so quantized tensors need no arithmetic and the quantization
simply travels with the tensors. Operands TFLM reads at run time (MIRROR_PAD's paddings,
REVERSE_V2's axes, the block shapes and crops) decide the loops here, so they must be
constants.
"""
from __future__ import annotations

import numpy as np
import tflite

from mcuforge.ir.graph import Node

from .tflite_ops import Unsupported, op


def _const_ints(ctx, i, what) -> list:
    """The integer values of constant input i, flattened; Unsupported when computed at run
    time (TFLM reads it at run time, mcuforge sizes its loops with it)."""
    t = ctx.input(i)
    if not t.is_const:
        raise Unsupported(f"{what} computed at run time (mcuforge needs a constant)")
    return [int(v) for v in np.asarray(t.data).reshape(-1)]


def _paddings(ctx, i, rank, what="paddings") -> tuple:
    """Input i as ((before, after), ...) per axis: non-negative, one pair per axis."""
    flat = _const_ints(ctx, i, what)
    if len(flat) != 2 * rank or min(flat, default=0) < 0:
        raise ctx.error(f"{what} {flat} are not non-negative [{rank}, 2]")
    return tuple((flat[2 * d], flat[2 * d + 1]) for d in range(rank))


def _check_shape(ctx, expected):
    y = ctx.output()
    if tuple(y.shape) != tuple(expected):
        raise ctx.error(f"output shape {tuple(y.shape)} disagrees with the computed "
                        f"{tuple(expected)}")


@op("TRANSPOSE")
def transpose(ctx):
    x = ctx.input(0)
    rank = len(x.shape)
    perm = _const_ints(ctx, 1, "perm")
    if sorted(perm) != list(range(rank)):
        raise ctx.error(f"perm {perm} is not a permutation of {rank} axes")
    _check_shape(ctx, [x.shape[p] for p in perm])
    return ctx.node("transpose", {"perm": tuple(perm)})


@op("MIRROR_PAD")
def mirror_pad(ctx):
    """REFLECT leaves the edge element out of the mirror image, SYMMETRIC repeats it. TFLM
    reads outside the input when a pad is wider than the mirror image (left side) or clamps
    (right side), so such pads are refused; TensorFlow forbids them too."""
    x = ctx.input(0)
    reflect = ctx.options(tflite.MirrorPadOptions).Mode() == tflite.MirrorPadMode.REFLECT
    pads = _paddings(ctx, 1, len(x.shape))
    for d, (n, (b, a)) in enumerate(zip(x.shape, pads)):
        widest = n - 1 if reflect else n
        if max(b, a) > widest:
            raise Unsupported(f"{'REFLECT' if reflect else 'SYMMETRIC'} pad ({b}, {a}) of "
                              f"axis {d} (size {n}) is wider than {widest}")
    _check_shape(ctx, [n + b + a for n, (b, a) in zip(x.shape, pads)])
    return ctx.node("pad", {"pads": pads, "mode": "reflect" if reflect else "symmetric"},
                    inputs=ctx.inputs[:2])


@op("REVERSE_V2")
def reverse_v2(ctx):
    """A slice with step -1 on the reversed axes. (TFLM refuses axes that are not
    contiguous; the slice reverses any set.)"""
    x = ctx.input(0)
    rank = len(x.shape)
    axes = _const_ints(ctx, 1, "axis")
    if any(not -rank <= a < rank for a in axes):
        raise ctx.error(f"axis {axes} out of range for rank {rank}")
    axes = [a % rank for a in axes]
    if len(set(axes)) != len(axes):
        raise ctx.error(f"axis {axes} repeats an axis")
    _check_shape(ctx, x.shape)
    rev = set(axes)
    return ctx.node("slice", {
        "starts": tuple(n - 1 if d in rev else 0 for d, n in enumerate(x.shape)),
        "ends": tuple(None if d in rev else n for d, n in enumerate(x.shape)),
        "steps": tuple(-1 if d in rev else 1 for d in range(rank)),
    }, inputs=ctx.inputs[:1])


# ---- SPACE_TO_BATCH_ND / BATCH_TO_SPACE_ND ----------------------------------------------------
# TensorFlow's definition, which TFLM's 3-D (NHC) and 4-D (NHWC) kernels implement: with block
# shape (b1..bM) over the spatial axes 1..M, batch element (s1..sM, n) of the deep tensor (s_i
# the offset inside block i, the slowest varying first) holds the pixels of batch n at spatial
# positions p_i * b_i + s_i. So SPACE_TO_BATCH_ND is pad -> reshape [N, P1/b1, b1, ..] ->
# transpose [b1, .., bM, N, P1/b1, ..] -> reshape, and BATCH_TO_SPACE_ND the reverse ending in
# a slice that crops.

def _blocks(ctx, x):
    if len(x.shape) not in (3, 4):
        raise Unsupported(f"{len(x.shape)}-D input (TFLM takes 3-D NHC and 4-D NHWC)")
    block = _const_ints(ctx, 1, "block_shape")
    if len(block) != len(x.shape) - 2:  # TensorFlow allows fewer; TFLM reads past the end
        raise Unsupported(f"block_shape {block} for a {len(x.shape)}-D input (TFLM takes "
                          f"one block size per axis between batch and channels)")
    if min(block) < 1:
        raise ctx.error(f"block_shape {block} is not positive")
    return block


def _split_shape(shape, block) -> list:
    """[N, S1, .., SM, rest] -> [N, S1/b1, b1, .., SM/bM, bM, rest]."""
    out = [shape[0]]
    for s, b in zip(shape[1:], block):
        out += [s // b, b]
    return out + list(shape[1 + len(block):])


@op("SPACE_TO_BATCH_ND")
def space_to_batch_nd(ctx):
    """Pads with 0 (int8: the zero point), as TensorFlow and LiteRT. TFLM pads with the low
    byte of `SpaceToBatchParams.output_offset`, which its Prepare never sets: arena garbage
    that changes from run to run, so padded variants have no TFLM reference to match."""
    x, y = ctx.input(0), ctx.output()
    block = _blocks(ctx, x)
    m = len(block)
    pads = _paddings(ctx, 2, m)
    padded = [x.shape[0]] + [n + b + a for n, (b, a) in zip(x.shape[1:], pads)] \
        + list(x.shape[1 + m:])
    if any(p % b for p, b in zip(padded[1:], block)):
        raise ctx.error(f"padded spatial shape {padded[1:1 + m]} is not a multiple of the "
                        f"block shape {block}")
    split = _split_shape(padded, block)
    perm = [2 + 2 * i for i in range(m)] + [0] + [1 + 2 * i for i in range(m)] \
        + list(range(1 + 2 * m, len(split)))
    moved = [split[p] for p in perm]
    _check_shape(ctx, [int(np.prod(moved[:m + 1]))] + moved[m + 1:])
    nodes, src = [], ctx.inputs[0]
    if any(p != (0, 0) for p in pads):
        src = ctx.new_tensor("padded", padded, x.dtype, quant=y.quant)
        all_pads = ((0, 0),) + pads + ((0, 0),) * (len(x.shape) - 1 - m)
        nodes.append(Node("pad", (ctx.inputs[0],), (src,), {"pads": all_pads}))
    return nodes + _regroup(ctx, src, split, perm, y.quant)


@op("BATCH_TO_SPACE_ND")
def batch_to_space_nd(ctx):
    x, y = ctx.input(0), ctx.output()
    block = _blocks(ctx, x)
    m = len(block)
    crops = _paddings(ctx, 2, m, "crops")
    count = int(np.prod(block))
    if x.shape[0] % count:
        raise ctx.error(f"batch {x.shape[0]} is not a multiple of the block size {count}")
    split = list(block) + [x.shape[0] // count] + list(x.shape[1:])  # [b1..bM, N, S.., rest]
    perm = [m]
    for i in range(m):
        perm += [m + 1 + i, i]
    perm += list(range(2 * m + 1, len(split)))
    moved = [split[p] for p in perm]  # [N, S1, b1, .., SM, bM, rest]
    full = [moved[0]] + [moved[1 + 2 * i] * moved[2 + 2 * i] for i in range(m)] \
        + moved[1 + 2 * m:]
    kept = [n - b - a for n, (b, a) in zip(full[1:], crops)]
    if min(kept) < 1:
        raise ctx.error(f"crops {crops} leave nothing of {full[1:1 + m]}")
    _check_shape(ctx, [full[0]] + kept + full[1 + m:])
    if all(c == (0, 0) for c in crops):
        return _regroup(ctx, ctx.inputs[0], split, perm, y.quant)
    uncropped = ctx.new_tensor("uncropped", full, x.dtype, quant=y.quant)
    nodes = _regroup(ctx, ctx.inputs[0], split, perm, y.quant, out=uncropped)
    starts = [0] + [b for b, _ in crops] + [0] * (len(full) - 1 - m)
    ends = [full[0]] + [b + k for (b, _), k in zip(crops, kept)] + full[1 + m:]
    return nodes + [ctx.node("slice", {"starts": tuple(starts), "ends": tuple(ends),
                                       "steps": (1,) * len(full)}, inputs=[uncropped])]


def _regroup(ctx, src, split, perm, quant, out=None) -> list:
    """reshape src to `split`, transpose by `perm`, reshape into `out` (default: the node's
    output): the one copy that moves the blocks between batch and space."""
    t = ctx.input(0)
    a = ctx.new_tensor("blocks", split, t.dtype, quant=quant)
    b = ctx.new_tensor("moved", [split[p] for p in perm], t.dtype, quant=quant)
    out = out or ctx.outputs[0]
    return [Node("reshape", (src,), (a,), {}),
            Node("transpose", (a,), (b,), {"perm": tuple(perm)}),
            Node("reshape", (b,), (out,), {})]


@op("SPACE_TO_DEPTH", "DEPTH_TO_SPACE")
def space_depth(ctx):
    """Blocks of b x b pixels <-> channels, the block offset slower than the channel (ONNX's
    DCR order)."""
    x = ctx.input(0)
    if len(x.shape) != 4:
        raise ctx.error(f"expects a 4-D NHWC input, got {x.shape}")
    to_depth = ctx.code == "SPACE_TO_DEPTH"
    cls = tflite.SpaceToDepthOptions if to_depth else tflite.DepthToSpaceOptions
    b = ctx.options(cls).BlockSize()
    if b < 1:
        raise ctx.error(f"block size {b}")
    n, h, w, c = x.shape
    if to_depth:
        if h % b or w % b:
            raise ctx.error(f"height {h} and width {w} are not multiples of the block {b}")
        _check_shape(ctx, (n, h // b, w // b, c * b * b))
        return ctx.node("space_to_depth", {"block": b})
    if c % (b * b):
        raise ctx.error(f"{c} channels are not a multiple of block {b} squared")
    _check_shape(ctx, (n, h * b, w * b, c // (b * b)))
    return ctx.node("depth_to_space", {"block": b, "mode": "DCR"})
