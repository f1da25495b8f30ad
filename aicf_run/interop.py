"""Tensors of other libraries in and out of `Executor.run`, without a host round trip.

In: anything with `__cuda_array_interface__` (torch, CuPy, Numba; read first, it is a plain
dict) or with `__dlpack__`/`__dlpack_device__` (JAX, torch, CuPy; aicf_run.dlpack) becomes a
`DeviceView`: a pointer the executor copies from, or runs a cast kernel on, within one run.
CPU tensors that speak DLPack become numpy arrays (zero copy) and take the numpy path.

Out: a `DeviceArray` over the executor's own device memory, which torch, CuPy and JAX read in
place (`torch.from_dlpack`, `cupy.asarray`, `jax.dlpack.from_dlpack`) through either protocol.

Everything here is checked before a byte moves, so every mistake is one line naming the tensor
and the fix, and all of it runs without a GPU (the tests feed fake tensors).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from aicf_run import dlpack
from aicf_run.errors import RunError
from aicf_run.schema import ITEMSIZE


@dataclass(frozen=True, eq=False)
class DeviceView:
    """A caller's compact row-major tensor in GPU memory, borrowed for one run.

    `stream` is the stream its producer said the data is being written on
    (`__cuda_array_interface__` v3), which the run waits for; `keep` holds what keeps the
    memory valid meanwhile (the object, or the DLPack capsule).
    """

    pointer: int
    shape: tuple[int, ...]
    dtype: str
    stream: int | None
    keep: Any
    protocol: str

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * _itemsize(self.dtype)


def is_device_tensor(value: Any) -> bool:
    return not isinstance(value, np.ndarray) and (
        hasattr(value, "__cuda_array_interface__") or hasattr(value, "__dlpack__"))


def view(value: Any, what: str, device_id: int, consumer_stream: int,
         pointer_device: Callable[[int], int | None] | None = None) -> np.ndarray | DeviceView:
    """`value` as a numpy array (host) or a DeviceView (GPU `device_id`); RunError otherwise.

    `consumer_stream` is passed to `__dlpack__(stream=)`, so the producer orders its pending
    writes before our reads; `pointer_device(pointer)` (the driver's answer) checks where a
    `__cuda_array_interface__` pointer lives, as that protocol does not say.
    """
    if isinstance(value, np.ndarray):
        return value
    if hasattr(value, "__cuda_array_interface__"):
        return _from_cai(value, what, device_id, pointer_device)
    if hasattr(value, "__dlpack__") and hasattr(value, "__dlpack_device__"):
        device_type, device = _dlpack_device(value, what)
        if device_type == dlpack.KDL_CPU:
            try:
                return np.from_dlpack(value)
            except (TypeError, ValueError, BufferError, RuntimeError) as err:
                raise RunError(f"{what}: cannot read this CPU tensor through DLPack "
                               f"({_one_line(err)}); pass a numpy array") from None
        if device_type not in (dlpack.KDL_CUDA, dlpack.KDL_CUDA_MANAGED):
            name = dlpack.DEVICE_NAMES.get(device_type, f"DLPack device type {device_type}")
            raise RunError(f"{what} is on a {name} device; pass a numpy array or a CUDA tensor")
        if device != device_id:
            raise RunError(f"{what} is on GPU {device} but the bundle is loaded on GPU "
                           f"{device_id}; move it there first (e.g. tensor.to('cuda:{device_id}'))")
        try:
            capsule = value.__dlpack__(stream=consumer_stream)
        except (TypeError, ValueError, BufferError, RuntimeError) as err:
            raise RunError(f"{what}: __dlpack__ failed ({_one_line(err)})") from None
        described = dlpack.read_capsule(capsule, what)
        if (described.device_type, described.device_id) != (device_type, device):
            raise RunError(f"{what}: __dlpack__ and __dlpack_device__ disagree on the device; "
                           f"the producer is broken")
        itemsize = _itemsize(described.dtype)
        strides = None if described.strides is None else tuple(s * itemsize for s in described.strides)
        _check_layout(what, described.pointer, described.shape, strides, described.dtype)
        return DeviceView(described.pointer, described.shape, described.dtype, None, capsule, "DLPack")
    raise RunError(f"{what} must be a numpy array or a GPU tensor (with __cuda_array_interface__ "
                   f"or __dlpack__), got {type(value).__name__}")


def check_tensors(given: Mapping[str, Any], items: list[dict], buffers: list[dict], kind: str,
                  make_view: Callable[[Any, str], np.ndarray | DeviceView],
                  require_all: bool = True) -> dict[str, np.ndarray | DeviceView]:
    """Check `given` ({name: tensor}) against the bundle's `items` (inputs or outputs).

    A numpy array must have the interface dtype; a GPU tensor the interface dtype (converted on
    the GPU) or the storage dtype of the tensor's buffer (copied as is: e.g. float16 tensors
    straight into an fp16 bundle whose interface is float32). Shapes are exact.
    """
    expected = {item["name"]: item for item in items}
    for name in given:
        if name not in expected:
            raise RunError(f"unknown {kind} {name!r}; the bundle's {kind}s are "
                           f"{', '.join(expected) or 'none'}")
    checked: dict[str, np.ndarray | DeviceView] = {}
    for name, item in expected.items():
        shape = list(item["shape"])
        want = f"{item['dtype']} {shape}"
        if name not in given:
            if require_all:
                raise RunError(f"missing {kind} {name!r} ({want}); pass {kind}s[{name!r}]")
            continue
        what = f"{kind} {name!r}"
        tensor = make_view(given[name], what)
        if isinstance(tensor, np.ndarray):
            if tensor.dtype.name != item["dtype"] or tensor.dtype.hasobject:
                raise RunError(f"{what} has dtype {tensor.dtype}, expected {item['dtype']}; "
                               f"convert it, e.g. array.astype(numpy.{item['dtype']})")
            if list(tensor.shape) != shape:
                raise RunError(f"{what} has shape {list(tensor.shape)}, expected {shape} ({want})")
            tensor = np.ascontiguousarray(tensor, dtype=tensor.dtype.newbyteorder("="))
        else:
            storage = buffers[item["buffer"]]["dtype"]
            allowed = dict.fromkeys((item["dtype"], storage))
            if tensor.dtype not in allowed:
                raise RunError(f"{what} has dtype {tensor.dtype}, expected "
                               f"{' or '.join(allowed)}; convert it on the GPU first "
                               f"(e.g. tensor.to(torch.{item['dtype']}))")
            if list(tensor.shape) != shape:
                raise RunError(f"{what} has shape {list(tensor.shape)}, expected {shape} ({want})")
        checked[name] = tensor
    return checked


class DeviceArray:
    """An output in the executor's GPU memory, readable in place through
    `__cuda_array_interface__` (v3) and DLPack (`torch.from_dlpack(out)`, `cupy.asarray(out)`).

    [Note: output lifetime] The memory belongs to the executor: it is valid until the next
    `run`/`launch` writes it again (or the executor closes), also while a torch/CuPy tensor
    made from it lives. Keep a result across runs by copying it (`tensor.clone()`), or pass
    your own tensors as `run(..., outputs={name: tensor})` and they are written instead.

    `stream` is the stream the run that wrote it was ordered on: None when the run already
    waited for the GPU, else the caller's `stream=`; a consumer's `__dlpack__(stream=s)` makes
    `s` wait for it through `wait(s, stream)`.
    """

    def __init__(self, pointer: int, shape: tuple[int, ...], dtype: str, device_id: int,
                 stream: int | None, wait: Callable[[int, int], None],
                 to_host: Callable[[DeviceArray], np.ndarray], owner: Any) -> None:
        self.ptr = pointer
        self.shape = tuple(shape)
        self.dtype = np.dtype(dtype)
        self.device_id = device_id
        self.stream = stream
        self._wait = wait
        self._to_host = to_host
        self._owner = owner   # the executor: its memory must outlive every export of it

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.size * self.dtype.itemsize

    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        # v3's stream: 0 is disallowed, the legacy default stream is 1.
        stream = None if self.stream is None else (self.stream or 1)
        return {"shape": self.shape, "typestr": self.dtype.str, "data": (self.ptr, False),
                "strides": None, "version": 3, "stream": stream}

    def __dlpack_device__(self) -> tuple[int, int]:
        return (dlpack.KDL_CUDA, self.device_id)

    def __dlpack__(self, *, stream: int | None = None, max_version: Any = None,
                   dl_device: Any = None, copy: bool | None = None) -> Any:
        if dl_device is not None and tuple(dl_device) != self.__dlpack_device__():
            raise BufferError(f"this output is on cuda:{self.device_id}; aicf-run does not copy "
                              f"it to {tuple(dl_device)} through DLPack (use .numpy())")
        if copy:
            raise BufferError("aicf-run outputs are shared, not copied, through DLPack; "
                              "clone the tensor after from_dlpack")
        # stream None/-1: the consumer orders nothing; 1 and 2 are the default streams' handles.
        if stream is not None and stream != -1 and self.stream is not None:
            self._wait(stream, self.stream)
        return dlpack.make_capsule(self.ptr, self.shape, self.dtype.name, dlpack.KDL_CUDA,
                                   self.device_id, self)

    def numpy(self) -> np.ndarray:
        """A host copy (waits for the GPU)."""
        return self._to_host(self)

    def __repr__(self) -> str:
        return (f"DeviceArray(shape={self.shape}, dtype={self.dtype.name}, "
                f"device=cuda:{self.device_id}, ptr={self.ptr:#x})")


def _from_cai(value: Any, what: str, device_id: int,
              pointer_device: Callable[[int], int | None] | None) -> DeviceView:
    try:
        cai = value.__cuda_array_interface__
    except (AttributeError, TypeError, RuntimeError) as err:   # torch: bfloat16 has no typestr
        raise RunError(f"{what}: __cuda_array_interface__ failed ({_one_line(err)}); pass it "
                       f"through DLPack instead") from None
    if not isinstance(cai, dict):
        raise RunError(f"{what}: __cuda_array_interface__ is not a dict; the producer is broken")
    try:
        shape = tuple(int(d) for d in cai["shape"])
        dtype = np.dtype(cai["typestr"])
        pointer = int(cai["data"][0] or 0)
        strides = None if cai.get("strides") is None else tuple(int(s) for s in cai["strides"])
        stream = cai.get("stream")
    except (KeyError, TypeError, ValueError, IndexError) as err:
        raise RunError(f"{what}: malformed __cuda_array_interface__ ({_one_line(err)})") from None
    if cai.get("mask") is not None:
        raise RunError(f"{what} has a mask (__cuda_array_interface__); pass a plain tensor")
    if dtype.byteorder == ">" or dtype.hasobject or dtype.name not in ITEMSIZE:
        raise RunError(f"{what} has dtype {dtype.str!r}, which aicf-run does not take; "
                       f"convert it to a native numeric dtype")
    if stream is not None and (isinstance(stream, bool) or not isinstance(stream, int) or stream == 0):
        raise RunError(f"{what}: __cuda_array_interface__ stream {stream!r} is not a stream "
                       f"handle (v3 forbids 0)")
    _check_layout(what, pointer, shape, strides, dtype.name)
    if pointer_device is not None and pointer and math.prod(shape):
        device = pointer_device(pointer)
        if device is None:
            raise RunError(f"{what}: its __cuda_array_interface__ pointer {pointer:#x} is not "
                           f"GPU memory this process can use")
        if device != device_id:
            raise RunError(f"{what} is on GPU {device} but the bundle is loaded on GPU "
                           f"{device_id}; move it there first (e.g. tensor.to('cuda:{device_id}'))")
    return DeviceView(pointer, shape, dtype.name, stream, value, "__cuda_array_interface__")


def _dlpack_device(value: Any, what: str) -> tuple[int, int]:
    try:
        device_type, device = value.__dlpack_device__()
        return int(device_type), int(device)
    except (TypeError, ValueError, AttributeError) as err:
        raise RunError(f"{what}: __dlpack_device__ failed ({_one_line(err)})") from None


def _check_layout(what: str, pointer: int, shape: tuple[int, ...],
                  strides: tuple[int, ...] | None, dtype: str) -> None:
    """Compact row-major, naturally aligned; `strides` in bytes, None meaning compact."""
    if any(d < 0 for d in shape):
        raise RunError(f"{what} has a negative extent in shape {list(shape)}")
    itemsize = _itemsize(dtype)
    if strides is not None:
        if len(strides) != len(shape):
            raise RunError(f"{what}: {len(strides)} strides for {len(shape)} dimensions")
        expected = itemsize
        for extent, stride in zip(reversed(shape), reversed(strides)):
            if extent != 1 and stride != expected:
                raise RunError(f"{what} is not contiguous (byte strides {list(strides)} for "
                               f"shape {list(shape)}); pass tensor.contiguous()")
            expected *= extent
    if pointer % itemsize and math.prod(shape):
        raise RunError(f"{what} starts at {pointer:#x}, not aligned to its {itemsize}-byte "
                       f"elements; pass tensor.contiguous().clone()")


def _itemsize(dtype: str) -> int:
    return ITEMSIZE[dtype]


def _one_line(err: BaseException) -> str:
    return " ".join(str(err).split())[:300] or type(err).__name__


