"""Dependent launches ([Note: PDL] in aicfc/codegen/pdl.py): a kernel the bundle marks
`"launch": "dependent"` is launched with `cuLaunchKernelEx` and the attribute
PROGRAMMATIC_STREAM_SERIALIZATION, so the GPU may start it while the kernel before it on the
stream is still finishing; the kernel itself waits (`griddepcontrol.wait`) before it touches
memory. The compiler decided that and put the wait in every such kernel; this module only
carries out the launch.

PyCUDA 2026.1 neither exposes a function's CUfunction nor has cuLaunchKernelEx, so the module
is loaded a second time through ctypes on `libcuda.so.1` (aicf_run.graph.libcuda, in the
context PyCUDA made current) and its functions are launched from here. Every argument of an
aicf kernel is a 64-bit device pointer (aicf_run.tensormap.arg_format), so the parameter block
is built once per kernel: one c_uint64 per argument and the array of their addresses.
Each CUresult other than CUDA_SUCCESS becomes a one-line RunError.
"""
from __future__ import annotations

import ctypes
from typing import Any, Sequence

from aicf_run.errors import RunError
from aicf_run.graph import error_name, libcuda

# cuda.h (CUDA 12/13)
ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION = 6    # CUlaunchAttributeID
FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8   # CUfunction_attribute


class _Attribute(ctypes.Structure):
    """CUlaunchAttribute: the id, padding to 8 bytes, the 64-byte value union."""
    _fields_ = [("id", ctypes.c_int), ("pad", ctypes.c_char * 4), ("value", ctypes.c_ubyte * 64)]


class _Config(ctypes.Structure):
    """CUlaunchConfig."""
    _fields_ = [("gridDimX", ctypes.c_uint), ("gridDimY", ctypes.c_uint), ("gridDimZ", ctypes.c_uint),
                ("blockDimX", ctypes.c_uint), ("blockDimY", ctypes.c_uint), ("blockDimZ", ctypes.c_uint),
                ("sharedMemBytes", ctypes.c_uint), ("hStream", ctypes.c_void_p),
                ("attrs", ctypes.POINTER(_Attribute)), ("numAttrs", ctypes.c_uint)]


_P = ctypes.c_void_p
_PROTOTYPES: dict[str, list[Any]] = {
    "cuModuleLoadData": [ctypes.POINTER(_P), ctypes.c_char_p],
    "cuModuleGetFunction": [ctypes.POINTER(_P), _P, ctypes.c_char_p],
    "cuModuleUnload": [_P],
    "cuFuncSetAttribute": [_P, ctypes.c_int, ctypes.c_int],
    "cuLaunchKernelEx": [ctypes.POINTER(_Config), _P, ctypes.POINTER(_P), ctypes.POINTER(_P)],
    "cuModuleGetGlobal_v2": [ctypes.POINTER(ctypes.c_uint64), ctypes.POINTER(ctypes.c_size_t), _P, ctypes.c_char_p],
    "cuMemcpyHtoD_v2": [ctypes.c_uint64, ctypes.c_void_p, ctypes.c_size_t],
}


def _lib() -> Any:
    lib = libcuda()
    for name, argtypes in _PROTOTYPES.items():
        function = getattr(lib, name, None)
        if function is None:
            raise RunError(f"the CUDA driver has no {name} (dependent launches need CUDA 12 or "
                           f"newer); update the driver or recompile with aicfc compile --no-pdl")
        function.restype = ctypes.c_int
        function.argtypes = argtypes
    return lib


def _check(lib: Any, call: str, result: int, what: str) -> None:
    if result != 0:
        raise RunError(f"{what}: {call} failed: {error_name(lib, result)} ({result}); recompile "
                       f"with aicfc compile --no-pdl if this driver cannot launch dependent kernels")


class Modules:
    """The bundle's cubins loaded through the driver API (unloaded by `close`)."""

    def __init__(self, cubins: Sequence[bytes]) -> None:
        self._lib = _lib()
        self.handles: list[int] = []
        try:
            for i, cubin in enumerate(cubins):
                handle = _P()
                _check(self._lib, "cuModuleLoadData", self._lib.cuModuleLoadData(ctypes.pointer(handle), cubin),
                       f"module {i}")
                self.handles.append(handle.value)
        except RunError:
            self.close()
            raise

    def function(self, module: int, symbol: str, smem_bytes: int, what: str) -> int:
        handle = _P()
        _check(self._lib, "cuModuleGetFunction",
               self._lib.cuModuleGetFunction(ctypes.pointer(handle), _P(self.handles[module]), symbol.encode()), what)
        if smem_bytes > 48 * 1024:
            _check(self._lib, "cuFuncSetAttribute",
                   self._lib.cuFuncSetAttribute(handle, FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, smem_bytes), what)
        return handle.value

    def global_address(self, module: int, symbol: str, what: str) -> tuple[int, int]:
        """(device address, bytes) of the module's global variable `symbol` in this instance."""
        address, size = ctypes.c_uint64(), ctypes.c_size_t()
        _check(self._lib, "cuModuleGetGlobal", self._lib.cuModuleGetGlobal_v2(
            ctypes.byref(address), ctypes.byref(size), _P(self.handles[module]), symbol.encode()), what)
        return address.value, size.value

    def write_global(self, module: int, symbol: str, data: bytes, what: str) -> None:
        """Copy `data` into the module's global (or constant) variable `symbol`, which must be
        exactly that size: a kernel's tensor maps in constant memory ([Note: TMA maps in constant
        memory] in aicfc/codegen/tma.py), in this instance of the module as in PyCUDA's."""
        address, size = self.global_address(module, symbol, what)
        if size != len(data):
            raise RunError(f"{what}: {symbol} holds {size} bytes, not the {len(data)} of its tensor maps; "
                           f"the bundle is inconsistent, recompile it with aicfc compile")
        _check(self._lib, "cuMemcpyHtoD", self._lib.cuMemcpyHtoD_v2(address, data, len(data)), what)

    def close(self) -> None:
        handles, self.handles = self.handles, []
        for handle in handles:
            self._lib.cuModuleUnload(_P(handle))


class DependentLaunch:
    """One kernel's launch with PROGRAMMATIC_STREAM_SERIALIZATION, its parameters built once."""

    def __init__(self, modules: Modules, function: int, grid: Sequence[int], block: Sequence[int],
                 smem_bytes: int, pointers: Sequence[int], what: str) -> None:
        self._lib = modules._lib
        self._function = _P(function)
        self._what = what
        self._values = (ctypes.c_uint64 * max(len(pointers), 1))(*pointers)
        self._params = (_P * max(len(pointers), 1))(
            *(ctypes.addressof(self._values) + 8 * i for i in range(len(pointers))))
        self._attribute = _Attribute(id=ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION)
        self._attribute.value[0] = 1   # programmaticStreamSerializationAllowed (an int, little-endian)
        self._config = _Config(*grid, *block, smem_bytes, None, ctypes.pointer(self._attribute), 1)

    def __call__(self, stream_handle: int) -> None:
        self._config.hStream = stream_handle
        result = self._lib.cuLaunchKernelEx(ctypes.byref(self._config), self._function, self._params, None)
        if result != 0:
            raise RunError(f"{self._what} failed to launch: cuLaunchKernelEx: {error_name(self._lib, result)} "
                           f"({result}); recompile with aicfc compile for this GPU")
