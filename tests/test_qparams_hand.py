"""The quantizer's choices pinned to hand-derived values from TFLite's published quantization
specification (https://ai.google.dev/edge/litert/models/quantization_spec):

  activations, int8 asymmetric per tensor over a range [min, max] first widened to include 0:
      scale = (max - min) / 255                       (float32, as TFLite holds scales)
      zero_point = round(-128 - min / scale), clamped to [-128, 127]
  weights, int8 symmetric per output channel: scale_c = max|w_c| / 127, zero point 0,
      q = round(w / scale_c) in [-127, 127]
  bias, int32: scale_c = input_scale * weight_scale_c, zero point 0, q = round(b / scale_c)
  RELU6 (TFLite int8): output quantized like the input, clamped to [zp, zp + round(6 / scale)].

Every expected value below is computed in the test from those formulas and the calibration
extremes chosen here; the ranges are picked so that floor, ceil or truncation in place of
round gives another zero point. The ReLU6 cases put 6 inside the tensor's range, so the upper
clamp is the active limit, and check the generated C against tflite-micro byte for byte.
"""
import numpy as np
import pytest
from onnx import helper

from mcuforge.tools import tflm
from mcuforge.api import load
from mcuforge.runner import GraphRunner, run_graph
from mcuforge.optimizer.pipeline import optimize
from mcuforge.optimizer.quantize import quantize_for_compile, quantize_graph
from test_emit_tflite import onnx_model, ort_run

RUN = GraphRunner()  # the quantizer's graph runner: builds each graph once

pytestmark = pytest.mark.skipif(not tflm.available(), reason="tflite-micro not installed")


def spec_params(lo: float, hi: float) -> tuple:
    """(scale, zero point) by the spec's formulas (float32 scale, round half away from zero
    as TfLiteRound; the values here never fall on a half)."""
    lo, hi = min(lo, 0.0), max(hi, 0.0)  # the range always holds 0
    scale = np.float32(np.float32(hi) - np.float32(lo)) / np.float32(255)
    zp = -128 - np.float32(lo) / scale
    return float(scale), int(np.clip(np.round(zp), -128, 127))


def samples_with_extremes(shape, lo, hi, n=6, seed=0):
    """Calibration samples inside [lo, hi] that reach both ends exactly."""
    rng = np.random.default_rng(seed)
    x = rng.uniform(lo, hi, (n,) + tuple(shape)).astype(np.float32)
    x.reshape(n, -1)[0, 0], x.reshape(n, -1)[1, -1] = lo, hi
    return x


# ---------------------------------------------------------------------------------------------
# Activations: scale and zero point

# (min, max) -> zero point by the spec; with floor / ceil / trunc instead of round:
#   (-1.0, 3.0):  -128 + 63.75    = -64.25  -> round -64, floor -65
#   (-1.3, 2.0):  -128 + 100.4545 = -27.545 -> round -28, ceil -27, trunc -27
#   (0.5, 2.0):   widened to [0, 2] -> zero point -128
#   (-3.0, -1.0): widened to [-3, 0] -> -128 + 255 = 127
RANGES = [(-1.0, 3.0), (-1.3, 2.0), (0.5, 2.0), (-3.0, -1.0), (-0.2, 5.1)]


def test_hand_ranges_tell_round_from_floor_ceil_and_trunc():
    """The ranges above do pin the rounding: some other rounding gives another zero point."""
    def zp_with(rounding, lo, hi):
        scale = np.float32(np.float32(max(hi, 0.0)) - np.float32(min(lo, 0.0))) / np.float32(255)
        return int(np.clip(rounding(-128 - np.float32(min(lo, 0.0)) / scale), -128, 127))
    for other in (np.floor, np.ceil, np.trunc):
        assert any(zp_with(other, *r) != zp_with(np.round, *r) for r in RANGES), other


@pytest.mark.parametrize("lo,hi", RANGES)
def test_activation_scale_and_zero_point_by_hand(lo, hi):
    """minmax calibration of the input of x -> tanh: the input's quantization is the spec's."""
    model = onnx_model([helper.make_node("Tanh", ["x"], ["y"])], [1, 8], [1, 8])
    g = optimize(load(model))
    cal = [{"x": s} for s in samples_with_extremes((1, 8), lo, hi)]
    q = quantize_graph(g, cal, method="minmax", rounding="nearest", bias_correction=False, run=RUN)
    got = q.tensors[q.inputs[0]].quant
    scale, zp = spec_params(lo, hi)
    assert got.zero_point == (zp,)
    assert np.float32(got.scale[0]) == np.float32(scale)
    # tanh's output is fixed by the spec: scale 1/128, zero point 0
    assert q.tensors[q.outputs[0]].quant.scale == (1.0 / 128,)
    assert q.tensors[q.outputs[0]].quant.zero_point == (0,)


