"""The schedule stage on int8 ADD, MUL, AVERAGE_POOL_2D and MAX_POOL_2D
(codegen_c/kernels/eltwise.py): a scheduled kernel (mf_ew_add_s8 / mf_ew_mul_s8 /
mf_ew_avgpool_s8 / mf_ew_maxpool_s8 of runtime_c/mcuforge_ew.h) computes exactly what its
reference lowering computes, and the compiled C equals tflite-micro bit for bit.

Models are built with tests/tfl_build.py (the `tflite` package's builders): random scales and
zero points (input 2 the larger scale or the smaller, equal scales, power-of-two ratios that
make rounding ties), fused none/relu/relu6, element counts off the kernel's block of 4; pools
global (as KWS / VWW / ResNet-8 end) and windowed with SAME clipping, odd channel counts and a
window of more than 255 taps. Checks: the loop-IR evaluator (scheduled for the host and for a
DSP target == reference), host C == tflite-micro, emulated Cortex-M4 == tflite-micro."""
from __future__ import annotations

import numpy as np
import pytest

from mcuforge.codegen_c.evaluate import run_kernel
from mcuforge.codegen_c.kernels import lower_node
from mcuforge.codegen_c.lower import reference_kernel
from conftest import require_tflm, require_tools
from mcuforge.frontend.tflite import load_tflite
from mcuforge.ir.target import HOST, Target
from mcuforge import runner
from tfl_build import Model

M4 = Target("mps2-an386", "cortex-m4", frozenset({"dsp"}))
ACTS = {"none": 0, "relu": 1, "relu6": 3}
SAME, VALID = 0, 1


def add_model(seed, shape=(1, 5, 7, 3), act="none", ratio=None, equal=False, shape2=None,
              relu_zp=False, op="ADD"):
    """An int8 ADD (or MUL); ratio: input 2's scale = input 1's * ratio (a power of two: ties)."""
    rng = np.random.default_rng(seed)
    s1, s2, so = (float(v) for v in rng.uniform(0.01, 0.2, 3))
    if ratio is not None:
        s2, so = s1 * ratio, s1 * 2.0 ** int(rng.integers(-1, 2))
    if equal:
        s2 = s1
    z1, z2, zo = (int(v) for v in rng.integers(-128, 128, 3))
    if relu_zp:
        zo = -128
    m = Model()
    a = m.tensor("a", shape, "int8", scale=s1, zero_point=z1)
    b = m.tensor("b", shape2 or shape, "int8", scale=s2, zero_point=z2)
    y = m.tensor("y", shape, "int8", scale=so, zero_point=zo)
    m.op(op, [a, b], [y], "AddOptions" if op == "ADD" else "MulOptions",
         FusedActivationFunction=ACTS[act])
    m.io([a, b], [y])
    xa = rng.integers(-128, 128, (2, *shape)).astype(np.int8)
    xb = rng.integers(-128, 128, (2, *(shape2 or shape))).astype(np.int8)
    xb[1].reshape(-1)[:min(xb[1].size, 256)] = np.arange(-128, 128)[:xb[1].size]  # every byte
    return m.build(), {"a": xa, "b": xb}


