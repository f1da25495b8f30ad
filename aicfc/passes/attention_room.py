"""attention_room: Decision IR → Decision IR; the gemv right before a decode step's split attention
leaves each SM the registers of one of the attention's blocks (rule RULE: schedule parameter MB).

[Note: room for the attention]
Under dependent launches ([Note: PDL], codegen/pdl.py) a kernel's blocks land on the SMs while the
kernel before it runs, where an SM has the registers, threads and shared memory they take; the
split attention ([Note: the decode attention in the chain], codegen/attention_split.py) requests its
first key/value tile before its wait ([Note: attention reads before the wait]), so a block that
lands early has its tile when the QKV projection completes. Session 49's timeline of the 1 B
Llama's decode plan (an H200) showed 0 to 19 of the attention's 48 blocks landing early: the QKV
gemv's blocks held an SM's registers (3 blocks of 256 threads at 80 registers: 61,440 of 65,536,
where the attention's block takes 12,288).

So the gemv before such an attention gets MB, its launch bounds' minimum blocks an SM
([Note: the K-major gemv's register budget] in codegen/gemm_gemv.py), raised until ptxas's register
ceiling leaves, beside the gemv's blocks on its busiest SM, the registers of one attention block (at
the count ptxas gives the attention as it is emitted: after fold_cache_writes and PRE, which the planner's register
check did not see: session 55 found that check at 98 registers where the emitted kernel took 118; the room held
it at the 1 B Llama's MB, by the allocation's slack, not by design). Declined where the gemv would keep fewer than MIN_REGS registers a
thread, or the threads would not fit, or ptxas spills under the raised bound (the gemv is built again
under it: a bf16 gemv's conversions need more registers than an fp16 one's), or the register check is
off (nothing would tell). `--pin room=0` turns the rule off.

Measured (session 49, an H200, benchmarks/decode_ab.py --layers 4, 7 alternating rounds in one process;
benchmarks/results/attention_room_session49_h200.txt): 160.3 us against 161.6 with `--pin room=0`, the same
tokens; the QKV gemvs at 64 registers, no spills. The attention's blocks then land early where the
shared memory allows it, but an SM's carveout follows the kernels that run on it: the QKV gemv given a
preferred carveout that holds the attention's 94 KB as well (cuFuncSetAttribute) ran the plan in 172.0 us
(the 48 blocks all landed early, and the gate/up and down projections after them ran up to 2 us slower), and
every kernel of the plan at that carveout 161.8; so no carveout is set.

    kernel k17 gemm [gemv MB=3]     kernel k24 attention [split CL=1 PRE=1]  (128 threads at 96 registers)
  becomes
    kernel k17 gemm [gemv MB=4]   rewrites += RULE
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING

from aicfc.codegen import gemm_gemv
from aicfc.ir.decision import Kernel, Plan
from aicfc.ir.lowered import Rewrite
from aicfc.passes.merge_kernels import switch
from aicfc.planner.hardware import Profile

if TYPE_CHECKING:
    from aicfc.passes.plan_schedules import RegisterCheck

RULE = "a gemv before a split attention => the registers of one attention block left free on each SM"
PIN = "room"       # --pin room=0: off
MIN_REGS = 64      # the fewest registers a thread the rule leaves a gemv (ptxas spilled none at 64: session 49)


def block_threads(k: Kernel) -> int:
    return math.prod(k.schedule.block)


def warp_registers(regs: int) -> int:
    """A warp's register allocation: 256-register units."""
    return math.ceil(regs * 32 / 256) * 256


