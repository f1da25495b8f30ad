"""Cost terms of split-KV attention (`codegen/attention_split.py`, unit `split` of the attention
family, `templates/attention_split.cu.j2`).

A decode step's attention moves little (one layer's K/V cache of a 1 B Llama is ~1.5 MB) and is
bound by latency: the blocks' chains of dependent steps, not bandwidth or issue. So the time is
that of one SM's blocks plus the combine:

    t_issue    = warp instructions of one key tile (scores: RT rows x D/8 steps of two shared
                 loads and 8 FMAs, the K row's load and conversion; the score expression; the
                 softmax's BN/32 values a row; P·V: NP pairs x BN/KS keys of two loads, one
                 conversion, two FMAs) x warps a scheduler / clock x ISSUE_SCALE + 3 barriers;
                 x STALL_WARPS / w where a scheduler holds w < STALL_WARPS warps (the block's and
                 its SM neighbours'): one warp's dependent instructions wait on each other
    t_tile     = TILE_LATENCY + m · t_issue      the tile's wait (cp.async, barriers) and then its
                                                 work: the next tile loads during this one, but
                                                 its wait does not hide this one's issue
    t_sched    = rounds · (FIXED + tiles · t_tile)   an SM's n = ceil(blocks / SMs) blocks in
                 rounds = ceil(n / blocks_per_sm), m = ceil(n / rounds) of them resident
                 together, sharing the SM's issue. FIXED = 3 round trips (the positions' read,
                 then Q and the first tile, the partial's publication with its fence and
                 ticket); 2 under PRE (the positions and the first tile read before the
                 dependent-launch wait, passes/fold_cache_writes.py, overlap the previous kernel)
    t_combine  = COMBINE (the ticket and the partials' first read) + SPLITS·R·(Dv + 2)·4
                 bytes read from L2 at an SM's share of its bandwidth. Fitted when the merge read
                 the partials in three dependent passes; since session 24 it reads them in one
                 where SPLITS <= 16 ([Note: the merge's reads at once] in codegen/attention_split.py),
                 and the decode attention measures 4.75 us alone against 5.07 predicted (0.94); 4.51-4.59
                 (0.89-0.91) since its new rows come with the query ([Note: the new rows with the query])
    t          = launch + max(t_sched + t_combine, t_dram)

CL = 1 ([Note: split attention as a cluster] in codegen/attention_split.py): each chunk pushes its
partial into the shared memory of the chunks that merge it (stores that ride in the cluster
barrier's release, not a round trip to L2 with a fence and a ticket) and the barrier's one phase
(CLUSTER_SYNC_US) is the whole combine; every chunk then merges its share of the pairs from its
own memory.

SPLITS trades the chunk's tiles (fewer with more splits) against the combine's reads and the
SMs' blocks (more with more splits, past one wave). ISSUE_SCALE, STALL_WARPS, TILE_LATENCY_US,
ROUND_TRIP_US and COMBINE_US are fitted (least squares on log time) to `aicfc tune` of the
decode attention alone on an H200 (benchmarks/results/tune_attention_split_session13_h200.txt:
8 and 64 K/V heads of 4 query rows over 768 live keys, 59 schedules, BN 32-128, 4 or 8 warps,
1-24 splits; tune's plain launches less the 0.88 us they add to the profile's graph timing of
the same kernel): 59 of 59 within [0.8, 1.25], mean squared log error 0.005. Before the fit
(the load latency for every round trip, max(issue, latency) a tile) the per-tile cost was 3-4x
short: measured, a tile of 64 keys costs 1.7 us at 8 warps and 2.2 at 4, not 0.43; every
schedule was predicted 1.7-3x fast, and the model picked 4 warps where 8 measured 10% faster.
"""
from __future__ import annotations

import math

from aicfc.codegen import attention_split
from aicfc.ir.types import ITEMSIZE

