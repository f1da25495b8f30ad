"""Unit `stem` of the conv family (codegen/conv_stem.py, [Note: the stem on tensor cores]): which convolutions
it takes, the planner's choice for MobileNetV2's stem, the kernel's build (ptxas: no spills), and on a GPU its
results against float64 on fresh random inputs."""
from __future__ import annotations

import math
import shutil

import numpy as np
import onnx
import pytest
from onnx import helper

from aicfc.codegen import conv_stem
from aicfc.frontend.onnx_import import import_model
from aicfc.passes.pipeline import Options, run_pipeline
from aicfc.planner.hardware import load_profile
from tests import onnx_builders as B
from tests.test_conv_taps import built_kernels, check_gpu

PIN = {"conv_0:unit": "stem"}   # the convolution alone: the pool after it has no unit


def stem_model(x=(32, 3, 224, 224), w=(32, 3, 3, 3), act: str | None = "relu6", seed: int = 0, **attrs) -> onnx.ModelProto:
    """in0 → Conv(w, b) [→ Clip(0, 6) | SiLU] → MaxPool 3x3 stride 1 → out: the first layer of MobileNetV2
    (relu6) or EfficientNet-B0 (silu), its output inside the graph (stored channels-last) by the pool after it.
    Weights are scaled by 1/sqrt(fan-in); `attrs` go to the Conv (strides, pads, dilations)."""
    rng = np.random.default_rng(seed)
    inits = {"w": (rng.standard_normal(w) / math.sqrt(math.prod(w[1:]))).astype(np.float32),
             "b": (0.1 * rng.standard_normal(w[0])).astype(np.float32)}
    nodes = [helper.make_node("Conv", ["in0", "w", "b"], ["c" if act else "mid"], name="conv_0", **attrs)]
    if act == "relu6":
        inits.update({"lo": np.array(0.0, np.float32), "hi": np.array(6.0, np.float32)})
        nodes.append(helper.make_node("Clip", ["c", "lo", "hi"], ["mid"], name="clip_0"))
    elif act == "silu":
        nodes += [helper.make_node("Sigmoid", ["c"], ["s"], name="sigmoid_0"),
                  helper.make_node("Mul", ["c", "s"], ["mid"], name="mul_0")]
    nodes.append(helper.make_node("MaxPool", ["mid"], ["out"], name="pool_1", kernel_shape=[3, 3], pads=[1, 1, 1, 1]))
    return B._infer_output(B._graph_model(nodes, "stem", {"in0": x}, {}, inits))


def _plan(model: onnx.ModelProto, precision: str = "fp16", pin: dict | None = None):
    hw = load_profile("sm_90", "h200")
    return run_pipeline(import_model(model, None), Options("sm_90", hw, precision, tuple(sorted((pin or {}).items())))).plan


def _conv(plan):
    (k,) = [k for k in plan.kernels if k.family == "conv"]
    return k


MOBILENET = dict(strides=[2, 2], pads=[1, 1, 1, 1])


def test_mobilenet_v2_stem_plans_on_stem_by_cost():
    """MobileNetV2 B32's stem (3 -> 32, 3x3 stride 2 pad 1, bias + ReLU6): unit stem by cost at fp16, its image read
    NCHW (the channels-last copy does not pay), its prediction recorded with the unit's terms and under the mma
    implicit GEMM's (which measured 69-72 us on an H200)."""
    plan = _plan(stem_model(**MOBILENET))
    k = _conv(plan)
    p = k.schedule.param
    assert p["unit"] == "stem" and p["dtype"] == "f16" and p["TH"] * p["TW"] % 16 == 0
    terms = dict(k.schedule.predicted)
    assert {"t_issue_us", "t_dram_us", "t_block_us", "stem_rounds"} <= terms.keys()
    assert 8.0 < k.schedule.time_us < 25.0
    mma = [c.predicted_time_us for c in k.schedule.candidates if dict(c.params).get("unit") == "mma" and c.predicted_time_us]
    assert mma and min(mma) > k.schedule.time_us
    assert not any(r.target == "in0" and r.applied for r in plan.rewrites if "copy" in r.rule)
    lay = conv_stem.layout(k)
    assert lay.dims == (0, 1, 2, 3) and lay.k == 27 and lay.n == 32 and lay.out == (112, 112)


