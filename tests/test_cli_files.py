"""What `mcuforge` does with the user's files: `run --output` writes exactly the file named,
`run --input` refuses arrays the model does not have, `compile` replaces only files it wrote
itself (a manifest), and the build cache survives killed and concurrent runs."""
import os

import numpy as np
import pytest

from test_cli_errors import assert_user_error, mcuforge as _mcuforge
from test_frontend_tflite import T, build


def mcuforge(*args, cwd):
    return _mcuforge(*args, cwd=cwd, module=True)  # `python -m mcuforge.cli`

F = dict(type="FLOAT32")
X = np.array([[1.5, -2.0, 0.0, 3.25]], np.float32)


def relu_model() -> bytes:
    return build([T("x", [1, 4], **F), T("y", [1, 4], **F)], [("RELU", [0], [1])], [0], [1])


def two_output_model() -> bytes:
    return build([T("x", [1, 4], **F), T("r", [1, 4], **F), T("a", [1, 4], **F)],
                 [("RELU", [0], [1]), ("ABS", [0], [2])], [0], [1, 2])


@pytest.fixture
def work(tmp_path):
    (tmp_path / "relu.tflite").write_bytes(relu_model())
    (tmp_path / "two.tflite").write_bytes(two_output_model())
    np.save(tmp_path / "x.npy", X)
    return tmp_path


# --- run --output / --input (item 21) ---------------------------------------------------------

def test_run_writes_exactly_the_named_npy(work):
    r = mcuforge("run", "relu.tflite", "--input", "x.npy", "--output", "res.npy", cwd=work)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "wrote res.npy"
    np.testing.assert_array_equal(np.load(work / "res.npy"), np.maximum(X, 0))


@pytest.mark.parametrize("out", ["y.txt", "y", "y.npy.bak"])
def test_run_refuses_an_output_name_it_cannot_honour(work, out):
    before = sorted(os.listdir(work))
    r = mcuforge("run", "relu.tflite", "--input", "x.npy", "--output", out, cwd=work)
    assert_user_error(r, out, ".npy or .npz")
    assert sorted(os.listdir(work)) == before  # neither y.txt nor y.txt.npy


def test_run_npz_output_keyed_by_output_name(work):
    r = mcuforge("run", "relu.tflite", "--input", "x.npy", "--output", "one.npz", cwd=work)
    assert r.returncode == 0, r.stderr
    with np.load(work / "one.npz") as z:
        assert z.files == ["y"]
        np.testing.assert_array_equal(z["y"], np.maximum(X, 0))
    r = mcuforge("run", "two.tflite", "--input", "x.npy", "--output", "both.npz", cwd=work)
    assert r.returncode == 0, r.stderr
    with np.load(work / "both.npz") as z:
        assert sorted(z.files) == ["a", "r"]
        np.testing.assert_array_equal(z["r"], np.maximum(X, 0))
        np.testing.assert_array_equal(z["a"], np.abs(X))


def test_run_several_outputs_need_an_npz(work):
    r = mcuforge("run", "two.tflite", "--input", "x.npy", "--output", "y.npy", cwd=work)
    assert_user_error(r, "2 outputs", ".npz")
    assert not (work / "y.npy").exists() and not (work / "y.npy.npz").exists()


def test_run_refuses_input_arrays_the_model_does_not_have(work):
    np.savez(work / "extra.npz", x=X, mask=np.ones(4, np.float32), arr_7=X)
    r = mcuforge("run", "relu.tflite", "--input", "extra.npz", "--output", "y.npy", cwd=work)
    assert_user_error(r, "'mask'", "'arr_7'", "['x']")
    assert not (work / "y.npy").exists()
    np.savez(work / "good.npz", x=X)  # the control: the same without the extras
    r = mcuforge("run", "relu.tflite", "--input", "good.npz", "--output", "y.npy", cwd=work)
    assert r.returncode == 0, r.stderr


# --- the build cache (item 18) ----------------------------------------------------------------

def _env(cache, path_prefix=None):
    env = os.environ.copy()
    env["MCUFORGE_CACHE"] = str(cache)
    if path_prefix:
        env["PATH"] = f"{path_prefix}{os.pathsep}{env['PATH']}"
    return env


def _run(work, cache, out, **kw):
    import subprocess
    import sys
    return subprocess.Popen([sys.executable, "-m", "mcuforge.cli", "run", "relu.tflite",
                             "--input", "x.npy", "--output", out], cwd=work,
                            env=_env(cache, **kw), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)


