"""plan_schedules: Decision IR → Decision IR with a schedule on every kernel.

For each kernel: enumerate its family's parameter space (declared beside the template, and
shaped by the precision policy: tensor-core candidates exist only where it allows them),
drop candidates that break a hardware constraint of the target profile (threads per block,
static and dynamic shared memory per block, estimated registers per thread, at least one
resident block per SM), rank the rest by the analytic cost model (`planner/cost.py`) and take the cheapest.
The decision keeps the runners-up with their predicted times and the rejected with the
constraint they broke. Kernels that differ only in the names of their tensors (the layers of
a transformer) are the same problem: it is solved once (`structure`).

    kernel k0 gemm { ... }
  becomes
    kernel k0 gemm { ...
      schedule {BK=16, BM=32, BN=32, TM=2, TN=2} grid=[4,1,1] block=[256,1,1] smem=0 registers=unknown
      predicted {time_us=3.1, ...}
      candidate {...} time_us=3.3
      candidate {...} rejected "shared memory 66560 B > 49152 B per block" }
"""
from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from typing import Any, Hashable, Mapping

from aicfc.codegen import FAMILIES
from aicfc.errors import AicfError
from aicfc.ir.decision import Candidate, Kernel, Plan, Schedule
from aicfc.ir.lowered import Load, Rewrite, map_loads
from aicfc.ir.types import TensorType
from aicfc.planner.cost import Estimate, blocks_per_sm, cost, estimate_registers
from aicfc.planner.hardware import Profile

KEEP_RUNNERS_UP = 6
KEEP_REJECTED = 6


def _params(p: dict) -> tuple:
    return tuple(sorted(p.items()))


@dataclass(frozen=True)
class Ranked:
    """One feasible candidate with its launch shape and predicted cost."""

    params: dict[str, Any]
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    dyn_smem: int
    estimate: Estimate

    @property
    def time_us(self) -> float:
        return self.estimate.time_us


def rank(k: Kernel, plan: Plan, hw: Profile) -> tuple[list[Ranked], list[Candidate]]:
    """Every candidate of `k`'s space: the feasible ones cheapest first, and the rejected."""
    types = plan.types()
    family = FAMILIES[k.family]
    ranked, rejected = [], []
    for why_params, why in getattr(family, "declined", lambda k, plan: [])(k, plan):
        rejected.append(Candidate(_params(why_params), None, why))
    for p in family.space(k, plan):
        grid, block, dyn = family.launch(k, p)
        threads = block[0] * block[1] * block[2]
        static = family.static_smem(k, p)
        smem = static + dyn
        regs = estimate_registers(k, p)
        why = None
        if not 32 <= threads <= hw.max_threads_per_block:
            why = f"{threads} threads per block outside 32..{hw.max_threads_per_block}"
        elif static > hw.smem_per_block_static:
            why = f"static shared memory {static} B > {hw.smem_per_block_static} B per block"
        elif smem > hw.smem_per_block_optin:
            why = f"shared memory {smem} B > {hw.smem_per_block_optin} B per block"
        elif regs > hw.max_registers_per_thread:
            why = f"estimated {regs} registers per thread > {hw.max_registers_per_thread}"
        elif blocks_per_sm(threads, smem, regs, hw)[0] < 1:
            why = f"no block fits on an SM ({blocks_per_sm(threads, smem, regs, hw)[1]})"
        if why:
            rejected.append(Candidate(_params(p), None, why))
            continue
        ranked.append(Ranked(p, grid, block, dyn, cost(k, p, grid, block, smem, regs, types, hw)))
    # Ties on time (one bound, the same for both) go to the schedule with less exposed latency,
    # then to the one that issues less (its other bound has more slack), then to a fixed order.
    ranked.sort(key=lambda r: (round(r.time_us, 6), r.estimate.terms["t_pipeline_us"],
                               round(r.estimate.terms["t_compute_us"], 6), _params(r.params)))
    return ranked, rejected


def structure(k: Kernel, types: Mapping[str, TensorType]) -> Hashable:
    """What `rank` depends on: the kernel with every tensor named by its order of appearance,
    with the types of those tensors. Equal for two kernels exactly when they pose the same
    scheduling problem (names and origins play no part in it)."""
    names: dict[str, str] = {}

    def canon(name: str) -> str:
        return names.setdefault(name, f"t{len(names)}")

    def load(ld: Load) -> Load:
        return dataclasses.replace(ld, buffer=canon(ld.buffer))
    ops = tuple((canon(op.out), op.type, op.combiner, op.reduce, map_loads(op.body, load), bind)
                for op, bind in zip(k.ops, k.binds))
    stores = tuple(canon(s) for s in k.stores)
    return (k.family, ops, stores, tuple(sorted((c, types[n]) for n, c in names.items() if n in types)))


def _matches(p: dict[str, Any], pin: dict[str, Any]) -> bool:
    return all(str(p.get(key)) == str(value) for key, value in pin.items())


def plan_schedules(plan: Plan, hw: Profile, pin: dict[str, Any] | None = None) -> Plan:
    """`pin` (from `--pin KEY=VALUE`) restricts every kernel whose space has those keys."""
    kernels, records = [], []
    types = plan.types()
    solved: dict[Hashable, tuple[list[Ranked], list[Candidate]]] = {}
    for k in plan.kernels:
        key = structure(k, types)
        if key not in solved:
            solved[key] = rank(k, plan, hw)
        ranked, rejected = solved[key]
        if not ranked:
            raise AicfError(f"kernel {k.name}: no candidate of the {k.family} space fits {hw.arch} "
                            f"({rejected[0].rejected_because if rejected else 'empty space'})")
        if pin and any(set(pin) <= set(r.params) for r in ranked):
            pinned = [r for r in ranked if _matches(r.params, pin)]
            if not pinned:
                raise AicfError(f"kernel {k.name}: no feasible {k.family} candidate matches --pin "
                                f"{' '.join(f'{a}={b}' for a, b in pin.items())}")
            records.append(Rewrite("--pin " + " ".join(f"{a}={b}" for a, b in pin.items()), k.name, True,
                                   f"the user restricted the schedule to {len(pinned)} of {len(ranked)} feasible "
                                   f"candidates; the unpinned best was {ranked[0].time_us:.2f} us"))
            ranked = pinned + [r for r in ranked if not _matches(r.params, pin)]
        best = ranked[0]
        seen_reasons: set[str] = set()
        kept_rejected = []
        for c in rejected:
            kind = re.sub(r"[\d.]+", "N", c.rejected_because)
            if kind not in seen_reasons and len(kept_rejected) < KEEP_REJECTED:
                seen_reasons.add(kind)
                kept_rejected.append(c)
        candidates = tuple(Candidate(_params(r.params), round(r.time_us, 4)) for r in ranked[1:1 + KEEP_RUNNERS_UP])
        schedule = Schedule(_params(best.params), best.grid, best.block, best.dyn_smem, None,
                            best.estimate.as_items(), candidates + tuple(kept_rejected))
        kernels.append(k.replace(schedule=schedule))
    return plan.replace(kernels=tuple(kernels), rewrites=plan.rewrites + tuple(records))
