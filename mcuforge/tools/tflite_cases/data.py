"""Conformance cases: data movement operators (TRANSPOSE, PAD, PADV2, MIRROR_PAD, REVERSE_V2,
SPACE_TO_BATCH_ND, BATCH_TO_SPACE_ND, SPACE_TO_DEPTH, DEPTH_TO_SPACE, CONCATENATION).

These kernels copy elements without arithmetic, so quantized outputs keep the input's
quantization, as the TFLite converter writes them; int16 zero points are 0."""
from __future__ import annotations

import numpy as np

from . import cases, q, single, tensor

QUANT = {"float32": None, "int8": q(0.05, -7), "int16": q(0.002), "int32": None,
         "int64": None, "uint8": None, "bool": None}


def _t(name, shape, dtype, data=None):
    return tensor(name, shape, dtype, QUANT[dtype], data)


def _i32(name, values):
    values = np.asarray(values)
    return tensor(name, values.shape, "int32", data=values)


@cases("TRANSPOSE")
def transpose_cases():
    perms = {2: (1, 0), 3: (2, 0, 1), 4: (0, 3, 1, 2), 5: (4, 2, 0, 3, 1)}
    shapes = {2: (5, 7), 3: (2, 3, 4), 4: (1, 3, 4, 5), 5: (2, 1, 3, 2, 4)}
    out = []
    for dtype in ("float32", "int8", "int16"):
        for rank, perm in perms.items():
            shape = shapes[rank]
            out.append(single("TRANSPOSE", f"{dtype}_rank{rank}",
                              [_t("x", shape, dtype), _i32("perm", perm)],
                              [_t("y", [shape[p] for p in perm], dtype)]))
    out.append(single("TRANSPOSE", "float32_rank1", [_t("x", (6,), "float32"),
                                                     _i32("perm", [0])],
                      [_t("y", (6,), "float32")]))
    out.append(single("TRANSPOSE", "int8_identity_perm", [_t("x", (2, 3, 4), "int8"),
                                                          _i32("perm", [0, 1, 2])],
                      [_t("y", (2, 3, 4), "int8")]))
    out.append(single("TRANSPOSE", "int16_unit_axes", [_t("x", (1, 5, 1, 3), "int16"),
                                                       _i32("perm", [2, 3, 0, 1])],
                      [_t("y", (1, 3, 1, 5), "int16")]))
    return out


def _padded(shape, pads):
    return [n + b + a for n, (b, a) in zip(shape, pads)]


PAD_LAYOUTS = {
    "rank4": ((1, 4, 3, 2), ((0, 0), (1, 2), (2, 1), (0, 0))),  # TFLM's "image style"
    "rank4_batch_channels": ((2, 2, 3, 3), ((1, 0), (0, 1), (1, 1), (2, 1))),
    "rank2": ((3, 4), ((2, 0), (1, 3))),
    "rank5": ((1, 2, 2, 3, 2), ((0, 1), (1, 0), (0, 0), (2, 1), (0, 1))),
}


@cases("PAD")
def pad_cases():
    """Fills with 0 (int8: the output zero point)."""
    out = []
    for dtype in ("float32", "int8", "int16", "int32"):
        for name, (shape, pads) in PAD_LAYOUTS.items():
            if name == "rank2" and dtype == "float32":
                pads = ((0, 0), (0, 0))  # nothing to pad: a copy
            out.append(single("PAD", f"{dtype}_{name}",
                              [_t("x", shape, dtype), _i32("paddings", pads)],
                              [_t("y", _padded(shape, pads), dtype)]))
    return out


@cases("PADV2")
def padv2_cases():
    """Fills with the constant_values operand: a constant, or (TFLM reads it at run time) a
    model input."""
    values = {"float32": 1.5, "int8": -100, "int16": 1234, "int32": -77}
    out = []
    for dtype in ("float32", "int8", "int16", "int32"):
        shape, pads = PAD_LAYOUTS["rank4"]
        value = _t("value", (1,), dtype, [values[dtype]])
        out.append(single("PADV2", f"{dtype}_rank4",
                          [_t("x", shape, dtype), _i32("paddings", pads), value],
                          [_t("y", _padded(shape, pads), dtype)]))
        shape, pads = PAD_LAYOUTS["rank5"]
        out.append(single("PADV2", f"{dtype}_rank5_runtime_value",
                          [_t("x", shape, dtype), _i32("paddings", pads),
                           _t("value", (1,), dtype)],
                          [_t("y", _padded(shape, pads), dtype)]))
    return out


@cases("MIRROR_PAD")
def mirror_pad_cases():
    """REFLECT pads up to size - 1, SYMMETRIC up to size; TFLM takes float32 and int8."""
    out = []
    for dtype in ("float32", "int8"):
        for mode, widest in (("REFLECT", 0), ("SYMMETRIC", 1)):
            shape = (1, 4, 3, 2)
            pads = ((0, 0), (3, 1 + widest), (1, 2 + widest), (0, 0))
            out.append(single("MIRROR_PAD", f"{dtype}_{mode.lower()}_rank4",
                              [_t("x", shape, dtype), _i32("paddings", pads)],
                              [_t("y", _padded(shape, pads), dtype)], {"mode": mode}))
            shape, pads = (3, 5), ((2, 1), (0, 4 + widest))
            out.append(single("MIRROR_PAD", f"{dtype}_{mode.lower()}_rank2_int64_paddings",
                              [_t("x", shape, dtype),
                               tensor("paddings", (2, 2), "int64", data=pads)],
                              [_t("y", _padded(shape, pads), dtype)], {"mode": mode}))
    return out


