"""Gather with run-time indices (issue 6): the indirect index of the Lowered IR.

[Note: Indirect index] (aicfc/ir/lowered.py): `load(%emb, [@load(%ids, [i0, i1]), i2])` reads
row ids[i0, i1], wrapped when negative and clamped into the dimension. CPU: golden lowered IR
of an embedding lookup, parse round trip, the verifier, the interpreter after every pass vs
onnxruntime for several Gather variants, BERT's embeddings block (word + position + token-type
embeddings, then LayerNormalization) as one row kernel, nvcc builds at fp32/fp16. GPU (`gpu`
mark): exact at fp32 for pure gathers, <= 1e-2 at fp16 with the LayerNorm.
"""
from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from aicfc.errors import AicfError
from aicfc.frontend.onnx_import import import_model
from aicfc.ir.interp import evaluate_program
from aicfc.ir.lowered import Indirect, Load, Program, parse_program, verify_program
from aicfc.ir.types import TensorType, Value
from aicfc.planner.hardware import load_profile
from tests.onnx_builders import IR_VERSION, OPSET, run_onnxruntime
from tests.test_pipeline import evaluate_ir, evaluate_plan, stages

HW = load_profile("sm_90")
ONNX_TYPES = {np.dtype(np.float32): TensorProto.FLOAT, np.dtype(np.int64): TensorProto.INT64,
              np.dtype(np.int32): TensorProto.INT32}


def _model(nodes, inputs: dict[str, tuple], outputs: dict[str, tuple], inits: dict[str, np.ndarray]):
    """inputs: name -> (dtype, shape)."""
    g = helper.make_graph(nodes, "gather",
                          [helper.make_tensor_value_info(k, ONNX_TYPES[np.dtype(t)], list(s)) for k, (t, s) in inputs.items()],
                          [helper.make_tensor_value_info(k, TensorProto.FLOAT, list(s)) for k, s in outputs.items()],
                          [numpy_helper.from_array(np.asarray(a), k) for k, a in inits.items()])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", OPSET)], ir_version=IR_VERSION,
                             producer_name="aicf-tests")


def _weights(shape, seed):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def embedding_model(v: int = 50, h: int = 16, b: int = 2, s: int = 5, ids_dtype=np.int64):
    """Gather(weight[V, H], input_ids[B, S], axis=0) -> [B, S, H]."""
    return _model([helper.make_node("Gather", ["emb", "input_ids"], ["out"], name="embed", axis=0)],
                  {"input_ids": (ids_dtype, (b, s))}, {"out": (b, s, h)}, {"emb": _weights((v, h), 0)})


def runtime_gather_model(data: tuple, ids: tuple, axis: int):
    """Gather of a run-time float tensor by run-time ids."""
    out = data[:axis] + ids + data[axis + 1:]
    return _model([helper.make_node("Gather", ["x", "ids"], ["out"], name="gather", axis=axis)],
                  {"x": (np.float32, data), "ids": (np.int64, ids)}, {"out": out}, {})


def bert_embeddings_model(v: int = 100, h: int = 64, b: int = 2, s: int = 8, types: int = 2, token_type_input: bool = True):
    """BERT's embeddings: word + position (constant positions) + token-type embeddings, LayerNorm."""
    rng = np.random.default_rng(3)
    inits = {"word": _weights((v, h), 1), "pos": _weights((max(32, s), h), 2), "tt": _weights((types, h), 4),
             "positions": np.arange(s, dtype=np.int64).reshape(1, s),
             "gamma": (1 + 0.1 * rng.standard_normal(h)).astype(np.float32),
             "beta": (0.1 * rng.standard_normal(h)).astype(np.float32)}
    inputs = {"input_ids": (np.int64, (b, s))}
    if token_type_input:
        inputs["token_type_ids"] = (np.int64, (b, s))
    else:
        inits["token_type_ids"] = np.zeros((b, s), np.int64)
    nodes = [helper.make_node("Gather", ["word", "input_ids"], ["we"], name="word_embeddings", axis=0),
             helper.make_node("Gather", ["pos", "positions"], ["pe"], name="position_embeddings", axis=0),
             helper.make_node("Gather", ["tt", "token_type_ids"], ["te"], name="token_type_embeddings", axis=0),
             helper.make_node("Add", ["we", "pe"], ["s1"], name="add_pos"),
             helper.make_node("Add", ["s1", "te"], ["s2"], name="add_type"),
             helper.make_node("LayerNormalization", ["s2", "gamma", "beta"], ["out"], name="ln", axis=-1,
                              epsilon=1e-12)]
    return _model(nodes, inputs, {"out": (b, s, h)}, inits)


