"""Execute a bundle's launch plan on a GPU, exactly as written.

The executor makes no decisions: every choice (kernels, launch shapes, memory layout) was made
by the compiler and is in the bundle. At construction it loads the cubins, prepares every
kernel, allocates one arena and one weights region, uploads the weights once and computes
every kernel's pointer arguments. `run` then only copies inputs in, launches the kernels in
order and copies outputs out; repeated runs allocate no device memory.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from aicf_run.bundle import Bundle
from aicf_run.convert import device_array, to_device, to_host
from aicf_run.device import Device, check_arch
from aicf_run.errors import RunError
from aicf_run.inputs import check_inputs

# Without opting in, a kernel may use at most 48 KiB of dynamic shared memory.
_DEFAULT_SMEM_LIMIT = 48 * 1024
_RECOMPILE = "recompile the model with `aicfc compile`"


@dataclass(frozen=True)
class _Launch:
    """One prepared kernel launch: everything `prepared_call` needs, computed once."""

    index: int
    name: str
    function: Any
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    smem_bytes: int
    pointers: tuple[int, ...]


@dataclass(frozen=True)
class _Transfer:
    """Where an input or output lives on the device, and what it looks like on the host."""

    name: str
    pointer: int
    dtype: str           # on the host (the bundle's interface)
    device_dtype: str    # in the arena; aicf_run.convert converts between them
    shape: tuple[int, ...]


class Executor:
    """A bundle loaded on a device, ready to `run` any number of times."""

    def __init__(self, bundle: Bundle, device: Device) -> None:
        self.bundle = bundle
        self.device = device
        self._cuda = device.driver
        self._closed = False
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
        self._launches = [self._prepare(i, kernel, modules, pointers)
                          for i, kernel in enumerate(bundle.kernels)]
        self._inputs = [_transfer(item, pointers, bundle.buffers) for item in bundle.inputs]
        self._outputs = [_transfer(item, pointers, bundle.buffers) for item in bundle.outputs]

    def run(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Run the model on `inputs` ({name: array}); returns {output name: new array}."""
        arrays = check_inputs(inputs, self.bundle)
        if self._closed:
            raise RunError("this executor is closed; load the bundle again")
        cuda = self._cuda
        try:
            for transfer in self._inputs:
                array = to_device(arrays[transfer.name], transfer.device_dtype)
                if array.nbytes:
                    cuda.memcpy_htod(transfer.pointer, array)
        except cuda.Error as err:
            raise RunError(f"cannot copy the inputs to the GPU ({_one_line(err)}); check "
                           f"nvidia-smi") from None
        self.launch()
        try:
            self.device.context.synchronize()
        except cuda.Error as err:
            self.device.lost = True
            raise RunError(f"a kernel failed while running ({_one_line(err)}); the GPU context "
                           f"is unusable now; rerun with CUDA_LAUNCH_BLOCKING=1 to find the "
                           f"kernel and report it with the bundle") from None
        outputs: dict[str, np.ndarray] = {}
        try:
            for transfer in self._outputs:
                raw = device_array(transfer.shape, transfer.device_dtype)
                if raw.nbytes:
                    cuda.memcpy_dtoh(raw, transfer.pointer)
                outputs[transfer.name] = to_host(raw, transfer.dtype, transfer.device_dtype)
        except cuda.Error as err:
            raise RunError(f"cannot copy the outputs from the GPU ({_one_line(err)}); check "
                           f"nvidia-smi") from None
        return outputs

    def launch(self) -> None:
        """Enqueue the launch plan once, on the current inputs in the arena (no copies, no sync)."""
        cuda = self._cuda
        for launch in self._launches:
            try:
                launch.function.prepared_call(launch.grid, launch.block, *launch.pointers,
                                              shared_size=launch.smem_bytes)
            except cuda.Error as err:
                raise RunError(f"kernel {launch.index} ({launch.name}) failed to launch "
                               f"({_one_line(err)}); {_RECOMPILE} for this GPU") from None

    def poison(self) -> None:
        """Fill the arena with NaN bytes (0xFF), so any output element no kernel wrote is NaN.

        For tests: a kernel that skips part of its output then fails a NaN-never-passes check
        instead of passing on stale values from an earlier run.
        """
        if self._closed:
            raise RunError("this executor is closed; load the bundle again")
        self._cuda.memset_d8(int(self._arena), 0xFF, self.bundle.memory["arena_bytes"])
        self.device.context.synchronize()

    def close(self) -> None:
        """Free the device memory now; the executor cannot run afterwards."""
        if self._closed:
            return
        self._closed = True
        # Dropping the launches drops the last references to the functions and so to their
        # modules, which PyCUDA unloads while the context is still alive.
        self._launches = []
        for allocation in (self._arena, self._weights):
            allocation.free()

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
        try:
            for weight in self.bundle.weights:
                if weight["data"]:
                    self._cuda.memcpy_htod(pointers[weight["buffer"]], weight["data"])
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
        function.prepare("P" * len(args))
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
                       pointers=tuple(pointers[buffer_id] for buffer_id in args))


def _transfer(item: dict, pointers: list[int], buffers: list[dict]) -> _Transfer:
    return _Transfer(name=item["name"], pointer=pointers[item["buffer"]], dtype=item["dtype"],
                     device_dtype=buffers[item["buffer"]]["dtype"], shape=tuple(item["shape"]))


def _one_line(err: BaseException) -> str:
    return " ".join(str(err).split())[:300] or type(err).__name__
