"""The `gemv` unit of the gemm family (codegen/gemm_gemv.py): contractions of at most 8 rows
streamed from the weight, split-k with the last split reducing.

Without a GPU: where it applies (rows = batch x M <= 8, fp16/bf16, the weight contiguous along
n) and where it is declined with the reason; its space's bounds; that the cost terms
(planner/cost_gemv.py) order candidates as Little's law says; that the decode step's
projections (a 1 B Llama at B1 and B8) choose it; that every candidate of the space compiles
for sm_90a without local-memory spills (ptxas), the rotary epilogue's included. On the GPU
(`gpu`): pinned variants against numpy float64 (fp16/bf16: 1e-2 of the output's max) at M = 1,
3, 8, an odd number of 8-column groups, K not a multiple of the split, with bias and ReLU, a
residual add, the SwiGLU gate and the rotary epilogue; a second run on the same executor gives
the same bits (the split-k tickets are zero again).
"""
from __future__ import annotations

import functools

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import aicfc
from aicfc.codegen import gemm, gemm_gemv
from aicfc.planner.cost import estimate_registers
from aicfc.frontend.onnx_import import import_model
from aicfc.ir.high import evaluate_graph
from tests.test_pipeline import rel_err
from tests.sweep import to_build
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


DECODE = [(2048, 2048), (5632, 2048), (2048, 11264), (2048, 32000)]


@pytest.mark.parametrize("rows", [1, 8])
@pytest.mark.parametrize("k,n", DECODE)
def test_decode_projections_choose_gemv(rows, k, n):
    """At a decode step's rows the weight stream is predicted faster than any tensor-core tile;
    at 8 rows the stream's products run on tensor cores ([Note: the gemv on tensor cores]: the
    SIMT steps' 8 FMAs a weight are not hidden there), at one row they stay SIMT (no TC candidate)."""
    plan = plan_of(rows_model(rows, k, n, np.random.default_rng(4), residual=True), {}, "fp16")
    (mm,) = _gemms(plan)
    assert mm.schedule.param["unit"] == "gemv", mm.schedule.param
    assert mm.schedule.param["TC"] == (rows >= gemm_gemv.TC_MIN_ROWS), mm.schedule.param


def test_gemv_cost_follows_littles_law():
    """More bytes in flight per SM never predicts slower; a grid of fewer blocks than SMs pays
    for the idle ones; the split tail is charged; the busiest SM's extra block is charged."""
    from aicfc.planner.cost_gemv import gemv_terms
    kw = dict(m=1, esize=2, sm_count=132, dram_gbs=3350, fp32_tflops=66.9 * 0.7)

    def t(n=2048, kk=2048, bps=2, **p):
        q = {"unit": "gemv", "BM": 1, "BN": 64, "WARPS": 8, "U": 8, "SPLITK": 1} | p
        return gemv_terms(q, n=n, kk=kk, io_bytes=2.0 * n * kk, bps=bps, **kw)
    assert t(U=4)["time_us"] >= t(U=8)["time_us"]
    assert t(WARPS=4)["time_us"] >= t(WARPS=8)["time_us"]
    assert t(BN=512)["time_us"] > t(BN=64)["time_us"]                 # 4 blocks: 4 SMs stream
    assert t(SPLITK=2)["t_split_us"] > 0 and t()["t_split_us"] == 0
    assert t(n=64 * 133, kk=512)["blocks_busiest_sm"] == 2
    assert t(n=64 * 133, kk=512)["t_sm_us"] > t(n=64 * 132, kk=512)["t_sm_us"]
    # the gate/up of the 1 B Llama: 528 blocks (4 on every SM) stream faster than 352 (3 on some,
    # 2 on others), as they ran alone on an H200 (13.4 against 15.8 us, session 15); but they fill
    # every slot, which the plan pays ([Note: a gemv leaves room])
    even = t(n=11264, kk=2048, bps=4, WARPS=8, U=4, SPLITK=3, CL=0)
    uneven = t(n=11264, kk=2048, bps=4, WARPS=8, U=4, SPLITK=2, CL=0)
    assert even["t_sm_us"] < uneven["t_sm_us"] and even["blocks_busiest_sm"] == 4
    assert even["t_full_us"] > 0 == uneven["t_full_us"]
    # a second round of blocks on an SM is charged
    assert t(n=11264, kk=2048, bps=2, WARPS=8, U=4, SPLITK=3, CL=0)["t_rounds_us"] > 0 == even["t_rounds_us"]


