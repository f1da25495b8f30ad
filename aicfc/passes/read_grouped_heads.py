"""read_grouped_heads: Lowered IR → Lowered IR; grouped-query attention reads each key/value
head in place (rule GQA_RULE, property `weighted_streaming_reduction`).

transformers' repeat_kv copies each of Hkv key/value heads G = H/Hkv times (Expand of
[B,Hkv,1,S,D] to [B,Hkv,G,S,D], then a Reshape that merges Hkv and G into H) before the
attention. Query head h then reads copy h of K and V, which is head h // G: a broadcast read,
but h // G is not affine over h, so the copies were stored (two kernels per layer). Splitting
the attention's head variable into its two digits, h = G·hk + g, makes every access affine
again: the merged view is read at [.., hk, g, ..], and the copy (a map that ignores g: it is
one load, `rematerializable_intermediate`) is read through its own access, at K/V head hk.
The five computes of the attention (S, row max, row sum, P, O) get the split domain; so
does O's layout map (the Transpose to [B,S,H,D]) when it is O's only reader, and the old
name becomes a view of the split result, which holds the same elements in the same order
(row-major [.., Hkv, G, ..] is [.., H, ..]). The copies are removed when nothing else reads
them.

    %e: f32[1,2,2,16,8] = map load(%v, [0, i1, i3, i4])          (repeat_kv: ignores i2)
    %ev: f32[1,4,16,8] = view %e
    %o: f32[1,4,16,8] = sum[16] mul(load(%p, [0, i1, i2, r0]), load(%ev, [0, i1, r0, i3]))
  becomes
    %o.heads: f32[1,2,2,16,8] = sum[16] mul(load(%p.heads, [0, i1, i2, i3, r0]), load(%v, [0, i1, r0, i4]))
    %o: f32[1,4,16,8] = view %o.heads

Preconditions: the attention is matchable (`properties.streaming_attention`, so after
inline_producers); PIPELINE runs it last before form_kernels, when the copies read the QKV
result directly (fold_views, inline_again and fold_guarded_moves ran).
"""
from __future__ import annotations

from dataclasses import dataclass

from aicfc.ir.lowered import (Affine, Compute, Expr, Load, Op, Program, Rewrite, View, indirect_dims, loads,
                              map_loads, reader_names, substitute)
from aicfc.ir.properties import WSR, Attention, streaming_attention
from aicfc.ir.types import TensorType
from aicfc.passes.fold_views import drop_unread_views
from aicfc.passes.rule import Rule
from aicfc.passes.streaming_attention import GQA_RULE, STREAMING_ATTENTION
from aicfc.passes.streaming_attention import Context as AttentionContext

SUFFIX = ".heads"


class _Decline(Exception):
    pass


@dataclass(frozen=True)
class Copy:
    """A head broadcast read by the attention: `view` merges `source`'s dimensions dim, dim+1
    (Hkv, G); `source` is a map of one load that ignores its variable i{dim+1}."""

    view: View
    source: Compute
    dim: int

    @property
    def group(self) -> int:
        return self.source.type.shape[self.dim + 1]


@dataclass(frozen=True)
class Grouped:
    att: Attention
    head: str                       # O's head variable h
    group: int                      # G
    copies: tuple[Copy, ...]
    layout: Compute | None          # O's only reader when it is a pure transpose of O


def _copy(ld: Load, views: dict[str, View], producers: dict[str, Compute]) -> tuple[str, Copy] | None:
    """(O's head variable, the broadcast) when `ld` reads a merged view of a head broadcast."""
    view = views.get(ld.buffer)
    src = producers.get(view.source) if view is not None else None
    if src is None or src.combiner != "map" or not isinstance(src.body, Load) or indirect_dims(src.body) \
            or src.body.fill is not None or indirect_dims(ld) or ld.fill is not None:
        return None
    shape = src.type.shape
    used = {v for a in src.body.index for v, _ in a.terms}
    for d in range(len(shape) - 1):
        merged = shape[:d] + (shape[d] * shape[d + 1],) + shape[d + 2:]
        a = ld.index[d] if d < len(ld.index) else None
        if (merged == view.type.shape and shape[d + 1] > 1 and f"i{d + 1}" not in used and a is not None
                and len(a.terms) == 1 and a.terms[0][1] == 1 and not a.const):
            return a.terms[0][0], Copy(view, src, d)
    return None


