"""`mcuforge demo`: the README's first command, end to end."""
import subprocess
import sys


def test_demo_command_passes(tmp_path):
    r = subprocess.run([sys.executable, "-m", "mcuforge.cli", "demo", "--synthetic", "-o", str(tmp_path / "d")],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "PASS: bit-exact with TFLM" in r.stdout
    assert (tmp_path / "d" / "demo.c").is_file() and (tmp_path / "d" / "demo").is_file()
