"""frontend.tflite: the MLPerf Tiny models against independent readers, every op's attributes
on hand-built one-op models, and every way a file can fail to be a usable model."""

import flatbuffers
import numpy as np
import pytest
import tflite
from conftest import MLPERF_DIR, unavailable

from mcuforge.frontend import load_model
from mcuforge.frontend.tflite import load_tflite
from mcuforge.frontend.tflite_ops import CONVERTERS, resolve_padding
from mcuforge.ir.errors import ModelError, UnsupportedOpError
from mcuforge.ir.graph import Quant, verify

MODELS = MLPERF_DIR
OP_NAMES = {v: k for k, v in vars(tflite.BuiltinOperator).items() if not k.startswith("_")}
# TFLite op -> mcuforge op, written out independently of the frontend
EXPECTED_OP = {"CONV_2D": "conv2d", "DEPTHWISE_CONV_2D": "depthwise_conv2d",
               "FULLY_CONNECTED": "fully_connected", "ADD": "add",
               "AVERAGE_POOL_2D": "avg_pool2d", "RESHAPE": "reshape", "SOFTMAX": "softmax"}


def need(path):
    """The path of a shared model; skip when absent, fail when absent under CI."""
    if path is None or not path.exists():
        unavailable(f"MLPerf Tiny models not found in {MODELS}")
    return path


def reference_details(path, n_in, n_out):
    """Input/output details from TFLM; LiteRT for the hybrid model TFLM refuses to load."""
    try:
        from tflite_micro.python.tflite_micro import runtime
        interp = runtime.Interpreter.from_file(str(path))
        return ([interp.get_input_details(i) for i in range(n_in)],
                [interp.get_output_details(i) for i in range(n_out)])
    except RuntimeError:
        assert "float32" in path.name, "only the hybrid model may need the LiteRT fallback"
        from ai_edge_litert.interpreter import Interpreter
        interp = Interpreter(model_path=str(path))
        return interp.get_input_details(), interp.get_output_details()


@pytest.mark.parametrize("path", sorted(MODELS.glob("*.tflite")) or [None],
                         ids=lambda p: p.stem if p else "missing")
def test_mlperf_model(path):
    path = need(path)
    g = load_tflite(path)
    assert verify(g) is g and g.name == path.stem
    m = tflite.Model.GetRootAs(path.read_bytes(), 0)
    sg = m.Subgraphs(0)
    assert (len(g.inputs), len(g.outputs)) == (sg.InputsLength(), sg.OutputsLength())
    ins, outs = reference_details(path, len(g.inputs), len(g.outputs))
    for name, d in list(zip(g.inputs, ins)) + list(zip(g.outputs, outs)):
        t = g.tensors[name]
        assert t.shape == tuple(d["shape"]) and t.dtype == np.dtype(d["dtype"]).name
        qp = d["quantization_parameters"]
        assert t.quant == (Quant(tuple(qp["scales"].tolist()), tuple(qp["zero_points"].tolist()),
                                 qp["quantized_dimension"]) if len(qp["scales"]) else None)

    # Node count and kinds, counted directly with the tflite package.
    kinds = []
    for i in range(sg.OperatorsLength()):
        c = m.OperatorCodes(sg.Operators(i).OpcodeIndex())
        kinds.append(EXPECTED_OP[OP_NAMES[max(c.BuiltinCode(), c.DeprecatedBuiltinCode())]])
    assert [n.op for n in g.nodes] == kinds

    # Constants hold exactly the buffer bytes, as owned little-endian-decoded arrays.
    for i in range(sg.TensorsLength()):
        raw = sg.Tensors(i)
        data = m.Buffers(raw.Buffer()).DataAsNumpy()
        t = g.tensors.get(raw.Name().decode())
        if t is None or isinstance(data, int):
            continue
        assert t.is_const and t.data.shape == t.shape and t.data.flags.owndata
        assert t.data.astype(t.data.dtype.newbyteorder("<")).tobytes() == data.tobytes()


