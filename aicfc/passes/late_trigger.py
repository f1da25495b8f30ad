"""late_trigger: Decision IR → Decision IR; a kernel of one wave in a chain of channels-last images, whose next kernel
has no work to do before its wait, lets that kernel launch only as its blocks exit (rule RULE, schedule parameter
TL = 1).

[Note: the trigger as the blocks exit]
Under dependent launches ([Note: PDL], codegen/pdl.py) a grid of one wave triggers at its entry, so the next
kernel is launched while it runs and its blocks land on the SMs as this one's retire, to wait there. That pays
where the next kernel has work before its wait (a gemv's first weights, [Note: gemv weights before the wait]; an
attention's cache reads; an early epilogue's operands). Where it has none, measured on an H100 (session 77,
benchmarks/results/late_trigger_session77_h100.txt), the early trigger cost more than it saved along a CNN's
chain: ResNet-50 B32's Hopper GEMM and convolution kernels, each timed alone as the plan launches it
(benchmarks/pdl_alone.py, 3 rounds), ran 0.3-2.0 us faster triggering only as their blocks exited (stage 3's
expanding 1x1s with the residual 12.0 -> 10.0 us, its 3x3s 15.0-15.3 -> 14.6-14.8, its reducing 1x1s 8.2-8.4 ->
7.8-8.0; a DRAM-bound one, stage 1's 64 -> 256 expansion, 43.6 either way), and the plan replayed 1.021-1.038x
faster at B32 and 1.047-1.059x at B1 (two calls, 5-7 alternating rounds, the same bits). In transformer plans the
same rule (every one-wave boundary without work after it) ran BERT-base B8 S512 even, GPT-2 B8 S512 0.983x and a
4-layer Llama's B1 S512 prefill 0.946x; restricted to boundaries between convolution, GEMM and pointwise kernels,
GPT-2 1.002x and the Llama prefill still 0.977x (its gate/up -> down GEMMs). So the rule holds between kernels of
images laid out channels-last (both carry passes/channels_last.py's RULE), the chain where it was measured to
pay; transformer plans keep every trigger. Why the waiting blocks cost the kernel before them more there is not
established (what the measurements suggest: the kernels that gained most keep their operands in L2 between
launches; the DRAM-bound ones did not move). Not measured on MobileNetV2 or EfficientNet-B0, nor on an H200.

The cost terms: every kernel's `launch` term (the profile's launch_overhead_us, 1.5 us on sm_90) was fitted on
kernels launched early whose blocks waited; a kernel launched as the one before it exits pays `launch_late_us`
(LAUNCH_LATE_US, 0.25) instead, its prediction re-costed here (`launched_late`). Fitted on the same H100 profile
of ResNet-50 B32 (call 5, every kernel alone): the mean |log(measured / predicted)| over its 56 kernels is least
with the term at 0.25 (0.128; 0.176 at 1.5, 0.129 at 0), 46 of 56 within [0.8, 1.25] (39 at 1.5); the plan's
predicted sum of kernels 914.1 -> 847.8 us against 820.8 measured, its replay 879.4.

A kernel with TL = 1 renders its entry with the trigger from past its last block (`codegen/pdl.entries`): no block
triggers, and the next launch follows the grid's exit. Its own wait is unchanged. Not for

- a grid of more than one wave (it already triggers only from its last wave, [Note: PDL]);
- a kernel that triggers before its own wait (AHEAD, [Note: work before the wait]; TF, [Note: the trigger before
  the wait]): letting the next kernel launch early is what those are for;
- a kernel whose next kernel works before its wait: a gemv (its first weights before the wait: PRE; its L2 fill:
  PF), an attention reading its cache early (PRE), a kernel whose epilogue reads early (EPRE), an AHEAD kernel;
- a joined launch (host or role: [Note: a gemv joined to the launch before it]) and the plan's last kernel;
- a kernel, or a next kernel, that is not over channels-last images (the measured transformer plans above).

`--pin late=0` turns the rule off; with plain launches (`aicfc compile --no-pdl`) the pass does not run.

Measured again in session 78 (an H100, benchmarks/results/trigger_end_session78_h100.txt, 7 alternating rounds, the same
bits): against every trigger at entry, ResNet-50 B32 1.027x, B1 1.048x, MobileNetV2 B32 1.018x (B1 0.996x),
EfficientNet-B0 B32 1.064-1.066x (B1 1.009x). Tried and not kept: a Hopper GEMM/convolution triggering as each block's
last k-block is done (before its epilogue, so the launch's latency would hide under the epilogues): slower than the
trigger as the blocks exit on all four (ResNet-50 B32 892.2 against 886.0 us, B1 265.4 against 257.7, MobileNetV2 B32
527.3 against 522.7, EfficientNet-B0 B32 972.0 against 944.7), though every boundary after a late trigger costs 1-3 us
in the timeline (the last block's exit to the next kernel's go): blocks that land and wait cost the kernels they land
beside more than the launch they hide, even for the length of an epilogue.

    kernel k31 conv [wgmma A=tma BM=128 BN=128 CTAS=98 ...]  kernel k32 gemm [wgmma ...]
  becomes
    kernel k31 conv [wgmma ... TL=1]  { same ops }          kernel k32 gemm [same; predicted with launch 0.25]
"""
from __future__ import annotations

