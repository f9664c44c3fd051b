"""Flash is a budget: int16 pre-widened weights (the fastest GEMM form on the DSP extension)
double a layer's weight bytes. When the whole model (every kernel's constant data plus an
allowance for the code) would not fit the target's flash budget, layers go back to int8
weights widened in the loop, cheapest first: the fewest extra instructions per byte saved,
estimated from the micro-kernels' measured costs. The choice is reported per layer.
On Helium targets the GEMM layers run mcuforge_mve.h's kernels on int8 weights (kernels/mve.py,
schedules mf_mve_*): 1x flash, nothing to narrow (fit only considers the "_w16" schedules and,
on Armv7-M without DSP, kernels/scalar.py's "l64" lane words: two channels an int32 word, 2x
flash, narrowed to its "m8" kernels on int8 weights; on RV32, kernels/rv.py's "p16" words,
likewise narrowed to "m8")."""
from __future__ import annotations

from dataclasses import dataclass, replace

from .. import loop_ir as ir
from .. import pack

CODE_ALLOWANCE = 16 * 1024  # bytes of flash kept for the code itself (runtime and kernels)
# extra instructions per MAC of int8 weights widened in the loop over pre-widened int16 ones
# (mf_gemm_w8 vs mf_gemm_w16 on the Cortex-M4, tests/nn_bench)
W8_EXTRA_PER_MAC = 0.45
# the row-paired first convolutions (mf_convrp*) fall back to im2col with int8 weights
# (mf_conv_w8): KWS's first layer 276K -> 494K instructions for 320K MACs
CONVRP_W8_EXTRA_PER_MAC = 0.68
# Armv7-M without DSP (kernels/scalar.py): the "l64" kernels keep two channels' weights in one
# int32 lane word (2x the int8 bytes); narrowed they run "m8" (int8 weights, mla per MAC,
# accumulators spilled on the M3): VWW's 10 layers narrowed under a 320,000-byte budget 20.92 M
# instructions against 11.24 M on lane words, for 6.19 M MACs
L64 = ("mf_sc_gemm_l64", "mf_sc_conv_l64")
L64_M8_EXTRA_PER_MAC = 1.56
# RV32 (kernels/rv.py): the "p16" kernels keep two channels' weights in one int32 word (and a
# word per chunk of taps: over 2x the int8 bytes); narrowed, rv.py declines them and they run
# scalar.py's "m8" (batch-1 fully connected layers gemm.py's mf_gemm_w8). Measured on QEMU
# riscv32-virt (-icount, per layer), every p16 layer narrowed: VWW's 14 convolutions 19.42 M
# -> 27.63 M instructions for 6.69 M MACs (1.23 a MAC, 0.95-1.49 by layer), KWS's 5 2.37 M
# MACs 7.16 M -> 9.30 M (0.90): 10.35 M extra instructions for 9.06 M MACs
P16 = ("mf_rv_gemm_p16", "mf_rv_conv_p16", "mf_rv_fc_p16")
P16_M8_EXTRA_PER_MAC = 1.14


@dataclass(frozen=True)
class Choice:
    layer: str  # the kernel's output tensor
    schedule: str
    weight_bytes: int  # constant data of the kernel (packed weights and tables)


def flash_bytes(kernels) -> int:
    return CODE_ALLOWANCE + sum(b.data.nbytes for k in kernels if k is not None
                                for b in k.consts)


