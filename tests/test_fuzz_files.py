"""The model-file fuzzer (mcuforge/tools/fuzz_files.py): a fixed-seed small run has no traceback,
crash, hang or catch-all error, and its classifier does see each of those when they happen."""
import os
import signal
import time

import pytest

from mcuforge.tools import fuzz_files
from mcuforge.tools.fuzz_files import fuzz, mutate, run_case, seed_models

CASES = 200  # about 30 s


def test_fixed_seed_run_is_clean():
    r = fuzz(CASES, seed=7, timeout=30)
    assert r.tried == CASES
    assert r.bad == 0, r.text()
    # the mutations reach both outcomes a user can meet
    assert r.counts["error"] > CASES // 4 and r.counts["ok"] > 0, r.text()


@pytest.mark.parametrize("seed,k", [(5, 282), (5, 1924), (6, 486), (7, 359)])
def test_found_cases_are_clean_errors(seed, k):
    """Files larger sweeps found (`mcuforge fuzz-files --cases 2000 --seed 5|6|7`): a zero-sized
    channel dimension (0 % 0 in a converter), a pool over a vector (an index past its shape), a
    conv whose weights lost their quantization, a QuantizeLinear with 1 zero point for 54 scales.
    Each was a traceback or a catch-all error before."""
    case_seed, label, fmt, kind, data = fuzz_files.make_case(seed_models(), seed, k)
    assert case_seed == seed * 1_000_003 + k
    r = run_case(data, timeout=30)
    assert r["kind"] in ("error", "ok"), (label, kind, r)


def test_mutations_are_reproducible_and_change_the_file():
    import random
    for label, fmt, data in seed_models():
        for kind in fuzz_files.MUTATIONS:
            a = mutate(data, fmt, kind, random.Random(3))
            assert a == mutate(data, fmt, kind, random.Random(3)), (label, kind)
            assert a != data or kind == "quant", (label, kind)


def _raise():
    raise KeyError("boom")


@pytest.mark.parametrize("behaviour,kind", [
    (_raise, "traceback"),
    (lambda: os.kill(os.getpid(), signal.SIGSEGV), "crash"),
    (lambda: time.sleep(30), "hang"),
    (lambda: bytearray(8 << 30), "traceback"),  # past the memory limit: MemoryError
])
def test_classifier_sees_failures(behaviour, kind, monkeypatch):
    monkeypatch.setattr(fuzz_files, "exercise", lambda data: behaviour())
    r = run_case(b"", timeout=2)
    assert r["kind"] == kind, r
