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
from aicfc.frontend.import_rewrites import axis_of, constant
from aicfc.ir.types import TensorType, Weight

Step = tuple[str, list[str], str, dict]
REWRITTEN = {"Hardmax", "OneHot"}


def _iota(origin: str, extent: int, axis: int, rank: int, dtype, types, weights) -> str:
    """0..extent-1 along `axis` of a rank-`rank` tensor (ones elsewhere: it broadcasts)."""
    shape = (extent,) + (1,) * (rank - 1 - axis)
    return constant(weights, types, f"{origin}.iota", np.arange(extent, dtype=dtype).reshape(shape))


def hardmax(origin: str, x: str, axis: int, types: dict[str, TensorType], weights: dict[str, Weight],
            out: str) -> list[Step]:
    """`axis` resolved as Softmax's (onnx_import._normalize_attrs: opset 13's meaning, the older one refused
    where it differs)."""
    shape = types[x].shape
    rank = len(shape)
    axis = axis_of(axis, rank, origin, "Hardmax")
    iota = _iota(origin, shape[axis], axis, rank, np.int64, types, weights)
    return [("ArgMax", [x], f"{origin}.argmax", {"axis": axis, "keepdims": 1, "select_last_index": 0}),
            ("Equal", [f"{origin}.argmax", iota], f"{origin}.hot", {}),
            ("Cast", [f"{origin}.hot"], out, {"to": types[x].dtype})]


def one_hot(origin: str, args: list[str], types: dict[str, TensorType], weights: dict[str, Weight], at: dict,
            out: str) -> list[Step]:
    indices, depth_in, values_in = args[:3]
    steps: list[Step] = []
    kind = types[indices].dtype
    if kind in ("f32", "f16"):   # ONNX: non-integer indices are cast to int64 (truncated)
        steps.append(("Cast", [indices], f"{origin}.indices", {"to": "i64"}))
        indices = f"{origin}.indices"
    elif kind not in ("i64", "i32"):
        raise AicfError(f"node {origin!r}: OneHot indices of {kind}; int64, int32, float32 and "
                        "float16 are supported")
    for name, what in ((depth_in, "depth"), (values_in, "values")):
        if name not in weights:
            raise AicfError(f"node {origin!r}: OneHot's {what} is computed at run time; only a constant is supported")
    depth = int(np.asarray(weights[depth_in].array()).reshape(-1)[0])
    values = np.asarray(weights[values_in].array()).reshape(-1)
    if depth < 1 or values.size != 2:
        raise AicfError(f"node {origin!r}: OneHot with depth {depth} and {values.size} values; a positive depth "
                        "and two values (off, on) are supported")
    shape = types[args[0]].shape
    rank = len(shape) + 1
    axis = axis_of(int(at.get("axis", -1)), rank, origin, "OneHot")
    int_t = np.dtype(np.int32 if kind == "i32" else np.int64)
    zero = constant(weights, types, f"{origin}.zero", np.zeros((), int_t))
    size = constant(weights, types, f"{origin}.depth", np.asarray(depth, int_t))
    off = constant(weights, types, f"{origin}.off", values[:1].reshape(()).copy())
    on = constant(weights, types, f"{origin}.on", values[1:].reshape(()).copy())
    iota = _iota(origin, depth, axis, rank, int_t, types, weights)
    p = f"{origin}."
    return steps + [("Less", [indices, zero], p + "negative", {}), ("Add", [indices, size], p + "wrapped", {}),
            ("Where", [p + "negative", p + "wrapped", indices], p + "index", {}),
            ("Reshape", [p + "index"], p + "column", {"shape": tuple(shape[:axis]) + (1,) + tuple(shape[axis:])}),
            ("Equal", [p + "column", iota], p + "hot", {}),
            ("Where", [p + "hot", on, off], out, {})]
