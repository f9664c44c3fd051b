"""`mcuforge report`: a model's analysis, layer by layer, as one self-contained HTML file (or
JSON): op, shapes, quantization, MACs, weight bytes, where each output (and kernel scratch)
lives in the arena, and with an emulated board the instructions each layer takes (the
per-layer profile of `bench --per-layer`, run through bench.bench_board); totals against the
board's flash and RAM; a picture of the arena over the layers and a per-layer cost chart.

Tensor names come from the model: untrusted. The HTML template escapes every string
(autoescape) after codegen_c.names.printable has made control characters visible; the pictures
carry no model string at all (layers are labelled by index and op)."""
from __future__ import annotations

import base64
import hashlib
import io
import re
from pathlib import Path

from mcuforge.ir.errors import McuforgeError


def analyze(model, board: str | None = None, input_shapes: dict | None = None,
            flash_budget: int | None = None, progress=None,
            memory_priority: float | None = None) -> dict:
    """The report's data (JSON-ready). `board`: compile for it, and on an emulated board run
    the per-layer profile under QEMU (progress lines go to `progress`); `memory_priority`: as
    compile's (the bands of a layer are layers of their own here)."""
    from mcuforge.codegen_c.model import generate
    from mcuforge.optimizer.pipeline import optimize

    from ..api import load
    from ..board import load_board
    board = None if board == "host" else board  # the host has no flash or RAM to fill
    b = load_board(board or "host")
    g = optimize(load(model, input_shapes))
    if memory_priority is not None:
        from ..api import patch_first_stage
        g = patch_first_stage(g, b.target(flash_budget), memory_priority)[0]
    gen = generate(g, "model", b.target(flash_budget))
    g = gen.graph  # its nodes in the order the calls run (memory_plan.topological_orders)
    plan = gen.plan
    calls = _calls(gen)
    layers = [_layer(g, plan, i, node, calls) for i, node in enumerate(g.nodes)]
    data = Path(model).read_bytes() if not isinstance(model, bytes) else model
    out = {
        "model": Path(str(model)).name if not isinstance(model, bytes) else "model",
        "model_sha256": hashlib.sha256(data).hexdigest(),
        "board": b.name if board else None,
        "board_description": b.description if board else None,
        "macs": gen.macs,
        "weight_bytes": sum(x["weight_bytes"] for x in layers),
        "flash_weight_bytes": gen.weight_bytes,  # the generated constant arrays
        "arena_bytes": plan.arena_size,
        "lower_bound_bytes": plan.lower_bound,
        "state_bytes": plan.state_size,
        "arena": [dict(_buffer(g, r, plan.offsets[r.name]),
                       in_place_of=plan.in_place.get(r.name, (None,))[0]) for r in
                  sorted(plan.requests, key=lambda r: (r.first, plan.offsets[r.name], r.name))],
        "layers": layers,
        "profile": None,
        "memory": None,
    }
    if board and b.emulated:
        from .bench import bench_board
        if progress:
            print(f"report: building {out['model']} for {b.name} and running it under QEMU "
                  f"(a plain and a profiled build)...", file=progress, flush=True)
        import inspect
        shapes = {"input_shapes": input_shapes} if input_shapes else {}
        if shapes and "input_shapes" not in inspect.signature(bench_board).parameters:
            raise McuforgeError("report --board runs bench's board build, which takes no "
                                "--input-shape yet: give a model with fixed input shapes, or "
                                "leave out --board")
        if memory_priority is not None:
            shapes["memory_priority"] = memory_priority
        row = bench_board(model, b.name, with_tflm=False, per_layer=True,
                          flash_budget=flash_budget, **shapes)
        if progress:
            print(f"report: {row['instructions']:,} instructions per inference", file=progress,
                  flush=True)
        by_name = {x["layer"]: x["instructions"] for x in row["layers"]}
        for x in layers:
            x["instructions"] = by_name.get(x["kernel"]) if x["kernel"] else None
        out["profile"] = {k: row[k] for k in (
            "instructions", "layers_instructions", "layers_outside_instructions",
            "mark_instructions", "counter_resolution_instructions", "stack_bytes",
            "flash_bytes", "ram_bytes", "code_bytes")}
        out["memory"] = _memory(b, row["flash_bytes"], row["ram_bytes"] + row["stack_bytes"],
                                "the firmware's ELF: text (code, weights, constants); RAM: "
                                "data + bss (arena, state) + the stack measured under QEMU")
    elif board:
        from mcuforge.codegen_c.kernels.budget import CODE_ALLOWANCE
        out["memory"] = _memory(b, gen.weight_bytes + CODE_ALLOWANCE,
                                plan.arena_size + plan.state_size + b.min_stack,
                                f"estimate (no emulator for {b.name}): flash = weights + "
                                f"{CODE_ALLOWANCE:,} for code; RAM = arena + state + "
                                f"{b.min_stack:,} of stack")
    return out


