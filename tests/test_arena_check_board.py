"""The arena check on the emulated boards (codegen_c/arena_check.py, plain C, no ASan).

The in-place plans of the M55 (Helium kernels), M3 and RV32 (scalar kernels) use kernels that
only compile for their targets, so AddressSanitizer never sees them (tests/test_arena_redzone.py
checks the host's). Built with CHECK_ARENA=1, the firmware fills the arena with a pattern at
the start of each invoke, fills the red-zones of the buffers live at each step before it and
compares them after it (a changed byte is printed as "arena-check <layer> <offset>", which
`mcuforge run` turns into target.ArenaCheckError), and overwrites the buffers read for the
last time with the pattern, so a kernel reading a dead tensor changes the outputs.

Checked here: the MLPerf Tiny models run under the check on the three boards bit-exact with
tflite-micro and with no report; and the check catches, on QEMU mps3-an547, what it is for (a
plan shifted into a live neighbour, a kernel writing one byte past its output, a kernel
reading a tensor the plan holds dead), each fault silent in the same project built with
CHECK_ARENA=0.
"""
from __future__ import annotations

import re
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from test_arena_redzone import plan_with_offset, shifted_into_a_live_neighbour
from conftest import MLPERF_INT8, REPO, mlperf_model, require_tflm, require_tools
from mcuforge import api, runner, target
from mcuforge.board import load_board
from mcuforge.codegen_c import model as model_c
from mcuforge.ir.errors import McuforgeError
from mcuforge.optimizer.pipeline import optimize
from mcuforge.tools import tflm

BOARDS = {"mps3-an547": "qemu-system-arm", "mps2-an385": "qemu-system-arm",
          "riscv32-virt": "qemu-system-riscv32"}
FAULT_BOARD = "mps3-an547"  # the Helium kernels' in-place plans


def _inputs(path: Path, seed: int = 5) -> np.ndarray:
    """Two inputs: the full int8 range, and near the zero point (outputs sensitive to every
    layer)."""
    g = api.load(path)
    t = g.tensors[g.inputs[0]]
    zp = int(t.quant.zero_point[0])
    rng = np.random.default_rng(seed)
    return np.stack([rng.integers(-128, 128, size=t.shape),
                     np.clip(zp + rng.integers(-25, 26, size=t.shape), -128, 127)]
                    ).astype(t.dtype)


# ---- the MLPerf Tiny models under the check, on each board ------------------------------------

@pytest.mark.parametrize("board", list(BOARDS))
@pytest.mark.parametrize("stem", MLPERF_INT8)
def test_mlperf_bit_exact_with_tflm_under_the_check_on_the_board(stem, board):
    require_tflm()
    require_tools(BOARDS[board])
    path = mlperf_model(stem)
    x = _inputs(path)
    run = target.run_on_board(path, [x], board, check_arena=True)  # a report raises
    ref = tflm.run(path.read_bytes(), [x])[0]
    [got] = run.outputs
    assert got.dtype == ref.dtype and got.shape == ref.shape
    assert np.array_equal(got, ref), f"{int((got != ref).sum())} of {got.size} bytes differ"
    # the check was compiled in: its report function is in the firmware
    assert "mf_arena_violation" in _symbols(board, run.elf)


def _symbols(board: str, elf: Path) -> str:
    nm = load_board(board).cross + "nm"
    return subprocess.run([nm, str(elf)], capture_output=True, text=True, check=True).stdout


def test_memory_priority_bands_under_the_check_on_the_board():
    """--memory-priority: ResNet-8's first stage in bands of rows, each band's output a view
    written over the bytes of its input already read (memory_plan.overlay_links); only the
    band's own bytes count as written at its step. Bit-exact, nothing reported."""
    require_tflm()
    require_tools(BOARDS[FAULT_BOARD])
    path = mlperf_model("pretrainedResnet_quant")
    x = _inputs(path)[:1]
    got = runner.run(path, x, board=FAULT_BOARD, check_arena=True, memory_priority=10.0)
    assert np.array_equal(got, tflm.run(path.read_bytes(), [x])[0])


