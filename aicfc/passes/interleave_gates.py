"""interleave_gates: Lowered IR → Lowered IR; a map that combines the two halves of a merged
contraction (SwiGLU's silu(x·Wg)·(x·Wu) after merge_contractions put Wg and Wu side by side)
reads them from adjacent columns instead, so one GEMM thread holds both (rule GATE_RULE).

A GEMM's epilogue runs on the accumulators a thread holds, and every unit holds columns in
pairs (gn, gn+1), gn even (mma/wgmma fragments, SIMT runs of VN >= 2). The merged result
C[.., n] has the gate at column j and the up value at j + N: different threads. But the
weight is a constant, its column order the compiler's to choose (the model never sees C):
storing Wg's column j at 2j and Wu's at 2j+1 (a recorded relayout of the weight) puts the two
at (2j, 2j+1), and the map reads C'[.., 2j] and C'[.., 2j+1]: each output element is a
function of one thread's column pair, so form_kernels absorbs it as a gated epilogue
(properties tile_compatible_compute for C, rematerializable_intermediate for the map), and
the 2N-wide C is never stored.

    %c: f32[1,16,128] = sum[64] mul(load(%x, [0, i1, r0]), load(%w, [r0, i2]))
    %y: f32[1,16,64] = map mul(silu(load(%c, [0, i1, i2])), load(%c, [0, i1, i2+64]))
  becomes
    %c.pairs: f32[1,16,128] = sum[64] mul(load(%x, [0, i1, r0]), load(%w.pairs, [r0, i2]))
    %y: f32[1,16,64] = map mul(silu(load(%c.pairs, [0, i1, 2*i2])), load(%c.pairs, [0, i1, 2*i2+1]))

Legal when C is a contraction whose n variable indexes one dimension of a constant weight
(B) at itself and nothing else, C is read only by the map and is not a graph output, and the
map reads C only at its own index with n at n or n + N (N = half of C's n extent, both read);
the weight has no other reader (it is replaced by its interleaved copy).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from aicfc.ir.lowered import Affine, Compute, Expr, Load, Program, Rewrite, loads, map_loads, reader_names
from aicfc.ir.properties import REMAT, TILE, contraction
from aicfc.ir.shared_weights import remember
from aicfc.ir.types import Weight, convert

GATE_RULE = "f(x·W[:, :N], x·W[:, N:]) => interleaved columns, gated gemm epilogue"
SUFFIX = ".pairs"


@dataclass(frozen=True)
class Gate:
    mm: Compute
    epi: Compute
    weight: Weight
    wdim: int      # the weight dimension indexed by n
    ndim: int      # C's (and the map's) dimension of n


def _match(mm: Compute, p: Program, readers: dict[str, list[str]], producers: dict[str, Compute]) -> Gate | str | None:
    c = contraction(mm) if mm.combiner == "sum" else None
    if c is None or c.n is None or len(readers.get(mm.out, [])) != 1:
        return None
    epi = producers.get(readers[mm.out][0])
    if epi is None or epi.combiner != "map":
        return None
    ndim = mm.domain_vars.index(c.n)
    n2 = mm.type.shape[ndim]
    half = n2 // 2
    want = mm.type.shape[:ndim] + (half,) + mm.type.shape[ndim + 1:]
    if n2 % 2 or epi.type.shape != want:
        return None
    own = [Affine.var(v) if mm.type.shape[d] > 1 else None for d, v in enumerate(epi.domain_vars)]
    seen = set()
    for ld in loads(epi.body):
        if ld.buffer != mm.out:
            continue
        if ld.fill is not None or len(ld.index) != len(own) or any(
                not (a == o or (o is None and a == Affine())) for d, (a, o) in enumerate(zip(ld.index, own)) if d != ndim):
            return None
        at = ld.index[ndim]
        if at == Affine.var(c.n):
            seen.add(0)
        elif at == Affine.of({c.n: 1}, half):
            seen.add(1)
        else:
            return None
    if seen != {0, 1}:
        return None
    weights = {w.name: w for w in p.weights}
    w = weights.get(c.b.buffer)
    if w is None:
        return "the operand read along n is not a constant weight, so its columns cannot be reordered"
    at_n = [d for d, a in enumerate(c.b.index) if c.n in {v for v, _ in a.terms}]
    if len(at_n) != 1 or c.b.index[at_n[0]] != Affine.var(c.n) or any(
            c.n in {v for v, _ in a.terms} for a in c.a.index):
        return "the weight is not read along n at n itself"
    if mm.out in p.outputs:
        return "the merged result is a graph output"
    if len(readers.get(w.name, [])) != 1:
        return f"weight {w.name!r} has other readers"
    return Gate(mm, epi, w, at_n[0], ndim)


def _build(g: Gate) -> tuple[Compute, Compute, Weight, Rewrite]:
    mm, epi, w = g.mm, g.epi, g.weight
    n2 = w.type.shape[g.wdim]
    half = n2 // 2
    order = np.arange(n2).reshape(2, half).T.reshape(-1)      # column 2j + t holds old column t·N + j
    # the bytes once for all the plans of a bundle ([Note: weights shared by a bundle's plans] in ir/shared_weights.py)
    data = remember(("interleave", g.wdim, w.type), w.data, lambda: convert(np.take(w.array(), order, axis=g.wdim), w.type.dtype))
    new_w = Weight(w.name + SUFFIX, w.type, data)
    c_name = mm.out + SUFFIX

    def to_weight(ld: Load) -> Expr:
        return Load(new_w.name, ld.index, ld.fill, ld.guard) if ld.buffer == w.name else ld
    new_mm = Compute(c_name, mm.type, mm.combiner, mm.reduce, map_loads(mm.body, to_weight), mm.origin)
    n = epi.domain_vars[g.ndim]

    def to_pairs(ld: Load) -> Expr:
        if ld.buffer != mm.out:
            return ld
        t = 0 if ld.index[g.ndim] == Affine.var(n) else 1
        index = ld.index[:g.ndim] + (Affine.of({n: 2}, t),) + ld.index[g.ndim + 1:]
        return Load(c_name, index)
    new_epi = Compute(epi.out, epi.type, epi.combiner, epi.reduce, map_loads(epi.body, to_pairs), epi.origin)
    reason = (f"{TILE} contraction, {REMAT} map of its two halves: weight {w.name!r}'s columns interleaved "
              f"(column 2j+t holds column t·{half}+j), so the values {epi.out!r} combines sit in adjacent "
              f"columns (2j, 2j+1) of one thread; {mm.out!r} ({mm.type}) is never stored")
    return new_mm, new_epi, new_w, Rewrite(GATE_RULE, epi.out, True, reason, 2 * mm.type.nbytes)


def interleave_gates(p: Program) -> Program:
    producers = {op.out: op for op in p.ops if isinstance(op, Compute)}
    readers = reader_names(p.ops)
    ops = list(p.ops)
    weights = list(p.weights)
    records = list(p.rewrites)
    for mm in list(producers.values()):
        m = _match(mm, p, readers, producers)
        if m is None:
            continue
        if isinstance(m, str):
            records.append(Rewrite(GATE_RULE, mm.out, False, m))
            continue
        new_mm, new_epi, new_w, record = _build(m)
        ops = [new_mm if o is mm else new_epi if o is m.epi else o for o in ops]
        weights = [new_w if w is m.weight else w for w in weights]
        records.append(record)
    return p.replace(ops=tuple(ops), weights=tuple(weights), rewrites=tuple(records))

