"""Model frontends: read a model file into a verified mcuforge Graph."""
from __future__ import annotations

from pathlib import Path

from mcuforge.errors import ModelError

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


def check_input_shapes(declared: dict, given: dict, how: str = "--input-shape") -> None:
    """Check shapes given for a model's inputs against what the model declares: `declared`
    maps each input name to its dims, None (or -1) where the model leaves a dimension open
    (None instead of the list: no shape at all).
    Only open dimensions may be set; an unknown name, another rank or a different static
    dimension is a ModelError naming the input, its declared shape and what was given."""
    show = lambda dims: "[" + ", ".join("?" if d is None or d < 0 else str(d)  # noqa: E731
                                        for d in dims) + "]"
    for name, shape in given.items():
        text = f"{how} {name}={','.join(str(int(d)) for d in shape)}"
        if name not in declared:
            have = ", ".join(f"'{k}' {show(v)}" for k, v in declared.items()) or "none"
            raise ModelError(f"{text}: the model has no input '{name}' (its inputs: {have})")
        dims = declared[name]
        if dims is None:  # no shape in the model: any
            continue
        if len(dims) != len(shape) or any(d is not None and d >= 0 and d != int(v)
                                          for d, v in zip(dims, shape)):
            raise ModelError(f"{text}: input '{name}' is declared {show(dims)}; only its open "
                             "dimensions (?) may be set, the others must be given as declared")


def _check_tflite_inputs(buf: bytes, given: dict) -> None:
    """--input-shape for a .tflite: names and static dims checked against the model's inputs
    (dims with -1 in shape_signature are open)."""
    import tflite
    try:
        sg = tflite.Model.GetRootAsModel(buf, 0).Subgraphs(0)
        declared = {}
        for k in range(sg.InputsLength()):
            t = sg.Tensors(int(sg.Inputs(k)))
            sig = t.ShapeSignatureAsNumpy() if t.ShapeSignatureLength() else t.ShapeAsNumpy()
            declared[t.Name().decode()] = [None if int(d) < 0 else int(d)
                                           for d in (sig if t.ShapeLength() else [])]
    except Exception:  # noqa: BLE001  (a model load_tflite read cannot fail here in practice)
        return
    check_input_shapes(declared, given)


def load_model(path, name=None, input_shapes=None):
    """Load the model at `path` (or its bytes) as a Graph, choosing the frontend from the
    content. `input_shapes` ({input name: shape}) fixes dynamic dimensions of inputs (only
    those the model leaves open: check_input_shapes)."""
    if isinstance(path, (bytes, bytearray)):
        fmt = detect_format(bytes(path[:8]))
        if fmt == "tflite":
            if input_shapes:
                _check_tflite_inputs(bytes(path), input_shapes)
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
        if input_shapes:
            _check_tflite_inputs(path.read_bytes(), input_shapes)
        return load_tflite(path, name=name, input_shapes=input_shapes)
    if fmt == "onnx":
        return load_onnx(path, input_shapes=input_shapes, name=name or path.stem)
    what = "it is empty" if not head else f"it starts with {head!r}"
    raise ModelError(f"unrecognised model format: {path} ({what}); expected a TFLite "
                     "flatbuffer (.tflite) or an ONNX model (.onnx)")


__all__ = ["load_model", "load_tflite", "load_onnx", "detect_format", "check_input_shapes"]
