"""Write a Graph as a TFLite flatbuffer (schema version 3, file identifier "TFL3").

The inverse of frontend/tflite.py. mcuforge uses it to build its own test and demo models and to
emit the int8 model it compiles (`--emit-tflite`), so that anyone can check the generated C
against TensorFlow Lite for Microcontrollers.

Only what the graph IR can express is written: one subgraph, builtin operators, affine
quantization. Every attribute of a node is either written exactly (explicit conv / max pool
padding as PAD + VALID, edge / wrap pads as slices and concatenations) or the node is refused
(ValueError naming it): `_refusal` lists what TFLite (or tflite-micro) has no way to say. The
graph is mapped onto `tflite_flatbuffer`'s plain descriptions, which do the serializing. The
output is deterministic: the same graph gives the same bytes.
"""
from __future__ import annotations

import numpy as np

from mcuforge.ir.graph import Graph, Quant, Tensor, verify

from .tflite_flatbuffer import TflOp, TflSubgraph, TflTensor, write_model

ACTIVATIONS = {"none": "NONE", "relu": "RELU", "relu6": "RELU6",
               "relu_n1_to_1": "RELU_N1_TO_1"}
SIMPLE_OPS = {  # ops with no builtin options
    "logistic": "LOGISTIC", "tanh": "TANH", "relu": "RELU", "relu6": "RELU6",
    "hard_swish": "HARD_SWISH", "quantize": "QUANTIZE", "dequantize": "DEQUANTIZE",
}


# op -> the attributes add_node writes; any other attribute must be at its neutral value
# (NEUTRAL) or the node is refused, so nothing a node says is silently dropped
WRITTEN = {
    "conv2d": ("stride", "dilation", "padding", "activation"),
    "depthwise_conv2d": ("stride", "dilation", "padding", "depth_multiplier", "activation"),
    "fully_connected": ("activation",),
    "add": ("activation", "tflm"), "mul": ("activation", "tflm"),  # tflm: TFLite's own clamp
    "avg_pool2d": ("filter", "stride", "padding", "activation"),
    "max_pool2d": ("filter", "stride", "padding", "activation"),
    "reshape": (), "softmax": ("beta", "axis"), "concat": ("axis", "activation"),
    "pad": ("pads", "mode"), "mean": ("axes", "keep_dims"), "leaky_relu": ("alpha",),
    "transpose": ("perm",), "slice": ("starts", "ends", "steps"),
    "binary": ("fn", "tflm"),  # max / min only
    **{op: () for op in SIMPLE_OPS},
}
NEUTRAL = {"dilation": (1, 1), "count_include_pad": False}


