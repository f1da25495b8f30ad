"""State on the GPU (issue 19, item 3): ScatterND, the `updated_input_state` property, the state
region of the bundle, and the executor's persistent state buffers.

The decoder fixture (tests/fixtures/kvcache/llama_kv.onnx, written by make_kvcache.py) is a
2-layer Llama-architecture model whose K/V caches are explicit inputs past_* [1, 2, 64, 16] and
outputs present_* (index_copy at cache_position, exported as ScatterND between transposes). Every
numeric check is against onnxruntime running the same ONNX with the cache passed explicitly.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import aicfc
from aicfc.errors import AicfError
from aicfc.explain import explain_json, explain_text
from aicfc.frontend.onnx_import import import_model
from aicfc.ir.decision import parse_plan
from aicfc.passes.canonicalize import canonicalize
from aicfc.passes.declare_state import STATE_RULE
from aicfc.passes.fold_cache_writes import FOLD_RULE
from aicfc.passes.pipeline import PIPELINE, Options, run_pipeline
from aicfc.planner.hardware import load_profile
from benchmarks.light_models import onnxruntime_reference
from tests.test_pipeline import evaluate_ir, rel_err

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "kvcache" / "llama_kv.onnx"
CACHE = ["past_k_0", "past_v_0", "past_k_1", "past_v_1"]
PRESENT = ["present_k_0", "present_v_0", "present_k_1", "present_v_1"]
CACHE_SHAPE = (1, 2, 64, 16)
TOLERANCE = {"fp32": 1e-4, "fp16": 1e-2}


def shapes(seq: int) -> dict[str, tuple[int, ...]]:
    return {"input_ids": (1, seq), "cache_position": (seq,)}


def step_feeds(rng: np.random.Generator, start: int, seq: int, cache: dict[str, np.ndarray]) -> dict:
    return {"input_ids": rng.integers(0, 64, (1, seq)).astype(np.int64),
            "cache_position": np.arange(start, start + seq, dtype=np.int64), **cache}


def random_cache(rng: np.random.Generator) -> dict[str, np.ndarray]:
    return {n: rng.standard_normal(CACHE_SHAPE).astype(np.float32) for n in CACHE}


# The fixtures' decode attention on the split-KV unit. At their 64-128 cache slots the cost model
# prefers a tile unit (one key tile, where a split attention's fixed chain costs ~7 us on an H200
# whatever its chunk: benchmarks/results/tune_attention_split_session13_h200.txt), so the tests of
# what the split unit does to a decode step (the folded cache writes, the reads before the wait) pin it.
SPLIT = {"SPLITS": 2}


def plan_of(model: onnx.ModelProto, seq_shapes: dict, precision: str = "fp32", pin: dict | None = None,
            profile: str | None = None):
    """The model's plan for sm_90, with the bundled GPU profile `profile` (e.g. "h200") where given."""
    opts = Options("sm_90", load_profile("sm_90", profile), precision, tuple(sorted((pin or {}).items())))
    return run_pipeline(import_model(model, seq_shapes), opts).plan


# ---------------------------------------------------------------- ScatterND


def scatter_model(data: tuple[int, ...], ids: tuple[int, ...], upd: tuple[int, ...], extra_reader: bool = False,
                  reduction: str | None = None) -> onnx.ModelProto:
    attrs = {} if reduction is None else {"reduction": reduction}
    nodes = [helper.make_node("ScatterND", ["x", "ids", "upd"], ["y"], name="sc", **attrs)]
    outs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, data)]
    if extra_reader:   # x read after the update too: it cannot be updated in place
        nodes.append(helper.make_node("Neg", ["x"], ["z"], name="neg"))
        outs.append(helper.make_tensor_value_info("z", TensorProto.FLOAT, data))
    g = helper.make_graph(nodes, "scatter", [
        helper.make_tensor_value_info("x", TensorProto.FLOAT, data),
        helper.make_tensor_value_info("ids", TensorProto.INT64, ids),
        helper.make_tensor_value_info("upd", TensorProto.FLOAT, upd)], outs)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)])


