"""Serialize TFLite models from plain descriptions: tensors, builtin operators with their options
as dictionaries, one or more subgraphs.

This is the layer under `tflite_writer` (which maps mcuforge's graph IR onto it) and the way the
TFLite conformance cases spell single-operator models: `TflOp("STRIDED_SLICE", ins, outs,
{"begin_mask": 1, "shrink_axis_mask": 2})`. Options are written by name through the `tflite`
package's generated builders (`StridedSliceOptionsAddBeginMask`), so every builtin option of the
schema is reachable without a hand-written table per operator.

Guarantees: deterministic bytes for the same description; constant buffers 16-byte aligned
(kernels read weights in place); a ValueError naming the operator and field for an unknown
operator, options table or option field.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import flatbuffers
import numpy as np
import tflite
from tflite.BuiltinOperator import BuiltinOperator
from tflite.BuiltinOptions import BuiltinOptions
from tflite.TensorType import TensorType

from mcuforge.ir.graph import Quant

SCHEMA_VERSION = 3
BUFFER_ALIGN = 16
TENSOR_TYPES = {
    "float32": TensorType.FLOAT32, "int32": TensorType.INT32, "uint8": TensorType.UINT8,
    "int64": TensorType.INT64, "bool": TensorType.BOOL, "int16": TensorType.INT16,
    "int8": TensorType.INT8, "resource": TensorType.RESOURCE,
}
# Operators whose options table is not named after them
OPTIONS_TYPE = {
    "AVERAGE_POOL_2D": "Pool2DOptions", "MAX_POOL_2D": "Pool2DOptions",
    "L2_POOL_2D": "Pool2DOptions", "MEAN": "ReducerOptions", "SUM": "ReducerOptions",
    "REDUCE_MAX": "ReducerOptions", "REDUCE_MIN": "ReducerOptions",
    "REDUCE_PROD": "ReducerOptions", "REDUCE_ALL": "ReducerOptions",
    "REDUCE_ANY": "ReducerOptions", "L2_NORMALIZATION": "L2NormOptions",
    "MAXIMUM": "MaximumMinimumOptions", "MINIMUM": "MaximumMinimumOptions",
    "LOCAL_RESPONSE_NORMALIZATION": "LocalResponseNormalizationOptions",
    "CONCAT_EMBEDDINGS": "ConcatEmbeddingsOptions",
}
# String values accepted for enum-typed options (ints are accepted everywhere)
ENUMS = {
    "padding": {"SAME": 0, "VALID": 1},
    "fused_activation_function": {"NONE": 0, "RELU": 1, "RELU_N1_TO_1": 2, "RELU6": 3,
                                  "TANH": 4, "SIGN_BIT": 5},
    "mode": {"REFLECT": 0, "SYMMETRIC": 1},
}
_OPTION_NAMES = {k.lower(): k for k in vars(BuiltinOptions) if not k.startswith("_")}


@dataclass
class TflTensor:
    name: str
    shape: tuple
    dtype: str
    data: Optional[np.ndarray] = None  # constant contents
    quant: Optional[Quant] = None
    variable: bool = False  # TFLite's is_variable: state the interpreter keeps between calls


@dataclass
class TflOp:
    op: str  # builtin operator name, as in tflite.BuiltinOperator: "CONV_2D"
    inputs: tuple  # tensor names; "" for an absent optional input (index -1)
    outputs: tuple
    options: dict = field(default_factory=dict)  # snake_case field -> value
    options_type: Optional[str] = None  # default: OPTIONS_TYPE or "<CamelCaseOp>Options"
    version: int = 1


@dataclass
class TflSubgraph:
    tensors: list  # [TflTensor] in index order
    ops: list  # [TflOp]
    inputs: list  # tensor names
    outputs: list
    name: str = "main"


def builtin_code(op: str) -> int:
    code = getattr(BuiltinOperator, op, None)
    if code is None:
        raise ValueError(f"tflite writer: unknown builtin operator {op}")
    return code


def options_type(op: TflOp) -> Optional[str]:
    """The options table name of `op`, or None when the schema has none for it."""
    if op.options_type is not None:
        return op.options_type
    if op.op in OPTIONS_TYPE:
        return OPTIONS_TYPE[op.op]
    guess = _OPTION_NAMES.get(op.op.replace("_", "").lower() + "options")
    if guess is None and op.options:
        raise ValueError(f"tflite writer: {op.op} has options {sorted(op.options)} but no "
                         "options table is known for it; pass options_type")
    return guess


def write_model(subgraphs: list, description: str = "mcuforge") -> bytes:
    """Serialize the subgraphs (the first is the entry point) as a .tflite flatbuffer."""
    b = flatbuffers.Builder(1024)
    buffers = [b""]  # buffer 0: the empty buffer every non-constant tensor points to
    opcodes = []  # (builtin code, version) in first-use order
    sg_offs = []
    for sg in subgraphs:
        sg_offs.append(_subgraph(b, sg, buffers, opcodes))
    code_offs = []
    for code, version in opcodes:
        tflite.OperatorCodeStart(b)
        tflite.OperatorCodeAddDeprecatedBuiltinCode(b, min(code, 127))  # pre-2.4 readers
        tflite.OperatorCodeAddBuiltinCode(b, code)
        tflite.OperatorCodeAddVersion(b, version)
        code_offs.append(tflite.OperatorCodeEnd(b))
    buffer_offs = [_buffer(b, data) for data in buffers]
    desc = b.CreateString(description)
    codes = _table_vector(b, tflite.ModelStartOperatorCodesVector, code_offs)
    sgs = _table_vector(b, tflite.ModelStartSubgraphsVector, sg_offs)
    bufs = _table_vector(b, tflite.ModelStartBuffersVector, buffer_offs)
    tflite.ModelStart(b)
    tflite.ModelAddVersion(b, SCHEMA_VERSION)
    tflite.ModelAddOperatorCodes(b, codes)
    tflite.ModelAddSubgraphs(b, sgs)
    tflite.ModelAddDescription(b, desc)
    tflite.ModelAddBuffers(b, bufs)
    b.Finish(tflite.ModelEnd(b), file_identifier=b"TFL3")
    return bytes(b.Output())


def _subgraph(b, sg: TflSubgraph, buffers: list, opcodes: list) -> int:
    index = {}
    for t in sg.tensors:
        if t.name in index:
            raise ValueError(f"tflite writer: subgraph {sg.name}: tensor {t.name} twice")
        index[t.name] = len(index)
    tensor_offs = []
    for t in sg.tensors:
        buf = 0
        if t.data is not None:
            buf = len(buffers)
            raw = np.ascontiguousarray(t.data, dtype=np.dtype(t.dtype).newbyteorder("<"))
            buffers.append(raw.tobytes())
        tensor_offs.append(_tensor(b, t, buf))
    op_offs = []
    for op in sg.ops:
        key = (builtin_code(op.op), op.version)
        if key not in opcodes:
            opcodes.append(key)
        op_offs.append(_operator(b, op, opcodes.index(key), index, sg.name))
    name = b.CreateString(sg.name)
    tensors = _table_vector(b, tflite.SubGraphStartTensorsVector, tensor_offs)
    ins = _i32(b, [_lookup(index, t, sg.name) for t in sg.inputs])
    outs = _i32(b, [_lookup(index, t, sg.name) for t in sg.outputs])
    ops = _table_vector(b, tflite.SubGraphStartOperatorsVector, op_offs)
    tflite.SubGraphStart(b)
    tflite.SubGraphAddTensors(b, tensors)
    tflite.SubGraphAddInputs(b, ins)
    tflite.SubGraphAddOutputs(b, outs)
    tflite.SubGraphAddOperators(b, ops)
    tflite.SubGraphAddName(b, name)
    return tflite.SubGraphEnd(b)


def _lookup(index: dict, name: str, where: str) -> int:
    if not name:
        return -1
    if name not in index:
        raise ValueError(f"tflite writer: subgraph {where}: no tensor named {name}")
    return index[name]


def _operator(b, op: TflOp, opcode: int, index: dict, where: str) -> int:
    kind = options_type(op)
    options = _options(b, op, kind) if kind is not None else None
    ins = [_lookup(index, t, where) for t in op.inputs]
    outs = [_lookup(index, t, where) for t in op.outputs]
    in_vec, out_vec = _i32(b, ins), _i32(b, outs)
    tflite.OperatorStart(b)
    tflite.OperatorAddOpcodeIndex(b, opcode)
    tflite.OperatorAddInputs(b, in_vec)
    tflite.OperatorAddOutputs(b, out_vec)
    if options is not None:
        tflite.OperatorAddBuiltinOptionsType(b, getattr(BuiltinOptions, kind))
        tflite.OperatorAddBuiltinOptions(b, options)
    return tflite.OperatorEnd(b)


def _camel(name: str) -> str:
    return "".join(p[:1].upper() + p[1:] for p in name.split("_"))


def _options(b, op: TflOp, kind: str) -> int:
    """The options table: vectors and strings first (a flatbuffer is built leaves first), then
    the table with each field through its generated `<Kind>Add<Field>` function."""
    if not hasattr(BuiltinOptions, kind):
        raise ValueError(f"tflite writer: {op.op}: unknown options table {kind}")
    values = {}
    for key, value in sorted(op.options.items()):
        if isinstance(value, str) and key in ENUMS:
            value = ENUMS[key][value]
        elif isinstance(value, str):
            value = b.CreateString(value)
        elif isinstance(value, (list, tuple, np.ndarray)):
            value = b.CreateNumpyVector(np.asarray(value, dtype=np.int32).reshape(-1))
        values[key] = value
    getattr(tflite, f"{kind}Start")(b)
    for key, value in values.items():
        add = getattr(tflite, f"{kind}Add{_camel(key)}", None)
        if add is None:
            raise ValueError(f"tflite writer: {op.op}: {kind} has no field {key}")
        add(b, value)
    return getattr(tflite, f"{kind}End")(b)


def _i32(b, values):
    return b.CreateNumpyVector(np.asarray(values, dtype=np.int32).reshape(-1))


def _table_vector(b, start, offsets):
    start(b, len(offsets))
    for off in reversed(offsets):  # flatbuffers vectors are written back to front
        b.PrependUOffsetTRelative(off)
    return b.EndVector()


def _buffer(b, data: bytes):
    if not data:
        tflite.BufferStart(b)
        return tflite.BufferEnd(b)
    b.StartVector(1, len(data), BUFFER_ALIGN)
    b.head -= len(data)
    b.Bytes[b.head:b.head + len(data)] = data
    vec = b.EndVector()
    tflite.BufferStart(b)
    tflite.BufferAddData(b, vec)
    return tflite.BufferEnd(b)


def _quant(b, q: Quant):
    scale = b.CreateNumpyVector(np.asarray(q.scale, dtype=np.float32))
    zp = b.CreateNumpyVector(np.asarray(q.zero_point, dtype=np.int64))
    tflite.QuantizationParametersStart(b)
    tflite.QuantizationParametersAddScale(b, scale)
    tflite.QuantizationParametersAddZeroPoint(b, zp)
    tflite.QuantizationParametersAddQuantizedDimension(b, q.axis if q.per_axis else 0)
    return tflite.QuantizationParametersEnd(b)


def _tensor(b, t: TflTensor, buffer: int):
    if t.dtype not in TENSOR_TYPES:
        raise ValueError(f"tflite writer: tensor '{t.name}' has dtype {t.dtype} TFLite lacks")
    name = b.CreateString(t.name)
    shape = _i32(b, list(t.shape))
    quant = _quant(b, t.quant) if t.quant is not None else None
    tflite.TensorStart(b)
    tflite.TensorAddShape(b, shape)
    tflite.TensorAddType(b, TENSOR_TYPES[t.dtype])
    tflite.TensorAddBuffer(b, buffer)
    tflite.TensorAddName(b, name)
    if quant is not None:
        tflite.TensorAddQuantization(b, quant)
    if t.variable:
        tflite.TensorAddIsVariable(b, True)
    return tflite.TensorEnd(b)
