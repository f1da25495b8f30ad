"""merge_contractions: Lowered IR → Lowered IR; contractions that read one operand at one
access and multiply it by constant weights become ONE contraction over the weights
concatenated along N at compile time (property `tile_compatible_compute` on both sides).

Rule "sibling contractions on one operand => one contraction":

    x·W₁ | x·W₂ | … | x·Wₙ = x·[W₁ W₂ … Wₙ]       (block columns of one product)

so q = x·Wq, k = x·Wk, v = x·Wv are the column slices [0,N), [N,2N), [2N,3N) of x·Wqkv. Each
original result becomes a slice of the merged one: every load of it reads the merged buffer
at the same index with the slice's offset added along N (an affine access, which tiled and
streaming kernels read like any other). Element-wise epilogues merge too: when every sibling's
single consumer is the same map over its accumulator and constant weights read along N (a
bias), it becomes one map over the merged accumulator with those weights concatenated the
same way, so `form_kernels` still absorbs it as the merged GEMM's epilogue.

Legality (`match`/`check`): the siblings are `tile_compatible_compute` contractions reading
the same operand at the same access, with the other operand a constant weight read at plain
variables whose N axis is read whole; the same K, output dtype, weight dtype and weight
access; outputs equal but for N; epilogues of the same form reading only their accumulator
and constants. A sibling cannot depend on another: each reads only the shared operand
(defined before all of them) and constants, so the merged computes take the first sibling's
place. A result that is a graph output or is read through a view keeps its own layout, which a
slice of the merged buffer is not: declined. Cost: one launch instead of n and the shared
operand read once instead of n times (`bytes_saved`); declined when a slice would start off a
16-byte boundary (its readers would lose vector and tensor-core loads) or when the merged
weight would exceed MAX_WEIGHT_BYTES.

Preconditions: after `fold_views` (a view still standing is one that cannot be folded, so a
result read through it keeps its own layout) and before `form_kernels` (which absorbs the
merged epilogue). After `inline_producers`, an epilogue map still standing is one it kept
stored; one it recomputed inside its readers merges as plain slices read with their bias.

    %q: f32[4,16] = sum[8] mul(load(%x, [i0, r0]), load(%wq, [r0, i1]))
    %ql: f32[4,16] = map add(load(%q, [i0, i1]), load(%bq, [i1]))
    %k: f32[4,16] = sum[8] mul(load(%x, [i0, r0]), load(%wk, [r0, i1]))
    %kl: f32[4,16] = map add(load(%k, [i0, i1]), load(%bk, [i1]))
    %s: f32[4,4] = sum[16] mul(load(%ql, [i0, r0]), load(%kl, [i1, r0]))
  becomes
    %q.k: f32[4,32] = sum[8] mul(load(%x, [i0, r0]), load(%wq.wk.cat, [r0, i1]))
    %ql.kl: f32[4,32] = map add(load(%q.k, [i0, i1]), load(%bq.bk.cat, [i1]))
    %s: f32[4,4] = sum[16] mul(load(%ql.kl, [i0, r0]), load(%ql.kl, [i1, r0+16]))
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from aicfc.ir.lowered import (Affine, Compute, Expr, Load, Op, Program, Rewrite, View, has_indirect,
                              indirect_dims, loads, map_loads)
from aicfc.ir.properties import contraction
from aicfc.ir.types import Joined, TensorType, Weight, convert
from aicfc.passes.rule import Rule

RULE = "sibling contractions on one operand => one contraction"
ALIGN = 8                      # elements: 16 bytes at fp16/bf16, where vector and tensor-core loads need it
MAX_WEIGHT_BYTES = 1 << 30     # one merged weight is one buffer; past this, keep them apart
ACC = "$acc"                   # placeholders of an epilogue's form
W = "$w"


@dataclass(frozen=True)
class Context:
    program: Program
    producers: dict[str, Compute]
    views: dict[str, list[str]]        # buffer -> views of it
    weights: dict[str, Weight]


@dataclass(frozen=True)
class Sibling:
    """One contraction of a group, with its roles."""

    mm: Compute
    b: Load                     # the weight operand
    n_dim: int                  # output dimension of the weight's own variable (N)
    axis: int                   # weight dimension N runs along
    epilogue: Compute | None
    form: Expr | None           # the epilogue over ACC and W<j> (None: no epilogue)
    epi_weights: tuple[tuple[Weight, int], ...]   # W<j>: the weight and the axis N runs along

    @property
    def result(self) -> Compute:
        """What readers read: the epilogue's result, else the contraction's."""
        return self.epilogue or self.mm

    @property
    def n(self) -> int:
        return self.mm.type.shape[self.n_dim]


@dataclass(frozen=True)
class Candidates:
    """Contractions reading one operand at one access: compatible classes (in program order)
    and the ones refused on their own, with the reason."""

    a: Load
    groups: tuple[tuple[tuple[Sibling, ...], str], ...]    # (class, why its members are apart from the others)
    refused: tuple[tuple[str, str], ...]


# ---------------------------------------------------------------- match


def _plain(ix: Affine) -> str | None:
    return ix.terms[0][0] if len(ix.terms) == 1 and ix.terms[0][1] == 1 and not ix.const else None


def _own_element(ld: Load, shape: tuple[int, ...]) -> bool:
    """ld reads element [i0, i1, ...] (index 0 where the extent is 1, as `lower` writes it)."""
    return len(ld.index) == len(shape) and all(
        a == Affine.var(f"i{d}") or (a == Affine() and n == 1) for d, (a, n) in enumerate(zip(ld.index, shape)))


def _weight_axis(ld: Load, w: Weight, var: str, extent: int) -> int | str:
    """The dimension of weight `w` that `var` indexes, when `ld` reads every dimension at a
    plain variable (or 0 where the extent is 1) and reads the whole of that dimension."""
    for ix, n in zip(ld.index, w.type.shape):
        if _plain(ix) is None and not (ix == Affine() and n == 1):
            return f"weight {w.name!r} is not read at plain variables"
    axes = [d for d, ix in enumerate(ld.index) if _plain(ix) == var]
    if len(axes) != 1 or w.type.shape[axes[0]] != extent:
        return f"weight {w.name!r} is not read whole along the output variable {var}"
    return axes[0]


def _epilogue(mm: Compute, n_var: str, ctx: Context,
              siblings: set[str]) -> tuple[Compute | None, Expr | None, tuple] | str:
    """The element-wise consumer form_kernels would absorb (its form over ACC and W<j>), no
    epilogue, or why the result cannot be a slice. A consumer that also reads another sibling
    is nobody's epilogue: it reads two slices of the merged result either way."""
    p = ctx.program
    if mm.out in p.outputs:
        return "its result is a graph output, stored in its own layout; a slice of the merged result is not"
    readers = [op for op in ctx.producers.values() if any(ld.buffer == mm.out for ld in loads(op.body))]
    if ctx.views.get(mm.out):
        return f"its result is read through view {ctx.views[mm.out][0]!r}, which keeps its own layout"
    if any(indirect_dims(ld) for op in readers for ld in loads(op.body) if ld.buffer == mm.out):
        return "its result is read through an indirect (data-dependent) index, which a slice offset cannot shift"
    if len(readers) != 1:
        return None, None, ()
    (c,) = readers
    if has_indirect(c.body):
        return None, None, ()    # [Note: Indirect index]: not absorbed; it reads the slice as any reader
    if (c.combiner != "map" or c.type.shape != mm.type.shape
            or not all(_own_element(ld, mm.type.shape) for ld in loads(c.body) if ld.buffer == mm.out)
            or any(ld.buffer in siblings - {mm.out} for ld in loads(c.body))):
        return None, None, ()
    if c.out in p.outputs:
        return (f"its epilogue {c.out!r} is a graph output, stored in its own layout; "
                "a slice of the merged result is not")
    if ctx.views.get(c.out):
        return f"its epilogue {c.out!r} is read through view {ctx.views[c.out][0]!r}, which keeps its own layout"
    n = mm.type.shape[int(n_var[1:])]
    slots: dict[Load, Load] = {}
    epi_weights: list[tuple[Weight, int]] = []
    why: list[str] = []

    def normalize(ld: Load) -> Expr:
        if ld.buffer == mm.out:
            return Load(ACC, ld.index)
        w = ctx.weights.get(ld.buffer)
        if w is None:
            why.append(f"its epilogue {c.out!r} reads {ld.buffer!r}, which is not a constant")
            return ld
        if not any(v == n_var for ix in ld.index for v, _ in ix.terms):
            return ld                       # the same constant for every column: stays as it is
        axis = _weight_axis(ld, w, n_var, n)
        if isinstance(axis, str):
            why.append(f"its epilogue {c.out!r}: {axis}")
            return ld
        if ld not in slots:
            slots[ld] = Load(f"{W}{len(slots)}", ld.index)
            epi_weights.append((w, axis))
        return slots[ld]
    form = map_loads(c.body, normalize)
    if why:
        return why[0] + "; merged, it would lose its GEMM epilogue"
    return c, form, tuple(epi_weights)


