"""Quantization quality benchmark: how close mcuforge's int8 model stays to the float model,
side by side with reference int8 quantizations of the same model.

Per float model (ONNX or TFLite): a calibration set and a separate evaluation set of inputs,
the user's own (a .npy / .npz / folder as `compile --calibration` takes; an eval .npz may hold
`labels` too) or, without them, random with fixed seeds in the range the model expects (the
real scikit-learn digits for digits_cnn.onnx) -- with a warning, since figures on noise say
little about real data. The float reference output comes from onnxruntime (ONNX) or LiteRT
(TFLite; mcuforge's own float C when LiteRT is missing). Reported on the eval set, one column
each (and, with labels, every model's top-1 accuracy against them, the float model's too):

  - mcuforge: SQNR (dB) of the int8 C build's dequantized output against float, and top-1
    agreement with float for classifiers (more than one output value per row);
  - onnxruntime: the same two figures for quantize_static (QDQ, per channel, QInt8 activations
    and weights, the same calibration data), run in onnxruntime. An ONNX model is quantized
    as it is; a TFLite model is first exported to ONNX by frontend/onnx_writer (the graph
    after mcuforge's optimizer pipeline, NHWC, weights dequantized for hybrid models);
  - mlcommons, for the MLPerf Tiny float TFLite models: the same figures for MLCommons' own
    int8 model, run with tflite-micro on the eval inputs quantized with its input parameters.

The benchmark guarantees nothing about the figures; it measures them. Its inputs and the
quantizers' calibration are deterministic, so repeated runs give the same figures. A model that
fails (missing, unreadable, not quantizable) gets a row with its error; the others keep theirs.
"""
from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import numpy as np

# mcuforge's own packages first: onnxruntime.quantization puts a folder with its own
# optimizer.py on sys.path, which would hide the `optimizer` package if imported later
import mcuforge.codegen_c.model  # noqa: F401,E402
import mcuforge.frontend.onnx_writer  # noqa: F401,E402
import mcuforge.optimizer.calibrate  # noqa: F401,E402
import mcuforge.optimizer.pipeline  # noqa: F401,E402
import mcuforge.optimizer.quantize  # noqa: F401,E402

from mcuforge.ir.errors import McuforgeError

MLPERF_INT8 = {"ad01_fp32": "ad01_int8", "kws_ref_model_float32": "kws_ref_model",
               "pretrainedResnet": "pretrainedResnet_quant", "vww_96_float": "vww_96_int8"}
CAL_SEED, EVAL_SEED = 1, 2
DEFAULT_CALIBRATION, DEFAULT_EVAL = 200, 360  # digits: 200 training images, whole held-out split


# ---------------------------------------------------------------------------------------------
# Figures


def sqnr_db(ref: np.ndarray, test: np.ndarray) -> float:
    """10*log10(sum ref^2 / sum (ref - test)^2) over the whole eval set; inf when equal."""
    ref, test = np.asarray(ref, np.float64), np.asarray(test, np.float64)
    noise = float(np.sum((ref - test) ** 2))
    signal = float(np.sum(ref ** 2))
    if noise == 0.0:
        return float("inf")
    return float(10.0 * np.log10(max(signal, 1e-300) / noise))


def top1_agreement(ref: np.ndarray, test: np.ndarray) -> float | None:
    """Fraction of rows whose argmax agrees; None when rows have a single value."""
    ref, test = ref.reshape(len(ref), -1), test.reshape(len(test), -1)
    if ref.shape[1] < 2:
        return None
    return float(np.mean(ref.argmax(1) == test.argmax(1)))


def accuracy(test: np.ndarray, labels) -> float | None:
    """Fraction of rows whose argmax is the label; None without labels."""
    if labels is None:
        return None
    test = np.asarray(test).reshape(len(test), -1)
    return float(np.mean(test.argmax(1) == np.asarray(labels).reshape(-1)))


def figures(ref: np.ndarray, test: np.ndarray, classifier: bool = True, labels=None) -> dict:
    test = np.asarray(test, np.float32).reshape(ref.shape)
    return {"sqnr_db": sqnr_db(ref, test),
            "top1": top1_agreement(ref, test) if classifier else None,
            "accuracy": accuracy(test, labels) if classifier else None}


def is_classifier(graph) -> bool:
    """Whether top-1 means something: more than one output value per sample, and not as many
    as the input has (an autoencoder reconstructs its input; its argmax is no class)."""
    t_in, t_out = graph.tensors[graph.inputs[0]], graph.tensors[graph.outputs[0]]
    return 1 < t_out.size != t_in.size


# ---------------------------------------------------------------------------------------------
# Inputs


