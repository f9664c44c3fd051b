"""`mcuforge conformance onnx`: ONNX's own backend test cases through the whole compiler.

Every case (a model and reference data sets) is imported, optimised, generated as C, built with
gcc and run on the host; each output is compared with the reference as ONNX's backend test does
(shape and dtype equal, np.testing.assert_allclose at the case's rtol/atol, NaN equal to NaN,
integers and bools exact). A case ends "passed", "failed" (with a one-line reason) or
"unsupported" (the import says which operator or variant mcuforge lacks).

Speed: cases run in batches across worker processes; a batch's models are compiled at -O0 into
one program, each under its own C prefix, with a harness that dispatches by case index.
"""
from __future__ import annotations

import json
import multiprocessing
import os
import re
import shutil
import subprocess
import tempfile
import time
import warnings
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from mcuforge.ir.errors import McuforgeError

KINDS = ("node", "simple", "pytorch-converted", "pytorch-operator")
CFLAGS = ["-O0", "-std=c99", "-Wall", "-Wextra", "-Werror", "-pedantic"]


# the checked build (run_batch's arena_check): AddressSanitizer, UBSan and the arena tables
ARENA_CHECK_FLAGS = ["-g", "-fsanitize=address,undefined", "-fno-sanitize-recover=all",
                     "-DMCUFORGE_ARENA_CHECK"]


def cflags(arena_check: bool = False) -> list:
    """CFLAGS, with $MCUFORGE_OPT's optimisation flags instead of -O0 when it is set."""
    from ..build import opt_flags
    opt = opt_flags()
    flags = CFLAGS if opt is None else [*opt.split(), *CFLAGS[1:]]
    return flags + ARENA_CHECK_FLAGS if arena_check else flags


RUN_TIMEOUT = 30  # seconds per case: a runaway loop must not stall the suite
BUILD_TIMEOUT = 600  # seconds per batch
POOL_TIMEOUT = 2 * BUILD_TIMEOUT  # seconds without any batch finishing: a worker hung

# Known exclusions: case name -> why it is expected not to pass. Listed cases still run and are
# reported in a section of their own (never hidden); they do not count as failures. Every entry
# says why, and is removed once the case passes.
EXCLUSIONS: dict = {
    # The expected data computes align_corners with the fractional output length
    # (scale * input length); the spec ("the length of the resized tensor") and onnxruntime
    # use the integer output length, as mcuforge does.
    "test_resize_downsample_scales_linear_align_corners": "expected data uses the fractional "
    "output length for align_corners; the spec and onnxruntime use the integer length",
    "test_resize_downsample_scales_cubic_align_corners": "expected data uses the fractional "
    "output length for align_corners; the spec and onnxruntime use the integer length",
}


@dataclass
class Case:
    name: str
    kind: str
    model: bytes  # serialized ModelProto
    data_sets: list  # [(inputs, outputs)]: numpy arrays, or a str saying what they hold instead
    rtol: float
    atol: float
    op: str  # the ONNX operator the case tests (the table's row)
    ops: tuple  # every op_type in the model
    supported: bool  # every op in `ops` has a converter, every input/output a known dtype
    reset_at: int = 0  # > 0: the model's reset entry point is called before this data set


@dataclass
class Result:
    name: str
    kind: str
    op: str
    ops: tuple
    supported: bool
    status: str  # passed | failed | unsupported
    reason: str = ""
    excluded: str = ""  # the EXCLUSIONS reason, when listed
    frozen: tuple = ()  # inputs compiled as constants holding the data set's values
    seconds: float = 0.0


# ---- loading the cases --------------------------------------------------------------------

def load_cases(kind: str = "node", filter: str | None = None) -> list:
    """The ONNX backend test cases of `kind` ("all" for every kind), sorted by name."""
    from onnx.backend.test.loader import load_model_tests
    kinds = KINDS if kind == "all" else (kind,)
    cases = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the case generators overflow casts on purpose
        for k in kinds:
            for t in load_model_tests(kind=k):
                if filter and filter not in t.name:
                    continue
                c = _case(t, k)
                if c is not None:
                    cases.append(c)
    return sorted(cases, key=lambda c: (c.kind, c.name))


