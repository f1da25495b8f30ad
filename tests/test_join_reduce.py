"""[Note: a reduce joined into the epilogue] (passes/join_reduce.py): a GEMM whose A operand is a Hopper GEMM's whole
output rows runs as a second product in that GEMM's epilogue. Where it is taken and declined, the Decision IR's record
(printed and parsed back), the layout and cost terms, ptxas without spills, and on the GPU both outputs against a
float64 reference (fp16 and bf16: max|y - ref| / max|ref| <= 1e-2, NaN fails) and against the pair kept apart.
"""
from __future__ import annotations

import shutil

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import aicfc
from aicfc.codegen import gemm_wgmma
from aicfc.frontend.onnx_import import import_model
from aicfc.ir.decision import parse_plan, print_plan
from aicfc.ir.high import evaluate_graph
from aicfc.passes.pipeline import Options, run_pipeline
from aicfc.planner import cost_wgmma
from aicfc.planner.hardware import load_profile
from tests.conftest import run_payload
from tests.test_pipeline import rel_err

SM90 = load_profile("sm_90")
RULE = "a GEMM over a Hopper GEMM's whole output rows => a second product in that GEMM's epilogue"


def block_pair(rows, k, c, n2, rng, batch=None):
    """A bottleneck block's end and the next one's start, channels-last: y = relu(x·w1ᵀ + b1 + r) (the expansion
    with its shortcut), z = relu(y·w2ᵀ + b2) (the next block's reduce); both are graph outputs. `batch`: x as
    [batch, rows, k] (images as rows)."""
    lead = [batch] if batch else []
    nodes = [helper.make_node("MatMul", ["x", "w1t"], ["mm1"], name="mm1"), helper.make_node("Add", ["mm1", "b1"], ["h"]),
             helper.make_node("Add", ["h", "r"], ["hr"]), helper.make_node("Relu", ["hr"], ["y"]),
             helper.make_node("MatMul", ["y", "w2t"], ["mm2"], name="mm2"), helper.make_node("Add", ["mm2", "b2"], ["h2"]),
             helper.make_node("Relu", ["h2"], ["z"])]
    inits = {"w1t": rng.standard_normal((k, c)).astype(np.float32) / np.sqrt(k),
             "b1": rng.standard_normal(c).astype(np.float32),
             "w2t": rng.standard_normal((c, n2)).astype(np.float32) / np.sqrt(c),
             "b2": rng.standard_normal(n2).astype(np.float32)}
    g = helper.make_graph(nodes, "block_pair",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, lead + [rows, k]),
                           helper.make_tensor_value_info("r", TensorProto.FLOAT, lead + [rows, c])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, lead + [rows, c]),
                           helper.make_tensor_value_info("z", TensorProto.FLOAT, lead + [rows, n2])],
                          [numpy_helper.from_array(a, n) for n, a in inits.items()])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def _plan(model, pin=None, precision="fp16"):
    return run_pipeline(import_model(model, None), Options("sm_90", SM90, precision, pin=tuple((pin or {}).items()))).plan


def _records(plan):
    return [r for r in plan.rewrites if r.rule == RULE]


def _gemms(plan):
    return [k for k in plan.kernels if k.family == "gemm"]


def test_joined_where_the_host_holds_whole_rows():
    plan = _plan(block_pair(6272, 64, 256, 64, np.random.default_rng(0)))
    (rec,) = _records(plan)
    assert rec.applied and "not read back" in rec.reason, rec.reason
    (host,) = _gemms(plan)
    p = host.schedule.param
    assert p["J2"] == 64 and p["BN"] == 256 and p["MI"] == 1 and p["OUT"]
    assert len(host.joined) == 1 and len(host.stores) == 2 and host.own_stores == (host.ops[-1].out,)
    assert gemm_wgmma.smem_bytes(p) + gemm_wgmma.static_smem(p) <= SM90.smem_per_block_optin
    assert host.schedule.smem_bytes == gemm_wgmma.smem_bytes(p)
    # the joined record reads the host's output and a weight, and stores the reduce's result
    assert host.joined[0].ops[0].out in {op.out for op in host.joined_ops}
    assert {ld.buffer for ld in host.loads()} >= {host.ops[-1].out}


def test_decision_ir_prints_and_parses_the_join():
    plan = _plan(block_pair(6272, 64, 256, 64, np.random.default_rng(0)))
    text = print_plan(plan)
    assert "    joined k" in text
    back = parse_plan(text, {w.name: w.data for w in plan.weights})
    assert print_plan(back) == text
    assert back.kernels[[k.name for k in back.kernels].index(_gemms(plan)[0].name)].joined == _gemms(plan)[0].joined


def test_the_interpreter_runs_the_joined_gemm():
    """The Decision IR's interpreter (tests/test_pipeline.evaluate_plan) computes the joined GEMM after its host: both
    outputs against float64."""
    from tests.test_pipeline import evaluate_plan
    model = block_pair(6272, 64, 256, 64, np.random.default_rng(0))
    plan = _plan(model)
    assert _gemms(plan)[0].joined
    graph = import_model(model, None)
    rng = np.random.default_rng(1)
    inputs = {v.name: rng.standard_normal(v.type.shape).astype(np.float32) for v in graph.inputs}
    ref = evaluate_graph(graph, inputs, dtype=np.float64)
    got = evaluate_plan(plan, inputs)
    for name in ("y", "z"):
        assert rel_err(got[name], ref[name]) <= 1e-2


