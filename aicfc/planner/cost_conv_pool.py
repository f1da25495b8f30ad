"""Cost terms of the `pool` unit of the `conv` family (`codegen/conv_pool.py`, [Note: pooled tiles]).

A block walks ceil(tiles / CTAS) tiles of TPH x TPW pooled pixels; each costs the slower of its
products, its image rows and its shared-memory traffic, plus its exposed epilogue:

    t_tile  = max(t_mma, t_rows, t_smem) + blocks · POOL_BLOCK_EPILOGUE_US + POOL_TILE_US
    t_mma   = blocks · 2·64·64·(taps·64) / (peak_unit / SMs · eff.wgmma_gemm · n_eff(64))
    t_rows  = box pixels / im2col_pixels_per_us          (cost_conv_wgmma's rate for 128-byte rows
                                                         through an SM's TMA, tiled boxes included)
    t_smem  = blocks · taps · (8 KB of A by ldmatrix + 8 KB of B by wgmma) / smem_bandwidth_per_sm
    t       = launch + load_latency + the filter at the SM's TMA port + max(ceil(tiles / CTAS) · t_tile, t_dram)
    t_dram  = (image + filter + pooled output + epilogue reads) / (dram_bandwidth · eff.dram)

GI = 1 ([Note: the stem gathers its input]: the producer warpgroup computes each slot from the graph's input, which
replaces the image in the DRAM bytes): t_rows is the producer threads' time for a slot instead of the TMA's walk,

    t_rows  = ceil(box rows · 2·steps / 128) · POOL_GATHER_ROW_US        (a task a source row's run: [Note: a slot
                                                                         filled by source rows] in codegen/conv_pool.py)
            or ceil(box pixels · 2·steps / 128) · POOL_GATHER_CHUNK_US  (element by element, where the rows' form does
                                                                         not apply: a thread's chunks one after another)

where under XP a tap's products run steps = `conv_pool.ksteps` k16 steps (3 of 4 for the stem: its padding
channel's are skipped, and their chunks not filled), which also scales t_mma, the taps' shared-memory reads and
the estimate's FLOPs (`k_run`); 4 otherwise.

XP = 1 ([Note: channels as rows]: the 64 channels as wgmma's M, N = RH x PITCH slot rows). A warpgroup
runs a tile's products, then its epilogue and pooling pass; NCONS warpgroups overlap one's epilogue
with another's products, and the block's last epilogue stays exposed:

    t_mma   = 2·64·N·(taps·64) / (peak_unit / SMs · POOL_XP_MMA_EFF)
    t_smem  = 128 B · (taps·(N + 64) + N + 9·TPH·TPW + 2·TPH·TPW + box pixels) / smem_bandwidth_per_sm
              (each tap's rows and its filter box read by wgmma, the region tile stored, the pooling's nine reads, its staging
              written and read by the TMA store, the slot's box landed)
    t_tile  = max(t_mma, t_rows, t_smem, (t_mma + POOL_XP_EPILOGUE_US) / NCONS)
    t_tiles = ceil(tiles / CTAS) · t_tile + (POOL_XP_EPILOGUE_US if NCONS > 1)

Both constants are fitted (session 40, an H200, torchvision ResNet-50 B32's stem, 7x7 tiles, 16 a block,
`aicfc tune --kernel`; benchmarks/results/pool_xp_session40_h200.txt): one warpgroup took 44.8-45.7 us
whatever the ring's depth (2-4 slots), 2.68 us a tile; two took 33.9-35.2, 2.03 us a tile. So a tile's
products take about 2.0 us, 0.52 of the tensor cores' peak, and its epilogue and pooling about 0.65. The
products ran no faster with the filter from shared memory than from registers (35.2 against 33.9 us), so
what holds them at half the peak is not known (an m64n240k16 a k-step, 16 of them a tile, one wait).

POOL_BLOCK_EPILOGUE_US is the taps unit's fitted epilogue of one 64-pixel block (TAPS_EPILOGUE_US: its
values into shared memory); POOL_TILE_US the pooling pass of a tile (nine 16-byte shared-memory reads
for each of its TPH·TPW·8 runs over 128 threads) and its TMA store, fitted to one measurement (session
31, an H200, benchmarks/results/pool_stem_session31_h200.txt): ResNet-50 B32's stem, 14 tiles of 7x8 a
block, 39.6-40.1 us alone, where 0.15 us a tile predicted 35.75 (8x7 tiles with three consumer warpgroups
39.4, with two and three slots 39.6: the same prediction). What it stands for is mostly shared-memory
traffic that t_smem leaves out (the region tile, the pooling's reads; [Note: pooled tiles]).
"""
from __future__ import annotations

import math
from typing import Mapping

from aicfc.codegen import conv_pool
from aicfc.planner.cost_conv_taps import TAPS_EPILOGUE_US
from aicfc.planner.cost_conv_wgmma import IM2COL_PIXELS_PER_US, TMA_PORT_GBS
from aicfc.planner.cost_wgmma import EFF_DEFAULT, n_eff

