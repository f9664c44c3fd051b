"""write_tflite: every op_models case loads and runs in tflite-micro with the graph's output
shape and dtype, and agrees with an independent float numpy reference to within 2 int8 steps.

The reference works on the Graph directly (dequantize, compute in float64, quantize), so a
wrong stride, padding mode, weight layout, quantization or option in the written flatbuffer
shows up as a mismatch against tflite-micro.
"""
import numpy as np
import pytest
import tflite
from conftest import require

from mcuforge.frontend.tflite import load_tflite
from mcuforge.frontend.tflite_writer import write_tflite
from mcuforge.tools.demo import demo_model, demo_tflite_bytes
from mcuforge.ir.graph import Graph, Node, Tensor
import op_models  # tests/ has no __init__.py, so pytest puts tests/ on sys.path
from op_models import random_inputs, run_tflm

CASES = op_models.all_cases()
MAX_STEPS = 1  # int8 steps allowed between tflite-micro and the float reference


# ----------------------------------------------------------------------------------------------
# Float reference


def dequant(t: Tensor, q: np.ndarray) -> np.ndarray:
    if t.quant is None:
        return q.astype(np.float64)
    scale = np.asarray(t.quant.scale, dtype=np.float64)
    zp = np.asarray(t.quant.zero_point, dtype=np.float64)
    if t.quant.per_axis:
        shape = [1] * q.ndim
        shape[t.quant.axis] = -1
        scale, zp = scale.reshape(shape), zp.reshape(shape)
    return (q.astype(np.float64) - zp) * scale


def quant(t: Tensor, real: np.ndarray) -> np.ndarray:
    if t.quant is None:
        return real.astype(t.dtype)
    q = np.round(real / t.quant.scale[0]) + t.quant.zero_point[0]
    info = np.iinfo(t.dtype)
    return np.clip(q, info.min, info.max).astype(t.dtype)


def fused(x, activation):
    lo, hi = {"none": (-np.inf, np.inf), "relu": (0, np.inf), "relu6": (0, 6),
              "relu_n1_to_1": (-1, 1)}[activation]
    return np.clip(x, lo, hi)


def windows(x, filt, stride, dilation, pads, out_hw, fill):
    """Yield (i, j, patch) where patch[n, oh, ow, c] is filter tap (i, j) for every output."""
    t, b, l, r = pads
    xp = np.pad(x, ((0, 0), (t, b), (l, r), (0, 0)), constant_values=fill)
    (oh, ow), (sh, sw), (dh, dw) = out_hw, stride, dilation
    for i in range(filt[0]):
        for j in range(filt[1]):
            yield i, j, xp[:, i * dh:i * dh + (oh - 1) * sh + 1:sh,
                           j * dw:j * dw + (ow - 1) * sw + 1:sw, :]


