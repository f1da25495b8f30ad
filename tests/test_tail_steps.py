"""A K-major gemv right after a gemv whose blocks end in sums and merges requests the weight steps that tail
moves before its dependent-launch wait (passes/tail_steps.py, [Note: steps into the tail]); on the GPU the decode
step with the rule and without it matches onnxruntime."""
from __future__ import annotations


import pytest

from aicfc.errors import AicfError
from aicfc.passes.tail_steps import PIN, RULE, steps, tail_steps, tail_us
from aicfc.planner.hardware import load_profile
from tests.test_attention_room import check_decode_rule
from tests.test_l2_fill import WIDE, wide, wide_decode_plan
from tests.test_row_scale import decode_shapes

HW = load_profile("sm_90")


def _plan(pin: str | None = None):
    return wide_decode_plan(((PIN, pin),) if pin is not None else ())


def _gemv_pairs(kernels):
    """(the gemv before, the K-major gemv after it) wherever two gemvs follow each other."""
    gemv = [k.schedule is not None and k.schedule.param.get("unit") == "gemv" for k in kernels]
    return [(kernels[i - 1], kernels[i]) for i in range(1, len(kernels))
            if gemv[i - 1] and gemv[i] and kernels[i].schedule.param.get("KM")]


def test_the_down_projection_requests_the_steps_of_the_gate_ups_tail():
    plan = _plan()
    records = {r.target: r for r in plan.rewrites if r.rule == RULE}
    pairs = _gemv_pairs(plan.kernels)
    downs = [(b, k) for b, k in pairs if tail_us(b) > 0]
    assert len(downs) == WIDE.layers
    for before, k in downs:
        p = k.schedule.param
        assert before.schedule.param.get("SPLITK", 1) > 1   # the gate/up: its k-splits merge after its weights
        assert 2 <= p["PRE"] <= steps(k) and 0 < p["LANDED"]
        assert records[k.name].applied and f"its first {p['PRE']} steps" in records[k.name].reason
        off = next(x for x in _plan("0").kernels if x.name == k.name)
        assert off.schedule.param["PRE"] == 1 and "LANDED" not in off.schedule.param
        assert k.schedule.time_us < off.schedule.time_us       # the landed bytes come off its stream
        assert dict(k.schedule.predicted)["landed_bytes"] == p["LANDED"]
    # a gemv whose epilogue operands come before its wait leaves no tail: the gemv after it asks for nothing more
    for before, k in pairs:
        if tail_us(before) == 0:
            assert k.schedule.param.get("PRE") == 1 and not records[k.name].applied
            assert "has no tail after its weights" in records[k.name].reason


def test_pin_turns_the_rule_off_and_a_bad_value_is_one_line():
    import aicfc
    records = [r for r in _plan("0").rewrites if r.rule == RULE]
    assert any(f"--pin {PIN}=0" in r.reason for r in records) and not any(r.applied for r in records)
    # a rewrite switch, not a schedule key: `aicfc compile --pin tailsteps=0` takes it
    payload = aicfc.compile(wide(), target="sm_90", precision="fp16", shapes=decode_shapes(1), pin={PIN: "0"})
    assert all(k["params"].get("PRE", 0) <= 1 for k in payload["kernels"])
    with pytest.raises(AicfError, match=f"{PIN}=2"):
        tail_steps(_plan("0"), HW, {PIN: "2"})


def test_a_schedule_the_user_pinned_is_left_alone():
    """`--pin NODE:U=2` on the down projection: its schedule is the user's, so the rule declines there."""
    (_, down), = [(b, k) for b, k in _gemv_pairs(_plan().kernels) if tail_us(b) > 0][:1]
    node = next(n for n in down.origins if n.startswith("node_matmul"))
    plan = wide_decode_plan(((f"{node}:U", "2"),))
    pinned = next(k for k in plan.kernels if node in k.origins)
    assert pinned.schedule.param["PRE"] == 1
    (record,) = [r for r in plan.rewrites if r.rule == RULE and r.target == pinned.name]
    assert not record.applied and "its schedule is the user's (--pin" in record.reason


def test_spills_take_a_step_fewer_and_no_check_declines():
    """Each count is built first: where ptxas spills (a stub check says so at every count) the rule declines with
    what it tried; without a register check it declines, as nothing would tell."""
    plan = _plan("0")
    n = len(plan.rewrites)
    built = []

    def spills(p, problems):
        built.extend(params[0]["PRE"] for _, params in problems)
        return [[(64, 8)] for _ in problems]
    out = tail_steps(plan, HW, {}, spills)
    applied = [r for r in out.rewrites[n:] if r.rule == RULE and "spill" in r.reason]
    assert applied and all(not r.applied and "spill 8 B at 64 registers" in r.reason for r in applied)
    assert built and built == sorted(built, reverse=True) and built[-1] == 2
    assert out.kernels == plan.kernels
    off = tail_steps(plan, HW, {}, None)
    assert any("register check is off" in r.reason for r in off.rewrites[n:] if r.rule == RULE)
    assert off.kernels == plan.kernels


@pytest.mark.gpu
@pytest.mark.parametrize("rule", ["auto", "0", "all"])
def test_gpu_decode_step_with_steps_into_the_tail_matches_onnxruntime(rule, gpu_device, monkeypatch):
    """"all": every step of the down projection before its wait (its last step part-filled), as far as ptxas holds
    them without spilling."""
    from aicfc.passes import tail_steps as rule_module
    if rule == "all":
        monkeypatch.setattr(rule_module, "wanted", lambda before, k, hw: (steps(k), 1e9))
    check_decode_rule(gpu_device, RULE, {PIN: "0"} if rule == "0" else None, seed=31)
