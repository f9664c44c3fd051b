"""The `mcuforge` command line. Errors a user can act on exit with status 2, no traceback."""
from __future__ import annotations

import argparse
import json
import os
import sys
import textwrap
import warnings
from collections import Counter
from pathlib import Path

import numpy as np

from mcuforge.codegen_c.names import printable

from mcuforge.ir.errors import McuforgeError, ModelNote

from .arrays import load_arrays

from .board import board_names

DESCRIPTION = """\
Compile a neural network into a standalone C project: no interpreter, no malloc, one static
arena whose size is known at compile time. Takes ONNX (.onnx) and TFLite (.tflite) models:
float32, int8, and TFLite's 16x8 (int16 activations, int8 weights); a float model can be
quantized to int8 by mcuforge (compile --quantize int8 --calibration DATA).

  mcuforge compile model.onnx -o out/       write the C project; then: make -C out/
  mcuforge run model.tflite --input x.npy --output y.npy
  mcuforge info model.tflite                ops, MACs, weights, planned arena
  mcuforge report model.tflite --board mps2-an386 -o report.html
                                            per-layer analysis: memory picture, costs
  mcuforge bench model.tflite ...           arena, RAM and latency beside TFLM's
  mcuforge validate model.tflite --data x.npz   the C vs the reference runtime on your data
  mcuforge cache info                       the build cache's location and size (cache clean)
  mcuforge bench-quant model.onnx ...       int8 quantization quality of float models
  mcuforge demo                             a digits CNN: float vs int8 accuracy in C, TFLM check
  mcuforge conformance onnx                 ONNX's backend test cases, per operator
  mcuforge conformance tflite               single-op TFLite models vs tflite-micro, per operator
  mcuforge fuzz --seed 0 --count 200        random ONNX graphs vs onnxruntime (--int8: TFLM)
  mcuforge fuzz-files --cases 500           mutated model files: clean errors, never tracebacks

Run `mcuforge COMMAND --help` for a command's options and an example.
"""


def _cmd_compile(a) -> int:
    from .api import compile as compile_model
    r = compile_model(a.model, a.output, board=a.board, name=a.name,
                      input_shapes=a.input_shapes, quantize=a.quantize,
                      calibration=a.calibration, calibration_method=a.calibration_method,
                      quantize_io=a.quantize_io, emit_tflite=a.emit_tflite,
                      int16_budget=a.int16_budget, force=a.force, flash_budget=a.flash_budget,
                      profile=a.profile, layout=a.layout, command=a.argv,
                      keep_input=a.keep_input, memory_priority=_memory_priority(a))
    print(f"wrote {len(r.files)} files to {r.out_dir}: {', '.join(r.files)}")
    if r.memory_priority is not None:
        from .api import memory_priority_line
        print(memory_priority_line(r.memory_priority))
    if a.quantize:  # the user quantizes inputs / dequantizes outputs with these
        from mcuforge.optimizer.quantize import io_params
        for kind, tname, dtype, q in io_params(r.graph):
            print(f"{kind} '{printable(tname)}': {dtype}, int8 scale {q.scale[0]!r} "
                  f"zero point {q.zero_point[0]}")
    if a.emit_tflite:
        print(f"wrote {a.emit_tflite}")
    state = f", state {r.state_bytes} bytes" if r.state_bytes else ""
    scratch = f", kernel scratch {r.scratch_bytes} bytes of it" if r.scratch_bytes else ""
    print(f"arena {r.arena_bytes} bytes (lower bound {r.lower_bound_bytes}{scratch}){state}, "
          f"weights {r.weight_bytes} bytes, {r.macs} MACs")
    if r.schedules:
        kinds = Counter(c.schedule for c in r.schedules)
        print("micro-kernels: " + ", ".join(f"{k} x{n}" for k, n in sorted(kinds.items())))
        from mcuforge.codegen_c.kernels.budget import summary
        if summary(r.schedules):
            print(summary(r.schedules))
    if a.layout == "library":
        print(f"use it from CMake with add_subdirectory({r.out_dir}) and target_link_libraries("
              f"APP PRIVATE mcuforge::{r.name}); Zephyr, Arduino, PlatformIO: see the README")
    else:
        print(f"build it with: make -C {r.out_dir}")
    return 0


