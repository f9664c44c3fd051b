"""Lowerings: stateful TFLite layers (SVDF, UNIDIRECTIONAL_SEQUENCE_LSTM) computed exactly as
tflite-micro's kernels (svdf_common.cc, lstm_eval.h) compute them.

The node reads the state's current value (an input, kept in the state block) and writes its
next value to an output that the generated code copies back at the end of the invocation; the
kernel never writes the state it reads. Float sums run in TFLM's order (products added one by
one from 0.0f, the bias where TFLM adds it); integer sums wrap where their bound says int32
could overflow (TFLM's C++ wraps there too); parameters are computed as TFLM's Prepare does.
The integer LSTM's `fast` form (its schedule's, codegen_c/kernels/seq.py) requantizes with
mf_seq_rq and saturates with mf_seq_sat16 (runtime_c/mcuforge_seq.h) wherever the accumulators'
bounds prove that form equal to TFLM's MultiplyByQuantizedMultiplier; the reference is the
default.

Registered with `@lowers` (see codegen_c/lower/__init__.py).
"""
from __future__ import annotations

import numpy as np

from .. import loop_ir as ir
from .. import pack
from .. import mathmirror  # noqa: F401  (registers the mfm_ mirrors for the evaluator)
from .. import micro_seq  # noqa: F401  (mf_seq_rq's mirror)
from .. import qparams as qp
from ..qmath import round_half_away
from . import OpContext, const, describe, lowers
from .elementwise import _float_logistic

F = "float32"
FLT_MAX = float(np.finfo(np.float32).max)
INT_RANGE = {"int8": (-128, 127), "int16": (-32768, 32767)}
GATES = ("input", "forget", "cell", "output")  # TFLite's order of weights and biases


def _f(v) -> ir.Const:
    return ir.Const(float(np.float32(v)), F)


def _c(v: int, dtype: str = "int32") -> ir.Const:
    return ir.Const(int(v), dtype)


def _operands(ctx: OpContext, const_names: dict) -> tuple:
    """Buffer name per node input index: parameters x, x1, ... in ctx.io_buffers' order,
    constants `const_names[i]` (else c<i>). Returns (names, const buffers)."""
    names, consts, k = {}, [], 0
    for i, n in enumerate(ctx.node.inputs):
        if not n:
            continue
        t = ctx.graph.tensors[n]
        if t.is_const:
            names[i] = const_names.get(i, f"c{i}")
            consts.append(const(names[i], t.data, t.dtype, t.name))
        else:
            names[i] = "x" if k == 0 else f"x{k}"
            k += 1
    return names, consts


def _q(t) -> tuple:
    return float(np.float32(t.quant.scale[0])), int(t.quant.zero_point[0])


def _accumulate(acc: str, dtype: str, value: ir.Expr, wrap: bool) -> ir.Stmt:
    """acc += value; through mf_wrap_add_i32 when the sum may leave int32 (TFLM wraps)."""
    v = ir.Var(acc, dtype)
    return ir.Assign(acc, ir.call("mf_wrap_add_i32", v, value) if wrap else v + value)


def _may_overflow(bound) -> bool:
    return bound >= 2**31


def _offset(v: ir.Expr, offset: int) -> ir.Expr:
    return v + offset if offset else v


def _float_clamp(var: str) -> ir.Stmt:
    """var = TFLM's ActivationFunctionWithMinMax(var, -FLT_MAX, FLT_MAX) with std::min /
    std::max: only infinities change, NaN passes. FLT_MAX is the kernel's local flt_max."""
    v, hi = ir.Var(var, F), ir.Var("flt_max", F)
    lo = ir.Unary("-", hi, F)
    return ir.Assign(var, ir.select(v.lt(lo), lo, ir.select(hi.lt(v), hi, v)))


