"""Constants folded through data-movement operators keep their values as LiteRT computes them,
quantized or float.

The models are built by tests/tfl_build.py on the `tflite` package's builders (not mcuforge's
writer) and run in LiteRT's reference kernels; mcuforge's C must give the same floats. The
SSD-head case is the shape of a detector's anchor boxes: an int8/uint8 constant tiled by
multiples computed from SHAPE -> STRIDED_SLICE -> PACK, reshaped, concatenated with another
such constant of another scale, dequantized. Before the fix a reshape of a quantized constant
stayed a zero-copy alias of arena memory nobody wrote (every anchor came out as the zero
point), and a uint8 concat copied raw values where LiteRT requantizes them.
"""
from __future__ import annotations

import numpy as np
import pytest

from mcuforge import runner
from mcuforge.ir.errors import McuforgeError

from tfl_build import Model, litert

I32 = np.int32


def _qrange(dtype):
    return (-128, 128) if dtype == "int8" else (0, 256)


def _zp(dtype, z):
    return z if dtype == "int8" else z + 128


def ssd_head(dtype, scales=((0.0118, 3), (0.0071, -5)), out=(0.0125, -2)) -> bytes:
    """Anchors: const [1,2,4] --TILE by PACK(1, shape(x)[1], 1)--> [1,6,4] --RESHAPE--> [1,24],
    two of them concatenated along axis 1 (output quantization `out`), then DEQUANTIZE."""
    m, rng = Model(), np.random.default_rng(0)
    x = m.tensor("x", (1, 3, 8), "float32")
    shp = m.tensor("shape", (3,), "int32")
    m.op("SHAPE", [x], [shp], "ShapeOptions", OutType=2)
    n = m.tensor("n", (), "int32")
    m.op("STRIDED_SLICE", [shp, m.const("begin", [1], I32), m.const("end", [2], I32),
                           m.const("strides", [1], I32)], [n],
         "StridedSliceOptions", ShrinkAxisMask=1)
    one = m.const("one", np.array(1, I32))
    mult = m.tensor("multiples", (3,), "int32")
    m.op("PACK", [one, n, one], [mult], "PackOptions", ValuesCount=3, Axis=0)
    parts = []
    for k, (s, z) in enumerate(scales):
        q = rng.integers(*_qrange(dtype), (1, 2, 4))
        a = m.tensor(f"anchor{k}", (1, 2, 4), dtype, q, scale=s, zero_point=_zp(dtype, z))
        t = m.tensor(f"tiled{k}", (1, 6, 4), dtype, scale=s, zero_point=_zp(dtype, z))
        m.op("TILE", [a, mult], [t])
        r = m.tensor(f"flat{k}", (1, 24), dtype, scale=s, zero_point=_zp(dtype, z))
        m.op("RESHAPE", [t, m.const(f"new_shape{k}", [1, 24], I32)], [r], "ReshapeOptions")
        parts.append(r)
    cat = m.tensor("anchors_q", (1, 48), dtype, scale=out[0], zero_point=_zp(dtype, out[1]))
    m.op("CONCATENATION", parts, [cat], "ConcatenationOptions", Axis=1)
    y = m.tensor("anchors", (1, 48), "float32")
    m.op("DEQUANTIZE", [cat], [y])
    m.io([x], [y])
    return m.build()


def _run_both(model, inputs):
    ref = litert(model, inputs)
    got = runner.run(model, inputs[0] if len(inputs) == 1 else
                     {f"arr_{i}": v for i, v in enumerate(inputs)})
    got = got if isinstance(got, dict) else {"y": got}
    return ref, list(got.values())


def test_ssd_head_uint8_anchors_equal_litert():
    """uint8 parts of different scales: LiteRT requantizes them into the output's scale."""
    model = ssd_head("uint8")
    x = np.zeros((1, 3, 8), np.float32)
    [ref], [got] = _run_both(model, [x])
    assert np.abs(ref).max() > 1.0  # anchors really span a range
    np.testing.assert_array_equal(got, ref)


@pytest.mark.parametrize("dtype", ["int8", "uint8"])
def test_ssd_head_one_scale_equals_litert(dtype):
    """All parts quantized like the output: the chain folds to one constant (raw values)."""
    s = (0.0118, 3)
    model = ssd_head(dtype, scales=(s, s), out=s)
    x = np.zeros((1, 3, 8), np.float32)
    [ref], [got] = _run_both(model, [x])
    assert len(np.unique(ref)) > 5
    for part in ref.reshape(2, 3, 8):  # each anchor block tiled 3 times
        assert (part == part[0]).all()
    np.testing.assert_array_equal(got, ref)


def test_ssd_head_int8_different_scales_is_refused_like_litert():
    """LiteRT's int8 CONCATENATION requires one quantization; mcuforge says why it refuses."""
    model = ssd_head("int8")
    with pytest.raises(Exception):
        litert(model, [np.zeros((1, 3, 8), np.float32)])
    with pytest.raises(McuforgeError, match="concat"):
        runner.run(model, np.zeros((1, 3, 8), np.float32))


# ---- every foldable operator, on a constant, quantized and float ------------------------------

