"""Memory planning: liveness packing, in-place reuse and its legality, what explain reports."""
from __future__ import annotations

import numpy as np
import pytest

import aicfc
from aicfc.explain import explain_json
from aicfc.frontend.onnx_import import import_model
from aicfc.ir.decision import parse_plan
from aicfc.ir.lowered import loads
from aicfc.passes.pipeline import Options, run_pipeline
from aicfc.passes.plan_memory import ALIGN
from aicfc.planner.hardware import load_profile
from tests import onnx_builders as B
from tests.conftest import run_payload
from tests.test_pipeline import example_models


def plan_of(model, inplace: bool = True, precision: str = "fp32"):
    opts = Options("sm_90", load_profile("sm_90"), precision, (), inplace)
    return run_pipeline(import_model(model), opts).plan


def lifetimes(plan) -> dict[str, tuple[int, int]]:
    """An independent liveness: first kernel that writes, last that reads (inputs and outputs span all)."""
    source = {v.out: v.source for v in plan.views}

    def base(n: str) -> str:
        while n in source:
            n = source[n]
        return n
    end = len(plan.kernels)
    live = {v.name: [-1, end] for v in plan.inputs}
    for i, k in enumerate(plan.kernels):
        for s in k.stores:
            live.setdefault(s, [i, i])
        for op in k.ops:
            for ld in loads(op.body):
                if base(ld.buffer) in live:
                    live[base(ld.buffer)][1] = max(live[base(ld.buffer)][1], i)
    for o in plan.outputs:
        live[base(o)][1] = end
    return {n: (a, b) for n, (a, b) in live.items()}


def check_no_collisions(plan) -> None:
    """Two tensors live at the same kernel never share a byte, except an in-place pair at its kernel."""
    live = lifetimes(plan)
    at = {b.name: b for b in plan.buffers if b.region == "arena" and not b.alias_of}
    pairs = {(ip.output, ip.reuses) for k in plan.kernels for ip in k.inplace}
    pairs |= {(b, a) for a, b in pairs}
    names = [n for n in live if n in at]
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            (fa, la), (fb, lb) = live[a], live[b]
            ra = (at[a].offset, at[a].offset + at[a].type.nbytes)
            rb = (at[b].offset, at[b].offset + at[b].type.nbytes)
            if ra[0] < rb[1] and rb[0] < ra[1]:
                overlap_time = fa <= lb and fb <= la
                # An in-place pair overlaps exactly at the kernel where one dies and the other is born.
                if overlap_time and (a, b) in pairs:
                    assert la == fb or lb == fa, (a, b)
                else:
                    assert not overlap_time, f"{a} {live[a]} and {b} {live[b]} share bytes while both live"


MODELS = example_models() + [(c, b) for c, b in B.OP_CASES[:12]]


@pytest.mark.parametrize("case_id,build", MODELS, ids=[c for c, _ in MODELS])
@pytest.mark.parametrize("inplace", [True, False])
def test_arena_has_no_collisions(case_id, build, inplace):
    plan = plan_of(build(), inplace)
    check_no_collisions(plan)
    if not inplace:
        assert not any(k.inplace for k in plan.kernels)
    for b in plan.buffers:
        assert b.offset % ALIGN == 0


def test_block_residual_and_softmax_are_written_in_place():
    import examples.build_examples as ex
    plan = plan_of(ex.BUILDERS["block"]())
    decided = {(ip.output, ip.reuses): k for k in plan.kernels for ip in k.inplace}
    # The FFN's second GEMM writes the output over the residual h it reads in its epilogue;
    # the scores and probabilities are never stored at all (streaming attention).
    assert ("y", "h") in decided and decided[("y", "h")].family == "gemm"
    off = {b.name: b.offset for b in plan.buffers}
    assert off["y"] == off["h"] and "probs" not in off and "scores_raw" not in off
    # the inputs are never overwritten, so replaying the plan needs no new copy of them
    assert all(ip.reuses not in {v.name for v in plan.inputs} for k in plan.kernels for ip in k.inplace)


def test_inplace_is_in_the_ir_text_and_parses_back():
    import examples.build_examples as ex
    plan = plan_of(ex.BUILDERS["block"]())
    text = str(plan)
    assert "inplace %y reuses %h" in text
    again = parse_plan(text, {w.name: w.data for w in plan.weights})
    assert again == plan


def test_inplace_pair_drops_restrict():
    # The two pointers of an in-place pair alias, so neither may be declared __restrict__.
    import examples.build_examples as ex
    payload = aicfc.compile(ex.BUILDERS["block"]())
    src = "".join(m["source"] for m in payload["modules"])
    for k in payload["kernels"]:
        sig = src[src.index(f" {k['symbol']}(") + 1:].split(")")[0]
        params = sig[len(k["symbol"]) + 1:].split(", ")
        names = [payload["buffers"][b]["name"] for b in k["args"]]
        aliased = {n for d in payload["memory"]["inplace"] if d["kernel"] == k["name"]
                   for n in (d["output"], d["reuses"])}
        for name, param in zip(names, params):
            assert ("__restrict__" in param) == (name not in aliased), (k["name"], name, param)