def _svdf_activation(v: ir.Expr, act: str) -> ir.Expr:
    """ActivationValFloat (micro/kernels/activation_utils.h) with TfLiteMax / TfLiteMin:
    max(0, a) is 0 > a ? 0 : a, min(a, 6) is a < 6 ? a : 6."""
    if act == "none":
        return v
    lo, hi = {"relu": (0.0, None), "relu6": (0.0, 6.0), "relu_n1_to_1": (-1.0, 1.0)}[act]
    if hi is not None:
        v = ir.select(v.lt(_f(hi)), v, _f(hi))
    return ir.select(_f(lo).gt(v), _f(lo), v)


# ---- SVDF ------------------------------------------------------------------------------------

def svdf_int_params(ctx: OpContext) -> dict:
    """An integer SVDF's zero points (x, state, y), TFLM's two (multiplier, shift) pairs (the
    feature products to the state's scale, the units' sums to the output's) and its output
    clamp, as TFLM's Prepare computes them."""
    x, wf, wt, y, state = ctx.input(0), ctx.input(1), ctx.input(2), ctx.output(0), ctx.output(1)
    s_x, zp_x = _q(x)
    s_s, zp_s = _q(state)
    s_y, zp_y = _q(y)
    s_wf, s_wt = _q(wf)[0], _q(wt)[0]
    # TFLM's Prepare forms both scales in float32, then widens to double
    m1, sh1 = qp.quantize_multiplier(float(np.float32(np.float32(s_x) * np.float32(s_wf))
                                           / np.float32(s_s)))
    m2, sh2 = qp.quantize_multiplier(float(np.float32(np.float32(s_s) * np.float32(s_wt))
                                           / np.float32(s_y)))
    # the TFLite frontend gives int8 nodes "none": TFLM's integer kernel applies none
    act_lo, act_hi = qp.activation_range_int8(ctx.attrs["activation"], s_y, zp_y)
    return dict(zp_x=zp_x, zp_s=zp_s, zp_y=zp_y, m1=m1, sh1=sh1, m2=m2, sh2=sh2,
                act_lo=act_lo, act_hi=act_hi)


