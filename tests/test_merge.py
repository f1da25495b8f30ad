"""The rules "sibling contractions on one operand => one contraction" (merge_contractions) and
"load(view(x)) => load(x) with composed index" (fold_views).

CPU: golden Lowered IR text before and after each pass (tests/golden/merge_* and
tests/golden/fold_views_*; `AICF_UPDATE_GOLDEN=1 python3 -m pytest tests/test_merge.py`
rewrites them) with a parse round-trip, declines with their reasons, every stage against
onnxruntime through the interpreters on fresh random inputs, kernel counts for the block and
BERT encoder examples, and explain naming the rules.

GPU (`-m gpu`): block, encoder and BERT attention compiled and run at fp32 and fp16 against
onnxruntime; tolerance on max|y - ref| / max|ref|: fp32 1e-4, fp16 1e-2.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import aicfc
from aicfc.explain import explain_text
from aicfc.frontend.onnx_import import import_model
from aicfc.ir.interp import evaluate_program
from aicfc.ir.lowered import Affine, Load, Program, loads, parse_program, verify_program
from aicfc.ir.types import Weight
from aicfc.passes import fold_views as FV
from aicfc.passes import merge_contractions as MC
from aicfc.passes.interleave_gates import GATE_RULE
from aicfc.passes.pipeline import PIPELINE, Options
from aicfc.planner.hardware import load_profile
from tests import onnx_builders as B
from tests.conftest import check_golden, run_payload
from tests.test_pipeline import evaluate_ir, rel_err, stages

GOLDEN = Path(__file__).parent / "golden"
RTOL = {"fp32": 1e-4, "fp16": 1e-2}
OPTS = Options("sm_90", load_profile("sm_90"))
NAMES = [s.name for s in PIPELINE]


def upto(model, stage: str):
    """The IR right after `stage` (import + every stage up to it)."""
    ir = import_model(model)
    for s in PIPELINE[:NAMES.index(stage) + 1]:
        ir = s.run(ir, OPTS)
    return ir


def before(stage: str) -> str:
    return NAMES[NAMES.index(stage) - 1]


def plan_of(model, precision: str = "fp32"):
    return stages(model, precision)[PIPELINE[-1].name]


def records(ir, rule: str):
    return [r for r in ir.rewrites if r.rule == rule]


def encoder(layers: int = 1, **dims):
    import examples.build_examples as ex
    return ex.build_encoder(np.random.default_rng(ex.SEED), layers=layers, **dims)


def block():
    import examples.build_examples as ex
    return ex.BUILDERS["block"]()


def projections_model(transb: bool = False, bias: bool = True, n: int = 16, out_of_q: bool = False):
    """x[2,5,24] → q, k, v = x·Wq (+bq), x·Wk (+bk), x·Wv (+bv) (as Gemm transB=1 on x[10,24] when
    `transb`: fold_constants transposes the weights) → y = q·k + v; `out_of_q` also makes q a
    graph output."""
    rng = np.random.default_rng(5)
    nd = helper.make_node
    inits, nodes = {}, []
    x = "x"
    shape = [10, 24] if transb else [2, 5, 24]
    for w in "qkv":
        inits[f"W{w}"] = (rng.standard_normal((n, 24) if transb else (24, n)) / 5).astype(np.float32)
        inits[f"b{w}"] = (rng.standard_normal(n) * 0.1).astype(np.float32)
        if transb:
            nodes.append(nd("Gemm", [x, f"W{w}"] + ([f"b{w}"] if bias else []), [w], name=f"{w}_gemm", transB=1))
        elif bias:
            nodes += [nd("MatMul", [x, f"W{w}"], [f"{w}_mm"], name=f"{w}_matmul"),
                      nd("Add", [f"{w}_mm", f"b{w}"], [w], name=f"{w}_bias")]
        else:
            nodes.append(nd("MatMul", [x, f"W{w}"], [w], name=f"{w}_matmul"))
    if not bias:
        inits = {k: v for k, v in inits.items() if not k.startswith("b")}
    nodes += [nd("Mul", ["q", "k"], ["qk"], name="qk_mul"), nd("Add", ["qk", "v"], ["y"], name="y_add")]
    out_shape = shape[:-1] + [n]
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, out_shape)]
    if out_of_q:
        outputs.append(helper.make_tensor_value_info("q", TensorProto.FLOAT, out_shape))
    g = helper.make_graph(nodes, "projections", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                          outputs, [numpy_helper.from_array(a, k) for k, a in inits.items()])
    return B.make_model(g)


def chained_model():
    """y = (x·W1)·W3 + (x·W2)·W4: x·W1 and x·W2 merge; the next GEMMs read their A operand as
    slices of the merged result (the second at offset 32 along K)."""
    rng = np.random.default_rng(9)
    nd = helper.make_node
    inits = {f"W{i}": (rng.standard_normal(s) / 5).astype(np.float32)
             for i, s in ((1, (40, 32)), (2, (40, 32)), (3, (32, 24)), (4, (32, 24)))}
    nodes = [nd("MatMul", ["x", "W1"], ["a"], name="a_matmul"), nd("MatMul", ["x", "W2"], ["b"], name="b_matmul"),
             nd("MatMul", ["a", "W3"], ["c"], name="c_matmul"), nd("MatMul", ["b", "W4"], ["d"], name="d_matmul"),
             nd("Add", ["c", "d"], ["y"], name="y_add")]
    g = helper.make_graph(nodes, "chained", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 70, 40])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 70, 24])],
                          [numpy_helper.from_array(a, k) for k, a in inits.items()])
    return B.make_model(g)


def program(text: str, weights: dict[str, np.ndarray]) -> Program:
    """Lowered IR from its text; the weight lines are generated from `weights`."""
    ws = {k: Weight.of(k, np.asarray(a, np.float32)) for k, a in weights.items()}
    head, rest = text.strip().split("\n", 1)
    lines = [f"  weight %{w.name}: {w.type} sha256=\"{w.sha256}\"" for w in ws.values()]
    p = parse_program("\n".join([head] + lines + [rest]) + "\n", {w.name: w.data for w in ws.values()})
    verify_program(p)
    return p


# ---------------------------------------------------------------- golden text




GOLDEN_CASES = {
    "merge_bert": ("merge_contractions", lambda: B.bert_attention_model(2, 6, 2, 4)),
    "merge_block": ("merge_contractions", block),
    "merge_gemm_transb": ("merge_contractions", lambda: projections_model(transb=True, n=8)),
    "merge_transposed": ("merge_contractions", lambda: transposed_program()),
    "fold_views_bert": ("fold_views", lambda: B.bert_attention_model(2, 6, 2, 4)),
}


@pytest.mark.parametrize("case", list(GOLDEN_CASES))
def test_golden_before_after(case):
    """The pass is a pure function of the IR before it: golden text both sides, parse round-trip."""
    stage, build = GOLDEN_CASES[case]
    source = build()
    ir_before = source if isinstance(source, Program) else upto(source, before(stage))
    ir_after = PIPELINE[NAMES.index(stage)].run(ir_before, OPTS)
    assert ir_after != ir_before
    check_golden(f"{case}_before.txt", str(ir_before))
    check_golden(f"{case}_after.txt", str(ir_after))
    for ir in (ir_before, ir_after):
        verify_program(ir)
        assert parse_program(str(ir), {w.name: w.data for w in ir.weights}) == ir


# ---------------------------------------------------------------- merge_contractions: where it applies


def test_bert_qkv_is_one_gemm_with_one_bias_epilogue():
    ir = upto(B.bert_attention_model(2, 12, 2, 8), "merge_contractions")
    (rec,) = [r for r in records(ir, MC.RULE) if r.applied]
    assert rec.target == "q_mm.k_mm.v_mm" and rec.bytes_saved == 2 * (2 * 12 * 16 * 4)
    assert not [r for r in records(ir, MC.RULE) if not r.applied]
    ops = {op.out: op for op in ir.ops}
    mm, epi = ops["q_mm.k_mm.v_mm"], ops["q_lin.k_lin.v_lin"]
    assert mm.type.shape == (2, 12, 48) and epi.type.shape == (2, 12, 48)
    assert {ld.buffer for ld in loads(epi.body)} == {"q_mm.k_mm.v_mm", "bq.bk.bv.cat"}
    weights = {w.name: w for w in ir.weights}
    assert {"Wq", "Wk", "Wv", "bq", "bk", "bv"}.isdisjoint(weights)
    src = {w.name: w.array() for w in upto(B.bert_attention_model(2, 12, 2, 8), "fold_views").weights}
    assert np.array_equal(weights["Wq.Wk.Wv.cat"].array(), np.concatenate([src["Wq"], src["Wk"], src["Wv"]], axis=1))
    assert np.array_equal(weights["bq.bk.bv.cat"].array(), np.concatenate([src["bq"], src["bk"], src["bv"]]))
    # the scores read q and k as slices: the same buffer at offsets 0 and H·D = 16 along N
    scores = ops["scores_raw"]
    q, k = (ld.index[-1] for ld in loads(scores.body))
    assert {ld.buffer for ld in loads(scores.body)} == {"q_lin.k_lin.v_lin"}
    assert (q.const, k.const) == (0, 16) and q.coeff("i1") == 8
    plan = plan_of(B.bert_attention_model(2, 12, 2, 8))
    assert [k.family for k in plan.kernels] == ["gemm", "attention"]
    assert plan.kernels[0].stores == ("q_lin.k_lin.v_lin",)


TRANSPOSED = """lowered "t" {
  input %x: f32[2,4,8]
  %a: f32[2,4,16] = sum[8] mul(load(%wa, [i2, r0]), load(%x, [i0, i1, r0]))
  %al: f32[2,4,16] = map mul(add(load(%a, [i0, i1, i2]), load(%ba, [i2])), 0.5)
  %b: f32[2,4,8] = sum[8] mul(load(%wb, [i2, r0]), load(%x, [i0, i1, r0]))
  %bl: f32[2,4,8] = map mul(add(load(%b, [i0, i1, i2]), load(%bb, [i2])), 0.5)
  %y: f32[2,4,4] = sum[8] mul(load(%al, [i0, i1, r0+8]), load(%bl, [i0, i2, r0]))
  output %y
}"""


def transposed_program() -> Program:
    rng = np.random.default_rng(3)
    return program(TRANSPOSED, {"wa": rng.standard_normal((16, 8)), "ba": rng.standard_normal(16),
                                "wb": rng.standard_normal((8, 8)), "bb": rng.standard_normal(8)})


def test_transposed_weights_merge_along_rows():
    """Weights read as [n, k] (stored [N, K]) concatenate along axis 0; a weight on the left
    of the product is still the weight; a reader's own offset adds to the slice's."""
    p = transposed_program()
    q = MC.merge_contractions(p)
    verify_program(q)
    (rec,) = records(q, MC.RULE)
    assert rec.applied and rec.target == "a.b" and rec.bytes_saved == 2 * 4 * 8 * 4
    w = {x.name: x for x in q.weights}
    assert w["wa.wb.cat"].type.shape == (24, 8) and w["ba.bb.cat"].type.shape == (24,)
    np.testing.assert_array_equal(w["wa.wb.cat"].array(), np.concatenate([p.weights[0].array(), p.weights[2].array()]))
    y = q.ops[-1]
    assert [ld.index[-1] for ld in loads(y.body)] == [Affine.of({"r0": 1}, 8), Affine.of({"r0": 1}, 16)]
    x = np.random.default_rng(4).standard_normal((2, 4, 8)).astype(np.float32)
    np.testing.assert_allclose(evaluate_program(q, {"x": x})["y"], evaluate_program(p, {"x": x})["y"], rtol=1e-5)


def test_partial_group_merges_the_compatible_siblings():
    """q and k carry a bias, v does not: q and k merge, v is declined with the reason."""
    p = program("""lowered "t" {
  input %x: f32[4,8]
  %q: f32[4,16] = sum[8] mul(load(%x, [i0, r0]), load(%wq, [r0, i1]))
  %ql: f32[4,16] = map add(load(%q, [i0, i1]), load(%bq, [i1]))
  %k: f32[4,16] = sum[8] mul(load(%x, [i0, r0]), load(%wk, [r0, i1]))
  %kl: f32[4,16] = map add(load(%k, [i0, i1]), load(%bk, [i1]))
  %v: f32[4,16] = sum[8] mul(load(%x, [i0, r0]), load(%wv, [r0, i1]))
  %vl: f32[4,16] = map max(load(%v, [i0, i1]), 0.0)
  %y: f32[4,16] = map add(mul(load(%ql, [i0, i1]), load(%kl, [i0, i1])), load(%vl, [i0, i1]))
  output %y
}""", {"wq": np.ones((8, 16)), "wk": 2 * np.ones((8, 16)), "wv": np.ones((8, 16)),
       "bq": np.arange(16), "bk": np.arange(16)})
    q = MC.merge_contractions(p)
    verify_program(q)
    applied = [r for r in records(q, MC.RULE) if r.applied]
    declined = [r for r in records(q, MC.RULE) if not r.applied]
    assert [r.target for r in applied] == ["q.k"]
    assert [(r.target, r.reason) for r in declined] == [("v", "the epilogues of 'v' and 'q' differ")]
    assert {op.out for op in q.ops} == {"q.k", "ql.kl", "v", "vl", "y"}
    x = np.random.default_rng(0).standard_normal((4, 8)).astype(np.float32)
    np.testing.assert_allclose(evaluate_program(q, {"x": x})["y"], evaluate_program(p, {"x": x})["y"], rtol=1e-6)
    assert MC.merge_contractions(q).ops == q.ops


# ---------------------------------------------------------------- merge_contractions: declines


SIBLINGS = """lowered "t" {{
  input %x: f32[4,8]
  input %z: f32[8,16]
  %a: f32[4,16] = sum[8] mul(load(%x, [i0, r0]), load(%w1, [r0, i1]))
  %b: f32[4,{n}] = sum[{k}] mul(load(%x, [i0, r0]), {b})
  %y: f32[4,16] = map add(load(%a, [i0, i1]), {use_b})
  output %y{extra}
}}"""


@pytest.mark.parametrize("case,b,k,n,weights,extra,target,reason", [
    ("non_constant", "load(%z, [r0, i1])", 8, 16, {}, "", "b",
     "its other operand 'z' is not a constant weight"),
    ("different_k", "load(%w2, [r0, i1])", 4, 16, {"w2": (4, 16)}, "", "b",
     "'b' sums over K=4, 'a' over K=8"),
    ("transposed_vs_plain", "load(%w2, [i1, r0])", 8, 16, {"w2": (16, 8)}, "", "b",
     "'b' and 'a' read their weights differently (['i1', 'r0'] vs ['r0', 'i1'])"),
    ("graph_output", "load(%w2, [r0, i1])", 8, 16, {"w2": (8, 16)}, "\n  output %b", "b",
     "its result is a graph output, stored in its own layout; a slice of the merged result is not"),
    ("misaligned", "load(%w2, [r0, i1])", 8, 3, {"w2": (8, 3)}, "", "a",
     "N extents [16, 3] are not multiples of 8 elements: the slices would start off 16-byte boundaries, "
     "and their readers would lose vector and tensor-core loads"),
])
def test_merge_declines(case, b, k, n, weights, extra, target, reason):
    use_b = "load(%b, [i0, i1])" if n == 16 else "load(%b, [i0, 0])"
    text = SIBLINGS.format(n=n, k=k, b=b, use_b=use_b, extra=extra)
    p = program(text, {"w1": np.ones((8, 16))} | {w: np.ones(s) for w, s in weights.items()})
    q = MC.merge_contractions(p)
    assert q.ops == p.ops and q.weights == p.weights
    recs = records(q, MC.RULE)
    assert recs and not any(r.applied for r in recs)
    assert (target, reason) in [(r.target, r.reason) for r in recs]


def test_epilogue_reading_a_tensor_declines():
    """A residual in the epilogue cannot be concatenated: merged, it would leave the GEMM."""
    p = program("""lowered "t" {
  input %x: f32[4,8]
  input %r: f32[4,16]
  %a: f32[4,16] = sum[8] mul(load(%x, [i0, r0]), load(%w1, [r0, i1]))
  %al: f32[4,16] = map add(load(%a, [i0, i1]), load(%r, [i0, i1]))
  %b: f32[4,16] = sum[8] mul(load(%x, [i0, r0]), load(%w2, [r0, i1]))
  %y: f32[4,16] = map add(load(%al, [i0, i1]), load(%b, [i0, i1]))
  output %y
}""", {"w1": np.ones((8, 16)), "w2": np.ones((8, 16))})
    q = MC.merge_contractions(p)
    assert q.ops == p.ops
    assert ("a", "its epilogue 'al' reads 'r', which is not a constant; merged, it would lose its GEMM epilogue") in \
        [(r.target, r.reason) for r in records(q, MC.RULE)]


def test_single_contraction_says_nothing():
    model = B.single_op_model("MatMul", [(3, 8), None], initializers={"in1": np.ones((8, 16), np.float32)})
    assert not records(plan_of(model), MC.RULE)


def test_graph_output_sibling_declines_end_to_end():
    """q (= x·Wq + bq) is a graph output: its epilogue cannot become a slice; k and v still merge."""
    plan = plan_of(projections_model(out_of_q=True))
    recs = records(plan, MC.RULE)
    assert [(r.target, r.reason) for r in recs if not r.applied] == [
        ("q_mm", "its epilogue 'q' is a graph output, stored in its own layout; a slice of the merged result is not")]
    assert [r.target for r in recs if r.applied] == ["k_mm.v_mm"]
    # y = q·k + v combines the merged k|v result's two halves: interleave_gates pairs their columns
    # and y is the merged GEMM's gated epilogue (it was a pointwise kernel of its own)
    assert [k.family for k in plan.kernels] == ["gemm", "gemm"]
    assert GATE_RULE in plan.kernels[1].rewrites or GATE_RULE in plan.kernels[0].rewrites
    model = projections_model(out_of_q=True)
    x = np.random.default_rng(9).standard_normal((2, 5, 24)).astype(np.float32)
    ref = evaluate_ir(import_model(model), {"x": x})
    got = evaluate_ir(plan, {"x": x})
    assert all(rel_err(got[o], ref[o].astype(np.float64)) <= 1e-5 for o in ("y", "q"))


# ---------------------------------------------------------------- fold_views


def test_split_groups():
    assert FV.split_groups((2, 12), (2, 3, 4)) == ((0,), (1, 2))
    assert FV.split_groups((2, 64, 256), (2, 64, 4, 64)) == ((0,), (1,), (2, 3))
    assert FV.split_groups((2, 1, 6), (2, 6, 1)) == ((0,), (), (1,))      # size-1 dims move freely
    assert FV.split_groups((6,), (1, 2, 1, 3)) == ((1, 3),)
    assert "merges dimensions" in FV.split_groups((2, 3, 4), (2, 12))
    assert "merges dimensions" in FV.split_groups((4, 6), (6, 4))


def test_fold_split_view_composes_the_index():
    p = program("""lowered "t" {
  input %x: f32[2,12]
  %t: f32[2,12] = map max(load(%x, [i0, i1]), 0.0)
  %v: f32[2,3,4] = view %t
  %y: f32[2,4,3] = map load(%v, [i0, i2, i1])
  output %y
}""", {})
    q = FV.fold_views(p)
    assert [op.out for op in q.ops] == ["t", "y"]
    y = q.ops[-1]
    assert y.body == Load("t", (Affine.var("i0"), Affine.of({"i2": 4, "i1": 1})))
    (rec,) = records(q, FV.RULE)
    assert rec.applied and rec.target == "v"
    x = np.random.default_rng(1).standard_normal((2, 12)).astype(np.float32)
    np.testing.assert_array_equal(evaluate_program(q, {"x": x})["y"], evaluate_program(p, {"x": x})["y"])


def test_fold_merge_view_declines():
    p = program("""lowered "t" {
  input %x: f32[2,3,4]
  %t: f32[2,3,4] = map max(load(%x, [i0, i1, i2]), 0.0)
  %v: f32[2,12] = view %t
  %y: f32[2,12] = map mul(load(%v, [i0, i1]), 2.0)
  output %y
}""", {})
    q = FV.fold_views(p)
    assert q.ops == p.ops
    (rec,) = records(q, FV.RULE)
    assert not rec.applied and rec.target == "v"
    assert rec.reason == ("reshape [2, 3, 4] → [2, 12] merges dimensions: target dimension 1 (12) spans more than "
                          "source dimension 1 (3), so reading it needs div/mod, not an affine index")


def test_fold_view_chain_and_outputs():
    """A view of a view reads the first source; a view that is a graph output stays."""
    p = program("""lowered "t" {
  input %x: f32[24]
  %t: f32[24] = map max(load(%x, [i0]), 0.0)
  %v1: f32[6,4] = view %t
  %v2: f32[2,3,4] = view %v1
  %y: f32[2,3,4] = map add(load(%v2, [i0, i1, i2]), 1.0)
  output %y
  output %v1
}""", {})
    q = FV.fold_views(p)
    verify_program(q)
    assert [op.out for op in q.ops] == ["t", "v1", "y"]
    assert q.ops[-1].body.args[0] == Load("t", (Affine.of({"i0": 12, "i1": 4, "i2": 1}),))
    assert [r.rule for r in q.rewrites if r.applied] == [FV.CHAIN_RULE, FV.RULE]
    x = np.random.default_rng(2).standard_normal(24).astype(np.float32)
    got, ref = evaluate_program(q, {"x": x}), evaluate_program(p, {"x": x})
    for name in ("y", "v1"):
        np.testing.assert_array_equal(got[name], ref[name])


# ---------------------------------------------------------------- every stage against onnxruntime


NUM_CASES = [
    ("block", block),
    ("encoder_2_layers", lambda: encoder(layers=2, batch=2, seq=16, hidden=32, heads=2, ffn=64)),
    ("bert_attention", lambda: B.bert_attention_model(2, 12, 2, 8)),
    ("projections_bias", lambda: projections_model()),
    ("projections_no_bias", lambda: projections_model(bias=False)),
    ("projections_transb", lambda: projections_model(transb=True)),
    ("projections_q_output", lambda: projections_model(out_of_q=True)),
    ("chained", chained_model),
]


@pytest.mark.parametrize("case_id,build", NUM_CASES, ids=[c for c, _ in NUM_CASES])
def test_every_stage_matches_onnxruntime(case_id, build):
    model = build()
    inputs = B.random_inputs(model, seed=np.random.default_rng().integers(1 << 30))
    ref = B.run_onnxruntime(model, inputs)
    for stage, ir in list(stages(model).items())[1:]:
        got = evaluate_ir(ir, inputs)
        for name, r in ref.items():
            err = rel_err(got[name], r)
            assert err <= RTOL["fp32"], f"after {stage}: {name} rel err {err:.2e}"


# ---------------------------------------------------------------- kernel counts


def test_block_kernel_count():
    """q, k, v (no bias) merge: one GEMM, attention, out-projection + residual, FFN1 + GELU,
    FFN2 + residual + tanh."""
    plan = plan_of(block())
    assert [k.family for k in plan.kernels] == ["gemm", "attention", "gemm", "gemm", "gemm"]
    assert plan.kernels[0].stores == ("q.k.v",)


@pytest.mark.parametrize("layers", [1, 2])
def test_encoder_kernel_count(layers):
    """At most 7 kernels per BERT layer: QKV GEMM + bias, attention, out-projection GEMM,
    LayerNorm (+ bias + residual), FFN1 GEMM + GELU, FFN2 GEMM, LayerNorm (+ bias + residual)."""
    plan = plan_of(encoder(layers=layers))
    families = [k.family for k in plan.kernels]
    assert families == ["gemm", "attention", "gemm", "row_reduce", "gemm", "gemm", "row_reduce"] * layers
    assert len(records(plan, MC.RULE)) == layers and all(r.applied for r in records(plan, MC.RULE))
    assert sorted(r.target for r in records(plan, FV.RULE) if not r.applied) == [f"l{i}_ctx" for i in range(layers)]


def test_slices_as_gemm_operands():
    plan = plan_of(chained_model())
    assert [k.family for k in plan.kernels] == ["gemm", "gemm", "gemm"]
    d = next(k for k in plan.kernels if "d_matmul" in k.origins)
    a_load = next(ld for ld in loads(d.ops[0].body) if ld.buffer == "a.b")
    assert a_load.index[-1] == Affine.of({"r0": 1}, 32)


@pytest.mark.parametrize("precision", ["fp32", "fp16", "bf16", "tf32"])
def test_builds_for_sm90(precision):
    """nvcc builds every kernel reading slices at offsets (GEMM operands, attention q/k/v)."""
    for model in (chained_model(), encoder(batch=2, seq=16, hidden=64, heads=2, ffn=64)):
        payload = aicfc.compile(model, precision=precision, jobs=1)
        assert all(k["registers"] is not None for k in payload["kernels"])


def test_explain_names_the_rules():
    payload = aicfc.compile(encoder(batch=2, seq=16, hidden=32, heads=2, ffn=64), jobs=1)
    text = explain_text(payload)
    assert f"applied  {MC.RULE!r} on l0_q_mm.l0_k_mm.l0_v_mm" in text
    assert f"applied  {FV.RULE!r} on l0_q_split" in text
    assert f"declined {FV.RULE!r} on l0_ctx" in text
    assert len(payload["kernels"]) == 7


# ---------------------------------------------------------------- on the GPU


GPU_MODELS = [
    ("block", block),
    ("encoder", lambda: encoder()),
    ("encoder_2_layers", lambda: encoder(layers=2)),
    ("bert_attention", lambda: B.bert_attention_model(2, 45, 3, 40, seed=2)),
    ("projections_transb", lambda: projections_model(transb=True)),
    ("chained", chained_model),
]


@pytest.mark.gpu
@pytest.mark.parametrize("precision", ["fp32", "fp16"])
@pytest.mark.parametrize("case_id,build", GPU_MODELS, ids=[c for c, _ in GPU_MODELS])
def test_gpu_matches_onnxruntime(case_id, build, precision, gpu_device):
    model = build()
    payload = aicfc.compile(model, target=gpu_device.arch, precision=precision)
    assert any(d.get("rule") == MC.RULE and d["applied"] for d in payload["decisions"] if d.get("kind") == "rewrite")
    for seed in (1, 2):
        inputs = B.random_inputs(model, seed=seed + 17 * len(case_id))
        if "attention_mask" in inputs:
            inputs["attention_mask"] = (np.random.default_rng(seed).random(inputs["attention_mask"].shape)
                                        < 0.8).astype(np.float32)
        ref = B.run_onnxruntime(model, inputs)
        got = run_payload(payload, inputs, gpu_device)
        for name, r in ref.items():
            err = rel_err(got[name], r)
            assert err <= RTOL[precision], f"{case_id} {precision}: {name} rel err {err:.2e}"
