"""Cost terms of streaming attention on the Hopper engine (`codegen/attention.py`, family wgmma,
`templates/attention_wgmma.cu.j2`).

The kernel is not limited by its tensor cores: at head size 64 a key tile's softmax (about 20
fp32 instruction slots a score: the scale, the running max, ex2 on the SFU, the sum, the rescale
and P's conversion) takes longer than its two products, and the blocks of a causal grid differ in
length. So the time is a schedule of blocks, not a roofline:

    t_tile     = max(t_tc, t_softmax) + HIDE[OVERLAP] · min(t_tc, t_softmax)
    t_tc       = 2·BM·BN·(D + Dv) / (peak_tc / SMs · TC_EFF)
    t_softmax  = SOFTMAX_OPS · BM·BN / (peak_fp32 / 2 / SMs)       fp32 instructions per us per SM
    t_block    = (BLOCK_US + key tiles of the block · t_tile) · bps / concurrency_gain(bps · NWG)
    t          = launch + load latency + max(list schedule of the blocks, in launch order, on
                 SMs · bps slots; t_dram)

HIDE: OVERLAP = 0 runs the softmax and the products one after the other (1.0); OVERLAP = 1 the
softmax under its own P·V (0.8 of the smaller left); ping-pong (OVERLAP = 2) under the other
warpgroup's products (0.6). BLOCK_US: Q's load, the pipeline's fill, the output's normalisation
and store. A block's t_tile is its own with the SM to itself; blocks resident together share it,
and four or more warpgroups on an SM get a third more done than two (two ping-pong blocks each
took 1.5x their time alone: one's softmax runs under the other's products; concurrency_gain). A causal grid
launches each batch·head's heaviest query tile first (attention_common.cuh.j2), which the list
schedule follows.

The coefficients are fitted (log least squares over a grid, benchmarks/results/
llama_cost_fit_cpu.txt) to the 28 wgmma timings an H200 measured: the Llama layer's attention at
B8 S512 (16 heads, D 64, causal; aicfc tune, every measured candidate of
tune_llama_layer_b8s512_h200.txt) and benchmarks/attention.py's 8x12x512x64 and 4x16x2048x128
(causal and not; attention_h200.txt) under OVERLAP 1 and 2. Every one of them is within [0.90,
1.10] of its prediction (the mma and SIMT ones below: [0.85, 1.12]); the roofline model this
replaces predicted 13-15 us for the Llama attention's every candidate (measured 26-37 us).
tests/test_cost_attention.py pins them.

The mma.sync and SIMT kernels (attention.cu.j2, serial: HIDE 1.0) are timed the same way where the
profile gives their share of their unit's peak (EFF_KEYS). sm_90.json: mma 0.55 of the tensor
cores, fitted to the Llama attention's three measured mma candidates (37.6-43.6 us against 20-21
us from the roofline, which let them outrank every wgmma candidate once those were timed right);
SIMT 0.115 of fp32 (its six measured candidates took 566-656 us, the roofline said 113-360, and
for small shapes it outranked the tensor cores). Other targets keep the roofline of
cost._attention_cost, which nothing measured here contradicts.
"""
from __future__ import annotations

import heapq
import math

TC_EFF = 0.8          # the tensor cores' share of peak while a tile's products run
SOFTMAX_OPS = 20      # fp32 instruction slots a score's softmax takes (ex2 counted at its SFU rate)
BLOCK_US = 1.5        # a block's fixed work: Q's load, the ring's fill, O's normalisation and store
GAIN_4 = 4 / 3        # an SM's throughput with 4 or more warpgroups resident against 2 (concurrency_gain)
HIDE = {0: 1.0, 1: 0.8, 2: 0.6}   # the smaller of t_tc and t_softmax left exposed, by OVERLAP
# a profile with these keys times the mma.sync and SIMT kernels so too, at that share of their unit's peak
EFF_KEYS = {"mma": "attention_mma_tc_eff", "simt": "attention_simt_eff"}
EXACT_BLOCKS = 20000  # list-schedule grids up to this many blocks; larger ones: mean load or the longest block


