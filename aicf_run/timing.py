"""Time single kernels on the GPU with CUDA events (`aicfc tune`, `aicf-run --profile`).

`KernelBench` loads a module, allocates one device buffer per kernel argument from host
arrays, and times any kernel of the module on those buffers: WARMUP launches, then
back-to-back launches between two CUDA events, as many as make the measurement at least
MIN_MS milliseconds and MIN_LAUNCHES launches (at most MAX_LAUNCHES; a kernel so slow that
MIN_LAUNCHES of it would pass LONG_MS gets as few as reach LONG_MS, one at least); the time
per launch is elapsed / launches, and the result the median of REPEATS such measurements.

`median_per_launch_us` is that measuring loop on its own, shared with the runtime's profiler
(aicf_run.profile). Launches go back to back, as a model's kernels do, so inputs stay in L2
between launches when they fit; that is also how `benchmarks/` times whole models.

A kernel shorter than the host's cost of one launch (a few microseconds through PyCUDA) would
otherwise be timed at the host's launch rate, the GPU idle between launches. When the module
holds SPIN_SYMBOL (`aicfc tune` adds it, SPIN_SOURCE), each measurement first launches it to
hold the stream for longer than the host takes to enqueue the timed launches (twice the
previous measurement's enqueue time, at first ENQUEUE_US each), so those run back to back on
the GPU whatever the host's rate; at most SPIN_LAUNCHES are timed at once then, so the pending
launches stay within the driver's queue.

A candidate that loads tiles with the TMA takes a pointer to its tensor maps before the
pointers (aicf_run.tensormap); `time_us` encodes them against the bench's own argument buffers,
each record naming its buffer by argument index, and uploads them for the timing.
"""
from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from aicf_run import tensormap
from aicf_run.device import Device
from aicf_run.errors import RunError

WARMUP = 3
MIN_LAUNCHES = 20
MIN_MS = 2.0
LONG_MS = 50.0
MAX_LAUNCHES = 2000
REPEATS = 5
SPIN_SYMBOL = "aicf_spin"
SPIN_SOURCE = """
// Holds the stream for `ns` nanoseconds of the GPU's global timer (aicf_run/timing.py).
extern "C" __global__ void aicf_spin(unsigned long long ns) {
  unsigned long long t0, t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  do { asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); } while (t - t0 < ns);
}
"""
ENQUEUE_US = 20.0
SPIN_LAUNCHES = 500
SPIN_MAX_MS = 50.0
# Without opting in, a kernel may use at most 48 KiB of dynamic shared memory.
_DEFAULT_SMEM_LIMIT = 48 * 1024


class LaunchRefused(RunError):
    """The GPU refused to launch one kernel (resources); the context is still usable."""


