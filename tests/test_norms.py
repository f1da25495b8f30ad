"""Norms and memory-bound kernels: the ops, one row pass per norm, pointwise at vector width.

CPU: importer and lowering of every new op (LayerNormalization, ReduceMean/Sum/Max, Pow,
Sqrt, Exp, Reciprocal, Cast); LayerNormalization, the decomposed LayerNorm torch's older
exporter emits, and RMSNorm each become ONE row kernel with `online_reducible_norm`, the two
LayerNorms the same computes; the residual sum before a norm computed and stored by the norm's
row pass; the cases that decline (a statistic with no merge, a norm over a strided axis, a
stored row maximum, the Mean output) stay correct and say why; the cost model's bytes and its
choice of `pass`; golden IR text before and after the rules (tests/golden/norm_*;
`AICF_UPDATE_GOLDEN=1 python3 -m pytest tests/test_norms.py` rewrites them); every stage's
IR against onnxruntime on fresh random inputs through the interpreters; nvcc builds.

GPU (`-m gpu`): against float64 numpy, arena poisoned, fresh random inputs; tolerance on
max|y - ref| / max|ref|: fp32 1e-4, fp16 and bf16 1e-2; rows shorter and longer than the
register-cached limit, odd column counts, every `pass`.
"""
from __future__ import annotations

import os
import re
from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper

import aicfc
from aicfc.codegen import pointwise, row_reduce
from aicfc.errors import AicfError
from aicfc.explain import explain_text
from aicfc.frontend.onnx_import import find_unsupported, import_model
from aicfc.ir.decision import parse_plan
from aicfc.ir.high import evaluate_graph
from aicfc.ir.interp import evaluate_program
from aicfc.ir.lowered import parse_program, print_op
from aicfc.ir.properties import ONLINE
from aicfc.passes.form_kernels import PROLOGUE_RULE, ROW_RULE
from aicfc.passes.lower import NORM_RULE
from aicfc.passes.plan_schedules import rank
from aicfc.planner.hardware import load_profile
from tests import onnx_builders as B
from tests.conftest import check_golden, run_payload
from tests.test_pipeline import evaluate_ir, evaluate_plan, rel_err, stages

GOLDEN = Path(__file__).parent / "golden"
RTOL = {"fp32": 1e-4, "fp16": 1e-2, "bf16": 1e-2}
HW = load_profile("sm_90")


def plan_of(model, precision: str = "fp32", pin: dict | None = None):
    return stages(model, precision, pin)["plan_memory"]


def row_kernels(plan):
    return [k for k in plan.kernels if k.family == "row_reduce"]


def rules(plan, rule: str):
    return [r for r in plan.rewrites if r.rule == rule]


# ---------------------------------------------------------------- importer and lowering


def test_layer_norm_attributes_normalized():
    g = import_model(B.layer_norm_model((3, 5, 7), axis=-2))
    (n,) = g.nodes
    assert n.op == "LayerNormalization" and n.attr == {"axis": 1, "epsilon": pytest.approx(1e-5)}
    node = helper.make_node("LayerNormalization", ["in0", "scale"], ["out"], name="ln")
    m = B._graph_model([node], "ln_defaults", {"in0": (4, 8)}, {"out": (4, 8)},
                       {"scale": np.ones(8, np.float32)})
    assert import_model(m).nodes[0].attr == {"axis": 1, "epsilon": 1e-5}    # the default


def test_layer_norm_statistics_outputs_are_computed():
    # Mean/InvStdDev are spelled out as the ONNX function defines them (the node cases of
    # onnx's conformance suite cover every axis); Y keeps its single row pass.
    model = B.layer_norm_model((4, 8), mean_output=True)
    assert find_unsupported(model) == []
    inputs = B.random_inputs(model, seed=4)
    ref = B.run_onnxruntime(model, inputs)
    got = evaluate_ir(stages(model)["plan_memory"], inputs)
    for name, r in ref.items():
        assert rel_err(got[name], r) <= 1e-5, name


def test_reduce_mean_axes_attribute_and_input_agree():
    a = import_model(B.decomposed_layer_norm_model((4, 8), opset=17))
    b = import_model(B.decomposed_layer_norm_model((4, 8), opset=18))
    means = [[n for n in g.nodes if n.op == "ReduceMean"] for g in (a, b)]
    assert [n.attrs for n in means[0]] == [n.attrs for n in means[1]] == [(("axes", (1,)), ("keepdims", 1))] * 2
    assert [n.inputs for n in means[1]] == [("in0",), ("d2",)]