ISSUE_SCORE_STEP = 10     # a row's 8-element step of a score: two 16-byte shared loads, 8 FMAs
ISSUE_K_STEP = 10         # a key's 8-element step: one 16-byte shared load, 4 conversions of pairs
ISSUE_PV_KEY = 5          # a pair's key: P and V loads, one conversion, two FMAs
ISSUE_SOFTMAX = 14        # a row's value in the softmax: load, max, exp2, sum, store, shuffles shared
ISSUE_SCORE_EXPR = 8      # a score's expression beyond its own operations: index clamps, the row loop
BARRIERS = 3              # barriers a tile (plus a cp.async wait)
BARRIER_US = 0.04         # one barrier step (cost.SYNC_LATENCY_US)
# fitted (module docstring)
ISSUE_SCALE = 1.5         # the instruction counts above against the measured per-key slope
STALL_WARPS = 2.75        # warps a scheduler needs to issue back to back
TILE_LATENCY_US = 0.5     # a tile's wait: its cp.async group, the barriers between its phases
ROUND_TRIP_US = 1.0       # one of the block's dependent round trips (FIXED)
COMBINE_US = 0.4          # the ticket and the last block's first read of the partials
# CL = 1: the cluster's combine, one barrier phase whose release carries the pushes. `aicfc tune` of the 1 B
# Llama's decode attention on an H200 (session 45, benchmarks/results/attention_push_session45_h200.txt): 6 chunks of
# 128 keys 4.95 us as a cluster against 6.24 through the ticket (tune's plain launches); the pull form it replaced
# (two barriers, then a read of the peers' memory: 0.15 + 0.15 + 0.2) measured 5.15 (session 28).
CLUSTER_SYNC_US = 0.15    # barrier.cluster arrive (release) + wait (acquire) across the chunks' SMs


def clock_ghz(hw) -> float:
    """Instruction issue rate of one scheduler: the fp32 peak over SMs, 128 lanes, 2 FLOPs an FMA."""
    return hw.peak_tflops["fp32_simt"] * 1e3 / (hw.sm_count * 128 * 2)