@lowers("svdf")
def svdf(ctx: OpContext) -> ir.Kernel:
    """TFLM's EvalFloatSvdfReference / EvalIntegerSvdfReference<int16_t or int8_t>: the memory
    moves one step older, weights_feature . x becomes every filter's newest entry, and each
    output unit sums weights_time . memory over its rank filters, plus the bias."""
    x, wf, wt, bias = (ctx.input(i) for i in range(4))
    state = ctx.output(1)
    names, consts = _operands(ctx, {1: "weights_feature", 2: "weights_time", 3: "bias"})
    nx, ns = names[0], names.get(4)  # (no state input for a memory of one)
    B, I = x.shape
    F_, M = wt.shape
    R = ctx.attrs["rank"]
    U = F_ // R
    integer = x.dtype != F
    mem = lambda b, f, m: (b * F_ + f) * M + m  # noqa: E731  (the state is [B, F, M])
    body = []
    if M > 1:
        body.append(ir.Comment("the memory: every filter's activations move one step older"))
        body += ir.loops([("b", B), ("f", F_), ("m", M - 1)], lambda b, f, m: [
            ir.Store("y1", mem(b, f, m), ir.Load(ns, mem(b, f, m + 1), state.dtype))])

    if integer:
        p = svdf_int_params(ctx)
        zp_x, zp_s, zp_y = p["zp_x"], p["zp_s"], p["zp_y"]
        m1, sh1, m2, sh2 = p["m1"], p["sh1"], p["m2"], p["sh2"]
        act_lo, act_hi = p["act_lo"], p["act_hi"]
        lo_s, hi_s = INT_RANGE[state.dtype]
        in_span = max(127 - zp_x, zp_x + 128)
        wrap1 = _may_overflow(np.abs(wf.data.astype(np.int64)).sum(axis=1).max() * in_span)
        st_span = max(hi_s - zp_s, zp_s - lo_s)
        per_filter = np.abs(wt.data.astype(np.int64)).sum(axis=1) * st_span
        wrap_mul = st_span * int(np.abs(wt.data.astype(np.int64)).max()) >= 2**31
        wrap2 = _may_overflow(per_filter.max())
        bias_max = int(np.abs(bias.data.astype(np.int64)).max()) if bias is not None else 0
        wrap3 = _may_overflow(bias_max + per_filter.reshape(U, R).sum(axis=1).max())

        def feature(b, f):
            def mac(k):
                prod = ir.Load("weights_feature", f * I + k, "int8") \
                    * _offset(ir.Load(nx, b * I + k, "int8"), -zp_x)
                return [_accumulate("dot", "int32", prod, wrap1)]
            scaled = ir.clamp(ir.call("mf_mbqm", ir.Var("dot"), m1, sh1), lo_s, hi_s)
            return [ir.Decl("dot", "int32", _c(0)), *ir.loops([("k", I)], mac),
                    ir.Store("y1", mem(b, f, M - 1),
                             ir.cast(_offset(scaled, zp_s), state.dtype))]

        def unit(b, u):
            def filter_(r):
                f = u * R + r

                def mac(m):
                    tap = ir.Load("weights_time", f * M + m, wt.dtype)
                    old = _offset(ir.Load("y1", mem(b, f, m), state.dtype), -zp_s)
                    prod = ir.call("mf_wrap_mul_i32", tap, old) if wrap_mul else tap * old
                    return [_accumulate("s", "int32", prod, wrap2)]
                return [ir.Decl("s", "int32", _c(0)), *ir.loops([("m", M)], mac),
                        _accumulate("acc", "int32", ir.Var("s"), wrap3)]
            start = ir.Load("bias", u, "int32") if bias is not None else _c(0)
            out = ir.clamp(ir.call("mf_mbqm", ir.Var("acc"), m2, sh2) + zp_y, act_lo, act_hi)
            return [ir.Decl("acc", "int32", start), *ir.loops([("r", R)], filter_),
                    ir.Store("y", b * U + u, out)]
        extra = (f"rank {R}, memory {M}, {U} units; feature scale {m1} * 2^{sh1 - 31}, output "
                 f"scale {m2} * 2^{sh2 - 31}, activation {ctx.attrs['activation']}")
    else:
        act = ctx.attrs["activation"]

        def feature(b, f):
            dot = ir.Var("dot", F)

            def mac(k):
                w = ir.Load("weights_feature", f * I + k, F)
                return [ir.Assign("dot", dot + w * ir.Load(nx, b * I + k, F))]
            return [ir.Decl("dot", F, _f(0.0)), *ir.loops([("k", I)], mac),
                    ir.Store("y1", mem(b, f, M - 1), dot)]

        def unit(b, u):
            s = ir.Var("s", F)

            def filter_(r):
                f = u * R + r

                def mac(m):
                    tap = ir.Load("weights_time", f * M + m, F)
                    return [ir.Assign("s", s + tap * ir.Load("y1", mem(b, f, m), F))]
                return [ir.Decl("s", F, _f(0.0)), *ir.loops([("m", M)], mac),
                        ir.Assign("acc", ir.Var("acc", F) + s)]
            start = ir.Load("bias", u, F) if bias is not None else _f(0.0)
            return [ir.Decl("acc", F, start), *ir.loops([("r", R)], filter_),
                    ir.Store("y", b * U + u, _svdf_activation(ir.Var("acc", F), act))]
        extra = f"rank {R}, memory {M}, {U} units, activation {act}"

    body.append(ir.Comment("the newest entry of every filter: weights_feature . x"))
    body += ir.loops([("b", B), ("f", F_)], feature)
    body.append(ir.Comment("each unit: bias + weights_time . memory over its rank filters"))
    body += ir.loops([("b", B), ("u", U)], unit)
    macs = B * F_ * (I + M)
    return ir.Kernel(ctx.name, tuple(ctx.io_buffers() + consts), tuple(body),
                     describe(ctx, extra + f", {macs} MACs"), macs)


# ---- UNIDIRECTIONAL_SEQUENCE_LSTM ------------------------------------------------------------

