"""`aicf-run --check`: compare the GPU outputs with onnxruntime on the CPU.

The error measure, per output y against the reference ref (both taken as float64):

    max abs err = max |y - ref|
    max rel err = max |y - ref| / max(max |ref|, 1e-30)

The relative error is normalised by the largest reference magnitude, not element-wise, so
outputs that cross zero are not punished for tiny absolute differences near zero. An output
passes when max rel err <= rtol; a NaN anywhere in y or ref, or a shape mismatch, fails.
Infinities of the same sign in the same place count as equal; max |ref| is taken over the
finite reference values, so an infinity elsewhere cannot hide a real difference.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from aicf_run.errors import RunError

_TINY = 1e-30


@dataclass(frozen=True)
class CheckRow:
    """One output's comparison with the reference."""

    name: str
    max_abs_err: float
    max_rel_err: float
    passed: bool
    note: str = ""


def require_onnxruntime() -> Any:
    """Import onnxruntime or raise RunError saying how to install it."""
    try:
        import onnxruntime
    except ImportError:
        raise RunError("onnxruntime is needed for --check: pip install onnxruntime") from None
    return onnxruntime


def check_against_onnx(model_path: str | os.PathLike, inputs: Mapping[str, np.ndarray],
                       outputs: Mapping[str, np.ndarray], rtol: float) -> list[CheckRow]:
    """Run `model_path` on onnxruntime's CPU provider and compare each of `outputs` with it.

    Returns one CheckRow per output, in the order of `outputs`; see the module docstring for
    the error definitions (max rel err = max|y - ref| / max(max|ref|, 1e-30)).
    """
    ort = require_onnxruntime()
    try:
        session = ort.InferenceSession(os.fspath(model_path), providers=["CPUExecutionProvider"])
        feeds = {item.name: inputs[item.name] for item in session.get_inputs()
                 if item.name in inputs}
        available = [item.name for item in session.get_outputs()]
        missing = [name for name in outputs if name not in available]
        if missing:
            raise RunError(f"{model_path} has no output {missing[0]!r} (it has "
                           f"{', '.join(available)}); pass the model the bundle was compiled from")
        references = session.run(list(outputs), feeds)
    except RunError:
        raise
    # onnxruntime reports a bad model, a missing feed or a failed run through its own
    # exception types (Fail, InvalidArgument, NoSuchFile, ...), which share no useful base.
    except Exception as err:
        detail = " ".join(str(err).split())[:300]
        raise RunError(f"onnxruntime cannot run {model_path} ({detail}); pass the ONNX model "
                       f"the bundle was compiled from") from None
    return [compare(name, outputs[name], ref, rtol) for name, ref in zip(outputs, references)]


def compare(name: str, y: np.ndarray, ref: np.ndarray, rtol: float) -> CheckRow:
    """Compare one output with its reference (definitions in the module docstring)."""
    y = np.asarray(y)
    ref = np.asarray(ref)
    if y.shape != ref.shape:
        return CheckRow(name, float("nan"), float("nan"), False,
                        f"shape {list(y.shape)} but the reference has {list(ref.shape)}")
    y64 = y.astype(np.float64)
    ref64 = ref.astype(np.float64)
    if np.isnan(y64).any() or np.isnan(ref64).any():
        return CheckRow(name, float("nan"), float("nan"), False, "NaN in the output or reference")
    if y64.size == 0:
        return CheckRow(name, 0.0, 0.0, True)
    with np.errstate(invalid="ignore", over="ignore"):
        diff = np.where(y64 == ref64, 0.0, np.abs(y64 - ref64))
        max_abs = float(diff.max())
        finite = np.abs(ref64[np.isfinite(ref64)])
        scale = max(float(finite.max()) if finite.size else 0.0, _TINY)
        max_rel = max_abs / scale
    passed = bool(max_rel <= rtol)  # False for NaN (inf - inf) as well
    return CheckRow(name, max_abs, max_rel, passed)
