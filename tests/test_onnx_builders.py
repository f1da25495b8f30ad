"""Keep the test-model builders honest: every model is valid ONNX and runs in onnxruntime."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest

from tests.onnx_builders import (
    GARBAGE_KINDS,
    OP_CASES,
    SUPPORTED_OPS,
    external_data_outside_model,
    random_inputs,
    run_onnxruntime,
    save,
    single_op_model,
    symbolic_dim_model,
    unsupported_op_model,
    write_garbage,
)

pytest.importorskip("onnxruntime")


def _declared_shape(vi: onnx.ValueInfoProto) -> tuple[int, ...]:
    return tuple(d.dim_value for d in vi.type.tensor_type.shape.dim)


def test_case_ids_unique() -> None:
    ids = [case_id for case_id, _ in OP_CASES]
    assert len(ids) == len(set(ids))


def test_cases_cover_exactly_supported_ops() -> None:
    ops = {node.op_type for _, build in OP_CASES for node in build().graph.node}
    assert ops == SUPPORTED_OPS


def test_odd_shapes_covered() -> None:
    shapes = {
        _declared_shape(vi) for _, build in OP_CASES for vi in build().graph.input
    }
    for odd in [(7, 100, 257), (1, 1), (3, 5), (33, 65)]:
        assert odd in shapes


@pytest.mark.parametrize("case_id, build", OP_CASES, ids=[c for c, _ in OP_CASES])
def test_op_case_valid_and_runs(case_id: str, build, tmp_path: Path) -> None:
    model = build()
    onnx.checker.check_model(model, full_check=True)
    assert all(node.name for node in model.graph.node)

    inputs = random_inputs(model, seed=0)
    outputs = run_onnxruntime(model, inputs)
    assert set(outputs) == {"out"}
    out = outputs["out"]
    assert out.dtype == np.float32
    assert out.shape == _declared_shape(model.graph.output[0])
    assert np.isfinite(out).all()

    # The on-disk path gives the same answer.
    path = save(model, tmp_path / f"{case_id}.onnx")
    np.testing.assert_array_equal(run_onnxruntime(path, inputs)["out"], out)


def test_random_inputs_skip_initializers_and_are_seeded() -> None:
    model = single_op_model("MatMul", [(3, 5), None],
                            initializers={"in1": np.ones((5, 7), dtype=np.float32)})
    a = random_inputs(model, seed=7)
    assert set(a) == {"in0"}
    assert a["in0"].dtype == np.float32 and a["in0"].shape == (3, 5)
    np.testing.assert_array_equal(a["in0"], random_inputs(model, seed=7)["in0"])
    assert not np.array_equal(a["in0"], random_inputs(model, seed=8)["in0"])


def test_single_op_model_explicit_output_shape() -> None:
    model = single_op_model("Relu", [(3, 5)], output_shape=(3, 5))
    onnx.checker.check_model(model, full_check=True)
    assert _declared_shape(model.graph.output[0]) == (3, 5)


def test_single_op_model_matches_numpy() -> None:
    model = single_op_model("Gemm", [(5, 3), (7, 5), (7,)],
                            attrs={"transA": 1, "transB": 1, "alpha": 0.5, "beta": 2.0})
    x = random_inputs(model, seed=3)
    expected = 0.5 * (x["in0"].T.astype(np.float64) @ x["in1"].T.astype(np.float64)) + 2.0 * x["in2"]
    np.testing.assert_allclose(run_onnxruntime(model, x)["out"], expected, rtol=1e-5, atol=1e-5)


def test_unsupported_op_model() -> None:
    model = unsupported_op_model()
    onnx.checker.check_model(model, full_check=True)
    unsupported = {n.op_type for n in model.graph.node} - SUPPORTED_OPS
    assert unsupported == {"EyeLike", "NonMaxSuppression"}
    assert all(n.name for n in model.graph.node)
    outputs = run_onnxruntime(model, random_inputs(model, seed=0))
    assert outputs["hard"].shape == (4, 10)


def test_symbolic_dim_model() -> None:
    model = symbolic_dim_model()
    onnx.checker.check_model(model, full_check=True)
    assert model.graph.input[0].type.tensor_type.shape.dim[0].dim_param == "batch"
    with pytest.raises(ValueError, match="symbolic"):
        random_inputs(model, seed=0)
    x = np.random.default_rng(0).standard_normal((2, 64)).astype(np.float32)
    assert run_onnxruntime(model, {"x": x})["out"].shape == (2, 32)


def test_external_data_outside_model(tmp_path: Path) -> None:
    path = external_data_outside_model(tmp_path)
    assert path.parent != tmp_path and (tmp_path / "secret.bin").is_file()
    model = onnx.load(str(path), load_external_data=False)
    tensor = model.graph.initializer[0]
    assert tensor.data_location == onnx.TensorProto.EXTERNAL
    assert {e.key: e.value for e in tensor.external_data}["location"] == "../secret.bin"


@pytest.mark.parametrize("kind", GARBAGE_KINDS)
def test_write_garbage_is_rejected(kind: str, tmp_path: Path) -> None:
    path = write_garbage(tmp_path / f"{kind}.onnx", kind)
    with pytest.raises(Exception):
        # "empty" parses as an empty ModelProto; validation is what rejects it.
        onnx.checker.check_model(onnx.load(str(path)))


def test_write_garbage_unknown_kind(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        write_garbage(tmp_path / "x.onnx", "nonsense")
