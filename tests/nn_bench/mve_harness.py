"""Build and run C harnesses of the Helium kernels (runtime_c/mcuforge_mve_dw.h) on the host
(portable body, sanitizers) or on QEMU mps3-an547 (Cortex-M55: the MVE body, or the portable one
with -DMF_USE_MVE=0), for tests/test_nn_mve_dw.py and as an instruction bench. A harness is a
list of cases, each a C block calling one kernel on constant inputs; the harness checks every
output byte against the expected ones, guard bytes past the output and the scratch, and prints
"case <i> ticks <n> bad <mismatches>" (SysTick under -icount shift=0: 31.25 instructions a
tick on mps3-an547)."""
from __future__ import annotations

import re
import subprocess
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
WARN = ["-std=c99", "-Wall", "-Wextra", "-Werror", "-pedantic"]
ARM = ["arm-none-eabi-gcc", "-mcpu=cortex-m55", "-mthumb", "-mfloat-abi=hard",
       "--specs=nano.specs", "-nostartfiles", "-Wa,--fatal-warnings", "-T",
       str(HERE / "mve_link.ld")]
TICK = 31.25  # instructions per SysTick tick on mps3-an547 with -icount shift=0
GUARD = 64


def arr(name, ctype, values, per_line=16) -> str:
    vals = [str(int(v)) for v in np.asarray(values).reshape(-1)]
    body = ",\n".join(", ".join(vals[i:i + per_line]) for i in range(0, len(vals), per_line))
    return f"static const {ctype} {name}[{max(len(vals), 1)}] = {{\n{body or '0'}\n}};\n"


MAIN = r"""
#include <stdint.h>
#include <string.h>
#include "mcuforge_mve_dw.h"
#include "dw_io.h"
#if !defined(__arm__)
#include <stdio.h>
#include <stdlib.h>
void dw_puts(const char *s) { fputs(s, stdout); }
void dw_exit(int status) { exit(status); }
void dw_counter_start(void) {}
uint64_t dw_counter_read(void) { return 0; }
#endif
#define GUARD %(guard)d
#define TAIL %(tail)d
static int8_t ybuf[%(ymax)d + GUARD];
static int32_t sbuf[(%(smax)d + GUARD) / 4 + 1];
/* TAIL: each case's scratch ends where readable memory ends, so a read past it faults: on the
 * host the end of an exactly sized array (ASan), on QEMU mps3-an547 the end of the ITCM
 * (0x80000; the next byte raises a BusFault) */
#if TAIL && defined(__arm__)
#define TAIL_END ((int8_t *)0x80000)
extern uint32_t __data_load__, __data_start__, __data_end__;
#elif TAIL
static int8_t tbuf[%(smax)d];
#define TAIL_END (tbuf + sizeof tbuf)
#else
#define TAIL_END ((int8_t *)(void *)sbuf) /* unused */
#endif
static int fails;
static void put_u(char **p, uint64_t v) {
    char t[24];
    int n = 0;
    do t[n++] = (char)('0' + (int)(v %% 10u)), v /= 10u; while (v);
    while (n) *(*p)++ = t[--n];
}
static void report(int i, uint64_t ticks, int bad) {
    char line[80], *p = line;
    memcpy(p, "case ", 5), p += 5, put_u(&p, (uint64_t)i);
    memcpy(p, " ticks ", 7), p += 7, put_u(&p, ticks);
    memcpy(p, " bad ", 5), p += 5, put_u(&p, (uint64_t)bad);
    *p++ = '\n', *p = 0;
    dw_puts(line);
    fails += bad != 0;
}
static int check(const int8_t *want, int n, int sn) {
    int j, bad = 0;
    if (want)
        for (j = 0; j < n; ++j) bad += ybuf[j] != want[j];
    for (j = n; j < n + GUARD; ++j) bad += ybuf[j] != 0x5A;
    for (j = sn; j < sn + GUARD && !TAIL; ++j) bad += ((const uint8_t *)sbuf)[j] != 0x5A;
    return bad;
}
#define RUN(I, CALL, WANT, N, SN)                                                              \
    do {                                                                                       \
        uint64_t t0, t1;                                                                       \
        memset(ybuf, 0x5A, sizeof ybuf);                                                       \
        memset(sbuf, 0x5A, sizeof sbuf);                                                       \
        if (TAIL) s8 = TAIL_END - (SN);                                                        \
        dw_counter_start();                                                                    \
        t0 = dw_counter_read();                                                                \
        CALL;                                                                                  \
        t1 = dw_counter_read();                                                                \
        report(I, t1 - t0, check(WANT, N, SN));                                                \
    } while (0)
%(decls)s
int main(void) {
    int8_t *y = ybuf;
    int8_t *s8 = (int8_t *)(void *)sbuf;
    (void)y, (void)s8;
#if TAIL && defined(__arm__) /* the program's image must end before the scratch */
    if ((uintptr_t)&__data_load__ + (uintptr_t)((char *)&__data_end__ - (char *)&__data_start__)
        > 0x80000u - %(smax)du) {
        dw_puts("image too large for TAIL\n");
        return 2;
    }
#endif
%(calls)s
    dw_puts(fails ? "FAIL\n" : "PASS\n");
    return fails ? 1 : 0;
}
"""