def distinct_ids(rng: np.random.Generator, dims: tuple[int, ...], q: tuple[int, ...]) -> np.ndarray:
    """Index tuples without repeats (ONNX leaves duplicates undefined), some written negative."""
    count = int(np.prod(q))
    flat = rng.choice(int(np.prod(dims)), size=count, replace=False)
    tuples = np.stack(np.unravel_index(flat, dims), axis=-1).astype(np.int64)
    negative = rng.random(tuples.shape) < 0.3
    tuples = np.where(negative, tuples - np.asarray(dims), tuples)
    return tuples.reshape(q + (len(dims),))


@pytest.mark.parametrize("data,q,k", [((5, 3), (2,), 1), ((4, 6, 3), (2, 3), 2), ((7, 2, 9), (1,), 1),
                                      ((3, 4), (5,), 2)])
def test_scatter_nd_matches_onnxruntime_at_every_stage(data, q, k):
    rng = np.random.default_rng(k * 100 + len(q))
    upd = q + data[k:]
    model = scatter_model(data, q + (k,), upd)
    inputs = {"x": rng.standard_normal(data).astype(np.float32), "ids": distinct_ids(rng, data[:k], q),
              "upd": rng.standard_normal(upd).astype(np.float32)}
    ref = onnxruntime_reference(model, inputs)["y"]
    ir = import_model(model)
    opts = Options("sm_90", load_profile("sm_90"))
    for stage in [None] + list(PIPELINE):
        if stage is not None:
            ir = stage.run(ir, opts)
        got = evaluate_ir(ir, inputs)["y"]
        assert np.array_equal(got, ref), stage.name if stage else "import"
    # x is an input, y an output, and nothing else reads x: state, one scatter kernel
    assert [k_.family for k_ in ir.kernels] == ["scatter"] and [(s.input, s.output) for s in ir.state] == [("x", "y")]


def test_scatter_nd_reductions_are_refused_by_name():
    with pytest.raises(AicfError, match="ScatterND with reduction='add' is not supported"):
        import_model(scatter_model((4, 3), (2, 1), (2, 3), reduction="add"))


def test_out_of_range_ids_write_nothing():
    """The documented run-time rule (onnxruntime refuses such ids): the row is left as it was."""
    model = scatter_model((4, 3), (2, 1), (2, 3))
    x = np.random.default_rng(3).standard_normal((4, 3)).astype(np.float32)
    upd = np.random.default_rng(4).standard_normal((2, 3)).astype(np.float32)
    ids = np.array([[1], [9]], dtype=np.int64)
    lowered = run_pipeline(import_model(model), Options("sm_90", load_profile("sm_90"))).lowered
    got = evaluate_ir(lowered, {"x": x, "ids": ids, "upd": upd})["y"]
    want = x.copy()
    want[1] = upd[0]
    assert np.array_equal(got, want)


def test_an_input_read_after_the_update_is_not_state():
    model = scatter_model((4, 3), (2, 1), (2, 3), extra_reader=True)
    plan = plan_of(model, {})
    assert plan.state == () and "scatter" not in {k.family for k in plan.kernels}
    # the functional form runs instead: y is written apart, x stays intact for the Neg
    payload = aicfc.compile(model)
    assert [i["name"] for i in payload["inputs"]] == ["x", "ids", "upd"] and payload.get("state") == []


# ---------------------------------------------------------------- the decoder fixture


def test_fixture_is_small_and_exports_index_copy_as_scatter_nd():
    assert FIXTURE.stat().st_size < 300_000
    model = onnx.load(str(FIXTURE))
    assert [n.op_type for n in model.graph.node].count("ScatterND") == 4
    assert [i.name for i in model.graph.input] == ["input_ids", "cache_position"] + CACHE
    assert [o.name for o in model.graph.output] == ["logits"] + PRESENT


