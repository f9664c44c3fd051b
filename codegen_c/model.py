"""Graph + memory plan -> the C sources of a model (model.c, model.h) through the templates.

Control flow: each subgraph of an if / while node becomes a static function `<name>_sg<k>`
whose kernels address the arena at the node's scratch (optimizer.memory_plan); the node
itself is C control flow around calls of those functions, with memcpy moving values between
its tensors and the subgraphs' inputs and outputs, as tflite-micro's kernels do."""
from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from mcuforge.ir.errors import UnsupportedOpError
from mcuforge.ir.graph import SUBGRAPH_ATTRS, Graph, Tensor, subgraphs
from .resources import render
from mcuforge.ir.target import HOST, Target
from mcuforge.optimizer.memory_plan import ORDER_NODES, MemoryPlan, plan_graph, topological_orders
from mcuforge.optimizer.plan_check import check_plan

from . import printer
from .arena_check import REDZONE, ArenaCheck, granule
from .names import c_comment, c_identifier
from .kernels import budget, lower_node


MATH_PREFIX = "mfm_"  # runtime functions of runtime_c/mcuforge_math.h
MICRO_HEADERS = {"mcuforge_nn.h": ("mf_gemm_", "mf_gemm2_", "mf_gemm1k8_", "mf_conv_",
                                   "mf_convp_", "mf_convrp"),  # header -> its calls
                 "mcuforge_dw.h": ("mf_dw3x3_s8",), "mcuforge_ew.h": ("mf_ew_",),
                 "mcuforge_vec.h": ("mf_vec_",), "mcuforge_seq.h": ("mf_seq_",),
                 "mcuforge_mve.h": ("mf_mve_gemm", "mf_mve_conv"),
                 "mcuforge_mve_dw.h": ("mf_mve_dw_",), "mcuforge_scalar.h": ("mf_sc_",),
                 "mcuforge_rv.h": ("mf_rv_",)}


@dataclass
class Port:
    """A model input or output as the generated API exposes it."""
    index: int
    name: str  # the model's tensor name
    ctype: str
    dtype: str
    shape: tuple
    size: int  # elements
    nbytes: int
    offset: int
    scale: float | None
    zero_point: int | None

    @property
    def scale_c(self) -> str:
        return printer.c_float(self.scale)


@dataclass
class LayerCall:
    kernel_name: str
    comment: str
    args: list  # C expressions, one per kernel parameter
    lines: list = field(default_factory=list)  # control flow: C statements instead of a call
    macs: int = 0  # of the kernel; control flow: of its subgraphs, each kernel once (as .macs)
    check: str | None = None  # the checked build's statement before it (arena_check.py)
    after: str | None = None  # and after it

    @property
    def statements(self) -> list:
        return self.lines or [f"{self.kernel_name}({', '.join(self.args)});"]


@dataclass
class SubgraphFunction:
    """A subgraph of a control-flow node as a static C function of its kernel calls."""
    name: str
    comment: str
    calls: list  # LayerCall
    end: str | None = None  # the checked build's statement after the calls (arena_check.py)


@dataclass
class StateCopy:
    """End of an invocation: a state tensor takes its next value."""
    comment: str
    dst: str  # C expression of the state buffer
    src: str  # C expression of the next value
    nbytes: int


@dataclass
class StateInit:
    comment: str
    dst: str
    default: int  # the byte reset fills the buffer with
    src: str | None  # a const array init copies in after the reset; None: the default
    nbytes: int


@dataclass
class GeneratedModel:
    name: str
    files: dict  # file name -> text
    kernels: list
    macs: int
    weight_bytes: int
    inputs: list  # Port
    outputs: list
    plan: MemoryPlan | None = None  # the arena plan the code addresses (kernel scratch included)
    schedules: list = field(default_factory=list)  # kernels.budget.Choice per scheduled layer
    layers: list = field(default_factory=list)  # (name, MACs) of each call in the invoke
    # node index -> ((input tensor, shift), ...): the kernels' in-place declarations
    # (plan_check's `declared`)
    declared: dict = field(default_factory=dict)
    graph: Graph | None = None  # the graph as compiled: its nodes in the order the calls run
    memory_priority: object = None  # optimizer.patch.Choice, when the stage was chosen so


