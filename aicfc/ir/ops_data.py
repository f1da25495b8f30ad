"""High IR rows of the data-movement, reduction and selection ops of issue 18: Pad, CumSum,
ReduceMin/ReduceProd/ReduceL2/ReduceSumSquare/ReduceL1/ReduceLogSum/ReduceLogSumExp, ArgMax/ArgMin and TopK.

`aicfc.ir.ops` appends these rows to its table (import it, not this module, first). Their
attributes arrive normalized by the importer: Pad's `pads` is (begin..., end...) over every
axis with a float `value`; CumSum's `axis` is resolved; TopK is one node per output, told
apart by `part` ("values" or "indices"), with a static `k`. Tile, Einsum, DepthToSpace and
SpaceToDepth never reach the High IR: the importer rewrites them into views, transposes,
broadcasts and MatMuls (`frontend/import_rewrites.py`).
"""
from __future__ import annotations

import numpy as np

from aicfc.ir.ops import Attrs, OpDef, OpTypeError, _infer_reduce, _reduce, _same_float
from aicfc.ir.types import TensorType


def _infer_pad(t: list[TensorType], at: Attrs) -> TensorType:
    shape, pads = t[0].shape, at["pads"]
    rank = len(shape)
    if len(pads) != 2 * rank:
        raise OpTypeError(f"Pad needs {2 * rank} pads for rank {rank}, got {len(pads)}")
    out = tuple(n + pads[d] + pads[d + rank] for d, n in enumerate(shape))
    if any(m <= 0 for m in out):
        raise OpTypeError(f"Pad of {list(shape)} by {list(pads)} leaves an empty tensor {list(out)}")
    return TensorType(_same_float(t), out)


def _pad(x: list[np.ndarray], at: Attrs) -> np.ndarray:
    rank, pads = x[0].ndim, at["pads"]
    grow = [(max(pads[d], 0), max(pads[d + rank], 0)) for d in range(rank)]
    y = np.pad(x[0], grow, constant_values=x[0].dtype.type(at["value"]))
    crop = tuple(slice(max(-pads[d], 0), y.shape[d] - max(-pads[d + rank], 0)) for d in range(rank))
    return y[crop]


def _infer_cumsum(t: list[TensorType], at: Attrs) -> TensorType:
    if not 0 <= at["axis"] < len(t[0].shape):
        raise OpTypeError(f"CumSum axis {at['axis']} out of range for rank {len(t[0].shape)}")
    return t[0]


def _cumsum(x: list[np.ndarray], at: Attrs) -> np.ndarray:
    a, axis = x[0], at["axis"]
    if at["reverse"]:
        a = np.flip(a, axis)
    y = np.cumsum(a, axis=axis, dtype=a.dtype)
    if at["exclusive"]:
        y = np.concatenate([np.zeros_like(np.take(y, [0], axis=axis)), np.take(y, range(y.shape[axis] - 1), axis=axis)],
                           axis=axis)
    return np.flip(y, axis) if at["reverse"] else y


def _log_sum_exp(a: np.ndarray, axis: tuple[int, ...], keepdims: bool) -> np.ndarray:
    """log(sum(exp(x))) as m + log(sum(exp(x - m))), m the maximum: no overflow."""
    m = np.max(a, axis=axis, keepdims=True)
    with np.errstate(invalid="ignore"):
        y = m + np.log(np.sum(np.exp(a - m), axis=axis, keepdims=True))
    return y if keepdims else np.squeeze(y, axis)


def _infer_arg(t: list[TensorType], at: Attrs) -> TensorType:
    shape, axis = t[0].shape, at["axis"]
    if not 0 <= axis < len(shape):
        raise OpTypeError(f"axis {axis} out of range for rank {len(shape)}")
    _same_float(t)
    out = tuple(1 if d == axis else n for d, n in enumerate(shape)) if at["keepdims"] else shape[:axis] + shape[axis + 1:]
    return TensorType("i64", out)


def _arg(pick: str):
    def evaluate(x: list[np.ndarray], at: Attrs) -> np.ndarray:
        a, axis = x[0], at["axis"]
        if at["select_last_index"]:   # the last of equal extremes: the first one of the flipped axis
            idx = a.shape[axis] - 1 - getattr(np, pick)(np.flip(a, axis), axis=axis, keepdims=True)
        else:
            idx = getattr(np, pick)(a, axis=axis, keepdims=True)
        idx = idx.astype(np.int64)
        return idx if at["keepdims"] else np.squeeze(idx, axis)
    return evaluate


def _infer_topk(t: list[TensorType], at: Attrs) -> TensorType:
    shape, axis, k = t[0].shape, at["axis"], at["k"]
    if not 0 <= axis < len(shape) or not 1 <= k <= shape[axis]:
        raise OpTypeError(f"TopK of {k} along axis {axis} of {list(shape)}")
    out = tuple(k if d == axis else n for d, n in enumerate(shape))
    dtype = _same_float(t)
    return TensorType("i64" if at["part"] == "indices" else dtype, out)


