"""ONNX element-wise operators end to end (load, compile, gcc, run) against onnxruntime and
against ONNX's own backend node tests; the float math runtime against its Python mirrors.

To keep gcc runs few, each test builds one model holding many independent nodes, and the node
tests are merged into one model per opset (names prefixed per case); a merged model that fails
is bisected down to the failing cases."""
import re
import subprocess
import warnings
from functools import lru_cache
from pathlib import Path

import numpy as np
import onnx
import onnxruntime
import pytest
from onnx import TensorProto as TP
from onnx import helper, numpy_helper

from mcuforge.codegen_c.evaluate_graph import run_graph
from mcuforge.codegen_c.lower import LOWERINGS, _load_all
from mcuforge.frontend.onnx import load_onnx
from mcuforge import runner
from mcuforge.ir.errors import ModelError, UnsupportedOpError
from mcuforge.ir.graph import ALIAS_OPS

OPSET = 21
IR_VERSION = 10  # onnxruntime reads IR versions up to 10 at least
RTOL, ATOL = 1e-5, 1e-6  # a few float32 ulps: libm, numpy and onnxruntime's MLAS differ there


def build(nodes, inputs: dict, outputs: list, opset: int = OPSET, inits=()) -> onnx.ModelProto:
    """A model of `nodes`; inputs: name -> (numpy dtype, shape); output types inferred."""
    vis = [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(np.dtype(dt)), s)
           for n, (dt, s) in inputs.items()]
    consts = [numpy_helper.from_array(np.asarray(v), n) for n, v in dict(inits).items()]
    g = helper.make_graph(nodes, "t", vis, [], initializer=consts)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)],
                          ir_version=IR_VERSION)
    infos = {vi.name: vi for vi in onnx.shape_inference.infer_shapes(m, strict_mode=True)
             .graph.value_info}
    m.graph.output.extend([infos[o] for o in outputs])
    return m


def node(op, ins, out, **attrs):
    return helper.make_node(op, ins, [out], **attrs)


def run_both(model, feeds: dict) -> tuple:
    """Our outputs and onnxruntime's, {name: [N, ...] array}; feeds are batches [N, ...]."""
    data = model.SerializeToString()
    names = [o.name for o in model.graph.output]
    ours = runner.run(data, feeds)
    ours = ours if isinstance(ours, dict) else {names[0]: ours}
    sess = onnxruntime.InferenceSession(data, providers=["CPUExecutionProvider"])
    n = len(next(iter(feeds.values())))
    per = [sess.run(None, {k: np.asarray(v[i]) for k, v in feeds.items()}) for i in range(n)]
    ref = {name: np.stack([p[k] for p in per]) for k, name in enumerate(names)}
    return ours, ref


def assert_close(ours: dict, ref: dict, rtol=RTOL, atol=ATOL):
    bad = []
    for name, r in ref.items():
        got = ours[name]
        if got.dtype != r.dtype or got.shape != r.shape:
            bad.append(f"{name}: {got.dtype}{got.shape} vs {r.dtype}{r.shape}")
        elif r.dtype.kind == "f":
            if not np.allclose(got, r, rtol=rtol, atol=atol, equal_nan=True):
                err = np.nanmax(np.abs(got.astype(np.float64) - r))
                bad.append(f"{name}: max abs error {err:.3g}")
        elif not np.array_equal(got, r):
            bad.append(f"{name}: {np.count_nonzero(got != r)} of {r.size} differ")
    assert not bad, "\n".join(bad)


def evaluate(model, feeds: dict) -> dict:
    """The loop-IR evaluator (Python mirrors of the runtime) on sample 0 of the feeds."""
    g = load_onnx(model)
    from mcuforge.optimizer.pipeline import optimize
    g = optimize(g)
    return {o: v[None] for o, v in run_graph(g, {n: feeds[n][0] for n in g.inputs}).items()}


# ---- runtime_c/mcuforge_math.h vs codegen_c/mathmirror.py --------------------------------

