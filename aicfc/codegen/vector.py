"""Vector accesses for the memory-bound families (pointwise, row_reduce).

[Note: Vector access]
A kernel that walks a loop variable v in groups of V consecutive values (v0, ..., v0 + V - 1,
v0 a multiple of V) reads an access `load(%b, index)` as one of:

- contiguous: the access's flat offset has coefficient 1 on v, and every other coefficient and
  the constant are multiples of V. The V elements are consecutive and the first sits at a
  multiple of V elements from the buffer's start; every buffer starts 256-byte aligned
  (plan_memory's ALIGN; device allocations are 256-byte aligned too), so one aligned vector
  instruction of V·itemsize bytes (at most 16) moves all of them.
- broadcast: coefficient 0 on v: one element serves the whole group.
- strided: anything else, read element by element.

The width is the widest power of two with V·itemsize <= 16 bytes that divides v's extent, so a
group never straddles the end of v's range and needs no tail code.
"""
from __future__ import annotations

from typing import Mapping

from aicfc.codegen.cexpr import c_affine, c_offset, flat_offset
from aicfc.ir.lowered import Affine, Load, index_vars, indirect_dims
from aicfc.ir.types import ITEMSIZE, TensorType

VECTOR_BYTES = 16
CONTIGUOUS, BROADCAST, STRIDED = "contiguous", "broadcast", "strided"


def kind(ld: Load, types: Mapping[str, TensorType], var: str, width: int) -> str:
    if indirect_dims(ld):
        # [Note: Indirect index]: a data-dependent row, read element by element.
        return BROADCAST if var not in {v for a in ld.index for v in index_vars(a)} else STRIDED
    if ld.fill is not None and not guard_is_uniform(ld, types[ld.buffer], var, width):
        return STRIDED   # a guarded load whose test varies inside a group: element by element
    off = flat_offset(ld.index, types[ld.buffer])
    c = off.coeff(var)
    if c == 0:
        return BROADCAST
    if c == 1 and off.const % width == 0 and all(k % width == 0 for v, k in off.terms if v != var):
        return CONTIGUOUS
    return STRIDED


def full_width(dtypes: list[str]) -> int:
    """Elements of the widest of `dtypes` in one 16-byte vector."""
    return VECTOR_BYTES // max(ITEMSIZE[d] for d in dtypes)


# The storage types aicf_vload/aicf_vstore convert (templates/vector_io.cuh.j2); integer and
# bool tensors are moved element by element.
VECTOR_DTYPES = ("f32", "f16", "bf16")


def widest(dtypes: list[str], extent: int) -> tuple[int, str]:
    """(V, why not wider): the widest vector for elements of `dtypes` along an extent."""
    if any(d not in VECTOR_DTYPES for d in dtypes):
        return 1, f"{sorted(set(dtypes) - set(VECTOR_DTYPES))} elements are not moved as vectors"
    v = full = full_width(dtypes)
    while v > 1 and extent % v:
        v //= 2
    why = "" if v == full else f"{extent} elements are not a multiple of {full} ({VECTOR_BYTES}-byte vectors)"
    return v, why


def load_lines(ld: Load, kind_: str, width: int, dest: str, params: Mapping[str, str],
               types: Mapping[str, TensorType], names: Mapping[str, str], var: str, first: str) -> list[str]:
    """C lines filling `dest[0..width)` with the access at `var` = first, first + 1, ... as float."""
    ptr = params[ld.buffer]
    if indirect_dims(ld):
        at = {**names, var: f"({first} + e)"}
        return ["#pragma unroll", f"for (int e = 0; e < {width}; ++e) {dest}[e] = "
                f"aicf_float({ptr}[{c_offset(ld, params, types, at)}]);"]
    if ld.fill is not None and ld.guarded_dims:
        return guarded_load_lines(ld, kind_, width, dest, params, types, names, var, first)
    off = flat_offset(ld.index, types[ld.buffer])
    if kind_ == CONTIGUOUS and types[ld.buffer].dtype in VECTOR_DTYPES:   # integers: element by element
        return [f"aicf_vload<{width}>({ptr} + ({c_affine(off, {**names, var: first})}), {dest});"]
    at = {**names, var: f"({first} + e)"}
    return ["#pragma unroll", f"for (int e = 0; e < {width}; ++e) {dest}[e] = "
            f"aicf_float({ptr}[{c_affine(off, at)}]);"]


