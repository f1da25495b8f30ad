"""The activations of YOLO, GAN, face and self-normalizing models (LeakyRelu, PRelu, Elu, Selu,
Celu, ThresholdedRelu, Softsign, Shrink), ONNX's trigonometric and hyperbolic functions,
LogSoftmax, GlobalMaxPool, the reductions ReduceSumSquare, ReduceL1, ReduceLogSum and
ReduceLogSumExp, and the rewritten Upsample, LpNormalization, GlobalLpPool, Size, Hardmax and OneHot against onnxruntime on fresh random inputs (never zeros): every stage's
interpreter at float32, the lowered program in float64, the fp16 plan with its stores rounded
to fp16, and each op's CUDA built by nvcc at fp32 and fp16 (tests/test_elementwise_ops.py's
checks). Inputs sit at and next to each op's kinks, inside each function's domain; LogSoftmax
and ReduceLogSumExp get spreads where exp overflows or a softmax underflows. The activations
are absorbed as GEMM and convolution epilogues (one kernel), and bad attributes fail in one line.
"""
from __future__ import annotations

import math
import shutil

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from aicfc.errors import AicfError
from aicfc.frontend.onnx_import import import_model
from aicfc.ir.interp import evaluate_program
from tests import onnx_builders as B
from tests.test_elementwise_ops import (SHAPE, _normal, check_epilogue, check_every_stage, check_fp16_plan,
                                        check_nvcc_builds, conv_act_model, evaluate_plan_stored, matmul_act_model,
                                        model_of, near_kinks)
from tests.test_pipeline import FP32_RTOL, rel_err, stages

IMAGE = (2, 16, 7, 9)


def _uniform(lo: float, hi: float, shape=SHAPE):
    return lambda r: {"in0": r.uniform(lo, hi, shape).astype(np.float32)}


def _kinks(*kinks: float, shape=SHAPE):
    return lambda r: {"in0": near_kinks(r, shape, list(kinks))}


def _reduce(op: str, axes: list[int], keepdims: int, shape=SHAPE):
    return lambda: model_of(op, [shape], {"keepdims": keepdims}, opset=18,
                            inits={"axes": np.array(axes, np.int64)})


