"""The tools on top of the compiler: bench, conformance suites, fuzzers, demos, the TFLM
reference runner and `info`. They use mcuforge's API and runner; nothing below imports them."""