# ---------------------------------------------------------------------------------------------
# Weights and bias


def test_weight_and_bias_quantization_by_hand():
    """A 1x1 conv: per-channel symmetric weights, int32 bias at input_scale * weight_scale."""
    # w / scale by hand: 0.2 / (0.5 / 127) = 50.8 -> 51 (floor 50); -0.03 / (0.07 / 127) =
    # -54.43 -> -54 (floor -55); b / (in_scale * w_scale), in_scale = 4 / 255: 0.1035 ->
    # 1675.9 -> 1676 (floor 1675), -0.37 -> -2358.75 -> -2359 (ceil -2358)
    w = np.array([[[[0.50]], [[0.2]]],             # channel 0: max|w| 0.5
                  [[[-1.27]], [[0.30]]],           # channel 1: max|w| 1.27 -> scale 0.01
                  [[[0.07]], [[-0.03]]]], np.float32)  # channel 2: max|w| 0.07
    b = np.array([0.1035, -0.37, 0.002], np.float32)
    model = onnx_model([helper.make_node("Conv", ["x", "w", "b"], ["y"])], [1, 2, 3, 3],
                       [1, 3, 3, 3], [("w", w), ("b", b)])
    g = optimize(load(model))
    lo, hi = -1.0, 3.0
    cal = [{"x": s} for s in samples_with_extremes((1, 2, 3, 3), lo, hi)]
    q = quantize_graph(g, cal, method="minmax", rounding="nearest", bias_correction=False, run=RUN)
    conv = next(n for n in q.nodes if n.op == "conv2d")
    wt, bt = q.tensors[conv.inputs[1]], q.tensors[conv.inputs[2]]
    in_scale, _ = spec_params(lo, hi)
    assert q.tensors[conv.inputs[0]].quant.scale == (in_scale,)

    amax = np.abs(w).reshape(3, -1).max(axis=1).astype(np.float32)
    w_scale = amax / np.float32(127)
    assert wt.quant.zero_point == (0, 0, 0) and wt.quant.axis == 0
    np.testing.assert_array_equal(np.asarray(wt.quant.scale, np.float32), w_scale)
    want_w = np.round(w[:, :, 0, 0] / w_scale[:, None])  # OIHW 1x1 -> [O, I]
    assert want_w[0, 1] == 51 and want_w[2, 1] == -54
    np.testing.assert_array_equal(wt.data.reshape(3, 2), want_w)
    assert np.abs(wt.data).max() == 127  # each channel's largest weight lands on +-127

    b_scale = np.float32(in_scale) * w_scale
    assert bt.dtype == "int32" and bt.quant.zero_point == (0, 0, 0)
    np.testing.assert_allclose(np.asarray(bt.quant.scale, np.float64),
                               b_scale.astype(np.float64), rtol=1e-7)
    want_b = np.round(b.astype(np.float64) / b_scale.astype(np.float64))
    assert want_b[0] == 1676 and want_b[1] == -2359
    np.testing.assert_array_equal(bt.data.reshape(-1), want_b)


# ---------------------------------------------------------------------------------------------
# ReLU6 with its upper bound active


def relu6_upper(quant) -> int:
    s, zp = quant.scale[0], quant.zero_point[0]
    return zp + int(np.round(np.float32(6.0) / np.float32(s)))


def check_c_equals_tflm(q, tfl, x8):
    c_out = run_graph(q, [x8])[0]
    ref = tflm.run(tfl, [x8])[0]
    np.testing.assert_array_equal(c_out, ref.reshape(c_out.shape))
    return c_out


def quantized_input(q, x):
    iq = q.tensors[q.inputs[0]].quant
    return np.clip(np.round(x / iq.scale[0]) + iq.zero_point[0], -128, 127).astype(np.int8)


