"""A channel concatenation read only as a Hopper GEMM's A operand is not a kernel of its own
(passes/join_concat.py, [Note: a concatenation read by k-blocks]): the GEMM's producer loads each
input's k-blocks from that input's tensor map, a strided subsample's through an im2col map. Where it
applies (a projection's Concat, a general one) and where it is declined (an input read transposed,
`--pin concat=0`), what the plan records, the buffers' lifetimes, the Decision IR's text, the rendered
producer and maps, the projection decision's record, `aicfc tune`'s candidates; on the GPU the joined
GEMM against onnxruntime (max|y - ref| / max|ref|: fp16 1e-2) with inputs of equal and unequal widths,
subsampled, and a general Concat."""
from __future__ import annotations

import pytest

from aicfc.frontend.onnx_import import import_model
from aicfc.ir.decision import parse_plan, print_plan, verify_plan
from aicfc.passes.join_concat import RULE, parts
from aicfc.passes.pipeline import Options, run_pipeline
from aicfc.planner.hardware import load_profile
from tests import onnx_builders as B

MERGE = {"projection": "1"}


def _plan(stride: int, pin: dict | None = None, x=(2, 64, 56, 56), mid: int = 64):
    """The stem and the first block (its input the max pool's channels-last output, as in ResNet-50)."""
    model = B.resnet_stage_model(x, mid=mid, out=256, stride=stride, stem=True)
    opts = Options("sm_90", load_profile("sm_90"), "fp16", tuple((MERGE | (pin or {})).items()))
    return run_pipeline(import_model(model), opts).plan


def _record(plan):
    (rec,) = [r for r in plan.rewrites if r.rule == RULE]
    return rec


def test_the_stage_one_concat_is_read_by_k_blocks():
    plan = _plan(1)
    rec = _record(plan)
    assert rec.applied and rec.bytes_saved == 2 * 2 * 56 * 56 * 128 * 2 and "predicted" in rec.reason
    assert not any(k.family == "pointwise" and any(s.endswith(".cat") for s in k.stores) for k in plan.kernels)
    (g,) = [k for k in plan.kernels if k.inlined and k.family == "gemm"]
    assert g.family == "gemm" and g.schedule.param["unit"] == "wgmma" and RULE in g.rewrites
    (i,) = g.inlined
    assert i.op.out == rec.target and i.views and "b1.add" in g.origins
    # no bytes for the concatenation or its reshape; its inputs live until the GEMM reads them
    names = {b.name for b in plan.buffers}
    assert not names & i.names
    order = [k.name for k in plan.kernels]
    at = order.index(g.name)
    inputs = {ld.buffer for ld in g.loads()} - {w.name for w in plan.weights} - g.outs
    assert len(inputs) == 2 and not inputs & i.names
    by = {b.name: b for b in plan.buffers}
    for x in inputs:   # no kernel from x's writer to the GEMM stores over x's bytes
        lo, hi = by[x].offset, by[x].offset + by[x].type.nbytes
        writer = next(j for j, k in enumerate(plan.kernels) if x in k.stores)
        for k in plan.kernels[writer + 1:at + 1]:
            for s in k.stores:
                assert by[s].offset >= hi or by[s].offset + by[s].type.nbytes <= lo, (x, k.name, s)


def test_a_strided_subsample_is_read_in_im2col_mode():
    """Stage 2's entry: the projection's input every 2x2th pixel; the GEMM reads those k-blocks through an
    im2col map of the image (1x1, element strides 2), the tile's first pixel from m0 (at B2 the planner's
    pick for that GEMM is another unit: pinned)."""
    from aicfc.codegen import gemm_wgmma
    plan = _plan(2, {"b1.c3:unit": "wgmma"})
    rec = _record(plan)
    assert rec.applied and "subsampled 2x2" in rec.reason
    (g,) = [k for k in plan.kernels if k.inlined and k.family == "gemm"]
    types, p = plan.types(), g.schedule.param
    parts = gemm_wgmma.a_parts(g, p, types)
    assert [q["c0"] for q in parts] == [0, 64] and parts[0]["lines"] is None and parts[1]["lines"]
    im = parts[1]["map"]
    assert im.im2col.element_strides == (1, 2, 2, 1) and im.dims == (64, 56, 56, 2) and im.box[:2] == (64, parts[0]["op"].box[1])
    assert im.im2col.upper == (27 * 2 + 1 - 56,) * 2 and im.problems() is None
    assert gemm_wgmma.tensor_maps(g, p, types)[-1] == im
    src = gemm_wgmma.render_kernel(g, p, types, "k", _parts(g, p, types))
    assert "aicf_wgg_tma_im2col(" in src and "tma_a2, full" in src and "cw1 = tow1 * 2, ch1 = toh1 * 2" in src


