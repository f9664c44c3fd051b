"""Checks of an ONNX model's structure before import, so a malformed file gets an error naming
the tensor or node and the real cause (not a numpy traceback, not "unsupported operator").

check_model(model): initializers whose data disagrees with their dims or type (raw_data size,
negative dims, an int8 value stored as 300), quantization scales that are not positive finite
numbers and zero points outside their type, node inputs nothing produces, cycles. The nodes are
put in topological order when they are not (the spec asks for it; a cycle is an error).
explain_invalid(model): the reason onnx's strict type and shape inference gives for a model it
rejects (a bool tensor into Conv, Gemm on a 4-D input), or None.
"""
from __future__ import annotations

import numpy as np

from mcuforge.ir.errors import ModelError

# element type -> (numpy dtype, the protobuf field its values sit in when not in raw_data)
_STORAGE = {1: (np.float32, "float_data"), 2: (np.uint8, "int32_data"),
            3: (np.int8, "int32_data"), 4: (np.uint16, "int32_data"),
            5: (np.int16, "int32_data"), 6: (np.int32, "int32_data"),
            7: (np.int64, "int64_data"), 9: (np.bool_, "int32_data"),
            10: (np.float16, "int32_data"), 11: (np.float64, "double_data"),
            12: (np.uint32, "uint64_data"), 13: (np.uint64, "uint64_data")}
_RANGED = {2: np.uint8, 3: np.int8, 4: np.uint16, 5: np.int16, 9: np.bool_}
# quantized ops -> positions of their scale operands (their zero points follow each one)
_SCALES = {"QuantizeLinear": (1,), "DequantizeLinear": (1,), "QLinearConv": (1, 4, 6),
           "QLinearMatMul": (1, 4, 6), "QGemm": (1, 4, 7), "QLinearAdd": (1, 4, 6),
           "QLinearMul": (1, 4, 6), "QLinearAveragePool": (1, 3),
           "QLinearGlobalAveragePool": (1, 3), "QLinearSigmoid": (1, 3),
           "QLinearLeakyRelu": (1, 3), "QLinearSoftmax": (1, 3), "QLinearWhere": (2, 5, 7),
           "DynamicQuantizeLinear": ()}


def check_model(model) -> None:
    """Raise ModelError for the first structural defect; may reorder model.graph.node."""
    _check_text(model)
    inits = {}
    for t in model.graph.initializer:
        _check_initializer(t, "initializer")
        inits[t.name] = t
    for n in model.graph.node:  # Constant nodes hold tensors too
        if n.op_type == "Constant":
            for a in n.attribute:
                if a.name == "value" and a.HasField("t"):
                    _check_initializer(a.t, f"Constant node '{n.name or n.output[0]}'")
                    inits.setdefault(n.output[0] if n.output else "", a.t)
    _check_order(model)
    _check_schemas(model)
    _check_quant_operands(model, inits)


def _check_text(model) -> None:
    """Names are text: protobuf hands invalid UTF-8 over as bytes."""
    g = model.graph
    for what, items in (("graph input", g.input), ("graph output", g.output),
                        ("initializer", g.initializer)):
        for k, v in enumerate(items):
            if not isinstance(v.name, str):
                raise ModelError(f"{what} {k}: its name {v.name!r} is not UTF-8 text")
    for k, n in enumerate(g.node):
        fields = [n.name, n.op_type, n.domain, *n.input, *n.output,
                  *(a.name for a in n.attribute)]
        bad = [f for f in fields if not isinstance(f, str)]
        if bad:
            raise ModelError(f"node {k}: the name {bad[0]!r} (node, operator, tensor or "
                             "attribute) is not UTF-8 text")


