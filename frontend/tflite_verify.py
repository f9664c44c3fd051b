"""Bounds checks of a .tflite flatbuffer before the `tflite` package reads it.

The generated readers trust every offset: garbage makes them raise deep inside (TypeError
"bad number ... for type uint32"), read at negative offsets (Python's slices wrap), or loop
over huge counts. `verify_flatbuffer(buf)` walks every table, vector and string the importer
follows (model, operator codes, subgraphs, tensors, quantization, sparsity, operators with their
options tables and the vectors in them, buffers, metadata) and raises FlatbufferError naming
the place of the first offset or length that leaves the file. It reads no values' meaning:
indices, types and shapes are checked where they are used.
"""
from __future__ import annotations

import struct

import tflite


class FlatbufferError(Exception):
    """An offset or a length in the flatbuffer points outside it (past_end: past its end,
    as in a truncated file)."""

    def __init__(self, message, past_end=False):
        super().__init__(message)
        self.past_end = past_end


def _vector_slots(cls) -> tuple:
    """Slots (vtable offsets) of the vector fields of a generated table class, read from its
    `<Field>Length` accessors' constants."""
    slots = []
    for name in dir(cls):
        fn = getattr(cls, name)
        if name.endswith("Length") and callable(fn) and hasattr(fn, "__code__"):
            slots += [c for c in fn.__code__.co_consts if isinstance(c, int) and c >= 4]
    return tuple(sorted(set(slots)))


_OPTIONS = {}  # BuiltinOptions type -> vector slots of its table
for _name, _value in vars(tflite.BuiltinOptions).items():
    if not _name.startswith("_") and hasattr(tflite, _name):
        _OPTIONS[_value] = _vector_slots(getattr(tflite, _name))


class _Walker:
    def __init__(self, buf: bytes):
        self.buf, self.n = buf, len(buf)

    def _u(self, fmt: str, pos: int, what: str) -> int:
        size = struct.calcsize(fmt)
        if not 0 <= pos <= self.n - size:
            raise FlatbufferError(f"{what}: offset {pos} is outside the file ({self.n} bytes)",
                                  pos > self.n - size)
        return struct.unpack_from(fmt, self.buf, pos)[0]

    def table(self, pos: int, what: str):
        """(pos, {slot: absolute field position}) of the table at pos, checked."""
        soff = self._u("<i", pos, what)
        vt = pos - soff
        vt_len = self._u("<H", vt, f"{what} (vtable)")
        tbl_len = self._u("<H", vt + 2, f"{what} (vtable)")
        if vt_len < 4 or vt_len % 2 or vt + vt_len > self.n or pos + tbl_len > self.n:
            raise FlatbufferError(f"{what}: malformed table header")
        fields = {}
        for slot in range(4, vt_len, 2):
            off = self._u("<H", vt + slot, what)
            if off:
                if not 4 <= off < tbl_len:
                    raise FlatbufferError(f"{what}: field at slot {slot} lies outside its table")
                fields[slot] = pos + off
        return pos, fields

    def ref(self, t, slot: int, what: str):
        """Absolute position a uoffset field points to, or None when the field is absent."""
        p = t[1].get(slot)
        if p is None:
            return None
        target = p + self._u("<I", p, what)
        if target >= self.n:
            raise FlatbufferError(f"{what}: offset {target} is outside the file ({self.n} bytes)",
                                  True)
        return target

    def vector(self, t, slot: int, size: int, what: str):
        """(start, count) of a vector field (count 0 when absent), within the file."""
        target = self.ref(t, slot, what)
        if target is None:
            return 0, 0
        count = self._u("<I", target, what)
        if target + 4 + count * size > self.n:
            raise FlatbufferError(f"{what}: {count} elements of {size} bytes run past the end "
                                  f"of the file ({self.n} bytes)", True)
        return target + 4, count

    def tables(self, t, slot: int, what: str) -> list:
        start, count = self.vector(t, slot, 4, what)
        out = []
        for k in range(count):
            p = start + 4 * k
            out.append(self.table(p + self._u("<I", p, what), f"{what} {k}"))
        return out

    def optional_table(self, t, slot: int, what: str):
        target = self.ref(t, slot, what)
        return None if target is None else self.table(target, what)


def verify_flatbuffer(buf: bytes) -> None:
    w = _Walker(buf)
    model = w.table(w._u("<I", 0, "root"), "model")
    for k, code in enumerate(w.tables(model, 6, "operator code")):
        w.vector(code, 6, 1, f"operator code {k} custom code")
    w.vector(model, 10, 1, "description")
    for k, b in enumerate(w.tables(model, 12, "buffer")):
        w.vector(b, 4, 1, f"buffer {k} data")
    w.vector(model, 14, 4, "metadata buffers")
    for k, m in enumerate(w.tables(model, 16, "metadata")):
        w.vector(m, 4, 1, f"metadata {k} name")
    w.tables(model, 18, "signature def")
    for s, sg in enumerate(w.tables(model, 8, "subgraph")):
        where = f"subgraph {s}"
        w.vector(sg, 6, 4, f"{where} inputs")
        w.vector(sg, 8, 4, f"{where} outputs")
        w.vector(sg, 12, 1, f"{where} name")
        for i, t in enumerate(w.tables(sg, 4, f"{where} tensor")):
            tw = f"{where} tensor {i}"
            for slot, size, what in ((4, 4, "shape"), (10, 1, "name"),
                                     (18, 4, "shape signature")):
                w.vector(t, slot, size, f"{tw} {what}")
            q = w.optional_table(t, 12, f"{tw} quantization")
            if q is not None:
                for slot, size, what in ((4, 4, "min"), (6, 4, "max"), (8, 4, "scale"),
                                         (10, 8, "zero point")):
                    w.vector(q, slot, size, f"{tw} quantization {what}")
                w.optional_table(q, 14, f"{tw} quantization details")
            sp = w.optional_table(t, 16, f"{tw} sparsity")
            if sp is not None:
                w.vector(sp, 4, 4, f"{tw} sparsity traversal order")
                w.vector(sp, 6, 4, f"{tw} sparsity block map")
                w.tables(sp, 8, f"{tw} sparsity dimension")
        for i, op in enumerate(w.tables(sg, 10, f"{where} operator")):
            ow = f"{where} operator {i}"
            for slot, size, what in ((6, 4, "inputs"), (8, 4, "outputs"),
                                     (14, 1, "custom options"), (18, 1, "mutating inputs"),
                                     (20, 4, "intermediates")):
                w.vector(op, slot, size, f"{ow} {what}")
            opts = w.optional_table(op, 12, f"{ow} options")
            if opts is not None:
                kind = struct.unpack_from("<B", buf, op[1][10])[0] if 10 in op[1] else 0
                for slot in _OPTIONS.get(kind, ()):
                    w.vector(opts, slot, 1, f"{ow} options")  # (bools are 1 byte)
            w.optional_table(op, 28, f"{ow} options 2")
