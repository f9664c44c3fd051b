"""Malformed model files through the CLI: each gives one `mcuforge: error:` line naming the
tensor or node and the real cause, no traceback, non-zero exit (issue item 17).

Every file is a small valid model (an onnx.helper CNN, a QDQ one, the MLPerf Tiny int8 KWS
model or mcuforge's demo model as TFLite) with one defect put in by hand here: ONNX through
its protobuf, TFLite by overwriting bytes at offsets found with the `tflite` package's reader.
"""
import os
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
import tflite
from onnx import TensorProto, helper, numpy_helper

REPO = Path(__file__).resolve().parents[1]
KWS = REPO.parent / "shared" / "models" / "mlperf_tiny" / "kws_ref_model.tflite"


def cli(*args, cwd):
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.run([sys.executable, "-m", "mcuforge.cli", *map(str, args)], cwd=cwd,
                          capture_output=True, text=True, env=env, timeout=300)


def assert_clean_error(r, *fragments, absent=("supported ONNX operators",
                                              "supported TFLite operators")):
    out = f"exit {r.returncode}\nstdout:\n{r.stdout}\nstderr:\n{r.stderr}"
    assert r.returncode in (1, 2), out
    assert "Traceback" not in r.stderr + r.stdout, out
    assert "internal error" not in r.stderr, out
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("mcuforge: error: "), out
    for f in fragments:
        assert f.lower() in r.stderr.lower(), f"{f!r} not in the message\n{out}"
    for f in absent:
        assert f not in r.stderr, out


# ---------------------------------------------------------------------------------------------
# ONNX: a float CNN and a QDQ-quantized layer