def test_efficientnet_b0_stem_plans_on_stem_at_bf16():
    plan = _plan(stem_model(act="silu", **MOBILENET), precision="bf16")
    assert _conv(plan).schedule.param["unit"] == "stem" and _conv(plan).schedule.param["dtype"] == "bf16"


@pytest.mark.parametrize("x,w,attrs,precision,why", [
    ((2, 8, 32, 32), (32, 8, 3, 3), {"pads": [1, 1, 1, 1]}, "fp16", "> 64"),
    ((2, 3, 32, 32), (20, 3, 3, 3), {"pads": [1, 1, 1, 1]}, "fp16", "multiples of 8"),
    ((2, 3, 32, 32), (96, 3, 3, 3), {"pads": [1, 1, 1, 1]}, "fp16", "multiples of 8 up to 64"),
    ((2, 3, 32, 32), (32, 3, 3, 3), {"pads": [1, 1, 1, 1]}, "fp32", "fp16/bf16"),
], ids=["k72", "n20", "n96", "fp32"])
def test_stem_declines_with_the_reason(x, w, attrs, precision, why):
    plan = _plan(stem_model(x, w, **attrs), precision=precision)
    k = _conv(plan)
    got = conv_stem.why_not(k, plan)
    assert got is not None and why in got, got
    assert k.schedule.param["unit"] != "stem"
    if precision != "fp32":   # shown with the rejected candidates
        assert any(dict(c.params) == {"unit": "stem"} and why in c.rejected_because for c in k.schedule.candidates)


def test_the_pin_keeps_the_input_nchw_and_the_output_channels_last():
    """Pinned, the unit reads a thin-channel image as it is (the channels-last copy would pad K to 72) and stores
    the row-major [pixels, channels] matrix; a plan-wide pin does the same."""
    for pin in (PIN, {"unit": "stem"}):
        plan = _plan(stem_model((2, 3, 20, 20), (16, 3, 3, 3), pads=[1, 1, 1, 1]), pin=pin)
        k = _conv(plan)
        assert k.schedule.param["unit"] == "stem", pin
        assert plan.types()[k.ops[-1].out].shape == (2, 20, 20, 16)


def test_layout_reads_an_nhwc_image():
    """The layout parse takes the channel index last as well (the image's channels-last copy, padded to 8
    channels or with the filter's columns unfolded into 64: passes/unfold_taps.py)."""
    plan = _plan(stem_model((2, 3, 20, 20), (16, 3, 3, 3), pads=[1, 1, 1, 1]), pin={"unit": "wgmma"})
    k = _conv(plan)
    lay = conv_stem.layout(k)
    assert not isinstance(lay, str) and lay.dims == (0, 3, 1, 2) and lay.channels in (8, 64)
    assert "> 64" in conv_stem.why_not(k, plan)


def test_patch_pitch_and_zero_run():
    """The pitch is the least-conflicting of PW .. PW + 31; the zero run covers every pixel's base, and k past K
    reads it."""
    plan = _plan(stem_model(**MOBILENET))
    lay = conv_stem.layout(_conv(plan))
    for th, tw in ((2, 8), (4, 32), (8, 16)):
        pt = conv_stem.patch(lay, th, tw)
        assert pt.cols <= pt.pitch < pt.cols + 32 and pt.ways >= 1.0
        assert pt.zero > int(conv_stem.pixel_bases(lay, th, tw, pt.pitch).max())
        ko = conv_stem.koffsets(lay, pt.rows, pt.pitch)
        assert ko[27:] == [pt.at_zero(lay)] * 5 and max(ko[:27]) < pt.at_zero(lay)


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not found")
@pytest.mark.parametrize("precision,act,x,w,attrs", [
    ("fp16", "relu6", (32, 3, 224, 224), (32, 3, 3, 3), MOBILENET),
    ("bf16", "silu", (32, 3, 224, 224), (32, 3, 3, 3), MOBILENET),
    ("fp16", "relu6", (1, 4, 30, 30), (64, 4, 3, 3), {"pads": [1, 1, 1, 1]}),
], ids=["mobilenet", "efficientnet", "c4n64"])
def test_stem_kernel_builds_without_spills(tmp_path, precision, act, x, w, attrs):
    """The compiled bundle's stem kernel: ptxas's registers, no local memory."""
    (k,) = [k for k in built_kernels(tmp_path, stem_model(x, w, act=act, **attrs), precision, "--profile", "h200",
                                     "--pin", "conv_0:unit=stem") if k["family"] == "conv"]
    assert k["params"]["unit"] == "stem" and k["registers_source"] == "ptxas" and k["registers"] <= 128
    assert not k.get("spills")


