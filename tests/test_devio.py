"""Device-resident I/O of Executor.run ([Note: device I/O] in aicf_run/executor.py) on the fake
GPU of test_run_cli.py: GPU tensors in and out with no host copy, the bundle's cast kernels,
validation, stream joins, DLPack export; and the compiler's interface cast records."""
from __future__ import annotations

import copy
import ctypes
import gc
from typing import Any

import numpy as np
import pytest

from aicf_run import dlpack
from aicf_run.bundle import Bundle
from aicf_run.device import open_device
from aicf_run.errors import RunError
from aicf_run.executor import Executor
from aicf_run.interop import DeviceArray
from aicf_run.streams import stream_handle
from tests.test_bundle_format import make_payload, sha
from tests.test_run_cli import FakeDriver

W16 = (np.arange(6, dtype=np.float32).reshape(2, 3) / 3).astype(np.float16)


def fp16_payload(casts: bool = True) -> dict[str, Any]:
    """y = x + w with float16 storage and a float32 interface, like `--precision fp16`.

    With `casts`, module 1 holds the interface cast kernels and x and y name them."""
    payload = make_payload()
    for buf in payload["buffers"]:
        buf.update(dtype="float16", nbytes=12)
    payload["memory"]["weights_bytes"] = 12
    payload["weights"] = [{"buffer": 2, "data": W16.tobytes(), "sha256": sha(W16.tobytes())}]
    payload["kernels"][0]["symbol"] = "add_f16"
    payload["precision"] = "fp16"
    if casts:
        cubin = b"\x7fELF fake cast cubin"
        payload["modules"].append({"name": "add_io", "arch": "sm_90", "cubin": cubin,
                                   "cubin_sha256": sha(cubin), "source_sha256": sha("io"),
                                   "source": "io"})
        for item, symbol in ((payload["inputs"][0], "aicf_cast_float32_to_float16"),
                             (payload["outputs"][0], "aicf_cast_float16_to_float32")):
            item["cast"] = {"module": 1, "symbol": symbol, "grid": [1, 1, 1], "block": [256, 1, 1]}
    return payload


class FakeGpuTensor:
    """A torch-like tensor in fake GPU memory, exposing __cuda_array_interface__ only."""

    def __init__(self, driver: FakeDriver, array: np.ndarray, stream: int | None = None,
                 strides: tuple[int, ...] | None = None) -> None:
        self.driver, self.shape, self.dtype = driver, array.shape, array.dtype
        self.allocation = driver.mem_alloc(max(array.nbytes, 1))
        driver.write(int(self.allocation), array.tobytes())
        self.stream, self.strides = stream, strides

    @property
    def __cuda_array_interface__(self) -> dict:
        return {"shape": self.shape, "typestr": self.dtype.str, "version": 3,
                "data": (int(self.allocation), False), "strides": self.strides,
                "stream": self.stream}

    def numpy(self) -> np.ndarray:
        data = self.driver.read(int(self.allocation), int(np.prod(self.shape)) * self.dtype.itemsize)
        return np.frombuffer(data, self.dtype).reshape(self.shape)


