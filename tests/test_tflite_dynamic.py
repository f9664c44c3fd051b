"""TFLite models with dynamic shape signatures (-1 in shape_signature), as Keras exports an LSTM
unrolled over its time steps: the batch is resolved to 1 (the shape the file stores), the
shape arithmetic on it (SHAPE -> STRIDED_SLICE -> PACK -> FILL of the initial state) folds at
import, and the outputs equal LiteRT's. The models are built with tests/tfl_build.py (the
`tflite` package's builders), independent of mcuforge's writer.
"""
from __future__ import annotations

import numpy as np
import pytest

from frontend.tflite import load_tflite
from mcuforge import runner

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
