"""Lowerings of the issue-18 data ops that need no kernel family of their own: Pad, CumSum,
ArgMax/ArgMin and TopK, each stated with the Lowered IR's guarded loads, reductions and
comparisons (`passes/lower.py` calls these with the list of constants a lowering may make).

    Pad (constant)      %y = map load(%x, [i0+-1, i1], fill=v)           (negative pads crop)
    CumSum (axis 1, n)  %y = sum[n] load(%x, [i0, i1+r0+-(n-1)], fill=0)  the window ending at i1
    ArgMax (axis 1)     %y.m = max[n] load(%x, [i0, r0])
                        %y = min[n] select(eq(load(%x, [i0, r0]), load(%y.m, [i0, 0])),
                                           load(%y.iota, [r0]), n)       (the first index of the max)
    TopK (axis 1, k)    %y.rank = sum[n] or(gt(x[i0, r0], x[i0, i1]), and(eq(..), lt(iota[r0], iota[i1])))
                        %y = sum[n] select(eq(load(%y.rank, [i0, r0]), load(%y.iota, [i1])), x[i0, r0], 0)

An index is read as a value from an int32 constant `iota` (0, 1, ..., n-1): a Lowered IR body
has no loop-variable values, only loads; an int32 constant keeps it exact under every
precision policy (floats are stored as fp16 under --precision fp16, integers are not). Counts
and indices are sums of 0/1 terms and picks of one term, exact in float below 2**24, which
`check_extent` asserts. CumSum is quadratic in the axis's extent (each output sums its whole
window); exact for integers below 2**24 as well, which the importer checks on run-time
integers (`int_ranges`).
"""
from __future__ import annotations

import numpy as np

from aicfc.errors import AicfError
from aicfc.ir.high import Node
from aicfc.ir.lowered import Affine, Call, Compute, Const, Expr, Load, Op, View
from aicfc.ir.types import TensorType, Weight

ZERO = Affine()
EXACT = 1 << 24   # every integer of magnitude up to this is a float32 exactly


def check_extent(n: Node, extent: int) -> None:
    if extent >= EXACT:
        raise AicfError(f"node {n.origin!r}: {n.op} along an axis of {extent} elements: indices and counts "
                        f"are computed in float32, exact below 2**24 only")


def _iota(name: str, extent: int, made: list[Weight]) -> str:
    made.append(Weight.of(name, np.arange(extent, dtype=np.int32)))
    return name


def pad(n: Node, types: dict[str, TensorType], made: list[Weight]) -> list[Op]:
    """y[i..] = x[i_d - begin_d..], `value` wherever that falls outside x; the guard names the
    dimensions padded at their end only (a plain variable there could run past x)."""
    src, pads = types[n.inputs[0]].shape, n.attr["pads"]
    rank = len(src)
    index = tuple(Affine.of({f"i{d}": 1}, -pads[d]) for d in range(rank))
    if not any(p > 0 for p in pads):
        return [Compute(n.output, n.type, "map", (), Load(n.inputs[0], index), (n.origin,))]
    guard = tuple(d for d in range(rank) if pads[d] == 0 and pads[d + rank] > 0)
    return [Compute(n.output, n.type, "map", (), Load(n.inputs[0], index, n.attr["value"], guard), (n.origin,))]


def cumsum(n: Node, types: dict[str, TensorType], made: list[Weight]) -> list[Op]:
    """y[.., j, ..] = Σ_r x[.., j + r + shift, ..] over r in 0..m-1 (m the axis's extent), with
    reads outside x giving 0: shift -(m-1) sums x[j-m+1..j] (inclusive), -m x[j-m..j-1]
    (exclusive); reversed, shift 0 sums x[j..j+m-1] and 1 x[j+1..j+m]."""
    axis, (excl, rev) = n.attr["axis"], (n.attr["exclusive"], n.attr["reverse"])
    m = n.type.shape[axis]
    check_extent(n, m)
    if excl and m == 1:   # nothing before (or after) the only element
        return [Compute(n.output, n.type, "map", (), Const(0.0), (n.origin,))]
    shift = (1 if excl else 0) if rev else -(m - 1) - (1 if excl else 0)
    index = tuple(Affine.of({f"i{d}": 1, "r0": 1}, shift) if d == axis else Affine.var(f"i{d}")
                  for d in range(len(n.type.shape)))
    return [Compute(n.output, n.type, "sum", (m,), Load(n.inputs[0], index, 0.0), (n.origin,))]


def _along(rank: int, axis: int, at: str) -> tuple[Affine, ...]:
    return tuple(Affine.var(at) if d == axis else Affine.var(f"i{d}") for d in range(rank))


def arg_extreme(n: Node, types: dict[str, TensorType], made: list[Weight]) -> list[Op]:
    """The extreme along the axis (max or min), then the smallest (or, select_last_index, the
    largest) index holding it. Computed over the keepdims shape; a view drops the axis."""
    x, src = n.inputs[0], types[n.inputs[0]].shape
    axis, m, rank = n.attr["axis"], types[n.inputs[0]].shape[n.attr["axis"]], len(src)
    check_extent(n, m)
    origin, y = (n.origin,), n.output
    kept = tuple(1 if d == axis else s for d, s in enumerate(src))
    stat_at = tuple(ZERO if d == axis else Affine.var(f"i{d}") for d in range(rank))
    along = _along(rank, axis, "r0")
    extreme = "max" if n.op == "ArgMax" else "min"
    iota = _iota(f"{y}.iota", m, made)
    hit = Call("eq", (Load(x, along), Load(f"{y}.ext", stat_at)))
    last = n.attr["select_last_index"]
    pick = Call("select", (hit, Load(iota, (Affine.var("r0"),)), Const(-1.0 if last else float(m))))
    out = y if n.attr["keepdims"] else f"{y}.keep"
    ops: list[Op] = [
        Compute(f"{y}.ext", TensorType(types[x].dtype, kept), extreme, (m,), Load(x, along), origin),
        Compute(out, TensorType("i64", kept), "max" if last else "min", (m,), pick, origin),
    ]
    if out != y:
        ops.append(View(y, n.type, out, origin))
    return ops


