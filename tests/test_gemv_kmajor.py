"""The gemv over a K-major weight ([Note: the gemv over a K-major weight] in codegen/gemm_gemv.py) and the layout
rule that chooses it (relayout_weights.GEMV_RULE, `--pin kmajor`).

Without a GPU: which weights the rule stores K-major (a one-row gemv predicted faster so, the rotary QKV and the O
projection that takes the L2 fill included; one of 2-8 rows on tensor cores, unless `--pin kmajor=one`), that a bundle of a prefill and a decode plan
stores them once and K-major in both, that `--pin kmajor=0` keeps [K, N], that a rotary block under the head takes
both halves' columns, that MB (the launch bounds' blocks an SM) follows the grid, and that every candidate of the
space compiles without spills. On the GPU: pinned schedules against numpy float64 (fp16/bf16: 1e-2 of the output's
max), with bias, a residual and the rotary epilogue, and the same bits on a second run; the tensor-core steps over
a K-major weight at 2-8 rows the same way."""
from __future__ import annotations

import functools

import numpy as np
import pytest

from aicfc.codegen import gemm, gemm_gemv
from aicfc.driver import compile_plans
from aicfc.passes.relayout_weights import GEMV_RULE
from aicfc.planner.cost import estimate_registers
from tests.test_gemv import _run_against_numpy, rows_model
from tests.test_l2_fill import wide
from tests.test_row_scale import decode_shapes
from tests.sweep import to_build
from tests.test_state import plan_of


def _gemm(plan):
    (k,) = [k for k in plan.kernels if k.family == "gemm"]
    return k


def test_a_one_row_projection_reads_its_weight_k_major():
    plan = plan_of(rows_model(1, 5632, 2048, np.random.default_rng(0), residual=True), {}, "fp16")
    k = _gemm(plan)
    assert GEMV_RULE in k.rewrites and k.schedule.param["unit"] == "gemv" and k.schedule.param["KM"] == 1
    assert plan.types()[gemm.dims(k)[0].b.buffer].shape == (2048, 5632)
    assert any(r.rule == GEMV_RULE and r.applied and "predicted" in r.reason for r in plan.rewrites)
    off = plan_of(rows_model(1, 5632, 2048, np.random.default_rng(0), residual=True), {}, "fp16", {"kmajor": "0"})
    assert GEMV_RULE not in _gemm(off).rewrites and not _gemm(off).schedule.param.get("KM")


def test_a_weight_kept_k_by_n_says_what_k_major_was_predicted():
    """The layout is a decision either way: under the H200's profile the one-row down projection's best schedule (a
    tile on the mma unit, which reads either layout) is predicted no faster over the weight K-major, and the record
    says so with both times."""
    plan = plan_of(rows_model(1, 5632, 2048, np.random.default_rng(0), residual=True), {}, "fp16", profile="h200")
    (record,) = [r for r in plan.rewrites if r.rule == GEMV_RULE]
    assert not record.applied and "predicted no faster over it K-major" in record.reason
    assert " us [K, N] against " in record.reason and not _gemm(plan).schedule.param.get("KM")


def test_a_bad_kmajor_pin_is_one_line():
    from aicfc.errors import AicfError
    with pytest.raises(AicfError, match="no weight named 'nope'"):
        plan_of(rows_model(1, 256, 256, np.random.default_rng(0)), {}, "fp16", {"kmajor": "nope"})


@pytest.mark.parametrize("rows", [2, 8])
def test_more_rows_read_the_weight_k_major_where_predicted_faster(rows):
    """By default (and under its old name `--pin kmajor=tc`) 2-8 rows' weights are offered K-major to the tensor-core
    steps over them ([Note: the tensor-core gemv over a K-major weight]) and taken where predicted faster: the 1 B
    Llama's down projection is; `--pin kmajor=one` keeps them [K, N] (the default until session 69)."""
    for pin in ({}, {"kmajor": "tc"}):
        plan = plan_of(rows_model(rows, 5632, 2048, np.random.default_rng(0)), {}, "fp16", pin)
        p = _gemm(plan).schedule.param
        assert GEMV_RULE in _gemm(plan).rewrites and (p["KM"], p["TC"], p["BM"]) == (1, 1, rows) and p["KS"] == p["WARPS"]
    one = plan_of(rows_model(rows, 5632, 2048, np.random.default_rng(0)), {}, "fp16", {"kmajor": "one"})
    assert GEMV_RULE not in _gemm(one).rewrites and not _gemm(one).schedule.param.get("KM")