CASES = [
    ("LeakyRelu", lambda: model_of("LeakyRelu", [SHAPE]), _kinks(0.0)),
    ("LeakyRelu_alpha", lambda: model_of("LeakyRelu", [SHAPE], {"alpha": 0.2}), _kinks(0.0)),
    ("PRelu_channel", lambda: model_of("PRelu", [SHAPE], inits={"slope": np.linspace(-0.5, 0.5, 37, dtype=np.float32)
                                                                .reshape(37, 1)}), _kinks(0.0)),
    ("PRelu_run_time", lambda: model_of("PRelu", [SHAPE, SHAPE[-1:]]),
     lambda r: {"in0": near_kinks(r, SHAPE, [0.0]), "in1": r.uniform(-1, 1, SHAPE[-1:]).astype(np.float32)}),
    ("Elu", lambda: model_of("Elu", [SHAPE]), _kinks(0.0)),
    ("Elu_alpha", lambda: model_of("Elu", [SHAPE], {"alpha": 0.5}), _kinks(0.0)),
    ("Selu", lambda: model_of("Selu", [SHAPE]), _kinks(0.0)),
    ("Selu_alpha_gamma", lambda: model_of("Selu", [SHAPE], {"alpha": 2.0, "gamma": 0.5}), _kinks(0.0)),
    ("Celu", lambda: model_of("Celu", [SHAPE], {"alpha": 2.0}), _kinks(0.0)),
    ("ThresholdedRelu", lambda: model_of("ThresholdedRelu", [SHAPE], {"alpha": 0.7}), _kinks(0.7)),
    ("Softsign", lambda: model_of("Softsign", [SHAPE]), lambda r: {"in0": 4 * _normal(r, SHAPE)}),
    ("Shrink", lambda: model_of("Shrink", [SHAPE], {"bias": 0.3, "lambd": 0.8}), _kinks(-0.8, 0.8)),
    ("Shrink_default", lambda: model_of("Shrink", [SHAPE]), _kinks(-0.5, 0.5)),
    ("Swish", lambda: model_of("Swish", [SHAPE], opset=24), lambda r: {"in0": 4 * _normal(r, SHAPE)}),
    ("Swish_alpha", lambda: model_of("Swish", [SHAPE], {"alpha": 1.702}, opset=24), lambda r: {"in0": 4 * _normal(r, SHAPE)}),
    ("Tan", lambda: model_of("Tan", [SHAPE]), _uniform(-1.4, 1.4)),
    ("Asin", lambda: model_of("Asin", [SHAPE]), _uniform(-0.999, 0.999)),
    ("Acos", lambda: model_of("Acos", [SHAPE]), _uniform(-0.999, 0.999)),
    ("Atan", lambda: model_of("Atan", [SHAPE]), lambda r: {"in0": 5 * _normal(r, SHAPE)}),
    ("Sinh", lambda: model_of("Sinh", [SHAPE]), _uniform(-8.0, 8.0)),
    ("Cosh", lambda: model_of("Cosh", [SHAPE]), _uniform(-8.0, 8.0)),
    ("Asinh", lambda: model_of("Asinh", [SHAPE]), lambda r: {"in0": 10 * _normal(r, SHAPE)}),
    ("Acosh", lambda: model_of("Acosh", [SHAPE]), _uniform(1.0, 50.0)),
    ("Atanh", lambda: model_of("Atanh", [SHAPE]), _uniform(-0.99, 0.99)),
    # a spread of 30: exp(x - max) underflows to 0 for most of a row, where log(Softmax) would be -inf
    ("LogSoftmax_last", lambda: model_of("LogSoftmax", [SHAPE]), lambda r: {"in0": 12 * _normal(r, SHAPE)}),
    ("LogSoftmax_axis1", lambda: model_of("LogSoftmax", [SHAPE], {"axis": 1}), lambda r: {"in0": 12 * _normal(r, SHAPE)}),
    ("GlobalMaxPool", lambda: model_of("GlobalMaxPool", [IMAGE]), lambda r: {"in0": _normal(r, IMAGE)}),
    ("ReduceSumSquare", _reduce("ReduceSumSquare", [2], 1), lambda r: {"in0": _normal(r, SHAPE)}),
    ("ReduceSumSquare_0", _reduce("ReduceSumSquare", [1], 0), lambda r: {"in0": _normal(r, SHAPE)}),
    ("ReduceL1", _reduce("ReduceL1", [1], 1), lambda r: {"in0": _normal(r, SHAPE)}),
    ("ReduceL1_run", _reduce("ReduceL1", [1, 2], 0), lambda r: {"in0": _normal(r, SHAPE)}),
    ("ReduceLogSum", _reduce("ReduceLogSum", [2], 0), _uniform(0.01, 3.0)),
    # a spread of 60: exp(x) overflows float32 past 88.7, the maximum-shifted form does not
    ("ReduceLogSumExp", _reduce("ReduceLogSumExp", [2], 1), lambda r: {"in0": 25 * _normal(r, SHAPE)}),
    ("ReduceLogSumExp_0", _reduce("ReduceLogSumExp", [0], 0), lambda r: {"in0": 25 * _normal(r, SHAPE)}),
]


def size_model() -> onnx.ModelProto:
    """in0 flattened by Reshape to [Size(in0)], then doubled: Size folds to a constant at import."""
    nodes = [helper.make_node("Size", ["in0"], ["n"], name="size_0"),
             helper.make_node("Unsqueeze", ["n", "zero"], ["shape"], name="unsqueeze_0"),
             helper.make_node("Reshape", ["in0", "shape"], ["flat"], name="reshape_0"),
             helper.make_node("Add", ["flat", "flat"], ["out"], name="add_0")]
    graph = helper.make_graph(nodes, "size", [helper.make_tensor_value_info("in0", TensorProto.FLOAT, list(IMAGE))],
                              [helper.make_tensor_value_info("out", TensorProto.FLOAT, [math.prod(IMAGE)])],
                              [onnx.numpy_helper.from_array(np.array([0], np.int64), "zero")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 22)])


