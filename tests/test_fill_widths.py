"""[Note: widths that fill the SMs] (codegen/gemm_wgmma.py): tile widths between the standard ones on
the Hopper engine, for the GEMM and the implicit-GEMM convolution.

CPU: the rule, where the spaces offer such a width (a K-major B only; no TMA store, no cluster
pair), that the kernels build without spills. GPU (`gpu`): pinned to such a width (a last column
tile narrower than the rest, rows past M, split-k, ping-pong, cooperative, im2col and gathered
convolutions) and a ResNet stage-4 bottleneck by cost, against numpy float64 on fresh random inputs;
tolerances on max|y - ref| / max|ref|: fp16 1e-2, bf16 2e-2. (The residual epilogue at such a width
runs in ResNet-50 B32's plan, checked against onnxruntime on the GPU machine:
benchmarks/results/fill_widths_session37_h200.txt.)
"""
from __future__ import annotations

import shutil

import numpy as np
import pytest

from aicfc.codegen import conv_wgmma, gemm_wgmma
from aicfc.planner.hardware import load_profile
from tests import onnx_builders as B
from tests.test_conv_wgmma import _built, _gpu_check, _stages
from tests.test_gemm_gpu import b_transposed_input, matmul
from tests.test_gemm_wgmma import _check, _gemm_kernel, _plan

HW = load_profile("sm_90")
SMS = HW.sm_count
# ResNet-50 B32's stage 4: 32 images of 7x7 pixels are 1568 GEMM rows, 25 tiles of 64 rows
STAGE4 = dict(x=(32, 64, 7, 7), w=(512, 64, 3, 3), pads=[1, 1, 1, 1])


