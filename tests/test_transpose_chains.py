"""Transposes that do not cancel, against onnxruntime.

The layout passes (optimizer/layout.py) merge transpose chains, sink transposes below
elementwise ops and reductions, and turn some into reshapes. A wrong composition order or a
wrong permutation keeps every shape right on square tensors, so shape checks cannot catch it:
only values can. Here:

1. compose and inverse against numpy's own transpose, for every pair of permutations of rank 3
   and 4 and random pairs of rank 5.
2. Random models (onnx.helper): 1 to 4 transposes with random permutations on square and
   non-square shapes of rank 3 to 5, mixed with unary and binary elementwise ops (constants
   broadcast, residual adds of earlier tensors), reductions (with and without keepdims) and
   Conv (rank 3 and 4), optimized by the full
   pipeline and run by the loop-IR evaluator, against onnxruntime.
3. Some of those and hand-written cases (Conv -> Transpose(0, 1, 3, 2); a transposed square
   token matrix in a residual Add, as a small vision transformer exported by PyTorch at opset
   20 has) compiled to C, built and run on the host, against onnxruntime.

Reversing compose's order makes 1, 2 and 3 fail (checked by mutating it).
"""
import itertools
import zlib

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from mcuforge.codegen_c.evaluate_graph import run_graph
from mcuforge import runner
from mcuforge.api import load
from mcuforge.optimizer.layout import compose, inverse
from mcuforge.optimizer.pipeline import optimize

ort = pytest.importorskip("onnxruntime")

ATOL, RTOL = 1e-4, 1e-4


def _perms(rank):
    return [tuple(p) for p in itertools.permutations(range(rank))]


@pytest.mark.parametrize("rank", [3, 4, 5])
def test_compose_and_inverse_agree_with_numpy(rank):
    rng = np.random.default_rng(rank)
    shape = tuple(range(2, 2 + rank))  # distinct sizes: a wrong axis shows in the shape too
    x = rng.standard_normal(shape)
    pairs = list(itertools.product(_perms(rank), repeat=2))
    if rank == 5:
        pairs = [pairs[i] for i in rng.choice(len(pairs), 300, replace=False)]
    for p, q in pairs:
        want = np.transpose(np.transpose(x, p), q)
        np.testing.assert_array_equal(np.transpose(x, compose(p, q)), want, err_msg=f"{p} {q}")
        np.testing.assert_array_equal(np.transpose(np.transpose(x, p), inverse(p)), x)


# ---- random models -------------------------------------------------------------------------

def _info(name, shape=None):
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)