def test_canonicalize_folds_the_transposes_around_index_copy():
    g = canonicalize(import_model(onnx.load(str(FIXTURE)), shapes(4)))
    scatters = [n for n in g.nodes if n.op == "ScatterND"]
    assert [n.output for n in scatters] == PRESENT
    assert all(n.inputs[0] in CACHE and n.attr["axes"] == (2,) for n in scatters)


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
@pytest.mark.parametrize("start,seq", [(0, 8), (11, 1), (63, 1), (20, 5)])
def test_decoder_plan_matches_onnxruntime(start, seq, precision):
    """The Decision-applied IR (the scatter kernels' functional form) on a random cache."""
    model = onnx.load(str(FIXTURE))
    rng = np.random.default_rng(start * 7 + seq)
    feeds = step_feeds(rng, start, seq, random_cache(rng))
    ref = onnxruntime_reference(model, feeds)
    got = evaluate_ir(plan_of(model, shapes(seq), precision), feeds)
    for name in ["logits"] + PRESENT:
        assert rel_err(got[name], ref[name]) <= TOLERANCE[precision], name


@pytest.mark.parametrize("seq", [8, 1])
def test_decoder_state_in_the_bundle(seq):
    payload = aicfc.compile(onnx.load(str(FIXTURE)), precision="fp16", shapes=shapes(seq), pin=SPLIT if seq == 1 else None)
    assert [i["name"] for i in payload["inputs"]] == ["input_ids", "cache_position"]
    assert [o["name"] for o in payload["outputs"]] == ["logits"]
    state = payload["state"]
    assert [(s["name"], s["output"]) for s in state] == list(zip(CACHE, PRESENT))
    buffers = payload["buffers"]
    for s in state:
        a, b = buffers[s["buffer"]], buffers[s["output_buffer"]]
        assert a["region"] == b["region"] == "state" and a["offset"] == b["offset"]
        assert s["dtype"] == "float16" and s["shape"] == list(CACHE_SHAPE)
        # the new rows (2 heads x seq x 16 halves) and, each at most as many bytes, the ids and
        # the operands of their values (the K projection, the rotary tables): never the cache
        rows = 2 * seq * 16 * 2
        assert rows <= s["write_bytes"] <= 5 * rows and s["copy_bytes"] == 2 * (2 * 64 * 16 * 2) + s["write_bytes"]
    assert payload["memory"]["state_bytes"] == 4 * 2 * 64 * 16 * 2
    scatters = [k for k in payload["kernels"] if k["family"] == "scatter"]
    writers = [k for k in payload["kernels"] if STATE_RULE in k["rewrites"]]
    if seq > 1:
        assert len(scatters) == len(writers) == 4
        # every element of the new rows has a thread, `vec` consecutive ones each (16-byte vectors of halves)
        assert all(k["params"]["vec"] == 8 for k in scatters)
        assert all(k["grid"][0] * k["block"][0] * k["params"]["vec"] >= 2 * seq * 16 for k in scatters)
    else:   # a decode step: each layer's split-KV attention writes its K and V rows (passes/fold_cache_writes.py)
        assert not scatters and len(writers) == 2
        assert all(k["family"] == "attention" and FOLD_RULE in k["rewrites"] for k in writers)
        assert {s["kernel"] for s in payload["decisions"] if s["kind"] == "state"} == {k["name"] for k in writers}
    assert sum(d["kind"] == "state" for d in payload["decisions"]) == 4
    text = explain_text(payload)
    assert "state: 4 tensor(s) kept on the device across runs" in text and "past_k_0 -> present_k_0" in text
    assert [s["name"] for s in explain_json(payload)["state"]] == CACHE


def test_decision_text_round_trips_with_state():
    plan = plan_of(onnx.load(str(FIXTURE)), shapes(1))
    weights = {w.name: w.data for w in plan.weights}
    assert len(plan.state) == 4 and parse_plan(str(plan), weights) == plan


def test_scatter_kernel_source_writes_rows_only():
    payload = aicfc.compile(onnx.load(str(FIXTURE)), shapes=shapes(1))
    source = next(m["source"] for m in payload["modules"] if "in-place scatter" in m["source"])
    assert "in-place scatter of 1 updates x 32 elements into state present_k_0" in source
    assert "outside the axis: no write" in source


# ---------------------------------------------------------------- the executor (a fake GPU)


