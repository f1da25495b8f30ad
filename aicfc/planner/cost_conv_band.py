"""Cost terms of the `band` unit of the `conv` family (`codegen/conv_band.py`, [Note: bands of pixels]).

A block walks ceil(tiles / CTAS) tiles of 64 output pixels x BN channels. A tile is CB channel blocks; in each,
NWG consumer warpgroups take 9 / NWG taps apiece (a tap: 4 ldmatrix, then m64nBNk64 with A from registers, waited
for), so a channel block lasts the slowest of the warpgroups' chains and what feeds the SM:

    t_tap      = max(RS_CHAIN_US + RS_CHAIN_US_PER_COL·BN,        one warpgroup's tap, issue to completion
                     NWG · 2·64·BN·64 / (peak_unit / SMs · RS_PIPE_EFF))   the tensor pipe the warpgroups share
    t_cb       = max(ceil(9 / NWG) · t_tap,
                     9 · (64 + BN) · 128 B / smem_bandwidth_per_sm,         ldmatrix rows and wgmma's B reads
                     9 · BN·128 B / TMA port + the tile's image rows / im2col_pixels_per_us)   the SM's TMA unit
    t_epi      = sums of NWG - 1 warpgroups through shared memory + 64·BN·out_bytes·STORE_WASTE / (L2 / SMs)
                 + wgmma_epilogue_us + 64·BN·(epilogue ops + STORE_OPS) / the epilogue's issue rate
    t          = launch + load_latency + TMA latency (the first rows)
                 + max(ceil(tiles / CTAS)·(CB·t_cb + EPILOGUE_EXPOSED·t_epi), t_dram)

RS_CHAIN_US, RS_CHAIN_US_PER_COL and RS_PIPE_EFF are fitted to a prototype on an H200 (session 39,
benchmarks/prototypes/rs_chain.cu, benchmarks/results/conv_band_session39_h200.txt): 132 blocks running
4 x m64nNk16 steps with nothing but shared memory under them. A step waited for alone took 0.146 / 0.191 /
0.217 us at N = 64 / 104 / 128 with A from ldmatrix, where A from shared memory took 0.073 / 0.117 / 0.144 (95-97%
of the tensor peak) kept one group in flight; three warpgroups' register-A steps took 0.274 / 0.374 / 0.429 us
(77 / 91 / 98% of the peak).
EPILOGUE_EXPOSED is fitted to the unit's runs in ResNet-50 B32 (the same results file, call 14; each kernel alone):
warpgroup 0 adds the sums and stores while the other two and the producer go on to the next tile, so about half
of t_epi shows. With it (and the h200 profile) the stride-1 3x3s measured 0.83-1.05 of their predictions: 56x56x64
(12 tiles a block) 23.7-25.2 us against 24.3, 28x28x128 20.7-21.2 against 24.9, 14x14x256 (BN = 64) 18.0-18.8
against 19.6, 7x7x512 (BN = 104, one tile) 16.7-17.0 against 16.1; without it 0.73-0.98.
"""
from __future__ import annotations

import math
from typing import Mapping

from aicfc.codegen import conv_band, conv_wgmma
from aicfc.ir.types import ITEMSIZE
from aicfc.planner.cost_conv_wgmma import IM2COL_PIXELS_PER_US, STORE_WASTE, TMA_PORT_GBS
from aicfc.planner.cost_wgmma import EPILOGUE_RATE, EPILOGUE_US, STORE_OPS, TMA_LATENCY_US, epilogue_ops

RS_CHAIN_US = 0.075             # a register-A tap's fixed round trip (profile: conv_band_chain_us)
RS_CHAIN_US_PER_COL = 0.00112   # and per output column of the tile (profile: conv_band_chain_us_per_col)
RS_PIPE_EFF = 0.97              # the tensor pipe's share of its peak that back-to-back steps keep
EPILOGUE_EXPOSED = 0.45         # the share of a tile's epilogue the next tile's work does not cover


def band_terms(k, p: Mapping, types: Mapping, hw, io_bytes: float, latency: float) -> dict[str, float]:
    geo = conv_wgmma.im2col_geometry(k, types)
    assert not isinstance(geo, str), geo
    band = conv_band.band_of(geo.image)
    bn, sms, nwg = p["BN"], hw.sm_count, conv_band.NWG
    unit = {"f16": "fp16_tc", "bf16": "bf16_tc"}[p["dtype"]]
    t_mma = 2.0 * conv_band.BM * bn * 64 / (hw.peak_tflops[unit] * 1e6 / sms * RS_PIPE_EFF)
    t_chain = hw.data.get("conv_band_chain_us", RS_CHAIN_US) + bn * hw.data.get("conv_band_chain_us_per_col",
                                                                                RS_CHAIN_US_PER_COL)
    t_tap = max(t_chain, nwg * t_mma)
    per_wg = math.ceil(9 / nwg)
    smem_bw = hw.smem_bandwidth_gbs_per_sm * 1e3
    t_smem = 9 * conv_band.ROW_BYTES * (conv_band.BM + bn) / smem_bw
    rows_us = hw.data.get("im2col_pixels_per_us", IM2COL_PIXELS_PER_US)
    t_tma = (9 * conv_band.ROW_BYTES * bn / (hw.data.get("conv_tma_port_gbs", TMA_PORT_GBS) * 1e3)
             + band.tile_rows() / rows_us)
    t_cb = max(per_wg * t_tap, t_smem, t_tma)
    out_bytes = sum(ITEMSIZE[types[s].dtype] for s in k.stores)
    l2_sm = hw.l2_bandwidth_gbs * 1e3 / sms
    t_epi = (2 * conv_band.part_bytes(p) / smem_bw
             + conv_band.BM * bn * out_bytes * STORE_WASTE / l2_sm + hw.data.get("wgmma_epilogue_us", EPILOGUE_US)
             + conv_band.BM * bn * (epilogue_ops(k, types) + STORE_OPS) / hw.data.get("wgmma_epilogue_rate", EPILOGUE_RATE))
    _, _, tiles = conv_band.tiles(k, p)
    per_sm = math.ceil(tiles / p["CTAS"])
    cbs = band.channel_blocks
    t_first = hw.data.get("tma_latency_us", TMA_LATENCY_US)
    t_tiles = per_sm * (cbs * t_cb + EPILOGUE_EXPOSED * t_epi)
    t_dram = io_bytes / (hw.dram_bandwidth_gbs * 1e3 * hw.efficiency["dram"])
    time = hw.launch_overhead_us + latency + t_first + max(t_tiles, t_dram)
    return {"time_us": time, "dram": io_bytes, "t_compute_us": per_sm * cbs * per_wg * t_tap,
            "t_smem_us": per_sm * cbs * t_smem, "t_l2_us": per_sm * cbs * t_tma, "t_epilogue_us": per_sm * EPILOGUE_EXPOSED * t_epi,
            "t_dram_us": t_dram, "t_pipeline_us": latency + t_first, "tiles_per_sm": per_sm,
            "wave_eff": tiles / (per_sm * p["CTAS"]), "n_eff": min(1.0, nwg * t_mma / t_tap),
            "launch_us": hw.launch_overhead_us, "blocks": p["CTAS"], "blocks_per_sm": 1,
            "parallel_eff": min(tiles, sms) / sms,
            "gathered_bytes": float(tiles * cbs * band.tile_rows() * conv_band.ROW_BYTES)}
