"""form_kernels: Lowered IR → Decision IR kernels (schedules not yet chosen).

Groups computes into launches by their memory properties, never by op names:

- a `tile_compatible_compute` contraction is a `gemm` kernel; rule
  "contraction + map => gemm epilogue" absorbs its single element-wise consumer when that
  consumer reads each accumulator once at the same index (bias, activation, residual, scale),
  or combines the column pairs (2j, 2j+1) into element j (`properties.gated_pairs`, set up by
  interleave_gates: rule GATE_RULE is then listed too; its bind is its own identity, codegen
  places its column j at gn / 2 of the pair gn, gn + 1), or restates the result's columns as
  heads split in halves (`properties.rotary_pairs`, set up by rotary_epilogue: rule ROTARY_RULE
  listed too; codegen binds the digits to the column gn and reads a rotation partner from the
  thread's own accumulators);
- an element-wise map that reads `online_reducible_norm` reductions only as per-row values
  broadcast along one variable j, where each reduction runs over j's extent, is a
  `row_reduce` kernel with those reductions (rule "row stats + map => one row pass"): a
  block of threads reduces a row's statistics and writes the row without storing them;
  rule "map + row pass => stored prologue" lets that pass also compute the stored map it reads
  as its row (a residual sum before a norm) and store it, instead of a pointwise kernel;
- a contraction over several reduction axes (`implicit_gemm`: a convolution) is a `conv`
  kernel, and any other reduction over several axes or through a guarded load (a pool, a
  depthwise conv, LRN's window sum) a `window` kernel; both absorb an element-wise consumer as
  the gemm does (rules "contraction + map => gemm epilogue", "window + map => epilogue");
- every other reduction is a `row_reduce` kernel of its own; every other map a `pointwise`.

    %s.max: f32[4,1] = max[8] load(%x, [i0, r0])
    %s.sum: f32[4,1] = sum[8] exp(sub(load(%x, [i0, r0]), load(%s.max, [i0, 0])))
    %s: f32[4,8] = map div(exp(sub(load(%x, [i0, i1]), load(%s.max, [i0, 0]))), load(%s.sum, [i0, 0]))
  becomes one kernel:
    kernel k0 row_reduce { ...the three computes...
      bind %s.max {i0: i0, i1: 0, r0: i1}  bind %s.sum {i0: i0, i1: 0, r0: i1}  store %s }
"""
from __future__ import annotations

from aicfc.ir.decision import Kernel, Plan
from aicfc.ir.lowered import Affine, Compute, Indirect, Program, Rewrite, View, loads, view_base
from aicfc.ir.properties import (contraction, gated_pairs, implicit_gemm, is_identity_access, properties,
                                 rotary_pairs, why_not_online_reducible)
from aicfc.passes.interleave_gates import GATE_RULE
from aicfc.passes.rotary_epilogue import ROTARY_RULE
from aicfc.passes.streaming_attention import attention_kernels

EPILOGUE_RULE = "contraction + map => gemm epilogue"
WINDOW_EPILOGUE_RULE = "window + map => epilogue"
ROW_RULE = "row stats + map => one row pass"
PROLOGUE_RULE = "map + row pass => stored prologue"


def _identity_bind(op: Compute) -> tuple[tuple[str, Affine], ...]:
    return tuple((v, Affine.var(v)) for v in op.domain_vars + op.reduce_vars)


def stat_binding(space_vars: dict[str, int], index: tuple[Affine, ...], stat: Compute) -> tuple[dict[str, Affine] | None, str]:
    """Bind a reduction's variables into a row space from one access of it.

    Legal when the access reads each of the stat's dimensions either at a plain space variable
    or at 0 (a broadcast, extent-1 dimension), and exactly one space variable j (not used by
    the access) has the stat's reduction extent: the stat is then a per-row value and its
    r0 runs along j. Returns (binding, "") or (None, reason).
    """
    if why_not_online_reducible(stat) is not None:
        return None, f"{stat.out!r} is not a single-axis reduction"
    used = set()
    for ix in index:
        if isinstance(ix, Indirect):
            return None, f"access of {stat.out!r} is indirect (data-dependent)"
        if ix.const or len(ix.terms) > 1 or any(c != 1 for _, c in ix.terms):
            return None, f"access of {stat.out!r} is not a plain variable per dimension"
        used.update(v for v, _ in ix.terms)
    free = [v for v, n in space_vars.items() if v not in used and n > 1]
    if len(free) != 1 or space_vars[free[0]] != stat.reduce[0]:
        return None, f"{stat.out!r} is not broadcast along exactly one variable of its reduction extent"
    binding = dict(zip(stat.domain_vars, index))
    binding["r0"] = Affine.var(free[0])
    return binding, ""


