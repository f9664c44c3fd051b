"""NaN and infinities in float inputs: the generated C computes with them as IEEE arithmetic
does and as the references do, and `mcuforge run` warns about them.

1. Per float op family (relu, clip, the relu6 a Clip(0, 6) becomes, a Relu fused into a Conv,
   leaky relu, sigmoid, tanh, max, min, average and global average pooling, softmax, log
   softmax, conv, matmul, argmax, argmin), inputs holding NaN, +Inf and -Inf, against
   onnxruntime: NaN in the same places, infinities equal, the rest close.
2. Max pooling and ReduceMax/ReduceMin: onnxruntime's own result on NaN is
   implementation-defined (its x86 kernels use SSE max, which returns its second operand when
   one is NaN, so the result depends on where the NaN sits: ReduceMax([1, NaN, 3, 4]) is 3,
   ReduceMax([NaN, 1, 2, 3]) NaN; MaxPool's window of -Inf gives -FLT_MAX). The reference here is
   IEEE 754-2019 maximum/minimum as numpy computes them (NaN anywhere gives NaN); onnxruntime
   agrees wherever the window holds no NaN and is not all -Inf, and wherever it gives NaN, so
   do we. (LiteRT's float MaxPool is implementation-defined too: it drops a NaN, and a window
   whose first element is NaN gives -Inf, as measured with ai-edge-litert.)
3. Whole models: an all-NaN and an +Inf input through PyTorch exports (tests/models) against
   onnxruntime and float MLPerf Tiny TFLite models against LiteRT, NaN and
   infinities where onnxruntime has them, never a finite "confident" output in their place.
4. `mcuforge run` prints one warning on stderr naming the input and what it holds.
"""
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from mcuforge import runner

ort = pytest.importorskip("onnxruntime")

NAN, INF = np.float32(np.nan), np.float32(np.inf)
MODELS_DIR = Path(__file__).resolve().parent / "models"


def _model(nodes, inputs: dict, inits: dict, out_type=TensorProto.FLOAT):
    g = helper.make_graph(
        nodes, "m", [helper.make_tensor_value_info(k, TensorProto.FLOAT, list(v.shape))
                     for k, v in inputs.items()],
        [helper.make_tensor_value_info("y", out_type, None)],
        [numpy_helper.from_array(np.asarray(v), k) for k, v in inits.items()])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)], ir_version=8)