def write_tflite(graph: Graph) -> bytes:
    """Serialize `graph` as a .tflite flatbuffer; raise ValueError if TFLite cannot express it."""
    verify(graph)
    plan = _Plan(graph)
    for node in graph.nodes:
        why = _refusal(graph, node)
        if why:
            raise ValueError(f"tflite writer: {node.op} node '{node.name or node.outputs[0]}' "
                             f"{why}")
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

    def _new(self, base: str, shape, dtype, data=None, quant=None) -> str:
        """A tensor the graph does not have, under a fresh name."""
        name = base
        while name in self.graph.tensors or name in self.names:
            name += "_"
        return self._add_tensor(Tensor(name, tuple(shape), dtype, data=data, quant=quant))

    def _const(self, base: str, data: np.ndarray, dtype="int32", quant=None) -> str:
        return self._new(base, data.shape, dtype, data, quant)

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
        if n.op in ("reshape", "mean", "transpose"):
            return n.inputs[:1]
        if n.op == "pad":
            return (n.inputs[0],) + tuple(t for t in n.inputs[2:3] if t)
        return n.inputs

    def _explicit_pad(self, n, x: Tensor, value) -> str:
        """A PAD (PADV2 with `value`) of x's H and W by the node's explicit padding, so that
        the node itself runs VALID: the name of the padded tensor."""
        t, b, l, r = n.attrs["padding"]
        pads = np.array([[0, 0], [t, b], [l, r], [0, 0]], dtype=np.int32)
        shape = (x.shape[0], x.shape[1] + t + b, x.shape[2] + l + r, x.shape[3])
        y = self._new(n.outputs[0] + "/padded", shape, x.dtype, quant=x.quant)
        ins = [x.name, self._const(n.outputs[0] + "/paddings", pads)]
        if value is None:
            self._emit("PAD", ins, [y])
        else:
            v = np.array([value], dtype=x.dtype)
            self._emit("PADV2", ins + [self._const(n.outputs[0] + "/pad_value", v, x.dtype,
                                                   x.quant)], [y])
        return y

    def _pad_by_concat(self, n, x: Tensor, mode: str) -> None:
        """edge / wrap padding, which TFLite has no operator for, exactly as data movement:
        per padded axis, a CONCATENATION of the input with STRIDED_SLICEs of it (edge: the
        first / last element repeated; wrap: the last b / first e elements)."""
        pads = [tuple(p) for p in n.attrs["pads"]]
        last = max(d for d, p in enumerate(pads) if p != (0, 0))
        cur, shape = x.name, list(x.shape)
        for d, (b, e) in enumerate(pads):
            if (b, e) == (0, 0):
                continue
            size = shape[d]
            if mode == "edge":
                head = [self._slice_of(cur, shape, x, d, 0, 1)] * b
                tail = [self._slice_of(cur, shape, x, d, size - 1, size)] * e
            else:
                head = [self._slice_of(cur, shape, x, d, size - b, size)] if b else []
                tail = [self._slice_of(cur, shape, x, d, 0, e)] if e else []
            shape[d] += b + e
            out = n.outputs[0] if d == last else self._new(
                f"{n.outputs[0]}/{mode}_axis{d}", shape, x.dtype, quant=x.quant)
            self._emit("CONCATENATION", head + [cur] + tail, [out],
                       {"axis": d, "fused_activation_function": "NONE"})
            cur = out

    def _slice_of(self, src: str, shape, x: Tensor, axis: int, start: int, stop: int) -> str:
        """A STRIDED_SLICE of `src` (shape `shape`, quantized like x) to [start, stop) on axis."""
        begin, end = [0] * len(shape), list(shape)
        begin[axis], end[axis] = start, stop
        part = list(shape)
        part[axis] = stop - start
        y = self._new(f"{src}/slice{axis}_{start}_{stop}", part, x.dtype, quant=x.quant)
        ins = [src] + [self._const(f"{y}/{k}", np.array(v, np.int32)) for k, v in
                       (("begin", begin), ("end", end), ("strides", [1] * len(shape)))]
        self._emit("STRIDED_SLICE", ins, [y], {})
        return y

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
            if pad is None:  # zero padding: in int8 the zero point, which PAD fills with
                ins[0], pad = self._explicit_pad(n, x, None), "VALID"
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
            x = g.tensors[n.inputs[0]]  # dilation, counted padding: refused by _refusal
            pad = _padding_mode(a["padding"], x.shape[1:3], a["filter"], a["stride"], (1, 1),
                                out.shape[1:3], n)
            if pad is None and n.op == "max_pool2d":  # padded taps never win: the lowest value
                low = -np.inf if x.dtype == "float32" else np.iinfo(x.dtype).min
                ins[0], pad = self._explicit_pad(n, x, low), "VALID"
            if pad is None:  # TFLite's average leaves padded taps out of the count
                raise ValueError(_padding_error(a["padding"], x.shape[1:3], a["filter"],
                                                a["stride"], (1, 1), n))
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
            mode = a.get("mode", "constant")
            if mode in ("edge", "wrap"):
                return self._pad_by_concat(n, g.tensors[n.inputs[0]], mode)
            if mode != "constant":  # reflect / symmetric (_refusal checked the widths)
                return self._emit("MIRROR_PAD", new, outs, {"mode": mode.upper()})
            if len(ins) > 1:  # an explicit pad value needs PADV2
                return self._emit("PADV2", new + [ins[1]], outs)
            return self._emit("PAD", new, outs)
        if n.op == "mean":
            axes = np.array(a["axes"], dtype=np.int32).reshape(-1)
            ins = [ins[0], self._const(n.outputs[0] + "/axes", axes)]
            return self._emit("MEAN", ins, outs, {"keep_dims": bool(a["keep_dims"])})
        if n.op == "transpose":
            perm = np.array(a["perm"], dtype=np.int32)
            return self._emit("TRANSPOSE", [ins[0], self._const(n.outputs[0] + "/perm", perm)],
                              outs)
        if n.op == "slice":  # an end of None: up to the edge, whichever the direction
            ends = a["ends"]
            mask = sum(1 << d for d, e in enumerate(ends) if e is None)
            vecs = [np.array(a["starts"], np.int32),
                    np.array([0 if e is None else e for e in ends], np.int32),
                    np.array(a["steps"], np.int32)]
            ins = [ins[0]] + [self._const(n.outputs[0] + "/" + k, v)
                              for k, v in zip(("begin", "end", "strides"), vecs)]
            return self._emit("STRIDED_SLICE", ins, outs, {"end_mask": mask})
        if n.op == "binary":
            return self._emit("MAXIMUM" if a["fn"] == "max" else "MINIMUM", ins, outs)
        if n.op == "leaky_relu":
            return self._emit("LEAKY_RELU", ins, outs, {"alpha": a["alpha"]})
        raise ValueError(f"tflite writer: op '{n.op}' has no TFLite mapping")