@pytest.mark.parametrize("pin", [{"TC": "0"}, {"MatMul_0:TC": "0"}], ids=["plan-wide", "node"])
def test_a_pin_the_k_major_schedules_cannot_meet_keeps_the_weight_k_by_n(pin):
    """Every gemv of 2-8 rows over a K-major weight is on tensor cores, so `--pin TC=0` (plan-wide or the node's own)
    leaves it none: the layout decision weighs only the schedules the pins leave, keeps the weight [K, N] and says
    why, and the plan is the one `--pin kmajor=one` gives (session 72: under the session-69 default the pin failed
    with 'no feasible gemm candidate')."""
    model = lambda: rows_model(2, 5632, 2048, np.random.default_rng(0))
    plan = plan_of(model(), {}, "fp16", pin)
    p = _gemm(plan).schedule.param
    assert GEMV_RULE not in _gemm(plan).rewrites and not p.get("KM") and p["TC"] == 0
    (record,) = [r for r in plan.rewrites if r.rule == GEMV_RULE]
    assert not record.applied and "leaves its readers no schedule over it K-major" in record.reason
    assert _gemm(plan_of(model(), {}, "fp16", pin | {"kmajor": "one"})).schedule == _gemm(plan).schedule


def test_a_pin_only_the_k_major_schedules_have_takes_that_layout():
    """Under the H200's profile the one-row down projection is predicted no faster K-major (the test above), but
    `--pin KM=1 KS=2` binds only schedules over a K-major weight: the layout that meets the pins is taken, where it
    used to stay [K, N] and leave the pin binding nothing (an error)."""
    model = rows_model(1, 5632, 2048, np.random.default_rng(0), residual=True)
    plan = plan_of(model, {}, "fp16", {"KM": "1", "KS": "2"}, profile="h200")
    (record,) = [r for r in plan.rewrites if r.rule == GEMV_RULE]
    assert record.applied and "binds its readers' schedules over it K-major alone" in record.reason
    assert (_gemm(plan).schedule.param["KM"], _gemm(plan).schedule.param["KS"]) == (1, 2)


def test_a_node_pin_sets_its_gemv_apart_from_its_twins():
    """Two one-row projections of one shape are ranked once for the layout, unless a node's own pin sets one apart:
    `--pin MatMul_0:KS=2` takes its weight K-major and leaves its twin's to the predictions ([K, N] under the H200's
    profile)."""
    from onnx import TensorProto, helper
    rng = np.random.default_rng(0)
    inits = [helper.make_tensor(n, TensorProto.FLOAT, [5632, 2048], rng.standard_normal(5632 * 2048).astype(np.float32)
                                .tobytes(), raw=True) for n in ("w0", "w1")]
    nodes = [helper.make_node("MatMul", ["x", w], [y], name=f"MatMul_{i}") for i, (w, y) in enumerate([("w0", "y0"),
                                                                                                        ("w1", "y1")])]
    graph = helper.make_graph(nodes, "twins", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 5632])],
                              [helper.make_tensor_value_info(y, TensorProto.FLOAT, [1, 2048]) for y in ("y0", "y1")],
                              inits)
    plan = plan_of(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), {}, "fp16",
                   {"MatMul_0:KS": "2"}, profile="h200")
    applied = {r.target: r.applied for r in plan.rewrites if r.rule == GEMV_RULE}
    assert applied == {"w0": True, "w1": False}


def _session69_timings() -> list[tuple[float, float, dict]]:
    """(predicted us, measured us, schedule) of every tensor-core K-major schedule session 69 timed alone on an
    H200 (benchmarks/results/tckm_fit_session69_h200.json), predicted by today's terms from the inputs it recorded,
    its blocks an SM from ptxas's register count (as the planner re-costs its leaders)."""
    import json
    from pathlib import Path
    from aicfc.planner import cost_gemv
    from aicfc.planner.hardware import blocks_per_sm, load_profile
    hw = load_profile("sm_90")
    data = json.loads((Path(__file__).parents[1] / "benchmarks/results/tckm_fit_session69_h200.json").read_text())
    out = []
    for r in data["rows"]:
        if not r["params"].get("KM"):
            continue
        t = r["terms"]
        bps = blocks_per_sm(gemm_gemv.threads(r["params"]), 0, r["registers"], hw)[0]
        terms = cost_gemv.profile_terms(r["params"], r["rows"], r["N"], r["K"], 2, t["bytes"], bps, hw)
        out.append((terms["time_us"] + t["launch_us"], r["measured_us"], dict(r["params"], shape=r["shape"])))
    return out


