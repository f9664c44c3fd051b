"""Loop IR -> C99 text. Tables plus one recursive walk over the (small, finite) IR tree.

Parentheses follow C precedence, except that shifts, bitwise and logical operators always
parenthesise compound operands (gcc -Wparentheses, and readability).
"""
from __future__ import annotations

import math

import numpy as np

from . import loop_ir as ir
from .names import c_comment

C_TYPES = {"int8": "int8_t", "uint8": "uint8_t", "int16": "int16_t", "int32": "int32_t",
           "int64": "int64_t", "float32": "float", "bool": "uint8_t"}
ITEMSIZE = {"int8": 1, "uint8": 1, "bool": 1, "int16": 2, "int32": 4, "float32": 4, "int64": 8}
_PREC = {"*": 13, "/": 13, "%": 13, "+": 12, "-": 12, "<<": 11, ">>": 11, "<": 10, "<=": 10,
         ">": 10, ">=": 10, "==": 9, "!=": 9, "&": 8, "^": 7, "|": 6, "&&": 5, "||": 4}
_STRICT = {"<<", ">>", "&", "^", "|", "&&", "||"}
_ATOM, _UNARY, _TERNARY = 16, 15, 3
# promotions C does by itself: no cast needed to widen these to int32
_PROMOTES = {("int8", "int32"), ("uint8", "int32"), ("int16", "int32"), ("bool", "int32")}


def c_float(v: float) -> str:
    """An exactly round-tripping float literal."""
    v = float(np.float32(v))
    if math.isnan(v):
        return "MF_NAN"
    if math.isinf(v):
        return "MF_INF" if v > 0 else "(-MF_INF)"
    if v == int(v) and abs(v) < 2**24:
        return f"{int(v)}.0f"
    r = repr(v)
    return (r if float(np.float32(r)) == v else v.hex()) + "f"


def c_int(v: int, dtype: str = "int32") -> str:
    if v == -2**31:
        return "(-2147483647 - 1)"
    if dtype == "int64" or not -2**31 <= v < 2**31:
        return f"INT64_C({v})"
    return str(v)


def _index_only(e, loop_vars) -> bool:
    """An expression of loop variables and constants: small, so it can never overflow."""
    if isinstance(e, ir.Const):
        return abs(e.value) < 2**20
    if isinstance(e, ir.Var):
        return e.name in loop_vars
    return isinstance(e, ir.Bin) and e.op in ("+", "-", "*") \
        and _index_only(e.a, loop_vars) and _index_only(e.b, loop_vars)


