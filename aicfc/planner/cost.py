"""The analytic cost model: predicted time of one kernel under one schedule.

Every family's cost is the same formula over family-specific counts:

    t = max(max(t_dram + t_l2, t_compute, t_smem) / (parallel_eff * wave_eff), t_pipeline) + launch

    t_dram       = dram_bytes / (dram_bandwidth * eff.dram)       each tensor moved once
    t_l2         = l2_bytes / l2_bandwidth                        re-reads that hit in L2
    t_compute    = flops_issued / (peak_unit * eff.unit * issue_eff)
                   unit: fp32_simt, or the tensor-core rate of the mma type (eff.mma_sync)
    t_smem       = shared-memory bytes read and written / (SMs * smem_bandwidth_per_sm)
                   (tensor-core GEMMs: fragments per warp tile, staged tiles per block)
    t_pipeline   = serialized latency the schedule cannot hide (GEMM k-steps, reduction trees)
    parallel_eff = (active SMs / SMs) * min(1, warps per active SM * ilp / eff.min_warps_per_sm)
                   active SMs = min(blocks, SMs): a grid smaller than the machine leaves SMs idle
    wave_eff     = (blocks / per_wave) / ceil(blocks / per_wave)  when more than one wave
    per_wave     = SMs * blocks_per_sm;  blocks_per_sm from threads, shared memory, registers

Coefficients (bandwidths, peaks, efficiencies, launch overhead) come from the hardware
profile; `aicfc tune` is where they get calibrated. `load_latency_us` (optional, default
LOAD_LATENCY_US) is one global-load round trip plus a barrier: the unit of a GEMM's
t_pipeline. Register counts at planning time are an estimate (stated as such in `explain`);
the chosen kernel's real count comes from ptxas.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping

from aicfc.codegen import gemm, row_reduce
from aicfc.ir.decision import Kernel
from aicfc.ir.lowered import count_ops, loads
from aicfc.ir.types import ITEMSIZE
from aicfc.planner.hardware import Profile

LOAD_LATENCY_US = 0.4      # one global-load round trip plus a barrier, per GEMM k-step
SYNC_LATENCY_US = 0.02     # one shuffle or barrier step in a reduction tree


@dataclass(frozen=True)
class Estimate:
    time_us: float
    flops: float
    bytes: float
    terms: dict[str, float]

    def as_items(self) -> tuple[tuple[str, float], ...]:
        items = {"time_us": self.time_us, "flops": self.flops, "bytes": self.bytes, **self.terms}
        return tuple(sorted((k, round(float(v), 6)) for k, v in items.items()))


def blocks_per_sm(threads: int, smem: int, regs: int, hw: Profile) -> tuple[int, str]:
    """Resident blocks per SM and the resource that limits it."""
    warps = math.ceil(threads / 32)
    regs_per_block = math.ceil(warps * 32 * max(regs, 1) / 256) * 256   # allocation granularity
    limits = {
        "threads": hw.max_threads_per_sm // (warps * 32),
        "blocks": hw.max_blocks_per_sm,
        "registers": hw.registers_per_sm // regs_per_block,
        "shared memory": hw.smem_per_sm // smem if smem else hw.max_blocks_per_sm,
    }
    which = min(limits, key=lambda k: limits[k])
    return limits[which], which


def _combine(hw: Profile, *, flops: float, issued: float, dram: float, l2: float, pipeline: float,
             blocks: int, threads: int, bps: int, issue_eff: float = 1.0, ilp: float = 1.0,
             unit: str = "fp32_simt", smem: float = 0.0) -> Estimate:
    eff = hw.efficiency
    t_dram = dram / (hw.dram_bandwidth_gbs * 1e3 * eff["dram"])
    t_l2 = l2 / (hw.l2_bandwidth_gbs * 1e3)
    unit_eff = eff["fp32_simt"] if unit == "fp32_simt" else eff["mma_sync"]
    t_compute = issued / (hw.peak_tflops[unit] * 1e6 * unit_eff * issue_eff)
    t_smem = smem / (hw.sm_count * hw.smem_bandwidth_gbs_per_sm * 1e3)
    per_wave = hw.sm_count * bps
    active_sms = min(blocks, hw.sm_count)
    warps_per_sm = min(blocks, per_wave) * math.ceil(threads / 32) / active_sms
    parallel = active_sms / hw.sm_count * min(1.0, warps_per_sm * ilp / eff["min_warps_per_sm"])
    waves = blocks / per_wave
    wave_eff = waves / math.ceil(waves) if waves > 1 else 1.0
    # Latency along a block's own critical path (pipeline) is not divided by parallelism.
    time = max(max(t_dram + t_l2, t_compute, t_smem) / (parallel * wave_eff), pipeline) + hw.launch_overhead_us
    return Estimate(time, flops, dram, {
        "t_dram_us": t_dram, "t_l2_us": t_l2, "t_compute_us": t_compute, "t_smem_us": t_smem,
        "t_pipeline_us": pipeline,
        "parallel_eff": parallel, "wave_eff": wave_eff, "launch_us": hw.launch_overhead_us,
        "blocks": blocks, "blocks_per_sm": bps})


def _io_bytes(k: Kernel, types: Mapping) -> float:
    reads = {ld.buffer for op in k.ops for ld in loads(op.body) if ld.buffer not in k.outs}
    return sum(types[b].nbytes for b in reads) + sum(types[s].nbytes for s in k.stores)


def estimate_registers(k: Kernel, p: Mapping) -> int:
    """A planning-time register estimate (explain labels it as one)."""
    ops = sum(count_ops(op.body) for op in k.ops)
    if k.family == "gemm" and p["unit"] == "mma":
        mi, ni = p["BM"] // p["WM"] // 16, p["BN"] // p["WN"] // 8
        # accumulators + double-buffered A/B fragments + addressing and loop state
        return 4 * mi * ni + 8 * mi + 4 * ni + 40 + min(ops, 16)
    if k.family == "gemm":
        return p["TM"] * p["TN"] + p["TM"] + p["TN"] + 32 + min(ops, 32)
    return 24 + min(2 * ops, 64)


def cost(k: Kernel, p: Mapping, grid: tuple[int, int, int], block: tuple[int, int, int], smem: int,
         regs: int, types: Mapping, hw: Profile) -> Estimate:
    threads = block[0] * block[1] * block[2]
    blocks = grid[0] * grid[1] * grid[2]
    bps, _ = blocks_per_sm(threads, smem, regs, hw)
    if k.family == "gemm" and p["unit"] == "mma":
        return _mma_cost(k, p, blocks, threads, bps, types, hw)
    if k.family == "gemm":
        return _gemm_cost(k, p, blocks, threads, bps, types, hw)
    if k.family == "row_reduce":
        return _row_cost(k, p, blocks, threads, bps, types, hw)
    out = k.ops[-1]
    flops = out.type.numel * max(1, count_ops(out.body))
    return _combine(hw, flops=flops, issued=flops, dram=_io_bytes(k, types), l2=0.0, pipeline=0.0,
                    blocks=blocks, threads=threads, bps=bps, ilp=min(p["items"], 4))


def _row_cost(k: Kernel, p: Mapping, blocks: int, threads: int, bps: int, types: Mapping, hw: Profile) -> Estimate:
    rows, _, cols = row_reduce.geometry(k)
    nrows = math.prod(n for _, n in rows)
    passes = len(k.ops)
    io = _io_bytes(k, types)
    reread = (passes - 1) * (io - sum(types[s].nbytes for s in k.stores))
    lane_eff = cols / (math.ceil(cols / p["tpr"]) * p["tpr"])
    flops = sum(op.type.numel * math.prod(op.reduce) * max(1, count_ops(op.body)) for op in k.ops)
    steps = math.log2(min(p["tpr"], 32)) + (2 if p["tpr"] > 32 else 0)
    waves = math.ceil(blocks / (hw.sm_count * bps))
    pipeline = waves * (passes - 1) * steps * SYNC_LATENCY_US
    est = _combine(hw, flops=flops, issued=flops / lane_eff, dram=io / lane_eff, l2=reread / lane_eff,
                   pipeline=pipeline, blocks=blocks, threads=threads, bps=bps)
    est.terms["lane_eff"] = lane_eff
    est.terms["rows"] = nrows
    return est


def _gemm_cost(k: Kernel, p: Mapping, blocks: int, threads: int, bps: int, types: Mapping, hw: Profile) -> Estimate:
    c, m, n, kk, batch = gemm.dims(k)
    nb = math.prod(e for _, e in batch)
    bm, bn, bk, tm, tn = p["BM"], p["BN"], p["BK"], p["TM"], p["TN"]
    flops = 2.0 * nb * m * n * kk
    issued = 2.0 * nb * math.ceil(m / bm) * bm * math.ceil(n / bn) * bn * math.ceil(kk / bk) * bk
    a_bytes, b_bytes = types[c.a.buffer].nbytes, types[c.b.buffer].nbytes
    l2 = a_bytes * (math.ceil(n / bn) - 1) + b_bytes * (math.ceil(m / bm) - 1)
    # Shared-memory operand reads per FMA are (TM+TN)/(TM*TN); an SM issues 4 FMAs per word read.
    issue_eff = min(1.0, (tm * tn) / (tm + tn) / 2.0)
    waves = math.ceil(blocks / (hw.sm_count * bps))
    pipeline = waves * math.ceil(kk / bk) * hw.data.get("load_latency_us", LOAD_LATENCY_US) / max(1, min(bps, 4))
    est = _combine(hw, flops=flops, issued=issued, dram=_io_bytes(k, types), l2=l2, pipeline=pipeline,
                   blocks=blocks, threads=threads, bps=bps, issue_eff=issue_eff)
    est.terms["issue_eff"] = issue_eff
    return est


SPLITK_OVERHEAD_US = 4.0   # fence, ticket and reduction of a split-k GEMM (default of the profile field)
MMA_UNIT = {"tf32": "tf32_tc", "f16": "fp16_tc", "bf16": "bf16_tc"}


def _mma_cost(k: Kernel, p: Mapping, blocks: int, threads: int, bps: int, types: Mapping, hw: Profile) -> Estimate:
    """Tensor-core GEMM: tile-padded MMA work at the unit's rate, shared-memory traffic of the
    warp tiles (a small warp tile reads more operand bytes per MMA), and the k-loop latency
    that STAGES-1 tiles in flight (and other resident blocks) hide."""
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
    a_bytes, b_bytes = types[c.a.buffer].nbytes, types[c.b.buffer].nbytes
    l2 = a_bytes * (math.ceil(n / bn) - 1) + b_bytes * (math.ceil(m / bm) - 1)
    splits = p.get("SPLITK", 1)
    latency = hw.data.get("load_latency_us", LOAD_LATENCY_US)
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
    est = _combine(hw, flops=flops, issued=issued, dram=dram, l2=l2, pipeline=pipeline,
                   blocks=blocks, threads=threads, bps=bps, ilp=ilp, unit=MMA_UNIT[p["dtype"]], smem=smem)
    est.terms["ilp"] = ilp
    return est
