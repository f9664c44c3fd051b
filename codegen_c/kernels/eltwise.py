"""int8 ADD, MUL, AVERAGE_POOL_2D and MAX_POOL_2D on the micro-kernels of
runtime_c/mcuforge_ew.h.

ADD (same-shape activations, TFLM's integer pipeline): one mf_ew_add_s8 call; the input with the
smaller scale goes through a 256-entry int32 table, the requantization is one SMMLAR and a
shift (pack_ew.add_constants, proven on all 65536 input pairs; declined otherwise). MUL the
same way: the product requantized as mf_rq_apply (pack_ew.mul_constants).
AVERAGE_POOL_2D (int8, TFLM's reference: windows clipped to the image, rounded division by the
taps inside) and MAX_POOL_2D: one mf_ew_avgpool_s8 / mf_ew_maxpool_s8 call per image. The
kernels have portable bodies, so the schedules serve every target."""
from __future__ import annotations

import numpy as np

from .. import loop_ir as ir
from .. import pack_ew
from ..lower import OpContext
from ..lower.q_uint8 import activation_range
from ..pack_ew import POOL_GEOM
from . import inplace, schedules

ADD_PARAMS = ("input1_offset", "input2_offset", "left_shift", "input1_multiplier",
              "input1_shift", "input2_multiplier", "input2_shift", "output_multiplier",
              "output_shift", "output_offset", "act_min", "act_max")  # mf_add_s8's arguments


MUL_PARAMS = ("input1_offset", "input2_offset", "output_multiplier", "output_shift",
              "output_offset", "act_min", "act_max")  # mf_mul_s8's arguments


def _reference_call(ref: ir.Kernel, fn: str, names: tuple) -> dict | None:
    """The TFLM parameters of a reference int8 ADD / MUL kernel (elementwise.py: one flat loop
    storing y[i] = fn(x[i], x1[i], constants...)), or None when ref is another form."""
    stores = [s for s in ir.walk(ref.body) if isinstance(s, ir.Store)]
    loops = [s for s in ir.walk(ref.body) if isinstance(s, ir.Loop)]
    if len(stores) != 1 or len(loops) != 1:
        return None
    v = stores[0].value
    if not isinstance(v, ir.Call) or v.fn != fn or len(v.args) != 2 + len(names):
        return None
    a, b = v.args[:2]
    i = ir.Var(loops[0].var)
    if not (isinstance(a, ir.Load) and a.buf == "x" and a.index == i and isinstance(b, ir.Load)
            and b.buf == "x1" and b.index == i and stores[0].index == i):
        return None  # broadcast or constant operand
    if not all(isinstance(c, ir.Const) for c in v.args[2:]):
        return None
    return dict(zip(names, (int(c.value) for c in v.args[2:])))


def _two_activations(ctx: OpContext) -> bool:
    y = ctx.output()
    return y.dtype == "int8" and not any(ctx.input(k) is None or ctx.input(k).is_const
                                         or ctx.input(k).size != y.size for k in (0, 1))


@schedules("add")
def add(ctx: OpContext, ref: ir.Kernel, target) -> ir.Kernel | None:
    y = ctx.output()
    if not _two_activations(ctx):
        return None
    p = _reference_call(ref, "mf_add_s8", ADD_PARAMS)
    if p is None:
        return None
    c = pack_ew.add_constants(p)
    if c is None:
        return None
    big, small = ("x", "x1") if c["big"] == 0 else ("x1", "x")
    tab = ir.Buffer("tab", "int32", 256, "const", c["tab"],
                    "2 * rescaled small input - (big input zero point << 20), by its byte")
    body = (ir.CallStmt("mf_ew_add_s8", (
        ir.Ptr(big, ir.Const(0)), ir.Ptr(small, ir.Const(0)), ir.Ptr("y", ir.Const(0)),
        ir.Const(y.size), ir.Ptr("tab", ir.Const(0)),
        *(ir.Const(int(c[k])) for k in ("mult", "add", "post", "signfix", "lo", "hi")))),)
    doc = (f"{ref.doc}\nscheduled: mf_ew_add_s8, input {c['big'] + 1} unscaled, the other "
           f"through a 256-entry table (checked on all 65536 input pairs)")
    k = ir.Kernel(ctx.name, tuple(ref.params) + (tab,), body, doc, ref.macs, "mf_ew_add_s8")
    return _both(k, y.size)


