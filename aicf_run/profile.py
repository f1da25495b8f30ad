"""`aicf-run --profile`: each kernel timed alone, beside its predicted time and the roofline.

How it is timed: each kernel of the plan is launched alone, back to back on the executor's
stream between two CUDA events, by `aicf_run.timing.median_per_launch_us` (warm-up, then
enough launches to last MIN_MS, the median of REPEATS measurements, per launch), as `aicfc
tune` times candidates. From Python one launch call costs the host about 4 us, longer than a
small kernel runs, so back-to-back launches from the host would time the host. With a graph
(the executor's default) each kernel is therefore captured GRAPH_LAUNCHES times in a row into
a graph of its own, and the replays of that graph are timed: the GPU runs the launches back
to back, and the time per launch is the kernel's own. With graph=False the kernels are
launched from the host, and the report says so. The whole plan is timed the same way
(back-to-back replays of its graph, or of its launches), so the sum of the kernel times and
the plan time compare like for like: their difference is what running the kernels together
saves or costs (L2 reuse, launch gaps). `marginals` places that difference: each kernel's cost in
the plan, the plan's time less the time of the plan without it.

The kernels run on the arena as the last run left it. A kernel that works in place reads its
own output again when repeated; its values drift, the memory it touches does not. The next
`run` copies its inputs in and recomputes every intermediate, so profiling changes no result.

[Note: cold weights]
A kernel timed alone follows itself, so what it read the launch before is still in L2 where it fits
there. In a plan it is not: a decode step streams every weight once (2 GB for a 1 B Llama, past the
L2's 50 MB many times over) and reads each layer's cache once, and a CNN's plan passes all its
activations through L2 between two reads of one filter. Timed as they were, the decode step's QKV and
O projections (8-12 MB of weight) and its attention (1.5 MB of cache) measured 0.64-0.77 of their
predictions while the gate/up, down and LM head, whose weights do not stay, measured 0.93-1.0
(session 60, generate_b1_profile_session60_h200.txt): the prediction was of the plan, the measurement
of a warm L2. So where the bundle's target names its L2 (`l2_bytes`), each kernel's launches rotate
over copies of the weights and state it reads that fit in L2 (and of the activations it writes: [Note: outputs
written back] below), made for the timing and freed after it:
enough copies that between two launches of one copy the others touch COLD_L2S times the L2 (counted
by the kernel's predicted DRAM bytes; at most MAX_COPIES), as benchmarks/gemv.py times gemvs over
copies of their weights. The copies of a kernel stay within COPY_L2S times the L2; a buffer that would pass it (the
gate/up weight that the O projection only prefetches a head of) is read where it lies. A kernel that
takes tensor maps (the Hopper GEMMs and convolutions) is launched with maps of its own at the copies
([Note: moved maps] in aicf_run/moved.py; until session 79 it kept its buffers). The activations it
reads are not moved: in a plan the kernel before has just written them into L2. The table's header
says how many kernels were timed so. Built in session 61 without a GPU (tested on the fake one):
whether the QKV, O and attention then measure within [0.8, 1.25] of their predictions is the next
GPU profile's to say.

[Note: outputs written back]
Repeated alone, a kernel also writes its output into the same L2 lines launch after launch, and those lines,
overwritten before they are ever evicted, never go back to DRAM; in a plan every activation is written back
once the L2 needs its lines. ResNet-50 B32's memory-bound kernels whose bytes fit in L2 measured 0.51-0.76 of
their DRAM-bound predictions alone and 0.78-1.02 in the plan's chain (session 78, an H100,
benchmarks/results/trigger_end_session78_h100.txt: its stage-3 projection copy 4.2 us alone, 7.3 in the chain,
8.1 predicted). So the arena buffers a kernel stores rotate over copies too, as its weights do, where no other
argument shares their bytes; what the kernel reads that the kernel before it wrote stays where it lies, warm as
in the plan. The Hopper GEMMs and convolutions, whose tensor maps hold their buffers' addresses, rotate too
since session 79 ([Note: moved maps] in aicf_run/moved.py); for every kernel the plan's own figure is its time in
the chain (`aicf-run --timeline`). Measured (session 78, call 4 of the same file, an H100): ResNet-50 B32's five
pointwise kernels so timed moved toward their times in the chain (call 3's, another H100): the stage-2, -3 and -4
projection copies 9.4 -> 14.4, 4.2 -> 6.2 and 3.2 -> 3.7 us (in the chain 12.8, 7.2 and 5.3; predicted 16.0, 8.1
and 4.2), stage 1's residual add 17.0 -> 20.0 (17.5 in the chain), the pooling 3.0 either way (3.7): past the chain
where the plan's next kernels hide some of the write-back, short of it elsewhere; the mean |log(alone / chain)| of
the five 0.32 -> 0.20.
A tensor a kernel updates in place (its output over exactly the bytes of an input of another name: a residual
add) moves with that input, one copy for both, unless the kernel before wrote it (then it is warm in the plan
too); an output overlapping another argument only in part stays. Measured (session 79, an H100,
benchmarks/results/moved_maps_session79.txt): with the Hopper kernels rotating and these updates moved,
ResNet-50 B32's expansions with their residual ran alone 15.8 -> 23.4 us (stage 2; 21.3 in the chain, 21.3
predicted), 10.2 -> 13.1 (stage 3; 11.5) and 9.5 -> 11.8 (stage 4; 10.4-10.9), and the mean |log(alone / chain)|
of the 52 convolutions went 0.115 -> 0.104 (0.155 in session 78, rotating neither, its alone and chain times from
two other H100s).

Per kernel, beside the measured time:
- predicted: the bundle's `predicted.time_us`, the cost model's estimate (launch included);
- GB/s and TFLOP/s: the predicted DRAM `bytes` and the `flops` over the measured time;
- roofline: 100 · max(bytes / B, flops / peak) / measured, the share of the roofline bound
  attained, with B the target's `dram_bandwidth_gbs` and peak its `peak_tflops` entry for the
  kernel's arithmetic unit (`unit`).
The table ends with how many kernels measure within BAND of their predictions.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, Callable

from aicf_run.errors import RunError
from aicf_run.graph import Graph
from aicf_run.roofline import Point
from aicf_run.schema import launch_records
from aicf_run.timing import REPEATS, median_per_launch_us

if TYPE_CHECKING:
    from aicf_run.executor import Executor

# The peak_tflops entry of a tensor-core GEMM (params unit="mma") by its mma dtype; any other
# kernel runs on the fp32 SIMT pipes. Mirrors MMA_UNIT in aicfc/planner/cost.py: the runtime
# must not import the compiler.
_MMA_UNIT = {"tf32": "tf32_tc", "f16": "fp16_tc", "bf16": "bf16_tc"}
# The schedule units that multiply on tensor cores (aicfc/codegen: gemm_mma, gemm_wgmma and conv_wgmma,
# conv_taps, conv_pool, conv_band); before the last two were listed, their kernels were held to the fp32 pipes'
# peak and `--profile` printed 500-800% of the roofline for them.
_TC_UNITS = ("mma", "wgmma", "taps", "pool", "band")
# Launches of one kernel per graph replay when kernels are timed through graphs.
GRAPH_LAUNCHES = 20
# [Note: cold weights]: between two launches of one copy the others touch this many L2s; the copies'
# memory stays within COPY_L2S L2s.
COLD_L2S = 2
COPY_L2S = 4
# The band a kernel's measured / predicted time should fall in (the project's standard for the cost model).
BAND = (0.8, 1.25)
MAX_COPIES = 64   # a small kernel's launches a replay stay few; its few bytes barely stay warm anyway
_METHODS = {"graph": f"{GRAPH_LAUNCHES} back-to-back launches per graph replay",
            "launches": "back-to-back launches from the host"}


@dataclass(frozen=True)
class KernelProfile:
    """One kernel: measured against predicted, and where it sits under the roofline."""

    index: int
    name: str
    measured_us: float
    predicted_us: float | None
    flops: float | None
    bytes: float | None
    share: float                 # of the sum of the measured kernel times, 0..1
    gbs: float | None            # predicted DRAM bytes / measured time
    tflops: float | None         # flops / measured time
    unit: str | None             # the peak_tflops entry its roofline uses
    roofline_pct: float | None   # 100 · roofline-bound time / measured time
    onnx_nodes: tuple[str, ...]
    copies: int = 1              # of its weights, state and outputs, its launches rotated over ([Note: cold weights])


@dataclass(frozen=True)
class ProfileReport:
    """Every kernel alone, their sum, and the whole plan timed the same way."""

    kernels: tuple[KernelProfile, ...]
    kernel_sum_us: float
    predicted_sum_us: float | None
    plan_us: float
    mode: str                    # "graph" or "launches": how the kernels and the plan were run
    repeats: int

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def profile(executor: Executor) -> ProfileReport:
    """Time every kernel of `executor`'s plan alone, then the whole plan (module docstring)."""
    timed = [_kernel_us(executor, i) for i in range(len(executor.bundle.kernels))]
    plan_us = _median_us(executor, executor.launch)
    total = sum(t for t, _ in timed)
    target = executor.bundle.target.get("profile", {})
    kernels = tuple(_kernel(i, kernel, measured, total, target, copies)
                    for i, (kernel, (measured, copies)) in enumerate(zip(executor.bundle.kernels, timed)))
    predicted = [k.predicted_us for k in kernels]
    return ProfileReport(
        kernels=kernels, kernel_sum_us=total,
        predicted_sum_us=None if None in predicted else sum(p for p in predicted if p is not None),
        plan_us=plan_us, mode="graph" if executor.uses_graph else "launches", repeats=REPEATS)


