"""The gemv right after a decode step's split attention takes, of its equally fast schedules, one that leaves
an SM room for a block of the gemv after it (passes/gemv_room.py, [Note: room for the next gemv]); on the
GPU the decode step with and without the rule matches onnxruntime."""
from __future__ import annotations

import math

import pytest

from aicfc.errors import AicfError
from aicfc.passes.gemv_room import PIN, RULE, gemv_room, leaves_room
from aicfc.planner.hardware import load_profile
from tests.test_attention_room import check_decode_rule
from tests.test_l2_fill import WIDE, wide_decode_plan

HW = load_profile("sm_90")


def _plan(pin: str | None = None, schedule_pin: tuple = ()):
    return wide_decode_plan((((PIN, pin),) if pin is not None else ()) + schedule_pin)


def _after_attention(kernels):
    """(the gemv after each split attention, the gemv after it)."""
    return [(kernels[i], kernels[i + 1]) for i in range(1, len(kernels) - 1)
            if kernels[i - 1].family == "attention" and kernels[i - 1].schedule.param.get("unit") == "split"
            and kernels[i].schedule.param.get("unit") == "gemv" and kernels[i + 1].schedule.param.get("unit") == "gemv"]


def _room(g, nxt):
    s = g.schedule
    return leaves_room(s.grid, math.prod(s.block), int(dict(s.predicted)["registers_ptxas"]), s.smem_bytes, nxt, HW)


def test_the_o_projection_leaves_the_gate_up_a_block_room_at_the_same_prediction():
    on, off = _plan(), _plan("0")
    pairs, pairs_off = _after_attention(on.kernels), _after_attention(off.kernels)
    assert len(pairs) == WIDE.layers == len(pairs_off)
    for (g, nxt), (g0, _) in zip(pairs, pairs_off):
        assert _room(g0, nxt) is not None      # the planner's pick: the O's blocks fill the SM's registers
        assert _room(g, nxt) is None            # the rule's: one of the gate/up's blocks fits beside them
        assert math.prod(g.schedule.grid) < math.prod(g0.schedule.grid)
        # the same prediction before the passes after it (early_epilogue, l2_fill) re-cost both alike
        assert g.schedule.param.get("EPRE") == g0.schedule.param.get("EPRE")
        assert abs(g.schedule.time_us - g0.schedule.time_us) < 0.05
    applied = [r for r in on.rewrites if r.rule == RULE]
    assert {r.target for r in applied} == {g.name for g, _ in pairs} and all(r.applied for r in applied)
    assert all("leave one of" in r.reason and "room on the busiest SM" in r.reason for r in applied)


def test_pin_turns_the_rule_off_and_a_bad_value_is_one_line():
    records = [r for r in _plan("0").rewrites if r.rule == RULE]
    assert len(records) == WIDE.layers and all(not r.applied and f"--pin {PIN}=0" in r.reason for r in records)
    with pytest.raises(AicfError, match=f"{PIN}=2"):
        gemv_room(_plan("0"), HW, {PIN: "2"})


def test_a_schedule_the_user_pinned_is_left_alone():
    """`--pin NODE:KS=2` on the O projection: its schedule is the user's, so the rule declines there."""
    (g, _), = _after_attention(_plan("0").kernels)[:1]
    node = next(n for n in g.origins if n.startswith("node_matmul"))
    plan = _plan(None, ((f"{node}:KS", "2"),))
    (pinned, _), = _after_attention(plan.kernels)[:1]
    assert pinned.schedule.param["KS"] == 2 and math.prod(pinned.schedule.grid) == math.prod(g.schedule.grid)
    (record,) = [r for r in plan.rewrites if r.rule == RULE and r.target == pinned.name]
    assert not record.applied and "its schedule is the user's (--pin" in record.reason


def test_a_schedule_that_spills_or_an_unknown_register_count_is_declined():
    """Each equally fast schedule that would leave room is built first: where ptxas spills (a stub check says
    so) the rule declines with the count; without a register check it declines, as nothing would tell. (The plan
    without l2_fill, which runs after this rule and credits the O's fill to its prediction only.)"""
    plan = _plan("0", (("fill", "0"),))
    n = len(plan.rewrites)
    built = []

    def spills(p, problems):
        built.extend(params for _, params in problems)
        return [[(72, 32)] for _ in problems]
    out = gemv_room(plan, HW, {}, spills)
    records = [r for r in out.rewrites[n:] if r.rule == RULE]
    assert len(records) == WIDE.layers and all(not r.applied and "ptxas spills 32 B" in r.reason for r in records)
    assert built and all(len(params) == 1 and params[0]["unit"] == "gemv" for params in built)
    assert out.kernels == plan.kernels
    off = gemv_room(plan, HW, {}, None)
    assert all(not r.applied and "register check is off" in r.reason for r in off.rewrites[n:] if r.rule == RULE)


@pytest.mark.gpu
@pytest.mark.parametrize("rule", ["auto", "0"])
def test_gpu_decode_step_with_room_matches_onnxruntime(rule, gpu_device):
    check_decode_rule(gpu_device, RULE, None if rule == "auto" else {PIN: rule}, seed=29)