@pytest.mark.parametrize("op", ["ReduceMean", "ReduceSum", "ReduceMax"])
def test_reductions_lower_to_one_sum_or_max(op):
    model = B.single_op_model(op, [(3, 5, 7)] + ([None] if op == "ReduceSum" else []),
                              {"keepdims": 0} if op == "ReduceSum" else {"axes": [1], "keepdims": 0},
                              initializers={"in1": np.array([1], np.int64)} if op == "ReduceSum" else None)
    p = stages(model)["lower"]
    (c,) = p.ops
    body = {"ReduceMean": "mul(load(%in0, [i0, r0, i1]), 0.2)", "ReduceSum": "load(%in0, [i0, r0, i1])",
            "ReduceMax": "load(%in0, [i0, r0, i1])"}[op]
    assert c.type.shape == (3, 7) and c.reduce == (5,) and c.combiner == ("max" if op == "ReduceMax" else "sum")
    assert body in str(p)


def test_reduce_over_several_wide_axes_is_refused():
    """Consecutive wide axes merge into one (tests/test_hf_exports.py); others are refused."""
    model = B.single_op_model("ReduceMean", [(3, 5, 7)], {"axes": [0, 2]})
    with pytest.raises(AicfError, match="over 2 axes with more than one element that are not consecutive"):
        import_model(model)
    # an axis of one element is no reduction: the mean over [1, 2] of [3, 1, 7] is over axis 2 only
    p = stages(B.single_op_model("ReduceMean", [(3, 1, 7)], {"axes": [1, 2]}))["lower"]
    assert p.ops[0].reduce == (7,)


@pytest.mark.parametrize("exponent,body", [
    (2.0, "mul(load(%in0, [i0, i1]), load(%in0, [i0, i1]))"),
    (3.0, "mul(mul(load(%in0, [i0, i1]), load(%in0, [i0, i1])), load(%in0, [i0, i1]))"),
    (0.5, "sqrt(load(%in0, [i0, i1]))"),
    (-1.0, "div(1.0, load(%in0, [i0, i1]))"),
    (-0.5, "div(1.0, sqrt(load(%in0, [i0, i1])))"),
    (0.0, "= map 1.0"),
])
def test_pow_lowers_to_products_roots_and_reciprocals(exponent, body):
    p = stages(B.unary_chain_model((3, 5), [("Pow", {"exponent": exponent})]))["lower"]
    assert body in str(p)


def test_pow_refuses_other_exponents_and_computed_ones():
    with pytest.raises(AicfError, match="exponent 1.7 is not supported"):
        import_model(B.unary_chain_model((3, 5), [("Pow", {"exponent": 1.7})]))
    m = B.single_op_model("Pow", [(3, 5), (1,)])
    with pytest.raises(AicfError, match="the exponent of Pow is computed at run time"):
        import_model(m)


@pytest.mark.parametrize("op,body", [("Sqrt", "sqrt(load(%in0, [i0, i1]))"), ("Exp", "exp(load(%in0, [i0, i1]))"),
                                     ("Reciprocal", "div(1.0, load(%in0, [i0, i1]))")])
def test_unary_lowerings(op, body):
    assert body in str(stages(B.single_op_model(op, [(3, 5)]))["lower"])


def test_cast_to_float_is_a_copy_and_other_casts_are_refused():
    p = stages(B.single_op_model("Cast", [(3, 5)], {"to": TensorProto.FLOAT}))["lower"]
    assert "= map load(%in0, [i0, i1])" in str(p)
    bad = B.single_op_model("Cast", [(3, 5)], {"to": TensorProto.UINT8})
    with pytest.raises(AicfError, match="Cast to UINT8 is not supported"):
        import_model(bad)