def _both(model, feeds):
    ref = ort.InferenceSession(model.SerializeToString(),
                               providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    got = runner.run(model.SerializeToString(),
                     feeds if len(feeds) > 1 else next(iter(feeds.values())))
    return np.asarray(got), ref


def _assert_same_nonfinite(got, ref, what=""):
    assert got.shape == ref.shape, what
    np.testing.assert_array_equal(np.isnan(got), np.isnan(ref), err_msg=f"{what}: NaN places")
    np.testing.assert_array_equal(np.isposinf(got), np.isposinf(ref), err_msg=f"{what}: +Inf")
    np.testing.assert_array_equal(np.isneginf(got), np.isneginf(ref), err_msg=f"{what}: -Inf")
    fin = np.isfinite(ref)
    np.testing.assert_allclose(got[fin], ref[fin], rtol=1e-5, atol=1e-6, err_msg=what)


def _rows():
    """Rows of 4: none, one or all NaN; infinities of each sign; mixed."""
    return np.array([[1, 2, 3, 4], [1, NAN, 3, 4], [NAN, NAN, NAN, NAN], [1, INF, 3, 4],
                     [-INF, -INF, -INF, -INF], [INF, INF, 1, 2], [1, 2, -INF, 0],
                     [NAN, 1, 2, 3], [1, 2, 3, NAN], [-INF, 1, 2, INF], [NAN, INF, -INF, 0],
                     [-3, -1, -2, -5]], np.float32)


def _vector():
    return np.array([[NAN, 1, -INF, INF, -2, 0, 7, -0.5, NAN, 3]], np.float32)


def _node(op, ins=("x",), **attrs):
    return helper.make_node(op, list(ins), ["y"], **attrs)


ELEMENTWISE = {
    "relu": ([_node("Relu")], {}),
    "clip_0_6": ([_node("Clip", ("x", "lo", "hi"))],  # becomes relu6
                 {"lo": np.float32(0), "hi": np.float32(6)}),
    "clip_-1_2": ([_node("Clip", ("x", "lo", "hi"))], {"lo": np.float32(-1), "hi": np.float32(2)}),
    "leaky_relu": ([_node("LeakyRelu", alpha=0.1)], {}),
    "sigmoid": ([_node("Sigmoid")], {}),
    "tanh": ([_node("Tanh")], {}),
    "softmax": ([_node("Softmax", axis=-1)], {}),
    "log_softmax": ([_node("LogSoftmax", axis=-1)], {}),
}


@pytest.mark.parametrize("name", sorted(ELEMENTWISE))
def test_elementwise_and_softmax_rows_like_onnxruntime(name):
    nodes, inits = ELEMENTWISE[name]
    for x in (_vector(), _rows()):
        got, ref = _both(_model(nodes, {"x": x}, inits), {"x": x})
        _assert_same_nonfinite(got, ref, name)


@pytest.mark.parametrize("op", ["Max", "Min", "Add", "Mul"])
def test_binary_like_onnxruntime(op):
    a = np.array([[NAN, 1, NAN, INF, -2, -INF, INF, 0]], np.float32)
    b = np.array([[2, NAN, NAN, -INF, INF, -INF, INF, INF]], np.float32)
    got, ref = _both(_model([_node(op, ("a", "b"))], {"a": a, "b": b}, {}), {"a": a, "b": b})
    _assert_same_nonfinite(got, ref, op)


def _pool_input():
    return _rows().reshape(1, 12, 2, 2)  # one 2x2 window per channel


@pytest.mark.parametrize("op", ["AveragePool", "GlobalAveragePool"])
def test_average_pooling_like_onnxruntime(op):
    x = _pool_input()
    attrs = {"kernel_shape": [2, 2]} if op == "AveragePool" else {}
    got, ref = _both(_model([_node(op, **attrs)], {"x": x}, {}), {"x": x})
    _assert_same_nonfinite(got, ref, op)


def _check_extreme(got, x, axis, fn, ort_ref):
    """got against numpy's IEEE max/min, and against onnxruntime where it is defined."""
    want = (np.max if fn == "max" else np.min)(x, axis=axis)
    _assert_same_nonfinite(got.reshape(want.shape), want, f"{fn} vs numpy")
    ort_ref = ort_ref.reshape(want.shape)
    assert np.isnan(got.reshape(want.shape))[np.isnan(ort_ref)].all()
    defined = ~np.isnan(x).any(axis=axis) & ~np.isneginf(x).all(axis=axis)
    np.testing.assert_array_equal(got.reshape(want.shape)[defined], ort_ref[defined])


@pytest.mark.parametrize("op", ["MaxPool", "GlobalMaxPool"])
def test_max_pooling_propagates_nan(op):
    x = _pool_input()
    attrs = {"kernel_shape": [2, 2]} if op == "MaxPool" else {}
    got, ref = _both(_model([_node(op, **attrs)], {"x": x}, {}), {"x": x})
    _check_extreme(got, x.reshape(12, 4), 1, "max", ref)


@pytest.mark.parametrize("op", ["ReduceMax", "ReduceMin"])
def test_reduce_max_min_propagate_nan(op):
    x = _rows()
    axes = np.array([1], np.int64)
    got, ref = _both(_model([_node(op, ("x", "axes"), keepdims=0)], {"x": x}, {"axes": axes}),
                     {"x": x})
    _check_extreme(got, x, 1, op[-3:].lower(), ref)


@pytest.mark.parametrize("op", ["ArgMax", "ArgMin"])
def test_arg_max_min_like_onnxruntime(op):
    x = _rows()
    got, ref = _both(_model([_node(op, axis=1)], {"x": x}, {}, TensorProto.INT64), {"x": x})
    np.testing.assert_array_equal(got, ref)


def test_conv_with_fused_relu_and_matmul_like_onnxruntime():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, 2, 5, 5)).astype(np.float32)
    x[0, 0, 1, 1], x[0, 1, 3, 3], x[0, 0, 4, 0] = NAN, INF, -INF
    w = rng.standard_normal((3, 2, 3, 3)).astype(np.float32)
    for act in ([], ["Relu"]):
        nodes = [helper.make_node("Conv", ["x", "w"], ["c" if act else "y"], pads=[1, 1, 1, 1])]
        nodes += [helper.make_node("Relu", ["c"], ["y"])] if act else []
        got, ref = _both(_model(nodes, {"x": x}, {"w": w}), {"x": x})
        _assert_same_nonfinite(got, ref, f"conv {act}")
    a = _rows()
    w2 = rng.standard_normal((4, 3)).astype(np.float32)
    got, ref = _both(_model([_node("MatMul", ("x", "w"))], {"x": a}, {"w": w2}), {"x": a})
    _assert_same_nonfinite(got, ref, "matmul")