def test_the_tensor_core_k_major_terms_fit_what_session_69_timed():
    """[Note: the tensor-core gemv's stream] (planner/cost_gemv.py): 46 of the 48 within [0.8, 1.25] of their
    predictions, and each projection's predicted best within 5% of its measured best but the gate/up's, whose five
    schedules tied at the stream's cap ran 12.20-13.77 us."""
    rows = _session69_timings()
    assert len(rows) == 48
    assert sum(0.8 <= meas / pred <= 1.25 for pred, meas, _ in rows) >= 46
    for shape in ("qkv_rope", "o_proj", "down"):
        mine = [(pred, meas) for pred, meas, p in rows if p["shape"] == shape]
        assert min(mine)[1] <= 1.05 * min(meas for _, meas in mine), shape
    gate_up = [(pred, meas) for pred, meas, p in rows if p["shape"] == "gate_up"]
    tied = [meas for pred, meas in gate_up if pred <= min(gate_up)[0] + 1e-6]
    assert len(tied) == 5 and min(tied) == min(meas for _, meas in gate_up)


def test_a_tensor_core_k_major_full_grid_pays_only_in_one_round():
    """The full-grid term ([Note: a gemv leaves room]) is charged to a tensor-core K-major grid of one round alone:
    rounds of its blocks end at their own times and leave slots free ([Note: the tensor-core gemv's stream])."""
    from aicfc.planner import cost_gemv
    from aicfc.planner.hardware import load_profile
    hw = load_profile("sm_90")
    p = {"unit": "gemv", "BM": 8, "BN": 16, "WARPS": 8, "U": 4, "SPLITK": 1, "CL": 0, "KM": 1, "TC": 1, "KS": 8}
    def full(n, bps):
        return cost_gemv.profile_terms(p, 8, n, 2048, 2, 2048 * n * 2, bps, hw)["t_full_us"]
    assert full(11264, 3) == 0.0                                        # 704 blocks, 3 an SM: 2 rounds
    assert full(132 * 16 * 3, 3) == cost_gemv.CONSTANTS["gemv_full_us"]   # 396 blocks, 3 an SM: one round, full
    assert full(11264, 6) == 0.0                                        # 704 blocks, 6 an SM: room left
    plain = {k: v for k, v in p.items() if k not in ("KM", "TC")} | {"TC": 0}
    assert cost_gemv.profile_terms(plain, 1, 11264, 2048, 2, 2048 * 11264 * 2, 3, hw)["t_full_us"] == \
        cost_gemv.CONSTANTS["gemv_full_us"]


def test_the_benchmarks_tc_candidate_pins_a_tensor_core_k_major_schedule():
    """`benchmarks/gemv.py --cand SHAPE:kmajor=tc,KM=1,TC=1,...` (what `b8_round.sh tcall` times): the word stays a
    word, the numbers become ints, and the pin compiles to that schedule over a K-major weight."""
    from benchmarks.gemv import parse_cands
    cands = parse_cands(["down:kmajor=tc,KM=1,TC=1,BN=16,WARPS=8,U=4", "down:BN=64"])
    assert cands == {"down": [{"unit": "gemv", "kmajor": "tc", "KM": 1, "TC": 1, "BN": 16, "WARPS": 8, "U": 4},
                              {"unit": "gemv", "BN": 64}]}
    plan = plan_of(rows_model(8, 5632, 2048, np.random.default_rng(0)), {}, "fp16", cands["down"][0])
    p = _gemm(plan).schedule.param
    assert GEMV_RULE in _gemm(plan).rewrites and (p["KM"], p["TC"], p["BN"], p["WARPS"], p["U"]) == (1, 1, 16, 8, 4)