def _row_group(anchor: Compute, producers: dict[str, Compute], records: list[Rewrite]) -> list[tuple[Compute, dict[str, Affine]]]:
    """The stats the anchor can compute in its own pass, innermost first, with their bindings."""
    space = anchor.extents()
    row_var: Affine | None = None
    members: list[tuple[Compute, dict[str, Affine]]] = []
    frontier: list[tuple[Compute, dict[str, Affine]]] = [(anchor, {v: Affine.var(v) for v in anchor.extents()})]
    while frontier:
        op, bind = frontier.pop()
        for ld in loads(op.body):
            stat = producers.get(ld.buffer)
            if (stat is None or stat.combiner == "map" or contraction(stat) is not None
                    or _window_family(stat) is not None or any(m is stat for m, _ in members)):
                continue
            index = tuple(a.substitute(bind) for a in ld.index)
            binding, why = stat_binding(space, index, stat)
            if binding is not None and row_var is not None and binding["r0"] != row_var:
                binding, why = None, f"{stat.out!r} reduces along another variable than the group's row"
            if binding is None:
                records.append(Rewrite(ROW_RULE, stat.out, False, why))
                continue
            row_var = binding["r0"]
            members.append((stat, binding))
            frontier.append((stat, binding))
    return members


def _prologue(anchor: Compute, stats: list[tuple[Compute, dict[str, Affine]]], computes: list[Compute],
              taken: set[str], records: list[Rewrite]) -> Compute | None:
    """The stored element-wise map a row pass reads as its row (h = x + attn_out before a
    norm), to compute once inside the pass, store for its other consumers and normalize from
    registers (rule PROLOGUE_RULE), or None with the reason recorded.

    Legal when the map has the row's shape and every member reads it at the element the pass
    is at; it reads no reduction (it is computed before any statistic); the members read none
    of its inputs (after the map is written, nothing in the pass re-reads them, so the map may
    even overwrite one in place); and everything the pass reads is defined before the map
    (no kernel between them can need the map's store first).
    """
    group = [s for s, _ in stats] + [anchor]
    bodies = [(s.body, b) for s, b in stats] + [(anchor.body, {v: Affine.var(v) for v in anchor.domain_vars})]
    ident = tuple(Affine.var(v) for v in anchor.domain_vars)
    order = {op.out: i for i, op in enumerate(computes)}
    producers = {op.out: op for op in computes}
    seen: list[str] = []
    for body, bind in bodies:
        for ld in loads(body):
            pro = producers.get(ld.buffer)
            if pro is None or pro in group or pro.out in seen or pro.combiner != "map" or contraction(pro):
                continue
            seen.append(pro.out)
            reads = [tuple(a.substitute(b) for a in x.index) for body2, b in bodies for x in loads(body2)
                     if x.buffer == pro.out]
            inputs = {x.buffer for x in loads(pro.body)}
            shared = sorted({x for x in inputs if x in producers} & {x.buffer for b2, _ in bodies for x in loads(b2)})
            why = None
            if pro.out in taken:
                why = "it is computed by another kernel"
            elif pro.type.shape != anchor.type.shape or any(r != ident for r in reads):
                why = f"the row pass of {anchor.out!r} reads it at other elements than the one it is at"
            elif any(producers[x].combiner != "map" for x in inputs if x in producers):
                why = "it reads a reduction, which the row pass could only have after its statistics"
            elif shared:
                why = f"the row pass also reads its input(s) {shared}"
            elif any(order[x.buffer] > order[pro.out] for body2, _ in bodies + [(pro.body, {})]
                     for x in loads(body2) if x.buffer in order and producers[x.buffer] not in group
                     and x.buffer != pro.out):
                why = "the row pass reads a value computed after it"
            if why:
                records.append(Rewrite(PROLOGUE_RULE, pro.out, False, why))
                continue
            records.append(Rewrite(PROLOGUE_RULE, pro.out, True, f"computed once in the row pass of {anchor.out!r}, "
                                   "stored for its other consumers and normalized from registers", pro.type.nbytes))
            return pro
    return None


