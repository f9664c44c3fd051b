"""Legacy uint8-quantized TFLite models (the converters before int8: MobileNet v1 quant) are
bit-exact with LiteRT's reference kernels (tflite-micro refuses them).

Models are built by tests/tfl_build.py on the `tflite` package's builders. Before the uint8
lowerings, CONV_2D / DEPTHWISE_CONV_2D / FULLY_CONNECTED / pools clamped to the int8 range and
RELU / RELU6 / LEAKY_RELU / HARD_SWISH / MEAN ran int8 code on uint8 bytes (silently wrong);
ADD, MUL, SOFTMAX, LOGISTIC, QUANTIZE were refused.
"""
from __future__ import annotations

import zlib

import numpy as np
import pytest

from mcuforge import runner
from mcuforge.ir.errors import McuforgeError

from tfl_build import Model, litert

RNG = np.random.default_rng(5)
QA = dict(scale=0.05, zero_point=120)
QB = dict(scale=0.07, zero_point=131)
SOFT = dict(scale=1 / 256, zero_point=0)


def u8(*shape):
    return RNG.integers(0, 256, shape)


def bias(n, s_in, s_w):
    return (RNG.integers(-800, 800, n), "int32", dict(scale=s_in * s_w, zero_point=0))


def single(op, xshape, yshape, xq, yq, options=None, consts=(), xdtype="uint8",
           ydtype="uint8", **fields):
    """One operator reading input x and constants `consts` [(data, dtype, quant)]."""
    m = Model()
    x = m.tensor("x", xshape, xdtype, **xq)
    ins = [x] + [m.tensor(f"c{i}", np.shape(d), dt, d, **q) for i, (d, dt, q) in
                 enumerate(consts)]
    y = m.tensor("y", yshape, ydtype, **yq)
    m.op(op, ins, [y], options, **fields)
    m.io([x], [y])
    return m.build()