def _calls(gen) -> dict:
    """kernel name -> (MACs, bytes of its generated constants) of each call in the invoke; a
    control-flow call counts the kernels of its subgraphs (listed just before it)."""
    kernels = list(gen.kernels)
    out, k = {}, 0
    for name, macs in gen.layers:
        flash = 0
        while k < len(kernels) and kernels[k].name != name and kernels[k].name.startswith("sg"):
            flash += sum(c.data.nbytes for c in kernels[k].consts)
            k += 1
        if k < len(kernels) and kernels[k].name == name:
            flash += sum(c.data.nbytes for c in kernels[k].consts)
            k += 1
        out[name] = (macs, flash)
    return out


def _quant(t) -> dict | None:
    q = t.quant
    if q is None:
        return None
    if q.per_axis:
        return {"per_channel": True, "axis": int(q.axis),
                "scale": [float(s) for s in q.scale],
                "zero_point": [int(z) for z in q.zero_point]}
    return {"per_channel": False, "scale": float(q.scale[0]), "zero_point": int(q.zero_point[0])}


def _tensor(g, name: str) -> dict:
    t = g.tensors[name]
    return {"name": name, "shape": [int(d) for d in t.shape], "dtype": t.dtype,
            "bytes": int(t.nbytes), "quant": _quant(t)}


def _layer(g, plan, i: int, node, calls: dict) -> dict:
    from mcuforge.codegen_c.model import short_name
    from mcuforge.ir.graph import ALIAS_OPS
    kname = f"l{i:02d}_{node.op}_{short_name(node.outputs[0])}"
    macs, flash = calls.get(kname, (0, 0))
    consts = [t for t in node.inputs if t and g.tensors[t].is_const]
    ins = [t for t in node.inputs if t and not g.tensors[t].is_const]
    outs = []
    for y in node.outputs:
        d = _tensor(g, y)
        if y in plan.state_offsets:
            d.update(memory="state", offset=plan.state_offsets[y])
        else:
            d.update(memory="arena", offset=plan.offsets.get(y))
        outs.append(d)
    # its kernel's scratch ('<output>/kernel') or a control-flow node's subgraph arena
    # ('<output>/scratch'): the requests named after its output that are no tensor
    own = re.compile(re.escape(node.outputs[0]) + r"/(kernel|scratch)_*")
    mine = [q for q in plan.requests if q.name not in g.tensors and own.fullmatch(q.name)]
    return {
        "index": i, "op": node.op, "kernel": kname if kname in calls else None,
        "inputs": [_tensor(g, t) for t in ins],
        "outputs": outs,
        "weights": [_tensor(g, t) for t in consts],
        "macs": int(macs),
        # the model's constants this layer reads (weights, biases, tables), as the model
        # stores them; an alias (reshape) reads none at run time
        "weight_bytes": 0 if node.op in ALIAS_OPS else _const_bytes(g, node),
        "flash_bytes": int(flash),  # the generated constant arrays of its kernel
        "scratch": [{"offset": plan.offsets[q.name], "bytes": q.size} for q in mine],
        "instructions": None,
    }


def _const_bytes(g, node) -> int:
    """Bytes of the constants a node reads; a control-flow node's include its subgraphs'."""
    from mcuforge.ir.graph import ALIAS_OPS, subgraphs
    total = sum(g.tensors[t].nbytes for t in dict.fromkeys(node.inputs)
                if t and g.tensors[t].is_const)
    for sg in subgraphs(node):
        total += sum(_const_bytes(sg, n) for n in sg.nodes if n.op not in ALIAS_OPS)
    return total


def _buffer(g, r, offset: int) -> dict:
    kind = "scratch" if r.name not in g.tensors else \
        "input" if r.name in g.inputs else "output" if r.name in g.outputs else "tensor"
    return {"name": r.name, "kind": kind, "offset": offset, "bytes": r.size, "first": r.first,
            "last": min(r.last, len(g.nodes) - 1)}


def _memory(b, flash_used: int, ram_used: int, how: str) -> dict:
    return {"flash_used": flash_used, "flash_size": b.flash_size, "ram_used": ram_used,
            "ram_size": b.ram_size, "how": how}


# ---- pictures ---------------------------------------------------------------------------------

def _png(fig) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    import matplotlib.pyplot as plt
    plt.close(fig)
    return base64.b64encode(buf.getvalue()).decode("ascii")


