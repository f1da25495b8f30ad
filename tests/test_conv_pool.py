"""Unit `pool` of the conv family (codegen/conv_pool.py, [Note: pooled tiles]) and the rewrite that forms its
kernels (passes/pool_epilogue.py): which convolutions and pools merge, the planner's choice, the kernel's
build (ptxas: no spills), and on a GPU its results against float64 and onnxruntime."""
from __future__ import annotations

import shutil

import onnx
import pytest

from aicfc.codegen import conv_pool
from aicfc.errors import AicfError
from aicfc.frontend.onnx_import import import_model
from aicfc.passes.pipeline import Options, run_pipeline
from aicfc.passes.pool_epilogue import RULE
from aicfc.planner.hardware import load_profile
from tests import onnx_builders as B
from tests.test_conv_taps import built_kernels, check_gpu, check_gpu_runs


def _plan(model: onnx.ModelProto, precision: str = "fp16", pin: dict | None = None):
    hw = load_profile("sm_90", "h200")
    return run_pipeline(import_model(model, None), Options("sm_90", hw, precision, pin=tuple((pin or {}).items()))).plan


def _model(x=(2, 64, 20, 26), w=(64, 64, 3, 3), act="relu", **kw):
    spec = dict(bn=act is not None, act=act, pads=[w[2] // 2, w[3] // 2] * 2, follow="pool_s2") | kw
    return B.conv_model(x, w, **spec)


def _pooled(plan):
    return [k for k in plan.kernels if conv_pool.is_pooled(k)]


def _records(plan):
    return [r for r in plan.rewrites if r.rule == RULE]


def test_resnet_stem_pools_its_tiles():
    """The ResNet stem (7x7 stride 2 on 3 channels, unfolded to a 4x1 window over 64-element rows) and its
    max pool: one kernel by cost, the pool's window kernel gone, the record naming both predictions. (At
    2 x 3 x 64 x 64 the layout pass leaves the input NCHW, which no Hopper unit reads.)"""
    plan = _plan(B.resnet_stage_model((4, 64, 28, 28), stem=True))
    (k,) = _pooled(plan)
    assert k.schedule.param["unit"] == "pool" and "pool" in k.origins
    assert not [x for x in plan.kernels if x.family == "window"]
    (r,) = _records(plan)
    assert r.applied and "against" in r.reason and r.bytes_saved > 0
    geo = conv_pool.pooled_of(k, plan.types())
    assert geo.conv.taps == (4, 1) and geo.pooled == (28, 28) and geo.conv.out == (56, 56)


def test_pin_keeps_them_apart_and_rejects_other_values():
    model = B.resnet_stage_model((4, 64, 28, 28), stem=True)
    plan = _plan(model, pin={"pooled": 0})
    assert not _pooled(plan) and [x for x in plan.kernels if x.family == "window"]
    (r,) = _records(plan)
    assert not r.applied and "pooled=0" in r.reason
    with pytest.raises(AicfError, match="pooled=2"):
        _plan(model, pin={"pooled": 2})


def test_a_pin_of_another_unit_keeps_them_apart():
    """`--pin unit=wgmma` asks every convolution for the implicit GEMM, which does not pool: the stem stays apart."""
    plan = _plan(B.resnet_stage_model((4, 64, 28, 28), stem=True), pin={"unit": "wgmma"})
    assert not _pooled(plan) and [x for x in plan.kernels if x.family == "window"]
    (r,) = _records(plan)
    assert not r.applied and "unit=wgmma" in r.reason


@pytest.mark.parametrize("x,w,kw,why", [
    ((2, 128, 16, 16), (128, 128, 3, 3), {}, "128 channels to 128"),
    ((2, 64, 16, 16), (64, 64, 3, 3), {"strides": [2, 2], "pads": [1, 1, 1, 1]}, "strided"),
    ((2, 64, 16, 16), (64, 64, 3, 3), {"follow": "pool"}, "stride 2"),
], ids=["c128", "conv_stride2", "pool_stride1"])
def test_what_does_not_merge_says_why(x, w, kw, why):
    plan = _plan(_model(x, w, **kw))
    assert not _pooled(plan)
    (r,) = _records(plan)
    assert not r.applied and why in r.reason, r.reason


def test_tiles_maps_and_shared_memory():
    """A 20x26 convolution pools to 10x13 pixels. Under a 3x3 window the filter takes 72 KB, which leaves no
    room for 8x7 tiles: the space offers the smaller ones, cut by the image's edge where they pass it (the
    TMA store drops what lies past it)."""
    plan = _plan(_model((2, 64, 20, 26)), precision="bf16")
    (k,) = _pooled(plan)
    geo = conv_pool.pooled_of(k, plan.types())
    assert geo.pooled == (10, 13) and geo.conv.taps == (3, 3)
    limit = load_profile("sm_90").smem_per_block_optin
    offered = [c.params for c in k.schedule.candidates if dict(c.params).get("unit") == "pool"]
    assert offered and all((dict(q)["TPH"], dict(q)["TPW"]) not in ((8, 7), (7, 8)) for q in offered)
    p = dict(unit="pool", dtype="bf16", TPH=4, TPW=8, NCONS=3, SLOTS=2, CTAS=12)
    assert conv_pool.tiles(p, geo) == 2 * 3 * 2
    assert conv_pool.region(p) == (9, 17) and conv_pool.blocks(p) == 3 and conv_pool.box(p, (3, 3)) == (19, 11)
    assert conv_pool.smem_bytes(p, (3, 3)) + conv_pool.static_smem(p) <= limit
    maps = conv_pool.tensor_maps(k, p, plan.types())
    assert [m.box for m in maps] == [(64, 19, 11, 1), (64, 64), (64, 8, 4, 1)]
    assert all(m.swizzle == 128 and m.problems() is None for m in maps)
    assert maps[0].dims == (64, 26, 20, 2) and maps[2].dims == (64, 13, 10, 2)


@pytest.mark.parametrize("x", [(32, 64, 56, 56), (4, 64, 28, 28), (2, 64, 20, 26)], ids=["r50_b32", "28", "20x26"])
def test_every_ring_has_one_consumer_a_slot(x):
    """[Note: one consumer a slot]: SLOTS is a multiple of NCONS in every candidate offered, so a slot's tiles all go
    to one warpgroup. Session 40's tune of ResNet-50 B32 faulted on NCONS = 3 with SLOTS = 2, a candidate that tied
    the planner's pick."""
    model = B.resnet_stage_model(x, stem=True) if x[2] == x[3] else _model(x)
    plan = _plan(model)
    (k,) = _pooled(plan)
    offered = conv_pool.space(k, plan, 132, load_profile("sm_90").smem_per_block_optin)
    assert offered and all(q["SLOTS"] % q["NCONS"] == 0 for q in offered), offered
    if x[0] == 32:   # both arrangements are still offered where they fit
        assert {q["NCONS"] for q in offered} >= {2, 3} and {q["SLOTS"] for q in offered} >= {2, 3, 4}


def test_channels_as_rows_where_the_window_is_one_pixel_wide():
    """[Note: channels as rows]: the unfolded stem (a 4x1 window) is offered XP = 1 at 7x7 pooled pixels (15 x 15
    convolution pixels, rows 16 apart: N = 240) on one or two consumer warpgroups, and at ResNet-50 B32's size the cost
    terms take it on two; a 3x3 window is not offered it."""
    plan = _plan(B.resnet_stage_model((32, 64, 56, 56), stem=True), pin={"gstem": 0})   # the image map's box below
    (k,) = _pooled(plan)
    pick = dict(k.schedule.param)
    assert pick["XP"] == 1 and (pick["TPH"], pick["TPW"], pick["NCONS"]) == (7, 7, 2), pick
    assert conv_pool.pitch(pick, (4, 1)) == 16 and conv_pool.xp_cols(pick) == 240
    assert conv_pool.box(pick, (4, 1)) == (16, 18) and conv_pool.region_bytes(pick) == 240 * 128
    offered = conv_pool.space(k, plan, 132, load_profile("sm_90").smem_per_block_optin)
    assert {q["XP"] for q in offered} == {0, 1}
    assert all(q["NCONS"] in (1, 2) and conv_pool.xp_cols(q) <= 256 and conv_pool.xp_cols(q) % 16 == 0
               for q in offered if q["XP"])
    # one warpgroup runs a tile's products and its epilogue in turn; two overlap them (cost_conv_pool's fitted terms)
    one = [c for c in k.schedule.candidates if dict(c.params).get("XP") == 1 and dict(c.params)["NCONS"] == 1]
    assert len(one) == 3 and all(c.predicted_time_us > k.schedule.time_us for c in one)
    maps = conv_pool.tensor_maps(k, pick, plan.types())
    assert maps[0].box == (64, 16, 18, 1) and maps[2].box == (64, 7, 7, 1)
    plan3 = _plan(_model((2, 64, 20, 26)))
    (k3,) = _pooled(plan3)
    assert all("XP" not in q for q in conv_pool.space(k3, plan3, 132, load_profile("sm_90").smem_per_block_optin))


def test_pixel_free_follows_names_defined_from_the_pixel():
    assert conv_pool.pixel_free(["const int i2 = gm % 112;", "const float v0 = static_cast<float>(__ldg(p3 + (gn)));",
                                 "const float sv0 = accv + v0;", "const float sv1 = accv1 + v0;"])
    assert not conv_pool.pixel_free(["const int i2 = gm % 112;", "const float v0 = static_cast<float>(__ldg(p4 + (i2)));",
                                     "const float sv0 = accv + v0;", "const float sv1 = accv1;"])
    assert not conv_pool.pixel_free(["const float sv0 = accv + p5[gm * 64 + gn];", "const float sv1 = accv1;"])


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not found")
@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_pool_kernel_builds_without_spills(tmp_path, precision):
    kernels = built_kernels(tmp_path, B.resnet_stage_model((4, 64, 28, 28), stem=True), precision)
    (k,) = [k for k in kernels if k["params"].get("unit") == "pool"]
    assert k["registers_source"] == "ptxas" and not k.get("spills")
    kernels = built_kernels(tmp_path, B.resnet_stage_model((4, 64, 28, 28), stem=True), precision,
                            "--pin", "XP=1", "--pin", "TPH=7", "--pin", "TPW=7")
    (k,) = [k for k in kernels if k["params"].get("unit") == "pool"]
    assert k["params"]["XP"] == 1 and k["registers_source"] == "ptxas" and not k.get("spills")


@pytest.mark.gpu
@pytest.mark.parametrize("precision", ["fp16", "bf16"])
@pytest.mark.parametrize("x,w,act,pin", [
    ((2, 64, 20, 26), (64, 64, 3, 3), "relu", {}),
    ((3, 64, 15, 17), (64, 64, 3, 3), None, {"TPH": 4, "TPW": 8}),
    ((2, 64, 30, 34), (64, 64, 1, 3), None, {"TPH": 7, "TPW": 8, "NCONS": 2}),
], ids=["20x26_relu", "15x17_signed", "1x3_signed"])
def test_gpu_pool(x, w, act, pin, precision, gpu_device):
    """Fresh random inputs against float64: tiles cut by the image's edges, odd sizes, values of both signs
    (the padding's -inf must lose to every negative), several images."""
    import aicfc
    model = _model(x, w, act=act)
    payload = aicfc.compile(model, target=gpu_device.arch, precision=precision, pin={"pooled": 1, **pin})
    assert "pool" in [k["params"].get("unit") for k in payload["kernels"]]
    check_gpu(model, payload, gpu_device, precision)


@pytest.mark.gpu
@pytest.mark.parametrize("tile", [7, 4], ids=["7x7", "4x4"])
@pytest.mark.parametrize("precision", ["fp16", "bf16"])
@pytest.mark.parametrize("x", [(4, 64, 28, 28), (3, 64, 36, 36), (2, 64, 30, 22)], ids=["28", "36", "30x22"])
def test_gpu_pool_channels_as_rows(x, precision, tile, gpu_device):
    """[Note: channels as rows] pinned: the stem's tiles cut by the pooled image's edges at 36x36 and 30x22 (a pooled
    size that 7 divides in neither direction), at 7x7 pooled pixels (N = 240) and 4x4 (N = 144), against float64."""
    import aicfc
    model = B.resnet_stage_model(x, stem=True)
    payload = aicfc.compile(model, target=gpu_device.arch, precision=precision, pin={"XP": 1, "TPH": tile, "TPW": tile})
    (k,) = [k for k in payload["kernels"] if k["params"].get("unit") == "pool"]
    assert k["params"]["XP"] == 1
    check_gpu(model, payload, gpu_device, precision)


@pytest.mark.gpu
@pytest.mark.parametrize("x", [(4, 64, 28, 28), (3, 64, 36, 36), (2, 64, 30, 22)], ids=["28", "36", "30x22"])
def test_gpu_pool_resnet_stem_against_onnxruntime(x, gpu_device):
    """The stem and its pool merged by cost, tiles cut by the pooled image's edges at 36x36 and 30x22."""
    import aicfc
    model = B.resnet_stage_model(x, stem=True)
    payload = aicfc.compile(model, target=gpu_device.arch, precision="fp16", pin={})
    assert "pool" in [k["params"].get("unit") for k in payload["kernels"]]
    check_gpu(model, payload, gpu_device, "fp16", onnxruntime=True)


@pytest.mark.gpu
@pytest.mark.parametrize("pin", [{"TPH": 7, "TPW": 8, "NCONS": 2, "SLOTS": 2}, {"TPH": 4, "TPW": 8, "NCONS": 2, "SLOTS": 4},
                                 {"TPH": 4, "TPW": 8, "NCONS": 3, "SLOTS": 3}, {"TPH": 7, "TPW": 7, "XP": 1}],
                         ids=["c2s2", "c2s4", "c3s3", "xp"])
def test_gpu_pool_slots_reused_across_tiles(pin, gpu_device):
    """Eight 56x56 pooled images: 448 or 784 tiles on at most 132 blocks, so every slot of the ring is reused and
    each warpgroup takes several tiles ([Note: one consumer a slot]); the same bundle run five times on fresh
    inputs in one executor, each run against onnxruntime."""
    import aicfc
    model = B.resnet_stage_model((8, 64, 56, 56), stem=True)
    payload = aicfc.compile(model, target=gpu_device.arch, precision="fp16", pin={"pooled": 1, **pin})
    (k,) = [k for k in payload["kernels"] if k["params"].get("unit") == "pool"]
    tiles = 8 * (56 // pin["TPH"]) * (56 // pin["TPW"])
    assert tiles >= 3 * k["grid"][0], (tiles, k["grid"])
    check_gpu_runs(model, payload, gpu_device, "fp16", onnxruntime=True)
