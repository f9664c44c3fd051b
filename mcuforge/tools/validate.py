"""`mcuforge validate`: the compiled model against a reference runtime on the user's own data.

The compiled model is mcuforge's C (the host, or an emulated board through the runner); the
reference is the runtime the model was written for:
  - .onnx: onnxruntime;
  - .tflite with float inputs and outputs: LiteRT;
  - .tflite with integer inputs or outputs (int8 models): tflite-micro;
  - a float model quantized by mcuforge (`quantize="int8"` with calibration data, the compile
    path's own quantize_for_compile): the float model in its runtime, against the int8 C whose
    outputs are dequantized at the edges.
Per output: max / mean absolute error, SQNR (dB), whether it is bit-exact (integer outputs),
top-1 agreement for classifiers and, with labels, both sides' top-1 accuracy. The figures
helpers are bench_quant's.

Per layer (`per_layer=True`, on the host): every node output the reference exposes too is
compared, in the order the model computes them, and the first that diverges is reported with
its node, tensor, error and the first input that triggers it. Integer tensors diverge on any
differing value; float ones when max|C - reference| exceeds `tolerance` times the tensor's
largest reference magnitude. The reference's intermediates: tflite-micro with
kPreserveAllTensors for int8 TFLite (for a model quantized by mcuforge, the int8 model it
compiles, written as TFLite, so the check is bit-exact too), LiteRT with
experimental_preserve_all_tensors for float TFLite, onnxruntime with the intermediate tensors
added as graph outputs for ONNX. mcuforge's side is the graph with those tensors made outputs
(what calibration does, optimizer/calibrate.record), built as C: a fusion that hides a tensor
may be undone there, so the per-layer build can differ from the real one in such a layer.
With a model quantized by mcuforge, each int8 layer's SQNR against the float model's tensor of
the same name is reported too (where quantization loses precision).
"""
from __future__ import annotations

import os
import tempfile
from pathlib import Path

import numpy as np

from mcuforge.ir.errors import McuforgeError

from .bench_quant import accuracy, sqnr_db, top1_agreement

FLOAT_TOLERANCE = 1e-4  # per-layer: relative error of a float tensor that counts as divergent


# ---------------------------------------------------------------------------------------------
# The user's data


def _read_npz(path) -> dict:
    from ..arrays import load_arrays
    data = load_arrays(str(path))
    return data if isinstance(data, dict) else {"arr_0": data}


def load_inputs(path, graph, limit: int | None = None) -> tuple:
    """([N, *input shape] array per model input, labels found in the .npz or None). A
    one-input model takes the array named like its input, arr_0, or the only array beside
    `labels`; the first axis is the samples (a model batch dimension of 1 may be left out)."""
    data = _read_npz(path)
    labels = data.pop("labels", None) if "labels" not in graph.inputs else None
    arrays = []
    for i, name in enumerate(graph.inputs):
        if name in data:
            key = name
        elif f"arr_{i}" in data:
            key = f"arr_{i}"
        elif len(graph.inputs) == 1 and len(data) == 1:
            key = next(iter(data))
        else:
            raise McuforgeError(f"{path}: no array for input '{name}': name the arrays after "
                                f"the model's inputs {list(graph.inputs)} (or arr_0, arr_1, "
                                f"...); found {sorted(data)}")
        arrays.append(_as_batch(data[key], graph.tensors[name], key))
    n = {len(a) for a in arrays}
    if len(n) > 1:
        raise McuforgeError(f"{path}: the inputs hold different numbers of samples "
                            f"({sorted(n)}); the first axis is the sample")
    if labels is not None and len(labels) != len(arrays[0]):
        raise McuforgeError(f"{path}: {len(labels)} labels for {len(arrays[0])} samples")
    if limit is not None:
        arrays = [a[:limit] for a in arrays]
        labels = None if labels is None else np.asarray(labels)[:limit]
    return arrays, labels


