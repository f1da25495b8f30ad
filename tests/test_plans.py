"""Several plans in one bundle (format version 3, [Note: plans] in aicf_run/plans.py).

Without a GPU: the layout (weights stored once, checked by size), the round trip, the schema's
refusals, `aicfc compile`'s shape sets and `explain`, the plan lookup and its one-line refusal
(exit 2 before the GPU is touched), and the PlanSet executor on the fake GPU of
tests/test_run_cli.py, checked exactly against numpy. On the GPU (`gpu`): each plan of a
compiled two-plan bundle against onnxruntime, on fresh random inputs, arena poisoned first.
"""
from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from click.testing import CliRunner
from onnx import TensorProto, helper, numpy_helper

import aicf_run
from aicf_run.bundle import HEADER, Bundle, read_bundle
from aicf_run.errors import RunError
from aicf_run.plans import NoPlanError, plan_views, select_plan
from aicf_run.weights import inlined
from aicfc.artifact import write_bundle
from aicfc.artifact.plans import merge_plans
from aicfc.cli import main as aicfc_main
from aicfc.driver import compile_plans
from tests.test_bundle_format import WEIGHT, make_payload, sha
from tests.test_run_cli import assert_user_error, run_cli

C = np.array([[0.5, -1.0, 2.0]], np.float32)   # plan 1's own weight


def small_plan() -> dict[str, Any]:
    """make_payload's model at x [1, 3]: y = x + w[0] + c, by the fake "add" over 3 elements.

    It reads the same w (same bytes, so one blob with plan 0's) and a weight c of its own."""
    p = make_payload()
    p["inputs"] = [{"name": "x", "dtype": "float32", "shape": [1, 3], "buffer": 0}]
    p["outputs"] = [{"name": "y", "dtype": "float32", "shape": [1, 3], "buffer": 1}]
    p["buffers"] = [
        {"id": 0, "name": "x", "region": "arena", "offset": 0, "nbytes": 12, "dtype": "float32", "shape": [1, 3]},
        {"id": 1, "name": "y", "region": "arena", "offset": 256, "nbytes": 12, "dtype": "float32", "shape": [1, 3]},
        {"id": 2, "name": "c", "region": "weights", "offset": 0, "nbytes": 12, "dtype": "float32", "shape": [1, 3]},
        {"id": 3, "name": "w", "region": "weights", "offset": 256, "nbytes": 24, "dtype": "float32", "shape": [2, 3]},
    ]
    p["memory"] = {**p["memory"], "arena_bytes": 512, "weights_bytes": 280}
    p["weights"] = [{"buffer": 2, "data": C.tobytes(), "sha256": sha(C.tobytes())},
                    {"buffer": 3, "data": WEIGHT.tobytes(), "sha256": sha(WEIGHT.tobytes())}]
    p["kernels"][0] = {**p["kernels"][0], "block": [3, 1, 1], "args": [0, 3, 2, 1]}
    return p


def two_plans() -> dict[str, Any]:
    return merge_plans([make_payload(), small_plan()])


def test_merge_shares_a_weight_by_content_and_keeps_its_own() -> None:
    payload = two_plans()
    assert payload["format_version"] == 3 and len(payload["plans"]) == 2
    assert [b["sha256"] for b in payload["weights"]] == [sha(WEIGHT.tobytes()), sha(C.tobytes())]
    first, second = payload["plans"]
    assert first["weights"] == [{"buffer": 2, "blob": 0}]
    assert second["weights"] == [{"buffer": 2, "blob": 1}, {"buffer": 3, "blob": 0}]
    # The shared blob has one offset in the one weights region; c lies after it.
    assert first["buffers"][2]["offset"] == second["buffers"][3]["offset"] == 0
    assert second["buffers"][2]["offset"] == 256
    assert first["memory"]["weights_bytes"] == second["memory"]["weights_bytes"] == 512
    Bundle.from_payload(payload)   # the runtime accepts it


