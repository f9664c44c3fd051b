"""The model-file fuzzer (mcuforge/fuzz_files.py): a fixed-seed small run has no traceback,
crash, hang or catch-all error, and its classifier does see each of those when they happen."""
import os
import signal
import time

import pytest

from mcuforge import fuzz_files
from mcuforge.fuzz_files import fuzz, mutate, run_case, seed_models

CASES = 200  # about 30 s


def test_fixed_seed_run_is_clean():
    r = fuzz(CASES, seed=7, timeout=30)
    assert r.tried == CASES
    assert r.bad == 0, r.text()
    # the mutations reach both outcomes a user can meet
    assert r.counts["error"] > CASES // 4 and r.counts["ok"] > 0, r.text()


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
