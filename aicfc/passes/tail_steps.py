"""tail_steps: Decision IR → Decision IR; a K-major gemv right after a gemv whose blocks end in sums and merges
requests more of its weight steps before its dependent-launch wait (rule RULE: schedule parameter PRE > 1, and
LANDED, the bytes of those steps its prediction counts as landed by its go).

[Note: steps into the tail]
Under dependent launches ([Note: PDL], codegen/pdl.py) a gemv's blocks land on the SMs while the kernel before
runs, and request their first step of weights there ([Note: gemv weights before the wait] in codegen/gemm_gemv.py).
Where that kernel streams, more requests slow its stream (sessions 8, 10, 20 and 43). But a gemv does not stream
to its end: after its last weights its blocks add their sums over the lanes and warps, merge their k-splits and
run the epilogue (the gemv's t_reduce, t_split and row-scale terms in planner/cost_gemv.py). In the 1 B Llama's
decode step that tail is the gate/up's, about 1.4 us in the timeline from the last block's weights to its exit
(the phases of session 57's 2-layer timelines: weights streamed 10.2-10.6 us after its go, exit 11.6-12.0), and
the down projection's blocks land in it as the gate/up's retire. With one step each, the down's 1024 blocks
request 4 MiB there.

So a K-major gemv (its loop unrolled: each step's registers are its own) right after a gemv requests before its
wait the steps that the tail's predicted time moves at the stream's rate: PRE = 1 + ceil(tail · stream / step),
a step being every thread's U vectors, at most all its steps, each held in registers of its own (`pw` in
templates/gemm_gemv.cu.j2) until the loop adds it. Its prediction counts the extra steps' bytes, up to what
the tail moves, as landed by its go (LANDED). Where the gemv before has no tail (the down projection's epilogue
operands are read before its wait: its t_reduce is 0), nothing is asked; the QKV after the down, given its whole
slice before the wait anyway, ran 0.991x. Built at ptxas's count: a spilling count takes a step fewer, and the
rule declines where even two spill, or where the register check is off (nothing would tell).

Measured on an H200 (session 58; benchmarks/decode_ab.py, the 1 B Llama's 4-layer decode plan at B1, alternating
rounds in one process, the same tokens). As an experiment's switch (tail_steps_session58_h200.txt, 7 rounds): the
down projections with 2 steps before the wait, the generate step 0.1574 ms against 0.1586 (faster in all 7 rounds),
the plan replayed 153.9 us against 156.0; with 3 steps the same step (0.1574); their slices into L2 instead (one bulk
prefetch a block, PF) 0.1683 ms, the QKVs' 0.1614, the QKVs' whole slices before the wait (2 steps) 0.1601. The rule
as written (tail_steps_ab_session58_h200.txt, 9 rounds): 0.1569 ms against 0.1599 with `--pin tailsteps=0` (1.019x,
faster in all 9), replayed 154.9 us against 156.4. In the 2-layer timeline the down ran 5.1 us from its go to its
done against 6.0, and the gate/up before it 0.45 us longer: about 0.75 us a layer net, where the prediction credits
the down 1.07 us (its 3.9 MiB landed).

Not after the split attention: the O projection's whole slice (2 steps, 76 registers) before its wait, where its
blocks land during the attention and its L2 fill brings the slice anyway, ran the 4-layer generate step 0.1560 ms
against 0.1539 (session 60, 9 alternating rounds, an experiment's switch since removed;
benchmarks/results/o_steps_after_attention_session60_h200.txt), as the [K, N] O's two steps did in session 43.

`--pin tailsteps=0` turns the rule off.

    kernel k14 gemm [gemv CL=1 SPLITK=2]  (reduce 0.50 + split 0.21 + row scale 0.10)   kernel k15 gemm [gemv KM=1 PRE=1 U=2]
  becomes
    kernel k15 gemm [gemv KM=1 PRE=2 LANDED=4042664 U=2]   rewrites += RULE
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING

from aicfc.codegen import gemm, gemm_gemv
from aicfc.ir.decision import Kernel, Plan
from aicfc.ir.lowered import Rewrite
from aicfc.passes.merge_kernels import left_by_pin, sites, switch
from aicfc.planner import cost_gemv
from aicfc.planner.hardware import Profile

if TYPE_CHECKING:
    from aicfc.passes.plan_schedules import RegisterCheck

RULE = "a K-major gemv after a gemv's sums and merges => the weight steps that tail moves, before its wait"
PIN = "tailsteps"   # --pin tailsteps=0: off
TAIL_TERMS = ("t_reduce_us", "t_split_us", "t_row_scale_us")   # a gemv's predicted time after its last weights


def tail_us(k: Kernel) -> float:
    """Gemv `k`'s predicted time after its last weights: its blocks' sums, split merge, row scale and epilogue."""
    terms = dict(k.schedule.predicted)
    return sum(terms.get(t, 0.0) for t in TAIL_TERMS)


def steps(k: Kernel) -> int:
    """The steps of a K-major gemv's loop (each thread's U vectors a step)."""
    p = k.schedule.param
    cpw, _, spc = gemm_gemv.km_steps(p, gemm.dims(k)[3])
    return cpw * spc


def step_bytes(k: Kernel) -> int:
    """The bytes every block's threads request in one step."""
    return math.prod(k.schedule.grid) * math.prod(k.schedule.block) * gemm_gemv.step_bytes(k.schedule.param)


