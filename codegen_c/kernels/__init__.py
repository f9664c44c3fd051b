"""The schedule stage: between lowering and printing, a layer's reference kernel (the loop IR
that defines its numerics, codegen_c/lower/) may be replaced by a scheduled one for the target:
packed weights, loops split, unrolled and handed to micro-kernels (runtime_c/mcuforge_nn.h,
mirrored in codegen_c/micro.py; on the host runtime_c/mcuforge_vec.h, host.py, micro_vec.py). A schedule returns None where it does not apply or cannot
prove itself exact (then the reference stays); tests run both through the loop-IR evaluator
on random data and require equal outputs.

Schedules register per op with `@schedules(op, ...)` and are tried in the order of their
modules in ORDER, whatever order the modules were imported in."""
from __future__ import annotations

from mcuforge.ir.target import HOST, Target

from ..lower import OpContext, reference_kernel

SCHEDULES = {}  # op -> [fn(ctx, reference kernel, target) -> Kernel | None]
# Which schedule a layer gets when several apply: the target-specific ones first (Helium
# depthwise before the Helium GEMM, which takes depthwise layers with a multiplier; cores
# without SIMD), then the DSP/host ones; svdf before seq (the whole int8 SVDF where it applies);
# lut (the table serves what no other schedule takes), then reference: the reference loops
# themselves with their in-place declarations, where nothing else applied.
ORDER = ("mve_dw", "mve", "rv", "scalar", "depthwise", "eltwise", "gemm", "host", "requant", "svdf",
         "seq", "lut", "reference")


def _rank(fn) -> int:
    module = fn.__module__.rsplit(".", 1)[-1]
    return ORDER.index(module) if module in ORDER else len(ORDER)


def schedules(*ops):
    """Register fn for ops, in its module's place in ORDER (a module not listed: after all,
    in import order)."""
    def register(fn):
        for op in ops:
            fns = SCHEDULES.setdefault(op, [])
            fns.append(fn)
            fns.sort(key=_rank)  # stable: a module's own schedules keep their order
        return fn
    return register


def tflm_int8_layer(ctx) -> bool:
    """A weighted layer with TFLM's int8 arithmetic: int8 input, output and constant symmetric
    weights, per-tensor input quantization, a constant int32 bias or none (not the
    onnxruntime-style requantization of quantized ONNX imports)."""
    x, w, bias, y = ctx.input(0), ctx.input(1), ctx.input(2), ctx.output()
    if x.dtype != "int8" or y.dtype != "int8" or w.dtype != "int8" or not w.is_const \
            or ctx.attrs.get("requant") == "onnxruntime":
        return False
    if any(t.quant is None for t in (x, w, y)) or len(x.quant.zero_point) != 1 \
            or any(int(z) != 0 for z in w.quant.zero_point):
        return False
    return bias is None or (bias.is_const and bias.dtype == "int32")


def conv_geometry(ctx):
    """(n, the mf_conv_geom fields as an int32 array, a Buffer "geom" holding them) of an NHWC
    convolution: input h w c, kernel h w, stride h w, padding top left, output h w."""
    import numpy as np

    from .. import loop_ir as ir
    from ..pack import CONV_GEOM_FIELDS
    n, h, w, c = ctx.input(0).shape
    _, oh, ow, _ = ctx.output().shape
    kh, kw = ctx.input(1).shape[1:3]
    (sh, sw), (pt, _, pl, _) = ctx.attrs["stride"], ctx.attrs["padding"]
    geom = np.array([h, w, c, kh, kw, sh, sw, pt, pl, oh, ow], np.int32)
    return n, geom, ir.Buffer("geom", "int32", geom.size, "const", geom,
                              "mf_conv_geom: " + " ".join(CONV_GEOM_FIELDS))


def schedule_kernel(ctx, kernel, target: Target):
    """The kernel the target runs for ctx's node: the first schedule that applies, else the
    reference."""
    _load_all()
    # a --memory-priority band asking for no scratch (optimizer/patch.py's lean="bare"):
    # only the reference loops, whose kernels need none
    bare = ctx.attrs.get("lean") == "bare"
    for fn in SCHEDULES.get(ctx.node.op, ()):
        if bare and _rank(fn) < ORDER.index("reference"):
            continue
        k = fn(ctx, kernel, target)
        if k is not None:
            return k
    return kernel


def _load_all():
    from . import (depthwise, eltwise, gemm, host, lut, mve, mve_dw, reference,  # noqa: F401
                   requant, rv, scalar, seq, svdf)  # (they register their schedules)


def lower_node(node, graph, name: str, target: Target | None = None):
    """The kernel the target runs for `node`: the reference lowering, then the schedule stage
    for `target` (default: the host); None for an alias (no kernel)."""
    k = reference_kernel(node, graph, name)
    if k is None:
        return None
    return schedule_kernel(OpContext(node, graph, name), k, target or HOST)
