"""The pooled stem fills its slots from the graph's input (passes/gather_stem.py, [Note: the stem gathers its input]
in codegen/conv_pool.py): the unfolded copy's kernel is gone and the stem's producer warpgroup computes what it
held. Where it applies and where it is declined, the record, the Decision IR's text, the interpreter's result
against the copy kept, the rendered producer and maps, ptxas without spills; on the GPU the stem against float64
and onnxruntime (fp16 / bf16: max|y - ref| / max|ref| <= 1e-2, NaN fails) and bit for bit against the copy kept."""
from __future__ import annotations

import shutil

import numpy as np
import pytest

from aicfc.codegen import conv_pool
from aicfc.errors import AicfError
from aicfc.frontend.onnx_import import import_model
from aicfc.ir.decision import parse_plan, print_plan, verify_plan
from aicfc.passes.gather_stem import RULE
from aicfc.passes.pipeline import Options, run_pipeline
from aicfc.planner.hardware import load_profile
from tests import onnx_builders as B
from tests.test_conv_taps import built_kernels, check_gpu, check_gpu_runs
from tests.test_pipeline import evaluate_plan

SM90 = load_profile("sm_90")


def _plan(x=(4, 64, 28, 28), pin: dict | None = None, precision: str = "fp16"):
    """The stem and its pool, gathering (`--pin gstem=1`, until it is measured: gather_stem.OPT_IN) unless `pin` says."""
    model = B.resnet_stage_model(x, stem=True)
    pin = {"gstem": "1", **(pin or {})}
    return run_pipeline(import_model(model, None), Options("sm_90", SM90, precision, tuple(pin.items()))).plan


def _record(plan):
    (rec,) = [r for r in plan.rewrites if r.rule == RULE]
    return rec


def _stem(plan):
    (k,) = [k for k in plan.kernels if conv_pool.is_pooled(k)]
    return k


def test_the_stem_gathers_its_input():
    plan = _plan()
    rec, k = _record(plan), _stem(plan)
    assert rec.applied and "neither written nor read back" in rec.reason and "--pin gstem=1" in rec.reason, rec.reason
    assert k.schedule.param["GI"] == 1 and k.schedule.param["unit"] == "pool"
    inl = conv_pool.gathered(k)
    assert inl is not None and inl.op.out == rec.target and inl.reason == rec.reason
    assert rec.bytes_saved == 2 * plan.types()[rec.target].nbytes
    # the copy's kernel is gone: nothing stores the unfolded copy, and the stem reads the graph's input
    assert not any(rec.target in c.stores for c in plan.kernels)
    assert {v.name for v in plan.inputs} <= {ld.buffer for ld in k.loads()}
    assert not {ld.buffer for ld in k.loads()} & inl.names
    # every candidate it was planned among gathers too
    assert all(dict(c.params).get("GI") == 1 for c in k.schedule.candidates)


def test_without_the_pin_the_stem_keeps_its_copy_and_says_why():
    model = B.resnet_stage_model((4, 64, 28, 28), stem=True)
    plan = run_pipeline(import_model(model, None), Options("sm_90", SM90, "fp16", ())).plan
    rec = _record(plan)
    assert not rec.applied and "--pin gstem=1" in rec.reason and "predicted" in rec.reason and "131.1" in rec.reason
    assert not _stem(plan).inlined and any(rec.target in c.stores for c in plan.kernels)


def test_pin_keeps_the_copy_and_rejects_other_values():
    plan = _plan(pin={"gstem": "0"})
    rec = _record(plan)
    assert not rec.applied and rec.reason == "--pin gstem=0"
    assert not _stem(plan).inlined and "GI" not in _stem(plan).schedule.param
    assert any(rec.target in c.stores for c in plan.kernels)
    with pytest.raises(AicfError, match="gstem=2"):
        _plan(pin={"gstem": "2"})


def test_a_stem_that_does_not_pool_keeps_its_copy():
    """Without the max pool the stem is not a `pool` kernel: no record at all."""
    plan = _plan(pin={"pooled": "0"})
    assert not [r for r in plan.rewrites if r.rule == RULE]


