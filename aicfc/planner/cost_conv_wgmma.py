"""Cost terms of the Hopper implicit-GEMM convolution (`codegen/conv_wgmma.py`, rendered by
`templates/gemm_wgmma.cu.j2` with its gathering producer).

The GEMM engine's terms (`cost_wgmma.py`) over M = N·OH·OW, N = OC, K = KH·KW·C, with the A
operand gathered instead of loaded by the TMA:

    t_kblock   = max(t_mma, t_smem, t_load, t_gather, t_round, load_latency / (STAGES - 2))
    t_mma      = 2·BM·BN·BK / (peak_unit / SMs · eff.wgmma_gemm · n_eff(BN, schedule))
    t_smem     = 128·(BM + BM/64·BN) / smem_bandwidth_per_sm
    t_load     = 128·(BM + BN) / (l2_bandwidth / SMs)       the A runs and the B box, from L2
    t_gather   = BM·8·GATHER_OPS / (128 · clock)            the producer warpgroup's address
                                                            arithmetic, one 16-byte run per
                                                            GATHER_OPS instructions, 128 per cycle
                 (a stage is published one k-block late, so STAGES - 2 k-blocks cover a round trip)
    t_round    = GATHER_ROUND_TRIP_US / GATHER_GROUPS         the gatherers' own round trips: a
                 k-block costs at least half a gathered copy's round trip through a loaded L2,
                 whatever STAGES is. Each gatherer keeps gather_lag + 1 = STAGES - 1 groups of copies
                 in flight (`cp.async.wait_group STAGES - 2`), but on ResNet-50 B32 (H200, session 5)
                 STAGES 5 and 6 (4 and 5 groups) ran every gathered 3x3 convolution at the k-block
                 time STAGES 3 and 4 (2 groups, `wait_group 1`) had: 0.7-0.9 us, so the term does not
                 divide by the groups in flight. (Suspected: each publication's `fence.proxy.async`
                 waits for all of the thread's copies, not only the completed groups.) Fitted:
                 ResNet-50 B32 on an H200 ran every gathered convolution (3x3 and strided 1x1, BN 64
                 to 256, STAGES 3 to 6) at 0.5-0.9 us a k-block, where the other terms said 0.3
                 (tests/test_cost_conv_wgmma.py pins those measurements).
    t_epilogue = BM·BN·out_bytes·STORE_WASTE / (l2_bandwidth / SMs) + EPILOGUE_US
                 + BM·BN·(epilogue instructions + STORE_OPS) / EPILOGUE_RATE·sqrt(warpgroups)
                 (one element per store from the accumulators: STORE_WASTE sectors' worth; staged
                 in shared memory and copied out in 16-byte chunks (OUT): whole sectors)
    t          = launch + load_latency + max(ceil(tiles·SPLITK / CTAS) · (KT/SPLITK·t_kblock + t_epilogue)
                 + t_reduce, t_dram)
    stream-k   (STREAM = 1): the busiest block's share of all tiles' k-blocks (each at least its boxes'
                 share of the L2's whole traffic), its epilogues and the partial tile it publishes,
                 then the tail's reduction (cost_wgmma.stream_k, [Note: stream-k's terms])
    split-k    (SPLITK > 1: a work unit is a tile's k-split, KT/SPLITK k-blocks): each unit's epilogue
                 also writes its fp32 partial tile, and the last split's reads of all of them plus
                 splitk_overhead_us (fence, ticket) are on the critical path once: the GEMM engine's
                 terms (cost_wgmma.py), whose template runs both
    t_dram     = (image + filter + output + epilogue reads) / (dram_bandwidth · eff.dram)
                 + the image again per column tile past the first where it does not fit in L2 and
                 the column tiles of a raster group (GROUP row tiles x all column tiles, run by
                 consecutive CTAs) are not all in flight at once (GROUP · tiles_n > CTAS): where
                 they are, the second column tile reads the rows the first just brought into L2
                 (ResNet-50's 56x56 1x1/2 projection, 2 column tiles: measured 33.7 us, where
                 charging the 51 MB image twice predicted 47.6)

A by the TMA in im2col mode (A = "tma", codegen/conv_wgmma.py `im2col_geometry`): no gatherers,
the GEMM engine's load terms instead, and the TMA's own walk over the pixels:

    t_load     = 128·(BM + BN) / TMA_PORT_GBS
    t_latency  = tma_latency / (STAGES - 1)
    t_gather   = copies · BM / IM2COL_PIXELS_PER_US      one copy a k-block (128-byte rows) or, for an
                 8-channel image, 8 (one 16-byte row a pixel and tap)
    im2col refit (session 16, H200, the epilogues staged: profile_resnet50_b32_session16_h200.txt):
                 with the stores no longer sharing the port at a quarter sector each, the 128x128 tiles
                 (stage 2-4 3x3, BN 128) ran their k-blocks at the tensor term, 13.9-19.4 us where an
                 even L2 share (l2_bandwidth / SMs, 76 GB/s) for the TMA's bytes had said 19-26; and
                 the BN = 64 tiles (the stem, stage 1's 3x3), whose TMA bytes a k-block are fewer,
                 ran at one walk rate whatever the row's width: 128 rows of 128 bytes a k-block in
                 0.36 us (20.75 us for stage 1), 8 copies of 128 rows of 16 bytes in 2.9 us (61.7
                 us for the stem). So the TMA's bytes are charged at the SM's port (TMA_PORT_GBS,
                 the 130 GB/s an SM streamed in hardware.py's [Note: L2 share of a small grid]) and
                 the walk at 360 pixel rows a microsecond (620 was fitted on an H100 in session 6,
                 with the stores from registers)
    [Note: im2col boxes in flight]
                 t_latency divides the TMA's latency by min(STAGES - 1, im2col_in_flight): the 64-row
                 ping-pong tiles of ResNet-50 B32's stage-2 and stage-4 3x3s took 0.24-0.25 us a k-block
                 whatever STAGES (an H100's `aicfc tune`, session 74, tune_3x3_session74_h100.json: the
                 28x28x128 3x3 on 64x128 ping-pong tiles 16.8 us at STAGES 5 and at 6, predicted 16.6 and
                 13.9; session 78's profiles: 1.15-1.28 of their predictions alone, 1.22-1.68 in the chain),
                 where STAGES - 1 k-blocks in flight said 0.20 at six: no more than four k-blocks' boxes
                 are in flight, as if the TMA's im2col walk held at most four outstanding. The sm_90
                 profile (an H100) carries 4; over that report it moves the 7x7x512 stride-2 3x3 from
                 64x104 tiles (19.3 us measured) to 128x128 tiles in 2 k-splits as a cluster (19.0) and
                 leaves the others' picks. Measured in session 79 (an H100,
                 benchmarks/results/moved_maps_session79.txt): the stage-2 3x3s predicted 15.2 us where
                 they were 12.5 (15.8-16.0 alone, 17.5-18.0 in the chain); ResNet-50 B32's convolutions
                 within [0.8, 1.25] of their predictions 47 of 52 alone and 49 in the chain; but its
                 three stage-4 3x3s, all moved to the split tiles, ran 19.2-19.8 us alone against
                 17.7-19.0 on 64x104 tiles (another H100 of the same session) and the plan replayed 0.993x
                 without the cap (7 rounds; B1, MobileNetV2 and EfficientNet-B0 keep every schedule): the
                 split tiles are predicted 1.13-1.17 of what they take, the 64x104 ones 1.04-1.11, so the
                 1% the model puts between them is the wrong way round. Not the dependent launch: on one
                 H100 (`conv_round.sh splitpdl`, benchmarks/pdl_alone.py, two rounds) the split tiles ran
                 18.5-19.4 us launched as the plan launches them and 18.8-19.8 plainly, the 64x104 tiles
                 17.1-17.6 and 17.8-18.3: today's split kernel is slower than session 74's `aicfc tune` had
                 it (0.3 us faster then, before sessions 76-77 changed both kernels' prologue and trigger),
                 so its terms (the split's k-blocks, or its cluster's exchange) are 8% optimistic on this
                 shape. A pace for every k-split cluster, fitted here, would move the Llama prefill's down
                 projections too, and was not kept.
                 Session 82 (an H100, benchmarks/results/im2col_cap_session82_h100.txt) timed the stage-4
                 3x3 on other tiles, each alone as the profile times it: 64x128 ping-pong tiles at STAGES 6
                 (one tile a block, 100 blocks) ran 17.08 us, 72 k-blocks at 0.198 us where four boxes in
                 flight allow no less than 0.25; 128x64 tiles at STAGES 6 ran 20.24, 0.258 us a k-block, at
                 the cap; the split 128x128 clusters 19.2-19.7 again. What the walk holds outstanding is
                 pixel rows, not boxes, as far as these two say: a profile key `im2col_cap_rows` (128)
                 counts the cap in boxes of that many rows, eight 64-row boxes, four of 128, 2.7 of 192.
                 With it the stage-4 3x3s move back to 64x104 ping-pong tiles (predicted 16.08 us, the split
                 clusters 17.10); no other schedule of ResNet-50 B32 or B1 or MobileNetV2 B32 moves (B1's
                 64-row k-split 3x3s are predicted 5-12% faster). Session 74's 64x128 ping-pong stage-2 3x3
                 at STAGES 6 (16.8 us, three tiles a block) stays slower than the key says, and sessions
                 78-79 timed 64-row ping-pong tiles at 1.22-1.68 of their predictions in the plan's chain
                 (1.15-1.26 alone), so sm_90 left the key out until a plan-level A/B said the move pays.
                 Session 83 (an H100, benchmarks/results/im2col_cap_rows_session83_h100.txt, `conv_round.sh
                 s83`): ResNet-50 B32's plan with the key replayed 875.2 us against 881.8 without it (1.008x,
                 faster in 7 of 7 alternating rounds; the same outputs within 4.6e-4), its three stage-4 3x3s
                 on 125 blocks of 64x104 ping-pong tiles 17.8-18.0 us alone against 19.3-19.8 on the split
                 clusters (predicted 15.97: 1.11-1.13), and B1 kept every schedule; sm_90 carries the key (128)
                 since. In the plan's chain those tiles take 19.8-20.1 us from the kernel before's exit
                 (1.24-1.26 of 15.97): the 64-row ping-pong tiles' chain times stay above the model.
                 The h200 profile keeps no cap (0): on H200s (sessions 29 and 37) the schedules the cap
                 prefers for the stage-4 3x3s measured 1.5-12% slower than the 64x104 tiles (0.996x on
                 the plan in session 79), and without it 52 of the 52 measured within the band alone.

Halo reuse: under gather and im2col the KH·KW taps of neighbouring output pixels re-read the same
image rows; they hit in L2 (t_load counts them at L2 bandwidth, DRAM once) while the image fits
there, which the `gathered_bytes` term reports (the im2col matrix's size, the L2 traffic of A).
A = halo (stride 1; codegen/conv_wgmma.py [Note: halo tiles]) reads each tile's image rows once:

    t_load     = max over (128·BN + tile bytes / taps) / sm_ingress and / (l2_bandwidth / SMs)
    t_smem     = 128·(BM·HALO_A_SMEM + BM/64·BN) / smem_bandwidth_per_sm: the taps read A from rows
                 that start mid swizzle atom (kw·dw not a multiple of 8), which costs shared-memory
                 time the aligned tiles do not. Fitted: ResNet-50 B32 on an H200 ran its 56x56x64 3x3
                 convolutions (BN 64, where shared memory binds first) at 31.5 us on image tiles
                 against 24.6 under im2col, 0.29 us a k-block where the unfitted terms said 0.22 (HALO_A_SMEM = 1
                 would be aligned reads); its 28x28 and 14x14 ones (BN 128, tensor-core bound) ran as fast
                 as under im2col, 20.2 / 16.6 us against 20.3 / 16.7
                 (benchmarks/results/conv_profile_r32{,_halo}_session11_h200.txt).
    t_latency  = tma_latency / (STAGES - 1)
    tiles      over the slot space (images x OHP x PITCH rows): the slots past OW and rows past OH
                 are computed, not stored
    t_drain    = C/64 · t_mma a tile: the last products of each image tile finish before its slot
                 goes back to the producer
    gathered_bytes = the tiles' image bytes through L2
"""
from __future__ import annotations