C_SHAPE = (2, 3, 4)


def _ops(m, c, c2, c1, dtype, q):
    """(name, output index) of each foldable op applied to constants c, c2 [2,3,4] and c1
    [1,3,4]; q(name, shape) makes an output tensor (quantized unlike the input where LiteRT
    copies raw values regardless)."""
    out = []

    def add(name, code, ins, shapes, options=None, same=False, version=1, **f):
        outs = [q(f"{name}{k}", s, same) for k, s in enumerate(shapes)]
        m.op(code, ins, outs, options, version, **f)
        out.append((name, outs[0]))

    add("reshape", "RESHAPE", [c, m.const("rs", [6, 4], I32)], [(6, 4)], "ReshapeOptions")
    add("squeeze", "SQUEEZE", [c1], [(3, 4)], "SqueezeOptions")
    add("expand_dims", "EXPAND_DIMS", [c, m.const("ed", np.array(1, I32))], [(2, 1, 3, 4)],
        same=True)
    add("tile", "TILE", [c, m.const("tm", [1, 2, 1], I32)], [(2, 6, 4)])
    add("slice", "SLICE", [c, m.const("sb", [0, 1, 1], I32), m.const("ss", [2, 2, -1], I32)],
        [(2, 2, 3)], "SliceOptions")
    add("strided_slice", "STRIDED_SLICE",
        [c, m.const("b", [1, 0, 3], I32), m.const("e", [2, 3, 0], I32),
         m.const("st", [1, 2, -1], I32)], [(1, 2, 3)], "StridedSliceOptions")
    add("split", "SPLIT", [m.const("sa", np.array(2, I32)), c], [(2, 3, 2)] * 2,
        "SplitOptions", NumSplits=2)
    add("split_v", "SPLIT_V", [c, m.const("sv", [3, 1], I32), m.const("sva", np.array(2, I32))],
        [(2, 3, 3), (2, 3, 1)], "SplitVOptions", NumSplits=2)
    add("unpack", "UNPACK", [c], [(2, 4)] * 3, "UnpackOptions", same=True, Num=3, Axis=1)
    add("broadcast_to", "BROADCAST_TO", [c1, m.const("bs", [2, 3, 4], I32)], [(2, 3, 4)],
        version=2)
    add("transpose", "TRANSPOSE", [c, m.const("perm", [2, 0, 1], I32)], [(4, 2, 3)],
        "TransposeOptions")
    add("pack", "PACK", [c, c2], [(2, 2, 3, 4)], "PackOptions", same=True, ValuesCount=2,
        Axis=0)
    add("concat", "CONCATENATION", [c, c2], [(2, 6, 4)], "ConcatenationOptions", same=True,
        Axis=1)
    if dtype == "uint8":  # requantized by LiteRT's uint8 kernel
        add("concat_rescaled", "CONCATENATION", [c, c2], [(4, 3, 4)], "ConcatenationOptions",
            Axis=0)
    return out


QUANT = {"int8": ((0.05, -7), (0.02, 11)), "uint8": ((0.05, 121), (0.02, 139))}


@pytest.mark.parametrize("dtype", ["float32", "int8", "uint8"])
def test_folded_constants_equal_litert(dtype):
    """One model per type: each foldable op reads constants; its (folded) result is read by
    a run-time node (ADD of the input for float, DEQUANTIZE for quantized), so the folded
    constant itself is what is compared."""
    m, rng = Model(), np.random.default_rng(1)
    (s_in, z_in), (s_out, z_out) = QUANT.get(dtype, ((None, None), (None, None)))
    if dtype == "float32":
        data = [rng.normal(size=sh).astype(np.float32) for sh in (C_SHAPE, C_SHAPE, (1, 3, 4))]
    else:
        data = [rng.integers(*_qrange(dtype), sh) for sh in (C_SHAPE, C_SHAPE, (1, 3, 4))]
    c, c2, c1 = (m.tensor(f"c{k}", d.shape, dtype, d, scale=s_in, zero_point=z_in)
                 for k, d in enumerate(data))

    def q(name, shape, same):
        s, z = (s_in, z_in) if same else (s_out, z_out)
        return m.tensor(name, shape, dtype, scale=s, zero_point=z)

    ops = _ops(m, c, c2, c1, dtype, q)
    x = m.tensor("x", (1,), "float32")
    outs = []
    for name, t in ops:
        shape = m.tensors[t]["shape"]
        if dtype != "float32":
            f = m.tensor(f"{name}_f", shape, "float32")
            m.op("DEQUANTIZE", [t], [f])
            t = f
        y = m.tensor(f"{name}_y", shape, "float32")
        m.op("ADD", [t, x], [y], "AddOptions")
        outs.append(y)
    m.io([x], outs)
    model = m.build()
    xv = np.array([0.25], np.float32)
    ref = litert(model, [xv])
    got = runner.run(model, xv)
    assert list(got) == [f"{name}_y" for name, _ in ops]
    for (name, _), r, g in zip(ops, ref, got.values()):
        np.testing.assert_array_equal(g, r, err_msg=f"{name} ({dtype})")


