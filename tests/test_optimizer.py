"""Optimizer passes: each test shows a graph before and after a pass (one line per node,
`op(inputs) -> outputs [attributes]`) and checks the values are unchanged by running both
graphs through the lowering and the loop-IR evaluator."""
import numpy as np
import pytest

from mcuforge.codegen_c.evaluate_graph import run_graph
from mcuforge.ir.graph import Graph, Node, Quant, Tensor, verify
from mcuforge.optimizer.fold import fold_constants
from mcuforge.optimizer.fuse import fold_batch_norms, fuse_activations
from mcuforge.optimizer.layout import merge_transposes, sink_transposes, transposes_to_reshapes
from mcuforge.optimizer.passes import remove_dead_nodes, remove_identities
from mcuforge.optimizer.pipeline import PIPELINE, optimize

RNG = np.random.default_rng(7)
NCHW_TO_NHWC, NHWC_TO_NCHW = (0, 2, 3, 1), (0, 3, 1, 2)
SHOWN = ("perm", "activation", "fn", "min", "max")


def f32(*shape, lo=-1.0, hi=1.0):
    return RNG.uniform(lo, hi, size=shape).astype(np.float32)


def graph(inputs: dict, consts: dict, nodes: list, outputs: dict) -> Graph:
    """inputs/outputs/intermediates: name -> shape (float32 unless a Tensor); consts: name ->
    array; nodes: (op, inputs, outputs, attrs)."""
    tensors = {}
    for name, v in {**inputs, **outputs}.items():
        tensors[name] = v if isinstance(v, Tensor) else Tensor(name, tuple(v), "float32")
    for name, a in consts.items():
        tensors[name] = Tensor(name, a.shape, a.dtype.name, a)
    ns = []
    for op, ins, outs, attrs in nodes:
        for o in outs:
            if isinstance(o, Tensor):
                tensors[o.name] = o
        ns.append(Node(op, tuple(ins), tuple(o.name if isinstance(o, Tensor) else o
                                              for o in outs), attrs))
    return verify(Graph(tensors, ns, list(inputs), [o for o in outputs if o in tensors]))


def t(name, *shape, dtype="float32", quant=None):
    return Tensor(name, tuple(shape), dtype, None, quant)


def text(g: Graph) -> list:
    """One line per node: op(inputs) -> outputs [shown attributes]."""
    lines = []
    for n in g.nodes:
        attrs = ", ".join(f"{k}={n.attrs[k]}" for k in SHOWN if k in n.attrs
                          and n.attrs[k] not in ("none", None))
        lines.append(f"{n.op}({', '.join(n.inputs)}) -> {', '.join(n.outputs)}"
                     + (f" [{attrs}]" if attrs else ""))
    return lines


def evaluate(g: Graph, feeds: dict) -> list:
    """The graph's outputs, each node run by its lowering in the loop-IR evaluator."""
    return list(run_graph(g, feeds).values())


def same_values(before: Graph, after: Graph, rtol=1e-5, atol=1e-5):
    feeds = {n: f32(*before.tensors[n].shape) for n in before.inputs}
    for a, b in zip(evaluate(before, feeds), evaluate(after, feeds)):
        np.testing.assert_allclose(b, a, rtol=rtol, atol=atol)


def conv(x, w, b, y, **kw):
    attrs = dict(stride=(1, 1), dilation=(1, 1), padding=(0, 0, 0, 0), activation="none")
    return ("conv2d", [x, w] + ([b] if b else []), [y], {**attrs, **kw})


# ---- constant folding, identities, dead code -------------------------------------------------

def test_constant_folding_turns_all_constant_chains_into_constants():
    g = graph({"x": (2, 3)}, {"w": f32(3, 2), "k": f32(2, 3), "i": np.arange(6, dtype=np.int32)},
              [("transpose", ["w"], [t("wt", 2, 3)], {"perm": (1, 0)}),
               ("binary", ["wt", "k"], [t("s", 2, 3)], {"fn": "mul"}),
               ("cast", ["i"], [t("f", 6)], {}),
               ("reshape", ["f"], [t("f2", 2, 3)], {}),
               ("add", ["s", "f2"], [t("c", 2, 3)], {"activation": "none"}),
               ("add", ["x", "c"], ["y"], {"activation": "none"})], {"y": (2, 3)})
    assert text(g) == ["transpose(w) -> wt [perm=(1, 0)]", "binary(wt, k) -> s [fn=mul]",
                       "cast(i) -> f", "reshape(f) -> f2", "add(s, f2) -> c", "add(x, c) -> y"]
    after = fold_constants(g)
    assert text(after) == ["add(x, c) -> y"]
    expected = g.tensors["w"].data.T * g.tensors["k"].data + np.arange(6).reshape(2, 3)
    np.testing.assert_array_equal(after.tensors["c"].data, expected.astype(np.float32))


