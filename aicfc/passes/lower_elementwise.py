"""Lowerings of issue 18's element-wise ops (rows in ir/ops_elementwise.py): each is one map.

The activations are stated with the Lowered IR's scalar functions, so every rule that reads
maps sees them as it sees Relu or an exported erf-GELU: inlined into their consumers, absorbed
as a GEMM or convolution epilogue ("contraction + map => gemm epilogue"):

    %y: f32[4,8] = HardSwish(%x)      %y: f32[4,8] = map mul(load(%x, [i0, i1]),
                                          max(min(add(mul(load(%x, [i0, i1]), 0.16666666666666666), 0.5), 1.0), 0.0))

Trilu keeps x where the diagonal offset j - i reaches k (upper; lower: where it stays at or
below k) and writes 0 elsewhere. The condition on the indices is a guarded load of a constant
band of ones made here: `load(%y.band, [i1 - i0 - k], fill=0.0)` is 1 exactly where the
offset lies inside the band, and codegen tests that with one unsigned comparison:

    %y: f32[2,4,5] = Trilu(%x) {k=1, upper=1}
  becomes
    %y: f32[2,4,5] = map select(load(%y.band, [-1*i1+i2+-1], fill=0.0), load(%x, [i0, i1, i2]), 0.0)
with %y.band a bool[4] constant of ones (offsets 1..4 kept).
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from aicfc.ir.high import Node
from aicfc.ir.lowered import Affine, Call, Compute, Const, Expr, Load, Op, identity_index
from aicfc.ir.ops_elementwise import GELU_CUBIC, SQRT_2_OVER_PI
from aicfc.ir.types import TensorType, Weight


def _map(build: Callable[..., Expr]) -> Callable[[Node, dict[str, TensorType], list[Weight]], list[Op]]:
    """A map of `build` over the node's inputs, read with numpy broadcasting."""
    def lower_node(n: Node, types: dict[str, TensorType], made: list[Weight]) -> list[Op]:
        from aicfc.passes.lower import broadcast_index
        args = [Load(i, broadcast_index(types[i].shape, n.type.shape)) for i in n.inputs]
        return [Compute(n.output, n.type, "map", (), build(n, *args), (n.origin,))]
    return lower_node


def hard_sigmoid(x: Expr, alpha: float, beta: float) -> Expr:
    """max(0, min(1, alpha·x + beta)), in ONNX's order."""
    return Call("max", (Call("min", (Call("add", (Call("mul", (x, Const(alpha))), Const(beta))), Const(1.0))), Const(0.0)))


def gelu(x: Expr, approximate: str) -> Expr:
    """0.5·x·(1 + erf(x/√2)), or with approximate="tanh" 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))."""
    if approximate == "tanh":
        cube = Call("mul", (Call("mul", (x, x)), x))
        inner = Call("mul", (Const(SQRT_2_OVER_PI), Call("add", (x, Call("mul", (Const(GELU_CUBIC), cube))))))
        gate = Call("tanh", (inner,))
    else:
        gate = Call("erf", (Call("div", (x, Const(float(np.sqrt(2.0))))),))
    return Call("mul", (Call("mul", (Const(0.5), x)), Call("add", (Const(1.0), gate))))


def _mean(n: Node, *args: Expr) -> Expr:
    total = args[0]
    for a in args[1:]:
        total = Call("add", (total, a))
    return Call("div", (total, Const(float(len(args))))) if len(args) > 1 else total


def trilu(n: Node, types: dict[str, TensorType], made: list[Weight]) -> list[Op]:
    """x where the offset j - i of its last two indices is >= k (upper) or <= k (lower), else 0;
    the test is a guarded load of a band of ones (see the module docstring)."""
    t, k, rank = n.type, n.attr["k"], len(n.type.shape)
    rows, cols = t.shape[-2:]
    i, j = f"i{rank - 2}", f"i{rank - 1}"
    # upper: keep where j - i - k >= 0; lower: where i - j + k >= 0. The kept offsets are 0..hi.
    offset = Affine.of({j: 1, i: -1}, -k) if n.attr["upper"] else Affine.of({i: 1, j: -1}, k)
    lo, hi = offset.bounds({i: rows, j: cols})
    x = Load(n.inputs[0], identity_index(rank))
    if hi < 0:       # nothing kept: zeros
        body: Expr = Const(0.0)
    elif lo >= 0:    # everything kept: a copy
        body = x
    else:
        band = Weight.of(f"{n.output}.band", np.ones(hi + 1, dtype=np.bool_))
        made.append(band)
        body = Call("select", (Load(band.name, (offset,), 0.0), x, Const(0.0)))
    return [Compute(n.output, t, "map", (), body, (n.origin,))]


