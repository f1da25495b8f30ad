"""DLPack capsules through ctypes: read the tensor a producer hands over, and hand ours out.

DLPack is the C ABI that torch, CuPy, JAX and numpy use to share tensors without copying: a
PyCapsule named "dltensor" holds a pointer to a `DLManagedTensor`, a `DLTensor` (data pointer,
device, shape, strides, dtype) plus the producer's `deleter`. The struct layout below is the
one of dlpack.h (v0.8, the unversioned ABI every producer still emits when the consumer passes
no `max_version`); no library is needed for five small structs.

[Note: capsule ownership] A consumer that only borrows (aicf_run copies out of a caller's
tensor within one run) leaves the capsule named "dltensor" and keeps it referenced while it
reads; when the capsule is collected, the producer's own capsule destructor calls the deleter.
A capsule we produce follows the same rule from the other side: a consumer that takes it
renames it "used_dltensor" and calls our deleter when it is done (torch: when the tensor dies);
a capsule nobody consumed is destroyed by `_capsule_destructor`, which calls the deleter
itself. The deleter drops the reference that kept the exported object alive.
"""

from __future__ import annotations

import ctypes
import itertools
import threading
from dataclasses import dataclass
from typing import Any

from aicf_run.errors import RunError

# DLDeviceType (dlpack.h).
KDL_CPU = 1
KDL_CUDA = 2
KDL_CUDA_HOST = 3
KDL_CUDA_MANAGED = 13
DEVICE_NAMES = {KDL_CPU: "cpu", KDL_CUDA: "cuda", KDL_CUDA_HOST: "cuda_host", 4: "opencl",
                7: "vulkan", 8: "metal", 10: "rocm", KDL_CUDA_MANAGED: "cuda_managed"}
# DLDataTypeCode: kDLInt 0, kDLUInt 1, kDLFloat 2, kDLBfloat 4, kDLBool 6. (code, bits) <-> name.
DTYPES: dict[tuple[int, int], str] = {
    (0, 8): "int8", (0, 16): "int16", (0, 32): "int32", (0, 64): "int64",
    (1, 8): "uint8", (1, 16): "uint16", (1, 32): "uint32", (1, 64): "uint64",
    (2, 16): "float16", (2, 32): "float32", (2, 64): "float64", (4, 16): "bfloat16",
    (6, 8): "bool",
}
CODES = {name: key for key, name in DTYPES.items()}

CAPSULE_NAME = b"dltensor"
USED_CAPSULE_NAME = b"used_dltensor"


class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", DLDevice), ("ndim", ctypes.c_int32),
                ("dtype", DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


class DLManagedTensor(ctypes.Structure):
    pass


DELETER = ctypes.CFUNCTYPE(None, ctypes.POINTER(DLManagedTensor))
DLManagedTensor._fields_ = [("dl_tensor", DLTensor), ("manager_ctx", ctypes.c_void_p),
                            ("deleter", DELETER)]

# The capsule C API. Destructors get the dying capsule as a raw pointer: passing it as a
# py_object would take a reference to an object being deallocated.
_api = ctypes.pythonapi
_is_valid = _api.PyCapsule_IsValid
_is_valid.argtypes, _is_valid.restype = [ctypes.py_object, ctypes.c_char_p], ctypes.c_int
_get_pointer = _api.PyCapsule_GetPointer
_get_pointer.argtypes, _get_pointer.restype = [ctypes.py_object, ctypes.c_char_p], ctypes.c_void_p
_raw_is_valid = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_char_p)(
    ("PyCapsule_IsValid", _api))
_raw_get_pointer = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_char_p)(
    ("PyCapsule_GetPointer", _api))
_DESTRUCTOR = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
_new_capsule = _api.PyCapsule_New
_new_capsule.argtypes = [ctypes.c_void_p, ctypes.c_char_p, _DESTRUCTOR]
_new_capsule.restype = ctypes.py_object


