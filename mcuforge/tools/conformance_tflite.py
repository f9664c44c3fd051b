"""`mcuforge conformance tflite`: single-operator TFLite models through the whole compiler,
bit-exact against tflite-micro.

The cases come from `mcuforge.tools.tflite_cases` (written with the project's own TFLite writer, so
nothing is downloaded). Each case's random input sets run in sequence through tflite-micro's
interpreter (LiteRT where TFLM lacks the operator) and through mcuforge's C, built with gcc on
the host by the same batch machinery as the ONNX suite; outputs must be equal bit for bit
(a case may state a tolerance, and the report then says so).
"""
from __future__ import annotations

import numpy as np

from . import conformance
from .conformance import Case


def reference(c, model: bytes, inputs: list) -> list:
    """Outputs of the case's reference interpreter, one [invocations, ...] array per output."""
    if c.reference in ("litert", "litert_ref"):
        if c.reset_at:
            raise ValueError("LiteRT cases cannot reset")
        return _litert(model, inputs, c.reference == "litert_ref")
    from . import tflm
    return tflm.run(model, inputs, c.reset_at)


def _litert(model: bytes, inputs: list, reference_kernels: bool = False) -> list:
    from ai_edge_litert.interpreter import Interpreter, OpResolverType
    kind = OpResolverType.BUILTIN_REF if reference_kernels else OpResolverType.AUTO
    it = Interpreter(model_content=model, experimental_op_resolver_type=kind)
    it.allocate_tensors()
    ins, outs = it.get_input_details(), it.get_output_details()
    rows = [[] for _ in outs]
    for k in range(len(inputs[0]) if inputs else 1):
        for d, x in zip(ins, inputs):
            it.set_tensor(d["index"], x[k])
        it.invoke()
        for i, d in enumerate(outs):
            rows[i].append(it.get_tensor(d["index"]).copy())
    return [np.stack(r) for r in rows]


def load_cases(filter: str | None = None) -> list:
    """The registered cases as conformance.Case, references computed; a case whose reference
    cannot run it is a bug in the case and fails loudly here."""
    from mcuforge.frontend.tflite import CONVERTERS
    from .tflite_cases import all_cases, random_inputs
    out = []
    for c in all_cases(filter):
        model = c.model()
        inputs = random_inputs(c)
        try:
            refs = reference(c, model, inputs)
        except Exception as e:  # noqa: BLE001
            raise RuntimeError(f"TFLite conformance case {c.name}: the reference "
                               f"({c.reference}) cannot run it: {e}") from e
        data_sets = [([x[k] for x in inputs], [np.asarray(r[k]) for r in refs])
                     for k in range(c.invocations)]
        ops = tuple(sorted({op.op for sg in c.subgraphs for op in sg.ops}))
        out.append(Case(c.name, "tflite", model, data_sets, 0.0, 0.0, c.op, ops,
                        all(op in CONVERTERS for op in ops), c.reset_at))
    return out


def run_tflite(jobs: int | None = None, filter: str | None = None, progress=None) -> list:
    """Load and run the TFLite cases: the CLI's and the test's entry point."""
    return conformance.run_cases(load_cases(filter), jobs, progress)
