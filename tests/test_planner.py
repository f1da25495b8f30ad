"""The planner: precision policy, tensor-core candidates, targets and --pin, all on CPU."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import aicfc
from aicfc.errors import AicfError


def matmul(m: int, k: int, n: int):
    w = np.random.default_rng(0).standard_normal((k, n)).astype(np.float32)
    g = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "mm",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [m, k])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [m, n])],
                          [numpy_helper.from_array(w, "w")])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def only_kernel(payload: dict) -> dict:
    (k,) = payload["kernels"]
    return k


def test_fp32_never_uses_tensor_cores_and_says_why():
    k = only_kernel(aicfc.compile(matmul(512, 512, 512), precision="fp32"))
    assert k["params"]["unit"] == "simt"
    assert any("does not allow tensor cores" in c.get("rejected_because", "") for c in k["candidates"])


@pytest.mark.parametrize("precision,dtype,storage", [("tf32", "tf32", "float32"), ("fp16", "f16", "float16"),
                                                     ("bf16", "bf16", "bfloat16")])
def test_precision_policy_is_recorded(precision, dtype, storage):
    payload = aicfc.compile(matmul(1024, 1024, 1024), precision=precision)
    k = only_kernel(payload)
    # the default target is sm_90: the Hopper engine (tf32 reads the weight re-laid out K-major)
    assert payload["precision"] == precision and k["params"] == k["params"] | {"unit": "wgmma", "dtype": dtype}
    tensors = [b for b in payload["buffers"] if b["name"] in ("x", "w", "y")]
    assert [b["dtype"] for b in tensors] == [storage] * 3
    # the interface keeps the model's float32; aicf-run converts on the host
    assert payload["inputs"][0]["dtype"] == payload["outputs"][0]["dtype"] == "float32"
    assert any(d["rule"] == f"precision {precision}" for d in payload["decisions"] if d["kind"] == "rewrite")
    assert f"precision={precision}" in payload["ir"]["decision"]


def test_target_changes_costs_and_decisions():
    """sm_80 (A100) and sm_90 (H100) differ in SM count, tensor-core rate and shared memory:
    the same GEMM gets other predicted times and, here, another tile."""
    picks = {}
    for target in ("sm_80", "sm_90"):
        k = only_kernel(aicfc.compile(matmul(4096, 768, 768), target=target, precision="fp16"))
        picks[target] = (k["predicted"]["time_us"], k["params"])
    (t80, p80), (t90, p90) = picks["sm_80"], picks["sm_90"]
    assert t80 > 1.5 * t90
    assert p80 != p90


def test_pin_restricts_and_is_recorded():
    payload = aicfc.compile(matmul(256, 256, 256), precision="fp16", pin={"unit": "simt", "BM": "64"})
    k = only_kernel(payload)
    assert k["params"]["unit"] == "simt" and k["params"]["BM"] == 64
    assert any(d["rule"].startswith("--pin") for d in payload["decisions"] if d["kind"] == "rewrite")
    with pytest.raises(AicfError, match="no feasible gemm candidate"):
        aicfc.compile(matmul(256, 256, 256), precision="fp16", pin={"BM": "7"})


def two_matmuls(m: int, k: int):
    """x -> MatMul `first` (w1) -> MatMul `second` (w2): two kernels posing the same scheduling problem."""
    rng = np.random.default_rng(0)
    w1, w2 = (rng.standard_normal((k, k)).astype(np.float32) for _ in range(2))
    g = helper.make_graph([helper.make_node("MatMul", ["x", "w1"], ["h"], name="first"),
                           helper.make_node("MatMul", ["h", "w2"], ["y"], name="second")], "mm2",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [m, k])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [m, k])],
                          [numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(w2, "w2")])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def test_node_pin_restricts_only_the_kernel_covering_that_node():
    """`--pin NODE:KEY=VALUE`: the kernel covering ONNX node NODE gets the pin, the other kernel of
    the very same scheduling problem keeps the model's pick (the two do not share a ranking)."""
    free = aicfc.compile(two_matmuls(256, 256), precision="fp16")
    assert [k["onnx_nodes"] for k in free["kernels"]] == [["first"], ["second"]]
    assert free["kernels"][0]["params"] == free["kernels"][1]["params"] and free["kernels"][0]["params"]["unit"] != "simt"
    payload = aicfc.compile(two_matmuls(256, 256), precision="fp16", pin={"second:unit": "simt", "second:BM": "64"})
    by_node = {k["onnx_nodes"][-1]: k for k in payload["kernels"]}
    assert by_node["second"]["params"]["unit"] == "simt" and by_node["second"]["params"]["BM"] == 64
    assert by_node["first"]["params"] == free["kernels"][0]["params"]
    rules = [d["rule"] for d in payload["decisions"] if d["kind"] == "rewrite" and d["rule"].startswith("--pin")]
    assert rules == ["--pin second:BM=64 second:unit=simt"]


