"""Convolutions on the Hopper engine: the channels-last layout pass (passes/channels_last.py),
the implicit GEMM on wgmma (codegen/conv_wgmma.py) and its cost terms
(planner/cost_conv_wgmma.py).

CPU: the layout pass is an identity under the interpreter; a ResNet stage's plan runs its
convolutions on wgmma over NHWC with the filters re-laid out, and says why; what is declined
says why; the generated CUDA builds for sm_90a with HGMMA in the SASS, no local memory and no
spills. GPU (`gpu`): convolutions against numpy float64, ResNet-style stages against
onnxruntime; tolerances on max|y - ref| / max|ref|: fp16 1e-2, bf16 2e-2.
"""
from __future__ import annotations

import shutil
import subprocess

import numpy as np
import onnx
import pytest

from aicfc.codegen import conv_wgmma
from aicfc.frontend.onnx_import import import_model
from aicfc.passes.channels_last import INPUT_RULE, RULE, WEIGHT_RULE
from aicfc.passes.pipeline import PIPELINE, Options, run_pipeline
from aicfc.planner.hardware import load_profile
from tests import onnx_builders as B
from tests.test_pipeline import evaluate_ir, rel_err

GPU_RTOL = {"fp16": 1e-2, "bf16": 2e-2}


def _stages(model, precision: str = "fp16", pin: dict | None = None) -> dict:
    opts = Options("sm_90", load_profile("sm_90"), precision, tuple(sorted((pin or {}).items())))
    ir = import_model(model)
    out = {}
    for stage in PIPELINE:
        ir = stage.run(ir, opts)
        out[stage.name] = ir
    return out


def _records(plan, rule: str) -> list:
    return [r for r in plan.rewrites if r.rule == rule]


def _conv(x, w, **attrs):
    return B.conv_model(x, w, bn=True, act="relu", **attrs)


# ---------------------------------------------------------------- the layout pass


@pytest.mark.parametrize("build", [
    lambda: B.resnet_stage_model(),
    lambda: B.resnet_stage_model(stem=True),
    lambda: _conv((2, 16, 9, 9), (24, 16, 3, 3), pads=[1, 1, 1, 1]),
    lambda: _conv((1, 8, 11, 11), (16, 8, 3, 3), dilations=[2, 2], pads=[2, 2, 2, 2], strides=[2, 2]),
], ids=["stage", "stage_stem", "conv3x3", "dilated_strided"])
def test_channels_last_is_an_identity(build):
    """Before and after the pass, the interpreter computes the same outputs (pinned to wgmma so
    that every input copy is made too)."""
    model = build()
    inputs = B.random_inputs(model, seed=5)
    # the 3-channel stem cannot run on wgmma, so a model with one is not pinned
    stem = any(n.name == "stem" for n in model.graph.node)
    st = _stages(model, pin=None if stem else {"unit": "wgmma"})
    before, after = evaluate_ir(st["apply_precision"], inputs), evaluate_ir(st["channels_last"], inputs)
    assert st["channels_last"] != st["apply_precision"]
    for name in before:
        assert rel_err(after[name], before[name].astype(np.float64)) < 1e-6
    ref = B.run_onnxruntime(model, inputs)
    final = evaluate_ir(st["plan_memory"], inputs)
    assert all(rel_err(final[n], r) < 1e-2 for n, r in ref.items())


def test_resnet_stage_plan_is_channels_last_on_wgmma():
    """ResNet-50's layer2 entry at batch 8: both bottlenecks' 3x3 convolutions run on the Hopper
    engine; every intermediate is stored NHWC by its writer (no copy), the 1x1 GEMMs' outputs
    too; the filters are [O, KH, KW, C]; only the graph output keeps ONNX's layout. The strided
    projection reads the graph input, whose copy to NHWC is a cost decision with its figures. (The
    projection kept apart from the block's last 1x1: tests/test_concat_projections.py merges them.)"""
    plan = _stages(B.resnet_stage_model((8, 256, 28, 28), mid=128, out=512, stride=2),
                   pin={"projection": "0"})["plan_memory"]
    convs = {k.origins[0]: k for k in plan.kernels if k.family == "conv"}
    assert set(convs) == {"b1.c2", "b2.c2", "b1.down"}
    for name in ("b1.c2", "b2.c2"):
        k = convs[name]
        assert k.schedule.param["unit"] == "wgmma", k.schedule.param
        assert conv_wgmma.k_order(k, plan.types())[-1] == "r0"          # channels innermost in k
        assert k.schedule.param["STAGES"] >= 3
    (copy,) = _records(plan, INPUT_RULE)
    assert "predicted" in copy.reason and " us " in copy.reason
    assert convs["b1.down"].schedule.param["unit"] == ("wgmma" if copy.applied else "mma")
    applied = {r.target for r in _records(plan, RULE) if r.applied}
    assert {"b1.c1.r.merged", "b1.c2.r", "b1.down.n", "b1.out.merged", "b2.c1.r.merged", "b2.c2.r"} <= applied
    assert all("0 bytes added" in r.reason for r in _records(plan, RULE) if r.applied)
    declined = [r for r in _records(plan, RULE) if not r.applied]
    assert [r.target for r in declined] == ["out.merged"] and "graph output" in declined[0].reason
    types = plan.types()
    assert types["b1.c2.r"].shape == (8, 14, 14, 128) and types["b1.out.merged"].shape == (8, 196, 512)
    filters = {r.target for r in _records(plan, WEIGHT_RULE) if r.applied}
    assert {"b1.c2.n.w", "b2.c2.n.w"} <= filters
    assert types["b1.c2.n.w"].shape == (128, 3, 3, 128)