MATH_SIGS = {  # argument kinds: f = float, i = int32, l = int64
    "mfm_expf": "f", "mfm_logf": "f", "mfm_log1pf": "f", "mfm_sqrtf": "f", "mfm_sinf": "f",
    "mfm_cosf": "f", "mfm_tanhf": "f", "mfm_erff": "f", "mfm_powf": "ff", "mfm_floorf": "f",
    "mfm_ceilf": "f", "mfm_fabsf": "f", "mfm_fmodf": "ff", "mfm_floor_modf": "ff",
    "mfm_roundf": "f", "mfm_maxf": "ff", "mfm_minf": "ff", "mfm_mod_i32": "ii",
    "mfm_mod_i64": "ll", "mfm_ipow_i64": "ll", "mfm_expm1f": "f",
}
# the mirrors round the double-precision result, as glibc's float functions (nearly always)
# do; another libm may differ in the last bit. The rest must be bit-exact.
MATH_ULPS = dict.fromkeys(("mfm_expf", "mfm_logf", "mfm_log1pf", "mfm_sinf", "mfm_cosf",
                           "mfm_tanhf", "mfm_erff", "mfm_powf", "mfm_expm1f"), 1)


def _math_args(name: str, sig: str, rng) -> list:
    special = np.float32([0, -0.0, 0.5, -0.5, 1.5, 2.5, -2.5, 3.5, 1, -1, 1e-30, -7.25, 1e30,
                          8388609, -8388607.5, np.inf, -np.inf, np.nan])
    floats = np.concatenate([special, rng.standard_normal(40).astype(np.float32) * 8])
    if sig == "f":
        return [(v,) for v in floats]
    if sig == "ff":
        return [(a, b) for a, b in zip(floats, np.roll(floats, 7))] + [(a, a) for a in special]
    if name.startswith("mfm_mod"):
        big = 2**63 if sig == "ll" else 2**31
        a = [-big, big - 1, 7, -7, 0, 5, -5] + rng.integers(-big, big, 30).tolist()
        b = [-1, -1, 2, 2, 3, -3, 3] + [v or 1 for v in rng.integers(-100, 100, 30).tolist()]
        return list(zip(a, b))
    return [(b, e) for b in range(-5, 6) for e in (-3, -2, -1, 0, 1, 2, 3, 40, 41, 62, 63)]


def _c_array(name: str, values, kind: str) -> str:
    """Float arguments as bit patterns, integers as long long (INT64_MIN has no literal)."""
    if kind == "f":
        return (f"static const uint32_t {name}[] = "
                f"{{{', '.join(f'{np.float32(v).view(np.uint32)}u' for v in values)}}};")
    items = ["INT64_MIN" if v == -2**63 else f"{v}LL" for v in values]
    return f"static const long long {name}[] = {{{', '.join(items)}}};"