def test_constant_folding_leaves_outputs_quantized_and_unknown_ops():
    q = Quant((0.5,), (0,))
    g = graph({"x": (4,)}, {"a": f32(4), "qa": np.ones(4, np.int8)},
              [("unary", ["a"], [t("e", 4)], {"fn": "erf"}),  # not evaluated by this pass
               # quantized arithmetic is the runtime's (moves of raw values do fold)
               ("binary", ["qa", "qa"], [t("qb", 4, dtype="int8", quant=q)], {"fn": "add"}),
               ("add", ["x", "e"], [t("s", 4)], {"activation": "none"}),
               ("unary", ["a"], ["y2"], {"fn": "neg"})],  # a graph output
              {"s": (4,), "y2": (4,)})
    assert text(fold_constants(g)) == text(g)


def test_identity_removal_rewires_consumers_and_keeps_io_names():
    g = graph({"x": (1, 4)}, {},
              [("reshape", ["x"], [t("i1", 1, 4)], {}),  # Identity: consumers read x
               ("relu", ["i1"], [t("r", 1, 4)], {}),
               ("reshape", ["r"], [t("flat", 4)], {}),  # a real reshape stays
               ("reshape", ["flat"], ["y"], {}),  # to a graph output: flat is renamed y
               ("reshape", ["x"], ["passthrough"], {})],  # input -> output: must stay
              {"y": (4,), "passthrough": (1, 4)})
    after = remove_identities(g)
    assert text(after) == ["relu(x) -> r", "reshape(r) -> y", "reshape(x) -> passthrough"]
    assert after.inputs == ["x"] and after.outputs == ["y", "passthrough"]
    same_values(g, after)


def test_dead_code_elimination():
    g = graph({"x": (4,)}, {"c": f32(4)},
              [("relu", ["x"], [t("unused", 4)], {}),
               ("add", ["x", "c"], ["y"], {"activation": "none"})], {"y": (4,)})
    after = remove_dead_nodes(g)
    assert text(after) == ["add(x, c) -> y"] and "unused" not in after.tensors


# ---- batch norm folding and activation fusion ----------------------------------------------

def _bn_consts(c):
    return {"scale": f32(c, lo=0.5, hi=2), "beta": f32(c), "mean": f32(c),
            "var": f32(c, lo=0.5, hi=2)}


BN_ATTRS = {"epsilon": 1e-5}
BN_INPUTS = ["scale", "beta", "mean", "var"]


@pytest.mark.parametrize("layer", ["conv2d", "conv2d_no_bias", "depthwise_conv2d",
                                   "fully_connected"])
def test_batch_norm_folds_into_the_layer(layer):
    if layer.startswith("conv2d"):
        consts = {"w": f32(4, 3, 3, 2), "b": f32(4)}
        node = conv("x", "w", None if layer.endswith("no_bias") else "b", t("z", 1, 3, 3, 4))
        x, y = (1, 5, 5, 2), (1, 3, 3, 4)
    elif layer == "depthwise_conv2d":
        consts = {"w": f32(1, 3, 3, 4), "b": f32(4)}
        node = ("depthwise_conv2d", ["x", "w", "b"], [t("z", 1, 3, 3, 4)],
                dict(stride=(1, 1), dilation=(1, 1), padding=(0, 0, 0, 0), depth_multiplier=2,
                     activation="none"))
        x, y = (1, 5, 5, 2), (1, 3, 3, 4)
    else:
        consts = {"w": f32(4, 6), "b": f32(4)}
        node = ("fully_connected", ["x", "w", "b"], [t("z", 2, 4)], {"activation": "none"})
        x, y = (2, 6), (2, 4)
    g = graph({"x": x}, {**consts, **_bn_consts(4)},
              [node, ("batch_norm", ["z", *BN_INPUTS], ["y"], BN_ATTRS)], {"y": y})
    assert text(g) == [text(g)[0], "batch_norm(z, scale, beta, mean, var) -> y"]
    after = remove_dead_nodes(fold_batch_norms(g))
    bias = "b__bn_bias" if layer != "conv2d_no_bias" else "y__bn_bias"
    assert text(after) == [f"{node[0]}(x, w__bn, {bias}) -> y"]
    same_values(g, after)


