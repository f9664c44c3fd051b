"""Building generated projects and running host executables: the compile cache (keyed by
mcuforge's own sources), `make` with the chosen optimisation flags, and the harness's
binary input/output convention. The lowest floor of the roof: it imports nothing of mcuforge's
API."""
from __future__ import annotations

import fcntl
import functools
import hashlib
import json
import os
import platform
import shutil
import subprocess
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from mcuforge.ir.errors import BuildError

_DONE = ".mcuforge-done"  # in a finished cache entry: {file: sha256} of what it was made of

_PACKAGES = (  # whose sources key the cache
    "ir", "mcuforge", "frontend", "optimizer", "codegen_c", "templates", "runtime_c", "boards")


def cache_root() -> Path:
    return Path(os.environ.get("MCUFORGE_CACHE", Path.home() / ".cache" / "mcuforge"))


def _code_hash() -> str:
    """Hash of mcuforge's own sources, so a changed compiler never reuses a stale build."""
    from mcuforge.codegen_c.resources import data_dir
    h = hashlib.sha256()
    for pkg in _PACKAGES:
        root = data_dir(pkg)
        for p in sorted(root.rglob("*")):
            if p.suffix in (".py", ".j2", ".h", ".c", ".toml", ".ld", ".S") and p.is_file():
                h.update(str(p.relative_to(root)).encode())
                h.update(p.read_bytes())
    return h.hexdigest()


@functools.lru_cache(maxsize=1)
def host_cpu() -> str:
    """This CPU's instruction-set features (Linux: /proc/cpuinfo's flags), which a host build
    with -march=native depends on; the machine type elsewhere."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return hashlib.sha256(line.encode()).hexdigest()[:16]
    except OSError:
        pass
    return platform.machine()


def opt_flags(opt: str | None = None) -> str | None:
    """The optimisation flags a host build uses: `opt`, else $MCUFORGE_OPT, else None (the
    generated Makefile's own default, -O3 with ARCH=-march=native). Any gcc flags: "-O0", "-Os"."""
    opt = opt if opt is not None else os.environ.get("MCUFORGE_OPT")
    return opt.strip() if opt and opt.strip() else None


def build(project: Path, name: str, sanitize: bool = False, opt: str | None = None) -> Path:
    """`make` the project (with OPT=`opt` when given, see opt_flags); returns the executable."""
    args = ["make", "-s", "-C", str(project)] + (["SANITIZE=1"] if sanitize else [])
    opt = opt_flags(opt)
    if opt:
        args.append(f"OPT={opt}")
    r = subprocess.run(args, capture_output=True, text=True)
    if r.returncode != 0:
        raise BuildError(f"building {project} failed:\n{r.stdout}{r.stderr}")
    return project / name


@contextmanager
def cache_lock(entry: Path):
    """Holds an exclusive lock on a cache entry (a lock file beside it) for the block."""
    entry.parent.mkdir(parents=True, exist_ok=True)
    with open(entry.with_name(entry.name + ".lock"), "a+b") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _digests(folder: Path) -> dict:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file() and p.name != _DONE}


def _intact(entry: Path) -> bool:
    """A finished entry whose files are all still as they were made."""
    try:
        done = json.loads((entry / _DONE).read_text())
        return all(hashlib.sha256((entry / f).read_bytes()).hexdigest() == h
                   for f, h in done.items())
    except (OSError, ValueError, AttributeError):
        return False


def cache_entry(entry: Path, make) -> Path:
    """The cache folder `entry`, made by `make(folder)` unless a finished, intact one is there.
    Made under a per-entry lock (concurrent runs of one model build it once) in a temporary
    sibling renamed into place when complete, so a run killed while building leaves at most a
    temporary folder, removed by the next build, never an entry that looks finished."""
    with cache_lock(entry):
        if _intact(entry):
            return entry
        for old in entry.parent.glob(entry.name + ".tmp-*"):  # left by killed runs
            shutil.rmtree(old, ignore_errors=True)
        tmp = entry.with_name(f"{entry.name}.tmp-{os.getpid()}")
        try:
            make(tmp)
            (tmp / _DONE).write_text(json.dumps(_digests(tmp)))
            if entry.exists():  # an unfinished or damaged entry (older mcuforge, disk full)
                trash = entry.with_name(f"{entry.name}.tmp-{os.getpid()}-old")
                os.rename(entry, trash)
                shutil.rmtree(trash, ignore_errors=True)
            os.rename(tmp, entry)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return entry


def run_executable(exe: Path, graph, arrays: list, timeout: float | None = None) -> list:
    """Feed [N, ...] arrays through the harness; returns one [N, ...] array per output.
    `timeout` (seconds): a run taking longer fails (BuildError) instead of hanging."""
    n = len(arrays[0]) if arrays else 1  # a model without inputs runs once
    work = exe.parent
    blob = b"".join(a[i].tobytes() for i in range(n) for a in arrays)
    tag = hashlib.sha256(blob).hexdigest()[:16]
    in_path, out_path = work / f"in-{tag}-{os.getpid()}.bin", work / f"out-{tag}-{os.getpid()}.bin"
    in_path.write_bytes(blob)
    try:
        try:
            r = subprocess.run([str(exe), str(in_path), str(out_path)], capture_output=True,
                               text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            raise BuildError(f"{exe} did not finish in {timeout} s") from None
        except OSError as e:  # not an executable (say, a file damaged outside mcuforge)
            raise BuildError(f"cannot run {exe}: {e.strerror or e}") from None
        if r.returncode != 0:
            raise BuildError(f"{exe} failed (exit {r.returncode}):\n{r.stdout}{r.stderr}")
        raw = out_path.read_bytes()
    finally:
        in_path.unlink(missing_ok=True)
        out_path.unlink(missing_ok=True)
    specs = [graph.tensors[o] for o in graph.outputs]
    per = sum(t.nbytes for t in specs)
    if len(raw) != per * n:
        raise BuildError(f"{exe} wrote {len(raw)} bytes, expected {per * n}")
    outs = []
    for k, t in enumerate(specs):
        start = sum(s.nbytes for s in specs[:k])
        rows = [np.frombuffer(raw, dtype=t.dtype, count=t.size, offset=i * per + start)
                for i in range(n)]
        outs.append(np.stack(rows).reshape((n, *t.shape)))
    return outs
