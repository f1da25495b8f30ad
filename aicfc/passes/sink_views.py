"""sink_views: Lowered IR → Lowered IR; an element-wise map that reads a reshape which only
splits dimensions runs over the reshape's source shape instead, and its result is viewed back
under its own name, so nothing that reads it changes. The view then stands after the maps
instead of between a producer and them: inline_producers can recompute the producer (a GEMM's
bias) inside the maps, and form_kernels absorbs them as the GEMM's epilogue.

One rule, as data (`Rule(name, match, check, build)`, passes/rule.py):

- "map(view(x)) => view(map(x))": a map reading views V of sources S (each V a pure split of
  its S: `split_groups`, all the S of one shape) at V's own index is the same map over S's
  shape, reading each S at its own index, viewed as V's shape: a row-major split is a
  bijection of indices that the element-wise map commutes with. Every other index the map
  uses must survive the change of domain: it may use only the variables that map one-to-one
  onto a dimension of S (alone in their split group; a bias read at [i2]) and the extent-1
  ones (always 0). A tensor of V's shape read at the map's own index (a residual) is read
  through a merge view of it to S's shape at the new own index: the same row-major bytes. A
  merged variable (i0, i1 of [2,8,·] from [16,·]) has no variable of its own over S; reading
  it any other way, through an indirect or a guarded load, or from a source that is not a pure
  split, is declined with the reason.

Maps rebuilt this way are views themselves for the maps reading them, so a chain of maps
(tanh-GELU's eight) moves as a whole. A map is rebuilt only when every compute reading it is a
map rebuilt with it that reads it at its own index (it then reads the rebuilt map directly) or
a contraction, tile-compatible or an implicit GEMM (whose operands inline_producers keeps
plain loads: it reads them stored anyway), or reads it only through guarded
loads (a padded convolution, into which inline_producers recomputes nothing): any other reader
would read it through the view back, and inline_producers recomputes no producer read through a
view.
Whether a map is rebuilt thus depends on its readers and theirs on it: the maps rebuilt are
the largest set in which every member passes the check (found by dropping failures until none
fails). Views that nothing reads any more are dropped.

Preconditions: any verified Lowered IR. PIPELINE runs it after lower and before
inline_producers (the ordering note in pipeline.py says why).

    %b: f32[16,128] = map add(load(%mm, [i0, i1]), load(%bias, [i1]))
    %v: f32[2,8,128] = view %b
    %g: f32[2,8,128] = map tanh(load(%v, [i0, i1, i2]))
    %u: f32[16,128] = view %g
  becomes
    %b: f32[16,128] = map add(load(%mm, [i0, i1]), load(%bias, [i1]))
    %g.merged: f32[16,128] = map tanh(load(%b, [i0, i1]))
    %g: f32[2,8,128] = view %g.merged
    %u: f32[16,128] = view %g
"""
from __future__ import annotations

from dataclasses import dataclass

from aicfc.ir.lowered import (Affine, Compute, Expr, Load, Op, Program, Rewrite, View, identity_index,
                              indirect_dims, loads, map_loads, reindex)
from aicfc.ir.properties import implicit_gemm, is_identity_access, why_not_tile_compatible
from aicfc.ir.types import TensorType
from aicfc.passes.fold_views import drop_unread_views, split_groups
from aicfc.passes.rule import Rule

RULE = "map(view(x)) => view(map(x))"


@dataclass(frozen=True)
class Context:
    program: Program
    types: dict[str, TensorType]       # every buffer of the program as it is now
    views: dict[str, View]
    readers: dict[str, list[Op]]       # buffer -> the ops that read it (computes and views)
    # Maps rebuilt (or still assumed to be) -> their new shape, None until they are checked.
    sinking: dict[str, tuple[int, ...] | None]
    rebuilt: dict[str, str]            # maps rebuilt so far -> the name of the rebuilt compute


@dataclass(frozen=True)
class Sink:
    op: Compute
    viewed: tuple[str, ...]            # the views (or rebuilt maps) it reads at its own index, in order


def _viewed(buffer: str, ctx: Context) -> bool:
    return buffer in ctx.views or ctx.sinking.get(buffer) is not None


