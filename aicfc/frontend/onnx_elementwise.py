"""Attributes of issue 18's element-wise ops (ir/ops_elementwise.py), normalized at import.

Defaults are filled in; Trilu's `k` input must be a constant (it becomes an attribute); the
variants ONNX leaves undefined or the compiler does not take are refused in one line:
Gelu's `approximate` other than "none"/"tanh", and Mod with fmod=0 on floats before opset 28
(onnxruntime refuses it too; opset 28 defines it as the floored remainder).
"""
from __future__ import annotations

from aicfc.errors import AicfError
from aicfc.ir.types import TensorType, Weight

ELEMENTWISE_ATTR_OPS = {"HardSigmoid", "Gelu", "Mod", "Trilu", "LeakyRelu", "Elu", "Selu", "Celu", "ThresholdedRelu",
                        "Shrink", "Swish"}
# ONNX's defaults of the activations' float attributes
ACTIVATION_DEFAULTS = {
    "LeakyRelu": {"alpha": 0.01}, "Elu": {"alpha": 1.0}, "Celu": {"alpha": 1.0}, "ThresholdedRelu": {"alpha": 1.0},
    "Selu": {"alpha": 1.67326319217681884765625, "gamma": 1.05070102214813232421875},
    "Shrink": {"bias": 0.0, "lambd": 0.5}, "Swish": {"alpha": 1.0},
}
FLOOR_MOD_OPSET = 28   # the first opset whose Mod defines fmod=0 on floats


def elementwise_attrs(op: str, at: dict, args: list[str], types: dict[str, TensorType],
                      weights: dict[str, Weight], opset: int, origin: str) -> dict:
    if op in ACTIVATION_DEFAULTS:
        out = {k: float(at.get(k, v)) for k, v in ACTIVATION_DEFAULTS[op].items()}
        if op == "Celu" and out["alpha"] == 0:
            raise AicfError(f"node {origin!r}: Celu with alpha=0 divides by zero; ONNX needs alpha != 0")
        return out
    if op == "HardSigmoid":
        return {"alpha": float(at.get("alpha", 0.2)), "beta": float(at.get("beta", 0.5))}
    if op == "Gelu":
        mode = at.get("approximate", b"none")
        mode = mode.decode() if isinstance(mode, bytes) else str(mode)
        if mode not in ("none", "tanh"):
            raise AicfError(f"node {origin!r}: Gelu approximate={mode!r} is not one of 'none', 'tanh'")
        return {"approximate": mode}
    if op == "Mod":
        fmod = int(at.get("fmod", 0))
        if fmod not in (0, 1):
            raise AicfError(f"node {origin!r}: Mod fmod={fmod} is not 0 or 1")
        floats = any(types[x].dtype in ("f32", "f16", "f64") for x in args)
        if floats and not fmod and opset < FLOOR_MOD_OPSET:
            raise AicfError(f"node {origin!r}: Mod with fmod=0 on floats is undefined before opset "
                            f"{FLOOR_MOD_OPSET} (the model declares {opset}); set fmod=1 or re-export with opset "
                            f"{FLOOR_MOD_OPSET}")
        return {"fmod": fmod}
    if op == "Trilu":
        k = 0
        if len(args) > 1:
            if args[1] not in weights:
                raise AicfError(f"node {origin!r}: Trilu's k is computed at run time; only a constant k is supported")
            value = weights[args[1]].array().reshape(-1)
            if value.size != 1:
                raise AicfError(f"node {origin!r}: Trilu's k has {value.size} elements, not one")
            k = int(value[0])
        return {"k": k, "upper": int(at.get("upper", 1))}
    raise AssertionError(op)
