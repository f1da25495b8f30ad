"""Execute a bundle's launch plan on a GPU, exactly as written.

The executor makes no decisions: every choice (kernels, launch shapes, memory layout) was made
by the compiler and is in the bundle. At construction it loads the cubins, prepares every
kernel, allocates one arena and one weights region, uploads the weights once, computes every
kernel's pointer arguments and encodes its TMA tensor maps (aicf_run.tensormap), allocates
page-locked host buffers for the inputs and outputs, and captures the launch plan into a CUDA
graph (aicf_run.graph). `run` then only copies the inputs in, replays the graph (or, with
graph=False, launches the kernels one by one) and copies the outputs out, all on one stream;
repeated runs allocate no device memory.

Everything goes to one PyCUDA Stream, never to the legacy default stream, which cannot be
captured. The stream is an ordinary (blocking) one, so work a caller puts on the default
stream, and events it records there, are still ordered with the executor's work.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from aicf_run import bench as _bench
from aicf_run import profile as _profile
from aicf_run import tensormap
from aicf_run.bundle import Bundle
from aicf_run.convert import device_array, to_device, to_host
from aicf_run.device import Device, check_arch
from aicf_run.errors import RunError
from aicf_run.graph import Graph
from aicf_run.inputs import check_inputs
from aicf_run.weights import CHUNK_BYTES, weight_pieces

# Without opting in, a kernel may use at most 48 KiB of dynamic shared memory.
_DEFAULT_SMEM_LIMIT = 48 * 1024
_RECOMPILE = "recompile the model with `aicfc compile`"


@dataclass(frozen=True)
class _Launch:
    """One prepared kernel launch: everything `prepared_async_call` needs, computed once.

    `maps` are the kernel's encoded TMA tensor maps (aicf_run.tensormap); they hold device
    addresses, so they are encoded once, at load, like the pointers, uploaded to one device
    region, and their address is the kernel's first pointer argument.
    """

    index: int
    name: str
    function: Any
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    smem_bytes: int
    pointers: tuple[int, ...]
    maps: tuple[bytes, ...] = ()


@dataclass(frozen=True, eq=False)
class _Transfer:
    """Where an input or output lives on the device, and what it looks like on the host.

    `staging` is a page-locked host array with the device buffer's layout (None when the
    tensor is empty): copies between page-locked memory and the GPU are truly asynchronous on
    the stream, and it is allocated once, at load.
    """

    name: str
    pointer: int
    dtype: str           # on the host (the bundle's interface)
    device_dtype: str    # in the arena; aicf_run.convert converts between them
    shape: tuple[int, ...]
    staging: np.ndarray | None


class Executor:
    """A bundle loaded on a device, ready to `run` any number of times.

    With `graph=True` (the default) the launch plan is captured once, here, into a CUDA graph
    and every run replays it; `graph=False` launches the kernels one by one. Both give the
    same bits: the same kernels run on the same memory in the same order.
    """

    def __init__(self, bundle: Bundle, device: Device, graph: bool = True) -> None:
        self.bundle = bundle
        self.device = device
        self._cuda = device.driver
        self._closed = False
        self._thread = threading.get_ident()   # [Note: executor threads]
        self._maps: Any = None   # the tensor maps' device region (aicf_run.tensormap.upload)
        self._graph: Graph | None = None
        self._uses_graph = graph
        self._events: tuple[Any, Any] | None = None
        self._pinned: list[np.ndarray] = []
        for module in bundle.modules:
            check_arch(module["arch"], device.arch)
        modules = [self._load_module(module) for module in bundle.modules]
        memory = bundle.memory
        # Allocated before anything else can fail, and freed by close() (run by the device's
        # close, before its context goes away).
        self._arena = self._allocate(memory["arena_bytes"], "arena")
        self._weights = self._allocate(memory["weights_bytes"], "weights")
        device.on_close(self.close)
        bases = {"arena": int(self._arena), "weights": int(self._weights)}
        pointers = [bases[buf["region"]] + buf["offset"] for buf in bundle.buffers]
        self._upload_weights(pointers)
        launches = [self._prepare(i, kernel, modules, pointers) for i, kernel in enumerate(bundle.kernels)]
        self._maps, tables = tensormap.upload(self._cuda, [launch.maps for launch in launches], "the bundle")
        self._launches = [dataclasses.replace(launch, pointers=(table, *launch.pointers)) if launch.maps else launch
                          for launch, table in zip(launches, tables)]
        self._stream = self._cuda.Stream()
        self._inputs = [self._transfer(item, pointers) for item in bundle.inputs]
        self._outputs = [self._transfer(item, pointers) for item in bundle.outputs]
        if graph:
            self._graph = self._capture()

    @property
    def stream(self) -> Any:
        """The PyCUDA Stream every copy and launch of this executor goes to."""
        self._check_open()
        return self._stream

    @property
    def uses_graph(self) -> bool:
        """Whether `run` and `launch` replay a CUDA graph (graph=True at construction)."""
        return self._uses_graph

    def run(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Run the model on `inputs` ({name: array}); returns {output name: new array}."""
        arrays = check_inputs(inputs, self.bundle)
        self._check_open()
        cuda = self._cuda
        try:
            for transfer in self._inputs:
                if transfer.staging is not None:
                    np.copyto(transfer.staging, to_device(arrays[transfer.name],
                                                          transfer.device_dtype))
                    cuda.memcpy_htod_async(transfer.pointer, transfer.staging, self._stream)
        except cuda.Error as err:
            raise RunError(f"cannot copy the inputs to the GPU ({_one_line(err)}); check "
                           f"nvidia-smi") from None
        self.launch()
        self.synchronize()
        try:
            for transfer in self._outputs:
                if transfer.staging is not None:
                    cuda.memcpy_dtoh_async(transfer.staging, transfer.pointer, self._stream)
            self._stream.synchronize()
        except cuda.Error as err:
            raise RunError(f"cannot copy the outputs from the GPU ({_one_line(err)}); check "
                           f"nvidia-smi") from None
        outputs: dict[str, np.ndarray] = {}
        for transfer in self._outputs:
            # A copy: the staging buffer is overwritten by the next run.
            raw = (device_array(transfer.shape, transfer.device_dtype)
                   if transfer.staging is None else transfer.staging.copy())
            outputs[transfer.name] = to_host(raw, transfer.dtype, transfer.device_dtype)
        return outputs

    def launch(self, graph: bool | None = None) -> None:
        """Enqueue the launch plan once on the stream, on the inputs already in the arena.

        No copies, no sync. `graph` None follows the executor's mode; True replays the CUDA
        graph (captured now if this executor was built without one); False launches the
        kernels one by one.
        """
        self._check_open()
        if graph is None:
            graph = self._uses_graph
        if not graph:
            for launch in self._launches:
                self._enqueue(launch)
            return
        if self._graph is None:
            self._graph = self._capture()
        self._graph.launch(self._stream)

    def launch_kernel(self, index: int) -> None:
        """Enqueue kernel `index` of the plan alone on the stream (for profiling); no sync."""
        self._check_open()
        self._enqueue(self._launches[index])

    def synchronize(self) -> None:
        """Wait for the stream; a kernel fault becomes a RunError and marks the device lost."""
        self._check_open()
        try:
            self._stream.synchronize()
        except self._cuda.Error as err:
            self.device.lost = True
            raise RunError(f"a kernel failed while running ({_one_line(err)}); the GPU context "
                           f"is unusable now; rerun with CUDA_LAUNCH_BLOCKING=1 to find the "
                           f"kernel and report it with the bundle") from None

    def events(self) -> tuple[Any, Any]:
        """A (start, stop) pair of CUDA events for timing, made once and freed by close().

        Owned here rather than by the timing code so that they are freed while the context is
        alive, even when a timing run ends in an exception that keeps its frames around.
        """
        self._check_open()
        if self._events is None:
            self._events = (self._cuda.Event(), self._cuda.Event())
        return self._events

    def bench(self, replays: int, graph: bool | None = None) -> _bench.BenchReport:
        """Time `replays` whole-plan replays (see aicf_run.bench); graph None times both ways."""
        return _bench.bench(self, replays, graph)

    def profile(self) -> _profile.ProfileReport:
        """Time every kernel alone and the whole plan (see aicf_run.profile)."""
        return _profile.profile(self)

    def poison(self) -> None:
        """Fill the arena with NaN bytes (0xFF), so any output element no kernel wrote is NaN.

        For tests: a kernel that skips part of its output then fails a NaN-never-passes check
        instead of passing on stale values from an earlier run.
        """
        self._check_open()
        self._cuda.memset_d8(int(self._arena), 0xFF, self.bundle.memory["arena_bytes"])
        self.device.context.synchronize()

    def close(self) -> None:
        """Free the graph, then the device memory; the executor cannot run afterwards."""
        if self._closed:
            return
        self._closed = True
        # The graph's kernel nodes point into the arena: it goes first.
        if self._graph is not None:
            try:
                self._graph.close()
            except RunError:
                pass  # a lost context; destroying it frees the graph
            self._graph = None
        # Dropping the launches drops the last references to the functions and so to their
        # modules, which PyCUDA unloads while the context is still alive; likewise the events
        # and the stream are destroyed here, not after the context is gone.
        self._launches = []
        self._events = None
        self._stream = None
        for pinned in self._pinned:
            free = getattr(pinned.base, "free", None)
            if free is not None:
                try:
                    free()
                except self._cuda.Error:
                    pass  # a lost context frees everything when it goes
        self._pinned = []
        for allocation in (self._arena, self._weights, self._maps):
            if allocation is not None:
                allocation.free()

    def _check_open(self) -> None:
        if self._closed:
            raise RunError("this executor is closed; load the bundle again")
        if threading.get_ident() != self._thread:   # [Note: executor threads]
            raise RunError("this executor was loaded on another thread and its CUDA context is "
                           "current only there; call it from that thread, or load the bundle "
                           "once per thread")
        # PyCUDA's Context.get_current() makes a new wrapper each call: compare driver handles.
        current = getattr(getattr(self._cuda, "Context", None), "get_current", None)
        mine = getattr(self.device.context, "handle", None)
        if current is not None and mine is not None and getattr(current(), "handle", None) != mine:
            raise RunError("another CUDA context is current on this thread (a later "
                           "aicf_run.load or open_device); close it first, or share one device "
                           "between executors: Executor(bundle, device)")

    def _enqueue(self, launch: _Launch) -> None:
        try:
            launch.function.prepared_async_call(launch.grid, launch.block, self._stream,
                                                *launch.pointers,
                                                shared_size=launch.smem_bytes)
        except self._cuda.Error as err:
            raise RunError(f"kernel {launch.index} ({launch.name}) failed to launch "
                           f"({_one_line(err)}); {_RECOMPILE} for this GPU") from None

    def _capture(self) -> Graph:
        """The launch plan as a CUDA graph, uploaded so that its first replay allocates nothing."""
        graph = Graph.capture(self._stream, lambda: self.launch(graph=False))
        try:
            graph.upload(self._stream)
        except RunError:
            graph.close()
            raise
        return graph

    def _transfer(self, item: dict, pointers: list[int]) -> _Transfer:
        buffer = self.bundle.buffers[item["buffer"]]
        shape = tuple(item["shape"])
        layout = device_array(shape, buffer["dtype"])
        staging = None
        if layout.nbytes:
            try:
                pinned = self._cuda.pagelocked_empty((layout.nbytes,), np.uint8)
            except (self._cuda.Error, MemoryError) as err:
                raise RunError(f"cannot allocate {layout.nbytes} bytes of page-locked host "
                               f"memory for {item['name']!r} ({_one_line(err)}); free host "
                               f"memory") from None
            self._pinned.append(pinned)
            staging = pinned.view(layout.dtype).reshape(shape)
        return _Transfer(name=item["name"], pointer=pointers[item["buffer"]],
                         dtype=item["dtype"], device_dtype=buffer["dtype"], shape=shape,
                         staging=staging)

    def _load_module(self, module: dict) -> Any:
        try:
            return self._cuda.module_from_buffer(module["cubin"])
        except self._cuda.Error as err:
            raise RunError(f"cannot load module {module['name']} (a cubin for "
                           f"{module['arch']}) on this {self.device.arch} GPU "
                           f"({_one_line(err)}); recompile with aicfc compile --target "
                           f"{self.device.arch}") from None

    def _allocate(self, nbytes: int, region: str) -> Any:
        # One byte at least: a zero-byte region still needs a valid base pointer.
        try:
            return self._cuda.mem_alloc(max(nbytes, 1))
        except (self._cuda.Error, MemoryError, OverflowError) as err:
            raise RunError(f"cannot allocate {nbytes} bytes of GPU memory for the {region} "
                           f"({_one_line(err)}); free GPU memory or use a larger GPU") from None

    def _upload_weights(self, pointers: list[int]) -> None:
        # The pieces come from aicf_run.weights: inline weights sliced in place, a version-2
        # weights section read chunk by chunk into one page-locked staging buffer, each
        # weight's checksum checked before its last piece; never a host copy of all of them.
        section = any("data" not in weight for weight in self.bundle.weights)
        chunk = min(CHUNK_BYTES, max(1, self.bundle.section_bytes))
        try:
            staging = self._cuda.pagelocked_empty(chunk, np.uint8) if section else None
            for piece in weight_pieces(self.bundle, chunk, staging):
                if len(piece.data):
                    self._cuda.memcpy_htod(pointers[piece.buffer] + piece.start, piece.data)
        except self._cuda.Error as err:
            raise RunError(f"cannot upload the weights ({_one_line(err)}); check "
                           f"nvidia-smi") from None

    def _prepare(self, index: int, kernel: dict, modules: list[Any],
                 pointers: list[int]) -> _Launch:
        cuda = self._cuda
        name = kernel["name"]
        try:
            function = modules[kernel["module"]].get_function(kernel["symbol"])
        except cuda.Error as err:
            raise RunError(f"kernel {index} ({name}): symbol {kernel['symbol']!r} is not in "
                           f"module {kernel['module']} ({_one_line(err)}); the bundle is "
                           f"inconsistent, {_RECOMPILE}") from None
        args = kernel["args"]
        # Optional in the bundle: kernels of bundles from before TMA take no maps.
        maps = tuple(
            tensormap.encode(record, pointers[record["buffer"]],
                             name=f"kernel {index} ({name}) tensor_maps[{i}]")
            for i, record in enumerate(kernel.get("tensor_maps", ())))
        function.prepare(tensormap.arg_format(len(maps), len(args)))
        smem_bytes = kernel["smem_bytes"]
        if smem_bytes > _DEFAULT_SMEM_LIMIT:
            try:
                function.set_attribute(
                    cuda.function_attribute.MAX_DYNAMIC_SHARED_SIZE_BYTES, smem_bytes)
            except cuda.Error as err:
                raise RunError(f"kernel {index} ({name}) needs {smem_bytes} bytes of shared "
                               f"memory, more than this {self.device.arch} GPU allows "
                               f"({_one_line(err)}); recompile with aicfc compile --target "
                               f"{self.device.arch}") from None
        return _Launch(index=index, name=name, function=function, grid=tuple(kernel["grid"]),
                       block=tuple(kernel["block"]), smem_bytes=smem_bytes,
                       pointers=tuple(pointers[buffer_id] for buffer_id in args), maps=maps)


def _one_line(err: BaseException) -> str:
    return " ".join(str(err).split())[:300] or type(err).__name__
