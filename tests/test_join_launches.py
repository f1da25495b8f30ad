"""The O projection after a decode step's split attention as more blocks of the attention's launch
(passes/join_launches.py, [Note: the O projection joined to the attention]; codegen/join.py, [Note: a gemv joined to
the launch before it]): only under --pin joino=1 until measured; the plan's records, the bundle's launch and joined
records, the module's code, explain and profile; on the GPU the joined step matches onnxruntime and the step apart,
bit for bit, replay after replay."""
from __future__ import annotations

import copy
import dataclasses
import functools
import math
import re

import numpy as np
import pytest

import aicfc
from aicfc.codegen import gemm, join
from aicfc.errors import AicfError
from aicfc.passes.join_launches import GATE_PIN, PIN, RULE, join_launches
from aicfc.planner.hardware import load_profile
from benchmarks.light_models import onnxruntime_reference
from tests.conftest import run_payload, run_replayed
from tests.test_l2_fill import WIDE, wide, wide_decode_plan
from tests.test_row_scale import check_decode_step, decode_inputs, decode_shapes

HW = load_profile("sm_90")


def _plan(pin: str | None = None):
    return wide_decode_plan(((PIN, pin),) if pin is not None else ())


@functools.cache
def _payload(pin: str | None = "1", gate: str | None = None, stamped: bool = False):
    pins = ({PIN: pin} if pin is not None else {}) | ({GATE_PIN: gate} if gate is not None else {})
    return aicfc.compile(wide(), target="sm_90", precision="fp16", shapes=decode_shapes(1), pin=pins or None,
                         timeline=stamped)


def _records(plan):
    return {r.target: r for r in plan.rewrites if r.rule == RULE}


