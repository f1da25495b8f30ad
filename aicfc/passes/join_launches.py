"""join_launches: Decision IR → Decision IR; a one-row K-major gemv right after a split decode attention whose
output is its activation runs as more blocks of the attention's launch (rule RULE: schedule parameter JOIN, the
attention's blocks; codegen/join.py renders the launch).

[Note: the O projection joined to the attention]
In the 1 B Llama's decode step the split attention reads 1.3 MB of cache in about 4 us (a chain of round trips:
the query, the keys, the merges), and the O projection after it streams its 8 MiB weight in about 1.8 us from its
go, 0.4 us after the attention's done (layer 1 of session 59's 4-layer timeline, benchmarks/results/
last_norm_timeline_session59_h200.txt). The DRAM is mostly idle while the attention runs. Joined, the O's blocks
land with the attention's, copy their whole weight slice into the launch's shared memory at once, request the
gate/up's head into L2 as the O did, and wait only for the attention's output: the O's launch boundary and its
weight stream leave the chain.

The role's schedule (`role_params`, ROLE_BN): the O's columns over fewer, larger blocks, at the attention's block
size (one launch, one block size), each block's slice within the launch's shared memory (the attention's), and
every block of the launch resident at once (`wave_blocks`: a role block spinning where an attention block should run
would never finish, codegen/join.py), at ptxas's register count without a spill; the fastest predicted of those.
Its prediction (planner/cost_gemv.py) counts the weight bytes the attention's predicted run moves at the stream's
rate as landed by the output's arrival (LANDED), no launch, and gemv_join_us for the publication and the
activations' round trip. The attention's own prediction is left as it is, though the role's weight requests share
the DRAM with its cache reads (not measured). The two roles are one function, whose registers are the larger
role's or more (the 1 B Llama's: 122 against the attention's 118 alone): the launch's bounds (JMB,
`launch_min_blocks`) ask for one wave and, where passes/attention_room.py left the attention's blocks room beside
the blocks of the gemv before it, for few enough registers to keep that room (128 there).

Written without a GPU (session 62) and measured slower (session 63, [Note: the joined launch measured]), so it runs
only under `--pin joino=1`; MEASURED would name an A/B that shows a joined form faster, from when the rule joins
wherever it predicts the launch faster. The record of every site says what the planner predicts either way.

    kernel k8 attention [split CL=1 SPLITS=6]  kernel k9 gemm [gemv BN=4 KM=1 MB=4 PF=1 PRE=1 TF=1 U=4 WARPS=4]
  becomes (under --pin joino=1)
    kernel k8 attention [split CL=1 SPLITS=6]  kernel k9 gemm [gemv BN=16 JOIN=48 KM=1 LANDED=8388608 TF=1 U=4 WARPS=4]

[Note: the joined launch measured]
Session 63, an H200 (benchmarks/join_round.sh; benchmarks/results/join_*_session63_h200.txt). The joined step matches
onnxruntime and the step apart bit for bit over 200 replays (fp16, bf16, gated), compute-sanitizer memcheck and
synccheck clean. The 1 B Llama's 4-layer decode plan, 7 alternating rounds: apart 151.2 us, joined 155.1 (0.975x),
gated 157.2 (0.962x), the role's early trigger off 167.2 (0.905x). The role's own stamps ([Note: a joined role's
stamps] in codegen/timeline.py; layer 1 of the 2-layer timeline) say where it goes, in us after the role's go,
median block / last block: its slice requested -1.02 / -0.38 (it lands with the attention), the attention's last exit
3.58, the attention's output seen published 4.35 / 4.42, the slice long landed then, its sums 5.63 / 6.18, its exit
6.14 / 6.69, and the next launch's go 7.10. Apart, the attention's last exit to the O's go is 0.35 us (the dependent
launch's boundary) and the O's body 1.89 (its slice already in L2 by its fill, [Note: L2 fill]). So the join trades
a 0.35 us boundary for a 0.8 us publication (barrier, fence, atomic, the spinner's acquire), and the activations'
round trip and the sums stay (1.3 us from shared memory against the O's from L2): the boundary and the weight stream
the rule meant to take out of the chain were mostly out of it already. gemv_join_us (planner/cost_gemv.py) is fitted
to it: the role's 2.88 us after the attention (the joined launch's 7.10 in the chain less the attention's 4.22 apart).
The O apart was predicted 3.74 us against 2.46-2.50 measured in the chain, which would have had the planner pick the
join; with its fill credited ([Note: the fill's own slice] in passes/l2_fill.py) it is 2.62, so every site's record
now predicts the join slower, as measured. It stays pinned: MEASURED names no A/B where a joined form is faster.

[Note: the joined role's gate]
The role's 8 MiB of weight requests go out as its blocks land, beside the attention's cache reads, which are its
critical path: they may delay them by more than they save. Under `--pin joingate=1` (JG) the role's blocks wait,
after the launch before is complete, until every attention block has its first key tile (or has none: its chunk
is past the live keys), counted on a third word of the launch's counter, then request their weights. The
prediction does not tell the two apart (not measured: benchmarks/prototypes/fuse_attention_o.py --gate is the
same gate by a bundle's rewrite).
"""
from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING

