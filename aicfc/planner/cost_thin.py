"""Cost terms of the `thin` unit (codegen/gemm_thin.py, [Note: thin GEMMs]): a stream of A in and
the output out, whose tensor work is a few percent of its bytes' time.

    t = launch + t_fill + max(t_dram, t_issue, t_warp)

    t_dram   = every byte once (A, the weight, the epilogue's operands, the output)
               / (dram_bandwidth · eff.dram)
    t_issue  = the busiest SM's warp-slabs · instructions a warp-slab / THIN_ISSUE_PER_US
               instructions a warp-slab: A's loads (2 a k-chunk), the mma (k-chunks x BNW/8),
               the epilogue's pairs (2 rows x BNW/8, each its operations + STAGE_OPS), the
               copy-out's 16-byte pieces (16·BNW/8 over 32 lanes, COPY_OPS each)
    t_warp   = the busiest warp's slabs · (THIN_LATENCY_US / THIN_OVERLAP + its instructions / THIN_WARP_PER_US)
               one warp's own pace: its next slab's rows are in flight while it runs this one's
               epilogue (a loaded round trip a slab, THIN_OVERLAP of it hidden), and a warp issues
               far below its scheduler's rate (each instruction waits on the one before)
    t_fill   = THIN_LATENCY_US (the weight's fragments and the first slab)

The warps resident on an SM are min(OCC, blocks_per_sm) blocks of NCH x RW warps; a grid past
what fits runs in waves (the grid-stride loop is then shared unevenly: the busiest SM's
warp-slabs count).

The coefficients below are first estimates, not fitted. Measured against them (session 33, an
H200, MobileNetV2 B32, benchmarks/results/thin_gemm_session33_h200.txt): the 16 -> 96 expansion
27.4 us (predicted 24.0), the 24 -> 144 ones 11.6-11.8 (10.3), but the 32 -> 192 ones at the
picked 32-column chunks 8.94 (4.76), where 64-column chunks measured 6.09 (5.46) and 96-column
ones 6.53 (6.42): with three slabs a warp, half a round trip a slab is too little, and narrow
chunks are credited with a speed they do not have. Open: a fit over pinned schedules.
"""
from __future__ import annotations

import math
from typing import Mapping

STAGE_OPS = 6             # a pair's conversion, packing, shared store and its address
COPY_OPS = 8              # a 16-byte piece: row decomposition, address, shared load, global store
THIN_ISSUE_PER_US = 4000  # warp-instructions an SM issues a microsecond (4 schedulers, ~1.7 GHz, half their peak)
THIN_OVERLAP = 2.0        # round trips of a warp's slab loads hidden per slab (the next slab requested early)
THIN_LATENCY_US = 1.0     # a load's round trip while the stream keeps DRAM busy
THIN_WARP_PER_US = 300    # instructions one warp issues a microsecond (~6 cycles each)


def thin_terms(p: Mapping, rows: int, kk: int, epilogue_ops: int, dram: float, bps: int, hw) -> dict:
    """The terms above (us) and `time_us`, without the launch."""
    sms = hw.sm_count
    kc = math.ceil(kk / 16)
    slabs = math.ceil(rows / 16)
    warps_block = p["NCH"] * p["RW"]
    resident = max(1, min(p["GRID"], sms * max(1, min(p["OCC"], bps))))
    # the warps of the whole grid walk slabs x NCH warp-slabs in a grid-stride loop
    total_warps = p["GRID"] * warps_block
    per_warp = math.ceil(slabs * p["NCH"] / total_warps)
    waves = math.ceil(p["GRID"] / resident)
    per_sm = per_warp * waves * warps_block * math.ceil(resident / sms)
    instr = (2 * kc + kc * p["BNW"] // 8 + 2 * (p["BNW"] // 8) * (epilogue_ops + STAGE_OPS)
             + math.ceil(16 * p["BNW"] / 8 / 32) * COPY_OPS)
    t_dram = dram / (hw.dram_bandwidth_gbs * 1e3 * hw.efficiency["dram"])
    t_issue = per_sm * instr / hw.data.get("thin_issue_per_us", THIN_ISSUE_PER_US)
    latency = hw.data.get("thin_latency_us", THIN_LATENCY_US)
    t_warp = per_warp * waves * (latency / hw.data.get("thin_overlap", THIN_OVERLAP)
                                 + instr / hw.data.get("thin_warp_per_us", THIN_WARP_PER_US))
    t_fill = latency
    time = t_fill + max(t_dram, t_issue, t_warp)
    return {"time_us": time, "t_dram_us": t_dram, "t_issue_us": t_issue, "t_warp_us": t_warp,
            "t_pipeline_us": t_fill, "t_compute_us": t_issue, "t_smem_us": 0.0, "warp_slabs": per_warp,
            "thin_waves": waves, "blocks": p["GRID"]}
