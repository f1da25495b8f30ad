"""aicf_run.graph: CUDA graph capture and replay through ctypes on the driver API.

Without a GPU, the library is `FakeLibcuda` (tests/test_run_cli.py) on the fake GPU: a
capture collects the fake launches and a replay runs them, so capture, replay, cleanup and the
mapping of every CUresult to a one-line RunError are checked exactly. On a GPU (marked `gpu`),
a tiny kernel built with nvcc is captured, replayed and compared with plain launches.
"""

from __future__ import annotations

import ctypes
import gc
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import aicf_run.graph
from aicf_run.errors import RunError
from aicf_run.graph import Graph, error_name
from tests.test_run_cli import X, FakeDriver, FakeFunction, install_fake_gpu


@pytest.fixture
def driver(monkeypatch: pytest.MonkeyPatch) -> FakeDriver:
    return install_fake_gpu(monkeypatch, FakeDriver())


def _plan(driver: FakeDriver) -> tuple[Any, Any, int, int]:
    """A stream and a two-launch plan on it: y = x + x, then x = y + x (x becomes 3x)."""
    x, y = int(driver.mem_alloc(24)), int(driver.mem_alloc(24))
    driver.memcpy_htod(x, X)
    add = FakeFunction(driver, "add").prepare("PPP")
    stream = driver.Stream()

    def enqueue() -> None:
        add.prepared_async_call((1, 1, 1), (6, 1, 1), stream, x, x, y)
        add.prepared_async_call((1, 1, 1), (6, 1, 1), stream, y, x, x)
    return stream, enqueue, x, y


def _read(driver: FakeDriver, pointer: int) -> np.ndarray:
    return np.frombuffer(driver.read(pointer, 24), dtype=np.float32).reshape(2, 3)


def test_capture_then_replay_equals_plain_launches(driver: FakeDriver) -> None:
    stream, enqueue, x, y = _plan(driver)
    graph = Graph.capture(stream, enqueue)
    assert driver.launches == [], "capturing runs nothing"
    graph.upload(stream)
    graph.launch(stream)
    graph.launch(stream)
    assert len(driver.launches) == 4
    np.testing.assert_array_equal(_read(driver, x), 9 * X)
    np.testing.assert_array_equal(_read(driver, y), 6 * X)

    plain_stream, plain, px, py = _plan(driver)
    plain()
    plain()
    assert _read(driver, px).tobytes() == _read(driver, x).tobytes()
    graph.close()
    graph.close()   # twice is fine
    assert driver.libcuda.graphs == driver.libcuda.execs == {}
    with pytest.raises(RunError, match="this CUDA graph is destroyed"):
        graph.launch(stream)


@pytest.mark.parametrize("call,code,name", [
    ("cuGraphLaunch", 700, "CUDA_ERROR_ILLEGAL_ADDRESS"),
    ("cuGraphUpload", 1, "CUDA_ERROR_INVALID_VALUE"),
    ("cuGraphLaunch", 12345, "CUresult 12345"),   # a code cuGetErrorName does not know
])
def test_every_error_is_one_line_naming_the_call(driver: FakeDriver, call: str, code: int,
                                                 name: str) -> None:
    stream, enqueue, _, _ = _plan(driver)
    graph = Graph.capture(stream, enqueue)
    driver.libcuda.fail[call] = code
    with pytest.raises(RunError) as info:
        graph.upload(stream) if call == "cuGraphUpload" else graph.launch(stream)
    message = str(info.value)
    assert message == (f"{call} failed: {name} ({code}); run without a CUDA graph "
                       f"(aicf-run --no-graph, or graph=False)")
    assert "\n" not in message


def test_begin_capture_failure(driver: FakeDriver) -> None:
    stream, enqueue, _, _ = _plan(driver)
    driver.libcuda.fail["cuStreamBeginCapture_v2"] = 900
    with pytest.raises(RunError, match=r"^cuStreamBeginCapture_v2 failed: "
                                       r"CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED \(900\)"):
        Graph.capture(stream, enqueue)
    assert driver.launches == [] and driver.libcuda.calls == ["cuStreamBeginCapture_v2"]


def test_invalidated_capture_fails_at_end_capture(driver: FakeDriver) -> None:
    stream, enqueue, _, _ = _plan(driver)
    driver.libcuda.fail["cuStreamEndCapture"] = 901
    with pytest.raises(RunError, match=r"^cuStreamEndCapture failed: "
                                       r"CUDA_ERROR_STREAM_CAPTURE_INVALIDATED \(901\)"):
        Graph.capture(stream, enqueue)
    assert stream.captured is None, "the capture is over; the stream is usable again"


