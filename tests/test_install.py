"""`pip install .` (not -e) gives a working mcuforge: the wheel holds every module and the
non-Python parts (templates/, runtime_c/, boards/) under ONE top-level package, mcuforge (the
layers install as mcuforge.<layer>), and the installed package compiles and builds a model with
no help from the checkout, beside another distribution's top-level `optimizer` and `boards`
packages. Runs everywhere, CI included (about 10 s)."""
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tomllib
import zipfile
from pathlib import Path

import numpy as np

from mcuforge.tools.demo import demo_tflite_bytes

REPO = Path(__file__).resolve().parents[1]
LAYERS = ("ir", "frontend", "optimizer", "codegen_c", "templates", "runtime_c", "boards")
SUFFIXES = (".py", ".j2", ".h", ".c", ".toml", ".ld", ".S")  # what the compiler reads

SCRIPT = r"""
import json, sys
import optimizer, boards  # another distribution's packages, imported first
import mcuforge
from mcuforge.tools.demo import demo_tflite_bytes
from mcuforge.codegen_c.resources import data_dir
r = mcuforge.compile(demo_tflite_bytes(), "out", name="demo")
ours = {m: getattr(mod, "__file__", None) for m, mod in sys.modules.items()
        if m.split(".")[0] == "mcuforge"}
print(json.dumps(dict(files=r.files, arena=r.arena_bytes, modules=ours, path=sys.path,
                      foreign=[optimizer.WHO, boards.WHO],
                      data={p: str(data_dir(p)) for p in ("templates", "runtime_c", "boards")})))
"""


def run(cmd, **kw):
    return subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=300,
                          **kw)


