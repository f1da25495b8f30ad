"""A projection shortcut's 1x1 and the block's last 1x1, summed, as one 1x1 over the concatenation of
their inputs (passes/concat_projections.py): where it is legal, the pipeline's decision by the planner's
predictions (passes/pipeline.decide_projections) with its figures, the pins that override it; the same
values as onnxruntime through the interpreter at fp32 and, on the GPU, the compiled plan (max|y - ref| /
max|ref|: fp32 1e-4, fp16 and bf16 1e-2)."""
from __future__ import annotations

import numpy as np
import pytest

from aicfc.errors import AicfError
from aicfc.frontend.onnx_import import import_model
from aicfc.ir.interp import evaluate_program
from aicfc.passes.canonicalize import canonicalize
from aicfc.passes.concat_projections import CONCAT_PROJECTION_RULE
from aicfc.passes.pipeline import PIPELINE, Options, decide_projections, run_pipeline
from aicfc.planner.hardware import load_profile
from tests import onnx_builders as B
from tests.test_pipeline import rel_err

MERGE = {"projection": "1"}


def _ops(g) -> list[str]:
    return [n.op for n in g.nodes]


@pytest.mark.parametrize("stride", [1, 2])
def test_merged_where_it_saves_bytes(stride):
    """Out 128 channels from 32 + 64 input channels: the merged 1x1 reads a [.., 96, ..] concatenation
    (a strided Slice of the block input first at stride 2), with the weights side by side and the
    biases added; the projection's Conv and the Add are gone, the ReLU stays."""
    model = B.resnet_stage_model(x=(2, 64, 8, 8), mid=32, out=128, stride=stride)
    g = canonicalize(import_model(model), MERGE)
    cat = [n for n in g.nodes if n.op == "Concat"]
    assert len(cat) == 1 and cat[0].attr["rule"] == CONCAT_PROJECTION_RULE
    assert g.types()[cat[0].output].shape == (2, 96, 8 // stride, 8 // stride)
    assert ("Slice" in _ops(g)) == (stride == 2)
    assert cat[0].attr["saved"] == 2 * 2 * (8 // stride) ** 2 * (128 - 96) * 4
    assert cat[0].attr["why"] == "--pin projection=1" and cat[0].attr["site"] == "b1.sum"
    assert set(cat[0].attr["nodes"]) == {"b1.add", "b1.c3", "b1.down"}
    # one MatMul fewer: b1.c1, the merged one, b2.c1, b2.c3 (the 3x3s stay convolutions)
    assert _ops(g).count("MatMul") == 4 and _ops(g).count("Conv") == 2


def test_pins_and_the_stages_alone():
    """`--pin projection=0` merges nothing, `projection=1` every legal site (even where the bytes do not
    pay: 64 out channels from 32 + 64); the stages run alone (no pipeline decision) merge nothing; a bad
    value is a one-line error."""
    model = B.resnet_stage_model(x=(2, 64, 8, 8), mid=32, out=64, stride=1)
    assert "Concat" not in _ops(canonicalize(import_model(model), {"projection": "0"}))
    assert "Concat" not in _ops(canonicalize(import_model(model)))
    (cat,) = [n for n in canonicalize(import_model(model), MERGE).nodes if n.op == "Concat"]
    assert cat.attr["saved"] < 0
    with pytest.raises(AicfError, match="projection=0"):
        canonicalize(import_model(model), {"projection": "yes"})


@pytest.mark.parametrize("x,mid,out,stride,merged", [((8, 64, 56, 56), 64, 256, 1, True),
                                                     ((32, 512, 28, 28), 256, 1024, 2, False)],
                         ids=["stage1_b8", "stage3_b32"])
def test_decided_by_the_planners_predictions(x, mid, out, stride, merged):
    """ResNet-50's first block (memory-bound: the 51 MB-at-B32 result not written and read back) merges;
    its stage-3 entry at B32 (the merged GEMM's k-loop longer than the two apart) stays apart; both with
    the predicted times of the kernels covering the site, merged against apart. (The stage-4 entry at B8,
    this test's second case before session 26, now merges by a small margin: its merged GEMM's k-splits
    run as a cluster, [Note: k-splits as a cluster] in codegen/gemm_wgmma.py.)"""
    g = import_model(B.resnet_stage_model(x, mid=mid, out=out, stride=stride))
    opts, declined, resume = decide_projections(g, Options("sm_90", load_profile("sm_90"), "fp16"))
    assert resume is not None and resume.projections == (opts.projections and tuple((s, "") for s, _ in opts.projections))
    if merged:
        ((site, why),) = opts.projections
        assert site == "b1.sum" and not declined
    else:
        assert opts.projections == () and len(declined) == 1
        why = declined[0].reason
        assert not declined[0].applied and declined[0].rule == CONCAT_PROJECTION_RULE
    assert "predicted" in why and " us apart (2 kernels)" in why
    t_merged, t_apart = (float(why.split(w)[1].split()[0]) for w in ("predicted ", "against "))
    assert (t_merged < t_apart) == merged


def test_pinned_pipeline_decides_nothing():
    g = import_model(B.resnet_stage_model((8, 64, 56, 56), mid=64, out=256, stride=1))
    opts = Options("sm_90", load_profile("sm_90"), "fp16", (("projection", "0"),))
    assert decide_projections(g, opts) == (opts, [], None)


def test_only_a_sum_of_two_unshared_pointwise_convolutions():
    """The identity block's Add (a conv plus the block input) and a projection whose result something
    else reads stay as they are."""
    model = B.resnet_stage_model(x=(2, 64, 8, 8), mid=32, out=128, stride=2)
    g = canonicalize(import_model(model), MERGE)
    adds = [n for n in g.nodes if n.op == "Add" and n.output.startswith("b2")]
    assert adds, _ops(g)   # the second block's residual add is untouched
    # a second reader of the projection: declined
    import onnx
    from onnx import helper
    m = B.resnet_stage_model(x=(2, 64, 8, 8), mid=32, out=128, stride=2)
    m.graph.node.append(helper.make_node("Relu", ["b1.down.n"], ["extra"], name="extra"))
    m.graph.output.append(helper.make_tensor_value_info("extra", onnx.TensorProto.FLOAT, None))
    assert "Concat" not in _ops(canonicalize(import_model(m), MERGE))


@pytest.mark.parametrize("stride", [1, 2])
def test_same_values_as_onnxruntime(stride):
    model = B.resnet_stage_model(x=(2, 64, 8, 8), mid=32, out=128, stride=stride)
    feeds = B.random_inputs(model, 3)
    ref = B.run_onnxruntime(model, feeds)
    ir = import_model(model)
    opts = Options("sm_90", load_profile("sm_90"), "fp32", tuple(MERGE.items()))
    for stage in PIPELINE[:PIPELINE.index(next(s for s in PIPELINE if s.name == "form_kernels"))]:
        ir = stage.run(ir, opts)
    assert any(op.out.endswith(".cat") for op in ir.ops)
    got = evaluate_program(ir, feeds)
    assert all(rel_err(np.asarray(got[n]), np.asarray(r, np.float64)) < 1e-4 for n, r in ref.items())


def test_explain_records_the_decision():
    """The first block at B8 merged by cost: the record in the plan states the predicted times; kept
    apart, the stage-3 entry's at B32 says so."""
    merged = run_pipeline(import_model(B.resnet_stage_model((8, 64, 56, 56), mid=64, out=256, stride=1)),
                          Options("sm_90", load_profile("sm_90"), "fp16")).plan
    (rec,) = [r for r in merged.rewrites if r.rule == CONCAT_PROJECTION_RULE]
    assert rec.applied and "predicted" in rec.reason and rec.bytes_saved > 0
    apart = run_pipeline(import_model(B.resnet_stage_model((32, 512, 28, 28), mid=256, out=1024, stride=2)),
                         Options("sm_90", load_profile("sm_90"), "fp16")).plan
    (kept,) = [r for r in apart.rewrites if r.rule == CONCAT_PROJECTION_RULE]
    assert not kept.applied and kept.reason.startswith("kept apart: predicted")
    assert rec.target == kept.target == "b1.sum"      # both records name the site: the sum the merge replaces


@pytest.mark.gpu
@pytest.mark.parametrize("stride,precision", [(1, "fp16"), (2, "fp16"), (2, "bf16")])
def test_gpu_merged_projection(stride, precision, gpu_device):
    """ResNet-50's stage-1 and stage-2 entries (stride 1 and 2) with the projection merged, against
    onnxruntime."""
    from tests.test_conv_wgmma import _gpu_check
    model = B.resnet_stage_model((4, 64, 28, 28), mid=64, out=256, stride=stride, seed=5)
    payload = _gpu_check(model, precision, gpu_device, MERGE, ref="onnxruntime")
    assert any("b1.add" in k["onnx_nodes"] and k["family"] == "pointwise" for k in payload["kernels"])   # the copy