def test_gemv_clusters_are_of_two_four_or_eight():
    """Splits of 3, 6 and 12 run with tickets only: clusters of 3 and 6 ran slower (session 15)."""
    space = gemm_gemv.space(1, 11264, 2048)
    assert {p["SPLITK"] for p in space if p["CL"]} == {2, 4, 8}
    assert {3, 6, 12} <= {p["SPLITK"] for p in space if not p["CL"]}


def test_cluster_splits_push_into_rank_0():
    """[Note: splits pushed to rank 0]: the other splits store their sums into rank 0's inbox and arrive on the
    cluster barrier; no split reads another's shared memory, and the inbox counts in the space's bound."""
    rng = np.random.default_rng(3)
    model = rows_model(1, 2048, 3072, rng)
    plan = plan_of(model, {}, "fp16", {"CL": "1", "SPLITK": "8", "BN": "64", "WARPS": "8", "kmajor": "0"})
    (k,) = _gemms(plan)
    source = gemm.render_kernel(k, k.schedule.param, plan.types(), "k")
    assert "float inbox[448];" in source and source.count("aicf_cluster_st4(aicf_cluster_peer(inbox") == 1
    assert "aicf_cluster_ld(" not in source.split("__global__")[1] and "aicf_cluster_sync_aligned" not in source.split("__global__")[1]
    assert source.count("aicf_cluster_arrive();") == 1 and source.count("aicf_cluster_wait();") == 2
    p = dict(k.schedule.param)
    assert gemm_gemv.static_smem(p) == 4 * (8 + 7) * 64 + 16 == gemm_gemv.static_smem({**p, "CL": 0}) + 4 * 7 * 64
    # 8 rows of 128 columns: 8 warps' rows fit alone (32 KB), not with 7 splits' inbox beside them (60 KB)
    space = gemm_gemv.space(8, 1024, 4096)
    tile = {"TC": 0, "BM": 8, "BN": 128, "WARPS": 8, "SPLITK": 8}
    assert any(all(q[x] == v for x, v in tile.items()) and not q["CL"] for q in space)
    assert not any(all(q[x] == v for x, v in tile.items()) and q["CL"] for q in space)


def test_where_gemv_is_declined():
    rng = np.random.default_rng(1)
    for model, precision, why in ((rows_model(9, 64, 64, rng), "fp16", "9 rows"),
                                  (rows_model(1, 60, 60, rng), "fp16", "16-byte rows")):
        (k,) = _gemms(plan_of(model, {}, precision))
        assert why in gemm_gemv.why_not(k, _plan(model, precision), "f16")
    (k,) = _gemms(plan_of(rows_model(1, 64, 64, rng), {}, "fp32"))
    assert k.schedule.param["unit"] != "gemv"


def _plan(model, precision):
    return plan_of(model, {}, precision)


def _all_candidates_build(plan) -> None:
    from aicfc.codegen.module import count_registers
    (mm,) = [k for k in plan.kernels if k.family == "gemm"]
    space = to_build([p for p in gemm.space(mm, plan) if p["unit"] == "gemv"], functools.partial(estimate_registers, mm))
    assert space
    (found,) = count_registers(plan, [(mm, space)])
    bad = [(p, regs, spill) for p, (regs, spill) in zip(space, found) if spill or not 0 < regs <= 255]
    assert not bad, f"{len(bad)} of {len(space)} spill: {bad[:3]}"


@pytest.mark.parametrize("rows", [1, 8])
def test_every_gemv_candidate_builds_without_spills(rows):
    """Every candidate of the space ([Note: candidate sweeps] in tests/sweep.py) compiles (nvcc, sm_90a) with no
    local memory (ptxas -v)."""
    _all_candidates_build(plan_of(rows_model(rows, 2000, 1032, np.random.default_rng(2), bias=True), {}, "fp16"))


@pytest.mark.parametrize("rows", [1, 8])
def test_every_rotary_gemv_candidate_builds_without_spills(rows):
    from benchmarks.gemv import rope_model
    _all_candidates_build(plan_of(rope_model(rows, 1, hidden=512, heads=8, kv_heads=2), {}, "fp16"))


