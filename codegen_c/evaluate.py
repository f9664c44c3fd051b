"""Executable definition of the loop IR: runs a Kernel on numpy arrays in Python.

Slow and exact. Integer arithmetic follows C on a 32-bit-int target and raises where C would
have undefined behaviour (signed overflow, left shift of a negative value, division by zero),
so unit tests of a lowering also prove the generated C is free of that UB for their inputs.
"""
from __future__ import annotations

import numpy as np

from . import loop_ir as ir
from .loop_ir import UndefinedBehaviour  # noqa: F401  (raised here and by the mirrors)

_LIMITS = {"int32": (-2**31, 2**31 - 1), "int64": (-2**63, 2**63 - 1)}




def _intrinsics() -> dict:
    from . import (mathmirror, micro, micro_ew, micro_mve_dw, micro_rv,  # noqa: F401
                   micro_scalar, micro_seq, micro_vec, qmath)  # (they add their mirrors)
    return qmath.INTRINSICS


def run_kernel(kernel: ir.Kernel, arrays: dict) -> None:
    """Run `kernel`; `arrays` maps each parameter buffer name to a flat numpy array (outputs are
    written in place)."""
    env = {}
    bufs = {}
    for b in kernel.buffers:
        if b.kind == "const":
            bufs[b.name] = np.asarray(b.data).reshape(-1)
        elif b.kind == "scratch" and b.name not in arrays:
            # working memory starts as garbage: a kernel must not read what it did not write
            noise = np.random.default_rng(len(kernel.name)).integers(0, 256, b.size * 8, np.uint8)
            bufs[b.name] = noise.view(np.dtype(b.dtype))[:b.size].copy()
        else:
            arr = arrays[b.name]
            if arr.dtype != np.dtype(b.dtype if b.dtype != "bool" else "uint8") or arr.ndim != 1:
                raise TypeError(f"buffer {b.name}: expected flat {b.dtype}, got {arr.dtype}{arr.shape}")
            bufs[b.name] = arr
    _exec(kernel.body, env, bufs, _intrinsics())


def _exec(stmts, env, bufs, fns):
    for s in stmts:
        t = type(s)
        if t is ir.Loop:
            for i in range(s.start, s.start + s.extent * s.step, s.step):
                env[s.var] = i
                _exec(s.body, env, bufs, fns)
            env.pop(s.var, None)
        elif t is ir.Store:
            buf = bufs[s.buf]
            idx = _eval(s.index, env, bufs, fns)
            if not 0 <= idx < buf.size:
                raise IndexError(f"store {s.buf}[{idx}] out of bounds ({buf.size})")
            buf[idx] = _convert(_eval(s.value, env, bufs, fns), buf.dtype.name)
        elif t is ir.Decl:
            env[s.var] = _convert(_eval(s.init, env, bufs, fns), s.dtype)
        elif t is ir.Assign:
            env[s.var] = _eval(s.value, env, bufs, fns)
        elif t is ir.If:
            branch = s.then if _eval(s.cond, env, bufs, fns) else s.orelse
            _exec(branch, env, bufs, fns)
        elif t is ir.CallStmt:
            args = [_arg(a, env, bufs, fns) for a in s.args]
            fns[s.fn](*args)
        elif t is ir.Comment:
            pass
        else:
            raise TypeError(f"unknown statement {s!r}")


def _arg(e, env, bufs, fns):
    if isinstance(e, ir.Ptr):
        return bufs[e.buf][_eval(e.offset, env, bufs, fns):]
    return _eval(e, env, bufs, fns)


def _convert(v, dtype: str):
    """C conversion to dtype: integers wrap (gcc), floats truncate toward zero."""
    if dtype == "float32":
        return np.float32(v)
    if isinstance(v, (float, np.floating)):
        if not np.isfinite(v):
            raise UndefinedBehaviour(f"conversion of {v} to {dtype}")
        v = int(v)  # truncation toward zero, as C
    bits = np.dtype("uint8" if dtype == "bool" else dtype).itemsize * 8
    v = int(v) & ((1 << bits) - 1)
    if dtype not in ("uint8", "bool") and v >= 1 << (bits - 1):
        v -= 1 << bits
    return v


def _eval(e, env, bufs, fns):
    t = type(e)
    if t is ir.Const:
        return np.float32(e.value) if e.dtype == "float32" else e.value
    if t is ir.Var:
        return env[e.name]
    if t is ir.Load:
        buf = bufs[e.buf]
        idx = _eval(e.index, env, bufs, fns)
        if not 0 <= idx < buf.size:
            raise IndexError(f"load {e.buf}[{idx}] out of bounds ({buf.size})")
        v = buf[idx]
        return np.float32(v) if e.dtype == "float32" else int(v)
    if t is ir.Bin:
        return _binop(e, _eval(e.a, env, bufs, fns), _eval(e.b, env, bufs, fns))
    if t is ir.Unary:
        v = _eval(e.a, env, bufs, fns)
        return int(not v) if e.op == "!" else _check(-v, e.dtype)
    if t is ir.Cast:
        return _convert(_eval(e.a, env, bufs, fns), e.dtype)
    if t is ir.Select:
        return _eval(e.a if _eval(e.cond, env, bufs, fns) else e.b, env, bufs, fns)
    if t is ir.Call:
        return fns[e.fn](*[_arg(a, env, bufs, fns) for a in e.args])  # (row pointers too)
    raise TypeError(f"unknown expression {e!r}")


def _check(v, dtype):
    if dtype in _LIMITS:
        lo, hi = _LIMITS[dtype]
        if not lo <= v <= hi:
            raise UndefinedBehaviour(f"{dtype} overflow: {v}")
    return v


def _binop(e, a, b):
    op, dtype = e.op, e.dtype
    if dtype == "float32" and op not in ir.COMPARE_OPS:
        a, b = np.float32(a), np.float32(b)
        if op == "max":  # a NaN operand gives NaN (mf_max_nan_f32)
            return a if (a > b or np.isnan(a)) else b
        if op == "min":
            return a if (a < b or np.isnan(a)) else b
        return np.float32({"+": np.add, "-": np.subtract, "*": np.multiply, "/": np.divide}[op](a, b))
    if op in ("+", "-", "*"):
        return _check({"+": a + b, "-": a - b, "*": a * b}[op], dtype)
    if op in ("/", "%"):
        if b == 0:
            raise UndefinedBehaviour("division by zero")
        q = abs(a) // abs(b) * (1 if (a >= 0) == (b >= 0) else -1)  # truncates, as C
        return _check(q if op == "/" else a - q * b, dtype)
    if op == "<<":
        if a < 0 or not 0 <= b < 32:
            raise UndefinedBehaviour(f"{a} << {b}")
        return _check(a << b, dtype)
    if op == ">>":
        if not 0 <= b < 32:
            raise UndefinedBehaviour(f"{a} >> {b}")
        return a >> b
    return {"&": lambda: a & b, "|": lambda: a | b, "^": lambda: a ^ b,
            "<": lambda: int(a < b), "<=": lambda: int(a <= b), ">": lambda: int(a > b),
            ">=": lambda: int(a >= b), "==": lambda: int(a == b), "!=": lambda: int(a != b),
            "&&": lambda: int(bool(a) and bool(b)), "||": lambda: int(bool(a) or bool(b)),
            "max": lambda: max(a, b), "min": lambda: min(a, b)}[op]()

