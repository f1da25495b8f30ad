"""The `gemv` unit of the gemm family (codegen/gemm_gemv.py): contractions of at most 8 rows
streamed from the weight, split-k with the last split reducing.

Without a GPU: where it applies (rows = batch x M <= 8, fp16/bf16, the weight contiguous along
n) and where it is declined with the reason; that a decode step's projections choose it by
cost; that its CUDA compiles for sm_90 without local-memory spills. On the GPU (`gpu`): every
pinned variant against numpy float64 (fp16/bf16: 1e-2 of the output's max), epilogues included
(bias and ReLU, a residual add, SwiGLU pairs via the Llama decode fixture in
tests/test_generate_gpu.py), and a second run on the same executor gives the same bits (the
split-k tickets are zero again).
"""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import aicfc
from aicfc.codegen import gemm, gemm_gemv
from aicfc.frontend.onnx_import import import_model
from aicfc.ir.high import evaluate_graph
from tests.test_pipeline import rel_err
from tests.test_state import plan_of


def rows_model(batch: int, k: int, n: int, rng, bias: bool = False, residual: bool = False) -> onnx.ModelProto:
    """y = x @ w (+ b, relu) (+ x2): x [batch, 1, k], the weight [k, n]."""
    nodes = [helper.make_node("MatMul", ["x", "w"], ["mm"])]
    inits = {"w": rng.standard_normal((k, n)).astype(np.float32) / np.sqrt(k)}
    inputs = [("x", [batch, 1, k])]
    last = "mm"
    if bias:
        inits["b"] = rng.standard_normal(n).astype(np.float32)
        nodes += [helper.make_node("Add", [last, "b"], ["mb"]), helper.make_node("Relu", ["mb"], ["r"])]
        last = "r"
    if residual:
        inputs.append(("x2", [batch, 1, n]))
        nodes.append(helper.make_node("Add", [last, "x2"], ["s"]))
        last = "s"
    nodes.append(helper.make_node("Identity", [last], ["y"]))
    g = helper.make_graph(nodes, "gemv_case",
                          [helper.make_tensor_value_info(nm, TensorProto.FLOAT, s) for nm, s in inputs],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, 1, n])],
                          [numpy_helper.from_array(a, nm) for nm, a in inits.items()])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def _gemms(plan):
    return [k for k in plan.kernels if k.family == "gemm"]


def test_small_rows_have_gemv_candidates():
    plan = plan_of(rows_model(8, 5632, 2048, np.random.default_rng(0)), {}, "fp16")
    (mm,) = _gemms(plan)
    assert any(p["unit"] == "gemv" and p["BM"] == 8 for p in gemm.space(mm, plan))


# Measured on an H200 (benchmarks/generate.py --profile, 1 B Llama decode step, B1, fp16), us:
# (rows, K, N, residual, gemv best measured, the other units' best measured).
MEASURED = [(1, 2048, 2048, True, 7.26, 6.26),       # O-projection + residual: mma split-k faster
            (1, 5632, 2048, True, 13.14, 10.28),     # down-projection + residual: mma split-k faster
            (1, 2048, 32000, False, 43.89, 35.06)]   # LM head: the tensor-core GEMM faster


@pytest.mark.parametrize("rows,k,n,residual,gemv_us,other_us", MEASURED)
def test_cost_ranks_gemv_as_measured(rows, k, n, residual, gemv_us, other_us):
    """The planner's pick between gemv and the other units agrees with the measurement."""
    plan = plan_of(rows_model(rows, k, n, np.random.default_rng(4), residual=residual), {}, "fp16")
    (mm,) = _gemms(plan)
    assert (mm.schedule.param["unit"] == "gemv") == (gemv_us < other_us)


def test_where_gemv_is_declined():
    rng = np.random.default_rng(1)
    for model, precision, why in ((rows_model(9, 64, 64, rng), "fp16", "9 rows"),
                                  (rows_model(1, 64, 60, rng), "fp16", "16-byte rows")):
        (k,) = _gemms(plan_of(model, {}, precision))
        assert why in gemm_gemv.why_not(k, _plan(model, precision), "f16")
    (k,) = _gemms(plan_of(rows_model(1, 64, 64, rng), {}, "fp32"))
    assert k.schedule.param["unit"] != "gemv"


def _plan(model, precision):
    return plan_of(model, {}, precision)


def test_gemv_cuda_has_no_spills():
    """Every pinned variant compiles (nvcc, sm_90) with its registers and no local memory."""
    rng = np.random.default_rng(2)
    for bn, warps, splits, batch in ((256, 8, 16, 1), (512, 4, 1, 2), (256, 4, 32, 8)):
        payload = aicfc.compile(rows_model(batch, 2048, 1024, rng, bias=True), precision="fp16",
                                pin={"unit": "gemv", "BN": bn, "WARPS": warps, "SPLITK": splits})
        (k,) = [k for k in payload["kernels"] if k["family"] == "gemm"]
        assert k["params"]["unit"] == "gemv" and 0 < k["registers"] <= 128
        source = "".join(m["source"] for m in payload["modules"])
        assert "as a weight stream (gemv" in source and "__ldcs" in source


