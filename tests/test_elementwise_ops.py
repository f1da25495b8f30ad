"""Issue 18's element-wise ops (ir/ops_elementwise.py, passes/lower_elementwise.py) against
onnxruntime on fresh random inputs: every stage's interpreter at float32, the lowered program
in float64, the fp16 plan with its stores rounded to fp16 (what the GPU stores), and a build of
each op's CUDA by nvcc at fp32 and fp16. Floor, Ceil, Round, Mod and HardSigmoid get inputs
at and next to their discontinuities and kinks. The activations are absorbed as GEMM and
convolution epilogues (one kernel), and the refused variants fail in one line.
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
from aicfc.ir.interp import evaluate_ops, evaluate_program
from aicfc.passes.form_kernels import EPILOGUE_RULE
from tests import onnx_builders as B
from tests.test_pipeline import FP32_RTOL, evaluate_ir, rel_err, stages

FP16_RTOL = 1e-2
F64_RTOL = 1e-5
SHAPE = (3, 37, 129)


def model_of(op: str, shapes: list[tuple[int, ...]], attrs: dict | None = None, opset: int = 22,
             inits: dict[str, np.ndarray] | None = None, dtype: int = TensorProto.FLOAT) -> onnx.ModelProto:
    """One node of `op` over graph inputs in0.. (and initializers named in `inits`, appended)."""
    inits = inits or {}
    names = [f"in{i}" for i in range(len(shapes))]
    node = helper.make_node(op, names + list(inits), ["out"], name=f"{op.lower()}_0", **(attrs or {}))
    ins = [helper.make_tensor_value_info(n, dtype, list(s)) for n, s in zip(names, shapes)]
    graph = helper.make_graph([node], op, ins, [onnx.ValueInfoProto(name="out")],
                              [onnx.numpy_helper.from_array(v, k) for k, v in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    inferred = onnx.shape_inference.infer_shapes(model, strict_mode=True)
    model.graph.output[0].CopyFrom(inferred.graph.output[0])
    onnx.checker.check_model(model)
    return model


def near_integers(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    """Integers, halves (ties), and values one or a few float32 ulps on either side of them,
    mixed with plain normals."""
    k = rng.integers(-8, 9, shape).astype(np.float32)
    offsets = np.float32([0, 0.5, -0.5, 2 ** -20, -2 ** -20, 0.5 + 2 ** -20, 0.5 - 2 ** -20, 0.25])
    x = k + rng.choice(offsets, shape)
    x = np.where(rng.random(shape) < 0.1, np.nextafter(k, np.float32(np.inf)), x)
    x = np.where(rng.random(shape) < 0.1, np.nextafter(k, np.float32(-np.inf)), x)
    return np.where(rng.random(shape) < 0.2, 4 * rng.standard_normal(shape), x).astype(np.float32)


def near_kinks(rng: np.random.Generator, shape: tuple[int, ...], kinks: list[float]) -> np.ndarray:
    """Normals (spread wider than the kinks) with a third of the values at or next to a kink."""
    x = 3 * rng.standard_normal(shape).astype(np.float32)
    at = np.float32(rng.choice(kinks, shape)) + rng.choice(np.float32([0, 1e-6, -1e-6, 1e-3, -1e-3]), shape)
    return np.where(rng.random(shape) < 0.33, at, x).astype(np.float32)


def mod_inputs(rng: np.random.Generator, shape: tuple[int, ...]) -> dict[str, np.ndarray]:
    """Divisors of both signs away from 0; dividends at, and next to, multiples of them."""
    b = (rng.choice([-1, 1], shape) * rng.uniform(0.5, 3.0, shape)).astype(np.float32)
    m = rng.integers(-5, 6, shape).astype(np.float32)
    a = m * b + rng.choice(np.float32([0, 1e-6, -1e-6, 1e-3]), shape)
    a = np.where(rng.random(shape) < 0.3, 5 * rng.standard_normal(shape), a).astype(np.float32)
    return {"in0": a, "in1": b}


def _normal(rng, shape):
    return (2.5 * rng.standard_normal(shape)).astype(np.float32)


# (case id, model, input generator rng -> {name: array})
CASES = [
    ("HardSigmoid", lambda: model_of("HardSigmoid", [SHAPE]), lambda r: {"in0": near_kinks(r, SHAPE, [-2.5, 2.5])}),
    ("HardSigmoid_alpha_beta", lambda: model_of("HardSigmoid", [SHAPE], {"alpha": 0.5, "beta": 0.6}),
     lambda r: {"in0": near_kinks(r, SHAPE, [-1.2, 0.8])}),
    ("HardSwish", lambda: model_of("HardSwish", [SHAPE]), lambda r: {"in0": near_kinks(r, SHAPE, [-3.0, 3.0])}),
    ("Mish", lambda: model_of("Mish", [SHAPE]), lambda r: {"in0": 4 * _normal(r, SHAPE)}),
    ("Softplus", lambda: model_of("Softplus", [SHAPE]), lambda r: {"in0": 10 * _normal(r, SHAPE)}),
    ("Gelu", lambda: model_of("Gelu", [SHAPE]), lambda r: {"in0": _normal(r, SHAPE)}),
    ("Gelu_tanh", lambda: model_of("Gelu", [SHAPE], {"approximate": "tanh"}), lambda r: {"in0": _normal(r, SHAPE)}),
    ("Abs", lambda: model_of("Abs", [SHAPE]), lambda r: {"in0": _normal(r, SHAPE)}),
    ("Floor", lambda: model_of("Floor", [SHAPE]), lambda r: {"in0": near_integers(r, SHAPE)}),
    ("Ceil", lambda: model_of("Ceil", [SHAPE]), lambda r: {"in0": near_integers(r, SHAPE)}),
    ("Round", lambda: model_of("Round", [SHAPE]), lambda r: {"in0": near_integers(r, SHAPE)}),
    ("Mod_fmod1", lambda: model_of("Mod", [SHAPE, SHAPE], {"fmod": 1}), lambda r: mod_inputs(r, SHAPE)),
    ("Mod_fmod0", lambda: model_of("Mod", [SHAPE, SHAPE], {"fmod": 0}, opset=28), lambda r: mod_inputs(r, SHAPE)),
    ("Mod_broadcast", lambda: model_of("Mod", [SHAPE, SHAPE[-1:]], {"fmod": 1}),
     lambda r: {"in0": 5 * _normal(r, SHAPE), "in1": mod_inputs(r, SHAPE[-1:])["in1"]}),
    ("Mean", lambda: model_of("Mean", [SHAPE, SHAPE[-2:], (SHAPE[0], 1, 1)]),
     lambda r: {"in0": _normal(r, SHAPE), "in1": _normal(r, SHAPE[-2:]), "in2": _normal(r, (SHAPE[0], 1, 1))}),
    ("Trilu_upper", lambda: model_of("Trilu", [SHAPE]), lambda r: {"in0": _normal(r, SHAPE)}),
    ("Trilu_lower_k", lambda: model_of("Trilu", [SHAPE], {"upper": 0}, inits={"k": np.array(-5, np.int64)}),
     lambda r: {"in0": _normal(r, SHAPE)}),
    ("Trilu_upper_k", lambda: model_of("Trilu", [SHAPE], inits={"k": np.array(40, np.int64)}),
     lambda r: {"in0": _normal(r, SHAPE)}),
]
IDS = [c[0] for c in CASES]


def fresh_inputs(case_id: str, make) -> dict[str, np.ndarray]:
    return make(np.random.default_rng())   # unseeded: fresh values every run


def evaluate_plan_stored(plan, inputs: dict) -> dict:
    """The plan's kernels in launch order, each stored tensor rounded to its dtype as the GPU
    stores it (fp16 under --precision fp16); values inside a kernel stay float32."""
    env = {v.name: np.asarray(inputs[v.name]).astype(v.type.np_dtype).astype(np.float32) for v in plan.inputs}
    env.update({w.name: w.array() for w in plan.weights})

    def settle() -> None:   # views of what is available so far (as tests/test_pipeline.evaluate_plan)
        for v in plan.views:
            if v.source in env and v.out not in env:
                env[v.out] = env[v.source].reshape(v.type.shape)
    settle()
    for k in plan.kernels:
        evaluate_ops(k.ops, env, np.float32)
        for op in k.ops:
            if op.out in k.stores:
                env[op.out] = env[op.out].astype(op.type.np_dtype).astype(np.float32)
        settle()
    return {o: env[o] for o in plan.outputs}


def check_every_stage(case_id: str, model: onnx.ModelProto, inputs: dict[str, np.ndarray]) -> None:
    """Every stage's interpreter at float32 and the lowered program in float64 against onnxruntime."""
    ref = B.run_onnxruntime(model, inputs)["out"]
    assert np.isfinite(ref).all() and np.abs(ref).max() > 0
    for name, ir in stages(model).items():
        got = evaluate_ir(ir, inputs)["out"]
        assert rel_err(got, ref) <= FP32_RTOL, (case_id, name, rel_err(got, ref))
    lowered = stages(model)["lower"]
    got64 = evaluate_program(lowered, inputs, np.float64)["out"]
    assert got64.dtype == np.float64
    assert rel_err(got64, ref) <= F64_RTOL, (case_id, rel_err(got64, ref))