@pytest.mark.parametrize("pin,message", [
    ({"nowhere:unit": "simt"}, "no kernel of the plan covers ONNX node 'nowhere'"),
    ({"second:FOO": "1"}, r"no gemm schedule of kernel k\d+ has this key \(FOO\)"),
    ({"second:BM": "7"}, "no feasible gemm candidate matches --pin second:BM=7"),
    ({"second:early": "0"}, "switches a rewrite for the whole plan"),
    ({":unit": "simt"}, "expected NODE:KEY=VALUE"),
])
def test_node_pin_errors_name_the_problem(pin, message):
    with pytest.raises(AicfError, match=message):
        aicfc.compile(two_matmuls(256, 256), precision="fp16", pin=pin)


def test_applied_pins_bind_plan_wide_only_where_a_candidate_has_their_keys():
    """`applied_pins`, the one rule plan_schedules, pinned_best and the layout decision share: a node's own pins
    always apply (over a plan-wide pin of the same key), the plan-wide ones where some candidate has all their keys."""
    from types import SimpleNamespace

    from aicfc.passes.plan_schedules import applied_pins, own_pins
    gemm = [SimpleNamespace(params={"BM": 64, "unit": "simt"}), SimpleNamespace(params={"BM": 128, "unit": "wgmma"})]
    pointwise = [SimpleNamespace(params={"threads": 128})]
    assert applied_pins(gemm, {"BM": "64"}, {}) == ({"BM": "64"}, True)
    assert applied_pins(pointwise, {"BM": "64"}, {"threads": "256"}) == ({"threads": "256"}, False)
    assert applied_pins(gemm, {"BM": "64", "threads": "256"}, {}) == ({}, False)   # all of the keys, or none
    assert applied_pins(gemm, {"BM": "64"}, {"BM": "128"}) == ({"BM": "128"}, True)
    assert applied_pins(gemm, {}, {}) == ({}, False)
    kernel = SimpleNamespace(origins=("first", "second"))
    assert own_pins(kernel, {"second": {"BM": "64"}, "third": {"unit": "simt"}}) == {"BM": "64"}


def test_mma_candidates_respect_shared_memory_per_target():
    """sm_86 allows 99 KiB per block: the 4-stage 256x128x64 tile (192 KiB) is rejected there."""
    k = only_kernel(aicfc.compile(matmul(4096, 4096, 4096), target="sm_86", precision="fp16"))
    reasons = [c["rejected_because"] for c in k["candidates"] if "rejected_because" in c]
    assert any("shared memory" in r for r in reasons)
    assert k["smem_bytes"] <= 101376


def test_split_k_only_where_tiles_cannot_fill_the_gpu():
    small = only_kernel(aicfc.compile(matmul(128, 3072, 768), precision="fp16"))
    big = only_kernel(aicfc.compile(matmul(4096, 4096, 4096), precision="fp16"))
    assert small["params"]["SPLITK"] > 1 and big["params"]["SPLITK"] == 1
    # split-k through scratch (CL = 0; as a cluster, CL = 1, the splits need none: test_gemm_wgmma.py)
    payload = aicfc.compile(matmul(128, 3072, 768), precision="fp16", pin={"CL": "0"})
    names = {b["name"]: b for b in payload["buffers"]}
    assert names["k0.tickets"]["region"] == "weights" and names["k0.partials"]["region"] == "arena"
    tickets = next(w for w in payload["weights"] if w["buffer"] == names["k0.tickets"]["id"])
    assert set(tickets["data"]) == {0}


