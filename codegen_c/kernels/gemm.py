"""Schedules of int8 convolutions and fully connected layers onto the GEMM micro-kernels."""
from __future__ import annotations
