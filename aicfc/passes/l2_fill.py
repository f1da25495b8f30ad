"""l2_fill: Decision IR → Decision IR; where a kernel leaves the DRAM idle, the gemv after it requests
its own weight slice, and the first rows of the weight stream after it, into L2 before its
dependent-launch wait (rule RULE: schedule parameter PF = 1 and a `prefetch` record on the kernel;
the stream after it reads those rows at the L2's rate, HOT).

[Note: L2 fill]
Under dependent launches ([Note: PDL], codegen/pdl.py) a kernel's blocks land on the SMs while the
kernel before it runs, and a gemv requests its first step of weights there ([Note: gemv weights
before the wait]). Most kernels of a decode step stream weights, so the DRAM is busy when the next
one's blocks land, and requesting more then slows the stream that runs (sessions 8 and 20: every
gemv's slice so requested ran the plan slower; session 46: the next launch let in only after each
gemv's weight loop, the 4-layer plan 190.7 against 183.7 us). One kernel a layer does not stream:
the decode attention reads its cache (1.6 MB a layer of the 1 B Llama) and then computes, merges
and waits for its cluster, about 5 us in the chain. The O projection's blocks land during it; with PF = 1 each
requests the rest of its weight slice into L2 (`prefetch.global.L2`, a 128-byte line a row
segment), and its `prefetch` record gives it the first rows of the next weight stream's splits
(the gate/up's), spread over its blocks as bulk requests (`cp.async.bulk.prefetch.L2`), so the
gate/up's blocks start on rows already in L2.

Where: a gemv with PRE = 1 (its blocks land early) after a kernel, not a gemv (a gemv streams through its body),
whose own bytes at the stream's rate take under IDLE_SHARE of its predicted body (less its launch), and whose idle
rest moves at least the gemv's slice (else the slice would stay in L2 only in part: the LM head's 125 MB after the final norm).
A gemv over a K-major weight ([Note: the gemv over a K-major weight]) fills its own slice too: its block's columns
are one or two contiguous runs of [N, K] rows, each one bulk request (session 48: the O projection so, 0.7 us of the
4-layer plan over the same plan with the O [K, N] and its fill).
The head: `gemv_fill_head_bytes` of cost_gemv's constants (4 MiB), whole rows past the first step, evenly over the
next gemv's k-splits (past one norm kept apart, as at B8), where that gemv's weight is a constant laid out [K, N]. It is a fitted amount, not the
window's: the decode attention's prediction in the chain is 1.4x short (session 45), so its predicted
window (1.9 us) leaves 1.1 MiB after the O's 8 MiB, where 4-6 MiB measured fastest.

Measured (session 46, an H200, benchmarks/decode_ab.py: the 1 B Llama's 4-layer decode plan, 7 alternating
rounds in one process; benchmarks/results/l2_fill_session46_h200.txt), against the rule off: the O projections'
slices alone 0.5 us faster (2.4 in call 1's form); a 1.1 / 4 / 8 / 16 MiB head of the gate/up 1.4 / 3.0 / 1.3 / 0.4 us (call 2); 2 / 4 / 6
MiB 2.6 / 1.5 / 3.7 us (call 5): 0.4-0.9 us a layer at 4-6 MiB, where a larger head competes with the attention's
and the O's own reads. At B8 the rule applies nowhere (the attention reads 12 MB a layer: the DRAM busy
by its prediction), so that A/B compared one plan twice (227.1 against 227.4 us); the 20-layer B1 step
(734.8 us replayed) did not move above the spread between processes. The credit (the head's bytes at the L2's rate instead of the
stream's: the gate/up 14.06 -> 13.53 us, 0.53 us a layer) is within what was measured.

Session 47 (call 1, the same A/B; benchmarks/results/l2_fill_session47_h200.txt): the head now starts past the
next gemv's first step, which that gemv's blocks request themselves before their wait when they land early
([Note: gemv weights before the wait]): 177.9 against 181.2 us (1.019x); the same at B8 with IDLE_SHARE 0.7
(the attention's 12 MB a layer, over half its predicted body, declined it at 0.5; `_next_stream` reaches the gate/up
past B8's norm kept apart): 222.0 against 225.8 us (1.017x). Tried and dropped: every other gemv requesting, after its
own weight loop, a 2 / 4 MiB share of the next gemv's head (the "tail fill": its last blocks stream on alone for
1-2 us): 180.8 / 183.5 us against 181.2.

Session 55 (calls 1-2, the same A/B, 7 rounds; benchmarks/results/l2_more_session55_h200.txt): more of the gate/up's
rows past the head, requested by the O projection's blocks once the O reads its own slice from L2, at their go
(4 / 8 / 14 MiB: 156.6 / 163.4 / 169.2 us against 155.9) or after their weight loop (4 / 8 / 12 MiB: 157.2 / 161.3 /
164.8 against 155.3). Not kept: in the timeline the gate/up's body took as long as without them (its weights
streamed 9.2 us after its go either way) while the O ran 0.7-1.1 us longer. The head itself at 8 MiB: 156.6
against 155.9; the rule off (`--pin fill=0`): 159.7 against 155.3.
Session 56 (call 1, the same A/B, 9 rounds; benchmarks/results/early_trigger_session56_h200.txt): the split attention
requesting the O's whole weight into L2 as its wait returns (thread 0 of each of its 48 blocks a share, bulk
requests), so that the O's blocks could spend their window on a larger head: 157.2 us against 155.7 with the 4 MiB
head, 159.7 / 163.8 with 8 / 12 MiB. In the 2-layer timeline the attention staged its query 0.5 us later (1.28
against 0.77 us after its go) and the gate/up's weights streamed no sooner (8.96-9.22 us after its go against
9.22-9.47). Not kept.
Session 58 (the same A/B, 9 rounds; benchmarks/results/qkv_fills_o_session58_h200.txt): each QKV gemv's block, once its
own weight loop was done, requested its share of the O's whole weight into L2 (thread 0, one bulk request; over the
QKV's 384-768 blocks, so no SM's memory path carries much of it, where the split attention's 48 did: [Note: the decode
attention in the chain]), so that the DRAM would stream it from the QKV's tail instead of from the O's landing: the
generate step 0.1582 ms against 0.1564 (0.989x), with the O's gate/up head at 8 MiB 0.1598 (0.979x). Not kept.

[Note: the fill's own slice]
With PF = 1 the gemv's prediction (planner/cost_gemv.py) reads its whole weight at the L2's rate: the rule asks that
the window the kernel before leaves idle move at least the slice, so it is in L2 by the gemv's go. Before session 63
only the next stream's head was credited (HOT), and the 1 B Llama's O projection was predicted 3.74 us (its 8 MiB
streamed from the DRAM, 2.24 us, and the launch) against 2.46-2.50 us measured in the chain of the 2-layer timeline
(layer 1, the next kernel's go less its own; 2.94-3.01 at layer 0, whose attention starts cold); credited, 2.62 us.
Timed alone (`aicf-run --profile`) no kernel runs before it, so its fill hides under nothing there.

Legal always: a prefetch moves no value (the weights are constants of the plan that no kernel
writes), and it reads within a buffer the next kernel reads anyway. `--pin fill=0` turns the rule
off; `--pin fill=MB` sets the head, `--pin fillshare=F` the idle share (A/Bs' knobs).

    kernel k12 gemm [gemv PRE=1]  { ... }            kernel k14 gemm [gemv PRE=1]  { ... }
  becomes
    kernel k12 gemm [gemv PRE=1 PF=1]  { same ops }  prefetch %w_gateup [[0, 2095104], [23068672, 2095104]]
    kernel k14 gemm [gemv PRE=1 HOT=4190208]  { same ops }
"""
from __future__ import annotations

