"""High IR rows of the element-wise ops of current exports (issue 18): MobileNetV3's HardSigmoid
and HardSwish, Mish, Softplus, the opset-20 Gelu, Abs, Floor, Ceil, Round, Mod, Mean, Trilu; and
the activations of YOLO, GAN, face and self-normalizing models (LeakyRelu, PRelu, Elu, Selu,
Celu, ThresholdedRelu, Softsign, Shrink, opset 24's Swish) with ONNX's trigonometric and hyperbolic functions.

`aicfc.ir.ops` appends these rows to its table (import it, not this module, first). The
importer (frontend/onnx_elementwise.py) has normalized the attributes: HardSigmoid's `alpha`
and `beta`, Gelu's `approximate` ("none" or "tanh"), Mod's `fmod` (0 or 1), Trilu's `upper`
and its constant `k`. The numpy meanings below follow the ONNX specification and are the
reference the lowered programs are checked against; they compute in the input's dtype, so a
float64 input gives a float64 reference.
"""
from __future__ import annotations

import numpy as np

from aicfc.ir.ops import (Attrs, OpDef, OpTypeError, TensorType, _infer_any_binary, _infer_unary, _infer_variadic,
                          erf, sigmoid)

SQRT_2_OVER_PI = 0.7978845608028654   # Gelu's tanh form: sqrt(2/pi)
GELU_CUBIC = 0.044715


def softplus(x: np.ndarray) -> np.ndarray:
    """log(1 + exp(x)) without overflow: max(x, 0) + log1p(exp(-|x|))."""
    return np.logaddexp(np.zeros((), x.dtype), x).astype(x.dtype)


def hard_sigmoid(x: np.ndarray, alpha: float, beta: float) -> np.ndarray:
    t = x.dtype.type
    return np.maximum(np.minimum(t(alpha) * x + t(beta), t(1)), t(0)).astype(x.dtype)


def gelu(x: np.ndarray, approximate: str) -> np.ndarray:
    t = x.dtype.type
    if approximate == "tanh":
        inner = t(SQRT_2_OVER_PI) * (x + t(GELU_CUBIC) * x * x * x)
        return (t(0.5) * x * (t(1) + np.tanh(inner))).astype(x.dtype)
    return (t(0.5) * x * (t(1) + erf(x / t(np.sqrt(2.0))))).astype(x.dtype)


