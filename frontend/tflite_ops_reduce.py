"""TFLite converters: reductions and arg-reductions (SUM, REDUCE_MAX, ARG_MAX, CUMSUM, ...).

Registered in `tflite_ops.CONVERTERS` by `@op`; see tflite_ops for the conventions.
"""
from __future__ import annotations

from .tflite_ops import op  # noqa: F401
