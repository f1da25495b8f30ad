"""SwiGLU's silu(x·Wg)·(x·Wu) as one GEMM (issue 18): merge_contractions puts Wg and Wu side
by side, interleave_gates interleaves their columns, and the GEMM's gated epilogue computes
each output from one thread's column pair (codegen/gemm.py `gated`). CPU: every stage against
float64 numpy, one kernel, nvcc builds it on each unit. GPU (`-m gpu`): each unit against
float64 numpy, arena poisoned.
"""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import aicfc
from aicfc.passes.interleave_gates import GATE_RULE, interleave_gates
from tests.conftest import run_payload
from tests.test_pipeline import evaluate_ir, rel_err, stages

RTOL = {"fp32": 1e-5, "tf32": 5e-3, "fp16": 1e-2, "bf16": 5e-2}


def swiglu_model(s: int, hidden: int, inter: int, seed: int = 0) -> onnx.ModelProto:
    """y = silu(x·Wg)·(x·Wu) on x [1,S,hidden] (as the dynamo export writes SiLU: x·Sigmoid(x))."""
    rng = np.random.default_rng(seed)
    inits = {"wg": rng.standard_normal((hidden, inter)).astype(np.float32) / np.sqrt(hidden),
             "wu": rng.standard_normal((hidden, inter)).astype(np.float32) / np.sqrt(hidden)}
    n = helper.make_node
    nodes = [n("MatMul", ["x", "wg"], ["g"]), n("MatMul", ["x", "wu"], ["u"]), n("Sigmoid", ["g"], ["sg"]),
             n("Mul", ["g", "sg"], ["silu"]), n("Mul", ["silu", "u"], ["y"])]
    graph = helper.make_graph(nodes, "swiglu", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, s, hidden])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, s, inter])],
                              [numpy_helper.from_array(a, k) for k, a in inits.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def reference(model: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    w = {i.name: numpy_helper.to_array(i).astype(np.float64) for i in model.graph.initializer}
    g, u = x.astype(np.float64) @ w["wg"], x.astype(np.float64) @ w["wu"]
    return g / (1 + np.exp(-g)) * u


def test_one_gemm_every_stage():
    model = swiglu_model(24, 32, 48)
    x = np.random.default_rng(1).standard_normal((1, 24, 32)).astype(np.float32)
    ref = reference(model, x)
    ir = stages(model)
    for name in ("fold_guarded_moves", "interleave_gates", "plan_memory"):
        assert rel_err(evaluate_ir(ir[name], {"x": x})["y"], ref) <= 1e-5, name
    applied = [r for r in ir["interleave_gates"].rewrites if r.rule == GATE_RULE and r.applied]
    assert len(applied) == 1 and "tile_compatible_compute" in applied[0].reason
    assert applied[0].bytes_saved == 2 * 24 * 96 * 4
    (kernel,) = ir["plan_memory"].kernels
    assert kernel.family == "gemm" and GATE_RULE in kernel.rewrites
    assert rel_err(evaluate_ir(stages(model, "fp16")["plan_memory"], {"x": x})["y"], ref) <= 1e-2


def test_declined_when_the_weight_is_an_input():
    """Columns of a run-time operand cannot be reordered at compile time: recorded, not applied."""
    n = helper.make_node
    nodes = [n("MatMul", ["x", "w"], ["c"]), n("Split", ["c"], ["g", "u"], axis=-1, num_outputs=2),
             n("Sigmoid", ["g"], ["sg"]), n("Mul", ["g", "sg"], ["silu"]), n("Mul", ["silu", "u"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 8]),
                                           helper.make_tensor_value_info("w", TensorProto.FLOAT, [8, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 8])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    ir = stages(model)
    recs = [r for r in ir["interleave_gates"].rewrites if r.rule == GATE_RULE]
    assert recs and not any(r.applied for r in recs) and "not a constant weight" in recs[0].reason
    rng = np.random.default_rng(2)
    x, w = rng.standard_normal((4, 8)).astype(np.float32), rng.standard_normal((8, 16)).astype(np.float32)
    c = x.astype(np.float64) @ w
    ref = c[:, :8] / (1 + np.exp(-c[:, :8])) * c[:, 8:]
    assert rel_err(evaluate_ir(ir["plan_memory"], {"x": x, "w": w})["y"], ref) <= 1e-5


def test_nothing_to_pair():
    p = stages(swiglu_model(8, 16, 16))["fold_guarded_moves"]
    q = interleave_gates(p)
    assert interleave_gates(q.replace(rewrites=())).rewrites == ()   # already paired: no match again


@pytest.mark.parametrize("precision,unit", [("fp32", "simt"), ("fp16", "simt"), ("fp16", "mma"), ("fp16", "wgmma")])
def test_builds(precision, unit):
    payload = aicfc.compile(swiglu_model(100, 64, 192), precision=precision, pin={"unit": unit}, jobs=1)
    (k,) = payload["kernels"]
    assert k["family"] == "gemm" and k["params"]["unit"] == unit and GATE_RULE in k["rewrites"]
    assert k["registers"] is not None and k["registers"] <= 255


@pytest.mark.gpu
@pytest.mark.parametrize("precision,unit", [("fp32", "simt"), ("fp16", "simt"), ("fp16", "mma"), ("bf16", "mma"),
                                            ("fp16", "wgmma"), ("bf16", "wgmma")])
def test_gpu_swiglu(precision, unit, gpu_device):
    if unit == "wgmma" and gpu_device.arch != "sm_90":
        pytest.skip("wgmma is sm_90 only")
    model = swiglu_model(200, 256, 704, seed=3)
    payload = aicfc.compile(model, target=gpu_device.arch, precision=precision, pin={"unit": unit})
    (k,) = payload["kernels"]
    assert k["params"]["unit"] == unit and GATE_RULE in k["rewrites"]
    x = np.random.default_rng(4).standard_normal((1, 200, 256)).astype(np.float32)
    got = run_payload(payload, {"x": x}, gpu_device)["y"]
    assert rel_err(got, reference(model, x)) <= RTOL[precision]
