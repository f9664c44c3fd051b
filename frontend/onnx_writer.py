"""Write a float32 Graph as an ONNX model: `write_onnx(graph)` returns ModelProto bytes.

The opposite direction of frontend/onnx.py, for float graphs only. mcuforge uses it to hand
float TFLite models to onnxruntime (bench-quant runs onnxruntime's quantizer on the export), so
it writes plain, standard ONNX that onnxruntime and its QDQ quantizer handle well:

  - activations stay NHWC between ops, exactly as in the graph. Graph inputs and outputs keep
    their names, shapes and layout, so the arrays that feed the graph feed the ONNX model too;
  - 2-D convolutions and pools, which ONNX defines on NCHW, are wrapped in
    Transpose(NHWC -> NCHW) -> op -> Transpose(NCHW -> NHWC); a fused activation becomes a
    Relu / Clip right after the op, inside the transposes, where the quantizer can merge it
    into the layer;
  - weights are rewritten into ONNX's layouts: conv2d OHWI -> OIHW (group = C / I),
    depthwise 1HW(C*M) -> (C*M)1HW with group = C, fully_connected [out, in] -> Gemm with
    transB=1 (the input flattened to 2-D first when it is not 2-D);
  - opset 13 of the default domain, IR version 7.

Guarantees: the model passes onnx.checker with full shape inference, and computes what the
graph computes in float32 (up to the order of float rounding); the same graph always gives the
same bytes. What it cannot write exactly -- an op without a mapping, a non-float32 or quantized
tensor, a window whose output size ONNX would compute differently -- raises ValueError naming
the node or tensor; nothing is approximated.

Int8 graphs are not written: quantize the ONNX model with onnxruntime instead. Hybrid TFLite
models (int8 weights of float layers) need optimizer.pipeline.optimize first, which turns their
weights into float32 constants.
"""
from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from mcuforge.ir.graph import Graph, Tensor, verify

OPSET = 13
IR_VERSION = 7  # the IR version that came with opset 13
NHWC_TO_NCHW = (0, 3, 1, 2)
NCHW_TO_NHWC = (0, 2, 3, 1)
CLAMPS = {"relu6": (0.0, 6.0), "relu_n1_to_1": (-1.0, 1.0)}  # fused activations -> Clip
SIMPLE_OPS = {"logistic": "Sigmoid", "tanh": "Tanh", "relu": "Relu"}
REDUCE_OPS = {"mean": "ReduceMean", "max": "ReduceMax", "min": "ReduceMin", "sum": "ReduceSum",
              "prod": "ReduceProd"}
PAD_MODES = {"constant": "constant", "reflect": "reflect", "edge": "edge"}  # wrap: opset 19


def write_onnx(graph: Graph) -> bytes:
    """Serialize the float32 `graph` as an ONNX ModelProto (see the module docstring); raise
    ValueError naming the node or tensor when ONNX cannot express it exactly."""
    verify(graph)
    w = _Writer(graph)
    for name in graph.inputs:
        w.check_float(name, f"graph input '{name}'")
    for node in graph.nodes:
        w.add_node(node)
    model = w.model()
    try:
        onnx.checker.check_model(model, full_check=True)
    except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError) as e:
        # a graph the mappings above let through but ONNX rejects: still the caller's ValueError
        raise ValueError(f"onnx writer: the written model fails onnx.checker: {e}") from None
    return model.SerializeToString(deterministic=True)


def _where(n) -> str:
    """How error messages name a node, as ir.graph.verify does."""
    return f"{n.op} '{n.name or n.outputs[0]}'"


