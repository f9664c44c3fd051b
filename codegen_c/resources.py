"""Where the non-Python parts live (templates/, runtime_c/, boards/), from a checkout or an
installed wheel alike: they are packages, so importlib finds them either way."""
from __future__ import annotations

import functools
from importlib import resources
from pathlib import Path

import jinja2


def data_dir(package: str) -> Path:
    """templates, runtime_c or boards (any of mcuforge's packages: "ir", "codegen_c", ...,
    "mcuforge" itself) as a filesystem path."""
    if package != "mcuforge":  # the layers install as mcuforge.<layer>
        package = f"mcuforge.{package}"
    return Path(str(resources.files(package)))


@functools.lru_cache(maxsize=1)
def _env() -> jinja2.Environment:
    from .names import c_comment, c_string
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(data_dir("templates"))),
        undefined=jinja2.StrictUndefined, keep_trailing_newline=True,
        trim_blocks=True, lstrip_blocks=True, autoescape=False)
    # model strings (names) go through these in every template: see codegen_c/names.py
    env.filters.update(c_comment=c_comment, c_string=c_string)
    return env


def render(template: str, context: dict) -> str:
    return _env().get_template(template).render(**context)
