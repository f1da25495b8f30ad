"""fold_cache_writes: Decision IR → Decision IR; the in-place cache scatters of a decode step are
done by the split-KV attention that reads the cache (rule FOLD_RULE), not by kernels of their own.

Preconditions: declare_state made each cache update a `scatter` kernel over a state buffer y
(y = select(hit, val, x), x and y one buffer), and plan_schedules gave the attention that reads y
the `split` unit (codegen/attention_split.py). Legal when

- y is read by that attention alone, as its K or V, at [kv batch variables / 0, key, column]:
  one axis the key (the scatter's only indexed axis), one the head dimension (or value column),
  every other axis either extent 1 or a batch variable K/V depend on over its whole extent (so
  the attention's blocks together cover every element the scatter writes);
- the scatter has one indexed axis.

Then the scatter's three ops move to the front of the attention kernel (its writes, in place) and
the scatter kernel is gone. The split kernel reads an updated key's K/V row from the update's
value instead of the cache (the block whose chunk holds it patches its staged tile) and writes it
into the cache then, since no other block reads that row; a row at or past the live length, which
no chunk holds, the last block of its K/V head writes after every chunk has been read (its ticket;
[Note: the new rows with the query] in codegen/attention_split.py). Other heads' blocks never
read them. So the state semantics stay
those of declare_state (the elements not written already hold x), one launch per update fewer.

[Note: attention reads before the wait]
After the fold, the attention's K and V are state buffers written by no kernel but itself (each new
row by the one block that reads it), and the live-key positions a plan input no kernel writes. In a
plan of dependent launches ([Note: PDL], codegen/pdl.py) such a kernel reads them before
`griddepcontrol.wait`: the positions, the live length and its first tile of cache rows (cp.async)
are requested while the previous kernel (the QKV projection) still runs, and only the query rows
and the new rows wait (schedule parameter PRE = 1, rule EARLY_RULE; the cost model counts one
round trip fewer in the block's chain, planner/cost_attention_split.py; `--pin early=0` keeps
the entry first, for an A/B). Legal because a kernel's blocks start early only beside the kernel
right before it, which has itself waited for every earlier one; none of them writes those
buffers. Measured on an H200 (benchmarks/results/attention_prewait_session13_h200.txt): a
4-layer decode plan of a 1 B Llama in 212.4 us against 219.3 with the entry first.

The alternative, writing the rows from the QKV GEMM's epilogue, would put a data-dependent scatter
into every GEMM unit's template (mma, wgmma, gemv) for one consumer; the attention already reads
the new row and knows the positions. The rule applies only to split-KV attention: the tile units
(a prefill's S rows) keep the scatter kernels, which they run after.

    kernel k5 scatter { %y.hit ... %y.val ... %y ... }     kernel k11 attention { ... load(%y, ..) ... }
  becomes
    kernel k11 attention { %y.hit ... %y.val ... %y ... the attention's ops }   rewrites += FOLD_RULE
"""
from __future__ import annotations

import dataclasses

from aicfc.errors import AicfError
from aicfc.ir.decision import Kernel, Plan
from aicfc.ir.lowered import Affine, Load, Rewrite, loads
from aicfc.planner.hardware import Profile

FOLD_RULE = "scatter(cache, pos, new) read only by a split-KV attention => the attention writes the new rows"
PIN = "early"      # --pin early=0: the attention's entry stays its first statement
EARLY_RULE = ("cache and positions written by no other kernel => a split-KV attention reads them before the "
              "dependent-launch wait")


def cache_writes(k: Kernel) -> tuple[str, ...]:
    """The state buffers an attention kernel updates (the rule's folded scatters, first in its ops)."""
    return tuple(op.out for op in k.ops if f"{op.out}.hit" in k.outs and f"{op.out}.val" in k.outs)


def scatter_part(k: Kernel, y: str) -> Kernel:
    """The scatter of state `y` in `k`: `k` itself, or the three ops the rule folded into an attention."""
    if k.family == "scatter":
        return k
    by_out = {op.out: op for op in k.ops}
    return k.replace(family="scatter", ops=tuple(by_out[n] for n in (f"{y}.hit", f"{y}.val", y)), stores=(y,))


def attention_part(k: Kernel) -> Kernel:
    """The attention kernel without its folded cache writes (what the attention codegen reads)."""
    ys = cache_writes(k)
    if not ys:
        return k
    drop = {n for y in ys for n in (y, f"{y}.hit", f"{y}.val")}
    keep = [i for i, op in enumerate(k.ops) if op.out not in drop]
    return k.replace(ops=tuple(k.ops[i] for i in keep), binds=tuple(k.binds[i] for i in keep),
                     stores=tuple(s for s in k.stores if s not in drop))


def _axes_ok(att, ld: Load, col: str, scatter: Kernel) -> str | None:
    from aicfc.codegen import scatter as sc
    _, _, y, ids = sc.parts(scatter)
    if len(ids) != 1:
        return f"the scatter indexes {len(ids)} axes, not one"
    axis = ids[0][1]
    ext = att.out.extents()
    for a, (ix, n) in enumerate(zip(ld.index, y.type.shape)):
        if a == axis:
            if ix != Affine.var("r0"):
                return "the scattered axis is not the attention's key"
            continue
        if ix == Affine.var(col):
            continue
        if n == 1 and ix == Affine():
            continue
        if len(ix.terms) == 1 and not ix.const and ix.terms[0][1] == 1 and ix.terms[0][0] in att.batch \
                and ext[ix.terms[0][0]] == n:
            continue
        return f"axis {a} of the cache is read at {ix}, not by a K/V head variable over all of it"
    return None