GPU_CASES = [
    ((2, 3, 33, 37), (16, 3, 3, 3), dict(strides=[2, 2], pads=[1, 1, 1, 1])),   # partial tiles, odd sizes
    ((1, 3, 224, 224), (32, 3, 3, 3), dict(strides=[2, 2], pads=[1, 1, 1, 1])),
    ((3, 1, 20, 24), (8, 1, 5, 5), dict(pads=[2, 2, 2, 2])),                      # one channel, 5x5
    ((2, 4, 18, 40), (64, 4, 3, 3), dict(pads=[0, 0, 0, 0])),                     # no padding, 64 channels
    ((3, 3, 17, 29), (32, 3, 1, 7), dict(pads=[0, 3, 0, 3])),                     # 1x7
    ((2, 3, 23, 23), (24, 3, 3, 3), dict(pads=[2, 2, 2, 2], dilations=[2, 2])),   # dilation
    ((1, 3, 31, 47), (16, 3, 3, 3), dict(strides=[2, 1], pads=[1, 0, 1, 0])),     # asymmetric stride and padding
]


@pytest.mark.gpu
@pytest.mark.parametrize("precision", ["fp16", "bf16"])
@pytest.mark.parametrize("act", ["relu6", "silu", None])
@pytest.mark.parametrize("x,w,attrs", GPU_CASES,
                         ids=[f"{'x'.join(map(str, x))}_{'x'.join(map(str, w))}" for x, w, _ in GPU_CASES])
def test_gpu_stem(x, w, attrs, act, precision, gpu_device):
    """Fresh random inputs against float64 (tests/test_conv_taps.check_gpu): zeros outside the image, tiles past
    the output, one to three images, K from 7 to 36, N from 8 to 64."""
    import aicfc
    model = stem_model(x, w, act=act, **attrs)
    payload = aicfc.compile(model, target=gpu_device.arch, precision=precision, pin=PIN)
    assert [k["params"]["unit"] for k in payload["kernels"] if k["family"] == "conv"] == ["stem"]
    check_gpu(model, payload, gpu_device, precision)


@pytest.mark.gpu
@pytest.mark.parametrize("tile", [{"TH": 2, "TW": 8, "WARPS": 4}, {"TH": 4, "TW": 16, "WARPS": 4},
                                  {"TH": 8, "TW": 32, "WARPS": 8}, {"TH": 4, "TW": 32, "WARPS": 8}])
def test_gpu_stem_tiles(tile, gpu_device):
    """Every tile shape on a partial tile (output 17 x 19)."""
    import aicfc
    model = stem_model((2, 3, 34, 38), (32, 3, 3, 3), strides=[2, 2], pads=[1, 1, 1, 1])
    pin = PIN | {f"conv_0:{key}": v for key, v in tile.items()}
    payload = aicfc.compile(model, target=gpu_device.arch, precision="fp16", pin=pin)
    (k,) = [k for k in payload["kernels"] if k["family"] == "conv"]
    assert k["params"]["unit"] == "stem" and all(k["params"][key] == v for key, v in tile.items())
    check_gpu(model, payload, gpu_device, "fp16")
