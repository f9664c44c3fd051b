/* System clock of the NUCLEO-L4R5ZI (STM32L4R5ZI): 120 MHz, as MLPerf Tiny's reference runs it,
 * instead of the 4 MHz MSI the core starts on. Register level, no vendor headers; addresses,
 * bit positions and limits from the reference manual RM0432 (section names in the comments).
 *
 * Not yet run on hardware.
 *
 * PLL ("Reset and clock control (RCC)", "PLL"): source HSI16, f_in = 16 MHz;
 *   f_VCO_in = f_in / PLLM = 16 / 2 = 8 MHz        (legal: 2.66 .. 16 MHz)
 *   f_VCO    = f_VCO_in * PLLN = 8 * 30 = 240 MHz  (legal: 64 .. 344 MHz, PLLN 8 .. 127)
 *   f_PLLR   = f_VCO / PLLR = 240 / 2 = 120 MHz    (SYSCLK: at most 120 MHz, range 1 boost)
 * Voltage ("Power control (PWR)", "Dynamic voltage scaling management"): above 80 MHz the core
 * needs range 1 in boost mode (PWR_CR5.R1MODE = 0). Going from range 1 normal to boost: halve
 * HCLK with the AHB prescaler, clear R1MODE, raise the flash wait states, switch SYSCLK to the
 * PLL, wait at least 1 us, then set the AHB prescaler to /1.
 * Flash ("Embedded flash memory (FLASH)", "Read access latency", wait states against HCLK in
 * range 1): 0 WS up to 20 MHz, then one more per 20 MHz: 5 WS at 120 MHz. The new LATENCY is
 * read back before the clock rises, as the manual asks.
 *
 * mf_board_init (templates/cortex_m/mf_board.c.j2) calls mf_clock_init first, with the UART
 * and with SEMIHOSTING=1 alike; SysTick then counts 120 MHz core cycles (board.toml clock_hz).
 * MF_REG_READ / MF_REG_WRITE let a host test run this code against simulated registers
 * (tests/test_real_boards_serial.py). */
#include <stdint.h>

#ifndef MF_REG_READ
#define MF_REG_READ(addr) (*(volatile uint32_t *)(addr))
#define MF_REG_WRITE(addr, v) (*(volatile uint32_t *)(addr) = (v))
#endif

/* "Memory map and register boundary addresses" */
#define RCC_BASE 0x40021000u
#define PWR_BASE 0x40007000u
#define FLASH_BASE_R 0x40022000u

/* "RCC clock control register (RCC_CR)" */
#define RCC_CR (RCC_BASE + 0x00u)
#define RCC_CR_HSION (1u << 8)
#define RCC_CR_HSIRDY (1u << 10)
#define RCC_CR_PLLON (1u << 24)
#define RCC_CR_PLLRDY (1u << 25)
/* "RCC clock configuration register (RCC_CFGR)": SW[1:0], SWS[3:2], HPRE[7:4] */
#define RCC_CFGR (RCC_BASE + 0x08u)
#define RCC_CFGR_SW_MASK 3u
#define RCC_CFGR_SW_PLL 3u
#define RCC_CFGR_SWS_SHIFT 2u
#define RCC_CFGR_HPRE_MASK (0xFu << 4)
#define RCC_CFGR_HPRE_DIV2 (0x8u << 4)
/* "RCC PLL configuration register (RCC_PLLCFGR)": PLLSRC[1:0] (10: HSI16), PLLM[7:4]
 * (divides by PLLM + 1), PLLN[14:8], PLLREN bit 24, PLLR[26:25] (00: /2, 01: /4, 10: /6,
 * 11: /8) */
#define RCC_PLLCFGR (RCC_BASE + 0x0Cu)
#define RCC_APB1ENR1 (RCC_BASE + 0x58u)
#define RCC_APB1ENR1_PWREN (1u << 28)

/* "Power control register 1 (PWR_CR1)": VOS[10:9], 01 = range 1 (the reset value) */
#define PWR_CR1 (PWR_BASE + 0x00u)
#define PWR_CR1_VOS_MASK (3u << 9)
#define PWR_CR1_VOS_RANGE1 (1u << 9)
/* "Power status register 2 (PWR_SR2)": VOSF, set while the regulator is changing */
#define PWR_SR2 (PWR_BASE + 0x14u)
#define PWR_SR2_VOSF (1u << 10)
/* "Power control register 5 (PWR_CR5)": R1MODE, 1 = range 1 normal (reset), 0 = boost */
#define PWR_CR5 (PWR_BASE + 0x80u)
#define PWR_CR5_R1MODE (1u << 8)