def short_name(tensor_name: str) -> str:
    """A readable C fragment of a framework tensor name ('a/b/Relu;a/b/BiasAdd' -> 'b_Relu')."""
    first = tensor_name.split(";")[0]
    parts = [p for p in first.split("/") if p]
    return c_identifier("_".join(parts[-2:]) if parts else first, limit=32)


def _port(g: Graph, name: str, index: int, offset: int) -> Port:
    t: Tensor = g.tensors[name]
    q = t.quant
    return Port(index, name, printer.C_TYPES[t.dtype], t.dtype, tuple(t.shape), t.size, t.nbytes,
                offset, float(q.scale[0]) if q else None, int(q.zero_point[0]) if q else None)


def generate(g: Graph, name: str, target: Target = HOST, profile: bool = False,
             stamp: list | None = None, keep_input: bool = False,
             arena_check: bool = False) -> GeneratedModel:
    """The C sources of graph `g` for `target`: every node lowered and scheduled, the arena
    planned with the kernels' scratch, the calls and definitions printed. `profile`: the invoke
    marks each layer boundary with MF_LAYER_MARK (model.c.j2), a no-op unless compiled with
    -DMCUFORGE_PROFILE; without it the C is as it always was. `stamp`: the lines each file
    starts with (templates/banner.j2; default: a plain "generated" line). Kernels that declare
    it write their output over an input they have finished reading (kernels/inplace.py),
    the model's input included unless `keep_input`. `arena_check`: the checked build
    (codegen_c/arena_check.py): the plan with red-zones, and the tables that poison the arena
    around each step under -DMCUFORGE_ARENA_CHECK with AddressSanitizer (without it, the
    plain-C check of red-zone patterns and poisoned dead tensors, for the boards)."""
    kernels = _lower_all(g, target)
    while True:  # the flash budget keeps some layers' weights int8; again on the kernels as
        # lowered, should fit's estimate of the bytes saved have fallen short
        narrowed = budget.fit(target, {out: kernels[key] for key, out in _outputs(g).items()})
        if narrowed == target:
            break
        target, kernels = narrowed, _lower_all(g, narrowed)

    g, plan, declared = plan_model(g, kernels, keep_input, REDZONE if arena_check else 0,
                                   granule=granule(target))
    # a wrong plan stops here, before any C is written; in-place overlaps only by the rule,
    # from the kernels' declarations (not from the plan)
    check_plan(g, plan, declared=declared, keep_input=keep_input)
    overwrites = sorted({x for x, _ in plan.in_place.values() if x in g.inputs})
    em = _Emitter(name, kernels, ArenaCheck(name) if arena_check else None)
    calls = em.calls(g, plan, 0, "")
    kernels, consts = em.kernels, em.definitions
    state_copies, state_inits = _state(g, plan, consts)
    inputs = [_port(g, n, i, plan.offsets[n]) for i, n in enumerate(g.inputs)]
    outputs = [_port(g, n, i, plan.offsets[n]) for i, n in enumerate(g.outputs)]
    macs = sum(k.macs for k in kernels)  # subgraph kernels counted once
    weight_bytes = em.weight_bytes
    # float math (expf, erff, ...) comes from mcuforge_math.h, included only when used: int8
    # models need nothing beyond <stdint.h>, <stddef.h> and <string.h>
    uses_math = any(MATH_PREFIX in d for d in consts)
    # micro-kernel headers only when a scheduled kernel calls into them
    micro_headers = [h for h, prefixes in MICRO_HEADERS.items()
                     if any(p in d for d in consts for p in prefixes)]
    ctx = dict(name=name, NAME=name.upper(), graph=g, plan=plan, inputs=inputs, outputs=outputs,
               calls=calls, definitions=consts, functions=em.functions, macs=macs,
               weight_bytes=weight_bytes, uses_math=uses_math, micro_headers=micro_headers,
               state_copies=state_copies, state_inits=state_inits, state_size=plan.state_size,
               profile=profile, overwrites_input=overwrites, keep_input=keep_input,
               ops=sorted({n.op for n in _all_nodes(g)}))
    if stamp is not None:
        ctx["stamp"] = stamp
    if em.check is not None:  # absent otherwise: the default output is as it always was
        ctx.update(check_end=em.check.end(g, plan), check_state=em.check.state(g, plan),
                   check_start=em.check.start(g, plan))
        ctx["arena_check"] = em.check.preamble()
    files = {
        f"{name}.h": render("model.h.j2", ctx),
        f"{name}.c": render("model.c.j2", ctx),
    }
    return GeneratedModel(name, files, kernels, macs, weight_bytes, inputs, outputs, plan,
                          budget.choices({out: em.lowered[key] for key, out in _outputs(g).items()}),
                          [(c.kernel_name, c.macs) for c in calls], declared, g)