def _int8_input_range(int8_model: Path) -> tuple:
    """The real range [scale*(-128-zp), scale*(127-zp)] of an int8 model's first input."""
    from ..api import load
    g = load(int8_model)
    q = g.tensors[g.inputs[0]].quant
    s, zp = float(q.scale[0]), int(q.zero_point[0])
    return s * (-128 - zp), s * (127 - zp)


def user_data(data, graph, what: str) -> tuple:
    """(batch [N, *input shape] float32, labels or None) from the user's data: what `compile
    --calibration` takes (calibrate.load_samples), an eval .npz / dict may add `labels`."""
    from mcuforge.optimizer.calibrate import _load, load_samples, stack_samples
    name = graph.inputs[0]
    if isinstance(data, (str, os.PathLike)) and Path(data).is_file():
        data = _load(Path(data))
    labels = None
    if isinstance(data, dict) and "labels" in data and name != "labels":
        data = dict(data)
        labels = np.asarray(data.pop("labels")).reshape(-1)
    try:
        batch = stack_samples(graph, load_samples(data, graph))[0]
    except McuforgeError as e:
        raise McuforgeError(f"{what} data: {e}") from None
    if labels is not None and len(labels) != len(batch):
        raise McuforgeError(f"{what} data: {len(labels)} labels for {len(batch)} inputs")
    return batch, labels


def input_sets(model: Path, graph, n_cal, n_eval) -> tuple:
    """(calibration batch, eval batch, eval labels or None, description, random?) for a
    single-input float model. `n_cal` / `n_eval`: a number of generated samples, or the user's
    data (see user_data)."""
    if len(graph.inputs) != 1:
        raise McuforgeError(f"{model.name}: bench-quant takes single-input models")
    if not isinstance(n_cal, (int, np.integer)) and not isinstance(n_eval, (int, np.integer)):
        cal, _ = user_data(n_cal, graph, "calibration")
        ev, labels = user_data(n_eval, graph, "eval")
        return cal, ev, labels, "user data", False
    if not isinstance(n_cal, (int, np.integer)) or not isinstance(n_eval, (int, np.integer)):
        raise McuforgeError("give both calibration and eval data, or neither (a calibration "
                            "set must not be judged on generated inputs, nor the other way)")
    cal, ev, desc, noise = generated_sets(model, graph, n_cal, n_eval)
    return cal, ev, None, desc, noise


def generated_sets(model: Path, graph, n_cal: int, n_eval: int) -> tuple:
    """(calibration batch, eval batch, description, random?) without user data: the digits
    for the digits demo model, random inputs otherwise."""
    shape = tuple(graph.tensors[graph.inputs[0]].shape)
    if model.name == "digits_cnn.onnx":
        from .digits_demo import CALIBRATION, digits_data
        x_train, _, x_test, _ = digits_data()
        return (x_train[:min(n_cal, CALIBRATION)].reshape(-1, *shape),
                x_test[:n_eval].reshape(-1, *shape),
                "digits: first training images / held-out split", False)
    lo, hi = -1.0, 1.0
    desc = "uniform [-1, 1]"
    int8 = MLPERF_INT8.get(model.stem)
    if int8 and (model.parent / f"{int8}.tflite").is_file():
        lo, hi = _int8_input_range(model.parent / f"{int8}.tflite")
        desc = f"uniform [{lo:.4g}, {hi:.4g}] ({int8} input range)"
    cal = np.random.default_rng(CAL_SEED).uniform(lo, hi, (n_cal, *shape)).astype(np.float32)
    ev = np.random.default_rng(EVAL_SEED).uniform(lo, hi, (n_eval, *shape)).astype(np.float32)
    return cal, ev, desc, True


# ---------------------------------------------------------------------------------------------
# Runners


def float_reference(model: Path, graph, x: np.ndarray) -> np.ndarray:
    """The float model's output on each row of `x`, (N, ...): onnxruntime for ONNX, LiteRT for
    TFLite (mcuforge's float C when LiteRT is missing)."""
    if model.suffix == ".onnx":
        import onnxruntime as ort
        sess = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
        name = sess.get_inputs()[0].name
        return np.stack([sess.run(None, {name: xi})[0] for xi in x])
    try:
        from ai_edge_litert.interpreter import Interpreter
    except ImportError:
        from ..api import run_graph
        return run_graph(graph, [x])[0]
    it = Interpreter(model_path=str(model))
    it.allocate_tensors()
    inp, out = it.get_input_details()[0], it.get_output_details()[0]
    rows = []
    for xi in x:
        it.set_tensor(inp["index"], xi.astype(np.float32))
        it.invoke()
        rows.append(it.get_tensor(out["index"]).copy())
    return np.stack(rows)


