/* Runs every case of the generated dw_cases.h through its entry (mf_dw3x3_s8_<s>[f][c] or
 * the generic mf_dw3x3_s8): compares each output byte
 * with the expected one (when given), checks that nothing past the output or the scratch was
 * written, and prints the SysTick ticks of each call. Output: one line per case,
 * "case <i> ticks <n> bad <mismatches>". */
#include <stdint.h>
#include <string.h>
#include "mcuforge_dw.h"
#include "dw_io.h"
#include "dw_cases.h" /* DW_NCASES, DW_YMAX, DW_SMAX (int16), dw_cases[] */

#if !defined(__arm__)
#include <stdio.h>
#include <stdlib.h>
void dw_puts(const char *s) { fputs(s, stdout); }
void dw_exit(int status) { exit(status); }
void dw_counter_start(void) {}
uint64_t dw_counter_read(void) { return 0; }
#endif

#define GUARD 64
static int8_t ybuf[DW_YMAX + GUARD];
static int32_t sbuf[(DW_SMAX + 1) / 2 + GUARD / 4]; /* int16 scratch, 4-byte aligned */

static void put_u(char **p, uint64_t v) {
    char t[24];
    int n = 0;
    do t[n++] = (char)('0' + (int)(v % 10u)), v /= 10u; while (v);
    while (n) *(*p)++ = t[--n];
}

int main(void) {
    int i, fails = 0;
    for (i = 0; i < DW_NCASES; ++i) {
        const dw_case *t = &dw_cases[i];
        const int n = t->g.oh * t->g.ow * t->g.c;
        const int sn = t->g.cg * t->g.rows * t->g.pw; /* int16 elements */
        int j, bad = 0;
        uint64_t t0, t1;
        char line[80], *p = line;
        memset(ybuf, 0x5A, sizeof ybuf);
        memset(sbuf, 0x5A, sizeof sbuf);
        dw_counter_start();
        t0 = dw_counter_read();
        t->fn(t->x, ybuf, t->pk, &t->g, t->x_zp, t->lo, t->hi, t->signfix,
              (int16_t *)(void *)sbuf);
        t1 = dw_counter_read();
        if (t->want)
            for (j = 0; j < n; ++j) bad += ybuf[j] != t->want[j];
        for (j = n; j < n + GUARD; ++j) bad += ybuf[j] != 0x5A;
        for (j = sn * 2; j < sn * 2 + GUARD; ++j) bad += ((const uint8_t *)sbuf)[j] != 0x5A;
        fails += bad != 0;
        memcpy(p, "case ", 5), p += 5, put_u(&p, (uint64_t)i);
        memcpy(p, " ticks ", 7), p += 7, put_u(&p, t1 - t0);
        memcpy(p, " bad ", 5), p += 5, put_u(&p, (uint64_t)bad);
        *p++ = '\n', *p = 0;
        dw_puts(line);
    }
    dw_puts(fails ? "FAIL\n" : "PASS\n");
    return fails ? 1 : 0;
}
