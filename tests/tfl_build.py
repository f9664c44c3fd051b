"""A small TFLite model builder for tests, written straight onto the `tflite` package's generated
flatbuffer builders (TensorStart, OperatorAddInputs, Conv2DOptionsAddStrideH, ...), so it shares
no code with mcuforge's own writer (frontend/tflite_flatbuffer.py): a bug in that writer cannot
hide behind the same bug here. Also runs models in LiteRT.

    m = Model()
    x = m.tensor("x", (1, 4), "float32", sig=(-1, 4))
    w = m.tensor("w", (4,), "int8", data=..., scale=0.1, zero_point=3)
    m.op("ADD", [x, w], [y], "AddOptions", FusedActivationFunction=0)
    m.io([x], [y]); model_bytes = m.build()

Option fields are named as in the generated API (`StrideH` -> tflite.Conv2DOptionsAddStrideH).
"""
from __future__ import annotations

import flatbuffers
import numpy as np
import tflite

TYPES = {"float32": tflite.TensorType.FLOAT32, "int32": tflite.TensorType.INT32,
         "uint8": tflite.TensorType.UINT8, "int64": tflite.TensorType.INT64,
         "int16": tflite.TensorType.INT16, "int8": tflite.TensorType.INT8,
         "bool": tflite.TensorType.BOOL}