def state_payload() -> dict:
    """The fake "add" payload of test_bundle_format plus a state s: a second kernel computes
    s' = s + x into the same state buffer, so after n runs s = n·x."""
    from tests.test_bundle_format import make_payload
    p = make_payload()
    p["buffers"] += [{"id": 3, "name": "s", "region": "state", "offset": 0, "nbytes": 24, "dtype": "float32",
                      "shape": [2, 3]},
                     {"id": 4, "name": "s_next", "region": "state", "offset": 0, "nbytes": 24, "dtype": "float32",
                      "shape": [2, 3]}]
    p["memory"]["state_bytes"] = 256
    p["state"] = [{"name": "s", "output": "s_next", "dtype": "float32", "shape": [2, 3], "buffer": 3,
                   "output_buffer": 4, "kernel": "add_1", "write_bytes": 24, "copy_bytes": 48, "reason": "test"}]
    second = dict(p["kernels"][0], name="add_1", args=[3, 0, 4])
    p["kernels"].append(second)
    return p


@pytest.fixture
def state_executor(fake_gpu):
    from aicf_run.bundle import Bundle
    from aicf_run.device import open_device
    from aicf_run.executor import Executor
    fake_gpu.memset_d8 = lambda pointer, value, n: fake_gpu.write(int(pointer), bytes([value]) * n)
    ex = Executor(Bundle.from_payload(state_payload()), open_device(0))
    yield ex
    ex.device.close()


def test_executor_keeps_state_across_runs(state_executor):
    ex = state_executor
    x = np.random.default_rng(5).standard_normal((2, 3)).astype(np.float32)
    assert np.array_equal(ex.state["s"], np.zeros((2, 3), np.float32))   # zeros at load
    for n in range(1, 4):
        out = ex.run({"x": x})
        assert list(out) == ["y"]                                          # state is not returned
        np.testing.assert_allclose(ex.state["s"], n * x, rtol=1e-6)
    ex.reset_state()
    assert np.array_equal(ex.state["s"], np.zeros((2, 3), np.float32))
    start = np.random.default_rng(6).standard_normal((2, 3)).astype(np.float32)
    ex.set_state({"s": start})
    ex.run({"x": x})
    np.testing.assert_allclose(ex.state["s"], start + x, rtol=1e-6)


def test_executor_refuses_bad_state(state_executor):
    from aicf_run.errors import RunError
    with pytest.raises(RunError, match="'t' is not a state tensor"):
        state_executor.set_state({"t": np.zeros((2, 3), np.float32)})
    with pytest.raises(RunError, match=r"state 's' is float32 \[2, 3\]"):
        state_executor.set_state({"s": np.zeros((3, 2), np.float32)})
    with pytest.raises(RunError, match=r"state 's' is float32 \[2, 3\]"):
        state_executor.run({"x": np.zeros((2, 3), np.float32), "s": np.zeros((3, 2), np.float32)})
    with pytest.raises(RunError, match="state 's' given as list: run takes a state tensor as a numpy array"):
        state_executor.run({"x": np.zeros((2, 3), np.float32), "s": [[0.0] * 3] * 2})


def test_run_given_a_state_writes_it_first_and_returns_it_updated(state_executor):
    """[Note: state]: a model fed every input it declares runs as exported (the state's value in,
    its output out); without it the state stays on the GPU and is not returned."""
    ex = state_executor
    rng = np.random.default_rng(9)
    x, start = rng.standard_normal((2, 3)).astype(np.float32), rng.standard_normal((2, 3)).astype(np.float32)
    out = ex.run({"x": x, "s": start.astype(np.float64)})           # converted to the stored float32
    assert list(out) == ["y", "s_next"]
    np.testing.assert_allclose(out["s_next"], start + x, rtol=1e-6)
    np.testing.assert_allclose(ex.state["s"], start + x, rtol=1e-6)
    out = ex.run({"x": x})
    assert list(out) == ["y"]
    np.testing.assert_allclose(ex.state["s"], start + 2 * x, rtol=1e-6)
    before = ex.state["s"]
    from aicf_run.errors import RunError
    with pytest.raises(RunError):                                     # a bad input: the state is not written
        ex.run({"x": np.zeros((3, 2), np.float32), "s": start})
    np.testing.assert_array_equal(ex.state["s"], before)


