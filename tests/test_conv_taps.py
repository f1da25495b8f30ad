"""Unit `taps` of the conv family (codegen/conv_taps.py, [Note: taps in registers]): which convolutions
it takes, the planner's choice, the kernel's build (ptxas: registers, no spills), and on a GPU its
results against float64 and onnxruntime."""
from __future__ import annotations

import json
import shutil
import subprocess

import numpy as np
import onnx
import pytest

from aicfc.codegen import conv_taps
from aicfc.frontend.onnx_import import import_model
from aicfc.passes.pipeline import Options, run_pipeline
from aicfc.planner.hardware import load_profile
from tests import onnx_builders as B
from tests.test_pipeline import rel_err


def _plan(model: onnx.ModelProto, precision: str = "fp16", profile: str | None = "h200"):
    hw = load_profile("sm_90", profile)
    return run_pipeline(import_model(model, None), Options("sm_90", hw, precision)).plan


def _conv(plan):
    (k,) = [k for k in plan.kernels if k.family == "conv"]
    return k


def _model(x=(2, 64, 16, 24), w=(64, 64, 3, 3), **kw):
    spec = dict(bn=True, act="relu", pads=[1, 1, 1, 1], follow="pool") | kw
    return B.conv_model(x, w, **spec)


@pytest.mark.parametrize("x,w,kw,why", [
    ((2, 128, 16, 16), (128, 128, 3, 3), {}, "128 channels to 128"),
    ((2, 64, 16, 16), (128, 64, 3, 3), {}, "64 channels to 128"),
    ((2, 64, 16, 16), (64, 64, 3, 3), {"strides": [2, 2]}, "stride"),
    ((2, 64, 12, 16), (64, 64, 3, 3), {}, "whole 8x8 tiles"),
    ((2, 64, 16, 16), (64, 64, 5, 5), {"pads": [2, 2, 2, 2]}, "3x3 window"),
], ids=["c128", "k128", "stride2", "12rows", "5x5"])
def test_taps_declines_what_it_does_not_run(x, w, kw, why):
    plan = _plan(_model(x, w, **kw))
    got = conv_taps.why_not(_conv(plan), plan)
    assert got is not None and why in got, got
    assert _conv(plan).schedule.param["unit"] != "taps"


def test_taps_is_picked_for_resnet_stage1_3x3_at_b32():
    """ResNet-50 B32's stage-1 3x3: predicted under the im2col kernel's time, so picked by cost; the
    prediction is the prototype's fit (15.0 us measured, benchmarks/results/conv_halo_rs_session30_h200.txt)."""
    plan = _plan(_model((32, 64, 56, 56)))
    k = _conv(plan)
    assert conv_taps.why_not(k, plan) is None
    # (TL: its entry's trigger as its blocks exit, passes/late_trigger.py, not a key of its schedule)
    assert {key: v for key, v in k.schedule.param.items() if key != "TL"} == {"unit": "taps", "dtype": "f16", "NCONS": 3,
                                                                                "CTAS": 132}
    assert 14.0 < k.schedule.time_us < 16.0
    beaten = [c.predicted_time_us for c in k.schedule.candidates if c.predicted_time_us and dict(c.params).get("unit") == "wgmma"]
    assert beaten and min(beaten) > k.schedule.time_us
    assert conv_taps.tiles(k, plan.types()) == 32 * 7 * 7


def test_taps_maps_are_the_image_tile_the_filter_and_the_output_tile():
    plan = _plan(_model((2, 64, 16, 24)), precision="bf16")
    k = _conv(plan)
    maps = conv_taps.tensor_maps(k, dict(unit="taps", dtype="bf16", NCONS=3, CTAS=12), plan.types())
    assert [m.box for m in maps] == [(64, 10, 10, 1), (64, 64), (64, 8, 8, 1)]
    assert all(m.swizzle == 128 and m.problems() is None for m in maps)
    assert maps[0].dims == (64, 24, 16, 2) and maps[2].dims == (64, 24, 16, 2)


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not found")
@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_taps_kernel_builds_without_spills(tmp_path, precision):
    """The compiled bundle's taps kernel: ptxas fits it in the 128 registers of 512 threads."""
    (k,) = [k for k in built_kernels(tmp_path, _model((2, 64, 16, 24)), precision, "--pin", "unit=taps")
             if k["family"] == "conv"]
    assert k["params"]["unit"] == "taps" and k["registers_source"] == "ptxas" and k["registers"] <= 128
    assert not k.get("spills")


