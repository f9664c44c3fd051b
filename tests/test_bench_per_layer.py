"""`mcuforge bench --per-layer`: each layer's instructions on an emulated board (the marks of a
profile=True build, timed by the firmware) add up to the whole-invoke count of the ordinary
build; each layer's MACs are the layer's own, computed here from the model's shapes; the
ordinary build is unchanged by the feature."""
import json
import re
import subprocess
import sys

import numpy as np
import pytest

from conftest import mlperf_model, require, require_tools
from mcuforge.frontend.tflite_flatbuffer import TflOp, TflSubgraph, write_model
from mcuforge.api import generate_project, load
from mcuforge.target import build_firmware, run_on_board
from mcuforge.board import load_board
from mcuforge.tools.tflite_cases import tensor

BOARD = "mps2-an386"
TICK = 40  # instructions per SysTick tick: 25 MHz clock, one instruction per ns (-icount 0)


def _cli(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mcuforge.cli", *args], capture_output=True,
                          text=True)


def _tflite_macs(path) -> list:
    """(op, MACs) of each CONV_2D / DEPTHWISE_CONV_2D / FULLY_CONNECTED of the model's main
    subgraph, in order, from the flatbuffer's own shapes."""
    tfl = require("tflite")
    m = tfl.Model.GetRootAsModel(path.read_bytes(), 0)
    sg = m.Subgraphs(0)
    ops = {v: k for k, v in vars(tfl.BuiltinOperator).items() if not k.startswith("_")}
    out = []
    for i in range(sg.OperatorsLength()):
        op = sg.Operators(i)
        code = m.OperatorCodes(op.OpcodeIndex())
        name = ops[max(code.BuiltinCode(), code.DeprecatedBuiltinCode())]
        w = sg.Tensors(op.Inputs(1)).ShapeAsNumpy() if op.InputsLength() > 1 else None
        y = sg.Tensors(op.Outputs(0)).ShapeAsNumpy()
        if name == "CONV_2D":  # filter [O, KH, KW, CI], output [1, OH, OW, O]
            out.append(("conv2d", int(y[1] * y[2] * w[0] * w[1] * w[2] * w[3])))
        elif name == "DEPTHWISE_CONV_2D":  # filter [1, KH, KW, O]: one input channel each
            out.append(("depthwise_conv2d", int(y[1] * y[2] * w[3] * w[1] * w[2])))
        elif name == "FULLY_CONNECTED":  # weights [O, I], one row of output per batch
            out.append(("fully_connected", int(np.prod(y[:-1]) * w[0] * w[1])))
    return out


@pytest.fixture(scope="module")
def kws_rows():
    """`bench --per-layer --json` of KWS int8 on the board, twice."""
    require_tools("arm-none-eabi-gcc", "qemu-system-arm")
    model = mlperf_model("kws_ref_model")
    rows = []
    for _ in range(2):
        r = _cli("bench", "--board", BOARD, "--per-layer", "--no-tflm", "--json", str(model))
        assert r.returncode == 0, r.stderr
        rows.append(json.loads(r.stdout)[0])
    return model, rows


def test_layers_add_up_to_the_whole_invoke(kws_rows):
    _, (r, _) = kws_rows
    layers = r["layers"]
    assert r["counter_resolution_instructions"] == TICK
    assert r["layers_instructions"] == sum(x["instructions"] for x in layers)
    # the marks tile the invoke: what is left is its own entry and return (no state copies in
    # KWS) and the counter's one-tick resolution at either end
    assert abs(r["instructions"] - r["layers_instructions"]) <= 2 * TICK
    # a mark's cost, measured on 256 marks in a row, is what the marks add to the invoke:
    # the profiled build (one mark per layer and one after the last) less the ordinary one
    marks = len(layers) + 1
    added = r["profiled_instructions"] - r["instructions"]
    assert 10 < r["mark_instructions"] < 60
    assert abs(added - marks * r["mark_instructions"]) <= 2 * TICK
    # every layer runs: no layer's figure is lost in the subtraction
    assert all(x["instructions"] > 0 for x in layers)


