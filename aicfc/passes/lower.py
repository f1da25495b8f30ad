"""lower: High IR → Lowered IR. Each op becomes compute definitions; no kernel is named here.

Preconditions: `canonicalize` ran (no Gemm, no Identity except as an output copy).

    %h: f32[4,128] = MatMul(%x, %w)            %h: f32[4,128] = sum[64] mul(load(%x, [i0, r0]),
                                                                         load(%w, [r0, i1]))
    %y: f32[4,8] = Softmax(%z) {axis=1}        %y.max: f32[4,1] = max[8] load(%z, [i0, r0])
                                                %y.exp: f32[4,8] = map exp(sub(load(%z, [i0, i1]),
                                                                       load(%y.max, [i0, 0])))
                                                %y.sum: f32[4,1] = sum[8] load(%y.exp, [i0, r0])
                                                %y: f32[4,8] = map div(load(%y.exp, [i0, i1]),
                                                                       load(%y.sum, [i0, 0]))
Softmax is stated as its two reductions and two maps so that the fusion passes can see the
online-reducible structure rather than a named softmax. Norms likewise: a mean is a sum of
x·(1/n), so LayerNormalization and the decomposition torch's older exporter emits (ReduceMean,
Sub, Pow 2, ReduceMean, Add ε, Sqrt, Div, Mul, Add) give the same computes once
`inline_producers` has run:

    %y: f32[4,8] = LayerNormalization(%x, %g, %b) {axis=1, epsilon=1e-05}
  becomes
    %y.mean: f32[4,1] = sum[8] mul(load(%x, [i0, r0]), 0.125)
    %y.var: f32[4,1] = sum[8] mul(mul(sub(load(%x, [i0, r0]), load(%y.mean, [i0, 0])),
                                      sub(load(%x, [i0, r0]), load(%y.mean, [i0, 0]))), 0.125)
    %y: f32[4,8] = map add(mul(div(sub(load(%x, [i0, i1]), load(%y.mean, [i0, 0])),
                                   sqrt(add(load(%y.var, [i0, 0]), 1e-05))), load(%g, [i1])), load(%b, [i1]))
A LayerNormalization over several trailing axes normalizes a [outer, inner] view of its input.
"""
from __future__ import annotations

import math
from typing import Callable

from aicfc.errors import AicfError
from aicfc.ir.high import Graph, Node
from aicfc.ir.lowered import (INTEGER_DTYPES, Affine, Call, Compute, Const, Expr, Indirect, Load, Op, Program,
                              Rewrite, View, identity_index, loads)
from aicfc.ir.properties import ONLINE
from aicfc.ir.types import TensorType, Weight, contiguous_strides
from aicfc.passes.canonicalize import BN_FOLD_RULE, CANON_REASONS
from aicfc.passes.lower_cnn import CNN_LOWERINGS
from aicfc.passes.lower_elementwise import ELEMENTWISE_LOWERINGS
from aicfc.passes.lower_data import DATA_LOWERINGS

ZERO = Affine()
NORM_RULE = "LayerNormalization => mean and variance sums + normalize map"
RMS_RULE = "RMSNormalization => mean-square sum + normalize map"


def broadcast_index(in_shape: tuple[int, ...], out_shape: tuple[int, ...]) -> tuple[Affine, ...]:
    """numpy broadcasting as an access: right-aligned, size-1 dimensions read index 0."""
    offset = len(out_shape) - len(in_shape)
    return tuple(ZERO if n == 1 else Affine.var(f"i{k + offset}") for k, n in enumerate(in_shape))


def _load_bcast(name: str, types: dict[str, TensorType], out: TensorType,
                scalars: dict[str, float]) -> Expr:
    """A broadcast read; a one-element constant becomes a literal (a host-side scalar)."""
    if name in scalars:
        return Const(scalars[name])
    return Load(name, broadcast_index(types[name].shape, out.shape))


def _matmul(n: Node, types: dict[str, TensorType]) -> list[Op]:
    a, b = (types[i].shape for i in n.inputs)
    rank = len(n.type.shape)
    k = Affine.var("r0")
    batch_rank = rank - (len(a) > 1) - (len(b) > 1)

    def batch(shape: tuple[int, ...]) -> tuple[Affine, ...]:
        return broadcast_index(shape, n.type.shape[:batch_rank])

    if len(a) == 1:
        ia: tuple[Affine, ...] = (k,)
    else:
        ia = batch(a[:-2]) + (Affine.var(f"i{batch_rank}"), k)
    if len(b) == 1:
        ib: tuple[Affine, ...] = (k,)
    else:
        ib = batch(b[:-2]) + (k, Affine.var(f"i{rank - 1}"))
    body = Call("mul", (Load(n.inputs[0], ia), Load(n.inputs[1], ib)))
    return [Compute(n.output, n.type, "sum", (a[-1],), body, (n.origin,))]


