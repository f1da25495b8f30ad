"""torchvision's ResNet-50 (v1.5: the stride on each bottleneck's 3x3) as an ONNX graph written
with onnx.helper, random weights and BatchNorm statistics folded into them: the same convolutions, shapes and
epilogues as `benchmarks/export_case.py resnet50:B` exports through torch, for planning and
predicting on a machine without torch (the node names differ).

    python3 benchmarks/resnet50_graph.py 32 /tmp/r50/r50_b32.onnx
    python3 benchmarks/resnet50_graph.py 32 /tmp/r50/s4.onnx 4 [first]    # one bottleneck of stage 4
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.onnx_graph import GraphBuilder  # noqa: E402

STAGES = ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2))   # (width, blocks, stride of the first)
EXPANSION = 4


class _Builder(GraphBuilder):
    def __init__(self, seed: int) -> None:
        super().__init__()
        self.rng = np.random.default_rng(seed)

    def conv_bn(self, x: str, cin: int, cout: int, k: int, stride: int, relu: bool) -> str:
        """A convolution with its BatchNorm folded into weights and bias, as torch's export of a module in
        eval mode writes it (so the epilogues match that model's: bias, then ReLU or the residual add)."""
        rng = self.rng
        w = rng.standard_normal((cout, cin, k, k)) * np.sqrt(2.0 / (cin * k * k))
        scale, shift, mean, var = (1 + 0.1 * rng.standard_normal(cout), 0.1 * rng.standard_normal(cout),
                                   0.1 * rng.standard_normal(cout), rng.uniform(0.5, 1.5, cout))
        g = scale / np.sqrt(var + 1e-5)
        y = self.node("Conv", [x, self.const((w * g[:, None, None, None]).astype(np.float32)),
                               self.const((shift - mean * g).astype(np.float32))],
                      kernel_shape=[k, k], strides=[stride] * 2, pads=[k // 2] * 4)
        return self.node("Relu", [y]) if relu else y

    def bottleneck(self, x: str, cin: int, width: int, stride: int) -> str:
        y = self.conv_bn(x, cin, width, 1, 1, True)
        y = self.conv_bn(y, width, width, 3, stride, True)
        y = self.conv_bn(y, width, width * EXPANSION, 1, 1, False)
        short = self.conv_bn(x, cin, width * EXPANSION, 1, stride, False) if stride > 1 or cin != width * EXPANSION else x
        return self.node("Relu", [self.node("Add", [y, short])])

    def model(self, name: str, x: tuple[int, ...], y: tuple[int, ...]) -> onnx.ModelProto:
        self.nodes[-1].output[0] = "y"
        graph = helper.make_graph(self.nodes, name, [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x))],
                                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(y))], self.inits)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
        onnx.checker.check_model(model)
        return model


def resnet50(batch: int, seed: int = 0, classes: int = 1000) -> onnx.ModelProto:
    g = _Builder(seed)
    x = g.conv_bn("x", 3, 64, 7, 2, True)
    x = g.node("MaxPool", [x], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    cin = 64
    for width, blocks, stride in STAGES:
        for b in range(blocks):
            x = g.bottleneck(x, cin, width, stride if b == 0 else 1)
            cin = width * EXPANSION
    x = g.node("Flatten", [g.node("GlobalAveragePool", [x])], axis=1)
    fc = (g.rng.standard_normal((classes, cin)) / np.sqrt(cin)).astype(np.float32)
    g.node("Gemm", [x, g.const(fc), g.const(np.zeros(classes, np.float32))], transB=1)
    return g.model("resnet50", (batch, 3, 224, 224), (batch, classes))


def bottleneck(batch: int, cin: int, width: int, hw: int, stride: int = 1, seed: int = 0) -> onnx.ModelProto:
    """One bottleneck of ResNet-50 alone (`stage_block`): its convolutions' shapes, though not always the
    whole model's kernels: with an NCHW input and output of its own, the layout pass may keep a 1x1
    convolution NCHW (an `mma` GEMM) where the whole model runs it channels-last on `wgmma`."""
    g = _Builder(seed)
    g.bottleneck("x", cin, width, stride)
    return g.model("bottleneck", (batch, cin, hw, hw), (batch, width * EXPANSION, hw // stride, hw // stride))


def stage_block(batch: int, stage: int, first: bool = False) -> onnx.ModelProto:
    """Stage `stage`'s (1-4) first or identity bottleneck of ResNet-50 at 224x224 input."""
    width, _, stride = STAGES[stage - 1]
    hw = 56 // 2 ** (stage - 1)
    if first:
        return bottleneck(batch, width * 2 if stage > 1 else 64, width, hw * stride, stride)
    return bottleneck(batch, width * EXPANSION, width, hw)


if __name__ == "__main__":
    batch, path = int(sys.argv[1]), Path(sys.argv[2])
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(resnet50(batch) if len(sys.argv) < 4 else stage_block(batch, int(sys.argv[3]), sys.argv[4:] == ["first"]),
              path)
    print(f"{path} written")
