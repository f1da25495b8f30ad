"""join_reduce: Decision IR → Decision IR; a GEMM whose A operand is the whole rows of a Hopper GEMM's output runs
in that GEMM's epilogue as a second product (rule RULE), where the predictions say the pair is faster so.

[Note: a reduce joined into the epilogue]
Every bottleneck block after a stage's first reads the block before's output twice: as its residual and
through its first 1x1 convolution (the reduce), a GEMM of its own that reads the whole output back from
memory (ResNet-50 B32 stage 1: 51 MB each, two such reduces at 23 us, and stage 2's first reduce at 29 us on
an H100; session 83's profile). Where the GEMM writing that output (the host) holds a pixel's every channel
in one tile (BN = N, N <= 256, one m64 block a warpgroup), its epilogue has the block's output for its rows
in registers, rounded to the stored 16-bit type: the values the reduce would read. Packed as pairs, the
accumulator fragment of columns 16q .. 16q + 15 is the register fragment of A of wgmma's k-step q
(m64nNk16: rows g and g + 8 of each warp's 16, columns 2t, 2t + 1 and 2t + 8, 2t + 9), so the warpgroup
issues the reduce as N/16 k-steps with A from registers (`wgmma ... {a0..a3}, b-desc`) against the reduce's
weight, copied once a block into shared memory as 128-byte-swizzled K-major boxes; then the reduce's own
epilogue (bias, activation) into a staging of its own and a TMA store through a map of the reduce's output
(`codegen/gemm_wgmma.joined_map`). The host still stores its output (the
residual's reader needs it). Nothing else changes in the host: its ring, staging and stores as planned,
its schedule chosen again among the candidates that can hold the join (key J2 = the reduce's columns:
`codegen/gemm_wgmma.joined_at` places the weight, `smem_bytes` counts it).

Legal where: the host is a `gemm` on the wgmma unit, not gated, rotary or row-scaled, storing its
contraction's result (or its epilogue's) at its own index, rows then N = C columns, 16-bit; the reader is a
`gemm` whose only input besides weights is that output, read directly as A = y[rows.., r0] (the same row
variables, C = its K), its B a contiguous weight [N2, C] or [C, N2] (N2 a multiple of 8, at most 128; the copy into shared
memory lays out either K-major), its epilogue reading
only its accumulator and per-column vectors, its store pair-aligned; nothing between them writes a weight.
Cost (planner/cost_wgmma.py, key J2): per tile the reduce's product at the tensor rate, its stores at the
SM's share of the L2, its epilogue's instructions and JOIN_US, the weight once per block before the first
tile; the reduce's output in the DRAM bytes. Taken where the host's best joined candidate is predicted
faster than the host as planned plus the reduce. `--pin joinr=0` keeps them apart, for an A/B; `--pin
joinr=1` joins wherever legal.

Measured (session 86, H100s, benchmarks/results/join_reduce_session86_h100.txt, 7 alternating rounds, outputs
bit-identical to the pair apart): ResNet-50 B32's plan 764.6 us against 817.7 with `--pin joinr=0` (1.069x); its three
joins alone 34.4 / 49.1 / 55.4 us (predicted 34.6 / 46.7 / 51.7) where the pairs took 29.2 + 23.3, 42.8 + 23.3 and
42.8 + 29.1. The first form stored the joined output from the registers (16 bytes of a 32-byte sector a warp store):
the 128-column join then ran 77.9 us against 72.0 apart; staged and stored by the TMA it runs 55.4.

    kernel k9 gemm { %y.mm = sum[64] ...; %y = map max(add(add(%y.mm, bias), %res), 0); store %y }
    kernel k10 gemm { %r.mm = sum[256] mul(load(%y, [i0, i1, r0]), load(%w, [i2, r0])); %r = map ...; store %r }
  becomes
    kernel k9 gemm { same ops; store %y; store %r; joined k10 "..." { %r.mm = ...; %r = ... } }   (k10 gone)
"""
from __future__ import annotations

import math
from typing import Any

from aicfc.codegen import gemm, gemm_wgmma
from aicfc.codegen.cexpr import flat_offset
from aicfc.codegen.common import element_offset
from aicfc.errors import AicfError
from aicfc.ir.decision import Candidate, Joined, Kernel, Plan, Schedule
from aicfc.ir.lowered import Affine, Rewrite, loads, view_base
from aicfc.ir.properties import contraction
from aicfc.ir.types import TensorType
from aicfc.planner.cost import cost, estimate_registers
from aicfc.planner.hardware import Profile

RULE = "a GEMM over a Hopper GEMM's whole output rows => a second product in that GEMM's epilogue"
PIN = "joinr"     # --pin joinr=0: every such GEMM stays a kernel of its own
MAX_N2 = 128      # the joined product's columns: its accumulators beside the host's 128 (BN = 256)


