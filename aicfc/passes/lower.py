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
online-reducible structure rather than a named softmax.
"""
from __future__ import annotations

from typing import Callable

from aicfc.errors import AicfError
from aicfc.ir.high import Graph, Node
from aicfc.ir.lowered import Affine, Call, Compute, Const, Expr, Load, Op, Program, View, identity_index, loads
from aicfc.ir.types import TensorType

ZERO = Affine()


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


def _softmax(n: Node, types: dict[str, TensorType]) -> list[Op]:
    x, t, axis = n.inputs[0], n.type, n.attr["axis"]
    rank = len(t.shape)
    stat_t = TensorType(t.dtype, tuple(1 if d == axis else s for d, s in enumerate(t.shape)))
    along = tuple(Affine.var("r0") if d == axis else Affine.var(f"i{d}") for d in range(rank))
    stat_at = tuple(ZERO if d == axis else Affine.var(f"i{d}") for d in range(rank))
    ident = identity_index(rank)
    y, origin, extent = n.output, (n.origin,), (t.shape[axis],)
    return [
        Compute(f"{y}.max", stat_t, "max", extent, Load(x, along), origin),
        Compute(f"{y}.exp", t, "map", (), Call("exp", (Call("sub", (Load(x, ident), Load(f"{y}.max", stat_at))),)), origin),
        Compute(f"{y}.sum", stat_t, "sum", extent, Load(f"{y}.exp", along), origin),
        Compute(y, t, "map", (), Call("div", (Load(f"{y}.exp", ident), Load(f"{y}.sum", stat_at))), origin),
    ]


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
    "Transpose": lambda n, types, _: _transpose(n, types),
    "Reshape": lambda n, _, __: [View(n.output, n.type, n.inputs[0], (n.origin,))],
    "Identity": _pointwise(lambda x: x),
    "Add": _pointwise(_call("add")),
    "Sub": _pointwise(_call("sub")),
    "Mul": _pointwise(_call("mul")),
    "Div": _pointwise(_call("div")),
    "Relu": _pointwise(lambda x: Call("max", (x, Const(0.0)))),
    "Sigmoid": _pointwise(_call("sigmoid")),
    "Tanh": _pointwise(_call("tanh")),
    "Erf": _pointwise(_call("erf")),
}


def lower(g: Graph) -> Program:
    types = g.types()
    scalars = {w.name: float(w.array().reshape(-1)[0]) for w in g.weights
               if w.type.numel == 1 and w.type.np_dtype.kind == "f"}
    ops: list[Op] = []
    for n in g.nodes:
        if n.op not in LOWERINGS:
            raise AicfError(f"internal: no lowering for {n.op} (node {n.origin!r}); canonicalize must run first")
        ops.extend(LOWERINGS[n.op](n, types, scalars))
    for o in g.outputs:
        if o not in {op.out for op in ops}:
            raise AicfError(f"graph output {o!r} is a model input or a constant; there is nothing to compute")
    used = {ld.buffer for op in ops if isinstance(op, Compute) for ld in loads(op.body)}
    used |= {op.source for op in ops if isinstance(op, View)}
    weights = tuple(w for w in g.weights if w.name in used)
    return Program(g.name, g.inputs, weights, tuple(ops), g.outputs)