def test_layer_norm_over_several_axes_uses_a_view_and_matches_numpy():
    model = B.layer_norm_model((3, 5, 7), axis=1)
    p = stages(model)["lower"]
    # x and the output are views; the scale and bias, weights of their own shape
    assert [type(op).__name__ for op in p.ops] == ["View", "Compute", "Compute", "Compute", "View"]
    assert {w.name: w.type.shape for w in p.weights} == {"out.scale": (35,), "out.bias": (35,)}
    inputs = B.random_inputs(model, seed=11)
    ref = B.run_onnxruntime(model, inputs)["out"]
    assert rel_err(evaluate_program(p, inputs)["out"], ref) <= 1e-5
    plan = plan_of(model)
    assert len(row_kernels(plan)) == 1 and len(plan.kernels) == 1
    assert rel_err(evaluate_plan(plan, inputs)["out"], ref) <= 1e-5


# ---------------------------------------------------------------- one row kernel per norm


def _canonical(program) -> list[str]:
    """The computes as text, buffers renamed in order of definition (inputs and weights by role)."""
    names: dict[str, str] = {v.name: f"%in{i}" for i, v in enumerate(program.inputs)}
    names.update({w.name: f"%w{i}" for i, w in enumerate(program.weights)})
    out = []
    for op in program.ops:
        names.setdefault(op.out, f"%t{len(names)}")
        text = print_op(op).split(" from ")[0]
        for old, new in sorted(names.items(), key=lambda kv: -len(kv[0])):
            text = re.sub(rf"%{re.escape(old)}\b(?![.\w])", new, text)
        out.append(text)
    return out


def test_layer_norm_and_its_decomposition_lower_to_the_same_computes():
    a = stages(B.layer_norm_model((4, 8)))["inline_producers"]
    b = stages(B.decomposed_layer_norm_model((4, 8)))["inline_producers"]
    ta, tb = _canonical(a), _canonical(b)
    # the decomposition's scale and bias are [1, 8]: the same elements read at [0, i1]
    assert [t.replace("[0, i1]", "[i1]") for t in tb] == ta
    assert len(ta) == 3 and ta[0].startswith("%t3: f32[4,1] = sum[8] mul(load(%in0, [i0, r0]), 0.125)")
    (rec,) = rules(a, NORM_RULE)
    assert rec.applied and ONLINE in rec.reason


@pytest.mark.parametrize("build", [lambda: B.layer_norm_model((16, 256)),
                                   lambda: B.decomposed_layer_norm_model((16, 256)),
                                   lambda: B.decomposed_layer_norm_model((16, 256), opset=18),
                                   lambda: B.rms_norm_model((16, 256)),
                                   lambda: B.rms_norm_model((16, 256), reciprocal=True)],
                         ids=["layernorm", "decomposed", "decomposed_opset18", "rmsnorm", "rmsnorm_reciprocal"])
def test_norm_is_one_row_kernel_with_its_property(build):
    payload = aicfc.compile(build())
    (k,) = payload["kernels"]
    assert k["family"] == "row_reduce" and k["stores"] == ["out"]
    assert ONLINE in k["properties"] and ROW_RULE in k["rewrites"]
    assert k["registers"] is not None and k["params"]["pass"] == "regs" and k["params"]["vec"] == 4
    assert ONLINE in explain_text(payload)


def test_residual_sum_is_computed_and_stored_by_the_norms_row_pass():
    model = B.residual_layer_norm_model((16, 256))
    s = stages(model)
    kept = [r for r in s["inline_producers"].rewrites if r.target == "h"]
    assert kept and not kept[0].applied and "row of statistic" in kept[0].reason
    plan = s["plan_memory"]
    assert [k.family for k in plan.kernels] == ["row_reduce", "pointwise"]
    row = plan.kernels[0]
    assert row.ops[0].out == "h" and row.stores == ("h", "out") and PROLOGUE_RULE in row.rewrites
    (rec,) = rules(plan, PROLOGUE_RULE)
    assert rec.applied and rec.bytes_saved == 16 * 256 * 4
    inputs = B.random_inputs(model, seed=5)
    ref = B.run_onnxruntime(model, inputs)
    got = evaluate_plan(plan, inputs)
    for name, r in ref.items():
        assert rel_err(got[name], r) <= 1e-5
    # as a graph output, h is stored anyway: the row pass still computes it
    plan2 = plan_of(B.residual_layer_norm_model((16, 256), h_output=True))
    assert len(plan2.kernels) == 1 and set(plan2.kernels[0].stores) == {"h", "out"}