def test_every_tensor_core_k_major_candidate_builds_without_spills():
    """The tensor-core steps over a K-major weight at 3 rows, N not a multiple of the tile, K not of a warp's part:
    each candidate builds; at most the spills the register check rejects (none at U 1 or 4)."""
    from aicfc.codegen.module import count_registers
    plan = plan_of(rows_model(3, 2000, 1032, np.random.default_rng(2), bias=True), {}, "fp16", {"kmajor": "tc"})
    k = _gemm(plan)
    space = [p for p in gemm.space(k, plan) if p.get("KM")]
    assert space and all(p["TC"] == 1 and p["BM"] == 3 and p["SPLITK"] == 1 for p in space)
    (found,) = count_registers(plan, [(k, space)])
    assert all(0 < regs <= 255 for regs, _ in found)
    assert not [(p, spill) for p, (_, spill) in zip(space, found) if spill and p["U"] != 2]


def test_the_decode_step_reads_its_rotary_and_filled_projections_k_major():
    """At the 1 B Llama's widths the rotary QKV reads K-major ([Note: a rotary gemv over a K-major weight]: both
    halves of its heads in each block) and so does the O projection after the decode attention, whose blocks take
    the L2 fill as one bulk request a run of their columns."""
    from aicfc.passes.l2_fill import RULE as FILL
    plan = plan_of(wide(), decode_shapes(1), "fp16")   # the 1 B Llama's widths: its K-major picks
    rotary = filled = 0
    for i, k in enumerate(plan.kernels):
        if k.family != "gemm":
            continue
        km = GEMV_RULE in k.rewrites
        assert bool(k.schedule.param.get("KM")) == km
        if gemm.rotary(k) is not None:
            assert km and gemm.why_not_rotary(gemm.rotary(k), k.schedule.param) is None
            rotary += 1
        if plan.kernels[i - 1].family == "attention":
            assert km and k.schedule.param.get("PF") == 1, k.name
            filled += 1
    assert rotary and filled
    assert any(r.rule == FILL and r.applied for r in plan.rewrites)


def test_a_bundle_stores_the_k_major_weights_once():
    """A prefill plan (512 rows, wgmma/mma read either layout) and a decode plan (one row) over one copy: the
    weights the decode plan reads K-major are K-major in both, so every weight is stored once."""
    model = rows_model(1, 5632, 2048, np.random.default_rng(0), residual=True)
    model.graph.input[0].type.tensor_type.shape.dim[1].dim_param = "s"
    model.graph.input[1].type.tensor_type.shape.dim[1].dim_param = "s"
    model.graph.output[0].type.tensor_type.shape.dim[1].dim_param = "s"
    payload = compile_plans(model, [["x=1x64x5632", "x2=1x64x2048"], ["x=1x1x5632", "x2=1x1x2048"]],
                            check_registers=False, precision="fp16")
    assert len(payload["weights"]) == 1 and all(len(p["weights"]) == 1 for p in payload["plans"])
    rules = [[r for kk in p["kernels"] for r in kk["rewrites"]] for p in payload["plans"]]
    assert all(GEMV_RULE in r for r in rules)


def test_a_plan_that_needs_the_weight_k_by_n_keeps_it_so_in_every_plan():
    """A one-row plan chooses K-major first; under `--pin kmajor=one` a two-row plan of the same bundle (tensor-core
    steps over [K, N]) declines it, so the weight stays [K, N] and the one-row plan is compiled again: one copy, no
    plan K-major. By default the two-row plan reads it K-major too (its tensor-core steps over K-major weights)."""
    model = rows_model(1, 5632, 2048, np.random.default_rng(0), residual=True)
    for vi in (*model.graph.input, *model.graph.output):
        vi.type.tensor_type.shape.dim[0].dim_param = "b"
    sets = [["x=2x1x5632", "x2=2x1x2048"], ["x=1x1x5632", "x2=1x1x2048"]]
    payload = compile_plans(model, sets, check_registers=False, precision="fp16", pin={"kmajor": "one"})
    assert [len(w["data"]) for w in payload["weights"]].count(5632 * 2048 * 2) == 1   # (the two-row plan has a small constant too)
    for plan in payload["plans"]:
        assert not any(GEMV_RULE in r for kk in plan["kernels"] for r in kk["rewrites"])
    assert any(d.get("rule") == GEMV_RULE and not d["applied"] for d in payload["plans"][0]["decisions"])
    payload = compile_plans(model, sets, check_registers=False, precision="fp16")
    assert [len(w["data"]) for w in payload["weights"]].count(5632 * 2048 * 2) == 1
    for plan in payload["plans"]:
        (gemv,) = [kk for kk in plan["kernels"] if kk["family"] == "gemm"]
        assert any(GEMV_RULE in r for r in gemv["rewrites"]) and gemv["params"]["KM"] == 1


