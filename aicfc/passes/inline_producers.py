"""inline_producers: Lowered IR → Lowered IR; an element-wise producer is recomputed inside its
consumers instead of being stored (property `rematerializable_intermediate`).

Two rules, tried on every map compute in program order:

- "load(map(x)) => access folding": the producer only moves data (its body is one load:
  transpose, broadcast, copy). Its access composes with the consumer's access into one affine
  access of the producer's source, so every consumer takes it, GEMM operands included.
- "map(x) => recompute in consumer": the producer computes. Every consumer must accept it:
  a tile-compatible contraction does not (its operands are staged through shared memory as
  plain loads), and a consumer that would recompute an expensive producer many times per
  element declines.

A producer read through a guarded load (a padded window, a Concat's term) is inlined into it only
where it is a table ([Note: a table inlined through a Concat's guard]); a Concat itself is inlined
only into consumers reading it at its own index (its terms keep their guards under the substitution,
see `lowered.reindex`).

The producer disappears when every consumer took it; a graph output or a producer read
through a view is always stored. So is the row of a norm that something else also needs
(h = x + attn_out feeding a norm's statistics and the next residual h2 = h + mlp_out, which is
itself stored or read twice): recomputing h inside every kernel that reads h2 would re-read x
and attn_out there, and along a residual chain the recomputed sum would grow layer by layer;
stored, h is computed once by the row pass of its norm ("map + row pass => stored prologue"
in form_kernels), and the last residual sum before a norm that can become a gemv's row scale
([Note: the last residual row stored]).

    %t: f32[4,8] = map add(load(%x, [i0, i1]), load(%b, [i1]))
    %y: f32[4,8] = map max(load(%t, [i0, i1]), 0.0)
  becomes
    %y: f32[4,8] = map max(add(load(%x, [i0, i1]), load(%b, [i1])), 0.0)

[Note: the last residual row stored]
A decoder's final norm reads the last residual sum h = x + down(...), which nothing else reads, so
"map(x) => recompute in consumer" would put h into the norm's row pass: its statistic then reads two
buffers (x and the down projection's result), fold_row_scale cannot move the norm into the LM head
(it needs the statistic of the one row the gemv streams), and the decode step keeps a one-block
row pass between the last down projection and the LM head (the 1 B Llama's: 1.3 us alone in the
20-layer profile; in session 58's 2-layer timeline 2.75 us of the chain, the LM head's go 1.7 us
after its done). So h stays stored when it reads a contraction's result (that contraction's
epilogue then stores it, as every other layer's down projection stores its residual sum), its row
feeds a statistic, and a map of its row times a factor of the statistics alone is read by
tile-compatible contractions alone: the pattern fold_row_scale takes (by the planner's predictions).
Stored, h costs one row written by the epilogue that computes it; the prefill plan, whose norm
reads the last position of h, stores h where it stored the down's result.
Measured on an H200 (session 59, benchmarks/results/last_norm_ab_session59_h200.txt, the 1 B Llama's
4-layer decode plan against the previous compiler's bundle, 9 alternating rounds): the generate step
0.1562 ms against 0.1569 (1.004x), the plan's replay 154.6 us against 154.1; in the 2-layer timeline
the LM head's blocks land during the last down projection's tail. The 20-layer step, 0.609 ms, is
within the spread between processes of the step before (0.608).

[Note: a table inlined through a Concat's guard]
A table is a map of the plan's constants (and inputs) alone: every read of a weight or a model input, at
least one of a weight, none indirect (`_table`). A Llama's rotary angles are one, position x inverse
frequency, read twice by each of the cos and sin maps through the guarded loads of the Concat that
doubles them (cat(freqs, freqs)). Substituted into a guarded load, the producer's expression would be
evaluated outside the guard on its own inputs instead of giving the fill, so a table is substituted as

    select(load(%p.guard.band.<shape>, [index on the guarded dimensions], fill=0), <body, reads guarded>, fill)

a band of ones over the guarded dimensions (1 inside the producer, 0 outside: the test the load made,
[Note: rotary bands] in ir/properties.py, which codegen reads as its guard where it knows the index) and
the body's reads guarded in every varying dimension (no read outside their buffers where the select
discards the value; inside, the same values). The 1 B Llama's decode step so loses its angles kernel
(the first of its step). A map reading a computed tensor keeps the rule above (a padded window or a
Concat of convolution epilogues is stored as before).

[Note: a table recomputed where it is read]
A decode step's rotary tables (cos and sin of the angles, read through an Unsqueeze, so stored by the
first run) were two one-block kernels in the dependent-launch chain ahead of the first QKV projection
(about 0.65 us each in session 59's timeline, the QKV's go 4.45 us after the step's first kernel's). The
second run, after fold_views, recomputes a table in every consumer that is a map, where the consumer's
elements times the table's operations stay within TABLE_OPS (a few hundred operations a thread of one
block: a decode step's q and k rotary maps, 2048 and 512 elements at 12 operations; not a prompt's
512 rows, nor 8 rows). The rotary maps become the QKV gemv's epilogue (passes/rotary_epilogue.py), whose
table terms the gemv computes before its weight loop ([Note: tables computed before the loop] in
codegen/gemm_gemv.py), off its tail.
Session 53 recomputed the tables there too, but on the epilogue's tail: each QKV's epilogue, run by a
thread or two a block after the block's sums meet, spent 1.8-2.0 us from the sums to the exit against
0.3-0.5 (the angles' loads and four cosf/sinf on the critical tail), so the 4-layer plan replayed in
163.9 us against 161.1 (benchmarks/results/tables_in_epilogue_session53_h200.txt, 9 alternating
rounds): not kept then.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from aicfc.ir.memo import by_identity
from aicfc.ir.lowered import (INTEGER_DTYPES, Affine, Call, Compute, Const, Expr, Load, Program, Rewrite, View,
                              has_indirect, index_loads, indirect_dims, is_integer_compute, loads, map_loads,
                              substitute)
from aicfc.ir.types import TensorType, Weight
from aicfc.ir.properties import (guard_band_name, implicit_gemm, is_identity_access, reads_per_element,
                                 recompute_cost, why_not_tile_compatible)

FOLD_RULE = "load(map(x)) => access folding"
REMAT_RULE = "map(x) => recompute in consumer"
# A producer costing more than this many operations is only recomputed when each of its
# elements is read once (recompute work then equals the work saved by not storing it).
CHEAP_OPS = 8
# [Note: a table recomputed where it is read]: the most operations a table's recomputation may add to one
# consumer (its elements x the table's operations): a few hundred a thread of one block.
TABLE_OPS = 1 << 16


@by_identity   # each op's reads once: the scan for consumers runs per producer
def _reads(op: Compute) -> frozenset[str]:
    return frozenset(ld.buffer for ld in loads(op.body))


def _inline(consumer: Compute, producer: Compute, bands: dict[str, Weight]) -> Compute:
    """`consumer` with `producer`'s body in place of its reads of it; a guarded read becomes
    select(band, the body with its reads guarded, fill), the bands collected into `bands`
    ([Note: a table inlined through a Concat's guard])."""
    def replace(ld: Load) -> Expr:
        if ld.buffer != producer.out:
            return ld
        body = substitute(producer.body, dict(zip(producer.domain_vars, ld.index)))
        if ld.fill is None or not ld.guarded_dims:   # no guard: never outside the producer
            return body
        return Call("select", (_guard_band(producer, ld, bands),
                               map_loads(body, _guarded), Const(ld.fill)))
    return Compute(consumer.out, consumer.type, consumer.combiner, consumer.reduce,
                   map_loads(consumer.body, replace), tuple(dict.fromkeys(consumer.origin + producer.origin)))


def _guard_band(producer: Compute, ld: Load, bands: dict[str, Weight]) -> Load:
    """A read of a band of ones over the dimensions `ld` guards, at its index there: 1 where `ld` reads inside
    `producer`, its fill 0 outside ([Note: rotary bands] in ir/properties.py: codegen may read it as its guard)."""
    dims = ld.guarded_dims
    shape = tuple(producer.type.shape[d] for d in dims)
    name = guard_band_name(producer.out, "x".join(map(str, shape)))
    bands.setdefault(name, Weight.of(name, np.ones(shape, dtype=np.bool_)))
    index = tuple(ld.index[d] for d in dims)
    return Load(name, index, 0.0, tuple(i for i, d in enumerate(dims) if d in ld.guard))


def _guarded(ld: Load) -> Load:
    """`ld` tested against its buffer's bounds in every dimension: the same value inside, and no read
    outside it where the select that holds it discards the value."""
    varying = tuple(d for d, a in enumerate(ld.index) if isinstance(a, Affine) and a.terms)
    if ld.fill is not None or not varying:
        return ld
    computed = Load(ld.buffer, ld.index, 0.0).computed_dims
    return dataclasses.replace(ld, fill=0.0, guard=tuple(d for d in varying if d not in computed))


def _table(producer: Compute, inputs: frozenset[str], weights: frozenset[str]) -> bool:
    """Whether `producer` is a table of the plan's constants (and inputs): every read of a weight or a
    model input, at least one of a weight, none indirect ([Note: a table recomputed where it is read])."""
    reads = {ld.buffer for ld in loads(producer.body)}
    return not has_indirect(producer.body) and reads <= inputs | weights and bool(reads & weights)


def _why_not_domain(producer: Compute, consumer: Compute, pure_move: bool, types: dict[str, TensorType]) -> str | None:
    """[Note: Integer computes]: integer arithmetic is not moved into a float body (it would run
    in float), nor a float-to-integer conversion into an integer body (it happens at the
    producer's store). A pure move of integers changes no value wherever it is read."""
    bands: dict[str, Weight] = {}
    merged = _inline(consumer, producer, bands)
    types = types | {name: w.type for name, w in bands.items()}
    if is_integer_compute(producer.type.dtype, producer.body, types):
        if not pure_move and not is_integer_compute(merged.type.dtype, merged.body, types):
            return (f"it is an integer compute and consumer {consumer.out!r} computes in float: its int64 "
                    "arithmetic would run in float")
    elif producer.type.dtype in INTEGER_DTYPES and is_integer_compute(consumer.type.dtype, consumer.body, types):
        return (f"its float-to-integer conversion happens at its store, and consumer {consumer.out!r} is an "
                "integer compute")
    return None


def _why_not(producer: Compute, consumer: Compute, pure_move: bool, table: bool = False,
             counted: bool = False) -> str | None:
    """Why `producer` may not be recomputed in `consumer` (None: it may); `table`: it is a table
    (`_table`), which a map may read through a guarded load ([Note: a table inlined through a Concat's guard]);
    `counted`: its recomputation's cost was bounded already (`_why_not_table`)."""
    if any(ld.buffer == producer.out for ld in index_loads(consumer.body)):
        return (f"consumer {consumer.out!r} reads it as the ids of an indirect index, which must stay a load "
                "([Note: Indirect index])")
    if any(ld.buffer == producer.out and indirect_dims(ld) for ld in loads(consumer.body)):
        return (f"consumer {consumer.out!r} reads it through an indirect (data-dependent) index, "
                "which is not an affine substitution")
    if has_indirect(producer.body) and (why_not_tile_compatible(consumer) is None
                                        or implicit_gemm(consumer) is not None):
        return (f"consumer {consumer.out!r} is a tile-compatible contraction; a gathered operand would make "
                "it an indirect access, which does not tile")
    guarded = any(ld.buffer == producer.out and ld.fill is not None for ld in loads(consumer.body))
    if guarded and not (table and not pure_move and consumer.combiner == "map"
                        and not any(ld.fill is not None for ld in loads(producer.body))):
        # A padded window or a Concat's term reads the fill outside the guard; substituted, the
        # producer's expression would be evaluated there on its own inputs' fills instead
        # (relu(acc + bias) at a zero fill is relu(bias), not 0), and its other inputs need
        # not be out of range at all. Concat inputs are mostly conv epilogues anyway: inlined,
        # the conv would store its accumulator instead, the same bytes.
        return (f"consumer {consumer.out!r} reads it through a guarded load (padding or a Concat term): "
                "outside the guard it must read the fill, which the producer's expression would not give")
    if pure_move:
        return None
    if not counted and any(ld.fill is not None for ld in loads(producer.body)) and not all(
            is_identity_access(ld, producer.type.shape) for ld in loads(consumer.body) if ld.buffer == producer.out):
        # A Concat's terms stay exact under any substitution (`reindex` keeps their guards), but
        # read elsewhere than at its own index a term may fall wholly outside its input.
        return (f"it reads through guarded loads (a Concat) and consumer {consumer.out!r} reads it at "
                "other positions than its own")
    if why_not_tile_compatible(consumer) is None or implicit_gemm(consumer) is not None:
        return f"consumer {consumer.out!r} is a tile-compatible contraction; its operands must be plain loads"
    reads = reads_per_element(producer, consumer)
    if reads > 1 and recompute_cost(producer) > CHEAP_OPS and not counted:
        return (f"consumer {consumer.out!r} would recompute each element {reads:g} times "
                f"and the producer costs {recompute_cost(producer)} operations")
    return None


def _why_keep_row(prod: Compute, consumers: list[Compute], readers: dict[str, list[Compute]],
                  stored: set[str]) -> str | None:
    """Why `prod` stays stored as the row of a norm (see the module docstring), or None.

    It does when it feeds row statistics (reductions reading it directly or through maps read
    once) and also a map that reads none of them and is itself stored or read more than once.
    """
    stats, frontier = [], [prod.out]
    while frontier:
        for c in readers.get(frontier.pop(), []):
            if c.combiner != "map":
                stats.append(c.out)
            elif len(readers.get(c.out, [])) == 1 and c.out not in stored:
                frontier.append(c.out)
    if not stats:
        return None
    for c in consumers:
        if (c.combiner == "map" and not any(ld.buffer in stats for ld in loads(c.body))
                and (len(readers.get(c.out, [])) > 1 or c.out in stored)):
            return (f"it is the row of statistic(s) {sorted(set(stats))} and also read by {c.out!r}, which is "
                    f"stored or read more than once: computed once, by the row pass, rather than in every "
                    f"kernel that reads {c.out!r}")
    return None


def _why_keep_scaled_row(prod: Compute, readers: dict[str, list[Compute]], producers: dict[str, Compute],
                         stored: set[str]) -> str | None:
    """Why `prod` stays stored as the row of a norm whose scaled row a contraction alone reads, or None
    ([Note: the last residual row stored]).

    It does when it reads a contraction's result (so that contraction's epilogue stores it), its row
    (itself, or a pure move of it such as a Slice of the last position) feeds a statistic, and a map of
    that row times a factor of the statistics alone is read by tile-compatible contractions alone."""
    if not any((src := producers.get(ld.buffer)) is not None and src.combiner == "sum" and src.reduce
               for ld in loads(prod.body)):
        return None
    rows, frontier = {prod.out}, [prod.out]
    while frontier:   # the row and the pure moves of it
        for c in readers.get(frontier.pop(), []):
            if c.combiner == "map" and isinstance(c.body, Load) and c.out not in stored and c.out not in rows:
                rows.add(c.out)
                frontier.append(c.out)
    stats, maps, frontier = set(), [], list(rows)
    while frontier:   # the statistics of the row (through maps read once) and the maps that read the row itself
        for c in readers.get(frontier.pop(), []):
            if c.out in rows:
                continue
            if c.combiner != "map":
                if why_not_tile_compatible(c) is not None:   # a statistic, not a contraction reading the row
                    stats.add(c.out)
                continue
            if any(isinstance(a, Load) and a.buffer in rows for a in getattr(c.body, "args", ())):
                maps.append(c)
            if len(readers.get(c.out, [])) == 1 and c.out not in stored:
                frontier.append(c.out)
    derived, frontier = set(stats), list(stats)
    while frontier:   # what is computed from the statistics alone (the norm's factor)
        for c in readers.get(frontier.pop(), []):
            if c.combiner == "map" and c.out not in derived and {ld.buffer for ld in loads(c.body)} <= derived:
                derived.add(c.out)
                frontier.append(c.out)
    scaled = [c.out for c in maps
              if isinstance(c.body, Call) and c.body.fn == "mul" and len(c.body.args) == 2
              and any(isinstance(a, Load) and a.buffer in rows and {ld.buffer for ld in loads(other)} <= derived
                      and loads(other) for a, other in (c.body.args, c.body.args[::-1]))
              and c.out not in stored and readers.get(c.out)
              and all(why_not_tile_compatible(r) is None for r in readers[c.out])]
    if not stats or not scaled:
        return None
    return (f"it is the row of statistic(s) {sorted(stats)}, and {scaled[0]!r}, the row times a factor of them, is "
            f"a contraction's operand: stored by its producer's epilogue, the norm's row scale can move into that "
            f"contraction (fold_row_scale) and its row pass go")


def inline_producers(p: Program, again: bool = False) -> Program:
    """Both rules in program order. `again`: the second run, access folding alone, after
    fold_views has taken the views that split dimensions out from between producers and
    consumers (a Split's slice read through the head-split reshape folds into the attention's
    operand then). Recomputing maps there too would recompute biases inside head transposes,
    which then no longer fold into an attention operand. It only adds what it applies: its
    declines repeat the first run's."""
    ops = list(p.ops)
    bands: dict[str, Weight] = {}
    types = dict(p.types())   # inlining makes no buffer and changes no dtype; the bands of ones join it
    inputs, weights = frozenset(v.name for v in p.inputs), frozenset(w.name for w in p.weights)
    records: list[Rewrite] = list(p.rewrites)
    k = 0
    while k < len(ops):
        prod = ops[k]
        k += 1
        if not isinstance(prod, Compute) or prod.combiner != "map":
            continue
        pure_move = isinstance(prod.body, Load)
        rule = FOLD_RULE if pure_move else REMAT_RULE
        table = _table(prod, inputs, weights | frozenset(bands))
        if again and not pure_move and not table:
            continue
        consumers = [op for op in ops if isinstance(op, Compute) and prod.out in _reads(op)]
        viewers = [op for op in ops if isinstance(op, View) and op.source == prod.out]
        reason = None
        if prod.out in p.outputs:
            reason = "it is a graph output, so it is stored anyway"
        elif viewers:
            reason = f"it is read through view {viewers[0].out!r}; a reshape is not an affine access"
        elif not consumers:
            reason = "it has no consumer"
        else:
            counted = again and not pure_move   # a table, in the second run
            reason = (_why_not_table(prod, consumers) if counted else None) or next(
                (r for c in consumers if (r := _why_not(prod, c, pure_move, table, counted)
                                          or _why_not_domain(prod, c, pure_move, types))), None)
            if reason is None and not pure_move and not again:
                readers: dict[str, list[Compute]] = {}
                for op in ops:   # who reads what, in the program as it is now
                    if isinstance(op, Compute):
                        for b in _reads(op):
                            readers.setdefault(b, []).append(op)
                stored = set(p.outputs) | {op.source for op in ops if isinstance(op, View)}
                producers = {op.out: op for op in ops if isinstance(op, Compute)}
                reason = (_why_keep_row(prod, consumers, readers, stored)
                          or _why_keep_scaled_row(prod, readers, producers, stored))
        if reason:
            if not again:
                records.append(Rewrite(rule, prod.out, False, reason))
            continue
        if again:   # the first run's "declined" record for it no longer holds
            records = [r for r in records if (r.rule, r.target, r.applied) != (rule, prod.out, False)]
        why = f"inlined into {len(consumers)} consumer(s)"
        if any(ld.buffer == prod.out and ld.guarded_dims for c in consumers for ld in loads(c.body)):
            why += "; a table read through a Concat's guard, whose test a band of ones keeps"
        if again and not pure_move:
            most = max(c.type.numel for c in consumers) * recompute_cost(prod)
            why += f"; a table of the plan's constants, at most {most} operations a consumer (within {TABLE_OPS})"
        for i, op in enumerate(ops):
            if op in consumers:
                ops[i] = _inline(op, prod, bands)
        types.update({name: w.type for name, w in bands.items()})
        ops.remove(prod)
        k -= 1
        records.append(Rewrite(rule, prod.out, True, why, 2 * prod.type.nbytes))
    return p.replace(ops=tuple(ops), weights=p.weights + tuple(w for name, w in bands.items() if name not in weights),
                     rewrites=tuple(records))


def _why_not_table(prod: Compute, consumers: list[Compute]) -> str | None:
    """Why the second run does not recompute the table `prod` in its consumers ([Note: a table recomputed
    where it is read]), or None."""
    for c in consumers:
        if c.combiner != "map":
            return f"consumer {c.out!r} is not a map"
        if c.type.numel * recompute_cost(prod) > TABLE_OPS:
            return (f"consumer {c.out!r} would recompute it {c.type.numel} times at {recompute_cost(prod)} "
                    f"operations, over {TABLE_OPS}")
    return None