def group_loads(accesses, em, params: Mapping[str, str], types: Mapping[str, TensorType], names: Mapping[str, str],
                var: str, width: int, lane: str) -> tuple[list[str], dict[Load, str]]:
    """C lines reading each of `accesses` for a group of `width` values of `var` (var = first,
    first + 1, ...: a broadcast one once, `u<n>`; the others into `a<n>[width]`), and what each
    access is inside the group's loop over `lane`. `em` emits the broadcast loads."""
    lines: list[str] = []
    values: dict[Load, str] = {}
    for n, ld in enumerate(accesses):
        kind_ = kind(ld, types, var, width)
        if kind_ == BROADCAST:
            values[ld] = f"u{n}"
            lines.append(f"const float u{n} = {em.load(ld, {**names, var: 'first'})};")
        else:
            values[ld] = f"a{n}[{lane}]"
            lines += [f"float a{n}[{width}];"] + load_lines(ld, kind_, width, f"a{n}", params, types,
                                                            {**names, var: var}, var, "first")
    return lines, values


def store_line(index: tuple[Affine, ...], t: TensorType, ptr: str, names: Mapping[str, str], var: str,
               first: str, width: int, src: str) -> str:
    """One vector store of `src[0..width)` at a contiguous access of a `t` output."""
    off = flat_offset(index, t)
    return f"aicf_vstore<{width}>({ptr} + ({c_affine(off, {**names, var: first})}), {src});"


# ---------------------------------------------------------------- guarded loads (Concat, issue 6)

def guard_is_uniform(ld: Load, t: TensorType, var: str, width: int) -> bool:
    """Whether a guarded load's test ([Note: Lowered IR]) has one outcome for a whole group: no
    guarded index moves with `var`, or each moves by 1 from a multiple of `width` in an extent
    that is one, so the group lies wholly inside or wholly outside (a Concat along the inner
    axis at offsets that are multiples of the width)."""
    for d in ld.guarded_dims:
        a = ld.index[d]
        c = a.coeff(var)
        if c and not (c == 1 and a.const % width == 0 and t.shape[d] % width == 0
                      and all(k % width == 0 for v, k in a.terms if v != var)):
            return False
    return True


def guarded_load_lines(ld: Load, kind_: str, width: int, dest: str, params: Mapping[str, str],
                       types: Mapping[str, TensorType], names: Mapping[str, str], var: str,
                       first: str) -> list[str]:
    """`load_lines` of a guarded load: a contiguous group tested once (`kind` made sure the test
    is the same for all of it), a strided one element by element; outside, the fill."""
    from aicfc.codegen.cexpr import guard_condition, literal
    ptr, t = params[ld.buffer], types[ld.buffer]
    off = flat_offset(ld.index, t)
    fill = literal(ld.fill if ld.fill is not None else 0.0)
    if kind_ == CONTIGUOUS:
        at_first = {**names, var: first}
        return [f"if ({guard_condition(ld, t, at_first)}) aicf_vload<{width}>({ptr} + ({c_affine(off, at_first)}), {dest});",
                f"else for (int e = 0; e < {width}; ++e) {dest}[e] = {fill};"]
    at = {**names, var: f"({first} + e)"}
    return ["#pragma unroll", f"for (int e = 0; e < {width}; ++e) {dest}[e] = ({guard_condition(ld, t, at)}) ? "
            f"aicf_float({ptr}[{c_affine(off, at)}]) : {fill};"]
