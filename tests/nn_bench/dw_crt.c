/* Minimal Cortex-M start-up for the kernel benches on QEMU mps2 (no FPU use, soft float):
 * vector table, .data/.bss set-up, semihosting output and exit, SysTick instruction counter
 * (with -icount shift=0 one tick is 40 instructions on mps2, see measuring-on-qemu.md).
 * With MF_CRT_MVE (the Helium tests on mps3-an547, 32 MHz: one tick is 31.25 instructions)
 * the FPU and MVE are enabled first (CPACR, coprocessors 10 and 11). */
#include <stdint.h>
#include "dw_io.h"

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

void dw_puts(const char *s) { semihost(0x04, s); } /* SYS_WRITE0 */

void dw_exit(int status) {
    uint32_t block[2] = {0x20026u, (uint32_t)status}; /* ADP_Stopped_ApplicationExit */
    semihost(0x20, block);
    for (;;) {
    }
}

void Fault_Handler(void) {
    dw_puts("FAULT\n");
    dw_exit(3);
}

#define SYST_CSR (*(volatile uint32_t *)0xE000E010u)
#define SYST_RVR (*(volatile uint32_t *)0xE000E014u)
#define SYST_CVR (*(volatile uint32_t *)0xE000E018u)
static volatile uint32_t wraps;
void SysTick_Handler(void) { wraps = wraps + 1u; }

void dw_counter_start(void) {
    SYST_CSR = 0u;
    SYST_RVR = 0xFFFFFFu;
    SYST_CVR = 0u;
    SYST_CSR = 7u;
    while (SYST_CVR == 0u) {
    }
    wraps = 0u;
}

uint64_t dw_counter_read(void) {
    uint32_t w, v;
    do {
        w = wraps;
        v = SYST_CVR;
    } while (w != wraps);
    return (uint64_t)w * 0x1000000u + (0xFFFFFFu - v);
}

void Reset_Handler(void) {
    uint32_t *src, *dst;
#ifdef MF_CRT_MVE
    *(volatile uint32_t *)0xE000ED88u |= 0xFu << 20; /* CPACR: FPU and MVE before any use */
    __asm__ volatile("dsb\n\tisb" ::: "memory");
#endif
    src = &__data_load__, dst = &__data_start__;
    while (dst < &__data_end__) *dst++ = *src++;
    for (dst = &__bss_start__; dst < &__bss_end__;) *dst++ = 0u;
    dw_exit(main());
}