def test_round_trip_stores_each_weight_once(tmp_path: Path) -> None:
    payload = two_plans()
    path = tmp_path / "two.aicf"
    write_bundle(payload, path)
    raw = path.read_bytes()
    assert HEADER.unpack(raw[:HEADER.size])[1] == 3
    bundle = read_bundle(path)
    assert len(bundle.plans) == 2 and bundle.plans[0].payload == bundle.payload
    assert bundle.section_bytes == WEIGHT.nbytes + C.nbytes   # w once, c once
    for view, plan in zip(plan_views(payload), bundle.plans):
        assert inlined(plan) == view
    # A single plan is still written as version 2, byte for byte what it always was.
    one = tmp_path / "one.aicf"
    write_bundle(make_payload(), one)
    assert HEADER.unpack(one.read_bytes()[:HEADER.size])[1] == 2
    assert read_bundle(one).plans == (read_bundle(one),)


def _shared_at_two_offsets(p: dict) -> None:
    p["plans"][1]["buffers"][3]["offset"] = 384


def _overlap(p: dict) -> None:
    p["plans"][1]["buffers"][2]["offset"] = 8


def _same_shapes(p: dict) -> None:
    p["plans"][1] = copy.deepcopy(p["plans"][0])


def _unused_blob(p: dict) -> None:
    p["weights"].append({"data": b"\0" * 4, "sha256": sha(b"\0" * 4)})


def _other_input_name(p: dict) -> None:
    p["plans"][1]["inputs"][0]["name"] = "z"


def _bad_blob_index(p: dict) -> None:
    p["plans"][1]["weights"][0]["blob"] = 9


def _weights_bytes_differ(p: dict) -> None:
    p["plans"][1]["memory"]["weights_bytes"] = 1024


@pytest.mark.parametrize("mutate,fragment", [
    (_shared_at_two_offsets, "blob 0 is at weights offset 384, but at 0"),
    (_overlap, "overlap in the weights region"),
    (_same_shapes, "repeat plans[0]'s"),
    (_unused_blob, "weights[2]: is read by no plan"),
    (_other_input_name, "plans[1].inputs: names and dtypes"),
    (_bad_blob_index, "plans[1].weights[0]: must be {buffer, blob}"),
    (_weights_bytes_differ, "plans[1].memory.weights_bytes"),
])
def test_layout_refusals(mutate: Any, fragment: str) -> None:
    payload = two_plans()
    mutate(payload)
    with pytest.raises(RunError) as err:
        Bundle.from_payload(payload)
    assert fragment in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(ValueError, match="refusing to write an invalid bundle"):
        write_bundle(payload, "/nonexistent/never.aicf")


def test_lookup_is_exact_and_its_refusal_names_every_plan() -> None:
    plans = [p["inputs"] for p in two_plans()["plans"]]
    assert select_plan(plans, {"x": (2, 3)}) == 0
    assert select_plan(plans, {"x": (1, 3)}) == 1
    with pytest.raises(NoPlanError) as err:
        select_plan(plans, {"x": (3, 3)})   # no nearest plan, no padding
    assert str(err.value).startswith("no plan for input shapes x=3x3: this bundle has 2 plan(s), for x=2x3; x=1x3")


# --- the executor on the fake GPU (tests/test_run_cli.py) ---


def test_plan_set_runs_each_plan_over_weights_uploaded_once(tmp_path: Path, fake_gpu: Any) -> None:
    path = tmp_path / "two.aicf"
    write_bundle(two_plans(), path)
    one = tmp_path / "one.aicf"
    write_bundle(make_payload(), one)
    single = aicf_run.load(one)
    single_uploads = fake_gpu.copy_kinds.count("htod")
    assert single_uploads == 1 and [p.name for p in single.plans] == ["x=2x3"]
    single.device.close()

    fake_gpu.copy_kinds.clear()
    ex = aicf_run.load(path)
    assert fake_gpu.copy_kinds.count("htod") == 2   # w once for both plans, then c
    assert [(p.index, p.name, p.shapes) for p in ex.plans] == [(0, "x=2x3", {"x": (2, 3)}),
                                                               (1, "x=1x3", {"x": (1, 3)})]
    rng = np.random.default_rng(5)
    for _ in range(2):   # plans in turn over the one arena, each time on fresh inputs
        x2 = rng.standard_normal((2, 3)).astype(np.float32)
        x1 = rng.standard_normal((1, 3)).astype(np.float32)
        ex.poison()
        y2 = ex.run({"x": x2})["y"]
        np.testing.assert_allclose(y2, x2.astype(np.float64) + WEIGHT, rtol=1e-6, atol=1e-6)
        ex.poison()
        y1 = ex.run({"x": x1})["y"]
        np.testing.assert_allclose(y1, x1.astype(np.float64) + WEIGHT[0] + C, rtol=1e-6, atol=1e-6)
    assert ex.select({"x": x1}).name == "x=1x3"
    np.testing.assert_array_equal(ex.run({"x": x1}, plan="x=1x3")["y"], y1)
    with pytest.raises(RunError, match=r"input 'x' has shape \[1, 3\], expected \[2, 3\]"):
        ex.run({"x": x1}, plan=0)
    with pytest.raises(NoPlanError, match="no plan for input shapes x=3x3"):
        ex.run({"x": np.ones((3, 3), np.float32)})
    with pytest.raises(RunError, match="no plan 'x=9x9': this bundle's plans are 0: x=2x3; 1: x=1x3"):
        ex.plan("x=9x9")
    device = ex.device
    ex.close()
    with pytest.raises(RunError, match="closed"):
        ex.run({"x": x1})
    device.close()