def _row_access(t: TensorType, axis: int) -> tuple[TensorType, tuple[Affine, ...], tuple[Affine, ...]]:
    """For a row pass along `axis` of a `t`: its statistics' type (the axis kept as 1), the index that reads
    along the axis (r0) and the index of an element's statistic."""
    rank = len(t.shape)
    stat_t = TensorType(t.dtype, tuple(1 if d == axis else s for d, s in enumerate(t.shape)))
    along = tuple(Affine.var("r0") if d == axis else Affine.var(f"i{d}") for d in range(rank))
    stat_at = tuple(ZERO if d == axis else Affine.var(f"i{d}") for d in range(rank))
    return stat_t, along, stat_at


def _softmax(n: Node, types: dict[str, TensorType]) -> list[Op]:
    x, t, axis = n.inputs[0], n.type, n.attr["axis"]
    stat_t, along, stat_at = _row_access(t, axis)
    ident = identity_index(len(t.shape))
    y, origin, extent = n.output, (n.origin,), (t.shape[axis],)
    return [
        Compute(f"{y}.max", stat_t, "max", extent, Load(x, along), origin),
        Compute(f"{y}.exp", t, "map", (), Call("exp", (Call("sub", (Load(x, ident), Load(f"{y}.max", stat_at))),)), origin),
        Compute(f"{y}.sum", stat_t, "sum", extent, Load(f"{y}.exp", along), origin),
        Compute(y, t, "map", (), Call("div", (Load(f"{y}.exp", ident), Load(f"{y}.sum", stat_at))), origin),
    ]


def _log_softmax(n: Node, types: dict[str, TensorType]) -> list[Op]:
    """x - m - log(sum(exp(x - m))), m the maximum along the axis: never log(0) where Softmax underflows."""
    x, t, axis = n.inputs[0], n.type, n.attr["axis"]
    stat_t, along, stat_at = _row_access(t, axis)
    y, origin, extent = n.output, (n.origin,), (t.shape[axis],)
    shifted = Call("exp", (Call("sub", (Load(x, along), Load(f"{y}.max", stat_at))),))
    log_sum = Call("log", (Load(f"{y}.sum", stat_at),))
    return [
        Compute(f"{y}.max", stat_t, "max", extent, Load(x, along), origin),
        Compute(f"{y}.sum", stat_t, "sum", extent, shifted, origin),
        Compute(y, t, "map", (), Call("sub", (Call("sub", (Load(x, identity_index(len(t.shape))), Load(f"{y}.max", stat_at))),
                                               log_sum)), origin),
    ]


def _reduce(combiner: str, mean: bool = False, pre: str | None = None, post: str | None = None,
            stable_exp: bool = False) -> Callable[..., list[Op]]:
    """ReduceSum/Max/Min/Prod/Mean/L2/SumSquare/L1/LogSum/LogSumExp over their one axis with more
    than one element (the importer refuses more); a mean is the sum of x·(1/n); `pre` maps each
    element before the reduction (square: L2, SumSquare; abs: L1), `post` the result after it
    (sqrt: L2; log: LogSum); LogSumExp (`stable_exp`) is m + log(sum(exp(x - m))), m the maximum,
    two reductions and a map. Reduced axes of one element read 0."""
    def lower_node(n: Node, types: dict[str, TensorType], _: dict[str, float]) -> list[Op]:
        src = types[n.inputs[0]].shape
        axes, keep = n.attr["axes"], n.attr["keepdims"]
        kept = [d for d in range(len(src)) if keep or d not in axes]
        wide = [a for a in axes if src[a] > 1]
        index = tuple(Affine.var("r0") if d in wide else ZERO if d in axes else Affine.var(f"i{kept.index(d)}")
                      for d in range(len(src)))
        body: Expr = Load(n.inputs[0], index)
        if pre == "square":
            body = Call("mul", (body, body))
        elif pre:
            body = Call(pre, (body,))
        origin, out = (n.origin,), identity_index(len(n.type.shape))
        if not wide:
            return [Compute(n.output, n.type, "map", (), Call(post, (body,)) if post else body, origin)]
        extent = src[wide[0]]
        if mean:
            body = Call("mul", (body, Const(1.0 / extent)))
        if stable_exp:
            m, s = f"{n.output}.max", f"{n.output}.sumexp"
            shifted = Call("exp", (Call("sub", (body, Load(m, out))),))
            return [Compute(m, n.type, "max", (extent,), body, origin), Compute(s, n.type, "sum", (extent,), shifted, origin),
                    Compute(n.output, n.type, "map", (), Call("add", (Load(m, out), Call("log", (Load(s, out),)))), origin)]
        if post:
            r = f"{n.output}.sumsq" if pre == "square" else f"{n.output}.{combiner}"
            return [Compute(r, n.type, combiner, (extent,), body, origin),
                    Compute(n.output, n.type, "map", (), Call(post, (Load(r, out),)), origin)]
        return [Compute(n.output, n.type, combiner, (extent,), body, origin)]
    return lower_node