def test_pinned_gemv_source():
    rng = np.random.default_rng(2)
    payload = aicfc.compile(rows_model(2, 2048, 1024, rng, bias=True), precision="fp16",
                            pin={"unit": "gemv", "BN": 128, "WARPS": 8, "U": 4, "SPLITK": 4})
    (k,) = [k for k in payload["kernels"] if k["family"] == "gemm"]
    assert k["params"]["unit"] == "gemv" and 0 < k["registers"] <= 255
    source = "".join(m["source"] for m in payload["modules"])
    assert "as a weight stream (gemv" in source and "__ldcs" in source and "__shfl_xor_sync" in source


def _source_of_gemv(model) -> tuple[dict, str]:
    payload = aicfc.compile(model, target="sm_90", precision="fp16", pin={"unit": "gemv", "BN": 64, "SPLITK": 2, "kmajor": "0"})
    (k,) = [k for k in payload["kernels"] if k["family"] == "gemm"]
    source = "".join(m["source"] for m in payload["modules"])
    return k["params"], source[source.index(f" {k['name']}("):]


def test_gemv_requests_a_constant_weight_before_the_dependent_launch_wait():
    """[Note: gemv weights before the wait]: with the weight an initializer, the first step's
    weight loads come before the kernel's griddepcontrol entry and the activation loads after
    it; with the right operand an input (written by whoever runs before), the entry is first."""
    from aicfc.codegen import pdl
    params, body = _source_of_gemv(rows_model(1, 2048, 1024, np.random.default_rng(2)))
    assert params["PRE"] == 1 and pdl.MARK not in body
    entry = body.index(pdl.ENTRY)
    assert body.index("__ldcs(") < entry < body.index("acur[u][m] = ")
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 256])
    w = helper.make_tensor_value_info("w", TensorProto.FLOAT, [256, 512])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 1, 512])
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "g", [x, w], [y])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    params, body = _source_of_gemv(model)
    assert "PRE" not in params
    assert body.index(pdl.ENTRY) < body.index("__ldcs(")