def _conv(op, stride, pad, act, mult=1):
    w = (u8(4, 3, 3, 3) if op == "CONV_2D" else u8(1, 3, 3, 3 * mult))
    n = w.shape[0] if op == "CONV_2D" else w.shape[3]
    out = -(-6 // stride) if pad == 0 else (6 - 3) // stride + 1
    fields = dict(Padding=pad, StrideH=stride, StrideW=stride, DilationHFactor=1,
                  DilationWFactor=1, FusedActivationFunction=act)
    kind = "Conv2DOptions"
    if op == "DEPTHWISE_CONV_2D":
        kind, fields["DepthMultiplier"] = "DepthwiseConv2DOptions", mult
    return single(op, (1, 6, 6, 3), (1, out, out, n), QA, dict(scale=0.25, zero_point=118),
                  kind, consts=[(w, "uint8", dict(scale=0.02, zero_point=135)),
                                bias(n, 0.05, 0.02)], **fields)


CASES = {
    "conv_same_relu6": lambda: _conv("CONV_2D", 1, 0, 3),
    "conv_valid_stride2": lambda: _conv("CONV_2D", 2, 1, 0),
    "dw_same_relu": lambda: _conv("DEPTHWISE_CONV_2D", 1, 0, 1),
    "dw_mult2_stride2_relu6": lambda: _conv("DEPTHWISE_CONV_2D", 2, 0, 3, mult=2),
    "fully_connected": lambda: single(
        "FULLY_CONNECTED", (1, 8), (1, 4), QA, dict(scale=0.2, zero_point=100),
        "FullyConnectedOptions", consts=[(u8(4, 8), "uint8", dict(scale=0.02, zero_point=128)),
                                         bias(4, 0.05, 0.02)]),
    "avg_pool": lambda: single("AVERAGE_POOL_2D", (1, 6, 6, 2), (1, 3, 3, 2), QA, QA,
                               "Pool2DOptions", Padding=0, StrideH=2, StrideW=2,
                               FilterHeight=2, FilterWidth=3),
    "max_pool_relu": lambda: single("MAX_POOL_2D", (1, 6, 6, 2), (1, 3, 3, 2), QA, QA,
                                    "Pool2DOptions", Padding=0, StrideH=2, StrideW=2,
                                    FilterHeight=2, FilterWidth=3, FusedActivationFunction=1),
    "softmax": lambda: single("SOFTMAX", (1, 10), (1, 10), dict(scale=0.1, zero_point=128),
                              SOFT, "SoftmaxOptions", Beta=1.0),
    "logistic": lambda: single("LOGISTIC", (1, 256), (1, 256), dict(scale=0.06, zero_point=128),
                               SOFT),
    "tanh": lambda: single("TANH", (1, 256), (1, 256), dict(scale=0.03, zero_point=120),
                           dict(scale=1 / 128, zero_point=128)),
    "add": lambda: single("ADD", (1, 16), (1, 16), QA, dict(scale=0.1, zero_point=125),
                          "AddOptions", consts=[(u8(1, 16), "uint8", QB)]),
    "add_broadcast_relu": lambda: single("ADD", (1, 2, 2, 4), (1, 2, 2, 4), QA,
                                         dict(scale=0.1, zero_point=125), "AddOptions",
                                         consts=[(u8(4), "uint8", QB)],
                                         FusedActivationFunction=1),
    "mul": lambda: single("MUL", (1, 16), (1, 16), QA, dict(scale=0.3, zero_point=125),
                          "MulOptions", consts=[(u8(1, 16), "uint8", QB)]),
    "relu": lambda: single("RELU", (1, 64), (1, 64), QA, QB),
    "relu6_requantized": lambda: single("RELU6", (1, 64), (1, 64), QA, QB),
    "leaky_relu": lambda: single("LEAKY_RELU", (1, 64), (1, 64), QA, QB, "LeakyReluOptions",
                                 Alpha=0.2),
    "hard_swish": lambda: single("HARD_SWISH", (1, 64), (1, 64), QA, QB),
    "quantize_float": lambda: single("QUANTIZE", (1, 64), (1, 64), {}, QA, xdtype="float32"),
    "requantize": lambda: single("QUANTIZE", (1, 64), (1, 64), QA, QB),
    "quantize_to_int8": lambda: single("QUANTIZE", (1, 64), (1, 64), QA,
                                       dict(scale=0.04, zero_point=-8), ydtype="int8"),
    "dequantize": lambda: single("DEQUANTIZE", (1, 64), (1, 64), QA, {}, ydtype="float32"),
    "concat_two_scales": lambda: single("CONCATENATION", (1, 8), (1, 16), QA, QB,
                                        "ConcatenationOptions",
                                        consts=[(u8(1, 8), "uint8", dict(scale=0.03,
                                                                         zero_point=90))],
                                        Axis=1),
    "reshape": lambda: single("RESHAPE", (1, 2, 8), (1, 16), QA, QA, "ReshapeOptions",
                              consts=[(np.array([1, 16], np.int32), "int32", {})]),
}


def _inputs(model, n=4):
    from ai_edge_litert.interpreter import Interpreter
    d = Interpreter(model_content=model).get_input_details()[0]
    if d["dtype"] == np.float32:
        return RNG.normal(0, 4, (n, *d["shape"])).astype(np.float32)
    return RNG.integers(0, 256, (n, *d["shape"])).astype(np.uint8)


@pytest.mark.parametrize("name", sorted(CASES))
def test_single_op_bit_exact_with_litert(name):
    global RNG
    RNG = np.random.default_rng(zlib.crc32(name.encode()))  # whatever ran before
    model = CASES[name]()
    xs = _inputs(model)
    if name in ("logistic", "tanh"):  # every input value once
        xs = np.arange(256, dtype=np.uint8).reshape(1, 1, 256)
    ref = np.stack([litert(model, [x])[0] for x in xs])
    got = runner.run(model, xs)
    assert len(np.unique(ref)) > 3  # not saturated everywhere
    np.testing.assert_array_equal(got, ref)


def test_uint8_mean_is_refused():
    model = single("MEAN", (1, 4, 4, 3), (1, 1, 1, 3), QA, QB, "ReducerOptions",
                   consts=[(np.array([1, 2], np.int32), "int32", {})], KeepDims=True)
    with pytest.raises(McuforgeError, match="uint8 MEAN"):
        runner.run(model, _inputs(model)[0])


# ---- a MobileNet-v1-quant-shaped network ------------------------------------------------------

def mobilenet_like() -> bytes:
    """float input -> QUANTIZE (uint8) -> conv 3x3/2 relu6 -> depthwise 3x3 relu6 -> conv 1x1
    relu6 -> (ADD with a max-pooled branch, CONCATENATION with a LOGISTIC branch) -> average
    pool -> conv 1x1 logits -> RESHAPE -> SOFTMAX -> DEQUANTIZE; uint8 weights with zero
    points, int32 biases, as the pre-int8 converters wrote them."""
    m, rng = Model(), np.random.default_rng(11)
    qs = iter([(0.035, 128), (0.023, 0), (0.023, 0), (0.05, 0), (0.06, 3), (0.07, 2),
               (0.09, 0), (0.12, 140)])

    def act(name, shape, q=None):
        s, z = q or next(qs)
        return m.tensor(name, shape, "uint8", scale=s, zero_point=z)

    def q_of(t):
        return m.tensors[t]["scale"]

    def conv(name, x, k, cin, cout, stride, depthwise=False, relu6=True, pad=0):
        shape = m.tensors[x]["shape"]
        w_shape = (1, k, k, cin) if depthwise else (cout, k, k, cin)
        s_w = 0.9 / 127 if depthwise else 0.5 / 127
        w = m.tensor(f"{name}_w", w_shape, "uint8", rng.integers(40, 216, w_shape), scale=s_w,
                     zero_point=int(rng.integers(120, 136)))
        b = m.tensor(f"{name}_b", (cout,), "int32", rng.integers(-300, 300, cout),
                     scale=q_of(x) * s_w, zero_point=0)
        h = -(-shape[1] // stride)
        y = act(name, (1, h, h, cout))
        fields = dict(Padding=pad, StrideH=stride, StrideW=stride, DilationHFactor=1,
                      DilationWFactor=1, FusedActivationFunction=3 if relu6 else 0)
        if depthwise:
            m.op("DEPTHWISE_CONV_2D", [x, w, b], [y], "DepthwiseConv2DOptions",
                 DepthMultiplier=1, **fields)
        else:
            m.op("CONV_2D", [x, w, b], [y], "Conv2DOptions", **fields)
        return y

    xf = m.tensor("image", (1, 12, 12, 3), "float32")
    x = act("image_q", (1, 12, 12, 3))
    m.op("QUANTIZE", [xf], [x])
    c1 = conv("conv1", x, 3, 3, 8, 2)
    d1 = conv("dw1", c1, 3, 8, 8, 1, depthwise=True)
    p1 = conv("pw1", d1, 1, 8, 8, 1)
    mp = act("maxpool", (1, 6, 6, 8), (m.tensors[c1]["scale"], m.tensors[c1]["zp"]))
    m.op("MAX_POOL_2D", [c1], [mp], "Pool2DOptions", Padding=0, StrideH=1, StrideW=1,
         FilterHeight=3, FilterWidth=3)
    added = act("added", (1, 6, 6, 8))
    m.op("ADD", [p1, mp], [added], "AddOptions")
    sig = act("gate", (1, 6, 6, 8), (1 / 256, 0))
    m.op("LOGISTIC", [added], [sig])
    cat = act("concat", (1, 6, 6, 16))
    m.op("CONCATENATION", [added, sig], [cat], "ConcatenationOptions", Axis=3)
    pooled = act("avgpool", (1, 1, 1, 16), (m.tensors[cat]["scale"], m.tensors[cat]["zp"]))
    m.op("AVERAGE_POOL_2D", [cat], [pooled], "Pool2DOptions", Padding=1, StrideH=1, StrideW=1,
         FilterHeight=6, FilterWidth=6)
    logits = conv("logits", pooled, 1, 16, 10, 1, relu6=False, pad=1)
    flat = act("flat", (1, 10), (m.tensors[logits]["scale"], m.tensors[logits]["zp"]))
    m.op("RESHAPE", [logits, m.const("flat_shape", np.array([1, 10], np.int32))], [flat],
         "ReshapeOptions")
    prob = act("prob", (1, 10), (1 / 256, 0))
    m.op("SOFTMAX", [flat], [prob], "SoftmaxOptions", Beta=1.0)
    out = m.tensor("prob_f", (1, 10), "float32")
    m.op("DEQUANTIZE", [prob], [out])
    m.io([xf], [out, pooled])
    return m.build()


def test_mobilenet_like_bit_exact_with_litert():
    model = mobilenet_like()
    xs = RNG.uniform(-4, 4, (6, 1, 12, 12, 3)).astype(np.float32)
    got = runner.run(model, xs)
    refs = [litert(model, [x]) for x in xs]
    for k, name in enumerate(got):
        ref = np.stack([r[k] for r in refs])
        np.testing.assert_array_equal(got[name], ref, err_msg=name)
    assert len(np.unique(got["avgpool"])) > 10  # activations are not saturated


def test_conformance_registry_uint8_cases_pass():
    """`mcuforge conformance tflite --filter uint8`: the registry's legacy uint8 cases, against
    LiteRT's reference kernels (the writer-built twins of the cases above)."""
    from mcuforge.tools import conformance, conformance_tflite
    cases = conformance_tflite.load_cases("uint8")
    legacy = [c for c in cases if c.name.startswith(("conv_2d_uint8", "softmax_uint8",
                                                     "average_pool_2d_uint8"))]
    assert len(legacy) >= 5
    results = conformance.run_cases(cases, jobs=1)
    assert [r.name for r in results if r.status != "passed"] == [], \
        [r.reason for r in results if r.status != "passed"]


def test_fully_connected_requantization_ties_equal_litert():
    """x [1, 1] times 256 weights 0..255 with random biases, at several scales: thousands of
    accumulators, some on rounding ties, where LiteRT's uint8 FULLY_CONNECTED rounds once
    (tflite-micro's double rounding, used before, missed 43 of 5120)."""
    rng = np.random.default_rng(0)
    for trial in range(4):
        si, sw, so = (float(np.float32(v)) for v in rng.uniform(0.001, 0.1, 3))
        m = Model()
        x = m.tensor("x", (1, 1), "uint8", scale=si, zero_point=0)
        w = m.tensor("w", (256, 1), "uint8", np.arange(256).reshape(256, 1), scale=sw,
                     zero_point=0)
        b = m.tensor("b", (256,), "int32", rng.integers(-2000, 2000, 256),
                     scale=float(np.float32(si) * np.float32(sw)), zero_point=0)
        y = m.tensor("y", (1, 256), "uint8", scale=so, zero_point=0)
        m.op("FULLY_CONNECTED", [x, w, b], [y], "FullyConnectedOptions")
        m.io([x], [y])
        model = m.build()
        xs = np.arange(0, 256, 17, dtype=np.uint8).reshape(-1, 1, 1)
        ref = np.stack([litert(model, [v])[0] for v in xs])
        np.testing.assert_array_equal(runner.run(model, xs), ref, err_msg=f"trial {trial}")
