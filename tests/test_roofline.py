"""`aicfc explain --roofline`: one point per kernel on the target's roofline, written atomically."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from aicfc.errors import AicfError
from aicfc.roofline import Point, plot_roofline, points_from_payload

pytest.importorskip("matplotlib")

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
FAKE_PROFILE = {"arch": "sm_00", "name": "a made-up GPU", "dram_bandwidth_gbs": 1000,
                "peak_tflops": {"fp32_simt": 10.0, "tf32_tc": 80.0, "fp16_tc": 160.0, "bf16_tc": 160.0}}


def aicfc(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "aicfc", *args], capture_output=True, text=True)


@pytest.fixture(scope="module")
def block_bundle(tmp_path_factory) -> Path:
    import examples.build_examples as ex
    folder = tmp_path_factory.mktemp("examples")
    ex.main(["--out-dir", str(folder)])
    out = folder / "block.aicf"
    res = aicfc("compile", str(folder / "block.onnx"), "-o", str(out), "-q")
    assert res.returncode == 0, res.stderr
    return out


def test_explain_roofline_png(block_bundle: Path, tmp_path: Path):
    png = tmp_path / "out.png"
    res = aicfc("explain", str(block_bundle), "--roofline", str(png))
    assert res.returncode == 0, res.stderr
    assert png.read_bytes().startswith(PNG_MAGIC)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.png"], "no temporary file left behind"
    kernels = json.loads(aicfc("explain", "--json", str(block_bundle)).stdout)["kernels"]
    assert res.stderr.strip() == f"wrote {png}: {len(kernels)} kernel(s) on the sm_90 roofline"
    assert "it beat" in res.stdout, "the explain text still follows"


def test_points_match_kernels(block_bundle: Path, tmp_path: Path):
    from aicf_run.bundle import read_bundle
    payload = read_bundle(block_bundle).payload
    points = points_from_payload(payload)
    assert [p.label for p in points] == [k["name"] for k in payload["kernels"]]
    plotted = plot_roofline(payload["target"]["profile"], points, tmp_path / "r.svg", "block")
    assert plotted == points
    assert b"<svg" in (tmp_path / "r.svg").read_bytes()[:1000]


def test_roofline_with_json_keeps_stdout_clean(block_bundle: Path, tmp_path: Path):
    res = aicfc("explain", "--json", str(block_bundle), "--roofline", str(tmp_path / "r.pdf"))
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["kernels"]
    assert (tmp_path / "r.pdf").read_bytes().startswith(b"%PDF")


@pytest.mark.parametrize("name", ["out.jpg", "out"])
def test_bad_suffix_is_a_user_error(block_bundle: Path, tmp_path: Path, name: str):
    res = aicfc("explain", str(block_bundle), "--roofline", str(tmp_path / name))
    assert res.returncode == 2, res.stdout + res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("aicfc: error:") and ".png" in lines[0], res.stderr
    assert res.stdout == "" and list(tmp_path.iterdir()) == []


def test_missing_folder_is_a_user_error(block_bundle: Path, tmp_path: Path):
    res = aicfc("explain", str(block_bundle), "--roofline", str(tmp_path / "nope" / "r.png"))
    assert res.returncode == 2
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("aicfc: error:") and "nope" in lines[0], res.stderr


def test_predicted_and_measured_points(tmp_path: Path):
    points = [
        Point("gemm", 2e9, 1e7, 50.0, "predicted"),
        Point("gemm", 2e9, 1.2e7, 80.0, "measured"),
        Point("relu", 1e6, 8e6, 10.0, "predicted"),
        Point("relu", 1e6, 8e6, 12.0, "measured"),
        Point("only_measured", 1e8, 1e6, 30.0, "measured"),
        Point("empty", 0.0, 0.0, 1.0, "predicted"),
    ]
    plotted = plot_roofline(FAKE_PROFILE, points, tmp_path / "r.png", None)
    assert plotted == points[:-1], "a point without bytes has no place on log axes"
    assert (tmp_path / "r.png").read_bytes().startswith(PNG_MAGIC)


def test_points_from_payload_skips_empty_kernels():
    payload = {"kernels": [
        {"name": "a", "predicted": {"flops": 100.0, "bytes": 50.0, "time_us": 1.0}},
        {"name": "no_bytes", "predicted": {"flops": 100.0, "bytes": 0.0, "time_us": 1.0}},
        {"name": "no_time", "predicted": {"flops": 100.0, "bytes": 50.0, "time_us": 0.0}},
    ]}
    [p] = points_from_payload(payload)
    assert (p.label, p.kind, p.intensity, p.tflops) == ("a", "predicted", 2.0, 1e-4)


def test_plot_roofline_refuses_bad_suffix_and_kind(tmp_path: Path):
    with pytest.raises(AicfError, match=r"\.png, \.svg or \.pdf"):
        plot_roofline(FAKE_PROFILE, [], tmp_path / "r.gif")
    with pytest.raises(ValueError):
        Point("k", 1.0, 1.0, 1.0, "guessed")


def test_missing_matplotlib_is_a_user_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    # A None entry in sys.modules makes the import raise ImportError, as if not installed.
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)
    with pytest.raises(AicfError, match=r"pip install 'aicf\[plot\]'"):
        plot_roofline(FAKE_PROFILE, [], tmp_path / "r.png")
    assert list(tmp_path.iterdir()) == []
