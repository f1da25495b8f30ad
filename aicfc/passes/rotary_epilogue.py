"""rotary_epilogue: Lowered IR → Lowered IR; rotary position embedding of the q and k heads of a
merged QKV contraction becomes one map over the contraction's own columns, which form_kernels
absorbs as the GEMM's epilogue (rule ROTARY_RULE, property `properties.rotary_pairs`).

After merge_contractions and fold_guarded_moves a Llama layer's QKV result C [.., N] (N = G
heads of D columns: q, then k, then v) is read by one map per q and k, each x·cos +
rotate_half(x)·sin over [.., H, S, D] (rotate_half's halves read through guarded loads of a
split view of C), and by the attention for V. Each map stores its heads apart: two kernels,
and C stored in full besides. But rotate_half pairs column d of a head with column d ± D/2 of
the same head and row, and every tensor-core unit's thread holds, for each 8-column block of
its tile, the same two columns of every other block: with whole heads inside a thread's columns
(codegen declines the tiles that split one), the partner's accumulator is in the thread. So
the maps are restated over C's own elements, C's last dimension split into digits (g, t, j):
column g·D + t·D/2 + j, and one map R computes every head, q and k rotated, v copied:

    %r: f32[.., G, 2, D/2] = map select(load(%r.band.heads0, [g], fill=0.0), <q map at h = g, d = t·D/2 + j>,
                                select(load(%r.band1, [g - H], fill=0.0), <k map at h = g - H, ...>,
                                       load(%c, [.., D·g + D/2·t + j])))
    %r.flat: f32[.., N] = view %r

(a band of ones read at an offset is the test of the head's range, as for Trilu). A guarded
read of the split view that is valid only in one half t_v (rotate_half's -x[d + D/2] for d <
D/2, x[d - D/2] above) becomes select(load(%r.half<t_v>, [t - t_v], fill=0.0), load(%c, column at
t = t_v), fill): the column read no longer depends on t, so it lies inside C for every t. The
attention then reads q, k and v from R through %r.flat at column D·head + d: rotated q and k
are read at the same d, and so is every score's sum over d.

Legal when C is a contraction over its last dimension, not a graph output; every reader of C
or of a view of it is one of these maps or reads C directly in columns outside every rotated
head; a map: its body reads C at [.., row, D·h + d + D·h0] (h0·D its heads' first column)
once or more, other reads of C (or a view of it) at a constant column offset 0 or ±D/2 from
that, the guarded ones valid in one half t_v of d only; it is no graph output and its readers
come after it. `precision` must allow tensor cores (fp16, bf16, tf32): SIMT tiles do not hold
a head in one thread, and fp32 keeps the maps as they are.

Profitable (given the target's profile `hw`) when the epilogue's predicted extra time in the GEMM
is below the maps' as kernels of their own (planner/cost_rotary.py); the rewrite's reason, applied
or declined, gives both figures. Without a profile (tests of the IR alone) only legality decides.
"""
from __future__ import annotations

import numpy as np

from aicfc.codegen.cexpr import flat_offset
from aicfc.ir.lowered import (Affine, Call, Compute, Const, Expr, Load, Program, Rewrite, View, loads, map_loads,
                               substitute, view_base)
from aicfc.ir.properties import contraction, is_identity_access, rotary_band_name
from aicfc.ir.types import TensorType, Weight
from aicfc.planner.cost_rotary import rotary_fusion_cost
from aicfc.planner.hardware import Profile

ROTARY_RULE = "x·cos + rotate_half(x)·sin of a GEMM's head columns => rotary gemm epilogue"
TENSOR_CORE_PRECISIONS = ("fp16", "bf16", "tf32")


class _Decline(Exception):
    pass