def test_mlperf_attributes():
    """Spot checks of resolved attributes on the int8 keyword-spotting model."""
    g = load_tflite(need(MODELS / "kws_ref_model.tflite"))
    first = g.nodes[0]  # 10x4 filter, stride 2, SAME on a 49x10 input
    assert first.attrs == {"stride": (2, 2), "dilation": (1, 1), "padding": (4, 5, 1, 1),
                           "activation": "relu"}
    w = g.tensors[first.inputs[1]]
    assert w.shape == (64, 10, 4, 1) and w.dtype == "int8" and w.quant.per_axis
    assert w.quant.axis == 0 and len(w.quant.scale) == 64
    assert g.nodes[1].op == "depthwise_conv2d" and g.nodes[1].attrs["depth_multiplier"] == 1
    assert g.nodes[-1].attrs == {"beta": 1.0}


def test_hybrid_model_keeps_int8_weights():
    g = load_tflite(need(MODELS / "kws_ref_model_float32.tflite"))
    x, w = (g.tensors[t] for t in g.nodes[0].inputs[:2])
    assert x.dtype == "float32" and w.dtype == "int8" and w.quant is not None


@pytest.mark.parametrize("padding,size,f,s,d,expected", [  # d=2: effective filter 5
    ("SAME", 49, 10, 2, 1, ((4, 5), 25)), ("VALID", 49, 10, 2, 1, ((0, 0), 20)),
    ("SAME", 96, 3, 2, 1, ((0, 1), 48)), ("SAME", 10, 3, 1, 2, ((2, 2), 10)),
    ("VALID", 10, 3, 1, 2, ((0, 0), 6)), ("SAME", 5, 1, 2, 1, ((0, 0), 3))])
def test_resolve_padding(padding, size, f, s, d, expected):
    mode = getattr(tflite.Padding, padding)
    pads, out = resolve_padding(mode, (size, 7), (f, 1), (s, 1), (d, 1))
    assert (pads[:2], out[0]) == expected and pads[2:] == (0, 0) and out[1] == 7


# ---------------------------------------------------------------------------------------------
# Hand-built models: a minimal flatbuffer writer using the tflite package's builder functions.

def build(tensors, ops, inputs, outputs, n_subgraphs=1):
    """tensors: dicts(name, shape, type="INT8", data, scale, zp, axis, sig);
    ops: (op name, inputs, outputs[, (options class name, {field: value})])."""
    b = flatbuffers.Builder(1024)

    def vec(items, kind):
        return b.CreateNumpyVector(np.asarray(items, kind))

    buffers, tensor_offs = [_table(b, "Buffer", {})], []
    for t in tensors:
        if t.get("data") is not None:
            data = vec(np.frombuffer(np.asarray(t["data"]).tobytes(), np.uint8), np.uint8)
            buffers.append(_table(b, "Buffer", {"Data": data}))
        fields = {"Name": b.CreateString(t["name"]), "Shape": vec(t["shape"], np.int32),
                  "Buffer": len(buffers) - 1 if t.get("data") is not None else 0,
                  "Type": getattr(tflite.TensorType, t["type"])}
        if "sig" in t:
            fields["ShapeSignature"] = vec(t["sig"], np.int32)
        if "scale" in t:
            fields["Quantization"] = _table(b, "QuantizationParameters", {
                "Scale": vec(t["scale"], np.float32),
                "ZeroPoint": vec(t["zp"], np.int64),
                "QuantizedDimension": t.get("axis", 0)})
        tensor_offs.append(_table(b, "Tensor", fields))
    codes, op_offs = [], []
    for spec in ops:
        name, ins, outs = spec[:3]
        code = getattr(tflite.BuiltinOperator, name)
        if code not in codes:
            codes.append(code)
        fields = {"OpcodeIndex": codes.index(code), "Inputs": vec(ins, np.int32),
                  "Outputs": vec(outs, np.int32)}
        if len(spec) > 3:
            cls, values = spec[3]
            fields["BuiltinOptionsType"] = getattr(tflite.BuiltinOptions, cls)
            fields["BuiltinOptions"] = _table(b, cls, values)
        op_offs.append(_table(b, "Operator", fields))
    code_offs = [_table(b, "OperatorCode", {"BuiltinCode": c,
                                            "DeprecatedBuiltinCode": min(c, 127)}) for c in codes]
    sgs = [_table(b, "SubGraph", {
        "Tensors": _offsets(b, tensor_offs), "Operators": _offsets(b, op_offs),
        "Inputs": vec(inputs, np.int32), "Outputs": vec(outputs, np.int32)})
        for _ in range(n_subgraphs)]
    model = _table(b, "Model", {"Version": 3, "OperatorCodes": _offsets(b, code_offs),
                                "Subgraphs": _offsets(b, sgs), "Buffers": _offsets(b, buffers)})
    b.Finish(model, file_identifier=b"TFL3")
    return bytes(b.Output())