def arena_picture(r: dict) -> str:
    """x: layer index, y: arena offset; one rectangle per buffer over the layers it lives,
    kernel and control-flow scratch hatched. Base64 PNG."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch, Rectangle
    n = max(len(r["layers"]), 1)
    fig, ax = plt.subplots(figsize=(min(4 + 0.45 * n, 24), 5))
    colors = {"input": "#4c9be8", "output": "#e8a23c", "tensor": "#6cc070", "scratch": "#d9d9d9"}
    for k, buf in enumerate(r["arena"]):
        scratch = buf["kind"] == "scratch"
        ax.add_patch(Rectangle((buf["first"] - 0.45, buf["offset"]),
                               buf["last"] - buf["first"] + 0.9, buf["bytes"],
                               facecolor=colors[buf["kind"]], edgecolor="#333333",
                               linewidth=0.6, hatch="///" if scratch else None,
                               alpha=0.9))
    ax.set_xlim(-0.6, n - 0.4)
    ax.set_ylim(0, max(r["arena_bytes"], 1) * 1.02)
    ax.axhline(r["arena_bytes"], color="#b00020", linewidth=1, linestyle="--")
    ax.set_xticks(range(n))
    ax.set_xticklabels([str(i) for i in range(n)], fontsize=7)
    ax.set_xlabel("layer index")
    ax.set_ylabel("arena offset (bytes)")
    ax.set_title(f"arena over time: {r['arena_bytes']:,} bytes (lower bound "
                 f"{r['lower_bound_bytes']:,})", fontsize=10)
    ax.legend(handles=[Patch(facecolor=c, edgecolor="#333333", hatch="///" if k == "scratch"
                             else None, label=k) for k, c in colors.items()],
              loc="upper right", fontsize=8)
    fig.tight_layout()
    return _png(fig)


def cost_picture(r: dict) -> str:
    """One bar per layer: instructions (with a board's profile), else MACs. Base64 PNG."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    measured = r["profile"] is not None
    key = "instructions" if measured else "macs"
    layers = r["layers"]
    n = max(len(layers), 1)
    fig, ax = plt.subplots(figsize=(min(4 + 0.45 * n, 24), 4.5))
    values = [x[key] or 0 for x in layers]
    ax.bar(range(len(layers)), values, color="#4c9be8" if measured else "#6cc070",
           edgecolor="#333333", linewidth=0.5)
    ax.set_xticks(range(len(layers)))
    ax.set_xticklabels([f"{x['index']} {x['op']}" for x in layers], rotation=60, ha="right",
                       fontsize=7)
    ax.set_xlim(-0.6, n - 0.4)
    ax.set_ylabel(f"instructions on {r['board']}" if measured else "MACs")
    ax.set_title(("instructions per layer (QEMU -icount)" if measured else "MACs per layer")
                 + f": total {sum(values):,}", fontsize=10)
    fig.tight_layout()
    return _png(fig)


# ---- HTML -------------------------------------------------------------------------------------

def _fmt_quant(q) -> str:
    if q is None:
        return "-"
    if q["per_channel"]:
        s = q["scale"]
        zs = sorted(set(q["zero_point"]))
        z = str(zs[0]) if len(zs) == 1 else f"{zs[0]}..{zs[-1]}"
        return (f"per-channel (axis {q['axis']}, {len(s)} scales {min(s):.3g}..{max(s):.3g}, "
                f"zero point {z})")
    return f"scale {q['scale']:.6g}, zero point {q['zero_point']}"


def render_html(r: dict) -> str:
    import importlib.util

    import jinja2
    if importlib.util.find_spec("matplotlib") is None:  # a --no-deps install may lack it
        raise McuforgeError("the HTML report draws its pictures with matplotlib, which is not "
                            "installed: pip install matplotlib (or write --json)") from None

    from mcuforge.codegen_c.names import printable
    from mcuforge.codegen_c.resources import data_dir
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(data_dir("templates"))),
                             autoescape=True, undefined=jinja2.StrictUndefined)
    env.filters.update(printable=printable, quant=_fmt_quant,
                       shape=lambda s: "[" + ", ".join(map(str, s)) + "]",
                       num=lambda v: "-" if v is None else f"{v:,}")
    return env.get_template("report/report.html.j2").render(
        r=r, arena_png=arena_picture(r), cost_png=cost_picture(r))


def write_report(r: dict, path: str, as_json: bool = False) -> None:
    import json
    text = json.dumps(r, indent=2) if as_json else render_html(r)
    try:
        Path(path).write_text(text, encoding="utf-8")
    except OSError as e:
        raise McuforgeError(f"cannot write the report to {path}: {e.strerror or e}") from None
