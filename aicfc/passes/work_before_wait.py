"""work_before_wait: Decision IR → Decision IR; a small kernel that reads nothing a kernel still running
may write lets the next kernel launch, does its work, and waits for the kernel before it only as it
exits (rule RULE, schedule parameter AHEAD = 1).

[Note: work before the wait]
Under dependent launches ([Note: PDL], codegen/pdl.py) each kernel waits at its entry for the one
before it to complete, then lets the next one launch, so kernels run one after another even where
one does not read what the other writes. A decode step starts with such a run: the rotary tables'
position product, then the cos and the sin tables (each reads only the product), then the first
norm (it reads the token's embedding row): four one-block kernels of about 2 us each in the chain,
7.7 us before the first projection's go (session 53's timeline, gemv_room_session53_h200.txt),
though only the tables depend on the product.

A kernel marked AHEAD instead starts with the trigger (the next kernel may launch), does its work,
and waits as each of its threads returns (a destructor: codegen/pdl.py's AicfPdlLateWait). Its
completion still implies the previous kernel's, so the chain of completions every later kernel
relies on is kept; only its work moves before the wait. Legal where

- every buffer it reads is written by none of the kernels that may still run as its blocks start:
  the one before it and, while that one is itself AHEAD (it triggered before its own wait), the
  ones that were running as that one started (`running`);
- no buffer it writes is read or written by those kernels (by name here; plan_memory starts the
  lifetime of what an AHEAD kernel stores at the first of them, so no arena bytes are shared);
- the kernel after it reads nothing before its own wait that those kernels write (a gemv's
  early epilogue, [Note: epilogue reads before the wait], assumes every kernel two launches back
  is complete, which an AHEAD kernel's early trigger no longer guarantees);
- it is a pointwise or row-pass kernel: their bodies start at the entry (no work of their own
  before the wait, the gemv's weights or the attention's cache), in the body's outermost scope,
  where the destructor runs only as the kernel returns;
- it is not the plan's first kernel (whatever ran before the plan may still be writing its inputs).

Measured on an H200 (session 54, benchmarks/decode_ab.py, the 1 B Llama's 4-layer decode plan, alternating rounds
in one process; benchmarks/results/work_before_wait_session54_h200.txt): the sin table and the first norm AHEAD,
the generate step 0.1603 against 0.1609 ms with `--pin ahead=0` (7 rounds, the same tokens), and 0.1617 against
0.1621 in an earlier call; the plan's own replay 155.4 against 155.5 us. The cos and sin tables take 0.5-0.7 us
each in the chain (benchmarks/prototypes/plan_prefix.py), so little is left to overlap. (A first A/B showed
156.0 against 158.1 us for the replay: decode_ab then timed the decode plan on inputs the prefill plan had
overwritten in the arena the two share, a garbage position whose cosf and sinf took their slow path for about
2 us each; decode_ab now writes each plan's inputs before timing it.) Since session 60 the decode step has no
kernel left for the rule: the product, cos and sin are recomputed in the QKV gemvs ([Note: a table recomputed where
it is read] in passes/inline_producers.py), and the first norm is the plan's first kernel.

The credit: its body (the prediction less the launch) overlaps the kernels still running, so
the chain saves the shorter of the two; recorded with each decision. `--pin ahead=0` turns the
rule off. With plain launches (`aicfc compile --no-pdl`) AHEAD changes nothing.

    kernel k1 pointwise { %cos = map cos(.. %mul ..) }   kernel k2 pointwise { %sin = map sin(.. %mul ..) }
  becomes
    kernel k1 pointwise { same }                         kernel k2 pointwise [AHEAD=1] { same }
"""
from __future__ import annotations

import dataclasses

from aicfc.codegen import gemm, pdl
from aicfc.ir.decision import Kernel, Plan
from aicfc.ir.lowered import Rewrite, view_base
from aicfc.passes.merge_kernels import switch
from aicfc.planner.hardware import Profile

RULE = "a kernel that reads nothing a still-running kernel writes => its work before the dependent-launch wait"
PIN = "ahead"   # --pin ahead=0: every kernel waits at its entry
FAMILIES = ("pointwise", "row_reduce")


def ahead(k: Kernel) -> bool:
    return bool(k.schedule is not None and k.schedule.param.get("AHEAD"))