@pytest.mark.parametrize("damage", ["half_exe", "no_exe", "only_makefile", "garbage_file"])
def test_a_damaged_cache_entry_is_rebuilt(work, monkeypatch, damage):
    from mcuforge.runner import run
    monkeypatch.setenv("MCUFORGE_CACHE", str(work / "cache"))
    want = np.maximum(X, 0)
    np.testing.assert_array_equal(run(work / "relu.tflite", X), want)
    [entry] = [p for p in (work / "cache").iterdir() if p.is_dir()]
    exe = entry / "model"
    if damage == "half_exe":  # killed while linking
        exe.write_bytes(exe.read_bytes()[:exe.stat().st_size // 2])
    elif damage == "no_exe":
        exe.unlink()
    elif damage == "only_makefile":
        for p in entry.iterdir():
            if p.name != "Makefile":
                p.unlink()
    else:
        exe.write_bytes(b"#!/bin/sh\nexit 3\n")
    np.testing.assert_array_equal(run(work / "relu.tflite", X), want)


def test_a_run_killed_while_linking_does_not_break_later_runs(work, tmp_path):
    """A `make` that leaves a partial executable and hangs: SIGKILL the run, then run again."""
    import signal
    import time
    fake = tmp_path / "fakebin"
    fake.mkdir()
    (fake / "make").write_text('#!/bin/sh\nwhile [ "$1" != "-C" ]; do shift; done\n'
                               'printf "\\177ELF partial" > "$2/model"\nchmod +x "$2/model"\n'
                               'sleep 120\n')
    (fake / "make").chmod(0o755)
    cache = work / "cache"
    p = _run(work, cache, "y.npy", path_prefix=fake)
    deadline = time.time() + 60
    while not list(cache.rglob("model")) and time.time() < deadline and p.poll() is None:
        time.sleep(0.05)
    assert list(cache.rglob("model")), p.communicate()
    os.killpg(p.pid, signal.SIGKILL)
    p.communicate()
    r = _run(work, cache, "y.npy")
    out, err = r.communicate(timeout=120)
    assert r.returncode == 0, err
    np.testing.assert_array_equal(np.load(work / "y.npy"), np.maximum(X, 0))


def test_concurrent_runs_of_one_model_share_the_cache(work):
    cache = work / "cache"
    procs = [_run(work, cache, f"y{k}.npy") for k in range(3)]
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err
    for k in range(3):
        np.testing.assert_array_equal(np.load(work / f"y{k}.npy"), np.maximum(X, 0))
    assert len([p for p in cache.iterdir() if p.is_dir()]) == 1  # no temporary left over


# --- compile into a folder that already holds files (item 20) ---------------------------------

def _compile(work, *args):
    return mcuforge("compile", *args, cwd=work)


def _manifest(out) -> dict:
    """{file: sha256} as `sha256sum` would check it."""
    import hashlib
    lines = (out / ".mcuforge-manifest").read_text().splitlines()
    got = {f: h for h, f in (ln.split("  ", 1) for ln in lines)}
    for f, h in got.items():
        assert hashlib.sha256((out / f).read_bytes()).hexdigest() == h, f
    return got


def test_compile_refuses_to_overwrite_the_users_files(work):
    out = work / "out"
    out.mkdir()
    (out / "main.c").write_text("/* my own harness */\n")
    (out / "Makefile").write_text("all:\n\techo mine\n")
    (out / "notes.txt").write_text("keep\n")
    r = _compile(work, "relu.tflite", "-o", "out")
    assert_user_error(r, "main.c", "Makefile", "--force")
    assert (out / "main.c").read_text() == "/* my own harness */\n"
    assert (out / "Makefile").read_text() == "all:\n\techo mine\n"
    assert sorted(os.listdir(out)) == ["Makefile", "main.c", "notes.txt"]  # nothing written
    r = _compile(work, "relu.tflite", "-o", "out", "--force")
    assert r.returncode == 0, r.stderr
    assert "Generated by mcuforge" in (out / "main.c").read_text()
    assert (out / "notes.txt").read_text() == "keep\n"  # not ours, not written: left alone
    assert set(_manifest(out)) == {"Makefile", "main.c", "relu.c", "relu.h", "mcuforge_rt.h"}


def test_recompile_replaces_its_own_files_and_removes_stale_ones(work):
    import shutil
    out = work / "out"
    assert _compile(work, "relu.tflite", "-o", "out").returncode == 0
    (out / "notes.txt").write_text("keep\n")
    shutil.copy(work / "relu.tflite", work / "other.tflite")  # another model name
    r = _compile(work, "other.tflite", "-o", "out")
    assert r.returncode == 0, r.stderr
    assert sorted(os.listdir(out)) == [".mcuforge-manifest", "Makefile", "main.c",
                                       "mcuforge_rt.h", "notes.txt", "other.c", "other.h"]
    assert set(_manifest(out)) == {"Makefile", "main.c", "other.c", "other.h", "mcuforge_rt.h"}
    # another board: its own files come, the host's main.c stays ours and is replaced
    r = _compile(work, "other.tflite", "-o", "out", "--board", "mps2-an386")
    assert r.returncode == 0, r.stderr
    fw = set(_manifest(out))
    assert {"link.ld", "startup.c", "inputs.h", "main.c"} <= fw
    r = _compile(work, "other.tflite", "-o", "out")  # back to the host: board files removed
    assert r.returncode == 0, r.stderr
    assert sorted(os.listdir(out)) == [".mcuforge-manifest", "Makefile", "main.c",
                                       "mcuforge_rt.h", "notes.txt", "other.c", "other.h"]


def test_recompile_refuses_a_generated_file_the_user_changed(work):
    out = work / "out"
    assert _compile(work, "relu.tflite", "-o", "out").returncode == 0
    (out / "main.c").write_text((out / "main.c").read_text() + "/* my change */\n")
    r = _compile(work, "relu.tflite", "-o", "out")
    assert_user_error(r, "main.c", "--force")
    assert (out / "main.c").read_text().endswith("/* my change */\n")
    # a changed file the new compile no longer writes is not removed either
    import shutil
    shutil.copy(work / "relu.tflite", work / "other.tflite")
    (out / "relu.c").write_text((out / "relu.c").read_text() + "/* mine */\n")
    r = _compile(work, "other.tflite", "-o", "out", "--force")
    assert r.returncode == 0, r.stderr
    assert (out / "relu.c").read_text().endswith("/* mine */\n")
    assert "relu.c" not in _manifest(out)


def test_api_compile_force(work):
    import mcuforge
    from mcuforge.ir.errors import McuforgeError
    out = work / "out"
    out.mkdir()
    (out / "main.c").write_text("int main(void) { return 0; }\n")
    with pytest.raises(McuforgeError, match="main.c"):
        mcuforge.compile(work / "relu.tflite", out)
    mcuforge.compile(work / "relu.tflite", out, force=True)
    assert "Generated by mcuforge" in (out / "main.c").read_text()