def test_timing_a_plan_on_another_plans_arena_is_refused(tmp_path: Path, fake_gpu: Any) -> None:
    """[Note: one arena, several plans]: after plan 0 ran, the arena holds its data; timing plan 1 there would read
    that as plan 1's inputs, so bench, profile and the timeline refuse in one line until plan 1 has run."""
    path = tmp_path / "two.aicf"
    write_bundle(two_plans(), path)
    ex = aicf_run.load(path)
    rng = np.random.default_rng(7)
    ex.bench(2, graph=False, plan=1)   # nothing has run: the arena holds no other plan's data
    ex.run({"x": rng.standard_normal((2, 3)).astype(np.float32)})
    message = (r"^cannot {what} plan x=1x3: the arena it shares holds what plan x=2x3 left there, which x=1x3 would "
               r"read as its inputs; run plan x=1x3 once on its own inputs first \(run\(inputs, plan='x=1x3'\)\), "
               r"then time it$")
    for call, what in ((lambda: ex.bench(2, graph=False, plan=1), "time"), (lambda: ex.profile(plan=1), "profile"),
                       (lambda: ex.plan(1).timeline(rounds=1), "take the timeline of")):
        with pytest.raises(RunError, match=message.format(what=what)):
            call()
    ex.bench(2, graph=False, plan=0)   # plan 0's own data: allowed
    ex.run({"x": rng.standard_normal((1, 3)).astype(np.float32)})
    assert ex.bench(2, graph=False, plan=1).launches is not None
    with pytest.raises(RunError, match="^cannot time plan x=2x3: the arena it shares holds what plan x=1x3 left"):
        ex.bench(2, graph=False, plan=0)
    device = ex.device
    ex.close()
    device.close()


def test_aicf_run_picks_the_plan_by_the_inputs_shapes(tmp_path: Path, fake_gpu: Any) -> None:
    path = tmp_path / "two.aicf"
    write_bundle(two_plans(), path)
    x1 = np.random.default_rng(3).standard_normal((1, 3)).astype(np.float32)
    np.save(tmp_path / "x.npy", x1)
    result = run_cli(path, "--input", tmp_path / "x.npy", "--output-dir", tmp_path / "out")
    assert result.exit_code == 0, (result.output, result.exception)
    assert "plan 1 of 2: x=1x3" in result.stdout
    np.testing.assert_allclose(np.load(tmp_path / "out" / "y.npy"), x1.astype(np.float64) + WEIGHT[0] + C,
                               rtol=1e-6, atol=1e-6)


@pytest.mark.usefixtures("no_pycuda")
def test_aicf_run_refuses_unmatched_shapes_in_one_line_before_the_gpu(tmp_path: Path) -> None:
    path = tmp_path / "two.aicf"
    write_bundle(two_plans(), path)
    np.save(tmp_path / "x.npy", np.ones((3, 3), np.float32))
    line = assert_user_error(run_cli(path, "--input", tmp_path / "x.npy"),
                             "no plan for input shapes x=3x3", "for x=2x3; x=1x3")
    assert "PyCUDA" not in line
    np.save(tmp_path / "x1.npy", np.ones((1, 3), np.float32))
    assert_user_error(run_cli(path, "--input", tmp_path / "x1.npy", "--plan", "0"),
                      "--plan '0' is the plan for x=2x3, but the inputs' shapes are x=1x3's")
    assert_user_error(run_cli(path, "--bench", "3", "--plan", "7"), "no plan '7'")