def reference_node(n: Node, g: Graph, vals: dict) -> np.ndarray:
    a = n.attrs
    x = vals[n.inputs[0]]
    out_t = g.tensors[n.outputs[0]]
    bias = vals[n.inputs[2]] if len(n.inputs) > 2 and n.inputs[2] else 0.0
    if n.op == "conv2d":
        w = vals[n.inputs[1]]  # OHWI
        y = sum(p @ w[:, i, j, :].T for i, j, p in windows(
            x, w.shape[1:3], a["stride"], a["dilation"], a["padding"], out_t.shape[1:3], 0.0))
        return fused(y + bias, a["activation"])
    if n.op == "depthwise_conv2d":
        w = vals[n.inputs[1]][0]  # HW(C*M); output channel k reads input channel k // M
        xr = np.repeat(x, a["depth_multiplier"], axis=3)
        y = sum(p * w[i, j] for i, j, p in windows(
            xr, w.shape[:2], a["stride"], a["dilation"], a["padding"], out_t.shape[1:3], 0.0))
        return fused(y + bias, a["activation"])
    if n.op == "fully_connected":
        w = vals[n.inputs[1]]
        y = x.reshape(-1, w.shape[1]) @ w.T + bias
        return fused(y.reshape(out_t.shape), a["activation"])
    if n.op in ("avg_pool2d", "max_pool2d"):
        args = (a["filter"], a["stride"], (1, 1), a["padding"], out_t.shape[1:3])
        if n.op == "max_pool2d":
            y = np.max([p for _, _, p in windows(x, *args, -np.inf)], axis=0)
        else:  # TFLite averages over the taps inside the input only
            total = sum(p for _, _, p in windows(x, *args, 0.0))
            count = sum(p for _, _, p in windows(np.ones_like(x), *args, 0.0))
            y = total / count
        return fused(y, a["activation"])
    if n.op == "add":
        return fused(x + vals[n.inputs[1]], a["activation"])
    if n.op == "mul":
        return fused(x * vals[n.inputs[1]], a["activation"])
    if n.op == "reshape":
        return x.reshape(out_t.shape)
    if n.op == "softmax":
        e = np.exp(a["beta"] * (x - x.max(axis=-1, keepdims=True)))
        return e / e.sum(axis=-1, keepdims=True)
    if n.op == "concat":
        return fused(np.concatenate([vals[i] for i in n.inputs], axis=a["axis"]),
                     a["activation"])
    if n.op == "pad":
        value = float(vals[n.inputs[2]].reshape(-1)[0]) if len(n.inputs) > 2 else 0.0
        return np.pad(x, a["pads"], constant_values=value)
    if n.op == "mean":
        return x.mean(axis=tuple(a["axes"]), keepdims=a["keep_dims"])
    simple = {
        "logistic": lambda v: 1 / (1 + np.exp(-v)),
        "tanh": np.tanh,
        "relu": lambda v: np.maximum(v, 0),
        "relu6": lambda v: np.clip(v, 0, 6),
        "leaky_relu": lambda v: np.where(v > 0, v, a.get("alpha", 0) * v),
        "hard_swish": lambda v: v * np.clip(v + 3, 0, 6) / 6,
        "quantize": lambda v: v,
        "dequantize": lambda v: v,
    }
    return simple[n.op](x)


def reference(g: Graph, inputs: list) -> list:
    vals = {n: dequant(t, t.data) for n, t in g.tensors.items() if t.is_const}
    for name, q in zip(g.inputs, inputs):
        vals[name] = dequant(g.tensors[name], q)
    for n in g.nodes:
        t = g.tensors[n.outputs[0]]
        # round every intermediate to its int8 grid, as the integer kernels do
        vals[t.name] = dequant(t, quant(t, reference_node(n, g, vals)))
    return [quant(g.tensors[o], vals[o]) for o in g.outputs]


# ----------------------------------------------------------------------------------------------
# Tests


@pytest.mark.parametrize("name,graph", CASES, ids=[c[0] for c in CASES])
def test_case_runs_in_tflm_and_matches_reference(name, graph):
    buf = write_tflite(graph)
    inputs = random_inputs(graph)
    outs = run_tflm(buf, inputs)
    assert len(outs) == len(graph.outputs)
    want = reference(graph, inputs)
    for got, ref, oname in zip(outs, want, graph.outputs):
        t = graph.tensors[oname]
        assert got.shape == tuple(t.shape)
        assert got.dtype == np.dtype(t.dtype)
        if t.dtype == "float32":
            np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-6)
        else:
            diff = np.abs(got.astype(np.int64) - ref.astype(np.int64))
            assert diff.max() <= MAX_STEPS, f"{name}: max diff {diff.max()} steps"


def test_cases_are_not_degenerate():
    # a reference that saturates or is constant would let a wrong encoding pass unnoticed
    for name, g in CASES:
        ref = reference(g, random_inputs(g))[0]
        assert len(np.unique(ref)) > 1, name


def test_output_is_deterministic_and_tagged():
    name, g = CASES[0]
    a, b = write_tflite(g), write_tflite(g)
    assert a == b
    assert a[4:8] == b"TFL3"
    m = tflite.Model.GetRootAsModel(a, 0)
    assert m.Version() == 3
    assert m.Buffers(0).DataLength() == 0  # buffer 0 is the empty sentinel


def test_per_channel_quantization_is_written():
    g = dict(CASES)["dw_3x3_m2_s1_same_none_pc"]
    m = tflite.Model.GetRootAsModel(write_tflite(g), 0)
    sg = m.Subgraphs(0)
    w = next(sg.Tensors(i) for i in range(sg.TensorsLength()) if sg.Tensors(i).Name() == b"w")
    q = w.Quantization()
    assert q.ScaleLength() == g.tensors["w"].shape[3]
    assert q.QuantizedDimension() == 3
    assert not q.ZeroPointAsNumpy().any()


