"""The `mcuforge` console script on bad input: every mistake a user can make exits with status 2
and one "mcuforge: error: ..." line naming the problem, no traceback, and no files left behind.
Also: every command's --help says what it does."""
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest

from mcuforge.tools.demo import INPUT_SHAPE, demo_tflite_bytes
from test_frontend_tflite import T, build

SCRIPT = Path(sys.executable).parent / "mcuforge"
COMMANDS = ("compile", "run", "info", "bench", "demo")


def mcuforge(*args, cwd, module=False):
    """Run the installed console script (or `python -m mcuforge.cli`) in `cwd`."""
    exe = [sys.executable, "-m", "mcuforge.cli"] if module or not SCRIPT.exists() else [SCRIPT]
    return subprocess.run([*exe, *map(str, args)], cwd=cwd, capture_output=True, text=True,
                          env=os.environ.copy(), timeout=120)


def assert_user_error(r, *fragments):
    """Exit status 2, one error message naming the problem, no traceback, nothing on stdout."""
    out = f"stdout:\n{r.stdout}\nstderr:\n{r.stderr}"
    assert r.returncode == 2, out
    assert "Traceback" not in r.stderr and "Traceback" not in r.stdout, out
    assert r.stderr.startswith("mcuforge: error: ") and r.stderr.count("error:") == 1, out
    assert r.stdout == "", out
    for f in fragments:
        assert f in r.stderr, f"{f!r} not in the message\n{out}"


def unsupported_ops_model() -> bytes:
    q = dict(scale=[0.5], zp=[0])
    return build([T("x", [1, 4], **q), T("s", [1, 4], **q), T("e", [1, 4], **q)],
                 [("SKIP_GRAM", [0], [1]), ("HASHTABLE_LOOKUP", [1], [2])], [0], [2])


@pytest.fixture(scope="module")
def demo_bytes():
    return demo_tflite_bytes()


# (model file content or None for no file, extra arguments, fragments of the message)
CASES = {
    "unsupported_ops": (unsupported_ops_model, (), (
        "model.tflite", "2 unsupported operator", "SKIP_GRAM", "HASHTABLE_LOOKUP", "supported TFLite operators")),
    "truncated": (lambda: demo_tflite_bytes()[:len(demo_tflite_bytes()) // 2], (),
                  ("truncated", "model.tflite")),
    "text_file": (lambda: b"this is a text file, not a model\n", (),
                  ("model.tflite", "unrecognised model format")),
    "empty_file": (lambda: b"", (), ("model.tflite", "empty")),
    "missing_file": (None, (), ("model file not found", "model.tflite")),
    "unknown_board": (demo_tflite_bytes, ("--board", "esp99"), ("unknown board 'esp99'", "host")),
    "bad_name": (demo_tflite_bytes, ("--name", "3-bad name"),
                 ("--name '3-bad name'", "not a C identifier")),
    "empty_name": (demo_tflite_bytes, ("--name", ""), ("--name ''", "not a C identifier")),
    # the model's name.c/.h and executable `name` would overwrite main.c, mcuforge_rt.h or
    # the Makefile, or shadow `make clean`
    "name_main": (demo_tflite_bytes, ("--name", "main"), ("--name 'main'", "clashes")),
    "name_runtime": (demo_tflite_bytes, ("--name", "mcuforge_rt"), ("clashes",)),
    "name_makefile": (demo_tflite_bytes, ("--name", "Makefile"), ("clashes",)),
    "name_clean": (demo_tflite_bytes, ("--name", "clean"), ("clashes",)),
}


@pytest.mark.parametrize("case", CASES)
def test_compile_error_exits_2_and_leaves_nothing(case, tmp_path):
    make, extra, fragments = CASES[case]
    if make is not None:
        (tmp_path / "model.tflite").write_bytes(make())
    before = sorted(os.listdir(tmp_path))
    r = mcuforge("compile", "model.tflite", "-o", "out", *extra, cwd=tmp_path)
    assert_user_error(r, *fragments)
    assert not (tmp_path / "out").exists()
    assert sorted(os.listdir(tmp_path)) == before  # no stray .mcuforge-* temporary directory


def test_compile_error_via_python_m_and_a_nested_output_dir(tmp_path):
    (tmp_path / "model.tflite").write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(64))
    r = mcuforge("compile", "model.tflite", "-o", tmp_path / "a" / "b", cwd=tmp_path,
                 module=True)
    assert_user_error(r, "unrecognised model format", "model.tflite")
    assert sorted(os.listdir(tmp_path)) == ["model.tflite"]


