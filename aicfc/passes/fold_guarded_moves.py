"""fold_guarded_moves: Lowered IR → Lowered IR; a data move read through a guarded load (a
Concat's term) is read from its source instead, through a view that splits the source so the
guard's test stays exact (rule GUARDED_RULE, property `rematerializable_intermediate`).

Rotary position embedding's rotate_half is `Concat(-x[..., h:], x[..., :h])` of a head slice
x of the QKV GEMM's result. inline_producers declines the slices: outside a Concat term's
guard the load must read the fill, and the guard tests the term's own dimension (extent h),
which a load of the GEMM's result (a column 16·head + d + 8 of 128) no longer has. But the
GEMM's columns are a mixed-radix number (head, half, d): viewed as [.., 8, 2, 8], the slice's
d is a dimension of its own again, of extent h, read at d itself, so the guard tests the same
thing. Each slice (and its Neg) then becomes part of the rotary map, and the two small kernels
that stored them per q and k are gone:

    %neg: f32[1,4,16,8] = map neg(load(%qkv, [0, i2, 16*i1+i3+8]))
    %rot: f32[1,4,16,16] = map ... load(%neg, [0, i1, i2, i3], fill=-0.0, guard=[3]) ...
  becomes
    %qkv.split: f32[1,16,8,2,8] = view %qkv
    %rot: f32[1,4,16,16] = map ... neg(load(%qkv.split, [0, i2, i1, 1, i3], fill=0.0, guard=[4])) ...

Legal when the producer is a map whose body is one load of an unguarded, affine access, or
the negation of one (fill' = -fill gives neg(fill') = fill); every consumer reads it only
through guarded loads, at guarded dimensions that the producer reads at its own variable
alone; and each dimension of the source splits into digits with one variable per digit and
no carry (`split_access`). The producer is removed when nothing else reads it.
"""
from __future__ import annotations

from aicfc.ir.lowered import Affine, Call, Compute, Expr, Load, Program, Rewrite, View, loads, map_loads
from aicfc.ir.types import TensorType

GUARDED_RULE = "guarded load(move(x)) => guarded load(split view of x)"


def split_access(index: tuple[Affine, ...], shape: tuple[int, ...], extents: dict[str, int],
                 keep: dict[str, int]) -> tuple[tuple[int, ...], tuple[Affine, ...], dict[str, int]] | None:
    """(view shape, index into the view, {variable: view dimension}) or None.

    Each dimension of extent N read at sum(c·v) + C is split at the strides 1, every c, c·extent(v)
    of every v in `keep`, and N (each dividing the next); every variable must then be one digit's whole
    index (v + C's digit there, inside the digit's radix: no carry), and each variable in
    `keep` the digit of radix keep[v] with no constant added."""
    out_shape: list[int] = []
    out_index: list[Affine] = []
    where: dict[str, int] = {}
    for a, n in zip(index, shape):
        strides = {1, n} | {c for _, c in a.terms} | {c * extents[v] for v, c in a.terms if v in keep}
        if any(c <= 0 for _, c in a.terms) or a.const < 0 or max(strides) > n:
            return None
        strides = sorted(strides)
        if any(hi % lo for lo, hi in zip(strides, strides[1:])):
            return None
        coeff_of = {c: v for v, c in a.terms}
        if len(coeff_of) != len(a.terms):
            return None
        for lo, hi in reversed(list(zip(strides, strides[1:]))):   # row-major: the top digit first
            radix, digit = hi // lo, (a.const // lo) % (hi // lo)
            v = coeff_of.get(lo)
            if v is None:
                out_index.append(Affine((), digit))
            else:
                if extents[v] - 1 + digit >= radix or (v in keep and (digit or radix != keep[v])):
                    return None
                where[v] = len(out_shape)
                out_index.append(Affine(((v, 1),), digit))
            out_shape.append(radix)
        if a.const >= n:
            return None
    if set(keep) - set(where):
        return None
    return tuple(out_shape), tuple(out_index), where