@pytest.mark.parametrize("dtype", ["float32", "int8"])
def test_moves_of_a_constant_straight_to_graph_outputs(dtype):
    """TRANSPOSE and RESHAPE of a constant as the model's outputs (before: the reshape aliased
    an arena buffer nobody wrote, the transpose's C read an undeclared input)."""
    m, rng = Model(), np.random.default_rng(2)
    quant = {} if dtype == "float32" else {"scale": 0.1, "zero_point": 4}
    data = (rng.normal(size=(2, 3)).astype(np.float32) if dtype == "float32"
            else rng.integers(-128, 128, (2, 3)))
    c = m.tensor("c", (2, 3), dtype, data, **quant)
    x = m.tensor("x", (1,), "float32")
    t = m.tensor("t", (3, 2), dtype, **quant)
    r = m.tensor("r", (6,), dtype, **quant)
    xx = m.tensor("xx", (1,), "float32")
    m.op("TRANSPOSE", [c, m.const("perm", [1, 0], I32)], [t], "TransposeOptions")
    m.op("RESHAPE", [c, m.const("rs", [6], I32)], [r], "ReshapeOptions")
    m.op("ADD", [x, x], [xx], "AddOptions")
    m.io([x], [t, r, xx])
    model = m.build()
    xv = np.array([1.5], np.float32)
    ref = litert(model, [xv])
    got = list(runner.run(model, xv).values())
    np.testing.assert_array_equal(ref[0], np.asarray(data, ref[0].dtype).T)  # by hand
    for r_, g in zip(ref, got):
        np.testing.assert_array_equal(g, r_)


def test_operators_reading_a_constant_input_equal_litert():
    """Each operator applied to a constant (as a folded FILL or shape computation leaves them):
    before, the C of most of them read an undeclared input buffer and did not build."""
    rng = np.random.default_rng(3)
    c_data = rng.normal(size=(1, 4, 4, 2)).astype(np.float32)
    m = Model()
    c = m.tensor("c", c_data.shape, "float32", c_data)
    ops = [
        ("PAD", [m.const("p", np.array([[0, 0], [1, 0], [0, 1], [0, 0]], I32))], (1, 5, 5, 2),
         None, {}),
        ("MIRROR_PAD", [m.const("mp", np.array([[0, 0], [1, 1], [1, 1], [0, 0]], I32))],
         (1, 6, 6, 2), "MirrorPadOptions", {}),
        ("MEAN", [m.const("a1", [1, 2], I32)], (1, 2), "ReducerOptions", {}),
        ("SUM", [m.const("a2", [1, 2], I32)], (1, 2), "ReducerOptions", {}),
        ("REDUCE_MAX", [m.const("a3", [1, 2], I32)], (1, 2), "ReducerOptions", {}),
        ("SOFTMAX", [], (1, 4, 4, 2), "SoftmaxOptions", {"Beta": 1.0}),
        ("MAX_POOL_2D", [], (1, 2, 2, 2), "Pool2DOptions",
         dict(Padding=1, StrideH=2, StrideW=2, FilterHeight=2, FilterWidth=2)),
        ("AVERAGE_POOL_2D", [], (1, 2, 2, 2), "Pool2DOptions",
         dict(Padding=1, StrideH=2, StrideW=2, FilterHeight=2, FilterWidth=2)),
        ("SPACE_TO_DEPTH", [], (1, 2, 2, 8), "SpaceToDepthOptions", {"BlockSize": 2}),
        ("RESIZE_BILINEAR", [m.const("rs", [8, 8], I32)], (1, 8, 8, 2),
         "ResizeBilinearOptions", {}),
        ("CUMSUM", [m.const("ax", np.array(1, I32))], (1, 4, 4, 2), "CumsumOptions", {}),
        ("L2_NORMALIZATION", [], (1, 4, 4, 2), "L2NormOptions", {}),
        ("SQUARE", [], (1, 4, 4, 2), None, {}),
        ("CONV_2D", [m.const("w", rng.normal(size=(3, 2, 2, 2)).astype("f4")),
                     m.const("b", np.zeros(3, "f4"))], (1, 3, 3, 3), "Conv2DOptions",
         dict(Padding=1, StrideH=1, StrideW=1, DilationHFactor=1, DilationWFactor=1)),
        ("TRANSPOSE", [m.const("perm", [0, 3, 1, 2], I32)], (1, 2, 4, 4), None, {}),
    ]
    x = m.tensor("x", (1,), "float32")
    xx = m.tensor("xx", (1,), "float32")
    m.op("ADD", [x, x], [xx], "AddOptions")
    outs = []
    for k, (code, extra, shape, options, fields) in enumerate(ops):
        outs.append(m.tensor(f"{code.lower()}_{k}", shape, "float32"))
        m.op(code, [c] + extra, [outs[-1]], options, **fields)
    m.io([x], outs + [xx])
    model = m.build()
    xv = np.array([0.5], np.float32)
    ref = litert(model, [xv])
    got = runner.run(model, xv)
    for (code, *_), r, g in zip(ops, ref, got.values()):
        np.testing.assert_allclose(g, r, rtol=1e-5, atol=1e-6, err_msg=code)
