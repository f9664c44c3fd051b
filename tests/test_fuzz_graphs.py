"""Random ONNX graphs (mcuforge.tools.fuzz), a fixed-seed set: float graphs against onnxruntime,
int8 graphs (quantized by mcuforge) byte for byte against their emitted .tflite in tflite-micro.

The graphs are built with onnx.helper and numpy only (no mcuforge code), so both sides of each
comparison are independent of the code under test. Features of known, unfixed bugs
(fuzz.KNOWN) are left out here; `mcuforge fuzz` sweeps with them. Every graph here must pass:
the float seeds are the first 40; the int8 seeds are the first 15 of 0-29 that mcuforge can
write as a .tflite (the others it refuses with a clear error, nearly all "tflite writer: op
'transpose' has no TFLite mapping", a limitation of the writer).
"""
import warnings
from collections import Counter

import numpy as np
import onnx
import pytest
from conftest import require, require_tflm

from mcuforge.tools import fuzz
from mcuforge.cli import main

require("onnxruntime")

FLOAT_SEEDS = range(40)
INT8_SEEDS = (0, 3, 5, 6, 7, 10, 12, 14, 16, 18, 21, 22, 23, 28, 29)


@pytest.fixture(autouse=True)
def _quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


def _explain(o) -> str:
    return f"seed {o.seed} ({' '.join(o.ops)}): {o.status}\n{o.detail}"


@pytest.mark.parametrize("seed", FLOAT_SEEDS)
def test_float_graph_matches_onnxruntime(seed):
    o = fuzz.check(seed, exclude=fuzz.KNOWN)
    assert o.status == "passed", _explain(o)


@pytest.mark.parametrize("seed", INT8_SEEDS)
def test_int8_graph_matches_tflm_bit_for_bit(seed):
    require_tflm()
    o = fuzz.check(seed, int8=True, exclude=fuzz.KNOWN)
    assert o.status == "passed", _explain(o)


def test_the_set_covers_the_operators_and_is_mostly_compiled():
    """The fixed set really exercises what the module promises: 2-12 nodes, at least 20 op
    types, square inputs (4-D and 2-D)."""
    graphs = [fuzz.make_model(s, exclude=fuzz.KNOWN) for s in FLOAT_SEEDS]
    ops = Counter(op for g in graphs for op in g.ops)
    assert len(ops) >= 20, ops
    assert all(2 <= len(g.ops) <= 12 for g in graphs)
    shapes = [v.shape for g in graphs for v in g.inputs.values()]
    assert any(len(s) == 4 and s[2] == s[3] for s in shapes)
    assert any(len(s) == 2 and s[0] == s[1] for s in shapes)
    int8 = [fuzz.make_model(s, int8=True, exclude=fuzz.KNOWN) for s in INT8_SEEDS]
    assert len({op for g in int8 for op in g.ops}) >= 10


def test_generator_is_deterministic_and_valid():
    a, b = fuzz.make_model(7), fuzz.make_model(7)
    assert a.model == b.model and a.ops == b.ops
    assert all(np.array_equal(a.inputs[k], b.inputs[k]) for k in a.inputs)
    m = onnx.load_from_string(a.model)
    onnx.checker.check_model(m, full_check=True)
    assert not any(n.domain for n in m.graph.node)  # standard operators only


def test_compare_float_flags_a_wrong_value_and_a_wrong_shape():
    g = fuzz.make_model(3)
    want = fuzz.ort_run(g.model, g.inputs)
    assert fuzz.compare_float(want, want, g.model, g.inputs) == ""
    name, ref = next(iter(want.items()))
    off = dict(want)
    off[name] = ref + np.float32(1e-2) * (np.abs(ref).max() + 1)
    assert f"output '{name}'" in fuzz.compare_float(off, want, g.model, g.inputs)
    off[name] = ref.reshape(-1)[None] if ref.ndim != 2 else ref.reshape(-1)
    assert "shape" in fuzz.compare_float(off, want, g.model, g.inputs)