# ops an importer rewrite states with others: Upsample as Resize (opset 10's meaning), LpNormalization as
# ReduceL1/L2 and Div, GlobalLpPool as ReduceL1/L2 over the merged spatial axes (at opset 11: onnxruntime has no
# later version of it); Size folded
CASES += [
    ("Upsample9_nearest", lambda: model_of("Upsample", [IMAGE], {"mode": "nearest"}, opset=9,
                                           inits={"scales": np.array([1, 1, 2, 3], np.float32)}),
     lambda r: {"in0": _normal(r, IMAGE)}),
    ("Upsample9_linear", lambda: model_of("Upsample", [IMAGE], {"mode": "linear"}, opset=9,
                                          inits={"scales": np.array([1, 1, 2, 2], np.float32)}),
     lambda r: {"in0": _normal(r, IMAGE)}),
    ("Upsample7_attribute", lambda: model_of("Upsample", [IMAGE], {"scales": [1.0, 1.0, 3.0, 2.0]}, opset=7),
     lambda r: {"in0": _normal(r, IMAGE)}),
    ("LpNormalization_l2", lambda: model_of("LpNormalization", [SHAPE]), lambda r: {"in0": _normal(r, SHAPE)}),
    ("LpNormalization_l1_axis1", lambda: model_of("LpNormalization", [SHAPE], {"axis": 1, "p": 1}),
     lambda r: {"in0": _normal(r, SHAPE)}),
    ("GlobalLpPool_l2", lambda: model_of("GlobalLpPool", [IMAGE], opset=11), lambda r: {"in0": _normal(r, IMAGE)}),
    ("GlobalLpPool_l1", lambda: model_of("GlobalLpPool", [IMAGE], {"p": 1}, opset=11), lambda r: {"in0": _normal(r, IMAGE)}),
    ("Size", size_model, lambda r: {"in0": _normal(r, IMAGE)}),
    # small integers: many ties, which go to the first maximum
    ("Hardmax", lambda: model_of("Hardmax", [SHAPE]), lambda r: {"in0": r.integers(0, 4, SHAPE).astype(np.float32)}),
    ("Hardmax_axis1", lambda: model_of("Hardmax", [SHAPE], {"axis": 1}),
     lambda r: {"in0": r.integers(0, 4, SHAPE).astype(np.float32)}),
    # indices past depth either way (all off) and negative ones (counted from the end)
    ("OneHot", lambda: model_of("OneHot", [(3, 37)], dtype=TensorProto.INT64,
                                inits={"depth": np.array(10, np.int64), "values": np.array([-0.5, 2.0], np.float32)}),
     lambda r: {"in0": r.integers(-12, 12, (3, 37)).astype(np.int64)}),
    ("OneHot_axis0", lambda: model_of("OneHot", [(3, 37)], {"axis": 0}, dtype=TensorProto.INT64,
                                      inits={"depth": np.array(5, np.int64), "values": np.array([0, 1], np.float32)}),
     lambda r: {"in0": r.integers(-6, 6, (3, 37)).astype(np.int64)}),
    # float indices are truncated to int64 first
    ("OneHot_float", lambda: model_of("OneHot", [(3, 37)], inits={"depth": np.array(7, np.float32),
                                                                  "values": np.array([1.5, -3.0], np.float32)}),
     lambda r: {"in0": (r.integers(-9, 9, (3, 37)) + r.choice([0.0, 0.25, 0.5, 0.75], (3, 37))).astype(np.float32)}),
]
IDS = [c[0] for c in CASES]


@pytest.mark.parametrize("case_id,make_model,make_inputs", CASES, ids=IDS)
def test_every_stage_and_float64_match_onnxruntime(case_id, make_model, make_inputs):
    check_every_stage(case_id, make_model(), make_inputs(np.random.default_rng()))


@pytest.mark.parametrize("case_id,make_model,make_inputs", CASES, ids=IDS)
def test_fp16_plan_matches_onnxruntime(case_id, make_model, make_inputs):
    check_fp16_plan(case_id, make_model(), make_inputs(np.random.default_rng()))


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
@pytest.mark.parametrize("precision", ["fp32", "fp16"])
@pytest.mark.parametrize("case_id,make_model,make_inputs", CASES, ids=IDS)
def test_nvcc_builds_it(case_id, make_model, make_inputs, precision):
    check_nvcc_builds(make_model(), precision)


def test_log_sum_exp_past_exp_overflow_stays_finite():
    """Values of 100-300: exp overflows float32, the plan's maximum-shifted form (float32, as the GPU) does not."""
    model = _reduce("ReduceLogSumExp", [2], 1)()
    x = {"in0": np.random.default_rng().uniform(100, 300, SHAPE).astype(np.float32)}
    ref = np.log(np.sum(np.exp(x["in0"].astype(np.float64)), axis=2, keepdims=True))
    got = stages(model)["plan_memory"]
    out = evaluate_plan_stored(got, x)["out"]
    assert np.isfinite(out).all() and rel_err(out, ref) <= FP32_RTOL


@pytest.mark.parametrize("op", ["LeakyRelu", "PRelu", "Elu", "Selu", "Celu", "ThresholdedRelu", "Softsign", "Shrink",
                                "Swish"])
