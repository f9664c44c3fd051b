"""TFLite converters: binary elementwise, comparison and logical operators (SUB, DIV, EQUAL, ...).

Registered in `tflite_ops.CONVERTERS` by `@op`; see tflite_ops for the conventions.
"""
from __future__ import annotations

from .tflite_ops import op  # noqa: F401