from aicfc.codegen import FAMILIES, gemm, gemm_gemv, join
from aicfc.ir.decision import Kernel, Plan
from aicfc.ir.types import ITEMSIZE
from aicfc.ir.lowered import Rewrite, view_base
from aicfc.passes.merge_kernels import sites, switch
from aicfc.planner import cost_gemv
from aicfc.planner.hardware import Profile, blocks_per_sm

if TYPE_CHECKING:
    from aicfc.passes.plan_schedules import RegisterCheck

RULE = "a K-major gemv after the split attention it reads => more blocks of the attention's launch"
PIN = "joino"   # --pin joino=1: join where legal; unpinned or 0: apart (measured slower: SLOWER)
GATE_PIN = "joingate"   # --pin joingate=1: the role's weight requests after every attention block's first tile (JG)
ROLE_BN = (8, 16, 32)   # the role's columns a block: few enough blocks to share one wave with the attention's
# The A/B on a GPU (a results file and its figure) after which the rule joins, unpinned, wherever it predicts the joined
# launch faster; None until one shows it faster, and only --pin joino=1 joins.
MEASURED: str | None = None
# The A/B that showed it slower ([Note: the joined launch measured]).
SLOWER = ("measured slower: the 1 B Llama's 4-layer decode step 155.1 us joined against 151.2 apart, session 63, "
          "benchmarks/results/join_ab_session63_h200.txt")


def why_not(plan: Plan, i: int) -> str | None:
    """Why gemv `plan.kernels[i]` cannot join the launch of the kernel before it; None where it can."""
    k = plan.kernels[i]
    p = gemm_gemv.params(k)
    if p is None:
        return "not a gemv"
    host = plan.kernels[i - 1] if i else None
    if host is None or host.family != "attention" or host.schedule.param.get("unit") != "split":
        return "the kernel before it is not a split attention"
    if not p.get("KM") or p["SPLITK"] != 1 or p.get("TC") or p["BM"] != 1:
        return "not a one-row gemv over a K-major weight in one split"
    if gemm.rotary(k) is not None or gemm.row_scale(k) is not None:
        return "its epilogue needs whole heads or the row's statistic (rotary, row scale)"
    if host.schedule.grid[1:] != (1, 1):
        return f"the attention's grid {list(host.schedule.grid)} is not one-dimensional"
    c = gemm.dims(k)[0]
    root = view_base(plan.views)   # the tensor whose bytes a view reads
    written = set(host.stores) | {ip.output for ip in host.inplace}
    if root(c.a.buffer) not in host.stores:
        return f"its activation {c.a.buffer!r} is not the attention's output"
    early = {root(ld.buffer) for ld in k.loads()} - {root(c.a.buffer)} - k.outs
    if early & written:
        return f"it reads {sorted(early & written)} that the attention writes, besides its activation"
    return None