def pool_model(seed, hw=(5, 7), c=3, f=None, stride=(1, 1), pad=VALID, act="none",
               op="AVERAGE_POOL_2D"):
    """An int8 AVERAGE_POOL_2D (or op); f None: the whole image (a global pool)."""
    rng = np.random.default_rng(seed)
    f = f or hw
    s, z = float(rng.uniform(0.01, 0.2)), int(rng.integers(-128, 128))

    def out(n, k, st):
        return -(-n // st) if pad == SAME else (n - k) // st + 1
    oshape = (1, out(hw[0], f[0], stride[0]), out(hw[1], f[1], stride[1]), c)
    m = Model()
    x = m.tensor("x", (1, *hw, c), "int8", scale=s, zero_point=z)
    y = m.tensor("y", oshape, "int8", scale=s, zero_point=z)
    m.op(op, [x], [y], "Pool2DOptions", Padding=pad, StrideH=stride[0],
         StrideW=stride[1], FilterHeight=f[0], FilterWidth=f[1],
         FusedActivationFunction=ACTS[act])
    m.io([x], [y])
    xs = rng.integers(-128, 128, (2, 1, *hw, c)).astype(np.int8)
    xs[1] = rng.choice([-128, 127], xs[1].shape)  # extreme sums: lanes near 16-bit limits
    return m.build(), {"x": xs}


def cases():
    out = []
    for i in range(9):
        rng = np.random.default_rng(300 + i)
        shape = (1, int(rng.integers(1, 6)), int(rng.integers(1, 6)), int(rng.integers(1, 9)))
        act = ("none", "relu", "relu6")[i % 3]
        kw = dict(shape=shape, act=act)
        if i % 3 == 1:
            kw["ratio"] = 2.0 ** -int(rng.integers(0, 3)) if i % 2 else 2.0
        out.append((f"add_{i}", "add", kw))
    out += [("add_equal", "add", dict(shape=(1, 4, 4, 5), equal=True, act="relu")),
            ("add_resnet", "add", dict(shape=(1, 8, 8, 16), act="relu", relu_zp=True)),
            ("add_tail", "add", dict(shape=(1, 1, 1, 7), act="relu", relu_zp=True)),
            ("add_broadcast", "add", dict(shape=(1, 3, 4, 5), shape2=(1, 1, 1, 5)))]
    out += [("mul" + name[3:], "add", {**kw, "op": "MUL"}) for name, _, kw in list(out)]
    out += [("pool_kws", "pool", dict(hw=(25, 5), c=64)),
            ("pool_resnet", "pool", dict(hw=(8, 8), c=20, act="relu")),
            ("pool_vww", "pool", dict(hw=(3, 3), c=37)),
            ("pool_big", "pool", dict(hw=(16, 17), c=9)),  # 272 taps: the 32-bit path
            ("pool_same", "pool", dict(hw=(7, 6), c=13, f=(3, 3), stride=(2, 2), pad=SAME,
                                       act="relu6")),
            ("pool_valid", "pool", dict(hw=(6, 9), c=8, f=(2, 3), stride=(2, 1))),
            ("pool_same1", "pool", dict(hw=(5, 5), c=4, f=(4, 2), stride=(1, 1), pad=SAME))]
    out += [("max_" + name, "pool", {**kw, "op": "MAX_POOL_2D"}) for name, _, kw in out
            if name.startswith("pool_")]
    return out


CASES = cases()
DECLINED = {"add_broadcast", "mul_broadcast"}


def tflm_run(model, inputs: dict) -> np.ndarray:
    """tflite-micro on each row (an arena large enough for activation-only models)."""
    from tflite_micro.python.tflite_micro import runtime
    it = runtime.Interpreter.from_bytes(model, arena_size=1 << 20)
    arrays = list(inputs.values())
    out = []
    for i in range(len(arrays[0])):
        for k, a in enumerate(arrays):
            it.set_input(a[i], k)
        it.invoke()
        out.append(np.array(it.get_output(0)))
    return np.stack(out)


def build(name, kind, kw):
    seed = sum(map(ord, name))
    return add_model(seed, **kw) if kind == "add" else pool_model(seed, **kw)


@pytest.mark.parametrize("name,kind,kw", CASES, ids=[c[0] for c in CASES])
def test_scheduled_kernel_equals_reference(name, kind, kw):
    model, inputs = build(name, kind, kw)
    g = load_tflite(model)
    node = g.nodes[0]
    ref = reference_kernel(node, g, "k")
    arrays = {p.name: inputs[g.tensors[t].name] for p, t in
              zip([b for b in ref.params if b.kind == "in"], node.inputs)}
    for row in range(2):
        ys = []
        for target in (None, HOST, M4):
            k = ref if target is None else lower_node(node, g, "k", target)
            if target is not None:
                assert (k.schedule == "") == (name in DECLINED), "the schedule should (not) apply"
            y = np.zeros(g.tensors[g.outputs[0]].size, np.int8)
            run_kernel(k, {**{n: a[row].reshape(-1).copy() for n, a in arrays.items()}, "y": y})
            ys.append(y)
        assert ys[1].tolist() == ys[0].tolist() and ys[2].tolist() == ys[0].tolist()


@pytest.mark.parametrize("name,kind,kw", CASES, ids=[c[0] for c in CASES])
def test_host_c_equals_tflm(name, kind, kw):
    require_tflm()
    model, inputs = build(name, kind, kw)
    want = tflm_run(model, inputs)
    got = runner.run(model, inputs if len(inputs) > 1 else next(iter(inputs.values())))
    np.testing.assert_array_equal(got, want)


M4_CASES = [c for c in CASES if c[0] in ("add_1", "add_2", "add_resnet", "add_tail", "mul_0",
                                          "mul_4",
                                          "pool_kws", "pool_big", "pool_same", "max_pool_same",
                                          "max_pool_vww")]


@pytest.mark.parametrize("name,kind,kw", M4_CASES, ids=[c[0] for c in M4_CASES])
def test_m4_dsp_equals_tflm(name, kind, kw):
    require_tflm()
    require_tools("arm-none-eabi-gcc", "qemu-system-arm")
    model, inputs = build(name, kind, kw)
    want = tflm_run(model, inputs)
    got = runner.run(model, inputs if len(inputs) > 1 else next(iter(inputs.values())),
                     board="mps2-an386")
    np.testing.assert_array_equal(got, want)


OTHER = [("mps2-an385", "qemu-system-arm"), ("mps2-an500", "qemu-system-arm"),
         ("mps3-an547", "qemu-system-arm"), ("riscv32-virt", "qemu-system-riscv32")]


@pytest.mark.parametrize("board,qemu", OTHER, ids=[b for b, _ in OTHER])
def test_other_cores_equal_tflm(board, qemu):
    """The portable bodies (Cortex-M3, RISC-V) and the DSP ones on the M7 and M55."""
    require_tflm()
    require_tools(qemu, "riscv64-unknown-elf-gcc" if "riscv" in board else "arm-none-eabi-gcc")
    for name in ("add_0", "mul_2", "pool_same", "max_pool_vww"):
        kind, kw = next((k, kw) for n, k, kw in CASES if n == name)
        model, inputs = build(name, kind, kw)
        got = runner.run(model, inputs if len(inputs) > 1 else next(iter(inputs.values())),
                         board=board)
        np.testing.assert_array_equal(got, tflm_run(model, inputs), err_msg=name)
