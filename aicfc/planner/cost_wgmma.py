"""Cost terms of the Hopper GEMM engine (`codegen/gemm_wgmma.py`, `templates/gemm_wgmma.cu.j2`).

A persistent block per SM walks its share of the output tiles; the busiest SM takes
ceil(tiles·SPLITK / CTAS) work units, so that is the wave quantization. Within a block the producer's
TMA copies run STAGES - 1 k-blocks ahead of the consumers, so a k-block costs the slowest of
three rates, and a tile adds its epilogue, which the consumers run while the producer already
fetches the next tile:

    t_kblock   = max(t_mma, t_smem, t_load, t_latency)
    t_mma      = 2·BM·BN·BK / (peak_unit / SMs · eff.wgmma_gemm · n_eff(BN, schedule))
    t_smem     = 128·(BM + BM/64·BN) / smem_bandwidth_per_sm      every m64 wgmma reads its A and B
    t_load     = max(t_ingress, t_l2)                              the k-block's TMA boxes, two limits:
    t_l2       = 128·(BM + BN/CLUSTER) / l2_share                  L2 -> SM: the bytes this SM's copies pull
                 from L2 (its A box and its share of B's: a cluster of 2 pulls B once for both CTAs and
                 multicasts it), at the SM's share of the L2's bandwidth (`l2_bandwidth_gbs` of the
                 profile: 10 TB/s on sm_90, what `aicfc tune` fitted on the H200, 9975 GB/s in
                 benchmarks/results/sm_90_h200_fp16.json; about 76 GB/s, 38 B/cycle, per SM)
    t_ingress  = 128·(BM + BN) / sm_ingress                         the bytes landing in this SM's shared
                 memory, multicast or not (profile `sm_ingress_gbs`, per SM; default the same share).
                 l2_share = min(tma_l2_gbs / min(CTAS, SMs), tma_port_gbs) ([Note: the TMA's share of
                 L2], `tma_share_gbs`): the CTAs of a small grid split what the TMA draws from L2 among
                 fewer SMs, each up to its port; a profile without tma_l2_gbs gives the L2's even share
                 ([Note: L2 share of a small grid] in planner/hardware.py). Multicast lowers t_l2
                 alone, so in the k-blocks it pays only where a profile says
                 an SM takes bytes in faster than its share of L2 reads. On the H100 it did not: the
                 64x192 ping-pong tile, L2-bound here, measured 44.6 us alone and 42.2 clustered on
                 4096x3072x768 where halving B's L2 bytes predicted 31 us; 128x256 on 4096^3 201 and 203
                 (benchmarks/results/gemm_cluster_h100.txt)
    t_latency  = (tma_latency + CLUSTER_RELEASE_US if CLUSTER = 2) / (STAGES - 1)
                 STAGES - 1 k-blocks in flight cover a TMA round trip; in a cluster a stage comes back
                 only once both CTAs freed it (an arrival across SMs), and the pair runs at the pace
                 of its slower CTA: t_kblock x (1 + cluster_pace) (profile; 0 unless measured). On an
                 H200 (aicfc tune, benchmarks/results/tune_stage3_session18_h200.txt) the same 128x128
                 tiles ran ResNet-50's 14x14 1x1 GEMMs 10.55 us clustered against 8.77 alone (16
                 k-blocks a CTA: +26% of the k-loop) and 10.29 against 9.53 (ping-pong, 4 tiles of 4
                 k-blocks: +11%), where the model had the cluster ahead by 0.1 us; h200.json says 0.18
    t_epilogue = BM·BN·(bytes written and read per output element) / (l2_bandwidth / SMs)
                 (RS = 1: the residual's bytes move to the tile's k-blocks, t_copy; they share the
                 SM's L2 port with its TMA loads; the epilogue waits what the k-blocks leave of the
                 copy's round trip, over NWG under ping-pong: t_wait, [Note: the residual's round trip])
                 + EPILOGUE_US        16-bit stores from registers (OUT = 0: half sectors) go at
                                      wgmma_reg_store_gbs an SM and also hold the port the next tile's
                                      loads need (t_port, [Note: stores from the registers]); fp32 ones,
                                      and staged ones (OUT > 0), at the L2 share
                 + BM·BN·(epilogue instructions + STORE_OPS) / (EPILOGUE_RATE · COOP_EPILOGUE_SCALE
                                      for two cooperative warpgroups)
                                      (an erf-GELU is 32 instructions an element: exposed unless PP)
                 + split-k (SPLITK > 1): the partial tile written; the last split's reads of all
                 of them and splitk_overhead_us are added once (t_reduce, its critical path);
                 as a cluster (CL = 1) no partial in global memory: the peers' tiles through shared
                 memory and two cluster barriers (`split_terms`)
    TMA stores (TS = 1): a warpgroup stages its tile and hands it to the TMA, which writes it while the
                 warpgroup starts its next tile, so of every tile but the block's last only
                 (1 - TS_HIDDEN) of the bytes term stays on the critical path (t_store); the output's map
                 adds one fence before the first copy (MAP_FENCE_US, t_fill)
    t_fill     = load_latency · (1 + k-blocks the ring cannot cover)   first tile of each block
                 + 128·(BM + BN/CLUSTER) / (l2_bandwidth / SMs)
                                      the first k-block's bytes: every SM asks for its first stages at
                                      once, so they cross L2 at the SM's share (a cluster pulls half of
                                      B, multicast to both CTAs: its first stage lands sooner)
    t_l2_all   = (every work unit's k-blocks x 128·(BM + BN/CLUSTER) + M·N·(bytes stored and read per output
                 element)) / l2_total          [Note: the L2's whole traffic]; 0 where the profile has no l2_total
    t          = launch + t_fill + max(t_tiles + t_reduce, t_dram, t_l2_all) x (1 + lockstep if CLUSTER = 2)
                 + CLUSTER_US (CLUSTER = 2: what a launch of clusters costs beyond that; 0 measured since
                 the exit's cluster barrier gave way to the producer tail, codegen/gemm_wgmma.py)
    [Note: a cluster pair in lockstep]
                 cluster_pace slows a pair's k-blocks, but where a tile's epilogue or the DRAM stream bounds
                 the kernel (ping-pong tiles with a residual epilogue, memory-bound 1x1 convolutions) the
                 k-blocks are not on the critical path and a pair was predicted 0.2-1.2% faster than the
                 same tiles unclustered, by its first stage. The pair still waits for each other's stages
                 through the whole walk, so the profile's `cluster_lockstep` (0 unless measured) scales the
                 walk or the stream. Fitted on the H200 (h200.json: 0.02) from session 29's `aicfc tune` of
                 ResNet-50 B32 (benchmarks/results/tune_resnet50_b32_session29_h200.json): of 41 schedules
                 timed both clustered and not, 40 ran slower clustered (1.00-1.14x, median 1.02), where the
                 model had 15 of the 41 the right way round; with 0.02, 40. Measured on the plans (session 38,
                 benchmarks/results/cluster_lockstep_session38_h200.txt): BERT-base B8 S512's twelve FFN1
                 GEMMs unclustered, 2541.3 -> 2486.5 us; ResNet-50 B32's seven stage-1/2 GEMMs 822.8 -> 815.1
                 (alone: k7/k10 -0.6 us each, k6 -0.35, k19/k22/k25 +0.4 each, and k13 +2.6: unclustered it
                 takes 64x64 tiles, which tie with 64x128 under its DRAM bound and measured 25.0 against 22.4);
                 MobileNetV2 B32 491.4 -> 492.1.
                 On an H100 (sm_90's profile) the pairs that lose are the ones whose tensor work does not bound
                 them: session 74's `aicfc tune` (benchmarks/results/tune_k9_session74_h100.json) timed ResNet-50
                 B32's stage-3 reduce GEMMs (DRAM-bound by a hair) 10.0 us as the pair the planner picked against
                 8.6-8.8 alone. Session 75 A/B'd the plans (benchmarks/results/cluster_lockstep_session75_h100.txt,
                 7 alternating rounds each): the lockstep on every pair moved ResNet-50 B32's GEMMs off pairs,
                 962.6 -> 937.5 us, but also BERT-base B8 S512's compute-bound ones (128x192 cooperative tiles,
                 64x128 ping-pong), 2629.9 -> 2675.4 us, and GPT-2 B8 S512's alike, 1952.5 -> 1950.6. So the
                 profile has two fractions: `cluster_lockstep` where the pair's tensor work (per_sm x KT x t_mma)
                 is under its DRAM stream or the L2's whole traffic, `cluster_lockstep_compute` where it outlasts
                 them (`lockstep`). sm_90: 0.02 and 0. Against sm_90 without either (same file, call 3): ResNet-50
                 B32's 23 moves 952.8 -> 931.0 us, MobileNetV2 B32's 12 540.9 -> 537.4, EfficientNet-B0 B32's 10
                 1018.0 -> 1023.4 and, in a second A/B (call 4, 9 rounds), 1017.7 -> 1018.0; BERT-base, GPT-2 and a
                 2-layer Llama at B8 S512 keep every schedule;
                 h200: 0.02 and 0.02 (session 38's FFN1 measurement above: on the H200 those pairs lose). l2_total_gbs
                 (9500 on an H100 by session 41's method) alone moved three of ResNet-50's GEMMs onto pairs and no
                 plan (964.7, 2623.8, 1946.5 us against the same bases): not in sm_90's profile.
    cluster scheduling: CLUSTER = 2 runs CTAS = 2·min(pairs, SMs/2) CTAs (a cluster needs two SMs
                 of one GPC: 66 clusters on 132 SMs; cuOccupancyMaxActiveClusters said 66 on the
                 H100 for the 128x192 and 128x256 tiles) and a CTA walks ceil(pairs / clusters)
                 tiles, so the wave quantization counts pairs
    t_tiles    = ceil(tiles / CTAS) · (KT · t_kblock + t_epilogue)
                 ping-pong (PP): ceil(tiles / CTAS) · max(KT · t_kblock, t_epilogue) + t_epilogue
    t_dram     = (every operand once + the output) / (dram_bandwidth · eff.dram)
                 + re-reads of A (B) past L2 when the raster's working set does not fit

[Note: the L2's whole traffic]
t_l2 charges each SM its share of the L2 for its own boxes; the L2 serves every SM's boxes, the epilogues'
stores and the residual's reads at once, and where small tiles re-read a long operand that sum binds first.
ResNet-50 B32's stride-2 projection (25088 x 256 -> 512, A read from 56x56 rows) on 64x64 ping-pong tiles
pulls A eight times: 205 MB of boxes and 26 MB of stores. Under ncu (session 41, an H200,
benchmarks/results/l2_total_session41_h200.txt) 226 MB crossed the L2 in 24.4 us at 85% of its peak, and the
kernel measured 25.1 us alone where the model had 20.5 (its DRAM stream); 64x128 tiles measured 21.4 and
128x128 21.1. l2_total (profile `l2_total_gbs`) is 10.8 TB/s in the h200 profile: the median of lts__t_bytes over
ncu's own L2 percentage on eight ResNet-50 kernels (9.3-12.7 TB/s). A profile without it has no such bound: sm_90's
(an H100, the same die) has none, though session 74 measured 9.5 TB/s there by the same method (six kernels, 6.8-10.4
TB/s, benchmarks/results/ncu_resnet50_b32_session74_h100.txt): it moves three of ResNet-50 B32's GEMMs (25088 x 384 ->
512, the two 1568 x 2048 -> 512) to cluster pairs, and A/B'd alone on an H100 (session 75) it moved no plan by more
than 0.3% ([Note: a cluster pair in lockstep]). The term counts every box as read: boxes that many
CTAs request at once can be merged on the way (the stage-4 1568 x 2048 -> 512 GEMM's 80 MB of boxes showed as
54 MB), so it overcounts those and binds only where nothing else does. Re-ranked on the stored tunes (benchmarks/tune_rerank.py, session 29's report of all of
ResNet-50 B32 and session 40's of its below-bar kernels) it moves that projection alone, to 64x128 (22.9 us
there against 23.1, and 22.8 against 25.2); with the L2's 10 TB/s it also moved three stage-2 GEMMs to slower
tiles (8.7 -> 9.4-9.6 us), with 11.5 TB/s nothing else either. Planned with it (session 41, an H200, the same
results file): the projection alone 25.0 -> 21.4 us, at its bar (85% of the copy bandwidth); the plan replayed
796.1 us against 803.9 with it pinned back (9 alternating rounds, the same bits); BERT-base, GPT-2 and a 2-layer
Llama at B8 S512 keep every schedule.

n_eff(BN): wgmma issues one m64nBNk16 instruction per 64 x BN x 16 block; the instruction's
fixed issue cost is a larger share of a narrow one (WGMMA_ISSUE_CYCLES against BN/2 cycles of
tensor work per SM sub-partition), unless two warpgroups issue at once ([Note: two issuing
warpgroups]). Coefficients come from the profile (`eff.wgmma_gemm`,
`wgmma_epilogue_us`, default EPILOGUE_US); `aicfc tune` measures them.
"""
from __future__ import annotations

