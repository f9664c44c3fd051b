"""--input-shape against a model's declared input shapes, one rule for every frontend."""
from __future__ import annotations

from mcuforge.ir.errors import ModelError


def check_input_shapes(declared: dict, given: dict, how: str = "--input-shape") -> None:
    """Check shapes given for a model's inputs against what the model declares: `declared`
    maps each input name to its dims, None (or -1) where the model leaves a dimension open
    (None instead of the list: no shape at all).
    Only open dimensions may be set; an unknown name, another rank or a different static
    dimension is a ModelError naming the input, its declared shape and what was given."""
    show = lambda dims: "[" + ", ".join("?" if d is None or d < 0 else str(d)  # noqa: E731
                                        for d in dims) + "]"
    for name, shape in given.items():
        text = f"{how} {name}={','.join(str(int(d)) for d in shape)}"
        if name not in declared:
            have = ", ".join(f"'{k}' {show(v)}" for k, v in declared.items()) or "none"
            raise ModelError(f"{text}: the model has no input '{name}' (its inputs: {have})")
        dims = declared[name]
        if dims is None:  # no shape in the model: any
            continue
        if len(dims) != len(shape) or any(d is not None and d >= 0 and d != int(v)
                                          for d, v in zip(dims, shape)):
            raise ModelError(f"{text}: input '{name}' is declared {show(dims)}; only its open "
                             "dimensions (?) may be set, the others must be given as declared")
