"""Golden tests under AddressSanitizer with the arena's red-zones (codegen_c/arena_check.py).

The checked build (generate(arena_check=True), built with -fsanitize=address,undefined and
-DMCUFORGE_ARENA_CHECK) pads every buffer of the plan with a red-zone and, before each node,
leaves unpoisoned only that node's inputs, outputs and kernel scratch, with the red-zones of
every live buffer poisoned. Models run through it must give their reference's outputs bit for
bit (tflite-micro / LiteRT for TFLite, onnxruntime for ONNX) with no sanitizer report; and the
net must catch what it is for: a plan with an offset shifted into a live neighbour (fed past
the static checker), a kernel writing one byte past its output, a kernel reading a dead
tensor.
"""
from __future__ import annotations

import re
import subprocess
import zlib
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

import op_models
from conftest import MLPERF_INT8, REPO, mlperf_model, require, require_tflm
from mcuforge import api, runner
from mcuforge.build import build, run_executable
from mcuforge.codegen_c import model as model_c
from mcuforge.codegen_c.arena_check import REDZONE
from mcuforge.frontend.tflite_writer import write_tflite
from mcuforge.ir.errors import BuildError
from mcuforge.optimizer.memory_plan import plan_graph
from mcuforge.optimizer.plan_check import check_plan
from mcuforge.optimizer.pipeline import optimize
from mcuforge.tools import conformance, conformance_tflite, fuzz, fuzz_gen, tflm

POISON = "AddressSanitizer: use-after-poison"


def _random(g, n: int, seed: int) -> list:
    """n random samples per graph input: the full integer range, or normal floats."""
    rng = np.random.default_rng(seed)
    out = []
    for name in g.inputs:
        t = g.tensors[name]
        if np.dtype(t.dtype).kind == "f":
            out.append(rng.normal(0, 1.5, (n, *t.shape)).astype(t.dtype))
        else:
            info = np.iinfo(t.dtype)
            out.append(rng.integers(info.min, info.max + 1, (n, *t.shape)).astype(t.dtype))
    return out


# ---- the MLPerf Tiny int8 models, streaming wakeword (state) included -------------------------

@pytest.mark.parametrize("stem", MLPERF_INT8)
def test_mlperf_bit_exact_with_tflm_under_the_arena_check(stem):
    require_tflm()
    path = mlperf_model(stem)
    g = api.load(path)
    [x] = _random(g, 4, zlib.crc32(stem.encode()))
    got = runner.run(path, x, check_arena=True)  # an ASan report fails the run
    ref = tflm.run(path.read_bytes(), [x])[0]
    assert got.dtype == ref.dtype and got.shape == ref.shape
    assert np.array_equal(got, ref), f"{int((got != ref).sum())} of {got.size} bytes differ"


# ---- single-operator TFLite models (tests/op_models.py), against tflite-micro ------------------

OP_CASES = op_models.all_cases()[::3]  # a third of them, every operator family


def test_op_models_bit_exact_with_tflm_under_the_arena_check():
    require_tflm()
    cases = []
    for name, graph in OP_CASES:
        model = write_tflite(graph)
        xs = _random(graph, 2, zlib.crc32(name.encode()))
        refs = [op_models.run_tflm(model, [x[k] for x in xs]) for k in range(2)]
        sets = [([x[k] for x in xs], [np.asarray(r) for r in refs[k]]) for k in range(2)]
        cases.append(conformance.Case(name, "tflite", model, sets, 0.0, 0.0, name, (), True))
    _passes(cases)


def _passes(cases: list) -> None:
    """Every case passes the conformance batch machinery's checked build."""
    results = []
    for i in range(0, len(cases), 16):
        results += conformance.run_batch(cases[i:i + 16], arena_check=True)
    bad = [f"{r.name}: {r.status} {r.reason}" for r in results if r.status != "passed"]
    assert not bad, "\n".join(bad)


# ---- the TFLite conformance tables: control flow, state, and one case per operator ------------

def _tflite_selection() -> list:
    """Every IF / WHILE and stateful case (variables, SVDF, LSTM), and the first case of each
    other operator of the conformance tables."""
    from mcuforge.tools.tflite_cases import all_cases
    picked, ops = [], set()
    for c in all_cases():
        special = c.name.startswith(("if_", "while_", "assign_variable_", "svdf_int8",
                                     "unidirectional_sequence_lstm_int8"))
        if special or c.op not in ops:
            picked.append(c)
            ops.add(c.op)
    return picked


SELECTION = _tflite_selection()
CHUNKS = 3  # parts run as tests of their own (pytest -n 2 spreads them)


def test_the_tflite_selection_covers_control_flow_state_and_reset():
    assert any(c.reset_at for c in SELECTION)
    assert any(c.name.startswith("if_") for c in SELECTION)
    assert any(c.name.startswith("while_") for c in SELECTION)
    assert any(c.name.startswith("svdf_int8") for c in SELECTION)


