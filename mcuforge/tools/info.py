"""`mcuforge info`: what a model is made of and what it will cost."""
from __future__ import annotations

from collections import Counter
from pathlib import Path


def model_info(model, input_shapes: dict | None = None, board: str = "host",
               flash_budget: int | None = None, keep_input: bool = False,
               memory_priority: float | None = None) -> dict:
    """The figures of the model as compiled for `board` (its schedules decide the packed
    weights' size and the kernels' scratch); `memory_priority`: as compile's (then also
    "memory_priority": the default plan's arena and MACs, the stage and band count)."""
    from mcuforge.codegen_c.model import generate
    from mcuforge.optimizer.pipeline import optimize

    from ..api import load
    from ..board import load_board
    g = optimize(load(model, input_shapes))
    target = load_board(board).target(flash_budget)
    choice = None
    if memory_priority is not None:
        from ..api import patch_first_stage
        g, choice = patch_first_stage(g, target, memory_priority, keep_input)
    gen = generate(g, "model", target, keep_input=keep_input)
    plan = gen.plan
    scratch = [r.size for r in plan.requests if r.name.endswith("/kernel")]

    def port(name):
        t = g.tensors[name]
        q = t.quant
        return {"name": name, "dtype": t.dtype, "shape": list(t.shape),
                "scale": float(q.scale[0]) if q else None,
                "zero_point": int(q.zero_point[0]) if q else None}

    return {
        "model": Path(str(model)).name,
        "ops": dict(Counter(_ops(g))),
        "macs": gen.macs,
        "weight_bytes": gen.weight_bytes,
        "arena_bytes": plan.arena_size,
        "lower_bound_bytes": plan.lower_bound,
        "scratch_bytes": max(scratch, default=0),  # the largest kernel scratch (in the arena)
        "state_bytes": plan.state_size,
        "inputs": [port(n) for n in g.inputs],
        "outputs": [port(n) for n in g.outputs],
        "tensors": len(g.tensors),
        **({} if choice is None else {"memory_priority": {
            "default_arena_bytes": choice.base_arena, "default_macs": choice.base_macs,
            "mac_overhead_percent": round(choice.overhead, 2), "stage_layers": choice.k,
            "bands": choice.count if choice.k else 0}}),
    }


def _ops(g) -> list:
    """Every node's op, those inside IF/WHILE subgraphs too."""
    from mcuforge.ir.graph import subgraphs
    out = []
    for n in g.nodes:
        out.append(n.op)
        for sg in subgraphs(n):
            out += _ops(sg)
    return out
