"""CUDA graphs through the driver API: capture what a callable enqueues on a stream, replay it.

A launch plan of many small kernels spends more time in the host's launch calls than on the
GPU. Captured once into a graph, the whole plan is one `cuGraphLaunch`: the driver submits
every kernel node at once, with the launch parameters it recorded at capture.

PyCUDA 2026.1 has no graph API, so the calls go through ctypes to `libcuda.so.1`, the same
driver library PyCUDA is linked against: its handles (`Stream.handle` is the CUstream) and its
current context are the ones these calls see. Every CUresult other than CUDA_SUCCESS becomes
a one-line RunError naming the call and the driver's name for the error.

What may be captured: kernel launches and async copies on the one stream being captured.
Anything that synchronizes, allocates or touches the legacy default stream while the capture
is open invalidates it (the capture mode is THREAD_LOCAL: only this thread is restricted), and
the error surfaces at `cuStreamEndCapture`. The captured kernels keep the device pointers they
were launched with, so the memory they use must not move while the graph exists.
"""

from __future__ import annotations

import ctypes
import functools
import gc
from collections.abc import Callable
from typing import Any

from aicf_run.errors import RunError

LIBRARY = "libcuda.so.1"
# CUstreamCaptureMode (cuda.h).
CAPTURE_MODE_GLOBAL = 0
CAPTURE_MODE_THREAD_LOCAL = 1
CAPTURE_MODE_RELAXED = 2
_NO_GRAPH_HINT = "run without a CUDA graph (aicf-run --no-graph, or graph=False)"

_P = ctypes.c_void_p
# Prototypes of the driver calls used here (cuda.h, CUDA 12/13); CUresult is an int enum. The
# plain symbols, not the _ptsz ones: the stream is always named, so the default-stream flavour
# does not matter. cuGraphInstantiate is the exported 5-argument (CUDA 10) form, the fallback
# for drivers older than 11.4 that lack cuGraphInstantiateWithFlags.
_PROTOTYPES: dict[str, list[Any]] = {
    "cuGetErrorName": [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)],
    "cuStreamBeginCapture_v2": [_P, ctypes.c_int],
    "cuStreamEndCapture": [_P, ctypes.POINTER(_P)],
    "cuGraphInstantiateWithFlags": [ctypes.POINTER(_P), _P, ctypes.c_ulonglong],
    "cuGraphInstantiate": [ctypes.POINTER(_P), _P, _P, ctypes.c_char_p, ctypes.c_size_t],
    "cuGraphUpload": [_P, _P],
    "cuGraphLaunch": [_P, _P],
    "cuGraphExecDestroy": [_P],
    "cuGraphDestroy": [_P],
}


@functools.cache
def libcuda() -> Any:
    """The driver library with the prototypes above set; RunError if it cannot be loaded.

    Tests replace this function to inject a fake library (any object with these attributes).
    """
    try:
        lib = ctypes.CDLL(LIBRARY)
    except OSError as err:
        raise RunError(f"cannot load the CUDA driver library {LIBRARY} for CUDA graphs "
                       f"({_one_line(err)}); {_NO_GRAPH_HINT}") from None
    for name, argtypes in _PROTOTYPES.items():
        function = getattr(lib, name, None)  # a missing symbol is None, checked where used
        if function is not None:
            function.restype = ctypes.c_int
            function.argtypes = argtypes
    return lib


class Graph:
    """An instantiated CUDA graph; `launch` replays it on a stream, `close` destroys it."""

    def __init__(self, lib: Any, graph: int, executable: int) -> None:
        self._lib = lib
        self._graph = graph
        self._exec = executable

    @classmethod
    def capture(cls, stream: Any, enqueue: Callable[[], None],
                mode: int = CAPTURE_MODE_THREAD_LOCAL) -> Graph:
        """Capture what `enqueue()` puts on `stream` (a PyCUDA Stream) and instantiate it.

        If `enqueue` raises, the capture is ended (and its partial graph destroyed) so that the
        stream is usable again, and the exception propagates unchanged.
        """
        lib = libcuda()
        handle = _P(stream.handle)
        _check(lib, "cuStreamBeginCapture_v2", lib.cuStreamBeginCapture_v2(handle, mode))
        # A collection during the capture could free a PyCUDA object, and a free is one of the
        # calls that invalidate a capture.
        collecting = gc.isenabled()
        gc.disable()
        try:
            enqueue()
        except BaseException:
            partial = _P()
            if lib.cuStreamEndCapture(handle, ctypes.pointer(partial)) == 0 and partial.value:
                lib.cuGraphDestroy(partial)
            raise
        finally:
            if collecting:
                gc.enable()
        graph = _P()
        _check(lib, "cuStreamEndCapture", lib.cuStreamEndCapture(handle, ctypes.pointer(graph)))
        try:
            executable = _instantiate(lib, graph)
        except RunError:
            lib.cuGraphDestroy(graph)
            raise
        return cls(lib, graph.value, executable)

    @property
    def closed(self) -> bool:
        return self._exec is None

    def upload(self, stream: Any) -> None:
        """Do the graph's one-time device setup now (on `stream`) rather than at first launch.

        Without it the first launch may allocate; an executor uploads at load so that running
        allocates nothing. A driver without cuGraphUpload (before CUDA 11.1) skips this.
        """
        self._check_open()
        if getattr(self._lib, "cuGraphUpload", None) is not None:
            _check(self._lib, "cuGraphUpload",
                   self._lib.cuGraphUpload(_P(self._exec), _P(stream.handle)))

    def launch(self, stream: Any) -> None:
        """Enqueue one replay of the whole graph on `stream` (a PyCUDA Stream); no sync."""
        self._check_open()
        _check(self._lib, "cuGraphLaunch", self._lib.cuGraphLaunch(_P(self._exec),
                                                                    _P(stream.handle)))

    def close(self) -> None:
        """Destroy the executable graph and the graph; safe to call twice."""
        if self._exec is None:
            return
        executable, graph, self._exec, self._graph = self._exec, self._graph, None, None
        # Both are destroyed even when the first call fails; the first failure is reported.
        results = [("cuGraphExecDestroy", self._lib.cuGraphExecDestroy(_P(executable))),
                   ("cuGraphDestroy", self._lib.cuGraphDestroy(_P(graph)))]
        for name, result in results:
            _check(self._lib, name, result)

    def _check_open(self) -> None:
        if self._exec is None:
            raise RunError("this CUDA graph is destroyed; capture it again")


def _instantiate(lib: Any, graph: Any) -> int:
    executable = _P()
    if getattr(lib, "cuGraphInstantiateWithFlags", None) is not None:
        _check(lib, "cuGraphInstantiateWithFlags",
               lib.cuGraphInstantiateWithFlags(ctypes.pointer(executable), graph, 0))
    else:
        _check(lib, "cuGraphInstantiate",
               lib.cuGraphInstantiate(ctypes.pointer(executable), graph, None, None, 0))
    return executable.value


def error_name(lib: Any, result: int) -> str:
    """The driver's name for a CUresult, e.g. CUDA_ERROR_STREAM_CAPTURE_INVALIDATED."""
    name = ctypes.c_char_p()
    if lib.cuGetErrorName(result, ctypes.pointer(name)) == 0 and name.value:
        return name.value.decode("ascii", "replace")
    return f"CUresult {result}"


def _check(lib: Any, call: str, result: int) -> None:
    if result != 0:
        raise RunError(f"{call} failed: {error_name(lib, result)} ({result}); {_NO_GRAPH_HINT}")


def _one_line(err: BaseException) -> str:
    return " ".join(str(err).split())[:300] or type(err).__name__