def test_batch_norm_stays_when_the_layer_output_has_another_reader():
    g = graph({"x": (2, 6)}, {"w": f32(4, 6), **_bn_consts(4)},
              [("fully_connected", ["x", "w"], [t("z", 2, 4)], {"activation": "relu"}),
               ("batch_norm", ["z", *BN_INPUTS], ["y"], BN_ATTRS)], {"y": (2, 4)})
    assert text(fold_batch_norms(g)) == text(g)  # fused activation first: not a plain affine
    g = graph({"x": (2, 6)}, {"w": f32(4, 6), **_bn_consts(4)},
              [("fully_connected", ["x", "w"], ["z"], {"activation": "none"}),
               ("batch_norm", ["z", *BN_INPUTS], ["y"], BN_ATTRS)], {"y": (2, 4), "z": (2, 4)})
    assert text(fold_batch_norms(g)) == text(g)


@pytest.mark.parametrize("act,attrs,fused", [
    ("relu", {}, "relu"), ("relu6", {}, "relu6"),
    ("unary", {"fn": "clip", "min": 0.0, "max": 6.0}, "relu6"),
    ("unary", {"fn": "clip", "min": -1.0, "max": 1.0}, "relu_n1_to_1"),
])
def test_activation_fuses_into_the_producer(act, attrs, fused):
    g = graph({"x": (1, 4, 4, 2)}, {"w": f32(3, 1, 1, 2, lo=-4, hi=4)},
              [conv("x", "w", None, t("z", 1, 4, 4, 3)), (act, ["z"], ["y"], attrs)],
              {"y": (1, 4, 4, 3)})
    assert text(g)[0] == "conv2d(x, w) -> z"
    after = fuse_activations(g)
    assert text(after) == [f"conv2d(x, w) -> y [activation={fused}]"]
    same_values(g, after)


def test_activation_fuses_after_add_and_pools_but_not_other_clips():
    pool = dict(filter=(2, 2), stride=(2, 2), padding=(0, 0, 0, 0), activation="none")
    g = graph({"a": (1, 4, 4, 2), "b": (1, 4, 4, 2)}, {},
              [("add", ["a", "b"], [t("s", 1, 4, 4, 2)], {"activation": "none"}),
               ("unary", ["s"], [t("r", 1, 4, 4, 2)], {"fn": "clip", "min": 0.0, "max": 6.0}),
               ("max_pool2d", ["r"], [t("p", 1, 2, 2, 2)], pool),
               ("relu", ["p"], [t("q", 1, 2, 2, 2)], {}),
               ("avg_pool2d", ["q"], [t("v", 1, 1, 1, 2)], pool),
               ("unary", ["v"], ["y"], {"fn": "clip", "min": 0.0, "max": 0.5})],
              {"y": (1, 1, 1, 2)})
    after = fuse_activations(g)
    assert text(after) == ["add(a, b) -> r [activation=relu6]",
                           "max_pool2d(r) -> q [activation=relu]",
                           "avg_pool2d(q) -> v", "unary(v) -> y [fn=clip, min=0.0, max=0.5]"]
    same_values(g, after)


def test_activation_never_fuses_into_int8_or_a_shared_output():
    q = Quant((0.1,), (-3,))
    g = graph({"a": t("a", 4, dtype="int8", quant=q), "b": t("b", 4, dtype="int8", quant=q)}, {},
              [("add", ["a", "b"], [t("s", 4, dtype="int8", quant=q)], {"activation": "none"}),
               ("relu", ["s"], ["y"], {})], {"y": t("y", 4, dtype="int8", quant=Quant((0.1,),
                                                                                     (-128,)))})
    assert text(fuse_activations(g)) == text(g)
    g = graph({"a": (4,), "b": (4,)}, {},
              [("add", ["a", "b"], ["s"], {"activation": "none"}),
               ("relu", ["s"], ["y"], {})], {"y": (4,), "s": (4,)})
    assert text(fuse_activations(g)) == text(g)


# ---- layout: transposes --------------------------------------------------------------------