def _layout_map(o: Compute, program: Program, readers: dict[str, list[str]], producers: dict[str, Compute]) -> Compute | None:
    """O's only reader when it is a map that only permutes O's dimensions."""
    rd = readers.get(o.out, [])
    if len(rd) != 1 or rd[0] not in producers or o.out in program.outputs:
        return None
    c = producers[rd[0]]
    ld = c.body
    if c.combiner != "map" or not isinstance(ld, Load) or ld.buffer != o.out or indirect_dims(ld) or ld.fill is not None:
        return None
    if any(len(a.terms) != 1 or a.const or a.terms[0][1] != 1 for a in ld.index):
        return None
    return c if sorted(a.terms[0][0] for a in ld.index) == sorted(c.domain_vars) else None


def _match(op: Compute, ctx: AttentionContext) -> Grouped | None:
    if op.combiner != "sum":
        return None
    att = streaming_attention(op, ctx.producers)
    if not isinstance(att, Attention):
        return None
    views = {o.out: o for o in ctx.program.ops if isinstance(o, View)}
    found = [c for c in (_copy(att.k, views, ctx.producers), _copy(att.v, views, ctx.producers)) if c]
    if not found or len({h for h, _ in found}) != 1 or len({c.group for _, c in found}) != 1:
        return None
    head = found[0][0]
    if head not in att.batch:
        return None
    return Grouped(att, head, found[0][1].group, tuple(c for _, c in found),
                   _layout_map(att.out, ctx.program, ctx.readers, ctx.producers))


def _check(g: Grouped, ctx: AttentionContext) -> str | None:
    why = STREAMING_ATTENTION.check(g.att, ctx)
    if why is not None:
        return f"not a streaming attention: {why}"
    if g.layout is not None and g.layout.out in ctx.program.outputs:
        return "the attention's layout map is a graph output"
    return None


