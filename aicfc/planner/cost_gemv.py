"""Cost terms of the `gemv` unit (codegen/gemm_gemv.py): a weight stream whose rate is set by
the bytes an SM keeps in flight, stretched where the blocks do not spread evenly over the SMs,
plus the tails a block runs after its last load.

    t = launch + max(t_sm, t_fma) + t_exposed + t_rounds + t_full + t_reduce + t_split

    t_dram   = every byte once (weight, activations, epilogue operands, output) / gemv_stream_gbs (the
               stream's asymptote; reported, and the floor of t_sm), where HOT of them (the weight's first
               rows a kernel before requested into L2: [Note: L2 fill] in passes/l2_fill.py) come at the
               profile's l2_bandwidth_gbs (with PF = 1 its whole weight, which it requested into L2 itself:
               [Note: the fill's own slice]), and LANDED of them (its first steps, requested before its wait
               while the gemv before it sums and merges: [Note: steps into the tail] in passes/tail_steps.py)
               are in registers by its go
    t_sm     = t_dram · (F + gemv_half_inflight) / F · (1 + gemv_imbalance · (q / a - 1))
               F        = min(a, blocks_per_sm) · inflight   bytes in flight on an average SM
               a        = blocks / SMs                       the average SM's blocks
               q        = ceil(blocks / SMs)                 the busiest SM's (133 blocks: 2)
               inflight = threads · step_bytes               one step of a thread's loads
                          (U·SEG·16 bytes; TC = 1: U·SEG·64), at most the block's bytes
               The rate F / (F + half) · stream is Little's law with a latency that grows with
               the load: half the asymptote at gemv_half_inflight bytes an SM.
    t_fma    = q · block FMAs (M per weight element, plus its conversion) / (an SM's fp32 rate)
             = q · block products (rows padded to 8) / (an SM's share of fp16_tc x mma_sync)
               x gemv_tc_issue                              (TC = 1: tensor-core steps)
    t_exposed = t_fma · max(0, 1 - resident·WARPS / gemv_hiding_warps)   the FMAs not hidden
               under loads when few warps are resident (8 rows: 181 registers, one block an SM)
    t_rounds = (ceil(q / blocks_per_sm) - 1) · gemv_wave_us  a block started after another
               ended pays its first loads' round trip while the SM's stream thins
    t_full   = gemv_full_us where blocks >= blocks_per_sm · SMs   [Note: a gemv leaves room]
    (JOIN: blocks of the launch before it, passes/join_launches.py: no launch term, gemv_join_us instead)
    t_reduce = gemv_reduce_us                               shuffles, one barrier, the warps'
                                                            ordered adds, the epilogue's stores,
                                                            the first load's round trip
               - gemv_early_read_us (EPRE = 1)              the epilogue's operands requested
                                                            before the wait ([Note: epilogue
                                                            reads before the wait])
    t_split  = gemv_split_us + SPLITK · BM · BN · 4 / r_l2  (SPLITK > 1, CL = 0) partial rows to
               L2, a fence and a ticket, and the last block reading every split's rows back
               at one SM's L2 rate r_l2 = gemv_sm_gbs
             = gemv_cluster_us + SPLITK · BM · BN · 4 / r_l2  (CL = 1) the others' sums pushed into
               rank 0's shared memory, a cluster barrier ([Note: splits pushed to rank 0])

Fitted (session 15, one H200; benchmarks/results/gemv_session15_h200.txt): 39 schedules of the 1 B
Llama's five decode projections at M = 1, each timed in a graph of copies that streams weights not
in L2, fitted by a grid search on the log error: stream 5000 GB/s, half at 10 KB an SM, imbalance
0.25, launch 1.5 + tails 0.5 us, the ticket 1.2 us and the cluster 0.4; the one two-round grid
(528 blocks of 107 registers, two an SM) ran 0.8 us over the one-round fit, gemv_wave_us. All 39 land within
[0.88, 1.12] of the measured times, where the model it replaced (a DRAM term at the profile's
nominal bandwidth, which is the H100's 3.35 TB/s, and a per-SM rate capped by Little's law at a
fixed 1 us) predicted 0.63-0.98 and ranked a 13.0 us gate/up schedule below a 15.2 us one. What
the run showed:
- bytes in flight an SM decide the rate: 15, 30 and 61 KB an SM streamed the LM head's 131 MB at
  3.0, 3.9 and 4.2 TB/s;
- an uneven grid costs: the gate/up's 352 blocks (3 on some SMs, 2 on others) ran 15.2 us where
  528 blocks (4 on every SM) ran 13.0-13.4; 176 blocks of 128 threads 22.1;
- clusters of 3 or 6 blocks ran 16.4-16.8 us where the same grid without them ran 13.4, so
  clusters are only of 2, 4 or 8 blocks (codegen/gemm_gemv.space).
Two terms come from plans, not from kernels alone:
- clusters of 8 blocks on SMs that hold 2 (107 registers) streamed 13-36% slower than the others'
  fit (O-projection 5.56 us, down 10.64): t_sm grows by gemv_cluster_spread where SPLITK > 2 · bps;
- [Note: a gemv leaves room] Under dependent launches the next kernel's blocks start on the SMs,
  and request their first weights, while this kernel's last blocks run, but only where a block
  slot is free. A grid that fills every slot (the gate/up's 528 blocks, 4 an SM) ran 1.7 us
  faster alone than the 352 of split 2 in clusters (13.3 against 15.0 us), yet the 4-layer decode
  plan replayed slower with it: 216.5 us against 213.7 (benchmarks/decode_ab.py, 7 alternating
  rounds, one process; benchmarks/results/gemv_session15_h200.txt). So a full grid is charged
  what it cost in the plan, about 2 us, and the gate/up keeps the split of 2. Session 20 (the same
  plan with the gate/up on the mma unit, benchmarks/results/decode_ab_session20_h200.txt) forced the
  gate/up onto the full-grid gemv (BN 64, 4 warps, U 8, split 3: 12.98 us alone against the mma
  tile's 15.07) and the plan replayed 212.2 us against 207.2; with the down projection's gemv as well
  (6.2-6.9 us alone against 8.7-9.1) 208.2. The alone figures are back-to-back launches of one
  kernel, where a weight under the L2's 50 MB may be read partly from L2, which a plan does not
  give it (not measured apart).
- A miss these terms leave (sessions 48 and 50, an H200, benchmarks/decode_ab.py --layers 4, B1, 7 alternating
  rounds): the gate/up at BN 128 in clusters of 4 splits (predicted 14.08 us against the pick's 13.53, BN 64 in
  clusters of 2) replayed the plan 167.6 us against 170.2 (session 48, before MB) and 164.2 against 165.4
  (session 50, benchmarks/results/decode_session50_h200.txt, call 4): a block then reads 256-byte runs of each
  weight row where the pick reads 128, which no term sees; splits of 3 (a grid of 2 or 4 blocks on every SM)
  replayed it 168.0 and 171.6. Not refitted on one plan's A/B. Session 56 (benchmarks/results/early_trigger_session56_h200.txt,
  call 5, 7 rounds, bundle pairs in one process) timed the generate step, which the sessions before did not: BN 128 in
  clusters of 4 splits 0.1605 and 0.1604 ms against the pick's 0.1592, and split 1 (176 blocks of 8 warps) 0.1627; the
  pick stands.
Tensor-core steps (TC = 1, [Note: the gemv on tensor cores]) use the same terms with their own
step bytes and t_fma; gemv_tc_issue (2.0) is not fitted: at 8 rows the products are under a tenth
of the stream's time, so no ranking depended on it. Measured against these terms (session 27, an
H200, benchmarks/gemv.py --rows 8, 30 TC candidates of the five decode projections,
benchmarks/results/gemv_tc_session27_h200.txt): 26 of 30 within [0.8, 1.25] of the prediction, the
picks within 10% of the fastest measured for four of five (the QKV's 6.68 us against 5.98); in the
4-layer B8 decode plan the kernels alone summed 224.4 us against 231.8 predicted.
[Note: the tensor-core gemv's stream]
Over a K-major weight ([Note: the tensor-core gemv over a K-major weight] in codegen/gemm_gemv.py) the
terms above measured 0.76-1.46 of their predictions and ranked the schedules wrongly (session 69, an
H200, `bash benchmarks/b8_round.sh fit`: all 12 schedules of its space for each of the 1 B Llama's four
8-row projections alone, benchmarks/results/tckm_fit_session69_h200.txt): the gate/up's predicted best
(BN 32, 4 warps, U 4: 12.91 us) ran 15.09 and its predicted worst-but-two (BN 32, 8 warps, U 2: 15.85)
ran 12.20. Three terms were off, each fitted on those 48 (grid search on the log error; checked again with each
block count an SM from ptxas's registers, as the planner re-costs its leaders, where the run recorded some from the
estimate):
- a warp reloads a chunk's registers only once its products are done, so U chunks in flight hold
  the SM's stream for U / (U + gemv_tckm_duty) of the time (0.25): U = 1 ran 1.2-1.5x its prediction;
- the stream reaches at most gemv_tckm_cap (0.85) of gemv_stream_gbs: 64-128 KB in flight an SM ran
  the gate/up at 0.79-0.91 of it, not nearer the asymptote with more;
- later rounds of blocks cost nothing measurable (gemv_tckm_wave_us 0): a block streams 64-180 KB
  whole over k and the SM's other blocks, started at other times, keep streaming while it ends
  (the gate/up at BN 16 ran 704 blocks in 2-3 rounds at 0.87-0.88 of the asymptote).
The full-grid term (gemv_full_us, a plan's: the next kernel's blocks cannot land while every block slot
is taken) is charged here only to a grid of one round. Its rounds' blocks end at their own times and leave
slots free: in the 4-layer B8 decode plan (benchmarks/results/tcbest_b8_session69_h200.txt, 3 alternating
rounds) the gate/up at BN 16, 8 warps, U 4 (704 blocks, 2-3 rounds of 3 an SM, a full grid) replayed the
plan 7.1 us faster than at BN 32, 4 warps, U 4 (352 blocks, 4 an SM fit) with all else the same: 1.8 us a
layer, where alone they differ by 2.5 (12.59 against 15.09 us), not by 2.5 less the 2.0 the term charged.
With these terms 46 of the 48 measure within [0.8, 1.25] of their predictions (U = 1 of the gate/up at BN
32, 8 warps, 1.26, and of the down at BN 16, 4 warps, 1.26). Each projection's predicted best ran within 5%
of its measured best (the QKV 5.55 us against 5.30, the O 4.20 against 4.16, the down the best), but for the
gate/up, where five schedules tie at the cap: 12.20-13.77 us (BN 32, 8 warps, U 4 the slowest; the cap does
not see why, nor why BN 32, 4 warps, U 4 runs 15.09). In the 1 B Llama's B8 plan the same five tie and the
order's fixed last key picks BN 16, 4 warps, U 4 (12.62 alone).
The stream's asymptote is the H200's: on an H100 (3.35 TB/s) a profile should set
`gemv_stream_gbs` near 3500. The M = 8 terms (t_fma, t_exposed) are the H100 run's
(benchmarks/results/gemv_h100.txt), where the M = 8 kernel was 1.5-2x slower than cuBLAS.
A profile may set each constant (CONSTANTS: `gemv_stream_gbs`, `gemv_half_inflight`,
`gemv_imbalance`, `gemv_wave_us`, `gemv_full_us`, `gemv_cluster_spread`, ...), and
`benchmarks/gemv.py --json` prints every term beside the measured time of every candidate it
runs, which is what refitting them needs.
"""
from __future__ import annotations

