"""Build a generated project and run it on numpy inputs (host board), with a compile cache."""
from __future__ import annotations

import hashlib
import os
import subprocess
from pathlib import Path

import numpy as np

from .errors import BuildError, McuforgeError

_PACKAGES = ("mcuforge", "frontend", "optimizer", "codegen_c", "templates", "runtime_c", "boards")


def cache_root() -> Path:
    return Path(os.environ.get("MCUFORGE_CACHE", Path.home() / ".cache" / "mcuforge"))


def _code_hash() -> str:
    """Hash of mcuforge's own sources, so a changed compiler never reuses a stale build."""
    from .resources import data_dir
    h = hashlib.sha256()
    for pkg in _PACKAGES:
        root = data_dir(pkg)
        for p in sorted(root.rglob("*")):
            if p.suffix in (".py", ".j2", ".h", ".c", ".toml", ".ld", ".S") and p.is_file():
                h.update(str(p.relative_to(root)).encode())
                h.update(p.read_bytes())
    return h.hexdigest()


def build(project: Path, name: str, sanitize: bool = False) -> Path:
    """`make` the project; returns the executable."""
    args = ["make", "-s", "-C", str(project)] + (["SANITIZE=1"] if sanitize else [])
    r = subprocess.run(args, capture_output=True, text=True)
    if r.returncode != 0:
        raise BuildError(f"building {project} failed:\n{r.stdout}{r.stderr}")
    return project / name


def compiled_project(model, board: str = "host", sanitize: bool = False, graph=None,
                     input_shapes: dict | None = None) -> tuple:
    """(project dir, executable, graph), compiling and building only on a cache miss."""
    from .api import compile as compile_model, load
    graph = graph or load(model, input_shapes)  # a missing or broken model fails here
    data = Path(model).read_bytes() if not isinstance(model, bytes) else model
    shapes = sorted((k, tuple(v)) for k, v in (input_shapes or {}).items())
    key = hashlib.sha256(data + f"|{board}|{sanitize}|{shapes}|".encode()
                         + _code_hash().encode())
    project = cache_root() / key.hexdigest()[:24]
    exe = project / "model"
    if not exe.is_file():
        compile_model(data, project, board=board, name="model", input_shapes=input_shapes)
        build(project, "model", sanitize)
    return project, exe, graph


def split_inputs(graph, inputs) -> tuple:
    """Check inputs against the model; returns (list of [N, ...] arrays, batched?)."""
    if isinstance(inputs, np.ndarray):
        inputs = [inputs]
    elif isinstance(inputs, dict):
        names = list(graph.inputs)
        keyed = [inputs.get(n, inputs.get(f"arr_{i}")) for i, n in enumerate(names)]
        if any(k is None for k in keyed):
            raise McuforgeError(f"inputs must be named {names} (or arr_0, arr_1, ...); "
                                f"got {sorted(inputs)}")
        inputs = keyed
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
        input_shapes: dict | None = None):
    """Run `model` on `inputs` (an array, a batch along a new leading axis, or a dict for
    several inputs). Returns one array, or a dict by output name for several outputs.
    `input_shapes` ({input name: shape}) fixes dynamic dimensions of ONNX inputs."""
    from .api import load
    graph = load(model, input_shapes)
    arrays, batched = split_inputs(graph, inputs)  # bad inputs fail before any build
    if board == "host":
        _, exe, graph = compiled_project(model, board, sanitize, graph, input_shapes)
        outs = run_executable(exe, graph, arrays)
    else:
        if input_shapes:  # target.run_on_board compiles the model from its file alone
            raise McuforgeError("--input-shape works on the host board only for now")
        from .target import run_on_board
        outs = run_on_board(model, arrays, board).outputs
    if not batched:
        outs = [o[0] for o in outs]
    if len(outs) == 1:
        return outs[0]
    return {name: o for name, o in zip(graph.outputs, outs)}
