"""What the code is generated for: the instruction-set features the schedules may use, the
alignment they may assume and the memory they must fit. Built from boards/<name>/board.toml
(mcuforge.board.Board.target) and handed to lowering, the schedule stage and the planner;
the host is a target too (portable C that gcc can vectorise)."""
from __future__ import annotations

from dataclasses import dataclass

FEATURES = {
    "dsp": "Arm DSP extension (v7E-M, v8-M Mainline with DSP): SMLAD, SXTB16, SSAT, SMMLAR",
    "mve": "Arm M-profile Vector Extension (Helium, v8.1-M): 128-bit integer vectors",
}


@dataclass(frozen=True)
class Target:
    name: str  # the board's
    cpu: str = "host"
    features: frozenset = frozenset()
    align: int = 4  # bytes: the arena and every kernel table start on this boundary
    flash_bytes: int | None = None  # None: unbounded (the host)
    ram_bytes: int | None = None
    flash_budget: int | None = None  # weights + code may use at most this (else flash_bytes)
    # layers (output tensor names) whose weights stay int8 where the target would widen them
    # to int16: the flash budget's choice (codegen_c/kernels/budget.py)
    narrow_weights: frozenset = frozenset()

    def __post_init__(self):
        unknown = set(self.features) - set(FEATURES)
        if unknown:
            raise ValueError(f"target {self.name}: unknown features {sorted(unknown)}; "
                             f"known: {', '.join(FEATURES)}")

    @property
    def dsp(self) -> bool:
        return "dsp" in self.features

    @property
    def host(self) -> bool:
        """The machine running mcuforge (x86-64 or AArch64 with wide SIMD units, gcc's
        auto-vectoriser): its own kernels (runtime_c/mcuforge_vec.h), not the Cortex-M ones."""
        return self.cpu == "host"

    @property
    def mve(self) -> bool:
        return "mve" in self.features

    @property
    def budget(self) -> int | None:
        """Bytes of flash the model may take: --flash-budget, else the board's flash."""
        return self.flash_budget if self.flash_budget is not None else self.flash_bytes


HOST = Target("host")