def register_cap(hw: Profile, held_warps: int, held_regs: int, warps: int) -> int:
    """Registers a thread (in the allocation's steps of 8, at most 255) that `warps` more warps may take on an SM
    beside `held_warps` warps of `held_regs` registers a thread."""
    return min(255, (hw.registers_per_sm - held_warps * warp_registers(held_regs)) // (warps * 256) * 8)


def checked_registers(k: Kernel) -> int | None:
    """ptxas's count where the register check ran, else the schedule's."""
    s = k.schedule
    checked = dict(s.predicted).get("registers_ptxas")
    return int(checked) if checked else s.registers


def room(gemv: Kernel, attention: Kernel, hw: Profile, a_regs: int | None = None) -> tuple[dict | None, str]:
    """(the gemv's new MB, why) or (None, why not); `a_regs`: the attention's registers as emitted, else the
    planner's count."""
    p = gemv.schedule.param
    a_regs = a_regs or checked_registers(attention)
    if a_regs is None:
        return None, f"{attention.name}'s registers are not known (the register check is off)"
    a_threads = block_threads(attention)
    warps = math.ceil(block_threads(gemv) / 32)
    busiest = math.ceil(math.prod(gemv.schedule.grid) / hw.sm_count)
    cap = register_cap(hw, math.ceil(a_threads / 32), a_regs, busiest * warps)
    if cap < MIN_REGS:
        return None, (f"{busiest} of its blocks and one of {attention.name}'s would leave it {cap} registers a "
                      f"thread (under {MIN_REGS})")
    if busiest * block_threads(gemv) + a_threads > hw.max_threads_per_sm:
        return None, f"{busiest} of its blocks and one of {attention.name}'s take more threads than an SM holds"
    mb = max(p.get("MB", 0), math.ceil(hw.registers_per_sm / (cap * block_threads(gemv))))
    return {"MB": mb}, (f"launch bounds' {mb} blocks an SM (at most {hw.registers_per_sm // (mb * block_threads(gemv))} "
                        f"registers a thread) leave one of {attention.name}'s blocks ({a_threads} threads at {a_regs} "
                        f"registers) room beside its {busiest} blocks on its busiest SM")


def _split_attention(k: Kernel) -> bool:
    p = k.schedule.param if k.schedule is not None else {}
    return k.family == "attention" and p.get("unit") == "split" and bool(p.get("PRE"))


def attention_room(plan: Plan, hw: Profile | None = None, pin: dict | None = None,
                   check: RegisterCheck | None = None) -> Plan:
    value = switch(pin, PIN, "off", "wherever the registers allow")
    if hw is None or not plan.target.startswith("sm_9"):
        return plan
    from aicfc.passes.plan_schedules import with_params
    kernels, records = list(plan.kernels), []
    pairs = [i for i in range(1, len(kernels))
             if _split_attention(kernels[i]) and gemm_gemv.params(kernels[i - 1]) is not None]
    emitted: dict[int, int] = {}   # each attention's registers as emitted, all built at once (in parallel)
    if check is not None and value != "0" and pairs:
        counts = check(plan, [(kernels[i], [dict(kernels[i].schedule.param)]) for i in pairs])
        emitted = {i: c[0][0] for i, c in zip(pairs, counts)}
    for i in pairs:
        a, g = kernels[i], kernels[i - 1]
        if value == "0":
            records.append(Rewrite(RULE, g.name, False, f"--pin {PIN}=0"))
            continue
        changes, why = room(g, a, hw, emitted.get(i))
        if changes is not None and check is None:
            changes, why = None, "the register check is off: whether ptxas spills under the raised bound is unknown"
        if changes is None:
            records.append(Rewrite(RULE, g.name, False, why))
            continue
        ((regs, spill),), = check(plan, [(g, [dict(g.schedule.param) | changes])])
        if spill:
            records.append(Rewrite(RULE, g.name, False,
                                   f"ptxas spills {spill} B at {regs} registers under MB {changes['MB']}"))
            continue
        kernels[i - 1] = with_params(g, changes, plan.types(), hw, registers=regs)
        records.append(Rewrite(RULE, g.name, True, why))
    return plan.replace(kernels=tuple(kernels), rewrites=plan.rewrites + tuple(records))
