"""Regenerate: python3 -m venv /tmp/torchenv && /tmp/torchenv/bin/pip install torch==2.13.0 onnx
onnxscript onnxruntime numpy && /tmp/torchenv/bin/python tests/models/make_onnx_models.py
(writes tests/models/torch_*.onnx; onnxruntime, if present, checks each export against torch)

Small float CNNs defined in PyTorch with fixed seeds, exported to ONNX (opset 17) by
torch.onnx's TorchScript exporter (dynamo=False), and one (opset 18) by the newer torch.export
based exporter (dynamo=True, torch's default, needs onnxscript). They are the test models of
tests/test_onnx_models.py, which needs neither torch nor this script.

The exporter's default inference mode (training=EVAL) folds each BatchNorm into the Conv before
it, so mcuforge would never see a BatchNormalization node. The models are exported with
training=PRESERVE instead, from modules in eval mode: the BatchNormalization nodes stay in the
file (training_mode=0, running statistics as initializers) and mcuforge's own BN folding has to
do the work. One model (torch_resblock_evalfold.onnx) is exported with the defaults, as a user
calling torch.onnx.export(..., dynamo=False) gets it; the dynamo exporter folds BatchNorm too
and writes AdaptiveAvgPool2d as ReduceMean(keepdims=1) + Reshape (torch_resblock_dynamo.onnx).

Every BatchNorm gets non-trivial weight, bias, running mean and running variance, so a wrong
fold shows up as a large error.
"""
from __future__ import annotations

import sys
import warnings
from pathlib import Path

import numpy as np
import onnx
import torch
from torch import nn

OUT = Path(__file__).resolve().parent
OPSET = 17
SIZE = 32  # input 1x3xSIZExSIZE


def randomize_bn(model: nn.Module, gen: torch.Generator) -> None:
    """Non-trivial affine parameters and running statistics for every BatchNorm2d."""
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            c = m.num_features
            with torch.no_grad():
                m.weight.copy_(torch.rand(c, generator=gen) * 1.5 + 0.5)
                m.bias.copy_(torch.randn(c, generator=gen) * 0.5)
                m.running_mean.copy_(torch.randn(c, generator=gen) * 0.5)
                m.running_var.copy_(torch.rand(c, generator=gen) * 2.0 + 0.25)


class ConvBnRelu(nn.Module):
    """(a) Conv -> BN -> ReLU -> Conv -> BN -> ReLU -> AdaptiveAvgPool -> Flatten -> Linear."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(8)
        self.conv2 = nn.Conv2d(8, 16, 3, stride=2, padding=1)
        self.bn2 = nn.BatchNorm2d(16)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(16, 10)

    def forward(self, x):
        x = torch.relu(self.bn1(self.conv1(x)))
        x = torch.relu(self.bn2(self.conv2(x)))
        return self.fc(torch.flatten(self.pool(x), 1))


class MobileBlock(nn.Module):
    """(b) stem Conv+BN+ReLU, then a MobileNet-like block: depthwise Conv (groups=C) + BN +
    ReLU6 + pointwise Conv + BN, residual add, ReLU; global pool and a Gemm head."""

    def __init__(self, c: int = 16):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, c, 3, stride=2, padding=1, bias=False),
                                  nn.BatchNorm2d(c), nn.ReLU())
        self.dw = nn.Conv2d(c, c, 3, padding=1, groups=c, bias=False)
        self.bn_dw = nn.BatchNorm2d(c)
        self.pw = nn.Conv2d(c, c, 1, bias=False)
        self.bn_pw = nn.BatchNorm2d(c)
        self.fc = nn.Linear(c, 10)

    def forward(self, x):
        x = self.stem(x)
        y = nn.functional.relu6(self.bn_dw(self.dw(x)))
        y = self.bn_pw(self.pw(y))
        x = torch.relu(x + y)
        return self.fc(x.mean(dim=(2, 3)))


class BasicBlock(nn.Module):
    """ResNet basic block with a strided 1x1 projection shortcut."""

    def __init__(self, cin: int, cout: int, stride: int = 2):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.short = nn.Sequential(nn.Conv2d(cin, cout, 1, stride=stride, bias=False),
                                   nn.BatchNorm2d(cout))

    def forward(self, x):
        y = torch.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        return torch.relu(y + self.short(x))


class ResBlock(nn.Module):
    """(c) stem Conv+BN+ReLU, a basic block 16 -> 32 with stride 2, pool, Linear."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1, bias=False),
                                  nn.BatchNorm2d(16), nn.ReLU())
        self.block = BasicBlock(16, 32, stride=2)
        self.pool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(32, 10)

    def forward(self, x):
        x = self.block(self.stem(x))
        return self.fc(torch.flatten(self.pool(x), 1))


