"""High IR row of RMSNormalization (opset 23), the norm of the Llama family.

`aicfc.ir.ops` appends it to its table (import that module, not this one, first). It is a
graph op of its own, not a decomposition, so that `passes/lower.py` states it with the same
row structure as LayerNormalization (one statistic, the mean square, and a normalize map)
and records the rule by name. The other norms of current exports reach the High IR as
compositions of ops the table already has (`frontend/import_norms.py`): onnxruntime's
SimplifiedLayerNormalization is this op; Skip(Simplified)LayerNormalization is a residual
Add before it or LayerNormalization; Instance/GroupNormalization are a LayerNormalization of
an [N, groups, elements] view followed by a per-channel affine map.
"""
from __future__ import annotations

import numpy as np

from aicfc.ir.ops import Attrs, OpDef, OpTypeError, _broadcast, _same_float
from aicfc.ir.types import TensorType


def _infer_rms_norm(t: list[TensorType], at: Attrs) -> TensorType:
    x = t[0].shape
    if not 0 <= at["axis"] < len(x):
        raise OpTypeError(f"RMSNormalization axis {at['axis']} out of range for rank {len(x)}")
    inner = x[at["axis"]:]
    if _broadcast(t[1].shape, inner) != inner:
        raise OpTypeError(f"RMSNormalization scale {list(t[1].shape)} does not broadcast to the normalized "
                          f"dims {list(inner)}")
    return TensorType(_same_float(t), x)


def rms_norm(x: list[np.ndarray], at: Attrs) -> np.ndarray:
    """y = x / sqrt(mean(x², over the axes from `axis`) + ε) · scale."""
    axes = tuple(range(at["axis"], x[0].ndim))
    ms = (x[0] * x[0]).mean(axis=axes, keepdims=True)
    return (x[0] / np.sqrt(ms + np.asarray(at["epsilon"], dtype=x[0].dtype)) * x[1]).astype(x[0].dtype)


NORM_OPS = [OpDef("RMSNormalization", (2, 2), _infer_rms_norm, rms_norm, ("axis", "epsilon"))]