class Model:
    def __init__(self):
        self.tensors, self.ops, self.codes = [], [], []
        self.inputs, self.outputs = [], []

    def tensor(self, name, shape, dtype, data=None, scale=None, zero_point=None, sig=None,
               axis=0, variable=False):
        """Add a tensor; returns its index. scale/zero_point: a number or a per-axis list;
        `variable`: a state tensor (SVDF's memory, the LSTM's hidden and cell state)."""
        if data is not None:
            data = np.ascontiguousarray(np.asarray(data, dtype).reshape(shape))
        self.tensors.append(dict(name=name, shape=tuple(shape), dtype=dtype, data=data,
                                 scale=scale, zp=zero_point, sig=sig, axis=axis,
                                 variable=variable))
        return len(self.tensors) - 1

    def const(self, name, data, dtype=None, **quant):
        data = np.asarray(data, dtype)
        return self.tensor(name, data.shape, str(data.dtype), data, **quant)

    def op(self, code, ins, outs, options=None, version=1, **fields):
        """A builtin op; `options` names the options table ("Conv2DOptions"), `fields` its
        fields by their generated names."""
        c = (getattr(tflite.BuiltinOperator, code), version)
        if c not in self.codes:
            self.codes.append(c)
        self.ops.append(dict(code=self.codes.index(c), ins=list(ins), outs=list(outs),
                             options=options, fields=fields))

    def io(self, inputs, outputs):
        self.inputs, self.outputs = list(inputs), list(outputs)

    def build(self) -> bytes:
        b = flatbuffers.Builder(1024)
        # buffers: 0 is the empty one, then one per constant tensor
        buf_data = [None] + [t["data"] for t in self.tensors if t["data"] is not None]
        buf_offsets = []
        for data in buf_data:
            vec = None
            if data is not None:
                raw = data.astype(data.dtype.newbyteorder("<")).tobytes()
                b.StartVector(1, len(raw), 16)
                for byte in reversed(raw):
                    b.PrependByte(byte)
                vec = b.EndVector()
            tflite.BufferStart(b)
            if vec is not None:
                tflite.BufferAddData(b, vec)
            buf_offsets.append(tflite.BufferEnd(b))
        tensors, k = [], 0
        for t in self.tensors:
            buffer = 0
            if t["data"] is not None:
                k += 1
                buffer = k
            tensors.append(self._tensor(b, t, buffer))
        ops = [self._op(b, o) for o in self.ops]
        t_vec = _offsets(b, tflite.SubGraphStartTensorsVector, tensors)
        o_vec = _offsets(b, tflite.SubGraphStartOperatorsVector, ops)
        in_vec = _ints(b, tflite.SubGraphStartInputsVector, self.inputs)
        out_vec = _ints(b, tflite.SubGraphStartOutputsVector, self.outputs)
        name = b.CreateString("main")
        tflite.SubGraphStart(b)
        tflite.SubGraphAddTensors(b, t_vec)
        tflite.SubGraphAddOperators(b, o_vec)
        tflite.SubGraphAddInputs(b, in_vec)
        tflite.SubGraphAddOutputs(b, out_vec)
        tflite.SubGraphAddName(b, name)
        sg = tflite.SubGraphEnd(b)
        codes = []
        for c, version in self.codes:
            tflite.OperatorCodeStart(b)
            tflite.OperatorCodeAddBuiltinCode(b, c)
            tflite.OperatorCodeAddDeprecatedBuiltinCode(b, min(c, 127))
            tflite.OperatorCodeAddVersion(b, version)
            codes.append(tflite.OperatorCodeEnd(b))
        codes_vec = _offsets(b, tflite.ModelStartOperatorCodesVector, codes)
        sgs_vec = _offsets(b, tflite.ModelStartSubgraphsVector, [sg])
        bufs_vec = _offsets(b, tflite.ModelStartBuffersVector, buf_offsets)
        desc = b.CreateString("tests/tfl_build.py")
        tflite.ModelStart(b)
        tflite.ModelAddVersion(b, 3)
        tflite.ModelAddOperatorCodes(b, codes_vec)
        tflite.ModelAddSubgraphs(b, sgs_vec)
        tflite.ModelAddDescription(b, desc)
        tflite.ModelAddBuffers(b, bufs_vec)
        b.Finish(tflite.ModelEnd(b), file_identifier=b"TFL3")
        return bytes(b.Output())

    def _tensor(self, b, t, buffer):
        name = b.CreateString(t["name"])
        shape = _ints(b, tflite.TensorStartShapeVector, t["shape"])
        sig = (_ints(b, tflite.TensorStartShapeSignatureVector, t["sig"])
               if t["sig"] is not None else None)
        quant = None
        if t["scale"] is not None:
            scales = np.atleast_1d(np.asarray(t["scale"], np.float32))
            zps = np.atleast_1d(np.asarray(0 if t["zp"] is None else t["zp"], np.int64))
            zps = np.broadcast_to(zps, scales.shape)
            tflite.QuantizationParametersStartScaleVector(b, len(scales))
            for s in reversed(scales):
                b.PrependFloat32(float(s))
            s_vec = b.EndVector()
            tflite.QuantizationParametersStartZeroPointVector(b, len(zps))
            for z in reversed(zps):
                b.PrependInt64(int(z))
            z_vec = b.EndVector()
            tflite.QuantizationParametersStart(b)
            tflite.QuantizationParametersAddScale(b, s_vec)
            tflite.QuantizationParametersAddZeroPoint(b, z_vec)
            tflite.QuantizationParametersAddQuantizedDimension(b, t["axis"])
            quant = tflite.QuantizationParametersEnd(b)
        tflite.TensorStart(b)
        tflite.TensorAddShape(b, shape)
        if sig is not None:
            tflite.TensorAddShapeSignature(b, sig)
        tflite.TensorAddType(b, TYPES[t["dtype"]])
        tflite.TensorAddBuffer(b, buffer)
        tflite.TensorAddName(b, name)
        if quant is not None:
            tflite.TensorAddQuantization(b, quant)
        if t["variable"]:
            tflite.TensorAddIsVariable(b, True)
        return tflite.TensorEnd(b)

    def _op(self, b, o):
        opts = None
        if o["options"]:
            kind = o["options"]
            getattr(tflite, kind + "Start")(b)
            for field, value in o["fields"].items():
                getattr(tflite, f"{kind}Add{field}")(b, value)
            opts = getattr(tflite, kind + "End")(b)
        ins = _ints(b, tflite.OperatorStartInputsVector, o["ins"])
        outs = _ints(b, tflite.OperatorStartOutputsVector, o["outs"])
        tflite.OperatorStart(b)
        tflite.OperatorAddOpcodeIndex(b, o["code"])
        tflite.OperatorAddInputs(b, ins)
        tflite.OperatorAddOutputs(b, outs)
        if opts is not None:
            tflite.OperatorAddBuiltinOptionsType(b, getattr(tflite.BuiltinOptions, o["options"]))
            tflite.OperatorAddBuiltinOptions(b, opts)
        return tflite.OperatorEnd(b)


def _ints(b, start, values):
    values = [int(v) for v in values]
    start(b, len(values))
    for v in reversed(values):
        b.PrependInt32(v)
    return b.EndVector()


def _offsets(b, start, offsets):
    start(b, len(offsets))
    for o in reversed(offsets):
        b.PrependUOffsetTRelative(o)
    return b.EndVector()


def litert(model: bytes, inputs, reference=True, input_shapes=None):
    """Run the model in LiteRT (its reference kernels by default); inputs in model order,
    outputs as a list. input_shapes resizes inputs first (dynamic shapes)."""
    from ai_edge_litert.interpreter import Interpreter, OpResolverType
    kind = OpResolverType.BUILTIN_REF if reference else OpResolverType.AUTO
    it = Interpreter(model_content=model, experimental_op_resolver_type=kind)
    details = it.get_input_details()
    for d, x in zip(details, inputs):
        if tuple(d["shape"]) != np.shape(x):
            it.resize_tensor_input(d["index"], list(np.shape(x)))
    it.allocate_tensors()
    for d, x in zip(details, inputs):
        it.set_tensor(d["index"], np.asarray(x, d["dtype"]))
    it.invoke()
    return [it.get_tensor(d["index"]) for d in it.get_output_details()]
