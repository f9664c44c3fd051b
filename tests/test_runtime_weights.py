"""Float Conv, ConvTranspose and BatchNormalization whose weights / statistics are graph inputs
(computed at run time, read from the arena) compile and match onnxruntime."""
import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from mcuforge import runner


def _model(node, shapes: dict, out_shape):
    ins = [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in shapes.items()]
    g = helper.make_graph([node], "rt", ins,
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, out_shape)])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


CASES = {  # name -> (node, input shapes, output shape)
    "conv": (helper.make_node("Conv", ["x", "w", "b"], ["y"], pads=[1, 0, 1, 0]),
             {"x": [1, 3, 5, 4], "w": [4, 3, 3, 2], "b": [4]}, [1, 4, 5, 3]),
    "conv_grouped": (helper.make_node("Conv", ["x", "w"], ["y"], group=2, strides=[2, 1]),
                     {"x": [1, 4, 6, 5], "w": [6, 2, 2, 2]}, [1, 6, 3, 4]),
    "conv_depthwise": (helper.make_node("Conv", ["x", "w", "b"], ["y"], group=3,
                                        pads=[1, 1, 1, 1]),
                       {"x": [1, 3, 4, 4], "w": [6, 1, 3, 3], "b": [6]}, [1, 6, 4, 4]),
    "conv_1d": (helper.make_node("Conv", ["x", "w"], ["y"], dilations=[2]),
                {"x": [1, 2, 9], "w": [3, 2, 3]}, [1, 3, 5]),
    "conv_transpose": (helper.make_node("ConvTranspose", ["x", "w", "b"], ["y"], strides=[2, 2],
                                        group=2),
                       {"x": [1, 4, 3, 3], "w": [4, 3, 2, 2], "b": [6]}, [1, 6, 6, 6]),
    "conv_transpose_1d": (helper.make_node("ConvTranspose", ["x", "w"], ["y"], strides=[3]),
                          {"x": [1, 2, 4], "w": [2, 3, 2]}, [1, 3, 11]),
    "batch_norm": (helper.make_node("BatchNormalization", ["x", "s", "b", "m", "v"], ["y"],
                                    epsilon=1e-3),
                   {"x": [2, 3, 4, 4], "s": [3], "b": [3], "m": [3], "v": [3]}, [2, 3, 4, 4]),
}


@pytest.mark.parametrize("name", CASES)
def test_runtime_operands_match_onnxruntime(name):
    node, shapes, out_shape = CASES[name]
    model = _model(node, shapes, out_shape)
    rng = np.random.default_rng(len(name))
    feeds = {n: rng.normal(size=s).astype(np.float32) for n, s in shapes.items()}
    if "v" in feeds:
        feeds["v"] = np.abs(feeds["v"]) + 0.1  # a variance
    want = ort.InferenceSession(model.SerializeToString(),
                                providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    got = runner.run(model.SerializeToString(), feeds)
    assert got.shape == want.shape
    # float sums in another order than onnxruntime's (MLAS): a few ulps of the magnitudes
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_integer_layer_with_runtime_weights_is_refused():
    """Run-time weights are float only: the error names the operand, no traceback."""
    from mcuforge.codegen_c.lower import OpContext, operand
    from mcuforge.ir.graph import Graph, Node, Quant, Tensor
    q = Quant((0.1,), (0,))
    ts = {n: Tensor(n, (1, 1, 1, 1), "int8", None, q) for n in ("x", "w", "y")}
    node = Node("conv2d", ("x", "w"), ("y",), {})
    ctx = OpContext(node, Graph(ts, [node], ["x", "w"], ["y"]), "k")
    with pytest.raises(NotImplementedError, match="'w'.*computed at run time"):
        operand(ctx, 1, "w")