def program(cases, tail=False) -> str:
    """cases: dicts with decls (C declarations, names suffixed by the case index), call (a C
    expression using y, s8 and the declarations), want (expected int8 output or None), n
    (output bytes), sn (scratch bytes). tail: each scratch ends where readable memory ends
    (reads past it fault: ASan on the host, a BusFault on QEMU) instead of before guard bytes."""
    decls, calls = [], []
    for i, c in enumerate(cases):
        decls.append(c["decls"])
        if c.get("want") is not None:
            decls.append(arr(f"want{i}", "int8_t", c["want"]))
        want = f"want{i}" if c.get("want") is not None else "0"
        calls.append(f"    RUN({i}, {c['call']}, {want}, {c['n']}, {c['sn']});")
    ymax = max(c["n"] for c in cases)
    smax = max(max(c["sn"] for c in cases), 4)
    return MAIN % dict(guard=GUARD, tail=int(tail), ymax=ymax, smax=smax, decls="".join(decls),
                       calls="\n".join(calls))


def build(cases, kind: str, flags, workdir, tail=False) -> Path:
    """kind: 'host' (gcc), 'm55' (MVE body) or 'm55-portable' (-DMF_USE_MVE=0)."""
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    src = workdir / "mve_main.c"
    src.write_text(program(cases, tail))
    inc = ["-I", str(HERE), "-I", str(ROOT / "runtime_c")]
    exe = workdir / f"mve_{kind}.elf"
    if kind == "host":
        cmd = ["gcc", *WARN, *flags, *inc, str(src), "-o", str(exe)]
    else:
        extra = ["-DMF_USE_MVE=0"] if kind == "m55-portable" else []
        cmd = [*ARM, *WARN, *extra, *flags, *inc, str(src), str(HERE / "dw_crt.c"), "-DMF_CRT_MVE", "-o",
               str(exe)]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode:
        raise RuntimeError(f"{' '.join(cmd)}\n{p.stderr}")
    return exe


def run(exe: Path, kind: str, timeout=300):
    """[(ticks, bad)] per case, and whether the program reported PASS, and its output."""
    if kind == "host":
        cmd = [str(exe)]
    else:
        cmd = ["qemu-system-arm", "-M", "mps3-an547", "-nographic", "-serial", "null",
               "-monitor", "none", "-semihosting-config", "enable=on,target=native",
               "-icount", "shift=0,align=off,sleep=off", "-kernel", str(exe)]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    out = p.stdout + p.stderr
    rows = [(int(t), int(b)) for t, b in re.findall(r"case \d+ ticks (\d+) bad (\d+)", out)]
    return rows, "PASS" in out and p.returncode == 0, out
