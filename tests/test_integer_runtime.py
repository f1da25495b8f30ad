"""Integer arithmetic at run time ([Note: Integer computes], issue 18): RoBERTa's position ids
(`create_position_ids_from_input_ids`: Equal / Not / Cast / CumSum / Mul / Add on the token ids)
and integer masks compute in int64, exactly, in the interpreter and in the kernel: values far
above 2**24 (where float32 stops being exact) come out equal to numpy's. Integer Div truncates
toward zero, Mod fmod=1 takes the dividend's sign and fmod=0 the divisor's (ONNX); a zero divisor,
which ONNX leaves undefined, gives 0 everywhere.
"""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import aicfc
from aicfc.ir.lowered import Compute, is_integer_compute
from tests.conftest import run_payload
from tests.test_pipeline import evaluate_ir, stages

BIG = 1 << 40   # far beyond float32's exact integers (2**24) and int32


def position_ids_model(pad: int = 1, dtype: int = TensorProto.INT64) -> onnx.ModelProto:
    """ids -> (cumsum(ids != pad) * (ids != pad) + pad) + offset, as RoBERTa's TorchScript export
    spells it (the mask cast to int32, the sum back to int64), plus a run-time int64 offset."""
    c = [numpy_helper.from_array(np.array(pad, np.int64), "pad"), numpy_helper.from_array(np.array(1, np.int64), "axis")]
    nodes = [helper.make_node("Equal", ["ids", "pad"], ["is_pad"]),
             helper.make_node("Not", ["is_pad"], ["keep"]),
             helper.make_node("Cast", ["keep"], ["mask"], to=TensorProto.INT32),
             helper.make_node("CumSum", ["mask", "axis"], ["count"]),
             helper.make_node("Mul", ["count", "mask"], ["kept"]),
             helper.make_node("Cast", ["kept"], ["kept64"], to=TensorProto.INT64),
             helper.make_node("Add", ["kept64", "pad"], ["pos"]),
             helper.make_node("Add", ["pos", "offset"], ["y"])]
    g = helper.make_graph(nodes, "position_ids",
                          [helper.make_tensor_value_info("ids", TensorProto.INT64, [2, 9]),
                           helper.make_tensor_value_info("offset", TensorProto.INT64, [2, 1])],
                          [helper.make_tensor_value_info("y", TensorProto.INT64, [2, 9])], c)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def reference(ids: np.ndarray, offset: np.ndarray, pad: int = 1) -> np.ndarray:
    keep = (ids != pad).astype(np.int64)
    return np.cumsum(keep, axis=1) * keep + pad + offset


def feeds(seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, 4, (2, 9)).astype(np.int64)   # pads (1) among the tokens
    return {"ids": ids, "offset": rng.integers(BIG, 2 * BIG, (2, 1)).astype(np.int64)}


def test_position_ids_exact_through_every_stage():
    model = position_ids_model()
    inputs = feeds(0)
    ref = reference(**inputs)
    for name, ir in stages(model).items():
        got = evaluate_ir(ir, inputs)["y"]
        assert got.dtype == np.int64 and np.array_equal(got, ref), name


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_position_id_kernels_compute_in_int64(precision):
    """Each kernel's C source: int64 statements, no float on the way (fp16 changes nothing)."""
    payload = aicfc.compile(position_ids_model(), precision=precision)
    source = "\n".join(m["source"] for m in payload["modules"])
    for k in payload["kernels"]:
        start = source.index(f"void __launch_bounds__({k['block'][0]}) {k['name']}(")
        body = source[start:source.index("\n}\n", start)]
        assert "long long v" in body or "long long acc" in body, k["name"]
        assert "float" not in body, k["name"]
    assert [k["family"] for k in payload["kernels"]] == ["pointwise", "window"]


def test_integer_arithmetic_is_not_inlined_into_a_float_body():
    """count * 2**40 converted to float afterwards: the product stays an integer compute stored
    on its own (inlined, the float body would round it)."""
    g = helper.make_graph([helper.make_node("Mul", ["a", "big"], ["p"]),
                           helper.make_node("Add", ["p", "a"], ["q"]),
                           helper.make_node("Cast", ["q"], ["y"], to=TensorProto.FLOAT)], "g",
                          [helper.make_tensor_value_info("a", TensorProto.INT64, [8])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [8])],
                          [numpy_helper.from_array(np.array(BIG + 1, np.int64), "big")])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    a = np.arange(3, 11, dtype=np.int64)
    plan = stages(model)["plan_memory"]
    types = plan.types()
    computes = [op for k in plan.kernels for op in k.ops if isinstance(op, Compute)]
    assert any(is_integer_compute(op.type.dtype, op.body, types) for op in computes)
    got = evaluate_ir(plan, {"a": a})["y"]
    assert np.array_equal(got, (a * (BIG + 1) + a).astype(np.float32))
    declined = [r for r in plan.rewrites if not r.applied and "integer compute" in r.reason]
    assert declined