def test_gemm_operand_and_transposed_reads_are_not_in_place():
    # x @ W then + x: x is an input (never overwritten); relu(a) @ W: the operand a is read by
    # many threads, so the GEMM may not overwrite it; a transposed read may not either.
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((32, 32)).astype(np.float32), "w")
    nodes = [helper.make_node("Relu", ["x"], ["a"]),
             helper.make_node("MatMul", ["a", "w"], ["b"]),
             helper.make_node("Tanh", ["b"], ["c"]),
             helper.make_node("Transpose", ["c"], ["d"], perm=[1, 0]),
             helper.make_node("Sigmoid", ["d"], ["y"])]
    g = helper.make_graph(nodes, "t", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [32, 32])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [32, 32])], [w])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    onnx.checker.check_model(model)
    plan = plan_of(model)
    from aicfc.passes.plan_memory import why_not_inplace
    types = plan.types()
    gemm = next(k for k in plan.kernels if k.family == "gemm")
    a_name = gemm.ops[0].body.args[0].buffer
    if a_name != "x":
        assert "operand of the contraction" in why_not_inplace(gemm, a_name, gemm.stores[0], types)
    for k in plan.kernels:
        for ip in k.inplace:
            assert ip.reuses != "x"


def test_explain_reports_both_sums_and_the_decisions():
    import examples.build_examples as ex
    payload = aicfc.compile(ex.BUILDERS["block"]())
    m = explain_json(payload)["memory"]
    assert m["graph_intermediate_bytes"] > m["intermediate_bytes"] > 0
    assert m["arena_bytes"] < m["intermediate_bytes"] + sum(
        4 * np.prod(v["shape"]) for v in payload["inputs"] + payload["outputs"])
    assert {(d["output"], d["reuses"]) for d in m["inplace"]} >= {("y", "h")}
    assert all(d["reason"] and d["kernel"] for d in m["inplace"])
    off = aicfc.compile(ex.BUILDERS["block"](), inplace=False)
    assert explain_json(off)["memory"]["inplace"] == []
    assert off["memory"]["arena_bytes"] >= payload["memory"]["arena_bytes"]


@pytest.mark.gpu
@pytest.mark.parametrize("precision", ["fp32", "fp16"])
@pytest.mark.parametrize("case_id,build", example_models(), ids=[c for c, _ in example_models()])
def test_outputs_identical_with_and_without_inplace(case_id, build, precision, gpu_device):
    model = build()
    inputs = B.random_inputs(model, seed=7)
    with_ip = run_payload(aicfc.compile(model, precision=precision), inputs, gpu_device)
    without = run_payload(aicfc.compile(model, precision=precision, inplace=False), inputs, gpu_device)
    for name in with_ip:
        assert np.isfinite(with_ip[name]).all()
        assert np.array_equal(with_ip[name], without[name]), name


def _encoder_b1():
    from examples.build_examples import SEED, build_encoder
    return build_encoder(np.random.default_rng(SEED), layers=2, batch=1, seq=32, hidden=128, heads=4, ffn=512)


def test_batch1_encoder_keeps_seven_kernels_per_layer():
    # Lowering reads extent-1 dimensions at index 0; the GEMM epilogue rule must still see the
    # bias and GELU maps as reading the accumulator at its own element.
    payload = aicfc.compile(_encoder_b1())
    assert len(payload["kernels"]) == 14
    # ... and the in-place rule too: the residual chain x1 -> h -> out -> h -> y is one buffer.
    chain = [(d["output"], d["reuses"]) for d in payload["memory"]["inplace"]]
    assert chain == [("l0_h", "l0_o_mm"), ("l0_out", "l0_h"), ("l1_h", "l0_out"), ("y", "l1_h")]


@pytest.mark.gpu
@pytest.mark.parametrize("precision,rtol", [("fp32", 1e-4), ("fp16", 1e-2)])
def test_batch1_encoder_matches_onnxruntime(precision, rtol, gpu_device):
    model = _encoder_b1()
    inputs = B.random_inputs(model, seed=11)
    ref = B.run_onnxruntime(model, inputs)
    got = run_payload(aicfc.compile(model, precision=precision), inputs, gpu_device)
    for name, r in ref.items():
        y = got[name]
        assert np.isfinite(y).all()
        assert np.abs(y.astype(np.float64) - r).max() / np.abs(r).max() <= rtol


@pytest.mark.parametrize("name", ["encoder", "decoder"])
def test_shapes_and_scalars_never_reach_the_device(name):
    # Meta tensors: the Reshape targets (int64 initializers), the attention scale and the GELU
    # constants are compile-time facts. The bundle holds only fp16 weights and activations (and
    # split-k's partial sums and tickets); every kernel argument is one of those.
    import examples.build_examples as ex
    payload = aicfc.compile(ex.BUILDERS[name](), precision="fp16")
    names = {b["name"]: b for b in payload["buffers"]}
    assert not any("shape" in n for n in names), sorted(names)
    for b in payload["buffers"]:
        scratch = b["name"].endswith((".tickets", ".partials"))   # split-k's own buffers
        assert b["dtype"] == "float16" or scratch, b
        assert np.prod(b["shape"]) > 1, b                    # no device scalars