def test_prologue_declines_when_the_pass_also_reads_its_input():
    # out = LayerNorm(x + a) + a: the row pass reads a besides the sum, which must stay stored
    n = helper.make_node
    shape = (8, 64)
    g, b = B._norm_params(64, 0)
    nodes = [n("Add", ["in0", "in1"], ["h"], name="add"), n("Relu", ["in1"], ["r"], name="relu"),
             n("Mul", ["h", "r"], ["hm"], name="mul_outside"), n("Add", ["hm", "hm"], ["h2"], name="outside2"),
             n("LayerNormalization", ["h", "scale", "bias"], ["ln"], name="ln", axis=-1),
             n("Add", ["ln", "r"], ["out"], name="add_r")]
    model = B._graph_model(nodes, "ln_reads_input", {"in0": shape, "in1": shape}, {"out": shape, "hm": shape},
                           {"scale": g, "bias": b})
    plan = plan_of(model)
    inputs = B.random_inputs(model, seed=3)
    ref = B.run_onnxruntime(model, inputs)
    got = evaluate_plan(plan, inputs)
    for name, r in ref.items():
        assert rel_err(got[name], r) <= 1e-5


# ---------------------------------------------------------------- what declines, correctly


def test_statistic_without_a_merge_declines_the_online_pass():
    model = B.third_moment_model((8, 64))
    plan = plan_of(model)
    (k,) = row_kernels(plan)
    assert [op.combiner for op in k.ops] == ["sum", "sum", "map"]
    reasons = [c.rejected_because for c in k.schedule.candidates if c.rejected_because]
    assert any("do not merge in one streaming pass" in r and "'m3'" in r for r in reasons)
    assert "online" not in {dict(c.params).get("pass") for c in k.schedule.candidates if c.predicted_time_us}
    inputs = B.random_inputs(model, seed=2)
    assert rel_err(evaluate_plan(plan, inputs)["out"], B.run_onnxruntime(model, inputs)["out"]) <= 1e-5


def test_norm_over_a_strided_axis_is_one_row_pass_without_vectors():
    model = B.decomposed_layer_norm_model((4, 64, 8), axis=1)
    plan = plan_of(model)
    (k,) = plan.kernels
    assert k.family == "row_reduce" and k.schedule.param["vec"] == 1
    reasons = [c.rejected_because for c in k.schedule.candidates if c.rejected_because]
    assert any("not contiguous in memory" in r and "8 elements" in r for r in reasons)
    inputs = B.random_inputs(model, seed=4)
    assert rel_err(evaluate_plan(plan, inputs)["out"], B.run_onnxruntime(model, inputs)["out"]) <= 1e-5


def test_softmax_whose_maximum_is_an_output_stores_it_from_the_same_pass():
    model = B.decomposed_softmax_model((8, 100))
    plan = plan_of(model)
    (k,) = plan.kernels
    assert k.stores == ("mx", "out") and ROW_RULE in k.rewrites
    (rec,) = [r for r in rules(plan, ROW_RULE) if r.target == "out"]
    assert rec.applied and rec.bytes_saved == 2 * 8 * 4     # the sum is not stored; the max is
    assert row_reduce.merges(k)[0].kind == "softmax"
    inputs = B.random_inputs(model, seed=6)
    ref = B.run_onnxruntime(model, inputs)
    got = evaluate_plan(plan, inputs)
    for name, r in ref.items():
        assert rel_err(got[name], r) <= 1e-5


def test_odd_columns_decline_vectors_with_the_reason():
    plan = plan_of(B.layer_norm_model((4, 4097)), "fp16")
    (k,) = plan.kernels
    assert k.schedule.param["vec"] == 1
    assert any("4097 elements are not a multiple of 8" in c.rejected_because for c in k.schedule.candidates)
    plan = plan_of(B.layer_norm_model((4, 1000)), "fp16")
    assert plan.kernels[0].schedule.param["vec"] == 8


# ---------------------------------------------------------------- the cost model


def _ranked(model, precision):
    plan = stages(model, precision)["plan_schedules"]
    (k,) = plan.kernels
    ranked, rejected = rank(k, plan, HW)
    return k, ranked, rejected


