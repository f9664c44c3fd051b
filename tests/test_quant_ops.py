"""int8 for the ops real graphs mix in: Slice, Split, standalone BatchNormalization (MUL + ADD),
Clip and Softmax on another axis than the last, each on an onnx.helper model.

For each: the float reference is onnxruntime on the dequantized int8 input, and the dequantized
int8 output is within a few steps of its output scale; the generated C and tflite-micro on the
--emit-tflite file agree byte for byte (test_emit_tflite.check_emitted).
"""
import numpy as np
import pytest
from onnx import helper

from mcuforge.tools import tflm
from mcuforge.api import load
from mcuforge.runner import GraphRunner
from mcuforge.optimizer.quantize import quantize_graph
from mcuforge.optimizer.pipeline import optimize
from test_emit_tflite import check_emitted, onnx_model

RUN = GraphRunner()  # the quantizer's graph runner: builds each graph once

pytestmark = pytest.mark.skipif(not tflm.available(), reason="tflite-micro not installed")
RNG = np.random.default_rng(5)


def slice_model(starts, ends, axes, steps, x_shape, y_shape):
    ins = [("s", np.array(starts, np.int64)), ("e", np.array(ends, np.int64)),
           ("a", np.array(axes, np.int64)), ("t", np.array(steps, np.int64))]
    return onnx_model([helper.make_node("Slice", ["x", "s", "e", "a", "t"], ["y"])],
                      x_shape, y_shape, ins), x_shape


def split_model():
    """Split into three unequal parts, recombined as add(relu(a), b) and concat with c."""
    nodes = [helper.make_node("Split", ["x", "sp"], ["a", "b", "c"], axis=1),
             helper.make_node("Relu", ["a"], ["ra"]),
             helper.make_node("Add", ["ra", "b"], ["s"]),
             helper.make_node("Concat", ["s", "c"], ["y"], axis=1)]
    infos = [("a", [1, 3, 5]), ("b", [1, 3, 5]), ("c", [1, 1, 5])]
    return onnx_model(nodes, [1, 7, 5], [1, 4, 5], [("sp", np.array([3, 3, 1], np.int64))],
                      infos=infos), [1, 7, 5]


def bn_inits(c):
    return [("g", RNG.uniform(0.5, 2.0, c).astype(np.float32)),
            ("b", RNG.normal(0, 0.5, c).astype(np.float32)),
            ("m", RNG.normal(0, 0.5, c).astype(np.float32)),
            ("v", RNG.uniform(0.2, 2.0, c).astype(np.float32))]


def bn_model(x_shape):
    c = x_shape[1]
    return onnx_model([helper.make_node("BatchNormalization", ["x", "g", "b", "m", "v"], ["y"],
                                        epsilon=1e-3)], x_shape, x_shape, bn_inits(c)), x_shape


def clip_model(lo, hi):
    names = ["x", "lo" if lo is not None else "", "hi" if hi is not None else ""]
    while not names[-1]:
        names.pop()
    inits = [(k, np.float32(v)) for k, v in (("lo", lo), ("hi", hi)) if v is not None]
    return onnx_model([helper.make_node("Clip", names, ["y"])], [1, 4, 6], [1, 4, 6], inits), \
        [1, 4, 6]


def softmax_model(axis, shape):
    return onnx_model([helper.make_node("Softmax", ["x"], ["y"], axis=axis)], shape, shape), \
        shape


MODELS = {
    "slice_step1": slice_model([1, 2], [4, 9], [1, 2], [1, 1], [1, 5, 10], [1, 3, 7]),
    "slice_step2": slice_model([0, 1], [5, 10], [1, 2], [2, 3], [1, 5, 10], [1, 3, 3]),
    "slice_negative_step": slice_model([4, -1], [-10, -11], [1, 2], [-1, -2], [1, 5, 10],
                                       [1, 5, 5]),
    "slice_nchw_channels": slice_model([1], [3], [1], [1], [1, 4, 3, 3], [1, 2, 3, 3]),
    "split": split_model(),
    "batchnorm_nchw": bn_model([1, 3, 4, 5]),
    "batchnorm_2d": bn_model([2, 6]),
    "clip_both": clip_model(-1.0, 2.5),
    "clip_min_only": clip_model(-0.5, None),
    "clip_max_only": clip_model(None, 1.5),
    "softmax_axis1_nchw": softmax_model(1, [1, 4, 3, 5]),
    "softmax_axis0": softmax_model(0, [6, 5]),
    "softmax_middle": softmax_model(1, [2, 7, 3]),
}


@pytest.mark.parametrize("name", sorted(MODELS))
def test_quantized_op_bit_exact_and_close_to_onnxruntime(name, tmp_path):
    model, shape = MODELS[name]
    q = check_emitted(model, shape, tmp_path, steps=2.0, lo=-3.0, hi=3.0)
    assert all(t.dtype in ("int8", "int32") for t in q.tensors.values()
               if t.name in q.inputs + q.outputs or not t.is_const)


def test_clip_bounds_are_active_and_exact():
    """The clamp lands on the quantized bounds themselves: every output at the low / high end
    equals round(bound / scale) + zero point of the input's quantization."""
    model, shape = MODELS["clip_both"]
    g = optimize(load(model))
    cal = [{"x": RNG.uniform(-3, 3, shape).astype(np.float32)} for _ in range(20)]
    q = quantize_graph(g, cal, method="minmax", run=RUN)
    xq = q.tensors[q.inputs[0]].quant
    assert q.tensors[q.outputs[0]].quant == xq  # max / min keep the input's parameters
    consts = sorted(int(t.data.reshape(-1)[0]) for t in q.tensors.values()
                    if t.is_const and t.dtype == "int8")
    s, z = xq.scale[0], xq.zero_point[0]
    assert consts == sorted([int(np.round(-1.0 / s)) + z, int(np.round(2.5 / s)) + z])