def float_cnn() -> onnx.ModelProto:
    """x[1,2,6,6] -> Conv(3, 3x3) -> Relu -> Flatten -> Gemm(4) -> y."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.normal(size=(3, 2, 3, 3)).astype(np.float32), "w"),
             numpy_helper.from_array(rng.normal(size=3).astype(np.float32), "b"),
             numpy_helper.from_array(rng.normal(size=(4, 48)).astype(np.float32), "fc_w"),
             numpy_helper.from_array(rng.normal(size=4).astype(np.float32), "fc_b")]
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], name="conv"),
             helper.make_node("Relu", ["c"], ["r"], name="relu"),
             helper.make_node("Flatten", ["r"], ["f"], name="flatten"),
             helper.make_node("Gemm", ["f", "fc_w", "fc_b"], ["y"], name="fc", transB=1)]
    g = helper.make_graph(nodes, "cnn", [helper.make_tensor_value_info("x", 1, [1, 2, 6, 6])],
                          [helper.make_tensor_value_info("y", 1, [1, 4])], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])


def qdq_model(scale=0.05, zp=3, zp_type=TensorProto.INT8) -> onnx.ModelProto:
    """x -> QuantizeLinear -> DequantizeLinear -> Conv (int8 QDQ weights) -> QuantizeLinear."""
    w = np.arange(3 * 2 * 3 * 3, dtype=np.int8).reshape(3, 2, 3, 3) - 20
    inits = [helper.make_tensor("x_scale", TensorProto.FLOAT, [], [scale]),
             helper.make_tensor("x_zp", zp_type, [], [zp]),
             numpy_helper.from_array(w, "w_q"),
             helper.make_tensor("w_scale", TensorProto.FLOAT, [], [0.01]),
             helper.make_tensor("w_zp", TensorProto.INT8, [], [0])]
    nodes = [helper.make_node("QuantizeLinear", ["x", "x_scale", "x_zp"], ["xq"], name="q_x"),
             helper.make_node("DequantizeLinear", ["xq", "x_scale", "x_zp"], ["xd"], name="dq_x"),
             helper.make_node("DequantizeLinear", ["w_q", "w_scale", "w_zp"], ["wd"],
                              name="dq_w"),
             helper.make_node("Conv", ["xd", "wd"], ["c"], name="conv"),
             helper.make_node("QuantizeLinear", ["c", "y_scale", "x_zp"], ["y"], name="q_y")]
    inits.append(helper.make_tensor("y_scale", TensorProto.FLOAT, [], [0.2]))
    g = helper.make_graph(nodes, "qdq", [helper.make_tensor_value_info("x", 1, [1, 2, 6, 6])],
                          [helper.make_tensor_value_info("y", zp_type, [1, 3, 4, 4])], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])


def _init(m, name):
    return next(i for i in m.graph.initializer if i.name == name)


def onnx_scale(value):
    def make():
        m = qdq_model()
        t = _init(m, "x_scale")
        del t.float_data[:]
        t.raw_data = np.float32(value).tobytes()
        return m
    return make


def onnx_zp_out_of_range():
    m = qdq_model()
    t = _init(m, "x_zp")
    del t.int32_data[:]
    t.int32_data.append(300)  # int8 data stored as int32 in the protobuf: 300 is no int8
    return m


def onnx_raw_data_size():
    m = float_cnn()
    t = _init(m, "w")
    t.raw_data = t.raw_data[:-8]  # two floats short of dims 3x2x3x3
    return m


def onnx_cycle():
    m = float_cnn()
    m.graph.node[0].input[0] = "r"  # conv reads relu's output, relu reads conv's
    return m


def onnx_dangling():
    m = float_cnn()
    m.graph.node[1].input[0] = "nowhere"
    return m


def onnx_bool_conv():
    m = float_cnn()
    m.graph.input[0].type.tensor_type.elem_type = TensorProto.BOOL
    return m


def onnx_negative_dims():
    m = float_cnn()
    t = _init(m, "fc_b")
    t.dims[0] = -4
    return m


def onnx_swapped_ops():
    m = float_cnn()
    m.graph.node[0].op_type, m.graph.node[3].op_type = "Gemm", "Conv"
    return m


def onnx_pool_of_a_vector():
    """Found by fuzz-files (a flipped byte): a pool over a rank-1 input indexed past its shape."""
    g = helper.make_graph([helper.make_node("MaxPool", ["x"], ["y"], name="pool",
                                            kernel_shape=[2])], "p",
                          [helper.make_tensor_value_info("x", 1, [8])],
                          [helper.make_tensor_value_info("y", 1, None)])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])


def onnx_attribute_not_in_opset():
    """DequantizeLinear's axis exists from opset 13: at opset 10 the model is invalid (onnx's
    checker refuses it), and folding the weight as if per-axis would be a guess."""
    m = qdq_model()
    m.opset_import[0].version = 10
    next(n for n in m.graph.node if n.name == "dq_w").attribute.append(
        helper.make_attribute("axis", 0))
    with pytest.raises(onnx.checker.ValidationError, match="axis"):
        onnx.checker.check_model(m)
    return m


ONNX_CASES = {  # name -> (make model, fragments of the message)
    "scale_zero": (onnx_scale(0.0), ("x_scale", "scale", "0")),
    "scale_inf": (onnx_scale(np.inf), ("x_scale", "scale", "inf")),
    "scale_nan": (onnx_scale(np.nan), ("x_scale", "scale", "nan")),
    "scale_negative": (onnx_scale(-0.5), ("x_scale", "scale", "-0.5")),
    "zero_point_out_of_range": (onnx_zp_out_of_range, ("x_zp", "300")),
    "raw_data_size": (onnx_raw_data_size, ("'w'", "raw_data", "dims")),
    "cycle": (onnx_cycle, ("cycle",)),
    "dangling_input": (onnx_dangling, ("'nowhere'", "relu")),
    "bool_into_conv": (onnx_bool_conv, ("conv", "bool")),
    "negative_dims": (onnx_negative_dims, ("fc_b", "-4")),
    "swapped_ops": (onnx_swapped_ops, ("conv",)),
    "attribute_not_in_opset": (onnx_attribute_not_in_opset, ("dq_w", "axis", "opset 10")),
    "pool_of_a_vector": (onnx_pool_of_a_vector, ("pool",)),
}


@pytest.mark.parametrize("case", ONNX_CASES)
@pytest.mark.parametrize("command", ["compile", "info"])
def test_malformed_onnx(case, command, tmp_path):
    make, fragments = ONNX_CASES[case]
    (tmp_path / "m.onnx").write_bytes(make().SerializeToString())
    extra = ("-o", "out") if command == "compile" else ()
    assert_clean_error(cli(command, "m.onnx", *extra, cwd=tmp_path), *fragments)
    assert not (tmp_path / "out").exists()


def test_onnx_controls_compile(tmp_path):
    """The unbroken models compile: the defects above are what the errors are about."""
    for k, m in enumerate((float_cnn(), qdq_model())):
        (tmp_path / f"m{k}.onnx").write_bytes(m.SerializeToString())
        r = cli("compile", f"m{k}.onnx", "-o", f"out{k}", cwd=tmp_path)
        assert r.returncode == 0, r.stderr


# ---------------------------------------------------------------------------------------------
# TFLite: bytes of a valid model overwritten in place


def tflite_base() -> bytes:
    if KWS.exists():
        return KWS.read_bytes()
    from mcuforge.tools.demo import demo_tflite_bytes
    return demo_tflite_bytes()


def _field(table, slot: int) -> int:
    """Absolute offset of a scalar field of a flatbuffer table (it must be present)."""
    o = table._tab.Offset(slot)
    assert o, "field absent in the base model"
    return table._tab.Pos + o


def _vector(table, slot: int) -> int:
    """Absolute offset of element 0 of a vector field."""
    o = table._tab.Offset(slot)
    assert o, "vector absent in the base model"
    return table._tab.Vector(o)


def _model(buf):
    m = tflite.Model.GetRootAs(buf, 0)
    return m, m.Subgraphs(0)


def _quantized_activation(sg):
    """(index, tensor) of the first non-constant tensor with quantization."""
    for i in range(sg.TensorsLength()):
        t = sg.Tensors(i)
        if t.Buffer() == 0 or True:
            q = t.Quantization()
            if q is not None and q.ScaleLength() == 1 and q.ZeroPointLength() == 1:
                return i, t
    raise AssertionError("no quantized tensor")


def patched(fn):
    def make():
        buf = bytearray(tflite_base())
        fn(buf, *_model(bytes(buf)))
        return bytes(buf)
    return make


def tfl_scale(value):
    def patch(buf, m, sg):
        _, t = _quantized_activation(sg)
        struct.pack_into("<f", buf, _vector(t.Quantization(), 8), value)
    return patched(patch)


@patched
def tfl_zero_point(buf, m, sg):
    _, t = _quantized_activation(sg)
    struct.pack_into("<q", buf, _vector(t.Quantization(), 10), 1000)


@patched
def tfl_swapped_codes(buf, m, sg):
    """Swap the builtin codes of two operator codes (CONV_2D <-> another)."""
    a, b = m.OperatorCodes(0), m.OperatorCodes(1)
    for slot, fmt in ((10, "<i"), (4, "<b")):
        if not (a._tab.Offset(slot) and b._tab.Offset(slot)):
            continue  # (old files have only the deprecated code)
        pa, pb = _field(a, slot), _field(b, slot)
        va, vb = struct.unpack_from(fmt, buf, pa)[0], struct.unpack_from(fmt, buf, pb)[0]
        struct.pack_into(fmt, buf, pa, vb)
        struct.pack_into(fmt, buf, pb, va)


@patched
def tfl_buffer_index(buf, m, sg):
    for i in range(sg.TensorsLength()):
        t = sg.Tensors(i)
        if t.Buffer() > 0:
            struct.pack_into("<I", buf, _field(t, 8), 99999)
            return


@patched
def tfl_negative_dim(buf, m, sg):
    struct.pack_into("<i", buf, _vector(sg.Tensors(sg.Inputs(0)), 4) + 4, -7)


@patched
def tfl_zero_dim(buf, m, sg):
    t = sg.Tensors(sg.Inputs(0))
    struct.pack_into("<i", buf, _vector(t, 4) + 4 * (t.ShapeLength() - 1), 0)
    if t.ShapeSignatureLength():  # the signature is what shapes are recomputed from
        struct.pack_into("<i", buf, _vector(t, 18) + 4 * (t.ShapeSignatureLength() - 1), 0)


@patched
def tfl_op_input_index(buf, m, sg):
    struct.pack_into("<i", buf, _vector(sg.Operators(0), 6), 5000)


def _tfl_names():
    m, sg = _model(tflite_base())
    i, _ = _quantized_activation(sg)
    return sg.Tensors(i).Name().decode()


TFLITE_CASES = {
    "scale_zero": (tfl_scale(0.0), ("scale", "0")),
    "scale_inf": (tfl_scale(np.inf), ("scale", "inf")),
    "scale_nan": (tfl_scale(np.nan), ("scale", "nan")),
    "scale_negative": (tfl_scale(-0.25), ("scale", "-0.25")),
    "zero_point_out_of_range": (tfl_zero_point, ("zero point", "1000")),
    "swapped_operator_codes": (tfl_swapped_codes, ("node 0",)),
    "buffer_index_out_of_range": (tfl_buffer_index, ("buffer 99999",)),
    "negative_dims": (tfl_negative_dim, ("-7",)),
    "zero_dim": (tfl_zero_dim, ("zero dimension",)),  # found by fuzz-files: 0 % 0 in a converter
    "operator_input_index": (tfl_op_input_index, ("node 0", "5000")),
}


@pytest.mark.parametrize("case", TFLITE_CASES)
@pytest.mark.parametrize("command", ["compile", "info"])
def test_malformed_tflite(case, command, tmp_path):
    make, fragments = TFLITE_CASES[case]
    (tmp_path / "m.tflite").write_bytes(make())
    extra = ("-o", "out") if command == "compile" else ()
    r = cli(command, "m.tflite", *extra, cwd=tmp_path)
    assert_clean_error(r, *fragments)
    if case.startswith(("scale", "zero")):  # the message names the tensor
        assert f"'{_tfl_names()}'" in r.stderr
    assert not (tmp_path / "out").exists()