def _reader(y: str, kernels: list[Kernel | None], start: int, weights: set[str]) -> tuple[int, str | None]:
    """(index, None) of the one kernel after `start` that is a GEMM reading `y` as its A operand, the reason
    where the first kernel reading `y` that way cannot join (it reads more than `y` and `weights`); (-1, None)
    where none reads it so."""
    for j in range(start + 1, len(kernels)):
        r = kernels[j]
        if r is None or r.family != "gemm" or r.schedule is None or not r.ops:
            continue
        c = gemm.dims(r)[0] if contraction(r.ops[0]) is not None else None
        if c is None or c.a.buffer != y:
            continue
        reads = {ld.buffer for ld in r.loads()} - r.outs
        if reads - weights - {y}:
            return j, f"{r.name} reads {sorted(reads - weights - {y})} besides {y!r} and weights"
        return j, None
    return -1, None


def why_not(host: Kernel, r: Kernel, types: dict[str, TensorType]) -> str | None:
    """None where `r` can run in `host`'s epilogue ([Note: a reduce joined into the epilogue]); else why not."""
    p = host.schedule.param
    if p.get("unit") != "wgmma":
        return f"{host.name} runs on the {p.get('unit')} unit, not wgmma"
    if host.joined or r.joined or r.inlined:
        return f"{host.name} or {r.name} has a join already"
    if gemm.gated(host) or gemm.rotary(host) or gemm.row_scale(host) is not None:
        return f"{host.name}'s epilogue is gated, rotary or row-scaled"
    if gemm.gated(r) or gemm.rotary(r) or gemm.row_scale(r) is not None or len(r.ops) > 2:
        return f"{r.name}'s epilogue is gated, rotary or row-scaled"
    c, m, n, kk, batch = gemm.dims(host)
    rc, rm, rn, rk, rbatch = gemm.dims(r)
    last, bind = gemm.store_target(host, types)
    y = last.out
    if y not in host.stores or types[y].dtype not in ("f16", "bf16") or p.get("dtype") != types[y].dtype:
        return f"{host.name}'s output is not a stored 16-bit tensor of its wgmma type"
    if n != rk or n % 64 or n > 256:
        return f"{r.name} sums {rk} columns of {host.name}'s {n}: a tile holds whole rows of 64..256 columns only"
    if rn % 8 or rn > MAX_N2:
        return f"{r.name} has {rn} columns: a multiple of 8 up to {MAX_N2} fits beside the host's accumulators"
    if c.m is None or rc.m != c.m or rc.n != c.n or [v for v, _ in rbatch] != [v for v, _ in batch] \
            or rm != m or dict(rbatch) != dict(batch):
        return f"{r.name}'s rows are not {host.name}'s rows"
    rows = [v for v, _ in batch] + [c.m]
    if tuple(rc.a.index) != tuple(Affine.var(v) for v in rows) + (Affine.var("r0"),):
        return f"{r.name} reads {y!r} at {list(map(str, rc.a.index))}, not at its own rows"
    if element_offset(last, bind) != flat_offset(tuple(Affine.var(v) for v in rows + [c.n]), types[y]):
        return f"{host.name} stores {y!r} at other elements than its own rows and columns"
    b_off = flat_offset(rc.b.index, types[rc.b.buffer])
    if b_off not in (Affine.of({rc.n: rk, "r0": 1}), Affine.of({rc.n: 1, "r0": rn})) \
            or types[rc.b.buffer].dtype != types[y].dtype:
        return f"{r.name}'s weight is not a contiguous [{rn}, {rk}] or [{rk}, {rn}] of {types[y].dtype}"
    for ld in loads(r.ops[-1].body) if len(r.ops) == 2 else ():
        if ld.buffer != r.ops[0].out and {v for a in ld.index for v, _ in a.terms} - {rc.n}:
            return f"{r.name}'s epilogue reads {ld.buffer!r} per row"
    return None


def _joinable(p: dict[str, Any], n: int) -> bool:
    """A candidate of the host that can hold the join: whole rows (BN = N) of one m64 block a warpgroup, staged
    epilogue, one k-split, no cluster."""
    return (p.get("unit") == "wgmma" and p["BN"] == n and p["MI"] == 1 and p.get("OUT") and p.get("SPLITK", 1) == 1
            and p.get("CLUSTER", 1) == 1 and not p.get("STREAM") and not p.get("CL"))


