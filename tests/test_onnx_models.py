"""Real float ONNX models exported by PyTorch and Keras (tests/models/*.onnx, made by
tests/models/make_onnx_models.py and make_keras_models.py; neither torch nor TensorFlow is needed
here).

1. Every model, compiled to C and run on the host, matches onnxruntime on 10 random inputs:
   max |ours - ref| / max |ref| <= 1e-4 per input; once more built with ASan and UBSan.
2. The structure of the generated code: every Conv (+ BatchNormalization) (+ Relu/Relu6) is one
   fused layer function, there are no batch-norm or activation kernels, and the NCHW <-> NHWC
   transposes the ONNX frontend puts around every layer all cancel: the only transpose left is
   the one at the NCHW input (none for the NHWC Keras model), none between layers.
"""
import re
import zlib
from pathlib import Path

import numpy as np
import onnx
import pytest

import mcuforge
from mcuforge import runner
from mcuforge.api import generate_project, load

ort = pytest.importorskip("onnxruntime")

MODELS_DIR = Path(__file__).resolve().parent / "models"
MODELS = sorted(MODELS_DIR.glob("*.onnx"))
REL_TOL = 1e-4
N_INPUTS = 10
# layer functions in the generated C: static void l<index>_<op>_<tensor>(...)
FUNCTION = re.compile(r"^static void (l\d+)_([a-z0-9]+(?:_[a-z0-9]+)*?)_[A-Za-z0-9_]*\(",
                      re.MULTILINE)
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
            "torch_resblock_evalfold"} <= stems, stems
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
    for m in re.finditer(r"^static void (l\d+)_(\w+)\(", c_source, re.MULTILINE):
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
    for gone in ("batch_norm", "relu", "relu6", "unary"):
        assert gone not in ops, (gone, fns)
    # the optimized graph says the same: no batch_norm, no standalone clamp
    gops = [n.op for n in graph.nodes]
    assert "batch_norm" not in gops and "relu" not in gops and "relu6" not in gops, gops
    assert gops.count("conv2d") + gops.count("depthwise_conv2d") == n_conv, gops
    # transposes: at most one, at the very input (NCHW -> NHWC); none between layers
    nchw_input = len(graph.tensors[graph.inputs[0]].shape) == 4 \
        and graph.tensors[graph.inputs[0]].shape[1] == 3
    where = [i for i, op in enumerate(ops) if op == "transpose"]
    assert where == ([0] if nchw_input else []), fns
    return counts


@pytest.mark.parametrize("path", MODELS, ids=_ids(MODELS))
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