def marginals(executor: Executor) -> list[float]:
    """Each kernel's in-plan marginal time in us: the whole plan's time less the time of the plan
    without that kernel, both timed as `profile` times the plan (graph replays, or launches from
    the host). A kernel timed alone follows itself; this is what it costs after the kernel the
    plan puts before it (launch overlap, placement beside that kernel, L2 contents). The plan
    without a kernel reads what the last run left in that kernel's outputs: the times, not the
    values, are what it measures. The difference of two medians, each pair timed one after the
    other (clocks drift over a long profile): noisy to a few tenths of a us."""
    n = len(executor.bundle.kernels)
    out = []
    for skip in range(n):
        def without(skip: int = skip) -> None:
            for index in range(n):
                if index != skip:
                    executor.launch_kernel(index)
        out.append(_median_us(executor, executor.launch) - _timed_us(executor, without))
    return out


def peak_unit(kernel: dict[str, Any]) -> str | None:
    """The `peak_tflops` entry that bounds `kernel` (None for an mma dtype not known here): the tensor cores'
    for the units that run on them, the fp32 pipes' for the rest (the gemv too, bound by its bytes)."""
    params = kernel.get("params", {})
    if params.get("unit") in _TC_UNITS:
        return _MMA_UNIT.get(params.get("dtype"))
    return "fp32_simt"