@cases("REVERSE_V2")
def reverse_v2_cases():
    """TFLM reverses only contiguous axes; every element type it accepts."""
    shape = (2, 3, 4, 2)
    axes = {"axis1": [1], "axis_neg1": [-1], "axes12": [2, 1], "all": [0, 1, 2, 3],
            "axis0": [0]}
    out = []
    for dtype in ("float32", "int8", "int16", "int32", "int64", "uint8", "bool"):
        for name, ax in axes.items():
            if dtype not in ("float32", "int8") and name in ("axis0", "axis_neg1"):
                continue
            out.append(single("REVERSE_V2", f"{dtype}_{name}",
                              [_t("x", shape, dtype), _i32("axis", ax)],
                              [_t("y", shape, dtype)]))
    return out


@cases("SPACE_TO_BATCH_ND")
def space_to_batch_nd_cases():
    """With padding the reference is LiteRT: TFLM pads with a byte of a parameter its Prepare
    never sets (arena garbage, different from run to run); LiteRT pads with 0 (int8: the zero
    point), as TensorFlow defines it."""
    out = []
    for dtype in ("float32", "int8"):
        for name, shape, block, pads in (
                ("nhwc", (1, 4, 6, 3), [2, 3], [[0, 0], [0, 0]]),
                ("nhwc_padded", (2, 3, 5, 2), [2, 2], [[1, 0], [2, 1]]),
                ("nhc_padded", (2, 5, 3), [3], [[0, 1]])):
            padded = _padded(shape[1:1 + len(block)], pads)
            spatial = [p // b for p, b in zip(padded, block)]
            y = [shape[0] * int(np.prod(block))] + spatial + [shape[-1]]
            out.append(single("SPACE_TO_BATCH_ND", f"{dtype}_{name}",
                              [_t("x", shape, dtype), _i32("block_shape", block),
                               _i32("paddings", pads)], [_t("y", y, dtype)],
                              reference="litert" if "padded" in name else "tflm"))
    return out


@cases("BATCH_TO_SPACE_ND")
def batch_to_space_nd_cases():
    out = []
    for dtype in ("float32", "int8"):
        for name, shape, block, crops in (
                ("nhwc", (6, 2, 2, 3), [2, 3], [[0, 0], [0, 0]]),
                ("nhwc_cropped", (8, 3, 2, 2), [2, 2], [[1, 0], [1, 2]]),
                ("nhc_cropped", (6, 3, 2), [3], [[2, 1]])):
            full = [n * b for n, b in zip(shape[1:1 + len(block)], block)]
            y = [shape[0] // int(np.prod(block))] + [f - b - a for f, (b, a) in
                                                     zip(full, crops)] + [shape[-1]]
            out.append(single("BATCH_TO_SPACE_ND", f"{dtype}_{name}",
                              [_t("x", shape, dtype), _i32("block_shape", block),
                               _i32("crops", crops)], [_t("y", y, dtype)]))
    return out


SPACE_DEPTH = ((2, (1, 4, 6, 3)), (3, (2, 3, 6, 2)))  # block, the shallow (space) shape


@cases("SPACE_TO_DEPTH")
def space_to_depth_cases():
    return [single("SPACE_TO_DEPTH", f"{dtype}_block{b}", [_t("x", (n, h, w, c), dtype)],
                   [_t("y", (n, h // b, w // b, c * b * b), dtype)], {"block_size": b})
            for dtype in ("float32", "int8") for b, (n, h, w, c) in SPACE_DEPTH]


@cases("DEPTH_TO_SPACE")
def depth_to_space_cases():
    return [single("DEPTH_TO_SPACE", f"{dtype}_block{b}",
                   [_t("x", (n, h // b, w // b, c * b * b), dtype)],
                   [_t("y", (n, h, w, c), dtype)], {"block_size": b})
            for dtype in ("float32", "int8") for b, (n, h, w, c) in SPACE_DEPTH]


@cases("CONCATENATION")
def concatenation_cases():
    """Three inputs along every axis of a 4-D tensor (and -1); int8 and int16 share one
    quantization, as TFLM's kernels require (they copy without rescaling)."""
    base = (2, 3, 2, 4)
    sizes = (1, 3, 2)
    out = []
    for dtype in ("float32", "int8", "int16", "int32", "int64", "bool"):
        axes = (0, 1, 2, 3, -1) if dtype in ("float32", "int8", "int16", "int32") else (1,)
        for axis in axes:
            a = axis % 4
            shapes = [base[:a] + (k,) + base[a + 1:] for k in sizes]
            ins = [_t(f"x{i}", s, dtype) for i, s in enumerate(shapes)]
            y = base[:a] + (sum(sizes),) + base[a + 1:]
            name = f"{dtype}_axis{axis}" if axis >= 0 else f"{dtype}_axis_neg{-axis}"
            out.append(single("CONCATENATION", name, ins, [_t("y", y, dtype)],
                              {"axis": axis}))
    shapes = [(1, 2, 3), (1, 2, 1)]
    const = _t("c", shapes[1], "float32", [[[0.5], [-2.0]]])
    out.append(single("CONCATENATION", "float32_constant_input",
                      [_t("x", shapes[0], "float32"), const],
                      [_t("y", (1, 2, 4), "float32")], {"axis": 2}))
    return out
