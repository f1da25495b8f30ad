"""Build the example models and inputs: `python examples/build_examples.py [--out-dir examples]`.

Writes, with a fixed seed so every run gives the same bytes:
- `mlp.onnx`:   x[4,64] -> MatMul -> Add -> Relu -> Gemm(transB=1) -> Sigmoid -> y[4,32]
- `block.onnx`: a single-head transformer-style block, x[16,64] -> y[16,64]
  (attention with a scaled q·kᵀ, residual, erf-GELU FFN as torch exports it, residual, Tanh)
- `encoder.onnx`: one BERT-style encoder layer (4 heads, LayerNorm, erf-GELU FFN) as torch
  exports it, x[2,64,256] -> y[2,64,256] (`build_encoder(layers=24)` makes a deep stack)
- `decoder.onnx`: one GPT-2-style decoder layer (pre-LayerNorm, constant causal mask, tanh-GELU
  with Pow), x[2,64,256] -> y[2,64,256]
- `mlp_x.npy`, `block_x.npy`, `encoder_x.npy`, `decoder_x.npy`: matching float32 inputs.
Models are opset 17, IR version 8 (onnxruntime 1.16+ accepts it) and pass `onnx.checker`.
The outputs are generated files and are git-ignored.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17
IR_VERSION = 8
SEED = 20240601


def _model(graph: onnx.GraphProto) -> onnx.ModelProto:
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", OPSET)],
        ir_version=IR_VERSION,
        producer_name="aicf-examples",
    )
    onnx.checker.check_model(model, full_check=True)
    return model


def _weight(rng: np.random.Generator, shape: tuple[int, ...], fan_in: int) -> np.ndarray:
    """Standard normal scaled by 1/sqrt(fan_in): keeps activations O(1) layer to layer."""
    return (rng.standard_normal(shape) / math.sqrt(fan_in)).astype(np.float32)


def _scalar(value: float) -> np.ndarray:
    return np.array(value, dtype=np.float32)


def build_mlp(rng: np.random.Generator) -> onnx.ModelProto:
    """y = Sigmoid(Gemm(Relu(x @ W1 + b1), W2, b2, transB=1)), x[4,64] -> y[4,32]."""
    inits = {
        "W1": _weight(rng, (64, 128), 64),
        "b1": _weight(rng, (128,), 64),
        "W2": _weight(rng, (32, 128), 128),  # stored [out, in]: Gemm applies transB=1
        "b2": _weight(rng, (32,), 128),
    }
    nodes = [
        helper.make_node("MatMul", ["x", "W1"], ["fc1_mm"], name="fc1_matmul"),
        helper.make_node("Add", ["fc1_mm", "b1"], ["fc1"], name="fc1_add_bias"),
        helper.make_node("Relu", ["fc1"], ["act1"], name="act1_relu"),
        helper.make_node("Gemm", ["act1", "W2", "b2"], ["fc2"], name="fc2_gemm", transB=1),
        helper.make_node("Sigmoid", ["fc2"], ["y"], name="out_sigmoid"),
    ]
    graph = helper.make_graph(
        nodes,
        "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 32])],
        [numpy_helper.from_array(a, name) for name, a in inits.items()],
    )
    return _model(graph)


def build_block(rng: np.random.Generator) -> onnx.ModelProto:
    """A single-head transformer-style block, x[16,64] -> y[16,64].

    probs = Softmax((x Wq)(x Wk)ᵀ · 1/sqrt(64)); h = x + (probs (x Wv)) Wo
    u = h W1 + b1; g = u · 0.5 · (1 + erf(u / sqrt 2)); y = Tanh(h + (g W2 + b2))
    """
    d, ff = 64, 256
    inits = {
        "Wq": _weight(rng, (d, d), d),
        "Wk": _weight(rng, (d, d), d),
        "Wv": _weight(rng, (d, d), d),
        "Wo": _weight(rng, (d, d), d),
        "W1": _weight(rng, (d, ff), d),
        "b1": _weight(rng, (ff,), d),
        "W2": _weight(rng, (ff, d), ff),
        "b2": _weight(rng, (d,), ff),
        "attn_scale": _scalar(1.0 / math.sqrt(d)),
        "gelu_sqrt2": _scalar(math.sqrt(2.0)),
        "gelu_one": _scalar(1.0),
        "gelu_half": _scalar(0.5),
    }
    n = helper.make_node
    nodes = [
        # attention
        n("MatMul", ["x", "Wq"], ["q"], name="attn_q_matmul"),
        n("MatMul", ["x", "Wk"], ["k"], name="attn_k_matmul"),
        n("MatMul", ["x", "Wv"], ["v"], name="attn_v_matmul"),
        n("Transpose", ["k"], ["k_t"], name="attn_k_transpose", perm=[1, 0]),
        n("MatMul", ["q", "k_t"], ["scores_raw"], name="attn_scores_matmul"),
        n("Mul", ["scores_raw", "attn_scale"], ["scores"], name="attn_scale_mul"),
        n("Softmax", ["scores"], ["probs"], name="attn_softmax", axis=-1),
        n("MatMul", ["probs", "v"], ["attn"], name="attn_pv_matmul"),
        n("MatMul", ["attn", "Wo"], ["o"], name="attn_out_matmul"),
        n("Add", ["x", "o"], ["h"], name="attn_residual_add"),
        # feed-forward with erf-GELU, node for node as torch.onnx exports nn.GELU()
        n("MatMul", ["h", "W1"], ["ffn1_mm"], name="ffn1_matmul"),
        n("Add", ["ffn1_mm", "b1"], ["u"], name="ffn1_add_bias"),
        n("Div", ["u", "gelu_sqrt2"], ["gelu_div"], name="gelu_div"),
        n("Erf", ["gelu_div"], ["gelu_erf"], name="gelu_erf"),
        n("Add", ["gelu_erf", "gelu_one"], ["gelu_add"], name="gelu_add_one"),
        n("Mul", ["u", "gelu_add"], ["gelu_mul"], name="gelu_mul"),
        n("Mul", ["gelu_mul", "gelu_half"], ["g"], name="gelu_mul_half"),
        n("MatMul", ["g", "W2"], ["ffn2_mm"], name="ffn2_matmul"),
        n("Add", ["ffn2_mm", "b2"], ["ffn2"], name="ffn2_add_bias"),
        n("Add", ["h", "ffn2"], ["h2"], name="ffn_residual_add"),
        n("Tanh", ["h2"], ["y"], name="out_tanh"),
    ]
    graph = helper.make_graph(
        nodes,
        "block",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [16, d])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [16, d])],
        [numpy_helper.from_array(a, name) for name, a in inits.items()],
    )
    return _model(graph)


def _layer_weights(rng: np.random.Generator, inits: dict[str, np.ndarray], p: str, hidden: int, ffn: int) -> None:
    """One transformer layer's weights, named with prefix `p`: the four projections, the two
    FFN matrices with biases, and two LayerNorms' scale and bias."""
    for w in ("q", "k", "v", "o"):
        inits[f"{p}W{w}"] = _weight(rng, (hidden, hidden), hidden)
        inits[f"{p}b{w}"] = _weight(rng, (hidden,), hidden)
    inits[f"{p}W1"], inits[f"{p}b1"] = _weight(rng, (hidden, ffn), hidden), _weight(rng, (ffn,), hidden)
    inits[f"{p}W2"], inits[f"{p}b2"] = _weight(rng, (ffn, hidden), ffn), _weight(rng, (hidden,), ffn)
    for ln in ("ln1", "ln2"):
        inits[f"{p}{ln}_g"] = (1 + 0.1 * rng.standard_normal(hidden)).astype(np.float32)
        inits[f"{p}{ln}_b"] = (0.1 * rng.standard_normal(hidden)).astype(np.float32)


