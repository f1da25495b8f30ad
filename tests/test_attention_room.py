"""The gemv right before a decode step's split attention leaves each SM the registers of one attention
block (passes/attention_room.py, [Note: room for the attention]); on the GPU the decode step with and
without the rule matches onnxruntime."""
from __future__ import annotations

import dataclasses
import math

import pytest

import aicfc
from aicfc.errors import AicfError
from aicfc.passes.attention_room import MIN_REGS, RULE, room
from aicfc.planner.hardware import load_profile
from benchmarks.light_models import onnxruntime_reference
from tests.conftest import run_payload
from tests.test_l2_fill import WIDE, wide, wide_decode_plan
from tests.test_row_scale import check_decode_step, decode_inputs, decode_shapes

HW = load_profile("sm_90")


def _plan(room_pin: str | None = None):
    return wide_decode_plan((("room", room_pin),) if room_pin is not None else ())


def _warp_regs(regs: int) -> int:
    return math.ceil(regs * 32 / 256) * 256


def _before_attention(kernels):
    return [(kernels[i - 1], k) for i, k in enumerate(kernels) if i and k["family"] == "attention"]


def test_the_gemv_before_the_attention_leaves_one_attention_block_its_registers():
    payload = aicfc.compile(wide(), target="sm_90", precision="fp16", shapes=decode_shapes(1))
    pairs = _before_attention(payload["kernels"])
    assert len(pairs) == WIDE.layers
    for g, a in pairs:
        assert g["params"]["unit"] == "gemv" and a["params"]["unit"] == "split" and g["params"]["MB"]
        threads, a_threads = math.prod(g["block"]), math.prod(a["block"])
        busiest = math.ceil(math.prod(g["grid"]) / HW.sm_count)
        # ptxas kept the ceiling: the gemv's blocks on its busiest SM and one attention block fit in the registers
        assert g["registers"] <= HW.registers_per_sm // (g["params"]["MB"] * threads)
        used = busiest * threads // 32 * _warp_regs(g["registers"]) + a_threads // 32 * _warp_regs(a["registers"])
        assert used <= HW.registers_per_sm
        assert f"__launch_bounds__({threads}, {g['params']['MB']})" in "".join(m["source"] for m in payload["modules"])
    applied = [d for d in payload["decisions"] if d.get("rule") == RULE and d["applied"]]
    assert {d["target"] for d in applied} == {g["name"] for g, _ in pairs}


def test_room_pin_turns_the_rule_off_and_a_bad_value_is_one_line():
    records = [r for r in _plan("0").rewrites if r.rule == RULE]
    assert len(records) == WIDE.layers and all(not r.applied and "--pin room=0" in r.reason for r in records)
    from aicfc.passes.attention_room import attention_room
    with pytest.raises(AicfError, match="room=2"):
        attention_room(_plan("0"), HW, {"room": "2"})


def test_too_few_registers_left_is_declined():
    """Room for the attention's block would leave the gemv under MIN_REGS registers a thread: declined with the
    count; an attention whose registers are unknown (the register check off) is declined too."""
    plan = _plan("0")
    i = next(i for i, k in enumerate(plan.kernels) if i and k.family == "attention")
    g, a = plan.kernels[i - 1], plan.kernels[i]

    def with_regs(k, regs):
        predicted = dict(k.schedule.predicted) | {"registers_ptxas": regs}
        return k.replace(schedule=dataclasses.replace(k.schedule, predicted=tuple(sorted(predicted.items())),
                                                      registers=None))
    assert room(g, with_regs(a, 0), HW)[0] is None and "not known" in room(g, with_regs(a, 0), HW)[1]
    changes, _ = room(g, with_regs(a, 96), HW)
    assert changes is not None and HW.registers_per_sm // (changes["MB"] * math.prod(g.schedule.block)) >= MIN_REGS
    heavy = with_regs(a, 255).replace(schedule=dataclasses.replace(a.schedule, block=(1024, 1, 1)))
    changes, why = room(g, heavy, HW)
    assert changes is None and f"under {MIN_REGS}" in why


def test_a_raised_bound_that_spills_is_declined():
    """The gemv is built under the raised bound before the rule keeps it: where ptxas spills there (a stub check
    says so) the rule declines with the count, and without a register check it declines, as nothing would tell."""
    from aicfc.passes.attention_room import attention_room
    plan = _plan("0")
    n = len(plan.rewrites)
    built = []

    def spills(p, problems):
        built.extend(params for _, params in problems)
        return [[(64, 48)] for _ in problems]
    out = attention_room(plan, HW, {}, spills)
    records = [r for r in out.rewrites[n:] if r.rule == RULE]
    assert len(records) == WIDE.layers and all(not r.applied and "spills 48 B at 64 registers" in r.reason
                                               for r in records)
    # the attention is built as emitted first (its registers size the room), then the gemv under the raised bound
    attention = [params for params in built if params[0].get("unit") == "split"]
    gemv = [params for params in built if params[0].get("unit") == "gemv"]
    assert len(attention) == len(gemv) == WIDE.layers and len(built) == 2 * WIDE.layers
    assert all(len(params) == 1 and params[0]["PRE"] for params in attention)
    assert all(len(params) == 1 and params[0]["MB"] for params in gemv)
    assert out.kernels == plan.kernels
    off = attention_room(plan, HW, {}, None)
    assert all(not r.applied and "register check is off" in r.reason for r in off.rewrites[n:] if r.rule == RULE)


def test_the_room_is_sized_by_the_attention_as_emitted():
    """The attention's registers come from building it as it is emitted (PRE, its folded cache writes), not from the
    planner's count: a stub check that gives it 200 registers leaves no gemv 64 a thread, so the rule declines."""
    from aicfc.passes.attention_room import attention_room
    plan = _plan("0")
    n = len(plan.rewrites)

    def counts(p, problems):
        return [[(200 if params.get("unit") == "split" else 64, 0) for params in ps] for _, ps in problems]
    out = attention_room(plan, HW, {}, counts)
    records = [r for r in out.rewrites[n:] if r.rule == RULE]
    assert len(records) == WIDE.layers and all(not r.applied and "(under 64)" in r.reason for r in records)

    def fits(p, problems):
        return [[(96 if params.get("unit") == "split" else 64, 0) for params in ps] for _, ps in problems]
    applied = [r for r in attention_room(plan, HW, {}, fits).rewrites[n:] if r.rule == RULE]
    assert len(applied) == WIDE.layers and all(r.applied and "at 96 registers" in r.reason for r in applied)


def check_decode_rule(gpu_device, rule: str, pin: dict | None, seed: int) -> None:
    """The wide decoder's decode step compiled with `pin` (None: every rule as it decides) applies `rule` exactly
    where no pin is given, and matches onnxruntime on fresh inputs."""
    model = wide(1)
    inputs = decode_inputs(1, seed=seed, cfg=WIDE)
    ref = onnxruntime_reference(model, inputs)
    payload = aicfc.compile(model, target=gpu_device.arch, precision="fp16", shapes=decode_shapes(1), pin=pin)
    assert any(d.get("rule") == rule and d["applied"] for d in payload["decisions"]) == (pin is None)
    check_decode_step(run_payload(payload, inputs, gpu_device), ref, "fp16", WIDE)


@pytest.mark.gpu
@pytest.mark.parametrize("rule", ["auto", "0"])
def test_gpu_decode_step_with_room_matches_onnxruntime(rule, gpu_device):
    check_decode_rule(gpu_device, RULE, None if rule == "auto" else {"room": rule}, seed=23)
