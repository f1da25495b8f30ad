"""late_trigger: Decision IR → Decision IR; a kernel of one wave whose next kernel has no work to do before its
own wait lets that kernel launch only as its blocks exit (rule RULE, schedule parameter TL = 1).

[Note: the trigger as the blocks exit]
Under dependent launches ([Note: PDL], codegen/pdl.py) a grid of one wave triggers at its entry, so the next
kernel is launched while it runs and its blocks land on the SMs as this one's retire, to wait there. That pays
where the next kernel has work before its wait (a gemv's first weights, [Note: gemv weights before the wait]; an
attention's cache reads; an early epilogue's operands) or would otherwise start later; where it has none, measured
on an H100 (session 77, benchmarks/results/late_trigger_session77_h100.txt), the early trigger costs more than it
saves: ResNet-50 B32's Hopper GEMM and convolution kernels, each timed alone as the plan launches it
(benchmarks/pdl_alone.py, 3 rounds), ran 0.3-2.0 us faster when they triggered only as their blocks exited
(stage 3's expanding 1x1s with the residual 12.0 -> 10.0 us, its 3x3s 15.0-15.3 -> 14.6-14.8, its reducing 1x1s
8.2-8.4 -> 7.8-8.0; their sum 715.8 -> 689.6 us), and the whole plan replayed 2.4-3.0% faster (910.8 -> 888.7 us,
7 alternating rounds; 906.4 -> 880.0, 5 rounds), the same bits. Why the waiting blocks cost the kernel before
them is not established; the per-kernel cost terms do not see where a kernel triggers, so no prediction moves.

A kernel with TL = 1 renders its entry with the trigger from past its last block (`codegen/pdl.entries`): no block
triggers, and the next launch follows the grid's exit. Its own wait is unchanged. Not for

- a grid of more than one wave (it already triggers only from its last wave, [Note: PDL]);
- a kernel that triggers before its own wait (AHEAD, [Note: work before the wait]; TF, [Note: the trigger before
  the wait]): letting the next kernel launch early is what those are for;
- a kernel whose next kernel works before its wait: a gemv (its first weights before the wait: PRE; its L2 fill:
  PF), an attention reading its cache early (PRE), a kernel whose epilogue reads early (EPRE), an AHEAD kernel;
- a joined launch (host or role: [Note: a gemv joined to the launch before it]) and the plan's last kernel.

`--pin late=0` turns the rule off. With plain launches (`aicfc compile --no-pdl`) TL changes nothing.

    kernel k31 conv [wgmma A=tma BM=128 BN=128 CTAS=98 ...]  kernel k32 gemm [wgmma ...]
  becomes
    kernel k31 conv [wgmma ... TL=1]  { same ops }
"""
from __future__ import annotations

from aicfc.codegen import join, pdl
from aicfc.ir.decision import Kernel, Plan
from aicfc.ir.lowered import Rewrite
from aicfc.passes.merge_kernels import switch
from aicfc.passes.work_before_wait import marked
from aicfc.planner.hardware import Profile

RULE = "a one-wave kernel before one with no work before its wait => it lets that kernel launch as its blocks exit"
PIN = "late"   # --pin late=0: one-wave kernels trigger at their entry
EARLY_WORK = ("PRE", "EPRE", "AHEAD", "PF", "TF")   # schedule keys of work before the wait (or of an early trigger)
FAMILIES = ("conv", "gemm", "pointwise")   # the boundaries the rule was measured to pay at (the Note)
MEASURED_AGAINST = "with the boundaries at attention, row-pass and scatter kernels late too, a Llama prefill ran 0.95x"


def triggers_late(k: Kernel) -> bool:
    return bool(k.schedule is not None and k.schedule.param.get("TL"))


def works_early(k: Kernel) -> str | None:
    """What kernel `k` does before its wait (a phrase), None where nothing."""
    p = k.schedule.param if k.schedule is not None else {}
    if p.get("unit") == "gemv":
        return "requests its first weights before its wait"
    key = next((key for key in EARLY_WORK if p.get(key)), None)
    return f"works before its wait ({key} = 1)" if key else None


def why_not(kernels: list[Kernel], i: int, hw: Profile) -> str | None:
    """Why kernel `i` keeps its trigger (None where it may trigger as its blocks exit)."""
    k = kernels[i]
    p = k.schedule.param
    if join.joined(k):
        return "a role of the launch before it"
    if i + 1 < len(kernels) and join.joined(kernels[i + 1]):
        return f"its launch also runs {kernels[i + 1].name}'s blocks"
    if p.get("AHEAD") or p.get("TF"):
        return "it lets the next kernel launch before its own wait"
    s = k.schedule
    if pdl.trigger_from(s.grid, s.block, s.smem_bytes, s.registers, hw) > 0:
        return "a grid of more than one wave (it triggers from its last wave)"
    if i + 1 >= len(kernels):
        return "the plan's last kernel"
    early = works_early(kernels[i + 1])
    if early:
        return f"{kernels[i + 1].name} {early}"
    other = next((x for x in (k, kernels[i + 1]) if x.family not in FAMILIES), None)
    return f"{other.name} is a {other.family} kernel (measured: {MEASURED_AGAINST})" if other else None


def late_trigger(plan: Plan, hw: Profile | None = None, pin: dict | None = None) -> Plan:
    value = switch(pin, PIN, "one-wave kernels trigger at their entry", "as their blocks exit wherever the rule holds")
    if hw is None or pdl.sm(plan.target) < pdl.MIN_SM:   # no dependent launches before sm_90
        return plan
    kernels, records = list(plan.kernels), []
    for i, k in enumerate(kernels):
        if k.schedule is None:
            continue
        why = f"--pin {PIN}=0" if value == "0" else why_not(kernels, i, hw)
        if why is not None:
            continue
        kernels[i] = marked(k, "TL")
        records.append(Rewrite(RULE, k.name, True, (
            f"one wave of blocks, and {kernels[i + 1].name} has no work before its wait: it launches as {k.name}'s "
            f"blocks exit instead of waiting on the SMs while they run")))
    return plan.replace(kernels=tuple(kernels), rewrites=plan.rewrites + tuple(records))
