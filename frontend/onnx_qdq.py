"""QDQ -> QOperator rewrite of quantized ONNX models (ONNX level, before constant folding).

`fuse_qdq(model)` rewrites DequantizeLinear -> Conv/Gemm/MatMul -> QuantizeLinear (and
quantization-preserving ops between DQ and Q, and the DQ -> op -> Q patterns onnxruntime fuses
into com.microsoft QLinear* ops) into QLinearConv / QLinearMatMul / QGemm / QLinear* before
import, so the QOperator converters (frontend/onnx_quant.py, frontend/onnx_quant_lut.py) run;
it must see the model before constant folding (which would turn the int8 weights into floats).
It also gives the quantized ops float32 copies of float16 scales (exact; float32_scales), and
records the output shapes of com.microsoft nodes that onnx's shape inference does not know
(record_shapes). ORT_S8_TO_U8 marks fused nodes onnxruntime's x86 builds run as uint8.

Version followed: onnxruntime 1.31.1, the version pinned in pyproject.toml's test extra
(tests/test_onnx_quant.py compares with it bit for bit); recheck these formulas when the pin
moves (1.32.0 computes com.microsoft QLinearSoftmax differently).
"""
from __future__ import annotations

import numpy as np


# ---- QDQ -> QOperator rewrite (ONNX level, before constant folding) -------------------------

_QLINEAR = {"Conv": "QLinearConv", "MatMul": "QLinearMatMul", "Gemm": "QGemm"}
# float ops whose DequantizeLinear'd activations and QuantizeLinear'd output fuse into a
# com.microsoft op (every DequantizeLinear and the QuantizeLinear per tensor)
_QLINEAR_MS = {"Add": "QLinearAdd", "Mul": "QLinearMul", "AveragePool": "QLinearAveragePool",
               "GlobalAveragePool": "QLinearGlobalAveragePool", "Concat": "QLinearConcat",
               "Sigmoid": "QLinearSigmoid", "LeakyRelu": "QLinearLeakyRelu",
               "Softmax": "QLinearSoftmax", "Where": "QLinearWhere"}
# com.microsoft op -> (the float op whose shape inference gives its output shape, the float
# inputs' positions (None: every third from 2, QLinearConcat))
_STAND_IN = {"QLinearAdd": ("Add", (0, 3)), "QLinearMul": ("Mul", (0, 3)),
             "QGemm": ("Gemm", (0, 3)), "QLinearAveragePool": ("AveragePool", (0,)),
             "QLinearGlobalAveragePool": ("GlobalAveragePool", (0,)),
             "QLinearConcat": ("Concat", None), "QLinearSigmoid": ("Sigmoid", (0,)),
             "QLinearLeakyRelu": ("LeakyRelu", (0,)), "QLinearSoftmax": ("Softmax", (0,)),
             "QLinearWhere": ("Where", (0, 1, 4))}


# com.microsoft op -> position of its output zero point (whose type is the output's)
_OUT_ZP = {"QLinearAdd": 7, "QLinearMul": 7, "QGemm": 8, "QLinearAveragePool": 4,
           "QLinearGlobalAveragePool": 4, "QLinearConcat": 1, "QLinearSigmoid": 4,
           "QLinearLeakyRelu": 4, "QLinearSoftmax": 4, "QLinearWhere": 8}