def role_params(k: Kernel, host: Kernel, bn: int, types, gated: bool = False) -> tuple[dict | None, str]:
    """(the role's schedule at `bn` columns a block, "") or (None, why not); `gated`: its weight requests wait for
    the attention's first tiles ([Note: the joined role's gate])."""
    warps = host.schedule.block[0] // 32
    c, _, n, kk, _ = gemm.dims(k)
    if host.schedule.block[1:] != (1, 1) or warps * 32 != host.schedule.block[0] or bn % warps or n % bn:
        return None, f"{bn} columns are not whole columns for each of {warps} warps"
    staged = bn * kk * ITEMSIZE[types[c.b.buffer].dtype]
    if staged > host.schedule.smem_bytes:
        return None, f"{staged} B of weight a block is more than the launch's {host.schedule.smem_bytes} B of shared memory"
    role = {key: v for key, v in k.schedule.param.items() if key not in ("MB", "PF", "PRE", "LANDED", "HOT")}
    role.update(BN=bn, WARPS=warps, KS=1, U=4, JOIN=host.schedule.grid[0], **({"JG": 1} if gated else {}))
    return role, ""


def wave_blocks(host: Kernel, role: Kernel, hw: Profile) -> tuple[int | None, str]:
    """(the blocks an SM must hold for every block of the launch to be resident at once, "") or (None, why it cannot
    hold them). A GPC's slots short of a whole cluster are lost to clusters (profile `gpcs`, 8 where it does not
    say). Shared memory and threads are the launch's as they are; the registers, the launch's bounds hold to it
    (`launch_min_blocks`), so one wave never rests on a register count ptxas might exceed."""
    hp = host.schedule.param
    smem = (host.schedule.smem_bytes + FAMILIES[host.family].static_smem(host, hp)
            + FAMILIES[role.family].static_smem(role, role.schedule.param))
    fits, limit = blocks_per_sm(host.schedule.block[0], smem, 1, hw)
    _, _, total = join.launch_blocks(host, role)
    lost = int(hw.data.get("gpcs", 8)) * (join.cluster_size(host) - 1)
    need = math.ceil((total + lost) / hw.sm_count)
    if need > fits:
        return None, (f"{total} blocks{f' (and {lost} slots short of a cluster)' if lost else ''} need {need} an SM, "
                      f"where {fits} fit ({limit}: {smem} B of shared memory)")
    return need, ""


def room_registers(plan: Plan, i: int, hw: Profile) -> int | None:
    """The registers a thread the launch of attention `plan.kernels[i]` may take for one of its blocks to land beside
    the blocks of the gemv before it on that gemv's busiest SM ([Note: room for the attention] in
    passes/attention_room.py), where that room holds the attention alone; None where there is no such gemv or room."""
    from aicfc.passes.attention_room import block_threads, checked_registers, register_cap
    host = plan.kernels[i]
    before = plan.kernels[i - 1] if i else None
    if before is None or gemm_gemv.params(before) is None or not (regs := checked_registers(before)):
        return None
    busiest = math.ceil(math.prod(before.schedule.grid) / hw.sm_count)
    cap = register_cap(hw, busiest * math.ceil(block_threads(before) / 32), regs, math.ceil(block_threads(host) / 32))
    own = checked_registers(host)
    return cap if own and own <= cap else None


def launch_min_blocks(plan: Plan, i: int, role: Kernel, hw: Profile) -> tuple[int, str]:
    """(the blocks an SM the joined launch's bounds ask for, why): those one wave needs (`wave_blocks`), and where the
    attention's blocks had room beside the gemv before it, enough to keep that room's registers."""
    host = plan.kernels[i]
    wave, _ = wave_blocks(host, role, hw)
    assert wave is not None, f"{role.name}: joined without one wave"
    cap = room_registers(plan, i, hw)
    kept = math.ceil(hw.registers_per_sm / (cap * host.schedule.block[0])) if cap else 0
    if kept <= wave:
        return wave, f"{wave} blocks an SM for one wave"
    return kept, (f"{kept} blocks an SM: at most {hw.registers_per_sm // (kept * host.schedule.block[0])} registers a "
                  f"thread, the room {plan.kernels[i - 1].name}'s blocks leave {host.name}'s")


def landed_bytes(host: Kernel, k: Kernel, types, hw: Profile) -> int:
    """Gemv `k`'s weight bytes that the attention's predicted run (less its launch) moves at the stream's rate."""
    weight = types[gemm.dims(k)[0].b.buffer].nbytes
    run = host.schedule.time_us - hw.launch_overhead_us
    return int(min(weight, max(0.0, run) * cost_gemv.constants(hw.data)["gemv_stream_gbs"] * 1e3))


