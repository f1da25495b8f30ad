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

from aicfc.ir.types import DTYPES, TensorType

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


def _infer_reduce(t: list[TensorType], at: Attrs) -> TensorType:
    shape = t[0].shape
    axes = at["axes"]
    if any(not 0 <= a < len(shape) for a in axes) or len(set(axes)) != len(axes):
        raise OpTypeError(f"reduction axes {list(axes)} are not distinct axes of rank {len(shape)}")
    if at["keepdims"]:
        out = tuple(1 if d in axes else n for d, n in enumerate(shape))
    else:
        out = tuple(n for d, n in enumerate(shape) if d not in axes)
    return TensorType(_same_float(t), out)


def _infer_layer_norm(t: list[TensorType], at: Attrs) -> TensorType:
    x = t[0].shape
    if not 0 <= at["axis"] < len(x):
        raise OpTypeError(f"LayerNormalization axis {at['axis']} out of range for rank {len(x)}")
    inner = x[at["axis"]:]
    for name, p in zip(("scale", "bias"), t[1:]):
        if _broadcast(p.shape, inner) != inner:
            raise OpTypeError(f"LayerNormalization {name} {list(p.shape)} does not broadcast to "
                              f"the normalized dims {list(inner)}")
    return TensorType(_same_float(t), x)


def _reduce(fn: Callable[..., np.ndarray]) -> Callable[[list[np.ndarray], Attrs], np.ndarray]:
    def evaluate(x: list[np.ndarray], at: Attrs) -> np.ndarray:
        return np.asarray(fn(x[0], axis=tuple(at["axes"]), keepdims=bool(at["keepdims"])), dtype=x[0].dtype)
    return evaluate


def _layer_norm(x: list[np.ndarray], at: Attrs) -> np.ndarray:
    axes = tuple(range(at["axis"], x[0].ndim))
    mean = x[0].mean(axis=axes, keepdims=True)
    var = ((x[0] - mean) ** 2).mean(axis=axes, keepdims=True)
    y = (x[0] - mean) / np.sqrt(var + np.asarray(at["epsilon"], dtype=x[0].dtype)) * x[1]
    if len(x) == 3:
        y = y + x[2]
    return y.astype(x[0].dtype)


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


def _log_softmax(x: np.ndarray, at: Attrs) -> np.ndarray:
    shifted = x - x.max(axis=at["axis"], keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=at["axis"], keepdims=True))


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
    OpDef("LogSoftmax", (1, 1), _infer_softmax, lambda x, at: _log_softmax(x[0], at), ("axis",)),
    OpDef("Transpose", (1, 1), _infer_transpose, lambda x, at: np.transpose(x[0], at["perm"]), ("perm",)),
    OpDef("Reshape", (1, 1), _infer_reshape, lambda x, at: x[0].reshape(at["shape"]), ("shape",)),
    OpDef("Identity", (1, 1), lambda t, _: t[0], lambda x, _: x[0]),
    # Memory-bound ops of normalization layers (passes/lower.py states each as reductions and
    # maps, so the row rule sees one structure whichever way a norm was exported).
    OpDef("Sqrt", (1, 1), _infer_unary, lambda x, _: np.sqrt(x[0])),
    OpDef("Exp", (1, 1), _infer_unary, lambda x, _: np.exp(x[0])),
    OpDef("Reciprocal", (1, 1), _infer_unary, lambda x, _: (1 / x[0]).astype(x[0].dtype)),
    # Pow's exponent is a constant, moved into the attribute by the importer.
    OpDef("Pow", (1, 1), _infer_unary, lambda x, at: np.power(x[0], x[0].dtype.type(at["exponent"])),
          ("exponent",)),
    # Cast to float32 of a float32 tensor (the importer refuses any other target type).
    OpDef("Cast", (1, 1), _infer_unary, lambda x, _: x[0], ("to",)),
    OpDef("ReduceMean", (1, 1), _infer_reduce, _reduce(np.mean), ("axes", "keepdims")),
    OpDef("ReduceSum", (1, 1), _infer_reduce, _reduce(np.sum), ("axes", "keepdims")),
    OpDef("ReduceMax", (1, 1), _infer_reduce, _reduce(np.max), ("axes", "keepdims")),
    OpDef("LayerNormalization", (2, 3), _infer_layer_norm, _layer_norm, ("axis", "epsilon")),
]}

