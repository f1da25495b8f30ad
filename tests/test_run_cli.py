"""`aicf-run` without a GPU: every user error, arch checks, and the executor on a fake GPU.

Each bad input must exit 2 with exactly one stderr line starting "aicf-run: error:". The
executor tests replace `pycuda.driver` with `FakeDriver`, a CPU stand-in that keeps device
memory in bytearrays and runs the one fake kernel the test bundles use ("add": the last
pointer argument receives the float32 sum of the others), so the launch plan, pointer
arithmetic and memory traffic are checked exactly as a GPU would see them.
"""

from __future__ import annotations

import ctypes
import shutil
import subprocess
import sys
import types
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import onnx
import pytest
from click.testing import CliRunner, Result
from onnx import TensorProto, helper, numpy_helper

import aicf_run
import aicf_run.graph
from aicf_run.bundle import read_bundle
from aicf_run.check import compare
from aicf_run.cli import main
from aicf_run.device import check_arch, open_device
from aicf_run.errors import RunError
from aicf_run.executor import Executor
from aicf_run.inputs import save_outputs
from aicfc.artifact import write_bundle
from tests.conftest import gpu_alone
from tests.test_bundle_format import WEIGHT, make_payload, raw_bundle, sha

X = np.linspace(-1, 1, 6, dtype=np.float32).reshape(2, 3)


def run_cli(*args: str) -> Result:
    return CliRunner().invoke(main, [str(a) for a in args])


def assert_user_error(result: Result, *fragments: str) -> str:
    assert result.exit_code == 2, (result.exit_code, result.output, result.exception)
    assert isinstance(result.exception, SystemExit), result.exception
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("aicf-run: error: "), result.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    return lines[0]


@pytest.fixture
def two_input_bundle(tmp_path: Path) -> Path:
    path = tmp_path / "two.aicf"
    write_bundle(make_payload(two_inputs=True), path)
    return path


# --- a CPU stand-in for pycuda.driver ---


class FakeCudaError(Exception):
    pass


class FakeAllocation:
    def __init__(self, driver: FakeDriver, base: int) -> None:
        self.driver, self.base = driver, base

    def __int__(self) -> int:
        return self.base

    def free(self) -> None:
        self.driver.memory.pop(self.base, None)


class FakeFunction:
    def __init__(self, driver: FakeDriver, symbol: str) -> None:
        self.driver, self.symbol, self.arg_format = driver, symbol, None
        self.attributes: dict[int, int] = {}

    def prepare(self, arg_format: str) -> FakeFunction:
        self.arg_format = arg_format
        return self

    def set_attribute(self, attribute: int, value: int) -> None:
        self.attributes[attribute] = value

    def prepared_async_call(self, grid: tuple, block: tuple, stream: FakeStream, *args: int,
                            shared_size: int = 0) -> None:
        # PyCUDA needs tuples (it tests `isinstance(block, tuple)`) and one int per "P".
        assert isinstance(grid, tuple) and isinstance(block, tuple)
        assert self.arg_format == "P" * len(args) and all(type(a) is int for a in args)
        assert isinstance(stream, FakeStream), "every launch goes to the executor's stream"
        if stream.captured is not None:   # recorded into a graph, run at its replays
            stream.captured.append(lambda: self._execute(grid, block, args, shared_size))
            return
        self.driver.clock += HOST_LAUNCH_US
        self._execute(grid, block, args, shared_size)

    def _execute(self, grid: tuple, block: tuple, args: tuple[int, ...], shared_size: int) -> None:
        self.driver.clock += KERNEL_US
        self.driver.launches.append((self.symbol, grid, block, args, shared_size))
        n = grid[0] * block[0]
        dtype = np.float16 if self.symbol == "add_f16" else np.float32
        total = np.zeros(n, dtype=np.float32)
        for pointer in args[:-1]:
            total += np.frombuffer(self.driver.read(pointer, np.dtype(dtype).itemsize * n), dtype)
        self.driver.write(args[-1], total.astype(dtype).tobytes())


class FakeStream:
    def __init__(self, driver: FakeDriver) -> None:
        self.driver = driver
        self.handle = 0x5000 + len(driver.streams)   # a CUstream, as an int
        self.captured: list[Any] | None = None
        driver.streams[self.handle] = self

    def synchronize(self) -> None:
        pass


class FakeEvent:
    def __init__(self, driver: FakeDriver) -> None:
        self.driver, self.t = driver, 0.0

    def record(self, stream: FakeStream | None = None) -> None:
        self.t = self.driver.clock

    def synchronize(self) -> None:
        pass

    def time_since(self, start: FakeEvent) -> float:
        return (self.t - start.t) / 1e3   # milliseconds, as PyCUDA's


# The fake GPU's virtual clock (microseconds): a kernel runs KERNEL_US; a launch call from the
# host costs HOST_LAUNCH_US more, a graph replay GRAPH_LAUNCH_US once for all its kernels.
KERNEL_US = 1.0
HOST_LAUNCH_US = 4.0
GRAPH_LAUNCH_US = 2.0


