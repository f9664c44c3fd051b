"""mcuforge: compile neural networks into standalone, static-memory C for microcontrollers.

The layers (ir, frontend, optimizer, codegen_c, templates, runtime_c, boards) are folders at the
repository's top level and install as mcuforge.<layer>; in a checkout this package's path also
covers the repository's root, so `mcuforge.ir` is <root>/ir there. The public API
(`mcuforge.compile`, `load`, `CompileResult`) loads on first use, so importing a layer such as
mcuforge.ir does not load the whole compiler."""
import os as _os

from .version import version as _version

__version__ = _version()

_root = _os.path.dirname(_os.path.dirname(_os.path.abspath(__file__)))
if _os.path.isfile(_os.path.join(_root, "pyproject.toml")) and _os.path.isfile(
        _os.path.join(_root, "ir", "graph.py")):  # a checkout, not site-packages
    __path__.append(_root)  # after this folder: its own subpackages (tools) come first

_API = {"compile": "api", "load": "api", "CompileResult": "api", "McuforgeError": "errors",
        "ModelError": "errors", "UnsupportedOpError": "errors"}


def __getattr__(name):
    if name not in _API:
        raise AttributeError(f"module 'mcuforge' has no attribute {name!r}")
    if _API[name] == "api":
        from . import api as module
    else:
        from .ir import errors as module
    return getattr(module, name)


def __dir__():
    return sorted(list(globals()) + list(_API))
