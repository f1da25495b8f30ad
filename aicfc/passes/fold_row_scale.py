"""fold_row_scale: Decision IR → Decision IR; a norm's row pass and the gemv that alone reads it
become one kernel, where the gemv unit runs it and the planner predicts it faster
([Note: a norm's row scale in the gemv] in codegen/gemm_gemv.py).

After fold_column_scale an RMSNorm is a row pass of two ops, the statistic and the map:

    %s: f16[1,1,1]    = sum[K] mul(mul(load(%h, [0, 0, r0]), load(%h, [0, 0, r0])), 1/K)
    %y: f16[1,1,K]    = map mul(load(%h, [0, 0, i2]), div(1.0, sqrt(add(load(%s, [0, 0, 0]), eps))))

and y is read by one GEMM kernel as its left operand. y = h·F with F a function of the row's
statistic alone, and sum_k y[k]·W[k, n] = F·sum_k h[k]·W[k, n], so the GEMM kernel becomes

    %c.rows = sum[K] mul(load(%h, [.., r0]), load(%W, [r0, i2]))        (the loop, over h)
    %s      = the statistic, bound to the contraction's row
    %c      = map mul(load(%c.rows, [..]), F at the contraction's row)  (the scaled sums)
    <the epilogue, unchanged>

and the norm's kernel goes. Eligible: a row_reduce kernel of exactly those two ops (a statistic of
one buffer's row read at its own elements; a map that is that buffer at its own element times an
expression of the statistic and constants), storing only y, which is no graph output nor a view's
source; its one reader a gemm kernel of at most two ops whose contraction alone reads y, as its
left operand along k. Decided like pool_epilogue: the planner's best predicted time of the merged
kernel (gemv schedules only) against the two apart, both in the record (RULE); `--pin rowscale=0`
keeps them apart, `rowscale=1` merges wherever a gemv schedule can run the result.
Preconditions: after apply_precision (the gemv streams fp16/bf16) and before plan_schedules.
"""
from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from aicfc.codegen import gemm, gemm_gemv
from aicfc.ir.decision import Kernel, Plan
from aicfc.ir.lowered import Affine, Call, Compute, Load, Rewrite, loads, map_loads, substitute
from aicfc.passes.merge_kernels import decide, declined_for_unit, kernel_readers, switch

if TYPE_CHECKING:
    from aicfc.planner.hardware import Profile

PIN = "rowscale"
RULE = gemm_gemv.ROW_SCALE_RULE


def _leading_identity(ld: Load, rank: int) -> bool:
    """`ld` reads dimension j < rank - 1 at its own variable i_j (or 0 where that is all there is)."""
    return all(isinstance(a, Affine) for a in ld.index) and len(ld.index) == rank and all(
        a == Affine.var(f"i{j}") or a == Affine() for j, a in enumerate(ld.index[:-1]))


def _norm_parts(k: Kernel, plan: Plan) -> tuple[str, Compute, Compute, object] | str:
    """(h, statistic, map, F) of a norm row pass whose map is h at its own element times F, an
    expression of the statistic and constants; or why it is not one."""
    if len(k.ops) != 2 or k.stores != (k.ops[1].out,):
        return "the row pass is more than a statistic and the map it stores"
    stat, y = k.ops
    rank = len(y.type.shape)
    if stat.combiner != "sum" or len(stat.reduce) != 1 or y.combiner != "map" or rank < 1:
        return "it is not a sum's statistic and a map"
    if stat.reduce[0] != y.type.shape[-1] or stat.type.shape[-1] != 1 or len(stat.type.shape) != rank:
        return "the statistic is not over the map's rows"
    reads = loads(stat.body)
    if not reads or len({ld.buffer for ld in reads}) != 1:
        return "the statistic reads other than one buffer"
    h = reads[0].buffer
    if any(ld.fill is not None or not _leading_identity(ld, rank) or ld.index[-1] != Affine.var("r0") for ld in reads):
        return "the statistic reads its buffer at other elements than its row's"
    body = y.body
    if not (isinstance(body, Call) and body.fn == "mul" and len(body.args) == 2):
        return "the map is not the row times a factor"
    own = [a for a in body.args if isinstance(a, Load) and a.buffer == h]
    if len(own) != 1 or own[0].fill is not None or not _leading_identity(own[0], rank) or \
            own[0].index[-1] != Affine.var(f"i{rank - 1}"):
        return "the map does not read the row at its own element"
    factor = body.args[1] if body.args[0] is own[0] else body.args[0]
    for ld in loads(factor):
        if ld.buffer != stat.out or ld.fill is not None or not _leading_identity(ld, rank) or ld.index[-1] != Affine():
            return "the map's factor reads more than the row's statistic"
    if plan.types()[h].dtype != y.type.dtype:
        return f"the row is {plan.types()[h].dtype}, the map {y.type.dtype}"
    return h, stat, y, factor