def check_fp16_plan(case_id: str, model: onnx.ModelProto, inputs: dict[str, np.ndarray]) -> None:
    """The fp16 plan, its stores rounded to fp16, against onnxruntime on the fp16-rounded inputs."""
    inputs = {k: v.astype(np.float16).astype(np.float32) if v.dtype.kind == "f" else v for k, v in inputs.items()}
    ref = B.run_onnxruntime(model, inputs)["out"]
    plan = stages(model, "fp16")["plan_memory"]
    assert {t.dtype for t in plan.types().values() if t.np_dtype.kind == "f"} == {"f16"}
    got = evaluate_plan_stored(plan, inputs)["out"]
    assert rel_err(got, ref) <= FP16_RTOL, (case_id, rel_err(got, ref))


def check_nvcc_builds(model: onnx.ModelProto, precision: str) -> None:
    import aicfc
    payload = aicfc.compile(model, precision=precision)
    assert payload["modules"] and all(len(m["cubin"]) > 0 for m in payload["modules"])


@pytest.mark.parametrize("case_id,make_model,make_inputs", CASES, ids=IDS)
def test_every_stage_and_float64_match_onnxruntime(case_id, make_model, make_inputs):
    check_every_stage(case_id, make_model(), fresh_inputs(case_id, make_inputs))