def test_layer_macs_are_the_models_own(kws_rows):
    model, (r, _) = kws_rows
    layers = r["layers"]
    expected = _tflite_macs(model)
    kind = [re.match(r"l\d+_(conv2d|depthwise_conv2d|fully_connected)_|", x["layer"]).group(1)
            for x in layers]
    got = [(k, x["macs"]) for k, x in zip(kind, layers) if k]
    assert got == expected and len(expected) == 10
    assert sum(x["macs"] for x in layers) == r["macs"] == 2_656_768  # published figure
    for k, x in zip(kind, layers):  # the other layers (pooling, softmax): no MACs
        assert k or x["macs"] == 0
        assert x["macs_per_instruction"] == round(x["macs"] / x["instructions"], 3)


def test_layers_are_named_as_the_generated_kernels(kws_rows):
    model, (r, _) = kws_rows
    files, *_ = generate_project(load(str(model)), "model", BOARD)
    invoke = files["model.c"].split("int model_invoke(void) {")[1].split("return 0;")[0]
    calls = re.findall(r"^    (l\d+_\w+)\(", invoke, re.M)
    assert [x["layer"] for x in r["layers"]] == calls and len(calls) == 12


def test_two_runs_are_identical(kws_rows):
    _, (a, b) = kws_rows
    assert a == b


def test_table_shows_every_layer_and_the_total(tmp_path):
    require_tools("arm-none-eabi-gcc", "qemu-system-arm")
    model = mlperf_model("ad01_int8")
    r = _cli("bench", "--board", BOARD, "--per-layer", "--no-tflm", str(model))
    assert r.returncode == 0, r.stderr
    rows = json.loads(_cli("bench", "--board", BOARD, "--per-layer", "--no-tflm", "--json",
                           str(model)).stdout)
    lines = r.stdout.splitlines()
    for x in rows[0]["layers"]:
        [line] = [ln for ln in lines if ln.startswith(x["layer"] + " ")]
        assert f"{x['instructions']:,}" in line.split() and f"{x['macs']:,}" in line.split()
    [total] = [ln for ln in lines if ln.startswith("total (layers)")]
    assert f"{rows[0]['layers_instructions']:,}" in total.split()


def test_per_layer_needs_an_emulated_board(tmp_path):
    model = mlperf_model("ad01_int8")
    r = _cli("bench", "--per-layer", str(model))
    assert r.returncode != 0 and "Traceback" not in r.stderr
    assert r.stderr.startswith("mcuforge: error:") and "--board" in r.stderr


# ---- the ordinary build is unchanged --------------------------------------------------------

PROFILE_BLOCK = re.compile(r"\n/\* Per-layer profile:.*?#endif\n", re.S)
MARK = re.compile(r"^    MF_LAYER_MARK\(\d+, \"\w*\"\);\n", re.M)


@pytest.mark.parametrize("stem", ["kws_ref_model", "ad01_int8"])
def test_profile_adds_only_the_marks(stem):
    g = load(str(mlperf_model(stem)))
    plain, *_ = generate_project(g, "model", BOARD)
    prof, _, gen, _ = generate_project(g, "model", BOARD, profile=True)
    for text in plain.values():
        assert "MF_LAYER" not in text and "MCUFORGE_PROFILE" not in text
    assert len(MARK.findall(prof["model.c"])) == len(gen.layers) + 1
    assert MARK.sub("", PROFILE_BLOCK.sub("", prof["model.c"], count=1)) == plain["model.c"]
    assert prof["model.h"] == plain["model.h"]  # the model's API is the same


