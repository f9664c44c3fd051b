"""Lowerings: data movement and slicing kernels for TFLite's operators (any element type).

Registered with `@lowers(op, when=...)` so they serve only the nodes they accept; see
codegen_c/lower/__init__.py.
"""
from __future__ import annotations

from . import lowers  # noqa: F401
