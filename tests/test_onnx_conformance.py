"""ONNX's own backend test suite through mcuforge (`mcuforge conformance onnx`).

The whole `node` kind runs here (1,884 cases: about 50 s alone on 2 cores, 90 s beside the
rest of the suite under pytest -n 2, so no subset is needed): every
case is imported, compiled to C, built with gcc and run on its data sets. No case may fail
unless conformance.EXCLUSIONS lists it with a reason, and at least 95% of the cases whose
operators all have converters (and whose inputs and outputs have types mcuforge has) pass.
"""
import io
import json
import os
import subprocess
import sys
import time

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from mcuforge.tools import conformance
from mcuforge.tools.conformance import Case, Progress, Result, compare, report, run_cases, summary
from mcuforge.ir.errors import McuforgeError

MIN_PASS_RATE = 0.95
# one xdist worker runs this file (.ci/test: --dist loadgroup), so the module fixture's whole
# run (itself on every core) happens once, not once per worker
pytestmark = pytest.mark.xdist_group("onnx_conformance")


@pytest.fixture(scope="module")
def node_results():
    return conformance.run_onnx("node", jobs=os.cpu_count())


def test_no_case_fails_outside_the_exclusion_list(node_results):
    failed = [r for r in node_results if r.status == "failed" and not r.excluded]
    assert not failed, f"{len(failed)} failures:\n" + "\n".join(
        f"  {r.name}: {r.reason}" for r in failed)


def test_cases_whose_operators_are_supported_pass(node_results):
    s = summary(node_results)
    assert s["total"] > 1500 and s["ops_supported_cases"] > 0
    assert s["pass_rate_ops_supported"] >= MIN_PASS_RATE, report(node_results)


def test_exclusions_name_real_cases_and_say_why(node_results):
    names = {r.name for r in node_results}
    for name, why in conformance.EXCLUSIONS.items():
        assert name in names or not name.startswith("test_"), name
        assert why.strip(), name


# ---- the runner's parts, on small cases made here ----------------------------------------

def test_pool_map_yields_every_result():
    assert sorted(conformance.pool_map(abs, [-3, -1, -2], jobs=2)) == [1, 2, 3]


def test_pool_map_fails_on_a_hung_worker_instead_of_waiting():
    start = time.monotonic()
    with pytest.raises(McuforgeError, match="no worker finished a task in 3 s"):
        list(conformance.pool_map(time.sleep, [0, 600], jobs=2, timeout=3))
    assert time.monotonic() - start < 60  # the sleeping worker was terminated, not awaited


def _case(name, nodes, inputs, outputs, feeds, expected, opset=13, rtol=1e-3, atol=1e-7):
    g = helper.make_graph(nodes, name, inputs, outputs)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    ops = tuple(n.op_type for n in nodes)
    return Case(name, "node", m.SerializeToString(), [(feeds, expected)], rtol, atol,
                conformance.primary_op(name, ops), ops, True)


def _vi(name, shape, elem=TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, elem, shape)


def test_runner_reports_passed_failed_and_unsupported_with_reasons():
    x = np.array([[-1.0, 2.0], [3.0, -4.0]], np.float32)
    relu = [helper.make_node("Relu", ["x"], ["y"])]
    cases = [
        _case("test_relu_ok", relu, [_vi("x", [2, 2])], [_vi("y", [2, 2])], [x],
              [np.maximum(x, 0)]),
        _case("test_relu_wrong_reference", relu, [_vi("x", [2, 2])], [_vi("y", [2, 2])], [x],
              [x]),
        _case("test_unknown_op", [helper.make_node("NoSuchOp", ["x"], ["y"])],
              [_vi("x", [2, 2])], [_vi("y", [2, 2])], [x], [x]),
        # the slope of PRelu as a graph input: tried again with it frozen to its value
        _case("test_prelu_runtime_slope", [helper.make_node("PRelu", ["x", "s"], ["y"])],
              [_vi("x", [2, 2]), _vi("s", [2])], [_vi("y", [2, 2])],
              [x, np.array([0.5, 0.25], np.float32)],
              [np.where(x < 0, x * np.array([0.5, 0.25], np.float32), x)]),
    ]
    results = {r.name: r for r in run_cases(cases, jobs=1)}
    assert results["test_relu_ok"].status == "passed"
    bad = results["test_relu_wrong_reference"]
    assert bad.status == "failed" and "2/4 elements differ" in bad.reason
    assert results["test_unknown_op"].status == "unsupported"
    assert "NoSuchOp" in results["test_unknown_op"].reason
    assert results["test_prelu_runtime_slope"].status == "passed"
    text = report(list(results.values()))
    assert "test_relu_wrong_reference: output 0 'y': 2/4 elements differ" in text