def test_every_k_major_candidate_builds_without_spills():
    from aicfc.codegen.module import count_registers
    plan = plan_of(rows_model(1, 2000, 1032, np.random.default_rng(2), bias=True), {}, "fp16")
    k = _gemm(plan)
    space = [p for p in gemm.space(k, plan) if p.get("KM")]
    assert space and all(p["SPLITK"] == 1 and p["BM"] == 1 for p in space)
    space = to_build(space, functools.partial(estimate_registers, k))
    (found,) = count_registers(plan, [(k, space)])
    bad = [(p, regs, spill) for p, (regs, spill) in zip(space, found) if spill or not 0 < regs <= 255]
    assert not bad, f"{len(bad)} of {len(space)} spill: {bad[:3]}"


def test_rotary_k_major_blocks_take_both_halves_of_a_head():
    """Under the head, a K-major block's BN columns are BN/2 of each half (an even run each); every such candidate
    of a rotary gemv builds without spills."""
    from benchmarks.gemv import rope_model
    from aicfc.codegen.module import count_registers
    model = rope_model(1, 1, hidden=1000, heads=8, kv_heads=2)
    plan = plan_of(model, {}, "fp16", {"kmajor": _weight(model)})
    k = _gemm(plan)
    assert gemm.rotary(k) is not None and gemm_gemv.k_major(k, plan.types())
    space = [p for p in gemm.space(k, plan) if p.get("KM")]
    assert {p["BN"] for p in space} == {4, 8, 16, 32, 64}   # 2 is one column a half: no pair to store
    assert [gemm_gemv.rotary_half_block(p, 64) for p in space if p["BN"] == 16][0] == 8
    space = to_build(space, functools.partial(estimate_registers, k))
    (found,) = count_registers(plan, [(k, space)])
    bad = [(p, regs, spill) for p, (regs, spill) in zip(space, found) if spill or not 0 < regs <= 255]
    assert not bad, f"{len(bad)} of {len(space)} spill: {bad[:3]}"


def _weight(model) -> str:
    """The name of the one gemv's weight as the planner sees it (the merged QKV's)."""
    plan = plan_of(model, {}, "fp16", {"kmajor": "0"})
    return gemm.dims(_gemm(plan))[0].b.buffer


KM_PINS = [{"BN": 2, "WARPS": 4, "KS": 2, "U": 2}, {"BN": 16, "WARPS": 4, "KS": 2, "U": 4}, {"BN": 8, "WARPS": 8, "KS": 1, "U": 4},
           {"BN": 64, "WARPS": 8, "KS": 8, "U": 2}, {"BN": 4, "WARPS": 8, "KS": 8, "U": 4}, {"BN": 4, "WARPS": 8, "KS": 4, "U": 4}]
# (K, N, bias, residual): N not a multiple of BN, K not a multiple of a part's step
KM_CASES = [(2048, 3072, False, False), (5632, 2056, True, True), (1000, 264, True, False), (2000, 1030, False, True)]


@pytest.mark.gpu
@pytest.mark.parametrize("precision", ["fp16", "bf16"])
@pytest.mark.parametrize("pin", KM_PINS, ids=lambda p: "BN{BN}W{WARPS}KS{KS}U{U}".format(**p))
@pytest.mark.parametrize("case", KM_CASES, ids=lambda c: "K{}N{}{}{}".format(c[0], c[1], "-bias" if c[2] else "", "-res" if c[3] else ""))
def test_k_major_gemv_matches_numpy(case, pin, precision, gpu_device):
    k, n, bias, residual = case
    if not any(all(p[x] == v for x, v in pin.items()) for p in gemm_gemv.km_space(n, k, True)):
        pytest.skip("outside the space")
    model = rows_model(1, k, n, np.random.default_rng(k + n), bias, residual)
    # (a row of N = 1030 fp16 elements is no TMA stride: relayout_weights' TMA rule stores that weight K-major itself)
    _run_against_numpy(model, {"KM": 1, "kmajor": "w", **pin}, precision, gpu_device, GEMV_RULE if n * 2 % 16 == 0 else None)