def _case(t, kind: str):
    import onnx
    model, data_sets = t.model, t.data_sets
    if model is None:
        if t.model_dir is None:  # a model downloaded on demand: not shipped with onnx
            return None
        model = onnx.load(os.path.join(t.model_dir, "model.onnx"))
        data_sets = _read_data_sets(Path(t.model_dir))
    ops = tuple(_op_types(model.graph))
    return Case(t.name, kind, model.SerializeToString(), [
        ([_array(v) for v in ins], [_array(v) for v in outs]) for ins, outs in data_sets],
        float(t.rtol), float(t.atol), primary_op(t.name, ops), ops, _all_supported(model, ops))


def _read_data_sets(model_dir: Path) -> list:
    import onnx
    out = []
    for d in sorted(model_dir.glob("test_data_set_*")):
        def read(prefix):
            files = sorted(d.glob(f"{prefix}_*.pb"), key=lambda p: int(p.stem.split("_")[-1]))
            return [onnx.TensorProto.FromString(p.read_bytes()) for p in files]
        out.append((read("input"), read("output")))
    return out


def _array(v):
    """A data set value as a numpy array, or a str saying why it is none."""
    from onnx import TensorProto, numpy_helper
    if isinstance(v, TensorProto):
        try:
            v = numpy_helper.to_array(v)
        except Exception as e:  # noqa: BLE001  (element types numpy lacks)
            return f"a tensor numpy cannot hold ({e})"
    if v is None or isinstance(v, (list, tuple, dict)):
        return f"a {type(v).__name__} value (sequence/optional/map)"
    v = np.asarray(v)
    return v if v.dtype != object else "a string tensor"


def _op_types(graph):
    """op_types of a graph and of its subgraphs (If/Loop/Scan bodies), in order."""
    for n in graph.node:
        yield n.op_type
        for a in n.attribute:
            for g in ([a.g] if a.HasField("g") else []) + list(a.graphs):
                yield from _op_types(g)


