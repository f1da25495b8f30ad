"""Grouped-query attention (issue 18): the K/V head copies of repeat_kv (Unsqueeze, Expand,
Reshape) are read in place by the streaming attention kernel (passes/read_grouped_heads.py),
never stored. CPU: every stage against float64 numpy, one kernel, nvcc builds it for each
unit. GPU (`-m gpu`): 4 query heads over 2 key/value heads on simt, mma and wgmma, against
float64 numpy, arena poisoned.
"""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import aicfc
from aicfc.frontend.onnx_import import import_model
from aicfc.passes.read_grouped_heads import read_grouped_heads
from aicfc.passes.streaming_attention import GQA_RULE
from tests.conftest import run_payload
from tests.onnx_builders import causal_mask
from tests.test_pipeline import evaluate_ir, rel_err, stages

RTOL = {"fp32": 1e-5, "tf32": 5e-3, "fp16": 1e-2, "bf16": 5e-2}


def gqa_model(b: int, h: int, hkv: int, s: int, d: int, layout: bool = True, causal: bool = True) -> onnx.ModelProto:
    """softmax(q·repeat_kv(k)ᵀ/√d + causal)·repeat_kv(v) as transformers exports it; `layout`:
    the result transposed to [B,S,H,D] and merged to [B,S,H·D] (the O-projection's input)."""
    g = h // hkv
    n = helper.make_node
    inits = {"axes": np.array([2], np.int64), "rep": np.array([b, hkv, g, s, d], np.int64),
             "merged": np.array([b, h, s, d], np.int64), "scale": np.array(d ** -0.5, np.float32)}
    nodes = []
    for x in ("k", "v"):
        nodes += [n("Unsqueeze", [x, "axes"], [f"{x}_u"]), n("Expand", [f"{x}_u", "rep"], [f"{x}_e"]),
                  n("Reshape", [f"{x}_e", "merged"], [f"{x}_r"])]
    nodes += [n("Transpose", ["k_r"], ["k_t"], perm=[0, 1, 3, 2]), n("MatMul", ["q", "k_t"], ["s_raw"]),
              n("Mul", ["s_raw", "scale"], ["s"])]
    logits = "s"
    if causal:
        inits["mask"] = causal_mask(s)
        nodes.append(n("Add", ["s", "mask"], ["s_m"]))
        logits = "s_m"
    nodes += [n("Softmax", [logits], ["p"], axis=-1), n("MatMul", ["p", "v_r"], ["o"])]
    out_shape = [b, h, s, d]
    if layout:
        inits["flat"] = np.array([b, s, h * d], np.int64)
        nodes += [n("Transpose", ["o"], ["o_t"], perm=[0, 2, 1, 3]), n("Reshape", ["o_t", "flat"], ["y"])]
        out_shape = [b, s, h * d]
    else:
        nodes[-1] = n("MatMul", ["p", "v_r"], ["y"])
    graph = helper.make_graph(nodes, "gqa", [helper.make_tensor_value_info("q", TensorProto.FLOAT, [b, h, s, d]),
                                             helper.make_tensor_value_info("k", TensorProto.FLOAT, [b, hkv, s, d]),
                                             helper.make_tensor_value_info("v", TensorProto.FLOAT, [b, hkv, s, d])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, out_shape)],
                              [numpy_helper.from_array(a, k) for k, a in inits.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def reference(inputs: dict, h: int, layout: bool, causal: bool) -> np.ndarray:
    q, k, v = (inputs[x].astype(np.float64) for x in "qkv")
    g = h // k.shape[1]
    k, v = np.repeat(k, g, axis=1), np.repeat(v, g, axis=1)
    s = q @ k.transpose(0, 1, 3, 2) / np.sqrt(q.shape[-1])
    if causal:
        s = s + np.triu(np.full(s.shape[-2:], -np.inf), 1)
    p = np.exp(s - s.max(-1, keepdims=True))
    o = (p / p.sum(-1, keepdims=True)) @ v
    return o.transpose(0, 2, 1, 3).reshape(o.shape[0], o.shape[2], -1) if layout else o


def random_inputs(model: onnx.ModelProto, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    return {i.name: rng.standard_normal([d.dim_value for d in i.type.tensor_type.shape.dim]).astype(np.float32)
            for i in model.graph.input}


@pytest.mark.parametrize("layout", [True, False])
def test_heads_read_in_place(layout):
    model = gqa_model(2, 4, 2, 24, 16, layout=layout)
    inputs = random_inputs(model, seed=1)
    ref = reference(inputs, 4, layout, causal=True)
    ir = stages(model)
    for name in ("fold_guarded_moves", "read_grouped_heads", "plan_memory"):
        assert rel_err(evaluate_ir(ir[name], inputs)["y"], ref) <= 1e-5, name
    applied = [r for r in ir["read_grouped_heads"].rewrites if r.rule == GQA_RULE and r.applied]
    assert len(applied) == 1 and "weighted_streaming_reduction" in applied[0].reason
    assert applied[0].bytes_saved == 2 * 2 * (2 * 4 * 24 * 16 * 4)          # K and V copies, written and read
    (kernel,) = ir["plan_memory"].kernels
    assert kernel.family == "attention" and GQA_RULE in kernel.rewrites
    # the attention reads k and v themselves: the model's inputs, not copies
    assert {"k", "v"} <= {ld for op in kernel.ops for ld in _buffers(op)}


def _buffers(op) -> set[str]:
    from aicfc.ir.lowered import loads
    return {ld.buffer for ld in loads(op.body)}


def test_without_broadcast_nothing_changes():
    """Equal head counts (no copies): the rule finds nothing to do and records nothing."""
    model = gqa_model(1, 2, 2, 16, 16)
    p = stages(model)["fold_guarded_moves"]
    assert read_grouped_heads(p) is p


@pytest.mark.parametrize("precision,unit", [("fp32", "simt"), ("fp16", "mma"), ("fp16", "wgmma")])
def test_builds(precision, unit):
    payload = aicfc.compile(gqa_model(1, 4, 2, 80, 64), precision=precision, pin={"unit": unit}, jobs=1)
    (k,) = payload["kernels"]
    assert k["family"] == "attention" and k["params"]["unit"] == unit and GQA_RULE in k["rewrites"]
    assert k["registers"] is not None and k["registers"] <= 255


@pytest.mark.gpu
@pytest.mark.parametrize("precision,unit,layout", [("fp32", "simt", True), ("fp16", "simt", False), ("fp16", "mma", True),
                                                   ("fp16", "mma", False), ("fp16", "wgmma", True), ("bf16", "wgmma", False)])
def test_gpu_gqa(precision, unit, layout, gpu_device):
    if unit == "wgmma" and gpu_device.arch != "sm_90":
        pytest.skip("wgmma is sm_90 only")
    model = gqa_model(2, 4, 2, 130, 64, layout=layout)
    payload = aicfc.compile(model, target=gpu_device.arch, precision=precision, pin={"unit": unit})
    (k,) = payload["kernels"]
    assert k["params"]["unit"] == unit and GQA_RULE in k["rewrites"]
    inputs = random_inputs(model, seed=5)
    got = run_payload(payload, inputs, gpu_device)["y"]
    assert rel_err(got, reference(inputs, 4, layout, causal=True)) <= RTOL[precision]
