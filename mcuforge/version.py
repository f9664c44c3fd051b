"""mcuforge's version: the installed distribution's metadata, or pyproject.toml when running
from a source tree that was never installed. Plain data: generated files carry it in their
stamp (mcuforge/stamp.py)."""
from __future__ import annotations

import tomllib
from importlib import metadata
from pathlib import Path


def version() -> str:
    try:
        return metadata.version("mcuforge")
    except metadata.PackageNotFoundError:
        pass
    try:  # a checkout: the version pyproject.toml declares
        toml = Path(__file__).resolve().parents[1] / "pyproject.toml"
        return tomllib.loads(toml.read_text())["project"]["version"]
    except (OSError, KeyError, tomllib.TOMLDecodeError):
        return "0+unknown"