def test_the_copy_is_not_stored_and_the_cost_reads_the_input():
    plan, kept = _plan(), _plan(pin={"gstem": "0"})
    k, before = _stem(plan), _stem(kept)
    assert plan.buffers and _record(plan).target not in {b.name for b in plan.buffers}
    assert _record(plan).target in {b.name for b in kept.buffers}
    pred, pred0 = dict(k.schedule.predicted), dict(before.schedule.predicted)
    # the DRAM bytes: the input instead of its unfolded copy (3 channels of fp16 against 64 elements a pixel)
    assert pred["bytes"] < pred0["bytes"]
    copy = next(c for c in kept.kernels if _record(plan).target in c.stores)
    assert k.schedule.time_us < before.schedule.time_us + copy.schedule.time_us


def test_decision_ir_text_round_trips():
    plan = _plan()
    data = {w.name: w.data for w in plan.weights}
    again = parse_plan(print_plan(plan), data)
    verify_plan(again)
    assert [k.inlined for k in again.kernels] == [k.inlined for k in plan.kernels]


def test_the_interpreter_gives_the_copys_result():
    """The plan's computes (the inlined producer first) against the plan with the copy kept, on fresh inputs."""
    plan, kept = _plan((2, 64, 20, 22)), _plan((2, 64, 20, 22), pin={"gstem": "0"})
    x = {v.name: np.random.default_rng(1).standard_normal(v.type.shape).astype(np.float32) for v in plan.inputs}
    got, want = evaluate_plan(plan, x), evaluate_plan(kept, x)
    for name in want:
        assert np.isfinite(got[name]).all()
        np.testing.assert_array_equal(got[name], want[name])


def test_the_producer_fills_the_slots_and_two_maps_remain():
    plan = _plan()
    k = _stem(plan)
    p = k.schedule.param
    maps = conv_pool.tensor_maps(k, p, plan.types())
    assert len(maps) == 2 and _record(plan).target not in {m.buffer for m in maps}
    from aicfc.codegen import conv
    src = conv.render_kernel(k, p, plan.types(), "k")
    assert "fence.proxy.async.shared::cta" in src and "aicf_taps_tma4" not in src.split("setmaxnreg.inc")[0].split(
        "setmaxnreg.dec")[1]
    assert "__constant__ AicfTmap kmaps[2];" in conv.render_kernel(k, dict(p, MAPS="kmaps"), plan.types(), "k")
    # the unfolded rows' padding channel is their last 16 elements, which the producer's guard makes zero for every
    # pixel: XP's products skip that k16 step, and the estimate counts the products run
    xp = {"XP": 1, "TPH": 7, "TPW": 7}
    plan = _plan(pin=xp)
    k = _stem(plan)
    p = k.schedule.param
    src = conv.render_kernel(k, p, plan.types(), "k")
    assert p["XP"] == 1 and conv_pool.gathered_ksteps(k, plan.types()) == 3 and "kk < 3;" in src
    kept = _stem(_plan(pin={"gstem": "0", **xp}))
    assert conv_pool.ksteps(kept, kept.schedule.param, plan.types()) == 4 and "kk < 4;" in conv.render_kernel(
        kept, kept.schedule.param, plan.types(), "k")
    assert dict(k.schedule.predicted)["flops"] == 0.75 * dict(kept.schedule.predicted)["flops"]
    assert conv_pool.ksteps(k, dict(p, XP=0), plan.types()) == 4   # the ldmatrix path reads the zeros
    # [Note: a slot filled by source rows]: a task a source row's run, 20 words (38 elements and a slack one)
    rows = conv_pool.gather_rows(k, p, plan.types())
    assert rows is not None and rows.stride == 2 and rows.words == 20 and rows.width == 112
    assert "unsigned w[20];" in src and "__byte_perm" in src and "setmaxnreg.dec.sync.aligned.u32 96;" in src
    assert f"setmaxnreg.inc.sync.aligned.u32 {conv_pool.GATHER_REGS[1][p['NCONS']]};" in src


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not found")
@pytest.mark.parametrize("precision", ["fp16", "bf16"])
@pytest.mark.parametrize("pin", [(), ("--pin", "XP=0"), ("--pin", "GA=1")], ids=["xp", "rows", "ahead"])
def test_the_gathering_stem_builds_without_spills(tmp_path, precision, pin):
    kernels = built_kernels(tmp_path, B.resnet_stage_model((4, 64, 28, 28), stem=True), precision, "--pin", "gstem=1",
                            *pin)
    (k,) = [k for k in kernels if k["params"].get("unit") == "pool"]
    assert k["params"]["GI"] == 1 and k["registers_source"] == "ptxas" and not k.get("spills")
    assert k["params"].get("GA", 0) == (1 if "GA=1" in pin else 0)


