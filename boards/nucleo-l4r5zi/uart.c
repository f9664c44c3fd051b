/* UART output of the NUCLEO-L4R5ZI (STM32L4R5ZI): LPUART1, TX on PG7 and RX on PG8, which the
 * Nucleo-144 board wires to the ST-LINK virtual COM port (UM2179, "Virtual COM port (VCP)").
 * 115200 baud, 8 data bits, no parity, 1 stop bit. Register level, no vendor headers; addresses
 * and bit positions from the reference manual RM0432 (section names in the comments).
 *
 * Not yet run on hardware.
 *
 * Kernel clock: HSI16, not the 4 MHz MSI that clocks the core after reset, so the baud rate
 * holds whatever the application does to SYSCLK. RM0432 "LPUART baud rate generation":
 * LPUART_BRR = 256 * fck / baud, fck in [3 * baud, 4096 * baud], BRR >= 0x300.
 * 256 * 16 MHz / 115200 = 35555.6 -> 35556 (115198.6 baud, -0.001 %).
 *
 * The reset handler calls mf_uart_init through mf_board_init; the formatter in mf_board.c sends
 * every character through mf_uart_putc. With `make SEMIHOSTING=1` nothing calls either, and
 * --gc-sections drops them. */
#include <stdint.h>

#define REG32(addr) (*(volatile uint32_t *)(addr))

/* "Memory map and register boundary addresses" */
#define RCC_BASE 0x40021000u
#define PWR_BASE 0x40007000u
#define GPIOG_BASE 0x48001800u
#define LPUART1_BASE 0x40008000u

/* "Reset and clock control (RCC)" */
#define RCC_CR REG32(RCC_BASE + 0x00u)          /* "RCC clock control register" */
#define RCC_CR_HSION (1u << 8)
#define RCC_CR_HSIRDY (1u << 10)
#define RCC_AHB2ENR REG32(RCC_BASE + 0x4Cu)     /* "AHB2 peripheral clock enable register" */
#define RCC_AHB2ENR_GPIOGEN (1u << 6)
#define RCC_APB1ENR1 REG32(RCC_BASE + 0x58u)    /* "APB1 peripheral clock enable register 1" */
#define RCC_APB1ENR1_PWREN (1u << 28)
#define RCC_APB1ENR2 REG32(RCC_BASE + 0x5Cu)    /* "APB1 peripheral clock enable register 2" */
#define RCC_APB1ENR2_LPUART1EN (1u << 0)
/* "Peripherals independent clock configuration register": LPUART1SEL[1:0] at bits 11:10,
 * 00 PCLK1, 01 SYSCLK, 10 HSI16, 11 LSE */
#define RCC_CCIPR REG32(RCC_BASE + 0x88u)
#define RCC_CCIPR_LPUART1SEL_SHIFT 10u
#define RCC_CCIPR_LPUART1SEL_HSI16 2u

/* "Power control (PWR)": "Power control register 2 (PWR_CR2)". PG[15:2] are supplied by VDDIO2,
 * which is isolated until IOSV says the supply is valid (on the Nucleo VDDIO2 is tied to VDD). */
#define PWR_CR2 REG32(PWR_BASE + 0x04u)
#define PWR_CR2_IOSV (1u << 9)

/* "General-purpose I/Os (GPIO)": "GPIO port mode register", "GPIO alternate function low/high
 * register". MODE 10 = alternate function; AF8 = LPUART1 on PG7/PG8 (STM32L4R5xx
 * datasheet, alternate function table). */
#define GPIOG_MODER REG32(GPIOG_BASE + 0x00u)
#define GPIOG_AFRL REG32(GPIOG_BASE + 0x20u)
#define GPIOG_AFRH REG32(GPIOG_BASE + 0x24u)
#define GPIO_MODE_AF 2u
#define TX_PIN 7u /* PG7, AFRL */
#define RX_PIN 8u /* PG8, AFRH */
#define LPUART1_AF 8u