def roofline_points(report: ProfileReport) -> list[Point]:
    """A predicted and a measured point per kernel with flops and bytes, for `plot_roofline`."""
    points = []
    for k in report.kernels:
        if k.flops is None or k.bytes is None:
            continue
        if k.predicted_us is not None:
            points.append(Point(k.name, k.flops, k.bytes, k.predicted_us, "predicted"))
        points.append(Point(k.name, k.flops, k.bytes, k.measured_us, "measured"))
    return points


def format_profile(report: ProfileReport) -> str:
    """The table `aicf-run --profile` prints."""
    header = ("#", "kernel", "measured us", "predicted us", "meas/pred", "share", "GB/s",
              "TFLOP/s", "roofline", "onnx nodes")
    rows = [header]
    ratios = [None if not k.predicted_us else k.measured_us / k.predicted_us for k in report.kernels]
    for k, ratio in zip(report.kernels, ratios):
        rows.append((str(k.index), k.name, f"{k.measured_us:.2f}", _num(k.predicted_us, ".2f"),
                     _num(ratio, ".2f"), f"{100 * k.share:.1f}%", _num(k.gbs, ".1f"),
                     _num(k.tflops, ".3f"), _num(k.roofline_pct, ".1f", "%"),
                     ", ".join(k.onnx_nodes)))
    widths = [max(len(row[i]) for row in rows) for i in range(len(header) - 1)]
    # Text columns (kernel) left-aligned, numbers right-aligned, the node list last and free.
    lines = ["  " + "  ".join(cell.ljust(w) if i == 1 else cell.rjust(w)
                              for i, (cell, w) in enumerate(zip(row, widths))) + "  " + row[-1]
             for row in rows]
    predicted = ("" if report.predicted_sum_us is None
                 else f" (predicted {report.predicted_sum_us:.2f} us)")
    known = [r for r in ratios if r is not None]
    within = [r for r in known if BAND[0] <= r <= BAND[1]]
    cold = sum(k.copies > 1 for k in report.kernels)
    rotated = f"; {cold} with their weights, state and outputs rotated over copies past the L2" if cold else ""
    return "\n".join(
        [f"profile: {len(report.kernels)} kernels, each timed alone ({_METHODS[report.mode]}, "
         f"between CUDA events, median of {report.repeats}{rotated})"]
        + lines
        + [f"  sum of kernel times {report.kernel_sum_us:.2f} us{predicted}; whole plan "
           f"({report.mode}, back-to-back replays) {report.plan_us:.2f} us"]
        + ([f"  measured / predicted within [{BAND[0]}, {BAND[1]}]: {len(within)} of {len(known)} kernels"]
           if known else [])
        + _past_the_roofline(report))


