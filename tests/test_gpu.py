"""On the GPU: every op case and example compiled, run through aicf_run, compared with onnxruntime.

Inputs are fresh random normals; outputs are poisoned with NaN before each run (the executor
returns fresh arrays, and its arena is filled with NaN bytes first), so an unwritten element
fails. fp32 tolerance: max|y - ref| / max|ref| <= 1e-4.
"""
from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

import aicfc
from tests import onnx_builders as B
from tests.conftest import run_payload
from tests.test_pipeline import CASES, rel_err

pytestmark = pytest.mark.gpu
FP32_RTOL = 1e-4


@pytest.fixture(scope="module")
def device_arch(gpu_device):
    return gpu_device.arch


@pytest.fixture
def run(gpu_device):
    return lambda payload, inputs: run_payload(payload, inputs, gpu_device)


@pytest.mark.parametrize("case_id,build", CASES, ids=[c for c, _ in CASES])
def test_case_matches_onnxruntime(case_id, build, device_arch, run):
    model = build()
    payload = aicfc.compile(model, target=device_arch)
    for seed in (1, 2):
        inputs = B.random_inputs(model, seed=seed + hash(case_id) % 997)
        ref = B.run_onnxruntime(model, inputs)
        got = run(payload, inputs)
        for name, r in ref.items():
            err = rel_err(got[name], r)
            assert err <= FP32_RTOL, f"{case_id}: {name} rel err {err:.2e}"


@pytest.mark.parametrize("shape", [(7, 100, 257), (1, 1, 1), (3, 5, 33), (2, 64, 4096)])
def test_softmax_and_pointwise_odd_shapes(shape, device_arch, run):
    for model in (B.single_op_model("Softmax", [shape], {"axis": -1}),
                  B.single_op_model("Softmax", [shape], {"axis": 1}),
                  B.single_op_model("Tanh", [shape])):
        payload = aicfc.compile(model, target=device_arch)
        inputs = B.random_inputs(model, seed=7)
        ref = B.run_onnxruntime(model, inputs)
        got = run(payload, inputs)
        assert rel_err(got["out"], ref["out"]) <= FP32_RTOL


@pytest.mark.parametrize("m,k,n", [(7, 100, 257), (1, 1, 1), (129, 65, 33), (256, 512, 384)])
def test_matmul_odd_shapes(m, k, n, device_arch, run):
    rng = np.random.default_rng(m * k * n)
    w = rng.standard_normal((k, n)).astype(np.float32)
    model = B.single_op_model("MatMul", [(3, m, k), None], initializers={"in1": w})
    payload = aicfc.compile(model, target=device_arch)
    inputs = B.random_inputs(model, seed=3)
    ref = B.run_onnxruntime(model, inputs)
    got = run(payload, inputs)
    assert rel_err(got["out"], ref["out"]) <= FP32_RTOL


def test_cli_end_to_end(tmp_path, device_arch):
    import examples.build_examples as ex
    ex.main(["--out-dir", str(tmp_path)])
    for name in ("mlp", "block"):
        bundle = tmp_path / f"{name}.aicf"
        subprocess.run([sys.executable, "-m", "aicfc", "compile", str(tmp_path / f"{name}.onnx"), "-o", str(bundle),
                        "--target", device_arch], check=True)
        out = subprocess.run([sys.executable, "-m", "aicf_run", str(bundle), "--input", str(tmp_path / f"{name}_x.npy"),
                              "--output-dir", str(tmp_path / name), "--check", str(tmp_path / f"{name}.onnx")],
                             capture_output=True, text=True)
        assert out.returncode == 0, out.stderr
        assert "PASS" in out.stdout
        y = np.load(tmp_path / name / "y.npy")
        assert np.isfinite(y).all()


def test_wrong_arch_is_refused(tmp_path, device_arch):
    other = "sm_80" if device_arch != "sm_80" else "sm_90"
    model = B.single_op_model("Relu", [(3, 5)])
    path = B.save(model, tmp_path / "relu.onnx")
    bundle = tmp_path / "relu.aicf"
    subprocess.run([sys.executable, "-m", "aicfc", "compile", str(path), "-o", str(bundle), "--target", other, "-q"],
                   check=True)
    np.save(tmp_path / "x.npy", np.ones((3, 5), np.float32))
    out = subprocess.run([sys.executable, "-m", "aicf_run", str(bundle), "--input", str(tmp_path / "x.npy")],
                         capture_output=True, text=True)
    assert out.returncode == 2
    assert len(out.stderr.strip().splitlines()) == 1 and other in out.stderr
