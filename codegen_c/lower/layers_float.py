"""Float32 layer ops from ONNX: matmul, conv_transpose2d, the normalisations (batch_norm,
instance_norm, layer_norm) and the recurrent lstm and gru. Plain loops accumulating in float;
statistics two-pass (the mean, then the mean squared deviation), as onnx's reference does."""
from __future__ import annotations

import numpy as np

from .. import loop_ir as ir
from .. import mathmirror  # noqa: F401  (registers the mfm_ mirrors for the evaluator)
from . import OpContext, const, describe, float_activation, lowers, operand
from .elementwise import broadcast_index, operand_names


def _f(v) -> ir.Const:
    return ir.Const(float(np.float32(v)), "float32")


def _require_float(ctx: OpContext):
    if ctx.output().dtype != "float32":
        raise NotImplementedError(f"{ctx.node.op} on {ctx.output().dtype}")


@lowers("matmul")
def matmul(ctx: OpContext) -> ir.Kernel:
    """numpy.matmul: 1-D operands become a row (left) or a column (right), batch dims broadcast."""
    _require_float(ctx)
    a, b, y = ctx.input(0), ctx.input(1), ctx.output()
    (na, nb), consts = operand_names(ctx)
    sa = (1,) + tuple(a.shape) if len(a.shape) == 1 else tuple(a.shape)
    sb = tuple(b.shape) + (1,) if len(b.shape) == 1 else tuple(b.shape)
    M, K, N = sa[-2], sa[-1], sb[-1]
    batch = tuple(np.broadcast_shapes(sa[:-2], sb[:-2]))

    def body(*idx):
        *bi, m, n = idx
        a_row = broadcast_index(sa[:-2], batch, bi) * M + m
        b_mat = broadcast_index(sb[:-2], batch, bi) * K
        mac = lambda k: [ir.Assign("acc", ir.Var("acc", "float32")
                                   + ir.Load(na, a_row * K + k, "float32")
                                   * ir.Load(nb, (b_mat + k) * N + n, "float32"))]
        return [ir.Decl("acc", "float32", _f(0.0)), *ir.loops([("k", K)], mac),
                ir.Store("y", ir.flat_index(list(idx), [*batch, M, N]), ir.Var("acc", "float32"))]

    extents = [(f"b{d}", n) for d, n in enumerate(batch)] + [("m", M), ("n", N)]
    macs = int(np.prod(batch, dtype=np.int64)) * M * N * K
    return ir.Kernel(ctx.name, tuple(ctx.io_buffers() + consts), ir.loops(extents, body),
                     describe(ctx, f"{macs} MACs"), macs)


@lowers("conv_transpose2d")
def conv_transpose2d(ctx: OpContext) -> ir.Kernel:
    """NHWC, weights OHWI with I the input channels of one group (groups = C / I). Output pixel
    oy gathers the input rows iy with iy*stride - pad_top + ky*dilation == oy."""
    _require_float(ctx)
    x, w, bias, y = ctx.input(0), ctx.input(1), ctx.input(2), ctx.output()
    N, H, W, C = x.shape
    O, KH, KW, CI = w.shape
    _, OH, OW, _ = y.shape
    G, OG = C // CI, O // (C // CI)
    pt, _, pl, _ = ctx.attrs["padding"]
    wb, wconst = operand(ctx, 1, "w", "float32")
    bufs = ctx.io_buffers() + wconst
    if bias is not None:
        bb, bconst = operand(ctx, 2, "bias", "float32")
        bufs += bconst
    acc = ir.Var("acc", "float32")

    def source(o, k, pad, stride, dil, size):
        """(input coordinate, guard) of output coordinate o and tap k."""
        t = o + pad - k * dil
        if stride == 1:
            return t, ir.binop("&&", t.ge(0), t.lt(size))
        q = ir.binop("/", t, stride)
        return q, ir.binop("&&", ir.binop("&&", t.ge(0), t.mod(stride).eq(0)), q.lt(size))

    def body(n, oy, ox, g, og):
        oc = g * OG + og
        iy, gy = source(oy, ir.Var("ky"), pt, ctx.attrs["stride"][0], ctx.attrs["dilation"][0], H)
        ix, gx = source(ox, ir.Var("kx"), pl, ctx.attrs["stride"][1], ctx.attrs["dilation"][1], W)
        mac = ir.loops([("ic", CI)], lambda ic: [ir.Assign("acc", acc + ir.Load(
            "x", ir.flat_index([n, iy, ix, g * CI + ic], [N, H, W, C]), "float32") * ir.Load(
            wb, ir.flat_index([oc, ir.Var("ky"), ir.Var("kx"), ic], [O, KH, KW, CI]), "float32"))])
        taps = ir.loops([("ky", KH)], lambda _: [ir.If(gy, ir.loops(
            [("kx", KW)], lambda _: [ir.If(gx, mac)]))])
        taps = ir.substitute(taps, {v: ir.Const(0) for v, k in (("ky", KH), ("kx", KW)) if k == 1})
        init = ir.Load(bb, oc, "float32") if bias is not None else _f(0.0)
        act = float_activation(acc, ctx.attrs["activation"])
        return [ir.Decl("acc", "float32", init), *taps,
                ir.Store("y", ir.flat_index([n, oy, ox, oc], [N, OH, OW, O]), act)]

    loop = ir.loops([("n", N), ("oy", OH), ("ox", OW), ("g", G), ("og", OG)], body)
    macs = N * H * W * O * KH * KW * CI
    (sh, sw), (dh, dw) = ctx.attrs["stride"], ctx.attrs["dilation"]
    extra = (f"stride {sh}x{sw}, dilation {dh}x{dw}, padding {ctx.attrs['padding']}, groups {G}, "
             f"activation {ctx.attrs['activation']}, {macs} MACs")
    return ir.Kernel(ctx.name, tuple(bufs), loop, describe(ctx, extra), macs)