def _move(op: Compute) -> tuple[Load, bool] | None:
    """(the one load, negated?) of a producer that only moves (or negates) data."""
    body, neg = op.body, False
    if isinstance(body, Call) and body.fn == "neg":
        body, neg = body.args[0], True
    if isinstance(body, Load) and body.fill is None and all(isinstance(a, Affine) for a in body.index):
        return body, neg
    return None


def fold_guarded_moves(p: Program) -> Program:
    ops = list(p.ops)
    records = list(p.rewrites)
    types = p.types()
    views: dict[tuple, str] = {}   # (source, view shape) -> its view's name
    for prod in [op for op in p.ops if isinstance(op, Compute) and op.combiner == "map"]:
        moved = _move(prod)
        if moved is None or prod.out in p.outputs:
            continue
        src, neg = moved
        consumers = [op for op in ops if isinstance(op, Compute) and any(ld.buffer == prod.out for ld in loads(op.body))]
        reads = [ld for c in consumers for ld in loads(c.body) if ld.buffer == prod.out]
        if not reads or any(op.source == prod.out for op in ops if isinstance(op, View)):
            continue
        if any(ld.fill is None for ld in reads):
            continue   # read plainly somewhere: inline_producers' business
        guarded = sorted({d for ld in reads for d in ld.guarded_dims})
        ext = prod.extents()
        keep = {}
        why = None
        for d in guarded:
            v = f"i{d}"
            uses = [a for a in src.index if a.coeff(v)]
            if len(uses) != 1 or uses[0].coeff(v) <= 0:
                why = f"guarded dimension {d} is not read at its own variable in one dimension of {src.buffer!r}"
                break
            keep[v] = ext[v]
        split = None if why else split_access(src.index, types[src.buffer].shape, ext, keep)
        if why is None and split is None:
            why = f"the access of {src.buffer!r} does not split into one variable per digit"
        if why:
            records.append(Rewrite(GUARDED_RULE, prod.out, False, why))
            continue
        shape, index, where = split
        key = (src.buffer, shape)
        if key not in views:
            views[key] = f"{src.buffer}.split{len(views)}"
            view = View(views[key], TensorType(types[src.buffer].dtype, shape), src.buffer, prod.origin)
            at = next((i + 1 for i, op in enumerate(ops) if op.out == src.buffer), 0)
            ops.insert(at, view)
            types[view.out] = view.type
        name = views[key]
        guard_dims = tuple(sorted(where[f"i{d}"] for d in guarded))

        def replace(ld: Load, prod=prod, name=name, index=index, guard_dims=guard_dims, neg=neg) -> Expr:
            if ld.buffer != prod.out:
                return ld
            mapping = dict(zip(prod.domain_vars, ld.index))
            idx = tuple(a.substitute(mapping) for a in index)
            fill = -ld.fill if neg else ld.fill
            new = Load(name, idx, fill, ())
            computed = set(new.computed_dims)
            new = Load(name, idx, fill, tuple(d for d in guard_dims if d not in computed))
            return Call("neg", (new,)) if neg else new
        for i, op in enumerate(ops):
            if op in consumers:
                ops[i] = Compute(op.out, op.type, op.combiner, op.reduce, map_loads(op.body, replace),
                                 tuple(dict.fromkeys(op.origin + prod.origin)))
        ops.remove(prod)
        records.append(Rewrite(GUARDED_RULE, prod.out, True,
                               f"read from {src.buffer!r} viewed as {list(shape)}: guarded dimension(s) "
                               f"{guarded} are digits of their own there, so each guard tests the same index "
                               f"(rematerializable_intermediate); inlined into {len(consumers)} consumer(s)",
                               2 * prod.type.nbytes))
    return p.replace(ops=tuple(ops), rewrites=tuple(records))
