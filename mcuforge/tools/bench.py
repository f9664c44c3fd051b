"""`mcuforge bench`: arena, RAM, weights and latency of the generated code beside TFLM's."""
from __future__ import annotations

import hashlib
import re
import subprocess
import textwrap
from pathlib import Path

from . import tflm
from mcuforge.ir.errors import BuildError, McuforgeError


def static_ram_bytes(project: Path, name: str) -> int:
    """data + bss of the compiled model (arena and any other static state), from the object."""
    obj = project / f"{name}.o"
    subprocess.run(["gcc", "-O2", "-std=c99", "-c", "-o", str(obj), str(project / f"{name}.c")],
                   check=True, capture_output=True)
    out = subprocess.run(["size", str(obj)], capture_output=True, text=True, check=True).stdout
    text, data, bss = (int(x) for x in out.splitlines()[1].split()[:3])
    return data + bss


def host_latency_us(exe: Path, iterations: int, rounds: int = 3) -> float:
    """Best of `rounds` mean times per inference, as LiteRT's and TFLM's are taken (a round
    slowed by another process on the machine does not count)."""
    best = None
    for _ in range(rounds):
        r = subprocess.run([str(exe), "--bench", str(iterations)], capture_output=True,
                           text=True)
        m = re.search(r"ns_per_inference (\d+)", r.stdout)
        if r.returncode != 0 or not m:
            raise BuildError(f"benchmark run of {exe} failed: {r.stdout}{r.stderr}")
        us = int(m.group(1)) / 1000.0
        best = us if best is None else min(best, us)
    return best


def litert_latency_us(model: str, iterations: int) -> float | None:
    """Best-of-3 mean time of LiteRT's invoke with its built-in (optimized) kernels, one thread,
    no default delegate (XNNPACK), zero inputs; None without LiteRT or a model it refuses
    (ONNX). Includes Python's call overhead of a few microseconds per invoke."""
    import time

    import numpy as np
    try:
        from ai_edge_litert.interpreter import Interpreter, OpResolverType
    except ImportError:
        return None
    if not str(model).endswith(".tflite"):
        return None
    try:
        it = Interpreter(model_path=str(model), num_threads=1, experimental_op_resolver_type=(
            OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES))
        it.allocate_tensors()
    except (ValueError, RuntimeError):
        return None
    for d in it.get_input_details():
        it.set_tensor(d["index"], np.zeros(d["shape"], dtype=d["dtype"]))
    it.invoke()
    best = None
    for _ in range(3):
        t0 = time.perf_counter()
        for _ in range(iterations):
            it.invoke()
        dt = (time.perf_counter() - t0) / iterations * 1e6
        best = dt if best is None else min(best, dt)
    return best


def _is_tflite(model: str) -> bool:
    """A TFLite flatbuffer (its file identifier), the only kind TFLM runs (not ONNX)."""
    with open(model, "rb") as f:
        return f.read(8)[4:8] == b"TFL3"


