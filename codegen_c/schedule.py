"""Schedule transformations on loop-IR bodies. Each maps a body (tuple of statements) to an
equivalent body: same stores in the same buffers with the same values, evaluation order changed
only where the transformation says so. Loops are found by their variable name."""
from __future__ import annotations

from dataclasses import replace

from . import loop_ir as ir


def _rewrite_loop(body: tuple, var: str, fn) -> tuple:
    """Replace the loop over `var` (anywhere in body) by the statements fn(loop) returns."""
    out, found = [], False
    for s in body:
        if isinstance(s, ir.Loop) and s.var == var:
            out += list(fn(s))
            found = True
        elif isinstance(s, ir.Loop):
            new = _rewrite_loop(s.body, var, fn)
            found |= new != s.body
            out.append(replace(s, body=new))
        elif isinstance(s, ir.If):
            then, orelse = _rewrite_loop(s.then, var, fn), _rewrite_loop(s.orelse, var, fn)
            found |= (then, orelse) != (s.then, s.orelse)
            out.append(replace(s, then=then, orelse=orelse))
        else:
            out.append(s)
    return tuple(out)


def find_loop(body: tuple, var: str) -> ir.Loop:
    for s in ir.walk(body):
        if isinstance(s, ir.Loop) and s.var == var:
            return s
    raise KeyError(f"no loop over '{var}'")


def split(body: tuple, var: str, factor: int, tail: bool = False) -> tuple:
    """for v < n  ->  for v_o < n/factor: for v_i < factor: (v = v_o*factor + v_i).
    When factor does not divide n: with `tail`, the n % factor last iterations follow as a loop
    of their own (v = n - n % factor + v_t), in the same order; without, an error (constant
    bounds stay constant either way)."""
    def do(loop: ir.Loop):
        rest = loop.extent % factor
        if (rest and not tail) or loop.step != 1 or loop.start != 0 or factor < 1:
            raise ValueError(f"cannot split loop '{var}' of extent {loop.extent} by {factor}")
        outer, inner, last = f"{var}_o", f"{var}_i", f"{var}_t"
        out = []
        if loop.extent >= factor:
            inner_body = ir.substitute(loop.body, {var: ir.Var(outer) * factor + ir.Var(inner)})
            out.append(ir.Loop(outer, loop.extent // factor, (ir.Loop(inner, factor, inner_body),)))
        if rest:
            base = loop.extent - rest
            out.append(ir.Loop(last, rest, ir.substitute(loop.body, {var: ir.Var(last) + base})))
        return tuple(out)
    find_loop(body, var)
    return _rewrite_loop(body, var, do)


def reorder(body: tuple, outer: str, inner: str) -> tuple:
    """Swap two perfectly nested loops (the outer loop's body is exactly the inner loop)."""
    def do(loop: ir.Loop):
        if len(loop.body) != 1 or not isinstance(loop.body[0], ir.Loop) or loop.body[0].var != inner:
            raise ValueError(f"loops '{outer}' and '{inner}' are not perfectly nested")
        in_loop = loop.body[0]
        return (replace(in_loop, body=(replace(loop, body=in_loop.body),)),)
    find_loop(body, outer)
    return _rewrite_loop(body, outer, do)


def unroll(body: tuple, var: str) -> tuple:
    """Replace the loop by one copy of its body per iteration, the variable made constant."""
    def do(loop: ir.Loop):
        if any(isinstance(s, ir.Decl) for s in ir.walk(loop.body)):
            raise ValueError(f"loop '{var}' declares locals: unrolling would redeclare them")
        out = []
        for k in range(loop.extent):
            out += ir.substitute(loop.body, {var: ir.Const(loop.start + k * loop.step)})
        return tuple(out)
    find_loop(body, var)
    return _rewrite_loop(body, var, do)


def replace_loop(body: tuple, var: str, make_call) -> tuple:
    """Replace the loop nest over `var` by statements make_call(loop) builds, typically one
    CallStmt to an optimized micro-kernel that computes the same thing."""
    find_loop(body, var)
    return _rewrite_loop(body, var, lambda loop: tuple(make_call(loop)))
