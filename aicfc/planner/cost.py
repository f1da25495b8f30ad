"""The analytic cost model: predicted time of one kernel under one schedule.

Every family's cost is the same formula over family-specific counts:

    t = max(max((t_dram + t_l2) / mem_eff, t_compute / parallel_eff, t_smem / smem_eff) / wave_eff,
            t_pipeline) + launch

    t_dram       = dram_bytes / (dram_bandwidth * eff.dram)       each tensor moved once, plus
                                                                  re-reads that do not fit in L2
    t_l2         = l2_bytes / l2_bandwidth                        re-reads that hit in L2
                   (row passes: `_row_cost` counts the row re-reads its schedule makes)
                   (tiled GEMMs: `tile_rereads`, every batch item re-reading a shared operand)
    t_compute    = flops_issued / (peak_unit * eff.unit * issue_eff)
                   unit: fp32_simt, or the tensor-core rate of the mma type (eff.mma_sync)
    t_smem       = shared-memory bytes read and written / (SMs * smem_bandwidth_per_sm)
                   (tensor-core GEMMs: fragments per warp tile, staged tiles per block)
    t_pipeline   = serialized latency the schedule cannot hide (GEMM k-steps, reduction trees)
    parallel_eff = (active SMs / SMs) * (u / SUBPARTITIONS)
                   * min(1, (w / u) * min(ilp, WARP_ILP_MAX) * SUBPARTITIONS / eff.min_warps_per_sm)
                   w = warps per active SM, u = min(w, SUBPARTITIONS) schedulers in use
                   active SMs = min(blocks, SMs): a grid smaller than the machine leaves SMs idle
                   ilp: independent work per warp; row passes: ROW_ILP, and their DRAM time
                   divided by the memory duty cycle of an SM's resident blocks (`_row_cost`)
    mem_eff      = parallel_eff, or where the family states the bytes each block keeps in
                   flight (GEMMs: the tiles staged ahead), Little's law:
                   drawn * min(1, bytes in flight per SM / (DRAM bandwidth · drawn / active SMs
                   * load_latency_us)),  drawn = min(1, active SMs * sm_l2_port / l2_bandwidth):
                   the share of the memory system the active SMs' L2 ports can draw
                   ([Note: L2 share of a small grid] in planner/hardware.py)
    smem_eff     = parallel_eff, or for tensor-core GEMMs, Little's law on the fragment bytes a
                   warp has in flight against SMEM_LATENCY_US
    wave_eff     = (blocks / per_wave) / ceil(blocks / per_wave)  when more than one wave
    per_wave     = SMs * blocks_per_sm;  blocks_per_sm from threads, shared memory, registers

Coefficients (bandwidths, peaks, efficiencies, launch overhead) come from the hardware
profile; `aicfc tune` is where they get calibrated. `load_latency_us` (optional, default
LOAD_LATENCY_US) is one global-load round trip plus a barrier: the unit of a GEMM's
t_pipeline. Register counts at planning time are an estimate (`estimate_registers`); compile
re-costs the leading candidates with ptxas's counts (`plan_schedules.check_leaders`), and the
chosen kernel's count in the bundle is always ptxas's.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Mapping

from aicfc.codegen import (attention, attention_split, conv, conv_band, conv_stem, conv_wgmma, gemm, gemm_gemv, gemm_thin,
                           gemm_wgmma, row_cols, row_reduce, window, window_tile)
from aicfc.codegen.cexpr import flat_offset, reciprocal_divisions
from aicfc.codegen.common import element_offset
from aicfc.ir.decision import Kernel
from aicfc.ir.lowered import Affine, Call, Const, Expr, Load, count_ops, index_vars, indirect_dims, loads
from aicfc.ir.memo import by_identity, last_by_identity
from aicfc.ir.properties import Contraction
from aicfc.ir.types import ITEMSIZE
from aicfc.planner.hardware import Profile, blocks_per_sm, l2_share_gbs
from aicfc.planner.cost_conv_pool import pool_terms
from aicfc.planner.cost_conv_stem import stem_terms
from aicfc.planner.cost_conv_band import band_terms
from aicfc.planner.cost_conv_taps import taps_terms
from aicfc.planner.cost_conv_wgmma import conv_wgmma_terms
from aicfc.planner.cost_attention_split import registers as split_registers, split_attention_terms
from aicfc.planner.cost_attention_wgmma import EFF_KEYS, TC_EFF, wgmma_attention_terms
from aicfc.planner.cost_gemv import constants, profile_terms
from aicfc.planner.cost_thin import thin_terms
from aicfc.planner.cost_window_tile import TILE_LOAD_OPS, tile_terms
from aicfc.planner.cost_wgmma import EPILOGUE_RATE, STORE_OPS, epilogue_ops, wgmma_terms

LOAD_LATENCY_US = 0.4      # one global-load round trip plus a barrier, per GEMM k-step
SYNC_LATENCY_US = 0.04     # one shuffle or barrier step in a reduction tree (fitted: LayerNorm rows of 4096 fp16
                           # with 16 warps per row measured 22% slower than with 8 on an H100)
# Memory requests a row-pass warp keeps in flight, relative to the profile's min_warps_per_sm
# unit: a row pass needs about 1/ROW_ILP times as many resident warps to hide DRAM latency
# (aicfc tune on an H200, 8192x4096 LayerNorm and softmax: 16-18 warps per SM ran 9-44%
# slower than 32-40, which all ran within 3% of each other).
ROW_ILP = 0.6
LOAD_INSTRUCTIONS = 4      # a SIMT GEMM's fetch of one tile element: index, guard, load, store
STEP_INSTRUCTIONS = 16     # a SIMT GEMM's K step: loop, buffer switch and barrier
SUBPARTITIONS = 4          # warp schedulers per SM (sm_70 to sm_90), each with its share of the units
WARP_ILP_MAX = 2.0         # independent work a warp's own ILP stands in for (measured: aicfc tune, H100, GEMM
                           # shapes of benchmarks/gemm.py: 2 warps of 64x64 mma tiles ran 1.4-1.7x slower than 4
                           # of 64x32 at 1024^3; caps of 1.5, 2.5 and 3 picked fewer schedules within 10%)
SMEM_LATENCY_US = 0.02     # a shared-memory load's round trip (about 30 cycles)
# A SIMT GEMM thread's TM·TN accumulators are independent FMA chains: FMA_CHAINS_PER_WARP of
# them count as one warp's worth of the independent work a scheduler needs, and a warp counts
# for at most SIMT_ILP_MAX of the min_warps_per_sm / SUBPARTITIONS (4 on sm_90) it needs: a
# lone warp per scheduler leaves some of its shared-memory latency and barriers exposed.
# Measured (aicfc tune, H200, fp32): 128x768x768 ran 17.8 us on 4 warps per SM of 4x2 thread
# tiles and 19.4 us on 16 warps of 2x1 (WARP_ILP_MAX and 8 chains a warp's worth had predicted
# the first 1.8x slower); 1024^3 ran 80.1 us on 4 warps per SM of 8x8 tiles and 72.8 on 8 warps
# of 8x4. Over the three fp32 tune runs kept (two H200, one H100), 2 chains and a cap of 3 picked
# 24 of 30 shapes within 10%, a cap of 4 22, of 2 (WARP_ILP_MAX) 18.
FMA_CHAINS_PER_WARP = 2
SIMT_ILP_MAX = 3.0


@dataclass(frozen=True)
class Estimate:
    time_us: float
    flops: float
    bytes: float
    terms: dict[str, float]

    def as_items(self) -> tuple[tuple[str, float], ...]:
        items = {"time_us": self.time_us, "flops": self.flops, "bytes": self.bytes, **self.terms}
        return tuple(sorted((k, round(float(v), 6)) for k, v in items.items()))


def load_latency(hw: Profile) -> float:
    """The profile's `load_latency_us`, LOAD_LATENCY_US where it has none."""
    return hw.data.get("load_latency_us", LOAD_LATENCY_US)