def topk(n: Node, types: dict[str, TensorType], made: list[Weight]) -> list[Op]:
    """rank[j] = how many elements come before x[j] in the order (larger first, or smaller
    first; equal values by index), then output position p gathers the one element of rank p."""
    x, src = n.inputs[0], types[n.inputs[0]].shape
    axis, rank = n.attr["axis"], len(src)
    m = src[axis]
    check_extent(n, m)
    origin, y = (n.origin,), n.output
    iota = _iota(f"{y}.iota", m, made)
    own = _along(rank, axis, f"i{axis}")
    other = _along(rank, axis, "r0")
    before = Call("gt" if n.attr["largest"] else "lt", (Load(x, other), Load(x, own)))
    tie = Call("and", (Call("eq", (Load(x, other), Load(x, own))),
                       Call("lt", (Load(iota, (Affine.var("r0"),)), Load(iota, (Affine.var(f"i{axis}"),))))))
    order: Expr = Call("or", (before, tie))
    is_p = Call("eq", (Load(f"{y}.rank", other), Load(iota, (Affine.var(f"i{axis}"),))))
    value = Load(iota, (Affine.var("r0"),)) if n.attr["part"] == "indices" else Load(x, other)
    return [
        Compute(f"{y}.rank", TensorType("i32", src), "sum", (m,), order, origin),
        Compute(y, n.type, "sum", (m,), Call("select", (is_p, value, Const(0.0))), origin),
    ]


def scatter_nd(n: Node, types: dict[str, TensorType], made: list[Weight]) -> list[Op]:
    """y = x with the rows the indices name replaced by the updates, stated element-wise over y
    (the functional form; `declare_state` runs it in place, over the updates only, where x is
    state). With the indices viewed as ids[Q, k] and the updates as upd[Q, rest..]:

        match(r0)  = and over j of eq(wrap(ids[r0, j]), i_{axes[j]})      (wrap: x + n if x < 0)
        %y.hit     = max[Q] match            over the indexed axes (others of extent 1)
        %y.val     = sum[Q] select(match, upd[r0, rest..], 0)
        %y         = map select(%y.hit, %y.val, x)

    An index outside its axis matches no element, so it writes nothing. Indices compare as
    float32 values, exact below 2**24 (`check_extent`); duplicates (undefined in ONNX) sum."""
    x, ids, upd = n.inputs
    shape, axes = n.type.shape, n.attr["axes"]
    rank, origin, y = len(shape), (n.origin,), n.output
    for a in axes:
        check_extent(n, shape[a])
    k, q = len(axes), types[ids].shape[:-1]
    count = int(np.prod(q, dtype=np.int64))
    rest = tuple(m for d, m in enumerate(shape) if d not in axes)
    ops: list[Op] = []
    if types[ids].shape != (count, k):
        ops.append(View(f"{y}.ids", TensorType(types[ids].dtype, (count, k)), ids, origin))
        ids = f"{y}.ids"
    if types[upd].shape != (count,) + rest:
        ops.append(View(f"{y}.upd", TensorType(types[upd].dtype, (count,) + rest), upd, origin))
        upd = f"{y}.upd"
    terms: list[Expr] = []
    for j, a in enumerate(axes):
        v = Load(ids, (Affine.var("r0"), Affine.of({}, j)))
        wrapped = Call("select", (Call("lt", (v, Const(0.0))), Call("add", (v, Const(float(shape[a])))), v))
        iota = _iota(f"{y}.iota{a}", shape[a], made)
        terms.append(Call("eq", (wrapped, Load(iota, (Affine.var(f"i{a}"),)))))
    match = terms[0]
    for t in terms[1:]:
        match = Call("and", (match, t))
    hit_shape = tuple(m if d in axes else 1 for d, m in enumerate(shape))
    hit_at = tuple(Affine.var(f"i{d}") if d in axes else ZERO for d in range(rank))
    upd_at = (Affine.var("r0"),) + tuple(Affine.var(f"i{d}") for d in range(rank) if d not in axes)
    same = tuple(Affine.var(f"i{d}") for d in range(rank))
    pick = Call("select", (Load(f"{y}.hit", hit_at), Load(f"{y}.val", same), Load(x, same)))
    return ops + [
        Compute(f"{y}.hit", TensorType("i32", hit_shape), "max", (count,), match, origin),
        Compute(f"{y}.val", n.type, "sum", (count,), Call("select", (match, Load(upd, upd_at), Const(0.0))), origin),
        Compute(y, n.type, "map", (), pick, origin),
    ]


DATA_LOWERINGS = {
    "ScatterND": scatter_nd,
    "Pad": pad,
    "CumSum": cumsum,
    "ArgMax": arg_extreme,
    "ArgMin": arg_extreme,
    "TopK": topk,
}
