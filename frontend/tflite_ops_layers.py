"""TFLite converters: layer operators (BATCH_MATMUL, TRANSPOSE_CONV, L2_POOL_2D, RESIZE_*, ...).

Registered in `tflite_ops.CONVERTERS` by `@op`; see tflite_ops for the conventions.
"""
from __future__ import annotations

from .tflite_ops import op  # noqa: F401