def _pow(exponent: float, x: Expr) -> Expr:
    """x**e for the exponents the importer admits: ±0.5 by a square root, integers by products."""
    if abs(exponent) == 0.5:
        root = Call("sqrt", (x,))
        return root if exponent > 0 else Call("div", (Const(1.0), root))
    k = int(exponent)
    if k == 0:
        return Const(1.0)
    p = x
    for _ in range(abs(k) - 1):
        p = Call("mul", (p, x))
    return p if k > 0 else Call("div", (Const(1.0), p))


def _layer_norm(n: Node, types: dict[str, TensorType], scalars: dict[str, float]) -> list[Op]:
    """mean = Σ x·(1/n); var = Σ (x - mean)²·(1/n); y = (x - mean) / sqrt(var + ε) · scale + bias,
    over the last axis of x (or of its [outer, inner] view when several axes are normalized):
    the same computes as the exported decomposition, with property `online_reducible_norm`.
    RMSNormalization is the same without the mean: ms = Σ x²·(1/n); y = x / sqrt(ms + ε) · scale,
    the computes of torch's exported RMSNorm (Pow, ReduceMean, Add, Sqrt, Reciprocal, Mul)."""
    rms = n.op == "RMSNormalization"
    x, y, t, axis = n.inputs[0], n.output, n.type, n.attr["axis"]
    origin = (n.origin,)
    ops: list[Op] = []
    shape = t.shape
    if axis < len(shape) - 1:
        # Normalizing several trailing axes: work on the [outer, inner] view. Scale and bias
        # must then cover every normalized element (a view of them, no broadcast left).
        shape = (math.prod(shape[:axis]), math.prod(shape[axis:]))
        params = []
        for p in n.inputs[1:]:
            if types[p].numel != shape[1]:
                raise AicfError(f"node {n.origin!r}: {n.op} over axes {axis}.. with "
                                f"{'scale' if p == n.inputs[1] else 'bias'} {list(types[p].shape)} "
                                f"broadcast inside the normalized dims is not supported")
            params.append(View(f"{y}.{'scale' if p == n.inputs[1] else 'bias'}", TensorType(t.dtype, shape[1:]),
                               p, origin))
        ops += [View(f"{y}.in", TensorType(t.dtype, shape), x, origin), *params]
        x, inputs = f"{y}.in", (f"{y}.in",) + tuple(v.out for v in params)
        y = f"{y}.out"
        types = {**types, **{v.out: v.type for v in ops}}
    else:
        inputs = n.inputs
    rank = len(shape)
    stat_t = TensorType(t.dtype, shape[:-1] + (1,))
    row = tuple(Affine.var(f"i{d}") for d in range(rank - 1))
    along, stat_at, ident = row + (Affine.var("r0"),), row + (ZERO,), identity_index(rank)
    inv_n = Const(1.0 / shape[-1])
    work = TensorType(t.dtype, shape)

    def centered(index: tuple[Affine, ...]) -> Expr:
        return Load(x, index) if rms else Call("sub", (Load(x, index), Load(f"{y}.mean", stat_at)))
    var = f"{y}.ms" if rms else f"{y}.var"   # the mean square, or the variance
    norm = Call("div", (centered(ident), Call("sqrt", (Call("add", (Load(var, stat_at),
                                                                       Const(n.attr["epsilon"]))),))))
    out: Expr = Call("mul", (norm, _load_bcast(inputs[1], types, work, scalars)))
    if len(inputs) == 3:
        out = Call("add", (out, _load_bcast(inputs[2], types, work, scalars)))
    if not rms:
        ops.append(Compute(f"{y}.mean", stat_t, "sum", shape[-1:], Call("mul", (Load(x, along), inv_n)), origin))
    ops += [
        Compute(var, stat_t, "sum", shape[-1:], Call("mul", (Call("mul", (centered(along), centered(along))), inv_n)),
                origin),
        Compute(y, work, "map", (), out, origin),
    ]
    if y != n.output:
        ops.append(View(n.output, t, y, origin))
    return ops


