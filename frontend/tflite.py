"""Read a TFLite flatbuffer into a mcuforge Graph.

Subgraph 0 is the model; other subgraphs are read when an operator needs them (IF / WHILE
branches and bodies become Graphs of their own, CALL_ONCE's init runs at compile time).
Operators are converted by the functions in `tflite_ops`; every
failure to read the file is a `ModelError` (flatbuffer readers fail lazily, deep inside
accessors, so the whole parse is guarded and low-level errors are re-raised as ModelError).
"""
from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import tflite

from mcuforge.ir.errors import ModelError, UnsupportedOpError
from mcuforge.ir.graph import MAX_NESTING, Graph, GraphError, Node, Quant, Tensor, verify

from . import (tflite_ops_binary, tflite_ops_data, tflite_ops_layers,  # noqa: F401
               tflite_ops_math, tflite_ops_reduce, tflite_ops_shape)  # (they register)
from .tflite_ops_state import VariableBook
from .tflite_shapes import infer_shapes, is_dynamic  # (registers the state converters too)
from . import tflite_ops_stateful  # noqa: F401  (SVDF, LSTM register)
from . import tflite_ops_control  # noqa: F401  (IF, WHILE register)
from .tflite_ops import CONVERTERS, OpContext, Unsupported
from .tflite_verify import FlatbufferError, verify_flatbuffer

IDENTIFIER = b"TFL3"
_OP_NAMES = {v: k for k, v in vars(tflite.BuiltinOperator).items() if not k.startswith("_")}
_TYPES = {"FLOAT32": "float32", "INT32": "int32", "UINT8": "uint8", "INT64": "int64",
          "BOOL": "bool", "INT16": "int16", "INT8": "int8"}
_TYPE_NAMES = {v: k for k, v in vars(tflite.TensorType).items() if not k.startswith("_")}


def load_tflite(path_or_bytes, name=None, input_shapes=None) -> Graph:
    """Load a .tflite model (a path or its bytes) as a verified Graph. `input_shapes` ({input
    name: shape}) fixes inputs with dynamic dimensions (-1 in shape_signature); every other
    shape is then recomputed (frontend/tflite_shapes.py). A dynamic batch alone is taken as 1.

    Raises ModelError for an unreadable, truncated or non-TFLite file, and one
    UnsupportedOpError listing every operator mcuforge cannot compile.
    """
    buf, source, stem = _read(path_or_bytes)
    if not buf:
        raise ModelError(f"not a TFLite model: {source} is empty")
    if len(buf) < 8 or buf[4:8] != IDENTIFIER:
        raise ModelError(f"not a TFLite model: {source} (no 'TFL3' identifier at bytes 4-8, "
                         f"found {bytes(buf[4:8])!r})")
    try:
        verify_flatbuffer(buf)
    except FlatbufferError as e:
        if e.past_end:
            raise ModelError(f"truncated: {source} refers to data past its end ({len(buf)} "
                             f"bytes; {e}); the file is incomplete or corrupt") from None
        raise ModelError(f"corrupt TFLite model: {source}: {e}") from None
    try:
        graph = _Reader(buf, source, input_shapes=input_shapes).graph(name or stem)
    except UnsupportedOpError:
        raise
    except ModelError as e:  # a tensor or operator the reader rejected
        raise ModelError(f"cannot load {source}: {e}") from None
    except _Corrupt as e:
        raise ModelError(f"corrupt TFLite model: {source}: {e}") from None
    except (_Truncated, struct.error, IndexError) as e:
        raise _truncated(buf, source) from e
    except ValueError as e:  # numpy.frombuffer past the end, bad counts
        if "buffer" in str(e) or "offset" in str(e):
            raise _truncated(buf, source) from e
        raise ModelError(f"corrupt TFLite model: {source}: {e}") from e
    except Exception as e:  # anything else a malformed flatbuffer provokes in the reader
        raise ModelError(f"corrupt TFLite model: {source}: the flatbuffer is malformed "
                         f"({type(e).__name__}: {e})") from e
    try:
        return verify(graph)
    except GraphError as e:
        raise ModelError(f"invalid TFLite model {source}: {e}") from e