def test_gemv_space_bounds_registers_and_shared_memory():
    for m in range(1, gemm_gemv.MAX_ROWS + 1):
        space = gemm_gemv.space(m, 4096, 4096)
        assert space
        assert any(p["TC"] for p in space) == (m >= gemm_gemv.TC_MIN_ROWS)
        for p in space:
            seg = gemm_gemv.lanes(p["BN"])[2]
            if p["TC"]:
                assert gemm_gemv.tc_held(p["BN"] // 64, p["U"]) <= gemm_gemv.TC_MAX_HELD
            else:
                assert m * seg * 8 <= gemm_gemv.MAX_ACC and gemm_gemv.held(m, seg, p["U"]) <= gemm_gemv.MAX_HELD
            assert 4 * p["WARPS"] * m * p["BN"] <= gemm_gemv.SMEM_MAX
            assert p["SPLITK"] == 1 or -(-4096 // p["SPLITK"]) >= gemm_gemv.k_step(p)


PINS = [{"BN": 64, "WARPS": 8, "U": 8, "SPLITK": 1}, {"BN": 128, "WARPS": 4, "U": 4, "SPLITK": 8, "CL": 1},
        {"BN": 512, "WARPS": 4, "U": 4, "SPLITK": 2, "CL": 0}, {"BN": 256, "WARPS": 8, "U": 4, "SPLITK": 4, "CL": 0},
        {"BN": 64, "WARPS": 4, "U": 4, "SPLITK": 16}, {"BN": 64, "WARPS": 4, "U": 8, "SPLITK": 3, "CL": 0},
        {"BN": 128, "WARPS": 8, "U": 4, "SPLITK": 6, "CL": 0}]
# the tensor-core steps ([Note: the gemv on tensor cores]): every (BN, U) of the space, splits by cluster and by scratch
TC_PINS = [{"BN": 64, "WARPS": 8, "U": 4, "SPLITK": 4, "CL": 1}, {"BN": 128, "WARPS": 4, "U": 2, "SPLITK": 3, "CL": 0},
           {"BN": 128, "WARPS": 8, "U": 2, "SPLITK": 2, "CL": 1}, {"BN": 64, "WARPS": 4, "U": 1, "SPLITK": 16, "CL": 0},
           {"BN": 64, "WARPS": 8, "U": 2, "SPLITK": 2, "CL": 1}, {"BN": 128, "WARPS": 8, "U": 1, "SPLITK": 1}]
PINS = [{"TC": 0} | p for p in PINS] + [{"TC": 1} | p for p in TC_PINS]
# (rows, K, N, bias, residual): N = 8 x odd, K not a multiple of the split or of a step
CASES = [(1, 2048, 3072, False, False), (3, 1000, 264, True, False), (8, 1000, 520, False, True),
         (1, 5632, 2056, True, True), (8, 2000, 1032, True, False),
         (5, 1002, 264, False, False)]   # rows 1002 apart: the tensor-core steps' activations by 2-byte loads


@pytest.mark.gpu
@pytest.mark.parametrize("precision", ["fp16", "bf16"])
@pytest.mark.parametrize("pin", PINS, ids=lambda p: "TC{TC}BN{BN}W{WARPS}U{U}S{SPLITK}CL{}".format(p.get("CL", "x"), **p))
@pytest.mark.parametrize("case", CASES, ids=lambda c: "B{}K{}N{}{}{}".format(c[0], c[1], c[2], "-bias" if c[3] else "",
                                                                            "-res" if c[4] else ""))
def test_gemv_matches_numpy(case, pin, precision, gpu_device):
    from aicf_run.bundle import Bundle
    from aicf_run.executor import Executor
    batch, k, n, bias, residual = case
    if not any(all(p[x] == v for x, v in pin.items()) for p in gemm_gemv.space(batch, n, k)):
        pytest.skip("outside the space (accumulators per thread, k-rows per split)")
    model = rows_model(batch, k, n, np.random.default_rng(k + n), bias, residual)
    payload = aicfc.compile(model, target=gpu_device.arch, precision=precision, pin={"unit": "gemv", "kmajor": "0", **pin})
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


@pytest.mark.parametrize("k,vector", [(1000, True), (1002, False)])
def test_tensor_core_activations_load_eight_bytes_where_rows_allow(k, vector):
    """A lane's four activations are one 8-byte load only where every row starts 4-element aligned
    ([Note: the gemv on tensor cores]); otherwise the source keeps the 2-byte loads alone."""
    payload = aicfc.compile(rows_model(5, k, 264, np.random.default_rng(1)), target="sm_90", precision="fp16",
                            pin={"unit": "gemv", "TC": 1, "SPLITK": 3, "CL": 0, "kmajor": "0"})
    (kk,) = [x for x in payload["kernels"] if x["family"] == "gemm"]
    assert kk["params"]["TC"] == 1 and 0 < kk["registers"] <= 255
    source = "".join(m["source"] for m in payload["modules"])
    assert ("const uint2 v = " in source) == vector
    assert "aicf_gemv_pack(e[0], e[1])" in source


def test_gemv_unit_is_in_the_gemm_family():
    assert gemm.threads({"unit": "gemv", "WARPS": 4}) == 128


@pytest.mark.parametrize("batch", [1, 8])
def test_the_decode_steps_rotary_projection_runs_on_gemv(batch):
    """The 1 B Llama's decode step (hidden 2048, 32 query heads over 8 key/value heads of 64):
    its QKV projection carries the rotary epilogue and chooses gemv, whose epilogue reads the
    partner column from shared memory (every rotary candidate builds: the spill test above); over a K-major weight
    (one row, and 8 on tensor cores: [Note: the tensor-core gemv's stream] in planner/cost_gemv.py) a block under the
    head takes both halves' matching columns (`rb` from the column)."""
    from benchmarks.decoder_graph import DecoderConfig, cache_names, decoder_model, random_weight, weight_shapes
    from aicfc.passes.rotary_epilogue import ROTARY_RULE
    cfg = DecoderConfig(2048, 1, 32, 8, 5632, 256, 16)
    rng = np.random.default_rng(5)
    model = decoder_model(cfg, lambda name: random_weight(name, weight_shapes(cfg)[name], rng), batch="batch")
    shapes = {"input_ids": (batch, 1), "cache_position": (1,)} | {n: cfg.cache_shape(batch) for n, _ in cache_names(cfg)}
    plan = plan_of(model, shapes, "fp16")
    (qkv,) = [k for k in plan.kernels if ROTARY_RULE in k.rewrites]
    assert qkv.schedule.param["unit"] == "gemv", qkv.schedule.param
    source = gemm.render_kernel(qkv, qkv.schedule.param, plan.types(), "qkv")
    km = bool(qkv.schedule.param.get("KM"))
    assert km
    assert "accp = red[" in source and ("rb = gn - gn % 64" if km and qkv.schedule.param["BN"] < 64 else "rb = n0") in source


def swiglu_model(batch: int, k: int, n: int, rng) -> onnx.ModelProto:
    """y = silu(x @ wg) * (x @ wu): merged into one contraction of interleaved columns (GATE_RULE)."""
    inits = {nm: rng.standard_normal((k, n)).astype(np.float32) / np.sqrt(k) for nm in ("wg", "wu")}
    nodes = [helper.make_node("MatMul", ["x", "wg"], ["g"]), helper.make_node("MatMul", ["x", "wu"], ["u"]),
             helper.make_node("Sigmoid", ["g"], ["s"]), helper.make_node("Mul", ["g", "s"], ["a"]),
             helper.make_node("Mul", ["a", "u"], ["y"])]
    g = helper.make_graph(nodes, "swiglu", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 1, k])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, 1, n])],
                          [numpy_helper.from_array(a, nm) for nm, a in inits.items()])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def _in_space(rows: int, n: int, k: int, pin: dict) -> bool:
    return any(all(p[x] == v for x, v in pin.items()) for p in gemm_gemv.space(rows, n, k))


