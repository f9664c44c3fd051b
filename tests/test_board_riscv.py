"""Firmware on the emulated RISC-V board (riscv32-virt: rv32imac on QEMU virt, no C library):
outputs equal tflite-micro's, the instruction counter is calibrated on a loop of known length,
counts repeat exactly run to run, the bundled memcpy/memmove/memset/memcmp are right, and a
trap ends the emulator with a message instead of hanging it."""
import subprocess

import numpy as np
import pytest

from conftest import MLPERF_INT8, mlperf_model, require_tools
from mcuforge import runner
from mcuforge.tools import tflm
from mcuforge.api import compile as compile_model, load
from mcuforge.board import load_board
from mcuforge.tools.demo import demo_tflite_bytes
from mcuforge.ir.errors import BuildError
from mcuforge.target import run_elf, run_on_board

BOARD = "riscv32-virt"


@pytest.fixture(autouse=True)
def _tools():
    require_tools("riscv64-unknown-elf-gcc", "qemu-system-riscv32")


def _inputs(model, n, seed):
    g = load(model)
    t = g.tensors[g.inputs[0]]
    return np.random.default_rng(seed).integers(-128, 128, size=(n, *t.shape)).astype(t.dtype)


def _check(model, data: bytes, n=3, seed=5):
    x = _inputs(model, n, seed)
    y = runner.run(model, x, board=BOARD)
    ref = tflm.run(data, [x])[0]
    assert np.array_equal(y, ref), f"{np.sum(y != ref)} bytes differ from tflite-micro"


@pytest.mark.parametrize("stem", MLPERF_INT8)  # kws_ref_model and the other four
def test_mlperf_matches_tflm(stem):
    path = mlperf_model(stem)
    _check(path, path.read_bytes())


def test_demo_model_matches_tflm():
    data = demo_tflite_bytes()
    _check(data, data)


@pytest.mark.parametrize("opt", ["-O2 -fno-omit-frame-pointer", "-O3 -fno-omit-frame-pointer"])
def test_links_and_matches_tflm_with_a_frame_pointer(opt):
    """The semihosting call's 16-byte alignment survives linker relaxation: with its .balign
    inside `.option norvc` the linker stopped ("14 bytes required for alignment to 16-byte
    boundary, but only 12 present") at -O2 and -O3 with -fno-omit-frame-pointer."""
    data = demo_tflite_bytes()
    x = _inputs(data, 2, 9)
    y = runner.run(data, x, board=BOARD, opt=opt)
    assert np.array_equal(y, tflm.run(data, [x])[0])