# --- compiled with aicfc (nvcc, no GPU) ---


def mlp_model(features: int = 256, seed: int = 0) -> onnx.ModelProto:
    """y = softmax(relu(x @ w1 + b1 + 0.25 * row index) @ w2), x [n, features].

    The row index (Range over Shape(x)[0]) folds into a constant of n rows: a weight whose
    bytes differ per shape set, next to w1, b1, w2, which every plan shares."""
    rng = np.random.default_rng(seed)
    w1 = (rng.standard_normal((features, features)) / np.sqrt(features)).astype(np.float32)
    b1 = rng.standard_normal(features).astype(np.float32)
    w2 = (rng.standard_normal((features, 64)) / np.sqrt(features)).astype(np.float32)
    nodes = [
        helper.make_node("Shape", ["x"], ["shape"]),
        helper.make_node("Gather", ["shape", "zero"], ["rows"], axis=0),
        helper.make_node("Range", ["zero", "rows", "one"], ["pos_i"]),
        helper.make_node("Cast", ["pos_i"], ["pos_f"], to=TensorProto.FLOAT),
        helper.make_node("Unsqueeze", ["pos_f", "axis1"], ["pos"]),
        helper.make_node("Mul", ["pos", "scale"], ["pos_s"]),
        helper.make_node("MatMul", ["x", "w1"], ["h"]),
        helper.make_node("Add", ["h", "b1"], ["hb"]),
        helper.make_node("Add", ["hb", "pos_s"], ["hp"]),
        helper.make_node("Relu", ["hp"], ["r"]),
        helper.make_node("MatMul", ["r", "w2"], ["z"]),
        helper.make_node("Softmax", ["z"], ["y"], axis=-1),
    ]
    inits = [numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(b1, "b1"),
             numpy_helper.from_array(w2, "w2"), numpy_helper.from_array(np.array(0, np.int64), "zero"),
             numpy_helper.from_array(np.array(1, np.int64), "one"),
             numpy_helper.from_array(np.array([1], np.int64), "axis1"),
             numpy_helper.from_array(np.array(0.25, np.float32), "scale")]
    graph = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", features])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 64])], inits)
    # IR version 8, as tests/onnx_builders.py: the GPU machine's onnxruntime reads IR <= 13
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    onnx.checker.check_model(model)
    return model


def aicfc(*args: Any) -> Any:
    return CliRunner().invoke(aicfc_main, [str(a) for a in args])


