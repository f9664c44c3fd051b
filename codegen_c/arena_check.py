"""The checked build's arena tables (`mcuforge run --check-arena`, compile(arena_check=True)).

Under AddressSanitizer, with MCUFORGE_ARENA_CHECK defined, the generated code poisons the whole
arena (or a subgraph's region of it) before each kernel call and unpoisons exactly what that
node may touch: its inputs, its outputs, its kernel scratch (a control-flow node: its scratch,
where its subgraphs run). Then it poisons again the red-zones (memory_plan's `redzone` bytes
after each buffer) of every buffer live at that step, so two live buffers a wrong plan made
share bytes meet poison, even when the step touches both. A kernel that reads or writes one
byte outside its own tensors, a read of a dead tensor, a plan the static check
(optimizer/plan_check.py) missed: each is an ASan report naming the access.

After the last node the model's inputs and outputs (and the next values of state tensors,
which the invoke then copies) are readable again, so the application can use its buffers; a
subgraph's function ends with its region readable, for the memcpy's of the control flow
around it. The state block's red-zones are poisoned by reset. In-place pairs (an output
written over an input its node reads for the last time) are excepted as the plan checker
excepts them: the input's red-zone is not poisoned at that step.

Nothing of this is in the default output: generate() emits it only when asked."""
from __future__ import annotations

from mcuforge.ir.graph import Graph
from mcuforge.optimizer.memory_plan import MemoryPlan, _scratch_name

REDZONE = 32  # bytes after each buffer: a multiple of ASan's 8-byte granule

PREAMBLE = """\
/* Arena check: built with -fsanitize=address and -DMCUFORGE_ARENA_CHECK (make SANITIZE=1
 * CHECK_ARENA=1), each step poisons its region of the arena, unpoisons what the step's node
 * may touch and poisons the red-zones of every live buffer (codegen_c/arena_check.py).
 * Without AddressSanitizer the check does nothing. */
#ifdef MCUFORGE_ARENA_CHECK
#if defined(__SANITIZE_ADDRESS__)
#define {NAME}_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define {NAME}_ASAN 1
#endif
#endif
#ifdef {NAME}_ASAN
#include <sanitizer/asan_interface.h>
#define {NAME}_POISON(p, n) ASAN_POISON_MEMORY_REGION((p), (n))
#define {NAME}_UNPOISON(p, n) ASAN_UNPOISON_MEMORY_REGION((p), (n))
#else
#define {NAME}_POISON(p, n) ((void)(p), (void)(n))
#define {NAME}_UNPOISON(p, n) ((void)(p), (void)(n))
#endif

/* t: the number of ranges to unpoison, their (offset, bytes) pairs, then the number of
 * red-zones to poison and theirs; offsets from `region`, which is `bytes` long. */
static void {name}_check(uint8_t *region, uint32_t bytes, const uint32_t *t) {{
    uint32_t k, n;
    {NAME}_POISON(region, bytes);
    for (n = *t++, k = 0; k < n; k++, t += 2) {{
        {NAME}_UNPOISON(region + t[0], t[1]);
    }}
    for (n = *t++, k = 0; k < n; k++, t += 2) {{
        {NAME}_POISON(region + t[0], t[1]);
    }}
}}
#define {NAME}_CHECK(region, bytes, table) {name}_check(region, bytes, table)

{tables}
#else
#define {NAME}_CHECK(region, bytes, table) ((void)0)
#endif"""