def mcuforge_int8(model: Path, cal: np.ndarray, x: np.ndarray, int16_budget=0) -> np.ndarray:
    """mcuforge's int8 model (default calibration method, float32 edges so the output is the
    dequantized int8 output) built as C and run on `x`."""
    from mcuforge.optimizer.quantize import quantize_for_compile

    from ..api import load
    from ..api import GraphRunner
    with GraphRunner() as run:
        q = quantize_for_compile(load(model), "int8", cal, None, io="float",
                                 int16_budget_bytes=int16_budget, run=run)
        return list(run(q, [x]).values())[0]


class _Reader:
    """onnxruntime CalibrationDataReader over a batch, one sample per call."""

    def __init__(self, name: str, batch: np.ndarray):
        self.rows = iter([{name: xi} for xi in batch])

    def get_next(self):
        return next(self.rows, None)


def onnxruntime_int8(model: Path, cal: np.ndarray, x: np.ndarray) -> np.ndarray:
    """onnxruntime.quantization.quantize_static (QDQ, per channel, int8 activations and
    weights) calibrated on `cal`, run in onnxruntime on `x`. A TFLite model is quantized
    through its ONNX export (see export_onnx)."""
    import onnxruntime as ort
    from onnxruntime.quantization import QuantFormat, QuantType, quantize_static

    with tempfile.TemporaryDirectory(prefix="mcuforge-ortq-") as d:
        # quantize_static writes <stem>-inferred.onnx beside its input and deletes it again:
        # two runs on one model in parallel (pytest -n) would race, so it works on a copy.
        if model.suffix == ".onnx":
            src = os.path.join(d, model.name)
            shutil.copyfile(model, src)
        else:
            src = export_onnx(model, Path(d))
        name = ort.InferenceSession(src, providers=["CPUExecutionProvider"]) \
            .get_inputs()[0].name
        out = os.path.join(d, "q.onnx")
        quantize_static(src, out, _Reader(name, cal), quant_format=QuantFormat.QDQ,
                        per_channel=True, activation_type=QuantType.QInt8,
                        weight_type=QuantType.QInt8)
        sess = ort.InferenceSession(out, providers=["CPUExecutionProvider"])
        return np.stack([sess.run(None, {name: xi})[0] for xi in x])


def export_onnx(model: Path, folder: Path) -> str:
    """The float TFLite `model` written as `folder`/<stem>.onnx; returns the path. The graph
    goes through mcuforge's optimizer pipeline first: that is the graph mcuforge quantizes,
    and it turns a hybrid model's int8 weights into float32 ones."""
    from mcuforge.frontend.onnx_writer import write_onnx
    from mcuforge.optimizer.pipeline import optimize

    from ..api import load
    path = folder / f"{model.stem}.onnx"
    path.write_bytes(write_onnx(optimize(load(model))))
    return str(path)


def mlcommons_int8(int8_model: Path, x: np.ndarray) -> np.ndarray:
    """MLCommons' shipped int8 model run with tflite-micro on `x` quantized with its input
    parameters; the output dequantized with its output parameters."""
    from . import tflm
    from ..api import load
    g = load(int8_model)
    qi, qo = g.tensors[g.inputs[0]].quant, g.tensors[g.outputs[0]].quant
    si, zi = float(qi.scale[0]), int(qi.zero_point[0])
    xq = np.clip(np.round(x / si) + zi, -128, 127).astype(np.int8)
    y = tflm.run(int8_model.read_bytes(), [xq])[0]
    return (y.astype(np.float32) - int(qo.zero_point[0])) * float(qo.scale[0])


# ---------------------------------------------------------------------------------------------
# The benchmark


def _row(model: Path) -> dict:
    from mcuforge.optimizer.quantize import DEFAULT_METHOD
    return {"model": model.name, "inputs": None, "random_inputs": False, "calibration": None,
            "eval": None, "labels": False, "method": DEFAULT_METHOD, "float": None,
            "mcuforge": None, "onnxruntime": None,
            "onnxruntime_on": "model" if model.suffix == ".onnx" else "onnx_writer export",
            "mlcommons": None, "mlcommons_model": None, "errors": {}}