def test_standalone_relu6_clamps_at_six(tmp_path):
    """Clip(0, 6) on an input calibrated to [-2, 11]: TFLite's int8 RELU6, output quantized
    like the input, clamped at zp + round(6 / scale) < 127. By hand: scale = 13 / 255 =
    0.050980, zero point = round(-128 + 39.23) = -89, upper = -89 + round(117.69) = 29."""
    model = onnx_model([helper.make_node("Clip", ["x", "lo", "hi"], ["y"])], [1, 16], [1, 16],
                       [("lo", np.float32(0)), ("hi", np.float32(6))])
    lo, hi = -2.0, 11.0
    cal = samples_with_extremes((1, 16), lo, hi, n=10)
    path = tmp_path / "q.tflite"
    q = quantize_for_compile(load(model), "int8", cal, "minmax", emit_tflite=path, run=RUN)
    assert [n.op for n in q.nodes] == ["relu6"]
    scale, zp = spec_params(lo, hi)
    assert zp == -89
    yq = q.tensors[q.outputs[0]].quant
    assert yq == q.tensors[q.inputs[0]].quant and yq.zero_point == (zp,)
    upper = relu6_upper(yq)
    assert upper == 29
    x = np.linspace(-2, 11, 10 * 16, dtype=np.float32).reshape(10, 1, 16)
    x8 = quantized_input(q, x)
    out = check_c_equals_tflm(q, path.read_bytes(), x8)
    assert out.max() == upper and (out == upper).sum() > 10  # the clamp is what binds
    assert out.min() == zp
    want = ort_run(model, (x8.astype(np.float32) - zp) * np.float32(scale))
    got = (out.astype(np.float32) - zp) * np.float32(scale)
    assert np.abs(got - want.reshape(got.shape)).max() <= scale / 2 + 1e-6


def fused_relu6_model(layer: str):
    """layer -> Clip(0, 6) (fused into the layer), concatenated with a wider tensor of the same
    kind (x * 3, or a conv with 3x larger weights), so the layer's output shares a range
    reaching past 6 (concat inputs share one range)."""
    rng = np.random.default_rng(2)
    inits = [("lo", np.float32(0)), ("hi", np.float32(6))]
    if layer == "conv":
        w = rng.normal(0, 1.5, (2, 2, 1, 1)).astype(np.float32)
        inits += [("w", w), ("b", np.array([1.0, 2.0], np.float32)), ("w3", 3 * w)]
        first = helper.make_node("Conv", ["x", "w", "b"], ["l"])
        wide = helper.make_node("Conv", ["x", "w3"], ["s"])
    else:
        inits += [("c", rng.normal(2, 2, (1, 2, 4, 4)).astype(np.float32)),
                  ("k", np.float32(3.0))]
        first = helper.make_node("Add", ["x", "c"], ["l"])
        wide = helper.make_node("Mul", ["x", "k"], ["s"])
    nodes = [first, helper.make_node("Clip", ["l", "lo", "hi"], ["r"]), wide,
             helper.make_node("Concat", ["r", "s"], ["y"], axis=1)]
    return onnx_model(nodes, [1, 2, 4, 4], [1, 4, 4, 4], inits)


@pytest.mark.parametrize("layer", ["conv", "add"])
def test_fused_relu6_clamps_at_six(layer, tmp_path):
    model = fused_relu6_model(layer)
    rng = np.random.default_rng(4)
    cal = rng.uniform(-2, 4, (20, 1, 2, 4, 4)).astype(np.float32)
    path = tmp_path / "q.tflite"
    q = quantize_for_compile(load(model), "int8", cal, "minmax", emit_tflite=path, run=RUN)
    node = next(n for n in q.nodes if n.op == {"conv": "conv2d", "add": "add"}[layer])
    assert node.attrs["activation"] == "relu6"
    # the concat's shared range reaches back through the layout transposes to the layers
    # themselves: no input needs requantizing
    assert not any(n.op == "quantize" for n in q.nodes)
    yq = q.tensors[node.outputs[0]].quant
    upper = relu6_upper(yq)
    assert upper < 127  # the range reaches past 6
    x8 = quantized_input(q, rng.uniform(-2, 4, (8, 1, 2, 4, 4)).astype(np.float32))
    out = check_c_equals_tflm(q, path.read_bytes(), x8)
    # the output is NCHW: channels 0-1 are the activated layer's
    relu6_part = out.reshape(8, 1, 4, 4, 4)[:, :, :2]
    assert relu6_part.max() == upper and (relu6_part == upper).sum() > 5
    assert relu6_part.min() == yq.zero_point[0]