@pytest.mark.parametrize("case", [CASES[0][0], "dw_3x3_m2_s1_same_none_pc"])
def test_explicit_padding_is_written_as_pad_and_valid(case):
    """Pads that are neither SAME nor VALID become PAD (the input's zero point) + VALID,
    checked against the reference, which pads by the attribute itself."""
    g = dict(CASES)[case]  # 3x3 stride 1 SAME: pads (1, 1, 1, 1)
    node = g.nodes[0]
    bad = Node(node.op, node.inputs, node.outputs, {**node.attrs, "padding": (2, 0, 1, 1)})
    g = g.replace(nodes=[bad])
    buf = write_tflite(g)
    ops = tflite.Model.GetRootAsModel(buf, 0).Subgraphs(0).OperatorsLength()
    assert ops == 2
    inputs = random_inputs(g)
    diff = np.abs(run_tflm(buf, inputs)[0].astype(np.int64)
                  - reference(g, inputs)[0].astype(np.int64))
    assert diff.max() <= MAX_STEPS


def test_unexpressible_padding_raises():
    name, g = CASES[0]
    node = g.nodes[0]  # pads that do not give the output size: no PAD + VALID either
    bad = Node(node.op, node.inputs, node.outputs, {**node.attrs, "padding": (0, 0, 1, 1)})
    with pytest.raises(ValueError, match="padding"):
        write_tflite(g.replace(nodes=[bad]))


def test_demo_model_runs_and_is_not_degenerate():
    g = demo_model()
    buf = demo_tflite_bytes()
    assert buf == write_tflite(demo_model())  # deterministic
    assert {n.op for n in g.nodes} >= {"conv2d", "depthwise_conv2d", "add", "avg_pool2d",
                                       "reshape", "fully_connected", "softmax"}
    rng = np.random.default_rng(7)
    q = g.tensors["input"].quant
    results = []
    for _ in range(4):
        x = rng.uniform(-1.0, 1.0, size=g.tensors["input"].shape)  # the calibrated input range
        x = np.clip(np.round(x / q.scale[0]) + q.zero_point[0], -128, 127).astype(np.int8)
        (got,) = run_tflm(buf, [x])
        assert got.shape == (1, 10) and got.dtype == np.int8
        assert len(np.unique(got)) > 3  # a real distribution, not one saturated value
        (ref,) = reference(g, [x])
        # 1-step rounding differences compound through six layers and the softmax
        assert np.abs(got.astype(int) - ref.astype(int)).max() <= 4
        results.append(got)
    assert any(not np.array_equal(results[0], r) for r in results[1:])  # depends on the input


@pytest.mark.parametrize("name,graph", CASES, ids=[c[0] for c in CASES])
def test_case_runs_in_litert_like_tflm(name, graph):
    # the full TFLite interpreter is stricter than TFLM in places (e.g. int8 CONV_2D needs a bias)
    litert = require("ai_edge_litert.interpreter")
    buf = write_tflite(graph)
    it = litert.Interpreter(model_content=buf,
                            experimental_op_resolver_type=litert.OpResolverType.BUILTIN_REF)
    it.allocate_tensors()
    inputs = random_inputs(graph)
    for detail, x in zip(it.get_input_details(), inputs):
        it.set_tensor(detail["index"], x)
    it.invoke()
    got = it.get_tensor(it.get_output_details()[0]["index"])
    (want,) = run_tflm(buf, inputs)
    np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), atol=1)


@pytest.mark.parametrize("name,graph", CASES, ids=[c[0] for c in CASES])
def test_round_trip_through_reader(name, graph):
    back = load_tflite(write_tflite(graph))
    assert [n.op for n in back.nodes] == [n.op for n in graph.nodes]
    for want, got in zip(graph.nodes, back.nodes):
        for key, value in want.attrs.items():
            if isinstance(value, float):  # beta and alpha pass through float32
                assert got.attrs[key] == pytest.approx(value), f"{name}: attribute {key}"
            else:
                assert got.attrs[key] == value, f"{name}: attribute {key}"
        # data inputs keep their names, shapes, quantization and values (a conv without a
        # bias comes back with the writer's zero bias, which this skips)
        for t in [i for i in want.inputs if i] + list(want.outputs):
            a, b = graph.tensors[t], back.tensors[t]
            assert (a.shape, a.dtype, a.quant) == (b.shape, b.dtype, b.quant), f"{name}: {t}"
            if a.is_const:
                np.testing.assert_array_equal(a.data, b.data)
