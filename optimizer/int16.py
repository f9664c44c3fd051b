"""Choosing the activations the int8 quantizer keeps in int16 (TFLite's 16x8 scheme: int16
activations with zero point 0, int8 weights, int64 biases), by their measured effect on the
output.

A *move* promotes one activation tensor T: T's producer runs its int16 kernel, and so does
every node reading T (a node reading int16 data must be an int16 node: TFLM has no int16-in,
int8-out layers), through ops that only pass data on (reshape, max / average pool, relu6),
whose outputs then stay int16 too. Without its readers in int16, T would be rounded to int8
on the next step anyway and nothing would be gained. Outputs of such reader nodes are stored in
int16 and converted to int8 (their calibrated quantization) for int8 readers; int8 tensors
read by int16 nodes get exact int16 copies. Graph inputs and outputs stay int8 (their
quantization is the model's interface).

The search is greedy: starting from the all-int8 graph, each step takes the move that lowers
the error on the calibration samples the most, among the moves whose graph still fits the RAM
budget (arena growth over the all-int8 graph, from the memory planner); it stops when no move
removes at least MIN_GAIN of the all-int8 graph's error, or after MAX_STEPS moves.

  - The error: candidate graphs are built and run as mcuforge's C (several side by side in
    one program, see merge) on the first EVAL_SAMPLES calibration samples, and the outputs of
    the last weighted layers are computed from what each graph feeds them, with their
    quantized weights and the mean error bias correction will remove taken out, then through
    their activation and a softmax that follows (layer_error; through a softmax, the expected
    first-order error): the squared error against the float model over the float output's
    power, summed over those layers. This leaves out the rounding after those layers (the
    same in every candidate), which would only add noise. When those layers lead straight to
    the graph outputs, MIN_GAIN is taken of the all-int8 graph's whole output error instead
    (a gain the output's own rounding swamps is no gain).
  - The first step finds the moves that gain enough on their own by halving groups of them
    (a group that gains too little as a whole has no such move: more int16 never adds
    error, in expectation); later steps measure again only the moves whose earlier gain could
    still beat the best one measured (lazy greedy).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from mcuforge.ir.errors import McuforgeError
from mcuforge.ir.graph import Graph, Node, Tensor

from . import calibrate

# ops with int16 kernels in TFLM (and mcuforge's 16x8 lowering) that compute a new value
COMPUTING = ("conv2d", "depthwise_conv2d", "fully_connected", "add", "mul", "mean", "reduce",
             "relu", "leaky_relu", "softmax", "logistic", "tanh")
# ops whose int16 output keeps the input's quantization: they follow the input's precision
PASSING = ("reshape", "max_pool2d", "avg_pool2d", "relu6")
DEFAULT_BUDGET = 0.02  # without a budget: this fraction of the all-int8 graph's arena
MIN_GAIN = 0.03  # a move must remove this fraction of the int8 graph's output error
MAX_STEPS = 8
EVAL_SAMPLES = 128  # calibration samples the candidates are compared on (the first ones)
BATCH = 8  # candidate graphs built and run together as one program


def is_global_pool(g: Graph, n: Node) -> bool:
    """An average pool over the whole image without padding or activation (quantized as a
    mean op, with its own output range)."""
    x, y = g.tensors[n.inputs[0]], g.tensors[n.outputs[0]]
    return (n.op == "avg_pool2d" and tuple(n.attrs["filter"]) == tuple(x.shape[1:3])
            and tuple(y.shape[1:3]) == (1, 1) and not any(n.attrs["padding"])
            and n.attrs.get("activation", "none") == "none"
            and not n.attrs.get("count_include_pad", False))


def passes_through(g: Graph, n: Node) -> bool:
    return n.op in PASSING and not (n.op == "avg_pool2d" and is_global_pool(g, n))


def moves(g: Graph) -> dict:
    """{tensor T: the tensors promoting T keeps in int16} for every candidate T: the output
    of a computing node with an int16 kernel that is not a graph output."""
    readers = {}
    for n in g.nodes:
        for t in dict.fromkeys(n.inputs):
            if t:
                readers.setdefault(t, []).append(n)
    outputs = set(g.outputs)

    def can(n):
        return (len(n.outputs) == 1 and n.outputs[0] not in outputs
                and g.tensors[n.outputs[0]].dtype == "float32"
                and (n.op in COMPUTING or n.op in PASSING)
                and (n.op != "reduce" or n.attrs.get("fn") == "mean"))

    def closure(t):
        wide, todo = {t}, [t]
        while todo:
            for r in readers.get(todo.pop(), ()):
                o = r.outputs[0]
                if can(r) and o not in wide:
                    wide.add(o)
                    if passes_through(g, r):
                        todo.append(o)
        return frozenset(wide)

    return {n.outputs[0]: closure(n.outputs[0]) for n in g.nodes
            if can(n) and not passes_through(g, n)}


def layer_error(m, x_q: np.ndarray, x_f: np.ndarray, weights: tuple, center: bool = True,
                tail: "Tail | None" = None, chunk: int = 16) -> float:
    """The error of a weighted layer's output computed from what the quantized graph feeds it,
    `x_q` (real values, [N, ...]), with its quantized weights, against the float layer on the
    float input `x_f`, over the float output's sum of squares; measured on what the output
    becomes, `tail` (by default the pre-activation output itself). `weights`: ((w, b),
    (w_q, b_q)) as reals; `m`: the layer's calibrate.InputMoments (its patch layout). With
    `center`, each channel's mean error before the activation is taken out first, as bias
    correction does.

    Through a softmax (over the layer's channels) the error is the first-order one with the
    errors decoupled from the rows they occur in: tr(M S) / rows, M the sum over rows of
    J'J (J the row's Jacobian of the tail), S the sum of d d' (d the row's pre-activation
    error). The exact squared error is dominated by the few rows near a tie, where the
    softmax is steepest, so that it would rank candidates by how their rounding happens to
    fall on those rows; the expected error of rows alike is what the rounding statistics
    decide."""
    (w, b), (wq, bq) = weights
    rows, rows_q = m.rows(w), m.rows(wq)  # [groups, R, K]
    channels = rows.shape[0] * rows.shape[1]
    b, bq = (np.broadcast_to(np.asarray(v, np.float64).reshape(-1), (channels,)) for v in (b, bq))
    tail = tail or Tail()
    decoupled = tail.beta is not None and tail.width == channels

    def outputs(start):  # (float, quantized) pre-activation outputs [P, channels]
        pf = m.patches(x_f[start:start + chunk]).astype(np.float64)
        pq = m.patches(x_q[start:start + chunk]).astype(np.float64)
        z, zq = (np.matmul(p, r.transpose(0, 2, 1)).transpose(1, 0, 2).reshape(-1, channels)
                 for p, r in ((pf, rows), (pq, rows_q)))
        return z + b, zq + bq

    shift = np.zeros(channels)
    if center:
        count = 0
        for start in range(0, len(x_f), chunk):
            z, zq = outputs(start)
            shift += (zq - z).sum(0)
            count += len(z)
        shift /= max(count, 1)
    err = power = 0.0
    jtj, dd, count = np.zeros((channels, channels)), np.zeros((channels, channels)), 0
    for start in range(0, len(x_f), chunk):
        z, zq = outputs(start)
        y = tail(z)
        power += float(np.sum(y * y))
        if decoupled:
            d, jac = zq - shift - z, tail.jacobians(z)
            jtj += np.einsum("rij,rik->jk", jac, jac)
            dd += d.T @ d
            count += len(d)
        else:
            err += float(np.sum((tail(zq - shift) - y) ** 2))
    if decoupled:
        err = float(np.trace(jtj @ dd)) / max(count, 1)
    return err / max(power, 1e-30)


ACTIVATIONS = {"none": (None, None), "relu": (0.0, None), "relu6": (0.0, 6.0),
               "relu_n1_to_1": (-1.0, 1.0)}


@dataclass
class Tail:
    """What a weighted node's pre-activation output becomes further on: its fused activation
    `act`, then, with a `beta`, a softmax along rows of `width` values; `output`: the graph
    output that is (None when more follows)."""
    act: str = "none"
    beta: float | None = None
    width: int = 0
    output: str | None = None

    def __call__(self, z: np.ndarray) -> np.ndarray:
        """[positions, channels] -> what they become."""
        lo, hi = ACTIVATIONS[self.act]
        y = z if lo is None else np.clip(z, lo, hi)
        return y if self.beta is None else _softmax(y.reshape(-1, self.width) * self.beta)

    def jacobians(self, z: np.ndarray) -> np.ndarray:
        """[rows, width, width]: each row's Jacobian of softmax(beta * act(z)) (rows of
        `width` = channels)."""
        lo, hi = ACTIVATIONS[self.act]
        slope = np.ones_like(z)
        if lo is not None:
            slope = ((z > lo) & (z < (np.inf if hi is None else hi))).astype(z.dtype)
        p = self(z)
        jac = np.einsum("ri,ij->rij", p, np.eye(p.shape[1])) - p[:, :, None] * p[:, None, :]
        return self.beta * jac * slope[:, None, :]


def output_tail(g: Graph, n: Node) -> Tail:
    """What a weighted node's pre-activation output becomes further on: its fused activation,
    and a softmax (along the last axis, with its beta) when the output reaches a softmax
    through reshapes only; and the graph output this reaches, if it does."""
    act = n.attrs.get("activation", "none")
    readers = {}
    for r in g.nodes:
        for t in r.inputs:
            readers.setdefault(t, []).append(r)
    t = n.outputs[0]
    while t not in g.outputs and len(readers.get(t, ())) == 1:
        r = readers[t][0]
        if r.op == "softmax" and r.attrs.get("axis", -1) in (-1, len(g.tensors[t].shape) - 1):
            out = r.outputs[0]
            return Tail(act, float(r.attrs.get("beta", 1.0)), int(g.tensors[t].shape[-1]),
                        out if out in g.outputs else None)
        if r.op != "reshape":
            break
        t = r.outputs[0]
    return Tail(act, output=t if t in g.outputs else None)


def _softmax(z: np.ndarray) -> np.ndarray:
    e = np.exp(z - z.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def output_error(ref: dict, got: list, names: list) -> float:
    """Sum over outputs of sum (got - ref)^2 / sum ref^2."""
    err = 0.0
    for name, y in zip(names, got):
        r = np.asarray(ref[name], np.float64)
        d = np.asarray(y, np.float64).reshape(r.shape) - r
        err += float(np.sum(d * d)) / max(float(np.sum(r * r)), 1e-30)
    return err


@dataclass
class Step:
    tensor: str  # the promoted tensor
    wide: frozenset  # every int16 tensor after the step
    error: float  # calibration output error after the step
    arena: int  # arena bytes after the step


@dataclass
class Choice:
    """The search's result: the int16 tensors, the steps taken, the int8 graph's error and
    arena, and how many candidate graphs were built and run."""
    wide: frozenset
    base_error: float
    base_arena: int
    steps: list = field(default_factory=list)
    evaluated: int = 0


def choose(g: Graph, build, evaluate, arena, budget, floor: float | None = None,
           min_gain: float = MIN_GAIN, max_steps: int = MAX_STEPS, batch: int = BATCH) -> Choice:
    """Greedy search (module docstring). `build(wide)` -> the quantized graph with those
    tensors in int16 (None when it cannot be built); `evaluate([graph, ...])` -> their output
    errors on the calibration samples (None where one cannot run), at most `batch` graphs at a
    time; `arena(graph)` -> its arena bytes (None when it cannot be planned). `budget`: the
    bytes the arena may grow by; None: DEFAULT_BUDGET of the all-int8 graph's. `floor`: the
    all-int8 graph's whole output error, when the evaluated error leaves part of it out (the
    rounding of the layers after the last weighted ones): the gains are measured against
    it."""
    base = build(frozenset())
    choice = Choice(frozenset(), evaluate([base])[0], arena(base), evaluated=1)
    if budget is None:
        budget = int(DEFAULT_BUDGET * choice.base_arena)
    cands = moves(g)
    if not cands or not choice.base_error:
        return choice
    threshold = min_gain * max(choice.base_error, floor or 0.0)
    wide, err = frozenset(), choice.base_error
    fits = {}  # the moves that fit the budget on their own: tensor -> (wide, graph, arena)
    for c, mv in cands.items():
        q = build(mv)
        used = arena(q) if q is not None else None
        if used is not None and used - choice.base_arena <= budget:
            fits[c] = (mv, q, used)
    fresh = {}  # moves measured in this step: tensor -> (wide, error, arena)
    bound = {}  # each move's gain when last measured
    # first step: which moves gain enough on their own, found by halving groups of them
    # (moves in graph order): a group that gains too little as a whole has no move that
    # gains enough (more int16 tensors never raise the error)
    groups = [list(fits)] if fits else []
    while groups:
        trials = [frozenset().union(*(fits[c][0] for c in group)) for group in groups]
        graphs = [fits[group[0]][1] if len(group) == 1 else build(t)
                  for group, t in zip(groups, trials)]
        errors = [None] * len(graphs)
        ok = [i for i, q in enumerate(graphs) if q is not None]
        for k in range(0, len(ok), batch):
            part = ok[k:k + batch]
            for i, e in zip(part, evaluate([graphs[i] for i in part])):
                errors[i] = e
        choice.evaluated += len(ok)
        split = []
        for group, trial, e in zip(groups, trials, errors):
            if e is not None and err - e < threshold:
                continue
            if len(group) == 1:
                if e is not None:
                    bound[group[0]] = err - e
                    fresh[group[0]] = (trial, e, fits[group[0]][2])
                continue
            split += [group[:len(group) // 2], group[len(group) // 2:]]
        groups = split
    while len(choice.steps) < max_steps and bound:
        order = sorted(bound, key=lambda c: (-bound[c], c))
        if bound[order[0]] < threshold:
            break
        if order[0] in fresh:  # measured in this step and still the best: take it
            best = order[0]
            wide, err, used = fresh.pop(best)
            choice.steps.append(Step(best, wide, err, used))
            choice.wide, fresh = wide, {}
            for c in list(bound):
                if cands[c] <= wide:
                    del bound[c]
            continue
        # measure the moves not measured in this step that could still beat the best one
        beat = max([threshold] + [bound[c] for c in fresh])
        todo = []
        for c in order:
            if c in fresh:
                continue
            if bound[c] < beat or len(todo) == batch:
                break
            trial = wide | cands[c]
            q = build(trial)
            used = arena(q) if q is not None else None
            if used is None or used - choice.base_arena > budget:
                del bound[c]  # over budget (and later steps only add int16 tensors)
                continue
            todo.append((c, trial, q, used))
        if not todo:
            continue
        errors = evaluate([q for _, _, q, _ in todo])
        choice.evaluated += len(todo)
        for (c, trial, _, used), e in zip(todo, errors):
            if e is None:
                del bound[c]
            else:
                bound[c] = err - e
                fresh[c] = (trial, e, used)
    return choice


def merge(graphs: list) -> Graph:
    """One graph computing `graphs` (which have the same inputs) side by side, so that they
    are built and run as one program: the inputs shared, the outputs of each graph in turn;
    every other tensor and node of graph i renamed "v{i}/<name>", but constants with the same
    name and contents in several graphs kept once."""
    if len(graphs) == 1:
        return graphs[0]
    first = graphs[0]
    tensors = {name: first.tensors[name] for name in first.inputs}
    nodes, outputs = [], []
    for i, q in enumerate(graphs):
        rename = {}
        for name, t in q.tensors.items():
            if name in q.inputs:
                continue
            old = tensors.get(name)
            if t.is_const and (old is None or old is t or (
                    old.is_const and old.dtype == t.dtype and old.quant == t.quant
                    and tuple(old.shape) == tuple(t.shape)
                    and np.array_equal(old.data, t.data))):
                tensors[name] = old or t
                continue
            new = f"v{i}/{name}"
            rename[name] = new
            tensors[new] = Tensor(new, t.shape, t.dtype, t.data, t.quant)
        sub = lambda names: tuple(rename.get(t, t) for t in names)  # noqa: E731
        nodes += [Node(n.op, sub(n.inputs), sub(n.outputs), n.attrs,
                       f"v{i}/{n.name}" if n.name else n.name) for n in q.nodes]
        outputs += list(sub(q.outputs))
    return first.replace(tensors=tensors, nodes=nodes, outputs=outputs)


def summary(choice: Choice, where: str) -> str:
    """One line on what the search did, for the progress stream."""
    db = lambda e: 10 * np.log10(1 / e) if e and e > 0 else float("inf")  # noqa: E731
    if not choice.wide:
        return (f"int16: every activation int8 (keeping none in int16 lowers the error of "
                f"{where} by {100 * MIN_GAIN:.0f}% within the arena budget; "
                f"{choice.evaluated} graphs tried)\n")
    last = choice.steps[-1]
    return (f"int16: {len(choice.wide)} activations kept in int16, arena "
            f"{choice.base_arena:,} -> {last.arena:,} bytes; SQNR of {where} on the "
            f"calibration data {db(choice.base_error):.2f} -> {db(last.error):.2f} dB "
            f"({choice.evaluated} graphs tried)\n")


# -- the search run on a quantizer (quantize.quantize_graph) ------------------------------

def with_int16(g: Graph, samples: list, moments: dict, bias_correction: bool, ref: dict,
               build, budget: int, progress, final_weighted, float_edges,
               correct_final_biases, run) -> Graph:
    """The quantized graph (final biases corrected with `bias_correction`) with the activations
    choose picks kept in int16. Candidates are compared on the first calibration samples
    by the error of the last weighted layers' outputs (layer_error; float inputs in
    `ref`), or without such layers by the graph outputs' error (float outputs in `ref`).
    quantize.py's helpers come as arguments (this module does not import it):
    `final_weighted(g)`, `float_edges(q)` and `correct_final_biases(g, q, samples, moments, run,
    values)`; `run` executes graphs (see calibrate.py)."""
    from mcuforge.ir.errors import BuildError

    from .memory_plan import plan_graph
    from .pipeline import optimize
    arrays = calibrate.stack_samples(g, samples)
    n_eval = min(len(arrays[0]), EVAL_SAMPLES)
    arrays = [a[:n_eval] for a in arrays]
    finals = [n for n in final_weighted(g)
              if n.outputs[0] in moments and n.inputs[0] not in g.inputs]
    tails = {n.outputs[0]: output_tail(g, n) for n in finals}
    reached = [tail.output for tail in tails.values()]
    # when the last layers lead straight to the outputs, the evaluated error of the int8
    # graph can be set against its whole output error
    whole = bool(finals) and None not in reached and sorted(reached) == sorted(g.outputs)
    seen = {}  # id of an evaluated graph -> what its final layers read (all samples only)
    errors, totals = {}, {}  # id of an evaluated graph -> its error; its whole output error
    failures = (McuforgeError, BuildError, NotImplementedError, ValueError)

    def error(q, outs: dict) -> float:
        made = {n.outputs[0]: n for n in q.nodes}
        if whole:
            totals[id(q)] = output_error(ref, [outs[t] for t in g.outputs], g.outputs)
        if not finals:
            return output_error(ref, [outs[t] for t in g.outputs], g.outputs)
        if n_eval == len(samples):
            seen[id(q)] = outs
        err = 0.0
        for n in finals:
            qn, m = made[n.outputs[0]], moments[n.outputs[0]]
            x = qn.inputs[0]
            err += layer_error(m, _dequantized(q.tensors[x], outs[x]), ref[n.inputs[0]],
                               _real_weights(g, n, q, qn), center=bias_correction,
                               tail=tails[n.outputs[0]])
        return err

    def probe(q) -> Graph:
        """q with float edges, its outputs what its final layers read and its outputs."""
        made = {n.outputs[0]: n for n in q.nodes}
        reads = [made[n.outputs[0]].inputs[0] for n in finals]
        p = float_edges(q)
        return p.replace(outputs=list(dict.fromkeys(reads + list(p.outputs))))

    def evaluate(qs: list) -> list:
        """The error of each graph in qs (None where it cannot be built), all built and run
        as one program when they can be."""
        todo = [q for q in qs if id(q) not in errors]
        probes = [probe(q) for q in todo]
        try:
            outs = list(run(merge(probes), arrays).values()) if todo else []
        except failures:  # an int16 kernel refusing some graph's parameters: each alone
            for q in todo:
                errors[id(q)] = None if len(todo) == 1 else evaluate([q])[0]
            return [errors[id(q)] for q in qs]
        for q, p in zip(todo, probes):
            errors[id(q)] = error(q, dict(zip(p.outputs, outs[:len(p.outputs)])))
            outs = outs[len(p.outputs):]
        return [errors[id(q)] for q in qs]

    def arena(q):
        try:
            return plan_graph(optimize(q)).arena_size
        except failures:
            return None

    graphs = {}

    def build_kept(wide):
        if wide not in graphs:
            try:
                graphs[wide] = build(wide)
            except failures:  # an int16 kernel refusing these parameters: not a candidate
                graphs[wide] = None
        return graphs[wide]

    evaluate([build_kept(frozenset())])
    choice = choose(g, build_kept, evaluate, arena, budget,
                    totals.get(id(graphs[frozenset()])))
    q = graphs[choice.wide]
    if bias_correction:
        q = correct_final_biases(g, q, samples, moments, run, seen.get(id(q)))
    if progress is not None:
        progress.write(summary(choice, "the last layers' outputs" if finals else
                               "the outputs"))
        progress.flush()
    return q


def _dequantized(t: Tensor, values: np.ndarray) -> np.ndarray:
    q = t.quant
    return ((values.astype(np.float64) - q.zero_point[0]) * q.scale[0]).astype(np.float32)


def _real_weights(g: Graph, n: Node, q: Graph, qn: Node) -> tuple:
    """((float weights, float bias), (the quantized node's weights and bias as reals)) of a
    weighted node; a missing bias is 0."""
    def real(t):
        if t.quant is None:
            return t.data.astype(np.float64)
        scale = np.asarray(t.quant.scale, np.float64)
        shape = [1] * t.data.ndim
        if scale.size > 1:
            shape[t.quant.axis] = -1
        return t.data.astype(np.float64) * scale.reshape(shape)

    def pair(node, graph):
        w = real(graph.tensors[node.inputs[1]])
        b = real(graph.tensors[node.inputs[2]]).reshape(-1) \
            if len(node.inputs) > 2 and node.inputs[2] else np.zeros(1)
        return w, b

    return pair(n, g), pair(qn, q)
