"""Firmware on the emulated Cortex-M boards: outputs equal tflite-micro's, the instruction
counter is validated on a loop of known length, and counts repeat exactly run to run."""
import subprocess

import numpy as np
import pytest

from conftest import MLPERF_INT8, mlperf_model, require_tools
from mcuforge import runner
from mcuforge.tools import tflm
from mcuforge.api import compile as compile_model, load
from mcuforge.board import load_board
from mcuforge.tools.demo import demo_tflite_bytes
from mcuforge.target import run_elf, run_on_board

ARM_BOARDS = ("mps2-an385", "mps2-an386", "mps2-an500", "mps3-an547")


@pytest.fixture(autouse=True)
def _tools():
    require_tools("arm-none-eabi-gcc", "qemu-system-arm")


def _inputs(path, n, seed):
    t = load(path).tensors[load(path).inputs[0]]
    return np.random.default_rng(seed).integers(-128, 128, size=(n, *t.shape)).astype(t.dtype)


def _check(path, board, n=3, seed=5):
    x = _inputs(path, n, seed)
    y = runner.run(path, x, board=board)
    ref = tflm.run(path.read_bytes(), [x])[0]
    assert np.array_equal(y, ref), f"{path.name} on {board}: {np.sum(y != ref)} bytes differ"


@pytest.mark.parametrize("stem", MLPERF_INT8)
def test_mlperf_on_cortex_m4(stem):
    _check(mlperf_model(stem), "mps2-an386")


@pytest.mark.parametrize("stem", MLPERF_INT8)
def test_mlperf_on_cortex_m55(stem):
    """The Helium kernels (runtime_c/mcuforge_mve.h: every convolution and fully connected
    layer of these models) bit-exact with tflite-micro."""
    _check(mlperf_model(stem), "mps3-an547")


@pytest.mark.parametrize("board", ("mps2-an385", "mps2-an500"))
def test_kws_on_other_cortex_m(board):
    _check(mlperf_model("kws_ref_model"), board)


def test_instruction_counter_on_a_known_loop(tmp_path):
    """1,000,000 iterations of subs/bne are 2,000,000 instructions; SysTick's resolution under
    QEMU -icount is 40 instructions (25 MHz), plus a few around the loop."""
    board = load_board("mps2-an386")
    compile_model(demo_tflite_bytes(), tmp_path, board=board.name, name="demo")
    (tmp_path / "main.c").write_text("""
#include <stdint.h>
#include "mf_board.h"
int main(void) {
    uint32_t n = 1000000u;
    uint64_t t0, t1;
    mf_counter_start();
    t0 = mf_counter_read();
    __asm__ volatile("1: subs %0, %0, #1\\n\\tbne 1b" : "+r"(n) : : "cc");
    t1 = mf_counter_read();
    mf_puts("ticks ");
    mf_put_u64(t1 - t0);
    mf_puts("\\ndone\\n");
    return 0;
}
""")
    subprocess.run(["make", "-s", "-C", str(tmp_path)], check=True, capture_output=True)
    text = run_elf(board, tmp_path / "demo.elf")
    ticks = int(text.split("ticks ")[1].split()[0])
    assert abs(board.instructions(ticks) - 2_000_000) <= 120


def test_counts_repeat_and_bench_reports_them(tmp_path):
    path = mlperf_model("kws_ref_model")
    x = _inputs(path, 2, 9)
    a = run_on_board(path, [x], "mps2-an386", tmp_path / "a")
    b = run_on_board(path, [x], "mps2-an386", tmp_path / "b")
    # plausible: the SMLAD kernels' floor is ~0.66 instructions per MAC (2 MACs per SMLAD plus
    # the loads), and KWS has 2,656,768 MACs
    assert a.instructions == b.instructions and a.instructions[0] > 0.66 * 2_656_768
    assert 0 < a.stack_bytes < 4096