@dataclass(frozen=True)
class Described:
    """What a DLTensor says: `strides` in elements, None when the tensor is compact row-major."""

    pointer: int
    shape: tuple[int, ...]
    strides: tuple[int, ...] | None
    dtype: str
    device_type: int
    device_id: int


def read_capsule(capsule: Any, what: str) -> Described:
    """The tensor in a "dltensor" capsule (borrowed: see [Note: capsule ownership])."""
    if not _is_valid(capsule, CAPSULE_NAME):
        used = _is_valid(capsule, USED_CAPSULE_NAME)
        raise RunError(f"{what}: __dlpack__() returned "
                       + ("a capsule that was already consumed" if used else
                          f"{type(capsule).__name__}, not a DLPack 'dltensor' capsule")
                       + "; pass the tensor itself, not a capsule")
    managed = DLManagedTensor.from_address(_get_pointer(capsule, CAPSULE_NAME))
    tensor = managed.dl_tensor
    code, bits, lanes = tensor.dtype.code, tensor.dtype.bits, tensor.dtype.lanes
    if lanes != 1 or (code, bits) not in DTYPES:
        raise RunError(f"{what}: DLPack dtype (code {code}, {bits} bits, {lanes} lanes) is not "
                       f"one aicf-run handles; pass {', '.join(sorted(set(DTYPES.values())))}")
    ndim = tensor.ndim
    if not 0 <= ndim <= 64:
        raise RunError(f"{what}: DLPack tensor claims {ndim} dimensions; the producer is broken")
    shape = tuple(tensor.shape[i] for i in range(ndim))
    strides = tuple(tensor.strides[i] for i in range(ndim)) if tensor.strides else None
    return Described(pointer=(tensor.data or 0) + tensor.byte_offset, shape=shape,
                     strides=strides, dtype=DTYPES[code, bits],
                     device_type=tensor.device.device_type, device_id=tensor.device.device_id)


# Exported tensors alive in some consumer: manager_ctx -> (struct, shape array, owner). The
# deleter removes the entry, which drops the last reference to the owner.
_exported: dict[int, tuple[Any, Any, Any]] = {}
_lock = threading.Lock()
_ids = itertools.count(1)


@DELETER
def _deleter(managed: Any) -> None:
    with _lock:
        _exported.pop(managed.contents.manager_ctx or 0, None)


@_DESTRUCTOR
def _capsule_destructor(capsule: int) -> None:
    # Consumed capsules were renamed; an unconsumed one still owns its tensor.
    if _raw_is_valid(capsule, CAPSULE_NAME):
        pointer = _raw_get_pointer(capsule, CAPSULE_NAME)
        if pointer:
            managed = ctypes.cast(pointer, ctypes.POINTER(DLManagedTensor))
            managed.contents.deleter(managed)


def make_capsule(pointer: int, shape: tuple[int, ...], dtype: str, device_type: int,
                 device_id: int, owner: Any) -> Any:
    """A "dltensor" capsule over `pointer` (compact row-major), keeping `owner` alive until the
    consumer calls the deleter (or the unconsumed capsule is destroyed)."""
    code, bits = CODES[dtype]
    dims = (ctypes.c_int64 * max(len(shape), 1))(*shape)
    managed = DLManagedTensor()
    managed.dl_tensor = DLTensor(data=pointer or None, device=DLDevice(device_type, device_id),
                                 ndim=len(shape), dtype=DLDataType(code, bits, 1),
                                 shape=ctypes.cast(dims, ctypes.POINTER(ctypes.c_int64)),
                                 strides=None, byte_offset=0)
    with _lock:
        key = next(_ids)
        _exported[key] = (managed, dims, owner)
    managed.manager_ctx = key
    managed.deleter = _deleter
    return _new_capsule(ctypes.addressof(managed), CAPSULE_NAME, _capsule_destructor)


def exported_count() -> int:
    """How many exported tensors are still held by a consumer (for tests: leaks show here)."""
    with _lock:
        return len(_exported)