def bench_model(model, n_cal=DEFAULT_CALIBRATION, n_eval=DEFAULT_EVAL, int16_budget=0) -> dict:
    """One row of the table (see the module docstring); a failing part records its error.
    `n_cal` / `n_eval`: numbers of generated samples, or the user's data (input_sets)."""
    from ..api import load
    model = Path(model)
    if not model.is_file():
        raise McuforgeError(f"{model} does not exist")
    graph = load(model)
    cal, ev, labels, desc, noise = input_sets(model, graph, n_cal, n_eval)
    ref = float_reference(model, graph, ev)
    classes = is_classifier(graph)
    row = _row(model)
    row.update(inputs=desc, random_inputs=noise, calibration=len(cal), eval=len(ev),
               labels=labels is not None and classes)
    if row["labels"]:
        row["float"] = {"sqnr_db": None, "top1": None, "accuracy": accuracy(ref, labels)}
    try:
        row["mcuforge"] = figures(ref, mcuforge_int8(model, cal, ev, int16_budget), classes,
                                  labels)
    except McuforgeError as e:
        row["errors"]["mcuforge"] = str(e)
    try:
        row["onnxruntime"] = figures(ref, onnxruntime_int8(model, cal, ev), classes, labels)
    except Exception as e:  # a reference that cannot run is reported, not fatal
        row["errors"]["onnxruntime"] = f"{type(e).__name__}: {e}"
    int8 = MLPERF_INT8.get(model.stem)
    if model.suffix == ".tflite" and int8 and (model.parent / f"{int8}.tflite").is_file():
        from . import tflm
        if tflm.available():
            row["mlcommons_model"] = f"{int8}.tflite"
            try:
                row["mlcommons"] = figures(ref, mlcommons_int8(model.parent / f"{int8}.tflite",
                                                               ev), classes, labels)
            except Exception as e:
                row["errors"]["mlcommons"] = f"{type(e).__name__}: {e}"
    return row


def bench_quant(models, n_cal=DEFAULT_CALIBRATION, n_eval=DEFAULT_EVAL, progress=None,
                int16_budget=0, warn=None) -> list:
    """One row per model (bench_model); a model that fails gets a row with its error under
    "model". `warn`: a text stream for the warning that a model's figures come from random
    inputs."""
    rows = []
    for m in models:
        if progress is not None:
            print(f"bench-quant: {Path(m).name} ...", file=progress, flush=True)
        try:
            row = bench_model(m, n_cal, n_eval, int16_budget)
        except Exception as e:  # one broken model must not discard the others' figures
            row = _row(Path(m))
            row["errors"]["model"] = str(e) if isinstance(e, McuforgeError) else \
                f"{type(e).__name__}: {e}"
        if row["random_inputs"] and warn is not None:
            print(f"mcuforge: warning: {random_warning(row)}", file=warn, flush=True)
        rows.append(row)
    return rows


def random_warning(row: dict) -> str:
    return (f"{row['model']}: no calibration / eval data given, so its figures are on random "
            f"inputs ({row['inputs']}), which say little about accuracy on real data: give "
            "--calibration DATA --eval DATA")


def _fmt(fig, key):
    if fig is None or fig.get(key) is None:
        return "-"
    if key == "accuracy":
        return f"{100 * fig[key]:.1f}%"
    v = fig[key]
    return f"{v:.2f}" if key == "sqnr_db" else f"{100 * v:.1f}%"


COLUMNS = ("mcuforge", "onnxruntime", "mlcommons")


def format_table(rows: list) -> str:
    """A text table, one row per model and an SQNR / top-1 pair per quantizer, then what the
    reference columns ran and any errors."""
    labels = any(r.get("labels") for r in rows)  # accuracy columns only with labels
    head = ("model", "cal/eval") + (("float acc",) if labels else ())
    for col in COLUMNS:
        head += (f"{col} SQNR dB", "top-1") + (("acc",) if labels else ())
    body = []
    for r in rows:
        sizes = "-" if r["calibration"] is None else f"{r['calibration']}/{r['eval']}"
        cells = (r["model"], sizes) + ((_fmt(r.get("float"), "accuracy"),) if labels else ())
        for col in COLUMNS:
            cells += (_fmt(r[col], "sqnr_db"), _fmt(r[col], "top1"))
            cells += (_fmt(r[col], "accuracy"),) if labels else ()
        body.append(cells)
    widths = [max(len(x[i]) for x in [head, *body]) for i in range(len(head))]
    lines = ["  ".join(c.ljust(w) if i == 0 else c.rjust(w)
                       for i, (c, w) in enumerate(zip(x, widths))) for x in [head, *body]]
    lines.insert(1, "  ".join("-" * w for w in widths))
    lines += _legend(rows)
    for r in rows:
        for part, err in r["errors"].items():
            lines.append(f"{r['model']}: {part}: {err}")
    return "\n".join(lines)


def _legend(rows: list) -> list:
    lines = ["top-1: agreement with the float model's top-1" + (
        "; acc: top-1 accuracy against the eval labels" if any(r.get("labels") for r in rows)
        else "")]
    lines.append("onnxruntime: quantize_static (QDQ, per channel, int8) of the .onnx model, or "
                 "of a .tflite model's ONNX export (frontend/onnx_writer)")
    pairs = [f"{r['model']} -> {r['mlcommons_model']}" for r in rows if r["mlcommons_model"]]
    if pairs:
        lines.append("mlcommons: MLCommons' int8 model in tflite-micro: " + ", ".join(pairs))
    lines += [f"warning: {random_warning(r)}" for r in rows if r.get("random_inputs")]
    return lines
