/* UART output of the STM32F746G-DISCO (STM32F746NG): USART1, TX on PA9 and RX on PB7, which
 * the board wires to the ST-LINK virtual COM port (UM1907, "Virtual COM port"). 115200 baud,
 * 8 data bits, no parity, 1 stop bit. Register level, no vendor headers; addresses and bit
 * positions from the reference manual RM0385 (section names in the comments).
 *
 * Not yet run on hardware.
 *
 * Kernel clock: HSI (16 MHz), selected explicitly rather than through PCLK2, so the baud rate
 * holds whatever the application does to the bus clocks. RM0385 "USART baud rate generation",
 * oversampling by 16: USARTDIV = fck / baud = 16 MHz / 115200 = 138.9 -> 139 (115108 baud,
 * -0.08 %), BRR = USARTDIV.
 *
 * The reset handler calls mf_uart_init through mf_board_init; the formatter in mf_board.c sends
 * every character through mf_uart_putc. With `make SEMIHOSTING=1` nothing calls either, and
 * --gc-sections drops them. */
#include <stdint.h>

#define REG32(addr) (*(volatile uint32_t *)(addr))

/* "Memory map and register boundary addresses" */
#define RCC_BASE 0x40023800u
#define GPIOA_BASE 0x40020000u
#define GPIOB_BASE 0x40020400u
#define USART1_BASE 0x40011000u

/* "Reset and clock control (RCC)" */
#define RCC_AHB1ENR REG32(RCC_BASE + 0x30u)     /* "RCC AHB1 peripheral clock register" */
#define RCC_AHB1ENR_GPIOAEN (1u << 0)
#define RCC_AHB1ENR_GPIOBEN (1u << 1)
#define RCC_APB2ENR REG32(RCC_BASE + 0x44u)     /* "RCC APB2 peripheral clock enable
                                                   register" */
#define RCC_APB2ENR_USART1EN (1u << 4)
/* "RCC dedicated clocks configuration register 2": USART1SEL[1:0] at bits 1:0, 00 PCLK2,
 * 01 SYSCLK, 10 HSI, 11 LSE */
#define RCC_DCKCFGR2 REG32(RCC_BASE + 0x90u)
#define RCC_DCKCFGR2_USART1SEL_SHIFT 0u
#define RCC_DCKCFGR2_USART1SEL_HSI 2u

/* "General-purpose I/Os (GPIO)": "GPIO port mode register", "GPIO alternate function low/high
 * register". MODE 10 = alternate function; AF7 = USART1 on PA9 and PB7 (STM32F746xx datasheet,
 * alternate function table). */
#define GPIOA_MODER REG32(GPIOA_BASE + 0x00u)
#define GPIOA_AFRH REG32(GPIOA_BASE + 0x24u)
#define GPIOB_MODER REG32(GPIOB_BASE + 0x00u)
#define GPIOB_AFRL REG32(GPIOB_BASE + 0x20u)
#define GPIO_MODE_AF 2u
#define TX_PIN 9u /* PA9, AFRH */
#define RX_PIN 7u /* PB7, AFRL */
#define USART1_AF 7u

/* "Universal synchronous receiver transmitter (USART)": "USART registers" */
#define USART_CR1 REG32(USART1_BASE + 0x00u)    /* "Control register 1" */
#define USART_CR1_UE (1u << 0)
#define USART_CR1_RE (1u << 2)
#define USART_CR1_TE (1u << 3)
#define USART_CR2 REG32(USART1_BASE + 0x04u)    /* "Control register 2": STOP[1:0] = 00 */
#define USART_CR3 REG32(USART1_BASE + 0x08u)    /* "Control register 3": no flow control */
#define USART_BRR REG32(USART1_BASE + 0x0Cu)    /* "Baud rate register" */
#define USART_ISR REG32(USART1_BASE + 0x1Cu)    /* "Interrupt and status register" */
#define USART_ISR_TXE (1u << 7)                 /* TDR empty: may be written */
#define USART_ISR_TEACK (1u << 21)
#define USART_TDR REG32(USART1_BASE + 0x28u)    /* "Transmit data register" */

#define UART_FCK 16000000u
#define UART_BAUD 115200u
#define UART_BRR ((UART_FCK + UART_BAUD / 2u) / UART_BAUD)

/* RM0385: with oversampling by 16, BRR must be at least 16 (C99: no _Static_assert). */
typedef char mf_usart_brr_in_range[(UART_BRR >= 16u && UART_BRR <= 0xFFFFu) ? 1 : -1];

void mf_uart_init(void);
void mf_uart_putc(char c);

void mf_uart_init(void) {
    /* HSI is on after reset; make it USART1's kernel clock */
    RCC_DCKCFGR2 = (RCC_DCKCFGR2 & ~(3u << RCC_DCKCFGR2_USART1SEL_SHIFT)) |
                   (RCC_DCKCFGR2_USART1SEL_HSI << RCC_DCKCFGR2_USART1SEL_SHIFT);

    /* PA9 (TX) and PB7 (RX): alternate function 7 */
    RCC_AHB1ENR |= RCC_AHB1ENR_GPIOAEN | RCC_AHB1ENR_GPIOBEN;
    (void)RCC_AHB1ENR; /* read back: the clocks are on before the next access */
    GPIOA_AFRH = (GPIOA_AFRH & ~(0xFu << (4u * (TX_PIN - 8u)))) |
                 (USART1_AF << (4u * (TX_PIN - 8u)));
    GPIOA_MODER = (GPIOA_MODER & ~(3u << (2u * TX_PIN))) | (GPIO_MODE_AF << (2u * TX_PIN));
    GPIOB_AFRL = (GPIOB_AFRL & ~(0xFu << (4u * RX_PIN))) | (USART1_AF << (4u * RX_PIN));
    GPIOB_MODER = (GPIOB_MODER & ~(3u << (2u * RX_PIN))) | (GPIO_MODE_AF << (2u * RX_PIN));

    /* USART1: 8N1, oversampling by 16 (reset values of CR1..CR3), BRR while disabled, enable */
    RCC_APB2ENR |= RCC_APB2ENR_USART1EN;
    (void)RCC_APB2ENR;
    USART_CR1 = 0u;
    USART_CR2 = 0u;
    USART_CR3 = 0u;
    USART_BRR = UART_BRR;
    USART_CR1 = USART_CR1_UE | USART_CR1_TE | USART_CR1_RE;
    while ((USART_ISR & USART_ISR_TEACK) == 0u) { /* transmitter enabled */
    }
}

void mf_uart_putc(char c) {
    while ((USART_ISR & USART_ISR_TXE) == 0u) {
    }
    USART_TDR = (uint8_t)c;
}