@pytest.mark.parametrize("stem", ["torch_conv_bn_relu", "torch_resblock", "torch_lenet"])
def test_models_on_nan_and_inf_inputs_like_onnxruntime(stem):
    path = MODELS_DIR / f"{stem}.onnx"
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    inp = sess.get_inputs()[0]
    shape = [d if isinstance(d, int) else 1 for d in inp.shape]
    rng = np.random.default_rng(1)
    some = rng.standard_normal(shape).astype(np.float32)
    some.reshape(-1)[rng.choice(some.size, 3, replace=False)] = [NAN, INF, -INF]
    for x in (np.full(shape, NAN, np.float32), np.full(shape, INF, np.float32), some):
        ref = sess.run(None, {inp.name: x})[0]
        got = runner.run(path, x)
        _assert_same_nonfinite(got, ref, stem)
        assert not np.isfinite(got).all()  # a NaN input never gives a clean answer


def test_run_warns_about_nonfinite_inputs(tmp_path):
    x = np.zeros((1, 3, 4), np.float32)
    x[0, 0, :2], x[0, 2, 3] = NAN, -INF
    model = _model([_node("Relu")], {"x": x}, {})
    (tmp_path / "m.onnx").write_bytes(model.SerializeToString())
    np.save(tmp_path / "x.npy", x)
    cli = [sys.executable, "-m", "mcuforge.cli", "run", str(tmp_path / "m.onnx"), "--input",
           str(tmp_path / "x.npy"), "--output", str(tmp_path / "y.npy")]
    r = subprocess.run(cli, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    warnings = [ln for ln in r.stderr.splitlines() if "warning" in ln]
    assert len(warnings) == 1 and "'x'" in warnings[0] and "2 NaN" in warnings[0] \
        and "1 -Inf" in warnings[0], r.stderr
    np.testing.assert_array_equal(np.isnan(np.load(tmp_path / "y.npy")), np.isnan(x))
    np.save(tmp_path / "x.npy", np.ones_like(x))  # finite: no warning
    r = subprocess.run(cli, capture_output=True, text=True)
    assert r.returncode == 0 and "warning" not in r.stderr, r.stderr


@pytest.mark.parametrize("stem", ["pretrainedResnet", "vww_96_float"])
def test_tflite_float_models_on_nan_and_inf_inputs_like_litert(stem):
    """(Not the hybrid KWS model: LiteRT quantizes its activations on the fly, and what a NaN
    becomes as int8 there is implementation-defined; it gives finite outputs for one NaN.)"""
    from conftest import mlperf_model
    from mcuforge.api import load
    from test_tflite_float import litert
    path = mlperf_model(stem)
    g = load(path)
    shape = g.tensors[g.inputs[0]].shape
    rng = np.random.default_rng(2)
    some = rng.standard_normal(shape).astype(np.float32)
    some.reshape(-1)[rng.choice(some.size, 3, replace=False)] = [NAN, INF, -INF]
    xs = np.stack([np.full(shape, NAN, np.float32), np.full(shape, INF, np.float32), some])
    got = runner.run(path, xs)
    ref = litert(path, xs).reshape(got.shape)
    for i in range(len(xs)):
        _assert_same_nonfinite(got[i], ref[i], f"{stem} input {i}")