def _refusal(g: Graph, n) -> str:
    """Why TFLite cannot express node `n` exactly, or "" when add_node writes all it says."""
    if n.op not in WRITTEN:
        return "has no TFLite mapping"
    a = n.attrs
    for k, v in a.items():
        if k in WRITTEN[n.op]:
            continue
        if k in NEUTRAL and (v == NEUTRAL[k] or tuple(np.atleast_1d(v)) == NEUTRAL[k]):
            continue
        if k == "count_include_pad" and not any(a["padding"]):
            continue  # no padded tap: both counts are the same
        if k == "requant":
            return (f"computes as {v} does (requant={v!r}), which no TFLite kernel does; "
                    "quantize the float model with mcuforge instead")
        return f"has {k}={v!r}, which the TFLite {n.op} cannot express"
    x = g.tensors[n.inputs[0]] if n.inputs and n.inputs[0] else None
    if n.op == "conv2d" and g.tensors[n.inputs[1]].shape[3] != x.shape[3]:
        return "is a grouped convolution, which tflite-micro's CONV_2D does not run"
    if n.op == "binary" and a["fn"] not in ("max", "min"):
        return f"computes binary {a['fn']}, which the writer has no TFLite mapping for"
    if n.op == "softmax" and a.get("axis", -1) not in (-1, len(x.shape) - 1):
        return f"works on axis {a['axis']}; TFLite's SOFTMAX works on the last axis only"
    if n.op == "pad":
        mode, pads = a.get("mode", "constant"), [tuple(p) for p in a["pads"]]
        if any(b < 0 or e < 0 for b, e in pads):
            return f"has negative pads {pads} (a crop), which TFLite's PAD cannot express"
        if mode not in ("constant", "reflect", "symmetric", "edge", "wrap"):
            return f"pads in mode '{mode}', which the writer has no TFLite mapping for"
        if mode in ("reflect", "symmetric", "wrap"):
            for d, (size, (b, e)) in enumerate(zip(x.shape, pads)):
                widest = size - 1 if mode == "reflect" else size
                if max(b, e) > widest:
                    how = "a wrap takes" if mode == "wrap" else "MIRROR_PAD mirrors"
                    return (f"pads axis {d} (size {size}) by {(b, e)} in mode '{mode}': "
                            f"{how} at most {widest}")
    return ""


def _padding_mode(pads, in_hw, filt_hw, stride, dilation, out_hw, node):
    """The TFLite padding whose resolved pads equal the explicit `pads` (t, b, l, r), or None
    when neither does (the caller pads explicitly and runs VALID)."""
    eff = [(f - 1) * d + 1 for f, d in zip(filt_hw, dilation)]
    valid_out = [(i - e) // s + 1 for i, e, s in zip(in_hw, eff, stride)]
    if tuple(pads) == (0, 0, 0, 0) and list(out_hw) == valid_out:
        return "VALID"
    if list(out_hw) == _same_out(in_hw, stride) and \
            tuple(_same_pads(in_hw, eff, stride)) == tuple(pads):
        return "SAME"
    padded = [i + p0 + p1 for i, p0, p1 in zip(in_hw, pads[::2], pads[1::2])]
    if any(p < 0 for p in pads) or \
            [(i - e) // s + 1 for i, e, s in zip(padded, eff, stride)] != list(out_hw):
        raise ValueError(_padding_error(pads, in_hw, filt_hw, stride, dilation, node))
    return None


def _same_out(in_hw, stride) -> list:
    return [-(-i // s) for i, s in zip(in_hw, stride)]


def _same_pads(in_hw, eff, stride) -> list:
    same_pads = []
    for i, e, s, o in zip(in_hw, eff, stride, _same_out(in_hw, stride)):
        total = max((o - 1) * s + e - i, 0)
        same_pads += [total // 2, total - total // 2]
    return same_pads


def _padding_error(pads, in_hw, filt_hw, stride, dilation, node) -> str:
    eff = [(f - 1) * d + 1 for f, d in zip(filt_hw, dilation)]
    return (f"tflite writer: {node.op} '{node.name or node.outputs[0]}' has padding "
            f"{tuple(pads)} that is neither SAME {tuple(_same_pads(in_hw, eff, stride))} nor "
            "VALID; insert an explicit pad op")
