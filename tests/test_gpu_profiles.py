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
    differ = {k for k in base.data.keys() | h200.data.keys() if base.data.get(k) != h200.data.get(k)}
    # fitted on an H200 (cluster_lockstep in session 38, where the pair's tensor work bounds it too: [Note: a cluster
    # pair in lockstep]; l2_total_gbs under ncu in session 41: [Note: the L2's whole traffic]); the H100's cap on
    # im2col k-blocks in flight (session 79: [Note: im2col boxes in flight]) left off
    assert differ == {"dram_bandwidth_gbs", "name", "launch_overhead_us", "cluster_pace", "cluster_lockstep_compute",
                      "l2_total_gbs", "im2col_in_flight"}
    assert "base" not in h200.data and "comment" not in h200.data


def test_gpu_profile_for_another_target_is_refused():
    with pytest.raises(AicfError, match=r"--profile h200 is an sm_90 GPU, but --target is sm_80; use --target sm_90"):
        load_profile("sm_80", "h200")


def test_a_file_of_that_name_wins(tmp_path, monkeypatch):
    data = dict(load_profile("sm_90").data, name="mine")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "h200").write_text(json.dumps(data))
    assert load_profile("sm_90", "h200").name == "mine"


def test_a_gpu_file_given_by_path_or_copied_overlays_its_base(tmp_path):
    """`aicfc tune --profile aicfc/profiles/gpus/h200.json` (or an edited copy) reads as `--profile h200`:
    its figures over its base target's."""
    from importlib import resources
    bundled = resources.files("aicfc").joinpath("profiles", "gpus", "h200.json")
    assert load_profile("sm_90", str(bundled)).data == load_profile("sm_90", "h200").data
    mine = dict(json.loads(bundled.read_text()), dram_bandwidth_gbs=4500)
    (tmp_path / "mine.json").write_text(json.dumps(mine))
    assert load_profile("sm_90", str(tmp_path / "mine.json")).dram_bandwidth_gbs == 4500
    (tmp_path / "bad.json").write_text(json.dumps(dict(mine, base="sm_99")))
    with pytest.raises(AicfError, match=r"base 'sm_99' is not a target"):
        load_profile("sm_90", str(tmp_path / "bad.json"))


def test_unknown_profile_names_the_bundled_ones(tmp_path):
    with pytest.raises(AicfError, match=r"--profile h900: cannot read .*a bundled GPU \(h200\)"):
        load_profile("sm_90", "h900")


@pytest.mark.parametrize("text,message", [
    ("[]", "not a hardware profile"),
    ('"sm_90"', "not a hardware profile"),
    ("{", "cannot read a JSON hardware profile"),
])
def test_a_file_that_is_not_a_profile_is_one_line(tmp_path, text, message):
    f = tmp_path / "p.json"
    f.write_text(text)
    with pytest.raises(AicfError, match=message):
        load_profile("sm_90", f)


@pytest.mark.parametrize("key,value,message", [
    ("sm_count", "many", r'sm_count is "many", not a positive number'),
    ("dram_bandwidth_gbs", 0, "dram_bandwidth_gbs is 0, not a positive number"),
    ("l2_bandwidth_gbs", True, "l2_bandwidth_gbs is true, not a positive number"),
    ("efficiency", None, "efficiency must map names to positive numbers"),
    ("peak_tflops", {"fp16_tc": "fast"}, "peak_tflops must map names to positive numbers"),
    ("arch", 90, "arch is int, not a string"),
])
def test_a_profile_with_a_bad_figure_is_refused_by_name(tmp_path, key, value, message):
    data = dict(load_profile("sm_90").data, **{key: value})
    f = tmp_path / "p.json"
    f.write_text(json.dumps(data))
    with pytest.raises(AicfError, match=message):
        load_profile("sm_90", f)


def test_an_oversized_profile_is_not_read(tmp_path, monkeypatch):
    import aicfc.planner.hardware as H
    monkeypatch.setattr(H, "MAX_PROFILE_BYTES", 100)
    f = tmp_path / "p.json"
    f.write_text(json.dumps(load_profile("sm_90").data))
    with pytest.raises(AicfError, match="over 100"):
        load_profile("sm_90", f)


def test_every_bundled_profile_loads():
    from aicfc.planner.hardware import targets
    for t in targets():
        assert load_profile(t).arch == t


def test_cli_bad_profile_exits_2_with_one_line(tmp_path):
    from click.testing import CliRunner
    from aicfc.cli import main
    from tests import onnx_builders as B
    model = B.save(B.single_op_model("Relu", [(4, 8)]), tmp_path / "relu.onnx")
    f = tmp_path / "p.json"
    f.write_text(json.dumps(dict(load_profile("sm_90").data, efficiency=None)))
    out = tmp_path / "m.aicf"
    r = CliRunner().invoke(main, ["compile", str(model), "-o", str(out), "--profile", str(f)])
    assert r.exit_code == 2 and not out.exists()
    assert len(r.output.strip().splitlines()) == 1 and "efficiency" in r.output


@pytest.mark.parametrize("key", ["sm_l2_port_gbs", "sm_ingress_gbs"])
@pytest.mark.parametrize("value", ["fast", -5, 0, None])
def test_an_optional_rate_that_is_no_positive_number_is_one_line(tmp_path, key, value):
    """The rates a profile may add are read as numbers by the cost terms: a bad one is refused at load,
    naming it, not a TypeError while planning."""
    from importlib import resources
    bundled = json.loads(resources.files("aicfc").joinpath("profiles", "gpus", "h200.json").read_text())
    (tmp_path / "p.json").write_text(json.dumps(dict(bundled, **{key: value})))
    with pytest.raises(AicfError, match=rf"{key} is .*not a positive number"):
        load_profile("sm_90", str(tmp_path / "p.json"))
