"""The graph IR every part of mcuforge shares.

A model is a `Graph`: named `Tensor`s (shape in NHWC, dtype, optional constant data and
quantization) and a topologically ordered list of `Node`s that read and write tensors by name.
Frontends produce it, optimizer passes map Graph -> Graph, codegen_c lowers it.

Op names are mcuforge's own (see `OPS`), not a framework's; attributes are plain Python values
documented per op in `OPS` so that every frontend produces the same thing.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Optional

import numpy as np

from .errors import McuforgeError

DTYPES = ("int8", "uint8", "int16", "int32", "int64", "float32", "bool")
ACTIVATIONS = ("none", "relu", "relu6", "relu_n1_to_1")

# op -> attributes it must carry. Conventions, shared by every frontend and lowering:
#   padding  = (top, bottom, left, right), explicit, already resolved from SAME/VALID
#   stride / dilation / filter = (h, w)
#   conv2d weights are OHWI with I = C / groups; depthwise weights are 1HW(C*M);
#   conv_transpose2d takes (x, w, bias?) with OHWI weights, I = C_in / groups;
#   fully_connected weights are [out, in]; a bias may be absent
#   avg_pool2d / max_pool2d may carry "dilation" (h, w); avg_pool2d "count_include_pad"
#   int8 avg_pool2d: requant="onnxruntime" = QLinear(Global)AveragePool's arithmetic, with
#   "zp_offset" (0 or 128) the zero point shift of onnxruntime's uint8 conversion on x86
#   layer_norm may have the outputs mean and inv_std_dev after y
#   activation is one of ACTIVATIONS, fused into the op's output clamp
#   int8 conv2d / depthwise_conv2d / fully_connected: requant="onnxruntime" = ORT's float rescale
#   int8 logistic / leaky_relu / where / softmax: requant="onnxruntime" = ORT's QLinearSigmoid /
#   QLinearLeakyRelu / QLinearWhere lookup tables and QLinearSoftmax kernel; softmax may carry
#   "zp_offset" as avg_pool2d (codegen_c/lower/lut_ort.py)
#   int16 conv2d / fully_connected without a bias: acc="int32" = TFLM's int32 accumulator and
#   32-bit requantization (TFLite's quantized_bias_type INT32); default int64
#   constant operands (reshape's shape, pad's paddings, mean's axes) stay in Node.inputs at the
#   framework's positions; the attribute is the source of truth
#   matmul / conv_transpose2d / resize with tflm=True (TFLite imports): computed exactly as
#   TFLM's reference kernel (its float summation order, its float32 / 10-bit fixed-point resize
#   coordinates from the attrs align_corners, half_pixel_centers); such a matmul may carry
#   adj_x / adj_y (the operand's last two axes swapped before multiplying)
OPS = {
    "conv2d": ("stride", "dilation", "padding", "activation"),
    "depthwise_conv2d": ("stride", "dilation", "padding", "depth_multiplier", "activation"),
    "fully_connected": ("activation",),
    "add": ("activation",),
    "mul": ("activation",),
    # add / mul's optional "tflm": True: a float result is clamped as TFLM's kernels do,
    # v < lo ? lo : v then hi < v ? hi : v with lo, hi = +-FLT_MAX for activation "none"
    # TFLite SUB / DIV: a - b, a / b with numpy broadcasting and the fused activation clamped
    # as TFLM does (float: to +-FLT_MAX even for "none"); int8 / int16 requantized as TFLM
    "sub": ("activation",),
    "div": ("activation",),
    "add_n": (),  # TFLite ADD_N: the sum of same-shape inputs, accumulated in input order
    "avg_pool2d": ("filter", "stride", "padding", "activation"),
    "max_pool2d": ("filter", "stride", "padding", "activation"),
    "reshape": (),  # zero-copy: the output shares the input's memory
    "softmax": ("beta",),
    "concat": ("axis", "activation"),
    "pad": ("pads",),  # pads = ((before, after), ...) per dim; value: inputs[2] or the zero point
    # pad's optional "mode" (numpy.pad's names): constant (default) | reflect | symmetric | edge
    # | wrap; reflect mirrors without repeating the edge element, symmetric repeats it
    "mean": ("axes", "keep_dims"),
    "logistic": (),
    "tanh": (),
    "relu": (),
    "relu6": (),
    "leaky_relu": ("alpha",),
    "hard_swish": (),
    "quantize": (),  # float->int or int->int requantize
    "dequantize": (),
    # ---- generic ops: any rank, axes explicit and non-negative, numpy semantics ----
    "unary": ("fn",),  # y = fn(x), fn in UNARY_FNS; its parameters (alpha, ...) are attrs too
    # unary's optional "tflm": True computes as TFLM's reference kernel: round is RoundToNearest
    # (half to even, +0.0 for -0.5 <= x < 0), elu is x < 0 ? expm1(x) : x
    "binary": ("fn",),  # numpy broadcasting, fn in BINARY_FNS; comparisons give bool
    # binary's optional "tflm": True computes as TFLM's reference kernel: float max / min are
    # a > b ? a : b, mod is TFLM's FloorMod, int8 comparison operands are rescaled first
    "where": (),  # inputs (cond, a, b), broadcasting
    "cast": (),  # to the output tensor's dtype
    "transpose": ("perm",),
    "reduce": ("fn", "axes", "keep_dims"),  # fn in REDUCE_FNS
    # reduce max / min's optional "tflm": True computes as TFLM's reducers: the accumulator
    # starts at the type's lowest / highest value and takes an input only when strictly
    # greater / smaller (NaN never; a float row of -inf for max gives -FLT_MAX)
    "arg_reduce": ("fn", "axis", "keep_dims", "select_last_index"),  # fn: max | min; int64 out
    "log_softmax": ("axis",),
    # TFLite L2_NORMALIZATION along the last axis: x / max(sqrt(sum(x * x)), epsilon);
    # int8: TFLM's fixed point, output scale 1/128 and zero point 0 whatever the tensor says
    "l2_normalization": ("epsilon",),
    "hardmax": ("axis",),
    "matmul": (),  # numpy matmul: batch dimensions broadcast
    "conv_transpose2d": ("stride", "dilation", "padding", "output_padding", "activation"),
    "batch_norm": ("epsilon",),  # inputs (x, scale, bias, mean, var), channels on the last axis
    "instance_norm": ("epsilon",),  # inputs (x, scale, bias), NHWC
    "layer_norm": ("axis", "epsilon"),  # inputs (x, scale, bias?), normalised over axis..end
    "slice": ("starts", "ends", "steps"),  # one entry per axis, static, numpy slicing
    "tile": ("repeats",),
    "broadcast_to": (),  # to the output tensor's shape
    "gather": ("axis",),  # inputs (data, indices)
    # gather's optional "batch_dims" b (TFLite GATHER): the first b dimensions of data and
    # indices are shared, y[B, O, C, I] = data[B, O, indices[B, C], I]
    "gather_elements": ("axis",),
    "depth_to_space": ("block", "mode"),  # NHWC; mode: DCR | CRD
    "space_to_depth": ("block",),  # NHWC
    "resize": ("mode", "coordinate_transformation", "nearest_mode", "cubic_coeff_a"),
    "cumsum": ("axis", "exclusive", "reverse"),
    # recurrent layers in ONNX's layouts: x [seq, batch, in], y [seq, dirs, batch, hidden],
    # states [dirs, batch, hidden], gates in ONNX order; every output exists (it holds state)
    "lstm": ("hidden_size", "direction", "clip", "input_forget"),  # (x, w, r, b?, h0?, c0?, p?)
    "gru": ("hidden_size", "direction", "clip", "linear_before_reset"),  # (x, w, r, b?, h0?)
    # stateful TFLite layers as tflite-micro computes them; outputs after y are the next values
    # of the state inputs (Graph.state maps those to them)
    # svdf: inputs (x [B, I], weights_feature [F, I], weights_time [F, M], bias? [U], state
    # [B, F*M]), outputs (y [B, U], next state); F = U * rank filters, each remembering its last
    # M feature activations, newest last: next = state shifted left by one per filter with
    # weights_feature . x appended; y = bias + sum over a unit's rank filters of weights_time .
    # next, then the fused activation (TFLite int8 nodes get "none": TFLM's kernel applies none);
    # the state input is absent when M = 1 (nothing of it survives)
    "svdf": ("rank", "activation"),
    # lstm_tflite (UNIDIRECTIONAL_SEQUENCE_LSTM, no peepholes / projection / layer norm): inputs
    # (x, 4 input weights [H, I], 4 recurrent weights [H, H], 4 biases [H], hidden [B, H], cell
    # [B, H]), gates in TFLite's order input, forget, cell, output; outputs (y, next hidden, next
    # cell). x [T, B, I] and y [T, B, H] when time_major, else [B, T, ...]; gates sigmoid, cell
    # gate and output tanh; cell_clip > 0 clamps the cell state; int8 / int16 in TFLM's fixed point
    "lstm_tflite": ("time_major", "cell_clip"),
    # ---- control flow (TFLite IF / WHILE): the attrs hold whole Graphs (subgraphs) ----
    # Subgraphs are Graphs of their own (static shapes, no state) that read nothing of the
    # parent but their inputs; their inputs / outputs map positionally onto the node's
    # operands / outputs with the same dtype and byte size (values are copied as raw bytes, as
    # tflite-micro does, so shapes and quantization may differ). Passes treat these nodes as
    # opaque; optimizer.pipeline optimizes each subgraph on its own.
    # if: inputs (cond: bool with one element, operands...); then_graph / else_graph take the
    # operands and produce the node's outputs; the one cond selects runs
    "if": ("then_graph", "else_graph"),
    # while: inputs = loop-carried initial values, outputs = their final values (same count,
    # dtypes and byte sizes); cond_graph takes the values and its first output is a bool
    # (element 0 read); while it is true, body_graph maps the values to their next values
    "while": ("cond_graph", "body_graph"),
}
# control-flow op -> its attributes holding subgraphs, in the order the node documents them
SUBGRAPH_ATTRS = {"if": ("then_graph", "else_graph"), "while": ("cond_graph", "body_graph")}
# softmax, log_softmax, hardmax: an optional "axis" attr (default: the last axis)
UNARY_FNS = frozenset({
    "abs", "neg", "exp", "log", "sqrt", "reciprocal", "floor", "ceil", "round", "sign", "sin",
    "cos", "erf", "not", "elu", "selu", "celu", "hard_sigmoid", "softplus", "softsign", "gelu",
    "clip",
    "rsqrt",  # 1 / sqrt(x)
})
BINARY_FNS = frozenset({
    "add", "sub", "mul", "div", "max", "min", "pow", "mod", "prelu",
    "equal", "less", "greater", "less_equal", "greater_equal", "and", "or", "xor",
    "not_equal", "floor_div", "squared_difference",  # TFLite: a != b; floor(a / b) in double;
    # (a - b) ** 2
})
REDUCE_FNS = frozenset({"mean", "max", "min", "sum", "prod", "l1", "l2", "sum_square",
                        "log_sum", "log_sum_exp"})
ALIAS_OPS = frozenset({"reshape"})
# Views: a "slice" or "concat" node with attrs["view"] = True moves no data. A view slice's
# output is the bytes of its input from the first selected element on (the selection is one
# contiguous run: one axis cut, the axes before it of size 1, the axes after it whole, steps 1);
# a view concat's inputs lie inside its output one after another (the axes before `axis` of
# size 1, activation none), each written there by its producer. Same dtype and quantization on
# both sides. The memory planner places them so (optimizer/memory_plan.py); no kernel runs.


def is_alias(node: Node) -> bool:
    """A node without a kernel whose outputs are bytes of its inputs (or the reverse)."""
    return node.op in ALIAS_OPS or (node.op in ("slice", "concat")
                                    and bool(node.attrs.get("view")))


@dataclass(frozen=True)
class Quant:
    """Affine quantization: real = scale * (q - zero_point). Per-axis when len(scale) > 1."""

    scale: tuple
    zero_point: tuple
    axis: int = 0

    @property
    def per_axis(self) -> bool:
        return len(self.scale) > 1


@dataclass(frozen=True, eq=False)
class Tensor:
    name: str
    shape: tuple
    dtype: str
    data: Optional[np.ndarray] = None  # set for constants (weights, biases)
    quant: Optional[Quant] = None

    @property
    def is_const(self) -> bool:
        return self.data is not None

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) if self.shape else 1

    @property
    def nbytes(self) -> int:
        return self.size * np.dtype(self.dtype).itemsize


@dataclass(frozen=True, eq=False)
class Node:
    op: str
    inputs: tuple  # tensor names; "" for an absent optional input
    outputs: tuple
    attrs: dict = field(default_factory=dict)
    name: str = ""


@dataclass(eq=False)
class Graph:
    tensors: dict  # name -> Tensor
    nodes: list  # topological order
    inputs: list  # names of graph inputs
    outputs: list  # names of graph outputs
    name: str = "model"
    # State kept across invocations (TFLite variables, SVDF/LSTM state): state tensor -> the
    # tensor holding its value after an invocation. A state tensor is known from the start,
    # like an input. Reset sets it to its default (int8: its zero point, else zeros), as
    # tflite-micro does; init sets the default, then state_init[name] when present (values a
    # run-once initialisation assigns).
    state: dict = field(default_factory=dict)
    state_init: dict = field(default_factory=dict)

    def sources(self) -> set:
        """Tensors whose values come from outside the invocation: inputs and state."""
        return set(self.inputs) | set(self.state)

    def sinks(self) -> set:
        """Tensors whose values must survive the invocation: outputs and next state values."""
        return set(self.outputs) | set(self.state.values())

    def producer(self, tensor: str) -> Optional[Node]:
        for n in self.nodes:
            if tensor in n.outputs:
                return n
        return None

    def consumers(self, tensor: str) -> list:
        return [n for n in self.nodes if tensor in n.inputs]

    def replace(self, **kw) -> "Graph":
        return replace(self, **kw)


def subgraphs(node: Node) -> list:
    """The subgraphs a control-flow node runs (if: then, else; while: cond, body); [] for
    other ops."""
    return [node.attrs[a] for a in SUBGRAPH_ATTRS.get(node.op, ()) if a in node.attrs]


MAX_NESTING = 8  # control flow nested deeper than this is refused (it bounds every recursion)


class GraphError(McuforgeError, ValueError):
    """The graph breaks an IR invariant; the message names the node or tensor."""


def _same_bytes(where: str, what: str, outer: list, inner: list) -> None:
    """Values copied between a control-flow node and a subgraph: same count, dtype, bytes."""
    if len(outer) != len(inner):
        raise GraphError(f"{where}: {what}: {len(inner)} tensors for the node's {len(outer)}")
    for k, (a, b) in enumerate(zip(outer, inner)):
        if a is None or (a.dtype, a.nbytes) != (b.dtype, b.nbytes):
            raise GraphError(f"{where}: {what} {k} ('{b.name}' {b.dtype}{list(b.shape)}) does "
                             "not match the node's tensor "
                             + ("(absent)" if a is None else f"{a.dtype}{list(a.shape)}"))


def _verify_control(g: Graph, n: Node, where: str, depth: int) -> None:
    """A control-flow node: its subgraphs are valid graphs without state, and their inputs and
    outputs match the node's operands and outputs."""
    if depth >= MAX_NESTING:
        raise GraphError(f"{where}: control flow nested more than {MAX_NESTING} deep")
    subs = {a: n.attrs[a] for a in SUBGRAPH_ATTRS[n.op]}
    for a, s in subs.items():
        if not isinstance(s, Graph):
            raise GraphError(f"{where}: {a} is not a Graph")
        if s.state:
            raise GraphError(f"{where}: {a} keeps state across invocations (not supported "
                             "in subgraphs)")
        try:
            verify(s, depth + 1)
        except GraphError as e:
            raise GraphError(f"{where}: {a}: {e}") from None
    tensor = lambda name: g.tensors[name] if name else None  # noqa: E731
    outs = [g.tensors[t] for t in n.outputs]
    ports = lambda s, names: [s.tensors[t] for t in names]  # noqa: E731
    if n.op == "if":
        cond = tensor(n.inputs[0]) if n.inputs else None
        if cond is None or cond.dtype != "bool" or cond.size != 1:
            raise GraphError(f"{where}: the condition (input 0) must be a bool with one element")
        operands = [tensor(t) for t in n.inputs[1:]]
        for a, s in subs.items():
            _same_bytes(where, f"{a} input", operands, ports(s, s.inputs))
            _same_bytes(where, f"{a} output", outs, ports(s, s.outputs))
        return
    operands = [tensor(t) for t in n.inputs]
    cond, body = subs["cond_graph"], subs["body_graph"]
    _same_bytes(where, "output", operands, outs)
    _same_bytes(where, "cond_graph input", operands, ports(cond, cond.inputs))
    _same_bytes(where, "body_graph input", operands, ports(body, body.inputs))
    _same_bytes(where, "body_graph output", outs, ports(body, body.outputs))
    if not cond.outputs or cond.tensors[cond.outputs[0]].dtype != "bool":
        raise GraphError(f"{where}: cond_graph's first output must be a bool")


