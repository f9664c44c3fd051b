"""Shared test fixtures: where the MLPerf Tiny models are, a per-session build cache, and the
one way a test says something it needs is missing (skipped locally, a failure under CI)."""
import importlib
import os
import shutil
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
# beside the repository; MCUFORGE_MLPERF_DIR points elsewhere (a git worktree, a CI cache)
MLPERF_DIR = Path(os.environ.get("MCUFORGE_MLPERF_DIR")
                  or REPO.parent / "shared" / "models" / "mlperf_tiny")
MLPERF_INT8 = ("ad01_int8", "kws_ref_model", "pretrainedResnet_quant", "vww_96_int8",
               "str_ww_ref_model")


def in_ci() -> bool:
    """True under CI (env CI set, and not to 0/false/no), where every test must run."""
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def unavailable(reason: str):
    """Something a test needs is missing: skip it (or, at module level, the whole file) on a
    developer's machine; fail under CI, where a skipped reference would hide a regression."""
    if in_ci():
        pytest.fail(f"{reason} (CI is set: every test must run)", pytrace=False)
    pytest.skip(reason, allow_module_level=True)


def require(module: str):
    """The imported module, or unavailable() when it cannot be imported."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        unavailable(f"{module} is not installed ({e})")


def require_tflm():
    """tflite-micro's Python runtime, or unavailable()."""
    return require("tflite_micro.python.tflite_micro.runtime")


def require_tools(*tools: str):
    """Every named program is on PATH, or unavailable()."""
    for tool in tools:
        if shutil.which(tool) is None:
            unavailable(f"{tool} is not installed")


def mlperf_model(stem: str) -> Path:
    """Path of a shared MLPerf Tiny model, or unavailable() when absent."""
    path = MLPERF_DIR / f"{stem}.tflite"
    if not path.exists():
        unavailable(f"{path} not found")
    return path


@pytest.fixture(autouse=True, scope="session")
def _build_cache(tmp_path_factory):
    """Builds go to a cache private to this test session (and worker)."""
    old = os.environ.get("MCUFORGE_CACHE")
    os.environ["MCUFORGE_CACHE"] = str(tmp_path_factory.mktemp("cache"))
    yield
    if old is None:
        os.environ.pop("MCUFORGE_CACHE", None)
    else:
        os.environ["MCUFORGE_CACHE"] = old