import math
import os
from typing import Mapping

from aicfc.codegen import gemm_gemv
from aicfc.errors import AicfError
from aicfc.planner.hardware import Profile

CONSTANTS = {
    "gemv_stream_gbs": 5000.0,      # the stream's asymptote (GB/s) with every SM keeping plenty in flight
    "gemv_half_inflight": 10240.0,  # bytes in flight an SM at which the stream runs at half of it
    "gemv_imbalance": 0.25,         # how much of the busiest SM's extra share the stream pays
    "gemv_wave_us": 0.8,            # a round of blocks an SM starts after its first: their first loads' round trip
    "gemv_sm_gbs": 60.0,            # one SM's L2 rate for the split's partial rows (GB/s)
    "gemv_reduce_us": 0.5,          # after the last add: shuffles, barrier, warps' ordered adds, epilogue, stores
    "gemv_split_us": 1.2,           # split-k: partial rows to L2, fence, ticket, a second barrier (~2 L2 round trips)
    "gemv_cluster_us": 0.2,         # split-k in a cluster: the pushes into rank 0 and a barrier phase (0.4 when pulled;
                                    # [Note: splits pushed to rank 0]: 0.2-0.5 us a gemv less, session 44)
    "gemv_hiding_warps": 16,        # resident warps an SM needs to hide a step's FMAs under the next step's loads
    "gemv_full_us": 2.0,            # a grid that fills every block slot: the next kernel's blocks cannot start early
    "gemv_cluster_spread": 0.3,     # a cluster spread over more than two SMs (SPLITK > 2 x blocks an SM): the stream's loss
    "gemv_tc_issue": 2.0,           # tensor-core steps: their issue (permutes, loads, products) over the products' time
    "gemv_tckm_issue": 1.0,         # the same over a K-major weight: fragments as loaded, no shuffles or permutes (not fitted)
    "gemv_tckm_duty": 0.25,         # [Note: the tensor-core gemv's stream] (a K-major weight): a warp's U chunks in flight
                                    # count U / (U + this) of the time (each waits for its products before it is reloaded)
    "gemv_tckm_cap": 0.85,          # ... and its stream reaches at most this share of gemv_stream_gbs
    "gemv_tckm_wave_us": 0.0,       # ... and a later round of its blocks costs this (gemv_wave_us for the others)
    "gemv_early_read_us": 0.5,      # EPRE = 1 ([Note: epilogue reads before the wait]): the epilogue's round trip fewer (0.4-0.6 measured, session 43)
    "gemv_row_scale_us": 0.1,       # a row-scaled gemv: the statistic's adds, a barrier, the tile's sums scaled (B1: 4.4 us as unscaled, session 35)
    "gemv_join_us": 2.4,            # JOIN ([Note: the O projection joined to the attention]): the other role's
                                    # barrier, fence and atomic, the spin seeing the count, the activations' round
                                    # trip past L1; fitted to the 1 B Llama's role, 2.88 us after the attention
                                    # (session 63, [Note: the joined launch measured]; 0.8 guessed before)
    "gemv_fill_head_bytes": 4194304.0,  # [Note: L2 fill] (passes/l2_fill.py): the next stream's head requested into L2
                                        # (1.1, 4, 8, 16 MiB measured; 4 the fastest plan, session 46)
}


