"""ONNX -> graph IR. Symbolic input dimensions are fixed first (`input_shapes`, which may set
only those, else batch 1); then every node's output shapes come from its own shape function
(frontend/onnx_shapes.py), which also checks its operands and the shapes the model declares;
onnx.shape_inference fills in only what those leave open. Every tensor must end up static.

Operators are converter functions registered with `@onnx_op("Conv", since=11)` (the registry and
the converter API: frontend/onnx_registry.py, re-exported here; the converters: frontend/onnx_ops.py
and the modules it imports, frontend/onnx_quant_lut.py, loaded by `_load_converters`). A node whose
inputs are all constant is folded at import by onnx's reference evaluator, so shape arithmetic
(Shape, Gather, Concat, ...) never becomes code.
"""
from __future__ import annotations

import inspect
import warnings
from pathlib import Path

import numpy as np

from mcuforge.ir.errors import ModelError, ModelNote, UnsupportedOpError
from mcuforge.ir.graph import Graph, GraphError, Tensor, verify

from .onnx_registry import (CONVERTERS, Builder, OnnxContext, Unsupported, _np_dtype_name,
                            converter, from_nhwc, onnx_op, to_nhwc)
from .onnx_shapes import In, ShapeError, output_elem, output_shapes

# the converter API, for callers that import it from here (tests, mcuforge/tools/conformance.py)
__all__ = ["load_onnx", "CONVERTERS", "Builder", "OnnxContext", "Unsupported", "converter",
           "from_nhwc", "onnx_op", "to_nhwc"]

_DTYPES = {1: "float32", 2: "uint8", 3: "int8", 5: "int16", 6: "int32", 7: "int64", 9: "bool"}
_ELEM = {v: k for k, v in _DTYPES.items()}


def _fix_dims(model, input_shapes: dict, notes: list):
    """Give every graph input a static shape: --input-shape values, else batch 1."""
    from .input_shapes import check_input_shapes
    inits = {i.name: list(i.dims) for i in model.graph.initializer}
    init_names = set(inits)
    # an input with an initializer is that constant: its shape, if given, must be the same
    check_input_shapes({i.name: inits[i.name] if i.name in inits else
                        [d.dim_value if d.dim_value > 0 else None
                         for d in i.type.tensor_type.shape.dim]
                        if i.type.tensor_type.HasField("shape") else None
                        for i in model.graph.input}, input_shapes)
    for inp in model.graph.input:
        if inp.name in init_names:
            continue
        dims = inp.type.tensor_type.shape.dim
        if inp.name in input_shapes:
            shape = input_shapes[inp.name]
            if not dims:
                for _ in shape:
                    dims.add()
            for d, v in zip(dims, shape):
                d.ClearField("dim_param")
                d.dim_value = int(v)
            continue
        for k, d in enumerate(dims):
            if d.dim_value <= 0:
                if k == 0:
                    notes.append(f"input '{inp.name}': dimension 0 "
                                 f"('{d.dim_param or '?'}') set to 1 (batch)")
                    d.ClearField("dim_param")
                    d.dim_value = 1
                else:
                    raise ModelError(
                        f"input '{inp.name}' has a dynamic dimension {k} "
                        f"('{d.dim_param or '?'}'): give it with --input-shape "
                        f"{inp.name}={','.join(str(x.dim_value or 1) for x in dims)}")


def _value_infos(model) -> dict:
    out = {}
    g = model.graph
    for vi in list(g.input) + list(g.output) + list(g.value_info):
        tt = vi.type.tensor_type
        if not tt.HasField("shape"):
            continue
        dims = [d.dim_value if d.dim_value > 0 else None for d in tt.shape.dim]
        out[vi.name] = (dims, tt.elem_type)
    return out


def _tensor_of(name: str, info) -> Tensor:
    dims, elem = info
    if elem not in _DTYPES:
        raise Unsupported(f"tensor '{name}' has element type {elem}")
    if any(d is None for d in dims):
        raise ModelError(f"the shape of tensor '{name}' stays unknown ({dims}) after shape "
                         "inference: give the inputs' shapes with --input-shape")
    return Tensor(name, tuple(int(d) for d in dims), _DTYPES[elem])


