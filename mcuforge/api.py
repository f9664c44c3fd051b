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
    name = name or default_name(model)
    files, plan, gen, graph = generate_project(graph, name, board)
    out_dir = Path(out_dir)
    write_files(out_dir, files)
    return CompileResult(out_dir, name, graph, plan.arena_size, plan.lower_bound,
                         gen.weight_bytes, gen.macs, sorted(files))


def write_files(out_dir: Path, files: dict) -> None:
    """Write through a temporary sibling directory, then move into place."""
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".mcuforge-", dir=out_dir.parent))
    try:
        for fname, text in files.items():
            (tmp / fname).write_text(text)
        out_dir.mkdir(exist_ok=True)
        for fname in files:
            os.replace(tmp / fname, out_dir / fname)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
