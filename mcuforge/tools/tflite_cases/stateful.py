"""Conformance cases: stateful layers (SVDF, UNIDIRECTIONAL_SEQUENCE_LSTM).

Each case runs 20 invocations in sequence, so the state the layer keeps in its variable tensors
(SVDF's memory of feature activations, the LSTM's hidden and cell state) carries from one
invocation to the next exactly as in tflite-micro; the reset cases go on for 20 more after
resetting the model (TFLM: interpreter.reset(), mcuforge: <name>_reset()).

Quantization as the TFLite converter writes it: int8 activations asymmetric, constant weights
symmetric per tensor, SVDF's int16 memory and weights_time symmetric with an int32 bias at
state_scale * weights_time_scale; the integer LSTM with gate biases at input_scale *
weight_scale (int32 for 8x8->16, int64 for 16x8->16), the cell state int16 at a power-of-two
scale, int16 activations with zero point 0.
"""
from __future__ import annotations

import zlib

import numpy as np

from . import TflCase, cases, q, single, tensor

STEPS = 20  # invocations of every case


def _rng(name: str) -> np.random.Generator:
    return np.random.default_rng(zlib.crc32(name.encode()))


def _ints(rng, lo, hi, shape):
    return rng.integers(lo, hi + 1, shape)


# ---- SVDF ------------------------------------------------------------------------------------

def _svdf(variant: str, dtype: str, batch=2, inputs=5, units=4, rank=1, memory=6, bias=True,
          act="NONE", state_dtype="int16", reset=False, reference="tflm") -> TflCase:
    """x [batch, inputs] -> y [batch, units]; filters = units * rank, each remembering the last
    `memory` feature activations. dtype float32, or int8 with `state_dtype` (int16 or int8)
    memory and weights_time."""
    rng = _rng(f"svdf_{variant}")
    filters = units * rank
    wf_shape, wt_shape = (filters, inputs), (filters, memory)
    if dtype == "float32":
        qx = qwf = qwt = qb = qs = qy = None
        wf = rng.uniform(-0.6, 0.6, wf_shape)
        wt = rng.uniform(-0.6, 0.6, wt_shape)
        b = rng.uniform(-1, 1, units)
        types = ("float32",) * 4
    else:
        qx, qwf, qy = q(0.05, 3), q(0.004), q(0.08, -5)
        wf = _ints(rng, -127, 127, wf_shape)
        if state_dtype == "int16":
            qs, qwt = q(0.0005), q(0.5 / 32767)
            wt = _ints(rng, -32767, 32767, wt_shape)
        else:  # int8 memory: asymmetric, like any int8 activation
            qs, qwt = q(0.12, -3), q(0.5 / 127)
            wt = _ints(rng, -127, 127, wt_shape)
        qb = q(qs.scale[0] * qwt.scale[0])
        b = np.round(rng.uniform(-1, 1, units) / qb.scale[0])
        types = ("int8", state_dtype, "int32", "int8")
    x_t, wt_t, b_t, y_t = types
    ins = [tensor("x", (batch, inputs), dtype, qx),
           tensor("weights_feature", wf_shape, dtype, qwf, data=wf),
           tensor("weights_time", wt_shape, wt_t, qwt, data=wt),
           tensor("bias", (units,), b_t, qb, data=b) if bias else None,
           tensor("state", (batch, filters * memory), wt_t, qs, variable=True)]
    return single("SVDF", variant, ins, [tensor("y", (batch, units), y_t, qy)],
                  {"rank": rank, "fused_activation_function": act},
                  invocations=2 * STEPS if reset else STEPS, reset_at=STEPS if reset else 0,
                  reference=reference)


@cases("SVDF")
def svdf_cases():
    return [
        _svdf("float32_rank1", "float32"),
        _svdf("float32_rank2_relu", "float32", rank=2, act="RELU"),
        # TFLM dereferences the absent bias and crashes: LiteRT is the reference
        _svdf("float32_no_bias", "float32", bias=False, memory=3, reference="litert"),
        _svdf("float32_relu6_batch1", "float32", batch=1, units=3, rank=2, act="RELU6"),
        _svdf("float32_relu_n1_to_1", "float32", act="RELU_N1_TO_1"),
        _svdf("float32_reset", "float32", rank=2, reset=True),
        _svdf("int8_rank1", "int8"),
        _svdf("int8_rank2", "int8", rank=2),
        # TFLM's integer SVDF applies no fused activation: RELU changes nothing
        _svdf("int8_rank2_relu", "int8", rank=2, act="RELU", batch=1, memory=10),
        _svdf("int8_int8_state", "int8", state_dtype="int8"),
        _svdf("int8_int8_state_rank2", "int8", rank=2, state_dtype="int8", memory=4),
        _svdf("int8_memory1", "int8", memory=1),  # no memory: the state is overwritten
        # the streaming acceptance test: 20 invocations, reset, 20 more
        _svdf("int8_reset", "int8", rank=2, reset=True),
        _svdf("int8_int8_state_reset", "int8", state_dtype="int8", reset=True),
    ]