def _best_order(g: Graph, plan_of) -> tuple:
    """(graph, plan): the graph's nodes in the topological order whose plan has the smallest
    arena (memory_plan.topological_orders: a bounded search, the orders compared by a quick
    plan, `plan_of(graph, search=False)`; the graph's own order unless another's full plan is
    strictly smaller), so the calls run in the order planned."""
    best_g, best = g, plan_of(g)
    if any(subgraphs(n) for n in g.nodes) or len(g.nodes) > ORDER_NODES:
        return best_g, best
    orders = topological_orders(g)
    if len(orders) < 2:
        return best_g, best
    quick = [(plan_of(replace(g, nodes=list(nodes)), search=False).arena_size, k)
             for k, nodes in enumerate(orders)]
    _, k = min(quick)
    if k:
        other = replace(g, nodes=list(orders[k]))
        p = plan_of(other)
        if p.arena_size < best.arena_size:
            best_g, best = other, p
    return best_g, best


def in_place_table(g: Graph, kernels: dict) -> dict:
    """id(node) -> ((input tensor, byte shift), ...): what each node's kernel declares its
    output may be written over (its in_place buffers mapped to the node's tensors the way the
    calls pass them)."""
    out = {}
    for node in g.nodes:
        k = kernels.get(id(node))
        if k is None or not k.in_place:
            continue
        tensors = [t for t in node.inputs if t and not g.tensors[t].is_const]
        by_buf = {b.name: t for b, t in zip([b for b in k.params if b.kind == "in"], tensors)}
        decl = tuple((by_buf[e[0]], e[1]) for e in k.in_place if e[0] in by_buf)
        if decl:
            out[id(node)] = decl
    return out


def plan_model(g: Graph, kernels: dict, keep_input: bool = False, redzone: int = 0,
               quick: bool = False, granule: int = 8) -> tuple:
    """(graph, plan, declared): the arena plan of `g` with its kernels (id(node) -> Kernel):
    their scratch, their in-place declarations (declared: node index -> ((input, shift), ...),
    plan_check's), the nodes in the topological order with the smallest arena (_best_order).
    `quick`: the graph's own order, every in-place link or none (an estimate, much faster);
    `redzone`, `granule`: plan_graph's (the checked build's)."""
    def scratch_of(graph, node):
        k = kernels.get(id(node))
        return (k.scratch_bytes, 8) if k is not None and k.scratch else None
    declared = in_place_table(g, kernels)

    def plan_of(graph, search=True):
        return plan_graph(graph, scratch_of, lambda _, node: declared.get(id(node)), keep_input,
                          search and not quick, redzone, granule)
    g, plan = (g, plan_of(g)) if quick else _best_order(g, plan_of)
    return g, plan, {i: declared[id(n)] for i, n in enumerate(g.nodes) if id(n) in declared}


def arena_and_macs(g: Graph, target: Target = HOST, cache: dict | None = None,
                   quick: bool = False, keep_input: bool = False) -> tuple:
    """(arena bytes, MACs) of `g` as generate would plan and count them for `target` (kernel
    scratch included), without printing any C: a cost for optimizer.patch.choose. `cache`
    keeps each distinct layer's kernel between calls (its op, attributes, constants and shapes
    decide it); the plan is generate's (plan_model: in place, node order), or with `quick`
    plan_model's estimate; `keep_input` as generate's."""
    cache = {} if cache is None else cache
    kernels = {}
    for node in g.nodes:
        if node.op in SUBGRAPH_ATTRS:
            return generate(g, "model", target).plan.arena_size, 0  # not worth a shortcut
        key = (node.op, repr(sorted(node.attrs.items())), tuple(
            (t, None) if t and g.tensors[t].is_const else
            (g.tensors[t].dtype, tuple(g.tensors[t].shape), g.tensors[t].quant) if t else ""
            for t in node.inputs), tuple((g.tensors[t].dtype, tuple(g.tensors[t].shape),
                                          g.tensors[t].quant) for t in node.outputs))
        if key not in cache:
            cache[key] = _lower_all(Graph(g.tensors, [node], [], []), target)[id(node)]
        if cache[key] is not None:
            kernels[id(node)] = cache[key]
    _, plan, _ = plan_model(g, kernels, keep_input, quick=quick)
    return plan.arena_size, sum(k.macs for k in kernels.values())