def _match_map(m: Compute, c: Compute, types: dict, root: dict) -> tuple[int, int, str, str, dict, list] | str:
    """(D, h0, h var, d var, {m var: C lead var}, [(load, C column offset from own, t_v or None)])."""
    n_ext = c.type.shape[-1]
    lead = c.domain_vars[:-1]
    ext = m.extents()
    own = [ld for ld in loads(m.body) if ld.buffer == c.out and ld.fill is None]
    if not own:
        return "it reads no column of the contraction at its own index"
    if any(not isinstance(a, Affine) for ld in own for a in ld.index):
        return "it reads the contraction through an indirect (data-dependent) index"
    last = own[0].index[-1]
    by_coeff = {k: v for v, k in last.terms}
    d = by_coeff.get(1)
    if d is None or len(by_coeff) != len(last.terms):
        return "its column is not head·D + d"
    D = ext[d]
    h = by_coeff.get(D)          # absent for a map of one head (Mistral's single key/value head)
    if len(last.terms) != 1 + (h is not None) or D % 2 or last.const % D or n_ext % D:
        return f"its column is not head·{D} + d in whole heads"
    h0 = last.const // D
    if h0 + (ext[h] if h else 1) > n_ext // D:
        return "its heads run past the contraction's columns"
    to_lead: dict[str, str] = {}
    for a, v, n in zip(own[0].index[:-1], lead, c.type.shape[:-1]):
        if n == 1 and a == Affine():
            continue
        if len(a.terms) != 1 or a.terms[0][1] != 1 or a.const or a.terms[0][0] in (h, d):
            return "its row index is not a plain variable"
        to_lead[a.terms[0][0]] = v
    if set(to_lead) | {h, d} - {None} != {v for v, n in ext.items() if n > 1}:
        return "its domain has variables other than the rows, the head and d"
    own_flat = flat_offset(own[0].index, c.type)
    half = D // 2
    reads = []
    for ld in loads(m.body):
        if root.get(ld.buffer) != c.out:
            continue
        diff = _minus(flat_offset(ld.index, types[ld.buffer]), own_flat) if all(
            isinstance(a, Affine) for a in ld.index) else None
        if diff is None or diff.terms or diff.const not in (0, half, -half):
            return f"it reads {ld.buffer!r} other than at its own column or the other half of its head"
        if ld.fill is None:
            if diff.const:
                return "it reads the other half of a head without a guard"
            reads.append((ld, 0, None))
            continue
        shape = types[ld.buffer].shape
        dims = []
        for k in ld.guarded_dims:   # a test of other variables must hold everywhere
            if set(v for v, _ in ld.index[k].terms) - {d}:
                lo, hi = ld.index[k].bounds(ext)
                if d in {v for v, _ in ld.index[k].terms} or lo < 0 or hi >= shape[k]:
                    return "a guard of its reads tests more than d"
            else:
                dims.append(k)
        valid = [all(0 <= ld.index[k].substitute({d: Affine((), x)}).const < shape[k] for k in dims) for x in range(D)]
        halves = {x // half for x in range(D) if valid[x]}
        if valid != [x // half in halves for x in range(D)] or len(halves) != 1:
            return "a guarded read is not valid in exactly one half of the head"
        (tv,) = halves
        if diff.const != (half if tv == 0 else -half) and diff.const != 0:
            return "a guarded read of one half reads outside its head"
        reads.append((ld, diff.const, tv))
    return D, h0, h, d, to_lead, reads


def fold_rotary(p: Program, precision: str, hw: Profile | None = None) -> Program:
    if precision not in TENSOR_CORE_PRECISIONS:
        return p
    types = p.types()
    base = view_base(op for op in p.ops if isinstance(op, View))
    root = {name: base(name) for name in types}
    ops = list(p.ops)
    weights = list(p.weights)
    records = list(p.rewrites)
    producers = {op.out: op for op in p.ops if isinstance(op, Compute)}
    for c in [op for op in p.ops if isinstance(op, Compute)]:
        gemm = _gemm_of(c, producers, ops)
        if gemm is None or c.out in p.outputs:
            continue
        readers = [op for op in ops if isinstance(op, Compute) and any(root.get(ld.buffer) == c.out for ld in loads(op.body))]
        maps, plain, why = [], [], None
        for op in readers:
            got = _match_map(op, c, types, root) if op.combiner == "map" and op.out not in p.outputs else None
            if isinstance(got, tuple) and any(diff for _, diff, _ in got[5]):   # it rotates
                maps.append((op, got))
            else:
                plain.append((op, got))
        if not maps:
            continue
        D = maps[0][1][0]
        if any(g[0] != D for _, g in maps):
            why = "the rotated maps' head sizes differ"
        elif (D // 2) % 8:
            why = f"half a head ({D // 2} columns) is not a multiple of 8: a thread's 8-column blocks would split it"
        taken = sorted((g[1], g[1] + _heads(m, g[2])) for m, g in maps)
        if why is None and any(a[1] > b[0] for a, b in zip(taken, taken[1:])):
            why = "two rotated maps cover the same heads"
        # R (and its flat view) takes the place of the first rotated map: it reads only the
        # contraction, which every map reads, so it is defined there; a reader of one map may
        # come before another map (a q reader ahead of the k map), so not the last one's place.
        first_map = min(ops.index(m) for m, _ in maps)
        for op, reason in plain:
            if why:
                break
            for ld in loads(op.body):
                if root.get(ld.buffer) != c.out:
                    continue
                if ld.buffer != c.out or ld.fill is not None:
                    why = f"{op.out!r} reads {ld.buffer!r} through a view or a guard"
                    break
                lo, hi = ld.index[-1].bounds(op.extents())
                if any(lo < b * D and a * D <= hi for a, b in taken):
                    why = f"{op.out!r} reads rotated columns" + (f" ({reason})" if isinstance(reason, str) else "")
                    break
            if why is None and ops.index(op) < first_map:
                why = f"{op.out!r} comes before a rotated map"
        rotated = {m.out for m, _ in maps}
        if why is None and any(ld.buffer in rotated and (ld.fill is not None or not all(isinstance(a, Affine) for a in ld.index))
                               for op in ops if isinstance(op, Compute) for ld in loads(op.body)):
            why = "a rotated map is read through a guard or an indirect index (its reader's index would change shape)"
        if why is None and any(isinstance(op, View) and (root.get(op.source) == c.out and any(
                ld.buffer == op.out for o in ops if isinstance(o, Compute) and o not in [m for m, _ in maps]
                for ld in loads(o.body)) or op.source in rotated) for op in ops):
            why = "a view of the contraction, or of a rotated map, is read by another op"
        figures = ""
        if why is None and hw is not None:
            fused, separate = _costs(c, maps, types, root, precision, hw)
            figures = (f"; predicted {fused:.2f} us of epilogue in the GEMM against {separate:.2f} us for the "
                       f"{len(maps)} rotary kernel(s) apart (planner/cost_rotary.py)")
            if fused >= separate:
                why = "the separate rotary kernels cost less" + figures
        if why:
            records.append(Rewrite(ROTARY_RULE, c.out, False, why))
            continue
        new_ops, new_weights, record = _build(c, gemm, D, maps, types)
        record = Rewrite(record.rule, record.target, True, record.reason + figures, record.bytes_saved)
        weights += new_weights
        r, flat = new_ops
        removed = {m.out for m, _ in maps}
        redirect = {m.out: g for m, g in maps}

        def reread(ld: Load, c=c, D=D, redirect=redirect, flat=flat) -> Expr:
            if ld.buffer == c.out:
                return Load(flat.out, ld.index, ld.fill, ld.guard)
            if ld.buffer in redirect:
                _, h0, h, d, to_lead, _ = redirect[ld.buffer]
                m = next(m for m, _ in maps if m.out == ld.buffer)
                at = dict(zip(m.domain_vars, ld.index))
                lead = tuple(at[mv] if mv is not None else Affine() for mv in _lead_sources(c, to_lead))
                col = _col(at[h] if h else Affine(), at[d], h0, D)
                return Load(flat.out, lead + (col,), ld.fill, ld.guard)
            return ld
        if gemm is not c:
            removed = removed | {c.out}    # inlined into R (its bias read at each column R reads)
        out_ops = []
        for op in ops:
            if op.out in removed:
                if op.out == ops[first_map].out:
                    out_ops += [r, flat]
                continue
            if isinstance(op, View) and root.get(op.source) == c.out and op.out != flat.out:
                continue   # the split views rotate_half read: R reads C itself now
            if isinstance(op, Compute) and any(ld.buffer in redirect or ld.buffer == c.out for ld in loads(op.body)) \
                    and op is not c:
                op = Compute(op.out, op.type, op.combiner, op.reduce, map_loads(op.body, reread), op.origin)
            out_ops.append(op)
        ops = out_ops
        records.append(record)
        types = {**types, r.out: r.type, flat.out: flat.type}
        root.update({r.out: r.out, flat.out: r.out})
    return p.replace(ops=tuple(ops), weights=tuple(weights), rewrites=tuple(records))


def _costs(c: Compute, maps: list, types: dict, root: dict, precision: str, hw: Profile) -> tuple[float, float]:
    """(fused, separate) predicted us (planner/cost_rotary.py): C's rows and columns, each map's
    elements, and the largest table a map reads besides C (cos or sin; the bands are one bool
    an element of a few heads)."""
    rows = int(np.prod(c.type.shape[:-1]))
    tables = [types[ld.buffer].numel for m, _ in maps for ld in loads(m.body) if root.get(ld.buffer) != c.out]
    esize = 4 if precision == "tf32" else 2
    return rotary_fusion_cost(rows, c.type.shape[-1], [m.type.numel for m, _ in maps], max(tables, default=0), esize, hw)


def _gemm_of(c: Compute, producers: dict, ops: list) -> Compute | None:
    """The contraction whose columns `c`'s are: `c` itself (a contraction over its last
    dimension), or the contraction a map of `c`'s shape reads at its own index (its only
    reader: a bias added to every column, as Qwen2's q/k/v projections have)."""
    def plain(op: Compute) -> bool:
        cc = contraction(op)
        return cc is not None and cc.n == op.domain_vars[-1]
    if c.combiner == "sum":
        return c if plain(c) else None
    if c.combiner != "map":
        return None
    inner = [ld for ld in loads(c.body) if ld.buffer in producers and producers[ld.buffer].combiner == "sum"]
    if len(inner) != 1 or not is_identity_access(inner[0], c.type.shape) or inner[0].fill is not None:
        return None
    g = producers[inner[0].buffer]
    if g.type.shape != c.type.shape or not plain(g) or any(
            any(ld.buffer == g.out for ld in loads(op.body)) for op in ops if isinstance(op, Compute) and op is not c) \
            or any(isinstance(op, View) and op.source == g.out for op in ops):
        return None
    return g


def _heads(m: Compute, h: str | None) -> int:
    return m.extents()[h] if h else 1


def _band(name: str, index: Affine) -> Load:
    """A read of a band of ones at `index`: 1 inside the band, the fill 0 outside (the guard
    tests the index's value: named in `guard` when the index is a plain variable)."""
    ld = Load(name, (index,), 0.0)
    return ld if ld.computed_dims else Load(name, (index,), 0.0, (0,))


def _minus(a: Affine, b: Affine) -> Affine:
    terms = dict(a.terms)
    for v, k in b.terms:
        terms[v] = terms.get(v, 0) - k
    return Affine.of(terms, a.const - b.const)


def _lead_sources(c: Compute, to_lead: dict[str, str]) -> list[str | None]:
    """For each of C's leading dimensions, the map variable that indexes it (None: extent 1)."""
    back = {cv: mv for mv, cv in to_lead.items()}
    return [back.get(v) for v in c.domain_vars[:-1]]


def _col(h: Affine, d: Affine, h0: int, D: int) -> Affine:
    terms: dict[str, int] = {}
    for v, k in h.terms:
        terms[v] = terms.get(v, 0) + D * k
    for v, k in d.terms:
        terms[v] = terms.get(v, 0) + k
    return Affine.of(terms, D * (h.const + h0) + d.const)


def _build(c: Compute, gemm: Compute, D: int, maps: list, types: dict) -> tuple[tuple[Compute, View], list[Weight], Rewrite]:
    half = D // 2
    rank = len(c.type.shape)
    n_ext = c.type.shape[-1]
    heads = n_ext // D
    lead = c.domain_vars[:-1]
    g, t, j = f"i{rank - 1}", f"i{rank}", f"i{rank + 1}"
    name = c.out + ".rotary"
    rtype = TensorType(c.type.dtype, c.type.shape[:-1] + (heads, 2, half))
    lead_index = tuple(Affine.var(v) if n > 1 else Affine() for v, n in zip(lead, c.type.shape[:-1]))
    own_col = Affine.of({g: D, t: half, j: 1})

    def read_c(col: Affine) -> Expr:
        """C at this row and column; a map over the contraction (its bias) restated there."""
        if gemm is c:
            return Load(c.out, lead_index + (col,))
        return substitute(c.body, {v: a for v, a in zip(c.domain_vars, lead_index + (col,))})
    body: Expr = read_c(own_col)
    made: list[Weight] = []
    half_bands: dict[int, str] = {}
    for k, (m, (_, h0, h, d, to_lead, reads)) in enumerate(maps):
        mapping = {mv: Affine.var(cv) for mv, cv in to_lead.items()}
        if h:
            mapping[h] = Affine.of({g: 1}, -h0)
        mapping[d] = Affine.of({t: half, j: 1})
        for v, n in m.extents().items():
            if n == 1:
                mapping.setdefault(v, Affine())
        special = {ld: (diff, tv) for ld, diff, tv in reads}

        def restate(ld: Load, special=special, mapping=mapping) -> Expr:
            if ld not in special:
                return substitute(ld, mapping)
            diff, tv = special[ld]
            if tv is None:
                return read_c(own_col)
            col = Affine.of({g: D, j: 1}, tv * half + diff)
            band = half_bands.get(tv)
            if band is None:
                w = Weight.of(rotary_band_name(c.out, f"half{tv}"), np.ones(1, dtype=np.bool_))
                made.append(w)
                band = half_bands[tv] = w.name
            return Call("select", (_band(band, Affine.of({t: 1}, -tv)), read_c(col),
                                   Const(ld.fill)))
        rotated = map_loads(m.body, restate)
        hm = _heads(m, h)
        w = Weight.of(rotary_band_name(c.out, f"heads{k}"), np.ones(hm, dtype=np.bool_))
        made.append(w)
        body = Call("select", (_band(w.name, Affine.of({g: 1}, -h0)), rotated, body))
    origin = tuple(dict.fromkeys(o for m, _ in maps for o in m.origin))
    r = Compute(name, rtype, "map", (), body, origin)
    flat = View(name + ".flat", TensorType(c.type.dtype, c.type.shape), name, origin)
    heads_rot = sorted((g_[1], g_[1] + _heads(m, g_[2])) for m, g_ in maps)
    reason = (f"rotate_half pairs column d of a head with d ± {half} of the same head and row; with whole "
              f"heads of {D} in a thread's columns its partner's accumulator is in the thread: heads "
              f"{', '.join(f'{a}..{b - 1}' for a, b in heads_rot)} of {heads} rotated, the rest copied, in "
              f"{c.out!r}'s epilogue; {len(maps)} map(s) ({', '.join(m.out for m, _ in maps)}) and "
              f"{c.out!r} ({c.type}) are never stored apart")
    saved = sum(2 * m.type.nbytes for m, _ in maps)
    return (r, flat), made, Rewrite(ROTARY_RULE, c.out, True, reason, saved)
