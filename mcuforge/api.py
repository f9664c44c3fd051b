"""The public Python API: load, compile, and the pieces the CLI is made of."""
from __future__ import annotations

import hashlib
import os
import re
import shutil
import sys
import tempfile
from dataclasses import dataclass, field, fields
from pathlib import Path

import numpy as np

from .board import board_dir, load_board
from .build import build, run_executable
from mcuforge.ir.errors import McuforgeError
from mcuforge.ir.graph import Graph
from mcuforge.codegen_c.resources import data_dir, render
from .stamp import stamp_lines

RUNTIME_FILES = ("mcuforge_rt.h", "mcuforge_math.h", "mcuforge_nn.h", "mcuforge_dw.h",
                 "mcuforge_ew.h", "mcuforge_vec.h", "mcuforge_seq.h",
                 "mcuforge_mve.h", "mcuforge_mve_dw.h", "mcuforge_scalar.h",
                 "mcuforge_rv.h")


@dataclass
class CompileResult:
    out_dir: Path
    name: str
    graph: Graph
    arena_bytes: int
    lower_bound_bytes: int
    weight_bytes: int
    macs: int
    files: list
    state_bytes: int = 0  # state kept between invokes, outside the arena
    schedules: list = field(default_factory=list)  # codegen_c.kernels.budget.Choice per layer
    scratch_bytes: int = 0  # the largest kernel scratch, inside the arena
    layers: list = field(default_factory=list)  # (kernel name, MACs) of each invoke call
    memory_priority: object = None  # optimizer.patch.Choice with memory_priority
    plan: object = None  # the arena plan (optimizer.memory_plan.MemoryPlan) the code addresses


def load(model, input_shapes: dict | None = None) -> Graph:
    """Read a model file (or bytes) into the graph IR, checking every op is supported.
    `input_shapes` ({input name: shape}) fixes the dimensions a model leaves open (ONNX or TFLite
    inputs); any other difference from the model is an error."""
    from mcuforge.frontend import load_model
    return load_model(model, input_shapes=input_shapes)


def default_name(model) -> str:
    stem = Path(str(model)).stem if isinstance(model, (str, os.PathLike)) else "model"
    name = re.sub(r"[^0-9a-zA-Z]+", "_", stem).strip("_").lower() or "model"
    return name if not name[0].isdigit() else "m_" + name


LAYOUTS = ("project", "library")