def _combine(hw: Profile, *, flops: float, issued: float, dram: float, l2: float, pipeline: float,
             blocks: int, threads: int, bps: int, issue_eff: float = 1.0, ilp: float = 1.0,
             unit: str = "fp32_simt", smem: float = 0.0, inflight: float = 0.0,
             smem_inflight: float = 0.0, ilp_max: float = WARP_ILP_MAX) -> Estimate:
    eff = hw.efficiency
    t_dram = dram / (hw.dram_bandwidth_gbs * 1e3 * eff["dram"])
    t_l2 = l2 / (hw.l2_bandwidth_gbs * 1e3)
    unit_eff = eff["fp32_simt"] if unit == "fp32_simt" else eff["mma_sync"]
    t_compute = issued / (hw.peak_tflops[unit] * 1e6 * unit_eff * issue_eff)
    t_smem = smem / (hw.sm_count * hw.smem_bandwidth_gbs_per_sm * 1e3)
    per_wave = hw.sm_count * bps
    active_sms = min(blocks, hw.sm_count)
    warps_per_sm = min(blocks, per_wave) * math.ceil(threads / 32) / active_sms
    # Warps run on the SM's SUBPARTITIONS schedulers: fewer warps leave some idle, and each
    # scheduler needs min_warps_per_sm / SUBPARTITIONS warps' worth of independent work, a warp
    # counting for at most `ilp_max` (WARP_ILP_MAX unless the family says) however much ILP it has.
    used = min(warps_per_sm, SUBPARTITIONS)
    parallel = active_sms / hw.sm_count * used / SUBPARTITIONS * min(
        1.0, warps_per_sm / used * min(ilp, ilp_max) * SUBPARTITIONS / eff["min_warps_per_sm"])
    mem_parallel = parallel
    if inflight:
        # the share of the memory system the active SMs can draw: all of it once their L2 ports add up to the
        # L2's bandwidth ([Note: L2 share of a small grid] in planner/hardware.py); each active SM then needs
        # its share of DRAM's bandwidth times a load's round trip in flight (Little's law)
        drawn = active_sms * l2_share_gbs(hw, active_sms) / hw.l2_bandwidth_gbs
        need = hw.dram_bandwidth_gbs * 1e3 * drawn / active_sms * load_latency(hw)
        mem_parallel = drawn * min(1.0, min(blocks, per_wave) / active_sms * inflight / need)
    smem_parallel = parallel
    if smem_inflight:
        need = hw.smem_bandwidth_gbs_per_sm * 1e3 * SMEM_LATENCY_US
        smem_parallel = active_sms / hw.sm_count * min(1.0, warps_per_sm * smem_inflight / need)
    waves = blocks / per_wave
    wave_eff = waves / math.ceil(waves) if waves > 1 else 1.0
    # Within one wave the busiest SM holds ceil(blocks / SMs) blocks, not the mean: its own
    # tensor-core and shared-memory work (SM-local rates) sets the time. 144 blocks on 132 SMs put
    # two on 12 of them: measured 1.6x the time of 48 blocks of the same tile (H200, mma 32x64).
    busiest = math.ceil(blocks / active_sms) / (blocks / active_sms) if blocks <= per_wave else 1.0
    # Latency along a block's own critical path (pipeline) is not divided by parallelism.
    time = max((t_dram + t_l2) / mem_parallel, busiest * t_compute / parallel, busiest * t_smem / smem_parallel) / wave_eff
    time = max(time, pipeline) + hw.launch_overhead_us
    return Estimate(time, flops, dram, {
        "t_dram_us": t_dram, "t_l2_us": t_l2, "t_compute_us": t_compute, "t_smem_us": t_smem,
        "t_pipeline_us": pipeline,
        "parallel_eff": parallel, "mem_parallel_eff": mem_parallel, "smem_parallel_eff": smem_parallel,
        "wave_eff": wave_eff, "busiest_sm": busiest, "launch_us": hw.launch_overhead_us,
        "blocks": blocks, "blocks_per_sm": bps})


def _footprint(ld, op, types: Mapping) -> float:
    """Bytes of `ld.buffer` that load can touch: the elements its index spans (the product of the
    extents of the variables it depends on), the whole tensor where a variable's extent is unknown."""
    ext = op.extents()
    deps = {v for a in ld.index for v, _ in a.terms}
    if not deps <= ext.keys():
        return float(types[ld.buffer].nbytes)
    return float(math.prod(ext[v] for v in deps) * ITEMSIZE[types[ld.buffer].dtype])


@last_by_identity   # ranking costs every candidate of one kernel in a row: the bytes depend on no schedule
def _io_bytes(k: Kernel, types: Mapping) -> float:
    """Bytes a kernel moves through DRAM: every tensor it reads once (at most the elements its loads'
    indices span: a slice, such as the last position a decoder's final norm reads, is charged as
    the slice; in a 1 B Llama's prefill that norm was charged the whole [1, 512, 2048] hidden state
    and predicted at 680 us, 1.5 measured) and every one it stores. A
    tensor read only through an indirect index (a gather: an embedding table) is charged at most
    one element per element of the ops that read it, not whole: the Llama benchmark's first O-proj
    reads 4096 rows of a 32000-row table as its residual, and charging all of it tied every GEMM
    candidate at the same DRAM-bound time (the tie-break then took one 1.6x the fastest measured)."""
    reads: dict[str, float] = {}
    gathered: dict[str, float] = {}
    # an inlined producer's result is computed in place: its own reads instead (Kernel.loads)
    inner = frozenset().union(*(i.names for i in k.inlined))
    for op in k.ops + tuple(i.op for i in k.inlined):
        for ld in loads(op.body):
            if ld.buffer in k.outs or ld.buffer in inner:
                continue
            if indirect_dims(ld):
                gathered[ld.buffer] = gathered.get(ld.buffer, 0.0) + op.type.numel * ITEMSIZE[types[ld.buffer].dtype]
            else:
                reads[ld.buffer] = min(types[ld.buffer].nbytes, reads.get(ld.buffer, 0.0) + _footprint(ld, op, types))
    for b, touched in gathered.items():
        reads.setdefault(b, min(types[b].nbytes, touched))
    return sum(reads.values()) + sum(types[s].nbytes for s in k.stores)


@by_identity   # asked for every candidate of a kernel
def _kernel_ops(k: Kernel) -> int:
    return sum(count_ops(op.body) for op in k.ops)