def test_an_input_read_transposed_keeps_its_copy():
    """Without the stem the projection reads the graph's NCHW input: the Concat transposes it, which no map of
    the GEMM reads by k-blocks."""
    model = B.resnet_stage_model((2, 64, 28, 28), mid=64, out=256, stride=1)
    plan = run_pipeline(import_model(model), Options("sm_90", load_profile("sm_90"), "fp16", tuple(MERGE.items()))).plan
    rec = _record(plan)
    assert not rec.applied and "neither the result's pixel nor a strided subsample" in rec.reason
    assert any(k.family == "pointwise" and any(s.endswith(".cat") for s in k.stores) for k in plan.kernels)
    assert not any(k.inlined for k in plan.kernels if k.family == "gemm")


def _concat_model(n: int = 32):
    """A general channel Concat (not a projection's): a 3x3's output (64 channels) and a 1x1 over it (128), both
    after a ReLU, concatenated and read by a 1x1 whose output a 3x3 reads (so the 1x1 takes pixels as rows)."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper
    rng = np.random.default_rng(3)
    inits = []

    def w(name, *shape):
        inits.append(numpy_helper.from_array((rng.standard_normal(shape) / np.sqrt(np.prod(shape[1:]))).astype(np.float32),
                                             name))
        return name
    nodes = [helper.make_node("Conv", ["x", w("wa", 64, 64, 3, 3)], ["a"], name="a", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["a"], ["ar"], name="ar"),
             helper.make_node("Conv", ["ar", w("wb", 128, 64, 1, 1)], ["b"], name="b"),
             helper.make_node("Relu", ["b"], ["br"], name="br"),
             helper.make_node("Concat", ["ar", "br"], ["c"], name="cat", axis=1),
             helper.make_node("Conv", ["c", w("wc", 256, 192, 1, 1)], ["d"], name="d"),
             helper.make_node("Relu", ["d"], ["dr"], name="dr"),
             helper.make_node("Conv", ["dr", w("we", 64, 256, 3, 3)], ["y"], name="e", pads=[1, 1, 1, 1])]
    graph = helper.make_graph(nodes, "concat", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [n, 64, 28, 28])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [n, 64, 28, 28])], inits)
    return B.make_model(graph)


def test_a_general_concat_read_by_a_1x1():
    plan = run_pipeline(import_model(_concat_model()), Options("sm_90", load_profile("sm_90"), "fp16")).plan
    rec = _record(plan)
    assert rec.applied and "the Concat of ar, br" in rec.reason
    (g,) = [k for k in plan.kernels if k.inlined and k.family == "gemm"]
    assert "cat" in g.origins and "d" in g.origins
    assert [(q.c0, q.width, q.stride) for q in parts(g.inlined[0].op, plan.types())] == [(0, 64, None), (64, 128, None)]


def test_pin_keeps_the_copy():
    plan = _plan(1, {"concat": "0"})
    rec = _record(plan)
    assert not rec.applied and rec.reason == "--pin concat=0"
    assert not any(k.inlined for k in plan.kernels if k.family == "gemm")


def test_decision_ir_text_round_trips():
    plan = _plan(1)
    data = {w.name: w.data for w in plan.weights}
    again = parse_plan(print_plan(plan), data)
    verify_plan(again)
    assert [k.inlined for k in again.kernels] == [k.inlined for k in plan.kernels]
    assert "    inlined [" in print_plan(plan)


def test_the_producer_loads_each_input_from_its_map():
    from aicfc.codegen import gemm_wgmma
    plan = _plan(1, mid=128)
    (g,) = [k for k in plan.kernels if k.inlined and k.family == "gemm"]
    types = plan.types()
    p = g.schedule.param
    maps = gemm_wgmma.tensor_maps(g, p, types)
    parts = gemm_wgmma.a_parts(g, p, types)
    assert [q["c0"] for q in parts] == [0, 128] and maps[0] == parts[0]["map"] and maps[-1] == parts[1]["map"]
    assert maps[0].dims[0] == 128 and maps[-1].dims[0] == 64    # each input's own channels
    src = gemm_wgmma.render_kernel(g, p, types, "k", {**_parts(g, p, types)})
    assert "if (k0 < 128)" in src and "tma_a2, full" in src and "(k0 - 128)" in src


def _parts(g, p, types):
    """The render parts codegen/gemm.py builds, through its own entry (the signature and epilogue)."""
    from aicfc.codegen import gemm
    captured = {}
    real = gemm.gemm_wgmma.render_kernel
    gemm.gemm_wgmma.render_kernel = lambda k, p, types, name, parts: captured.update(parts) or ""
    try:
        gemm.render_kernel(g, p, types, "k")
    finally:
        gemm.gemm_wgmma.render_kernel = real
    return captured


@pytest.mark.gpu
def test_gpu_general_concat(gpu_device):
    """The general Concat read by k-blocks (inputs of 64 and 128 channels), against onnxruntime."""
    from tests.test_conv_wgmma import _gpu_check
    payload = _gpu_check(_concat_model(4), "fp16", gpu_device, {"d:unit": "wgmma", "d:FLAT": 1}, ref="onnxruntime")
    assert not any(k["family"] == "pointwise" and "cat" in k["onnx_nodes"] for k in payload["kernels"])


@pytest.mark.gpu
@pytest.mark.parametrize("x,mid,stride", [((4, 64, 56, 56), 64, 1), ((2, 64, 28, 28), 128, 1), ((4, 64, 56, 56), 64, 2),
                                          ((2, 64, 30, 30), 128, 2)], ids=["64+64", "128+64", "s2_64+64", "s2_odd"])
def test_gpu_joined_concat(x, mid, stride, gpu_device):
    """The stem and a stage's entry with the projection merged and its concatenation read by k-blocks: inputs
    of equal and of unequal widths, the projection's input subsampled (stride 2, read in im2col mode; 30x30:
    tiles that cross rows and images at odd places), against onnxruntime."""
    from tests.test_conv_wgmma import _gpu_check
    model = B.resnet_stage_model(x, mid=mid, out=256, stride=stride, seed=7, stem=True)
    payload = _gpu_check(model, "fp16", gpu_device, MERGE | {"b1.c3:unit": "wgmma", "b1.c3:FLAT": 1}, ref="onnxruntime")
    assert not any("b1.add" in k["onnx_nodes"] and k["family"] == "pointwise" for k in payload["kernels"])
    assert any("b1.add" in k["onnx_nodes"] and k["params"].get("unit") == "wgmma" for k in payload["kernels"])


def test_the_projection_decision_counts_no_copy():
    """pipeline.decide_projections weighs a merged site whose concatenation the GEMM will read by k-blocks
    without the copy (join_concat.joins_by_prediction), and says so in its record."""
    from aicfc.passes.concat_projections import CONCAT_PROJECTION_RULE
    model = B.resnet_stage_model((8, 64, 56, 56), mid=64, out=256, stride=1, stem=True)
    plan = run_pipeline(import_model(model), Options("sm_90", load_profile("sm_90"), "fp16")).plan
    (rec,) = [r for r in plan.rewrites if r.rule == CONCAT_PROJECTION_RULE]
    assert rec.applied and "the merged GEMM reading the concatenation by k-blocks (1 kernels)" in rec.reason
    assert _record(plan).applied


def test_tune_renders_only_candidates_that_read_by_k_blocks():
    """`aicfc tune` renders a joined GEMM's other candidates: those of another unit, or of a k-block that would cut
    an input's channels, cannot read the concatenation by k-blocks and are left out (join_concat.keeps)."""
    from aicfc.codegen import gemm_wgmma
    from aicfc.passes.plan_schedules import rank
    from aicfc.tune import candidates
    plan = _plan(2, {"b1.c3:unit": "wgmma"})
    (g,) = [k for k in plan.kernels if k.inlined and k.family == "gemm"]
    hw = load_profile("sm_90")
    every = rank(g, plan, hw)[0]
    assert any(dict(r.params).get("unit") != "wgmma" for r in every)
    (kt,) = candidates(plan, hw, only=[g.name])
    assert kt.candidates and all(c.params["unit"] == "wgmma" and c.params["FLAT"] == 1 for c in kt.candidates)
    for c in kt.candidates:   # each renders, with the subsample's im2col load
        assert "aicf_wgg_tma_im2col(" in gemm_wgmma.render_kernel(g, c.params, plan.types(), "k", _parts(g, c.params, plan.types()))