class FakeLibcuda:
    """The driver calls of aicf_run.graph on the fake GPU.

    Between cuStreamBeginCapture_v2 and cuStreamEndCapture a FakeStream collects the launches
    instead of running them; cuGraphLaunch runs them. `fail` maps a call's name to the CUresult
    it returns instead of doing its work.
    """

    NAMES = {1: "CUDA_ERROR_INVALID_VALUE", 700: "CUDA_ERROR_ILLEGAL_ADDRESS",
             900: "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED",
             901: "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED"}

    def __init__(self, driver: FakeDriver) -> None:
        self.driver = driver
        self.fail: dict[str, int] = {}
        self.calls: list[str] = []
        self.graphs: dict[int, list[Any]] = {}
        self.execs: dict[int, list[Any]] = {}
        self.events: dict[int, int | None] = {}      # event -> the stream it was last recorded on
        self.joins: list[tuple[int, int]] = []       # (producer stream, waiting stream)
        self._next = 0x100

    def _result(self, name: str) -> int:
        self.calls.append(name)
        return self.fail.get(name, 0)

    def _handle(self) -> int:
        self._next += 1
        return self._next

    def cuGetErrorName(self, result: int, name: Any) -> int:
        if result not in self.NAMES:
            return 1
        name.contents.value = self.NAMES[result].encode()
        return 0

    def cuStreamBeginCapture_v2(self, stream: ctypes.c_void_p, mode: int) -> int:
        assert mode == 1, "THREAD_LOCAL"
        result = self._result("cuStreamBeginCapture_v2")
        if not result:
            self.driver.streams[stream.value].captured = []
        return result

    def cuStreamEndCapture(self, stream: ctypes.c_void_p, graph: Any) -> int:
        target = self.driver.streams[stream.value]
        captured, target.captured = target.captured, None
        assert captured is not None, "no capture to end"
        result = self._result("cuStreamEndCapture")
        if not result:
            graph.contents.value = handle = self._handle()
            self.graphs[handle] = captured
        return result

    def cuGraphInstantiateWithFlags(self, executable: Any, graph: ctypes.c_void_p,
                                    flags: int) -> int:
        result = self._result("cuGraphInstantiateWithFlags")
        if not result:
            executable.contents.value = handle = self._handle()
            self.execs[handle] = list(self.graphs[graph.value])
        return result

    def cuGraphUpload(self, executable: ctypes.c_void_p, stream: ctypes.c_void_p) -> int:
        assert executable.value in self.execs and stream.value in self.driver.streams
        return self._result("cuGraphUpload")

    def cuGraphLaunch(self, executable: ctypes.c_void_p, stream: ctypes.c_void_p) -> int:
        result = self._result("cuGraphLaunch")
        if not result:
            self.driver.clock += GRAPH_LAUNCH_US
            for node in self.execs[executable.value]:
                node()
        return result

    def cuGraphExecDestroy(self, executable: ctypes.c_void_p) -> int:
        del self.execs[executable.value]
        return self._result("cuGraphExecDestroy")

    def cuGraphDestroy(self, graph: ctypes.c_void_p) -> int:
        del self.graphs[graph.value]
        return self._result("cuGraphDestroy")

    # Events (aicf_run.streams): the fake GPU runs everything at once, so a join is a record.
    def cuEventCreate(self, event: Any, flags: ctypes.c_uint) -> int:
        result = self._result("cuEventCreate")
        if not result:
            event.contents.value = handle = self._handle()
            self.events[handle] = None
        return result

    def cuEventRecord(self, event: ctypes.c_void_p, stream: ctypes.c_void_p) -> int:
        assert event.value in self.events
        self.events[event.value] = stream.value or 0
        return self._result("cuEventRecord")

    def cuStreamWaitEvent(self, stream: ctypes.c_void_p, event: ctypes.c_void_p,
                          flags: ctypes.c_uint) -> int:
        assert self.events.get(event.value) is not None, "waiting on an unrecorded event"
        self.joins.append((self.events[event.value], stream.value or 0))
        return self._result("cuStreamWaitEvent")

    def cuEventDestroy_v2(self, event: ctypes.c_void_p) -> int:
        del self.events[event.value]
        return self._result("cuEventDestroy_v2")

    def cuPointerGetAttribute(self, data: Any, attribute: ctypes.c_int,
                              pointer: ctypes.c_uint64) -> int:
        # Memory type 2 (device) and ordinal 0 for any fake allocation; 1 is CUDA_ERROR_INVALID_VALUE.
        try:
            self.driver._locate(pointer.value, 1)
        except AssertionError:
            return 1
        data.contents.value = 2 if attribute.value == 2 else 0
        return self._result("cuPointerGetAttribute")


