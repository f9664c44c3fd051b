"""Window options the project's own writer never made, built by an independent path, and the
writers' output read back by independent readers.

The conformance cases (mcuforge/tools/tflite_cases) come from frontend/tflite_flatbuffer.py, which
feeds both tflite-micro and the compiler, so a bug shared by writer and reader passes there
(a dilation h/w swap did). Here:
- CONV_2D / DEPTHWISE_CONV_2D / pools with dilation h != w, stride h != w and SAME padding of
  odd total are built with tests/tfl_build.py (the `tflite` package's generated builders) and
  compared: int8 bit-exact with tflite-micro, float with LiteRT, LiteRT with a numpy
  convolution written here;
- models written by frontend/tflite_flatbuffer.py and frontend/tflite_writer.py are parsed by
  the `tflite` package (options equal what was asked for) and run by LiteRT (equal to numpy).
"""
from __future__ import annotations

import numpy as np
import pytest
import tflite

from mcuforge.frontend.tflite_flatbuffer import TflOp, TflSubgraph, TflTensor, write_model
from mcuforge.frontend.tflite_writer import write_tflite
from mcuforge import runner
from mcuforge.tools import tflm
from mcuforge.ir.graph import Graph, Node, Tensor

from tfl_build import Model, litert

SAME, VALID = tflite.Padding.SAME, tflite.Padding.VALID
ACT = {"NONE": 0, "RELU": 1, "RELU6": 3}


# ---- numpy references, written from the TFLite definitions -----------------------------------

