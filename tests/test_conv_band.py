"""Unit `band` of the conv family (codegen/conv_band.py, [Note: bands of pixels]): which convolutions it takes,
the geometry of a tile's image pieces, its tensor maps, the kernel's build (ptxas: no spills), and on a GPU its
results against float64 and onnxruntime."""
from __future__ import annotations

import math
import shutil

import pytest

from aicfc.codegen import conv_band
from aicfc.frontend.onnx_import import import_model
from aicfc.passes.pipeline import Options, run_pipeline
from aicfc.planner.hardware import load_profile
from tests import onnx_builders as B
from tests.test_conv_taps import _conv, _plan, built_kernels, check_gpu, check_gpu_runs


def _model(x=(4, 128, 7, 7), w=(128, 128, 3, 3), **kw):
    spec = dict(bn=True, act="relu", pads=[1, 1, 1, 1], follow=64) | kw
    return B.conv_model(x, w, **spec)


@pytest.mark.parametrize("x,w,kw,why", [
    ((2, 128, 14, 14), (128, 128, 3, 3), {"strides": [2, 2]}, "stride 1"),
    ((2, 128, 14, 14), (128, 128, 5, 5), {"pads": [2, 2, 2, 2]}, "3x3 window"),
    ((2, 96, 14, 14), (128, 96, 3, 3), {}, "96 channels"),
    ((2, 128, 14, 14), (100, 128, 3, 3), {}, "multiple of 8"),
], ids=["stride2", "5x5", "c96", "n100"])
def test_band_declines_what_it_does_not_run(x, w, kw, why):
    plan = _plan(_model(x, w, **kw))
    got = conv_band.why_not(_conv(plan), plan)
    assert got is not None and why in got, got


def test_band_declines_an_nchw_output():
    """A convolution whose result is the graph's output keeps ONNX's layout: not the row-major [pixels, N]."""
    plan = _plan(_model(follow=0))
    assert "row-major" in conv_band.why_not(_conv(plan), plan)


@pytest.mark.parametrize("m0,want", [
    (0, [(0, 0, 6), (1, 0, 2)]),            # 7x7 images: 49 pixels of image 0, 15 of image 1 (rows 0-2)
    (64, [(1, 2, 6), (2, 0, 4)]),
    (128, [(2, 4, 6), (3, 0, 6)]),
    (448, [(9, 1, 6)]),                     # the last, partial tile: pixels 448 .. 489
])
def test_pieces_are_the_images_a_tile_touches(m0, want):
    assert conv_band.pieces_of(m0, 10 * 49, 7, 7) == want


def test_band_geometry_at_7x7_and_14x14():
    """ResNet's stage 4 (7x7): three whole images of 9x9 pixels a tile; stage 3 (14x14): two pieces of 8 rows
    of 16 (a tile of 64 pixels spans at most six image rows); each piece whole swizzle periods."""
    b7 = conv_band.band_of((32, 7, 7, 512))
    assert (b7.rows, b7.pieces, b7.cols, b7.piece_rows) == (9, 3, 9, 88)
    assert b7.tile_rows() == 243 and b7.slot_bytes == 3 * 88 * 128
    b14 = conv_band.band_of((32, 14, 14, 256))
    assert (b14.rows, b14.pieces, b14.cols, b14.piece_rows) == (8, 2, 16, 128)
    one = conv_band.band_of((1, 14, 14, 256))
    assert one.pieces == 1


def test_band_maps_are_image_pieces_and_filter_boxes():
    plan = _plan(_model((3, 128, 7, 7), (104, 128, 3, 3)), precision="bf16")
    k = _conv(plan)
    assert conv_band.why_not(k, plan) is None
    p = next(p for p in conv_band.space(k, plan, 132, 232448) if p["BN"] == 64)
    maps = conv_band.tensor_maps(k, p, plan.types())
    assert [m.box for m in maps] == [(64, 9, 9, 1), (64, 64)]
    assert maps[0].dims == (128, 7, 7, 3) and all(m.swizzle == 128 and m.problems() is None for m in maps)


def test_band_space_fits_the_shared_memory():
    plan = _plan(_model((32, 256, 14, 14), (256, 256, 3, 3)))
    k = _conv(plan)
    space = conv_band.space(k, plan, 132, 232448)
    assert {p["BN"] for p in space} == {64, 128}
    assert all(conv_band.smem_bytes(p) + conv_band.static_smem(p) <= 232448 for p in space)
    assert all(p["CTAS"] == min(conv_band.tiles(k, p)[2], 132) for p in space)


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not found")
@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_band_kernel_builds_without_spills(tmp_path, precision):
    (k,) = [k for k in built_kernels(tmp_path, _model((4, 256, 14, 14), (256, 256, 3, 3)), precision,
                                     "--pin", "conv_0:BAND=1", "--pin", "conv_0:BN=128")
            if k["family"] == "conv"]
    assert k["params"]["unit"] == "band" and k["registers_source"] == "ptxas"
    assert not k.get("spills")