@pytest.mark.parametrize("precision,itemsize", [("fp32", 4), ("fp16", 2)])
def test_big_layer_norm_reads_its_row_once_in_registers(precision, itemsize):
    m, n = 65536, 4096
    k, ranked, _ = _ranked(B.layer_norm_model((m, n)), precision)
    best = {}
    for r in ranked:
        best.setdefault(r.params["pass"], r)
    assert ranked[0].params["pass"] == "regs"
    io = (2 * m * n + 2 * n) * itemsize
    assert best["regs"].estimate.bytes == pytest.approx(io)
    assert dict(best["regs"].estimate.as_items())["reread_bytes"] == 0
    # online reads the row a second time (the output pass); multi twice more
    assert dict(best["online"].estimate.as_items())["reread_bytes"] == m * n * itemsize
    assert dict(best["multi"].estimate.as_items())["reread_bytes"] == 2 * m * n * itemsize
    assert best["regs"].time_us < best["online"].time_us < best["multi"].time_us


def test_rows_too_long_for_registers_stream_online():
    k, ranked, rejected = _ranked(B.single_op_model("Softmax", [(64, 300000)], {"axis": -1}), "fp32")
    assert ranked[0].params["pass"] == "online"
    assert not any(r.params["pass"] == "regs" for r in ranked)
    assert any(dict(c.params)["pass"] == "regs" and "registers" in c.rejected_because for c in rejected)


def test_register_estimate_rejects_rows_that_do_not_fit():
    k, ranked, rejected = _ranked(B.layer_norm_model((1024, 4096)), "fp32")
    cached = {(r.params["tpr"], r.params["rpb"]): row_reduce.cached_elements(k, r.params)
              for r in ranked if r.params["pass"] == "regs"}
    assert cached[(512, 1)] == 8 and cached[(32, 1)] == 128
    assert any(dict(c.params) == {"pass": "regs", "rpb": 1, "tpr": 8, "vec": 4} or "registers" in c.rejected_because
               for c in rejected)
    assert (8, 4) not in cached


def test_pointwise_gelu_bias_moves_16_byte_vectors():
    for precision, vec in (("fp32", 4), ("fp16", 8)):
        plan = plan_of(B.gelu_bias_model((64, 4096)), precision)
        (k,) = plan.kernels
        assert k.family == "pointwise" and k.schedule.param["vec"] == vec
    plan = plan_of(B.gelu_bias_model((3, 4097)), "fp16")
    (k,) = plan.kernels
    assert k.schedule.param["vec"] == 1
    assert any("4097 elements are not a multiple of 8" in c.rejected_because for c in k.schedule.candidates)


# ---------------------------------------------------------------- golden text and the interpreters




GOLDEN_CASES = {
    "layernorm": lambda: B.layer_norm_model((4, 8)),
    "decomposed": lambda: B.decomposed_layer_norm_model((4, 8)),
    "rmsnorm": lambda: B.rms_norm_model((4, 8)),
    "residual": lambda: B.residual_layer_norm_model((4, 8)),
}


@pytest.mark.parametrize("case", list(GOLDEN_CASES))
def test_golden_before_after(case):
    """lower (the High IR's norm as computes), inline_producers, then form_kernels (the rules)."""
    s = stages(GOLDEN_CASES[case]())
    check_golden(f"norm_{case}_before.txt", str(s["inline_producers"]))
    check_golden(f"norm_{case}_after.txt", str(s["form_kernels"]))
    weights = {w.name: w.data for w in s["inline_producers"].weights}
    assert parse_program(str(s["inline_producers"]), weights) == s["inline_producers"]
    assert parse_plan(str(s["form_kernels"]), weights) == s["form_kernels"]


INTERP_CASES = {
    "layernorm": lambda: B.layer_norm_model((7, 300), eps=1e-3),
    "layernorm_axis1": lambda: B.layer_norm_model((3, 5, 40), axis=1),
    "decomposed_opset18": lambda: B.decomposed_layer_norm_model((7, 300), opset=18),
    "rmsnorm": lambda: B.rms_norm_model((7, 300)),
    "residual": lambda: B.residual_layer_norm_model((7, 300)),
    "softmax_max_output": lambda: B.decomposed_softmax_model((7, 300)),
    "third_moment": lambda: B.third_moment_model((7, 300)),
    "strided": lambda: B.decomposed_layer_norm_model((3, 40, 5), axis=1),
    "gelu_bias": lambda: B.gelu_bias_model((7, 300)),
}