def _outputs(g: Graph, out: dict | None = None) -> dict:
    """id(node) -> its first output's name, for every node with a kernel (subgraphs too)."""
    out = {} if out is None else out
    for node in g.nodes:
        for sub in subgraphs(node):
            _outputs(sub, out)
        if node.op not in SUBGRAPH_ATTRS:
            out[id(node)] = node.outputs[0]
    return out


def _lower_all(g: Graph, target: Target, out: dict | None = None) -> dict:
    """id(node) -> its kernel for `target` (None for aliases and control flow), subgraphs
    included; a node that cannot be lowered is one clear error naming it."""
    out = {} if out is None else out
    for i, node in enumerate(g.nodes):
        if node.op in SUBGRAPH_ATTRS:
            for sub in subgraphs(node):
                _lower_all(sub, target, out)
            out[id(node)] = None
            continue
        try:
            out[id(node)] = lower_node(node, g, "kernel", target)
        except (NotImplementedError, ValueError) as e:
            raise UnsupportedOpError(
                f"node {i} ({node.op}, output '{node.outputs[0]}') cannot be compiled: {e}. "
                f"Change the model so this layer avoids it, or report it as a missing "
                f"feature.") from e
    return out


def _all_nodes(g: Graph):
    for n in g.nodes:
        yield n
        for s in subgraphs(n):
            yield from _all_nodes(s)


