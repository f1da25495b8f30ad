"""Kernels that work before their dependent-launch wait (passes/work_before_wait.py, [Note: work before
the wait]): a pointwise or row-pass kernel reading nothing a still-running kernel writes triggers the next
launch at its entry, works, and waits as it returns. CPU: where the rule applies, where it declines and why
(a decode step, whose rotary tables the QKV gemvs now compute, has no kernel left for it), the arena bytes it
keeps apart and the entry codegen writes. GPU: outputs against numpy with the rule on and off, over graph
replays."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import aicfc
from aicfc.codegen import pdl
from aicfc.errors import AicfError
from aicfc.ir.lowered import loads
from aicfc.passes.work_before_wait import RULE, ahead, running
from tests.test_row_scale import check_decode_step, decode_inputs, decode_shapes, decoder
from tests.test_state import plan_of
from benchmarks.light_models import onnxruntime_reference


def side_model() -> onnx.ModelProto:
    """a = softmax(x) rows, c = softmax(z) columns (independent of a: its own kernel, nothing to wait
    for), y = a @ w + layernorm(z)."""
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((256, 256)).astype(np.float32), "w")
    g = numpy_helper.from_array(np.ones(256, np.float32), "g")
    nodes = [helper.make_node("Softmax", ["x"], ["a"], axis=-1),
             helper.make_node("LayerNormalization", ["z", "g"], ["b"], axis=-1),
             helper.make_node("Softmax", ["z"], ["c"], axis=0),
             helper.make_node("MatMul", ["a", "w"], ["m"]),
             helper.make_node("Add", ["m", "b"], ["y"])]
    io = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [64, 256]) for n in ("x", "z", "y", "c")]
    graph = helper.make_graph(nodes, "ahead", io[:2], io[2:], [w, g])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _records(plan):
    return {r.target: r for r in plan.rewrites if r.rule == RULE}


def _arena(plan):
    return {b.name: (b.offset, b.offset + b.type.nbytes) for b in plan.buffers if b.region == "arena"}


def test_the_decode_step_has_no_kernel_to_move_before_its_wait():
    """The decode step's sin table and first norm worked before their waits until the rotary tables moved into
    the QKV gemvs ([Note: a table recomputed where it is read] in passes/inline_producers.py): the step now
    starts with the embedding row's norm, the plan's first kernel (not considered), and each later kernel reads
    the kernel before it."""
    plan = plan_of(decoder(), decode_shapes(1), "fp16")
    assert not any(ahead(k) for k in plan.kernels)
    assert [op.out for op in plan.kernels[0].ops] == ["reducemean_29", "mul_34"]
    rec = _records(plan)
    assert "k0" not in rec and all(not r.applied for r in rec.values())


def test_what_an_ahead_kernel_stores_shares_no_bytes_with_the_kernels_beside_it():
    for plan in (plan_of(decoder(), decode_shapes(1), "fp16"), plan_of(side_model(), {}, "fp32")):
        arena = _arena(plan)
        for i, k in enumerate(plan.kernels):
            if not ahead(k):
                continue
            mine = [arena[s] for s in k.stores if s in arena]
            assert mine
            for j in running(plan.kernels, i):
                other = plan.kernels[j]
                theirs = {ld.buffer for op in other.ops for ld in loads(op.body)} | set(other.stores)
                for lo, hi in (arena[b] for b in theirs if b in arena):
                    assert all(hi <= a or b <= lo for a, b in mine), (k.name, other.name)


def reduce_model() -> onnx.ModelProto:
    """a = x @ w (a gemm), b = the rows' sums of a (a row pass, the last reader of a), c = softmax(z) along
    columns (its own kernel, reading nothing of the two before it: AHEAD beside b's)."""
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((256, 256)).astype(np.float32), "w")
    axes = numpy_helper.from_array(np.array([1], np.int64), "axes")
    nodes = [helper.make_node("MatMul", ["x", "w"], ["a"]),
             helper.make_node("ReduceSum", ["a", "axes"], ["b"], keepdims=1),
             helper.make_node("Softmax", ["z"], ["c"], axis=0)]
    io = [helper.make_tensor_value_info(n, TensorProto.FLOAT, s)
          for n, s in (("x", [64, 256]), ("z", [64, 256]), ("b", [64, 1]), ("c", [64, 256]))]
    graph = helper.make_graph(nodes, "ahead_memory", io[:2], io[2:], [w, axes])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_plan_memory_keeps_an_ahead_store_off_what_the_kernel_beside_it_reads(monkeypatch):
    """c (k2, AHEAD) is written while k1 may still read a, where a dies: placed by its writer's index alone, c
    would take a's bytes."""
    import aicfc.passes.plan_memory as plan_memory
    plan = plan_of(reduce_model(), {}, "fp32")
    assert [(k.family, k.stores, ahead(k)) for k in plan.kernels] == [
        ("gemm", ("a",), False), ("row_reduce", ("b",), False), ("row_reduce", ("c",), True)]
    (a0, a1), (c0, c1) = _arena(plan)["a"], _arena(plan)["c"]
    assert a1 <= c0 or c1 <= a0
    monkeypatch.setattr(plan_memory, "ahead", lambda k: False)   # lifetimes from the writer, as before the rule
    apart = _arena(plan_of(reduce_model(), {}, "fp32"))
    assert apart["a"][0] == apart["c"][0]   # what the rule's lifetimes prevent


