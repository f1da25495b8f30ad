"""plan_schedules: Decision IR → Decision IR with a schedule on every kernel.

For each kernel: enumerate its family's parameter space (declared beside the template),
drop candidates that break a hardware constraint of the target profile (threads per block,
static shared memory per block, estimated registers per thread, at least one resident block
per SM), rank the rest by the analytic cost model (`planner/cost.py`) and take the cheapest.
The decision keeps the runners-up with their predicted times and the rejected with the
constraint they broke.

    kernel k0 gemm { ... }
  becomes
    kernel k0 gemm { ...
      schedule {BK=16, BM=32, BN=32, TM=2, TN=2} grid=[4,1,1] block=[256,1,1] smem=0 registers=unknown
      predicted {time_us=3.1, ...}
      candidate {...} time_us=3.3
      candidate {...} rejected "shared memory 66560 B > 49152 B per block" }
"""
from __future__ import annotations

import re

from aicfc.codegen import FAMILIES
from aicfc.ir.decision import Candidate, Plan, Schedule
from aicfc.planner.cost import blocks_per_sm, cost, estimate_registers
from aicfc.planner.hardware import Profile

KEEP_RUNNERS_UP = 6
KEEP_REJECTED = 6


def _params(p: dict) -> tuple:
    return tuple(sorted(p.items()))


def plan_schedules(plan: Plan, hw: Profile) -> Plan:
    types = plan.types()
    kernels = []
    for k in plan.kernels:
        family = FAMILIES[k.family]
        ranked, rejected = [], []
        for p in family.space(k):
            grid, block, dyn = family.launch(k, p)
            threads = block[0] * block[1] * block[2]
            smem = family.static_smem(k, p) + dyn
            regs = estimate_registers(k, p)
            why = None
            if not 32 <= threads <= hw.max_threads_per_block:
                why = f"{threads} threads per block outside 32..{hw.max_threads_per_block}"
            elif smem > hw.smem_per_block_static:
                why = f"shared memory {smem} B > {hw.smem_per_block_static} B per block"
            elif regs > hw.max_registers_per_thread:
                why = f"estimated {regs} registers per thread > {hw.max_registers_per_thread}"
            elif blocks_per_sm(threads, smem, regs, hw)[0] < 1:
                why = f"no block fits on an SM ({blocks_per_sm(threads, smem, regs, hw)[1]})"
            if why:
                rejected.append(Candidate(_params(p), None, why))
                continue
            est = cost(k, p, grid, block, smem, regs, types, hw)
            ranked.append((est.time_us, _params(p), grid, block, dyn, est))
        ranked.sort(key=lambda r: (r[0], r[1]))
        best = ranked[0]
        seen_reasons: set[str] = set()
        kept_rejected = []
        for c in rejected:
            kind = re.sub(r"[\d.]+", "N", c.rejected_because)
            if kind not in seen_reasons and len(kept_rejected) < KEEP_REJECTED:
                seen_reasons.add(kind)
                kept_rejected.append(c)
        candidates = tuple(Candidate(r[1], round(r[0], 4)) for r in ranked[1:1 + KEEP_RUNNERS_UP])
        schedule = Schedule(best[1], best[2], best[3], best[4], None, best[5].as_items(),
                            candidates + tuple(kept_rejected))
        kernels.append(k.replace(schedule=schedule))
    return plan.replace(kernels=tuple(kernels))
