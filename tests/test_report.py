"""`mcuforge report`: the JSON's figures against independent facts (MACs and weight bytes from
the .tflite's own tensors read with the `tflite` package, arena offsets from the generated C's
calls, per-layer instructions from `bench --per-layer`, memory sizes from board.toml); the
HTML parsed (tags balance, two PNG pictures that decode), every model string escaped (a
hostile tensor and file name), and the page loaded in headless Chromium when it is installed."""
import base64
import html
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest

from conftest import mlperf_model, require, require_tools, unavailable
from test_frontend_tflite import T, build, conv_opts

BOARD = "mps2-an386"
TICK = 40  # instructions per SysTick tick on the an386 under QEMU -icount shift=0
ROOT = Path(__file__).resolve().parent.parent


def _cli(*args, cwd=None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}  # a cwd elsewhere still finds this mcuforge
    return subprocess.run([sys.executable, "-m", "mcuforge.cli", *args], capture_output=True,
                          text=True, cwd=cwd, env=env)


def _report(tmp_path, model, *args) -> tuple:
    """(JSON dict, HTML text) of `mcuforge report`."""
    j, h = tmp_path / "r.json", tmp_path / "r.html"
    for out, extra in ((j, ["--json"]), (h, [])):
        r = _cli("report", str(model), "-o", str(out), *args, *extra)
        assert r.returncode == 0, r.stderr
        assert r.stdout.strip() == f"wrote {out}"
    return json.loads(j.read_text()), h.read_text()


@pytest.fixture(scope="module")
def kws(tmp_path_factory):
    require_tools("arm-none-eabi-gcc", "qemu-system-arm")
    model = mlperf_model("kws_ref_model")
    data, page = _report(tmp_path_factory.mktemp("kws"), model, "--board", BOARD)
    return model, data, page


# ---- figures against the model file ----------------------------------------------------------

def _tflite_layers(path) -> list:
    """(kind, MACs, bytes of the constant inputs) of each CONV_2D / DEPTHWISE_CONV_2D /
    FULLY_CONNECTED of the main subgraph, from the flatbuffer's shapes and buffers."""
    tfl = require("tflite")
    m = tfl.Model.GetRootAsModel(path.read_bytes(), 0)
    sg = m.Subgraphs(0)
    ops = {v: k for k, v in vars(tfl.BuiltinOperator).items() if not k.startswith("_")}
    out = []
    for i in range(sg.OperatorsLength()):
        op = sg.Operators(i)
        code = m.OperatorCodes(op.OpcodeIndex())
        name = ops[max(code.BuiltinCode(), code.DeprecatedBuiltinCode())]
        ins = [op.Inputs(k) for k in range(op.InputsLength()) if op.Inputs(k) >= 0]
        const = sum(m.Buffers(sg.Tensors(t).Buffer()).DataLength() for t in ins)
        w = sg.Tensors(ins[1]).ShapeAsNumpy() if len(ins) > 1 else None
        y = sg.Tensors(op.Outputs(0)).ShapeAsNumpy()
        if name == "CONV_2D":  # filter [O, KH, KW, CI], output [1, OH, OW, O]
            out.append(("conv2d", int(y[1] * y[2] * w[0] * w[1] * w[2] * w[3]), const))
        elif name == "DEPTHWISE_CONV_2D":  # filter [1, KH, KW, O]
            out.append(("depthwise_conv2d", int(y[1] * y[2] * w[3] * w[1] * w[2]), const))
        elif name == "FULLY_CONNECTED":  # weights [O, I]
            out.append(("fully_connected", int(np.prod(y[:-1]) * w[0] * w[1]), const))
    return out


def test_macs_and_weight_bytes_are_the_models(kws):
    model, r, _ = kws
    expected = _tflite_layers(model)
    got = [(x["op"], x["macs"], x["weight_bytes"]) for x in r["layers"]
           if x["op"] in ("conv2d", "depthwise_conv2d", "fully_connected")]
    assert got == expected and len(expected) == 10
    assert r["macs"] == sum(x["macs"] for x in r["layers"]) == 2_656_768  # published figure
    # the other layers (pooling, softmax, the reshape) compute no MACs
    assert all(x["macs"] == 0 for x in r["layers"]
               if x["op"] not in ("conv2d", "depthwise_conv2d", "fully_connected"))


