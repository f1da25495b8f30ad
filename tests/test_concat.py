"""Concat of run-time tensors (issue 6): one map of guarded loads ([Note: Lowered IR]).

The onnx package's Concat node cases, golden Lowered IR for a 3-way channel concat, the
guard's text form and verifier, the vector code of a guarded load, the interpreter and the GPU
against onnxruntime, and the light CNN models that needed it (SqueezeNet, ShuffleNet here; all of
them in benchmarks/light_models.py). GPU tolerances on max|y - ref| / max|ref|: fp32 1e-4,
fp16 1e-2.
"""
from __future__ import annotations

import shutil

import numpy as np
import onnx
import pytest
from onnx import helper

from aicfc.errors import AicfError
from aicfc.frontend.onnx_import import import_model
from aicfc.ir.decision import Plan
from aicfc.ir.interp import evaluate_program
from aicfc.ir.lowered import Affine, Compute, Load, Program, parse_program, verify_program
from aicfc.ir.types import TensorType, Value
from aicfc.passes.pipeline import PIPELINE, Options
from aicfc.planner.hardware import load_profile
from tests import onnx_builders as B
from tests.test_conv import _compile
from tests.conftest import check_golden
from tests.test_pipeline import rel_err

GPU_RTOL = {"fp32": 1e-4, "fp16": 1e-2}


def concat_model(shapes: list[tuple[int, ...]], axis: int, pre: str | None = None, post: str | None = None,
                 const: int | None = None) -> onnx.ModelProto:
    """y = post(Concat(pre(x0), pre(x1), ...)); input `const` (if given) is an initializer."""
    out = list(shapes[0])
    out[axis % len(out)] = sum(s[axis % len(s)] for s in shapes)
    nodes, inputs, inits, names = [], {}, {}, []
    for k, s in enumerate(shapes):
        if k == const:
            inits[f"x{k}"] = np.random.default_rng(k).standard_normal(s).astype(np.float32)
        else:
            inputs[f"x{k}"] = s
        name = f"x{k}"
        if pre:
            nodes.append(helper.make_node(pre, [name], [f"p{k}"], name=f"pre{k}"))
            name = f"p{k}"
        names.append(name)
    nodes.append(helper.make_node("Concat", names, ["cat" if post else "y"], name="concat", axis=axis))
    if post:
        nodes.append(helper.make_node(post, ["cat"], ["y"], name="post"))
    return B._graph_model(nodes, "concat", inputs, {"y": tuple(out)}, inits)




def _programs(model: onnx.ModelProto) -> list[Program]:
    ir = import_model(model)
    opts = Options("sm_90", load_profile("sm_90"))
    out = []
    for stage in PIPELINE:
        ir = stage.run(ir, opts)
        if isinstance(ir, Program):
            verify_program(ir)
            out.append(ir)
    return out


# ---------------------------------------------------------------- onnx node conformance


def _concat_cases():
    from tests.test_conformance import node_cases
    return [(c.name, c) for c in node_cases() if c.model.graph.node[0].op_type == "Concat"]


def test_onnx_concat_node_cases_pass():
    from tests.test_conformance import run_case
    cases = _concat_cases()
    assert cases
    for name, case in cases:
        verdict, detail = run_case(case)
        assert verdict == "pass", f"{name}: {verdict}: {detail}"


# ---------------------------------------------------------------- Lowered IR


def test_golden_three_way_channel_concat():
    """Relu'd inputs stay stored (read through guarded loads, declined with the reason); the
    concat itself is recomputed inside the Sigmoid that reads it at its own index."""
    model = concat_model([(1, 2, 3, 4), (1, 4, 3, 4), (1, 3, 3, 4)], axis=1, pre="Relu", post="Sigmoid")
    lowered = _compile(model, until="inline_producers")
    final = _compile(model, until="form_kernels")
    check_golden("concat3_lowered.txt", str(lowered))
    check_golden("concat3_inlined.txt", str(final))
    for p in (lowered, final):
        verify_program(p)
        assert parse_program(str(p), {w.name: w.data for w in p.weights}) == p
    declined = [r for r in final.rewrites if not r.applied and "guarded load" in r.reason]
    assert {r.target for r in declined} == {"p0", "p1", "p2"}
    assert [r.target for r in final.rewrites if r.applied] == ["cat"]