def random_chain(seed: int):
    """(ONNX model, input shape): a chain over one input with 1 to 4 transposes that are not
    all the identity, elementwise ops and Conv, ending in the graph output y."""
    rng = np.random.default_rng(seed)
    rank = int(rng.integers(3, 6))
    if seed % 2:  # square: every permutation keeps the shape
        shape = [1] + [int(rng.integers(2, 5))] * (rank - 1)
    else:
        shape = [1] + [int(v) for v in rng.choice(np.arange(2, 6), rank - 1, replace=False)]
    n_transposes = int(rng.integers(1, 5))
    steps = ["transpose"] * n_transposes + list(
        rng.choice(["unary", "const", "residual", "conv", "reduce"], int(rng.integers(1, 5))))
    rng.shuffle(steps)
    nodes, inits, seen = [], {}, [("x", list(shape))]
    cur, cur_shape = "x", list(shape)
    for k, step in enumerate(steps):
        out, rank = f"t{k}", len(cur_shape)
        if step == "transpose":
            perm = [int(p) for p in rng.permutation(rank)]
            while perm == list(range(rank)):
                perm = [int(p) for p in rng.permutation(rank)]
            nodes.append(helper.make_node("Transpose", [cur], [out], perm=perm))
            cur_shape = [cur_shape[p] for p in perm]
        elif step == "unary":
            nodes.append(helper.make_node(str(rng.choice(["Relu", "Sigmoid", "Neg"])), [cur],
                                          [out]))
        elif step == "const":  # a constant broadcast along some axes
            c_shape = [d if rng.random() < 0.6 else 1 for d in cur_shape]
            inits[f"c{k}"] = rng.standard_normal(c_shape).astype(np.float32)
            op = str(rng.choice(["Add", "Mul", "Sub"]))
            ins = [cur, f"c{k}"] if rng.random() < 0.7 else [f"c{k}", cur]
            nodes.append(helper.make_node(op, ins, [out]))
        elif step == "residual":  # an earlier tensor of the same shape, perhaps transposed
            same = [name for name, s in seen if s == cur_shape and name != cur]
            if same:
                other = same[int(rng.integers(len(same)))]
                nodes.append(helper.make_node(str(rng.choice(["Add", "Sub", "Mul"])),
                                              [cur, other], [out]))
            else:
                nodes.append(helper.make_node("Relu", [cur], [out]))
        elif step == "reduce":  # over one or two axes; without keepdims the rank drops
            axes = sorted(int(a) for a in rng.choice(rank, int(rng.integers(1, 3)), replace=False))
            keep = int(rank == 3 or rng.random() < 0.5)
            inits[f"axes{k}"] = np.array(axes, np.int64)
            op = str(rng.choice(["ReduceSum", "ReduceMean", "ReduceMax"]))
            nodes.append(helper.make_node(op, [cur, f"axes{k}"], [out], keepdims=keep))
            cur_shape = [1 if a in axes else d for a, d in enumerate(cur_shape)
                         if keep or a not in axes]
        else:  # conv: NCHW (rank 4) or NCW (rank 3), 1x1 or 2x2
            if rank not in (3, 4):
                nodes.append(helper.make_node("Neg", [cur], [out]))
            else:
                c_out = int(rng.integers(2, 5))
                kernel = [2 if d > 2 and rng.random() < 0.5 else 1 for d in cur_shape[2:]]
                inits[f"w{k}"] = rng.standard_normal([c_out, cur_shape[1], *kernel]).astype(
                    np.float32)
                inits[f"b{k}"] = rng.standard_normal(c_out).astype(np.float32)
                nodes.append(helper.make_node("Conv", [cur, f"w{k}", f"b{k}"], [out]))
                cur_shape = [cur_shape[0], c_out] + [d - kk + 1 for d, kk in
                                                     zip(cur_shape[2:], kernel)]
        cur = out
        seen.append((out, list(cur_shape)))
    nodes.append(helper.make_node("Relu", [cur], ["y"]) if rng.random() < 0.5
                 else helper.make_node("Identity", [cur], ["y"]))
    return _model(nodes, {"x": shape}, inits), shape


def _model(nodes, inputs: dict, inits: dict, opset=18):
    g = helper.make_graph(nodes, "chain", [_info(n, s) for n, s in inputs.items()],
                          [_info("y")],
                          [numpy_helper.from_array(v if v.dtype == np.int64
                                                   else np.asarray(v, np.float32), k)
                           for k, v in ((k, np.asarray(v)) for k, v in inits.items())])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)], ir_version=9)


def _reference(model, feeds):
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)[0]


def _feeds(model, seed):
    rng = np.random.default_rng(seed + 1000)
    return {i.name: rng.standard_normal([d.dim_value for d in i.type.tensor_type.shape.dim])
            .astype(np.float32) for i in model.graph.input}


def _assert_close(got, ref, what):
    assert got.shape == ref.shape, what
    np.testing.assert_allclose(got, ref, rtol=RTOL, atol=ATOL, err_msg=what)


def _transposes(model):
    return [tuple(n.attribute[0].ints) for n in model.graph.node if n.op_type == "Transpose"]


N_EVAL = 160


@pytest.mark.parametrize("block", range(4))
def test_random_chains_through_the_optimizer_match_onnxruntime(block):
    """The loop-IR evaluator runs the optimized graph: fast, and it is what the C computes
    (test_loop_ir checks that)."""
    merged = 0
    for seed in range(block, N_EVAL, 4):
        model, _ = random_chain(seed)
        feeds = _feeds(model, seed)
        g = optimize(load(model.SerializeToString()))
        merged += sum(n.op == "transpose" for n in g.nodes) < len(_transposes(model))
        got = run_graph(g, feeds)["y"]
        _assert_close(got, _reference(model, feeds), f"seed {seed}: {_transposes(model)}")
    assert merged >= 5  # the passes did change the chains


# ---- compiled to C -------------------------------------------------------------------------

