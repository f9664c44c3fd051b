/* bench.h on the build machine: stdio output, no instruction counter. */
#include <stdio.h>
#include <stdlib.h>
#include "bench.h"

void bench_putc(char c) { putchar(c); }
void bench_puts(const char *s) { fputs(s, stdout); }
void bench_put_i64(int64_t v) { printf("%lld", (long long)v); }
void bench_exit(int status) { exit(status); }
void bench_counter_start(void) {}
uint64_t bench_counter_read(void) { return 0; }