def _both(k: ir.Kernel, n: int) -> ir.Kernel:
    """mf_ew_add_s8 / mf_ew_mul_s8 read element i of both inputs before writing element i:
    the output may go over either input (shift 0)."""
    return inplace.declare(inplace.declare(k, "x", inplace.elementwise(n)), "x1",
                           inplace.elementwise(n))


@schedules("mul")
def mul(ctx: OpContext, ref: ir.Kernel, target) -> ir.Kernel | None:
    if not _two_activations(ctx):
        return None
    p = _reference_call(ref, "mf_mul_s8", MUL_PARAMS)
    c = None if p is None else pack_ew.mul_constants(p)
    if c is None:
        return None
    names = ("off1", "off2", "mult", "add", "pre", "post", "signfix", "lo", "hi")
    body = (ir.CallStmt("mf_ew_mul_s8", (
        ir.Ptr("x", ir.Const(0)), ir.Ptr("x1", ir.Const(0)), ir.Ptr("y", ir.Const(0)),
        ir.Const(ctx.output().size), *(ir.Const(int(c[k])) for k in names))),)
    doc = f"{ref.doc}\nscheduled: mf_ew_mul_s8 (checked on all 65536 input pairs)"
    return _both(ir.Kernel(ctx.name, tuple(ref.params), body, doc, ref.macs, "mf_ew_mul_s8"),
                 ctx.output().size)


def _pool(ctx: OpContext, ref: ir.Kernel, fn: str) -> ir.Kernel | None:
    x, y = ctx.input(0), ctx.output()
    if x.dtype != "int8" or y.dtype != "int8" or len(x.shape) != 4 \
            or ctx.attrs.get("requant") == "onnxruntime" or ctx.attrs.get("count_include_pad") \
            or tuple(ctx.attrs.get("dilation", (1, 1))) != (1, 1):
        return None
    n, h, w, c = x.shape
    _, oh, ow, _ = y.shape
    (fh, fw), (sh, sw) = ctx.attrs["filter"], ctx.attrs["stride"]
    pt, _, pl, _ = ctx.attrs["padding"]
    geom = dict(h=h, w=w, c=c, fh=fh, fw=fw, sh=sh, sw=sw, pt=pt, pl=pl, oh=oh, ow=ow)
    if any(not 0 <= v < 2**15 for v in geom.values()):
        return None
    for o, s, p, f, size in ((oh, sh, pt, fh, h), (ow, sw, pl, fw, w)):
        starts = np.arange(o) * s - p
        if (np.minimum(starts + f, size) - np.maximum(starts, 0) <= 0).any():
            return None  # an empty window: TFLM fails there
    act = ctx.attrs.get("activation", "none")
    if y.quant is None:  # plain integers (ONNX): pool.py does not clamp
        if act != "none":
            return None
        lo, hi = -128, 127
    else:
        lo, hi = activation_range(act, y.quant.scale[0], y.quant.zero_point[0], "int8")
    g = np.array([geom[f] for f in POOL_GEOM], np.int16)
    consts = (ir.Buffer("geom", "int16", g.size, "const", g,
                        "mf_pool_geom: " + " ".join(POOL_GEOM)),)
    body = ir.loops([("n", n)], lambda b: [ir.CallStmt(fn, (
        ir.Ptr("x", b * (h * w * c)), ir.Ptr("y", b * (oh * ow * c)),
        ir.Ptr("geom", ir.Const(0), ctype="const mf_pool_geom *"), ir.Const(int(lo)),
        ir.Const(int(hi))))])
    doc = f"{ref.doc}\nscheduled: {fn} (4 channels per word on the DSP extension)"
    return ir.Kernel(ctx.name, tuple(ref.params) + consts, tuple(body), doc, ref.macs, fn)


@schedules("avg_pool2d")
def avg_pool(ctx: OpContext, ref: ir.Kernel, target) -> ir.Kernel | None:
    if ctx.output().quant is None or not any(
            isinstance(s.value, ir.Call) and s.value.fn == "mf_div_round_i32"
            for s in ir.walk(ref.body) if isinstance(s, ir.Assign)):
        return None  # not pool.py's TFLM form
    return _pool(ctx, ref, "mf_ew_avgpool_s8")


@schedules("max_pool2d")
def max_pool(ctx: OpContext, ref: ir.Kernel, target) -> ir.Kernel | None:
    return _pool(ctx, ref, "mf_ew_maxpool_s8")