def _past_the_roofline(report: ProfileReport) -> list[str]:
    """The footnote for kernels measured faster than the roofline allows: repeated alone, what they read and
    wrote stayed in L2 (their own output overwritten there, never written back), which a plan does not give
    them; the chain's times (`aicf-run --timeline`) are what they take there."""
    past = [k.name for k in report.kernels if k.roofline_pct is not None and k.roofline_pct > 100]
    if not past:
        return []
    names = ", ".join(past[:6]) + (f" and {len(past) - 6} more" if len(past) > 6 else "")
    return [f"  {len(past)} kernel(s) ran past the roofline ({names}): repeated alone, their bytes stayed in L2; "
            f"what they take in the plan is their time in the chain (aicf-run --timeline of a bundle compiled "
            f"with --timeline)"]


def _predicted(kernel: dict[str, Any], key: str) -> float | None:
    """A launch's predicted `key` (time_us, flops, bytes): the sum over its records; None where one lacks it."""
    values = [_float(r.get("predicted", {}).get(key)) for r in launch_records(kernel)]
    return None if None in values else sum(values)


def _kernel(index: int, kernel: dict[str, Any], measured: float, total: float,
            target: dict[str, Any], copies: int = 1) -> KernelProfile:
    records = launch_records(kernel)   # timed as one launch
    time_us, flops, nbytes = (_predicted(kernel, key) for key in ("time_us", "flops", "bytes"))
    unit = peak_unit(kernel)
    bandwidth = _float(target.get("dram_bandwidth_gbs"))
    peak = _float(target.get("peak_tflops", {}).get(unit)) if unit else None
    roofline = None
    if flops is not None and nbytes is not None and bandwidth and peak and measured > 0:
        bound_us = max(nbytes / (bandwidth * 1e3), flops / (peak * 1e6))
        roofline = 100 * bound_us / measured
    return KernelProfile(
        index=index, name="+".join(r["name"] for r in records), measured_us=measured, predicted_us=time_us,
        flops=flops, bytes=nbytes, share=measured / total if total > 0 else 0.0,
        gbs=None if nbytes is None or measured <= 0 else nbytes / (measured * 1e3),
        tflops=None if flops is None or measured <= 0 else flops / (measured * 1e6),
        unit=unit, roofline_pct=roofline, onnx_nodes=tuple(n for r in records for n in r.get("onnx_nodes", ())),
        copies=copies)


