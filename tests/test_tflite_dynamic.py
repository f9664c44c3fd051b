"""TFLite models with dynamic shape signatures (-1 in shape_signature), as Keras exports an LSTM
unrolled over its time steps: the batch is resolved to 1 (the shape the file stores), the
shape arithmetic on it (SHAPE -> STRIDED_SLICE -> PACK -> FILL of the initial state) folds at
import, and the outputs equal LiteRT's. The models are built with tests/tfl_build.py (the
`tflite` package's builders), independent of mcuforge's writer.
"""
from __future__ import annotations

import numpy as np
import pytest

from mcuforge.frontend.tflite import load_tflite
from mcuforge import runner
from mcuforge.ir.errors import McuforgeError

from tfl_build import Model, litert

I32 = np.int32
STEPS, FEATURES, UNITS = 4, 3, 5


def lstm_model(steps=STEPS) -> bytes:
    """x [-1, steps, F] -> h after `steps` LSTM cell steps (gates i, f, g, o each from two
    FULLY_CONNECTED layers on x_t and h, ADD, LOGISTIC/TANH; c = f*c + i*g; h = o*tanh(c)).
    h0 and c0 are FILLed with 0 to [batch, UNITS], the batch read by SHAPE."""
    m, rng = Model(), np.random.default_rng(7)

    def act(name, n):  # an activation tensor [1, n], batch dynamic
        return m.tensor(name, (1, n), "float32", sig=(-1, n))

    x = m.tensor("x", (1, steps, FEATURES), "float32", sig=(-1, steps, FEATURES))
    shp = m.tensor("x_shape", (3,), "int32")
    m.op("SHAPE", [x], [shp], "ShapeOptions", OutType=2)
    batch = m.tensor("batch", (), "int32")
    m.op("STRIDED_SLICE", [shp, m.const("b0", [0], I32), m.const("b1", [1], I32),
                           m.const("b2", [1], I32)], [batch],
         "StridedSliceOptions", ShrinkAxisMask=1)
    dims = m.tensor("state_dims", (2,), "int32")
    m.op("PACK", [batch, m.const("units", np.array(UNITS, I32))], [dims], "PackOptions",
         ValuesCount=2, Axis=0)
    zero = m.const("zero", np.array(0.0, np.float32))
    h, c = act("h0", UNITS), act("c0", UNITS)
    m.op("FILL", [dims, zero], [h])
    m.op("FILL", [dims, zero], [c])
    weights = {}
    for g in "ifgo":
        weights[g] = (m.const(f"Wx_{g}", rng.normal(0, 0.5, (UNITS, FEATURES)).astype("f4")),
                      m.const(f"Wh_{g}", rng.normal(0, 0.5, (UNITS, UNITS)).astype("f4")),
                      m.const(f"b_{g}", rng.normal(0, 0.2, (UNITS,)).astype("f4")))
    for t in range(steps):
        xt = act(f"x_{t}", FEATURES)
        m.op("STRIDED_SLICE", [x, m.const(f"xb{t}", [0, t, 0], I32),
                               m.const(f"xe{t}", [0, t + 1, 0], I32),
                               m.const(f"xs{t}", [1, 1, 1], I32)], [xt],
             "StridedSliceOptions", BeginMask=5, EndMask=5, ShrinkAxisMask=2)
        gates = {}
        for g, (wx, wh, b) in weights.items():
            a, r, s = act(f"xw_{g}{t}", UNITS), act(f"hw_{g}{t}", UNITS), act(f"s_{g}{t}", UNITS)
            m.op("FULLY_CONNECTED", [xt, wx, b], [a], "FullyConnectedOptions")
            m.op("FULLY_CONNECTED", [h, wh, -1], [r], "FullyConnectedOptions")
            m.op("ADD", [a, r], [s], "AddOptions")
            gates[g] = act(f"{g}{t}", UNITS)
            m.op("TANH" if g == "g" else "LOGISTIC", [s], [gates[g]])
        fc, ig, tc = act(f"fc{t}", UNITS), act(f"ig{t}", UNITS), act(f"tc{t}", UNITS)
        m.op("MUL", [gates["f"], c], [fc], "MulOptions")
        m.op("MUL", [gates["i"], gates["g"]], [ig], "MulOptions")
        c = act(f"c{t + 1}", UNITS)
        m.op("ADD", [fc, ig], [c], "AddOptions")
        m.op("TANH", [c], [tc])
        h = act(f"h{t + 1}", UNITS)
        m.op("MUL", [gates["o"], tc], [h], "MulOptions")
    m.io([x], [h])
    return m.build()