# Convolutional ops (Conv, BatchNormalization, pools, LRN, Clip, Dropout, Sum): rows defined in
# ops_cnn.py, which builds on the helpers above (so it is imported here, at the end).
from aicfc.ir.ops_cnn import CNN_OPS  # noqa: E402

OPS.update({op.name: op for op in CNN_OPS})


# ---------------------------------------------------------------- data and shape ops (issue 6)
# What the torch exporters emit around the compute of BERT, GPT-2 and ViT. The importer has
# already resolved every shape-like input into attributes (`shape`, `starts`, `steps`, `axis`), so each rule here is static (Clip and Dropout are in ops_cnn.py). Integer and bool tensors appear as constants
# (shape arithmetic, folded at compile time by `evaluate`) and, at run time, only where
# RUNTIME_DTYPES says: the Lowered IR computes in float, so a run-time integer is exact only as
# an index or a mask (|x| <= 2**24).
FLOATS = ("f32", "f16", "f64")
INTEGERS = ("i64", "i32")
# dtypes a node may compute on at run time (not folded), per op; others only as constants.
RUNTIME_DTYPES: dict[str, tuple[str, ...]] = {
    "Where": FLOATS + ("bool",), "Cast": FLOATS + INTEGERS + ("bool",), "Gather": FLOATS,
    "Unsqueeze": FLOATS, "Squeeze": FLOATS, "Flatten": FLOATS, "Expand": FLOATS, "Slice": FLOATS,
}
# Views move integers exactly (token ids reshaped before their Gather: [Note: Indirect index]).
RUNTIME_DTYPES.update({op: FLOATS + INTEGERS for op in ("Reshape", "Unsqueeze", "Squeeze", "Flatten")})
# Ops only ever evaluated at compile time: every input must be a constant (or, for Shape, the
# input's static type); the importer folds them and they never reach the High IR graph.
FOLD_ONLY = ("Shape", "Size", "ConstantOfShape", "Range")


def _same_dtype(types: list[TensorType]) -> str:
    dtypes = {t.dtype for t in types}
    if len(dtypes) != 1:
        raise OpTypeError(f"mixed dtypes {sorted(dtypes)}")
    return dtypes.pop()


def _infer_any_binary(t: list[TensorType], _: Attrs) -> TensorType:
    return TensorType(_same_dtype(t), _broadcast(t[0].shape, t[1].shape))


def _infer_variadic(t: list[TensorType], _: Attrs) -> TensorType:
    shape: tuple[int, ...] = ()
    for x in t:
        shape = _broadcast(shape, x.shape)
    return TensorType(_same_float(t), shape)


def _infer_equal(t: list[TensorType], _: Attrs) -> TensorType:
    return TensorType("bool", _infer_any_binary(t, {}).shape)


def _infer_where(t: list[TensorType], _: Attrs) -> TensorType:
    if t[0].dtype != "bool":
        raise OpTypeError(f"Where condition is {t[0].dtype}, not bool")
    shape = _broadcast(_broadcast(t[0].shape, t[1].shape), t[2].shape)
    return TensorType(_same_dtype(t[1:]), shape)


def _infer_view(t: list[TensorType], at: Attrs) -> TensorType:
    """Unsqueeze, Squeeze, Flatten: a reshape whose target the importer computed."""
    shape = tuple(at["shape"])
    if math.prod(shape) != t[0].numel:
        raise OpTypeError(f"view of {list(t[0].shape)} as {list(shape)} changes the element count")
    return TensorType(t[0].dtype, shape)


