"""A Llama decoder with its KV cache as explicit inputs and outputs, built with onnx.helper from
transformers-named weights at any size (the committed export, tests/fixtures/make_generate.py,
is small; a 1 B one is built here, on the GPU machine, without an exporter).

The graph is the export's node for node where it matters to the compiler (checked against it
by tests/test_generate.py on the fixture's weights, through onnxruntime): rotary tables from
`cache_position` (Cast, Mul by the inverse frequencies, Concat, Cos/Sin); the visibility mask
`slot j <= position` (LessOrEqual of a constant slot table, then Where(mask, 0, -FLT_MAX));
RMSNorm as Pow / ReduceMean / Add / Sqrt / Reciprocal / Mul / Mul; rotate_half as Slice / Neg /
Concat; the cache update `past.index_copy(2, cache_position, k)` as the exporter writes it
(Transpose to slot-major, ScatterND, Transpose back); repeat_kv as Unsqueeze / Expand /
Reshape; softmax(q·kᵀ·s + mask)·v; SwiGLU MLP; final RMSNorm and LM head on the last position
only (transformers' `generate` keeps one position's logits).

Weights are a mapping of transformers LlamaForCausalLM names to float32 arrays ([out, in] for
linear layers, as torch stores them), so the same arrays load into transformers for the
baseline (benchmarks/generate.py).
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import TensorProto, helper

from benchmarks.onnx_graph import GraphBuilder

FLT_MAX = 3.4028234663852886e38


@dataclass(frozen=True)
class DecoderConfig:
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    ffn: int
    vocab: int
    slots: int            # cache length (S_max)
    theta: float = 10000.0
    eps: float = 1e-6

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def parameters(self) -> int:
        h, d = self.hidden, self.head_dim
        per_layer = h * h * 2 + 2 * h * self.kv_heads * d + 3 * h * self.ffn + 2 * h
        return self.layers * per_layer + 2 * self.vocab * h + h

    def cache_shape(self, batch: int) -> tuple[int, int, int, int]:
        return (batch, self.kv_heads, self.slots, self.head_dim)


def cache_names(cfg: DecoderConfig) -> list[tuple[str, str]]:
    """(input, output) of every cache tensor, in the model's input and output order."""
    return [(f"past_{kv}_{i}", f"present_{kv}_{i}") for i in range(cfg.layers) for kv in "kv"]


def weight_shapes(cfg: DecoderConfig) -> dict[str, tuple[int, ...]]:
    """Every weight's transformers name and shape."""
    h, kvd = cfg.hidden, cfg.kv_heads * cfg.head_dim
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (cfg.vocab, h)}
    for i in range(cfg.layers):
        p = f"model.layers.{i}."
        shapes |= {p + "input_layernorm.weight": (h,), p + "post_attention_layernorm.weight": (h,),
                   p + "self_attn.q_proj.weight": (h, h), p + "self_attn.k_proj.weight": (kvd, h),
                   p + "self_attn.v_proj.weight": (kvd, h), p + "self_attn.o_proj.weight": (h, h),
                   p + "mlp.gate_proj.weight": (cfg.ffn, h), p + "mlp.up_proj.weight": (cfg.ffn, h),
                   p + "mlp.down_proj.weight": (h, cfg.ffn)}
    return shapes | {"model.norm.weight": (h,), "lm_head.weight": (cfg.vocab, h)}