POOL_BLOCK_EPILOGUE_US = TAPS_EPILOGUE_US   # a block's exposed epilogue (profile: conv_pool_block_epilogue_us)
POOL_TILE_US = 0.44                         # a tile's pooling pass and store, fitted (profile: conv_pool_tile_us)
POOL_XP_MMA_EFF = 0.52                      # XP: a tile's products, share of the tensor peak, fitted (profile: conv_pool_xp_mma_eff)
POOL_XP_EPILOGUE_US = 0.65                  # XP: a tile's epilogue and pooling pass, fitted (profile: conv_pool_xp_epilogue_us)
POOL_GATHER_CHUNK_US = 0.6                  # GI: a producer thread's 16-byte chunk computed element by element (eight loads,
                                            # then one store; profile: conv_pool_gather_chunk_us), fitted (session 87, an
                                            # H100: ResNet-50 B32's stem 131.1 us alone, 16 tiles a block of 13.5 chunks a
                                            # thread, benchmarks/results/gather_stem_session87_h100.txt)
POOL_GATHER_ROW_US = 1.2                    # GI, [Note: a slot filled by source rows]: a producer thread's task, a run of
                                            # one source row loaded as 20 words at once (one round trip) and its 16 chunks
                                            # stored, not fitted (profile: conv_pool_gather_row_us)


def pool_terms(k, p: Mapping, types: Mapping, hw, io_bytes: float, latency: float) -> dict[str, float]:
    geo = conv_pool.pooled_of(k, types)
    unit = {"f16": "fp16_tc", "bf16": "bf16_tc"}[p["dtype"]]
    taps = geo.conv.taps[0] * geo.conv.taps[1]
    bw, bh = conv_pool.box(p, geo.conv.taps)
    steps = conv_pool.ksteps(k, p, types)   # [Note: the stem gathers its input]: XP skips its k16 steps of zeros
    if p.get("GI") and conv_pool.gather_rows(k, p, types) is not None:   # a task a source row's run
        t_rows = math.ceil(conv_pool.row_tasks(k, p, types) / 128) * hw.data.get("conv_pool_gather_row_us",
                                                                                   POOL_GATHER_ROW_US)
    elif p.get("GI"):   # 128 producer threads fill the slot, the 2·steps chunks a pixel row that the products read
        t_rows = math.ceil(bw * bh * 2 * steps / 128) * hw.data.get("conv_pool_gather_chunk_us", POOL_GATHER_CHUNK_US)
    else:
        t_rows = bw * bh / hw.data.get("im2col_pixels_per_us", IM2COL_PIXELS_PER_US)
    tiles = conv_pool.tiles(p, geo)
    per_sm = math.ceil(tiles / p["CTAS"])
    t_filter = taps * conv_pool.TAP_BYTES / (hw.data.get("conv_tma_port_gbs", TMA_PORT_GBS) * 1e3)
    if p.get("XP"):
        # [Note: channels as rows]: every tap's N slot rows and 64 filter rows read once by wgmma, the region tile
        # written once, the pooling's nine reads of each pooled pixel, its staging written and read by the store, the
        # slot's box landed
        share = hw.data.get("conv_pool_xp_mma_eff", POOL_XP_MMA_EFF)
        n, pooled = conv_pool.xp_cols(p), p["TPH"] * p["TPW"]
        moved = conv_pool.ROW_BYTES * (taps * (n + 64) * steps / 4 + n + 9 * pooled + 2 * pooled + bw * bh)
        t_epi = hw.data.get("conv_pool_xp_epilogue_us", POOL_XP_EPILOGUE_US)
    else:
        share = hw.efficiency.get("wgmma_gemm", EFF_DEFAULT) * n_eff(64)
        nb = conv_pool.blocks(p)
        moved = nb * taps * 2 * conv_pool.TAP_BYTES
        t_epi = (nb * hw.data.get("conv_pool_block_epilogue_us", POOL_BLOCK_EPILOGUE_US)
                 + hw.data.get("conv_pool_tile_us", POOL_TILE_US))
    t_mma = conv_pool.tile_flops(p, geo, steps) / (hw.peak_tflops[unit] * 1e6 / hw.sm_count * share)
    t_smem = moved / (hw.smem_bandwidth_gbs_per_sm * 1e3)
    if p.get("XP"):   # NCONS warpgroups overlap one's epilogue with another's products; the last stays exposed
        t_tiles = per_sm * max(t_mma, t_rows, t_smem, (t_mma + t_epi) / p["NCONS"]) + (t_epi if p["NCONS"] > 1 else 0.0)
    else:
        t_tiles = per_sm * (max(t_mma, t_rows, t_smem) + t_epi)
    t_dram = io_bytes / (hw.dram_bandwidth_gbs * 1e3 * hw.efficiency["dram"])
    time = hw.launch_overhead_us + latency + t_filter + max(t_tiles, t_dram)
    return {"time_us": time, "dram": io_bytes, "t_compute_us": per_sm * t_mma, "t_l2_us": per_sm * t_rows,
            "t_smem_us": per_sm * t_smem, "t_epilogue_us": per_sm * t_epi, "t_dram_us": t_dram,
            "t_pipeline_us": latency + t_filter, "tiles_per_sm": per_sm, "wave_eff": tiles / (per_sm * p["CTAS"]),
            "n_eff": n_eff(64), "launch_us": hw.launch_overhead_us, "blocks": p["CTAS"], "blocks_per_sm": 1,
            "parallel_eff": min(tiles, hw.sm_count) / hw.sm_count, "t_kblocks_us": per_sm * max(t_mma, t_rows, t_smem),
            # NCONS warpgroups in turn (XP): a tile's products and epilogue over NCONS, the last epilogue exposed
            "consumers_in_turn": float(p["NCONS"]) if p.get("XP") and p["NCONS"] > 1 else 0.0,
            # the share of the convolution's k its products run (the estimate's FLOPs: cost._conv_wgmma_cost)
            **({"k_run": steps / 4} if steps < 4 else {})}