def constants(data: Mapping) -> dict[str, float]:
    """CONSTANTS, each overridden by the hardware profile's entry of the same name, then by
    AICF_GEMV_CONSTANTS=name=value;name=value (an experiment's switch: benchmarks/decode_ab.py's
    env.AICF_GEMV_CONSTANTS compiles a variant under other constants)."""
    out = {key: float(data.get(key, value)) for key, value in CONSTANTS.items()}
    for item in filter(None, os.environ.get("AICF_GEMV_CONSTANTS", "").split(";")):
        key, _, value = item.partition("=")
        if key not in out:
            raise AicfError(f"AICF_GEMV_CONSTANTS: {key!r} is not one of {', '.join(CONSTANTS)}")
        try:
            out[key] = float(value)
        except ValueError:
            raise AicfError(f"AICF_GEMV_CONSTANTS: {key}={value!r} is not a number") from None
    return out


def profile_terms(p: Mapping, m: int, n: int, kk: int, esize: int, io_bytes: float, bps: int, hw: Profile) -> dict[str, float]:
    """`gemv_terms` on `hw`'s SMs, bandwidth, fp32 rate and constants."""
    return gemv_terms(p, m, n, kk, esize, io_bytes, sm_count=hw.sm_count, bps=bps, dram_gbs=hw.dram_bandwidth_gbs,
                      fp32_tflops=hw.peak_tflops["fp32_simt"] * hw.efficiency["fp32_simt"],
                      tc_tflops=hw.peak_tflops["fp16_tc"] * hw.efficiency["mma_sync"], c=constants(hw.data),
                      l2_gbs=hw.data["l2_bandwidth_gbs"])


