"""Write a Graph as a TFLite flatbuffer (schema version 3, file identifier "TFL3").

The inverse of frontend/tflite.py. mcuforge uses it to build its own test and demo models and to
emit the int8 model it compiles (`--emit-tflite`), so that anyone can check the generated C
against TensorFlow Lite for Microcontrollers.

Only what the graph IR can express is written: one subgraph, builtin operators, affine
quantization. The graph is mapped onto `tflite_flatbuffer`'s plain descriptions, which do the
serializing. The output is deterministic: the same graph gives the same bytes.
"""
from __future__ import annotations

import numpy as np

from mcuforge.graph import Graph, Quant, Tensor, verify

from .tflite_flatbuffer import TflOp, TflSubgraph, TflTensor, write_model

ACTIVATIONS = {"none": "NONE", "relu": "RELU", "relu6": "RELU6",
               "relu_n1_to_1": "RELU_N1_TO_1"}
SIMPLE_OPS = {  # ops with no builtin options
    "logistic": "LOGISTIC", "tanh": "TANH", "relu": "RELU", "relu6": "RELU6",
    "hard_swish": "HARD_SWISH", "quantize": "QUANTIZE", "dequantize": "DEQUANTIZE",
}


def write_tflite(graph: Graph) -> bytes:
    """Serialize `graph` as a .tflite flatbuffer; raise ValueError if TFLite cannot express it."""
    verify(graph)
    plan = _Plan(graph)
    for node in graph.nodes:
        plan.add_node(node)
    tensors = [TflTensor(t.name, tuple(t.shape), t.dtype, t.data, t.quant)
               for t in plan.tensors]
    sg = TflSubgraph(tensors, plan.ops, list(graph.inputs), list(graph.outputs), graph.name)
    return write_model([sg])