def test_leaders_are_ranked_with_ptxas_registers():
    """The check's counts replace the estimate: a leader given registers that cost it its
    second resident block falls behind; one that spills is rejected, with ptxas named."""
    from aicfc.passes.pipeline import Options, run_pipeline
    from aicfc.passes.plan_schedules import CHECK_MAX, check_leaders, rank
    from aicfc.frontend.onnx_import import import_model
    from aicfc.planner.hardware import load_profile

    hw = load_profile("sm_90", None)
    plan = run_pipeline(import_model(matmul(4096, 768, 768), None, name="mm"), Options("sm_90", hw, "fp32")).plan
    (k,) = plan.kernels
    ranked, rejected = rank(k, plan, hw)
    asked = []

    def check(plan, problems):
        (kernel, params), = problems
        asked.extend(params)
        # the leader at 255 registers (one block of its threads per SM), the second spilling
        return [[(255, 0), (64, 128)] + [(64, 0)] * (len(params) - 2)]
    (again,) = check_leaders(plan, hw, [(k, ranked, rejected)], check)
    assert 2 <= len(asked) <= CHECK_MAX and asked[0] == ranked[0].params
    first = next(r for r in again if r.params == ranked[0].params)
    assert first.registers == 255 and first.time_us > ranked[0].time_us
    assert again[0].params != ranked[0].params
    assert all(r.params != ranked[1].params for r in again)
    assert any(c.params == tuple(sorted(ranked[1].params.items())) and "spills 128 B" in c.rejected_because
               and "(ptxas)" in c.rejected_because for c in rejected)


def test_when_every_leader_spills_the_next_candidates_are_built():
    """All leaders spilling is no verdict on the rest: the next CHECK_MAX in rank are built, and
    the first that does not spill wins; where every round spills, the leaders stay."""
    from aicfc.passes.pipeline import Options, run_pipeline
    from aicfc.passes.plan_schedules import CHECK_MAX, SPILL_ROUNDS, check_leaders, rank
    from aicfc.frontend.onnx_import import import_model
    from aicfc.planner.hardware import load_profile

    hw = load_profile("sm_90", None)
    plan = run_pipeline(import_model(matmul(4096, 768, 768), None, name="mm"), Options("sm_90", hw, "fp32")).plan
    (k,) = plan.kernels
    ranked, rejected = rank(k, plan, hw)
    rounds = []

    def check(plan, problems):
        (kernel, params), = problems
        rounds.append(list(params))
        if len(rounds) == 1:
            return [[(255, 64)] * len(params)]                    # every leader spills
        return [[(64, 0)] + [(255, 32)] * (len(params) - 1)]      # the first of the next ones does not
    (again,) = check_leaders(plan, hw, [(k, ranked, rejected)], check)
    assert len(rounds) == 2 and rounds[1][0] == ranked[len(rounds[0])].params and len(rounds[1]) <= CHECK_MAX
    spilled = rounds[0] + rounds[1][1:]
    assert not any(r.params in spilled for r in again)            # the pick never spills
    assert any(r.params == rounds[1][0] and r.registers == 64 for r in again)
    assert sum("spills" in c.rejected_because for c in rejected) == len(rounds[0]) + len(rounds[1]) - 1

    rounds.clear()
    ranked, rejected = rank(k, plan, hw)
    (again,) = check_leaders(plan, hw, [(k, ranked, rejected)], lambda plan, problems: (
        rounds.append(1), [[(255, 8)] * len(problems[0][1])])[1])
    assert len(rounds) == 1 + SPILL_ROUNDS and not any("spills" in c.rejected_because for c in rejected)


def test_compile_checks_registers_with_ptxas_unless_told_not_to(tmp_path, monkeypatch):
    monkeypatch.setenv("AICF_CACHE_DIR", str(tmp_path))
    checked = only_kernel(aicfc.compile(matmul(256, 512, 512), precision="fp32"))
    assert checked["predicted"]["registers_ptxas"] == checked["registers"]
    blind = only_kernel(aicfc.compile(matmul(256, 512, 512), precision="fp32", check_registers=False))
    assert "registers_ptxas" not in blind["predicted"]


def batched_matmul(b: int, m: int, k: int, n: int, shared: bool):
    w = np.random.default_rng(0).standard_normal((k, n) if shared else (b, k, n)).astype(np.float32)
    g = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "bmm",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [b, m, k])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [b, m, n])],
                          [numpy_helper.from_array(w, "w")])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("shared", [True, False])
def test_a_weight_shared_by_the_batch_is_read_by_every_batch_item(shared):
    """ResNet-50's stage-4 1x1 convolutions as a batched GEMM (32 images of 49 pixels, M = 49 per
    batch item): a 64x128 mma tile's L2 re-reads are A 15 times over (16 column tiles) and the
    weight once per batch item beyond the first, 31 times, not 0 (`cost.tile_rereads`); a weight
    of its own per batch item is read once."""
    from aicfc.planner.hardware import load_profile
    k = only_kernel(aicfc.compile(batched_matmul(32, 49, 512, 2048, shared), precision="fp16",
                                  pin={"unit": "mma", "BM": "64", "BN": "128"}, check_registers=False))
    assert k["grid"] == [16, 1, 32]
    a, w = 32 * 49 * 512 * 2, (32 if not shared else 1) * 512 * 2048 * 2
    l2 = k["predicted"]["t_l2_us"] * load_profile("sm_90").l2_bandwidth_gbs * 1e3
    assert l2 == pytest.approx(15 * a + (31 * w if shared else 0), rel=1e-4)


