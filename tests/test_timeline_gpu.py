"""On the GPU: a plan compiled with --timeline computes what the plain one does, bit for bit, and
its stamps describe a chain ([Note: timeline] in aicfc/codegen/timeline.py)."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

import aicfc
from tests.conftest import run_payload

pytestmark = pytest.mark.gpu
EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "encoder.onnx"


@pytest.fixture(scope="module")
def encoder() -> Path:
    if not EXAMPLE.exists():
        from examples.build_examples import main as build
        build([])
    return EXAMPLE


@pytest.mark.parametrize("pdl", [True, False])
def test_timeline_plan_matches_and_chains(encoder, pdl, gpu_device):
    from aicf_run.bundle import Bundle
    from aicf_run.executor import Executor
    plain = aicfc.compile(str(encoder), target=gpu_device.arch, precision="fp16", dependent_launch=pdl)
    stamped = aicfc.compile(str(encoder), target=gpu_device.arch, precision="fp16", dependent_launch=pdl,
                            timeline=True)
    x = np.load(str(EXAMPLE.with_name("encoder_x.npy")))
    name = plain["inputs"][0]["name"]
    want = run_payload(plain, {name: x}, gpu_device)
    got = run_payload(stamped, {name: x}, gpu_device)
    assert want.keys() == got.keys()
    for key in want:
        assert not np.isnan(got[key]).any() and np.array_equal(got[key], want[key]), key
    ex = Executor(Bundle.from_payload(stamped), gpu_device)
    try:
        ex.run({name: x})
        report = ex.timeline(rounds=3)
    finally:
        ex.close()
    kernels = report.kernels
    assert len(kernels) == len(stamped["kernels"]) and report.rounds == 3
    assert kernels[0].go_us == 0.0
    for k in kernels:
        assert k.reached == k.blocks == min(4096, int(np.prod(stamped["kernels"][k.index]["grid"])))
        assert k.first_landed_us <= k.last_landed_us
        if k.blocks == int(np.prod(stamped["kernels"][k.index]["grid"])):
            assert k.done_us is not None and k.done_us >= k.go_us
        assert 0 <= k.early <= k.reached
    for a, b in zip(kernels, kernels[1:]):
        assert b.go_us >= a.go_us and a.chain_us == pytest.approx(b.go_us - a.go_us, abs=0.2)
        assert 0 < a.chain_us < 1000
    if not pdl:
        # plain launches: a kernel's blocks are placed only once the one before has completed
        assert all(k.early == 0 for k in kernels)


def test_cli_timeline_json(encoder, gpu_device, tmp_path):
    from aicf_run.cli import main
    from aicfc.artifact import write_bundle
    path = tmp_path / "encoder.aicf"
    write_bundle(aicfc.compile(str(encoder), target=gpu_device.arch, precision="fp16", timeline=True), path)
    result = CliRunner().invoke(main, ["run", str(path), "--timeline", "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert len(report["timeline"]["kernels"]) > 1
    svg = tmp_path / "encoder.svg"
    text = CliRunner().invoke(main, ["run", str(path), "--timeline", "--timeline-svg", str(svg)])
    assert text.exit_code == 0 and "in chain" in text.output
    assert svg.read_text().count('fill="#08519c"') == len(report["timeline"]["kernels"])