def test_math_runtime_matches_its_mirrors(tmp_path):
    from mcuforge.codegen_c import mathmirror
    header = Path(__file__).resolve().parents[1] / "runtime_c" / "mcuforge_math.h"
    c_names = set(re.findall(r"static inline [\w\s]+?\b(mfm_\w+)\(", header.read_text()))
    assert c_names == set(MATH_SIGS) == set(mathmirror.INTRINSICS)
    rng = np.random.default_rng(7)
    calls, arrays, loops = [], [], []
    convert = {"f": "F({})", "i": "(int32_t){}", "l": "(int64_t){}"}
    for name, sig in MATH_SIGS.items():
        args = _math_args(name, sig, rng)
        calls += [(name, a) for a in args]
        for k, kind in enumerate(sig):
            arrays.append(_c_array(f"{name}_{k}", [a[k] for a in args], kind))
        params = [convert[c].format(f"{name}_{k}[i]") for k, c in enumerate(sig)]
        call = f"{name}({', '.join(params)})"
        out = f'printf("%lu\\n", FB({call}))' if sig[0] == "f" else \
            f'printf("%lld\\n", (long long){call})'
        loops.append(f"    for (i = 0; i < {len(args)}; ++i) {out};")
    src = tmp_path / "m.c"
    src.write_text("#include <stdio.h>\n#include <string.h>\n#include \"mcuforge_math.h\"\n"
                   "static float F(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }\n"
                   "static unsigned long FB(float f) { uint32_t u; memcpy(&u, &f, 4); "
                   "return (unsigned long)u; }\n" + "\n".join(arrays) +
                   "\nint main(void) {\n    int i;\n" + "\n".join(loops) + "\n    return 0;\n}\n")
    exe = tmp_path / "m"
    subprocess.run(["gcc", "-std=c99", "-Wall", "-Wextra", "-Werror", "-pedantic", "-O2",
                    "-fsanitize=address,undefined", "-fno-sanitize-recover=all",
                    "-I", str(header.parent), str(src), "-o", str(exe), "-lm"], check=True)
    out = subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout.split()
    bad = []
    for (name, args), text in zip(calls, out):
        want = mathmirror.INTRINSICS[name](*args)
        if MATH_SIGS[name][0] != "f":
            ok = int(text) == want
        else:
            got, want = np.uint32(int(text)).view(np.float32), np.float32(want)
            ok = (np.isnan(got) and np.isnan(want)) or got == want and (
                np.signbit(got) == np.signbit(want)) or abs(
                int(got.view(np.int32)) - int(want.view(np.int32))) <= MATH_ULPS.get(name, 0)
        if not ok:
            bad.append(f"{name}{args}: C {text}, mirror {want}")
    assert len(out) == len(calls) and not bad, "\n".join(bad[:20])


# ---- float ----------------------------------------------------------------------------------

SHAPE = (2, 3, 4)