def test_float_to_integer_conversion_is_not_inlined_into_an_integer_body():
    """Cast(float -> int64) truncates at its store; the integer Add after it must read the
    truncated value."""
    g = helper.make_graph([helper.make_node("Cast", ["x"], ["i"], to=TensorProto.INT64),
                           helper.make_node("Add", ["i", "i"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [6])],
                          [helper.make_tensor_value_info("y", TensorProto.INT64, [6])])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    x = np.array([0.5, 1.5, -1.5, 2.75, -0.25, 7.9], np.float32)
    for name, ir in stages(model).items():
        assert np.array_equal(evaluate_ir(ir, {"x": x})["y"], 2 * x.astype(np.int64)), name


def test_integer_cumsum_min_where_compare_exactly():
    """The integer forms of the ops a T5 bucket or a mask uses, on values above 2**24."""
    rng = np.random.default_rng(3)
    a = rng.integers(-BIG, BIG, (3, 5)).astype(np.int64)
    b = rng.integers(-BIG, BIG, (3, 5)).astype(np.int64)
    nodes = [helper.make_node("Min", ["a", "b"], ["m"]), helper.make_node("Abs", ["m"], ["am"]),
             helper.make_node("Less", ["a", "b"], ["lt"]), helper.make_node("Neg", ["b"], ["nb"]),
             helper.make_node("Where", ["lt", "am", "nb"], ["w"]),
             helper.make_node("CumSum", ["w", "axis"], ["y"], exclusive=1)]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(n, TensorProto.INT64, [3, 5]) for n in "ab"],
                          [helper.make_tensor_value_info("y", TensorProto.INT64, [3, 5])],
                          [numpy_helper.from_array(np.array(1, np.int64), "axis")])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    w = np.where(a < b, np.abs(np.minimum(a, b)), -b)
    ref = np.concatenate([np.zeros((3, 1), np.int64), np.cumsum(w, axis=1)[:, :-1]], axis=1)
    for name, ir in stages(model).items():
        assert np.array_equal(evaluate_ir(ir, {"a": a, "b": b})["y"], ref), name
    assert aicfc.compile(model)["kernels"]


@pytest.mark.gpu
@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_gpu_position_ids_exact(precision, gpu_device):
    model = position_ids_model()
    inputs = feeds(1)
    got = run_payload(aicfc.compile(model, target=gpu_device.arch, precision=precision), inputs, gpu_device)["y"]
    assert np.array_equal(got, reference(**inputs))


def division_model(divisor_constant: bool = False) -> onnx.ModelProto:
    """q = a / b (Div), r = Mod(a, b, fmod=1), f = Mod(a, b, fmod=0), int64, b at run time (or a
    constant), the three summed with weights so one output checks all: y = q * 1000003 + r * 7 + f."""
    c = [numpy_helper.from_array(np.array(1000003, np.int64), "k1"), numpy_helper.from_array(np.array(7, np.int64), "k2")]
    if divisor_constant:
        c.append(numpy_helper.from_array(np.array([[-7, 3, 1, -1, 5]], np.int64), "b"))
    nodes = [helper.make_node("Div", ["a", "b"], ["q"]), helper.make_node("Mod", ["a", "b"], ["r"], fmod=1),
             helper.make_node("Mod", ["a", "b"], ["f"], fmod=0), helper.make_node("Mul", ["q", "k1"], ["q1"]),
             helper.make_node("Mul", ["r", "k2"], ["r1"]), helper.make_node("Add", ["q1", "r1"], ["s"]),
             helper.make_node("Add", ["s", "f"], ["y"])]
    ins = [helper.make_tensor_value_info("a", TensorProto.INT64, [4, 5])]
    if not divisor_constant:
        ins.append(helper.make_tensor_value_info("b", TensorProto.INT64, [4, 5]))
    g = helper.make_graph(nodes, "division", ins, [helper.make_tensor_value_info("y", TensorProto.INT64, [4, 5])], c)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def division_reference(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Python's integers (exact): truncated quotient, C remainder, floored remainder; 0 for b = 0."""
    out = np.zeros(np.broadcast(a, b).shape, np.int64)
    for i in np.ndindex(out.shape):
        x, y = int(a[i]), int(np.broadcast_to(b, out.shape)[i])
        if y == 0:
            continue
        q = abs(x) // abs(y) * (1 if (x < 0) == (y < 0) else -1)
        r = x - q * y
        f = r + y if r != 0 and (r < 0) != (y < 0) else r
        out[i] = q * 1000003 + r * 7 + f
    return out


def division_feeds(seed: int) -> dict[str, np.ndarray]:
    """Every sign pair, values above 2**24, and zero divisors."""
    rng = np.random.default_rng(seed)
    a = rng.integers(-BIG, BIG, (4, 5)).astype(np.int64)
    a[0] = [7, -7, 7, -7, 0]
    b = rng.integers(-1000, 1000, (4, 5)).astype(np.int64)
    b[0] = [2, 2, -2, -2, 3]
    b[1, :2] = 0
    return {"a": a, "b": b}


@pytest.mark.parametrize("divisor_constant", [False, True])
def test_integer_div_and_mod_exact_through_every_stage(divisor_constant):
    model = division_model(divisor_constant)
    inputs = division_feeds(4)
    b = np.array([[-7, 3, 1, -1, 5]], np.int64) if divisor_constant else inputs["b"]
    ref = division_reference(inputs["a"], b)
    feed = {"a": inputs["a"]} if divisor_constant else inputs
    for name, ir in stages(model).items():
        got = evaluate_ir(ir, feed)["y"]
        assert got.dtype == np.int64 and np.array_equal(got, ref), name
    plan = stages(model)["plan_memory"]
    types = plan.types()
    assert all(is_integer_compute(op.type.dtype, op.body, types)
               for k in plan.kernels for op in k.ops if isinstance(op, Compute))
    assert aicfc.compile(model)["kernels"]   # nvcc builds aicf_idiv / aicf_ifmod / aicf_imod


@pytest.mark.gpu
@pytest.mark.parametrize("divisor_constant", [False, True])
def test_gpu_integer_div_and_mod_exact(divisor_constant, gpu_device):
    model = division_model(divisor_constant)
    inputs = division_feeds(5)
    b = np.array([[-7, 3, 1, -1, 5]], np.int64) if divisor_constant else inputs["b"]
    feed = {"a": inputs["a"]} if divisor_constant else inputs
    got = run_payload(aicfc.compile(model, target=gpu_device.arch), feed, gpu_device)["y"]
    assert np.array_equal(got, division_reference(inputs["a"], b))
