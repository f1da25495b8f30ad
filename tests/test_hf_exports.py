"""Real torch exports of transformers models (tests/fixtures/hf, written by make_hf.py): both
exporters, BERT, GPT-2 and ViT, 2 layers each, random parameters; two with a run-time
attention_mask input (a padded sequence).

What torch's exported scaled_dot_product_attention brings (q and kᵀ each scaled by √scale,
kᵀ transposed on a merged [B·H] batch, NaN probabilities zeroed by Where(IsNaN)) must still
become one streaming attention kernel per layer; BERT and GPT-2 stay at 7 kernels a layer
(GPT-2's GELU the epilogue of its c_fc GEMM, rule "map(view(x)) => view(map(x))"). Every model
matches onnxruntime through the interpreter (CPU) and on the GPU at fp32 (1e-4 of the output's
max) and fp16 (1e-2).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest

import aicfc
from benchmarks.light_models import onnxruntime_reference
from tests.conftest import run_payload
from tests.test_pipeline import evaluate_ir, rel_err, stages

HF = Path(__file__).resolve().parent / "fixtures" / "hf"
MODELS = sorted(p.stem for p in HF.glob("*.onnx"))
LAYERS = 2
ATTENTION_RULE = "softmax(q@kᵀ·s)@v => streaming_attention"


def load(stem: str) -> onnx.ModelProto:
    return onnx.load(str(HF / f"{stem}.onnx"))


def feeds(model: onnx.ModelProto, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    out = {}
    for i in model.graph.input:
        shape = [d.dim_value for d in i.type.tensor_type.shape.dim]
        if i.name == "attention_mask":   # the last sequence's second half is padding
            out[i.name] = np.ones(shape, np.int64)
            out[i.name][-1, shape[1] // 2:] = 0
        elif i.type.tensor_type.elem_type == onnx.TensorProto.INT64:
            out[i.name] = rng.integers(0, 100, shape).astype(np.int64)
        else:
            out[i.name] = rng.standard_normal(shape).astype(np.float32)
    return out


def onnxruntime(model: onnx.ModelProto, inputs: dict) -> np.ndarray:
    return onnxruntime_reference(model, inputs)["y"]


def test_fixtures_present():
    assert len(MODELS) == 8, MODELS


@pytest.mark.parametrize("stem", MODELS)
def test_one_attention_kernel_per_layer(stem):
    payload = aicfc.compile(load(stem), precision="fp16")
    kernels = payload["kernels"]
    att = [k for k in kernels if k["family"] == "attention"]
    assert len(att) == LAYERS
    for k in att:
        assert "weighted_streaming_reduction" in k["properties"] and ATTENTION_RULE in k["rewrites"]
        assert k["params"]["unit"] == "mma"                # kᵀ folded: k is read along the head dim
    masked = "mask" in stem                                # a run-time attention_mask input
    if stem.startswith("gpt2") and not masked:
        assert all(k["params"]["causal"] for k in att)     # transformers' per-batch causal mask
    if stem.startswith(("bert", "gpt2")):
        # + one row pass (BERT: the embeddings' LayerNorm; GPT-2: the final ln_f) + the mask's
        # map. GPT-2's tanh-GELU is the c_fc GEMM's epilogue once sink_views has taken Conv1D's
        # view back from between them.
        assert len(kernels) <= 7 * LAYERS + 1 + masked
    if stem.startswith("gpt2"):
        gelu = [k for k in kernels if any("tanh" in n.lower() for n in k["onnx_nodes"])]
        assert len(gelu) == LAYERS and all(k["family"] == "gemm" for k in gelu)
    # every kernel names the property that let it fuse what it covers
    assert all(k["properties"] for k in kernels if len(k["onnx_nodes"]) > 1)


@pytest.mark.parametrize("stem", MODELS)
def test_interpreter_matches_onnxruntime(stem):
    model = load(stem)
    inputs = feeds(model)
    ref = onnxruntime(model, inputs)
    ir = stages(model)
    got = evaluate_ir(ir["plan_memory"], inputs)["y"]
    assert rel_err(got, ref.astype(np.float64)) <= 1e-5


def test_sdpa_rewrites_are_recorded():
    """The scale hoisted out of the MatMul and the kᵀ reshape/transpose chain cancelled."""
    ir = stages(load("bert_sdpa_dynamo_b2"))
    canon = ir["canonicalize"]
    assert not any(n.op == "Mul" and n.output.startswith("val_") for n in canon.nodes
                   if any(m.op == "MatMul" and n.output in m.inputs for m in canon.nodes))
    kinds = [n.op for n in canon.nodes]
    # the merged-batch transpose became a 4-D one of the source; no [B·H, D, S] copy remains
    assert all(len(n.type.shape) == 4 for n in canon.nodes if n.op == "Transpose")
    assert "IsNaN" in kinds
    applied = {r.rule for r in ir["lower"].rewrites if r.applied}
    assert {"MatMul(x·c, y) => MatMul(x, y)·c", "Transpose(merge) => merge(Transpose)"} <= applied


@pytest.mark.gpu
@pytest.mark.parametrize("precision,tol", [("fp32", 1e-4), ("fp16", 1e-2)])
@pytest.mark.parametrize("stem", MODELS)
def test_gpu_matches_onnxruntime(stem, precision, tol, gpu_device):
    model = load(stem)
    inputs = feeds(model, seed=1)
    ref = onnxruntime(model, inputs).astype(np.float64)
    got = run_payload(aicfc.compile(model, target=gpu_device.arch, precision=precision), inputs, gpu_device)["y"]
    assert rel_err(got, ref) <= tol


def test_merge_groups():
    from aicfc.passes.cancel_views import merge_groups
    assert merge_groups((2, 4, 16, 8), (8, 16, 8)) == [[0, 1], [2], [3]]
    assert merge_groups((1, 4, 16, 8), (4, 16, 8)) == [[0, 1], [2], [3]]
    assert merge_groups((2, 4, 16), (2, 4, 16)) == [[0], [1], [2]]
    assert merge_groups((2, 4, 16), (4, 2, 16)) is None      # not a merge of runs
    assert merge_groups((8, 16), (2, 4, 16)) is None          # a split


def test_scale_stays_before_a_matmul_that_feeds_no_softmax():
    """SCALE_RULE moves one scaled operand's scale only towards a softmax (the scores)."""
    from onnx import TensorProto, helper, numpy_helper
    w = numpy_helper.from_array(np.ones((8, 8), np.float32), "w")
    half = numpy_helper.from_array(np.asarray(0.5, np.float32), "half")
    g = helper.make_graph([helper.make_node("Mul", ["x", "half"], ["h"]), helper.make_node("MatMul", ["h", "w"], ["y"])],
                          "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 8])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 8])], [w, half])
    canon = stages(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]))["canonicalize"]
    assert [n.op for n in canon.nodes] == ["Mul", "MatMul"]


@pytest.mark.parametrize("axes,keep", [([2, 3], 1), ([1, 2, 3], 0), ([-2, -1], 0)])
def test_reduce_over_consecutive_axes(axes, keep):
    """torch exports ResNet's global average pool as ReduceMean over [2, 3]: merged into one axis."""
    from onnx import TensorProto, helper, numpy_helper
    x = np.random.default_rng(0).standard_normal((2, 8, 7, 7)).astype(np.float32)
    ref = x.astype(np.float64).mean(axis=tuple(axes), keepdims=bool(keep))
    g = helper.make_graph([helper.make_node("ReduceMean", ["x", "axes"], ["y"], keepdims=keep)], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x.shape))],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(ref.shape))],
                          [numpy_helper.from_array(np.array(axes, np.int64), "axes")])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)])
    assert rel_err(evaluate_ir(stages(model)["plan_memory"], {"x": x})["y"], ref) <= 1e-6
    assert len(aicfc.compile(model)["kernels"]) == 1