def test_profiled_sources_without_the_macro_build_the_same_firmware(tmp_path):
    """`make PROFILE=0` of the profiled project (its marks compiled out) links the very ELF of
    the ordinary project; `make` (PROFILE=1) builds -Werror clean and prints the layers."""
    require_tools("arm-none-eabi-gcc", "qemu-system-arm")
    board = load_board(BOARD)
    model = str(mlperf_model("ad01_int8"))
    x = [[np.zeros(640, np.int8)]]
    _, plain_elf, _ = build_firmware(model, board, x, tmp_path / "plain")
    prof_dir, prof_elf, result = build_firmware(model, board, x, tmp_path / "prof", profile=True)
    r = subprocess.run(["make", "-s", "-C", str(prof_dir), "PROFILE=0"], capture_output=True,
                       text=True)
    assert r.returncode == 0, r.stderr
    assert prof_elf.read_bytes() == plain_elf.read_bytes()
    r = subprocess.run(["make", "-s", "-C", str(prof_dir), "run"], capture_output=True,
                       text=True)
    text = r.stdout + r.stderr
    names = re.findall(r"^layer \d+ (\w+)$", text, re.M)
    assert names == [n for n, _ in result.layers] and len(names) == 10


# ---- control flow: one layer -----------------------------------------------------------------

def _fc(x, w, y):
    return TflOp("FULLY_CONNECTED", (x, w, ""), (y,))


def _if_model() -> bytes:
    """h = fc(x, w0 [4x8]); y = c ? fc(h, w1 [4x4]) : -h; float32."""
    rng = np.random.default_rng(1)
    main = [tensor("c", (1,), "bool"), tensor("x", (1, 8), "float32"),
            tensor("w0", (4, 8), "float32", data=rng.standard_normal((4, 8))),
            tensor("h", (1, 4), "float32"), tensor("y", (1, 4), "float32")]
    ops = [_fc("x", "w0", "h"),
           TflOp("IF", ("c", "h"), ("y",), {"then_subgraph_index": 1, "else_subgraph_index": 2})]
    then = TflSubgraph([tensor("p", (1, 4), "float32"),
                        tensor("w1", (4, 4), "float32", data=rng.standard_normal((4, 4))),
                        tensor("out", (1, 4), "float32")], [_fc("p", "w1", "out")], ["p"],
                       ["out"], "then")
    other = TflSubgraph([tensor("p", (1, 4), "float32"), tensor("out", (1, 4), "float32")],
                        [TflOp("NEG", ("p",), ("out",))], ["p"], ["out"], "else")
    return write_model([TflSubgraph(main, ops, ["c", "x"], ["y"]), then, other])


def test_a_control_flow_node_is_one_layer(tmp_path):
    require_tools("arm-none-eabi-gcc", "qemu-system-arm")
    path = tmp_path / "if.tflite"
    path.write_bytes(_if_model())
    c = np.ones((1, 1), bool)
    x = np.arange(8, dtype=np.float32).reshape(1, 1, 8)
    run = run_on_board(str(path), [c, x], BOARD, tmp_path / "fw", profile=True)
    p = run.profile
    assert [re.sub(r"_\w*$", "", n) for n in p.names] == ["l00", "l01"]
    assert "fully_connected" in p.names[0] and "_if_" in p.names[1]
    assert p.macs == [4 * 8, 4 * 4]  # the if: its branches' kernels (then: 4x4, else: none)
    # the layers' ticks tile the invoke: its own code and the marks' share aside
    assert 0 <= run.ticks[0] - sum(p.ticks[0]) <= 2


def test_compile_profile_writes_the_marks(tmp_path):
    model = str(mlperf_model("ad01_int8"))
    for flag, out in (([], tmp_path / "plain"), (["--profile"], tmp_path / "prof")):
        r = _cli("compile", model, "--board", BOARD, "--name", "ad", "-o", str(out), *flag)
        assert r.returncode == 0, r.stderr
    assert "MF_LAYER_MARK(" not in (tmp_path / "plain" / "ad.c").read_text()
    text = (tmp_path / "prof" / "ad.c").read_text()
    assert len(MARK.findall(text)) == 11  # ten layers, and the end of the last
    assert "CFLAGS += -DMCUFORGE_PROFILE" in (tmp_path / "prof" / "Makefile").read_text()