def ids_of(shape, n: int, seed: int, negative: bool = False) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return rng.integers(-n if negative else 0, n, size=shape).astype(np.int64)


# ---------------------------------------------------------------- Lowered IR: text, verifier

EMBEDDING_LOWERED = """\
lowered model {
  input %input_ids: i64[2,5]
  weight %emb: f32[50,16] sha256="%s"
  %out: f32[2,5,16] = map load(%emb, [@load(%input_ids, [i0, i1]), i2]) from [embed]
  output %out
}
"""


def test_embedding_lowered_golden_and_round_trip():
    p = stages(embedding_model())["lower"]
    assert isinstance(p, Program)
    digest = p.weights[0].sha256
    assert str(p) == EMBEDDING_LOWERED.replace("%s", digest, 1)
    back = parse_program(str(p), {w.name: w.data for w in p.weights})
    assert back == p
    verify_program(back)


def test_indirect_index_round_trips_on_any_axis_and_scalar_ids():
    for data, ids, axis in (((4, 6, 3), (2, 2), 1), ((5, 7), (), 0), ((3, 4), (6,), 1)):
        p = stages(runtime_gather_model(data, ids, axis))["lower"]
        (op,) = p.ops
        assert any(isinstance(a, Indirect) for a in op.body.index)
        assert parse_program(str(p), {}) == p


def _program(index, ids_type=TensorType("i64", (3,))) -> Program:
    from aicfc.ir.lowered import Compute
    return Program("m", (Value("ids", ids_type), Value("x", TensorType("f32", (10, 4)))), (),
                   (Compute("y", TensorType("f32", (3, 4)), "map", (), Load("x", index)),), ("y",))


def test_verifier_checks_indirect_indices():
    from aicfc.ir.lowered import Affine
    ok = (Indirect(Load("ids", (Affine.var("i0"),))), Affine.var("i1"))
    verify_program(_program(ok))   # no bounds on the indirect dim: the clamp is the bound
    with pytest.raises(AicfError, match="not i64/i32"):
        verify_program(_program(ok, TensorType("f32", (3,))))
    with pytest.raises(AicfError, match="outside"):
        verify_program(_program((Indirect(Load("ids", (Affine.of({"i0": 2}),))), Affine.var("i1"))))
    with pytest.raises(AicfError, match="both guarded and indirect"):
        p = _program(ok)
        op = p.ops[0]
        verify_program(p.replace(ops=(op.__class__(op.out, op.type, "map", (), Load("x", ok, 0.0)),)))
    with pytest.raises(AicfError, match="outside"):
        verify_program(_program((Indirect(Load("ids", (Affine.var("i0"),))), Affine.of({"i1": 2}))))


# ---------------------------------------------------------------- numbers vs onnxruntime, after every pass

VARIANTS = [
    ("embedding", lambda: embedding_model(), {"input_ids": lambda: ids_of((2, 5), 50, 1)}),
    ("embedding_negative", lambda: embedding_model(), {"input_ids": lambda: ids_of((2, 5), 50, 2, negative=True)}),
    ("embedding_i32", lambda: embedding_model(ids_dtype=np.int32),
     {"input_ids": lambda: ids_of((2, 5), 50, 3).astype(np.int32)}),
    ("axis1_2d_ids", lambda: runtime_gather_model((3, 7, 4), (2, 3), 1),
     {"x": lambda: _weights((3, 7, 4), 5), "ids": lambda: ids_of((2, 3), 7, 6, negative=True)}),
    ("axis0_runtime_data", lambda: runtime_gather_model((9, 5), (4,), 0),
     {"x": lambda: _weights((9, 5), 7), "ids": lambda: ids_of((4,), 9, 8, negative=True)}),
    ("last_axis_scalar_ids", lambda: runtime_gather_model((3, 6), (), 1),
     {"x": lambda: _weights((3, 6), 9), "ids": lambda: np.array(-2, np.int64)}),
]


