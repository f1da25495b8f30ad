"""Resize as per-axis tap tables: the one definition the numpy meaning, the lowering and codegen share.

ONNX's Resize is separable: along each resized axis, output position o reads a few input
positions (1 for nearest, 2 for linear, 4 for cubic) with weights that depend on o alone. So
an axis is a table `idx[o, t]` (the input positions, clamped into the axis as ONNX's edge
padding does) and `wt[o, t]` (their weights), and the N-D resize is

    y[.., o_a, .., o_b, ..] = Σ_{t_a, t_b} wt_a[o_a, t_a] · wt_b[o_b, t_b] · x[.., idx_a[o_a, t_a], .., idx_b[o_b, t_b], ..]

Lowering writes that sum as one element-wise map whose loads read the input through indirect
indices ([Note: Indirect index]) from the constant tables; a nearest axis has one tap of
weight 1 (no weight read), an axis the resize leaves alone stays an affine index.

The coordinate of output position o in the input (`source_coordinate`) follows the ONNX
specification's coordinate_transformation_mode formulas with the scale the node used (the
given one, or output/input size when sizes were given); tf_crop_and_resize (a region of
interest and an extrapolation value) is refused at import, as is antialias.
"""
from __future__ import annotations

import math

import numpy as np

COORDINATE_MODES = ("half_pixel", "half_pixel_symmetric", "pytorch_half_pixel", "align_corners", "asymmetric")
NEAREST_MODES = ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil")
MODES = ("nearest", "linear", "cubic")


def source_coordinate(o: np.ndarray, n_in: int, n_out: int, scale: float, coord: str) -> np.ndarray:
    """The input coordinate of output positions `o` (float64) along one axis."""
    width = scale * n_in   # the "output width" before truncation, as ONNX defines it
    if coord == "align_corners":
        return np.zeros_like(o) if width == 1 else o * (n_in - 1) / (width - 1)
    if coord == "asymmetric":
        return o / scale
    if coord == "pytorch_half_pixel":
        return np.full_like(o, -0.5) if width == 1 else (o + 0.5) / scale - 0.5
    if coord == "half_pixel":
        return (o + 0.5) / scale - 0.5
    if coord == "half_pixel_symmetric":
        offset = n_in / 2 * (1 - n_out / width)
        return offset + (o + 0.5) / scale - 0.5
    raise ValueError(coord)


def _cubic(r: np.ndarray, a: float) -> np.ndarray:
    """Keys' cubic convolution weights of the four taps floor(x)-1 .. floor(x)+2, r = x - floor(x)."""
    def near(d):   # |d| <= 1
        return ((a + 2) * d - (a + 3)) * d * d + 1

    def far(d):    # 1 < |d| < 2
        return ((a * d - 5 * a) * d + 8 * a) * d - 4 * a
    return np.stack([far(r + 1), near(r), near(1 - r), far(2 - r)], axis=1)


def taps(n_in: int, n_out: int, scale: float, at: dict) -> tuple[np.ndarray, np.ndarray]:
    """(idx [n_out, T] int64, wt [n_out, T] float64) of one axis; taps of weight 0 dropped."""
    o = np.arange(n_out, dtype=np.float64)
    x = source_coordinate(o, n_in, n_out, scale, at["coordinate_transformation_mode"])
    mode = at["mode"]
    if mode == "nearest":
        base = np.floor(x)
        frac = x - base
        rule = at["nearest_mode"]
        if rule == "floor":
            pick = base
        elif rule == "ceil":
            pick = np.ceil(x)
        elif rule == "round_prefer_floor":
            pick = np.where(frac <= 0.5, base, base + 1)
        else:
            pick = np.where(frac < 0.5, base, base + 1)
        return np.clip(pick, 0, n_in - 1).astype(np.int64)[:, None], np.ones((n_out, 1))
    base = np.floor(x)
    # An exact integer coordinate counts as the right end of the interval before it (ratio 1),
    # as ONNX's reference does; the weights are then those of a tap on the point itself.
    exact = x == base
    base = np.where(exact, base - 1, base)
    r = x - base
    if mode == "linear":
        first = base
        wt = np.stack([1 - r, r], axis=1)
    else:
        first = base - 1
        wt = _cubic(r, at["cubic_coeff_a"])
    pos = first[:, None] + np.arange(wt.shape[1])[None, :]
    if mode == "cubic" and at["exclude_outside"]:
        wt = np.where((pos >= 0) & (pos < n_in), wt, 0.0)
        wt = wt / wt.sum(axis=1, keepdims=True)
    idx = np.clip(pos, 0, n_in - 1).astype(np.int64)
    return _compact(idx, wt)


def _compact(idx: np.ndarray, wt: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The same taps with those of weight 0 moved last and the all-zero tap columns dropped
    (an exact linear coordinate reads one input, not two)."""
    order = np.argsort(wt == 0, axis=1, kind="stable")
    idx, wt = np.take_along_axis(idx, order, 1), np.take_along_axis(wt, order, 1)
    keep = max(1, int((wt != 0).sum(axis=1).max()))
    return idx[:, :keep], wt[:, :keep]


def axis_tables(shape: tuple[int, ...], at: dict) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """{axis: (idx, wt)} for every axis the resize changes (an identity axis is left out)."""
    out = {}
    for a, (n_in, n_out, scale) in enumerate(zip(shape, at["shape"], at["scales"])):
        idx, wt = taps(n_in, n_out, scale, at)
        if n_in == n_out and idx.shape[1] == 1 and np.array_equal(idx[:, 0], np.arange(n_out)) and np.all(wt == 1):
            continue
        out[a] = (idx, wt)
    return out


def evaluate(x: np.ndarray, at: dict) -> np.ndarray:
    """The numpy meaning: each resized axis contracted with its dense [n_out, n_in] matrix."""
    y = x.astype(np.float64)
    for a, (idx, wt) in axis_tables(x.shape, at).items():
        dense = np.zeros((idx.shape[0], x.shape[a]))
        np.add.at(dense, (np.arange(idx.shape[0])[:, None].repeat(idx.shape[1], 1), idx), wt)
        y = np.moveaxis(np.tensordot(dense, np.moveaxis(y, a, 0), axes=(1, 0)), 0, a)
    return y.astype(x.dtype)
