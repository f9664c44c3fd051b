"""ONNX converters: see frontend/onnx.py for the conventions."""
from __future__ import annotations