import math
from typing import Mapping

from aicfc.codegen import conv_wgmma, gemm_wgmma
from aicfc.codegen.gemm_wgmma import ROW_BYTES
from aicfc.planner.cost_wgmma import (EFF_DEFAULT, EPILOGUE_RATE, EPILOGUE_US, STORE_OPS, stream_k, split_terms,
                                      TMA_LATENCY_US, epilogue_ops, n_eff)
from aicfc.ir.types import ITEMSIZE

GATHER_OPS = 24     # integer instructions per gathered run: split m and k, the guard, the address, the copy
STORE_WASTE = 4     # a 16-bit element stored alone uses a quarter of the 32-byte sector it touches
CLOCK_MHZ = 1755    # the SM clock the producer's issue rate is counted at (profile: clock_mhz)
GATHER_ROUND_TRIP_US = 1.3   # a gathered 16-byte copy's round trip under load (profile: conv_gather_round_trip_us)
IM2COL_PIXELS_PER_US = 360  # pixel rows an SM's TMA walks a microsecond in im2col mode (profile: im2col_pixels_per_us)
TMA_PORT_GBS = 130          # what one SM's TMA loads take in, GB/s (profile: conv_tma_port_gbs)
HALO_A_SMEM = 2.9           # A's shared-memory reads under halo tiles, in aligned tiles' worth (profile: conv_halo_a_smem)
GATHER_GROUPS = 2            # the groups of copies in flight that measured times bear out (not STAGES - 1: see t_round)