def _storage_rounded(a: np.ndarray, precision: str) -> np.ndarray:
    """`a` (f32) rounded to the storage type of `precision`, back in f32."""
    from aicfc.passes.apply_precision import _bf16
    return a.astype(np.float16).astype(np.float32) if precision == "fp16" else _bf16(a)


def _rounded_model(model: onnx.ModelProto, precision: str) -> onnx.ModelProto:
    out = onnx.ModelProto()
    out.CopyFrom(model)
    for init in out.graph.initializer:
        a = numpy_helper.to_array(init)
        if a.dtype == np.float32:
            init.CopyFrom(numpy_helper.from_array(_storage_rounded(a, precision), init.name))
    return out


def _run_against_numpy(model, pin: dict, precision: str, device, rule: str | None = None,
                       joint_scale: bool = False) -> None:
    """Against a float64 evaluation of the operands the kernel reads: weights and inputs rounded
    to the storage type first (as benchmarks/gemm.py checks), so the bound (1e-2 of the output's
    max) measures the kernel's accumulation and stores, not bf16's 2^-8 input rounding.
    `joint_scale`: 1e-2 of the largest element of every output instead, for models whose outputs
    are sums of one scale over few elements (rope_model: at one row k and v sum each of 2 heads
    over d, from values stored in bf16 first): a draw that makes both of an output's sums small
    broke its own bound in about 1 draw of 18 (v0 1.88e-2, session 67 on an H100; a numpy
    simulation of the storage rounding: 5.6% of draws per output, none of 20000 jointly)."""
    from aicf_run.bundle import Bundle
    from aicf_run.executor import Executor
    model = _rounded_model(model, precision)
    payload = aicfc.compile(model, target=device.arch, precision=precision, pin={"unit": "gemv", "kmajor": "0", **pin})
    gemms = [kk for kk in payload["kernels"] if kk["family"] == "gemm"]
    assert gemms and all(kk["params"]["unit"] == "gemv" for kk in gemms)
    if rule:
        assert any(rule in kk["rewrites"] for kk in gemms), f"{rule} not applied"
    rng = np.random.default_rng()
    graph = import_model(model, None)
    inputs = {v.name: _storage_rounded(rng.standard_normal(v.type.shape).astype(np.float32), precision)
              for v in graph.inputs}
    refs = evaluate_graph(graph, inputs, dtype=np.float64)
    ex = Executor(Bundle.from_payload(payload), device)
    try:
        ex.poison()
        first = ex.run(inputs)
        again = ex.run(inputs)
    finally:
        ex.close()
    scale = max(float(np.abs(r).max()) for r in refs.values()) if joint_scale else None
    for name in first:
        got, ref = first[name], refs[name]
        err = rel_err(got, ref, scale)
        assert np.isfinite(got).all() and err <= 1e-2, f"{name}: rel err {err:.2e}"
        assert np.array_equal(got, again[name])


