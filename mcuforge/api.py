"""The public Python API: load, compile, and the pieces the CLI is made of."""
from __future__ import annotations

import os
import re
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from .boards import load_board
from .errors import McuforgeError
from .graph import Graph
from .resources import data_dir, render

RUNTIME_FILES = ("mcuforge_rt.h",)


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


def load(model) -> Graph:
    """Read a model file (or bytes) into the graph IR, checking every op is supported."""
    from frontend import load_model
    return load_model(model)


def default_name(model) -> str:
    stem = Path(str(model)).stem if isinstance(model, (str, os.PathLike)) else "model"
    name = re.sub(r"[^0-9a-zA-Z]+", "_", stem).strip("_").lower() or "model"
    return name if not name[0].isdigit() else "m_" + name


def generate_project(graph: Graph, name: str, board: str = "host"):
    """All files of the C project, as {file name: text}, plus the plan and the model code."""
    from codegen_c.model import generate
    from optimizer.memory_plan import plan_graph
    from optimizer.pipeline import optimize

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
    plan = plan_graph(graph)
    model = generate(graph, plan, name)
    files = dict(model.files)
    for f in RUNTIME_FILES:
        files[f] = (data_dir("runtime_c") / f).read_text()
    ctx = dict(name=name, NAME=name.upper(), graph=graph, board=b)
    for out_name, template in b.files.items():
        files[out_name] = render(template, ctx)
    return files, plan, model, graph


def compile(model, out_dir, board: str = "host", name: str | None = None) -> CompileResult:
    """Compile `model` (a .tflite path or bytes) into a C project in `out_dir`.

    Everything is generated in memory first, so a failure leaves no partial directory."""
    graph = load(model)
    name = default_name(model) if name is None else name
    files, plan, gen, graph = generate_project(graph, name, board)
    out_dir = Path(out_dir)
    write_files(out_dir, files)
    return CompileResult(out_dir, name, graph, plan.arena_size, plan.lower_bound,
                         gen.weight_bytes, gen.macs, sorted(files))


def write_files(out_dir: Path, files: dict) -> None:
    """Write through a temporary sibling directory, then move into place."""
    if out_dir.exists() and not out_dir.is_dir():
        raise McuforgeError(f"cannot write the C project to {out_dir}: it is a file, not a "
                            "directory")
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
            (tmp / fname).write_text(text)
        out_dir.mkdir(exist_ok=True)
        for fname in files:
            os.replace(tmp / fname, out_dir / fname)
    except OSError as e:
        raise McuforgeError(f"cannot write the C project to {out_dir}: "
                            f"{e.strerror or e}") from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