def _infer_expand(t: list[TensorType], at: Attrs) -> TensorType:
    shape = tuple(at["shape"])
    if _broadcast(t[0].shape, shape) != shape:
        raise OpTypeError(f"Expand of {list(t[0].shape)} to {list(shape)} is not a broadcast")
    return TensorType(t[0].dtype, shape)


def _infer_slice(t: list[TensorType], at: Attrs) -> TensorType:
    src, starts, steps, shape = t[0].shape, at["starts"], at["steps"], tuple(at["shape"])
    if not len(src) == len(starts) == len(steps) == len(shape):
        raise OpTypeError("Slice needs one start, step and extent per dimension")
    for d, (n, s, k, m) in enumerate(zip(src, starts, steps, shape)):
        if k == 0 or m <= 0 or not (0 <= s < n and 0 <= s + k * (m - 1) < n):
            raise OpTypeError(f"Slice dim {d}: start {s}, step {k}, {m} elements leave 0..{n - 1}")
    return TensorType(t[0].dtype, shape)


def _slice(x: list[np.ndarray], at: Attrs) -> np.ndarray:
    return x[0][np.ix_(*[s + k * np.arange(m) for s, k, m in zip(at["starts"], at["steps"], at["shape"])])]


def _infer_gather(t: list[TensorType], at: Attrs) -> TensorType:
    data, ids, axis = t[0], t[1], at["axis"]
    if not 0 <= axis < len(data.shape):
        raise OpTypeError(f"Gather axis {axis} out of range for rank {len(data.shape)}")
    if ids.dtype not in INTEGERS:
        raise OpTypeError(f"Gather indices are {ids.dtype}, not int64/int32")
    return TensorType(data.dtype, data.shape[:axis] + ids.shape + data.shape[axis + 1:])


def _gather(x: list[np.ndarray], at: Attrs) -> np.ndarray:
    n = x[0].shape[at["axis"]]
    ids = np.clip(np.where(x[1] < 0, x[1] + n, x[1]), 0, n - 1)
    return np.take(x[0], ids, axis=at["axis"])


def _infer_cast(t: list[TensorType], at: Attrs) -> TensorType:
    return TensorType(at["to"], t[0].shape)


def _infer_concat(t: list[TensorType], at: Attrs) -> TensorType:
    """Concat (issue 6): same dtype and rank, equal extents except along `axis`, which add up."""
    axis, rank = at["axis"], len(t[0].shape)
    if not 0 <= axis < rank or any(len(x.shape) != rank for x in t):
        raise OpTypeError(f"Concat axis {axis} of inputs of ranks {[len(x.shape) for x in t]}")
    for x in t:
        if any(a != b for d, (a, b) in enumerate(zip(x.shape, t[0].shape)) if d != axis):
            raise OpTypeError(f"Concat along {axis} of shapes {[list(y.shape) for y in t]}: other extents differ")
    shape = list(t[0].shape)
    shape[axis] = sum(x.shape[axis] for x in t)
    return TensorType(_same_dtype(t), tuple(shape))


def _infer_folded(t: list[TensorType], at: Attrs) -> TensorType:
    raise OpTypeError("folded at compile time; it never stays a graph node")


def _divide(x: list[np.ndarray], _: Attrs) -> np.ndarray:
    """ONNX Div: true division for floats, truncation toward zero for integers."""
    a, b = x
    if a.dtype.kind in "iu" and b.dtype.kind in "iu":
        from aicfc.ir.ops_elementwise import truncated_div
        return truncated_div(a, b)
    return a / b


def _range(x: list[np.ndarray], _: Attrs) -> np.ndarray:
    start, limit, delta = (np.asarray(v).reshape(()) for v in x)
    n = max(int(np.ceil((limit - start) / delta)), 0)
    return (start + np.arange(n, dtype=np.float64).astype(start.dtype) * delta).astype(start.dtype)


def _constant_of_shape(x: list[np.ndarray], at: Attrs) -> np.ndarray:
    value = at["value"]
    return np.full(tuple(int(d) for d in x[0].reshape(-1)), value.reshape(-1)[0], dtype=value.dtype)