def _verify_quant(t: Tensor) -> None:
    """An integer tensor's scales are positive finite numbers and its zero points fit its
    dtype (a float tensor's quantization is only carried along)."""
    q = t.quant
    if len(q.scale) != len(q.zero_point):
        raise GraphError(f"tensor '{t.name}': scale and zero point lengths differ")
    if not np.issubdtype(np.dtype(t.dtype), np.integer):
        return
    for s in q.scale:
        if not (math.isfinite(s) and s > 0):
            raise GraphError(f"tensor '{t.name}': quantization scale {s} is not a positive "
                             "finite number")
    info = np.iinfo(np.dtype(t.dtype))
    for z in q.zero_point:
        if not info.min <= z <= info.max:
            raise GraphError(f"tensor '{t.name}': zero point {z} is outside {t.dtype}'s "
                             f"range [{info.min}, {info.max}]")
    if q.per_axis and not (t.shape and 0 <= q.axis < len(t.shape)
                           and t.shape[q.axis] == len(q.scale)):
        raise GraphError(f"tensor '{t.name}': {len(q.scale)} per-channel scales along axis "
                         f"{q.axis} of shape {t.shape}")


def _broadcast(shapes) -> Optional[tuple]:
    """numpy broadcasting of the shapes, or None when they do not broadcast."""
    rank = max(len(s) for s in shapes)
    out = []
    for k in range(rank):
        dims = {s[k - rank + len(s)] for s in shapes if k - rank + len(s) >= 0} - {1}
        if len(dims) > 1:
            return None
        out.append(dims.pop() if dims else 1)
    return tuple(out)


