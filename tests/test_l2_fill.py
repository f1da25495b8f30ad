"""A gemv that lands while the kernel before it leaves the DRAM idle requests its weight slice, and the
first rows of the next weight stream, into L2 before its dependent-launch wait (passes/l2_fill.py,
[Note: L2 fill]). On the GPU the decode step of test_row_scale's decoder is compared with onnxruntime
with the fills and without them (`--pin fill=0`)."""
from __future__ import annotations

import functools

import pytest

import aicfc
from aicfc.codegen import gemm_gemv, pdl
from aicfc.codegen.common import kernel_args
from aicfc.errors import AicfError
from aicfc.ir.decision import parse_plan
from aicfc.passes.l2_fill import RULE
from tests.conftest import run_payload
from benchmarks.decoder_graph import DecoderConfig
from tests.test_row_scale import CFG, check_decode_step, decode_inputs, decode_shapes, decoder
from tests.test_state import plan_of
from benchmarks.light_models import onnxruntime_reference


# one layer as wide as the 1 B Llama's (a narrower FFN): the gate/up's k-splits hold more than their first step, so
# the head has rows to request (test_row_scale's decoder fetches its whole split in one step)
WIDE = DecoderConfig(2048, 1, 32, 8, 2816, 1000, 64)


@functools.cache
def wide(batch: int = 1):
    return decoder(batch, WIDE)


@functools.cache
def wide_decode_plan(pins: tuple[tuple[str, str], ...] = ()):
    """The wide decoder's decode plan as `aicfc compile` plans it under `--pin` `pins` (the leading candidates'
    registers from ptxas), for the tests of the decode step's late passes."""
    from aicfc.driver import count_registers
    from aicfc.frontend.onnx_import import import_model
    from aicfc.passes.pipeline import Options, run_pipeline
    from aicfc.planner.hardware import load_profile
    opts = Options("sm_90", load_profile("sm_90"), "fp16", pins, check=functools.partial(count_registers, jobs=2))
    return run_pipeline(import_model(wide(), decode_shapes(1)), opts).plan


def _records(plan):
    return [r for r in plan.rewrites if r.rule == RULE]


def test_the_projection_after_the_attention_fills_the_next_stream():
    plan = plan_of(wide(), decode_shapes(1), "fp16")
    index = {k.name: i for i, k in enumerate(plan.kernels)}
    after_attention = [plan.kernels[i + 1] for i, k in enumerate(plan.kernels[:-1]) if k.family == "attention"]
    assert len(after_attention) == WIDE.layers
    for k in after_attention:
        assert k.schedule.param["unit"] == "gemv" and k.schedule.param["PF"] == 1
        (fill,) = k.prefetch
        nxt = plan.kernels[index[k.name] + 1]
        assert nxt.ops[0].body and fill.buffer in kernel_args(nxt)          # the next gemv's own weight
        assert fill.buffer in kernel_args(k)                                 # passed to this one, read-only
        nbytes = plan.types()[fill.buffer].numel * 2
        assert all(0 <= off and off + n <= nbytes and off % 16 == 0 and n % 16 == 0 for off, n in fill.ranges)
        assert len(fill.ranges) == nxt.schedule.param["SPLITK"]             # the head of every split
        row = plan.types()[fill.buffer].shape[-1] * 2
        per = gemm_gemv.k_per_split(plan.types()[fill.buffer].shape[0], nxt.schedule.param)
        step = min(gemm_gemv.k_step(nxt.schedule.param), per)               # past the step its blocks request
        assert [off for off, _ in fill.ranges] == [(y * per + step) * row for y in range(len(fill.ranges))]
        assert nxt.schedule.param["HOT"] == fill.bytes                      # credited to the stream that reads it
    assert sum(r.applied for r in _records(plan)) >= WIDE.layers


def test_the_head_streams_at_the_l2_rate():
    from aicfc.planner.cost_gemv import CONSTANTS
    from aicfc.planner.hardware import load_profile
    l2 = load_profile("sm_90").data["l2_bandwidth_gbs"] * 1e3
    on = plan_of(wide(), decode_shapes(1), "fp16")
    off = {k.name: k for k in plan_of(wide(), decode_shapes(1), "fp16", {"fill": "0"}).kernels}
    hot = [k for k in on.kernels if k.schedule is not None and k.schedule.param.get("HOT")]
    assert hot
    for k in hot:
        t_on, t_off = dict(k.schedule.predicted)["t_dram_us"], dict(off[k.name].schedule.predicted)["t_dram_us"]
        hot = k.schedule.param["HOT"]
        assert t_off - t_on == pytest.approx(hot / (CONSTANTS["gemv_stream_gbs"] * 1e3) - hot / l2, abs=1e-5)
        assert k.schedule.time_us < off[k.name].schedule.time_us


def test_fill_pin_sets_the_head_or_turns_the_rule_off():
    off = plan_of(decoder(), decode_shapes(1), "fp16", {"fill": "0"})
    assert not any(k.prefetch or k.schedule.param.get("PF") for k in off.kernels if k.schedule is not None)
    assert all(not r.applied and "--pin fill=0" in r.reason for r in _records(off))
    small = plan_of(wide(), decode_shapes(1), "fp16", {"fill": "0.25"})
    assert all(f.bytes <= 0.25 * 2**20 for k in small.kernels for f in k.prefetch)
    for bad in ("lots", "-1", "nan", "inf"):
        with pytest.raises(AicfError, match="fill"):
            plan_of(decoder(), decode_shapes(1), "fp16", {"fill": bad})


