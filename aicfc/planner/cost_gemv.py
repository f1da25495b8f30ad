"""Cost terms of the `gemv` unit (codegen/gemm_gemv.py): a weight stream limited by the bytes
each SM keeps in flight, quantised by the blocks an SM gets, plus the tails a block runs after
its last load.

    t = launch + GEMV_LATENCY_US + max(t_dram, t_sm, t_fma) + t_reduce + t_split

    t_dram   = every byte once (weight, activations, epilogue operands, output)
               / (dram_bandwidth · eff.dram)
    t_sm     = q · block_bytes / r_sm                       the busiest SM's share of the weight
               q        = ceil(blocks / SMs)                blocks the busiest SM runs (waves
                                                            quantised: 133 blocks put 2 on one SM)
               r_sm     = min(GEMV_SM_GBS, resident · inflight / GEMV_LATENCY_US)   Little's law
               resident = min(q, blocks_per_sm)              blocks an SM holds at once
               inflight = threads · 2·U·SEG · 16 bytes       (a thread's two register buffers:
                          the step it adds and the next one loading), at most the block's bytes
    t_fma    = q · block FMAs (M per weight element, plus its conversion) / (an SM's fp32 rate)
    t_reduce = GEMV_REDUCE_US                               shuffles, one barrier, the warps'
                                                            ordered adds, the epilogue's stores
    t_split  = GEMV_SPLIT_US + SPLITK · BM · BN · 4 / r_l2  (SPLITK > 1) partial rows to L2, a
               fence and a ticket, and the last block reading every split's rows back at one
               SM's L2 rate r_l2 = GEMV_SM_GBS

Numbers the stream needs (Little's law): 4.25 TB/s measured copy bandwidth (H200) over 132 SMs
is 32 GB/s an SM; at about 0.7 us a loaded DRAM round trip that is 22 KB in flight on every SM.
A block of 8 warps with U = 8 keeps 256 · 2 · 8 · 16 B = 64 KB in flight, so one such block per
SM saturates an SM's share; with 4 warps and U = 4, 16 KB, and two blocks per SM are needed.
The constants are starting values to refit from `benchmarks/gemv.py --json` (it prints every
term beside the measured time).
"""
from __future__ import annotations

import math
from typing import Mapping

from aicfc.codegen import gemm_gemv

GEMV_LATENCY_US = 0.7    # a DRAM load's round trip while the stream runs (first request to first add)
GEMV_SM_GBS = 100.0      # the most one SM's loads take (its L1 to L2 path, 64 B a clock at 1.6-2 GHz)
GEMV_REDUCE_US = 0.3     # after the last add: shuffles, barrier, warps' ordered adds, epilogue and stores
GEMV_SPLIT_US = 1.2      # split-k: partial rows to L2, fence, ticket, a second barrier: ~2 L2 round trips


def gemv_terms(p: Mapping, m: int, n: int, kk: int, esize: int, io_bytes: float, *, sm_count: int,
               bps: int, dram_gbs: float, fp32_tflops: float) -> dict[str, float]:
    """The terms above (us), and `time_us` without the launch overhead. `dram_gbs` is the
    profile's bandwidth times its efficiency; `fp32_tflops` likewise (an FMA counts as two)."""
    ln, rw, seg = gemm_gemv.lanes(p["BN"])
    tiles = math.ceil(n / p["BN"])
    blocks = tiles * p["SPLITK"]
    kper = min(kk, gemm_gemv.k_per_split(kk, p))
    block_bytes = kper * min(p["BN"], n) * esize
    threads = gemm_gemv.threads(p)
    inflight = min(block_bytes, threads * 2 * p["U"] * seg * 16)
    q = math.ceil(blocks / sm_count)
    resident = max(1, min(q, bps))
    r_sm = min(GEMV_SM_GBS, resident * inflight / GEMV_LATENCY_US / 1e3)        # GB/s
    t_dram = io_bytes / (dram_gbs * 1e3)
    t_sm = q * block_bytes / (r_sm * 1e3)
    # fp32 FMAs: M per weight element and one for its conversion, at an SM's share of the peak
    t_fma = q * kper * min(p["BN"], n) * (m + 0.5) * 2 / (fp32_tflops * 1e6 / sm_count)
    t_split = 0.0
    if p["SPLITK"] > 1:
        t_split = GEMV_SPLIT_US + p["SPLITK"] * p["BM"] * p["BN"] * 4 / (GEMV_SM_GBS * 1e3)
    time = GEMV_LATENCY_US + max(t_dram, t_sm, t_fma) + GEMV_REDUCE_US + t_split
    return {"time_us": time, "t_dram_us": t_dram, "t_sm_us": t_sm, "t_fma_us": t_fma, "t_split_us": t_split,
            "t_latency_us": GEMV_LATENCY_US, "t_pipeline_us": GEMV_LATENCY_US + GEMV_REDUCE_US + t_split,
            "t_compute_us": t_fma, "t_smem_us": 0.0, "t_reduce_us": GEMV_REDUCE_US, "sm_gbs": r_sm,
            "inflight_per_sm": resident * inflight, "blocks": blocks, "blocks_busiest_sm": q,
            "blocks_per_sm": bps}
