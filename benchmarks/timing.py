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
