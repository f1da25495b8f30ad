"""The rule "map(view(x)) => view(map(x))" (sink_views).

CPU: golden Lowered IR text before and after the pass for HF's Conv1D MLP (tests/golden/
sink_views_*; `make golden` rewrites them) with a parse round-trip; the GELU becoming the c_fc
GEMM's epilogue; declines with their reasons (a merged variable read another way, an indirect
or guarded load, a merging view, a reader not rebuilt); every stage against onnxruntime
through the interpreters on fresh random inputs; explain naming the rule.
"""
from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import aicfc
from aicfc.explain import explain_text
from aicfc.ir.interp import evaluate_program
from aicfc.ir.lowered import Program, View, loads, parse_program, print_op, verify_program
from aicfc.passes import sink_views as SV
from aicfc.passes.form_kernels import EPILOGUE_RULE
from aicfc.passes.pipeline import PIPELINE
from tests import onnx_builders as B
from tests.conftest import check_golden
from tests.test_merge import program, records, upto
from tests.test_pipeline import evaluate_ir, rel_err, stages

NAMES = [s.name for s in PIPELINE]


def conv1d_mlp_model(b: int = 2, s: int = 4, d: int = 8, ff: int = 16, seed: int = 0):
    """transformers' GPT-2 MLP as torch exports it: Conv1D views x as [B·S, D] for its Gemm and
    the result back as [B, S, FF]; the tanh-GELU runs on [B, S, FF]; c_proj views it again."""
    rng = np.random.default_rng(seed)
    nd = helper.make_node
    inits = {"w1": rng.standard_normal((d, ff)) / 3, "b1": rng.standard_normal(ff) / 10,
             "w2": rng.standard_normal((ff, d)) / 4, "b2": rng.standard_normal(d) / 10,
             "half": 0.5, "cube": 3.0, "k": 0.044715, "c": np.sqrt(2 / np.pi), "one": 1.0}
    inits = {k: np.asarray(v, np.float32) for k, v in inits.items()}
    inits |= {"flat_d": np.array([-1, d]), "flat_ff": np.array([-1, ff]),
              "back_ff": np.array([b, s, ff]), "back_d": np.array([b, s, d])}
    nodes = [nd("Reshape", ["x", "flat_d"], ["x2"], name="fc_view"),
             nd("Gemm", ["x2", "w1", "b1"], ["h2"], name="fc_gemm"),
             nd("Reshape", ["h2", "back_ff"], ["h"], name="fc_view_back"),
             nd("Mul", ["h", "half"], ["g0"], name="gelu_half"),
             nd("Pow", ["h", "cube"], ["g1"], name="gelu_pow"),
             nd("Mul", ["g1", "k"], ["g2"], name="gelu_mul_k"),
             nd("Add", ["h", "g2"], ["g3"], name="gelu_add"),
             nd("Mul", ["g3", "c"], ["g4"], name="gelu_mul_c"),
             nd("Tanh", ["g4"], ["g5"], name="gelu_tanh"),
             nd("Add", ["g5", "one"], ["g6"], name="gelu_add_one"),
             nd("Mul", ["g0", "g6"], ["g"], name="gelu_mul"),
             nd("Reshape", ["g", "flat_ff"], ["g2d"], name="proj_view"),
             nd("Gemm", ["g2d", "w2", "b2"], ["y2"], name="proj_gemm"),
             nd("Reshape", ["y2", "back_d"], ["y"], name="proj_view_back")]
    g = helper.make_graph(nodes, "conv1d_mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [b, s, d])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [b, s, d])],
                          [numpy_helper.from_array(a, k) for k, a in inits.items()])
    return B.make_model(g)


def plan_of(model):
    return upto(model, NAMES[-1])


# ---------------------------------------------------------------- golden text


def test_golden_before_after():
    """The pass is a pure function of the IR before it: golden text both sides, parse round-trip."""
    before = upto(conv1d_mlp_model(), "lower")
    after = SV.sink_views(before)
    assert after != before
    check_golden("sink_views_conv1d_before.txt", str(before))
    check_golden("sink_views_conv1d_after.txt", str(after))
    for ir in (before, after):
        verify_program(ir)
        assert parse_program(str(ir), {w.name: w.data for w in ir.weights}) == ir


