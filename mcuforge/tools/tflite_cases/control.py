"""Conformance cases: control flow (IF, WHILE).

Branches, loop conditions and bodies are subgraphs of the model. IF cases take each branch
(the condition is a model input: always true, always false, or random), for every operand type;
WHILE cases loop a number of times read from a model input (zero included), count, accumulate
tensors, and run an IF nested in the body. Loop-carried and branch values keep one
quantization throughout, as a converter writes them (int16: zero point 0).
"""
from __future__ import annotations

import numpy as np

from mcuforge.frontend.tflite_flatbuffer import TflOp, TflSubgraph

from . import TflCase, cases, integers, q, tensor, uniform

F, I32 = "float32", "int32"
SHAPE = (2, 3)
# (a, b, result) quantization of the IF operands: a + b and a - b fit the result's range
QUANTS = {F: (None,) * 3, I32: (None,) * 3,
          "int8": (q(0.05, 3), q(0.04, -6), q(0.09, 1)),
          "int16": (q(0.0004), q(0.0003), q(0.0007))}


def _always(value: bool):
    return lambda rng, shape: np.full(shape, value)


def _binary(name: str, op: str, dtype: str, quants, shape=SHAPE) -> TflSubgraph:
    """A branch subgraph (p, r) -> op(p, r)."""
    qa, qb, qy = quants
    ts = [tensor("p", shape, dtype, qa), tensor("r", shape, dtype, qb),
          tensor("out", shape, dtype, qy)]
    return TflSubgraph(ts, [TflOp(op, ("p", "r"), ("out",))], ["p", "r"], ["out"], name)


# ---- IF --------------------------------------------------------------------------------------

# branch operators per operand type: ADD / SUB where TFLM has them
BRANCH_OPS = {"int64": ("MAXIMUM", "MINIMUM"), "bool": ("LOGICAL_AND", "LOGICAL_OR")}


def _if(variant: str, dtype: str, cond, invocations=4, const_b=False) -> TflCase:
    """y = a + b when c, else a - b: ADD and SUB branch subgraphs (other operators for the
    types TFLM's ADD lacks)."""
    qa, qb, qy = QUANTS.get(dtype, (None,) * 3)
    then_op, else_op = BRANCH_OPS.get(dtype, ("ADD", "SUB"))
    b_data = np.arange(6).reshape(SHAPE) - 2 if const_b else None
    main = [tensor("c", (1,), "bool"), tensor("a", SHAPE, dtype, qa),
            tensor("b", SHAPE, dtype, qb, data=b_data), tensor("y", SHAPE, dtype, qy)]
    ops = [TflOp("IF", ("c", "a", "b"), ("y",),
                 {"then_subgraph_index": 1, "else_subgraph_index": 2})]
    subgraphs = [TflSubgraph(main, ops, ["c", "a"] + ([] if const_b else ["b"]), ["y"]),
                 _binary("then", then_op, dtype, (qa, qb, qy)),
                 _binary("else", else_op, dtype, (qa, qb, qy))]
    return TflCase("IF", variant, subgraphs, {"c": cond} if cond else {},
                   invocations=invocations)


def _if_two_outputs() -> TflCase:
    """(y, z) = (a + b, a) when c, else (a - b, b): branch outputs that are branch inputs."""
    main = [tensor("c", (1,), "bool"), tensor("a", SHAPE, F), tensor("b", SHAPE, F),
            tensor("y", SHAPE, F), tensor("z", SHAPE, F)]
    ops = [TflOp("IF", ("c", "a", "b"), ("y", "z"),
                 {"then_subgraph_index": 1, "else_subgraph_index": 2})]
    branches = []
    for name, op, passed in (("then", "ADD", "p"), ("else", "SUB", "r")):
        sg = _binary(name, op, F, QUANTS[F])
        sg.outputs = ["out", passed]
        branches.append(sg)
    return TflCase("IF", "float32_two_outputs_pass_through",
                   [TflSubgraph(main, ops, ["c", "a", "b"], ["y", "z"]), *branches],
                   invocations=8)