@pytest.mark.parametrize("part", range(CHUNKS))
def test_tflite_conformance_cases_under_the_arena_check(part):
    """As conformance_tflite.load_cases builds its cases, for the selection only."""
    require_tflm()
    from mcuforge.tools.tflite_cases import random_inputs
    cases = []
    for c in SELECTION[part::CHUNKS]:
        model, inputs = c.model(), random_inputs(c)
        refs = conformance_tflite.reference(c, model, inputs)
        sets = [([x[k] for x in inputs], [np.asarray(r[k]) for r in refs])
                for k in range(c.invocations)]
        cases.append(conformance.Case(c.name, "tflite", model, sets, 0.0, 0.0, c.op, (), True,
                                      c.reset_at))
    _passes(cases)


# ---- ONNX: exported models and fuzzed graphs, against onnxruntime -----------------------------

ONNX_MODELS = sorted((REPO / "tests" / "models").glob("*.onnx"))


@pytest.mark.parametrize("path", ONNX_MODELS, ids=[p.stem for p in ONNX_MODELS])
def test_onnx_models_match_onnxruntime_under_the_arena_check(path):
    ort = require("onnxruntime")
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    (inp,) = sess.get_inputs()
    shape = [d if isinstance(d, int) else 1 for d in inp.shape]
    x = np.random.default_rng(zlib.crc32(path.stem.encode())).standard_normal(
        (2, *shape)).astype(np.float32)
    ref = np.stack([sess.run(None, {inp.name: v})[0] for v in x])
    got = runner.run(str(path), x, check_arena=True)
    assert got.shape == ref.shape
    assert np.abs(got - ref).max() <= 1e-4 * np.abs(ref).max()


FUZZ_SEEDS = range(6)


@pytest.mark.parametrize("seed", FUZZ_SEEDS)
def test_fuzzed_float_graphs_match_onnxruntime_under_the_arena_check(seed):
    require("onnxruntime")
    g = fuzz_gen.make_model(seed, exclude=fuzz.KNOWN)
    want = fuzz_gen.ort_run(g.model, g.inputs)
    graph = api.load(g.model)
    got = runner.run(g.model, {n: np.asarray(g.inputs[n]) for n in graph.inputs},
                     check_arena=True)
    got = got if isinstance(got, dict) else {graph.outputs[0]: got}
    assert fuzz.compare_float(got, want, g.model, g.inputs) == ""


# ---- the net catches what it is for ----------------------------------------------------------

def _project(model, tmp_path: Path, edit=None) -> tuple:
    """A checked project of `model` compiled into tmp_path (no cache: the tests below change
    the compiler or the C), `edit(text) -> text` applied to model.c, then built."""
    r = api.compile(model, tmp_path / "proj", name="model", arena_check=True)
    if edit is not None:
        c = tmp_path / "proj" / "model.c"
        c.write_text(edit(c.read_text()))
    return r, build(r.out_dir, "model", check_arena=True)


def _run(r, exe, n: int = 2) -> list:
    return run_executable(exe, r.graph, _random(r.graph, n, 7))


def _kws():
    return mlperf_model("kws_ref_model")


def _step_layout(model):
    """The optimized graph and its checked plan, as generate() makes them."""
    gen = model_c.generate(optimize(api.load(model)), "model", arena_check=True)
    return gen.graph, gen.plan


def _live(plan, step: int) -> list:
    return [r for r in plan.requests if r.first <= step <= r.last]


def test_the_checked_build_runs_clean_and_the_default_output_has_no_check(tmp_path):
    """The control: the unedited checked project runs without a report (so the reports below
    come from the injected faults), and the default C has none of the check."""
    r, exe = _project(_kws(), tmp_path)
    _run(r, exe)
    default = model_c.generate(optimize(api.load(_kws())), "model")
    assert "ARENA_CHECK" not in default.files["model.c"] and default.plan.redzone == 0
    assert "MODEL_CHECK(" in r.out_dir.joinpath("model.c").read_text()


def shifted_into_a_live_neighbour(g, plan, skip=()) -> tuple:
    """(step i, node i's output X, an offset for X): the first X (not a graph output, not in
    `skip`) with a buffer Y live at step i, below X and not read by node i, moved down to start
    in Y's last 8 bytes (8-aligned), so that X's writes run over Y's red-zone."""
    for i, node in enumerate(g.nodes):
        x = node.outputs[0]
        if x not in plan.offsets or x in g.outputs or x in skip:
            continue
        below = [r for r in _live(plan, i) if r.name != x and r.name not in node.inputs
                 and plan.offsets[r.name] < plan.offsets[x] and r.size >= 8]
        if below:
            y = max(below, key=lambda r: plan.offsets[r.name])
            shifted = plan.offsets[y.name] + y.size - 8
            return i, x, shifted - shifted % 8
    raise AssertionError("no output with a live buffer below it")