def _attention(p: str, x: str, mask: str | None = None) -> list[onnx.NodeProto]:
    """Multi-head self-attention on `x` as torch exports it, ending in `{p}o` (projection +
    bias): heads split by Reshape + Transpose (K transposed for q·kᵀ), scores divided by
    sqrt(d), an optional additive `mask`, Softmax, heads merged by Transpose + Reshape."""
    n = helper.make_node
    nodes = []
    for w, perm in (("q", [0, 2, 1, 3]), ("k", [0, 2, 3, 1]), ("v", [0, 2, 1, 3])):
        nodes += [n("MatMul", [x, f"{p}W{w}"], [f"{p}{w}_mm"], name=f"{p}{w}_matmul"),
                  n("Add", [f"{p}{w}_mm", f"{p}b{w}"], [f"{p}{w}_lin"], name=f"{p}{w}_add"),
                  n("Reshape", [f"{p}{w}_lin", "split_shape"], [f"{p}{w}_split"], name=f"{p}{w}_reshape"),
                  n("Transpose", [f"{p}{w}_split"], [f"{p}{w}_heads"], name=f"{p}{w}_transpose", perm=perm)]
    scores = f"{p}scores_scaled" if mask else f"{p}scores"
    nodes += [n("MatMul", [f"{p}q_heads", f"{p}k_heads"], [f"{p}scores_raw"], name=f"{p}scores_matmul"),
              n("Div", [f"{p}scores_raw", "attn_scale"], [scores], name=f"{p}scores_div")]
    if mask:
        nodes.append(n("Add", [scores, mask], [f"{p}scores"], name=f"{p}mask_add"))
    return nodes + [
        n("Softmax", [f"{p}scores"], [f"{p}probs"], name=f"{p}softmax", axis=-1),
        n("MatMul", [f"{p}probs", f"{p}v_heads"], [f"{p}ctx_heads"], name=f"{p}pv_matmul"),
        n("Transpose", [f"{p}ctx_heads"], [f"{p}ctx_t"], name=f"{p}ctx_transpose", perm=[0, 2, 1, 3]),
        n("Reshape", [f"{p}ctx_t", "merge_shape"], [f"{p}ctx"], name=f"{p}ctx_reshape"),
        n("MatMul", [f"{p}ctx", f"{p}Wo"], [f"{p}o_mm"], name=f"{p}o_matmul"),
        n("Add", [f"{p}o_mm", f"{p}bo"], [f"{p}o"], name=f"{p}o_add"),
    ]