def random_weight(name: str, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    """Spread random weights (as tests/fixtures/make_generate.py draws them): norm scales around
    1, embedding and head N(0, 0.5²), linear layers N(0, 1/fan_in), so greedy decoding has
    clear winners."""
    if "norm" in name:
        return (1.0 + 0.1 * rng.standard_normal(shape, dtype=np.float32)).astype(np.float32)
    if "embed" in name or "lm_head" in name:
        return (0.5 * rng.standard_normal(shape, dtype=np.float32)).astype(np.float32)
    return (rng.standard_normal(shape, dtype=np.float32) / np.float32(np.sqrt(shape[-1]))).astype(np.float32)


def decoder_model(cfg: DecoderConfig, weight: Callable[[str], np.ndarray], batch: int = 1,
                  store: Callable[[np.ndarray, str], onnx.TensorProto] | None = None) -> onnx.ModelProto:
    """The graph over `weight(name)` (transformers names, float32) for `batch` sequences, the
    sequence length symbolic; `store(array, name)` makes each initializer (default: in the
    model; a big model's go to external data as they are made)."""
    h, d, hq, hkv = cfg.hidden, cfg.head_dim, cfg.heads, cfg.kv_heads
    group, half = hq // hkv, d // 2
    g = GraphBuilder(store)
    nodes, inits, const, node = g.nodes, g.inits, g.const, g.node

    def ints(*values: int) -> str:
        return const(np.asarray(values, np.int64))

    def linear(x: str, name: str) -> str:   # x @ W.T, W [out, in] as torch stores it
        return node("MatMul", [x, const(np.ascontiguousarray(weight(name).T), name)])

    two, axis_last, eps = const(np.asarray(2.0, np.float32)), ints(-1), const(np.asarray(cfg.eps, np.float32))

    def rms_norm(x: str, name: str) -> str:
        mean = node("ReduceMean", [node("Pow", [x, two]), axis_last], keepdims=1)
        r = node("Reciprocal", [node("Sqrt", [node("Add", [mean, eps])])])
        return node("Mul", [const(weight(name), name), node("Mul", [x, r])])

    def rotate(x: str, cos: str, sin: str) -> str:
        lo = node("Slice", [x, ints(0), ints(half), ints(-1)])
        hi = node("Slice", [x, ints(half), ints(d), ints(-1)])
        turned = node("Concat", [node("Neg", [hi]), lo], axis=-1)
        return node("Add", [node("Mul", [x, cos]), node("Mul", [turned, sin])])

    def cache_update(past: str, new: str, perm_new: list[int], ids: str, out: str) -> str:
        """out = past.index_copy(2, cache_position, new): slot-major ScatterND, as the exporter writes it."""
        data = node("Transpose", [past], perm=[2, 0, 1, 3])
        upd = node("Transpose", [new], perm=perm_new)
        nodes.append(helper.make_node("Transpose", [node("ScatterND", [data, ids, upd])], [out], perm=[1, 2, 0, 3],
                                      name=f"node_{out}"))
        return out

    def repeat_kv(x: str) -> str:
        wide = node("Expand", [node("Unsqueeze", [x, ints(2)]), ints(1, 1, group, 1, 1)])
        return node("Reshape", [wide, ints(0, hq, cfg.slots, d)])

    inv = 1.0 / (cfg.theta ** (np.arange(0, d, 2, dtype=np.float32) / d))
    pos = node("Unsqueeze", [node("Cast", ["cache_position"], to=TensorProto.FLOAT), ints(1)])      # [S, 1]
    freqs = node("Mul", [pos, const(inv[None, :].astype(np.float32))])
    angles = node("Concat", [freqs, freqs], axis=-1)
    cos = node("Unsqueeze", [node("Cos", [angles]), ints(0, 1)])
    sin = node("Unsqueeze", [node("Sin", [angles]), ints(0, 1)])
    visible = node("LessOrEqual", [const(np.arange(cfg.slots, dtype=np.float32)[None, :]), pos])    # [S, slots]
    mask = node("Where", [node("Unsqueeze", [visible, ints(0, 1)]), const(np.asarray(0.0, np.float32)),
                          const(np.asarray(-FLT_MAX, np.float32))])
    ids = node("Unsqueeze", ["cache_position", ints(1)])
    scale = const(np.asarray(1.0 / np.sqrt(d), np.float32))

    x = node("Gather", [const(weight("model.embed_tokens.weight"), "model.embed_tokens.weight"), "input_ids"], axis=0)
    for i in range(cfg.layers):
        p = f"model.layers.{i}."
        hn = rms_norm(x, p + "input_layernorm.weight")
        q = node("Transpose", [node("Reshape", [linear(hn, p + "self_attn.q_proj.weight"), ints(0, 0, hq, d)])],
                 perm=[0, 2, 1, 3])
        k = node("Transpose", [node("Reshape", [linear(hn, p + "self_attn.k_proj.weight"), ints(0, 0, hkv, d)])],
                 perm=[0, 2, 1, 3])
        v = node("Reshape", [linear(hn, p + "self_attn.v_proj.weight"), ints(0, 0, hkv, d)])       # [B, S, Hkv, D]
        q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        pk = cache_update(f"past_k_{i}", k, [2, 0, 1, 3], ids, f"present_k_{i}")
        pv = cache_update(f"past_v_{i}", v, [1, 0, 2, 3], ids, f"present_v_{i}")
        kk, vv = repeat_kv(pk), repeat_kv(pv)
        scores = node("Mul", [node("MatMul", [q, node("Transpose", [kk], perm=[0, 1, 3, 2])]), scale])
        probs = node("Softmax", [node("Add", [scores, mask])], axis=-1)
        o = node("Reshape", [node("Transpose", [node("MatMul", [probs, vv])], perm=[0, 2, 1, 3]), ints(0, 0, h)])
        x = node("Add", [x, linear(o, p + "self_attn.o_proj.weight")])
        hn = rms_norm(x, p + "post_attention_layernorm.weight")
        gate = linear(hn, p + "mlp.gate_proj.weight")
        act = node("Mul", [gate, node("Sigmoid", [gate])])
        x = node("Add", [x, linear(node("Mul", [act, linear(hn, p + "mlp.up_proj.weight")]), p + "mlp.down_proj.weight")])
    last = node("Slice", [x, ints(-1), ints(2**62), ints(1)])
    head = const(np.ascontiguousarray(weight("lm_head.weight").T), "lm_head.weight")
    nodes.append(helper.make_node("MatMul", [rms_norm(last, "model.norm.weight"), head], ["logits"], name="node_logits"))

    f32 = TensorProto.FLOAT
    cache_in = [helper.make_tensor_value_info(n, f32, [batch, hkv, cfg.slots, d]) for n, _ in cache_names(cfg)]
    cache_out = [helper.make_tensor_value_info(n, f32, [batch, hkv, cfg.slots, d]) for _, n in cache_names(cfg)]
    graph = helper.make_graph(
        nodes, "llama_decoder_kv",
        [helper.make_tensor_value_info("input_ids", TensorProto.INT64, [batch, "seq"]),
         helper.make_tensor_value_info("cache_position", TensorProto.INT64, ["seq"])] + cache_in,
        [helper.make_tensor_value_info("logits", f32, [batch, 1, cfg.vocab])] + cache_out, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], producer_name="aicf-benchmarks")
    model.ir_version = 8   # readable by the onnxruntime on the GPU machine
    return model


def weights_of(arrays: Mapping[str, np.ndarray]) -> Callable[[str], np.ndarray]:
    """`weight(name)` over a mapping (a transformers state dict as numpy arrays)."""
    return lambda name: np.asarray(arrays[name], dtype=np.float32)