def conv_wgmma_terms(k, p: Mapping, types: Mapping, hw, io_bytes: float, latency: float) -> dict[str, float]:
    from aicfc.ir.properties import implicit_gemm
    m, n, kk = conv_wgmma.dims(k)
    g = implicit_gemm(k.ops[0])
    bm, bn, bkk, st = p["BM"], p["BN"], p["BK"], p["STAGES"]
    sms = hw.sm_count
    unit = {"f16": "fp16_tc", "bf16": "bf16_tc"}[p["dtype"]]
    sm_rate = hw.peak_tflops[unit] * 1e6 / sms * hw.efficiency.get("wgmma_gemm", EFF_DEFAULT) * n_eff(bn, p)
    l2_sm = hw.l2_bandwidth_gbs * 1e3 / sms
    t_mma = 2.0 * bm * bn * bkk / sm_rate
    halo = conv_wgmma.halo_of(k, p, types) if p.get("A") == "halo" else None
    a_smem = hw.data.get("conv_halo_a_smem", HALO_A_SMEM) if halo else 1.0
    t_smem = ROW_BYTES * (bm * a_smem + bm // 64 * bn) / (hw.smem_bandwidth_gbs_per_sm * 1e3)
    sm_in = hw.data.get("sm_ingress_gbs", hw.l2_bandwidth_gbs / sms) * 1e3   # what the TMA brings into one SM
    if halo:
        # A as one image tile per output tile and 64 channels, read by every tap (codegen/conv_wgmma.py [Note: halo
        # tiles]): a k-block brings B's box and 1/taps of the tile through L2
        moved = ROW_BYTES * bn + halo.loaded / (halo.geo.taps[0] * halo.geo.taps[1])   # one 128-byte row a slot
        t_load = max(moved / sm_in, moved / l2_sm)
        t_round = t_gather = 0.0
        t_latency = hw.data.get("tma_latency_us", TMA_LATENCY_US) / (st - 1)
    elif p.get("A") == "tma":
        # A by the TMA in im2col mode: no gatherers; its bytes bounded by the SM's port, not by an even share of
        # the L2 (see the module note, im2col refit)
        t_load = ROW_BYTES * (bm + bn) / (hw.data.get("conv_tma_port_gbs", TMA_PORT_GBS) * 1e3)
        t_round = 0.0
        # the TMA walks an im2col box a pixel at a time: one pixel row per copy and tap (8 taps of 16 bytes a
        # k-block for the 8-channel stem, one 128-byte row otherwise)
        # (the image is channels-last: 64 or more channels a pixel are one copy, 8 are 8)
        copies = max(1, ROW_BYTES // (ITEMSIZE[p["dtype"]] * types[g.a.buffer].shape[-1]))
        t_gather = copies * bm / hw.data.get("im2col_pixels_per_us", IM2COL_PIXELS_PER_US)
        # at most `im2col_in_flight` k-blocks' boxes in flight, whatever STAGES; counted in boxes of
        # `im2col_cap_rows` pixel rows where the profile has that key (more 64-row boxes, fewer of 192) ([Note: im2col
        # boxes in flight])
        rows = hw.data.get("im2col_cap_rows")
        cap = (hw.data.get("im2col_in_flight") or 0) * (rows / bm if rows else 1) or st - 1
        t_latency = hw.data.get("tma_latency_us", TMA_LATENCY_US) / min(st - 1, cap)
    else:
        t_load = ROW_BYTES * (bm + bn) / l2_sm
        t_gather = bm * (ROW_BYTES // 16) * GATHER_OPS / (128.0 * hw.data.get("clock_mhz", CLOCK_MHZ))
        t_latency = latency / max(1, st - 2)
        t_round = hw.data.get("conv_gather_round_trip_us", GATHER_ROUND_TRIP_US) / GATHER_GROUPS
    t_kblock = max(t_mma, t_smem, t_load, t_gather, t_round, t_latency)   # the slowest rate or the TMA's latency
    sk = p.get("SPLITK", 1)
    ktiles = gemm_wgmma.kt_per(p, kk)              # k-blocks of one work unit (a tile's split)
    out_bytes = sum(ITEMSIZE[types[s].dtype] for s in k.stores)
    # from registers a 16-bit pair at a time (STORE_WASTE sectors' worth); staged (OUT), whole sectors
    t_store = bm * bn * out_bytes * (1 if p.get("OUT") else STORE_WASTE) / l2_sm
    t_epi = t_store + hw.data.get("wgmma_epilogue_us", EPILOGUE_US)
    issue = hw.data.get("wgmma_epilogue_rate", EPILOGUE_RATE) * math.sqrt(1 if p.get("PP") else p["NWG"])
    t_epi += bm * bn * (epilogue_ops(k, types) + STORE_OPS) / issue
    t_part, t_reduce = split_terms(p, bm, bn, l2_sm, hw)   # split-k's partial tiles (cost_wgmma.split_terms)
    t_epi += t_part
    tm, tn, tiles = conv_wgmma.tiles(k, p)
    per_sm = math.ceil(tiles * sk / p["CTAS"])
    a_bytes = types[g.a.buffer].nbytes
    together = gemm_wgmma.GROUP * tn <= p["CTAS"]   # a raster group's column tiles all run in one wave
    rereads = (tn - 1) * a_bytes if a_bytes > hw.l2_bytes / 2 and not together else 0.0
    t_dram = (io_bytes + rereads) / (hw.dram_bandwidth_gbs * 1e3 * hw.efficiency["dram"])
    # an image tile's last products drain before its slot goes back (once per 64 channels)
    t_drain = halo.channel_blocks * t_mma if halo else 0.0
    # Ping-pong (PP): one warpgroup's epilogue under the other's k-blocks (cost_wgmma.py's rule), but the
    # SM's L2 port carries both the k-blocks' loads and the epilogue's stores, so their sum bounds it.
    # Measured on ResNet-50 B32 (benchmarks/results/conv_pingpong_session13_h200.txt): the stem and
    # stage 1's 3x3 (port-bound) ran as without PP, 91.8 and 24.5 us; stage 2's 3x3 and a strided
    # stage-3 3x3 ran 7% and 18% faster.
    if p.get("STREAM"):
        # stream-k: the busiest block's share of k-blocks, its epilogues and partial tiles (cost_wgmma.stream_k)
        t_tiles, per_sm, t_reduce = stream_k(tiles, ktiles, p["CTAS"], bm, bn, t_kblock, t_epi, l2_sm, hw)
    elif p.get("PP"):
        t_tiles = max(per_sm * max(ktiles * t_kblock, t_epi) + t_epi, per_sm * (ktiles * t_load + t_store))
    else:
        t_tiles = per_sm * (ktiles * t_kblock + t_epi + t_drain)
    time = hw.launch_overhead_us + latency + max(t_tiles + t_reduce, t_dram)
    return {"time_us": time, "dram": io_bytes + rereads, "t_compute_us": per_sm * ktiles * t_mma,
            "t_smem_us": per_sm * ktiles * t_smem, "t_l2_us": per_sm * ktiles * t_load,
            "t_gather_us": per_sm * ktiles * t_gather, "t_gather_round_us": per_sm * ktiles * t_round, "t_dram_us": t_dram, "t_epilogue_us": per_sm * t_epi,
            # the k-blocks as charged (the slowest rate or the TMA's latency over the boxes in flight), and which
            # walk t_gather is
            "t_kblocks_us": per_sm * ktiles * t_kblock, "t_latency_us": per_sm * ktiles * t_latency,
            "im2col_walk": 1.0 if p.get("A") == "tma" else 0.0, "pingpong": 1.0 if p.get("PP") and not p.get("STREAM") else 0.0,
            "t_pipeline_us": latency,
            "tiles_per_sm": per_sm, "wave_eff": tiles * sk / (per_sm * p["CTAS"]), "t_reduce_us": t_reduce, "n_eff": n_eff(bn, p),
            "gathered_bytes": float(tiles * halo.channel_blocks * halo.loaded if halo
                                    else m * kk * ITEMSIZE[types[g.a.buffer].dtype]),
            "launch_us": hw.launch_overhead_us, "blocks": p["CTAS"], "blocks_per_sm": 1,
            "parallel_eff": min(tiles, sms) / sms, "stages": st}
