"""Order the executor's stream with other libraries' streams, through the driver API.

A caller's stream is a raw CUstream handle (torch's `current_stream().cuda_stream`, CuPy's
`Stream.ptr`, a PyCUDA Stream's `.handle`): PyCUDA cannot launch on a handle it did not make,
so the executor keeps working on its own stream and joins the caller's around each run. "B
waits for A" is one event recorded on A and `cuStreamWaitEvent(B, event)`: the wait captures
the event's latest record at the time of the call, so one event may be recorded again as soon
as the wait is enqueued, and a pair of events serves every run. Nothing here blocks the host.

The calls go to `libcuda` through aicf_run.graph's loader (tests inject a fake there), with
every argument wrapped in its ctypes type, so no prototypes are needed.
"""

from __future__ import annotations

import ctypes
from typing import Any

from aicf_run import graph as _graph
from aicf_run.errors import RunError

# cuEventCreate flags: CU_EVENT_DISABLE_TIMING, the cheapest event to record and wait on.
EVENT_DISABLE_TIMING = 0x2
# CUpointer_attribute (cuda.h).
POINTER_ATTRIBUTE_MEMORY_TYPE = 2
POINTER_ATTRIBUTE_DEVICE_ORDINAL = 9
MEMORYTYPE_HOST = 1
# CU_STREAM_LEGACY: the legacy default stream, the handle 0 stands for in the runtime API.
LEGACY_STREAM = 1


def stream_handle(stream: Any) -> int | None:
    """The CUstream of a `stream=` argument: None, an int handle, a PyCUDA Stream (`.handle`),
    a torch.cuda.Stream (`.cuda_stream`) or a CuPy Stream (`.ptr`)."""
    if stream is None:
        return None
    handle = stream
    if not isinstance(stream, int):
        for attribute in ("handle", "cuda_stream", "ptr"):
            value = getattr(stream, attribute, None)
            if value is not None:
                handle = value
                break
    if isinstance(handle, bool) or not isinstance(handle, int) or handle < 0:
        raise RunError(f"stream= must be a CUDA stream handle (an int such as "
                       f"torch.cuda.current_stream().cuda_stream) or a PyCUDA/torch/CuPy stream, "
                       f"got {type(stream).__name__} {stream!r:.40}")
    return handle


class Joiner:
    """Two reusable events that make one stream wait for another's work so far."""

    def __init__(self) -> None:
        self._lib: Any = None
        self._events: list[int] = []

    def wait(self, waiter: int, producer: int, slot: int = 0) -> None:
        """Enqueue on `waiter` a wait for everything enqueued on `producer` so far."""
        if waiter == producer:
            return
        lib, event = self._library(), self._event(slot)
        _check(lib, "cuEventRecord", lib.cuEventRecord(ctypes.c_void_p(event),
                                                        ctypes.c_void_p(producer)))
        _check(lib, "cuStreamWaitEvent", lib.cuStreamWaitEvent(
            ctypes.c_void_p(waiter), ctypes.c_void_p(event), ctypes.c_uint(0)))

    def pointer_device(self, pointer: int) -> int | None:
        """The ordinal of the GPU whose memory `pointer` is in; None for host memory (or a
        pointer the driver does not know, e.g. from another process)."""
        lib = self._library()
        memory_type = ctypes.c_int(0)
        result = lib.cuPointerGetAttribute(ctypes.pointer(memory_type),
                                           ctypes.c_int(POINTER_ATTRIBUTE_MEMORY_TYPE),
                                           ctypes.c_uint64(pointer))
        if result != 0 or memory_type.value == MEMORYTYPE_HOST:
            return None
        ordinal = ctypes.c_int(-1)
        _check(lib, "cuPointerGetAttribute", lib.cuPointerGetAttribute(
            ctypes.pointer(ordinal), ctypes.c_int(POINTER_ATTRIBUTE_DEVICE_ORDINAL),
            ctypes.c_uint64(pointer)))
        return ordinal.value

    def close(self) -> None:
        """Destroy the events (before the context goes); failures are ignored, as a lost
        context frees everything when it goes."""
        for event in self._events:
            self._lib.cuEventDestroy_v2(ctypes.c_void_p(event))
        self._events = []

    def _library(self) -> Any:
        if self._lib is None:
            self._lib = _graph.libcuda()
        return self._lib

    def _event(self, slot: int) -> int:
        lib = self._library()
        while len(self._events) <= slot:
            handle = ctypes.c_void_p()
            _check(lib, "cuEventCreate", lib.cuEventCreate(ctypes.pointer(handle),
                                                           ctypes.c_uint(EVENT_DISABLE_TIMING)))
            self._events.append(handle.value)
        return self._events[slot]


def _check(lib: Any, call: str, result: int) -> None:
    if result != 0:
        raise RunError(f"{call} failed: {_graph.error_name(lib, result)} ({result}); check that "
                       f"stream= is a live stream of this GPU's primary context")