def why_not(scatter: Kernel, readers: list[Kernel]) -> str | None:
    from aicfc.codegen import attention
    y = scatter.ops[-1].out
    if len(readers) != 1:
        return f"the cache is read by {len(readers)} kernels"
    a = readers[0]
    if a.family != "attention" or a.schedule is None or a.schedule.param.get("unit") != "split":
        unit = a.schedule.param.get("unit") if a.schedule else None
        return f"its reader is not a split-KV attention ({a.family}{', unit ' + unit if unit else ''})"
    att = attention.roles(a)
    if att.k.buffer == y:
        return _axes_ok(att, att.k, "d", scatter)
    if att.v.buffer == y:
        return _axes_ok(att, att.v, att.col, scatter)
    return "the attention reads the cache other than as its K or V"


def why_not_early(k: Kernel, plan: Plan) -> str | None:
    """Why split-KV attention `k` may not read its K/V and positions before the wait, or None."""
    from aicfc.codegen import attention
    from aicfc.ir.properties import live_key_position
    att = attention.roles(k)
    pos = live_key_position(att)
    if pos is None:
        return "its key loop is not bounded by positions"
    own, inputs = set(cache_writes(k)), {v.name for v in plan.inputs}
    written = {s for other in plan.kernels if other.name != k.name for s in other.stores}
    for role, buf in (("K", att.k.buffer), ("V", att.v.buffer)):
        if buf not in own:
            return f"its {role} is not a cache it updates itself"
    if pos.buffer not in inputs or pos.buffer in written:
        return "its positions are not a plan input that no kernel writes"
    from aicfc.codegen import scatter
    for y in own:   # the slots it writes are computed before the wait too ([Note: the new rows with the query])
        for ident, _ in scatter.parts(scatter_part(k, y))[3]:
            late = sorted({ld.buffer for ld in loads(ident)} & written)
            if late:
                return f"the slots it writes read {late[0]}, which another kernel writes"
    return None


def read_early(k: Kernel, plan: Plan, hw: Profile) -> Kernel:
    """`k` with PRE = 1 and its prediction re-costed as plan_schedules costed it: the attention
    without its folded writes (whose stores are the whole caches)."""
    from aicfc.passes.plan_schedules import with_params
    return with_params(k, {"PRE": 1}, plan.types(), hw, attention_part(k))


def fold_cache_writes(plan: Plan, hw: Profile | None = None, pin: dict | None = None) -> Plan:
    forced = (pin or {}).get(PIN)
    if forced not in (None, "0", "1", 0, 1):
        raise AicfError(f"--pin {PIN}={forced}: expected {PIN}=0 (the entry first) or {PIN}=1 (reads before "
                        f"the wait where legal, the default)")
    kernels = list(plan.kernels)
    records: list[Rewrite] = []
    moved: dict[str, str] = {}
    for i, s in enumerate(plan.kernels):
        if s.family != "scatter" or not s.inplace:
            continue
        y = s.ops[-1].out
        readers = [j for j, k in enumerate(kernels) if k is not None and j != i
                   and any(ld.buffer == y for op in k.ops for ld in loads(op.body))]
        why = why_not(s, [kernels[j] for j in readers])
        if why is not None:
            records.append(Rewrite(FOLD_RULE, y, False, why))
            continue
        j = readers[0]
        a = kernels[j]
        kernels[j] = a.replace(ops=s.ops + a.ops, binds=s.binds + a.binds, stores=a.stores + s.stores,
                               rewrites=tuple(dict.fromkeys(a.rewrites + s.rewrites + (FOLD_RULE,))),
                               properties=tuple(dict.fromkeys(a.properties + s.properties)),
                               inplace=a.inplace + s.inplace)
        kernels[i] = None  # type: ignore[call-overload]
        moved[s.name] = a.name
        records.append(Rewrite(FOLD_RULE, y, True,
                               f"kernel {s.name} folded into {a.name}: the split-KV attention reads the new rows from "
                               f"the update and its last block of each K/V head writes them, one launch fewer"))
    if not moved:
        return plan.replace(rewrites=plan.rewrites + tuple(records)) if records else plan
    state = tuple(dataclasses.replace(st, kernel=moved.get(st.kernel, st.kernel)) for st in plan.state)
    plan = plan.replace(kernels=tuple(k for k in kernels if k is not None), state=state)
    if hw is not None:
        kernels = list(plan.kernels)
        for i, k in enumerate(kernels):
            if k.name not in moved.values():
                continue
            why = why_not_early(k, plan) if str(forced) != "0" else f"--pin {PIN}=0"
            if why is None:
                kernels[i] = read_early(k, plan, hw)
            records.append(Rewrite(EARLY_RULE, k.name, why is None, why or (
                f"the positions and the first tile of cache rows are requested while the previous kernel runs "
                f"(predicted {k.schedule.time_us:.2f} -> {kernels[i].schedule.time_us:.2f} us)")))
        plan = plan.replace(kernels=tuple(kernels))
    return plan.replace(rewrites=plan.rewrites + tuple(records))