class FakeModule:
    def __init__(self, driver: FakeDriver) -> None:
        self.driver = driver

    def get_function(self, symbol: str) -> FakeFunction:
        if symbol in FakeCast.SYMBOLS:
            return FakeCast(self.driver, symbol)
        if symbol not in ("add", "add_f16"):
            raise FakeCudaError("cuModuleGetFunction failed: named symbol not found")
        return FakeFunction(self.driver, symbol)


class FakeCast(FakeFunction):
    """The interface cast kernels of aicfc/codegen/io_cast.py: dst[i] = convert(src[i])."""

    SYMBOLS = {"aicf_cast_float32_to_float16": ("<f4", "<f2"),
               "aicf_cast_float16_to_float32": ("<f2", "<f4"),
               "aicf_cast_float32_to_bfloat16": ("<f4", "bf16"),
               "aicf_cast_bfloat16_to_float32": ("bf16", "<f4")}

    def prepared_async_call(self, grid: tuple, block: tuple, stream: FakeStream, *args: int,
                            shared_size: int = 0) -> None:
        assert self.arg_format == "PPQ" and len(args) == 3 and all(type(a) is int for a in args)
        assert isinstance(stream, FakeStream) and stream.captured is None, "casts stay outside the graph"
        source, destination, n = args
        assert grid[0] * block[0] >= 1 and n >= 1
        self.driver.clock += HOST_LAUNCH_US + KERNEL_US
        self.driver.launches.append((self.symbol, grid, block, args, shared_size))
        src, dst = self.SYMBOLS[self.symbol]
        if src == "bf16":
            bits = np.frombuffer(self.driver.read(source, 2 * n), "<u2").astype("<u4") << 16
            values = bits.view("<f4")
        else:
            values = np.frombuffer(self.driver.read(source, np.dtype(src).itemsize * n), src)
        if dst == "bf16":
            from aicf_run.convert import to_bf16
            out = to_bf16(values.astype("<f4")).tobytes()
        else:
            out = values.astype(dst).tobytes()
        self.driver.write(destination, out)


class FakeDriver(types.ModuleType):
    """Just enough of pycuda.driver for open_device and Executor."""

    Error = FakeCudaError

    def __init__(self, capability: tuple[int, int] = (9, 0)) -> None:
        super().__init__("pycuda.driver")
        self.memory: dict[int, bytearray] = {}
        self.allocations = 0
        self.pinned = 0
        self.launches: list[tuple] = []
        self.streams: dict[int, FakeStream] = {}
        self.clock = 0.0
        self.libcuda = FakeLibcuda(self)
        self.popped = self.detached = self.pushed = 0
        self.copy_kinds: list[str] = []   # the kind of every memcpy: "htod", "dtoh", "dtod"
        self.function_attribute = types.SimpleNamespace(MAX_DYNAMIC_SHARED_SIZE_BYTES=8)
        driver = self

        class Context:
            def push(self) -> None:
                driver.pushed += 1

            def synchronize(self) -> None:
                pass

            def pop(self) -> None:
                driver.popped += 1

            def detach(self) -> None:
                driver.detached += 1

        class Device:
            def __init__(self, ordinal: int) -> None:
                pass

            @staticmethod
            def count() -> int:
                return 1

            def compute_capability(self) -> tuple[int, int]:
                return capability

            def name(self) -> str:
                return "Fake GPU"

            def retain_primary_context(self) -> Context:
                return Context()

        self.Device = Device

    def init(self) -> None:
        pass

    def Stream(self) -> FakeStream:
        return FakeStream(self)

    def Event(self) -> FakeEvent:
        return FakeEvent(self)

    def pagelocked_empty(self, shape: tuple[int, ...], dtype: Any) -> np.ndarray:
        self.pinned += 1
        return np.full(shape, 0xCD, dtype=dtype)

    def mem_alloc(self, nbytes: int) -> FakeAllocation:
        assert nbytes >= 1
        base = 0x1000_0000 * (len(self.memory) + 1)
        self.memory[base] = bytearray(b"\xcd" * nbytes)  # poisoned, like fresh GPU memory
        self.allocations += 1
        return FakeAllocation(self, base)

    def module_from_buffer(self, cubin: bytes) -> FakeModule:
        assert cubin.startswith(b"\x7fELF")
        return FakeModule(self)

    def _locate(self, pointer: int, nbytes: int) -> tuple[bytearray, int]:
        for base, block in self.memory.items():
            if base <= pointer and pointer + nbytes <= base + len(block):
                return block, pointer - base
        raise AssertionError(f"out-of-bounds device access at {pointer:#x} (+{nbytes})")

    def read(self, pointer: int, nbytes: int) -> bytes:
        block, offset = self._locate(pointer, nbytes)
        return bytes(block[offset:offset + nbytes])

    def write(self, pointer: int, data: bytes) -> None:
        block, offset = self._locate(pointer, len(data))
        block[offset:offset + len(data)] = data

    def memset_d8(self, pointer: int, value: int, count: int) -> None:
        self.write(pointer, bytes([value]) * count)

    def memcpy_htod(self, pointer: int, source: Any) -> None:
        self.copy_kinds.append("htod")
        self.write(pointer, memoryview(source).cast("B").tobytes())

    def memcpy_dtoh(self, destination: np.ndarray, pointer: int) -> None:
        self.copy_kinds.append("dtoh")
        view = memoryview(destination).cast("B")
        view[:] = self.read(pointer, len(view))

    def memcpy_dtod_async(self, destination: int, source: int, nbytes: int,
                          stream: FakeStream) -> None:
        assert stream.captured is None, "copies stay outside the graph"
        assert isinstance(stream, FakeStream), "every copy goes to the executor's stream"
        self.copy_kinds.append("dtod")
        self.write(destination, self.read(source, nbytes))

    def memcpy_htod_async(self, pointer: int, source: np.ndarray, stream: FakeStream) -> None:
        assert stream.captured is None, "copies stay outside the graph"
        self.memcpy_htod(pointer, source)

    def memcpy_dtoh_async(self, destination: np.ndarray, pointer: int,
                          stream: FakeStream) -> None:
        assert stream.captured is None, "copies stay outside the graph"
        self.memcpy_dtoh(destination, pointer)


