"""Each kernel's time inside its plan: the slot it takes in a replay of the plan's CUDA graph.

    from benchmarks.in_plan import measure
    slots = measure(executor, [k["symbol"] for k in payload["kernels"]])   # {kernel index: us}

[Note: in-plan slots]
`Executor.profile()` times a kernel alone: 20 launches of it back to back in a graph. Twin
launches overlap each other's start-up, and a kernel of the plan waits for a different
predecessor: on an H100 the plans of BERT-base and GPT-2 small ran 1.2-2.0 us a kernel longer
than their kernels alone summed (benchmarks/results/gemm_predictions_session8_h100.txt: BERT B1
S128 480.5 us against 377.9, 85 kernels). The cost model charges a kernel its launch as timed
alone and the plan's extra as a separate gap ([Note: launch overhead and the plan gap] in
aicfc/planner/hardware.py), so a kernel's slot should read about plan_gap_us over its
prediction. Here the plan's graph is replayed under torch.profiler (CUPTI sees every kernel of
the process's primary context, aicf_run's too); in each replay kernel i's slot is its end minus
the end of kernel i - 1 (the first kernel of a replay: its duration). The median over replays
is its in-plan time, and the slots of a replay add up to the replay's span, so their sum is the
plan's time as the GPU ran it. Ends, not starts: under dependent launches ([Note: PDL]) a
kernel's blocks start on the SMs while its predecessor runs and wait there, so start-to-start
slots measured the launch stagger. Session 10's H200 run with start-to-start slots put 42 of
156 GEMM kernels in band at ratios from 0.14 to 1.77
(benchmarks/results/gemm_predictions_session10_h200.txt); those in-plan figures are void, and
the end-to-end slots have not yet run on a GPU. Tracing costs something per kernel; the report
prints the slots' sum beside the plan's time from CUDA events, so that cost shows.
"""
from __future__ import annotations

import json
import statistics
import tempfile
from pathlib import Path
from typing import Any, Sequence

REPLAYS = 30


def slots(events: Sequence[dict[str, Any]], symbols: Sequence[str]) -> dict[int, float]:
    """{kernel index: median slot in us} from chrome-trace kernel events (`name`, `ts`, `dur`,
    in us) of back-to-back replays of a plan whose kernels, in launch order, are `symbols`.

    A kernel's slot is its end minus its predecessor's end in the same replay (the first
    kernel of a replay: its duration). Events are walked in start order and matched against
    the plan's sequence, replay after replay; where the plan's first kernel comes before the
    replay's last, a kernel went missing and matching starts over; a kernel whose predecessor
    was not matched gets no slot in that replay. Events of other kernels are skipped."""
    if not symbols:
        return {}
    ordered = sorted((e for e in events if "ts" in e and "dur" in e), key=lambda e: float(e["ts"]))
    found: dict[int, list[float]] = {i: [] for i in range(len(symbols))}
    at = 0                                   # the plan's kernel expected next
    last: tuple[int, float] | None = None    # (index, end) of the kernel matched last
    for e in ordered:
        name, ts, dur = _short(e.get("name", "")), float(e["ts"]), float(e["dur"])
        if name != symbols[at] and name == symbols[0]:   # a replay started over: a kernel went missing
            at, last = 0, None
        if name != symbols[at]:
            continue
        if at == 0:
            found[0].append(dur)
        elif last is not None and last[0] == at - 1:
            found[at].append(ts + dur - last[1])
        last = (at, ts + dur)
        at = (at + 1) % len(symbols)
    return {i: statistics.median(v) for i, v in found.items() if v}


def _short(name: str) -> str:
    """A kernel's function name as the bundle records it: CUPTI gives extern "C" names as they
    are, and C++ ones demangled with their parameter list."""
    return name.split("(", 1)[0].strip()


def measure(executor: Any, symbols: Sequence[str], replays: int = REPLAYS) -> dict[int, float]:
    """Replay `executor`'s plan `replays` times under torch.profiler (CUDA activity) and return
    `slots` of the traced kernels. The executor's inputs must be in place (a `run` first)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()                 # torch's CUDA state (the same primary context) before CUPTI starts
    executor.launch()
    executor.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(replays):
            executor.launch()
        executor.synchronize()
        torch.cuda.synchronize()
    with tempfile.TemporaryDirectory(prefix="aicf-in-plan-") as tmp:
        path = Path(tmp) / "trace.json"
        prof.export_chrome_trace(str(path))
        trace = json.loads(path.read_text())
    events = [e for e in trace.get("traceEvents", []) if e.get("cat") == "kernel"]
    return slots(events, symbols)