def _guarded(guard: tuple[int, ...], fill: float | None = -0.0, index: tuple[Affine, ...] | None = None) -> Program:
    x = Value("x", TensorType("f32", (2, 3)))
    index = index or (Affine.var("i0"), Affine.var("i1"))
    op = Compute("y", TensorType("f32", (2, 5)), "map", (), Load("x", index, fill, guard), ("c",))
    return Program("p", (x,), (), (op,), ("y",))


def test_guard_prints_parses_verifies_and_interprets():
    p = _guarded((1,))
    verify_program(p)
    assert "load(%x, [i0, i1], fill=-0.0, guard=[1])" in str(p)
    assert parse_program(str(p), {}) == p
    x = np.arange(6, dtype=np.float32).reshape(2, 3) + 1
    y = evaluate_program(p, {"x": x})["y"]
    assert np.array_equal(y, np.concatenate([x, np.zeros((2, 2), np.float32)], axis=1))
    assert np.signbit(y[:, 3:]).all()   # the fill is -0.0, the identity of +


@pytest.mark.parametrize("bad, message", [
    (lambda: _guarded(()), "outside 0..2"),                 # unguarded plain variable past the end
    (lambda: _guarded((1,), fill=None), "guard"),           # a guard without a fill
    (lambda: _guarded((1, 0)), "guard"),                    # not sorted
    (lambda: _guarded((1,), index=(Affine.var("i0"), Affine.of({"i1": 1}, -1))), "guard"),   # already computed
    (lambda: _guarded((), index=(Affine.var("i0"), Affine.of({"i1": 1}, -9))), "never inside"),
])
def test_verifier_rejects_bad_guards(bad, message):
    with pytest.raises(AicfError, match=message):
        verify_program(bad())


def test_reindex_keeps_every_guard():
    """Substituting a computed guarded index by a plain variable names it in `guard`."""
    from aicfc.ir.lowered import substitute
    ld = Load("x", (Affine.var("i0"), Affine.of({"i1": 1}, -2)), -0.0)
    moved = substitute(ld, {"i1": Affine.of({"i1": 1}, 2)})
    assert moved.index[1] == Affine.var("i1") and moved.guard == (1,) and moved.guarded_dims == (1,)


# ---------------------------------------------------------------- numbers (interpreter) vs onnxruntime


INTERP_CASES = [
    ("channels3", dict(shapes=[(2, 3, 5, 7), (2, 1, 5, 7), (2, 4, 5, 7)], axis=1)),
    ("batch", dict(shapes=[(1, 3, 4), (2, 3, 4)], axis=0)),
    ("inner_aligned", dict(shapes=[(3, 8), (3, 4), (3, 12)], axis=-1)),
    ("inner_odd", dict(shapes=[(3, 5), (3, 1), (3, 7)], axis=1)),
    ("rank1", dict(shapes=[(5,), (3,)], axis=0)),
    ("relu_in_sigmoid_out", dict(shapes=[(1, 6, 4, 4), (1, 2, 4, 4)], axis=1, pre="Relu", post="Sigmoid")),
    ("with_constant", dict(shapes=[(2, 3), (2, 2)], axis=1, const=1)),
]


@pytest.mark.parametrize("case", INTERP_CASES, ids=[c for c, _ in INTERP_CASES])
def test_interpreter_matches_onnxruntime(case):
    model = concat_model(**case[1])
    x = B.random_inputs(model, seed=3)
    ref = B.run_onnxruntime(model, x)["y"]
    exact = "pre" not in case[1] and "post" not in case[1]   # a bare Concat copies bit for bit
    for p in _programs(model):
        got = evaluate_program(p, x)["y"]
        assert np.array_equal(got, ref) if exact else np.allclose(got, ref, rtol=1e-6, atol=1e-7), p.ops[-1].out