@pytest.mark.gpu
@pytest.mark.parametrize("precision", ["fp16", "bf16"])
@pytest.mark.parametrize("x,w,bn", [
    ((4, 128, 7, 7), (128, 128, 3, 3), 64),      # three images a tile, two column tiles
    ((32, 128, 7, 7), (512, 128, 3, 3), 104),    # a fill width (five column tiles, the last 96 wide)
    ((3, 128, 7, 7), (104, 128, 3, 3), 64),      # a partial column tile
    ((4, 256, 14, 14), (256, 256, 3, 3), 128),   # pieces crossing images, four channel blocks
    ((2, 128, 28, 28), (128, 128, 3, 3), 64),    # wide rows, two channel blocks
    ((2, 192, 14, 14), (64, 192, 3, 3), 64),     # an odd number of channel blocks
    ((2, 64, 56, 56), (64, 64, 3, 3), 64),       # one channel block
], ids=["7x7", "7x7_n104", "7x7_n104_bn64", "14x14", "28x28", "cb3", "56x56"])
def test_gpu_band(x, w, bn, precision, gpu_device):
    """Fresh random inputs against float64: tiles across image rows and images, zeros outside every image,
    partial tiles at M and N."""
    import aicfc
    model = _model(x, w)
    payload = aicfc.compile(model, target=gpu_device.arch, precision=precision,
                            pin={"conv_0:BAND": 1, "conv_0:BN": bn})
    assert [k["params"]["unit"] for k in payload["kernels"] if k["family"] == "conv"][0] == "band"
    check_gpu(model, payload, gpu_device, precision)


@pytest.mark.gpu
@pytest.mark.parametrize("x,w,bn", [((8, 64, 56, 56), (64, 64, 3, 3), 64), ((12, 128, 28, 28), (128, 128, 3, 3), 64)],
                         ids=["3_tiles_a_block", "2_tiles_a_block"])
def test_gpu_band_tiles_a_block_repeated(x, w, bn, gpu_device):
    """Several tiles a block (the halo slots, the filter ring and the sums' buffer reused across tiles) and the
    same bundle run five times on fresh inputs in one executor: each run against float64."""
    import aicfc
    model = _model(x, w)
    payload = aicfc.compile(model, target=gpu_device.arch, precision="fp16", pin={"conv_0:BAND": 1, "conv_0:BN": bn})
    (k,) = [k for k in payload["kernels"] if k["family"] == "conv" and k["params"]["unit"] == "band"]
    assert k["grid"][0] < math.ceil(x[0] * x[2] * x[3] / 64) * math.ceil(w[0] / bn)   # several tiles a block
    check_gpu_runs(model, payload, gpu_device, "fp16")


@pytest.mark.gpu
def test_gpu_band_resnet_stage_against_onnxruntime(gpu_device):
    """A ResNet stage-4-sized identity bottleneck pair (7x7, 512 channels through the 3x3s) with its 3x3s pinned
    to the unit, against onnxruntime."""
    import aicfc
    model = B.resnet_stage_model((8, 256, 14, 14), mid=128, out=512, stride=2, stem=False)
    shapes = {t.name: list(t.dims) for t in model.graph.initializer}
    stride1 = [n.name for n in model.graph.node if n.op_type == "Conv" and shapes[n.input[1]][2:] == [3, 3]
               and all(list(a.ints) == [1, 1] for a in n.attribute if a.name == "strides")]
    assert len(stride1) == 1
    payload = aicfc.compile(model, target=gpu_device.arch, precision="fp16",
                            pin={f"{n}:BAND": 1 for n in stride1})
    assert "band" in [k["params"]["unit"] for k in payload["kernels"] if k["family"] == "conv"]
    check_gpu(model, payload, gpu_device, "fp16", onnxruntime=True)


def test_band_is_opt_in():
    """Measured slower than the wgmma and taps units on every ResNet-50 B32 3x3 (session 39): the planner rejects
    its candidates with the reason and never takes one unless pinned with BAND=1."""
    from aicfc.passes.plan_schedules import rank
    plan = _plan(_model((32, 512, 7, 7), (512, 512, 3, 3)))
    k = _conv(plan)
    assert k.schedule.param["unit"] != "band"
    ranked, rejected = rank(k, plan, load_profile("sm_90", "h200"))
    assert not [r for r in ranked if r.params["unit"] == "band"]
    why = [c.rejected_because for c in rejected if dict(c.params).get("unit") == "band"]
    assert why and all("--pin NODE:BAND=1" in w for w in why)
    hw = load_profile("sm_90", "h200")
    pinned = run_pipeline(import_model(_model((32, 512, 7, 7), (512, 512, 3, 3)), None),
                          Options("sm_90", hw, "fp16", (("conv_0:BAND", 1),))).plan
    assert _conv(pinned).schedule.param["unit"] == "band"
