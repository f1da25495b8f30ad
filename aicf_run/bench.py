"""`aicf-run --bench N`: how long one whole-plan replay takes, with and without a CUDA graph.

What is timed: one replay of the launch plan, on the inputs already in the arena (no copies),
between two CUDA events recorded on the executor's stream, the stream idle before each
replay. A sample starts when the host begins to enqueue the plan and ends when the GPU
finishes its last kernel, so it holds the GPU's work plus every gap in which the GPU waited
for the host's next launch call: what a caller waits for, minus the copies. After WARMUP
untimed replays, `replays` samples are taken one at a time (each waited for before the next).

Without a graph the host makes one launch call per kernel; with one, a single cuGraphLaunch.
The difference of the two medians, divided by the number of kernels, is the host overhead per
kernel launch that the graph removes (negative when the graph costs more than it saves).
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from aicf_run.errors import RunError

if TYPE_CHECKING:
    from aicf_run.executor import Executor

WARMUP = 10
MODES = {True: "graph", False: "launches"}


@dataclass(frozen=True)
class PlanTiming:
    """Statistics of `replays` timed replays in one mode, in microseconds."""

    mode: str          # "graph": one cuGraphLaunch; "launches": one launch call per kernel
    replays: int
    median_us: float
    p90_us: float
    min_us: float
    max_us: float

    @classmethod
    def of(cls, mode: str, samples_us: list[float]) -> PlanTiming:
        return cls(mode=mode, replays=len(samples_us), median_us=statistics.median(samples_us),
                   p90_us=float(np.percentile(samples_us, 90)), min_us=min(samples_us),
                   max_us=max(samples_us))


@dataclass(frozen=True)
class BenchReport:
    """Whole-plan timings: `graph` and/or `launches`, and what the graph saves per kernel."""

    kernels: int
    warmup: int
    graph: PlanTiming | None
    launches: PlanTiming | None
    host_overhead_per_kernel_us: float | None   # (launches - graph) medians / kernels

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def bench(executor: Executor, replays: int, graph: bool | None = None) -> BenchReport:
    """Time `replays` replays with a graph (graph=True), without (False), or both (None)."""
    if replays < 1:
        raise RunError(f"--bench needs at least 1 replay, got {replays}")
    modes = [True, False] if graph is None else [graph]
    timings = {mode: time_plan(executor, replays, mode) for mode in modes}
    kernels = len(executor.bundle.kernels)
    with_graph, without = timings.get(True), timings.get(False)
    overhead = None
    if with_graph is not None and without is not None and kernels:
        overhead = (without.median_us - with_graph.median_us) / kernels
    return BenchReport(kernels=kernels, warmup=WARMUP, graph=with_graph, launches=without,
                       host_overhead_per_kernel_us=overhead)


def time_plan(executor: Executor, replays: int, graph: bool) -> PlanTiming:
    """`replays` samples of one replay each, as the module docstring says."""
    cuda = executor.device.driver
    stream = executor.stream
    start, stop = executor.events()
    for _ in range(WARMUP):
        executor.launch(graph=graph)
    executor.synchronize()
    samples: list[float] = []
    try:
        for _ in range(replays):
            start.record(stream)
            executor.launch(graph=graph)
            stop.record(stream)
            stop.synchronize()
            samples.append(stop.time_since(start) * 1e3)
    except cuda.Error as err:
        executor.synchronize()  # a kernel fault is reported as run() reports it
        raise RunError(f"cannot time the plan with CUDA events ({_one_line(err)}); check "
                       f"nvidia-smi") from None
    return PlanTiming.of(MODES[graph], samples)


def format_bench(report: BenchReport) -> str:
    """The report as the few lines `aicf-run --bench` prints."""
    lines = [f"bench: whole plan ({report.kernels} kernels), one replay per sample between "
             f"CUDA events on the stream, inputs in place, no copies; {report.warmup} warm-up "
             f"replays"]
    for timing in (report.graph, report.launches):
        if timing is not None:
            lines.append(f"  {timing.mode:<9} median {timing.median_us:9.2f} us   p90 "
                         f"{timing.p90_us:9.2f} us   min {timing.min_us:9.2f} us   "
                         f"({timing.replays} replays)")
    if report.host_overhead_per_kernel_us is not None:
        lines.append(f"  host overhead per kernel launch without a graph: "
                     f"{report.host_overhead_per_kernel_us:.2f} us "
                     f"((launches - graph) medians / {report.kernels} kernels)")
    return "\n".join(lines)


def _one_line(err: BaseException) -> str:
    return " ".join(str(err).split())[:300] or type(err).__name__
