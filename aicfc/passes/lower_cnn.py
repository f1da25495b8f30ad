"""Lowering rules of the convolutional ops (used by `lower`; see [Note: Lowered IR]).

Every window op is a reduction over its window taps, its spatial reads guarded where the window
reaches into the padding (zeros for sums, -inf for a max):

    %y: f32[1,8,5,5] = Conv(%x, %w, %b) {pads=[1,1,1,1], strides=[2,2], kernel_shape=[3,3], group=1}
  becomes
    %y.acc: f32[1,8,5,5] = sum[3,3,3] mul(load(%x, [i0, r0, 2*i2+r1+-1, 2*i3+r2+-1], fill=0.0),
                                          load(%w, [i1, r0, r1, r2]))
    %y: f32[1,8,5,5] = map add(load(%y.acc, [i0, i1, i2, i3]), load(%b, [i1]))

A 1-D or 3-D op is the same with one tap variable per spatial axis (kernel_shape's length).
The conv is a contraction over (c, kh, kw): implicit GEMM with M = (n, oh, ow), N = the output
channel, K = (c, kh, kw) (`properties.implicit_gemm`). A grouped conv whose groups hold several
output channels computes [N, G, M/G, OH, OW] (the group a batch variable, every access affine)
and views it as [N, M, OH, OW]; with one output channel per group (depthwise) the channel
itself names the group. An average divides by the taps its window covers: a literal when every
window covers the same number, else a [OH, OW] constant of reciprocals made here.
"""
from __future__ import annotations

import itertools
import math

import numpy as np

from aicfc.ir.high import Node
from aicfc.ir import resize as rs
from aicfc.ir.lowered import Affine, Call, Compute, Const, Expr, Indirect, Load, Op, View, identity_index
from aicfc.ir.ops_cnn import pool_counts
from aicfc.ir.types import TensorType, Weight

ZERO = Affine()


def _tap(out_var: str, r_var: str, axis: int, at: dict) -> Affine:
    """Input index of an output position and a kernel tap along spatial `axis`: o·s + k·d - pad."""
    return Affine.of({out_var: at["strides"][axis], r_var: at["dilations"][axis]}, -at["pads"][axis])


def _guard(index: tuple[Affine, ...], extents: dict[str, int], shape: tuple[int, ...], fill: float) -> float | None:
    """`fill` when some window reaches outside the input (the load needs a guard), else None."""
    for a, n in zip(index, shape):
        lo, hi = a.bounds(extents)
        if lo < 0 or hi >= n:
            return fill
    return None


def _extents(out_shape: tuple[int, ...], reduce: tuple[int, ...]) -> dict[str, int]:
    return {**{f"i{k}": n for k, n in enumerate(out_shape)}, **{f"r{k}": n for k, n in enumerate(reduce)}}


