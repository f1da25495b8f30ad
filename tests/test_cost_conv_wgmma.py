"""The Hopper implicit-GEMM convolution's cost terms (planner/cost_conv_wgmma.py) against what an
H200 measured: ResNet-50 fp16 at batch 32, `aicf-run --profile`
(benchmarks/results/profile_resnet50_b32_session5_h200.txt: each kernel alone, 20 back-to-back
launches per graph replay, median of 5; the gatherers publishing STAGES - 2 k-blocks late). No
GPU needed: the measurements are data here.

Each case is one convolution of that profile (+ folded BatchNorm, + ReLU where ResNet has one),
compiled alone on the schedule the profile's plan ran, and its prediction compared with the
measured time. The profile's 1x1 stride-1 convolutions are GEMMs (`conv_as_matmul`), not here;
the stem is (its input copy aside). The issue's bar: measured / predicted in [0.8, 1.25] for
at least 90% of the convolutions.

Before the gatherers' round-trip term and the raster-group reread rule (cost_conv_wgmma.py),
3 of these 20 were in the band (the 3x3 convolutions at 1.32-1.77, the 1x1/2 projection at
0.71, the stem at 1.96). Session 5's profile ran STAGES 5 and 6 (4 and 5 groups of copies in
flight); a t_round divided by those groups put the 3x3 convolutions at 1.3-1.9, the round trip
over 2 groups (as fitted before, at STAGES 3 and 4) puts all 20 in the band (the stem at 1.25).
"""
from __future__ import annotations

import dataclasses
import pytest

from aicfc.frontend.onnx_import import import_model
from aicfc.passes.pipeline import Options, run_pipeline
from aicfc.planner.hardware import load_profile
from tests import onnx_builders as B

BAND = (0.8, 1.25)

# kernel, (input NCHW, filter, strides, pads, ReLU), the profile plan's schedule, measured us
MEASURED = [
    ("k1", ((32, 3, 224, 224), (64, 3, 7, 7), 2, 3, True), dict(BM=128, BN=64, NWG=2, MI=1, STAGES=6), 188.29),
    ("k4", ((32, 64, 56, 56), (64, 64, 3, 3), 1, 1, True), dict(BM=128, BN=64, NWG=2, MI=1, STAGES=6), 44.09),
    ("k8", ((32, 64, 56, 56), (64, 64, 3, 3), 1, 1, True), dict(BM=128, BN=64, NWG=2, MI=1, STAGES=6), 44.24),
    ("k11", ((32, 64, 56, 56), (64, 64, 3, 3), 1, 1, True), dict(BM=128, BN=64, NWG=2, MI=1, STAGES=6), 44.17),
    ("k14", ((32, 128, 56, 56), (128, 128, 3, 3), 2, 1, True), dict(BM=128, BN=128, NWG=2, MI=1, STAGES=5), 30.85),
    ("k15", ((32, 256, 56, 56), (512, 256, 1, 1), 2, 0, False), dict(BM=128, BN=256, NWG=2, MI=1, STAGES=3), 31.49),
    ("k18", ((32, 128, 28, 28), (128, 128, 3, 3), 1, 1, True), dict(BM=128, BN=128, NWG=2, MI=1, STAGES=5), 33.06),
    ("k21", ((32, 128, 28, 28), (128, 128, 3, 3), 1, 1, True), dict(BM=128, BN=128, NWG=2, MI=1, STAGES=5), 33.08),
    ("k24", ((32, 128, 28, 28), (128, 128, 3, 3), 1, 1, True), dict(BM=128, BN=128, NWG=2, MI=1, STAGES=5), 33.07),
    ("k27", ((32, 256, 28, 28), (256, 256, 3, 3), 2, 1, True), dict(BM=128, BN=128, NWG=2, MI=1, STAGES=5), 28.98),
    ("k28", ((32, 512, 28, 28), (1024, 512, 1, 1), 2, 0, False), dict(BM=128, BN=128, NWG=2, MI=1, STAGES=5), 21.63),
    ("k31", ((32, 256, 14, 14), (256, 256, 3, 3), 1, 1, True), dict(BM=128, BN=128, NWG=2, MI=1, STAGES=5), 31.48),
    ("k34", ((32, 256, 14, 14), (256, 256, 3, 3), 1, 1, True), dict(BM=128, BN=128, NWG=2, MI=1, STAGES=5), 31.42),
    ("k37", ((32, 256, 14, 14), (256, 256, 3, 3), 1, 1, True), dict(BM=128, BN=128, NWG=2, MI=1, STAGES=5), 31.52),
    ("k40", ((32, 256, 14, 14), (256, 256, 3, 3), 1, 1, True), dict(BM=128, BN=128, NWG=2, MI=1, STAGES=5), 31.46),
    ("k43", ((32, 256, 14, 14), (256, 256, 3, 3), 1, 1, True), dict(BM=128, BN=128, NWG=2, MI=1, STAGES=5), 31.54),
    ("k46", ((32, 512, 14, 14), (512, 512, 3, 3), 2, 1, True), dict(BM=128, BN=64, NWG=2, MI=1, STAGES=6), 44.64),
    ("k47", ((32, 1024, 14, 14), (2048, 1024, 1, 1), 2, 0, False), dict(BM=128, BN=256, NWG=2, MI=1, STAGES=3), 19.22),
    ("k50", ((32, 512, 7, 7), (512, 512, 3, 3), 1, 1, True), dict(BM=128, BN=64, NWG=2, MI=1, STAGES=6), 51.01),
    ("k53", ((32, 512, 7, 7), (512, 512, 3, 3), 1, 1, True), dict(BM=128, BN=64, NWG=2, MI=1, STAGES=6), 50.97),
]