def truncated_div(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """ONNX Div on integers: the quotient truncated toward zero; a zero divisor (undefined in
    ONNX) gives 0, as the kernels' aicf_idiv does."""
    a, b = np.asarray(a), np.asarray(b)
    safe = np.where(b == 0, 1, b)
    q = np.abs(a) // np.abs(safe)
    return np.where(b == 0, 0, np.where((a < 0) != (safe < 0), -q, q)).astype(np.result_type(a, b))


def floored_mod(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """ONNX Mod with fmod=0 (opset 28): a - floor(a / b)·b, the sign of b. For floats the
    truncated remainder is moved into b's sign by adding b; a zero takes b's sign; x = ±inf or
    b = 0 give NaN (fmod does), b = ±inf with x of the other sign gives b."""
    if a.dtype.kind in "iu" and b.dtype.kind in "iu":   # a zero divisor gives 0 (aicf_imod)
        return np.where(b == 0, 0, np.mod(a, np.where(b == 0, 1, b))).astype(np.result_type(a, b))
    with np.errstate(invalid="ignore", divide="ignore"):
        r = np.fmod(a, b)
        r = np.where((r != 0) & ((r < 0) != (b < 0)), r + b, r)
        return np.where(r == 0, np.copysign(np.zeros_like(r), b), r).astype(np.result_type(a, b))


def _mod(x: list[np.ndarray], at: Attrs) -> np.ndarray:
    a, b = x
    if at["fmod"] and a.dtype.kind in "iu" and b.dtype.kind in "iu":   # a zero divisor gives 0 (aicf_ifmod)
        return np.where(b == 0, 0, np.fmod(a, np.where(b == 0, 1, b))).astype(np.result_type(a, b))
    if at["fmod"]:
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.fmod(a, b)
    return floored_mod(a, b)


def _infer_trilu(t: list[TensorType], at: Attrs) -> TensorType:
    if len(t[0].shape) < 2:
        raise OpTypeError(f"Trilu needs a rank >= 2 input, got rank {len(t[0].shape)}")
    return t[0]


def _trilu(x: list[np.ndarray], at: Attrs) -> np.ndarray:
    return (np.triu if at["upper"] else np.tril)(x[0], at["k"])


ELEMENTWISE_OPS = [
    OpDef("HardSigmoid", (1, 1), _infer_unary, lambda x, at: hard_sigmoid(x[0], at["alpha"], at["beta"]),
          ("alpha", "beta")),
    OpDef("HardSwish", (1, 1), _infer_unary, lambda x, _: (x[0] * hard_sigmoid(x[0], 1 / 6, 0.5)).astype(x[0].dtype)),
    OpDef("Softplus", (1, 1), _infer_unary, lambda x, _: softplus(x[0])),
    OpDef("Mish", (1, 1), _infer_unary, lambda x, _: (x[0] * np.tanh(softplus(x[0]))).astype(x[0].dtype)),
    OpDef("Gelu", (1, 1), _infer_unary, lambda x, at: gelu(x[0], at["approximate"]), ("approximate",)),
    OpDef("Abs", (1, 1), _infer_unary, lambda x, _: np.abs(x[0])),
    OpDef("Floor", (1, 1), _infer_unary, lambda x, _: np.floor(x[0])),
    OpDef("Ceil", (1, 1), _infer_unary, lambda x, _: np.ceil(x[0])),
    # numpy's round is half to even, as ONNX says.
    OpDef("Round", (1, 1), _infer_unary, lambda x, _: np.round(x[0])),
    # Integers too, on constants (folded): shape arithmetic.
    OpDef("Mod", (2, 2), _infer_any_binary, _mod, ("fmod",)),
    OpDef("Mean", (1, 1 << 16), _infer_variadic,
          lambda x, _: (np.asarray(sum(x[1:], x[0])) / x[0].dtype.type(len(x))).astype(x[0].dtype)),
    OpDef("Trilu", (1, 1), _infer_trilu, _trilu, ("k", "upper")),
]


def _infer_prelu(t: list[TensorType], at: Attrs) -> TensorType:
    """PRelu's slope broadcasts to x one way (ONNX's unidirectional broadcasting): y has x's shape."""
    out = _infer_any_binary(t, at)
    if out.shape != t[0].shape:
        raise OpTypeError(f"PRelu slope {list(t[1].shape)} does not broadcast to x {list(t[0].shape)}")
    return _infer_unary(t, at)


def _where_negative(x: np.ndarray, negative: np.ndarray, positive: np.ndarray, strict: bool = True) -> np.ndarray:
    """`negative` where x < 0 (x <= 0 unless strict), else `positive`; NaN takes `positive`."""
    return np.where(x < 0 if strict else x <= 0, negative, positive).astype(x.dtype)


def _elu(x: np.ndarray, alpha: float) -> np.ndarray:
    t = x.dtype.type
    with np.errstate(over="ignore"):
        return _where_negative(x, t(alpha) * np.expm1(np.minimum(x, t(0))), x)


def _selu(x: np.ndarray, alpha: float, gamma: float) -> np.ndarray:
    t = x.dtype.type
    return _where_negative(x, t(gamma) * (t(alpha) * np.expm1(np.minimum(x, t(0)))), t(gamma) * x, strict=False)


def _celu(x: np.ndarray, alpha: float) -> np.ndarray:
    t = x.dtype.type
    neg = t(alpha) * np.expm1(np.minimum(x, t(0)) / t(alpha))
    return (np.maximum(x, t(0)) + np.minimum(t(0), neg)).astype(x.dtype)


def _shrink(x: np.ndarray, bias: float, lambd: float) -> np.ndarray:
    t = x.dtype.type
    return np.where(x < -t(lambd), x + t(bias), np.where(x > t(lambd), x - t(bias), t(0))).astype(x.dtype)


def _unary(fn):
    def evaluate(x: list[np.ndarray], _: Attrs) -> np.ndarray:
        with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
            return fn(x[0]).astype(x[0].dtype)
    return evaluate


ACTIVATION_OPS = [
    OpDef("LeakyRelu", (1, 1), _infer_unary,
          lambda x, at: _where_negative(x[0], x[0].dtype.type(at["alpha"]) * x[0], x[0]), ("alpha",)),
    OpDef("PRelu", (2, 2), _infer_prelu, lambda x, _: _where_negative(x[0], x[0] * x[1].astype(x[0].dtype), x[0])),
    OpDef("Elu", (1, 1), _infer_unary, lambda x, at: _elu(x[0], at["alpha"]), ("alpha",)),
    OpDef("Selu", (1, 1), _infer_unary, lambda x, at: _selu(x[0], at["alpha"], at["gamma"]), ("alpha", "gamma")),
    OpDef("Celu", (1, 1), _infer_unary, lambda x, at: _celu(x[0], at["alpha"]), ("alpha",)),
    OpDef("ThresholdedRelu", (1, 1), _infer_unary,
          lambda x, at: np.where(x[0] > x[0].dtype.type(at["alpha"]), x[0], x[0].dtype.type(0)), ("alpha",)),
    OpDef("Softsign", (1, 1), _infer_unary, lambda x, _: (x[0] / (x[0].dtype.type(1) + np.abs(x[0]))).astype(x[0].dtype)),
    OpDef("Shrink", (1, 1), _infer_unary, lambda x, at: _shrink(x[0], at["bias"], at["lambd"]), ("bias", "lambd")),
    # opset 24: x·sigmoid(alpha·x)
    OpDef("Swish", (1, 1), _infer_unary, lambda x, at: (x[0] * sigmoid(x[0].dtype.type(at["alpha"]) * x[0])).astype(
        x[0].dtype), ("alpha",)),
]
# ONNX's float functions of one argument, numpy's meaning (NaN outside the domain)
TRIG = {"Tan": np.tan, "Asin": np.arcsin, "Acos": np.arccos, "Atan": np.arctan, "Sinh": np.sinh, "Cosh": np.cosh,
        "Asinh": np.arcsinh, "Acosh": np.arccosh, "Atanh": np.arctanh}
ACTIVATION_OPS += [OpDef(op, (1, 1), _infer_unary, _unary(fn)) for op, fn in TRIG.items()]
