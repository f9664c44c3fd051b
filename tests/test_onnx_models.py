"""Real float ONNX models exported by PyTorch and Keras (tests/models/*.onnx, made by
tests/models/make_onnx_models.py and make_keras_models.py; neither torch nor TensorFlow is needed
here).

1. Every model, compiled to C and run on the host, matches onnxruntime on 10 random inputs:
   max |ours - ref| / max |ref| <= 1e-4 per input; once more built with ASan and UBSan.
2. The structure of the generated code: every Conv (+ BatchNormalization) (+ Relu/Relu6) is one
   fused layer function, there are no batch-norm or activation kernels, and the NCHW <-> NHWC
   transposes the ONNX frontend puts around every layer all cancel: the only transpose left is
   the one at the NCHW input (none for the NHWC Keras model), none between layers.
3. Conv -> Reduce* (PyTorch's x.mean((2, 3)), the dynamo exporter's AdaptiveAvgPool2d): the
   layout pass moves the NHWC -> NCHW transpose below the reduce, values unchanged.
4. Conv -> Flatten -> Gemm on a feature map larger than 1x1 (LeNet): the fully-connected
   layer's weight columns are permuted at compile time instead of transposing the NHWC map.
5. A BatchNorm written as Mul and Add by per-channel constants (tf2onnx from Keras 3) folds
   into the layer before it like a BatchNormalization does.
"""
import re
import zlib
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from conftest import require

import mcuforge
from mcuforge import runner
from mcuforge.api import generate_project, load

ort = require("onnxruntime")

MODELS_DIR = Path(__file__).resolve().parent / "models"
MODELS = sorted(MODELS_DIR.glob("*.onnx"))
# the exported ones (make_onnx_models.py, make_keras_models.py), for the structure checks
EXPORTED = [p for p in MODELS if p.stem.startswith(("torch_", "keras_"))]
REL_TOL = 1e-4
N_INPUTS = 10
KERNEL_OPS = ("conv2d", "depthwise_conv2d", "fully_connected", "add", "avg_pool2d",
              "max_pool2d", "transpose", "reduce", "batch_norm", "relu", "relu6", "unary",
              "binary", "reshape", "mul")


def _ids(paths):
    return [p.stem for p in paths]


def _onnx_ops(path: Path) -> list:
    return [n.op_type for n in onnx.load(str(path)).graph.node]


def _inputs(path: Path, sess, n: int) -> np.ndarray:
    """n random inputs, stacked along a new leading axis, from a seed fixed by the model name."""
    (inp,) = sess.get_inputs()
    shape = [d if isinstance(d, int) else 1 for d in inp.shape]
    rng = np.random.default_rng(zlib.crc32(path.stem.encode()))
    return rng.standard_normal((n, *shape)).astype(np.float32)


def _reference(sess, xs: np.ndarray) -> np.ndarray:
    name = sess.get_inputs()[0].name
    return np.stack([sess.run(None, {name: x})[0] for x in xs])


def _rel_err(got: np.ndarray, ref: np.ndarray) -> float:
    return float(np.abs(got - ref).max() / np.abs(ref).max())


def _session(path: Path):
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


def test_models_present():
    stems = {p.stem for p in MODELS}
    assert {"torch_conv_bn_relu", "torch_mobile_block", "torch_resblock",
            "torch_resblock_evalfold", "torch_resblock_dynamo", "torch_lenet",
            "keras_small_cnn", "keras2_small_cnn"} <= stems, stems
    for p in MODELS:
        assert p.stat().st_size < 200_000, p


@pytest.mark.parametrize("path", MODELS, ids=_ids(MODELS))
def test_matches_onnxruntime(path):
    sess = _session(path)
    xs = _inputs(path, sess, N_INPUTS)
    ref = _reference(sess, xs)
    got = runner.run(str(path), xs)  # one build, the batch through the harness
    assert got.shape == ref.shape
    errors = [_rel_err(g, r) for g, r in zip(got, ref)]
    assert max(errors) <= REL_TOL, errors


