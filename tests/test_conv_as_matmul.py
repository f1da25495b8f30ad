"""Pointwise convolutions as batched MatMuls (passes/conv_as_matmul.py), and the residual
bottleneck around them planned as GEMMs with their epilogues (sink_views reads the residual
through a merge view, and lets a map whose readers are convolutions run over the GEMM's shape)."""
from __future__ import annotations

import math

import numpy as np
import onnx
import pytest
from onnx import helper

from aicfc.frontend.onnx_import import import_model
from aicfc.ir.high import evaluate_graph
from aicfc.passes.conv_as_matmul import POINTWISE_CONV_RULE
from aicfc.passes.pipeline import Options, run_pipeline
from aicfc.planner.hardware import load_profile
from tests import onnx_builders as B
from tests.test_conv import _gpu_check
from tests.test_pipeline import evaluate_ir, rel_err

BN_RULE = "Conv + BatchNormalization => Conv with folded weights"


def bottleneck_model(n: int = 2, c: int = 32, mid: int = 16, hw: int = 6, seed: int = 0) -> onnx.ModelProto:
    """ResNet's bottleneck: 1x1 → BN → Relu → 3x3 (pad 1) → BN → Relu → 1x1 → BN, + a strided-free
    1x1 projection of the input (→ BN), the sum → Relu; then a second block on the first's output,
    whose residual is the first block's stored output."""
    rng = np.random.default_rng(seed)
    inits, nodes = {}, []

    def conv_bn(x: str, cin: int, cout: int, k: int, name: str, relu: bool) -> str:
        inits[f"{name}.w"] = (rng.standard_normal((cout, cin, k, k)) / math.sqrt(cin * k * k)).astype(np.float32)
        for p, v in (("s", 1 + 0.1 * rng.standard_normal(cout)), ("t", 0.1 * rng.standard_normal(cout)),
                     ("m", 0.1 * rng.standard_normal(cout)), ("v", rng.uniform(0.5, 1.5, cout))):
            inits[f"{name}.{p}"] = v.astype(np.float32)
        nodes.append(helper.make_node("Conv", [x, f"{name}.w"], [f"{name}.c"], name=f"{name}_conv",
                                      pads=[k // 2] * 4, kernel_shape=[k, k]))
        nodes.append(helper.make_node("BatchNormalization", [f"{name}.c", f"{name}.s", f"{name}.t", f"{name}.m",
                                                             f"{name}.v"], [f"{name}.n"], name=f"{name}_bn"))
        if not relu:
            return f"{name}.n"
        nodes.append(helper.make_node("Relu", [f"{name}.n"], [f"{name}.r"], name=f"{name}_relu"))
        return f"{name}.r"

    def block(x: str, cin: int, name: str, project: bool) -> str:
        h = conv_bn(x, cin, mid, 1, f"{name}a", True)
        h = conv_bn(h, mid, mid, 3, f"{name}b", True)
        h = conv_bn(h, mid, c, 1, f"{name}c", False)
        skip = conv_bn(x, cin, c, 1, f"{name}p", False) if project else x
        nodes.append(helper.make_node("Add", [h, skip], [f"{name}.sum"], name=f"{name}_add"))
        nodes.append(helper.make_node("Relu", [f"{name}.sum"], [f"{name}.out"], name=f"{name}_out"))
        return f"{name}.out"

    y = block(block("in0", c // 2, "b1", True), c, "b2", False)
    nodes.append(helper.make_node("Identity", [y], ["out"], name="out"))
    model = B._graph_model(nodes, "bottleneck", {"in0": (n, c // 2, hw, hw)}, {}, inits)
    return B._infer_output(model)


def _plan(model, precision="fp32"):
    return run_pipeline(import_model(model, None), Options("sm_90", load_profile("sm_90"), precision)).plan


def test_pointwise_conv_becomes_a_matmul_with_its_record():
    model = B.conv_model((2, 8, 5, 5), (6, 8, 1, 1), bn=True, act="relu")
    plan = _plan(model)
    (k,) = plan.kernels
    assert k.family == "gemm" and k.rewrites == ("contraction + map => gemm epilogue",)
    rules = {r.rule for r in plan.rewrites if r.applied}
    assert {POINTWISE_CONV_RULE, BN_RULE} <= rules


@pytest.mark.parametrize("attrs", [{"strides": [2, 2]}, {"pads": [1, 1, 1, 1]}, {"group": 2}],
                         ids=["strided", "padded", "grouped"])
def test_other_1x1_convolutions_stay_convolutions(attrs):
    model = B.conv_model((1, 8, 6, 6), (8, 8 // attrs.get("group", 1), 1, 1), **attrs)
    (k,) = _plan(model).kernels
    assert k.family == "conv"
    assert POINTWISE_CONV_RULE not in {r.rule for r in _plan(model).rewrites}


def test_bottleneck_is_gemms_with_residual_epilogues():
    """Two bottleneck blocks: every pointwise conv a GEMM, the sums and their Relus in the last
    GEMM's epilogue (no element-wise kernel), the 3x3 convs reading the GEMMs' outputs as stored."""
    plan = _plan(bottleneck_model())
    families = [k.family for k in plan.kernels]
    assert families.count("conv") == 2 and "pointwise" not in families, families
    assert families.count("gemm") == 5, families
    # each block's sum and Relu run in a GEMM's epilogue (block 1: the projection's, reading the
    # other 1x1's stored product; block 2: the last 1x1's, reading block 1's output as residual)
    outs = [k for k in plan.kernels if any(s.startswith(("b1.out", "out")) for s in k.stores)]
    assert len(outs) == 2 and all(k.family == "gemm" and k.rewrites for k in outs)


@pytest.mark.parametrize("precision,tol", [("fp32", 1e-4), ("fp16", 1e-2)])
def test_bottleneck_every_stage_matches_onnxruntime(precision, tol):
    model = bottleneck_model()
    inputs = B.random_inputs(model, seed=np.random.default_rng().integers(1 << 30))
    ref = B.run_onnxruntime(model, inputs)["out"]
    result = run_pipeline(import_model(model, None), Options("sm_90", load_profile("sm_90"), precision))
    for ir in (result.high, result.lowered, result.plan):
        got = evaluate_ir(ir, inputs)["out"]
        assert np.isfinite(got).all() and rel_err(got, ref) <= tol, type(ir).__name__


@pytest.mark.gpu
@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_gpu_bottleneck(precision, gpu_device):
    _gpu_check(bottleneck_model(n=4, c=64, mid=32, hw=14), precision, gpu_device)


def squeeze_excite_model(n: int = 4, c: int = 32, s: int = 8, hw: int = 5, seed: int = 0) -> onnx.ModelProto:
    """A squeeze-excite block (EfficientNet's): global mean → 1x1 conv (bias) → SiLU → 1x1 conv (bias) →
    Sigmoid, scaling the input channel by channel."""
    rng = np.random.default_rng(seed)
    inits = {"w1": (rng.standard_normal((s, c, 1, 1)) / math.sqrt(c)).astype(np.float32),
             "b1": (0.1 * rng.standard_normal(s)).astype(np.float32),
             "w2": (rng.standard_normal((c, s, 1, 1)) / math.sqrt(s)).astype(np.float32),
             "b2": (0.1 * rng.standard_normal(c)).astype(np.float32)}
    nodes = [helper.make_node("ReduceMean", ["in0"], ["m"], axes=[2, 3], keepdims=1, name="mean"),   # opset 13
             helper.make_node("Conv", ["m", "w1", "b1"], ["c1"], name="fc1"),
             helper.make_node("Sigmoid", ["c1"], ["s1"], name="sig1"), helper.make_node("Mul", ["c1", "s1"], ["a1"], name="silu"),
             helper.make_node("Conv", ["a1", "w2", "b2"], ["c2"], name="fc2"),
             helper.make_node("Sigmoid", ["c2"], ["g"], name="gate"), helper.make_node("Mul", ["in0", "g"], ["out"], name="scale")]
    return B._infer_output(B._graph_model(nodes, "se", {"in0": (n, c, hw, hw)}, {}, inits))


def test_squeeze_excite_fcs_take_the_images_as_rows():
    """Where every image has one position (after a global pool) a pointwise conv is one GEMM of N
    rows ([N, C] @ W^T), not N products of one row each; the block matches float64 at every stage."""
    model = squeeze_excite_model()
    result = run_pipeline(import_model(model, None), Options("sm_90", load_profile("sm_90"), "fp32"))
    mms = [n for n in result.high.nodes if n.op == "MatMul"]
    assert len(mms) == 2 and all(len(n.type.shape) == 2 and n.type.shape[0] == 4 for n in mms), [n.type for n in mms]
    assert POINTWISE_CONV_RULE in {r.rule for r in result.plan.rewrites if r.applied}
    inputs = B.random_inputs(model, seed=np.random.default_rng().integers(1 << 30))
    ref = evaluate_graph(import_model(model, None), inputs, dtype=np.float64)["out"]
    for ir in (result.high, result.lowered, result.plan):
        got = evaluate_ir(ir, inputs)["out"]
        assert np.isfinite(got).all() and rel_err(got, ref) <= 1e-5, type(ir).__name__


@pytest.mark.gpu
@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_gpu_squeeze_excite(precision, gpu_device):
    _gpu_check(squeeze_excite_model(n=32, c=1152, s=48, hw=7), precision, gpu_device)