def _cmd_run(a) -> int:
    from .api import load
    from .runner import run
    from .runner import nonfinite_warnings
    graph = load(a.model, a.input_shapes)  # a missing or broken model is reported by its path
    suffix = Path(a.output).suffix.lower()
    if suffix not in (".npy", ".npz"):
        raise McuforgeError(f"cannot write outputs to {a.output}: give --output a .npy or .npz "
                            "file name")
    if suffix == ".npy" and len(graph.outputs) > 1:
        raise McuforgeError(f"the model has {len(graph.outputs)} outputs: give --output a .npz "
                            f"file name (a .npy holds one array)")
    inputs = load_arrays(a.input)
    for line in nonfinite_warnings(graph, inputs):
        print(f"mcuforge: warning: {printable(line)}", file=sys.stderr)
    if a.port and a.check_arena:
        raise McuforgeError("--check-arena runs on the host and the emulated boards only, "
                            "not with --port (run it without --port on an emulated board)")
    if a.port:  # a real board: build, flash, read its UART
        from . import hardware
        if a.memory_priority:
            raise McuforgeError("--memory-priority works on the host and emulated boards "
                                "only for now (compile it, then flash the project)")
        if a.input_shapes:
            raise McuforgeError("--input-shape works on the host board only for now")
        if a.keep_input:
            raise McuforgeError("--keep-input works on the host and the emulated boards only "
                                "for now (not with --port)")
        outputs = hardware.run(a.model, inputs, a.board, a.port, do_flash=not a.no_flash,
                               timeout=a.timeout, wait_message=sys.stderr)
    else:
        outputs = run(a.model, inputs, board=a.board, input_shapes=a.input_shapes,
                      keep_input=a.keep_input, check_arena=a.check_arena,
                      memory_priority=_memory_priority(a))
    if not isinstance(outputs, dict) and suffix == ".npz":
        outputs = {graph.outputs[0]: outputs}
    try:  # through a file object: numpy would append .npy / .npz to a name
        with open(a.output, "wb") as f:
            if suffix == ".npz":
                np.savez(f, **outputs)
            else:
                np.save(f, outputs)
    except OSError as e:
        raise McuforgeError(f"cannot write outputs to {a.output}: {e.strerror or e}") from None
    print(f"wrote {a.output}")
    return 0


def _cmd_info(a) -> int:
    from .tools.info import model_info
    info = model_info(a.model, input_shapes=a.input_shapes) if a.input_shapes else \
        model_info(a.model)
    if a.json:
        print(json.dumps(info, indent=2))
        return 0
    print(f"model {printable(info['model'])}")
    print(f"  ops: {', '.join(f'{k} x{v}' for k, v in info['ops'].items())}")
    print(f"  MACs: {info['macs']:,}")
    print(f"  weights: {info['weight_bytes']:,} bytes")
    print(f"  arena: {info['arena_bytes']:,} bytes (layer-wise lower bound "
          f"{info['lower_bound_bytes']:,})")
    if info["state_bytes"]:
        print(f"  state kept between invokes: {info['state_bytes']:,} bytes")
    for kind in ("inputs", "outputs"):
        for t in info[kind]:
            q = "" if t["scale"] is None else f" scale {t['scale']} zero point {t['zero_point']}"
            print(f"  {kind[:-1]} '{printable(t['name'])}': {t['dtype']}{t['shape']}{q}")
    print(f"  tensors: {info['tensors']}")
    return 0


def _cmd_bench(a) -> int:
    from .tools.bench import bench, format_table
    rows = bench(a.models, board=a.board, iterations=a.iterations, with_tflm=not a.no_tflm,
                 flash_budget=a.flash_budget, per_layer=a.per_layer,
                 progress=None if a.json else sys.stderr, input_shapes=a.input_shapes,
                 keep_input=a.keep_input, memory_priority=_memory_priority(a))
    print(json.dumps(rows, indent=2) if a.json else format_table(rows))
    return 0