def _read(path_or_bytes):
    """-> (bytes, description for messages, default graph name)."""
    if isinstance(path_or_bytes, (bytes, bytearray, memoryview)):
        return bytes(path_or_bytes), "<bytes>", "model"
    path = Path(path_or_bytes)
    try:
        return path.read_bytes(), str(path), path.stem
    except FileNotFoundError:
        raise ModelError(f"model file not found: {path}") from None
    except OSError as e:
        raise ModelError(f"cannot read model file {path}: {e.strerror or e}") from None


class _Truncated(Exception):
    """The model refers to bytes past the end of the buffer."""


class _Corrupt(Exception):
    """The flatbuffer is structurally wrong (indices out of range, missing tables)."""


def _truncated(buf, source):
    return ModelError(f"truncated: {source} refers to data past its end ({len(buf)} bytes); "
                      "the file is incomplete or corrupt")


def unique_names(raw):
    """Model names made unique by suffixing repeats; empty names become tensor_<index>."""
    reserved = set(raw)
    taken, out = set(), []
    for i, n in enumerate(raw):
        base = name = n or f"tensor_{i}"
        k = 1
        while name in taken or (name != n and name in reserved):
            name = f"{base}_{k}"
            k += 1
        taken.add(name)
        out.append(name)
    return out