from aicfc.codegen import gemm, gemm_gemv
from aicfc.codegen.cexpr import flat_offset
from aicfc.errors import AicfError
from aicfc.ir.decision import Kernel, Plan, Prefetch
from aicfc.ir.lowered import Rewrite
from aicfc.ir.types import ITEMSIZE
from aicfc.planner import cost_gemv
from aicfc.planner.hardware import Profile

RULE = "a gemv whose blocks land while the kernel before leaves the DRAM idle => its slice and the next stream's head into L2"
PIN = "fill"       # --pin fill=0: off; fill=MB: the next stream's head (MB) wherever the rule applies
SHARE_PIN = "fillshare"  # --pin fillshare=F: IDLE_SHARE for this plan (an A/B's knob)
IDLE_SHARE = 0.7   # a kernel whose own bytes at the stream's rate take under this share of its body leaves the DRAM idle


def _weight_rows(k: Kernel, plan: Plan) -> tuple[str, int, int] | None:
    """(weight buffer, bytes of a k-row, k-rows) where gemv `k`'s weight is a plan constant laid out
    [K, N] (k-row r's N columns contiguous at r·N), else None."""
    from aicfc.codegen.gemm import dims
    c, _, n, kk, _ = dims(k)
    if c.b.buffer not in {w.name for w in plan.weights}:
        return None
    t = plan.types()[c.b.buffer]
    off = flat_offset(c.b.index, t)
    if off.coeff("r0") != n or t.numel != n * kk or n * ITEMSIZE[t.dtype] % 16:
        return None   # not [K, N], or a row's bytes not a multiple of a bulk request's 16
    return c.b.buffer, n * ITEMSIZE[t.dtype], kk