def _negative(x: Expr, negative: Expr, positive: Expr, strict: bool = True) -> Expr:
    """`negative` where x < 0 (x <= 0 unless strict), else `positive`: NaN takes `positive`."""
    return Call("select", (Call("lt" if strict else "le", (x, Const(0.0))), negative, positive))


def _elu_part(x: Expr, alpha: float) -> Expr:
    """alpha·(exp(x) - 1), as expm1 (exact near 0)."""
    return Call("mul", (Const(alpha), Call("expm1", (x,))))


def celu(x: Expr, alpha: float) -> Expr:
    """max(0, x) + min(0, alpha·(exp(x/alpha) - 1)), as a select (one of the two terms is 0 on each side of 0),
    so that NaN stays NaN where fmaxf and fminf would drop it."""
    return _negative(x, Call("mul", (Const(alpha), Call("expm1", (Call("div", (x, Const(alpha))),)))), x, strict=False)


def shrink(x: Expr, bias: float, lambd: float) -> Expr:
    """x + bias below -lambd, x - bias above lambd, 0 between (and for NaN)."""
    above = Call("select", (Call("gt", (x, Const(lambd))), Call("sub", (x, Const(bias))), Const(0.0)))
    return Call("select", (Call("lt", (x, Const(-lambd))), Call("add", (x, Const(bias))), above))


ACTIVATION_LOWERINGS: dict[str, Callable[[Node, dict[str, TensorType], list[Weight]], list[Op]]] = {
    "LeakyRelu": _map(lambda n, x: _negative(x, Call("mul", (x, Const(n.attr["alpha"]))), x)),
    "PRelu": _map(lambda n, x, slope: _negative(x, Call("mul", (x, slope)), x)),
    "Elu": _map(lambda n, x: _negative(x, _elu_part(x, n.attr["alpha"]), x)),
    "Selu": _map(lambda n, x: _negative(x, _elu_part(x, n.attr["gamma"] * n.attr["alpha"]),
                                        Call("mul", (x, Const(n.attr["gamma"]))), strict=False)),
    "Celu": _map(lambda n, x: celu(x, n.attr["alpha"])),
    "ThresholdedRelu": _map(lambda n, x: Call("select", (Call("gt", (x, Const(n.attr["alpha"]))), x, Const(0.0)))),
    "Softsign": _map(lambda n, x: Call("div", (x, Call("add", (Const(1.0), Call("abs", (x,))))))),
    "Shrink": _map(lambda n, x: shrink(x, n.attr["bias"], n.attr["lambd"])),
    "Swish": _map(lambda n, x: Call("mul", (x, Call("sigmoid", (Call("mul", (x, Const(n.attr["alpha"]))),))))),
}
ACTIVATION_LOWERINGS.update({op: _map(lambda n, x, fn=op.lower(): Call(fn, (x,)))
                             for op in ("Tan", "Asin", "Acos", "Atan", "Sinh", "Cosh", "Asinh", "Acosh", "Atanh")})

ELEMENTWISE_LOWERINGS: dict[str, Callable[[Node, dict[str, TensorType], list[Weight]], list[Op]]] = {
    "HardSigmoid": _map(lambda n, x: hard_sigmoid(x, n.attr["alpha"], n.attr["beta"])),
    "HardSwish": _map(lambda n, x: Call("mul", (x, hard_sigmoid(x, 1 / 6, 0.5)))),
    "Softplus": _map(lambda n, x: Call("softplus", (x,))),
    "Mish": _map(lambda n, x: Call("mul", (x, Call("tanh", (Call("softplus", (x,)),))))),
    "Gelu": _map(lambda n, x: gelu(x, n.attr["approximate"])),
    "Abs": _map(lambda n, x: Call("abs", (x,))),
    # sign(x) = x > 0 ? 1 : (x < 0 ? -1 : x): 0 and NaN stay themselves
    "Sign": _map(lambda n, x: Call("select", (Call("gt", (x, Const(0.0))), Const(1.0),
                                              Call("select", (Call("lt", (x, Const(0.0))), Const(-1.0), x))))),
    "Floor": _map(lambda n, x: Call("floor", (x,))),
    "Ceil": _map(lambda n, x: Call("ceil", (x,))),
    "Round": _map(lambda n, x: Call("round", (x,))),
    "Mod": _map(lambda n, a, b: Call("fmod" if n.attr["fmod"] else "mod", (a, b))),
    "Mean": _map(_mean),
    "Trilu": trilu,
    **ACTIVATION_LOWERINGS,
}