@pytest.mark.parametrize("case", list(INTERP_CASES))
def test_every_stage_matches_onnxruntime(case):
    model = INTERP_CASES[case]()
    inputs = B.random_inputs(model, seed=int.from_bytes(os.urandom(2), "little"))
    ref = B.run_onnxruntime(model, inputs)
    for name, ir in stages(model).items():
        got = evaluate_ir(ir, inputs)
        for out, r in ref.items():
            assert rel_err(got[out], r) <= 1e-4, f"{case} after {name}: {out}"


# ---------------------------------------------------------------- nvcc builds of every variant


BUILD_CASES = [("layernorm", B.layer_norm_model, (3, 1000)), ("layernorm", B.layer_norm_model, (3, 4097)),
               ("softmax", lambda s: B.single_op_model("Softmax", [s], {"axis": -1}), (3, 1000)),
               ("residual", B.residual_layer_norm_model, (3, 4096)),
               ("softmax_max", B.decomposed_softmax_model, (3, 777)),
               ("strided", lambda s: B.decomposed_layer_norm_model(s, axis=1), (2, 100, 3))]


@pytest.mark.parametrize("case,build,shape", BUILD_CASES, ids=[f"{c}-{'x'.join(map(str, s))}" for c, _, s in BUILD_CASES])
def test_every_pass_builds_without_spills(case, build, shape, tmp_path):
    from aicfc.codegen.module import module_header
    from aicfc.codegen.nvcc import build as nvcc_build
    for precision in ("fp32", "fp16", "bf16"):
        plan = stages(build(shape), precision)["plan_schedules"]
        sources = []
        for k in row_kernels(plan):
            for mode in row_reduce.modes(k):
                for tpr, rpb in ((32, 4), (256, 1)):
                    p = {**k.schedule.param, "pass": mode, "tpr": tpr, "rpb": rpb}
                    sources.append(row_reduce.render_kernel(k, p, plan.types(), f"{k.name}_{mode}_{tpr}"))
        for k in plan.kernels:
            if k.family == "pointwise":
                sources.append(pointwise.render_kernel(k, k.schedule.param, plan.types(), f"{k.name}_pw"))
        built = nvcc_build(module_header(plan, len(sources)) + "\n".join(sources), "sm_90")
        names = {re.search(r"void __launch_bounds__\(\d+\) (\w+)\(", s).group(1) for s in sources}
        assert set(built.registers) >= names
        assert not any(built.spills.get(n) for n in names), built.spills


# ---------------------------------------------------------------- on the GPU


def _gpu_check(model, precision: str, device, pin: dict | None = None, seed: int = 0) -> dict:
    """Compile, run once on a poisoned arena with fresh random inputs, compare every output
    with the float64 evaluation of the graph; returns the payload's only row or pointwise kernel."""
    payload = aicfc.compile(model, target=device.arch, precision=precision, pin=pin)
    graph = import_model(model)
    rng = np.random.default_rng(seed + int.from_bytes(os.urandom(2), "little"))
    inputs = {v.name: rng.standard_normal(v.type.shape).astype(np.float32) for v in graph.inputs}
    # The kernels see the inputs in their storage type: so does the reference (a bf16 input
    # of 3.5 is off by 0.014 before any kernel runs; exp of it by 1.4%).
    stored = {k: _as_stored(v, precision) for k, v in inputs.items()}
    ref = evaluate_graph(graph, stored, dtype=np.float64)
    got = run_payload(payload, inputs, device)
    for name, r in ref.items():
        assert got[name].dtype == np.float32
        err = rel_err(got[name], r)
        assert err <= RTOL[precision], f"{precision} {pin}: {name} rel err {err:.2e}"
    return payload


def _as_stored(x: np.ndarray, precision: str) -> np.ndarray:
    """x rounded to the precision's storage type, back as float32."""
    from aicf_run.convert import from_bf16_bytes, to_bf16_bytes
    if precision == "fp16":
        return x.astype(np.float16).astype(np.float32)
    if precision == "bf16":
        return from_bf16_bytes(to_bf16_bytes(x), x.shape)
    return x


def _softmax(shape):
    return B.single_op_model("Softmax", [shape], {"axis": -1})


# rows shorter and longer than the register-cached limit, odd column counts
GPU_SHAPES = [(5, 1000), (3, 4097), (16, 4096), (2, 33), (4, 300000)]
GPU_MODELS = {"layernorm": B.layer_norm_model, "softmax": _softmax, "rmsnorm": B.rms_norm_model,
              "decomposed": B.decomposed_layer_norm_model}