def test_gelu_becomes_the_gemm_epilogue():
    """The eight GELU maps run over [B·S, FF]; the bias is recomputed in them and the c_fc GEMM
    absorbs them: two GEMM kernels, no pointwise one."""
    after = upto(conv1d_mlp_model(), "sink_views")
    applied = [r.target for r in records(after, SV.RULE) if r.applied]
    assert applied == ["g0", "g1", "g2", "g3", "g4", "g5", "g6", "g"]
    assert not [r for r in records(after, SV.RULE) if not r.applied]
    ops = {op.out: op for op in after.ops}
    assert ops["g.merged"].type.shape == (8, 16) and ops["g"] == View("g", ops["g"].type, "g.merged", ops["g"].origin)
    assert "h" not in ops                                    # the view back to [B, S, FF] is read by nothing
    plan = plan_of(conv1d_mlp_model())
    assert [k.family for k in plan.kernels] == ["gemm", "gemm"]
    assert EPILOGUE_RULE in plan.kernels[0].rewrites and plan.kernels[0].stores == ("g.merged",)


def test_explain_names_the_rules():
    text = explain_text(aicfc.compile(conv1d_mlp_model(), jobs=1))
    assert f"applied  {SV.RULE!r} on g:" in text
    assert f"applied  {EPILOGUE_RULE!r} on h2.mm: 'g.merged' applied to the accumulator" in text


def test_every_stage_matches_onnxruntime():
    model = conv1d_mlp_model()
    inputs = B.random_inputs(model, seed=np.random.default_rng().integers(1 << 30))
    ref = B.run_onnxruntime(model, inputs)
    for stage, ir in list(stages(model).items())[1:]:
        err = rel_err(evaluate_ir(ir, inputs)["y"], ref["y"])
        assert err <= 1e-4, f"after {stage}: rel err {err:.2e}"


# ---------------------------------------------------------------- where it applies


def same_values(p: Program, q: Program, inputs: dict[str, np.ndarray]) -> None:
    got, ref = evaluate_program(q, inputs), evaluate_program(p, inputs)
    for name in p.outputs:
        np.testing.assert_array_equal(got[name], ref[name])


def test_bias_and_extent_one_dimensions_are_reindexed():
    """A bias read at [i2] (alone in its group) moves to the new variable; an extent-1
    dimension of the view reads 0; the result is a graph output through its view."""
    p = program("""lowered "t" {
  input %x: f32[6,4]
  %v: f32[2,1,3,4] = view %x
  %y: f32[2,1,3,4] = map add(load(%v, [i0, i1, i2, i3]), load(%b, [i1, i3]))
  output %y
}""", {"b": np.arange(4.0).reshape(1, 4)})
    q = SV.sink_views(p)
    verify_program(q)
    assert [print_op(op) for op in q.ops] == ["%y.merged: f32[6,4] = map add(load(%x, [i0, i1]), load(%b, [0, i1]))",
                                              "%y: f32[2,1,3,4] = view %y.merged"]
    same_values(p, q, {"x": np.random.default_rng(0).standard_normal((6, 4)).astype(np.float32)})


def test_a_residual_of_the_views_shape_is_read_through_its_merge_view():
    """A tensor of the map's shape read at its own index (a residual) is the same row-major
    bytes under the source's shape: read through a merge view, at the new own index."""
    p = program("""lowered "t" {
  input %x: f32[8,4]
  input %r: f32[2,4,4]
  %v: f32[2,4,4] = view %x
  %y: f32[2,4,4] = map add(load(%v, [i0, i1, i2]), load(%r, [i0, i1, i2]))
  output %y
}""", {})
    q = SV.sink_views(p)
    verify_program(q)
    assert [print_op(op) for op in q.ops] == ["%r.merged_view: f32[8,4] = view %r",
                                              "%y.merged: f32[8,4] = map add(load(%x, [i0, i1]), load(%r.merged_view, [i0, i1]))",
                                              "%y: f32[2,4,4] = view %y.merged"]
    rng = np.random.default_rng()
    same_values(p, q, {"x": rng.standard_normal((8, 4)).astype(np.float32),
                       "r": rng.standard_normal((2, 4, 4)).astype(np.float32)})