def registers(rows: int, d: int, dv: int, p: dict, ops: int) -> int:
    """Scores' accumulators and one K step, the pairs' accumulators, addressing and loop state
    (MMA = 1: the Q fragments, the scores' and O's accumulators of MI row slices)."""
    tm = attention_split.thread_map(rows, dv, p)
    if p.get("MMA"):
        return tm["MI"] * (2 * d // 8 + tm["KW"] // 2 + dv // 2) + 40 + min(ops, 16)
    return tm["RT"] + 8 + 8 + 2 * tm["NP"] + p["BN"] // 32 + 40 + min(ops, 16)


# MMA = 1 ([Note: split attention on tensor cores] in codegen/attention_split.py): a warp's share of a tile.
# Fitted (grid search on the log error) to `aicfc tune` of the decode attention alone on an H200
# (benchmarks/results/tune_attention_mma_session19_h200.txt: 8 K/V heads of 4 query rows over 768 live
# keys, 23 MMA schedules, BN 64/128, 4 or 8 warps, 1-12 splits, 2-8 stages; tune's plain launches less
# 0.88 us): 23 of 23 within [0.8, 1.25], and the 34 SIMT schedules of the same run still 34 of 34. The
# stream is slow: a chunk of 768 keys in one block (SPLITS=1) ran 8.8-13 us however deep its ring, so
# one SM takes a chunk's cp.async bytes at about 30 GB/s, and few splits never pay.
MMA_ISSUE_EXPR = 12       # a score's expression beyond its operations, the row's decomposition and the key test
MMA_TILE_LATENCY_US = 0.6  # a tile's dependent chain: barrier, ldmatrix, the k-steps' mma, shuffles, exp2, P·V's mma
MMA_MERGE_US = 0.0        # the warps' (m, l, O) through shared memory after the key loop (fitted: hidden)
SM_STREAM_GBS = 30.0      # one SM's rate of a chunk's cp.async bytes


def mma_tile_us(rows: int, d: int, dv: int, p: dict, hw, logit_ops: int, per_round: int) -> tuple[float, float]:
    """(the tile's time, its issue) under MMA = 1: the chain or the issue of the block's warps, or the
    SM's stream of the tile's bytes (the load of one tile per STAGES - 1 round trips), whichever is longer."""
    tm = attention_split.thread_map(rows, dv, p)
    kw, mi = tm["KW"], tm["MI"]
    per_warp = ((kw // 16) * (d // 16) * (1 + 2 * mi) + mi * (kw // 8) * 4 * (logit_ops + MMA_ISSUE_EXPR)
                + mi * 2 * ((kw // 8) * 8 + 8 + (dv // 8) * 2) + (kw // 16) * (4 * mi + (dv // 16) * (1 + 2 * mi)))
    t_issue = ISSUE_SCALE * per_warp * per_round * math.ceil(p["warps"] / 4) / (clock_ghz(hw) * 1e3) + 2 * BARRIER_US
    tile_bytes = p["BN"] * (d + dv) * ITEMSIZE[p["dtype"]]
    t_load = max(ROUND_TRIP_US / (p["STAGES"] - 1), per_round * tile_bytes / (SM_STREAM_GBS * 1e3))
    return max(MMA_TILE_LATENCY_US + t_issue, t_load), t_issue


def split_attention_terms(nkv: int, rows: int, sk: int, d: int, dv: int, p: dict, bps: int, hw,
                          t_dram: float, logit_ops: int) -> dict[str, float]:
    """The time and its terms (module docstring) for `nkv` K/V heads of `rows` query rows each
    over `sk` keys, every key assumed live (the cost of a full cache; a step reads its live part)."""
    bn, splits, warps = p["BN"], p["SPLITS"], p["warps"]
    tm = attention_split.thread_map(rows, dv, p)
    tiles = attention_split.chunk(sk, splits, bn) // bn
    per_warp = (tm["RT"] * (d // 8) * ISSUE_SCORE_STEP + (d // 8) * ISSUE_K_STEP
                + tm["RT"] * (logit_ops + ISSUE_SCORE_EXPR)
                + math.ceil(rows / warps) * (bn // 32) * ISSUE_SOFTMAX
                + tm["NP"] * (bn // tm["KS"]) * ISSUE_PV_KEY)
    t_issue = ISSUE_SCALE * per_warp * math.ceil(warps / 4) / (clock_ghz(hw) * 1e3) + BARRIERS * BARRIER_US
    fixed = (2 if p.get("PRE") else 3) * ROUND_TRIP_US
    blocks = nkv * splits
    n = math.ceil(blocks / hw.sm_count)
    rounds = math.ceil(n / max(1, bps))
    per_round = math.ceil(n / rounds)
    stall = max(1.0, STALL_WARPS / (per_round * warps / 4))   # warps a scheduler: the SM's resident blocks'
    t_tile = TILE_LATENCY_US + per_round * t_issue * stall
    if splits == 1 or p.get("CL"):   # no partial to publish to L2: one round trip fewer
        fixed -= ROUND_TRIP_US
    if p.get("MMA"):
        t_tile, t_issue = mma_tile_us(rows, d, dv, p, hw, logit_ops, per_round)
        fixed += MMA_MERGE_US
    t_sched = rounds * (fixed + tiles * t_tile)
    if p.get("CL"):   # the pushes and one cluster barrier phase
        t_combine = CLUSTER_SYNC_US
    elif splits > 1:  # the ticket, then every chunk's partial read from L2 at an SM's share
        t_combine = COMBINE_US + splits * rows * (dv + 2) * 4.0 / (hw.l2_bandwidth_gbs * 1e3 / hw.sm_count)
    else:
        t_combine = 0.0
    t = hw.launch_overhead_us + max(t_sched + t_combine, t_dram)
    return {"time_us": t, "t_compute_us": t_sched, "t_dram_us": t_dram, "t_pipeline_us": fixed,
            "t_smem_us": 0.0, "t_tile_us": t_tile, "stall": stall,
            "t_issue_tile_us": t_issue,
            "t_combine_us": t_combine, "cluster_merge": float(bool(p.get("CL"))),
            "key_tiles": nkv * splits * tiles, "tiles_per_chunk": tiles,
            "blocks": blocks, "blocks_per_sm": bps, "launch_us": hw.launch_overhead_us}