def _source(buffer: str, ctx: Context) -> tuple[str, tuple[int, ...]]:
    """The buffer a viewed buffer reinterprets, and that buffer's shape."""
    if buffer in ctx.views:
        src = ctx.views[buffer].source
        return src, ctx.types[src].shape
    shape = ctx.sinking[buffer]
    assert shape is not None
    return ctx.rebuilt.get(buffer, buffer), shape


def _own_index(ld: Load, op: Compute, ctx: Context) -> bool:
    return ctx.types[ld.buffer].shape == op.type.shape and is_identity_access(ld, op.type.shape)


def _match(op: Compute, ctx: Context) -> Sink | None:
    """A map reading some view at its own index (a map reading views only elsewhere, a head
    transpose or a Split's slice, is no instance of the pattern)."""
    if op.combiner != "map":
        return None
    viewed = tuple(dict.fromkeys(ld.buffer for ld in loads(op.body)
                                 if _viewed(ld.buffer, ctx) and _own_index(ld, op, ctx)))
    return Sink(op, viewed) if viewed else None


def _groups(m: Sink, ctx: Context) -> tuple[tuple[int, ...], tuple[tuple[int, ...], ...]] | str:
    """The new shape and its split groups, from the views read at their own index; or why not."""
    shapes = {b: _source(b, ctx)[1] for b in m.viewed}
    if len(set(shapes.values())) > 1:
        (a, sa), (b, sb) = list(shapes.items())[:2]
        return f"the views it reads split sources of different shapes ({a!r} of {list(sa)}, {b!r} of {list(sb)})"
    shape = shapes[m.viewed[0]]
    groups = split_groups(shape, m.op.type.shape)
    return groups if isinstance(groups, str) else (shape, groups)


def _check(m: Sink, ctx: Context) -> str | None:
    op = m.op
    for ld in loads(op.body):
        if indirect_dims(ld):
            return f"it reads {ld.buffer!r} through an indirect (data-dependent) index"
        if ld.fill is not None:
            return f"it reads {ld.buffer!r} through a guarded load, whose guard tests the dimensions of its domain"
    found = _groups(m, ctx)
    if isinstance(found, str):
        return found
    shape, groups = found
    merged = {f"i{t}" for g in groups if len(g) > 1 for t in g}
    for ld in loads(op.body):
        if _viewed(ld.buffer, ctx) and _own_index(ld, op, ctx) and _source(ld.buffer, ctx)[1] == shape:
            continue
        if _own_index(ld, op, ctx):   # any other tensor of the map's shape: read through its merge view
            continue
        used = sorted({v for a in ld.index for v, _ in a.terms} & merged)
        if used:
            return (f"it reads {ld.buffer!r} at [{', '.join(map(str, ld.index))}], which uses merged "
                    f"variable(s) {used}: over {list(shape)} they have no variable of their own")
    readers = ctx.readers.get(op.out, [])

    def stores_it(c: Op) -> bool:
        """A reader for which the map is stored whatever this rule does: a view (inline_producers recomputes
        no producer read through one), a contraction (its operands stay plain loads), or a reader whose every
        load of it is guarded (a padded convolution's: inline_producers declines guarded reads)."""
        if not isinstance(c, Compute):
            return True
        reads = [ld for ld in loads(c.body) if ld.buffer == op.out]
        return (all(ld.fill is not None for ld in reads) or why_not_tile_compatible(c) is None
                or implicit_gemm(c) is not None)
    stored = any(stores_it(c) for c in readers)
    for c in readers:
        if not isinstance(c, Compute):
            continue
        reads = [ld for ld in loads(c.body) if ld.buffer == op.out]
        rebuilt_too = c.out in ctx.sinking and all(_own_index(ld, c, ctx) for ld in reads)
        # a pure move (a strided Slice: one affine load) reads the map through the view back, which fold_views
        # composes with its access; it costs nothing where the map is stored for another reader anyway
        move = isinstance(c.body, Load) and c.body.fill is None and not indirect_dims(c.body)
        if not rebuilt_too and not stores_it(c) and not (move and stored):
            return (f"its reader {c.out!r} is not rebuilt with it and is no contraction: it would read it through "
                    "the view back, and a producer read through a view is stored, no longer recomputed there")
    return None