def test_a_reader_through_guarded_loads_or_a_convolution_does_not_keep_a_map_in_place():
    """A padded convolution reads the map through guarded loads (inline_producers never
    recomputes into those): the map still runs over the view's source, read back through the view."""
    p = program("""lowered "t" {
  input %x: f32[8,4]
  %v: f32[2,4,4] = view %x
  %a: f32[2,4,4] = map exp(load(%v, [i0, i1, i2]))
  %y: f32[2,4,4] = sum[3] load(%a, [i0, i1, i2+r0+-1], fill=0.0)
  output %y
}""", {})
    q = SV.sink_views(p)
    verify_program(q)
    assert [print_op(op) for op in q.ops][:2] == ["%a.merged: f32[8,4] = map exp(load(%x, [i0, i1]))",
                                                  "%a: f32[2,4,4] = view %a.merged"]
    same_values(p, q, {"x": np.random.default_rng().standard_normal((8, 4)).astype(np.float32)})


def test_a_pure_move_reader_keeps_no_map_in_place_that_is_stored_anyway():
    """ResNet-50's stage-1 output feeds the next block's 1x1 (a contraction, through a view) and a strided
    Slice (a pure move: one affine load, the projection's subsample before the concatenation). The map is
    stored for the contraction anyway, so the move reads it through the view back (fold_views composes
    the two) and the map still runs over the view's source, where a GEMM absorbs it as its epilogue.
    Read by the move alone it stays in place (recomputed in the move instead)."""
    text = """lowered "t" {
  input %x: f32[2,16,4]
  %v: f32[2,4,4,4] = view %x
  %a: f32[2,4,4,4] = map max(load(%v, [i0, i1, i2, i3]), 0.0)
  %s: f32[2,2,2,4] = map load(%a, [i0, 2*i1, 2*i2, i3])
%READER%  output %s
}"""
    w = {"w": np.ones((4, 3), np.float32)}
    p = program(text.replace("%READER%", """  %av: f32[2,16,4] = view %a
  %y: f32[2,16,3] = sum[4] mul(load(%av, [i0, i1, r0]), load(%w, [r0, i2]))
  output %y
"""), w)
    q = SV.sink_views(p)
    verify_program(q)
    assert [(r.target, r.applied) for r in records(q, SV.RULE)] == [("a", True)]
    rng = np.random.default_rng()
    same_values(p, q, {"x": rng.standard_normal((2, 16, 4)).astype(np.float32)})
    alone = program(text.replace("%READER%", ""), {})
    assert SV.sink_views(alone).ops == alone.ops


def test_chain_moves_as_a_whole_and_view_chains_collapse():
    """map → map over a split view: both rebuilt; the merging view after them is then a view of
    a view, which fold_views collapses and folds into the reader."""
    from aicfc.passes.fold_views import fold_views
    p = program("""lowered "t" {
  input %x: f32[8,4]
  %v: f32[2,4,4] = view %x
  %a: f32[2,4,4] = map tanh(load(%v, [i0, i1, i2]))
  %c: f32[2,4,4] = map mul(load(%a, [i0, i1, i2]), 2.0)
  %u: f32[8,4] = view %c
  %y: f32[8,1] = sum[4] load(%u, [i0, r0])
  output %y
}""", {})
    q = SV.sink_views(p)
    verify_program(q)
    assert [op.out for op in q.ops] == ["a.merged", "c.merged", "c", "u", "y"]
    assert [r.target for r in records(q, SV.RULE) if r.applied] == ["a", "c"]
    f = fold_views(q)
    assert [op.out for op in f.ops] == ["a.merged", "c.merged", "y"]
    assert {ld.buffer for ld in loads(f.ops[-1].body)} == {"c.merged"}
    x = {"x": np.random.default_rng(1).standard_normal((8, 4)).astype(np.float32)}
    same_values(p, q, x)
    same_values(p, f, x)


# ---------------------------------------------------------------- declines


