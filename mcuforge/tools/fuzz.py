"""`mcuforge fuzz`: random ONNX graphs through mcuforge, checked against independent references.

1. The generator (`make_model`, mcuforge/tools/fuzz_gen.py) builds float32 ONNX graphs of 2-12 nodes over 30-odd operator
   types with random shapes (square ones often) and attributes, using onnx.helper, onnx's own
   shape inference and numpy only: it shares no code with mcuforge, so a mistake in mcuforge's
   shape or attribute handling cannot hide on both sides. Graphs whose onnxruntime run has a
   non-finite or huge intermediate value are drawn again (a comparison of overflows says
   nothing).
2. The checks:
   - float (`check_float`): onnxruntime and mcuforge's C (built with gcc, run on the host) on the
     same random inputs; equal when |c - ort| <= RTOL * (|ort| + max |ort| of the output). A
     difference beyond that is re-judged against a float64 evaluation (onnx.reference on the
     graph in double): still a pass when mcuforge is no further from it than a few times
     onnxruntime is (an ill-conditioned graph: float32 itself cannot do better).
   - int8 (`check_int8`): the graph quantized by mcuforge (`--quantize int8`, calibrated on
     random data, `--emit-tflite`), the C run on int8 inputs and the emitted .tflite run in
     tflite-micro: equal byte for byte.
   Each check ends "passed", "mismatch" (wrong numbers or shapes), "refused" (a McuforgeError
   other than a failed build: mcuforge said clearly what it cannot do) or "crashed" (any other
   exception, a C build failure or a failing executable).
3. The sweep (`sweep`, `mcuforge fuzz --seed S --count N [--int8] [--jobs J]`): graphs S ..
   S+N-1, a summary, and every failing model saved for reproduction (`--save DIR`), optionally
   minimised (`minimise`: the smallest sub-graph, cut at intermediate tensors, that still
   fails the same way).

The generator and the references live in mcuforge/tools/fuzz_gen.py (which imports nothing of
mcuforge). Known bugs: KNOWN lists generator features that hit a bug found by this fuzzer and not fixed
yet, each with a comment naming it; the fixed-seed suite set (tests/test_fuzz_graphs.py) leaves
them out (`exclude=KNOWN`), the sweep keeps them (to see whether they are fixed).
"""
from __future__ import annotations

import contextlib
import io
import os
import tempfile
import traceback
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
from onnx import helper

from .fuzz_gen import (IR_VERSION, KNOWN, Generated, _values_sane, float64_run,  # noqa: F401
                       make_model, ort_run)

RTOL = 1e-4  # float32: relative to the element and to the output's magnitude
RUN_TIMEOUT = 60  # seconds for one run of a compiled model

# ---- the checks -------------------------------------------------------------------------

@dataclass
class Outcome:
    seed: int
    kind: str  # "float" | "int8"
    status: str  # passed | mismatch | refused | crashed
    detail: str = ""
    ops: tuple = ()
    model: bytes = field(default=b"", repr=False)  # kept for failures
    inputs: dict = field(default_factory=dict, repr=False)
    tflite: bytes = field(default=b"", repr=False)

    @property
    def failed(self) -> bool:
        return self.status in ("mismatch", "crashed")


def _classify(e: BaseException) -> tuple:
    from mcuforge.ir.errors import BuildError, McuforgeError
    if isinstance(e, McuforgeError) and not isinstance(e, BuildError):
        return "refused", f"{type(e).__name__}: {e}"
    tb = "".join(traceback.format_exception(e))
    return "crashed", tb[-3000:]


def _compile_and_run(model: bytes, feeds: dict, workdir: Path, **compile_args) -> tuple:
    """mcuforge's compile (as `mcuforge compile`), the project built with gcc and run on `feeds`
    (name -> one sample): (CompileResult, {output name: array})."""
    from ..api import compile as compile_model
    from ..build import build, run_executable
    with contextlib.redirect_stderr(io.StringIO()):  # the quantizer's progress bar
        r = compile_model(model, workdir / "proj", name="model", **compile_args)
    exe = build(r.out_dir, r.name)
    arrays = [np.asarray(feeds[n])[None] for n in r.graph.inputs]
    outs = run_executable(exe, r.graph, arrays, timeout=RUN_TIMEOUT)
    return r, {n: o[0] for n, o in zip(r.graph.outputs, outs)}


