"""gemv_room: Decision IR → Decision IR; the gemv right after a decode step's split attention takes,
among the schedules the planner predicts equally fast, one whose blocks leave an SM room for a block
of the gemv after it (rule RULE).

[Note: room for the next gemv]
Under dependent launches ([Note: PDL], codegen/pdl.py) a kernel's blocks land on the SMs while the
kernel before runs, where an SM has the registers and threads they take, and a gemv's blocks that land
early request their first weights before their wait. The O projection after the decode attention
reads its weight slice from L2 (the L2 fill brought it in during the attention: [Note: L2 fill] in
passes/l2_fill.py), so the gate/up's requests landing beside it do not slow a DRAM stream, as they
do beside a streaming gemv ([Note: PDL]: the next gemv's early requests slowed the down projection).
The planner's pick for the 1 B Llama's O projection at B1 (1024 blocks of 128 threads at 48
registers: 8 blocks, 49,152 registers on its busiest SM) left no room for a gate/up block (256
threads at 68 registers: 18,432), so the gate/up's blocks landed only as the O's retired: 1.0 us
from the O's last block to the gate/up's start, against 0.35-0.6 at the plan's other gemv
boundaries. Its six gemv candidates are predicted alike (4.24 us: the cost model does not see the
landing); the one of 512 blocks (BN 4, one k-part a column) leaves the room.

So where the pick leaves no room for one of the next gemv's blocks on its busiest SM, the first
candidate in rank order predicted as fast as the pick (`TIE_US`) that does, at ptxas's register
count (the register check builds it; one that spills is passed over), replaces it, re-costed.
Declined with the reason where none does, where the register check is off, or where a `--pin` chose
the gemv's schedule. Not for the gemvs after a streaming gemv: the down projection given room for
the QKV's blocks lost what the O gained (below). `--pin gemvroom=0` turns the rule off.

Measured on an H200 (session 53, benchmarks/results/gemv_room_session53_h200.txt,
benchmarks/decode_ab.py --layers 4, 9 alternating rounds in one process): the O projections pinned
to that schedule replayed the 4-layer B1 decode plan in 158.7 us against 161.4 (1.017x; the generate
step 0.1626 against 0.1642 ms), the O-to-gate/up boundary 0.6 us against 1.0 in the timeline; with
the down projections given room as well, 161.6 (0.998x). The rule as written, in another call:
159.8 us against 161.3 with `--pin gemvroom=0` (1.009x; the generate step 0.1633 against 0.1651 ms);
the 20-layer step 0.630 ms (session 52: 0.640, another process). At B8 the O's pick already leaves
the room (no record).

    kernel k11 attention [split]   kernel k12 gemm [gemv BN=2 KS=2, 1024 blocks]   kernel k14 gemm [gemv, 256 threads]
  becomes
    kernel k12 gemm [gemv BN=4 KS=1, 512 blocks]   rewrites += RULE
"""
from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING

from aicfc.codegen import gemm_gemv
from aicfc.ir.decision import Candidate, Kernel, Plan
from aicfc.ir.lowered import Rewrite
from aicfc.passes.attention_room import block_threads, checked_registers, warp_registers
from aicfc.passes.merge_kernels import left_by_pin, switch
from aicfc.planner.cost import estimate_registers
from aicfc.planner.hardware import Profile

if TYPE_CHECKING:
    from aicfc.passes.plan_schedules import RegisterCheck

RULE = "a gemv after a split attention => of its equally fast schedules, one leaving the next gemv's block room"
PIN = "gemvroom"   # --pin gemvroom=0: off
TIE_US = 1e-3      # predicted times closer than this are the same prediction


def _split_attention(k: Kernel) -> bool:
    p = k.schedule.param if k.schedule is not None else {}
    return k.family == "attention" and p.get("unit") == "split"


def leaves_room(grid: tuple[int, ...], threads: int, regs: int, smem: int, nxt: Kernel, hw: Profile) -> str | None:
    """Why the busiest SM's blocks of a launch (grid, threads, regs, smem) leave no room for one block
    of `nxt`, or None where they do."""
    busiest = math.ceil(math.prod(grid) / hw.sm_count)
    n_threads, n_regs = block_threads(nxt), checked_registers(nxt) or 0
    used = busiest * math.ceil(threads / 32) * warp_registers(regs)
    need = math.ceil(n_threads / 32) * warp_registers(n_regs)
    if used + need > hw.registers_per_sm:
        return (f"{busiest} blocks an SM take {used} registers, and one of {nxt.name}'s {need} more "
                f"({hw.registers_per_sm} an SM)")
    if busiest * threads + n_threads > hw.max_threads_per_sm:
        return f"{busiest} blocks an SM and one of {nxt.name}'s take more threads than an SM holds"
    if busiest * smem + nxt.schedule.smem_bytes > hw.smem_per_sm:
        return f"{busiest} blocks an SM and one of {nxt.name}'s take more shared memory than an SM holds"
    return None