def test_bfloat16_state_is_read_and_written_as_float32(fake_gpu):
    """numpy has no bfloat16: `state` gives float32 values and set_state takes any float array."""
    from aicf_run.bundle import Bundle
    from aicf_run.device import open_device
    from aicf_run.errors import RunError
    from aicf_run.executor import Executor
    fake_gpu.memset_d8 = lambda pointer, value, n: fake_gpu.write(int(pointer), bytes([value]) * n)
    p = state_payload()
    for buf in p["buffers"][3:]:
        buf.update(dtype="bfloat16", nbytes=12)
    p["state"][0]["dtype"] = "bfloat16"
    ex = Executor(Bundle.from_payload(p), open_device(0))
    try:
        values = np.array([[1.0, -2.5, 3.25], [0.5, 1e-3, -7.0]], np.float64)
        ex.set_state({"s": values})
        got = ex.state["s"]
        assert got.dtype == np.float32
        np.testing.assert_allclose(got, values, rtol=2 ** -8)
        with pytest.raises(RunError, match=r"state 's' is bfloat16 \[2, 3\], got int64"):
            ex.set_state({"s": np.zeros((2, 3), np.int64)})
    finally:
        ex.device.close()


@pytest.mark.parametrize("mutate,message", [
    (lambda p: p["memory"].pop("state_bytes"), "region"),
    (lambda p: p["state"][0].update(buffer=0), "not a state buffer"),
    (lambda p: p["buffers"][4].update(offset=256), "not the same bytes|exceeds"),
    (lambda p: p["state"][0].pop("kernel"), "kernel"),
    (lambda p: p["state"].append(dict(p["state"][0])), "repeated"),
])
def test_bad_state_records_are_refused(mutate, message):
    from aicf_run.bundle import Bundle
    from aicf_run.errors import RunError
    p = state_payload()
    Bundle.from_payload(p)
    mutate(p)
    with pytest.raises(RunError, match=message):
        Bundle.from_payload(p)


def _state_model(path: Path, w: np.ndarray, shift: float = 0.0) -> Path:
    """y = x + w and s_next = s + x (+ shift): the ONNX model of state_payload."""
    from onnx import numpy_helper
    nodes = [helper.make_node("Add", ["x", "w"], ["y"], name="add_0"),
             helper.make_node("Add", ["s", "x"], ["sx"], name="add_1"),
             helper.make_node("Add", ["sx", "c"], ["s_next"], name="add_2")]
    f = [2, 3]
    g = helper.make_graph(nodes, "state", [helper.make_tensor_value_info("x", TensorProto.FLOAT, f),
                                           helper.make_tensor_value_info("s", TensorProto.FLOAT, f)],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, f),
                           helper.make_tensor_value_info("s_next", TensorProto.FLOAT, f)],
                          [numpy_helper.from_array(w, "w"), numpy_helper.from_array(np.float32(shift), "c")])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), str(path))
    return path


def test_cli_check_feeds_and_compares_the_state(tmp_path, fake_gpu):
    """aicf-run --check gives onnxruntime the state before the run and checks the state after."""
    from aicfc.artifact import write_bundle
    from tests.test_bundle_format import WEIGHT
    from tests.test_run_cli import run_cli
    fake_gpu.memset_d8 = lambda pointer, value, n: fake_gpu.write(int(pointer), bytes([value]) * n)
    bundle = tmp_path / "state.aicf"
    write_bundle(state_payload(), bundle)
    np.save(tmp_path / "x.npy", np.random.default_rng(8).standard_normal((2, 3)).astype(np.float32))
    good = run_cli(bundle, "--input", tmp_path / "x.npy", "--output-dir", tmp_path, "--check",
                   _state_model(tmp_path / "good.onnx", WEIGHT))
    assert good.exit_code == 0, good.output
    assert "s_next" in good.stdout and "FAIL" not in good.stdout
    bad = run_cli(bundle, "--input", tmp_path / "x.npy", "--output-dir", tmp_path, "--check",
                  _state_model(tmp_path / "bad.onnx", WEIGHT, shift=1.0))
    assert bad.exit_code == 1 and "FAIL" in bad.stdout
    # the state given with --input: written before the run, its update saved and checked
    start = np.random.default_rng(10).standard_normal((2, 3)).astype(np.float32)
    np.save(tmp_path / "s.npy", start)
    given = run_cli(bundle, "--input", tmp_path / "x.npy", "--input", f"s={tmp_path / 's.npy'}", "--output-dir",
                    tmp_path, "--check", tmp_path / "good.onnx")
    assert given.exit_code == 0, given.output
    np.testing.assert_allclose(np.load(tmp_path / "s_next.npy"), start + np.load(tmp_path / "x.npy"), rtol=1e-6)
    unknown = run_cli(bundle, "--input", tmp_path / "x.npy", "--input", f"t={tmp_path / 's.npy'}")
    assert unknown.exit_code == 2 and "no input named 't' (inputs: x, s)" in unknown.output