def _float_samples(seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((3, *SHAPE)).astype(np.float32) * 3
    x[1] = np.round(x[1] * 2) / 2  # halves (Round ties), zeros, ties for Hardmax
    x[2].flat[:6] = [0.0, -0.0, 20.0, -20.0, 0.5, -2.5]
    return x


def _unary_model():
    x = "x"
    nodes = [node("Relu", [x], "relu"), node("LeakyRelu", [x], "leaky", alpha=0.1),
             node("Sigmoid", [x], "sigmoid"), node("Tanh", [x], "tanh"),
             node("HardSigmoid", [x], "hsig"), node("HardSigmoid", [x], "hsig2", alpha=0.3,
                                                    beta=0.4),
             node("HardSwish", [x], "hswish"), node("Selu", [x], "selu"),
             node("Elu", [x], "elu", alpha=0.7), node("Celu", [x], "celu", alpha=2.0),
             node("Softplus", [x], "softplus"), node("Softsign", [x], "softsign"),
             node("Gelu", [x], "gelu"), node("Gelu", [x], "gelu_tanh", approximate="tanh"),
             node("Erf", [x], "erf"), node("Abs", [x], "abs"), node("Neg", [x], "neg"),
             node("Exp", [x], "exp"), node("Log", ["p"], "log"), node("Sqrt", ["p"], "sqrt"),
             node("Reciprocal", ["p"], "recip"), node("Floor", [x], "floor"),
             node("Ceil", [x], "ceil"), node("Round", [x], "round"), node("Sign", [x], "sign"),
             node("Sin", [x], "sin"), node("Cos", [x], "cos"),
             node("Clip", [x, "lo", "hi"], "clip"), node("Clip", [x, "zero", "six"], "relu6"),
             node("Clip", [x, "lo"], "clip_lo"), node("Clip", [x, "", "hi"], "clip_hi"),
             node("Clip", [x], "clip_none")]
    inits = {"lo": np.float32(-1.5), "hi": np.float32(2.25), "zero": np.float32(0),
             "six": np.float32(6)}
    return build(nodes, {"x": ("float32", SHAPE), "p": ("float32", SHAPE)},
                 [n.output[0] for n in nodes], inits=inits)


def test_float_unary_ops():
    m = _unary_model()
    x = _float_samples()
    feeds = {"x": x, "p": np.abs(x) + np.float32(0.01)}
    ours, ref = run_both(m, feeds)
    assert_close(ours, ref)
    # the Python mirrors of the runtime give the same results
    assert_close(evaluate(m, feeds), {k: v[:1] for k, v in ref.items()})


def test_float_binary_ops():
    nodes = [node("Add", ["a", "b"], "add"), node("Sub", ["a", "b"], "sub"),
             node("Mul", ["a", "c"], "mul"), node("Div", ["a", "b"], "div"),
             node("Pow", ["p", "b"], "pow"), node("Pow", ["a", "two"], "square"),
             node("Mod", ["a", "b"], "fmod", fmod=1), node("PRelu", ["a", "slope"], "prelu"),
             node("Max", ["a", "b", "c"], "max3"), node("Min", ["a", "b"], "min"),
             node("Sum", ["a", "b", "c"], "sum3"), node("Mean", ["a", "b", "c"], "mean3"),
             node("Sum", ["a"], "sum1"), node("Max", ["a", "b"], "max2"),
             node("Add", ["a", "k"], "add_const"), node("Mul", ["k", "a"], "mul_const"),
             node("Equal", ["a", "b"], "eq"), node("Less", ["a", "b"], "lt"),
             node("Greater", ["a", "c"], "gt"), node("LessOrEqual", ["a", "b"], "le"),
             node("GreaterOrEqual", ["a", "b"], "ge"), node("Where", ["gt", "a", "b"], "where"),
             node("Clip", ["a", "lo", "hi"], "clip_var"), node("Clip", ["a", "", "hi"], "clip_max")]
    inits = {"two": np.float32(2), "slope": np.float32([0.1, -0.2, 0.3, 0.5]),
             "k": np.arange(12, dtype=np.float32).reshape(3, 4) - 5}
    m = build(nodes, {"a": ("float32", SHAPE), "b": ("float32", (3, 4)),
                      "c": ("float32", (2, 1, 4)), "p": ("float32", SHAPE),
                      "lo": ("float32", ()), "hi": ("float32", ())},
              [n.output[0] for n in nodes], inits=inits)
    rng = np.random.default_rng(1)
    a = np.round(rng.standard_normal((2, *SHAPE)) * 4).astype(np.float32) / 2  # ties for ==
    b = np.round(rng.standard_normal((2, 3, 4)) * 4).astype(np.float32) / 2 + np.float32(0.25)
    c = np.round(rng.standard_normal((2, 2, 1, 4)) * 4).astype(np.float32) / 2
    feeds = {"a": a, "b": b, "c": c, "p": np.abs(a) + np.float32(0.5),
             "lo": np.float32([-1, 0.5]), "hi": np.float32([1.5, -1])}  # lo > hi: all hi
    ours, ref = run_both(m, feeds)
    assert_close(ours, ref)
    assert_close(evaluate(m, feeds), {k: v[:1] for k, v in ref.items()})


def test_float_mod_floored():
    """Mod fmod=0 on floats is numpy.mod (onnxruntime refuses it; the spec's reference is
    numpy)."""
    m = build([node("Mod", ["a", "b"], "y")], {"a": ("float32", (8,)), "b": ("float32", (8,))},
              ["y"])
    a = np.float32([[5, -5, 5, -5, 0, -0.0, 7.5, -1e-3]])
    b = np.float32([[3, 3, -3, -3, 2, -2, 2.5, 4]])
    got = runner.run(m.SerializeToString(), {"a": a, "b": b})
    np.testing.assert_array_equal(got.view(np.uint32), np.mod(a, b).view(np.uint32))


def test_softmax_family_along_any_axis():
    nodes = []
    for axis in (0, 1, 2, -1):
        nodes += [node("Softmax", ["x"], f"softmax{axis}", axis=axis),
                  node("LogSoftmax", ["x"], f"logsoftmax{axis}", axis=axis),
                  node("Hardmax", ["x"], f"hardmax{axis}", axis=axis)]
    nodes.append(node("Softmax", ["big"], "softmax_big"))
    m = build(nodes, {"x": ("float32", SHAPE), "big": ("float32", (2, 5))},
              [n.output[0] for n in nodes])
    big = np.float32([[[1000, 1001, 999, -1000, 0], [-50, -51, -49, -50, -50]]] * 3)
    feeds = {"x": _float_samples(2), "big": big}
    ours, ref = run_both(m, feeds)
    assert_close(ours, ref)
    assert_close(evaluate(m, feeds), {k: v[:1] for k, v in ref.items()})


def test_legacy_opset_attributes_and_2d_coercion():
    """Opset 10: Clip's bounds are attributes; Softmax, LogSoftmax, Hardmax flatten [axis:]."""
    nodes = [node("Clip", ["x"], "clip", min=-1.0, max=0.5),
             node("Clip", ["x"], "clip_lo", min=0.0),
             node("Softmax", ["x"], "softmax"), node("LogSoftmax", ["x"], "logsoftmax", axis=0),
             node("Hardmax", ["x"], "hardmax"), node("Softmax", ["x"], "softmax2", axis=2)]
    m = build(nodes, {"x": ("float32", SHAPE)}, [n.output[0] for n in nodes], opset=10)
    ours, ref = run_both(m, {"x": _float_samples(3)})
    assert_close(ours, ref)


def test_float_ops_map_to_the_ir_ops_tflite_models_use():
    nodes = [node("Add", ["x", "x"], "add"), node("Mul", ["x", "x"], "mul"),
             node("Relu", ["x"], "relu"), node("Sigmoid", ["x"], "sig"),
             node("Tanh", ["x"], "tanh"), node("HardSwish", ["x"], "hs"),
             node("LeakyRelu", ["x"], "leaky"), node("Softmax", ["x"], "sm"),
             node("Clip", ["x", "zero", "six"], "relu6"), node("Clip", ["x", "zero"], "relu0")]
    m = build(nodes, {"x": ("float32", SHAPE)}, [n.output[0] for n in nodes],
              inits={"zero": np.float32(0), "six": np.float32(6)})
    g = load_onnx(m)
    assert [(n.op, n.attrs.get("activation")) for n in g.nodes] == [
        ("add", "none"), ("mul", "none"), ("relu", None), ("logistic", None), ("tanh", None),
        ("hard_swish", None), ("leaky_relu", None), ("softmax", None), ("relu6", None),
        ("relu", None)]
    assert g.nodes[7].attrs == {"axis": 2, "beta": 1.0}


@pytest.mark.parametrize("op,dtype", [("Exp", "int32"), ("Sigmoid", "int8"),
                                      ("Softmax", "int32"), ("Gelu", "int64")])
def test_float_only_ops_refuse_integers(op, dtype):
    """An integer input the spec does not allow is an invalid model, named as such (not an
    unsupported operator)."""
    m = build([node(op, ["x"], "y")], {"x": (dtype, (4,))}, ["y"])
    with pytest.raises(ModelError, match=f"invalid ONNX model.*{op}.*{dtype}") as e:
        load_onnx(m)
    assert not isinstance(e.value, UnsupportedOpError)
    with pytest.raises(Exception):  # onnxruntime refuses to load it too
        onnxruntime.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])