def _layers_model(name: str, nodes: list, inits: dict[str, np.ndarray], shape: list[int]) -> onnx.ModelProto:
    graph = helper.make_graph(
        nodes, name,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)],
        [numpy_helper.from_array(a, k) for k, a in inits.items()],
    )
    return _model(graph)


def _head_shapes(batch: int, seq: int, hidden: int, heads: int) -> dict[str, np.ndarray]:
    return {"split_shape": np.array([batch, seq, heads, hidden // heads], dtype=np.int64),
            "merge_shape": np.array([batch, seq, hidden], dtype=np.int64),
            "attn_scale": _scalar(math.sqrt(hidden // heads))}


def build_encoder(rng: np.random.Generator, layers: int = 1, batch: int = 2, seq: int = 64,
                  hidden: int = 256, heads: int = 4, ffn: int = 1024, name: str = "encoder") -> onnx.ModelProto:
    """`layers` BERT-style (post-LayerNorm) encoder layers, x[batch,seq,hidden] -> y, node for
    node as torch.onnx exports them: per layer

        q, k, v = x Wq + bq, x Wk + bk, x Wv + bv      heads split by Reshape + Transpose
        a = Softmax(q kᵀ / sqrt(d)) v                  heads merged by Transpose + Reshape
        h = LayerNorm(x + a Wo + bo)
        y = LayerNorm(h + GELU(h W1 + b1) W2 + b2)     erf-GELU as five element-wise nodes
    """
    n = helper.make_node
    inits = _head_shapes(batch, seq, hidden, heads) | {
        "gelu_sqrt2": _scalar(math.sqrt(2.0)), "gelu_one": _scalar(1.0), "gelu_half": _scalar(0.5)}
    nodes = []
    x = "x"
    for i in range(layers):
        p = f"l{i}_"
        _layer_weights(rng, inits, p, hidden, ffn)
        nodes += _attention(p, x) + [
            n("Add", [x, f"{p}o"], [f"{p}res1"], name=f"{p}residual1"),
            n("LayerNormalization", [f"{p}res1", f"{p}ln1_g", f"{p}ln1_b"], [f"{p}h"], name=f"{p}ln1",
              axis=-1, epsilon=1e-12),
            n("MatMul", [f"{p}h", f"{p}W1"], [f"{p}ffn1_mm"], name=f"{p}ffn1_matmul"),
            n("Add", [f"{p}ffn1_mm", f"{p}b1"], [f"{p}u"], name=f"{p}ffn1_add"),
            n("Div", [f"{p}u", "gelu_sqrt2"], [f"{p}gelu_div"], name=f"{p}gelu_div"),
            n("Erf", [f"{p}gelu_div"], [f"{p}gelu_erf"], name=f"{p}gelu_erf"),
            n("Add", [f"{p}gelu_erf", "gelu_one"], [f"{p}gelu_add"], name=f"{p}gelu_add"),
            n("Mul", [f"{p}u", f"{p}gelu_add"], [f"{p}gelu_mul"], name=f"{p}gelu_mul"),
            n("Mul", [f"{p}gelu_mul", "gelu_half"], [f"{p}g"], name=f"{p}gelu_half"),
            n("MatMul", [f"{p}g", f"{p}W2"], [f"{p}ffn2_mm"], name=f"{p}ffn2_matmul"),
            n("Add", [f"{p}ffn2_mm", f"{p}b2"], [f"{p}ffn2"], name=f"{p}ffn2_add"),
            n("Add", [f"{p}h", f"{p}ffn2"], [f"{p}res2"], name=f"{p}residual2"),
        ]
        y = "y" if i == layers - 1 else f"{p}out"
        nodes.append(n("LayerNormalization", [f"{p}res2", f"{p}ln2_g", f"{p}ln2_b"], [y], name=f"{p}ln2",
                       axis=-1, epsilon=1e-12))
        x = y
    return _layers_model(name, nodes, inits, [batch, seq, hidden])


def build_decoder(rng: np.random.Generator, layers: int = 1, batch: int = 2, seq: int = 64,
                  hidden: int = 256, heads: int = 4, name: str = "decoder") -> onnx.ModelProto:
    """`layers` GPT-2-style (pre-LayerNorm, causal) decoder layers, x[batch,seq,hidden] -> y:

        a = x + Softmax(q kᵀ / sqrt(d) + causal) v Wo + bo,  q, k, v from LayerNorm(x)
        y = a + gelu_tanh(LayerNorm(a) W1 + b1) W2 + b2       gelu_tanh with Pow(u, 3), as GPT-2

    The causal mask is a constant [seq, seq] added to the scores (0 on and below the diagonal,
    -1e9 above), as torch exports a registered causal buffer.
    """
    n = helper.make_node
    inits = _head_shapes(batch, seq, hidden, heads) | {
        "causal": np.triu(np.full((seq, seq), -1e9, dtype=np.float32), k=1),
        "g_c": _scalar(math.sqrt(2.0 / math.pi)), "g_k": _scalar(0.044715), "g_three": _scalar(3.0),
        "g_one": _scalar(1.0), "g_half": _scalar(0.5)}
    nodes = []
    x = "x"
    for i in range(layers):
        p = f"l{i}_"
        _layer_weights(rng, inits, p, hidden, 4 * hidden)
        nodes.append(n("LayerNormalization", [x, f"{p}ln1_g", f"{p}ln1_b"], [f"{p}ln1"], name=f"{p}ln1",
                       axis=-1, epsilon=1e-5))
        nodes += _attention(p, f"{p}ln1", mask="causal") + [
            n("Add", [x, f"{p}o"], [f"{p}a"], name=f"{p}residual1"),
            n("LayerNormalization", [f"{p}a", f"{p}ln2_g", f"{p}ln2_b"], [f"{p}ln2"], name=f"{p}ln2",
              axis=-1, epsilon=1e-5),
            n("MatMul", [f"{p}ln2", f"{p}W1"], [f"{p}fc_mm"], name=f"{p}fc_matmul"),
            n("Add", [f"{p}fc_mm", f"{p}b1"], [f"{p}u"], name=f"{p}fc_add"),
            n("Pow", [f"{p}u", "g_three"], [f"{p}u3"], name=f"{p}gelu_pow"),
            n("Mul", [f"{p}u3", "g_k"], [f"{p}ku3"], name=f"{p}gelu_mul_k"),
            n("Add", [f"{p}u", f"{p}ku3"], [f"{p}inner"], name=f"{p}gelu_add_inner"),
            n("Mul", [f"{p}inner", "g_c"], [f"{p}scaled"], name=f"{p}gelu_mul_c"),
            n("Tanh", [f"{p}scaled"], [f"{p}t"], name=f"{p}gelu_tanh"),
            n("Add", [f"{p}t", "g_one"], [f"{p}t1"], name=f"{p}gelu_add_one"),
            n("Mul", [f"{p}u", f"{p}t1"], [f"{p}ut"], name=f"{p}gelu_mul_u"),
            n("Mul", [f"{p}ut", "g_half"], [f"{p}g"], name=f"{p}gelu_mul_half"),
            n("MatMul", [f"{p}g", f"{p}W2"], [f"{p}proj_mm"], name=f"{p}proj_matmul"),
            n("Add", [f"{p}proj_mm", f"{p}b2"], [f"{p}proj"], name=f"{p}proj_add"),
        ]
        y = "y" if i == layers - 1 else f"{p}out"
        nodes.append(n("Add", [f"{p}a", f"{p}proj"], [y], name=f"{p}residual2"))
        x = y
    return _layers_model(name, nodes, inits, [batch, seq, hidden])


def _sanity_run(model: onnx.ModelProto, x: np.ndarray) -> None:
    """If onnxruntime is installed (the dev extra), check the model runs to finite outputs."""
    try:
        import onnxruntime as ort
    except ImportError:
        return
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    (y,) = session.run(None, {"x": x})
    if not np.isfinite(y).all():
        raise SystemExit(f"{model.graph.name}: onnxruntime produced non-finite outputs")


# For tests: each example built on its own from a fresh generator.
BUILDERS = {
    "mlp": lambda: build_mlp(np.random.default_rng(SEED)),
    "block": lambda: build_block(np.random.default_rng(SEED)),
    "encoder": lambda: build_encoder(np.random.default_rng(SEED)),
    "decoder": lambda: build_decoder(np.random.default_rng(SEED)),
}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out-dir", type=Path, default=Path(__file__).resolve().parent,
                        help="where to write the models and inputs (default: examples/)")
    args = parser.parse_args(argv)
    out_dir: Path = args.out_dir
    out_dir.mkdir(parents=True, exist_ok=True)

    rng = np.random.default_rng(SEED)
    mlp = build_mlp(rng)
    block = build_block(rng)
    encoder = build_encoder(rng)
    decoder = build_decoder(rng)
    mlp_x = rng.standard_normal((4, 64)).astype(np.float32)
    block_x = rng.standard_normal((16, 64)).astype(np.float32)
    encoder_x = rng.standard_normal((2, 64, 256)).astype(np.float32)
    decoder_x = rng.standard_normal((2, 64, 256)).astype(np.float32)
    _sanity_run(mlp, mlp_x)
    _sanity_run(block, block_x)
    _sanity_run(encoder, encoder_x)
    _sanity_run(decoder, decoder_x)

    for name, model in (("mlp.onnx", mlp), ("block.onnx", block), ("encoder.onnx", encoder),
                        ("decoder.onnx", decoder)):
        path = out_dir / name
        onnx.save(model, str(path))
        print(f"wrote {path} ({len(model.graph.node)} nodes)")
    for name, array in (("mlp_x.npy", mlp_x), ("block_x.npy", block_x), ("encoder_x.npy", encoder_x),
                        ("decoder_x.npy", decoder_x)):
        path = out_dir / name
        np.save(path, array)
        print(f"wrote {path} (float32 {list(array.shape)})")


if __name__ == "__main__":
    main()
