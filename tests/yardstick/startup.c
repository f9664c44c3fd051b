/* Yardstick firmware start-up for the QEMU mps2 machines: vector table, reset (copy .data,
 * zero .bss, enable the FPU, run C++ constructors), SysTick counter with wrap-arounds, and
 * output/exit through semihosting. No vendor files. */
#include <stddef.h>
#include <stdint.h>

extern uint32_t __data_start__, __data_end__, __data_load__, __bss_start__, __bss_end__;
extern uint32_t __stack_top__;
extern void __libc_init_array(void);
int main(void);

void Reset_Handler(void);
void Fault_Handler(void);
void SysTick_Handler(void);
void ys_puts(const char *s);
void ys_exit(int status);

typedef void (*vector_t)(void);

__attribute__((section(".vectors"), used)) static const vector_t vectors[16] = {
    (vector_t)(uintptr_t)&__stack_top__, Reset_Handler,
    Fault_Handler, Fault_Handler, Fault_Handler, Fault_Handler, Fault_Handler,
    0, 0, 0, 0,
    Fault_Handler, Fault_Handler, 0, Fault_Handler, SysTick_Handler,
};

/* -nostartfiles: no crti/crtn, so the _init/_fini that __libc_init_array calls are empty */
void _init(void) {}
void _fini(void) {}
/* and no crtbegin: the handle that static objects' destructors are registered with */
void *__dso_handle = 0;

void Reset_Handler(void) {
    uint32_t *src = &__data_load__, *dst = &__data_start__;
    while (dst < &__data_end__) {
        *dst++ = *src++;
    }
    for (dst = &__bss_start__; dst < &__bss_end__; ++dst) {
        *dst = 0;
    }
    /* CPACR: full access to the FPU (coprocessors 10, 11) before any float instruction */
    *(volatile uint32_t *)0xE000ED88 |= 0xFu << 20;
    __asm__ volatile("dsb\n\tisb" ::: "memory");
    __libc_init_array();
    ys_exit(main());
}

void Fault_Handler(void) {
    ys_puts("yardstick: fault\n");
    ys_exit(3);
}

/* SysTick: 24-bit down counter on the processor clock (25 MHz: 40 instructions a tick under
 * QEMU -icount shift=0); the interrupt counts wrap-arounds. */
#define SYST_CSR (*(volatile uint32_t *)0xE000E010u)
#define SYST_RVR (*(volatile uint32_t *)0xE000E014u)
#define SYST_CVR (*(volatile uint32_t *)0xE000E018u)
#define SYST_PERIOD 0x1000000u

static volatile uint32_t wraps;

void SysTick_Handler(void) {
    wraps = wraps + 1u;
}

void ys_counter_start(void) {
    SYST_CSR = 0u;
    SYST_RVR = SYST_PERIOD - 1u;
    SYST_CVR = 0u;
    SYST_CSR = 7u; /* enable, interrupt, processor clock */
    while (SYST_CVR == 0u) { /* wait for the first reload */
    }
    wraps = 0u;
}

uint64_t ys_counter_read(void) {
    uint32_t w, v;
    do {
        w = wraps;
        v = SYST_CVR;
    } while (w != wraps);
    return (uint64_t)w * SYST_PERIOD + (SYST_PERIOD - 1u - v);
}

/* semihosting: SYS_WRITE0 of a line buffer, SYS_EXIT_EXTENDED */
static int32_t semihost(int32_t op, const void *arg) {
    register int32_t r0 __asm__("r0") = op;
    register const void *r1 __asm__("r1") = arg;
    __asm__ volatile("bkpt 0xAB" : "+r"(r0) : "r"(r1) : "memory");
    return r0;
}

static char line[256];
static size_t line_len;

static void flush(void) {
    line[line_len] = '\0';
    if (line_len) {
        semihost(0x04, line);
    }
    line_len = 0;
}

static void putc_(char c) {
    line[line_len++] = c;
    if (c == '\n' || line_len == sizeof line - 1) {
        flush();
    }
}

void ys_puts(const char *s) {
    while (*s) {
        putc_(*s++);
    }
}

void ys_put_u64(uint64_t v) {
    char buf[21];
    int n = 0;
    do {
        buf[n++] = (char)('0' + (int)(v % 10u));
        v /= 10u;
    } while (v);
    while (n) {
        putc_(buf[--n]);
    }
}

void ys_put_hex(const uint8_t *p, uint32_t n) {
    static const char digits[] = "0123456789abcdef";
    for (uint32_t i = 0; i < n; ++i) {
        putc_(digits[p[i] >> 4]);
        putc_(digits[p[i] & 15u]);
    }
}

void ys_exit(int status) {
    uint32_t block[2] = {0x20026u, (uint32_t)status};
    flush();
    semihost(0x20, block);
    for (;;) {
    }
}