def _parse(source):
    import onnx
    try:
        if isinstance(source, (bytes, bytearray)):
            return onnx.load_model_from_string(bytes(source))
        if hasattr(source, "graph"):
            m = onnx.ModelProto()
            m.CopyFrom(source)
            return m
        return onnx.load(str(source))
    except FileNotFoundError:
        raise ModelError(f"model file not found: {source}") from None
    except Exception as e:
        raise ModelError(f"not a valid ONNX model: {e}") from e


def load_onnx(source, input_shapes: dict | None = None, name: str | None = None,
              notes: list | None = None) -> Graph:
    """Read an ONNX model (path, bytes or ModelProto) into a verified Graph."""
    import onnx
    from onnx import numpy_helper
    model = _parse(source)
    from .onnx_check import check_model, explain_invalid
    check_model(model)  # malformed data and structure, named before anything reads them
    original = model
    declared = _value_infos(model)  # what the file says, before any inference adds to it
    from .onnx_quant import fuse_qdq
    model = fuse_qdq(model)  # before folding: int8 weights must stay int8
    notes = notes if notes is not None else []
    if len(model.graph.node) == 0 and not model.graph.output:
        raise ModelError("not a valid ONNX model: it has no graph")
    opset = max((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")),
                default=1)
    _load_converters()
    foreign = [(i, n) for i, n in enumerate(model.graph.node)
               if n.domain not in ("", "ai.onnx", "com.microsoft")]
    if foreign:
        raise UnsupportedOpError(_unsupported_message(foreign, []))
    _fix_dims(model, input_shapes or {}, notes)
    for note in notes:
        warnings.warn(note, ModelNote, stacklevel=2)
    model = _prefold(model, opset)
    infos = _value_infos(model)
    b = Builder(opset)
    consts = {}
    for init in model.graph.initializer:
        consts[init.name] = numpy_helper.to_array(init)
    problems, missing = [], []
    for i, node in enumerate(model.graph.node):
        try:
            if not _convert(b, node, infos, consts, declared):
                missing.append((i, node))
        except Unsupported as e:
            problems.append((i, node, str(e)))
    if problems or missing:
        invalid = explain_invalid(original)  # an invalid model is no unsupported one
        if invalid:
            raise ModelError(f"invalid ONNX model: {invalid}")
        raise UnsupportedOpError(_unsupported_message(missing, problems))
    init_names = set(consts)
    inputs = [i.name for i in model.graph.input if i.name not in init_names]
    for n in inputs:
        b.add_tensor(_tensor_of(n, infos[n]))
    outputs = [o.name for o in model.graph.output]
    for o in outputs:
        if o in consts and o not in b.tensors:  # folded entirely: copy the value out
            src = _const_tensor(b, f"{o}_value", consts[o])
            b.emit("broadcast_to", [src], [b.add_tensor(Tensor(o, src.shape, src.dtype))], o)
    g = Graph(b.tensors, b.nodes, inputs, outputs,
              name or (Path(str(source)).stem if isinstance(source, (str, Path)) else "model"))
    used = {t for n in g.nodes for t in (*n.inputs, *n.outputs) if t} | set(inputs) | set(outputs)
    g.tensors = {k: v for k, v in g.tensors.items() if k in used}
    try:
        return verify(g)
    except GraphError as e:
        raise ModelError(f"invalid ONNX model after import: {e}") from e


def _infer(model):
    import onnx
    try:
        return onnx.shape_inference.infer_shapes(model, data_prop=True)
    except Exception as e:
        raise ModelError(f"ONNX shape inference failed: {e}") from e


def _prefold(model, opset: int, rounds: int = 16):
    """Fold every node whose value is known at compile time into an initializer, then infer
    shapes again: shapes computed by Shape/Gather/Concat chains (exported PyTorch models,
    expanded function bodies) become static. Repeats until nothing more folds."""
    from onnx import numpy_helper
    for _ in range(rounds):
        model = _infer(model)
        infos = _value_infos(model)
        consts = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
        kept, folded = [], False
        for node in model.graph.node:
            values = _fold_node(node, infos, consts, opset)
            if values is None or any(np.asarray(v).dtype == object for v in values):
                kept.append(node)
                continue
            folded = True
            for name, v in zip(node.output, values):
                if name:
                    consts[name] = np.asarray(v)
                    model.graph.initializer.append(numpy_helper.from_array(np.asarray(v), name))
        if not folded:
            return model
        del model.graph.node[:]
        model.graph.node.extend(kept)
        del model.graph.value_info[:]  # stale: inferred again from the smaller graph
        if any(n.domain == "com.microsoft" for n in model.graph.node):
            from .onnx_quant import record_shapes
            record_shapes(model)  # shapes onnx's inference cannot give
    return _infer(model)


def _fold_node(node, infos: dict, consts: dict, opset: int):
    """The node's output values when they are known at compile time, else None."""
    ins = list(node.input)
    if node.op_type in _NO_FOLD or any(a.type == 5 for a in node.attribute):  # graphs
        return None
    if all((not n) or n in consts for n in ins):
        return _fold(node, [consts.get(n) if n else None for n in ins], opset)
    if node.op_type in _SHAPE_OPS and ins and ins[0] in infos:
        dims, elem = infos[ins[0]]
        if all(d is not None for d in dims) and elem in _DTYPES:
            # a static shape is a constant: evaluate on a stand-in of the right shape
            return _fold(node, [np.zeros(dims, _DTYPES[elem])], opset)
    return None


def _const_tensor(b: Builder, name: str, value) -> Tensor:
    arr = np.asarray(value)
    dtype = _np_dtype_name(arr.dtype)
    if dtype not in _DTYPES.values():
        raise Unsupported(f"constant '{name}' has element type {dtype}")
    return b.add_tensor(Tensor(name, tuple(arr.shape), dtype, arr))


def _static_shape(b: Builder, infos: dict, consts: dict, name: str):
    """(shape, dtype) of a tensor when known before it is computed, else None."""
    if name in b.tensors:
        return b.tensors[name].shape, np.dtype(b.tensors[name].dtype)
    if name in consts:
        return np.shape(consts[name]), np.asarray(consts[name]).dtype
    if name in infos and all(d is not None for d in infos[name][0]) \
            and infos[name][1] in _DTYPES:
        return tuple(infos[name][0]), np.dtype(_DTYPES[infos[name][1]])
    return None


def _infer_outputs(b: Builder, node, infos: dict, consts: dict, declared: dict) -> None:
    """Compute the node's output shapes from its inputs (frontend/onnx_shapes.py) into `infos`,
    replacing onnx's inference; refuse operands that do not fit and outputs declared otherwise
    in the model."""
    ins = []
    for n in node.input:
        known = _static_shape(b, infos, consts, n) if n else None
        ins.append(None if not n else In(known and known[0], consts.get(n)))
    where = f"node '{node.name or node.output[0]}' ({node.op_type})"
    try:
        shapes = output_shapes(node.op_type, ins, _attributes(node), b.opset, len(node.output))
    except ShapeError as e:
        raise ModelError(f"{where}: {e}") from None
    elems = [(infos.get(n) or (None, None))[1] if n else None for n in node.input]
    for k, n in enumerate(node.input):
        if n in b.tensors:
            elems[k] = _ELEM[b.tensors[n].dtype]
        elif n in consts:
            elems[k] = _ELEM.get(_np_dtype_name(np.asarray(consts[n]).dtype))
    for k, (name, shape) in enumerate(zip(node.output, shapes or [])):
        if not name or shape is None:
            continue
        dims = (declared.get(name) or (None,))[0]
        if dims is not None and (len(dims) != len(shape) or any(
                d is not None and d != s for d, s in zip(dims, shape))):
            raise ModelError(f"{where}: output '{name}' is declared with shape "
                             f"{[d if d is not None else '?' for d in dims]} but its inputs "
                             f"give {list(shape)}")
        elem = (infos.get(name) or (None, 0))[1] or (
            output_elem(node.op_type, elems, _attributes(node)) if k == 0 else None)
        if elem:
            infos[name] = (list(shape), elem)


def _convert(b: Builder, node, infos: dict, consts: dict, declared: dict) -> bool:
    """Fold the node if its result is known at compile time, else call its converter.
    False when there is no converter for the node."""
    ins = [n for n in node.input]
    values = None
    if all((not n) or n in consts for n in ins) and node.op_type not in _NO_FOLD:
        values = _fold(node, [consts.get(n) if n else None for n in ins], b.opset)
    elif node.op_type in _SHAPE_OPS and ins and _static_shape(b, infos, consts, ins[0]):
        # a static shape is a constant: evaluate on a stand-in of the right shape
        shape, dtype = _static_shape(b, infos, consts, ins[0])
        values = _fold(node, [np.zeros(shape, dtype)], b.opset)
    if values is not None:
        for name, v in zip(node.output, values):
            consts[name] = v
        return True
    fn = converter(node.op_type, b.opset)
    if fn is None:
        return False
    for n in ins:
        if n and n not in b.tensors:
            if n in consts:
                _const_tensor(b, n, consts[n])
            elif n in infos:
                b.add_tensor(_tensor_of(n, infos[n]))
            else:
                raise Unsupported(f"no shape known for input '{n}'")
    _infer_outputs(b, node, infos, consts, declared)
    outs = []
    for n in node.output:
        if not n:
            outs.append(None)
            continue
        if n not in infos:
            raise Unsupported(f"no shape known for output '{n}'")
        outs.append(b.add_tensor(_tensor_of(n, infos[n])))
    ctx = OnnxContext(b, node, outs)
    args = [b.tensors[n] if n else None for n in ins]
    kwargs = _attributes(node)
    params = inspect.signature(fn).parameters
    unknown = [k for k in kwargs if k not in params]
    if unknown:
        raise Unsupported(f"attribute(s) {unknown} not supported")
    fn(ctx, *args, **kwargs)
    return True


_SHAPE_OPS = frozenset({"Shape", "Size"})
_NO_FOLD = frozenset({"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike",
                      "Multinomial", "Bernoulli"})


def _fold(node, values: list, opset: int):
    """Evaluate one node on constant inputs with onnx's reference implementation."""
    import onnx
    from onnx import helper
    from onnx.reference import ReferenceEvaluator
    inputs = [helper.make_tensor_value_info(f"i{k}", onnx.TensorProto.UNDEFINED, None)
              for k in range(len(values))]
    n = onnx.NodeProto()
    n.CopyFrom(node)
    if n.op_type in ("QuantizeLinear", "DequantizeLinear"):
        # onnx's evaluator has these from opset 19 only; the newer ops compute the older ones'
        # cases alike (and com.microsoft's, 16-bit types included)
        n.domain, opset = "", max(opset, 21)
    del n.input[:]
    n.input.extend([f"i{k}" if v is not None else "" for k, v in enumerate(values)])
    del n.output[:]
    n.output.extend([f"o{k}" for k in range(len(node.output))])
    outs = [helper.make_tensor_value_info(f"o{k}", onnx.TensorProto.UNDEFINED, None)
            for k in range(len(node.output))]
    g = helper.make_graph([n], "fold", inputs, outs)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ev = ReferenceEvaluator(helper.make_model(
                g, opset_imports=[helper.make_opsetid("", opset)]))
            res = ev.run(None, {f"i{k}": v for k, v in enumerate(values) if v is not None})
    except Exception:
        return None
    return [np.asarray(r) for r in res]


def _attributes(node) -> dict:
    from onnx import helper
    out = {}
    for a in node.attribute:
        v = helper.get_attribute_value(a)
        if isinstance(v, bytes):
            v = v.decode()
        elif isinstance(v, list) and v and isinstance(v[0], bytes):
            v = [x.decode() for x in v]
        out[a.name] = v
    return out


def _unsupported_message(missing: list, problems: list) -> str:
    lines = ["the model uses operators mcuforge cannot compile:"]
    for i, n in missing:
        lines.append(f"  node {i}: {n.op_type}{'' if n.domain in ('', 'ai.onnx') else f' (domain {n.domain})'}"
                     f" -> '{n.output[0] if n.output else ''}'")
    for i, n, why in problems:
        lines.append(f"  node {i}: {n.op_type} -> '{n.output[0] if n.output else ''}': {why}")
    if len(lines) == 2 and not missing:  # one variant refused: one line, no operator list
        return f"cannot compile {lines[1].strip()}"
    if missing:
        lines.append("supported ONNX operators: " + ", ".join(sorted(CONVERTERS)))
    return "\n".join(lines)


def _load_converters():
    from . import onnx_ops  # noqa: F401  (registers converters)
    from . import onnx_quant_lut  # noqa: F401  (registers converters)