@pytest.mark.parametrize("steps", [STEPS, 49])
def test_lstm_with_dynamic_batch_equals_litert(steps):
    """Before: h0 = FILL(...) folded to a constant fed FULLY_CONNECTED, whose C then read an
    undeclared input buffer (the build failed)."""
    model = lstm_model(steps)
    x = np.random.default_rng(3).normal(size=(1, steps, FEATURES)).astype(np.float32)
    [ref] = litert(model, [x])
    got = runner.run(model, x)
    assert ref.shape == got.shape == (1, UNITS)
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-6)


def test_the_shape_arithmetic_folds_away():
    """SHAPE, STRIDED_SLICE, PACK and FILL leave no node: h0 and c0 are constant zeros."""
    g = load_tflite(lstm_model(steps=1))
    ops = [n.op for n in g.nodes]
    assert "broadcast_to" not in ops and "shape" not in ops
    assert g.tensors["h0"].is_const and not g.tensors["h0"].data.any()
    assert tuple(g.tensors["x"].shape) == (1, 1, FEATURES)


# ---- fully dynamic inputs ([-1, -1, -1, 3]) given a shape with --input-shape ------------------

def dynamic_cnn() -> bytes:
    """x [-1,-1,-1,3] (stored as [1,1,1,3], as converters write placeholders) -> CONV_2D 3x3/2
    SAME relu -> DEPTHWISE_CONV_2D 3x3 SAME -> AVERAGE_POOL 2x2/2 VALID -> ADD of itself ->
    RESHAPE to [batch, -1] through SHAPE -> STRIDED_SLICE -> PACK, and MEAN over H, W ->
    FULLY_CONNECTED -> SOFTMAX. Every intermediate shape stored is a 1x1 placeholder."""
    m, rng = Model(), np.random.default_rng(9)

    def act(name, shape):
        return m.tensor(name, shape, "float32", sig=tuple(-1 if d == 1 and k < 3 else d
                                                            for k, d in enumerate(shape)))
    x = m.tensor("image", (1, 1, 1, 3), "float32", sig=(-1, -1, -1, 3))
    c = act("conv", (1, 1, 1, 8))
    m.op("CONV_2D", [x, m.const("w1", rng.normal(0, 0.3, (8, 3, 3, 3)).astype("f4")),
                     m.const("b1", rng.normal(0, 0.1, 8).astype("f4"))], [c], "Conv2DOptions",
         Padding=0, StrideH=2, StrideW=2, DilationHFactor=1, DilationWFactor=1,
         FusedActivationFunction=1)
    d = act("dw", (1, 1, 1, 8))
    m.op("DEPTHWISE_CONV_2D", [c, m.const("w2", rng.normal(0, 0.3, (1, 3, 3, 8)).astype("f4")),
                               m.const("b2", np.zeros(8, "f4"))], [d],
         "DepthwiseConv2DOptions", Padding=0, StrideH=1, StrideW=1, DilationHFactor=1,
         DilationWFactor=1, DepthMultiplier=1)
    p = act("pool", (1, 1, 1, 8))
    m.op("AVERAGE_POOL_2D", [d], [p], "Pool2DOptions", Padding=1, StrideH=2, StrideW=2,
         FilterHeight=2, FilterWidth=2)
    s = act("sum", (1, 1, 1, 8))
    m.op("ADD", [p, p], [s], "AddOptions")
    shp = m.tensor("pool_shape", (4,), "int32")
    m.op("SHAPE", [s], [shp], "ShapeOptions", OutType=2)
    batch = m.tensor("batch", (), "int32")
    m.op("STRIDED_SLICE", [shp, m.const("sb", [0], I32), m.const("se", [1], I32),
                           m.const("ss", [1], I32)], [batch], "StridedSliceOptions",
         ShrinkAxisMask=1)
    dims = m.tensor("flat_dims", (2,), "int32")
    m.op("PACK", [batch, m.const("minus1", np.array(-1, I32))], [dims], "PackOptions",
         ValuesCount=2, Axis=0)
    flat = m.tensor("flat", (1, 8), "float32", sig=(-1, -1))
    m.op("RESHAPE", [s, dims], [flat], "ReshapeOptions")
    mean = m.tensor("mean", (1, 8), "float32", sig=(-1, 8))
    m.op("MEAN", [s, m.const("axes", [1, 2], I32)], [mean], "ReducerOptions", KeepDims=False)
    fc = m.tensor("fc", (1, 4), "float32", sig=(-1, 4))
    m.op("FULLY_CONNECTED", [mean, m.const("w3", rng.normal(0, 0.5, (4, 8)).astype("f4")),
                             m.const("b3", np.zeros(4, "f4"))], [fc], "FullyConnectedOptions")
    prob = m.tensor("prob", (1, 4), "float32", sig=(-1, 4))
    m.op("SOFTMAX", [fc], [prob], "SoftmaxOptions", Beta=1.0)
    m.io([x], [prob, flat])
    return m.build()