@pytest.mark.parametrize("path", MODELS, ids=_ids(MODELS))
def test_sanitized(path):
    """Built with -fsanitize=address,undefined -fno-sanitize-recover: any finding fails the run."""
    sess = _session(path)
    x = _inputs(path, sess, 1)[0]
    got = runner.run(str(path), x, sanitize=True)
    assert _rel_err(got, _reference(sess, x[None])[0]) <= REL_TOL


def _functions(c_source: str) -> list:
    """(index, op) of every layer function in the generated model source, in order."""
    out = []
    for m in re.finditer(r"^MF_KERNEL static void (l\d+)_(\w+)\(", c_source, re.MULTILINE):
        name = m.group(2)
        op = next((k for k in sorted(KERNEL_OPS, key=len, reverse=True)
                   if name == k or name.startswith(k + "_")), name)
        out.append((m.group(1), op))
    return out


def _check_structure(path: Path, c_source: str, graph) -> dict:
    """The fusion and layout claims for one model; returns the op counts found."""
    onnx_ops = _onnx_ops(path)
    n_conv = onnx_ops.count("Conv")
    fns = _functions(c_source)
    ops = [op for _, op in fns]
    counts = {op: ops.count(op) for op in set(ops)}
    # every Conv (with its BN and activation) is one layer function
    assert ops.count("conv2d") + ops.count("depthwise_conv2d") == n_conv, fns
    assert counts.get("fully_connected", 0) == onnx_ops.count("Gemm") + onnx_ops.count("MatMul")
    for gone in ("batch_norm", "relu", "relu6", "unary", "mul", "binary"):
        assert gone not in ops, (gone, fns)
    # the optimized graph says the same: no batch_norm, no standalone clamp
    gops = [n.op for n in graph.nodes]
    assert "batch_norm" not in gops and "relu" not in gops and "relu6" not in gops, gops
    assert gops.count("conv2d") + gops.count("depthwise_conv2d") == n_conv, gops
    # transposes: none between layers. The PyTorch models (NCHW input, 2-D output) keep the
    # one at the input (NCHW -> NHWC); the Keras model's input is NHWC already: none at all
    where = [i for i, op in enumerate(ops) if op == "transpose"]
    assert where == ([0] if path.stem.startswith("torch_") else []), fns
    return counts


@pytest.mark.parametrize("path", EXPORTED, ids=_ids(EXPORTED))
def test_layers_fused_and_no_transposes_between(path):
    files, _, _, graph = generate_project(load(str(path)), "m")
    _check_structure(path, files["m.c"], graph)


def test_conv_bn_relu_compiled(tmp_path):
    """The Conv -> BN -> ReLU model through mcuforge.compile: each Conv+BN+ReLU is ONE conv2d
    function with a fused relu; the graph's only transpose is the NCHW input's."""
    path = MODELS_DIR / "torch_conv_bn_relu.onnx"
    assert _onnx_ops(path).count("BatchNormalization") == 2
    result = mcuforge.compile(str(path), tmp_path / "out", name="convbn")
    c = (tmp_path / "out" / "convbn.c").read_text()
    counts = _check_structure(path, c, result.graph)
    assert counts == {"transpose": 1, "conv2d": 2, "avg_pool2d": 1, "fully_connected": 1}, counts
    convs = [n for n in result.graph.nodes if n.op == "conv2d"]
    assert [n.attrs["activation"] for n in convs] == ["relu", "relu"]
    # the BN is folded into the weights and bias: the first Conv had no bias in the ONNX file
    assert all(len(n.inputs) == 3 and result.graph.tensors[n.inputs[2]].is_const for n in convs)


# reduce(transpose): the layout pass moves the NHWC -> NCHW transpose below the reduce. Cases:
# (ONNX axes, keepdims) -> transposes left besides the input's (one at the output where the
# result still has two axes longer than 1 out of NCHW order, or the reduce loops would change order)
REDUCE_CASES = {((2, 3), 0): 0, ((2, 3), 1): 0, ((1,), 0): 0, ((1,), 1): 0, ((3,), 0): 1,
                ((3,), 1): 1, ((2,), 1): 1, ((1, 2, 3), 0): 1, ((0, 2, 3), 1): 0, ((1, 3), 0): 1}