def _sibling(mm: Compute, a: Load, ctx: Context, siblings: set[str]) -> Sibling | str:
    c = contraction(mm)
    assert c is not None
    b, n_var = (c.b, c.n) if c.a == a else (c.a, c.m)
    w = ctx.weights.get(b.buffer)
    if w is None:
        return f"its other operand {b.buffer!r} is not a constant weight"
    if n_var is None or mm.type.shape[int(n_var[1:])] == 1:
        return f"no output variable of its own (N > 1) indexes the weight {b.buffer!r}: nothing to concatenate along"
    axis = _weight_axis(b, w, n_var, mm.type.shape[int(n_var[1:])])
    if isinstance(axis, str):
        return axis
    epi = _epilogue(mm, n_var, ctx, siblings)
    if isinstance(epi, str):
        return epi
    return Sibling(mm, b, int(n_var[1:]), axis, *epi)


def _apart(s: Sibling, ref: Sibling, ctx: Context) -> str | None:
    """Why `s` cannot join `ref`'s group, or None."""
    wt = lambda x: ctx.weights[x.b.buffer].type  # noqa: E731
    if s.mm.reduce != ref.mm.reduce:
        return f"{s.mm.out!r} sums over K={s.mm.reduce[0]}, {ref.mm.out!r} over K={ref.mm.reduce[0]}"
    if s.mm.type.dtype != ref.mm.type.dtype or wt(s).dtype != wt(ref).dtype:
        return f"{s.mm.out!r} and {ref.mm.out!r} differ in dtype"
    if s.b.index != ref.b.index or s.axis != ref.axis or s.n_dim != ref.n_dim:
        return f"{s.mm.out!r} and {ref.mm.out!r} read their weights differently ({list(map(str, s.b.index))} " \
               f"vs {list(map(str, ref.b.index))})"
    if (_without(s.mm.type.shape, s.n_dim) != _without(ref.mm.type.shape, ref.n_dim)
            or _without(wt(s).shape, s.axis) != _without(wt(ref).shape, ref.axis)):
        return f"{s.mm.out!r} and {ref.mm.out!r} differ in shape other than along N"
    if s.form != ref.form or (s.epilogue and ref.epilogue and s.epilogue.type.dtype != ref.epilogue.type.dtype):
        return f"the epilogues of {s.mm.out!r} and {ref.mm.out!r} differ"
    for (w1, ax1), (w2, ax2) in zip(s.epi_weights, ref.epi_weights):
        if ax1 != ax2 or w1.type.dtype != w2.type.dtype or _without(w1.type.shape, ax1) != _without(w2.type.shape, ax2):
            return f"the epilogue constants of {s.mm.out!r} and {ref.mm.out!r} differ in shape or dtype"
    return None


