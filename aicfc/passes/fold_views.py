"""fold_views: Lowered IR → Lowered IR; a load through a reshape that only splits dimensions
reads the reshape's source directly, so the view no longer stands between a producer and its
consumers: form_kernels can absorb the producer's map as a GEMM epilogue or a row pass's
input, and merge_contractions can turn the producer into a slice of a merged result (BERT's
q, k, v read by the attention through the head-split reshape).

Two rules, as data (`Rule(name, match, check, build)`, passes/rule.py):

- "view(view(x)) => view(x)": a reshape of a reshape is one reshape of the first source
  (both are row-major reinterpretations of the same elements).
- "load(view(x)) => load(x) with composed index": a View's shape may split each dimension of
  its source into several (and add or drop extent-1 dimensions). Row-major order makes the
  split exact: source index = Σ target index · (product of the later extents of its group),
  e.g. [B,S,H·D] viewed as [B,S,H,D] is read at [b, s, h·D + d] — an affine index, so the
  load reads the source directly. A reshape that merges dimensions (the [B,S,H,D] → [B,S,H·D]
  one after attention) would need the merged index split by div/mod, which an affine access
  cannot say: declined, with that reason.

After the loads are rewritten, a view nothing reads (no load, no other view, not a graph
output) disappears. The flat offset of every rewritten access is unchanged, so codegen reads
exactly the same addresses.

Preconditions: any verified Lowered IR. PIPELINE runs it after inline_producers (the
ordering note in pipeline.py says why) and before merge_contractions.

    %q: f32[2,8,16] = map add(load(%qm, [i0, i1, i2]), load(%bq, [i2]))
    %q4: f32[2,8,4,4] = view %q
    %s: f32[2,4,8,8] = sum[4] mul(load(%q4, [i0, i2, i1, r0]), load(%k4, [i0, i3, i1, r0]))
  becomes
    %q: f32[2,8,16] = map add(load(%qm, [i0, i1, i2]), load(%bq, [i2]))
    %s: f32[2,4,8,8] = sum[4] mul(load(%q, [i0, i2, 4*i1+r0]), load(%k4, [i0, i3, i1, r0]))
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from aicfc.ir.lowered import (Affine, Compute, Expr, Load, Op, Program, Rewrite, View, index_loads, indirect_dims,
                              loads, map_loads)
from aicfc.passes.rule import Rule

RULE = "load(view(x)) => load(x) with composed index"
CHAIN_RULE = "view(view(x)) => view(x)"


@dataclass(frozen=True)
class Context:
    program: Program
    ops: list[Op]                      # the program's ops as rewritten so far
    views: dict[str, View]


# ---------------------------------------------------------------- split geometry


def split_groups(source: tuple[int, ...], target: tuple[int, ...]) -> tuple[tuple[int, ...], ...] | str:
    """For each source dimension, the target dimensions (of extent > 1) it splits into, in
    order; or the reason the reshape is not a pure split. Extent-1 dimensions on either side
    are free: a source one is read at 0, a target one only ever holds 0."""
    groups: list[tuple[int, ...]] = []
    t = 0
    for j, n in enumerate(source):
        group: list[int] = []
        prod = 1
        while prod < n:
            while t < len(target) and target[t] == 1:
                t += 1
            if t == len(target):
                break
            group.append(t)
            prod *= target[t]
            t += 1
        if prod != n:
            dims = f"target dimension {group[-1]} ({target[group[-1]]})" if group else "a target dimension"
            return (f"reshape {list(source)} → {list(target)} merges dimensions: {dims} spans more than source "
                    f"dimension {j} ({n}), so reading it needs div/mod, not an affine index")
        groups.append(tuple(group))
    return tuple(groups)


def compose(index: tuple[Affine, ...], target: tuple[int, ...],
            groups: tuple[tuple[int, ...], ...]) -> tuple[Affine, ...]:
    """The source index of a load at `index` of the view: per source dimension,
    Σ index[t] · (product of the extents after t in its group)."""
    out = []
    for group in groups:
        coeffs: dict[str, int] = {}
        const = 0
        for pos, t in enumerate(group):
            stride = math.prod(target[u] for u in group[pos + 1:])
            const += index[t].const * stride
            for v, c in index[t].terms:
                coeffs[v] = coeffs.get(v, 0) + c * stride
        out.append(Affine.of(coeffs, const))
    return tuple(out)


# ---------------------------------------------------------------- rule: view of a view


def _match_chain(v: View, ctx: Context) -> tuple[View, View] | None:
    inner = ctx.views.get(v.source)
    return (v, inner) if inner is not None else None


def _build_chain(m: tuple[View, View], ctx: Context) -> tuple[list[Op], Rewrite]:
    v, inner = m
    new = View(v.out, v.type, inner.source, tuple(dict.fromkeys(v.origin + inner.origin)))
    return [new], Rewrite(CHAIN_RULE, v.out, True, f"reads {inner.source!r} directly instead of view {inner.out!r}")


VIEW_CHAIN = Rule(CHAIN_RULE, _match_chain, lambda m, ctx: None, _build_chain)


# ---------------------------------------------------------------- rule: load of a view


@dataclass(frozen=True)
class Fold:
    view: View
    readers: tuple[Compute, ...]
    groups: tuple[tuple[int, ...], ...] | str


def _match_fold(v: View, ctx: Context) -> Fold | None:
    readers = tuple(op for op in ctx.ops
                    if isinstance(op, Compute) and any(ld.buffer == v.out for ld in loads(op.body)))
    if not readers:
        return None
    types = {x.name: x.type for x in ctx.program.inputs} | {w.name: w.type for w in ctx.program.weights}
    source = types.get(v.source) or next(op.type for op in ctx.ops if op.out == v.source)
    return Fold(v, readers, split_groups(source.shape, v.type.shape))


def _check_fold(f: Fold, ctx: Context) -> str | None:
    if any(ld.buffer == f.view.out and indirect_dims(ld) for c in f.readers for ld in loads(c.body)):
        return "a load through an indirect (data-dependent) index has no affine index to compose"
    if any(ld.buffer == f.view.out for c in f.readers for ld in index_loads(c.body)):
        return "it is read as the ids of an indirect index, which stays a load of its own buffer"
    if any(ld.buffer == f.view.out and ld.fill is not None for c in f.readers for ld in loads(c.body)):
        return "a guarded (padded) load tests each dimension of the view; the composed index could not"
    return f.groups if isinstance(f.groups, str) else None


def _build_fold(f: Fold, ctx: Context) -> tuple[list[Op], Rewrite]:
    v, groups = f.view, f.groups
    assert not isinstance(groups, str)

    def direct(ld: Load) -> Expr:
        return Load(v.source, compose(ld.index, v.type.shape, groups)) if ld.buffer == v.out else ld
    new = [Compute(c.out, c.type, c.combiner, c.reduce, map_loads(c.body, direct), c.origin) for c in f.readers]
    n = sum(1 for c in f.readers for ld in loads(c.body) if ld.buffer == v.out)
    return new, Rewrite(RULE, v.out, True, f"{n} load(s) in {[c.out for c in f.readers]} read {v.source!r} "
                        "directly with a composed affine index")


FOLD = Rule(RULE, _match_fold, _check_fold, _build_fold)


# ---------------------------------------------------------------- the pass


def _replace(ops: list[Op], new: list[Op]) -> None:
    by_name = {op.out: op for op in new}
    ops[:] = [by_name.get(op.out, op) for op in ops]


def fold_views(p: Program) -> Program:
    ops: list[Op] = list(p.ops)
    records: list[Rewrite] = list(p.rewrites)
    position = {op.out: i for i, op in enumerate(ops)}
    # Chains first, in program order (each view then reads a non-view); then the loads, views
    # in reverse order, so a fold that creates a load of an earlier view is folded in its turn.
    for rule, order in ((VIEW_CHAIN, 1), (FOLD, -1)):
        found: list[Rewrite] = []
        for name in [op.out for op in ops if isinstance(op, View)][::order]:
            ctx = Context(p, ops, {op.out: op for op in ops if isinstance(op, View)})
            m = rule.match(ctx.views[name], ctx)
            if m is None:
                continue
            why = rule.check(m, ctx)
            if why is not None:
                found.append(Rewrite(rule.name, name, False, why))
                continue
            new, record = rule.build(m, ctx)
            _replace(ops, new)
            found.append(record)
        records += sorted(found, key=lambda r: position[r.target])     # recorded in program order
    return p.replace(ops=tuple(drop_unread_views(ops, p.outputs)), rewrites=tuple(records))


def drop_unread_views(ops: list[Op], outputs: tuple[str, ...]) -> list[Op]:
    """`ops` without the views nothing reads (no load, no other view, not a graph output);
    repeated, since dropping one may free its source view."""
    while True:
        used = set(outputs) | {op.source for op in ops if isinstance(op, View)}
        used |= {ld.buffer for op in ops if isinstance(op, Compute) for ld in loads(op.body)}
        dead = {op.out for op in ops if isinstance(op, View) and op.out not in used}
        if not dead:
            return ops
        ops = [op for op in ops if op.out not in dead]