import math
from typing import Mapping

from aicfc.codegen import gemm, gemm_wgmma
from aicfc.ir.memo import last_by_identity
from aicfc.ir.types import ITEMSIZE
from aicfc.planner.hardware import l2_share_gbs

SPLITK_OVERHEAD_US = 4.0   # the last split's fence, ticket and reduction start (profile: splitk_overhead_us)
STREAMK_SYNC_US = 2.0      # a stream-k part's fence before it counts in, and the tail's wait ([Note: stream-k's terms])
# k-splits as a cluster (CL = 1): what one SM reads of its peers' shared memory, GB/s, and the two cluster barriers
# with the ring's hand-over (profile: dsmem_gbs, cluster_split_sync_us). Fitted with [Note: the TMA's share of L2]
# (session 26, an H200): 0.5 us and 150 GB/s called 32 of the 34 schedule pairs right, 1.0 and 100 33.
DSMEM_GBS = 100.0
CLUSTER_SPLIT_SYNC_US = 1.0
TMA_PORT_GBS = 130.0       # what one SM's TMA loads take in, GB/s (profile: tma_port_gbs; as cost_conv_wgmma's)
# Thread-instructions of epilogue a warpgroup retires per us per SM: measured on the H200 with erf-GELU
# epilogues (35 instructions an element): a ping-pong 128x128 tile's took about 9.5 us (60e3/us), a
# cooperative 128x256 tile's on two warpgroups about 13 us (88e3/us). Far below the issue rate: the
# epilogue's loads and conversions leave its few warps waiting. Profile: wgmma_epilogue_rate.
EPILOGUE_RATE = 60e3
# Two cooperative warpgroups retire a tile's epilogue this much faster than one. sqrt(2) from the H200's register
# epilogue; on the H100 with the staged one, BERT's FFN1 (4096x768x3072 + bias + erf-GELU, 128x256 tiles, 3 an SM)
# measured 84.1 us cooperative against 32.2 for the plain GEMM: 17 us a tile for 128x256x35 instructions, 67e3/us
# (benchmarks/results/gemm_tma_store_session7_h100.txt). Ping-pong measured 69.0 us.
COOP_EPILOGUE_SCALE = 1.12
STORE_OPS = 3              # per output element: the conversion, the shared store, the address
EPILOGUE_US = 0.3          # fixed cost of a tile's epilogue: the wait, address arithmetic, store issue
WGMMA_ISSUE_CYCLES = 8     # tensor-pipe cycles an m64nNk16 loses to its issue, against N/2 of work
TMA_LATENCY_US = 1.0      # a TMA box's round trip from DRAM under load (profile: tma_latency_us)
# CLUSTER = 2, measured on an H100 (fp16, graph-replayed, 2 rounds; benchmarks/results/gemm_cluster_h100.txt):
# 128x192 tiles on 4096x3072x768 took 31.7 us alone, 35.9 us clustered with 3 stages and 32.0 with 4. Three
# stages lose about 0.09 us a k-block: the release across SMs adds about 0.26 us to the round trip the ring
# covers (profile: cluster_release_us). A fixed ~1.7 us a launch that those kernels also paid was the exit's
# cluster barrier (its release semantics waited for the epilogue's stores); with the producer tail instead
# (benchmarks/results/gemm_wgmma_h100_session5.txt) 4096x768x768 took 10.46 us clustered (4 stages) against
# 10.88 alone, 4096x3072x768 29.8: nothing fixed is left to charge (profile: cluster_overhead_us).
CLUSTER_RELEASE_US = 0.26
CLUSTER_US = 0.0
EFF_DEFAULT = 0.85         # eff.wgmma_gemm when the profile has none
# The output's map (TS = 1), a kernel's third: fenced in global memory, three fences measured 11.07-11.15 us against
# none 10.37-10.42 on 4096x768x768 (H100, 3 rounds each), about 0.25 us each. The launch overhead was fitted on
# kernels with two maps, so only the third is charged. In constant memory ([Note: TMA maps in constant memory] in
# codegen/tma.py) two maps measured the same as two fenced ones; the third is charged alike.
MAP_FENCE_US = 0.25
# TMA stores (TS = 1), H100, fp16, 3 rounds each (benchmarks/results/gemm_tma_store_session7_h100.txt): 4096x768x3072
# (128x256 tiles, 3 an SM) 31.9-33.3 us against 33.1-33.8 staged: about 0.8 us for two stores of 0.87 us each left
# under the next tile, less the fence: about half of a store's bytes leave the critical path. One tile an SM
# (4096x768x768) gains nothing and pays the fence: 10.4 us (no fences) against 10.2-10.5.
TS_HIDDEN = 0.5
JOIN_US = 0.1              # a joined product's wait: its k-steps issued back to back, then waited for once
# [Note: stores from the registers]
# An epilogue without staging (OUT = 0) stores each thread's column pairs from the accumulator's registers: a warp's
# store covers 8 rows with 16 bytes each, half of a 32-byte sector, for a 16-bit output (a whole one for fp32). Timed
# by `aicfc tune` on an H200 (benchmarks/results/tune_below_bar_session40_h200.txt, tune_resnet50_b32_session29_h200.txt)
# and an H100 (tune_h100_session74.txt), the same tile with OUT = 0 ran 1.3-1.6x the staged one on ResNet-50's
# memory-bound 1x1 GEMMs (M = 6272-100352, N = 128-512: 10.7 us more on 25088x384x512, 12.3 on the H100), where the
# model had them within 0.4 us: it charged the half sectors twice the bytes at the SM's L2 share and hid them under
# the other warpgroup's k-blocks. They are neither: a tile's register stores go at about 13 GB/s an SM (fitted on
# those four shapes: 0.86-1.16 of their times) and hold the SM's port to the L2, so under ping-pong they lengthen the
# other warpgroup's loads too (t_port) unless its k-blocks wait on the tensor cores. Where the epilogue also reads a
# residual element by element (1568x512x2048 + residual, 128x128 ping-pong: 12.2 us with OUT = 0 against 11.0 staged,
# predicted 18.7 and 11.6 under the H200's profile) the register stores cost less than this term says (0.65 of it):
# not understood; the staged form is still the faster and the predicted faster there.
REG_STORE_GBS = 13.0     # GB/s an SM (profile: wgmma_reg_store_gbs)
# [Note: the residual's round trip]
# RS = 1 copies the tile's residual into its staging when the warpgroup's turn begins ([Note: residual through the
# staging] in codegen/gemm_wgmma.py) and waits for it before the epilogue: one DRAM round trip (tma_latency_us) from
# the copy, of which the tile's k-blocks cover their own time. A GEMM of one k-block a tile covers almost none, so
# each tile waits; under ping-pong the other warpgroups' turns run meanwhile, so a tile costs the SM the wait over
# NWG. The model had no such term: ResNet-50 B32's stage-1 expansions with the shortcut (100352 x 64 x 256, timed by
# `aicfc tune` on an H100, benchmarks/results/tune_k9_session74_h100.txt) were predicted 42.7 us on 64x64 tiles and
# on 64x128 ones (both at the DRAM's bound), which measured 54.3 and 44.7: the planner took the small tiles. With the
# wait, 58.7 and 42.8. Over the 228 candidates that H100 measured this session (tune_*_session74_h100.txt) 173
# predictions are within [0.8, 1.25] (155 without the wait, 147 also without [Note: stores from the registers]); over
# session 40's 528 on an H200 (tune_resnet50_b32_below_bar_session40_h200.json) 396 with or without it (358 before
# the stores' term).


