/* Minimal bare-metal support for the kernel tests and benches on QEMU's mps2 machines (M3/M4):
 * vector table, reset (copy .data, zero .bss), semihosting output and exit, and an executed-
 * instruction counter from SysTick (under -icount shift=0 one tick is 40 instructions on mps2:
 * 25 MHz clock, 1 ns per instruction). */
#include <stdint.h>
#include "bench.h"

extern uint32_t __data_start__, __data_end__, __data_load__, __bss_start__, __bss_end__;
extern uint32_t __stack_top__;
int main(void);
void Reset_Handler(void);
void Fault_Handler(void);
void SysTick_Handler(void);

typedef void (*vector_t)(void);
__attribute__((section(".vectors"), used)) static const vector_t vectors[16] = {
    (vector_t)(uintptr_t)&__stack_top__, Reset_Handler, Fault_Handler, Fault_Handler,
    Fault_Handler, Fault_Handler, Fault_Handler, 0, 0, 0, 0, Fault_Handler, Fault_Handler, 0,
    Fault_Handler, SysTick_Handler,
};

static int32_t semihost(int32_t op, const void *arg) {
    register int32_t r0 __asm__("r0") = op;
    register const void *r1 __asm__("r1") = arg;
    __asm__ volatile("bkpt 0xAB" : "+r"(r0) : "r"(r1) : "memory");
    return r0;
}

void bench_exit(int status) {
    uint32_t block[2] = {0x20026u, (uint32_t)status}; /* ADP_Stopped_ApplicationExit */
    semihost(0x20, block);                            /* SYS_EXIT_EXTENDED */
    for (;;) {
    }
}

static char line[256];
static uint32_t line_len;

void bench_putc(char c) {
    line[line_len++] = c;
    if (c == '\n' || line_len == sizeof line - 1) {
        line[line_len] = '\0';
        semihost(0x04, line); /* SYS_WRITE0 */
        line_len = 0;
    }
}

void bench_puts(const char *s) {
    while (*s) {
        bench_putc(*s++);
    }
}

void bench_put_i64(int64_t v) {
    char buf[24];
    int n = 0;
    uint64_t u = v < 0 ? (uint64_t)-v : (uint64_t)v;
    if (v < 0) {
        bench_putc('-');
    }
    do {
        buf[n++] = (char)('0' + (int)(u % 10u));
        u /= 10u;
    } while (u);
    while (n) {
        bench_putc(buf[--n]);
    }
}

#define SYST_CSR (*(volatile uint32_t *)0xE000E010u)
#define SYST_RVR (*(volatile uint32_t *)0xE000E014u)
#define SYST_CVR (*(volatile uint32_t *)0xE000E018u)
static volatile uint32_t wraps;

void SysTick_Handler(void) {
    wraps = wraps + 1u;
}

void bench_counter_start(void) {
    SYST_CSR = 0u;
    SYST_RVR = 0xFFFFFFu;
    SYST_CVR = 0u;
    SYST_CSR = 7u;
    while (SYST_CVR == 0u) {
    }
    wraps = 0u;
}

uint64_t bench_counter_read(void) {
    uint32_t w, v;
    do {
        w = wraps;
        v = SYST_CVR;
    } while (w != wraps);
    return (uint64_t)w * 0x1000000u + (0xFFFFFFu - v);
}

void Reset_Handler(void) {
    uint32_t *src = &__data_load__, *dst = &__data_start__;
#if defined(__ARM_FP) || defined(__ARM_FEATURE_MVE)
    /* CPACR: coprocessors 10 and 11 (FPU, and MVE on the M55) before any vector instruction */
    *(volatile uint32_t *)0xE000ED88u |= 0xFu << 20;
    __asm__ volatile("dsb\n\tisb" ::: "memory");
#endif
    while (dst < &__data_end__) {
        *dst++ = *src++;
    }
    for (dst = &__bss_start__; dst < &__bss_end__; ++dst) {
        *dst = 0;
    }
    bench_exit(main());
}

void Fault_Handler(void) {
    bench_puts("fault\n");
    bench_exit(3);
}