class _Reader:
    """One parse of a model buffer; builds tensors lazily as operators refer to them.

    A reader of subgraph `index` > 0 (made by `subgraph_graph` for a control-flow operator)
    shares its parent's model and names its tensors 'sg<index>/<name>', so names stay unique
    wherever subgraphs end up; `calls` is the chain of subgraphs being read, outermost first.
    """

    def __init__(self, buf, source, index=0, parent=None, input_shapes=None):
        self.buf, self.source = buf, source
        if parent is None:
            root = struct.unpack_from("<I", buf, 0)[0]
            if root + 4 > len(buf):
                raise _Truncated()
            self.model = tflite.Model.GetRootAs(buf, 0)
            if self._count(self.model.SubgraphsLength()) == 0:
                raise _Corrupt("the model has no subgraphs")
            self.calls = (index,)
        else:
            self.model, self.calls = parent.model, parent.calls + (index,)
        self.sg = self.model.Subgraphs(index)
        n = self._count(self.sg.TensorsLength())
        self.raw = [self.sg.Tensors(i) for i in range(n)]
        prefix = f"sg{index}/" if index else ""
        self.names = [prefix + nm for nm in unique_names([_decode(t.Name()) for t in self.raw])]
        self.index = {name: i for i, name in enumerate(self.names)}
        self.tensors = {}  # tensor index -> Tensor, built on first use
        self.extra = {}  # name -> Tensor: made by converters (intermediates, folded constants)
        self.book = VariableBook()
        self.shapes = None  # tensor index -> shape, when inputs have dynamic dimensions
        if parent is None and (input_shapes or is_dynamic(self.raw, _vector(
                self.sg.InputsAsNumpy()))):
            self._check_operand_indices()  # shape inference indexes tensors by them
            self.shapes = infer_shapes(self.model, self.sg, self.raw, self.names, input_shapes,
                                       self._stored_data)

    def _count(self, n, size=4):
        """A vector length, checked against the buffer so garbage cannot loop for long."""
        if n * size > len(self.buf):
            raise _Truncated()
        return n

    def _check_operand_indices(self) -> None:
        """Every operator's and graph input's tensor index is in range (or -1, absent)."""
        for k, j in enumerate(_vector(self.sg.InputsAsNumpy())):
            self._name(int(j), where=f"graph input {k}")
        for i in range(self._count(self.sg.OperatorsLength())):
            raw = self.sg.Operators(i)
            for k, j in enumerate(raw.InputsAsNumpy() if self._count(raw.InputsLength()) else []):
                self._name(int(j), True, f"node {i} input {k}")
            for k, j in enumerate(raw.OutputsAsNumpy() if self._count(raw.OutputsLength())
                                  else []):
                self._name(int(j), False, f"node {i} output {k}")

    def _name(self, i, optional=False, where="a tensor reference"):
        if i == -1 and optional:
            return ""
        if not 0 <= i < len(self.raw):
            raise _Corrupt(f"{where} is tensor index {i}, out of range "
                           f"({len(self.raw)} tensors)")
        return self.names[i]

    def tensor(self, name) -> Tensor:
        if name in self.extra:
            return self.extra[name]
        i = self.index[name]
        if i not in self.tensors:
            self.tensors[i] = self._tensor(self.raw[i], name, i)
        return self.tensors[i]

    def add_tensor(self, t: Tensor) -> str:
        """Register a tensor a converter made (an intermediate or a folded constant); a
        tensor of the file with the same name is replaced."""
        if t.name not in self.extra and t.name not in self.index:
            self.names.append(t.name)
        self.extra[t.name] = t
        return t.name

    def _stored_data(self, i):
        """Constant data of tensor i at its stored shape (None for activations and types
        mcuforge does not read)."""
        t = self.raw[i]
        kind = _TYPE_NAMES.get(t.Type(), t.Type())
        if kind not in _TYPES:
            return None
        shape = tuple(int(d) for d in t.ShapeAsNumpy()) if t.ShapeLength() else ()
        return self._data(t, self.names[i], shape, _TYPES[kind])

    def _tensor(self, t, name, index=None):
        where = f"tensor '{name}'"
        kind = _TYPE_NAMES.get(t.Type(), t.Type())
        if kind not in _TYPES:
            raise ModelError(f"{where} has type {kind}, which mcuforge does not support")
        if t.Sparsity() is not None:
            raise ModelError(f"{where} is sparse; sparse tensors are not supported")
        shape = tuple(int(d) for d in t.ShapeAsNumpy()) if self._count(t.ShapeLength()) else ()
        sig = ([int(d) for d in t.ShapeSignatureAsNumpy()]
               if self._count(t.ShapeSignatureLength()) else [])
        if any(d < 0 for d in shape):
            raise ModelError(f"{where} has a negative dimension in its shape {list(shape)}")
        if self.shapes is not None and index in self.shapes:
            shape, sig = self.shapes[index], []  # recomputed from the inputs' shapes
        if any(d == -1 and not (i == 0 and shape[:1] == (1,)) for i, d in enumerate(sig)):
            raise ModelError(f"{where} has a dynamic shape {sig}; only static shapes "
                             "(a batch of 1) are supported")
        dtype = _TYPES[kind]
        data = self._data(t, name, shape, dtype)
        if data is None and 0 in shape:  # converters divide by dims; the IR has no empty tensors
            raise ModelError(f"{where} has a zero dimension in its shape {list(shape)}; "
                             "tensors without elements are not supported")
        if t.IsVariable():
            tensor = Tensor(name, shape, dtype, None, _quant(t))
            self.book.variable_tensor(tensor)
            return tensor
        return Tensor(name, shape, dtype, data, _quant(t))

    def subgraph_ops(self, index: int):
        """Operators of another subgraph, read for compile-time evaluation: (code, input
        names, output names, raw operator, const(i) -> input i's data or None)."""
        if not 0 < index < self._count(self.model.SubgraphsLength()):
            raise _Corrupt(f"subgraph index {index} out of range")
        sg = self.model.Subgraphs(index)
        raw_tensors = [sg.Tensors(i) for i in range(self._count(sg.TensorsLength()))]
        names = unique_names([_decode(t.Name()) for t in raw_tensors])
        for i in range(self._count(sg.OperatorsLength())):
            raw = sg.Operators(i)
            c = self.model.OperatorCodes(raw.OpcodeIndex())
            code = _OP_NAMES.get(max(c.BuiltinCode(), c.DeprecatedBuiltinCode()), "CUSTOM")
            ins = [int(j) for j in _vector(raw.InputsAsNumpy())]
            outs = [int(j) for j in _vector(raw.OutputsAsNumpy())]

            def const(k, ins=ins):
                t = raw_tensors[ins[k]]
                kind = _TYPE_NAMES.get(t.Type(), t.Type())
                if kind not in _TYPES:
                    return None
                shape = tuple(int(d) for d in t.ShapeAsNumpy()) if t.ShapeLength() else ()
                return self._data(t, names[ins[k]], shape, _TYPES[kind])
            yield (code, [names[j] if j >= 0 else "" for j in ins], [names[j] for j in outs],
                   raw, const)

    def _data(self, t, name, shape, dtype):
        """The constant data of t as a fresh native array, or None for an activation."""
        b = t.Buffer()
        if b == 0:
            return None
        if not 0 <= b < self._count(self.model.BuffersLength()):
            raise _Corrupt(f"tensor '{name}': buffer {b} out of range")
        buffer = self.model.Buffers(b)
        if buffer.Offset() > 1:  # large models keep data after the flatbuffer
            start, size = buffer.Offset(), buffer.Size()
            if start + size > len(self.buf):
                raise _Truncated()
            raw = self.buf[start:start + size]
        elif buffer.DataLength() == 0:
            return None
        else:
            raw = buffer.DataAsNumpy().tobytes()
        item = np.dtype(dtype)
        count = int(np.prod(shape, dtype=np.int64)) if shape else 1
        if len(raw) != count * item.itemsize:
            raise ModelError(f"tensor '{name}': {len(raw)} data bytes for shape {shape} {dtype}")
        return np.frombuffer(raw, item.newbyteorder("<")).reshape(shape).astype(item)  # a copy

    def subgraph_graph(self, index: int) -> Graph:
        """Subgraph `index` converted into a verified Graph, as the model is (a control-flow
        operator's branch, condition or body). Unsupported for an operator it cannot compile,
        state (variables) in it, or subgraphs calling themselves or nested too deep."""
        if not 0 <= index < self._count(self.model.SubgraphsLength()):
            raise _Corrupt(f"subgraph index {index} out of range")
        if index in self.calls:
            raise Unsupported(f"subgraph {index} runs itself (recursion: subgraphs "
                              f"{' -> '.join(map(str, self.calls + (index,)))})")
        if len(self.calls) > MAX_NESTING:
            raise Unsupported(f"control flow nested more than {MAX_NESTING} deep")
        child = _Reader(self.buf, self.source, index, self)
        nodes, bad = child._nodes()
        if bad:
            raise Unsupported(f"subgraph {index}: " + "; ".join(bad))
        label = _decode(child.sg.Name())
        g = child._assemble(nodes, f"subgraph {index}" + (f" '{label}'" if label else ""))
        if g.state:
            raise Unsupported(f"subgraph {index} keeps state across invocations (variables); "
                              "only the main graph may")
        if any(g.tensors[t].is_const for t in g.inputs):
            raise Unsupported(f"subgraph {index} has a constant input")
        try:
            return verify(g)
        except GraphError as e:
            raise ModelError(f"subgraph {index}: {e}") from None

    def graph(self, name) -> Graph:
        nodes, bad = self._nodes()
        if bad:
            raise UnsupportedOpError(
                f"{self.source} uses {len(bad)} unsupported operator(s):\n  "
                + "\n  ".join(bad)
                + "\nsupported TFLite operators: " + ", ".join(sorted(CONVERTERS)))
        return self._assemble(nodes, name)

    def _nodes(self):
        """The subgraph's operators converted: (nodes, [what could not be, and why])."""
        codes = []
        for i in range(self._count(self.model.OperatorCodesLength())):
            c = self.model.OperatorCodes(i)
            code = max(c.BuiltinCode(), c.DeprecatedBuiltinCode())
            label = _OP_NAMES.get(code, f"BUILTIN_{code}")
            codes.append(f"CUSTOM({_decode(c.CustomCode())})" if label == "CUSTOM" else label)
        nodes, bad = [], []
        for i in range(self._count(self.sg.OperatorsLength())):
            raw = self.sg.Operators(i)
            if not 0 <= raw.OpcodeIndex() < len(codes):
                raise _Corrupt(f"node {i} has opcode index {raw.OpcodeIndex()} "
                               f"({len(codes)} opcodes)")
            code = codes[raw.OpcodeIndex()]
            ins = [self._name(int(j), True, f"node {i} ({code}) input {k}") for k, j in
                   enumerate(raw.InputsAsNumpy() if self._count(raw.InputsLength()) else [])]
            outs = [self._name(int(j), False, f"node {i} ({code}) output {k}") for k, j in
                    enumerate(raw.OutputsAsNumpy() if self._count(raw.OutputsLength()) else [])]
            if ins and not ins[0]:  # every builtin's first operand is required
                raise _Corrupt(f"node {i} ({code}) has no input 0 (tensor index -1)")
            label = f"node {i}: {code} (output '{outs[0] if outs else '?'}')"
            if code not in CONVERTERS:
                bad.append(label)
                continue
            if not outs and code not in ("ASSIGN_VARIABLE", "CALL_ONCE"):
                raise _Corrupt(f"node {i} has no outputs")
            try:
                made = CONVERTERS[code](OpContext(code, i, ins, outs, self.tensor, raw,
                                                  self.add_tensor, self))
                nodes.extend(made if isinstance(made, list) else [made])
            except Unsupported as e:
                bad.append(f"{label}: {e}")
        return nodes, bad

    def _assemble(self, nodes, name) -> Graph:
        """The Graph of the converted nodes, with the subgraph's inputs and outputs."""
        inputs = [self._name(int(j), where=f"graph input {k}")
                  for k, j in enumerate(_vector(self.sg.InputsAsNumpy()))]
        outputs = [self._name(int(j), where=f"graph output {k}")
                   for k, j in enumerate(_vector(self.sg.OutputsAsNumpy()))]
        for nm in outputs:  # an output folded to a constant (SHAPE, ...) is copied to the arena
            t = self.tensor(nm)
            if t.is_const:
                src = self.add_tensor(Tensor(f"{nm}/value", t.shape, t.dtype, t.data, t.quant))
                self.add_tensor(Tensor(nm, t.shape, t.dtype, None, t.quant))
                nodes.append(Node("broadcast_to", (src,), (nm,), {}))
        state = dict(self.book.state)
        used = set(inputs) | set(outputs) | set(state) | set(state.values())
        for n in nodes:
            used.update(t for t in n.inputs + n.outputs if t)
        tensors = {}
        order = {nm: k for k, nm in enumerate(self.names)}
        for nm in sorted(used, key=order.get):  # model order, then converter-made tensors
            tensors[nm] = self.tensor(nm)
        return Graph(tensors=tensors, nodes=nodes, inputs=inputs, outputs=outputs, name=name,
                     state=state, state_init=dict(self.book.init))


def _vector(v):
    return [] if isinstance(v, int) else v  # the reader returns 0 for an absent vector


def _decode(b):
    return b.decode("utf-8", "replace") if b else ""


def _quant(t):
    q = t.Quantization()
    if q is None or q.ScaleLength() == 0:
        return None
    scale = tuple(float(s) for s in q.ScaleAsNumpy())
    zp = (tuple(int(z) for z in q.ZeroPointAsNumpy()) if q.ZeroPointLength()
          else (0,) * len(scale))
    axis = int(q.QuantizedDimension())
    shape = _vector(t.ShapeAsNumpy())
    if len(scale) > 1 and len(shape) == 1 and shape[0] == len(scale) and axis != 0:
        # older converters (person_detect) copied the weights' channel axis, 3, onto the
        # per-channel bias; a 1-D tensor's scales can only run along its one axis, and TFLM
        # reads them by channel index
        axis = 0
    return Quant(scale=scale, zero_point=zp, axis=axis)
