"""The real-data demo: a small CNN trained on scikit-learn's 8x8 digits, compiled to C as float
and as int8 (post-training quantization by mcuforge), both run in C on the held-out images.

The model, mcuforge/tools/data/digits_cnn.onnx, is written by tests/models/train_digits.py (plain
numpy, deterministic) from the training split `digits_data` defines; the held-out split is never
seen by training or calibration. The demo guarantees nothing about bits: it measures accuracy.
It passes when the float C build predicts the same digit as onnxruntime on every image, the
int8 build is within one percentage point of the float accuracy, and (with tflite-micro
installed) the int8 C logits equal TFLM's on every image, run on the int8 model written as
.tflite.

Until mcuforge's quantizer exists, the int8 half reports itself pending and the demo checks the
float half only; `compile_int8` is the one place that calls the quantizer.
"""
from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from mcuforge.ir.errors import McuforgeError

MODEL = Path(__file__).resolve().parent / "data" / "digits_cnn.onnx"  # package data
HELD_OUT = 360  # the last 360 images of the data set: the test split
CALIBRATION = 200  # the first 200 training images calibrate the quantizer
MIN_FLOAT_ACCURACY = 0.95
MAX_INT8_DROP = 0.01  # one percentage point


def digits_data():
    """(x_train, y_train, x_test, y_test) of scikit-learn's bundled 8x8 digits (no download):
    x float32 of shape (N, 1, 8, 8), pixels scaled from 0..16 to [0, 1]; y int64 labels.
    The split is fixed: the last HELD_OUT images are the test split."""
    try:
        from sklearn.datasets import load_digits
    except ImportError:
        raise McuforgeError("the digits demo needs scikit-learn for its data set: "
                            "pip install 'mcuforge[demo]' (scikit-learn)") from None
    d = load_digits()
    x = (d.data.reshape(-1, 1, 8, 8) / 16.0).astype(np.float32)
    y = d.target.astype(np.int64)
    return x[:-HELD_OUT], y[:-HELD_OUT], x[-HELD_OUT:], y[-HELD_OUT:]


# ----------------------------------------------------------------------------------------------
# Quantization: the single switch


def quantizer_available() -> bool:
    """True when mcuforge.api.compile takes quantize= (optimizer.quantize is in place)."""
    import importlib.util

    from ..api import compile as compile_model
    if importlib.util.find_spec("mcuforge.optimizer.quantize") is None:
        return False
    return "quantize" in inspect.signature(compile_model).parameters


def compile_int8(model, out_dir, calibration, name: str = "digits", emit_tflite=None):
    """Compile `model` quantized to int8 (int8 input and output), calibrated on `calibration`
    (a batch of model inputs along a new leading axis); `emit_tflite` also writes the int8 model
    as a .tflite. Returns the CompileResult, or None when the quantizer is not available yet."""
    if not quantizer_available():
        return None
    from ..api import compile as compile_model
    return compile_model(model, out_dir, name=name, quantize="int8",
                         calibration=np.ascontiguousarray(calibration, np.float32),
                         quantize_io="int8", emit_tflite=emit_tflite)


# ----------------------------------------------------------------------------------------------
# Running a compiled project on the test split


def model_inputs(result, x) -> np.ndarray:
    """The images `x` (N, 1, 8, 8) float32 as the compiled model takes them: [N, *input shape]
    of its dtype; an int8 input quantized with the input tensor's scale and zero point."""
    t = result.graph.tensors[result.graph.inputs[0]]
    x = x.reshape((len(x), *t.shape))
    if t.dtype == "int8":
        scale, zp = t.quant.scale[0], t.quant.zero_point[0]
        return np.clip(np.round(x / scale) + zp, -128, 127).astype(np.int8)
    return x.astype(t.dtype)


def run_project(result, x) -> np.ndarray:
    """Build the compiled project with gcc and run the model inputs `x` through it; returns
    the logits, (N, 10), float or int8 (argmax of int8 logits equals that of their values)."""
    from ..build import build, run_executable
    exe = build(result.out_dir, result.name)
    return run_executable(exe, result.graph, [x])[0].reshape(len(x), -1)


def onnxruntime_predictions(model: Path, x) -> np.ndarray | None:
    """onnxruntime's predicted digits, or None when onnxruntime is not installed."""
    try:
        import onnxruntime as ort
    except ImportError:
        return None
    sess = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    name = sess.get_inputs()[0].name
    return np.array([sess.run(None, {name: xi[None]})[0].argmax() for xi in x])


@dataclass
class DigitsResult:
    images: int
    float_accuracy: float
    float_weight_bytes: int
    float_arena_bytes: int
    ort_accuracy: float | None = None  # None: onnxruntime not installed
    ort_agreement: float | None = None  # fraction of images where float C == onnxruntime
    int8_accuracy: float | None = None  # None: quantizer pending
    int8_weight_bytes: int | None = None
    int8_arena_bytes: int | None = None
    tflm_equal: bool | None = None  # int8 C logits == TFLM's on every image; None: no TFLM
    notes: list = field(default_factory=list)