def test_shapes_and_quantization_are_the_models(kws):
    """Every layer's tensors as the .tflite declares them (names, shapes, scales, zero points;
    per-channel weights flagged with one scale per output channel)."""
    model, r, _ = kws
    tfl = require("tflite")
    m = tfl.Model.GetRootAsModel(model.read_bytes(), 0)
    sg = m.Subgraphs(0)
    by_name = {sg.Tensors(i).Name().decode(): sg.Tensors(i) for i in range(sg.TensorsLength())}
    seen = 0
    for x in r["layers"]:
        for t in x["inputs"] + x["outputs"] + x["weights"]:
            if t["name"] not in by_name:  # a name mcuforge gave a fused or new tensor
                continue
            ref = by_name[t["name"]]
            q = ref.Quantization()
            assert t["shape"] == ref.ShapeAsNumpy().tolist()
            if q is None or q.ScaleLength() == 0:  # not quantized (the reshape's shape)
                assert t["quant"] is None
                continue
            scales = q.ScaleAsNumpy().tolist()
            zps = q.ZeroPointAsNumpy().tolist()
            if t["quant"]["per_channel"]:
                assert len(scales) > 1 and len(t["quant"]["scale"]) == len(scales)
                assert t["quant"]["axis"] == q.QuantizedDimension()
                np.testing.assert_allclose(t["quant"]["scale"], np.float32(scales), rtol=1e-7)
                assert t["quant"]["zero_point"] == zps
            else:
                np.testing.assert_allclose(t["quant"]["scale"], np.float32(scales[0]), rtol=1e-7)
                assert [t["quant"]["zero_point"]] == zps
            seen += 1
    assert seen >= 40
    convs = [x for x in r["layers"] if x["op"] == "conv2d"]
    assert all(x["weights"][0]["quant"]["per_channel"] for x in convs)


CALL = re.compile(r"^    (l\d+_\w+)\((.*)\);$", re.M)
ADDR = re.compile(r"&arena\.bytes\[(\d+)\]")


def test_arena_offsets_are_the_generated_cs(kws, tmp_path):
    """Each call of the compiled invoke reads its inputs at the offsets where their producers'
    outputs are reported, writes its outputs at the reported offsets and gets its scratch at
    the reported scratch offset; the arena array is as large as reported."""
    model, r, _ = kws
    out = tmp_path / "c"
    res = _cli("compile", str(model), "--board", BOARD, "--name", "model", "-o", str(out))
    assert res.returncode == 0, res.stderr
    c = (out / "model.c").read_text()
    assert f"uint8_t bytes[{r['arena_bytes']}];" in c
    invoke = c.split("int model_invoke(void) {")[1].split("return 0;")[0]
    calls = {name: [int(a) for a in ADDR.findall(args)] for name, args in CALL.findall(invoke)}
    where = {b["name"]: b["offset"] for b in r["arena"]}
    for x in r["layers"]:
        for t in x["outputs"]:
            where[t["name"]] = t["offset"]
    coded = [x for x in r["layers"] if x["kernel"]]
    assert [x["kernel"] for x in coded] == list(calls) and len(calls) == 12
    for x in coded:
        addrs = calls[x["kernel"]]
        n_in, n_out = len(x["inputs"]), len(x["outputs"])
        assert addrs[:n_in] == [where[t["name"]] for t in x["inputs"]], x["kernel"]
        assert addrs[n_in:n_in + n_out] == [t["offset"] for t in x["outputs"]], x["kernel"]
        scratch = addrs[n_in + n_out:]
        if x["scratch"]:
            [s] = x["scratch"]
            assert scratch[0] == s["offset"]
            assert all(s["offset"] <= a < s["offset"] + s["bytes"] for a in scratch)
        else:
            assert scratch == []
    assert sum(1 for x in coded if x["scratch"]) == 10  # conv / depthwise / fc scratch
    # each layer's generated bytes: its kernel's const arrays in the C, element size x count
    size = {"int8_t": 1, "uint8_t": 1, "int16_t": 2, "int32_t": 4, "float": 4}
    arrays = re.findall(r"^static const (\w+) (l\d+_\w+)\[(\d+)\]", c, re.M)
    assert arrays
    for x in coded:
        own = [size[t] * int(n) for t, name, n in arrays if name.startswith(x["kernel"] + "_")]
        assert x["flash_bytes"] == sum(own), x["kernel"]
    assert r["flash_weight_bytes"] == sum(size[t] * int(n) for t, _, n in arrays) \
        == sum(x["flash_bytes"] for x in r["layers"])


