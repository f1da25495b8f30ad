"""early_epilogue: Decision IR → Decision IR; a decode step's gemv requests its epilogue's operands
(the residual it adds) before the dependent-launch wait where they were written two or more
launches back (rule RULE, schedule parameter EPRE = 1).

[Note: epilogue reads before the wait]
In a plan of dependent launches ([Note: PDL], codegen/pdl.py) a kernel's blocks start only after
every block of the kernel right before it has passed its own wait, so every kernel two or more
launches back is complete, and its writes visible, when they start. A gemv's epilogue operand
written there (the residual stream that the O and down projections of a decoder layer add: the
layer's input, written by the previous layer's down projection) may be read before the wait, and
its round trip leaves the kernel's tail: after the split's sums meet, the epilogue adds and
stores. The operand's buffer is not written by this kernel or the one before (nor is it reused for
theirs: plan_memory keeps it live until this kernel reads it).

Applied where the epilogue is stored as pairs and every read of it is a pair vector
(codegen/gemm.early_reads: a residual, a per-column scale; not a data-dependent row), or is one of a
rotary map's table terms, computed there ([Note: tables computed before the loop] in
codegen/gemm_gemv.py), and a thread holds at most one pair of the tile (BM·BN/2 <= threads: one
register a read); the block that adds the splits (rank 0 of a cluster, every block under the
ticket) requests them right before the wait (templates/gemm_gemv.cu.j2). The cost model counts
the round trip fewer (cost_gemv's `gemv_early_read_us`). `--pin epre=0` keeps every epilogue
after the wait (an A/B).

Measured on an H200 (session 43, benchmarks/decode_ab.py, the 1 B Llama's 4-layer decode plan,
alternating graph replays in one process; benchmarks/results/early_epilogue_session43_h200.txt):
with the residuals of the O and down projections early (6 kernels) the plan replayed 189.2 and
190.9 us against 192.8 and 193.4 with `--pin epre=0` (calls 1 and 3: 0.4-0.6 us a kernel), the
same greedy tokens; B8 237.0 against 238.8 (call 2, 5 rounds). Requesting every epilogue read early, the QKV's rotary
tables (four scalar reads a thread) and the first O's embedding row included, gained nothing: 193.2
against 193.4 in the same call, so the rule keeps to pair vectors. The 20-layer B1 step: 0.780-0.782
ms, 59-60% of the bandwidth limit (session 35: 0.790).

    kernel k25 gemm [gemv PRE=1]  { ... add(acc, load(%h17, ..)) }
  becomes
    kernel k25 gemm [gemv PRE=1 EPRE=1]  { same ops }   rewrites += RULE
"""
from __future__ import annotations

from aicfc.codegen import gemm, gemm_gemv
from aicfc.ir.decision import Kernel, Plan
from aicfc.ir.lowered import Rewrite, view_base
from aicfc.passes.merge_kernels import switch
from aicfc.planner.hardware import Profile

RULE = "epilogue operand written two or more launches back => the gemv reads it before the dependent-launch wait"
PIN = "epre"    # --pin epre=0: every epilogue after the wait
NOTHING = "its epilogue reads nothing as pair vectors or table terms alone (no operand, or gated, a rotary map without tables, or not stored as pairs)"


def why_not(plan: Plan, i: int) -> str | None:
    """Why kernel `i` of `plan` may not read its epilogue operands before the wait, or None."""
    k = plan.kernels[i]
    p = k.schedule.param if k.schedule is not None else {}
    if k.family != "gemm" or p.get("unit") != "gemv":
        return "not a gemv"
    reads = gemm.early_reads(k, plan.types())
    if not reads:
        return NOTHING
    if not gemm_gemv.one_pair_a_thread(p):
        return f"a thread would hold more than one pair of its {p['BM']}x{p['BN']} tile"
    base = view_base(plan.views)
    for name in reads:
        buf = base(name)
        writers = [j for j, other in enumerate(plan.kernels) if buf in other.stores]
        late = [j for j in writers if j >= i - 1]
        if late:
            return f"{name} is written by {plan.kernels[late[0]].name}, less than two launches back"
        if not writers and i < 2:
            return f"{name} may be written right before the plan, and {k.name} is its kernel {i}"
    return None


def read_early(k: Kernel, plan: Plan, hw: Profile) -> Kernel:
    """`k` with EPRE = 1 and its prediction re-costed."""
    from aicfc.passes.plan_schedules import with_params
    return with_params(k, {"EPRE": 1}, plan.types(), hw)


def early_epilogue(plan: Plan, hw: Profile | None = None, pin: dict | None = None) -> Plan:
    forced = switch(pin, PIN, "every epilogue after the wait", "reads before the wait wherever legal")
    if hw is None:
        return plan
    kernels = list(plan.kernels)
    records = []
    for i, k in enumerate(plan.kernels):
        if k.family != "gemm" or k.schedule is None or k.schedule.param.get("unit") != "gemv":
            continue
        why = why_not(plan, i) if forced != "0" else f"--pin {PIN}=0"
        if why is None:
            kernels[i] = read_early(k, plan, hw)
            why = (f"its epilogue's {', '.join(gemm.early_reads(k, plan.types()) or ())} requested while "
                   f"the previous kernel runs (predicted {k.schedule.time_us:.2f} -> {kernels[i].schedule.time_us:.2f} us)")
            records.append(Rewrite(RULE, k.name, True, why))
        elif why != NOTHING:
            records.append(Rewrite(RULE, k.name, False, why))
    return plan.replace(kernels=tuple(kernels), rewrites=plan.rewrites + tuple(records))