def test_a_table_is_inlined_through_the_guard():
    """[Note: a table inlined through a Concat's guard]: cos(cat(a, a)) of a map of an input and a constant (a
    rotary table's angles) computes the map in the cos's guarded reads through a band of ones, with the same
    values (the interpreter against onnxruntime at every stage); a map of inputs alone stays stored."""
    nodes = [helper.make_node("Mul", ["pos", "inv"], ["a"], name="angles"),
             helper.make_node("Concat", ["a", "a"], ["cat"], name="cat", axis=1),
             helper.make_node("Cos", ["cat"], ["y"], name="cos")]
    inv = np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32)
    model = B._graph_model(nodes, "table", {"pos": (3, 1)}, {"y": (3, 8)}, {"inv": inv})
    x = B.random_inputs(model, seed=5)
    ref = B.run_onnxruntime(model, x)["y"]
    programs = _programs(model)
    for p in programs:
        assert np.allclose(evaluate_program(p, x)["y"], ref, rtol=1e-6, atol=1e-7), p.ops[-1].out
    last = programs[-1]
    assert [op.out for op in last.ops if isinstance(op, Compute)] == ["y"]
    assert any(".guard.band." in w.name and w.type.dtype == "bool" for w in last.weights)
    applied = [r for r in last.rewrites if r.target == "a" and r.applied]
    assert applied and applied[0].rule == "map(x) => recompute in consumer"
    plain = concat_model([(3, 4), (3, 4)], axis=1, pre="Relu", post="Cos")   # relu of inputs: no table
    assert any(op.out.startswith("p") for op in _programs(plain)[-1].ops if isinstance(op, Compute))


def test_plan_and_vector_code():
    """One pointwise kernel. Channel concat: each term is one vector read under one test. An
    inner-axis concat at offsets that are multiples of the vector width reads vectors too; at
    other offsets the guard is tested element by element."""
    from aicfc.codegen.module import render_module
    plan = _compile(concat_model([(2, 3, 5, 8), (2, 1, 5, 8), (2, 4, 5, 8)], axis=1))
    assert isinstance(plan, Plan) and [k.family for k in plan.kernels] == ["pointwise"]
    src = render_module(plan)
    assert "if ((unsigned)(i1 + -3) < 1u) aicf_vload<4>" in src
    aligned = render_module(_compile(concat_model(**dict(INTERP_CASES)["inner_aligned"])))
    assert "if ((unsigned)(first + -8) < 4u) aicf_vload<4>" in aligned
    odd = render_module(_compile(concat_model([(4, 4), (4, 6), (4, 2)], axis=1)))
    assert "if ((unsigned)(first) < 4u) aicf_vload<4>" in odd
    assert "((unsigned)((first + e) + -4) < 6u) ?" in odd and "((unsigned)((first + e) + -10) < 2u) ?" in odd


# ---------------------------------------------------------------- the light models


LIGHT_NEEDING_CONCAT = ["densenet121", "inception_v1", "inception_v2", "shufflenet", "squeezenet"]


@pytest.mark.parametrize("name", LIGHT_NEEDING_CONCAT)
def test_light_model_plans(name):
    from benchmarks.light_models import LIGHT, load
    if not (LIGHT / f"light_{name}.onnx").is_file():
        pytest.skip(f"light_{name}.onnx is not in this onnx package")
    plan = _compile(load(name))
    assert isinstance(plan, Plan) and plan.kernels


@pytest.mark.parametrize("name", ["squeezenet", "shufflenet"])
def test_light_model_interpreter_matches_onnxruntime(name):
    """Randomized weights (benchmarks/light_models.py), softmax and logits, fp32."""
    from benchmarks.light_models import LIGHT, data_inputs, interpret, load, onnxruntime_reference, randomized
    if not (LIGHT / f"light_{name}.onnx").is_file():
        pytest.skip(f"light_{name}.onnx is not in this onnx package")
    model = randomized(load(name))
    x = data_inputs(model)
    ref = onnxruntime_reference(model, x)
    got = interpret(model, x)
    assert len(ref) == 2
    for k, r in ref.items():
        assert rel_err(got[k], r) <= 1e-4, k


