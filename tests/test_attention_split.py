"""Split-KV (flash-decoding) attention, unit `split` of the attention family (issue 19:
codegen/attention_split.py, templates/attention_split.cu.j2, planner/cost_attention_split.py).

CPU: the space exists only for few query rows, the planner picks it at decode shapes and
`explain` shows it with the units it beat, the cost terms move the way the docstring reasons
(more splits: fewer tiles a chunk, a bigger combine), scratch has the partials and zeroed
tickets, the plan matches float64 numpy through the interpreter, nvcc builds every candidate
for sm_90a without spills. GPU (`-m gpu`): decode shapes (B1 and B4, 32 query heads over 8
K/V heads, D 64, 768 slots) at live lengths 1, 37, 512, 768 against numpy float64, with NaN in
the dead slots of the cache (they must never be read) and the arena poisoned; run twice in a
row (the tickets are zero again after a run).
"""
from __future__ import annotations

import dataclasses

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import aicfc
from aicfc.codegen import attention, attention_split
from aicfc.codegen.module import count_registers, render_module
from aicfc.codegen.nvcc import build
from aicfc.codegen.scratch import scratch
from aicfc.frontend.onnx_import import import_model
from aicfc.passes.pipeline import Options, run_pipeline
from aicfc.passes.plan_schedules import rank
from aicfc.passes.streaming_attention import GQA_RULE, LIVE_RULE
from aicfc.planner.cost_attention_split import split_attention_terms
from aicfc.planner.hardware import load_profile
from tests.test_pipeline import evaluate_ir, rel_err

FLT_MAX = 3.4028234663852886e38
RTOL = {"fp32": 1e-4, "fp16": 1e-2, "bf16": 5e-2}