/* "Low-power universal asynchronous receiver transmitter (LPUART)": "LPUART registers" */
#define LPUART_CR1 REG32(LPUART1_BASE + 0x00u)  /* "LPUART control register 1" */
#define LPUART_CR1_UE (1u << 0)
#define LPUART_CR1_RE (1u << 2)
#define LPUART_CR1_TE (1u << 3)
#define LPUART_CR2 REG32(LPUART1_BASE + 0x04u)  /* "LPUART control register 2": STOP[1:0] = 00 */
#define LPUART_BRR REG32(LPUART1_BASE + 0x0Cu)  /* "LPUART baud rate register" */
#define LPUART_ISR REG32(LPUART1_BASE + 0x1Cu)  /* "LPUART interrupt and status register" */
#define LPUART_ISR_TXE (1u << 7)                /* TXE (TXFNF with FIFO): TDR may be written */
#define LPUART_ISR_TEACK (1u << 21)
#define LPUART_TDR REG32(LPUART1_BASE + 0x28u)  /* "LPUART transmit data register" */
#define LPUART_PRESC REG32(LPUART1_BASE + 0x2Cu) /* "LPUART prescaler register" */

#define UART_FCK 16000000u
#define UART_BAUD 115200u
#define UART_BRR ((uint32_t)((256ull * UART_FCK + UART_BAUD / 2u) / UART_BAUD))

/* RM0432's limits on the LPUART divider, checked at compile time (C99: no _Static_assert). */
typedef char mf_lpuart_brr_in_range[(UART_BRR >= 0x300u && UART_BRR <= 0xFFFFFu &&
                                     UART_FCK >= 3u * UART_BAUD &&
                                     UART_FCK <= 4096u * UART_BAUD) ? 1 : -1];

void mf_uart_init(void);
void mf_uart_putc(char c);

void mf_uart_init(void) {
    /* HSI16 on, as LPUART1's kernel clock */
    RCC_CR |= RCC_CR_HSION;
    while ((RCC_CR & RCC_CR_HSIRDY) == 0u) {
    }
    RCC_CCIPR = (RCC_CCIPR & ~(3u << RCC_CCIPR_LPUART1SEL_SHIFT)) |
                (RCC_CCIPR_LPUART1SEL_HSI16 << RCC_CCIPR_LPUART1SEL_SHIFT);

    /* VDDIO2 valid, so port G's pins work: needs the PWR interface clock first */
    RCC_APB1ENR1 |= RCC_APB1ENR1_PWREN;
    (void)RCC_APB1ENR1; /* read back: the clock is on before the next access */
    PWR_CR2 |= PWR_CR2_IOSV;

    /* PG7, PG8: alternate function 8 */
    RCC_AHB2ENR |= RCC_AHB2ENR_GPIOGEN;
    (void)RCC_AHB2ENR;
    GPIOG_AFRL = (GPIOG_AFRL & ~(0xFu << (4u * TX_PIN))) | (LPUART1_AF << (4u * TX_PIN));
    GPIOG_AFRH = (GPIOG_AFRH & ~(0xFu << (4u * (RX_PIN - 8u)))) |
                 (LPUART1_AF << (4u * (RX_PIN - 8u)));
    GPIOG_MODER = (GPIOG_MODER & ~((3u << (2u * TX_PIN)) | (3u << (2u * RX_PIN)))) |
                  (GPIO_MODE_AF << (2u * TX_PIN)) | (GPIO_MODE_AF << (2u * RX_PIN));

    /* LPUART1: 8N1 (reset values of CR1 and CR2), BRR while disabled, then enable */
    RCC_APB1ENR2 |= RCC_APB1ENR2_LPUART1EN;
    (void)RCC_APB1ENR2;
    LPUART_CR1 = 0u;
    LPUART_CR2 = 0u;
    LPUART_PRESC = 0u;
    LPUART_BRR = UART_BRR;
    LPUART_CR1 = LPUART_CR1_UE;
    LPUART_CR1 = LPUART_CR1_UE | LPUART_CR1_TE | LPUART_CR1_RE;
    while ((LPUART_ISR & LPUART_ISR_TEACK) == 0u) { /* transmitter enabled */
    }
}

void mf_uart_putc(char c) {
    while ((LPUART_ISR & LPUART_ISR_TXE) == 0u) {
    }
    LPUART_TDR = (uint8_t)c;
}