def plan_with_offset(monkeypatch, x: str, offset: int) -> None:
    """generate's plans (model_c.plan_graph) with x at `offset`, fed past the static checker."""
    real = model_c.plan_graph

    def wrong(*args, **kwargs):
        p = real(*args, **kwargs)
        return replace(p, offsets={**p.offsets, x: offset})
    monkeypatch.setattr(model_c, "plan_graph", wrong)
    monkeypatch.setattr(model_c, "check_plan", lambda *a, **k: None)


def test_a_plan_shifted_into_a_live_neighbour_is_reported(tmp_path, monkeypatch):
    g, plan = _step_layout(_kws())
    i, x, shifted = shifted_into_a_live_neighbour(g, plan)
    plan_with_offset(monkeypatch, x, shifted)
    with pytest.raises(Exception):  # the static checker would have stopped it
        check_plan(g, replace(plan, offsets={**plan.offsets, x: shifted}))
    r, exe = _project(_kws(), tmp_path)
    with pytest.raises(BuildError, match=POISON):
        _run(r, exe)


def _call_line(text: str, kernel: str) -> str:
    [line] = [ln for ln in text.splitlines() if ln.strip().startswith(kernel + "(")]
    return line


def test_a_kernel_writing_one_byte_past_its_output_is_reported(tmp_path):
    g, plan = _step_layout(_kws())
    # the depthwise layer (second node): its output's first byte past the end, written from
    # inside its kernel function
    node = g.nodes[1]
    n = g.tensors[node.outputs[0]].nbytes

    def edit(text):
        m = re.search(r"MF_KERNEL static void (l01_\w+)\(([^)]*)\) \{\n", text)
        params = [p.strip() for p in m.group(2).split(",")]
        out = [p for p in params if not p.startswith("const")][0].split("*")[-1].strip()
        return text[:m.end()] + f"    {out}[{n}] = 0;\n" + text[m.end():]
    r, exe = _project(_kws(), tmp_path, edit)
    with pytest.raises(BuildError, match=POISON):
        _run(r, exe)
    # the same write one byte earlier, the output's last byte, is legal: no report
    r, exe = _project(_kws(), tmp_path / "ok", lambda t: edit(t).replace(f"[{n}] = 0;",
                                                                       f"[{n - 1}] = 0;"))
    _run(r, exe)


def test_a_kernel_reading_a_dead_tensor_is_reported(tmp_path):
    g, plan = _step_layout(_kws())
    # a late node reads, instead of its input, a tensor dead by then whose bytes no buffer of
    # that step holds
    ranges = {}
    for i, node in enumerate(g.nodes):
        live = [(plan.offsets[r.name], plan.offsets[r.name] + r.size) for r in _live(plan, i)]
        dead = [r for r in plan.requests if r.last < i and "/" not in r.name
                and not any(lo <= plan.offsets[r.name] < hi for lo, hi in live)]
        ins = [t for t in node.inputs if t in plan.offsets]
        if dead and ins and i >= 2:
            ranges = dict(step=i, input=ins[0], dead=dead[0].name)
            break
    assert ranges
    i, node = ranges["step"], g.nodes[ranges["step"]]
    good, bad = plan.offsets[ranges["input"]], plan.offsets[ranges["dead"]]

    def edit(text):
        kernel = re.search(rf"\b(l{i:02d}_\w+)\(\(const", text).group(1)
        line = _call_line(text, kernel)
        return text.replace(line, line.replace(f"&arena.bytes[{good}]", f"&arena.bytes[{bad}]",
                                               1))
    r, exe = _project(_kws(), tmp_path, edit)
    assert f"(const int8_t *)&arena.bytes[{bad}]" in r.out_dir.joinpath("model.c").read_text()
    with pytest.raises(BuildError, match=POISON):
        _run(r, exe)


def test_plan_with_redzones_keeps_them_free_and_passes_the_checker():
    """Every two buffers live at once are at least REDZONE bytes apart, every buffer 8-aligned,
    in the arena and in the state block (a variable's), and the checker accepts it."""
    from mcuforge.tools.tflite_cases import all_cases
    [var] = [c.model() for c in all_cases("assign_variable_int8_call_once_init")
             if c.name == "assign_variable_int8_call_once_init"]
    for model in (mlperf_model("kws_ref_model"), var):
        g = optimize(api.load(model))
        p = plan_graph(g, redzone=REDZONE)
        check_plan(g, p)
        for a in p.requests:
            oa = p.offsets[a.name]
            assert oa % 8 == 0
            for b in p.requests:
                if a is not b and a.first <= b.last and b.first <= a.last:
                    ob = p.offsets[b.name]
                    assert ob >= oa + a.size + REDZONE or oa >= ob + b.size + REDZONE
        assert p.arena_size >= max(p.offsets[r.name] + r.size + REDZONE for r in p.requests)
        # whole ASan granules: poisoning leaves a region's partial last granule addressable
        assert p.arena_size % 8 == 0 and p.state_size % 8 == 0
        states = sorted((o, g.tensors[t].nbytes) for t, o in p.state_offsets.items()
                        if t in g.state)
        assert all(o % 8 == 0 for o, _ in states)
        assert all(b[0] >= a[0] + a[1] + REDZONE for a, b in zip(states, states[1:]))
        assert plan_graph(g).redzone == 0