def _without(shape: tuple[int, ...], d: int) -> tuple[int, ...]:
    return shape[:d] + shape[d + 1:]


def _match(a: Load, ctx: Context) -> Candidates | None:
    mms = [op for op in ctx.program.ops if isinstance(op, Compute) and contraction(op) is not None
           and a in op.body.args]  # type: ignore[union-attr]
    if len(mms) < 2:
        return None
    refused: list[tuple[str, str]] = []
    groups: list[tuple[list[Sibling], str]] = []
    for mm in mms:
        s = _sibling(mm, a, ctx, {m.out for m in mms})
        if isinstance(s, str):
            refused.append((mm.out, s))
            continue
        for members, why in groups:
            if _apart(s, members[0], ctx) is None:
                members.append(s)
                break
        else:
            first = _apart(s, groups[0][0][0], ctx) if groups else None
            groups.append(([s], first or ""))
    # A class's reason: why its first member is apart from the first class (or the first
    # class's from the second).
    out = []
    for i, (members, why) in enumerate(groups):
        if i == 0 and len(groups) > 1:
            why = groups[1][1]
        if not why:
            why = f"no other contraction reading {a.buffer!r} qualifies"
        out.append((tuple(members), why))
    return Candidates(a, tuple(out), tuple(refused))


# ---------------------------------------------------------------- check


