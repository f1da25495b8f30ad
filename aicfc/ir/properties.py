"""Memory properties of lowered computes, each with its legality check in code.

A property is a fact about how a computation touches memory that makes a rewrite legal
(`../docs` and the user's notes call this the memory-centric IR):

- `tile_compatible_compute`: a sum-reduction of a product of two loads (affine accesses with
  positive strides), each indexed by a subset of the output variables plus the reduction
  variable: partial sums over K-tiles add up (associativity of +), so the loop nest tiles
  into on-chip blocks (GEMM).
- `online_reducible_norm`: a single-axis sum or max whose partial results merge (both are
  associative and commutative), so a row's statistics can be reduced by a block of threads
  and consumed in the same kernel. Statistics that read other statistics (a variance reads
  the mean, a sum of exponentials the max) stream in one pass only where their partial states
  merge (`online_merges`: Chan's mean/M2 merge, the rescaled sum of a running max).
- `rematerializable_intermediate`: a map with no reduction: pure, deterministic, no side
  effects, so a consumer may recompute it from its inputs instead of loading it.
- `weighted_streaming_reduction`: a contraction over j of a row softmax over j with values,
  softmax(F(q@kᵀ))@v: rescaling invariance lets key tiles stream through one running max and
  rescaled sums, so the scores are never stored (`streaming_attention`).

Each check returns None when the property holds, or the reason it does not.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np

from aicfc.ir.memo import by_identity
from aicfc.ir.lowered import Affine, Call, Compute, Const, Expr, Load, count_ops, indirect_dims, loads, substitute

TILE = "tile_compatible_compute"
ONLINE = "online_reducible_norm"
REMAT = "rematerializable_intermediate"


@dataclass(frozen=True, slots=True)
class Contraction:
    """out[batch..., m, n] = sum_k a[...] * b[...]: which variable plays which role."""

    a: Load
    b: Load
    m: str | None   # output variable only `a` uses (None for a 1-D `a`)
    n: str | None   # output variable only `b` uses (None for a 1-D `b`)
    batch: tuple[str, ...]


@by_identity   # the planner asks once per candidate about the same few ops
def contraction(op: Compute) -> Contraction | None:
    if why_not_tile_compatible(op) is not None:
        return None
    a, b = op.body.args  # type: ignore[union-attr]
    va = {v for ix in a.index for v, _ in ix.terms} - {"r0"}
    vb = {v for ix in b.index for v, _ in ix.terms} - {"r0"}
    only_a, only_b = va - vb, vb - va
    # The innermost free variable of each operand is its m (n); any outer ones (a broadcast
    # batch, e.g. [2,3,M,K] @ [K,N]) become batch variables the other operand ignores.
    order = {v: i for i, v in enumerate(op.domain_vars)}
    m = max(only_a, key=order.__getitem__, default=None)
    n = max(only_b, key=order.__getitem__, default=None)
    batch = tuple(v for v in op.domain_vars if v not in (m, n))
    return Contraction(a, b, m, n, batch)


def _two_affine_loads(op: Compute) -> tuple[Load, Load] | str:
    """The operands of a body that multiplies two loads with affine indices, or why it is not one."""
    body = op.body
    if not (isinstance(body, Call) and body.fn == "mul" and all(isinstance(x, Load) for x in body.args)):
        return "body is not a product of two loads"
    a, b = body.args
    if indirect_dims(a) or indirect_dims(b):
        return "an operand is read through an indirect (data-dependent) index; tiles need affine accesses"
    return a, b


@by_identity
def why_not_tile_compatible(op: Compute) -> str | None:
    if op.combiner != "sum" or len(op.reduce) != 1:
        return "not a single-axis sum reduction"
    operands = _two_affine_loads(op)
    if isinstance(operands, str):
        return operands
    a, b = operands
    # Any affine access with positive strides tiles: the tile loaders address operands by their
    # flat offsets, so a folded split view (h·D + d) or a slice (i + offset) is just strides.
    for ld in (a, b):
        for ix in ld.index:
            if ix.const < 0 or any(c <= 0 for _, c in ix.terms):
                return f"access of {ld.buffer!r} has a negative stride or offset"
    va = {v for ix in a.index for v, _ in ix.terms}
    vb = {v for ix in b.index for v, _ in ix.terms}
    if "r0" not in va or "r0" not in vb:
        return "the reduction variable does not index both operands"
    used = va | vb
    if any(v not in used for v in op.domain_vars if op.extents()[v] > 1):
        return "an output variable indexes neither operand"
    return None


@dataclass(frozen=True, slots=True)
class ImplicitGemm:
    """out[batch.., m.., n..] = sum over k.. of a[...]·b[...] with several reduction variables
    (a convolution: m = (n, oh, ow), n = the output channel, k = (c, kh, kw)). The m (n, k)
    variables flatten row-major into one GEMM dimension; codegen splits a flat index back by
    division (the im2col decomposition), so the accesses need only be affine in the variables."""

    a: Load                 # the operand of the m variables; the only one that may be guarded
    b: Load                 # the operand of the n variables
    m: tuple[str, ...]      # output variables only `a` reads, outer to inner
    n: tuple[str, ...]      # output variables only `b` reads
    batch: tuple[str, ...]  # the other output variables (both operands', or extent 1)


def why_not_implicit_gemm(op: Compute) -> str | None:
    """`tile_compatible_compute` over several reduction axes: partial sums over any K-tile of the
    flattened (k..) range add up (associativity of +) and every access is affine, so the nest
    tiles as a GEMM whose operand tiles are gathered from their (guarded) accesses."""
    if op.combiner != "sum" or len(op.reduce) < 2:
        return "not a sum over several axes"
    operands = _two_affine_loads(op)
    if isinstance(operands, str):
        return operands
    a, b = operands
    if b.fill is not None:
        a, b = b, a
    if b.fill is not None:
        return "both operands are guarded loads"
    va = {v for ix in a.index for v, _ in ix.terms}
    vb = {v for ix in b.index for v, _ in ix.terms}
    ext = op.extents()
    if any(v not in va | vb for v in op.domain_vars if ext[v] > 1):
        return "an output variable indexes neither operand"
    if not [v for v in op.domain_vars if v in va - vb and ext[v] > 1]:
        a, b, va, vb = b, a, vb, va
    if a.fill is None and b.fill is not None:
        return "the guarded operand is not the one of the m variables"
    if not [v for v in op.domain_vars if v in va - vb and ext[v] > 1] or not [v for v in op.domain_vars
                                                                            if v in vb - va and ext[v] > 1]:
        return "no output variable is read by one operand only on each side (a direct window, not a GEMM)"
    return None


def implicit_gemm(op: Compute) -> ImplicitGemm | None:
    if why_not_implicit_gemm(op) is not None:
        return None
    a, b = op.body.args  # type: ignore[union-attr]
    if b.fill is not None:
        a, b = b, a
    ext = op.extents()
    va = {v for ix in a.index for v, _ in ix.terms}
    vb = {v for ix in b.index for v, _ in ix.terms}
    if not [v for v in op.domain_vars if v in va - vb and ext[v] > 1]:
        a, b, va, vb = b, a, vb, va
    m = tuple(v for v in op.domain_vars if v in va - vb and ext[v] > 1)
    n = tuple(v for v in op.domain_vars if v in vb - va and ext[v] > 1)
    return ImplicitGemm(a, b, m, n, tuple(v for v in op.domain_vars if v not in m + n))


def why_not_online_reducible(op: Compute) -> str | None:
    if op.combiner not in ("sum", "max"):
        return "not a reduction"
    if len(op.reduce) != 1:
        return "reduces over more than one axis"
    return None


def why_not_rematerializable(op: Compute) -> str | None:
    # Every function in lowered.FNS is pure and deterministic; only reductions are excluded,
    # since recomputing one repeats a whole loop.
    return None if op.combiner == "map" else "a reduction, not an element-wise map"


def properties(op: Compute) -> tuple[str, ...]:
    found = []
    if why_not_tile_compatible(op) is None or implicit_gemm(op) is not None:
        found.append(TILE)
    elif why_not_online_reducible(op) is None:
        found.append(ONLINE)
    if why_not_rematerializable(op) is None:
        found.append(REMAT)
    return tuple(found)


def reads_per_element(producer: Compute, consumer: Compute) -> float:
    """How many times the consumer reads each element of the producer (recompute factor)."""
    n_loads = sum(1 for ld in loads(consumer.body) if ld.buffer == producer.out)
    iterations = consumer.type.numel
    for r in consumer.reduce:
        iterations *= r
    return n_loads * iterations / max(1, producer.type.numel)


def recompute_cost(op: Compute) -> int:
    return count_ops(op.body) + len(loads(op.body))


def gated_pairs(mm: Compute, epi: Compute) -> str | None:
    """The contraction's n variable when the map `epi` combines column pairs of `mm`: its shape
    is mm's with n's extent halved, and it reads mm only at its own index with n at 2n or
    2n + 1 (passes/interleave_gates.py puts a gate and its up value there), so each element
    is a function of the accumulators of one thread's two adjacent columns; None otherwise."""
    c = contraction(mm)
    if c is None or c.n is None or epi.combiner != "map":
        return None
    d = mm.domain_vars.index(c.n)
    shape = mm.type.shape
    if shape[d] % 2 or epi.type.shape != shape[:d] + (shape[d] // 2,) + shape[d + 1:]:
        return None
    reads = [ld for ld in loads(epi.body) if ld.buffer == mm.out]
    pair = {Affine.of({c.n: 2}, t) for t in (0, 1)}
    for ld in reads:
        if ld.fill is not None or indirect_dims(ld) or ld.index[d] not in pair:
            return None
        if not is_identity_access(Load(ld.buffer, ld.index[:d] + (Affine.var(c.n),) + ld.index[d + 1:]), epi.type.shape):
            return None
    return c.n if reads else None


# [Note: rotary bands] passes/rotary_epilogue.py tests a head's range (and a half's) by reading a
# bool weight of ones at an offset (1 inside, the fill 0 outside, as for Trilu). Its values are
# known: codegen emits such a read as its guard alone, never a memory read. The weights are
# named by `rotary_band_name`; `is_band_of_ones` recognises them, and the bands with which
# passes/inline_producers.py tests a Concat term's range ([Note: a table inlined through a Concat's
# guard]), named by `guard_band_name`, too.
ROTARY_BAND = ".rotary.band."
GUARD_BAND = ".guard.band."


def rotary_band_name(base: str, tag: str) -> str:
    return f"{base}{ROTARY_BAND}{tag}"


def guard_band_name(base: str, tag: str) -> str:
    return f"{base}{GUARD_BAND}{tag}"


def is_band_of_ones(name: str, dtype: str) -> bool:
    """Whether `name` is a band of ones made by passes/rotary_epilogue.py or passes/inline_producers.py
    ([Note: rotary bands])."""
    return dtype == "bool" and (ROTARY_BAND in name or GUARD_BAND in name)


@dataclass(frozen=True, slots=True)
class Rotary:
    """A map over a contraction's result viewed as [lead.., G heads, 2 halves, half] (its n
    dimension, the last, split into digits): `head` = 2·half columns a head; `g`, `t`, `j`
    the map's digit variables (passes/rotary_epilogue.py makes such maps)."""

    head: int
    half: int
    g: str
    t: str
    j: str

    def half_of(self, ld: Load) -> int | None:
        """For a read of the contraction in the map: None when it reads the element's own
        column (half digit t itself), else the half digit u it reads at every t (column
        g·head + u·half + j): the element's own value where t = u, its rotation partner's
        (the other half, same j: one thread's accumulators, see codegen/gemm.py) elsewhere."""
        ix = ld.index[-1]
        return None if ix.coeff(self.t) else ix.const // self.half


def rotary_pairs(mm: Compute, epi: Compute) -> Rotary | None:
    """The split when the map `epi` reads the contraction `mm` only at column g·head + u·half + j
    of its own row, u = t (its own column) or a constant 0 or 1 (a column of the same head and
    j, in one or the other half): rotary position embedding's x·cos + rotate_half(x)·sin of
    the q/k heads, their V columns copied (a head whose elements read only their own column).
    The map's shape is mm's with n (its last variable) split into (G, 2, half); None otherwise."""
    c = contraction(mm)
    if c is None or c.n != mm.domain_vars[-1] or epi.combiner != "map" or epi.reduce:
        return None
    shape, out = mm.type.shape, epi.type.shape
    if len(out) != len(shape) + 2 or out[:-3] != shape[:-1] or out[-2] != 2 or out[-3] * 2 * out[-1] != shape[-1]:
        return None
    half = out[-1]
    head = 2 * half
    g, t, j = epi.domain_vars[-3:]
    lead = [Affine.var(v) if n > 1 else None for v, n in zip(epi.domain_vars, shape[:-1])]
    reads = [ld for ld in loads(epi.body) if ld.buffer == mm.out]
    for ld in reads:
        if ld.fill is not None or indirect_dims(ld) or len(ld.index) != len(shape):
            return None
        if any(not (a == o or (o is None and a == Affine())) for a, o in zip(ld.index[:-1], lead)):
            return None
        ix = ld.index[-1]
        rest = Affine.of({v: c for v, c in ix.terms if v not in (t,)}, 0)
        if rest != Affine.of({g: head, j: 1}) or ix.coeff(t) not in (0, half):
            return None
        if (ix.coeff(t) and ix.const) or ix.const not in (0, half):
            return None
    return Rotary(head, half, g, t, j) if reads else None


def is_identity_access(ld: Load, shape: tuple[int, ...]) -> bool:
    """Whether `ld` reads each element at its own index in a domain of `shape`. A dimension of
    extent 1 has one index, so reading it at 0 (as lowering writes a broadcast) is the same."""
    return len(ld.index) == len(shape) and all(
        ix == Affine.var(f"i{k}") or (n == 1 and ix == Affine()) for k, (ix, n) in enumerate(zip(ld.index, shape)))


# ---------------------------------------------------------------- online merges (online_reducible_norm)

# A mean's scale must be 1/n for the (count, mean, M2) state to give it back: |c·n - 1| below this.
MEAN_SCALE_TOLERANCE = 1e-6


@dataclass(frozen=True, slots=True)
class Merge:
    """How some of a row's statistics update in one streaming pass: each thread keeps a partial
    state of the elements it read, and states of disjoint parts of the row merge, in any order
    (the update is associative), into the state of the whole row.

    - "plain": a sum or a max of an expression that reads no statistic; partials add (or max).
    - "softmax": a max M of some a, and sums T_i whose only use of M is one factor exp(e - M):
      state (m, t_i); merged m = max(m1, m2), t_i = t1·e^(m1 - m) + t2·e^(m2 - m). Legal by
      rescaling invariance: Σ g·e^(e - M) = e^(m - M)·Σ g·e^(e - m) for any m, so a sum taken
      against a running maximum is exact once rescaled to the final one.
    - "welford": a mean M = Σ a·c with c = 1/n and one sum V = Σ (a - M)²·c2 of the same a:
      state (count, mean, M2); merged (Chan et al.) n = n1 + n2, δ = mean2 - mean1,
      mean = mean1 + δ·n2/n, M2 = M2₁ + M2₂ + δ²·n1·n2/n; at the end M = mean, V = M2·c2.
    """

    kind: str
    stats: tuple[str, ...]          # the statistics it yields, the one others read first
    operand: Expr | None = None     # welford: a, over the row's variables
    scale: float = 1.0              # welford: c2


def _split_scale(e: Expr) -> tuple[Expr, float] | None:
    """(x, c) when e is x·c with c a literal (either order)."""
    if isinstance(e, Call) and e.fn == "mul":
        a, b = e.args
        if isinstance(b, Const):
            return a, b.value
        if isinstance(a, Const):
            return b, a.value
    return None


def _exp_factor(e: Expr, m: str) -> bool:
    """e is a product whose only use of statistic `m` is one factor exp(x - m)."""
    if isinstance(e, Call) and e.fn == "exp":
        x = e.args[0]
        return (isinstance(x, Call) and x.fn == "sub" and isinstance(x.args[1], Load) and x.args[1].buffer == m
                and all(ld.buffer != m for ld in loads(x.args[0])))
    if isinstance(e, Call) and e.fn == "mul":
        a, b = e.args
        uses = [any(ld.buffer == m for ld in loads(x)) for x in (a, b)]
        return uses.count(True) == 1 and _exp_factor(a if uses[0] else b, m)
    return False


def _welford(mean: str, a: Expr, body: Expr) -> float | None:
    """c2 when body is (a - mean)²·c2 (or (a - mean)², c2 = 1), the deviation of the mean's own a."""
    split = _split_scale(body)
    sq, c2 = split if split is not None else (body, 1.0)
    if not (isinstance(sq, Call) and sq.fn == "mul" and sq.args[0] == sq.args[1]):
        return None
    d = sq.args[0]
    ok = (isinstance(d, Call) and d.fn == "sub" and d.args[0] == a and isinstance(d.args[1], Load)
          and d.args[1].buffer == mean)
    return c2 if ok else None


def online_merges(stats: list[tuple[Compute, Expr]], cols: int) -> tuple[Merge, ...] | str:
    """The merges that compute a row's statistics in one streaming pass over its `cols`
    elements, or why they cannot. `stats`: each reduction with its body over the row's
    variables (the reduced one in place of r0), in program order."""
    names = [s.out for s, _ in stats]
    body = {s.out: b for s, b in stats}
    combiner = {s.out: s.combiner for s, _ in stats}
    reads = {n: [m for m in names if any(ld.buffer == m for ld in loads(body[n]))] for n in names}
    readers = {n: [m for m in names if n in reads[m]] for n in names}
    merges: list[Merge] = []
    for n in names:
        if reads[n]:
            if len(reads[n]) > 1 or reads[reads[n][0]]:
                return f"{n!r} reads the statistics {reads[n]}, not one statistic of the row itself"
            continue    # merged with the statistic it reads, below
        deps = readers[n]
        if not deps:
            merges.append(Merge("plain", (n,)))
            continue
        if any(readers[d] for d in deps):
            return f"{readers[deps[0]][0]!r} reads {deps[0]!r}, which reads {n!r}: no merge of a statistic of a statistic"
        if combiner[n] == "max":
            bad = [d for d in deps if combiner[d] != "sum" or not _exp_factor(body[d], n)]
            if bad:
                return (f"{bad[0]!r} reads the maximum {n!r} other than as one factor exp(x - {n}) of a sum, "
                        "the only use a rescaled running sum can merge")
            merges.append(Merge("softmax", (n, *deps)))
            continue
        split = _split_scale(body[n])
        c2 = _welford(n, split[0], body[deps[0]]) if split is not None and len(deps) == 1 else None
        if split is None or abs(split[1] * cols - 1) > MEAN_SCALE_TOLERANCE or c2 is None or combiner[deps[0]] != "sum":
            return (f"{deps[0]!r} reads {n!r} other than as the sum of squared deviations (a - mean)²·c of a mean "
                    f"Σ a/{cols}: no merge of partial states is known for it")
        merges.append(Merge("welford", (n, deps[0]), split[0], c2))
    return tuple(merges)


# ---------------------------------------------------------------- weighted_streaming_reduction

WSR = "weighted_streaming_reduction"


@dataclass(frozen=True, slots=True)
class Attention:
    """O[b.., i, e] = sum_j P[b.., i, j] · V[b.., j, e] with P = softmax_j(F), F reading
    S[b.., i, j] = sum_d Q[b.., i, d] · K[b.., j, d] (and other tensors: a mask) element-wise.

    `to_out` renames P's (and S's) loop variables into O's: batch variables to O's, i to O's row
    variable, j to O's reduction variable r0; S's own r0 (the head dimension d) becomes `d`.
    Every access below is written over O's variables plus `d` (the kernel's iteration space).
    """

    scores: Compute
    row_max: Compute
    row_sum: Compute
    probs: Compute
    out: Compute
    q: Load            # over batch, row, d
    k: Load            # over batch, r0 (the key), d
    v: Load            # over batch, r0, col
    logits: Expr       # F over batch, row, r0; S itself is read as load(S, identity)
    row: str           # O's query variable
    col: str           # O's value-column variable
    batch: tuple[str, ...]
    to_out: tuple[tuple[str, Affine], ...]
    empty_rows_zero: bool = False   # P's NaNs are zeroed: a row with every logit -inf gives 0, not NaN

    @property
    def ops(self) -> tuple[Compute, ...]:
        return (self.scores, self.row_max, self.row_sum, self.probs, self.out)


def _nan_to_zero(body: Expr) -> Expr | None:
    """E when `body` is select(isnan(E), 0, E): torch's exported scaled_dot_product_attention
    zeroes the NaN probabilities of a row whose logits are all -inf (a fully masked row)."""
    if (isinstance(body, Call) and body.fn == "select" and isinstance(body.args[0], Call)
            and body.args[0].fn == "isnan" and body.args[1] == Const(0.0) and body.args[0].args[0] == body.args[2]):
        return body.args[2]
    return None


def _softmax_parts(p: Compute, producers: Mapping[str, Compute]) -> tuple[Compute, Compute, Expr, bool] | None:
    """(row max, row sum, F, masked rows zero) when P = exp(F - max_j F) / sum_j exp(F - max_j F)
    over P's last variable j, exactly as `lower` states Softmax, or that softmax with its NaNs
    replaced by 0 (`_nan_to_zero`: then a row whose logits are all -inf is 0); None otherwise."""
    rank = len(p.type.shape)
    # An extent-1 dimension may be read at its variable or at 0 (lowering writes either).
    ones = {f"i{d}": Affine() for d, n in enumerate(p.type.shape) if n == 1}
    body = substitute(p.body, ones)
    unwrapped = _nan_to_zero(body)
    if unwrapped is not None:
        body = unwrapped
    if not (p.combiner == "map" and isinstance(body, Call) and body.fn == "div"):
        return None
    num, den = body.args
    if not (isinstance(num, Call) and num.fn == "exp" and isinstance(num.args[0], Call)
            and num.args[0].fn == "sub" and isinstance(num.args[0].args[1], Load) and isinstance(den, Load)):
        return None
    f, at_max = num.args[0].args
    mx, sm = producers.get(at_max.buffer), producers.get(den.buffer)
    stat_at = tuple(ones.get(f"i{d}", Affine.var(f"i{d}")) for d in range(rank - 1)) + (Affine(),)
    if mx is None or sm is None or at_max.index != stat_at or den.index != stat_at:
        return None
    along = {f"i{rank - 1}": Affine.var("r0")}
    n = p.type.shape[-1]
    if not (mx.combiner == "max" and mx.reduce == (n,) and substitute(mx.body, ones) == substitute(f, along)
            and sm.combiner == "sum" and sm.reduce == (n,) and substitute(sm.body, ones) == substitute(num, along)):
        return None
    return mx, sm, f, unwrapped is not None


def streaming_attention(out: Compute, producers: Mapping[str, Compute]) -> Attention | str | None:
    """The attention roles of `out`, the reason the structure is not a streamable attention,
    or None when `out` is not a contraction with a row softmax at all.

    Legality (rescaling invariance): softmax(F)·V = (Σ_j e^{F_j - m} V_j) / (Σ_j e^{F_j - m})
    for any m, so a running maximum m and accumulators rescaled by e^{m_old - m_new} whenever
    it grows give the exact result after any number of key tiles: the statistics max and
    sum-of-exp merge under rescaling. That needs P to be exactly a softmax over the key
    variable j of an expression F that reads S only at [b.., i, j], and O to sum P·V over j.
    """
    if why_not_tile_compatible(out) is not None:
        return None
    first, second = out.body.args  # type: ignore[union-attr]
    found = None
    for pl, vl in ((first, second), (second, first)):
        p = producers.get(pl.buffer)
        parts = _softmax_parts(p, producers) if p is not None else None
        if parts is not None:
            found = (pl, vl, p, parts)
            break
    if found is None:
        return None
    pl, vl, p, (mx, sm, f, empty_rows_zero) = found
    rank = len(p.type.shape)
    row_p, key_p = f"i{rank - 2}", f"i{rank - 1}"

    def own_element(ld: Load) -> bool:   # [i0, .., i_{rank-1}], or 0 where the extent is 1
        return len(ld.index) == rank and all(a == Affine.var(f"i{d}") or (a == Affine() and n == 1)
                                             for d, (a, n) in enumerate(zip(ld.index, p.type.shape)))
    cands = {ld.buffer for ld in loads(f) if own_element(ld) and (s := producers.get(ld.buffer)) is not None
             and why_not_tile_compatible(s) is None and s.type.shape == p.type.shape}
    if len(cands) != 1:
        return None
    s = producers[cands.pop()]
    if rank < 2:
        return "the probabilities have no query axis"
    if any(ld.buffer == s.out and not own_element(ld) for ld in loads(f)):
        return "the softmax reads the scores at other positions than [.., i, j]"
    if any(ld.buffer in (mx.out, sm.out, p.out) for ld in loads(f)):
        return "the logits read the softmax's own statistics"
    # P's variables in O's: a plain, distinct O variable per dimension (index 0 where the
    # extent is 1: a broadcast batch), the key j on O's reduction variable.
    plain = [len(a.terms) == 1 and not a.const and a.terms[0][1] == 1 for a in pl.index]
    if (pl.index[-1] != Affine.var("r0") or not plain[-2]
            or any(not ok and (a != Affine() or n != 1) for ok, a, n in zip(plain, pl.index, p.type.shape))):
        return "the probabilities are read at other positions than [.., i, j] with j the summed key"
    names = [a.terms[0][0] for ok, a in zip(plain, pl.index) if ok]
    if len(set(names)) != len(names):
        return "the probabilities are read with a repeated variable"
    to_out = {f"i{d}": a for d, a in enumerate(pl.index)}
    row = names[-2]
    v_vars = {v for a in vl.index for v, _ in a.terms}
    cols = [v for v in out.domain_vars if v not in names and v in v_vars]
    if len(cols) != 1:
        return "the weighted sum has no single value-column variable"
    col = cols[0]
    if row in v_vars or "r0" not in v_vars:
        return "the values are not indexed by the key alone (they depend on the query row)"
    q, k = s.body.args  # type: ignore[union-attr]
    uses = [{v for a in ld.index for v, _ in a.terms} for ld in (q, k)]
    if row_p in uses[1] and key_p in uses[0]:
        q, k = k, q
        uses.reverse()
    one_row = p.type.shape[-2] == 1   # a single query row (a decode step) is read at index 0
    if key_p in uses[0] or row_p in uses[1] or (row_p not in uses[0] and not one_row) or key_p not in uses[1]:
        return "the scores are not a product of a query row and a key row"
    s_to_out = {**to_out, "r0": Affine.var("d")}
    return Attention(s, mx, sm, p, out,
                     q=Load(q.buffer, tuple(a.substitute(s_to_out) for a in q.index)),
                     k=Load(k.buffer, tuple(a.substitute(s_to_out) for a in k.index)),
                     v=vl, logits=substitute(f, to_out), row=row, col=col,
                     batch=tuple(v for v in out.domain_vars if v not in (row, col)),
                     to_out=tuple(sorted(to_out.items())), empty_rows_zero=empty_rows_zero)


def causal_split(att: Attention) -> tuple[Load, Expr] | None:
    """(M, X) when the logits are F = X + M (either order) with M a load, not of the scores,
    whose access varies with the query row, the key and batch variables only: the shape of an
    additive mask (transformers builds one per batch row). Whether M is causal depends on its
    values (`causal_logits`)."""
    f = att.logits
    if not (isinstance(f, Call) and f.fn == "add"):
        return None
    for m, x in ((f.args[1], f.args[0]), (f.args[0], f.args[1])):
        if (isinstance(m, Load) and not indirect_dims(m) and m.buffer != att.scores.out and all(ld.buffer != m.buffer for ld in loads(x))
                and not {v for a in m.index for v, _ in a.terms} - {att.row, "r0", *att.batch}):
            return m, x
    return None


def causal_logits(att: Attention, weights: Mapping[str, Any]) -> Expr | None:
    """F without its mask when F = X + M[i, j] (`causal_split`) with M a constant (`weights`
    maps weight names to arrays) that is 0 where j <= i and <= -1e4 where j > i, in every batch
    row it varies over. Key j = 0 is never masked, so each row's maximum is at least a real
    logit and a masked probability is below e^{-1e4 + (spread of the logits)}: 0 in every float
    format for any logits that span less than ~1e4, so skipping the keys above the diagonal
    changes nothing. None when the mask is not causal (or there is none)."""
    split = causal_split(att)
    if split is None or split[0].buffer not in weights:
        return None
    m, x = split
    extents = att.out.extents()
    nq, nk = extents[att.row], att.out.reduce[0]
    used = [v for v in att.batch if any(v == u for a in m.index for u, _ in a.terms)]
    shape = tuple(extents[v] for v in used) + (nq, nk)
    axes = used + [att.row, "r0"]
    grids = {v: np.arange(n).reshape([n if k == d else 1 for k in range(len(shape))])
             for d, (v, n) in enumerate(zip(axes, shape))}
    idx = tuple(np.broadcast_to(a.const + sum((c * grids[v] for v, c in a.terms), np.int64(0)), shape)
                for a in m.index)
    mask = np.asarray(weights[m.buffer], dtype=np.float64)[idx]
    below = np.broadcast_to(grids["r0"] <= grids[att.row], shape)
    return x if np.all(mask[below] == 0) and np.all(mask[~below] <= -1e4) else None


# [Note: live keys] A key-value cache of S_max slots written at `cache_position` is attended
# with the mask "slot j is visible to the query at position p when j <= p" (transformers'
# StaticCache, tests/fixtures/make_kvcache.py): F = X + select(j <= P[i], 0, -big). Every key
# past the largest P[i] of a block's rows is masked for all of them, so a kernel that reads P
# on the device can stop its key loop there: a decode step then reads the live part of the
# cache, not all S_max slots. Exact, as the causal skip is (`causal_logits`): key 0 is always
# visible (P >= 0), so each row's maximum is a real logit and a skipped key's probability
# e^{-big - max} is 0. A row with P < 0 sees no key; the kernel keeps every key for it, as the
# mask's uniform softmax over -big logits then needs them all.
_VISIBLE = {"le": (0, 1), "ge": (1, 0)}   # the op, (position of the slot, of the position P)


def _mask_select(e: Expr) -> Expr | None:
    """C when `e` is select(C, 0, m) with m <= -1e4: an additive mask from a condition."""
    if (isinstance(e, Call) and e.fn == "select" and isinstance(e.args[1], Const) and e.args[1].value == 0
            and isinstance(e.args[2], Const) and e.args[2].value <= -1e4):
        return e.args[0]
    return None


def _slot_position(cond: Expr, key: str) -> tuple[Load, Load] | None:
    """(slot load, position load) when `cond` is slot[j] <= P[..] over key variable `key`:
    the slot read at an access of `key` alone, P at one that does not involve it."""
    if not (isinstance(cond, Call) and cond.fn in _VISIBLE and all(isinstance(a, Load) for a in cond.args)):
        return None
    s, p = _VISIBLE[cond.fn]
    slot, pos = cond.args[s], cond.args[p]
    if indirect_dims(slot) or indirect_dims(pos) or slot.fill is not None or pos.fill is not None:
        return None
    if any(v != key for a in slot.index for v, _ in a.terms) or any(
            v == key for a in pos.index for v, _ in a.terms):
        return None
    return slot, pos   # type: ignore[return-value]


def live_key_mask(att: Attention, producers: Mapping[str, Compute],
                  weights: Mapping[str, Any]) -> tuple[Load, Compute] | None:
    """(the mask's load in the logits, its producer) when the logits are X + select(B[i, j], 0,
    -big) with B = slot[j] <= P[i] computed by `producers[B]` from a constant slot table whose
    value at key j is j ([Note: live keys]); None otherwise."""
    f = att.logits
    if not (isinstance(f, Call) and f.fn == "add"):
        return None
    for m in f.args:
        cond = _mask_select(m)
        if not (isinstance(cond, Load) and cond.buffer in producers) or indirect_dims(cond):
            continue
        prod = producers[cond.buffer]
        if prod.combiner != "map" or any(ld.buffer == att.scores.out for ld in loads(prod.body)):
            continue
        keyed = [v for v, a in zip(prod.domain_vars, cond.index) if a == Affine.var("r0")]
        if len(keyed) != 1:
            continue
        found = _slot_position(prod.body, keyed[0])
        if found is None or found[0].buffer not in weights:
            continue
        slot = found[0]
        nk = att.out.reduce[0]
        j = np.arange(nk)
        idx = tuple(np.broadcast_to(a.const + a.coeff(keyed[0]) * j, (nk,)) for a in slot.index)
        table = np.asarray(weights[slot.buffer], dtype=np.float64)
        if all(0 <= i.min() and i.max() < n for i, n in zip(idx, table.shape)) and np.array_equal(table[idx], j):
            return cond, prod
    return None


def live_key_loads(att: Attention) -> tuple[Load, Load] | None:
    """(slot[j], P[i]) when the logits, the mask restated in the kernel ([Note: live keys]), are
    X + select(slot[j] <= P[i], 0, -big); None otherwise."""
    f = att.logits
    if not (isinstance(f, Call) and f.fn == "add"):
        return None
    for m in f.args:
        cond = _mask_select(m)
        found = _slot_position(cond, "r0") if cond is not None else None
        if found is not None:
            return found
    return None


def live_key_position(att: Attention) -> Load | None:
    """P over the attention's variables (batch, query row) of the restated mask (`live_key_loads`)."""
    found = live_key_loads(att)
    return found[1] if found is not None else None