@pytest.mark.parametrize("case_id,make_model,make_inputs", CASES, ids=IDS)
def test_fp16_plan_matches_onnxruntime(case_id, make_model, make_inputs):
    check_fp16_plan(case_id, make_model(), fresh_inputs(case_id, make_inputs))


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
@pytest.mark.parametrize("precision", ["fp32", "fp16"])
@pytest.mark.parametrize("case_id,make_model,make_inputs", CASES, ids=IDS)
def test_nvcc_builds_it(case_id, make_model, make_inputs, precision):
    check_nvcc_builds(make_model(), precision)


# ---------------------------------------------------------------- the CUDA functions, run on the host
# Without a GPU, the new entries of codegen/cexpr.py and templates/math.cuh.j2 (libm's exact
# fabsf/floorf/ceilf/rintf/fmodf and the aicf_mod/aicf_softplus bodies) are compiled as host
# C++ (the precise-math branch) and compared bit for bit, or within ulps for softplus, with the
# interpreter's functions on edge cases: signed zeros, infinities, NaN, ties, neighbours of
# integers and of multiples of the divisor.

def _host_program(tmp_path) -> str:
    import subprocess
    from aicfc.codegen.cexpr import BINARY, UNARY
    from aicfc.codegen.common import render
    math_fns = render("math.cuh.j2", fast=False, precision="fp32", bits=None)
    unary = ["abs", "floor", "ceil", "round", "softplus"]
    lines = ["#include <math.h>", "#include <cstdio>", "#define __device__", "#define __forceinline__ inline",
             math_fns, "int main() { float a, b;", "  while (std::fread(&a, 4, 1, stdin) == 1 && std::fread(&b, 4, 1, stdin) == 1) {",
             "    float r[7];"]
    lines += [f"    r[{k}] = {UNARY[fn].format('a')};" for k, fn in enumerate(unary)]
    lines += [f"    r[5] = {BINARY['fmod'].format('a', 'b')};", f"    r[6] = {BINARY['mod'].format('a', 'b')};",
              "    std::fwrite(r, 4, 7, stdout);", "  }", "}"]
    src = tmp_path / "fns.cpp"
    src.write_text("\n".join(lines))
    exe = tmp_path / "fns"
    subprocess.run(["c++", "-O1", "-fno-fast-math", "-ffp-contract=off", str(src), "-o", str(exe)], check=True)
    return str(exe)