def _check(group: tuple[tuple[Sibling, ...], str], ctx: Context) -> str | None:
    members, apart = group
    if len(members) < 2:
        return apart
    total = sum(ctx.weights[s.b.buffer].type.nbytes for s in members)
    if total > MAX_WEIGHT_BYTES:
        return f"the merged weight would take {total} bytes, over the {MAX_WEIGHT_BYTES}-byte limit for one buffer"
    # Slice k starts at (n_1 + … + n_{k-1})·stride elements into each merged row.
    stride = math.prod(members[0].mm.type.shape[members[0].n_dim + 1:])
    if any(s.n * stride % ALIGN for s in members):
        return (f"N extents {[s.n for s in members]} are not multiples of {ALIGN} elements: the slices would start "
                "off 16-byte boundaries, and their readers would lose vector and tensor-core loads")
    return None


# ---------------------------------------------------------------- build


def _shared(s: Sibling) -> Load:
    first, second = s.mm.body.args  # type: ignore[union-attr]
    return second if first == s.b else first


def _fresh(name: str, taken: set[str]) -> str:
    out, k = name, 1
    while out in taken:
        out, k = f"{name}.{k}", k + 1
    return out


def _concat(ws: list[Weight], axis: int, taken: set[str]) -> Weight:
    name = _fresh(".".join(w.name for w in ws) + ".cat", taken)
    taken.add(name)
    t = ws[0].type
    if any(w.lazy for w in ws):
        # A big model's weights stay in its files: the join is computed when it is read.
        axis %= len(t.shape)
        shape = t.shape[:axis] + (sum(w.type.shape[axis] for w in ws),) + t.shape[axis + 1:]
        return Weight(name, TensorType(t.dtype, shape), Joined(tuple(ws), axis))
    data = np.concatenate([w.array() for w in ws], axis=axis)
    return Weight(name, TensorType(t.dtype, tuple(int(d) for d in data.shape)), convert(data, t.dtype))


def _shift(ix: tuple[Affine, ...], dim: int, offset: int) -> tuple[Affine, ...]:
    return ix[:dim] + (Affine(ix[dim].terms, ix[dim].const + offset),) + ix[dim + 1:]