def test_enqueue_error_ends_the_capture_and_propagates(driver: FakeDriver) -> None:
    stream, enqueue, _, _ = _plan(driver)

    def broken() -> None:
        enqueue()
        raise ValueError("a launch failed")
    with pytest.raises(ValueError, match="a launch failed"):
        Graph.capture(stream, broken)
    assert stream.captured is None
    assert driver.libcuda.graphs == {}, "the partial graph is destroyed"
    assert gc.isenabled(), "the collector is back on after the capture"
    assert driver.launches == []


def test_instantiate_failure_destroys_the_graph(driver: FakeDriver) -> None:
    stream, enqueue, _, _ = _plan(driver)
    driver.libcuda.fail["cuGraphInstantiateWithFlags"] = 1
    with pytest.raises(RunError, match="cuGraphInstantiateWithFlags failed"):
        Graph.capture(stream, enqueue)
    assert driver.libcuda.graphs == {}


def test_old_driver_fallbacks(driver: FakeDriver) -> None:
    """Before CUDA 11.4 there is no cuGraphInstantiateWithFlags; before 11.1 no cuGraphUpload."""
    lib = driver.libcuda
    with_flags = lib.cuGraphInstantiateWithFlags
    seen: list[tuple] = []

    def instantiate(executable: Any, graph: Any, error_node: Any, log: Any, size: int) -> int:
        seen.append((error_node, log, size))
        return with_flags(executable, graph, 0)
    lib.cuGraphInstantiate = instantiate
    lib.cuGraphInstantiateWithFlags = None
    lib.cuGraphUpload = None
    stream, enqueue, x, _ = _plan(driver)
    graph = Graph.capture(stream, enqueue)
    graph.upload(stream)   # skipped
    graph.launch(stream)
    assert seen == [(None, None, 0)]
    np.testing.assert_array_equal(_read(driver, x), 3 * X)
    graph.close()


def test_close_destroys_both_and_reports_the_first_failure(driver: FakeDriver) -> None:
    stream, enqueue, _, _ = _plan(driver)
    graph = Graph.capture(stream, enqueue)
    driver.libcuda.fail["cuGraphExecDestroy"] = 700
    with pytest.raises(RunError, match="^cuGraphExecDestroy failed: CUDA_ERROR_ILLEGAL_ADDRESS"):
        graph.close()
    assert driver.libcuda.graphs == driver.libcuda.execs == {} and graph.closed


def test_error_name_of_a_real_code(driver: FakeDriver) -> None:
    assert error_name(driver.libcuda, 901) == "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED"


