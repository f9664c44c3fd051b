"""TFLM + CMSIS-NN yardstick on the QEMU mps2 machines: instructions per Invoke, arena, code.

Builds TFLM's libtensorflow-microlite.a with TFLM's own Makefile (TARGET=cortex_m_generic,
OPTIMIZED_KERNEL_DIR=cmsis_nn, BUILD_TYPE=release_with_logs: core -Os, kernels and CMSIS-NN
-O2, as TFLM ships them) from sources fetched outside this repository, links a small firmware
per model (harness.cc, startup.c, link.ld here: the model and its input built in as byte
arrays, the op resolver generated from the model's operator codes), runs it under QEMU
-icount shift=0 and reads SysTick ticks (1 tick = 40 instructions at 25 MHz) around each
Invoke. See README.md in this folder for the command lines.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(REPO))

from mcuforge.board import load_board  # noqa: E402  (board flags and QEMU command line)

# the source trees and their folder names under --sources
SOURCE_DIRS = {"tflm": "tflite-micro", "cmsis": "cmsis", "cortex-dfp": "cmsis/Cortex_DFP",
               "cmsis-nn": "cmsis_nn", "flatbuffers": "flatbuffers", "gemmlowp": "gemmlowp",
               "ruy": "ruy", "kissfft": "kissfft"}
ARCH = {"mps2-an386": "cortex-m4+fp", "mps2-an500": "cortex-m7+fp"}
MAKEFILE = "tensorflow/lite/micro/tools/make/Makefile"
# Parsing TFLM's Makefile includes every example's and test's Makefile.inc; these lists only
# add test programs (and convert their images at parse time), so they are emptied.
NO_TESTS = ["MICRO_LITE_EXAMPLE_TESTS=", "MICRO_LITE_BENCHMARKS=", "OLD_MICRO_LITE_BENCHMARKS=",
            "MICRO_LITE_INTEGRATION_TESTS=", "MICRO_LITE_GEN_MUTABLE_OP_RESOLVER_TEST=",
            "MICRO_LITE_LAYER_BY_LAYER_OUTPUT="]


def prepare_downloads(a) -> None:
    """TFLM's Makefile expects its third-party code in tools/make/downloads: link the fetched
    trees there (flatbuffers and kissfft patched as TFLM's download scripts patch them)."""
    tflm = Path(a.tflm)
    dl = tflm / "tensorflow/lite/micro/tools/make/downloads"
    dl.mkdir(parents=True, exist_ok=True)
    for name, src in (("gemmlowp", a.gemmlowp), ("ruy", a.ruy)):
        link = dl / name
        if link.is_symlink() or not link.exists():
            if link.is_symlink():
                link.unlink()
            link.symlink_to(Path(src).resolve())
    (dl / "pigweed").mkdir(exist_ok=True)  # only TFLM's tests use it
    for name, src, patch in (
            ("flatbuffers", Path(a.flatbuffers) / "include", "tensorflow/lite/micro/tools/make/"
             "flatbuffers.patch"),
            ("kissfft", Path(a.kissfft), "third_party/kissfft/kissfft.patch")):
        tree = dl / name
        if not (tree / ".yardstick-patched").exists():  # a copy, patched as TFLM's scripts do
            if tree.is_symlink():
                tree.unlink()
            shutil.rmtree(tree, ignore_errors=True)
            shutil.copytree(src, tree / "include" if name == "flatbuffers" else tree)
            subprocess.run(["patch", "-p1", "-i", str((tflm / patch).resolve())], cwd=tree,
                           check=True, capture_output=True)
            (tree / ".yardstick-patched").write_text("")
    # generate_cc_arrays.py imports PIL at its top even for .tflite inputs; the Makefile calls
    # it at parse time for test data the library never uses: a stub module stands in.
    stub = Path(a.build) / "pystub" / "PIL"
    stub.mkdir(parents=True, exist_ok=True)
    (stub / "__init__.py").write_text("Image = None  # stub: the library converts no images\n")


def make_args(a, board: str) -> list:
    return ["make", "--no-print-directory", "-C", str(a.tflm), "-f", MAKEFILE,
            "TARGET=cortex_m_generic",
            f"TARGET_ARCH={ARCH[board]}", "OPTIMIZED_KERNEL_DIR=cmsis_nn",
            "BUILD_TYPE=release_with_logs", f"CMSIS_PATH={Path(a.cmsis).resolve()}",
            f"CORTEX_DFP_PATH={Path(a.cortex_dfp).resolve()}",
            f"CMSIS_NN_PATH={Path(a.cmsis_nn).resolve()}", "TARGET_TOOLCHAIN_ROOT=/usr/bin/",
            f"BASE_GENDIR={(Path(a.build) / 'gen').resolve()}", *NO_TESTS]


def make_env(a) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = str((Path(a.build) / "pystub").resolve())
    return env


def print_var(a, board: str, var: str) -> str:
    out = subprocess.run(make_args(a, board) + [f"print-{var}"], env=make_env(a),
                         capture_output=True, text=True, check=True).stdout
    return out.splitlines()[0].split("=", 1)[1].strip()


def build_lib(a, board: str) -> dict:
    """libtensorflow-microlite.a for the board and the exact compile flags it was built with.
    With --objects: only the listed TFLM objects (and all of CMSIS-NN's), archived apart; the
    list is the members a link of these models pulls from the full archive, so the firmware
    is the same, and the build a fraction of the time (see README.md)."""
    prepare_downloads(a)
    args, env = make_args(a, board), make_env(a)
    flags = {var: print_var(a, board, var) for var in (
        "CXXFLAGS", "CCFLAGS", "INCLUDES", "MICROLITE_LIB_PATH", "GENDIR",
        "KERNEL_OPTIMIZATION_LEVEL", "CORE_OPTIMIZATION_LEVEL",
        "THIRD_PARTY_KERNEL_OPTIMIZATION_LEVEL")}
    targets = ["microlite"]
    if a.objects:
        objdir = Path(flags["GENDIR"]) / "obj"
        objs = [str(objdir / line.strip()) for line in Path(a.objects).read_text().splitlines()
                if line.strip() and not line.startswith("#")]
        targets = objs + print_var(a, board, "MICROLITE_THIRD_PARTY_KERNEL_OBJS").split()
        lib = Path(flags["GENDIR"]) / "lib" / "libtensorflow-microlite-subset.a"
    r = subprocess.run(args + [f"-j{a.jobs}"] + targets, env=env, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"TFLM library build failed:\n{r.stdout[-4000:]}{r.stderr[-4000:]}")
    if a.objects:
        lib.parent.mkdir(parents=True, exist_ok=True)
        lib.unlink(missing_ok=True)
        subprocess.run(["arm-none-eabi-ar", "rcs", str(lib), *targets], check=True)
        flags["MICROLITE_LIB_PATH"] = str(lib)
    return flags


def op_registrations(model_bytes: bytes, tflm: Path) -> list:
    """MicroMutableOpResolver Add* calls for the model's builtin operators."""
    import tflite
    header = (tflm / "tensorflow/lite/micro/micro_mutable_op_resolver.h").read_text()
    adders = {n.lower(): n for n in re.findall(r"TfLiteStatus Add(\w+)\(", header)}
    names = {v: k for k, v in vars(tflite.BuiltinOperator).items() if not k.startswith("_")}
    m = tflite.Model.GetRootAsModel(model_bytes, 0)
    calls = []
    for i in range(m.OperatorCodesLength()):
        oc = m.OperatorCodes(i)
        code = max(oc.BuiltinCode(), oc.DeprecatedBuiltinCode())
        name = names[code]
        if name == "CUSTOM":
            raise SystemExit(f"custom operator {oc.CustomCode()!r}: not supported here")
        add = adders.get(name.replace("_", "").lower())
        if add is None:
            raise SystemExit(f"no MicroMutableOpResolver::Add for {name}")
        if f"Add{add}()" not in calls:
            calls.append(f"Add{add}()")
    return calls


def c_bytes(data: bytes) -> str:
    return ",".join(str(b) for b in data)


def io_specs(model_bytes: bytes, which: str) -> list:
    """(shape, numpy dtype) of subgraph 0's inputs or outputs, read with the `tflite` package
    (LiteRT refuses some of TFLM's models, e.g. person_detect's per-axis quantization)."""
    import tflite
    types = {v: k for k, v in vars(tflite.TensorType).items() if not k.startswith("_")}
    np_types = {"INT8": np.int8, "UINT8": np.uint8, "INT16": np.int16, "INT32": np.int32,
                "FLOAT32": np.float32, "INT64": np.int64, "BOOL": np.bool_}
    g = tflite.Model.GetRootAsModel(model_bytes, 0).Subgraphs(0)
    idx = g.InputsAsNumpy() if which == "inputs" else g.OutputsAsNumpy()
    specs = []
    for i in idx:
        t = g.Tensors(int(i))
        specs.append((tuple(int(d) for d in t.ShapeAsNumpy()), np_types[types[t.Type()]]))
    return specs


def model_inputs(model_bytes: bytes, input_npy: str | None, seed: int) -> list:
    """One array per model input: from a .npy (one input) or random in the dtype's range."""
    specs = io_specs(model_bytes, "inputs")
    if input_npy:
        x = np.load(input_npy)
        if len(specs) != 1:
            raise SystemExit("--input gives one array; the model has several inputs")
        return [x.astype(specs[0][1]).reshape(specs[0][0])]
    rng = np.random.default_rng(seed)
    xs = []
    for shape, dt in specs:
        dt = np.dtype(dt)
        if dt.kind in "iu":
            lim = np.iinfo(dt)
            xs.append(rng.integers(lim.min, lim.max + 1, size=shape).astype(dt))
        else:
            xs.append(rng.standard_normal(shape).astype(dt))
    return xs


def build_firmware(a, board: str, flags: dict, model: Path, xs: list, work: Path) -> Path:
    work.mkdir(parents=True, exist_ok=True)
    data = model.read_bytes()
    calls = op_registrations(data, Path(a.tflm))
    h = ["#include <stdint.h>",
         f"#define YS_ARENA_BYTES {a.arena}", f"#define YS_RUNS {a.runs}",
         f"#define YS_OP_COUNT {len(calls)}", f"#define YS_INPUT_COUNT {len(xs)}u",
         "#define YS_REGISTER_OPS(r) do { " + " ".join(f"r.{c};" for c in calls) + " } while (0)",
         f"alignas(16) static const uint8_t ys_model_data[{len(data)}] = {{{c_bytes(data)}}};"]
    for i, x in enumerate(xs):
        h.append(f"alignas(16) static const uint8_t ys_input{i}[{x.nbytes}] = "
                 f"{{{c_bytes(x.tobytes())}}};")
    h.append("static const uint8_t* const ys_inputs[] = {"
             + ",".join(f"ys_input{i}" for i in range(len(xs))) + "};")
    h.append("static const uint32_t ys_input_bytes[] = {"
             + ",".join(str(x.nbytes) for x in xs) + "};")
    (work / "yardstick_model.h").write_text("\n".join(h) + "\n")
    b = load_board(board)
    tflm = Path(a.tflm).resolve()
    # TFLM's own flags and include paths (relative to the TFLM tree: compiled from there)
    cxx = ["arm-none-eabi-g++", *shlex.split(flags["CXXFLAGS"]), "-O2",
           *shlex.split(flags["INCLUDES"]), f"-I{work.resolve()}"]
    cc = ["arm-none-eabi-gcc", *b.cflags, "-O2", "-ffunction-sections", "-fdata-sections",
          "-std=c99", "-Wall", "-Wextra"]
    subprocess.run(cxx + ["-c", str(HERE / "harness.cc"), "-o", str(work.resolve() / "harness.o")],
                   check=True, cwd=tflm)
    subprocess.run(cc + ["-c", str(HERE / "startup.c"), "-o", str(work / "startup.o")],
                   check=True)
    elf = work / "yardstick.elf"
    lib = flags["MICROLITE_LIB_PATH"]
    subprocess.run(["arm-none-eabi-g++", *b.cflags, "-nostartfiles", "--specs=nano.specs",
                    "--specs=nosys.specs", f"-T{HERE / 'link.ld'}", "-Wl,--gc-sections",
                    str(work / "startup.o"), str(work / "harness.o"), str(tflm / lib)
                    if not lib.startswith("/") else lib, "-lm", "-o", str(elf)], check=True)
    return elf


def run_firmware(board: str, elf: Path, timeout: float) -> dict:
    b = load_board(board)
    r = subprocess.run(b.qemu_command + ["-kernel", str(elf)], capture_output=True, text=True,
                       timeout=timeout)
    text = r.stdout + r.stderr
    if r.returncode != 0 or "done" not in text.splitlines():
        raise SystemExit(f"{elf} failed under QEMU (exit {r.returncode}):\n{text[-3000:]}")
    out = {"ticks": [], "outputs": {}}
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        if key == "arena":
            out["arena"] = int(value)
        elif key == "ticks":
            out["ticks"].append(int(value))
        elif key.startswith("out") and key[3:].isdigit():
            out["outputs"][int(key[3:])] = bytes.fromhex(value)
    out["instructions"] = [b.instructions(t) for t in out["ticks"]]
    return out


def elf_sizes(elf: Path) -> dict:
    text, data, bss = (int(x) for x in subprocess.run(
        ["arm-none-eabi-size", "-B", str(elf)], capture_output=True, text=True,
        check=True).stdout.splitlines()[1].split()[:3])
    return {"text": text, "data": data, "bss": bss}


def measure(a, board: str, flags: dict, model: Path, input_npy: str | None = None) -> dict:
    data = model.read_bytes()
    xs = model_inputs(data, input_npy, a.seed)
    work = Path(a.build) / "fw" / board / model.stem
    elf = build_firmware(a, board, flags, model, xs, work)
    res = run_firmware(board, elf, a.timeout)
    sizes = elf_sizes(elf)
    outs = [np.frombuffer(res["outputs"][i], dtype=dt).reshape(shape)
            for i, (shape, dt) in enumerate(io_specs(data, "outputs"))]
    return {
        "model": model.name, "board": board, "instructions": res["instructions"][-1],
        "instructions_all_runs": res["instructions"], "arena_bytes": res["arena"],
        # code: flash less the model and the built-in input (the harness's own few hundred
        # bytes, newlib-nano's vsnprintf for TFLM's error log and startup included)
        "code_bytes": sizes["text"] + sizes["data"] - len(data) - sum(x.nbytes for x in xs),
        "flash_bytes": sizes["text"] + sizes["data"], "_outputs": outs, "_inputs": xs,
    }


def mcuforge_instructions(model: Path, board: str) -> dict:
    r = subprocess.run([sys.executable, "-m", "mcuforge.cli", "bench", "--board", board,
                        str(model), "--json"], capture_output=True, text=True, cwd=REPO,
                       env={**os.environ, "PYTHONPATH": str(REPO)})
    if r.returncode != 0:
        return {"error": (r.stderr.strip() or r.stdout.strip()).splitlines()[-1]}
    rows = json.loads(r.stdout)
    row = rows[0] if isinstance(rows, list) else rows
    return {"instructions": row["instructions"]}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("models", nargs="+", help=".tflite files")
    p.add_argument("--board", action="append", choices=sorted(ARCH), help="(repeatable)")
    src = p.add_argument_group("fetched sources (trees outside this repository)")
    src.add_argument("--sources", help="a folder holding them under the names of SOURCE_DIRS")
    for name in SOURCE_DIRS:
        src.add_argument(f"--{name}")
    p.add_argument("--build", default="/tmp/tflm_yardstick", help="build directory")
    p.add_argument("--arena", type=int, default=1 << 20, help="tensor arena given to TFLM")
    p.add_argument("--runs", type=int, default=2, help="Invokes per firmware (last reported)")
    p.add_argument("--seed", type=int, default=0, help="of the random input")
    p.add_argument("--input", help=".npy input (one model, one input) instead of random")
    p.add_argument("--save", help="directory to save each run's input and output .npy in")
    p.add_argument("--mcuforge", action="store_true", help="also `mcuforge bench` each model")
    p.add_argument("--objects", help="build only these TFLM objects (paths under the build's "
                   "obj/, one a line; e.g. tests/yardstick/objects.txt) instead of the library")
    p.add_argument("--jobs", type=int, default=2)
    p.add_argument("--timeout", type=float, default=900)
    a = p.parse_args(argv)
    for name, sub in SOURCE_DIRS.items():
        attr = name.replace("-", "_")
        if getattr(a, attr) is None:
            if not a.sources:
                p.error(f"--{name} (or --sources) is required")
            setattr(a, attr, str(Path(a.sources) / sub))
    rows = []
    for board in a.board or ["mps2-an386"]:
        flags = build_lib(a, board)
        print(json.dumps({"board": board, "flags": flags}), file=sys.stderr)
        for m in a.models:
            try:
                row = measure(a, board, flags, Path(m), a.input)
            except (SystemExit, subprocess.CalledProcessError, subprocess.TimeoutExpired) as e:
                row = {"model": Path(m).name, "board": board, "error": str(e)[-600:]}
                print(json.dumps(row), flush=True)
                rows.append(row)
                continue
            if a.save:
                d = Path(a.save)
                d.mkdir(parents=True, exist_ok=True)
                for i, x in enumerate(row["_inputs"]):
                    np.save(d / f"{Path(m).stem}.{board}.in{i}.npy", x)
                for i, y in enumerate(row["_outputs"]):
                    np.save(d / f"{Path(m).stem}.{board}.out{i}.npy", y)
            row = {k: v for k, v in row.items() if not k.startswith("_")}
            if a.mcuforge:
                mf = mcuforge_instructions(Path(m), board)
                row["mcuforge_instructions"] = mf.get("instructions")
                row["mcuforge_error"] = mf.get("error")
                if mf.get("instructions"):
                    row["ratio"] = round(mf["instructions"] / row["instructions"], 3)
            rows.append(row)
            print(json.dumps(row), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
