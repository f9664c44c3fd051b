"""A small int8 model mcuforge builds itself, so examples and tests need no downloaded file.

    x 1x16x16x3 -> conv 3x3 8ch relu -> depthwise 3x3 s2 relu6 -> conv 1x1 16ch --+
                        |                                                       add relu
                        +--------------> conv 1x1 s2 16ch (shortcut) ----------+
    -> avg pool 8x8 -> reshape 1x16 -> fully_connected 10 -> softmax

Weights are random with a fixed seed. Activation quantization comes from a float forward pass
over random calibration inputs, as post-training quantization would, so no tensor saturates.
"""
from __future__ import annotations

import numpy as np

from mcuforge.ir.graph import Graph, Node, Quant, Tensor, verify

SEED = 20240601
INPUT_SHAPE = (1, 16, 16, 3)
INPUT_RANGE = (-1.0, 1.0)
CALIBRATION_SAMPLES = 16


def demo_model() -> Graph:
    """The demo network as an int8 Graph (deterministic)."""
    rng = np.random.default_rng(SEED)
    fw = _float_weights(rng)
    calib = rng.uniform(*INPUT_RANGE, size=(CALIBRATION_SAMPLES,) + INPUT_SHAPE[1:])
    ranges = {name: (float(v.min()), float(v.max())) for name, v in _forward(fw, calib).items()}
    ranges["input"] = INPUT_RANGE
    return _quantize(fw, ranges)


def demo_tflite_bytes() -> bytes:
    """The demo network as a .tflite flatbuffer."""
    from mcuforge.frontend.tflite_writer import write_tflite

    return write_tflite(demo_model())


# ----------------------------------------------------------------------------------------------
# Float network

# (name, op, weight shape, stride, activation); conv weights OHWI, depthwise 1HWC, fc [out, in]
LAYERS = (
    ("conv1", "conv2d", (8, 3, 3, 3), 1, "relu"),
    ("dw", "depthwise_conv2d", (1, 3, 3, 8), 2, "relu6"),
    ("pw", "conv2d", (16, 1, 1, 8), 1, "none"),
    ("shortcut", "conv2d", (16, 1, 1, 8), 2, "none"),
    ("fc", "fully_connected", (10, 16), 1, "none"),
)


def _float_weights(rng) -> dict:
    fw = {}
    for name, op, shape, _, _ in LAYERS:
        fan_in = shape[1] * shape[2] if op == "depthwise_conv2d" else int(np.prod(shape[1:]))
        gain = 4.0 if op == "fully_connected" else np.sqrt(2.0)  # spread logits for softmax
        cout = shape[3] if op == "depthwise_conv2d" else shape[0]
        fw[name] = (rng.normal(0.0, gain / np.sqrt(fan_in), size=shape),
                    rng.normal(0.0, 0.05, size=cout))
    return fw


