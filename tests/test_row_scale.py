"""A norm's scales in the projections that read it: the weight g folded into the constant weight
(passes/fold_column_scale.py) and the row scale r applied to a gemv's sums in its epilogue
(passes/fold_row_scale.py, [Note: a norm's row scale in the gemv] in codegen/gemm_gemv.py).

The decoder is benchmarks/decoder_graph.py's Llama at a small size, a decode step (one token)
over a cache of 64 slots; on the GPU its logits and cache rows are compared with onnxruntime's
fp32 run of the same ONNX graph, with the fold and without it (`--pin rowscale=0`), on both gemv
paths (SIMT at one row, tensor cores at two).
"""
from __future__ import annotations

import functools

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import aicfc
from aicfc.codegen import gemm, gemm_gemv
from aicfc.planner.cost import estimate_registers
from aicfc.frontend.onnx_import import import_model
from aicfc.ir.high import evaluate_graph
from aicfc.passes.fold_column_scale import COLUMN_SCALE_RULE, fold_column_scale
from aicfc.passes.fold_row_scale import RULE
from benchmarks.decoder_graph import DecoderConfig, cache_names, decoder_model, random_weight, weight_shapes
from benchmarks.light_models import onnxruntime_reference
from tests.conftest import run_payload
from tests.test_pipeline import rel_err
from tests.sweep import to_build
from tests.test_state import plan_of

CFG = DecoderConfig(512, 2, 8, 2, 1408, 1000, 64)
POSITION = 37


def decoder(batch: int = 1, cfg: DecoderConfig = CFG) -> onnx.ModelProto:
    rng = np.random.default_rng(3)
    weights = {n: random_weight(n, s, rng) for n, s in weight_shapes(cfg).items()}
    return decoder_model(cfg, lambda name: weights[name], batch=batch)


def decode_shapes(batch: int) -> dict[str, tuple[int, ...]]:
    return {"input_ids": (batch, 1), "cache_position": (1,)}


def decode_inputs(batch: int, seed: int, cfg: DecoderConfig = CFG) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    out = {"input_ids": rng.integers(0, cfg.vocab, (batch, 1)).astype(np.int64),
           "cache_position": np.asarray([POSITION], np.int64)}
    for name, _ in cache_names(cfg):
        out[name] = rng.standard_normal(cfg.cache_shape(batch)).astype(np.float32)
    return out


def scale_model(readers: int = 2, shared_weight: bool = False) -> onnx.ModelProto:
    """y_i = (x·g) @ W_i, x [2, 3, 16], g [16]; with `shared_weight` W_0 is also a graph output."""
    rng = np.random.default_rng(0)
    inits = [helper.make_tensor("g", TensorProto.FLOAT, [16], rng.standard_normal(16).astype(np.float32).tolist())]
    nodes = [helper.make_node("Mul", ["x", "g"], ["xg"])]
    outs = []
    for i in range(readers):
        w = rng.standard_normal((16, 8)).astype(np.float32)
        inits.append(helper.make_tensor(f"w{i}", TensorProto.FLOAT, [16, 8], w.reshape(-1).tolist()))
        nodes.append(helper.make_node("MatMul", ["xg", f"w{i}"], [f"y{i}"]))
        outs.append(helper.make_tensor_value_info(f"y{i}", TensorProto.FLOAT, [2, 3, 8]))
    if shared_weight:
        nodes.append(helper.make_node("Relu", ["w0"], ["w0_relu"]))
        outs.append(helper.make_tensor_value_info("w0_relu", TensorProto.FLOAT, [16, 8]))
    graph = helper.make_graph(nodes, "scale", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 16])],
                              outs, inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


# ---------------------------------------------------------------- the column scale (High IR)

def test_column_scale_folds_into_every_reader_weight():
    g = import_model(scale_model())
    folded = fold_column_scale(g)
    assert not any(n.op == "Mul" for n in folded.nodes)
    mms = [n for n in folded.nodes if n.op == "MatMul"]
    assert len(mms) == 2 and all(n.inputs[0] == "x" and n.attr["rule"] == COLUMN_SCALE_RULE for n in mms)
    w = {x.name: x.array() for x in g.weights}
    made = {x.name: x.array() for x in folded.weights}
    for n in mms:
        src = n.inputs[1].removesuffix(".g")
        np.testing.assert_allclose(made[n.inputs[1]], w["g"][:, None] * w[src], rtol=1e-6)
    x = np.random.default_rng(1).standard_normal((2, 3, 16)).astype(np.float32)
    before, after = evaluate_graph(g, {"x": x}), evaluate_graph(folded, {"x": x})
    for name in ("y0", "y1"):
        assert rel_err(after[name], before[name].astype(np.float64)) < 1e-5


def test_column_scale_keeps_a_weight_another_node_reads():
    g = import_model(scale_model(readers=1, shared_weight=True))
    assert fold_column_scale(g) is g   # W is also read by the Relu: folding would store it twice


