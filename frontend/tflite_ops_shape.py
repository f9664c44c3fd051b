"""TFLite converters: shape and slicing operators (SLICE, STRIDED_SLICE, SPLIT, PACK, SHAPE, FILL, ...); shape computations fold to constants.

Registered in `tflite_ops.CONVERTERS` by `@op`; see tflite_ops for the conventions.
"""
from __future__ import annotations

from .tflite_ops import op  # noqa: F401