GATE_PINS = [{"TC": 0} | p for p in (
    {"BN": 64, "WARPS": 8, "U": 8, "SPLITK": 1}, {"BN": 64, "WARPS": 4, "U": 4, "SPLITK": 4, "CL": 1},
    {"BN": 256, "WARPS": 4, "U": 4, "SPLITK": 4, "CL": 0}, {"BN": 64, "WARPS": 4, "U": 8, "SPLITK": 3, "CL": 0})] + [
    {"TC": 1} | p for p in ({"BN": 64, "WARPS": 4, "U": 4, "SPLITK": 4, "CL": 1}, {"BN": 128, "WARPS": 8, "U": 2, "SPLITK": 1})]


@pytest.mark.gpu
@pytest.mark.parametrize("precision", ["fp16", "bf16"])
@pytest.mark.parametrize("pin", GATE_PINS, ids=lambda p: "TC{TC}BN{BN}W{WARPS}U{U}S{SPLITK}CL{}".format(p.get("CL", "x"), **p))
@pytest.mark.parametrize("rows", [1, 3, 8])
def test_gemv_swiglu_matches_numpy(rows, pin, precision, gpu_device):
    from aicfc.passes.interleave_gates import GATE_RULE
    if not _in_space(rows, 2 * 264, 1000, pin):
        pytest.skip("outside the space at these rows (registers per thread)")
    _run_against_numpy(swiglu_model(rows, 1000, 264, np.random.default_rng(rows)), pin, precision, gpu_device, GATE_RULE)


ROTARY_PINS = [{"TC": 0} | p for p in (
    {"BN": 64, "WARPS": 8, "U": 8, "SPLITK": 1}, {"BN": 64, "WARPS": 4, "U": 4, "SPLITK": 2, "CL": 1},
    {"BN": 128, "WARPS": 4, "U": 4, "SPLITK": 2, "CL": 0}, {"BN": 256, "WARPS": 8, "U": 4, "SPLITK": 4},
    {"BN": 64, "WARPS": 8, "U": 4, "SPLITK": 6, "CL": 0})] + [
    {"TC": 1} | p for p in ({"BN": 64, "WARPS": 8, "U": 4, "SPLITK": 2, "CL": 1}, {"BN": 128, "WARPS": 4, "U": 2, "SPLITK": 3, "CL": 0})]


@pytest.mark.gpu
@pytest.mark.parametrize("precision", ["fp16", "bf16"])
@pytest.mark.parametrize("pin", ROTARY_PINS, ids=lambda p: "TC{TC}BN{BN}W{WARPS}U{U}S{SPLITK}CL{}".format(p.get("CL", "x"), **p))
@pytest.mark.parametrize("rows", [1, 3, 8])
def test_gemv_rotary_matches_numpy(rows, pin, precision, gpu_device):
    """q and k rotated in the gemv's epilogue (the partner half a head away in shared memory),
    every head weighted by random factors over d and summed, against float64."""
    from benchmarks.gemv import rope_model
    from aicfc.passes.rotary_epilogue import ROTARY_RULE
    if not _in_space(rows, 12 * 64, 1000, pin):
        pytest.skip("outside the space at these rows (registers per thread)")
    model = rope_model(rows, 1, hidden=1000, heads=8, kv_heads=2, d=64, position=7, seed=rows, weighted=True)
    _run_against_numpy(model, pin, precision, gpu_device, ROTARY_RULE, joint_scale=True)


def test_rotary_epilogue_before_a_reader_of_the_first_map():
    """rotary_epilogue puts R where the first rotated map was: q's reader (a weighted sum) comes
    before the k map, and read R's flat view before it was defined when R took the last map's place."""
    from benchmarks.gemv import rope_model
    from aicfc.ir.lowered import verify_program
    from aicfc.passes.rotary_epilogue import ROTARY_RULE
    from tests.test_pipeline import evaluate_ir, stages
    model = rope_model(1, 1, hidden=256, heads=8, kv_heads=2, d=64, position=7, seed=3, weighted=True)
    ir = stages(model, "fp16")
    verify_program(ir["rotary_epilogue"])
    assert any(r.rule == ROTARY_RULE and r.applied for r in ir["rotary_epilogue"].rewrites)
    graph = import_model(model, None)
    inputs = {v.name: np.random.default_rng(4).standard_normal(v.type.shape).astype(np.float32) for v in graph.inputs}
    refs = evaluate_graph(graph, inputs, dtype=np.float64)
    got = evaluate_ir(ir["plan_memory"], inputs)
    assert all(rel_err(got[n], refs[n]) <= 1e-2 for n in refs)