def test_arena_buffers_never_collide(kws):
    """The picture's rectangles: inside the arena, and no two buffers live in one layer share a
    byte, except a layer's output written over its input in place (`in_place_of`)."""
    _, r, _ = kws
    bufs = r["arena"]
    assert bufs and all(0 <= b["offset"] and b["offset"] + b["bytes"] <= r["arena_bytes"]
                        for b in bufs)
    assert max(b["offset"] + b["bytes"] for b in bufs) == r["arena_bytes"]
    for i, a in enumerate(bufs):
        for b in bufs[i + 1:]:
            if a["first"] <= b["last"] and b["first"] <= a["last"] \
                    and b["in_place_of"] != a["name"] and a["in_place_of"] != b["name"]:
                assert a["offset"] + a["bytes"] <= b["offset"] or \
                    b["offset"] + b["bytes"] <= a["offset"], (a["name"], b["name"])
    assert {b["kind"] for b in bufs} == {"input", "output", "tensor", "scratch"}


def test_layer_instructions_are_benchs(kws):
    """Each layer's instructions are `bench --per-layer`'s, and add up to its whole invoke
    within the counter's resolution."""
    model, r, _ = kws
    res = _cli("bench", "--board", BOARD, "--per-layer", "--no-tflm", "--json", str(model))
    assert res.returncode == 0, res.stderr
    [b] = json.loads(res.stdout)
    mine = {x["kernel"]: x["instructions"] for x in r["layers"] if x["kernel"]}
    assert mine == {x["layer"]: x["instructions"] for x in b["layers"]}
    total = sum(mine.values())
    assert total == b["layers_instructions"] == r["profile"]["layers_instructions"]
    assert r["profile"]["instructions"] == b["instructions"]
    assert abs(total - b["instructions"]) <= 2 * TICK
    assert all(v > 0 for v in mine.values())
    # the layer without code (the flatten reshape) has no instructions
    assert [x["op"] for x in r["layers"] if not x["kernel"]] == ["reshape"]


def test_totals_against_the_boards_memory(kws):
    model, r, _ = kws
    toml = tomllib.loads((ROOT / "boards" / BOARD / "board.toml").read_text())
    mem, p = r["memory"], r["profile"]
    assert mem["flash_size"] == toml["flash"]["size"] and mem["ram_size"] == toml["ram"]["size"]
    assert mem["flash_used"] == p["flash_bytes"] > r["flash_weight_bytes"]
    assert mem["ram_used"] == p["ram_bytes"] + p["stack_bytes"]
    assert p["ram_bytes"] >= r["arena_bytes"]  # the arena is in bss
    # the ELF's text holds the generated constants, the model's weights packed
    assert r["weight_bytes"] == sum(x[2] for x in _tflite_layers(model))


# ---- the HTML ---------------------------------------------------------------------------------

VOID = {"meta", "img", "br", "hr", "link", "input", "col", "area", "base", "wbr", "source"}