def _transpose(n: Node, types: dict[str, TensorType]) -> list[Op]:
    perm = n.attr["perm"]
    index = [ZERO] * len(perm)
    for k, p in enumerate(perm):
        index[p] = Affine.var(f"i{k}")
    return [Compute(n.output, n.type, "map", (), Load(n.inputs[0], tuple(index)), (n.origin,))]


def _pointwise(build: Callable[..., Expr]) -> Callable[..., list[Op]]:
    def lower_node(n: Node, types: dict[str, TensorType], scalars: dict[str, float]) -> list[Op]:
        args = [_load_bcast(i, types, n.type, scalars) for i in n.inputs]
        return [Compute(n.output, n.type, "map", (), build(*args), (n.origin,))]
    return lower_node


def _call(fn: str) -> Callable[..., Expr]:
    return lambda *args: Call(fn, tuple(args))


LOWERINGS: dict[str, Callable[..., list[Op]]] = {
    "MatMul": lambda n, types, _: _matmul(n, types),
    "Softmax": lambda n, types, _: _softmax(n, types),
    "LogSoftmax": lambda n, types, _: _log_softmax(n, types),
    "Transpose": lambda n, types, _: _transpose(n, types),
    "Reshape": lambda n, _, __: [View(n.output, n.type, n.inputs[0], (n.origin,))],
    "Identity": _pointwise(lambda x: x),
    "Add": _pointwise(_call("add")),
    "Sub": _pointwise(_call("sub")),
    "Mul": _pointwise(_call("mul")),
    "Div": lambda n, types, scalars: _pointwise(_call("idiv" if n.type.dtype in INTEGER_DTYPES else "div"))(
        n, types, scalars),
    "Relu": _pointwise(lambda x: Call("max", (x, Const(0.0)))),
    "Sigmoid": _pointwise(_call("sigmoid")),
    "Tanh": _pointwise(_call("tanh")),
    "Erf": _pointwise(_call("erf")),
    "Sqrt": _pointwise(_call("sqrt")),
    "Exp": _pointwise(_call("exp")),
    "Reciprocal": _pointwise(lambda x: Call("div", (Const(1.0), x))),
    "Cast": _pointwise(lambda x: x),
    "Pow": lambda n, types, scalars: _pointwise(lambda x: _pow(n.attr["exponent"], x))(n, types, scalars),
    "ReduceMean": _reduce("sum", mean=True),
    "ReduceSum": _reduce("sum"),
    "ReduceMax": _reduce("max"),
    "LayerNormalization": _layer_norm,
    "RMSNormalization": _layer_norm,
}
LOWERINGS.update({"Cos": _pointwise(_call("cos")), "Sin": _pointwise(_call("sin"))})


# Lowerings that may make constants of their own (an average pool's divisors, Trilu's band,
# ArgMax's and TopK's index iotas).
MAKING_CONSTANTS = CNN_LOWERINGS | ELEMENTWISE_LOWERINGS | DATA_LOWERINGS


def _rule_record(n: Node) -> Rewrite:
    """The record of the canonicalize rewrite that made `n` (its attribute `rule`; `why` and `saved`, where
    the rewrite weighed bytes, give its numbers), on the value it made or, where the rewrite names one,
    its `site` (a merged projection's: the sum it replaced, as the record of a site kept apart names it)."""
    why = f"; {n.attr['why']}" if n.attr.get("why") else ""
    return Rewrite(n.attr["rule"], n.attr.get("site", n.output), True, CANON_REASONS[n.attr["rule"]] + why,
                   n.attr.get("saved", 0))


