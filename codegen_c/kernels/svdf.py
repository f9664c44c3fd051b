"""int8 SVDF with an int8 memory: the whole step as one mf_seq_svdf_s8 call per batch row
(runtime_c/mcuforge_seq.h; mirror codegen_c/micro_svdf.py), in place of the reference's five
loops (codegen_c/lower/state.py: shift, feature products, their requantization, time sums,
the units' requantization).

Compile time moves the memory's zero point out of the loops and proves the fast forms exact:
- the feature products take x - x_zp widened to int16 once (TFLM's own sums);
- the time sums take the raw memory, the unit's bias less zp_state * sum of its weights_time;
- both requantizations are mf_rq_apply (pack.requant_params on the true sums' bounds).
Each is exact only while no partial sum leaves int32: checked here from the weights (any int8
input, any memory), else the layer keeps the seq schedule (kernels/seq.py), as where TFLM's own
sums could overflow. The units' sums start from biases that may be close to the int32 limits
(keyword_scrambled's are), too far out for the fast requantization; but such a unit's output is
the same over its sum's whole range (mbqm is monotone: both ends checked), and its bias is
replaced by the sum nearest 0 whose whole range still gives that output.

The feature weights are packed as the GEMM kernels read them: int16 on the DSP extension (twice
their flash, unless the flash budget narrows the layer: schedule name ends in _w16 / _w8),
int8 elsewhere; weights_time stays int8 as TFLite stores it. With the memory planned in place
(optimizer/memory_plan.py: the state's next value at the state's own address), the call updates
the memory where it is and the invocation copies nothing back."""
from __future__ import annotations

import numpy as np

from .. import loop_ir as ir
from .. import micro_svdf  # noqa: F401  (registers the mirror)
from .. import pack
from ..lower import OpContext
from ..lower.state import svdf_int_params
from ..micro_svdf import GEOM_FIELDS, work_words
from ..qmath import mf_mbqm
from . import SCHEDULES

FN = "mf_seq_svdf_s8"
WORK = "svdf_work"
I32 = 2**31


def plan(ctx: OpContext, fmt: str) -> dict | None:
    """The constants of the call, or None where a fold or requantization cannot be proven."""
    x, wf, wt, bias = (ctx.input(i) for i in range(4))
    state = ctx.output(1)
    if x.dtype != "int8" or state.dtype != "int8" or wf.dtype != "int8" or wt.dtype != "int8" \
            or not wf.is_const or not wt.is_const \
            or (bias is not None and (not bias.is_const or bias.dtype != "int32")):
        return None
    p = svdf_int_params(ctx)
    B, n_in = x.shape
    F, M = wt.shape
    R = ctx.attrs["rank"]
    U = F // R
    W = np.asarray(wf.data, np.int64).reshape(F, n_in)
    T = np.asarray(wt.data, np.int64).reshape(F, M)
    b = np.zeros(U, np.int64) if bias is None else np.asarray(bias.data, np.int64).reshape(U)
    # feature products: TFLM's sums of Wf * (x - x_zp), their bound for the requantization
    in_span = max(127 - p["zp_x"], p["zp_x"] + 128)
    rq_state = pack.requant_params([p["m1"]], [p["sh1"]], 0,
                                   [int(np.abs(W).sum(axis=1).max() * in_span)])
    if rq_state is None or (np.abs(W).sum(axis=1) * in_span).max() >= I32:
        return None
    # time sums: the raw memory, zp_state * weights folded into the unit's bias
    per_unit = T.reshape(U, R * M)
    st_span = max(127 - p["zp_s"], p["zp_s"] + 128)
    true_reach = np.abs(per_unit).sum(axis=1) * st_span  # |TFLM's sum - bias| <= this
    raw_reach = np.abs(per_unit).sum(axis=1) * 128  # |the raw sum| <= this
    if (np.abs(b) + true_reach).max() >= I32:
        return None  # (TFLM's own sum could overflow)
    out = _OutputMap(p)
    bias2, bound = [], 0
    for bu, wsum, tr, rr in zip(b.tolist(), per_unit.sum(axis=1).tolist(), true_reach.tolist(),
                                raw_reach.tolist()):
        v = out.constant(bu - tr, bu + tr)
        if v is None:
            c = bu - p["zp_s"] * wsum
            bound = max(bound, abs(bu) + tr)
        else:  # any sum in a range giving v for all memories
            c = out.centre(v, rr)
            bound = max(bound, abs(c) + rr)
        if abs(c) + rr >= I32:
            return None
        bias2.append(c)
    rq_out = pack.requant_params([p["m2"]], [p["sh2"]], p["zp_y"], [bound])
    if rq_out is None:
        return None
    packed, _ = pack.pack_gemm_weights(W, fmt)
    geom = dict(n_in=n_in, n_filter=F, n_memory=M, rank=R, fmt=16 if fmt == "w16" else 8,
                zp_in=p["zp_x"], zp_state=p["zp_s"], lo=p["act_lo"], hi=p["act_hi"],
                sf_state=pack.needs_signfix(0, -128),
                sf_out=pack.needs_signfix(p["zp_y"], p["act_lo"]))
    for name, rq in (("rq_state", rq_state), ("rq_out", rq_out)):
        geom.update({f"{name}.{k}": int(v) for k, v in zip(pack.RQ_FIELDS, rq[0])})
    return dict(B=B, n_in=n_in, F=F, M=M, U=U, packed=packed,
                bias=np.array(bias2, np.int32), wt=T.astype(np.int8).reshape(-1),
                geom=np.array([geom[k] for k in GEOM_FIELDS], np.int32))