def test_loads_ahead_where_a_thread_has_one_task_a_tile():
    """[Note: a tile's loads ahead]: GA = 0 and 1 offered where a tile's tasks fit the 128 producer threads, 0 taken on
    a tie; GA = 1 renders two runs of words, the next tile's requested before this tile's slot is filled."""
    plan = _plan(pin={"XP": 1, "TPH": 7, "TPW": 7})
    k, types = _stem(plan), plan.types()
    space = conv_pool.space(k, plan, 132, 232448)
    assert {p.get("GA") for p in space} >= {0, 1} and k.schedule.param["GA"] == 0
    for p in space:
        why = conv_pool.ahead_why_not(k, p, types)
        tasks = conv_pool.box(p, conv_pool.pooled_of(k, types).conv.taps)[1] * 2 * conv_pool.ksteps(k, p, types)
        assert ("GA" in p) == (why is None) and (why is None) == (conv_pool.gather_rows(k, p, types) is not None
                                                                  and tasks <= 128)
    p = dict(k.schedule.param, GA=1)
    from aicfc.codegen import conv
    src = conv.render_kernel(k, p, types, "k")
    assert "unsigned wa[20], wb[20];" in src and src.index("fetch(j + 1, wb)") < src.index("place(j, wa)")
    assert "setmaxnreg.dec.sync.aligned.u32 96;" in src


@pytest.mark.gpu
@pytest.mark.parametrize("precision", ["fp16", "bf16"])
@pytest.mark.parametrize("pin", [{"XP": 1, "TPH": 7, "TPW": 7}, {"XP": 1, "TPH": 4, "TPW": 4},
                                 {"XP": 1, "TPH": 7, "TPW": 7, "GA": 1}, {"XP": 1, "TPH": 4, "TPW": 4, "GA": 1},
                                 {"XP": 0, "TPH": 4, "TPW": 8}], ids=["xp7", "xp4", "xp7ahead", "xp4ahead", "rows"])
@pytest.mark.parametrize("x", [(4, 64, 28, 28), (3, 64, 36, 36), (2, 64, 30, 22)], ids=["28", "36", "30x22"])
def test_gpu_gathering_stem(x, pin, precision, gpu_device):
    """The stem's tiles cut by the pooled image's edges (36x36, 30x22), on both units' layouts, against float64."""
    import aicfc
    model = B.resnet_stage_model(x, stem=True)
    payload = aicfc.compile(model, target=gpu_device.arch, precision=precision, pin={"gstem": 1, **pin})
    (k,) = [k for k in payload["kernels"] if k["params"].get("unit") == "pool"]
    assert k["params"]["GI"] == 1 and k["params"].get("GA", 0) == pin.get("GA", 0)
    check_gpu(model, payload, gpu_device, precision)


@pytest.mark.gpu
@pytest.mark.parametrize("ahead", [0, 1])
def test_gpu_gathering_stem_reuses_its_slots_and_matches_the_copy(ahead, gpu_device):
    """Eight 56x56 pooled images (every slot reused), five runs against onnxruntime in one executor; then the same
    input through the plan with the copy kept: the same bits (the producer rounds as the copy stores)."""
    import aicfc
    from tests.conftest import run_payload
    model = B.resnet_stage_model((8, 64, 56, 56), stem=True)
    payload = aicfc.compile(model, target=gpu_device.arch, precision="fp16", pin={"gstem": 1, "GA": ahead})
    kept = aicfc.compile(model, target=gpu_device.arch, precision="fp16", pin={"gstem": 0})
    assert [(k["params"].get("GI"), k["params"].get("GA")) for k in payload["kernels"]
            if k["params"].get("unit") == "pool"] == [(1, ahead)]
    check_gpu_runs(model, payload, gpu_device, "fp16", onnxruntime=True)
    graph = import_model(model, None)
    x = {v.name: np.random.default_rng(7).standard_normal(v.type.shape).astype(np.float32) for v in graph.inputs}
    got, want = run_payload(payload, x, gpu_device), run_payload(kept, x, gpu_device)
    for name in want:
        assert np.isfinite(got[name]).all()
        np.testing.assert_array_equal(got[name], want[name])