def install_fake_gpu(monkeypatch: pytest.MonkeyPatch, driver: FakeDriver) -> FakeDriver:
    """Make `driver` pycuda.driver, and its FakeLibcuda the library aicf_run.graph calls."""
    package = types.ModuleType("pycuda")
    package.driver = driver
    monkeypatch.setitem(sys.modules, "pycuda", package)
    monkeypatch.setitem(sys.modules, "pycuda.driver", driver)
    monkeypatch.setattr(aicf_run.graph, "libcuda", lambda: driver.libcuda)
    return driver


# --- bad bundle files ---


def _flip_byte(at: int) -> Any:
    def flip(path: Path) -> None:
        raw = bytearray(path.read_bytes())
        raw[at] ^= 0xFF
        path.write_bytes(bytes(raw))
    return flip


def _bad_payload(mutate: Any) -> Any:
    def write(path: Path) -> None:
        payload = make_payload()
        mutate(payload)
        raw_bundle(path, payload)
    return write


def _short_weight(payload: dict) -> None:
    payload["weights"][0]["data"] = payload["weights"][0]["data"][:-4]


BAD_FILES: list[tuple[str, Any, str]] = [
    ("truncated", lambda p: p.write_bytes(p.read_bytes()[:-40]), "is truncated: header says"),
    ("truncated_weights", lambda p: p.write_bytes(p.read_bytes()[:-7]),
     "weights[0]: ends at byte 24 of the weights section, which has 17"),
    ("grown_weights", lambda p: p.write_bytes(p.read_bytes() + b"\0"),
     "fill 24 bytes of the 25-byte weights section"),
    ("flipped_byte", _flip_byte(100), "checksum mismatch"),
    ("flipped_weight_byte", _flip_byte(-5), "weights[0] (buffer 2) does not match its sha256"),
    ("png", lambda p: p.write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(64)), "(bad magic)"),
    ("text", lambda p: p.write_text("just some text\n" * 10), "(bad magic)"),
    ("empty", lambda p: p.write_bytes(b""), "is empty"),
    ("wrong_version", lambda p: raw_bundle(p, make_payload(), version=7, digest=bytes(32)),
     "format version 7 is not supported by this aicf-run (supports 1, 2, 3)"),
    ("wrong_version_forged_checksum", lambda p: raw_bundle(p, make_payload(), version=7),
     "format version 7 is not supported"),
    ("not_a_map", lambda p: raw_bundle(p, data=msgpack.packb([1, 2])), "not a map"),
    ("bad_grid", _bad_payload(lambda d: d["kernels"][0].update(grid=[1, 0, 1])),
     "kernels[0].grid"),
    ("buffer_id_out_of_range", _bad_payload(lambda d: d["kernels"][0].update(args=[0, 2, 5])),
     "kernels[0].args[2]"),
    ("weight_length_mismatch", _bad_payload(_short_weight), "weights[0].data"),
    ("cubin_sha_mismatch", _bad_payload(lambda d: d["modules"][0].update(cubin=b"\x7fELFx")),
     "modules[0].cubin_sha256"),
]


@pytest.mark.parametrize("damage,fragment", [(d, f) for _, d, f in BAD_FILES],
                         ids=[case_id for case_id, _, _ in BAD_FILES])
def test_bad_bundle_file(bundle_path: Path, x_npy: Path, fake_gpu: FakeDriver,
                         damage: Any, fragment: str) -> None:
    damage(bundle_path)
    assert_user_error(run_cli(bundle_path, "--input", x_npy), fragment)
    assert fake_gpu.allocations == 0  # refused before the GPU was touched


def test_missing_bundle(tmp_path: Path) -> None:
    assert_user_error(run_cli(tmp_path / "nope.aicf"), "No such file")


def test_usage_error_keeps_clicks_exit_code() -> None:
    assert run_cli().exit_code == 2
    assert run_cli("x.aicf", "--rtol", "-1").exit_code == 2