def test_the_o_projection_joins_the_attentions_launch_only_when_pinned():
    apart, joined = _plan(), _plan("1")
    (name, record), = _records(apart).items()
    assert not record.applied and "measured slower" in record.reason
    assert "runs only under --pin joino=1" in record.reason
    assert not any(join.joined(k) for k in apart.kernels)
    i = next(i for i, k in enumerate(joined.kernels) if join.joined(k))
    host, role, before = joined.kernels[i - 1], joined.kernels[i], apart.kernels[i]
    assert role.name == before.name == name and _records(joined)[name].applied
    assert host.schedule.param["unit"] == "split"
    p = role.schedule.param
    _, _, n, kk, _ = gemm.dims(role)
    # one launch, one block size; the role's columns whole warps' and its weight slice in the launch's shared memory
    assert role.schedule.block == host.schedule.block and p["WARPS"] * 32 == host.schedule.block[0]
    assert p["JOIN"] == host.schedule.grid[0] and role.schedule.grid == (n // p["BN"], 1, 1)
    assert p["BN"] * kk * 2 <= host.schedule.smem_bytes and p["KS"] == 1 and "MB" not in p and "PF" not in p
    # its weight lands while the attention runs, and it has no launch of its own: a publication instead
    terms = dict(role.schedule.predicted)
    assert terms["launch_us"] == 0.0 and terms["t_join_us"] > 0 and p["LANDED"] > 0
    # as measured (session 63, [Note: the joined launch measured]): the role after the attention is slower than the O
    # apart, whose slice its fill brought into L2 ([Note: the fill's own slice])
    assert role.schedule.time_us > before.schedule.time_us
    assert f"{p['BN']}) predicted {role.schedule.time_us:.2f} us" in _records(joined)[name].reason
    # everything else is the plan apart
    assert [k for k in joined.kernels if k is not role] == [k for k in apart.kernels if k.name != name]


def test_once_measured_the_rule_joins_where_it_predicts_the_launch_faster(monkeypatch):
    """MEASURED names the A/B that lets the planner decide unpinned: then it joins by its prediction."""
    from aicfc.driver import count_registers
    from aicfc.passes import join_launches as rule
    plan = _plan("0")
    n = len(plan.rewrites)
    monkeypatch.setattr(rule, "MEASURED", "an A/B's figure")
    # predicted no faster (as measured): apart
    out = join_launches(plan, HW, {}, functools.partial(count_registers, jobs=2))
    (record,) = (r for r in out.rewrites[n:] if r.rule == RULE)
    assert not record.applied and "kept apart (predicted no faster)" in record.reason and out.kernels == plan.kernels
    # a cheaper publication would make it faster: joined
    monkeypatch.setattr(rule.cost_gemv, "CONSTANTS", rule.cost_gemv.CONSTANTS | {"gemv_join_us": 0.0})
    out = join_launches(plan, HW, {}, functools.partial(count_registers, jobs=2))
    (record,) = (r for r in out.rewrites[n:] if r.rule == RULE)
    assert record.applied and "(measured: an A/B's figure)" in record.reason
    joined = [k for k in out.kernels if join.joined(k)]
    assert [k.name for k in joined] == [k.name for k in _plan("1").kernels if join.joined(k)]


def test_the_pin_says_apart_and_a_bad_value_is_one_line():
    record, = _records(_plan("0")).values()
    assert not record.applied and "(--pin joino=0)" in record.reason
    with pytest.raises(AicfError, match=f"{PIN}=2"):
        join_launches(_plan(), HW, {PIN: "2"})


def test_no_register_check_and_too_little_shared_memory_decline():
    plan = _plan()
    n = len(plan.rewrites)
    out = join_launches(plan, HW, {PIN: "1"}, None)
    record, = (r for r in out.rewrites[n:] if r.rule == RULE)
    assert not record.applied and "the register check is off" in record.reason and out.kernels == plan.kernels
    # an attention whose shared memory holds no role block's weight slice
    i = next(i for i, k in enumerate(plan.kernels) if k.family == "attention")
    small = plan.kernels[i].replace(schedule=dataclasses.replace(plan.kernels[i].schedule, smem_bytes=4096))
    starved = plan.replace(kernels=plan.kernels[:i] + (small,) + plan.kernels[i + 1:])
    from aicfc.driver import count_registers
    out = join_launches(starved, HW, {PIN: "1"}, functools.partial(count_registers, jobs=2))
    record, = (r for r in out.rewrites[n:] if r.rule == RULE)
    assert not record.applied and "more than the launch's 4096 B of shared memory" in record.reason


def test_the_launch_keeps_the_room_the_gemv_before_left():
    """The launch's bounds hold its registers to what one of its blocks may take beside the blocks of the gemv
    before the attention on that gemv's busiest SM ([Note: room for the attention]), and ask for one wave at least."""
    from aicfc.passes.attention_room import checked_registers, warp_registers
    from aicfc.passes.join_launches import launch_min_blocks, room_registers, wave_blocks
    plan = _plan("1")
    i = next(i for i, k in enumerate(plan.kernels) if join.joined(k))
    host, role, before = plan.kernels[i - 1], plan.kernels[i], plan.kernels[i - 2]
    cap = room_registers(plan, i - 1, HW)
    busiest = math.ceil(math.prod(before.schedule.grid) / HW.sm_count)
    used = busiest * math.prod(before.schedule.block) // 32 * warp_registers(checked_registers(before))
    assert cap is not None and checked_registers(host) <= cap
    assert used + host.schedule.block[0] // 32 * warp_registers(cap) <= HW.registers_per_sm
    assert used + host.schedule.block[0] // 32 * warp_registers(cap + 8) > HW.registers_per_sm
    jmb, why = launch_min_blocks(plan, i - 1, role, HW)
    wave, _ = wave_blocks(host, role, HW)
    assert wave >= math.ceil(join.launch_blocks(host, role)[2] / HW.sm_count)
    ceiling = HW.registers_per_sm // (jmb * host.schedule.block[0])   # what the bounds leave a thread
    assert role.schedule.param["JMB"] == jmb >= wave and (ceiling <= cap or jmb == wave)
    assert f"the launch's bounds: {why}" in _records(plan)[role.name].reason


def test_a_launch_that_is_not_one_wave_is_declined():
    """Every block must be resident at once (a role block spinning on an SM an attention block needs would never
    finish): with the SMs of a smaller GPU the wide decoder's launch needs more blocks an SM than its shared memory
    holds, and the rule declines, saying so for every width."""
    from aicfc.driver import count_registers
    from aicfc.planner.hardware import Profile
    from aicfc.passes.join_launches import wave_blocks
    plan = _plan("1")
    i = next(i for i, k in enumerate(plan.kernels) if join.joined(k))
    need, why = wave_blocks(plan.kernels[i - 1], plan.kernels[i], HW)
    assert need is not None and why == ""
    small = Profile(HW.data | {"sm_count": 16})
    need, why = wave_blocks(plan.kernels[i - 1], plan.kernels[i], small)
    assert need is None and "an SM, where" in why
    apart = _plan("0")
    n = len(apart.rewrites)
    out = join_launches(apart, small, {PIN: "1"}, functools.partial(count_registers, jobs=2))
    (record,) = (r for r in out.rewrites[n:] if r.rule == RULE)
    assert not record.applied and "no role fits" in record.reason and out.kernels == apart.kernels


def test_the_bundle_launches_both_as_one_and_keeps_the_joined_record():
    from aicf_run.bundle import Bundle
    apart, joined = _payload(None), _payload("1")
    assert len(joined["kernels"]) == len(apart["kernels"]) - 1
    host = next(k for k in joined["kernels"] if k.get("joined"))
    (role,) = host["joined"]
    alone = {k["name"]: k for k in apart["kernels"]}
    cluster = host["params"]["SPLITS"] if host["params"].get("CL") else 1
    a, b = alone[host["name"]]["grid"][0], role["grid"][0]
    assert host["grid"] == [math.ceil((a + b) / cluster) * cluster, 1, 1] and host["grid"][0] - a - b < cluster
    assert host["args"] == alone[host["name"]]["args"] + role["args"] and role["into"] == host["name"]
    assert role["symbol"] == host["symbol"] and "timeline" not in role
    Bundle.from_payload(joined)   # the runtime's schema takes it
    bad = copy.deepcopy(joined)
    next(k for k in bad["kernels"] if k.get("joined"))["joined"][0]["into"] = "k0"
    with pytest.raises(Exception, match=r"joined\[0\]\.into"):
        Bundle.from_payload(bad)


def test_the_module_dispatches_the_roles_and_builds_without_spills():
    from aicfc.codegen.nvcc import build
    payload = _payload("1")
    host = next(k for k in payload["kernels"] if k.get("joined"))
    source = payload["modules"][host["module"]]["source"]
    head = re.search(r'extern "C" __global__ void (.*?)\b' + host["name"] + r"\(", source).group(1)
    a, b = host["joined"][0]["params"]["JOIN"], host["joined"][0]["grid"][0]
    minb = host["joined"][0]["params"]["JMB"]
    assert f"__launch_bounds__({host['block'][0]}, {minb})" in head and minb >= math.ceil(host["grid"][0] / HW.sm_count)
    tag = re.search(r"aicf_join_(\w{12})_count\[3\]", source).group(1)
    for text in (f"if (blockIdx.x < {a}u)", f"else if (blockIdx.x < {a + b}u)",
                 f"atomicAdd(&aicf_join_{tag}_count[0], 1u)", "griddepcontrol.wait", "ld.acquire.gpu.global.u32",
                 "cp.async.cg.shared.global", "__ldcg(", "atomicAdd(joined + 1, 1u)"):
        assert text in source, text
    built = build(source, payload["target"]["arch"])
    assert built.spills.get(host["symbol"], 0) == 0 and built.registers[host["symbol"]] == host["registers"]


def test_the_gate_holds_the_roles_weight_requests_until_every_first_tile():
    """--pin joingate=1: each attention block counts its first tile (or its lack of one) on the counter's third word,
    and the role requests its weights only after the launch before is complete and that count is whole."""
    from aicfc.codegen.nvcc import build
    payload = _payload("1", "1")
    host = next(k for k in payload["kernels"] if k.get("joined"))
    role = host["joined"][0]
    assert role["params"]["JG"] == 1 and "JG" not in _payload("1")["kernels"][0]["params"]
    source = payload["modules"][host["module"]]["source"]
    tag = re.search(r"aicf_join_(\w{12})_count\[3\]", source).group(1)
    attention = source[source.index(f"void aicf_join_{tag}_a("):source.index(f"void aicf_join_{tag}_b(")]
    assert attention.count(f"atomicAdd(&aicf_join_{tag}_count[2], 1u)") >= 2 and "aicf_join_gate" not in source
    gemv = source[source.index(f"void aicf_join_{tag}_b("):]
    wait, gate, copy = (gemv.index(t) for t in ("griddepcontrol.wait", "joined + 2", "cp.async.cg.shared.global"))
    assert wait < gate < copy and gemv.count("griddepcontrol.wait") == 1 and "joined[2] = 0u" in gemv
    record = next(d for d in payload["decisions"] if d.get("rule") == RULE and d["target"] == role["name"])
    assert record["applied"] and "--pin joingate=1" in record["reason"]
    built = build(source, payload["target"]["arch"])
    assert built.spills.get(host["symbol"], 0) == 0


def test_explain_and_profile_count_the_joined_kernel():
    from aicf_run.profile import _kernel
    from aicfc.explain import explain_json, explain_text
    payload = _payload("1")
    text = explain_text(payload)
    host = next(k for k in payload["kernels"] if k.get("joined"))
    role = host["joined"][0]
    assert f"its blocks run in {host['name']}'s launch" in text
    assert f"{len(payload['kernels']) + 1} kernel(s) in {len(payload['kernels'])} launches" in text
    e = explain_json(payload)
    assert [k["name"] for k in e["kernels"]].index(role["name"]) == [k["name"] for k in e["kernels"]].index(host["name"]) + 1
    profiled = _kernel(0, host, 10.0, 10.0, payload["target"]["profile"])
    assert profiled.name == f"{host['name']}+{role['name']}"
    assert profiled.predicted_us == pytest.approx(host["predicted"]["time_us"] + role["predicted"]["time_us"])
    # [Note: cold weights]: the launch's copies are counted by the bytes of both its kernels
    from aicf_run.profile import COLD_L2S, MAX_COPIES, cold_copies
    l2 = payload["target"]["profile"]["l2_bytes"]
    touched = host["predicted"]["bytes"] + role["predicted"]["bytes"]
    assert cold_copies(host, payload["buffers"], l2)[0] == min(math.ceil(COLD_L2S * l2 / touched) + 1, MAX_COPIES)


def test_the_role_stamps_its_own_timeline_after_its_hosts():
    """[Note: a joined role's stamps] (aicfc/codegen/timeline.py): under --timeline the role has an array of its own,
    a row per role block, read after its host's; its go is its dependent-launch wait's return."""
    from aicf_run.schema import kernel_records
    from aicf_run.timeline import summarize
    from aicfc.codegen import timeline
    from aicfc.codegen.nvcc import build
    payload = _payload("1", stamped=True)
    host = next(k for k in payload["kernels"] if k.get("joined"))
    role = host["joined"][0]
    a, b = role["params"]["JOIN"], role["grid"][0]
    assert host["timeline"]["blocks"] == a and role["timeline"]["symbol"] == f"aicf_tl_{role['name']}"
    assert role["timeline"]["blocks"] == b and role["timeline"]["phases"][2:5] == [
        "slice requested", "output published", "slice landed"]
    source = payload["modules"][host["module"]]["source"]
    assert source.count(f"__device__ unsigned long long aicf_tl_{role['name']}[{timeline.STAMPS * b}];") == 1
    for mark in (f"aicf_timeline_role_ready(aicf_tl_{role['name']}, {b}u, {a}u, aicf_tl_arrived);",
                 f"aicf_timeline_role_exit(aicf_tl_{role['name']}, {b}u, {a}u);",
                 f"aicf_timeline_phase(aicf_tl_{role['name']}, {b}u, 3u, {a}u);   // phase 3: output published"):
        assert source.count(mark) == 1, mark
    assert all(m not in source for m in timeline.ROLE_MARKS)
    assert not any(m in _payload("1")["modules"][host["module"]]["source"] for m in ("aicf_tl_", "aicf_timeline_"))
    built = build(source, payload["target"]["arch"])
    assert built.spills.get(host["symbol"], 0) == 0
    # the reader: the role a row after its host; its phases in the order its blocks pass them
    kernels = kernel_records(payload["kernels"])
    at = kernels.index(role)
    assert kernels[at - 1] is host and len(kernels) == len(payload["kernels"]) + 1
    stamps = []
    for i, k in enumerate(kernels):
        s = np.zeros((k["timeline"]["blocks"], k["timeline"]["stamps"]), np.uint64)
        s[:, 0], s[:, 1], s[:, 2] = 1000 * i + 1, 1000 * i + 2, 1000 * i + 900
        if k is role:
            # phases 2 (requested), 4 (landed), 3 (published), 0 (streamed), 1 (summed), in that order in time
            for phase, t in ((2, 1), (4, 300), (3, 500), (0, 600), (1, 700)):
                s[:, 3 + phase] = 1000 * i + t
        stamps.append(s)
    report = summarize([stamps], kernels)
    row = report.kernels[at]
    assert row.name == role["name"] and [p.name for p in row.phases] == [
        "slice requested", "slice landed", "output published", "weights streamed", "block summed", "exit"]
    assert report.kernels[at - 1].chain_us == pytest.approx(1.0)


@pytest.mark.gpu
@pytest.mark.parametrize("precision,gate", [("fp16", "0"), ("bf16", "0"), ("fp16", "1")])
def test_gpu_joined_decode_step_matches_onnxruntime_and_the_step_apart(precision, gate, gpu_device):
    """The role adds each column in the O gemv's order: the joined step's outputs are the step apart's, bit for bit;
    200 graph replays back to back (the counter zeroed by each launch's last role block) change nothing."""
    model = wide(1)
    inputs = decode_inputs(1, seed=37, cfg=WIDE)
    ref = onnxruntime_reference(model, inputs)
    joined = aicfc.compile(model, target=gpu_device.arch, precision=precision, shapes=decode_shapes(1),
                           pin={PIN: "1", GATE_PIN: gate})
    assert any(k.get("joined") for k in joined["kernels"])
    apart = aicfc.compile(model, target=gpu_device.arch, precision=precision, shapes=decode_shapes(1))
    first, last = run_replayed(joined, inputs, gpu_device)
    check_decode_step(first, ref, precision, WIDE)
    plain = run_payload(apart, inputs, gpu_device)
    for name, value in plain.items():
        assert np.array_equal(first[name], value, equal_nan=False), name
        assert np.array_equal(last[name], value, equal_nan=False), name
