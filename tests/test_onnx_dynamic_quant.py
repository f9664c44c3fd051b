"""Models written by onnxruntime's quantize_dynamic (DynamicQuantizeLinear, MatMulInteger, Cast,
Mul, Add) compile and give exactly onnxruntime's outputs (its arithmetic here is deterministic:
float32 min / max, division, round half to even, integer sums)."""
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper, numpy_helper
from onnxruntime.quantization import QuantType, quantize_dynamic

from mcuforge import runner


def _mlp(path, sizes, batch, seed):
    rng = np.random.default_rng(seed)
    inits, nodes, x = [], [], "x"
    for k, (i, o) in enumerate(zip(sizes, sizes[1:])):
        inits += [numpy_helper.from_array(rng.normal(size=(i, o)).astype(np.float32), f"w{k}"),
                  numpy_helper.from_array(rng.normal(size=o).astype(np.float32), f"b{k}")]
        y = "y" if k == len(sizes) - 2 else f"r{k}"
        nodes += [helper.make_node("MatMul", [x, f"w{k}"], [f"m{k}"]),
                  helper.make_node("Add", [f"m{k}", f"b{k}"], [f"a{k}" if y != "y" else y])]
        if y != "y":
            nodes.append(helper.make_node("Relu", [f"a{k}"], [y]))
        x = y
    g = helper.make_graph(nodes, "mlp",
                          [helper.make_tensor_value_info("x", 1, [batch, sizes[0]])],
                          [helper.make_tensor_value_info("y", 1, [batch, sizes[-1]])], inits)
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)], ir_version=8),
              path)


@pytest.mark.parametrize("weight_type", [QuantType.QInt8, QuantType.QUInt8])
@pytest.mark.parametrize("per_channel", [False, True])
@pytest.mark.parametrize("sizes,batch", [((16, 32, 10), 1), ((24, 8, 8, 5), 3)])
def test_quantize_dynamic_mlp_exact(tmp_path, weight_type, per_channel, sizes, batch):
    _mlp(tmp_path / "f.onnx", sizes, batch, seed=len(sizes) + batch)
    quantize_dynamic(tmp_path / "f.onnx", tmp_path / "q.onnx", weight_type=weight_type,
                     per_channel=per_channel)
    data = (tmp_path / "q.onnx").read_bytes()
    ops = {n.op_type for n in onnx.load_model_from_string(data).graph.node}
    assert {"DynamicQuantizeLinear", "MatMulInteger"} <= ops
    session = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(7)
    xs = [rng.normal(size=(batch, sizes[0])).astype(np.float32) * s for s in (0.1, 1.0, 30.0)]
    xs.append(np.abs(xs[1]))  # all positive: the range is clipped at 0
    xs.append(np.zeros_like(xs[1]))  # an empty range: scale 1
    for x in xs:
        want = session.run(None, {"x": x})[0]
        got = runner.run(data, x)
        np.testing.assert_array_equal(got, want)


def _cnn(path, seed):
    """Conv 3x3 pad 1 -> Relu -> depthwise Conv stride 2 -> Relu -> Flatten -> MatMul."""
    rng = np.random.default_rng(seed)
    w = lambda name, *shape: numpy_helper.from_array(  # noqa: E731
        rng.normal(size=shape).astype(np.float32), name)
    nodes = [helper.make_node("Conv", ["x", "w0", "b0"], ["c0"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c0"], ["r0"]),
             helper.make_node("Conv", ["r0", "w1", "b1"], ["c1"], group=4, strides=[2, 2],
                              pads=[0, 0, 1, 1]),
             helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node("Flatten", ["r1"], ["f"]),
             helper.make_node("MatMul", ["f", "w2"], ["y"])]
    g = helper.make_graph(nodes, "cnn", [helper.make_tensor_value_info("x", 1, [1, 3, 8, 8])],
                          [helper.make_tensor_value_info("y", 1, [1, 5])],
                          [w("w0", 4, 3, 3, 3), w("b0", 4), w("w1", 4, 1, 3, 3), w("b1", 4),
                           w("w2", 64, 5)])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)], ir_version=8),
              path)


@pytest.mark.parametrize("weight_type", [QuantType.QInt8, QuantType.QUInt8])
@pytest.mark.parametrize("per_channel", [False, True])
def test_quantize_dynamic_cnn_exact(tmp_path, weight_type, per_channel):
    _cnn(tmp_path / "f.onnx", seed=3)
    quantize_dynamic(tmp_path / "f.onnx", tmp_path / "q.onnx", weight_type=weight_type,
                     per_channel=per_channel, op_types_to_quantize=["Conv", "MatMul"])
    data = (tmp_path / "q.onnx").read_bytes()
    ops = [n.op_type for n in onnx.load_model_from_string(data).graph.node]
    assert ops.count("ConvInteger") == 2 and "MatMulInteger" in ops
    session = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(11)
    for scale in (0.5, 4.0):
        x = rng.normal(size=(1, 3, 8, 8)).astype(np.float32) * scale
        np.testing.assert_array_equal(runner.run(data, x), session.run(None, {"x": x})[0])
