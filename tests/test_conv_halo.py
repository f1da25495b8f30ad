"""Stride-1 convolutions on the Hopper engine with A as one image tile per output tile, read by
every tap (A = halo, codegen/conv_wgmma.py [Note: halo tiles]; its cost terms in
planner/cost_conv_wgmma.py).

CPU: which convolutions have an image-tile geometry and why the others do not; the planner
picks it by cost for ResNet-50's 3x3 convolutions; the kernel source and its SASS (HGMMA, the
TMA, no local memory, no spills). GPU (`gpu`): against numpy float64 on fresh random inputs
(fp16 1e-2, bf16 2e-2 of the output's max), rows and columns past the output included (a ResNet
stage on image tiles against onnxruntime: test_conv_wgmma.py's test_gpu_resnet_stage_im2col).
"""
from __future__ import annotations

import shutil
import subprocess

import pytest

from aicfc.codegen import conv_wgmma
from tests import onnx_builders as B
from tests.test_conv_wgmma import _gpu_check, _stages

HALO = [
    # (id, input, filter, attributes)
    ("14x14_c64", (2, 64, 14, 14), (96, 64, 3, 3), dict(pads=[1, 1, 1, 1])),
    ("17x17_c128", (2, 128, 17, 17), (64, 128, 3, 3), dict(pads=[1, 1, 1, 1])),
    ("56x56_c64", (2, 64, 56, 56), (64, 64, 3, 3), dict(pads=[1, 1, 1, 1])),
    ("7x7_c256", (3, 256, 7, 7), (136, 256, 3, 3), dict(pads=[1, 1, 1, 1])),
    ("dilated", (1, 64, 13, 13), (64, 64, 3, 3), dict(dilations=[2, 2], pads=[2, 2, 2, 2])),
    ("asym_pads", (3, 64, 11, 7), (72, 64, 3, 3), dict(pads=[0, 1, 1, 0])),
    ("5x5_nopad", (2, 64, 12, 10), (64, 64, 5, 5), dict()),
]


def _model(case):
    _, x, w, attrs = case
    return B.conv_model(x, w, bn=True, act="relu", **attrs)


def _kernel(case, pin=None):
    plan = _stages(_model(case), pin=dict(pin or {}, unit="wgmma", A="halo"))["plan_memory"]
    (k,) = [k for k in plan.kernels if k.family == "conv"]
    return plan, k


@pytest.mark.parametrize("case", HALO, ids=[c[0] for c in HALO])
def test_halo_geometry(case):
    """PITCH is the power of two holding a row and the taps' reach; a tile is whole rows; the
    map reads RH = R + (KH - 1)·dh rows of PITCH columns, 64 channels a copy, 128-byte swizzled."""
    plan, k = _kernel(case)
    p = k.schedule.param
    _, (n, c, h, w), (o, _, kh, kw), attrs = case
    d = attrs.get("dilations", [1, 1])
    pt, pl, pb, pr = attrs.get("pads", [0] * 4)
    oh, ow = h + pt + pb - d[0] * (kh - 1), w + pl + pr - d[1] * (kw - 1)
    pitch = p["PITCH"]
    assert pitch >= ow + (kw - 1) * d[1] and pitch // 2 < max(8, ow + (kw - 1) * d[1]) and p["BM"] % pitch == 0
    rows = p["BM"] // pitch
    assert p["OHP"] % rows == 0 and p["OHP"] - rows < oh <= p["OHP"]
    a, b = conv_wgmma.tensor_maps(k, p, plan.types())
    assert a.dims == (c, w, h, n) and a.box == (64, pitch, rows + (kh - 1) * d[0], 1) and a.swizzle == 128 and a.im2col is None
    assert a.problems() is None and b.problems() is None
    assert conv_wgmma.tiles(k, p)[0] == n * p["OHP"] * pitch // p["BM"]


def test_halo_declined_with_reasons():
    def why(x, w, **attrs):
        plan = _stages(B.conv_model(x, w, **attrs), pin={"unit": "wgmma", "unfold": "0"})["plan_memory"]
        (k,) = [k for k in plan.kernels if k.family == "conv"]
        return conv_wgmma.halo_geometry(k, plan.types(), 128)
    assert "stride" in why((2, 64, 14, 14), (64, 64, 3, 3), strides=[2, 2], pads=[1, 1, 1, 1])
    assert "whole k-blocks" in why((2, 16, 9, 9), (24, 16, 3, 3), pads=[1, 1, 1, 1])
    assert "exceeds the tile" in why((1, 64, 4, 200), (64, 64, 3, 3), pads=[1, 1, 1, 1])


