"""torchvision's MobileNetV2 as an ONNX graph written with onnx.helper, random weights and BatchNorm
folded into them: the same convolutions (1x1 expansions and projections, 3x3 depthwise), ReLU6 as
Clip(0, 6) and residual adds as `benchmarks/export_case.py mobilenet_v2:B` exports through torch, for
planning and predicting on a machine without torch (the node names differ; torch's export also
has a Dropout, which is the identity in eval mode and left out here).

    python3 benchmarks/mobilenet_v2_graph.py 32 /tmp/mb/mb_b32.onnx
    python3 benchmarks/mobilenet_v2_graph.py 32 /tmp/mb/b1.onnx 1      # block 1 alone (16 -> 24, 112x112)
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.resnet50_graph import _Builder  # noqa: E402

# (expansion t, channels c, blocks n, stride of the first s), torchvision's inverted_residual_setting
SETTING = ((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1), (6, 160, 3, 2), (6, 320, 1, 1))


class _MobileBuilder(_Builder):
    def conv_bn6(self, x: str, cin: int, cout: int, k: int, stride: int, relu6: bool, group: int = 1) -> str:
        """A convolution with its BatchNorm folded in, then ReLU6 (Clip 0..6) where `relu6`."""
        rng = self.rng
        w = rng.standard_normal((cout, cin // group, k, k)) * np.sqrt(2.0 / (cin // group * k * k))
        scale, shift, mean, var = (1 + 0.1 * rng.standard_normal(cout), 0.1 * rng.standard_normal(cout),
                                   0.1 * rng.standard_normal(cout), rng.uniform(0.5, 1.5, cout))
        g = scale / np.sqrt(var + 1e-5)
        y = self.node("Conv", [x, self.const((w * g[:, None, None, None]).astype(np.float32)),
                               self.const((shift - mean * g).astype(np.float32))],
                      kernel_shape=[k, k], strides=[stride] * 2, pads=[k // 2] * 4, group=group)
        if not relu6:
            return y
        return self.node("Clip", [y, self.const(np.array(0.0, np.float32)), self.const(np.array(6.0, np.float32))])

    def inverted(self, x: str, cin: int, cout: int, stride: int, t: int) -> str:
        hidden = cin * t
        y = self.conv_bn6(x, cin, hidden, 1, 1, True) if t != 1 else x
        y = self.conv_bn6(y, hidden, hidden, 3, stride, True, group=hidden)
        y = self.conv_bn6(y, hidden, cout, 1, 1, False)
        return self.node("Add", [x, y]) if stride == 1 and cin == cout else y


def blocks() -> list[tuple[int, int, int, int]]:
    """Every inverted residual block as (cin, cout, stride, t), in order."""
    out, cin = [], 32
    for t, c, n, s in SETTING:
        for i in range(n):
            out.append((cin, c, s if i == 0 else 1, t))
            cin = c
    return out


def mobilenet_v2(batch: int, seed: int = 0, classes: int = 1000) -> onnx.ModelProto:
    g = _MobileBuilder(seed)
    x = g.conv_bn6("x", 3, 32, 3, 2, True)
    for cin, cout, stride, t in blocks():
        x = g.inverted(x, cin, cout, stride, t)
    x = g.conv_bn6(x, 320, 1280, 1, 1, True)
    x = g.node("Flatten", [g.node("GlobalAveragePool", [x])], axis=1)
    fc = (g.rng.standard_normal((classes, 1280)) / np.sqrt(1280)).astype(np.float32)
    g.node("Gemm", [x, g.const(fc), g.const(np.zeros(classes, np.float32))], transB=1)
    return g.model("mobilenet_v2", (batch, 3, 224, 224), (batch, classes))


def block(batch: int, index: int, seed: int = 0) -> onnx.ModelProto:
    """Inverted residual block `index` (0-16) alone, at its place's spatial size."""
    size = 112
    for i, (_, _, stride, _) in enumerate(blocks()):
        if i == index:
            break
        size //= stride
    cin, cout, stride, t = blocks()[index]
    g = _MobileBuilder(seed)
    g.inverted("x", cin, cout, stride, t)
    return g.model("inverted_residual", (batch, cin, size, size), (batch, cout, size // stride, size // stride))


if __name__ == "__main__":
    batch, path = int(sys.argv[1]), Path(sys.argv[2])
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(mobilenet_v2(batch) if len(sys.argv) < 4 else block(batch, int(sys.argv[3])), path)
    print(f"{path} written")
