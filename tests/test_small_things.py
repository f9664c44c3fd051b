"""Issue 12 item 10, small things: `make run` / `make size` on the host board, instructions
(not bare counter ticks) from `make run` on emulated boards, the build cache's location, cap and
`mcuforge cache`, the batch-size note printed once, a wheel built without setuptools warnings
about boards, bench's TFLM legend, --input-shape on bench and run --board."""
import os
import re
import subprocess
import sys

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from conftest import REPO, require, require_tools

PY = sys.executable


def cli(*args, cwd, env=None):
    """`python -m mcuforge.cli ARGS` in a subprocess, this worktree first on the path."""
    e = {**os.environ, "PYTHONPATH": str(REPO), **(env or {})}
    return subprocess.run([PY, "-m", "mcuforge.cli", *map(str, args)], cwd=cwd, env=e,
                          capture_output=True, text=True, timeout=300)


def matmul_model(batch="N") -> onnx.ModelProto:
    """y = relu(x @ W + b), x [batch, 4] float, W [4, 3]: an ONNX model written with onnx.helper.
    `batch` "N" leaves the batch dimension open (mcuforge sets it to 1 with a note)."""
    rng = np.random.default_rng(7)
    w = numpy_helper.from_array(rng.standard_normal((4, 3)).astype(np.float32), "W")
    b = numpy_helper.from_array(rng.standard_normal(3).astype(np.float32), "B")
    nodes = [helper.make_node("MatMul", ["x", "W"], ["m"]),
             helper.make_node("Add", ["m", "B"], ["a"]), helper.make_node("Relu", ["a"], ["y"])]
    g = helper.make_graph(nodes, "mm", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                      [batch, 4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, 3])],
                          [w, b])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8  # onnxruntime 1.31 reads IR versions up to 13
    return m