def _all_supported(model, ops) -> bool:
    """Every op has a converter and every graph input and output an element type mcuforge
    has and at least one element (the denominator of the pass rate: float16, float64,
    strings and zero-size tensors are out of scope)."""
    from mcuforge.frontend.onnx import _DTYPES, _load_converters, converter
    _load_converters()
    opset = max((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")),
                default=1)
    io = list(model.graph.input) + list(model.graph.output)
    return (all(converter(op, opset) is not None for op in ops)
            and all(v.type.tensor_type.elem_type in _DTYPES for v in io)
            and not any(d.HasField("dim_value") and d.dim_value == 0
                        for v in io for d in v.type.tensor_type.shape.dim))


def primary_op(name: str, ops) -> str:
    """The operator a case tests: the ONNX op spelled by the most leading words of the test's
    name (test_reduce_sum_keepdims -> ReduceSum; sce/nllloss/mvn spelled out), with
    "(expanded)" for function-body versions; else the model's one op type, or the name's
    first word."""
    words = name.removeprefix("test_").removeprefix("operator_").split("_")
    known = {s.lower(): s for s in [*_schema_names(), *ops]}
    known.update(ABBREVIATIONS)
    best = ""
    for k in range(1, len(words) + 1):
        best = known.get("".join(words[:k]).lower(), best)
    if not best:  # test_loop11 -> Loop
        best = known.get(words[0].rstrip("0123456789").lower(),
                         ops[0] if len(set(ops)) == 1 else words[0])
    return best + (" (expanded)" if "_expanded" in name else "")


ABBREVIATIONS = {"sce": "SoftmaxCrossEntropyLoss", "nllloss": "NegativeLogLikelihoodLoss",
                 "mvn": "MeanVarianceNormalization"}
_SCHEMAS: list = []


def _schema_names() -> list:
    if not _SCHEMAS:
        import onnx.defs
        _SCHEMAS.extend(sorted({s.name for s in onnx.defs.get_all_schemas_with_history()}))
    return _SCHEMAS


# ---- running one batch (in a worker process) ----------------------------------------------

def run_batch(cases: list, arena_check: bool = False) -> list:
    """Compile the batch into one program, run every case, return a Result per case.
    `arena_check`: the checked build (codegen_c/arena_check.py) under AddressSanitizer; a
    failing run's reason then ends with the sanitizer's summary line."""
    work = Path(tempfile.mkdtemp(prefix="mcuforge-conformance-"))
    try:
        return _run_batch(cases, work, arena_check)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _run_batch(cases: list, work: Path, arena_check: bool = False) -> list:
    from mcuforge.codegen_c.resources import data_dir
    results, ready, frozen = {}, [], {}  # ready: [_Built]
    t0 = {}
    for i, case in enumerate(cases):
        t0[case.name] = time.perf_counter()
        prefix = f"m{i}"
        try:
            graph, files, names, frozen[case.name] = _generate(case, prefix, arena_check)
        except _Outcome as o:
            results[case.name] = (o.status, o.reason)
            continue
        except Exception as e:  # noqa: BLE001  (a compiler bug: report it, go on)
            results[case.name] = ("failed", _one_line(f"{type(e).__name__}: {e}"))
            continue
        for fname, text in files.items():
            (work / fname).write_text(text)
        ready.append(_Built(case, prefix, graph, names))
    from ..api import RUNTIME_FILES  # every runtime header: scheduled kernels include theirs
    for f in RUNTIME_FILES:
        if (data_dir("runtime_c") / f).is_file():
            shutil.copy(data_dir("runtime_c") / f, work / f)
    if ready:
        ready = _build(work, ready, results, arena_check)
    for index, b in enumerate(ready):
        try:
            results[b.case.name] = _execute(work, index, b)
        except Exception as e:  # noqa: BLE001
            results[b.case.name] = ("failed", _one_line(f"{type(e).__name__}: {e}"))
    return [_result(c, *results[c.name], frozen.get(c.name, ()), time.perf_counter() - t0[c.name])
            for c in cases]


@dataclass
class _Built:
    """A case whose C is generated: `names` are the model inputs the data sets hold, in
    order (the graph's inputs are those not frozen)."""
    case: Case
    prefix: str
    graph: object
    names: list


class _Outcome(Exception):
    def __init__(self, status: str, reason: str):
        super().__init__(reason)
        self.status, self.reason = status, reason


def _generate(case: Case, prefix: str, arena_check: bool = False):
    """Import, optimise and generate C: (graph, files, input names of the data sets, frozen
    inputs). Unsupported cases raise _Outcome.

    ONNX node tests feed every operand as a graph input, while real models hold weights,
    axes, pads or scales as constants; when the import refuses such runtime operands, the
    case is tried again with every input after the first frozen to its data set value (when
    all data sets agree on it), and the result says so (Result.frozen)."""
    import onnx
    for ins, outs in case.data_sets:
        for v in list(ins) + list(outs):
            if isinstance(v, str):
                raise _Outcome("unsupported", f"the data set holds {v}")
    if not case.data_sets:
        raise _Outcome("unsupported", "no data sets")
    if case.kind == "tflite":
        graph, files = _compile(case.model, case, None, prefix, arena_check)
        return graph, files, list(graph.inputs), ()
    model = onnx.load_model_from_string(case.model)
    init = {i.name for i in model.graph.initializer}
    names = [i.name for i in model.graph.input if i.name not in init]
    try:
        return (*_compile(case.model, case, names, prefix, arena_check), names, ())
    except _Outcome as first:
        needs_constants = first.status == "unsupported" and re.search(
            r"run time|constant|unknown|no shape known", first.reason) \
            and "no converter" not in first.reason
        frozen = names[1:] if needs_constants else []
        if not frozen or not all(_same(ins[k], case.data_sets[0][0][k]) for ins, _ in
                                 case.data_sets for k in range(1, len(names))):
            raise
        try:
            graph, files = _compile(_freeze(model, names, case), case, names, prefix,
                                    arena_check)
        except _Outcome:
            raise first from None
        except Exception as e:  # noqa: BLE001
            raise _Outcome("failed", _one_line(f"(inputs {frozen} frozen) {type(e).__name__}: "
                                               f"{e}")) from None
        return graph, files, names, tuple(frozen)


def _same(a, b) -> bool:
    return (a.dtype == b.dtype and a.shape == b.shape
            and np.array_equal(a, b, equal_nan=a.dtype.kind == "f"))


def _freeze(model, names: list, case: Case) -> bytes:
    """The model with inputs names[1:] turned into initializers holding data set 0's values."""
    from onnx import numpy_helper
    for name, value in zip(names[1:], case.data_sets[0][0][1:]):
        model.graph.initializer.append(numpy_helper.from_array(value, name))
    return model.SerializeToString()


def _compile(model: bytes, case: Case, names: list, prefix: str, arena_check: bool = False):
    from mcuforge.codegen_c.model import generate
    from mcuforge.frontend.onnx import load_onnx
    from mcuforge.optimizer.pipeline import optimize

    from mcuforge.ir.errors import ModelError, UnsupportedOpError
    try:
        if case.kind == "tflite":
            from mcuforge.frontend.tflite import load_tflite
            g = load_tflite(model, name=case.name)
        else:
            shapes = {n: tuple(a.shape) for n, a in zip(names, case.data_sets[0][0])}
            g = load_onnx(model, input_shapes=shapes, name=case.name)
        g = optimize(g)
        gen = generate(g, prefix, arena_check=arena_check)
    except UnsupportedOpError as e:
        raise _Outcome("unsupported", _unsupported_reason(str(e))) from None
    except ModelError as e:
        if re.search(r"type|shape|dynamic|dimension", str(e)):
            raise _Outcome("unsupported", _one_line(str(e))) from None
        raise
    return g, gen.files


def _unsupported_reason(message: str) -> str:
    """The frontends' message ("node 3: Cast -> 'y': why" for ONNX, "node 3: CAST (output
    'y'): why" for TFLite) as "Cast: why; ..."."""
    parts = []
    for ln in message.splitlines()[1:]:
        m = re.match(r"\s*node \d+: (\S+)( \(domain [^)]*\))? -> '.*?'(?:: (.*))?$", ln) \
            or re.match(r"\s*node \d+: (\S+)() \(output '.*?'\)(?:: (.*))?$", ln)
        if m:
            parts.append(f"{m[1]}{m[2] or ''}: {m[3] or 'no converter'}")
    return _one_line("; ".join(dict.fromkeys(parts)) or message)


def _one_line(text: str, limit: int = 300) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _build(work: Path, ready: list, results: dict, arena_check: bool = False) -> list:
    """Compile every model (a failing one fails only its case), then link the harness."""
    cc = os.environ.get("CC", "gcc")
    try:
        r = subprocess.run([cc, *cflags(arena_check), "-c", *[f"{b.prefix}.c" for b in ready]],
                           cwd=work,
                           capture_output=True, text=True, timeout=BUILD_TIMEOUT)
    except subprocess.TimeoutExpired:
        for b in ready:
            results[b.case.name] = ("failed", f"gcc ran longer than {BUILD_TIMEOUT} s")
        return []
    kept = []
    for b in ready:
        if (work / f"{b.prefix}.o").is_file():
            kept.append(b)
            continue
        errors = [ln for ln in r.stderr.splitlines() if ln.startswith(f"{b.prefix}.")
                  and ("error" in ln or "warning" in ln)]
        results[b.case.name] = ("failed", _one_line("gcc: " + (errors[0] if errors
                                                              else r.stderr or "no object")))
    if not kept:
        return []
    (work / "main.c").write_text(_harness(kept))
    r = subprocess.run([cc, *cflags(arena_check), "-o", "batch", "main.c",
                        *[f"{b.prefix}.o" for b in kept],
                        "-lm"], cwd=work, capture_output=True, text=True)
    if r.returncode != 0:
        for b in kept:
            results[b.case.name] = ("failed", _one_line("gcc (link): " + r.stderr))
        return []
    return kept


def _harness(kept: list) -> str:
    entries = "\n".join(
        f"    {{{p}_init, {p}_reset, {p}_invoke, {p}_input, {p}_output, {p}_input_bytes, "
        f"{p}_output_bytes, {len(b.graph.inputs)}, {len(b.graph.outputs)}}},"
        for b in kept for p in [b.prefix])
    includes = "\n".join(f'#include "{b.prefix}.h"' for b in kept)
    return f"""/* Conformance harness: batch CASE COUNT IN.bin OUT.bin [RESET] runs COUNT inferences
 * of case CASE, inputs back to back in IN.bin, outputs back to back into OUT.bin; with
 * RESET > 0 the model is reset before inference RESET. */
#include <stdio.h>
#include <stdlib.h>
{includes}

struct mf_case {{
    void (*init)(void);
    void (*reset)(void);
    int (*invoke)(void);
    void *(*input)(int);
    void *(*output)(int);
    size_t (*input_bytes)(int);
    size_t (*output_bytes)(int);
    int inputs, outputs;
}};

static const struct mf_case cases[] = {{
{entries}
}};

int main(int argc, char **argv) {{
    const struct mf_case *c;
    FILE *in, *out;
    long k, count, reset_at;
    int i;
    if (argc != 5 && argc != 6) {{
        return 2;
    }}
    reset_at = argc == 6 ? atol(argv[5]) : 0;
    c = &cases[atoi(argv[1])];
    count = atol(argv[2]);
    in = fopen(argv[3], "rb");
    out = fopen(argv[4], "wb");
    if (!in || !out) {{
        return 3;
    }}
    c->init();
    for (k = 0; k < count; ++k) {{
        if (k > 0 && k == reset_at) {{
            c->reset();
        }}
        for (i = 0; i < c->inputs; ++i) {{
            if (fread(c->input(i), 1, c->input_bytes(i), in) != c->input_bytes(i)) {{
                return 4;
            }}
        }}
        if (c->invoke() != 0) {{
            return 5;
        }}
        for (i = 0; i < c->outputs; ++i) {{
            if (fwrite(c->output(i), 1, c->output_bytes(i), out) != c->output_bytes(i)) {{
                return 6;
            }}
        }}
    }}
    fclose(in);
    return fclose(out) != 0;
}}
"""


def _execute(work: Path, index: int, built: _Built) -> tuple:
    """Run every data set of one case through the batch program and compare. (status, reason)"""
    case, graph = built.case, built.graph
    blob = []
    for ins, _ in case.data_sets:
        feeds = dict(zip(built.names, ins))
        if len(ins) != len(built.names) or any(n not in feeds for n in graph.inputs):
            return "failed", (f"the model's inputs are {graph.inputs}, the data set has "
                              f"{len(ins)} values for {built.names}")
        for name in graph.inputs:
            a, t = feeds[name], graph.tensors[name]
            if a.dtype != np.dtype(t.dtype) or tuple(a.shape) != tuple(t.shape):
                return "failed", (f"input '{name}' compiled as {t.dtype}{list(t.shape)}, the "
                                  f"data set has {a.dtype}{list(a.shape)}")
            blob.append(np.ascontiguousarray(a).tobytes())
    (work / f"in{index}.bin").write_bytes(b"".join(blob))
    try:
        r = subprocess.run(["./batch", str(index), str(len(case.data_sets)), f"in{index}.bin",
                            f"out{index}.bin", str(case.reset_at)], cwd=work, capture_output=True,
                           timeout=RUN_TIMEOUT)
    except subprocess.TimeoutExpired:
        return "failed", f"the program ran longer than {RUN_TIMEOUT} s"
    if r.returncode != 0:
        summary = [ln for ln in r.stderr.decode(errors="replace").splitlines()
                   if ln.startswith("SUMMARY:")]
        return "failed", f"the program exited with status {r.returncode}" + \
            "".join(f" ({ln})" for ln in summary[:1])
    raw = (work / f"out{index}.bin").read_bytes()
    specs = [graph.tensors[o] for o in graph.outputs]
    per = sum(t.nbytes for t in specs)
    if len(raw) != per * len(case.data_sets):
        return "failed", f"the program wrote {len(raw)} bytes, expected {per * len(case.data_sets)}"
    offset = 0
    for d, (_, refs) in enumerate(case.data_sets):
        if len(refs) != len(specs):
            return "failed", f"the model has {len(specs)} outputs, the reference {len(refs)}"
        for k, (t, ref) in enumerate(zip(specs, refs)):
            got = np.frombuffer(raw, dtype=t.dtype, count=t.size, offset=offset).reshape(t.shape)
            offset += t.nbytes
            why = compare(got, ref, case.rtol, case.atol)
            if why:
                where = f"data set {d} " if len(case.data_sets) > 1 else ""
                return "failed", f"{where}output {k} '{t.name}': {why}"
    return "passed", ""


def compare(got: np.ndarray, ref: np.ndarray, rtol: float, atol: float) -> str:
    """'' when `got` matches `ref` as ONNX's backend test asks, else why not (one line)."""
    if got.dtype != ref.dtype:
        return f"dtype {got.dtype}, expected {ref.dtype}"
    if got.shape != ref.shape:
        return f"shape {list(got.shape)}, expected {list(ref.shape)}"
    g, r = got.reshape(-1), ref.reshape(-1)
    if np.issubdtype(ref.dtype, np.floating):
        g64, r64 = g.astype(np.float64), r.astype(np.float64)
        finite = np.isfinite(g64) & np.isfinite(r64)
        with np.errstate(invalid="ignore", over="ignore"):
            close = np.abs(g64 - r64) <= atol + rtol * np.abs(r64)
        # infinities must match exactly, NaN matches NaN
        ok = np.where(finite, close, (g64 == r64) | (np.isnan(g64) & np.isnan(r64)))
    else:
        ok = g == r
    bad = np.flatnonzero(~ok)
    if bad.size == 0:
        return ""
    i = int(bad[0])
    at = np.unravel_index(i, ref.shape) if ref.shape else ()
    return (f"{bad.size}/{r.size} elements differ (rtol {rtol:g}, atol {atol:g}); first at "
            f"{list(map(int, at))}: got {g[i]!r}, expected {r[i]!r}")


def _result(case: Case, status: str, reason: str, frozen: tuple, seconds: float) -> Result:
    return Result(case.name, case.kind, case.op, case.ops, case.supported, status, reason,
                  EXCLUSIONS.get(case.name, ""), tuple(frozen), round(seconds, 3))


# ---- the whole run --------------------------------------------------------------------------

class Progress:
    """done/total and counts on one line, redrawn in place on a terminal, else a line every
    `every` cases."""

    def __init__(self, total: int, stream=None, every: int = 200):
        self.total, self.stream, self.every = total, stream, every
        self.counts = Counter()
        self.done = 0
        self.tty = bool(stream is not None and hasattr(stream, "isatty") and stream.isatty())
        self._next = every
        self.start = time.monotonic()

    def update(self, results: list) -> None:
        self.done += len(results)
        self.counts.update(r.status for r in results)
        if self.stream is None:
            return
        if self.tty:
            self.stream.write("\r" + self._line())
            if self.done == self.total:
                self.stream.write("\n")
        elif self.done >= self._next or self.done == self.total:
            self.stream.write(self._line() + "\n")
            self._next = (self.done // self.every + 1) * self.every
        self.stream.flush()

    def _line(self) -> str:
        width = 30
        filled = width * self.done // max(self.total, 1)
        c = self.counts
        return (f"[{'#' * filled}{'.' * (width - filled)}] {self.done}/{self.total}  "
                f"passed {c['passed']}  failed {c['failed']}  unsupported {c['unsupported']}  "
                f"{time.monotonic() - self.start:.0f}s")


def run_cases(cases: list, jobs: int | None = None, progress=None, batch: int = 12) -> list:
    """Run the cases on `jobs` worker processes (default: the CPU count); Results in case
    order."""
    jobs = jobs or os.cpu_count() or 1
    bar = Progress(len(cases), progress)
    batches = [cases[i:i + batch] for i in range(0, len(cases), batch)]
    out = {}
    if jobs == 1:
        for b in batches:
            rs = run_batch(b)
            out.update((r.name, r) for r in rs)
            bar.update(rs)
    else:
        for rs in pool_map(run_batch, batches, jobs, initializer=_warm_up):
            out.update((r.name, r) for r in rs)
            bar.update(rs)
    return [out[c.name] for c in cases]


def pool_map(fn, items: list, jobs: int, timeout: float = POOL_TIMEOUT, initializer=None):
    """fn(item) for every item on `jobs` worker processes, yielded as they finish. McuforgeError
    when none finishes for `timeout` seconds; the workers are then terminated, hung or not."""
    # spawn, not fork: a forked child inherits the parent's locks in whatever state its other
    # threads left them (onnxruntime's thread pool, in a pytest worker), and once hung there
    with multiprocessing.get_context("spawn").Pool(jobs, initializer=initializer) as pool:
        results = pool.imap_unordered(fn, items)
        for _ in items:
            try:
                yield results.next(timeout=timeout)
            except multiprocessing.TimeoutError:
                raise McuforgeError(f"no worker finished a task in {timeout:g} s: one hung "
                                    "(run with --jobs 1 to see where)") from None


def _warm_up():
    """Import the compiler once per worker, before the first batch is timed."""
    warnings.simplefilter("ignore")
    import mcuforge.codegen_c.model  # noqa: F401
    import mcuforge.frontend.tflite  # noqa: F401
    import mcuforge.optimizer.pipeline  # noqa: F401
    from mcuforge.frontend.onnx import _load_converters
    _load_converters()


# ---- the report -----------------------------------------------------------------------------

def summary(results: list) -> dict:
    counted = [r for r in results if not r.excluded]
    c = Counter(r.status for r in counted)
    supported = [r for r in counted if r.supported]
    passed_supported = sum(r.status == "passed" for r in supported)
    return {"total": len(results), "passed": c["passed"], "failed": c["failed"],
            "unsupported": c["unsupported"], "excluded": len(results) - len(counted),
            "frozen": sum(bool(r.frozen) for r in results),
            # passed as given, every operand a graph input (no frozen operands)
            "passed_unfrozen": sum(r.status == "passed" and not r.frozen for r in counted),
            "ops_supported_cases": len(supported),
            "pass_rate_ops_supported": passed_supported / len(supported) if supported else 1.0}


def report(results: list) -> str:
    """The table per operator, totals, every failure with its reason, the exclusions."""
    rows = defaultdict(Counter)
    for r in results:
        rows[r.op]["excluded" if r.excluded else r.status] += 1
    w = max([len("operator")] + [len(op) for op in rows])
    cols = ("passed", "failed", "unsupported", "excluded")
    lines = [f"{'operator':<{w}}  " + "  ".join(f"{c:>11}" for c in cols)]
    for op in sorted(rows):
        lines.append(f"{op:<{w}}  " + "  ".join(f"{rows[op][c]:>11}" for c in cols))
    s = summary(results)
    lines.append(f"{'total':<{w}}  " + "  ".join(f"{s[c]:>11}" for c in cols))
    lines.append(f"\n{s['total']} cases: {s['passed']} passed, {s['failed']} failed, "
                 f"{s['unsupported']} unsupported, {s['excluded']} excluded; "
                 f"{s['pass_rate_ops_supported']:.1%} passed of the {s['ops_supported_cases']} "
                 "cases whose operators all have converters and whose inputs and outputs have "
                 "supported types" + (f"; {s['frozen']} cases ran with their operands after the "
                                      "first frozen as constants (passed without freezing: "
                                      f"{s['passed_unfrozen']})" if s["frozen"] else ""))
    failed = [r for r in results if r.status == "failed" and not r.excluded]
    lines.append(f"\nfailures ({len(failed)}):")
    lines += [f"  {r.name}: {r.reason}" + (f" [inputs {list(r.frozen)} frozen]" if r.frozen
                                            else "") for r in failed] or ["  none"]
    excluded = [r for r in results if r.excluded]
    if all(r.kind == "tflite" for r in results):  # the exclusions are ONNX cases
        return "\n".join(lines)
    lines.append(f"\nknown exclusions ({len(excluded)} run, {len(EXCLUSIONS)} listed):")
    lines += [f"  {r.name} [{r.status}]: {r.excluded}" + (f" -- {r.reason}" if r.reason else "")
              for r in excluded] or ["  none"]
    return "\n".join(lines)


def write_json(results: list, path) -> None:
    data = {"summary": summary(results), "results": [asdict(r) for r in results]}
    Path(path).write_text(json.dumps(data, indent=1))


def run_onnx(kind: str = "node", jobs: int | None = None, filter: str | None = None,
             progress=None) -> list:
    """Load and run the ONNX backend cases: the CLI's and the test's entry point."""
    return run_cases(load_cases(kind, filter), jobs, progress)