def evaluate(out_dir, model=MODEL, log=print) -> DigitsResult:
    """Compile the model as float (out_dir/float) and int8 (out_dir/int8), build both, run the
    test split in C and measure accuracy; `log` gets one line per step."""
    from ..api import compile as compile_model

    model, out = Path(model), Path(out_dir)
    if not model.is_file():
        raise McuforgeError(f"{model} is missing: run tests/models/train_digits.py")
    x_train, _, x_test, y_test = digits_data()
    log(f"[1/4] {model.name}: {model.stat().st_size:,} bytes, trained on {len(x_train)} "
        f"images of scikit-learn's 8x8 digits; {len(x_test)} held-out images")

    fres = compile_model(model, out / "float", name="digits")
    fpred = run_project(fres, model_inputs(fres, x_test)).argmax(1)
    r = DigitsResult(len(x_test), float(np.mean(fpred == y_test)), fres.weight_bytes,
                     fres.arena_bytes)
    ort = onnxruntime_predictions(model, x_test)
    line = f"[2/4] float C: accuracy {r.float_accuracy:.2%}"
    if ort is not None:
        r.ort_accuracy = float(np.mean(ort == y_test))
        r.ort_agreement = float(np.mean(ort == fpred))
        line += (f" (onnxruntime {r.ort_accuracy:.2%}, same digit on "
                 f"{int(np.sum(ort == fpred))}/{len(x_test)} images)")
    log(line + f"; weights {r.float_weight_bytes:,} bytes, arena {r.float_arena_bytes:,} bytes")

    tflite = out / "digits_int8.tflite"
    qres = compile_int8(model, out / "int8", x_train[:CALIBRATION, None], emit_tflite=tflite)
    if qres is None:
        r.notes.append("int8: pending (mcuforge's quantizer, optimizer.quantize, is not "
                       "available yet)")
        log(f"[3/4] {r.notes[-1]}")
        log("[4/4] int8 C: skipped")
        return r
    log(f"[3/4] quantized to int8, calibrated on {CALIBRATION} training images: "
        f"weights {qres.weight_bytes:,} bytes, arena {qres.arena_bytes:,} bytes")
    xq = model_inputs(qres, x_test)
    qlogits = run_project(qres, xq)
    r.int8_accuracy = float(np.mean(qlogits.argmax(1) == y_test))
    r.int8_weight_bytes, r.int8_arena_bytes = qres.weight_bytes, qres.arena_bytes
    line = (f"[4/4] int8 C: accuracy {r.int8_accuracy:.2%} (float {r.float_accuracy:.2%}, "
            f"{100 * (r.int8_accuracy - r.float_accuracy):+.1f} points)")
    from . import tflm
    if tflm.available():
        ref = tflm.run(tflite.read_bytes(), [xq])[0].reshape(qlogits.shape)
        r.tflm_equal = bool(np.array_equal(ref, qlogits))
        line += (f"; logits bit-exact with tflite-micro on {int(np.all(ref == qlogits, 1).sum())}"
                 f"/{len(xq)} images ({tflite.name})")
    log(line)
    return r


def verdict(r: DigitsResult) -> tuple[int, str]:
    """(exit status, the last line): PASS when float C matches onnxruntime on every image, is
    at least 95% accurate, and int8 (when available) is within one point of float and, when
    checked, bit-exact with TFLM."""
    if r.float_accuracy < MIN_FLOAT_ACCURACY:
        return 1, f"FAIL: float accuracy {r.float_accuracy:.2%} is below 95%"
    if r.ort_agreement is not None and r.ort_agreement < 1.0:
        return 1, "FAIL: the float C build and onnxruntime disagree on some images"
    if r.int8_accuracy is None:
        return 0, (f"PASS (float only; int8 pending): float accuracy {r.float_accuracy:.2%}, "
                   f"arena {r.float_arena_bytes:,} bytes")
    if r.tflm_equal is False:
        return 1, "FAIL: the int8 C build and tflite-micro differ"
    if r.int8_accuracy < r.float_accuracy - MAX_INT8_DROP - 1e-9:
        return 1, (f"FAIL: int8 accuracy {r.int8_accuracy:.2%} is more than one point below "
                   f"float {r.float_accuracy:.2%}")
    exact = "; int8 bit-exact with TFLM" if r.tflm_equal else ""
    return 0, (f"PASS: int8 accuracy {r.int8_accuracy:.2%} within one point of float "
               f"{r.float_accuracy:.2%}{exact}; arena {r.int8_arena_bytes:,} bytes, weights "
               f"{r.int8_weight_bytes:,} bytes (float {r.float_weight_bytes:,})")


def run_digits_demo(out_dir) -> int:
    """`mcuforge demo`: evaluate into `out_dir`, print every step and the verdict.
    Returns the exit status (0 on PASS)."""
    status, line = verdict(evaluate(out_dir))
    print(line)
    return status
