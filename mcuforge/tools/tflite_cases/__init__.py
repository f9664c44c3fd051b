"""Single-operator TFLite models for `mcuforge conformance tflite`, one per operator variant.

A family module (`math.py`, `binary.py`, ...) registers a function per operator with
`@cases("OP")`; the function returns `TflCase`s spelled with `single(...)` or, for models of
several operators or subgraphs, with `tflite_flatbuffer`'s descriptions directly. Everything is
deterministic: random inputs come from a generator seeded by the case name.

The reference is tflite-micro's interpreter (LiteRT for operators TFLM lacks; its reference
kernels for the uint8 types TFLM refuses), run on the
case's `invocations` input sets in sequence on one interpreter, as the generated C runs them
(so state carried between invocations is compared too).
"""
from __future__ import annotations

import importlib
import zlib
from dataclasses import dataclass, field
from typing import Callable, Optional

import numpy as np

from mcuforge.frontend.tflite_flatbuffer import TflOp, TflSubgraph, TflTensor, write_model
from mcuforge.ir.graph import Quant

FAMILIES = ("math", "binary", "reduce", "shape", "data", "layers", "int16", "state", "stateful",
            "control", "uint8")
REGISTRY: dict = {}  # op -> [function returning [TflCase]]


@dataclass
class TflCase:
    op: str  # the operator the case tests: the row of the report
    variant: str  # what distinguishes it: types, options ("int8_keep_dims")
    subgraphs: list  # [TflSubgraph], the first is the entry point
    inputs: dict = field(default_factory=dict)  # input name -> fn(rng, shape) -> array
    reference: str = "tflm"  # "tflm" | "litert" | "litert_ref" (LiteRT's reference kernels)
    invocations: int = 3  # input sets, run in sequence
    reset_at: int = 0  # > 0: reset the model (TFLM: interpreter.reset()) before this input set
    note: str = ""

    @property
    def name(self) -> str:
        return f"{self.op.lower()}_{self.variant}" if self.variant else self.op.lower()

    def model(self) -> bytes:
        return write_model(self.subgraphs)

    def input_tensors(self) -> list:
        sg = self.subgraphs[0]
        by_name = {t.name: t for t in sg.tensors}
        return [by_name[n] for n in sg.inputs]


def cases(*ops):
    def register(fn: Callable):
        for op in ops:
            REGISTRY.setdefault(op, []).append(fn)
        return fn
    return register


def all_cases(filter: Optional[str] = None) -> list:
    """Every registered case (sorted by name), or those whose name contains `filter`."""
    for family in FAMILIES:
        try:
            importlib.import_module(f"{__name__}.{family}")
        except ModuleNotFoundError as e:
            if e.name != f"{__name__}.{family}":
                raise
    found, seen = {}, set()
    for op in sorted(REGISTRY):
        for fn in REGISTRY[op]:
            if fn in seen:  # registered for several operators: its cases say which is which
                continue
            seen.add(fn)
            for c in fn():
                if c.name in found:
                    raise ValueError(f"two TFLite conformance cases are named {c.name}")
                found[c.name] = c
    return [found[k] for k in sorted(found) if not filter or filter in k]


# ---- spelling cases ----------------------------------------------------------------------------

def q(scale: float, zero_point: int = 0) -> Quant:
    """Per-tensor quantization (int16 tensors: zero point 0, as TFLite's 16x8 scheme asks)."""
    return Quant((float(np.float32(scale)),), (int(zero_point),))


def tensor(name, shape, dtype, quant=None, data=None, variable=False) -> TflTensor:
    if data is not None:
        data = np.asarray(data).astype(dtype).reshape(shape)
    return TflTensor(name, tuple(shape), dtype, data, quant, variable)


def single(op: str, variant: str, inputs: list, outputs: list, options: Optional[dict] = None,
           gens: Optional[dict] = None, **kw) -> TflCase:
    """A model of one operator: `inputs` in operator order (constants carry data; None for an
    absent optional input), `outputs` likewise; non-constant inputs become model inputs."""
    tensors = [t for t in inputs if t is not None] + list(outputs)
    names = tuple(t.name if t is not None else "" for t in inputs)
    model_inputs = [t.name for t in inputs if t is not None and t.data is None
                    and not t.variable]
    sg = TflSubgraph(tensors, [TflOp(op, names, tuple(t.name for t in outputs), options or {})],
                     model_inputs, [t.name for t in outputs])
    return TflCase(op, variant, [sg], gens or {}, **kw)


def uniform(lo, hi):
    return lambda rng, shape: rng.uniform(lo, hi, shape)


def integers(lo, hi):
    """Integers in [lo, hi]."""
    return lambda rng, shape: rng.integers(lo, hi + 1, shape)


_RANGES = {"int8": (-128, 127), "uint8": (0, 255), "int16": (-32768, 32767),
           "int32": (-100, 100), "int64": (-100, 100)}


def _by_dtype(rng, shape, dtype):
    if dtype == "float32":
        return rng.uniform(-4.0, 4.0, shape)
    if dtype == "bool":
        return rng.random(shape) < 0.5
    lo, hi = _RANGES[dtype]
    return rng.integers(lo, hi + 1, shape)


def _make(c: TflCase, t: TflTensor, rng):
    if t.name in c.inputs:
        return c.inputs[t.name](rng, tuple(t.shape))
    return _by_dtype(rng, tuple(t.shape), t.dtype)


def random_inputs(c: TflCase) -> list:
    """[invocations, *shape] arrays, one per model input, seeded by the case name."""
    rng = np.random.default_rng(zlib.crc32(c.name.encode()))
    out = []
    for t in c.input_tensors():
        rows = [np.asarray(_make(c, t, rng)).astype(t.dtype).reshape(t.shape)
                for _ in range(c.invocations)]
        out.append(np.stack(rows))
    return out