# --- bad inputs ---


def test_missing_input_file(bundle_path: Path, tmp_path: Path) -> None:
    assert_user_error(run_cli(bundle_path, "--input", tmp_path / "absent.npy"),
                      "does not exist")


def test_pickled_npy(bundle_path: Path, tmp_path: Path) -> None:
    path = tmp_path / "x.npy"
    np.save(path, np.array([{"a": 1}, None], dtype=object), allow_pickle=True)
    assert_user_error(run_cli(bundle_path, "--input", path),
                      "x.npy holds Python objects (pickled); save a plain numeric array "
                      "with numpy.save")


def test_pickled_npz_member(bundle_path: Path, tmp_path: Path) -> None:
    path = tmp_path / "in.npz"
    np.savez(path, x=np.array([object()], dtype=object))
    assert_user_error(run_cli(bundle_path, "--input", path), "holds Python objects (pickled)")


@pytest.mark.parametrize("content", [b"not numpy at all", b"\x93NUMPY\x01\x00garbage"],
                         ids=["text", "bad_header"])
def test_not_an_npy(bundle_path: Path, tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "x.npy"
    path.write_bytes(content)
    assert_user_error(run_cli(bundle_path, "--input", path), "x.npy")


def test_forged_npy_shape_is_refused_before_loading(bundle_path: Path, tmp_path: Path) -> None:
    path = tmp_path / "x.npy"
    with open(path, "wb") as f:  # claims 120 GB of data, holds 24 bytes
        np.lib.format.write_array_header_1_0(
            f, {"descr": "<f4", "fortran_order": False, "shape": (10**10, 3)})
        f.write(X.tobytes())
    assert_user_error(run_cli(bundle_path, "--input", path),
                      "x.npy is truncated: its header says 120000000000 data bytes")


def test_wrong_extension(bundle_path: Path, tmp_path: Path) -> None:
    path = tmp_path / "x.csv"
    path.write_text("1,2,3")
    assert_user_error(run_cli(bundle_path, "--input", path), "is not an .npy or .npz file")


def test_wrong_shape(bundle_path: Path, tmp_path: Path) -> None:
    np.save(tmp_path / "x.npy", np.zeros((3, 2), dtype=np.float32))
    assert_user_error(run_cli(bundle_path, "--input", tmp_path / "x.npy"),
                      "input 'x' has shape [3, 2], expected [2, 3]")


def test_wrong_dtype(bundle_path: Path, tmp_path: Path) -> None:
    np.save(tmp_path / "x.npy", np.zeros((2, 3), dtype=np.float64))
    assert_user_error(run_cli(bundle_path, "--input", tmp_path / "x.npy"),
                      "input 'x' has dtype float64, expected float32")


def test_unknown_input_name(bundle_path: Path, x_npy: Path) -> None:
    assert_user_error(run_cli(bundle_path, "--input", f"z={x_npy}"),
                      "the bundle has no input named 'z' (inputs: x)")


def test_unknown_npz_member(bundle_path: Path, tmp_path: Path) -> None:
    np.savez(tmp_path / "in.npz", x=X, extra=X)
    assert_user_error(run_cli(bundle_path, "--input", tmp_path / "in.npz"),
                      "no input named 'extra'")


def test_duplicate_input(bundle_path: Path, x_npy: Path) -> None:
    assert_user_error(run_cli(bundle_path, "--input", x_npy, "--input", f"x={x_npy}"),
                      "input 'x' is given twice")


def test_missing_input_for_two_input_bundle(two_input_bundle: Path, x_npy: Path) -> None:
    assert_user_error(run_cli(two_input_bundle, "--input", f"x={x_npy}"),
                      "missing input 'b' (float32 [2, 3]); pass --input b=FILE.npy")


def test_unnamed_input_for_two_input_bundle(two_input_bundle: Path, x_npy: Path) -> None:
    assert_user_error(run_cli(two_input_bundle, "--input", x_npy), "name it: --input NAME=")


def test_no_inputs_at_all(bundle_path: Path) -> None:
    assert_user_error(run_cli(bundle_path), "missing input 'x'")


def test_check_model_missing(bundle_path: Path, x_npy: Path, tmp_path: Path,
                             fake_gpu: FakeDriver) -> None:
    assert_user_error(run_cli(bundle_path, "--input", x_npy, "--check", tmp_path / "m.onnx"),
                      "--check model")
    assert fake_gpu.allocations == 0


# --- the device layer ---


def test_no_pycuda(bundle_path: Path, x_npy: Path, no_pycuda: None) -> None:
    assert_user_error(run_cli(bundle_path, "--input", x_npy),
                      "PyCUDA is not installed; install the GPU extra: pip install "
                      "'aicf[gpu]' (needs an NVIDIA driver)")


def test_cuda_init_failure(fake_gpu: FakeDriver, monkeypatch: pytest.MonkeyPatch) -> None:
    def init() -> None:
        raise FakeCudaError("cuInit failed: no CUDA-capable device is detected")
    monkeypatch.setattr(fake_gpu, "init", init)
    with pytest.raises(RunError, match="cannot initialise CUDA .*no CUDA-capable device"):
        open_device()


def test_device_ordinal_out_of_range(fake_gpu: FakeDriver) -> None:
    with pytest.raises(RunError, match="there is no GPU 3: this machine has 1"):
        open_device(3)


@pytest.mark.parametrize("bundle_arch,device_arch,runs", [
    ("sm_80", "sm_90", False), ("sm_90", "sm_90", True), ("sm_80", "sm_86", True),
    ("sm_86", "sm_80", False), ("sm_90", "sm_80", False), ("sm_90a", "sm_90", True),
    ("sm_100", "sm_103", True), ("sm_100", "sm_90", False),
])
def test_check_arch(bundle_arch: str, device_arch: str, runs: bool) -> None:
    if runs:
        check_arch(bundle_arch, device_arch)
    else:
        with pytest.raises(RunError, match=f"bundle was compiled for {bundle_arch} but this GPU "
                                           f"is {device_arch}; recompile with aicfc compile "
                                           f"--target {device_arch}"):
            check_arch(bundle_arch, device_arch)


def test_arch_mismatch_through_the_cli(bundle_path: Path, x_npy: Path,
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    driver = install_fake_gpu(monkeypatch, FakeDriver(capability=(8, 0)))
    assert_user_error(run_cli(bundle_path, "--input", x_npy),
                      "bundle was compiled for sm_90 but this GPU is sm_80")
    assert driver.allocations == 0 and driver.popped == 1


# --- the executor on the fake GPU ---


def test_run_end_to_end(bundle_path: Path, x_npy: Path, tmp_path: Path,
                        fake_gpu: FakeDriver) -> None:
    out = tmp_path / "out"
    result = run_cli(bundle_path, "--input", x_npy, "--output-dir", out)
    assert result.exit_code == 0, (result.output, result.exception)
    assert result.stdout.strip() == f"y: float32 [2, 3] -> {out / 'y.npy'}"
    np.testing.assert_array_equal(np.load(out / "y.npy"), X + WEIGHT)
    assert fake_gpu.allocations == 2 and fake_gpu.memory == {}  # arena + weights, then freed
    assert fake_gpu.popped == fake_gpu.detached == 1
    symbol, grid, block, pointers, smem = fake_gpu.launches[0]
    assert (symbol, grid, block, smem) == ("add", (1, 1, 1), (6, 1, 1), 0)
    arena, weights = 0x1000_0000, 0x2000_0000
    assert pointers == (arena + 0, weights + 0, arena + 256)
    # The plan was captured once into a graph and replayed; the graph went before the memory.
    lib = fake_gpu.libcuda
    assert lib.calls == ["cuStreamBeginCapture_v2", "cuStreamEndCapture",
                         "cuGraphInstantiateWithFlags", "cuGraphUpload", "cuGraphLaunch",
                         "cuGraphExecDestroy", "cuGraphDestroy"]
    assert lib.graphs == lib.execs == {} and len(fake_gpu.launches) == 1


def test_no_graph_launches_one_by_one(bundle_path: Path, x_npy: Path, tmp_path: Path,
                                      fake_gpu: FakeDriver) -> None:
    result = run_cli(bundle_path, "--input", x_npy, "--output-dir", tmp_path, "--no-graph")
    assert result.exit_code == 0, (result.output, result.exception)
    np.testing.assert_array_equal(np.load(tmp_path / "y.npy"), X + WEIGHT)
    assert fake_gpu.libcuda.calls == [] and len(fake_gpu.launches) == 1


def test_graph_and_no_graph_give_the_same_bits(two_input_bundle: Path,
                                               fake_gpu: FakeDriver) -> None:
    device = open_device()
    bundle = read_bundle(two_input_bundle)
    inputs = {"x": X, "b": np.float32(0.1) * X}
    with_graph = Executor(bundle, device).run(inputs)["y"]
    without = Executor(bundle, device, graph=False).run(inputs)["y"]
    assert with_graph.tobytes() == without.tobytes()
    device.close()
    assert fake_gpu.memory == {} and fake_gpu.libcuda.execs == {}


def test_graph_failure_names_the_call(bundle_path: Path, x_npy: Path,
                                      fake_gpu: FakeDriver) -> None:
    fake_gpu.libcuda.fail["cuGraphInstantiateWithFlags"] = 1
    assert_user_error(run_cli(bundle_path, "--input", x_npy),
                      "cuGraphInstantiateWithFlags failed: CUDA_ERROR_INVALID_VALUE (1)",
                      "--no-graph")
    assert fake_gpu.memory == {} and fake_gpu.libcuda.graphs == {}


def test_two_inputs_from_npz(two_input_bundle: Path, tmp_path: Path,
                             fake_gpu: FakeDriver) -> None:
    np.savez(tmp_path / "in.npz", x=X, b=2 * X)
    result = run_cli(two_input_bundle, "--input", tmp_path / "in.npz", "--output-dir", tmp_path)
    assert result.exit_code == 0, (result.output, result.exception)
    np.testing.assert_allclose(np.load(tmp_path / "y.npy"), 3 * X + WEIGHT, rtol=1e-6)


def test_repeated_runs_allocate_nothing(bundle_path: Path, fake_gpu: FakeDriver) -> None:
    device = open_device()
    executor = Executor(read_bundle(bundle_path), device)
    first = executor.run({"x": X})
    uploads = fake_gpu.allocations
    pinned = fake_gpu.pinned
    second = executor.run({"x": np.asfortranarray(2 * X)})
    assert fake_gpu.allocations == uploads == 2
    # page-locked staging buffers: one for x, one for y, and one the weights section was
    # uploaded through at construction (dropped after it)
    assert fake_gpu.pinned == pinned == 3
    assert first["y"] is not second["y"]
    np.testing.assert_array_equal(second["y"], 2 * X + WEIGHT)
    with pytest.raises(RunError, match="input 'x' has shape"):
        executor.run({"x": X.T})
    device.close()
    assert fake_gpu.memory == {}


def test_big_shared_memory_opts_in(tmp_path: Path, fake_gpu: FakeDriver) -> None:
    path = tmp_path / "smem.aicf"
    write_bundle(make_payload(smem_bytes=100 * 1024), path)
    device = open_device()
    executor = Executor(read_bundle(path), device)
    function = executor._launches[0].function
    assert function.attributes == {8: 100 * 1024}
    executor.run({"x": X})
    assert fake_gpu.launches[-1][-1] == 100 * 1024
    device.close()


def test_kernel_fault(bundle_path: Path, x_npy: Path, fake_gpu: FakeDriver,
                      monkeypatch: pytest.MonkeyPatch) -> None:
    def synchronize(self: Any) -> None:
        raise FakeCudaError("cuStreamSynchronize failed: an illegal memory access was "
                            "encountered")
    monkeypatch.setattr(FakeStream, "synchronize", synchronize)
    assert_user_error(run_cli(bundle_path, "--input", x_npy), "a kernel failed while running",
                      "illegal memory access", "CUDA_LAUNCH_BLOCKING=1")
    assert fake_gpu.memory == {} and fake_gpu.detached == 1


def test_missing_symbol(tmp_path: Path, fake_gpu: FakeDriver) -> None:
    payload = make_payload()
    payload["kernels"][0]["symbol"] = "mul"
    path = tmp_path / "model.aicf"
    write_bundle(payload, path)
    device = open_device()
    with pytest.raises(RunError, match=r"kernel 0 \(add_0\): symbol 'mul' is not in module 0"):
        Executor(read_bundle(path), device)
    device.close()


# --- --check against onnxruntime ---


def _add_model(path: Path, weight: np.ndarray) -> Path:
    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "w"], ["y"], name="add_0")], "add",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])],
        [numpy_helper.from_array(weight, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    onnx.save(model, str(path))
    return path


def test_check_pass_and_fail(bundle_path: Path, x_npy: Path, tmp_path: Path,
                             fake_gpu: FakeDriver) -> None:
    good = _add_model(tmp_path / "good.onnx", WEIGHT)
    result = run_cli(bundle_path, "--input", x_npy, "--output-dir", tmp_path, "--check", good)
    assert result.exit_code == 0, result.output
    assert "PASS" in result.stdout and "max rel err" in result.stdout

    bad = _add_model(tmp_path / "bad.onnx", WEIGHT + 1)
    result = run_cli(bundle_path, "--input", x_npy, "--output-dir", tmp_path, "--check", bad)
    assert result.exit_code == 1, result.output
    assert "FAIL" in result.stdout


def test_check_with_a_foreign_model(bundle_path: Path, x_npy: Path, tmp_path: Path,
                                    fake_gpu: FakeDriver) -> None:
    garbage = tmp_path / "garbage.onnx"
    garbage.write_bytes(b"not a model")
    assert_user_error(run_cli(bundle_path, "--input", x_npy, "--output-dir", tmp_path,
                              "--check", garbage), "onnxruntime cannot run")


def test_compare_definitions() -> None:
    ref = np.array([1.0, -4.0, 2.0], dtype=np.float32)
    row = compare("y", ref + np.array([0, 0.002, 0], dtype=np.float32), ref, rtol=1e-3)
    assert row.max_abs_err == pytest.approx(0.002, rel=1e-3)
    assert row.max_rel_err == pytest.approx(0.002 / 4, rel=1e-3) and row.passed
    assert not compare("y", np.array([np.nan]), np.array([1.0]), 1.0).passed
    assert not compare("y", np.array([1.0]), np.array([np.nan]), 1.0).passed
    assert compare("y", np.array([np.inf, 1.0]), np.array([np.inf, 1.0]), 0.0).passed
    assert not compare("y", np.array([np.inf, 2.0]), np.array([np.inf, 1.0]), 0.1).passed
    assert not compare("y", np.zeros(2), np.zeros(3), 1.0).passed
    assert compare("y", np.zeros(3), np.zeros(3), 0.0).passed


# --- saving outputs ---


def test_save_outputs_sanitizes_names(tmp_path: Path) -> None:
    paths = save_outputs({"../evil/name": X, "ok.out-1": X}, tmp_path)
    assert paths["../evil/name"] == tmp_path / ".._evil_name.npy"
    assert sorted(p.name for p in tmp_path.iterdir()) == [".._evil_name.npy", "ok.out-1.npy"]
    with pytest.raises(RunError, match="cannot be a file name"):
        save_outputs({"..": X}, tmp_path)
    with pytest.raises(RunError, match="would both be saved as"):
        save_outputs({"a/b": X, "a_b": X}, tmp_path)


# --- on a real GPU (marked gpu; skipped without nvcc, PyCUDA or a GPU) ---

_CUDA_SOURCE = r"""
extern "C" __global__ void add(const float* a, const float* b, float* out) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    out[i] = a[i] + b[i];
}
extern "C" __global__ void add_smem(const float* a, const float* b, float* out) {
    extern __shared__ float tile[];  // launched with 100 KiB: needs the opt-in attribute
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    tile[threadIdx.x] = a[i] + b[i];
    __syncthreads();
    out[i] = tile[threadIdx.x];
}
extern "C" __global__ void crash(const float* a, const float* b, float* out) {
    out[1ull << 40] = a[0];  // far outside any allocation: an illegal address
}
"""


def _real_bundle(tmp_path: Path, symbol: str, smem_bytes: int = 0) -> Path:
    """Compile _CUDA_SOURCE for this GPU and wrap `symbol` in a bundle; skip without a GPU."""
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("nvcc is not on PATH")
    try:
        device = open_device()
    except RunError as err:
        pytest.skip(str(err))
    arch = device.arch
    device.close()
    (tmp_path / "k.cu").write_text(_CUDA_SOURCE)
    subprocess.run([nvcc, "-cubin", f"-arch={arch}", "-o", str(tmp_path / "k.cubin"),
                    str(tmp_path / "k.cu")], check=True)
    cubin = (tmp_path / "k.cubin").read_bytes()
    payload = make_payload(smem_bytes=smem_bytes)
    payload["target"]["arch"] = arch
    payload["modules"][0].update(arch=arch, cubin=cubin, cubin_sha256=sha(cubin),
                                 source=_CUDA_SOURCE, source_sha256=sha(_CUDA_SOURCE))
    payload["kernels"][0]["symbol"] = symbol
    bundle = tmp_path / f"{symbol}.aicf"
    write_bundle(payload, bundle)
    return bundle


def _run_subprocess(*args: Path | str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "aicf_run", *map(str, args)],
                          capture_output=True, text=True, timeout=120)


@pytest.mark.gpu
@pytest.mark.parametrize("symbol,smem_bytes", [("add", 0), ("add_smem", 100 * 1024)])
def test_real_gpu(tmp_path: Path, x_npy: Path, symbol: str, smem_bytes: int) -> None:
    bundle = _real_bundle(tmp_path, symbol, smem_bytes)
    model = _add_model(tmp_path / "m.onnx", WEIGHT)

    # The CLI in a fresh interpreter: exit 0, PASS, and nothing on stderr (no PyCUDA cleanup
    # warnings at exit either).
    done = _run_subprocess(bundle, "--input", x_npy, "--output-dir", tmp_path / "out",
                           "--check", model)
    assert done.returncode == 0 and done.stderr == "", (done.stdout, done.stderr)
    assert "PASS" in done.stdout
    np.testing.assert_allclose(np.load(tmp_path / "out" / "y.npy"), X + WEIGHT, rtol=1e-6)

    # The API: repeated runs, each with fresh inputs, allocate no device memory.
    executor = aicf_run.load(bundle)
    cuda = executor.device.driver
    free_before = cuda.mem_get_info()[0]
    for scale in (1.0, 2.0, -3.0):
        outputs = executor.run({"x": scale * X})
        np.testing.assert_allclose(outputs["y"], scale * X + WEIGHT, rtol=1e-6)
    if gpu_alone():   # the free memory is the whole device's: other pytest -n workers move it
        assert cuda.mem_get_info()[0] == free_before
    executor.device.close()


@pytest.mark.gpu
def test_real_gpu_kernel_fault(tmp_path: Path, x_npy: Path) -> None:
    # An illegal address leaves the context unusable; the user still sees one line.
    done = _run_subprocess(_real_bundle(tmp_path, "crash"), "--input", x_npy,
                           "--output-dir", tmp_path)
    lines = done.stderr.splitlines()
    assert done.returncode == 2 and len(lines) == 1, done.stderr
    assert lines[0].startswith("aicf-run: error: a kernel failed while running")
