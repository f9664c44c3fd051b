"""mcuforge: compile neural networks into standalone, static-memory C for microcontrollers."""
from .api import CompileResult, compile, load  # noqa: F401
from .version import version as _version
from ir.errors import McuforgeError, ModelError, UnsupportedOpError  # noqa: F401

__version__ = _version()