@pytest.mark.parametrize("name,build,feeds", VARIANTS, ids=[v[0] for v in VARIANTS])
def test_gather_every_stage_matches_onnxruntime(name, build, feeds):
    model = build()
    inputs = {k: f() for k, f in feeds.items()}
    ref = run_onnxruntime(model, inputs)["out"]
    for stage, ir in stages(model).items():
        got = evaluate_ir(ir, inputs)["out"]
        np.testing.assert_array_equal(np.asarray(got, np.float32), ref, err_msg=f"after {stage}")


def test_out_of_range_ids_are_clamped_in_the_interpreter():
    p = stages(embedding_model())["lower"]
    ids = np.array([[0, 49, 50, 1000, -1], [-50, -51, -1000, 3, 7]], np.int64)
    emb = p.weights[0].array()
    want = emb[[[0, 49, 49, 49, 49], [0, 0, 0, 3, 7]]]
    np.testing.assert_array_equal(evaluate_program(p, {"input_ids": ids})["out"], want)


def test_constant_ids_out_of_range_into_a_runtime_tensor_are_refused():
    model = _model([helper.make_node("Gather", ["x", "ids"], ["out"], name="g", axis=0)],
                   {"x": (np.float32, (4, 3))}, {"out": (2, 3)}, {"ids": np.array([0, 9], np.int64)})
    with pytest.raises(AicfError, match="outside"):
        import_model(model)


def test_constant_ids_not_in_progression_are_an_indirect_index():
    model = _model([helper.make_node("Gather", ["x", "ids"], ["out"], name="g", axis=0)],
                   {"x": (np.float32, (5, 3))}, {"out": (3, 3)}, {"ids": np.array([4, 0, -2], np.int64)})
    x = _weights((5, 3), 11)
    for ir in stages(model).values():
        if isinstance(ir, Program):
            np.testing.assert_array_equal(evaluate_program(ir, {"x": x})["out"], x[[4, 0, 3]])


# ---------------------------------------------------------------- passes stay conservative


def test_gather_feeding_a_matmul_is_stored_not_folded_into_the_tiles():
    h, n = 16, 32
    model = _model([helper.make_node("Gather", ["emb", "ids"], ["e"], name="embed", axis=0),
                    helper.make_node("MatMul", ["e", "w"], ["out"], name="proj")],
                   {"ids": (np.int64, (2, 5))}, {"out": (2, 5, n)}, {"emb": _weights((50, h), 0), "w": _weights((h, n), 1)})
    s = stages(model)
    plan = s["plan_memory"]
    assert [k.family for k in plan.kernels] == ["pointwise", "gemm"]
    assert any(r.rule.startswith("load(map(x))") and not r.applied and "tile-compatible" in r.reason
               for r in s["inline_producers"].rewrites)
    ids = ids_of((2, 5), 50, 4)
    np.testing.assert_allclose(evaluate_plan(plan, {"ids": ids})["out"], run_onnxruntime(model, {"ids": ids})["out"],
                               rtol=1e-5, atol=1e-5)


def test_ids_through_a_view_are_not_composed():
    model = _model([helper.make_node("Reshape", ["input_ids", "shape"], ["flat"], name="view"),
                    helper.make_node("Gather", ["emb", "flat"], ["out"], name="embed", axis=0)],
                   {"input_ids": (np.int64, (2, 5))}, {"out": (10, 16)},
                   {"emb": _weights((50, 16), 0), "shape": np.array([10], np.int64)})
    s = stages(model)
    ids = ids_of((2, 5), 50, 9)
    ref = run_onnxruntime(model, {"input_ids": ids})["out"]
    np.testing.assert_array_equal(evaluate_plan(s["plan_memory"], {"input_ids": ids})["out"], ref)


# ---------------------------------------------------------------- BERT's embeddings block


@pytest.mark.parametrize("token_type_input", [True, False])
def test_bert_embeddings_block_is_one_row_kernel(token_type_input):
    model = bert_embeddings_model(token_type_input=token_type_input)
    s = stages(model)
    plan = s["plan_memory"]
    assert len(plan.kernels) == 1 and plan.kernels[0].family == "row_reduce", [k.family for k in plan.kernels]
    inputs = {"input_ids": ids_of((2, 8), 100, 5)}
    if token_type_input:
        inputs["token_type_ids"] = ids_of((2, 8), 2, 6)
    ref = run_onnxruntime(model, inputs)["out"]
    np.testing.assert_allclose(evaluate_plan(plan, inputs)["out"], ref, rtol=1e-4, atol=1e-4)