@pytest.mark.gpu
@pytest.mark.parametrize("precision", ["fp16", "bf16"])
@pytest.mark.parametrize("pin", KM_PINS, ids=lambda p: "BN{BN}W{WARPS}KS{KS}U{U}".format(**p))
def test_k_major_swiglu_gemv_matches_numpy(pin, precision, gpu_device):
    """The gated gate/up pairs over a K-major weight at one row, which the planner now decides by cost (no rule
    keeps them [K, N]: relayout_weights.gemv_candidates); 264 pairs, so BN 64 leaves a partial block."""
    from aicfc.passes.interleave_gates import GATE_RULE
    from tests.test_gemv import swiglu_model
    if not any(all(p[x] == v for x, v in pin.items()) for p in gemm_gemv.km_space(2 * 264, 1000, True)):
        pytest.skip("outside the space")
    model = swiglu_model(1, 1000, 264, np.random.default_rng(7))
    _run_against_numpy(model, {"KM": 1, "kmajor": "1", **pin}, precision, gpu_device, GATE_RULE)


def test_the_gated_pairs_layout_is_the_costs_decision():
    """At one row the gated gate/up pairs' layout is decided by the predictions like any other weight's, with both in
    the record: the small SwiGLU reads them K-major; the 1 B Llama's decode plan keeps them [K, N] (predicted 16.08
    us against 14.06, benchmarks/decode_ab.py's 4-layer plan)."""
    from tests.test_gemv import swiglu_model
    plan = plan_of(swiglu_model(1, 1000, 264, np.random.default_rng(7)), {}, "fp16")
    (record,) = [r for r in plan.rewrites if r.rule == GEMV_RULE]
    assert record.applied and record.target.endswith(".pairs") and " -> " in record.reason
    assert gemm.gated(_gemm(plan)) and _gemm(plan).schedule.param["KM"] == 1


KM_ROT_PINS = [{"BN": 4, "WARPS": 4, "KS": 1, "U": 4}, {"BN": 16, "WARPS": 8, "KS": 2, "U": 2}, {"BN": 32, "WARPS": 4, "KS": 1, "U": 2},
               {"BN": 64, "WARPS": 8, "KS": 4, "U": 4}, {"BN": 4, "WARPS": 8, "KS": 2, "U": 4}]


@pytest.mark.gpu
@pytest.mark.parametrize("precision", ["fp16", "bf16"])
@pytest.mark.parametrize("pin", KM_ROT_PINS, ids=lambda p: "BN{BN}W{WARPS}KS{KS}U{U}".format(**p))
def test_k_major_rotary_gemv_matches_numpy(pin, precision, gpu_device):
    """q and k rotated in the K-major gemv's epilogue (under the head, a block's columns are both halves' matching
    runs), every head weighted by random factors over d and summed (a misplaced partner changes the sum)."""
    from benchmarks.gemv import rope_model
    model = rope_model(1, 1, hidden=1000, heads=8, kv_heads=2, d=64, position=7, seed=11, weighted=True)
    _run_against_numpy(model, {"KM": 1, "kmajor": _weight(model), **pin}, precision, gpu_device, GEMV_RULE,
                       joint_scale=True)


def test_a_schedule_that_spills_under_mb_runs_without_it():
    """bf16's conversions need more than the 64 registers MB 8 leaves a thread of the 2056-column gemv: ptxas spills
    under the bound, so the register check builds the same schedule without MB (plan_schedules.check_leaders) rather
    than rejecting it; fp16 keeps MB 8 at 64 registers. Pinned with MB 8, bf16 fails in one line naming the spill."""
    import aicfc
    from tests.test_gemv import _rounded_model
    pin = {"unit": "gemv", "KM": 1, "kmajor": "w", "BN": 2, "WARPS": 4, "KS": 2, "U": 2}
    for precision, mb in (("fp16", 8), ("bf16", None)):
        model = _rounded_model(rows_model(1, 5632, 2056, np.random.default_rng(0), True, True), precision)
        payload = aicfc.compile(model, target="sm_90", precision=precision, pin=pin)
        (k,) = [k for k in payload["kernels"] if k["family"] == "gemm"]
        assert k["params"].get("MB") == mb, precision
        assert (k["registers"] <= 64) == (mb is not None)
        spilled = [c for c in k["candidates"] if "spills" in c.get("rejected_because", "")]
        assert bool(spilled) == (mb is None) and all(c["params"]["MB"] == 8 for c in spilled)
    from aicfc.errors import AicfError   # the bf16 schedule pinned with MB: the error names the spill
    with pytest.raises(AicfError, match=r"matches --pin .*MB=8.* \(the one that matches was rejected: spills \d+ B"):
        aicfc.compile(model, target="sm_90", precision="bf16", pin=pin | {"MB": 8})