def conv(n: Node, types: dict[str, TensorType], made: list[Weight]) -> list[Op]:
    """1, 2 or 3 spatial axes alike: one output variable and one tap variable (after r0, the
    input channel) per spatial axis; no view to a unit height is needed."""
    at, y, origin = n.attr, n.output, (n.origin,)
    x, w = n.inputs[0], n.inputs[1]
    xs, ws = types[x].shape, types[w].shape
    nd = len(ws) - 2
    g, m = at["group"], ws[0]
    cg, mg = ws[1], m // g
    reduce = (cg,) + tuple(ws[2:])
    taps = tuple(Affine.var(f"r{a + 1}") for a in range(nd))
    if g == 1 or mg == 1:
        shape = n.type.shape
        chan = Affine.var("r0") if g == 1 else Affine.of({"i1": cg, "r0": 1})
        xi = (Affine.var("i0"), chan) + tuple(_tap(f"i{a + 2}", f"r{a + 1}", a, at) for a in range(nd))
        wi = (Affine.var("i1"), Affine.var("r0") if cg > 1 else ZERO) + taps
        bias_at: tuple[Affine, ...] = (Affine.var("i1"),)
    else:   # [N, G, M/G, O..]: i1 the group, i2 the channel inside it
        shape = (xs[0], g, mg) + n.type.shape[2:]
        xi = (Affine.var("i0"), Affine.of({"i1": cg, "r0": 1})) + tuple(
            _tap(f"i{a + 3}", f"r{a + 1}", a, at) for a in range(nd))
        wi = (Affine.of({"i1": mg, "i2": 1}), Affine.var("r0") if cg > 1 else ZERO) + taps
        bias_at = (Affine.of({"i1": mg, "i2": 1}),)
    # A kernel extent of 1 is read at index 0 (as lowering writes every extent-1 access).
    wi = wi[:2] + tuple(ZERO if e == 1 else a for a, e in zip(wi[2:], ws[2:]))
    t = TensorType(n.type.dtype, shape)
    fill = _guard(xi, _extents(shape, reduce), xs, 0.0)
    body = Call("mul", (Load(x, xi, fill), Load(w, wi)))
    result = y if shape == n.type.shape and len(n.inputs) == 2 else f"{y}.acc"
    ops: list[Op] = [Compute(result, t, "sum", reduce, body, origin)]
    if len(n.inputs) == 3:
        biased = y if shape == n.type.shape else f"{y}.biased"
        ops.append(Compute(biased, t, "map", (), Call("add", (Load(result, identity_index(len(shape))),
                                                             Load(n.inputs[2], bias_at))), origin))
        result = biased
    if shape != n.type.shape:
        ops.append(View(y, n.type, result, origin))
    return ops


def pool(kind: str):
    def lower_node(n: Node, types: dict[str, TensorType], made: list[Weight]) -> list[Op]:
        at, y, origin, t = n.attr, n.output, (n.origin,), n.type
        x = n.inputs[0]
        xs = types[x].shape
        nd = len(xs) - 2
        reduce = tuple(at["kernel_shape"])
        xi = (Affine.var("i0"), Affine.var("i1")) + tuple(_tap(f"i{a + 2}", f"r{a}", a, at) for a in range(nd))
        fill = _guard(xi, _extents(t.shape, reduce), xs, -math.inf if kind == "max" else 0.0)
        if kind == "max":
            return [Compute(y, t, "max", reduce, Load(x, xi, fill), origin)]
        counts = pool_counts(xs[2:], at, t.shape[2:], bool(at["count_include_pad"]))
        ident = identity_index(nd + 2)
        if np.all(counts == counts.flat[0]):
            scale: Expr = Const(1.0 / float(counts.flat[0]))
        else:
            inv = Weight.of(f"{y}.inv_count", (1.0 / counts).astype(t.np_dtype))
            made.append(inv)
            scale = Load(inv.name, tuple(Affine.var(f"i{a + 2}") for a in range(nd)))
        return [Compute(f"{y}.sum", t, "sum", reduce, Load(x, xi, fill), origin),
                Compute(y, t, "map", (), Call("mul", (Load(f"{y}.sum", ident), scale)), origin)]
    return lower_node