@pytest.mark.gpu
@pytest.mark.parametrize("precision", ["fp32", "fp16"])
@pytest.mark.parametrize("shape", GPU_SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("case", list(GPU_MODELS))
def test_gpu_norms_as_planned(case, shape, precision, gpu_device):
    payload = _gpu_check(GPU_MODELS[case](shape), precision, gpu_device)
    (k,) = payload["kernels"]
    assert k["family"] == "row_reduce"
    if shape[1] >= 300000:      # longer than any thread block can hold in registers
        assert k["params"]["pass"] != "regs"


@pytest.mark.gpu
@pytest.mark.parametrize("precision", ["fp32", "fp16", "bf16"])
@pytest.mark.parametrize("mode", ["regs", "online", "multi"])
@pytest.mark.parametrize("shape", [(5, 1000), (3, 4097), (7, 64)], ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("case", ["layernorm", "softmax", "residual"])
def test_gpu_every_pass(case, shape, mode, precision, gpu_device):
    build = {"layernorm": B.layer_norm_model, "softmax": _softmax, "residual": B.residual_layer_norm_model}[case]
    # one warp per row (shuffles only), and eight (through shared memory); 4097 unvectorized
    # columns held in the registers of one warp would not fit: two warps then
    for tpr in ("32" if shape[1] <= 1024 or mode != "regs" else "64", "256"):
        payload = _gpu_check(build(shape), precision, gpu_device, pin={"pass": mode, "tpr": tpr})
        row = [k for k in payload["kernels"] if k["family"] == "row_reduce"]
        assert len(row) == 1 and row[0]["params"]["pass"] == mode


@pytest.mark.gpu
@pytest.mark.parametrize("precision", ["fp32", "fp16"])
@pytest.mark.parametrize("build", [lambda: B.decomposed_softmax_model((6, 999)),
                                   lambda: B.third_moment_model((6, 1000)),
                                   lambda: B.decomposed_layer_norm_model((3, 50, 7), axis=1),
                                   lambda: B.layer_norm_model((3, 5, 40), axis=1),
                                   lambda: B.residual_layer_norm_model((6, 1024), h_output=True),
                                   lambda: B.rms_norm_model((6, 1000), reciprocal=True)],
                         ids=["softmax_max_output", "third_moment", "strided_axis", "layernorm_axis1",
                              "residual_h_output", "rmsnorm_reciprocal"])
def test_gpu_declines_stay_correct(build, precision, gpu_device):
    _gpu_check(build(), precision, gpu_device)


@pytest.mark.gpu
@pytest.mark.parametrize("precision", ["fp32", "fp16", "bf16"])
@pytest.mark.parametrize("shape", [(64, 4096), (3, 4097), (7, 1000), (5, 6)], ids=lambda s: "x".join(map(str, s)))
def test_gpu_gelu_bias_vectors(shape, precision, gpu_device):
    payload = _gpu_check(B.gelu_bias_model(shape), precision, gpu_device)
    (k,) = payload["kernels"]
    assert k["family"] == "pointwise"
    for items in ("1", "4"):
        _gpu_check(B.gelu_bias_model(shape), precision, gpu_device, pin={"items": items})


def test_a_single_row_gets_every_thread_of_its_block():
    """A decode step's RMSNorm is one row: row slots without a row add no parallelism, so the
    planner does not pick blocks of several slots over it (benchmarks/results/
    row_reduce_one_row_session12_h200.txt: 256 threads on the row measured faster than 8 slots of 128)."""
    from aicfc.passes.pipeline import Options, run_pipeline
    from benchmarks.decoder_graph import DecoderConfig, decoder_model, random_weight, weight_shapes
    from benchmarks.generate import shape_set
    cfg = DecoderConfig(512, 1, 8, 2, 1024, 1000, 64)
    rng = np.random.default_rng(0)
    shapes = weight_shapes(cfg)
    model = decoder_model(cfg, lambda n: random_weight(n, shapes[n], rng), batch=1)
    graph = import_model(model, shape_set(cfg, 1, 1), name="dec")
    plan = run_pipeline(graph, Options("sm_90", HW, "fp16")).plan
    rows = [k for k in plan.kernels if k.family == "row_reduce"]
    assert rows and all(k.schedule.param["rpb"] == 1 for k in rows)