def estimate_registers(k: Kernel, p: Mapping) -> int:
    """A planning-time register estimate (explain labels it as one)."""
    ops = _kernel_ops(k)
    if k.family == "conv" and p["unit"] == "taps":   # 32 accumulators, a tap's fragments, the epilogue's pairs: ptxas
        return 128                                   # fits them in the 128 of 512 threads (setmaxnreg moves more)
    if k.family == "conv" and p["unit"] == "band":   # accumulators, a tap's A fragments, the rows' addressing
        return min(conv_band.CONSUMER_REGS, p["BN"] // 2 + 16 + 40 + min(ops, 16))
    if k.family == "conv" and p["unit"] == "pool":   # the same per block (setmaxnreg moves the producer's to them)
        return gemm_wgmma.launch_registers(128 * (p["NCONS"] + 1))
    if k.family == "conv" and p["unit"] == "wgmma":   # the GEMM engine's consumer, plus the gather's indices
        return min(hw_max_registers(p), p["MI"] * p["BN"] // 2 + 56 + min(ops, 16))
    if k.family == "conv" and p["unit"] == "stem":   # held filter fragments, offsets, accumulators (conv_stem.registers)
        return conv_stem.registers(conv_stem.layout(k), p) + min(ops, 16)
    if k.family == "conv" and p["unit"] == "mma":   # a GEMM's, plus the index splitting of the gathered tiles
        return 16 + estimate_registers(k.replace(family="gemm"), p)
    if k.family == "conv":   # accumulators, fragments, the gather's index splitting
        return p["TM"] * p["TN"] + p["TM"] + p["TN"] + 48 + min(ops, 32)
    if k.family == "window":   # PX x vec accumulators and the run's columns of a row of taps beside them
        return 32 + min(2 * ops, 64) + 2 * p.get("vec", 1) * (p.get("PX", 1) - 1)
    if k.family == "gemm" and p["unit"] == "gemv":
        # accumulators, two steps' weight vectors and activations, and 16 for the rest: ptxas
        # (CUDA 13) gave held + 15..26 over the plain and rotary spaces at 1 and 8 rows (session 15);
        # the epilogue's operations do not add (they run after the loop's registers are free);
        # tensor-core steps: gemm_gemv.tc_held's own fit (session 27)
        # a row-scaled gemv also holds its rows' vectors through the loop ([Note: a norm's row scale in the gemv])
        held = 4 * p["BM"] * gemm_gemv.row_vectors(p, gemm.dims(k)[3]) if gemm.row_scale(k) is not None else 0
        return gemm_gemv.registers(p) + 16 + held
    if k.family == "gemm" and p["unit"] == "thin":
        # the held weight fragments, accumulators and two slabs' A pieces (gemm_thin.held), the epilogue's values
        return gemm_thin.registers(gemm.dims(k)[3], p) + min(ops, 16)
    if k.family == "gemm" and p["unit"] == "wgmma":
        # a consumer thread's accumulators, descriptors, tile coordinates and loop state
        return min(hw_max_registers(p), p["MI"] * p["BN"] // 2 + 48 + min(ops, 16))
    if k.family == "gemm" and p["unit"] == "mma":
        mi, ni = p["BM"] // p["WM"] // 16, p["BN"] // p["WN"] // 8
        # accumulators + double-buffered A/B fragments + addressing and loop state
        return 4 * mi * ni + 8 * mi + 4 * ni + 40 + min(ops, 16)
    if k.family == "gemm":
        # accumulators, fragments, the next step's elements with their addresses: fitted to
        # ptxas (CUDA 13) over 80 random tiles of a 2048^3 fp32 GEMM, mean error 11%
        return (12 + math.ceil(0.85 * p["TM"] * p["TN"]) + 3 * (p["TM"] + p["TN"]) + 4 * sum(gemm.prefetch(p))
                + min(ops, 32))
    if k.family == "attention":
        return _attention_registers(k, p, ops)
    if k.family == "row_reduce":
        # the row held in registers (`regs`), a step's vectors, the merged states; fitted to
        # ptxas (CUDA 13) on 4096-wide LayerNorm rows, fp32 and fp16, 4 to 128 elements cached
        # per thread: within 10% but at 128 (fp16: 174 for 193)
        return (16 + min(ops, 48) + math.ceil(1.1 * row_reduce.cached_elements(k, p)) + p["vec"] // 2
                + 2 * row_reduce.state_vars(k, p))
    return 24 + min(2 * ops, 64) + 2 * p.get("vec", 1)


def cost(k: Kernel, p: Mapping, grid: tuple[int, int, int], block: tuple[int, int, int], smem: int,
         regs: int, types: Mapping, hw: Profile) -> Estimate:
    threads = block[0] * block[1] * block[2]
    blocks = grid[0] * grid[1] * grid[2]
    bps, _ = blocks_per_sm(threads, smem, regs, hw)
    if k.family == "conv" and p["unit"] in ("wgmma", "taps", "pool", "band"):
        return _conv_wgmma_cost(k, p, types, hw)
    if k.family == "conv" and p["unit"] == "stem":
        return _stem_cost(k, p, bps, types, hw)
    if k.family == "conv":
        return _conv_cost(k, p, blocks, threads, bps, types, hw)
    if k.family == "window":
        return _window_cost(k, p, blocks, threads, bps, types, hw)
    if k.family == "gemm" and p["unit"] == "gemv":
        return _gemv_cost(k, p, blocks, threads, bps, types, hw)
    if k.family == "gemm" and p["unit"] == "thin":
        return _thin_cost(k, p, bps, types, hw)
    if k.family == "gemm" and p["unit"] == "mma":
        return _mma_cost(k, p, blocks, threads, bps, types, hw)
    if k.family == "gemm" and p["unit"] == "wgmma":
        return _wgmma_cost(k, p, types, hw)
    if k.family == "gemm":
        return _gemm_cost(k, p, blocks, threads, bps, types, hw)
    if k.family == "row_reduce" and p["pass"] == "cols":
        return _row_cols_cost(k, p, blocks, threads, bps, types, hw)
    if k.family == "row_reduce":
        return _row_cost(k, p, blocks, threads, bps, types, hw)
    if k.family == "attention":
        return _attention_cost(k, p, blocks, threads, bps, types, hw)
    if k.family == "scatter":
        return _scatter_cost(k, p, blocks, threads, bps, types, hw)
    return _pointwise_cost(k, p, blocks, threads, bps, types, hw)


def scatter_bytes(k: Kernel, types: Mapping) -> int:
    """DRAM bytes of an in-place scatter (codegen/scatter.py): the rows it writes, the values it
    reads for them (the update's operands, at most their whole size) and the ids; never the rest
    of the state it updates."""
    from aicfc.codegen import scatter
    hit, val, y, ids = scatter.parts(k)
    written = scatter.numel(k) * ITEMSIZE[types[y.out].dtype]
    value = val.body.args[1] if isinstance(val.body, Call) else val.body   # select(match, value, 0)
    operands = {ld.buffer for e in [value] + [e for e, _ in ids] for ld in loads(e) if ld.buffer not in k.outs}
    return written + sum(min(types[b].nbytes, written) for b in operands)


def _scatter_cost(k: Kernel, p: Mapping, blocks: int, threads: int, bps: int, types: Mapping,
                  hw: Profile) -> Estimate:
    """A thread moves `vec` elements ([Note: a scatter's rows as vectors] in codegen/scatter.py): its
    index arithmetic once, its 16-byte accesses counted as that much more in flight a warp (ilp, the
    bytes of one access over the 4 that min_warps_per_sm is stated for). Measured on an H200 (session
    19): a prefill's K/V rows, 0.5 MB, 1.21 us at 8 halves a thread (5.2 us at one)."""
    from aicfc.codegen import scatter
    n = scatter.numel(k)
    vec = p.get("vec", 1)
    issued = 2.0 * (n / vec * 8 + n * instructions(k.ops[1].body))
    ilp = max(1.0, vec * ITEMSIZE[k.ops[-1].type.dtype] / 4)
    return _combine(hw, flops=float(n), issued=issued, dram=float(scatter_bytes(k, types)), l2=0.0, pipeline=0.0,
                    blocks=blocks, threads=threads, bps=bps, ilp=ilp)


# fp32 instructions per scalar function as CUDA's math library expands it on sm_90 (erff
# counted in SASS, CUDA 13: two polynomials selected per element; the others are estimates);
# the rest cost one. A division by a literal is emitted as a product (cexpr.reciprocal_divisions).
CALL_INSTRUCTIONS = {"erf": 24, "tanh": 16, "sigmoid": 18, "exp": 8, "log": 10, "sqrt": 5, "div": 9,
                     # cosf, sinf: a 3-part range reduction, the polynomial and the quadrant's select, the path
                     # taken below |x| = 105615 (counted in CUDA 13's PTX; the Payne-Hanek path past it is not).
                     # Not what makes the decode step's rotary tables slow: they run 2.3-2.5 us alone where a
                     # one-block map of the same grid without them runs 0.7, and 4 cosines a thread measured
                     # 2.34 us against 2.50 for 32 (H200, session 25, benchmarks/results/rotary_tables_session25_h200.txt);
                     # a floor of a thread's own instruction chain was tried on that reading and not kept
                     "cos": 28, "sin": 28}
# Under fp16/bf16 (apply_precision.FAST_MATH) exp, erf and sigmoid are templates/math.cuh.j2's
# approximations (counted in SASS, CUDA 13; sigmoid: FMUL, MUFU.EX2, FADD, MUFU.RCP).
FAST_CALL_INSTRUCTIONS = {**CALL_INSTRUCTIONS, "erf": 18, "sigmoid": 4, "exp": 2}
# Issue 18's functions (estimates): softplus is an exp and a log1p; fmodf's exact remainder
# loops over the exponent gap (a few steps for operands of like magnitude); mod adds its fix-up.
CALL_INSTRUCTIONS.update({"softplus": 22, "fmod": 20, "mod": 26})
FAST_CALL_INSTRUCTIONS.update({"softplus": 16, "fmod": 20, "mod": 26})
# The trigonometric and hyperbolic functions and expm1 (estimates, libm's single-precision paths:
# a range reduction and a polynomial or two; the hyperbolic ones an exp or a log and a few operations)
TRIG_INSTRUCTIONS = {"tan": 36, "asin": 24, "acos": 24, "atan": 24, "sinh": 20, "cosh": 16, "asinh": 28, "acosh": 28,
                     "atanh": 24, "expm1": 16}
CALL_INSTRUCTIONS.update(TRIG_INSTRUCTIONS)
FAST_CALL_INSTRUCTIONS.update(TRIG_INSTRUCTIONS)


def fast_math(k: Kernel, types: Mapping) -> bool:
    """Whether `k` runs under a policy that approximates exp and erf: its stored floating-point
    results are 16-bit (fp16 and bf16 store every floating-point tensor so, fp32 and tf32 none)."""
    return any(types[b].dtype in ("f16", "bf16") for b in k.stores)


def instructions(e: Expr, invariant: Callable[[Expr], bool] = lambda e: False, fast: bool = False) -> int:
    """fp32 instructions one element of `e` issues (loads excluded; `invariant` subexpressions,
    the same for every element, are computed once and cost nothing per element). A subexpression
    the tree repeats is counted once: nvcc computes it once. GPT-2's tanh-GELU epilogue names
    its biased input five times; counted per use, its 25 instructions were 29, and its FFN1 GEMM
    (4096x768x3072, epilogue-bound ping-pong tiles) was predicted 66.1 us against 48.9-54.6
    measured on an H100 (benchmarks/results/gemm_predictions_session8_h100.txt)."""
    table = FAST_CALL_INSTRUCTIONS if fast else CALL_INSTRUCTIONS
    seen: set[Expr] = set()

    def count(x: Expr) -> int:
        if not isinstance(x, Call) or x in seen or invariant(x):
            return 0
        seen.add(x)
        return table.get(x.fn, 1) + sum(count(a) for a in x.args)

    return count(e)


def _pointwise_cost(k: Kernel, p: Mapping, blocks: int, threads: int, bps: int, types: Mapping,
                    hw: Profile) -> Estimate:
    """One element-wise map. Issued: two FLOPs per fp32 instruction (the peak counts an FMA as
    two), the math library's functions at their instruction counts. A thread's arithmetic waits
    on its own step's loads; the loads of its other `items` steps overlap it: issue efficiency
    items / (items + 1). Memory-bound maps do not notice; one like erf-GELU at 16-bit storage
    (about 30 instructions per 4 bytes moved) does.

    [Note: a pointwise thread's items in turn]
    The template's loop over a thread's `items` steps exits at the tensor's end and guards a
    concatenation's loads, so its steps run one after another: in the PTX of ResNet-50 B32's k47 (the
    residual add written into stage 4's projection input, 8 items of 8 halves) every step's loads sit
    between the previous step's store and the next branch. So a wave of blocks takes at least
    items load round trips, whatever its bytes: t_items = waves x items x load_latency_us, a floor
    on the time where it binds, which is in small maps alone (at 8 items 3.2 us; ResNet-50 B32's
    large adds stream for 10-14 us). It is not a term of `t_pipeline_us`, which ranks ties: the large
    maps' ties, and their picks, are what they were.
    Measured (session 37, an H200, benchmarks/results/pointwise_items_session37_h200.txt), k47 alone
    with items x threads pinned: 8 x 64 (the pick before) 3.34 us, 4 x 64 2.54, 2 x 128 2.80, 1 x 256 2.35
    (10.7 MiB). With the floor the planner takes 4 x 64 there (2.56 us: 103% of the copy bandwidth by
    its bytes, past its bar, where 3.34 was 79%) and moves a few small maps elsewhere to fewer items.
    Plans, old against new in one process (9 alternating rounds): ResNet-50 B32 817.1 -> 811.3 us, B1
    277.8 -> 276.8, EfficientNet-B0 B1 291.2 -> 282.8 (16 maps moved), B32 944.2 -> 941.1; BERT-base B1
    S128 and B8 S512, GPT-2 B1 S128 and MobileNetV2 B1 keep their plans. One plan lost: the 1 B Llama's
    4-layer decode step, whose head's three one-block maps (the positions, cos, sin) went from 2 items
    to 1, 193.7 -> 195.1 us (9 rounds, the same greedy tokens).
    Loading every step's values first instead (the steps' loads into arrays, then their maps and
    stores: all of k47's 16 loads ahead of its 8 stores in the PTX, 142 registers) measured slower
    everywhere: k47 3.34 -> 4.10 us, the stage-1 add 13.7 -> 30.0, the ResNet-50 B32 plan 817.9 ->
    827.8 us, EfficientNet-B0 B32 952.4 -> 983.8; why is not known, and it was not kept."""
    out = k.ops[-1]
    flops = out.type.numel * max(1, count_ops(out.body))
    issued = 2.0 * out.type.numel * instructions(reciprocal_divisions(out.body, lambda e: isinstance(e, Const)),
                                                 fast=fast_math(k, types))
    est = _combine(hw, flops=flops, issued=issued, dram=_io_bytes(k, types), l2=0.0, pipeline=0.0, blocks=blocks,
                   threads=threads, bps=bps, issue_eff=p["items"] / (p["items"] + 1), ilp=min(p["items"], 4))
    # [Note: a pointwise thread's items in turn]: a floor where it binds alone (a small map), so that the
    # large maps' ties, and their picks, stay as they were
    items_us = math.ceil(blocks / (hw.sm_count * bps)) * p["items"] * load_latency(hw)
    est.terms["t_items_us"] = items_us
    if items_us + hw.launch_overhead_us > est.time_us:
        est = Estimate(items_us + hw.launch_overhead_us, est.flops, est.bytes, est.terms)
    return est


def _row_cols_cost(k: Kernel, p: Mapping, blocks: int, threads: int, bps: int, types: Mapping, hw: Profile) -> Estimate:
    """The `cols` pass (codegen/row_cols.py): the input read once, a warp's lanes·16-byte runs using
    min(1, lanes·16 / 32) of each 32-byte sector, at the rate the resident blocks keep in flight
    (UNROLL 16-byte vectors a thread; `_combine`'s Little's law); then the slices' tree, log2(slices)
    + 1 barriers a block, once a wave."""
    sector = min(1.0, p["lanes"] * 16 / 32)
    row = row_reduce.analyze(k)
    flops = sum(op.type.numel * math.prod(op.reduce) * max(1, count_ops(op.body)) for op in k.ops)
    issued = 2.0 * sum(op.type.numel * math.prod(op.reduce)
                       * max(1, instructions(row_reduce.body(row, op), row_reduce.invariant(row), fast_math(k, types)))
                       for op in k.ops)
    waves = math.ceil(blocks / (hw.sm_count * bps))
    tree = waves * (math.log2(row_cols.slices(p)) + 1) * SYNC_LATENCY_US
    est = _combine(hw, flops=flops, issued=issued, dram=_io_bytes(k, types) / sector, l2=0.0, pipeline=tree,
                   blocks=blocks, threads=threads, bps=bps, inflight=threads * row_cols.UNROLL * 16)
    est.terms.update(sector_eff=sector, rows=math.prod(n for _, n in row.rows))
    return est


def _row_sector_eff(k: Kernel, p: Mapping, types: Mapping) -> float:
    """The share of each 32-byte sector a warp's loads use where the row input is strided along j
    (a channels-last image reduced over its positions): a warp reads min(tpr, 32) positions of
    32 / min(tpr, 32) consecutive rows, contiguous only where the innermost row variable is; 1
    where j is contiguous (the vectors). Measured: EfficientNet-B0 B32's squeezes at tpr = 8 ran
    3-8.7x their prediction without it (benchmarks/results/cnn_profiles_session15_h200.txt)."""
    row = row_reduce.analyze(k)
    inner = row_cols.channel(row.rows)
    eff = 1.0
    for ld in row.row_loads([e for _, e in row.body]):
        if not row.per_row(ld) or ld.buffer not in types or not all(isinstance(a, Affine) for a in ld.index):
            continue
        off = flat_offset(ld.index, types[ld.buffer])
        if off.coeff(row.j) in (0, 1):
            continue
        esize = ITEMSIZE[types[ld.buffer].dtype]
        rows_a_warp = 32 // min(p["tpr"], 32) if inner is not None and off.coeff(inner) == 1 else 1
        eff = min(eff, min(1.0, rows_a_warp * esize / 32))
    return eff


def _row_cost(k: Kernel, p: Mapping, blocks: int, threads: int, bps: int, types: Mapping, hw: Profile) -> Estimate:
    """Row passes: inputs read once and outputs written once, plus the re-reads of the row the
    schedule makes (`row_reduce.traversals`: none under `regs`, the output pass under `online`,
    every pass after the first under `multi`; a re-read of the stored prologue counts too). A
    re-read hits L2 while the rows in flight (resident blocks x rows per block x the row's
    bytes) fit in half the L2, and goes to DRAM otherwise. One block reduction per statistic
    (`online`: one for all) is the latency each wave cannot hide. The DRAM time is divided by
    the memory duty cycle, duty = min(1, bps·t_move / (t_move + t_wait)): t_move a block's rows
    at its SM's share of the bandwidth, t_wait a load round trip plus its reductions."""
    rows, _, cols = row_reduce.geometry(k)
    nrows = math.prod(n for _, n in rows)
    io = _io_bytes(k, types)
    seen: set[str] = set()
    reread = 0.0
    for bufs in row_reduce.traversals(k, p["pass"]):
        reread += sum(types[b].nbytes for b in bufs if b in seen or b in k.stores)
        seen |= bufs
    row_bytes = sum(types[b].nbytes for b in seen) / nrows
    in_flight = min(blocks, hw.sm_count * bps) * p["rpb"] * row_bytes
    fits = in_flight <= hw.l2_bytes / 2
    lane_eff = cols / (row_reduce.iters(k, p) * p["tpr"] * p["vec"])
    flops = sum(op.type.numel * math.prod(op.reduce) * max(1, count_ops(op.body)) for op in k.ops)
    row = row_reduce.analyze(k)
    issued = 2.0 * sum(op.type.numel * math.prod(op.reduce)
                       * max(1, instructions(row_reduce.body(row, op), row_reduce.invariant(row), fast_math(k, types)))
                       for op in k.ops)
    # A block reduction: shuffle steps, then (several warps) two barriers and a serial merge of
    # the warps' partials through shared memory.
    warps = p["tpr"] // 32
    steps = math.log2(min(p["tpr"], 32)) + (2 + warps - 1 if warps > 1 else 0)
    waves = math.ceil(blocks / (hw.sm_count * bps))
    reductions = 1 if p["pass"] == "online" else len(row_reduce.analyze(k).stats)
    latency = reductions * steps * SYNC_LATENCY_US
    pipeline = waves * latency
    # Memory duty cycle: a block moves its rows (t_move at its SM's share of the bandwidth)
    # and then waits on a load round trip and its reductions (t_wait); the SM's memory is busy
    # only while one of its resident blocks moves data.
    t_move = p["rpb"] * (io + reread) / nrows / (hw.dram_bandwidth_gbs * 1e3 * hw.efficiency["dram"] / hw.sm_count)
    t_wait = load_latency(hw) + latency
    duty = min(1.0, bps * t_move / (t_move + t_wait))
    dram, l2 = (io, reread) if fits else (io + reread, 0.0)
    # The duty cycle caps the DRAM rate an SM reaches however many warps it holds (a barrier
    # stalls all of a block's warps at once); ROW_ILP scales the warps needed to hide latency.
    # Only threads with a row count: a block of rpb row slots over fewer rows (a decode step's one
    # row) adds no memory parallelism with the rest (measured: one row at 256 threads x 1 row ran
    # faster than at 128 x 8, benchmarks/results/row_reduce_one_row_session12_h200.txt).
    sector = _row_sector_eff(k, p, types)
    est = _combine(hw, flops=flops, issued=issued / lane_eff, dram=dram / lane_eff / duty / sector,
                   l2=l2 / lane_eff / sector, pipeline=pipeline, blocks=blocks, threads=p["tpr"] * min(p["rpb"], nrows),
                   bps=bps, ilp=ROW_ILP)
    est.terms.update(lane_eff=lane_eff, sector_eff=sector, rows=nrows, reread_bytes=reread, duty=duty,
                     cached_per_thread=row_reduce.cached_elements(k, p))
    return est


def _gemm_cost(k: Kernel, p: Mapping, blocks: int, threads: int, bps: int, types: Mapping, hw: Profile) -> Estimate:
    """fp32 SIMT GEMM (the `gemm` template). Per thread and K step: TM·TN·BK FMAs, BK·(TM/VM +
    TN/VN) vector shared loads, LOAD_INSTRUCTIONS per element of the next step it fetches and
    stores, and STEP_INSTRUCTIONS of loop and barrier; an SM issues one instruction per FMA
    slot, so issue_eff = FMAs / all of them. Shared memory: the wavefronts of the template's
    fragment reads and tile stores (`gemm.smem_traffic`, bank conflicts included) at one
    128-byte wavefront per clock. The next step's tiles are in flight while this one is
    multiplied: one step ahead (t_pipeline as a two-stage tensor-core GEMM's), and DRAM sees
    (BM+BN)·BK·4 bytes in flight per resident block."""
    c, m, n, kk, batch = gemm.dims(k)
    nb = math.prod(e for _, e in batch)
    bm, bn, bk, tm, tn = p["BM"], p["BN"], p["BK"], p["TM"], p["TN"]
    vm, vn = gemm.vectors(p)
    la, lb = gemm.prefetch(p)
    ksteps = math.ceil(kk / bk)
    flops = 2.0 * nb * m * n * kk
    issued = 2.0 * nb * math.ceil(m / bm) * bm * math.ceil(n / bn) * bn * ksteps * bk
    fmas = tm * tn * bk
    issue_eff = fmas / (fmas + bk * (tm // vm + tn // vn) + LOAD_INSTRUCTIONS * (la + lb) + STEP_INSTRUCTIONS)
    read, write = gemm.smem_traffic(p, *gemm.operand_k_fast(k, types))
    warp_steps = nb * math.ceil(m / bm) * math.ceil(n / bn) * ksteps * math.ceil(threads / 32)
    smem = warp_steps * (read + write) * 128.0
    l2 = tile_rereads(c, m, n, bm, bn, batch, types)
    waves = math.ceil(blocks / (hw.sm_count * bps))
    # A block's K step: its multiply at the SM's rate, then the wait for the tiles fetched at its
    # start; other resident blocks fill that wait, a lone block (bps = 1) cannot.
    sm_rate = hw.peak_tflops["fp32_simt"] * 1e6 / hw.sm_count * hw.efficiency["fp32_simt"] * issue_eff
    step = 2.0 * bm * bn * bk / sm_rate
    pipeline = waves * ksteps * max(step + load_latency(hw), bps * step) / bps
    ilp = max(1.0, tm * tn / FMA_CHAINS_PER_WARP)
    store_eff, out_bytes = _simt_store_eff(k, p, types)
    est = _combine(hw, flops=flops, issued=issued, dram=_io_bytes(k, types) + out_bytes * (1 / store_eff - 1), l2=l2,
                   pipeline=pipeline,
                   blocks=blocks, threads=threads, bps=bps, issue_eff=issue_eff, ilp=ilp, ilp_max=SIMT_ILP_MAX,
                   smem=smem, inflight=(bm + bn) * bk * 4.0)
    est.terms["issue_eff"] = issue_eff
    est.terms["ilp"] = ilp
    est.terms["store_eff"] = store_eff
    return est


def _simt_store_eff(k: Kernel, p: Mapping, types: Mapping) -> tuple[float, float]:
    """(the share of each 32-byte sector a warp's epilogue stores use, the stored bytes) of the SIMT
    GEMM: the template stores one element per instruction; a warp's 32 threads are BN/TN columns
    (tx, VN elements apart) by 32·TN/BN rows (ty, VM apart), so along a contiguous n a row's
    elements of one store lie VN apart: BN/TN·esize bytes used of the sectors their span touches
    (along a contiguous m, likewise with the rows). Measured on an H200 (fp16, the 1x1 expansions
    of MobileNetV2 and EfficientNet-B0 at B32, channels-last, BN 32 TN 8 VN 4: a quarter of each
    sector): 401408x16x96 147.5 us and 100352x24x144 67.9 us, where the DRAM terms said 37.0 and
    24.8; mma and wgmma ran them in 61.1 / 25.7 and 41.5 / 17.2 (benchmarks/results/thin_k_gemm_session16_h200.txt)."""
    c = gemm.dims(k)[0]
    out_bytes = float(sum(types[s].nbytes for s in k.stores if s in types))
    if c.m is None or c.n is None or len(k.stores) != 1:
        return 1.0, out_bytes
    out, bind = gemm.store_target(k, types)
    esize = ITEMSIZE[out.type.dtype]
    off = element_offset(out, bind)
    vm, vn = gemm.vectors(p)
    cols = p["BN"] // p["TN"]
    rows = max(1, 32 // cols)
    if off.coeff(c.n) == 1:
        per, apart = min(cols, 32), vn
    elif off.coeff(c.m) == 1:
        per, apart = min(rows, 32), vm
    else:
        return esize / 32, out_bytes
    span = ((per - 1) * apart + 1) * esize
    return min(1.0, per * esize / (32 * math.ceil(span / 32))), out_bytes


def tile_rereads(c: Contraction, m: int, n: int, bm: int, bn: int, batch: list[tuple[str, int]],
                 types: Mapping) -> float:
    """L2 bytes a tiled GEMM's blocks read beyond each operand's one DRAM read. Every block of
    batch item b and tile (i, j) reads A's row panel (i of b) and B's column panel (j of b), so
    A is read ceil(N/BN)·nb/nb_A times over and B ceil(M/BM)·nb/nb_B, where nb_A (nb_B) is the
    product of the batch extents the operand's index uses:

        l2 = A·(ceil(N/BN)·nb/nb_A - 1) + B·(ceil(M/BM)·nb/nb_B - 1)

    An operand that ignores the batch (a weight under a batched activation: ResNet-50's
    channels-last 1x1 convolutions, 32 images of 49 pixels each as batch items of M = 49) is
    read whole by every batch item. Counting it once per tile row, as for an unbatched GEMM,
    missed 31 of the 32 reads of stage 4's 2 MB weights (64 MB of L2 traffic, about 6.4 us
    at 10 TB/s): their mma plans (BM=64 BN=128 and BN=256 SPLITK=2) measured 19.0-24.4 us on
    the H100 and H200 against 13.5-13.6 predicted (profile_resnet50_b32_session6_h100.txt,
    profile_resnet50_b32_wgmma_h200.txt); with the re-reads the model says 18.1 and 20.2."""
    nb = math.prod(e for _, e in batch)

    def per_item(ld: Load) -> float:   # how many batch items share one copy of the operand
        used = {v for ix in ld.index for v, _ in ix.terms}
        return nb / math.prod(e for v, e in batch if v in used)

    a_bytes, b_bytes = types[c.a.buffer].nbytes, types[c.b.buffer].nbytes
    return (a_bytes * (math.ceil(n / bn) * per_item(c.a) - 1)
            + b_bytes * (math.ceil(m / bm) * per_item(c.b) - 1))


SPLITK_OVERHEAD_US = 4.0   # fence, ticket and reduction of a split-k GEMM (default of the profile field)
MMA_UNIT = {"tf32": "tf32_tc", "f16": "fp16_tc", "bf16": "bf16_tc"}


def _mma_cost(k: Kernel, p: Mapping, blocks: int, threads: int, bps: int, types: Mapping, hw: Profile) -> Estimate:
    """Tensor-core GEMM: tile-padded MMA work at the unit's rate, shared-memory traffic of the
    warp tiles (a small warp tile reads more operand bytes per MMA), and the k-loop latency
    that STAGES-1 tiles in flight (and other resident blocks) hide; plus the epilogue's
    arithmetic, every block's on its SM, at the rate `cost_wgmma` measured.

    Known wrong on the H200 at small k (session 42, benchmarks/results/vendor_convs_session42_h200.txt): of
    the 56 `mma` GEMM candidates timed in four `aicfc tune` reports under --profile h200 (ResNet-50 B32's of
    sessions 29 and 40, MobileNetV2's and EfficientNet-B0's B32), 16 measure within [0.8, 1.25] of this
    prediction (geometric mean 1.43, worst with the fewest warps a block). A least-squares fit, measured =
    2.3 + 0.97·(the prediction less its epilogue) + 2.4·t_epilogue, brought 46 in band as two h200 profile
    terms (the epilogue x 2.6, 1.1 us a kernel more), but planned with them every small CNN ran slower
    (MobileNetV2 B32 / B1 0.965x / 0.783x, EfficientNet-B0 B32 / B1 0.946x / 0.875x, plan_ab): the simt
    and thin tiles the picks moved to run 1.6-2.3x their own predictions at those shapes (K 16-160). Not
    kept; the units' small-k terms need fitting together.

    Known wrong at one row (session 36, an H200, benchmarks/results/decode_chain_session36_h200.txt):
    planned with `--profile h200` the 1 B Llama's decode step puts its down projection (M = 1, K 5632,
    N 2048) on this unit, BM 32 BN 32 SPLITK 4, predicted 7.31 us; it measures 8.66 timed alone but
    19.5 in the decode chain (the gemv it displaces: 8.7 alone, 9.4 in the chain), and the 4-layer
    decode plan replays in 244.9 us against 193.4. The memory term sees enough bytes in flight (at
    the profile's 0.4 us load latency) and predicts the weight streaming at DRAM speed; what holds
    the unit back in the chain is not known. Under sm_90's profile (3.35 TB/s), which the decode
    benchmarks plan with, the gemv wins.
    Session 38 (an H200, benchmarks/results/one_row_tiles_session38_h200.txt, the 4-layer plan's timeline)
    ruled two causes out. Not the 64-byte runs of a BN 32 tile: the down projection pinned to BN 64 and
    BN 128 ran 23.6 and 20.5 us in the chain (9.1 and 11.6 alone), BN 32 20.0. Not bytes in flight alone:
    charging the Little's-law term with DRAM's round trip (1 us) and only A's rows below M (the rest are
    zero-filled) moved the pick to BN 64 with 6 splits (predicted 7.58 us), and with the mma out the
    wgmma tile (64x64, 4 splits as a cluster, predicted 7.41) took the projection: it measured 19.0 us
    alone and 20.2 in the chain, the plan 236.6 us against 194.7 (the gemv pinned: 194.3). So every tile
    unit streams a one-row weight at about 1.2 TB/s in the chain where the gemv (fitted on weights not in
    L2, planner/cost_gemv.py) streams at 2.2-2.5; the change was not kept."""
    c, m, n, kk, batch = gemm.dims(k)
    nb = math.prod(e for _, e in batch)
    bm, bn, bk, st = p["BM"], p["BN"], p["BK"], p["STAGES"]
    wtm, wtn = bm // p["WM"], bn // p["WN"]
    esize = ITEMSIZE[types[c.a.buffer].dtype]
    tiles = math.ceil(m / bm) * math.ceil(n / bn)
    ksteps = math.ceil(kk / bk)
    flops = 2.0 * nb * m * n * kk
    issued = 2.0 * nb * tiles * bm * bn * ksteps * bk
    # tf32 fragments are read with scalar 4-byte shared loads, some 2-way bank conflicted:
    # about twice the shared-memory time of an ldmatrix read of the same bytes
    frag = 2.0 if p["dtype"] == "tf32" else 1.0
    smem = nb * tiles * ksteps * bk * esize * ((bm + bn) + frag * p["WM"] * p["WN"] * (wtm + wtn))
    l2 = tile_rereads(c, m, n, bm, bn, batch, types)
    splits = p.get("SPLITK", 1)
    latency = load_latency(hw)
    waves = math.ceil(blocks / (hw.sm_count * bps))
    pipeline = waves * latency * (1 + math.ceil(ksteps / splits) / ((st - 1) * min(bps, 4)))
    dram = _io_bytes(k, types)
    if splits > 1:
        # partial tiles are written and read back (counted as DRAM traffic); the last split of
        # a tile waits on a fence and an atomic, then reads the others': a fixed overhead
        # (profile: splitk_overhead_us, measured on the H200) plus its reads on its own SM
        partial = nb * tiles * splits * bm * bn * 4.0
        dram += 2 * partial
        pipeline += (hw.data.get("splitk_overhead_us", SPLITK_OVERHEAD_US)
                     + (splits - 1) * bm * bn * 4.0 / (hw.l2_bandwidth_gbs * 1e3 / hw.sm_count))
    ilp = max(1.0, min(4.0, (wtm // 16) * (wtn // 8) / 8))
    inflight = (st - 1) * (bm + bn) * bk * esize
    frag_bytes = (wtm + wtn) * (8 if p["dtype"] == "tf32" else 16) * esize   # one MMA k-step's fragments
    est = _combine(hw, flops=flops, issued=issued, dram=dram, l2=l2, pipeline=pipeline,
                   blocks=blocks, threads=threads, bps=bps, ilp=ilp, unit=MMA_UNIT[p["dtype"]], smem=smem,
                   inflight=inflight, smem_inflight=frag_bytes)
    est.terms["ilp"] = ilp
    # The epilogue's arithmetic after each block's k-loop at the Hopper engine's measured rate per SM
    # (planner/cost_wgmma.py): an SM runs the epilogues of all the blocks it gets, and with a second
    # resident block half of that hides under its k-loop.
    epi = bm * bn * (epilogue_ops(k, types) + STORE_OPS) / hw.data.get("wgmma_epilogue_rate", EPILOGUE_RATE)
    t_epi = math.ceil(blocks / hw.sm_count) * epi / min(bps, 2)
    est.terms["t_epilogue_us"] = t_epi
    return Estimate(est.time_us + t_epi, est.flops, est.bytes, est.terms)


def hw_max_registers(p: Mapping) -> int:
    """Registers per thread under `__launch_bounds__(threads, 1)`: the SM's file over the block."""
    return gemm_wgmma.launch_registers(128 * (p["NWG"] + 1))


def _gemv_cost(k: Kernel, p: Mapping, blocks: int, threads: int, bps: int, types: Mapping, hw: Profile) -> Estimate:
    """gemv (codegen/gemm_gemv.py), a weight stream: `planner/cost_gemv.py` documents the formula."""
    c, m, n, kk, batch = gemm.dims(k)
    rows = m * math.prod(e for _, e in batch)
    dram = _io_bytes(k, types)
    t = profile_terms(p, rows, n, kk, ITEMSIZE[types[c.b.buffer].dtype], dram, bps, hw)
    if gemm.row_scale(k) is not None:   # [Note: a norm's row scale in the gemv]
        t["t_row_scale_us"] = constants(hw.data)["gemv_row_scale_us"]
        t["time_us"] += t["t_row_scale_us"]
    if p.get("JOIN"):   # [Note: the O projection joined to the attention]: no launch of its own, a publication instead
        t["t_join_us"] = constants(hw.data)["gemv_join_us"]
        return Estimate(t.pop("time_us") + t["t_join_us"], 2.0 * rows * n * kk, dram, t | {"launch_us": 0.0})
    time = t.pop("time_us") + hw.launch_overhead_us
    t["launch_us"] = hw.launch_overhead_us
    return Estimate(time, 2.0 * rows * n * kk, dram, t)


def _thin_cost(k: Kernel, p: Mapping, bps: int, types: Mapping, hw: Profile) -> Estimate:
    """thin (codegen/gemm_thin.py), a stream of A and the output: `planner/cost_thin.py` documents the formula."""
    c, m, n, kk, batch = gemm.dims(k)
    rows = m * math.prod(e for _, e in batch)
    dram = _io_bytes(k, types)
    t = thin_terms(p, rows, kk, epilogue_ops(k, types), dram, bps, hw)
    time = t.pop("time_us") + hw.launch_overhead_us
    t["launch_us"] = hw.launch_overhead_us
    return Estimate(time, 2.0 * rows * n * kk, dram, t)


def _wgmma_cost(k: Kernel, p: Mapping, types: Mapping, hw: Profile) -> Estimate:
    """The Hopper engine: `planner/cost_wgmma.py` documents the formula."""
    c, m, n, kk, batch = gemm.dims(k)
    t = wgmma_terms(k, p, types, hw, _io_bytes(k, types), load_latency(hw))
    flops = 2.0 * math.prod(e for _, e in batch) * m * n * kk
    time, dram = t.pop("time_us"), t.pop("dram")
    t.pop("issued")
    return Estimate(time, flops, dram, t)


# ---------------------------------------------------------------- attention

SOFTMAX_OPS = 12   # fp32 operations per score: the score expression, max, exp2 (a MUFU op costs
                   # several FMA slots), sum, rescale and the conversion of P


def _attention_registers(k: Kernel, p: Mapping, ops: int) -> int:
    _, _, _, d, dv = attention.dims(k)
    if p["unit"] == "split":
        return split_registers(attention_split.structure(attention.roles(k)).rows, d, dv, p, ops)
    if p["unit"] == "mma":
        mi, dp, dvp = p["BM"] // p["warps"] // 16, -(-d // 16) * 16, -(-dv // 16) * 16
        # S and O accumulators, Q fragments, P packed, running max and sum, addressing and loop state
        return 4 * mi * (p["BN"] // 8 + dvp // 8 + dp // 16 + 1) + 4 * mi + 48 + min(ops, 16)
    if p["unit"] == "wgmma":
        # S and O accumulators (OVERLAP: and P packed, all live while P·V runs under the softmax),
        # D/8 for the k-steps' addressing, BN/8 per mask value read (ptxas prefetches a tile's),
        # and the rest. Fitted to ptxas (CUDA 13) under the 168 registers of NWG = 3, where it
        # separates the tiles that fit from those that spill (D = 64: BN = 128 fits; D = 128:
        # BN = 128 fits serial only, and with a mask not at all; D = 192 spills); ptxas with 255
        # registers to spend takes up to 40 more than this (NWG = 1), without spilling at D <= 256
        att = attention.roles(k)
        reads = 0 if p["causal"] else len({ld.buffer for ld in loads(att.logits)} - {att.scores.out})
        acc = p["BN"] // 2 + dv // 2 + (p["BN"] // 4 if p["OVERLAP"] else 0)
        return acc + d // 8 + p["BN"] // 8 * reads + 16 + min(ops, 16)
    return p["BN"] // p["TPR"] + -(-dv // p["TPR"]) + 40 + min(ops, 16)


def _key_tiles(sq: int, sk: int, bm: int, bn: int, causal: bool) -> int:
    """Key tiles all query tiles of one batch visit (causal: only those reaching j <= i)."""
    kt = math.ceil(sk / bn)
    if not causal:
        return math.ceil(sq / bm) * kt
    return sum(min(kt, (min(sq, (t + 1) * bm) - 1) // bn + 1) for t in range(math.ceil(sq / bm)))


def _attention_cost(k: Kernel, p: Mapping, blocks: int, threads: int, bps: int, types: Mapping,
                    hw: Profile) -> Estimate:
    """Streaming attention. FLOPs = 2·B·H·Sq·Sk·(D + Dv), i.e. 4·B·H·S²·D, halved for causal;
    issued: the same over the padded tiles actually visited (causal: the tiles on or below the
    diagonal) at the tensor-core rate (mma) or the fp32 rate (simt), plus SOFTMAX_OPS fp32
    operations per visited score, converted to the unit's time. DRAM bytes: Q + K + V + O, plus
    the mask unless it is causal (then it is not read); every query tile after the first of a
    batch re-reads K and V from L2. Shared memory: each K/V tile written once and read by every
    warp (ldmatrix), Q once. Pipeline: one load latency per key tile, hidden by the double
    buffer and by the other resident blocks. Occupancy and waves as for every family.

    wgmma (mma and simt where the profile has their EFF_KEYS): a schedule of blocks, each a fixed cost
    plus its key tiles at the slower of the tile's products and its softmax
    (planner/cost_attention_wgmma.py), fitted to the H200."""
    nb, sq, sk, d, dv = attention.dims(k)
    if p["unit"] == "split":   # few query rows, the keys split over blocks: planner/cost_attention_split.py
        return _split_attention_cost(k, p, bps, types, hw)
    bm, bn, causal = p["BM"], p["BN"], bool(p["causal"])
    visited = nb * _key_tiles(sq, sk, bm, bn, causal)
    flops = 2.0 * nb * sq * sk * (d + dv) * (0.5 if causal else 1.0)
    wg = p["unit"] == "wgmma"
    mma = p["unit"] == "mma" or wg
    pd, pdv = (-(-d // 16) * 16, -(-dv // 16) * 16) if mma else (d, dv)
    scores = visited * bm * bn
    unit = MMA_UNIT[p["dtype"]] if mma else "fp32_simt"
    eff = hw.efficiency
    to_unit = hw.peak_tflops[unit] * eff["mma_sync" if mma else "fp32_simt"] / (hw.peak_tflops["fp32_simt"] * eff["fp32_simt"])
    tensor = 2.0 * scores * (pd + pdv)
    softmax = SOFTMAX_OPS * scores * to_unit
    issued = tensor + softmax
    att = attention.roles(k)
    mask = {ld.buffer for ld in loads(att.logits) if ld.buffer != att.scores.out}
    dram = _io_bytes(k, types) - (sum(types[b].nbytes for b in mask) if causal else 0)
    if wg or EFF_KEYS[p["unit"]] in hw.data:   # a schedule of blocks: planner/cost_attention_wgmma.py
        t_dram = dram / (hw.dram_bandwidth_gbs * 1e3 * eff["dram"])
        terms = wgmma_attention_terms(nb, sq, sk, d, dv, p, bps, hw, t_dram, load_latency(hw),
                                      TC_EFF if wg else hw.data[EFF_KEYS[p["unit"]]], None if mma else "fp32_simt",
                                      threads / 128)
        return Estimate(terms.pop("time_us"), flops, dram, terms)
    kv = types[att.k.buffer].nbytes + types[att.v.buffer].nbytes
    tiles_m = math.ceil(sq / bm)
    l2 = kv * (visited / max(1, nb * math.ceil(sk / bn)) - 1) if tiles_m > 1 else 0.0
    esize = ITEMSIZE[types[att.k.buffer].dtype] if mma else 4
    readers = p["warps"] if mma else threads // 32
    smem = visited * bn * (pd + pdv) * esize * (1 + readers) + nb * tiles_m * bm * pd * esize * 2
    latency = load_latency(hw)
    waves = math.ceil(blocks / (hw.sm_count * bps))
    per_block = visited / max(1, blocks)
    overlap = (p.get("STAGES", 2) - 1) if mma else 0
    pipeline = waves * latency * (1 + per_block / ((1 + overlap) * min(bps, 4)))
    rows = bm // p["warps"] if mma else 0   # a warp's accumulator rows
    ilp = max(1.0, min(4.0, (rows // 16) * (bn // 8 + pdv // 8) / 8)) if mma else 1.0
    est = _combine(hw, flops=flops, issued=issued, dram=dram, l2=l2, pipeline=pipeline, blocks=blocks,
                   threads=threads, bps=bps, ilp=ilp, unit=unit, smem=smem)
    est.terms["ilp"] = ilp
    est.terms["key_tiles"] = visited
    return est


def _split_attention_cost(k: Kernel, p: Mapping, bps: int, types: Mapping, hw: Profile) -> Estimate:
    """Split-KV attention: DRAM bytes are Q, K, V, O and the mask as for every unit, plus the
    partials written and read back; the time is planner/cost_attention_split.py's."""
    nb, sq, sk, d, dv = attention.dims(k)
    sp = attention_split.structure(attention.roles(k))
    partials = 2.0 * attention_split.partial_floats(sp.nkv, sp.rows, dv, p["SPLITS"]) * 4
    dram = _io_bytes(k, types) + partials
    t_dram = dram / (hw.dram_bandwidth_gbs * 1e3 * hw.efficiency["dram"])
    att = attention.roles(k)
    terms = split_attention_terms(sp.nkv, sp.rows, sk, d, dv, dict(p), bps, hw, t_dram, instructions(att.logits))
    return Estimate(terms.pop("time_us"), 2.0 * nb * sq * sk * (d + dv), dram, terms)


# ---------------------------------------------------------------- conv (implicit GEMM) and window

GATHER_INSTRUCTIONS = 12   # integer instructions to split a flat (m, k) pair and test the padding
CONV_GATHER_SLOWDOWN = 2.5  # measured / predicted of this family on ResNet-50 (profile: conv_gather_slowdown)


def _conv_cost(k: Kernel, p: Mapping, blocks: int, threads: int, bps: int, types: Mapping, hw: Profile) -> Estimate:
    """An implicit GEMM: the GEMM's terms over the padded tiles (tensor-core rate under mma),
    plus the gather: every staged image element costs GATHER_INSTRUCTIONS integer instructions
    (counted at the fp32 rate) and is a synchronous load, so the k-loop latency is hidden only
    by other resident blocks, not by the pipeline's stages. DRAM: image, filter and output once
    (the image's re-reads by neighbouring windows and by every column tile hit in L2)."""
    g, m, n, kk, batch = conv.dims(k)
    nb = math.prod(e for _, e in batch)
    mma = p["unit"] == "mma"
    bm, bn, bk = p["BM"], p["BN"], p["BK"]
    tiles = math.ceil(m / bm) * math.ceil(n / bn)
    ksteps = math.ceil(kk / bk)
    flops = 2.0 * nb * m * n * kk
    issued = 2.0 * nb * tiles * bm * bn * ksteps * bk
    gathered = nb * tiles * ksteps * bk * (bm + bn)
    unit = MMA_UNIT[p["dtype"]] if mma else "fp32_simt"
    eff = hw.efficiency
    to_unit = (hw.peak_tflops[unit] * eff["mma_sync" if mma else "fp32_simt"]
               / (hw.peak_tflops["fp32_simt"] * eff["fp32_simt"]))
    issued += 2.0 * GATHER_INSTRUCTIONS * gathered * to_unit
    a_bytes = nb * m * kk * ITEMSIZE[types[g.a.buffer].dtype]     # the im2col matrix, as re-read
    b_bytes = types[g.b.buffer].nbytes
    l2 = a_bytes * math.ceil(n / bn) + b_bytes * (math.ceil(m / bm) - 1)
    waves = math.ceil(blocks / (hw.sm_count * bps))
    pipeline = waves * ksteps * load_latency(hw) / max(1, min(bps, 4))
    issue_eff = 1.0 if mma else min(1.0, (p["TM"] * p["TN"]) / (p["TM"] + p["TN"]) / 2.0)
    smem = 0.0
    if mma:
        esize = ITEMSIZE[types[g.a.buffer].dtype]
        smem = nb * tiles * ksteps * bk * esize * ((bm + bn) + p["WM"] * p["WN"] * (bm // p["WM"] + bn // p["WN"]))
    est = _combine(hw, flops=flops, issued=issued, dram=_io_bytes(k, types), l2=l2, pipeline=pipeline,
                   blocks=blocks, threads=threads, bps=bps, issue_eff=issue_eff, unit=unit, smem=smem)
    est.terms["gathered_elements"] = gathered
    # Measured on an H200 (issue 17, ResNet-50 fp16 B32): every convolution of this family took 2.5-5x
    # its predicted time; the low end scales what is not launch overhead, so that the Hopper engine's
    # implicit GEMM (planner/cost_conv_wgmma.py) and an input's channels-last copy are weighed against it.
    slow = hw.data.get("conv_gather_slowdown", CONV_GATHER_SLOWDOWN)
    est.terms["gather_slowdown"] = slow
    return Estimate(hw.launch_overhead_us + (est.time_us - hw.launch_overhead_us) * slow, est.flops, est.bytes, est.terms)


def _stem_cost(k: Kernel, p: Mapping, bps: int, types: Mapping, hw: Profile) -> Estimate:
    """stem (codegen/conv_stem.py), a block an output tile fed from its image patch: `planner/cost_conv_stem.py`
    documents the formula."""
    m, n, kk = conv_wgmma.dims(k)
    dram = _io_bytes(k, types)
    t = stem_terms(k, p, types, bps, epilogue_ops(k, types), dram, hw)
    time = t.pop("time_us") + hw.launch_overhead_us
    t["launch_us"] = hw.launch_overhead_us
    return Estimate(time, 2.0 * m * n * kk, dram, t)


def _conv_wgmma_cost(k: Kernel, p: Mapping, types: Mapping, hw: Profile) -> Estimate:
    """A convolution on Hopper's tensor cores: the implicit GEMM (`planner/cost_conv_wgmma.py` documents the
    formula), unit `taps`, its image read once a tile (`planner/cost_conv_taps.py`), unit `pool`, the
    convolution and the max pool over it (`planner/cost_conv_pool.py`), or unit `band`, a tile's image rows read
    once a channel block (`planner/cost_conv_band.py`)."""
    m, n, kk = conv_wgmma.dims(k)
    terms = {"taps": taps_terms, "pool": pool_terms, "band": band_terms}.get(p["unit"], conv_wgmma_terms)
    t = terms(k, p, types, hw, _io_bytes(k, types), load_latency(hw))
    time, dram = t.pop("time_us"), t.pop("dram")
    # the products the kernel runs: a gathered stem's XP skips its k16 steps of zeros (cost_conv_pool, "k_run")
    return Estimate(time, 2.0 * m * n * kk * t.get("k_run", 1.0), dram, t)


def _window_l2_bytes(red, ld, taps: int, blocks: int, types: Mapping) -> float:
    """What one load of a window's taps draws from L2. A table indexed by no output variable but
    the innermost (a depthwise weight, per channel) stays in L1: each block reads it once. The
    image: a block's neighbouring outputs share their taps along the window's last axis (they
    hit in L1), so it reaches L2 once per row of taps (MobileNetV2's depthwise 3x3 at B32:
    session 15, benchmarks/results/cnn_profiles_session15_h200.txt)."""
    t = types[ld.buffer]
    size = ITEMSIZE[t.dtype]
    used = {v for a in ld.index for v in index_vars(a)}
    if not used & set(red.domain_vars[:-1]):
        return blocks * min(t.numel, taps / max(1, blocks)) * size
    return taps * size / (red.reduce[-1] if red.reduce else 1)


def _window_cost(k: Kernel, p: Mapping, blocks: int, threads: int, bps: int, types: Mapping,
                 hw: Profile) -> Estimate:
    """A direct window reduction: every tap is a load and the body's instructions; inputs move
    from DRAM once (overlapping windows re-read from L1/L2, `_window_l2_bytes` counts what L2
    serves). On vectors, a thread's instructions are counted from what it issues
    (`_window_vector_instructions`)."""
    red = k.ops[0]
    taps = red.type.numel * math.prod(red.reduce)
    flops = taps * max(1, count_ops(red.body))
    l2 = sum(_window_l2_bytes(red, ld, taps, blocks, types) for ld in loads(red.body))
    if p.get("TILE"):
        t = tile_terms(k, p, types, hw, _window_vector_instructions(k, p, types, from_boxes=True), bps)
        return _combine(hw, flops=flops, issued=t["issued"], dram=_io_bytes(k, types), l2=t["l2"],
                        pipeline=t["pipeline"], blocks=blocks, threads=threads, bps=bps, ilp=2.0)
    if p.get("vec", 1) > 1:
        per_thread = _window_vector_instructions(k, p, types)
        issued = 2.0 * red.type.numel / (p["vec"] * p.get("PX", 1)) * per_thread
    else:
        issued = 2.0 * taps * (max(1, instructions(red.body)) + 2 * len(loads(red.body)))
    # A thread of one output vector has its taps' loads in flight at once (ilp 2); a run's FMAs into PX
    # accumulators wait on loads issued as they go, with the registers (100-160) leaving 8-16 warps an SM:
    # EfficientNet-B0's 5x5 at 14x14, PX 4 at 158 registers, 8 warps an SM, measured 31.9 us where ilp 2
    # predicted 16.3 (an H200, session 34)
    return _combine(hw, flops=flops, issued=issued, dram=_io_bytes(k, types), l2=l2, pipeline=0.0,
                    blocks=blocks, threads=threads, bps=bps, ilp=2.0 if p.get("PX", 1) == 1 else 1.0)


WINDOW_INDEX_OPS = 24     # splitting a thread's flat index into its variables
WINDOW_LOAD_OPS = 4       # a vector load and its address
WINDOW_GUARD_OPS = 3      # a guarded load's test of the padding
WINDOW_STORE_OPS = 3      # a vector store and its address


def _window_vector_instructions(k: Kernel, p: Mapping, types: Mapping, from_boxes: bool = False) -> float:
    """Instructions one thread of a vector window issues: its index, each distinct load once
    (`window.run_loads`: with PX outputs a run, the loads its outputs share count once) with a
    conversion an element for 16-bit data, the body's operations and the combine (fused: the
    body's count, at least one) for every (output, tap) element, the epilogue's and the stores.
    MobileNetV2's 3x3 depthwise over 32 x 112 x 112 x 32, PX 1: counted 380, ncu 402 (an H200,
    session 34). `from_boxes`: the body's loads read shared memory with no guard (unit tile)."""
    vec, px = p["vec"], p.get("PX", 1)
    kk = window.without_unit_taps(k)
    red = kk.ops[0]
    run = window_tile.run_var(kk) if from_boxes else None
    body = {at for _, ats in window.run_loads(kk, px, run) for at in ats.values()}
    distinct = body | {at for _, ats in window.epilogue_loads(kk, px, run) for at in ats.values()}

    def load_ops(ld: Load) -> float:
        convert = vec if ITEMSIZE[types[ld.buffer].dtype] < 4 else 0
        if from_boxes and ld in body:   # fp32 in the box: converted once, as it is copied (tile_terms)
            return TILE_LOAD_OPS * math.ceil(vec / 4)
        return WINDOW_LOAD_OPS + convert + (WINDOW_GUARD_OPS if ld.fill is not None and ld.guarded_dims else 0)

    per_output = math.prod(red.reduce) * max(1, instructions(red.body))
    if len(kk.ops) == 2:
        per_output += instructions(kk.ops[1].body)
    out_t = types[kk.ops[-1].out]
    pack = vec // 2 if ITEMSIZE[out_t.dtype] < 4 else 0
    return (WINDOW_INDEX_OPS + sum(load_ops(ld) for ld in distinct) + px * vec * per_output
            + px * (pack + WINDOW_STORE_OPS))
