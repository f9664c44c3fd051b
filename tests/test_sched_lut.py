"""The table schedule of 8-bit unary layers (codegen_c/kernels/lut.py): y = lut[x], the table
computed at compile time by running the reference kernel on all 256 input values.

One-operator models built with tests/tfl_build.py (the `tflite` package's builders) on random
quantization parameters (each op's TFLM constraints kept: logistic out 1/256 zp -128, tanh out
1/128 zp 0, relu6 / quantize / abs as TFLM accepts them). Checks:
1. the loop-IR evaluator: the scheduled kernel (host and DSP targets) == the reference kernel on
   every input byte (the input holds all 256 values, then random ones);
2. the generated C on the host == tflite-micro, and on the emulated Cortex-M4 and M3 for a few;
3. tflite-micro's DTLN example (its last layer a 257-element logistic) on the M4 == tflite-micro;
4. where the table does not pay (few elements) the reference stays.
"""
from __future__ import annotations

import os

import numpy as np
import pytest

from mcuforge.codegen_c.evaluate import run_kernel
from mcuforge.codegen_c.kernels import lower_node
from mcuforge.codegen_c.lower import reference_kernel
from conftest import require_tflm, require_tools
from mcuforge.frontend.tflite import load_tflite
from mcuforge.ir.target import HOST, Target
from mcuforge import runner
from mcuforge.tools import tflm
from tfl_build import Model

M4 = Target("mps2-an386", "cortex-m4", frozenset({"dsp"}))
N = 300  # elements: every byte once, then random ones


def unary_model(op, seed, n=N):
    rng = np.random.default_rng(seed)
    si, zi = float(rng.uniform(0.005, 0.2)), int(rng.integers(-128, 128))
    so, zo = float(rng.uniform(0.005, 0.2)), int(rng.integers(-128, 128))
    options, fields = None, {}
    if op == "LOGISTIC":
        so, zo = 1 / 256, -128
    elif op == "TANH":
        so, zo = 1 / 128, 0
    elif op in ("RELU6", "ABS"):
        so, zo = si, zi if op == "RELU6" else zo
    elif op == "LEAKY_RELU":
        options, fields = "LeakyReluOptions", dict(Alpha=float(rng.uniform(-1.5, 1.5)))
    m = Model()
    x = m.tensor("x", (1, n), "int8", scale=si, zero_point=zi)
    y = m.tensor("y", (1, n), "int8", scale=so, zero_point=zo)
    m.op(op, [x], [y], options, **fields)
    m.io([x], [y])
    xs = rng.integers(-128, 128, (3, 1, n)).astype(np.int8)
    xs[:, 0, :min(n, 256)] = np.arange(-128, 128)[:n]
    return m.build(), xs