def stream_k(tiles: int, kt: int, ctas: int, bm: int, bn: int, t_kblock: float, t_epi: float, l2_sm: float,
             hw) -> tuple[float, float, float]:
    """Stream-k (STREAM = 1: every block an even share of all tiles x kt k-blocks, codegen/gemm_wgmma.py):
    (the busiest block's time: its share of k-blocks, the epilogues it runs and the partial tile it
    publishes; its share in tiles; the tail's reduction on the critical path).

    [Note: stream-k's terms]
    Every SM streams boxes at once, so a k-block costs at least its boxes' share of the L2's whole
    traffic (all CTAs' 128·(BM + BN) bytes over `l2_total_gbs`, or the L2's bandwidth where the profile
    has no total). A block publishes at most one fp32 partial tile ([Note: the tail finishes] in
    codegen/gemm_wgmma.py) and then waits for its stores before counting in (`streamk_sync_us`, with
    the tail's wait for the others); the tail reads the parts - 1 others back. Fitted on an H100
    (session 76, benchmarks/results/stream_k_session76_h100.txt): ResNet-50 B32's 14x14x256 3x3 pinned
    to 128x128 stream-k tiles on 132 CTAs stamped (median block) its k-blocks at 0.39 us each where the
    98 data-parallel tiles ran 0.32 (132 x 32 KB a k-block: 10.6 TB/s through the L2), its partial's
    publication 2.3 us, the wait for the other parts 0.5, their partial read back 1.3, its epilogue 0.8."""
    share = math.ceil(tiles * kt / ctas)
    l2_total = hw.data.get("l2_total_gbs") or hw.l2_bandwidth_gbs
    t_kb = max(t_kblock, gemm_wgmma.ROW_BYTES * (bm + bn) * ctas / (l2_total * 1e3))
    t_share = share * t_kb + math.ceil(tiles / ctas) * t_epi
    parts = gemm_wgmma.stream_parts(tiles, kt, ctas)
    if parts == 1:
        return t_share, share / kt, 0.0
    part = bm * bn * 4.0 / l2_sm
    return t_share + part, share / kt, (parts - 1) * part + hw.data.get("streamk_sync_us", STREAMK_SYNC_US)