class _Writer:
    """Collects ONNX nodes and initializers while the graph's nodes are mapped in order.
    `label` / `where` name the graph node being mapped: ONNX node names and errors use them."""

    def __init__(self, graph: Graph):
        self.graph = graph
        self.nodes = []
        self.initializers = []  # in creation order, so the bytes are deterministic
        self.tensor_names = set(graph.tensors)  # names taken by graph tensors or added ones
        self.node_names = set()
        self.consts = {}  # (graph tensor name, layout) -> initializer name
        self.scalars = {}  # float value -> initializer name (Clip bounds, softmax beta)
        self.nchw = {}  # graph tensor name -> its NCHW transpose, shared by every reader
        self.label, self.where = graph.name, "graph"

    # ---- names and constants

    def fresh(self, base: str, taken: set) -> str:
        name, k = base, 1
        while name in taken:
            name, k = f"{base}_{k}", k + 1
        taken.add(name)
        return name

    def tmp(self, base: str) -> str:
        """A new tensor name for an intermediate value the graph does not have."""
        return self.fresh(base, self.tensor_names)

    def initializer(self, name: str, data: np.ndarray) -> str:
        self.initializers.append(numpy_helper.from_array(np.ascontiguousarray(data), name))
        return name

    def weight(self, name: str, layout: str = "as_is", convert=None) -> str:
        """A constant graph tensor as an initializer, converted to another layout once."""
        key = (name, layout)
        if key not in self.consts:
            t = self.check_float(name)
            if not t.is_const:
                raise ValueError(f"onnx writer: {self.where}: '{name}' must be a constant")
            data = t.data.astype(np.float32).reshape(t.shape)
            if convert is not None:
                data = convert(data)
            out = name if layout == "as_is" else self.tmp(f"{name}:{layout}")
            self.consts[key] = self.initializer(out, data)
        return self.consts[key]

    def scalar(self, value: float) -> str:
        value = float(np.float32(value))
        if value not in self.scalars:
            self.scalars[value] = self.initializer(self.tmp(f"const:{value!r}"),
                                                   np.array(value, np.float32))
        return self.scalars[value]

    def int64s(self, base: str, values) -> str:
        return self.initializer(self.tmp(base), np.array([int(v) for v in values], np.int64))

    def check_float(self, name: str, where: str | None = None) -> Tensor:
        t = self.graph.tensors[name]
        if t.dtype != "float32" or t.quant is not None:
            kind = "quantized " + t.dtype if t.quant is not None else t.dtype
            raise ValueError(f"onnx writer: {where or self.where}: tensor '{name}' is {kind}; "
                             "only float32 graphs are written (run "
                             "optimizer.pipeline.optimize on hybrid models first)")
        return t

    def value(self, name: str) -> str:
        """The ONNX name of a data input: constants become initializers of the same name."""
        return self.weight(name) if self.check_float(name).is_const else name

    def values(self, names) -> list:
        return [self.value(t) for t in names]

    # ---- nodes

    def emit(self, op_type: str, inputs, outputs, **attrs) -> None:
        name = self.fresh(f"{self.label}/{op_type}", self.node_names)
        self.nodes.append(helper.make_node(op_type, list(inputs), list(outputs), name=name,
                                           **attrs))

    def to_nchw(self, name: str) -> str:
        if name not in self.nchw:
            out = self.tmp(f"{name}:nchw")
            self.emit("Transpose", [self.value(name)], [out], perm=NHWC_TO_NCHW)
            self.nchw[name] = out
        return self.nchw[name]

    def to_nhwc(self, src: str, dst: str) -> None:
        self.emit("Transpose", [src], [dst], perm=NCHW_TO_NHWC)

    def activation(self, x: str, y: str, act: str) -> None:
        if act == "relu":
            self.emit("Relu", [x], [y])
        elif act in CLAMPS:
            lo, hi = CLAMPS[act]
            self.emit("Clip", [x, self.scalar(lo), self.scalar(hi)], [y])
        else:
            raise ValueError(f"onnx writer: {self.where}: unknown activation '{act}'")

    def layer(self, n, op_type: str, inputs, back=None, **attrs) -> None:
        """Emit `op_type`, then the node's fused activation, then `back(src, dst)` (the step
        from the op's layout back to the graph's, e.g. a transpose to NHWC), naming tensors so
        that the last node written produces the graph's output tensor."""
        out = n.outputs[0]
        self.check_float(out)
        act = n.attrs.get("activation", "none")
        after_act = self.tmp(f"{out}:{op_type.lower()}") if back else out
        raw = self.tmp(f"{out}:{op_type.lower()}_raw") if act != "none" else after_act
        self.emit(op_type, inputs, [raw], **attrs)
        if act != "none":
            self.activation(raw, after_act, act)
        if back:
            back(after_act, out)

    def add_node(self, n) -> None:
        self.label, self.where = n.name or n.outputs[0], _where(n)
        if n.op not in SIMPLE_OPS and not hasattr(self, "op_" + n.op):
            raise ValueError(f"onnx writer: {self.where}: op '{n.op}' has no ONNX mapping")
        if len(n.outputs) != 1:  # every mapped op has one output
            raise ValueError(f"onnx writer: {self.where}: {len(n.outputs)} outputs")
        if n.op in SIMPLE_OPS:
            self.layer(n, SIMPLE_OPS[n.op], [self.value(n.inputs[0])])
        else:
            getattr(self, "op_" + n.op)(n)

    # ---- one method per graph op

    def op_conv2d(self, n) -> None:
        x, w = self.graph.tensors[n.inputs[0]], self.graph.tensors[n.inputs[1]]
        groups = x.shape[3] // w.shape[3]
        if groups * w.shape[3] != x.shape[3] or w.shape[0] % groups:
            raise ValueError(f"onnx writer: {self.where}: {x.shape[3]} input channels and "
                             f"{w.shape[0]} filters do not split into groups of {w.shape[3]}")
        weight = self.weight(n.inputs[1], "oihw", lambda d: d.transpose(0, 3, 1, 2))
        self.conv(n, weight, w.shape[1:3], groups)

    def op_depthwise_conv2d(self, n) -> None:
        x, w = self.graph.tensors[n.inputs[0]], self.graph.tensors[n.inputs[1]]
        mult = n.attrs["depth_multiplier"]
        if len(w.shape) != 4 or w.shape[0] != 1 or w.shape[3] != x.shape[3] * mult:
            raise ValueError(f"onnx writer: {self.where}: weights {w.shape} are not 1HW(C*M) "
                             f"for C={x.shape[3]}, M={mult}")
        # ONNX's grouped conv with group = C computes output channel k from input channel
        # k // M, as depthwise does, from weights [C*M, 1, H, W]
        weight = self.weight(n.inputs[1], "m1hw", lambda d: d[0].transpose(2, 0, 1)[:, None])
        self.conv(n, weight, w.shape[1:3], x.shape[3])

    def conv(self, n, weight: str, kernel, groups: int) -> None:
        a = n.attrs
        x, out = self.graph.tensors[n.inputs[0]], self.graph.tensors[n.outputs[0]]
        _check_window(self.where, x.shape[1:3], out.shape[1:3], kernel, a["stride"],
                      a["dilation"], a["padding"], ceil_allowed=False)
        inputs = [self.to_nchw(n.inputs[0]), weight]
        if len(n.inputs) > 2 and n.inputs[2]:
            inputs.append(self.weight(n.inputs[2]))
        self.layer(n, "Conv", inputs, self.to_nhwc, kernel_shape=list(kernel),
                   strides=list(a["stride"]), dilations=list(a["dilation"]),
                   pads=_onnx_pads(a["padding"]), group=int(groups))

    def op_avg_pool2d(self, n) -> None:
        if tuple(n.attrs.get("dilation", (1, 1))) != (1, 1):
            raise ValueError(f"onnx writer: {self.where}: a dilated AveragePool needs opset 19")
        self.pool(n, "AveragePool",
                  count_include_pad=int(bool(n.attrs.get("count_include_pad", False))))

    def op_max_pool2d(self, n) -> None:
        dilation = tuple(n.attrs.get("dilation", (1, 1)))
        self.pool(n, "MaxPool", **({"dilations": list(dilation)} if dilation != (1, 1) else {}))

    def pool(self, n, op_type: str, **extra) -> None:
        a = n.attrs
        x, out = self.graph.tensors[n.inputs[0]], self.graph.tensors[n.outputs[0]]
        ceil = _check_window(self.where, x.shape[1:3], out.shape[1:3], a["filter"], a["stride"],
                             a.get("dilation", (1, 1)), a["padding"], ceil_allowed=True)
        self.layer(n, op_type, [self.to_nchw(n.inputs[0])], self.to_nhwc,
                   kernel_shape=list(a["filter"]), strides=list(a["stride"]),
                   pads=_onnx_pads(a["padding"]), ceil_mode=int(ceil), **extra)

    def op_fully_connected(self, n) -> None:
        x, w = self.graph.tensors[n.inputs[0]], self.graph.tensors[n.inputs[1]]
        out = self.graph.tensors[n.outputs[0]]
        if len(w.shape) != 2 or x.size % w.shape[1] or \
                out.size != x.size // w.shape[1] * w.shape[0]:
            raise ValueError(f"onnx writer: {self.where}: input {x.shape}, weights {w.shape} "
                             f"and output {out.shape} do not match")
        a = self.value(n.inputs[0])
        if len(x.shape) != 2:  # rows of `in` values, as TFLite's FULLY_CONNECTED reads them
            flat = self.tmp(f"{n.inputs[0]}:2d")
            shape = self.int64s(f"{flat}:shape", (x.size // w.shape[1], w.shape[1]))
            self.emit("Reshape", [a, shape], [flat])
            a = flat
        inputs = [a, self.weight(n.inputs[1])]
        if len(n.inputs) > 2 and n.inputs[2]:
            inputs.append(self.weight(n.inputs[2]))
        self.layer(n, "Gemm", inputs, self.reshaper(out.shape) if len(out.shape) != 2 else None,
                   transB=1)

    def reshaper(self, shape):
        def back(src: str, dst: str) -> None:
            self.emit("Reshape", [src, self.int64s(f"{dst}:shape", shape)], [dst])
        return back

    def op_add(self, n) -> None:
        self.layer(n, "Add", self.values(n.inputs))

    def op_mul(self, n) -> None:
        self.layer(n, "Mul", self.values(n.inputs))

    def op_concat(self, n) -> None:
        rank = len(self.graph.tensors[n.outputs[0]].shape)
        self.layer(n, "Concat", self.values(n.inputs), axis=int(n.attrs["axis"]) % rank)

    def op_reshape(self, n) -> None:
        # the shape operand (inputs[1]) may be absent or int32: the output's shape is the truth
        out = self.graph.tensors[n.outputs[0]]
        self.layer(n, "Reshape", [self.value(n.inputs[0]),
                                  self.int64s(f"{n.outputs[0]}:shape", out.shape)])

    def op_transpose(self, n) -> None:
        self.layer(n, "Transpose", [self.value(n.inputs[0])],
                   perm=[int(p) for p in n.attrs["perm"]])

    def op_softmax(self, n) -> None:
        rank = len(self.graph.tensors[n.inputs[0]].shape)
        x = self.value(n.inputs[0])
        beta = float(n.attrs["beta"])
        if beta != 1.0:  # softmax(beta * x): ONNX's Softmax has no beta
            scaled = self.tmp(f"{n.inputs[0]}:beta")
            self.emit("Mul", [x, self.scalar(beta)], [scaled])
            x = scaled
        self.layer(n, "Softmax", [x], axis=int(n.attrs.get("axis", rank - 1)) % rank)

    def op_mean(self, n) -> None:
        rank = len(self.graph.tensors[n.inputs[0]].shape)
        self.layer(n, "ReduceMean", [self.value(n.inputs[0])],
                   axes=sorted(int(a) % rank for a in n.attrs["axes"]),
                   keepdims=int(bool(n.attrs["keep_dims"])))

    def op_reduce(self, n) -> None:
        fn = n.attrs["fn"]
        if fn not in REDUCE_OPS:
            raise ValueError(f"onnx writer: {self.where}: reduce '{fn}' has no ONNX mapping")
        rank = len(self.graph.tensors[n.inputs[0]].shape)
        axes = sorted(int(a) % rank for a in n.attrs["axes"])
        inputs = [self.value(n.inputs[0])]
        attrs = {"keepdims": int(bool(n.attrs["keep_dims"]))}
        if fn == "sum":  # opset 13 moved ReduceSum's axes (only) to an input
            inputs.append(self.int64s(f"{n.outputs[0]}:axes", axes))
        else:
            attrs["axes"] = axes
        self.layer(n, REDUCE_OPS[fn], inputs, **attrs)

    def op_pad(self, n) -> None:
        mode = n.attrs.get("mode", "constant")
        if mode not in PAD_MODES:
            raise ValueError(f"onnx writer: {self.where}: pad mode '{mode}' needs a newer opset")
        pads = [tuple(p) for p in n.attrs["pads"]]
        inputs = [self.value(n.inputs[0]),
                  self.int64s(f"{n.outputs[0]}:pads", [b for b, _ in pads] + [e for _, e in pads])]
        if mode == "constant" and len(n.inputs) > 2 and n.inputs[2]:
            t = self.check_float(n.inputs[2])
            if not t.is_const or t.size != 1:
                raise ValueError(f"onnx writer: {self.where}: the pad value is not one constant")
            inputs.append(self.scalar(np.asarray(t.data).reshape(-1)[0]))
        self.layer(n, "Pad", inputs, mode=PAD_MODES[mode])

    def op_relu6(self, n) -> None:
        lo, hi = CLAMPS["relu6"]
        self.layer(n, "Clip", [self.value(n.inputs[0]), self.scalar(lo), self.scalar(hi)])

    def op_leaky_relu(self, n) -> None:
        self.layer(n, "LeakyRelu", [self.value(n.inputs[0])], alpha=float(n.attrs["alpha"]))

    def op_hard_swish(self, n) -> None:
        # x * relu6(x + 3) / 6 = x * HardSigmoid(x; alpha 1/6, beta 1/2): HardSwish itself
        # arrived in opset 14
        x = self.value(n.inputs[0])
        gate = self.tmp(f"{n.outputs[0]}:gate")
        self.emit("HardSigmoid", [x], [gate], alpha=1.0 / 6.0, beta=0.5)
        self.layer(n, "Mul", [x, gate])

    # ---- the model

    def model(self) -> onnx.ModelProto:
        g = self.graph
        for name in g.outputs:
            self.check_float(name, f"graph output '{name}'")
        graph = helper.make_graph(
            self.nodes, g.name or "model",
            [_value_info(g.tensors[t]) for t in g.inputs],
            [_value_info(g.tensors[t]) for t in g.outputs],
            initializer=self.initializers)
        return helper.make_model(graph, producer_name="mcuforge", ir_version=IR_VERSION,
                                 opset_imports=[helper.make_opsetid("", OPSET)])


def _value_info(t: Tensor) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(t.name, TensorProto.FLOAT, list(t.shape))


def _onnx_pads(padding) -> list:
    """mcuforge's (top, bottom, left, right) -> ONNX's [top, left, bottom, right]."""
    top, bottom, left, right = (int(p) for p in padding)
    return [top, left, bottom, right]


def _check_window(where, in_hw, out_hw, kernel, stride, dilation, padding,
                  ceil_allowed: bool) -> bool:
    """Whether ONNX needs ceil_mode to produce the graph's output size; ValueError when
    neither rounding gives it (the graph's windows would not be ONNX's)."""
    top, bottom, left, right = padding
    floors, ceils = [], []
    for size, k, s, d, pad in zip(in_hw, kernel, stride, dilation, (top + bottom, left + right)):
        span = size + pad - ((k - 1) * d + 1)
        floors.append(span // s + 1)
        ceils.append(-(-span // s) + 1)
    if list(out_hw) == floors:
        return False
    if ceil_allowed and list(out_hw) == ceils:
        return True
    raise ValueError(f"onnx writer: {where}: output size {tuple(out_hw)} is not what ONNX "
                     f"computes from input {tuple(in_hw)}, kernel {tuple(kernel)}, stride "
                     f"{tuple(stride)}, dilation {tuple(dilation)} and pads {tuple(padding)}")