def _build(members: tuple[Sibling, ...], ctx: Context) -> tuple[Program, Rewrite]:
    p = ctx.program
    ref = members[0]
    taken = set(p.types())
    total_n = sum(s.n for s in members)
    shape = ref.mm.type.shape[:ref.n_dim] + (total_n,) + ref.mm.type.shape[ref.n_dim + 1:]
    wcat = _concat([ctx.weights[s.b.buffer] for s in members], ref.axis, taken)
    mm_name = _fresh(".".join(s.mm.out for s in members), taken)
    taken.add(mm_name)
    body = map_loads(ref.mm.body, lambda ld: Load(wcat.name, ld.index) if ld == ref.b else ld)
    origin = lambda ops: tuple(dict.fromkeys(o for op in ops for o in op.origin))  # noqa: E731
    merged: list[Compute] = [Compute(mm_name, TensorType(ref.mm.type.dtype, shape), "sum", ref.mm.reduce, body,
                                     origin(s.mm for s in members))]
    new_weights = [wcat]
    if ref.epilogue is not None:
        cats = [_concat([s.epi_weights[j][0] for s in members], ref.epi_weights[j][1], taken)
                for j in range(len(ref.epi_weights))]
        new_weights += cats

        def fill(ld: Load) -> Expr:
            if ld.buffer == ACC:
                return Load(mm_name, ld.index)
            if ld.buffer.startswith(W):
                return Load(cats[int(ld.buffer[len(W):])].name, ld.index)
            return ld
        epi_name = _fresh(".".join(s.epilogue.out for s in members if s.epilogue), taken)
        merged.append(Compute(epi_name, TensorType(ref.epilogue.type.dtype, shape), "map", (),
                              map_loads(ref.form, fill), origin(s.epilogue for s in members if s.epilogue)))
    result = merged[-1].out
    offsets, at = {}, 0
    for s in members:
        offsets[s.result.out] = at
        at += s.n

    def to_slice(ld: Load) -> Expr:
        off = offsets.get(ld.buffer)
        return ld if off is None else Load(result, _shift(ld.index, ref.n_dim, off))
    gone = {s.mm.out for s in members} | {s.epilogue.out for s in members if s.epilogue}
    ops: list[Op] = []
    for op in p.ops:
        if op.out == ref.mm.out:
            ops += merged
        if op.out in gone:
            continue
        if isinstance(op, Compute):
            op = Compute(op.out, op.type, op.combiner, op.reduce, map_loads(op.body, to_slice), op.origin)
        ops.append(op)
    read = {ld.buffer for op in ops if isinstance(op, Compute) for ld in loads(op.body)}
    old = {s.b.buffer for s in members} | {w.name for s in members for w, _ in s.epi_weights}
    weights = tuple(w for w in p.weights if w.name not in old or w.name in read) + tuple(new_weights)
    a_bytes = p.types()[_shared(ref).buffer].nbytes
    n = len(members)
    epi = (f"; their epilogues as one map {merged[-1].out!r} over {[w.name for w in new_weights[1:]]}"
           if ref.epilogue is not None else "")
    record = Rewrite(RULE, mm_name, True,
                     f"{n} contractions {[s.mm.out for s in members]} over one weight {wcat.name!r} "
                     f"(N = {total_n}): one launch instead of {n}, the shared operand read once instead of "
                     f"{n} times{epi}; each result is a slice at offsets {list(offsets.values())} along N",
                     (n - 1) * a_bytes)
    return p.replace(ops=tuple(ops), weights=weights), record


MERGE = Rule(RULE, _match, _check, _build)


# ---------------------------------------------------------------- the pass


def _context(p: Program) -> Context:
    views: dict[str, list[str]] = {}
    for op in p.ops:
        if isinstance(op, View):
            views.setdefault(op.source, []).append(op.out)
    return Context(p, {op.out: op for op in p.ops if isinstance(op, Compute)}, views,
                   {w.name: w for w in p.weights})


def merge_contractions(p: Program) -> Program:
    records: list[Rewrite] = list(p.rewrites)
    keys: list[Load] = []
    for op in p.ops:
        if isinstance(op, Compute) and contraction(op) is not None:
            names = {w.name for w in p.weights}
            keys += [ld for ld in op.body.args if ld.buffer not in names and ld not in keys]  # type: ignore[union-attr]
    for a in keys:
        ctx = _context(p)
        m = MERGE.match(a, ctx)
        if m is None:
            continue
        records += [Rewrite(RULE, name, False, why) for name, why in m.refused]
        for group in m.groups:
            ctx = _context(p)
            why = MERGE.check(group, ctx)
            if why is not None:
                records += [Rewrite(RULE, s.mm.out, False, why) for s in group[0]]
                continue
            p, record = MERGE.build(group[0], ctx)
            records.append(record)
    return p.replace(rewrites=tuple(records))
