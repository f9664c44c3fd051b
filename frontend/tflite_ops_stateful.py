"""TFLite converters: stateful layers (SVDF, UNIDIRECTIONAL_SEQUENCE_LSTM).

Both keep state in variable tensors (is_variable) that TFLM updates in place at every invoke.
The graph IR is functional: the node reads the state's current value and produces its next
value as an extra output, declared with `ctx.book.update` (see tflite_ops_state.py); the
generated code copies it back at the end of the invocation. The IR ops "svdf" and
"lstm_tflite" (ir/graph.py) compute exactly what TFLM's kernels compute; the checks
here are those of TFLM's Prepare, so a model TFLM rejects (or would read as garbage) is
reported as unsupported rather than compiled to something else.
"""
from __future__ import annotations

import numpy as np
import tflite

from mcuforge.ir.graph import Node

from .tflite_ops import Unsupported, activation, op

_AF = tflite.ActivationFunctionType
_AF_NAMES = {v: k for k, v in vars(_AF).items() if not k.startswith("_")}
_f32 = np.float32  # TFLM holds scales as float and multiplies them in float


def _state(ctx, i: int):
    """Input i, a variable tensor: (the tensor, the name of its current value)."""
    t = ctx.input(i)
    if t.name not in ctx.book.state:
        raise Unsupported(f"input {i} ('{t.name}') holds the layer's state and must be a "
                          "variable tensor (TFLM requires is_variable)")
    return t, ctx.book.state[t.name]


def _next_state(ctx, t, suffix: str) -> str:
    """A tensor for the next value of state tensor t, declared to the variable book."""
    name = ctx.new_tensor(suffix, t.shape, t.dtype, quant=t.quant)
    ctx.book.update(t.name, name)
    return name


def _constant(ctx, *indices):
    for i in indices:
        t = ctx.input(i)
        if not t.is_const:
            raise Unsupported(f"input {i} ('{t.name}') is not a constant; mcuforge compiles "
                              "weights and biases into flash")


def _per_tensor(ctx, *tensors):
    for t in tensors:
        if t.quant is None:
            raise ctx.error(f"quantized tensor '{t.name}' has no quantization parameters")
        if t.quant.per_axis:
            raise Unsupported(f"per-channel quantization of '{t.name}' (TFLM's kernel reads one "
                              "scale per tensor)")


def _types(ctx, allowed: dict, tensors) -> str:
    kinds = tuple(t.dtype for t in tensors)
    if kinds not in allowed:
        raise Unsupported(f"{ctx.code} on {'/'.join(kinds)}; TFLM takes "
                          + ", ".join("/".join(k) for k in allowed))
    return allowed[kinds]


# ---- SVDF ------------------------------------------------------------------------------------

_SVDF_TYPES = {  # (x, weights_feature, weights_time, state, y) -> the bias type
    ("float32",) * 5: "float32",
    ("int8", "int8", "int16", "int16", "int8"): "int32",
    ("int8", "int8", "int8", "int8", "int8"): "int32",
}


@op("SVDF")
def svdf(ctx):
    """Inputs (x, weights_feature, weights_time, bias, activation_state); the state is
    [batch, filters * memory]. TFLM dereferences the bias in Prepare (int8) and Eval (float),
    so a model without one crashes it; mcuforge compiles that case with a zero bias."""
    o = ctx.options(tflite.SVDFOptions)
    if len(ctx.inputs) != 5:
        raise ctx.error(f"has {len(ctx.inputs)} inputs, SVDF takes 5")
    x, wf, wt, y = ctx.input(0), ctx.input(1), ctx.input(2), ctx.output()
    bias = ctx.input(3) if ctx.inputs[3] else None
    state, current = _state(ctx, 4)
    rank = o.Rank()
    if len(x.shape) != 2 or len(wf.shape) != 2 or len(wt.shape) != 2 or len(y.shape) != 2:
        raise ctx.error(f"input, weights and output must be 2-D, got {x.shape}, {wf.shape}, "
                        f"{wt.shape} -> {y.shape}")
    (batch, inputs), (filters, memory) = x.shape, wt.shape
    if rank < 1 or filters % rank:
        raise ctx.error(f"rank {rank} does not divide the {filters} filters")
    units = filters // rank
    if wf.shape != (filters, inputs) or tuple(y.shape) != (batch, units) \
            or len(state.shape) != 2 or state.size != batch * filters * memory \
            or (bias is not None and tuple(bias.shape) != (units,)):
        raise ctx.error(f"shapes disagree: x {x.shape}, weights_feature {wf.shape}, "
                        f"weights_time {wt.shape}, bias {None if bias is None else bias.shape}, "
                        f"state {state.shape}, y {y.shape} (rank {rank})")
    _constant(ctx, 1, 2, *([3] if bias is not None else []))
    bias_type = _types(ctx, _SVDF_TYPES, (x, wf, wt, state, y))
    if bias is not None and bias.dtype != bias_type:
        raise Unsupported(f"{bias.dtype} bias with {x.dtype} input (TFLM takes {bias_type})")
    if x.dtype == "float32":
        code = o.FusedActivationFunction()
        if code not in (_AF.NONE, _AF.RELU, _AF.RELU6, _AF.RELU_N1_TO_1):
            raise Unsupported(f"fused activation {_AF_NAMES.get(code, code)} on a float "
                              "SVDF")
        act = activation(code)
    else:
        _per_tensor(ctx, x, wf, wt, state, y)
        # TFLM's Prepare only checks the bias scale (0 when absent); the kernel adds the raw bias
        b_scale = float(bias.quant.scale[0]) if bias is not None and bias.quant else 0.0
        if bias is not None and abs(b_scale - float(_f32(state.quant.scale[0])
                                                    * _f32(wt.quant.scale[0]))) >= 1e-5:
            raise Unsupported("bias scale differs from state_scale * weights_time_scale by "
                              "1e-5 or more (TFLM's Prepare rejects it)")
        act = "none"  # TFLM's integer SVDF applies no fused activation
    nxt = _next_state(ctx, state, "state")
    # with a memory of one, nothing of the old state survives: the node does not read it
    ins = (x.name, wf.name, wt.name, bias.name if bias is not None else "",
           current if memory > 1 else "")
    return Node("svdf", ins, (y.name, nxt), {"rank": rank, "activation": act})


