"""[Note: GPU tests compiled without a GPU] in tests/conftest.py: the mode itself, run in a pytest of its own on this
machine (it refuses a machine where PyCUDA imports, so these skip there)."""
from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import COMPILE_ONLY

ROOT = Path(__file__).resolve().parents[1]

# (under the mode itself PyCUDA is its stand-in, which find_spec cannot read: these run the mode from outside)
pytestmark = pytest.mark.skipif(COMPILE_ONLY or importlib.util.find_spec("pycuda") is not None,
                                reason="the compile-only mode is for a machine without PyCUDA, run from outside it")


def _pytest(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    env = {**os.environ, "AICF_GPU_COMPILE_ONLY": "1", "PYTHONPATH": str(ROOT)}
    env.pop("PYTEST_XDIST_WORKER", None)
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", *args], cwd=cwd,
                          env=env, capture_output=True, text=True, timeout=300)


def test_a_gpu_test_compiles_then_skips_where_it_reaches_the_gpu():
    r = _pytest("tests/test_gemv_kmajor.py::test_k_major_gemv_matches_numpy[K2048N3072-BN2W4KS2U2-fp16]")
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert "1 skipped" in r.stdout and "compile-only: reached the GPU (device.driver)" in r.stdout


def test_a_gpu_test_whose_plan_cannot_be_built_fails(tmp_path):
    """What the mode is for: a plan the compiler refuses fails before the GPU (here a pin no candidate has), and a
    test that imports PyCUDA itself skips at its first use of it."""
    (tmp_path / "test_inner.py").write_text(
        "import numpy as np\n"
        "import pytest\n"
        "import aicfc\n"
        "from tests.test_gemv import rows_model\n\n"
        "@pytest.mark.gpu\n"
        "def test_refused(gpu_device):\n"
        "    aicfc.compile(rows_model(2, 256, 256, np.random.default_rng(0)), target=gpu_device.arch,\n"
        "                  precision='fp16', pin={'TC': '7'})\n\n"
        "@pytest.mark.gpu\n"
        "def test_driver():\n"
        "    import pycuda.driver as cuda\n"
        "    cuda.init()\n")
    r = _pytest("-p", "tests.conftest", str(tmp_path / "test_inner.py"), cwd=tmp_path)
    assert r.returncode == 1, r.stdout[-2000:] + r.stderr[-2000:]
    assert "1 failed, 1 skipped" in r.stdout and "no feasible gemm candidate matches --pin TC=7" in r.stdout
    assert "compile-only: reached the GPU (pycuda.driver.init)" in r.stdout