def _table(b, cls, fields):
    getattr(tflite, cls + "Start")(b)
    for k, v in fields.items():
        getattr(tflite, f"{cls}Add{k}")(b, v)
    return getattr(tflite, cls + "End")(b)


def _offsets(b, offs):
    b.StartVector(4, len(offs), 4)
    for o in reversed(offs):
        b.PrependUOffsetTRelative(o)
    return b.EndVector()


def T(name, shape, type="INT8", **kw):
    return dict(name=name, shape=shape, type=type, **kw)


Q = dict(scale=[0.5], zp=[-3])


def one_op(op, tensors, n_inputs, options=None):
    """A model of one op: tensors[:n_inputs] are its inputs (graph inputs unless constant),
    the rest its outputs."""
    ins, outs = list(range(n_inputs)), list(range(n_inputs, len(tensors)))
    graph_ins = [i for i in ins if tensors[i].get("data") is None]
    spec = (op, ins, outs) + ((options,) if options else ())
    return load_tflite(build(tensors, [spec], graph_ins, outs))


def conv_opts(cls="Conv2DOptions", pad="SAME", s=(1, 1), d=(1, 1), act="NONE", **kw):
    o = {"Padding": getattr(tflite.Padding, pad), "StrideH": s[0], "StrideW": s[1],
         "DilationHFactor": d[0], "DilationWFactor": d[1],
         "FusedActivationFunction": getattr(tflite.ActivationFunctionType, act)}
    return cls, {**o, **kw}


W = np.arange(2 * 3 * 3 * 4, dtype=np.int8).reshape(2, 3, 3, 4)
BIAS = np.array([1, -70000], np.int32)


def test_conv2d_attrs_and_per_channel_quant():
    g = one_op("CONV_2D", [
        T("x", [1, 10, 9, 4], **Q),
        T("w", [2, 3, 3, 4], data=W, scale=[0.1, 0.2], zp=[0, 0], axis=0),
        T("b", [2], "INT32", data=BIAS, scale=[0.05, 0.1], zp=[0, 0]),
        T("y", [1, 5, 9, 2], **Q)], 3, conv_opts(s=(2, 1), d=(2, 1), act="RELU6"))
    n = g.nodes[0]
    assert (n.op, n.inputs, n.outputs) == ("conv2d", ("x", "w", "b"), ("y",))
    # H: eff 5, out 5, total (5-1)*2+5-10 = 3 -> (1, 2); W: eff 3, out 9, total 2 -> (1, 1)
    assert n.attrs == {"stride": (2, 1), "dilation": (2, 1), "padding": (1, 2, 1, 1),
                       "activation": "relu6"}
    w = g.tensors["w"]
    assert np.array_equal(w.data, W) and w.data.dtype == np.int8
    assert w.quant == Quant((np.float32(0.1).item(), np.float32(0.2).item()), (0, 0), 0)
    assert np.array_equal(g.tensors["b"].data, BIAS) and g.tensors["b"].dtype == "int32"
    assert g.inputs == ["x"] and g.outputs == ["y"] and not g.tensors["x"].is_const
    with pytest.raises(ModelError, match="disagrees"):  # output size checked against padding
        one_op("CONV_2D", [T("x", [1, 10, 9, 4]), T("w", [2, 3, 3, 4], data=W),
                           T("y", [1, 4, 9, 2])], 2, conv_opts(s=(2, 1)))


