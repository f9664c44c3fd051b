"""Python mirrors of the element-wise micro-kernels in runtime_c/mcuforge_ew.h for the loop-IR
evaluator (see micro.py): the C arguments in, outputs written in place. Registered into
qmath.INTRINSICS on import."""
from __future__ import annotations

import numpy as np

from . import pack_ew
from .loop_ir import UndefinedBehaviour
from .pack_ew import POOL_GEOM
from .qmath import INTRINSICS



def _add(big, small, y, n, tab, mult, add, post, signfix, lo, hi):
    c = dict(tab=np.asarray(tab[:256], np.int64), mult=mult, add=add, post=post,
             signfix=signfix, lo=lo, hi=hi)
    out = pack_ew.add_fast(np.asarray(big[:n]).view(np.uint8),
                           np.asarray(small[:n]).view(np.uint8), c)
    if out is None:
        raise UndefinedBehaviour("int32 overflow in mf_ew_add_s8")
    y[:n] = out


def _mul(x1, x2, y, n, off1, off2, mult, add, pre, post, signfix, lo, hi):
    c = dict(off1=off1, off2=off2, mult=mult, add=add, pre=pre, post=post, signfix=signfix,
             lo=lo, hi=hi)
    out = pack_ew.mul_fast(np.asarray(x1[:n]).view(np.uint8), np.asarray(x2[:n]).view(np.uint8),
                           c)
    if out is None:
        raise UndefinedBehaviour("int32 overflow in mf_ew_mul_s8")
    y[:n] = out


def _windows(geom):
    """(geometry dict, [(oy, ox, y0, y1, x0, x1)]): each output's window clipped to the image."""
    g = dict(zip(POOL_GEOM, (int(v) for v in geom[:len(POOL_GEOM)])))
    out = []
    for oy in range(g["oh"]):
        y0 = oy * g["sh"] - g["pt"]
        for ox in range(g["ow"]):
            x0 = ox * g["sw"] - g["pl"]
            out.append((oy, ox, max(y0, 0), min(y0 + g["fh"], g["h"]), max(x0, 0),
                        min(x0 + g["fw"], g["w"])))
    return g, out


def _maxpool(x, y, geom, lo, hi):
    g, wins = _windows(geom)
    img = np.asarray(x[:g["h"] * g["w"] * g["c"]], np.int64).reshape(g["h"], g["w"], g["c"])
    out = np.zeros((g["oh"], g["ow"], g["c"]), np.int64)
    for oy, ox, y0, y1, x0, x1 in wins:
        win = img[y0:y1, x0:x1].reshape(-1, g["c"])
        out[oy, ox] = win.max(axis=0) if len(win) else -128
    y[:out.size] = np.clip(out, lo, hi).reshape(-1)


def _avgpool(x, y, geom, lo, hi):
    g = dict(zip(POOL_GEOM, (int(v) for v in geom[:len(POOL_GEOM)])))
    img = np.asarray(x[:g["h"] * g["w"] * g["c"]], np.int64).reshape(g["h"], g["w"], g["c"])
    out = np.zeros((g["oh"], g["ow"], g["c"]), np.int64)
    for oy in range(g["oh"]):
        y0 = oy * g["sh"] - g["pt"]
        y1, y0 = min(y0 + g["fh"], g["h"]), max(y0, 0)
        for ox in range(g["ow"]):
            x0 = ox * g["sw"] - g["pl"]
            x1, x0 = min(x0 + g["fw"], g["w"]), max(x0, 0)
            count = (y1 - y0) * (x1 - x0)
            if count <= 0:
                raise UndefinedBehaviour("division by zero in mf_ew_avgpool_s8")
            s = img[y0:y1, x0:x1].sum(axis=(0, 1))
            q = np.where(s > 0, s + count // 2, s - count // 2)
            out[oy, ox] = np.sign(q) * (np.abs(q) // count)  # C division truncates
    y[:out.size] = np.clip(out, lo, hi).reshape(-1)


INTRINSICS.update({"mf_ew_add_s8": _add, "mf_ew_mul_s8": _mul, "mf_ew_avgpool_s8": _avgpool,
                   "mf_ew_maxpool_s8": _maxpool})


def _lut8(x, y, n, lut, flip):
    """mf_ew_lut8: y[i] = lut[x[i] ^ flip] on bytes."""
    if len(x) < n or len(y) < n or len(lut) < 256:
        raise UndefinedBehaviour("mf_ew_lut8 reaches past its buffers")
    idx = np.asarray(x[:n]).view(np.uint8) ^ np.uint8(flip)
    y[:n] = np.asarray(lut[:256]).view(np.uint8)[idx].view(y.dtype)


INTRINSICS["mf_ew_lut8"] = _lut8