@pytest.mark.skipif(shutil.which("c++") is None, reason="needs a host C++ compiler")
def test_cuda_functions_on_the_host_match_the_interpreter(tmp_path):
    import subprocess
    from aicfc.ir.interp import SCALAR_FNS
    rng = np.random.default_rng()
    special = np.float32([0.0, -0.0, np.inf, -np.inf, np.nan, 0.5, -0.5, 1.5, 2.5, -2.5, 3.0, 1e-30, -1e-30, 1e30, 88.0, -104.0])
    a = np.concatenate([np.repeat(special, len(special)), near_integers(rng, (4000,)),
                        mod_inputs(rng, (4000,))["in0"]]).astype(np.float32)
    b = np.concatenate([np.tile(special, len(special)), mod_inputs(rng, (4000,))["in1"],
                        mod_inputs(rng, (4000,))["in1"]]).astype(np.float32)
    out = subprocess.run([_host_program(tmp_path)], input=np.stack([a, b], 1).tobytes(), capture_output=True, check=True)
    got = np.frombuffer(out.stdout, np.float32).reshape(-1, 7)
    with np.errstate(all="ignore"):
        for k, fn in enumerate(["abs", "floor", "ceil", "round"]):
            ref = SCALAR_FNS[fn](a)
            assert np.array_equal(got[:, k], ref, equal_nan=True), fn
            assert np.array_equal(np.signbit(got[:, k]), np.signbit(ref)), fn
        for k, fn in ((5, "fmod"), (6, "mod")):
            ref = SCALAR_FNS[fn](a, b)
            same = (got[:, k] == ref) | (np.isnan(got[:, k]) & np.isnan(ref))
            assert same.all(), (fn, a[~same][:4], b[~same][:4], got[~same, k][:4], ref[~same][:4])
            zero = ref == 0
            assert np.array_equal(np.signbit(got[zero, k]), np.signbit(ref[zero])), fn
        ref = SCALAR_FNS["softplus"](a.astype(np.float64))
        fin = np.isfinite(ref)
        assert np.array_equal(np.isnan(got[:, 4]), np.isnan(ref)) and np.array_equal(got[~fin, 4], ref[~fin], equal_nan=True)
        assert (np.abs(got[fin, 4] - ref[fin]) <= 4 * np.spacing(np.abs(ref[fin]).astype(np.float32))).all()


# ---------------------------------------------------------------- epilogues