def form_kernels(p: Program, target: str) -> Plan:
    computes = [op for op in p.ops if isinstance(op, Compute)]
    producers = {op.out: op for op in computes}
    users: dict[str, int] = {}
    for op in p.ops:
        names = [ld.buffer for ld in loads(op.body)] if isinstance(op, Compute) else [op.source]
        for n in set(names):
            users[n] = users.get(n, 0) + 1
    records = list(p.rewrites)
    taken: set[str] = set()
    groups: dict[str, Kernel] = {}   # keyed by the compute whose position launches it

    # Streaming attention first (passes/streaming_attention.py): it claims scores, softmax and P·V.
    for kern in attention_kernels(p, records):
        groups[kern.ops[-1].out] = kern
        taken.update(kern.outs)
    taken.update(_unread_after_attention(p, computes, groups))

    # Row groups first, from consumers back to producers, so a map claims its stats.
    for op in reversed(computes):
        if op.out in taken or op.combiner != "map" or contraction(op):
            continue
        members = [(s, b) for s, b in _row_group(op, producers, records) if s.out not in taken]
        if not members:
            continue
        stats = sorted(members, key=lambda m: computes.index(m[0]))
        back = _reads_back(tuple(s for s, _ in stats) + (op,), p)
        if back:
            records.append(Rewrite(ROW_RULE, op.out, False, back))
            continue
        pro = _prologue(op, stats, computes, taken, records)
        back = _reads_back((pro,) + tuple(s for s, _ in stats) + (op,), p) if pro else None
        if pro and back:
            records[-1] = Rewrite(PROLOGUE_RULE, pro.out, False, back)   # in place of its "applied"
            pro = None
        ops = ((pro,) if pro else ()) + tuple(s for s, _ in stats) + (op,)
        binds = (((_identity_bind(pro),) if pro else ()) + tuple(tuple(sorted(b.items())) for _, b in stats)
                 + (_identity_bind(op),))
        stores = tuple(s.out for s, _ in stats if s.out in p.outputs or users.get(s.out, 0) > _uses_inside(s, ops))
        taken.update(o.out for o in ops)
        records.append(Rewrite(ROW_RULE, op.out, True, f"{len(stats)} reduction(s) computed per row in one pass",
                               sum(2 * s.type.nbytes for s, _ in stats if s.out not in stores)))
        rules = (ROW_RULE,) + ((PROLOGUE_RULE,) if pro else ())
        groups[op.out] = Kernel("", "row_reduce", ops, binds, ((pro.out,) if pro else ()) + stores + (op.out,),
                                tuple(dict.fromkeys(pr for o in ops for pr in properties(o))), rules)

    for op in computes:
        if op.out in taken:
            continue
        c = contraction(op)
        family = "gemm" if c is not None else _window_family(op)
        if family is None:
            family = "pointwise" if op.combiner == "map" else "row_reduce"
            groups[op.out] = Kernel("", family, (op,), (_identity_bind(op),), (op.out,), properties(op))
            taken.add(op.out)
            continue
        ops, rewrites, store = (op,), (), op.out
        epi = _epilogue(op, computes, users, p.outputs, taken)
        rule = WINDOW_EPILOGUE_RULE if family == "window" else EPILOGUE_RULE
        if isinstance(epi, Compute):
            ops, rewrites, store = (op, epi), (rule,), epi.out
            if epi.type.shape != op.type.shape:    # gated_pairs: one value per column pair; or rotary
                rewrites += (GATE_RULE,) if gated_pairs(op, epi) is not None else (ROTARY_RULE,)
            taken.add(epi.out)
            records.append(Rewrite(rule, op.out, True, f"{epi.out!r} applied to the accumulator in registers",
                                   2 * op.type.nbytes))
        elif epi:
            records.append(Rewrite(rule, op.out, False, epi))
        groups[op.out] = Kernel("", family, ops, tuple(_identity_bind(o) for o in ops), (store,),
                                tuple(dict.fromkeys(pr for o in ops for pr in properties(o))), rewrites)
        taken.add(op.out)

    views = tuple(op for op in p.ops if isinstance(op, View))
    ordered = _topological([groups[op.out] for op in computes if op.out in groups], views)
    kernels = tuple(k.replace(name=f"k{i}") for i, k in enumerate(ordered))
    return Plan(p.name, target, p.inputs, p.weights, kernels, views, p.outputs, (), tuple(records))