def _topk(x: list[np.ndarray], at: Attrs) -> np.ndarray:
    """Sorted, ties to the lower index (ONNX): a stable sort of -x (largest) or of x."""
    a, axis = x[0], at["axis"]
    order = np.argsort(-a if at["largest"] else a, axis=axis, kind="stable")
    order = np.take(order, range(at["k"]), axis=axis)
    return order.astype(np.int64) if at["part"] == "indices" else np.take_along_axis(a, order, axis=axis)


DATA_OPS = [
    # Constant mode only, constant pads (negative ones crop) and value: one guarded read.
    OpDef("Pad", (1, 1), _infer_pad, _pad, ("pads", "value")),
    # Any axis; exclusive, reverse: a sum over a guarded window of the axis (lower_data.py).
    OpDef("CumSum", (1, 1), _infer_cumsum, _cumsum, ("axis", "exclusive", "reverse")),
    OpDef("ReduceMin", (1, 1), _infer_reduce, _reduce(np.min), ("axes", "keepdims")),
    OpDef("ReduceProd", (1, 1), _infer_reduce, _reduce(np.prod), ("axes", "keepdims")),
    OpDef("ReduceL2", (1, 1), _infer_reduce, _reduce(lambda a, axis, keepdims: np.sqrt(np.sum(
        a * a, axis=axis, keepdims=keepdims))), ("axes", "keepdims")),
    OpDef("ReduceSumSquare", (1, 1), _infer_reduce, _reduce(lambda a, axis, keepdims: np.sum(
        a * a, axis=axis, keepdims=keepdims)), ("axes", "keepdims")),
    OpDef("ReduceL1", (1, 1), _infer_reduce, _reduce(lambda a, axis, keepdims: np.sum(
        np.abs(a), axis=axis, keepdims=keepdims)), ("axes", "keepdims")),
    OpDef("ReduceLogSum", (1, 1), _infer_reduce, _reduce(lambda a, axis, keepdims: np.log(np.sum(
        a, axis=axis, keepdims=keepdims))), ("axes", "keepdims")),
    OpDef("ReduceLogSumExp", (1, 1), _infer_reduce, _reduce(_log_sum_exp), ("axes", "keepdims")),
    OpDef("ArgMax", (1, 1), _infer_arg, _arg("argmax"), ("axis", "keepdims", "select_last_index")),
    OpDef("ArgMin", (1, 1), _infer_arg, _arg("argmin"), ("axis", "keepdims", "select_last_index")),
    OpDef("TopK", (1, 1), _infer_topk, _topk, ("k", "axis", "largest", "part")),
]


# ScatterND (issue 19: a static KV cache written at cache_position). `axes` names the data axes
# the last dimension of the indices addresses, in order: ONNX's is (0, .., k-1); canonicalize
# folds the exporter's transposes around an index_copy into other axes (passes/fold_scatter_axes.py).
# The updates then hold, per index tuple, the slice of the remaining axes in increasing order.
def _infer_scatter(t: list[TensorType], at: Attrs) -> TensorType:
    data, ids, upd = t
    axes = at["axes"]
    rest = tuple(n for d, n in enumerate(data.shape) if d not in axes)
    if (ids.dtype not in ("i64", "i32") or not ids.shape or ids.shape[-1] != len(axes) or not axes
            or len(set(axes)) != len(axes) or not all(0 <= a < len(data.shape) for a in axes)
            or upd.shape != ids.shape[:-1] + rest or upd.dtype != data.dtype):
        raise OpTypeError(f"ScatterND of {list(data.shape)} ({data.dtype}) at axes {list(axes)} by indices "
                          f"{list(ids.shape)} ({ids.dtype}) with updates {list(upd.shape)} ({upd.dtype})")
    return data


def _scatter(x: list[np.ndarray], at: Attrs) -> np.ndarray:
    data, ids, upd = x
    axes = at["axes"]
    y = data.copy()
    flat_ids = ids.reshape(-1, len(axes)).astype(np.int64)
    rest = tuple(n for d, n in enumerate(data.shape) if d not in axes)
    flat_upd = upd.reshape((flat_ids.shape[0],) + rest)
    dims = np.asarray([data.shape[a] for a in axes])
    if ((flat_ids < -dims) | (flat_ids >= dims)).any():
        raise ValueError("ScatterND indices out of range")
    flat_ids = np.where(flat_ids < 0, flat_ids + dims, flat_ids)
    for u in range(flat_ids.shape[0]):
        where = [slice(None)] * data.ndim
        for a, v in zip(axes, flat_ids[u]):
            where[a] = int(v)
        y[tuple(where)] = flat_upd[u]
    return y


DATA_OPS.append(OpDef("ScatterND", (3, 3), _infer_scatter, _scatter, ("axes",)))
