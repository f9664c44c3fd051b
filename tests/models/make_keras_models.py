"""Regenerate: python3 -m venv /tmp/kerasenv && /tmp/kerasenv/bin/pip install tensorflow-cpu==2.21.0
tf-keras==2.21.0 tf2onnx==1.17.0 onnxruntime && /tmp/kerasenv/bin/python tests/models/make_keras_models.py
(writes tests/models/keras_*.onnx)

A small Keras CNN with a fixed seed, converted to ONNX (opset 17) by tf2onnx: Conv2D + BatchNorm +
ReLU, DepthwiseConv2D + BatchNorm + ReLU, a 1x1 Conv2D + BatchNorm, a residual Add, ReLU, global
average pooling and Dense. The input is NHWC, as Keras has it, so tf2onnx wraps every ONNX Conv
(NCHW) in transposes and mcuforge has to cancel them.

tf2onnx's from_keras does not take Keras 3 models, so the model is built with tf-keras (Keras 2,
TF_USE_LEGACY_KERAS=1). Every BatchNormalization gets non-trivial gamma, beta, moving mean and
moving variance.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import onnx  # noqa: E402
import tensorflow as tf  # noqa: E402
import tf2onnx  # noqa: E402
import tf_keras as keras  # noqa: E402

OUT = Path(__file__).resolve().parent
OPSET = 17
SIZE = 32


def small_cnn() -> keras.Model:
    L = keras.layers
    x_in = keras.Input((SIZE, SIZE, 3), batch_size=1, name="input")
    x = L.Conv2D(16, 3, strides=2, padding="same", use_bias=False, name="stem")(x_in)
    x = L.BatchNormalization(name="stem_bn")(x)
    x = L.ReLU(name="stem_relu")(x)
    y = L.DepthwiseConv2D(3, padding="same", use_bias=False, name="dw")(x)
    y = L.BatchNormalization(name="dw_bn")(y)
    y = L.ReLU(6.0, name="dw_relu6")(y)
    y = L.Conv2D(16, 1, use_bias=False, name="pw")(y)
    y = L.BatchNormalization(name="pw_bn")(y)
    x = L.Add(name="add")([x, y])
    x = L.ReLU(name="add_relu")(x)
    x = L.Conv2D(24, 3, strides=2, padding="same", name="conv2")(x)
    x = L.BatchNormalization(name="conv2_bn")(x)
    x = L.Activation("relu", name="conv2_relu")(x)
    x = L.GlobalAveragePooling2D(name="pool")(x)
    x = L.Dense(10, name="logits")(x)
    return keras.Model(x_in, x, name="keras_small_cnn")


def randomize(model: keras.Model, rng: np.random.Generator) -> None:
    """Non-zero biases (Keras starts them at 0) and non-trivial BatchNorm statistics."""
    for layer in model.layers:
        if getattr(layer, "use_bias", False) and hasattr(layer, "bias"):
            kernel, bias = layer.get_weights()
            layer.set_weights([kernel, (rng.standard_normal(bias.shape) * 0.5)
                               .astype(np.float32)])
        if isinstance(layer, keras.layers.BatchNormalization):
            c = layer.gamma.shape[0]
            layer.set_weights([
                (rng.random(c) * 1.5 + 0.5).astype(np.float32),   # gamma
                (rng.standard_normal(c) * 0.5).astype(np.float32),  # beta
                (rng.standard_normal(c) * 0.5).astype(np.float32),  # moving mean
                (rng.random(c) * 2.0 + 0.25).astype(np.float32),   # moving variance
            ])


def export(stem: str, seed: int) -> Path:
    keras.utils.set_random_seed(seed)
    model = small_cnn()
    randomize(model, np.random.default_rng(seed + 100))
    path = OUT / f"{stem}.onnx"
    spec = (tf.TensorSpec((1, SIZE, SIZE, 3), tf.float32, name="input"),)
    proto, _ = tf2onnx.convert.from_keras(model, input_signature=spec, opset=OPSET)
    proto.producer_version = ""  # no tool versions in the file
    onnx.checker.check_model(proto, full_check=True)
    onnx.save(proto, str(path))
    x = np.random.default_rng(seed + 200).standard_normal((1, SIZE, SIZE, 3)).astype(np.float32)
    ref = model(x, training=False).numpy()
    import onnxruntime as ort
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    got = sess.run(None, {sess.get_inputs()[0].name: x})[0]
    assert np.allclose(got, ref, rtol=1e-4, atol=1e-5), np.abs(got - ref).max()
    size = path.stat().st_size
    assert size < 200_000, f"{path.name}: {size} bytes"
    ops = [n.op_type for n in proto.graph.node]
    print(f"{path.name}: {size} bytes, opset {OPSET}, input "
          f"{[d.dim_value or d.dim_param for d in proto.graph.input[0].type.tensor_type.shape.dim]}"
          f", ops {' '.join(ops)}")
    return path


if __name__ == "__main__":
    for stem in sys.argv[1:] or ["keras_small_cnn"]:
        export(stem, 7)