def generate_project(graph: Graph, name: str, board: str = "host", vectors=None,
                     flash_budget: int | None = None, profile: bool = False,
                     layout: str = "project", stamp: list | None = None,
                     keep_input: bool = False, arena_check: bool = False,
                     memory_priority: float | None = None):
    """All files of the C project, as {file name: text}, plus the plan and the model code.
    `vectors`: input vectors built into firmware (a list of [one array per input]); by
    default one all-zero vector. `flash_budget`: bytes of flash the model may take (weights
    plus an allowance for the code; default: the board's flash). `profile`: per-layer marks in
    the invoke, which the firmware harness times (codegen_c.model.generate); without it the
    files are as they always were. `layout`: "project" (a buildable project for the board:
    harness, start-up code, linker script, Makefile) or "library" (the model alone, under
    src/, with CMake, Zephyr, Arduino and PlatformIO files: mcuforge/library.py); the board
    still chooses the code (its CPU's kernels) and the memory checks. `stamp`: the lines every
    file starts with (mcuforge/stamp.py). `keep_input`: no layer overwrites the input buffers
    (by default layers may write their outputs over an input they have read: in place).
    `arena_check`: the checked build (red-zones in the plan, the check's tables:
    codegen_c/arena_check.py; under ASan on the host, plain C on a board; the Makefile's
    CHECK_ARENA=1). `memory_priority`
    (percent): the first layers computed in bands of rows where that shrinks the arena for at
    most this many percent more MACs (optimizer/patch.py; model.memory_priority says what was
    chosen)."""
    from mcuforge.codegen_c.model import generate
    from mcuforge.optimizer.pipeline import optimize

    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
        raise McuforgeError(f"--name '{name}' is not a C identifier")
    b = load_board(board)
    # name.c, name.h and the executable `name` must not clash with the project's other files
    # (main.c, mcuforge_rt.h, Makefile) or the Makefile's `clean` target, on case-insensitive
    # file systems too
    others = set(RUNTIME_FILES) | set(b.files)
    taken = {f.lower() for f in others} | {Path(f).stem.lower() for f in others} | {"clean"}
    if name.lower() in taken:
        raise McuforgeError(f"--name '{name}' clashes with a file or target of the generated "
                            f"project ({', '.join(sorted(others))}, make clean); "
                            "choose another name")
    graph = optimize(graph)
    if layout not in LAYOUTS:
        raise McuforgeError(f"unknown layout '{layout}'; choose one of {', '.join(LAYOUTS)}")
    choice = None
    if memory_priority is not None:
        graph, choice = patch_first_stage(graph, b.target(flash_budget), memory_priority,
                                          keep_input)
    model = generate(graph, name, b.target(flash_budget), profile, stamp, keep_input,
                     arena_check)
    model.memory_priority = choice
    plan = model.plan
    if flash_budget is not None:
        check_budget(model, flash_budget)
    files = dict(model.files)
    wanted = [RUNTIME_FILES[0]]  # the others only when the model (or one of them) includes them
    while wanted:
        f = wanted.pop()
        files[f] = (data_dir("runtime_c") / f).read_text()
        wanted += [h for h in RUNTIME_FILES if h not in files and h not in wanted
                   and any(f'#include "{h}"' in files[k] for k in (f, f"{name}.c"))]
    if "mcuforge_math.h" in files and b.family == "riscv":
        raise McuforgeError(f"this model needs float math functions (expf, sqrtf, ...) from a C "
                            f"library, and {b.name} is built without one; use a Cortex-M "
                            f"board or the host")
    check_fits(b, plan.arena_size + plan.state_size, model.weight_bytes)
    if stamp is not None:  # copied files start with the stamp too
        banner = render("banner.j2", dict(stamp=stamp, graph=graph))
        files.update({f: banner + text for f, text in files.items() if f in RUNTIME_FILES})
    if layout == "library":
        from .library import library_files
        return library_files(files, name, model, graph, b, stamp), plan, model, graph
    for f in b.extra_sources:
        files[f] = (banner if stamp is not None else "") + (board_dir(b.name) / f).read_text()
    if vectors is None:
        vectors = [[np.zeros(p.nbytes, np.uint8) for p in model.inputs]]
    support = [f for f in b.files if f.endswith((".c", ".S")) and f != "main.c"]
    sources = ["main.c", f"{name}.c", *support, *b.extra_sources]
    ctx = dict(name=name, NAME=name.upper(), graph=graph, board=b, inputs=model.inputs,
               outputs=model.outputs, vectors=[[_c_bytes(a) for a in vec] for vec in vectors],
               sources=sources, profile=profile, layers=model.layers,
               headers=[f"{name}.h", "mcuforge_rt.h", "inputs.h", "mf_board.h"])
    if stamp is not None:
        ctx["stamp"] = stamp
    if arena_check:
        ctx["arena_check"] = True
    for out_name, template in b.files.items():
        files[out_name] = render(template, ctx)
    return files, plan, model, graph


def patch_first_stage(graph: Graph, target, max_macs: float, keep_input: bool = False) -> tuple:
    """(graph, optimizer.patch.Choice): the optimized graph with its first stage in the bands
    that give the smallest arena for `target` within `max_macs` percent more MACs, or the
    graph itself when nothing beats its own plan; the arenas planned as generate will
    (`keep_input`: no layer writes over the input). The choice takes minutes on large models:
    the last few are kept for this process, so a second compile, report or run of the same
    graph, target and bound reuses it."""
    from mcuforge.codegen_c.model import arena_and_macs
    from mcuforge.optimizer.patch import choose
    if max_macs < 0:
        raise McuforgeError(f"--memory-priority-max-macs {max_macs}: give a percentage >= 0")
    key = (graph_digest(graph), repr(target), float(max_macs), bool(keep_input))
    if key in _CHOICES:
        choice = _CHOICES[key]
        return choice.graph, choice
    cache = {}
    choice = choose(graph, lambda g: arena_and_macs(g, target, cache, keep_input=keep_input),
                    max_macs, quick=lambda g: arena_and_macs(g, target, cache, quick=True,
                                                             keep_input=keep_input),
                    progress=lambda line: print(f"memory priority: {line}", file=sys.stderr,
                                                flush=True))
    while len(_CHOICES) >= 4:
        _CHOICES.pop(next(iter(_CHOICES)))
    _CHOICES[key] = choice
    return choice.graph, choice