class ArenaCheck:
    """Collects the tables of a model's steps while its calls are emitted (codegen_c/model.py);
    each method returns the C statement that runs one."""

    def __init__(self, name: str):
        self.name, self.tables = name, []

    def _table(self, opens: list, closes: list, what: str) -> str:
        label = f"{self.name}_ck{len(self.tables)}"
        words = [len(opens), *[v for r in opens for v in r], len(closes),
                 *[v for r in closes for v in r]]
        body = ", ".join(map(str, words))
        self.tables.append(f"/* {what} */\nstatic const uint32_t {label}[] = {{{body}}};")
        return label

    def _call(self, region: str, size: int, table: str) -> str:
        return f"{self.name.upper()}_CHECK({region}, {size}, {table});"

    def step(self, g: Graph, plan: MemoryPlan, base: int, i: int, node, what: str) -> str:
        """Before node i of `g` (its plan starting at arena offset `base`)."""
        opens = _operands(g, plan, node)
        outs = [r for t in node.outputs if t in plan.offsets
                for r in [(plan.offsets[t], g.tensors[t].nbytes)]]
        closes = []
        inputs = {t for t in node.inputs if t}
        # inputs read for the last time that may hold this node's output (in place): the
        # inputs (alias roots) overlapping an output, and the planned links' inputs
        linked = {plan.in_place[t][0] for t in node.outputs if t in plan.in_place}
        over = [(plan.offsets[r.name], r.size) for r in plan.requests
                if r.last == i and r.name in plan.offsets and (r.name in linked or (
                    r.name in inputs and any(
                        plan.offsets[r.name] < oo + on and oo < plan.offsets[r.name] + r.size
                        for oo, on in outs)))]
        for r in plan.requests:
            if not r.first <= i <= r.last or r.name not in plan.offsets:
                continue
            o = plan.offsets[r.name]
            if any(o == xo and r.size == xn for xo, xn in over):
                continue  # its red-zone may hold the output
            # an output's red-zone inside the input it is written over (an output smaller
            # than its input, or shifted below it): bytes the node still reads
            z = (o + r.size, plan.redzone)
            if r.first == i and any(z[0] < xo + xn and xo < z[0] + z[1] for xo, xn in over):
                continue
            closes.append(z)
        table = self._table(opens, closes, f"step {i}: {what}")
        return self._call(f"&arena.bytes[{base}]", plan.arena_size, table)

    def region_open(self, plan: MemoryPlan, base: int, what: str) -> str:
        """A subgraph's region readable again (its function's end)."""
        table = self._table([(0, plan.arena_size)], [], f"end of {what}")
        return self._call(f"&arena.bytes[{base}]", plan.arena_size, table)

    def end(self, g: Graph, plan: MemoryPlan) -> str:
        """After the invoke's last node: the ports and the state tensors' next values."""
        names = list(dict.fromkeys([*g.inputs, *g.outputs, *g.state.values()]))
        opens = [(plan.offsets[t], g.tensors[t].nbytes) for t in names
                 if t in plan.offsets and t not in plan.state_offsets]
        return self._call("&arena.bytes[0]", plan.arena_size,
                          self._table(opens, [], "after the last node: inputs, outputs, "
                                                 "next state values"))

    def state(self, g: Graph, plan: MemoryPlan) -> str | None:
        """Reset: the state block's red-zones poisoned, its tensors readable."""
        if not plan.state_size:
            return None
        opens = [(plan.state_offsets[t], g.tensors[t].nbytes) for t in g.state]
        return self._call("&state.bytes[0]", plan.state_size,
                          self._table(opens, [], "state block"))

    def preamble(self) -> str:
        return PREAMBLE.format(name=self.name, NAME=self.name.upper(),
                               tables="\n".join(self.tables))


def _operands(g: Graph, plan: MemoryPlan, node) -> list:
    """(offset, bytes) of what the node may touch in the arena (its region of it)."""
    out = []
    for t in [*node.inputs, *node.outputs]:
        if t and not g.tensors[t].is_const and t in plan.offsets \
                and t not in plan.state_offsets:
            out.append((plan.offsets[t], g.tensors[t].nbytes))
    sizes = {r.name: r.size for r in plan.requests}
    for kind in ("kernel", "scratch"):
        name = _scratch_name(g, node, kind)
        if name in plan.offsets:
            out.append((plan.offsets[name], sizes[name]))
    return sorted(set(out))