def _stand_in_shape(node, known: dict):
    """Output (dims, elem type) of a com.microsoft node from its float stand-in, or None."""
    import onnx
    from onnx import helper
    op, pos = _STAND_IN[node.op_type]
    pos = range(2, len(node.input), 3) if pos is None else pos
    names = [node.input[i] for i in pos if i < len(node.input)]
    if len(names) != len(pos) or any(nm not in known for nm in names):
        return None
    if node.op_type == "QLinearGlobalAveragePool" and any(
            a.name == "channels_last" and a.i for a in node.attribute):
        dims, elem = known[names[0]]  # N, spatial..., C
        return [dims[0], *[1] * (len(dims) - 2), dims[-1]], elem
    ins = [helper.make_tensor_value_info(
        f"i{k}", onnx.TensorProto.BOOL if op == "Where" and k == 0 else onnx.TensorProto.FLOAT,
        known[nm][0]) for k, nm in enumerate(names)]
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute
             if a.name not in ("channels_last", "opset")}
    if any(a.name == "channels_last" and a.i for a in node.attribute):
        return None
    g = helper.make_graph([helper.make_node(op, [i.name for i in ins], ["y"], **attrs)], "s",
                          ins, [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)])
    try:
        inf = onnx.shape_inference.infer_shapes(
            helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)]), strict_mode=True)
    except Exception:  # noqa: BLE001
        return None
    t = inf.graph.output[0].type.tensor_type
    if not t.HasField("shape") or any(not d.HasField("dim_value") for d in t.shape.dim):
        return None
    elem = known[names[1 if op == "Where" else 0]][1]
    zp = _OUT_ZP.get(node.op_type)
    if zp is not None and zp < len(node.input) and node.input[zp] in known:
        elem = known[node.input[zp]][1]  # (fuse_qdq's Sigmoid, say, may change the type)
    if node.op_type == "QGemm" and (len(node.input) < 8 or not node.input[7]):
        elem = onnx.TensorProto.FLOAT  # no output quantization: float output
    return [d.dim_value for d in t.shape.dim], elem


def record_shapes(model):
    """Record the output shapes of com.microsoft quantized nodes (which onnx's shape inference
    does not know) in the model's value_info, in place, so that the importer finds them.
    Repeats onnx's inference while new shapes unlock others. Returns the model."""
    import onnx
    from onnx import helper
    g = model.graph
    ms = [n for n in g.node if n.domain == "com.microsoft" and n.op_type in _STAND_IN]
    if not ms:
        return model
    while True:
        try:
            inferred = onnx.shape_inference.infer_shapes(model)
        except Exception:  # noqa: BLE001
            return model
        known = {}
        for v in (*inferred.graph.input, *inferred.graph.value_info, *inferred.graph.output):
            t = v.type.tensor_type
            if t.HasField("shape") and all(d.HasField("dim_value") for d in t.shape.dim):
                known[v.name] = ([d.dim_value for d in t.shape.dim], t.elem_type)
        for i in g.initializer:
            known[i.name] = (list(i.dims), i.data_type)
        added = False
        for n in ms:
            if n.output[0] in known:
                continue
            r = _stand_in_shape(n, known)
            if r is not None:
                g.value_info.append(helper.make_tensor_value_info(n.output[0], r[1], r[0]))
                known[n.output[0]] = r
                added = True
        if not added:
            return model


# doc_string of a QLinearAveragePool / QLinearSoftmax fused from int8 QDQ whose output
# onnxruntime's x86 / x64 builds run as uint8 (see fuse_qdq)
ORT_S8_TO_U8 = "mcuforge: onnxruntime runs this int8 QDQ node on uint8 (zero points + 128)"


def _ort_s8_to_u8(q, readers: dict, outputs: set, values: dict) -> bool:
    """Whether onnxruntime's QDQS8ToU8Transformer turns the int8 QuantizeLinear q and the one
    DequantizeLinear reading it into uint8 (zero points + 128): q's output has that single
    reader and is no graph output, both zero points are given, constant, scalar, int8, equal."""
    r = readers.get(q.output[0], [])
    if q.output[0] in outputs or len(r) != 1 or r[0].op_type != "DequantizeLinear" \
            or r[0].domain not in ("", "ai.onnx"):
        return False
    zs = [n.input[2] if len(n.input) == 3 else "" for n in (q, r[0])]
    vals = [values.get(z) for z in zs]
    return all(v is not None and v.dtype == np.int8 and v.size == 1 for v in vals) \
        and int(vals[0].reshape(-1)[0]) == int(vals[1].reshape(-1)[0])