def test_column_scale_recorded():
    payload = aicfc.compile(scale_model(), precision="fp32")
    assert sum(r.get("rule") == COLUMN_SCALE_RULE and r["applied"] for r in payload["decisions"]) == 2


# ---------------------------------------------------------------- the row scale (Decision IR)

def _records(plan):
    return [r for r in plan.rewrites if r.rule == RULE]


def test_decode_norms_move_into_their_gemvs():
    plan = plan_of(decoder(), decode_shapes(1), "fp16")
    recs = _records(plan)
    applied = [r for r in recs if r.applied]
    # 5 norms: the first reads the embedding's gather (two buffers); the 4 others fold, the final norm into the
    # LM head, whose row (the last residual sum) the last down projection's epilogue stores
    # ([Note: the last residual row stored] in passes/inline_producers.py)
    assert len(recs) == 5 and len(applied) == 4
    assert all("scaling its sums against" in r.reason for r in applied)
    scaled = [k for k in plan.kernels if gemm.row_scale(k) is not None]
    assert len(scaled) == 4 and all(k.schedule.param["unit"] == "gemv" for k in scaled)
    assert scaled[-1] is plan.kernels[-1] and "logits" in plan.kernels[-1].stores
    (kept,) = [r for r in plan.rewrites if r.target == plan.kernels[-2].stores[0] and not r.applied
               and "norm's row scale can move into that contraction" in r.reason]
    assert gemm.dims(plan.kernels[-1])[0].a.buffer == kept.target
    assert all(dict(k.schedule.predicted).get("t_row_scale_us", 0) > 0 for k in scaled)
    # the scaled kernels' contractions read the residual stream itself, which an earlier kernel stores
    stored = {s for k in plan.kernels for s in k.stores}
    assert all(gemm.dims(k)[0].a.buffer in stored for k in scaled)
    assert len([k for k in plan.kernels if k.family == "row_reduce"]) == 1


def test_rowscale_pin_keeps_norms_apart():
    plan = plan_of(decoder(), decode_shapes(1), "fp16", {"rowscale": "0"})
    assert not any(gemm.row_scale(k) for k in plan.kernels)
    assert len([k for k in plan.kernels if k.family == "row_reduce"]) == 5
    assert any("kept apart" in r.reason and "--pin rowscale=0" in r.reason for r in _records(plan))


def test_rowscale_pin_rejects_other_values():
    from aicfc.errors import AicfError
    with pytest.raises(AicfError, match="rowscale"):
        plan_of(decoder(), decode_shapes(1), "fp16", {"rowscale": "2"})


def test_prefill_and_fp32_keep_their_norms():
    # a prompt's rows are too many for a gemv; fp32 plans never stream a gemv
    prefill = plan_of(decoder(), {"input_ids": (1, 16), "cache_position": (16,)}, "fp16")
    assert not any(gemm.row_scale(k) for k in prefill.kernels)
    assert all(not r.applied for r in _records(prefill))
    assert not _records(plan_of(decoder(), decode_shapes(1), "fp32"))


@pytest.mark.parametrize("batch", [2, 8])
def test_rows_held_bound_the_schedules(batch):
    """A scaled gemv holds at most RSV_MAX vectors of the rows a thread: at 8 rows none fits, and the
    norms stay row passes (measured: the plan did not gain, [Note: a norm's row scale in the gemv])."""
    plan = plan_of(decoder(batch=batch), decode_shapes(batch), "fp16")
    scaled = [k for k in plan.kernels if gemm.row_scale(k) is not None]
    assert bool(scaled) == (batch < 8)
    for k in scaled:
        p, kk = k.schedule.param, gemm.dims(k)[3]
        assert p["BM"] * gemm_gemv.row_vectors(p, kk) <= gemm_gemv.RSV_MAX
        assert all(dict(c.params)["unit"] == "gemv" for c in k.schedule.candidates if not c.rejected_because)
    if batch == 8:
        assert any("no gemv schedule holds its rows" in r.reason for r in _records(plan))


def test_both_plans_share_the_folded_weights(tmp_path):
    """A bundle of the prompt's and the step's plans stores each folded weight once: both plans fold g
    alike, so the pair's weight blobs are the step's alone plus a few of the prompt's small constants."""
    from aicfc.driver import compile_plans
    path = tmp_path / "dec.onnx"
    onnx.save(decoder(), str(path))
    step = ["input_ids=1x1", "cache_position=1"]
    both = compile_plans(str(path), [["input_ids=1x16", "cache_position=16"], step], precision="fp16")
    alone = compile_plans(str(path), [step], precision="fp16")
    size = lambda payload: sum(len(w["data"]) for w in payload["weights"])
    assert size(alone) > 4e6 and size(both) < 1.02 * size(alone)


# ---------------------------------------------------------------- on the GPU

TOL = {"fp16": 1e-2, "bf16": 3e-2}   # bf16 keeps 8 significant bits