def tma_share_gbs(hw, ctas: int, units: int = 1) -> float:
    """What one of `ctas` CTAs' TMA loads take from L2, GB/s, each CTA running `units` work units.

    [Note: the TMA's share of L2]
    Where the profile has `tma_l2_gbs` (what the TMA loads of all SMs together draw from L2) and each CTA
    runs one work unit, the CTAs split that, each up to its SM's port (`tma_port_gbs`, default the
    convolutions' TMA_PORT_GBS); otherwise the L2's even share (hardware.l2_share_gbs). Fitted on an H200
    in session 26 (benchmarks/results/split_cluster_session26_h200.txt) on 238 wgmma kernel runs
    measured alone (ResNet-50 B1 and B32, a 4-layer Llama prefill, each under two schedules) and
    re-costed: ResNet-50 B32's 1x1 GEMMs on 98 CTAs pulled about 125 GB/s an SM, the prefill's QKV
    GEMM on 128 CTAs about 99, i.e. 12.2-12.7 TB/s in all, each SM at most ~130. With 12500 and 130
    and the k-split cluster terms below, of the 34 kernels whose two schedules differ the faster is
    predicted faster for 33 (19 with the even share of the profile's 10 TB/s); 75% of the 238 fall in
    [0.8, 1.25] of their prediction (67%).
    One unit a CTA, or a grid bound by DRAM without a residual: a persistent grid that walks several tiles
    keeps the even share where its tensor work outlasts its DRAM bytes or its epilogue reads a residual
    (`wgmma_terms` asks with units = 1 when t_dram >= the busiest SM's tensor time and there is no residual).
    Given the larger share always, BERT-base's and GPT-2's B8 S512 QKV and FFN GEMMs (compute-bound) moved
    to ping-pong tiles whose plans replayed 1.6% and 2.3% slower (session 26, same call, 7 alternating
    rounds). The memory-bound ones draw it: ResNet-50 B32's stage-2 1x1 reduce GEMMs (25088x512x128), 64x128
    ping-pong tiles 3 a CTA on 132 CTAs, measured 7.58-7.95 us (session 32, an H200,
    benchmarks/results/tma_share_session32_h200.txt), 0.73 of the even share's prediction (10.57) and
    0.79-0.83 of this one's (9.56), against 9.54-9.63 for the 256x128 tiles on 98 CTAs the even share
    picked: the B32 plan replayed 813.7 us against 819.1 (7 alternating rounds), and no transformer GEMM's
    pick moved. Given to memory-bound grids with a residual too, MobileNetV2 B32's projections with their
    block's residual (1x1 to 24-32 channels, RS = 1) moved to tiles that measured slower, though both were
    mispredicted already (56x56x144->24: 64x64 ping-pong 23.9 us against 128x64 in clusters 17.5, predicted
    11.0 and 11.1; two 28x28 ones from mma tiles to wgmma, 6.2-6.4 against 5.7-5.8): its plan replayed 654.0
    us against 644.7, EfficientNet-B0 B32's 1158.9 against 1149.2; with the fence 645.5 against 642.5 and
    1139.7 against 1140.0. So the rule is still a fence around what was measured (whether compute-bound
    persistent grids and residual epilogues draw the share too is open), not a finding about the hardware."""
    total = hw.data.get("tma_l2_gbs")
    if total is None or units > 1:
        return l2_share_gbs(hw, ctas)
    return min(total / max(1, min(ctas, hw.sm_count)), hw.data.get("tma_port_gbs", TMA_PORT_GBS))


