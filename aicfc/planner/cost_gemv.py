"""Cost terms of the `gemv` unit (codegen/gemm_gemv.py): a weight stream limited by the bytes
each SM keeps in flight, quantised by the blocks an SM gets, plus the tails a block runs after
its last load.

    t = launch + max(t_dram, t_sm, t_fma) + t_exposed + t_reduce + t_split

    (the first load's round trip is not added: it lies inside the profile's launch overhead,
    1.5 us on sm_90 (2.0 before session 10), where a kernel that loads and stores a few bytes
    measured 1.1 us back to back in a graph on an H200, benchmarks/results/generate_h200.txt;
    the other gemm units' costs leave it there too)

    t_dram   = every byte once (weight, activations, epilogue operands, output)
               / (dram_bandwidth · gemv_read_eff)       a read stream: no write turnarounds,
                                                         so above the profile's eff.dram (a
                                                         copy's, reads and writes mixed)
    t_sm     = q · block_bytes / r_sm                       the busiest SM's share of the weight
               q        = ceil(blocks / SMs)                blocks the busiest SM runs (waves
                                                            quantised: 133 blocks put 2 on one SM)
               r_sm     = min(gemv_sm_gbs, resident · inflight / gemv_latency_us)   Little's law
               resident = min(q, blocks_per_sm)              blocks an SM holds at once
               inflight = threads · U·SEG · 16 bytes         one step of a thread's loads (the
                          SASS reuses a buffer's registers as soon as it is added, so about one
                          step is in flight), at most the block's bytes
    t_fma    = q · block FMAs (M per weight element, plus its conversion) / (an SM's fp32 rate)
    t_exposed = t_fma · max(0, 1 - resident·WARPS / gemv_hiding_warps)   the FMAs not hidden
               under loads when few warps are resident (8 rows: 181 registers, one block an SM)
    t_reduce = gemv_reduce_us                               shuffles, one barrier, the warps'
                                                            ordered adds, the epilogue's stores
    t_split  = gemv_split_us + SPLITK · BM · BN · 4 / r_l2  (SPLITK > 1, CL = 0) partial rows to
               L2, a fence and a ticket, and the last block reading every split's rows back
               at one SM's L2 rate r_l2 = gemv_sm_gbs
             = gemv_cluster_us + SPLITK · BM · BN · 4 / r_l2  (CL = 1) two cluster barriers, rank
               0 reading the others' sums from their shared memory

Numbers the stream needs (Little's law): 4.25 TB/s measured copy bandwidth (H200) over 132 SMs
is 32 GB/s an SM; at about 1 us a loaded DRAM round trip that is 32 KB in flight on every SM.
A block of 8 warps with U = 8 keeps 256 · 8 · 16 B = 32 KB in flight, so one such block per SM
takes an SM's share; with 4 warps and U = 4, 8 KB, and four blocks per SM are needed.
Measured (benchmarks/results/gemv_h100.txt, H100, 70 candidates of 10 decode shapes): with
one step in flight and a 1.0 us round trip, the M = 1 picks land within 10% of the fastest
candidate measured (gate/up: 4 warps x U = 4 ran 24.5 us, 8 x 8 17.7 us, as Little's law says);
the M = 8 predictions are 0.8-2.1x off and their picks 15-40% from the best (no fit of these
terms got more than 6 of the 10 picks within 10%): the M = 8 kernel itself is the problem.
The constants are hand-set from that run, not a least-squares fit; a profile may set each
(`gemv_latency_us`, `gemv_sm_gbs`, `gemv_reduce_us`, `gemv_split_us`, `gemv_cluster_us`,
`gemv_read_eff`, `gemv_hiding_warps`), and `benchmarks/gemv.py --json` prints every term beside
the measured time of every candidate it runs, which is what refitting them needs.
"""
from __future__ import annotations

import math
from typing import Mapping

from aicfc.codegen import gemm_gemv