def test_depthwise_multiplier_and_valid_padding():
    g = one_op("DEPTHWISE_CONV_2D", [
        T("x", [1, 6, 6, 2]), T("w", [1, 3, 3, 4], data=np.ones((1, 3, 3, 4), np.int8)),
        T("y", [1, 2, 2, 4])], 2,
        conv_opts("DepthwiseConv2DOptions", "VALID", s=(2, 2), act="RELU", DepthMultiplier=2))
    assert (g.nodes[0].op, g.nodes[0].inputs) == ("depthwise_conv2d", ("x", "w"))
    assert g.nodes[0].attrs == {"stride": (2, 2), "dilation": (1, 1), "padding": (0, 0, 0, 0),
                       "depth_multiplier": 2, "activation": "relu"}


def test_fully_connected_optional_bias_is_empty_string():
    tensors = [T("x", [1, 4]), T("w", [3, 4], data=np.zeros((3, 4), np.int8)), T("y", [1, 3])]
    g = load_tflite(build(tensors, [("FULLY_CONNECTED", [0, 1, -1], [2],
                                     ("FullyConnectedOptions", {"FusedActivationFunction": 2}))],
                          [0], [2]))
    assert g.nodes[0].inputs == ("x", "w", "") and g.nodes[0].attrs == {
        "activation": "relu_n1_to_1"}


@pytest.mark.parametrize("pool,op", [("AVERAGE_POOL_2D", "avg_pool2d"),
                                     ("MAX_POOL_2D", "max_pool2d")])
def test_pools(pool, op):
    g = one_op(pool, [T("x", [1, 7, 7, 3]), T("y", [1, 4, 4, 3])], 1,
               ("Pool2DOptions", {"Padding": 0, "StrideH": 2, "StrideW": 2, "FilterHeight": 3,
                                  "FilterWidth": 2, "FusedActivationFunction": 1}))
    # H: out 4, total 3*2+3-7 = 2 -> (1, 1); W: total 3*2+2-7 = 1 -> (0, 1)
    assert g.nodes[0].op == op and g.nodes[0].attrs == {
        "filter": (3, 2), "stride": (2, 2), "padding": (1, 1, 0, 1), "activation": "relu"}


@pytest.mark.parametrize("tfl,op,out", [
    ("LOGISTIC", "logistic", "INT8"), ("TANH", "tanh", "INT8"), ("RELU", "relu", "INT8"),
    ("RELU6", "relu6", "INT8"), ("HARD_SWISH", "hard_swish", "INT8"),
    ("QUANTIZE", "quantize", "INT8"), ("DEQUANTIZE", "dequantize", "FLOAT32")])
def test_simple_ops(tfl, op, out):
    y = T("y", [1, 8], out, **(Q if out == "INT8" else {}))
    g = one_op(tfl, [T("x", [1, 8], **Q), y], 1)
    assert (g.nodes[0].op, g.nodes[0].attrs) == (op, {})
    assert g.tensors["y"].dtype == out.lower()
    assert (g.tensors["y"].quant is None) == (out == "FLOAT32")


@pytest.mark.parametrize("tfl,op,cls", [("ADD", "add", "AddOptions"),
                                        ("MUL", "mul", "MulOptions")])
