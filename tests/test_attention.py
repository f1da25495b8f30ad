"""Streaming attention: the rule "softmax(q@kᵀ·s)@v => streaming_attention" and the `attention`
family.

CPU: where the rule applies (the block example, torch's BERT head-split form, causal masks),
where it declines and why, golden IR text before and after (tests/golden/attention_*;
`AICF_UPDATE_GOLDEN=1 python3 -m pytest tests/test_attention.py` rewrites them), the kernel
count, the plan's computes against a float64 reference, and nvcc builds for sm_90 over head
dimensions, sequence lengths and tile shapes.

GPU (`-m gpu`): fresh random inputs, arena poisoned, against float64 numpy; tolerance on
max|y - ref| / max|ref|: fp16 and bf16 1e-2, fp32 1e-4.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import aicfc
from aicfc.frontend.onnx_import import import_model
from aicfc.ir.decision import parse_plan
from aicfc.ir.high import evaluate_graph
from aicfc.ir.lowered import loads, parse_program
from aicfc.ir.properties import WSR
from aicfc.passes.pipeline import PIPELINE, Options, run_pipeline
from aicfc.passes.streaming_attention import CAUSAL_RULE, RULE, STORE_RULE
from aicfc.planner.hardware import load_profile
from tests import onnx_builders as B
from tests.conftest import check_golden, run_payload
from tests.test_pipeline import evaluate_plan, rel_err

GOLDEN = Path(__file__).parent / "golden"
RTOL = {"fp32": 1e-4, "tf32": 1e-4, "fp16": 1e-2, "bf16": 1e-2}


def plan_of(model, precision: str = "fp32", pin: dict | None = None):
    opts = Options("sm_90", load_profile("sm_90"), precision, tuple(sorted((pin or {}).items())))
    return run_pipeline(import_model(model), opts)


def records(plan, rule: str = RULE):
    return [r for r in plan.rewrites if r.rule == rule]


def attention_kernels(plan):
    return [k for k in plan.kernels if k.family == "attention"]


# ---------------------------------------------------------------- where the rule applies


def test_block_example_attention_is_one_kernel():
    import examples.build_examples as ex
    plan = plan_of(ex.BUILDERS["block"]()).plan
    (k,) = attention_kernels(plan)
    assert [op.out for op in k.ops] == ["scores_raw", "probs.max", "probs.sum", "probs", "attn"]
    assert k.stores == ("attn",)
    assert WSR in k.properties and k.rewrites == (RULE,)
    (rec,) = records(plan)
    assert rec.applied and rec.target == "attn" and rec.bytes_saved == 2 * (16 * 16 * 4) * 2
    # q·k·v (one merged GEMM), out-projection, FFN1, FFN2 stay GEMMs; no row pass is left for the softmax
    assert [kk.family for kk in plan.kernels].count("gemm") == 4 and len(plan.kernels) == 5


@pytest.mark.parametrize("mask", [False, True])
def test_bert_head_split(mask):
    """Reshape [B,S,H,D] + Transpose folded into the accesses (fold_views composes the split
    h·D + d); q, k, v merged into one GEMM with one bias epilogue (merge_contractions), which
    the attention reads at offsets 0, H·D, 2·H·D; the Transpose back is absorbed as a permuted
    store straight into the [B,S,H·D] buffer the Reshape views."""
    result = plan_of(B.bert_attention_model(2, 45, 3, 40, mask=mask), "fp16")
    plan = result.plan
    assert [k.family for k in plan.kernels] == ["gemm", "attention"]
    (k,) = attention_kernels(plan)
    assert k.stores == ("ctx_t",) and k.rewrites[:2] == (RULE, STORE_RULE)
    reads = {ld.buffer for op in k.ops for ld in loads(op.body)}
    assert "q_lin.k_lin.v_lin" in reads and not {"q_4d", "k_4d", "v_4d"} & reads
    assert ("attention_mask" in reads) == mask
    assert k.schedule.param["unit"] == "mma" and k.schedule.param["causal"] == 0


def test_alibi_bias_is_read_inside_the_attention():
    """ALiBi's slope_h · (j - i), computed from constant positions, folds at compile time into one
    constant [1, H, S, S] that the attention kernel reads as an additive bias: one kernel, no add apart."""
    plan = plan_of(B.attention_model(2, 4, 33, 16, causal=True, alibi=True)).plan
    assert len(plan.kernels) == 1
    (k,) = attention_kernels(plan)
    weights = {w.name: w.type.shape for w in plan.weights}
    assert (1, 4, 33, 33) in {weights[ld.buffer] for op in k.ops for ld in loads(op.body) if ld.buffer in weights}


def test_causal_constant_mask_is_detected():
    plan = plan_of(B.attention_model(2, 3, 45, 40, causal=True), "fp16").plan
    (k,) = plan.kernels
    assert k.family == "attention" and k.schedule.param["causal"] == 1
    (rec,) = records(plan, CAUSAL_RULE)
    assert rec.applied and "mask is causal" in rec.reason
    # the mask is not read, so its bytes are not counted as traffic
    pred = dict(k.schedule.predicted)
    assert pred["bytes"] == 4 * 2 * (2 * 3 * 45 * 40)


def test_non_causal_masks_stay_masks():
    """A padding mask input, and a constant mask that is not causal (one entry above the
    diagonal left open), are read by the kernel."""
    plan = plan_of(B.attention_model(2, 3, 45, 40, mask_input=True), "fp16").plan
    assert plan.kernels[0].schedule.param["causal"] == 0 and not records(plan, CAUSAL_RULE)
    model = B.attention_model(1, 2, 33, 32, causal=True)
    mask = next(t for t in model.graph.initializer if t.name == "causal_mask")
    from onnx import numpy_helper
    values = numpy_helper.to_array(mask).copy()
    values[3, 20] = 0.0
    mask.CopyFrom(numpy_helper.from_array(values, "causal_mask"))
    plan = plan_of(model, "fp16").plan
    assert plan.kernels[0].family == "attention" and plan.kernels[0].schedule.param["causal"] == 0


def test_broadcast_batch_of_one():
    """B = 1: the lowering reads size-1 batch dimensions at index 0 instead of their variable."""
    plan = plan_of(B.attention_model(1, 2, 130, 64, causal=True), "bf16").plan
    assert [k.family for k in plan.kernels] == ["attention"]


# ---------------------------------------------------------------- where it declines


@pytest.mark.parametrize("kind,reason", [
    ("probs_output", "the probabilities are also a graph output"),
    ("scores_output", "the scores are read by another op ('scores_relu')"),
])
def test_declines(kind, reason):
    model = B.attention_model(2, 2, 20, 16, **{kind: True})
    plan = plan_of(model).plan
    (rec,) = records(plan)
    assert not rec.applied and rec.reason == reason
    assert not attention_kernels(plan)
    inputs = B.random_inputs(model, seed=3)
    ref = B.run_onnxruntime(model, inputs)
    got = evaluate_plan(plan, inputs)
    for name, r in ref.items():
        assert rel_err(got[name], r) <= 1e-4


def test_not_attention_no_record():
    """A softmax of an input times a matrix is not an attention: nothing matched, nothing said."""
    model = B.single_op_model("Softmax", [(4, 8)], {"axis": -1})
    assert not records(plan_of(model).plan)


# ---------------------------------------------------------------- the rewrite keeps the meaning


CPU_CASES = [
    ("plain", lambda: B.attention_model(2, 3, 45, 40)),
    ("causal", lambda: B.attention_model(1, 2, 33, 16, causal=True)),
    ("mask_input", lambda: B.attention_model(2, 2, 17, 8, mask_input=True)),
    ("cross", lambda: B.attention_model(2, 2, 13, 8, sk=29)),
    ("bert", lambda: B.bert_attention_model(2, 12, 2, 8)),
    ("alibi", lambda: B.attention_model(2, 4, 33, 16, causal=True, alibi=True)),
]


@pytest.mark.parametrize("case_id,build", CPU_CASES, ids=[c for c, _ in CPU_CASES])
def test_plan_matches_onnxruntime(case_id, build):
    model = build()
    inputs = B.random_inputs(model, seed=len(case_id))
    if "mask" in inputs:
        inputs["mask"] = np.where(np.random.default_rng(1).random(inputs["mask"].shape) < 0.3, -1e4, 0.0).astype(np.float32)
    plan = plan_of(model).plan
    assert attention_kernels(plan)
    ref = B.run_onnxruntime(model, inputs)
    got = evaluate_plan(plan, inputs)
    for name, r in ref.items():
        assert rel_err(got[name], r) <= 1e-4


# ---------------------------------------------------------------- golden text




@pytest.mark.parametrize("case", ["causal", "bert"])
def test_golden_before_after(case):
    model = (B.attention_model(1, 2, 8, 4, causal=True) if case == "causal"
             else B.bert_attention_model(1, 6, 2, 4))
    ir = import_model(model)
    opts = Options("sm_90", load_profile("sm_90"))
    stages = {s.name: s for s in PIPELINE}
    for stage in PIPELINE[:[s.name for s in PIPELINE].index("inline_producers") + 1]:
        ir = stage.run(ir, opts)
    before = ir
    after = stages["form_kernels"].run(before, opts)
    check_golden(f"attention_{case}_before.txt", str(before))
    check_golden(f"attention_{case}_after.txt", str(after))
    weights = {w.name: w.data for w in before.weights}
    assert parse_program(str(before), weights) == before
    assert parse_plan(str(after), weights) == after


# ---------------------------------------------------------------- nvcc builds


BUILD_CASES = [(1, 2, 130, d, d % 64 == 0, "fp16") for d in (32, 40, 64, 80, 96, 128)] + [
    (2, 3, 45, 40, False, "bf16"), (1, 1, 1, 64, False, "fp16"), (3, 1, 257, 64, True, "bf16"),
    (2, 3, 45, 40, True, "fp32"), (1, 2, 130, 128, False, "tf32")]


@pytest.mark.parametrize("b,h,s,d,causal,precision", BUILD_CASES,
                         ids=[f"b{b}h{h}s{s}d{d}{'c' if c else ''}-{p}" for b, h, s, d, c, p in BUILD_CASES])
def test_builds_for_sm90(b, h, s, d, causal, precision):
    payload = aicfc.compile(B.attention_model(b, h, s, d, causal=causal), precision=precision, jobs=1)
    (k,) = payload["kernels"]
    assert k["family"] == "attention"
    if precision in ("fp16", "bf16"):   # sm_90 also offers wgmma where D is a multiple of 64
        # and the split-KV unit where a head has few query rows (codegen/attention_split.py)
        few = {"split"} if s <= 4 and not causal else set()
        assert k["params"]["unit"] in ({"mma", "wgmma"} if d % 64 == 0 else {"mma"}) | few
    else:
        assert k["params"]["unit"] == "simt"
    assert k["params"]["causal"] == int(causal)
    assert k["registers"] is not None and k["registers"] <= 255


TILES = [{"BM": 64, "BN": 32, "warps": 4}, {"BM": 64, "BN": 128, "warps": 4}, {"BM": 128, "BN": 64, "warps": 4},
         {"BM": 128, "BN": 64, "warps": 8}, {"BM": 128, "BN": 128, "warps": 8}]
SIMT_TILES = [{"BM": 16, "BN": 32, "TPR": 4}, {"BM": 32, "BN": 64, "TPR": 8}, {"BM": 64, "BN": 64, "TPR": 16}]


@pytest.mark.parametrize("pin", TILES + SIMT_TILES, ids=lambda t: "-".join(f"{a}{b}" for a, b in t.items()))
def test_tile_shapes_build(pin):
    unit = "mma" if "warps" in pin else "simt"
    payload = aicfc.compile(B.attention_model(1, 2, 77, 64, causal=True), precision="fp16",
                            pin={"unit": unit, **pin}, jobs=1)
    (k,) = payload["kernels"]
    assert {a: k["params"][a] for a in pin} == pin and k["registers"] <= 255


# ---------------------------------------------------------------- on the GPU


def _check(model, precision, device, seed, pin=None, mask_fill=None):
    payload = aicfc.compile(model, target=device.arch, precision=precision, pin=pin)
    assert [k["family"] for k in payload["kernels"]].count("attention") == 1
    graph = import_model(model, None)
    rng = np.random.default_rng(seed)
    inputs = {v.name: rng.standard_normal(v.type.shape).astype(np.float32) for v in graph.inputs}
    if "mask" in inputs:
        inputs["mask"] = np.where(rng.random(inputs["mask"].shape) < 0.3, -1e4, 0.0).astype(np.float32)
    if "attention_mask" in inputs:
        inputs["attention_mask"] = (rng.random(inputs["attention_mask"].shape) < 0.8).astype(np.float32)
    (name,) = [o.name for o in model.graph.output]
    ref = evaluate_graph(graph, inputs, dtype=np.float64)[name]
    got = run_payload(payload, inputs, device)[name]
    err = rel_err(got, ref)
    assert err <= RTOL[precision], f"{precision} {pin}: rel err {err:.2e}"
    return err


GPU_CASES = [
    # (b, h, s, d, causal, precision)
    (2, 3, 45, 40, False, "fp16"), (2, 3, 45, 40, True, "fp16"), (1, 2, 130, 128, False, "fp16"),
    (1, 2, 130, 128, True, "bf16"), (2, 4, 130, 64, True, "fp16"), (1, 3, 257, 80, False, "bf16"),
    (2, 2, 64, 96, True, "fp16"), (1, 12, 512, 64, False, "fp16"), (1, 2, 1, 64, False, "fp16"),
    (2, 3, 45, 40, False, "fp32"), (2, 3, 45, 40, True, "fp32"), (1, 2, 130, 128, True, "fp32"),
    (1, 2, 130, 64, False, "tf32"),
]


@pytest.mark.gpu
@pytest.mark.parametrize("b,h,s,d,causal,precision", GPU_CASES,
                         ids=[f"b{b}h{h}s{s}d{d}{'c' if c else ''}-{p}" for b, h, s, d, c, p in GPU_CASES])
def test_gpu_attention(b, h, s, d, causal, precision, gpu_device):
    _check(B.attention_model(b, h, s, d, causal=causal), precision, gpu_device, seed=b * s + d)


@pytest.mark.gpu
@pytest.mark.parametrize("precision", ["fp16", "bf16", "fp32"])
@pytest.mark.parametrize("pin", TILES + SIMT_TILES, ids=lambda t: "-".join(f"{a}{b}" for a, b in t.items()))
def test_gpu_tile_shapes(pin, precision, gpu_device):
    unit = "mma" if "warps" in pin else "simt"
    if unit == "mma" and precision == "fp32":
        pytest.skip("no tensor-core attention under fp32")
    for causal in (False, True):
        _check(B.attention_model(1, 2, 200, 64, causal=causal), precision, gpu_device, seed=7, pin={"unit": unit, **pin})


@pytest.mark.gpu
@pytest.mark.parametrize("precision", ["fp16", "bf16", "fp32"])
def test_gpu_masks_and_cross(precision, gpu_device):
    _check(B.attention_model(2, 3, 45, 40, mask_input=True), precision, gpu_device, seed=11)
    _check(B.attention_model(2, 2, 45, 64, sk=130), precision, gpu_device, seed=12)


@pytest.mark.gpu
@pytest.mark.parametrize("precision", ["fp32", "fp16", "bf16"])
def test_gpu_alibi_bias(precision, gpu_device):
    """ALiBi's folded [1, H, S, S] bias read inside the kernel, causal, head dims 16 and 64."""
    _check(B.attention_model(2, 4, 33, 16, causal=True, alibi=True), precision, gpu_device, seed=13)
    _check(B.attention_model(1, 4, 130, 64, causal=True, alibi=True), precision, gpu_device, seed=14)


@pytest.mark.gpu
@pytest.mark.parametrize("precision", ["fp16", "bf16", "fp32"])
@pytest.mark.parametrize("mask", [False, True])
def test_gpu_bert_head_split(mask, precision, gpu_device):
    _check(B.bert_attention_model(2, 45, 3, 40, seed=4, mask=mask), precision, gpu_device, seed=5)
    _check(B.bert_attention_model(1, 128, 4, 64, seed=6, mask=mask), precision, gpu_device, seed=7)