def _merged(norm: Kernel, reader: Kernel, parts) -> Kernel | str:
    h, stat, y, factor = parts
    mm = reader.ops[0]
    c = gemm.dims(reader)[0]
    rank = len(y.type.shape)
    ix = c.a.index
    if c.a.buffer != y.out or ix[-1] != Affine.var("r0") or any(
            not isinstance(a, Affine) or "r0" in {v for v, _ in a.terms} for a in ix[:-1]):
        return "its contraction does not read the norm's rows along k"
    if any(ld.buffer == y.out for op in reader.ops[1:] for ld in loads(op.body)) or \
            sum(ld.buffer == y.out for ld in loads(mm.body)) != 1:
        return "its epilogue reads the norm's result too"
    rows = {f"i{j}": ix[j] for j in range(rank - 1)}
    mm_rows = dataclasses.replace(mm, out=f"{mm.out}.rows",
                                  body=map_loads(mm.body, lambda ld: dataclasses.replace(ld, buffer=h) if ld.buffer == y.out else ld))
    own = tuple(Affine.var(v) for v in mm.domain_vars)
    scaled = Compute(mm.out, mm.type, "map", (), Call("mul", (Load(mm_rows.out, own), substitute(factor, rows))), y.origin)
    stat_bind = tuple(rows.items()) + ((f"i{rank - 1}", Affine()), ("r0", Affine.var("r0")))
    return reader.replace(ops=(mm_rows, stat, scaled) + reader.ops[1:],
                          binds=(reader.binds[0], stat_bind, tuple((v, Affine.var(v)) for v in mm.domain_vars)) + reader.binds[1:],
                          properties=tuple(dict.fromkeys(reader.properties + norm.properties)),
                          rewrites=reader.rewrites + norm.rewrites + (RULE,))


def _pairs(plan: Plan) -> list[tuple[Kernel, Kernel | str, object]]:
    """(norm kernel, its one gemm reader or why it has none, its parts) for every row pass whose
    stored result a gemm kernel reads."""
    readers = kernel_readers(plan)
    viewed = {v.source for v in plan.views}
    out = []
    for k in plan.kernels:
        if k.family != "row_reduce" or len(k.stores) != 1 or len(k.ops) != 2 or k.ops[1].combiner != "map":
            continue   # not a norm's statistic and map (a pooling's mean, a softmax)
        users = readers.get(k.stores[0], [])
        if not any(u.family == "gemm" for u in users):
            continue
        res = k.stores[0]
        parts = _norm_parts(k, plan)
        if isinstance(parts, str):
            out.append((k, parts, None))
        elif len(users) != 1:
            out.append((k, f"{res!r} has {len(users)} readers", None))
        elif res in plan.outputs or res in viewed:
            out.append((k, f"{res!r} is a graph output or a view's source", None))
        elif len(users[0].ops) > 2 or gemm.row_scale(users[0]) is not None:
            out.append((k, f"kernel {users[0].name} is more than a contraction and its epilogue", None))
        else:
            out.append((k, users[0], parts))
    return out


def fold_row_scale(plan: Plan, pin: dict | None = None, hw: Profile | None = None) -> Plan:
    """`hw`: the profile plan_schedules will plan with (`--profile`; None: the target's own)."""
    if plan.precision not in ("fp16", "bf16"):
        return plan
    forced = switch(pin, PIN, "each norm a row pass of its own",
                    "the norm's row scale in the gemv that reads it wherever a gemv runs it")
    pairs = _pairs(plan)
    if not pairs:
        return plan
    declined = declined_for_unit(pin, "gemv", forced, RULE,
                                 [(norm.stores[0], f"row pass {norm.name}") for norm, _, _ in pairs])
    if declined:
        return plan.replace(rewrites=plan.rewrites + declined)
    from aicfc.planner.hardware import load_profile
    hw = hw or load_profile(plan.target)
    records = []
    for norm, reader, parts in pairs:
        if isinstance(reader, str):
            records.append(Rewrite(RULE, norm.stores[0], False, f"row pass {norm.name}: {reader}"))
            continue
        merged = _merged(norm, reader, parts)
        if isinstance(merged, str):
            records.append(Rewrite(RULE, norm.stores[0], False, f"kernel {reader.name}: {merged}"))
            continue
        new = plan.replace(kernels=tuple(merged if k.name == reader.name else k for k in plan.kernels
                                         if k.name != norm.name))
        if not gemm.space(merged, new):
            records.append(Rewrite(RULE, norm.stores[0], False, f"kernel {reader.name}: no gemv schedule holds "
                                   "its rows for the statistic (rows, K or the operands' types)"))
            continue
        plan, record = decide(plan, new, norm, reader, merged, RULE, norm.stores[0], "scaling its sums", forced, PIN,
                              hw, ", one launch fewer")
        records.append(record)
    return plan.replace(rewrites=plan.rewrites + tuple(records))