CONSTANTS = {
    "gemv_latency_us": 1.0,   # a DRAM load's round trip while the stream runs (Little's law)
    "gemv_sm_gbs": 60.0,      # the most one SM's loads draw from DRAM however many are in flight
    "gemv_reduce_us": 0.3,    # after the last add: shuffles, barrier, warps' ordered adds, epilogue, stores
    "gemv_split_us": 1.2,     # split-k: partial rows to L2, fence, ticket, a second barrier (~2 L2 round trips)
    "gemv_cluster_us": 0.4,   # split-k in a cluster: two cluster barriers and the remote shared-memory reads
    "gemv_read_eff": 0.92,
    "gemv_hiding_warps": 16,  # resident warps an SM needs to hide a step's FMAs under the next step's loads    # a read stream's share of the nominal DRAM bandwidth (HBM3/3e reads: 0.9-0.93)
}


def constants(data: Mapping) -> dict[str, float]:
    """CONSTANTS, each overridden by the hardware profile's entry of the same name."""
    return {key: float(data.get(key, value)) for key, value in CONSTANTS.items()}


def gemv_terms(p: Mapping, m: int, n: int, kk: int, esize: int, io_bytes: float, *, sm_count: int,
               bps: int, dram_gbs: float, fp32_tflops: float, c: Mapping[str, float] = CONSTANTS) -> dict[str, float]:
    """The terms above (us), and `time_us` without the launch overhead. `dram_gbs` is the
    profile's nominal bandwidth; `fp32_tflops` its fp32 rate times its efficiency (an FMA
    counts as two); `c`: `constants(profile data)`."""
    lat, sm_gbs = c["gemv_latency_us"], c["gemv_sm_gbs"]
    ln, rw, seg = gemm_gemv.lanes(p["BN"])
    tiles = math.ceil(n / p["BN"])
    blocks = tiles * p["SPLITK"]
    kper = min(kk, gemm_gemv.k_per_split(kk, p))
    block_bytes = kper * min(p["BN"], n) * esize
    threads = gemm_gemv.threads(p)
    inflight = min(block_bytes, threads * p["U"] * seg * 16)
    q = math.ceil(blocks / sm_count)
    resident = max(1, min(q, bps))
    r_sm = min(sm_gbs, resident * inflight / lat / 1e3)        # GB/s
    t_dram = io_bytes / (dram_gbs * c["gemv_read_eff"] * 1e3)
    t_sm = q * block_bytes / (r_sm * 1e3)
    # fp32 FMAs: M per weight element and one for its conversion, at an SM's share of the peak
    t_fma = q * kper * min(p["BN"], n) * (m + 0.5) * 2 / (fp32_tflops * 1e6 / sm_count)
    t_split = 0.0
    if p["SPLITK"] > 1:
        t_split = c["gemv_cluster_us" if p.get("CL") else "gemv_split_us"] + p["SPLITK"] * p["BM"] * p["BN"] * 4 / (sm_gbs * 1e3)
    # FMAs hidden under the loads only with enough resident warps: the rest is exposed
    t_exposed = t_fma * max(0.0, 1.0 - resident * p["WARPS"] / c["gemv_hiding_warps"])
    time = max(t_dram, t_sm, t_fma) + t_exposed + c["gemv_reduce_us"] + t_split
    return {"time_us": time, "t_dram_us": t_dram, "t_sm_us": t_sm, "t_fma_us": t_fma, "t_split_us": t_split, "t_fma_exposed_us": t_exposed,
            "t_pipeline_us": c["gemv_reduce_us"] + t_split,
            "t_compute_us": t_fma, "t_smem_us": 0.0, "t_reduce_us": c["gemv_reduce_us"], "sm_gbs": r_sm,
            "inflight_per_sm": resident * inflight, "blocks": blocks, "blocks_busiest_sm": q,
            "blocks_per_sm": bps}