def ort_run(model: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    ort = require("onnxruntime")
    return ort.InferenceSession(model.SerializeToString()).run(None, {"x": x})[0]


def printed_outputs(text: str) -> list:
    """The values of the `output 0 ...: v v v` lines `make run` prints."""
    return [np.array(line.split(":", 1)[1].split(), np.float64)
            for line in text.splitlines() if line.startswith("output 0 ")]


# --- make run / make size on the host board -------------------------------------------------

def test_host_make_run_prints_the_outputs_of_the_built_in_input(tmp_path):
    from mcuforge.api import compile as compile_model
    model = matmul_model(batch=1)
    x = np.array([[0.5, -1.25, 2.0, 0.75]], np.float32)
    compile_model(model.SerializeToString(), tmp_path / "p", name="mm", vectors=[[x]])
    r = subprocess.run(["make", "-s", "-C", str(tmp_path / "p"), "run"], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    got = printed_outputs(r.stdout)
    assert len(got) == 1
    np.testing.assert_allclose(got[0], ort_run(model, x).reshape(-1), rtol=1e-6, atol=1e-6)
    # the latency says it is this computer's, in microseconds
    assert re.search(r"^host time: [0-9.]+ us per inference .*not the microcontroller",
                     r.stdout, re.M), r.stdout


def test_host_make_run_on_an_input_file_and_make_size(tmp_path):
    """IN.bin as the harness's comment and the Makefile document it: the inputs' raw bytes, one
    inference after another."""
    from mcuforge.api import compile as compile_model
    model = matmul_model(batch=1)
    xs = np.random.default_rng(1).standard_normal((3, 1, 4)).astype(np.float32)
    p = tmp_path / "p"
    compile_model(model.SerializeToString(), p, name="mm")
    (tmp_path / "x.bin").write_bytes(xs.tobytes())
    r = subprocess.run(["make", "-s", "-C", str(p), "run", f"IN={tmp_path / 'x.bin'}"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    got = printed_outputs(r.stdout)
    assert len(got) == 3
    for g, x in zip(got, xs):
        np.testing.assert_allclose(g, ort_run(model, x).reshape(-1), rtol=1e-6, atol=1e-6)
    for doc in ((p / "Makefile").read_text(), (p / "main.c").read_text()):
        assert "IN.bin OUT.bin" in doc and "MM_INPUTn_BYTES" in doc
    r = subprocess.run(["make", "-s", "-C", str(p), "size"], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    head, row = r.stdout.splitlines()[:2]
    assert head.split()[:3] == ["text", "data", "bss"]
    text, data, bss = map(int, row.split()[:3])
    # the binary holds the weights (12 + 3 floats, initialised data in flash-like .rodata) and
    # the arena in bss
    assert text > 60 and bss >= 0 and row.split()[-1] == "mm"


# --- instructions from an emulated board's `make run` ---------------------------------------

def test_emulated_make_run_prints_instructions_and_run_still_parses(tmp_path):
    require_tools("arm-none-eabi-gcc", "qemu-system-arm")
    from mcuforge.api import compile as compile_model
    from mcuforge.board import load_board
    from mcuforge.target import parse_output
    model = matmul_model(batch=1)
    x = np.array([[0.5, -1.25, 2.0, 0.75]], np.float32)
    p = tmp_path / "fw"
    res = compile_model(model.SerializeToString(), p, board="mps3-an547", name="mm",
                        vectors=[[x]])
    r = subprocess.run(["make", "-s", "-C", str(p), "run"], capture_output=True, text=True,
                       timeout=300)
    text = r.stdout + r.stderr  # QEMU's semihosting console is stderr
    assert r.returncode == 0, text
    m = re.search(r"^ticks (\d+) of the 32 MHz counter = (\d+) instructions \(under QEMU "
                  r"-icount\)$", text, re.M)
    assert m, text
    ticks, instr = int(m.group(1)), int(m.group(2))
    # QEMU -icount shift=0: 1 instruction per virtual ns; 32 MHz: 31.25 ns per tick
    assert instr == (ticks * 125 + 2) // 4
    outs, got_ticks, _ = parse_output(text, res.graph, load_board("mps3-an547"))
    assert got_ticks == [ticks]
    np.testing.assert_allclose(outs[0][0].reshape(-1), ort_run(model, x).reshape(-1),
                               rtol=1e-5, atol=1e-5)


# --- the batch-size note, once ----------------------------------------------------------------

@pytest.mark.parametrize("command", ["run", "compile", "info"])
def test_batch_note_prints_once(tmp_path, command):
    onnx.save(matmul_model("N"), tmp_path / "dyn.onnx")
    np.save(tmp_path / "x.npy", np.ones((1, 4), np.float32))
    args = {"run": ["--input", "x.npy", "--output", "y.npy"], "compile": ["-o", "out"],
            "info": []}[command]
    r = cli(command, "dyn.onnx", *args, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stderr.count("set to 1 (batch)") == 1, r.stderr


# --- the build cache: cap, info, clean --------------------------------------------------------

def _entry(root, key: str, nbytes: int, age: float):
    """A finished cache entry of `nbytes` bytes of data, last used `age` seconds ago."""
    from mcuforge.build import cache_entry

    def make(folder):
        folder.mkdir()
        (folder / "blob").write_bytes(bytes(nbytes))
    e = cache_entry(root / key, make)
    t = e.stat().st_mtime - age
    os.utime(e, (t, t))
    return e


def test_cache_cap_evicts_the_least_recently_used(tmp_path, monkeypatch):
    from mcuforge.build import cache_entries
    root = tmp_path / "cache"
    monkeypatch.setenv("MCUFORGE_CACHE", str(root))
    monkeypatch.setenv("MCUFORGE_CACHE_MAX", "10K")  # 10240 bytes: room for three 3000s
    old = _entry(root, "a" * 24, 3000, age=300)
    mid = _entry(root, "b" * 24, 3000, age=200)
    new = _entry(root, "c" * 24, 3000, age=100)
    assert {e for e, _, _ in cache_entries()} == {old, mid, new}
    # a hit is a use: `old` becomes the most recent, `mid` the least
    from mcuforge.build import cache_entry
    assert cache_entry(old, lambda f: pytest.fail("rebuilt a finished entry")) == old
    fourth = _entry(root, "d" * 24, 3000, age=0)
    left = {e for e, _, _ in cache_entries()}
    assert left == {old, new, fourth}, left
    assert sum(b for _, b, _ in cache_entries()) <= 10240
    # builds in progress in other processes (cache_entry's temporary sibling, write_files' own
    # temporary folder) are not entries: never removed, however old
    busy = [root / ("f" * 24 + ".tmp-999"), root / ".mcuforge-abc", root / "fw" / ".mcuforge-x"]
    for b in busy:
        b.mkdir(parents=True)
        (b / "half").write_bytes(bytes(5000))
        os.utime(b, (1, 1))
    # an entry larger than the cap alone stays (the run needs it); all others go
    big = _entry(root, "e" * 24, 20000, age=0)
    assert {e for e, _, _ in cache_entries()} == {big}
    assert all((b / "half").exists() for b in busy)


def test_cache_info_and_clean_from_the_command_line(tmp_path):
    root = tmp_path / "cache"
    env = {"MCUFORGE_CACHE": str(root)}
    onnx.save(matmul_model(1), tmp_path / "mm.onnx")
    np.save(tmp_path / "x.npy", np.ones((1, 4), np.float32))
    assert cli("run", "mm.onnx", "--input", "x.npy", "--output", "y.npy", cwd=tmp_path,
               env=env).returncode == 0
    r = cli("cache", "info", cwd=tmp_path, env=env)
    assert r.returncode == 0, r.stderr
    assert f"location: {root}" in r.stdout and "entries: 1 (1 host builds" in r.stdout
    size = int(re.search(r"size: ([0-9,]+) bytes", r.stdout).group(1).replace(",", ""))
    on_disk = sum(p.stat().st_size for p in root.rglob("*") if p.is_file()
                  and not p.name.endswith(".lock"))
    assert size == on_disk > 0
    r = cli("cache", "clean", cwd=tmp_path, env=env)
    assert r.returncode == 0, r.stderr
    assert "removed 1 entries" in r.stdout
    assert list(root.iterdir()) == []
    assert "entries: 0" in cli("cache", "info", cwd=tmp_path, env=env).stdout
    help_text = cli("cache", "--help", cwd=tmp_path).stdout
    assert "MCUFORGE_CACHE" in help_text and "~/.cache/mcuforge" in help_text \
        and "MCUFORGE_CACHE_MAX" in help_text


# --- bench's TFLM legend, --input-shape on bench and run --board --------------------------------

def test_board_bench_names_its_tflm_source_and_why_a_figure_is_missing(tmp_path):
    """An ONNX model with an open batch dimension, fixed by --input-shape (bench refused the
    option before); no TFLM+CMSIS-NN figure exists for it, and the table says why."""
    require_tools("arm-none-eabi-gcc", "qemu-system-arm")
    onnx.save(matmul_model("N"), tmp_path / "dyn.onnx")
    r = cli("bench", "dyn.onnx", "--board", "mps2-an386", "--input-shape", "x=1,4",
            cwd=tmp_path, env={"MCUFORGE_CACHE": str(tmp_path / "cache")})
    assert r.returncode == 0, r.stderr
    assert "set to 1 (batch)" not in r.stderr  # the shape given, no note
    table = r.stdout.split("\n\n")[0].splitlines()
    row = dict(zip(table[0].split(), table[1].split()))
    assert row["TFLM+CMSIS"] == "-" and row["MACs"] == "12"
    legend = " ".join(r.stdout.split("\n\n")[1].split())
    assert "tests/yardstick/" in legend and "sha256" in legend
    assert "no TFLM+CMSIS-NN figure for this model file (dyn.onnx)" in legend


def test_board_bench_a_recorded_model_has_its_figure_and_no_missing_line(tmp_path):
    require_tools("arm-none-eabi-gcc", "qemu-system-arm")
    from conftest import mlperf_model
    from mcuforge.tools.bench import bench, format_table
    model = mlperf_model("ad01_int8")
    rows = bench([str(model)], board="mps2-an386", with_tflm=False)
    # the figure recorded from tests/yardstick/ for this file (its sha256 prefix 87cf2419...)
    assert rows[0]["tflm_cmsis_instructions"] == 583_240
    assert rows[0]["tflm_cmsis_missing"] is None
    text = format_table(rows)
    assert "583,240" in text and "tests/yardstick/" in text and "TFLM+CMSIS -" not in text


def test_board_bench_without_simd_shows_tflm_reference_kernels(tmp_path):
    """On a core without DSP or Helium (the M3) a row carries TFLM's reference-kernel figure of
    the M4 (issue 13: KWS 43.0 M, IC 107.4 M, VWW 100.3 M, AD 1.95 M) and the table its ratio;
    the M4's rows do not (it has CMSIS-NN's)."""
    require_tools("arm-none-eabi-gcc", "qemu-system-arm")
    from conftest import mlperf_model
    from mcuforge.tools.bench import bench, format_table
    model = mlperf_model("ad01_int8")
    [row] = bench([str(model)], board="mps2-an385", with_tflm=False)
    assert row["tflm_reference_m4_instructions"] == 1_950_000
    head, line = format_table([row]).splitlines()[:2]
    assert "TFLM ref (M4)" in head and "1,950,000" in line
    assert f"{row['instructions'] / 1_950_000:.2f}" in line.split()
    [m4] = bench([str(model)], board="mps2-an386", with_tflm=False)
    assert "tflm_reference_m4_instructions" not in m4


def test_host_bench_legend_and_input_shape(tmp_path):
    onnx.save(matmul_model("N"), tmp_path / "dyn.onnx")
    r = cli("bench", "dyn.onnx", "--iterations", "2", "--input-shape", "x=1,4", cwd=tmp_path,
            env={"MCUFORGE_CACHE": str(tmp_path / "cache")})
    assert r.returncode == 0, r.stderr
    table, legend = r.stdout.split("\n\n")[:2]
    row = dict(zip(["model", "MACs", "arena", "RAM", "TFLM_arena"], table.splitlines()[1].split()))
    assert row["MACs"] == "12" and row["TFLM_arena"] == "-"  # an ONNX file: TFLM cannot run it
    assert "tflite-micro" in legend and "not a .tflite model" in " ".join(legend.split())


def test_run_on_a_board_takes_input_shape(tmp_path):
    require_tools("arm-none-eabi-gcc", "qemu-system-arm")
    model = matmul_model("N")
    onnx.save(model, tmp_path / "dyn.onnx")
    x = np.array([[0.5, -1.25, 2.0, 0.75]], np.float32)
    np.save(tmp_path / "x.npy", x)
    r = cli("run", "dyn.onnx", "--board", "mps2-an386", "--input-shape", "x=1,4",
            "--input", "x.npy", "--output", "y.npy", cwd=tmp_path,
            env={"MCUFORGE_CACHE": str(tmp_path / "cache")})
    assert r.returncode == 0, r.stderr
    np.testing.assert_allclose(np.load(tmp_path / "y.npy"), ort_run(model, x), rtol=1e-5,
                               atol=1e-5)


# --- the wheel: no setuptools warnings about the data folders, the boards' files inside ---------

def test_wheel_builds_without_package_warnings_and_holds_the_boards(tmp_path):
    import shutil
    import zipfile
    src = tmp_path / "src"
    shutil.copytree(REPO, src, ignore=shutil.ignore_patterns(
        ".venv", ".git", "build", "dist", "*.egg-info", "__pycache__", ".pytest_cache", "tests"))
    base = [PY, "-m", "pip", "wheel", "--no-deps", "-v", "-w", str(tmp_path / "dist"), str(src)]
    r = subprocess.run(base[:4] + ["--no-build-isolation"] + base[4:], capture_output=True,
                       text=True, timeout=600)
    if r.returncode != 0:  # this venv's setuptools is older than pyproject.toml asks
        r = subprocess.run(base, capture_output=True, text=True, timeout=600)
    log = r.stdout + r.stderr
    assert r.returncode == 0, log[-3000:]
    absent = sorted(set(re.findall(r"Package '([^']+)' is absent", log)))
    assert absent == [], f"setuptools warns about {absent}"
    (wheel,) = (tmp_path / "dist").glob("mcuforge-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    # (the layers install as mcuforge.<layer>: boards/ is mcuforge/boards/ in the wheel)
    boards = {"mcuforge/" + p.relative_to(src).as_posix() for p in (src / "boards").rglob("*")
              if p.is_file() and "__pycache__" not in p.parts}
    assert len(boards) > 10 and boards - names == set(), sorted(boards - names)
    templates = {"mcuforge/" + p.relative_to(src).as_posix()
                 for p in (src / "templates").rglob("*.j2")}
    assert templates - names == set(), sorted(templates - names)


def test_a_real_boards_firmware_says_cycles_not_instructions(tmp_path):
    """Not emulated: the counter ticks are processor cycles at the board's clock; no instruction
    figure is claimed (QEMU's one instruction per ns does not hold on silicon)."""
    from mcuforge.api import compile as compile_model
    from mcuforge.board import load_board
    b = load_board("nucleo-l4r5zi")
    compile_model(matmul_model(1).SerializeToString(), tmp_path / "fw", board=b.name, name="mm")
    main = (tmp_path / "fw" / "main.c").read_text()
    assert f'mf_puts(" processor cycles at {b.clock_hz / 1e6:g} MHz' in main
    assert "instructions" not in main.split("int main(void)")[1]


def test_tick_ratio_is_one_ghz_over_the_clock():
    """The firmware converts ticks by num / 2^shift (no 64-bit division): that is exactly
    1e9 / clock_hz where the denominator is a power of two, and None elsewhere."""
    from fractions import Fraction
    from mcuforge.board import Board
    for hz, want in ((25_000_000, (40, 0)), (32_000_000, (125, 2)), (64_000_000, (125, 3)),
                     (120_000_000, None), (16_000_000, (125, 1))):
        b = Board(name="x", description="", family="cortex_m", cpu="cortex-m4", clock_hz=hz)
        got = b.tick_ratio()
        assert got == want, (hz, got)
        if got:
            assert Fraction(got[0], 2 ** got[1]) == Fraction(10 ** 9, hz)