def test_declined_with_the_reason():
    apart = _plan(block_pair(6272, 64, 256, 64, np.random.default_rng(0)), pin={"joinr": 0})
    (rec,) = _records(apart)
    assert not rec.applied and rec.reason == "--pin joinr=0"
    assert len(_gemms(apart)) == 2
    wide = _plan(block_pair(2048, 64, 512, 64, np.random.default_rng(0)))
    (rec,) = _records(wide)
    assert not rec.applied and "whole rows" in rec.reason, rec.reason


def test_tune_measures_the_candidates_that_hold_the_join():
    from aicfc.tune import candidates
    plan = _plan(block_pair(6272, 64, 256, 64, np.random.default_rng(0)))
    (kt,) = candidates(plan, SM90, top=4, spread=2)
    assert kt.candidates and all(m.params["J2"] == 64 and m.params["BN"] == 256 for m in kt.candidates)


def test_in_place_never_writes_the_joined_output_over_a_dying_input():
    plan = _plan(block_pair(6272, 64, 256, 64, np.random.default_rng(0)))
    (host,) = _gemms(plan)
    joined = host.joined[0].ops[-1].out
    assert all(ip.output != joined for ip in host.inplace)


def test_cost_charges_the_second_product_and_its_stores():
    plan = _plan(block_pair(6272, 64, 256, 64, np.random.default_rng(0)))
    (host,) = _gemms(plan)
    types = plan.types()
    p = host.schedule.param
    io = sum(types[b].nbytes for b in {ld.buffer for ld in host.loads()} - host.outs | set(host.stores))
    with_join = cost_wgmma.wgmma_terms(host, p, types, SM90, io, 1.0)
    bare = host.replace(joined=(), stores=host.own_stores)
    without = cost_wgmma.wgmma_terms(bare, {**p, "J2": 0}, types, SM90, io, 1.0)
    assert with_join["t_epilogue_us"] > without["t_epilogue_us"]
    assert with_join["t_pipeline_us"] > without["t_pipeline_us"]   # the weight crosses before the first tile


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not found")
@pytest.mark.parametrize("c,n2", [(256, 64), (256, 128), (256, 96)])
def test_builds_without_spills(c, n2, tmp_path, monkeypatch):
    """Planned as `aicfc compile` plans (ptxas checks the leaders: a joined candidate that spills loses its place)."""
    from aicfc.codegen.module import render_module
    from aicfc.codegen.nvcc import build
    monkeypatch.setenv("AICF_CACHE_DIR", str(tmp_path))
    from aicfc.codegen.module import count_registers
    plan = run_pipeline(import_model(block_pair(6272, 64, c, n2, np.random.default_rng(0)), None),
                        Options("sm_90", SM90, "fp16", pin=(("joinr", 1),), check=count_registers)).plan
    (host,) = _gemms(plan)
    assert host.schedule.param["J2"] == n2
    src = render_module(plan)
    assert f"aicf_wgg_rs_f16_{n2}(acc2" in src
    built = build(src, "sm_90")
    assert built.spills.get(host.name, 0) == 0, built.spills


def _run(model, precision, pin, device, seed):
    payload = aicfc.compile(model, target=device.arch, precision=precision, pin=pin)
    rng = np.random.default_rng(seed)
    graph = import_model(model, None)
    inputs = {v.name: rng.standard_normal(v.type.shape).astype(np.float32) for v in graph.inputs}
    return payload, inputs, evaluate_graph(graph, inputs, dtype=np.float64), run_payload(payload, inputs, device)


# (rows, K, C, N2, batch, pin): stage 1's shapes (C = 256, N2 = 64 and 128) with edges in the rows, images as rows,
# TMA stores, ping-pong and cooperative host tiles pinned on the host's node, 96 columns; joined wherever legal (joinr = 1)
GPU_CASES = [
    (6272, 64, 256, 64, None, {}),
    (5000, 128, 256, 128, None, {}),
    (3136, 64, 256, 64, 4, {"mm1:FLAT": 1, "mm1:TS": 1}),
    (3136, 64, 256, 64, 2, {"mm1:PP": 1}),
    (3000, 64, 256, 64, None, {"mm1:PP": 0, "mm1:TS": 1}),
    (4000, 64, 256, 96, None, {}),   # a second box half full: the TMA store clips it at N2
]


@pytest.mark.gpu
@pytest.mark.parametrize("precision", ("fp16", "bf16"))
@pytest.mark.parametrize("rows,k,c,n2,batch,pin", GPU_CASES,
                         ids=[f"{r}x{k}x{c}x{n}-b{b}-{'_'.join(f'{a}{v}' for a, v in p.items()) or 'plan'}"
                              for r, k, c, n, b, p in GPU_CASES])
def test_joined_matches_float64_and_apart(rows, k, c, n2, batch, pin, precision, gpu_device):
    model = block_pair(rows, k, c, n2, np.random.default_rng(rows + c), batch)
    payload, inputs, ref, got = _run(model, precision, {**pin, "joinr": 1}, gpu_device, seed=rows + 1)
    hosts = [kk for kk in payload["kernels"] if kk["family"] == "gemm"]
    assert len(hosts) == 1 and hosts[0]["params"]["J2"] == n2, [kk["params"] for kk in hosts]
    for name in ("y", "z"):
        assert not np.isnan(got[name]).any()
        err = rel_err(got[name], ref[name])
        assert err <= 1e-2, f"{name}: rel err {err:.2e}"
    _, _, _, apart = _run(model, precision, {**pin, "joinr": 0}, gpu_device, seed=rows + 1)
    # the joined product sums the same 16-bit values in the same k order as the reduce kernel
    assert rel_err(got["z"], apart["z"].astype(np.float64)) <= 2e-3
    np.testing.assert_array_equal(got["y"], apart["y"])