def predicted(spec: tuple, pin: dict) -> tuple[float, dict]:
    """The predicted time and terms of the convolution `spec` on the schedule `pin`."""
    x, w, s, p, relu = spec
    model = B.conv_model(x, w, bn=True, act="relu" if relu else None, strides=[s, s], pads=[p] * 4)
    # (session 5's plan ran no ping-pong: PP=0, and its stem read the padded 8-channel copy: unfold=0)
    pins = {"unit": "wgmma", "A": "gather", "PP": 0, "unfold": "0", **{k: v for k, v in pin.items() if k != "BM"}}
    plan = run_pipeline(import_model(model, None), Options("sm_90", load_profile("sm_90"), "fp16",
                                                           tuple((k, str(v)) for k, v in pins.items()))).plan
    (k,) = [k for k in plan.kernels if k.family == "conv"]
    assert k.schedule.param["BM"] == pin["BM"] and k.schedule.param["BN"] == pin["BN"], k.schedule.param
    return k.schedule.time_us, dict(k.schedule.predicted)


_RATIOS: dict[str, float] = {}


def _ratio(name: str, spec: tuple, pin: dict, measured: float) -> float:
    if name not in _RATIOS:
        _RATIOS[name] = measured / predicted(spec, pin)[0]
    return _RATIOS[name]


def test_ninety_percent_of_the_convolutions_within_the_band():
    ratios = {name: _ratio(name, spec, pin, ms) for name, spec, pin, ms in MEASURED}
    inside = [n for n, r in ratios.items() if BAND[0] <= r <= BAND[1]]
    table = ", ".join(f"{n} {r:.2f}" for n, r in ratios.items())
    assert len(inside) >= 0.9 * len(ratios), f"measured/predicted: {table}"


@pytest.mark.parametrize("name,spec,pin,measured", [c for c in MEASURED if c[0] != "k1"],
                         ids=[c[0] for c in MEASURED if c[0] != "k1"])
def test_each_convolution_within_the_band(name, spec, pin, measured):
    """Every convolution but the stem (see test_stem_is_the_known_outlier)."""
    r = _ratio(name, spec, pin, measured)
    assert BAND[0] <= r <= BAND[1], f"{name}: measured {measured} us, measured/predicted {r:.2f}"


def test_stem_is_the_known_outlier():
    """The 7x7/2 stem over 8 channels (3 and 5 zeros): every 16-byte run of a k-block comes from
    a different tap (8 taps a k-block, each its own guard and half of a 32-byte sector), which no
    term models beyond the gatherers' round trip; it measures about 1.25x the prediction. Pinned
    so that a change that moves it either way is seen."""
    name, spec, pin, measured = MEASURED[0]
    assert name == "k1"
    assert 1.0 <= _ratio(name, spec, pin, measured) <= 1.35


def test_gather_round_trip_is_a_term():
    """The round-trip floor is reported as its own term, and it is what bounds a 3x3 k-block."""
    _, terms = predicted(MEASURED[1][1], MEASURED[1][2])
    assert terms["t_gather_round_us"] >= max(terms["t_l2_us"], terms["t_compute_us"], terms["t_gather_us"])


# Stream-k 3x3 convolutions pinned on an H100 (session 76, benchmarks/results/stream_k_session76_h100.txt; each
# kernel alone, `aicf-run --profile`): 128x128 tiles on 132 CTAs, measured us ([Note: stream-k's terms])
STREAM_MEASURED = [
    ("s2", (32, 128, 28, 28), (128, 128, 3, 3), 20.23),
    ("s3", (32, 256, 14, 14), (256, 256, 3, 3), 19.22),
    ("s4", (32, 512, 7, 7), (512, 512, 3, 3), 24.77),
]


