"""early_trigger: Decision IR → Decision IR; a gemv whose blocks land while the kernel before it leaves the
DRAM idle lets the next kernel launch at its own entry, before its wait (rule RULE, schedule parameter TF = 1).

[Note: the trigger before the wait]
Under dependent launches ([Note: PDL], codegen/pdl.py) a kernel lets the next one launch only once its own
wait has returned, so run-ahead is one kernel. In a decode step that keeps the gate/up gemv off the SMs
until the O projection's go: the O's blocks land while the split attention computes, and the DRAM is then
nearly idle ([Note: L2 fill] in passes/l2_fill.py: the O requests its slice and the gate/up's first rows
into L2 there). With TF = 1 the O triggers first: the gate/up's blocks land during the attention too,
where the O leaves them room ([Note: room for the next gemv] in passes/gemv_room.py), and request their
first weight step (PRE) while the DRAM has little else to do.

The O's own wait stays where it was, so its completion still implies the attention's and every later
kernel's wait keeps its meaning. What changes is what may run beside the next kernel's work before its wait:
the O and the kernels the O's own blocks land beside (`work_before_wait.running`). Legal where

- the next kernel reads before its wait nothing those kernels write (a gemv's weights and L2 fill are
  constants; an early epilogue's operands, [Note: epilogue reads before the wait], are checked by name);
- the next kernel is not AHEAD ([Note: work before the wait]): its whole body would then run beside them,
  which passes/work_before_wait.py did not check;
- the gemv fills L2 (PF = 1): the kernel before it leaves the DRAM idle, by l2_fill's rule. Elsewhere the
  DRAM streams when the next kernel's blocks would land, and their first requests slow that stream (the PDL
  Note's early triggers, sessions 10 and 24).

Measured on an H200 (session 56, benchmarks/decode_ab.py, the 1 B Llama's 4-layer decode plan at B1, alternating
rounds in one process, the same tokens; benchmarks/results/early_trigger_session56_h200.txt), against `--pin trigger=0`:
the generate step (the greedy feed's graph of decode steps, what a decoder's plans run in) 0.1599 against 0.1605 ms
(call 2, 9 rounds), 0.1600 against 0.1610 (call 3, 9 rounds), and 0.1600 / 0.1598 / 0.1602 against 0.1610 / 0.1610 /
0.1606 over three bundles of each (call 4, 7 rounds): 1.004-1.006x, faster in every pair. The decode plan replayed
alone moved the other way in three of the five pairs (faster in call 2, 154.0 against 155.1 us; slower in call 3,
155.9 against 154.3; in call 4 one faster and two slower, 154.8 against 154.0 on average: 0.995x), so the rule is
kept for the generate step, not for a plan's `aicf-run --bench`. Also measured in call 2 and not kept: the split
attention triggering before its own wait, alone (generate step 0.1602 ms against 0.1605) and with the O's (0.1596
against the O's alone 0.1599), and the O triggering first with an 8 MiB L2 head (0.1623: the larger head slowed the
plan as in session 55).

No predicted time moves: what the next gemv's first step gains is set by where its blocks land in the chain,
which the per-kernel terms do not see (the rewrite's reason names the idle kernel and the one that lands).
`--pin trigger=0` turns the rule off.

    kernel k25 gemm [gemv PF=1 PRE=1]  { ... }
  becomes
    kernel k25 gemm [gemv PF=1 PRE=1 TF=1]  { same ops }
"""
from __future__ import annotations

from aicfc.codegen import gemm_gemv, pdl
from aicfc.ir.decision import Kernel, Plan
from aicfc.ir.lowered import Rewrite
from aicfc.passes.merge_kernels import switch
from aicfc.passes.work_before_wait import ahead, marked, pre_wait_reads, running, storage, writes
from aicfc.planner.hardware import Profile

RULE = "a gemv landing while the kernel before leaves the DRAM idle => it lets the next kernel launch before its wait"
PIN = "trigger"   # --pin trigger=0: every kernel triggers after its wait


def triggers_first(k: Kernel) -> bool:
    return bool(k.schedule is not None and k.schedule.param.get("TF"))


def why_not(plan: Plan, kernels: list[Kernel], i: int, at) -> str | None:
    """Why gemv `i` may not trigger before its wait, the plan's kernels as decided (`kernels`); `at`: the plan's
    storage names (work_before_wait.storage)."""
    p = kernels[i].schedule.param
    if not p.get("PF"):
        return "it fills no L2 (the kernel before it keeps the DRAM busy: [Note: L2 fill])"
    if i + 1 >= len(kernels):
        return "the plan's last kernel"
    nxt = kernels[i + 1]
    if ahead(nxt):
        return f"{nxt.name} works before its own wait ([Note: work before the wait])"
    beside = [kernels[i]] + [kernels[j] for j in running(kernels, i)]
    clash = sorted(pre_wait_reads(nxt, plan, at) & set().union(*(writes(o, at) for o in beside)))
    if clash:
        return f"{nxt.name} reads {clash[0]!r} before its wait, and a kernel its blocks would land beside writes it"
    return None


def early_trigger(plan: Plan, hw: Profile | None = None, pin: dict | None = None) -> Plan:
    value = switch(pin, PIN, "every kernel triggers after its wait", "the trigger before the wait wherever legal")
    if hw is None or pdl.sm(plan.target) < pdl.MIN_SM:   # no dependent launches before sm_90
        return plan
    kernels, records, at = list(plan.kernels), [], storage(plan)
    for i, k in enumerate(kernels):
        if gemm_gemv.params(k) is None or i == 0:
            continue
        why = f"--pin {PIN}=0" if value == "0" else why_not(plan, kernels, i, at)
        if why is not None:
            if k.schedule.param.get("PF"):
                records.append(Rewrite(RULE, k.name, False, why))
            continue
        kernels[i] = marked(k, "TF")
        records.append(Rewrite(RULE, k.name, True, (
            f"{kernels[i - 1].name} leaves the DRAM idle ([Note: L2 fill]): {kernels[i + 1].name}'s blocks land "
            f"beside it and request their first weights before {k.name}'s wait")))
    return plan.replace(kernels=tuple(kernels), rewrites=plan.rewrites + tuple(records))
