"""The schedule stage: between lowering and printing, a layer's reference kernel (the loop IR
that defines its numerics, codegen_c/lower/) may be replaced by a scheduled one for the target:
packed weights, loops split, unrolled and handed to micro-kernels (runtime_c/mcuforge_nn.h,
mirrored in codegen_c/micro.py; on the host runtime_c/mcuforge_vec.h, host.py, micro_vec.py). A schedule returns None where it does not apply or cannot
prove itself exact (then the reference stays); tests run both through the loop-IR evaluator
on random data and require equal outputs.

Schedules register per op with `@schedules(op, ...)` and are tried in registration order."""
from __future__ import annotations

from ir.target import Target

SCHEDULES = {}  # op -> [fn(ctx, reference kernel, target) -> Kernel | None]


def schedules(*ops):
    def register(fn):
        for op in ops:
            SCHEDULES.setdefault(op, []).append(fn)
        return fn
    return register


def schedule_kernel(ctx, kernel, target: Target):
    """The kernel the target runs for ctx's node: the first schedule that applies, else the
    reference."""
    _load_all()
    for fn in SCHEDULES.get(ctx.node.op, ()):
        k = fn(ctx, kernel, target)
        if k is not None:
            return k
    return kernel


def _load_all():
    from . import depthwise, gemm, host  # noqa: F401  (they register their schedules)