# ---- integers and bool --------------------------------------------------------------------

INT_OPS = {  # onnxruntime's CPU kernels for each type
    "int8": "Add Sub Mul Div Mod Max Min Abs Neg Sign Clip Relu Compare Where",
    "uint8": "Add Sub Mul Div Mod Max Min Abs Sign Clip Compare Where",
    "int16": "Add Sub Mul Div Mod Abs Neg Sign Compare",
    "int32": "Add Sub Mul Div Mod Max Min Abs Neg Sign Clip Relu Compare Where Pow",
    "int64": "Add Sub Mul Div Mod Max Min Abs Neg Sign Clip Compare Where Pow",
}


def _int_model(dtype: str):
    ops = INT_OPS[dtype].split()
    nodes = []
    for op in ("Add", "Sub", "Mul", "Div", "Max", "Min"):
        if op in ops:
            nodes.append(node(op, ["a", "b"], op.lower()))
    if "Mod" in ops:
        nodes += [node("Mod", ["a", "b"], "mod"), node("Mod", ["a", "b"], "fmod", fmod=1),
                  node("Mod", ["a", "c"], "mod_bcast")]
    for op in ("Abs", "Neg", "Sign", "Relu"):
        if op in ops:
            nodes.append(node(op, ["a"], op.lower()))
    if "Clip" in ops:
        nodes += [node("Clip", ["a", "lo", "hi"], "clip"), node("Clip", ["a", "", "hi"], "clip_hi")]
    if "Compare" in ops:
        nodes += [node(op, ["a", "c"], op.lower()) for op in
                  ("Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual")]
    if "Where" in ops:
        nodes.append(node("Where", ["cond", "a", "c"], "where"))
    if "Pow" in ops:
        nodes.append(node("Pow", ["base", "e"], "pow"))
    info = np.iinfo(dtype)
    inits = {"lo": np.array(max(info.min, -20), dtype), "hi": np.array(min(info.max, 90), dtype)}
    inputs = {"a": (dtype, SHAPE), "b": (dtype, SHAPE), "c": (dtype, (3, 1)),
              "cond": ("bool", SHAPE), "base": (dtype, SHAPE), "e": (dtype, SHAPE)}
    used = {i for n in nodes for i in n.input}
    return build(nodes, {k: v for k, v in inputs.items() if k in used},
                 [n.output[0] for n in nodes],
                 inits={k: v for k, v in inits.items() if k in used}), used


