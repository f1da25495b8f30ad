"""streaming_attention: the rule "softmax(q@kᵀ·s)@v => streaming_attention", applied by
form_kernels before any other grouping (property `weighted_streaming_reduction`).

Preconditions: inline_producers ran, so the scaled (and masked) scores are inlined into the
softmax's two reductions and its map. The rule matches, in the Lowered IR,

    S = sum_d Q·K          (a tile-compatible contraction; any affine accesses)
    P = softmax_j(F(S[.., i, j], other loads))   (as `lower` states Softmax: max, sum, map)
    O = sum_j P·V

and, when S, the statistics and P have no other reader and none is a graph output, builds ONE
`attention` kernel of the five computes that stores only O: the S×S scores and probabilities
never reach memory. A pure layout map of O (the Transpose back to [B,S,H,D] that torch exports
before its Reshape) is absorbed as a permuted store. A constant additive mask that is causal
is recorded as such: codegen skips the key tiles above the diagonal and never reads it. A
cache mask "slot j <= position P[i]" (a stored condition B over a constant slot table) is
restated inside the kernel, and the kernel stops its key loop after the block's largest P
([Note: live keys] in ir/properties.py): a decode step reads only the live part of its cache.

    %s: f16[2,8,8] = sum[4] mul(load(%q, [i0, i1, r0]), load(%k, [i0, i2, r0]))
    %p.max: f16[2,8,1] = max[8] mul(load(%s, [i0, i1, r0]), 0.5)
    %p.sum: f16[2,8,1] = sum[8] exp(sub(mul(load(%s, [i0, i1, r0]), 0.5), load(%p.max, [i0, i1, 0])))
    %p: f16[2,8,8] = map div(exp(sub(mul(load(%s, [i0, i1, i2]), 0.5), load(%p.max, [i0, i1, 0]))), load(%p.sum, [i0, i1, 0]))
    %o: f16[2,8,4] = sum[8] mul(load(%p, [i0, i1, r0]), load(%v, [i0, r0, i2]))
  becomes
    kernel k0 attention { the five computes; bind %s {i0: i0, i1: i1, i2: r0, r0: d} ...; store %o }
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterator, Mapping

from aicfc.ir.decision import Kernel
from aicfc.ir.lowered import (Affine, Compute, Expr, Load, Program, Rewrite, indirect_dims, map_loads, reader_names,
                              substitute)
from aicfc.ir.properties import WSR, Attention, causal_logits, live_key_mask, properties, streaming_attention
from aicfc.passes.rule import Rule

RULE = "softmax(q@kᵀ·s)@v => streaming_attention"
CAUSAL_RULE = "causal constant mask => skip key tiles above the diagonal"
LIVE_RULE = "mask slot[j] <= position[i] => key loop bounded by the live length read on the device"
STORE_RULE = "attention + layout map => permuted store"
GQA_RULE = "attention(repeat_kv(k), repeat_kv(v)) => grouped heads read in place"   # read_grouped_heads


@dataclass(frozen=True)
class Context:
    program: Program
    producers: dict[str, Compute]
    readers: dict[str, list[str]]     # buffer -> the ops (computes and views) that read it


def _check(att: Attention | str, ctx: Context) -> str | None:
    if isinstance(att, str):
        return att
    outputs = ctx.program.outputs
    roles = (("scores", att.scores, {att.row_max.out, att.row_sum.out, att.probs.out}),
             ("softmax statistics", att.row_max, {att.row_sum.out, att.probs.out}),
             ("softmax statistics", att.row_sum, {att.probs.out}),
             ("probabilities", att.probs, {att.out.out}))
    for what, op, inside in roles:
        if op.out in outputs:
            return f"the {what} are also a graph output"
        other = [r for r in ctx.readers.get(op.out, []) if r not in inside]
        if other:
            return f"the {what} are read by another op ({other[0]!r})"
    return None


def _layout_map(att: Attention, ctx: Context) -> Compute | None:
    """O's only reader when it is a map that only permutes O's dimensions (a transpose)."""
    o = att.out
    readers = ctx.readers.get(o.out, [])
    if o.out in ctx.program.outputs or len(readers) != 1 or readers[0] not in ctx.producers:
        return None
    c = ctx.producers[readers[0]]
    ld = c.body
    if c.combiner != "map" or not isinstance(ld, Load) or ld.buffer != o.out:
        return None
    if indirect_dims(ld) or any(len(a.terms) != 1 or a.const or a.terms[0][1] != 1 for a in ld.index):
        return None
    if sorted(a.terms[0][0] for a in ld.index) != sorted(c.domain_vars):
        return None
    return c


def _restate_mask(att: Attention, ctx: Context, weights: Mapping[str, Any]) -> Attention | None:
    """`att` with its cache mask B = slot[j] <= P[i] recomputed where the softmax reads it
    ([Note: live keys]), so the kernel reads P itself; None when the mask is not of that form."""
    found = live_key_mask(att, ctx.producers, weights)
    if found is None:
        return None
    mask, prod = found

    def restate(ld: Load) -> Expr:
        if ld.buffer != mask.buffer:
            return ld
        return substitute(prod.body, dict(zip(prod.domain_vars, ld.index)))  # type: ignore[arg-type]
    ops = {op.out: Compute(op.out, op.type, op.combiner, op.reduce, map_loads(op.body, restate),
                           tuple(dict.fromkeys(op.origin + prod.origin)))
           for op in (att.row_max, att.row_sum, att.probs)}
    restated = streaming_attention(att.out, {**ctx.producers, **ops})
    return restated if isinstance(restated, Attention) else None


class _Arrays(Mapping[str, Any]):
    """The program's constants as arrays, each read when first looked up: the mask tests consult a
    mask table or two, not every weight of the model (read for each attention, a 20-layer 1 B
    Llama's 4 GB of fp32 weights made its decode plan compile in 76 s, 31 s without, on 2 CPUs)."""

    def __init__(self, weights) -> None:
        self._weights = {w.name: w for w in weights}
        self._read: dict[str, Any] = {}

    def __getitem__(self, name: str) -> Any:
        if name not in self._read:
            self._read[name] = self._weights[name].array()
        return self._read[name]

    def __contains__(self, name: object) -> bool:
        return name in self._weights

    def __iter__(self) -> Iterator[str]:
        return iter(self._weights)

    def __len__(self) -> int:
        return len(self._weights)


def _build(att: Attention, ctx: Context) -> tuple[Kernel, list[Rewrite]]:
    weights = _Arrays(ctx.program.weights)
    causal = causal_logits(att, weights) is not None
    live = None if causal else _restate_mask(att, ctx, weights)
    if live is not None:
        att = live
    to_out = dict(att.to_out)
    rank = len(att.probs.type.shape)
    stat = {f"i{d}": to_out[f"i{d}"] for d in range(rank - 1)} | {f"i{rank - 1}": Affine(), "r0": Affine.var("r0")}
    binds = [to_out | {"r0": Affine.var("d")}, stat, stat, to_out,
             {v: Affine.var(v) for v in att.out.domain_vars + ("r0",)}]
    ops: list[Compute] = list(att.ops)
    rewrites = [RULE]
    saved = 2 * (att.scores.type.nbytes + att.probs.type.nbytes)
    records = [Rewrite(RULE, att.out.out, True,
                       "the scores, softmax and P·V stream through one kernel; the scores and "
                       "probabilities are never stored", saved)]
    layout = _layout_map(att, ctx)
    if layout is not None:
        # layout[c...] = O[idx]: O's dimension p holds layout's variable named by idx[p].
        ops.append(layout)
        binds.append({a.terms[0][0]: Affine.var(f"i{p}") for p, a in enumerate(layout.body.index)})  # type: ignore[union-attr]
        rewrites.append(STORE_RULE)
        records.append(Rewrite(STORE_RULE, layout.out, True, f"{att.out.out!r} stored straight into "
                               f"{layout.out!r}'s layout", 2 * att.out.type.nbytes))
    if any(r.rule == GQA_RULE and r.applied and r.target == att.out.out for r in ctx.program.rewrites):
        rewrites.append(GQA_RULE)    # recorded by read_grouped_heads on the Lowered IR
    if live is not None:
        rewrites.append(LIVE_RULE)
        records.append(Rewrite(LIVE_RULE, att.out.out, True,
                               "the mask hides every cache slot after the query's position: the kernel reads the "
                               "positions and stops its key loop after the block's last live key"))
    if causal:   # (a restated live-key mask is never the causal constant: only a causal one is left as it is)
        rewrites.append(CAUSAL_RULE)
        records.append(Rewrite(CAUSAL_RULE, att.out.out, True,
                               "mask is causal: key tiles above the diagonal skipped, the mask is not read"))
    props = tuple(dict.fromkeys((WSR,) + tuple(pr for op in ops for pr in properties(op))))
    kernel = Kernel("", "attention", tuple(ops), tuple(tuple(sorted(b.items())) for b in binds),
                    (ops[-1].out,), props, tuple(rewrites))
    return kernel, records


STREAMING_ATTENTION = Rule(RULE, lambda op, ctx: streaming_attention(op, ctx.producers), _check, _build)


def attention_kernels(p: Program, records: list[Rewrite]) -> list[Kernel]:
    """The `attention` kernels of `p`, one per matched P·V contraction; appends to `records`
    what was applied and what was declined, with the reason."""
    producers = {op.out: op for op in p.ops if isinstance(op, Compute)}
    readers = reader_names(p.ops)
    ctx = Context(p, producers, readers)
    rule = STREAMING_ATTENTION
    kernels, taken = [], set()
    for op in p.ops:
        if not isinstance(op, Compute) or op.combiner != "sum":
            continue
        m = rule.match(op, ctx)
        if m is None:
            continue
        why = rule.check(m, ctx)
        if why is None and any(o.out in taken for o in m.ops):
            why = "its computes belong to another attention kernel"
        if why is not None:
            records.append(Rewrite(rule.name, op.out, False, why))
            continue
        kernel, recs = rule.build(m, ctx)
        taken.update(kernel.outs)
        kernels.append(kernel)
        records.extend(recs)
    return kernels


