"""The `mcuforge` command line. Errors a user can act on exit with status 2, no traceback."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from .errors import McuforgeError

DESCRIPTION = """\
Compile a neural network (int8 TFLite today) into a standalone C project: no interpreter,
no malloc, one static arena whose size is known at compile time.

  mcuforge compile model.tflite -o out/     write the C project; then: make -C out/
  mcuforge run model.tflite --input x.npy --output y.npy
  mcuforge info model.tflite                ops, MACs, weights, planned arena
  mcuforge bench model.tflite ...           arena, RAM and latency beside TFLM's
  mcuforge demo                             end-to-end check on a model mcuforge builds itself
"""


def _cmd_compile(a) -> int:
    from .api import compile as compile_model
    r = compile_model(a.model, a.output, board=a.board, name=a.name)
    print(f"wrote {len(r.files)} files to {r.out_dir}: {', '.join(r.files)}")
    print(f"arena {r.arena_bytes} bytes (lower bound {r.lower_bound_bytes}), "
          f"weights {r.weight_bytes} bytes, {r.macs} MACs")
    print(f"build it with: make -C {r.out_dir}")
    return 0


def _load_npy(path: str):
    try:
        data = np.load(path, allow_pickle=False)
    except (OSError, ValueError) as e:
        raise McuforgeError(f"cannot read inputs from {path}: {e}") from e
    if isinstance(data, np.lib.npyio.NpzFile):
        return {k: data[k] for k in data.files}
    return data


def _cmd_run(a) -> int:
    from .runner import run
    outputs = run(a.model, _load_npy(a.input), board=a.board)
    if isinstance(outputs, dict):
        np.savez(a.output, **outputs)
    else:
        np.save(a.output, outputs)
    print(f"wrote {a.output}")
    return 0


def _cmd_info(a) -> int:
    from .info import model_info
    info = model_info(a.model)
    if a.json:
        print(json.dumps(info, indent=2))
        return 0
    print(f"model {info['model']}")
    print(f"  ops: {', '.join(f'{k} x{v}' for k, v in info['ops'].items())}")
    print(f"  MACs: {info['macs']:,}")
    print(f"  weights: {info['weight_bytes']:,} bytes")
    print(f"  arena: {info['arena_bytes']:,} bytes (layer-wise lower bound "
          f"{info['lower_bound_bytes']:,})")
    for kind in ("inputs", "outputs"):
        for t in info[kind]:
            print(f"  {kind[:-1]} '{t['name']}': {t['dtype']}{t['shape']} "
                  f"scale {t['scale']} zero point {t['zero_point']}")
    print(f"  tensors: {info['tensors']}")
    return 0


def _cmd_bench(a) -> int:
    from .bench import bench, format_table
    rows = bench(a.models, board=a.board, iterations=a.iterations, with_tflm=not a.no_tflm,
                 progress=None if a.json else sys.stderr)
    print(json.dumps(rows, indent=2) if a.json else format_table(rows))
    return 0


def _cmd_demo(a) -> int:
    from .demo import run_demo
    return run_demo(a.output)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="mcuforge", description=DESCRIPTION,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    c = sub.add_parser("compile", help="write a C project for a model")
    c.add_argument("model", help="the .tflite model")
    c.add_argument("-o", "--output", required=True, help="directory of the C project")
    c.add_argument("--board", default="host", help="target board (default: host)")
    c.add_argument("--name", help="C name prefix of the API (default: from the file name)")
    c.set_defaults(fn=_cmd_compile)

    r = sub.add_parser("run", help="compile, build and run a model on inputs from a .npy/.npz")
    r.add_argument("model")
    r.add_argument("--input", required=True,
                   help=".npy with one input, or a batch along a new leading axis; "
                        ".npz keyed by input name for several inputs")
    r.add_argument("--output", required=True, help=".npy (.npz for several outputs)")
    r.add_argument("--board", default="host")
    r.set_defaults(fn=_cmd_run)

    i = sub.add_parser("info", help="ops, tensors, MACs, weight bytes, planned arena")
    i.add_argument("model")
    i.add_argument("--json", action="store_true")
    i.set_defaults(fn=_cmd_info)

    b = sub.add_parser("bench", help="arena, RAM and latency of the generated code beside TFLM")
    b.add_argument("models", nargs="+")
    b.add_argument("--board", default="host")
    b.add_argument("--iterations", type=int, default=50, help="inferences per timing round")
    b.add_argument("--json", action="store_true", help="print a JSON list, one object per model")
    b.add_argument("--no-tflm", action="store_true", help="skip TFLM's figures")
    b.set_defaults(fn=_cmd_bench)

    d = sub.add_parser("demo", help="build a small int8 model, compile, run, check against TFLM")
    d.add_argument("-o", "--output", default="mcuforge-demo", help="where to write the C project")
    d.set_defaults(fn=_cmd_demo)
    return p


def main(argv=None) -> int:
    a = parser().parse_args(argv)
    try:
        return a.fn(a)
    except McuforgeError as e:
        print(f"mcuforge: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