# ---- control flow: a node's step runs its subgraphs' steps -----------------------------------

CONTROL_FLOW = ["if_int8_constant_operand", "while_int8_accumulate", "while_float32_nested_if"]


@pytest.mark.parametrize("name", CONTROL_FLOW)
def test_control_flow_under_the_check_on_the_board(name):
    """If / while nodes: the subgraphs' steps run inside the node's step, each with its own
    sums of the buffers it must not change; the outputs are tflite-micro's (LiteRT's for
    float) and nothing is reported."""
    require_tflm()
    require_tools("qemu-system-arm")
    from mcuforge.tools import conformance_tflite
    from mcuforge.tools.tflite_cases import all_cases, random_inputs
    [c] = [c for c in all_cases() if c.name == name]
    model, inputs = c.model(), random_inputs(c)
    refs = conformance_tflite.reference(c, model, inputs)
    got = runner.run(model, list(inputs), board="mps2-an385", check_arena=True)
    got = list(got.values()) if isinstance(got, dict) else [got]
    for g, ref in zip(got, refs):
        ref = np.asarray(ref)
        assert g.shape == ref.shape and g.dtype == ref.dtype
        if ref.dtype.kind == "f":
            np.testing.assert_allclose(g, ref, rtol=1e-5, atol=1e-5)
        else:
            assert np.array_equal(g, ref)


# ---- faults: caught with CHECK_ARENA=1, silent with CHECK_ARENA=0 -----------------------------

def _kws():
    return mlperf_model("kws_ref_model")


def _layout(model, board: str = FAULT_BOARD):
    """The optimized graph and the checked plan of the board, as generate() makes them."""
    gen = model_c.generate(optimize(api.load(model)), "model",
                           load_board(board).target(None), arena_check=True)
    return gen.graph, gen.plan


def _project(model, x, workdir: Path, edit=None, keep_input: bool = False):
    """The checked firmware project of `model` with inputs x built in (no cache: the tests
    patch the compiler or edit the C), `edit(text) -> text` applied to model.c."""
    r = api.compile(model, workdir, board=FAULT_BOARD, name="model", vectors=[[v] for v in x],
                    arena_check=True, keep_input=keep_input)
    if edit is not None:
        c = workdir / "model.c"
        c.write_text(edit(c.read_text()))
    return r


def _run(r, check: bool) -> tuple:
    """(report lines, outputs) of the project built with CHECK_ARENA=1 or 0 and run."""
    board = load_board(FAULT_BOARD)
    m = subprocess.run(["make", "-s", "-C", str(r.out_dir), f"CHECK_ARENA={int(check)}"],
                       capture_output=True, text=True)
    assert m.returncode == 0, m.stdout + m.stderr
    elf = r.out_dir / "model.elf"
    if not check:  # compiled out: none of the check's code in the firmware
        assert "mf_arena_violation" not in _symbols(FAULT_BOARD, elf)
    text = target.run_elf(board, elf)
    reports = [ln for ln in text.splitlines() if ln.startswith("arena-check ")]
    outs, _, _ = target.parse_output(text, r.graph, board)
    return reports, outs[0]


def _live(plan, step: int) -> list:
    return [q for q in plan.requests if q.first <= step <= q.last]


def test_the_checked_firmware_runs_clean_and_the_default_output_has_no_check(tmp_path):
    """The control: the unedited checked project reports nothing and is bit-exact (so the
    reports below come from the injected faults); the default C has none of the check."""
    require_tools(BOARDS[FAULT_BOARD])
    x = _inputs(_kws())
    r = _project(_kws(), x, tmp_path)
    ref = tflm.run(_kws().read_bytes(), [x])[0]
    for check in (True, False):
        reports, got = _run(r, check)
        assert reports == [] and np.array_equal(got, ref)
    default = model_c.generate(optimize(api.load(_kws())), "model",
                               load_board(FAULT_BOARD).target(None))
    assert "ARENA_CHECK" not in default.files["model.c"] and default.plan.redzone == 0