def _as_batch(a: np.ndarray, t, key: str) -> np.ndarray:
    shape = tuple(t.shape)
    want = f"(N, {', '.join(map(str, shape))})"
    if shape[:1] == (1,):
        want += f" or (N, {', '.join(map(str, shape[1:]))})"
    if tuple(a.shape[1:]) == shape:
        pass
    elif shape[:1] == (1,) and tuple(a.shape[1:]) == shape[1:]:
        a = a.reshape(len(a), *shape)
    else:
        raise McuforgeError(f"input '{t.name}' (array '{key}'): expected shape {want}, the "
                            f"first axis the samples; got {a.shape}")
    dtype = np.dtype(t.dtype)
    if a.dtype == dtype:
        return np.ascontiguousarray(a)
    if dtype.kind == "f" and a.dtype.kind in "uif":  # e.g. uint8 pixels for a float model
        return np.ascontiguousarray(a.astype(dtype))
    hint = ""
    if t.quant is not None:
        s, zp = float(t.quant.scale[0]), int(t.quant.zero_point[0])
        hint = f": quantize it as round(x / {s!r}) + {zp}"
    raise McuforgeError(f"input '{t.name}' (array '{key}'): the model takes {dtype.name}, got "
                        f"{a.dtype.name}{hint}")


def load_labels(path, n: int, limited: bool):
    """The class index of each of the `n` samples from a .npy (or a .npz's `labels`); with
    --limit the file may hold more."""
    try:
        y = np.load(path, allow_pickle=False)
    except (OSError, ValueError) as e:
        raise McuforgeError(f"cannot read labels from {path}: {e}") from None
    if isinstance(y, np.lib.npyio.NpzFile):
        with y:
            y = y["labels"] if "labels" in y.files else y[y.files[0]]
    y = np.asarray(y).reshape(-1)
    if y.dtype.kind not in "ui":
        raise McuforgeError(f"labels in {path} must be integers (class indices), got "
                            f"{y.dtype.name}")
    if len(y) < n or (len(y) != n and not limited):
        raise McuforgeError(f"{path} holds {len(y)} labels for {n} samples")
    return y[:n]


# ---------------------------------------------------------------------------------------------
# Reference runtimes


def is_int8_model(graph) -> bool:
    return any(graph.tensors[t].dtype in ("int8", "uint8", "int16")
               for t in (*graph.inputs, *graph.outputs))


def reference_name(model: Path, graph, quantize) -> str:
    if model.suffix == ".onnx":
        return "onnxruntime"
    return "tflite-micro" if is_int8_model(graph) and not quantize else "LiteRT"


def _rows(arrays: list):
    for i in range(len(arrays[0])):
        yield i, [a[i] for a in arrays]


