"""The schedule stage on int8 layers: a scheduled kernel (micro-kernel calls on packed weights,
codegen_c/kernels/) computes exactly what its reference lowering computes, and the compiled C
equals tflite-micro bit for bit.

Layers are random CONV_2D / FULLY_CONNECTED / DEPTHWISE_CONV_2D models built with
tests/tfl_build.py (the `tflite` package's builders, not mcuforge's writer): odd sizes, channel
counts off the kernels' blocks, strides, SAME/VALID, fused ReLU/ReLU6/none, random zero points,
per-channel and per-tensor weights. Checks:
1. the loop-IR evaluator: scheduled kernel for the host and for a DSP target == reference
   kernel on random inputs (scratch starts as noise);
2. the generated C on the host (its own kernels, runtime_c/mcuforge_vec.h) == tflite-micro;
3. a few layers on the emulated Cortex-M4 (DSP kernels) == tflite-micro.
"""
from __future__ import annotations

import numpy as np
import pytest

from mcuforge.codegen_c.evaluate import run_kernel
from mcuforge.codegen_c.kernels import lower_node
from mcuforge.codegen_c.lower import reference_kernel
from conftest import require_tflm, require_tools
from mcuforge.tools import tflm
from mcuforge.frontend.tflite import load_tflite
from mcuforge.ir.target import HOST, Target
from mcuforge import runner
from tfl_build import Model

M4 = Target("mps2-an386", "cortex-m4", frozenset({"dsp"}))
M55 = Target("mps3-an547", "cortex-m55", frozenset({"dsp", "mve"}))
ACTS = {"none": 0, "relu": 1, "relu6": 3}
SAME, VALID = 0, 1


