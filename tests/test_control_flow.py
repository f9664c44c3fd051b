"""Control flow (IF, WHILE): subgraphs read into Graphs of their own, verified against their
node, optimized on their own, planned inside the parent's arena and emitted as C functions.
Bit-exactness with tflite-micro is the conformance suite's (mcuforge/tools/tflite_cases/control.py)."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from mcuforge.codegen_c.model import generate
from mcuforge.frontend.tflite import load_tflite
from mcuforge.frontend.tflite_flatbuffer import TflOp, TflSubgraph, write_model
from mcuforge.ir.errors import ModelError, UnsupportedOpError
from mcuforge.ir.graph import MAX_NESTING, Graph, GraphError, Node, Tensor, subgraphs, verify
from mcuforge.tools.tflite_cases import all_cases, tensor
from mcuforge.optimizer.memory_plan import ALIGN, arena_size, overlaps, plan, plan_graph, requests_of
from mcuforge.optimizer.pipeline import optimize


def _case(name):
    [c] = [c for c in all_cases(name) if c.name == name]
    return c


def _load(name) -> Graph:
    return load_tflite(_case(name).model())


def _control(g: Graph) -> Node:
    [n] = [n for n in g.nodes if n.op in ("if", "while")]
    return n


def _if_model(then_ops=None, then_index=1, extra=()) -> bytes:
    """y = c ? then(a) : else(a), float32[4]; the then branch's operators can be replaced."""
    main = [tensor("c", (1,), "bool"), tensor("a", (4,), "float32"), tensor("y", (4,), "float32")]
    ops = [TflOp("IF", ("c", "a"), ("y",), {"then_subgraph_index": then_index,
                                             "else_subgraph_index": 2})]

    def branch(name, branch_ops, more=()):
        ts = [tensor("p", (4,), "float32"), tensor("out", (4,), "float32"), *more]
        return TflSubgraph(ts, branch_ops, ["p"], ["out"], name)
    then = branch("then", then_ops or [TflOp("ABS", ("p",), ("out",))], extra)
    other = branch("else", [TflOp("NEG", ("p",), ("out",))])
    return write_model([TflSubgraph(main, ops, ["c", "a"], ["y"]), then, other])


# ---- reading ---------------------------------------------------------------------------------

def test_subgraphs_become_graphs_with_prefixed_names():
    g = _load("if_float32_then")
    n = _control(g)
    assert (n.op, n.inputs, n.outputs) == ("if", ("c", "a", "b"), ("y",))
    then, other = subgraphs(n)
    assert set(g.tensors) == {"c", "a", "b", "y"}  # the main graph's names are unchanged
    assert then.inputs == ["sg1/p", "sg1/r"] and then.outputs == ["sg1/out"]
    assert [m.op for m in then.nodes] == ["add"] and [m.op for m in other.nodes] == ["sub"]
    assert "then" in then.name and "else" in other.name


def test_while_keeps_the_first_condition_output_and_nests_if():
    g = _load("while_float32_nested_if")
    n = _control(g)
    cond, body = subgraphs(n)
    assert len(cond.outputs) == 1 and cond.tensors[cond.outputs[0]].dtype == "bool"
    [inner] = [m for m in body.nodes if m.op == "if"]
    assert [s.inputs for s in subgraphs(inner)] == [["sg3/p", "sg3/r"], ["sg4/p", "sg4/r"]]


def test_operators_a_branch_cannot_compile_are_reported_with_the_subgraph():
    bad = [TflOp("ABS", ("p",), ("t",)), TflOp("HASHTABLE_LOOKUP", ("t",), ("out",))]
    with pytest.raises(UnsupportedOpError, match=r"IF .*subgraph 1: node 1: HASHTABLE_LOOKUP"):
        load_tflite(_if_model(bad, extra=[tensor("t", (4,), "float32")]))


def test_a_subgraph_running_itself_is_refused():
    """TFLM would recurse without end; mcuforge names the chain."""
    with pytest.raises(UnsupportedOpError, match=r"recursion: subgraphs 0 -> 0"):
        load_tflite(_if_model(then_index=0))
    loop = [TflOp("IF", ("c2", "p"), ("out",), {"then_subgraph_index": 1,
                                                 "else_subgraph_index": 2})]
    with pytest.raises(UnsupportedOpError, match=r"recursion: subgraphs 0 -> 1 -> 1"):
        load_tflite(_if_model(loop, extra=[tensor("c2", (1,), "bool", data=[True])]))


def test_interfaces_that_tflm_cannot_copy_are_errors():
    wrong = [TflOp("CAST", ("p",), ("out",))]  # 'out' float32[4]: fine, then int32 instead

    def model(out_dtype):
        main = [tensor("c", (1,), "bool"), tensor("a", (4,), "float32"),
                tensor("y", (4,), "float32")]
        ts = [tensor("p", (4,), "float32"), tensor("out", (4,), out_dtype)]
        branch = TflSubgraph(ts, wrong, ["p"], ["out"])
        return write_model([TflSubgraph(main, [TflOp("IF", ("c", "a"), ("y",), {
            "then_subgraph_index": 1, "else_subgraph_index": 1})], ["c", "a"], ["y"]), branch])
    assert load_tflite(model("float32")).nodes[0].op == "if"
    with pytest.raises(ModelError, match="differ in type or size"):
        load_tflite(model("int32"))


