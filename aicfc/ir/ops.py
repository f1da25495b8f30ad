"""High IR operators: one table row per op with its type rule and its numpy meaning.

The table is the single source of what the compiler accepts: the importer, `aicfc check`,
the verifier and the interpreter all read it. Attribute values are already normalized by the
importer (negative axes resolved, Reshape's target shape static and explicit).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from aicfc.ir.types import TensorType

Attrs = dict[str, Any]


class OpTypeError(Exception):
    """An op's inputs or attributes do not fit its type rule (the verifier reports it)."""


def _broadcast(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, ...]:
    try:
        return tuple(np.broadcast_shapes(a, b))
    except ValueError:
        raise OpTypeError(f"shapes {list(a)} and {list(b)} do not broadcast") from None


def _same_float(types: list[TensorType]) -> str:
    dtypes = {t.dtype for t in types}
    if len(dtypes) != 1:
        raise OpTypeError(f"mixed dtypes {sorted(dtypes)}")
    (dtype,) = dtypes
    if dtype not in ("f32", "f16", "f64"):
        raise OpTypeError(f"dtype {dtype} is not a float type")
    return dtype


def matmul_shape(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, ...]:
    """numpy.matmul's shape rule, 1-D operands included."""
    if not a or not b:
        raise OpTypeError("MatMul of a scalar")
    a2 = (1,) + a if len(a) == 1 else a
    b2 = b + (1,) if len(b) == 1 else b
    if a2[-1] != b2[-2]:
        raise OpTypeError(f"MatMul inner dimensions differ: {list(a)} @ {list(b)}")
    out = _broadcast(a2[:-2], b2[:-2]) + (a2[-2], b2[-1])
    if len(a) == 1:
        out = out[:-2] + out[-1:]
    if len(b) == 1:
        out = out[:-1]
    return out


def _infer_matmul(t: list[TensorType], _: Attrs) -> TensorType:
    return TensorType(_same_float(t), matmul_shape(t[0].shape, t[1].shape))


def _infer_gemm(t: list[TensorType], at: Attrs) -> TensorType:
    dtype = _same_float(t)
    a, b = t[0].shape, t[1].shape
    if len(a) != 2 or len(b) != 2:
        raise OpTypeError("Gemm needs 2-D A and B")
    m, k = a[::-1] if at.get("transA", 0) else a
    k2, n = b[::-1] if at.get("transB", 0) else b
    if k != k2:
        raise OpTypeError(f"Gemm inner dimensions differ: {k} vs {k2}")
    if len(t) == 3 and _broadcast(t[2].shape, (m, n)) != (m, n):
        raise OpTypeError(f"Gemm bias {list(t[2].shape)} does not broadcast to {[m, n]}")
    return TensorType(dtype, (m, n))


def _infer_binary(t: list[TensorType], _: Attrs) -> TensorType:
    return TensorType(_same_float(t), _broadcast(t[0].shape, t[1].shape))


def _infer_unary(t: list[TensorType], _: Attrs) -> TensorType:
    return TensorType(_same_float(t), t[0].shape)


def _infer_softmax(t: list[TensorType], at: Attrs) -> TensorType:
    if not 0 <= at["axis"] < len(t[0].shape):
        raise OpTypeError(f"Softmax axis {at['axis']} out of range for rank {len(t[0].shape)}")
    return _infer_unary(t, at)


def _infer_transpose(t: list[TensorType], at: Attrs) -> TensorType:
    perm = at["perm"]
    if sorted(perm) != list(range(len(t[0].shape))):
        raise OpTypeError(f"Transpose perm {list(perm)} is not a permutation of rank {len(t[0].shape)}")
    return TensorType(t[0].dtype, tuple(t[0].shape[p] for p in perm))


def _infer_reshape(t: list[TensorType], at: Attrs) -> TensorType:
    shape = tuple(at["shape"])
    if math.prod(shape) != t[0].numel or any(d < 0 for d in shape):
        raise OpTypeError(f"Reshape of {list(t[0].shape)} to {list(shape)} changes the element count")
    return TensorType(t[0].dtype, shape)


def erf(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x)
    return np.asarray(np.frompyfunc(math.erf, 1, 1)(x), dtype=x.dtype)


def sigmoid(x: np.ndarray) -> np.ndarray:
    # exp of -|x| only: no overflow warnings on either side.
    e = np.exp(-np.abs(x))
    return np.where(x >= 0, 1 / (1 + e), e / (1 + e)).astype(x.dtype)


def _softmax(x: np.ndarray, at: Attrs) -> np.ndarray:
    e = np.exp(x - x.max(axis=at["axis"], keepdims=True))
    return e / e.sum(axis=at["axis"], keepdims=True)


def _gemm(x: list[np.ndarray], at: Attrs) -> np.ndarray:
    a = x[0].T if at.get("transA", 0) else x[0]
    b = x[1].T if at.get("transB", 0) else x[1]
    y = at.get("alpha", 1.0) * (a @ b)
    if len(x) == 3:
        y = y + at.get("beta", 1.0) * x[2]
    return y.astype(x[0].dtype)


@dataclass(frozen=True)
class OpDef:
    name: str
    arity: tuple[int, int]
    infer: Callable[[list[TensorType], Attrs], TensorType]
    evaluate: Callable[[list[np.ndarray], Attrs], np.ndarray]
    attrs: tuple[str, ...] = ()


OPS: dict[str, OpDef] = {op.name: op for op in [
    OpDef("MatMul", (2, 2), _infer_matmul, lambda x, _: np.matmul(x[0], x[1])),
    OpDef("Gemm", (2, 3), _infer_gemm, _gemm, ("alpha", "beta", "transA", "transB")),
    OpDef("Add", (2, 2), _infer_binary, lambda x, _: x[0] + x[1]),
    OpDef("Sub", (2, 2), _infer_binary, lambda x, _: x[0] - x[1]),
    OpDef("Mul", (2, 2), _infer_binary, lambda x, _: x[0] * x[1]),
    OpDef("Div", (2, 2), _infer_binary, lambda x, _: x[0] / x[1]),
    OpDef("Relu", (1, 1), _infer_unary, lambda x, _: np.maximum(x[0], 0).astype(x[0].dtype)),
    OpDef("Sigmoid", (1, 1), _infer_unary, lambda x, _: sigmoid(x[0])),
    OpDef("Tanh", (1, 1), _infer_unary, lambda x, _: np.tanh(x[0])),
    OpDef("Erf", (1, 1), _infer_unary, lambda x, _: erf(x[0])),
    OpDef("Softmax", (1, 1), _infer_softmax, lambda x, at: _softmax(x[0], at), ("axis",)),
    OpDef("Transpose", (1, 1), _infer_transpose, lambda x, at: np.transpose(x[0], at["perm"]), ("perm",)),
    OpDef("Reshape", (1, 1), _infer_reshape, lambda x, at: x[0].reshape(at["shape"]), ("shape",)),
    OpDef("Identity", (1, 1), lambda t, _: t[0], lambda x, _: x[0]),
]}