def conv_act_model(act: str, attrs: dict | None = None) -> onnx.ModelProto:
    """in0 [2, 8, 14, 14] → Conv 3x3 (16 channels, bias, pad 1) → `act` → out, opset 22."""
    rng = np.random.default_rng()
    w = (rng.standard_normal((16, 8, 3, 3)) / math.sqrt(72)).astype(np.float32)
    b = (0.1 * rng.standard_normal(16)).astype(np.float32)
    nodes = [helper.make_node("Conv", ["in0", "w", "b"], ["c"], name="conv_0", pads=[1, 1, 1, 1]),
             helper.make_node(act, ["c"], ["out"], name="act_0", **(attrs or {}))]
    return _two_node_model(nodes, (2, 8, 14, 14), {"w": w, "b": b})


def matmul_act_model(act: str, attrs: dict | None = None) -> onnx.ModelProto:
    """in0 [4, 64, 96] @ w [96, 160] + b → `act` → out, opset 22."""
    rng = np.random.default_rng()
    w = (rng.standard_normal((96, 160)) / math.sqrt(96)).astype(np.float32)
    b = (0.1 * rng.standard_normal(160)).astype(np.float32)
    nodes = [helper.make_node("MatMul", ["in0", "w"], ["m"], name="matmul_0"),
             helper.make_node("Add", ["m", "b"], ["c"], name="bias_0"),
             helper.make_node(act, ["c"], ["out"], name="act_0", **(attrs or {}))]
    return _two_node_model(nodes, (4, 64, 96), {"w": w, "b": b})


def _two_node_model(nodes, shape, inits) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "act", [helper.make_tensor_value_info("in0", TensorProto.FLOAT, list(shape))],
                              [onnx.ValueInfoProto(name="out")],
                              [onnx.numpy_helper.from_array(v, k) for k, v in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 22)])
    inferred = onnx.shape_inference.infer_shapes(model, strict_mode=True)
    model.graph.output[0].CopyFrom(inferred.graph.output[0])
    return model


EPILOGUES = [("conv", "HardSwish", {}), ("conv", "HardSigmoid", {"alpha": 0.25, "beta": 0.4}), ("conv", "Mish", {}),
             ("matmul", "Gelu", {}), ("matmul", "Gelu", {"approximate": "tanh"}), ("matmul", "HardSwish", {}),
             ("matmul", "Softplus", {})]


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
@pytest.mark.parametrize("base,act,attrs", EPILOGUES, ids=[f"{b}_{a}_{'_'.join(map(str, at.values()))}" for b, a, at in EPILOGUES])
def test_activation_is_the_contraction_epilogue(base, act, attrs, precision):
    check_epilogue((conv_act_model if base == "conv" else matmul_act_model)(act, attrs), base, precision)


def check_epilogue(model: onnx.ModelProto, base: str, precision: str) -> None:
    """One kernel, a convolution's or a GEMM's, holding node act_0 as its epilogue, against onnxruntime."""
    plan = stages(model, precision)["plan_memory"]
    assert len(plan.kernels) == 1, [k.family for k in plan.kernels]
    (k,) = plan.kernels
    assert k.family == ("gemm" if base == "matmul" else "conv") and EPILOGUE_RULE in k.rewrites
    assert {"act_0"} <= set(o for op in k.ops for o in op.origin)
    inputs = B.random_inputs(model, seed=int(np.random.default_rng().integers(1 << 30)))
    if precision == "fp16":
        inputs = {n: v.astype(np.float16).astype(np.float32) for n, v in inputs.items()}
    ref = B.run_onnxruntime(model, inputs)["out"]
    got = evaluate_plan_stored(plan, inputs)["out"]
    assert rel_err(got, ref) <= (FP32_RTOL if precision == "fp32" else FP16_RTOL)


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
@pytest.mark.parametrize("model", [lambda: conv_act_model("HardSwish"), lambda: matmul_act_model("Gelu")],
                         ids=["conv_hardswish", "matmul_gelu"])