def test_binary_ops(tfl, op, cls):
    g = one_op(tfl, [T("a", [1, 4]), T("b", [4], data=np.ones(4, np.int8)), T("y", [1, 4])],
               2, (cls, {"FusedActivationFunction": 3}))
    assert (g.nodes[0].op, g.nodes[0].inputs, g.nodes[0].attrs) == (
        op, ("a", "b"), {"activation": "relu6", "tflm": True})


def test_reshape_and_squeeze():
    shape = np.array([1, 6], np.int32)
    g = one_op("RESHAPE", [T("x", [1, 2, 3]), T("s", [2], "INT32", data=shape), T("y", [1, 6])], 2)
    assert (g.nodes[0].op, g.nodes[0].inputs) == ("reshape", ("x", "s"))
    g = one_op("SQUEEZE", [T("x", [1, 1, 6]), T("y", [6])], 1)
    assert (g.nodes[0].op, g.nodes[0].inputs, g.nodes[0].attrs) == ("reshape", ("x",), {})


def test_softmax_leaky_relu_and_concatenation_options():
    g = one_op("SOFTMAX", [T("x", [1, 5]), T("y", [1, 5])], 1, ("SoftmaxOptions", {"Beta": 0.5}))
    assert g.nodes[0].attrs == {"beta": 0.5}
    g = one_op("LEAKY_RELU", [T("x", [3]), T("y", [3])], 1, ("LeakyReluOptions", {"Alpha": 0.1}))
    assert g.nodes[0].attrs == {"alpha": np.float32(0.1).item()}
    g = one_op("CONCATENATION", [T("a", [1, 2, 3]), T("b", [1, 2, 5]), T("y", [1, 2, 8])], 2,
               ("ConcatenationOptions", {"Axis": -1, "FusedActivationFunction": 1}))
    assert g.nodes[0].op == "concat" and g.nodes[0].attrs == {"axis": 2, "activation": "relu"}


def test_pad_and_padv2():
    pads = np.array([[0, 0], [1, 2], [3, 0]], np.int32)
    g = one_op("PAD", [T("x", [1, 2, 2]), T("p", [3, 2], "INT32", data=pads),
                       T("y", [1, 5, 5])], 2)
    assert (g.nodes[0].op, g.nodes[0].inputs) == ("pad", ("x", "p"))
    assert g.nodes[0].attrs == {"pads": ((0, 0), (1, 2), (3, 0))}
    g = one_op("PADV2", [T("x", [1, 2, 2]), T("p", [3, 2], "INT32", data=pads),
                         T("v", [], data=np.array(-5, np.int8)), T("y", [1, 5, 5])], 3)
    assert g.nodes[0].inputs == ("x", "p", "v") and g.tensors["v"].data == -5


def test_mean_axes_normalised_and_sorted():
    axes = np.array([-2, 1, 2], np.int32)
    g = one_op("MEAN", [T("x", [1, 4, 4, 8]), T("a", [3], "INT32", data=axes),
                        T("y", [1, 1, 1, 8])], 2, ("ReducerOptions", {"KeepDims": True}))
    assert g.nodes[0].op == "mean" and g.nodes[0].attrs == {"axes": (1, 2), "keep_dims": True}
    with pytest.raises(ModelError, match="must be a constant"):
        one_op("MEAN", [T("x", [1, 4]), T("a", [1], "INT32"), T("y", [1])], 2,
               ("ReducerOptions", {"KeepDims": False}))


def test_duplicate_and_empty_names_are_made_unique():
    tensors = [T("t", [4]), T("t", [4]), T("", [4]), T("t_1", [4])]
    g = load_tflite(build(tensors, [("RELU", [0], [1]), ("RELU", [1], [2]),
                                    ("RELU", [2], [3])], [0], [3]))
    assert [n.outputs[0] for n in g.nodes] == ["t_2", "tensor_2", "t_1"]
    assert g.inputs == ["t"] and len(g.tensors) == 4


