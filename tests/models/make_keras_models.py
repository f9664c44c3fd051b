"""Regenerate: python3 -m venv /tmp/kerasenv && /tmp/kerasenv/bin/pip install
tensorflow-cpu==2.21.0 tf-keras==2.21.0 tf2onnx==1.17.0 onnxruntime
&& /tmp/kerasenv/bin/python tests/models/make_keras_models.py   (writes tests/models/keras*.onnx)

A small Keras CNN with a fixed seed, converted to ONNX (opset 17) by tf2onnx's from_keras:
Conv2D + BatchNorm + ReLU, DepthwiseConv2D + BatchNorm + ReLU6, a 1x1 Conv2D + BatchNorm, a
residual Add, ReLU, a Conv2D with bias + BatchNorm + ReLU, global average pooling and Dense. The
input is NHWC, as Keras has it: tf2onnx puts one Transpose to NCHW at the input and mcuforge has
to cancel it against its own NCHW -> NHWC.

Two files from the same network and weights:
  keras_small_cnn.onnx   Keras 3 (TensorFlow 2.21's default Keras). tf2onnx folds only some
                         BatchNorms into the Conv before them; the others arrive as a Mul and an
                         Add by per-channel constants, for mcuforge to fold.
  keras2_small_cnn.onnx  tf-keras (Keras 2): tf2onnx folds every BatchNorm into its Conv.
Each is made in its own process (TF_USE_LEGACY_KERAS must be set before TensorFlow loads).
Every BatchNormalization gets non-trivial gamma, beta, moving mean and moving variance, every
bias a non-zero value.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

OUT = Path(__file__).resolve().parent
OPSET = 17
SIZE = 32
SEED = 7
VARIANTS = {"keras_small_cnn": "0", "keras2_small_cnn": "1"}  # stem -> TF_USE_LEGACY_KERAS


def small_cnn(keras):
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


def randomize(keras, model, rng) -> None:
    """Non-zero biases (Keras starts them at 0) and non-trivial BatchNorm statistics."""
    import numpy as np
    for layer in model.layers:
        if getattr(layer, "use_bias", False) and getattr(layer, "bias", None) is not None:
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


def _canonical_names(proto) -> None:
    """tf2onnx numbers the constants it folds in an order that changes from run to run: name
    them by first use instead, initializers sorted by name, so the file is byte-identical."""
    inits = {i.name for i in proto.graph.initializer}
    order = []
    for node in proto.graph.node:
        order += [t for t in node.input if t in inits and t.startswith("const_") and t not in order]
    rename = {old: f"const_{k}" for k, old in enumerate(order)}
    for node in proto.graph.node:
        node.input[:] = [rename.get(t, t) for t in node.input]
    for init in proto.graph.initializer:
        init.name = rename.get(init.name, init.name)
    ordered = sorted(proto.graph.initializer, key=lambda i: i.name)
    copies = [type(i)() for i in ordered]
    for c, i in zip(copies, ordered):
        c.CopyFrom(i)
    del proto.graph.initializer[:]
    proto.graph.initializer.extend(copies)


def export(stem: str) -> Path:
    """Build, convert and check one variant; TF_USE_LEGACY_KERAS is already set."""
    import numpy as np
    import onnx
    import tensorflow as tf
    import tf2onnx
    if os.environ["TF_USE_LEGACY_KERAS"] == "1":
        import tf_keras as keras
    else:
        import keras
    keras.utils.set_random_seed(SEED)
    model = small_cnn(keras)
    randomize(keras, model, np.random.default_rng(SEED + 100))
    path = OUT / f"{stem}.onnx"
    spec = (tf.TensorSpec((1, SIZE, SIZE, 3), tf.float32, name="input"),)
    proto, _ = tf2onnx.convert.from_keras(model, input_signature=spec, opset=OPSET)
    proto.producer_version = ""  # no tool versions in the file
    _canonical_names(proto)
    onnx.checker.check_model(proto, full_check=True)
    onnx.save(proto, str(path))
    x = np.random.default_rng(SEED + 200).standard_normal((1, SIZE, SIZE, 3)).astype(np.float32)
    ref = np.asarray(model(x, training=False))
    import onnxruntime as ort
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    got = sess.run(None, {sess.get_inputs()[0].name: x})[0]
    assert np.allclose(got, ref, rtol=1e-4, atol=1e-5), np.abs(got - ref).max()
    size = path.stat().st_size
    assert size < 200_000, f"{path.name}: {size} bytes"
    ops = [n.op_type for n in proto.graph.node]
    dims = [d.dim_value or d.dim_param for d in proto.graph.input[0].type.tensor_type.shape.dim]
    print(f"{path.name}: {size} bytes, Keras {keras.__version__}, opset {OPSET}, input {dims}, "
          f"ops {' '.join(ops)}", flush=True)
    return path


def main(argv) -> None:
    if os.environ.get("MAKE_KERAS_CHILD"):
        export(argv[0])
        return
    for stem in argv or list(VARIANTS):
        env = {**os.environ, "MAKE_KERAS_CHILD": "1", "TF_USE_LEGACY_KERAS": VARIANTS[stem],
               "TF_CPP_MIN_LOG_LEVEL": "2",
               "PYTHONHASHSEED": "0"}  # tf2onnx names constants in set order
        subprocess.run([sys.executable, __file__, stem], env=env, check=True)


if __name__ == "__main__":
    main(sys.argv[1:])