def _pads(size, k, s, d, padding):
    """(before, out) along one axis: SAME keeps ceil(size / s) outputs, padding split with the
    smaller half before; VALID pads nothing."""
    eff = (k - 1) * d + 1
    if padding == VALID:
        return 0, (size - eff) // s + 1
    out = -(-size // s)
    total = max((out - 1) * s + eff - size, 0)
    return total // 2, out


def windows(x, kh, kw, stride, dilation, padding, fill=0.0):
    """x [1,H,W,C] -> [OH,OW,kh,kw,C] of the input values each output sees (`fill` outside),
    and a mask of which are inside."""
    _, H, W, C = x.shape
    (pt, oh), (pl, ow) = (_pads(H, kh, stride[0], dilation[0], padding),
                          _pads(W, kw, stride[1], dilation[1], padding))
    out = np.full((oh, ow, kh, kw, C), fill, np.float64)
    inside = np.zeros((oh, ow, kh, kw), bool)
    for i in range(oh):
        for j in range(ow):
            for a in range(kh):
                for b in range(kw):
                    r = i * stride[0] + a * dilation[0] - pt
                    c = j * stride[1] + b * dilation[1] - pl
                    if 0 <= r < H and 0 <= c < W:
                        out[i, j, a, b] = x[0, r, c]
                        inside[i, j, a, b] = True
    return out, inside


def conv_ref(x, w, b, stride, dilation, padding, depthwise=False):
    """Float conv: w OHWI (conv) or 1HW(C*M) (depthwise)."""
    kh, kw = w.shape[1:3]
    win, _ = windows(x, kh, kw, stride, dilation, padding)
    if depthwise:
        mult = w.shape[3] // x.shape[3]
        win = np.repeat(win, mult, axis=-1)  # output channel c*M+m reads input channel c
        y = np.einsum("ijabc,abc->ijc", win, w[0].astype(np.float64))
    else:
        y = np.einsum("ijabc,oabc->ijo", win, w.astype(np.float64))
    return (y + b)[None].astype(np.float32)


def pool_ref(x, kh, kw, stride, padding, kind):
    win, inside = windows(x, kh, kw, stride, (1, 1), padding, fill=-np.inf)
    if kind == "MAX_POOL_2D":
        return win.max(axis=(2, 3))[None].astype(np.float32)
    count = inside.sum(axis=(2, 3))[..., None]
    return (np.where(inside[..., None], win, 0).sum(axis=(2, 3)) / count)[None].astype(np.float32)


# ---- models built with tfl_build ---------------------------------------------------------------

# (name, op, in_hw, channels, kernel hw, stride, dilation, padding, depth multiplier)
CONVS = [
    ("conv_dilation_2x1_same_odd", "CONV_2D", (9, 8), 3, (3, 4), (1, 1), (2, 1), SAME, 1),
    ("conv_dilation_1x3_stride_2x1", "CONV_2D", (9, 10), 2, (2, 3), (2, 1), (1, 3), VALID, 1),
    ("conv_stride_1x2_same_odd", "CONV_2D", (7, 9), 3, (4, 2), (1, 2), (1, 1), SAME, 1),
    ("conv_stride_3x2_dilation_2x3_same", "CONV_2D", (11, 10), 2, (3, 3), (3, 2), (2, 3), SAME,
     1),
    ("dw_dilation_3x1_same", "DEPTHWISE_CONV_2D", (9, 9), 2, (3, 2), (1, 1), (3, 1), SAME, 2),
    ("dw_stride_2x3_same_odd", "DEPTHWISE_CONV_2D", (8, 11), 3, (4, 3), (2, 3), (1, 1), SAME,
     1),
    ("dw_dilation_1x2_stride_1x2_valid", "DEPTHWISE_CONV_2D", (6, 12), 2, (2, 3), (1, 2),
     (1, 2), VALID, 1),
]
# (name, op, in_hw, channels, filter hw, stride, padding)
POOLS = [
    ("max_3x2_stride_2x1_same", "MAX_POOL_2D", (7, 6), 2, (3, 2), (2, 1), SAME),
    ("avg_2x3_stride_1x2_same", "AVERAGE_POOL_2D", (6, 9), 3, (2, 3), (1, 2), SAME),
    ("avg_4x1_stride_3x1_same_odd", "AVERAGE_POOL_2D", (8, 5), 2, (4, 1), (3, 1), SAME),
    ("max_2x4_stride_1x3_valid", "MAX_POOL_2D", (5, 11), 2, (2, 4), (1, 3), VALID),
]


def _weights(rng, op, c, k, mult):
    if op == "CONV_2D":
        return rng.normal(0, 0.4, (4, *k, c)).astype(np.float32)
    return rng.normal(0, 0.4, (1, *k, c * mult)).astype(np.float32)


def conv_model(case, dtype, act="NONE"):
    """The case's layer alone; int8: per-channel symmetric weights, the output scale from the
    float result's range. Returns (model bytes, float input, float reference output)."""
    name, op, hw, c, k, stride, dil, pad, mult = case
    rng = np.random.default_rng(sum(map(ord, name)))
    x = rng.uniform(-2, 2, (1, *hw, c)).astype(np.float32)
    w = _weights(rng, op, c, k, mult)
    n_out = w.shape[0] if op == "CONV_2D" else w.shape[3]
    b = rng.normal(0, 0.3, n_out).astype(np.float32)
    y = conv_ref(x, w, b, stride, dil, pad, op != "CONV_2D")
    m = Model()
    if dtype == "float32":
        xi = m.tensor("x", x.shape, "float32")
        wi, bi = m.const("w", w), m.const("b", b)
        yi = m.tensor("y", y.shape, "float32")
    else:
        sx, zx = 4.0 / 255, -1
        axis = 0 if op == "CONV_2D" else 3
        sw = np.abs(w).max(axis=tuple(i for i in range(4) if i != axis)) / 127
        wq = np.round(w / sw.reshape([-1 if i == axis else 1 for i in range(4)]))
        lo, hi = min(y.min(), 0), max(y.max(), 0)
        sy = (hi - lo) / 255
        zy = int(np.clip(round(-128 - lo / sy), -128, 127))
        xi = m.tensor("x", x.shape, "int8", scale=sx, zero_point=zx)
        wi = m.tensor("w", w.shape, "int8", wq, scale=sw, zero_point=np.zeros_like(sw, int),
                      axis=axis)
        bi = m.tensor("b", b.shape, "int32", np.round(b / (sx * sw)), scale=sx * sw,
                      zero_point=np.zeros_like(sw, int))
        yi = m.tensor("y", y.shape, "int8", scale=sy, zero_point=zy)
        x = np.clip(np.round(x / sx) + zx, -128, 127).astype(np.int8)
    fields = dict(Padding=pad, StrideH=stride[0], StrideW=stride[1], DilationHFactor=dil[0],
                  DilationWFactor=dil[1], FusedActivationFunction=ACT[act])
    if op == "CONV_2D":
        m.op(op, [xi, wi, bi], [yi], "Conv2DOptions", **fields)
    else:
        m.op(op, [xi, wi, bi], [yi], "DepthwiseConv2DOptions", DepthMultiplier=mult, **fields)
    m.io([xi], [yi])
    return m.build(), x, y


def pool_model(case, dtype):
    name, op, hw, c, f, stride, pad = case
    rng = np.random.default_rng(sum(map(ord, name)))
    x = rng.uniform(-2, 2, (1, *hw, c)).astype(np.float32)
    y = pool_ref(x, *f, stride, pad, op)
    m = Model()
    quant = {} if dtype == "float32" else {"scale": 4.0 / 255, "zero_point": 2}
    xi = m.tensor("x", x.shape, dtype, **quant)
    yi = m.tensor("y", y.shape, dtype, **quant)
    m.op(op, [xi], [yi], "Pool2DOptions", Padding=pad, StrideH=stride[0], StrideW=stride[1],
         FilterHeight=f[0], FilterWidth=f[1], FusedActivationFunction=0)
    m.io([xi], [yi])
    if dtype == "int8":
        x = np.clip(np.round(x / quant["scale"]) + 2, -128, 127).astype(np.int8)
    return m.build(), x, y


@pytest.mark.parametrize("case", CONVS + POOLS, ids=lambda c: c[0])
def test_float_equals_litert_and_numpy(case):
    model, x, y = (conv_model if len(case) == 9 else pool_model)(case, "float32")
    [ref] = litert(model, [x])
    np.testing.assert_allclose(ref, y, rtol=1e-5, atol=1e-5)  # the builder wrote the options
    got = runner.run(model, x)
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)