def lower(g: Graph) -> Program:
    types = g.types()
    scalars = {w.name: float(w.array().reshape(-1)[0]) for w in g.weights
               if w.type.numel == 1 and w.type.np_dtype.kind == "f"}
    ops: list[Op] = []
    records: list[Rewrite] = []
    made: list[Weight] = []   # constants a CNN lowering makes (an average pool's divisors)
    for n in g.nodes:
        if n.op in MAKING_CONSTANTS:
            ops.extend(MAKING_CONSTANTS[n.op](n, types, made))
            if n.op == "Conv" and "folded" in n.attr:
                records.append(Rewrite(BN_FOLD_RULE, n.output, True, f"BatchNormalization {n.attr['folded']!r} "
                                       "folded into the weights and bias at compile time", 2 * n.type.nbytes))
            if "rule" in n.attr:   # a Conv the importer wrote for a ConvTranspose, a Concat of projections
                records.append(_rule_record(n))
            continue
        if n.op not in LOWERINGS:
            raise AicfError(f"internal: no lowering for {n.op} (node {n.origin!r}); canonicalize must run first")
        ops.extend(LOWERINGS[n.op](n, types, scalars))
        if n.op == "MatMul" and "folded" in n.attr:   # a pointwise Conv's, folded before it became a MatMul
            records.append(Rewrite(BN_FOLD_RULE, n.output, True, f"BatchNormalization {n.attr['folded']!r} "
                                   "folded into the weights and bias at compile time", 2 * n.type.nbytes))
        if "rule" in n.attr:   # a canonicalize rewrite (SCALE_RULE, VIEW_RULE) made this node
            records.append(_rule_record(n))
        if n.op == "LayerNormalization":
            records.append(Rewrite(NORM_RULE, n.output, True, f"{ONLINE}: mean and variance are sums "
                                   "whose partial (count, mean, M2) states merge (Chan), so one row pass suffices"))
        if n.op == "RMSNormalization":
            records.append(Rewrite(RMS_RULE, n.output, True, f"{ONLINE}: the mean square is a sum whose "
                                   "partial sums merge by addition, so one row pass suffices"))
    constants = g.weight_map()
    for o in g.outputs:
        if o in constants and o not in {op.out for op in ops}:
            # An output folded to a constant (shape arithmetic, a Constant) is copied from a weight.
            w = constants.pop(o)
            constants[f"{o}.const"] = Weight(f"{o}.const", w.type, w.data)
            ops.append(Compute(o, w.type, "map", (), Load(f"{o}.const", identity_index(len(w.type.shape))), ()))
    for o in g.outputs:
        if o not in {op.out for op in ops}:
            raise AicfError(f"graph output {o!r} is a model input or a constant; there is nothing to compute")
    # A view of a weight (a LayerNormalization's scale over several axes) is the same bytes
    # under another shape: a weight of its own, so no view ever starts in the weights.
    known = constants | {w.name: w for w in made}
    for op in ops:
        if isinstance(op, View) and op.source in known:
            known[op.out] = Weight(op.out, op.type, known[op.source].data)
    ops = [op for op in ops if not (isinstance(op, View) and op.out in known)]
    used = {ld.buffer for op in ops if isinstance(op, Compute) for ld in loads(op.body)}
    used |= {op.source for op in ops if isinstance(op, View)}
    weights = tuple(w for w in known.values() if w.name in used)
    return Program(g.name, g.inputs, weights, tuple(ops), g.outputs, tuple(records))


# ---------------------------------------------------------------- data ops (issue 6)
# Views move no data; Expand, Slice and constant-index Gather are affine accesses (a strided
# or broadcast load); Where and Equal are scalar functions of the Lowered IR (`select`, `eq`;
# a bool is 0.0 or 1.0 inside a body, stored as a bool); Cast is a copy whose store converts.

def _expand(n: Node, types: dict[str, TensorType], _: dict[str, float]) -> list[Op]:
    return [Compute(n.output, n.type, "map", (), Load(n.inputs[0], broadcast_index(types[n.inputs[0]].shape,
                                                                                      n.type.shape)), (n.origin,))]


def _slice(n: Node, types: dict[str, TensorType], _: dict[str, float]) -> list[Op]:
    at = n.attr
    index = tuple(Affine.of({f"i{d}": k}, s) for d, (s, k) in enumerate(zip(at["starts"], at["steps"])))
    return [Compute(n.output, n.type, "map", (), Load(n.inputs[0], index), (n.origin,))]