_CHOICES: dict = {}  # patch_first_stage's: (graph digest, target, bound, keep_input) -> Choice


def graph_digest(graph: Graph) -> str:
    """sha256 of everything a graph is: its nodes (op, operands, attributes, subgraphs), its
    tensors (shape, dtype, quantization, constant bytes), inputs, outputs and state."""
    h = hashlib.sha256()

    def put(v) -> None:
        if isinstance(v, Graph):
            h.update(b"G" + graph_digest(v).encode())
        elif isinstance(v, np.ndarray):
            h.update(f"A{v.dtype}{v.shape}".encode() + np.ascontiguousarray(v).tobytes())
        elif isinstance(v, dict):
            h.update(b"{")
            for k in sorted(v, key=repr):
                put(k)
                put(v[k])
            h.update(b"}")
        elif isinstance(v, (list, tuple)):
            h.update(b"[")
            for x in v:
                put(x)
            h.update(b"]")
        else:
            h.update(f"{type(v).__name__}:{v!r};".encode())
    for n in graph.nodes:
        put((n.op, n.inputs, n.outputs, n.name, n.attrs))
    for name in sorted(graph.tensors):
        t = graph.tensors[name]
        q = t.quant
        put((name, tuple(t.shape), t.dtype,
             None if q is None else tuple(getattr(q, f.name) for f in fields(q))))
        put(t.data if t.data is None else np.asarray(t.data))
    put((graph.inputs, graph.outputs, graph.name, graph.state, graph.state_init))
    return h.hexdigest()


def memory_priority_line(choice) -> str:
    """What --memory-priority did, in one line."""
    if choice.k == 0:
        return (f"memory priority: nothing beats the default plan (arena {choice.base_arena:,} "
                f"bytes); the model is unchanged")
    return (f"memory priority: arena {choice.base_arena:,} -> {choice.arena:,} bytes, MACs "
            f"{choice.base_macs:,} -> {choice.macs:,} (+{choice.overhead:.1f}%): the first "
            f"{choice.k} layers in {choice.count} bands of rows, "
            + ("each row computed once (the halo rows copied between bands"
               + (", after their readers" if choice.late else "") + ")" if choice.reuse
               else "the halos recomputed")
            + {"": "", "im2col": "; the band convolutions on im2col (less scratch)",
               "bare_dw": "; the band convolutions on im2col, the depthwise layers on the "
                          "reference loops (no scratch)",
               "bare": "; the band convolutions and depthwise layers on the reference loops "
                       "(no scratch)"}[choice.lean]
            + (f" in the first {choice.lean_bands} bands" if choice.lean
               and choice.lean_bands is not None else "")
            + (f"; the 1x1 -> depthwise pairs in {choice.split} channel groups"
               if choice.split > 1 else "")
            + ("; the residual branches in another order" if choice.order else "")
            + (f"; {len(choice.tail_lean)} layer(s) after the stage on kernels with less "
               f"scratch" if choice.tail_lean else ""))


def _c_bytes(a) -> str:
    """An array's bytes as a C initializer list."""
    return ", ".join(map(str, np.ascontiguousarray(a).view(np.uint8).reshape(-1).tolist()))


def check_budget(model, budget: int) -> None:
    """Refuse a model that does not fit --flash-budget even with every layer's weights int8."""
    from mcuforge.codegen_c.kernels.budget import CODE_ALLOWANCE
    need = model.weight_bytes + CODE_ALLOWANCE
    if need > budget:
        raise McuforgeError(
            f"the model needs {model.weight_bytes:,} bytes of weights and tables plus "
            f"{CODE_ALLOWANCE:,} for the code, {need:,} in all, over the flash budget of "
            f"{budget:,} bytes (every layer the budget can narrow has int8 weights already): "
            f"raise --flash-budget or use a smaller model")