def fit(target, lowered: dict):
    """The target with Target.narrow_weights set so that the model fits target.budget (as far
    as int8 weights can make it fit): `lowered` maps each layer's output tensor to its kernel
    for `target`. Layers leave int16 weights (on the DSP extension), lane words (Armv7-M
    without it) or p16 words (RV32) in order of extra instructions per byte saved."""
    budget = target.budget
    if budget is None or flash_bytes(lowered.values()) <= budget:
        return target
    wide = []
    for key, k in lowered.items():
        if k is not None and "_w16" in k.schedule:  # mf_*_w16 and mf_*_w16_g<G>
            saved, extra = _narrow_saving(k), W8_EXTRA_PER_MAC
            if k.schedule.startswith("mf_convrp"):  # int16 weight pairs inside its int32
                # table: 4 NW of every 4 NW + 18 words (the rest: bias, requantization)
                nw = int(k.schedule.split("_w16_n", 1)[1].split("_")[0])
                saved += sum(b.data.nbytes for b in k.consts if b.name == "pk") * 2 * nw // (
                    4 * nw + 18)
                extra = CONVRP_W8_EXTRA_PER_MAC
            if saved > 0:  # (mf_gemm1k8_w16 with O < 4 would grow)
                wide.append((k.macs * extra / saved, key, saved))
        elif k is not None and k.schedule in L64 + P16:  # cores without DSP: lane words or
            # p16 words -> int8; half the words' bytes, at most what m8 saves on p16 (its chunk
            # words go too), so the model never stays over the budget for want of a layer
            saved = sum(b.data.nbytes for b in k.consts if b.name == "w") // 2
            if k.schedule in P16:  # its records' bytes beyond m8's / mf_gemm_w8's 20 a channel
                from .rv import REC_WORDS
                rec = sum(b.data.nbytes for b in k.consts if b.name == "rq")
                saved += rec - 20 * (rec // (4 * REC_WORDS))
            extra = L64_M8_EXTRA_PER_MAC if k.schedule in L64 else P16_M8_EXTRA_PER_MAC
            if saved > 0:
                wide.append((k.macs * extra / saved, key, saved))
    need = flash_bytes(lowered.values()) - budget
    narrow = set(target.narrow_weights)
    for _, key, saved in sorted(wide, key=lambda t: (t[0], str(t[1]))):
        if need <= 0:
            break
        narrow.add(key)
        need -= saved
    return replace(target, narrow_weights=frozenset(narrow))


def _narrow_saving(k) -> int:
    """Bytes int8 weights save: half the int16 packed weights (the only int16 constants of the
    mf_*_w16* kernels); mf_gemm2_w16's and mf_gemm1k8_w16's int32 streams hold the int16
    weights beside bias and mf_rq, and go back to mf_gemm_w8 (Op x Kp bytes, Op = O rounded
    up to 4, bias and mf_rq 20 bytes a channel)."""
    if k.schedule.startswith(("mf_gemm2_w16", "mf_gemm1k8_w16")):  # their int32 streams
        call = next(s for s in ir.walk(k.body) if isinstance(s, ir.CallStmt))
        o, kp = call.args[5].value, pack.kpad(call.args[3].value)
        stream = sum(b.data.nbytes for b in k.consts)
        return stream - (o + 3) // 4 * 4 * kp - 20 * o  # less mf_gemm_w8's weights, bias, rq
    return sum(b.data.nbytes for b in k.consts if b.dtype == "int16") // 2


def choices(lowered: dict) -> list:
    return [Choice(key, k.schedule, sum(b.data.nbytes for b in k.consts))
            for key, k in lowered.items() if k is not None and k.schedule]


def summary(chosen) -> str | None:
    """The flash budget's line of the compile report (None when every layer has one form):
    how many layers keep int8 weights and how many the wide form (int16 on the DSP extension,
    lane words on Armv7-M without it, p16 words on RV32)."""
    narrow = [c for c in chosen if c.schedule.endswith(("_w8", "_m8"))]
    w16 = [c for c in chosen if "_w16" in c.schedule]
    lanes = [c for c in chosen if c.schedule in L64]
    p16 = [c for c in chosen if c.schedule in P16]
    if not narrow or not (w16 or lanes or p16):
        return None
    wide = ", ".join(f"{len(c)} {what}" for c, what in (
        (w16, "int16"), (lanes, "lane words"), (p16, "p16 words")) if c)
    return f"flash budget: {len(narrow)} layers keep int8 weights, {wide}"
