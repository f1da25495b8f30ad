"""exp and erf under fp16 and bf16: the approximations of templates/math.cuh.j2.

The policy (passes/apply_precision.py) lets 16-bit plans use an ex2.approx exponential and an
Abramowitz-Stegun erf because their errors sit far below the storage rounding. On the GPU each
result must be the correctly rounded 16-bit value of the float64 function of the (16-bit
rounded) input, or its neighbour when the exact value lies within the approximation's error of
a rounding boundary: at most one unit in the last place, element by element, over a dense grid
with tiny, huge, infinite and NaN inputs.
"""
from __future__ import annotations

import math

import numpy as np
import pytest

import aicfc
from aicfc.codegen.module import render_module
from tests import onnx_builders as B
from tests.conftest import run_payload
from tests.test_pipeline import stages

FUNCTIONS = {
    "Exp": np.exp,
    "Erf": np.vectorize(math.erf, otypes=[np.float64]),
    "Sigmoid": lambda x: 1.0 / (1.0 + np.exp(-x)),
}
SPECIAL = [0.0, -0.0, 1e-8, -1e-8, 1e-5, -3e-4, 0.0624, 0.0626, -0.0625, 1e-30, np.inf, -np.inf, np.nan]


def _grid() -> np.ndarray:
    x = np.concatenate([np.linspace(-10.0, 10.0, 40001), np.geomspace(1e-7, 10.0, 4001) * -1,
                        np.geomspace(1e-7, 10.0, 4001), SPECIAL])
    return x.astype(np.float32)[None, :]


def _round(x: np.ndarray, precision: str) -> np.ndarray:
    """Round float64 values to fp16 or bf16 (nearest even), back as float64."""
    if precision == "fp16":
        return x.astype(np.float16).astype(np.float64)
    bits = x.astype(np.float32).view(np.uint32).astype(np.uint64)
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    out = bits.astype(np.uint32).view(np.float32).astype(np.float64)
    return np.where(np.isnan(x), np.nan, out)


def _ulp(r: np.ndarray, precision: str) -> np.ndarray:
    """The spacing of 16-bit values at r (the subnormal spacing near zero)."""
    mantissa, min_exp = (10, -14) if precision == "fp16" else (7, -126)
    exp = np.floor(np.log2(np.maximum(np.abs(r), 2.0 ** min_exp)))
    return 2.0 ** (exp - mantissa)


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_policy_records_and_renders_the_approximations(precision):
    plan = stages(B.single_op_model("Erf", [(4, 64)]), precision)["plan_memory"]
    assert [r.rule for r in plan.rewrites if r.rule.startswith("exp, erf")] == ["exp, erf => approximate"]
    source = render_module(plan)
    assert "ex2.approx" in source and "aicf_erf(" in source


def test_fp32_keeps_libm():
    plan = stages(B.single_op_model("Erf", [(4, 64)]), "fp32")["plan_memory"]
    assert not [r for r in plan.rewrites if r.rule.startswith("exp, erf")]
    source = render_module(plan)
    assert "erff(x)" in source and "ex2.approx" not in source


@pytest.mark.gpu
@pytest.mark.parametrize("precision", ["fp16", "bf16"])
@pytest.mark.parametrize("op", sorted(FUNCTIONS))
def test_within_one_unit_of_the_rounded_function(op, precision, gpu_device):
    x = _grid()
    model = B.single_op_model(op, [x.shape])
    payload = aicfc.compile(model, target=gpu_device.arch, precision=precision)
    got = run_payload(payload, {"in0": x}, gpu_device)["out"].astype(np.float64)
    x16 = _round(x.astype(np.float64), precision)
    with np.errstate(over="ignore", invalid="ignore"):
        exact = FUNCTIONS[op](x16)
    ref = _round(exact, precision)
    assert np.array_equal(np.isnan(got), np.isnan(ref)), "NaN where the function has none, or none where it has"
    ok = ~np.isnan(ref)
    inf = np.isinf(ref) & ok
    assert np.array_equal(got[inf], ref[inf])
    fin = ok & ~inf
    units = np.abs(got[fin] - ref[fin]) / _ulp(ref[fin], precision)
    worst = int(np.argmax(units))
    assert units.max() <= 1.0, (f"{op} {precision}: {units.max():.2f} units off at x = {x16[fin][worst]!r} "
                                f"(got {got[fin][worst]!r}, rounded exact {ref[fin][worst]!r})")
    assert (units == 0).mean() >= 0.99   # nearly every element is the correctly rounded value