def test_a_plan_shifted_into_a_live_neighbour_is_reported(tmp_path, monkeypatch):
    require_tools(BOARDS[FAULT_BOARD])
    model = mlperf_model("pretrainedResnet_quant")  # a residual branch: buffers live across
    g, plan = _layout(model)
    # a node's output X and a buffer Y live at X's first step, below X and not read by the
    # node (the residual input, live while the branch runs): X moved down so that it starts
    # in Y's last 8 bytes, its writes run over Y's red-zone
    i, x, shifted = shifted_into_a_live_neighbour(g, plan, skip=plan.in_place)
    plan_with_offset(monkeypatch, x, shifted)
    xs = _inputs(model)
    r = _project(model, xs, tmp_path)
    layer = f"l{i:02d}_{g.nodes[i].op}_"
    reports, _ = _run(r, True)
    assert reports and reports[0].split()[1].startswith(layer), reports
    # as mcuforge run reports it: the layer and the red-zone's buffer named
    with pytest.raises(target.ArenaCheckError, match=rf"layer {layer}\w* changed arena byte"):
        target.check_violations("\n".join(reports), r)
    assert _run(r, False)[0] == []  # compiled out: no report


def _kernel_edit(text: str, i: int, at: int) -> str:
    """The kernel function of layer i flips its output's byte `at` as it starts."""
    m = re.search(rf"MF_KERNEL static void (l{i:02d}_\w+)\(([^)]*)\) \{{\n", text)
    params = [p.strip() for p in m.group(2).split(",")]
    out = [p for p in params if not p.startswith("const")][0].split("*")[-1].strip()
    return text[:m.end()] + f"    ((uint8_t *){out})[{at}] ^= 1u;\n" + text[m.end():]


def test_a_kernel_writing_one_byte_past_its_output_is_reported(tmp_path):
    require_tools(BOARDS[FAULT_BOARD])
    g, plan = _layout(_kws())
    # a layer whose output's red-zone is checked at its step: not written over an input
    # that still lies there (in place), the red-zone inside no buffer the step reads
    picked = None
    for i, node in enumerate(g.nodes):
        y = node.outputs[0]
        if y not in plan.offsets or y in plan.in_place or i == len(g.nodes) - 1:
            continue
        z = plan.offsets[y] + g.tensors[y].nbytes
        if not any(q.name != y and plan.offsets[q.name] < z + plan.redzone
                   and z < plan.offsets[q.name] + q.size for q in _live(plan, i)):
            picked = (i, g.tensors[y].nbytes)
            break
    assert picked
    i, n = picked
    xs = _inputs(_kws())
    ref = tflm.run(_kws().read_bytes(), [xs])[0]
    r = _project(_kws(), xs, tmp_path, lambda t: _kernel_edit(t, i, n))
    reports, got = _run(r, True)
    assert reports and reports[0].split()[1].startswith(f"l{i:02d}_"), reports
    with pytest.raises(target.ArenaCheckError, match=rf"layer l{i:02d}_\w+ changed arena byte "
                                                     rf"{plan.offsets[node_out(g, i)] + n} "
                                                     rf"\(the red-zone after"):
        target.check_violations("\n".join(reports), r)
    # compiled out: no report, and the byte it changes is nobody's (the outputs are right)
    reports, got = _run(r, False)
    assert reports == [] and np.array_equal(got, ref)
    # the same write one byte earlier, the output's own last byte (which the kernel then
    # writes), is legal: no report
    r = _project(_kws(), xs, tmp_path / "ok", lambda t: _kernel_edit(t, i, n - 1))
    reports, got = _run(r, True)
    assert reports == [] and np.array_equal(got, ref)


def node_out(g, i: int) -> str:
    return g.nodes[i].outputs[0]