def _tick(progress, what: str, i: int, n: int) -> None:
    if progress is not None and (i + 1 == n or (i + 1) % max(1, n // 10) == 0):
        print(f"validate: {what} {i + 1}/{n}", file=progress, flush=True)


def run_reference(model: Path, graph, arrays: list, kind: str, progress=None,
                  tensors: dict | None = None) -> list:
    """The reference's outputs, one [N, ...] array per model output. `tensors`, a dict
    {tensor name: None}, gets each tensor's values over the samples ([N, ...])."""
    want = dict(tensors or {})
    if kind == "onnxruntime":
        outs, inter = _onnxruntime(model, graph, arrays, want, progress)
    elif kind == "LiteRT":
        outs, inter = _litert(model.read_bytes(), arrays, want, progress)
    else:
        outs, inter = _tflm(model.read_bytes(), arrays, want, progress)
    if tensors is not None:
        tensors.clear()
        tensors.update(inter)
    return outs


def _tflite_names(data: bytes) -> tuple:
    """(mcuforge's name of each tensor of subgraph 0, operator output tensor indices): the
    frontend's own naming, so names match the graph's."""
    import tflite
    from mcuforge.frontend.tflite import _decode, unique_names
    sg = tflite.Model.GetRootAsModel(data, 0).Subgraphs(0)
    names = unique_names([_decode(sg.Tensors(i).Name()) for i in range(sg.TensorsLength())])
    produced = [sg.Operators(k).Outputs(j) for k in range(sg.OperatorsLength())
                for j in range(sg.Operators(k).OutputsLength())]
    return names, produced


def model_nodes(src: Path) -> dict:
    """{tensor name (as the graph names it): {"index", "op", "name"}} of the node of the model
    file that produces it: what the user finds in Netron or the framework."""
    if src.suffix == ".onnx":
        import onnx
        m = onnx.load(str(src), load_external_data=False)
        return {t: {"index": k, "op": n.op_type, "name": n.name, "tensor": t}
                for k, n in enumerate(m.graph.node) for t in n.output if t}
    import tflite
    data = src.read_bytes()
    model = tflite.Model.GetRootAsModel(data, 0)
    sg = model.Subgraphs(0)
    from mcuforge.frontend.tflite import _decode
    names, _ = _tflite_names(data)
    found = {}
    for k in range(sg.OperatorsLength()):
        o = sg.Operators(k)
        c = model.OperatorCodes(o.OpcodeIndex())
        code = max(c.BuiltinCode(), c.DeprecatedBuiltinCode())
        try:
            op = tflite.opcode2name(code)
        except Exception:  # a code newer than the tflite package
            op = str(code)
        for j in range(o.OutputsLength()):  # the file's own tensor name, not made unique
            t = o.Outputs(j)
            found[names[t]] = {"index": k, "op": op, "name": "",
                               "tensor": f"{_decode(sg.Tensors(t).Name())} (tensor {t})"}
    return found


def _stack(d: dict) -> dict:
    return {k: np.stack(v) for k, v in d.items()}


def _litert(data: bytes, arrays: list, want: dict, progress) -> tuple:
    from ai_edge_litert.interpreter import Interpreter
    import warnings
    with warnings.catch_warnings():  # its "for debugging only" warning: that is the use here
        warnings.simplefilter("ignore", UserWarning)
        it = Interpreter(model_content=data, experimental_preserve_all_tensors=bool(want))
    it.allocate_tensors()
    names, produced = _tflite_names(data)
    index = {names[i]: i for i in produced if names[i] in want}
    ins, outs = it.get_input_details(), it.get_output_details()
    res, inter = [[] for _ in outs], {k: [] for k in index}
    for i, row in _rows(arrays):
        for d, x in zip(ins, row):
            it.set_tensor(d["index"], x.reshape(d["shape"]))
        it.invoke()
        for k, d in enumerate(outs):
            res[k].append(it.get_tensor(d["index"]).copy())
        for name, t in index.items():
            inter[name].append(it.get_tensor(t).copy())
        _tick(progress, "LiteRT", i, len(arrays[0]))
    return [np.stack(r) for r in res], _stack(inter)


def _tflm(data: bytes, arrays: list, want: dict, progress) -> tuple:
    from . import tflm
    if not tflm.available():
        raise McuforgeError("tflite-micro is not installed (pip install tflite-micro): it is "
                            "the reference for int8 TFLite models")
    from tflite_micro.python.tflite_micro import runtime
    it = runtime.Interpreter.from_bytes(
        data, intrepreter_config=runtime.InterpreterConfig.kPreserveAllTensors)
    names, produced = _tflite_names(data)
    index = {names[i]: i for i in produced if names[i] in want}
    n_out = tflm._io_counts(data)[1]
    res, inter = [[] for _ in range(n_out)], {k: [] for k in index}
    for i, row in _rows(arrays):
        for k, x in enumerate(row):
            it.set_input(x.reshape(it.get_input_details(k)["shape"]), k)
        it.invoke()
        for k in range(n_out):
            res[k].append(np.array(it.get_output(k)))
        for name, t in index.items():
            d = it.GetTensor(t, 0)
            inter[name].append(np.array(d["tensor_data"]).reshape(d["shape"]))
        _tick(progress, "tflite-micro", i, len(arrays[0]))
    return [np.stack(r) for r in res], _stack(inter)


def _onnxruntime(model: Path, graph, arrays: list, want: dict, progress) -> tuple:
    import onnx
    import onnxruntime as ort
    m = onnx.load(str(model))
    outputs = [o.name for o in m.graph.output]
    extra = []
    if want:
        inferred = onnx.shape_inference.infer_shapes(m)
        known = {v.name: v for v in (*inferred.graph.value_info, *inferred.graph.output)}
        for n in m.graph.node:
            for t in n.output:
                if t in want and t not in outputs and t not in extra:
                    extra.append(t)
                    m.graph.output.append(known[t] if t in known
                                          else onnx.helper.make_empty_tensor_value_info(t))
    sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    feeds = [d.name for d in sess.get_inputs()]
    seen = [*outputs, *extra]  # a wanted graph output is an intermediate's peer too
    res, inter = [[] for _ in outputs], {t: [] for t in seen if t in want}
    for i, row in _rows(arrays):
        got = sess.run(None, {name: x for name, x in zip(feeds, row)})
        for k in range(len(outputs)):
            res[k].append(got[k])
        for k, t in enumerate(seen):
            if t in inter:
                inter[t].append(got[k])
        _tick(progress, "onnxruntime", i, len(arrays[0]))
    return [np.stack(r) for r in res], _stack(inter)


# ---------------------------------------------------------------------------------------------
# mcuforge's side


def _dequantize(a: np.ndarray, t) -> np.ndarray:
    if t.quant is None or np.dtype(t.dtype).kind == "f":
        return np.asarray(a, np.float64)
    # activations are quantized per tensor (per-channel parameters are for weights)
    s, zp = float(t.quant.scale[0]), float(t.quant.zero_point[0])
    return (np.asarray(a, np.float64) - zp) * s


def compare_output(name: str, ref: np.ndarray, test: np.ndarray, t, in_size: int,
                   labels=None) -> dict:
    """The figures of one output (see the module docstring). Integer outputs are compared
    dequantized with the output's parameters; bit_exact says whether every value is equal."""
    ref = np.asarray(ref).reshape(len(ref), -1)
    test = np.asarray(test).reshape(ref.shape)
    bit_exact = None
    if ref.dtype.kind in "ui" and test.dtype.kind in "ui":
        bit_exact = bool(np.array_equal(ref, test))
    r, c = _dequantize(ref, t), _dequantize(test, t)
    err = np.abs(r - c)
    classes = 1 < ref.shape[1] != in_size  # an autoencoder's argmax is no class
    fig = {"output": name, "max_abs_error": float(err.max()), "mean_abs_error": float(err.mean()),
           "sqnr_db": sqnr_db(r, c), "bit_exact": bit_exact,
           "top1_agreement": top1_agreement(r, c) if classes else None,
           "accuracy": None, "reference_accuracy": None}
    if labels is not None and classes:
        fig["accuracy"], fig["reference_accuracy"] = accuracy(c, labels), accuracy(r, labels)
    return fig


def validate(model, data, labels=None, board: str = "host", quantize: str | None = None,
             calibration=None, calibration_method: str | None = None, limit: int | None = None,
             per_layer: bool = False, tolerance: float = FLOAT_TOLERANCE,
             progress=None) -> dict:
    """Run the compiled model and its reference on `data` (a .npz path); returns the report
    as a dict (format_report prints it). `labels`: a .npy path, or None for the .npz's own
    `labels` array if it has one."""
    from mcuforge.optimizer.quantize import quantize_for_compile

    from ..api import GraphRunner, load
    model = Path(model)
    graph = load(model)  # a missing or broken model fails here, by its path
    arrays, npz_labels = load_inputs(data, graph, limit)
    n = len(arrays[0])
    y = load_labels(labels, n, limit is not None) if labels is not None else npz_labels
    if per_layer and board != "host":
        raise McuforgeError("--per-layer runs on the host only (the intermediate tensors are "
                            "read from the host build): leave out --board")
    kind = reference_name(model, graph, quantize)
    report = {"model": model.name, "samples": n, "board": board, "reference": kind,
              "compiled": "mcuforge C", "outputs": [], "per_layer": None}
    ref = run_reference(model, graph, arrays, kind, progress)
    with GraphRunner() as run, tempfile.TemporaryDirectory(prefix="mcuforge-val-") as tmp:
        compiled = graph
        emitted = None
        if quantize:
            emitted = os.path.join(tmp, "q.tflite")
            compiled = quantize_for_compile(graph, quantize, calibration, calibration_method,
                                            io="float", emit_tflite=emitted, progress=progress,
                                            run=run)
            report["compiled"] = f"mcuforge C, quantized {quantize} by mcuforge (dequantized " \
                                 "at the edges)"
        if progress is not None:
            print(f"validate: mcuforge C on {board} ...", file=progress, flush=True)
        if board == "host":
            got = list(run(compiled, arrays).values())
        else:
            from ..target import run_on_board
            got = run_on_board(emitted or model, arrays, board).outputs
        in_size = graph.tensors[graph.inputs[0]].size
        for name, r, c in zip(graph.outputs, ref, got):
            report["outputs"].append(compare_output(name, r, c, compiled.tensors[
                compiled.outputs[list(graph.outputs).index(name)]], in_size, y))
        if per_layer:
            report["per_layer"] = _per_layer(model, graph, compiled, emitted, arrays, kind,
                                             tolerance, run, progress)
    return report


def _per_layer(model: Path, graph, compiled, emitted, arrays, kind, tolerance, run,
               progress) -> dict:
    """The first node output that diverges from the reference's (module docstring)."""
    if emitted is not None:  # bit-exact against the int8 model mcuforge compiles
        from ..api import load
        src, kind = Path(emitted), "tflite-micro"
        ref_graph = load(src)
    else:
        src, ref_graph = model, graph
    order = [(k, n, t) for k, n in enumerate(compiled.nodes) for t in n.outputs
             if t and not compiled.tensors[t].is_const]
    want = {t: None for _, _, t in order}
    run_reference(src, ref_graph, arrays, kind, progress, tensors=want)
    order = [(k, n, t) for k, n, t in order if t in want]
    names = list(dict.fromkeys([*compiled.outputs, *(t for _, _, t in order)]))
    if progress is not None:
        print(f"validate: mcuforge C with {len(order)} intermediate tensors exposed ...",
              file=progress, flush=True)
    ours = run(compiled.replace(outputs=names), arrays)
    result = {"reference": f"{kind} intermediate tensors" + (
        " of the int8 model mcuforge compiles (its --emit-tflite file)" if emitted else ""),
        "compared": len(order), "tolerance": tolerance, "first_divergence": None}
    if emitted is not None:
        result["quantization"] = _quantization_noise(model, graph, compiled, arrays, ours,
                                                     progress)
    for k, n, t in order:
        hit = diverges(want[t], ours[t], tolerance)
        if hit is not None:
            node = model_nodes(src).get(t, {"index": None, "op": None, "name": "", "tensor": t})
            result["first_divergence"] = {
                "tensor": t, "model_tensor": node["tensor"], "node": node["index"],
                "op": node["op"], "node_name": node["name"], "mcuforge_node": k,
                "mcuforge_op": n.op, **hit}
            break
    return result


def _quantization_noise(model: Path, graph, q, arrays, ours: dict, progress) -> list:
    """SQNR of each int8 layer (dequantized) against the float model's own tensor of that name
    in its runtime: where quantization loses precision. Tensors the optimizer renamed or
    reshaped (an ONNX model's NHWC internals) are left out."""
    floats = {t: None for t in ours}
    run_reference(model, graph, arrays, reference_name(model, graph, None), progress,
                  tensors=floats)
    rows = []
    for k, n in enumerate(q.nodes):
        for t in n.outputs:
            if t in floats and t in ours and np.size(floats[t]) == np.size(ours[t]):
                r = np.asarray(floats[t], np.float64).reshape(len(floats[t]), -1)
                c = _dequantize(ours[t], q.tensors[t]).reshape(r.shape)
                rows.append({"tensor": t, "mcuforge_node": k, "mcuforge_op": n.op,
                             "dtype": q.tensors[t].dtype, "sqnr_db": sqnr_db(r, c)})
    return rows


def diverges(ref: np.ndarray, test: np.ndarray, tolerance: float) -> dict | None:
    """None when `test` matches `ref` ([N, ...] each), else the error and the inputs that show
    it: integers any differing value, floats a relative error above `tolerance`."""
    ref = np.asarray(ref).reshape(len(ref), -1)
    test = np.asarray(test).reshape(ref.shape)
    if ref.dtype.kind in "ui" and test.dtype.kind in "ui":
        diff = np.abs(ref.astype(np.int64) - test.astype(np.int64))
        bad = (diff != 0).any(1)
        if not bad.any():
            return None
        i = int(np.argmax(bad))
        return {"kind": "integer", "first_input": i, "inputs_affected": int(bad.sum()),
                "differing_values": int((diff[i] != 0).sum()), "values": int(diff.shape[1]),
                "max_abs_error": int(diff[i].max())}
    r, c = ref.astype(np.float64), test.astype(np.float64)
    scale = max(float(np.abs(r).max()), 1e-30)
    with np.errstate(invalid="ignore"):
        rel = np.abs(r - c).max(1) / scale
    rel = np.where(np.isnan(rel), np.inf, rel)
    bad = rel > tolerance
    if not bad.any():
        return None
    i = int(np.argmax(bad))
    return {"kind": "float", "first_input": i, "inputs_affected": int(bad.sum()),
            "relative_error": float(rel[i]), "max_abs_error": float(np.abs(r[i] - c[i]).max())}


# ---------------------------------------------------------------------------------------------
# Printing


def to_json(r: dict) -> str:
    """The report as JSON; an infinite SQNR (equal outputs) is written "inf"."""
    import json

    def fix(v):
        if isinstance(v, float) and np.isinf(v):
            return "inf" if v > 0 else "-inf"
        if isinstance(v, dict):
            return {k: fix(x) for k, x in v.items()}
        if isinstance(v, list):
            return [fix(x) for x in v]
        return v
    return json.dumps(fix(r), indent=2)


def _pct(v) -> str:
    return "-" if v is None else f"{100 * v:.1f}%"


def format_report(r: dict) -> str:
    lines = [f"{r['model']}: {r['compiled']} on {r['board']} vs {r['reference']}, "
             f"{r['samples']} samples"]
    for o in r["outputs"]:
        sq = "inf" if o["sqnr_db"] == float("inf") else f"{o['sqnr_db']:.2f}"
        head = f"  output '{o['output']}': "
        if o["bit_exact"]:
            head += "bit-exact, "
        elif o["bit_exact"] is False:
            head += "NOT bit-exact, "
        lines.append(head + f"max abs error {o['max_abs_error']:.6g}, mean abs error "
                     f"{o['mean_abs_error']:.6g}, SQNR {sq} dB")
        if o["top1_agreement"] is not None:
            line = f"    top-1 agreement {_pct(o['top1_agreement'])}"
            if o["accuracy"] is not None:
                line += (f"; accuracy vs labels: mcuforge {_pct(o['accuracy'])}, "
                         f"{r['reference']} {_pct(o['reference_accuracy'])}")
            lines.append(line)
    p = r["per_layer"]
    if p is not None:
        d = p["first_divergence"]
        if d is None:
            lines.append(f"  per layer: all {p['compared']} layers match the {p['reference']}"
                         + ("" if _exact(r, p) else f" (relative tolerance {p['tolerance']:g})"))
        else:
            what = (f"{d['differing_values']} of {d['values']} values differ, max "
                    f"{d['max_abs_error']}" if d["kind"] == "integer" else
                    f"relative error {d['relative_error']:.3g} (max abs {d['max_abs_error']:.6g}"
                    f", tolerance {p['tolerance']:g})")
            name = f" '{d['node_name']}'" if d["node_name"] else ""
            lines.append(f"  per layer: first divergence at the model's node {d['node']} "
                         f"({d['op']}{name}; mcuforge's {d['mcuforge_op']}), tensor "
                         f"'{d['model_tensor']}': {what}; first at input {d['first_input']} "
                         f"({d['inputs_affected']} inputs affected); reference: "
                         f"{p['reference']}")
    noise = (p or {}).get("quantization")
    if noise:
        worst = min(noise, key=lambda x: x["sqnr_db"])
        lines.append(f"  quantization noise: {len(noise)} layers against the float model's "
                     f"tensors; lowest SQNR {worst['sqnr_db']:.2f} dB at tensor "
                     f"'{worst['tensor']}' ({worst['mcuforge_op']}, {worst['dtype']})")
    return "\n".join(lines)


def _exact(r, p) -> bool:
    return p["reference"].startswith("tflite-micro")