def _unread_after_attention(p: Program, computes: list[Compute], attention: dict[str, Kernel]) -> set[str]:
    """Computes nothing reads any more once the attention kernels restated what they read (a
    cache mask recomputed inside the kernel, [Note: live keys]): no kernel is formed for them."""
    inside = {o for k in attention.values() for o in k.outs}
    dead: set[str] = set()
    while True:
        read = {ld.buffer for k in attention.values() for op in k.ops for ld in loads(op.body)}
        read |= {ld.buffer for op in computes if op.out not in inside | dead for ld in loads(op.body)}
        read |= {op.source for op in p.ops if isinstance(op, View)}
        more = {op.out for op in computes if op.out not in inside | dead | read | set(p.outputs)}
        if not more:
            return dead
        dead |= more


def _reads_back(ops: tuple[Compute, ...], p: Program) -> str | None:
    """Why `ops` cannot be one kernel, where a value they read from outside is itself computed
    from one of their results (a row max that a column sum reads, and the row pass of the max
    then reads the sum): the kernel would have to run both before and after that value's
    producer. None when no such value exists."""
    inside = {o.out for o in ops}
    reads = {op.out: [ld.buffer for ld in loads(op.body)] if isinstance(op, Compute) else [op.source]
             for op in p.ops}
    stack = [(name, name) for name in sorted({ld.buffer for o in ops for ld in loads(o.body)} - inside)]
    seen: set[str] = set()
    while stack:
        name, read = stack.pop()
        if name in seen:
            continue
        seen.add(name)
        for r in reads.get(name, ()):
            if r in inside:
                return f"it reads {read!r}, which is computed from {r!r}, a value of the same pass"
            stack.append((r, read))
    return None


def _topological(kernels: list[Kernel], views: tuple[View, ...]) -> list[Kernel]:
    """Order kernels so each runs after the kernels whose stores it reads; ties keep program order."""
    writer = {s: i for i, k in enumerate(kernels) for s in k.stores}
    base = view_base(views)
    deps = []
    for i, k in enumerate(kernels):
        reads = {base(ld.buffer) for op in k.ops for ld in loads(op.body)} - k.outs
        deps.append({writer[r] for r in reads if r in writer and writer[r] != i})
    done: list[int] = []
    while len(done) < len(kernels):
        i = next(i for i in range(len(kernels)) if i not in done and deps[i] <= set(done))
        done.append(i)
    return [kernels[i] for i in done]


def _uses_inside(stat: Compute, ops: tuple[Compute, ...]) -> int:
    return sum(1 for o in ops if any(ld.buffer == stat.out for ld in loads(o.body)))


def _epilogue(mm: Compute, computes: list[Compute], users: dict[str, int], outputs: tuple[str, ...],
              taken: set[str]) -> Compute | str | None:
    """The consumer to absorb, a reason not to, or None when there is no candidate at all."""
    consumers = [c for c in computes if any(ld.buffer == mm.out for ld in loads(c.body))]
    if mm.out in outputs:
        return "the contraction's result is a graph output"
    if users.get(mm.out, 0) != 1 or len(consumers) != 1:
        return None if not consumers else "the result has more than one consumer"
    (c,) = consumers
    if c.out in taken or c.combiner != "map" or (c.type.shape != mm.type.shape and gated_pairs(mm, c) is None
                                                  and rotary_pairs(mm, c) is None):
        return f"consumer {c.out!r} is not an element-wise map over the same shape"
    reads = [ld for ld in loads(c.body) if ld.buffer == mm.out]
    if c.type.shape == mm.type.shape and not all(is_identity_access(ld, mm.type.shape) for ld in reads):
        return f"consumer {c.out!r} reads the result at other positions than its own"
    if computes.index(c) != computes.index(mm) + 1 and _reads_between(mm, c, computes):
        return f"consumer {c.out!r} reads a value computed after the contraction"
    return c


def _reads_between(mm: Compute, c: Compute, computes: list[Compute]) -> bool:
    between = {o.out for o in computes[computes.index(mm) + 1: computes.index(c)]}
    return any(ld.buffer in between for ld in loads(c.body))


def _window_family(op: Compute) -> str | None:
    """"conv" for a contraction over several axes, "window" for any other reduction over several
    axes or through a guarded load; None for what the other families take."""
    if op.combiner == "map":
        return None
    if implicit_gemm(op) is not None:
        return "conv"
    if len(op.reduce) > 1 or any(ld.fill is not None for ld in loads(op.body)):
        return "window"
    return None
