"""Write a Graph as a TFLite flatbuffer (schema version 3, file identifier "TFL3").

The inverse of frontend/tflite.py. mcuforge uses it to build its own test and demo models, so
that conformance against TensorFlow Lite for Microcontrollers needs no downloaded files.

Only what the graph IR can express is written: one subgraph, builtin operators, affine
quantization. The output is deterministic: the same graph gives the same bytes.
"""
from __future__ import annotations

import flatbuffers
import numpy as np
import tflite
from tflite.ActivationFunctionType import ActivationFunctionType as Act
from tflite.BuiltinOperator import BuiltinOperator as Op
from tflite.BuiltinOptions import BuiltinOptions as Opt
from tflite.Padding import Padding
from tflite.TensorType import TensorType

from mcuforge.graph import Graph, Tensor, Quant, verify

SCHEMA_VERSION = 3
BUFFER_ALIGN = 16  # weights and biases are read in place, so keep them aligned

TENSOR_TYPES = {
    "float32": TensorType.FLOAT32, "int32": TensorType.INT32, "uint8": TensorType.UINT8,
    "int64": TensorType.INT64, "bool": TensorType.BOOL, "int16": TensorType.INT16,
    "int8": TensorType.INT8,
}
ACTIVATIONS = {"none": Act.NONE, "relu": Act.RELU, "relu6": Act.RELU6,
               "relu_n1_to_1": Act.RELU_N1_TO_1}
SIMPLE_OPS = {  # ops with no builtin options
    "logistic": Op.LOGISTIC, "tanh": Op.TANH, "relu": Op.RELU, "relu6": Op.RELU6,
    "hard_swish": Op.HARD_SWISH, "quantize": Op.QUANTIZE, "dequantize": Op.DEQUANTIZE,
}


def write_tflite(graph: Graph) -> bytes:
    """Serialize `graph` as a .tflite flatbuffer; raise ValueError if TFLite cannot express it."""
    verify(graph)
    plan = _Plan(graph)
    for node in graph.nodes:
        plan.add_node(node)
    return _serialize(graph, plan)


# ----------------------------------------------------------------------------------------------
# Planning: decide tensor indices, operator codes and options before touching the builder,
# because a flatbuffer is written leaves first.