class _Checker(HTMLParser):
    """Every element closed in order (void elements aside); collects tags, images and text."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.stack, self.errors, self.tags, self.images, self.text = [], [], [], [], []

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        if tag == "img":
            self.images.append(dict(attrs))
        if tag not in VOID:
            self.stack.append(tag)

    def handle_endtag(self, tag):
        if tag in VOID:
            return
        if not self.stack or self.stack[-1] != tag:
            self.errors.append(f"</{tag}> closes {self.stack[-1:] or 'nothing'}")
        else:
            self.stack.pop()

    def handle_data(self, data):
        self.text.append(data)


def _check_html(page: str) -> _Checker:
    assert page.startswith("<!DOCTYPE html>")
    p = _Checker()
    p.feed(page)
    p.close()
    assert not p.errors and not p.stack, (p.errors, p.stack)
    assert "script" not in p.tags  # nothing in the page runs
    return p


def _png_size(src: str) -> tuple:
    head = "data:image/png;base64,"
    assert src.startswith(head)
    data = base64.b64decode(src[len(head):], validate=True)
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
    w, h = int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
    from PIL import Image  # matplotlib's own dependency: the whole image decodes
    img = Image.open(io.BytesIO(data))
    img.load()
    assert img.size == (w, h)
    return w, h


def test_html_is_valid_and_self_contained(kws):
    _, r, page = kws
    p = _check_html(page)
    assert len(p.images) == 2
    for img in p.images:
        w, h = _png_size(img["src"])
        assert w > 100 and h > 100
    assert not re.search(r"""(src|href)=["']?(https?:|//|file:)""", page)  # nothing fetched
    assert p.tags.count("tr") >= len(r["layers"]) + 1
    text = " ".join(p.text)
    for x in r["layers"]:
        if x["instructions"]:
            assert f"{x['instructions']:,}" in text


def _hostile_model(tmp_path, name: str, file_name: str) -> Path:
    """An int8 conv (per-channel weights) whose tensors are named `name` + a suffix, written
    with the tflite package's builders."""
    q = dict(scale=[0.05], zp=[3])
    w = np.arange(-8, 8, dtype=np.int8).reshape(2, 2, 2, 2)
    data = build([T(name + "x", [1, 4, 4, 2], **q),
                  T(name + "w", [2, 2, 2, 2], data=w, scale=[0.01, 0.02], zp=[0, 0], axis=0),
                  T(name + "b", [2], "INT32", data=np.array([5, -7], np.int32),
                    scale=[0.0005, 0.001], zp=[0, 0]),
                  T(name, [1, 4, 4, 2], scale=[0.1], zp=[-2])],
                 [("CONV_2D", [0, 1, 2], [3], conv_opts())], [0], [3])
    path = tmp_path / file_name
    path.write_bytes(data)
    return path


HOSTILE = "</td><script>document.title='pwned'</script><b>"
HOSTILE_FILE = "m<img src=x onerror=alert(1)>.tflite"


def test_model_strings_are_escaped(tmp_path):
    path = _hostile_model(tmp_path, HOSTILE, HOSTILE_FILE)
    r, page = _report(tmp_path, path)
    p = _check_html(page)
    assert HOSTILE not in page and "<script" not in page and "<img src=x" not in page
    assert "&lt;/td&gt;&lt;script&gt;" in page  # shown, escaped
    assert len(p.images) == 2  # the file name's <img> is text, not an element
    text = "".join(p.text)
    assert HOSTILE in text and HOSTILE_FILE in text  # the reader sees the names as they are
    # the JSON keeps them exactly
    assert r["model"] == HOSTILE_FILE
    [x] = r["layers"]
    assert x["outputs"][0]["name"] == HOSTILE and x["inputs"][0]["name"] == HOSTILE + "x"
    assert x["weights"][0]["quant"] == {"per_channel": True, "axis": 0, "scale": [
        pytest.approx(0.01), pytest.approx(0.02)], "zero_point": [0, 0]}
    assert x["macs"] == 4 * 4 * 2 * 2 * 2 * 2  # SAME padding: 16 pixels, 2x2x2 taps, 2 outs
    assert x["weight_bytes"] == 16 + 8
    assert r["board"] is None and r["profile"] is None and r["memory"] is None


def test_a_browser_renders_it_without_running_model_strings(tmp_path):
    """Headless Chromium loads the page: the DOM it builds has the two pictures, the layer
    table, the hostile name as text and no script; the page title is the report's."""
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        unavailable("no Chromium installed (apt-get install chromium; .ci/setup does)")
    path = _hostile_model(tmp_path, HOSTILE, HOSTILE_FILE)
    _report(tmp_path, path)
    page = tmp_path / "r.html"
    res = subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu",
                          "--user-data-dir=" + str(tmp_path / "profile"), "--dump-dom",
                          page.as_uri()], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    dom = res.stdout
    p = _Checker()
    p.feed(dom)
    assert "script" not in p.tags and p.tags.count("img") == 2
    assert "pwned" not in re.search(r"<title>(.*?)</title>", dom, re.S).group(1)
    assert html.escape(HOSTILE, quote=False) in dom