def checked_log2(x: float) -> int:
    """tflite::CheckedLog2's result: round(log(x) * (1 / log(2))) formed in float32. TFLM's
    LSTM ignores whether x was a power of two; the tanh of the cell state then reads it as
    the nearest one."""
    v = np.log(np.float32(x)) * (np.float32(1.0) / np.log(np.float32(2.0)))
    return round_half_away(float(np.float32(v)))


class _Lstm:
    """Shapes, buffer names and TFLM's parameters of one lstm_tflite node."""

    GATE_SCALE = 2.0**-12  # the gates' FC output: Q3.12
    ACT_SCALE = 2.0**-15  # sigmoid / tanh output: Q0.15

    def __init__(self, ctx: OpContext):
        self.ctx = ctx
        x = ctx.input(0)
        const_names = {1 + g: f"w_{name}" for g, name in enumerate(GATES)}
        const_names.update({5 + g: f"r_{name}" for g, name in enumerate(GATES)})
        const_names.update({9 + g: f"b_{name}" for g, name in enumerate(GATES)})
        self.names, self.consts = _operands(ctx, const_names)
        self.time_major = ctx.attrs["time_major"]
        self.T, self.B = x.shape[:2] if self.time_major else x.shape[1::-1]
        self.I = x.shape[2]
        self.H = ctx.input(1).shape[0]
        self.dtype = x.dtype

    def row(self, t, b):
        """Index of the first element of step t, batch b in x or y (times I or H)."""
        return t * self.B + b if self.time_major else b * self.T + t

    def w(self, g: int, j, k, recurrent: bool) -> ir.Expr:
        t = self.ctx.input(5 + g if recurrent else 1 + g)
        n = self.H if recurrent else self.I
        return ir.Load(self.names[5 + g if recurrent else 1 + g], j * n + k, t.dtype)


def _float_gate(lstm: _Lstm, g: int, var: str, t, b, j) -> list:
    """TFLM's CalculateLstmGate on floats: FC(x) + bias and FC(h) each clamped to +-FLT_MAX
    (the FC kernel's activation range), added, then sigmoid (tanh for the cell gate)."""
    acc, v = ir.Var("acc", F), ir.Var(var, F)
    xs = lambda k: ir.Load(lstm.names[0], lstm.row(t, b) * lstm.I + k, F)  # noqa: E731
    hs = lambda k: ir.Load("y1", b * lstm.H + k, F)  # noqa: E731
    act = ir.call("mfm_tanhf", v, dtype=F) if GATES[g] == "cell" else _float_logistic(v)
    return [ir.Comment(f"{GATES[g]} gate"),
            *([ir.Assign("acc", _f(0.0))] if g else []),  # (declared 0 before the first)
            *ir.loops([("k", lstm.I)], lambda k: [
                ir.Assign("acc", acc + xs(k) * lstm.w(g, j, k, False))]),
            ir.Decl(var, F, acc + ir.Load(lstm.names[9 + g], j, F)),
            _float_clamp(var),
            ir.Assign("acc", _f(0.0)),
            *ir.loops([("k", lstm.H)], lambda k: [
                ir.Assign("acc", acc + hs(k) * lstm.w(g, j, k, True))]),
            _float_clamp("acc"),
            ir.Assign(var, v + acc),
            ir.Assign(var, act)]


def _float_unit(lstm: _Lstm, t, b, j) -> list:
    clip = float(np.float32(lstm.ctx.attrs["cell_clip"]))
    cell, v = ir.Var("cell", F), lambda n: ir.Var(n, F)  # noqa: E731
    body = [ir.Decl("acc", F, _f(0.0))]
    for g, var in enumerate(("input_gate", "forget_gate", "cell_gate", "output_gate")):
        body += _float_gate(lstm, g, var, t, b, j)
    # TFLM's Mul clamps each product to +-FLT_MAX too, but factors in [-1, 1] and a cell state
    # that grows by at most 1 per step never reach it (and NaN passes): those clamps are left out
    body += [ir.Comment("cell = forget * cell + input * cell gate"),
             ir.Decl("cell", F, v("forget_gate") * ir.Load("y2", b * lstm.H + j, F)),
             ir.Assign("cell", cell + v("input_gate") * v("cell_gate"))]
    if clip > 0:  # max(min(clip, cell), -clip) as std::min / std::max spell it
        body.append(ir.Assign("cell", ir.select(cell.lt(_f(clip)), cell, _f(clip))))
        body.append(ir.Assign("cell", ir.select(cell.lt(_f(-clip)), _f(-clip), cell)))
    hidden = ir.call("mfm_tanhf", cell, dtype=F) * v("output_gate")
    return body + [ir.Store("y2", b * lstm.H + j, cell),
                   ir.Store("y", lstm.row(t, b) * lstm.H + j, hidden)]


