"""Build a generated project and run it on numpy inputs (host board), with a compile cache."""
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

from ir.errors import BuildError, McuforgeError

_PACKAGES = ("ir", "mcuforge", "frontend", "optimizer", "codegen_c", "templates", "runtime_c", "boards")


def cache_root() -> Path:
    return Path(os.environ.get("MCUFORGE_CACHE", Path.home() / ".cache" / "mcuforge"))


def _code_hash() -> str:
    """Hash of mcuforge's own sources, so a changed compiler never reuses a stale build."""
    from codegen_c.resources import data_dir
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


def compiled_project(model, board: str = "host", sanitize: bool = False, graph=None,
                     input_shapes: dict | None = None, opt: str | None = None) -> tuple:
    """(project dir, executable, graph), compiling and building only on a cache miss.
    `opt`: the C compiler's optimisation flags (see opt_flags)."""
    from .api import compile as compile_model, load
    graph = graph or load(model, input_shapes)  # a missing or broken model fails here
    data = Path(model).read_bytes() if not isinstance(model, bytes) else model
    shapes = sorted((k, tuple(v)) for k, v in (input_shapes or {}).items())
    opt = opt_flags(opt)
    # the generated Makefile's default is -O3: one cache entry for both spellings; a host build
    # is for this CPU (ARCH=-march=native), so a cache shared between machines keys it by CPU
    cpu = host_cpu() if board == "host" else ""
    key = hashlib.sha256(data + f"|{board}|{sanitize}|{shapes}|{opt or '-O3'}|{cpu}|".encode()
                         + _code_hash().encode())

    def make(project: Path) -> None:
        compile_model(data, project, board=board, name="model", input_shapes=input_shapes)
        build(project, "model", sanitize, opt)

    project = cache_entry(cache_root() / key.hexdigest()[:24], make)
    return project, project / "model", graph


_DONE = ".mcuforge-done"  # in a finished cache entry: {file: sha256} of what it was made of


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


def split_inputs(graph, inputs) -> tuple:
    """Check inputs against the model; returns (list of [N, ...] arrays, batched?)."""
    if isinstance(inputs, np.ndarray):
        inputs = [inputs]
    elif isinstance(inputs, dict):
        names = list(graph.inputs)
        keys = [n if n in inputs else f"arr_{i}" for i, n in enumerate(names)]
        if any(k not in inputs for k in keys):
            raise McuforgeError(f"inputs must be named {names} (or arr_0, arr_1, ...); "
                                f"got {sorted(inputs)}")
        extra = sorted(set(inputs) - set(keys))
        if extra:  # a misspelt or stale array would otherwise be dropped silently
            raise McuforgeError(f"{extra} are not inputs of the model (its inputs: {names}); "
                                "remove them")
        inputs = [inputs[k] for k in keys]
    if len(inputs) != len(graph.inputs):
        raise McuforgeError(f"the model has {len(graph.inputs)} inputs, got {len(inputs)}")
    batched = None
    out = []
    for arr, name in zip(inputs, graph.inputs):
        t = graph.tensors[name]
        arr = np.asarray(arr)
        if arr.dtype != np.dtype(t.dtype):
            raise McuforgeError(f"input '{name}' must be {t.dtype} of shape {tuple(t.shape)} "
                                f"(or a batch of them), got {arr.dtype}")
        if tuple(arr.shape) == tuple(t.shape):
            b = False
            arr = arr[None]
        elif tuple(arr.shape[1:]) == tuple(t.shape) and len(arr) > 0:
            b = True
        else:
            raise McuforgeError(f"input '{name}' must have shape {tuple(t.shape)} or "
                                f"(N, {', '.join(map(str, t.shape))}); got {arr.shape}")
        if batched is not None and (b != batched or len(arr) != len(out[0])):
            raise McuforgeError("all inputs must have the same batch layout and length")
        batched = b
        out.append(np.ascontiguousarray(arr))
    return out, bool(batched)


