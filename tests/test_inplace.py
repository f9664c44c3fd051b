"""In place: the access schedules' shifts (codegen_c/kernels/inplace.py) against shifts worked
out by hand, the planner's in-place groups (optimizer/memory_plan.py), --keep-input, and the
header's statement about the input buffers. The C kernels themselves: test_inplace_c.py."""
import numpy as np
import pytest

from conftest import mlperf_model
from mcuforge.api import load
from mcuforge.board import load_board
from mcuforge.codegen_c.kernels import inplace
from mcuforge.codegen_c.model import generate
from mcuforge.optimizer import memory_plan as mp
from mcuforge.optimizer.pipeline import optimize


def test_elementwise_is_in_place_at_zero():
    assert inplace.best_shift(inplace.elementwise(100)) == 0
    # int16 -> int8: element i's output byte i lies below its input bytes 2i, 2i + 1
    assert inplace.best_shift(inplace.elementwise(100, 2, 1)) == 0


@pytest.mark.parametrize("rows,k,o,block,want", [
    # expanding 8 -> 16 channels, one row a step: output row r (bytes 16r..16r+15) is written
    # once input rows 0..r are read; the input rows still to read start at 8(r + 1), so
    # shift + 16(r + 1) <= 8(r + 1) for r < rows - 1: shift <= -8(rows - 1)
    (10, 8, 16, 1, -72),
    # pairs of rows: the last pair's outputs need no room: shift <= -8 * 2 * (10 / 2 - 1)
    (10, 8, 16, 2, -64),
    # 11 rows in pairs: the last row alone, after 5 pairs: -8 * 10
    (11, 8, 16, 2, -80),
    (10, 64, 64, 2, 0),  # equal rows: over its own input
    (10, 64, 12, 1, 0),  # shrinking
    (4, 6, 10, 1, -12),  # -4 * 3 = -12 (a multiple of 4 already)
    (4, 5, 10, 1, -16),  # -5 * 3 = -15, rounded down to a multiple of 4
])
def test_gemm_rows_shift_by_hand(rows, k, o, block, want):
    acc = inplace.gemm_rows([(0, 0, rows, k, k, o, o)], rows * k, rows * o, block)
    assert inplace.best_shift(acc) == want
    assert inplace.is_safe(acc, want) and not inplace.is_safe(acc, want + 4) or want == 0


def test_conv_rows_one_row_lag():
    # 3x3, stride 1, SAME: output row oy is written after input rows oy - 1 .. oy + 1 are read;
    # input row oy is read again for output row oy + 1, so output row oy may only cover input
    # rows up to oy - 1: one row (w * c bytes) below the input
    h, w, c = 6, 5, 4
    acc = inplace.conv_rows(h, w, c, h, w, c, 3, 1, 1)
    assert inplace.best_shift(acc) == -w * c
    assert not inplace.is_safe(acc, -w * c + 4)


def test_dw3x3_one_pass_and_several():
    from mcuforge.codegen_c import pack_dw
    # one band and one pass of all channels: shift 0 (every row is widened before any output)
    g = pack_dw.geometry(6, 6, 8, 6, 6, 1, 1, 1)
    assert inplace.best_shift(inplace.dw3x3(g)) == 0
    # KWS's 25x5x64: 16 passes of 4 channels, by columns; the same pixel's other channels are
    # read in later passes, but output (p, c) lands on input (p, c) read in its own pass
    g = pack_dw.geometry(25, 5, 64, 25, 5, 1, 1, 1)
    assert g["cg"] < 64 and g["transpose"]
    acc = inplace.dw3x3(g)
    assert inplace.best_shift(acc) == 0 and not inplace.is_safe(acc, 4)


def test_rv_dw3_per_channel_plane():
    from mcuforge.codegen_c.kernels.scalar import dw_geometry
    # 6x6x2, VALID, stride 2: 2x2 outputs from a 5x5 plane; mf_rv_dw_plane copies plane rows
    # and columns 0..4 only, so row 5 and column 5 are never read (read_last -1); channel c's
    # pixels are read at step c and all its outputs written at step c
    h = w = 6
    g = dw_geometry(h, w, 2, 2, 2, 2, 2, 0, 0)
    acc = inplace.rv_dw3(g, h * w * 2, 2 * 2 * 2)
    want = np.full((h, w, 2), -1)
    want[:5, :5] = [0, 1]
    assert (acc.read_last == want.reshape(-1)).all()
    assert (acc.write_first == np.tile([0, 1], 4)).all()
    # KWS's 25x5x64 (transposed plane, stride 1, SAME): output (p, c) lands on input (p, c),
    # read in its own channel's step; 4 bytes up, channel c's output covers channel c + 4,
    # still to be read
    g = dw_geometry(25, 5, 64, 25, 5, 1, 1, 1, 1)
    assert g[3] == 5  # transposed: 5 output rows of 25 in the plane's view
    acc = inplace.rv_dw3(g, 25 * 5 * 64, 25 * 5 * 64)
    assert (acc.read_last == np.tile(np.arange(64), 125)).all()
    assert inplace.best_shift(acc) == 0 and not inplace.is_safe(acc, 4)