def _build(m: Sink, ctx: Context) -> tuple[list[Op], Rewrite]:
    op = m.op
    found = _groups(m, ctx)
    assert not isinstance(found, str)
    shape, groups = found
    # Old variable -> new: alone in its group it is the group's source dimension; an extent-1
    # target dimension (in no group) is always 0.
    rename = {f"i{t}": Affine() for t, n in enumerate(op.type.shape) if n == 1}
    rename |= {f"i{g[0]}": Affine.var(f"i{j}") for j, g in enumerate(groups) if len(g) == 1}

    merges: dict[str, View] = {}

    def fresh(name: str) -> str:
        while name in ctx.types:
            name += "'"
        return name

    def move(ld: Load) -> Expr:
        if _viewed(ld.buffer, ctx) and _own_index(ld, op, ctx) and _source(ld.buffer, ctx)[1] == shape:
            return Load(_source(ld.buffer, ctx)[0], identity_index(len(shape)))
        if _own_index(ld, op, ctx):
            # a tensor of the map's shape read at the map's own index (a residual): the same row-major
            # bytes under the merged shape, read at the new own index
            if ld.buffer not in merges:
                t = ctx.types[ld.buffer]
                v = View(fresh(f"{ld.buffer}.merged_view"), TensorType(t.dtype, shape), ld.buffer, op.origin)
                ctx.types[v.out] = v.type
                merges[ld.buffer] = v
            return Load(merges[ld.buffer].out, identity_index(len(shape)))
        return reindex(ld, tuple(a.substitute(rename) for a in ld.index))
    name = fresh(f"{op.out}.merged")
    new = Compute(name, TensorType(op.type.dtype, shape), "map", (), map_loads(op.body, move), op.origin)
    sources = [_source(b, ctx)[0] for b in m.viewed]
    return [*merges.values(), new, View(op.out, op.type, name, op.origin)], Rewrite(
        RULE, op.out, True, f"runs over {list(shape)} as {name!r}, reading {sources} at its own index; "
        f"{op.out!r} is its view as {list(op.type.shape)}")


SINK = Rule(RULE, _match, _check, _build)


# ---------------------------------------------------------------- the pass


def _context(p: Program, ops: list[Op], sinking: dict[str, tuple[int, ...] | None]) -> Context:
    readers: dict[str, list[Op]] = {}
    for op in ops:
        names = [ld.buffer for ld in loads(op.body)] if isinstance(op, Compute) else [op.source]
        for n in dict.fromkeys(names):
            readers.setdefault(n, []).append(op)
    types = p.types()
    return Context(p, types, {op.out: op for op in ops if isinstance(op, View)}, readers, sinking, {})


def sink_views(p: Program) -> Program:
    ops = list(p.ops)
    maps = [op for op in ops if isinstance(op, Compute) and op.combiner == "map"]
    # The largest set of maps that all pass: start from every map and drop those that fail
    # until none does. Each sweep runs in program order, so a map's producers in the set have
    # their new shapes when it is checked; its readers are in the set until they fail.
    members: set[str] = {op.out for op in maps}
    declined: dict[str, str] = {}
    while True:
        ctx = _context(p, ops, dict.fromkeys(members))
        for op in maps:
            if op.out not in ctx.sinking:
                continue
            m = SINK.match(op, ctx)
            why = None if m is None else SINK.check(m, ctx)
            if m is None or why is not None:
                del ctx.sinking[op.out]
                if why is not None:
                    declined[op.out] = why
                continue
            found = _groups(m, ctx)
            assert not isinstance(found, str)
            ctx.sinking[op.out] = found[0]
        if set(ctx.sinking) == members:
            break
        members = set(ctx.sinking)
    # Apply in program order, with the shapes of the last sweep; record the declines.
    records: list[Rewrite] = list(p.rewrites)
    new_ops: list[Op] = []
    for op in ops:
        if isinstance(op, Compute) and op.out in members:
            built, record = SINK.build(SINK.match(op, ctx), ctx)
            compute = next(b for b in built if isinstance(b, Compute))
            ctx.rebuilt[op.out] = compute.out         # its readers read the rebuilt compute
            ctx.types[compute.out] = compute.type
            new_ops += built
            records.append(record)
            continue
        if op.out in declined:
            records.append(Rewrite(RULE, op.out, False, declined[op.out]))
        new_ops.append(op)
    return p.replace(ops=tuple(drop_unread_views(new_ops, p.outputs)), rewrites=tuple(records))