def test_missing_driver_library(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(name: str) -> None:
        raise OSError(f"{name}: cannot open shared object file: No such file or directory")
    aicf_run.graph.libcuda.cache_clear()
    monkeypatch.setattr(aicf_run.graph.ctypes, "CDLL", refuse)
    try:
        with pytest.raises(RunError, match=r"cannot load the CUDA driver library libcuda\.so\.1 "
                                           r"for CUDA graphs \(libcuda\.so\.1: cannot open.*"
                                           r"--no-graph"):
            aicf_run.graph.libcuda()
    finally:
        aicf_run.graph.libcuda.cache_clear()


def test_prototypes_are_set_and_missing_symbols_tolerated(monkeypatch: pytest.MonkeyPatch) -> None:
    class Function:
        restype: Any = None
        argtypes: Any = None

    class Library:
        def __init__(self, name: str) -> None:
            self.functions = {n: Function() for n in aicf_run.graph._PROTOTYPES
                              if n != "cuGraphInstantiateWithFlags"}

        def __getattr__(self, name: str) -> Function:
            try:
                return self.__dict__["functions"][name]
            except KeyError:
                raise AttributeError(name) from None
    aicf_run.graph.libcuda.cache_clear()
    monkeypatch.setattr(aicf_run.graph.ctypes, "CDLL", Library)
    try:
        lib = aicf_run.graph.libcuda()
    finally:
        aicf_run.graph.libcuda.cache_clear()
    assert lib.cuStreamBeginCapture_v2.argtypes == [ctypes.c_void_p, ctypes.c_int]
    assert lib.cuGraphLaunch.restype is ctypes.c_int
    assert not hasattr(lib, "cuGraphInstantiateWithFlags")


def test_prototypes_match_cuda_h() -> None:
    """Each prototype has as many parameters as a declaration of that symbol in cuda.h."""
    nvcc = shutil.which("nvcc")
    places = [Path(os.environ.get("CUDA_HOME", "/usr/local/cuda")) / "include" / "cuda.h"]
    if nvcc is not None:
        places.insert(0, Path(nvcc).resolve().parent.parent / "include" / "cuda.h")
    header = next((place for place in places if place.is_file()), None)
    if header is None:
        pytest.skip("no CUDA toolkit header cuda.h found")
    text = header.read_text(errors="replace")
    # cuda.h declares most calls under an API name that a macro maps to the exported symbol:
    # `#define cuGraphInstantiate cuGraphInstantiateWithFlags`, or
    # `#define cuStreamBeginCapture __CUDA_API_PTSZ(cuStreamBeginCapture_v2)`.
    symbol = {api: target for api, target in re.findall(
        r"#define\s+(\w+)\s+(?:__CUDA_API_PTSZ\()?(\w+)\)?\s*$", text, re.MULTILINE)}
    counts: dict[str, set[int]] = {}
    for api, params in re.findall(r"CUresult CUDAAPI (\w+)\(([^)]*)\);", text):
        for name in {api, symbol.get(api, api)}:
            counts.setdefault(name, set()).add(len(params.split(",")))
    for name, argtypes in aicf_run.graph._PROTOTYPES.items():
        assert name in counts, f"{name} is not declared in {header}"
        assert len(argtypes) in counts[name], (name, counts[name])


# --- on a real GPU ---

_STEP_SOURCE = r"""
extern "C" __global__ void step(int* x) {   // x = 2x + 1, one element per thread
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    x[i] = 2 * x[i] + 1;
}
"""
N = 1024


@pytest.fixture(scope="module")
def step(gpu_device: Any, tmp_path_factory: pytest.TempPathFactory) -> Any:
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("nvcc is not on PATH")
    folder = tmp_path_factory.mktemp("graph_kernel")
    (folder / "step.cu").write_text(_STEP_SOURCE)
    subprocess.run([nvcc, "-cubin", f"-arch={gpu_device.arch}", "-o", str(folder / "step.cubin"),
                    str(folder / "step.cu")], check=True)
    module = gpu_device.driver.module_from_buffer((folder / "step.cubin").read_bytes())
    function = module.get_function("step")
    function.prepare("P")
    yield function


def _launcher(function: Any, stream: Any, pointer: int) -> Any:
    def enqueue() -> None:
        for _ in range(3):
            function.prepared_async_call((N // 256, 1, 1), (256, 1, 1), stream, pointer)
    return enqueue


@pytest.mark.gpu
def test_real_graph_replays_like_plain_launches(gpu_device: Any, step: Any) -> None:
    cuda = gpu_device.driver
    start = np.random.default_rng(5).integers(-1000, 1000, N).astype(np.int32)
    a, b = cuda.mem_alloc(start.nbytes), cuda.mem_alloc(start.nbytes)
    stream = cuda.Stream()
    try:
        for buffer in (a, b):
            cuda.memcpy_htod(buffer, start)
        graph = Graph.capture(stream, _launcher(step, stream, int(a)))
        stream.synchronize()
        captured = np.empty_like(start)
        cuda.memcpy_dtoh(captured, a)
        assert np.array_equal(captured, start), "capturing launches nothing"
        graph.upload(stream)
        graph.launch(stream)
        graph.launch(stream)
        plain = _launcher(step, stream, int(b))
        plain()
        plain()
        stream.synchronize()
        replayed, launched = np.empty_like(start), np.empty_like(start)
        cuda.memcpy_dtoh(replayed, a)
        cuda.memcpy_dtoh(launched, b)
        assert np.array_equal(replayed, launched)
        assert np.array_equal(replayed, 64 * start + 63)   # six times x -> 2x + 1
        graph.close()
    finally:
        a.free()
        b.free()


@pytest.mark.gpu
def test_real_capture_of_a_forbidden_call_leaves_the_stream_usable(gpu_device: Any,
                                                                    step: Any) -> None:
    """A synchronous copy (legacy default stream) while capturing fails; the stream lives on."""
    cuda = gpu_device.driver
    start = np.arange(N, dtype=np.int32)
    a = cuda.mem_alloc(start.nbytes)
    stream = cuda.Stream()
    try:
        def forbidden() -> None:
            _launcher(step, stream, int(a))()
            cuda.memcpy_htod(a, start)
        with pytest.raises((cuda.Error, RunError)):
            Graph.capture(stream, forbidden)
        cuda.memcpy_htod(a, start)
        graph = Graph.capture(stream, _launcher(step, stream, int(a)))
        graph.launch(stream)
        stream.synchronize()
        out = np.empty_like(start)
        cuda.memcpy_dtoh(out, a)
        assert np.array_equal(out, 8 * start + 7)
        graph.close()
    finally:
        a.free()


@pytest.mark.gpu
def test_real_library_has_every_call(gpu_device: Any) -> None:
    lib = aicf_run.graph.libcuda()
    for name in ("cuGetErrorName", "cuStreamBeginCapture_v2", "cuStreamEndCapture",
                 "cuGraphInstantiateWithFlags", "cuGraphUpload", "cuGraphLaunch",
                 "cuGraphExecDestroy", "cuGraphDestroy"):
        assert getattr(lib, name).restype is ctypes.c_int, name
    assert error_name(lib, 901) == "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED"