def _shape_problem(g: Graph, n: Node) -> Optional[str]:
    """What is wrong with the shapes of a node's operands and outputs, for the ops whose C
    would index past a buffer otherwise; None when they fit."""
    t = lambda i: g.tensors[n.inputs[i]] if i < len(n.inputs) and n.inputs[i] else None  # noqa
    ins = [t(i) for i in range(len(n.inputs))]
    y = g.tensors[n.outputs[0]]
    shape = lambda x: list(x.shape)  # noqa: E731
    if n.op == "reshape" and ins and ins[0].size != y.size:
        return f"reshape of {shape(ins[0])} to {shape(y)}: the sizes differ"
    if n.op in ("add", "mul", "sub", "div", "binary", "where") and len(ins) >= 2 \
            and all(x is not None for x in ins):
        b = _broadcast([x.shape for x in ins])
        strip = lambda s: tuple(s)[next((i for i, d in enumerate(s) if d != 1), len(s)):]  # noqa
        if b is None or strip(b) != strip(y.shape):  # (leading 1s aside: TFLite scalars)
            return "operands " + ", ".join(str(shape(x)) for x in ins) + \
                f" do not broadcast to the output {shape(y)}"
    if n.op == "matmul" and len(ins) >= 2 and len(ins[0].shape) >= 2 \
            and len(ins[1].shape) >= 2:
        a, b = list(ins[0].shape), list(ins[1].shape)
        if n.attrs.get("adj_x"):
            a[-2:] = a[-1], a[-2]
        if n.attrs.get("adj_y"):
            b[-2:] = b[-1], b[-2]
        batch = _broadcast([a[:-2], b[:-2]])
        if a[-1] != b[-2] or batch is None or (*batch, a[-2], b[-1]) != tuple(y.shape):
            return f"matmul of {shape(ins[0])} and {shape(ins[1])} cannot give {shape(y)}"
    if n.op == "fully_connected" and len(ins) >= 2:
        x, w = ins[0], ins[1]
        if len(w.shape) != 2 or x.size % w.shape[1] or y.size != x.size // w.shape[1] * \
                w.shape[0] or y.shape[-1] != w.shape[0]:
            return f"fully_connected of {shape(x)} by weights {shape(w)} cannot give {shape(y)}"
    if n.op in ("conv2d", "depthwise_conv2d") and len(ins) >= 2:
        x, w = ins[0], ins[1]
        if len(x.shape) != 4 or len(w.shape) != 4 or len(y.shape) != 4:
            return f"{n.op} needs 4-D NHWC tensors, not {shape(x)}, {shape(w)} -> {shape(y)}"
        if n.op == "conv2d":
            ok = x.shape[3] % w.shape[3] == 0 and y.shape[3] == w.shape[0] and \
                w.shape[0] % (x.shape[3] // w.shape[3]) == 0
        else:
            ok = y.shape[3] == w.shape[3] == x.shape[3] * n.attrs["depth_multiplier"]
        if not ok or y.shape[0] != x.shape[0]:
            return f"{n.op} channels: input {shape(x)}, weights {shape(w)}, output {shape(y)}"
        pt, pb, pl, pr = n.attrs["padding"]
        for k, (size, pads) in enumerate(((x.shape[1], pt + pb), (x.shape[2], pl + pr))):
            span = (w.shape[1 + k] - 1) * n.attrs["dilation"][k] + 1
            if y.shape[1 + k] != (size + pads - span) // n.attrs["stride"][k] + 1:
                return f"{n.op}: output {shape(y)} does not follow from input {shape(x)}, " \
                       f"window {w.shape[1:3]}, stride, dilation and padding"
    if n.op in ("avg_pool2d", "max_pool2d") and ins and len(ins[0].shape) == 4:
        x = ins[0]
        pads = n.attrs["padding"]
        for k in range(2):
            size, s = x.shape[1 + k], n.attrs["stride"][k]
            span = (n.attrs["filter"][k] - 1) * n.attrs.get("dilation", (1, 1))[k] + 1
            least = (size + pads[2 * k] + pads[2 * k + 1] - span) // s + 1
            if not least <= y.shape[1 + k] or (y.shape[1 + k] - 1) * s >= size + pads[2 * k]:
                return f"{n.op}: output {shape(y)} does not follow from input {shape(x)}; a " \
                       "window would start past the input"
        if y.shape[3] != x.shape[3] or y.shape[0] != x.shape[0]:
            return f"{n.op}: input {shape(x)} and output {shape(y)} differ in batch or channels"
    if n.op == "concat" and ins and all(x is not None for x in ins):
        axis = n.attrs["axis"]
        rest = lambda x: x.shape[:axis] + x.shape[axis + 1:]  # noqa: E731
        if any(len(x.shape) != len(y.shape) or rest(x) != rest(y) for x in ins) or \
                sum(x.shape[axis] for x in ins) != y.shape[axis]:
            return "concat of " + ", ".join(str(shape(x)) for x in ins) + \
                f" along axis {axis} cannot give {shape(y)}"
    if n.attrs.get("view"):
        return _view_problem(g, n)
    return None


def _view_problem(g: Graph, n: Node) -> Optional[str]:
    """What makes a view slice or concat (see is_alias) not one contiguous run of bytes."""
    if n.op not in ("slice", "concat"):
        return f"only slice and concat can be views, not {n.op}"
    y = g.tensors[n.outputs[0]]
    ins = [g.tensors[t] for t in n.inputs if t]
    if any(x.dtype != y.dtype or x.quant != y.quant for x in ins):
        return "a view's input and output differ in dtype or quantization"
    if n.op == "concat":
        axis = n.attrs["axis"]
        if n.attrs["activation"] != "none" or any(d != 1 for d in y.shape[:axis]) or \
                any(x.is_const or x.name in g.sources() for x in ins):
            return "a view concat needs size-1 axes before its axis, no activation, and " \
                   "inputs computed by the graph"
        return None
    x = ins[0]
    starts, ends, steps = n.attrs["starts"], n.attrs["ends"], n.attrs["steps"]
    if len(starts) != len(x.shape) or any(s != 1 for s in steps) or any(
            not 0 <= a < b <= d or b - a != e for a, b, d, e in zip(starts, ends, x.shape,
                                                                      y.shape)):
        return "a view slice needs one in-range start and end per axis, steps 1"
    cut = [k for k, d in enumerate(y.shape) if d != x.shape[k]]
    if cut and (any(d != 1 for d in y.shape[:cut[0]]) or len(cut) > 1):
        return "a view slice must select one contiguous run of its input"
    return None


def verify(g: Graph, depth: int = 0) -> Graph:
    """Check the IR invariants; return the graph unchanged or raise GraphError.

    Guarantees on success: every referenced tensor exists; every node's inputs are graph
    inputs, state, constants or outputs of an earlier node; each state tensor's next value is
    produced and has its shape, dtype and quantization; each tensor has one producer; ops and
    their attributes are known; dtypes are known; shapes are static positive integers; the
    subgraphs of control-flow nodes (nested at most MAX_NESTING deep; `depth` is this graph's)
    are verified too and match their node; the operand and output shapes of the ops whose C
    would otherwise index past a buffer (reshape, broadcasting binary ops, matmul,
    fully_connected, conv2d, depthwise_conv2d, pools, concat) fit each other.
    """
    known = g.sources() | {n for n, t in g.tensors.items() if t.is_const}
    viewed = set()
    for name in list(g.inputs) + list(g.outputs) + list(g.state) + list(g.state.values()):
        if name not in g.tensors:
            raise GraphError(f"graph input/output/state '{name}' has no tensor")
    for name, nxt in g.state.items():
        a, b = g.tensors[name], g.tensors[nxt]
        if a.is_const or name in g.inputs:
            raise GraphError(f"state tensor '{name}' is a constant or a graph input")
        if (tuple(a.shape), a.dtype, a.quant) != (tuple(b.shape), b.dtype, b.quant):
            raise GraphError(f"state tensor '{name}' and its next value '{nxt}' differ in "
                             "shape, dtype or quantization")
    for t in g.tensors.values():
        if t.dtype not in DTYPES:
            raise GraphError(f"tensor '{t.name}': unknown dtype {t.dtype}")
        if any((not isinstance(d, (int, np.integer))) or d <= 0 for d in t.shape):
            raise GraphError(f"tensor '{t.name}': shape {t.shape} is not static and positive")
        if t.quant is not None:
            _verify_quant(t)
    for i, n in enumerate(g.nodes):
        where = f"node {i} ({n.op} '{n.name or (n.outputs[0] if n.outputs else '')}')"
        if not n.outputs:
            raise GraphError(f"{where}: has no outputs")
        if n.op not in OPS:
            raise GraphError(f"{where}: unknown op")
        missing = [a for a in OPS[n.op] if a not in n.attrs]
        if missing:
            raise GraphError(f"{where}: missing attributes {missing}")
        fns = {"unary": UNARY_FNS, "binary": BINARY_FNS, "reduce": REDUCE_FNS}.get(n.op)
        if fns is not None and n.attrs["fn"] not in fns:
            raise GraphError(f"{where}: unknown {n.op} function {n.attrs['fn']}")
        if n.attrs.get("activation", "none") not in ACTIVATIONS:
            raise GraphError(f"{where}: unknown activation {n.attrs['activation']}")
        for t in n.inputs:
            if t and t not in g.tensors:
                raise GraphError(f"{where}: input '{t}' has no tensor")
            if t and t not in known:
                raise GraphError(f"{where}: input '{t}' is used before it is produced")
        for t in n.outputs:
            if t not in g.tensors:
                raise GraphError(f"{where}: output '{t}' has no tensor")
            if t in known:
                raise GraphError(f"{where}: output '{t}' is produced twice")
            known.add(t)
        if is_alias(n):  # each tensor is the bytes of at most one other buffer
            for t in (n.inputs if n.op == "concat" else n.outputs):
                if t in viewed:
                    raise GraphError(f"{where}: '{t}' is already a view of another buffer")
                viewed.add(t)
        if n.op in SUBGRAPH_ATTRS:
            _verify_control(g, n, where, depth)
        problem = _shape_problem(g, n)
        if problem:
            raise GraphError(f"{where}: {problem}")
    for name in list(g.outputs) + list(g.state.values()):
        if name not in known:
            raise GraphError(f"graph output or next state '{name}' is never produced")
    return g