def bench_one(model: str, board: str, iterations: int, with_tflm: bool,
              input_shapes: dict | None = None, memory_priority: float | None = None) -> dict:
    from .info import model_info
    from ..runner import compiled_project
    info = model_info(model, input_shapes=input_shapes, memory_priority=memory_priority)
    project, exe, _ = compiled_project(model, board, input_shapes=input_shapes,
                                       memory_priority=memory_priority)
    row = {
        "model": Path(model).name, "board": board, "macs": info["macs"],
        "arena_bytes": info["arena_bytes"], "lower_bound_bytes": info["lower_bound_bytes"],
        "ram_bytes": static_ram_bytes(project, "model"), "weight_bytes": info["weight_bytes"],
        "latency_us": round(host_latency_us(exe, iterations), 1),
        "tflm_arena_bytes": None, "tflm_arena_total_bytes": None, "tflm_latency_us": None,
        "litert_latency_us": None,
    }
    if "memory_priority" in info:
        row["memory_priority"] = info["memory_priority"]
    litert = litert_latency_us(model, iterations)
    if litert is not None:
        row["litert_latency_us"] = round(litert, 1)
    if with_tflm and tflm.available() and _is_tflite(model):
        arena = tflm.arena_bytes(model)
        row["tflm_arena_bytes"] = arena["head"]
        row["tflm_arena_total_bytes"] = arena.get("total")
        row["tflm_latency_us"] = round(tflm.latency_us(Path(model).read_bytes(),
                                                       max(1, iterations // 5)), 1)
    return row


def elf_sizes(elf: Path, cross: str) -> dict:
    """Berkeley sizes of an ELF: text (code + rodata, in flash), data, bss."""
    out = subprocess.run([cross + "size", "-B", str(elf)], capture_output=True, text=True,
                         check=True).stdout
    text, data, bss = (int(x) for x in out.splitlines()[1].split()[:3])
    return {"text": text, "data": data, "bss": bss}


# TFLM with CMSIS-NN on the same emulator: instructions per Invoke, by board and model file
# (its content's sha256, so a renamed copy matches and another model never does), the figure our code is compared with. Measured with tests/yardstick/ (README there):
# tflite-micro 90b983c2, CMSIS-NN 4ab83cc3, CMSIS_6 5782d6f8 (TFLM's pins), TFLM's Makefile
# (cortex_m_generic, cortex-m4+fp / cortex-m7+fp, OPTIMIZED_KERNEL_DIR=cmsis_nn,
# BUILD_TYPE=release_with_logs: core -Os, kernels and CMSIS-NN -O2), arm-none-eabi-gcc 12.2 +
# newlib-nano, QEMU 7.2 -icount shift=0, SysTick (40-instruction resolution), random input
# (seed 0) written before each Invoke. The an386 MLPerf four agree with shared/notes/
# measuring-on-qemu.md within 0.05% (same arenas). The others are tflite-micro's int8 examples
# (tensorflow/lite/micro/models/, examples/*/models/, third_party/xtensa/examples/).
TFLM_CMSIS_INSTRUCTIONS = {  # board -> first 16 hex digits of the model file's sha256 -> count
    # the M55 (Helium kernels of CMSIS-NN): figures of the study behind issue 13, same emulator
    "mps3-an547": {
        "aeea436800704fce": 1_814_742,  # kws_ref_model.tflite
        "597a384c8c2c8a12": 6_558_336,  # vww_96_int8.tflite
        "3c002613d1b2475e": 4_911_676,  # pretrainedResnet_quant.tflite
        "87cf24194ef93d1d": 149_995,  # ad01_int8.tflite
    },
    "mps2-an386": {
        "aeea436800704fce": 7_698_280,  # kws_ref_model.tflite
        "597a384c8c2c8a12": 24_102_800,  # vww_96_int8.tflite
        "3c002613d1b2475e": 29_863_680,  # pretrainedResnet_quant.tflite
        "87cf24194ef93d1d": 583_240,  # ad01_int8.tflite
        "808cfdfc0cf3a6fa": 22_929_280,  # person_detect.tflite
        "09e5e2a9dfb2d8ed": 1_495_520,  # micro_speech_quantized.tflite
        "505ee4fae7fa46ab": 3_640,  # hello_world_int8.tflite
        "a44e4d8a6c051db5": 574_560,  # trained_lstm_int8.tflite
        "91e94316d1a4747d": 748_440,  # dtln_noise_suppression.tflite
        "94375ed22731cbad": 12_101_240,  # micro_speech_lstm.tflite
        "1d5e0e5c9a7369ca": 120_640,  # keyword_scrambled_8bit.tflite
    },
    "mps2-an500": {
        "aeea436800704fce": 7_644_040,  # kws_ref_model.tflite
        "597a384c8c2c8a12": 24_026_400,  # vww_96_int8.tflite
        "3c002613d1b2475e": 30_026_520,  # pretrainedResnet_quant.tflite
        "87cf24194ef93d1d": 583_560,  # ad01_int8.tflite
        "808cfdfc0cf3a6fa": 22_716_760,  # person_detect.tflite
        "09e5e2a9dfb2d8ed": 1_489_560,  # micro_speech_quantized.tflite
        "505ee4fae7fa46ab": 3_640,  # hello_world_int8.tflite
        "a44e4d8a6c051db5": 569_840,  # trained_lstm_int8.tflite
        "91e94316d1a4747d": 767_440,  # dtln_noise_suppression.tflite
        "94375ed22731cbad": 12_076_120,  # micro_speech_lstm.tflite
        "1d5e0e5c9a7369ca": 120_800,  # keyword_scrambled_8bit.tflite
    },
}


# TFLM's portable reference kernels on mps2-an386 (M4): the only interpreter figures for a
# core without SIMD (issue 13 gives them to 3 digits); rows of boards without dsp/mve show them
TFLM_REFERENCE_M4 = {
    "aeea436800704fce": 43_000_000,  # kws_ref_model.tflite
    "597a384c8c2c8a12": 100_300_000,  # vww_96_int8.tflite
    "3c002613d1b2475e": 107_400_000,  # pretrainedResnet_quant.tflite
    "87cf24194ef93d1d": 1_950_000,  # ad01_int8.tflite
}
TFLM_REFERENCE_SOURCE = ("TFLM ref (M4): tflite-micro's portable reference kernels on mps2-an386, "
                         "the only interpreter figures recorded for a core without SIMD")


TFLM_CMSIS_SOURCE = ("TFLM+CMSIS: instructions per invoke of tflite-micro with CMSIS-NN on the "
                     "same emulator, measured once with tests/yardstick/ and recorded in "
                     "mcuforge/tools/bench.py by the model file's sha256")


def tflm_cmsis_figure(model: str, board_name: str) -> tuple:
    """(recorded TFLM+CMSIS-NN instructions, None), or (None, why there is none)."""
    if board_name not in TFLM_CMSIS_INSTRUCTIONS:
        return None, f"no TFLM+CMSIS-NN figures recorded for {board_name}"
    digest = hashlib.sha256(Path(model).read_bytes()).hexdigest()[:16]
    count = TFLM_CMSIS_INSTRUCTIONS[board_name].get(digest)
    return (count, None) if count else (None, "no TFLM+CMSIS-NN figure for this model file")


def bench_board(model: str, board_name: str, with_tflm: bool, per_layer: bool = False,
                flash_budget: int | None = None, input_shapes: dict | None = None,
                keep_input: bool = False, memory_priority: float | None = None) -> dict:
    """Instructions per inference under QEMU, flash/RAM from the ELF, measured stack;
    `per_layer`: also each layer's instructions, from a second, profiled build (layer_rows)."""
    import numpy as np

    from ..api import load
    from ..board import load_board
    from .info import model_info
    from ..runner import split_inputs
    from ..target import run_on_board
    board = load_board(board_name)
    info = model_info(model, board=board_name, flash_budget=flash_budget,
                      input_shapes=input_shapes, keep_input=keep_input,
                      memory_priority=memory_priority)
    g = load(model, input_shapes)
    rng = np.random.default_rng(0)
    xs = []
    for name in g.inputs:  # one fixed input: counts depend on data only through branches
        t = g.tensors[name]
        if np.dtype(t.dtype).kind == "f":
            xs.append(rng.standard_normal(t.shape).astype(t.dtype))
        else:  # integers over their range; bool (an if's condition) 0 or 1
            lo, hi = (0, 1) if t.dtype == "bool" else (np.iinfo(t.dtype).min,
                                                       np.iinfo(t.dtype).max)
            xs.append(rng.integers(lo, hi + 1, size=t.shape).astype(t.dtype))
    arrays, _ = split_inputs(g, dict(zip(g.inputs, xs)))
    run = run_on_board(model, arrays, board_name, flash_budget=flash_budget,
                       input_shapes=input_shapes, keep_input=keep_input,
                       memory_priority=memory_priority)
    tflm_cmsis, tflm_cmsis_why = tflm_cmsis_figure(model, board_name)
    sizes = elf_sizes(run.elf, board.cross)
    instructions = run.instructions[0]
    row = {
        "model": Path(model).name, "board": board_name, "macs": info["macs"],
        "arena_bytes": info["arena_bytes"], "lower_bound_bytes": info["lower_bound_bytes"],
        "scratch_bytes": info["scratch_bytes"],
        "ram_bytes": sizes["data"] + sizes["bss"], "weight_bytes": info["weight_bytes"],
        "latency_us": None, "tflm_arena_bytes": None, "tflm_latency_us": None,
        "instructions": instructions,
        "macs_per_instruction": round(info["macs"] / instructions, 3) if instructions else None,
        # code: flash less the model's constant data and the harness's built-in input vector
        "flash_bytes": sizes["text"],
        "code_bytes": sizes["text"] - info["weight_bytes"] - sum(a[0].nbytes for a in arrays),
        "stack_bytes": run.stack_bytes,
        # the recorded figure of this very file (by content, not name), else none and why
        "tflm_cmsis_instructions": tflm_cmsis, "tflm_cmsis_missing": tflm_cmsis_why,
    }
    target = board.target(flash_budget)
    if not (target.dsp or target.mve):
        digest = hashlib.sha256(Path(model).read_bytes()).hexdigest()[:16]
        row["tflm_reference_m4_instructions"] = TFLM_REFERENCE_M4.get(digest)
    if "memory_priority" in info:
        mp = row["memory_priority"] = dict(info["memory_priority"])
        # the default build's instructions beside (the same build when nothing was patched)
        mp["default_instructions"] = instructions if not mp["stage_layers"] else run_on_board(
            model, arrays, board_name, flash_budget=flash_budget, input_shapes=input_shapes,
            keep_input=keep_input).instructions[0]
    if with_tflm and tflm.available() and _is_tflite(model):
        row["tflm_arena_bytes"] = tflm.arena_bytes(model)["head"]
    if per_layer:
        row.update(layer_rows(run_on_board(model, arrays, board_name, flash_budget=flash_budget,
                                           profile=True, input_shapes=input_shapes,
                                           keep_input=keep_input,
                                           memory_priority=memory_priority), board,
                              instructions))
    return row


def layer_rows(run, board, whole: int) -> dict:
    """A profiled run's per-layer figures. A layer's ticks span the counter reads of two marks
    (templates/firmware/main.c.j2), so they include one mark's own cost, which the firmware
    measures on a run of marks and this subtracts. The marks tile the invoke, so the layers add
    up to the whole invoke (`whole`, instructions of the build without marks) less the
    invoke's own code outside its calls (entry, state copies, return) and the counter's
    resolution: one tick, board.instructions(1) instructions, per layer and in the whole."""
    p = run.profile
    per_tick = 1e9 / board.clock_hz  # instructions per tick under QEMU -icount shift=0
    mark = p.mark_ticks * per_tick / p.marks
    layers = []
    for name, macs, ticks in zip(p.names, p.macs, p.ticks[0]):
        n = max(0, round(ticks * per_tick - mark))
        layers.append({"layer": name, "instructions": n, "macs": macs,
                       "macs_per_instruction": round(macs / n, 3) if n else None})
    total = sum(r["instructions"] for r in layers)
    return {"layers": layers, "layers_instructions": total,
            "layers_outside_instructions": whole - total,
            "mark_instructions": round(mark, 1),
            "counter_resolution_instructions": round(per_tick, 2),
            "profiled_instructions": run.instructions[0]}


def bench(models: list, board: str = "host", iterations: int = 50, with_tflm: bool = True,
          progress=None, per_layer: bool = False, flash_budget: int | None = None,
          input_shapes: dict | None = None, keep_input: bool = False,
          memory_priority: float | None = None) -> list:
    """One row of figures per model; `input_shapes` ({input: shape}), `keep_input` and
    `memory_priority` as compile's, for every model (keep_input: on a board; the host rows
    measure the default)."""
    if per_layer and board == "host":
        raise McuforgeError("bench --per-layer counts instructions on an emulated board: give "
                            "--board (mps2-an385, mps2-an386, mps2-an500, mps3-an547, "
                            "riscv32-virt)")
    rows = []
    for i, m in enumerate(models):
        if progress:
            print(f"[{i + 1}/{len(models)}] {m}", file=progress, flush=True)
        if board == "host":
            rows.append(bench_one(m, board, iterations, with_tflm, input_shapes,
                                  memory_priority))
        else:
            rows.append(bench_board(m, board, with_tflm, per_layer, flash_budget,
                                    input_shapes, keep_input, memory_priority))
    return rows


def _ratio(a, b) -> str:
    return f"{a / b:.2f}" if a is not None and b else "-"


def format_table(rows: list) -> str:
    if rows and rows[0]["board"] != "host":
        return "\n\n".join([format_board_table(rows)]
                           + [format_layer_table(r) for r in rows if "layers" in r])
    legend = [HOST_LEGEND] + ([PRIORITY_LEGEND] if any("memory_priority" in r for r in rows)
                              else [])
    return "\n".join([_table(*_host_columns(rows)), ""] + [textwrap.fill(t, 100) for t in legend])


HOST_LEGEND = ("latency: this computer, gcc -O3 -march=native. TFLM arena, TFLM us: tflite-micro's "
               "Python package (reference kernels, no CMSIS-NN) run here; LiteRT us: LiteRT's "
               "built-in kernels, one thread. -: not measured (--no-tflm, not a .tflite model, "
               "or the runtime is not installed).")


def format_layer_table(r: dict) -> str:
    """One model's layers: instructions, MACs, MACs per instruction, share of the layers."""
    total = r["layers_instructions"]
    head = ("layer", "instructions", "share", "MACs", "MACs/instr")
    lines = [(x["layer"], f"{x['instructions']:,}",
              f"{100 * x['instructions'] / total:.1f}%" if total else "-", f"{x['macs']:,}",
              f"{x['macs_per_instruction']:.3f}" if x["macs_per_instruction"] else "-")
             for x in r["layers"]]
    macs = sum(x["macs"] for x in r["layers"])
    lines.append(("total (layers)", f"{total:,}", "100.0%" if total else "-", f"{macs:,}",
                  f"{macs / total:.3f}" if total else "-"))
    lines.append(("whole invoke", f"{r['instructions']:,}", "", f"{r['macs']:,}",
                  f"{r['macs_per_instruction']:.3f}" if r["macs_per_instruction"] else "-"))
    head_note = (f"{r['model']} on {r['board']}, per layer: instructions between layer marks "
                 f"less a mark's own {r['mark_instructions']}, each to within one counter tick "
                 f"({r['counter_resolution_instructions']:g} instructions)")
    foot_note = (f"whole invoke - layers = {r['layers_outside_instructions']:,}: the invoke's "
                 f"own code outside its calls (entry, state copies, return) and the counter's "
                 f"resolution")
    return "\n".join([head_note, _table(head, lines), foot_note])


def _priority_columns(rows: list, instructions: bool) -> tuple:
    """With --memory-priority: the default build's figures beside each row (its arena, the
    extra MACs of the bands, its instructions on a board), else nothing."""
    if not any("memory_priority" in r for r in rows):
        return (), [() for _ in rows]
    head = ("default arena", "MACs +%") + (("default instr",) if instructions else ())
    cols = []
    for r in rows:
        mp = r.get("memory_priority")
        if mp is None:
            cols.append(("-",) * len(head))
            continue
        cols.append((f"{mp['default_arena_bytes']:,}", f"{mp['mac_overhead_percent']:.1f}")
                    + ((f"{mp['default_instructions']:,}",) if instructions else ()))
    return head, cols


def format_board_table(rows: list) -> str:
    head = ("model", "MACs", "instructions", "TFLM+CMSIS", "instr/TFLM", "MACs/instr", "arena",
            "scratch", "TFLM arena", "RAM", "flash", "weights", "code", "stack")
    extra_head, extra = _priority_columns(rows, True)
    lines = [(r["model"], f"{r['macs']:,}", f"{r['instructions']:,}",
              f"{r['tflm_cmsis_instructions']:,}" if r["tflm_cmsis_instructions"] else "-",
              _ratio(r["instructions"], r["tflm_cmsis_instructions"]),
              f"{r['macs_per_instruction']:.3f}", f"{r['arena_bytes']:,}",
              f"{r['scratch_bytes']:,}",
              f"{r['tflm_arena_bytes']:,}" if r["tflm_arena_bytes"] else "-",
              f"{r['ram_bytes']:,}", f"{r['flash_bytes']:,}", f"{r['weight_bytes']:,}",
              f"{r['code_bytes']:,}",
              f"{r['stack_bytes']:,}") for r in rows]
    if any(r.get("tflm_reference_m4_instructions") for r in rows):  # a core without SIMD
        head = head[:5] + ("TFLM ref (M4)", "instr/ref") + head[5:]
        lines = [line[:5] + (f"{ref:,}" if ref else "-", _ratio(r["instructions"], ref))
                 + line[5:] for r, line in zip(rows, lines)
                 for ref in [r.get("tflm_reference_m4_instructions")]]
    head, lines = head + extra_head, [line + e for line, e in zip(lines, extra)]
    legend = [TFLM_CMSIS_SOURCE + "."]
    if any(r.get("tflm_reference_m4_instructions") for r in rows):
        legend.append(TFLM_REFERENCE_SOURCE + ".")
    if extra_head:
        legend.append(PRIORITY_LEGEND)
    for why in sorted({r.get("tflm_cmsis_missing") for r in rows} - {None}):
        names = ", ".join(r["model"] for r in rows if r.get("tflm_cmsis_missing") == why)
        legend.append(f"TFLM+CMSIS -: {why} ({names}).")
    return "\n".join([_table(head, lines), ""] + [textwrap.fill(t, 100) for t in legend])


PRIORITY_LEGEND = ("--memory-priority: arena, MACs and instructions are the banded build's; "
                   "default arena, default instr: the same model built without it; MACs +%: "
                   "the bands' extra MACs (recomputed halos) in percent of the default's.")


def _host_columns(rows: list) -> tuple:
    head = ("model", "MACs", "arena", "RAM", "TFLM arena", "RAM/TFLM", "weights",
            "latency us", "TFLM us", "lat/TFLM", "LiteRT us", "lat/LiteRT")
    lines = []
    for r in rows:
        lines.append((r["model"], f"{r['macs']:,}", f"{r['arena_bytes']:,}", f"{r['ram_bytes']:,}",
                      f"{r['tflm_arena_bytes']:,}" if r["tflm_arena_bytes"] else "-",
                      _ratio(r["ram_bytes"], r["tflm_arena_bytes"]), f"{r['weight_bytes']:,}",
                      f"{r['latency_us']:,.1f}",
                      f"{r['tflm_latency_us']:,.1f}" if r["tflm_latency_us"] else "-",
                      _ratio(r["latency_us"], r["tflm_latency_us"]),
                      f"{r['litert_latency_us']:,.1f}" if r.get("litert_latency_us") else "-",
                      _ratio(r["latency_us"], r.get("litert_latency_us"))))
    extra_head, extra = _priority_columns(rows, False)
    return head + extra_head, [line + e for line, e in zip(lines, extra)]


def _table(head: tuple, rows: list) -> str:
    lines = [head] + rows
    widths = [max(len(str(row[i])) for row in lines) for i in range(len(head))]
    return "\n".join("  ".join(str(c).rjust(w) if j else str(c).ljust(w)
                               for j, (c, w) in enumerate(zip(row, widths))) for row in lines)
