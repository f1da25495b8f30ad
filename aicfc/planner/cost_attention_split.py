"""Cost terms of split-KV attention (`codegen/attention_split.py`, unit `split` of the attention
family, `templates/attention_split.cu.j2`).

A decode step's attention moves little (one layer's K/V cache of a 1 B Llama is ~1.5 MB) and is
bound by latency: the blocks' chains of dependent steps, not bandwidth or issue. So the time is
that of one SM's blocks plus the combine:

    t_issue    = warp instructions of one key tile (scores: RT rows x D/8 steps of two shared
                 loads and 8 FMAs, the K row's load and conversion; the score expression; the
                 softmax's BN/32 values a row; P·V: NP pairs x BN/KS keys of two loads, one
                 conversion, two FMAs) x warps a scheduler / clock + 3 barriers
    t_tile     = max(t_issue, load latency)       double-buffered: tile j+1 loads during tile j
    t_block    = FIXED + tiles a chunk · t_tile   FIXED: the positions' read, then Q and the first
                                                 tile (two round trips), the partial's publication
                                                 with its fence and ticket (one); under PRE (the
                                                 positions and the first tile read before the
                                                 dependent-launch wait, passes/fold_cache_writes.py)
                                                 the first two overlap the previous kernel: Q and
                                                 the publication remain
    t_sched    = rounds · (FIXED + tiles · max(m · t_issue, load latency))   an SM's n = ceil(blocks
                 / SMs) blocks in rounds = ceil(n / blocks_per_sm), m = ceil(n / rounds) of them
                 resident together, sharing the SM's issue
    t_combine  = 2 load latencies (the fence, the partials' first read) + SPLITS·R·(Dv + 2)·4 bytes
                 read from L2 at an SM's share of its bandwidth
    t          = launch + max(t_sched + t_combine, t_dram)

SPLITS trades the chunk's tiles (fewer with more splits) against the combine's reads and the
SMs' blocks (more with more splits, past one wave). The coefficients are the profile's (load
latency, clock from the fp32 peak, L2 bandwidth), not yet fitted to a measurement of this
kernel: benchmarks/generate.py --profile reports measured against predicted for it. Measured, it
is under-predicted: a 1 B Llama's decode step at B1 (8 K/V heads of 4 query rows, 767 live keys
of 768, BN 64, SPLITS 12) ran 6.93-6.99 us alone on an H200 against 4.1 predicted
(benchmarks/results/decode_ab2_session10_h200.txt, base), and at B8 (BN 128, SPLITS 2) 17.5 us
on an H100 against 6.5 (generate_b8_profile_session6_h100.txt). At B1 the gap, 2.9 us, is
several dependent round trips more than FIXED and the combine count (the fence before the
ticket among them); at B8 it grows with the tiles, so the per-tile issue count is short too.
Refitting them needs timings of the kernel with its splits and tiles varied.
"""
from __future__ import annotations

import math

from aicfc.codegen import attention_split

ISSUE_SCORE_STEP = 10     # a row's 8-element step of a score: two 16-byte shared loads, 8 FMAs
ISSUE_K_STEP = 10         # a key's 8-element step: one 16-byte shared load, 4 conversions of pairs
ISSUE_PV_KEY = 5          # a pair's key: P and V loads, one conversion, two FMAs
ISSUE_SOFTMAX = 14        # a row's value in the softmax: load, max, exp2, sum, store, shuffles shared
ISSUE_SCORE_EXPR = 8      # a score's expression beyond its own operations: index clamps, the row loop
BARRIERS = 3              # barriers a tile (plus a cp.async wait)
BARRIER_US = 0.04         # one barrier step (cost.SYNC_LATENCY_US)


def clock_ghz(hw) -> float:
    """Instruction issue rate of one scheduler: the fp32 peak over SMs, 128 lanes, 2 FLOPs an FMA."""
    return hw.peak_tflops["fp32_simt"] * 1e3 / (hw.sm_count * 128 * 2)


def registers(rows: int, d: int, dv: int, p: dict, ops: int) -> int:
    """Scores' accumulators and one K step, the pairs' accumulators, addressing and loop state."""
    tm = attention_split.thread_map(rows, dv, p)
    return tm["RT"] + 8 + 8 + 2 * tm["NP"] + p["BN"] // 32 + 40 + min(ops, 16)


def split_attention_terms(nkv: int, rows: int, sk: int, d: int, dv: int, p: dict, bps: int, hw,
                          t_dram: float, latency: float, logit_ops: int) -> dict[str, float]:
    """The time and its terms (module docstring) for `nkv` K/V heads of `rows` query rows each
    over `sk` keys, every key assumed live (the cost of a full cache; a step reads its live part)."""
    bn, splits, warps = p["BN"], p["SPLITS"], p["warps"]
    tm = attention_split.thread_map(rows, dv, p)
    tiles = attention_split.chunk(sk, splits, bn) // bn
    per_warp = (tm["RT"] * (d // 8) * ISSUE_SCORE_STEP + (d // 8) * ISSUE_K_STEP
                + tm["RT"] * (logit_ops + ISSUE_SCORE_EXPR)
                + math.ceil(rows / warps) * (bn // 32) * ISSUE_SOFTMAX
                + tm["NP"] * (bn // tm["KS"]) * ISSUE_PV_KEY)
    t_issue = per_warp * math.ceil(warps / 4) / (clock_ghz(hw) * 1e3) + BARRIERS * BARRIER_US
    fixed = (2 if p.get("PRE") else 3) * latency
    blocks = nkv * splits
    n = math.ceil(blocks / hw.sm_count)
    rounds = math.ceil(n / max(1, bps))
    per_round = math.ceil(n / rounds)
    t_sched = rounds * (fixed + tiles * max(per_round * t_issue, latency))
    combine_bytes = splits * rows * (dv + 2) * 4.0
    t_combine = 2 * latency + combine_bytes / (hw.l2_bandwidth_gbs * 1e3 / hw.sm_count)
    t = hw.launch_overhead_us + max(t_sched + t_combine, t_dram)
    return {"time_us": t, "t_compute_us": t_sched, "t_dram_us": t_dram, "t_pipeline_us": fixed,
            "t_smem_us": 0.0, "t_tile_us": max(t_issue, latency), "t_issue_tile_us": t_issue,
            "t_combine_us": t_combine, "key_tiles": nkv * splits * tiles, "tiles_per_chunk": tiles,
            "blocks": blocks, "blocks_per_sm": bps, "launch_us": hw.launch_overhead_us}