@pytest.mark.parametrize("op", ["ReduceMean", "ReduceMax", "ReduceSum"])
@pytest.mark.parametrize("axes,keepdims", list(REDUCE_CASES), ids=str)
def test_reduce_after_conv(op, axes, keepdims):
    """Conv -> Reduce*: the same values as onnxruntime, and no transpose of the conv's output
    left where the reduce can take the NHWC tensor directly."""
    rng = np.random.default_rng(zlib.crc32(f"{op}{axes}{keepdims}".encode()))
    info = lambda name, shape: helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)
    inits = [numpy_helper.from_array(rng.standard_normal((4, 3, 3, 3)).astype(np.float32), "w"),
             numpy_helper.from_array(np.asarray(axes, np.int64), "axes")]
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node(op, ["c", "axes"], ["y"], keepdims=keepdims)]
    g = helper.make_graph(nodes, "m", [info("x", [1, 3, 6, 5])], [info("y", None)], inits)
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)], ir_version=8)
    data = model.SerializeToString()
    x = rng.standard_normal((1, 3, 6, 5)).astype(np.float32)
    ref = ort.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    got = runner.run(data, x)
    assert got.shape == ref.shape
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)
    files, _, _, graph = generate_project(load(data), "m")
    ops = [op for _, op in _functions(files["m.c"])]
    assert ops.count("transpose") == 1 + REDUCE_CASES[(axes, keepdims)], ops
    assert ops[0] == "transpose"


def _conv_then(nodes_after, extra_inits: dict, x_shape, opset=17):
    """x -> Conv (4 channels, 3x3, pad 1) -> c -> nodes_after -> y, as serialized ONNX."""
    rng = np.random.default_rng(zlib.crc32(repr((x_shape, extra_inits.keys())).encode()))
    info = lambda name, shape: helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)
    inits = {"w": rng.standard_normal((4, x_shape[1], 3, 3)).astype(np.float32),
             **{k: (v(rng) if callable(v) else v) for k, v in extra_inits.items()}}
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]), *nodes_after]
    g = helper.make_graph(nodes, "m", [info("x", list(x_shape))], [info("y", None)],
                          [numpy_helper.from_array(v, k) for k, v in inits.items()])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)
    return model.SerializeToString(), rng.standard_normal(x_shape).astype(np.float32)


FLATTEN_CASES = {  # name -> (nodes after the conv, initializers, input shape, transposes left)
    "flatten_gemm": ([helper.make_node("Flatten", ["c"], ["f"]),
                      helper.make_node("Gemm", ["f", "fc", "fb"], ["y"], transB=1)],
                     {"fc": lambda r: r.standard_normal((5, 4 * 6 * 5)).astype(np.float32),
                      "fb": lambda r: r.standard_normal(5).astype(np.float32)},
                     (1, 3, 6, 5), 1),
    "batch2_reshape_matmul": ([helper.make_node("Reshape", ["c", "shape"], ["f"]),
                               helper.make_node("MatMul", ["f", "fc"], ["y"])],
                              {"shape": np.asarray([2, -1], np.int64),
                               "fc": lambda r: r.standard_normal((4 * 6 * 5, 3))
                               .astype(np.float32)},
                              (2, 3, 6, 5), 1),
    # rows of (channel, batch) pairs mix the batch: the transpose has to stay
    "rows_mix_batch": ([helper.make_node("Reshape", ["c", "shape"], ["f"]),
                        helper.make_node("MatMul", ["f", "fc"], ["y"])],
                       {"shape": np.asarray([8, -1], np.int64),
                        "fc": lambda r: r.standard_normal((6 * 5, 3)).astype(np.float32)},
                       (2, 3, 6, 5), 2),
}


