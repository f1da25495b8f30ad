"""[Note: B resident in shared memory] (codegen/gemm_wgmma.py): where the Hopper GEMM offers B's k-blocks held in
shared memory for a block's whole walk of tiles (BRES), how they are laid out, what the cost model charges, and on
the GPU the numbers against a float64 reference (fp16 and bf16: max|y - ref| / max|ref| <= 1e-2, NaN fails), with
edges in M and N, one and several columns held, ping-pong and cooperative tiles, and a residual copied through the
staging (RS = 1).
"""
from __future__ import annotations

import math
import shutil

import numpy as np
import pytest
from onnx import helper

from aicfc.codegen import gemm_wgmma
from aicfc.frontend.onnx_import import import_model
from aicfc.passes.pipeline import Options, run_pipeline
from aicfc.planner import cost_wgmma
from aicfc.planner.hardware import load_profile
from tests.test_gemm_gpu import _check, _model, gemm_transb_bias_relu, two_inputs_batched

SM90 = load_profile("sm_90")


def _plan(model, pin=None, precision="fp16"):
    graph = import_model(model, None)
    return run_pipeline(graph, Options("sm_90", SM90, precision, pin=tuple((pin or {}).items()))).plan


def _gemm(plan):
    return next(k for k in plan.kernels if k.family == "gemm")


def _space(model):
    plan = _plan(model)
    k = _gemm(plan)
    return k, plan, gemm_wgmma.space(k, plan, "f16", SM90.sm_count, SM90.smem_per_block_optin)


def residual_relu(m, k, n, rng):
    """x·w + b + r, then ReLU: a channels-last 1x1 convolution with its folded BatchNorm and the block's shortcut."""
    nodes = [helper.make_node("MatMul", ["x", "w"], ["mm"]), helper.make_node("Add", ["mm", "b"], ["h"]),
             helper.make_node("Add", ["h", "r"], ["hr"]), helper.make_node("Relu", ["hr"], ["y"])]
    return _model(nodes, [("x", [m, k]), ("r", [m, n])], [m, n],
                  {"w": rng.standard_normal((k, n)).astype(np.float32), "b": rng.standard_normal(n).astype(np.float32)})


def _held(m, k, n, tile):
    """BRES of `tile` on an M x K x N GEMM under sm_90: the columns a block visits times the k-blocks."""
    tiles_m, tiles_n = math.ceil(m / gemm_wgmma.block_m(tile)), math.ceil(n / tile["BN"])
    ctas = min(tiles_m * tiles_n, SM90.sm_count)
    return gemm_wgmma.b_panels(tiles_n, ctas) * math.ceil(k / 64)


def test_columns_a_block_visits():
    assert gemm_wgmma.b_panels(8, 132) == 2      # 132 = 4 (mod 8): columns c and c + 4
    assert gemm_wgmma.b_panels(2, 132) == 1
    assert gemm_wgmma.b_panels(10, 132) == 5
    assert gemm_wgmma.b_panels(4, 132) == 1


def test_offered_unsplit_where_a_block_walks_more_tiles_than_columns():
    """ResNet-50 B32's stage-3 expansion shape: 6272 x 256 -> 1024. Every candidate carries the key (so --pin
    BRES=0 applies); the resident ones are unsplit, unclustered, not stream-k, and hold the columns their block
    visits for every k-block."""
    k, plan, pts = _space(gemm_transb_bias_relu(6272, 256, 1024, np.random.default_rng(0)))
    assert all("BRES" in p for p in pts)
    held = [p for p in pts if p["BRES"]]
    assert held
    for p in held:
        assert p["SPLITK"] == 1 and p["CLUSTER"] == 1 and not p["STREAM"]
        tm, tn, tiles = gemm_wgmma.tiles(k, p)
        panels = gemm_wgmma.b_panels(tn, p["CTAS"])
        assert p["BRES"] == panels * 4 and math.ceil(tiles / p["CTAS"]) > panels
        assert gemm_wgmma.smem_bytes(p) + gemm_wgmma.static_smem(p) <= SM90.smem_per_block_optin
    assert any(p["BN"] == 128 and p["PP"] and p["BRES"] == 8 for p in held)


def test_not_offered_where_tiles_read_different_b():
    """A batched B (each batch its own matrix) changes under a block's walk: never resident."""
    _, _, pts = _space(two_inputs_batched(512, 256, 512, np.random.default_rng(0)))
    assert pts and not any(p.get("BRES") for p in pts)


def test_not_offered_where_no_block_takes_another_tile():
    _, _, pts = _space(gemm_transb_bias_relu(256, 256, 512, np.random.default_rng(0)))
    assert pts and not any(p.get("BRES") for p in pts)


def test_layout_the_ring_holds_a_alone_and_the_slots_follow_the_staging():
    p = {"BM": 64, "BN": 128, "NWG": 2, "PP": 1, "MI": 1, "OUT": 2, "STAGES": 7, "BRES": 8}
    ring = {**p, "BRES": 0}
    assert gemm_wgmma.stage_bytes(p) == 64 * 128 and gemm_wgmma.stage_bytes(ring) == (64 + 128) * 128
    at = gemm_wgmma.resident_at(p)
    assert at % 1024 == 0 and at >= 7 * 64 * 128 + 2 * gemm_wgmma.out_wg_bytes(p)
    assert gemm_wgmma.smem_bytes(p) == at + 8 * 128 * 128 + gemm_wgmma.SMEM_SLACK
    # a fill width: BN·128 bytes a slot is still a multiple of the swizzle's 1024
    assert gemm_wgmma.b_bytes({**p, "BN": 104}) % 1024 == 0