def as_role(k: Kernel, host: Kernel, p: dict, regs: int | None, plan: Plan, hw: Profile) -> Kernel:
    """`k` scheduled as the role `p`, its launch and prediction re-costed."""
    from aicfc.passes.plan_schedules import recost
    from aicfc.planner.cost import estimate_registers
    _, _, n, _, _ = gemm.dims(k)
    grid, block = (math.ceil(n / p["BN"]), 1, 1), host.schedule.block
    types = plan.types()
    p = p | {"LANDED": landed_bytes(host, k, types, hw)}
    est = recost(k, p, grid, block, 0, int(regs or estimate_registers(k, p)), types, hw)
    if regs:
        est.terms["registers_ptxas"] = regs
    return k.replace(schedule=dataclasses.replace(k.schedule, params=tuple(sorted(p.items())), grid=grid, block=block,
                                                  smem_bytes=0, predicted=est.as_items()))


def join_launches(plan: Plan, hw: Profile | None = None, pin: dict | None = None,
                  check: RegisterCheck | None = None) -> Plan:
    value = switch(pin, PIN, "apart", "wherever legal")
    gated = switch(pin, GATE_PIN, "as its blocks land", "after every attention block's first tile") == "1"
    if hw is None or not plan.target.startswith("sm_9"):
        return plan
    kernels, records = list(plan.kernels), []
    for i, k in sites(plan, RULE, why_not, ("not a gemv", "the kernel before it is not a split attention"), records):
        host, tried, best = plan.kernels[i - 1], [], None
        for bn in ROLE_BN:
            p, why = role_params(k, host, bn, plan.types(), gated)
            if p is None:
                tried.append(f"BN {bn}: {why}")
                continue
            if check is None:
                tried.append(f"BN {bn}: the register check is off: nothing would tell a spill")
                continue
            # the role's registers as a kernel of its own with the same loads (its weights into shared memory instead
            # of a register step are fewer); the launch's own, which the wave needs, at least the attention's
            probe = {key: v for key, v in p.items() if key != "JOIN"} | {"PRE": 1}
            ((regs, spill),), = check(plan, [(k, [probe])])
            role = as_role(k, host, p, regs, plan, hw)
            wave, why = wave_blocks(host, role, hw)
            if spill:
                tried.append(f"BN {bn}: spills {spill} B at {regs} registers")
            elif wave is None:
                tried.append(f"BN {bn}: {why}")
            else:
                tried.append(f"BN {bn}: {role.schedule.time_us:.2f} us at {regs} registers")
                if best is None or role.schedule.time_us < best.schedule.time_us:
                    best = role
        apart = f"{k.name} apart predicted {k.schedule.time_us:.2f} us"
        if best is None:
            records.append(Rewrite(RULE, k.name, False, f"no role fits ({'; '.join(tried)}); {apart}"))
            continue
        figures = (f"{k.name} as {best.schedule.grid[0]} blocks of {host.name}'s launch (BN "
                   f"{best.schedule.param['BN']}) predicted {best.schedule.time_us:.2f} us after {host.name}'s output, "
                   f"{apart} ({'; '.join(tried)})")
        if value == "0" or (value is None and MEASURED is None):
            how = "--pin joino=0" if value == "0" else f"{SLOWER}: runs only under --pin joino=1"
            records.append(Rewrite(RULE, k.name, False, f"kept apart ({how}): {figures}"))
            continue
        if value is None and best.schedule.time_us >= k.schedule.time_us:
            records.append(Rewrite(RULE, k.name, False, f"kept apart (predicted no faster): {figures}"))
            continue
        jmb, bounds = launch_min_blocks(plan, i - 1, best, hw)
        kernels[i] = best.replace(schedule=dataclasses.replace(
            best.schedule, params=tuple(sorted((dict(best.schedule.params) | {"JMB": jmb}).items()))))
        how = ("; --pin joino=1" if value == "1" else f" (measured: {MEASURED})") + (
            "; its weight requests after every attention block's first tile (--pin joingate=1)" if gated else "")
        records.append(Rewrite(RULE, k.name, True, f"{figures}; the launch's bounds: {bounds}{how}"))
    return plan.replace(kernels=tuple(kernels), rewrites=plan.rewrites + tuple(records))
