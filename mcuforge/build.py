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
import re
import shutil
import subprocess
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from mcuforge.ir.errors import BuildError, McuforgeError

_DONE = ".mcuforge-done"  # in a finished cache entry: {file: sha256} of what it was made of

_PACKAGES = (  # whose sources key the cache
    "ir", "mcuforge", "frontend", "optimizer", "codegen_c", "templates", "runtime_c", "boards")


CACHE_MAX_DEFAULT = 2 * 1024 ** 3  # bytes; a host entry is tens of KB, a firmware one ~1 MB


def cache_root() -> Path:
    """Where builds are kept: $MCUFORGE_CACHE, else ~/.cache/mcuforge."""
    return Path(os.environ.get("MCUFORGE_CACHE") or Path.home() / ".cache" / "mcuforge")


def cache_max_bytes() -> int:
    """The cache's size cap: $MCUFORGE_CACHE_MAX (bytes, or with a K, M or G suffix), else
    CACHE_MAX_DEFAULT. Past it, the least recently used entries are removed."""
    text = os.environ.get("MCUFORGE_CACHE_MAX", "").strip()
    if not text:
        return CACHE_MAX_DEFAULT
    scale = {"K": 1024, "M": 1024 ** 2, "G": 1024 ** 3}.get(text[-1:].upper(), 1)
    try:
        value = int(text[:-1] if scale > 1 else text) * scale
    except ValueError:
        value = -1
    if value < 0:
        raise McuforgeError(f"MCUFORGE_CACHE_MAX='{text}' is not a number of bytes (e.g. "
                            f"500M, 2G)")
    return value


def _tree_bytes(folder) -> int:
    """Bytes of the files under `folder` (scandir: cheap enough to run after each build)."""
    total = 0
    with os.scandir(folder) as it:
        for e in it:
            if e.is_dir(follow_symlinks=False):
                total += _tree_bytes(e.path)
            elif e.is_file(follow_symlinks=False):
                total += e.stat(follow_symlinks=False).st_size
    return total


_ENTRY_NAME = re.compile(r"[0-9a-f]{24}")


def cache_entries(root: Path | None = None) -> list:
    """(folder, bytes, last use) of each cache entry (host builds, and firmware under fw/),
    least recently used first."""
    root = root or cache_root()
    # entries are named by 24 hex digits of their key; other folders there are builds in
    # progress (cache_entry's *.tmp-PID, write_files' .mcuforge-*), never removed from outside
    folders = [p for base in (root, root / "fw") if base.is_dir() for p in base.iterdir()
               if _ENTRY_NAME.fullmatch(p.name) and p.is_dir()]
    out = []
    for p in folders:
        try:
            out.append((p, _tree_bytes(p), p.stat().st_mtime))
        except OSError:  # removed meanwhile by another run
            pass
    return sorted(out, key=lambda e: e[2])


def _remove_entry(entry: Path) -> bool:
    """Remove an entry unless another run holds it (then False)."""
    lock = entry.with_name(entry.name + ".lock")
    try:
        f = open(lock, "a+b")
    except OSError:
        return False
    with f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return False
        shutil.rmtree(entry, ignore_errors=True)
        lock.unlink(missing_ok=True)
        fcntl.flock(f, fcntl.LOCK_UN)
    return not entry.exists()


def evict(keep: Path | None = None, cap: int | None = None) -> list:
    """Remove the least recently used entries until the cache is within `cap` bytes (default
    cache_max_bytes()); never `keep` (the entry just made) or one in use. Returns the removed."""
    cap = cache_max_bytes() if cap is None else cap
    entries = cache_entries()
    total = sum(b for _, b, _ in entries)
    removed = []
    for entry, size, _ in entries:
        if total <= cap:
            break
        if keep is not None and entry == keep:
            continue
        if _remove_entry(entry):
            total -= size
            removed.append(entry)
    return removed


def cache_clean() -> tuple:
    """Remove every entry not in use; (entries removed, bytes freed)."""
    entries = cache_entries()
    gone = [(e, b) for e, b, _ in entries if _remove_entry(e)]
    return len(gone), sum(b for _, b in gone)


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


def build(project: Path, name: str, sanitize: bool = False, opt: str | None = None,
          check_arena: bool = False) -> Path:
    """`make` the project (with OPT=`opt` when given, see opt_flags); returns the executable.
    `check_arena`: a project compiled with arena_check, built with the sanitizers and the
    arena check (CHECK_ARENA=1)."""
    args = ["make", "-s", "-C", str(project)] + (["SANITIZE=1"] if sanitize or check_arena
                                                 else []) + (["CHECK_ARENA=1"] if check_arena
                                                             else [])
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
            os.utime(entry)  # its last use: eviction removes the least recently used
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
    evict(keep=entry)  # outside the lock: eviction takes each other entry's
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