def test_rankings_remembered_within_a_compile():
    """[Note: rankings remembered] (passes/plan_schedules.py): the same kernel of two plans of one graph is
    ranked once (the second answer is the first's candidates), a profile with other data ranks again, and
    run_pipeline keeps at most RANKED_BETWEEN at its end; the plan is the one ranking every time gives."""
    import dataclasses
    from aicfc.frontend.onnx_import import import_model
    from aicfc.passes import plan_schedules as PS
    from aicfc.passes.pipeline import PIPELINE, Options, run_pipeline
    from aicfc.planner.hardware import Profile, load_profile
    from tests import onnx_builders as B
    model = B.resnet_stage_model((2, 64, 16, 16), mid=32, out=128, stride=2)
    hw = load_profile("sm_90")
    opts = Options("sm_90", hw, "fp16", projections=())
    plans = []
    for _ in range(2):
        ir = import_model(model)
        for stage in PIPELINE[:[s.name for s in PIPELINE].index("relayout_weights") + 1]:
            ir = stage.run(ir, opts)
        plans.append(ir)
    k0, k1 = plans[0].kernels[1], plans[1].kernels[1]
    assert k0 is not k1 and k0 == k1
    PS.forget_rankings()
    first = PS.rank(k0, plans[0], hw)
    again = PS.rank(dataclasses.replace(k1, name="other"), plans[1], load_profile("sm_90"))
    assert [r.params for r in again[0]] == [r.params for r in first[0]]
    assert all(a is b for a, b in zip(again[0], first[0]))              # remembered, not recomputed
    other = Profile(dict(hw.data, launch_overhead_us=hw.data.get("launch_overhead_us", 1.0) + 5.0))
    assert not any(a is b for a, b in zip(PS.rank(k1, plans[1], other)[0], first[0]))
    run_pipeline(import_model(model), Options("sm_90", hw, "fp16"))
    assert 0 < len(PS._ranked) <= PS.RANKED_BETWEEN
    PS.forget_rankings()
    PS.RANKED_KEEP, keep = 0, PS.RANKED_KEEP
    try:
        cold = run_pipeline(import_model(model), Options("sm_90", hw, "fp16")).plan
    finally:
        PS.RANKED_KEEP = keep
    warm = run_pipeline(import_model(model), Options("sm_90", hw, "fp16")).plan
    assert [k.schedule for k in cold.kernels] == [k.schedule for k in warm.kernels]


def test_ties_go_to_two_consumer_warpgroups():
    """Two wgmma schedules of the same tile, predicted the same in every term, one with a lone consumer
    warpgroup and one ping-pong pair: the pair ranks first (plan_schedules._order; session 29's tune measured
    ResNet-50 B32's 7x7x512 3x3 convolutions 16.5-17.1 us with two against 19.9-20.0 with one)."""
    from aicfc.passes.plan_schedules import Ranked, _order
    from aicfc.planner.cost import Estimate

    terms = {"t_pipeline_us": 1.19, "t_epilogue_us": 1.2, "t_compute_us": 13.33, "t_smem_us": 7.88}
    base = {"unit": "wgmma", "BM": 64, "BN": 128, "MI": 1, "STAGES": 6, "CTAS": 100, "A": "tma", "OUT": 2}
    one = Ranked(dict(base, NWG=1, PP=0), (100, 1, 1), (256, 1, 1), 0, Estimate(17.0, 7.4e9, 8e6, dict(terms)))
    two = Ranked(dict(base, NWG=2, PP=1), (100, 1, 1), (384, 1, 1), 0, Estimate(17.0, 7.4e9, 8e6, dict(terms)))
    assert sorted([one, two], key=_order)[0] is two
    # the time still comes first: a lone warpgroup predicted faster keeps its place
    faster = Ranked(dict(base, NWG=1, PP=0), (100, 1, 1), (256, 1, 1), 0, Estimate(16.9, 7.4e9, 8e6, dict(terms)))
    assert sorted([two, faster], key=_order)[0] is faster