def test_pointwise_convs_take_pixels_as_rows():
    """The 1x1 convolutions' GEMMs written channels-last multiply x[n, p, c] by w[o, c] with the
    image first (`channels_last.pixels_as_rows`, a cost decision recorded as ROWS_RULE): m is the pixel, n the output channel, the
    stored tensor's contiguous axis. So a residual add in their epilogue reads (and the store
    writes) two adjacent channels at once instead of lone elements 2·OC bytes apart; the
    rendered epilogue reads the residual and stores the output as __half2 pairs. (The projection kept
    apart, so that a residual add is there to read.)"""
    from aicfc.codegen import FAMILIES
    from aicfc.ir.properties import contraction
    plan = _stages(B.resnet_stage_model((4, 64, 28, 28), mid=64, out=256, stride=2), pin={"projection": "0"})["plan_memory"]
    weights = {w.name for w in plan.weights}
    nhwc = {r.target for r in _records(plan, RULE) if r.applied}
    gemms = [k for k in plan.kernels if k.family == "gemm" and set(k.stores) <= nhwc]
    assert len(gemms) == 3
    for k in gemms:
        g = contraction(k.ops[0])
        assert g.b.buffer in weights and g.a.buffer not in weights, k.ops[0]
        assert g.n == k.ops[0].domain_vars[-1]          # the channel: contiguous in the output
    from aicfc.passes.channels_last import ROWS_RULE
    rows = _records(plan, ROWS_RULE)
    assert len(rows) == 3 and all(r.applied and "with the pixels as rows against" in r.reason for r in rows)
    residual = [k for k in gemms if len(k.ops) == 2 and "b1.add" in k.origins]
    assert residual, [k.origins for k in gemms]
    for k in residual:
        src = FAMILIES[k.family].render_kernel(k, k.schedule.param, plan.types(), k.name)
        assert "__half2" in src, src[-3000:]
        # the residual is read as channel pairs (gemm.paired_loads): one 4-byte load per pair
        assert "const __half2 pr0 = __ldg(reinterpret_cast<const __half2*>(" in src, src[-3000:]


def test_channels_last_max_pool_moves_vectors():
    """The max pool after the stem reads a channels-last image: 8 channels a thread, each tap one
    16-byte load under one padding test (`window.vector_width`); the rendered kernel loads and
    stores 8-element vectors."""
    from aicfc.codegen import FAMILIES
    plan = _stages(B.resnet_stage_model((2, 64, 28, 28), mid=64, out=256, stride=2, stem=True))["plan_memory"]
    (pool,) = [k for k in plan.kernels if k.family == "window"]
    assert pool.schedule.param["vec"] == 8, pool.schedule.param
    src = FAMILIES["window"].render_kernel(pool, pool.schedule.param, plan.types(), pool.name)
    assert "aicf_vload<8>" in src and "aicf_vstore<8>" in src


def test_declined_with_reasons():
    grouped = _stages(B.conv_model((2, 32, 16, 16), (64, 8, 3, 3), group=4, pads=[1, 1, 1, 1]))["plan_memory"]
    (k,) = [k for k in grouped.kernels if k.family == "conv"]
    assert k.schedule.param["unit"] != "wgmma"
    assert not _records(grouped, RULE) and not _records(grouped, INPUT_RULE)
    fp32 = _stages(_conv((2, 64, 16, 16), (64, 64, 3, 3), pads=[1, 1, 1, 1]), "fp32")
    assert fp32["channels_last"] is fp32["apply_precision"]
    # 3 channels computed by a kernel (not a graph input, whose copy could pad them): no 16-byte runs
    model = B.conv_model((2, 3, 32, 32), (64, 3, 7, 7), strides=[2, 2], pads=[3, 3, 3, 3])
    model.graph.node.insert(0, onnx.helper.make_node("Sigmoid", ["in0"], ["s0"], name="sig"))
    model.graph.node[1].input[0] = "s0"
    stem = _stages(model)["plan_memory"]
    (k,) = [k for k in stem.kernels if k.family == "conv"]
    reasons = [c.rejected_because for c in k.schedule.candidates if dict(c.params).get("unit") == "wgmma"]
    assert reasons and "16-byte runs" in reasons[0]


def test_stem_channels_padded_to_eight():
    """A 3-channel 7x7 stem on wgmma: the input copy writes 8 channels (zeros past 3), the filter
    gets 5 zero channels, the convolution sums over 8; the interpreter's outputs do not change.
    (unfold=0: the padded copy as channels_last makes it; test_unfold_taps.py unfolds it.)"""
    model = B.conv_model((2, 3, 32, 32), (64, 3, 7, 7), bn=True, act="relu", strides=[2, 2], pads=[3, 3, 3, 3])
    st = _stages(model, pin={"unit": "wgmma", "unfold": "0"})
    plan = st["plan_memory"]
    copy, k = plan.kernels
    assert copy.family == "pointwise" and copy.ops[0].type.shape == (2, 32, 32, 8)
    # one thread per pixel: 3 loads coalesced along w, one 16-byte store of the 8 channels
    assert copy.schedule.param["vec"] == 8
    from aicfc.codegen import FAMILIES
    src = FAMILIES["pointwise"].render_kernel(copy, copy.schedule.param, plan.types(), copy.name)
    assert "aicf_vstore<8>" in src
    assert k.schedule.param["unit"] == "wgmma" and k.ops[0].reduce == (8, 7, 7)
    assert plan.types()[_records(plan, WEIGHT_RULE)[0].target].shape == (64, 7, 7, 8)
    assert "5 zero channels" in _records(plan, WEIGHT_RULE)[0].reason
    inputs = B.random_inputs(model, seed=2)
    before, after = evaluate_ir(st["apply_precision"], inputs), evaluate_ir(plan, inputs)
    assert rel_err(after["out"], before["out"].astype(np.float64)) < 1e-6


def test_input_copy_is_a_cost_decision():
    """A small convolution's input copy does not pay for itself (both predicted times recorded);
    --pin unit=wgmma makes it anyway; a large one's does."""
    small = _conv((1, 8, 6, 6), (8, 8, 3, 3), pads=[1, 1, 1, 1])
    (r,) = _records(_stages(small)["plan_memory"], INPUT_RULE)
    assert not r.applied and "does not pay" in r.reason and " us " in r.reason
    pinned = _stages(small, pin={"unit": "wgmma"})["plan_memory"]
    assert [k.family for k in pinned.kernels] == ["pointwise", "conv"]
    assert pinned.kernels[1].schedule.param["unit"] == "wgmma"
    big = _stages(_conv((32, 64, 56, 56), (64, 64, 3, 3), pads=[1, 1, 1, 1]))["plan_memory"]
    (r,) = _records(big, INPUT_RULE)
    assert r.applied and r.bytes_saved == -2 * 32 * 64 * 56 * 56 * 2 and "predicted" in r.reason
    (k,) = [k for k in big.kernels if k.family == "conv"]
    assert k.schedule.param["unit"] == "wgmma"
    terms = dict(k.schedule.predicted)
    assert {"t_gather_us", "gathered_bytes", "t_compute_us"} <= set(terms)