def split_terms(p: Mapping, bm: int, bn: int, l2_sm: float, hw) -> tuple[float, float]:
    """(what a work unit's epilogue adds, the reduction on the critical path) of SPLITK > 1.
    Through scratch (CL = 0): every split writes its fp32 partial tile; the last to arrive reads all
    of them back after a fence and a ticket (splitk_overhead_us), once per tile. As a cluster (CL = 1,
    [Note: k-splits as a cluster] in codegen/gemm_wgmma.py): the other splits leave their tiles in
    their own shared memory, the first reads them over distributed shared memory (profile
    `dsmem_gbs`, GB/s into one SM) between two cluster barriers (`cluster_split_sync_us`)."""
    sk = p.get("SPLITK", 1)
    if sk <= 1:
        return 0.0, 0.0
    tile = bm * bn * 4.0
    if p.get("CL"):
        write = tile / (hw.smem_bandwidth_gbs_per_sm * 1e3)
        read = (sk - 1) * tile / (hw.data.get("dsmem_gbs", DSMEM_GBS) * 1e3)
        return 0.0, write + read + hw.data.get("cluster_split_sync_us", CLUSTER_SPLIT_SYNC_US)
    return tile / l2_sm, tile * sk / l2_sm + hw.data.get("splitk_overhead_us", SPLITK_OVERHEAD_US)


