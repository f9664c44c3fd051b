"""mcuforge: compile neural networks into standalone, static-memory C for microcontrollers."""
from .api import CompileResult, compile, load  # noqa: F401
from ir.errors import McuforgeError, ModelError, UnsupportedOpError  # noqa: F401

__version__ = "0.1.0"