# scale operands of the quantized ops (positions; QLinearConcat: also every third from 3)
_SCALES = {"QLinearConv": (1, 4, 6), "QLinearMatMul": (1, 4, 6), "QGemm": (1, 4, 7),
           "QLinearAdd": (1, 4, 6), "QLinearMul": (1, 4, 6), "QLinearAveragePool": (1, 3),
           "QLinearGlobalAveragePool": (1, 3), "QLinearSigmoid": (1, 3),
           "QLinearLeakyRelu": (1, 3), "QLinearSoftmax": (1, 3), "QLinearWhere": (2, 5, 7),
           "QLinearConcat": (0,), "QuantizeLinear": (1,),
           "DequantizeLinear": (1,)}


def _float32_compute(node) -> bool:
    """Whether the op computes with its scales in float32 whatever their type: the QLinear*
    ops (integer in and out; scales are only read), a QuantizeLinear whose precision is float
    and a DequantizeLinear whose output_dtype is float (opset 23+). Otherwise a float16 scale
    means float16 arithmetic (QuantizeLinear divides in the scale's type, DequantizeLinear's
    output has it), which mcuforge does not compute: those keep their float16 scales and stay
    unsupported."""
    import onnx
    if node.op_type not in ("QuantizeLinear", "DequantizeLinear"):
        return True
    attr = "precision" if node.op_type == "QuantizeLinear" else "output_dtype"
    return any(a.name == attr and a.i == onnx.TensorProto.FLOAT for a in node.attribute)


def float32_scales(m):
    """Float16 scale operands of the quantized ops (QLinear*, QGemm, and Quantize /
    DequantizeLinear when they compute in float32: see _float32_compute) read as float32, in
    place: a float16 initializer becomes a float32 one next to it (exact: every float16 is a
    float32), any other float16 scale (a graph input, a computed value) goes through a Cast
    to float32 inserted before the op (the importer folds it once the scale is known, and
    refuses a run-time scale as it refuses a float32 one). Float16 values read by other ops
    are left as they are. Returns the model."""
    import onnx
    import onnx.numpy_helper
    from onnx import helper
    g = m.graph
    f16 = onnx.TensorProto.FLOAT16
    inits = {i.name: i for i in g.initializer}
    typed = {v.name: v.type.tensor_type.elem_type for v in (*g.input, *g.value_info)}
    typed.update({n: i.data_type for n, i in inits.items()})
    names = set(inits) | set(typed) | {o for n in g.node for o in n.output} | \
        {o.name for o in g.output}
    made, nodes = {}, []

    def fresh(base):
        name, k = f"{base}_f32", 1
        while name in names:
            name, k = f"{base}_f32_{k}", k + 1
        names.add(name)
        return name

    for n in g.node:
        pos = _SCALES.get(n.op_type) if n.domain in ("", "ai.onnx", "com.microsoft") else None
        if pos is not None and n.op_type == "QLinearConcat":
            pos = (0, *range(3, len(n.input), 3))
        if pos is None or not _float32_compute(n):
            nodes.append(n)
            continue
        for i in pos:
            s = n.input[i] if i < len(n.input) else ""
            if not s or typed.get(s) != f16:
                continue
            if s not in made:
                made[s] = fresh(s)
                if s in inits:
                    v = onnx.numpy_helper.to_array(inits[s]).astype("float32")
                    g.initializer.append(onnx.numpy_helper.from_array(v, made[s]))
                else:
                    nodes.append(helper.make_node("Cast", [s], [made[s]],
                                                  to=onnx.TensorProto.FLOAT))
            n.input[i] = made[s]
        nodes.append(n)
    if made:
        del g.node[:]
        g.node.extend(nodes)
    return m


