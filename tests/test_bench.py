"""`mcuforge bench --json` and `mcuforge info --json`: figures consistent with each other and
with TFLM's own report on the same model."""
import json
import subprocess
import sys

from conftest import mlperf_model
from mcuforge.tools.demo import demo_tflite_bytes
from mcuforge.tools.tflm import arena_bytes

KEYS = {"model", "board", "macs", "arena_bytes", "ram_bytes", "weight_bytes", "latency_us",
        "tflm_arena_bytes", "tflm_latency_us"}


def _cli(*args) -> str:
    r = subprocess.run([sys.executable, "-m", "mcuforge.cli", *args], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return r.stdout


def test_bench_json_on_demo_model(tmp_path):
    model = tmp_path / "demo.tflite"
    model.write_bytes(demo_tflite_bytes())
    rows = json.loads(_cli("bench", str(model), "--json", "--iterations", "5"))
    assert len(rows) == 1 and KEYS <= set(rows[0])
    r = rows[0]
    info = json.loads(_cli("info", str(model), "--json"))
    assert r["board"] == "host" and r["macs"] == info["macs"] > 0
    # (in place, the arena may be below the layer-by-layer bound)
    assert r["arena_bytes"] == info["arena_bytes"] > 0 and info["lower_bound_bytes"] > 0
    # the arena (rounded up to its int32 alignment) is the generated code's only static RAM,
    # as measured from the object file
    assert r["arena_bytes"] <= r["ram_bytes"] < r["arena_bytes"] + 4
    assert r["tflm_arena_bytes"] == arena_bytes(str(model))["head"]
    assert r["litert_latency_us"] > 0  # LiteRT's built-in kernels, timed in the same run
    table = _cli("bench", str(model), "--iterations", "5")
    assert "LiteRT us" in table and "lat/LiteRT" in table
    assert r["latency_us"] > 0 and r["tflm_latency_us"] > 0


def test_info_matches_the_model():
    info = json.loads(_cli("info", str(mlperf_model("kws_ref_model")), "--json"))
    # figures published for this model (shared/models/mlperf_tiny/README.md)
    assert info["macs"] == 2_656_768
    assert info["ops"] == {"conv2d": 5, "depthwise_conv2d": 4, "avg_pool2d": 1, "reshape": 1,
                           "fully_connected": 1, "softmax": 1}
    assert info["inputs"][0]["shape"] == [1, 49, 10, 1]


def test_board_bench_json_adds_target_figures():
    model = mlperf_model("ad01_int8")
    rows = [json.loads(_cli("bench", "--board", "mps2-an386", str(model), "--json"))[0]
            for _ in range(2)]
    r = rows[0]
    assert KEYS | {"instructions", "macs_per_instruction", "flash_bytes", "stack_bytes"} <= set(r)
    assert rows[0]["instructions"] == rows[1]["instructions"]  # deterministic
    assert r["macs_per_instruction"] == round(r["macs"] / r["instructions"], 3)
    assert r["flash_bytes"] > r["weight_bytes"] and r["ram_bytes"] >= r["arena_bytes"]
