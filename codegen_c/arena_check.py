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

Without AddressSanitizer (the emulated boards, any -DMCUFORGE_ARENA_CHECK build without
-fsanitize=address) the same tables drive a check in plain C, with a pattern (PATTERN, a
function of the byte's offset in its region):
- the invoke first fills the whole arena but its inputs with the pattern;
- before each step, every byte no buffer live at that step holds (the red-zones included, and
  the plan's red-zones even where a wrong plan put a buffer) is filled with the pattern, and
  the live buffers the node must not change (all but its outputs, its scratch and an input
  it writes over in place) are summed (FNV-1a);
- after the step, those bytes are compared with the pattern and those buffers summed again:
  the first differing byte, and each changed buffer (by its offset), is reported through
  mf_arena_violation(layer, arena offset), which the application defines (the firmware
  harness prints "arena-check <layer> <offset>", which `mcuforge run` turns into
  target.ArenaCheckError; the host harness writes to stderr and exits);
- and the bytes of the buffers read for the last time (kernel scratch included) are
  overwritten with the pattern, except those a buffer still live holds (an in-place output
  over its input), so a later kernel that reads a dead tensor computes with the pattern and
  the bit-exact comparison sees it;
- the state block's bytes outside its tensors (their red-zones) are filled by reset and
  compared after every step (reported at 0x80000000 + their offset in the block).
On a board the checked plan keeps the planner's 4-byte alignment (granule()), so no in-place
link is lost to alignment; the red-zones still change the buffers' sizes, and the planner's
search may then keep other links than the plan the board runs without the check (AD on
mps3-an547: 3 of the 7 links it runs with are not in the checked plan, which has 3 others),
so those are not checked.

Nothing of this is in the default output: generate() emits it only when asked; without
-DMCUFORGE_ARENA_CHECK the checked C's statements are ((void)0)."""
from __future__ import annotations

from mcuforge.ir.graph import Graph
from mcuforge.optimizer.memory_plan import ALIGN, MemoryPlan, _scratch_name

REDZONE = 32  # bytes after each buffer: a multiple of ASan's 8-byte granule


STATE_CHECK = """
/* after a step of a model with state: the state block's bytes outside its tensors compared
 * (a byte that differs reported at STATE_BIT + its offset in the block) */
#define {NAME}_STATE_BIT 0x80000000u
static void {name}_check_state(const uint8_t *block, const uint32_t *t, const char *layer) {{
    uint32_t k, j, n;
    const uint32_t *w = {name}_next({name}_next({name}_next(t + 1)));
    for (n = *w++, k = 0; k < n; k++, w += 2) {{
        for (j = w[0]; j < w[0] + w[1]; j++) {{
            if (block[j] != {NAME}_PATTERN(j)) {{
                mf_arena_violation(layer, {NAME}_STATE_BIT + j);
                return;
            }}
        }}
    }}
}}
#define {NAME}_CHECK_STATE(table, layer) {name}_check_state(state.bytes, table, layer)
"""


def granule(target) -> int:
    """The alignment of the checked plan's buffers (memory_plan.plan_graph's `granule`): on
    the host ASan's 8-byte shadow granule; on a board the plain-C check compares single bytes,
    so buffers keep the planner's own alignment and no in-place link (shifts of 4) is
    dropped for alignment (the planner's search may still keep others: see the module doc)."""
    return 8 if target.host else ALIGN

PREAMBLE = """\
/* Arena check (codegen_c/arena_check.py), compiled in with -DMCUFORGE_ARENA_CHECK.
 * With AddressSanitizer (make SANITIZE=1 CHECK_ARENA=1), each step poisons its region of the
 * arena, unpoisons what the step's node may touch and poisons the red-zones of every live
 * buffer. Without it (an emulated board, or a host build without SANITIZE=1), plain C: the
 * red-zones of the live buffers are filled with a pattern before each step and compared after
 * it (a differing byte: mf_arena_violation(layer, arena offset), defined by the application),
 * and the bytes of the buffers read for the last time are overwritten with the pattern.
 * Without MCUFORGE_ARENA_CHECK every statement of the check is ((void)0). */
#ifdef MCUFORGE_ARENA_CHECK
#if defined(__SANITIZE_ADDRESS__)
#define {NAME}_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define {NAME}_ASAN 1
#endif
#endif

/* t: the first of the step's words in the sums below, then the number of ranges the step's
 * node may touch, their (offset, bytes) pairs, then the number of red-zones and theirs
 * (ASan), then the ranges dead after the step, the ranges no live buffer holds (red-zones
 * included) and the live buffers the node must not change (the plain-C check); offsets from
 * `region`, which is `bytes` long. */
#ifdef {NAME}_ASAN
#include <sanitizer/asan_interface.h>
static void {name}_check(uint8_t *region, uint32_t bytes, const uint32_t *t) {{
    uint32_t k, n;
    ASAN_POISON_MEMORY_REGION(region, bytes);
    t++;
    for (n = *t++, k = 0; k < n; k++, t += 2) {{
        ASAN_UNPOISON_MEMORY_REGION(region + t[0], t[1]);
    }}
    for (n = *t++, k = 0; k < n; k++, t += 2) {{
        ASAN_POISON_MEMORY_REGION(region + t[0], t[1]);
    }}
}}
#define {NAME}_CHECK(region, bytes, table) {name}_check(region, bytes, table)
#define {NAME}_CHECK_AFTER(region, table, layer) ((void)(table))
#define {NAME}_CHECK_STATE(table, layer) ((void)(table))
#else
/* the pattern byte at offset k of a region: no run of equal bytes, no common value */
#define {NAME}_PATTERN(k) ((uint8_t)(0xA5u ^ (((k) * 0x3Bu) & 0xFFu)))
void mf_arena_violation(const char *layer, uint32_t offset);
/* the sums of the buffers a step must not change: words of their own for each step, as
 * a control-flow node's step runs its subgraphs' steps */
static uint32_t {name}_sums[{kept}];

/* the table's section after the one at t */
static const uint32_t *{name}_next(const uint32_t *t) {{
    return t + 1 + 2 * t[0];
}}

static void {name}_fill(uint8_t *region, const uint32_t *t) {{
    uint32_t k, j, n;
    for (n = *t++, k = 0; k < n; k++, t += 2) {{
        for (j = t[0]; j < t[0] + t[1]; j++) {{
            region[j] = {NAME}_PATTERN(j);
        }}
    }}
}}

/* FNV-1a of a range */
static uint32_t {name}_sum(const uint8_t *p, uint32_t n) {{
    uint32_t h = 2166136261u;
    while (n--) {{
        h = (h ^ *p++) * 16777619u;
    }}
    return h;
}}

/* before a step: the bytes no live buffer holds filled, the kept buffers summed */
static void {name}_check(uint8_t *region, uint32_t bytes, const uint32_t *t) {{
    uint32_t k, n, *sums = &{name}_sums[t[0]];
    const uint32_t *w = {name}_next({name}_next({name}_next(t + 1)));
    const uint32_t *p = {name}_next(w);
    (void)bytes;
    {name}_fill(region, w);
    for (n = *p++, k = 0; k < n; k++, p += 2) {{
        sums[k] = {name}_sum(region + p[0], p[1]);
    }}
}}

/* after it: those bytes compared (the first that differs reported), the kept buffers summed
 * again (one that changed reported by its offset), the dead bytes overwritten */
static void {name}_check_after(uint8_t *region, const uint32_t *t, const char *layer) {{
    uint32_t k, j, n, at = (uint32_t)(region - arena.bytes);
    const uint32_t *sums = &{name}_sums[t[0]];
    const uint32_t *d = {name}_next({name}_next(t + 1));
    const uint32_t *w = {name}_next(d);
    const uint32_t *p = {name}_next(w);
    for (n = *w++, k = 0; k < n; k++, w += 2) {{
        for (j = w[0]; j < w[0] + w[1]; j++) {{
            if (region[j] != {NAME}_PATTERN(j)) {{
                mf_arena_violation(layer, at + j);
                k = n;
                break;
            }}
        }}
    }}
    for (n = *p++, k = 0; k < n; k++, p += 2) {{
        if (sums[k] != {name}_sum(region + p[0], p[1])) {{
            mf_arena_violation(layer, at + p[0]);
        }}
    }}
    {name}_fill(region, d);
}}
{state_fn}#define {NAME}_CHECK(region, bytes, table) {name}_check(region, bytes, table)
#define {NAME}_CHECK_AFTER(region, table, layer) {name}_check_after(region, table, layer)
#endif

{tables}
#else
#define {NAME}_CHECK(region, bytes, table) ((void)0)
#define {NAME}_CHECK_AFTER(region, table, layer) ((void)0)
#define {NAME}_CHECK_STATE(table, layer) ((void)0)
#endif"""


class ArenaCheck:
    """Collects the tables of a model's steps while its calls are emitted (codegen_c/model.py);
    each method returns the C statement that runs one."""

    def __init__(self, name: str):
        self.name, self.tables = name, []
        self.kept = 0  # words of the plain check's sums taken by the tables so far
        self.has_state = False  # state() made the state block's table

    def _table(self, opens: list, closes: list, what: str, dead: list = (),
               watched: list = (), kept: list = (), label: str | None = None) -> str:
        label = label or f"{self.name}_ck{len(self.tables)}"
        words = [self.kept]
        for section in (opens, closes, dead, watched, kept):
            words += [len(section), *[v for r in section for v in r]]
        self.kept += len(kept)
        body = ", ".join(map(str, words))
        self.tables.append(f"/* {what} */\nstatic const uint32_t {label}[] = {{{body}}};")
        return label

    def _call(self, region: str, size: int, table: str) -> str:
        return f"{self.name.upper()}_CHECK({region}, {size}, {table});"

    def step(self, g: Graph, plan: MemoryPlan, base: int, i: int, node, what: str) -> tuple:
        """(before, after): the statements around node i of `g` (its plan starting at arena
        offset `base`); `what` names the layer in a report."""
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
        # the plain check: the bytes no buffer live at the step holds, and the red-zones
        # (free in a right plan; in a wrong one, where the plan says they are); the live
        # buffers the node neither writes (its outputs, its scratch) nor writes over (in place)
        live = [r for r in plan.requests if r.first <= i <= r.last and r.name in plan.offsets]
        watched = _minus(_minus([(0, plan.arena_size)], [(plan.offsets[r.name], r.size)
                                                          for r in live]) + closes, [])
        # (an output may be a view into a larger buffer: a band's rows, written over the
        # bytes of its input already read; only the output's own bytes are written)
        sizes = {r.name: r.size for r in plan.requests}
        written = outs + [(plan.offsets[n], sizes[n]) for n in (
            _scratch_name(g, node, k) for k in ("kernel", "scratch")) if n in plan.offsets]
        kept = [piece for r in live if (plan.offsets[r.name], r.size) not in over
                for piece in _minus([(plan.offsets[r.name], r.size)], written)]
        table = self._table(opens, closes, f"step {i}: {what}", _dead_after(plan, i), watched,
                            sorted(kept))
        region = f"&arena.bytes[{base}]"
        after = f'{self.name.upper()}_CHECK_AFTER({region}, {table}, "{what}");'
        if g.state and plan.state_size:  # the state block's red-zones too (state())
            after += f' {self.name.upper()}_CHECK_STATE({self.name}_ck_state, "{what}");'
        return self._call(region, plan.arena_size, table), after

    def start(self, g: Graph, plan: MemoryPlan) -> str:
        """The invoke's first statement: the arena but the model's inputs filled with the
        pattern (plain C only), so a kernel reading bytes nothing wrote reads the pattern."""
        keep = [(plan.offsets[t], g.tensors[t].nbytes) for t in g.inputs
                if t in plan.offsets and t not in plan.state_offsets]
        fill = _minus([(0, plan.arena_size)], keep)
        table = self._table([], [], "invoke start: the arena but the inputs", fill)
        return f'{self.name.upper()}_CHECK_AFTER(&arena.bytes[0], {table}, "start");'

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
        """Reset: the state block's red-zones poisoned, its tensors readable (ASan); its
        bytes outside the state tensors filled with the pattern, which each step's after
        statement compares (plain C)."""
        if not plan.state_size:
            return None
        opens = [(plan.state_offsets[t], g.tensors[t].nbytes) for t in g.state]
        free = _minus([(0, plan.state_size)], opens)
        self.has_state = True
        return self._call("&state.bytes[0]", plan.state_size,
                          self._table(opens, [], "state block", watched=free,
                                      label=f"{self.name}_ck_state"))

    def preamble(self) -> str:
        state_fn = STATE_CHECK.format(name=self.name, NAME=self.name.upper()) \
            if self.has_state else ""
        return PREAMBLE.format(name=self.name, NAME=self.name.upper(), kept=max(self.kept, 1),
                               tables="\n".join(self.tables), state_fn=state_fn)


def _dead_after(plan: MemoryPlan, i: int) -> list:
    """(offset, bytes) ranges of the buffers read for the last time at step i (kernel scratch
    included), less the bytes of the buffers live across the step's end (an in-place output
    over its input keeps them)."""
    dead = [(plan.offsets[r.name], r.size) for r in plan.requests
            if r.last == i and r.name in plan.offsets]
    live = [(plan.offsets[r.name], r.size) for r in plan.requests
            if r.first <= i < r.last and r.name in plan.offsets]
    return _minus(dead, live)


def _minus(ranges: list, cut: list) -> list:
    """The bytes of the (offset, bytes) `ranges` outside every range of `cut`, as sorted,
    merged (offset, bytes) ranges."""
    edges = sorted({e for o, n in ranges + cut for e in (o, o + n)})
    out = []
    for lo, hi in zip(edges, edges[1:]):
        if any(o <= lo and hi <= o + n for o, n in ranges) and \
                not any(o <= lo and hi <= o + n for o, n in cut):
            if out and out[-1][0] + out[-1][1] == lo:
                out[-1] = (out[-1][0], out[-1][1] + hi - lo)
            else:
                out.append((lo, hi - lo))
    return out


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