@pytest.mark.parametrize("case", list(FLATTEN_CASES))
def test_flatten_into_fully_connected(case):
    after, inits, x_shape, transposes = FLATTEN_CASES[case]
    data, x = _conv_then(after, inits, x_shape)
    ref = ort.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    got = runner.run(data, x)
    assert got.shape == ref.shape
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-4)
    files, _, _, graph = generate_project(load(data), "m")
    ops = [op for _, op in _functions(files["m.c"])]
    assert ops.count("transpose") == transposes and ops[0] == "transpose", ops


def _vec(shape):
    return lambda r: (r.random(shape) + 0.5).astype(np.float32)


SCALE_SHIFT_CASES = {  # name -> (nodes after the conv, initializers, kernels left besides conv)
    "mul_add_relu": ([helper.make_node("Mul", ["c", "s"], ["m"]),
                      helper.make_node("Add", ["t", "m"], ["a"]),
                      helper.make_node("Relu", ["a"], ["y"])],
                     {"s": _vec((1, 4, 1, 1)), "t": _vec((4, 1, 1))}, []),
    "sub_then_mul": ([helper.make_node("Sub", ["c", "t"], ["d"]),
                      helper.make_node("Mul", ["d", "s"], ["y"])],
                     {"s": _vec((1, 4, 1, 1)), "t": _vec((1, 4, 1, 1))}, []),
    "scalar_mul": ([helper.make_node("Mul", ["c", "s"], ["y"])], {"s": _vec(())}, []),
    # per row, not per channel: stays a mul
    "per_row_mul": ([helper.make_node("Mul", ["c", "s"], ["y"])], {"s": _vec((1, 1, 6, 1))},
                    ["mul"]),
    # c - layer(x) is not layer(x) - c: stays
    "const_minus_conv": ([helper.make_node("Sub", ["t", "c"], ["y"])],
                         {"t": _vec((1, 4, 1, 1))}, ["binary"]),
}


@pytest.mark.parametrize("case", list(SCALE_SHIFT_CASES))
def test_scale_shift_folds_into_conv(case):
    after, inits, left = SCALE_SHIFT_CASES[case]
    data, x = _conv_then(after, inits, (1, 3, 6, 5))
    ref = ort.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(runner.run(data, x), ref, rtol=1e-5, atol=1e-5)
    files, _, _, graph = generate_project(load(data), "m")
    ops = [op for _, op in _functions(files["m.c"])]
    assert [op for op in ops if op not in ("transpose", "conv2d")] == left, ops
    assert ops.count("conv2d") == 1


def test_scale_shift_after_depthwise_and_gemm():
    """Depthwise conv -> Mul -> Add, and Gemm -> Mul: both folded."""
    rng = np.random.default_rng(5)
    info = lambda name, shape: helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)
    inits = {"dw": rng.standard_normal((3, 1, 3, 3)), "s": rng.random((1, 3, 1, 1)) + 0.5,
             "t": rng.standard_normal((1, 3, 1, 1)), "fc": rng.standard_normal((3, 7)),
             "u": rng.random(7) + 0.5}
    nodes = [helper.make_node("Conv", ["x", "dw"], ["c"], group=3, pads=[1, 1, 1, 1]),
             helper.make_node("Mul", ["c", "s"], ["m"]),
             helper.make_node("Add", ["m", "t"], ["a"]),
             helper.make_node("GlobalAveragePool", ["a"], ["p"]),
             helper.make_node("Flatten", ["p"], ["f"]),
             helper.make_node("Gemm", ["f", "fc"], ["g"]),
             helper.make_node("Mul", ["g", "u"], ["y"])]
    g = helper.make_graph(nodes, "m", [info("x", [1, 3, 5, 5])], [info("y", None)],
                          [numpy_helper.from_array(np.asarray(v, np.float32), k)
                           for k, v in inits.items()])
    data = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)],
                             ir_version=8).SerializeToString()
    x = rng.standard_normal((1, 3, 5, 5)).astype(np.float32)
    ref = ort.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(runner.run(data, x), ref, rtol=1e-5, atol=1e-5)
    files, _, _, _ = generate_project(load(data), "m")
    ops = [op for _, op in _functions(files["m.c"])]
    assert ops == ["transpose", "depthwise_conv2d", "avg_pool2d", "fully_connected"], ops