def test_token_sequences_keep_their_layout():
    """A ViT-style patch embedding: the convolution's output is an image (relabelled), the
    [n, s, d] tokens read from it are not (their last axis stays the hidden one)."""
    rng = np.random.default_rng(0)
    inits = {"w": (rng.standard_normal((64, 3, 8, 8)) / 14).astype(np.float32), "b": np.zeros(64, np.float32),
             "shape": np.array([2, 64, 16], np.int64), "pos": rng.standard_normal((1, 16, 64)).astype(np.float32),
             "fc": (rng.standard_normal((64, 64)) / 8).astype(np.float32)}
    nodes = [onnx.helper.make_node("Conv", ["in0", "w", "b"], ["c"], strides=[8, 8], kernel_shape=[8, 8]),
             onnx.helper.make_node("Reshape", ["c", "shape"], ["r"]),
             onnx.helper.make_node("Transpose", ["r"], ["t"], perm=[0, 2, 1]),
             onnx.helper.make_node("Add", ["t", "pos"], ["a"]),
             onnx.helper.make_node("MatMul", ["a", "fc"], ["out"])]
    model = B._infer_output(B._graph_model(nodes, "patches", {"in0": (2, 3, 32, 32)}, {}, inits))
    plan = _stages(model, pin={"unit": "wgmma"})["plan_memory"]
    relabelled = [plan.types()[r.target].shape for r in _records(plan, RULE) if r.applied]
    assert relabelled and all(len(s) == 4 for s in relabelled)
    assert [k.ops[-1].type.shape for k in plan.kernels if k.family == "gemm"] == [(2, 16, 64)]
    inputs = B.random_inputs(model, seed=4)
    assert rel_err(evaluate_ir(plan, inputs)["out"], B.run_onnxruntime(model, inputs)["out"]) < 1e-2


# ---------------------------------------------------------------- nvcc / SASS


NVCC_CASES = [
    ("3x3", dict(x=(2, 128, 14, 14), w=(256, 128, 3, 3), pads=[1, 1, 1, 1])),
    ("7x7_s2_c8", dict(x=(2, 8, 32, 32), w=(200, 8, 7, 7), strides=[2, 2], pads=[3, 3, 3, 3])),
    ("1x1_s2", dict(x=(2, 64, 28, 28), w=(256, 64, 1, 1), strides=[2, 2])),
    ("dilated", dict(x=(1, 16, 13, 13), w=(16, 16, 3, 3), dilations=[2, 2], pads=[2, 2, 2, 2])),
]
NVCC_PINS = [dict(NWG=1, MI=1, BN=64), dict(NWG=2, MI=1, BN=256), dict(NWG=1, MI=2, BN=128), dict(NWG=2, MI=1, BN=128),
             dict(NWG=3, MI=1, BN=128)]


def _cuobjdump() -> str | None:
    return shutil.which("cuobjdump")


def _built(case, pin: dict, tmp_path, monkeypatch, follow: int = 0):
    """(kernel, Built) of the convolution `case` pinned to wgmma with `pin`, or None when the pin
    is outside its space (BN wider than its channels); with `follow`, a 1x1 convolution follows it
    (so it stores a channels-last tensor inside the graph, not the NCHW output)."""
    from aicfc.codegen.module import render_module
    from aicfc.codegen.nvcc import build
    from aicfc.errors import AicfError
    monkeypatch.setenv("AICF_CACHE_DIR", str(tmp_path))
    spec = dict(case[1])
    model = _conv(spec.pop("x"), spec.pop("w"), follow=follow, **spec)
    try:
        plan = _stages(model, pin=dict(pin, unit="wgmma"))["plan_memory"]
    except AicfError as e:
        assert "no feasible conv candidate matches --pin" in str(e)
        return None
    k = [k for k in plan.kernels if k.family == "conv"][0]
    assert k.schedule.param["unit"] == "wgmma"
    return k, build(render_module(plan), "sm_90")


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not found")
@pytest.mark.parametrize("case", NVCC_CASES, ids=[c for c, _ in NVCC_CASES])
def test_nvcc_builds_without_spills(case, tmp_path, monkeypatch):
    built = [b for pin in NVCC_PINS if (b := _built(case, pin, tmp_path, monkeypatch))]
    assert built
    for k, b in built:
        assert b.spills.get(k.name, 0) == 0, b.spills


@pytest.mark.skipif(shutil.which("nvcc") is None or _cuobjdump() is None, reason="nvcc or cuobjdump not found")
@pytest.mark.parametrize("case", NVCC_CASES[:2], ids=[c for c, _ in NVCC_CASES[:2]])
def test_sass_has_hgmma_and_no_local_memory(case, tmp_path, monkeypatch):
    """The activation tile comes in by the producers' cp.async gather (LDGSTS) or by the TMA's
    im2col mode (UTMALDG), as the pin says; the weights always by the TMA (UTMALDG)."""
    for pin in NVCC_PINS:
        for a, op in (("gather", "LDGSTS"), ("tma", "UTMALDG")):
            got = _built(case, dict(pin, A=a), tmp_path, monkeypatch)
            if got is None:
                continue
            cubin = tmp_path / "k.cubin"
            cubin.write_bytes(got[1].cubin)
            sass = subprocess.run([_cuobjdump(), "-sass", str(cubin)], capture_output=True, text=True).stdout
            assert "HGMMA" in sass and op in sass and "UTMALDG" in sass, (pin, a)
            assert not any(f" {op}" in sass for op in ("LDL", "STL")), (pin, a)


# ---------------------------------------------------------------- GPU


GPU_CONVS = [
    ("3x3_s1_p1", dict(x=(2, 64, 17, 17), w=(96, 64, 3, 3), pads=[1, 1, 1, 1])),
    ("3x3_s2_p1", dict(x=(1, 24, 15, 15), w=(40, 24, 3, 3), strides=[2, 2], pads=[1, 1, 1, 1])),
    ("7x7_s2_p3_c8", dict(x=(2, 8, 33, 33), w=(64, 8, 7, 7), strides=[2, 2], pads=[3, 3, 3, 3])),
    ("7x7_s2_p3_stem_c3", dict(x=(2, 3, 64, 64), w=(64, 3, 7, 7), strides=[2, 2], pads=[3, 3, 3, 3])),
    ("dilation2", dict(x=(1, 16, 13, 13), w=(16, 16, 3, 3), dilations=[2, 2], pads=[2, 2, 2, 2])),
    ("odd_sizes", dict(x=(3, 40, 11, 7), w=(72, 40, 3, 3), pads=[1, 1, 1, 1])),
    ("1x1_s2", dict(x=(2, 64, 14, 14), w=(136, 64, 1, 1), strides=[2, 2])),
    ("wide_k", dict(x=(2, 256, 9, 9), w=(256, 256, 3, 3), pads=[1, 1, 1, 1])),
]


