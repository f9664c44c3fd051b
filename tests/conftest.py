"""Shared test fixtures: where the MLPerf Tiny models are, and a per-session build cache."""
import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
# $MCUFORGE_MLPERF_DIR overrides it (a checkout elsewhere, e.g. a git worktree)
MLPERF_DIR = Path(os.environ.get("MCUFORGE_MLPERF_DIR")
                  or REPO.parent / "shared" / "models" / "mlperf_tiny")
MLPERF_INT8 = ("ad01_int8", "kws_ref_model", "pretrainedResnet_quant", "vww_96_int8",
               "str_ww_ref_model")


def mlperf_model(stem: str) -> Path:
    """Path of a shared MLPerf Tiny model: skipped when absent, a failure when absent in CI."""
    path = MLPERF_DIR / f"{stem}.tflite"
    if not path.exists():
        (pytest.fail if os.environ.get("CI") else pytest.skip)(f"{path} not found")
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
