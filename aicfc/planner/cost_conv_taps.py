"""Cost terms of the `taps` unit of the `conv` family (`codegen/conv_taps.py`, [Note: taps in registers]).

A block walks ceil(tiles / CTAS) output tiles of 8x8 pixels; each costs the slower of its products and its
image rows, plus what its epilogue leaves exposed:

    t_tile     = max(t_mma, t_rows, t_smem) + TAPS_EPILOGUE_US
    t_mma      = 2·64·64·576 / (peak_unit / SMs · eff.wgmma_gemm · n_eff(64))     nine taps of m64n64k64
    t_rows     = 100 / im2col_pixels_per_us        the tile's 10x10 image rows of 128 bytes at the TMA's rate
                                                   for such rows (cost_conv_wgmma's IM2COL_PIXELS_PER_US: tiled
                                                   boxes move them no faster, benchmarks/prototypes/tma_taps.cu)
    t_smem     = 9 · (8 KB of A through ldmatrix + 8 KB of B through wgmma) / smem_bandwidth_per_sm
    t          = launch + load_latency + the filter's 72 KB at the SM's TMA port + max(ceil(tiles / CTAS) · t_tile,
                 t_dram)
    t_dram     = (image + filter + output + epilogue reads) / (dram_bandwidth · eff.dram)

TAPS_EPILOGUE_US is fitted to the prototype (benchmarks/results/conv_halo_rs_session30_h200.txt, an H200):
ResNet-50 B32's stage-1 3x3, 12 tiles a block, 15.0 us with three consumer warpgroups and the TMA-store
epilogue, where the products alone say 11.2 (12.9 measured without any epilogue).
"""
from __future__ import annotations

import math
from typing import Mapping

from aicfc.codegen import conv_taps
from aicfc.planner.cost_conv_wgmma import IM2COL_PIXELS_PER_US, TMA_PORT_GBS
from aicfc.planner.cost_wgmma import EFF_DEFAULT, n_eff

TAPS_EPILOGUE_US = 0.16   # a tile's exposed epilogue (profile: conv_taps_epilogue_us)


def taps_terms(k, p: Mapping, types: Mapping, hw, io_bytes: float, latency: float) -> dict[str, float]:
    unit = {"f16": "fp16_tc", "bf16": "bf16_tc"}[p["dtype"]]
    sm_rate = hw.peak_tflops[unit] * 1e6 / hw.sm_count * hw.efficiency.get("wgmma_gemm", EFF_DEFAULT) * n_eff(64)
    t_mma = conv_taps.tile_flops() / sm_rate
    t_rows = conv_taps.HALO * conv_taps.HALO / hw.data.get("im2col_pixels_per_us", IM2COL_PIXELS_PER_US)
    t_smem = 9 * (conv_taps.TAP_A_BYTES + conv_taps.TAP_B_BYTES) / (hw.smem_bandwidth_gbs_per_sm * 1e3)
    t_epi = hw.data.get("conv_taps_epilogue_us", TAPS_EPILOGUE_US)
    tiles = conv_taps.tiles(k, types)
    per_sm = math.ceil(tiles / p["CTAS"])
    t_filter = conv_taps.FILTER_BYTES / (hw.data.get("conv_tma_port_gbs", TMA_PORT_GBS) * 1e3)
    t_tiles = per_sm * (max(t_mma, t_rows, t_smem) + t_epi)
    t_dram = io_bytes / (hw.dram_bandwidth_gbs * 1e3 * hw.efficiency["dram"])
    time = hw.launch_overhead_us + latency + t_filter + max(t_tiles, t_dram)
    return {"time_us": time, "dram": io_bytes, "t_compute_us": per_sm * t_mma, "t_l2_us": per_sm * t_rows, "t_smem_us": per_sm * t_smem,
            "t_epilogue_us": per_sm * t_epi, "t_dram_us": t_dram, "t_pipeline_us": latency + t_filter,
            "tiles_per_sm": per_sm, "wave_eff": tiles / (per_sm * p["CTAS"]), "n_eff": n_eff(64),
            "launch_us": hw.launch_overhead_us, "blocks": p["CTAS"], "blocks_per_sm": 1,
            "parallel_eff": min(tiles, hw.sm_count) / hw.sm_count}