def test_gemv_space_bounds_the_accumulators():
    for m in range(1, gemm_gemv.MAX_ROWS + 1):
        for p in gemm_gemv.space(m, 4096, 4096):
            assert m * p["BN"] // gemm_gemv.SEGMENT * 8 <= gemm_gemv.MAX_ACC
            assert p["SPLITK"] == 1 or -(-4096 // p["SPLITK"]) >= gemm_gemv.UNROLL * p["WARPS"]


PINS = [{"BN": 256, "WARPS": 8, "SPLITK": 1}, {"BN": 256, "WARPS": 4, "SPLITK": 8},
        {"BN": 512, "WARPS": 8, "SPLITK": 32}, {"BN": 256, "WARPS": 8, "SPLITK": 2}]
CASES = [(1, 2048, 3072, False, False), (4, 200, 264, True, False), (8, 1000, 520, False, True),
         (2, 5632, 2048, True, True)]


@pytest.mark.gpu
@pytest.mark.parametrize("precision", ["fp16", "bf16"])
@pytest.mark.parametrize("pin", PINS, ids=lambda p: "BN{BN}W{WARPS}S{SPLITK}".format(**p))
@pytest.mark.parametrize("case", CASES, ids=lambda c: "B{}K{}N{}{}{}".format(c[0], c[1], c[2], "-bias" if c[3] else "",
                                                                            "-res" if c[4] else ""))
def test_gemv_matches_numpy(case, pin, precision, gpu_device):
    from aicf_run.bundle import Bundle
    from aicf_run.executor import Executor
    batch, k, n, bias, residual = case
    if not any(all(p[x] == v for x, v in pin.items()) for p in gemm_gemv.space(batch, n, k)):
        pytest.skip("outside the space (accumulators per thread, k-rows per split)")
    model = rows_model(batch, k, n, np.random.default_rng(k + n), bias, residual)
    payload = aicfc.compile(model, target=gpu_device.arch, precision=precision, pin={"unit": "gemv", **pin})
    assert [kk["params"]["unit"] for kk in payload["kernels"] if kk["family"] == "gemm"] == ["gemv"]
    rng = np.random.default_rng(3)
    graph = import_model(model, None)
    inputs = {v.name: rng.standard_normal(v.type.shape).astype(np.float32) for v in graph.inputs}
    ref = evaluate_graph(graph, inputs, dtype=np.float64)["y"]
    ex = Executor(Bundle.from_payload(payload), gpu_device)
    try:
        ex.poison()
        first = ex.run(inputs)["y"]
        again = ex.run(inputs)["y"]
    finally:
        ex.close()
    assert np.isfinite(first).all() and rel_err(first, ref) <= 1e-2, f"rel err {rel_err(first, ref):.2e}"
    assert np.array_equal(first, again)


def test_gemv_unit_is_in_the_gemm_family():
    assert gemm.threads({"unit": "gemv", "WARPS": 4}) == 128


def test_a_rotary_projection_at_decode_rows_is_not_a_gemv():
    """A decode step of 8 rows (B8) whose QKV projection carries the rotary epilogue compiles
    (nvcc builds every leader), and gemv is not offered for it (`gemm.why_not_rotary`)."""
    from benchmarks.decoder_graph import DecoderConfig, cache_names, decoder_model, random_weight, weight_shapes
    from aicfc.passes.rotary_epilogue import ROTARY_RULE
    cfg = DecoderConfig(128, 1, 2, 1, 256, 64, 32)
    rng = np.random.default_rng(5)
    model = decoder_model(cfg, lambda name: random_weight(name, weight_shapes(cfg)[name], rng), batch="batch")
    shapes = {"input_ids": (8, 1), "cache_position": (1,)} | {n: cfg.cache_shape(8) for n, _ in cache_names(cfg)}
    payload = aicfc.compile(model, precision="fp16", shapes=shapes)
    rotary = [k for k in payload["kernels"] if ROTARY_RULE in k["rewrites"]]
    assert rotary and all(k["params"]["unit"] != "gemv" for k in rotary)
    plan = plan_of(model, shapes, "fp16")
    (qkv,) = [k for k in plan.kernels if ROTARY_RULE in k.rewrites]
    assert gemm_gemv.why_not(qkv, plan, "f16") is None            # 8 rows: gemv would apply
    assert not [p for p in gemm.space(qkv, plan) if p["unit"] == "gemv"]
    assert "rotary" in gemm.why_not_rotary(gemm.rotary(qkv), {"unit": "gemv"})
