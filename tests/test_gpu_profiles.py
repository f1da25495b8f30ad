"""Bundled GPU profiles (`--profile h200`): a target's profile with one GPU's own figures."""
from __future__ import annotations

import json

import pytest

from aicfc.errors import AicfError
from aicfc.planner.hardware import gpus, load_profile, targets


def test_h200_is_sm_90_with_its_memory():
    base, h200 = load_profile("sm_90"), load_profile("sm_90", "h200")
    assert "h200" in gpus() and "h200" not in targets()
    assert h200.dram_bandwidth_gbs == 4800 and base.dram_bandwidth_gbs == 3350
    assert "H200" in h200.name
    # everything else is the target's: the same die
    differ = {k for k in base.data if base.data[k] != h200.data[k]}
    assert differ == {"dram_bandwidth_gbs", "name"}
    assert "base" not in h200.data and "comment" not in h200.data


def test_gpu_profile_for_another_target_is_refused():
    with pytest.raises(AicfError, match=r"--profile h200 is an sm_90 GPU, but --target is sm_80; use --target sm_90"):
        load_profile("sm_80", "h200")


def test_a_file_of_that_name_wins(tmp_path, monkeypatch):
    data = dict(load_profile("sm_90").data, name="mine")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "h200").write_text(json.dumps(data))
    assert load_profile("sm_90", "h200").name == "mine"


def test_unknown_profile_names_the_bundled_ones(tmp_path):
    with pytest.raises(AicfError, match=r"--profile h900: cannot read .*a bundled GPU \(h200\)"):
        load_profile("sm_90", "h900")