class _Plan:
    def __init__(self, graph: Graph):
        self.graph = graph
        self.index = {}  # tensor name -> index in the subgraph's tensor list
        self.tensors = []  # Tensor objects in index order
        self.opcodes = []  # builtin codes in first-use order
        self.ops = []  # (opcode index, input indices, output indices, options type, options fn)
        used = set(graph.inputs) | set(graph.outputs)
        for n in graph.nodes:
            used.update(t for t in self._data_inputs(n) if t)
            used.update(n.outputs)
        for name, t in graph.tensors.items():  # graph order keeps the output deterministic
            if name in used:
                self._add_tensor(t)

    def _add_tensor(self, t: Tensor) -> int:
        self.index[t.name] = len(self.tensors)
        self.tensors.append(t)
        return self.index[t.name]

    def _const(self, base: str, data: np.ndarray, dtype="int32", quant=None) -> int:
        name = base
        while name in self.graph.tensors or name in self.index:
            name += "_"
        return self._add_tensor(Tensor(name, tuple(data.shape), dtype, data=data, quant=quant))

    def _zero_bias(self, n, x: Tensor, w: Tensor) -> int:
        """A zero bias for a conv without one: TFLite's int8 CONV_2D requires a bias, TFLM's
        depthwise conv crashes on a -1 bias index and XNNPACK on a 2-input depthwise conv."""
        channels = w.shape[0] if n.op == "conv2d" else w.shape[3]
        if x.quant is None:
            return self._const(n.outputs[0] + "/bias", np.zeros(channels, np.float32), "float32")
        dtype = "int64" if x.dtype == "int16" else "int32"
        scale = np.float32(x.quant.scale[0]) * np.asarray(w.quant.scale, dtype=np.float32)
        quant = Quant(tuple(float(v) for v in scale), (0,) * len(scale), 0)
        return self._const(n.outputs[0] + "/bias", np.zeros(channels, dtype), dtype, quant)

    def _opcode(self, code: int) -> int:
        if code not in self.opcodes:
            self.opcodes.append(code)
        return self.opcodes.index(code)

    def _idx(self, names) -> list:
        idx = [self.index[t] if t else -1 for t in names]  # -1 marks an absent optional input
        while idx and idx[-1] == -1:
            idx.pop()  # absent trailing inputs are left out rather than written as -1
        return idx

    def _data_inputs(self, n) -> tuple:
        """Inputs that carry data; shape/paddings/axes inputs are rebuilt from the attributes."""
        if n.op in ("reshape", "mean"):
            return n.inputs[:1]
        if n.op == "pad":
            return (n.inputs[0],) + tuple(t for t in n.inputs[2:3] if t)
        return n.inputs

    def add_node(self, n):
        g, a = self.graph, n.attrs
        ins, outs = self._idx(self._data_inputs(n)), self._idx(n.outputs)
        out = g.tensors[n.outputs[0]]
        act = ACTIVATIONS[a.get("activation", "none")]
        if n.op in SIMPLE_OPS:
            return self._emit(SIMPLE_OPS[n.op], ins, outs)
        if n.op in ("conv2d", "depthwise_conv2d"):
            x, w = g.tensors[n.inputs[0]], g.tensors[n.inputs[1]]
            pad = _padding_mode(a["padding"], x.shape[1:3], w.shape[1:3], a["stride"],
                                a["dilation"], out.shape[1:3], n)
            if len(ins) < 3:
                ins.append(self._zero_bias(n, x, w))
            if n.op == "conv2d":
                return self._emit(Op.CONV_2D, ins, outs, Opt.Conv2DOptions, lambda b: _conv_opts(
                    b, pad, a["stride"], a["dilation"], act))
            return self._emit(Op.DEPTHWISE_CONV_2D, ins, outs, Opt.DepthwiseConv2DOptions,
                              lambda b: _dw_opts(b, pad, a["stride"], a["dilation"], act,
                                                 a["depth_multiplier"]))
        if n.op in ("avg_pool2d", "max_pool2d"):
            x = g.tensors[n.inputs[0]]
            pad = _padding_mode(a["padding"], x.shape[1:3], a["filter"], a["stride"], (1, 1),
                                out.shape[1:3], n)
            code = Op.AVERAGE_POOL_2D if n.op == "avg_pool2d" else Op.MAX_POOL_2D
            return self._emit(code, ins, outs, Opt.Pool2DOptions,
                              lambda b: _pool_opts(b, pad, a["stride"], a["filter"], act))
        if n.op == "fully_connected":
            rank_in = len(g.tensors[n.inputs[0]].shape)
            keep = len(out.shape) == rank_in and rank_in != 2  # else the input is flattened
            return self._emit(Op.FULLY_CONNECTED, ins, outs, Opt.FullyConnectedOptions,
                              lambda b: _fc_opts(b, act, keep))
        if n.op in ("add", "mul"):
            if n.op == "add":
                return self._emit(Op.ADD, ins, outs, Opt.AddOptions, lambda b: _act_opts(
                    b, tflite.AddOptionsStart, tflite.AddOptionsAddFusedActivationFunction,
                    tflite.AddOptionsEnd, act))
            return self._emit(Op.MUL, ins, outs, Opt.MulOptions, lambda b: _act_opts(
                b, tflite.MulOptionsStart, tflite.MulOptionsAddFusedActivationFunction,
                tflite.MulOptionsEnd, act))
        if n.op == "reshape":
            shape = np.array(out.shape, dtype=np.int32)
            ins = [ins[0], self._const(n.outputs[0] + "/shape", shape)]
            return self._emit(Op.RESHAPE, ins, outs, Opt.ReshapeOptions,
                              lambda b: _reshape_opts(b, shape))
        if n.op == "softmax":
            return self._emit(Op.SOFTMAX, ins, outs, Opt.SoftmaxOptions,
                              lambda b: _scalar_opts(b, tflite.SoftmaxOptionsStart,
                                                     tflite.SoftmaxOptionsAddBeta,
                                                     tflite.SoftmaxOptionsEnd, a["beta"]))
        if n.op == "concat":
            return self._emit(Op.CONCATENATION, ins, outs, Opt.ConcatenationOptions,
                              lambda b: _concat_opts(b, a["axis"], act))
        if n.op == "pad":
            pads = np.array(a["pads"], dtype=np.int32).reshape(-1, 2)
            new = [ins[0], self._const(n.outputs[0] + "/paddings", pads)]
            if len(ins) > 1:  # an explicit pad value needs PADV2
                return self._emit(Op.PADV2, new + [ins[1]], outs)
            return self._emit(Op.PAD, new, outs)
        if n.op == "mean":
            axes = np.array(a["axes"], dtype=np.int32).reshape(-1)
            ins = [ins[0], self._const(n.outputs[0] + "/axes", axes)]
            return self._emit(Op.MEAN, ins, outs, Opt.ReducerOptions,
                              lambda b: _scalar_opts(b, tflite.ReducerOptionsStart,
                                                     tflite.ReducerOptionsAddKeepDims,
                                                     tflite.ReducerOptionsEnd,
                                                     bool(a["keep_dims"])))
        if n.op == "leaky_relu":
            return self._emit(Op.LEAKY_RELU, ins, outs, Opt.LeakyReluOptions,
                              lambda b: _scalar_opts(b, tflite.LeakyReluOptionsStart,
                                                     tflite.LeakyReluOptionsAddAlpha,
                                                     tflite.LeakyReluOptionsEnd, a["alpha"]))
        raise ValueError(f"tflite writer: op '{n.op}' has no TFLite mapping")

    def _emit(self, code, ins, outs, opt_type=Opt.NONE, opt_fn=None):
        self.ops.append((self._opcode(code), ins, outs, opt_type, opt_fn))