def nonfinite_warnings(graph, inputs) -> list:
    """One line per float input holding NaN or +-Inf: the generated C computes with them as
    IEEE arithmetic does (NaN stays NaN through every layer, max/min and pooling included), so
    the outputs may be NaN or Inf rather than a meaningful result."""
    arrays, _ = split_inputs(graph, inputs)
    lines = []
    for name, arr in zip(graph.inputs, arrays):
        if arr.dtype.kind != "f":
            continue
        nan, pos, neg = int(np.isnan(arr).sum()), int(np.isposinf(arr).sum()), \
            int(np.isneginf(arr).sum())
        if nan or pos or neg:
            what = ", ".join(f"{n} {k}" for n, k in ((nan, "NaN"), (pos, "+Inf"), (neg, "-Inf"))
                             if n)
            lines.append(f"input '{name}' holds {what} (of {arr.size} values): they propagate "
                         f"as in IEEE arithmetic, so outputs may be NaN or infinite")
    return lines


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


def run(model, inputs, board: str = "host", sanitize: bool = False,
        input_shapes: dict | None = None, opt: str | None = None,
        flash_budget: int | None = None):
    """Run `model` on `inputs` (an array, a batch along a new leading axis, or a dict for
    several inputs). Returns one array, or a dict by output name for several outputs.
    `input_shapes` ({input name: shape}) fixes the open dimensions of inputs; `opt`: the
    host build's optimisation flags (default $MCUFORGE_OPT, else the Makefile's -O3);
    `flash_budget`: as compile's, on a board."""
    from .api import load
    graph = load(model, input_shapes)
    arrays, batched = split_inputs(graph, inputs)  # bad inputs fail before any build
    if board == "host":
        _, exe, graph = compiled_project(model, board, sanitize, graph, input_shapes, opt)
        outs = run_executable(exe, graph, arrays)
    else:
        if input_shapes:  # target.run_on_board compiles the model from its file alone
            raise McuforgeError("--input-shape works on the host board only for now")
        from .target import run_on_board
        outs = run_on_board(model, arrays, board, flash_budget=flash_budget).outputs
    if not batched:
        outs = [o[0] for o in outs]
    if len(outs) == 1:
        return outs[0]
    return {name: o for name, o in zip(graph.outputs, outs)}


class GraphRunner:
    """Runs graphs as mcuforge's generated C on the host: the `run` the optimizer's
    calibration and searches take (optimizer/calibrate.py). Each graph object is compiled once,
    in a temporary directory that close() (or leaving a `with` block) removes."""

    def __init__(self):
        self._dir = None
        self._built = {}  # id(graph) -> (graph, executable, graph as compiled)

    def __call__(self, g, arrays: list) -> dict:
        import tempfile
        arrays = [np.ascontiguousarray(a) for a in arrays]
        if id(g) not in self._built:
            if self._dir is None:
                self._dir = tempfile.TemporaryDirectory(prefix="mcuforge-run-")
            work = Path(self._dir.name) / str(len(self._built))
            exe, compiled = build_graph(g, work)
            self._built[id(g)] = (g, exe, compiled)  # g kept alive: its id stays its own
        _, exe, compiled = self._built[id(g)]
        return dict(zip(compiled.outputs, run_executable(exe, compiled, arrays)))

    def close(self) -> None:
        if self._dir is not None:
            self._dir.cleanup()
        self._dir, self._built = None, {}

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def build_graph(g, workdir) -> tuple:
    """Compile graph `g` into a host C project in `workdir` and build it; returns (executable,
    the graph as compiled)."""
    from .api import generate_project, write_files
    files, _, _, compiled = generate_project(g, "model")
    write_files(Path(workdir), files)
    return build(Path(workdir), "model"), compiled


def run_graph(g, arrays: list) -> list:
    """Run graph `g` once on [N, ...] arrays (one per input) as generated C; one [N, ...] array
    per output, in the order compiled."""
    with GraphRunner() as run:
        return list(run(g, arrays).values())