# ---- graph IR --------------------------------------------------------------------------------

def test_verify_checks_subgraphs_against_their_node():
    g = _load("if_float32_then")
    n = _control(g)
    then = n.attrs["then_graph"]

    def with_then(sub):
        return g.replace(nodes=[replace(n, attrs={**n.attrs, "then_graph": sub})])
    wrong = then.replace(tensors={**then.tensors,
                                  "sg1/out": Tensor("sg1/out", (2, 3), "int32")})
    with pytest.raises(GraphError, match="then_graph output 0"):
        verify(with_then(wrong))
    extra = Tensor("sg1/extra", (1,), "float32")
    with pytest.raises(GraphError, match="then_graph input: 3 tensors for the node's 2"):
        verify(with_then(then.replace(inputs=then.inputs + [extra.name],
                                      tensors={**then.tensors, extra.name: extra})))
    with pytest.raises(GraphError, match="keeps state"):
        verify(with_then(then.replace(state={"sg1/p": "sg1/out"})))
    with pytest.raises(GraphError, match="then_graph: node 0"):
        verify(with_then(then.replace(nodes=[replace(then.nodes[0], op="bogus")])))
    c = Tensor("c", (2,), "bool")
    with pytest.raises(GraphError, match="condition"):
        verify(g.replace(tensors={**g.tensors, "c": c}))


def test_nesting_is_bounded():
    def nested(depth):
        t = {n: Tensor(n, (4,), "float32") for n in ("x", "y")}
        if depth == 0:
            return Graph(t, [Node("unary", ("x",), ("y",), {"fn": "neg"})], ["x"], ["y"])
        t["c"] = Tensor("c", (1,), "bool", np.array([True]))
        inner = nested(depth - 1)
        return Graph(t, [Node("if", ("c", "x"), ("y",), {"then_graph": inner,
                                                         "else_graph": inner})], ["x"], ["y"])
    assert verify(nested(MAX_NESTING))
    with pytest.raises(GraphError, match="nested"):
        verify(nested(MAX_NESTING + 1))


# ---- optimizer -------------------------------------------------------------------------------

def test_constant_operands_do_not_fold_the_node_and_subgraphs_are_optimized():
    """The top-level passes leave if / while alone (never folded, even on constants); each
    subgraph goes through the pipeline itself: its dead nodes go, its names stay."""
    dead = [TflOp("ABS", ("p",), ("out",)), TflOp("NEG", ("p",), ("unused",))]
    g = load_tflite(_if_model(dead, extra=[tensor("unused", (4,), "float32")]))
    assert len(g.nodes[0].attrs["then_graph"].nodes) == 2
    c = g.tensors["c"]
    g = g.replace(tensors={**g.tensors, "c": replace(c, data=np.array([True]))},
                  inputs=["a"])
    h = optimize(g)
    n = _control(h)
    assert [m.op for m in n.attrs["then_graph"].nodes] == ["unary"]
    assert n.attrs["then_graph"].outputs == ["sg1/out"]
    files = generate(h, "m").files["m.c"]
    assert "m_c" in files  # the constant condition is read from a const array


# ---- memory ----------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["if_float32_computed_condition", "if_int8_then",
                                  "if_float32_two_outputs_pass_through",
                                  "while_float32_accumulate", "while_float32_nested_if"])
def test_arena_is_at_most_the_parent_plan_plus_the_larger_subgraph(name):
    g = optimize(_load(name))
    p = plan_graph(g)
    reqs, _ = requests_of(g)
    own = arena_size(reqs, plan(reqs))
    largest = max(plan_graph(s).arena_size for s in subgraphs(_control(g)))
    # the scratch starts aligned (4 bytes, 8 when a subgraph holds 8-byte elements), at worst
    # right after the parent's
    align = max([ALIGN] + [r.align for r in p.requests if r.name.endswith("/scratch")])
    assert p.arena_size <= -(-own // align) * align + largest
    assert max(own, largest) <= p.arena_size
    assert not overlaps(p.requests, p.offsets)
    [(i, (base, plans))] = p.subplans.items()
    assert g.nodes[i].op in ("if", "while") and base + largest <= p.arena_size
    # the scratch is live during the node only: disjoint from its operands and outputs
    scratch = next(r for r in p.requests if r.name.endswith("/scratch"))
    assert (scratch.first, scratch.last) == (i, i)


# ---- generated C -----------------------------------------------------------------------------

def test_subgraphs_are_static_functions_in_the_same_arena():
    g = optimize(_load("while_float32_nested_if"))
    c = generate(g, "m").files["m.c"]
    for k in range(4):  # cond, body, and the body's then / else
        assert f"static void m_sg{k}(void)" in c
    body = c[c.index("int m_invoke(void)"):]
    assert "for (;;) {" in body and "break;" in body and "m_sg0();" in body
    assert "malloc" not in c and "bytes[" in c[c.index("static void m_sg2"):]
    # the condition reads only i and n: acc, k and x are not copied into it
    loop = body[body.index("for (;;)"):body.index("m_sg0();")]
    assert loop.count("memcpy") == 2