def _gpu_check(model, precision, device, pin=None, ref=None):
    import aicfc
    from aicfc.ir.high import evaluate_graph
    from tests.conftest import run_payload
    payload = aicfc.compile(model, target=device.arch, precision=precision, pin=pin or {})
    graph = import_model(model, None)
    rng = np.random.default_rng()
    inputs = {v.name: rng.standard_normal(v.type.shape).astype(np.float32) for v in graph.inputs}
    want = B.run_onnxruntime(model, inputs) if ref == "onnxruntime" else evaluate_graph(graph, inputs, dtype=np.float64)
    got = run_payload(payload, inputs, device)
    for name, r in want.items():
        assert not np.isnan(got[name]).any(), f"{name}: NaN"
        err = rel_err(got[name], r)
        assert err <= GPU_RTOL[precision], f"{precision} {pin}: {name} rel err {err:.2e}"
    return payload


@pytest.mark.gpu
@pytest.mark.parametrize("precision", ["fp16", "bf16"])
@pytest.mark.parametrize("epilogue", ["bias", "bn_relu"])
@pytest.mark.parametrize("case", GPU_CONVS, ids=[c for c, _ in GPU_CONVS])
def test_gpu_conv_wgmma(case, epilogue, precision, gpu_device):
    spec = dict(case[1])
    act = {"bias": None, "bn_relu": "relu"}[epilogue]
    model = B.conv_model(spec.pop("x"), spec.pop("w"), bn=act is not None, act=act, **spec)
    payload = _gpu_check(model, precision, gpu_device, {"unit": "wgmma"})
    assert [k["params"]["unit"] for k in payload["kernels"] if k["family"] == "conv"] == ["wgmma"]


# every case the TMA's im2col mode reads (not the 24- and 40-channel ones: 8-channel runs, whole k-blocks)
THREE_WG = [c for c in GPU_CONVS if c[0] not in ("3x3_s2_p1", "odd_sizes")]


@pytest.mark.gpu
@pytest.mark.parametrize("case", THREE_WG, ids=[c for c, _ in THREE_WG])
def test_gpu_conv_three_warpgroups(case, gpu_device):
    """[Note: three warpgroups] (codegen/gemm_wgmma.py): 192-row tiles on three consumer warpgroups, the
    image read by the TMA (im2col, the 8-channel stem's taps too), against float64."""
    spec = dict(case[1])
    model = B.conv_model(spec.pop("x"), spec.pop("w"), bn=True, act="relu", **spec)
    payload = _gpu_check(model, "fp16", gpu_device, {"unit": "wgmma", "NWG": 3})
    assert [(k["params"]["NWG"], k["params"]["A"], k["params"]["SPLITK"]) for k in payload["kernels"]
            if k["family"] == "conv"] == [(3, "tma", 1)]


def test_three_warpgroups_read_by_the_tma():
    """[Note: three warpgroups]: the convolution engine offers 192-row tiles unsplit with A by the TMA
    only (no gathering producer, no halo tiles, no stream-k)."""
    spec = dict(GPU_CONVS[0][1])
    model = B.conv_model(spec.pop("x"), spec.pop("w"), bn=True, act="relu", **spec)
    plan = _stages(model, pin={"unit": "wgmma"})["plan_memory"]
    k = [k for k in plan.kernels if k.family == "conv"][0]
    hw = load_profile("sm_90")
    pts = [p for p in conv_wgmma.space(k, plan, hw.sm_count, hw.smem_per_block_optin) if p["NWG"] == 3]
    assert pts and all(p["A"] == "tma" and p["SPLITK"] == 1 and not p["STREAM"] and p["BM"] == 192 for p in pts)


@pytest.mark.parametrize("a", ["tma", "gather"])
def test_explain_names_what_binds_the_k_blocks(a):
    """`explain`'s formula names each rate that can bind a k-block (the TMA's im2col walk, the gathering
    producer's issue and round trips among them) and its terms add up to the prediction."""
    from aicfc.explain import _formula
    spec = dict(GPU_CONVS[0][1])
    model = B.conv_model(spec.pop("x"), spec.pop("w"), bn=True, act="relu", **spec)
    plan = _stages(model, pin={"unit": "wgmma", "A": a, "PP": 0, "STREAM": 0})["plan_memory"]
    (k,) = [k for k in plan.kernels if k.family == "conv"]
    t = dict(k.schedule.predicted)
    text = _formula(t)
    assert ("im2col walk" in text) == (a == "tma") and ("gather issue" in text) == (a == "gather")
    assert f"k-blocks {t['t_kblocks_us']:.2f} = max(" in text
    rates = [t["t_compute_us"], t["t_smem_us"], t["t_l2_us"], t["t_gather_us"], t["t_gather_round_us"],
             t["t_latency_us"]]
    assert t["t_kblocks_us"] == pytest.approx(max(rates))
    tiles = t["t_kblocks_us"] + t["t_epilogue_us"] + t["t_reduce_us"]
    assert t["time_us"] == pytest.approx(t["launch_us"] + t["t_pipeline_us"] + max(tiles, t["t_dram_us"]), abs=1e-6)


def test_explain_shows_the_tma_latency_binding_a_convolution():
    """A 3x3 whose k-blocks wait on the TMA's round trip over the boxes in flight (two at STAGES 3: [Note: im2col
    boxes in flight]) shows that latency as what binds its k-blocks, not as fill, and its terms add up."""
    from aicfc.explain import _formula
    model = B.conv_model((1, 256, 14, 14), (256, 256, 3, 3), bn=True, act="relu", pads=[1, 1, 1, 1])
    pin = {"unit": "wgmma", "A": "tma", "PP": 0, "STREAM": 0, "SPLITK": 1, "BM": 64, "BN": 64, "STAGES": 3}
    plan = _stages(model, pin=pin)["plan_memory"]
    (k,) = [k for k in plan.kernels if k.family == "conv"]
    t = dict(k.schedule.predicted)
    assert t["t_latency_us"] > max(t["t_compute_us"], t["t_smem_us"], t["t_l2_us"], t["t_gather_us"])
    assert t["t_kblocks_us"] == pytest.approx(t["t_latency_us"])
    text = _formula(t)
    assert f"k-blocks {t['t_kblocks_us']:.2f} = max(" in text and f"TMA latency {t['t_latency_us']:.2f})" in text
    tiles = t["t_kblocks_us"] + t["t_epilogue_us"] + t["t_reduce_us"]
    assert t["time_us"] == pytest.approx(t["launch_us"] + t["t_pipeline_us"] + max(tiles, t["t_dram_us"]), abs=1e-6)


@pytest.mark.gpu
@pytest.mark.parametrize("stem,pin", [(False, {}), (False, {"unit": "wgmma"}), (False, {"unit": "wgmma", "NWG": 2}),
                                      (False, {"unit": "wgmma", "NWG": 3}),
                                      (True, {}), (False, {"projection": "0"}), (False, {"unit": "wgmma", "projection": "0"})],
                         ids=["by_cost", "wgmma", "wgmma_nwg2", "wgmma_nwg3", "stem_by_cost", "apart", "apart_wgmma"])
