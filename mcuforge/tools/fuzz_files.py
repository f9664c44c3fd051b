"""`mcuforge fuzz-files`: mutated model files through load -> optimize -> plan -> C, each case in
a forked process with a time and memory limit, counted as

  ok          compiled (the mutation left a valid model)
  error       a McuforgeError: the one-line message the CLI prints
  generic     a McuforgeError from a catch-all (the reader's "flatbuffer is malformed (...)"):
              clean for the user, but its cause is not named, so it counts against the goal
  traceback   any other exception (the CLI's "internal error"), MemoryError included
  crash       the process died of a signal (segfault, abort) or broke its memory limit
  hang        it did not finish within the time limit

Mutations, for both formats, from a seeded generator (a case is reproducible from its seed):
truncation, byte flips, bad offsets (4-byte words overwritten with large, negative or random
values), bad quantization (scale 0 / inf / NaN / negative, zero point out of range) and bad
shapes (negative, zero, huge dims; raw data that disagrees with dims). TFLite ones are written
in place at offsets found with the `tflite` package's reader; ONNX ones through the protobuf.
The goal is 0 generic, tracebacks, crashes and hangs.
"""
from __future__ import annotations

import json
import os
import random
import resource
import select
import signal
import struct
import time
import traceback
from collections import Counter
from dataclasses import dataclass, field

import numpy as np

KINDS = ("ok", "error", "generic", "traceback", "crash", "hang")
MUTATIONS = ("truncate", "flip", "offset", "quant", "shape")
GENERIC_MARK = "the flatbuffer is malformed ("
MEMORY_LIMIT = 3 << 30  # bytes of address space a case may use


# ---- seed models --------------------------------------------------------------------------

def seed_models(paths=()) -> list:
    """(label, format, bytes): mcuforge's demo int8 TFLite model, a float ONNX CNN and a QDQ
    one built with onnx.helper, and any model files given."""
    from mcuforge.tools.demo import demo_tflite_bytes
    out = [("demo.tflite", "tflite", demo_tflite_bytes()),
           ("cnn.onnx", "onnx", _onnx_cnn().SerializeToString()),
           ("qdq.onnx", "onnx", _onnx_qdq().SerializeToString())]
    for p in paths:
        with open(p, "rb") as f:
            data = f.read()
        out.append((os.path.basename(p), "tflite" if data[4:8] == b"TFL3" else "onnx", data))
    return out


def _onnx_cnn():
    from onnx import helper, numpy_helper
    rng = np.random.default_rng(1)
    w = lambda name, *shape: numpy_helper.from_array(  # noqa: E731
        rng.normal(size=shape).astype(np.float32), name)
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], name="conv", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["r"], name="relu"),
             helper.make_node("MaxPool", ["r"], ["p"], name="pool", kernel_shape=[2, 2],
                              strides=[2, 2]),
             helper.make_node("Flatten", ["p"], ["f"], name="flatten"),
             helper.make_node("Gemm", ["f", "fc_w", "fc_b"], ["g"], name="fc", transB=1),
             helper.make_node("Softmax", ["g"], ["y"], name="softmax")]
    g = helper.make_graph(nodes, "cnn", [helper.make_tensor_value_info("x", 1, [1, 2, 6, 6])],
                          [helper.make_tensor_value_info("y", 1, [1, 5])],
                          [w("w", 4, 2, 3, 3), w("b", 4), w("fc_w", 5, 36), w("fc_b", 5)])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])


def _onnx_qdq():
    from onnx import TensorProto, helper, numpy_helper
    rng = np.random.default_rng(2)
    q = rng.integers(-100, 100, size=(3, 2, 3, 3)).astype(np.int8)
    t = lambda name, kind, v: helper.make_tensor(name, kind, [], [v])  # noqa: E731
    nodes = [helper.make_node("QuantizeLinear", ["x", "s_x", "z_x"], ["xq"], name="q_x"),
             helper.make_node("DequantizeLinear", ["xq", "s_x", "z_x"], ["xd"], name="dq_x"),
             helper.make_node("DequantizeLinear", ["w_q", "s_w", "z_w"], ["wd"], name="dq_w"),
             helper.make_node("Conv", ["xd", "wd"], ["c"], name="conv"),
             helper.make_node("QuantizeLinear", ["c", "s_y", "z_x"], ["y"], name="q_y")]
    inits = [t("s_x", TensorProto.FLOAT, 0.05), t("z_x", TensorProto.INT8, 3),
             numpy_helper.from_array(q, "w_q"), t("s_w", TensorProto.FLOAT, 0.01),
             t("z_w", TensorProto.INT8, 0), t("s_y", TensorProto.FLOAT, 0.2)]
    g = helper.make_graph(nodes, "qdq", [helper.make_tensor_value_info("x", 1, [1, 2, 6, 6])],
                          [helper.make_tensor_value_info("y", TensorProto.INT8, [1, 3, 4, 4])],
                          inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])


