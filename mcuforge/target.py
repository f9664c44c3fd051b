"""Run a model on an emulated board: inputs built into the firmware, QEMU runs it, the
firmware's printed lines give back the outputs, counter ticks and the stack high-water mark."""
from __future__ import annotations

import contextlib
import hashlib
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .board import Board, load_board
from mcuforge.ir.errors import BuildError, McuforgeError

APT_HINT = {"arm-none-eabi-": "gcc-arm-none-eabi libnewlib-arm-none-eabi",
            "riscv64-unknown-elf-": "gcc-riscv64-unknown-elf",
            "qemu-system-arm": "qemu-system-arm", "qemu-system-riscv32": "qemu-system-misc"}


@dataclass
class LayerProfile:
    """Per-layer counter ticks of a firmware built with profile=True (templates/firmware/main.c.j2
    times the marks codegen_c.model puts between the invoke's calls)."""
    names: list  # kernel name of each layer, as generated
    macs: list  # MACs of each layer
    ticks: list  # per invoke: each layer's ticks, one mark's cost included
    mark_ticks: int  # ticks of `marks` marks in a row: the cost a layer's ticks include
    marks: int


@dataclass
class TargetRun:
    outputs: list  # one [N, ...] array per model output
    ticks: list  # counter ticks of each invoke
    instructions: list  # executed instructions of each invoke (QEMU -icount)
    stack_bytes: int
    elf: Path
    profile: LayerProfile | None = None  # run_on_board(..., profile=True)


def require_tool(tool: str) -> None:
    if shutil.which(tool) is None:
        raise McuforgeError(f"{tool} not found: install it (apt-get install "
                            f"{APT_HINT.get(tool, tool)})")


def build_firmware(model, board: Board, vectors, workdir: Path, name: str = "model",
                   flash_budget: int | None = None, profile: bool = False,
                   input_shapes: dict | None = None, keep_input: bool = False,
                   memory_priority: float | None = None, check_arena: bool = False,
                   opt: str | None = None) -> tuple:
    """Write and `make` the firmware project with `vectors` built in (`profile`: with per-layer
    marks; `input_shapes`, `memory_priority`: as compile's; `check_arena`: the checked build,
    codegen_c/arena_check.py's plain-C check, made with CHECK_ARENA=1; `opt`: the compiler's
    optimisation flags, else $MCUFORGE_OPT, else the Makefile's own -O2); (project dir, elf,
    api.CompileResult)."""
    from .api import compile as compile_model
    require_tool(board.cross + "gcc")
    result = compile_model(model, workdir, board=board.name, name=name, vectors=vectors,
                           flash_budget=flash_budget, profile=profile,
                           input_shapes=input_shapes, keep_input=keep_input,
                           memory_priority=memory_priority, arena_check=check_arena)
    from .build import opt_flags
    opt = opt_flags(opt)  # `opt`, else $MCUFORGE_OPT, else the Makefile's own -O2
    r = subprocess.run(["make", "-s", "-C", str(workdir)] + ([f"OPT={opt}"] if opt else [])
                       + (["CHECK_ARENA=1"] if check_arena else []),
                       capture_output=True, text=True)
    if r.returncode != 0:
        raise BuildError(f"building the firmware in {workdir} failed:\n{r.stdout}{r.stderr}")
    return workdir, workdir / f"{name}.elf", result