def _gather(n: Node, types: dict[str, TensorType], _: dict[str, float]) -> list[Op]:
    """out[a.., j.., b..] = data[a.., start + step·flat(j..), b..] for constant indices in
    arithmetic progression; data[a.., @ids[j..], b..] (an indirect index, [Note: Indirect
    index]) for any other indices: an embedding lookup is a map reading one row per id."""
    data, ids = (types[i].shape for i in n.inputs)
    at = n.attr
    axis, k = at["axis"], len(types[n.inputs[1]].shape)
    if "start" not in at:
        at_ids = tuple(Affine.var(f"i{axis + d}") if m > 1 else ZERO for d, m in enumerate(ids))
        entries: list[Affine | Indirect] = [Affine.var(f"i{d}") for d in range(axis)]
        entries += [Indirect(Load(n.inputs[1], at_ids))]
        entries += [Affine.var(f"i{d + k - 1}") for d in range(axis + 1, len(data))]
        return [Compute(n.output, n.type, "map", (), Load(n.inputs[0], tuple(entries)), (n.origin,))]
    flat: dict[str, int] = {}
    for d, stride in enumerate(contiguous_strides(ids)):
        if ids[d] > 1:
            flat[f"i{axis + d}"] = stride * at["step"]
    index = [Affine.var(f"i{d}") for d in range(axis)] + [Affine.of(flat, at["start"])]
    index += [Affine.var(f"i{d + k - 1}") for d in range(axis + 1, len(data))]
    return [Compute(n.output, n.type, "map", (), Load(n.inputs[0], tuple(index)), (n.origin,))]


def _gather_elements(n: Node, types: dict[str, TensorType], _: dict[str, float]) -> list[Op]:
    """out[i..] = data[i.. with dim `axis` replaced by @ids[i..]]: one indirect index."""
    axis, rank = n.attr["axis"], len(n.type.shape)
    ids = Load(n.inputs[1], tuple(Affine.var(f"i{d}") for d in range(rank)))
    index = tuple(Indirect(ids) if d == axis else Affine.var(f"i{d}") for d in range(rank))
    return [Compute(n.output, n.type, "map", (), Load(n.inputs[0], index), (n.origin,))]


def _gather_nd(n: Node, types: dict[str, TensorType], _: dict[str, float]) -> list[Op]:
    """out[b.., j.., t..] = data[b.., @ids[b.., j.., 0], .., @ids[b.., j.., k-1], t..]: one
    indirect index per gathered dimension of data."""
    data, ids = (types[i].shape for i in n.inputs)
    b, k = n.attr["batch_dims"], ids[-1]
    mid = len(ids) - 1 - b   # the j.. variables
    def at(c: int) -> Load:
        return Load(n.inputs[1], tuple(Affine.var(f"i{d}") for d in range(b + mid)) + (Affine.of({}, c),))
    index = [Affine.var(f"i{d}") for d in range(b)] + [Indirect(at(c)) for c in range(k)]
    index += [Affine.var(f"i{b + mid + d}") for d in range(len(data) - b - k)]
    return [Compute(n.output, n.type, "map", (), Load(n.inputs[0], tuple(index)), (n.origin,))]


def _variadic(fn: str) -> Callable[..., list[Op]]:
    def build(*args: Expr) -> Expr:
        out = args[0]
        for a in args[1:]:
            out = Call(fn, (out, a))
        return out
    return _pointwise(build)


LOWERINGS.update({
    "Unsqueeze": LOWERINGS["Reshape"],
    "Squeeze": LOWERINGS["Reshape"],
    "Flatten": LOWERINGS["Reshape"],
    "Expand": _expand,
    "Slice": _slice,
    "Gather": _gather,
    "Neg": _pointwise(_call("neg")),
    "Log": _pointwise(_call("log")),
    "Max": _variadic("max"),
    "Min": _variadic("min"),
    "Equal": _pointwise(_call("eq")),
    "Where": _pointwise(_call("select")),
    "Greater": _pointwise(_call("gt")),
    "Less": _pointwise(_call("lt")),
    "GreaterOrEqual": _pointwise(_call("ge")),
    "LessOrEqual": _pointwise(_call("le")),
    "And": _pointwise(_call("and")),
    "Or": _pointwise(_call("or")),
    "Xor": _pointwise(_call("xor")),
    "Not": _pointwise(_call("not")),
    "IsNaN": _pointwise(_call("isnan")),
    "GatherElements": _gather_elements,
    "GatherND": _gather_nd,
})

# Reductions of issue 18 (ReduceMin and ReduceProd reduce with the `min` and `prod` combiners).
LOWERINGS.update({"ReduceMin": _reduce("min"), "ReduceProd": _reduce("prod"),
                  "ReduceL2": _reduce("sum", pre="square", post="sqrt"), "ReduceSumSquare": _reduce("sum", pre="square"),
                  "ReduceL1": _reduce("sum", pre="abs"), "ReduceLogSum": _reduce("sum", post="log"),
                  "ReduceLogSumExp": _reduce("sum", stable_exp=True)})
