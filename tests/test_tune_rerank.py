"""benchmarks/tune_rerank.py: a stored tune report re-ranked by this tree's planner, on the CPU."""
from __future__ import annotations

import json

import numpy as np

from aicfc.frontend.onnx_import import import_model
from aicfc.passes.pipeline import Options, run_pipeline
from aicfc.planner.hardware import load_profile
from aicfc.tune import TuneReport, candidates
from benchmarks.gemm import matmul_model
from benchmarks.tune_rerank import rerank, summary


def _report(drop_pick: bool = False):
    hw = load_profile("sm_90", "h200")
    w = np.random.default_rng(0).standard_normal((1024, 768)).astype(np.float32)
    plan = run_pipeline(import_model(matmul_model(512, 1024, 768, w), None, name="mm"), Options("sm_90", hw, "fp16")).plan
    report = TuneReport("mm", "sm_90", "fp16", "synthetic", hw.data, candidates(plan, hw, 5, 3), plan.types())
    (kt,) = report.kernels
    for c in kt.candidates:   # 'measured': the pick 40% slow, every other candidate at its prediction
        c.measured_us = c.predicted_us * (1.4 if c.rank == 0 else 1.0)
        if drop_pick and c.rank == 0:
            c.measured_us = None
    return plan, hw, json.loads(json.dumps(report.to_json())), kt


def test_same_tree_same_profile_picks_what_the_report_picked():
    plan, hw, report, kt = _report()
    (row,) = rerank(plan, hw, report)
    pick = next(c for c in kt.candidates if c.rank == 0)
    assert row["kernel"] == kt.name and row["new_pick_params"] == pick.params
    assert row["new_pick_us"] == row["old_pick_us"] == pick.measured_us
    assert row["new_pick_predicted_us"] == pick.predicted_us
    assert row["fastest_us"] == min(c.measured_us for c in kt.candidates) < pick.measured_us
    assert row["best_measured_by_new_us"] == pick.measured_us
    lines = summary([row])
    assert lines[-2].startswith("kernels 1; new picks measured 1 (unmeasured 0)")
    assert "measured / predicted in [0.8, 1.25] 0" in lines[-2]   # the pick measured 1.4x its prediction


def test_a_pick_the_gpu_never_timed_is_reported_unmeasured():
    plan, hw, report, kt = _report(drop_pick=True)
    (row,) = rerank(plan, hw, report)
    assert row["new_pick_us"] is None and row["old_pick_us"] is None
    second = min((c for c in kt.candidates if c.measured_us), key=lambda c: c.rank)
    assert row["best_measured_by_new_us"] == second.measured_us
    assert "unmeas" in summary([row])[0]


def test_calibration_groups_the_timed_candidates_by_their_warpgroups():
    from benchmarks.tune_rerank import arrangement, calibration
    plan, hw, report, kt = _report()
    lines = calibration(plan, hw, report)
    timed = [c for c in kt.candidates if c.measured_us and c.params.get("unit") == "wgmma"]
    pick = next(c for c in kt.candidates if c.rank == 0)
    for name in {arrangement(c.params) for c in timed}:
        (line,) = [x for x in lines if x.startswith(name)]
        n = sum(arrangement(c.params) == name for c in timed)
        assert f" {n} timed" in line
        if pick.params.get("unit") != "wgmma" or arrangement(pick.params) != name:
            assert "predicted 1.000 " in line   # every candidate but the pick measured its prediction
    assert lines[-1].startswith("cluster pairs timed both ways: ")
    assert arrangement({"NWG": 2, "PP": 0}) == "cooperative" and arrangement({"NWG": 2, "PP": 1}) == "ping-pong"
    assert arrangement({"NWG": 1, "PP": 0, "MI": 2}) == "lone"


def test_calibration_groups_other_units_by_unit_and_mma_by_its_warps():
    from benchmarks.tune_rerank import group
    assert group({"unit": "mma", "WM": 2, "WN": 1}) == "mma, 2 warps"
    assert group({"unit": "simt", "BM": 64}) == "simt" and group({"unit": "thin"}) == "thin"
    assert group({"unit": "wgmma", "NWG": 2, "PP": 1}) == "ping-pong"


def test_calibration_adds_the_timing_offset_to_every_prediction():
    """`--timing-offset-us`: the report's timing over the profile's launch term is added before the ratio, so a
    candidate that measured its prediction now measures below it by exactly that share."""
    from benchmarks.tune_rerank import calibration
    plan, hw, report, kt = _report()
    base, shifted = calibration(plan, hw, report), calibration(plan, hw, report, 0.5)
    assert shifted[-2].startswith("(every prediction + 0.5 us")
    assert len(shifted) == len(base) + 1
    exact = [i for i, x in enumerate(base) if "predicted 1.000 " in x]   # groups that measured their predictions
    assert exact
    for i in exact:
        geo = float(shifted[i].split("predicted ")[1].split()[0])
        assert 0.5 < geo < 0.999


def test_rerank_cli_rejects_a_negative_timing_offset(capsys, tmp_path):
    from benchmarks.tune_rerank import main
    report = tmp_path / "r.json"
    report.write_text("{}")
    assert main([str(tmp_path / "m.onnx"), str(report), "--calibration", "--timing-offset-us", "-1"]) == 2
    assert capsys.readouterr().err.strip().startswith("tune_rerank: --timing-offset-us")