def run_elf(board: Board, elf: Path, timeout: float = 900) -> str:
    if not board.emulated:
        raise McuforgeError(f"{board.name} is not emulated: run it on the board with --port "
                            f"/dev/ttyACM0 (its serial port), or flash {elf} to it; "
                            f"emulated boards: mps2-an385, mps2-an386, mps2-an500, mps3-an547, "
                            f"riscv32-virt")
    require_tool(board.qemu_binary)
    try:
        r = subprocess.run(board.qemu_command + ["-kernel", str(elf)], capture_output=True,
                           text=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        raise BuildError(f"{elf} did not finish within {timeout:.0f} s under QEMU") from e
    text = r.stdout + r.stderr  # QEMU writes the semihosting console to stderr
    if r.returncode != 0 or "done" not in text.splitlines():
        raise BuildError(f"{elf} failed under QEMU (exit {r.returncode}):\n{text}")
    return text


class ArenaCheckError(BuildError):
    """The checked firmware (--check-arena) reported a layer changing bytes outside its
    tensors."""


def check_violations(text: str, result) -> None:
    """Raise ArenaCheckError for the "arena-check <layer> <offset>" lines of a checked
    firmware's output (templates/firmware/main.c.j2), each with what the byte is: in a buffer
    the layer must not change, in a red-zone, or in no buffer live at that step. A line cut
    short (the firmware stopped mid-line) is reported as it is."""
    seen = []
    for line in text.splitlines():
        if line.startswith("arena-check"):
            m = re.fullmatch(r"arena-check (\S+) (\d+)", line.strip())
            key = (m[1], int(m[2])) if m else (line.strip(), None)
            if key not in seen:
                seen.append(key)
    if not seen:
        return
    lines = [f"  layer {layer} changed " + _where(result.plan, layer, at) if at is not None
             else f"  reported: {layer}" for layer, at in seen[:8]]
    more = f"\n  ... and {len(seen) - 8} more" if len(seen) > 8 else ""
    raise ArenaCheckError("the arena check found layers writing outside their tensors (a "
                          "kernel or memory-plan bug):\n" + "\n".join(lines) + more)


STATE_BIT = 0x80000000  # a reported offset in the state block (codegen_c/arena_check.py)


def _where(plan, layer: str, at: int) -> str:
    """The byte a report names, in words: in the state block (outside its tensors) or in
    the arena, with what it is at the step of `layer` (lNN_...: the main graph's step NN)."""
    if at >= STATE_BIT:
        at -= STATE_BIT
        below = [(o, t) for t, o in (plan.state_offsets.items() if plan else ()) if o <= at]
        return f"state block byte {at}" + (f" (past the state '{max(below)[1]}')" if below
                                           else "")
    if plan is None:
        return f"arena byte {at}"
    m = re.match(r"l(\d+)_", layer)  # (a subgraph's layers, sgK_lNN_...: any step)
    step = int(m[1]) if m else None
    live = [r for r in plan.requests if r.name in plan.offsets
            and (step is None or r.first <= step <= r.last)]
    for r in live:
        if plan.offsets[r.name] <= at < plan.offsets[r.name] + r.size:
            return f"arena byte {at} (in '{r.name}', live, not its output)"
    for r in live:
        if 0 <= at - plan.offsets[r.name] - r.size < plan.redzone:
            return f"arena byte {at} (the red-zone after '{r.name}')"
    return f"arena byte {at} (no buffer live at that step holds it)"


def parse_output(text: str, graph, board: Board) -> tuple:
    specs = [graph.tensors[o] for o in graph.outputs]
    outs = [[] for _ in specs]
    ticks, stack = [], 0
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        if key == "ticks":  # "ticks N" and words for a reader (instructions, cycles)
            ticks.append(int(value.split()[0]))
        elif key.startswith("out") and key[3:].isdigit():
            t = specs[int(key[3:])]
            outs[int(key[3:])].append(np.frombuffer(bytes.fromhex(value), dtype=t.dtype)
                                      .reshape(t.shape))
        elif key == "stack":
            stack = int(value)
    return [np.stack(o) for o in outs], ticks, stack


def parse_profile(text: str, layers: list, n: int) -> LayerProfile:
    """The "markcost" line and the "layer <ticks> <name>" lines (len(layers) per invoke) of a
    profiled firmware; `layers`: (kernel name, MACs) of the invoke's calls."""
    names = [name for name, _ in layers]
    mark, got = None, []
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        if key == "markcost":
            ticks, count = value.split()
            mark = (int(ticks), int(count))
        elif key == "layer":
            ticks, _, name = value.partition(" ")
            got.append((name, int(ticks)))
    per_invoke = [got[i * len(names):(i + 1) * len(names)] for i in range(n)]
    if mark is None or len(got) != n * len(names) \
            or any([name for name, _ in p] != names for p in per_invoke):
        raise BuildError(f"the profiled firmware reported {len(got)} layer lines, not "
                         f"{len(names)} per each of {n} inferences:\n{text}")
    return LayerProfile(names, [m for _, m in layers], [[t for _, t in p] for p in per_invoke],
                        *mark)


def run_on_board(model, arrays: list, board_name: str, workdir: Path | None = None,
                 flash_budget: int | None = None, profile: bool = False,
                 input_shapes: dict | None = None, keep_input: bool = False,
                 memory_priority: float | None = None, check_arena: bool = False,
                 opt: str | None = None) -> TargetRun:
    """Run [N, ...] input arrays (one per model input) on the board under QEMU; `profile`:
    with per-layer counts (TargetRun.profile); `input_shapes`, `memory_priority`: as
    compile's; `check_arena`: the checked build, a layer that changed a byte outside its
    tensors raises ArenaCheckError (codegen_c/arena_check.py); `opt`: build_firmware's."""
    from .build import cache_lock, cache_root, opt_flags
    board = load_board(board_name)
    n = len(arrays[0])
    vectors = [[a[i] for a in arrays] for i in range(n)]
    lock = contextlib.nullcontext()
    cached = workdir is None
    if cached:
        data = Path(model).read_bytes() if not isinstance(model, bytes) else model
        key = hashlib.sha256(data + board_name.encode() + str(flash_budget).encode()
                             + str(opt_flags(opt)).encode() + (b"profile" if profile else b"")
                             + (b"keep-input" if keep_input else b"")
                             + (str(sorted((k, tuple(v)) for k, v in input_shapes.items()))
                                .encode() if input_shapes else b"")
                             + (f"mp{memory_priority}".encode()
                                if memory_priority is not None else b"")
                             + (b"check-arena" if check_arena else b"")
                             + b"".join(a.tobytes() for a in arrays)).hexdigest()[:24]
        workdir = cache_root() / "fw" / key
        lock = cache_lock(workdir)  # concurrent runs of one model and input take turns
    with lock:  # each build rewrites the sources, so `make` never keeps a half-linked elf
        _, elf, result = build_firmware(model, board, vectors, Path(workdir),
                                        flash_budget=flash_budget, profile=profile,
                                        input_shapes=input_shapes, keep_input=keep_input,
                                        memory_priority=memory_priority,
                                        check_arena=check_arena, opt=opt)
        text = run_elf(board, elf)
    if cached:  # keep the cache within its cap
        from .build import evict
        evict(keep=Path(workdir))
    if check_arena:
        check_violations(text, result)
    outs, ticks, stack = parse_output(text, result.graph, board)
    if len(ticks) != n or any(len(o) != n for o in outs):
        raise BuildError(f"the firmware reported {len(ticks)} of {n} inferences")
    layers = parse_profile(text, result.layers, n) if profile else None
    return TargetRun(outs, ticks, [board.instructions(t) for t in ticks], stack, elf, layers)