def _conv_then_transpose():
    """Conv -> Transpose(0, 1, 3, 2): the layer's NHWC -> NCHW transpose merges with the
    user's into (0, 3, 2, 1); a wrong order gives another permutation of the same sizes."""
    rng = np.random.default_rng(7)
    w = rng.standard_normal((4, 3, 3, 3)).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Transpose", ["c"], ["y"], perm=[0, 1, 3, 2])]
    return _model(nodes, {"x": [1, 3, 5, 5]}, {"w": w})


def _vit_residual(transposed_first: bool):
    """A transposed square token matrix in a residual Add (opset 20): tokens [1, 4, 4] from a
    patch-embedding Conv (flatten(2).transpose(1, 2)), a Linear on them (MatMul + Add), and the
    sum of the two; a second Transpose(0, 2, 1) back, as a channel-first head reads it."""
    rng = np.random.default_rng(11)
    inits = {"pw": rng.standard_normal((4, 3, 2, 2)), "pb": rng.standard_normal(4),
             "shape": None, "W": rng.standard_normal((4, 4)), "B": rng.standard_normal(4),
             "pos": rng.standard_normal((1, 4, 4))}
    nodes = [helper.make_node("Conv", ["x", "pw", "pb"], ["p"], strides=[2, 2]),
             helper.make_node("Reshape", ["p", "shape"], ["f"]),
             helper.make_node("Transpose", ["f"], ["tok"], perm=[0, 2, 1]),
             helper.make_node("Add", ["tok", "pos"], ["e"]),
             helper.make_node("MatMul", ["e", "W"], ["m"]),
             helper.make_node("Add", ["m", "B"], ["lin"]),
             helper.make_node("Add", ["e", "lin"] if transposed_first else ["lin", "e"], ["s"]),
             helper.make_node("Transpose", ["s"], ["y"], perm=[0, 2, 1])]
    g = helper.make_graph(nodes, "vit", [_info("x", [1, 3, 4, 4])], [_info("y")],
                          [numpy_helper.from_array(np.asarray(v, np.float32), k)
                           for k, v in inits.items() if v is not None]
                          + [numpy_helper.from_array(np.array([1, 4, 4], np.int64), "shape")])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 20)], ir_version=9)


def _square_transpose_residual():
    """y = (x W + B) + transpose(x, (0, 2, 1)) on a [1, 4, 4] input, and the transposed
    operand transposed again (a chain of two on a square tensor)."""
    rng = np.random.default_rng(5)
    nodes = [helper.make_node("MatMul", ["x", "W"], ["m"]),
             helper.make_node("Add", ["m", "B"], ["a"]),
             helper.make_node("Transpose", ["x"], ["t"], perm=[0, 2, 1]),
             helper.make_node("Add", ["a", "t"], ["s"]),
             helper.make_node("Transpose", ["s"], ["u"], perm=[2, 0, 1]),
             helper.make_node("Transpose", ["u"], ["v"], perm=[0, 2, 1]),
             helper.make_node("Mul", ["v", "t"], ["y"])]
    return _model(nodes, {"x": [1, 4, 4]},
                  {"W": rng.standard_normal((4, 4)), "B": rng.standard_normal(4)}, opset=20)


FIXED = {"conv_then_transpose_0132": _conv_then_transpose,
         "vit_residual_transposed_first": lambda: _vit_residual(True),
         "vit_residual_transposed_second": lambda: _vit_residual(False),
         "square_transpose_residual": _square_transpose_residual}
C_SEEDS = [1, 3, 6, 9, 14, 21, 27, 33]


def _run_c(model, feeds):
    got = runner.run(model.SerializeToString(), feeds if len(feeds) > 1
                     else next(iter(feeds.values())))
    return got


@pytest.mark.parametrize("name", sorted(FIXED))
def test_fixed_chains_in_c_match_onnxruntime(name):
    model = FIXED[name]()
    feeds = _feeds(model, zlib.crc32(name.encode()))
    _assert_close(_run_c(model, feeds), _reference(model, feeds), name)


@pytest.mark.parametrize("seed", C_SEEDS)
def test_random_chains_in_c_match_onnxruntime(seed):
    model, _ = random_chain(seed)
    feeds = _feeds(model, seed)
    _assert_close(_run_c(model, feeds), _reference(model, feeds),
                  f"seed {seed}: {_transposes(model)}")