def cold_copies(kernel: dict[str, Any], buffers: list[dict[str, Any]], l2_bytes: int,
                warm: tuple[tuple[int, int], ...] = ()) -> tuple[int, list[int]]:
    """[Note: cold weights]: how many copies a kernel's launches rotate over, and the positions in its `args` of
    the buffers copied (its weights and state, and the activations it writes: [Note: outputs written back]; the
    arguments that share one buffer's bytes exactly take one copy); (1, []) where none is. `warm`: the arena byte
    ranges (start, end) the kernel before it in the plan wrote, which a tensor it updates in place keeps."""
    args = kernel["args"]
    stores = _stored_names(kernel)
    groups: dict[Any, set[int]] = {}   # one copy each: a weight or state buffer, or an activation's bytes
    for i, b in enumerate(args):
        buffer = buffers[b]
        if not 0 < buffer["nbytes"] <= l2_bytes:
            continue
        if buffer["region"] in ("weights", "state"):
            groups.setdefault(b, set()).add(i)
        elif with_i := _moved_with(i, args, buffers, stores, warm):
            groups.setdefault(_range(buffer), set()).update(with_i)
    if not groups:
        return 1, []
    sizes = {key: buffers[args[min(group)]]["nbytes"] for key, group in groups.items()}
    touched = _predicted(kernel, "bytes") or float(sum(sizes.values()))
    copies = min(math.ceil(COLD_L2S * l2_bytes / touched) + 1, MAX_COPIES)
    moved, spent = [], 0
    for key, group in sorted(groups.items(), key=lambda item: (sizes[item[0]], min(item[1]))):
        nbytes = sizes[key]
        if spent + (copies - 1) * nbytes > COPY_L2S * l2_bytes:
            break
        moved.extend(group)
        spent += (copies - 1) * nbytes
    return (copies, sorted(moved)) if moved else (1, [])


def stored_ranges(kernel: dict[str, Any], buffers: list[dict[str, Any]]) -> tuple[tuple[int, int], ...]:
    """The arena byte ranges (start, end) of the buffers `kernel` stores."""
    stores = _stored_names(kernel)
    return tuple(_range(buffers[b]) for b in kernel["args"]
                 if buffers[b]["region"] == "arena" and buffers[b].get("name") in stores)


def _stored_names(kernel: dict[str, Any]) -> set[str]:
    """The names of the buffers a launch's kernel records store."""
    return {name for record in launch_records(kernel) for name in record.get("stores", ())}


def _sharing(i: int, args: list[int], buffers: list[dict[str, Any]]) -> list[int]:
    """The positions of the arena arguments whose bytes overlap argument `i`'s (`i` among them)."""
    lo, hi = _range(buffers[args[i]])
    return [j for j, a in enumerate(args)
            if buffers[a]["region"] == "arena" and _range(buffers[a])[0] < hi and lo < _range(buffers[a])[1]]


def _range(buffer: dict[str, Any]) -> tuple[int, int]:
    return buffer["offset"], buffer["offset"] + buffer["nbytes"]


