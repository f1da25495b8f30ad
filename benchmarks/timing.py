"""CUDA-event timing shared by the benchmarks: warm-up, then the median of `reps` runs (us)."""
from __future__ import annotations

import statistics


def median_us(fn, sync, event, reps: int = 100, warmup: int = 10) -> float:
    """`event()` makes a CUDA event of the caller's library (PyCUDA or torch)."""
    for _ in range(warmup):
        fn()
    sync()
    times = []
    for _ in range(reps):
        start, stop = event(), event()
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        times.append(stop.time_since(start) if hasattr(stop, "time_since") else start.elapsed_time(stop))
    return statistics.median(times) * 1e3


def run_and_time(payload: dict, dev, inputs: dict, reps: int, warmup: int = 10) -> tuple[dict, float]:
    """Load a compiled `payload` on `dev`, run it once on `inputs` (those are the outputs
    returned), then time `Executor.launch()`: the whole plan on the inputs already in the
    arena, no copies or conversions. Returns (outputs, median us)."""
    import pycuda.driver as cuda
    from aicf_run.bundle import Bundle
    from aicf_run.executor import Executor
    ex = Executor(Bundle.from_payload(payload), dev)
    try:
        outputs = ex.run(inputs)
        return outputs, median_us(ex.launch, dev.context.synchronize, cuda.Event, reps, warmup)
    finally:
        ex.close()


def events_median_us(enqueue, start, stop, reps: int = 50, warmup: int = 5, per: int = 1,
                     stream=None) -> float:
    """Median over `reps` of the time between `start` and `stop` recorded around one
    `enqueue()`, divided by `per` (the calls `enqueue` makes back to back), in us.

    `start`/`stop` are a CUDA event pair of either library (PyCUDA: `time_since`; torch:
    `elapsed_time`), recorded on `stream` (None: the library's current/default stream);
    `enqueue` must put its work on that same stream. No host synchronisation happens between
    the two records, so when `enqueue` is one graph replay the GPU runs its calls back to back.
    """
    for _ in range(warmup):
        enqueue()
    return statistics.median(_timed(enqueue, start, stop, stream, per) for _ in range(reps))


def _timed(enqueue, start, stop, stream, per: int) -> float:
    """One `enqueue()` between `start` and `stop` recorded on `stream` (None: the library's
    current one), in us per call."""
    def record(event) -> None:
        if stream is None:
            event.record()
        else:
            event.record(stream)
    record(start)
    enqueue()
    record(stop)
    stop.synchronize()
    ms = stop.time_since(start) if hasattr(stop, "time_since") else start.elapsed_time(stop)
    return ms / per * 1e3


def paired_us(a, b, reps: int = 50, warmup: int = 5, per: int = 1) -> tuple[list[float], list[float]]:
    """Two sides timed replay by replay in turn: `a` and `b` are (enqueue, start, stop, stream)
    as `events_median_us` takes them. Each rep times one enqueue of each, the side that goes
    first alternating, so that a clock or temperature drift slower than one pair (a few ms)
    reaches both alike; compare them by the median of the per-pair ratios. Returns the
    `reps` times of each side, us per call (`per` calls an enqueue)."""
    for _ in range(warmup):
        a[0]()
        b[0]()
    ta, tb = [], []
    for i in range(reps):
        for side in ((a, b) if i % 2 == 0 else (b, a)):
            (ta if side is a else tb).append(_timed(*side, per))
    return ta, tb


def replays_for(one_call_us: float, most: int = 20, budget_us: float = 2000.0) -> int:
    """Calls to capture per graph: `most` for short calls (so the replay is long next to the
    event and launch overheads), fewer for long ones (a 60 ms fp32 GEMM needs no company), at
    least 1. `one_call_us` is a rough single-call time (NaN or <= 0: `most`)."""
    if not one_call_us > 0:   # also NaN
        return most
    return max(1, min(most, int(budget_us // one_call_us)))


def aicf_graph_us(ex, per: int = 20, reps: int = 50, warmup: int = 5) -> float:
    """An aicf Executor's plan timed as torch's side is: `per` back-to-back runs of the plan
    (its kernels launched one by one, `launch(graph=False)`) captured into one CUDA graph on
    the executor's stream; replays timed between CUDA events on that stream, / `per`; median
    of `reps`. The GPU runs the plans back to back, so a small kernel is timed, not the host's
    launch rate."""
    stream = ex.stream
    graph = aicf_graph(ex, per)
    try:
        start, stop = ex.events()
        t = events_median_us(lambda: graph.launch(stream), start, stop, reps, warmup, per, stream)
        ex.synchronize()
        return t
    finally:
        graph.close()


def aicf_graph(ex, per: int):
    """`per` back-to-back runs of `ex`'s plan (its kernels launched one by one) captured into one
    CUDA graph on the executor's stream and uploaded (what aicf_graph_us times); close() it."""
    from aicf_run.graph import Graph

    def plans() -> None:
        for _ in range(per):
            ex.launch(graph=False)
    graph = Graph.capture(ex.stream, plans)
    try:
        graph.upload(ex.stream)
    except BaseException:
        graph.close()
        raise
    return graph


def aicf_launches_us(ex, per: int = 20, reps: int = 50, warmup: int = 5) -> float:
    """`per` back-to-back `Executor.launch()` calls (each one replay of the plan's own graph)
    from the host, between CUDA events on the executor's stream, / `per`; median of `reps`.
    What a caller looping on launch() gets: bounded below by the host's launch rate (a few us
    per call through PyCUDA)."""
    stream = ex.stream
    start, stop = ex.events()

    def launches() -> None:
        for _ in range(per):
            ex.launch()
    t = events_median_us(launches, start, stop, reps, warmup, per, stream)
    ex.synchronize()
    return t


def torch_graph_us(fn, per: int = 20, reps: int = 50, warmup: int = 5) -> float:
    """`per` back-to-back `fn()` calls captured into one torch.cuda.CUDAGraph (after warm-up on
    a side stream, as torch requires for cuBLAS), replays timed between CUDA events on the
    current stream, / `per`; median of `reps`. `fn` must write preallocated outputs (e.g.
    `torch.matmul(a, b, out=c)`) and allocate nothing."""
    import torch
    graph = torch_graph(fn, per)
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    try:
        return events_median_us(graph.replay, start, stop, reps, warmup, per)
    finally:
        torch.cuda.synchronize()
        del graph


def torch_graph(fn, per: int):
    """`per` back-to-back `fn()` calls captured into one torch.cuda.CUDAGraph, after warm-up on a
    side stream as torch requires for cuBLAS (what torch_graph_us times)."""
    import torch
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(per):
            fn()
    return graph


def paired_graphs_us(ex, fn, per: int = 20, reps: int = 50, warmup: int = 5) -> tuple[list[float], list[float]]:
    """aicf and torch in turn, replay by replay (`paired_us`): `per` runs of `ex`'s plan in one
    graph on its stream, as aicf_graph_us captures them, against `per` `fn()` calls in one torch
    graph, as torch_graph_us captures them. Returns (aicf times, torch times), us per call."""
    import torch
    ours = aicf_graph(ex, per)
    theirs = torch_graph(fn, per)
    try:
        a = (lambda: ours.launch(ex.stream), *ex.events(), ex.stream)
        b = (theirs.replay, torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True), None)
        return paired_us(a, b, reps, warmup, per)
    finally:
        ex.synchronize()
        torch.cuda.synchronize()
        ours.close()
        del theirs