def test_a_kernel_reading_a_dead_tensor_changes_the_outputs(tmp_path, monkeypatch):
    """A plan that holds a tensor dead one step before its last reader (its bytes untouched by
    any other buffer, so without the check the kernel still finds its values): under the
    check the bytes are overwritten after their 'last' reader and the outputs differ from
    tflite-micro's; built with CHECK_ARENA=0 the same C is bit-exact."""
    require_tflm()
    require_tools(BOARDS[FAULT_BOARD])
    g, plan = _layout(_kws())
    # the input of a middle layer, written at an earlier step
    mid = len(g.nodes) // 2
    [t] = [q.name for q in plan.requests if q.last == mid and q.first < mid
           and q.name in g.nodes[mid].inputs][:1]
    real = model_c.plan_graph

    def early(*args, **kwargs):
        p = real(*args, **kwargs)
        return replace(p, requests=tuple(replace(q, last=q.last - 1) if q.name == t else q
                                         for q in p.requests))
    monkeypatch.setattr(model_c, "plan_graph", early)
    monkeypatch.setattr(model_c, "check_plan", lambda *a, **k: None)
    xs = _inputs(_kws())
    ref = tflm.run(_kws().read_bytes(), [xs])[0]
    r = _project(_kws(), xs, tmp_path)
    reports, got = _run(r, True)
    assert not np.array_equal(got, ref)
    reports, got = _run(r, False)
    assert reports == [] and np.array_equal(got, ref)


def test_a_layer_changing_a_live_buffer_it_does_not_own_is_reported(tmp_path):
    """With --keep-input the input buffer stays live to the end, read by the first layer
    only: a later layer changing one of its bytes leaves the outputs right (so the bit-exact
    comparison misses it), and the check reports it by the layer and the buffer."""
    require_tflm()
    require_tools(BOARDS[FAULT_BOARD])
    xs = _inputs(_kws())
    ref = tflm.run(_kws().read_bytes(), [xs])[0]
    r = _project(_kws(), xs, tmp_path, keep_input=True)
    [name] = r.graph.inputs
    at = r.plan.offsets[name] + 5
    i = 3  # a middle layer, which does not read the input
    assert name not in r.graph.nodes[i].inputs and r.plan.requests

    def edit(text):
        kernel = re.search(rf"\b(l{i:02d}_\w+)\(\(const", text).group(1)
        [line] = [ln for ln in text.splitlines() if ln.strip().startswith(kernel + "(")]
        return text.replace(line, f"    arena.bytes[{at}] ^= 1u;\n{line}")
    r = _project(_kws(), xs, tmp_path / "bad", edit, keep_input=True)
    reports, got = _run(r, True)
    assert reports and reports[0].split()[1].startswith(f"l{i:02d}_"), reports
    assert np.array_equal(got, ref)
    with pytest.raises(target.ArenaCheckError, match=rf"layer l{i:02d}_\w+ changed arena byte "
                                                     rf"{r.plan.offsets[name]} \(in '{name}'"):
        target.check_violations("\n".join(reports), r)
    reports, got = _run(r, False)
    assert reports == [] and np.array_equal(got, ref)