def test_output_path_that_is_a_file(tmp_path, demo_bytes):
    (tmp_path / "model.tflite").write_bytes(demo_bytes)
    (tmp_path / "taken").write_text("keep me\n")
    for out in ("taken", "taken/sub"):
        r = mcuforge("compile", "model.tflite", "-o", out, cwd=tmp_path)
        assert_user_error(r, "cannot write the C project", out)
        assert sorted(os.listdir(tmp_path)) == ["model.tflite", "taken"]
        assert (tmp_path / "taken").read_text() == "keep me\n"


def test_compile_succeeds_with_the_same_setup(tmp_path, demo_bytes):
    """The control for the cases above: a good model and name do give a project."""
    (tmp_path / "model.tflite").write_bytes(demo_bytes)
    r = mcuforge("compile", "model.tflite", "-o", "out", "--name", "main_net", cwd=tmp_path)
    assert r.returncode == 0 and r.stderr == "", r.stdout + r.stderr
    assert sorted(os.listdir(tmp_path / "out")) == [
        ".mcuforge-manifest", "Makefile", "main.c", "main_net.c", "main_net.h", "mcuforge_ew.h",
        "mcuforge_nn.h", "mcuforge_rt.h", "mcuforge_vec.h"]
    assert sorted(os.listdir(tmp_path)) == ["model.tflite", "out"]


@pytest.mark.parametrize("command", ["info", "run", "bench"])
def test_other_commands_report_bad_models(command, tmp_path):
    (tmp_path / "half.tflite").write_bytes(demo_tflite_bytes()[:1000])
    np.save(tmp_path / "x.npy", np.zeros(INPUT_SHAPE, np.int8))
    extra = {"run": ("--input", "x.npy", "--output", "y.npy"), "bench": ("--no-tflm",)}
    for model, fragment in (("half.tflite", "truncated"), ("gone.tflite", "not found")):
        r = mcuforge(command, model, *extra.get(command, ()), cwd=tmp_path)
        if command == "bench":  # bench reports progress on stderr before the error
            assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
            assert r.stderr.count("mcuforge: error: ") == 1 and fragment in r.stderr
        else:
            assert_user_error(r, fragment, model)
    assert not (tmp_path / "y.npy").exists()


# ---------------------------------------------------------------------------------------------
# mcuforge run: inputs that do not fit the model


@pytest.fixture
def run_dir(tmp_path, demo_bytes):
    (tmp_path / "demo.tflite").write_bytes(demo_bytes)
    return tmp_path


SHAPE_TEXT = "(1, 16, 16, 3)"
assert INPUT_SHAPE == (1, 16, 16, 3)


@pytest.mark.parametrize("name,array,fragments", [
    ("wrong_dtype", np.zeros(INPUT_SHAPE, np.float32), ("input 'input'", "int8", "float32")),
    ("wrong_shape", np.zeros((1, 8, 8, 3), np.int8), ("input 'input'", SHAPE_TEXT, "(1, 8, 8, 3)")),
    ("wrong_batch_shape", np.zeros((4, 16, 16, 3), np.int8), (SHAPE_TEXT,)),
    ("empty_batch", np.zeros((0, *INPUT_SHAPE), np.int8), ("empty",)),
])
def test_run_rejects_inputs_that_do_not_fit(name, array, fragments, run_dir):
    np.save(run_dir / "x.npy", array)
    r = mcuforge("run", "demo.tflite", "--input", "x.npy", "--output", "y.npy", cwd=run_dir)
    assert_user_error(r, *fragments)
    assert not (run_dir / "y.npy").exists()


