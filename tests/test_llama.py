"""Llama-family decoders (issue 18): real dynamo exports of Llama, Qwen2 and Mistral with
grouped-query attention (tests/fixtures/llama, written by make_llama.py), and the exporter's
graph at realistic size (tests/llama_graph.py: hidden 1024, 16 heads over 4 key/value heads,
512 tokens, the rotary tables as run-time Cos/Sin of constant angles).

Per decoder layer at fp16: RMSNorm, QKV with the rotary embedding of q and k as its epilogue
(rotate_half's slices read from the QKV result through a split view: rule GUARDED_RULE; then
restated over the QKV columns, a head's halves in one thread: ROTARY_RULE), attention (the K/V
head copies of repeat_kv read in place: rule GQA_RULE), O-proj + residual, RMSNorm, gate/up with
SiLU·mul as its gated epilogue (rule GATE_RULE), down + residual: 7 kernels (16 before the
guarded-move rule, 12 before GQA_RULE, 10 before GATE_RULE, 9 before ROTARY_RULE), plus the
final norm. The rotary epilogue is a cost decision (planner/cost_rotary.py): it is chosen for every
graph here (the S16 fixtures, the 1024-wide S512 graph at B1; tests/test_cost_rotary.py holds the
B8 S512 figures and a profile under which it is declined). At fp32 no tensor-core tile runs the GEMMs, and SIMT threads never hold both halves
of a head: the rotary maps stay two kernels of their own there (9 a layer).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import aicfc
from aicfc.ir.lowered import Affine
from aicfc.passes.fold_guarded_moves import GUARDED_RULE, split_access
from aicfc.passes.interleave_gates import GATE_RULE
from aicfc.passes.rotary_epilogue import ROTARY_RULE
from aicfc.passes.streaming_attention import GQA_RULE
from benchmarks.light_models import onnxruntime_reference
from tests.conftest import run_payload
from tests.llama_graph import llama_model
from tests.test_pipeline import evaluate_ir, rel_err, stages

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "llama"
MODELS = sorted(p.stem for p in FIXTURES.glob("*.onnx"))
LAYERS = 2
KERNELS_PER_LAYER = {"fp32": 9, "fp16": 7}
# Mistral's single key/value head is a size-1 broadcast, an affine access read in place already
GROUPED = {"llama_dynamo_s16": True, "qwen2_dynamo_s16": True, "mistral_dynamo_s16": False}
TOLERANCE = {"fp32": 1e-4, "fp16": 1e-2}


def load(stem: str) -> onnx.ModelProto:
    return onnx.load(str(FIXTURES / f"{stem}.onnx"))


def feeds(model: onnx.ModelProto, seed: int) -> dict[str, np.ndarray]:
    shape = [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
    return {"input_ids": np.random.default_rng(seed).integers(0, 64, shape).astype(np.int64)}


def test_fixtures_present():
    assert MODELS == ["llama_dynamo_s16", "mistral_dynamo_s16", "qwen2_dynamo_s16"]
    assert all((FIXTURES / f"{m}.onnx").stat().st_size < 300_000 for m in MODELS)


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
@pytest.mark.parametrize("stem", MODELS)
def test_interpreter_matches_onnxruntime(stem, precision):
    model = load(stem)
    inputs = feeds(model, seed=0)
    ref = onnxruntime_reference(model, inputs)["y"].astype(np.float64)
    got = evaluate_ir(stages(model, precision)["plan_memory"], inputs)["y"]
    assert rel_err(got, ref) <= TOLERANCE[precision]


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
@pytest.mark.parametrize("stem", MODELS)
def test_kernels_per_layer(stem, precision):
    kernels = aicfc.compile(load(stem), precision=precision)["kernels"]
    assert len(kernels) == KERNELS_PER_LAYER[precision] * LAYERS + 1          # + the final norm
    families = [k["family"] for k in kernels]
    assert families.count("attention") == LAYERS and families.count("row_reduce") == 2 * LAYERS + 1
    # rotate_half's slices are part of the rotary maps, one per q and k, none stored apart
    assert not any(any("slice" in n or "neg" in n for n in k["onnx_nodes"]) and len(k["onnx_nodes"]) <= 3
                   for k in kernels)
    rotary = [k for k in kernels if any(n.startswith("node_cat") for n in k["onnx_nodes"])]
    assert all(any(n.startswith("node_neg") for n in k["onnx_nodes"]) for k in rotary)
    if precision == "fp16":   # one QKV GEMM a layer, q and k rotated in its epilogue
        assert len(rotary) == LAYERS and all(k["family"] == "gemm" and ROTARY_RULE in k["rewrites"] for k in rotary)
    else:
        assert len(rotary) == 2 * LAYERS and not any(ROTARY_RULE in k["rewrites"] for k in kernels)
    assert all(k["properties"] for k in kernels if len(k["onnx_nodes"]) > 1)
    assert sum(GATE_RULE in k["rewrites"] for k in kernels) == LAYERS     # SwiGLU in the gate/up GEMM
    assert not any(k["family"] == "pointwise" and any(n.startswith("node_silu") for n in k["onnx_nodes"]) for k in kernels)
    attention = [k for k in kernels if k["family"] == "attention"]
    assert all((GQA_RULE in k["rewrites"]) == GROUPED[stem] for k in attention)
    assert not any(any(n.startswith("node_expand") for n in k["onnx_nodes"]) for k in kernels if k["family"] != "attention")


def test_rotary_rule_is_recorded():
    ir = stages(load("llama_dynamo_s16"))
    applied = [r for r in ir["fold_guarded_moves"].rewrites if r.rule == GUARDED_RULE and r.applied]
    assert len(applied) == 4 * LAYERS                               # slice and neg, of q and of k
    assert all("rematerializable_intermediate" in r.reason for r in applied)


def test_synthetic_graph_matches_onnxruntime():
    """The builder's graph (run-time Cos/Sin of the angles) at a small size, both precisions."""
    model = llama_model(64, 4, 2, 32, 64, layers=2)
    onnx.checker.check_model(model)
    inputs = feeds(model, seed=3)
    ref = onnxruntime_reference(model, inputs)["y"].astype(np.float64)
    for precision in ("fp32", "fp16"):
        ir = stages(model, precision)
        assert not any(n.op in ("Cos", "Sin") for n in ir["dce"].nodes)       # folded: static positions
        assert rel_err(evaluate_ir(ir["plan_memory"], inputs)["y"], ref) <= TOLERANCE[precision]