def cooperative(p: Mapping) -> bool:
    """Two or more consumer warpgroups on one tile at once (NWG > 1 without ping-pong)."""
    return p.get("NWG", 1) > 1 and not p.get("PP")


def n_eff(bn: int, p: Mapping | None = None) -> float:
    """The share of an SM's tensor rate a k-block's wgmma instructions keep (module doc).

    [Note: two issuing warpgroups]
    One warpgroup issuing m64nBNk16 leaves the tensor pipe idle WGMMA_ISSUE_CYCLES an instruction
    against BN/2 cycles of work. Two cooperative warpgroups (NWG = 2, not ping-pong) run their
    k-loops at the same time over the same stages, so one's issue falls under the other's
    instruction and nothing is lost: n_eff = 1. Ping-pong's warpgroups take the k-loops in turn
    and a lone warpgroup (NWG = 1, or MI = 2: two instructions of one issuer) keep the loss.
    Measured (ResNet-50 B32 on an H200, session 29's `aicfc tune`,
    benchmarks/results/tune_resnet50_b32_session29_h200.json, each candidate alone): the stage-3
    3x3 convolutions (6272 x 256, K 2304, one tile a CTA on 98 CTAs) ran 128x128 tiles on two
    cooperative warpgroups in 14.37-14.45 us and 64x256 tiles on one in 14.89-15.00, where
    n_eff(128) = 0.89 had predicted the first 0.3 us slower; one warpgroup of two m64n128 (MI = 2)
    15.18-15.95. Over that report's 607 timed wgmma candidates re-costed (session 38), the 119
    cooperative ones measured 0.914 of their prediction (geometric mean) and 0.947 without the
    loss; 91% fall in [0.8, 1.25] (89%); the others are unchanged. Planned with it (session 38,
    an H200, benchmarks/results/coop_issue_session38_h200.txt) ResNet-50 B32's five stage-3 3x3
    convolutions and the stride-2 one before them, and its five 1024 -> 256 reduce GEMMs, move to
    128x128 on two cooperative warpgroups: alone 13.97-14.77 us against 14.30-14.52, and 7.74-7.81
    against 7.92-7.97; the plan replayed 810.8 us against 824.3 (9 alternating rounds).
    EfficientNet-B0 B32 (6 GEMMs moved) 953.4 against 957.8, MobileNetV2 B32 (3) 493.6 against
    493.9; BERT-base, GPT-2 and the B1 CNNs keep every schedule."""
    if p is not None and cooperative(p):
        return 1.0
    return (bn / 2) / (bn / 2 + WGMMA_ISSUE_CYCLES)


