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

A producer read through a guarded load (a padded window, a Concat's term) is never inlined
into it; a Concat itself is inlined only into consumers reading it at its own index (its terms
keep their guards under the substitution, see `lowered.reindex`).

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

[Note: tables recomputed in a gemv's epilogue]
A decode step's rotary tables (cos and sin of position x inverse frequencies, read through an
Unsqueeze, so stored by the first run) are two one-block kernels of about 2.3 us each in the
dependent-launch chain. Session 53 let the second run recompute such a map inside the epilogue of
every one-row gemv reading it (the QKV projections' rotary epilogue), which removed both kernels.
Measured on an H200 (benchmarks/results/tables_in_epilogue_session53_h200.txt, the 1 B Llama's
decode plan): the first QKV started 4.7 us sooner, but each QKV's epilogue, run by a thread or two
a block after the block's sums meet, spent 1.8-2.0 us from the sums to the exit against 0.3-0.5
(the angles' loads and four cosf/sinf on the kernel's critical tail), so the 4-layer plan replayed
in 163.9 us against 161.1 (9 alternating rounds): a loss from about two layers on. Not kept. What
would keep the gain is computing such values before the gemv's weight loop (they do not depend on
its sums), which the gemv template does not do.
"""
from __future__ import annotations

from aicfc.ir.memo import by_identity
from aicfc.ir.lowered import (INTEGER_DTYPES, Call, Compute, Expr, Load, Program, Rewrite, View, has_indirect,
                              index_loads, indirect_dims, is_integer_compute, loads, map_loads, substitute)
from aicfc.ir.types import TensorType
from aicfc.ir.properties import (implicit_gemm, is_identity_access, reads_per_element, recompute_cost,
                                 why_not_tile_compatible)

FOLD_RULE = "load(map(x)) => access folding"
REMAT_RULE = "map(x) => recompute in consumer"
# A producer costing more than this many operations is only recomputed when each of its
# elements is read once (recompute work then equals the work saved by not storing it).
CHEAP_OPS = 8


@by_identity   # each op's reads once: the scan for consumers runs per producer
def _reads(op: Compute) -> frozenset[str]:
    return frozenset(ld.buffer for ld in loads(op.body))


def _inline(consumer: Compute, producer: Compute) -> Compute:
    def replace(ld: Load) -> Expr:
        if ld.buffer != producer.out:
            return ld
        return substitute(producer.body, dict(zip(producer.domain_vars, ld.index)))
    return Compute(consumer.out, consumer.type, consumer.combiner, consumer.reduce,
                   map_loads(consumer.body, replace), tuple(dict.fromkeys(consumer.origin + producer.origin)))


def _why_not_domain(producer: Compute, consumer: Compute, pure_move: bool, types: dict[str, TensorType]) -> str | None:
    """[Note: Integer computes]: integer arithmetic is not moved into a float body (it would run
    in float), nor a float-to-integer conversion into an integer body (it happens at the
    producer's store). A pure move of integers changes no value wherever it is read."""
    merged = _inline(consumer, producer)
    if is_integer_compute(producer.type.dtype, producer.body, types):
        if not pure_move and not is_integer_compute(merged.type.dtype, merged.body, types):
            return (f"it is an integer compute and consumer {consumer.out!r} computes in float: its int64 "
                    "arithmetic would run in float")
    elif producer.type.dtype in INTEGER_DTYPES and is_integer_compute(consumer.type.dtype, consumer.body, types):
        return (f"its float-to-integer conversion happens at its store, and consumer {consumer.out!r} is an "
                "integer compute")
    return None


def _why_not(producer: Compute, consumer: Compute, pure_move: bool) -> str | None:
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
    if any(ld.buffer == producer.out and ld.fill is not None for ld in loads(consumer.body)):
        # A padded window or a Concat's term reads the fill outside the guard; substituted, the
        # producer's expression would be evaluated there on its own inputs' fills instead
        # (relu(acc + bias) at a zero fill is relu(bias), not 0), and its other inputs need
        # not be out of range at all. Concat inputs are mostly conv epilogues anyway: inlined,
        # the conv would store its accumulator instead, the same bytes.
        return (f"consumer {consumer.out!r} reads it through a guarded load (padding or a Concat term): "
                "outside the guard it must read the fill, which the producer's expression would not give")
    if pure_move:
        return None
    if any(ld.fill is not None for ld in loads(producer.body)) and not all(
            is_identity_access(ld, producer.type.shape) for ld in loads(consumer.body) if ld.buffer == producer.out):
        # A Concat's terms stay exact under any substitution (`reindex` keeps their guards), but
        # read elsewhere than at its own index a term may fall wholly outside its input.
        return (f"it reads through guarded loads (a Concat) and consumer {consumer.out!r} reads it at "
                "other positions than its own")
    if why_not_tile_compatible(consumer) is None or implicit_gemm(consumer) is not None:
        return f"consumer {consumer.out!r} is a tile-compatible contraction; its operands must be plain loads"
    reads = reads_per_element(producer, consumer)
    if reads > 1 and recompute_cost(producer) > CHEAP_OPS:
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
    types = p.types()   # inlining makes no buffer and changes no dtype
    records: list[Rewrite] = list(p.rewrites)
    k = 0
    while k < len(ops):
        prod = ops[k]
        k += 1
        if not isinstance(prod, Compute) or prod.combiner != "map":
            continue
        pure_move = isinstance(prod.body, Load)
        rule = FOLD_RULE if pure_move else REMAT_RULE
        if again and not pure_move:
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
            reason = next((r for c in consumers if (r := _why_not(prod, c, pure_move)
                                                     or _why_not_domain(prod, c, pure_move, types))), None)
            if reason is None and not pure_move:
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
        for i, op in enumerate(ops):
            if op in consumers:
                ops[i] = _inline(op, prod)
        ops.remove(prod)
        k -= 1
        records.append(Rewrite(rule, prod.out, True, f"inlined into {len(consumers)} consumer(s)",
                               2 * prod.type.nbytes))
    return p.replace(ops=tuple(ops), rewrites=tuple(records))
