"""A gemv landing while the kernel before it leaves the DRAM idle lets the next kernel launch at its entry,
before its own wait (passes/early_trigger.py, [Note: the trigger before the wait]). CPU: where the rule
applies (the O projection after the split attention), where it declines and why, and the entry codegen
writes. GPU: decode steps against onnxruntime with the rule on and off, over graph replays."""
from __future__ import annotations

import dataclasses

import pytest

import aicfc
from aicfc.codegen import pdl
from aicfc.errors import AicfError
from aicfc.passes import early_trigger as et
from aicfc.passes.work_before_wait import storage
from tests.test_l2_fill import WIDE, wide
from tests.test_row_scale import check_decode_step, decode_inputs, decode_shapes, decoder
from tests.test_state import plan_of
from benchmarks.light_models import onnxruntime_reference


def _records(plan):
    return {r.target: r for r in plan.rewrites if r.rule == et.RULE}


def test_the_projection_after_the_attention_triggers_first():
    plan = plan_of(wide(), decode_shapes(1), "fp16")
    marked = [i for i, k in enumerate(plan.kernels) if et.triggers_first(k)]
    assert marked and all(plan.kernels[i - 1].family == "attention" for i in marked)
    for i in marked:
        k = plan.kernels[i]
        assert k.schedule.param["PF"] == 1 and k.schedule.param["PRE"] == 1   # it fills L2 and lands early
        rec = _records(plan)[k.name]
        assert rec.applied and plan.kernels[i - 1].name in rec.reason and plan.kernels[i + 1].name in rec.reason
    # only where the DRAM idles: no other gemv of the plan triggers first
    assert all(not et.triggers_first(k) for k in plan.kernels if not k.schedule.param.get("PF"))


def test_trigger_pin_turns_the_rule_off():
    plan = plan_of(wide(), decode_shapes(1), "fp16", {"trigger": "0"})
    assert not any(et.triggers_first(k) for k in plan.kernels)
    assert all(not r.applied and r.reason == "--pin trigger=0" for r in _records(plan).values())
    with pytest.raises(AicfError, match="trigger"):
        plan_of(wide(), decode_shapes(1), "fp16", {"trigger": "2"})


def test_declined_where_the_next_kernel_reads_before_its_wait_what_runs_beside_it(monkeypatch):
    plan = plan_of(wide(), decode_shapes(1), "fp16", {"trigger": "0"})
    kernels, at = list(plan.kernels), storage(plan)
    i = next(i for i, k in enumerate(kernels) if k.schedule.param.get("PF") and i + 1 < len(kernels))
    assert et.why_not(plan, kernels, i, at) is None
    # the attention's output, read before the next kernel's wait: the attention may still be writing it
    written = sorted(et.writes(kernels[i - 1], at))[0]
    monkeypatch.setattr(et, "pre_wait_reads", lambda k, p, a: {written} if k is kernels[i + 1] else set())
    assert f"reads {written!r} before its wait" in et.why_not(plan, kernels, i, at)
    monkeypatch.undo()
    nxt = kernels[i + 1]
    kernels[i + 1] = nxt.replace(schedule=dataclasses.replace(
        nxt.schedule, params=tuple(sorted((nxt.schedule.param | {"AHEAD": 1}).items()))))
    assert "works before its own wait" in et.why_not(plan, kernels, i, at)
    k = kernels[i]
    kernels[i] = k.replace(schedule=dataclasses.replace(
        k.schedule, params=tuple((key, v) for key, v in k.schedule.params if key != "PF")))
    assert "fills no L2" in et.why_not(plan, kernels, i, at)


def _body(source: str, name: str) -> str:
    body = source[source.index(f" {name}("):]
    return body[:body.index('\nextern "C"')] if '\nextern "C"' in body else body


@pytest.mark.parametrize("timeline", [False, True])
def test_the_trigger_is_the_first_statement_and_the_wait_stays(timeline):
    payload = aicfc.compile(wide(), target="sm_90", precision="fp16", shapes=decode_shapes(1), timeline=timeline)
    source = "".join(m["source"] for m in payload["modules"])
    marked = [k["symbol"] for k in payload["kernels"] if k["params"].get("TF")]
    assert marked
    for name in marked:
        body = _body(source, name)
        first = body[body.index("{") + 1:].lstrip()
        assert first.startswith(pdl.AHEAD_ENTRY)                             # the trigger, before anything
        entry = timeline and "aicf_timeline_entry(" or pdl.ENTRY
        assert body.index(pdl.AHEAD_ENTRY) < body.index("__ldcs") < body.index(entry)   # weights, then the wait
        assert "AicfPdlLateWait" not in body                                  # the wait is where it was
    plain = aicfc.compile(wide(), target="sm_90", precision="fp16", shapes=decode_shapes(1), dependent_launch=False)
    plain_source = "".join(m["source"] for m in plain["modules"])
    assert all(pdl.AHEAD_ENTRY not in _body(plain_source, name) for name in marked)   # TF changes nothing there


@pytest.mark.gpu
@pytest.mark.parametrize("on", ["1", "0"])
@pytest.mark.parametrize("cfg", ["wide", "decoder"])
def test_gpu_decode_step_triggering_first_matches_onnxruntime(on, cfg, gpu_device):
    from tests.conftest import run_replayed
    model, kw = (wide(1), {"cfg": WIDE}) if cfg == "wide" else (decoder(1), {})
    inputs = decode_inputs(1, seed=23, **kw)
    ref = onnxruntime_reference(model, inputs)
    payload = aicfc.compile(model, target=gpu_device.arch, precision="fp16", shapes=decode_shapes(1), pin={"trigger": on})
    assert any(k["params"].get("TF") for k in payload["kernels"]) == (on == "1")
    first, again = run_replayed(payload, inputs, gpu_device)   # 200 graph replays between the two
    check_decode_step(first, ref, "fp16", *((WIDE,) if cfg == "wide" else ()))
    check_decode_step(again, ref, "fp16", *((WIDE,) if cfg == "wide" else ()))