def test_dynamic_shapes_rejected_extra_subgraphs_read_on_demand():
    ok = [T("x", [1, 4], sig=[-1, 4]), T("y", [1, 4], sig=[-1, 4])]
    assert load_tflite(build(ok, [("RELU", [0], [1])], [0], [1])).tensors["x"].shape == (1, 4)
    bad = [T("x", [1, 4], sig=[1, -1]), T("y", [1, 4])]
    with pytest.raises(ModelError, match=r"input 'x' has dynamic shape \[1, -1\]; give its "
                       r"shape with --input-shape x=1,N"):
        load_tflite(build(bad, [("RELU", [0], [1])], [0], [1]))
    # subgraphs other than the first are read only by the operators that call them
    two = load_tflite(build(ok, [("RELU", [0], [1])], [0], [1], n_subgraphs=2))
    assert [n.op for n in two.nodes] == ["relu"]


def test_unsupported_ops_listed_in_one_error():
    tensors = [T(n, [1, 4, 4, 4], "FLOAT32") for n in "xscre"]
    tensors.insert(2, T("w", [4, 1, 1, 4], "FLOAT32", data=np.zeros((4, 1, 1, 4), np.float32)))
    ops = [("SKIP_GRAM", [0], [1]), ("CONV_2D", [1, 2, -1], [3], conv_opts(act="TANH")),
           ("RELU", [3], [4]), ("HASHTABLE_LOOKUP", [4], [5])]
    with pytest.raises(UnsupportedOpError) as e:
        load_tflite(build(tensors, ops, [0], [5]))
    msg = str(e.value)
    assert "3 unsupported" in msg
    assert "node 0: SKIP_GRAM (output 's')" in msg
    assert "node 3: HASHTABLE_LOOKUP (output 'e')" in msg
    assert "node 1: CONV_2D (output 'c'): fused activation TANH" in msg
    assert "RELU (" not in msg
    assert msg.endswith("supported TFLite operators: " + ", ".join(sorted(CONVERTERS)))
    assert {"CONV_2D", "HARD_SWISH", "PADV2", "SQUEEZE"} <= set(CONVERTERS)


# ---------------------------------------------------------------------------------------------
# Files that are not usable models.

def small_model():
    return build([T("x", [4]), T("w", [4], data=np.arange(4, dtype=np.int8)), T("y", [4])],
                 [("ADD", [0, 1], [2])], [0], [2])


def test_truncated_real_model(tmp_path):
    path = need(MODELS / "vww_96_int8.tflite")
    cut = tmp_path / "half.tflite"
    cut.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    with pytest.raises(ModelError, match=r"^truncated: .*half\.tflite"):
        load_tflite(cut)


def test_truncated_at_every_length_is_a_model_error():
    data = small_model()
    for n in range(8, len(data)):
        try:
            load_tflite(data[:n])
        except ModelError:
            pass  # other exceptions fail the test


@pytest.mark.parametrize("content,expected,via_load_model", [
    (b"hello, this is a text file\n", r"^not a TFLite model: .*no 'TFL3' identifier",
     "unrecognised model format"),
    (b"\x89PNG\r\n\x1a\n" + bytes(64), r"^not a TFLite model: .*no 'TFL3' identifier",
     "unrecognised model format"),
    (b"", r"^not a TFLite model: .* is empty", "unrecognised model format"),
    (None, r"^model file not found: .*bad\.tflite", r"^model file not found"),
])
def test_not_a_model(tmp_path, content, expected, via_load_model):
    path = tmp_path / "bad.tflite"
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(ModelError, match=expected):
        load_tflite(path)
    with pytest.raises(ModelError, match=via_load_model):
        load_model(path)


def test_load_model_dispatches_on_content(tmp_path):
    path = tmp_path / "model.bin"  # the extension does not matter
    path.write_bytes(small_model())  # ADD without options: no fused activation
    g = load_model(path)
    assert g.name == "model" and [(n.op, n.attrs) for n in g.nodes] == [
        ("add", {"activation": "none", "tflm": True})]
    assert load_tflite(small_model(), name="m").name == "m"
