"""High IR rows of the convolutional ops: Conv, BatchNormalization, the pools, LRN, Clip, Sum.

`aicfc.ir.ops` appends these rows to its table (import it, not this module, first). Their
attributes arrive normalized by the importer: `pads` is explicit (auto_pad resolved) as ONNX
writes it, (begin.., end..) with one of each per spatial axis, `strides`, `dilations` and
`kernel_shape` one entry per spatial axis, `group` an int. The window ops take 1, 2 or 3
spatial axes (NCL, NCHW, NCDHW): each is a reduction over its taps whose accesses are affine
in any number of axes, so lowering and both schedule families (`conv`'s implicit GEMM splits a
flat m or k into however many variables it has; `window` loops over every tap axis) take 1-D
and 3-D natively, with no view to a unit height. The numpy meanings below are the reference
the interpreters are checked against; they pad explicitly and sum window taps.
"""
from __future__ import annotations

import itertools
import math

import numpy as np

from aicfc.ir import resize
from aicfc.ir.ops import Attrs, OpDef, OpTypeError, _broadcast, _same_float
from aicfc.ir.types import TensorType


def pool_extent(n: int, k: int, stride: int, dilation: int, pad_begin: int, pad_end: int, ceil: bool) -> int:
    """Output extent of a window op along one axis (ONNX's rule; with ceil_mode, a last window
    that would start past the input and its leading pad is dropped, as onnxruntime does)."""
    span = n + pad_begin + pad_end - dilation * (k - 1) - 1
    if span < 0:
        raise OpTypeError(f"window of {k} (dilation {dilation}) does not fit an extent of {n} with pads "
                          f"{pad_begin}, {pad_end}")
    out = (math.ceil(span / stride) if ceil else span // stride) + 1
    if ceil and (out - 1) * stride >= n + pad_begin:
        out -= 1
    return out


def _spatial(x: tuple[int, ...], at: Attrs, ceil: bool = False) -> tuple[int, ...]:
    nd = len(at["kernel_shape"])
    if len(x) != nd + 2 or not 1 <= nd <= 3:
        raise OpTypeError(f"a {nd}-D window needs a rank-{nd + 2} input (1 to 3 spatial axes), got rank {len(x)}")
    pads = at["pads"]
    return tuple(pool_extent(x[2 + a], at["kernel_shape"][a], at["strides"][a], at["dilations"][a], pads[a],
                             pads[a + nd], ceil) for a in range(nd))


def _infer_conv(t: list[TensorType], at: Attrs) -> TensorType:
    dtype = _same_float(t)
    x, w = t[0].shape, t[1].shape
    g = at["group"]
    if len(w) != len(x) or x[1:2] != (w[1] * g,) or w[0] % g:
        raise OpTypeError(f"Conv weight {list(w)} does not fit input {list(x)} with group {g}")
    if tuple(w[2:]) != tuple(at["kernel_shape"]):
        raise OpTypeError(f"Conv kernel_shape {list(at['kernel_shape'])} differs from the weight's {list(w[2:])}")
    if len(t) == 3 and t[2].shape != (w[0],):
        raise OpTypeError(f"Conv bias {list(t[2].shape)} is not [{w[0]}]")
    return TensorType(dtype, (x[0], w[0]) + _spatial(x, at))


def _infer_pool(t: list[TensorType], at: Attrs) -> TensorType:
    x = t[0].shape
    return TensorType(_same_float(t), x[:2] + _spatial(x, at, bool(at["ceil_mode"])))


def _infer_global_pool(t: list[TensorType], _: Attrs) -> TensorType:
    x = t[0].shape
    if len(x) < 3:
        raise OpTypeError(f"a global pool needs a spatial input, got rank {len(x)}")
    return TensorType(_same_float(t), x[:2] + (1,) * (len(x) - 2))


def _infer_resize(t: list[TensorType], at: Attrs) -> TensorType:
    if len(at["shape"]) != len(t[0].shape) or len(at["scales"]) != len(t[0].shape):
        raise OpTypeError(f"Resize to {list(at['shape'])} does not fit an input of rank {len(t[0].shape)}")
    return TensorType(_same_float(t), tuple(at["shape"]))


def _infer_batch_norm(t: list[TensorType], _: Attrs) -> TensorType:
    x = t[0].shape
    if len(x) < 2 or any(p.shape != (x[1],) for p in t[1:]):
        raise OpTypeError(f"BatchNormalization parameters {[list(p.shape) for p in t[1:]]} are not [C] for input {list(x)}")
    return TensorType(_same_float(t), x)


def _infer_lrn(t: list[TensorType], at: Attrs) -> TensorType:
    if len(t[0].shape) < 3:
        raise OpTypeError(f"LRN needs an input of rank >= 3, got {len(t[0].shape)}")
    return TensorType(_same_float(t), t[0].shape)


def _infer_same(t: list[TensorType], _: Attrs) -> TensorType:
    return TensorType(_same_float(t), t[0].shape)


def _infer_sum(t: list[TensorType], _: Attrs) -> TensorType:
    shape = t[0].shape
    for x in t[1:]:
        shape = _broadcast(shape, x.shape)
    return TensorType(_same_float(t), shape)


# ---------------------------------------------------------------- numpy meanings


def windows(x: np.ndarray, at: Attrs, out_sp: tuple[int, ...], fill: float):
    """(taps, tap) for every kernel tap (one index per spatial axis):
    tap[n, c, o..] = x[n, c, o·s + k·d - pad_begin, ..], `fill` outside the input."""
    nd = len(out_sp)
    ks, ss, ds, pads = at["kernel_shape"], at["strides"], at["dilations"], at["pads"]
    need = [max((o - 1) * s + (k - 1) * d + 1, p + n) for o, s, k, d, p, n in zip(out_sp, ss, ks, ds, pads, x.shape[2:])]
    xp = np.full(x.shape[:2] + tuple(need), fill, dtype=x.dtype)
    xp[(slice(None), slice(None)) + tuple(slice(p, p + n) for p, n in zip(pads[:nd], x.shape[2:]))] = x
    for taps in itertools.product(*(range(k) for k in ks)):
        yield taps, xp[(slice(None), slice(None)) + tuple(slice(t * d, t * d + (o - 1) * s + 1, s)
                                                          for t, d, o, s in zip(taps, ds, out_sp, ss))]


def _conv(x: list[np.ndarray], at: Attrs) -> np.ndarray:
    inp, w = x[0], x[1]
    g = at["group"]
    n, c = inp.shape[:2]
    m = w.shape[0]
    osp = _spatial(inp.shape, at)
    out = np.zeros((n, g, m // g) + osp, dtype=inp.dtype)
    wg = w.reshape(g, m // g, c // g, *w.shape[2:])
    for taps, tap in windows(inp, at, osp, 0.0):
        out += np.einsum("ngc...,gmc->ngm...", tap.reshape((n, g, c // g) + osp), wg[(Ellipsis,) + taps])
    out = out.reshape((n, m) + osp)
    if len(x) == 3:
        out = out + x[2].reshape((1, m) + (1,) * len(osp))
    return out.astype(inp.dtype)


def pool_counts(x_sp: tuple[int, ...], at: Attrs, out_sp: tuple[int, ...], include_pad: bool) -> np.ndarray:
    """[O..]: how many taps of each window an average divides by. Taps in the explicit pads
    count under count_include_pad; taps past them (ceil_mode's overhang) never do."""
    nd = len(out_sp)
    total = np.ones((), dtype=np.int64)
    for axis in range(nd):
        k, s, d = at["kernel_shape"][axis], at["strides"][axis], at["dilations"][axis]
        lo, hi = (-at["pads"][axis], x_sp[axis] + at["pads"][axis + nd]) if include_pad else (0, x_sp[axis])
        start = np.arange(out_sp[axis]) * s - at["pads"][axis]
        taps = start[:, None] + d * np.arange(k)[None, :]
        total = np.multiply.outer(total, ((taps >= lo) & (taps < hi)).sum(axis=1))
    return total


def _pool(x: list[np.ndarray], at: Attrs, kind: str) -> np.ndarray:
    inp = x[0]
    osp = _spatial(inp.shape, at, bool(at["ceil_mode"]))
    taps = [tap for _, tap in windows(inp, at, osp, -np.inf if kind == "max" else 0.0)]
    if kind == "max":
        return np.max(taps, axis=0).astype(inp.dtype)
    counts = pool_counts(inp.shape[2:], at, osp, bool(at["count_include_pad"]))
    return (np.sum(taps, axis=0) / counts).astype(inp.dtype)


def _batch_norm(x: list[np.ndarray], at: Attrs) -> np.ndarray:
    shape = (1, -1) + (1,) * (x[0].ndim - 2)
    scale, bias, mean, var = (p.reshape(shape) for p in x[1:])
    return ((x[0] - mean) / np.sqrt(var + np.asarray(at["epsilon"], x[0].dtype)) * scale + bias).astype(x[0].dtype)


def _lrn(x: list[np.ndarray], at: Attrs) -> np.ndarray:
    inp, size = x[0], at["size"]
    lo, hi = (size - 1) // 2, size - 1 - (size - 1) // 2
    sq = np.pad(inp * inp, [(0, 0), (lo, hi)] + [(0, 0)] * (inp.ndim - 2))
    total = sum(sq[:, j:j + inp.shape[1]] for j in range(size))
    return (inp / (at["bias"] + at["alpha"] / size * total) ** at["beta"]).astype(inp.dtype)


CNN_OPS = [
    OpDef("Conv", (2, 3), _infer_conv, _conv, ("dilations", "folded", "group", "kernel_shape", "pads", "rule",
                                                "strides")),
    OpDef("BatchNormalization", (5, 5), _infer_batch_norm, _batch_norm, ("epsilon",)),
    OpDef("MaxPool", (1, 1), _infer_pool, lambda x, at: _pool(x, at, "max"),
          ("ceil_mode", "dilations", "kernel_shape", "pads", "strides")),
    OpDef("AveragePool", (1, 1), _infer_pool, lambda x, at: _pool(x, at, "avg"),
          ("ceil_mode", "count_include_pad", "dilations", "kernel_shape", "pads", "strides")),
    OpDef("GlobalAveragePool", (1, 1), _infer_global_pool,
          lambda x, _: x[0].mean(axis=tuple(range(2, x[0].ndim)), keepdims=True).astype(x[0].dtype)),
    OpDef("GlobalMaxPool", (1, 1), _infer_global_pool,
          lambda x, _: x[0].max(axis=tuple(range(2, x[0].ndim)), keepdims=True).astype(x[0].dtype)),
    OpDef("LRN", (1, 1), _infer_lrn, _lrn, ("alpha", "beta", "bias", "size")),
    # Resize's scales/sizes/axes are constants resolved by the importer into the output shape
    # and the per-axis scale of the coordinate transform (`aicfc.ir.resize`).
    OpDef("Resize", (1, 1), _infer_resize, lambda x, at: resize.evaluate(x[0], at),
          ("coordinate_transformation_mode", "cubic_coeff_a", "exclude_outside", "mode", "nearest_mode", "scales",
           "shape")),
    # Clip's bounds are constants, moved into attributes by the importer (±inf when absent).
    OpDef("Clip", (1, 1), _infer_same, lambda x, at: np.clip(x[0], at["min"], at["max"]).astype(x[0].dtype),
          ("max", "min")),
    # Dropout at inference is the identity (canonicalize removes it); its mask output is refused.
    OpDef("Dropout", (1, 1), _infer_same, lambda x, _: x[0]),
    OpDef("Sum", (1, 1 << 16), _infer_sum, lambda x, _: np.asarray(sum(x[1:], x[0]), dtype=x[0].dtype)),
]