def _cmd_bench_quant(a) -> int:
    from .tools.bench_quant import bench_quant, format_table
    if isinstance(a.calibration, int) != isinstance(a.eval, int):  # one error, not one a model
        raise McuforgeError("bench-quant: give both --calibration DATA and --eval DATA, or "
                            "neither")
    rows = bench_quant(a.models, a.calibration, a.eval, progress=None if a.json else sys.stderr,
                       int16_budget=a.int16_budget,
                       warn=sys.stderr if a.json else None)  # the table says it otherwise
    print(json.dumps(rows, indent=2) if a.json else format_table(rows))
    return 1 if any("model" in r["errors"] for r in rows) else 0  # the others still printed


def _cmd_validate(a) -> int:
    from .tools.validate import format_report, to_json, validate
    r = validate(a.model, a.data, a.labels, board=a.board, quantize=a.quantize,
                 calibration=a.calibration, calibration_method=a.calibration_method,
                 limit=a.limit, per_layer=a.per_layer, tolerance=a.tolerance,
                 progress=sys.stderr)
    print(to_json(r) if a.json else format_report(r))
    return 0


def _cmd_conformance(a) -> int:
    from .tools.conformance import report, run_onnx, summary, write_json
    if a.json and not Path(a.json).parent.is_dir():  # fail before the run, not after it
        raise McuforgeError(f"cannot write {a.json}: {Path(a.json).parent} is not a directory")
    if a.suite == "tflite":
        from .tools.conformance_tflite import run_tflite
        results = run_tflite(a.jobs, a.filter, progress=sys.stderr)
    else:
        results = run_onnx(a.kind, a.jobs, a.filter, progress=sys.stderr)
    print(report(results))
    if a.json:
        try:
            write_json(results, a.json)
        except OSError as e:
            raise McuforgeError(f"cannot write {a.json}: {e.strerror or e}") from None
    return 1 if summary(results)["failed"] else 0


def _cmd_fuzz(a) -> int:
    from .tools.fuzz import KNOWN, default_jobs, summary, sweep
    outcomes = sweep(a.seed, a.count, int8=a.int8, jobs=a.jobs or default_jobs(), save=a.save,
                     exclude=KNOWN if a.exclude_known else (), minimise_failures=a.minimise,
                     progress=sys.stderr)
    print(summary(outcomes))
    if a.save:
        print(f"failing and refused models saved in {a.save}")
    return 1 if any(o.failed for o in outcomes) else 0


def _cmd_fuzz_files(a) -> int:
    from .tools.fuzz_files import fuzz
    formats = ("tflite", "onnx") if a.format == "both" else (a.format,)
    r = fuzz(a.cases, seed=a.seed, timeout=a.timeout, models=a.models, formats=formats,
             progress=None if a.json else sys.stderr, save_dir=a.save)
    print(json.dumps(r.as_dict(), indent=2) if a.json else r.text())
    return 1 if r.bad else 0


def _cmd_cache(a) -> int:
    from .build import cache_clean, cache_entries, cache_max_bytes, cache_root
    if a.action == "clean":
        n, freed = cache_clean()
        left = len(cache_entries())
        print(f"removed {n} entries ({freed:,} bytes) from {cache_root()}"
              + (f"; {left} in use by a running mcuforge kept" if left else ""))
        return 0
    entries = cache_entries()
    size = sum(b for _, b, _ in entries)
    fw = sum(1 for e, _, _ in entries if e.parent.name == "fw")
    print(f"location: {cache_root()} ($MCUFORGE_CACHE)")
    print(f"entries: {len(entries)} ({len(entries) - fw} host builds, {fw} firmware)")
    print(f"size: {size:,} bytes of at most {cache_max_bytes():,} ($MCUFORGE_CACHE_MAX)")
    return 0