def check_decode_step(got: dict, ref: dict, precision: str, cfg: DecoderConfig = CFG) -> None:
    """The decode step's logits and the step's row of every cache (the rest is the input) against
    onnxruntime's, within the precision's tolerance; NaN never passes."""
    tol = TOL[precision]
    assert np.isfinite(got["logits"]).all()
    assert rel_err(got["logits"], ref["logits"].astype(np.float64)) <= tol
    for _, present in cache_names(cfg):
        assert rel_err(got[present][:, :, POSITION], ref[present][:, :, POSITION].astype(np.float64)) <= tol


@pytest.mark.gpu
@pytest.mark.parametrize("batch,tc,precision", [(1, 0, "fp16"), (2, 1, "fp16"), (2, 0, "fp16"), (1, 0, "bf16")])
@pytest.mark.parametrize("fold", ["1", "0"])
def test_gpu_decode_step_matches_onnxruntime(batch, tc, precision, fold, gpu_device):
    model = decoder(batch)
    inputs = decode_inputs(batch, seed=5 + batch)
    ref = onnxruntime_reference(model, inputs)
    pin = {"rowscale": fold} | ({"TC": tc} if batch > 1 else {})
    payload = aicfc.compile(model, target=gpu_device.arch, precision=precision, shapes=decode_shapes(batch), pin=pin)
    folded = [k for k in payload["kernels"] if RULE in k["rewrites"]]
    assert bool(folded) == (fold == "1")
    check_decode_step(run_payload(payload, inputs, gpu_device), ref, precision)


@pytest.mark.parametrize("batch", [1, 4])
def test_every_row_scaled_candidate_builds_without_spills(batch):
    """Every gemv candidate of the scaled QKV (rotary epilogue) and gate/up (gated epilogue) compiles
    (nvcc, sm_90a) with no local memory (ptxas -v), the rows' vectors held through the loop included;
    at 4 rows a thread of 256 holds 4 of them (RSV_MAX). [Note: candidate sweeps] in tests/sweep.py."""
    from aicfc.codegen.module import count_registers
    plan = plan_of(decoder(batch), decode_shapes(batch), "fp16")
    scaled = [k for k in plan.kernels if gemm.row_scale(k) is not None][:2]
    assert len(scaled) == 2 and {gemm.rotary(k) is not None for k in scaled} == {True, False}
    spaces = [(k, to_build(gemm.space(k, plan), functools.partial(estimate_registers, k))) for k in scaled]
    assert all(space for _, space in spaces)
    for (k, space), found in zip(spaces, count_registers(plan, spaces)):
        bad = [(p, regs, spill) for p, (regs, spill) in zip(space, found) if spill or not 0 < regs <= 255]
        assert not bad, f"{k.name}: {len(bad)} of {len(space)} spill: {bad[:3]}"


def _residual_norm_model(factor_of_the_statistic: bool) -> onnx.ModelProto:
    """h = x @ W1 + r, then h · 1/sqrt(mean(h²) + eps) (an RMSNorm without its weight) or, for the negative case,
    h · g with g another input beside the statistic, read by a MatMul: [Note: the last residual row stored]."""
    rng = np.random.default_rng(0)
    inits = [helper.make_tensor(n, TensorProto.FLOAT, [64, 64], rng.standard_normal(4096).astype(np.float32).tolist())
             for n in ("w1", "w2")]
    inits.append(helper.make_tensor("eps", TensorProto.FLOAT, [], [1e-6]))
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["m"]), helper.make_node("Add", ["m", "r"], ["h"]),
             helper.make_node("Mul", ["h", "h"], ["sq"]),
             helper.make_node("ReduceMean", ["sq"], ["ms"], axes=[-1], keepdims=1),
             helper.make_node("Add", ["ms", "eps"], ["mse"]), helper.make_node("Sqrt", ["mse"], ["rms"]),
             helper.make_node("Reciprocal", ["rms"], ["inv"]),
             helper.make_node("Mul", ["h", "inv" if factor_of_the_statistic else "g"], ["y"]),
             helper.make_node("MatMul", ["y", "w2"], ["out"]),
             helper.make_node("Add", ["out", "inv"], ["out2"])]
    inputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [1, 1, 64]) for n in ("x", "r", "g")]
    graph = helper.make_graph(nodes, "residual_norm", inputs,
                              [helper.make_tensor_value_info("out2", TensorProto.FLOAT, [1, 1, 64])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("norm", [True, False])
def test_the_last_residual_row_stays_stored_only_before_a_row_scale(norm):
    """The residual sum before a norm whose scaled row a GEMM reads stays stored (its MatMul's epilogue stores it); a
    row times anything else than its statistics' factor is recomputed in its consumers as before."""
    from aicfc.passes.inline_producers import REMAT_RULE
    plan = plan_of(_residual_norm_model(norm), {"x": (1, 1, 64), "r": (1, 1, 64), "g": (1, 1, 64)}, "fp16")
    (rec,) = [r for r in plan.rewrites if r.rule == REMAT_RULE and r.target == "h"]
    assert rec.applied != norm
    if norm:
        assert "the row times a factor of them" in rec.reason
        assert any(k.stores == ("h",) and k.family == "gemm" for k in plan.kernels)
