"""benchmarks/fit_units.py (session 43's joint fit of the small-k GEMM units against stored `aicfc tune`
reports): the correction's algebra, that the grid search recovers a correction it generated, the
comparison of two rankings, and one-line errors for bad arguments. The fit over the real reports
re-plans four CNNs (minutes); its output is benchmarks/results/fit_units_session43.txt."""
from __future__ import annotations

import numpy as np
import pytest

from benchmarks import fit_units


def test_corrected_is_the_identity_without_keys():
    assert fit_units.corrected(5.0, 1.0, 2.0, {}) == 5.0
    # fixed adds; scale multiplies what is neither launch nor epilogue; the epilogue has its own factor
    assert fit_units.corrected(5.0, 1.0, 2.0, {"fixed": 0.5, "scale": 2.0, "epilogue": 1.5}) == pytest.approx(
        5.0 + 0.5 + 1.0 * 2.0 + 0.5 * 2.0)


def test_fit_recovers_a_correction_it_generated():
    rng = np.random.default_rng(0)
    truth = {"fixed": 1.1, "scale": 1.3, "epilogue": 2.5}
    rows = []
    for _ in range(60):
        t, epi = rng.uniform(3.0, 20.0), rng.uniform(0.2, 2.0)
        rows.append({"t": t, "launch": 1.0, "epi": epi, "measured": fit_units.corrected(t, 1.0, epi, truth)})
    got = fit_units.fit(rows)
    assert got == pytest.approx(truth, abs=0.051)
    geo, share = fit_units.band(rows, got)
    assert geo == pytest.approx(1.0, abs=0.02) and share == 1.0
    assert fit_units.band(rows, {})[1] < 0.5   # uncorrected, the same rows are out of band


def test_compare_counts_faster_slower_and_unmeasured():
    base = [{"kernel": "k1", "new_pick_us": 10.0, "best_measured_by_new_us": 10.0},
            {"kernel": "k2", "new_pick_us": 5.0, "best_measured_by_new_us": 5.0},
            {"kernel": "k3", "new_pick_us": 4.0, "best_measured_by_new_us": 4.0}]
    new = [{"kernel": "k1", "new_pick_us": 8.0, "best_measured_by_new_us": 8.0},
           {"kernel": "k2", "new_pick_us": 6.0, "best_measured_by_new_us": 6.0},
           {"kernel": "k3", "new_pick_us": None, "best_measured_by_new_us": 4.0}]
    c = fit_units.compare(base, new)
    assert (c["kernels"], c["better"], c["worse"], c["unmeasured"]) == (3, 1, 1, 1)
    assert (c["sum_base"], c["sum_new"]) == (15.0, 14.0)
    assert (c["timed_better"], c["timed_worse"], c["timed_sum_base"], c["timed_sum_new"]) == (1, 1, 19.0, 18.0)


@pytest.mark.parametrize("argv,said", [(["--models", "/nonexistent"], "lacks"),
                                       (["--models", "/tmp", "--units", "tensor"], "--units"),
                                       (["--models", "/tmp", "--profile", "no_such_gpu"], "")])
def test_bad_arguments_end_in_one_line(argv, said, capsys, tmp_path):
    if argv[-1] == "no_such_gpu":   # a folder with every model present, so that the profile is what fails
        for name, _ in fit_units.REPORTS:
            (tmp_path / f"{name}.onnx").write_bytes(b"")
        argv = ["--models", str(tmp_path), "--profile", "no_such_gpu"]
    assert fit_units.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("fit_units:") and said in err and "\n" not in err
