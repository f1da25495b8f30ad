"""A numpy interpreter for the Lowered IR (the High IR one is `high.evaluate_graph`).

Every compute is evaluated literally from its definition: open index grids for the loop
variables, the accesses evaluated as affine index arrays, the body applied element-wise and
the reduction taken over the r-axes. It is slow and obviously right, which is its purpose:
CPU tests compare it with onnxruntime after every pass. Large domains are evaluated in
slices of i0 to bound memory.
"""
from __future__ import annotations

import math
from typing import Any, Callable

import numpy as np

from aicfc.ir.lowered import Call, Compute, Const, Expr, Indirect, Load, Program, View, is_integer_compute, value_loads
from aicfc.ir.ops import erf as _erf, sigmoid as _sigmoid
from aicfc.ir.ops_elementwise import floored_mod as _floored_mod, softplus as _softplus, truncated_div as _truncated_div
from aicfc.ir.types import NUMPY_TO_IR, TensorType

MAX_ELEMENTS = 1 << 24


SCALAR_FNS: dict[str, Callable[..., np.ndarray]] = {
    "add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.divide,
    "max": np.maximum, "min": np.minimum, "neg": np.negative, "exp": np.exp, "log": np.log,
    "sqrt": np.sqrt, "tanh": np.tanh, "erf": _erf, "sigmoid": _sigmoid,
    "eq": np.equal, "select": lambda c, a, b: np.where(c != 0, a, b),
    "gt": np.greater, "lt": np.less, "ge": np.greater_equal, "le": np.less_equal,
    "and": lambda a, b: (a != 0) & (b != 0), "or": lambda a, b: (a != 0) | (b != 0),
    "xor": lambda a, b: (a != 0) ^ (b != 0), "not": lambda a: a == 0, "isnan": np.isnan,
    "abs": np.abs, "floor": np.floor, "ceil": np.ceil, "round": np.round, "softplus": _softplus,
    "fmod": np.fmod, "mod": _floored_mod, "idiv": _truncated_div,
    "cos": np.cos, "sin": np.sin,
    "tan": np.tan, "asin": np.arcsin, "acos": np.arccos, "atan": np.arctan, "sinh": np.sinh, "cosh": np.cosh,
    "asinh": np.arcsinh, "acosh": np.arccosh, "atanh": np.arctanh, "expm1": np.expm1,
}


def _eval(e: Expr, grids: dict[str, np.ndarray], env: dict[str, np.ndarray], dtype: Any) -> np.ndarray:
    if isinstance(e, Const):
        return np.asarray(e.value, dtype=dtype)
    if isinstance(e, Load):
        idx = []
        for d, a in enumerate(e.index):
            if isinstance(a, Indirect):
                idx.append(_indirect(a, env[e.buffer].shape[d], grids, env))
                continue
            i = np.asarray(a.const)
            for v, c in a.terms:
                i = i + c * grids[v]
            idx.append(i)
        buf = env[e.buffer]
        if e.fill is None or not idx:
            return buf[tuple(idx)] if idx else buf[()]
        # A guarded load: out-of-range indices read `fill` (clipped only to index safely).
        inside = np.ones((), dtype=bool)
        for d in e.guarded_dims:
            inside = inside & (idx[d] >= 0) & (idx[d] < buf.shape[d])
            idx[d] = np.clip(idx[d], 0, buf.shape[d] - 1)
        return np.where(inside, buf[tuple(idx)], np.asarray(e.fill, dtype=buf.dtype))
    assert isinstance(e, Call)
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        return np.asarray(SCALAR_FNS[e.fn](*[_eval(a, grids, env, dtype) for a in e.args]), dtype=dtype)


def _indirect(a: Indirect, n: int, grids: dict[str, np.ndarray], env: dict[str, np.ndarray]) -> np.ndarray:
    """The ids an indirect index reads, wrapped (negative: from the end) and clamped into
    0..n-1 ([Note: Indirect index])."""
    x = np.asarray(_eval(a.ids, grids, env, np.float32)).astype(np.int64)
    return np.clip(np.where(x < 0, x + n, x), 0, n - 1)


def evaluate_compute(op: Compute, env: dict[str, np.ndarray], dtype: Any) -> np.ndarray:
    names = op.domain_vars + op.reduce_vars
    extents = op.type.shape + op.reduce
    nd, rank = len(names), len(op.type.shape)
    if dtype is not np.int64 and _integer(op, env):
        # [Note: Integer computes]: int64 arithmetic, converted once to the result's dtype.
        return evaluate_compute(op, env, np.int64).astype(op.type.np_dtype)
    out = np.empty(op.type.shape, dtype=dtype)
    if op.type.np_dtype.kind not in "f" and dtype is not np.int64:
        # Integer and bool results are computed in float and converted once, as codegen's store does.
        with np.errstate(invalid="ignore"):
            return evaluate_compute(Compute(op.out, _as_float(op.type), op.combiner, op.reduce, op.body, op.origin),
                                    env, dtype).astype(op.type.np_dtype)
    total = math.prod(extents)
    step = 1 if rank == 0 else extents[0] if total <= MAX_ELEMENTS else max(1, extents[0] * MAX_ELEMENTS // total)
    starts = range(0, extents[0], step) if rank else [0]
    for start in starts:
        stop = min(start + step, extents[0]) if rank else 0
        grids = {}
        for k, (v, n) in enumerate(zip(names, extents)):
            r = np.arange(start, stop) if (k == 0 and rank) else np.arange(n)
            grids[v] = r.reshape([-1 if j == k else 1 for j in range(nd)])
        shape = (stop - start,) + extents[1:] if rank else extents
        val = np.broadcast_to(_eval(op.body, grids, env, dtype), shape)
        axes = tuple(range(rank, nd))
        if op.combiner == "sum":
            val = val.sum(axis=axes, dtype=dtype)
        elif op.combiner == "max":
            val = val.max(axis=axes)
        elif op.combiner == "min":
            val = val.min(axis=axes)
        elif op.combiner == "prod":
            val = val.prod(axis=axes, dtype=dtype)
        if rank:
            out[start:stop] = val
        else:
            out[()] = val
    return out


def _integer(op: Compute, env: dict[str, np.ndarray]) -> bool:
    types = {ld.buffer: TensorType(NUMPY_TO_IR[env[ld.buffer].dtype], ()) for ld in value_loads(op.body)}
    return is_integer_compute(op.type.dtype, op.body, types)


def _as_float(t: TensorType) -> TensorType:
    return TensorType("f32", t.shape)


def evaluate_ops(ops: tuple, env: dict[str, np.ndarray], dtype: Any) -> None:
    for op in ops:
        if isinstance(op, View):
            env[op.out] = env[op.source].reshape(op.type.shape)
        else:
            env[op.out] = evaluate_compute(op, env, dtype)


def evaluate_program(p: Program, inputs: dict[str, np.ndarray], dtype: Any = np.float32) -> dict[str, np.ndarray]:
    """Run the lowered program; `dtype=np.float64` gives a float64 reference."""
    env: dict[str, np.ndarray] = {v.name: np.asarray(inputs[v.name], dtype=dtype if v.type.np_dtype.kind == "f"
                                                     else v.type.np_dtype) for v in p.inputs}
    for w in p.weights:
        a = w.array()
        env[w.name] = a.astype(dtype) if a.dtype.kind == "f" else a
    evaluate_ops(p.ops, env, dtype)
    return {o: env[o] for o in p.outputs}