def const_binary_model(op, seed, n=N, channels=None):
    """x (op) c with c an int8 constant: a scalar, or per channel (channels: [1, n / c, c])."""
    rng = np.random.default_rng(seed)
    si, zi = float(rng.uniform(0.005, 0.2)), int(rng.integers(-128, 128))
    sc, zc = float(rng.uniform(0.005, 0.2)), int(rng.integers(-128, 128))
    so, zo = float(rng.uniform(0.01, 0.3)), int(rng.integers(-128, 128))
    shape = (1, n) if channels is None else (1, n // channels, channels)
    cshape = (1,) if channels is None else (channels,)
    m = Model()
    x = m.tensor("x", shape, "int8", scale=si, zero_point=zi)
    c = m.tensor("c", cshape, "int8", rng.integers(-128, 128, cshape), scale=sc, zero_point=zc)
    y = m.tensor("y", shape, "int8", scale=so, zero_point=zo)
    opts = {"ADD": "AddOptions", "MUL": "MulOptions", "SUB": "SubOptions"}[op]
    m.op(op, [x, c], [y], opts)
    m.io([x], [y])
    xs = rng.integers(-128, 128, (3, *shape)).astype(np.int8)
    xs.reshape(3, -1)[:, :min(n, 256)] = np.arange(-128, 128)[:n]
    return m.build(), xs


BINARY = [(op, seed) for op in ("ADD", "MUL", "SUB") for seed in range(2)]


@pytest.mark.parametrize("op,seed", BINARY, ids=[f"{o}_{s}" for o, s in BINARY])
def test_binary_with_a_constant_scalar(op, seed):
    """Tabulated: == the reference kernel on every byte, and the host C == tflite-micro. With a
    per-channel constant the value depends on more than the byte: the reference stays."""
    model, xs = const_binary_model(op, 31 * seed + len(op))
    g = load_tflite(model)
    node = g.nodes[0]
    ref = reference_kernel(node, g, "k")
    outs = []
    for target in (None, HOST, M4):
        k = ref if target is None else lower_node(node, g, "k", target)
        if target is not None:
            assert k.schedule == "mf_ew_lut8"
        y = np.zeros(N, np.int8)
        run_kernel(k, {"x": xs[0].reshape(-1).copy(), "y": y})
        outs.append(y.tolist())
    assert outs[1] == outs[0] and outs[2] == outs[0]
    per_channel, _ = const_binary_model(op, seed, n=N, channels=4)
    g2 = load_tflite(per_channel)
    assert lower_node(g2.nodes[0], g2, "k", M4).schedule == ""
    require_tflm()
    np.testing.assert_array_equal(runner.run(model, xs), tflm.run(model, [xs])[0])


OPS = ("LOGISTIC", "TANH", "HARD_SWISH", "LEAKY_RELU", "RELU", "RELU6", "QUANTIZE", "ABS")
CASES = [(op, seed) for op in OPS for seed in range(3)]


@pytest.mark.parametrize("op,seed", CASES, ids=[f"{o}_{s}" for o, s in CASES])
def test_table_equals_reference_kernel_on_every_byte(op, seed):
    model, xs = unary_model(op, 17 * seed + len(op))
    g = load_tflite(model)
    node = g.nodes[0]
    ref = reference_kernel(node, g, "k")
    outs = []
    for target in (None, HOST, M4):
        k = ref if target is None else lower_node(node, g, "k", target)
        if target is not None:
            assert k.schedule == "mf_ew_lut8", "the table should serve this layer"
        y = np.zeros(N, np.int8)
        run_kernel(k, {"x": xs[0].reshape(-1).copy(), "y": y})
        outs.append(y.tolist())
    assert outs[1] == outs[0] and outs[2] == outs[0]


@pytest.mark.parametrize("op,seed", CASES, ids=[f"{o}_{s}" for o, s in CASES])
def test_host_c_equals_tflm(op, seed):
    require_tflm()
    model, xs = unary_model(op, 17 * seed + len(op))
    np.testing.assert_array_equal(runner.run(model, xs), tflm.run(model, [xs])[0])


@pytest.mark.parametrize("board", ["mps2-an386", "mps2-an385"])
def test_arm_equals_tflm(board):
    require_tflm()
    require_tools("arm-none-eabi-gcc", "qemu-system-arm")
    for op in ("LOGISTIC", "HARD_SWISH", "LEAKY_RELU"):
        model, xs = unary_model(op, 5)
        np.testing.assert_array_equal(runner.run(model, xs, board=board),
                                      tflm.run(model, [xs])[0], err_msg=op)


def test_small_layers_keep_the_reference():
    """Four relu elements: the loop costs less than the table's flash."""
    model, _ = unary_model("RELU", 1, n=4)
    g = load_tflite(model)
    assert lower_node(g.nodes[0], g, "k", M4).schedule == ""


DTLN = "/tmp/ys/pinned/tflite-micro/tensorflow/lite/micro/examples/dtln/" \
    "dtln_noise_suppression.tflite"


def test_dtln_on_m4_equals_tflm():
    require_tflm()
    require_tools("arm-none-eabi-gcc", "qemu-system-arm")
    path = os.environ.get("MCUFORGE_DTLN", DTLN)
    if not os.path.exists(path):
        pytest.skip(f"{path} not present")
    model = open(path, "rb").read()
    g = load_tflite(model)
    assert any(lower_node(n, g, "k", M4).schedule == "mf_ew_lut8" for n in g.nodes
               if n.op == "logistic")
    t = g.tensors[g.inputs[0]]
    x = np.random.default_rng(4).integers(-128, 128, (2, *t.shape)).astype(t.dtype)
    np.testing.assert_array_equal(runner.run(model, x, board="mps2-an386"),
                                  tflm.run(model, [x])[0])