def standard_qdq(m) -> None:
    """com.microsoft QuantizeLinear / DequantizeLinear on 8-bit types (quantize_static's
    UseQDQContribOps) are the standard ops, as onnxruntime's QDQ selectors treat them: move them
    to the default domain, in place, so that they fuse and fold like those (others, int16 say,
    stay; frontend/onnx.py folds them too)."""
    from onnx import TensorProto as P
    types = {i.name: i.data_type for i in m.graph.initializer}
    types.update({v.name: v.type.tensor_type.elem_type for v in m.graph.input})
    for n in m.graph.node:
        if n.domain != "com.microsoft" or n.op_type not in ("QuantizeLinear", "DequantizeLinear"):
            continue
        zp = n.input[2] if len(n.input) > 2 and n.input[2] else None
        if zp is not None:
            t = types.get(zp)
        elif n.op_type == "QuantizeLinear":
            t = P.UINT8  # the default output type
        else:
            t = types.get(n.input[0])
        if t in (P.INT8, P.UINT8) or (t == P.INT32 and n.op_type == "DequantizeLinear"):
            n.domain = ""


def fuse_qdq(model, s8_to_u8: bool = True):
    """Rewrite DequantizeLinear(x), DequantizeLinear(constant weights)[, DequantizeLinear(
    constant int32 bias)] -> Conv | MatMul | Gemm -> QuantizeLinear into QLinearConv |
    QLinearMatMul | QGemm (com.microsoft) reading the quantized tensors directly (MatMul's
    right operand may be an activation too, as quantize_static writes attention-like models:
    onnxruntime fuses that into QLinearMatMul as well), and
    DequantizeLinear'd activations -> Add | Mul | AveragePool | GlobalAveragePool | Concat |
    Sigmoid | LeakyRelu | Softmax | Where -> QuantizeLinear into the com.microsoft QLinear*
    ops, as onnxruntime's QDQ fusion does (Where: its condition stays as it is; QLinearSoftmax
    gets the attributes opset, the model's, and axis, the Softmax's or its opset's default).
    Softmax is fused only where onnxruntime fuses it (the same (u)int8 type in and out after
    the s8_to_u8 conversion below), since its float path computes otherwise. Sigmoid, LeakyRelu
    and Where are fused whenever the pattern is per tensor: onnxruntime's float path
    (DequantizeLinear, MLAS's logistic / the float op, MlasQuantizeLinear) computes exactly
    its lookup tables, so the fused op is exact where onnxruntime does not fuse (mixed types,
    say) too.

    s8_to_u8 (default) mirrors onnxruntime's x86 / x64 builds, where QDQIsInt8Allowed() is
    false: QDQS8ToU8Transformer first runs int8 Q -> DQ pairs as uint8 with zero points + 128.
    Only QLinearAveragePool's float path sees the difference (it adds the zero point in float
    before rounding), and QLinearSoftmax where its arithmetic overflows, so such fused pools and
    softmaxes get the doc_string ORT_S8_TO_U8, which the converters read. With s8_to_u8=False
    (onnxruntime's ARM builds) they stay int8.

    Patterns whose Dequantize / QuantizeLinear compute in float16 (float16 scales) are not
    fused. Float16 scales of the quantized ops are then read as float32 (float32_scales).

    Guarantees: the model's inputs, outputs and the fused QuantizeLinear's output name are
    kept; DequantizeLinear nodes nothing reads any more are removed; a pattern whose float op
    output is read by anything but one QuantizeLinear (or is a graph output) is left as it is.
    Idempotent. Returns a new ModelProto."""
    import onnx
    import onnx.numpy_helper
    from onnx import helper
    m = onnx.ModelProto()
    m.CopyFrom(model)
    standard_qdq(m)
    g = m.graph
    inits = {i.name for i in g.initializer}
    outputs = {o.name for o in g.output}
    prod = {o: n for n in g.node for o in n.output}
    readers = {}
    for n in g.node:
        for i in n.input:
            readers.setdefault(i, []).append(n)
    def dq(name, const):
        n = prod.get(name)
        if n is None or n.op_type != "DequantizeLinear" or n.domain not in ("", "ai.onnx"):
            return None
        if (n.input[0] in inits) != const:
            return None
        return n

    sizes = {i.name: int(np.prod(i.dims)) for i in g.initializer}

    values = {i.name: onnx.numpy_helper.to_array(i) for i in g.initializer
              if int(np.prod(i.dims)) == 1}

    def qv(node):  # (scale, zero point, zero point dtype) of a per-tensor Q/DQ, or None
        s = values.get(node.input[1])
        z = values.get(node.input[2]) if len(node.input) > 2 and node.input[2] else \
            np.zeros(1, np.uint8)
        return None if s is None or z is None else (float(s.reshape(-1)[0]),
                                                    int(z.reshape(-1)[0]), z.dtype)

    def per_tensor(d):  # a Dequantize/QuantizeLinear with one constant scale
        return d is not None and sizes.get(d.input[1]) == 1

    elem = {v.name: v.type.tensor_type.elem_type for v in (*g.input, *g.value_info)}
    elem.update({i.name: i.data_type for i in g.initializer})

    def in_float32(*ds):  # Dequantize/QuantizeLinear computing in float32 (float16 scales:
        # float16 arithmetic, unless _float32_compute; such patterns are not fused)
        return all(elem.get(d.input[1], onnx.TensorProto.FLOAT) == onnx.TensorProto.FLOAT
                   or _float32_compute(d) for d in ds)

    opset = max((o.version for o in m.opset_import if o.domain in ("", "ai.onnx")), default=1)

    def qtype(d):  # the (u)int8 type of a Q's output / DQ's input, from its zero point
        z = values.get(d.input[2]) if len(d.input) > 2 and d.input[2] else None
        return None if z is None else z.dtype

    def ort_fuses_softmax(d, q):  # onnxruntime's UnarySelector on DQ -> Softmax -> Q: the
        # same type in and out, after QDQS8ToU8Transformer (x86) when s8_to_u8
        t = qtype(d)
        if t is None or t != qtype(q) or t not in (np.int8, np.uint8):
            return False
        if s8_to_u8 and t == np.int8:
            src = prod.get(d.input[0])
            conv_in = src is not None and src.op_type == "QuantizeLinear" and \
                _ort_s8_to_u8(src, readers, outputs, values)
            return conv_in == _ort_s8_to_u8(q, readers, outputs, values)
        return True

    replace, drop = {}, set()
    for n in g.node:
        if n.domain not in ("", "ai.onnx") or not n.output:
            continue
        y = n.output[0]
        q = readers.get(y, [])
        if y in outputs or len(q) != 1 or q[0].op_type != "QuantizeLinear" or len(n.output) > 1:
            continue
        q = q[0]
        attrs = {a.name: helper.get_attribute_value(a) for a in n.attribute}
        zp = lambda d: d.input[2] if len(d.input) > 2 else ""
        qy = [q.input[1], q.input[2] if len(q.input) > 2 else ""]
        if n.op_type == "MaxPool" and len(n.output) == 1:  # on the quantized values
            d = prod.get(n.input[0])
            if d is not None and d.op_type == "DequantizeLinear" and per_tensor(d) \
                    and qv(d) is not None and qv(d) == qv(q):
                replace[id(n)] = helper.make_node("MaxPool", [d.input[0]], [q.output[0]],
                                                  n.name, **attrs)
                drop.add(id(q))
            continue
        if n.op_type in _QLINEAR_MS:  # activations only: com.microsoft QLinear*
            values_in = n.input[1:] if n.op_type == "Where" else n.input
            if n.op_type == "Where" and len(n.input) != 3:
                continue
            ds = [prod.get(i) for i in values_in]
            if not n.input or any(d is None or d.op_type != "DequantizeLinear"
                                  or d.domain not in ("", "ai.onnx") or not per_tensor(d)
                                  for d in ds) or not per_tensor(q) or not in_float32(q, *ds):
                continue
            if n.op_type in ("Sigmoid", "LeakyRelu", "Softmax", "Where") and any(
                    qtype(d) not in (np.int8, np.uint8) for d in (*ds, q)):
                continue  # (u)int8 with their zero points given (int16: left in float)
            if n.op_type == "Softmax":
                if not ort_fuses_softmax(ds[0], q):
                    continue
                attrs = {"axis": attrs.get("axis", 1 if opset < 13 else -1), "opset": opset}
            if n.op_type in ("AveragePool", "GlobalAveragePool") and ds[0].input[0] in inits:
                continue
            if n.op_type == "AveragePool" and any(v != 1 for v in attrs.pop("dilations", [])):
                continue  # QLinearAveragePool has no dilations
            qs = [[d.input[0], d.input[1], zp(d)] for d in ds]
            if n.op_type == "Concat":
                ins = qy + [v for t in qs for v in t]
            elif n.op_type in ("Add", "Mul"):
                if len(qs) != 2:
                    continue
                ins = qs[0] + qs[1] + qy
            elif n.op_type == "Where":
                ins = [n.input[0]] + qs[0] + qs[1] + qy
            else:
                ins = qs[0] + qy
            new = helper.make_node(_QLINEAR_MS[n.op_type], ins, [q.output[0]], n.name,
                                   domain="com.microsoft", **attrs)
            if n.op_type in ("AveragePool", "Softmax") and s8_to_u8 and \
                    _ort_s8_to_u8(q, readers, outputs, values):
                new.doc_string = ORT_S8_TO_U8
            replace[id(n)] = new
            drop.add(id(q))
            continue
        if n.op_type not in _QLINEAR or len(n.input) < 2:
            continue
        x, w = dq(n.input[0], False), dq(n.input[1], True)
        if w is None and n.op_type == "MatMul":  # two activations (attention-like models)
            w = dq(n.input[1], False)
        b = dq(n.input[2], True) if len(n.input) > 2 and n.input[2] else None
        if x is None or w is None or (len(n.input) > 2 and n.input[2] and b is None) \
                or not in_float32(x, w, q):
            continue
        if n.op_type == "Gemm":
            if attrs.get("transA", 0) or attrs.get("alpha", 1.0) != 1.0 \
                    or attrs.get("beta", 1.0) != 1.0:
                continue
        qx = [x.input[0], x.input[1], zp(x)]
        qw = [w.input[0], w.input[1], zp(w)]
        bias = [b.input[0]] if b is not None else []
        if n.op_type == "Conv":
            new = helper.make_node("QLinearConv", qx + qw + qy + bias, [q.output[0]],
                                   n.name, **attrs)
        elif n.op_type == "MatMul":
            new = helper.make_node("QLinearMatMul", qx + qw + qy, [q.output[0]], n.name)
        else:
            new = helper.make_node("QGemm", qx + qw + (bias or [""]) + qy, [q.output[0]],
                                   n.name, domain="com.microsoft", **attrs)
        replace[id(n)] = new
        drop.add(id(q))
    if not replace:
        return record_shapes(float32_scales(m))
    nodes = [replace.get(id(n), n) for n in g.node if id(n) not in drop]
    while True:  # DequantizeLinear nodes left unread
        read = {i for n in nodes for i in n.input} | outputs
        kept = [n for n in nodes if n.op_type != "DequantizeLinear" or n.output[0] in read]
        if len(kept) == len(nodes):
            break
        nodes = kept
    del g.node[:]
    g.node.extend(nodes)
    if any(n.domain == "com.microsoft" for n in nodes) and not any(
            o.domain == "com.microsoft" for o in m.opset_import):
        m.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    return record_shapes(float32_scales(m))
