"""CLUSTER = 2 in the Hopper GEMM engine: two CTAs per thread-block cluster on a pair of tiles that
share B's box, which they load half each with TMA multicast (codegen/gemm_wgmma.py, its module note).

On the CPU: the space (never with split-k), the tensor maps (a K-major B in two half boxes), nvcc for
sm_90a (no spills, no local memory; SASS with HGMMA and multicast UTMALDG), and what the cost model
picks. On the GPU (marked gpu): numbers against float64 with CLUSTER = 2 pinned, on the BERT shapes,
an odd number of tile rows (the pair's second tile past M), M = 1 (every pair has one), both operand
layouts of B and batches. Tolerance on max|y - ref| / max|ref|: tf32 1e-3, fp16 and bf16 1e-2.
"""
from __future__ import annotations

import shutil
import subprocess

import numpy as np
import pytest

from aicfc.codegen import gemm_wgmma
from aicfc.codegen.tma import tensor_maps
from aicfc.errors import AicfError
from aicfc.frontend.onnx_import import import_model
from aicfc.passes.pipeline import Options, run_pipeline
from aicfc.planner.hardware import load_profile
from tests.test_gemm_gpu import (_check, b_transposed_input, broadcast_batch, gemm_transb_bias_relu, matmul,
                                 two_inputs_batched)


def _plan(model, precision="fp16", pin=None):
    graph = import_model(model, None)
    return run_pipeline(graph, Options("sm_90", load_profile("sm_90"), precision,
                                       pin=tuple((k, str(v)) for k, v in (pin or {}).items()))).plan


def _gemm(plan):
    return next(k for k in plan.kernels if k.family == "gemm")


def _space(model, precision="f16"):
    plan = _plan(model)
    hw = load_profile("sm_90")
    return gemm_wgmma.space(_gemm(plan), plan, precision, hw.sm_count, hw.smem_per_block_optin)


