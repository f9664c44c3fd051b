"""TFLite converters: data movement operators (GATHER, TRANSPOSE, MIRROR_PAD, SPACE_TO_BATCH_ND, ...).

Registered in `tflite_ops.CONVERTERS` by `@op`; see tflite_ops for the conventions.
"""
from __future__ import annotations

from .tflite_ops import op  # noqa: F401