def _sat16(e: ir.Expr, fast: bool = False) -> ir.Expr:
    """e clamped to int16; with `fast` through mf_seq_sat16 (one SSAT: gcc 12 makes 4-6
    compares of most such clamps)."""
    return ir.call("mf_seq_sat16", e) if fast else ir.clamp(e, -32768, 32767)


def _requant(e: ir.Expr, mult: int, shift: int, zp: int, lo: int, hi: int, bound, fast: bool):
    """clamp(zp + MultiplyByQuantizedMultiplier(e, mult, shift), lo, hi) for an int32 e with
    |e| <= bound: with `fast`, mf_seq_rq (one rounding high multiply and a shift, see
    runtime_c/mcuforge_seq.h) where pack.requant_params proves it exact for that bound, else
    mf_mbqm as TFLM computes it."""
    rq = pack.requant_params([mult], [shift], zp, [bound]) if fast else None
    if rq is None:
        return ir.clamp(_offset(ir.call("mf_mbqm", e, mult, shift), zp), lo, hi)
    m, add, pre, post = (int(v) for v in rq[0])
    v = ir.call("mf_seq_rq", e, m, add, pre, post)
    return _sat16(v, True) if (lo, hi) == (-32768, 32767) else ir.clamp(v, lo, hi)


def _int_gate(lstm: _Lstm, g: int, var: str, t, b, j, fast: bool = False) -> list:
    """TFLM's integer CalculateLstmGate for unit j: FC(x) with the gate's bias and FC(h), each
    requantized to Q3.12 int16 (Prepare's multipliers), their saturating sum, then sigmoid
    (tanh for the cell gate) to Q0.15. The sums are int32 (8x8) or int64 (16x8), TFLM's bias
    type; an int32 sum wraps where the weights allow an overflow, as TFLM's does."""
    ctx = lstm.ctx
    x, hidden, w, r = ctx.input(0), ctx.input(13), ctx.input(1 + g), ctx.input(5 + g)
    (s_x, zp_x), (s_h, zp_h), (s_w, zp_w), (s_r, zp_r) = (_q(t_) for t_ in (x, hidden, w, r))
    acc_t = "int32" if x.dtype == "int8" else "int64"
    mbqm = "mf_mbqm" if acc_t == "int32" else "mf_mbqm_i64"
    m_w, sh_w = (int(a[0]) for a in qp.fc_output_multipliers(s_x, [s_w], _Lstm.GATE_SCALE))
    m_r, sh_r = (int(a[0]) for a in qp.fc_output_multipliers(s_h, [s_r], _Lstm.GATE_SCALE))
    bias = ctx.input(9 + g).data.astype(np.int64)

    def span(t_, zp):  # the largest |value - zero point| of t_'s type
        lo, hi = INT_RANGE[t_.dtype]
        return max(hi - zp, zp - lo)

    def bound(wt, zp, n):  # the largest |sum over a row of (w - zp) * n|
        return int((np.abs(wt.data.astype(np.int64) - zp).sum(axis=1) * n).max())
    wrap_x = acc_t == "int32" and _may_overflow(bound(w, zp_w, span(x, zp_x))
                                                 + int(np.abs(bias).max()))
    wrap_r = acc_t == "int32" and _may_overflow(bound(r, zp_r, span(hidden, zp_h)))

    def wx(k):
        xs = ir.Load(lstm.names[0], lstm.row(t, b) * lstm.I + k, x.dtype)
        prod = _offset(lstm.w(g, j, k, False), -zp_w) * _offset(xs, -zp_x)
        return [_accumulate("acc", acc_t, prod, wrap_x)]

    def rh(k):
        hs = ir.Load("y1", b * lstm.H + k, hidden.dtype)
        prod = _offset(lstm.w(g, j, k, True), -zp_r) * _offset(hs, -zp_h)
        return [_accumulate("acc", acc_t, prod, wrap_r)]
    acc, b_j = ir.Var("acc", acc_t), ir.Load(lstm.names[9 + g], j, acc_t)
    with_bias = ir.call("mf_wrap_add_i32", acc, b_j) if wrap_x else acc + b_j
    if acc_t == "int32" and fast:  # the sums' bounds: the weights over the inputs' ranges
        (x_lo, x_hi), (h_lo, h_hi) = INT_RANGE[x.dtype], INT_RANGE[hidden.dtype]
        b_x = int(pack.acc_bounds(bias, w.data.astype(np.int64) - zp_w, x_lo - zp_x,
                                  x_hi - zp_x).max())
        b_h = int(pack.acc_bounds(None, r.data.astype(np.int64) - zp_r, h_lo - zp_h,
                                  h_hi - zp_h).max())
        rq_x = lambda e: _requant(e, m_w, sh_w, 0, -32768, 32767, b_x, True)  # noqa: E731
        rq_h = lambda e: _requant(e, m_r, sh_r, 0, -32768, 32767, b_h, True)  # noqa: E731
    else:
        rq_x = lambda e: _sat16(ir.call(mbqm, e, m_w, sh_w))  # noqa: E731
        rq_h = lambda e: _sat16(ir.call(mbqm, e, m_r, sh_r))  # noqa: E731
    fc_h = rq_h(acc)
    fast = fast and acc_t == "int32"
    act, name = ("mf_tanh_s16", "tanh") if GATES[g] == "cell" else ("mf_logistic_s16", "sigmoid")
    return [ir.Comment(f"{GATES[g]} gate: FC(x) + FC(h) in Q3.12, then {name} to Q0.15"),
            *([ir.Assign("acc", _c(0, acc_t))] if g else []),  # (declared 0 before the first)
            *ir.loops([("k", lstm.I)], wx),
            ir.Decl(var, "int32", rq_x(with_bias)),
            ir.Assign("acc", _c(0, acc_t)),
            *ir.loops([("k", lstm.H)], rh),
            ir.Assign(var, ir.call(act, ir.cast(_sat16(ir.Var(var) + fc_h, fast), "int16"),
                                   0, 0))]