def test_fold_scatter_axes_permutes_the_updates():
    """Transpose_q(ScatterND(Transpose_p(x), ids, upd)) with q = p⁻¹ and the remaining axes out
    of x's order: the folded ScatterND writes axis p[0] of x and reads the updates transposed."""
    p, q = (2, 0, 3, 1), (1, 3, 0, 2)
    xs = (2, 3, 4, 5)
    t_shape = tuple(xs[d] for d in p)                         # (4, 2, 5, 3)
    upd_shape = (2,) + t_shape[1:]
    nodes = [helper.make_node("Transpose", ["x"], ["t"], perm=list(p), name="t"),
             helper.make_node("ScatterND", ["t", "ids", "upd"], ["s"], name="sc"),
             helper.make_node("Transpose", ["s"], ["y"], perm=list(q), name="back")]
    g = helper.make_graph(nodes, "fold", [
        helper.make_tensor_value_info("x", TensorProto.FLOAT, xs),
        helper.make_tensor_value_info("ids", TensorProto.INT64, (2, 1)),
        helper.make_tensor_value_info("upd", TensorProto.FLOAT, upd_shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, xs)])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)])
    rng = np.random.default_rng(9)
    inputs = {"x": rng.standard_normal(xs).astype(np.float32), "ids": np.array([[3], [-4]], np.int64),
              "upd": rng.standard_normal(upd_shape).astype(np.float32)}
    ref = onnxruntime_reference(model, inputs)["y"]
    folded = canonicalize(import_model(model))
    assert [n.op for n in folded.nodes] == ["Transpose", "ScatterND"]
    assert folded.nodes[1].attr["axes"] == (2,) and folded.nodes[1].inputs[0] == "x"
    assert np.array_equal(evaluate_ir(folded, inputs)["y"], ref)
    plan = plan_of(model, {})
    assert np.array_equal(evaluate_ir(plan, inputs)["y"], ref) and [s.input for s in plan.state] == ["x"]


# (state shape, index tuples' shape, ids a tuple, vector width): rows of 16 floats as 4-float vectors, rows of 6 as
# 2-float ones, ids that index the innermost axis (element by element), two indexed axes over rows of 32
SCATTER_CASES = [((6, 16), (3,), 1, 4), ((5, 4, 6), (2, 2), 1, 2), ((4, 6), (3,), 2, 1), ((7, 2, 32), (2,), 2, 4)]


@pytest.mark.parametrize("data,q,k,vec", SCATTER_CASES)
def test_scatter_vector_width(data, q, k, vec):
    """[Note: a scatter's rows as vectors]: the widest vector the state's innermost axis allows,
    none where the ids index that axis; the kernel stores whole vectors."""
    payload = aicfc.compile(scatter_model(data, q + (k,), q + data[k:]))
    (kern,) = [x for x in payload["kernels"] if x["family"] == "scatter"]
    assert kern["params"]["vec"] == vec
    assert kern["grid"][0] * kern["block"][0] * vec >= int(np.prod(q + data[k:]))
    source = next(m["source"] for m in payload["modules"] if kern["symbol"] in m["source"])
    assert ("aicf_vstore<" in source) == (vec > 1)
