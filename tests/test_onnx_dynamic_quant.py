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
