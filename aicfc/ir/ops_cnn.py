"""High IR rows of the convolutional ops: Conv, BatchNormalization, the pools, LRN, Clip, Sum.

`aicfc.ir.ops` appends these rows to its table (import it, not this module, first). Their
attributes arrive normalized by the importer: `pads` is explicit (auto_pad resolved) as
(top, left, bottom, right), `strides`, `dilations` and `kernel_shape` are 2-tuples, `group`
an int. Only 2-D spatial ops (NCHW inputs) are accepted. The numpy meanings below are the
reference the interpreters are checked against; they pad explicitly and sum window taps.
"""
from __future__ import annotations

import math

import numpy as np

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


def _spatial(x: tuple[int, ...], at: Attrs, ceil: bool = False) -> tuple[int, int]:
    if len(x) != 4:
        raise OpTypeError(f"only 2-D (NCHW) inputs are supported, got rank {len(x)}")
    (kh, kw), (sh, sw), (dh, dw) = at["kernel_shape"], at["strides"], at["dilations"]
    top, left, bottom, right = at["pads"]
    return (pool_extent(x[2], kh, sh, dh, top, bottom, ceil), pool_extent(x[3], kw, sw, dw, left, right, ceil))


def _infer_conv(t: list[TensorType], at: Attrs) -> TensorType:
    dtype = _same_float(t)
    x, w = t[0].shape, t[1].shape
    g = at["group"]
    if len(w) != 4 or x[1:2] != (w[1] * g,) or w[0] % g:
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
        raise OpTypeError(f"GlobalAveragePool needs a spatial input, got rank {len(x)}")
    return TensorType(_same_float(t), x[:2] + (1,) * (len(x) - 2))


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


def windows(x: np.ndarray, at: Attrs, out_hw: tuple[int, int], fill: float):
    """(kh, kw, tap) for every kernel tap: tap[n, c, oh, ow] = x[n, c, oh·s + kh·d - pad_top, ...],
    `fill` outside the input."""
    (kh_n, kw_n), (sh, sw), (dh, dw) = at["kernel_shape"], at["strides"], at["dilations"]
    top, left = at["pads"][0], at["pads"][1]
    oh, ow = out_hw
    h_need = (oh - 1) * sh + (kh_n - 1) * dh + 1
    w_need = (ow - 1) * sw + (kw_n - 1) * dw + 1
    xp = np.full(x.shape[:2] + (max(h_need, top + x.shape[2]), max(w_need, left + x.shape[3])), fill, dtype=x.dtype)
    xp[:, :, top:top + x.shape[2], left:left + x.shape[3]] = x
    for kh in range(kh_n):
        for kw in range(kw_n):
            yield kh, kw, xp[:, :, kh * dh: kh * dh + (oh - 1) * sh + 1: sh, kw * dw: kw * dw + (ow - 1) * sw + 1: sw]


def _conv(x: list[np.ndarray], at: Attrs) -> np.ndarray:
    inp, w = x[0], x[1]
    g = at["group"]
    n, c = inp.shape[:2]
    m = w.shape[0]
    oh, ow = _spatial(inp.shape, at)
    out = np.zeros((n, g, m // g, oh, ow), dtype=inp.dtype)
    wg = w.reshape(g, m // g, c // g, *w.shape[2:])
    for kh, kw, tap in windows(inp, at, (oh, ow), 0.0):
        out += np.einsum("ngchw,gmc->ngmhw", tap.reshape(n, g, c // g, oh, ow), wg[..., kh, kw])
    out = out.reshape(n, m, oh, ow)
    if len(x) == 3:
        out = out + x[2].reshape(1, m, 1, 1)
    return out.astype(inp.dtype)


def pool_counts(x_hw: tuple[int, int], at: Attrs, out_hw: tuple[int, int], include_pad: bool) -> np.ndarray:
    """[OH, OW]: how many taps of each window an average divides by. Taps in the explicit pads
    count under count_include_pad; taps past them (ceil_mode's overhang) never do."""
    counts = []
    for axis in range(2):
        k, s, d = at["kernel_shape"][axis], at["strides"][axis], at["dilations"][axis]
        lo, hi = (-at["pads"][axis], x_hw[axis] + at["pads"][axis + 2]) if include_pad else (0, x_hw[axis])
        start = np.arange(out_hw[axis]) * s - at["pads"][axis]
        taps = start[:, None] + d * np.arange(k)[None, :]
        counts.append(((taps >= lo) & (taps < hi)).sum(axis=1))
    return np.outer(counts[0], counts[1])


def _pool(x: list[np.ndarray], at: Attrs, kind: str) -> np.ndarray:
    inp = x[0]
    oh, ow = _spatial(inp.shape, at, bool(at["ceil_mode"]))
    taps = [tap for _, _, tap in windows(inp, at, (oh, ow), -np.inf if kind == "max" else 0.0)]
    if kind == "max":
        return np.max(taps, axis=0).astype(inp.dtype)
    counts = pool_counts(inp.shape[2:], at, (oh, ow), bool(at["count_include_pad"]))
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
    OpDef("Conv", (2, 3), _infer_conv, _conv, ("dilations", "folded", "group", "kernel_shape", "pads", "strides")),
    OpDef("BatchNormalization", (5, 5), _infer_batch_norm, _batch_norm, ("epsilon",)),
    OpDef("MaxPool", (1, 1), _infer_pool, lambda x, at: _pool(x, at, "max"),
          ("ceil_mode", "dilations", "kernel_shape", "pads", "strides")),
    OpDef("AveragePool", (1, 1), _infer_pool, lambda x, at: _pool(x, at, "avg"),
          ("ceil_mode", "count_include_pad", "dilations", "kernel_shape", "pads", "strides")),
    OpDef("GlobalAveragePool", (1, 1), _infer_global_pool,
          lambda x, _: x[0].mean(axis=tuple(range(2, x[0].ndim)), keepdims=True).astype(x[0].dtype)),
    OpDef("LRN", (1, 1), _infer_lrn, _lrn, ("alpha", "beta", "bias", "size")),
    # Clip's bounds are constants, moved into attributes by the importer (±inf when absent).
    OpDef("Clip", (1, 1), _infer_same, lambda x, at: np.clip(x[0], at["min"], at["max"]).astype(x[0].dtype),
          ("max", "min")),
    # Dropout at inference is the identity (canonicalize removes it); its mask output is refused.
    OpDef("Dropout", (1, 1), _infer_same, lambda x, _: x[0]),
    OpDef("Sum", (1, 1 << 16), _infer_sum, lambda x, _: np.asarray(sum(x[1:], x[0]), dtype=x[0].dtype)),
]