/* "Flash access control register (FLASH_ACR)": LATENCY[3:0] */
#define FLASH_ACR (FLASH_BASE_R + 0x00u)
#define FLASH_ACR_LATENCY_MASK 0xFu

#define PLL_SRC_HSI16 2u
#define PLL_M 2u  /* 16 MHz / 2 = 8 MHz into the VCO */
#define PLL_N 30u /* 8 MHz * 30 = 240 MHz VCO */
#define PLL_R 2u  /* 240 MHz / 2 = 120 MHz SYSCLK */
#define SYSCLK_HZ (16000000u / PLL_M * PLL_N / PLL_R)
#define FLASH_WS ((SYSCLK_HZ - 1u) / 20000000u) /* range 1: one wait state per 20 MHz */
#define RCC_PLLCFGR_VALUE (PLL_SRC_HSI16 | ((PLL_M - 1u) << 4) | (PLL_N << 8) | \
                           (1u << 24) | (((PLL_R / 2u) - 1u) << 25))

/* The limits above, checked at compile time (C99: no _Static_assert). */
typedef char mf_pll_in_range[(16000000u / PLL_M >= 2660000u && 16000000u / PLL_M <= 16000000u &&
                              PLL_N >= 8u && PLL_N <= 127u &&
                              16000000u / PLL_M * PLL_N >= 64000000u &&
                              16000000u / PLL_M * PLL_N <= 344000000u &&
                              SYSCLK_HZ == 120000000u && FLASH_WS == 5u) ? 1 : -1];

void mf_clock_init(void);

void mf_clock_init(void) {
    volatile uint32_t spin;

    /* HSI16 on: the PLL's input */
    MF_REG_WRITE(RCC_CR, MF_REG_READ(RCC_CR) | RCC_CR_HSION);
    while ((MF_REG_READ(RCC_CR) & RCC_CR_HSIRDY) == 0u) {
    }

    /* PLL: off while configured, then on and locked */
    MF_REG_WRITE(RCC_CR, MF_REG_READ(RCC_CR) & ~RCC_CR_PLLON);
    while ((MF_REG_READ(RCC_CR) & RCC_CR_PLLRDY) != 0u) {
    }
    MF_REG_WRITE(RCC_PLLCFGR, RCC_PLLCFGR_VALUE);
    MF_REG_WRITE(RCC_CR, MF_REG_READ(RCC_CR) | RCC_CR_PLLON);
    while ((MF_REG_READ(RCC_CR) & RCC_CR_PLLRDY) == 0u) {
    }

    /* range 1 boost mode: the PWR interface clock first; HCLK halved across the change */
    MF_REG_WRITE(RCC_APB1ENR1, MF_REG_READ(RCC_APB1ENR1) | RCC_APB1ENR1_PWREN);
    (void)MF_REG_READ(RCC_APB1ENR1); /* read back: the clock is on before the next access */
    MF_REG_WRITE(RCC_CFGR, (MF_REG_READ(RCC_CFGR) & ~RCC_CFGR_HPRE_MASK) | RCC_CFGR_HPRE_DIV2);
    MF_REG_WRITE(PWR_CR1, (MF_REG_READ(PWR_CR1) & ~PWR_CR1_VOS_MASK) | PWR_CR1_VOS_RANGE1);
    MF_REG_WRITE(PWR_CR5, MF_REG_READ(PWR_CR5) & ~PWR_CR5_R1MODE);
    while ((MF_REG_READ(PWR_SR2) & PWR_SR2_VOSF) != 0u) {
    }

    /* flash wait states for 120 MHz, in effect (read back) before the clock rises */
    MF_REG_WRITE(FLASH_ACR, (MF_REG_READ(FLASH_ACR) & ~FLASH_ACR_LATENCY_MASK) | FLASH_WS);
    while ((MF_REG_READ(FLASH_ACR) & FLASH_ACR_LATENCY_MASK) != FLASH_WS) {
    }

    /* SYSCLK from the PLL (HCLK 60 MHz while the prescaler halves it) */
    MF_REG_WRITE(RCC_CFGR, (MF_REG_READ(RCC_CFGR) & ~RCC_CFGR_SW_MASK) | RCC_CFGR_SW_PLL);
    while (((MF_REG_READ(RCC_CFGR) >> RCC_CFGR_SWS_SHIFT) & 3u) != RCC_CFGR_SW_PLL) {
    }

    /* at least 1 us at the halved HCLK (60 cycles); each turn takes several */
    for (spin = 0u; spin < 120u; spin = spin + 1u) {
    }
    MF_REG_WRITE(RCC_CFGR, MF_REG_READ(RCC_CFGR) & ~RCC_CFGR_HPRE_MASK); /* HCLK = SYSCLK */
}
