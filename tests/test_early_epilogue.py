"""A gemv's epilogue operands requested before the dependent-launch wait (passes/early_epilogue.py,
[Note: epilogue reads before the wait]): the residual stream of a decoder's O and down projections,
written two or more launches back. On the GPU the decode step of test_row_scale's decoder is
compared with onnxruntime with the reads early and with them after the wait (`--pin epre=0`)."""
from __future__ import annotations

import numpy as np
import pytest

import aicfc
from aicfc.codegen import gemm, pdl
from aicfc.errors import AicfError
from aicfc.passes.early_epilogue import RULE
from aicfc.planner.cost_gemv import CONSTANTS
from tests.conftest import run_payload
from tests.test_gemv import rows_model
from tests.test_row_scale import check_decode_step, decode_inputs, decode_shapes, decoder
from tests.test_state import plan_of
from benchmarks.light_models import onnxruntime_reference


def _early(plan):
    return [k for k in plan.kernels if k.schedule is not None and k.schedule.param.get("EPRE")]


def test_decode_step_reads_its_residuals_early():
    plan = plan_of(decoder(), decode_shapes(1), "fp16")
    early = _early(plan)
    # of 2 layers: each down (it adds the O's sum; the last one's sum is the final norm's row, stored for the LM
    # head's row scale: [Note: the last residual row stored]) and the second O (the first layer's output); the
    # first O adds the embedding's row through the token (a data-dependent read). The second QKV computes its
    # rotary tables' terms before the wait ([Note: tables computed before the loop]); the first, kernel 1 of the
    # plan, after it (the position may be written right before the plan)
    assert len(early) == 4 and all(k.schedule.param["unit"] == "gemv" for k in early)
    rotary = [k for k in early if gemm.rotary(k) is not None]
    assert len(rotary) == 1 and gemm.early_reads(rotary[0], plan.types()) == ["cache_position", "c7"]
    index = {k.name: i for i, k in enumerate(plan.kernels)}
    for k in early:
        reads = gemm.early_reads(k, plan.types())
        assert reads and (len(reads) == 1 or k in rotary)
        for name in reads:   # written two or more launches back
            assert all(index[w.name] <= index[k.name] - 2 for w in plan.kernels if name in w.stores)
    recs = [r for r in plan.rewrites if r.rule == RULE]
    assert sum(r.applied for r in recs) == 4 and all(
        "requested while the previous kernel runs" in r.reason for r in recs if r.applied)
    first = next(k for k in plan.kernels if gemm.rotary(k) is not None)
    assert index[first.name] == 1 and first not in early and gemm.table_terms(first, plan.types())


def test_early_reads_are_credited_one_round_trip():
    on = {k.name: k for k in _early(plan_of(decoder(), decode_shapes(1), "fp16"))}
    off = {k.name: k for k in plan_of(decoder(), decode_shapes(1), "fp16", {"epre": "0"}).kernels if k.name in on}
    assert set(on) == set(off)
    for name, k in on.items():
        assert k.schedule.time_us == pytest.approx(off[name].schedule.time_us - CONSTANTS["gemv_early_read_us"], abs=1e-3)


def test_epre_pin_keeps_every_epilogue_after_the_wait():
    plan = plan_of(decoder(), decode_shapes(1), "fp16", {"epre": "0"})
    assert not _early(plan)
    assert any(not r.applied and "--pin epre=0" in r.reason for r in plan.rewrites if r.rule == RULE)
    with pytest.raises(AicfError, match="epre"):
        plan_of(decoder(), decode_shapes(1), "fp16", {"epre": "2"})


def test_a_residual_written_right_before_is_not_read_early():
    """One gemv whose residual is a plan input: the kernel is the plan's first, so whatever ran
    right before the plan may still be writing it; the epilogue stays after the wait."""
    payload = aicfc.compile(rows_model(1, 1024, 512, np.random.default_rng(0), residual=True), target="sm_90",
                            precision="fp16", pin={"unit": "gemv"})
    (k,) = [k for k in payload["kernels"] if k["family"] == "gemm"]
    assert "EPRE" not in k["params"]


def test_the_early_loads_come_before_the_entry():
    payload = aicfc.compile(decoder(), target="sm_90", precision="fp16", shapes=decode_shapes(1))
    source = "".join(m["source"] for m in payload["modules"])
    names = [k["name"] for k in payload["kernels"] if k["params"].get("EPRE")]
    built = [name for name in names if f" {name}(" in source]   # a kernel of the same code runs the first's function
    assert built
    for name in built:
        body = source[source.index(f" {name}("):]
        body = body[:body.index("\nextern \"C\"")] if "\nextern \"C\"" in body else body
        entry = body.index(pdl.ENTRY)
        held = "epre0" if "epilogue reads before the wait" in body[:entry] else "tbl0"   # a residual, or tables
        assert held == "epre0" or "[Note: tables computed before the loop]" in body[:entry]
        assert body.index(f"{held} = ") < entry < body.rindex(held)


def test_the_first_qkv_computes_its_tables_after_the_wait():
    """[Note: tables computed before the loop]: kernel 1 of the decode plan (its position may be written right
    before the plan) computes its rotary tables' terms after the wait, and its epilogue reads the registers."""
    payload = aicfc.compile(decoder(), target="sm_90", precision="fp16", shapes=decode_shapes(1))
    source = "".join(m["source"] for m in payload["modules"])
    name = payload["kernels"][1]["name"]
    assert not payload["kernels"][1]["params"].get("EPRE")
    body = source[source.index(f" {name}("):]
    body = body[:body.index("\nextern \"C\"")] if "\nextern \"C\"" in body else body
    entry, hoist = body.index(pdl.ENTRY), body.index("[Note: tables computed before the loop]")
    assert entry < hoist < body.index("tbl0 = ") < body.index("* tbl0)")
    assert "cosf(" not in body[body.index("* tbl0)"):]   # the tail reads registers, computes no table


@pytest.mark.gpu
@pytest.mark.parametrize("batch,precision", [(1, "fp16"), (2, "fp16"), (1, "bf16")])
@pytest.mark.parametrize("epre", ["1", "0"])
def test_gpu_decode_step_with_early_reads_matches_onnxruntime(batch, precision, epre, gpu_device):
    model = decoder(batch)
    inputs = decode_inputs(batch, seed=11 + batch)
    ref = onnxruntime_reference(model, inputs)
    payload = aicfc.compile(model, target=gpu_device.arch, precision=precision, shapes=decode_shapes(batch),
                            pin={"epre": epre})
    assert any(k["params"].get("EPRE") for k in payload["kernels"]) == (epre == "1")
    check_decode_step(run_payload(payload, inputs, gpu_device), ref, precision)