def _if_computed_condition() -> TflCase:
    """c = s < t computed in the model; then y = a * b, else y = a + b."""
    main = [tensor("s", (1,), F), tensor("t", (1,), F), tensor("c", (1,), "bool"),
            tensor("a", SHAPE, F), tensor("b", SHAPE, F), tensor("y", SHAPE, F)]
    ops = [TflOp("LESS", ("s", "t"), ("c",)),
           TflOp("IF", ("c", "a", "b"), ("y",),
                 {"then_subgraph_index": 1, "else_subgraph_index": 2})]
    return TflCase("IF", "float32_computed_condition",
                   [TflSubgraph(main, ops, ["s", "t", "a", "b"], ["y"]),
                    _binary("then", "MUL", F, QUANTS[F]), _binary("else", "ADD", F, QUANTS[F])],
                   invocations=8)


def _if_constant_branches() -> TflCase:
    """y = c ? [1, 2, 3] : [-1, -2, -3]: branches without inputs whose outputs are constants
    (IF takes the condition alone)."""
    main = [tensor("c", (1,), "bool"), tensor("y", (3,), F)]
    ops = [TflOp("IF", ("c",), ("y",), {"then_subgraph_index": 1, "else_subgraph_index": 2})]
    branches = [TflSubgraph([tensor("v", (3,), F, data=[sign, 2 * sign, 3 * sign])], [], [],
                            ["v"], name) for name, sign in (("then", 1), ("else", -1))]
    return TflCase("IF", "float32_constant_branches",
                   [TflSubgraph(main, ops, ["c"], ["y"]), *branches], invocations=8)


@cases("IF")
def if_cases():
    out = [_if_constant_branches()]
    for dtype in (F, "int8", "int16", I32, "int64", "bool"):
        out += [_if(f"{dtype}_then", dtype, _always(True)),
                _if(f"{dtype}_else", dtype, _always(False))]
    out += [_if("float32_random_condition", F, None, invocations=10),
            _if("int8_constant_operand", "int8", None, invocations=10, const_b=True),
            _if_two_outputs(), _if_computed_condition()]
    return out


# ---- WHILE -----------------------------------------------------------------------------------

def _scalar(name, dtype=I32, data=None):
    return tensor(name, (), dtype, data=data)


def _cond(loop: list) -> TflSubgraph:
    """The loop's condition i < n over loop values `loop` (tensors; i and n come first)."""
    ts = [*(tensor(f"c_{t.name}", t.shape, t.dtype, t.quant) for t in loop),
          tensor("go", (), "bool")]
    return TflSubgraph(ts, [TflOp("LESS", ("c_i", "c_n"), ("go",))],
                       [f"c_{t.name}" for t in loop], ["go"], "cond")


def _while(variant: str, loop: list, body: TflSubgraph, inputs: list, outputs: list,
           gens: dict, extra=(), invocations=6) -> TflCase:
    """WHILE over loop values `loop` (main-graph tensors, i and n first), the body given;
    `inputs` / `outputs` name the model's inputs and which loop results it returns."""
    results = [tensor(f"{t.name}_out", t.shape, t.dtype, t.quant) for t in loop]
    main = [*loop, *results, *extra]
    ops = [TflOp("WHILE", tuple(t.name for t in loop), tuple(t.name for t in results),
                 {"cond_subgraph_index": 1, "body_subgraph_index": 2})]
    return TflCase("WHILE", variant,
                   [TflSubgraph(main, ops, inputs, [f"{n}_out" for n in outputs]),
                    _cond(loop), body], gens, invocations=invocations)