# ---- mutations ----------------------------------------------------------------------------

_BAD_SCALES = (0.0, -0.0, float("inf"), float("-inf"), float("nan"), -0.5, 1e-45, 3e38)
_BAD_INTS = (-1, -2, 0, 0x7FFFFFFF, -0x80000000, 0xFFFF, 1 << 20, 255, 128, -129)


def _bad_int(rng) -> int:
    return rng.choice(_BAD_INTS + (rng.randrange(-1 << 31, 1 << 31),))


def mutate(data: bytes, fmt: str, kind: str, rng: random.Random) -> bytes:
    """One mutation of `kind` (MUTATIONS) applied to a model's bytes."""
    if kind == "truncate":
        return data[:rng.randrange(0, len(data))]
    if kind == "flip":
        buf = bytearray(data)
        for _ in range(rng.choice((1, 1, 2, 4, 16))):
            buf[rng.randrange(len(buf))] ^= 1 << rng.randrange(8)
        return bytes(buf)
    if kind == "offset" and fmt == "tflite":
        buf = bytearray(data)
        sites = _tflite_sites(data)["offset"]
        for _ in range(rng.choice((1, 1, 2))):
            pos = rng.choice(sites) if sites and rng.random() < 0.7 else \
                rng.randrange(0, max(1, len(buf) - 4)) & ~3
            struct.pack_into("<i", buf, pos, _bad_int(rng))
        return bytes(buf)
    if kind == "offset":  # protobuf: a length or tag byte
        buf = bytearray(data)
        pos = rng.randrange(len(buf))
        buf[pos] = rng.choice((0x00, 0x7F, 0x80, 0xFF, rng.randrange(256)))
        return bytes(buf)
    if fmt == "tflite":
        return _mutate_tflite(data, kind, rng)
    return _mutate_onnx(data, kind, rng)


def _tflite_sites(data: bytes) -> dict:
    """Offsets of fields worth corrupting: {"offset": uoffsets and indices (int32),
    "scale": float32s, "zero_point": int64s, "shape": int32s, "buffer": uint32s}."""
    import tflite
    sites = {"offset": [], "scale": [], "zero_point": [], "shape": [], "buffer": []}
    m = tflite.Model.GetRootAs(data, 0)

    def vec(table, slot, n, size, key):
        o = table._tab.Offset(slot)
        if o:
            start = table._tab.Vector(o)
            sites[key] += [start + k * size for k in range(n)]
            sites["offset"].append(table._tab.Pos + o)  # the uoffset to the vector itself

    def scalar(table, slot, key):
        o = table._tab.Offset(slot)
        if o:
            sites[key].append(table._tab.Pos + o)

    for s in range(m.SubgraphsLength()):
        sg = m.Subgraphs(s)
        for i in range(sg.TensorsLength()):
            t = sg.Tensors(i)
            vec(t, 4, t.ShapeLength(), 4, "shape")
            scalar(t, 8, "buffer")
            q = t.Quantization()
            if q is not None:
                vec(q, 8, q.ScaleLength(), 4, "scale")
                vec(q, 10, q.ZeroPointLength(), 8, "zero_point")
        for i in range(sg.OperatorsLength()):
            op = sg.Operators(i)
            scalar(op, 4, "offset")  # opcode index
            vec(op, 6, op.InputsLength(), 4, "offset")
            vec(op, 8, op.OutputsLength(), 4, "offset")
        vec(sg, 6, sg.InputsLength(), 4, "offset")
        vec(sg, 8, sg.OutputsLength(), 4, "offset")
    for i in range(m.OperatorCodesLength()):
        scalar(m.OperatorCodes(i), 10, "offset")
    return sites