def test_resnet_3x3_halo_costed_beside_im2col():
    """ResNet-50 B32's 14x14x256 3x3 convolution (BN 128, tensor-core bound) has image-tile (halo)
    candidates beside im2col and gathered ones, with a fraction of im2col's L2 traffic. Inside a
    graph the pick is im2col with the staged epilogue, which halo tiles (their rows are slots)
    cannot have: measured on an H200, 14.6-15.1 us (benchmarks/results/conv_ab_refit_session16_h200.txt)
    against 16.6 for halo tiles with the epilogue from registers (session 11). Its 56x56x64 one
    (BN 64) and 7x7 ones keep im2col too: the taps' shifted reads of a tile bind shared memory
    (the fitted HALO_A_SMEM), and a 16-slot row of 7 output columns uses a quarter of the tile."""
    x = (32, 256, 14, 14)
    plan = _stages(B.conv_model(x, (256, 256, 3, 3), bn=True, act="relu", pads=[1, 1, 1, 1], follow="pool"))["plan_memory"]
    k = [k for k in plan.kernels if k.family == "conv"][0]
    assert (k.schedule.param["A"], k.schedule.param["OUT"]) == ("tma", 2), dict(k.schedule.param)
    shown = [c for c in k.schedule.candidates if not c.rejected_because]
    assert any(dict(c.params).get("A") == "halo" for c in shown)
    plan = _stages(B.conv_model(x, (256, 256, 3, 3), bn=True, act="relu", pads=[1, 1, 1, 1]), pin={"A": "halo"})["plan_memory"]
    (k,) = [k for k in plan.kernels if k.family == "conv"]
    # the image through L2 (R + 2 rows read for R stored, once per column tile) under half the 9 times im2col reads it
    assert dict(k.schedule.predicted)["gathered_bytes"] < 9 * x[0] * x[1] * x[2] * x[3] * 2 / 2
    for x, w in (((32, 64, 56, 56), (64, 64, 3, 3)), ((32, 512, 7, 7), (512, 512, 3, 3))):
        plan = _stages(B.conv_model(x, w, bn=True, act="relu", pads=[1, 1, 1, 1]))["plan_memory"]
        (k,) = [k for k in plan.kernels if k.family == "conv"]
        assert k.schedule.param["A"] == "tma", dict(k.schedule.param)


def test_halo_kernel_source():
    from aicfc.codegen.module import render_module
    plan, _ = _kernel(HALO[0], {"NWG": 2, "MI": 1, "BN": 64})
    src = render_module(plan)
    assert "aicf_wgg_desc(sa + ((wg * 1 + i)) * 8192 + (kk) * 32, 16, 1024)" in src and "aicf_wgg_tma4(" in src
    assert "hw < 14 && ho < 14" in src and "cp.async.cg" not in src and ".im2col" not in src


NVCC_PINS = [dict(NWG=1, MI=1, BN=64), dict(NWG=2, MI=1, BN=128), dict(NWG=1, MI=2, BN=128), dict(NWG=2, MI=1, BN=256)]


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not found")
@pytest.mark.parametrize("pin", NVCC_PINS, ids=["nwg1", "nwg2_bn128", "mi2", "nwg2_bn256"])
def test_halo_builds_without_spills(pin, tmp_path, monkeypatch):
    """ptxas: no spills; and where cuobjdump exists, HGMMA and the TMA in the SASS, no local memory."""
    from aicfc.codegen.module import render_module
    from aicfc.codegen.nvcc import build
    monkeypatch.setenv("AICF_CACHE_DIR", str(tmp_path))
    plan, k = _kernel(HALO[3], pin)       # 136 output channels: every pin's BN fits
    built = build(render_module(plan), "sm_90")
    assert built.spills.get(k.name, 0) == 0, built.spills
    if shutil.which("cuobjdump") is None:
        return
    cubin = tmp_path / "k.cubin"
    cubin.write_bytes(built.cubin)
    sass = subprocess.run(["cuobjdump", "-sass", str(cubin)], capture_output=True, text=True).stdout
    assert "HGMMA" in sass and "UTMALDG" in sass
    assert not any(f" {op}" in sass for op in ("LDL", "STL"))


@pytest.mark.gpu
@pytest.mark.parametrize("precision", ["fp16", "bf16"])
@pytest.mark.parametrize("pin", [{}, {"NWG": 1, "MI": 1, "BN": 64}, {"NWG": 1, "MI": 2, "BN": 128}, {"NWG": 2, "BN": 256}],
                         ids=["cost", "nwg1", "mi2", "nwg2_bn256"])
@pytest.mark.parametrize("case", HALO, ids=[c[0] for c in HALO])
def test_gpu_conv_halo(case, pin, precision, gpu_device):
    try:
        payload = _gpu_check(_model(case), precision, gpu_device, dict(pin, unit="wgmma", A="halo"))
    except Exception as e:  # noqa: BLE001 - a pin outside this convolution's space
        if "no feasible conv candidate matches --pin" in str(e):
            pytest.skip(str(e))
        raise
    (k,) = [k for k in payload["kernels"] if k["family"] == "conv"]
    assert k["params"]["A"] == "halo"