_compile_and_run = fuzz._compile_and_run


def _wrong_when(op: str):
    """mcuforge's compile-and-run, its outputs made wrong (+1) when the model has `op`."""
    def run(model, feeds, workdir, **kw):
        r, outs = _compile_and_run(model, feeds, workdir, **kw)
        if any(n.op_type == op for n in onnx.load_from_string(model).graph.node):
            outs = {k: v + 1 for k, v in outs.items()}
        return r, outs
    return run


def test_cli_sweep_summarises_and_saves_failures(tmp_path, monkeypatch, capsys):
    """`mcuforge fuzz`: the summary line, and a failure (here planted in mcuforge's outputs)
    saved with its model and inputs, exit status 1."""
    rc = main(["fuzz", "--seed", "5", "--count", "2", "--jobs", "1"])
    out = capsys.readouterr().out
    assert rc == 0 and "tried 2: passed 2" in out
    monkeypatch.setattr(fuzz, "_compile_and_run", _wrong_when(fuzz.make_model(5).ops[0]))
    rc = main(["fuzz", "--seed", "5", "--count", "1", "--jobs", "1", "--save", str(tmp_path)])
    out = capsys.readouterr().out
    assert rc == 1 and "mismatched 1" in out and "seed 5 float mismatch" in out
    saved = sorted(p.name for p in tmp_path.iterdir())
    assert saved == ["mismatch-float-5.npz", "mismatch-float-5.onnx", "mismatch-float-5.txt"]
    onnx.checker.check_model(onnx.load(tmp_path / "mismatch-float-5.onnx"))


def test_minimise_keeps_the_failure_and_shrinks_the_graph(monkeypatch):
    """A failure planted in one operator (mcuforge's outputs wrong whenever the graph has a
    Sigmoid) minimises to a smaller graph that still has the Sigmoid and still fails."""
    seed = next(s for s in range(100) if "Sigmoid" in fuzz.make_model(s).ops
                and len(fuzz.make_model(s).ops) >= 6)
    monkeypatch.setattr(fuzz, "_compile_and_run", _wrong_when("Sigmoid"))
    o = fuzz.check(seed)
    assert o.status == "mismatch"
    small = fuzz.minimise(o, max_checks=40)
    assert small.status == "mismatch" and len(small.ops) < len(o.ops) and "Sigmoid" in small.ops


def _graph(nodes, x_shape, consts, out):
    """A float model of `nodes` on input x, with float32 constants {name: value}."""
    from onnx import TensorProto, helper, numpy_helper
    g = helper.make_graph(
        nodes, "found", [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)],
        [helper.make_tensor_value_info(out, TensorProto.FLOAT, None)],
        [numpy_helper.from_array(np.asarray(v, np.float32), k) for k, v in consts.items()])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_found_int8_all_zero_activation_quantizes():
    """Found by the sweep (seed 1215): a tensor that is zero on every calibration sample
    (relu6 of sigmoid(x) - 1.36 < 0) made the mse range search divide 0 by 0 and crash with
    'cannot convert float NaN to integer'; now it quantizes, bit-exact with tflite-micro."""
    from onnx import helper
    require_tflm()
    m = _graph([helper.make_node("Sigmoid", ["x"], ["s"]),
                helper.make_node("Add", ["s", "c"], ["a"]),
                helper.make_node("Clip", ["a", "lo", "hi"], ["y"])],
               [1, 3, 1, 9], {"c": [-1.36], "lo": 0.0, "hi": 6.0}, "y")
    x = np.random.default_rng(0).uniform(-2, 2, (1, 3, 1, 9)).astype(np.float32)
    o = fuzz.check_int8(fuzz.Generated(m.SerializeToString(), {"x": x}, 0, True, ()))
    assert o.status == "passed", o.detail