CACHE_HELP = """\
Compiled and built models are kept for `run`, `bench` and the tools, keyed by the model, the
options and mcuforge's own sources, so a repeated run does not rebuild.

  location   $MCUFORGE_CACHE, else ~/.cache/mcuforge (firmware builds under fw/)
  size cap   $MCUFORGE_CACHE_MAX bytes (K, M, G suffixes; default 2G): past it, the least
             recently used entries are removed after each new build

  mcuforge cache info     location, entries and size
  mcuforge cache clean    remove every entry (those in use by a running mcuforge stay)

example:
  mcuforge cache info
"""


def _bytes(text: str) -> int:
    """A byte count: 100000, 512K (KiB), 1M (MiB)."""
    scale = {"K": 1024, "M": 1024 * 1024}.get(text[-1:].upper(), 1)
    try:
        value = int(text[:-1] if scale > 1 else text) * scale
    except ValueError:
        value = -1
    if value <= 0:
        raise argparse.ArgumentTypeError(f"'{text}' is not a number of bytes (e.g. 262144, "
                                         f"256K, 1M)")
    return value


def _int16_budget(text: str):
    if text == "auto":
        return None
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"'{text}' is not a number of bytes >= 0 or 'auto'")
    return value


def _input_shape(text: str) -> tuple:
    """--input-shape NAME=1,3,32,32 -> (name, (1, 3, 32, 32))."""
    name, eq, dims = text.rpartition("=")
    try:
        shape = tuple(int(d) for d in dims.split(","))
    except ValueError:
        shape = ()
    if not eq or not name or not shape or min(shape) <= 0:
        raise argparse.ArgumentTypeError(
            f"'{text}' is not NAME=D1,D2,... with positive dimensions (e.g. input=1,3,32,32)")
    return name, shape


def _positive(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"'{text}' is not a positive whole number")
    return int(text)


def _count_or_data(text: str):
    """bench-quant's --calibration / --eval: a number of generated samples, or a data path."""
    return _positive(text) if text.isdigit() else text


class _ShapeDict(argparse.Action):
    """Collects repeated --input-shape values into {name: shape}."""

    def __call__(self, parser, namespace, value, option_string=None):
        shapes = dict(getattr(namespace, self.dest) or {})
        shapes[value[0]] = value[1]
        setattr(namespace, self.dest, shapes)


def _add_input_shape(p) -> None:
    p.add_argument("--input-shape", dest="input_shapes", type=_input_shape, action=_ShapeDict,
                   metavar="NAME=D1,D2,...",
                   help="shape of a model input whose dimensions the model leaves open (ONNX symbolic dims, TFLite -1 in shape_signature); only open dims may differ from the model (repeatable)")
    p.set_defaults(input_shapes=None)


def _add_memory_priority(p) -> None:
    p.add_argument("--memory-priority", action="store_true",
                   help="compute the first layers in bands of rows (the halos recomputed or "
                        "copied between bands) where that shrinks the arena, for at most "
                        "--memory-priority-max-macs more MACs; bit-exact")
    p.add_argument("--memory-priority-max-macs", type=float, default=10.0, metavar="PCT",
                   help="with --memory-priority: the extra MACs allowed, in percent "
                        "(default: 10). The smallest arenas put the first bands' window "
                        "layers on plain loops without scratch, several times slower: each "
                        "of their MACs counts 6 more against this bound (give 1000 for the "
                        "smallest arena at any cost)")


def _memory_priority(a):
    """The extra MACs --memory-priority allows (percent), or None without it."""
    return a.memory_priority_max_macs if a.memory_priority else None


def _cmd_report(a) -> int:
    from .tools.report import analyze, write_report
    out = a.output or ("report.json" if a.json else "report.html")
    r = analyze(a.model, board=a.board, input_shapes=a.input_shapes,
                flash_budget=a.flash_budget, progress=sys.stderr,
                memory_priority=_memory_priority(a))
    write_report(r, out, as_json=a.json)
    print(f"wrote {out}")
    return 0