def test_a_transpose_and_its_inverse_cancel_and_chains_merge():
    g = graph({"x": (1, 2, 3, 4)}, {},
              [("transpose", ["x"], [t("a", 1, 3, 4, 2)], {"perm": NCHW_TO_NHWC}),
               ("transpose", ["a"], [t("b", 1, 2, 3, 4)], {"perm": NHWC_TO_NCHW}),
               ("relu", ["b"], [t("r", 1, 2, 3, 4)], {}),
               ("transpose", ["r"], [t("c", 2, 1, 3, 4)], {"perm": (1, 0, 2, 3)}),
               ("transpose", ["c"], ["y"], {"perm": (0, 1, 3, 2)})], {"y": (2, 1, 4, 3)})
    assert text(g) == ["transpose(x) -> a [perm=(0, 2, 3, 1)]",
                       "transpose(a) -> b [perm=(0, 3, 1, 2)]", "relu(b) -> r",
                       "transpose(r) -> c [perm=(1, 0, 2, 3)]",
                       "transpose(c) -> y [perm=(0, 1, 3, 2)]"]
    after = merge_transposes(g)
    assert text(after) == ["relu(x) -> r", "transpose(r) -> y [perm=(1, 0, 3, 2)]"]
    same_values(g, after)


def test_transposes_sink_through_elementwise_ops_to_meet_their_inverse():
    g = graph({"x": (1, 2, 2, 3), "x2": (1, 2, 2, 3)}, {"c": f32(3, 1, 1), "k": f32(1)},
              [("transpose", ["x"], [t("a", 1, 3, 2, 2)], {"perm": NHWC_TO_NCHW}),
               ("transpose", ["x2"], [t("a2", 1, 3, 2, 2)], {"perm": NHWC_TO_NCHW}),
               ("binary", ["a", "c"], [t("s", 1, 3, 2, 2)], {"fn": "sub"}),  # per channel
               ("unary", ["s"], [t("e", 1, 3, 2, 2)], {"fn": "abs"}),
               ("mul", ["e", "k"], [t("m", 1, 3, 2, 2)], {"activation": "none"}),  # scalar
               ("add", ["m", "a2"], [t("d", 1, 3, 2, 2)], {"activation": "none"}),
               ("transpose", ["d"], ["y"], {"perm": NCHW_TO_NHWC})], {"y": (1, 2, 2, 3)})
    assert text(g) == ["transpose(x) -> a [perm=(0, 3, 1, 2)]",
                       "transpose(x2) -> a2 [perm=(0, 3, 1, 2)]", "binary(a, c) -> s [fn=sub]",
                       "unary(s) -> e [fn=abs]", "mul(e, k) -> m", "add(m, a2) -> d",
                       "transpose(d) -> y [perm=(0, 2, 3, 1)]"]
    after = merge_transposes(sink_transposes(g))
    assert text(after) == ["binary(x, c__t) -> s__sunk [fn=sub]",
                           "unary(s__sunk) -> e__sunk [fn=abs]",
                           "mul(e__sunk, k) -> m__sunk", "add(m__sunk, x2) -> y"]
    assert after.tensors["c__t"].shape == (1, 1, 1, 3)  # the per-channel constant, NHWC
    same_values(g, after)


def test_a_transpose_with_other_readers_is_not_duplicated():
    g = graph({"x": (1, 2, 3, 4)}, {},
              [("transpose", ["x"], [t("a", 1, 3, 4, 2)], {"perm": NCHW_TO_NHWC}),
               ("relu", ["a"], ["y1"], {}),
               ("unary", ["a"], ["y2"], {"fn": "neg"})], {"y1": (1, 3, 4, 2), "y2": (1, 3, 4, 2)})
    assert text(sink_transposes(g)) == text(g)


def test_a_transpose_moving_only_unit_axes_becomes_a_reshape():
    g = graph({"x": (1, 1, 1, 5), "x2": (1, 1, 2, 5)}, {},
              [("transpose", ["x"], ["y"], {"perm": NHWC_TO_NCHW}),
               ("transpose", ["x2"], ["y2"], {"perm": NHWC_TO_NCHW})],
              {"y": (1, 5, 1, 1), "y2": (1, 5, 1, 2)})
    after = transposes_to_reshapes(g)
    assert text(after) == ["reshape(x) -> y", "transpose(x2) -> y2 [perm=(0, 3, 1, 2)]"]
    same_values(g, after)


# ---- the whole pipeline --------------------------------------------------------------------

def _conv_bn_relu_conv_onnx():
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    init = {"w1": f32(4, 3, 3, 3), "b1": f32(4), "s": f32(4, lo=0.5, hi=2), "bb": f32(4),
            "m": f32(4), "v": f32(4, lo=0.5, hi=2), "w2": f32(2, 4, 1, 1)}
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
             helper.make_node("BatchNormalization", ["c1", "s", "bb", "m", "v"], ["bn"]),
             helper.make_node("Relu", ["bn"], ["r"]),
             helper.make_node("Conv", ["r", "w2"], ["y"])]
    g = helper.make_graph(nodes, "cbrc", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, [1, 3, 6, 6])], [helper.make_tensor_value_info(
            "y", TensorProto.FLOAT, [1, 2, 6, 6])],
        [numpy_helper.from_array(a, n) for n, a in init.items()])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    m.ir_version = 8  # what onnxruntime reads
    onnx.checker.check_model(m)
    return m


