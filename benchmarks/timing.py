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
