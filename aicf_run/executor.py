"""Execute a bundle's launch plan on a GPU, exactly as written.

The executor makes no decisions: every choice (kernels, launch shapes, memory layout) was made
by the compiler and is in the bundle. At construction it loads the cubins, prepares every
kernel, allocates one arena and one weights region, uploads the weights once, computes every
kernel's pointer arguments and encodes its TMA tensor maps (aicf_run.tensormap), allocates
page-locked host buffers for the inputs and outputs, and captures the launch plan into a CUDA
graph (aicf_run.graph). `run` then only copies the inputs in, replays the graph (or, with
graph=False, launches the kernels one by one) and copies the outputs out, all on one stream;
repeated runs allocate no device memory.

[Note: state] A bundle's `state` records (aicfc/passes/declare_state.py) are tensors that are
both an input and, updated, an output of the model (a KV cache): each is one buffer of a third
region, allocated at load and zeroed, that every run updates in place and no run copies. `state`
reads them back, `set_state` writes them, `reset_state` zeroes them. `run` leaves them where they
are unless its inputs name one (by the model's input name, a numpy array): then, as the ONNX model
would, it writes that value first and returns the updated tensor under the model's output name
(as `state` reads it), so a model fed every input it declares runs as exported.

[Note: device I/O] `run` takes numpy arrays or GPU tensors of other libraries
(aicf_run.interop: `__cuda_array_interface__`, DLPack) and chooses per tensor only how to move
it, never what to compute: a GPU tensor is copied device to device into its arena buffer, or
converted there by the bundle's cast kernel (`cast` on the input, aicfc/codegen/io_cast.py)
when its dtype is the interface's and the storage differs; a numpy array goes through
page-locked staging, then the same cast on the GPU. Outputs come back as numpy arrays when every
input was numpy, else as DeviceArrays over the executor's memory ([Note: output lifetime] in
aicf_run/interop.py), or are written into the caller's tensors given as `outputs=`. A bundle
from before cast kernels converts numpy on the host, as it always did, and refuses a GPU tensor
that would need a conversion.

Everything goes to one PyCUDA Stream, never to the legacy default stream, which cannot be
captured. The stream is an ordinary (blocking) one, so work a caller puts on the default
stream, and events it records there, are still ordered with the executor's work. A caller's
own stream (`run(..., stream=)`) is joined around the run by events (aicf_run.streams): the
run's work starts after everything already on that stream and everything enqueued on it later
waits for the run, as if the run were on it; then `run` returns without waiting for the GPU
when it has no numpy output.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from aicf_run import bench as _bench
from aicf_run import pdl
from aicf_run import profile as _profile
from aicf_run import tensormap
from aicf_run import timeline as _timeline
from aicf_run.bundle import Bundle
from aicf_run.convert import device_array, to_device, to_host
from aicf_run.device import Device, check_arch
from aicf_run.errors import RunError
from aicf_run.graph import Graph
from aicf_run.interop import DeviceArray, DeviceView, check_tensors, view
from aicf_run.moved import MovedLaunch, moved_maps
from aicf_run.plans import PlanInfo, plan_index, plan_infos
from aicf_run.schema import launch_records
from aicf_run.streams import Joiner, stream_handle
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
    dependent: Any = None   # an aicf_run.pdl.DependentLaunch where the bundle says "dependent"


@dataclass(frozen=True)
class _Cast:
    """A prepared interface cast kernel (the bundle's `cast` record): src, dst, element count."""

    function: Any
    grid: tuple[int, int, int]
    block: tuple[int, int, int]


@dataclass(eq=False)
class Shared:
    """Device memory the plans of one bundle share ([Note: plans] in aicf_run/plans.py), owned
    by aicf_run.plan_set.PlanSet: the weights region, one arena (the largest plan's: plans run
    one at a time), one stream (so one plan's run never overlaps another's on that arena), and
    the weights already uploaded, as (weights-region offset, sha256): a blob two plans read
    goes up once. `state`: the one state region of plans that declare the same state tensors at
    the same offsets ([Note: state]), so a prefill plan's cache is the decode plan's; None when
    each plan keeps its own."""

    arena: Any
    weights: Any
    stream: Any
    uploaded: set[tuple[int, str]] = field(default_factory=set)
    state: Any = None
    arena_plan: Any = None   # the Executor whose launch last wrote the arena ([Note: one arena, several plans])


@dataclass(frozen=True, eq=False)
class _Transfer:
    """Where an input or output lives on the device, and what it looks like on the host.

    `staging` is a page-locked host array (None when the tensor is empty): copies between
    page-locked memory and the GPU are truly asynchronous on the stream, and it is allocated
    once, at load. With a `cast` kernel it has the interface's layout and `interface` is a
    device buffer of the interface dtype between it and the arena (the conversion runs on the
    GPU); without one it has the arena buffer's layout (aicf_run.convert converts on the host).
    """

    name: str
    pointer: int
    dtype: str           # on the host (the bundle's interface)
    device_dtype: str    # in the arena
    shape: tuple[int, ...]
    staging: np.ndarray | None
    cast: _Cast | None = None
    interface: int | None = None

    @property
    def numel(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    @property
    def nbytes(self) -> int:
        return self.numel * device_array((), self.device_dtype).itemsize


class Executor:
    """A bundle loaded on a device, ready to `run` any number of times.

    With `graph=True` (the default) the launch plan is captured once, here, into a CUDA graph
    and every run replays it; `graph=False` launches the kernels one by one. Both give the
    same bits: the same kernels run on the same memory in the same order.
    """

    def __init__(self, bundle: Bundle, device: Device, graph: bool = True,
                 shared: Shared | None = None) -> None:
        self.bundle = bundle
        self._shared = shared   # one plan of several (aicf_run.plan_set): memory it does not own
        self.device = device
        self._cuda = device.driver
        self._closed = False
        self._thread = threading.get_ident()   # [Note: executor threads]
        self._maps: Any = None   # the tensor maps' device region (aicf_run.tensormap.upload)
        self._state: Any = None  # the state region ([Note: state]), where the bundle has state
        self._graph: Graph | None = None
        self._uses_graph = graph
        self._events: tuple[Any, Any] | None = None
        self._pinned: list[np.ndarray] = []
        self._interfaces: list[Any] = []   # device buffers of the interface dtype (casts)
        self._joiner = Joiner()
        self._pdl: pdl.Modules | None = None
        for module in bundle.modules:
            check_arch(module["arch"], device.arch)
        modules = [self._load_module(module) for module in bundle.modules]
        self._modules = modules   # PyCUDA's instances: stamp_arrays reads their globals
        # [Note: PDL]: kernels the compiler marked dependent are launched through the driver API
        self._pdl = (pdl.Modules([module["cubin"] for module in bundle.modules])
                     if any(k.get("launch") == "dependent" for k in bundle.kernels) else None)
        memory = bundle.memory
        # Allocated before anything else can fail, and freed by close() (run by the device's
        # close, before its context goes away).
        if shared is None:
            self._arena = self._allocate(memory["arena_bytes"], "arena")
            self._weights = self._allocate(memory["weights_bytes"], "weights")
        else:
            self._arena, self._weights = shared.arena, shared.weights
        # [Note: state] persistent buffers, zeros at load, updated in place by every run (a
        # region only where the bundle declares state; the plans of a PlanSet share one when
        # they declare the same state, else each has its own)
        stateful = any(buf["region"] == "state" for buf in bundle.buffers)
        self._owns_state = stateful and (shared is None or shared.state is None)
        if not stateful:
            self._state = None
        elif self._owns_state:
            self._state = self._allocate(memory["state_bytes"], "state")
        else:
            self._state = shared.state
        device.on_close(self.close)
        bases = {"arena": int(self._arena), "weights": int(self._weights)}
        if self._state is not None:
            bases["state"] = int(self._state)
        pointers = [bases[buf["region"]] + buf["offset"] for buf in bundle.buffers]
        self._buffer_pointers = pointers   # by buffer id: where kernel_moved re-encodes a moved kernel's maps
        self._state_items = [(item, pointers[item["buffer"]]) for item in bundle.payload.get("state", [])]
        if self._owns_state:
            self._cuda.memset_d8(int(self._state), 0, memory["state_bytes"])
        self._upload_weights(pointers)
        launches = [self._prepare(i, kernel, modules, pointers) for i, kernel in enumerate(bundle.kernels)]
        self._maps, tables = tensormap.upload(self._cuda, [launch.maps for launch in launches], "the bundle")
        self._launches = [dataclasses.replace(launch, pointers=(table, *launch.pointers)) if launch.maps else launch
                          for launch, table in zip(launches, tables)]
        if self._pdl is not None:
            self._launches = [self._dependent(launch, kernel) if kernel.get("launch") == "dependent" else launch
                              for launch, kernel in zip(self._launches, bundle.kernels)]
        self._stream = self._cuda.Stream() if shared is None else shared.stream
        self._inputs = [self._transfer(item, pointers, modules) for item in bundle.inputs]
        self._outputs = [self._transfer(item, pointers, modules) for item in bundle.outputs]
        if graph:
            self._graph = self._capture()

    @property
    def stream(self) -> Any:
        """The PyCUDA Stream every copy and launch of this executor goes to."""
        self._check_open()
        return self._stream

    @property
    def plans(self) -> tuple[PlanInfo, ...]:
        """This executor's one plan (aicf_run.plan_set.PlanSet runs a bundle of several)."""
        return plan_infos([self.bundle.inputs])

    @property
    def uses_graph(self) -> bool:
        """Whether `run` and `launch` replay a CUDA graph (graph=True at construction)."""
        return self._uses_graph

    @property
    def dependent_modules(self) -> pdl.Modules | None:
        """The bundle's modules as the driver API loaded them for dependent launches ([Note: PDL]), or None
        where no kernel is launched so (the greedy feed launches its kernels through them)."""
        return self._pdl

    def run(self, inputs: Mapping[str, Any], *, outputs: Mapping[str, Any] | None = None,
            stream: Any = None, device_outputs: bool | None = None,
            plan: int | str | None = None) -> dict[str, Any]:
        """Run the model on `inputs` ({name: numpy array or GPU tensor}); returns {output name:
        result}. See [Note: device I/O].

        Results are new numpy arrays when every input is numpy (or `device_outputs=False`),
        else DeviceArrays over this executor's memory, valid until the next run ([Note: output
        lifetime]); an output given in `outputs` ({name: GPU tensor}) is written there and
        returned as that object. `stream` (a CUDA stream handle, or a PyCUDA/torch/CuPy stream)
        orders the run on the caller's stream and then returns without waiting for the GPU
        unless a numpy result needs it; without it `run` waits for the GPU before returning.
        Inputs written on a stream other than the legacy default one must name that stream
        here (torch's `__cuda_array_interface__` does not say which stream wrote a tensor;
        DLPack and CuPy do, and are waited for). `plan` (an index or a name of `plans`) may
        name this executor's one plan, as PlanSet.run's does.
        """
        self._check_open()
        if plan is not None:
            plan_index([self.bundle.inputs], plan)   # this plan, or a one-line RunError
        caller = stream_handle(stream)
        ours = self._stream.handle

        def make_view(value: Any, what: str) -> np.ndarray | DeviceView:
            return view(value, what, self.device.ordinal, ours, self._joiner.pointer_device)

        inputs, fed = self._split_state(inputs)
        given = check_tensors(inputs, self.bundle.inputs, self.bundle.buffers, "input", make_view)
        targets = check_tensors(outputs or {}, self.bundle.outputs, self.bundle.buffers, "output",
                                make_view, require_all=False)
        for name, target in targets.items():
            if not isinstance(target, DeviceView):
                raise RunError(f"outputs[{name!r}] is a numpy array; outputs= takes GPU tensors to "
                               f"write into (numpy results are returned)")
        if fed:
            self.set_state({name: value for name, (_, value) in fed.items()})
        if device_outputs is None:
            device_outputs = any(isinstance(t, DeviceView) for t in given.values())
        cuda = self._cuda
        if caller is not None:
            self._joiner.wait(ours, caller, slot=0)
        for tensor in given.values():
            if isinstance(tensor, DeviceView) and tensor.stream is not None:
                self._joiner.wait(ours, tensor.stream, slot=1)
        try:
            for transfer in self._inputs:
                self._copy_in(transfer, given[transfer.name])
        except cuda.Error as err:
            raise RunError(f"cannot copy the inputs to the GPU ({_one_line(err)}); check "
                           f"nvidia-smi") from None
        self.launch()
        results: dict[str, Any] = {}
        host: list[_Transfer] = []
        try:
            for transfer in self._outputs:
                target = targets.get(transfer.name)
                if target is not None:
                    self._copy_out_to(transfer, target)
                    results[transfer.name] = target.keep
                elif device_outputs:
                    results[transfer.name] = self._device_result(transfer, caller)
                else:
                    self._copy_out_to_staging(transfer)
                    host.append(transfer)
        except cuda.Error as err:
            raise RunError(f"cannot copy the outputs from the GPU ({_one_line(err)}); check "
                           f"nvidia-smi") from None
        if host or caller is None:
            self.synchronize()
        if caller is not None:
            self._joiner.wait(caller, ours, slot=2)
        for transfer in host:
            results[transfer.name] = self._host_result(transfer)
        # In the bundle's order, whichever way each output went; then the state the inputs named.
        ordered = {t.name: results[t.name] for t in self._outputs}
        if fed:
            now = self.state
            ordered.update({item["output"]: now[name] for name, (item, _) in fed.items()})
        return ordered

    def _split_state(self, inputs: Mapping[str, Any]) -> tuple[Mapping[str, Any], dict[str, tuple[dict, Any]]]:
        """[Note: state] The inputs that are not state, and {name: (state record, numpy array)} of those
        that are, for set_state to write once the other inputs are checked."""
        items = {item["name"]: item for item, _ in self._state_items}
        fed = {name: (items[name], value) for name, value in inputs.items() if name in items}
        for name, (_, value) in fed.items():
            if not isinstance(value, np.ndarray):
                raise RunError(f"state {name!r} given as {type(value).__name__}: run takes a state tensor as a "
                               f"numpy array (its copy on the GPU is the state); or call set_state")
        return ({n: v for n, v in inputs.items() if n not in fed} if fed else inputs), fed

    def _copy_in(self, transfer: _Transfer, tensor: np.ndarray | DeviceView) -> None:
        """Enqueue the move of one input into its arena buffer ([Note: device I/O])."""
        if not transfer.numel:
            return
        cuda = self._cuda
        if isinstance(tensor, DeviceView):
            if tensor.dtype == transfer.device_dtype:
                cuda.memcpy_dtod_async(transfer.pointer, tensor.pointer, transfer.nbytes,
                                       self._stream)
            else:
                self._convert(transfer, tensor.pointer, transfer.pointer, "input")
        elif transfer.cast is not None:
            np.copyto(transfer.staging, tensor)
            cuda.memcpy_htod_async(transfer.interface, transfer.staging, self._stream)
            self._convert(transfer, transfer.interface, transfer.pointer, "input")
        else:
            np.copyto(transfer.staging, to_device(tensor, transfer.device_dtype))
            cuda.memcpy_htod_async(transfer.pointer, transfer.staging, self._stream)

    def _copy_out_to(self, transfer: _Transfer, target: DeviceView) -> None:
        if not transfer.numel:
            return
        if target.dtype == transfer.device_dtype:
            self._cuda.memcpy_dtod_async(target.pointer, transfer.pointer, transfer.nbytes,
                                         self._stream)
        else:
            self._convert(transfer, transfer.pointer, target.pointer, "output")

    def _device_result(self, transfer: _Transfer, caller: int | None) -> DeviceArray:
        pointer = transfer.pointer
        if transfer.dtype != transfer.device_dtype:
            pointer = transfer.interface or 0
            if transfer.numel:
                self._convert(transfer, transfer.pointer, pointer, "output")
        return DeviceArray(pointer, transfer.shape, transfer.dtype, self.device.ordinal,
                           caller, lambda waiter, producer: self._joiner.wait(waiter, producer, 3),
                           self._to_host, self)

    def _copy_out_to_staging(self, transfer: _Transfer) -> None:
        if transfer.staging is None:
            return
        if transfer.cast is not None:
            self._convert(transfer, transfer.pointer, transfer.interface, "output")
            self._cuda.memcpy_dtoh_async(transfer.staging, transfer.interface, self._stream)
        else:
            self._cuda.memcpy_dtoh_async(transfer.staging, transfer.pointer, self._stream)

    def _host_result(self, transfer: _Transfer) -> np.ndarray:
        # A copy: the staging buffer is overwritten by the next run.
        if transfer.staging is None:
            return np.empty(transfer.shape, transfer.dtype)
        raw = transfer.staging.copy()
        if transfer.cast is not None:
            return raw
        return to_host(raw, transfer.dtype, transfer.device_dtype)

    def _convert(self, transfer: _Transfer, source: int, destination: int, kind: str) -> None:
        """Launch the bundle's cast kernel of `transfer` (source -> destination) on the stream."""
        cast = transfer.cast
        if cast is None:
            raise RunError(f"{kind} {transfer.name!r} is {transfer.dtype} at the interface and "
                           f"{transfer.device_dtype} on the device, and this bundle has no GPU "
                           f"cast kernel for it (compiled before they existed): recompile it "
                           f"with `aicfc compile`, or pass a {transfer.device_dtype} tensor or "
                           f"numpy arrays")
        try:
            cast.function.prepared_async_call(cast.grid, cast.block, self._stream, source,
                                              destination, transfer.numel)
        except self._cuda.Error as err:
            raise RunError(f"the {kind} cast of {transfer.name!r} failed to launch "
                           f"({_one_line(err)}); {_RECOMPILE} for this GPU") from None

    def _to_host(self, array: DeviceArray) -> np.ndarray:
        """DeviceArray.numpy(): a host copy of `array`, after the stream's work."""
        self._check_open()
        out = np.empty(array.shape, array.dtype)
        if out.nbytes:
            self.synchronize()
            try:
                self._cuda.memcpy_dtoh(out, array.ptr)
            except self._cuda.Error as err:
                raise RunError(f"cannot copy an output from the GPU ({_one_line(err)}); check "
                               f"nvidia-smi") from None
        return out

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
            self.wrote_arena()
            return
        if self._graph is None:
            self._graph = self._capture()
        self._graph.launch(self._stream)
        self.wrote_arena()

    def wrote_arena(self) -> None:
        """Records that this plan's launch is what the arena it shares with other plans holds now."""
        if self._shared is not None:
            self._shared.arena_plan = self

    def _check_arena(self, what: str) -> None:
        """[Note: one arena, several plans] (aicf_run/plan_set.py): refuses, in one line, to time this plan on what
        another plan of the bundle left in the arena they share."""
        other = self._shared.arena_plan if self._shared is not None else None
        if other is not None and other is not self:
            mine, theirs = self.plans[0].name, other.plans[0].name
            raise RunError(f"cannot {what} plan {mine}: the arena it shares holds what plan {theirs} left there, "
                           f"which {mine} would read as its inputs; run plan {mine} once on its own inputs first "
                           f"(run(inputs, plan={mine!r})), then time it")

    def launch_kernel(self, index: int, plain: bool = False) -> None:
        """Enqueue kernel `index` of the plan alone on the stream (for profiling); no sync. `plain`: without the
        dependent-launch attribute the plan gives it (its `griddepcontrol.wait` then returns at once), as
        `aicfc tune` launches candidates."""
        self._check_open()
        launch = self._launches[index]
        self._enqueue(dataclasses.replace(launch, dependent=None) if plain else launch)

    def kernel_pointers(self, index: int) -> tuple[int, ...]:
        """The device addresses of kernel `index`'s `args`, one per entry, as it is launched (a kernel with tensor
        maps takes their table first, which is not among them)."""
        launch = self._launches[index]
        return launch.pointers[1:] if launch.maps else launch.pointers

    def kernel_moved(self, index: int, moved: Mapping[int, int]) -> MovedLaunch:
        """Kernel `index` alone with the arguments at the positions of `moved` at other addresses, its tensor maps
        following them ([Note: moved maps] in aicf_run/moved.py), for profiling ([Note: cold weights] in
        aicf_run/profile.py): call the result to enqueue the launch, `free()` it once the stream is idle."""
        self._check_open()
        launch, kernel = self._launches[index], self.bundle.kernels[index]
        pointers = tuple(moved.get(i, p) for i, p in enumerate(self.kernel_pointers(index)))
        if not launch.maps:
            plain = dataclasses.replace(launch, pointers=pointers, dependent=None)
            return MovedLaunch(self._enqueue, plain if launch.dependent is None else self._dependent(plain, kernel))
        what = f"kernel {index} ({launch.name})"
        maps, table_memory, table = moved_maps(self._cuda, kernel, self._buffer_pointers, moved, what)
        moved_launch = dataclasses.replace(launch, pointers=(table, *pointers), maps=maps, dependent=None)
        symbol = kernel.get("maps_symbol")
        instance, module = None, None
        try:
            if launch.dependent is not None and symbol is not None:   # a driver-API instance of its own
                instance = pdl.Modules([self.bundle.modules[kernel["module"]]["cubin"]])
                instance.write_global(0, symbol, b"".join(maps), what)
                function = instance.function(0, kernel["symbol"], launch.smem_bytes, what)
                moved_launch = dataclasses.replace(moved_launch, dependent=pdl.DependentLaunch(
                    instance, function, launch.grid, launch.block, launch.smem_bytes, moved_launch.pointers, what))
            elif launch.dependent is not None:
                moved_launch = self._dependent(moved_launch, kernel)
            elif symbol is not None:                                   # a PyCUDA instance of its own
                module = self._load_module(self.bundle.modules[kernel["module"]])
                tensormap.write_constant(self._cuda, module, symbol, maps, what,
                                         f"the bundle is inconsistent, {_RECOMPILE}")
                moved_launch = dataclasses.replace(moved_launch, function=self._function(module, index, kernel,
                                                                                         len(maps)))
        except RunError:
            MovedLaunch(self._enqueue, None, [table_memory], instance).free()
            raise
        return MovedLaunch(self._enqueue, moved_launch, [table_memory], instance, keep=module)

    def device_copy(self, pointer: int, nbytes: int) -> Any:
        """A new allocation holding a copy of `nbytes` at `pointer`, made on the stream and waited for
        (outside any graph capture); free it with its `free()`."""
        self._check_open()
        copy = self._allocate(nbytes, "copies of a kernel's buffers")
        self._cuda.memcpy_dtod_async(int(copy), pointer, nbytes, stream=self._stream)
        self.synchronize()
        return copy

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
        self._check_arena("time")
        return _bench.bench(self, replays, graph)

    def profile(self) -> _profile.ProfileReport:
        """Time every kernel alone and the whole plan (see aicf_run.profile)."""
        self._check_arena("profile")
        return _profile.profile(self)

    def timeline(self, rounds: int = _timeline.ROUNDS, busy: bool = False) -> _timeline.TimelineReport:
        """When each kernel's blocks landed and started in replays of the plan (see aicf_run.timeline); `busy`:
        each timed replay right after another one."""
        self._check_arena("take the timeline of")
        return _timeline.timeline(self, rounds, busy)

    def stamp_arrays(self) -> list[tuple[int, int] | None]:
        """Per kernel record (a launch's own, then those joined to it), the (device address, blocks)
        of its entry stamps, or None for a kernel compiled without them ([Note: timeline] in
        aicfc/codegen/timeline.py): in the instance of its module that launches it (the driver API's
        for a dependent launch, else PyCUDA's)."""
        self._check_open()
        out: list[tuple[int, int] | None] = []
        # a launch's records, its own and those joined to it ([Note: a joined role's stamps])
        for launch, kernel in ((launch, record) for launch, host in zip(self._launches, self.bundle.kernels)
                               for record in launch_records(host)):
            stamps = kernel.get("timeline")
            if stamps is None:
                out.append(None)
                continue
            what = f"kernel {launch.index} ({kernel['name']}) timeline"
            try:
                if launch.dependent is not None:
                    address, size = self._pdl.global_address(kernel["module"], stamps["symbol"], what)
                else:
                    pointer, size = self._modules[kernel["module"]].get_global(stamps["symbol"])
                    address = int(pointer)
            except self._cuda.Error as err:
                raise RunError(f"{what}: no array {stamps['symbol']!r} in module {kernel['module']} "
                               f"({_one_line(err)}); the bundle is inconsistent, {_RECOMPILE}") from None
            if size != 8 * stamps["stamps"] * stamps["blocks"]:
                raise RunError(f"{what}: {stamps['symbol']} holds {size} bytes, not {8 * stamps['stamps']} for each of "
                               f"{stamps['blocks']} blocks; the bundle is inconsistent, {_RECOMPILE}")
            out.append((address, stamps["blocks"]))
        return out

    def poison(self) -> None:
        """Fill the arena with NaN bytes (0xFF), so any output element no kernel wrote is NaN.

        For tests: a kernel that skips part of its output then fails a NaN-never-passes check
        instead of passing on stale values from an earlier run.
        """
        self._check_open()
        self._cuda.memset_d8(int(self._arena), 0xFF, self.bundle.memory["arena_bytes"])
        self.device.context.synchronize()

    @property
    def state(self) -> dict[str, np.ndarray]:
        """[Note: state] A host copy of every state tensor ({input name: array}, in the dtype it
        is stored in on the device; float32 for bfloat16, which numpy lacks), as the last run left it."""
        self._check_open()
        self.synchronize()
        out: dict[str, np.ndarray] = {}
        for item, pointer in self._state_items:
            host = device_array(tuple(item["shape"]), item["dtype"])
            if host.nbytes:
                self._cuda.memcpy_dtoh(host, pointer)
            out[item["name"]] = to_host(host, "float32", "bfloat16") if item["dtype"] == "bfloat16" else host
        return out

    def set_state(self, values: Mapping[str, np.ndarray]) -> None:
        """Write host arrays into state tensors (by input name, of the stored shape; floating values
        are converted to the stored floating dtype, integers must be integers)."""
        self._check_open()
        items = {item["name"]: (item, pointer) for item, pointer in self._state_items}
        writes = []                     # every value checked before any is written
        for name, value in values.items():
            if name not in items:
                raise RunError(f"{name!r} is not a state tensor of this bundle (state: {sorted(items)})")
            item, pointer = items[name]
            array = np.asarray(value)
            stored_float = item["dtype"] in ("float16", "bfloat16", "float32", "float64")
            if array.shape != tuple(item["shape"]) or stored_float != (array.dtype.kind == "f") or (
                    not stored_float and array.dtype.kind not in "iu"):
                raise RunError(f"state {name!r} is {item['dtype']} {item['shape']}, got {array.dtype} "
                               f"{list(array.shape)}")
            writes.append((pointer, np.ascontiguousarray(to_device(array, item["dtype"]))))
        self.synchronize()
        for pointer, array in writes:
            if array.nbytes:
                self._cuda.memcpy_htod(pointer, array)

    def generate(self, prompt: Any, max_new_tokens: int, **options: Any) -> Any:
        """Generate tokens after `prompt` with this one plan, token by token after the prompt
        (aicf_run.generate.generate; a bundle with prefill plans runs it through aicf_run.load's
        PlanSet)."""
        from aicf_run.generate import generate
        return generate(self, prompt, max_new_tokens, **options)

    @property
    def has_state(self) -> bool:
        """Whether the bundle declares state tensors ([Note: state])."""
        return self._state is not None

    def reset_state(self) -> None:
        """Zero every state tensor (as at load), e.g. before a new sequence."""
        self._check_open()
        self.synchronize()
        if self._state is not None:
            self._cuda.memset_d8(int(self._state), 0, self.bundle.memory["state_bytes"])
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
        if self._pdl is not None:
            self._pdl.close()
            self._pdl = None
        self._events = None
        self._joiner.close()
        self._stream = None
        for pinned in self._pinned:
            free = getattr(pinned.base, "free", None)
            if free is not None:
                try:
                    free()
                except self._cuda.Error:
                    pass  # a lost context frees everything when it goes
        self._pinned = []
        owned = (self._arena, self._weights) if self._shared is None else ()   # else PlanSet frees them
        state = (self._state,) if self._owns_state else ()   # a shared one is PlanSet's
        for allocation in (*owned, *state, self._maps, *self._interfaces):
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

    def _dependent(self, launch: _Launch, kernel: dict) -> _Launch:
        what = f"kernel {launch.index} ({launch.name})"
        function = self._pdl.function(kernel["module"], kernel["symbol"], launch.smem_bytes, what)
        return dataclasses.replace(launch, dependent=pdl.DependentLaunch(
            self._pdl, function, launch.grid, launch.block, launch.smem_bytes, launch.pointers, what))

    def _enqueue(self, launch: _Launch) -> None:
        if launch.dependent is not None:
            launch.dependent(self._stream.handle)
            return
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

    def _transfer(self, item: dict, pointers: list[int], modules: list[Any]) -> _Transfer:
        buffer = self.bundle.buffers[item["buffer"]]
        shape = tuple(item["shape"])
        cast = self._prepare_cast(item, modules)
        # With a GPU cast, the host side and the staging have the interface's layout.
        layout = device_array(shape, item["dtype"] if cast else buffer["dtype"])
        staging = interface = None
        if layout.nbytes:
            try:
                pinned = self._cuda.pagelocked_empty((layout.nbytes,), np.uint8)
            except (self._cuda.Error, MemoryError) as err:
                raise RunError(f"cannot allocate {layout.nbytes} bytes of page-locked host "
                               f"memory for {item['name']!r} ({_one_line(err)}); free host "
                               f"memory") from None
            self._pinned.append(pinned)
            staging = pinned.view(layout.dtype).reshape(shape)
            if cast is not None:
                allocation = self._allocate(layout.nbytes, f"interface copy of {item['name']!r}")
                self._interfaces.append(allocation)
                interface = int(allocation)
        return _Transfer(name=item["name"], pointer=pointers[item["buffer"]],
                         dtype=item["dtype"], device_dtype=buffer["dtype"], shape=shape,
                         staging=staging, cast=cast, interface=interface)

    def _prepare_cast(self, item: dict, modules: list[Any]) -> _Cast | None:
        record = item.get("cast")   # optional: bundles from before GPU casts convert on the host
        if record is None:
            return None
        try:
            function = modules[record["module"]].get_function(record["symbol"])
        except self._cuda.Error as err:
            raise RunError(f"the cast of {item['name']!r}: symbol {record['symbol']!r} is not in "
                           f"module {record['module']} ({_one_line(err)}); the bundle is "
                           f"inconsistent, {_RECOMPILE}") from None
        function.prepare("PPQ")   # source, destination, element count
        return _Cast(function=function, grid=tuple(record["grid"]), block=tuple(record["block"]))

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
        bundle = self.bundle
        if self._shared is not None:   # a blob an earlier plan uploaded is in place already
            places = [(bundle.buffers[w["buffer"]]["offset"], w["sha256"]) for w in bundle.weights]
            bundle = dataclasses.replace(bundle, weights=[w for w, at in zip(bundle.weights, places)
                                                          if at not in self._shared.uploaded])
            self._shared.uploaded.update(places)
        section = any("data" not in weight for weight in bundle.weights)
        # The staging buffer need not outgrow the section; inline weights are sliced in
        # CHUNK_BYTES pieces whatever the section's size (a bundle without one has 0 bytes
        # there: sized by it, every inline weight went up in 1-byte copies).
        chunk = min(CHUNK_BYTES, max(1, bundle.section_bytes)) if section else CHUNK_BYTES
        try:
            staging = self._cuda.pagelocked_empty(chunk, np.uint8) if section else None
            for piece in weight_pieces(bundle, chunk, staging):
                if len(piece.data):
                    self._cuda.memcpy_htod(pointers[piece.buffer] + piece.start, piece.data)
        except self._cuda.Error as err:
            raise RunError(f"cannot upload the weights ({_one_line(err)}); check "
                           f"nvidia-smi") from None

    def _prepare(self, index: int, kernel: dict, modules: list[Any],
                 pointers: list[int]) -> _Launch:
        name = kernel["name"]
        args = kernel["args"]
        # Optional in the bundle: kernels of bundles from before TMA take no maps.
        maps = tuple(
            tensormap.encode(record, pointers[record["buffer"]],
                             name=f"kernel {index} ({name}) tensor_maps[{i}]")
            for i, record in enumerate(kernel.get("tensor_maps", ())))
        module = modules[kernel["module"]]
        symbol = kernel.get("maps_symbol")   # optional: [Note: TMA maps in constant memory] (aicfc/codegen/tma.py)
        if symbol is not None and maps:
            # in PyCUDA's instance of the module and, for dependent launches, the driver API's (aicf_run/pdl.py)
            what = f"kernel {index} ({name})"
            fix = f"the bundle is inconsistent, {_RECOMPILE}"
            tensormap.write_constant(self._cuda, module, symbol, maps, what, fix)
            if self._pdl is not None:
                self._pdl.write_global(kernel["module"], symbol, b"".join(maps), what)
        return _Launch(index=index, name=name, function=self._function(module, index, kernel, len(maps)),
                       grid=tuple(kernel["grid"]), block=tuple(kernel["block"]), smem_bytes=kernel["smem_bytes"],
                       pointers=tuple(pointers[buffer_id] for buffer_id in args), maps=maps)

    def _function(self, module: Any, index: int, kernel: dict, maps: int) -> Any:
        """Kernel `index`'s function in PyCUDA's instance `module`, prepared for `maps` tensor maps and its
        arguments, its shared memory allowed."""
        cuda = self._cuda
        name = kernel["name"]
        try:
            function = module.get_function(kernel["symbol"])
        except cuda.Error as err:
            raise RunError(f"kernel {index} ({name}): symbol {kernel['symbol']!r} is not in "
                           f"module {kernel['module']} ({_one_line(err)}); the bundle is "
                           f"inconsistent, {_RECOMPILE}") from None
        function.prepare(tensormap.arg_format(maps, len(kernel["args"])))
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
        return function


def _one_line(err: BaseException) -> str:
    return " ".join(str(err).split())[:300] or type(err).__name__
