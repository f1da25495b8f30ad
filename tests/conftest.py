"""Shared fixtures. GPU tests are marked `gpu` and skip cleanly where PyCUDA or a GPU is missing, or run up to the
GPU under AICF_GPU_COMPILE_ONLY=1 ([Note: GPU tests compiled without a GPU])."""
from __future__ import annotations

import functools
import importlib.util
import os
import sys
import types
from pathlib import Path

import numpy as np
import pytest

# [Note: GPU tests compiled without a GPU]
# Most GPU tests compile a plan and then run it; the compile is the CPU's work, and a plan the compiler cannot build
# fails there. Session 69 made K-major weights the default at 2-8 rows, and `--pin TC=0` at two rows then had no
# candidate: only an H100 found it, three sessions later (the device is lent rarely). With AICF_GPU_COMPILE_ONLY=1
# on a machine without PyCUDA, GPU tests are collected as if a GPU were there: `gpu_device` is a stand-in of arch
# sm_90 (AICF_GPU_ARCH to change it), and PyCUDA a stand-in module; the first use of either (an executor's
# allocation, a launch, `cuda.init()`) skips the test as "compile-only", so what passes or skips got through
# everything before the GPU, and what fails failed there (a test that runs `aicf-run` in a subprocess, or loads the
# driver library through ctypes, skips on aicf_run's error for the missing GPU: GPU_ERRORS). `make gpu-compile FILES=...`; not part of `make test`: the 631 GPU tests of the 21 files
# that compile decoders, gemvs and SwiGLUs took 10 minutes on two CPUs, the conformance suite's 784 six.
COMPILE_ONLY = os.environ.get("AICF_GPU_COMPILE_ONLY") == "1"


def _reached_gpu(what: str):
    pytest.skip(f"compile-only: reached the GPU ({what})")


class _GpuStandIn(types.ModuleType):
    """PyCUDA under AICF_GPU_COMPILE_ONLY=1: any attribute skips the test that asks for it."""

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        _reached_gpu(f"{self.__name__}.{name}")


class _DeviceStandIn:
    """`gpu_device` under AICF_GPU_COMPILE_ONLY=1: its arch for the compile; anything else skips."""
    arch = os.environ.get("AICF_GPU_ARCH", "sm_90")
    name = "compile-only stand-in"

    def __getattr__(self, name: str):
        _reached_gpu(f"device.{name}")

    def close(self) -> None:
        pass


def _stand_in_pycuda() -> None:
    top = sys.modules["pycuda"] = _GpuStandIn("pycuda")
    for name in ("driver", "gpuarray", "compiler"):
        setattr(top, name, _GpuStandIn(f"pycuda.{name}"))
        sys.modules[f"pycuda.{name}"] = getattr(top, name)


@functools.cache
def gpu_available() -> str | None:
    """None when a GPU can be used (or stood in for: AICF_GPU_COMPILE_ONLY=1), else the reason it cannot."""
    if COMPILE_ONLY:
        return None
    try:
        import pycuda.driver as cuda
        cuda.init()
        if cuda.Device.count() < 1:
            return "no CUDA device"
    except Exception as e:  # ImportError, or the driver's own error
        return f"no usable GPU ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})"
    return None


def pytest_configure(config):
    if COMPILE_ONLY:
        if importlib.util.find_spec("pycuda") is not None:
            raise pytest.UsageError("AICF_GPU_COMPILE_ONLY=1 is for a machine without PyCUDA: here the GPU tests can run")
        _stand_in_pycuda()


# aicf_run's errors where the GPU is missing and no stand-in answers (aicf_run/device.py, aicf_run/graph.py)
GPU_ERRORS = ("PyCUDA is not installed", "cannot load the CUDA driver library")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """Under AICF_GPU_COMPILE_ONLY=1 a GPU test that reaches the GPU where no stand-in is (`aicf-run` in a process of
    its own, the driver library through ctypes for CUDA graphs) fails with aicf_run's one-line error for it: that
    error is the test's compile-only skip."""
    outcome = yield
    report = outcome.get_result()
    if COMPILE_ONLY and report.when == "call" and report.failed:
        reached = next((why for why in GPU_ERRORS if why in str(report.longrepr)), None)
        if reached:
            report.outcome = "skipped"
            report.longrepr = (str(item.path), item.location[1] or 0, f"compile-only: reached the GPU ({reached})")


def pytest_collection_modifyitems(config, items):
    for item in items:
        if "gpu" in item.keywords:
            reason = gpu_available()
            if reason:
                item.add_marker(pytest.mark.skip(reason=reason))