def test_gpu_resnet_stage(stem, pin, gpu_device):
    """Two ResNet-50 bottlenecks (a strided projection, residual adds, ReLU epilogues), after a
    7x7 stem and max pool where `stem` (whose 3 channels keep it off wgmma, so it is not pinned),
    against onnxruntime at fp16; by cost the projection and the block's last 1x1 are one GEMM over
    a concatenation (passes/concat_projections.py), `projection=0` keeps the strided convolution."""
    model = B.resnet_stage_model((4, 64, 28, 28), mid=64, out=256, stride=2, stem=stem)
    _gpu_check(model, "fp16", gpu_device, pin, ref="onnxruntime")


@pytest.mark.gpu
@pytest.mark.parametrize("precision", ["fp16", "bf16"])
@pytest.mark.parametrize("x", [(3, 64, 36, 36), (2, 64, 30, 22)], ids=["square", "odd"])
def test_gpu_residual_pairs_stem_copy_and_pool_vectors(x, precision, gpu_device):
    """What the ResNet-50 B32 fixes changed, by cost (no pins), against numpy float64 on fresh
    random inputs: the stem's channels-last input copy stores one 16-byte vector a pixel
    (`pointwise._gathers_coalesced`), the max pool reads and writes 8 channels a thread
    (`window.vector_width`), the 1x1 convolutions' GEMMs take the pixels as rows
    (`channels_last.pixels_as_rows`) and their bias and residual are read as channel pairs
    (`gemm.paired_loads`), at fp16 and bf16. (`pooled=0`: by cost the stem and its pool are one kernel,
    unit `pool`, which tests/test_conv_pool.py checks at these shapes.)"""
    model = B.resnet_stage_model(x, mid=64, out=256, stride=2, stem=True, seed=7)
    payload = _gpu_check(model, precision, gpu_device, {"pooled": 0})
    fams = [k["family"] for k in payload["kernels"]]
    assert "window" in fams and "conv" in fams and "gemm" in fams


@pytest.mark.gpu
@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_gpu_wgmma_residual_pairs(precision, gpu_device):
    """The bottlenecks on the Hopper engine (pinned): the 1x1 GEMMs' residual epilogue reads
    channel pairs through the staged or register epilogue, against numpy float64."""
    model = B.resnet_stage_model((4, 64, 28, 28), mid=64, out=256, stride=1, seed=11)
    payload = _gpu_check(model, precision, gpu_device, {"unit": "wgmma"})
    assert {k["params"].get("unit") for k in payload["kernels"] if k["family"] in ("gemm", "conv")} == {"wgmma"}


def test_gatherers_keep_stages_minus_one_groups_in_flight():
    """The gathering producer publishes a stage STAGES - 2 k-blocks late (`gather_lag`): its
    `cp.async.wait_group` leaves that many groups in flight, the barrier it arrives on is that
    many k-blocks back, and the tail publishes what is left."""
    from aicfc.codegen.conv_wgmma import gather_lag
    from aicfc.codegen.module import render_module
    model = _conv((2, 64, 14, 14), (64, 64, 3, 3), pads=[1, 1, 1, 1])
    for st in (3, 4, 5, 6):
        plan = _stages(model, pin={"unit": "wgmma", "NWG": 2, "BN": 64, "STAGES": st, "A": "gather"})["plan_memory"]
        (k,) = [k for k in plan.kernels if k.family == "conv"]
        assert k.schedule.param["STAGES"] == st
        src = render_module(plan)
        lag = gather_lag(st)
        assert lag == st - 2
        assert f"cp.async.wait_group {lag};" in src and "cp.async.wait_group 0;" in src
        assert f"((it - {lag}) % {st})" in src


GATHER_DEPTHS = [
    # one k-block a tile, ~300 tiles over the CTAs: the gatherers' pending groups span tiles
    ("1x1_s2_persistent", dict(x=(16, 64, 56, 56), w=(136, 64, 1, 1), strides=[2, 2])),
    ("3x3_odd", dict(x=(3, 64, 30, 26), w=(96, 64, 3, 3), pads=[1, 1, 1, 1])),
]


@pytest.mark.gpu
@pytest.mark.parametrize("stages", [3, 4, 5, 6])
@pytest.mark.parametrize("case", GATHER_DEPTHS, ids=[c for c, _ in GATHER_DEPTHS])
def test_gpu_gather_depths(case, stages, gpu_device):
    """Every gather lag (STAGES - 2 = 1 to 4 k-blocks) against numpy float64 at fp16."""
    spec = dict(case[1])
    model = B.conv_model(spec.pop("x"), spec.pop("w"), bn=True, act="relu", **spec)
    payload = _gpu_check(model, "fp16", gpu_device, {"unit": "wgmma", "NWG": 2, "BN": 64, "STAGES": stages, "A": "gather"})
    (k,) = [k for k in payload["kernels"] if k["family"] == "conv"]
    assert k["params"]["unit"] == "wgmma" and k["params"]["STAGES"] == stages


# ---------------------------------------------------------------- A by the TMA's im2col mode


IM2COL_CASES = [
    # name, conv, expected (lower, upper, element strides) of the image's map
    ("3x3_s1_p1", dict(x=(2, 64, 17, 17), w=(96, 64, 3, 3), pads=[1, 1, 1, 1]), ((-1, -1), (-1, -1), (1, 1, 1, 1))),
    ("3x3_s2_p1", dict(x=(1, 64, 15, 15), w=(40, 64, 3, 3), strides=[2, 2], pads=[1, 1, 1, 1]),
     ((-1, -1), (-1, -1), (1, 2, 2, 1))),
    ("1x1_s2", dict(x=(2, 64, 14, 14), w=(136, 64, 1, 1), strides=[2, 2]), ((0, 0), (-1, -1), (1, 2, 2, 1))),
    ("dilation2", dict(x=(1, 64, 13, 13), w=(64, 64, 3, 3), dilations=[2, 2], pads=[2, 2, 2, 2]),
     ((-2, -2), (-2, -2), (1, 1, 1, 1))),
    ("odd_asym_pads", dict(x=(3, 64, 11, 7), w=(72, 64, 3, 3), pads=[0, 1, 1, 0]), ((-1, 0), (-2, -1), (1, 1, 1, 1))),
    ("wide_k", dict(x=(2, 256, 9, 9), w=(256, 256, 3, 3), pads=[1, 1, 1, 1]), ((-1, -1), (-1, -1), (1, 1, 1, 1))),
    # 8 channels (16 bytes) a pixel: 8 taps a k-block, one copy each, unswizzled core matrices; K = 392 ends mid-block
    ("7x7_s2_p3_c8", dict(x=(2, 8, 33, 33), w=(64, 8, 7, 7), strides=[2, 2], pads=[3, 3, 3, 3]),
     ((-3, -3), (-3, -3), (1, 2, 2, 1))),
    ("3x3_c8_odd", dict(x=(3, 8, 13, 9), w=(24, 8, 3, 3), pads=[1, 1, 1, 1]), ((-1, -1), (-1, -1), (1, 1, 1, 1))),
]


