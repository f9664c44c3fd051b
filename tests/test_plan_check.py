"""The memory-plan checker (optimizer/plan_check.py): passes on the compiler's plans, and
rejects each kind of corrupted plan with an error naming the buffers."""
import dataclasses
import random
import time

import pytest
from onnx import TensorProto, helper

from conftest import mlperf_model
from mcuforge.api import load
from mcuforge.codegen_c.model import generate
from mcuforge.frontend.onnx import load_onnx
from mcuforge.optimizer import memory_plan as mp
from mcuforge.optimizer.pipeline import optimize
from mcuforge.optimizer.plan_check import PlanError, check_plan

STEMS = ["ad01_int8", "kws_ref_model", "pretrainedResnet_quant", "vww_96_int8",
         "str_ww_ref_model", "kws_ref_model_float32"]


DECLARED = {}  # id(graph) -> the kernels' in-place declarations (GeneratedModel.declared)


def compiled(stem, keep_input=False):
    g = optimize(load(mlperf_model(stem)))
    gen = generate(g, "m", keep_input=keep_input)
    g = gen.graph  # (its nodes in the order planned)
    DECLARED[id(g)] = gen.declared
    return g, gen.plan


def check(g, plan, **kw):
    check_plan(g, plan, declared=DECLARED[id(g)], **kw)


@pytest.mark.parametrize("stem", STEMS)
@pytest.mark.parametrize("keep_input", [False, True])
def test_mlperf_plans_pass(stem, keep_input):
    g, plan = compiled(stem, keep_input)
    check(g, plan, keep_input=keep_input)


def random_graph(rng, n_nodes, size=16, optimized=True):
    """A random DAG of Relu / Add / Reshape over float tensors [1, size]."""
    vi = lambda n: helper.make_tensor_value_info(n, TensorProto.FLOAT, [1, size])
    shape = helper.make_tensor("shape", TensorProto.INT64, [2], [1, size])
    names, nodes = ["x"], []
    for i in range(n_nodes):
        op = rng.choice(["Relu", "Add", "Reshape", "Sigmoid"])
        a, b = rng.choice(names[-4:]), rng.choice(names)
        ins = {"Add": [a, b], "Reshape": [a, "shape"]}.get(op, [a])
        nodes.append(helper.make_node(op, ins, [f"t{i}"]))
        names.append(f"t{i}")
    outs = sorted({names[-1], rng.choice(names[1:])})
    graph = helper.make_graph(nodes, "g", [vi("x")], [vi(o) for o in outs], [shape])
    g = load_onnx(helper.make_model(graph).SerializeToString())
    return optimize(g) if optimized else g


@pytest.mark.parametrize("seed", range(8))
def test_random_graph_plans_pass(seed):
    g = random_graph(random.Random(seed), 30)
    check_plan(g, mp.plan_graph(g))
    check_plan(g, mp.plan_graph(g, lambda graph, n: (40, 8)))  # every node with scratch


def test_large_graph_is_checked_fast():
    g = random_graph(random.Random(1), 1000, optimized=False)
    assert len(g.nodes) == 1000
    plan = mp.plan_graph(g, lambda graph, n: (40, 8))
    t = time.perf_counter()
    check_plan(g, plan)
    assert time.perf_counter() - t < 1.0


def moved(plan, **offsets):
    return dataclasses.replace(plan, offsets={**plan.offsets, **offsets})


def arena_pair(g, plan):
    """An input and an output of one node, both in the arena (live together at that step)."""
    for i, n in enumerate(g.nodes):
        for x in n.inputs:
            if x in plan.offsets and not g.tensors[x].is_const and n.outputs[0] in plan.offsets \
                    and n.op not in ("reshape",) and n.outputs[0] not in plan.in_place \
                    and not any(m.op == "reshape" and m.inputs[0] == n.outputs[0] for m in g.nodes):
                return i, x, n.outputs[0]
    raise AssertionError("no pair")


def test_two_live_tensors_overlapping_are_rejected():
    g, plan = compiled("kws_ref_model")
    i, x, y = arena_pair(g, plan)
    with pytest.raises(PlanError, match=rf"'{x}'.*'{y}'|'{y}'.*'{x}'") as e:
        check(g, moved(plan, **{y: plan.offsets[x]}))
    assert "step" in str(e.value)


def test_scratch_over_its_layers_input_is_rejected():
    g, plan = compiled("kws_ref_model")
    for n in g.nodes:
        at = plan.kernel_scratch(g, n)
        x = n.inputs[0]
        if at is not None and x in plan.offsets and plan.offsets[x] != at:
            break
    else:
        pytest.fail("no node with scratch")
    name = mp._scratch_name(g, n, "kernel")
    # the input moved under the scratch (keeps the scratch's 8-byte alignment)
    with pytest.raises(PlanError, match="share bytes") as e:
        check(g, moved(plan, **{x: at}))
    assert name in str(e.value) and x in str(e.value)


def test_buffer_past_the_arena_end_is_rejected():
    g, plan = compiled("kws_ref_model")
    t = g.outputs[0]
    with pytest.raises(PlanError, match=rf"'{t}'.*outside the arena"):
        check(g, moved(plan, **{t: plan.arena_size}))


