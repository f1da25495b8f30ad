"""The thin GEMM unit (codegen/gemm_thin.py, [Note: thin GEMMs]): which contractions it takes, that
its kernels build without spills, and on the GPU that it matches float64 numpy on fresh random
inputs (rows that do not fill a slab, K not a multiple of 16, several column chunks, batch
variables, bias + ReLU and a residual in the epilogue)."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper

import aicfc
from aicfc.codegen import gemm_thin
from tests.test_conv_taps import built_kernels
from tests.test_gemm_gpu import _check, _model, broadcast_batch, gemm_transb_bias_relu, matmul


def matmul_clip(m, k, n, rng):
    """x @ w + b, then ReLU6 (Clip 0..6): a MobileNetV2 expansion's epilogue. The weight is scaled by
    1/sqrt(k), as a trained layer's, so that the clip cuts the tails only: unscaled, it would cap
    max|y| at 6 while the products' rounding grows with sqrt(k) (bf16 then misses 1e-2 of the max)."""
    return _model([helper.make_node("MatMul", ["x", "w"], ["mm"]), helper.make_node("Add", ["mm", "b"], ["ab"]),
                   helper.make_node("Clip", ["ab", "lo", "hi"], ["y"])], [("x", [m, k])], [m, n],
                  {"w": (rng.standard_normal((k, n)) / np.sqrt(k)).astype(np.float32),
                   "b": rng.standard_normal(n).astype(np.float32),
                   "lo": np.array(0.0, np.float32), "hi": np.array(6.0, np.float32)})


def matmul_residual(m, k, n, rng):
    """x @ w + z, z a second input of the output's shape."""
    return _model([helper.make_node("MatMul", ["x", "w"], ["mm"]), helper.make_node("Add", ["mm", "z"], ["y"])],
                  [("x", [m, k]), ("z", [m, n])], [m, n], {"w": rng.standard_normal((k, n)).astype(np.float32)})


def _kernel(payload):
    (k,) = [k for k in payload["kernels"] if k["family"] == "gemm"]
    return k


def test_taken_where_k_is_short_and_the_output_wide():
    """MobileNetV2's first expansion (16 -> 96 channels over 32 x 112 x 112 pixels) plans on thin by cost at fp16;
    the candidates and the declines say why elsewhere."""
    payload = aicfc.compile(matmul_clip(401408, 16, 96, np.random.default_rng(0)), target="sm_90", precision="fp16")
    k = _kernel(payload)
    assert k["params"]["unit"] == "thin" and k["params"]["NCH"] * k["params"]["BNW"] == 96
    assert "warp_slabs" in k["predicted"]


@pytest.mark.parametrize("build,shape,precision,why", [
    (matmul, (256, 128, 96), "fp16", "at most 96"),
    (matmul, (256, 16, 40), "fp16", "chunks of 16 columns"),
    (matmul, (256, 32, 16), "fp16", "narrower than K"),
    (matmul, (256, 16, 96), "tf32", "fp16/bf16"),
    (matmul, (256, 18, 96), "fp16", "contiguous along k"),
])
def test_declined_with_the_reason(build, shape, precision, why):
    from aicfc.codegen.gemm_mma import mma_type
    from aicfc.frontend.onnx_import import import_model
    from aicfc.passes.pipeline import Options, run_pipeline
    from aicfc.planner.hardware import load_profile
    plan = run_pipeline(import_model(build(*shape, np.random.default_rng(1))),
                        Options("sm_90", load_profile("sm_90"), precision, ())).plan
    (k,) = [k for k in plan.kernels if k.family == "gemm"]
    reason = gemm_thin.why_not(k, plan, mma_type(k, plan.types(), precision))
    assert reason and why in reason, reason


def test_space_keeps_a_warp_on_one_chunk():
    """Every candidate's block is whole column chunks (NCH x RW warps), so a warp keeps its chunk's
    weight in registers over the grid-stride loop, and fits the register bound."""
    for p in gemm_thin.space(401408, 384, 64, 132):
        assert p["NCH"] * p["BNW"] == 384 and gemm_thin.threads(p) == 32 * p["NCH"] * p["RW"]
        assert gemm_thin.held(64, p["BNW"]) <= gemm_thin.MAX_HELD


@pytest.mark.parametrize("shape,pin", [((4096, 16, 96), {}), ((2048, 32, 192), {"BNW": 96}),
                                       ((1024, 64, 384), {"BNW": 64}), ((1024, 96, 96), {})])
def test_builds_without_spills(tmp_path, shape, pin):
    if not __import__("shutil").which("nvcc"):
        pytest.skip("nvcc is not installed")
    opts = ["--pin", "unit=thin"] + [x for key, v in pin.items() for x in ("--pin", f"{key}={v}")]
    (k,) = [k for k in built_kernels(tmp_path, matmul_clip(*shape, np.random.default_rng(2)), "fp16", *opts)
            if k["family"] == "gemm"]
    assert k["params"]["unit"] == "thin" and k["registers_source"] == "ptxas"
    assert k["registers"] <= 255


GPU_CASES = [(matmul, (1000, 16, 96)), (matmul_clip, (333, 24, 144)), (gemm_transb_bias_relu, (257, 32, 192)),
             (matmul_clip, (96, 64, 384)), (broadcast_batch, (75, 40, 48)), (matmul_residual, (300, 16, 64)),
             (matmul, (50, 96, 96))]


@pytest.mark.gpu
@pytest.mark.parametrize("precision", ["fp16", "bf16"])
@pytest.mark.parametrize("build,shape", GPU_CASES, ids=[f"{f.__name__}-{'x'.join(map(str, s))}" for f, s in GPU_CASES])
def test_gpu_thin(build, shape, precision, gpu_device):
    model = build(*shape, np.random.default_rng(sum(shape)))
    onnx.checker.check_model(model)
    _check(model, precision, {"unit": "thin"}, gpu_device, seed=sum(shape) + 3)


@pytest.mark.gpu
@pytest.mark.parametrize("pin", [{"BNW": 16}, {"BNW": 48, "RW": 1}, {"BNW": 144, "OCC": 1}])
def test_gpu_thin_chunks(pin, gpu_device):
    model = matmul_clip(777, 16, 144, np.random.default_rng(9))
    _check(model, "fp16", {"unit": "thin", **pin}, gpu_device, seed=10)
