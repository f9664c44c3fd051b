"""Run a model on numpy inputs: compiled and built once per model and options (the cache in
build.py), on the host or an emulated board (target.py)."""
from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np

from mcuforge.ir.errors import McuforgeError

from .api import GraphRunner, build_graph, run_graph  # noqa: F401  (the optimizer's `run`)
from .build import (_code_hash, build, cache_entry, cache_lock, cache_root,  # noqa: F401
                    host_cpu, opt_flags, run_executable)  # (re-exported: tools and tests use them)


def compiled_project(model, board: str = "host", sanitize: bool = False, graph=None,
                     input_shapes: dict | None = None, opt: str | None = None,
                     keep_input: bool = False, check_arena: bool = False,
                     memory_priority: float | None = None) -> tuple:
    """(project dir, executable, graph), compiling and building only on a cache miss.
    `opt`: the C compiler's optimisation flags (see opt_flags). `check_arena`: the checked
    build (codegen_c/arena_check.py), under AddressSanitizer and UBSan; `memory_priority`: as
    compile's."""
    from .api import compile as compile_model, load
    graph = graph or load(model, input_shapes)  # a missing or broken model fails here
    data = Path(model).read_bytes() if not isinstance(model, bytes) else model
    shapes = sorted((k, tuple(v)) for k, v in (input_shapes or {}).items())
    opt = opt_flags(opt)
    # the generated Makefile's default is -O3: one cache entry for both spellings; a host build
    # is for this CPU (ARCH=-march=native), so a cache shared between machines keys it by CPU
    cpu = host_cpu() if board == "host" else ""
    check = "|arena" if check_arena else ""  # (the default key is as it was)
    mp = "" if memory_priority is None else f"mp{memory_priority}|"
    key = hashlib.sha256(data + f"|{board}|{sanitize}|{shapes}|{opt or '-O3'}|{cpu}|"
                         f"{'keep' if keep_input else ''}{check}{mp}".encode()
                         + _code_hash().encode())

    def make(project: Path) -> None:
        compile_model(data, project, board=board, name="model", input_shapes=input_shapes,
                      keep_input=keep_input, arena_check=check_arena,
                      memory_priority=memory_priority)
        build(project, "model", sanitize, opt, check_arena)

    project = cache_entry(cache_root() / key.hexdigest()[:24], make)
    return project, project / "model", graph




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


def run(model, inputs, board: str = "host", sanitize: bool = False,
        input_shapes: dict | None = None, opt: str | None = None,
        flash_budget: int | None = None, keep_input: bool = False,
        check_arena: bool = False, memory_priority: float | None = None):
    """Run `model` on `inputs` (an array, a batch along a new leading axis, or a dict for
    several inputs). Returns one array, or a dict by output name for several outputs.
    `input_shapes` ({input name: shape}) fixes the open dimensions of inputs; `opt`: the
    build's optimisation flags, on the host or a board (default $MCUFORGE_OPT, else the
    Makefile's: -O3 on the host, -O2 on a board);
    `flash_budget`, `keep_input`, `memory_priority`: as compile's (flash_budget on a board).
    `check_arena`: the checked build (codegen_c/arena_check.py), where each layer may touch
    only its own tensors: on the host under AddressSanitizer and UBSan (a report fails the
    run), on an emulated board the plain-C check (red-zone patterns compared after each layer,
    dead tensors overwritten; a report raises target.ArenaCheckError)."""
    from .api import load
    graph = load(model, input_shapes)
    arrays, batched = split_inputs(graph, inputs)  # bad inputs fail before any build
    if check_arena and board != "host":
        from .board import board_names, load_board
        if not load_board(board).emulated:
            emulated = ", ".join(b for b in board_names() if load_board(b).emulated)
            raise McuforgeError(f"the arena check (--check-arena) runs on the host and the "
                                f"emulated boards ({emulated}), not on {board}")
    if board == "host":
        _, exe, graph = compiled_project(model, board, sanitize, graph, input_shapes, opt,
                                         keep_input, check_arena, memory_priority)
        outs = run_executable(exe, graph, arrays)
    else:
        from .target import run_on_board
        outs = run_on_board(model, arrays, board, flash_budget=flash_budget,
                            input_shapes=input_shapes, keep_input=keep_input,
                            memory_priority=memory_priority, check_arena=check_arena,
                            opt=opt).outputs
    return shape_outputs(graph, outs, batched)


def shape_outputs(graph, outs: list, batched: bool):
    """What run returns: per output its array (the batch axis dropped when the inputs had
    none), the only one alone, or a dict by output name."""
    if not batched:
        outs = [o[0] for o in outs]
    if len(outs) == 1:
        return outs[0]
    return {name: o for name, o in zip(graph.outputs, outs)}


