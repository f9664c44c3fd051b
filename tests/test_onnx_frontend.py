"""The ONNX frontend's handling of shapes and errors: dynamic batch set to 1 with a note, other
dynamic dimensions need --input-shape, unknown ops listed together."""
import subprocess
import sys

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from mcuforge.frontend.onnx import load_onnx
from mcuforge.ir.errors import ModelError, ModelNote, UnsupportedOpError


def _model(shape, nodes=None, opset=17):
    nodes = nodes or [helper.make_node("Relu", ["x"], ["y"])]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "mcuforge.cli", *args], capture_output=True,
                          text=True)


def test_dynamic_batch_becomes_one_with_a_note(tmp_path):
    with pytest.warns(ModelNote, match="dimension 0 .'N'. set to 1"):
        g = load_onnx(_model(["N", 3, 8]))
    assert g.tensors["x"].shape == (1, 3, 8) == g.tensors["y"].shape
    onnx.save(_model(["N", 3, 8]), tmp_path / "m.onnx")
    r = _cli("info", str(tmp_path / "m.onnx"))
    assert r.returncode == 0 and "mcuforge: note: input 'x': dimension 0" in r.stderr


def test_other_dynamic_dimensions_need_input_shape(tmp_path):
    with pytest.raises(ModelError, match=r"input 'x' has a dynamic dimension 2 .*--input-shape"):
        load_onnx(_model([1, 3, "W"]))
    g = load_onnx(_model([1, 3, "W"]), input_shapes={"x": (1, 3, 5)})
    assert g.tensors["y"].shape == (1, 3, 5)
    onnx.save(_model([1, 3, "W"]), tmp_path / "m.onnx")
    x = np.random.default_rng(0).standard_normal((1, 3, 5)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    r = _cli("run", str(tmp_path / "m.onnx"), "--input-shape", "x=1,3,5", "--input",
             str(tmp_path / "x.npy"), "--output", str(tmp_path / "y.npy"))
    assert r.returncode == 0, r.stderr
    assert np.array_equal(np.load(tmp_path / "y.npy"), np.maximum(x, 0))


def test_every_unsupported_op_is_listed_once():
    nodes = [helper.make_node("Acos", ["x"], ["a"]), helper.make_node("Relu", ["a"], ["b"]),
             helper.make_node("Det", ["b"], ["y"])]
    with pytest.raises(UnsupportedOpError) as e:
        load_onnx(_model([1, 4, 4], nodes))
    msg = str(e.value)
    assert "node 0: Acos -> 'a'" in msg and "node 2: Det -> 'y'" in msg
    assert "Relu ->" not in msg and "supported ONNX operators:" in msg


def test_not_an_onnx_model(tmp_path):
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"\x08\x07garbage that is not a protobuf \xff\xff\xff")
    r = _cli("compile", str(bad), "-o", str(tmp_path / "out"))
    assert r.returncode == 2 and "mcuforge: error:" in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "out").exists()