@pytest.mark.skipif(not tflm.available(), reason="tflite-micro is not installed")
@pytest.mark.parametrize("case", CONVS + POOLS, ids=lambda c: c[0])
def test_int8_bit_exact_with_tflm(case):
    model, x, y = (conv_model if len(case) == 9 else pool_model)(case, "int8")
    [ref] = tflm.run(model, [x[None]])
    got = runner.run(model, x)
    np.testing.assert_array_equal(got, ref[0])
    # and TFLM computed the asked-for window: its output dequantized is near the float one
    sg = tflite.Model.GetRootAs(model, 0).Subgraphs(0)
    q = sg.Tensors(sg.Outputs(0)).Quantization()
    deq = (ref[0].astype(np.float64) - q.ZeroPoint(0)) * q.Scale(0)
    assert np.abs(deq - y).max() <= 0.05 * max(np.abs(y).max(), 1.0)


# ---- the project's writers, read back independently --------------------------------------------

OPTIONS = {"CONV_2D": tflite.Conv2DOptions, "DEPTHWISE_CONV_2D": tflite.DepthwiseConv2DOptions,
           "MAX_POOL_2D": tflite.Pool2DOptions, "AVERAGE_POOL_2D": tflite.Pool2DOptions}
_NAMES = {v: k for k, v in vars(tflite.BuiltinOperator).items() if not k.startswith("_")}


def parsed_options(model: bytes):
    """[(op name, {field: value})] of subgraph 0, read with the `tflite` package's parser."""
    m = tflite.Model.GetRootAs(model, 0)
    sg, out = m.Subgraphs(0), []
    for i in range(sg.OperatorsLength()):
        o = sg.Operators(i)
        code = m.OperatorCodes(o.OpcodeIndex())
        name = _NAMES[max(code.BuiltinCode(), code.DeprecatedBuiltinCode())]
        cls = OPTIONS[name]
        assert o.BuiltinOptionsType() == getattr(tflite.BuiltinOptions, cls.__name__)
        opts = cls()
        opts.Init(o.BuiltinOptions().Bytes, o.BuiltinOptions().Pos)
        fields = {"padding": opts.Padding(), "stride": (opts.StrideH(), opts.StrideW()),
                  "activation": opts.FusedActivationFunction()}
        if name in ("CONV_2D", "DEPTHWISE_CONV_2D"):
            fields["dilation"] = (opts.DilationHFactor(), opts.DilationWFactor())
        else:
            fields["filter"] = (opts.FilterHeight(), opts.FilterWidth())
        if name == "DEPTHWISE_CONV_2D":
            fields["depth_multiplier"] = opts.DepthMultiplier()
        out.append((name, fields))
    return out