OPS.update({op.name: op for op in [
    OpDef("Neg", (1, 1), _infer_unary, lambda x, _: np.negative(x[0])),
    OpDef("Log", (1, 1), _infer_unary, lambda x, _: np.log(x[0])),
    OpDef("Max", (1, 8), _infer_variadic, lambda x, _: np.asarray(np.maximum.reduce(np.broadcast_arrays(*x)))),
    OpDef("Min", (1, 8), _infer_variadic, lambda x, _: np.asarray(np.minimum.reduce(np.broadcast_arrays(*x)))),
    OpDef("Equal", (2, 2), _infer_equal, lambda x, _: np.equal(x[0], x[1])),
    OpDef("Where", (3, 3), _infer_where, lambda x, _: np.where(x[0], x[1], x[2])),
    OpDef("Unsqueeze", (1, 1), _infer_view, lambda x, at: x[0].reshape(at["shape"]), ("shape",)),
    OpDef("Squeeze", (1, 1), _infer_view, lambda x, at: x[0].reshape(at["shape"]), ("shape",)),
    OpDef("Flatten", (1, 1), _infer_view, lambda x, at: x[0].reshape(at["shape"]), ("shape",)),
    OpDef("Expand", (1, 1), _infer_expand, lambda x, at: np.broadcast_to(x[0], at["shape"]).copy(), ("shape",)),
    # steps may be negative; every (start, step, extent) stays inside its dimension.
    OpDef("Slice", (1, 1), _infer_slice, _slice, ("shape", "starts", "steps")),
    # indices: negative ones count from the end; out-of-range ones are clamped (never read outside).
    # start/step: constant indices in arithmetic progression into a run-time tensor (an access).
    OpDef("Gather", (2, 2), _infer_gather, _gather, ("axis", "start", "step")),
    OpDef("Shape", (1, 1), _infer_folded, lambda x, _: np.asarray(x[0].shape, dtype=np.int64)),
    OpDef("Size", (1, 1), _infer_folded, lambda x, _: np.asarray(x[0].size, dtype=np.int64)),
    OpDef("ConstantOfShape", (1, 1), _infer_folded, _constant_of_shape, ("value",)),
    OpDef("Range", (3, 3), _infer_folded, _range),
    OpDef("Concat", (1, 64), _infer_concat, lambda x, at: np.concatenate(x, axis=at["axis"]), ("axis",)),
]})


# Comparisons and logic (masks): bool results, 1.0/0.0 inside a Lowered IR body.
def _infer_logic(t: list[TensorType], _: Attrs) -> TensorType:
    if any(x.dtype != "bool" for x in t):
        raise OpTypeError(f"logic op on {sorted({x.dtype for x in t})}, not bool")
    shape: tuple[int, ...] = ()
    for x in t:
        shape = _broadcast(shape, x.shape)
    return TensorType("bool", shape)


def _infer_isnan(t: list[TensorType], _: Attrs) -> TensorType:
    return TensorType("bool", t[0].shape)


def _infer_gather_elements(t: list[TensorType], at: Attrs) -> TensorType:
    data, ids, axis = t[0], t[1], at["axis"]
    if not 0 <= axis < len(data.shape) or len(ids.shape) != len(data.shape):
        raise OpTypeError(f"GatherElements axis {axis}: data rank {len(data.shape)}, indices rank {len(ids.shape)}")
    return TensorType(data.dtype, ids.shape)


def _gather_elements(x: list[np.ndarray], at: Attrs) -> np.ndarray:
    n = x[0].shape[at["axis"]]
    ids = x[1].astype(np.int64)
    if ((ids < -n) | (ids >= n)).any():
        raise ValueError(f"GatherElements indices outside -{n}..{n - 1}")
    return np.take_along_axis(x[0], np.where(ids < 0, ids + n, ids), axis=at["axis"])