@pytest.mark.parametrize("name,x,w,measured", STREAM_MEASURED, ids=[c[0] for c in STREAM_MEASURED])
def test_stream_k_convolutions_cost_what_an_h100_measured(name, x, w, measured):
    model = B.conv_model(x, w, bn=True, act="relu", pads=[1, 1, 1, 1], follow="pool")
    pins = {"unit": "wgmma", "A": "tma", "STREAM": 1, "BM": 128, "BN": 128, "PP": 0, "NWG": 2, "STAGES": 5}
    plan = run_pipeline(import_model(model, None), Options("sm_90", load_profile("sm_90"), "fp16",
                                                           tuple((k, str(v)) for k, v in pins.items()))).plan
    (k,) = [k for k in plan.kernels if k.family == "conv"]
    assert k.schedule.param["STREAM"] == 1 and k.schedule.param["CTAS"] == 132
    assert BAND[0] <= measured / k.schedule.time_us <= BAND[1], (measured, k.schedule.time_us)


# The stage-4 3x3 (7x7x512, B32) on two unsplit tiles, pinned on an H100 (session 82,
# benchmarks/results/im2col_cap_session82_h100.txt; each kernel alone, `aicf-run --profile`): measured us
CAP_MEASURED = [
    ("64x128 ping-pong", {"BM": 64, "BN": 128, "PP": 1, "NWG": 2, "STAGES": 6}, 17.08),
    ("128x64", {"BM": 128, "BN": 64, "PP": 0, "NWG": 2, "STAGES": 6}, 20.24),
]


def _sm_90(rows: int | None):
    """sm_90 with the im2col cap counted in boxes of `rows` pixel rows; None: counted in boxes (before session 83)."""
    hw = load_profile("sm_90")
    data = {k: v for k, v in hw.data.items() if k != "im2col_cap_rows"}
    return dataclasses.replace(hw, data={**data, "im2col_cap_rows": rows} if rows else data)


def _stage4_kernel(rows: int | None, pins: dict):
    """The stage-4 3x3 (7x7x512, B32, BN, ReLU) planned under `_sm_90(rows)` with `pins`: its one kernel."""
    model = B.conv_model((32, 512, 7, 7), (512, 512, 3, 3), bn=True, act="relu", pads=[1, 1, 1, 1])
    plan = run_pipeline(import_model(model, None), Options("sm_90", _sm_90(rows), "fp16",
                                                           tuple((k, str(v)) for k, v in pins.items()))).plan
    (k,) = [k for k in plan.kernels if k.family == "conv"]
    return k


def _stage4(pin: dict, rows: int | None) -> float:
    k = _stage4_kernel(rows, {"unit": "wgmma", "A": "tma", "SPLITK": 1, "STREAM": 0, **pin})
    assert all(k.schedule.param[a] == v for a, v in pin.items()), k.schedule.param
    return k.schedule.time_us


def test_im2col_cap_in_pixel_rows_prices_the_64_row_tiles_as_measured():
    """[Note: im2col boxes in flight]: counted in boxes of 128 pixel rows (the profile key im2col_cap_rows) the
    cap lets eight 64-row boxes fly, and the 64-row tiles land in the band; counted in boxes (sm_90 before session
    83, which set the key) they are charged the 128-row tiles' latency. The 128-row tiles keep their cap either way
    (their walk term still says 1.4x what they ran: 29.1 us alone here against 20.24, not mended)."""
    (fast, fp, fm), (slow, sp, sm) = CAP_MEASURED
    rows = {name: _stage4(pin, 128) for name, pin, _ in CAP_MEASURED}
    assert BAND[0] <= fm / rows[fast] <= BAND[1], rows
    assert rows[fast] < rows[slow]
    assert _stage4(sp, None) == pytest.approx(rows[slow])
    assert _stage4(fp, None) > rows[fast] * 1.1


def test_sm_90_counts_the_im2col_cap_in_pixel_rows():
    """[Note: im2col boxes in flight]: sm_90 carries im2col_cap_rows since session 83's plan A/B on an H100
    (ResNet-50 B32 1.008x with it, the stage-4 3x3s 17.8-18.0 us alone on 64x104 ping-pong tiles against 19.3-19.8
    on 128x128 k-split clusters): the planner's own pick for that 3x3, unpinned, is the 64-row ping-pong tile, and
    counted in boxes it was the split cluster."""
    assert load_profile("sm_90").data["im2col_cap_rows"] == 128
    picks = {rows: _stage4_kernel(rows, {}).schedule.param for rows in (128, None)}
    assert (picks[128]["BM"], picks[128]["PP"], picks[128]["SPLITK"]) == (64, 1, 1), picks[128]
    assert (picks[None]["BM"], picks[None]["SPLITK"]) == (128, 2), picks[None]