def resize(n: Node, types: dict[str, TensorType], made: list[Weight]) -> list[Op]:
    """One map over the output (`aicfc.ir.resize`): Σ over the taps of every resized axis of
    the product of their weights and the input read through the taps' index tables.

        %y: f32[1,3,8,8] = Resize(%x) {mode=linear, scales=[1,1,2,2], ...}
      becomes
        %y: f32[1,3,8,8] = map add(add(add(mul(mul(load(%x, [i0, i1, @load(%y.idx2, [i2, 0]),
              @load(%y.idx3, [i3, 0])]), load(%y.wt2, [i2, 0])), load(%y.wt3, [i3, 0])), ...)))

    A nearest axis has one tap of weight 1: only the index is read (a gather)."""
    x, y, t, origin = n.inputs[0], n.output, n.type, (n.origin,)
    xs = types[x].shape
    tables = rs.axis_tables(xs, dict(n.attr))
    index: list[list[Affine | Indirect]] = [[Affine.var(f"i{a}")] for a in range(len(xs))]
    weights: dict[int, list[Expr | None]] = {}
    for a, (idx, wt) in tables.items():
        ids = Weight.of(f"{y}.idx{a}", idx.astype(np.int32 if xs[a] < 2 ** 31 else np.int64))
        made.append(ids)
        index[a] = [Indirect(Load(ids.name, (Affine.var(f"i{a}"), Affine.of({}, k)))) for k in range(idx.shape[1])]
        if np.all(wt == 1):
            weights[a] = [None] * idx.shape[1]
            continue
        w = Weight.of(f"{y}.wt{a}", wt.astype(t.np_dtype))
        made.append(w)
        weights[a] = [Load(w.name, (Affine.var(f"i{a}"), Affine.of({}, k))) for k in range(wt.shape[1])]
    body: Expr | None = None
    for combo in itertools.product(*(range(len(entries)) for entries in index)):
        term: Expr = Load(x, tuple(index[a][k] for a, k in enumerate(combo)))
        for a, k in enumerate(combo):
            factor = weights.get(a, [None] * len(index[a]))[k]
            if factor is not None:
                term = Call("mul", (term, factor))
        body = term if body is None else Call("add", (body, term))
    assert body is not None
    return [Compute(y, t, "map", (), body, origin)]


def global_average_pool(n: Node, types: dict[str, TensorType], made: list[Weight]) -> list[Op]:
    """A mean over the spatial positions: the input viewed as [N, C, H·W] rows, one sum per row."""
    x, y, t, origin = n.inputs[0], n.output, n.type, (n.origin,)
    xs = types[x].shape
    hw = math.prod(xs[2:])
    rows = TensorType(t.dtype, xs[:2] + (hw,))
    stat = TensorType(t.dtype, xs[:2] + (1,))
    body = Call("mul", (Load(f"{y}.rows", (Affine.var("i0"), Affine.var("i1"), Affine.var("r0"))), Const(1.0 / hw)))
    return [View(f"{y}.rows", rows, x, origin), Compute(f"{y}.mean", stat, "sum", (hw,), body, origin),
            View(y, t, f"{y}.mean", origin)]


def global_max_pool(n: Node, types: dict[str, TensorType], made: list[Weight]) -> list[Op]:
    """A maximum over the spatial positions: the input viewed as [N, C, H·W] rows, one max per row."""
    x, y, t, origin = n.inputs[0], n.output, n.type, (n.origin,)
    xs = types[x].shape
    rows = TensorType(t.dtype, xs[:2] + (math.prod(xs[2:]),))
    stat = TensorType(t.dtype, xs[:2] + (1,))
    body = Load(f"{y}.rows", (Affine.var("i0"), Affine.var("i1"), Affine.var("r0")))
    return [View(f"{y}.rows", rows, x, origin), Compute(f"{y}.max", stat, "max", (math.prod(xs[2:]),), body, origin),
            View(y, t, f"{y}.max", origin)]