def _k_major_constant(k: Kernel, plan: Plan) -> bool:
    """Whether gemv `k` reads a plan constant K-major (KM = 1): its blocks' slices are contiguous runs of [N, K] rows."""
    return bool(gemm_gemv.params(k).get("KM")) and gemm.dims(k)[0].b.buffer in {w.name for w in plan.weights}


def _idle_us(k: Kernel, hw: Profile, share: float = IDLE_SHARE) -> float:
    """How long kernel `k` leaves the DRAM idle: its predicted body (less the launch) less its own
    bytes at the gemv stream's rate; none for a gemv, which streams its weight through its body (what its
    prediction adds to the bytes is its launch and tail: requests there slowed the plan, sessions 8, 20 and 47)."""
    if gemm_gemv.params(k) is not None:
        return 0.0
    terms = dict(k.schedule.predicted)
    body = terms["time_us"] - terms.get("launch_us", hw.launch_overhead_us)
    own = terms.get("bytes", 0.0) / _stream(hw)
    return body - own if own < share * body else 0.0


def why_not(plan: Plan, i: int, hw: Profile, share: float = IDLE_SHARE) -> str | None:
    k = plan.kernels[i]
    p = gemm_gemv.params(k)
    if p is None:
        return "not a gemv"
    if not p.get("PRE"):
        return "its blocks do not start before the wait (PRE = 0)"
    if i == 0:
        return "the plan's first kernel"
    if _weight_rows(k, plan) is None and not _k_major_constant(k, plan):
        return "its weight is not a constant laid out [K, N] or [N, K]"
    idle = _idle_us(plan.kernels[i - 1], hw, share)
    if idle <= 0.0:
        return f"{plan.kernels[i - 1].name} streams its own bytes (the DRAM is busy)"
    own, moves = dict(k.schedule.predicted).get("bytes", 0.0), idle * _stream(hw)
    if own > moves:
        return (f"its {own / 2**20:.1f} MiB are more than {plan.kernels[i - 1].name}'s idle {idle:.2f} us moves "
                f"({moves / 2**20:.1f} MiB): they would stay in L2 only in part")
    return None


def _stream(hw: Profile) -> float:
    """The gemv stream's rate, bytes an us."""
    return cost_gemv.constants(hw.data)["gemv_stream_gbs"] * 1e3