class _Emitter:
    """The kernels, file-scope definitions and subgraph functions of a model, collected while
    its graph and (depth first) its subgraphs are walked. Subgraph functions are listed after
    the kernels and before the functions calling them."""

    def __init__(self, name: str, kernels: dict, check: ArenaCheck | None = None):
        self.name, self.lowered, self.check = name, kernels, check
        self.kernels, self.definitions, self.functions = [], [], []
        self.subgraph_count = 0
        self.tables = {}  # (band group or kernel, dtype, bytes) -> its const array's name
        self.functions_by_text = {}  # (band group, C with the name blanked) -> function name
        self.weight_bytes = 0  # of the distinct tables
        self.shared = set()  # the kernels' file-scope definitions printed so far (Kernel.shared)

    def calls(self, g: Graph, plan: MemoryPlan, base: int, prefix: str) -> list:
        """The calls running graph g, whose plan starts at arena offset `base`."""
        calls = []
        for i, node in enumerate(g.nodes):
            kname = f"{prefix}l{i:02d}_{node.op}_{short_name(node.outputs[0])}"
            if node.op in SUBGRAPH_ATTRS:
                calls.append(self._control(g, plan, base, i, node, kname))
                calls[-1].check, calls[-1].after = self._check(g, plan, base, i, node, kname)
                continue
            k = self.lowered[id(node)]
            if k is None:
                continue
            k = replace(k, name=f"{prefix}l{i:02d}_{node.op}_{short_name(node.outputs[0])}")
            self.kernels.append(k)
            # the bands of one layer (optimizer/patch.py) share its tables and, where their
            # C is the same but for the name, one function
            group = node.attrs.get("band_of")
            names, fresh = {}, []
            for b in k.consts:
                key = (group if group is not None else k.name, b.dtype,
                       np.asarray(b.data).astype(b.dtype).tobytes())
                if key not in self.tables:
                    self.tables[key] = f"{k.name}_{b.name}"
                    self.weight_bytes += len(key[2])
                    fresh.append(b)
                names[b.name] = self.tables[key]
            self.definitions += [printer.print_array(names[b.name], b.dtype, b.data)
                                 for b in fresh]
            for d in k.shared:  # (a shared copy before its first caller)
                if d not in self.shared:
                    self.shared.add(d)
                    self.definitions.append(d)
            args = []
            tensors = [t for t in node.inputs if t and not g.tensors[t].is_const] \
                + list(node.outputs)
            for b, tname in zip(k.params, tensors):
                const = "const " if b.kind == "in" else ""
                args.append(f"({const}{printer.C_TYPES[b.dtype]} *){_address(plan, tname, base)}")
            at = plan.kernel_scratch(g, node)
            for b in k.scratch:  # consecutive in the node's scratch request, 8-aligned each
                args.append(f"({printer.C_TYPES[b.dtype]} *)&arena.bytes[{base + at}]")
                at += (b.size * printer.ITEMSIZE[b.dtype] + 7) // 8 * 8
            comment = f"{node.op} -> {node.outputs[0]}"
            check, after = self._check(g, plan, base, i, node, k.name)
            same = (group, printer.print_kernel(replace(k, name="mf_same", doc=""), names)) \
                if group is not None else None
            if same is not None and same in self.functions_by_text:  # the layer keeps its
                # name (profiles, reports) and calls the function of its first band
                shared = self.functions_by_text[same]
                calls.append(LayerCall(k.name, c_comment(comment), args,
                                       [f"{shared}({', '.join(args)});"], macs=k.macs,
                                       check=check, after=after))
                continue
            if same is not None:
                self.functions_by_text[same] = k.name
            calls.append(LayerCall(k.name, c_comment(comment), args, macs=k.macs, check=check,
                                   after=after))
            self.definitions.append(printer.print_kernel(k, names))
        return calls

    def _check(self, g: Graph, plan: MemoryPlan, base: int, i: int, node, what: str):
        """(before, after) statements of the checked build, or (None, None)."""
        return self.check.step(g, plan, base, i, node, what) if self.check else (None, None)

    def _source(self, g: Graph, plan: MemoryPlan, base: int, tensor: str) -> str:
        """The address of a value a copy reads: a constant becomes a const array."""
        t = g.tensors[tensor]
        if not t.is_const:
            return _address(plan, tensor, base)
        name = f"{self.name}_c{len(self.definitions)}_{c_identifier(short_name(tensor), limit=24)}"
        self.definitions.append(printer.print_array(name, t.dtype, t.data))
        return name

    def _control(self, g: Graph, plan: MemoryPlan, base: int, i: int, node,
                 label: str) -> LayerCall:
        """An if / while node: its subgraphs as functions, itself as C control flow (one
        layer named `label` to a profile)."""
        offset, plans = plan.subplans[i]
        runs = []
        for attr, sub, sub_plan in zip(SUBGRAPH_ATTRS[node.op], subgraphs(node), plans):
            k = self.subgraph_count
            self.subgraph_count += 1
            run = _Run(f"{self.name}_sg{k}", sub, sub_plan, base + offset)
            self.functions.append(SubgraphFunction(
                run.function, c_comment(f"{attr.replace('_graph', '')} of {node.op} -> "
                                       f"{node.outputs[0]}: {sub.name}"),
                self.calls(sub, sub_plan, run.base, f"sg{k}_"),
                self.check.region_open(sub_plan, run.base, run.function) if self.check
                else None))
            runs.append(run)

        def out_of(run):
            """The node's outputs take the subgraph's outputs."""
            return [_copy(_address(plan, y, base), run.address(t), run.graph.tensors[t].nbytes,
                          f"'{t}' -> '{y}'") for t, y in zip(run.graph.outputs, node.outputs)]

        if node.op == "if":
            operands = node.inputs[1:]
            sources = [self._source(g, plan, base, v) for v in operands]
            cond = self._source(g, plan, base, node.inputs[0])
            lines = [f"if (*(const uint8_t *){cond} != 0) {{"]
            for k, run in enumerate(runs):
                if k:
                    lines.append("} else {")
                lines += _indent(run.into(sources, operands) + [f"{run.function}();"]
                                 + out_of(run))
            lines.append("}")
            comment = f"if -> {node.outputs[0]}: then {runs[0].function}, else " \
                      f"{runs[1].function}"
        else:
            # as tflite-micro: the outputs start as the inputs and carry the values; the
            # condition's first output is read right after it runs (the body reuses its memory)
            cond, body = runs
            outs = [_address(plan, y, base) for y in node.outputs]
            lines = [_copy(o, self._source(g, plan, base, x), g.tensors[y].nbytes,
                           f"'{x}' -> '{y}'")
                     for o, x, y in zip(outs, node.inputs, node.outputs)]
            lines += ["for (;;) {",
                      *_indent(cond.into(outs, node.outputs) + [f"{cond.function}();"]),
                      f"    if (*(const uint8_t *){cond.address(cond.graph.outputs[0])} == 0) {{",
                      "        break;",
                      "    }",
                      *_indent(body.into(outs, node.outputs) + [f"{body.function}();"]
                               + out_of(body)),
                      "}"]
            comment = f"while -> {node.outputs[0]}: cond {cond.function}, body {body.function}"
        macs = sum(c.macs for f in self.functions if f.name in {r.function for r in runs}
                   for c in f.calls)
        return LayerCall(label, c_comment(comment), [], lines, macs)


