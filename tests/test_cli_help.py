"""Every command's --help runs and is current: the top-level help says what mcuforge takes
(ONNX and TFLite, float and int8/int16), each subcommand says what it does with an example, a
model argument names both formats, and --board lists every board directory (boards/*/board.toml,
read here from the file system)."""
import argparse
import re
import subprocess
import sys
from pathlib import Path

import pytest

from mcuforge.cli import main, parser

ROOT = Path(__file__).resolve().parent.parent
BOARDS = sorted(p.parent.name for p in (ROOT / "boards").glob("*/board.toml"))
COMMANDS = sorted(next(a for a in parser()._actions
                       if isinstance(a, argparse._SubParsersAction)).choices)


def _help(capsys, *args) -> str:
    with pytest.raises(SystemExit) as e:
        main([*args, "--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: mcuforge")
    return out


def _flat(text: str) -> str:
    """The help without line breaks or indentation (argparse wraps at hyphens too)."""
    return re.sub(r"\s+", "", text)


def test_the_commands_are_found():
    assert {"compile", "run", "info", "bench", "report", "demo"} <= set(COMMANDS)
    assert len(BOARDS) >= 9 and "host" in BOARDS and "nucleo-l4r5zi" in BOARDS


def test_top_level_help_says_what_mcuforge_takes(capsys):
    text = _help(capsys)
    for word in ("ONNX", "TFLite", "float", "int8", "int16", ".onnx", ".tflite"):
        assert word in text, word
    assert "int8 TFLite today" not in text
    for cmd in COMMANDS:  # each command is listed, and shown in an example line
        assert re.search(rf"^\s+mcuforge {re.escape(cmd)}\b", text, re.M), cmd


@pytest.mark.parametrize("cmd", COMMANDS)
def test_subcommand_help(cmd, capsys):
    text = _help(capsys, cmd)
    sub = next(a for a in parser()._actions
               if isinstance(a, argparse._SubParsersAction)).choices[cmd]
    # what it does, and an example of it
    assert sub.description and len(sub.description.split()) >= 6
    assert re.search(rf"example:\n  mcuforge {re.escape(cmd)}\b", text), text
    for a in sub._actions:
        if a.dest in ("model", "models"):  # a model taken: both formats named
            assert ".onnx" in a.help and ".tflite" in a.help, (cmd, a.help)
            assert "the .tflite model" not in text
        if "--board" in a.option_strings:
            flat = _flat(text)
            missing = [b for b in BOARDS if b not in flat]
            assert not missing, (cmd, missing)


def test_help_runs_as_a_program():
    """The installed entry point's --help (a fresh interpreter: no import of test modules)."""
    for cmd in ([], ["report"], ["compile"]):
        r = subprocess.run([sys.executable, "-m", "mcuforge.cli", *cmd, "--help"],
                           capture_output=True, text=True, cwd=ROOT)
        assert r.returncode == 0 and "usage: mcuforge" in r.stdout, r.stderr


def test_info_stays_one_screen(capsys):
    """info's summary of a real model fits one terminal screen (24 lines)."""
    from conftest import mlperf_model
    model = mlperf_model("kws_ref_model")
    assert main(["info", str(model)]) == 0
    out = capsys.readouterr().out
    assert 5 <= len(out.splitlines()) <= 24
    assert "MACs: 2,656,768" in out