WRITTEN = [  # (op, in_hw, channels, kernel hw, stride, dilation, padding, activation, mult)
    ("CONV_2D", (9, 8), 2, (3, 2), (1, 2), (2, 3), SAME, "RELU6", 1),
    ("CONV_2D", (10, 7), 3, (2, 3), (2, 1), (3, 1), VALID, "RELU", 1),
    ("CONV_2D", (7, 9), 2, (4, 2), (1, 2), (1, 1), SAME, "NONE", 1),
    ("DEPTHWISE_CONV_2D", (9, 10), 2, (2, 3), (3, 1), (1, 2), SAME, "RELU6", 2),
    ("DEPTHWISE_CONV_2D", (8, 8), 3, (3, 2), (1, 1), (3, 2), SAME, "NONE", 1),
    ("MAX_POOL_2D", (7, 6), 2, (3, 2), (2, 1), (1, 1), SAME, "NONE", 1),
    ("AVERAGE_POOL_2D", (8, 9), 2, (2, 3), (1, 2), (1, 1), SAME, "RELU", 1),
]


def _written_case(case):
    op, hw, c, k, stride, dil, pad, act, mult = case
    rng = np.random.default_rng(sum(hw) + 7 * c + 31 * sum(k))
    x = rng.uniform(-2, 2, (1, *hw, c)).astype(np.float32)
    if op in ("MAX_POOL_2D", "AVERAGE_POOL_2D"):
        w = b = None
        y = pool_ref(x, *k, stride, pad, op)
    else:
        w = _weights(rng, op, c, k, mult)
        b = rng.normal(0, 0.3, w.shape[0] if op == "CONV_2D" else w.shape[3]).astype("f4")
        y = conv_ref(x, w, b, stride, dil, pad, op == "DEPTHWISE_CONV_2D")
    lo, hi = {"NONE": (None, None), "RELU": (0, None), "RELU6": (0, 6)}[act]
    return x, w, b, np.clip(y, lo, hi)


def _expected(case):
    op, _, _, k, stride, dil, pad, act, mult = case
    want = {"padding": pad, "stride": stride, "activation": ACT[act]}
    if op in ("CONV_2D", "DEPTHWISE_CONV_2D"):
        want["dilation"] = dil
    else:
        want["filter"] = k
    if op == "DEPTHWISE_CONV_2D":
        want["depth_multiplier"] = mult
    return [(op, want)]


