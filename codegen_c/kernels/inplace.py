"""In place: where a kernel's output may be written over one of its inputs.

A kernel's access order, written down per kernel as an access schedule: a sequence of steps,
each reading some input bytes and then writing some output bytes (all of a step's reads come
before its writes in the C, which the kernel's structure guarantees: it copies or widens what a
step reads into registers or scratch first). From it, read_last[a] (the last step reading input
byte a, -1 if none) and write_first[b] (the first step writing output byte b). Writing the
output at output = input + shift is safe exactly when every output byte b over an input byte
a = shift + b is written no earlier than the last read of a: read_last[a] <= write_first[b].

`best_shift` picks the largest safe shift <= 0 (a multiple of 4) between two candidates: 0,
checked exactly, and the bound of the first input byte still to be read after each step,
which is safe by construction (exact for kernels that read their input in address order). The
schedules below mirror the C loops named in their docstrings; tests/test_inplace_c.py runs each
declared kernel with its output over its input at the declared shift, on every body, and
checks that a shift one step tighter than the model allows breaks it.

Kernels declare nothing by default (loop_ir.Kernel.in_place = ()): the planner then keeps
their buffers apart."""
from __future__ import annotations

import re
from dataclasses import replace

import numpy as np

ALIGN = 4  # shifts are multiples of the arena's alignment
NEVER = np.iinfo(np.int64).max


class Access:
    """An access schedule over an input of n_in bytes and an output of n_out bytes."""

    def __init__(self, n_in: int, n_out: int):
        self.read_last = np.full(n_in, -1, np.int64)
        self.write_first = np.full(n_out, NEVER, np.int64)

    def read(self, step: int, idx) -> None:
        np.maximum.at(self.read_last, np.asarray(idx, np.int64).reshape(-1), step)

    def write(self, step: int, idx) -> None:
        np.minimum.at(self.write_first, np.asarray(idx, np.int64).reshape(-1), step)

    def read_range(self, step: int, lo: int, hi: int) -> None:
        self.read_last[lo:hi] = np.maximum(self.read_last[lo:hi], step)

    def write_range(self, step: int, lo: int, hi: int) -> None:
        self.write_first[lo:hi] = np.minimum(self.write_first[lo:hi], step)


def is_safe(acc: Access, shift: int) -> bool:
    """Every output byte over an input byte is written after that byte's last read."""
    n_in = acc.read_last.size
    b = np.arange(acc.write_first.size)
    a = b + shift
    m = (a >= 0) & (a < n_in) & (acc.write_first != NEVER)
    return bool((acc.read_last[a[m]] <= acc.write_first[m]).all())


