"""--memory-priority (optimizer/patch.py): the first layers computed in bands of rows.

Random conv chains (odd sizes, stride 2, SAME / VALID, kernels 1..5, depthwise, pooling, a
residual ADD) are built with tests/tfl_build.py (the `tflite` package's builders), patched at
every stage length into several band counts, compiled to C and run: int8 bit-exact with
tflite-micro, float within tolerance of LiteRT's reference kernels. The MLPerf ResNet-8 and VWW
with --memory-priority are bit-exact with tflite-micro on the host and on QEMU; the plan
checker proves the bands' placement and rejects a band put elsewhere; the arena shrinks where a
stage pays, measured on the plan the C addresses.
"""
import math
from pathlib import Path

import numpy as np
import pytest
import tflite

from conftest import mlperf_model, require_tflm, require_tools
from tfl_build import Model, litert
from mcuforge.api import generate_project, load, write_files
from mcuforge.build import build, run_executable
from mcuforge.ir.graph import Tensor, is_alias
from mcuforge.optimizer import patch
from mcuforge.optimizer.memory_plan import plan_graph
from mcuforge.optimizer.pipeline import optimize
from mcuforge.optimizer.plan_check import PlanError, check_plan


def _out(n, k, s, same):
    return -(-n // s) if same else (n - k) // s + 1


def chain_model(rng, dtype: str) -> bytes:
    """A random NHWC chain: 3..6 layers of conv / depthwise / max / avg pool / residual add."""
    h, w, c = int(rng.integers(4, 11)) * 2 + 1, int(rng.integers(3, 10)) * 2 + 1, \
        int(rng.integers(1, 5))
    q = dtype == "int8"
    m = Model()
    scale, zp = 0.05, int(rng.integers(-20, 20))
    cur = m.tensor("x", (1, h, w, c), dtype, **(dict(scale=scale, zero_point=zp) if q else {}))
    x = cur
    kinds = ["conv", "dw", "max", "avg", "add", "conv"]
    for i in range(int(rng.integers(3, 7))):
        kind = str(rng.choice(kinds))
        if kind == "add" and not (h >= 3 and w >= 3):
            kind = "conv"
        k = int(rng.integers(1, 6))
        stride = int(rng.choice([1, 2])) if kind != "add" else 1
        same = bool(rng.integers(0, 2)) or kind == "add"
        k = 3 if kind == "add" else min(k, h, w) if not same else k
        if kind in ("max", "avg"):
            k = max(2, min(k, 3, h, w)) if not same else max(2, min(k, 3))
        oh, ow = _out(h, k, stride, same), _out(w, k, stride, same)
        if oh < 1 or ow < 1:
            continue
        act = int(rng.choice([tflite.ActivationFunctionType.NONE,
                              tflite.ActivationFunctionType.RELU]))
        pad = tflite.Padding.SAME if same else tflite.Padding.VALID
        if kind in ("conv", "dw", "add"):
            o = int(rng.integers(2, 7)) if kind != "dw" else c
            if kind == "add":
                o = c
            taps = k * k * (c if kind != "dw" else 1)
            if q:
                sw = rng.uniform(0.002, 0.01, o).astype(np.float32)
                wdata = rng.integers(-127, 128, (o, k, k, c) if kind != "dw" else (1, k, k, o))
                bias = rng.integers(-2000, 2000, o).astype(np.int32)
                sy, zy = scale * 0.24 * math.sqrt(taps), int(rng.integers(-10, 10))
                if act == tflite.ActivationFunctionType.RELU:
                    zy = -128
                wq = dict(scale=sw.tolist(), zero_point=[0] * o, axis=0 if kind != "dw" else 3)
                wi = m.tensor(f"w{i}", wdata.shape, "int8", data=wdata, **wq)
                bi = m.tensor(f"b{i}", (o,), "int32", data=bias,
                              scale=(np.float32(scale) * sw).tolist(), zero_point=[0] * o)
                yq = dict(scale=float(sy), zero_point=zy)
            else:
                shape = (o, k, k, c) if kind != "dw" else (1, k, k, o)
                wi = m.tensor(f"w{i}", shape, "float32",
                              data=rng.standard_normal(shape) / math.sqrt(taps))
                bi = m.tensor(f"b{i}", (o,), "float32", data=rng.standard_normal(o) * 0.1)
                yq = {}
            y = m.tensor(f"y{i}", (1, oh, ow, o), dtype, **yq)
            if kind == "dw":
                m.op("DEPTHWISE_CONV_2D", [cur, wi, bi], [y], "DepthwiseConv2DOptions",
                     Padding=pad, StrideW=stride, StrideH=stride, DepthMultiplier=1,
                     FusedActivationFunction=act, DilationWFactor=1, DilationHFactor=1)
            else:
                m.op("CONV_2D", [cur, wi, bi], [y], "Conv2DOptions", Padding=pad,
                     StrideW=stride, StrideH=stride, FusedActivationFunction=act,
                     DilationWFactor=1, DilationHFactor=1)
            if kind == "add":  # a residual: x + conv(x)
                zq = dict(scale=float(max(scale, yq.get("scale", 1.0)) * 1.5),
                          zero_point=int(rng.integers(-5, 5))) if q else {}
                z = m.tensor(f"z{i}", (1, oh, ow, o), dtype, **zq)
                m.op("ADD", [cur, y], [z], "AddOptions",
                     FusedActivationFunction=tflite.ActivationFunctionType.NONE)
                y, yq = z, zq
        else:
            y = m.tensor(f"y{i}", (1, oh, ow, c), dtype,
                         **(dict(scale=scale, zero_point=zp) if q else {}))
            yq = dict(scale=scale, zero_point=zp) if q else {}
            m.op("MAX_POOL_2D" if kind == "max" else "AVERAGE_POOL_2D", [cur], [y],
                 "Pool2DOptions", Padding=pad, StrideW=stride, StrideH=stride, FilterWidth=k,
                 FilterHeight=k, FusedActivationFunction=act)
        cur, h, w, c = y, oh, ow, (c if kind in ("max", "avg") else o)
        if q:
            scale = yq["scale"]
            zp = yq.get("zero_point", zp)
    m.io([x], [cur])
    return m.build()


def run_c(g, tmp: Path, x: np.ndarray) -> tuple:
    """The graph compiled as it is (no --memory-priority choice) and run; (outputs, plan,
    compiled graph, the kernels' in-place declarations)."""
    files, plan, model, compiled = generate_project(g, "model")
    write_files(tmp, files)
    return (run_executable(build(tmp, "model"), compiled, [x])[0], plan, model.graph,
            model.declared)  # (model.graph: the nodes in the order planned)


def candidates(g) -> list:
    """Every stage length with 2 bands, 3 bands and one band per output row, the halos
    recomputed and reused; reused with the halo copies after every reader in 2 bands, after
    the strided readers in one band per row; the band windows on the reference loops
    (lean="bare") in 2 bands reused and 3 recomputed."""
    out = []
    for k in patch.stage_lengths(g):
        rows = g.tensors[g.nodes[k - 1].outputs[0]].shape[1] if k else 0
        for count in sorted({2, 3, rows}):
            if 2 <= count <= rows:
                out += [(k, count, False, "", ""), (k, count, True, "", "")]
        out += [(k, 2, True, "all", ""), (k, rows, True, "strided", ""),
                (k, 2, True, "all", "bare")] if rows >= 2 else []
        out += [(k, 3, False, "", "bare")] if rows >= 3 else []
    return out


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("dtype", ["int8", "float32"])
def test_random_chains_patched_equal_the_reference(dtype, seed, tmp_path):
    if dtype == "int8":
        require_tflm()
    rng = np.random.default_rng(1000 + seed)
    model = chain_model(rng, dtype)
    g = optimize(load(model))
    t = g.tensors[g.inputs[0]]
    if dtype == "int8":
        from mcuforge.tools import tflm
        x = rng.integers(-128, 128, (3, *t.shape)).astype(np.int8)
        want = tflm.run(model, [x])[0]
    else:
        x = rng.standard_normal((3, *t.shape)).astype(np.float32)
        want = np.stack([litert(model, [xi])[0] for xi in x])
    tried = 0
    for i, (k, count, reuse, late, lean) in enumerate(candidates(g)):
        if late == "strided" and not any(n.op in patch.WINDOW_OPS and n.attrs["stride"][0] > 1
                                         for n in g.nodes[:k]):
            continue  # no strided reader: the same graph as late=""
        try:
            h = patch.patch_stage(g, k, count, reuse, late, lean)
        except patch.NotPatchable:
            continue
        y, plan, compiled, declared = run_c(h, tmp_path / f"c{i}", x)
        assert any(n.op == "concat" and is_alias(n) for n in compiled.nodes)  # still banded
        check_plan(compiled, plan, declared=declared)
        if dtype == "int8":
            assert np.array_equal(y, want), (k, count, reuse, late, lean)
        else:
            np.testing.assert_allclose(y, want, rtol=1e-4, atol=1e-4 * np.abs(want).max(),
                                       err_msg=str((k, count, reuse, late, lean)))
        tried += 1
    assert tried >= 1


def _hand_checked_conv():
    """A 3x3 SAME conv (stride 1, weights all 1) over 8 rows of 5 x 2 floats, to 3 channels."""
    m = Model()
    x = m.tensor("x", (1, 8, 5, 2), "float32")
    w = m.tensor("w", (3, 3, 3, 2), "float32", data=np.ones((3, 3, 3, 2)))
    b = m.tensor("b", (3,), "float32", data=np.zeros(3))
    y = m.tensor("y", (1, 8, 5, 3), "float32")
    m.op("CONV_2D", [x, w, b], [y], "Conv2DOptions", Padding=tflite.Padding.SAME, StrideW=1,
         StrideH=1, FusedActivationFunction=0, DilationWFactor=1, DilationHFactor=1)
    m.io([x], [y])
    return optimize(load(m.build()))


def test_stage_bands_recompute_the_halo_only():
    """A hand-checked case: a 3x3 SAME conv (stride 1) on 8 rows in 2 bands. Band 0 computes
    output rows 0..3 from input rows 0..4 (top padding 1, bottom 0), band 1 rows 4..7 from input
    rows 3..7 (top padding 0, bottom 1): 2 x 4 rows, no output row twice, 10 input rows read."""
    h = patch.patch_stage(_hand_checked_conv(), 1, 2)
    convs = [n for n in h.nodes if n.op == "conv2d"]
    assert [n.attrs["padding"] for n in convs] == [(1, 0, 1, 1), (0, 1, 1, 1)]
    assert [h.tensors[n.inputs[0]].shape[1] for n in convs] == [5, 5]
    assert [h.tensors[n.outputs[0]].shape[1] for n in convs] == [4, 4]
    slices = {n.outputs[0]: n.attrs["starts"][1] for n in h.nodes if n.op == "slice"}
    assert [slices.get(n.inputs[0], 0) for n in convs] == [0, 3]


def _mlperf_choice(stem: str, board: str = "mps2-an386", bound: float = 10.0):
    from mcuforge.api import patch_first_stage
    from mcuforge.board import load_board
    g = optimize(load(mlperf_model(stem)))
    return g, patch_first_stage(g, load_board(board).target(None), bound)[1]


@pytest.mark.parametrize("stem", ["pretrainedResnet_quant", "vww_96_int8", "kws_ref_model"])
def test_mlperf_arena_shrinks_within_the_mac_bound(stem, tmp_path):
    """The plan the C addresses (generate_project's, checked by plan_check) is smaller than
    the default's, and the MACs the C runs exceed the default's by at most the bound. KWS's
    first layer (a 10x4 stride-2 conv over a 49x10 input) beats its in-place default plan
    only with depthwise layers after the stage on the reference loops (no scratch), which
    the 10% bound does not cover (their MACs count BARE_COST times more): its graph stays."""
    g, choice = _mlperf_choice(stem)
    files, plan, model, compiled = generate_project(g, "model", "mps2-an386",
                                                    memory_priority=10.0)
    _, base_plan, base_model, _ = generate_project(g, "model", "mps2-an386")
    if stem == "kws_ref_model":
        assert choice.k == 0 and choice.graph is g
        assert plan.arena_size == choice.arena == base_plan.arena_size == choice.base_arena
        return
    assert plan.arena_size == choice.arena < base_plan.arena_size == choice.base_arena
    assert base_model.macs <= model.macs <= base_model.macs * 1.10
    assert model.macs == choice.macs
    check_plan(model.graph, plan, declared=model.declared)
    # the input stays whole until its last band is read, the stage's output is one buffer
    concat = next(n for n in compiled.nodes if n.op == "concat" and is_alias(n))
    out = compiled.tensors[concat.outputs[0]]
    for k, part in enumerate(concat.inputs):
        assert plan.offsets[part] == plan.offsets[out.name] + sum(
            compiled.tensors[p].nbytes for p in concat.inputs[:k])


def _bytes_safe(g, off_x: int, off_y: int, x: str, y: str) -> bool:
    """Written here apart from plan_check: with x at off_x and y at off_y, every kernel access
    to a byte of x comes before the first kernel write of y to that byte (alias nodes touch
    nothing; a view's bytes are found by walking its slices and concats to its buffer)."""
    up = {}  # tensor -> (bigger tensor, byte offset in it)
    for n in g.nodes:
        if n.op == "slice" and is_alias(n):
            t = g.tensors[n.inputs[0]]
            up[n.outputs[0]] = (n.inputs[0], int(np.ravel_multi_index(n.attrs["starts"],
                                                                       t.shape)))
        elif n.op == "concat" and is_alias(n):
            row = g.tensors[n.outputs[0]].nbytes // g.tensors[n.outputs[0]].shape[1]
            at = 0
            for t in n.inputs:
                up[t] = (n.outputs[0], at * row)
                at += g.tensors[t].shape[1]

    def where(t):
        o = 0
        while t in up:
            t, d = up[t]
            o += d
        return t, o
    size = max(off_x + g.tensors[x].nbytes, off_y + g.tensors[y].nbytes)
    last_x = np.full(size, -1)  # per arena byte: x's last access, y's first write
    first_y = np.full(size, 1 << 30)
    for i, n in enumerate(g.nodes):
        if is_alias(n):
            continue
        for t in [u for u in n.inputs if u] + list(n.outputs):
            if g.tensors[t].is_const:
                continue
            b, o = where(t)
            if b == x:
                lo = off_x + o
                last_x[lo:lo + g.tensors[t].nbytes] = i
            elif b == y and t in n.outputs:
                lo = off_y + o
                first_y[lo:lo + g.tensors[t].nbytes] = np.minimum(
                    first_y[lo:lo + g.tensors[t].nbytes], i)
    return bool(np.all(last_x < first_y))


def test_stage_output_takes_the_input_bytes_the_bands_are_done_with():
    """The stage's output is planned over the input (memory_plan.overlay_links): each of its
    bands lands on input bytes no later band reads (checked byte by byte here); placed over
    the input's start instead, the first band would overwrite rows the second band still
    reads, and plan_check refuses that plan."""
    g = optimize(load(mlperf_model("pretrainedResnet_quant")))
    _, plan, model, _ = generate_project(g, "model", "mps2-an386", memory_priority=10.0)
    h = model.graph
    x = h.inputs[0]
    y = max((n.outputs[0] for n in h.nodes if n.op == "concat" and is_alias(n)),
            key=lambda t: h.tensors[t].nbytes)  # the stage's output (the others: bands)
    ox, oy = plan.offsets[x], plan.offsets[y]
    assert ox < oy + h.tensors[y].nbytes and oy < ox + h.tensors[x].nbytes  # they share
    assert _bytes_safe(h, ox, oy, x, y)
    assert not _bytes_safe(h, ox, ox, x, y)
    from mcuforge.optimizer.memory_plan import views
    moved = dict(plan.offsets)
    for t, (r, d) in views(h).items():
        if r == y:
            moved[t] = ox + d
    moved[y] = ox
    from dataclasses import replace
    with pytest.raises(PlanError, match="share bytes"):
        check_plan(h, replace(plan, offsets=moved), declared=model.declared)


@pytest.mark.parametrize("stem", ["pretrainedResnet_quant", "vww_96_int8"])
def test_mlperf_memory_priority_under_the_arena_check(stem):
    """The bands, their views and the output over the input, run under AddressSanitizer with
    the arena's red-zones (codegen_c/arena_check.py): bit-exact with tflite-micro."""
    require_tflm()
    from mcuforge import runner
    from mcuforge.tools import tflm
    path = mlperf_model(stem)
    x = _random_input(path, 2, seed=11)
    y = runner.run(path, x, board="host", memory_priority=10.0, check_arena=True)
    assert np.array_equal(y, tflm.run(path.read_bytes(), [x])[0])


def test_nothing_beats_the_default_plan_keeps_the_graph():
    """AD is fully connected: no stage, the graph and its arena stay the default's."""
    g, choice = _mlperf_choice("ad01_int8")
    assert choice.k == 0 and choice.graph is g and choice.arena == choice.base_arena


def test_plan_check_rejects_a_band_at_a_wrong_offset():
    g, choice = _mlperf_choice("pretrainedResnet_quant")
    h = choice.graph
    plan = plan_graph(h)
    check_plan(h, plan)
    concat = next(n for n in h.nodes if n.op == "concat" and is_alias(n))
    part = concat.inputs[1]
    moved = dict(plan.offsets, **{part: plan.offsets[part] + 8})
    from dataclasses import replace
    with pytest.raises(PlanError, match="alias"):
        check_plan(h, replace(plan, offsets=moved))
    # a slice of the input placed anywhere but at its rows is refused too
    view = next(n for n in h.nodes if n.op == "slice" and is_alias(n))
    moved = dict(plan.offsets, **{view.outputs[0]: plan.offsets[view.outputs[0]] - 4})
    with pytest.raises(PlanError, match="alias"):
        check_plan(h, replace(plan, offsets=moved))


def _random_input(path: Path, n: int, seed: int) -> np.ndarray:
    t = load(path)
    t = t.tensors[t.inputs[0]]
    rng = np.random.default_rng(seed)
    return rng.integers(-128, 128, size=(n, *t.shape)).astype(np.int8)


@pytest.mark.parametrize("stem", ["pretrainedResnet_quant", "vww_96_int8", "kws_ref_model"])
@pytest.mark.parametrize("board", ["host", "mps2-an386"])
def test_mlperf_memory_priority_bit_exact_with_tflm(stem, board):
    require_tflm()
    if board != "host":
        require_tools("arm-none-eabi-gcc", "qemu-system-arm")
    from mcuforge import runner
    from mcuforge.tools import tflm
    path = mlperf_model(stem)
    x = _random_input(path, 8 if board == "host" else 2, seed=7)
    y = runner.run(path, x, board=board, memory_priority=10.0)
    want = tflm.run(path.read_bytes(), [x])[0]
    assert np.array_equal(y, want)
    assert len(np.unique(want.reshape(len(want), -1), axis=0)) > 1


def test_compile_prints_arena_before_and_after(tmp_path, capsys):
    """The CLI's line: the default compile's arena -> this compile's, the MACs and the bands;
    a model nothing helps says so and compiles as without the option."""
    import re

    from mcuforge.cli import main
    path = str(mlperf_model("pretrainedResnet_quant"))
    assert main(["compile", path, "-o", str(tmp_path / "a"), "--board", "mps2-an386"]) == 0
    plain = capsys.readouterr().out
    assert main(["compile", path, "-o", str(tmp_path / "b"), "--board", "mps2-an386",
                 "--memory-priority", "--memory-priority-max-macs", "9"]) == 0
    out = capsys.readouterr().out
    arena = lambda text: int(re.search(r"^arena (\d+) bytes", text, re.M).group(1))  # noqa
    macs = lambda text: int(re.search(r"(\d+) MACs$", text, re.M).group(1))  # noqa
    m = re.search(r"memory priority: arena ([\d,]+) -> ([\d,]+) bytes, MACs ([\d,]+) -> "
                  r"([\d,]+) \(\+([\d.]+)%\): the first (\d+) layers in (\d+) bands of rows, "
                  r"(each row computed once|the halos recomputed)", out)
    assert m, out
    num = lambda s: int(s.replace(",", ""))  # noqa
    assert num(m.group(1)) == arena(plain) > num(m.group(2)) == arena(out)
    assert num(m.group(3)) == macs(plain) <= num(m.group(4)) == macs(out)
    assert float(m.group(5)) <= 9.0
    ad = str(mlperf_model("ad01_int8"))
    assert main(["compile", ad, "-o", str(tmp_path / "c"), "--memory-priority"]) == 0
    assert "nothing beats the default plan" in capsys.readouterr().out


def test_patched_graph_in_the_loop_ir_evaluator_and_verify():
    """The evaluator (codegen_c/evaluate_graph.py) runs view slices and concats as the C
    does: a patched chain gives the unpatched chain's values, both ways of banding; verify
    refuses a view slice that is not one contiguous run of its input."""
    from dataclasses import replace as dc_replace

    from mcuforge.codegen_c.evaluate_graph import run_graph
    from mcuforge.ir.graph import GraphError, Node, Tensor, verify
    rng = np.random.default_rng(3)
    g = optimize(load(chain_model(rng, "int8")))
    x = {g.inputs[0]: rng.integers(-128, 128, g.tensors[g.inputs[0]].shape).astype(np.int8)}
    want = run_graph(g, x)[g.outputs[0]]
    for reuse in (False, True):
        tried = 0
        for k in patch.stage_lengths(g):
            for count in (2, 3):
                try:
                    h = patch.patch_stage(g, k, count, reuse)
                except patch.NotPatchable:
                    continue
                assert np.array_equal(run_graph(h, x)[g.outputs[0]], want)
                tried += 1
        assert tried >= 2
    t = g.tensors[g.inputs[0]]
    cols = Tensor("cols", (1, t.shape[1], 1, t.shape[3]), t.dtype, quant=t.quant)
    bad = g.replace(tensors={**g.tensors, "cols": cols}, outputs=["cols"], nodes=[Node(
        "slice", (t.name,), ("cols",), {"starts": (0, 0, 1, 0), "ends": (1, t.shape[1], 2,
                                                                          t.shape[3]),
                                        "steps": (1, 1, 1, 1), "view": True}, "cols")])
    with pytest.raises(GraphError, match="contiguous"):
        verify(bad)
    ok = dc_replace(bad.nodes[0], attrs={**bad.nodes[0].attrs, "view": False})
    verify(bad.replace(nodes=[ok]))  # the same slice as a copy is fine
    # one band in two view concats would have to be in two places at once
    h = next(patch.patch_stage(g, k, 2) for k in patch.stage_lengths(g)[:1])
    concat = next(n for n in h.nodes if n.op == "concat" and is_alias(n))
    twin = Tensor("twin", h.tensors[concat.outputs[0]].shape, h.tensors[concat.outputs[0]].dtype,
                  quant=h.tensors[concat.outputs[0]].quant)
    both = h.replace(tensors={**h.tensors, "twin": twin}, outputs=[*h.outputs, "twin"],
                     nodes=[*h.nodes, dc_replace(concat, outputs=("twin",), name="twin")])
    with pytest.raises(GraphError, match="already a view"):
        verify(both)


def test_a_negative_mac_bound_is_one_clear_error(tmp_path, capsys):
    from mcuforge.cli import main
    path = str(mlperf_model("ad01_int8"))
    assert main(["compile", path, "-o", str(tmp_path / "a"), "--memory-priority",
                 "--memory-priority-max-macs", "-1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("mcuforge: error: --memory-priority-max-macs -1") and \
        "Traceback" not in err


def test_report_shows_each_band_as_a_layer(tmp_path):
    """report --memory-priority: every band is a layer with its kernel and MACs (bands that
    share a function keep their own names in the invoke), the MACs add up to the compile's,
    the arena is the compile's."""
    import json

    from mcuforge.cli import main
    path = str(mlperf_model("pretrainedResnet_quant"))
    assert main(["report", path, "--json", "-o", str(tmp_path / "r.json"),
                 "--memory-priority"]) == 0
    r = json.loads((tmp_path / "r.json").read_text())
    g, choice = _mlperf_choice("pretrainedResnet_quant", "host")
    assert r["arena_bytes"] == choice.arena < choice.base_arena
    bands = [x for x in r["layers"] if x["op"] == "conv2d" and "/band" in
             x["outputs"][0]["name"]]
    assert len(bands) >= 2 * choice.count and all(x["kernel"] and x["macs"] for x in bands)
    assert sum(x["macs"] for x in r["layers"]) == r["macs"] == choice.macs


def test_bench_rows_show_the_default_beside(tmp_path):
    """bench --memory-priority: each row carries the default build's arena, its MACs and its
    instructions on the board (measured apart here, by a bench without the flag), and the
    table prints them beside the banded build's. Seed 10's chain bands its first 4 layers in
    4 bands with the halos recomputed (extra MACs, other instructions)."""
    require_tools("arm-none-eabi-gcc", "qemu-system-arm")
    from mcuforge.tools import bench
    path = tmp_path / "chain.tflite"
    path.write_bytes(chain_model(np.random.default_rng(10), "int8"))
    [row] = bench.bench([str(path)], "mps2-an386", with_tflm=False, memory_priority=10.0)
    [base] = bench.bench([str(path)], "mps2-an386", with_tflm=False)
    mp = row["memory_priority"]
    assert mp["stage_layers"] > 0 and row["macs"] > base["macs"]
    assert mp["default_arena_bytes"] == base["arena_bytes"] > row["arena_bytes"]
    assert mp["default_instructions"] == base["instructions"] != row["instructions"]
    assert mp["mac_overhead_percent"] == round(100 * (row["macs"] - base["macs"])
                                               / base["macs"], 2)
    table = bench.format_table([row]).splitlines()
    assert table[0].rstrip().endswith("default arena  MACs +%  default instr")
    line = table[1].split()
    assert line[-3:] == [f"{base['arena_bytes']:,}", f"{mp['mac_overhead_percent']:.1f}",
                         f"{base['instructions']:,}"]


@pytest.mark.parametrize("seed", [12, 13, 14, 15, 32, 39])
def test_random_chains_memory_priority_under_the_arena_check(seed, tmp_path):
    """Random int8 chains whose choice bands a stage (asserted), compiled with
    --memory-priority into the checked build (AddressSanitizer, the arena's red-zones,
    codegen_c/arena_check.py): bit-exact with tflite-micro."""
    require_tflm()
    from mcuforge import runner
    from mcuforge.api import patch_first_stage
    from mcuforge.board import load_board
    from mcuforge.tools import tflm
    rng = np.random.default_rng(seed)
    model = chain_model(rng, "int8")
    path = tmp_path / "chain.tflite"
    path.write_bytes(model)
    g = optimize(load(model))
    assert patch_first_stage(g, load_board("host").target(None), 10.0)[1].k > 0
    x = rng.integers(-128, 128, (3, *g.tensors[g.inputs[0]].shape)).astype(np.int8)
    y = runner.run(path, x, board="host", memory_priority=10.0, check_arena=True)
    assert np.array_equal(y, tflm.run(model, [x])[0])


def _int8_layer(m, name, cur, shape, o, k, stride, dw, rng):
    """One int8 3x3-style layer (conv or depthwise, SAME, RELU) after `cur`; its output."""
    c = shape[-1]
    sw = rng.uniform(0.002, 0.01, o).astype(np.float32)
    wshape = (1, k, k, o) if dw else (o, k, k, c)
    wi = m.tensor(f"w{name}", wshape, "int8", data=rng.integers(-127, 128, wshape),
                  scale=sw.tolist(), zero_point=[0] * o, axis=3 if dw else 0)
    bi = m.tensor(f"b{name}", (o,), "int32", data=rng.integers(-2000, 2000, o).astype(np.int32),
                  scale=(np.float32(0.05) * sw).tolist(), zero_point=[0] * o)
    oh, ow = -(-shape[1] // stride), -(-shape[2] // stride)
    y = m.tensor(f"y{name}", (1, oh, ow, o), "int8", scale=0.05, zero_point=-128)
    opts = dict(Padding=tflite.Padding.SAME, StrideW=stride, StrideH=stride,
                FusedActivationFunction=tflite.ActivationFunctionType.RELU,
                DilationWFactor=1, DilationHFactor=1)
    if dw:
        m.op("DEPTHWISE_CONV_2D", [cur, wi, bi], [y], "DepthwiseConv2DOptions",
             DepthMultiplier=1, **opts)
    else:
        m.op("CONV_2D", [cur, wi, bi], [y], "Conv2DOptions", **opts)
    return y, (1, oh, ow, o)


def _kernels_of(h, board="mps2-an386"):
    from mcuforge.board import load_board
    from mcuforge.codegen_c.model import _lower_all
    kernels = _lower_all(h, load_board(board).target(None))
    return [(n, kernels[id(n)]) for n in h.nodes if kernels.get(id(n)) is not None]


def test_band_depthwise_takes_one_row_of_scratch():
    """The M4 depthwise of a band asks for the least scratch: one output row of 4 channels.
    A 3x3 stride-2 SAME depthwise over 13x48x16 in bands of one output row: its kernel widens
    3 input rows of 4 channels to int16 rows of pw = max(pad_l + 48, 2 * 24 + 2) = 50
    entries: 4 * 3 * 50 * 2 = 1,200 bytes (pack_dw's docstring). The whole layer keeps its
    default budget: 4 KB holds (4096 // (4 * 50 * 2) - 3) // 2 + 1 = 4 output rows, 9 input
    rows: 4 * 9 * 50 * 2 = 3,600 bytes. (Before, a band of 24 outputs counted as a small
    image and filled 4 KB with channels: 12 * 3 * 50 * 2 = 3,600 bytes.)"""
    rng = np.random.default_rng(5)
    m = Model()
    x = m.tensor("x", (1, 13, 48, 16), "int8", scale=0.05, zero_point=-3)
    y, _ = _int8_layer(m, "d", x, (1, 13, 48, 16), 16, 3, 2, True, rng)
    m.io([x], [y])
    g = optimize(load(m.build()))
    [(_, whole)] = _kernels_of(g)
    assert whole.scratch_bytes == 3600
    h = patch.patch_stage(g, 1, 7)
    bands = [k for n, k in _kernels_of(h) if n.op == "depthwise_conv2d"]
    assert len(bands) == 7 and {k.scratch_bytes for k in bands} == {1200}


def test_lean_and_late_bands():
    """`lean`: the band convolutions of a 3x3 conv over 16 channels take im2col without the
    row cache (mf_conv_lean_*, scratch 3 * Kp = 3 * 144 bytes) instead of the widened rows
    (mf_convp_*, 2 * 544 * 3 + 544 + 8 = 3,816 bytes); `late`: each halo copy of a band comes after the band's last reader of that
    tensor ("all"), or after it only for the strided readers' tensors ("strided"), else right
    after the tensor is computed. The values are the reference's (the random chains above
    run every `late`; the MLPerf models on mps2-an386 run lean bands)."""
    rng = np.random.default_rng(6)
    m = Model()
    x = m.tensor("x", (1, 16, 32, 16), "int8", scale=0.05, zero_point=-3)
    y1, s1 = _int8_layer(m, "1", x, (1, 16, 32, 16), 16, 3, 1, False, rng)
    y2, s2 = _int8_layer(m, "2", y1, s1, 16, 3, 1, True, rng)
    y3, _ = _int8_layer(m, "3", y2, s2, 16, 3, 2, True, rng)
    m.io([x], [y3])
    g = optimize(load(m.build()))
    convs = lambda h: [k for n, k in _kernels_of(h) if n.op == "conv2d"]  # noqa: E731
    assert {(k.schedule.startswith("mf_convp"), k.scratch_bytes)
            for k in convs(patch.patch_stage(g, 3, 4, True))} == {(True, 3816)}
    lean = convs(patch.patch_stage(g, 3, 4, True, lean="im2col"))
    assert {(k.schedule, k.scratch_bytes) for k in lean} == {("mf_conv_lean_w16", 3 * 144)}
    # "bare": the band convolution and depthwise layers on the reference loops, no scratch
    bare = [(n.op, k) for n, k in _kernels_of(patch.patch_stage(g, 3, 4, True, lean="bare"))
            if n.op in ("conv2d", "depthwise_conv2d")]
    assert len(bare) == 12 and {(k.schedule, k.scratch_bytes) for _, k in bare} == {("", 0)}
    # "bare_dw": the depthwise layers on the reference loops, the convolutions on im2col
    dw = {(n.op, k.schedule, k.scratch_bytes) for n, k in
          _kernels_of(patch.patch_stage(g, 3, 4, True, lean="bare_dw"))
          if n.op in ("conv2d", "depthwise_conv2d")}
    assert dw == {("conv2d", "mf_conv_lean_w16", 3 * 144), ("depthwise_conv2d", "", 0)}

    def order(late):
        """Per halo copy: (its tensor, whether a band node reading that band tensor runs
        after it)."""
        h = patch.patch_stage(g, 3, 4, True, late)
        pos = {n.outputs[0]: i for i, n in enumerate(h.nodes)}
        out = set()
        for i, n in enumerate(h.nodes):
            if n.op == "slice" and not is_alias(n) and "/band" in n.inputs[0]:
                src = n.inputs[0]
                readers = [j for j, u in enumerate(h.nodes) if not is_alias(u) and j != i
                           and any(v == src or (v in pos and is_alias(h.nodes[pos[v]])
                                                and h.nodes[pos[v]].inputs[0] == src)
                                   for v in u.inputs)]  # directly or through a view
                out.add((src.split("/band")[0], any(j > i for j in readers)))
        return out
    t1, t2 = (g.nodes[0].outputs[0], g.nodes[1].outputs[0])
    assert order("") == {(t1, True), (t2, True)}
    assert order("all") == {(t1, False), (t2, False)}
    assert order("strided") == {(t1, True), (t2, False)}  # y2 is read by the stride-2 layer


def test_buffer_pieces_of_a_stage_by_hand():
    """memory_plan.buffer_pieces on the hand-checked stage above (a 3x3 SAME conv over 8 rows
    of 5 x 2 floats, 40 bytes a row, in 2 bands; steps: 0 view of rows 0..4, 1 band 0's conv,
    2 view of rows 3..7, 3 band 1's conv, 4 the output's concat view, 5 the end): input rows
    0..2 ([0, 120)) are read by band 0 only (live steps 0..1), rows 3..7 ([120, 320)) until
    band 1 (0..3); the output (8 rows of 5 x 3 floats, 60 bytes a row) is a graph output (to
    the end), rows 0..3 ([0, 240)) written at step 1, rows 4..7 at step 3."""
    from mcuforge.optimizer.memory_plan import buffer_pieces, requests_of
    h = patch.patch_stage(_hand_checked_conv(), 1, 2)
    assert [n.op for n in h.nodes] == ["slice", "conv2d", "slice", "conv2d", "concat"]
    pieces = buffer_pieces(h, requests_of(h)[0])
    assert pieces == {h.inputs[0]: ((0, 120, 0, 1), (120, 320, 0, 3)),
                      h.outputs[0]: ((0, 240, 1, 5), (240, 480, 3, 5))}
    assert buffer_pieces(h, requests_of(h, keep_input=True)[0], keep_input=True) == {
        h.outputs[0]: ((0, 240, 1, 5), (240, 480, 3, 5))}


def test_band_tensors_take_input_bytes_no_band_reads_again():
    """VWW's first 4 layers in 23 bands: the band tensors and kernel scratch of later bands are
    planned in bytes of the input that no band reads again (memory_plan.buffer_pieces), which
    makes the arena smaller than with the input's bytes all live to its last band; every such
    buffer is checked here byte by byte (_bytes_safe), and plan_check refuses one moved onto
    input rows the last band still reads."""
    from dataclasses import replace
    from mcuforge.optimizer import memory_plan
    g = optimize(load(mlperf_model("vww_96_int8")))
    h = patch.patch_stage(g, 4, 23, True, "all")
    _, plan, model, _ = generate_project(h, "model", "mps2-an386")
    c = model.graph
    x = c.inputs[0]
    ox, nx = plan.offsets[x], c.tensors[x].nbytes
    inside = [r for r in plan.requests if r.name in c.tensors and r.name != x
              and ox < plan.offsets[r.name] + r.size and plan.offsets[r.name] < ox + nx
              and r.first > 0 and "/band" in r.name]
    assert len(inside) >= 10
    for r in inside:
        assert _bytes_safe(c, ox, plan.offsets[r.name], x, r.name), r.name
    orig = memory_plan.buffer_pieces
    try:
        memory_plan.buffer_pieces = lambda *a, **k: {}
        _, whole, _, _ = generate_project(h, "model", "mps2-an386")
    finally:
        memory_plan.buffer_pieces = orig
    assert plan.arena_size < whole.arena_size
    # the last band reads the input's last rows: a band tensor of band 1 moved there is
    # refused
    z = next(r for r in inside if "band1" in r.name)
    moved = dict(plan.offsets)
    moved[z.name] = (ox + nx - z.size) // 4 * 4
    for t, (root, d) in memory_plan.views(c).items():
        if root == z.name:
            moved[t] = moved[z.name] + d
    with pytest.raises(PlanError, match="share bytes"):
        check_plan(c, replace(plan, offsets=moved), declared=model.declared)


def test_bare_form_only_where_the_bound_allows_its_cost(capsys):
    """lean="bare" (the band windows on the reference loops, several times the instructions)
    is chosen only when the bound covers its MACs counted BARE_COST times more: seed 12's chain
    stays on im2col at the default 10% and takes the bare form, with a smaller arena, when
    any cost is allowed; a bound just under the bare form's cost keeps it out again. The CLI's
    help states the factor."""
    from mcuforge.api import patch_first_stage
    from mcuforge.board import load_board
    from mcuforge.cli import main
    target = load_board("mps2-an386").target(None)
    g = optimize(load(chain_model(np.random.default_rng(12), "int8")))
    h10, c10 = patch_first_stage(g, target, 10.0)
    assert c10.k > 0 and c10.lean != "bare" and patch.bare_macs(h10) == 0
    h, c = patch_first_stage(g, target, 1000.0)
    assert c.lean == "bare" and c.arena < c10.arena
    cost = 100.0 * (c.macs - c.base_macs + patch.BARE_COST * patch.bare_macs(h)) / c.base_macs
    assert 10.0 < cost <= 1000.0
    _, under = patch_first_stage(g, target, cost - 0.01)
    assert under.lean != "bare"
    with pytest.raises(SystemExit):
        main(["compile", "--help"])
    assert f"counts {patch.BARE_COST} more" in " ".join(capsys.readouterr().out.split())


def _pair_layer(m, name, cur, shape, o, k, stride, dw, rng, dtype):
    """One conv (k x k, or 1x1 when k = 1) or depthwise layer, SAME, RELU, int8 with
    per-channel weight scales (axis 0 for conv, 3 for depthwise) or float32; its output."""
    if dtype == "int8":
        return _int8_layer(m, name, cur, shape, o, k, stride, dw, rng)
    c = shape[-1]
    wshape = (1, k, k, o) if dw else (o, k, k, c)
    wi = m.tensor(f"w{name}", wshape, "float32",
                  data=rng.standard_normal(wshape) / math.sqrt(k * k * (1 if dw else c)))
    bi = m.tensor(f"b{name}", (o,), "float32", data=rng.standard_normal(o) * 0.1)
    oh, ow = -(-shape[1] // stride), -(-shape[2] // stride)
    y = m.tensor(f"y{name}", (1, oh, ow, o), "float32")
    opts = dict(Padding=tflite.Padding.SAME, StrideW=stride, StrideH=stride,
                FusedActivationFunction=tflite.ActivationFunctionType.RELU,
                DilationWFactor=1, DilationHFactor=1)
    if dw:
        m.op("DEPTHWISE_CONV_2D", [cur, wi, bi], [y], "DepthwiseConv2DOptions",
             DepthMultiplier=1, **opts)
    else:
        m.op("CONV_2D", [cur, wi, bi], [y], "Conv2DOptions", **opts)
    return y, (1, oh, ow, o)


def pair_chain(rng, dtype: str) -> bytes:
    """A random MobileNet-like start: a k x k conv (stride 1 or 2), a depthwise layer, then
    one or two (1x1 conv -> 3x3 depthwise, stride 1 or 2) pairs expanding to a multiple of 4
    channels (int8: 8 or 16 columns, so that every row starts aligned and the halos can be
    reused)."""
    h, c = int(rng.integers(6, 14)), int(rng.integers(1, 4))
    # int8 rows of a multiple of 4 bytes at every layer (halo rows reused need aligned rows)
    w = int(rng.choice([8, 16])) if dtype == "int8" else int(rng.integers(5, 12))
    m = Model()
    x = m.tensor("x", (1, h, w, c), dtype,
                 **(dict(scale=0.05, zero_point=int(rng.integers(-20, 20)))
                    if dtype == "int8" else {}))
    cur, shape = x, (1, h, w, c)
    o = int(rng.integers(2, 6))
    cur, shape = _pair_layer(m, "0", cur, shape, o, int(rng.integers(2, 4)),
                             int(rng.choice([1, 2])), False, rng, dtype)
    cur, shape = _pair_layer(m, "1", cur, shape, o, 3, 1, True, rng, dtype)
    for i in range(int(rng.integers(1, 3))):
        o = 4 * int(rng.integers(1, 4))
        cur, shape = _pair_layer(m, f"p{i}", cur, shape, o, 1, 1, False, rng, dtype)
        cur, shape = _pair_layer(m, f"d{i}", cur, shape, o, 3, int(rng.choice([1, 2])), True,
                                 rng, dtype)
    m.io([x], [cur])
    return m.build()


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("dtype", ["int8", "float32"])
def test_channel_groups_equal_the_reference(dtype, seed, tmp_path):
    """`split`: the 1x1 -> depthwise pairs of a stage in 2 and 4 channel groups (the 1x1
    layers' halos recomputed), in bands recomputing or reusing the other halos, late copies,
    lean kernels (in every band or in the first ones only: lean_bands): int8 bit-exact with
    tflite-micro, float within tolerance of LiteRT, every plan accepted by plan_check, the
    groups really there (a channel concat of `split` inputs per pair and band computing its
    rows)."""
    if dtype == "int8":
        require_tflm()
    rng = np.random.default_rng(2000 + seed)
    model = pair_chain(rng, dtype)
    g = optimize(load(model))
    t = g.tensors[g.inputs[0]]
    if dtype == "int8":
        from mcuforge.tools import tflm
        x = rng.integers(-128, 128, (2, *t.shape)).astype(np.int8)
        want = tflm.run(model, [x])[0]
    else:
        x = rng.standard_normal((2, *t.shape)).astype(np.float32)
        want = np.stack([litert(model, [xi])[0] for xi in x])
    pairs = sum(1 for a, b in zip(g.nodes, g.nodes[1:])
                if a.op == "conv2d" and b.op == "depthwise_conv2d"
                and g.tensors[a.inputs[1]].shape[1:3] == (1, 1))
    k = len(g.nodes)
    rows = g.tensors[g.outputs[0]].shape[1]
    tried = 0
    for i, (count, reuse, late, lean, split, m) in enumerate([
            (2, False, "", "", 2, None), (2, True, "all", "bare", 4, None),
            (3, True, "", "", 2, None), (rows, True, "strided", "bare", 2, 1),
            (3, False, "", "bare", 4, None), (3, True, "all", "im2col", 2, 2),
            (2, True, "all", "bare_dw", 2, 1)]):
        try:
            h = patch.patch_stage(g, k, count, reuse, late, lean, split, m)
        except patch.NotPatchable:
            continue
        # lean_bands: only the first m bands' layers carry the lean kernels
        leaned = {int(n.name.rsplit("/band", 1)[1]) for n in h.nodes if n.attrs.get("lean")}
        assert leaned <= set(range(count if m is None else m))
        assert (0 in leaned) == bool(lean)
        joins = [n for n in h.nodes if n.op == "concat" and n.attrs["axis"] == 3]
        assert pairs <= len(joins) <= pairs * count  # (a band may compute no row of one)
        assert all(len(n.inputs) == split and not is_alias(n) for n in joins)
        y, plan, compiled, declared = run_c(h, tmp_path / f"c{i}", x)
        check_plan(compiled, plan, declared=declared)
        if dtype == "int8":
            assert np.array_equal(y, want), (count, reuse, late, lean, split)
        else:
            np.testing.assert_allclose(y, want, rtol=1e-4, atol=1e-4 * np.abs(want).max(),
                                       err_msg=str((count, reuse, late, lean, split)))
        tried += 1
    assert tried >= 3


def test_split_pairs_slice_weights_and_scales_by_channel():
    """split_pairs on conv 3x3 -> depthwise -> 1x1 conv (8 channels) -> depthwise: only the
    1x1 -> depthwise pair splits (the 3x3 conv is no 1x1); group j of 2 holds output channels
    4j..4j+3 of the builder's 1x1 weights, bias and scales, and channels 4j..4j+3 of the
    depthwise's (weights 1HWC: the last axis); a channel concat of the two depthwise outputs
    gives the original tensor. A 1x1 whose output another layer reads too, or channels not a
    multiple of the groups, do not split."""
    rng = np.random.default_rng(9)
    m = Model()
    x = m.tensor("x", (1, 8, 8, 3), "int8", scale=0.05, zero_point=-3)
    y0, s0 = _int8_layer(m, "0", x, (1, 8, 8, 3), 4, 3, 2, False, rng)
    y1, s1 = _int8_layer(m, "1", y0, s0, 4, 3, 1, True, rng)
    y2, s2 = _int8_layer(m, "2", y1, s1, 8, 1, 1, False, rng)
    y3, _ = _int8_layer(m, "3", y2, s2, 8, 3, 2, True, rng)
    m.io([x], [y3])
    built = m.tensors
    g = optimize(load(m.build()))
    h, k, again = patch.split_pairs(g, 4, 2)
    assert k == 2 + 2 * 2 + 1
    assert [n.op for n in h.nodes] == ["conv2d", "depthwise_conv2d", "conv2d",
                                       "depthwise_conv2d", "conv2d", "depthwise_conv2d",
                                       "concat"]
    w2, b2, w3, b3 = (built[i] for i in (y2 - 2, y2 - 1, y3 - 2, y3 - 1))
    for j, (pw, dw) in enumerate([(h.nodes[2], h.nodes[3]), (h.nodes[4], h.nodes[5])]):
        pick = slice(4 * j, 4 * j + 4)
        w = h.tensors[pw.inputs[1]]
        assert np.array_equal(w.data, w2["data"][pick])
        assert np.allclose(w.quant.scale, np.float32(w2["scale"])[pick])
        assert np.array_equal(h.tensors[pw.inputs[2]].data, b2["data"][pick])
        assert np.array_equal(h.tensors[dw.inputs[1]].data, w3["data"][..., pick])
        assert np.allclose(h.tensors[dw.inputs[1]].quant.scale, np.float32(w3["scale"])[pick])
        assert np.array_equal(h.tensors[dw.inputs[2]].data, b3["data"][pick])
        assert h.tensors[pw.outputs[0]].shape == (1, 4, 4, 4) and pw.outputs[0] in again
        assert dw.inputs[0] == pw.outputs[0]
    assert h.nodes[6].inputs == (h.nodes[3].outputs[0], h.nodes[5].outputs[0])
    assert h.nodes[6].outputs == g.nodes[3].outputs
    with pytest.raises(patch.NotPatchable):
        patch.split_pairs(g, 4, 3)  # 8 channels in 3 groups
    with pytest.raises(patch.NotPatchable):
        patch.split_pairs(g, 2, 2)  # 3x3 conv -> depthwise only
    # the 1x1's output read by one more layer (a second depthwise): no split
    m = Model()
    x = m.tensor("x", (1, 8, 8, 3), "int8", scale=0.05, zero_point=-3)
    y2, s2 = _int8_layer(m, "2", x, (1, 8, 8, 3), 8, 1, 1, False, rng)
    y3, _ = _int8_layer(m, "3", y2, s2, 8, 3, 2, True, rng)
    y4, _ = _int8_layer(m, "4", y2, s2, 8, 3, 1, True, rng)
    m.io([x], [y3, y4])
    g = optimize(load(m.build()))
    assert [n.op for n in g.nodes] == ["conv2d", "depthwise_conv2d", "depthwise_conv2d"]
    with pytest.raises(patch.NotPatchable):
        patch.split_pairs(g, 3, 2)


def test_vww_memory_priority_reaches_the_issue_arena():
    """Issue 13's VWW figure on the M4, chosen at the default bound (10%): the plan
    generate_project addresses (checked by plan_check) is <= 29,290 bytes including the
    kernels' scratch, at <= +9% MACs, with the input image resident (its 27,648 bytes live
    until the last band reads them). It takes the first 4 layers in bands with the 1x1 ->
    depthwise pair in channel groups; the reference loops, where it has any, only in its first
    bands (their MACs counted BARE_COST times more stay within the bound)."""
    g, choice = _mlperf_choice("vww_96_int8")
    _, plan, model, _ = generate_project(choice.graph, "model", "mps2-an386")
    _, _, base, _ = generate_project(g, "model", "mps2-an386")
    assert plan.arena_size == choice.arena <= 29290
    assert model.macs <= base.macs * 1.09
    check_plan(model.graph, plan, declared=model.declared)
    assert choice.split > 1
    assert "bare" not in choice.lean or choice.lean_bands is not None
    assert model.macs + patch.BARE_COST * patch.bare_macs(choice.graph) <= base.macs * 1.10


def _block_after_a_stage(rng):
    """A stage (a 3x3 conv over 16x16x8, 16 channels) and then a ResNet block reading its
    output: a1 3x3 stride 2, a2 3x3 over a1, b 1x1 stride 2 (the shortcut), a2 + b. Nodes in
    that order: conv 0, a1 1, a2 2, b 3, add 4."""
    m = Model()
    x = m.tensor("x", (1, 16, 16, 8), "int8", scale=0.05, zero_point=-3)
    y0, s0 = _int8_layer(m, "0", x, (1, 16, 16, 8), 16, 3, 1, False, rng)
    a1, s1 = _int8_layer(m, "a1", y0, s0, 16, 3, 2, False, rng)
    a2, _ = _int8_layer(m, "a2", a1, s1, 16, 3, 1, False, rng)
    b, _ = _int8_layer(m, "b", y0, s0, 16, 1, 2, False, rng)
    z = m.tensor("z", (1, 8, 8, 16), "int8", scale=0.1, zero_point=-128)
    m.op("ADD", [a2, b], [z], "AddOptions",
         FusedActivationFunction=tflite.ActivationFunctionType.RELU)
    m.io([x], [z])
    return m.build()


def test_branch_orders_and_lean_layers_after_the_stage_equal_tflm(tmp_path):
    """stage_orders: the block after a one-layer stage runs its branches in the three
    topological orders (by hand: a1 before a2, both before the add, b anywhere after the
    stage): (0,1,2,3,4), (0,1,3,2,4), (0,3,1,2,4). lean_tail: the two 3x3 convolutions after
    the stage (not the 1x1 one), on im2col (less scratch than their default kernel) or on the
    reference loops (none). Each order and form, patched in 4 bands, compiles to C whose plan
    plan_check accepts and whose outputs equal tflite-micro's."""
    require_tflm()
    from mcuforge.tools import tflm
    rng = np.random.default_rng(13)
    model = _block_after_a_stage(rng)
    g = optimize(load(model))
    assert [n.op for n in g.nodes] == ["conv2d"] * 4 + ["add"]
    assert patch.stage_lengths(g)[0] == 1
    orders = patch.stage_orders(g, 1)
    assert orders == [(0, 1, 2, 3, 4), (0, 1, 3, 2, 4), (0, 3, 1, 2, 4)]
    h = patch.patch_stage(g, 1, 4, True, "all", "bare")
    a1, a2 = g.nodes[1].outputs[0], g.nodes[2].outputs[0]
    assert patch.lean_tail(h, 4, "im2col") == {a1: "im2col", a2: "im2col"}
    assert patch.lean_tail(h, 4, "bare") == {a1: "bare", a2: "bare"}
    scratch = lambda h: {n.outputs[0]: k.scratch_bytes for n, k in _kernels_of(h)  # noqa: E731
                         if n.outputs[0] in (a1, a2)}
    own = scratch(h)
    im2col = scratch(patch.lean_layers(h, patch.lean_tail(h, 4, "im2col")))
    assert all(0 < im2col[t] < own[t] for t in (a1, a2))
    assert scratch(patch.lean_layers(h, patch.lean_tail(h, 4, "bare"))) == {a1: 0, a2: 0}
    x = rng.integers(-128, 128, (2, 1, 16, 16, 8)).astype(np.int8)
    want = tflm.run(model, [x])[0]
    for i, order in enumerate(orders):
        for kind in ("", "im2col", "bare"):
            h = patch.patch_stage(patch.reordered(g, order), 1, 4, True, "all", "bare")
            h = patch.lean_layers(h, patch.lean_tail(h, 4, kind) if kind else {})
            y, plan, compiled, declared = run_c(h, tmp_path / f"o{i}{kind}", x)
            check_plan(compiled, plan, declared=declared)
            assert np.array_equal(y, want), (order, kind)


def test_resnet8_memory_priority_at_any_mac_cost():
    """ResNet-8 with --memory-priority-max-macs 1000 (any MAC cost) on mps2-an386: the arena
    the C addresses (kernel scratch included) is below 17,288 bytes (session 7's, with block
    3's branches in the model's order and conv2d_7's 4,488-byte scratch beside them), no
    larger than at the 10% bound, the plan proved by plan_check, the outputs bit-exact with
    tflite-micro."""
    require_tflm()
    from mcuforge import runner
    from mcuforge.api import patch_first_stage
    from mcuforge.board import load_board
    from mcuforge.tools import tflm
    path = mlperf_model("pretrainedResnet_quant")
    g = optimize(load(path))
    target = load_board("mps2-an386").target(None)
    _, any_cost = patch_first_stage(g, target, 1000.0)
    _, ten = patch_first_stage(g, target, 10.0)
    assert any_cost.arena <= ten.arena < 17288
    assert ten.macs <= ten.base_macs * 1.10
    files, plan, model, compiled = generate_project(g, "model", "mps2-an386",
                                                    memory_priority=1000.0)
    assert plan.arena_size == any_cost.arena
    check_plan(model.graph, plan, declared=model.declared)
    x = _random_input(path, 3, seed=17)
    y = runner.run(path, x, board="host", memory_priority=1000.0)
    assert np.array_equal(y, tflm.run(path.read_bytes(), [x])[0])


def test_a_choice_is_reused_for_the_same_graph_target_and_bound(monkeypatch):
    """patch_first_stage keeps its last choices for the process: the same model loaded twice
    (equal graphs, other objects) is chosen once; another bound or a changed weight chooses
    again."""
    from mcuforge import api
    from mcuforge.board import load_board
    calls = []
    choose = patch.choose
    monkeypatch.setattr(patch, "choose", lambda *a, **k: calls.append(1) or choose(*a, **k))
    monkeypatch.setattr(api, "_CHOICES", {})
    model = chain_model(np.random.default_rng(12), "int8")
    m4, m3 = (load_board(b).target(None) for b in ("mps2-an386", "mps2-an385"))
    g = optimize(load(model))
    first = api.patch_first_stage(g, m4, 10.0)[1]
    again = api.patch_first_stage(optimize(load(model)), m4, 10.0)[1]
    assert again is first and len(calls) == 1
    api.patch_first_stage(g, m4, 20.0)
    assert len(calls) == 2
    # (another target or keep_input: other keys, not chosen here to save the time)
    keys = list(api._CHOICES)
    assert len({k[1] for k in keys}) == 1 and repr(m3) != keys[0][1]
    w = next(t for t in g.tensors.values() if t.data is not None and t.data.size > 1)
    data = np.array(w.data).copy()
    data.flat[0] = data.flat[0] + 1 if data.flat[0] < 100 else data.flat[0] - 1
    changed = g.replace(tensors={**g.tensors, w.name: Tensor(w.name, w.shape, w.dtype, data,
                                                             w.quant)})
    api.patch_first_stage(changed, m4, 10.0)
    assert len(calls) == 3
