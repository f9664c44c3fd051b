"""Lowerings: TFLite layer ops (batch matmul, transpose conv, L2 pool, resize, int16 layers), bit-exact with TFLM.

Registered with `@lowers(op, when=...)` so they serve only the nodes they accept; see
codegen_c/lower/__init__.py.
"""
from __future__ import annotations

from . import lowers  # noqa: F401