def same_pads(in_hw, k, stride):
    """TFLite SAME padding as explicit (top, bottom, left, right)."""
    pads = []
    for i in in_hw:
        total = max((-(-i // stride) - 1) * stride + k - i, 0)
        pads += [total // 2, total - total // 2]
    return tuple(pads)


def _conv(x, w, b, stride, depthwise):
    """Float NHWC convolution with SAME padding; w is OHWI, or 1HWC when depthwise."""
    k = w.shape[1]
    t, bo, l, r = same_pads(x.shape[1:3], k, stride)
    xp = np.pad(x, ((0, 0), (t, bo), (l, r), (0, 0)))
    oh, ow = -(-x.shape[1] // stride), -(-x.shape[2] // stride)
    y = 0.0
    for i in range(k):
        for j in range(k):
            patch = xp[:, i:i + (oh - 1) * stride + 1:stride, j:j + (ow - 1) * stride + 1:stride]
            y = y + (patch * w[0, i, j] if depthwise else patch @ w[:, i, j, :].T)
    return y + b


def _act(x, activation):
    return {"none": x, "relu": np.maximum(x, 0), "relu6": np.clip(x, 0, 6)}[activation]


def _forward(fw, x) -> dict:
    """Float activations of every quantized tensor, keyed by tensor name."""
    v = {}
    v["conv1"] = _act(_conv(x, *fw["conv1"], 1, False), "relu")
    v["dw"] = _act(_conv(v["conv1"], *fw["dw"], 2, True), "relu6")
    v["pw"] = _conv(v["dw"], *fw["pw"], 1, False)
    v["shortcut"] = _conv(v["conv1"], *fw["shortcut"], 2, False)
    v["add"] = _act(v["pw"] + v["shortcut"], "relu")
    pooled = v["add"].mean(axis=(1, 2))
    v["fc"] = pooled @ fw["fc"][0].T + fw["fc"][1]
    return v


# ----------------------------------------------------------------------------------------------
# Quantization


def quant_for_range(lo: float, hi: float) -> Quant:
    """Asymmetric int8 quantization covering [lo, hi] and 0, as the TFLite converter does."""
    lo, hi = min(lo, 0.0), max(hi, 0.0)
    scale = float(np.float32(max(hi - lo, 1e-6) / 255.0))
    return Quant((scale,), (int(np.clip(round(-128 - lo / scale), -128, 127)),))


def _quantize(fw, ranges) -> Graph:
    tensors, nodes = {}, []

    def act(name, shape, quant):
        tensors[name] = Tensor(name, tuple(shape), "int8", quant=quant)

    def weights(layer, op, in_quant):
        w, b = fw[layer]
        # symmetric int8; per-channel for convolutions, per-tensor for fully_connected, like
        # the TFLite converter's default (TFLM's Hexagon kernels reject per-channel FC)
        axis = 3 if op == "depthwise_conv2d" else 0
        other = tuple(i for i in range(w.ndim) if i != axis or op == "fully_connected")
        scale = (np.maximum(np.abs(w).max(axis=other), 1e-8) / 127.0).astype(np.float32)
        scale = scale.reshape(-1)
        shaped = scale.reshape([-1 if i == axis else 1 for i in range(w.ndim)])
        qw = np.clip(np.round(w / shaped), -127, 127).astype(np.int8)
        bscale = (np.float32(in_quant.scale[0]) * scale).astype(np.float32)  # per weight scale
        qb = np.round(b / bscale).astype(np.int32)
        n = len(scale)
        tensors[layer + "/w"] = Tensor(layer + "/w", qw.shape, "int8", data=qw, quant=Quant(
            tuple(map(float, scale)), (0,) * n, axis if n > 1 else 0))
        tensors[layer + "/b"] = Tensor(layer + "/b", qb.shape, "int32", data=qb, quant=Quant(
            tuple(map(float, bscale)), (0,) * n, 0))
        return [layer + "/w", layer + "/b"]

    q = {name: quant_for_range(*r) for name, r in ranges.items()}
    act("input", INPUT_SHAPE, q["input"])
    shapes = {"conv1": (1, 16, 16, 8), "dw": (1, 8, 8, 8), "pw": (1, 8, 8, 16),
              "shortcut": (1, 8, 8, 16)}
    sources = {"conv1": "input", "dw": "conv1", "pw": "dw", "shortcut": "conv1"}
    for name, op, wshape, stride, activation in LAYERS[:4]:
        src = sources[name]
        act(name, shapes[name], q[name])
        attrs = dict(stride=(stride, stride), dilation=(1, 1), activation=activation,
                     padding=same_pads(tensors[src].shape[1:3], wshape[1], stride))
        if op == "depthwise_conv2d":
            attrs["depth_multiplier"] = 1
        nodes.append(Node(op, tuple([src] + weights(name, op, q[src])), (name,), attrs, name))
    act("add", (1, 8, 8, 16), q["add"])
    nodes.append(Node("add", ("pw", "shortcut"), ("add",), {"activation": "relu"}, "add"))
    act("pool", (1, 1, 1, 16), q["add"])  # TFLM pooling keeps the input's quantization
    nodes.append(Node("avg_pool2d", ("add",), ("pool",), {
        "filter": (8, 8), "stride": (1, 1), "padding": (0, 0, 0, 0), "activation": "none"},
        "pool"))
    act("flat", (1, 16), q["add"])
    nodes.append(Node("reshape", ("pool",), ("flat",), {}, "flat"))
    act("fc", (1, 10), q["fc"])
    nodes.append(Node("fully_connected", ("flat",) + tuple(weights("fc", "fully_connected",
                                                                     q["add"])),
                      ("fc",), {"activation": "none"}, "fc"))
    act("output", (1, 10), Quant((1.0 / 256,), (-128,)))  # TFLite's int8 softmax output
    nodes.append(Node("softmax", ("fc",), ("output",), {"beta": 1.0}, "softmax"))
    return verify(Graph(tensors, nodes, ["input"], ["output"], name="demo"))


# ----------------------------------------------------------------------------------------------
# `mcuforge demo`: the whole job on this model, checked against TFLM

DEMO_INPUTS = 20


def run_demo(out_dir, inputs: int = DEMO_INPUTS) -> int:
    """Write the demo model, compile it to C, build with gcc, run it on random inputs and compare
    every output byte with tflite-micro. Returns the exit status (0 when bit-exact)."""
    from pathlib import Path

    from . import tflm
    from ..api import compile as compile_model
    from ..build import build, run_executable

    out = Path(out_dir)
    model = demo_tflite_bytes()
    result = compile_model(model, out, name="demo")
    (out / "demo.tflite").write_bytes(model)
    g = result.graph
    print(f"[1/4] demo model: {len(g.nodes)} int8 ops ({', '.join(sorted({n.op for n in g.nodes}))}), "
          f"{result.macs:,} MACs, written to {out / 'demo.tflite'}")
    print(f"[2/4] compiled to C in {out}/: arena {result.arena_bytes:,} bytes "
          f"(layer-wise lower bound {result.lower_bound_bytes:,}), weights {result.weight_bytes:,} bytes")
    exe = build(out, "demo")
    print(f"[3/4] built with gcc -std=c99 -Wall -Wextra -Werror -pedantic: {exe}")
    rng = np.random.default_rng(0)
    x = rng.integers(-128, 128, size=(inputs, *INPUT_SHAPE)).astype(np.int8)
    ours = run_executable(exe, g, [x])[0]
    if not tflm.available():
        print("[4/4] tflite-micro is not installed (pip install tflite-micro): cannot check")
        return 1
    ref = tflm.run(model, [x])[0]
    same = int(np.sum(ours == ref))
    print(f"[4/4] {inputs} random inputs: {same:,} of {ref.size:,} output bytes equal to "
          f"tflite-micro")
    if same == ref.size:
        print(f"PASS: bit-exact with TFLM; arena {result.arena_bytes:,} bytes")
        return 0
    print("FAIL: the generated C differs from TFLM")
    return 1
