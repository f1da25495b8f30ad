"""Memory properties of lowered computes, each with its legality check in code.

A property is a fact about how a computation touches memory that makes a rewrite legal
(`../docs` and the user's notes call this the memory-centric IR):

- `tile_compatible_compute`: a sum-reduction of a product of two loads, each indexed by a
  disjoint subset of the output variables plus the reduction variable: partial sums over
  K-tiles add up (associativity of +), so the loop nest tiles into on-chip blocks (GEMM).
- `online_reducible_norm`: a single-axis sum or max whose partial results merge (both are
  associative and commutative), so a row's statistics can be reduced by a block of threads
  and consumed in the same kernel.
- `rematerializable_intermediate`: a map with no reduction: pure, deterministic, no side
  effects, so a consumer may recompute it from its inputs instead of loading it.

Each check returns None when the property holds, or the reason it does not.
"""
from __future__ import annotations

from dataclasses import dataclass

from aicfc.ir.lowered import Affine, Call, Compute, Load, count_ops, loads

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


def why_not_tile_compatible(op: Compute) -> str | None:
    if op.combiner != "sum" or len(op.reduce) != 1:
        return "not a single-axis sum reduction"
    body = op.body
    if not (isinstance(body, Call) and body.fn == "mul" and all(isinstance(x, Load) for x in body.args)):
        return "body is not a product of two loads"
    a, b = body.args
    for ld in (a, b):
        for ix in ld.index:
            if len(ix.terms) > 1 or any(c != 1 for _, c in ix.terms) or ix.const:
                return f"access of {ld.buffer!r} is not a plain variable per dimension"
    va = {v for ix in a.index for v, _ in ix.terms}
    vb = {v for ix in b.index for v, _ in ix.terms}
    if "r0" not in va or "r0" not in vb:
        return "the reduction variable does not index both operands"
    used = va | vb
    if any(v not in used for v in op.domain_vars if op.extents()[v] > 1):
        return "an output variable indexes neither operand"
    return None


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
    if why_not_tile_compatible(op) is None:
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


def is_identity_access(ld: Load, rank: int) -> bool:
    return ld.index == tuple(Affine.var(f"i{k}") for k in range(rank))
