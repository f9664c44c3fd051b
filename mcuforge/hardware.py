"""Run a model on a real board: the firmware (inputs built in, as under QEMU) is built, flashed
with the board's tool (board.toml's probe: `make flash`'s command) and its UART read back over
a serial port with pyserial; the lines are those QEMU's semihosting gives (target.parse_output).

Opening the port before flashing catches the output from the first line: the flash tool
resets the board, which then runs the model once and prints "done"."""
from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

from mcuforge.ir.errors import BuildError, McuforgeError

from .board import Board, load_board

BAUD = 115200  # every real board's uart.c
PYSERIAL_HINT = "pip install 'mcuforge[boards]' (pyserial)"


def open_port(port: str, baud: int = BAUD):
    """The serial port, opened with a short read timeout (the caller keeps the deadline)."""
    try:
        import serial
    except ImportError:
        raise McuforgeError(f"reading {port} needs pyserial: {PYSERIAL_HINT}") from None
    try:
        return serial.Serial(port, baud, timeout=0.2)
    except (serial.SerialException, OSError, ValueError) as e:
        raise McuforgeError(f"cannot open the serial port {port}: {e}; check the board is "
                            f"plugged in and the port's name (ls /dev/ttyACM* /dev/ttyUSB*), "
                            f"and that you may use it (the dialout group)") from None


def read_transcript(ser, port: str, start: str, timeout: float) -> str:
    """The lines from `start` (the firmware's first line) up to "done": what came before it
    (a previous run's tail, noise while the board resets) is dropped. A firmware error line,
    a silent port or a transcript cut short is an error naming the port."""
    deadline = time.monotonic() + timeout
    buf, lines, started = b"", [], False
    while time.monotonic() < deadline:
        chunk = ser.read(4096)
        if not chunk:
            continue
        buf += chunk
        *complete, buf = buf.split(b"\n")
        for raw in complete:
            line = raw.decode("ascii", "replace").strip("\r\x00 ")
            if not started:
                started = line.endswith(start)  # noise may share the marker's line
                if started:
                    lines.append(start)
                continue
            if line.startswith("mcuforge: "):  # invoke failed, hard fault
                raise BuildError(f"the board reported on {port}: {line}\n" + "\n".join(lines))
            lines.append(line)
            if line == "done":
                return "\n".join(lines) + "\n"
    if not started:
        raise BuildError(f"nothing from the firmware on {port} within {timeout:.0f} s (its "
                         f"first line, '{start}', never came): check the port is the board's "
                         f"virtual COM port at {BAUD} baud, and that the board was reset "
                         f"after flashing")
    raise BuildError(f"the firmware's output on {port} stopped after {len(lines)} lines within "
                     f"{timeout:.0f} s, before its last line 'done' (a reset or a crash?):\n"
                     + "\n".join(lines))


def flash(board: Board, project: Path, name: str) -> None:
    """Program the board with `make flash`'s command (the image built first)."""
    command = board.flash_command(name)
    if not command:
        raise McuforgeError(f"{board.name} has no flash tool; real boards: "
                            f"nucleo-l4r5zi, stm32f746g-disco, nrf52840dk")
    if shutil.which(command[0]) is None:
        raise McuforgeError(f"{command[0]} not found (it flashes {board.name}): "
                            f"{board.flash_hint()}")
    if board.flash_image == "hex":
        r = subprocess.run(["make", "-s", "-C", str(project), f"{name}.hex"],
                           capture_output=True, text=True)
        if r.returncode != 0:
            raise BuildError(f"making {name}.hex failed:\n{r.stdout}{r.stderr}")
    r = subprocess.run(command, cwd=project, capture_output=True, text=True)
    if r.returncode != 0:
        raise BuildError(f"flashing {board.name} failed ({' '.join(command)}):\n"
                         f"{r.stdout}{r.stderr}")


def run_on_hardware(model, arrays: list, board_name: str, port: str, workdir: Path,
                    do_flash: bool = True, timeout: float = 60.0, baud: int = BAUD,
                    wait_message=None):
    """Run [N, ...] input arrays on a real board; a target.TargetRun (no instruction counts:
    the ticks are core clock cycles). `do_flash=False`: the firmware is already on the board,
    the user resets it (`wait_message` is told so)."""
    from .target import TargetRun, build_firmware, parse_output
    board = load_board(board_name)
    if board.emulated or board.family != "cortex-m" or not board.probe_tool:
        raise McuforgeError(f"--port is for real boards (nucleo-l4r5zi, stm32f746g-disco, "
                            f"nrf52840dk), not {board.name}")
    n = len(arrays[0])
    vectors = [[a[i] for a in arrays] for i in range(n)]
    name = "model"
    project, elf, result = build_firmware(model, board, vectors, Path(workdir), name=name)
    ser = open_port(port, baud)  # before flashing: the board starts printing at once
    try:
        ser.reset_input_buffer()
        if do_flash:
            flash(board, project, name)
        elif wait_message is not None:
            print(f"waiting {timeout:.0f} s for {board.name} on {port}: press its reset button",
                  file=wait_message)
        text = read_transcript(ser, port, f"mcuforge: {name} on {board.name}", timeout)
    finally:
        ser.close()
    try:
        outs, ticks, stack = parse_output(text, result.graph, board)
    except ValueError as e:  # a damaged line (noise on the wire): not silently wrong outputs
        raise BuildError(f"unreadable firmware output on {port} ({e}):\n{text}") from None
    if len(ticks) != n or any(len(o) != n for o in outs):
        raise BuildError(f"the firmware on {port} reported {len(ticks)} of {n} inferences")
    return TargetRun(outs, ticks, [], stack, elf)


def run(model, inputs, board: str, port: str, do_flash: bool = True, timeout: float = 60.0,
        wait_message=None):
    """runner.run on a real board: the same inputs and results (one array, or a dict by
    output name), built in a cache folder keyed by the model, board and inputs."""
    import hashlib
    from .api import load
    from .build import cache_lock, cache_root
    from .runner import shape_outputs, split_inputs
    graph = load(model)
    arrays, batched = split_inputs(graph, inputs)  # bad inputs fail before any build
    data = Path(model).read_bytes() if not isinstance(model, bytes) else model
    key = hashlib.sha256(data + board.encode() + b"".join(a.tobytes() for a in arrays))
    workdir = cache_root() / "board" / key.hexdigest()[:24]
    with cache_lock(workdir):
        outs = run_on_hardware(model, arrays, board, port, workdir, do_flash, timeout,
                               wait_message=wait_message).outputs
    return shape_outputs(graph, outs, batched)