def _firmware(tmp_path, main_c: str) -> str:
    """Build the demo model's riscv32-virt project with `main_c` as its main.c, run it."""
    board = load_board(BOARD)
    compile_model(demo_tflite_bytes(), tmp_path, board=BOARD, name="demo")
    (tmp_path / "main.c").write_text(main_c)
    r = subprocess.run(["make", "-s", "-C", str(tmp_path)], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    return run_elf(board, tmp_path / "demo.elf", timeout=120)


def test_instruction_counter_on_a_known_loop(tmp_path):
    """li (lui + addi) then 1,000,000 iterations of addi/bnez: 2,000,002 instructions. The
    counter is mcycle, which QEMU -icount advances once per instruction: the count is exact
    up to the code the compiler puts around the asm, so the empty bracket is subtracted."""
    text = _firmware(tmp_path, """
#include <stdint.h>
#include "mf_board.h"
int main(void) {
    uint64_t t0, t1, t2, t3;
    mf_counter_start();
    t0 = mf_counter_read();
    t1 = mf_counter_read();
    t2 = mf_counter_read();
    __asm__ volatile("li t0, 1000000\\n"
                     "1: addi t0, t0, -1\\n\\t"
                     "bnez t0, 1b" : : : "t0");
    t3 = mf_counter_read();
    mf_puts("empty ");
    mf_put_u64(t1 - t0);
    mf_puts("\\nloop ");
    mf_put_u64(t3 - t2);
    mf_puts("\\ndone\\n");
    return 0;
}
""")
    board = load_board(BOARD)
    values = dict(line.split() for line in text.splitlines() if line.startswith(("empty", "loop")))
    empty, loop = (board.instructions(int(values[k])) for k in ("empty", "loop"))
    assert board.instructions(1) == 1  # one tick per instruction: clock_hz is 1 GHz
    assert 0 < empty < 40
    assert abs(loop - empty - 2_000_002) <= 4


def test_counts_repeat_and_are_plausible(tmp_path):
    path = mlperf_model("kws_ref_model")
    x = _inputs(path, 2, 9)
    a = run_on_board(path, [x], BOARD, tmp_path / "a")
    b = run_on_board(path, [x], BOARD, tmp_path / "b")
    assert a.ticks == b.ticks and a.instructions == b.instructions
    macs = 2_656_768  # published for this model; rv32imac has no multiply-accumulate
    assert all(macs < n < 25 * macs for n in a.instructions), a.instructions
    assert 0 < a.stack_bytes < 4096


def test_bundled_string_functions(tmp_path):
    """mf_libc.c's memcpy/memmove/memset/memcmp against byte-by-byte expectations, on every
    alignment and length around the word size, overlapping both ways for memmove."""
    text = _firmware(tmp_path, """
#include <stdint.h>
#include <string.h>
#include "mf_board.h"
static uint8_t a[64], b[64];
static volatile size_t vn; /* keeps gcc from inlining the calls away */
static int fails;
static void fill(void) {
    int i;
    for (i = 0; i < 64; ++i) {
        a[i] = (uint8_t)(i * 7 + 1);
        b[i] = (uint8_t)(200 - i);
    }
}
static void expect(int ok) {
    fails += !ok;
}
int main(void) {
    size_t s, d, n, i;
    for (s = 0; s < 5; ++s) for (d = 0; d < 5; ++d) for (n = 0; n < 20; ++n) {
        fill();
        vn = n;
        expect(memcpy(b + d, a + s, vn) == b + d);
        for (i = 0; i < 64; ++i) {
            expect(b[i] == (i >= d && i < d + n ? a[s + i - d] : (uint8_t)(200 - i)));
        }
        expect(memcmp(b + d, a + s, vn) == 0);
        if (n > 0) {
            b[d + n - 1] ^= 1u;
            expect((memcmp(b + d, a + s, vn) < 0) == (b[d + n - 1] < a[s + n - 1]));
            expect(memcmp(b + d, a + s, vn) != 0);
        }
        fill();
        expect(memset(a + d, 0xA5 + (int)s, vn) == a + d);
        for (i = 0; i < 64; ++i) {
            expect(a[i] == (i >= d && i < d + n ? (uint8_t)(0xA5 + s) : (uint8_t)(i * 7 + 1)));
        }
        fill();
        expect(memmove(a + 8 + d, a + 8 + s, vn) == a + 8 + d);
        for (i = 0; i < 64; ++i) {
            uint8_t want = (uint8_t)(i * 7 + 1);
            if (i >= 8 + d && i < 8 + d + n) {
                want = (uint8_t)((i - d + s) * 7 + 1);
            }
            expect(a[i] == want);
        }
    }
    mf_puts("fails ");
    mf_put_u64((uint64_t)fails);
    mf_puts("\\ndone\\n");
    return 0;
}
""")
    assert "fails 0" in text.splitlines(), text


def test_a_trap_ends_the_emulator_with_its_cause(tmp_path):
    with pytest.raises(BuildError) as e:
        _firmware(tmp_path, """
#include "mf_board.h"
int main(void) {
    mf_puts("before\\n");
    __asm__ volatile(".word 0xffffffff"); /* an illegal instruction */
    mf_puts("done\\n");
    return 0;
}
""")
    assert "exit 3" in str(e.value) and "mcause 0x00000002" in str(e.value)
    assert "before" in str(e.value) and "\ndone" not in str(e.value)