@dataclass
class _Run:
    """A subgraph as a control-flow node runs it: its C function, graph and plan, and where
    in the arena its plan starts."""
    function: str
    graph: Graph
    plan: MemoryPlan
    base: int

    def address(self, tensor: str) -> str:
        return _address(self.plan, tensor, self.base)

    def into(self, sources: list, labels) -> list:
        """memcpy lines giving the subgraph's inputs the values at `sources` (C addresses;
        `labels` name them); an input the subgraph never reads is left alone."""
        read = {t for n in self.graph.nodes for t in n.inputs} | set(self.graph.outputs)
        return [_copy(self.address(t), src, self.graph.tensors[t].nbytes, f"'{v}' -> '{t}'")
                for t, src, v in zip(self.graph.inputs, sources, labels) if t in read]


def _copy(dst: str, src: str, nbytes: int, what: str) -> str:
    return f"memcpy({dst}, {src}, {nbytes});  /* {c_comment(what)} */"


def _indent(lines: list) -> list:
    return ["    " + ln for ln in lines]


def _address(plan: MemoryPlan, tensor: str, base: int = 0) -> str:
    if tensor in plan.state_offsets:
        return f"&state.bytes[{plan.state_offsets[tensor]}]"
    return f"&arena.bytes[{base + plan.offsets[tensor]}]"


def _state(g: Graph, plan: MemoryPlan, consts: list) -> tuple:
    """The copies that end an invocation (next values into the state block) and the reset
    values. Copies reading the state block come first, so each reads the value the
    invocation started with."""
    copies, inits = [], []
    for k, (name, nxt) in enumerate(g.state.items()):
        t = g.tensors[name]
        dst = _address(plan, name)
        label = c_comment(f"state '{name}' {t.dtype}{list(t.shape)}")
        if g.tensors[nxt].is_const:
            src = f"state{k}_next"
            consts.append(printer.print_array(src, t.dtype, g.tensors[nxt].data))
        else:
            src = _address(plan, nxt)
        if src != dst:
            copies.append(StateCopy(f"{label} <- '{c_comment(nxt)}'", dst, src, t.nbytes))
        # tflite-micro's default: the zero point byte for int8 state, else zeros
        default = int(t.quant.zero_point[0]) & 0xFF if t.dtype == "int8" and t.quant else 0
        init = g.state_init.get(name)
        src = None
        if init is not None:
            src = f"state{k}_init"
            consts.append(printer.print_array(src, t.dtype, np.asarray(init)))
        inits.append(StateInit(label, dst, default, src, t.nbytes))
    copies.sort(key=lambda c: not c.src.startswith("&state."))
    for i, c in enumerate(copies):
        if c.src.startswith("&state.") and any(c.src == d.dst for d in copies[:i]):
            raise UnsupportedOpError(f"state update {c.comment}: the next values of two state "
                                     "tensors read each other (a swap); not supported")
    return copies, inits


def io_dtypes(g: Graph) -> tuple:
    return ([np.dtype(g.tensors[n].dtype) for n in g.inputs],
            [np.dtype(g.tensors[n].dtype) for n in g.outputs])