@pytest.mark.parametrize("dtype", list(INT_OPS))
def test_integer_ops_are_exact(dtype):
    """Wrap-around, truncating division, floored and C modulo, exactly as onnxruntime."""
    m, used = _int_model(dtype)
    rng = np.random.default_rng(4)
    info = np.iinfo(dtype)
    lo, hi = (-2**30, 2**30) if dtype == "int64" else (info.min, info.max + 1)
    draw = lambda shape: rng.integers(lo, hi, (2, *shape), dtype=dtype)  # noqa: E731
    b = draw(SHAPE)
    b[b == 0] = 3
    c = draw((3, 1))
    c[c == 0] = -7 if info.min < 0 else 7
    c[0, 0, 0] = 5  # ties for the comparisons
    a = draw(SHAPE)
    a[0, 0, 0] = 5
    feeds = {"a": a, "b": b, "c": c, "cond": rng.random((2, *SHAPE)) < 0.5,
             "base": rng.integers(-6, 7, (2, *SHAPE), dtype=dtype) if info.min < 0 else None,
             "e": rng.integers(0, 8, (2, *SHAPE), dtype=dtype)}
    feeds = {k: v for k, v in feeds.items() if k in used}
    ours, ref = run_both(m, feeds)
    assert_close(ours, ref)
    assert_close(evaluate(m, feeds), {k: v[:1] for k, v in ref.items()})