def lrn(n: Node, types: dict[str, TensorType], made: list[Weight]) -> list[Op]:
    """y = x / (bias + α/size · Σ_window x²)^β, the power as exp(β·log(·)) (its base is positive)."""
    at, x, y, t, origin = n.attr, n.inputs[0], n.output, n.type, (n.origin,)
    size = at["size"]
    rank = len(t.shape)
    ident = identity_index(rank)
    xi = ident[:1] + (Affine.of({"i1": 1, "r0": 1}, -((size - 1) // 2)),) + ident[2:]
    fill = _guard(xi, _extents(t.shape, (size,)), t.shape, 0.0)
    sq = Load(x, xi, fill)
    base = Call("add", (Const(at["bias"]), Call("mul", (Const(at["alpha"] / size), Load(f"{y}.sq", ident)))))
    power = Call("exp", (Call("mul", (Const(at["beta"]), Call("log", (base,)))),))
    return [Compute(f"{y}.sq", t, "sum", (size,), Call("mul", (sq, sq)), origin),
            Compute(y, t, "map", (), Call("div", (Load(x, ident), power)), origin)]


def batch_norm(n: Node, types: dict[str, TensorType], made: list[Weight]) -> list[Op]:
    """A BatchNormalization canonicalize could not fold (its statistics are not constants):
    (x - mean[c]) / sqrt(var[c] + ε) · scale[c] + bias[c], one map."""
    x, scale, bias, mean, var = n.inputs
    t = n.type
    ident = identity_index(len(t.shape))
    c = (Affine.var("i1"),)
    norm = Call("div", (Call("sub", (Load(x, ident), Load(mean, c))),
                        Call("sqrt", (Call("add", (Load(var, c), Const(n.attr["epsilon"]))),))))
    body = Call("add", (Call("mul", (norm, Load(scale, c))), Load(bias, c)))
    return [Compute(n.output, t, "map", (), body, (n.origin,))]


def clip(n: Node, types: dict[str, TensorType], made: list[Weight]) -> list[Op]:
    body: Expr = Load(n.inputs[0], identity_index(len(n.type.shape)))
    if n.attr["min"] != -math.inf:
        body = Call("max", (body, Const(n.attr["min"])))
    if n.attr["max"] != math.inf:
        body = Call("min", (body, Const(n.attr["max"])))
    return [Compute(n.output, n.type, "map", (), body, (n.origin,))]


def variadic_sum(n: Node, types: dict[str, TensorType], made: list[Weight]) -> list[Op]:
    from aicfc.passes.lower import broadcast_index
    args = [Load(i, broadcast_index(types[i].shape, n.type.shape)) for i in n.inputs]
    body: Expr = args[0]
    for a in args[1:]:
        body = Call("add", (body, a))
    return [Compute(n.output, n.type, "map", (), body, (n.origin,))]


def identity(n: Node, types: dict[str, TensorType], made: list[Weight]) -> list[Op]:
    return [Compute(n.output, n.type, "map", (), Load(n.inputs[0], identity_index(len(n.type.shape))), (n.origin,))]


def concat(n: Node, types: dict[str, TensorType], made: list[Weight]) -> list[Op]:
    """Concat along any axis as one map over the output: y[.., i, ..] = Σ_k x_k[.., i - off_k, ..],
    each term a load guarded along the axis, so exactly one term reads its input and the others
    read the fill. The fill is -0.0, the identity of +: x + (-0.0) is x for every x, -0.0 and
    NaN included, so the sum is an exact copy. Codegen gives each term one unsigned comparison
    and a predicated read; no select needs the index as a value.

        %y: f32[1,6,4,4] = Concat(%a, %b) {axis=1}     (a: 2 channels, b: 4)
      becomes
        %y: f32[1,6,4,4] = map add(load(%a, [i0, i1, i2, i3], fill=-0.0, guard=[1]),
                                   load(%b, [i0, i1+-2, i2, i3], fill=-0.0))
    """
    axis = n.attr["axis"]
    ident = identity_index(len(n.type.shape))
    if len(n.inputs) == 1:
        return [Compute(n.output, n.type, "map", (), Load(n.inputs[0], ident), (n.origin,))]
    body: Expr | None = None
    offset = 0
    for x in n.inputs:
        index = ident[:axis] + (Affine.of({f"i{axis}": 1}, -offset),) + ident[axis + 1:]
        term = Load(x, index, -0.0, (axis,) if offset == 0 else ())
        body = term if body is None else Call("add", (body, term))
        offset += types[x].shape[axis]
    assert body is not None
    return [Compute(n.output, n.type, "map", (), body, (n.origin,))]


CNN_LOWERINGS = {
    "Conv": conv, "MaxPool": pool("max"), "AveragePool": pool("avg"), "GlobalAveragePool": global_average_pool,
    "GlobalMaxPool": global_max_pool,
    "LRN": lrn, "BatchNormalization": batch_norm, "Clip": clip, "Sum": variadic_sum, "Dropout": identity,
    "Concat": concat, "Resize": resize,
}