def _int_unit(lstm: _Lstm, t, b, j, fast: bool = False) -> list:
    """TFLM's integer LstmStep for one unit: the four gates, then the cell state in its int16
    scale and the hidden state in its own, through MulElementwise."""
    ctx = lstm.ctx
    x, hidden, cell = ctx.input(0), ctx.input(13), ctx.input(14)
    s_h, zp_h = _q(hidden)
    s_c = _q(cell)[0]
    acc_t = "int32" if x.dtype == "int8" else "int64"
    body = [ir.Decl("acc", acc_t, _c(0, acc_t))]
    for g, var in enumerate(("input_gate", "forget_gate", "cell_gate", "output_gate")):
        body += _int_gate(lstm, g, var, t, b, j, fast)
    # the element-wise products: MulElementwise with the parameters of CreateInterGateMulParams
    m_fc, s_fc = qp.quantize_multiplier(_Lstm.ACT_SCALE * s_c / s_c)
    m_ig, s_ig = qp.quantize_multiplier(_Lstm.ACT_SCALE * _Lstm.ACT_SCALE / s_c)
    m_h, s_h_ = qp.quantize_multiplier(_Lstm.ACT_SCALE * _Lstm.ACT_SCALE / s_h)
    # tanh of the cell state: its scale 2^power read as Q3.12 by shifting (TFLM's Tanh wrapper)
    shift = 12 + checked_log2(s_c)
    t_mult, t_shift = (0, shift) if shift >= 0 else (3, -shift)
    cell_v, v = ir.Var("cell"), ir.Var
    # the products' bounds: sigmoid in [0, 32767], tanh and the cell state int16
    fast = fast and acc_t == "int32"
    prod_bound = 32767 * 32768
    body += [ir.Comment("cell = forget * cell + input * cell gate, in the cell state's scale"),
             ir.Decl("cell", "int32", _requant(
                 v("forget_gate") * ir.Load("y2", b * lstm.H + j, "int16"), m_fc, s_fc, 0,
                 -32768, 32767, prod_bound, fast)),
             ir.Assign("cell", _sat16(fast=fast, e=cell_v + _requant(
                 v("input_gate") * v("cell_gate"), m_ig, s_ig, 0, -32768, 32767, prod_bound,
                 fast)))]
    clip = float(np.float32(ctx.attrs["cell_clip"]))
    if clip > 0:  # CreateLstmCellStateInfo: clip / scale in double, truncated to int16
        q_clip = int(min(max(clip / s_c, -32768.0), 32767.0))
        if fast and q_clip == 32767:  # (the cell is int16 already: only -32768 moves)
            body.append(ir.Assign("cell", ir.vmax(cell_v, -q_clip)))
        else:
            body.append(ir.Assign("cell", ir.clamp(cell_v, -q_clip, q_clip)))
    lo, hi = INT_RANGE[hidden.dtype]
    tanh_c = ir.call("mf_tanh_s16", ir.cast(cell_v, "int16"), t_mult, t_shift)
    h = _requant(tanh_c * v("output_gate"), m_h, s_h_, zp_h, lo, hi, prod_bound, fast)
    return body + [ir.Store("y2", b * lstm.H + j, cell_v),
                   ir.Comment("hidden = tanh(cell) * output gate, in the hidden state's scale"),
                   ir.Store("y", lstm.row(t, b) * lstm.H + j, h)]