def _mutate_tflite(data: bytes, kind: str, rng) -> bytes:
    buf = bytearray(data)
    sites = _tflite_sites(data)
    if kind == "quant":
        if sites["zero_point"] and rng.random() < 0.4:
            struct.pack_into("<q", buf, rng.choice(sites["zero_point"]),
                             rng.choice((128, -129, 256, 1 << 40, -1 << 40)))
        elif sites["scale"]:
            struct.pack_into("<f", buf, rng.choice(sites["scale"]), rng.choice(_BAD_SCALES))
        return bytes(buf)
    if rng.random() < 0.2 and sites["buffer"]:  # a tensor pointing at another's data
        struct.pack_into("<I", buf, rng.choice(sites["buffer"]), rng.randrange(0, 64))
    elif sites["shape"]:
        struct.pack_into("<i", buf, rng.choice(sites["shape"]),
                         rng.choice((-1, -7, 0, 3, 1 << 16, 1 << 30, 0x7FFFFFFF)))
    return bytes(buf)


def _mutate_onnx(data: bytes, kind: str, rng) -> bytes:
    import onnx
    from onnx import TensorProto
    m = onnx.load_model_from_string(data)
    g = m.graph
    inits = list(g.initializer)
    if kind == "quant":
        floats = [t for t in inits if t.data_type == TensorProto.FLOAT and not t.dims]
        ints = [t for t in inits if t.data_type in (TensorProto.INT8, TensorProto.UINT8)]
        if ints and (rng.random() < 0.4 or not floats):
            t = rng.choice(ints)
            t.ClearField("raw_data")
            del t.int32_data[:]
            n = int(np.prod(list(t.dims))) if t.dims else 1
            t.int32_data.extend([rng.choice((300, -200, 256, 1 << 20))] * n)
        elif floats:
            t = rng.choice(floats)
            del t.float_data[:]
            t.raw_data = struct.pack("<f", rng.choice(_BAD_SCALES))
        return m.SerializeToString()
    # shape: initializer dims or data size, a graph input's dims, or a node rewired
    r = rng.random()
    if r < 0.35 and inits:
        t = rng.choice(inits)
        if t.dims and rng.random() < 0.6:
            t.dims[rng.randrange(len(t.dims))] = rng.choice((-1, -4, 0, 1 << 20, 7))
        else:
            raw = onnx.numpy_helper.to_array(t).tobytes()
            t.ClearField("float_data")
            t.ClearField("int32_data")
            t.ClearField("int64_data")
            t.raw_data = raw[:rng.randrange(len(raw) + 1)] if raw else b"\0" * 4
    elif r < 0.55:
        d = rng.choice(list(g.input)).type.tensor_type.shape.dim
        if d:
            d[rng.randrange(len(d))].dim_value = rng.choice((-3, 0, 4096, 5))
    elif r < 0.7:
        n = rng.choice(list(g.node))
        if n.input:
            k = rng.randrange(len(n.input))
            names = [o for x in g.node for o in x.output] + ["nowhere"]
            n.input[k] = rng.choice(names)  # may dangle, form a cycle or mistype
    elif r < 0.85:
        a, b = rng.sample(list(g.node), 2)
        a.op_type, b.op_type = b.op_type, a.op_type
    else:
        vi = rng.choice(list(g.input) + list(g.output))
        vi.type.tensor_type.elem_type = rng.choice((TensorProto.BOOL, TensorProto.INT64,
                                                    TensorProto.STRING, TensorProto.DOUBLE, 99))
    return m.SerializeToString()


# ---- running a case -----------------------------------------------------------------------

def exercise(data: bytes) -> None:
    """What `mcuforge compile` does with a model, short of writing files."""
    from mcuforge.codegen_c.model import generate
    from mcuforge.optimizer.pipeline import optimize

    from mcuforge.frontend import load_model
    g = optimize(load_model(data))
    generate(g, "model")


def _child(data: bytes, wfd: int) -> None:
    import warnings
    from mcuforge.ir.errors import McuforgeError
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            exercise(data)
        out = {"kind": "ok"}
    except McuforgeError as e:
        msg = str(e)
        out = {"kind": "generic" if GENERIC_MARK in msg else "error", "message": msg}
    except BaseException as e:  # noqa: BLE001 - the point is to classify everything
        frames = [f for f in traceback.extract_tb(e.__traceback__)]
        where = frames[-1] if frames else None
        out = {"kind": "traceback", "message": f"{type(e).__name__}: {str(e)[:300]}",
               "where": f"{os.path.relpath(where.filename)}:{where.lineno} in {where.name}"
               if where else "?"}
    os.write(wfd, json.dumps(out).encode())
    os.close(wfd)