def test_realistic_size_compiles():
    """hidden 1024, 16 heads over 4 key/value heads, 512 tokens: refused before Cos and Sin."""
    model = llama_model(1024, 16, 4, 512, 2816, layers=1)
    assert sum(n.op_type in ("Cos", "Sin") for n in model.graph.node) == 2
    kernels = aicfc.compile(model, precision="fp16")["kernels"]
    assert len(kernels) == KERNELS_PER_LAYER["fp16"] + 1
    (att,) = [k for k in kernels if k["family"] == "attention"]
    assert GQA_RULE in att["rewrites"] and att["params"]["unit"] in ("mma", "wgmma")
    (gate,) = [k for k in kernels if GATE_RULE in k["rewrites"]]
    assert gate["params"]["unit"] in ("mma", "wgmma")


def test_runtime_cos_sin_compile():
    """Cos and Sin of a run-time input are maps (cosf/sinf), built by nvcc."""
    g = helper.make_graph([helper.make_node("Cos", ["x"], ["c"]), helper.make_node("Sin", ["x"], ["s"]),
                           helper.make_node("Mul", ["c", "s"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 33])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 33])])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)])
    x = np.random.default_rng(0).standard_normal((4, 33)).astype(np.float32) * 4
    ref = np.cos(x.astype(np.float64)) * np.sin(x.astype(np.float64))
    assert rel_err(evaluate_ir(stages(model)["plan_memory"], {"x": x})["y"], ref) <= 1e-6
    kernels = aicfc.compile(model)["kernels"]
    assert len(kernels) == 1 and kernels[0]["family"] == "pointwise"


def test_split_access():
    ext = {"i1": 4, "i2": 16, "i3": 8}
    # a head slice's second half: column 16·head + d + 8 of 128
    shape, index, where = split_access((Affine.var("i2"), Affine.of({"i1": 16, "i3": 1}, 8)), (16, 128), ext,
                                       {"i3": 8})
    assert shape == (16, 8, 2, 8) and where == {"i2": 0, "i1": 1, "i3": 3}
    assert [str(a) for a in index] == ["i2", "i1", "1", "i3"]
    # Q of a merged QKV of 96 columns (4 heads of 16, then K and V of one head each)
    shape, index, where = split_access((Affine.of({"i1": 16, "i3": 1}),), (96,), ext, {"i3": 8})
    assert shape == (6, 2, 8) and [str(a) for a in index] == ["i1", "0", "i3"]
    # a carry (d + 4 crosses the digit of radix 8), and a guarded digit that is not the variable's own
    assert split_access((Affine.of({"i1": 16, "i3": 1}, 4),), (128,), ext, {"i3": 8}) is None
    assert split_access((Affine.of({"i1": 16, "i3": 2}),), (128,), {"i1": 4, "i3": 8}, {"i3": 4}) is None