@pytest.mark.gpu
@pytest.mark.parametrize("precision", ["fp16", "bf16"])
@pytest.mark.parametrize("x,act", [((2, 64, 16, 24), "relu"), ((3, 64, 8, 8), None), ((4, 64, 56, 56), "relu")],
                         ids=["2x16x24", "3x8x8_bias", "4x56x56"])
def test_gpu_taps(x, act, precision, gpu_device):
    """Fresh random inputs against float64: every tile edge (zeros outside the image), several images,
    a lone tile an image. (At one 56x56 image the layout pass keeps this test's pooled output NCHW, which the
    unit declines: the tests pin only what it takes.)"""
    import aicfc
    model = _model(x, bn=act is not None, act=act)
    payload = aicfc.compile(model, target=gpu_device.arch, precision=precision, pin={"unit": "taps"})
    assert [k["params"]["unit"] for k in payload["kernels"] if k["family"] == "conv"] == ["taps"]
    check_gpu(model, payload, gpu_device, precision)


@pytest.mark.gpu
def test_gpu_taps_resnet_stage_against_onnxruntime(gpu_device):
    """Two ResNet-50 stage-1 bottlenecks (both 3x3s on taps by cost at this size, the residual adds in the 1x1s
    after them) against onnxruntime."""
    import aicfc
    model = B.resnet_stage_model((8, 64, 56, 56), mid=64, out=256, stride=1, stem=False)
    payload = aicfc.compile(model, target=gpu_device.arch, precision="fp16", pin={})
    assert [k["params"]["unit"] for k in payload["kernels"] if k["family"] == "conv"] == ["taps", "taps"]
    check_gpu(model, payload, gpu_device, "fp16", onnxruntime=True)


def check_gpu(model: onnx.ModelProto, payload: dict, device, precision: str, onnxruntime: bool = False) -> None:
    """Run `payload` on fresh random inputs and compare every output with float64 (the graph evaluated here)
    or onnxruntime, within test_conv_wgmma's tolerance for the precision; NaN fails."""
    from tests.conftest import run_payload
    graph = import_model(model, None)
    inputs = _random_inputs(graph, np.random.default_rng())
    _compare(run_payload(payload, inputs, device), _want(model, graph, inputs, onnxruntime), precision)


def check_gpu_runs(model: onnx.ModelProto, payload: dict, device, precision: str, runs: int = 5,
                   onnxruntime: bool = False) -> None:
    """`payload` loaded once and run `runs` times on fresh random inputs in one executor (its buffers, rings and
    barriers reused from run to run), each run compared as `check_gpu` compares."""
    from aicf_run.bundle import Bundle
    from aicf_run.executor import Executor
    graph = import_model(model, None)
    rng = np.random.default_rng()
    ex = Executor(Bundle.from_payload(payload), device)
    try:
        for _ in range(runs):
            inputs = _random_inputs(graph, rng)
            _compare(ex.run(inputs), _want(model, graph, inputs, onnxruntime), precision)
    finally:
        ex.close()


def _random_inputs(graph, rng: np.random.Generator) -> dict[str, np.ndarray]:
    return {v.name: rng.standard_normal(v.type.shape).astype(np.float32) for v in graph.inputs}


def _want(model: onnx.ModelProto, graph, inputs: dict, onnxruntime: bool) -> dict:
    from aicfc.ir.high import evaluate_graph
    return B.run_onnxruntime(model, inputs) if onnxruntime else evaluate_graph(graph, inputs, dtype=np.float64)


def _compare(got: dict, want: dict, precision: str) -> None:
    from tests.test_conv_wgmma import GPU_RTOL
    for name, r in want.items():
        assert not np.isnan(got[name]).any(), f"{name}: NaN"
        assert rel_err(got[name], r) <= GPU_RTOL[precision], f"{precision}: {name} rel err {rel_err(got[name], r):.2e}"


def built_kernels(tmp_path, model: onnx.ModelProto, precision: str, *options: str) -> list[dict]:
    """The kernels of `model` compiled by the CLI (nvcc and ptxas run) at `precision` with `options`, as
    `aicfc explain --json` lists them (registers and spills from ptxas)."""
    src = tmp_path / "m.onnx"
    onnx.save(model, str(src))
    out = tmp_path / "m.aicf"
    subprocess.run(["aicfc", "compile", str(src), "-o", str(out), "--precision", precision, *options],
                   check=True, capture_output=True)
    return json.loads(subprocess.run(["aicfc", "explain", "--json", str(out)], check=True,
                                     capture_output=True, text=True).stdout)["kernels"]