class FakeDLPackTensor(FakeGpuTensor):
    """A JAX-like tensor: DLPack only."""

    def __init__(self, *args: Any, device: tuple[int, int] = (dlpack.KDL_CUDA, 0), **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.device, self.consumer_streams = device, []

    __cuda_array_interface__ = None   # type: ignore[assignment]

    def __getattribute__(self, name: str) -> Any:
        if name == "__cuda_array_interface__":
            raise AttributeError(name)
        return super().__getattribute__(name)

    def __dlpack_device__(self) -> tuple[int, int]:
        return self.device

    def __dlpack__(self, stream: int | None = None) -> Any:
        self.consumer_streams.append(stream)
        return dlpack.make_capsule(int(self.allocation), self.shape, self.dtype.name,
                                   self.device[0], self.device[1], self)


@pytest.fixture
def ex16(fake_gpu: FakeDriver):
    executor = Executor(Bundle.from_payload(fp16_payload()), open_device(0))
    yield executor
    executor.device.close()


def _x() -> np.ndarray:
    return np.random.default_rng().standard_normal((2, 3)).astype(np.float32)


def _expected16(x: np.ndarray) -> np.ndarray:
    """x rounded to float16, plus w, rounded to float16, as float32: the fake kernel's math."""
    return (x.astype(np.float16).astype(np.float32) + W16.astype(np.float32)).astype(np.float16).astype(np.float32)


def _casts(driver: FakeDriver) -> list[str]:
    return [launch[0] for launch in driver.launches if launch[0].startswith("aicf_cast_")]


def test_numpy_path_converts_on_the_gpu(ex16: Executor, fake_gpu: FakeDriver) -> None:
    x = _x()
    fake_gpu.launches.clear()
    y = ex16.run({"x": x})["y"]
    assert isinstance(y, np.ndarray) and y.dtype == np.float32
    np.testing.assert_array_equal(y, _expected16(x))
    assert _casts(fake_gpu) == ["aicf_cast_float32_to_float16", "aicf_cast_float16_to_float32"]


def test_old_bundle_converts_numpy_on_the_host_with_the_same_bits(fake_gpu: FakeDriver) -> None:
    x = _x()
    old = Executor(Bundle.from_payload(fp16_payload(casts=False)), open_device(0))
    new = Executor(Bundle.from_payload(fp16_payload()), old.device)
    fake_gpu.launches.clear()
    from_host = old.run({"x": x})["y"]
    assert _casts(fake_gpu) == []
    np.testing.assert_array_equal(from_host, new.run({"x": x})["y"])
    old.device.close()


@pytest.mark.parametrize("kind", [FakeGpuTensor, FakeDLPackTensor])
def test_device_tensors_in_and_out_without_host_copies(ex16: Executor, fake_gpu: FakeDriver,
                                                        kind: type) -> None:
    x = _x()
    expected = ex16.run({"x": x})["y"]
    tensor = kind(fake_gpu, x)
    fake_gpu.copy_kinds.clear()
    out = ex16.run({"x": tensor})
    assert fake_gpu.copy_kinds == [], "no host copy and no extra device copy on the device path"
    y = out["y"]
    assert isinstance(y, DeviceArray) and y.dtype == np.float32 and y.shape == (2, 3)
    np.testing.assert_array_equal(y.numpy(), expected)
    assert fake_gpu.copy_kinds == ["dtoh"]   # .numpy() is the one explicit copy


def test_storage_dtype_tensors_are_copied_not_converted(ex16: Executor, fake_gpu: FakeDriver) -> None:
    x = _x()
    x16 = FakeGpuTensor(fake_gpu, x.astype(np.float16))
    out16 = FakeGpuTensor(fake_gpu, np.full((2, 3), np.nan, np.float16))
    out32 = FakeGpuTensor(fake_gpu, np.full((2, 3), np.nan, np.float32))
    fake_gpu.launches.clear()
    fake_gpu.copy_kinds.clear()
    result = ex16.run({"x": x16}, outputs={"y": out16})
    assert result["y"] is out16 and _casts(fake_gpu) == [] and fake_gpu.copy_kinds == ["dtod", "dtod"]
    np.testing.assert_array_equal(out16.numpy().astype(np.float32), _expected16(x))
    fake_gpu.launches.clear()
    ex16.run({"x": x16}, outputs={"y": out32})
    assert _casts(fake_gpu) == ["aicf_cast_float16_to_float32"]
    np.testing.assert_array_equal(out32.numpy(), _expected16(x))


def test_fp32_bundle_returns_its_arena_output_in_place(fake_gpu: FakeDriver) -> None:
    executor = Executor(Bundle.from_payload(make_payload()), open_device(0))
    x = _x()
    fake_gpu.copy_kinds.clear()
    y = executor.run({"x": FakeGpuTensor(fake_gpu, x)})["y"]
    assert fake_gpu.copy_kinds == ["dtod"]   # the input into the arena, nothing else
    assert y.ptr == executor._outputs[0].pointer
    from tests.test_bundle_format import WEIGHT
    np.testing.assert_array_equal(y.numpy(), x + WEIGHT)
    # Numpy in, numpy out, unless asked otherwise.
    assert isinstance(executor.run({"x": x})["y"], np.ndarray)
    assert isinstance(executor.run({"x": x}, device_outputs=True)["y"], DeviceArray)
    executor.device.close()


def test_old_bundle_refuses_device_tensors_that_need_a_cast(fake_gpu: FakeDriver) -> None:
    executor = Executor(Bundle.from_payload(fp16_payload(casts=False)), open_device(0))
    with pytest.raises(RunError, match=r"^input 'x' is float32 at the interface and float16 "
                                       r"on the device.*recompile") as err:
        executor.run({"x": FakeGpuTensor(fake_gpu, _x())})
    assert "\n" not in str(err.value)
    executor.device.close()


@pytest.mark.parametrize("make, message", [
    (lambda d: FakeGpuTensor(d, np.zeros((3, 2), np.float32)), r"has shape \[3, 2\], expected \[2, 3\]"),
    (lambda d: FakeGpuTensor(d, np.zeros((2, 3), np.float64)), r"has dtype float64, expected float32 or float16"),
    (lambda d: FakeGpuTensor(d, np.zeros((2, 3), np.float32), strides=(4, 8)), r"is not contiguous"),
    (lambda d: FakeDLPackTensor(d, np.zeros((2, 3), np.float32), device=(dlpack.KDL_CUDA, 1)),
     r"is on GPU 1 but the bundle is loaded on GPU 0"),
    (lambda d: FakeDLPackTensor(d, np.zeros((2, 3), np.float32), device=(8, 0)), r"is on a metal device"),
    (lambda d: [[0.0] * 3] * 2, r"must be a numpy array or a GPU tensor"),
    (lambda d: np.zeros((2, 3), np.float16), r"has dtype float16, expected float32"),
])
def test_bad_tensors_are_one_line_errors(ex16: Executor, fake_gpu: FakeDriver, make: Any,
                                         message: str) -> None:
    with pytest.raises(RunError, match=message) as err:
        ex16.run({"x": make(fake_gpu)})
    assert "\n" not in str(err.value) and str(err.value).startswith("input 'x'")


def test_cai_pointer_outside_gpu_memory_is_refused(ex16: Executor, fake_gpu: FakeDriver) -> None:
    tensor = FakeGpuTensor(fake_gpu, _x())
    tensor.allocation.base += 0x100_0000_0000   # not an allocation of the fake GPU
    with pytest.raises(RunError, match=r"pointer 0x[0-9a-f]+ is not GPU memory"):
        ex16.run({"x": tensor})


def test_outputs_must_be_gpu_tensors(ex16: Executor) -> None:
    with pytest.raises(RunError, match=r"outputs\['y'\] is a numpy array"):
        ex16.run({"x": _x()}, outputs={"y": np.zeros((2, 3), np.float32)})
    with pytest.raises(RunError, match=r"unknown output 'z'"):
        ex16.run({"x": _x()}, outputs={"z": np.zeros((2, 3), np.float32)})


def test_cpu_dlpack_tensors_take_the_numpy_path(ex16: Executor, fake_gpu: FakeDriver) -> None:
    x = _x()

    class CpuTensor:   # a CPU torch tensor, as far as DLPack goes
        def __dlpack__(self, **kwargs: Any) -> Any:
            return x.__dlpack__()

        def __dlpack_device__(self) -> tuple[int, int]:
            return (dlpack.KDL_CPU, 0)

    np.testing.assert_array_equal(ex16.run({"x": CpuTensor()})["y"], _expected16(x))


def test_caller_stream_is_joined_both_ways(ex16: Executor, fake_gpu: FakeDriver) -> None:
    ours = ex16.stream.handle
    libcuda = fake_gpu.libcuda

    class TorchStream:
        cuda_stream = 0x7777

    x = _x()
    out = ex16.run({"x": FakeGpuTensor(fake_gpu, x)}, stream=TorchStream())
    assert libcuda.joins == [(0x7777, ours), (ours, 0x7777)]
    y = out["y"]
    assert y.stream == 0x7777 and y.__cuda_array_interface__["stream"] == 0x7777
    libcuda.joins.clear()
    capsule = y.__dlpack__(stream=0x8888)   # a consumer on yet another stream waits for the run
    assert libcuda.joins == [(0x7777, 0x8888)]
    del capsule
    # A producer's stream (__cuda_array_interface__ v3) is waited for before the reads.
    libcuda.joins.clear()
    ex16.run({"x": FakeGpuTensor(fake_gpu, x, stream=0x9999)})
    assert libcuda.joins == [(0x9999, ours)]
    # Without stream= the run waits for the GPU itself: its outputs carry no stream.
    assert ex16.run({"x": FakeGpuTensor(fake_gpu, x)})["y"].stream is None


def test_dlpack_inputs_get_our_stream(ex16: Executor, fake_gpu: FakeDriver) -> None:
    tensor = FakeDLPackTensor(fake_gpu, _x())
    ex16.run({"x": tensor})
    assert tensor.consumer_streams == [ex16.stream.handle]


@pytest.mark.parametrize("stream", ["0x10", -1, True, 1.5])
def test_bad_stream_is_one_line(ex16: Executor, stream: Any) -> None:
    with pytest.raises(RunError, match=r"^stream= must be a CUDA stream handle"):
        ex16.run({"x": _x()}, stream=stream)


def test_stream_handles() -> None:
    class PyCudaStream:
        handle = 12

    class CupyStream:
        ptr = 13

    assert [stream_handle(s) for s in (None, 0, 11, PyCudaStream(), CupyStream())] == [None, 0, 11, 12, 13]


def test_device_array_exports_through_both_protocols(ex16: Executor, fake_gpu: FakeDriver) -> None:
    y = ex16.run({"x": FakeGpuTensor(fake_gpu, _x())})["y"]
    cai = y.__cuda_array_interface__
    assert cai["shape"] == (2, 3) and cai["typestr"] == "<f4" and cai["data"] == (y.ptr, False)
    assert cai["version"] == 3 and cai["strides"] is None
    assert y.__dlpack_device__() == (dlpack.KDL_CUDA, 0)
    before = dlpack.exported_count()
    capsule = y.__dlpack__(stream=None)
    described = dlpack.read_capsule(capsule, "y")
    assert (described.pointer, described.shape, described.dtype, described.strides) == (y.ptr, (2, 3), "float32", None)
    assert (described.device_type, described.device_id) == (dlpack.KDL_CUDA, 0)
    assert dlpack.exported_count() == before + 1
    del capsule   # never consumed: its destructor calls the deleter
    gc.collect()
    assert dlpack.exported_count() == before
    with pytest.raises(BufferError):
        y.__dlpack__(dl_device=(dlpack.KDL_CPU, 0))


def test_dlpack_capsules_match_numpy() -> None:
    """The struct layout against numpy's own producer and consumer."""
    a = np.arange(24, dtype=np.float16).reshape(4, 6)[:, ::2]
    described = dlpack.read_capsule(a.__dlpack__(), "a")
    assert described.pointer == a.ctypes.data and described.shape == (4, 3)
    assert described.strides == (6, 2) and described.dtype == "float16"
    assert described.device_type == dlpack.KDL_CPU
    for dtype in ("int64", "int32", "uint8", "bool", "float32", "float64"):
        b = np.ones((2, 5), dtype)
        assert dlpack.read_capsule(b.__dlpack__(), "b").dtype == dtype
    source = np.random.default_rng().standard_normal((3, 4)).astype(np.float32)

    class Host:
        def __dlpack__(self, **kwargs: Any) -> Any:
            return dlpack.make_capsule(source.ctypes.data, source.shape, "float32",
                                       dlpack.KDL_CPU, 0, source)

        def __dlpack_device__(self) -> tuple[int, int]:
            return (dlpack.KDL_CPU, 0)

    before = dlpack.exported_count()
    shared = np.from_dlpack(Host())
    assert shared.ctypes.data == source.ctypes.data
    np.testing.assert_array_equal(shared, source)
    assert dlpack.exported_count() == before + 1
    del shared
    gc.collect()
    assert dlpack.exported_count() == before   # numpy called our deleter


def test_consumed_capsule_is_refused() -> None:
    capsule = np.zeros(3, np.float32).__dlpack__()
    ctypes.pythonapi.PyCapsule_SetName.argtypes = [ctypes.py_object, ctypes.c_char_p]
    ctypes.pythonapi.PyCapsule_SetName(capsule, dlpack.USED_CAPSULE_NAME)
    with pytest.raises(RunError, match="already consumed"):
        dlpack.read_capsule(capsule, "x")
    ctypes.pythonapi.PyCapsule_SetName(capsule, dlpack.CAPSULE_NAME)   # let numpy free it


def test_run_after_close_and_outputs_survive_only_until_the_next_run(ex16: Executor,
                                                                      fake_gpu: FakeDriver) -> None:
    x1, x2 = _x(), _x()
    first = ex16.run({"x": FakeGpuTensor(fake_gpu, x1)})["y"]
    ex16.run({"x": FakeGpuTensor(fake_gpu, x2)})
    np.testing.assert_array_equal(first.numpy(), _expected16(x2))   # [Note: output lifetime]


# --- the bundle's cast records ---


@pytest.mark.parametrize("mutate, message", [
    (lambda p: p["inputs"][0]["cast"].update(module=5), r"inputs\[0\]\.cast\.module: is 5"),
    (lambda p: p["inputs"][0]["cast"].update(extra=1), r"inputs\[0\]\.cast: has unknown keys"),
    (lambda p: p["outputs"][0]["cast"].update(block=[2048, 1, 1]), r"outputs\[0\]\.cast\.block"),
    (lambda p: p["inputs"][0]["cast"].update(symbol=""), r"inputs\[0\]\.cast\.symbol: is empty"),
])
def test_schema_checks_cast_records(mutate: Any, message: str) -> None:
    payload = fp16_payload()
    mutate(payload)
    with pytest.raises(RunError, match=message):
        Bundle.from_payload(payload)


def test_schema_refuses_a_cast_on_an_unconverted_tensor() -> None:
    payload = make_payload()
    payload["inputs"][0]["cast"] = copy.deepcopy(fp16_payload()["inputs"][0]["cast"])
    payload["modules"].append(fp16_payload()["modules"][1])
    with pytest.raises(RunError, match=r"inputs\[0\]\.cast: converts nothing"):
        Bundle.from_payload(payload)


@pytest.mark.parametrize("precision, storage", [("fp16", "float16"), ("bf16", "bfloat16")])
def test_compiler_records_interface_casts(precision: str, storage: str) -> None:
    from aicfc.driver import compile_model
    from examples.build_examples import build_mlp
    payload = compile_model(build_mlp(np.random.default_rng(1)), precision=precision, jobs=2)
    bundle = Bundle.from_payload(payload)
    module = bundle.modules[-1]
    assert module["name"].endswith("_io") and not any(k["module"] == len(bundle.modules) - 1 for k in bundle.kernels)
    for item, pair in ((bundle.inputs[0], ("float32", storage)), (bundle.outputs[0], (storage, "float32"))):
        numel = int(np.prod(item["shape"]))
        cast = item["cast"]
        assert cast["symbol"] == f"aicf_cast_{pair[0]}_to_{pair[1]}" and cast["symbol"] in module["source"]
        assert cast["module"] == len(bundle.modules) - 1
        assert cast["block"] == [256, 1, 1] and cast["grid"][0] * 256 >= min(numel, 8192 * 256)
    logged = [d for d in payload["decisions"] if d["kind"] == "io_cast"]
    assert [d["tensor"] for d in logged] == [bundle.inputs[0]["name"], bundle.outputs[0]["name"]]
    fp32 = compile_model(build_mlp(np.random.default_rng(1)), precision="fp32", jobs=2)
    assert not any("cast" in item for item in fp32["inputs"] + fp32["outputs"])
    assert not any(m["name"].endswith("_io") for m in fp32["modules"])