# ---------------------------------------------------------------- nvcc and the GPU


NVCC_CASES = [("channels3", INTERP_CASES[0][1]), ("inner_aligned", INTERP_CASES[2][1]),
              ("inner_odd", INTERP_CASES[3][1]), ("channels_vec", dict(shapes=[(2, 3, 5, 8), (2, 1, 5, 8)], axis=1)),
              ("inner_mixed", dict(shapes=[(4, 4), (4, 6), (4, 2)], axis=1)), ("conv_relu_concat", None)]


def _conv_concat_model() -> onnx.ModelProto:
    """A fire module (SqueezeNet): squeeze 1x1, expand 1x1 and 3x3, Relu each, channel Concat."""
    rng = np.random.default_rng(0)
    w = {"ws": (8, 16, 1, 1), "we1": (12, 8, 1, 1), "we3": (20, 8, 3, 3)}
    inits = {k: (rng.standard_normal(s) * np.sqrt(2.0 / np.prod(s[1:]))).astype(np.float32) for k, s in w.items()}
    inits.update({f"b{k}": rng.standard_normal(s[0]).astype(np.float32) for k, s in w.items()})
    nodes = [helper.make_node("Conv", ["x", "ws", "bws"], ["s"], name="squeeze"),
             helper.make_node("Relu", ["s"], ["sr"], name="squeeze_relu"),
             helper.make_node("Conv", ["sr", "we1", "bwe1"], ["e1"], name="expand1"),
             helper.make_node("Relu", ["e1"], ["e1r"], name="expand1_relu"),
             helper.make_node("Conv", ["sr", "we3", "bwe3"], ["e3"], name="expand3", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["e3"], ["e3r"], name="expand3_relu"),
             helper.make_node("Concat", ["e1r", "e3r"], ["y"], name="concat", axis=1)]
    return B._graph_model(nodes, "fire", {"x": (2, 16, 9, 9)}, {"y": (2, 32, 9, 9)}, inits)


def _case_model(spec) -> onnx.ModelProto:
    return _conv_concat_model() if spec is None else concat_model(**spec)


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not found")
@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_nvcc_builds(precision, tmp_path, monkeypatch):
    from aicfc.codegen.module import render_module
    from aicfc.codegen.nvcc import build
    monkeypatch.setenv("AICF_CACHE_DIR", str(tmp_path))
    for _, spec in NVCC_CASES:
        plan = _compile(_case_model(spec), precision)
        built = build(render_module(plan), "sm_90")
        assert set(built.registers) == {k.name for k in plan.kernels}


@pytest.mark.gpu
@pytest.mark.parametrize("precision", ["fp32", "fp16"])
@pytest.mark.parametrize("case", NVCC_CASES + INTERP_CASES[4:], ids=[c for c, _ in NVCC_CASES + INTERP_CASES[4:]])
def test_gpu_concat_matches_onnxruntime(case, precision, gpu_device):
    import aicfc
    from tests.conftest import run_payload
    model = _case_model(case[1])
    x = B.random_inputs(model, seed=5)
    ref = B.run_onnxruntime(model, x)
    got = run_payload(aicfc.compile(model, target=gpu_device.arch, precision=precision), x, gpu_device)
    for k, r in ref.items():
        assert rel_err(got[k], r) <= GPU_RTOL[precision], f"{precision}: {k}"


@pytest.mark.gpu
@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_gpu_squeezenet_matches_onnxruntime(precision, gpu_device):
    import aicfc
    from benchmarks.light_models import LIGHT, data_inputs, load, onnxruntime_reference, randomized
    from tests.conftest import run_payload
    if not (LIGHT / "light_squeezenet.onnx").is_file():
        pytest.skip("light_squeezenet.onnx is not in this onnx package")
    model = randomized(load("squeezenet"))
    x = data_inputs(model)
    ref = onnxruntime_reference(model, x)
    got = run_payload(aicfc.compile(model, target=gpu_device.arch, precision=precision), x, gpu_device)
    for k, r in ref.items():
        assert rel_err(got[k], r) <= GPU_RTOL[precision], f"{precision}: {k}"