def test_cluster_points_never_split_k_and_launch_whole_clusters():
    pts = _space(matmul(128, 3072, 768, np.random.default_rng(0)))
    assert {p["CLUSTER"] for p in pts} == {1, 2}
    assert all(p["SPLITK"] == 1 for p in pts if p["CLUSTER"] == 2)
    assert any(p["SPLITK"] > 1 for p in pts)
    for p in (p for p in _space(matmul(300, 200, 520, np.random.default_rng(0))) if p["CLUSTER"] == 2):
        assert p["CTAS"] % 2 == 0 and p["CTAS"] <= 132
        pairs = -(-(-(-300 // p["BM"])) // 2) * -(-520 // p["BN"])
        assert p["CTAS"] == 2 * min(pairs, 66)


def test_split_k_with_clusters_is_refused_by_pin():
    with pytest.raises(AicfError, match="--pin"):
        _plan(matmul(128, 3072, 768, np.random.default_rng(0)), pin={"unit": "wgmma", "CLUSTER": 2, "SPLITK": 4})


def test_k_major_b_is_two_half_boxes_under_clusters():
    """B read through a Transpose of an input is K-major: its BN rows are loaded as two boxes of BN/2,
    one per CTA; an N-major B keeps its 64-column boxes (they alternate between the CTAs)."""
    base = {"unit": "wgmma", "BN": 128, "MI": 1, "NWG": 2, "PP": 0}
    maps = {}
    for cl in (1, 2):
        plan = _plan(b_transposed_input(300, 256, 192, np.random.default_rng(0)), pin={**base, "CLUSTER": cl})
        maps[cl] = tensor_maps(_gemm(plan), None, plan.types())[1]
    assert maps[1].box == (64, 128) and maps[2].box == (64, 64)
    assert maps[2].dims == maps[1].dims and maps[2].problems() is None
    plan = _plan(matmul(300, 256, 192, np.random.default_rng(0)), pin={**base, "CLUSTER": 2})
    assert tensor_maps(_gemm(plan), None, plan.types())[1].box == (64, 64)


def test_explain_shows_cluster_in_every_wgmma_point():
    plan = _plan(matmul(4096, 768, 768, np.random.default_rng(0)), pin={"unit": "wgmma"})
    k = _gemm(plan)
    assert "CLUSTER" in k.schedule.param


def test_misaligned_shapes_stay_off_the_engine_with_clusters_too():
    """7x100x257 (K = 100 halves: a 200-byte row, no TMA stride) never reaches wgmma, so neither CLUSTER."""
    from aicfc.codegen import gemm
    plan = _plan(matmul(7, 100, 257, np.random.default_rng(0)), pin={"CLUSTER": 2})   # no candidate has the key
    k = _gemm(plan)
    assert k.schedule.param["unit"] != "wgmma"
    assert "multiple of 16" in dict((p["unit"], why) for p, why in gemm.declined(k, plan))["wgmma"]


# ------------------------------------------------------------------ nvcc (no GPU)

CUOBJDUMP = shutil.which("cuobjdump")
NVCC_CASES = [("fp16", matmul, (4096, 768, 768), {"BN": 192, "NWG": 2, "MI": 1, "PP": 0}),
              ("fp16", matmul, (300, 200, 520), {"PP": 1}),                     # 5 tile rows of 64: a ghost tile
              ("bf16", gemm_transb_bias_relu, (300, 256, 192), {"BN": 128}),
              ("bf16", b_transposed_input, (300, 256, 192), {"BN": 192}),      # K-major B in half boxes
              ("tf32", matmul, (300, 256, 192), {}),
              ("fp16", broadcast_batch, (128, 128, 64), {})]


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not found")
@pytest.mark.parametrize("precision,build,shape,pin", NVCC_CASES,
                         ids=[f"{c[0]}-{c[1].__name__}-{'x'.join(map(str, c[2]))}" for c in NVCC_CASES])
def test_cluster_kernels_build_without_spills(precision, build, shape, pin, tmp_path, monkeypatch):
    from aicfc.codegen.module import render_module
    from aicfc.codegen.nvcc import build as nvcc_build
    monkeypatch.setenv("AICF_CACHE_DIR", str(tmp_path))
    plan = _plan(build(*shape, np.random.default_rng(0)), precision, pin={"unit": "wgmma", "CLUSTER": 2, **pin})
    k = _gemm(plan)
    assert k.schedule.param["CLUSTER"] == 2
    src = render_module(plan)
    assert "__cluster_dims__(2, 1, 1)" in src and ".multicast::cluster" in src
    built = nvcc_build(src, "sm_90")
    assert built.spills.get(k.name, 0) == 0, built.spills
    if CUOBJDUMP is None:
        pytest.skip("cuobjdump not found: SASS not checked")
    cubin = tmp_path / "k.cubin"
    cubin.write_bytes(built.cubin)
    sass = subprocess.run([CUOBJDUMP, "-sass", str(cubin)], capture_output=True, text=True).stdout
    assert "HGMMA" in sass and "UTMALDG" in sass and ".MULTICAST" in sass
    assert "UCGABAR_ARV" in sass and "UCGABAR_WAIT" in sass        # the cluster barriers
    assert not any(f" {op}" in sass for op in ("LDL", "STL"))


# ------------------------------------------------------------------ on the GPU

GPU_CASES = [(matmul, (4096, 768, 768)), (matmul, (4096, 3072, 768)), (matmul, (300, 200, 520)),
             (matmul, (1, 4096, 50257)), (gemm_transb_bias_relu, (300, 256, 192)),
             (b_transposed_input, (300, 256, 192)), (broadcast_batch, (72, 136, 88)),
             (two_inputs_batched, (128, 256, 192))]


@pytest.mark.gpu
@pytest.mark.parametrize("precision", ("fp16", "bf16"))
@pytest.mark.parametrize("build,shape", GPU_CASES, ids=[f"{f.__name__}-{'x'.join(map(str, s))}" for f, s in GPU_CASES])
def test_cluster_gemm(build, shape, precision, gpu_device):
    model = build(*shape, np.random.default_rng(sum(shape)))
    _check(model, precision, {"unit": "wgmma", "CLUSTER": 2}, gpu_device, seed=sum(shape) + 3)


@pytest.mark.gpu
@pytest.mark.parametrize("build,shape", [(matmul, (300, 256, 192)), (gemm_transb_bias_relu, (4096, 768, 768)),
                                         (broadcast_batch, (72, 136, 88))], ids=["matmul", "transb", "batch"])
def test_cluster_tf32(build, shape, gpu_device):
    _check(build(*shape, np.random.default_rng(7)), "tf32", {"unit": "wgmma", "CLUSTER": 2}, gpu_device, seed=9)


# every tile family point: both CTAs' rings in step through ping-pong turns, one-box B (BN = 64: CTA 0
# alone issues it), three-box B (BN = 192: CTA 0 two, CTA 1 one), odd tile rows (300 = 5 x 64, 3 x 128)
CLUSTER_TILES = [{"NWG": nwg, "PP": pp, "MI": mi, "BN": bn} for nwg, pp in ((1, 0), (2, 0), (2, 1)) for mi in (1, 2)
                 for bn in (64, 128, 192, 256) if mi * bn <= 256]


@pytest.mark.gpu
@pytest.mark.parametrize("tile", CLUSTER_TILES, ids=lambda t: "NWG{NWG}PP{PP}MI{MI}BN{BN}".format(**t))
def test_cluster_tiles(tile, gpu_device):
    _check(matmul(300, 520, 392, np.random.default_rng(5)), "fp16", {"unit": "wgmma", "CLUSTER": 2, **tile},
           gpu_device, seed=6)