def decode_attention(b: int, h: int, hkv: int, slots: int, d: int, sq: int = 1) -> onnx.ModelProto:
    """softmax(q·repeat_kv(k)ᵀ/√d + mask)·repeat_kv(v) over a cache of `slots`, the mask "slot j
    visible to the query at position p when j <= p" (transformers' StaticCache, as
    benchmarks/decoder_graph.py builds it), the result as [B, Sq, H·D]."""
    n = helper.make_node
    g = h // hkv
    inits = {"two": np.array([2], np.int64), "rep": np.array([1, 1, g, 1, 1], np.int64),
             "merged": np.array([0, h, slots, d], np.int64), "scale": np.array(d ** -0.5, np.float32),
             "slot": np.arange(slots, dtype=np.float32)[None, :], "one": np.array([1], np.int64),
             "zero_one": np.array([0, 1], np.int64), "zero": np.array(0.0, np.float32),
             "big": np.array(-FLT_MAX, np.float32), "flat": np.array([0, 0, h * d], np.int64)}
    nodes = [n("Cast", ["cache_position"], ["pos_f"], to=TensorProto.FLOAT), n("Unsqueeze", ["pos_f", "one"], ["pos"]),
             n("LessOrEqual", ["slot", "pos"], ["visible"]), n("Unsqueeze", ["visible", "zero_one"], ["visible4"]),
             n("Where", ["visible4", "zero", "big"], ["mask"])]
    for x in ("k", "v"):
        nodes += [n("Unsqueeze", [x, "two"], [f"{x}_u"]), n("Expand", [f"{x}_u", "rep"], [f"{x}_e"]),
                  n("Reshape", [f"{x}_e", "merged"], [f"{x}_r"])]
    nodes += [n("Transpose", ["k_r"], ["k_t"], perm=[0, 1, 3, 2]), n("MatMul", ["q", "k_t"], ["s_raw"]),
              n("Mul", ["s_raw", "scale"], ["s"]), n("Add", ["s", "mask"], ["s_m"]),
              n("Softmax", ["s_m"], ["p"], axis=-1), n("MatMul", ["p", "v_r"], ["o"]),
              n("Transpose", ["o"], ["o_t"], perm=[0, 2, 1, 3]), n("Reshape", ["o_t", "flat"], ["y"])]
    f32 = TensorProto.FLOAT
    graph = helper.make_graph(nodes, "decode_attention", [
        helper.make_tensor_value_info("q", f32, [b, h, sq, d]),
        helper.make_tensor_value_info("k", f32, [b, hkv, slots, d]),
        helper.make_tensor_value_info("v", f32, [b, hkv, slots, d]),
        helper.make_tensor_value_info("cache_position", TensorProto.INT64, [sq])],
        [helper.make_tensor_value_info("y", f32, [b, sq, h * d])],
        [numpy_helper.from_array(a, k) for k, a in inits.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def reference(inputs: dict) -> np.ndarray:
    """float64, each query row over its visible slots only (the dead ones may hold NaN)."""
    q, k, v = (inputs[x].astype(np.float64) for x in "qkv")
    pos = inputs["cache_position"]
    b, h, sq, d = q.shape
    g = h // k.shape[1]
    out = np.zeros((b, sq, h, d))
    for i, p in enumerate(pos):
        kk, vv = np.repeat(k[:, :, :p + 1], g, axis=1), np.repeat(v[:, :, :p + 1], g, axis=1)
        s = np.einsum("bhd,bhjd->bhj", q[:, :, i], kk) / np.sqrt(d)
        e = np.exp(s - s.max(-1, keepdims=True))
        out[:, i] = np.einsum("bhj,bhjd->bhd", e / e.sum(-1, keepdims=True), vv)
    return out.reshape(b, sq, h * d)


def inputs_at(model: onnx.ModelProto, live: int, seed: int, dead=np.nan) -> dict:
    """Fresh random q, k, v; the query rows at the last positions below `live`; slots at or past
    `live` hold `dead`."""
    rng = np.random.default_rng(seed)
    shape = {i.name: [x.dim_value for x in i.type.tensor_type.shape.dim] for i in model.graph.input}
    feeds = {x: rng.standard_normal(shape[x]).astype(np.float32) for x in "qkv"}
    for x in "kv":
        feeds[x][:, :, live:] = dead
    sq = shape["cache_position"][0]
    feeds["cache_position"] = np.arange(live - sq, live, dtype=np.int64)
    return feeds


def plan_of(model, precision: str = "fp16", pin: dict | None = None):
    opts = Options("sm_90", load_profile("sm_90"), precision, tuple(sorted((pin or {}).items())))
    return run_pipeline(import_model(model), opts).plan


def the_kernel(plan):
    (k,) = [k for k in plan.kernels if k.family == "attention"]
    return k


# ---------------------------------------------------------------- CPU: space, choice, cost, scratch


@pytest.mark.parametrize("b", [1, 4])
def test_decode_picks_split(b):
    plan = plan_of(decode_attention(b, 32, 8, 768, 64))
    k = the_kernel(plan)
    p = k.schedule.param
    assert p["unit"] == "split" and {LIVE_RULE, GQA_RULE} <= set(k.rewrites)
    sp = attention_split.structure(attention.roles(k))
    assert (sp.nkv, sp.rows) == (8 * b, 4)          # one block a K/V head and chunk, the 4 query heads of its group
    assert k.schedule.grid == (8 * b * p["SPLITS"], 1, 1) and p["SPLITS"] > 1
    lost = {dict(c.params).get("unit") for c in k.schedule.candidates if c.predicted_time_us is not None}
    assert "wgmma" in lost or "mma" in lost or any(dict(c.params).get("unit") == "split" for c in k.schedule.candidates)
    best_other = min(r.time_us for r in rank(k, plan, load_profile("sm_90"))[0] if r.params["unit"] != "split")
    # latency-bound tiles of one row lose (measured at B1 on an H200: split 7.1-7.9 us, the tile units'
    # best 11.2; benchmarks/results/tune_attention_split_session13_h200.txt)
    assert dict(k.schedule.predicted)["time_us"] < best_other / 1.3


def test_many_rows_do_not_split():
    """A prefill (64 rows a K/V head) keeps the tile units; the reason is recorded."""
    plan = plan_of(decode_attention(1, 8, 2, 256, 64, sq=16))
    k = the_kernel(plan)
    assert k.schedule.param["unit"] != "split"
    assert not [p for p in attention.space(k, plan) if p["unit"] == "split"]
    reasons = [c.rejected_because for c in k.schedule.candidates if dict(c.params).get("unit") == "split"]
    assert reasons and "query rows" in reasons[0]


def test_fp32_keeps_simt():
    k = the_kernel(plan_of(decode_attention(1, 4, 2, 128, 64), "fp32"))
    assert k.schedule.param["unit"] == "simt"


def test_space_is_every_distinct_split():
    assert attention_split.splits_of(768, 64) == [1, 2, 3, 4, 6, 12]
    assert all(attention_split.chunk(768, s, 64) * s >= 768 for s in attention_split.splits_of(768, 64))
    assert attention_split.splits_of(100, 32) == [1, 2, 4]


def test_cost_terms_trade_tiles_for_combine():
    hw = load_profile("sm_90")
    t = {s: split_attention_terms(8, 4, 768, 64, 64, {"BN": 64, "SPLITS": s, "warps": 4}, 8, hw, 0.5, 10)
         for s in (1, 3, 12)}
    assert t[1]["tiles_per_chunk"] == 12 and t[12]["tiles_per_chunk"] == 1
    assert t[1]["t_compute_us"] > t[3]["t_compute_us"] > t[12]["t_compute_us"]
    assert t[1]["t_combine_us"] < t[12]["t_combine_us"]
    assert t[12]["time_us"] < t[1]["time_us"]
    # past one wave of blocks an SM runs several: its issue is shared
    many = split_attention_terms(1024, 4, 768, 64, 64, {"BN": 64, "SPLITS": 12, "warps": 4}, 8, hw, 0.5, 10)
    assert many["t_compute_us"] > t[12]["t_compute_us"]


def test_scratch_has_partials_and_zeroed_tickets():
    k = the_kernel(plan_of(decode_attention(4, 32, 8, 768, 64), pin={"CL": 0}))
    p = k.schedule.param
    part, tickets = scratch(k)
    assert not part.zeroed and part.type.dtype == "f32" and part.type.numel == 32 * p["SPLITS"] * 4 * (64 + 2)
    assert tickets.zeroed and tickets.type.dtype == "i32" and tickets.type.numel == 32


def test_cluster_merge_needs_no_scratch():
    """[Note: split attention as a cluster]: CL = 1 only where the chunks fit one portable cluster; its
    partials stay in shared memory (no scratch, no tickets) and the kernel is compiled with its cluster."""
    k = the_kernel(plan_of(decode_attention(1, 32, 8, 768, 64), pin={"CL": 1}))
    p = k.schedule.param
    assert p["CL"] == 1 and 2 <= p["SPLITS"] <= attention_split.CLUSTER_SPLITS
    assert scratch(k) == []
    plan = plan_of(decode_attention(1, 32, 8, 768, 64))
    cl = [q for q in attention.space(the_kernel(plan), plan) if q["unit"] == "split" and q["CL"]]
    assert cl and all(2 <= q["SPLITS"] <= attention_split.CLUSTER_SPLITS for q in cl)
    rows = attention_split.structure(attention.roles(k)).rows
    no_cl = attention_split.smem_bytes(rows, 64, 64, {**p, "CL": 0})
    # the inbox: every chunk's share of this chunk's pairs, and every chunk's (m, l) a row
    ppr = -(-rows * 32 // p["SPLITS"])
    assert attention_split.smem_bytes(rows, 64, 64, p) == -(-no_cl // 16) * 16 + 4 * p["SPLITS"] * (2 * ppr + 2 * rows)


@pytest.mark.parametrize("live", [1, 37, 768])
def test_plan_matches_numpy(live):
    model = decode_attention(1, 8, 2, 128 if live < 768 else 768, 64)
    feeds = inputs_at(model, live, seed=live, dead=0.0)
    got = evaluate_ir(plan_of(model, "fp32", pin={"unit": "simt"}), feeds)["y"]
    assert rel_err(got, reference(feeds)) <= 1e-5


def test_explain_shows_the_split():
    payload = aicfc.compile(decode_attention(1, 32, 8, 768, 64), precision="fp16", jobs=1)
    (k,) = [k for k in payload["kernels"] if k["family"] == "attention"]
    assert k["params"]["unit"] == "split" and "t_combine_us" in k["predicted"]
    assert any(c.get("params", {}).get("unit") in ("wgmma", "mma") for c in k["candidates"])
    assert k["registers"] is not None and k["registers"] <= 255
    from aicfc.explain import explain_text
    merge = "the cluster's merge" if k["params"]["CL"] else "the last block's combine"
    assert merge in explain_text(payload)


# ---------------------------------------------------------------- nvcc: sm_90a, no spills


@pytest.mark.parametrize("b,h,hkv,slots,sq", [(1, 32, 8, 768, 1), (2, 8, 1, 200, 4), (1, 4, 4, 96, 1)])
def test_every_split_candidate_builds_without_spills(b, h, hkv, slots, sq):
    model = decode_attention(b, h, hkv, slots, 64, sq=sq)
    plan = plan_of(model)
    k = the_kernel(plan)
    cands = [p for p in attention.space(k, plan) if p["unit"] == "split"]
    assert cands
    picks = {(p["BN"], p["warps"], p["MMA"], p["STAGES"]): p for p in cands}   # every tile shape, one split count each
    assert any(p["MMA"] for p in cands) and any(p["STAGES"] > 2 for p in cands) == (slots >= 3 * 64)
    chosen = [the_kernel(plan_of(model, pin={"unit": "split", "BN": p["BN"], "warps": p["warps"], "SPLITS": p["SPLITS"],
                                            "MMA": p["MMA"], "STAGES": p["STAGES"]})).schedule.param
              for p in list(picks.values()) + [max(cands, key=lambda p: p["SPLITS"])]]
    (found,) = count_registers(plan, [(k, chosen)])   # one module, as the planner's register check builds them
    bad = [(p, regs, spill) for p, (regs, spill) in zip(chosen, found) if spill or not 0 < regs <= 255]
    assert not bad, f"{len(bad)} of {len(chosen)} spill: {bad[:3]}"


@pytest.mark.parametrize("h,hkv,sq,splits,at_once", [(32, 8, 1, 12, True), (32, 8, 1, 8, True),
                                                     (32, 8, 1, 24, False), (8, 1, 4, 12, False)])
def test_merge_reads_at_once_where_it_fits(h, hkv, sq, splits, at_once):
    """[Note: the merge's reads at once]: at most MERGE_HELD chunks and one O pair a thread (4 rows of
    Dv 64: 128 pairs, 128 threads) read every partial before using any; 24 chunks, or 32 rows (1024
    pairs), keep the three passes."""
    model = decode_attention(1, h, hkv, 768, 64, sq=sq)
    pinned = plan_of(model, pin={"unit": "split", "BN": 32, "warps": 4, "SPLITS": splits, "MMA": 0, "CL": 0})
    source = render_module(pinned)
    assert ("[Note: the merge's reads at once]" in source) == at_once
    assert (f"float2 po[{splits}];" in source) == at_once


@pytest.mark.parametrize("pin", [{"MMA": 1, "BN": 128, "warps": 4, "STAGES": 2, "SPLITS": 6},
                                 {"MMA": 1, "BN": 64, "warps": 4, "STAGES": 4, "SPLITS": 4},
                                 {"MMA": 0, "BN": 32, "warps": 4, "SPLITS": 8}])
def test_cluster_merge_builds_without_spills(pin):
    """[Note: split attention as a cluster]: the kernel carries its cluster's shape, reads no ticket, and ptxas
    spills nothing (B1 of 32 heads over 8, 8 heads over 1 at Sq 4: 32 rows a block, and B2 of 4 over 1 at Sq 4, which
    spilled 4 bytes when the mask's key index was the clamped one, `gj_c`: [Note: the slot table as the key index])."""
    for model in (decode_attention(1, 32, 8, 768, 64), decode_attention(1, 8, 1, 768, 64, sq=4),
                  decode_attention(2, 4, 1, 768, 64, sq=4)):
        pinned = plan_of(model, pin={"unit": "split", "CL": 1, **pin})
        kk = the_kernel(pinned)
        source = render_module(pinned)
        assert f"__cluster_dims__({pin['SPLITS']}, 1, 1)" in source and "atomicAdd" not in source
        body = source.split("__global__")[1]   # the chunks push their partials; none reads a peer's memory
        assert body.count("aicf_cluster_st2(") == 2 and "aicf_cluster_ld" not in body
        built = build(source, "sm_90")
        assert built.spills.get(kk.name, 0) == 0, (pin, built.spills)


@pytest.mark.parametrize("slots,precision", [(768, "fp16"), (4096, "fp32")])
def test_slot_table_read_as_the_key_index(slots, precision):
    """[Note: the slot table as the key index] (codegen/attention.py): under the live-key rule the score compares
    the key index itself with the position: no load of the slot table, one of the position; none in the split unit,
    whose block reads each row's position once, before the key loop ([Note: the rows' positions read once]). A table
    stored in a type that does not hold every index exactly (fp16 past 2048) keeps its load."""
    plan = plan_of(decode_attention(1, 32, 8, slots, 64), precision)
    k = the_kernel(plan)
    assert LIVE_RULE in k.rewrites
    source = render_module(plan)
    body = source.split("The score expression")[1].split("s[mi][nb][q] = x;")[0] if "The score expression" in source else source
    assert "static_cast<float>(gj)" in body
    position_loads = len([ln for ln in body.splitlines() if "= static_cast<float>(__ldg(" in ln])
    if k.schedule.param["unit"] == "split":
        assert position_loads == 0 and "<= (row_p[r])" in body
    else:
        assert position_loads == 1
    types = dict(plan.types())
    g = attention.geometry(k, types)
    slot = attention.slot_is_index(g, types)
    assert slot is not None and g.sk == slots
    types[slot.buffer] = dataclasses.replace(types[slot.buffer], dtype="f16")
    assert (attention.slot_is_index(g, types) is not None) == (slots <= 2049)


# ---------------------------------------------------------------- GPU


def _run_twice(payload: dict, feeds: dict, device) -> list[np.ndarray]:
    from aicf_run.bundle import Bundle
    from aicf_run.executor import Executor
    ex = Executor(Bundle.from_payload(payload), device)
    try:
        ex.poison()
        return [ex.run(feeds)["y"] for _ in range(2)]
    finally:
        ex.close()


@pytest.mark.gpu
@pytest.mark.parametrize("b", [1, 4])
@pytest.mark.parametrize("live", [1, 37, 512, 768])
def test_gpu_split_decode(b, live, gpu_device):
    if gpu_device.arch != "sm_90":
        pytest.skip("the decode shapes are checked on sm_90")
    model = decode_attention(b, 32, 8, 768, 64)
    payload = aicfc.compile(model, target=gpu_device.arch, precision="fp16")
    (k,) = [k for k in payload["kernels"] if k["family"] == "attention"]
    assert k["params"]["unit"] == "split"
    feeds = inputs_at(model, live, seed=100 * b + live)
    ref = reference(feeds)
    for got in _run_twice(payload, feeds, gpu_device):
        assert not np.isnan(got).any()
        assert rel_err(got, ref) <= RTOL["fp16"]


@pytest.mark.gpu
@pytest.mark.parametrize("splits", [1, 3, 12])
def test_gpu_split_counts_and_rows(splits, gpu_device):
    """Each split count, and 4 query rows a head (16 rows a block) over one K/V head."""
    for model, live in ((decode_attention(1, 32, 8, 768, 64), 300), (decode_attention(2, 4, 1, 768, 64, sq=4), 700)):
        payload = aicfc.compile(model, target=gpu_device.arch, precision="fp16",
                                pin={"unit": "split", "BN": 64, "warps": 4, "SPLITS": splits})
        feeds = inputs_at(model, live, seed=splits)
        ref = reference(feeds)
        for got in _run_twice(payload, feeds, gpu_device):
            assert not np.isnan(got).any()
            assert rel_err(got, ref) <= RTOL["fp16"]


@pytest.mark.gpu
@pytest.mark.parametrize("bn,warps,stages", [(64, 4, 2), (128, 4, 4), (128, 8, 2), (64, 4, 8), (64, 4, 4)])
@pytest.mark.parametrize("splits", [1, 3, 12])
def test_gpu_split_on_tensor_cores(bn, warps, stages, splits, gpu_device):
    """[Note: split attention on tensor cores]: 4 query rows a block (B1, 32 heads over 8), 16 (4
    heads over 1 at Sq 4) and 32 (two row slices: 8 heads over 1 at Sq 4), chunks of several
    tiles in flight, one block a K/V head (SPLITS=1) and the ticket's merge; live lengths that
    end inside a warp's keys, NaN in the dead slots."""
    if gpu_device.arch != "sm_90":
        pytest.skip("the decode shapes are checked on sm_90")
    cases = ((decode_attention(1, 32, 8, 768, 64), (1, 300, 768)), (decode_attention(2, 4, 1, 768, 64, sq=4), (4, 700)),
             (decode_attention(1, 8, 1, 768, 64, sq=4), (37, 513)))
    ran = 0
    for model, lives in cases:
        pin = {"unit": "split", "MMA": 1, "BN": bn, "warps": warps, "STAGES": stages, "SPLITS": splits}
        plan = plan_of(model)
        if not any(all(p.get(k_) == v for k_, v in pin.items()) for p in attention.space(the_kernel(plan), plan)):
            continue   # e.g. 8 stages for a chunk of fewer than 7 tiles
        ran += 1
        payload = aicfc.compile(model, target=gpu_device.arch, precision="fp16", pin=pin)
        (k,) = [k for k in payload["kernels"] if k["family"] == "attention"]
        assert k["params"]["MMA"] == 1 and k["params"]["SPLITS"] == splits
        for live in lives:
            feeds = inputs_at(model, live, seed=splits * 1000 + live)
            ref = reference(feeds)
            for got in _run_twice(payload, feeds, gpu_device):
                assert not np.isnan(got).any()
                assert rel_err(got, ref) <= RTOL["fp16"], (live, rel_err(got, ref))
    if not ran:
        pytest.skip(f"no case has a chunk of {splits} splits that fills {stages} stages of {bn} keys")


@pytest.mark.gpu
@pytest.mark.parametrize("pin", [{"MMA": 1, "BN": 128, "warps": 4, "STAGES": 2, "SPLITS": 6},
                                 {"MMA": 1, "BN": 64, "warps": 4, "STAGES": 4, "SPLITS": 4},
                                 {"MMA": 1, "BN": 128, "warps": 8, "STAGES": 2, "SPLITS": 2},
                                 {"MMA": 0, "BN": 32, "warps": 4, "SPLITS": 8},
                                 {"MMA": 0, "BN": 64, "warps": 8, "SPLITS": 3}],
                         ids=lambda p: "-".join(f"{k}{v}" for k, v in p.items()))
def test_gpu_split_as_cluster(pin, gpu_device):
    """[Note: split attention as a cluster]: the chunks merge over distributed shared memory. 4, 16 and 32
    rows a block; live lengths that leave chunks empty (they still meet the cluster's barriers), NaN in the
    dead slots; the same bits on a second run."""
    if gpu_device.arch != "sm_90":
        pytest.skip("clusters are checked on sm_90")
    cases = ((decode_attention(1, 32, 8, 768, 64), (1, 37, 300, 768)), (decode_attention(2, 4, 1, 768, 64, sq=4), (4, 700)),
             (decode_attention(1, 8, 1, 768, 64, sq=4), (37, 513)))
    for model, lives in cases:
        payload = aicfc.compile(model, target=gpu_device.arch, precision="fp16", pin={"unit": "split", "CL": 1, **pin})
        (k,) = [k for k in payload["kernels"] if k["family"] == "attention"]
        assert k["params"]["CL"] == 1 and k["params"]["SPLITS"] == pin["SPLITS"]
        for live in lives:
            feeds = inputs_at(model, live, seed=pin["SPLITS"] * 1000 + live)
            ref = reference(feeds)
            first, second = _run_twice(payload, feeds, gpu_device)
            assert not np.isnan(first).any()
            assert rel_err(first, ref) <= RTOL["fp16"], (live, rel_err(first, ref))
            assert np.array_equal(first, second)


def fixture_decode_plan(pin: dict):
    """The Llama fixture's decode step (tests/fixtures/kvcache/llama_gen.onnx), fp16, under `pin`."""
    from pathlib import Path
    from tests.test_state import plan_of as state_plan
    model = onnx.load(str(Path(__file__).resolve().parent / "fixtures" / "kvcache" / "llama_gen.onnx"))
    return state_plan(model, {"input_ids": (1, 1), "cache_position": (1,)}, "fp16", pin)


def test_folded_cache_writes_build_without_spills():
    """The Llama fixture's decode step: the attention with its layer's K and V writes folded in
    (passes/fold_cache_writes.py, after ptxas checked the leaders) builds for sm_90a unspilled."""
    from aicfc.passes.fold_cache_writes import FOLD_RULE
    from tests.test_state import SPLIT
    plan = fixture_decode_plan(SPLIT)
    att = [k for k in plan.kernels if k.family == "attention"]
    assert att and all(FOLD_RULE in k.rewrites for k in att)
    from aicfc.codegen.module import plan_modules
    sub = plan.replace(kernels=tuple(att))
    source = render_module(sub)
    # the layers' attentions are one function ([Note: shared kernel code] in codegen/module.py)
    symbols = plan_modules(sub, 1)[1]
    assert len(att) == 2 and len(set(symbols)) == 1
    # the block whose chunk holds a new row writes it; the last block only a row past the live length
    assert source.count("A new K row at or past the live length") == 1 == source.count("A new V row at or past")
    assert source.count("writes it into the cache now") == 1
    built = build(source, "sm_90")
    for symbol in set(symbols):
        assert built.spills.get(symbol, 0) == 0 and 0 < built.registers[symbol] <= 255


def test_decode_attention_reads_its_cache_before_the_wait():
    """[Note: attention reads before the wait]: the Llama fixture's decode attentions, whose caches
    they update themselves and whose positions are an input, request the positions and their first
    tile before the dependent-launch entry; the query rows after it. The same attention without the
    folded writes (a separate scatter writes its cache) keeps the entry first."""
    from aicfc.codegen import pdl
    from aicfc.passes.fold_cache_writes import EARLY_RULE, why_not_early
    from tests.test_state import SPLIT
    plan = fixture_decode_plan(SPLIT)
    att = [k for k in plan.kernels if k.family == "attention"]
    assert att and all(k.schedule.param.get("PRE") == 1 for k in att)
    assert all(r.applied for r in plan.rewrites if r.rule == EARLY_RULE) and \
        {r.target for r in plan.rewrites if r.rule == EARLY_RULE} == {k.name for k in att}
    source = render_module(plan.replace(kernels=tuple(att), launch=pdl.DEPENDENT))
    body = source.split(att[0].name + "(", 1)[1].split("__global__", 1)[0]
    query = body.index("Qs[x] =" if "Qs[x] =" in body else "qreg[j] = static_cast")   # the SIMT or the tensor-core body's rows
    first_tile, entry = body.index("load_kv(0, c0);"), body.index(pdl.ENTRY)
    assert first_tile < entry < query and body.count(pdl.ENTRY) == 1
    # [Note: the new rows with the query]: the slots it writes with the positions, before the entry; the new rows'
    # reads after the query's are requested (the tensor-core body holds them in registers), so both overlap
    assert body.index("wslot_k[u] = slot") < entry and body.index("wslot_v[u] = slot") < entry
    assert body.index("row_p[r] = ") < entry   # [Note: the rows' positions read once]
    if "qreg[" in body:
        assert query < body.index("float wrow_k") < body.index("Qh[(x / ")
    # unfolded: the cache is written by the scatter kernel, which may run beside the attention's early part
    unfolded = att[0].replace(ops=tuple(op for op in att[0].ops if not op.out.startswith(att[0].stores[-1])))
    assert why_not_early(unfolded, plan) is not None


def test_pin_early_0_keeps_the_entry_first():
    from aicfc.passes.fold_cache_writes import EARLY_RULE
    from tests.test_state import SPLIT
    plan = fixture_decode_plan({**SPLIT, "early": "0"})
    att = [k for k in plan.kernels if k.family == "attention"]
    assert att and all(k.schedule.param["unit"] == "split" and not k.schedule.param.get("PRE") for k in att)
    early = [r for r in plan.rewrites if r.rule == EARLY_RULE]
    assert len(early) == len(att) and all(not r.applied and "early=0" in r.reason for r in early)


# measured on an H200 by `aicfc tune` (benchmarks/results/tune_attention_mma_session19_h200.txt), tune's plain
# launch (0.88 us) taken off: (BN, warps, STAGES, SPLITS) of the tensor-core body, us
MMA_MEASURED = [((64, 4, 2, 12), 5.60), ((128, 4, 2, 6), 5.92), ((64, 4, 4, 4), 6.69), ((128, 8, 4, 2), 7.67),
                ((128, 4, 4, 1), 9.06), ((64, 4, 2, 1), 12.51), ((64, 4, 8, 1), 13.04)]


@pytest.mark.parametrize("sched,measured", MMA_MEASURED, ids=[f"BN{s[0]}-w{s[1]}-st{s[2]}-sp{s[3]}" for s, _ in MMA_MEASURED])
def test_tensor_core_body_within_band_of_the_h200(sched, measured):
    """[Note: split attention on tensor cores]'s fitted terms against the tune run: 8 K/V heads of 4 rows,
    768 live keys; one block a head (SPLITS=1) pays the SM's stream of its whole chunk and no combine."""
    bn, warps, stages, splits = sched
    hw = load_profile("sm_90", "aicfc/profiles/gpus/h200.json")
    p = {"BN": bn, "warps": warps, "STAGES": stages, "SPLITS": splits, "MMA": 1, "dtype": "f16"}
    t = split_attention_terms(8, 4, 768, 64, 64, p, 2, hw, 0.4, 2)
    assert 0.8 <= measured / t["time_us"] <= 1.25, (measured, t["time_us"])
    assert (t["t_combine_us"] == 0.0) == (splits == 1)


# measured on an H200 by `aicfc tune` (session 45, the pushed merge, benchmarks/results/attention_push_session45_h200.txt),
# tune's plain launch (0.88 us) taken off: (BN, warps, STAGES, SPLITS) of the tensor-core body as a cluster, us
CL_MEASURED = [((128, 4, 2, 6), 4.07), ((128, 8, 2, 6), 4.07), ((64, 4, 2, 6), 4.28), ((128, 4, 2, 3), 5.07),
               ((64, 4, 4, 4), 4.71)]


@pytest.mark.parametrize("sched,measured", CL_MEASURED, ids=[f"BN{s[0]}-w{s[1]}-st{s[2]}-sp{s[3]}" for s, _ in CL_MEASURED])
def test_cluster_merge_within_band_of_the_h200(sched, measured):
    """[Note: split attention as a cluster]'s terms against the tune run (8 K/V heads of 4 rows, 768 live keys)."""
    bn, warps, stages, splits = sched
    hw = load_profile("sm_90", "aicfc/profiles/gpus/h200.json")
    p = {"BN": bn, "warps": warps, "STAGES": stages, "SPLITS": splits, "MMA": 1, "dtype": "f16", "CL": 1}
    t = split_attention_terms(8, 4, 768, 64, 64, p, 2, hw, 0.4, 2)
    assert 0.8 <= measured / t["time_us"] <= 1.25, (measured, t["time_us"])
    ticket = split_attention_terms(8, 4, 768, 64, 64, {**p, "CL": 0}, 2, hw, 0.4, 2)
    assert t["time_us"] < ticket["time_us"]   # measured 4.95 against 6.24 us for 6 chunks of 128 keys


def test_cluster_needs_an_sm_a_block():
    """B8 (64 K/V heads): 4 chunks of 64 keys as clusters sharing SMs (256 blocks) measured 14.1 us against
    9.1 through the ticket, so CL = 1 is refused past one block an SM; 2 chunks (128 blocks) are kept."""
    assert attention_split.cluster_why_not({"CL": 1, "SPLITS": 4}, 256, 132)
    assert attention_split.cluster_why_not({"CL": 1, "SPLITS": 2}, 128, 132) is None
    assert attention_split.cluster_why_not({"CL": 0, "SPLITS": 4}, 256, 132) is None
    opts = Options("sm_90", load_profile("sm_90", "aicfc/profiles/gpus/h200.json"), "fp16")
    k = the_kernel(run_pipeline(import_model(decode_attention(8, 32, 8, 768, 64)), opts).plan)
    assert k.schedule.param["CL"] == 1 and k.schedule.grid[0] <= 132


def test_decode_picks_the_tensor_core_body_on_the_h200():
    """The 1B Llama's decode attention (32 heads over 8, 768 slots) picks what measured fastest: 6 chunks of
    128 keys as a cluster (5.15 us in tune's launches; 12 through the ticket, the pick before, 5.56)."""
    opts = Options("sm_90", load_profile("sm_90", "aicfc/profiles/gpus/h200.json"), "fp16")
    k = the_kernel(run_pipeline(import_model(decode_attention(1, 32, 8, 768, 64)), opts).plan)
    p = k.schedule.param
    assert (p["unit"], p["MMA"], p["BN"], p["warps"], p["SPLITS"], p["CL"]) == ("split", 1, 128, 4, 6, 1)