def _infer_gather_nd(t: list[TensorType], at: Attrs) -> TensorType:
    data, ids, b = t[0], t[1], at["batch_dims"]
    k = ids.shape[-1] if ids.shape else 0
    if ids.dtype not in INTEGERS or not ids.shape or not 1 <= k <= len(data.shape) - b or data.shape[:b] != ids.shape[:b]:
        raise OpTypeError(f"GatherND of {list(data.shape)} by indices {list(ids.shape)} ({ids.dtype}), batch_dims {b}")
    return TensorType(data.dtype, data.shape[:b] + ids.shape[b:-1] + data.shape[b + k:])


def _gather_nd(x: list[np.ndarray], at: Attrs) -> np.ndarray:
    data, ids, b = x[0], x[1].astype(np.int64), at["batch_dims"]
    k = ids.shape[-1]
    lead = data.shape[:b]
    flat_data = data.reshape((-1,) + data.shape[b:])
    flat_ids = ids.reshape((flat_data.shape[0], -1, k))
    dims = np.asarray(data.shape[b:b + k])
    if ((flat_ids < -dims) | (flat_ids >= dims)).any():
        raise ValueError("GatherND indices out of range")
    flat_ids = np.where(flat_ids < 0, flat_ids + dims, flat_ids)
    out = np.stack([flat_data[i][tuple(flat_ids[i].T)] for i in range(flat_data.shape[0])])
    return out.reshape(lead + ids.shape[b:-1] + data.shape[b + k:])


OPS.update({op.name: op for op in [
    OpDef("Greater", (2, 2), _infer_equal, lambda x, _: np.greater(x[0], x[1])),
    OpDef("Less", (2, 2), _infer_equal, lambda x, _: np.less(x[0], x[1])),
    OpDef("GreaterOrEqual", (2, 2), _infer_equal, lambda x, _: np.greater_equal(x[0], x[1])),
    OpDef("LessOrEqual", (2, 2), _infer_equal, lambda x, _: np.less_equal(x[0], x[1])),
    OpDef("And", (2, 2), _infer_logic, lambda x, _: np.logical_and(x[0], x[1])),
    OpDef("Or", (2, 2), _infer_logic, lambda x, _: np.logical_or(x[0], x[1])),
    OpDef("Xor", (2, 2), _infer_logic, lambda x, _: np.logical_xor(x[0], x[1])),
    OpDef("Not", (1, 1), _infer_logic, lambda x, _: np.logical_not(x[0])),
    OpDef("IsNaN", (1, 1), _infer_isnan, lambda x, _: np.isnan(x[0])),
    # Indices at run time: an indirect index per gathered dimension (lower.py).
    OpDef("GatherElements", (2, 2), _infer_gather_elements, _gather_elements, ("axis",)),
    OpDef("GatherND", (2, 2), _infer_gather_nd, _gather_nd, ("batch_dims",)),
]})
COMPARISONS = ("Equal", "Greater", "Less", "GreaterOrEqual", "LessOrEqual")
LOGIC = ("And", "Or", "Xor", "Not")
RUNTIME_DTYPES.update({op: ("f32", "f16", "bool") for op in COMPARISONS})
RUNTIME_DTYPES.update({op: ("bool",) for op in LOGIC})
RUNTIME_DTYPES["IsNaN"] = ("f32", "f16")
# Masks move as bool through views, broadcasts, slices and gathers (0.0/1.0 in a body: exact).
RUNTIME_DTYPES.update({"GatherElements": FLOATS + ("bool",), "GatherND": FLOATS + ("bool",)})
for _op in ("Reshape", "Unsqueeze", "Squeeze", "Flatten", "Expand", "Slice", "Gather"):
    RUNTIME_DTYPES[_op] = RUNTIME_DTYPES[_op] + ("bool",)

# Cast between any two of the dtypes above; arithmetic ops accept integers as constants (folded).
OPS["Cast"] = OpDef("Cast", (1, 1), _infer_cast, lambda x, at: x[0].astype(DTYPES[at["to"]]), ("to",))
for _name in ("Add", "Sub", "Mul"):
    OPS[_name] = OpDef(_name, (2, 2), _infer_any_binary, OPS[_name].evaluate)
