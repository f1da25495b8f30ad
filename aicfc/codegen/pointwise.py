"""Schedule family `pointwise`: any fused map, `vec` consecutive elements per thread step.

Parameter space: threads per block x items (steps) per thread; `vec` is not searched: it is
the widest vector every access allows ([Note: Vector access] in codegen/vector.py) along the
innermost variable, narrower widths recorded as declined with the reason. A thread step covers
`vec` consecutive output elements: contiguous accesses (the output, x[i, j], a bias b[j]) move
as one 16-byte vector, broadcast ones (a per-row value) load once for the group, strided ones
(a transpose) element by element. Consecutive threads take consecutive groups, so every
contiguous access is coalesced. A division by a literal (or, in a group, by a broadcast value)
is a product by its reciprocal (`cexpr.reciprocal_divisions`: one more rounding, about an ulp).
"""
from __future__ import annotations

import math
import re
from typing import Mapping

from aicfc.codegen import vector
from aicfc.codegen.cexpr import Emitter, flat_offset, reciprocal_divisions
from aicfc.codegen.common import decompose, render, signature, store_line
from aicfc.ir.decision import Kernel, Plan
from aicfc.ir.lowered import Const, Load, identity_index, is_integer_compute, loads
from aicfc.ir.types import TensorType

SPACE = {"threads": (64, 128, 256, 512, 1024), "items": (1, 2, 4, 8)}


def vector_width(k: Kernel, types: Mapping[str, TensorType]) -> tuple[int, str, int]:
    """(vec, why not wider, the widest the element types allow)."""
    (op,) = k.ops
    if not op.domain_vars:
        return 1, "", 1
    inner = op.domain_vars[-1]
    accesses = list(dict.fromkeys(loads(op.body)))
    full = vector.full_width([types[ld.buffer].dtype for ld in accesses] + [op.type.dtype])
    if is_integer_compute(op.type.dtype, op.body, types):
        return 1, "an integer compute runs in int64, one element at a time ([Note: Integer computes])", full
    width, why = vector.widest([types[ld.buffer].dtype for ld in accesses] + [op.type.dtype], op.type.shape[-1])
    if width > 1 and all(vector.kind(ld, types, inner, width) == vector.STRIDED for ld in accesses):
        if not _gathers_coalesced(op, types, accesses, width):
            return 1, f"every access is strided along {inner}: nothing to move as a vector", full
    return width, why, full


def _gathers_coalesced(op, types: Mapping[str, TensorType], accesses: list[Load], width: int) -> bool:
    """A group is the whole inner axis (its extent is the vector's width) and every load is
    contiguous along the next variable out, the one consecutive threads step through: the reads
    are element by element but coalesced across the warp, and the store is one vector. That is a
    layout change to a short innermost axis, e.g. an image x[n, c, h, w] written as y[n, h, w, 8]
    (channels-last, C = 3 padded to 8): without the vector, eight threads share one output pixel
    and each stores 2 bytes. Or every load is contiguous along the inner axis itself, misaligned or
    guarded: each thread's reads are one run of the source."""
    if len(op.domain_vars) < 2 or op.type.shape[-1] != width:
        return False
    outer, inner = op.domain_vars[-2], op.domain_vars[-1]
    offsets = [flat_offset(ld.index, types[ld.buffer]) for ld in accesses]
    # or every load is a run along the inner axis itself (only misaligned or guarded, so read element by
    # element): a group's reads fall in one or two sectors ([Note: row phases] in passes/unfold_taps.py)
    return all(off.coeff(outer) == 1 for off in offsets) or all(off.coeff(inner) == 1 for off in offsets)


def space(k: Kernel, plan: Plan) -> list[dict]:
    vec, _, _ = vector_width(k, plan.types())
    return [{"threads": t, "items": i, "vec": vec} for t in SPACE["threads"] for i in SPACE["items"]]


def declined(k: Kernel, plan: Plan) -> list[tuple[dict, str]]:
    vec, why, full = vector_width(k, plan.types())
    return [({"vec": full}, why)] if why else []


def launch(k: Kernel, p: Mapping) -> tuple[tuple[int, int, int], tuple[int, int, int], int]:
    numel = k.ops[-1].type.numel
    return (math.ceil(numel / (p["threads"] * p["items"] * p["vec"])), 1, 1), (p["threads"], 1, 1), 0


def static_smem(k: Kernel, p: Mapping) -> int:
    return 0


def render_kernel(k: Kernel, p: Mapping, types: Mapping[str, TensorType], name: str) -> str:
    (op,) = k.ops
    sig = signature(k, types)
    vec = p["vec"]
    names = {v: v for v in op.domain_vars}
    em = Emitter(sig.params, types, prefix="v", integer=is_integer_compute(op.type.dtype, op.body, types))
    variables = list(zip(op.domain_vars, op.type.shape))
    if vec == 1:
        value = em.emit(reciprocal_divisions(op.body, lambda e: isinstance(e, Const)), names)
        body = em.take() + [store_line(op, dict(k.binds[0]), value, sig.params, names)]
        return render("pointwise.cu.j2", name=name, shape=list(op.type.shape), numel=op.type.numel, vec=1,
                      threads=p["threads"], items=p["items"], idx=sig.index_type, signature=sig.text,
                      decompose=decompose("t", variables, sig.index_type), loads=[], body=body, store=None)
    # One group of `vec` elements: `inner` runs over first .. first + vec - 1.
    inner = op.domain_vars[-1]
    lines, values = vector.group_loads(list(dict.fromkeys(loads(op.body))), em, sig.params, types, names, inner, vec, "v")
    # a divisor the same for the whole vector (a literal, a per-row value): one division per group
    grouped = reciprocal_divisions(op.body, lambda e: all(vector.kind(ld, types, inner, vec) == vector.BROADCAST
                                                          for ld in loads(e)))
    value = em.emit(grouped, names, {}, values)
    body = em.take() + [f"o[v] = {value};"]
    if any(re.search(rf"\b{inner}\b", x) for x in body):
        body.insert(0, f"const {sig.index_type} {inner} = first + v;")
    store = vector.store_line(identity_index(len(op.type.shape)), op.type, sig.params[op.out], names, inner,
                              "first", vec, "o")
    decomposed = decompose("t", variables[:-1] + [("first", variables[-1][1])], sig.index_type)
    return render("pointwise.cu.j2", name=name, shape=list(op.type.shape), numel=op.type.numel, vec=vec,
                  threads=p["threads"], items=p["items"], idx=sig.index_type, signature=sig.text,
                  decompose=decomposed, loads=lines, body=body, store=store)