def test_run_rejects_bad_input_and_output_files(run_dir):
    (run_dir / "text.npy").write_text("1 2 3\n")
    np.savez(run_dir / "wrong_key.npz", image=np.zeros(INPUT_SHAPE, np.int8))
    np.save(run_dir / "x.npy", np.zeros(INPUT_SHAPE, np.int8))
    (run_dir / "cut.npy").write_bytes((run_dir / "x.npy").read_bytes()[:100])
    (run_dir / "cut.npz").write_bytes((run_dir / "wrong_key.npz").read_bytes()[:300])
    with zipfile.ZipFile(run_dir / "plain.zip", "w") as z:
        z.writestr("notes.txt", "not an array\n")
    for args, fragments in [
        (("--input", "text.npy", "--output", "y.npy"), ("text.npy", "not a .npy or .npz")),
        (("--input", "cut.npy", "--output", "y.npy"), ("cut.npy", "EOF")),
        (("--input", "cut.npz", "--output", "y.npy"), ("cut.npz", "not a zip file")),
        (("--input", "plain.zip", "--output", "y.npy"), ("plain.zip", "'notes.txt'")),
        (("--input", "nothing.npy", "--output", "y.npy"), ("nothing.npy", "No such file")),
        (("--input", "wrong_key.npz", "--output", "y.npy"), ("['input']", "['image']")),
        (("--input", "x.npy", "--output", "no/such/dir/y.npy"), ("cannot write outputs",)),
        (("--input", "x.npy", "--output", "y.npy", "--board", "esp99"), ("esp99",)),
    ]:
        r = mcuforge("run", "demo.tflite", *args, cwd=run_dir)
        assert_user_error(r, *fragments)
    assert sorted(os.listdir(run_dir)) == ["cut.npy", "cut.npz", "demo.tflite", "plain.zip",
                                           "text.npy", "wrong_key.npz", "x.npy"]


def test_run_control_good_input(run_dir):
    np.save(run_dir / "x.npy", np.zeros((2, *INPUT_SHAPE), np.int8))
    r = mcuforge("run", "demo.tflite", "--input", "x.npy", "--output", "y.npy", cwd=run_dir)
    assert r.returncode == 0, r.stdout + r.stderr
    y = np.load(run_dir / "y.npy")
    assert y.shape == (2, 1, 10) and y.dtype == np.int8


# ---------------------------------------------------------------------------------------------
# Help


def test_top_level_help_lists_every_command(tmp_path):
    r = mcuforge("--help", cwd=tmp_path)
    assert r.returncode == 0 and r.stderr == "", r.stderr
    assert "standalone C" in r.stdout and "no malloc" in r.stdout
    for c in COMMANDS:
        assert f"\n    {c} " in r.stdout, c  # listed with its one-line help


@pytest.mark.parametrize("command,words", [
    ("compile", ("write a C project", "--output", "--board", "--name")),
    ("run", ("compile, build and run", "--input", "--output", ".npz")),
    ("info", ("MACs", "arena", "--json")),
    ("bench", ("latency", "TFLM", "--iterations", "--no-tflm")),
    ("demo", ("digits", "int8", "TFLM", "--output", "--synthetic")),
])
def test_subcommand_help_says_what_it_does(command, words, tmp_path):
    r = mcuforge(command, "--help", cwd=tmp_path)
    assert r.returncode == 0 and r.stderr == "", r.stderr
    assert r.stdout.startswith(f"usage: mcuforge {command}")
    description = r.stdout.split("\n\n")[1]  # the paragraph after the usage line
    assert not description.startswith(("positional arguments", "options")), r.stdout
    for w in words:
        assert w.lower() in r.stdout.lower(), w


def test_no_or_unknown_command_is_a_usage_error(tmp_path):
    for args in ((), ("frobnicate",)):
        r = mcuforge(*args, cwd=tmp_path)
        assert r.returncode == 2 and "usage: mcuforge" in r.stderr and "Traceback" not in r.stderr


def test_bad_option_values_are_usage_errors(tmp_path):
    """argparse rejects malformed option values with exit 2 and names the option."""
    for option, value in (("--int16-budget", "lots"), ("--int16-budget", "-5"),
                          ("--input-shape", "x=1,0")):
        r = mcuforge("compile", "model.tflite", "-o", "out", option, value, cwd=tmp_path)
        assert r.returncode == 2 and "Traceback" not in r.stderr
        assert f"argument {option}" in r.stderr and f"'{value}'" in r.stderr, r.stderr
        assert not (tmp_path / "out").exists()
