"""The target seam: every board's declared ISA features (board.toml `features`, read into
ir.target.Target) are exactly what its compiler reports for the board's own CPU flags
(__ARM_FEATURE_DSP, __ARM_FEATURE_MVE predefined by gcc), so a schedule never picks a DSP or
Helium kernel for a core without it, nor leaves it unused where the core has it."""
from __future__ import annotations

import subprocess

import pytest

from mcuforge.ir.target import HOST, Target
from mcuforge.board import board_names, load_board

from conftest import require_tools


def predefined(cross: str, cflags: tuple) -> set:
    r = subprocess.run([cross + "gcc", *cflags, "-dM", "-E", "-"], input="", text=True,
                       capture_output=True, check=True)
    return {line.split()[1] for line in r.stdout.splitlines() if line.startswith("#define")}


@pytest.mark.parametrize("name", [n for n in board_names() if load_board(n).family != "host"])
def test_features_match_the_compiler(name):
    b = load_board(name)
    require_tools(b.cross + "gcc")
    macros = predefined(b.cross, b.cflags)
    t = b.target()
    assert t.dsp == ("__ARM_FEATURE_DSP" in macros), (name, sorted(t.features))
    assert t.mve == ("__ARM_FEATURE_MVE" in macros), (name, sorted(t.features))
    assert t.flash_bytes == b.flash_size and t.ram_bytes == b.ram_size


def test_host_and_budget():
    t = load_board("host").target()
    assert t.features == HOST.features == frozenset() and t.budget is None
    assert load_board("mps2-an386").target(flash_budget=1000).budget == 1000
    assert load_board("mps2-an386").target().budget == load_board("mps2-an386").flash_size
    with pytest.raises(ValueError, match="unknown features"):
        Target("x", features=frozenset({"neon"}))