def wgmma_terms(k, p: Mapping, types: Mapping, hw, io_bytes: float, latency: float) -> dict[str, float]:
    c, m, n, kk, batch = gemm.dims(k)
    bm, bn, bkk, st = p["BM"], p["BN"], p["BK"], p["STAGES"]
    cl, sk = p.get("CLUSTER", 1), p.get("SPLITK", 1)
    sms = hw.sm_count
    unit = {"f16": "fp16_tc", "bf16": "bf16_tc", "tf32": "tf32_tc"}[p["dtype"]]
    eff = hw.efficiency.get("wgmma_gemm", EFF_DEFAULT) * n_eff(bn, p)
    sm_rate = hw.peak_tflops[unit] * 1e6 / sms * eff                       # flops per us per SM
    # bytes per us per SM that the TMA's loads take from L2 ([Note: the TMA's share of L2])
    tiles_m, tiles_n, tiles = gemm_wgmma.tiles(k, p)
    if cl > 1:   # a cluster takes a pair of tile rows; its CTAs one tile each
        per_sm = math.ceil(gemm_wgmma.pairs(k, p)[1] / (p["CTAS"] // 2))
    else:
        per_sm = math.ceil(tiles * sk / p["CTAS"])
    row = gemm_wgmma.ROW_BYTES
    t_mma = 2.0 * bm * bn * bkk / sm_rate
    ktiles = gemm_wgmma.kt_per(p, kk)            # k-blocks of one work unit
    t_tensor = per_sm * ktiles * t_mma           # the busiest SM's tensor work
    # DRAM: each operand once; past L2, B is read again by every group of GROUP tile rows (A once)
    a_bytes, b_bytes = types[c.a.buffer].nbytes, types[c.b.buffer].nbytes
    groups = math.ceil(tiles_m / gemm_wgmma.GROUP)
    rereads = (groups - 1) * b_bytes if a_bytes + b_bytes > hw.l2_bytes and not p.get("BRES") else 0.0
    t_dram = (io_bytes + rereads) / (hw.dram_bandwidth_gbs * 1e3 * hw.efficiency["dram"])
    extra = sum(ITEMSIZE[types[b].dtype] for b in gemm.extra_reads(k, types))
    # [Note: the TMA's share of L2]: a persistent grid whose bytes outlast its tensor work, its epilogue
    # reading no residual, takes the share one-unit grids were fitted at
    drawn = t_dram >= t_tensor and not extra
    share = tma_share_gbs(hw, p["CTAS"], 1 if drawn else per_sm)
    l2_sm = share * 1e3
    t_smem = row * (bm + bm // 64 * bn) / (hw.smem_bandwidth_gbs_per_sm * 1e3)
    sm_in = hw.data.get("sm_ingress_gbs", share) * 1e3                # bytes per us into one SM
    # [Note: B resident in shared memory]: B's k-blocks cross only with the block's first tiles, one per column held
    fresh = min(1.0, p["BRES"] // ktiles / per_sm) if p.get("BRES") else 1.0
    t_load = max(row * (bm + bn * fresh) / sm_in, row * (bm + bn * fresh / cl) / l2_sm)
    # STAGES - 1 k-blocks in flight must cover one TMA round trip (and, clustered, the release across SMs)
    trip = hw.data.get("tma_latency_us", TMA_LATENCY_US) + (hw.data.get("cluster_release_us", CLUSTER_RELEASE_US) if cl > 1 else 0.0)
    t_latency = trip / (st - 1)
    # a cluster's pair advances at the pace of its slower CTA: every stage's B half comes from the peer, whose
    # producer refills it only once both CTAs freed it (profile `cluster_pace`, a fraction of the k-block)
    pace = 1.0 + (hw.data.get("cluster_pace", 0.0) if cl > 1 else 0.0)
    t_kblock = max(t_mma, t_smem, t_load, t_latency) * pace
    out_bytes = sum(ITEMSIZE[types[s].dtype] for s in k.own_stores)
    # a quad of threads stores 4 column pairs of a row from registers: 16 bytes of a 32-byte sector for
    # 16-bit outputs (each sector written twice), a whole one for fp32; staged stores write whole sectors
    half = not p.get("OUT") and any(ITEMSIZE[types[s].dtype] < 4 for s in k.stores)
    # [Note: stores from the registers]: those half sectors go at their own rate, and hold the SM's port to the L2
    # that the next tile's loads need
    t_port = bm * bn * out_bytes / (hw.data.get("wgmma_reg_store_gbs", REG_STORE_GBS) * 1e3) if half else 0.0
    t_store = t_port if half else bm * bn * out_bytes / l2_sm
    # the residual's bytes: read by the epilogue, or (RS) copied into the staging under the tile's k-blocks,
    # whose loads they share the SM's L2 port with ([Note: residual through the staging])
    t_res = bm * bn * extra / l2_sm
    t_epi = t_store + (0.0 if p.get("RS") else t_res) + hw.data.get("wgmma_epilogue_us", EPILOGUE_US)
    # the epilogue's arithmetic on the tile's consumer warps, at EPILOGUE_RATE thread-instructions per us
    # per SM for one warpgroup, COOP_EPILOGUE_SCALE times that for two cooperative ones
    issue = hw.data.get("wgmma_epilogue_rate", EPILOGUE_RATE) * (COOP_EPILOGUE_SCALE if cooperative(p) else 1.0)
    t_epi += bm * bn * (epilogue_ops(k, types) + STORE_OPS) / issue
    # [Note: a reduce joined into the epilogue] (passes/join_reduce.py): the joined GEMM's product over the tile, its
    # epilogue and its staged TMA stores on the same warps, after the tile's own; its weight crosses once a block,
    # before the first tile
    n2 = p.get("J2", 0)
    if n2:
        t_epi += (2.0 * bm * bn * n2 / sm_rate + bm * n2 * 2 / l2_sm + JOIN_US
                  + bm * n2 * (joined_epilogue_ops(k, types) + STORE_OPS) / issue)
    t_copy = t_res if p.get("RS") else 0.0
    # [Note: the residual's round trip]: the copy lands one DRAM round trip after the tile's turn began; what the
    # tile's k-blocks leave of it, the epilogue waits (under ping-pong, shared with the other warpgroups' turns)
    t_wait = max(0.0, hw.data.get("tma_latency_us", TMA_LATENCY_US) - ktiles * t_kblock - t_copy) if p.get("RS") else 0.0
    if p.get("PP"):
        t_wait /= p["NWG"]
    # split-k: the partial tiles and their reduction, on the critical path once per tile (`split_terms`)
    t_part, t_reduce = split_terms(p, bm, bn, l2_sm, hw)
    t_epi += t_part
    # the first k-block waits for its bytes too: every SM asks for its first stages at once, so they cross L2 at
    # the SM's share (a cluster pulls its half of B, multicast to both)
    t_first = row * (bm + bn / cl) / l2_sm + (n2 * bn * 2 / l2_sm if n2 else 0.0)
    t_fill = latency * (1 + max(0.0, math.ceil(t_load * ktiles / max(t_kblock * ktiles, 1e-9)) - 1)) + t_first
    # TMA stores (cooperative tiles only: gemm_wgmma.space): all but the last tile's leave TS_HIDDEN of their bytes
    # under the next tile
    hidden = TS_HIDDEN * t_store if p.get("TS") else 0.0
    if p.get("TS"):
        t_fill += MAP_FENCE_US
    if p.get("STREAM"):
        # stream-k: the busiest block's share of k-blocks, its epilogues and partial tiles (`stream_k`)
        t_tiles, per_sm, t_reduce = stream_k(tiles, ktiles, p["CTAS"], bm, bn, t_kblock, t_epi, l2_sm, hw)
    elif p.get("PP"):
        # ping-pong: a warpgroup's epilogue runs under the other's k-blocks; the last one stays exposed
        t_tiles = per_sm * max(max(ktiles * t_kblock, ktiles * t_load + t_port) + t_copy, t_epi + t_wait) + t_epi + t_wait
    else:
        t_tiles = per_sm * (ktiles * t_kblock + t_copy + t_wait + t_epi - hidden) + hidden
    t_cluster = hw.data.get("cluster_overhead_us", CLUSTER_US) if cl > 1 else 0.0
    # [Note: the L2's whole traffic]: every k-block's boxes, the output's stores and the residual's reads cross
    # the L2 together, at its aggregate bandwidth
    outputs = m * n * math.prod(e for _, e in batch)
    l2_total = hw.data.get("l2_total_gbs")      # a profile without it has no such bound
    t_l2_all = (tiles * sk * ktiles * row * (bm + bn * fresh / cl) + outputs * (out_bytes + extra + 2.0 * n2 / n)) \
        / (l2_total * 1e3) if l2_total else 0.0
    # the pair's whole walk of tiles (or its stream, where DRAM bounds it) goes at its slower CTA's pace (profile
    # `cluster_lockstep`, a fraction; `cluster_lockstep_compute` where the tensor work bounds the kernel:
    # [Note: a cluster pair in lockstep])
    lock = 1.0 + (lockstep(hw, t_tensor >= max(t_dram, t_l2_all)) if cl > 1 else 0.0)
    time = hw.launch_overhead_us + t_fill + max(t_tiles + t_reduce, t_dram, t_l2_all) * lock + t_cluster
    issued = 2.0 * tiles * bm * bn * ktiles * bkk
    return {"time_us": time, "issued": issued, "dram": io_bytes + rereads,
            "t_compute_us": t_tensor, "t_smem_us": per_sm * ktiles * t_smem,
            "t_l2_us": per_sm * ktiles * t_load, "t_l2_all_us": t_l2_all, "t_dram_us": t_dram,
            # the k-blocks as charged: the slowest rate, or the TMA's round trip over STAGES - 1, times a pair's pace
            "t_latency_us": per_sm * ktiles * t_latency, "t_kblocks_us": per_sm * ktiles * t_kblock,
            "t_reduce_us": t_reduce, "pingpong": 1.0 if p.get("PP") and not p.get("STREAM") else 0.0,
            "t_epilogue_us": per_sm * t_epi,
            "t_pipeline_us": t_fill, "tiles_per_sm": per_sm, "wave_eff": tiles * sk / (per_sm * p["CTAS"]),
            "n_eff": n_eff(bn, p), "launch_us": hw.launch_overhead_us, "blocks": p["CTAS"], "blocks_per_sm": 1,
            "parallel_eff": min(tiles, sms) / sms, "stages": st, "cluster": cl, "t_cluster_us": t_cluster,
            "lockstep": lock}


def lockstep(hw, tensor_bound: bool) -> float:
    """What a cluster pair's walk loses to its CTAs waiting for each other (a fraction): the profile's
    `cluster_lockstep`, or where the pair's tensor work outlasts its DRAM and L2 streams (`tensor_bound`),
    `cluster_lockstep_compute` (default the same) ([Note: a cluster pair in lockstep])."""
    if tensor_bound:
        return hw.data.get("cluster_lockstep_compute", hw.data.get("cluster_lockstep", 0.0))
    return hw.data.get("cluster_lockstep", 0.0)


@last_by_identity
def joined_epilogue_ops(k, types: Mapping) -> int:
    """`epilogue_ops` of the GEMM joined into `k`'s epilogue."""
    return epilogue_ops(gemm.joined_kernel(k), types)


@last_by_identity   # every candidate of a kernel asks, in a row
def epilogue_ops(k, types: Mapping) -> int:
    """Instructions of the absorbed epilogue per output element (`cost.instructions`, fast math
    where the policy has it); 0 for a bare contraction. A rotary map's: ROTARY_OPS, counted in
    its SASS (planner/cost_rotary.py): `instructions` would count its range tests as arithmetic
    and its two table reads as nothing."""
    if len(k.ops) < 2:
        return 0
    if gemm.rotary(k) is not None:
        from aicfc.planner.cost_rotary import ROTARY_OPS
        return ROTARY_OPS
    from aicfc.planner.cost import fast_math, instructions
    return instructions(k.ops[1].body, fast=fast_math(k, types))
