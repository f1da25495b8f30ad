"""A one-wave kernel of channels-last images whose next kernel (one too) has no work before its wait triggers as
its blocks exit (passes/late_trigger.py, [Note: the trigger as the blocks exit]). CPU: where the rule applies and
where it declines, the pin, the next kernel's launch term, the entry codegen writes and the bundle records. GPU: a
Hopper convolution's plan with the rule on and off, the same bits over graph replays, against onnxruntime."""
from __future__ import annotations

import math

import numpy as np
import pytest
from onnx import TensorProto, helper

import aicfc
from aicfc.codegen import pdl
from aicfc.errors import AicfError
from aicfc.passes import late_trigger as lt
from aicfc.planner.hardware import load_profile
from tests import onnx_builders as B
from tests.test_l2_fill import wide
from tests.test_pdl import chain_model
from tests.test_planner import two_matmuls
from tests.test_row_scale import decode_shapes
from tests.test_state import plan_of


def _records(plan):
    return {r.target: r for r in plan.rewrites if r.rule == lt.RULE}


def cnn():
    """A 3x3 convolution (BN, ReLU) then a 1x1 one over channels-last images: three kernels (the input's copy)."""
    return B.conv_model((8, 64, 28, 28), (64, 64, 3, 3), bn=True, act="relu", pads=[1, 1, 1, 1], follow=256)


def test_one_wave_kernels_trigger_as_their_blocks_exit():
    plan = plan_of(cnn(), {}, "fp16")
    kernels, hw = list(plan.kernels), load_profile("sm_90")
    late = [i for i, k in enumerate(kernels) if lt.triggers_late(k)]
    assert late, [(k.name, k.schedule.grid) for k in kernels]
    assert not lt.triggers_late(kernels[-1])   # the plan's last kernel: nothing follows it
    for i, k in enumerate(kernels):
        assert lt.triggers_late(k) == (lt.why_not(kernels, i, hw) is None)
        if lt.triggers_late(k):
            rec = _records(plan)[k.name]
            assert rec.applied and kernels[i + 1].name in rec.reason
    # the entry under dependent launches (the driver's choice for sm_90): no block triggers, the trigger block
    # is past the grid's last; plain launches trigger nothing anyway
    starts = pdl.entries(kernels, pdl.DEPENDENT, hw)
    assert all(starts[i] == math.prod(kernels[i].schedule.grid) for i in late)
    assert pdl.entries(kernels, pdl.STREAM, hw) == [0] * len(kernels)


def test_the_kernel_launched_late_is_predicted_with_the_late_launch_term():
    """The kernel after one that triggers as it exits pays LAUNCH_LATE_US, not the profile's launch term."""
    early, late = plan_of(cnn(), {}, "fp16", pin={"late": "0"}), plan_of(cnn(), {}, "fp16")
    hw = load_profile("sm_90")
    for i, (a, b) in enumerate(zip(early.kernels, late.kernels)):
        after_late = i > 0 and lt.triggers_late(late.kernels[i - 1])
        ta, tb = dict(a.schedule.predicted), dict(b.schedule.predicted)
        assert ta["launch_us"] == hw.launch_overhead_us
        assert tb["launch_us"] == (lt.LAUNCH_LATE_US if after_late else hw.launch_overhead_us)
        assert tb["time_us"] == pytest.approx(ta["time_us"] - (ta["launch_us"] - tb["launch_us"]))
    assert any(lt.triggers_late(k) for k in late.kernels)
    rec = next(iter(_records(late).values()))
    assert "launch term 0.25 us" in rec.reason


def test_the_bundle_records_the_trigger_the_source_has():
    payload = aicfc.compile(cnn(), target="sm_90", precision="fp16")
    late = [k for k in payload["kernels"] if k["params"].get("TL")]
    assert late
    for k in late:
        assert k["trigger_from"] == math.prod(k["grid"])
        assert f"{pdl.ENTRY}{k['trigger_from']}u);" in payload["modules"][k["module"]]["source"]


def test_late_pin_turns_the_rule_off():
    plan = plan_of(cnn(), {}, "fp16", pin={"late": "0"})
    assert not any(lt.triggers_late(k) for k in plan.kernels) and not _records(plan)
    with pytest.raises(AicfError, match="late"):
        plan_of(cnn(), {}, "fp16", pin={"late": "2"})


