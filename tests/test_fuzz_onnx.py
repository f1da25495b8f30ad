"""Fuzzed ONNX models (tests/fuzz_harness.py): a short derandomized run of each model target,
and one regression test per failure class the fuzzers found, through `aicfc compile` (exit 2,
one line, no output file). `make fuzz` runs the same targets for minutes each."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from tests import fuzz_harness as F
from tests import onnx_builders as B
from tests.test_cli import aicfc, assert_user_error


@pytest.fixture(scope="module")
def models() -> dict[str, onnx.ModelProto]:
    return F.seed_models()


def test_fuzz_onnx_bytes(models: dict[str, onnx.ModelProto], tmp_path: Path) -> None:
    F.hypothesis_run(F.model_bytes_mutator(models), F.check_model_bytes, 150, tmp_path)


def test_fuzz_onnx_tree(models: dict[str, onnx.ModelProto], tmp_path: Path) -> None:
    F.hypothesis_run(F.model_tree_mutator(models), F.check_model_bytes, 150, tmp_path)


def test_seeds_are_valid(models: dict[str, onnx.ModelProto], tmp_path: Path) -> None:
    from aicfc.frontend.onnx_import import import_model, load_model
    for name, model in models.items():
        path = B.save(model, tmp_path / f"{name}.onnx")
        assert import_model(load_model(path), {}).nodes


# --- regressions: what the fuzzers found, each exit 2 with one line and no bundle ---


def _compile(tmp_path: Path, model: onnx.ModelProto, *needles: str) -> None:
    path = tmp_path / "model.onnx"
    path.write_bytes(model.SerializeToString())   # onnx.save would refuse some of these
    out = tmp_path / "out.aicf"
    assert_user_error(aicfc("compile", str(path), "-o", str(out)), *needles)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.onnx"]   # no bundle, no temp file


def _add_model(weight: onnx.TensorProto) -> onnx.ModelProto:
    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "w"], ["y"], name="add")], "g",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [4])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [4])], [weight])
    return B.make_model(graph)


def _weight() -> onnx.TensorProto:
    return numpy_helper.from_array(np.arange(4, dtype=np.float32), "w")


def test_initializer_data_longer_than_dims(tmp_path: Path) -> None:
    # Was: ValueError "cannot reshape array of size 32 into shape (5,)" (the checker passes it).
    w = _weight()
    w.dims[0] = 3   # 16 bytes of data for 3 floats: the checker only refuses too few
    _compile(tmp_path, _add_model(w), "initializer 'w' is malformed")


def test_initializer_unknown_data_type(tmp_path: Path) -> None:
    # Was: KeyError from onnx.helper.tensor_dtype_to_np_dtype.
    model = _add_model(_weight())
    model.graph.initializer[0].data_type = 33
    _compile(tmp_path, model)


def test_input_unknown_elem_type(tmp_path: Path) -> None:
    # Was: KeyError in _input_type.
    model = _add_model(_weight())
    model.graph.input[0].type.tensor_type.elem_type = 6641434
    _compile(tmp_path, model)


def test_reference_attribute_outside_a_function(tmp_path: Path) -> None:
    # Was: ValueError "Cannot get value of reference attribute".
    model = B.single_op_model("Softmax", [(2, 3)], {"axis": -1})
    model.graph.node[0].attribute[0].ref_attr_name = "axis"
    _compile(tmp_path, model)


@pytest.mark.parametrize("location, offset, needle", [
    ("weights.bin", "x", "offset 'x' is not a non-negative integer"),        # was ValueError
    ("weights.bin", "-8", "offset '-8' is not a non-negative integer"),
    ("weights.bin\0x", "0", "is not a usable path"),                          # was ValueError
    ("a" * 300, "0", "is not a usable path"),                                  # was OSError
])
def test_external_data_fields(tmp_path: Path, location: str, offset: str, needle: str) -> None:
    (tmp_path / "weights.bin").write_bytes(bytes(64))
    w = _weight()
    w.ClearField("raw_data")
    w.data_location = onnx.TensorProto.EXTERNAL
    for key, value in [("location", location), ("offset", offset), ("length", "16")]:
        entry = w.external_data.add()
        entry.key, entry.value = key, value
    path = tmp_path / "model.onnx"
    path.write_bytes(_add_model(w).SerializeToString())
    out = aicfc("compile", str(path), "-o", str(tmp_path / "out.aicf"))
    assert_user_error(out, needle)
    assert not (tmp_path / "out.aicf").exists()


def _const_input_model(op: str, const: np.ndarray, y_shape: list) -> onnx.ModelProto:
    """`op(x, c)` with x a [2, 4] float input and `c` an initializer."""
    c = numpy_helper.from_array(const, "c")
    graph = helper.make_graph(
        [helper.make_node(op, ["x", "c"], ["y"], name="n")], "g",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2, 4])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, y_shape)], [c])
    return B.make_model(graph)


@pytest.mark.parametrize("op, const, y_shape, what", [
    # Was: ValueError "cannot convert float NaN to integer" (fuzzed: a ReduceSum's axes set to NaN).
    ("ReduceSum", np.array([np.nan], np.float32), [2, 1], "the axes of ReduceSum must be an integer tensor"),
    ("ReduceSum", np.array([1.0], np.float32), [2, 1], "the axes of ReduceSum must be an integer tensor"),
    ("Reshape", np.array([np.nan, 2], np.float32), [4, 2], "the shape of Reshape must be an integer tensor"),
    ("Unsqueeze", np.array([np.inf], np.float32), [1, 2, 4], "the axes of Unsqueeze must be an integer tensor"),
    ("Expand", np.array([2, np.nan], np.float32), [2, 4], "the shape of Expand must be an integer tensor"),
    ("Tile", np.array([np.nan, 1], np.float32), [2, 4], "the repeats of Tile must be an integer tensor"),
    ("CumSum", np.array([], np.int64), [2, 4], "the axis of CumSum must hold one value, not 0"),
])
def test_constant_integer_inputs_must_be_integers(tmp_path: Path, op: str, const: np.ndarray, y_shape: list,
                                                  what: str) -> None:
    _compile(tmp_path, _const_input_model(op, const, y_shape), what)


def _max_then_column_sum(shape: tuple[int, int], max_output: bool) -> onnx.ModelProto:
    """exp(x - rowmax) / colsum(exp(x - rowmax)): the softmax seed with its sum's axes mutated
    from -1 to 0 (a valid model: the sum runs down the columns)."""
    model = B.decomposed_softmax_model(shape, max_output=max_output)
    (axes,) = [t for t in model.graph.initializer if t.name == "axes"]
    axes.CopyFrom(numpy_helper.from_array(np.array([0], np.int64), "axes"))
    return model


@pytest.mark.parametrize("max_output", [True, False])
def test_row_pass_never_reads_a_value_computed_from_itself(max_output: bool) -> None:
    # Was: StopIteration in form_kernels._topological (fuzzed). The row pass of the Div took the
    # row max as its statistic but also read the column sum, which is computed from that max:
    # two kernels each needing the other first. The pass is now declined; the plan runs in
    # order and matches float64 numpy.
    from tests.test_pipeline import evaluate_plan, rel_err, stages
    model = _max_then_column_sum((4, 16), max_output)
    plan = stages(model)["plan_memory"]
    declined = [r for r in plan.rewrites if r.rule == "row stats + map => one row pass" and not r.applied]
    assert any("computed from 'mx'" in r.reason for r in declined), declined
    x = np.random.default_rng().standard_normal((4, 16)).astype(np.float32)
    e = np.exp(x.astype(np.float64) - x.max(axis=-1, keepdims=True))
    got = evaluate_plan(plan, {"in0": x})
    assert rel_err(got["out"], e / e.sum(axis=0, keepdims=True)) < 1e-5
    if max_output:
        assert rel_err(got["mx"], x.max(axis=-1, keepdims=True).astype(np.float64)) == 0


@pytest.mark.gpu
def test_gpu_row_pass_declined_for_a_column_sum(gpu_device) -> None:
    import aicfc
    from tests.conftest import run_payload
    from tests.test_pipeline import rel_err
    model = _max_then_column_sum((5, 300), True)
    x = np.random.default_rng().standard_normal((5, 300)).astype(np.float32)
    got = run_payload(aicfc.compile(model, target=gpu_device.arch), {"in0": x}, gpu_device)
    e = np.exp(x.astype(np.float64) - x.max(axis=-1, keepdims=True))
    assert rel_err(got["out"], e / e.sum(axis=0, keepdims=True)) < 1e-5


def test_layer_norm_axis_out_of_range_with_statistics_outputs(tmp_path: Path) -> None:
    # Was: MemoryError under the fuzzer's limit; without one, `aicfc compile` built a tuple of
    # 2**31 ones (16 GB, 87 s) before refusing: the Mean output's shape was sized by the axis
    # before the axis was checked.
    model = B.layer_norm_model((4, 32))
    node = model.graph.node[0]
    node.output.append("mean")
    (axis,) = [a for a in node.attribute if a.name == "axis"] or [node.attribute.add()]
    axis.CopyFrom(helper.make_attribute("axis", -(2**31)))
    _compile(tmp_path, model, "LayerNormalization axis -2147483648 out of range for rank 2")


def test_reshape_zero_past_the_input_rank(tmp_path: Path) -> None:
    # Was: IndexError (fuzzed): a 0 in Reshape's shape copies the input's dimension at its
    # position, and the input [2, 4] has no third one.
    _compile(tmp_path, _const_input_model("Reshape", np.array([4, 2, 0], np.int64), [4, 2, 1]),
             "Reshape shape [4, 2, 0] copies (0) a dimension past the input's rank 2")
