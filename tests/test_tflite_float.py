"""The float MLPerf Tiny TFLite models through the same loop IR and C printer, against LiteRT:
within 1e-4 x max|output| on 50 random inputs (2e-2 for the hybrid KWS model, whose int8
weights LiteRT runs with activations quantized on the fly), also under ASan/UBSan."""
import numpy as np
import pytest

from conftest import mlperf_model
from mcuforge import runner
from mcuforge.api import load

CASES = [("ad01_fp32", 1e-4), ("pretrainedResnet", 1e-4), ("vww_96_float", 1e-4),
         ("kws_ref_model_float32", 2e-2)]


def litert(path, x):
    from ai_edge_litert.interpreter import Interpreter
    it = Interpreter(model_path=str(path))
    it.allocate_tensors()
    i, o = it.get_input_details()[0]["index"], it.get_output_details()[0]["index"]
    out = []
    for row in x:
        it.set_tensor(i, row)
        it.invoke()
        out.append(it.get_tensor(o).copy())
    return np.stack(out)


@pytest.mark.parametrize("stem,tolerance", CASES)
@pytest.mark.parametrize("sanitize", [False, True], ids=["O2", "asan"])
def test_float_model_matches_litert(stem, tolerance, sanitize):
    path = mlperf_model(stem)
    t = load(path).tensors[load(path).inputs[0]]
    x = np.random.default_rng(11).standard_normal((50, *t.shape)).astype(np.float32)
    got = runner.run(path, x, sanitize=sanitize)
    ref = litert(path, x).reshape(got.shape)
    err = np.abs(got - ref).max() / np.abs(ref).max()
    assert err <= tolerance, f"{stem}: max error {err:.2e} of max|output|"