class KernelBench:
    """A loaded module and its argument buffers; `close` (or `with`) frees them."""

    def __init__(self, device: Device, cubin: bytes, arrays: Sequence[np.ndarray]) -> None:
        self.device = device
        self._cuda = cuda = device.driver
        self._allocations: list[Any] = []
        self._functions: dict[str, Any] = {}
        try:
            self._module = cuda.module_from_buffer(cubin)
        except cuda.Error as err:
            raise RunError(f"cannot load a tuning module on this {device.arch} GPU "
                           f"({_one_line(err)}); tune with --target {device.arch}") from None
        try:
            for array in arrays:
                allocation = cuda.mem_alloc(max(array.nbytes, 1))
                self._allocations.append(allocation)
                if array.nbytes:
                    cuda.memcpy_htod(allocation, np.ascontiguousarray(array))
        except (cuda.Error, MemoryError, OverflowError) as err:
            self.close()
            raise RunError(f"cannot allocate and fill {sum(a.nbytes for a in arrays)} bytes of GPU "
                           f"memory for a kernel's arguments ({_one_line(err)}); free GPU "
                           f"memory or use a larger GPU") from None
        self._pointers = tuple(int(a) for a in self._allocations)

    def __enter__(self) -> KernelBench:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._functions = {}
        self._module = None
        allocations, self._allocations = self._allocations, []
        for allocation in allocations:
            try:
                allocation.free()
            except self._cuda.Error:
                pass  # a lost context frees everything when it goes

    def _spin(self) -> Any:
        """The module's SPIN_SYMBOL kernel, prepared, or None when it has none."""
        try:
            function = self._module.get_function(SPIN_SYMBOL)
        except self._cuda.Error:
            return None
        function.prepare("Q")
        return function

    def registers(self, symbol: str) -> int | None:
        """Registers per thread of `symbol` as the driver reports them."""
        try:
            return int(self._function(symbol).num_regs)
        except (self._cuda.Error, AttributeError):
            return None

    def time_us(self, symbol: str, grid: tuple[int, int, int], block: tuple[int, int, int],
                smem: int, tensor_maps: Sequence[Mapping[str, Any]] = (), maps_symbol: str | None = None) -> float:
        """Median time per launch of `symbol` in microseconds; LaunchRefused if it cannot run.

        `tensor_maps`: the kernel's TMA records ([Note: TMA record]) in argument order, each
        with `buffer` the index of the argument (of the bench's arrays) the map reads;
        `maps_symbol`: the module's constant array the kernel reads them from instead, if any.
        """
        cuda = self._cuda
        function = self._function(symbol)
        encoded = self._encode(symbol, tensor_maps)
        if maps_symbol is not None and encoded:
            tensormap.write_constant(cuda, self._module, maps_symbol, encoded, f"kernel {symbol}",
                                     "this is an aicfc bug")
        maps, (table,) = tensormap.upload(cuda, [encoded], symbol)
        try:
            return self._time(symbol, function, grid, block, smem, (table, *self._pointers) if maps else self._pointers)
        finally:
            if maps is not None:
                maps.free()

    def _time(self, symbol: str, function: Any, grid: tuple[int, int, int], block: tuple[int, int, int], smem: int,
              args: tuple[int, ...]) -> float:
        cuda = self._cuda
        function.prepare("P" * len(args))
        threads = block[0] * block[1] * block[2]
        try:
            limit = int(function.max_threads_per_block)
        except (cuda.Error, AttributeError):
            limit = threads
        if threads > limit:
            raise LaunchRefused(f"{threads} threads per block > {limit} that {symbol} can launch "
                                f"with its registers")
        if smem > _DEFAULT_SMEM_LIMIT:
            try:
                function.set_attribute(cuda.function_attribute.MAX_DYNAMIC_SHARED_SIZE_BYTES, smem)
            except cuda.Error as err:
                raise LaunchRefused(f"{smem} B of dynamic shared memory refused ({_one_line(err)})") from None
        start, stop = cuda.Event(), cuda.Event()
        spin = self._spin()
        enqueue_s = [ENQUEUE_US * 1e-6]   # the host's time per launch, last measured

        def launches(n: int) -> float:
            """Milliseconds for n back-to-back launches."""
            if spin is not None:
                hold_ms = min(SPIN_MAX_MS, 2e3 * n * enqueue_s[0] + 0.05)
                spin.prepared_call((1, 1, 1), (1, 1, 1), np.uint64(hold_ms * 1e6))
            start.record()
            t0 = time.perf_counter()
            for _ in range(n):
                function.prepared_call(grid, block, *args, shared_size=smem)
            enqueue_s[0] = (time.perf_counter() - t0) / n
            stop.record()
            stop.synchronize()
            return stop.time_since(start)

        try:
            function.prepared_call(grid, block, *args, shared_size=smem)
        except cuda.Error as err:
            self._check_alive(symbol)
            raise LaunchRefused(f"launch refused ({_one_line(err)})") from None
        try:
            return median_per_launch_us(launches, SPIN_LAUNCHES if spin is not None else MAX_LAUNCHES)
        except cuda.Error as err:
            self.device.lost = True
            raise RunError(f"tuning candidate {symbol} failed on the GPU ({_one_line(err)}); the "
                           f"GPU context is unusable now; this is a compiler bug, please report "
                           f"it with the model") from None

    def _function(self, symbol: str) -> Any:
        if symbol not in self._functions:
            try:
                function = self._module.get_function(symbol)
            except self._cuda.Error as err:
                raise RunError(f"kernel {symbol} is not in its tuning module ({_one_line(err)}); "
                               f"this is a compiler bug, please report it") from None
            self._functions[symbol] = function
        return self._functions[symbol]

    def _encode(self, symbol: str, records: Sequence[Mapping[str, Any]]) -> list[bytes]:
        """The candidate's tensor maps over the bench's buffers; a map the driver refuses
        refuses the candidate (the context stays usable)."""
        maps = []
        for i, record in enumerate(records):
            argument = record.get("buffer") if isinstance(record, Mapping) else None
            if not (isinstance(argument, int) and 0 <= argument < len(self._pointers)):
                raise LaunchRefused(f"tensor map {i} names argument {argument!r} of "
                                    f"{len(self._pointers)}")
            try:
                maps.append(tensormap.encode(record, self._pointers[argument],
                                             name=f"{symbol} tensor map {i}"))
            except RunError as err:
                raise LaunchRefused(str(err)) from None
        return maps

    def _check_alive(self, symbol: str) -> None:
        try:
            self.device.context.synchronize()
        except self._cuda.Error as err:
            self.device.lost = True
            raise RunError(f"tuning candidate {symbol} failed on the GPU ({_one_line(err)}); the "
                           f"GPU context is unusable now; this is a compiler bug, please report "
                           f"it with the model") from None


def median_per_launch_us(launches: Callable[[int], float], most: int = MAX_LAUNCHES) -> float:
    """Median time per launch in microseconds, by the method of the module docstring.

    `launches(n)` enqueues n back-to-back launches between two CUDA events and returns the
    elapsed milliseconds; the runtime's profiler (aicf_run.profile) measures the same way.
    `most` bounds n.
    """
    per_launch = launches(WARMUP) / WARMUP
    n = _count(per_launch, most)
    for _ in range(8):   # the warm-up's estimate may be off; grow n until MIN_MS is met
        elapsed = launches(n)
        if elapsed >= MIN_MS or n >= most:
            break
        n = min(most, max(n + 1, math.ceil(1.2 * n * MIN_MS / max(elapsed, 1e-6))))
    samples = [elapsed / n] + [launches(n) / n for _ in range(REPEATS - 1)]
    return statistics.median(samples) * 1e3


def _count(per_launch_ms: float, most: int = MAX_LAUNCHES) -> int:
    """Launches for one measurement, from an estimate of one launch's time: a slow candidate
    (a SIMT fp32 GEMM of 8192^3 takes 60 ms or more) is not launched MIN_LAUNCHES times."""
    per_launch_ms = max(per_launch_ms, 1e-6)
    floor = min(MIN_LAUNCHES, max(1, math.ceil(LONG_MS / per_launch_ms)))
    return min(most, max(floor, math.ceil(MIN_MS / per_launch_ms)))


def _one_line(err: BaseException) -> str:
    return " ".join(str(err).split())[:300] or type(err).__name__