DECLINES = [
    ("merged_variable", """lowered "t" {
  input %x: f32[8,4]
  input %r: f32[4,2,4]
  %v: f32[2,4,4] = view %x
  %y: f32[2,4,4] = map add(load(%v, [i0, i1, i2]), load(%r, [i1, i0, i2]))
  output %y
}""", {}, "y", "it reads 'r' at [i1, i0, i2], which uses merged variable(s) ['i0', 'i1']: over [8, 4] they "
     "have no variable of their own"),
    ("view_elsewhere", """lowered "t" {
  input %x: f32[8,4]
  %v: f32[2,4,4] = view %x
  %y: f32[2,4,4] = map add(load(%v, [i0, i1, i2]), load(%v, [i0, 0, i2]))
  output %y
}""", {}, "y", "it reads 'v' at [i0, 0, i2], which uses merged variable(s) ['i0']: over [8, 4] they have no "
     "variable of their own"),
    ("merging_view", """lowered "t" {
  input %x: f32[2,3,4]
  %v: f32[2,12] = view %x
  %y: f32[2,12] = map mul(load(%v, [i0, i1]), 2.0)
  output %y
}""", {}, "y", "reshape [2, 3, 4] → [2, 12] merges dimensions: target dimension 1 (12) spans more than source "
     "dimension 1 (3), so reading it needs div/mod, not an affine index"),
    ("guarded", """lowered "t" {
  input %x: f32[8,4]
  input %r: f32[2,4,2]
  %v: f32[2,4,4] = view %x
  %y: f32[2,4,4] = map add(load(%v, [i0, i1, i2]), load(%r, [i0, i1, i2], fill=0.0, guard=[2]))
  output %y
}""", {}, "y", "it reads 'r' through a guarded load, whose guard tests the dimensions of its domain"),
    ("indirect", """lowered "t" {
  input %x: f32[8,4]
  input %ids: i64[4]
  %v: f32[2,4,4] = view %x
  %y: f32[2,4,4] = map add(load(%v, [i0, i1, i2]), load(%e, [@load(%ids, [i1]), i2]))
  output %y
}""", {"e": np.ones((10, 4))}, "y", "it reads 'e' through an indirect (data-dependent) index"),
    ("reader_not_rebuilt", """lowered "t" {
  input %x: f32[8,4]
  %v: f32[2,4,4] = view %x
  %a: f32[2,4,4] = map exp(load(%v, [i0, i1, i2]))
  %y: f32[2,4,1] = sum[4] load(%a, [i0, i1, r0])
  output %y
}""", {}, "a", "its reader 'y' is not rebuilt with it and is no contraction: it would read it through the view "
     "back, and a producer read through a view is stored, no longer recomputed there"),
]


@pytest.mark.parametrize("case,text,weights,target,reason", DECLINES, ids=[c[0] for c in DECLINES])
def test_declines(case, text, weights, target, reason):
    p = program(text, weights)
    q = SV.sink_views(p)
    assert q.ops == p.ops
    assert [(r.target, r.applied, r.reason) for r in records(q, SV.RULE)] == [(target, False, reason)]


def test_a_declined_reader_keeps_its_producer_in_place():
    """c reads a residual at merged variables (permuted: no merge view reads it so), so c
    stays; then a (read by c at its own index) stays too: rebuilt, c would read it through the
    view back."""
    p = program("""lowered "t" {
  input %x: f32[8,4]
  input %r: f32[4,2,4]
  %v: f32[2,4,4] = view %x
  %a: f32[2,4,4] = map tanh(load(%v, [i0, i1, i2]))
  %c: f32[2,4,4] = map add(load(%a, [i0, i1, i2]), load(%r, [i1, i0, i2]))
  output %c
}""", {})
    q = SV.sink_views(p)
    assert q.ops == p.ops
    assert [(r.target, r.applied) for r in records(q, SV.RULE)] == [("a", False), ("c", False)]
    assert records(q, SV.RULE)[0].reason.startswith("its reader 'c' is not rebuilt with it")


def test_map_reading_views_only_elsewhere_is_no_match():
    """A head transpose reads the head-split view at permuted indices: no pattern, no record
    (fold_views folds that view into the attention instead)."""
    p = program("""lowered "t" {
  input %x: f32[2,4,8]
  %v: f32[2,4,2,4] = view %x
  %y: f32[2,2,4,4] = map load(%v, [i0, i2, i1, i3])
  output %y
}""", {})
    q = SV.sink_views(p)
    assert q == p