def test_the_rule_leaves_a_kernel_that_reads_its_predecessor_and_the_first_kernel_alone():
    plan = plan_of(side_model(), {}, "fp32")
    assert [k.family for k in plan.kernels] == ["row_reduce", "row_reduce", "gemm", "row_reduce"]
    assert [ahead(k) for k in plan.kernels] == [False, True, False, False]
    rec = _records(plan)
    assert rec["k1"].applied and "predicted to overlap" in rec["k1"].reason
    assert not rec["k3"].applied and "'m', which k2 writes" in rec["k3"].reason


def test_no_kernel_is_ahead_without_dependent_launches():
    """sm_80 has no programmatic dependent launch: every kernel starts plainly, nothing to move."""
    from aicfc.frontend.onnx_import import import_model
    from aicfc.passes.pipeline import Options, run_pipeline
    from aicfc.planner.hardware import load_profile
    plan = run_pipeline(import_model(side_model(), {}), Options("sm_80", load_profile("sm_80"), "fp32")).plan
    assert not any(ahead(k) for k in plan.kernels) and not _records(plan)


def test_ahead_pin_turns_the_rule_off():
    plan = plan_of(decoder(), decode_shapes(1), "fp16", {"ahead": "0"})
    assert not any(ahead(k) for k in plan.kernels)
    assert all(not r.applied and r.reason == "--pin ahead=0" for r in _records(plan).values())
    with pytest.raises(AicfError, match="ahead"):
        plan_of(decoder(), decode_shapes(1), "fp16", {"ahead": "2"})


def _body(payload: dict, name: str) -> str:
    """Kernel `name`'s function in the payload's modules (to the next kernel of its module, not into the next
    module's preamble)."""
    source = next(m["source"] for m in payload["modules"] if f" {name}(" in m["source"])
    body = source[source.index(f" {name}("):]
    return body[:body.index('\nextern "C"')] if '\nextern "C"' in body else body


def test_the_entry_triggers_first_and_waits_as_the_kernel_returns():
    payload = aicfc.compile(side_model(), target="sm_90")
    source = "".join(m["source"] for m in payload["modules"])
    assert "struct AicfPdlLateWait" in source
    ahead_body, plain_body = _body(payload, "k1"), _body(payload, "k0")
    assert pdl.ahead_entry() in ahead_body and pdl.ENTRY not in ahead_body
    assert ahead_body.index(pdl.ahead_entry()) < ahead_body.index("__shared__")
    assert pdl.ENTRY in plain_body and pdl.AHEAD_ENTRY not in plain_body
    plain = aicfc.compile(side_model(), target="sm_90", dependent_launch=False)
    assert "AicfPdlLateWait aicf_pdl_late" not in "".join(m["source"] for m in plain["modules"])


def test_timeline_entry_of_an_ahead_kernel_stamps_the_exit_after_the_wait():
    payload = aicfc.compile(side_model(), target="sm_90", timeline=True)
    body = _body(payload, "k1")
    assert (body.index("aicf_timeline_ahead_entry(") < body.index("AicfTimelineExit<")
            < body.index("AicfPdlLateWait aicf_pdl_late"))


def _softmax(v, axis):
    e = np.exp(v - v.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


@pytest.mark.gpu
def test_gpu_ahead_kernels_match_numpy_over_graph_replays(gpu_device):
    from tests.conftest import run_replayed
    model = side_model()
    rng = np.random.default_rng(5)
    inputs = {n: rng.standard_normal((64, 256)).astype(np.float32) for n in ("x", "z")}
    x, z = (inputs[n].astype(np.float64) for n in ("x", "z"))
    w = numpy_helper.to_array(model.graph.initializer[0]).astype(np.float64)
    zn = (z - z.mean(-1, keepdims=True)) / np.sqrt(z.var(-1, keepdims=True) + 1e-5)
    ref = {"y": _softmax(x, -1) @ w + zn, "c": _softmax(z, 0)}
    for on in ("1", "0"):
        payload = aicfc.compile(model, target=gpu_device.arch, pin={"ahead": on})
        assert any(k["params"].get("AHEAD") for k in payload["kernels"]) == (on == "1")
        first, again = run_replayed(payload, inputs, gpu_device)   # a race shows as a difference
        for name, want in ref.items():
            assert np.isfinite(first[name]).all() and np.array_equal(first[name], again[name])
            assert np.abs(first[name] - want).max() / np.abs(want).max() <= 1e-4, (on, name)