def test_integer_inputs_stay_integer_under_every_precision():
    for precision in ("fp32", "tf32", "fp16", "bf16"):
        plan = stages(bert_embeddings_model(), precision)["plan_memory"]
        assert {v.name: v.type.dtype for v in plan.inputs} == {"input_ids": "i64", "token_type_ids": "i64"}


def test_int64_inputs_flow_through_the_bundle_unconverted():
    """The payload's int64 input lives in an int64 buffer under fp16 (no host conversion), and
    aicf-run's random inputs for it are valid ids in [0, RANDOM_IDS)."""
    from aicf_run.bundle import Bundle
    from aicf_run.convert import to_device
    from aicf_run.inputs import RANDOM_IDS, random_inputs
    import shutil
    import aicfc
    if shutil.which("nvcc") is None:
        pytest.skip("nvcc not found")
    payload = aicfc.compile(bert_embeddings_model(), target="sm_90", precision="fp16")
    buffers = payload["buffers"]
    for item in payload["inputs"]:
        assert item["dtype"] == "int64" and buffers[item["buffer"]]["dtype"] == "int64"
    arrays = random_inputs(Bundle.from_payload(payload), np.random.default_rng(0))
    for a in arrays.values():
        assert a.dtype == np.int64 and a.min() >= 0 and a.max() < RANDOM_IDS
        assert to_device(a, "int64") is a


# ---------------------------------------------------------------- nvcc builds


NVCC_MODELS = [("embedding", lambda: embedding_model(v=1000, h=768, b=2, s=128)),
               ("axis1", lambda: runtime_gather_model((3, 7, 40), (2, 3), 1)),
               ("bert_embeddings", lambda: bert_embeddings_model(v=1000, h=768, b=2, s=16))]


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
@pytest.mark.parametrize("name,build", NVCC_MODELS, ids=[n for n, _ in NVCC_MODELS])
def test_nvcc_builds(name, build, precision):
    import shutil
    if shutil.which("nvcc") is None:
        pytest.skip("nvcc not found")
    import aicfc
    payload = aicfc.compile(build(), target="sm_90", precision=precision)
    assert payload


# ---------------------------------------------------------------- on the GPU


GPU_PURE = [("embedding", lambda: embedding_model(v=1000, h=768, b=2, s=128),
             {"input_ids": lambda: ids_of((2, 128), 1000, 1, negative=True)}),
            ("axis1_2d_ids", VARIANTS[3][1], VARIANTS[3][2]),
            ("axis0_runtime_data", VARIANTS[4][1], VARIANTS[4][2]),
            ("last_axis_scalar_ids", VARIANTS[5][1], VARIANTS[5][2]),
            ("embedding_i32", VARIANTS[2][1], VARIANTS[2][2])]


@pytest.mark.gpu
@pytest.mark.parametrize("name,build,feeds", GPU_PURE, ids=[g[0] for g in GPU_PURE])
def test_gpu_gather_exact_at_fp32(name, build, feeds, gpu_device):
    import aicfc
    from tests.conftest import run_payload
    model = build()
    inputs = {k: f() for k, f in feeds.items()}
    got = run_payload(aicfc.compile(model, target=gpu_device.arch), inputs, gpu_device)
    np.testing.assert_array_equal(got["out"], run_onnxruntime(model, inputs)["out"])


@pytest.mark.gpu
@pytest.mark.parametrize("precision,tol", [("fp32", 1e-4), ("fp16", 1e-2)])
def test_gpu_bert_embeddings(precision, tol, gpu_device):
    import aicfc
    from tests.conftest import run_payload
    from tests.test_pipeline import rel_err
    model = bert_embeddings_model(v=1000, h=768, b=2, s=64)
    inputs = {"input_ids": ids_of((2, 64), 1000, 2), "token_type_ids": ids_of((2, 64), 2, 3)}
    got = run_payload(aicfc.compile(model, target=gpu_device.arch, precision=precision), inputs, gpu_device)
    assert rel_err(got["out"], run_onnxruntime(model, inputs)["out"]) <= tol