def test_nan_and_signed_zero_as_onnxruntime(op):
    """NaN, -0 and both sides of 0: the lowered program (float64) gives what onnxruntime gives, NaN where it does
    (the selects test the sign, so NaN takes the positive side's expression; ThresholdedRelu and Shrink give 0)."""
    x = {"in0": np.array([[np.nan, -1.5, -0.0, 0.0, 0.75, 2.0]], np.float32)}
    model = model_of(op, [(1, 6)], opset=24) if op != "PRelu" else \
        model_of(op, [(1, 6)], inits={"slope": np.full(6, 0.1, np.float32)})
    ref = B.run_onnxruntime(model, x)["out"]
    got = evaluate_program(stages(model)["lower"], x, np.float64)["out"]
    assert np.array_equal(np.isnan(got), np.isnan(ref)), (op, got, ref)
    assert np.allclose(got[~np.isnan(ref)], ref[~np.isnan(ref)], rtol=1e-6, atol=0), (op, got, ref)


# ---------------------------------------------------------------- epilogues

def conv_prelu_model() -> onnx.ModelProto:
    """in0 [2, 8, 14, 14] → Conv 3x3 (16 channels, bias, pad 1) → PRelu with a [16, 1, 1] slope → out."""
    rng = np.random.default_rng()
    w = (rng.standard_normal((16, 8, 3, 3)) / math.sqrt(72)).astype(np.float32)
    b = (0.1 * rng.standard_normal(16)).astype(np.float32)
    slope = rng.uniform(0.05, 0.5, (16, 1, 1)).astype(np.float32)
    nodes = [helper.make_node("Conv", ["in0", "w", "b"], ["c"], name="conv_0", pads=[1, 1, 1, 1]),
             helper.make_node("PRelu", ["c", "slope"], ["out"], name="act_0")]
    graph = helper.make_graph(nodes, "prelu", [helper.make_tensor_value_info("in0", TensorProto.FLOAT, [2, 8, 14, 14])],
                              [helper.make_tensor_value_info("out", TensorProto.FLOAT, [2, 16, 14, 14])],
                              [onnx.numpy_helper.from_array(v, k) for k, v in {"w": w, "b": b, "slope": slope}.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 22)])


EPILOGUES = [("conv", "LeakyRelu", {"alpha": 0.1}), ("conv", "Elu", {}), ("conv", "Selu", {}),
             ("matmul", "LeakyRelu", {}), ("matmul", "Celu", {"alpha": 0.5}), ("matmul", "Softsign", {}),
             ("prelu", "PRelu", {})]


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
@pytest.mark.parametrize("base,act,attrs", EPILOGUES, ids=[f"{b}_{a}" for b, a, _ in EPILOGUES])
def test_activation_is_the_contraction_epilogue(base, act, attrs, precision):
    model = conv_prelu_model() if base == "prelu" else {"conv": conv_act_model, "matmul": matmul_act_model}[base](act, attrs)
    check_epilogue(model, base, precision)


# ---------------------------------------------------------------- refusals

def _unchecked(op: str, shapes: list[tuple[int, ...]], attrs: dict | None = None) -> onnx.ModelProto:
    """One node of `op` over graph inputs in0.., without onnx's shape inference or checker (which would
    refuse some of these before the importer sees them)."""
    names = [f"in{i}" for i in range(len(shapes))]
    node = helper.make_node(op, names, ["out"], name=f"{op.lower()}_0", **(attrs or {}))
    ins = [helper.make_tensor_value_info(n, TensorProto.FLOAT, list(s)) for n, s in zip(names, shapes)]
    graph = helper.make_graph([node], op, ins, [onnx.ValueInfoProto(name="out")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 22)])


REFUSED = [
    (lambda: _unchecked("LpNormalization", [(4, 8)], {"p": 3}), "LpNormalization with p=3 is not supported"),
    (lambda: _unchecked("Celu", [(4, 8)], {"alpha": 0.0}), "Celu with alpha=0 divides by zero"),
    (lambda: _unchecked("PRelu", [(4, 8), (3, 4, 8)]), "does not broadcast to x"),
]


@pytest.mark.parametrize("make,message", REFUSED, ids=[m for _, m in REFUSED])
def test_refused_in_one_line(make, message):
    with pytest.raises(AicfError) as e:
        import_model(make())
    assert message in str(e.value) and "\n" not in str(e.value)
