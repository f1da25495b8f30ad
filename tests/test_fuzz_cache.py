"""Concurrent and interrupted use of the cubin cache ([Note: cubin cache entry] in
aicfc/codegen/nvcc.py): entries are written whole (temp file + os.replace) and verified on
read, so a corrupt entry is rebuilt, never loaded. CPU only; needs nvcc."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from aicf_run.bundle import read_bundle
from aicfc.codegen import nvcc
from tests import onnx_builders as B

SOURCE = 'extern "C" __global__ void k(float* x) { x[threadIdx.x] *= 2.0f; }\n'


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "cache"
    monkeypatch.setenv("AICF_CACHE_DIR", str(folder))
    return folder / "cubin"


def _entries(cache: Path) -> list[Path]:
    return sorted(cache.glob("*.entry"))


def _all_valid(cache: Path) -> None:
    assert not [p.name for p in cache.iterdir() if not p.name.endswith(".entry")], "stray files"
    for entry in _entries(cache):
        assert nvcc.read_entry(entry) is not None, f"corrupt cache entry {entry.name}"


def test_entry_round_trip_and_cached(cache: Path) -> None:
    first = nvcc.build(SOURCE, "sm_80")
    second = nvcc.build(SOURCE, "sm_80")
    assert not first.cached and second.cached
    assert second.cubin == first.cubin and second.registers == first.registers == {"k": second.registers["k"]}
    [entry] = _entries(cache)
    _all_valid(cache)


@pytest.mark.parametrize("damage", ["truncate", "flip", "empty", "garbage_header"])
def test_corrupt_entry_is_rebuilt_not_loaded(cache: Path, damage: str) -> None:
    good = nvcc.build(SOURCE, "sm_80")
    [entry] = _entries(cache)
    data = entry.read_bytes()
    damaged = {"truncate": data[:-7], "flip": data[:-20] + bytes([data[-20] ^ 1]) + data[-19:],
               "empty": b"", "garbage_header": b"\xff\xff\xff\x7f" + data[4:]}[damage]
    entry.write_bytes(damaged)
    assert nvcc.read_entry(entry) is None
    again = nvcc.build(SOURCE, "sm_80")
    assert not again.cached and again.cubin == good.cubin
    assert nvcc.read_entry(entry) is not None   # rewritten whole


def test_interrupted_write_leaves_no_entry(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def interrupted(src: str, dst: str) -> None:
        raise KeyboardInterrupt
    monkeypatch.setattr(nvcc.os, "replace", interrupted)
    with pytest.raises(KeyboardInterrupt):
        nvcc.build(SOURCE, "sm_80")
    assert list(cache.iterdir()) == []          # neither an entry nor a temporary file
    monkeypatch.undo()
    assert not nvcc.build(SOURCE, "sm_80").cached


def _compile(model: Path, out: Path, env: dict[str, str]) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "aicfc", "compile", str(model), "-o", str(out),
                             "--no-register-check", "-j", "2"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.fixture
def model(tmp_path: Path) -> Path:
    return B.save(B.gelu_bias_model((4, 32)), tmp_path / "gelu.onnx")


def test_two_compiles_share_one_cache(cache: Path, model: Path, tmp_path: Path) -> None:
    env = {**os.environ, "AICF_CACHE_DIR": str(cache.parent)}
    runs = [_compile(model, tmp_path / f"{i}.aicf", env) for i in range(2)]
    for run in runs:
        _, err = run.communicate(timeout=600)
        assert run.returncode == 0, err
    bundles = [read_bundle(tmp_path / f"{i}.aicf") for i in range(2)]
    assert [m["cubin"] for m in bundles[0].modules] == [m["cubin"] for m in bundles[1].modules]
    _all_valid(cache)
    assert _entries(cache)


def test_killed_compile_leaves_no_corrupt_entry(cache: Path, model: Path, tmp_path: Path) -> None:
    # Kill compiles at several points of their run (SIGKILL: no cleanup runs); the cache holds
    # only whole entries, then a full compile reuses or rebuilds them.
    env = {**os.environ, "AICF_CACHE_DIR": str(cache.parent)}
    for delay in (0.5, 1.5, 3.0):
        run = _compile(model, tmp_path / "killed.aicf", env)
        time.sleep(delay)
        run.send_signal(signal.SIGKILL)
        run.communicate()
        if cache.exists():
            for entry in _entries(cache):
                assert nvcc.read_entry(entry) is not None, entry
        assert not (tmp_path / "killed.aicf").exists() or read_bundle(tmp_path / "killed.aicf")
    for stray in cache.glob(".*.tmp"):   # a killed writer's temporary file is never read
        stray.unlink()
    final = _compile(model, tmp_path / "final.aicf", env)
    _, err = final.communicate(timeout=600)
    assert final.returncode == 0, err
    read_bundle(tmp_path / "final.aicf")
    _all_valid(cache)


# --- executors and threads ([Note: executor threads] in aicf_run/executor.py) ---


def test_run_from_another_thread_is_refused(tmp_path: Path, fake_gpu) -> None:
    import threading

    import numpy as np

    from aicf_run.device import open_device
    from aicf_run.errors import RunError
    from aicf_run.executor import Executor
    from aicfc.artifact import write_bundle
    from tests.test_bundle_format import make_payload

    path = tmp_path / "add.aicf"
    write_bundle(make_payload(), path)
    device = open_device()
    try:
        executor = Executor(read_bundle(path), device)
        x = {"x": np.ones((2, 3), np.float32)}
        expected = executor.run(x)["y"]
        errors: list[BaseException] = []

        def worker() -> None:
            try:
                executor.run(x)
            except BaseException as err:   # noqa: BLE001: the test inspects it
                errors.append(err)
        thread = threading.Thread(target=worker)
        thread.start()
        thread.join()
        assert len(errors) == 1 and isinstance(errors[0], RunError)
        assert "loaded on another thread" in str(errors[0]) and "\n" not in str(errors[0])
        np.testing.assert_array_equal(executor.run(x)["y"], expected)   # still fine here
    finally:
        device.close()


@pytest.mark.gpu
def test_two_executors_and_threads_on_a_gpu(tmp_path: Path) -> None:
    # On a GPU: two executors sharing one device run in turn; a second load on the same thread
    # retains the device's primary context (aicf_run/device.py), so both executors keep running
    # in it; a thread that loads its own executor runs it.
    import threading

    import numpy as np

    import aicf_run
    from aicf_run.device import open_device
    from aicf_run.executor import Executor
    from aicfc.artifact import write_bundle
    from aicfc.driver import compile_model

    model = B.gelu_bias_model((4, 32))
    path = tmp_path / "gelu.aicf"
    write_bundle(compile_model(model, target=_gpu_arch(), check_registers=False), path)
    x = B.random_inputs(model, seed=1)
    [want] = B.run_onnxruntime(model, x).values()
    device = open_device()
    try:
        first, second = Executor(read_bundle(path), device), Executor(read_bundle(path), device)
        for executor in (first, second, first):
            [got] = executor.run(x).values()
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
        other = aicf_run.load(path)    # the same primary context, pushed again on this thread
        try:
            for executor in (first, other):
                [got] = executor.run(x).values()
                np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
        finally:
            other.device.close()
        [got] = first.run(x).values()     # still current after the second load's close
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
        results: list = []
        thread = threading.Thread(target=lambda: results.append(_load_and_run(path, x)))
        thread.start()
        thread.join()
        np.testing.assert_allclose(results[0], want, rtol=1e-4, atol=1e-5)
    finally:
        device.close()


def _gpu_arch() -> str:
    import pycuda.driver as cuda
    cuda.init()
    major, minor = cuda.Device(0).compute_capability()
    return f"sm_{major}{minor}"


def _load_and_run(path: Path, x: dict):
    import aicf_run
    executor = aicf_run.load(path)
    try:
        [got] = executor.run(x).values()
        return got
    finally:
        executor.device.close()
