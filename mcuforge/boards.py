"""Board definitions: boards/<name>/board.toml, data rather than code."""
from __future__ import annotations

import tomllib
from dataclasses import dataclass

from .errors import McuforgeError
from .resources import data_dir


@dataclass(frozen=True)
class Board:
    name: str
    description: str
    files: dict  # project file name -> template path under templates/
    cc: str = "gcc"
    ram_bytes: int | None = None
    flash_bytes: int | None = None


def board_names() -> list:
    return sorted(p.parent.name for p in data_dir("boards").glob("*/board.toml"))


def load_board(name: str) -> Board:
    path = data_dir("boards") / name / "board.toml"
    if not path.is_file():
        raise McuforgeError(f"unknown board '{name}'; known boards: {', '.join(board_names())}")
    d = tomllib.loads(path.read_text())
    return Board(name=d["name"], description=d.get("description", ""), files=dict(d["files"]),
                 cc=d.get("cc", "gcc"), ram_bytes=d.get("ram_bytes"),
                 flash_bytes=d.get("flash_bytes"))