def test_onnx_conv_bn_relu_conv_keeps_nhwc_between_layers():
    import onnxruntime as ort

    from mcuforge.frontend.onnx import load_onnx
    from mcuforge import runner
    model = _conv_bn_relu_conv_onnx()
    before = load_onnx(model)
    # the import wraps every layer in NCHW <-> NHWC transposes: today transpose, conv2d,
    # transpose, transpose, batch_norm, transpose, relu, transpose, conv2d, transpose
    assert [n.op for n in before.nodes].count("transpose") >= 4, text(before)
    after = optimize(before)
    ops = [n.op for n in after.nodes]
    assert ops == ["transpose", "conv2d", "conv2d", "transpose"], text(after)
    assert after.nodes[0].inputs == ("x",) and after.nodes[-1].outputs == ("y",)
    assert [n.attrs["activation"] for n in after.nodes[1:3]] == ["relu", "none"]
    same_values(before, after)
    x = f32(1, 3, 6, 6)
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]) \
        .run(None, {"x": x})[0]
    np.testing.assert_allclose(runner.run(model.SerializeToString(), x), ref, rtol=1e-4,
                               atol=1e-5)


def test_onnx_residual_block_transposes_only_at_the_input():
    """conv-relu, conv-bn-relu, conv + skip add, relu, global pool, flatten, matmul: the
    skip connection's add takes both branches in NHWC, and the transpose before the flatten
    moves only unit axes."""
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    from mcuforge.frontend.onnx import load_onnx
    from mcuforge import runner
    init = {"w0": f32(4, 3, 3, 3), "w1": f32(4, 4, 3, 3), "w2": f32(4, 4, 3, 3),
            "s": f32(4, lo=0.5, hi=2), "bb": f32(4), "m": f32(4), "v": f32(4, lo=0.5, hi=2),
            "fc": f32(4, 5)}
    make = helper.make_node
    pads = dict(pads=[1, 1, 1, 1])
    nodes = [make("Conv", ["x", "w0"], ["a"], **pads), make("Relu", ["a"], ["a1"]),
             make("Conv", ["a1", "w1"], ["b"], **pads),
             make("BatchNormalization", ["b", "s", "bb", "m", "v"], ["b1"]),
             make("Relu", ["b1"], ["b2"]), make("Conv", ["b2", "w2"], ["c"], **pads),
             make("Add", ["c", "a1"], ["d"]), make("Relu", ["d"], ["d1"]),
             make("GlobalAveragePool", ["d1"], ["p"]), make("Flatten", ["p"], ["f"]),
             make("MatMul", ["f", "fc"], ["y"])]
    g = helper.make_graph(nodes, "res", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, [1, 3, 6, 6])], [helper.make_tensor_value_info(
            "y", TensorProto.FLOAT, [1, 5])],
        [numpy_helper.from_array(a, n) for n, a in init.items()])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    before = load_onnx(model)
    after = optimize(before)
    assert [n.op for n in after.nodes if n.op == "transpose"] == ["transpose"], text(after)
    assert [n.attrs["activation"] for n in after.nodes if n.op in ("conv2d", "add")] == \
        ["relu", "relu", "none", "relu"]
    assert "batch_norm" not in [n.op for n in after.nodes]
    same_values(before, after)
    x = f32(1, 3, 6, 6)
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]) \
        .run(None, {"x": x})[0]
    np.testing.assert_allclose(runner.run(model.SerializeToString(), x), ref, rtol=1e-4,
                               atol=1e-5)


def test_pipeline_is_flat_and_every_pass_documents_its_guarantee():
    assert all(callable(p) for p in PIPELINE)
    for p in PIPELINE:
        doc = p.__doc__ or ""
        assert doc.strip(), f"{p.__name__} has no docstring saying what it guarantees"

def test_int8_tflite_graphs_come_out_unchanged():
    import op_models
    from mcuforge.frontend.tflite import load_tflite
    from mcuforge.frontend.tflite_writer import write_tflite
    for name, g in op_models.all_cases():
        loaded = load_tflite(write_tflite(g))
        assert text(optimize(loaded)) == text(remove_dead_nodes(loaded)), name