def run_case(data: bytes, timeout: float) -> dict:
    """Classify one model's bytes in a forked child."""
    rfd, wfd = os.pipe()
    pid = os.fork()
    if pid == 0:  # child
        import faulthandler
        faulthandler.disable()  # a crash is reported by its signal, not a dump
        os.close(rfd)
        code = 0
        try:
            _child(data, wfd)
        except BaseException:  # noqa: BLE001
            code = 3
        os._exit(code)
    os.close(wfd)
    chunks, deadline = [], time.monotonic() + timeout
    status = None
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            os.close(rfd)
            return {"kind": "hang", "message": f"no result within {timeout:g} s"}
        ready, _, _ = select.select([rfd], [], [], min(left, 0.5))
        if ready:
            chunk = os.read(rfd, 1 << 16)
            if chunk:
                chunks.append(chunk)
                continue
            break  # the child closed its end
    os.close(rfd)
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
        return {"kind": "crash", "message": f"killed by signal {os.WTERMSIG(status)}"}
    try:
        return json.loads(b"".join(chunks))
    except ValueError:
        return {"kind": "crash", "message": f"no result (exit status {status})"}


@dataclass
class Report:
    counts: Counter = field(default_factory=Counter)
    failures: dict = field(default_factory=dict)  # signature -> first case that hit it
    seconds: float = 0.0

    @property
    def tried(self) -> int:
        return sum(self.counts.values())

    @property
    def bad(self) -> int:
        return sum(self.counts[k] for k in ("generic", "traceback", "crash", "hang"))

    def as_dict(self) -> dict:
        return {"tried": self.tried, **{k: self.counts[k] for k in KINDS},
                "seconds": round(self.seconds, 1), "failures": list(self.failures.values())}

    def text(self) -> str:
        c = self.counts
        lines = [f"tried {self.tried}: {c['error']} clean errors, {c['ok']} successes, "
                 f"{c['traceback']} tracebacks, {c['generic']} generic errors, "
                 f"{c['crash']} crashes, {c['hang']} hangs ({self.seconds:.0f} s)"]
        for f in self.failures.values():
            lines.append(f"  {f['kind']}: {f['model']} {f['mutation']} seed {f['seed']}: "
                         f"{f.get('where', '')} {f['message'][:200]}".rstrip())
        return "\n".join(lines)


def make_case(seeds: list, seed: int, k: int) -> tuple:
    """Case k of a run with `seed` over `seeds` (from seed_models): (case seed, model label,
    format, mutation, mutated bytes); the same arguments always give the same file."""
    case_seed = seed * 1_000_003 + k
    rng = random.Random(case_seed)
    label, fmt, data = seeds[k % len(seeds)]
    kind = MUTATIONS[(k // len(seeds)) % len(MUTATIONS)]
    try:
        mutated = mutate(data, fmt, kind, rng)
    except Exception:  # noqa: BLE001 - the base model lacks the field: try a flip
        kind, mutated = "flip", mutate(data, fmt, "flip", rng)
    return case_seed, label, fmt, kind, mutated


def fuzz(cases: int, seed: int = 0, timeout: float = 20.0, models=(), formats=("tflite", "onnx"),
         progress=None, save_dir=None) -> Report:
    """Run `cases` mutated files (spread over the seed models and mutations)."""
    seeds = [s for s in seed_models(models) if s[1] in formats]
    _warm_up()
    report, start = Report(), time.monotonic()
    for k in range(cases):
        case_seed, label, fmt, kind, mutated = make_case(seeds, seed, k)
        result = run_case(mutated, timeout)
        report.counts[result["kind"]] += 1
        if result["kind"] in ("generic", "traceback", "crash", "hang"):
            sig = (result["kind"], result.get("where") or result["message"][:60])
            if sig not in report.failures:
                report.failures[sig] = {"model": label, "mutation": kind, "seed": case_seed,
                                        **result}
                if save_dir:
                    os.makedirs(save_dir, exist_ok=True)
                    ext = "tflite" if fmt == "tflite" else "onnx"
                    with open(os.path.join(save_dir, f"case{case_seed}.{ext}"), "wb") as f:
                        f.write(mutated)
        if progress is not None and (k + 1) % 50 == 0:
            print(f"  {k + 1}/{cases}", file=progress, flush=True)
    report.seconds = time.monotonic() - start
    return report


def _warm_up() -> None:
    """Import what a case needs once, so every forked child starts warm."""
    import mcuforge.codegen_c.model  # noqa: F401
    import mcuforge.frontend  # noqa: F401
    import onnx.reference  # noqa: F401
    import mcuforge.optimizer.pipeline  # noqa: F401
    from mcuforge.frontend.onnx import _load_converters
    _load_converters()