def _check_schemas(model) -> None:
    """Nodes of the standard domain against the spec: input counts, required inputs present,
    attributes the op defines at the model's opset, their types."""
    import onnx.defs
    opset = max((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")),
                default=1)
    for k, n in enumerate(model.graph.node):
        if n.domain not in ("", "ai.onnx"):
            continue
        try:
            schema = onnx.defs.get_schema(n.op_type, opset, "")
        except Exception:  # noqa: BLE001 - unknown to onnx: the importer says unsupported
            continue
        where = _label(n, k)
        if not schema.min_input <= len(n.input) <= schema.max_input:
            raise ModelError(f"{where}: {len(n.input)} inputs; {n.op_type} takes "
                             f"{schema.min_input} to {schema.max_input}")
        if not schema.min_output <= len(n.output) <= schema.max_output:
            raise ModelError(f"{where}: {len(n.output)} outputs; {n.op_type} gives "
                             f"{schema.min_output} to {schema.max_output}")
        single = onnx.defs.OpSchema.FormalParameterOption.Single
        for i, formal in enumerate(schema.inputs):
            if formal.option == single and i < len(n.input) and not n.input[i]:
                raise ModelError(f"{where}: input {i} ({formal.name}) is required but empty")
        given = {a.name for a in n.attribute}
        for name, spec in schema.attributes.items():
            if spec.required and name not in given:
                raise ModelError(f"{where}: the required attribute '{name}' is missing")
        for a in n.attribute:
            spec = schema.attributes.get(a.name)
            if spec is None:  # onnx's checker and onnxruntime refuse it too
                raise ModelError(f"{where}: {n.op_type} has no attribute '{a.name}' at opset "
                                 f"{opset} (the model's opset); re-export it with the opset "
                                 "that defines it")
            if not a.ref_attr_name and a.type != spec.type:
                raise ModelError(f"{where}: attribute '{a.name}' has type "
                                 f"{_attr_type(a.type)}; {n.op_type} takes "
                                 f"{_attr_type(spec.type)}")


def _attr_type(t) -> str:
    from onnx import AttributeProto
    try:
        return AttributeProto.AttributeType.Name(int(t))
    except ValueError:
        return f"type {int(t)}"


def _check_initializer(t, what: str) -> None:
    where = f"{what} '{t.name}'" if what == "initializer" else what
    if any(d < 0 for d in t.dims):
        raise ModelError(f"{where} has a negative dimension in its dims {list(t.dims)}")
    if t.data_location == 1:  # external data: read elsewhere
        return
    if t.data_type not in _STORAGE:  # a type mcuforge does not compute: still readable?
        from onnx import numpy_helper
        try:
            numpy_helper.to_array(t)
        except Exception as e:  # noqa: BLE001 - onnx's reader says what is wrong
            raise ModelError(f"{where}: its data cannot be read: {e}") from None
        return
    dtype, field = _STORAGE[t.data_type]
    count = int(np.prod(list(t.dims), dtype=np.int64))
    if t.HasField("raw_data"):
        want = count * np.dtype(dtype).itemsize
        if len(t.raw_data) != want:
            raise ModelError(f"{where}: raw_data has {len(t.raw_data)} bytes, but dims "
                             f"{list(t.dims)} of {np.dtype(dtype).name} need {want}")
        return
    values = getattr(t, field)
    if len(values) != count and not (count == 0 and len(values) == 0):
        raise ModelError(f"{where}: {len(values)} values in {field}, but dims "
                         f"{list(t.dims)} need {count}")
    if t.data_type in _RANGED and len(values):
        info = np.iinfo(_RANGED[t.data_type]) if t.data_type != 9 else None
        lo, hi = (0, 1) if info is None else (info.min, info.max)
        bad = [int(v) for v in values if not lo <= v <= hi]
        if bad:
            name = np.dtype(_RANGED[t.data_type]).name
            raise ModelError(f"{where}: value {bad[0]} is outside {name}'s range "
                             f"[{lo}, {hi}]")


def _check_order(model) -> None:
    """Every node input is produced by a node, an initializer or a graph input; no cycles.
    Nodes out of order (but acyclic) are sorted."""
    g = model.graph
    available = {i.name for i in g.input} | {t.name for t in g.initializer} | {""}
    producer = {}
    for k, n in enumerate(g.node):
        for o in n.output:
            if o and (o in producer or o in available - {""}):
                raise ModelError(f"{_label(n, k)}: output '{o}' is produced twice")
            if o:
                producer[o] = k
    for k, n in enumerate(g.node):
        for name in n.input:
            if name not in available and name not in producer:
                raise ModelError(f"{_label(n, k)}: input '{name}' is produced by no node, "
                                 "initializer or graph input")
    for o in g.output:
        if o.name not in available and o.name not in producer:
            raise ModelError(f"graph output '{o.name}' is produced by no node, initializer "
                             "or graph input")
    done, order = set(available), []
    pending = list(range(len(g.node)))
    while pending:
        ready = [k for k in pending if all(i in done for i in g.node[k].input)]
        if not ready:
            raise ModelError("the graph has a cycle: " + _cycle(g, pending, producer))
        for k in ready:
            order.append(k)
            done.update(g.node[k].output)
        pending = [k for k in pending if k not in set(ready)]
    if order != sorted(order):
        nodes = [g.node[k] for k in order]
        copies = []
        for n in nodes:
            c = type(n)()
            c.CopyFrom(n)
            copies.append(c)
        del g.node[:]
        g.node.extend(copies)


def _cycle(g, pending: list, producer: dict) -> str:
    """One cycle among the nodes that can never run, as 'a -> b -> a' (node names)."""
    left = set(pending)
    k, path = pending[0], []
    while k not in path:
        path.append(k)
        k = next(producer[i] for i in g.node[k].input if producer.get(i) in left)
    loop = path[path.index(k):] + [k]
    return " -> ".join(f"'{g.node[j].name or g.node[j].output[0]}' ({g.node[j].op_type})"
                       for j in reversed(loop))


def _label(n, k: int) -> str:
    return f"node {k} ({n.op_type} '{n.name or (n.output[0] if n.output else '')}')"


def _check_quant_operands(model, inits: dict) -> None:
    from onnx import numpy_helper
    for k, n in enumerate(model.graph.node):
        for pos in _SCALES.get(n.op_type, ()):
            if pos >= len(n.input) or n.input[pos] not in inits:
                continue
            name = n.input[pos]
            scale = numpy_helper.to_array(inits[name]).astype(np.float64)
            bad = scale[~(np.isfinite(scale) & (scale > 0))]
            if bad.size:
                raise ModelError(f"{_label(n, k)}: scale '{name}' is {float(bad.flat[0])}; a "
                                 "quantization scale must be a positive finite number")


def explain_invalid(model):
    """onnx's strict inference's reason for rejecting the model (types, ranks), or None."""
    import onnx
    try:
        onnx.shape_inference.infer_shapes(model, check_type=True, strict_mode=True)
    except Exception as e:  # noqa: BLE001 - onnx raises several types; the text is the point
        text = " ".join(str(e).split())
        if "Inference error(s): " in text:  # several: the first is the cause of the rest
            first = text.split("Inference error(s): ", 1)[1]
            text = "(op_type:" + first.split(" (op_type:")[0].split("(op_type:", 1)[-1]
        if "existing" in text:  # "inferred ... differs from existing": a declaration
            return None  # the inference overrides, as the importer does: not the cause
        return text or type(e).__name__
    return None