# ---- UNIDIRECTIONAL_SEQUENCE_LSTM ------------------------------------------------------------

GATES = ("input", "forget", "cell", "output")  # TFLite's order of the weights and biases
_LSTM_QUANT = {  # dtype -> (x, weights, hidden state and y, cell state)
    "int8": (q(0.04, -6), q(0.01), q(1 / 128, 2), q(2.0 ** -11)),
    "int16": (q(0.0002), q(0.01), q(1 / 32768), q(2.0 ** -11)),
}


def _lstm(variant: str, dtype: str, time_major=True, batch=2, steps=3, inputs=4, hidden=5,
          cell_clip=0.0, reset=False) -> TflCase:
    """x [steps, batch, inputs] (time major) or [batch, steps, inputs] -> y likewise with
    `hidden` units; every gate has input and recurrent weights and a bias, no peepholes, no
    projection, no layer normalisation (TFLM's kernel takes exactly these)."""
    rng = _rng(f"lstm_{variant}")
    if dtype == "float32":
        qx = qw = qh = qc = None
        weights = lambda shape: rng.uniform(-0.7, 0.7, shape)  # noqa: E731
        biases = lambda: rng.uniform(-0.5, 0.5, hidden)  # noqa: E731
        w_t, b_t, c_t = "float32", "float32", "float32"
    else:
        qx, qw, qh, qc = _LSTM_QUANT[dtype]
        weights = lambda shape: _ints(rng, -127, 127, shape)  # noqa: E731
        w_t, c_t = "int8", "int16"
        b_t = "int32" if dtype == "int8" else "int64"
        qb = q(qx.scale[0] * qw.scale[0])
        biases = lambda: np.round(rng.uniform(-0.5, 0.5, hidden) / qb.scale[0])  # noqa: E731
    x_shape = (steps, batch, inputs) if time_major else (batch, steps, inputs)
    y_shape = x_shape[:2] + (hidden,)
    ins = [tensor("x", x_shape, dtype, qx)]
    ins += [tensor(f"input_to_{g}_w", (hidden, inputs), w_t, qw,
                   data=weights((hidden, inputs))) for g in GATES]
    ins += [tensor(f"recurrent_to_{g}_w", (hidden, hidden), w_t, qw,
                   data=weights((hidden, hidden))) for g in GATES]
    ins += [None] * 3  # peepholes
    ins += [tensor(f"{g}_gate_bias", (hidden,), b_t,
                   None if dtype == "float32" else qb, data=biases()) for g in GATES]
    ins += [None] * 2  # projection
    ins += [tensor("hidden_state", (batch, hidden), dtype, qh, variable=True),
            tensor("cell_state", (batch, hidden), c_t, qc, variable=True)]
    ins += [None] * 4  # layer normalisation
    options = {"fused_activation_function": "TANH", "cell_clip": cell_clip,
               "time_major": time_major}
    return single("UNIDIRECTIONAL_SEQUENCE_LSTM", variant, ins,
                  [tensor("y", y_shape, dtype, qh)], options,
                  invocations=2 * STEPS if reset else STEPS, reset_at=STEPS if reset else 0)


@cases("UNIDIRECTIONAL_SEQUENCE_LSTM")
def lstm_cases():
    out = []
    for dtype in ("float32", "int8", "int16"):
        out += [
            _lstm(f"{dtype}_time_major", dtype),
            _lstm(f"{dtype}_batch_major", dtype, time_major=False),
            _lstm(f"{dtype}_cell_clip", dtype, cell_clip=0.8, batch=1, steps=4),
        ]
    out += [_lstm("float32_reset", "float32", reset=True),
            _lstm("int8_reset", "int8", time_major=False, reset=True)]
    return out