def test_mb_is_the_grids_blocks_on_the_busiest_sm(monkeypatch):
    """[Note: the K-major gemv's register budget]: MB = ceil(ceil(N / BN) / SMs) goes into the launch bounds where a
    thread keeps 64 registers; none where it would not, and none under AICF_GEMV_MINB=0 (an A/B's switch)."""
    from aicfc.planner.hardware import load_profile
    hw = load_profile("sm_90")
    p = {"BN": 2, "WARPS": 4, "KS": 2, "U": 2}
    assert gemm_gemv.km_blocks_per_sm(2048, p, hw) == 8           # 1024 blocks of 128 threads
    assert gemm_gemv.km_blocks_per_sm(2048, p | {"BN": 4, "WARPS": 8}, hw) == 4
    assert gemm_gemv.km_blocks_per_sm(32000, p, hw) == 0          # 122 blocks an SM leave no 64 registers
    assert gemm_gemv.km_blocks_per_sm(2048, p, None) == 0
    monkeypatch.setenv("AICF_GEMV_MINB", "0")
    assert gemm_gemv.km_blocks_per_sm(2048, p, hw) == 0
    monkeypatch.delenv("AICF_GEMV_MINB")
    import aicfc
    payload = aicfc.compile(rows_model(1, 5632, 2048, np.random.default_rng(0), residual=True), target="sm_90",
                            precision="fp16", pin={"unit": "gemv", "KM": 1, "kmajor": "w", **p})
    (k,) = [k for k in payload["kernels"] if k["family"] == "gemm"]
    assert k["params"]["MB"] == 8 and k["registers"] <= 64
    assert "__launch_bounds__(128, 8)" in "".join(m["source"] for m in payload["modules"])


TCKM_PINS = [{"BN": 16, "WARPS": 4, "U": 1}, {"BN": 16, "WARPS": 8, "U": 4}, {"BN": 32, "WARPS": 4, "U": 2},
             {"BN": 32, "WARPS": 8, "U": 4}]
# (rows, K, N, bias, residual): N not a multiple of BN, K not a multiple of a warp's part
TCKM_CASES = [(8, 2048, 3072, False, True), (2, 5632, 2056, True, True), (3, 1000, 264, True, False), (8, 2000, 1030, False, False)]


@pytest.mark.gpu
@pytest.mark.parametrize("precision", ["fp16", "bf16"])
@pytest.mark.parametrize("pin", TCKM_PINS, ids=lambda p: "BN{BN}W{WARPS}U{U}".format(**p))
@pytest.mark.parametrize("case", TCKM_CASES, ids=lambda c: "M{}K{}N{}{}{}".format(c[0], c[1], c[2], "-bias" if c[3] else "",
                                                                                  "-res" if c[4] else ""))
def test_tensor_core_k_major_gemv_matches_numpy(case, pin, precision, gpu_device):
    rows, k, n, bias, residual = case
    model = rows_model(rows, k, n, np.random.default_rng(k + n), bias, residual)
    _run_against_numpy(model, {"KM": 1, "TC": 1, "kmajor": "tc+w", **pin}, precision, gpu_device,
                       GEMV_RULE if n * 2 % 16 == 0 else None)


@pytest.mark.gpu
@pytest.mark.parametrize("precision", ["fp16", "bf16"])
@pytest.mark.parametrize("pin", TCKM_PINS[:3], ids=lambda p: "BN{BN}W{WARPS}U{U}".format(**p))
def test_tensor_core_k_major_rotary_gemv_matches_numpy(pin, precision, gpu_device):
    """The rotary epilogue over the tensor-core steps at 8 rows (a 16-column block is 8 columns of each half)."""
    from benchmarks.gemv import rope_model
    model = rope_model(8, 1, hidden=1000, heads=8, kv_heads=2, d=64, position=7, seed=11, weighted=True)
    _run_against_numpy(model, {"KM": 1, "TC": 1, "kmajor": "tc+" + _weight(model), **pin}, precision, gpu_device, GEMV_RULE,
                       joint_scale=True)
