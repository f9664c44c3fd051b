/* Output, exit and instruction counting of the kernel test/bench firmware (startup.c on QEMU;
 * host.c on the build machine, where the counter reads 0). */
#ifndef BENCH_H
#define BENCH_H
#include <stdint.h>
void bench_putc(char c);
void bench_puts(const char *s);
void bench_put_i64(int64_t v);
void bench_exit(int status);
void bench_counter_start(void);
uint64_t bench_counter_read(void); /* SysTick ticks: x40 = executed instructions on mps2 */
#endif
