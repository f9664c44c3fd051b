"""QUANTIZE int16 -> int8 on mf_seq_quantize_s16_s8 (codegen_c/kernels/requant.py): the fast
requantization equals the reference lowering (lower/q_int16.py) on every int16 value, and the
compiled C equals tflite-micro.

One-operator models from tests/tfl_build.py: random scale ratios (multipliers with negative and
positive shifts), power-of-two ratios (rounding ties), output zero points across int8 (with
-128 the sign term is not needed: lo >= zp), input zero point 0 and not. Checks: the loop-IR
evaluator (scheduled for the host and for the M4 == reference) on all 65536 int16 values; host
C, Cortex-M4 and Cortex-M3 == tflite-micro on the extremes, ties and random values."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from mcuforge.codegen_c import loop_ir as ir

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
N = 96


def quantize_model(seed, ratio=None, zo=None, zi=0):
    rng = np.random.default_rng(seed)
    si = float(rng.uniform(1e-4, 1e-2))
    so = si / (ratio if ratio is not None else float(rng.uniform(0.002, 4.0)))
    zo = int(rng.integers(-128, 128)) if zo is None else zo
    m = Model()
    x = m.tensor("x", (1, N), "int16", scale=si, zero_point=zi)
    y = m.tensor("y", (1, N), "int8", scale=so, zero_point=zo)
    m.op("QUANTIZE", [x], [y])
    m.io([x], [y])
    xs = rng.integers(-32768, 32768, (4, 1, N)).astype(np.int16)
    xs[0, 0, :8] = [-32768, 32767, -1, 0, 1, -32767, 32766, 2]
    if ratio is not None:  # odd multiples of half an output step: ties
        step = int(round(1 / ratio))
        xs[1, 0] = np.clip((np.arange(N) - N // 2) * step + step // 2, -32768, 32767)
    return m.build(), xs


CASES = [("random_0", dict()), ("random_1", dict(zo=-128)), ("random_2", dict(zo=127)),
         ("tie_quarter", dict(ratio=0.25, zo=3)), ("tie_256", dict(ratio=1 / 256, zo=-128)),
         ("tie_2", dict(ratio=2.0, zo=-5)), ("zero_point_in", dict(zi=-300, zo=10))]


def _build(name, kw):
    return quantize_model(sum(map(ord, name)), **kw)


@pytest.mark.parametrize("name,kw", CASES, ids=[c[0] for c in CASES])
def test_scheduled_equals_reference_on_every_int16(name, kw):
    model, _ = _build(name, kw)
    g = load_tflite(model)
    node = g.nodes[0]
    ref = reference_kernel(node, g, "k")
    x = np.arange(-32768, 32768).astype(np.int16)
    outs = []
    for target in (None, HOST, M4):
        k = ref if target is None else lower_node(node, g, "k", target)
        if target is not None:
            assert k.schedule == "mf_seq_quantize_s16_s8"
        y = np.zeros(x.size, np.int8)
        big = replace(k, buffers=tuple(replace(b, size=x.size) if b.kind in ("in", "out") else b
                                       for b in k.buffers),
                      body=_resize(k.body, N, x.size))
        run_kernel(big, {"x": x.copy(), "y": y})
        outs.append(y.tolist())
    assert outs[1] == outs[0] and outs[2] == outs[0]


def _resize(body, n, size):
    """The kernel's body over `size` elements instead of n (its loop extent or call count)."""
    out = []
    for s in body:
        if isinstance(s, ir.Loop) and s.extent == n:
            s = replace(s, extent=size)
        elif isinstance(s, ir.CallStmt):
            s = replace(s, args=tuple(ir.Const(size) if a == ir.Const(n) else a for a in s.args))
        out.append(s)
    return tuple(out)


@pytest.mark.parametrize("name,kw", CASES, ids=[c[0] for c in CASES])
def test_host_c_equals_tflm(name, kw):
    require_tflm()
    model, xs = _build(name, kw)
    np.testing.assert_array_equal(runner.run(model, xs), tflm.run(model, [xs])[0])


@pytest.mark.parametrize("board", ["mps2-an386", "mps2-an385"])
def test_arm_equals_tflm(board):
    require_tflm()
    require_tools("arm-none-eabi-gcc", "qemu-system-arm")
    for name, kw in CASES[::2]:
        model, xs = _build(name, kw)
        np.testing.assert_array_equal(runner.run(model, xs, board=board),
                                      tflm.run(model, [xs])[0], err_msg=name)