@pytest.fixture(scope="module")
def compiled(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The MLP compiled three ways: plans for 8 and 1 rows in one bundle, and each alone."""
    folder = tmp_path_factory.mktemp("plans")
    model = folder / "mlp.onnx"
    onnx.save(mlp_model(), model)
    paths = {"model": model, "two": folder / "two.aicf", "a": folder / "a.aicf", "b": folder / "b.aicf"}
    for key, shapes in (("two", ["x=8x256", "x=1x256"]), ("a", ["x=8x256"]), ("b", ["x=1x256"])):
        args = [a for s in shapes for a in ("--shape", s)]
        result = aicfc("compile", model, "-o", paths[key], "-q", "--no-register-check", *args)
        assert result.exit_code == 0, (result.output, result.exception)
    return paths


def test_two_plan_bundle_stores_the_weights_once(compiled: dict[str, Path]) -> None:
    two, a, b = (read_bundle(compiled[k]) for k in ("two", "a", "b"))
    assert [p.inputs[0]["shape"] for p in two.plans] == [[8, 256], [1, 256]]
    # Every weight of either plan alone is in the two-plan section exactly once: the shared
    # ones once, the folded row index (8 rows; plan b folds it away) once.
    blobs = {(w["sha256"], w["nbytes"]) for w in two.stored["weights"]}
    assert len(blobs) == len(two.stored["weights"])
    alone = {(w["sha256"], w["nbytes"]) for w in a.weights} | {(w["sha256"], w["nbytes"]) for w in b.weights}
    assert blobs == alone
    shared = {(w["sha256"], w["nbytes"]) for w in a.weights} & {(w["sha256"], w["nbytes"]) for w in b.weights}
    assert sum(n for _, n in shared) > 300_000   # w1, b1, w2: what a second copy would cost
    assert two.section_bytes == sum(n for _, n in alone) == a.section_bytes + b.section_bytes - sum(n for _, n in shared)
    # The file: plan a's bundle plus plan b's code and metadata, not plan b's weights again.
    size = {k: compiled[k].stat().st_size for k in ("two", "a", "b")}
    expected = size["a"] + (size["b"] - b.section_bytes)
    assert abs(size["two"] - expected) < 2048, (size, expected)
    assert size["two"] < size["a"] + size["b"] - 300_000


def test_two_plan_bundle_round_trips(compiled: dict[str, Path], tmp_path: Path) -> None:
    payload = compile_plans(compiled["model"], [["x=8x256"], ["x=1x256"]], check_registers=False)
    write_bundle(payload, tmp_path / "again.aicf")
    bundle = read_bundle(tmp_path / "again.aicf")
    for view, plan in zip(plan_views(payload), bundle.plans, strict=True):
        assert inlined(plan) == view
    # Compiling is deterministic: the same bundle as the CLI's, byte for byte.
    assert (tmp_path / "again.aicf").read_bytes() == compiled["two"].read_bytes()


def test_explain_lists_every_plan(compiled: dict[str, Path]) -> None:
    result = aicfc("explain", compiled["two"])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0].startswith("2 plans, one per set of input shapes, over one copy of the weights")
    assert lines[1].startswith("plan 0: x=8x256: ") and lines[2].startswith("plan 1: x=1x256: ")
    assert "=== plan 0 of 2: x=8x256 ===" in lines and "=== plan 1 of 2: x=1x256 ===" in lines
    assert result.output.count("inputs: x: float32[8, 256]") == 1
    assert result.output.count("inputs: x: float32[1, 256]") == 1
    data = json.loads(aicfc("explain", compiled["two"], "--json").output)
    assert [(p["index"], p["name"], p["shapes"]) for p in data["plans"]] == [
        (0, "x=8x256", {"x": [8, 256]}), (1, "x=1x256", {"x": [1, 256]})]
    assert data["kernels"] == data["plans"][0]["kernels"] and data["plans"][1]["kernels"]
    ir = aicfc("explain", compiled["two"], "--ir", "high").output
    assert "# plan 1 of 2: x=1x256" in ir and "input %x: f32[1,256]" in ir


def test_compile_shape_set_errors_are_one_line(compiled: dict[str, Path], tmp_path: Path) -> None:
    model = compiled["model"]
    sets = tmp_path / "sets.txt"
    sets.write_text("# rows\nx=8x256\n\nx=1x256  # one row\n")
    out = tmp_path / "f.aicf"
    result = aicfc("compile", model, "-o", out, "-q", "--no-register-check", "--shape-sets", sets)
    assert result.exit_code == 0, result.output
    assert out.read_bytes() == compiled["two"].read_bytes()
    for args, fragment in (
            (["--shape", "x=8x256", "--shape-sets", sets], "not both"),
            (["--shape", "x=8x256", "--shape", "x=8x256"], "shape set 2 (x=8x256) repeats set 1"),
            (["--shape", "x=8x256", "--shape", "x=0x1"], "--shape 'x=0x1'")):
        result = aicfc("compile", model, "-o", tmp_path / "bad.aicf", *args)
        lines = result.stderr.splitlines()
        assert result.exit_code == 2 and len(lines) == 1 and fragment in lines[0], result.stderr
    assert not (tmp_path / "bad.aicf").exists()


def test_a_shape_sets_line_pins_its_plan_alone(compiled: dict[str, Path], tmp_path: Path) -> None:
    """`pin:[NODE:]KEY=VALUE` words on a --shape-sets line: a --pin of that line's plan only."""
    sets = tmp_path / "sets.txt"
    sets.write_text("x=8x256 pin:BM=64\nx=1x256\n")
    out = tmp_path / "p.aicf"
    result = aicfc("compile", compiled["model"], "-o", out, "-q", "--no-register-check", "--shape-sets", sets)
    assert result.exit_code == 0, result.output
    data = json.loads(aicfc("explain", out, "--json").output)
    free = json.loads(aicfc("explain", compiled["two"], "--json").output)

    def tiles(plan: dict) -> list[int]:
        return [k["params"]["BM"] for k in plan["kernels"] if k["family"] == "gemm"]
    assert tiles(free["plans"][0]) and 64 not in tiles(free["plans"][0])
    assert set(tiles(data["plans"][0])) == {64}
    assert data["plans"][1]["kernels"] == free["plans"][1]["kernels"]   # plan 1 as without the pin
    # a bad pin word is a one-line error naming the word; the file's sets are not compiled
    sets.write_text("x=8x256 pin:unit\nx=1x256\n")
    result = aicfc("compile", compiled["model"], "-o", tmp_path / "bad.aicf", "--shape-sets", sets)
    assert result.exit_code == 2 and "shape set word 'pin:unit'" in result.stderr and len(result.stderr.splitlines()) == 1
    assert not (tmp_path / "bad.aicf").exists()


def test_an_oversized_shape_sets_file_is_not_read(compiled: dict[str, Path], tmp_path: Path, monkeypatch) -> None:
    from aicfc import cli
    monkeypatch.setattr(cli, "MAX_SHAPE_SETS_BYTES", 16)
    sets = tmp_path / "sets.txt"
    sets.write_text("x=8x256\nx=1x256\nx=2x256\n")
    result = aicfc("compile", compiled["model"], "-o", tmp_path / "big.aicf", "--shape-sets", sets)
    assert result.exit_code == 2 and "over 16 bytes" in result.stderr and len(result.stderr.splitlines()) == 1
    assert not (tmp_path / "big.aicf").exists()


# --- on the GPU ---


@pytest.mark.gpu
@pytest.mark.parametrize("precision,rtol", [("fp32", 1e-4), ("fp16", 1e-2)])
def test_each_plan_matches_onnxruntime_on_the_gpu(tmp_path: Path, gpu_device: Any, precision: str,
                                                  rtol: float) -> None:
    from aicf_run.plan_set import PlanSet
    from tests.onnx_builders import run_onnxruntime
    from tests.test_pipeline import rel_err

    model = mlp_model()
    path = tmp_path / "two.aicf"
    payload = compile_plans(model, [["x=8x256"], ["x=1x256"], ["x=33x256"]], target=gpu_device.arch,
                            precision=precision)
    write_bundle(payload, path)
    bundle = read_bundle(path)
    ex = PlanSet(bundle, gpu_device)
    try:
        assert [p.name for p in ex.plans] == ["x=8x256", "x=1x256", "x=33x256"]
        rng = np.random.default_rng(11)
        for rows in (8, 1, 33, 1, 8):   # every plan, then back: they share the arena
            x = rng.standard_normal((rows, 256)).astype(np.float32)
            ex.poison()
            got = ex.run({"x": x})["y"]
            ref = run_onnxruntime(model, {"x": x})["y"]
            err = rel_err(got, ref)
            assert err <= rtol, f"{precision} plan x={rows}x256: rel err {err:.2e}"
        with pytest.raises(NoPlanError, match="no plan for input shapes x=2x256"):
            ex.run({"x": np.ones((2, 256), np.float32)})
    finally:
        ex.close()


@pytest.mark.gpu
def test_aicf_run_cli_runs_each_plan_on_the_gpu(tmp_path: Path, gpu_device: Any) -> None:
    from tests.test_run_cli import _run_subprocess

    model = tmp_path / "mlp.onnx"
    onnx.save(mlp_model(), model)
    arch = gpu_device.arch
    path = tmp_path / "two.aicf"
    result = aicfc("compile", model, "-o", path, "--target", arch, "--shape", "x=8x256", "--shape", "x=1x256")
    assert result.exit_code == 0, result.output
    for rows in (1, 8):
        x = np.random.default_rng(rows).standard_normal((rows, 256)).astype(np.float32)
        np.save(tmp_path / f"x{rows}.npy", x)
        done = _run_subprocess(path, "--input", tmp_path / f"x{rows}.npy", "--output-dir", tmp_path / f"o{rows}",
                               "--check", model)
        assert done.returncode == 0 and "PASS" in done.stdout, (done.stdout, done.stderr)
        assert f"x={rows}x256" in done.stdout
    np.save(tmp_path / "x2.npy", np.ones((2, 256), np.float32))
    done = _run_subprocess(path, "--input", tmp_path / "x2.npy")
    lines = done.stderr.splitlines()
    assert done.returncode == 2 and len(lines) == 1 and "no plan for input shapes x=2x256" in lines[0]


# --- damaged version-3 files: one-line errors, never a traceback ---


def _paths(tree: Any, prefix: tuple = ()) -> list[tuple]:
    found = [prefix]
    if isinstance(tree, dict):
        for key, value in tree.items():
            found += _paths(value, (*prefix, key))
    elif isinstance(tree, list):
        for i, value in enumerate(tree):
            found += _paths(value, (*prefix, i))
    return found


def _read_everything(path: Path) -> None:
    """What a file reaches before the GPU: the reader, the plan lookup and inputs, explain."""
    from aicf_run.inputs import check_inputs, plan_for, random_inputs
    from aicfc.explain import explain_plans_json, explain_plans_text

    bundle = read_bundle(path)
    for plan in bundle.plans:
        inputs = random_inputs(plan)
        check_inputs(inputs, plan_for(inputs, bundle))
    views = [plan.payload for plan in bundle.plans]
    json.dumps(explain_plans_json(views))
    explain_plans_text(views, bundle.section_bytes)


def test_damaged_plans_are_refused_in_one_line(tmp_path: Path) -> None:
    import msgpack

    from aicfc.errors import AicfError
    good = tmp_path / "good.aicf"
    write_bundle(two_plans(), good)
    raw = good.read_bytes()
    length = HEADER.unpack(raw[:HEADER.size])[3]
    tree = msgpack.unpackb(raw[HEADER.size:HEADER.size + length], raw=False)
    section = raw[HEADER.size + length:]
    paths = _paths(tree)
    rng = np.random.default_rng(19)
    junk = [None, -1, 0, 1, 2**40, "", "x", b"", [], {}, [0], {"blob": 0}, 3.5, True]
    path = tmp_path / "bad.aicf"
    refused = 0
    for i in range(400):
        damaged = copy.deepcopy(tree)
        where = paths[rng.integers(1, len(paths))]
        parent = damaged
        for key in where[:-1]:
            parent = parent[key]
        if rng.random() < 0.3 and isinstance(parent, dict):
            del parent[where[-1]]
        else:
            parent[where[-1]] = junk[rng.integers(len(junk))]
        data = msgpack.packb(damaged, use_bin_type=True)
        body = data + section
        if i % 4 == 0:   # flip a byte of the section or the payload, then reseal
            flip = rng.integers(len(body))
            body = body[:flip] + bytes([body[flip] ^ 0x5A]) + body[flip + 1:]
        import hashlib
        path.write_bytes(HEADER.pack(raw[:8], 3, 0, len(data), hashlib.sha256(body[:len(data)]).digest()) + body)
        try:
            _read_everything(path)
        except (RunError, AicfError) as err:
            assert "\n" not in str(err) and str(err), (where, err)
            refused += 1
    assert refused > 300   # nearly every damage is caught (some junk is still valid)


FIXTURES = Path(__file__).parent / "fixtures"


def test_committed_v2_and_v3_fixtures_still_read_and_run(fake_gpu: Any) -> None:
    # Written by tests/fixtures/make_bundle_fixtures.py at the commit that added version 3.
    assert inlined(read_bundle(FIXTURES / "bundle_v2.aicf")) == make_payload(two_inputs=True)
    v3 = read_bundle(FIXTURES / "bundle_v3.aicf")
    for view, plan in zip(plan_views(two_plans()), v3.plans, strict=True):
        assert inlined(plan) == view
    ex = aicf_run.load(FIXTURES / "bundle_v3.aicf")
    x = np.random.default_rng(23).standard_normal((1, 3)).astype(np.float32)
    ex.poison()
    np.testing.assert_allclose(ex.run({"x": x})["y"], x.astype(np.float64) + WEIGHT[0] + C, rtol=1e-6, atol=1e-6)
    ex.device.close()