def test_misaligned_offset_is_rejected():
    g, plan = compiled("kws_ref_model")
    t = g.inputs[0]
    with pytest.raises(PlanError, match=rf"'{t}' at offset {plan.offsets[t] + 2}.*multiple of 4"):
        check(g, moved(plan, **{t: plan.offsets[t] + 2}))


def test_declared_in_place_state_is_accepted_undeclared_rejected():
    from mcuforge.frontend.tflite import load_tflite
    from test_sched_svdf import _build  # a one-SVDF TFLite model built with the tflite package
    g = load_tflite(_build("m8", dict(inputs=16, units=12))[0])
    (state, nxt), = g.state.items()
    assert mp.in_place_states(g) == {nxt: state}  # the SVDF's memory is updated in place
    plan = mp.plan_graph(g)
    assert plan.state_offsets[nxt] == plan.state_offsets[state]
    check_plan(g, plan)
    with pytest.raises(PlanError, match="neither an in-place next value"):
        check_plan(g, plan, in_place={})


def test_reshape_alias_accepted_same_overlap_without_alias_rejected():
    vi = lambda n: helper.make_tensor_value_info(n, TensorProto.FLOAT, [1, 16])
    shape = helper.make_tensor("shape", TensorProto.INT64, [2], [1, 16])
    nodes = [helper.make_node("Sigmoid", ["x"], ["a"]), helper.make_node("Reshape", ["a", "shape"], ["b"]),
             helper.make_node("Tanh", ["b"], ["c"]), helper.make_node("Add", ["a", "c"], ["y"])]
    model = helper.make_model(helper.make_graph(nodes, "g", [vi("x")], [vi("y")], [shape]))
    g = load_onnx(model.SerializeToString())  # not optimized: the reshape stays
    assert any(n.op == "reshape" for n in g.nodes)
    plan = mp.plan_graph(g)
    assert plan.offsets["a"] == plan.offsets["b"]
    check_plan(g, plan)
    # the same kind of sharing between a tanh's input and output is not declared anywhere
    with pytest.raises(PlanError, match="'c'.*'a'|'a'.*'c'"):
        check_plan(g, moved(plan, c=plan.offsets["a"]))


def test_broken_planner_stops_compile(tmp_path, monkeypatch, capsys):
    from mcuforge import cli

    monkeypatch.setattr(mp, "plan", lambda requests, links=None: {r.name: 0 for r in requests})
    out = tmp_path / "out"
    rc = cli.main(["compile", str(mlperf_model("kws_ref_model")), "-o", str(out)])
    err = capsys.readouterr().err
    assert rc != 0 and "memory plan" in err and "share bytes" in err
    assert not list(out.rglob("*.c")) if out.exists() else True


# ---- in place: an overlap passes only by the rule, recomputed from the declarations ----

def linked(g, plan):
    """(node index, input, output, shift) of the plan's first in-place link."""
    y, (x, shift) = sorted(plan.in_place.items())[0]
    i = next(k for k, n in enumerate(g.nodes) if n.outputs[0] == y)
    return i, x, y, shift


def test_in_place_at_a_wrong_shift_is_rejected():
    g, plan = compiled("kws_ref_model")
    assert plan.in_place
    for y, (x, shift) in plan.in_place.items():
        for delta in (4, -4):
            at = plan.offsets[x] + shift + delta
            if at < 0 or at + g.tensors[y].nbytes > plan.arena_size:
                continue  # (that is rejected as well, as outside the arena)
            with pytest.raises(PlanError, match="share bytes"):
                check(g, moved(plan, **{y: at}))


def test_in_place_not_declared_is_rejected():
    """The checker reads the kernels' declarations, not the plan's own record of its links."""
    g, plan = compiled("kws_ref_model")
    i, x, y, shift = linked(g, plan)
    declared = {k: v for k, v in DECLARED[id(g)].items() if k != i}
    with pytest.raises(PlanError, match="share bytes"):
        check_plan(g, plan, declared=declared)


def test_in_place_over_an_input_read_later_is_rejected():
    """ResNet-8's first block: conv 1 declares its output may go one row below its input, but
    that input is read again by the block's ADD."""
    g, plan = compiled("pretrainedResnet_quant")
    decl = DECLARED[id(g)]
    i = next(k for k, d in decl.items() if d[0][1] < 0 and any(
        d[0][0] in n.inputs for n in g.nodes[k + 1:]))
    x, shift = decl[i][0]
    y = g.nodes[i].outputs[0]
    bad = moved(plan, **{y: plan.offsets[x] + shift})
    with pytest.raises(PlanError, match="share bytes"):
        check(g, bad)


def test_in_place_over_a_kept_input_is_rejected():
    g, plan = compiled("kws_ref_model")
    x = g.inputs[0]
    links = [(y, s) for y, (src, s) in plan.in_place.items() if src == x]
    assert links  # by default the first layer writes over the input
    check(g, plan)
    with pytest.raises(PlanError, match="share bytes|outside"):
        check(g, plan, keep_input=True)