def test_a_stream_bigger_than_the_window_is_declined():
    """A slice the idle window cannot bring in (the 1 B Llama's 125 MB LM head after its final norm)
    would stay in L2 only in part: declined, as is a gemv after a kernel that streams its own bytes."""
    import dataclasses
    from aicfc.passes.l2_fill import why_not
    from aicfc.planner.hardware import load_profile
    hw = load_profile("sm_90")
    plan = plan_of(decoder(), decode_shapes(1), "fp16", {"fill": "0"})
    i = next(i for i, k in enumerate(plan.kernels[:-1]) if k.family == "attention") + 1
    assert why_not(plan, i, hw) is None
    k = plan.kernels[i]
    big = dict(k.schedule.predicted) | {"bytes": 125e6}
    kernels = list(plan.kernels)
    kernels[i] = k.replace(schedule=dataclasses.replace(k.schedule, predicted=tuple(sorted(big.items()))))
    assert "more than" in why_not(plan.replace(kernels=tuple(kernels)), i, hw)
    busy = dict(plan.kernels[i - 1].schedule.predicted) | {"bytes": 1e9}
    kernels = list(plan.kernels)
    kernels[i - 1] = plan.kernels[i - 1].replace(schedule=dataclasses.replace(plan.kernels[i - 1].schedule,
                                                                             predicted=tuple(sorted(busy.items()))))
    assert "busy" in why_not(plan.replace(kernels=tuple(kernels)), i, hw)


def test_prefetch_records_print_and_parse():
    plan = plan_of(wide(), decode_shapes(1), "fp16")
    assert any(k.prefetch for k in plan.kernels)
    assert "    prefetch %" in str(plan)
    assert parse_plan(str(plan), {w.name: w.data for w in plan.weights}) == plan


def test_the_fill_comes_before_the_entry():
    payload = aicfc.compile(wide(), target="sm_90", precision="fp16", shapes=decode_shapes(1))
    source = "".join(m["source"] for m in payload["modules"])
    names = {k["symbol"] for k in payload["kernels"] if k["params"].get("PF")}
    assert names
    bulk = 0
    for name in names:
        body = source[source.index(f" {name}("):]
        body = body[:body.index("\nextern \"C\"")] if "\nextern \"C\"" in body else body
        entry = body.index(pdl.ENTRY)
        # the slice: a line a row segment over [K, N], one bulk request a run over K-major columns
        assert min(body.find(x) % len(body) for x in ("prefetch.global.L2", "bulk.prefetch.L2")) < entry
        if "cp.async.bulk.prefetch.L2" in body:
            bulk += 1
            assert body.index("cp.async.bulk.prefetch.L2") < entry
    assert bulk


@pytest.mark.gpu
@pytest.mark.parametrize("batch,precision", [(1, "fp16"), (2, "fp16"), (1, "bf16")])
@pytest.mark.parametrize("fill", ["auto", "0", "8"])
def test_gpu_decode_step_with_fills_matches_onnxruntime(batch, precision, fill, gpu_device):
    model = wide(batch)
    inputs = decode_inputs(batch, seed=17 + batch, cfg=WIDE)
    ref = onnxruntime_reference(model, inputs)
    payload = aicfc.compile(model, target=gpu_device.arch, precision=precision, shapes=decode_shapes(batch),
                            pin=None if fill == "auto" else {"fill": fill})
    assert any(k["params"].get("PF") for k in payload["kernels"]) == (fill != "0")
    check_decode_step(run_payload(payload, inputs, gpu_device), ref, precision, WIDE)


def test_share_pin_sets_the_idle_share():
    """`--pin fillshare=F`: the share of its body under which a kernel's own bytes leave the DRAM idle; a share so
    small that no kernel qualifies declines the rule everywhere, and a share outside (0, 1] is refused."""
    plan = plan_of(decoder(8), decode_shapes(8), "fp16")
    assert any(r.applied for r in _records(plan))
    tiny = plan_of(decoder(8), decode_shapes(8), "fp16", {"fillshare": "0.001"})
    assert not any(r.applied for r in _records(tiny)) and any("busy" in r.reason for r in _records(tiny))
    for bad in ("0", "1.5", "x"):
        with pytest.raises(AicfError, match="fillshare"):
            plan_of(decoder(), decode_shapes(1), "fp16", {"fillshare": bad})


def test_the_head_reaches_past_a_norm_kept_apart():
    """`_next_stream`: where a norm runs as its own kernel between the filling gemv and the next stream (B8),
    the head is the gemv's after it."""
    from aicfc.passes.l2_fill import _next_stream
    plan = plan_of(wide(), decode_shapes(1), "fp16")
    i = next(i for i, k in enumerate(plan.kernels) if k.prefetch)
    norm = plan.kernels[i].replace(name="norm_apart", family="row_reduce", schedule=None, prefetch=())
    kernels = list(plan.kernels)
    kernels.insert(i + 1, norm)
    apart = plan.replace(kernels=tuple(kernels))
    assert _next_stream(apart, i) == i + 2 and _next_stream(plan, i) == i + 1


def test_a_gemv_after_a_gemv_is_declined():
    """A gemv streams its weight through its body: the gemv after it never takes the fill, whatever its
    prediction adds to its bytes (requests while the DRAM streams slowed the plan)."""
    plan = plan_of(wide(), decode_shapes(1), "fp16", {"fillshare": "1", "kmajor": "0"})
    by_name = {k.name: i for i, k in enumerate(plan.kernels)}
    after_gemv = [r for r in _records(plan) if plan.kernels[by_name[r.target] - 1].schedule is not None
                  and plan.kernels[by_name[r.target] - 1].schedule.param.get("unit") == "gemv"]
    assert after_gemv and all(not r.applied and "busy" in r.reason for r in after_gemv)