def best_shift(acc: Access, align: int = ALIGN) -> int:
    """The largest safe shift <= 0 of the two candidates (always one: the output below the
    input, -n_out, is disjoint)."""
    if is_safe(acc, 0):
        return 0
    rl, wf = acc.read_last, acc.write_first
    n_in = rl.size
    top = int(max(rl.max(initial=-1), wf[wf != NEVER].max(initial=-1))) + 2
    first = np.full(top + 1, n_in, np.int64)  # first[v]: lowest address last read at step v
    read = rl >= 0
    np.minimum.at(first, rl[read], np.nonzero(read)[0])
    after = np.minimum.accumulate(first[::-1])[::-1]  # after[t]: lowest address read at >= t
    b = np.nonzero(wf != NEVER)[0]
    nxt = after[np.minimum(wf[b] + 1, top)]  # the first address read after wf[b]
    bound = (nxt - 1 - b)[nxt < n_in]  # s + b < it (none read after: no bound)
    shift = int(min(0, bound.min(initial=0)))
    shift = -((-shift + align - 1) // align * align)
    shift = max(shift, -((acc.write_first.size + align - 1) // align) * align)
    assert is_safe(acc, shift), "in-place bound"
    return shift


# The C functions whose loops the schedules below mirror (kernel.schedule; "" = the reference
# loops, reference.py). A kernel calling anything else (a new body, another engineer's entry)
# declares nothing until its own schedule is written down here and tested in C.
VERIFIED = re.compile(r"|mf_gemm_w(16|8)(_g\d+)?|mf_gemm2_w16_s[02]|mf_gemm1k8_w16_s[02]"
                      r"|mf_convp?_w(16|8)(_g\d+)?|mf_convrp2?_w16_n\d+(_x8)?"
                      r"|mf_dw3x3_s8_[12]f?c?_\d|mf_ew_(add|mul)_s8|mf_seq_quantize_s16_s8"
                      r"|mf_vec_(gemm|gemm_t|conv|dw)"
                      r"|mf_sc_gemm_(l64|m8)|mf_sc_conv_(l64|m8)|mf_sc_dw3"
                      r"|mf_mve_gemm_f[0-3]|mf_mve_gemm_k32|mf_mve_conv_f[0-3]|mf_mve_dw_conv_s8"
                      r"|mf_mve_dw_add_s8|mf_rv_gemm_p16|mf_rv_conv_p16|mf_rv_fc_p16"
                      r"|mf_rv_dw3|mf_rv_dwd")


def declare(kernel, buf: str, acc):
    """The kernel with its output allowed over input buffer `buf` at the best shift: the entry
    (buf, shift, tighter), `tighter` the next shift above it that the schedule rejects (None
    past 64 steps), which tests run to see that a wrong shift does break the kernel. `acc`: an
    Access, or a list of them when the kernel's bodies (a SIMD one and its portable C) walk in
    different orders: the shift is then safe for every one, `tighter` rejected by every one."""
    if acc is None or not VERIFIED.fullmatch(kernel.schedule):
        return kernel
    accs = list(acc) if isinstance(acc, (list, tuple)) else [acc]
    shift = min(best_shift(a) for a in accs)
    if not all(is_safe(a, shift) for a in accs):
        return kernel
    tighter = next((s for s in range(shift + ALIGN, shift + 65 * ALIGN, ALIGN)
                    if not any(is_safe(a, s) for a in accs)), None)
    return replace(kernel, in_place=tuple(kernel.in_place) + ((buf, shift, tighter),))


# ---- the kernels' schedules ---------------------------------------------------------------

def elementwise(n: int, in_size: int = 1, out_size: int = 1) -> Access:
    """Element i read, then element i written (mf_ew_add_s8, mf_ew_mul_s8,
    mf_seq_quantize_s16_s8: one pass, each output after its inputs)."""
    acc = Access(n * in_size, n * out_size)
    steps = np.arange(n)
    acc.read_last[:] = np.repeat(steps, in_size)
    acc.write_first[:] = np.repeat(steps, out_size)
    return acc


def gemm_rows(calls, n_in: int, n_out: int, block: int) -> Access:
    """GEMM micro-kernels over rows: per call (x offset, y offset, rows, x_stride, K, y_stride,
    O), rows in blocks of `block` whose K input bytes each are read (widened into scratch or
    registers) before any of the block's O outputs is written. mf_gemm_body and the
    mf_gemm_w16_g<G> entries (block 1), mf_gemm2_body (2: pairs, an odd last row alone),
    mf_gemm1k8_body (1), mf_vec_gemm (2), mf_vec_gemm_t (1), mf_rv_gemm_p16 (3: the group's
    rows interleaved into scratch by mf_rv_interleave3, then mf_rv_block3 reads only the
    scratch; a short last group re-reads its last row)."""
    acc = Access(n_in, n_out)
    step = 0
    for xo, yo, rows, xs, k, ys, o in calls:
        for r in range(rows):
            s = step + r // block
            acc.read_range(s, xo + r * xs, xo + r * xs + k)
            acc.write_range(s, yo + r * ys, yo + r * ys + o)
        step += -(-rows // block)
    return acc


def conv_rows(h: int, w: int, c: int, oh: int, ow: int, o: int, kh: int, sh: int,
              pt: int) -> Access:
    """Per output row oy: the input rows oy * sh - pt .. + kh - 1 inside the image copied or
    widened into scratch (whole rows: at least what the kernel reads), then output row oy
    written. mf_conv_body, mf_convp_body (mcuforge_nn.h), mf_crp_body (mf_convrp_*)."""
    acc = Access(h * w * c, oh * ow * o)
    for oy in range(oh):
        lo, hi = max(oy * sh - pt, 0), min(oy * sh - pt + kh, h)
        if hi > lo:
            acc.read_range(oy, lo * w * c, hi * w * c)
        acc.write_range(oy, oy * ow * o, (oy + 1) * ow * o)
    return acc


def vec_conv(geom, o: int) -> Access:
    """mf_vec_conv: output pixels in pairs (row-major), each pair's two patches widened, then
    both pixels written."""
    h, w, c, kh, kw, sh, sw, pt, pl, oh, ow = (int(v) for v in geom)
    acc = Access(h * w * c, oh * ow * o)
    x = np.arange(h * w * c).reshape(h, w, c)
    for p in range(oh * ow):
        oy, ox = divmod(p, ow)
        iy, ix = oy * sh - pt, ox * sw - pl
        patch = x[max(iy, 0):max(iy + kh, 0), max(ix, 0):max(ix + kw, 0)]
        acc.read(p // 2, patch)
        acc.write_range(p // 2, p * o, (p + 1) * o)
    return acc


def vec_dw(h: int, w: int, c: int, oh: int, ow: int, kh: int, sh: int, dh: int,
           pt: int) -> Access:
    """mf_vec_dw: per output row, the window's input rows not yet in the ring widened (each
    row read once, when first needed), then output row oy written from the ring."""
    acc = Access(h * w * c, oh * ow * c)
    seen = set()
    for oy in range(oh):
        for ky in range(kh):
            iy = oy * sh - pt + ky * dh
            if 0 <= iy < h and iy not in seen:
                seen.add(iy)
                acc.read_range(oy, iy * w * c, (iy + 1) * w * c)
        acc.write_range(oy, oy * ow * c, (oy + 1) * ow * c)
    return acc


def dw3x3(g: dict) -> Access:
    """mf_dw_drive (mcuforge_dw.h, both bodies): per pass of cg channels, per band of output
    rows in the kernel's view (columns when g['transpose']), the band's new input rows of the
    pass's channels widened (rows the last band had are copied inside the scratch), then the
    band's output rows of those channels written."""
    t, c, s = g["transpose"], g["c"], g["stride"]
    x = np.arange(g["h"] * g["w"] * c).reshape(g["h"], g["w"], c)
    y = np.arange(g["oh"] * g["ow"] * c).reshape(g["oh"], g["ow"], c)
    if t:  # the kernel's rows are the image's columns
        x, y = x.transpose(1, 0, 2), y.transpose(1, 0, 2)
    h, oh = x.shape[0], y.shape[0]
    pad_t = g["pad_l"] if t else g["pad_t"]
    band = (g["rows"] - 3) // s + 1
    acc = Access(x.size, y.size)
    step = 0
    for c0 in range(0, c, g["cg"]):
        c1 = min(c, c0 + g["cg"])
        for oy0 in range(0, oh, band):
            nb = min(band, oh - oy0)
            iy0 = oy0 * s - pad_t
            nr = (nb - 1) * s + 3
            keep = 3 - s if oy0 else 0
            r0 = max(-iy0 if iy0 < 0 else 0, keep)
            r1 = min(h - iy0, nr)
            if r1 > r0:
                acc.read(step, x[iy0 + r0:iy0 + r1, :, c0:c1])
            acc.write(step, y[oy0:oy0 + nb, :, c0:c1])
            step += 1
    return acc


def reference_depthwise(h: int, w: int, c: int, oh: int, ow: int, m: int, kh: int, kw: int,
                        stride, dilation, pt: int, pl: int, x_item: int = 1,
                        y_item: int = 1) -> Access:
    """lower/conv.py's depthwise_conv2d loops (batch 1): for oy, ox, ic, m in that order, each
    output element after its taps inside the image x[oy * sh - pt + ky * dh][ox * sw - pl +
    kx * dw][ic]; one step per output element."""
    (sh, sw), (dh, dw) = stride, dilation
    oy, ox, ic, mm = np.meshgrid(np.arange(oh), np.arange(ow), np.arange(c), np.arange(m),
                                 indexing="ij")
    step = ((oy * ow + ox) * c + ic) * m + mm
    acc = Access(h * w * c * x_item, oh * ow * c * m * y_item)
    for ky in range(kh):
        for kx in range(kw):
            iy, ix = oy * sh - pt + ky * dh, ox * sw - pl + kx * dw
            ok = (iy >= 0) & (iy < h) & (ix >= 0) & (ix < w)
            e = ((iy * w + ix) * c + ic)[ok]
            for b in range(x_item):
                np.maximum.at(acc.read_last, e * x_item + b, step[ok])
    for b in range(y_item):
        acc.write_first[step.reshape(-1) * y_item + b] = step.reshape(-1)
    return acc


def gemm_blocks(calls, n_in: int, n_out: int, rows: int, oblock: int = 4) -> Access:
    """GEMMs whose row loop holds a loop over blocks of `oblock` output channels, each block
    reading its rows' K input bytes again (the weights of that block against the whole row)
    before it stores the block's channels of those rows: per call (x offset, y offset, rows,
    x_stride, K, y_stride, O), rows in groups of `rows` (the last group short), one step per
    (group, channel block). The output of a row may therefore only go over input its later
    blocks no longer read. mf_sc_gemm_l64 (groups of 1), mf_sc_gemm_m8 (3: a short last group
    re-reads its last row, which changes nothing here), mf_mve_gemm_f<F> (mf_mve_gemm_body,
    Helium: pairs through mf_mve_row2, an odd last row alone through mf_mve_row, blocks of 4;
    its portable body: row after row, each channel stored after its own pass over the row:
    groups of 1, blocks of 1), mf_rv_fc_p16 (mf_rv_block1: one row read in place again per
    block of 4 channels: groups of 1, blocks of 4)."""
    acc = Access(n_in, n_out)
    step = 0
    for xo, yo, n, xs, k, ys, o in calls:
        nb = -(-o // oblock)
        for r0 in range(0, n, rows):
            group = range(r0, min(n, r0 + rows))
            for b in range(nb):
                for r in group:
                    acc.read_range(step, xo + r * xs, xo + r * xs + k)
                for r in group:
                    acc.write_range(step, yo + r * ys + b * oblock,
                                    yo + r * ys + min(o, (b + 1) * oblock))
                step += 1
    return acc


def block_rows(calls, n_in: int, n_out: int, oblock: int = 4) -> Access:
    """GEMMs whose block loop holds the row loop: per call (x offset, y offset, rows, x_stride,
    K, y_stride, O), per full block of `oblock` channels every row's K bytes read (in row
    order) before that row's channels of the block are stored, one step per (block, row);
    then the last O % oblock channels row after row (a row read, then its channels stored).
    mf_mve_gemm_k32's asm body: mf_mve_rows16 / mf_mve_rows32 per block (a row's unpredicated
    16-byte loads may reach past its K bytes into the next rows or the stride's gap: those
    lanes meet zero weights, so only the K bytes count), then mf_mve_row per row."""
    acc = Access(n_in, n_out)
    step = 0
    for xo, yo, n, xs, k, ys, o in calls:
        full = o // oblock
        for b in list(range(full)) + ([full] if o % oblock else []):
            for r in range(n):
                acc.read_range(step, xo + r * xs, xo + r * xs + k)
                acc.write_range(step, yo + r * ys + b * oblock,
                                yo + r * ys + min(o, (b + 1) * oblock))
                step += 1
    return acc


def _patch(x, geom, p: int):
    """The input bytes of output pixel p's window inside the image (row-major pixels)."""
    h, w, c, kh, kw, sh, sw, pt, pl, oh, ow = (int(v) for v in geom)
    oy, ox = divmod(p, ow)
    iy, ix = oy * sh - pt, ox * sw - pl
    return x[max(iy, 0):max(iy + kh, 0), max(ix, 0):max(ix + kw, 0)]


def conv_batches(geom, o: int, batch: int) -> Access:
    """im2col convolutions: output pixels (row-major) in batches of `batch`, the batch's
    patches gathered from the input into scratch, then the batch's outputs written from the
    scratch. mf_mve_conv_f<F> (mf_mve_conv_body: pairs, an odd last pixel alone; = vec_conv;
    windows inside the image copied row by row by mf_mve_patch16, the others by
    mf_mve_im2col: both into the pair's scratch before mf_mve_row2 stores the two pixels),
    mf_sc_conv_m8 and mf_sc_conv_l64_im2col (MF_SC_CONV: P patches a batch), mf_rv_conv_p16
    (3 a batch: a patch inside the image read in place, one touching the padding gathered by
    mf_sc_im2col, both into the interleaved scratch before mf_rv_block3 stores the three
    pixels; a short last batch re-reads its last patch)."""
    h, w, c, _, _, _, _, _, _, oh, ow = (int(v) for v in geom)
    acc = Access(h * w * c, oh * ow * o)
    x = np.arange(h * w * c).reshape(h, w, c)
    for p in range(oh * ow):
        acc.read(p // batch, _patch(x, geom, p))
        acc.write_range(p // batch, p * o, (p + 1) * o)
    return acc


def sc_conv_l64(geom, o: int, batch: int, chunk: int) -> Access:
    """mf_sc_conv_l64: where the lanes need one chunk (L >= K, k_h <= MF_SC_MAX_KH) per output
    pixel (row-major) per block of 4 channels, the window read again (k_h row segments in
    place; a window touching the padding gathered into scratch once, in the pixel's first
    block) before the block's 4 outputs are stored; else mf_sc_conv_l64_im2col."""
    h, w, c, kh, kw, _, _, _, _, oh, ow = (int(v) for v in geom)
    k = kh * kw * c
    if chunk < k or kh > 16:
        return conv_batches(geom, o, batch)
    acc = Access(h * w * c, oh * ow * o)
    x = np.arange(h * w * c).reshape(h, w, c)
    nb = -(-o // 4)
    for p in range(oh * ow):
        patch = _patch(x, geom, p)
        inside = patch.shape[0] == kh and patch.shape[1] == kw
        for b in range(nb):
            step = p * nb + b
            if inside or b == 0:
                acc.read(step, patch)
            acc.write_range(step, p * o + 4 * b, p * o + min(o, 4 * b + 4))
    return acc


def channels(h: int, w: int, c: int, oh: int, ow: int, group: int = 1) -> Access:
    """Depthwise kernels walking channels outermost: per pass of `group` channels, every
    input pixel of those channels copied into planes in scratch, then every output of those
    channels written. mf_sc_dw3 (one channel a pass), mf_mve_dw_conv_s8 (geom.cg channels a
    pass; with cg = 1 each channel's plane copied by its own channel's loop)."""
    x = np.arange(h * w * c).reshape(h * w, c)
    y = np.arange(oh * ow * c).reshape(oh * ow, c)
    acc = Access(x.size, y.size)
    for s, c0 in enumerate(range(0, c, group)):
        acc.read(s, x[:, c0:c0 + group])
        acc.write(s, y[:, c0:c0 + group])
    return acc


def rv_dw3(g, n_in: int, n_out: int) -> Access:
    """mf_rv_dw3 (mcuforge_rv.h) from its geometry g (scalar.dw_geometry: VH VW C VOH VOW sy sx
    pad_y pad_x in_ys in_xs out_ys out_xs PH PW, in the plane's view, transposed or not): one
    step per channel c, in order: mf_rv_dw_plane reads the channel's input pixels inside the
    plane (plane rows max(pad_y, 0)..min(pad_y + VH, PH), columns likewise: a pixel the
    windows never reach is not read), then mf_rv_dw_rows writes all VOH x VOW outputs of
    channel c (every one of its steps, 4 / 2 / 1 at a time, reads the plane only)."""
    vh, vw, c, voh, vow, _, _, pt, pl, ys, xs, oys, oxs, ph, pw = (int(v) for v in g)
    ya, yb, xa, xb = min(pt, ph), min(pt + vh, ph), min(pl, pw), min(pl + vw, pw)
    iy, ix = np.meshgrid(np.arange(ya, yb) - pt, np.arange(xa, xb) - pl, indexing="ij")
    src = iy * ys + ix * xs
    oy, ox = np.meshgrid(np.arange(voh), np.arange(vow), indexing="ij")
    dst = oy * oys + ox * oxs
    acc = Access(n_in, n_out)
    for ch in range(c):
        acc.read(ch, src + ch)
        acc.write(ch, dst + ch)
    return acc


def dwd_units(ow: int, sw: int, pl: int, re: int) -> list[tuple[int, int]]:
    """mf_rv_dwd_row's outputs of a row in its order, as (first, count) units: the left edge,
    steps of 4 (stride 1) or 2 (stride 2), 3 or 2 more at stride 1, singles, the right edge."""
    units, ox, end = [], 0, ow - 1 if re else ow
    if pl:
        units.append((0, 1))
        ox = 1
    step = {1: 4, 2: 2}.get(sw, 1)
    while ox + step <= end:
        units.append((ox, step))
        ox += step
    if sw == 1 and end - ox in (2, 3):
        units.append((ox, end - ox))
        ox = end
    while ox < end:
        units.append((ox, 1))
        ox += 1
    if re and ox < ow:
        units.append((ox, 1))
    return units


def rv_dwd(h: int, w: int, c: int, oh: int, ow: int, sh: int, sw: int, pt: int, pl: int,
           tr: int, dly: int, n_in: int, n_out: int, walk: bool = False) -> Access:
    """mf_rv_dwd (mcuforge_rv.h) on its plane (h x w, output oh x ow: the image, or with tr
    its transpose): per channel, per output row of the plane in order, per unit of the row
    (dwd_units; all its taps read, then its outputs written). With dly the row's outputs go to
    scratch: one step per row reads the row's taps and then writes the row above; a last step
    writes the channel's last row. walk: the shared copies' rows (mf_rv_dwd_walk), one output
    a unit (each written once its last column is read; the columns before were read earlier)."""
    re = int((ow - 1) * sw - pl + 2 >= w)
    units = [(i, 1) for i in range(ow)] if walk else dwd_units(ow, sw, pl, re)
    acc, step = Access(n_in, n_out), 0
    ys, xs = (c, h * c) if tr else (w * c, c)  # bytes between plane rows, columns in x
    oys, oxs = (c, oh * c) if tr else (ow * c, c)  # and in y

    def taps(oy, ox0, k):
        iy = oy * sh - pt + np.arange(3)
        ix = (ox0 + np.arange(k))[:, None] * sw - pl + np.arange(3)[None, :]
        iy, ix = iy[(iy >= 0) & (iy < h)], np.unique(ix[(ix >= 0) & (ix < w)])
        return (iy[:, None] * ys + ix[None, :] * xs).reshape(-1)

    def row(oy, ox):
        return oy * oys + np.asarray(ox) * oxs

    for ch in range(c):
        for oy in range(oh):
            for ox0, k in units:
                acc.read(step, taps(oy, ox0, k) + ch)
                if not dly:
                    acc.write(step, row(oy, ox0 + np.arange(k)) + ch)
                    step += 1
            if dly:
                if oy:
                    acc.write(step, row(oy - 1, np.arange(ow)) + ch)
                step += 1
        if dly:
            acc.write(step, row(oh - 1, np.arange(ow)) + ch)
            step += 1
    return acc