def _cmd_demo(a) -> int:
    if a.synthetic:
        from .tools.demo import run_demo
        return run_demo(a.output)
    from .tools.digits_demo import run_digits_demo
    return run_digits_demo(a.output)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="mcuforge", description=DESCRIPTION,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    from .version import version
    p.add_argument("--version", action="version", version=f"mcuforge {version()}")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(name, help, example=None):
        """A subcommand whose own --help says what it does, too, with an example."""
        text = textwrap.fill(help[0].upper() + help[1:] + ".", 90)
        if example:
            text += "\n\nexample:\n  " + example
        return sub.add_parser(name, help=help, description=text,
                              formatter_class=argparse.RawDescriptionHelpFormatter)

    boards = ", ".join(board_names())

    def board_help(default):
        return (f"target board, one of: {boards} (boards/<name>/board.toml)"
                + (f"; default: {default}" if default else ""))

    c = command("compile", "write a C project for a model: the model's C source and header, the "
                "runtime headers, a main program, and a Makefile for the board (a host "
                "executable, or firmware with start-up code and linker script)",
                "mcuforge compile kws.tflite --board mps2-an386 -o kws/ && make -C kws/ run")
    c.add_argument("model", help="the model (.onnx or .tflite)")
    c.add_argument("-o", "--output", required=True, help="directory of the C project")
    c.add_argument("--board", default="host", help=board_help("host"))
    c.add_argument("--force", action="store_true",
                   help="overwrite files in the output folder that mcuforge did not write (or "
                        "that were changed since); without it they are an error")
    c.add_argument("--name", help="C name prefix of the API (default: from the file name)")
    c.add_argument("--layout", choices=["project", "library"], default="project",
                   help="project (default): a project the board builds and runs (harness, "
                        "start-up code, linker script, Makefile); library: the model alone "
                        "under src/, with CMakeLists.txt (a static library target), a Zephyr "
                        "module, an Arduino library and a PlatformIO library.json")
    _add_input_shape(c)
    c.add_argument("--quantize", choices=["int8"],
                   help="quantize a float model (post-training, calibrated on --calibration)")
    c.add_argument("--calibration", metavar="DATA",
                   help="sample inputs: a .npy (batch along axis 0), a .npz keyed by input "
                        "name, or a folder of .npy files")
    c.add_argument("--calibration-method", choices=["minmax", "percentile", "mse"],
                   help="how each tensor's range is chosen (default: mse)")
    c.add_argument("--quantize-io", choices=["int8", "float"], default="int8",
                   help="int8 model inputs/outputs (default), or float32 ones converted at "
                        "the edges")
    c.add_argument("--emit-tflite", metavar="FILE",
                   help="also write the int8 model mcuforge compiles as a .tflite")
    c.add_argument("--int16-budget", type=_int16_budget, default=0, metavar="BYTES|auto",
                   help="keep the activations whose rounding hurts the output most in int16 "
                        "(TFLite's 16x8 scheme, run by tflite-micro) while the arena grows by "
                        "at most BYTES; auto: 2%% of the int8 arena (default: 0, all int8)")
    c.add_argument("--flash-budget", type=_bytes, metavar="BYTES",
                   help="flash the model may take (weights plus 16 KiB for code; default: the "
                        "board's flash). On DSP cores the fastest kernels widen weights to "
                        "int16 (twice the bytes); layers keep int8 weights, cheapest first, "
                        "until the model fits")
    c.add_argument("--keep-input", action="store_true",
                   help="the input buffers keep their values through invoke (by default "
                   "layers may write their outputs over an input they have read, which takes "
                   "less RAM; the generated header says which)")
    c.add_argument("--profile", action="store_true",
                   help="mark each layer in the invoke: mf_layer_mark(k, name), called when "
                        "built with -DMCUFORGE_PROFILE (firmware boards: make PROFILE=1, "
                        "the default then)")
    _add_memory_priority(c)
    c.set_defaults(fn=_cmd_compile)

    r = command("run", "compile, build and run a model on inputs from a .npy/.npz, on the host "
                "or an emulated board, and write its outputs",
                "mcuforge run model.onnx --input x.npy --output y.npy")
    r.add_argument("model", help="the model (.onnx or .tflite)")
    r.add_argument("--input", required=True,
                   help=".npy with one input, or a batch along a new leading axis; "
                        ".npz keyed by input name for several inputs")
    r.add_argument("--output", required=True,
                   help="where to write the outputs, exactly this file: a .npy (one output), or a "
                        ".npz keyed by output name (any number of outputs)")
    r.add_argument("--board", default="host", help=board_help("host"))
    r.add_argument("--port", metavar="DEV",
                   help="a real board's serial port (/dev/ttyACM0): build, flash (pyOCD / "
                        "nrfjprog), read the results from its UART (needs pyserial: pip "
                        "install 'mcuforge[boards]')")
    r.add_argument("--no-flash", action="store_true",
                   help="with --port: this firmware (these inputs) is on the board already "
                        "(a previous run flashed it); press its reset button")
    r.add_argument("--keep-input", action="store_true",
                   help="the input buffers keep their values through invoke (by default "
                   "layers may write their outputs over an input they have read, which takes "
                   "less RAM; the generated header says which)")
    r.add_argument("--timeout", type=float, default=60.0, metavar="SECONDS",
                   help="with --port: how long to wait for the board's output (default: 60)")
    r.add_argument("--check-arena", action="store_true",
                   help="a checked build with red-zones between the arena's buffers: on the "
                        "host under AddressSanitizer and UBSan, each layer allowed to touch "
                        "only its own tensors; on an emulated board the red-zones compared "
                        "after each layer and dead tensors overwritten; a stray write fails "
                        "the run with a report naming the layer")
    _add_input_shape(r)
    _add_memory_priority(r)
    r.set_defaults(fn=_cmd_run)

    i = command("info", "show a model's ops, tensors, MACs, weight bytes and planned arena on "
                "one screen (mcuforge report: the same layer by layer)",
                "mcuforge info model.tflite --json")
    i.add_argument("model", help="the model (.onnx or .tflite)")
    i.add_argument("--json", action="store_true", help="print JSON")
    _add_input_shape(i)
    i.set_defaults(fn=_cmd_info)

    b = command("bench", "measure arena, RAM and latency of the generated code beside TFLM "
                "(host: microseconds; emulated board: instructions under QEMU)",
                "mcuforge bench kws.tflite --board mps2-an386 --per-layer")
    b.add_argument("models", nargs="+", help="the models (.onnx or .tflite)")
    b.add_argument("--board", default="host", help=board_help("host"))
    b.add_argument("--iterations", type=int, default=50, help="inferences per timing round")
    b.add_argument("--json", action="store_true", help="print a JSON list, one object per model")
    b.add_argument("--no-tflm", action="store_true", help="skip TFLM's figures")
    b.add_argument("--flash-budget", type=_bytes, metavar="BYTES",
                   help="as compile's (boards only)")
    b.add_argument("--keep-input", action="store_true",
                   help="the input buffers keep their values through invoke (by default "
                   "layers may write their outputs over an input they have read, which takes "
                   "less RAM; the generated header says which)")
    b.add_argument("--per-layer", action="store_true",
                   help="with --board: each layer's instructions, MACs and MACs per instruction")
    _add_input_shape(b)
    _add_memory_priority(b)
    b.set_defaults(fn=_cmd_bench)

    q = command("bench-quant", "measure int8 quantization quality of float models: SQNR and "
                "top-1 agreement with float, beside onnxruntime's quantize_static on the same "
                "model (TFLite models exported to ONNX by mcuforge) and, for the MLPerf Tiny "
                "float models, MLCommons' own int8 model",
                "mcuforge bench-quant resnet.tflite --calibration cal.npz --eval eval.npz")
    q.add_argument("models", nargs="+", help="the float models (.onnx or .tflite)")
    q.add_argument("--calibration", type=_count_or_data, default=200, metavar="N|DATA",
                   help="calibration data as compile takes it, or a number of random inputs "
                        "(default: 200, with a warning: figures on noise)")
    q.add_argument("--eval", type=_count_or_data, default=360, metavar="N|DATA",
                   help="evaluation data (a .npz may add `labels`: top-1 accuracy is then "
                        "reported too), or a number of random inputs (default: 360)")
    q.add_argument("--int16-budget", type=_int16_budget, default=0, metavar="BYTES|auto",
                   help="as for compile: mcuforge's model may keep some activations in int16 "
                        "(default: 0, all int8)")
    q.add_argument("--json", action="store_true", help="print a JSON list, one object per model")
    q.set_defaults(fn=_cmd_bench_quant)

    v = command("validate", "run the compiled model and its reference runtime (onnxruntime, "
                "LiteRT for float TFLite, tflite-micro for int8) on your data and compare "
                "each output: max/mean error, SQNR, top-1 agreement, accuracy with labels",
                "mcuforge validate resnet.tflite --data eval.npz --labels y.npy --quantize int8 "
                "--calibration cal.npz")
    v.add_argument("model", help="the model (.onnx or .tflite)")
    v.add_argument("--data", required=True, metavar="NPZ",
                   help=".npz with one array per model input (by input name, or arr_0 for a "
                        "one-input model), first axis = samples; a `labels` array is used as "
                        "--labels")
    v.add_argument("--labels", metavar="NPY", help="class index per sample: accuracy too")
    v.add_argument("--board", default="host", help=board_help("host"))
    v.add_argument("--quantize", choices=["int8"], help="quantize a float model as compile "
                   "does (with --calibration); compared against the float model")
    v.add_argument("--calibration", metavar="DATA", help="as compile's")
    v.add_argument("--calibration-method", choices=["minmax", "percentile", "mse"],
                   help="as compile's")
    v.add_argument("--limit", type=_positive, metavar="N", help="only the first N samples")
    v.add_argument("--per-layer", action="store_true",
                   help="also find the first layer whose output differs from the reference's "
                        "(int8: any differing value; float: relative error over --tolerance)")
    v.add_argument("--tolerance", type=float, default=1e-4,
                   help="--per-layer's relative error for float tensors (default: 1e-4)")
    v.add_argument("--json", action="store_true", help="print JSON")
    v.set_defaults(fn=_cmd_validate)

    k = command("conformance", "run a framework's own operator test suite through mcuforge "
                "and report passed / failed / unsupported per operator",
                "mcuforge conformance onnx --filter conv --json results.json")
    k.add_argument("suite", choices=["onnx", "tflite"], help="the test suite (onnx: the ONNX "
                   "backend test cases shipped with the onnx package; tflite: mcuforge's "
                   "single-operator TFLite models, bit-exact against tflite-micro)")
    k.add_argument("--jobs", type=_positive, default=None,
                   help="parallel jobs (default: CPU count)")
    k.add_argument("--kind", default="node",
                   choices=["node", "simple", "pytorch-converted", "pytorch-operator", "all"],
                   help="onnx: which cases (default: node)")
    k.add_argument("--filter", help="only cases whose name contains this")
    k.add_argument("--json", help="write every result to this JSON file")
    k.set_defaults(fn=_cmd_conformance)

    f = command("fuzz", "random ONNX graphs: mcuforge's C against onnxruntime (float), or the "
                "int8 C against its own --emit-tflite model in tflite-micro (--int8); prints "
                "passed / mismatched / refused / crashed",
                "mcuforge fuzz --seed 0 --count 200 --int8 --save failures/")
    f.add_argument("--seed", type=int, default=0, help="first graph's seed (default: 0)")
    f.add_argument("--count", type=_positive, default=100, help="graphs (default: 100)")
    f.add_argument("--int8", action="store_true", help="quantize each graph with mcuforge and "
                   "compare bit for bit with tflite-micro")
    f.add_argument("--jobs", type=_positive, default=None,
                   help="parallel jobs (default: CPU count)")
    f.add_argument("--save", metavar="DIR", help="save failing and refused models (.onnx, "
                   "inputs .npz, .tflite, .txt) here")
    f.add_argument("--minimise", action="store_true",
                   help="with --save: also save the smallest sub-graph still failing")
    f.add_argument("--exclude-known", action="store_true",
                   help="leave out the graph features of known bugs (mcuforge.tools.fuzz.KNOWN)")
    f.set_defaults(fn=_cmd_fuzz)

    f = command("fuzz-files", "compile mutated model files (truncated, flipped bytes, bad "
                "offsets, quantization and shapes; TFLite and ONNX) and count clean errors, "
                "successes, tracebacks, crashes and hangs",
                "mcuforge fuzz-files my_model.onnx --cases 500 --format onnx")
    f.add_argument("models", nargs="*", help="more seed models, .onnx or .tflite (default: "
                   "built-in small ones)")
    f.add_argument("--cases", type=_positive, default=500, help="mutated files (default: 500)")
    f.add_argument("--seed", type=int, default=0, help="random seed (default: 0)")
    f.add_argument("--timeout", type=float, default=20.0, help="seconds per case (default: 20)")
    f.add_argument("--format", choices=["tflite", "onnx", "both"], default="both")
    f.add_argument("--save", metavar="DIR", help="write the first file of each failure here")
    f.add_argument("--json", action="store_true", help="print JSON")
    f.set_defaults(fn=_cmd_fuzz_files)

    k = sub.add_parser("cache", help="show or empty the build cache",
                       description=CACHE_HELP,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    k.add_argument("action", choices=["info", "clean"], help="info: location, entries and "
                   "size; clean: remove the entries")
    k.set_defaults(fn=_cmd_cache)

    e = command("report", "analyse a model layer by layer into one self-contained HTML file "
                "(or JSON): op, shapes, quantization, MACs, weight bytes, arena offsets, a "
                "picture of the arena over time and a per-layer cost chart; with an emulated "
                "--board also each layer's instructions under QEMU and the totals against the "
                "board's flash and RAM", "mcuforge report kws.tflite --board mps2-an386 "
                "-o kws.html")
    e.add_argument("model", help="the model (.onnx or .tflite)")
    e.add_argument("--board", help=board_help(None) + "; on an emulated board the "
                   "per-layer profile runs under QEMU (default: the host, no instructions)")
    e.add_argument("-o", "--output", help="the file to write (default: report.html, with "
                   "--json report.json)")
    e.add_argument("--json", action="store_true", help="write the same data as JSON (no "
                   "pictures)")
    e.add_argument("--flash-budget", type=_bytes, metavar="BYTES", help="as compile's")
    _add_input_shape(e)
    _add_memory_priority(e)
    e.set_defaults(fn=_cmd_report)

    d = command("demo", "a CNN trained on 8x8 digits, quantized to int8, compiled, run in C on "
                        "held-out images; accuracy beside float, bytes checked against TFLM",
                "mcuforge demo -o mcuforge-demo")
    d.add_argument("-o", "--output", default="mcuforge-demo", help="where to write the C project")
    d.add_argument("--synthetic", action="store_true", help="instead: a random-weight int8 model "
                   "written as .tflite, checked bit-exact against TFLM")
    d.set_defaults(fn=_cmd_demo)
    return p


_notes_shown = set()  # a model is loaded several times in one command (run: check, build)


def _show_note(message, category, *args, **kwargs):
    if issubclass(category, ModelNote):
        if str(message) in _notes_shown:  # each note once per command
            return
        _notes_shown.add(str(message))
        print(f"mcuforge: note: {printable(message, keep_newlines=True)}", file=sys.stderr)
    else:
        _default_showwarning(message, category, *args, **kwargs)


_default_showwarning = warnings.showwarning


def main(argv=None) -> int:
    a = parser().parse_args(argv)
    a.argv = list(sys.argv[1:] if argv is None else argv)  # for the generated files' stamp
    warnings.showwarning = _show_note
    _notes_shown.clear()
    try:
        return a.fn(a)
    except McuforgeError as e:
        # messages quote model strings (tensor names): no escape sequence reaches the terminal
        print(f"mcuforge: error: {printable(e, keep_newlines=True)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except Exception as e:  # noqa: BLE001 - a bug in mcuforge, not in the input: say so
        if os.environ.get("MCUFORGE_TRACEBACK"):
            raise
        text = " ".join(str(e).split())[:300]
        print(f"mcuforge: internal error: {type(e).__name__}: {text} (please report this "
              "with the model; MCUFORGE_TRACEBACK=1 shows where)", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