def gemv_terms(p: Mapping, m: int, n: int, kk: int, esize: int, io_bytes: float, *, sm_count: int,
               bps: int, dram_gbs: float, fp32_tflops: float, tc_tflops: float = 445.0,
               c: Mapping[str, float] = CONSTANTS, l2_gbs: float = 10000.0) -> dict[str, float]:
    """The terms above (us), and `time_us` without the launch overhead. `dram_gbs` is the
    profile's nominal bandwidth (reported only: the stream's asymptote is `gemv_stream_gbs`);
    `fp32_tflops` its fp32 rate times its efficiency (an FMA counts as two), `tc_tflops` its
    fp16 tensor rate times mma.sync's efficiency (TC = 1); `c`:
    `constants(profile data)`; `l2_gbs` the L2's rate, at which the HOT bytes stream."""
    tiles = math.ceil(n / p["BN"])
    blocks = tiles * p["SPLITK"]
    kper = min(kk, gemm_gemv.k_per_split(kk, p))
    block_bytes = kper * min(p["BN"], n) * esize
    threads = gemm_gemv.threads(p)
    inflight = min(block_bytes, threads * gemm_gemv.step_bytes(p))
    avg = blocks / sm_count
    q = math.ceil(avg)
    resident = max(1, min(q, bps))
    f = min(avg, bps) * inflight                                    # bytes in flight on an average SM
    tckm = gemm_gemv.tc_k_major(p)
    if tckm:   # [Note: the tensor-core gemv's stream]
        f *= p["U"] / (p["U"] + c["gemv_tckm_duty"])
    # HOT: bytes of the weight's first rows a kernel before requested into L2 ([Note: L2 fill]): read at the L2's rate;
    # PF: the gemv requested its whole slice itself, in the idle window of the kernel before ([Note: the fill's own
    # slice] in passes/l2_fill.py)
    hot = min(p.get("HOT", 0) + (kk * n * esize if p.get("PF") else 0), io_bytes)
    # LANDED: bytes of its first steps requested before its wait that land in the kernel before's tail
    # ([Note: steps into the tail] in passes/tail_steps.py): in registers by its go
    landed = min(p.get("LANDED", 0), io_bytes - hot)
    t_dram = (io_bytes - hot - landed) / (c["gemv_stream_gbs"] * 1e3) + hot / (l2_gbs * 1e3)
    rate = f / (f + c["gemv_half_inflight"])                        # of the stream's asymptote
    if tckm:
        rate = min(rate, c["gemv_tckm_cap"])
    t_sm = t_dram / rate * (1.0 + c["gemv_imbalance"] * (q / avg - 1.0))
    if p.get("CL") and p["SPLITK"] > 2 * bps:
        t_sm *= 1.0 + c["gemv_cluster_spread"]
    rounds = math.ceil(q / max(1, bps))                              # the busiest SM's rounds of blocks
    # a full grid keeps the next kernel's blocks off the SMs; over a K-major weight on tensor cores only in one round
    # ([Note: the tensor-core gemv's stream]: rounds of blocks ending at their own times leave slots free)
    t_full = c["gemv_full_us"] if blocks >= bps * sm_count and not (tckm and rounds > 1) else 0.0
    if p.get("TC"):
        # m16n8k16 products (the rows padded to 8) at an SM's share of the mma.sync rate, with
        # their byte permutes and loads issued beside them: gemv_tc_issue times the products' time
        t_fma = (q * kper * min(p["BN"], n) * 8 * 2 / (tc_tflops * 1e6 / sm_count)) * c[
            "gemv_tckm_issue" if p.get("KM") else "gemv_tc_issue"]
    else:
        # fp32 FMAs: M per weight element and one for its conversion, at an SM's share of the peak
        t_fma = q * kper * min(p["BN"], n) * (m + 0.5) * 2 / (fp32_tflops * 1e6 / sm_count)
    t_split = 0.0
    if p["SPLITK"] > 1:
        t_split = (c["gemv_cluster_us" if p.get("CL") else "gemv_split_us"]
                   + p["SPLITK"] * p["BM"] * p["BN"] * 4 / (c["gemv_sm_gbs"] * 1e3))
    # FMAs hidden under the loads only with enough resident warps: the rest is exposed
    t_exposed = t_fma * max(0.0, 1.0 - resident * p["WARPS"] / c["gemv_hiding_warps"])
    t_rounds = (rounds - 1) * c["gemv_tckm_wave_us" if tckm else "gemv_wave_us"]
    t_tail = c["gemv_reduce_us"] - (c["gemv_early_read_us"] if p.get("EPRE") else 0.0)
    time = max(t_sm, t_fma) + t_exposed + t_rounds + t_full + t_tail + t_split
    return {"time_us": time, "t_dram_us": t_dram, "t_sm_us": t_sm, "t_fma_us": t_fma, "t_split_us": t_split,
            "t_fma_exposed_us": t_exposed, "t_pipeline_us": t_tail + t_split,
            "t_compute_us": t_fma, "t_smem_us": 0.0, "t_reduce_us": t_tail,
            "sm_gbs": io_bytes / t_sm / 1e3 / sm_count, "inflight_per_sm": f, "blocks": blocks,
            "blocks_busiest_sm": q, "blocks_per_sm": bps, "rounds": rounds, "t_rounds_us": t_rounds, "t_full_us": t_full,
            "nominal_dram_gbs": dram_gbs, "tensor_cores": 1.0 if p.get("TC") else 0.0,
            **({"hot_bytes": float(p["HOT"])} if p.get("HOT") else {}),
            **({"landed_bytes": float(landed)} if landed else {})}
