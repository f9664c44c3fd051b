/* UART output of the nRF52840 DK (nRF52840): UART0, TXD on P0.06 and RXD on P0.08, which the
 * DK wires to the J-Link OB virtual COM port (nRF52840 DK user guide, "Virtual COM port").
 * 115200 baud, 8 data bits, no parity, 1 stop bit, no flow control. Register level, no vendor
 * headers; addresses and bit positions from the nRF52840 Product Specification (section names
 * in the comments). The legacy UART (not UARTE with EasyDMA) keeps the driver to a few
 * registers: one byte at a time through TXD, no RAM buffer.
 *
 * Not yet run on hardware.
 *
 * Clock: the UART's baud rate generator runs from HFCLK, HFINT after reset; the Product
 * Specification notes the baud rate accuracy depends on the HFCLK source, so mf_uart_init
 * starts the crystal oscillator (HFXO) first. The CPU runs at 64 MHz from either source.
 *
 * The reset handler calls mf_uart_init through mf_board_init; the formatter in mf_board.c sends
 * every character through mf_uart_putc. With `make SEMIHOSTING=1` nothing calls either, and
 * --gc-sections drops them. */
#include <stdint.h>

#define REG32(addr) (*(volatile uint32_t *)(addr))

/* "Memory" -> "Instantiation" (peripheral IDs and base addresses) */
#define CLOCK_BASE 0x40000000u
#define UART0_BASE 0x40002000u
#define P0_BASE 0x50000000u

/* "CLOCK - Clock control" -> "Registers" */
#define CLOCK_TASKS_HFCLKSTART REG32(CLOCK_BASE + 0x000u)   /* start HFXO */
#define CLOCK_EVENTS_HFCLKSTARTED REG32(CLOCK_BASE + 0x100u) /* HFXO started */

/* "GPIO - General purpose input/output" -> "Registers" */
#define P0_OUTSET REG32(P0_BASE + 0x508u)
#define P0_PIN_CNF(n) REG32(P0_BASE + 0x700u + 4u * (n))
#define PIN_CNF_DIR_OUTPUT (1u << 0)
#define PIN_CNF_INPUT_DISCONNECT (1u << 1)
#define TX_PIN 6u /* P0.06 */
#define RX_PIN 8u /* P0.08 */

/* "UART - Universal asynchronous receiver/transmitter" -> "Registers" */
#define UART_TASKS_STARTTX REG32(UART0_BASE + 0x008u)
#define UART_EVENTS_TXDRDY REG32(UART0_BASE + 0x11Cu) /* the byte in TXD has been sent */
#define UART_ENABLE REG32(UART0_BASE + 0x500u)
#define UART_ENABLE_ENABLED 4u
#define UART_PSEL_RTS REG32(UART0_BASE + 0x508u)
#define UART_PSEL_TXD REG32(UART0_BASE + 0x50Cu)
#define UART_PSEL_CTS REG32(UART0_BASE + 0x510u)
#define UART_PSEL_RXD REG32(UART0_BASE + 0x514u)
#define PSEL_PORT_SHIFT 5u /* PSEL.x: PIN[4:0], PORT bit 5, CONNECT bit 31 (0 = connected) */
#define PSEL_DISCONNECTED 0xFFFFFFFFu
#define UART_TXD REG32(UART0_BASE + 0x51Cu)
#define UART_BAUDRATE REG32(UART0_BASE + 0x524u)
#define UART_BAUDRATE_115200 0x01D7E000u   /* actual rate 115942 baud */
#define UART_CONFIG REG32(UART0_BASE + 0x56Cu) /* HWFC bit 0, PARITY[3:1], STOP bit 4: all 0 */

/* Bound on the wait for HFXO (a few hundred microseconds on the DK); past it, stay on HFINT. */
#define HFXO_WAIT_LOOPS 1000000u

void mf_uart_init(void);
void mf_uart_putc(char c);

static uint32_t tx_pending; /* a byte written to TXD whose TXDRDY has not been seen yet */

void mf_uart_init(void) {
    uint32_t n;

    /* HFCLK from the 32 MHz crystal for an accurate baud rate */
    CLOCK_EVENTS_HFCLKSTARTED = 0u;
    CLOCK_TASKS_HFCLKSTART = 1u;
    for (n = 0; n < HFXO_WAIT_LOOPS && CLOCK_EVENTS_HFCLKSTARTED == 0u; ++n) {
    }

    /* Pin levels while the UART is disabled ("UART" -> "Pin configuration"): TXD an output
     * driven high (idle), RXD an input. */
    P0_OUTSET = 1u << TX_PIN;
    P0_PIN_CNF(TX_PIN) = PIN_CNF_DIR_OUTPUT | PIN_CNF_INPUT_DISCONNECT;
    P0_PIN_CNF(RX_PIN) = 0u;

    UART_ENABLE = 0u;
    UART_PSEL_TXD = (0u << PSEL_PORT_SHIFT) | TX_PIN;
    UART_PSEL_RXD = (0u << PSEL_PORT_SHIFT) | RX_PIN;
    UART_PSEL_RTS = PSEL_DISCONNECTED;
    UART_PSEL_CTS = PSEL_DISCONNECTED;
    UART_BAUDRATE = UART_BAUDRATE_115200;
    UART_CONFIG = 0u;
    UART_ENABLE = UART_ENABLE_ENABLED;
    UART_EVENTS_TXDRDY = 0u;
    UART_TASKS_STARTTX = 1u;
    tx_pending = 0u;
}

void mf_uart_putc(char c) {
    if (tx_pending) { /* wait until the previous byte has left TXD */
        while (UART_EVENTS_TXDRDY == 0u) {
        }
        UART_EVENTS_TXDRDY = 0u;
    }
    UART_TXD = (uint8_t)c;
    tx_pending = 1u;
}