def test_planner_groups_a_chain_at_its_shifts():
    r = [mp.Request("a", 100, 0, 1), mp.Request("b", 100, 1, 2), mp.Request("c", 200, 2, 3)]
    assert mp.arena_size(r, mp.plan(r)) == 300
    links = {"b": ("a", 0), "c": ("b", -100)}
    off = mp.plan(r, links)
    assert off["b"] == off["a"] and off["c"] == off["b"] - 100
    assert mp.arena_size(r, off) == 200
    assert mp.overlaps(r, off, links) == [] and mp.overlaps(r, off) != []


def graph(stem):
    return optimize(load(mlperf_model(stem)))


def test_input_is_last_read_and_kept():
    g = graph("kws_ref_model")
    m4 = load_board("mps2-an386").target(None)
    free, kept = generate(g, "m", m4), generate(g, "m", m4, keep_input=True)
    x = g.inputs[0]
    # by default the first layer writes over the model's input; kept, nothing does
    assert any(src == x for src, _ in free.plan.in_place.values())
    assert free.plan.arena_size < kept.plan.arena_size
    lo, hi = kept.plan.offsets[x], kept.plan.offsets[x] + g.tensors[x].nbytes
    for r in kept.plan.requests:
        o = kept.plan.offsets[r.name]
        assert r.name == x or o >= hi or o + r.size <= lo, r.name
    assert "MAY OVERWRITE THE INPUT" in free.files["m.h"]
    assert "does not modify the input buffers" in kept.files["m.h"]


def test_a_node_declaring_nothing_is_never_in_place():
    g = graph("kws_ref_model")
    plan = mp.plan_graph(g, None, lambda graph, node: None)
    assert plan.in_place == {}
    assert plan.arena_size == mp.plan_graph(g).arena_size


def test_an_input_read_later_is_not_overwritten():
    g = graph("pretrainedResnet_quant")  # a residual block's input is read by the ADD too
    # every node declares its first input at shift 0
    plan = mp.plan_graph(g, None, lambda graph, node: [(node.inputs[0], 0)])
    _, root = mp.requests_of(g)  # a reshape's output is its source's buffer
    readers = {}
    for i, n in enumerate(g.nodes):
        for t in n.inputs:
            readers.setdefault(root.get(t, t), []).append(i)
    for y, (x, _) in plan.in_place.items():
        i = next(k for k, n in enumerate(g.nodes) if n.outputs[0] == y)
        assert max(readers[x]) == i
    assert plan.in_place and len(plan.in_place) < len(g.nodes)


def branchy_model():
    """x -> two branches, each a wide tensor (Tile: 64x) summed down to one value, added. In
    the file's order both wide tensors are live together; a branch at a time holds one."""
    from onnx import TensorProto, helper
    vi = lambda n, s: helper.make_tensor_value_info(n, TensorProto.FLOAT, s)
    reps = helper.make_tensor("reps", TensorProto.INT64, [2], [1, 64])
    nodes = [helper.make_node("Tile", ["x", "reps"], ["a"]),
             helper.make_node("Tile", ["x", "reps"], ["b"]),
             helper.make_node("ReduceSum", ["a"], ["a2"], keepdims=1),
             helper.make_node("ReduceSum", ["b"], ["b2"], keepdims=1),
             helper.make_node("Add", ["a2", "b2"], ["y"])]
    graph = helper.make_graph(nodes, "g", [vi("x", [1, 16])], [vi("y", [1, 1])], [reps])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)


def test_order_with_the_lowest_peak_is_chosen(tmp_path):
    import numpy as np
    import onnxruntime as ort
    from mcuforge.frontend.onnx import load_onnx
    from mcuforge.runner import run
    model = branchy_model()
    g = optimize(load_onnx(model.SerializeToString()))
    own = mp.plan_graph(g)
    gen = generate(g, "m")
    assert len(mp.topological_orders(g)) > 1
    # the file's order keeps a and b (4096 bytes each) live together
    assert own.arena_size >= 2 * 4096
    assert gen.plan.arena_size < own.arena_size
    # the calls follow the order planned: each Tile right before its ReduceSum
    ops = [n.op for n in gen.graph.nodes]
    assert ops == ["tile", "reduce", "tile", "reduce", "add"], ops
    order = [name.split("_")[1] for name, _ in gen.layers]
    assert order == ops, (order, ops)
    # and it still computes the model
    path = tmp_path / "m.onnx"
    path.write_bytes(model.SerializeToString())
    x = np.random.default_rng(0).standard_normal((1, 16)).astype(np.float32)
    want = ort.InferenceSession(str(path)).run(None, {"x": x})[0]
    np.testing.assert_allclose(run(path, x), want, rtol=1e-5)


def test_a_chain_has_one_order():
    assert len(mp.topological_orders(graph("kws_ref_model"))) == 1


def test_an_unknown_kernel_declares_nothing():
    """A schedule name whose loops inplace.py does not mirror (say a new MVE body) gets no
    declaration even when handed an access schedule."""
    from mcuforge.codegen_c import loop_ir as ir
    k = ir.Kernel("k", (), (), schedule="mf_gemm2_mve_s0")
    assert inplace.declare(k, "x", inplace.elementwise(8)).in_place == ()
    k = ir.Kernel("k", (), (), schedule="mf_gemm2_w16_s0")
    assert inplace.declare(k, "x", inplace.elementwise(8)).in_place == (("x", 0, 4),)
