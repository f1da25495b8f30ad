"""The fp32 SIMT GEMM schedule: its parameter space, the shared-memory traffic the cost model
reads off the template's addressing, and that tiles build without spills (nvcc, no GPU)."""
from __future__ import annotations

import numpy as np
import pytest

from aicfc.codegen import gemm
from aicfc.codegen.module import render_module
from aicfc.codegen.nvcc import build
from aicfc.frontend.onnx_import import import_model
from aicfc.passes.pipeline import Options, run_pipeline
from aicfc.planner.cost import estimate_registers
from aicfc.planner.hardware import load_profile
from tests.test_gemm_gpu import SIMT_TILES, a_transposed, gemm_transb_bias_relu, matmul


def simt(**p) -> dict:
    return {"unit": "simt", **p}


def plan_of(model, pin=None):
    prof = load_profile("sm_90", None)
    return run_pipeline(import_model(model, None), Options("sm_90", prof, "fp32", pin=tuple((pin or {}).items()))).plan


def test_space_bounds_the_registers_staged_for_the_next_step():
    space = gemm.simt_space()
    assert space and all(sum(gemm.prefetch(p)) <= gemm.PREFETCH_MAX for p in space)
    assert simt(BM=128, BN=32, BK=32, TM=8, TN=8) not in space          # 64 + 16 elements on 64 threads
    assert len(gemm.simt_space(prefetched=False)) > len(space)          # the implicit GEMM keeps them


def test_vector_widths_and_prefetch():
    p = simt(BM=64, BN=32, BK=16, TM=8, TN=2)
    assert gemm.vectors(p) == (4, 2)
    assert gemm.threads(p) == 128 and gemm.prefetch(p) == (8, 4)
    assert gemm.prefetch(simt(BM=16, BN=64, BK=8, TM=1, TN=2)) == (1, 1)   # 128 elements on 512 threads


def test_fragment_reads_count_distinct_words_per_bank():
    # float4 reads go half a warp at a time, quarters not broadcast to each other: A (each half
    # one row, 16 B a quarter) 1 wavefront a half; B (16 thread columns: 128 B a quarter) 2 a half
    read, _ = gemm.smem_traffic(simt(BM=128, BN=128, BK=8, TM=8, TN=8), True, False)
    assert read == 8 * (2 * 2 + 2 * 4)
    # Nsight Compute on an H200 (2048^3, BK=16): 8 wavefronts per k for 8x4 thread tiles, 10 for 4x8
    for bm, bn in ((128, 64), (64, 128)):
        assert gemm.smem_traffic(simt(BM=bm, BN=bn, BK=16, TM=8, TN=4), True, False)[0] == 16 * 8
        assert gemm.smem_traffic(simt(BM=bm, BN=bn, BK=16, TM=4, TN=8), True, False)[0] == 16 * 10
    # scalar reads, one column per lane and a broadcast row: one wavefront each
    read, _ = gemm.smem_traffic(simt(BM=16, BN=32, BK=8, TM=1, TN=1), True, False)
    assert read == 8 * 2


def test_transposed_stores_conflict_by_the_padding():
    p = simt(BM=64, BN=64, BK=32, TM=4, TN=4)      # 256 threads, 8 elements of A each
    _, k_fast = gemm.smem_traffic(p, True, False)
    _, m_fast = gemm.smem_traffic(p, False, False)
    assert m_fast == 8 + 8                          # along the row: conflict-free
    assert k_fast == 8 * 4 + 8                      # rows of 64+4 words: 32 k values on 8 bank groups


def test_cost_counts_the_instructions_beside_the_fmas():
    plan = plan_of(matmul(512, 512, 512, np.random.default_rng(0)), {"unit": "simt", "BM": "128", "BN": "128",
                                                                     "BK": "8", "TM": "8", "TN": "8"})
    k = plan.kernels[0]
    terms = dict(k.schedule.predicted)
    # 512 FMAs, 32 vector loads, 8 staged elements, the step's overhead
    assert terms["issue_eff"] == pytest.approx(512 / (512 + 32 + 4 * 8 + 16), rel=1e-5)
    assert estimate_registers(k, k.schedule.param) == 12 + 55 + 48 + 32 + 1


BUILDS = [(matmul, (77, 129, 65)), (a_transposed, (77, 129, 65)), (gemm_transb_bias_relu, (300, 200, 260))]


@pytest.mark.parametrize("build_model,shape", BUILDS, ids=[f.__name__ for f, _ in BUILDS])
def test_tiles_build_without_spills(build_model, shape):
    model = build_model(*shape, np.random.default_rng(1))
    for tile in SIMT_TILES:
        plan = plan_of(model, {"unit": "simt", **{k: str(v) for k, v in tile.items()}})
        k = [k for k in plan.kernels if k.family == "gemm"][0]
        built = build(render_module(plan), "sm_90")
        assert built.spills.get(k.name, 0) == 0, f"{tile}: {built.spills}"
        assert 0 < built.registers[k.name] <= 255


def test_a_warp_of_many_fma_chains_fills_its_scheduler():
    """128x768x768 on an H200 (aicfc tune): 4 warps per block of 4x2 thread tiles measured
    17.8 us, 16 warps of 2x1 19.4 us, on the same 96 blocks; the model must not rank the fat
    threads behind (it once predicted them 1.8x slower)."""
    from aicfc.passes.plan_schedules import rank
    plan = plan_of(matmul(128, 768, 768, np.random.default_rng(0)))
    k = plan.kernels[0]
    ranked, _ = rank(k, plan, load_profile("sm_90", None))
    at = {tuple(sorted(r.params.items())): r.time_us for r in ranked}
    fat = at[tuple(sorted(simt(BM=64, BN=16, BK=16, TM=4, TN=2).items()))]
    thin = at[tuple(sorted(simt(BM=32, BN=32, BK=32, TM=2, TN=1).items()))]
    assert fat <= thin
