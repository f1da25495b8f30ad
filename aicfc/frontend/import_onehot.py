"""Hardmax and OneHot, rewritten at import into ops the compiler has (an index compared with a
constant row of positions):

    Hardmax(x, axis)  =>  ArgMax(x, axis, keepdims) == iota  ->  Cast to x's type
        (ties to the first maximum, as Hardmax; iota = 0..extent-1 along the axis)
    OneHot(indices, depth, values, axis)  =>  i = Where(indices < 0, indices + depth, indices)
                                              Where(Reshape(i, a 1 at axis) == iota, values[1], values[0])
        (an index outside [-depth, depth - 1] matches nothing: every position off, as ONNX says)

Both need opset 13's Hardmax (its axis alone, not the 2-D coercion of opsets 1-11), constant
depth and values, and integer indices (float ones are cast to int64 first, as ONNX says); the rest
is refused by name.
"""
from __future__ import annotations

import numpy as np

from aicfc.errors import AicfError
from aicfc.ir.types import TensorType, Weight

Step = tuple[str, list[str], str, dict]
REWRITTEN = {"Hardmax", "OneHot"}
HARDMAX_OPSET = 13   # the first opset whose Hardmax takes its axis alone


def _constant(name: str, value: np.ndarray, types: dict[str, TensorType], weights: dict[str, Weight]) -> str:
    weights[name] = Weight.of(name, value)
    types[name] = weights[name].type
    return name


def _iota(origin: str, extent: int, axis: int, rank: int, dtype, types, weights) -> str:
    """0..extent-1 along `axis` of a rank-`rank` tensor (ones elsewhere: it broadcasts)."""
    shape = (extent,) + (1,) * (rank - 1 - axis)
    return _constant(f"{origin}.iota", np.arange(extent, dtype=dtype).reshape(shape), types, weights)


def _axis(axis: int, rank: int, origin: str, op: str) -> int:
    resolved = axis + rank if axis < 0 else axis
    if not 0 <= resolved < rank:
        raise AicfError(f"node {origin!r}: {op} axis {axis} out of range for rank {rank}")
    return resolved


def hardmax(origin: str, x: str, types: dict[str, TensorType], weights: dict[str, Weight], at: dict, opset: int,
            out: str) -> list[Step]:
    shape = types[x].shape
    rank = len(shape)
    axis = _axis(int(at.get("axis", -1 if opset >= HARDMAX_OPSET else 1)), rank, origin, "Hardmax")
    if opset < HARDMAX_OPSET and any(d != 1 for d in shape[axis + 1:]):
        raise AicfError(f"node {origin!r}: Hardmax before opset {HARDMAX_OPSET} with axis {axis} of rank {rank} "
                        f"(flattening semantics) is not supported; re-export with opset >= {HARDMAX_OPSET}")
    iota = _iota(origin, shape[axis], axis, rank, np.int64, types, weights)
    return [("ArgMax", [x], f"{origin}.argmax", {"axis": axis, "keepdims": 1, "select_last_index": 0}),
            ("Equal", [f"{origin}.argmax", iota], f"{origin}.hot", {}),
            ("Cast", [f"{origin}.hot"], out, {"to": types[x].dtype})]


def one_hot(origin: str, args: list[str], types: dict[str, TensorType], weights: dict[str, Weight], at: dict,
            out: str) -> list[Step]:
    indices, depth_in, values_in = args[:3]
    steps: list[Step] = []
    if types[indices].dtype in ("f32", "f16"):   # ONNX: non-integer indices are cast to int64 (truncated)
        steps.append(("Cast", [indices], f"{origin}.indices", {"to": "i64"}))
        indices = f"{origin}.indices"
        types[indices] = TensorType("i64", types[args[0]].shape)
    elif types[indices].dtype not in ("i64", "i32"):
        raise AicfError(f"node {origin!r}: OneHot indices of {types[indices].dtype}; int64, int32, float32 and "
                        "float16 are supported")
    for name, what in ((depth_in, "depth"), (values_in, "values")):
        if name not in weights:
            raise AicfError(f"node {origin!r}: OneHot's {what} is computed at run time; only a constant is supported")
    depth = int(np.asarray(weights[depth_in].array()).reshape(-1)[0])
    values = np.asarray(weights[values_in].array()).reshape(-1)
    if depth < 1 or values.size != 2:
        raise AicfError(f"node {origin!r}: OneHot with depth {depth} and {values.size} values; a positive depth "
                        "and two values (off, on) are supported")
    shape = types[indices].shape
    rank = len(shape) + 1
    axis = _axis(int(at.get("axis", -1)), rank, origin, "OneHot")
    int_t = np.dtype(np.int64 if types[indices].dtype == "i64" else np.int32)
    zero = _constant(f"{origin}.zero", np.zeros((), int_t), types, weights)
    size = _constant(f"{origin}.depth", np.asarray(depth, int_t), types, weights)
    off = _constant(f"{origin}.off", values[:1].reshape(()).copy(), types, weights)
    on = _constant(f"{origin}.on", values[1:].reshape(()).copy(), types, weights)
    iota = _iota(origin, depth, axis, rank, int_t, types, weights)
    p = f"{origin}."
    return steps + [("Less", [indices, zero], p + "negative", {}), ("Add", [indices, size], p + "wrapped", {}),
            ("Where", [p + "negative", p + "wrapped", indices], p + "index", {}),
            ("Reshape", [p + "index"], p + "column", {"shape": tuple(shape[:axis]) + (1,) + tuple(shape[axis:])}),
            ("Equal", [p + "column", iota], p + "hot", {}),
            ("Where", [p + "hot", on, off], out, {})]