@pytest.mark.parametrize("case", WRITTEN, ids=lambda c: f"{c[0]}_{c[4]}_{c[5]}_{c[6]}")
def test_tflite_flatbuffer_writes_the_options_asked_for(case):
    op, hw, c, k, stride, dil, pad, act, mult = case
    x, w, b, y = _written_case(case)
    opts = {"padding": "SAME" if pad == SAME else "VALID", "stride_h": stride[0],
            "stride_w": stride[1], "fused_activation_function": act}
    tensors = [TflTensor("x", x.shape, "float32"), TflTensor("y", y.shape, "float32")]
    ins = ["x"]
    if w is not None:
        tensors += [TflTensor("w", w.shape, "float32", w), TflTensor("b", b.shape, "float32", b)]
        ins += ["w", "b"]
        opts.update(dilation_h_factor=dil[0], dilation_w_factor=dil[1])
        if op == "DEPTHWISE_CONV_2D":
            opts["depth_multiplier"] = mult
    else:
        opts.update(filter_height=k[0], filter_width=k[1])
    model = write_model([TflSubgraph(tensors, [TflOp(op, tuple(ins), ("y",), opts)], ["x"],
                                     ["y"])])
    assert parsed_options(model) == _expected(case)
    [ref] = litert(model, [x])
    np.testing.assert_allclose(ref, y, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("case", WRITTEN, ids=lambda c: f"{c[0]}_{c[4]}_{c[5]}_{c[6]}")
def test_tflite_writer_writes_the_graphs_options(case):
    """A graph IR node (explicit pads, as the frontend makes them) written by write_tflite."""
    op, hw, c, k, stride, dil, pad, act, mult = case
    x, w, b, y = _written_case(case)
    pads = []
    for size, kk, s, d in zip(hw, k, stride, dil):
        before, out = _pads(size, kk, s, d, pad)
        pads += [before, max((out - 1) * s + (kk - 1) * d + 1 - size - before, 0)]
    attrs = {"stride": stride, "padding": tuple(pads), "activation": act.lower()}
    tensors = {"x": Tensor("x", x.shape, "float32"), "y": Tensor("y", y.shape, "float32")}
    ins = ("x",)
    if w is None:
        kind = "max_pool2d" if op == "MAX_POOL_2D" else "avg_pool2d"
        attrs["filter"] = k
    else:
        kind = "conv2d" if op == "CONV_2D" else "depthwise_conv2d"
        tensors.update(w=Tensor("w", w.shape, "float32", w), b=Tensor("b", b.shape, "float32", b))
        ins += ("w", "b")
        attrs["dilation"] = dil
        if kind == "depthwise_conv2d":
            attrs["depth_multiplier"] = mult
    g = Graph(tensors, [Node(kind, ins, ("y",), attrs)], ["x"], ["y"], name="written")
    model = write_tflite(g)
    assert parsed_options(model) == _expected(case)
    [ref] = litert(model, [x])
    np.testing.assert_allclose(ref, y, rtol=1e-5, atol=1e-5)


def test_tflite_writer_other_options_read_back():
    """FULLY_CONNECTED keep_num_dims, SOFTMAX beta, LEAKY_RELU alpha, CONCATENATION axis,
    MEAN keep_dims, PAD paddings, RESHAPE new_shape: parsed by the tflite package
    and run by LiteRT against numpy."""
    rng = np.random.default_rng(8)
    w = rng.normal(size=(5, 3)).astype(np.float32)
    t = {n: Tensor(n, s, "float32") for n, s in [
        ("x", (2, 4, 3)), ("fc", (2, 4, 5)), ("sm", (2, 4, 5)), ("lr", (2, 4, 5)),
        ("cat", (2, 4, 10)), ("mean", (2, 1, 10)), ("pad", (2, 3, 12)), ("flat", (2, 36))]}
    t["w"] = Tensor("w", w.shape, "float32", w)
    nodes = [Node("fully_connected", ("x", "w"), ("fc",), {"activation": "none"}),
             Node("softmax", ("fc",), ("sm",), {"beta": 0.5}),
             Node("leaky_relu", ("fc",), ("lr",), {"alpha": 0.25}),
             Node("concat", ("sm", "lr"), ("cat",), {"axis": 2, "activation": "none"}),
             Node("mean", ("cat",), ("mean",), {"axes": (1,), "keep_dims": True}),
             Node("pad", ("mean",), ("pad",), {"pads": ((0, 0), (2, 0), (1, 1))}),
             Node("reshape", ("pad",), ("flat",), {})]
    model = write_tflite(Graph(t, nodes, ["x"], ["flat"], name="opts"))
    m = tflite.Model.GetRootAs(model, 0)
    sg = m.Subgraphs(0)
    seen = {}
    for i in range(sg.OperatorsLength()):
        o = sg.Operators(i)
        code = m.OperatorCodes(o.OpcodeIndex())
        name = _NAMES[max(code.BuiltinCode(), code.DeprecatedBuiltinCode())]
        table = o.BuiltinOptions()
        cls = {"FULLY_CONNECTED": tflite.FullyConnectedOptions,
               "SOFTMAX": tflite.SoftmaxOptions, "LEAKY_RELU": tflite.LeakyReluOptions,
               "CONCATENATION": tflite.ConcatenationOptions, "MEAN": tflite.ReducerOptions,
               "RESHAPE": tflite.ReshapeOptions}.get(name)
        if cls is not None:
            opts = cls()
            opts.Init(table.Bytes, table.Pos)
            seen[name] = opts
        if name == "PAD":
            seen["PAD"] = [sg.Tensors(int(j)) for j in o.InputsAsNumpy()][1]
    assert seen["FULLY_CONNECTED"].KeepNumDims()
    assert seen["SOFTMAX"].Beta() == 0.5
    assert seen["LEAKY_RELU"].Alpha() == 0.25
    assert (seen["CONCATENATION"].Axis(), seen["CONCATENATION"].FusedActivationFunction()) \
        == (2, ACT["NONE"])  # (LiteRT refuses a fused activation on it)
    assert seen["MEAN"].KeepDims()
    assert seen["RESHAPE"].NewShapeAsNumpy().tolist() == [2, 36]
    pad = seen["PAD"]
    pads = np.frombuffer(m.Buffers(pad.Buffer()).DataAsNumpy().tobytes(), "<i4")
    assert pads.reshape(3, 2).tolist() == [[0, 0], [2, 0], [1, 1]]
    x = rng.normal(size=(2, 4, 3)).astype(np.float32)
    fc = x @ w.T
    sm = np.exp(0.5 * (fc - fc.max(-1, keepdims=True)))
    sm /= sm.sum(-1, keepdims=True)
    lr = np.where(fc > 0, fc, 0.25 * fc)
    cat = np.concatenate([sm, lr], 2)
    ref = np.pad(cat.mean(1, keepdims=True), ((0, 0), (2, 0), (1, 1))).reshape(2, 36)
    [got] = litert(model, [x])
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-6)