def _roomier(g: Kernel, nxt: Kernel, plan: Plan, hw: Profile, check: RegisterCheck) -> tuple[Kernel | None, str]:
    """`g` on the first equally fast schedule that leaves `nxt` room (and why), or (None, why not)."""
    from aicfc.passes.plan_schedules import rank, recost
    s = g.schedule
    now = s.time_us
    types = plan.types()
    ties = [r for r in rank(g, plan, hw)[0]
            if r.time_us <= now + TIE_US and dict(r.params) != s.param and r.params.get("unit") == "gemv"]
    tried = []
    for r in ties:
        if leaves_room(r.grid, math.prod(r.block), r.registers or estimate_registers(g, r.params), r.dyn_smem, nxt,
                       hw) is not None:
            continue   # not at its estimated registers (those that do are built: ptxas's count decides)
        ((regs, spill),), = check(plan, [(g, [r.params])])
        why = f"ptxas spills {spill} B" if spill else leaves_room(r.grid, math.prod(r.block), regs, r.dyn_smem, nxt, hw)
        est = recost(g, r.params, r.grid, r.block, r.dyn_smem, regs, types, hw)
        if why is None and est.time_us > now + TIE_US:
            why = f"re-costed at ptxas's {regs} registers it is predicted {est.time_us:.2f} us against {now:.2f}"
        if why:
            tried.append(why)
            continue
        est.terms["registers_ptxas"] = regs
        kept = Candidate(s.params, round(now, 4))
        schedule = dataclasses.replace(s, params=tuple(sorted(r.params.items())), grid=r.grid, block=r.block,
                                       smem_bytes=r.dyn_smem, registers=None, predicted=est.as_items(),
                                       candidates=(kept,) + tuple(c for c in s.candidates if dict(c.params) != r.params))
        blocks = math.prod(r.grid)
        return g.replace(schedule=schedule), (f"{blocks} blocks of {math.prod(r.block)} threads at {regs} registers, "
                                              f"predicted {est.time_us:.2f} us as the pick's {now:.2f}, leave one of "
                                              f"{nxt.name}'s blocks room on the busiest SM")
    if not ties:
        return None, f"no other gemv schedule is predicted as fast ({now:.2f} us)"
    return None, f"none of its {len(ties)} equally fast schedules leaves room" + (f" ({tried[0]})" if tried else "")


def gemv_room(plan: Plan, hw: Profile | None = None, pin: dict | None = None, check: RegisterCheck | None = None) -> Plan:
    value = switch(pin, PIN, "off", "wherever an equally fast schedule leaves room")
    if hw is None or not plan.target.startswith("sm_9"):
        return plan
    kernels, records = list(plan.kernels), []
    for i in range(1, len(kernels) - 1):
        a, g, nxt = kernels[i - 1], kernels[i], kernels[i + 1]
        if not (_split_attention(a) and gemm_gemv.params(g) is not None and gemm_gemv.params(nxt) is not None):
            continue
        s = g.schedule
        regs = checked_registers(g)
        if regs is None or checked_registers(nxt) is None:
            records.append(Rewrite(RULE, g.name, False, "the register check is off: the blocks' room is unknown"))
            continue
        full = leaves_room(s.grid, block_threads(g), regs, s.smem_bytes, nxt, hw)
        if full is None:
            continue   # already leaves the room: nothing to decide
        left = left_by_pin(plan, g.name, PIN, value)
        if left:
            records.append(Rewrite(RULE, g.name, False, left))
            continue
        if check is None:
            records.append(Rewrite(RULE, g.name, False, "the register check is off: nothing would tell a spill"))
            continue
        new, why = _roomier(g, nxt, plan, hw, check)
        if new is None:
            records.append(Rewrite(RULE, g.name, False, f"{full}; {why}"))
            continue
        kernels[i] = new
        records.append(Rewrite(RULE, g.name, True, f"{full}; {why}"))
    return plan.replace(kernels=tuple(kernels), rewrites=plan.rewrites + tuple(records))