def _body(loop: list, updates: list, extra: list) -> TflSubgraph:
    """Body over loop values `loop`: i + 1, then `updates` (TflOps writing 'next_<name>'),
    every other value passed through. Body tensors are named 'b_<name>'."""
    ts = [tensor(f"b_{t.name}", t.shape, t.dtype, t.quant) for t in loop]
    ts += [_scalar("one", data=1), _scalar("next_i"), *extra]
    written = {o for op in updates for o in op.outputs}
    outs = []
    for t in loop:
        nxt = f"next_{t.name}"
        if nxt in written and nxt not in {x.name for x in ts}:
            ts.append(tensor(nxt, t.shape, t.dtype, t.quant))
        outs.append(nxt if nxt in written or t.name == "i" else f"b_{t.name}")
    ops = [TflOp("ADD", ("b_i", "one"), ("next_i",)), *updates]
    return TflSubgraph(ts, ops, [f"b_{t.name}" for t in loop], outs, "body")


def _while_count() -> TflCase:
    """i counts from a constant 0 while i < n (n from 0 to 7): the result is max(n, 0)."""
    loop = [_scalar("i", data=0), _scalar("n")]
    return _while("int32_count", loop, _body(loop, [], []), ["n"], ["i"],
                  {"n": integers(-1, 7)}, invocations=10)


def _while_accumulate(dtype: str, quant=None, x_quant=None) -> TflCase:
    """acc += x, n times (acc and x model inputs)."""
    loop = [_scalar("i", data=0), _scalar("n"), tensor("acc", SHAPE, dtype, quant),
            tensor("x", SHAPE, dtype, x_quant)]
    body = _body(loop, [TflOp("ADD", ("b_acc", "b_x"), ("next_acc",))], [])
    gens = {"n": integers(0, 5)}
    if dtype == F:
        gens["x"] = lambda rng, shape: rng.uniform(-1, 1, shape)
    return _while(f"{dtype}_accumulate", loop, body, ["n", "acc", "x"], ["acc", "i"], gens)


def _while_nested_if() -> TflCase:
    """for i < n: acc = i < k ? acc + x : acc - x (an IF in the body, subgraphs 3 and 4)."""
    loop = [_scalar("i", data=0), _scalar("n"), _scalar("k"), tensor("acc", SHAPE, F),
            tensor("x", SHAPE, F)]
    updates = [TflOp("LESS", ("b_i", "b_k"), ("early",)),
               TflOp("IF", ("early", "b_acc", "b_x"), ("next_acc",),
                     {"then_subgraph_index": 3, "else_subgraph_index": 4})]
    body = _body(loop, updates, [tensor("early", (), "bool")])
    case = _while("float32_nested_if", loop, body, ["n", "k", "acc", "x"], ["acc"],
                  {"n": integers(0, 6), "k": integers(0, 6)}, invocations=8)
    case.subgraphs += [_binary("then", "ADD", F, QUANTS[F]),
                       _binary("else", "SUB", F, QUANTS[F])]
    return case


def _while_doubling() -> TflCase:
    """while x < limit: x = x * 2 (scalar float32): the trip count depends on the data."""
    loop = [tensor("x", (), F), tensor("limit", (), F)]
    cond = TflSubgraph([tensor("c_x", (), F), tensor("c_limit", (), F), tensor("go", (), "bool")],
                       [TflOp("LESS", ("c_x", "c_limit"), ("go",))], ["c_x", "c_limit"],
                       ["go"], "cond")
    body = TflSubgraph([tensor("b_x", (), F), tensor("b_limit", (), F),
                        tensor("two", (), F, data=2.0), tensor("next_x", (), F)],
                       [TflOp("MUL", ("b_x", "two"), ("next_x",))], ["b_x", "b_limit"],
                       ["next_x", "b_limit"], "body")
    case = _while("float32_data_dependent_trip_count", loop, body, ["x", "limit"], ["x"],
                  {"x": uniform(0.01, 3.0), "limit": uniform(-1.0, 200.0)}, invocations=10)
    case.subgraphs[1] = cond
    return case


@cases("WHILE")
def while_cases():
    return [_while_count(), _while_doubling(),
            _while_accumulate(F),
            _while_accumulate("int8", q(0.1, -3), q(0.05, 2)),
            _while_accumulate("int16", q(0.001), q(0.0005)),
            _while_nested_if()]
