"""`mcuforge bench`: arena, RAM, weights and latency of the generated code beside TFLM's."""
from __future__ import annotations

import re
import subprocess
from pathlib import Path

from . import tflm
from .errors import BuildError


def static_ram_bytes(project: Path, name: str) -> int:
    """data + bss of the compiled model (arena and any other static state), from the object."""
    obj = project / f"{name}.o"
    subprocess.run(["gcc", "-O2", "-std=c99", "-c", "-o", str(obj), str(project / f"{name}.c")],
                   check=True, capture_output=True)
    out = subprocess.run(["size", str(obj)], capture_output=True, text=True, check=True).stdout
    text, data, bss = (int(x) for x in out.splitlines()[1].split()[:3])
    return data + bss


def host_latency_us(exe: Path, iterations: int) -> float:
    r = subprocess.run([str(exe), "--bench", str(iterations)], capture_output=True, text=True)
    m = re.search(r"ns_per_inference (\d+)", r.stdout)
    if r.returncode != 0 or not m:
        raise BuildError(f"benchmark run of {exe} failed: {r.stdout}{r.stderr}")
    return int(m.group(1)) / 1000.0


def bench_one(model: str, board: str, iterations: int, with_tflm: bool) -> dict:
    from .info import model_info
    from .runner import compiled_project
    info = model_info(model)
    project, exe, _ = compiled_project(model, board)
    row = {
        "model": Path(model).name, "board": board, "macs": info["macs"],
        "arena_bytes": info["arena_bytes"], "lower_bound_bytes": info["lower_bound_bytes"],
        "ram_bytes": static_ram_bytes(project, "model"), "weight_bytes": info["weight_bytes"],
        "latency_us": round(host_latency_us(exe, iterations), 1),
        "tflm_arena_bytes": None, "tflm_arena_total_bytes": None, "tflm_latency_us": None,
    }
    if with_tflm and tflm.available():
        arena = tflm.arena_bytes(model)
        row["tflm_arena_bytes"] = arena["head"]
        row["tflm_arena_total_bytes"] = arena.get("total")
        row["tflm_latency_us"] = round(tflm.latency_us(Path(model).read_bytes(),
                                                       max(1, iterations // 5)), 1)
    return row


def bench(models: list, board: str = "host", iterations: int = 50, with_tflm: bool = True,
          progress=None) -> list:
    rows = []
    for i, m in enumerate(models):
        if progress:
            print(f"[{i + 1}/{len(models)}] {m}", file=progress, flush=True)
        rows.append(bench_one(m, board, iterations, with_tflm))
    return rows


def _ratio(a, b) -> str:
    return f"{a / b:.2f}" if a is not None and b else "-"


def format_table(rows: list) -> str:
    head = ("model", "MACs", "arena", "RAM", "TFLM arena", "RAM/TFLM", "weights",
            "latency us", "TFLM us", "lat/TFLM")
    lines = [head]
    for r in rows:
        lines.append((r["model"], f"{r['macs']:,}", f"{r['arena_bytes']:,}", f"{r['ram_bytes']:,}",
                      f"{r['tflm_arena_bytes']:,}" if r["tflm_arena_bytes"] else "-",
                      _ratio(r["ram_bytes"], r["tflm_arena_bytes"]), f"{r['weight_bytes']:,}",
                      f"{r['latency_us']:,.1f}",
                      f"{r['tflm_latency_us']:,.1f}" if r["tflm_latency_us"] else "-",
                      _ratio(r["latency_us"], r["tflm_latency_us"])))
    widths = [max(len(str(row[i])) for row in lines) for i in range(len(head))]
    return "\n".join("  ".join(str(c).rjust(w) if j else str(c).ljust(w)
                               for j, (c, w) in enumerate(zip(row, widths))) for row in lines)