# ---- command line -----------------------------------------------------------------------------

def test_defaults_and_errors(tmp_path):
    path = _hostile_model(tmp_path, "t", "small.tflite")
    res = _cli("report", str(path), cwd=tmp_path)
    assert res.returncode == 0 and (tmp_path / "report.html").stat().st_size > 1000
    res = _cli("report", str(path), "--json", cwd=tmp_path)
    assert res.returncode == 0 and json.loads((tmp_path / "report.json").read_text())["layers"]
    for args, words in ((["--board", "no-such-board"], "unknown board"),
                        (["-o", str(tmp_path / "missing" / "r.html")], "cannot write"),
                        ([], "")):
        model = str(path) if args else str(tmp_path / "absent.tflite")
        res = _cli("report", model, *args)
        assert res.returncode == 2 and res.stderr.startswith("mcuforge: error:"), res.stderr
        assert words in res.stderr and "Traceback" not in res.stderr


def test_a_board_without_emulator_gives_an_estimate(tmp_path):
    """nucleo-l4r5zi: no instructions, flash and RAM estimated against board.toml's sizes."""
    model = mlperf_model("ad01_int8")
    r, page = _report(tmp_path, model, "--board", "nucleo-l4r5zi")
    toml = tomllib.loads((ROOT / "boards" / "nucleo-l4r5zi" / "board.toml").read_text())
    mem = r["memory"]
    assert (mem["flash_size"], mem["ram_size"]) == (toml["flash"]["size"], toml["ram"]["size"])
    assert mem["ram_used"] > r["arena_bytes"] and mem["flash_used"] > r["flash_weight_bytes"]
    assert "estimate" in mem["how"] and r["profile"] is None
    assert all(x["instructions"] is None for x in r["layers"])
    assert r["macs"] == sum(m for _, m, _ in _tflite_layers(model))
    _check_html(page)


def test_control_flow_model_on_a_board(tmp_path):
    """An IF with a float FC in its then-branch (tests/test_bench_per_layer.py's model): the
    if is one layer with its branches' MACs and weights, its subgraph memory one hatched
    scratch buffer; its bool condition input is fed to the board run (bench's inputs used to
    fail on bool: np.iinfo)."""
    require_tools("arm-none-eabi-gcc", "qemu-system-arm")
    from test_bench_per_layer import _if_model
    path = tmp_path / "if.tflite"
    path.write_bytes(_if_model())
    r, page = _report(tmp_path, path, "--board", BOARD)
    fc, cond = r["layers"]
    assert (fc["op"], fc["macs"], fc["weight_bytes"]) == ("fully_connected", 4 * 8, 4 * 8 * 4)
    assert (cond["op"], cond["macs"], cond["weight_bytes"]) == ("if", 4 * 4, 4 * 4 * 4)
    [s] = cond["scratch"]
    assert {"name": "y/scratch", "kind": "scratch", "offset": s["offset"], "bytes": s["bytes"],
            "first": 1, "last": 1, "in_place_of": None} in r["arena"]
    assert fc["instructions"] > 0 and cond["instructions"] > 0
    assert abs(r["profile"]["instructions"] - fc["instructions"] - cond["instructions"]) \
        <= 2 * TICK
    _check_html(page)


def test_the_report_is_deterministic(tmp_path):
    """The same model gives the same bytes (the pictures carry no date)."""
    path = _hostile_model(tmp_path, "t", "small.tflite")
    pages = []
    for k in range(2):
        res = _cli("report", str(path), "-o", str(tmp_path / f"{k}.html"))
        assert res.returncode == 0, res.stderr
        pages.append((tmp_path / f"{k}.html").read_bytes())
    assert pages[0] == pages[1]
