"""State kept across invocations in the graph IR: verification, passes, memory plan, C API."""
from __future__ import annotations

import numpy as np
import pytest

from mcuforge.codegen_c.model import generate
from mcuforge.ir.graph import Graph, GraphError, Node, Tensor, verify
from mcuforge.optimizer.memory_plan import overlaps, plan_graph
from mcuforge.optimizer.pipeline import optimize


def accumulator(extra_dead: bool = False) -> Graph:
    """acc_next = acc + x; y = acc_next * 2 (float32, 4 values)."""
    t = {n: Tensor(n, (4,), "float32") for n in ("x", "acc", "acc_next", "y", "dead")}
    t["two"] = Tensor("two", (), "float32", np.array(2.0, np.float32))
    nodes = [Node("binary", ("acc", "x"), ("acc_next",), {"fn": "add"}),
             Node("binary", ("acc_next", "two"), ("y",), {"fn": "mul"})]
    if extra_dead:
        nodes.append(Node("binary", ("x", "two"), ("dead",), {"fn": "mul"}))
    return verify(Graph(t, nodes, ["x"], ["y"], "acc", state={"acc": "acc_next"},
                        state_init={"acc": np.ones(4, np.float32)}))


def test_verify_checks_state():
    g = accumulator()
    bad = Graph(dict(g.tensors, acc_next=Tensor("acc_next", (4,), "int32")), g.nodes,
                g.inputs, g.outputs, state=g.state)
    with pytest.raises(GraphError, match="differ"):
        verify(bad)
    with pytest.raises(GraphError, match="never produced"):
        verify(Graph(g.tensors, g.nodes[:0], g.inputs, ["x"], state=g.state))


def test_passes_keep_state_updates():
    """Dead code removal drops what reaches neither an output nor a next state value."""
    g = optimize(accumulator(extra_dead=True))
    assert g.state == {"acc": "acc_next"}
    assert [n.outputs[0] for n in g.nodes] == ["acc_next", "y"]


def test_state_lives_outside_the_arena():
    g = accumulator()
    plan = plan_graph(g)
    assert "acc" not in plan.offsets and plan.state_offsets == {"acc": 0}
    assert plan.state_size == 16
    assert not overlaps(plan.requests, plan.offsets)
    # the next value must survive until the end-of-invoke copy
    req = {r.name: r for r in plan.requests}
    assert req["acc_next"].last == len(g.nodes)


def test_generated_api_has_reset_and_copies_state():
    g = accumulator()
    files = generate(g, "acc").files
    h, c = files["acc.h"], files["acc.c"]
    assert "void acc_reset(void);" in h and "#define ACC_STATE_SIZE 16" in h
    body = c[c.index("int acc_invoke(void)"):]
    assert body.index("l01_") < body.index("memcpy(&state.bytes[0]")  # copy after the layers
    init = c[c.index("void acc_init(void)"):c.index("int acc_invoke")]
    assert "acc_reset();" in init and "state0_init" in init


def test_board_ram_check_counts_the_state(monkeypatch):
    """A board with RAM for the arena and the stack but not the state block is refused."""
    from dataclasses import replace

    from mcuforge import api
    from mcuforge.ir.errors import McuforgeError
    t = {n: Tensor(n, (1000,), "float32") for n in ("x", "acc", "acc_next")}
    g = verify(Graph(t, [Node("binary", ("acc", "x"), ("acc_next",), {"fn": "add"})], ["x"],
                     ["acc_next"], state={"acc": "acc_next"}))
    plan = plan_graph(g)
    assert plan.state_size == 4000
    host = api.load_board("host")
    for extra, fits in ((plan.state_size - 100, False), (plan.state_size, True)):
        small = replace(host, ram_size=plan.arena_size + host.min_stack + extra)
        monkeypatch.setattr(api, "load_board", lambda name, b=small: b)
        if fits:
            api.generate_project(g, "acc", "host")
        else:
            with pytest.raises(McuforgeError, match="bytes of RAM"):
                api.generate_project(g, "acc", "host")