class Printer:
    """Prints one kernel; `names` maps buffer names to C identifiers (for file-scope consts)."""

    def __init__(self, names: dict | None = None):
        self.names = names or {}
        self.loop_vars = set()

    def _regroups(self, e: ir.Bin) -> bool:
        """Index arithmetic a + (b +- c) and a * (b * c) may drop the parentheses: the value is
        the same in C because loop-variable arithmetic cannot overflow."""
        b = e.b
        return isinstance(b, ir.Bin) and _index_only(e, self.loop_vars) \
            and ((e.op == "+" and b.op in ("+", "-")) or (e.op == "*" and b.op == "*"))

    def expr(self, e) -> tuple:
        """(text, precedence)"""
        t = type(e)
        if t is ir.Const:
            return (c_float(e.value) if e.dtype == "float32" else c_int(e.value, e.dtype)), \
                (_ATOM if e.value >= 0 else _UNARY)
        if t is ir.Var:
            return e.name, _ATOM
        if t is ir.Load:
            return f"{self.names.get(e.buf, e.buf)}[{self.text(e.index)}]", _ATOM
        if t is ir.Ptr:
            off = self.text(e.offset)
            name = self.names.get(e.buf, e.buf)
            text = name if off == "0" else f"&{name}[{off}]"
            return (f"({e.ctype}){text}" if e.ctype else text), _UNARY
        if t is ir.Bin:
            if e.op == "min" and isinstance(e.a, ir.Bin) and e.a.op == "max" and e.dtype == "int32":
                return f"mf_clamp({self.text(e.a.a)}, {self.text(e.a.b)}, {self.text(e.b)})", _ATOM
            if e.op in ("max", "min"):
                # float: NaN-propagating (see mcuforge_rt.h)
                kind = "nan_f32" if e.dtype == "float32" else ("i64" if e.dtype == "int64" else "i32")
                return f"mf_{e.op}_{kind}({self.text(e.a)}, {self.text(e.b)})", _ATOM
            p = _PREC[e.op]
            # left-associative: a right operand of equal precedence needs parentheses
            a = self._wrap(e.a, p if e.op not in _STRICT else _ATOM - 1)
            b = self._wrap(e.b, _ATOM - 1 if e.op in _STRICT else
                           p if self._regroups(e) else p + 1)
            return f"{a} {e.op} {b}", p
        if t is ir.Unary:
            return f"{e.op}{self._wrap(e.a, _UNARY)}", _UNARY
        if t is ir.Cast:
            if (e.a.dtype, e.dtype) in _PROMOTES:
                return self.expr(e.a)
            return f"({C_TYPES[e.dtype]}){self._wrap(e.a, _UNARY)}", _UNARY
        if t is ir.Select:
            return (f"{self._wrap(e.cond, _TERNARY + 1)} ? {self._wrap(e.a, _TERNARY + 1)} : "
                    f"{self._wrap(e.b, _TERNARY)}"), _TERNARY
        if t is ir.Call:
            return f"{e.fn}({', '.join(self.text(a) for a in e.args)})", _ATOM
        raise TypeError(f"cannot print {e!r}")

    def _wrap(self, e, min_prec: int) -> str:
        text, p = self.expr(e)
        return text if p >= min_prec else f"({text})"

    def text(self, e) -> str:
        return self.expr(e)[0]

    def stmts(self, body, indent: int) -> list:
        out = []
        pad = "    " * indent
        for s in body:
            t = type(s)
            if t is ir.Loop:
                end = s.start + s.extent * s.step
                inc = f"++{s.var}" if s.step == 1 else f"{s.var} += {s.step}"
                out.append(f"{pad}for (int32_t {s.var} = {s.start}; {s.var} < {end}; {inc}) {{")
                self.loop_vars.add(s.var)
                out += self.stmts(s.body, indent + 1)
                self.loop_vars.discard(s.var)
                out.append(pad + "}")
            elif t is ir.Store:
                value = s.value
                out.append(f"{pad}{self.names.get(s.buf, s.buf)}[{self.text(s.index)}] = "
                           f"{self.text(value)};")
            elif t is ir.Decl:
                out.append(f"{pad}{C_TYPES[s.dtype]} {s.var} = {self.text(s.init)};")
            elif t is ir.Assign:
                v = s.value
                if isinstance(v, ir.Bin) and v.op in ("+", "-", "*") and v.a == ir.Var(s.var, v.a.dtype):
                    out.append(f"{pad}{s.var} {v.op}= {self.text(v.b)};")
                else:
                    out.append(f"{pad}{s.var} = {self.text(v)};")
            elif t is ir.If:
                out.append(f"{pad}if ({self.text(s.cond)}) {{")
                out += self.stmts(s.then, indent + 1)
                if s.orelse:
                    out.append(pad + "} else {")
                    out += self.stmts(s.orelse, indent + 1)
                out.append(pad + "}")
            elif t is ir.CallStmt:
                out.append(f"{pad}{s.fn}({', '.join(self.text(a) for a in s.args)});")
            elif t is ir.Comment:
                out.append(f"{pad}/* {c_comment(s.text)} */")
            else:
                raise TypeError(f"cannot print {s!r}")
        return out


def kernel_signature(k: ir.Kernel) -> str:
    # No `restrict`: gcc 12.2 -O2 (ipa-cp) drops a kernel with restrict parameters that is
    # called twice with the same constant arena addresses (e.g. two transposes of one input
    # for two branches), leaving its output unwritten; see tests/test_fuzz_graphs.py.
    params = []
    for b in k.params:
        const = "const " if b.kind == "in" else ""
        params.append(f"{const}{C_TYPES[b.dtype]} *{b.name}")
    return f"MF_KERNEL static void {k.name}({', '.join(params) or 'void'})"


def print_kernel(k: ir.Kernel, const_names: dict) -> str:
    """The C function of one kernel; const buffers are referred to by their file-scope names."""
    lines = []
    if k.doc:
        lines.append("/* " + "\n * ".join(map(c_comment, k.doc.splitlines())) + " */")
    lines.append(kernel_signature(k) + " {")
    lines += Printer(const_names).stmts(k.body, 1)
    lines.append("}")
    return "\n".join(lines)


def print_array(name: str, dtype: str, data: np.ndarray, per_line: int = 16) -> str:
    """`static const T name[N] MF_TABLE = {...};` with exact literals; MF_TABLE (mcuforge_rt.h)
    aligns every table to 8 bytes, which the micro-kernels' word and double-word loads (LDRD,
    LDM) of packed int16 and int8 weights need."""
    flat = np.asarray(data).reshape(-1)
    if dtype == "float32":
        items = [c_float(v) for v in flat.astype(np.float32).tolist()]
    else:
        items = [c_int(int(v), dtype) for v in flat.tolist()]
    rows = [", ".join(items[i:i + per_line]) for i in range(0, len(items), per_line)]
    body = ",\n    ".join(rows)
    return f"static const {C_TYPES[dtype]} {name}[{len(items)}] MF_TABLE = {{\n    {body}\n}};"
