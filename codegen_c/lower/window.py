"""The 2-D sliding window that convolutions and pooling share: which input pixel each filter
tap reads, and the guards that skip taps falling in the padding (TFLM skips them; they add
nothing, not the zero point)."""
from __future__ import annotations

from dataclasses import dataclass

from .. import loop_ir as ir


@dataclass(frozen=True)
class Window:
    in_hw: tuple
    out_hw: tuple
    filter_hw: tuple
    stride: tuple
    dilation: tuple
    pad: tuple  # (top, left): padding before the first row and column

    @staticmethod
    def of(ctx, filter_hw) -> "Window":
        x, y = ctx.input(0), ctx.output()
        pt, _, pl, _ = ctx.attrs["padding"]
        return Window(tuple(x.shape[1:3]), tuple(y.shape[1:3]), tuple(filter_hw),
                      tuple(ctx.attrs["stride"]), tuple(ctx.attrs.get("dilation", (1, 1))),
                      (pt, pl))

    def coordinate(self, axis: int, o: ir.Expr, k: ir.Expr) -> tuple:
        """(input coordinate o*stride - pad + k*dilation, guard or None when always inside)."""
        s, p, d = self.stride[axis], self.pad[axis], self.dilation[axis]
        idx = o * s - p + k * d
        last = (self.out_hw[axis] - 1) * s - p + (self.filter_hw[axis] - 1) * d
        if p <= 0 and last < self.in_hw[axis]:
            return idx, None
        return idx, ir.binop("&&", idx.ge(0), idx.lt(self.in_hw[axis]))

    def taps(self, oy: ir.Expr, ox: ir.Expr, inner, names=("ky", "kx")) -> tuple:
        """Loops over the filter taps of output pixel (oy, ox); inner(iy, ix, ky, kx) gives the
        statements of one tap. Loops of extent 1 vanish, their variable becomes 0."""
        ky, kx = ir.Var(names[0]), ir.Var(names[1])
        iy, guard_y = self.coordinate(0, oy, ky)
        ix, guard_x = self.coordinate(1, ox, kx)
        body = tuple(inner(iy, ix, ky, kx))
        if guard_x is not None:
            body = (ir.If(guard_x, body),)
        body = ir.loops([(names[1], self.filter_hw[1])], lambda _: body)
        if guard_y is not None:
            body = (ir.If(guard_y, body),)
        body = ir.loops([(names[0], self.filter_hw[0])], lambda _: body)
        unit = {n: ir.Const(0) for n, k in zip(names, self.filter_hw) if k == 1}
        return ir.substitute(body, unit) if unit else body

    def clipped(self, axis: int) -> bool:
        """Whether some window along `axis` reaches outside the input."""
        return self.coordinate(axis, ir.Var("o"), ir.Var("k"))[1] is not None