def wanted(before: Kernel, k: Kernel, hw: Profile) -> tuple[int, float]:
    """(PRE, the tail's bytes at the stream's rate) for K-major gemv `k` after gemv `before`."""
    moves = tail_us(before) * cost_gemv.constants(hw.data)["gemv_stream_gbs"] * 1e3
    return min(steps(k), 1 + math.ceil(moves / step_bytes(k))), moves


def why_not(plan: Plan, i: int) -> str | None:
    k = plan.kernels[i]
    p = gemm_gemv.params(k)
    if p is None:
        return "not a gemv"
    if i == 0 or gemm_gemv.params(plan.kernels[i - 1]) is None:
        return "the kernel before it is not a gemv"
    if not p.get("KM") or gemm_gemv.tc_k_major(p):
        return ("its weight is not K-major" if not p.get("KM") else "it runs tensor-core steps") + \
            " (its loop is not unrolled: a step's registers are reused)"
    if p.get("PRE") != 1:
        return "it requests no weights before its wait (PRE = 0)" if not p.get("PRE") else "already decided"
    if tail_us(plan.kernels[i - 1]) <= 0.0:
        return f"{plan.kernels[i - 1].name} has no tail after its weights (predicted)"
    return None


def tail_steps(plan: Plan, hw: Profile | None = None, pin: dict | None = None,
               check: RegisterCheck | None = None) -> Plan:
    value = switch(pin, PIN, "off", "wherever a gemv before leaves a tail")
    if hw is None or not plan.target.startswith("sm_9"):
        return plan
    from aicfc.passes.plan_schedules import with_params
    kernels, records = list(plan.kernels), []
    for i, k in sites(plan, RULE, why_not, ("not a gemv", "the kernel before it is not a gemv"), records):
        before = plan.kernels[i - 1]
        pre, moves = wanted(before, k, hw)
        left = left_by_pin(plan, k.name, PIN, value)
        if left:
            records.append(Rewrite(RULE, k.name, False, left))
            continue
        if pre < 2:
            records.append(Rewrite(RULE, k.name, False, f"it has {steps(k)} step: its whole slice is requested already"))
            continue
        if check is None:
            records.append(Rewrite(RULE, k.name, False, "the register check is off: nothing would tell a spill"))
            continue
        tried = []
        while pre >= 2:
            ((regs, spill),), = check(plan, [(k, [dict(k.schedule.param) | {"PRE": pre}])])
            if not spill:
                break
            tried.append(f"{pre} steps spill {spill} B at {regs} registers")
            pre -= 1
        if pre < 2:
            records.append(Rewrite(RULE, k.name, False, "; ".join(tried)))
            continue
        landed = int(min((pre - 1) * step_bytes(k), moves))
        kernels[i] = with_params(k, {"PRE": pre, "LANDED": landed}, plan.types(), hw, registers=regs)
        records.append(Rewrite(RULE, k.name, True, (
            f"{before.name}'s sums and merges after its last weights take {tail_us(before):.2f} us (predicted), "
            f"{moves / 2**20:.1f} MiB at the stream's rate: its first {pre} steps ({pre * step_bytes(k) / 2**20:.1f} MiB) "
            f"requested before the wait at {regs} registers, {landed / 2**20:.1f} MiB counted as landed by its go "
            f"(predicted {k.schedule.time_us:.2f} -> {kernels[i].schedule.time_us:.2f} us)")))
    return plan.replace(kernels=tuple(kernels), rewrites=plan.rewrites + tuple(records))