def _padding_mode(pads, in_hw, filt_hw, stride, dilation, out_hw, node) -> int:
    """The TFLite padding enum whose resolved pads equal the explicit `pads` (t, b, l, r)."""
    eff = [(f - 1) * d + 1 for f, d in zip(filt_hw, dilation)]
    valid_out = [(i - e) // s + 1 for i, e, s in zip(in_hw, eff, stride)]
    if tuple(pads) == (0, 0, 0, 0) and list(out_hw) == valid_out:
        return Padding.VALID
    same_out = [-(-i // s) for i, s in zip(in_hw, stride)]
    same_pads = []
    for i, e, s, o in zip(in_hw, eff, stride, same_out):
        total = max((o - 1) * s + e - i, 0)
        same_pads += [total // 2, total - total // 2]
    if list(out_hw) == same_out and tuple(same_pads) == tuple(pads):
        return Padding.SAME
    raise ValueError(f"tflite writer: {node.op} '{node.name or node.outputs[0]}' has padding "
                     f"{tuple(pads)} that is neither SAME {tuple(same_pads)} nor VALID; "
                     "insert an explicit pad op")


# ----------------------------------------------------------------------------------------------
# Builtin options tables. Each takes the builder and returns the table offset.


def _conv_opts(b, pad, stride, dilation, act):
    tflite.Conv2DOptionsStart(b)
    tflite.Conv2DOptionsAddPadding(b, pad)
    tflite.Conv2DOptionsAddStrideH(b, stride[0])
    tflite.Conv2DOptionsAddStrideW(b, stride[1])
    tflite.Conv2DOptionsAddDilationHFactor(b, dilation[0])
    tflite.Conv2DOptionsAddDilationWFactor(b, dilation[1])
    tflite.Conv2DOptionsAddFusedActivationFunction(b, act)
    return tflite.Conv2DOptionsEnd(b)


def _dw_opts(b, pad, stride, dilation, act, multiplier):
    tflite.DepthwiseConv2DOptionsStart(b)
    tflite.DepthwiseConv2DOptionsAddPadding(b, pad)
    tflite.DepthwiseConv2DOptionsAddStrideH(b, stride[0])
    tflite.DepthwiseConv2DOptionsAddStrideW(b, stride[1])
    tflite.DepthwiseConv2DOptionsAddDilationHFactor(b, dilation[0])
    tflite.DepthwiseConv2DOptionsAddDilationWFactor(b, dilation[1])
    tflite.DepthwiseConv2DOptionsAddDepthMultiplier(b, multiplier)
    tflite.DepthwiseConv2DOptionsAddFusedActivationFunction(b, act)
    return tflite.DepthwiseConv2DOptionsEnd(b)


def _pool_opts(b, pad, stride, filt, act):
    tflite.Pool2DOptionsStart(b)
    tflite.Pool2DOptionsAddPadding(b, pad)
    tflite.Pool2DOptionsAddStrideH(b, stride[0])
    tflite.Pool2DOptionsAddStrideW(b, stride[1])
    tflite.Pool2DOptionsAddFilterHeight(b, filt[0])
    tflite.Pool2DOptionsAddFilterWidth(b, filt[1])
    tflite.Pool2DOptionsAddFusedActivationFunction(b, act)
    return tflite.Pool2DOptionsEnd(b)


def _fc_opts(b, act, keep_num_dims):
    tflite.FullyConnectedOptionsStart(b)
    tflite.FullyConnectedOptionsAddFusedActivationFunction(b, act)
    tflite.FullyConnectedOptionsAddKeepNumDims(b, keep_num_dims)
    return tflite.FullyConnectedOptionsEnd(b)


def _concat_opts(b, axis, act):
    tflite.ConcatenationOptionsStart(b)
    tflite.ConcatenationOptionsAddAxis(b, axis)
    tflite.ConcatenationOptionsAddFusedActivationFunction(b, act)
    return tflite.ConcatenationOptionsEnd(b)


def _reshape_opts(b, shape):
    vec = b.CreateNumpyVector(shape)
    tflite.ReshapeOptionsStart(b)
    tflite.ReshapeOptionsAddNewShape(b, vec)
    return tflite.ReshapeOptionsEnd(b)


def _act_opts(b, start, add_act, end, act):
    start(b)
    add_act(b, act)
    return end(b)


def _scalar_opts(b, start, add, end, value):
    start(b)
    add(b, value)
    return end(b)


# ----------------------------------------------------------------------------------------------
# Serialization.


def _serialize(graph: Graph, plan: _Plan) -> bytes:
    b = flatbuffers.Builder(1024)
    buffers = [b""]  # buffer 0 is the empty sentinel that non-constant tensors point to
    tensor_offs = []
    for t in plan.tensors:
        buf = 0
        if t.is_const:
            buf = len(buffers)
            buffers.append(np.ascontiguousarray(t.data, dtype=np.dtype(t.dtype).newbyteorder("<"))
                           .tobytes())
        tensor_offs.append(_tensor(b, t, buf))
    op_offs = [_operator(b, *op) for op in plan.ops]

    name = b.CreateString(graph.name)
    sg_tensors = _table_vector(b, tflite.SubGraphStartTensorsVector, tensor_offs)
    sg_inputs = _i32(b, [plan.index[t] for t in graph.inputs])
    sg_outputs = _i32(b, [plan.index[t] for t in graph.outputs])
    sg_ops = _table_vector(b, tflite.SubGraphStartOperatorsVector, op_offs)
    tflite.SubGraphStart(b)
    tflite.SubGraphAddTensors(b, sg_tensors)
    tflite.SubGraphAddInputs(b, sg_inputs)
    tflite.SubGraphAddOutputs(b, sg_outputs)
    tflite.SubGraphAddOperators(b, sg_ops)
    tflite.SubGraphAddName(b, name)
    subgraph = tflite.SubGraphEnd(b)

    code_offs = []
    for code in plan.opcodes:
        tflite.OperatorCodeStart(b)
        tflite.OperatorCodeAddDeprecatedBuiltinCode(b, min(code, 127))  # pre-2.4 readers
        tflite.OperatorCodeAddBuiltinCode(b, code)
        tflite.OperatorCodeAddVersion(b, 1)
        code_offs.append(tflite.OperatorCodeEnd(b))

    buffer_offs = [_buffer(b, data) for data in buffers]
    description = b.CreateString("mcuforge")
    codes = _table_vector(b, tflite.ModelStartOperatorCodesVector, code_offs)
    subgraphs = _table_vector(b, tflite.ModelStartSubgraphsVector, [subgraph])
    bufs = _table_vector(b, tflite.ModelStartBuffersVector, buffer_offs)
    tflite.ModelStart(b)
    tflite.ModelAddVersion(b, SCHEMA_VERSION)
    tflite.ModelAddOperatorCodes(b, codes)
    tflite.ModelAddSubgraphs(b, subgraphs)
    tflite.ModelAddDescription(b, description)
    tflite.ModelAddBuffers(b, bufs)
    b.Finish(tflite.ModelEnd(b), file_identifier=b"TFL3")
    return bytes(b.Output())


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


def _tensor(b, t: Tensor, buffer: int):
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
    return tflite.TensorEnd(b)


def _operator(b, opcode, ins, outs, opt_type, opt_fn):
    options = opt_fn(b) if opt_fn is not None else None
    in_vec, out_vec = _i32(b, ins), _i32(b, outs)
    tflite.OperatorStart(b)
    tflite.OperatorAddOpcodeIndex(b, opcode)
    tflite.OperatorAddInputs(b, in_vec)
    tflite.OperatorAddOutputs(b, out_vec)
    if options is not None:
        tflite.OperatorAddBuiltinOptionsType(b, opt_type)
        tflite.OperatorAddBuiltinOptions(b, options)
    return tflite.OperatorEnd(b)
