"""Arrays a user hands mcuforge on the command line (`run --input`, `validate --data`): a .npy
or .npz file, checked before use, with one clear error for anything else."""
from __future__ import annotations

import zipfile

import numpy as np

from mcuforge.ir.errors import McuforgeError


def load_arrays(path: str):
    """The array of a .npy, or {name: array} of a .npz, at `path`."""
    try:
        with open(path, "rb") as f:
            head = f.read(6)
        if head != b"\x93NUMPY" and head[:4] != b"PK\x03\x04":
            raise McuforgeError(f"cannot read inputs from {path}: not a .npy or .npz file")
        data = np.load(path, allow_pickle=False)
        if isinstance(data, np.lib.npyio.NpzFile):
            with data:
                data = {k: data[k] for k in data.files}
    except (OSError, ValueError, zipfile.BadZipFile) as e:
        why = e.strerror if isinstance(e, OSError) and e.strerror else e
        raise McuforgeError(f"cannot read inputs from {path}: {why}") from None
    for k, v in (data.items() if isinstance(data, dict) else [(None, data)]):
        if not isinstance(v, np.ndarray):  # a .zip member that is no .npy
            raise McuforgeError(f"cannot read inputs from {path}: '{k}' is not a .npy array")
        if v.size == 0:
            what = f"input '{k}' in {path}" if k is not None else f"the input in {path}"
            raise McuforgeError(f"{what} is empty (shape {v.shape})")
    return data