def compare_float(got: dict, want: dict, model: bytes, inputs: dict) -> str:
    """'' when mcuforge's outputs equal onnxruntime's within float32 tolerance, else why not."""
    bad = []
    for name, ref in want.items():
        if name not in got:
            return f"output '{name}' missing (mcuforge outputs: {sorted(got)})"
        out = got[name]
        if tuple(out.shape) != tuple(ref.shape):
            return f"output '{name}': shape {tuple(out.shape)}, onnxruntime {tuple(ref.shape)}"
        if out.dtype != ref.dtype:
            return f"output '{name}': dtype {out.dtype}, onnxruntime {ref.dtype}"
        err = np.abs(out.astype(np.float64) - ref.astype(np.float64))
        tol = RTOL * (np.abs(ref) + np.abs(ref).max(initial=0)) + 1e-6
        if not (err <= tol).all():  # NaN too
            bad.append(name)
    if not bad:
        return ""
    exact = float64_run(model, inputs)
    why = []
    for name in bad:
        ref, out = want[name].astype(np.float64), got[name].astype(np.float64)
        err = np.abs(out - ref)
        i = np.unravel_index(np.nanargmax(np.where(np.isnan(err), np.inf, err)), err.shape)
        if exact is not None and name in exact:
            e64 = np.asarray(exact[name], np.float64).reshape(ref.shape)
            e_ort, e_ours = np.abs(ref - e64), np.abs(out - e64)
            tol = RTOL * (np.abs(e64) + np.abs(e64).max(initial=0)) + 1e-6
            if (e_ours <= tol + 4 * e_ort).all():
                continue  # ill-conditioned: onnxruntime's float32 is as far off
        why.append(f"output '{name}' at {tuple(int(k) for k in i)}: mcuforge {out[i]!r}, "
                   f"onnxruntime {ref[i]!r} (max |ref| {np.abs(ref).max():.4g})")
    return "; ".join(why)


def check_float(g: Generated) -> Outcome:
    out = Outcome(g.seed, "float", "passed", ops=g.ops, model=g.model, inputs=g.inputs)
    want = ort_run(g.model, g.inputs)
    try:
        with tempfile.TemporaryDirectory(prefix="mcuforge-fuzz-") as d:
            _, got = _compile_and_run(g.model, g.inputs, Path(d))
    except Exception as e:
        out.status, out.detail = _classify(e)
        return out
    why = compare_float(got, want, g.model, g.inputs)
    if why:
        out.status, out.detail = "mismatch", why
    return out


def check_int8(g: Generated, n_cal: int = 16) -> Outcome:
    from . import tflm
    out = Outcome(g.seed, "int8", "passed", ops=g.ops, model=g.model, inputs=g.inputs)
    rng = np.random.default_rng([g.seed, 8])
    names = list(g.inputs)
    cal = {n: rng.uniform(-2, 2, (n_cal, *g.inputs[n].shape)).astype(np.float32) for n in names}
    calibration = cal[names[0]] if len(names) == 1 else cal
    try:
        with tempfile.TemporaryDirectory(prefix="mcuforge-fuzz-") as d:
            tfl = Path(d) / "q.tflite"
            from ..api import compile as compile_model
            from ..build import build, run_executable
            with contextlib.redirect_stderr(io.StringIO()):
                r = compile_model(g.model, Path(d) / "proj", name="model", quantize="int8",
                                  calibration=calibration, emit_tflite=tfl)
            out.tflite = tfl.read_bytes()
            feeds = []
            for n in r.graph.inputs:
                t = r.graph.tensors[n]
                x = g.inputs[n].reshape(t.shape) if n in g.inputs else None
                if x is None or t.dtype != "int8":
                    raise RuntimeError(f"quantized input '{n}' is {t.dtype}{t.shape}")
                s, z = t.quant.scale[0], t.quant.zero_point[0]
                feeds.append(np.clip(np.round(x / s) + z, -128, 127).astype(np.int8)[None])
            exe = build(r.out_dir, r.name)
            got = run_executable(exe, r.graph, feeds, timeout=RUN_TIMEOUT)
    except Exception as e:
        out.status, out.detail = _classify(e)
        return out
    try:
        ref = tflm.run(out.tflite, feeds)
    except Exception as e:
        out.status = "crashed"
        out.detail = f"tflite-micro cannot run the emitted .tflite: {type(e).__name__}: {e}"
        return out
    for name, c, t in zip(r.graph.outputs, got, ref):
        if c.size != t.size:
            out.status = "mismatch"
            out.detail = f"output '{name}': C {c.shape}, tflite-micro {t.shape}"
            return out
        t = t.reshape(c.shape)
        if not np.array_equal(c, t):
            d = np.abs(c.astype(int) - t.astype(int))
            out.status = "mismatch"
            out.detail = (f"output '{name}': {int((d > 0).sum())} of {d.size} int8 values "
                          f"differ from tflite-micro, by up to {int(d.max())}")
            return out
    return out


