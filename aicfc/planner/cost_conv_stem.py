"""Cost terms of the `stem` unit of the `conv` family (`codegen/conv_stem.py`, [Note: the stem on tensor
cores]): one block an output tile, whose time is its instructions (the image patch's copy, the gathers,
the epilogue) or the output's bytes.

    t = launch + t_fill + max(t_dram, t_issue, t_block)

    t_dram   = every byte once (image, filter, the epilogue's operands, output)
               / (dram_bandwidth · eff.dram); neighbouring tiles re-read their patches' edges from L2
    t_issue  = the busiest SM's blocks, ceil(blocks / SMs), · a block's warp instructions / STEM_ISSUE_PER_US
    a block's warp instructions:
      setup  = WARPS · KC · (8 · PICK_OPS + N/8 · 4 · FILTER_OPS)
               each warp picks its 8 offsets a k-step and loads its filter fragments (two 16-bit loads a
               register, each with its address and packing)
      patch  = C·PH · (ceil(PW / E / 32) · PATCH_OPS + ROW_OPS) + the zero run's 16-byte stores
               a warp step a patch row: a predicated load of E columns (2 where an image row is contiguous:
               conv_stem.unit_columns), its zero and its store; the row's index split, bounds and address
      groups = TH·TW/16 · (KC · (8·ways + 8) + KC · N/8 + 2 · N/8 · (epilogue_ops + STAGE_OPS)
                           + ceil(16·N/8 / 32) · COPY_OPS + GROUP_OPS)
               the gather: 8 shared loads a k-step (each `ways` times: the bank conflicts at the patch's
               pitch), 4 adds and 4 packs; the mma; the staged pairs and the copy-out's 16-byte pieces
               (cost_thin's STAGE_OPS and COPY_OPS); the pixel bases, validity and flat indices
    t_block  = rounds · (THIN_LATENCY_US + a warp's share of the block / THIN_WARP_PER_US)
               one block slot's pace: each of its blocks waits for its patch's round trip, then its
               busiest warp issues at one warp's rate; rounds = ceil(blocks / (SMs · blocks_per_sm))
    t_fill   = THIN_LATENCY_US (the first patch)

blocks_per_sm follows threads, static shared memory (the patch and the stagings) and registers.

The coefficients are first estimates, not fitted: cost_thin's latency figures, operation counts read off
the SASS of MobileNetV2 B32's stem (CUDA 13, sm_90, the 8x32 tile, pairs of columns: 1200 instructions a
warp, setup ~185, patch ~330, each group ~170; counted here 1190), and STEM_ISSUE_PER_US, the issue rate
the `mma` implicit GEMM reached on that same convolution (ncu: instruction-bound, 47M warp instructions
in 69-72 us on an H200, ~5000 an SM a microsecond). The unit itself has not been timed yet; it counts
about 8.6M warp instructions there.
"""
from __future__ import annotations

import math
from typing import Mapping

from aicfc.codegen import conv_stem
from aicfc.planner.cost_thin import COPY_OPS, STAGE_OPS, THIN_LATENCY_US, THIN_WARP_PER_US

PICK_OPS = 3      # a compile-time value picked by the lane's t: two compares and selects
FILTER_OPS = 4    # a filter element: its address, guard, the 16-bit load, its share of the packing
PATCH_OPS = 5     # a patch load: its bounds, zero, predicated load and shared store
ROW_OPS = 15      # a patch row's index split (by PH), bounds and address
STEM_ISSUE_PER_US = 5000   # warp instructions an SM issues a microsecond (profile: stem_issue_per_us)
GROUP_OPS = 40    # a group's pixel bases, validity, flat indices, accumulators' zeros and warp barriers


def block_instructions(lay: conv_stem.Layout, p: Mapping, epilogue_ops: int, e: int) -> tuple[float, float]:
    """(a block's warp instructions, its busiest warp's), `e` columns a patch load."""
    pt = conv_stem.patch(lay, p["TH"], p["TW"])
    kc, nb = lay.k_steps, lay.n // 8
    setup = kc * (8 * PICK_OPS + nb * 4 * FILTER_OPS)
    rows = lay.channels * pt.rows
    zero = math.ceil((pt.elements(lay) - pt.at_zero(lay)) / 8 / 32)
    row = math.ceil(pt.cols / e / 32) * PATCH_OPS + ROW_OPS
    patch = rows * row + zero * 2
    group = (kc * (8 * pt.ways + 8) + kc * nb + 2 * nb * (epilogue_ops + STAGE_OPS)
             + math.ceil(16 * nb / 32) * COPY_OPS + GROUP_OPS)
    groups = conv_stem.groups(p)
    block = p["WARPS"] * setup + patch + groups * group
    warp = setup + math.ceil(rows / p["WARPS"]) * row + zero * 2 + math.ceil(groups / p["WARPS"]) * group
    return block, warp


def stem_terms(k, p: Mapping, types: Mapping, bps: int, epilogue_ops: int, dram: float, hw) -> dict[str, float]:
    """The terms above (us) and `time_us`, without the launch."""
    lay = conv_stem.layout(k)
    assert not isinstance(lay, str), lay
    sms = hw.sm_count
    blocks = conv_stem.tiles(lay, p)
    block, warp = block_instructions(lay, p, epilogue_ops, conv_stem.unit_columns(k, types))
    busiest = math.ceil(blocks / sms)
    rounds = math.ceil(blocks / (sms * max(1, bps)))
    latency = hw.data.get("thin_latency_us", THIN_LATENCY_US)
    t_dram = dram / (hw.dram_bandwidth_gbs * 1e3 * hw.efficiency["dram"])
    t_issue = busiest * block / hw.data.get("stem_issue_per_us", STEM_ISSUE_PER_US)
    t_block = rounds * (latency + warp / hw.data.get("thin_warp_per_us", THIN_WARP_PER_US))
    time = latency + max(t_dram, t_issue, t_block)
    return {"time_us": time, "t_dram_us": t_dram, "t_issue_us": t_issue, "t_block_us": t_block,
            "t_pipeline_us": latency, "t_compute_us": t_issue, "t_smem_us": 0.0, "blocks": blocks,
            "blocks_per_sm": bps, "stem_rounds": rounds, "block_instructions": block,
            "bank_ways": conv_stem.patch(lay, p["TH"], p["TW"]).ways}
