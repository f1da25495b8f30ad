"""[Note: two issuing warpgroups] (planner/cost_wgmma.py): two cooperative warpgroups hide each
other's wgmma issue, so their tiles keep the whole tensor rate (n_eff = 1), where ping-pong's
warpgroups and a lone one lose WGMMA_ISSUE_CYCLES an instruction. No GPU needed: what an H200
measured is data here.

ResNet-50 B32's stage-3 convolutions (14x14, 256 channels: 6272 output rows, one tile a CTA on
98 CTAs), each timed alone (`aicf-run --profile`, benchmarks/results/coop_issue_session38_h200.txt):
the 3x3 ones ran 128x128 tiles on two cooperative warpgroups in 13.97-14.77 us against 14.30-14.52
for 64x256 tiles on one warpgroup, the 1x1 reduce GEMMs (1024 -> 256) 7.74-7.81 against 7.92-7.97.
The model had both 64x256 picks ahead; with n_eff = 1 for the cooperative tiles they move."""
from __future__ import annotations

import numpy as np
import pytest

from aicfc.frontend.onnx_import import import_model
from aicfc.passes.pipeline import Options, run_pipeline
from aicfc.planner.cost_wgmma import WGMMA_ISSUE_CYCLES, n_eff
from aicfc.planner.hardware import load_profile
from tests import onnx_builders as B
from tests.test_gemm_gpu import matmul

BAND = (0.8, 1.25)


@pytest.mark.parametrize("bn", [64, 128, 256])
def test_only_cooperative_warpgroups_hide_the_issue(bn):
    lone = (bn / 2) / (bn / 2 + WGMMA_ISSUE_CYCLES)
    assert n_eff(bn) == lone
    assert n_eff(bn, {"NWG": 1, "PP": 0, "MI": 2}) == lone          # one issuer, two instructions a k-step
    assert n_eff(bn, {"NWG": 2, "PP": 1, "MI": 2}) == lone          # ping-pong: the k-loops take turns
    assert n_eff(bn, {"NWG": 2, "PP": 0, "MI": 1}) == 1.0


def _plan(model, pins: dict):
    return run_pipeline(import_model(model, None), Options("sm_90", load_profile("sm_90", "h200"), "fp16",
                                                           tuple((k, str(v)) for k, v in pins.items()))).plan


# (the kernel's family, the model, the pins beside unit=wgmma, the picked tile's measured us)
STAGE3 = [
    ("conv", lambda: B.conv_model((32, 256, 14, 14), (256, 256, 3, 3), bn=True, act="relu", strides=[1, 1], pads=[1] * 4),
     {"A": "tma"}, 14.09),
    ("gemm", lambda: matmul(6272, 1024, 256, np.random.default_rng(0)), {}, 7.77),
]


@pytest.mark.parametrize("family,model,pins,measured", STAGE3, ids=["3x3", "1x1"])
def test_stage3_picks_the_cooperative_tile_that_measured_faster(family, model, pins, measured):
    plan = _plan(model(), {"unit": "wgmma", **pins})
    (k,) = [k for k in plan.kernels if k.family == family]
    p = k.schedule.param
    assert (p["BM"], p["BN"], p["NWG"], p["PP"]) == (128, 128, 2, 0), p
    assert dict(k.schedule.predicted)["n_eff"] == 1.0
    assert BAND[0] <= measured / k.schedule.time_us <= BAND[1], k.schedule.time_us