def test_the_rule():
    assert gemm_wgmma.fill_widths(25, 512, 132) == (104,)      # 5 columns of tiles: 125 tiles, not 100
    assert gemm_wgmma.fill_widths(13, 2048, 132) == (208,)     # 10 columns: 130 tiles, not 104
    assert gemm_wgmma.fill_widths(49, 256, 132) == ()          # 2 columns: 128 wide, a standard width
    assert gemm_wgmma.fill_widths(2, 768, 132) == ()           # narrower than 64
    assert gemm_wgmma.fill_widths(200, 512, 132) == ()         # more rows of tiles than SMs
    assert gemm_wgmma.fill_widths(16, 768, 132) == (96,)       # 8 columns of 96 against 6 of 128
    for tm, n in ((25, 512), (13, 2048), (16, 768), (7, 3000)):
        for w in gemm_wgmma.fill_widths(tm, n, SMS):
            assert w % 8 == 0 and 64 < w < 256 and tm * -(-n // w) <= SMS


def _gemm_space(model):
    plan = _plan(model)
    return gemm_wgmma.space(_gemm_kernel(plan), plan, "f16", SMS, HW.smem_per_block_optin)


def test_gemm_offers_the_width_for_a_k_major_b_alone():
    pts = _gemm_space(b_transposed_input(1568, 256, 512, np.random.default_rng(0)))
    fills = [p for p in pts if p["BN"] not in gemm_wgmma.SPACE["BN"]]
    assert {p["BN"] for p in fills} == {104}
    assert not any(p.get("TS") or p.get("CLUSTER", 1) > 1 for p in fills)
    assert pts.index(fills[0]) > max(i for i, p in enumerate(pts) if p["BN"] in gemm_wgmma.SPACE["BN"])
    # a weight re-laid out along n (MN-major) is loaded as boxes of 64 columns: standard widths only
    assert all(p["BN"] in gemm_wgmma.SPACE["BN"] for p in _gemm_space(matmul(1568, 256, 512, np.random.default_rng(0))))


def test_conv_offers_the_width_and_not_as_image_tiles():
    spec = dict(STAGE4)
    model = B.conv_model(spec.pop("x"), spec.pop("w"), bn=True, act="relu", **spec)
    plan = _stages(model)["plan_memory"]
    k = next(k for k in plan.kernels if k.family == "conv")
    pts = conv_wgmma.space(k, plan, SMS, HW.smem_per_block_optin)
    fills = [p for p in pts if p["BN"] not in conv_wgmma.SPACE["BN"]]
    assert {p["BN"] for p in fills} == {104} and not any(p["A"] == "halo" for p in fills)


# (pin, output channels, the fill width): 64-row tiles over 512 columns, 128-row ones over 2048 or 1024
PINS = [(dict(NWG=2, PP=1, MI=1), 512, 104), (dict(NWG=1, PP=0, MI=1), 512, 104), (dict(NWG=2, PP=0, MI=1), 2048, 208),
        (dict(NWG=1, PP=0, MI=2), 1024, 104), (dict(NWG=2, PP=1, MI=2), 1024, 104)]
PIN_IDS = ["pp", "one_wg", "two_wg", "one_wg_mi2", "pp_mi2"]


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not found")
@pytest.mark.parametrize("pin,n,width", PINS, ids=PIN_IDS)
def test_builds_without_spills(pin, n, width, tmp_path, monkeypatch):
    from aicfc.codegen.module import render_module
    from aicfc.codegen.nvcc import build
    k, b = _built(("stage4", dict(STAGE4, w=(n, 64, 3, 3))), dict(pin, BN=width), tmp_path, monkeypatch)
    assert k.schedule.param["BN"] == width and b.spills.get(k.name, 0) == 0, b.spills
    plan = _plan(b_transposed_input(1568, 256, n, np.random.default_rng(0)), pin=dict(pin, unit="wgmma", BN=width))
    k = _gemm_kernel(plan)
    b = build(render_module(plan), "sm_90")
    assert k.schedule.param["BN"] == width and b.spills.get(k.name, 0) == 0, b.spills


# ------------------------------------------------------------------ on the GPU

@pytest.mark.gpu
@pytest.mark.parametrize("precision", ("fp16", "bf16"))
@pytest.mark.parametrize("pin,n,width", PINS + [(dict(NWG=1, PP=0, MI=1, SPLITK=2), 512, 104)],
                         ids=PIN_IDS + ["split2"])
def test_gpu_gemm_fill_width(pin, n, width, precision, gpu_device):
    """1560 rows (the last tile's rows past M); n columns in tiles of `width`, the last one narrower."""
    model = b_transposed_input(1560, 320, n, np.random.default_rng(21))
    for seed in (22, 23):
        _check(model, precision, {"unit": "wgmma", "BN": width, **pin}, gpu_device, seed=seed)


@pytest.mark.gpu
@pytest.mark.parametrize("precision", ("fp16", "bf16"))
@pytest.mark.parametrize("a", ("tma", "gather"))
def test_gpu_conv_fill_width(a, precision, gpu_device):
    spec = dict(STAGE4)
    model = B.conv_model(spec.pop("x"), spec.pop("w"), bn=True, act="relu", **spec)
    payload = _gpu_check(model, precision, gpu_device, {"unit": "wgmma", "BN": 104, "A": a})
    assert [k["params"]["BN"] for k in payload["kernels"] if k["family"] == "conv"] == [104]


@pytest.mark.gpu
@pytest.mark.parametrize("precision", ("fp16", "bf16"))
def test_gpu_stage4_bottleneck_by_cost(precision, gpu_device):
    """A ResNet-50 stage-4 bottleneck at 32 images (1x1 reduce, 3x3, 1x1 expand with the residual add),
    by cost, against numpy float64: the planner takes the fill width where the model says so."""
    model = B.resnet_stage_model((32, 512, 7, 7), mid=512, out=512, stride=1, seed=13)
    payload = _gpu_check(model, precision, gpu_device)
    widths = [k["params"].get("BN") for k in payload["kernels"] if k["family"] in ("gemm", "conv")]
    assert 104 in widths, widths