@lowers("batch_norm")
def batch_norm(ctx: OpContext) -> ir.Kernel:
    """y = (x - mean) * (scale / sqrt(var + epsilon)) + bias per channel (the last axis); the
    factor is computed at compile time, so scale, bias, mean and var must be constants."""
    _require_float(ctx)
    x, scale, bias, mean, var = (ctx.input(i) for i in range(5))
    if not all(t.is_const for t in (scale, bias, mean, var)):
        return _batch_norm_runtime(ctx)
    C = x.shape[-1]
    eps = np.float32(ctx.attrs["epsilon"])
    chan = lambda t: np.broadcast_to(t.data.astype(np.float32).reshape(-1), (C,))
    factor = chan(scale) / np.sqrt(chan(var) + eps)
    bufs = ctx.io_buffers() + [const("mean", chan(mean), "float32", mean.name),
                               const("factor", factor, "float32", "scale / sqrt(var + eps)"),
                               const("bias", chan(bias), "float32", bias.name)]

    def body(r, c):
        i = r * C + c
        v = (ir.Load("x", i, "float32") - ir.Load("mean", c, "float32")) \
            * ir.Load("factor", c, "float32") + ir.Load("bias", c, "float32")
        return [ir.Store("y", i, v)]

    loop = ir.loops([("r", x.size // C), ("c", C)], body)
    return ir.Kernel(ctx.name, tuple(bufs), loop, describe(ctx, f"epsilon {float(eps):g}"))


def _batch_norm_runtime(ctx: OpContext) -> ir.Kernel:
    """batch_norm whose statistics are computed at run time (read from the arena, or tables
    for the constant ones): the factor scale / sqrt(var + eps) per element."""
    x = ctx.input(0)
    C = x.shape[-1]
    eps = np.float32(ctx.attrs["epsilon"])
    tables, bufs = [], ctx.io_buffers()  # (buffer, one value for every channel)
    for i, nm in ((1, "scale"), (2, "bias"), (3, "mean"), (4, "var")):
        t = ctx.input(i)
        if t.is_const:
            bufs.append(const(nm, np.broadcast_to(t.data.astype(np.float32).reshape(-1), (C,)),
                              "float32", t.name))
            tables.append((nm, False))
        else:
            tables.append((operand(ctx, i, nm)[0], t.size == 1))

    def load(k, c):
        return ir.Load(tables[k][0], ir.Const(0) if tables[k][1] else c, "float32")

    def body(r, c):
        i = r * C + c
        inv = ir.binop("/", load(0, c), ir.call("mfm_sqrtf", load(3, c) + _f(eps),
                                                 dtype="float32"))
        return [ir.Store("y", i, (ir.Load("x", i, "float32") - load(2, c)) * inv + load(1, c))]

    loop = ir.loops([("r", x.size // C), ("c", C)], body)
    return ir.Kernel(ctx.name, tuple(bufs), loop,
                     describe(ctx, f"epsilon {float(eps):g}, statistics computed at run time"))


def _stats(load, count: int, extents: list, eps) -> list:
    """Declares float locals `mean` and `inv` (1 / sqrt(variance + eps)) of the values
    load(*loop vars) over the loop nest `extents`."""
    mean, dev = ir.Var("mean", "float32"), ir.Var("dev", "float32")
    total = lambda v: [ir.Assign("sum", ir.Var("sum", "float32") + v)]
    return [ir.Decl("sum", "float32", _f(0.0)), *ir.loops(extents, lambda *i: total(load(*i))),
            ir.Decl("mean", "float32", ir.binop("/", ir.Var("sum", "float32"), _f(count))),
            ir.Assign("sum", _f(0.0)),
            *ir.loops(extents, lambda *i: [ir.Decl("dev", "float32", load(*i) - mean),
                                           *total(dev * dev)]),
            ir.Decl("inv", "float32", ir.binop("/", _f(1.0), ir.call(
                "mfm_sqrtf", ir.binop("/", ir.Var("sum", "float32"), _f(count)) + _f(eps),
                dtype="float32")))]


@lowers("instance_norm")
def instance_norm(ctx: OpContext) -> ir.Kernel:
    """Per image and channel (NHWC, any spatial rank): y = (x - mean) * inv * scale + bias."""
    _require_float(ctx)
    x = ctx.input(0)
    names, consts = operand_names(ctx)
    N, C = x.shape[0], x.shape[-1]
    S = x.size // (N * C)
    eps = ctx.attrs["epsilon"]

    def body(n, c):
        at = lambda s: (n * S + s) * C + c
        load = lambda s: ir.Load("x", at(s), "float32")
        k = ir.Var("inv", "float32") * ir.Load(names[1], c, "float32")
        norm = lambda s: [ir.Store("y", at(s), (load(s) - ir.Var("mean", "float32")) * k
                                   + ir.Load(names[2], c, "float32"))]
        return [*_stats(load, S, [("s", S)], eps), *ir.loops([("s", S)], norm)]

    loop = ir.loops([("n", N), ("c", C)], body)
    return ir.Kernel(ctx.name, tuple(ctx.io_buffers() + consts), loop,
                     describe(ctx, f"epsilon {eps:g}, {S} pixels per channel"))


@lowers("layer_norm")
def layer_norm(ctx: OpContext) -> ir.Kernel:
    """Over axes axis..end: y = (x - mean) * inv * scale + bias, scale and bias broadcast to
    those axes. Optional outputs 1 and 2: the mean and inv (ONNX's Mean and InvStdDev)."""
    _require_float(ctx)
    x, scale, bias = ctx.input(0), ctx.input(1), ctx.input(2)
    names, consts = operand_names(ctx)
    axis, eps = ctx.attrs["axis"], ctx.attrs["epsilon"]
    inner = tuple(x.shape[axis:])
    rows, cols = x.size // int(np.prod(inner, dtype=np.int64)), \
        int(np.prod(inner, dtype=np.int64))
    n_out = len(ctx.node.outputs)

    def body(r):
        load = lambda j: ir.Load("x", r * cols + j, "float32")

        def norm(*idx):
            j = ir.flat_index(list(idx), inner)
            v = (load(j) - ir.Var("mean", "float32")) * ir.Var("inv", "float32") \
                * ir.Load(names[1], broadcast_index(scale.shape, inner, list(idx)), "float32")
            if bias is not None:
                v = v + ir.Load(names[2], broadcast_index(bias.shape, inner, list(idx)), "float32")
            return [ir.Store("y", r * cols + j, v)]
        stmts = [*_stats(load, cols, [("j", cols)], eps),
                 *ir.loops([(f"j{d}", n) for d, n in enumerate(inner)], norm)]
        if n_out > 1:
            stmts.append(ir.Store("y1", r, ir.Var("mean", "float32")))
        if n_out > 2:
            stmts.append(ir.Store("y2", r, ir.Var("inv", "float32")))
        return stmts

    return ir.Kernel(ctx.name, tuple(ctx.io_buffers() + consts), ir.loops([("r", rows)], body),
                     describe(ctx, f"axis {axis}, epsilon {eps:g}, {rows} rows of {cols}"))


# ---- recurrent layers -----------------------------------------------------------------------
# lstm inputs (x, w, r, b, initial_h, initial_c, p), outputs (y, y_h, y_c); gru inputs (x, w, r,
# b, initial_h), outputs (y, y_h). ONNX layouts: x [seq, batch, in], w [dirs, G*H, in] and r
# [dirs, G*H, H] with the gates in ONNX order (lstm i, o, f, c; gru z, r, h), b [dirs, 2*G*H]
# (input biases, then recurrent ones), p [dirs, 3H] (peepholes i, o, f), y [seq, dirs, batch, H],
# the states [dirs, batch, H]. y holds the hidden state between steps (step t reads y[t -+ 1]);
# the lstm cell state lives in y_c, the gru's reset-gated state in y_h until the last step.

def _sigmoid(v: ir.Expr) -> ir.Expr:
    return ir.binop("/", _f(1.0), _f(1.0) + ir.call("mfm_expf", ir.Unary("-", v, "float32"),
                                                    dtype="float32"))


def _tanh(v: ir.Expr) -> ir.Expr:
    return ir.call("mfm_tanhf", v, dtype="float32")


def _v(name: str) -> ir.Var:
    return ir.Var(name, "float32")


class _Recurrence:
    """Index arithmetic, gate sums and the time loop shared by lstm and gru."""

    def __init__(self, ctx: OpContext, gates: int):
        _require_float(ctx)
        self.ctx, self.G = ctx, gates
        self.names, self.consts = operand_names(ctx)
        self.S, self.B, self.I = ctx.input(0).shape
        self.H = ctx.attrs["hidden_size"]
        self.D = 2 if ctx.attrs["direction"] == "bidirectional" else 1
        clip = ctx.attrs["clip"]
        self.clip = (lambda v: v) if clip is None else \
            (lambda v: ir.clamp(v, _f(-clip), _f(clip)))

    def load(self, i: int, index) -> ir.Expr:
        return ir.Load(self.names[i], index, "float32")

    def state(self, d, b, j):  # index into [dirs, batch, H]
        return (d * self.B + b) * self.H + j

    def y(self, t, d, b, j):
        return ((t * self.D + d) * self.B + b) * self.H + j

    def h_prev(self, d, b, t_prev):
        """Loader of unit k of the previous hidden state: y at t_prev, initial_h at the first
        step (t_prev None), None for a zero initial state."""
        if t_prev is not None:
            return lambda k: ir.Load("y", self.y(t_prev, d, b, k), "float32")
        if self.names[4] is None:
            return None
        return lambda k: self.load(4, self.state(d, b, k))

    def sums(self, d, t, b, j, gates, h_of, split=False) -> list:
        """Decl a<g> = W_g x_t + R_g h + both biases for each gate g; h_of(k) loads unit k of
        h (None: zero). split: the recurrent part and bias go to r<g> instead."""
        G, H, I, stmts = self.G, self.H, self.I, []
        for g in gates:
            wb, rb = (self.load(3, (d * 2 * G + g) * H + j),
                      self.load(3, (d * 2 * G + G + g) * H + j)) \
                if self.names[3] else (_f(0.0), _f(0.0))
            stmts += [ir.Decl(f"a{g}", "float32", wb), ir.Decl(f"r{g}", "float32", rb)] \
                if split else [ir.Decl(f"a{g}", "float32", wb + rb if self.names[3] else wb)]
        acc = lambda name, v: ir.Assign(name, _v(name) + v)
        stmts += ir.loops([("k", I)], lambda k: [
            acc(f"a{g}", self.load(0, (t * self.B + b) * I + k)
                * self.load(1, ((d * G + g) * H + j) * I + k)) for g in gates])
        if h_of is not None:
            stmts += ir.loops([("k", H)], lambda k: [
                acc(f"{'r' if split else 'a'}{g}", h_of(k)
                    * self.load(2, ((d * G + g) * H + j) * H + k)) for g in gates])
        return stmts

    def run(self, step) -> tuple:
        """All directions: step(d, t, t_prev) gives the statements of one time step (t_prev
        None at the first step, which is peeled), then y_h = the last hidden state."""
        body = []
        for d in range(self.D):
            back = self.ctx.attrs["direction"] == "reverse" or d == 1
            body += step(d, self.S - 1 if back else 0, None)
            if self.S > 1:
                s = ir.Var("s")
                t, t_prev = ((self.S - 1) - s, self.S - s) if back else (s, s - 1)
                body.append(ir.Loop("s", self.S - 1, tuple(step(d, t, t_prev)), start=1))
            last = 0 if back else self.S - 1
            body += ir.loops([("b", self.B), ("j", self.H)], lambda b, j: [ir.Store(
                "y1", self.state(d, b, j), ir.Load("y", self.y(last, d, b, j), "float32"))])
        a = self.ctx.attrs
        macs = self.S * self.D * self.B * self.G * self.H * (self.I + self.H)
        extra = f"hidden {self.H}, {a['direction']}, clip {a['clip']}, {self.S} steps, {macs} MACs"
        return ir.Kernel(self.ctx.name, tuple(self.ctx.io_buffers() + self.consts), tuple(body),
                         describe(self.ctx, extra), macs)


@lowers("lstm")
def lstm(ctx: OpContext) -> ir.Kernel:
    """Gates i, o, f, c with sigmoid, tanh, tanh (ONNX's defaults), optional peepholes; the
    cell state is updated in y_c."""
    rc = _Recurrence(ctx, 4)
    H = rc.H

    def step(d, t, t_prev):
        out = []
        if t_prev is None:  # cell state from initial_c, else zero
            c0 = (lambda b, j: rc.load(5, rc.state(d, b, j))) if rc.names[5] else \
                (lambda b, j: _f(0.0))
            out += ir.loops([("b", rc.B), ("j", H)],
                            lambda b, j: [ir.Store("y2", rc.state(d, b, j), c0(b, j))])

        def unit(b, j):
            c_prev = ir.Load("y2", rc.state(d, b, j), "float32")
            i_in, f_in, o_in = _v("a0"), _v("a2"), _v("a1")
            if rc.names[6]:
                peep = lambda k: rc.load(6, d * 3 * H + k * H + j)
                i_in, f_in = i_in + peep(0) * c_prev, f_in + peep(2) * c_prev
                o_in = o_in + peep(1) * _v("c")
            forget = _f(1.0) - _v("i") if ctx.attrs["input_forget"] else _sigmoid(rc.clip(f_in))
            return [*rc.sums(d, t, b, j, range(4), rc.h_prev(d, b, t_prev)),
                    ir.Decl("i", "float32", _sigmoid(rc.clip(i_in))),
                    ir.Decl("c", "float32", forget * c_prev + _v("i") * _tanh(rc.clip(_v("a3")))),
                    ir.Store("y2", rc.state(d, b, j), _v("c")),
                    ir.Store("y", rc.y(t, d, b, j), _sigmoid(rc.clip(o_in)) * _tanh(_v("c")))]
        return out + list(ir.loops([("b", rc.B), ("j", H)], unit))
    return rc.run(step)


@lowers("gru")
def gru(ctx: OpContext) -> ir.Kernel:
    """Gates z, r, h with sigmoid, tanh (ONNX's defaults). Without linear_before_reset the
    candidate needs R_h (r * h) for every unit: r * h goes to y_h first, then each unit."""
    rc = _Recurrence(ctx, 3)
    lbr = ctx.attrs["linear_before_reset"]

    def step(d, t, t_prev):
        def reset(b, j):  # y_h = r * h_prev
            h_of = rc.h_prev(d, b, t_prev)
            return [*rc.sums(d, t, b, j, [1], h_of),
                    ir.Store("y1", rc.state(d, b, j), _sigmoid(rc.clip(_v("a1"))) * h_of(j))]

        def unit(b, j):
            h_of = rc.h_prev(d, b, t_prev)
            if lbr:
                stmts = rc.sums(d, t, b, j, [0, 1], h_of) + rc.sums(d, t, b, j, [2], h_of, True)
                cand = _v("a2") + _sigmoid(rc.clip(_v("a1"))) * _v("r2")
            else:
                gated = (lambda k: ir.Load("y1", rc.state(d, b, k), "float32")) if h_of else None
                stmts = rc.sums(d, t, b, j, [0], h_of) + rc.sums(d, t, b, j, [2], gated)
                cand = _v("a2")
            z = _v("z")
            h = (_f(1.0) - z) * _tanh(rc.clip(cand)) + (z * h_of(j) if h_of else _f(0.0))
            return stmts + [ir.Decl("z", "float32", _sigmoid(rc.clip(_v("a0")))),
                            ir.Store("y", rc.y(t, d, b, j), h)]
        loops = [("b", rc.B), ("j", rc.H)]
        first_zero = rc.h_prev(d, 0, t_prev) is None  # r * 0 needs no pass
        return ([] if lbr or first_zero else list(ir.loops(loops, reset))) + \
            list(ir.loops(loops, unit))
    return rc.run(step)