import dataclasses

from aicfc.codegen import join, pdl
from aicfc.ir.decision import Kernel, Plan
from aicfc.ir.lowered import Rewrite
from aicfc.passes import channels_last
from aicfc.passes.early_trigger import triggers_first
from aicfc.passes.merge_kernels import switch
from aicfc.passes.work_before_wait import ahead, marked
from aicfc.planner.hardware import Profile

RULE = ("a one-wave kernel of images before one with no work before its wait => it lets that kernel launch as its "
        "blocks exit")
PIN = "late"   # --pin late=0: one-wave kernels trigger at their entry
EARLY_WORK = ("PRE", "EPRE", "AHEAD", "PF", "TF")   # schedule keys of work before the wait (or of an early trigger)
LAUNCH_LATE_US = 0.25   # a kernel's launch term after a kernel that triggers as it exits (profile: launch_late_us)
MEASURED_AGAINST = "the rule was measured to pay along a CNN's chain and to cost a Llama prefill 0.95-0.98x"


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
    if join.joined(k):
        return "a role of the launch before it"
    if i + 1 < len(kernels) and join.joined(kernels[i + 1]):
        return f"its launch also runs {kernels[i + 1].name}'s blocks"
    if ahead(k) or triggers_first(k):
        return "it lets the next kernel launch before its own wait"
    s = k.schedule
    if pdl.trigger_from(s.grid, s.block, s.smem_bytes, s.registers, hw) > 0:
        return "a grid of more than one wave (it triggers from its last wave)"
    if i + 1 >= len(kernels):
        return "the plan's last kernel"
    early = works_early(kernels[i + 1])
    if early:
        return f"{kernels[i + 1].name} {early}"
    other = next((x for x in (k, kernels[i + 1]) if channels_last.RULE not in x.rewrites), None)
    return f"{other.name} is not a kernel of channels-last images ({MEASURED_AGAINST})" if other else None


def late_trigger(plan: Plan, hw: Profile | None = None, pin: dict | None = None) -> Plan:
    value = switch(pin, PIN, "one-wave kernels trigger at their entry", "as their blocks exit wherever the rule holds")
    if hw is None or pdl.sm(plan.target) < pdl.MIN_SM or value == "0":   # none before sm_90; or --pin late=0
        return plan
    kernels, records = list(plan.kernels), []
    late_us = hw.data.get("launch_late_us", LAUNCH_LATE_US)
    for i, k in enumerate(kernels):
        if k.schedule is None:
            continue
        if why_not(kernels, i, hw) is not None:
            continue
        kernels[i] = marked(k, "TL")
        nxt = kernels[i + 1]
        before = nxt.schedule.time_us
        kernels[i + 1] = launched_late(nxt, late_us)
        records.append(Rewrite(RULE, k.name, True, (
            f"one wave of blocks, and {nxt.name} has no work before its wait: it launches as {k.name}'s blocks exit "
            f"instead of waiting on the SMs while they run (its predicted time {before:.2f} -> "
            f"{kernels[i + 1].schedule.time_us:.2f} us: the launch term {late_us:.2f} us)")))
    return plan.replace(kernels=tuple(kernels), rewrites=plan.rewrites + tuple(records))


def launched_late(k: Kernel, late_us: float) -> Kernel:
    """Kernel `k`, launched as the kernel before it exits, with its prediction's launch term `late_us`
    ([Note: the trigger as the blocks exit]: the term fitted on blocks that land early and wait)."""
    terms = dict(k.schedule.predicted)
    launch = terms.get("launch_us")
    if launch is None or launch <= late_us:
        return k
    terms["time_us"] -= launch - late_us
    terms["launch_us"] = late_us
    return k.replace(schedule=dataclasses.replace(k.schedule, predicted=tuple(terms.items())))