def test_rendered_kernel_loads_b_once_per_column_held():
    from aicfc.codegen.module import render_module
    tile = {"unit": "wgmma", "BN": 128, "PP": 1, "NWG": 2, "MI": 1}
    bres = _held(6272, 256, 1024, tile)
    plan = _plan(gemm_transb_bias_relu(6272, 256, 1024, np.random.default_rng(0)), pin={**tile, "BRES": bres})
    k = _gemm(plan)
    assert k.schedule.param["BRES"] == bres == 8
    src = render_module(plan)
    assert "if (held < 2) {" in src and "(held < 2 ? 16384 : 0)" in src
    assert "% 2) * 4 + kb) * 16384" in src
    # column-fastest: raster groups of one tile row (8 columns of tiles), not GROUP rows
    assert "const int first_m = in / 8 * 1;" in src
    ring = _gemm(_plan(gemm_transb_bias_relu(6272, 256, 1024, np.random.default_rng(0)), pin={**tile, "BRES": 0}))
    assert ring.schedule.param["BRES"] == 0 and ring.schedule.smem_bytes != k.schedule.smem_bytes


def test_cost_charges_b_through_the_l2_for_the_first_tiles_alone():
    """The same tile with B resident and through the ring: B's bytes leave the k-blocks' L2 term (but for the
    first tiles), the DRAM term is the same."""
    model = gemm_transb_bias_relu(6272, 256, 1024, np.random.default_rng(0))
    plan = _plan(model)
    k = _gemm(plan)
    tile = {"unit": "wgmma", "dtype": "f16", "BM": 64, "BN": 128, "BK": 64, "NWG": 2, "PP": 1, "MI": 1, "OUT": 2,
            "TS": 0, "STAGES": 6, "SPLITK": 1, "CLUSTER": 1, "CTAS": 132, "STREAM": 0}
    types = plan.types()
    io = sum(types[b].nbytes for b in {ld.buffer for ld in k.loads()} | set(k.stores))
    ring = cost_wgmma.wgmma_terms(k, {**tile, "BRES": 0}, types, SM90, io, 1.0)
    held = cost_wgmma.wgmma_terms(k, {**tile, "BRES": 8}, types, SM90, io, 1.0)
    assert held["t_l2_us"] < ring["t_l2_us"] and held["t_dram_us"] == ring["t_dram_us"]
    # per k-block: A's 8 KB and, amortized over the block's 6 tiles, 2 of B's 16 KB
    assert held["t_l2_us"] / ring["t_l2_us"] == pytest.approx((64 + 128 * 2 / 6) / (64 + 128), rel=0.02)


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not found")
def test_builds_without_spills(tmp_path, monkeypatch):
    from aicfc.codegen.module import render_module
    from aicfc.codegen.nvcc import build
    monkeypatch.setenv("AICF_CACHE_DIR", str(tmp_path))
    tile = {"unit": "wgmma", "BN": 128, "PP": 1, "NWG": 2, "MI": 1, "RS": 1}
    plan = _plan(residual_relu(6272, 256, 1024, np.random.default_rng(0)),
                 pin={**tile, "BRES": _held(6272, 256, 1024, tile)})
    k = _gemm(plan)
    built = build(render_module(plan), "sm_90")
    assert built.spills.get(k.name, 0) == 0, built.spills


# (builder, M x K x N, tile): two columns held under ping-pong (the stage-3 expansion), edges in M and N with
# cooperative 128-row tiles, one column held (N = BN), a 104-wide fill tile
GPU_CASES = [
    (gemm_transb_bias_relu, (6272, 256, 1024), {"BN": 128, "PP": 1, "NWG": 2, "MI": 1}),
    (gemm_transb_bias_relu, (8000, 192, 1000), {"BN": 128, "PP": 0, "NWG": 2, "MI": 1}),
    (gemm_transb_bias_relu, (9000, 320, 64), {"BN": 64, "PP": 1, "NWG": 2, "MI": 1}),
    (residual_relu, (6272, 256, 1024), {"BN": 128, "PP": 1, "NWG": 2, "MI": 1, "RS": 1}),
    (residual_relu, (40000, 128, 256), {"BN": 256, "PP": 0, "NWG": 2, "MI": 1, "RS": 1}),
]


@pytest.mark.gpu
@pytest.mark.parametrize("precision", ("fp16", "bf16"))
@pytest.mark.parametrize("build,shape,tile", GPU_CASES,
                         ids=[f"{b.__name__}-{'x'.join(map(str, s))}-BN{t['BN']}PP{t['PP']}" for b, s, t in GPU_CASES])
def test_resident_b_matches_float64(build, shape, tile, precision, gpu_device):
    m, k, n = shape
    bres = _held(m, k, n, tile)
    assert bres > 0
    _check(build(m, k, n, np.random.default_rng(11)), precision, {"unit": "wgmma", **tile, "BRES": bres},
           gpu_device, seed=12)
