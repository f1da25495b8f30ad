"""`aicf-run --timeline`: when each kernel's blocks reached the SMs and when the kernel could
start, in replays of the whole plan, from the stamps a bundle compiled with `aicfc compile
--timeline` records ([Note: timeline] in aicfc/codegen/timeline.py).

How it is measured: the plan is replayed once to warm up, then ROUNDS times; before each timed
replay every kernel's stamp array is zeroed, after it the stamps are read back. Each block of
a kernel stamped `arrived` (the global clock when it reached the kernel's entry, before the
dependent-launch wait) and `ready` (after the wait). Per kernel and replay, relative to the
plan's start (the first kernel's go):

- go: the first `ready` of its blocks, the moment the kernel before it had completed (or, for
  a plain launch, its first block's start);
- in chain: the next kernel's go less this one's: what the kernel adds to the plan where the
  kernels run back to back (none for the last kernel: nothing stamps its end);
- landed: its first and last block's arrival; a block landed early when it arrived before the
  kernel's go (by more than EARLY_NS): it sat on an SM while the previous kernel still ran;
- reached: blocks that stamped (a block that returns before its entry leaves zeros).

The figures of each kernel are the medians over the rounds. The plan runs with two clock
reads and one store a block more than without --timeline; `aicf-run --bench` on a bundle
compiled without it times the plan as it is.
"""
from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

from aicf_run.errors import RunError

if TYPE_CHECKING:
    from aicf_run.executor import Executor

ROUNDS = 5
EARLY_NS = 100     # an arrival this much before the kernel's go counts as early (clock reads, the wait's own latency)
COMPILE_HINT = "recompile it with aicfc compile --timeline"


@dataclass(frozen=True)
class KernelTimes:
    """One kernel's place in the plan, in us from the plan's start (medians over the rounds)."""

    index: int
    name: str
    blocks: int                  # blocks stamped (the first CAP of the grid)
    reached: int                 # of them, blocks that reached the entry
    first_landed_us: float
    last_landed_us: float
    go_us: float
    chain_us: float | None       # next kernel's go less this one's; None for the last kernel
    early: int                   # blocks that arrived before go
    predicted_us: float | None
    onnx_nodes: tuple[str, ...]


@dataclass(frozen=True)
class TimelineReport:
    kernels: tuple[KernelTimes, ...]
    rounds: int
    last_go_us: float            # the last kernel's go: the plan up to its last kernel
    predicted_sum_us: float | None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def timeline(executor: Executor, rounds: int = ROUNDS) -> TimelineReport:
    """Replay `executor`'s plan `rounds` times and read every kernel's stamps (module docstring)."""
    arrays = executor.stamp_arrays()
    if not arrays or any(a is None for a in arrays):
        raise RunError(f"{executor.bundle.path}: its kernels record no timeline; {COMPILE_HINT}")
    cuda = executor.device.driver
    executor.launch()
    executor.synchronize()
    per_round = []
    for _ in range(rounds):
        for address, blocks in arrays:
            cuda.memset_d8(address, 0, 16 * blocks)
        executor.launch()
        executor.synchronize()
        stamps = []
        for address, blocks in arrays:
            host = np.empty((blocks, 2), np.uint64)
            cuda.memcpy_dtoh(host, address)
            stamps.append(host)
        per_round.append(stamps)
    return summarize(per_round, executor.bundle.kernels)


def summarize(rounds: Sequence[Sequence[np.ndarray]], kernels: Sequence[dict]) -> TimelineReport:
    """The report from each round's stamps (per kernel a [blocks, 2] array of arrived, ready ns;
    zeros where a block did not reach its entry)."""
    if not rounds:
        raise RunError("--timeline needs at least one replay")
    measured = [_one_round(stamps, kernels) for stamps in rounds]
    out = []
    for i, kernel in enumerate(kernels):
        rows = [m[i] for m in measured]

        def med(key: str) -> float:
            return statistics.median(r[key] for r in rows)
        chain = None if i == len(kernels) - 1 else med("chain")
        predicted = kernel.get("predicted", {}).get("time_us")
        out.append(KernelTimes(
            index=i, name=kernel["name"], blocks=len(rounds[0][i]), reached=int(med("reached")),
            first_landed_us=med("first"), last_landed_us=med("last"), go_us=med("go"), chain_us=chain,
            early=int(med("early")), predicted_us=float(predicted) if isinstance(predicted, (int, float)) else None,
            onnx_nodes=tuple(kernel.get("onnx_nodes", ()))))
    predicted = [k.predicted_us for k in out]
    return TimelineReport(kernels=tuple(out), rounds=len(rounds),
                          last_go_us=statistics.median(m[-1]["go"] for m in measured),
                          predicted_sum_us=None if None in predicted else sum(p for p in predicted if p is not None))


def _one_round(stamps: Sequence[np.ndarray], kernels: Sequence[dict]) -> list[dict[str, float]]:
    rows = []
    for i, s in enumerate(stamps):
        hit = s[(s[:, 0] > 0) & (s[:, 1] > 0)].astype(np.int64)
        if len(hit) == 0:
            raise RunError(f"kernel {i} ({kernels[i]['name']}): no block stamped its entry in a replay; "
                           f"the bundle's stamps are not being written, {COMPILE_HINT}")
        go = int(hit[:, 1].min())
        rows.append({"reached": len(hit), "first": int(hit[:, 0].min()), "last": int(hit[:, 0].max()), "go": go,
                     "early": int((hit[:, 0] < go - EARLY_NS).sum())})
    start = rows[0]["go"]
    for i, r in enumerate(rows):
        r["chain"] = (rows[i + 1]["go"] - r["go"]) / 1e3 if i + 1 < len(rows) else 0.0
        for key in ("first", "last", "go"):
            r[key] = (r[key] - start) / 1e3
    return rows


def format_timeline(report: TimelineReport) -> str:
    """The table `aicf-run --timeline` prints."""
    lines = [f"timeline: {len(report.kernels)} kernels of one plan replay, medians of {report.rounds} replays "
             f"(us from the first kernel's start; a block landed early when it reached the SM before its kernel "
             f"could start)",
             f"{'#':>4}  {'kernel':<8}{'blocks':>7}{'early':>7}  {'landed from':>11}{'to':>9}{'go':>9}"
             f"{'in chain':>10}{'predicted':>11}  onnx nodes"]
    for k in report.kernels:
        chain = "-" if k.chain_us is None else f"{k.chain_us:.2f}"
        predicted = "-" if k.predicted_us is None else f"{k.predicted_us:.2f}"
        reached = f"{k.reached}" if k.reached == k.blocks else f"{k.reached}/{k.blocks}"
        nodes = ", ".join(k.onnx_nodes)
        lines.append(f"{k.index:>4}  {k.name:<8}{reached:>7}{k.early:>7}  {k.first_landed_us:>11.2f}"
                     f"{k.last_landed_us:>9.2f}{k.go_us:>9.2f}{chain:>10}{predicted:>11}  "
                     f"{nodes[:60] + ('...' if len(nodes) > 60 else '')}")
    chained = sum(k.chain_us for k in report.kernels if k.chain_us is not None)
    early = sum(1 for k in report.kernels[1:] if k.early)
    predicted = report.predicted_sum_us
    lines.append(f"  plan up to its last kernel's start {report.last_go_us:.2f} us (the kernels before it: "
                 f"{chained:.2f} us in chain"
                 + ("" if predicted is None else f"; every kernel predicted {predicted:.2f} us in all") + "); "
                 f"{early} of {len(report.kernels) - 1} kernels after the first had blocks land early")
    return "\n".join(lines)