def key_tiles_per_query_tile(sq: int, sk: int, bm: int, bn: int, causal: bool) -> list[int]:
    """Key tiles each query tile of one batch·head visits, in launch order (causal: heaviest first)."""
    kt = math.ceil(sk / bn)
    tiles = math.ceil(sq / bm)
    if not causal:
        return [kt] * tiles
    return [min(kt, (min(sq, (t + 1) * bm) - 1) // bn + 1) for t in reversed(range(tiles))]


def schedule_us(per_block: list[float], repeats: int, slots: int) -> float:
    """When the last block ends: `per_block` (one batch·head's blocks, in launch order) launched
    `repeats` times over, each taking the first free one of `slots`."""
    blocks = len(per_block) * repeats
    if blocks > EXACT_BLOCKS:
        return max(sum(per_block) * repeats / slots, max(per_block))
    free = [0.0] * slots
    end = 0.0
    for _ in range(repeats):
        for t in per_block:
            start = heapq.heappop(free)
            end = max(end, start + t)
            heapq.heappush(free, start + t)
    return end


def concurrency_gain(warpgroups: float) -> float:
    """How much more an SM does with `warpgroups` warpgroups resident than with the two a ping-pong
    block has (the measured reference): 4 or more hide each other's latencies, GAIN_4 (two such
    blocks each took 1.5x their time alone); 3 did not measure faster than 2 (NWG = 3 blocks);
    fewer than 2 leave the SM half idle (not measured: the cautious guess)."""
    return min(warpgroups, 2.0) / 2.0 * (GAIN_4 if warpgroups >= 4 else 1.0)


def wgmma_attention_terms(nb: int, sq: int, sk: int, d: int, dv: int, p: dict, bps: int, hw,
                          t_dram: float, latency: float, tc_eff: float = TC_EFF,
                          unit: str | None = None, warpgroups: float = 2.0) -> dict[str, float]:
    """The time and its terms (module docstring) for `nb` batch·heads of `sq` queries by `sk` keys
    (`tc_eff` and `unit`: the mma.sync or SIMT kernel's, EFF_KEYS, where the profile has them)."""
    bm, bn = p["BM"], p["BN"]
    pd, pdv = -(-d // 16) * 16, -(-dv // 16) * 16
    sms = hw.sm_count
    unit = unit or {"f16": "fp16_tc", "bf16": "bf16_tc"}.get(p.get("dtype", "f16"), "fp16_tc")
    t_tc = 2.0 * bm * bn * (pd + pdv) / (hw.peak_tflops[unit] * 1e6 / sms * tc_eff)
    t_softmax = SOFTMAX_OPS * bm * bn / (hw.peak_tflops["fp32_simt"] * 1e6 / 2 / sms)
    t_tile = max(t_tc, t_softmax) + HIDE[p.get("OVERLAP", 0)] * min(t_tc, t_softmax)
    slow = bps / concurrency_gain(bps * warpgroups)
    tiles = key_tiles_per_query_tile(sq, sk, bm, bn, bool(p["causal"]))
    per_block = [(BLOCK_US + n * t_tile) * slow for n in tiles]
    t_sched = schedule_us(per_block, nb, sms * bps)
    visited = nb * sum(tiles)
    return {"time_us": hw.launch_overhead_us + latency + max(t_sched, t_dram),
            "t_compute_us": t_sched, "t_dram_us": t_dram, "t_pipeline_us": latency, "t_smem_us": 0.0,
            "t_tile_us": t_tile, "t_tc_tile_us": t_tc,
            "t_softmax_tile_us": t_softmax, "t_block_max_us": max(per_block), "key_tiles": visited,
            "blocks": nb * len(tiles), "blocks_per_sm": bps, "launch_us": hw.launch_overhead_us}