def split_compute(c: Compute, k: int, group: int, split: dict[str, int], inline: dict[str, Copy],
                  rename: dict[str, str]) -> Compute:
    """`c` over a domain whose dimension k (variable h) is split into (h // group, h % group):
    h becomes group·i{k} + i{k+1}, later variables shift by one. A load of a buffer in
    `split` (its own split dimension) or `inline` (a merged view of a broadcast, read through
    the broadcast's access) must read that dimension at h; it reads the two digits instead."""
    n = len(c.type.shape)
    h = f"i{k}"
    sub = {f"i{j}": Affine.var(f"i{j + 1}") for j in range(k + 1, n)}
    sub[h] = Affine.of({h: group, f"i{k + 1}": 1})

    def fix(ld: Load) -> Expr:
        if ld.buffer in split or ld.buffer in inline:
            kb = split[ld.buffer] if ld.buffer in split else inline[ld.buffer].dim
            if ld.index[kb] != Affine.var(h) or ld.fill is not None or indirect_dims(ld):
                raise _Decline(f"{c.out!r} reads {ld.buffer!r} at another head index than its own")
            index = (tuple(a.substitute(sub) for a in ld.index[:kb]) + (Affine.var(h), Affine.var(f"i{k + 1}"))
                     + tuple(a.substitute(sub) for a in ld.index[kb + 1:]))   # type: ignore[union-attr]
            if ld.buffer in inline:
                src = inline[ld.buffer].source
                return substitute(src.body, dict(zip(src.domain_vars, index)))
            return Load(rename[ld.buffer], index)
        return substitute(ld, sub)

    shape = c.type.shape[:k] + (c.type.shape[k] // group, group) + c.type.shape[k + 1:]
    return Compute(rename[c.out], TensorType(c.type.dtype, shape), c.combiner, c.reduce, map_loads(c.body, fix), c.origin)


def _build(g: Grouped, ctx: AttentionContext) -> tuple[list[Op], dict[str, str], Rewrite]:
    """The split computes (and views keeping the old names of O or its layout map), the old
    names replaced, and the record."""
    att, group = g.att, g.group
    to_out = dict(att.to_out)
    p_dim = next(int(v[1:]) for v, a in to_out.items() if a == Affine.var(g.head))
    o_dim = att.out.domain_vars.index(g.head)
    inner = (att.scores, att.row_max, att.row_sum, att.probs)
    rename = {c.out: c.out + SUFFIX for c in inner + (att.out,)}
    split = {c.out: p_dim for c in inner}
    inline = {c.view.out: c for c in g.copies}
    new: list[Op] = [split_compute(c, p_dim, group, split, inline, rename) for c in inner]
    new.append(split_compute(att.out, o_dim, group, split, inline, rename))
    last = att.out
    if g.layout is not None:
        m = g.layout.body.index[o_dim].terms[0][0]   # type: ignore[union-attr]
        rename[g.layout.out] = g.layout.out + SUFFIX
        new.append(split_compute(g.layout, int(m[1:]), group, {att.out.out: o_dim}, {}, rename))
        last = g.layout
    new.append(View(last.out, last.type, rename[last.out], last.origin))
    hkv = att.out.type.shape[o_dim] // group
    copies = [c.source.out for c in g.copies]
    saved = sum(2 * c.source.type.nbytes for c in g.copies)
    reason = (f"{WSR}: query head h reads key/value head h // {group} ({hkv} key/value heads, {group} query heads "
              f"each): the head variable is split into (h // {group}, h % {group}), so the broadcast copies "
              f"{copies} (one load each, rematerializable_intermediate) become the attention's own affine "
              "accesses and are never stored")
    return new, rename, Rewrite(GQA_RULE, rename[att.out.out], True, reason, saved)


READ_GROUPED_HEADS = Rule(GQA_RULE, _match, _check, _build)


def _context(ops: list[Op], p: Program) -> AttentionContext:
    producers = {op.out: op for op in ops if isinstance(op, Compute)}
    readers = reader_names(ops)
    return AttentionContext(p.replace(ops=tuple(ops)), producers, readers)


def read_grouped_heads(p: Program) -> Program:
    ops: list[Op] = list(p.ops)
    records = list(p.rewrites)
    rule = READ_GROUPED_HEADS
    ctx = _context(ops, p)   # rebuilt only when a rewrite changes the ops
    for name in [op.out for op in p.ops if isinstance(op, Compute)]:
        op = ctx.producers.get(name)
        m = rule.match(op, ctx) if op is not None else None
        if m is None:
            continue
        why = rule.check(m, ctx)
        if why is None:
            try:
                new, rename, record = rule.build(m, ctx)
            except _Decline as e:
                why = str(e)
        if why is not None:
            records.append(Rewrite(rule.name, name, False, why))
            continue
        by_name = {o.out: o for o in new if isinstance(o, Compute)}
        views = [o for o in new if isinstance(o, View)]
        views_of = {v.out: v.source for v in views}
        out: list[Op] = []
        for o in ops:
            if o.out in rename:
                out.append(by_name[rename[o.out]])
                out += [v for v in views if v.out == o.out]
            elif isinstance(o, View) and o.source in views_of:
                out.append(View(o.out, o.type, views_of[o.source], o.origin))   # a view of the view: of its source
            else:
                out.append(o)
        ops = _drop_unread(out, p.outputs)
        ctx = _context(ops, p)
        records.append(record)
    return p.replace(ops=tuple(ops), rewrites=tuple(records))


def _drop_unread(ops: list[Op], outputs: tuple[str, ...]) -> list[Op]:
    """Without the broadcast copies and views nothing reads any more."""
    while True:
        ops = drop_unread_views(ops, outputs)
        used = set(outputs) | {o.source for o in ops if isinstance(o, View)}
        used |= {ld.buffer for o in ops if isinstance(o, Compute) for ld in loads(o.body)}
        dead = {o.out for o in ops if isinstance(o, Compute) and o.out not in used}
        if not dead:
            return ops
        ops = [o for o in ops if o.out not in dead]