class _Plan:
    """Decides the tensor list (graph order, plus the constants TFLite needs that the graph
    keeps as attributes) and one TflOp per node."""

    def __init__(self, graph: Graph):
        self.graph = graph
        self.names = set()
        self.tensors = []  # Tensor objects in index order
        self.ops = []
        used = set(graph.inputs) | set(graph.outputs)
        for n in graph.nodes:
            used.update(t for t in self._data_inputs(n) if t)
            used.update(n.outputs)
        for name, t in graph.tensors.items():  # graph order keeps the output deterministic
            if name in used:
                self._add_tensor(t)

    def _add_tensor(self, t: Tensor) -> str:
        self.names.add(t.name)
        self.tensors.append(t)
        return t.name

    def _const(self, base: str, data: np.ndarray, dtype="int32", quant=None) -> str:
        name = base
        while name in self.graph.tensors or name in self.names:
            name += "_"
        return self._add_tensor(Tensor(name, tuple(data.shape), dtype, data=data, quant=quant))

    def _zero_bias(self, n, x: Tensor, w: Tensor) -> str:
        """A zero bias for a conv without one: TFLite's int8 CONV_2D requires a bias, TFLM's
        depthwise conv crashes on a -1 bias index and XNNPACK on a 2-input depthwise conv."""
        channels = w.shape[0] if n.op == "conv2d" else w.shape[3]
        if x.quant is None:
            return self._const(n.outputs[0] + "/bias", np.zeros(channels, np.float32), "float32")
        dtype = "int64" if x.dtype == "int16" else "int32"
        scale = np.float32(x.quant.scale[0]) * np.asarray(w.quant.scale, dtype=np.float32)
        quant = Quant(tuple(float(v) for v in scale), (0,) * len(scale), 0)
        return self._const(n.outputs[0] + "/bias", np.zeros(channels, dtype), dtype, quant)

    @staticmethod
    def _trim(names) -> list:
        names = list(names)
        while names and not names[-1]:
            names.pop()  # absent trailing inputs are left out rather than written as -1
        return names

    def _data_inputs(self, n) -> tuple:
        """Inputs that carry data; shape/paddings/axes inputs are rebuilt from the attributes."""
        if n.op in ("reshape", "mean"):
            return n.inputs[:1]
        if n.op == "pad":
            return (n.inputs[0],) + tuple(t for t in n.inputs[2:3] if t)
        return n.inputs

    def _emit(self, op, ins, outs, options=None, options_type=None):
        self.ops.append(TflOp(op, tuple(ins), tuple(outs), options or {}, options_type))

    def add_node(self, n):
        g, a = self.graph, n.attrs
        ins, outs = self._trim(self._data_inputs(n)), list(n.outputs)
        out = g.tensors[n.outputs[0]]
        act = {"fused_activation_function": ACTIVATIONS[a.get("activation", "none")]}
        if n.op in SIMPLE_OPS:
            return self._emit(SIMPLE_OPS[n.op], ins, outs)
        if n.op in ("conv2d", "depthwise_conv2d"):
            x, w = g.tensors[n.inputs[0]], g.tensors[n.inputs[1]]
            pad = _padding_mode(a["padding"], x.shape[1:3], w.shape[1:3], a["stride"],
                                a["dilation"], out.shape[1:3], n)
            if len(ins) < 3:
                ins.append(self._zero_bias(n, x, w))
            opts = {"padding": pad, "stride_h": a["stride"][0], "stride_w": a["stride"][1],
                    "dilation_h_factor": a["dilation"][0],
                    "dilation_w_factor": a["dilation"][1], **act}
            if n.op == "conv2d":
                return self._emit("CONV_2D", ins, outs, opts)
            opts["depth_multiplier"] = a["depth_multiplier"]
            return self._emit("DEPTHWISE_CONV_2D", ins, outs, opts)
        if n.op in ("avg_pool2d", "max_pool2d"):
            x = g.tensors[n.inputs[0]]
            what = f"tflite writer: {n.op} '{n.name or n.outputs[0]}'"
            if tuple(a.get("dilation", (1, 1))) != (1, 1):  # TFLite's pools have none
                raise ValueError(f"{what} has dilation {tuple(a['dilation'])}: TFLite's pools "
                                 "have no dilation")
            if a.get("count_include_pad") and any(a["padding"]):  # TFLite divides by the taps
                raise ValueError(f"{what} counts its padding in the average (ONNX "  # inside
                                 "count_include_pad=1): TFLite's AVERAGE_POOL_2D never does")
            pad = _padding_mode(a["padding"], x.shape[1:3], a["filter"], a["stride"], (1, 1),
                                out.shape[1:3], n)
            opts = {"padding": pad, "stride_h": a["stride"][0], "stride_w": a["stride"][1],
                    "filter_height": a["filter"][0], "filter_width": a["filter"][1], **act}
            return self._emit("AVERAGE_POOL_2D" if n.op == "avg_pool2d" else "MAX_POOL_2D",
                              ins, outs, opts)
        if n.op == "fully_connected":
            rank_in = len(g.tensors[n.inputs[0]].shape)
            keep = len(out.shape) == rank_in and rank_in != 2  # else the input is flattened
            return self._emit("FULLY_CONNECTED", ins, outs, {**act, "keep_num_dims": keep})
        if n.op in ("add", "mul"):
            return self._emit(n.op.upper(), ins, outs, act)
        if n.op == "reshape":
            shape = np.array(out.shape, dtype=np.int32)
            ins = [ins[0], self._const(n.outputs[0] + "/shape", shape)]
            return self._emit("RESHAPE", ins, outs, {"new_shape": shape})
        if n.op == "softmax":
            return self._emit("SOFTMAX", ins, outs, {"beta": a["beta"]})
        if n.op == "concat":
            return self._emit("CONCATENATION", ins, outs, {"axis": a["axis"], **act})
        if n.op == "pad":
            pads = np.array(a["pads"], dtype=np.int32).reshape(-1, 2)
            new = [ins[0], self._const(n.outputs[0] + "/paddings", pads)]
            if len(ins) > 1:  # an explicit pad value needs PADV2
                return self._emit("PADV2", new + [ins[1]], outs)
            return self._emit("PAD", new, outs)
        if n.op == "mean":
            axes = np.array(a["axes"], dtype=np.int32).reshape(-1)
            ins = [ins[0], self._const(n.outputs[0] + "/axes", axes)]
            return self._emit("MEAN", ins, outs, {"keep_dims": bool(a["keep_dims"])})
        if n.op == "leaky_relu":
            return self._emit("LEAKY_RELU", ins, outs, {"alpha": a["alpha"]})
        raise ValueError(f"tflite writer: op '{n.op}' has no TFLite mapping")


def _padding_mode(pads, in_hw, filt_hw, stride, dilation, out_hw, node) -> str:
    """The TFLite padding whose resolved pads equal the explicit `pads` (t, b, l, r)."""
    eff = [(f - 1) * d + 1 for f, d in zip(filt_hw, dilation)]
    valid_out = [(i - e) // s + 1 for i, e, s in zip(in_hw, eff, stride)]
    if tuple(pads) == (0, 0, 0, 0) and list(out_hw) == valid_out:
        return "VALID"
    same_out = [-(-i // s) for i, s in zip(in_hw, stride)]
    same_pads = []
    for i, e, s, o in zip(in_hw, eff, stride, same_out):
        total = max((o - 1) * s + e - i, 0)
        same_pads += [total // 2, total - total // 2]
    if list(out_hw) == same_out and tuple(same_pads) == tuple(pads):
        return "SAME"
    raise ValueError(f"tflite writer: {node.op} '{node.name or node.outputs[0]}' has padding "
                     f"{tuple(pads)} that is neither SAME {tuple(same_pads)} nor VALID; "
                     "insert an explicit pad op")