@pytest.mark.parametrize("hw", [(16, 12), (9, 14)])
def test_dynamic_image_input_with_given_shape_equals_litert(hw):
    model = dynamic_cnn()
    shape = (1, *hw, 3)
    x = np.random.default_rng(4).normal(size=shape).astype(np.float32)
    ref = litert(model, [x])  # LiteRT resizes the input to x's shape
    g = load_tflite(model, input_shapes={"image": shape})
    assert tuple(g.tensors["image"].shape) == shape
    got = runner.run(model, x, input_shapes={"image": shape})
    assert got["flat"].shape == ref[1].shape  # the folded [batch, -1] reshape
    np.testing.assert_allclose(got["prob"], ref[0], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got["flat"], ref[1], rtol=1e-5, atol=1e-6)


def test_dynamic_input_without_a_shape_says_how_to_give_it():
    with pytest.raises(McuforgeError, match=r"--input-shape image=N,N,N,3"):
        load_tflite(dynamic_cnn())


@pytest.mark.parametrize("shapes, message", [
    # the model declares image [-1, -1, -1, 3]: one rule for ONNX and TFLite (input_shapes.py)
    ({"image": (1, 8, 8, 4)}, r"image=1,8,8,4: input 'image' is declared \[\?, \?, \?, 3\]"),
    ({"image": (1, 8, 8)}, r"image=1,8,8: input 'image' is declared \[\?, \?, \?, 3\]"),
    ({"image": (1, 8, 8, 3), "other": (1,)}, "the model has no input 'other'"),
    ({"image": (1, 0, 8, 3)}, "every dimension must be at least 1"),
])
def test_bad_input_shapes_are_one_clear_error(shapes, message):
    with pytest.raises(McuforgeError, match=message):
        load_tflite(dynamic_cnn(), input_shapes=shapes)


def test_cli_input_shape_reaches_the_tflite_frontend(tmp_path):
    from mcuforge.cli import main
    path = tmp_path / "dyn.tflite"
    path.write_bytes(dynamic_cnn())
    x = np.random.default_rng(6).normal(size=(1, 10, 10, 3)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    assert main(["run", str(path), "--input", str(tmp_path / "x.npy"), "--input-shape",
                 "image=1,10,10,3", "--output", str(tmp_path / "y.npz")]) in (0, None)
    got = np.load(tmp_path / "y.npz")
    np.testing.assert_allclose(got["prob"], litert(dynamic_cnn(), [x])[0], rtol=1e-5,
                               atol=1e-6)


@pytest.mark.parametrize("stem", ["ad01_int8", "kws_ref_model", "pretrainedResnet_quant",
                                  "str_ww_ref_model", "vww_96_float"])
def test_shape_rules_reproduce_a_real_converters_shapes(stem):
    """MLPerf Tiny models (TF's converter, dynamic batch): every shape recomputed from the
    inputs equals the one the converter stored."""
    from conftest import mlperf_model
    from mcuforge.frontend.tflite import _Reader
    path = mlperf_model(stem)
    r = _Reader(path.read_bytes(), str(path))
    assert r.shapes is not None  # their inputs have a dynamic batch
    for i, t in enumerate(r.raw):
        stored = tuple(int(d) for d in t.ShapeAsNumpy()) if t.ShapeLength() else ()
        assert r.shapes[i] == stored, r.names[i]
