"""conv_as_matmul: a pointwise convolution is a batched matrix product (part of canonicalize).

A Conv whose kernel is 1x1, with unit strides, no padding and one group, reads input channel c
at the output's own spatial position: y[n, m, p] = sum_c w[m, c] · x[n, c, p] over the
flattened positions p = h·W + w (any number of spatial axes: 1-D and 3-D alike). That is MatMul(w[M, C], x[N, C, H·W]) with the weight
broadcast over the batch, so the GEMM families (and on sm_90 the Hopper engine) take it, with
the bias, the folded BatchNormalization, the activation and the residual add as its epilogue
exactly as for a transformer's projections. The property is `pointwise_window` (every window
is one tap at the output's position); the rewrite is recorded as rule POINTWISE_CONV_RULE.

    %y: f32[2,64,56,56] = Conv(%x, %w, %b) {kernel_shape=[1,1], strides=[1,1], pads=[0,0,0,0], group=1}
  becomes
    %y.x: f32[2,256,3136] = Reshape(%x) {shape=[2, 256, 3136]}
    %y.mm: f32[2,64,3136] = MatMul(%y.matrix, %y.x) {rule=...}     %y.matrix: the weight as [64, 256]
    %y.biased: f32[2,64,3136] = Add(%y.mm, %y.column)             %y.column: the bias as [64, 1]
    %y: f32[2,64,56,56] = Reshape(%y.b) {shape=[2, 64, 56, 56]}

Where every image has one position (H·W = 1: a squeeze-excite block's FC after a global pool), the
images are the rows instead: y[n, m] = sum_c x[n, c] · w[m, c] is MatMul(x[N, C], Transpose(w))
plus the bias as a row (a Gemm with transB = 1, as canonicalize lowers one), one GEMM of N rows rather than N batched products of one row each (EfficientNet-B0
B32's excite FCs ran 16-25 us each that way on an H200, at 5-8 GB/s: cnn_profiles_session15_h200.txt).

Strided 1x1 convolutions (a downsampling projection) stay convolutions: their input rows are
not one matrix. Channel-last layouts are the layout decision's to make, not this rewrite's.
"""
from __future__ import annotations

import math

from aicfc.ir.high import Node, make_attrs
from aicfc.ir.ops import OPS
from aicfc.ir.types import TensorType, Weight

POINTWISE_CONV_RULE = "Conv 1x1 (unit strides, no padding, one group) => MatMul"
POINTWISE_CONV_REASON = ("pointwise_window: every output reads one tap at its own position, so the convolution is "
                         "a matrix product of the [M, C] weight with the input's [C, H*W] positions, per image")


def is_pointwise(n: Node, types: dict, constants: dict[str, Weight]) -> bool:
    """A Conv that is a batched matrix product (see the module docstring)."""
    if n.op != "Conv" or n.inputs[1] not in constants:
        return False
    at = n.attr
    w = types[n.inputs[1]].shape
    return (all(k == 1 for k in w[2:]) and at.get("group", 1) == 1 and all(s == 1 for s in at["strides"])
            and not any(at["pads"]) and (len(n.inputs) < 3 or n.inputs[2] in constants))


def rewrite(n: Node, types: dict, constants: dict[str, Weight]) -> tuple[list[Node], list[Weight]]:
    """The nodes and weights that replace pointwise Conv `n` (`is_pointwise` holds)."""
    x, y = n.inputs[0], n.output
    bn, c, *spatial = types[x].shape
    m = types[n.inputs[1]].shape[0]
    origin = n.origin
    attrs = {"rule": POINTWISE_CONV_RULE}
    if "folded" in n.attr:
        attrs["folded"] = n.attr["folded"]

    def fresh(name: str) -> str:
        while name in types or name in constants:
            name += "'"
        return name

    def reshaped(name: str, w: Weight, shape: tuple[int, ...]) -> Weight:
        # A C-order reshape keeps the bytes: the new weight shares them (no copy, a lazy one stays lazy).
        return Weight(fresh(name), TensorType(w.type.dtype, shape), w.data)

    rows = math.prod(spatial) == 1   # one position an image: the images are the GEMM's rows
    weights = [reshaped(f"{y}.matrix", constants[n.inputs[1]], (m, c))]
    types[weights[0].name] = weights[0].type
    if len(n.inputs) == 3:
        weights.append(reshaped(f"{y}.row" if rows else f"{y}.column", constants[n.inputs[2]], (m,) if rows else (m, 1)))
        types[weights[1].name] = weights[1].type
    nodes: list[Node] = []

    def emit(op: str, inputs: tuple[str, ...], out: str, at: dict) -> str:
        out = out if out == y else fresh(out)
        t = OPS[op].infer([types[i] for i in inputs], at)
        types[out] = t
        nodes.append(Node(op, inputs, out, t, make_attrs(at), origin))
        return out

    if rows:
        # [N, C] @ [M, C]^T (+ the bias as a row): one GEMM of N rows, not N products of one position each
        flat = emit("Reshape", (x,), f"{y}.x", {"shape": (bn, c)})
        wt = emit("Transpose", (weights[0].name,), f"{y}.matrix_t", {"perm": (1, 0)})
        out = emit("MatMul", (flat, wt), f"{y}.mm", attrs)
        if len(weights) == 2:
            out = emit("Add", (out, weights[1].name), f"{y}.biased", {})
        emit("Reshape", (out,), y, {"shape": (bn, m, *spatial)})
        return nodes, weights
    flat = emit("Reshape", (x,), f"{y}.x", {"shape": (bn, c, math.prod(spatial))})
    out = emit("MatMul", (weights[0].name, flat), f"{y}.mm", attrs)
    if len(weights) == 2:
        out = emit("Add", (out, weights[1].name), f"{y}.biased", {})
    emit("Reshape", (out,), y, {"shape": (bn, m, *spatial)})
    return nodes, weights