def _moved_with(i: int, args: list[int], buffers: list[dict[str, Any]], stores: set[str],
                warm: tuple[tuple[int, int], ...] = ()) -> list[int]:
    """[Note: outputs written back]: the positions that move with argument `i` (`i` among them) where it is an
    activation the kernel writes (an arena buffer it stores) that can move, else none: no other argument shares part
    of its bytes (read where it lies and written into the copy, such a tensor would read warm); arguments over
    exactly its bytes (a tensor updated in place under another name) move with it, unless the kernel before wrote
    them (`warm`: in the plan the update reads them from L2)."""
    b = buffers[args[i]]
    if b["region"] != "arena" or b.get("name") not in stores:
        return []
    sharing = _sharing(i, args, buffers)
    if any(_range(buffers[args[j]]) != _range(b) for j in sharing):
        return []
    lo, hi = _range(b)
    return sharing if len(sharing) == 1 or not any(start < hi and lo < end for start, end in warm) else []


def _kernel_us(executor: Executor, index: int) -> tuple[float, int]:
    """Kernel `index` alone, through a graph of GRAPH_LAUNCHES launches (rounded up to whole rounds of its
    copies), or from the host; and the copies of its weights, state and outputs the launches rotated over ([Note: cold
    weights])."""
    buffers, kernel = executor.bundle.buffers, executor.bundle.kernels[index]
    l2_bytes = executor.bundle.target.get("profile", {}).get("l2_bytes")
    pointers = executor.kernel_pointers(index)
    copies, moved = 1, []
    if isinstance(l2_bytes, int) and l2_bytes > 0:
        before = executor.bundle.kernels[index - 1] if index else None
        copies, moved = cold_copies(kernel, buffers, l2_bytes, () if before is None else stored_ranges(before, buffers))
    held: list[Any] = []
    try:
        enqueue = [lambda: executor.launch_kernel(index)]
        for _ in range(copies - 1):
            made: dict[int, int] = {}   # arguments over the same bytes take the same copy
            for i in moved:
                if pointers[i] not in made:
                    held.append(executor.device_copy(pointers[i], buffers[kernel["args"][i]]["nbytes"]))
                    made[pointers[i]] = int(held[-1])
            copy = {i: made[pointers[i]] for i in moved}
            held.append(executor.kernel_moved(index, copy))   # its tensor maps follow: [Note: moved maps]
            enqueue.append(held[-1])
        if not executor.uses_graph:
            turns = itertools.cycle(enqueue)
            return _timed_us(executor, lambda: next(turns)()), copies
        n = copies * math.ceil(GRAPH_LAUNCHES / copies)

        def launches() -> None:
            for i in range(n):
                enqueue[i % copies]()
        return _timed_us(executor, launches) / n, copies
    finally:
        if held:
            executor.synchronize()
        for allocation in held:
            allocation.free()


def _timed_us(executor: Executor, enqueue: Callable[[], None]) -> float:
    """Median time per `enqueue()` in us: replays of a graph of it where the executor replays
    graphs, else `enqueue()` itself from the host."""
    if not executor.uses_graph:
        return _median_us(executor, enqueue)
    stream = executor.stream
    graph = Graph.capture(stream, enqueue)
    try:
        graph.upload(stream)
        return _median_us(executor, lambda: graph.launch(stream))
    finally:
        graph.close()


def _median_us(executor: Executor, enqueue: Callable[[], None]) -> float:
    """Median time per `enqueue()` in microseconds, back to back on the executor's stream."""
    cuda = executor.device.driver
    stream = executor.stream
    start, stop = executor.events()

    def launches(n: int) -> float:
        start.record(stream)
        for _ in range(n):
            enqueue()
        stop.record(stream)
        stop.synchronize()
        return stop.time_since(start)

    try:
        return median_per_launch_us(launches)
    except cuda.Error as err:
        executor.synchronize()  # a kernel fault is reported as run() reports it
        raise RunError(f"cannot time the kernels with CUDA events ({_one_line(err)}); check "
                       f"nvidia-smi") from None


def _float(value: Any) -> float | None:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    return None


def _num(value: float | None, spec: str, suffix: str = "") -> str:
    return "-" if value is None else f"{value:{spec}}{suffix}"


def _one_line(err: BaseException) -> str:
    return " ".join(str(err).split())[:300] or type(err).__name__