def test_compare_follows_the_onnx_backend_rules():
    a = np.array([1.0, np.nan, np.inf, -np.inf], np.float32)
    assert compare(a, a.copy(), 1e-3, 1e-7) == ""
    assert compare(a + np.float32(1e-4), a, 1e-3, 1e-7) == ""  # within rtol
    assert "1/4 elements differ" in compare(np.array([1.0, np.nan, np.inf, np.inf], np.float32),
                                            a, 1e-3, 1e-7)
    assert "dtype float64" in compare(a.astype(np.float64), a, 1e-3, 1e-7)
    assert "shape [2, 2]" in compare(a.reshape(2, 2), a, 1e-3, 1e-7)
    assert "1/3 elements differ" in compare(np.array([1, 2, 4], np.int64),
                                            np.array([1, 2, 3], np.int64), 1.0, 1.0)  # exact
    assert compare(np.array([True]), np.array([True]), 0, 0) == ""


def test_report_has_a_row_per_operator_failures_and_exclusions(monkeypatch):
    monkeypatch.setitem(conformance.EXCLUSIONS, "test_b", "why it cannot pass yet")
    rs = [Result("test_a", "node", "Add", ("Add",), True, "passed"),
          Result("test_b", "node", "Add", ("Add",), True, "failed", "3/4 differ",
                 excluded="why it cannot pass yet"),
          Result("test_c", "node", "Mul", ("Mul",), True, "failed", "crashed"),
          Result("test_d", "node", "Foo", ("Foo",), False, "unsupported", "Foo: no converter")]
    text = report(rs)
    rows = {ln.split()[0]: ln.split()[1:] for ln in text.splitlines()[1:5] if ln}
    assert rows["Add"] == ["1", "0", "0", "1"] and rows["Mul"] == ["0", "1", "0", "0"]
    assert rows["total"] == ["1", "1", "1", "1"]
    failures = text[text.index("failures"):text.index("known exclusions")]
    assert "test_c: crashed" in failures and "test_b" not in failures
    assert "test_b [failed]: why it cannot pass yet -- 3/4 differ" in text
    s = summary(rs)
    assert s["failed"] == 1 and s["excluded"] == 1 and s["pass_rate_ops_supported"] == 0.5


def test_progress_bar_redraws_on_a_terminal_and_prints_lines_otherwise():
    class Tty(io.StringIO):
        def isatty(self):
            return True

    r = Result("t", "node", "Add", (), True, "passed")
    tty, log = Tty(), io.StringIO()
    for stream in (tty, log):
        bar = Progress(4, stream, every=2)
        for _ in range(4):
            bar.update([r])
    assert tty.getvalue().count("\r") == 4 and tty.getvalue().endswith("\n")
    assert "4/4" in tty.getvalue()
    lines = log.getvalue().splitlines()
    assert len(lines) == 2 and "2/4" in lines[0] and "4/4  passed 4  failed 0" in lines[1]


def test_cli_writes_the_report_and_json(tmp_path):
    out = tmp_path / "results.json"
    r = subprocess.run([sys.executable, "-m", "mcuforge.cli", "conformance", "onnx", "--kind",
                        "simple", "--filter", "_model", "--jobs", "2", "--json", str(out)],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "failures (0)" in r.stdout and "unsupported" in r.stdout
    assert "/" in r.stderr and "passed" in r.stderr  # the progress bar
    data = json.loads(out.read_text())
    results = {d["name"]: d for d in data["results"]}
    assert results["test_single_relu_model"]["status"] == "passed"
    assert results["test_single_relu_model"]["op"] == "Relu"
    assert "string" in results["test_strnorm_model_monday_empty_output"]["reason"]
    assert data["summary"]["total"] == len(results)


def test_cases_of_the_other_kinds_load_with_their_data():
    cases = conformance.load_cases("simple")
    assert cases and all(c.kind == "simple" for c in cases)
    with_data = [c for c in cases if c.data_sets]
    assert with_data and all(len(ins) >= 1 for c in with_data for ins, _ in c.data_sets)
    assert onnx.load_model_from_string(with_data[0].model).graph.node


def test_input_shape_option_fixes_dynamic_onnx_dimensions(tmp_path):
    """compile / run / info --input-shape NAME=D1,D2,...: the shapes reach the frontend."""
    g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "dyn",
                          [_vi("x", ["N", 3, "W"])], [_vi("y", ["N", 3, "W"])])
    path = tmp_path / "dyn.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)]), path)
    x = np.linspace(-1, 1, 2 * 3 * 5, dtype=np.float32).reshape(2, 3, 5)
    np.save(tmp_path / "x.npy", x)
    cli = [sys.executable, "-m", "mcuforge.cli"]
    r = subprocess.run([*cli, "compile", str(path), "-o", str(tmp_path / "out")],
                       capture_output=True, text=True)
    assert r.returncode == 2 and "--input-shape" in r.stderr  # W is unknown
    r = subprocess.run([*cli, "run", str(path), "--input", str(tmp_path / "x.npy"), "--output",
                        str(tmp_path / "y.npy"), "--input-shape", "x=2,3,5"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    np.testing.assert_array_equal(np.load(tmp_path / "y.npy"), np.maximum(x, 0))
    r = subprocess.run([*cli, "compile", str(path), "-o", str(tmp_path / "out"),
                        "--input-shape", "x=1,3,0"], capture_output=True, text=True)
    assert r.returncode == 2 and "positive dimensions" in r.stderr