def test_cli_run_check_arena(tmp_path):
    require_tflm()
    path = mlperf_model("ad01_int8")
    [x] = _random(api.load(path), 2, 3)
    np.save(tmp_path / "in.npy", x)
    import sys
    subprocess.run([sys.executable, "-m", "mcuforge.cli", "run", str(path), "--input",
                    str(tmp_path / "in.npy"), "--output", str(tmp_path / "out.npy"),
                    "--check-arena"], check=True, capture_output=True, cwd=REPO)
    assert np.array_equal(np.load(tmp_path / "out.npy"), tflm.run(path.read_bytes(), [x])[0])


def test_a_kernel_writing_past_its_state_is_reported(tmp_path):
    """The state block has red-zones too: an SVDF kernel writing the byte after the state it
    updates in place. (The shared streaming wakeword model is the 30-frame window model: it
    has no state; this conformance case has.)"""
    from mcuforge.tools.tflite_cases import all_cases
    [case] = [c for c in all_cases("svdf_int8_rank1") if c.name == "svdf_int8_rank1"]
    model = case.model()
    g = optimize(api.load(model))
    [state] = g.state
    n = g.tensors[state].nbytes

    def edit(text, at=n):
        m = re.search(r"MF_KERNEL static void (l00_svdf\w*)\(([^)]*)\) \{\n", text)
        args = _call_line(text, m.group(1)).split("(", 1)[1].split(", ")
        [k] = [k for k, a in enumerate(args) if a.startswith("(int16_t *)&state.bytes[")]
        param = m.group(2).split(",")[k].split("*")[-1].strip()
        return text[:m.end()] + f"    ((uint8_t *){param})[{at}] = 0;\n" + text[m.end():]
    r, exe = _project(model, tmp_path, edit)
    with pytest.raises(BuildError, match=POISON):
        _run(r, exe)
    r, exe = _project(model, tmp_path / "ok", lambda t: edit(t, n - 1))  # its own last byte
    _run(r, exe)


def test_a_state_copy_from_a_dead_buffer_is_reported(tmp_path):
    """Accesses at constant addresses (the invoke's memcpy's, a control-flow condition) are
    checked too: the checked build reaches the arena and the state block through pointers,
    as ASan does not check a constant in-bounds offset into a static array."""
    from mcuforge.tools.tflite_cases import all_cases
    [case] = [c for c in all_cases("assign_variable_int8_call_once_init")
              if c.name == "assign_variable_int8_call_once_init"]
    model = case.model()

    def edit(text):  # the invoke's state copy reads a byte of the arena's last red-zone
        m = re.search(r"memcpy\(&state\.bytes\[(\d+)\], &arena\.bytes\[(\d+)\], (\d+)\);", text)
        size = int(re.search(r"MODEL_CHECK\(&arena\.bytes\[0\], (\d+),", text).group(1))
        return text.replace(m.group(0), f"memcpy(&state.bytes[{m.group(1)}], "
                                        f"&arena.bytes[{size - 16}], 1);")
    r, exe = _project(model, tmp_path, edit)
    with pytest.raises(BuildError, match=POISON):
        _run(r, exe)


def test_the_conformance_batches_really_run_the_check(monkeypatch):
    """The batch machinery the tests above use builds the check in: with no range left
    unpoisoned for a node, its case fails with ASan's report."""
    from mcuforge.codegen_c import arena_check
    name, graph = OP_CASES[0]
    model = write_tflite(graph)
    xs = _random(graph, 1, 0)
    sets = [([x[0] for x in xs], [np.asarray(r) for r in op_models.run_tflm(model,
                                                                            [x[0] for x in xs])])]
    case = conformance.Case(name, "tflite", model, sets, 0.0, 0.0, name, (), True)
    assert conformance.run_batch([case], arena_check=True)[0].status == "passed"
    monkeypatch.setattr(arena_check, "_operands", lambda *a: [])
    [r] = conformance.run_batch([case], arena_check=True)
    assert r.status == "failed" and "use-after-poison" in r.reason, r.reason