def test_a_kernel_writing_past_its_state_is_reported(tmp_path):
    """The state block's bytes outside its tensors are watched too: an SVDF kernel writing
    the byte after the state it updates in place (this conformance case has state; the
    shared streaming wakeword model has none)."""
    require_tools(BOARDS[FAULT_BOARD])
    from mcuforge.tools.tflite_cases import all_cases, random_inputs
    [case] = [c for c in all_cases("svdf_int8_rank1") if c.name == "svdf_int8_rank1"]
    model = case.model()
    g = optimize(api.load(model))
    [state] = g.state
    n = g.tensors[state].nbytes
    [x] = random_inputs(case)

    def edit(text, at=n):
        m = re.search(r"MF_KERNEL static void (l00_svdf\w*)\(([^)]*)\) \{\n", text)
        [call] = [ln for ln in text.splitlines() if ln.strip().startswith(m.group(1) + "(")]
        args = call.split("(", 1)[1].split(", ")
        [k] = [k for k, a in enumerate(args) if "&state.bytes[" in a and "const" not in a]
        param = m.group(2).split(",")[k].split("*")[-1].strip()
        return text[:m.end()] + f"    ((uint8_t *){param})[{at}] ^= 1u;\n" + text[m.end():]
    r = _project(model, x, tmp_path, edit)
    reports, _ = _run(r, True)
    assert reports and reports[0].split()[1].startswith("l00_svdf"), reports
    with pytest.raises(target.ArenaCheckError, match=rf"changed state block byte "
                                                     rf"{r.plan.state_offsets[state] + n} "):
        target.check_violations("\n".join(reports), r)
    assert _run(r, False)[0] == []
    r = _project(model, x, tmp_path / "ok", lambda t: edit(t, n - 1))  # its own last byte
    assert _run(r, True)[0] == []


def test_a_report_names_the_byte_at_its_own_step():
    """check_violations reads the step from the layer's name (l<step>_...; l00..l99, then
    l100...): two buffers on the same bytes at steps 0..5 and 100..101, a report of layer
    l100_ names the one live at step 100 (read as step 10 it named none); a report line cut
    short (the firmware stopped mid-line) is still a failure, not a traceback."""
    from types import SimpleNamespace

    from mcuforge.optimizer.memory_plan import Request
    plan = SimpleNamespace(requests=(Request("a", 64, 0, 5), Request("b", 64, 100, 101)),
                           offsets={"a": 0, "b": 0}, redzone=8, state_offsets={})
    result = SimpleNamespace(plan=plan)
    with pytest.raises(target.ArenaCheckError, match=r"layer l100_add_y changed arena byte 10 "
                                                     r"\(in 'b', live"):
        target.check_violations("arena-check l100_add_y 10\n", result)
    with pytest.raises(target.ArenaCheckError, match=r"arena byte 70 \(the red-zone after 'a'"):
        target.check_violations("arena-check l05_add_y 70\n", result)
    with pytest.raises(target.ArenaCheckError, match="reported: arena-check l07_add"):
        target.check_violations("arena-check l07_add\n", result)


# ---- the command line ------------------------------------------------------------------------

def test_cli_run_check_arena_on_an_emulated_board(tmp_path):
    require_tflm()
    require_tools("qemu-system-arm")
    path = mlperf_model("ad01_int8")
    x = _inputs(path)
    np.save(tmp_path / "in.npy", x)
    subprocess.run([sys.executable, "-m", "mcuforge.cli", "run", str(path), "--board",
                    "mps2-an385", "--input", str(tmp_path / "in.npy"), "--output",
                    str(tmp_path / "out.npy"), "--check-arena"], check=True,
                   capture_output=True, cwd=REPO)
    assert np.array_equal(np.load(tmp_path / "out.npy"), tflm.run(path.read_bytes(), [x])[0])


def test_check_arena_on_a_board_it_cannot_run_on_is_one_clear_error(tmp_path):
    path = mlperf_model("ad01_int8")
    x = _inputs(path)
    with pytest.raises(McuforgeError, match="emulated boards .* not on nucleo-l4r5zi"):
        runner.run(path, x, board="nucleo-l4r5zi", check_arena=True)
    np.save(tmp_path / "in.npy", x)
    r = subprocess.run([sys.executable, "-m", "mcuforge.cli", "run", str(path), "--board",
                        "nucleo-l4r5zi", "--port", "/dev/null", "--input",
                        str(tmp_path / "in.npy"), "--output", str(tmp_path / "out.npy"),
                        "--check-arena"], capture_output=True, text=True, cwd=REPO)
    assert r.returncode == 2 and "mcuforge: error: --check-arena" in r.stderr
    assert "Traceback" not in r.stderr