def check(seed: int, int8: bool = False, exclude=()) -> Outcome:
    """Generate graph `seed` and check it; any exception of the generator itself is a crash
    of the fuzzer, reported as such."""
    try:
        g = make_model(seed, int8, exclude)
    except Exception as e:
        return Outcome(seed, "int8" if int8 else "float", "crashed",
                       "generator: " + "".join(traceback.format_exception(e))[-2000:])
    return check_int8(g) if int8 else check_float(g)


def _check_args(args: tuple) -> Outcome:
    import warnings
    warnings.simplefilter("ignore")
    return check(*args)


# ---- minimising a failure ---------------------------------------------------------------

def _sub_model(model: onnx.ModelProto, outputs: list, cut: set) -> onnx.ModelProto | None:
    """The part of `model` computing `outputs`, with the tensors in `cut` made graph inputs
    (their producers dropped); None if that is not a valid model."""
    try:
        inferred = onnx.shape_inference.infer_shapes(model, strict_mode=True)
    except Exception:
        return None
    types = {v.name: v for v in list(inferred.graph.value_info) + list(inferred.graph.input)
             + list(inferred.graph.output)}
    need, kept = set(outputs), []
    for n in reversed(model.graph.node):
        if need & set(n.output) and not set(n.output) <= cut:
            kept.append(n)
            need.update(i for i in n.input if i)
    kept.reverse()
    inits = [t for t in model.graph.initializer if t.name in need]
    init_names = {t.name for t in inits}
    produced = {o for n in kept for o in n.output}
    inputs = [types[t] for t in sorted(need - produced - init_names) if t in types]
    if len(inputs) != len(need - produced - init_names) or not kept:
        return None
    g = helper.make_graph(kept, "fuzz-min", inputs, [types[o] for o in outputs], inits)
    m = helper.make_model(g, opset_imports=list(model.opset_import), producer_name="mcuforge.tools.fuzz", ir_version=IR_VERSION)
    try:
        onnx.checker.check_model(m, full_check=True)
    except Exception:
        return None
    return m


def minimise(outcome: Outcome, max_checks: int = 60) -> Outcome:
    """A smaller model failing the same way (same status), greedily: keep one output, then cut
    the graph at intermediate tensors (made inputs) while it still fails."""
    model = onnx.load_from_string(outcome.model)
    rng = np.random.default_rng([outcome.seed, 99])
    best = outcome
    checks = 0

    def attempt(m):
        nonlocal checks
        checks += 1
        inputs = {}
        for v in m.graph.input:
            shape = [d.dim_value for d in v.type.tensor_type.shape.dim]
            inputs[v.name] = outcome.inputs.get(v.name, None)
            if inputs[v.name] is None:
                inputs[v.name] = rng.uniform(-2, 2, shape).astype(np.float32)
        try:
            if not _values_sane(m, inputs, _shapes(m)):
                return None
        except Exception:
            return None
        g = Generated(m.SerializeToString(), inputs, outcome.seed, outcome.kind == "int8",
                      tuple(n.op_type for n in m.graph.node))
        o = check_int8(g) if g.int8 else check_float(g)
        return o if o.status == outcome.status else None

    improved = True
    while improved and checks < max_checks:
        improved = False
        current = onnx.load_from_string(best.model)
        outs = [o.name for o in current.graph.output]
        candidates = []
        if len(outs) > 1:
            candidates += [([o], set()) for o in outs]
        produced = [o for n in current.graph.node for o in n.output]
        for t in produced:  # a shorter graph: stop at an intermediate tensor
            if t not in outs:
                candidates.append(([t], set()))
        for t in produced:  # cut the graph above t
            candidates.append((outs, {t}))
        for outputs, cut in candidates:
            if checks >= max_checks:
                break
            m = _sub_model(current, outputs, cut)
            if m is None or len(m.graph.node) >= len(current.graph.node):
                continue
            o = attempt(m)
            if o is not None:
                best, improved = o, True
                break
    del model
    return best