def test_integer_ops_onnxruntime_lacks():
    """Sum, PRelu and integer-exponent float Pow: numpy is the reference."""
    nodes = [node("Sum", ["a", "b", "c"], "sum"), node("PRelu", ["a", "s"], "prelu"),
             node("Pow", ["f", "e"], "pow")]
    m = build(nodes, {"a": ("int32", (6,)), "b": ("int32", (6,)), "c": ("int32", (1,)),
                      "s": ("int32", (6,)), "f": ("float32", (6,)), "e": ("int64", (6,))},
              ["sum", "prelu", "pow"], opset=OPSET)
    a = np.int32([2**31 - 1, -5, 7, 0, -2**31, 9])
    b = np.int32([1, -5, 7, 3, -1, 9])
    c, s = np.int32([4]), np.int32([2, 3, -1, 5, 1, 0])
    f, e = np.float32([1.5, -2, 0.5, 3, -1, 0]), np.int64([2, 3, -1, 0, 5, 2])
    got = runner.run(m.SerializeToString(), {"a": a, "b": b, "c": c, "s": s, "f": f, "e": e})
    with np.errstate(over="ignore"):
        np.testing.assert_array_equal(got["sum"], a + b + c)
    np.testing.assert_array_equal(got["prelu"], np.where(a < 0, a * s, a))
    np.testing.assert_allclose(got["pow"], f ** e.astype(np.float32), rtol=RTOL)


def test_bool_ops():
    nodes = [node("Not", ["p"], "not"), node("And", ["p", "q"], "and"),
             node("Or", ["p", "q"], "or"), node("Xor", ["p", "r"], "xor"),
             node("Equal", ["p", "q"], "eq"), node("Where", ["p", "f", "g"], "where"),
             node("Cast", ["p"], "as_float", to=TP.FLOAT)]
    m = build(nodes, {"p": ("bool", SHAPE), "q": ("bool", SHAPE), "r": ("bool", (4,)),
                      "f": ("float32", (4,)), "g": ("float32", (3, 1))},
              [n.output[0] for n in nodes])
    rng = np.random.default_rng(5)
    feeds = {k: rng.random((2, *s)) < 0.5 for k, s in (("p", SHAPE), ("q", SHAPE), ("r", (4,)))}
    feeds.update(f=rng.standard_normal((2, 4), np.float32),
                 g=rng.standard_normal((2, 3, 1), np.float32))
    ours, ref = run_both(m, feeds)
    assert_close(ours, ref)


CAST_TO = {"f32": TP.FLOAT, "i8": TP.INT8, "u8": TP.UINT8, "i16": TP.INT16, "i32": TP.INT32,
           "i64": TP.INT64, "b": TP.BOOL}


def test_cast_between_all_types():
    """float -> int truncates toward zero (narrow types wrap through int32, as onnxruntime's
    static_cast does on every target), int -> int wraps, anything -> bool is != 0."""
    srcs = {"f32": "float32", "i8": "int8", "u8": "uint8", "i16": "int16", "i32": "int32",
            "i64": "int64", "b": "bool"}
    nodes = [node("Cast", [s], f"{s}_to_{d}", to=t) for s in srcs for d, t in CAST_TO.items()]
    nodes.append(node("CastLike", ["f32", "i16"], "castlike"))
    m = build(nodes, {s: (dt, (12,)) for s, dt in srcs.items()}, [n.output[0] for n in nodes])
    rng = np.random.default_rng(6)
    f = np.float32([0, -0.0, 0.5, -0.5, 1.99, -1.99, 127.7, -128.9, 255.5, 300.2, -300.7, 70000.5])
    feeds = {"f32": np.stack([f, rng.standard_normal(12).astype(np.float32) * 1000])}
    for s, dt in srcs.items():
        if s not in ("f32", "b"):
            info = np.iinfo(dt)
            feeds[s] = rng.integers(info.min, info.max, (2, 12), dtype=dt, endpoint=True)
    feeds["b"] = rng.random((2, 12)) < 0.5
    ours, ref = run_both(m, feeds)
    assert_close(ours, ref, rtol=0, atol=0)  # every conversion here is exact or rounds once


# ---- ONNX backend node tests -------------------------------------------------------------

NODE_TEST_OPS = (
    "abs relu clip leakyrelu prelu selu elu celu sigmoid tanh hardsigmoid hardswish softplus "
    "softsign gelu erf softmax logsoftmax hardmax neg exp log sqrt reciprocal pow floor ceil "
    "round sign sin cos add sub mul div max min sum mean equal less greater less_equal "
    "greater_equal where not and or xor cast mod").split()