def check_fits(b, arena: int, weights: int) -> None:
    """Refuse a model whose arena (with its state block) or weights and code cannot fit the
    board, with the numbers. (Before this, the flash budget has kept as many layers' weights
    int8 as it takes: codegen_c/kernels/budget.py, which counts the code the same way.)"""
    from mcuforge.codegen_c.kernels.budget import CODE_ALLOWANCE
    if b.ram_size is not None and arena + b.min_stack > b.ram_size:
        raise McuforgeError(
            f"the model needs {arena:,} bytes of arena plus {b.min_stack:,} of stack, but "
            f"{b.name} has {b.ram_size:,} bytes of RAM: choose a board with more RAM or a "
            f"smaller model")
    if b.flash_size is not None and weights + CODE_ALLOWANCE > b.flash_size:
        raise McuforgeError(
            f"the model's weights take {weights:,} bytes and its code about "
            f"{CODE_ALLOWANCE:,}, {weights + CODE_ALLOWANCE:,} in all, but {b.name} has "
            f"{b.flash_size:,} bytes of flash: choose a board with more flash or a smaller "
            f"model")


def compile(model, out_dir, board: str = "host", name: str | None = None,
            vectors=None, input_shapes: dict | None = None, quantize: str | None = None,
            calibration=None, calibration_method: str | None = None,
            quantize_io: str = "int8", emit_tflite=None,
            int16_budget: int | None = 0, force: bool = False,
            flash_budget: int | None = None, profile: bool = False,
            layout: str = "project", command: list | None = None,
            keep_input: bool = False, arena_check: bool = False,
            memory_priority: float | None = None) -> CompileResult:
    """Compile `model` (a .tflite or .onnx path, or bytes) into a C project in `out_dir`.
    `quantize="int8"` quantizes a float model first, calibrated on `calibration` (a .npy /
    .npz / folder of .npy, or arrays; see optimizer.quantize), with a progress bar on stderr;
    `emit_tflite` also writes that int8 model as a .tflite file; `int16_budget` > 0 (bytes of
    arena growth, None: automatic) keeps the activations that matter most in int16 (TFLite's
    16x8 scheme). `flash_budget` (bytes): the flash the model may take; layers whose weights
    would be pre-widened to int16 (the fastest form on DSP cores) keep int8 weights until the
    model fits (default: the board's flash). `keep_input`: invoke leaves the input buffers
    as they were (the arena is then larger; by default they may be overwritten).

    Everything is generated in memory first, so a failure leaves no partial directory. A
    manifest (.mcuforge-manifest) lists what was written: a later compile into the same folder
    replaces those files and removes the ones it no longer writes, but refuses to overwrite
    any other file (the user's own main.c, or a generated file the user changed) unless
    `force`. `profile`: per-layer marks, `layout`: "project" or "library" (see
    generate_project). Every file starts with a stamp (mcuforge/stamp.py): mcuforge's version,
    the model's sha256, `command` (the `mcuforge` command's arguments, when it is the caller)
    and the options; the same inputs give the same bytes. `arena_check`: the checked build
    (generate_project); `memory_priority` (percent): see generate_project."""
    from mcuforge.optimizer.quantize import quantize_for_compile

    graph = load(model, input_shapes)
    with GraphRunner() as run:
        graph = quantize_for_compile(graph, quantize, calibration, calibration_method,
                                     quantize_io, emit_tflite, progress=sys.stderr,
                                     int16_budget_bytes=int16_budget, run=run)
    name = default_name(model) if name is None else name
    data = bytes(model) if isinstance(model, (bytes, bytearray)) else Path(model).read_bytes()
    options = dict(
        board=board, layout=layout, name=name, input_shapes=input_shapes, quantize=quantize,
        calibration=calibration if isinstance(calibration, (str, os.PathLike)) else
        (None if calibration is None else "arrays"),
        calibration_method=calibration_method, quantize_io=quantize_io,
        int16_budget="auto" if int16_budget is None else int16_budget,
        flash_budget=flash_budget, profile=profile, keep_input=keep_input,
        **({} if memory_priority is None else {"memory_priority": memory_priority}))
    if arena_check:  # only then: the default stamp is as it always was
        options["arena_check"] = True
    stamp = stamp_lines(data, command, options)
    files, plan, gen, graph = generate_project(graph, name, board, vectors, flash_budget,
                                               profile, layout, stamp, keep_input, arena_check,
                                               memory_priority)
    out_dir = Path(out_dir)
    write_files(out_dir, files, force)
    scratch = max((r.size for r in plan.requests if r.name.endswith("/kernel")), default=0)
    return CompileResult(out_dir, name, graph, plan.arena_size, plan.lower_bound,
                         gen.weight_bytes, gen.macs, sorted(files), plan.state_size,
                         gen.schedules, scratch, gen.layers, gen.memory_priority, plan)


