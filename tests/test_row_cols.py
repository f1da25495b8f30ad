"""The `cols` pass of the row_reduce family (codegen/row_cols.py): a reduction over the spatial
positions of a channels-last image, a thread owning 8 channels (one 16-byte vector) and a block's
slices merging in a shared-memory tree.

CPU: where it applies and why not; the source vectorizes and builds for sm_90a without spills;
the planner takes it for a squeeze over a channels-last image. GPU (`gpu`): against numpy
float64 (fp16 1e-2, bf16 2e-2 of the output's max), edge blocks (a row of 17 vectors), sum and
max, every lanes count.
"""
from __future__ import annotations

import math
import shutil

import numpy as np
import pytest
from onnx import helper

from aicfc.codegen import row_cols, row_reduce
from aicfc.frontend.onnx_import import import_model
from aicfc.passes.pipeline import Options, run_pipeline
from aicfc.planner.hardware import load_profile
from tests import onnx_builders as B
from tests.test_conv import _gpu_check

GPU_RTOL = {"fp16": 1e-2, "bf16": 2e-2}


def conv_then_reduce(x=(4, 64, 28, 28), oc: int = 136, op: str = "ReduceMean", seed: int = 0):
    """Conv 3x3 (so the image is channels-last on sm_90's wgmma) → `op` over H and W, keepdims."""
    rng = np.random.default_rng(seed)
    inits = {"w": (rng.standard_normal((oc, x[1], 3, 3)) / math.sqrt(9 * x[1])).astype(np.float32)}
    nodes = [helper.make_node("Conv", ["in0", "w"], ["c"], pads=[1, 1, 1, 1], name="conv"),
             helper.make_node(op, ["c"], ["out"], axes=[2, 3], keepdims=1, name="reduce")]   # opset 13: axes an attribute
    return B._infer_output(B._graph_model(nodes, "gap", {"in0": x}, {}, inits))


def _plan(model, precision="fp16", pin=()):
    return run_pipeline(import_model(model, None), Options("sm_90", load_profile("sm_90"), precision, pin)).plan


def _reduce(plan):
    (k,) = [k for k in plan.kernels if k.family == "row_reduce"]
    return k


def test_channels_last_squeeze_takes_the_cols_pass():
    plan = _plan(conv_then_reduce())
    k = _reduce(plan)
    g = row_cols.geometry(row_reduce.analyze(k), plan.types())
    assert not isinstance(g, str) and g.vec == 8 and g.vcols == 17
    assert k.schedule.param["pass"] == "cols", dict(k.schedule.param)


def test_cols_declined_where_the_row_is_contiguous():
    """An NCHW image (fp32: no wgmma, no layout change) reduces along contiguous rows: not `cols`."""
    plan = _plan(conv_then_reduce(), precision="fp32")
    k = _reduce(plan)
    assert "contiguous" in row_cols.geometry(row_reduce.analyze(k), plan.types())
    assert k.schedule.param["pass"] != "cols"


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not found")
@pytest.mark.parametrize("op", ["ReduceMean", "ReduceMax"])
def test_cols_source_builds_without_spills(op, tmp_path, monkeypatch):
    from aicfc.codegen.module import render_module
    from aicfc.codegen.nvcc import build
    monkeypatch.setenv("AICF_CACHE_DIR", str(tmp_path))
    for lanes, threads in ((1, 128), (4, 256), (16, 1024)):
        plan = _plan(conv_then_reduce(op=op), pin=(("lanes", str(lanes)), ("pass", "cols"), ("threads", str(threads))))
        k = _reduce(plan)
        src = render_module(plan)
        assert "aicf_vload<8, __half>" in src and ("fmaxf(acc[0]" in src) == (op == "ReduceMax")
        b = build(src, "sm_90")
        assert b.spills.get(k.name, 0) == 0, b.spills


@pytest.mark.gpu
@pytest.mark.parametrize("precision", ["fp16", "bf16"])
@pytest.mark.parametrize("op", ["ReduceMean", "ReduceMax"])
@pytest.mark.parametrize("lanes,threads", [(1, 128), (2, 256), (4, 512), (16, 1024), (8, 128)])
def test_gpu_cols(lanes, threads, op, precision, gpu_device):
    model = conv_then_reduce(x=(3, 64, 30, 30), op=op)
    pin = {"pass": "cols", "lanes": lanes, "threads": threads}
    payload = _gpu_check(model, precision, gpu_device, pin) if precision == "fp16" else None
    if payload is None:
        import aicfc
        from aicfc.ir.high import evaluate_graph
        from tests.conftest import run_payload
        from tests.test_pipeline import rel_err
        payload = aicfc.compile(model, target=gpu_device.arch, precision=precision, pin=pin)
        inputs = {"in0": np.random.default_rng(11).standard_normal((3, 64, 30, 30)).astype(np.float32)}
        ref = evaluate_graph(import_model(model, None), inputs, dtype=np.float64)["out"]
        got = run_payload(payload, inputs, gpu_device)["out"]
        assert not np.isnan(got).any() and rel_err(got, ref) <= GPU_RTOL[precision]
    (k,) = [k for k in payload["kernels"] if k["family"] == "row_reduce"]
    assert k["params"]["pass"] == "cols" and k["params"]["lanes"] == lanes