def joined_schedule(host: Kernel, joined: Kernel, plan: Plan, hw: Profile, n2: int, pin: dict | None = None,
                    check=None):
    """(the best predicted schedule of `joined` (the host with the join recorded) among the host's feasible
    candidates that can hold it and that `pin` (`--pin` as plan_schedules takes it) leaves, with J2 = n2; the
    candidates considered) or (None, []) where none fits. With `check` (plan_schedules' RegisterCheck), the leaders
    are built and re-costed at ptxas's registers and one that spills loses its place (`check_leaders`)."""
    from aicfc.passes.plan_schedules import (Ranked, _matches, _order, applied_pins, check_leaders, node_pins, own_pins,
                                             rank)
    types = plan.types()
    n = gemm.dims(host)[2]
    every, by_node = node_pins(pin or {})
    ranked = rank(host, plan, hw, frozenset(every) | frozenset(own_pins(host, by_node)))[0]
    use = applied_pins(ranked, every, own_pins(host, by_node))[0]
    # images as rows (FLAT = 1) only where the joined GEMM's every access steps them as the host's do
    flat = gemm.flat_var(gemm.joined_kernel(joined), types) == gemm.flat_merged(host)
    out = []
    for r in ranked:
        if not _joinable(r.params, n) or not _matches(r.params, use) or (r.params.get("FLAT") and not flat):
            continue
        p = dict(r.params, J2=n2)
        if isinstance(gemm_wgmma.joined_map(joined, p, types), str):
            continue
        dyn = gemm_wgmma.smem_bytes(p)
        smem = gemm_wgmma.static_smem(p) + dyn
        if smem > hw.smem_per_block_optin:
            continue
        regs = estimate_registers(joined, p)
        out.append(Ranked(p, r.grid, r.block, dyn, cost(joined, p, r.grid, r.block, smem, regs, types, hw)))
    out.sort(key=_order)
    if check is not None and out:
        out = check_leaders(plan, hw, [(joined, out, [])], check)[0]
    return (out[0] if out else None), out


def joined_candidates(k: Kernel, plan: Plan, hw: Profile) -> list:
    """The candidates of a kernel with a join (`Kernel.joined`) that hold it, ranked (`aicfc tune`)."""
    host = k.replace(joined=(), stores=k.own_stores)
    return joined_schedule(host, k, plan, hw, gemm.dims(gemm.joined_kernel(k))[2])[1]


def join_reduce(plan: Plan, hw: Profile, pin: dict | None = None, check=None) -> Plan:
    forced = (pin or {}).get(PIN)
    if forced not in (None, "0", "1", 0, 1):
        raise AicfError(f"--pin {PIN}={forced}: expected {PIN}=0 (each GEMM a kernel of its own) or {PIN}=1 "
                        f"(joined wherever legal; without the pin, where predicted faster)")
    types = plan.types()
    base = view_base(plan.views)
    kernels: list[Kernel | None] = list(plan.kernels)
    records: list[Rewrite] = []
    outputs = {base(o) for o in plan.outputs}
    weights = {w.name for w in plan.weights}
    for i, host in enumerate(plan.kernels):
        if kernels[i] is None or host.family != "gemm" or host.schedule is None or not host.ops \
                or contraction(host.ops[0]) is None:
            continue
        if host.schedule.param.get("unit") != "wgmma":
            continue
        y = gemm.store_target(host, types)[0].out
        j, why = _reader(y, kernels, i, weights)
        if j < 0:
            continue
        r = kernels[j]
        if why is None:
            why = why_not(host, r, types)
        if why is None and str(forced) == "0":
            why = f"--pin {PIN}=0"
        if why is None and any(k is not None and set(k.stores) & weights for k in kernels[i + 1:j]):
            why = "a kernel between them writes a weight"
        if why is not None:
            records.append(Rewrite(RULE, y, False, why))
            continue
        n2 = gemm.dims(r)[2]
        joined = host.replace(joined=(Joined(r.name, r.ops, r.binds, ""),), stores=host.stores + r.stores)
        best, considered = joined_schedule(host, joined, plan, hw, n2, pin, check)
        apart = host.schedule.time_us + r.schedule.time_us
        if best is None or (best.time_us >= apart and str(forced) != "1"):
            why = ("no candidate of the host holds whole rows with the join" if best is None else
                   f"predicted {best.time_us:.2f} us joined against {apart:.2f} apart ({host.name} "
                   f"{host.schedule.time_us:.2f} + {r.name} {r.schedule.time_us:.2f})")
            records.append(Rewrite(RULE, y, False, why))
            continue
        reason = (f"kernel {r.name} ({r.ops[0].out}, {gemm.dims(r)[1] * math.prod(e for _, e in gemm.dims(r)[4])} x "
                  f"{n2} over the {types[y].nbytes / 1e6:.1f} MB {y!r}) joined into {host.name}'s epilogue: its A operand is "
                  f"the tile {host.name} just computed, so {y!r} is not read back; predicted {best.time_us:.2f} us "
                  f"against {apart:.2f} apart" + (f" (--pin {PIN}=1)" if str(forced) == "1" else ""))
        cands = tuple(Candidate(tuple(sorted(c.params.items())), c.time_us) for c in considered[1:9])
        s = host.schedule
        sched = Schedule(tuple(sorted(best.params.items())), best.grid, best.block, best.dyn_smem, None,
                         best.estimate.as_items(), cands + s.candidates)
        kernels[i] = joined.replace(joined=(Joined(r.name, r.ops, r.binds, reason),), schedule=sched,
                                    rewrites=tuple(dict.fromkeys(host.rewrites + (RULE,))))
        kernels[j] = None
        saved = types[y].nbytes if y not in outputs else 0
        records.append(Rewrite(RULE, y, True, reason, saved))
    if not records:
        return plan
    return plan.replace(kernels=tuple(k for k in kernels if k is not None), rewrites=plan.rewrites + tuple(records))
