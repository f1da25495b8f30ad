"""benchmarks/plan_ab.py on the fake GPU of tests/test_run_cli.py (its virtual clock makes every replay take
GRAPH_LAUNCH_US + KERNEL_US): the medians and ratios on stdout, and on stderr a line as each step ends (a bundle
loaded, its first run, each round), so that a run a time limit cuts short still says how far it got."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from benchmarks import plan_ab
from tests.test_run_cli import GRAPH_LAUNCH_US, KERNEL_US, FakeDriver


def test_plan_ab_reports_each_step_as_it_ends(bundle_path: Path, fake_gpu: FakeDriver,
                                              capsys: pytest.CaptureFixture) -> None:
    assert plan_ab.main([f"a={bundle_path}", f"b={bundle_path}", "--rounds", "2", "--replays", "3"]) == 0
    out, err = capsys.readouterr()
    replay = GRAPH_LAUNCH_US + KERNEL_US
    for name in ("a", "b"):
        assert re.search(rf"^{name} +plan replay median +{replay:.1f} us +\(1\.000x of a\)", out, re.M), out
        assert "outputs vs a: 0.0e+00" in out
    steps = [re.sub(r"^\[plan_ab +[\d.]+ s\] ", "", line) for line in err.splitlines() if line.startswith("[plan_ab")]
    assert steps == ["loading a", "loading b", "first run of a", "first run of b",
                     f"round 1: a {replay:.1f} us  b {replay:.1f} us", f"round 2: a {replay:.1f} us  b {replay:.1f} us"]