def _next_stream(plan: Plan, i: int) -> int | None:
    """The index of the gemv that streams next after kernel `i`: kernel i + 1, or i + 2 past one kernel that is not a
    gemv (a norm kept apart, as at B8), else None."""
    for j in (i + 1, i + 2):
        if j < len(plan.kernels) and gemm_gemv.params(plan.kernels[j]) is not None:
            return j
        if j < len(plan.kernels) and plan.kernels[j].family not in ("row_reduce", "pointwise"):
            return None
    return None


def head(plan: Plan, j: int | None, budget: float) -> Prefetch | None:
    """The first rows of each split of gemv `j` (the one streaming next: `_next_stream`), `budget` bytes in all,
    past each split's first step (its blocks request that themselves), or None."""
    if j is None or budget <= 0:
        return None
    nxt = plan.kernels[j]
    p = gemm_gemv.params(nxt)
    rows = _weight_rows(nxt, plan)
    if rows is None:
        return None
    buf, row_bytes, kk = rows
    per = gemm_gemv.k_per_split(kk, p)
    skip = min(gemm_gemv.k_step(p), per)
    take = min(per - skip, int(budget // (p["SPLITK"] * row_bytes)))
    if take <= 0:
        return None
    starts = [y * per + skip for y in range(p["SPLITK"]) if y * per + skip < kk]
    ranges = tuple((r0 * row_bytes, min(take, kk - r0, per - skip) * row_bytes) for r0 in starts)
    return Prefetch(buf, ranges, f"rows {skip}..{skip + take - 1} of each split's {per} k-rows of {nxt.name}'s weight")


def l2_fill(plan: Plan, hw: Profile | None = None, pin: dict | None = None) -> Plan:
    value = (pin or {}).get(PIN)
    if value is not None:
        try:
            mb = float(value)
        except ValueError:
            mb = -1.0
        if not 0.0 <= mb < float("inf"):
            raise AicfError(f"--pin {PIN}={value}: expected megabytes, 0 or more (0 turns the rule off)")
    if hw is None or not plan.target.startswith("sm_9"):
        return plan
    from aicfc.passes.plan_schedules import with_params
    kernels, records = list(plan.kernels), []
    budget = mb * 2**20 if value is not None else cost_gemv.constants(hw.data)["gemv_fill_head_bytes"]
    try:
        share = float((pin or {}).get(SHARE_PIN, IDLE_SHARE))
    except ValueError:
        share = -1.0
    if not 0.0 < share <= 1.0:
        raise AicfError(f"--pin {SHARE_PIN}={(pin or {}).get(SHARE_PIN)}: expected a share in (0, 1]")
    for i, k in enumerate(plan.kernels):
        if gemm_gemv.params(k) is None:
            continue
        why = why_not(plan, i, hw, share) if value is None or mb > 0 else f"--pin {PIN}=0"
        if why is not None:
            if why != "not a gemv":
                records.append(Rewrite(RULE, k.name, False, why))
            continue
        j = _next_stream(plan, i)
        fill = head(plan, j, budget)
        kernels[i] = with_params(kernels[i], {"PF": 1}, plan.types(), hw).replace(prefetch=(fill,) if fill else ())
        if fill:
            nxt = kernels[j]
            kernels[j] = with_params(nxt, {"HOT": fill.bytes}, plan.types(), hw)
        records.append(Rewrite(RULE, k.name, True,
                               f"{plan.kernels[i - 1].name} leaves the DRAM idle about {_idle_us(plan.kernels[i - 1], hw, share):.2f} us "
                               f"(predicted): the rest of its slice" + (f" and {fill.bytes / 2**20:.1f} MiB, {fill.reason} "
                               f"(predicted {nxt.schedule.time_us:.2f} -> {kernels[j].schedule.time_us:.2f} us)," if fill else "")
                               + " requested into L2 before the wait"))
    return plan.replace(kernels=tuple(kernels), rewrites=plan.rewrites + tuple(records))