def layer_model(seed: int, op: str, hw=(5, 6), c=3, o=5, k=(3, 3), stride=(1, 1),
                pad=SAME, act="none", per_channel=True, batch=1, dead=False, y_zp=None,
                mult=1, dilation=(1, 1)):
    """A one-layer int8 model; returns (model bytes, int8 input batch [2, ...]). `dead`: channel
    0 gets a huge bias and a weight scale so small that its output multiplier is ~2^-31 (a
    channel whose output is constant, as in trained models: VWW has such channels)."""
    rng = np.random.default_rng(seed)
    m = Model()
    sx, zx = float(rng.uniform(0.01, 0.05)), int(rng.integers(-128, 128))
    if op == "FULLY_CONNECTED":
        xshape, wshape = (batch, c), (o, c)
    elif op == "CONV_2D":
        xshape, wshape = (1, *hw, c), (o, *k, c)
    else:  # depthwise, depth multiplier `mult`
        o = c * mult
        xshape, wshape = (1, *hw, c), (1, *k, o)
    w = rng.integers(-127, 128, wshape)
    axis = 3 if op == "DEPTHWISE_CONV_2D" else 0
    if per_channel:
        sw = rng.uniform(0.002, 0.02, o)
    else:
        sw = np.full(1, rng.uniform(0.002, 0.02))
    b = rng.integers(-3000, 3000, o)
    sy, zy = float(rng.uniform(0.02, 0.2)), int(rng.integers(-128, 128))
    zy = zy if y_zp is None else y_zp
    if dead:
        sw[0] = sy * 2.0**-31 / sx * 1.7
        b[0] = 1_070_000_000
    if op == "FULLY_CONNECTED":
        yshape = (batch, o)
    else:
        def out(n, kk, s, d):
            return -(-n // s) if pad == SAME else (n - (kk - 1) * d - 1) // s + 1
        yshape = (1, out(hw[0], k[0], stride[0], dilation[0]),
                  out(hw[1], k[1], stride[1], dilation[1]), o)
    xi = m.tensor("x", xshape, "int8", scale=sx, zero_point=zx)
    wi = m.tensor("w", wshape, "int8", w, scale=sw if per_channel else float(sw[0]),
                  zero_point=np.zeros(len(sw), int) if per_channel else 0, axis=axis)
    bscale = sx * sw
    bi = m.tensor("b", (o,), "int32", b, scale=bscale if per_channel else float(bscale[0]),
                  zero_point=np.zeros(len(sw), int) if per_channel else 0)
    yi = m.tensor("y", yshape, "int8", scale=sy, zero_point=zy)
    if op == "FULLY_CONNECTED":
        m.op(op, [xi, wi, bi], [yi], "FullyConnectedOptions", FusedActivationFunction=ACTS[act])
    else:
        fields = dict(Padding=pad, StrideH=stride[0], StrideW=stride[1],
                      DilationHFactor=dilation[0], DilationWFactor=dilation[1],
                      FusedActivationFunction=ACTS[act])
        if op == "CONV_2D":
            m.op(op, [xi, wi, bi], [yi], "Conv2DOptions", **fields)
        else:
            m.op(op, [xi, wi, bi], [yi], "DepthwiseConv2DOptions", DepthMultiplier=mult,
                 **fields)
    m.io([xi], [yi])
    x = rng.integers(-128, 128, (2, *xshape)).astype(np.int8)
    return m.build(), x


def cases():
    out = []
    for i in range(10):
        rng = np.random.default_rng(100 + i)
        c, o = int(rng.integers(1, 19)), int(rng.integers(1, 14))
        act = ("none", "relu", "relu6")[i % 3]
        out.append((f"conv1x1_{i}", "CONV_2D", dict(hw=(int(rng.integers(1, 6)), 3), c=c, o=o,
                                                    k=(1, 1), act=act, per_channel=i % 4 != 3)))
        k = ((3, 3), (1, 1), (10, 4), (2, 3), (3, 1))[i % 5]
        out.append((f"conv_{i}", "CONV_2D", dict(
            hw=(int(rng.integers(k[0], k[0] + 5)), int(rng.integers(k[1], k[1] + 5))), c=c, o=o,
            k=k, stride=((1, 1), (2, 2), (2, 1))[i % 3], pad=(SAME, VALID)[i % 2], act=act)))
        out.append((f"fc_{i}", "FULLY_CONNECTED", dict(c=int(rng.integers(1, 70)), o=o, act=act,
                                                       per_channel=i % 2 == 0,
                                                       batch=1 + i % 3)))
    for i in range(8):
        rng = np.random.default_rng(200 + i)
        hw = (int(rng.integers(1, 9)), int(rng.integers(1, 9)))
        out.append((f"dw_{i}", "DEPTHWISE_CONV_2D", dict(
            hw=hw, c=int(rng.integers(1, 11)), stride=((1, 1), (2, 2))[i % 2],
            pad=(SAME, VALID)[(i // 2) % 2] if min(hw) >= 3 else SAME,
            act=("none", "relu", "relu6")[i % 3], per_channel=i != 5)))
    out.append(("dw_kws", "DEPTHWISE_CONV_2D", dict(hw=(25, 5), c=8, act="relu")))
    # one input channel, depth multiplier M: the convolution 1 -> M (micro_speech's first layer)
    out.append(("dw1_speech", "DEPTHWISE_CONV_2D", dict(hw=(49, 40), c=1, mult=8, k=(10, 8),
                                                        stride=(2, 2), act="relu")))
    out.append(("dw1_mult3", "DEPTHWISE_CONV_2D", dict(hw=(7, 6), c=1, mult=3, pad=VALID)))
    # ... through the row-paired kernel (mf_convrp_*: M a multiple of 4, fused ReLU)
    out.append(("dw1_rp", "DEPTHWISE_CONV_2D", dict(hw=(9, 8), c=1, mult=4, stride=(2, 2),
                                                    act="relu", y_zp=-128)))
    out.append(("dw_dead", "DEPTHWISE_CONV_2D", dict(hw=(6, 7), c=5, stride=(2, 2), dead=True)))
    # odd output widths (VWW's 3x3 tail, stride 2 to 3x3): the last column of each row alone
    out.append(("dw_odd3", "DEPTHWISE_CONV_2D", dict(hw=(3, 3), c=9, act="relu6")))
    out.append(("dw_odd_s2", "DEPTHWISE_CONV_2D", dict(hw=(6, 5), c=7, stride=(2, 2))))
    # widths a multiple of 4: four outputs per iteration
    out.append(("dw_quad", "DEPTHWISE_CONV_2D", dict(hw=(3, 8), c=6, act="relu6")))
    out.append(("dw_quad_s2", "DEPTHWISE_CONV_2D", dict(hw=(5, 17), c=5, stride=(2, 2),
                                                        pad=VALID)))
    # a small image with more channels than one pass of the scratch holds (passes of cg > 4)
    out.append(("dw_wide", "DEPTHWISE_CONV_2D", dict(hw=(5, 6), c=70, act="relu")))
    out.append(("conv1x1_dead", "CONV_2D", dict(hw=(3, 3), c=16, o=6, k=(1, 1), dead=True)))
    out.append(("conv_dead", "CONV_2D", dict(hw=(5, 5), c=3, o=5, k=(3, 3), act="relu",
                                             dead=True)))
    out.append(("fc_dead", "FULLY_CONNECTED", dict(c=40, o=7, dead=True)))
    # TFLite's fused ReLU (output zero point -128: the clamp is the int8 range), the shapes of
    # the entries specialised on K (mf_*_w16_g<G>): VWW's small-K 1x1s, first layers on RGB
    # and KWS's 10x4 on one channel, with and without the sign term
    for name, op, kw in (("g_1x1_k8", "CONV_2D", dict(hw=(5, 7), c=8, o=16, k=(1, 1))),
                         ("g_1x1_k30", "CONV_2D", dict(hw=(3, 3), c=30, o=10, k=(1, 1))),
                         # strided 1x1 (ResNet-8's shortcuts): GEMM rows over every 2nd pixel
                         ("g_1x1_s2", "CONV_2D", dict(hw=(7, 9), c=16, o=8, k=(1, 1),
                                                      stride=(2, 2))),
                         ("g_1x1_s21", "CONV_2D", dict(hw=(6, 5), c=5, o=6, k=(1, 1),
                                                       stride=(2, 1), pad=VALID)),
                         # kernel rows paired (mf_convrp_*: stride_w * in_c even; mf_convrp2_*:
                         # odd, "_rp2_"), O % 4 == 0
                         ("g_rp_rgb_s2", "CONV_2D", dict(hw=(9, 8), c=3, o=8, stride=(2, 2))),
                         ("g_rp_kws", "CONV_2D", dict(hw=(13, 6), c=1, o=12, k=(10, 4),
                                                      stride=(2, 2))),
                         ("g_rp_c2_s1", "CONV_2D", dict(hw=(7, 9), c=2, o=4, k=(3, 2),
                                                        pad=VALID)),
                         # O not a multiple of 4: im2col
                         ("g_im2col_rgb_s2", "CONV_2D", dict(hw=(9, 8), c=3, o=6,
                                                             stride=(2, 2))),
                         ("g_rp2_rgb_s1", "CONV_2D", dict(hw=(6, 7), c=3, o=16, pad=VALID)),
                         ("g_im2col_kws", "CONV_2D", dict(hw=(13, 6), c=1, o=10, k=(10, 4),
                                                          stride=(2, 2))),
                         ("g_rp2_kws_s1", "CONV_2D", dict(hw=(12, 5), c=1, o=12, k=(10, 4))),
                         ("g_rp2_rgb_s12", "CONV_2D", dict(hw=(7, 9), c=3, o=8, stride=(2, 1))),
                         # whole groups per kernel row, stride 2: im2col (mf_conv_*)
                         ("g_im2col_s2", "CONV_2D", dict(hw=(9, 7), c=6, o=12, stride=(2, 2))),
                         ("g_quads_s2", "CONV_2D", dict(hw=(9, 7), c=4, o=12, stride=(2, 2))),
                         ("g_c16_s1", "CONV_2D", dict(hw=(5, 6), c=6, o=8, k=(2, 2))),
                         ("g_fc", "FULLY_CONNECTED", dict(c=64, o=12, batch=2)),
                         # O odd, one row: mf_gemm2_w16 does not apply, the _g<G> entries do
                         ("g_1x1_k12_o15", "CONV_2D", dict(hw=(5, 7), c=12, o=15, k=(1, 1))),
                         ("g_fc_batch1", "FULLY_CONNECTED", dict(c=64, o=12, batch=1)),
                         # mf_gemm2_w16: K beyond 8 groups (TBB entry 0 and 3), odd rows,
                         # strided rows of odd count
                         ("g2_1x1_k8_s2", "CONV_2D", dict(hw=(5, 7), c=8, o=5, k=(1, 1),
                                                          stride=(2, 2))),
                         ("g2_1x1_k128", "CONV_2D", dict(hw=(3, 3), c=128, o=6, k=(1, 1))),
                         ("g2_1x1_k100_s2", "CONV_2D", dict(hw=(5, 5), c=100, o=4, k=(1, 1),
                                                            stride=(2, 2)))):
        out.append((name + "_relu", op, dict(kw, act="relu", y_zp=-128)))
        out.append((name + "_none", op, dict(kw, act="none")))
    return out


CASES = cases()


def scheduled_and_reference(name: str, op: str, target: Target, **kw) -> tuple:
    """(the kernel the schedule stage gives case `name`'s layer on `target`, its output, the
    reference kernel, its output): both run by the loop-IR evaluator on the case's first
    input."""
    model, x = layer_model(sum(map(ord, name)), op, **kw)
    g = load_tflite(model)
    node = g.nodes[0]
    out = []
    for k in (lower_node(node, g, "k", target), reference_kernel(node, g, "k")):
        y = np.zeros(g.tensors[g.outputs[0]].size, np.int8)
        run_kernel(k, {"x": x[0].reshape(-1).copy(), "y": y})
        out += [k, y]
    return tuple(out)


@pytest.mark.parametrize("name,op,kw", CASES, ids=[c[0] for c in CASES])
def test_scheduled_kernel_equals_reference(name, op, kw):
    model, x = layer_model(sum(map(ord, name)), op, **kw)
    g = load_tflite(model)
    node = g.nodes[0]
    ref = reference_kernel(node, g, "k")
    ys = []
    for target in (None, HOST, M4):
        k = ref if target is None else lower_node(node, g, "k", target)
        if target is not None:
            assert k is not ref and k.scratch, "the schedule should apply"
        # 2 channels x 2 rows where O is even and a call has 2+ rows (clamp = int8 range)
        pair2 = "1x1" in name and "o15" not in name or "fc" in name and "batch1" not in name
        if target is M4 and (name.startswith("g_rp") or name == "dw1_rp"):  # signfix 1 (some
            # "_none"): im2col
            assert k.schedule.startswith(f"mf_convrp{'2' if '_rp2_' in name else ''}_w16_n") or (
                name.endswith("_none") and k.schedule.startswith("mf_conv_")), k.schedule
        elif target is M4 and "k8" in name and "o15" not in name:  # K = 8: a row in registers
            assert k.schedule.startswith("mf_gemm1k8_w16_s"), k.schedule
        elif target is M4 and (name.startswith("g2_") or name.startswith("g_") and pair2):
            assert k.schedule.startswith("mf_gemm2_w16_s"), k.schedule
        elif target is M4 and name.startswith("g_"):
            assert "_w16_g" in k.schedule, k.schedule  # the K-specialised entry
            assert k.schedule.startswith("mf_gemm") == ("1x1" in name or "fc" in name)
            assert k.schedule.startswith("mf_conv_") == ("im2col" in name), k.schedule
        y = np.zeros(g.tensors[g.outputs[0]].size, np.int8)
        run_kernel(k, {"x": x[0].reshape(-1).copy(), "y": y})
        ys.append(y)
    assert ys[1].tolist() == ys[0].tolist() and ys[2].tolist() == ys[0].tolist()


@pytest.mark.parametrize("name,op,kw", CASES, ids=[c[0] for c in CASES])
def test_mve_scheduled_kernel_equals_reference(name, op, kw):
    """Helium targets: convolutions, fully connected layers and one-channel depthwise layers on
    mf_mve_gemm / mf_mve_conv (runtime_c/mcuforge_mve.h), equal to the reference kernel."""
    model, x = layer_model(sum(map(ord, name)), op, **kw)
    g = load_tflite(model)
    node = g.nodes[0]
    ref = reference_kernel(node, g, "k")
    k = lower_node(node, g, "k", M55)
    gemm_shaped = op != "DEPTHWISE_CONV_2D" or name.startswith("dw1_")
    if gemm_shaped and kw.get("dilation", (1, 1)) == (1, 1):
        pointwise = op == "FULLY_CONNECTED" or kw.get("k") == (1, 1) and kw.get("pad") != VALID
        fast = k.schedule == "mf_mve_gemm_k32"  # 1x1, K <= 32, flags 0, upper clamp 127
        kind = "mf_mve_gemm" if fast else k.schedule[:-3]
        assert kind == ("mf_mve_gemm" if pointwise and op == "CONV_2D" and kw.get(
            "stride", (1, 1)) == (1, 1) or op == "FULLY_CONNECTED" else kind)
        assert kind in ("mf_mve_gemm", "mf_mve_conv") and (fast or k.schedule[-3:-1] == "_f"), \
            k.schedule
    ys = []
    for kern in (ref, k):
        y = np.zeros(g.tensors[g.outputs[0]].size, np.int8)
        run_kernel(kern, {"x": x[0].reshape(-1).copy(), "y": y})
        ys.append(y)
    assert ys[1].tolist() == ys[0].tolist()


@pytest.mark.parametrize("name,op,kw", CASES, ids=[c[0] for c in CASES])
def test_host_c_equals_tflm(name, op, kw):
    require_tflm()
    model, x = layer_model(sum(map(ord, name)), op, **kw)
    want = tflm.run(model, [x])[0]
    got = runner.run(model, x)
    np.testing.assert_array_equal(got, want)


M4_CASES = list({c[0]: c for c in (
    CASES[::4] + [c for c in CASES if c[0].startswith("dw_")][::2]
    + [c for c in CASES if c[0].startswith(("dw_odd", "dw_quad", "dw_wide"))]
    + [c for c in CASES if c[0].endswith("_dead")]
    + [c for c in CASES if c[0].startswith(("g_", "g2_"))]
    + [c for c in CASES if c[0].startswith("dw1_")]
)}.values())  # each case once


@pytest.mark.parametrize("name,op,kw", M4_CASES, ids=[c[0] for c in M4_CASES])
def test_m4_dsp_equals_tflm(name, op, kw):
    require_tflm()
    require_tools("arm-none-eabi-gcc", "qemu-system-arm")
    model, x = layer_model(sum(map(ord, name)), op, **kw)
    want = tflm.run(model, [x])[0]
    got = runner.run(model, x, board="mps2-an386")
    np.testing.assert_array_equal(got, want)


def test_bias_scales_on_the_weights_axis_are_read_per_channel():
    """Older TFLite converters (tflite-micro's person_detect) wrote the weights' quantized
    dimension, 3, onto the 1-D per-channel bias; TFLM reads the bias scales by channel. The
    model loads and runs as tflite-micro runs it."""
    require_tflm()
    rng = np.random.default_rng(9)
    m = Model()
    c, o = 3, 8
    sw = rng.uniform(0.002, 0.02, o)
    xi = m.tensor("x", (1, 5, 5, c), "int8", scale=0.02, zero_point=-1)
    wi = m.tensor("w", (o, 3, 3, 1 * c), "int8", rng.integers(-127, 128, (o, 3, 3, c)),
                  scale=sw, zero_point=np.zeros(o, int), axis=0)
    bi = m.tensor("b", (o,), "int32", rng.integers(-2000, 2000, o), scale=0.02 * sw,
                  zero_point=np.zeros(o, int), axis=3)
    yi = m.tensor("y", (1, 5, 5, o), "int8", scale=0.05, zero_point=3)
    m.op("CONV_2D", [xi, wi, bi], [yi], "Conv2DOptions", Padding=SAME, StrideH=1, StrideW=1,
         DilationHFactor=1, DilationWFactor=1, FusedActivationFunction=1)
    m.io([xi], [yi])
    model = m.build()
    x = rng.integers(-128, 128, (2, 1, 5, 5, c)).astype(np.int8)
    np.testing.assert_array_equal(runner.run(model, x), tflm.run(model, [x])[0])


def test_tables_are_8_aligned_in_firmware(tmp_path, monkeypatch):
    """The micro-kernels load packed weights with LDRD/LDM, which fault on a misaligned address:
    every constant table of the generated model sits on an 8-byte boundary in the linked
    firmware, at -Os too (where gcc packs arrays tightest)."""
    import subprocess

    from conftest import mlperf_model
    from mcuforge.board import load_board
    from mcuforge.target import build_firmware
    require_tools("arm-none-eabi-gcc")
    monkeypatch.setenv("MCUFORGE_OPT", "-Os")
    g = load_tflite(mlperf_model("kws_ref_model").read_bytes())
    x = np.zeros(g.tensors[g.inputs[0]].shape, np.int8)
    _, elf, _ = build_firmware(mlperf_model("kws_ref_model"), load_board("mps2-an386"), [[x]],
                               tmp_path / "fw")
    out = subprocess.run(["arm-none-eabi-nm", str(elf)], capture_output=True, text=True,
                         check=True).stdout
    tables = [(int(a, 16), n) for a, t, n in (ln.split() for ln in out.splitlines()
                                               if len(ln.split()) == 3)
              if n.startswith("l") and n.rsplit("_", 1)[-1] in ("w", "pk", "rq", "bias", "geom")]
    assert len(tables) > 15  # (mf_gemm2_w16 layers have one table: w)
    assert [n for a, n in tables if a % 8] == []
