"""Model frontends: read a model file into a verified mcuforge Graph."""
from __future__ import annotations

from pathlib import Path

from mcuforge.errors import ModelError

from .tflite import load_tflite


def detect_format(head: bytes):
    """The format of a model from its first bytes: "tflite", or None when unrecognised."""
    if head[4:8] == b"TFL3":
        return "tflite"
    # ONNX hook: an ONNX file is a protobuf ModelProto without a magic number; detect it
    # here (e.g. by parsing with onnx.load_model_from_string) and return "onnx".
    return None


def load_model(path, name=None):
    """Load the model at `path` (or its bytes) as a Graph, choosing the frontend from the
    content."""
    if isinstance(path, (bytes, bytearray)):
        if detect_format(bytes(path[:8])) == "tflite":
            return load_tflite(bytes(path), name=name)
        raise ModelError("unrecognised model format: the bytes are not a TFLite flatbuffer")
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
        return load_tflite(path, name=name)
    # ONNX hook: if fmt == "onnx": return load_onnx(path, name=name)
    what = "it is empty" if not head else f"it starts with {head!r}"
    raise ModelError(f"unrecognised model format: {path} ({what}); expected a TFLite "
                     "flatbuffer (.tflite)")


__all__ = ["load_model", "load_tflite", "detect_format"]