class _OutputMap:
    """TFLM's output of a unit's sum a: clamp(zp_y + mbqm(a), lo, hi), monotone in a."""

    def __init__(self, p: dict):
        self.p = p

    def __call__(self, a: int) -> int:
        p = self.p
        return min(max(mf_mbqm(int(a), p["m2"], p["sh2"]) + p["zp_y"], p["act_lo"]),
                   p["act_hi"])

    def constant(self, a0: int, a1: int) -> int | None:
        """The output when it is the same for every sum in [a0, a1], else None."""
        y0 = self(a0)
        return y0 if self(a1) == y0 else None

    def _first(self, pred) -> int:
        """The smallest int32 a with pred(a) (pred monotone: False then True)."""
        lo, hi = -I32, I32 - 1
        while lo < hi:
            mid = (lo + hi) // 2
            if pred(mid):
                hi = mid
            else:
                lo = mid + 1
        return lo

    def centre(self, v: int, reach: int) -> int:
        """The c nearest 0 with output v for every sum in [c - reach, c + reach]."""
        a1 = self._first(lambda a: self(a) >= v)
        a2 = self._first(lambda a: self(a) > v) - 1 if self(I32 - 1) > v else I32 - 1
        return min(max(0, a1 + reach), a2 - reach)


def svdf(ctx: OpContext, ref: ir.Kernel, target) -> ir.Kernel | None:
    if ctx.input(0).dtype != "int8":
        return None
    fmt = "w16" if target.dsp and ctx.node.outputs[0] not in target.narrow_weights else "w8"
    c = plan(ctx, fmt)
    if c is None:
        return None
    # x, x1 (the memory read), y, y1 (the memory written); a memory of one has no x1 (the
    # frontend drops the state input: nothing old is read, y1 stands in)
    names = [b.name for b in ref.params]
    if names not in (["x", "x1", "y", "y1"], ["x", "y", "y1"]):
        return None
    old = "x1" if "x1" in names else "y1"
    n_in, F, M, U = c["n_in"], c["F"], c["M"], c["U"]
    consts = (
        ir.Buffer("wf", str(c["packed"].dtype), c["packed"].size, "const", c["packed"],
                  f"weights_feature {F} x {n_in}, packed as pack_gemm_weights {fmt}"),
        ir.Buffer("wt", "int8", c["wt"].size, "const", c["wt"], f"weights_time {F} x {M}"),
        ir.Buffer("bias", "int32", U, "const", c["bias"],
                  "bias - zp_state * sum of each unit's weights_time (a unit whose output "
                  "is constant: a sum giving it)"),
        ir.Buffer("geom", "int32", c["geom"].size, "const", c["geom"],
                  "mf_svdf_geom: " + " ".join(GEOM_FIELDS)),
    )
    work = ir.Buffer(WORK, "int32", work_words(n_in, F), "scratch")
    body = ir.loops([("b", c["B"])], lambda b: [ir.CallStmt(FN, (
        ir.Ptr("x", b * n_in), ir.Ptr(old, b * (F * M)), ir.Ptr("y1", b * (F * M)),
        ir.Ptr("y", b * U), ir.Ptr("wf", ir.Const(0)),
        ir.Ptr("wt", ir.Const(0)), ir.Ptr("bias", ir.Const(0)),
        ir.Ptr("geom", ir.Const(0), ctype="const mf_svdf_geom *"),
        ir.Ptr(WORK, ir.Const(0))))])
    doc = f"{ref.doc}\nscheduled: {FN} (feature weights {fmt}; zero points folded, " \
          f"requantization by mf_rq_apply, both proven exact at compile time)"
    return ir.Kernel(ctx.name, tuple(ref.params) + consts + (work,), tuple(body), doc,
                     ref.macs, f"mf_seq_svdf_{fmt}")


# tried before seq's SVDF schedule (its fallback) whichever module was imported first
SCHEDULES.setdefault("svdf", []).insert(0, svdf)