class LeNet(nn.Module):
    """(d) Conv+BN+ReLU+MaxPool twice, then Flatten of the 16x5x5 NCHW map into a Linear
    (the flatten's element order is NCHW's: mcuforge permutes the Linear's weights instead of
    transposing the NHWC map), ReLU, Linear."""

    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 8, 5), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(8, 16, 5), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2))
        self.head = nn.Sequential(nn.Flatten(), nn.Linear(16 * 5 * 5, 32), nn.ReLU(),
                                  nn.Linear(32, 10))

    def forward(self, x):
        return self.head(self.features(x))


MODELS = {  # file stem -> (module class, seed, exporter: keep BatchNormalization nodes?)
    "torch_conv_bn_relu": (ConvBnRelu, 1, "preserve"),
    "torch_mobile_block": (MobileBlock, 2, "preserve"),
    "torch_resblock": (ResBlock, 3, "preserve"),
    "torch_resblock_evalfold": (ResBlock, 3, "eval"),
    "torch_resblock_dynamo": (ResBlock, 3, "dynamo"),
    "torch_lenet": (LeNet, 4, "preserve"),
}
DYNAMO_OPSET = 18


def _export(model, x, path: Path, how: str) -> None:
    if how == "dynamo":
        torch.onnx.export(model, (x,), str(path), dynamo=True, opset_version=DYNAMO_OPSET,
                          input_names=["input"], output_names=["logits"], external_data=False)
        return
    mode = torch.onnx.TrainingMode.PRESERVE if how == "preserve" else torch.onnx.TrainingMode.EVAL
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # constant folding in PRESERVE mode: model is in eval
        torch.onnx.export(model, (x,), str(path), dynamo=False, opset_version=OPSET,
                          input_names=["input"], output_names=["logits"], training=mode,
                          do_constant_folding=True)


def export(stem: str, cls, seed: int, how: str) -> Path:
    torch.manual_seed(seed)
    model = cls()
    randomize_bn(model, torch.Generator().manual_seed(seed + 100))
    model.eval()
    x = torch.randn(1, 3, SIZE, SIZE, generator=torch.Generator().manual_seed(seed + 200))
    path = OUT / f"{stem}.onnx"
    _export(model, x, path, how)
    m = onnx.load(str(path))
    m.producer_version = ""  # no tool versions, local paths or stack traces in the file
    del m.graph.metadata_props[:]
    for node in m.graph.node:
        del node.metadata_props[:]
    onnx.save(m, str(path))
    onnx.checker.check_model(m, full_check=True)
    ops = [n.op_type for n in m.graph.node]
    opset = max(o.version for o in m.opset_import if o.domain in ("", "ai.onnx"))
    assert ("BatchNormalization" in ops) == (how == "preserve"), ops
    # the export must compute what the module computes
    try:
        import onnxruntime as ort
    except ImportError:
        ort = None
    if ort is not None:
        sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        got = sess.run(None, {"input": x.numpy()})[0]
        with torch.no_grad():
            ref = model(x).numpy()
        assert np.allclose(got, ref, rtol=1e-4, atol=1e-5), np.abs(got - ref).max()
    size = path.stat().st_size
    assert size < 200_000, f"{path.name}: {size} bytes"
    print(f"{path.name}: {size} bytes, opset {opset}, ops {' '.join(ops)}")
    return path


def main(argv) -> None:
    names = argv or list(MODELS)
    for stem in names:
        export(stem, *MODELS[stem])


if __name__ == "__main__":
    main(sys.argv[1:])