# Node tests that import but are known to fail, with the reason. (None at present.)
EXCLUDED = {}


@lru_cache(maxsize=1)
def node_cases() -> list:
    from onnx.backend.test.loader import load_model_tests
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cases = load_model_tests(kind="node")
    return [c for c in cases if any(c.name[5:] == op or c.name[5:].startswith(op + "_")
                                    for op in NODE_TEST_OPS)]


def merge(cases) -> tuple:
    """One model running every case side by side (tensor names prefixed by the case index);
    returns (model, feeds, {case name: [(output name, expected)]})."""
    nodes, ins, outs, feeds, expect = [], [], [], {}, {}
    for k, c in enumerate(cases):
        g = c.model.graph
        ren = (lambda p: lambda n: p + n if n else "")(f"c{k}_")
        for n in g.node:
            m = onnx.NodeProto()
            m.CopyFrom(n)
            m.input[:] = [ren(i) for i in n.input]
            m.output[:] = [ren(o) for o in n.output]
            m.name = ren(n.name)
            nodes.append(m)
        for vi, arr in zip(g.input, c.data_sets[0][0]):
            ins.append(helper.make_value_info(ren(vi.name), vi.type))
            feeds[ren(vi.name)] = arr
        for vi in g.output:
            outs.append(helper.make_value_info(ren(vi.name), vi.type))
        expect[c.name] = [(ren(vi.name), r) for vi, r in zip(g.output, c.data_sets[0][1])]
    graph = helper.make_graph(nodes, "node_tests", ins, outs)
    model = helper.make_model(graph, opset_imports=list(cases[0].model.opset_import),
                              ir_version=max(c.model.ir_version for c in cases))
    return model, feeds, expect


def _run_cases(cases) -> dict:
    """case name -> None (passed) or the failure."""
    model, feeds, expect = merge(cases)
    try:
        got = runner.run(model.SerializeToString(), feeds)
    except Exception as e:
        if len(cases) == 1:
            return {cases[0].name: f"{type(e).__name__}: {e}"}
        half = len(cases) // 2  # bisect down to the failing case
        return {**_run_cases(cases[:half]), **_run_cases(cases[half:])}
    names = [o.name for o in model.graph.output]
    got = got if isinstance(got, dict) else {names[0]: got}
    result = {}
    for c in cases:
        try:
            for name, ref in expect[c.name]:
                np.testing.assert_allclose(got[name], ref, rtol=c.rtol, atol=c.atol)
                assert got[name].dtype == ref.dtype, f"dtype {got[name].dtype} vs {ref.dtype}"
            result[c.name] = None
        except AssertionError as e:
            result[c.name] = f"mismatch: {e}"
    return result


def test_onnx_backend_node_tests():
    """Every node test of these ops that imports (no UnsupportedOpError) passes, except the
    listed exclusions; cases with an op that has no lowering yet count as unsupported."""
    _load_all()
    runnable, unsupported = {}, []
    for c in node_cases():
        if c.name in EXCLUDED:
            continue
        try:
            g = load_onnx(c.model)
        except UnsupportedOpError:
            unsupported.append(c.name)
            continue
        if any(n.op not in LOWERINGS and n.op not in ALIAS_OPS for n in g.nodes):
            unsupported.append(c.name)  # e.g. an expanded Softmax's ReduceMax
            continue
        runnable.setdefault(c.model.opset_import[0].version, []).append(c)
    results = {}
    for group in runnable.values():
        for i in range(0, len(group), 40):
            results.update(_run_cases(group[i:i + 40]))
    failed = {n: r for n, r in results.items() if r is not None}
    passed = len(results) - len(failed)
    print(f"\nnode tests: {passed} passed, {len(failed)} failed, {len(unsupported)} unsupported, "
          f"{len(EXCLUDED)} excluded")
    assert not failed, "\n".join(f"{n}: {r[:500]}" for n, r in failed.items())
    assert passed >= 200  # the float and integer cases this module supports today