@pytest.mark.gpu
@pytest.mark.parametrize("precision", ["fp32", "fp16"])
@pytest.mark.parametrize("stem", MODELS)
def test_gpu_matches_onnxruntime(stem, precision, gpu_device):
    model = load(stem)
    inputs = feeds(model, seed=1)
    ref = onnxruntime_reference(model, inputs)["y"].astype(np.float64)
    got = run_payload(aicfc.compile(model, target=gpu_device.arch, precision=precision), inputs, gpu_device)["y"]
    assert rel_err(got, ref) <= TOLERANCE[precision]


# Head dimension 64 (a rotation partner 4 column blocks away in a thread's fragments), 8 query
# heads over 2 key/value heads; the rotary QKV GEMM on each tensor-core unit and epilogue form:
# mma's column pairs, with and without split-k; wgmma cooperative (its pick: the staged tile),
# register stores and ping-pong. (A pin holds for every kernel: OUT=2 is not one, the gated gate/up GEMM cannot stage.)
ROTARY_PINS = [{"unit": "mma", "SPLITK": 1}, {"unit": "mma", "SPLITK": 2}, {"unit": "wgmma", "PP": 0},
               {"unit": "wgmma", "OUT": 0}, {"unit": "wgmma", "PP": 1}]


def _rotary_model() -> onnx.ModelProto:
    return llama_model(512, 8, 2, 128, 1024, layers=1)


def _pinned_rotary(payload: dict, pin: dict) -> dict:
    (qkv,) = [k for k in payload["kernels"] if ROTARY_RULE in k["rewrites"]]
    assert all(qkv["params"][key] == value for key, value in pin.items()), qkv["params"]
    return qkv


@pytest.mark.parametrize("pin", ROTARY_PINS[:1] + ROTARY_PINS[2:3], ids=lambda p: "-".join(f"{k}{v}" for k, v in p.items()))
def test_rotary_epilogue_pins_compile(pin):
    payload = aicfc.compile(_rotary_model(), precision="fp16", pin=pin)
    assert len(payload["kernels"]) == KERNELS_PER_LAYER["fp16"] + 1
    qkv = _pinned_rotary(payload, pin)
    assert qkv["family"] == "gemm" and any(n.startswith("node_neg") for n in qkv["onnx_nodes"])


@pytest.mark.gpu
@pytest.mark.parametrize("pin", ROTARY_PINS, ids=lambda p: "-".join(f"{k}{v}" for k, v in p.items()))
def test_gpu_rotary_epilogue_matches_onnxruntime(pin, gpu_device):
    model = _rotary_model()
    inputs = {"input_ids": np.random.default_rng(7).integers(0, 64, (1, 128)).astype(np.int64)}
    ref = onnxruntime_reference(model, inputs)["y"].astype(np.float64)
    payload = aicfc.compile(model, target=gpu_device.arch, precision="fp16", pin=pin)
    _pinned_rotary(payload, pin)
    assert rel_err(run_payload(payload, inputs, gpu_device)["y"], ref) <= TOLERANCE["fp16"]


def _kernel_source(source: str, name: str) -> str:
    """One kernel's text out of a rendered module (from its entry to the next one's)."""
    start = source.index(f" {name}(")
    nxt = source.find("__global__", start)
    return source[start:nxt if nxt > 0 else len(source)]


@pytest.mark.parametrize("pin", ROTARY_PINS[:1] + ROTARY_PINS[2:], ids=lambda p: "-".join(f"{k}{v}" for k, v in p.items()))
def test_rotary_epilogue_code_is_cheap(pin):
    """The rotary epilogue's head digits come from the tile's head-aligned column `rb` and the unrolled
    block `rc` (no per-element division of the column), and its range bands are guards, not reads
    ([Note: rotary bands]); the attention's 1/sqrt(D) is folded into its exp2 factor."""
    import re
    from aicfc.codegen.module import render_module
    from aicfc.ir.properties import ROTARY_BAND
    from tests.test_pipeline import stages
    plan = stages(_rotary_model(), "fp16", pin)["plan_memory"]
    source = render_module(plan)
    (qkv,) = [k for k in plan.kernels if k.ops[-1].out.endswith(".rotary")]
    text = _kernel_source(source, qkv.name)
    assert "rb = n0" in text and "rc = " in text
    assert not re.search(r"\(gn1? [/%] \d+\)", text), "a per-element division of the column"
    bands = [w.name for w in plan.weights if ROTARY_BAND in w.name]
    assert len(bands) == 4                   # the q and k heads' ranges, and the two halves
    flags = re.findall(r"const bool\* __restrict__ (p\d+)", text)
    assert flags and not any(f"{f}[" in text for f in flags), "a band read from memory"
    (att,) = [k for k in plan.kernels if k.family == "attention"]
    text = _kernel_source(source, att.name)
    assert "float x = s_raw" in text and "0.18033" in text      # (1/8)·log2 e at D = 64