def marked(k: Kernel, key: str) -> Kernel:
    """Kernel `k` with schedule parameter `key` = 1 and its prediction as it was: a form of its entry
    (AHEAD here, TF in passes/early_trigger.py), not of its schedule."""
    return k.replace(schedule=dataclasses.replace(k.schedule, params=tuple(sorted((k.schedule.param | {key: 1}).items()))))


def running(kernels, i: int) -> list[int]:
    """The kernels that may still run as kernel `i`'s blocks start: the one before it, and while that
    one is AHEAD (it let `i` launch before its own wait), the ones that ran as that one started."""
    out = []
    for j in range(i - 1, -1, -1):
        out.append(j)
        if not ahead(kernels[j]):
            break
    return out


def storage(plan: Plan):
    """name -> the bytes it names: a view's source, a state output's input (one buffer of the state)."""
    base = view_base(plan.views)
    pair = {st.output: st.input for st in plan.state}
    return lambda name: pair.get(base(name), base(name))


def _reads(k: Kernel, at) -> set[str]:
    return {at(ld.buffer) for ld in k.loads()} - {at(o) for o in k.outs}


def writes(k: Kernel, at) -> set[str]:
    return {at(s) for s in k.stores}


def pre_wait_reads(k: Kernel, plan: Plan, at) -> set[str]:
    """What kernel `k`, not AHEAD, reads before its wait and a kernel of the plan may write: its early
    epilogue's operands (a gemv's weights, an attention's own cache and positions are written by no other kernel)."""
    p = k.schedule.param if k.schedule is not None else {}
    if k.family == "gemm" and p.get("EPRE"):
        return {at(b) for b in gemm.early_reads(k, plan.types()) or ()}
    return set()


def why_not(plan: Plan, kernels: list[Kernel], i: int, at=None) -> str | None:
    """Why kernel `i` may not work before its wait, the kernels before it as decided (`kernels`); `at`: the plan's
    `storage`, where the caller has it."""
    k = kernels[i]
    if k.family not in FAMILIES:
        return f"a {k.family} kernel (only {' and '.join(FAMILIES)} kernels start their bodies at the entry)"
    if i == 0:
        return "the plan's first kernel: whatever ran before the plan may still be writing its inputs"
    at = at or storage(plan)
    busy = [kernels[j] for j in running(kernels, i)]
    for other in busy:
        clash = sorted(_reads(k, at) & writes(other, at))
        if clash:
            return f"it reads {clash[0]!r}, which {other.name} writes and may still be writing"
        clash = sorted(writes(k, at) & (_reads(other, at) | writes(other, at)))
        if clash:
            return f"it writes {clash[0]!r}, which {other.name} may still be using"
    if i + 1 < len(kernels):
        nxt = kernels[i + 1]
        early = pre_wait_reads(nxt, plan, at)
        clash = sorted(early & set().union(*(writes(o, at) for o in [k, *busy])))   # it lands beside them all
        if clash:
            return f"{nxt.name} reads {clash[0]!r} before its wait, and a kernel running beside it may write it"
    return None


def _body(k: Kernel, hw: Profile) -> float:
    terms = dict(k.schedule.predicted)
    return max(0.0, terms["time_us"] - terms.get("launch_us", hw.launch_overhead_us))


def work_before_wait(plan: Plan, hw: Profile | None = None, pin: dict | None = None) -> Plan:
    value = switch(pin, PIN, "every kernel waits at its entry", "work before the wait wherever legal")
    if hw is None or pdl.sm(plan.target) < pdl.MIN_SM:   # no dependent launches before sm_90
        return plan
    kernels, records, at = list(plan.kernels), [], storage(plan)
    for i, k in enumerate(kernels):
        if k.family not in FAMILIES or k.schedule is None or i == 0:
            continue
        why = f"--pin {PIN}=0" if value == "0" else why_not(plan, kernels, i, at)
        if why is not None:
            records.append(Rewrite(RULE, k.name, False, why))
            continue
        busy = [kernels[j] for j in running(kernels, i)]
        credit = min(_body(k, hw), max(_body(o, hw) for o in busy))
        kernels[i] = marked(k, "AHEAD")
        records.append(Rewrite(RULE, k.name, True, (
            f"reads nothing {', '.join(o.name for o in busy)} may still write: its {_body(k, hw):.2f} us body "
            f"runs beside them (predicted to overlap {credit:.2f} us), and it waits as it exits")))
    return plan.replace(kernels=tuple(kernels), rewrites=plan.rewrites + tuple(records))
