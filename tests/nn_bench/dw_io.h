/* Output, exit and the SysTick counter of the kernel benches (dw_crt.c on Arm, stdio on a host). */
#ifndef DW_IO_H
#define DW_IO_H
#include <stdint.h>
void dw_puts(const char *s);
void dw_exit(int status);
void dw_counter_start(void);
uint64_t dw_counter_read(void); /* SysTick ticks: 40 instructions each on mps2 with -icount 0 */
#endif
