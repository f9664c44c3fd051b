"""Lowerings: see codegen_c/lower/__init__.py for the conventions."""
from __future__ import annotations