def _im2col_kernel(case, pin=None):
    spec = dict(case[1])
    model = _conv(spec.pop("x"), spec.pop("w"), **spec)
    # unfold=0: the map of the convolution as given (an 8-channel input's 7x7 would be unfolded: test_unfold_taps.py)
    plan = _stages(model, pin=dict(pin or {}, unit="wgmma", A="tma", unfold="0"))["plan_memory"]
    (k,) = [k for k in plan.kernels if k.family == "conv"]
    return plan, k


@pytest.mark.parametrize("case", IM2COL_CASES, ids=[c for c, _, _ in IM2COL_CASES])
def test_im2col_map_follows_the_convolution(case):
    """The image's map: dims (C, W, H, N) innermost first, one copy of BM pixels x 64 channels,
    the corners making the walk take OW (OH) positions a row (column), the stride as element
    strides; the walk's length ceil((W + upper - lower) / stride) is the output's size."""
    from aicfc.codegen.tma import tensor_maps
    plan, k = _im2col_kernel(case)
    p = dict(k.schedule.param)
    a, b = tensor_maps(k, None, plan.types())
    lower, upper, strides = case[2]
    n, c, h, w = case[1]["x"]
    assert a.im2col is not None and b.im2col is None and a.problems() is None
    narrow = c == 8
    assert a.dims == (c, w, h, n) and a.box == (c if narrow else 64, p["BM"], 1, 1)
    assert a.swizzle == (0 if narrow else 128)
    assert (a.im2col.lower, a.im2col.upper, a.im2col.element_strides) == (lower, upper, strides)
    kh, kw = case[1]["w"][2:]
    pt, pl, pb, pr = case[1].get("pads", [0] * 4)
    d = case[1].get("dilations", [1, 1])[0]
    s = case[1].get("strides", [1, 1])[0]
    oh, ow = ((h + pt + pb - d * (kh - 1) - 1) // s + 1, (w + pl + pr - d * (kw - 1) - 1) // s + 1)   # ONNX's
    assert -(-(w + upper[0] - lower[0]) // strides[1]) == ow and -(-(h + upper[1] - lower[1]) // strides[2]) == oh
    assert "im2col" in a.record({a.buffer: 0, b.buffer: 1})


def test_im2col_declined_with_reasons():
    """Channels that are not whole k-blocks keep the gatherers (A=gather only)."""
    from aicfc.codegen.conv_wgmma import im2col_geometry
    model = _conv((2, 16, 9, 9), (24, 16, 3, 3), pads=[1, 1, 1, 1])
    # unfold=0: unfolded, this input's 3 filter columns of 16 channels would be one 128-byte row (test_unfold_taps.py)
    plan = _stages(model, pin={"unit": "wgmma", "unfold": "0"})["plan_memory"]
    (k,) = [k for k in plan.kernels if k.family == "conv"]
    assert "neither whole k-blocks" in im2col_geometry(k, plan.types())
    assert k.schedule.param["A"] == "gather"


def test_im2col_kernel_source():
    """The producer issues one im2col copy a k-block (no gatherers), with the tap's offsets."""
    from aicfc.codegen.module import render_module
    plan, k = _im2col_kernel(IM2COL_CASES[1])
    src = render_module(plan)
    assert ".im2col.mbarrier::complete_tx::bytes" in src and "cp.async.cg" not in src
    assert "const unsigned short ow_ = tkw * 1, oh_ = tkh * 1;" in src
    assert "const int cw = tow * 2 - 1, ch = toh * 2 - 1, cn = tn;" in src


def test_narrow_im2col_kernel_source():
    """8 channels a pixel: 8 copies a k-block into unswizzled core matrices, a tap past the
    filter's 49 clamped to the last, and wgmma's A descriptor without a swizzle."""
    from aicfc.codegen.module import render_module
    plan, k = _im2col_kernel(IM2COL_CASES[-2], {"NWG": 2, "MI": 1, "PP": 0})
    src = render_module(plan)
    assert "const int tap = min(kb * 8 + j, 48);" in src and "j * 2048" in src
    assert "aicf_wgg_desc_plain(sa + ((wg * 1 + i)) * 1024 + (kk) * 4096, 2048, 128)" in src


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not found")
@pytest.mark.parametrize("case", [IM2COL_CASES[5], IM2COL_CASES[6]], ids=["wide_k", "c8"])
@pytest.mark.parametrize("pin", NVCC_PINS[:3], ids=["nwg1", "nwg2_bn256", "mi2"])
def test_im2col_builds_without_spills(case, pin, tmp_path, monkeypatch):
    from aicfc.codegen.module import render_module
    from aicfc.codegen.nvcc import build
    monkeypatch.setenv("AICF_CACHE_DIR", str(tmp_path))
    try:
        plan, k = _im2col_kernel(case, pin)
    except Exception as e:  # noqa: BLE001 - BN wider than the channels
        assert "no feasible conv candidate matches --pin" in str(e)
        return
    built = build(render_module(plan), "sm_90")
    assert built.spills.get(k.name, 0) == 0, built.spills


@pytest.mark.gpu
@pytest.mark.parametrize("precision", ["fp16", "bf16"])
@pytest.mark.parametrize("pin", [{}, {"NWG": 2, "BN": 64}, {"NWG": 1, "MI": 2, "BN": 128}], ids=["cost", "nwg2", "mi2"])
@pytest.mark.parametrize("case", IM2COL_CASES, ids=[c for c, _, _ in IM2COL_CASES])
def test_gpu_conv_im2col(case, pin, precision, gpu_device):
    """A loaded by the TMA in im2col mode (padding, strides, dilation, asymmetric pads, tiles
    crossing rows and images, the last tile past the last image), against numpy float64."""
    spec = dict(case[1])
    model = B.conv_model(spec.pop("x"), spec.pop("w"), bn=True, act="relu", **spec)
    try:
        payload = _gpu_check(model, precision, gpu_device, dict(pin, unit="wgmma", A="tma", unfold="0"))
    except Exception as e:  # noqa: BLE001 - a pin outside this convolution's space (BN wider than its channels)
        if "no feasible conv candidate matches --pin" in str(e):
            pytest.skip(str(e))
        raise
    (k,) = [k for k in payload["kernels"] if k["family"] == "conv"]
    assert k["params"]["A"] == "tma" and len(k["tensor_maps"]) == 2 and "im2col" in k["tensor_maps"][0]


@pytest.mark.gpu
@pytest.mark.parametrize("a,stride", [("tma", 2), ("halo", 1)], ids=["im2col", "halo"])
def test_gpu_resnet_stage_im2col(a, stride, gpu_device):
    """Two ResNet-50 bottlenecks with every convolution on im2col loads (A = tma) or, their 3x3
    at stride 1, on image tiles (A = halo, tests/test_conv_halo.py), against onnxruntime at fp16."""
    model = B.resnet_stage_model((4, 64, 28, 28), mid=64, out=256, stride=stride)
    payload = _gpu_check(model, "fp16", gpu_device, {"unit": "wgmma", "A": a}, ref="onnxruntime")
    assert any(k["params"].get("A") == a for k in payload["kernels"] if k["family"] == "conv")


@pytest.mark.gpu
@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_gpu_stem_im2col(precision, gpu_device):
    """The 3-channel 7x7/2 stem (its input copied channels-last and zero-padded to 8 channels)
    on narrow im2col loads (its filter columns not unfolded: unfold=0), against numpy float64."""
    model = B.conv_model((2, 3, 64, 64), (64, 3, 7, 7), bn=True, act="relu", strides=[2, 2], pads=[3, 3, 3, 3])
    payload = _gpu_check(model, precision, gpu_device, {"unit": "wgmma", "A": "tma", "unfold": "0"})
    (k,) = [k for k in payload["kernels"] if k["family"] == "conv"]
    assert k["params"]["A"] == "tma" and k["tensor_maps"][0]["swizzle"] == 0


def test_explain_keeps_the_best_of_each_variant():
    """What the choice beat includes the best gathered schedule and the best mma one, beyond the
    runners-up of the chosen variant (`plan_schedules.runners_up`)."""
    plan, k = _im2col_kernel(IM2COL_CASES[0], {})
    assert k.schedule.param["A"] == "tma"
    shown = [dict(c.params) for c in k.schedule.candidates if not c.rejected_because]
    assert any(p.get("A") == "gather" for p in shown) and any(p.get("unit") == "mma" for p in shown)


# ---------------------------------------------------------------- ping-pong (branch session12-conv-pingpong)


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not found")
@pytest.mark.parametrize("a", ["tma", "gather"])
def test_pingpong_convolution_builds_without_spills(a):
    """Two consumer warpgroups taking whole tiles in turn (PP), over im2col or gathered loads."""
    model = B.resnet_stage_model((4, 64, 28, 28), mid=64, out=256, stride=2)
    graph = import_model(model, name="pp")
    plan = run_pipeline(graph, Options("sm_90", load_profile("sm_90"), "fp16", (("A", a), ("PP", "1"), ("unit", "wgmma")))).plan
    convs = [k for k in plan.kernels if k.family == "conv"]
    assert convs and all(k.schedule.param.get("PP") == 1 and k.schedule.param["BM"] == 64 * k.schedule.param["MI"]
                         for k in convs)
    from aicfc.codegen.module import render_module
    from aicfc.codegen.nvcc import build
    built = build(render_module(plan), "sm_90")
    assert all(built.spills.get(k.name, 0) == 0 for k in convs), built.spills


@pytest.mark.gpu
@pytest.mark.parametrize("a", ["tma", "gather"])
def test_gpu_resnet_stage_pingpong(a, gpu_device):
    """Two ResNet-50 bottlenecks with every convolution in ping-pong (PP=1) against onnxruntime at fp16."""
    model = B.resnet_stage_model((4, 64, 28, 28), mid=64, out=256, stride=2)
    payload = _gpu_check(model, "fp16", gpu_device, {"unit": "wgmma", "A": a, "PP": "1"}, ref="onnxruntime")
    assert all(k["params"].get("PP") == 1 for k in payload["kernels"] if k["family"] == "conv")


# ---------------------------------------------------------------- staged epilogue (OUT)


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not found")
@pytest.mark.parametrize("case", NVCC_CASES[:3], ids=[c for c, _ in NVCC_CASES[:3]])
@pytest.mark.parametrize("a,pp", [("gather", 0), ("tma", 0), ("tma", 1)], ids=["gather", "tma", "tma_pp"])
def test_staged_epilogue_builds_without_spills(case, a, pp, tmp_path, monkeypatch):
    """The epilogue staged in shared memory and copied out in 16-byte chunks (OUT = 2) builds for
    sm_90a without spills, its source staging the tile (the template's copy-out loop)."""
    built = []
    for pin in NVCC_PINS:
        if pp and pin["NWG"] == 1:
            continue
        got = _built(case, dict(pin, A=a, OUT=2, PP=pp), tmp_path, monkeypatch, follow=16)
        if got is not None:
            assert got[0].schedule.param["OUT"] == 2
            built.append(got)
    assert built
    for k, b in built:
        assert b.spills.get(k.name, 0) == 0, b.spills


def test_staged_epilogue_only_for_a_row_major_output():
    """OUT = 2 is offered where the convolution stores the row-major [pixels, channels] matrix
    (channels-last, inside a graph) and not where it stores the graph's NCHW output; a batch of one
    is row-major too (its batch index, always 0, has a term in the stored offset but adds nothing)."""
    for batch, follow, inside in ((2, 16, True), (1, 16, True), (2, 0, False), (1, 0, False)):
        model = _conv((batch, 64, 14, 14), (96, 64, 3, 3), follow=follow, pads=[1, 1, 1, 1])
        plan = _stages(model, pin={"A": "tma"})["plan_memory"]
        k = [k for k in plan.kernels if k.family == "conv"][0]
        assert conv_wgmma.row_major_out(k, plan.types()) == inside
        space = conv_wgmma.space(k, plan, 132, 232448)
        assert any(p.get("OUT") for p in space) == inside
        assert all(p.get("A") != "halo" for p in space if p.get("OUT"))


def _pinned_conv_on_gpu(case, follow, pin: dict, device) -> dict:
    """The bundle's first convolution kernel of `case` (BN + ReLU, then `follow`: a 1x1 conv's
    channels or "pool") compiled under `pin` and checked against numpy float64 at fp16; skips
    where the pin is outside the convolution's space."""
    spec = dict(case[1])
    model = B.conv_model(spec.pop("x"), spec.pop("w"), bn=True, act="relu", follow=follow, **spec)
    try:
        payload = _gpu_check(model, "fp16", device, pin)
    except Exception as e:  # noqa: BLE001 - a pin outside this convolution's space
        if "no feasible" in str(e):
            pytest.skip(str(e))
        raise
    return next(k for k in payload["kernels"] if k["family"] == "conv")


@pytest.mark.gpu
@pytest.mark.parametrize("a,pp", [("gather", 0), ("tma", 0), ("tma", 1)], ids=["gather", "tma", "tma_pp"])
@pytest.mark.parametrize("case", [GPU_CONVS[i] for i in (0, 2, 5, 6)], ids=[GPU_CONVS[i][0] for i in (0, 2, 5, 6)])
def test_gpu_staged_epilogue(case, a, pp, gpu_device):
    """The staged epilogue (OUT = 2: BatchNorm and ReLU on the tile in shared memory, copied out in
    16-byte chunks) against numpy float64: edge tiles past M (odd sizes), strides, 8-channel taps."""
    k = _pinned_conv_on_gpu(case, 16, {"unit": "wgmma", "A": a, "OUT": 2, "PP": pp, "unfold": "0"}, gpu_device)
    assert (k["params"]["OUT"], k["params"]["A"], k["params"]["PP"]) == (2, a, pp)


@pytest.mark.gpu
@pytest.mark.parametrize("pp", [0, 1])
def test_gpu_staged_epilogue_residual(pp, gpu_device):
    """Two ResNet-50 bottlenecks (BatchNorm, ReLU and the residual add in the epilogues) with every
    convolution's and GEMM's epilogue staged (OUT = 2), against onnxruntime at fp16."""
    model = B.resnet_stage_model((4, 64, 28, 28), mid=64, out=256, stride=1)
    payload = _gpu_check(model, "fp16", gpu_device, {"unit": "wgmma", "OUT": 2, "PP": pp}, ref="onnxruntime")
    assert any(k["params"].get("OUT") == 2 for k in payload["kernels"] if k["family"] == "conv")


# ---------------------------------------------------------------- k-splits as a cluster (CL = 1)


@pytest.mark.gpu
@pytest.mark.parametrize("a,out,tile", [("tma", 2, dict(BM=128, BN=128, NWG=2)), ("tma", 0, dict(BM=64, BN=256, NWG=1)),
                                        ("gather", 2, dict(BM=128, BN=128, NWG=2))], ids=["tma", "tma_regs_1wg", "gather"])
@pytest.mark.parametrize("case", [
    ("7x7x512_b8", dict(x=(8, 512, 7, 7), w=(512, 512, 3, 3), pads=[1, 1, 1, 1])),
    ("s2_odd", dict(x=(16, 64, 15, 15), w=(136, 64, 3, 3), strides=[2, 2], pads=[1, 1, 1, 1]))],
    ids=["7x7x512_b8", "s2_odd"])
def test_gpu_conv_split_cluster(case, a, out, tile, gpu_device):
    """Convolutions with their k-splits as one cluster ([Note: k-splits as a cluster] in
    codegen/gemm_wgmma.py: the splits add through distributed shared memory) against numpy float64."""
    k = _pinned_conv_on_gpu(case, "pool", {"unit": "wgmma", "A": a, "OUT": out, "PP": 0, "SPLITK": 2, "CL": 1, **tile},
                            gpu_device)
    assert k["params"]["CL"] == 1 and k["params"]["CTAS"] % 2 == 0


# ---------------------------------------------------------------- stream-k (STREAM = 1)


STREAM_CONVS = [
    ("14x14x256", dict(x=(4, 256, 14, 14), w=(256, 256, 3, 3), pads=[1, 1, 1, 1])),
    ("7x7x512_b8", dict(x=(8, 512, 7, 7), w=(512, 512, 3, 3), pads=[1, 1, 1, 1])),
    ("s2_odd", dict(x=(16, 64, 15, 15), w=(136, 64, 3, 3), strides=[2, 2], pads=[1, 1, 1, 1])),
]


@pytest.mark.gpu
@pytest.mark.parametrize("a,pp,out", [("tma", 0, 2), ("tma", 1, 2), ("gather", 0, 2), ("tma", 0, 0)],
                         ids=["tma", "tma_pp", "gather", "tma_regs"])
@pytest.mark.parametrize("case", STREAM_CONVS, ids=[c for c, _ in STREAM_CONVS])
def test_gpu_conv_stream_k(case, a, pp, out, gpu_device):
    """Stream-k convolutions (every SM an even share of all tiles' k-blocks, partial tiles added by
    the block holding each tile's tail) against numpy float64, with staged and register epilogues."""
    k = _pinned_conv_on_gpu(case, "pool", {"unit": "wgmma", "A": a, "PP": pp, "OUT": out, "STREAM": 1}, gpu_device)
    assert k["params"]["STREAM"] == 1 and k["params"]["CTAS"] == 132


@pytest.mark.gpu
def test_gpu_conv_stream_k_runs_again(gpu_device):
    """The tail part zeroes its tile's counter for the next run ([Note: the tail finishes]): one executor runs two
    sets of fresh inputs with 50 graph replays between them, each checked against numpy float64, and the second
    set again after more replays gives the same bits (the parts are added in split order)."""
    import aicfc
    from aicf_run.bundle import Bundle
    from aicf_run.executor import Executor
    from aicfc.ir.high import evaluate_graph
    spec = dict(STREAM_CONVS[0][1])
    model = B.conv_model(spec.pop("x"), spec.pop("w"), bn=True, act="relu", follow="pool", **spec)
    payload = aicfc.compile(model, target=gpu_device.arch, precision="fp16", pin={"unit": "wgmma", "STREAM": 1})
    assert any(k["params"].get("STREAM") == 1 for k in payload["kernels"] if k["family"] == "conv")
    graph = import_model(model, None)
    rng = np.random.default_rng(76)
    ex = Executor(Bundle.from_payload(payload), gpu_device)
    try:
        ex.poison()
        got = []
        for _ in range(2):
            inputs = {v.name: rng.standard_normal(v.type.shape).astype(np.float32) for v in graph.inputs}
            want = evaluate_graph(graph, inputs, dtype=np.float64)
            out = ex.run(inputs)
            for name, r in want.items():
                assert not np.isnan(out[name]).any() and rel_err(out[name], r) <= GPU_RTOL["fp16"], name
            for _ in range(50):
                ex.launch()
            got.append((inputs, out))
        again = ex.run(got[-1][0])
        assert all(np.array_equal(again[n], got[-1][1][n]) for n in again)
    finally:
        ex.close()
