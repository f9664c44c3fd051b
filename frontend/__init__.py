"""Model frontends: read a model file into a verified mcuforge Graph."""
from __future__ import annotations

from pathlib import Path

from mcuforge.ir.errors import ModelError

from .input_shapes import check_input_shapes
from .onnx import load_onnx
from .tflite import load_tflite


def detect_format(head: bytes):
    """The format of a model from its first bytes: "tflite", or None when unrecognised."""
    if head[4:8] == b"TFL3":
        return "tflite"
    # ONNX has no magic number, but every exporter writes ModelProto's field 1 (ir_version,
    # a varint) first: byte 0x08, then a small version
    if len(head) >= 2 and head[0] == 0x08 and 1 <= head[1] <= 32:
        return "onnx"
    return None


def load_model(path, name=None, input_shapes=None):
    """Load the model at `path` (or its bytes) as a Graph, choosing the frontend from the
    content. `input_shapes` ({input name: shape}) fixes dynamic dimensions of inputs (only
    those the model leaves open: check_input_shapes)."""
    if isinstance(path, (bytes, bytearray)):
        fmt = detect_format(bytes(path[:8]))
        if fmt == "tflite":
            return load_tflite(bytes(path), name=name, input_shapes=input_shapes)
        if fmt == "onnx":
            return load_onnx(bytes(path), input_shapes=input_shapes, name=name)
        raise ModelError("unrecognised model format: the bytes are neither a TFLite flatbuffer "
                         "nor an ONNX model")
    path = Path(path)
    try:
        with open(path, "rb") as f:
            head = f.read(8)
    except FileNotFoundError:
        raise ModelError(f"model file not found: {path}") from None
    except OSError as e:
        raise ModelError(f"cannot read model file {path}: {e.strerror or e}") from None
    fmt = detect_format(head)
    if fmt == "tflite":
        return load_tflite(path, name=name, input_shapes=input_shapes)
    if fmt == "onnx":
        return load_onnx(path, input_shapes=input_shapes, name=name or path.stem)
    what = "it is empty" if not head else f"it starts with {head!r}"
    raise ModelError(f"unrecognised model format: {path} ({what}); expected a TFLite "
                     "flatbuffer (.tflite) or an ONNX model (.onnx)")


__all__ = ["load_model", "load_tflite", "load_onnx", "detect_format", "check_input_shapes"]