@pytest.mark.parametrize("pool,attrs", [
    ("AveragePool", {"auto_pad": "SAME_UPPER", "count_include_pad": 1, "kernel_shape": [3, 2]}),
    ("MaxPool", {"kernel_shape": [2, 2], "dilations": [2, 2], "strides": [2, 2]}),
])
def test_found_int8_pool_without_tflite_form_is_refused(pool, attrs):
    """Found by the sweep (seed 54 of the int8 set): an int8 average pool counting its padding
    (count_include_pad=1, which the C computes as ONNX says) was written to the .tflite as
    AVERAGE_POOL_2D SAME, which divides by the taps inside the input only: 26 of 50 values
    differed from tflite-micro by up to 36. Likewise a dilated max pool whose output size
    equals the undilated one was written without its dilation. --emit-tflite now refuses
    both with a clear error; without padding (dilation) the pool is written and bit-exact."""
    from onnx import helper
    require_tflm()

    def model(attrs):
        return _graph([helper.make_node("Transpose", ["x"], ["a"], perm=[0, 3, 1, 2]),
                       helper.make_node(pool, ["a"], ["p"], **attrs),
                       helper.make_node("Transpose", ["p"], ["y"], perm=[0, 2, 3, 1])],
                      [1, 5, 5, 2], {}, "y")
    x = np.random.default_rng(0).uniform(-2, 2, (1, 5, 5, 2)).astype(np.float32)
    o = fuzz.check_int8(fuzz.Generated(model(attrs).SerializeToString(), {"x": x}, 0, True, ()))
    assert o.status == "refused", o.detail
    assert "cannot express" in o.detail or "TFLite's" in o.detail
    assert "count_include_pad" in o.detail or "dilation" in o.detail
    plain = {k: v for k, v in attrs.items() if k not in ("auto_pad", "dilations")}
    o = fuzz.check_int8(fuzz.Generated(model(plain).SerializeToString(), {"x": x}, 0, True, ()))
    assert o.status == "passed", o.detail


def test_found_one_input_transposed_for_two_branches_runs_right():
    """Found by the sweep (float seed 2463): BatchNormalization -> Conv 1x1 strides (2, 1) ->
    Flatten and AveragePool -> GlobalAveragePool on the same input: the two NCHW -> NHWC
    transposes of the input were two identical kernels called with the same arena addresses,
    with `restrict` parameters, and gcc 12.2 -O2 (ipa-cp) dropped them: both outputs wrong by
    up to 5.3. The kernels no longer take restrict pointers; both outputs equal onnxruntime."""
    from onnx import helper
    r = np.random.default_rng(2)
    consts = {"s": r.uniform(0.5, 1.5, 4), "b": r.uniform(-0.5, 0.5, 4),
              "m": r.uniform(-0.5, 0.5, 4), "v": r.uniform(0.25, 2, 4),
              "w": np.random.default_rng(1).normal(size=(8, 4, 1, 1)),
              "B": np.random.default_rng(3).normal(size=(8,))}
    mk = helper.make_node
    m = _graph([mk("BatchNormalization", ["x", "s", "b", "m", "v"], ["t"]),
                mk("Conv", ["t", "w", "B"], ["c"], kernel_shape=[1, 1], strides=[2, 1]),
                mk("Flatten", ["c"], ["A"], axis=1),
                mk("AveragePool", ["x"], ["p"], kernel_shape=[1, 2], strides=[2, 1]),
                mk("GlobalAveragePool", ["p"], ["y"])], [1, 4, 2, 6], consts, "y")
    m.graph.output.insert(0, helper.make_tensor_value_info("A", 1, None))
    x = np.random.default_rng(0).uniform(-2, 2, (1, 4, 2, 6)).astype(np.float32)
    o = fuzz.check_float(fuzz.Generated(m.SerializeToString(), {"x": x}, 0, False, ()))
    assert o.status == "passed", o.detail