@pytest.mark.parametrize("model", [chain_model, lambda: two_matmuls(256, 256)], ids=["attention-norm", "gemm-gemm"])
def test_only_between_kernels_of_channels_last_images(model):
    """An attention-like kernel and a row pass, two GEMMs: no image in sight, every entry keeps its trigger."""
    plan = plan_of(model(), {}, "fp16")
    kernels, hw = list(plan.kernels), load_profile("sm_90")
    assert not any(lt.triggers_late(k) for k in kernels) and not _records(plan)
    assert "channels-last images" in lt.why_not(kernels, 0, hw)


def test_no_late_trigger_without_dependent_launches():
    """sm_80 has none, and `--no-pdl` turns them off: every prediction keeps the profile's launch term."""
    for payload in (aicfc.compile(cnn(), target="sm_80", precision="fp16"),
                    aicfc.compile(cnn(), target="sm_90", precision="fp16", dependent_launch=False)):
        assert not any(k["params"].get("TL") for k in payload["kernels"])
        assert not any(d["rule"] == lt.RULE for d in payload["decisions"] if d["kind"] == "rewrite")


def test_a_kernel_before_a_gemv_keeps_its_trigger_at_entry():
    """A decode step: the gemvs request their first weights before their wait, so the kernels before them
    let them land early; kernels that trigger before their own wait (AHEAD, TF) keep it."""
    plan = plan_of(wide(), decode_shapes(1), "fp16")
    kernels, hw = list(plan.kernels), load_profile("sm_90")
    for i, k in enumerate(kernels[:-1]):
        nxt = kernels[i + 1]
        if nxt.schedule.param.get("unit") == "gemv" and not lt.triggers_late(k):
            why = lt.why_not(kernels, i, hw)
            assert why is not None
        if nxt.schedule.param.get("unit") == "gemv" or any(nxt.schedule.param.get(key) for key in lt.EARLY_WORK):
            assert not lt.triggers_late(k), (k.name, nxt.name, nxt.schedule.param)
        if k.schedule.param.get("AHEAD") or k.schedule.param.get("TF"):
            assert not lt.triggers_late(k)
            assert "before its own wait" in lt.why_not(kernels, i, hw)


def test_a_grid_of_several_waves_keeps_its_last_wave_trigger():
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [4096, 4096])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [4096, 4096])
    graph = helper.make_graph([helper.make_node("Tanh", ["x"], ["t"]), helper.make_node("Sigmoid", ["t"], ["y"])],
                              "waves", [x], [y])
    plan = plan_of(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), {})
    kernels, hw = list(plan.kernels), load_profile("sm_90")
    several = [i for i, k in enumerate(kernels)
               if pdl.trigger_from(k.schedule.grid, k.schedule.block, k.schedule.smem_bytes, k.schedule.registers, hw)]
    assert several
    for i in several:
        assert not lt.triggers_late(kernels[i])
        assert lt.why_not(kernels, i, hw) in ("a grid of more than one wave (it triggers from its last wave)",
                                              "the plan's last kernel")


@pytest.mark.gpu
def test_gpu_late_triggers_match_early_ones_and_onnxruntime(gpu_device):
    """ResNet-50's stage-3 3x3 (BN, ReLU) then a 1x1 convolution: the 3x3 triggers as its blocks exit."""
    from aicf_run.bundle import Bundle
    from aicf_run.executor import Executor
    from benchmarks.light_models import onnxruntime_reference
    model = B.conv_model((32, 256, 14, 14), (256, 256, 3, 3), bn=True, act="relu", pads=[1, 1, 1, 1], follow=256)
    x = np.random.default_rng(77).standard_normal((32, 256, 14, 14)).astype(np.float32)
    name = model.graph.input[0].name
    outputs = {}
    for late in ("1", "0"):
        payload = aicfc.compile(model, target=gpu_device.arch, precision="fp16", pin={"late": late})
        assert any(k["params"].get("TL") for k in payload["kernels"]) == (late == "1")
        ex = Executor(Bundle.from_payload(payload), gpu_device)
        try:
            ex.poison()
            first = next(iter(ex.run({name: x}).values()))
            for _ in range(200):        # graph replays back to back: a race shows as a difference
                ex.launch()
            again = next(iter(ex.run({name: x}).values()))
        finally:
            ex.close()
        assert np.array_equal(first, again)
        outputs[late] = first
    assert np.array_equal(outputs["1"], outputs["0"])
    ref = next(iter(onnxruntime_reference(model, {name: x}).values()))
    err = np.abs(outputs["1"].astype(np.float64) - ref).max() / np.abs(ref).max()
    assert np.isfinite(err) and err <= 1e-2