def _shapes(m: onnx.ModelProto) -> dict:
    inferred = onnx.shape_inference.infer_shapes(m, strict_mode=True)
    out = {}
    for v in list(inferred.graph.value_info) + list(inferred.graph.input) + \
            list(inferred.graph.output):
        out[v.name] = tuple(d.dim_value for d in v.type.tensor_type.shape.dim)
    return out


# ---- the sweep --------------------------------------------------------------------------

STATUSES = ("passed", "mismatch", "refused", "crashed")


def sweep(seed: int, count: int, int8: bool = False, jobs: int = 1, save=None,
          exclude=(), minimise_failures: bool = False, progress=None) -> list:
    """Check graphs seed .. seed+count-1; every failure (and its minimised form) saved in
    `save` when given. Returns the Outcomes in seed order."""
    from .conformance import pool_map
    args = [(s, int8, tuple(exclude)) for s in range(seed, seed + count)]
    results = {}
    if jobs <= 1:
        stream = map(_check_args, args)
    else:
        stream = pool_map(_check_args, args, jobs, timeout=20 * RUN_TIMEOUT)
    tty = progress is not None and getattr(progress, "isatty", lambda: False)()
    for o in stream:
        results[o.seed] = o
        done = len(results)
        # redrawn in place on a terminal; in a log, a line per tenth of the sweep
        if progress is not None and (tty or done == count or done % max(1, count // 10) == 0):
            c = {s: sum(r.status == s for r in results.values()) for s in STATUSES}
            line = f"{done}/{count}  " + "  ".join(f"{k} {v}" for k, v in c.items())
            progress.write(f"\r{line}" if tty else f"{line}\n")
            progress.flush()
    if tty:
        progress.write("\n")
    ordered = [results[s] for s in range(seed, seed + count)]
    if save is not None:
        for o in ordered:
            if o.failed or o.status == "refused":
                save_outcome(o, Path(save))
                if o.failed and minimise_failures and o.model:
                    small = minimise(o)
                    save_outcome(small, Path(save), suffix="-min")
    return ordered


def save_outcome(o: Outcome, folder: Path, suffix: str = "") -> Path:
    """<folder>/<kind>-<seed><suffix>.onnx (+ .npz inputs, .tflite for int8, .txt detail)."""
    folder.mkdir(parents=True, exist_ok=True)
    stem = folder / f"{o.status}-{o.kind}-{o.seed}{suffix}"
    if o.model:
        stem.with_suffix(".onnx").write_bytes(o.model)
    if o.inputs:
        np.savez(stem.with_suffix(".npz"), **o.inputs)
    if o.tflite:
        stem.with_suffix(".tflite").write_bytes(o.tflite)
    stem.with_suffix(".txt").write_text(
        f"seed {o.seed} ({o.kind}): {o.status}\nops: {' '.join(o.ops)}\n\n{o.detail}\n")
    return stem


def summary(outcomes: list) -> str:
    """Counts, then every mismatch and crash on a line of its own, then the refusals grouped by
    message (node names left out)."""
    import re
    from collections import defaultdict
    c = {s: sum(o.status == s for o in outcomes) for s in STATUSES}
    lines = [f"tried {len(outcomes)}: passed {c['passed']}, mismatched {c['mismatch']}, "
             f"refused with a clear error {c['refused']}, crashed {c['crashed']}"]
    refusals = defaultdict(list)
    for o in outcomes:
        detail = o.detail.strip()
        if o.status == "refused":
            refusals[re.sub(r"'[^']*'", "'...'", detail.splitlines()[-1])[:200]].append(o.seed)
        elif o.status != "passed":
            first = detail.splitlines()[0 if o.status == "mismatch" else -1] if detail else ""
            lines.append(f"  seed {o.seed} {o.kind} {o.status}: {first[:300]}"
                         f"  [{' '.join(o.ops)}]")
    for why, seeds in sorted(refusals.items(), key=lambda kv: -len(kv[1])):
        shown = " ".join(map(str, seeds[:8])) + (" ..." if len(seeds) > 8 else "")
        lines.append(f"  refused {len(seeds)}x: {why}  [seeds {shown}]")
    return "\n".join(lines)


def default_jobs() -> int:
    return max(1, (os.cpu_count() or 1))
