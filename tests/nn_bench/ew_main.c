/* Runs every case of the generated ew_cases.h through mf_ew_add_s8 (kind 0; kind 2: in place,
 * y = the big input), mf_ew_mul_s8 (kind 4), mf_ew_avgpool_s8 (kind 1) or mf_ew_maxpool_s8
 * (kind 3); an ADD case with `fn` is called through it, with literal arguments:
 * compares each output byte with the expected one (when given), checks that nothing past the
 * output was written, and prints the SysTick ticks of each call. Output: one line per case,
 * "case <i> ticks <n> bad <mismatches>". */
#include <stdint.h>
#include <string.h>
#include "mcuforge_ew.h"
#include "dw_io.h"
#include "ew_cases.h" /* EW_NCASES, EW_YMAX, ew_cases[] */

#if !defined(__arm__)
#include <stdio.h>
#include <stdlib.h>
void dw_puts(const char *s) { fputs(s, stdout); }
void dw_exit(int status) { exit(status); }
void dw_counter_start(void) {}
uint64_t dw_counter_read(void) { return 0; }
#endif

#define GUARD 64
static int8_t ybuf[EW_YMAX + GUARD];

static void put_u(char **p, uint64_t v) {
    char t[24];
    int n = 0;
    do t[n++] = (char)('0' + (int)(v % 10u)), v /= 10u; while (v);
    while (n) *(*p)++ = t[--n];
}

int main(void) {
    int i, fails = 0;
    for (i = 0; i < EW_NCASES; ++i) {
        const ew_case *t = &ew_cases[i];
        int j, bad = 0;
        uint64_t t0, t1;
        char line[80], *p = line;
        memset(ybuf, 0x5A, sizeof ybuf);
        dw_counter_start();
        t0 = dw_counter_read();
        if (t->kind == 2) memcpy(ybuf, t->a, (size_t)t->n); /* in place: y is the big input */
        if (t->fn)
            t->fn(t->kind == 2 ? ybuf : t->a, t->b, ybuf);
        else if (t->kind == 0 || t->kind == 2)
            mf_ew_add_s8(t->kind == 2 ? ybuf : t->a, t->b, ybuf, t->n, t->tab, t->q[0],
                         t->q[1], t->q[2], t->q[3], t->q[4], t->q[5]);
        else if (t->kind == 4)
            mf_ew_mul_s8(t->a, t->b, ybuf, t->n, t->q[6], t->q[7], t->q[0], t->q[1], t->q[8],
                         t->q[2], t->q[3], t->q[4], t->q[5]);
        else if (t->kind == 1)
            mf_ew_avgpool_s8(t->a, ybuf, &t->g, t->q[4], t->q[5]);
        else
            mf_ew_maxpool_s8(t->a, ybuf, &t->g, t->q[4], t->q[5]);
        t1 = dw_counter_read();
        if (t->want)
            for (j = 0; j < t->n; ++j) bad += ybuf[j] != t->want[j];
        for (j = t->n; j < t->n + GUARD; ++j) bad += ybuf[j] != 0x5A;
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