@pytest.fixture(autouse=True, scope="session")
def _private_cache(tmp_path_factory):
    """Keep the cubin cache of a test run out of the user's home. Under `pytest -n` the workers share
    one (the folder above each worker's own): a module one worker built is not built again by the
    others ([Note: cubin cache entry] in aicfc/codegen/nvcc.py: writers rename whole entries). And the
    workers fill the CPUs, so each compiles a plan as one module (AICF_JOBS=1): nvcc's front end costs
    about 0.8 s a module whatever it holds (cuda_runtime.h and the fp16/bf16 headers), a plan cut in
    one module per CPU paid it that many times."""
    base = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        shared = base.parent / "aicf-cache"
        shared.mkdir(exist_ok=True)
        os.environ.setdefault("AICF_CACHE_DIR", str(shared))
        os.environ.setdefault("AICF_JOBS", "1")
    else:
        os.environ.setdefault("AICF_CACHE_DIR", str(tmp_path_factory.mktemp("aicf-cache")))


@pytest.fixture(autouse=True)
def _rankings_of_this_test(request):
    """A test that patches a module or the environment plans with its own rankings: the planner keeps the
    latest across compiles of one process ([Note: rankings remembered] in aicfc/passes/plan_schedules.py),
    which a patched cost term or space must not meet (before and after such a test)."""
    patched = "monkeypatch" in request.fixturenames
    if patched:
        from aicfc.passes.plan_schedules import forget_rankings
        forget_rankings()
    yield
    if patched:   # nor does the next test meet the rankings made under this one's patches
        forget_rankings()


@pytest.fixture
def fake_gpu(monkeypatch):
    """A fake PyCUDA and libcuda (tests/test_run_cli.py) with a virtual clock: no GPU needed."""
    from tests.test_run_cli import FakeDriver, install_fake_gpu
    return install_fake_gpu(monkeypatch, FakeDriver())


@pytest.fixture
def no_pycuda(monkeypatch) -> None:
    # None in sys.modules makes `import pycuda.driver` raise ModuleNotFoundError.
    import sys
    monkeypatch.setitem(sys.modules, "pycuda", None)
    monkeypatch.setitem(sys.modules, "pycuda.driver", None)


@pytest.fixture(scope="session")
def gpu_device():
    """One CUDA context for the whole session; executors are created and freed per case (a stand-in under
    AICF_GPU_COMPILE_ONLY=1)."""
    if COMPILE_ONLY:
        yield _DeviceStandIn()
        return
    from aicf_run.device import open_device
    dev = open_device(0)
    yield dev
    dev.close()


def gpu_alone() -> bool:
    """Whether this process has the GPU to itself, so that the device-wide free memory measures
    only its own allocations; not so under `pytest -n`, where other workers allocate too."""
    return not os.environ.get("PYTEST_XDIST_WORKER")


def run_payload(payload: dict, inputs: dict, device, poison: bool = True) -> dict:
    """Run a compiled payload once on `device` (arena poisoned with NaN first); free it after."""
    from aicf_run.bundle import Bundle
    from aicf_run.executor import Executor
    ex = Executor(Bundle.from_payload(payload), device)
    try:
        if poison:
            ex.poison()
        return ex.run(inputs)
    finally:
        ex.close()


def run_replayed(payload: dict, inputs: dict, device, replays: int = 200) -> tuple[dict, dict]:
    """Run a compiled payload on `device` (arena poisoned first), replay its graph `replays` times back to back,
    run it again: (the first outputs, the last). A race between its kernels shows as a difference."""
    from aicf_run.bundle import Bundle
    from aicf_run.executor import Executor
    ex = Executor(Bundle.from_payload(payload), device)
    try:
        ex.poison()
        first = ex.run(inputs)
        for _ in range(replays):
            ex.launch()
        return first, ex.run(inputs)
    finally:
        ex.close()


GOLDEN = os.path.join(os.path.dirname(__file__), "golden")


def check_golden(name: str, text: str) -> None:
    """Compare `text` with tests/golden/<name>; `make golden` (AICF_UPDATE_GOLDEN=1) rewrites it."""
    path = os.path.join(GOLDEN, name)
    if os.environ.get("AICF_UPDATE_GOLDEN"):
        os.makedirs(GOLDEN, exist_ok=True)
        with open(path, "w") as f:
            f.write(text)
    assert os.path.exists(path), f"{path} missing: run `make golden`"
    with open(path) as f:
        assert text == f.read(), f"{name} differs from the golden text (`make golden` after checking the diff)"


@pytest.fixture
def bundle_path(tmp_path: Path) -> Path:
    """The fake bundle of tests/test_run_cli.py: y = x + w by one "add" kernel."""
    from aicfc.artifact import write_bundle
    from tests.test_bundle_format import make_payload
    path = tmp_path / "model.aicf"
    write_bundle(make_payload(), path)
    return path


@pytest.fixture
def x_npy(tmp_path: Path) -> Path:
    """That bundle's input, tests.test_run_cli.X, as an .npy file."""
    from tests.test_run_cli import X
    np.save(tmp_path / "x.npy", X)
    return tmp_path / "x.npy"
