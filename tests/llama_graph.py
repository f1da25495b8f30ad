"""A Llama decoder as the dynamo exporter writes it, built with onnx.helper at any size.

The committed exports (tests/fixtures/llama) are small, and at small sizes the exporter folds
the rotary tables into constants; at realistic ones (hidden 1024, 16 heads over 4 key/value
heads, 512 tokens) it leaves them as `Cos`/`Sin` of the constant angles, and a 1024-wide
export is far too big to commit. This builder writes that graph node for node as the export
has it (checked against one, transformers 5.24 / torch 2.14): the angles
`Concat(freqs, freqs)` -> Cos / Sin -> Unsqueeze; RMSNorm as Pow / ReduceMean / Add / Sqrt /
Reciprocal / Mul / Mul; q, k, v projections viewed as heads; rotary `x·cos +
Concat(-x[h:], x[:h])·sin`; repeat_kv as Unsqueeze / Expand / Reshape; attention with an
additive causal mask; the o-projection and residual; SiLU-gated MLP; a final RMSNorm. Weights
are random (N(0, 0.02²), norm scales around 1).
"""
from __future__ import annotations

from collections.abc import Callable

import numpy as np
import onnx
from onnx import TensorProto, helper

from benchmarks.onnx_graph import GraphBuilder


def llama_model(hidden: int, heads: int, kv_heads: int, seq: int, inter: int, layers: int = 1,
                vocab: int = 64, seed: int = 0,
                store: Callable[[np.ndarray, str], onnx.TensorProto] | None = None,
                dtype: np.dtype = np.dtype(np.float64)) -> onnx.ModelProto:
    """`store(array, name)` makes each initializer (default: in the model); a big model's can go
    to an external-data file as they are made (benchmarks/big_model.py), so they are never all in
    memory. `dtype` is the type the random weights are drawn in (float32 halves the time and
    memory of a big one; the default keeps the committed tests' values)."""
    rng = np.random.default_rng(seed)
    d = hidden // heads
    half = d // 2
    group = heads // kv_heads
    g = GraphBuilder(store)
    nodes, inits, const, node = g.nodes, g.inits, g.const, g.node

    def weight(*shape: int) -> str:
        return const((rng.standard_normal(shape, dtype=dtype) * 0.02).astype(np.float32))

    def rms_norm(x: str) -> str:
        two, axes = const(np.asarray(2.0, np.float32)), const(np.asarray([-1], np.int64))
        eps = const(np.asarray(1e-6, np.float32))
        mean = node("ReduceMean", [node("Pow", [x, two]), axes], keepdims=1)
        r = node("Reciprocal", [node("Sqrt", [node("Add", [mean, eps])])])
        scale = const((1.0 + rng.standard_normal(hidden) * 0.1).astype(np.float32))
        return node("Mul", [scale, node("Mul", [x, r])])

    def heads_of(x: str, n: int) -> str:
        return node("Transpose", [node("Reshape", [x, const(np.asarray([1, seq, n, d], np.int64))])],
                    perm=[0, 2, 1, 3])

    def rotary(x: str, cos: str, sin: str) -> str:
        axis, step = const(np.asarray([3], np.int64)), const(np.asarray([1], np.int64))
        lo = node("Slice", [x, const(np.asarray([0], np.int64)), const(np.asarray([half], np.int64)), axis, step])
        hi = node("Slice", [x, const(np.asarray([half], np.int64)), const(np.asarray([d], np.int64)), axis, step])
        rot = node("Concat", [node("Neg", [hi]), lo], axis=-1)
        return node("Add", [node("Mul", [x, cos]), node("Mul", [rot, sin])])

    def repeat_kv(x: str) -> str:
        e = node("Expand", [node("Unsqueeze", [x, const(np.asarray([2], np.int64))]),
                            const(np.asarray([1, kv_heads, group, seq, d], np.int64))])
        return node("Reshape", [e, const(np.asarray([1, heads, seq, d], np.int64))])

    # rotary tables of the static positions: cos/sin of Concat(freqs, freqs), left to run time
    inv = 1.0 / (10000.0 ** (np.arange(0, d, 2, dtype=np.float64) / d))
    freqs = const((np.arange(seq, dtype=np.float64)[:, None] * inv[None, :]).astype(np.float32)[None])
    angles = node("Concat", [freqs, freqs], axis=-1)
    one = const(np.asarray([1], np.int64))
    cos = node("Unsqueeze", [node("Cos", [angles]), one])
    sin = node("Unsqueeze", [node("Sin", [angles]), one])
    mask = const(np.triu(np.full((seq, seq), -np.inf, np.float32), 1)[None, None])
    scale = const(np.asarray(1.0 / np.sqrt(d), np.float32))

    x = node("Gather", [const(rng.standard_normal((vocab, hidden), dtype=dtype).astype(np.float32)), "input_ids"], axis=0)
    for _ in range(layers):
        h = rms_norm(x)
        q = rotary(heads_of(node("MatMul", [h, weight(hidden, hidden)]), heads), cos, sin)
        k = rotary(heads_of(node("MatMul", [h, weight(hidden, kv_heads * d)]), kv_heads), cos, sin)
        v = heads_of(node("MatMul", [h, weight(hidden, kv_heads * d)]), kv_heads)
        scores = node("Add", [node("Mul", [node("MatMul", [q, node("Transpose", [repeat_kv(k)], perm=[0, 1, 3, 2])]),
                                           scale]), mask])
        att = node("MatMul", [node("Softmax", [scores], axis=-1), repeat_kv(v)])
        att = node("Reshape", [node("Transpose", [att], perm=[0, 2, 1, 3]),
                               const(np.asarray([1, seq, hidden], np.int64))])
        x = node("Add", [x, node("MatMul", [att, weight(hidden, hidden)])])
        h = rms_norm(x)
        gate = node("MatMul", [h, weight(hidden, inter)])
        silu = node("Mul", [gate, node("Sigmoid", [gate])])
        up = node("MatMul", [h, weight(hidden, inter)])
        x = node("Add", [x, node("MatMul", [node("Mul", [silu, up]), weight(inter, hidden)])])
    y = rms_norm(x)
    nodes.append(helper.make_node("Identity", [y], ["y"], name="node_y"))
    graph = helper.make_graph(nodes, "llama", [helper.make_tensor_value_info("input_ids", TensorProto.INT64, [1, seq])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, seq, hidden])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 8
    return model