# ---- UNIDIRECTIONAL_SEQUENCE_LSTM --------------------------------------------------------------

_LSTM_TYPES = {  # (x, weights, bias, hidden, cell, y) -> variant
    ("float32",) * 6: "float32",
    ("int8", "int8", "int32", "int8", "int16", "int8"): "8x8_16",
    ("int16", "int8", "int64", "int16", "int16", "int16"): "16x8_16",
}
_WEIGHTS, _BIASES = range(1, 9), range(12, 16)
_ABSENT = {"peephole": range(9, 12), "projection": range(16, 18),
           "layer normalisation": range(20, 24)}


@op("UNIDIRECTIONAL_SEQUENCE_LSTM")
def unidirectional_sequence_lstm(ctx):
    """TFLM's kernel: the standard LSTM (every gate with input and recurrent weights and a
    bias; no CIFG, peepholes, projection or layer normalisation) with the cell gate's
    activation TANH; output_state (18) and cell_state (19) are variables."""
    o = ctx.options(tflite.UnidirectionalSequenceLSTMOptions)
    if len(ctx.inputs) != 24:
        raise ctx.error(f"has {len(ctx.inputs)} inputs, UNIDIRECTIONAL_SEQUENCE_LSTM takes 24")
    present = lambda i: bool(ctx.inputs[i])  # noqa: E731
    missing = [i for i in list(_WEIGHTS) + list(_BIASES) if not present(i)]
    if missing:
        raise Unsupported(f"inputs {missing} absent (CIFG or a gate without a bias); TFLM's "
                          "kernel needs every gate's weights and bias")
    for what, idx in _ABSENT.items():
        if any(present(i) for i in idx):
            raise Unsupported(f"{what} tensors (TFLM's kernel has no {what})")
    code = o.FusedActivationFunction()
    if code != _AF.TANH:
        raise Unsupported(f"cell activation {_AF_NAMES.get(code, code)} (TFLM's kernel "
                          "computes TANH only)")
    x, y = ctx.input(0), ctx.output()
    hidden, h_now = _state(ctx, 18)
    cell, c_now = _state(ctx, 19)
    weights = [ctx.input(i) for i in _WEIGHTS]
    biases = [ctx.input(i) for i in _BIASES]
    if len({w.dtype for w in weights}) > 1 or len({b.dtype for b in biases}) > 1:
        raise Unsupported("weights (or biases) of different types (TFLM requires one type)")
    variant = _types(ctx, _LSTM_TYPES, (x, weights[0], biases[0], hidden, cell, y))
    _constant(ctx, *_WEIGHTS, *_BIASES)
    if len(x.shape) != 3 or len(y.shape) != 3:
        raise ctx.error(f"input and output must be 3-D, got {x.shape} -> {y.shape}")
    time_major = bool(o.TimeMajor())
    batch = x.shape[1] if time_major else x.shape[0]
    units, inputs = weights[0].shape[0], x.shape[2]
    if any(w.shape != (units, inputs) for w in weights[:4]) \
            or any(w.shape != (units, units) for w in weights[4:]) \
            or any(b.shape != (units,) for b in biases) \
            or hidden.size != batch * units or cell.size != batch * units \
            or tuple(y.shape) != tuple(x.shape[:2]) + (units,):
        raise ctx.error(f"shapes disagree: x {x.shape}, y {y.shape}, weights "
                        f"{[w.shape for w in weights]}, biases {[b.shape for b in biases]}, "
                        f"states {hidden.shape} {cell.shape}")
    if variant != "float32":
        _per_tensor(ctx, x, hidden, cell, *weights)
    h_next = _next_state(ctx, hidden, "hidden_state")
    c_next = _next_state(ctx, cell, "cell_state")
    operands = (x.name, *(w.name for w in weights), *(b.name for b in biases), h_now, c_now)
    return Node("lstm_tflite", operands, (y.name, h_next, c_next),
                {"time_major": time_major, "cell_clip": float(o.CellClip())})