def build_wheel(src: Path, dist: Path) -> Path:
    """The wheel of `src`, built without build isolation when the venv can (no network), else
    with it."""
    base = [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", dist, src]
    r = run(base[:4] + ["--no-build-isolation"] + base[4:])
    if r.returncode != 0:
        r2 = run(base)
        assert r2.returncode == 0, f"pip wheel failed:\n{r.stderr}\n--- isolated:\n{r2.stderr}"
    (wheel,) = dist.glob("mcuforge-*.whl")
    return wheel


def test_wheel_installs_and_compiles_without_the_checkout(tmp_path):
    # Build from a copy, so the checkout gets no build/ or egg-info from this test.
    src = tmp_path / "src"
    shutil.copytree(REPO, src, ignore=shutil.ignore_patterns(
        ".venv", ".git", "build", "dist", "*.egg-info", "__pycache__", ".pytest_cache", "tests"))
    wheel = build_wheel(src, tmp_path / "dist")

    # Everything the compiler reads is in the wheel, under mcuforge/ (a layer X at mcuforge/X/),
    # and nothing else is at the wheel's top level.
    names = set(zipfile.ZipFile(wheel).namelist())
    expected = {"mcuforge/" + p.relative_to(src / pkg).as_posix() if pkg == "mcuforge"
                else f"mcuforge/{pkg}/" + p.relative_to(src / pkg).as_posix()
                for pkg in ("mcuforge", *LAYERS)
                for p in (src / pkg).rglob("*") if p.is_file() and p.suffix in SUFFIXES}
    assert expected - names == set(), f"missing from the wheel: {sorted(expected - names)}"
    top = {n.split("/")[0] for n in names}
    assert {t for t in top if not t.endswith(".dist-info")} == {"mcuforge"}, sorted(top)

    target = tmp_path / "target"
    r = run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", target,
             wheel])
    assert r.returncode == 0, r.stderr
    # another distribution's generic top-level packages in the same site-packages
    for name in ("optimizer", "boards"):
        (target / name).mkdir()
        (target / name / "__init__.py").write_text(f"WHO = 'not mcuforge: {name}'\n")

    # python -S: no site-packages .pth files, so the checkout's editable-install finder is
    # not loaded; the dependencies (numpy, jinja2, tflite, ...) come from the venv's
    # site-packages on PYTHONPATH, after the installed package. cwd holds nothing of ours.
    deps = dict.fromkeys([sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]])
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "CFLAGS", "CC")}
    env["PYTHONPATH"] = os.pathsep.join([str(target), *deps])
    env["MCUFORGE_CACHE"] = str(tmp_path / "cache")
    work = tmp_path / "work"
    work.mkdir()
    r = run([sys.executable, "-S", "-c", SCRIPT], cwd=work, env=env)
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    # the runtime headers come from the installed package: the arithmetic and the micro-kernels
    assert got["files"] == ["Makefile", "demo.c", "demo.h", "main.c", "mcuforge_ew.h",
                            "mcuforge_nn.h", "mcuforge_rt.h", "mcuforge_vec.h"]
    assert got["arena"] > 0
    # the checkout itself is not importable (the venv inside it, with the deps, may be)
    assert not any(Path(p).resolve() == REPO for p in got["path"] if p), got["path"]
    outside = {m: f for m, f in got["modules"].items()
               if f is not None and not Path(f).is_relative_to(target)}
    assert not outside, f"imported from outside the installed package: {outside}"
    assert "mcuforge" in got["modules"] and "mcuforge.codegen_c" in got["modules"]
    assert got["foreign"] == ["not mcuforge: optimizer", "not mcuforge: boards"]
    for pkg, d in got["data"].items():
        assert Path(d).is_relative_to(target), (pkg, d)

    make = run(["make", "-C", work / "out"], env=env)
    assert make.returncode == 0, make.stdout + make.stderr
    assert (work / "out" / "demo").is_file()

    # The console script pip installed works too.
    (work / "demo.tflite").write_bytes(demo_tflite_bytes())
    r = run([sys.executable, "-S", target / "bin" / "mcuforge", "compile", "demo.tflite",
             "-o", "out2"], cwd=work, env=env)
    assert r.returncode == 0, r.stderr
    assert (work / "out2" / "demo.c").is_file()

    # --version from the wheel's metadata; the library layout's templates are in the wheel
    r = run([sys.executable, "-S", target / "bin" / "mcuforge", "--version"], cwd=work, env=env)
    want = tomllib.loads((src / "pyproject.toml").read_text())["project"]["version"]
    assert r.returncode == 0 and r.stdout.strip() == f"mcuforge {want}", r.stdout + r.stderr
    r = run([sys.executable, "-S", target / "bin" / "mcuforge", "compile", "demo.tflite",
             "-o", "lib", "--layout", "library"], cwd=work, env=env)
    assert r.returncode == 0, r.stderr
    for f in ("src/demo.c", "src/demo.h", "src/mcuforge_rt.h", "CMakeLists.txt",
              "zephyr/module.yml", "library.properties", "library.json"):
        assert (work / "lib" / f).is_file(), f
    assert (work / "lib" / "src" / "demo.c").read_text().startswith(
        f"/* Generated by mcuforge {want} -- do not edit.")

    # report, validate and cache work from the installed package too (issue 12: every item
    # from a wheel): the report's MACs are the compile's, validate finds the int8 demo bit-exact
    # with tflite-micro, cache info names the cache this test set
    cli = [sys.executable, "-S", target / "bin" / "mcuforge"]
    r = run(cli + ["report", "demo.tflite", "--json", "-o", "r.json"], cwd=work, env=env)
    assert r.returncode == 0, r.stderr
    report = json.loads((work / "r.json").read_text())
    assert report["arena_bytes"] == got["arena"] and report["macs"] > 0
    r = run(cli + ["report", "demo.tflite", "-o", "r.html"], cwd=work, env=env)
    assert r.returncode == 0 and (work / "r.html").read_text().count("data:image/png;base64,") == 2
    x = np.random.default_rng(0).integers(-128, 128, (3, 1, 16, 16, 3)).astype(np.int8)
    np.savez(work / "x.npz", x)
    r = run(cli + ["validate", "demo.tflite", "--data", "x.npz", "--json"], cwd=work, env=env)
    assert r.returncode == 0, r.stderr
    v = json.loads(r.stdout)
    assert v["samples"] == 3 and [o["bit_exact"] for o in v["outputs"]] == [True], v
    r = run(cli + ["cache", "info"], cwd=work, env=env)
    assert r.returncode == 0 and str(tmp_path / "cache") in r.stdout, r.stdout + r.stderr