@lowers("lstm_tflite")
def lstm_tflite(ctx: OpContext, fast: bool = False) -> ir.Kernel:
    """TFLM's EvalLstm, one unit at a time: at each step every gate of unit j reads the whole
    previous hidden state, so the new hidden state goes to y first and replaces the state
    (y1, TFLM's hidden state tensor) once the step's units are done. The cell state (y2) is
    element-wise and is updated in place, as TFLM does. Batch rows never interact, so one loop
    order serves time-major and batch-major layouts. `fast` (8x8 -> 16 only): the
    requantizations in mf_seq_rq's form where proven exact (see _requant)."""
    lstm = _Lstm(ctx)
    T, B, H = lstm.T, lstm.B, lstm.H
    nh, nc = lstm.names[13], lstm.names[14]
    unit = _float_unit if lstm.dtype == F else (
        lambda lstm_, t, b, j: _int_unit(lstm_, t, b, j, fast))
    hidden_t, cell_t = ctx.input(13).dtype, ctx.input(14).dtype
    body = [ir.Decl("flt_max", F, _f(FLT_MAX))] if lstm.dtype == F else []
    body += [ir.Comment("the state this invocation starts from"),
             *ir.loops([("i", B * H)], lambda i: [
                 ir.Store("y1", i, ir.Load(nh, i, hidden_t)),
                 ir.Store("y2", i, ir.Load(nc, i, cell_t))])]

    def step(t, b):
        return [*ir.loops([("j", H)], lambda j: unit(lstm, t, b, j)),
                *ir.loops([("j", H)], lambda j: [ir.Store(
                    "y1", b * H + j, ir.Load("y", lstm.row(t, b) * H + j, hidden_t))])]
    body += ir.loops([("t", T), ("b", B)], step)
    macs = 4 * T * B * H * (lstm.I + H)
    extra = (f"{'time' if lstm.time_major else 'batch'} major, {T} steps, batch {B}, "
             f"{lstm.I} inputs, {H} units, cell_clip {ctx.attrs['cell_clip']:g}, {macs} MACs")
    return ir.Kernel(ctx.name, tuple(ctx.io_buffers() + lstm.consts), tuple(body),
                     describe(ctx, extra), macs)