OPS["Div"] = OpDef("Div", (2, 2), _infer_any_binary, _divide)

# Element-wise ops of current exports (issue 18): rows in ops_elementwise.py. Trilu moves float,
# bool and integer tensors at run time (through float32 in a body: integers exact to 2**24).
from aicfc.ir.ops_elementwise import ACTIVATION_OPS, ELEMENTWISE_OPS  # noqa: E402

OPS.update({op.name: op for op in ELEMENTWISE_OPS + ACTIVATION_OPS})
RUNTIME_DTYPES["Trilu"] = FLOATS + INTEGERS + ("bool",)
# Pad, CumSum, ReduceMin/Prod/L2, ArgMax/ArgMin, TopK (issue 18): rows in ops_data.py.
from aicfc.ir.ops_data import DATA_OPS  # noqa: E402

OPS.update({op.name: op for op in DATA_OPS})
# Their int64 results (indices) are exact: sums and picks of 0/1 and of indices below 2**24
# (lower_data.py); the type rules keep their data inputs float.
RUNTIME_DTYPES.update({op: ("f32", "f16", "i64") for op in ("ArgMax", "ArgMin", "TopK")})
RUNTIME_DTYPES["ScatterND"] = FLOATS   # the data and updates; the indices are integers by the type rule
# Rotary position embeddings (issue 18): the exporter leaves cos/sin of the static positions'
# angles as ops on constants (folded at compile time); at run time they are maps.
OPS.update({op.name: op for op in [
    OpDef("Cos", (1, 1), _infer_unary, lambda x, _: np.cos(x[0])),
    OpDef("Sin", (1, 1), _infer_unary, lambda x, _: np.sin(x[0])),
]})
# RMSNormalization (opset 23; issue 18): its row in ops_norms.py.
from aicfc.ir.ops_norms import NORM_OPS  # noqa: E402

OPS.update({op.name: op for op in NORM_OPS})


# Integer arithmetic at run time (issue 18): position ids (RoBERTa's CumSum of its non-padding
# mask), masks multiplied and compared, T5's relative-position buckets before they fold. A
# compute whose result and loads are all integers or bools runs in int64, exactly, in the
# kernel and in the interpreter ([Note: Integer computes] in ir/lowered.py); Div and Mod on
# integers stay constants-only (their rounding differs from float's).
def _infer_numeric(t: list[TensorType], _: Attrs) -> TensorType:
    """Element-wise over inputs of one dtype, float or integer (broadcast)."""
    dtype = _same_dtype(t)
    if dtype not in FLOATS + INTEGERS:
        raise OpTypeError(f"dtype {dtype} is neither a float nor an integer type")
    shape: tuple[int, ...] = ()
    for x in t:
        shape = _broadcast(shape, x.shape)
    return TensorType(dtype, shape)


for _name in ("Neg", "Abs", "Max", "Min", "Clip"):
    OPS[_name] = OpDef(_name, OPS[_name].arity, _infer_numeric, OPS[_name].evaluate, OPS[_name].attrs)
# Sign (DeBERTa-v2's log-bucketed relative positions): -1, 0 or 1; 0 and NaN map to themselves.
OPS["Sign"] = OpDef("Sign", (1, 1), _infer_numeric, lambda x, _: np.sign(x[0]))
INTEGER_RUNTIME = ("Add", "Sub", "Mul", "Div", "Mod", "Neg", "Abs", "Sign", "Max", "Min", "Clip", "CumSum", "Where", "Expand", "Slice", "Gather",
                   "GatherElements", "Concat", "Identity") + COMPARISONS
for _op in INTEGER_RUNTIME:
    RUNTIME_DTYPES[_op] = tuple(dict.fromkeys(RUNTIME_DTYPES.get(_op, ("f32", "f16")) + INTEGERS))