MANIFEST = ".mcuforge-manifest"  # what mcuforge wrote in a project: "sha256  file" lines


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def read_manifest(out_dir: Path) -> dict:
    """{file: sha256} of the files mcuforge wrote in `out_dir` last time (empty if none)."""
    try:
        lines = (out_dir / MANIFEST).read_text().splitlines()
    except (OSError, UnicodeDecodeError):
        return {}
    pairs = (ln.split("  ", 1) for ln in lines)
    return {f: h for h, f in (p for p in pairs if len(p) == 2)}


def _plan_writes(out_dir: Path, files: dict, force: bool) -> list:
    """Check what writing `files` would overwrite; returns mcuforge's own files of an earlier
    compile that this one no longer writes (unchanged since, so safe to remove). Files
    mcuforge did not write, or that were changed after it wrote them, are replaced only with
    `force`."""
    if not out_dir.is_dir():
        return []
    ours = read_manifest(out_dir)

    def unchanged(f: str, new: str | None = None) -> bool:
        """As mcuforge wrote it, or already just what it would write now."""
        try:
            h = _sha256((out_dir / f).read_bytes())
        except OSError:
            return False
        return h == ours.get(f) or (new is not None and h == _sha256(new.encode()))
    foreign = sorted(f for f, text in files.items()
                     if (out_dir / f).exists() and not unchanged(f, text))
    if foreign and not force:
        raise McuforgeError(
            f"{out_dir} already holds {', '.join(foreign)}, not written by mcuforge or changed "
            f"since it wrote them; compile into another folder, or pass --force (force=True) "
            f"to overwrite them")
    return [f for f in ours if f not in files and _own_path(out_dir, f) and unchanged(f)]


def _own_path(out_dir: Path, f: str) -> bool:
    """A manifest entry names a file inside the project (a file or one folder deep, as the
    library layout's src/ and zephyr/), never ../ or an absolute path or a symbolic link out."""
    parts = Path(f).parts
    if not 1 <= len(parts) <= 2 or Path(f).is_absolute() or ".." in parts:
        return False
    folder = out_dir / parts[0]
    return len(parts) == 1 or folder.is_dir() and not folder.is_symlink()


def write_files(out_dir: Path, files: dict, force: bool = False) -> None:
    """Write through a temporary sibling directory, then move into place, with a manifest of
    what was written; files of an earlier compile that this one does not write are removed."""
    if out_dir.exists() and not out_dir.is_dir():
        raise McuforgeError(f"cannot write the C project to {out_dir}: it is a file, not a "
                            "directory")
    stale = _plan_writes(out_dir, files, force)
    manifest = "".join(f"{_sha256(text.encode())}  {f}\n" for f, text in sorted(files.items()))
    files = {**files, MANIFEST: manifest}
    try:
        out_dir.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=".mcuforge-", dir=out_dir.parent))
    except FileExistsError as e:
        raise McuforgeError(f"cannot write the C project to {out_dir}: {e.filename} is a "
                            "file, not a directory") from None
    except OSError as e:
        raise McuforgeError(f"cannot write the C project to {out_dir}: "
                            f"{e.strerror or e}") from None
    try:
        for fname, text in files.items():
            (tmp / fname).parent.mkdir(parents=True, exist_ok=True)
            (tmp / fname).write_bytes(text.encode())
        out_dir.mkdir(exist_ok=True)
        for fname in stale:
            (out_dir / fname).unlink(missing_ok=True)
        for sub in sorted({Path(f).parent for f in stale} - {Path(".")}):
            if (out_dir / sub).is_dir() and not any((out_dir / sub).iterdir()):
                (out_dir / sub).rmdir()  # a folder only mcuforge's files were in
        for fname in files:  # the manifest last: it lists only files already in place
            (out_dir / fname).parent.mkdir(parents=True, exist_ok=True)
            os.replace(tmp / fname, out_dir / fname)
    except OSError as e:
        raise McuforgeError(f"cannot write the C project to {out_dir}: "
                            f"{e.strerror or e}") from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


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
    files, _, _, compiled = generate_project(g, "model")
    write_files(Path(workdir), files)
    return build(Path(workdir), "model"), compiled


def run_graph(g, arrays: list) -> list:
    """Run graph `g` once on [N, ...] arrays (one per input) as generated C; one [N, ...] array
    per output, in the order compiled."""
    with GraphRunner() as run:
        return list(run(g, arrays).values())