def test_one_kernel_builds_with_nvcc(model):
    import aicfc
    payload = aicfc.compile(model(), precision="fp16")
    assert len(payload["kernels"]) == 1 and all(len(m["cubin"]) > 0 for m in payload["modules"])


# ---------------------------------------------------------------- folding and refusals

def test_trilu_of_a_constant_folds():
    """GPT-2's TorchScript export (sdpa, transformers 5.24) makes its causal mask as Trilu of a
    constant: folded at import (integer/bool) or by fold_constants (float), never a kernel."""
    from pathlib import Path
    gpt2 = onnx.load(str(Path(__file__).resolve().parent / "fixtures" / "hf" / "gpt2_sdpa_ts_b1.onnx"))
    assert any(n.op_type == "Trilu" for n in gpt2.graph.node)
    assert not any(n.op == "Trilu" for n in stages(gpt2)["fold_constants"].nodes)
    ones = np.random.default_rng().uniform(0.5, 1.5, (9, 9)).astype(np.float32)
    nodes = [helper.make_node("Trilu", ["c", "k"], ["t"], name="trilu_0", upper=0),
             helper.make_node("Mul", ["in0", "t"], ["out"], name="mul_0")]
    model = _two_node_model(nodes, (2, 9, 9), {"c": ones, "k": np.array(1, np.int64)})
    st = stages(model)
    assert any(n.op == "Trilu" for n in st["import"].nodes) and not any(n.op == "Trilu" for n in st["fold_constants"].nodes)
    inputs = B.random_inputs(model, seed=int(np.random.default_rng().integers(1 << 30)))
    ref = B.run_onnxruntime(model, inputs)["out"]
    assert rel_err(evaluate_ir(st["plan_memory"], inputs)["out"], ref) <= FP32_RTOL


def test_trilu_on_run_time_masks_and_integers():
    """bool and int64 tensors at run time (int64 exact to 2**24: it moves through float32)."""
    rng = np.random.default_rng()
    for dtype, np_dtype in ((TensorProto.BOOL, np.bool_), (TensorProto.INT64, np.int64)):
        model = model_of("Trilu", [(2, 6, 11)], {"upper": 0}, inits={"k": np.array(2, np.int64)}, dtype=dtype)
        x = {"in0": (rng.integers(-(1 << 24), 1 << 24, (2, 6, 11)) if np_dtype is np.int64
                     else rng.random((2, 6, 11)) < 0.5).astype(np_dtype)}
        ref = np.tril(x["in0"], 2)
        for name, ir in stages(model).items():
            got = evaluate_ir(ir, x)["out"]
            assert got.dtype == np_dtype and np.array_equal(got, ref), name


REFUSED = [
    (lambda: model_of("Gelu", [(4, 8)], {"approximate": "erf"}), "Gelu approximate='erf' is not one of"),
    (lambda: model_of("Mod", [(4, 8), (4, 8)], {"fmod": 0}, opset=22), "fmod=0 on floats is undefined before opset 28"),
    (lambda: model_of("Trilu", [(4, 8), ()], dtype=TensorProto.INT64), "Trilu's k is computed at run time"),
    # integer Abs, Div and Mod run since integer computes (tests/test_integer_runtime.py)
]


@pytest.mark.parametrize("make,message", REFUSED, ids=[m for _, m in REFUSED])
def test_refused_in_one_line(make, message):
    with pytest.raises(AicfError) as e:
        import_model(make())
    assert message in str(e.value) and "\n" not in str(e.value)


def test_softplus_under_fp16_records_the_approximate_exp():
    plan = stages(model_of("Softplus", [(4, 64)]), "fp16")["plan_memory"]
    assert any(r.rule == "exp, erf => approximate" and r.applied for r in plan.rewrites)
