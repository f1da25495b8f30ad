"""`aicf-run --timeline`: when each kernel's blocks reached the SMs and when the kernel could
start, in replays of the whole plan, from the stamps a bundle compiled with `aicfc compile
--timeline` records ([Note: timeline] in aicfc/codegen/timeline.py).

How it is measured: the plan is replayed once to warm up, then ROUNDS times; before each timed
replay every kernel's stamp array is zeroed, after it the stamps are read back. Each block of
a kernel stamped `arrived` (the global clock when it reached the kernel's entry, before the
dependent-launch wait), `ready` (after the wait) and, where the kernel's entry is in its
outermost scope, `exited` (as thread 0 returned). Per kernel and replay, relative to the
plan's start (the first kernel's go):

- go: the first `ready` of its blocks, the moment the kernel before it had completed (or, for
  a plain launch, its first block's start);
- in chain: the next kernel's go less this one's: what the kernel adds to the plan where the
  kernels run back to back (none for the last kernel, which no kernel follows);
- done: its last block's exit (thread 0's; unknown where the grid has more blocks than it
  stamps); `of it after` is the time in chain after done, the
  boundary: the grid's completion, its writes made visible and the next kernel released;
- landed: its first and last block's arrival; a block landed early when it arrived before the
  kernel's go (by more than EARLY_NS): it sat on an SM while the previous kernel still ran;
- reached: blocks that stamped (a block that returns before its entry leaves zeros).
- phases, where the kernel marks them (the bundle's `timeline.phases` names them): for each mark,
  the median block's and the last block's thread 0 passing it, in us after the kernel's go, then
  the same of the blocks' exits; a block that left before a mark is not counted in it.

With `busy` each timed replay follows another one on the stream with no gap (the stamps of the first are
overwritten), so the plan starts on a busy GPU as a decode step does in generation, not after an idle one.

The figures of each kernel are the medians over the rounds. The plan runs with three clock
reads and three stores a block more than without --timeline, and one of each at every phase mark; `aicf-run --bench` on a bundle
compiled without it times the plan as it is.
"""
from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

from aicf_run.errors import RunError
from aicf_run.profile import BAND
from aicf_run.schema import kernel_records

if TYPE_CHECKING:
    from aicf_run.executor import Executor

ROUNDS = 5
ENTRY_STAMPS = 3   # u64 a block before its phases: arrived, ready, exited (aicfc/codegen/timeline.py)
EARLY_NS = 100     # an arrival this much before the kernel's go counts as early (clock reads, the wait's own latency)
COMPILE_HINT = "recompile it with aicfc compile --timeline"


@dataclass(frozen=True)
class PhaseTimes:
    """One phase mark of a kernel (or its blocks' exits), us after the kernel's go (medians over the rounds)."""

    name: str
    median_us: float             # the median block's thread 0 passing it
    last_us: float               # the last block's


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
    done_us: float | None        # the last block's exit (thread 0's); None where exits are not stamped
    chain_us: float | None       # next kernel's go less this one's; None for the last kernel
    early: int                   # blocks that arrived before go
    predicted_us: float | None
    onnx_nodes: tuple[str, ...]
    phases: tuple[PhaseTimes, ...] = ()   # its marks then "exit"; none where it marks none


@dataclass(frozen=True)
class TimelineReport:
    kernels: tuple[KernelTimes, ...]
    rounds: int
    last_go_us: float            # the last kernel's go: the plan up to its last kernel
    predicted_sum_us: float | None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def timeline(executor: Executor, rounds: int = ROUNDS, busy: bool = False) -> TimelineReport:
    """Replay `executor`'s plan `rounds` times and read every kernel's stamps (module docstring); `busy`:
    each timed replay right after another one."""
    arrays = executor.stamp_arrays()
    if not arrays or any(a is None for a in arrays):
        raise RunError(f"{executor.bundle.path}: its kernels record no timeline; {COMPILE_HINT}")
    cuda = executor.device.driver
    executor.launch()
    executor.synchronize()
    per_round = []
    kernels = kernel_records(executor.bundle.kernels)
    widths = [k["timeline"]["stamps"] for k in kernels]
    try:
        for _ in range(rounds):
            for (address, blocks), width in zip(arrays, widths):
                cuda.memset_d8(address, 0, 8 * width * blocks)
            if busy:
                executor.launch()
            executor.launch()
            executor.synchronize()
            stamps = []
            for (address, blocks), width in zip(arrays, widths):
                host = np.empty((blocks, width), np.uint64)
                cuda.memcpy_dtoh(host, address)
                stamps.append(host)
            per_round.append(stamps)
    except cuda.Error as err:
        raise RunError(f"cannot read the timeline's stamps ({' '.join(str(err).split())[:300]}); check "
                       f"nvidia-smi") from None
    return summarize(per_round, kernels)


def summarize(rounds: Sequence[Sequence[np.ndarray]], kernels: Sequence[dict]) -> TimelineReport:
    """The report from each round's stamps (per kernel a [blocks, stamps] array of arrived, ready
    and exited ns, then its phase marks'; zeros where a block did not reach its entry or a mark, or
    where exits are not stamped)."""
    if not rounds:
        raise RunError("--timeline needs at least one replay")
    measured = [_one_round(stamps, kernels) for stamps in rounds]
    out = []
    for i, kernel in enumerate(kernels):
        rows = [m[i] for m in measured]

        def med(key: str) -> float:
            return statistics.median(r[key] for r in rows)
        # a grid of more blocks than it stamps: its last block may be one that did not stamp
        whole = "grid" not in kernel or len(rounds[0][i]) >= int(np.prod(kernel["grid"]))
        done = None if not whole or any(r["done"] is None for r in rows) else med("done")
        chain = None if i == len(kernels) - 1 else med("chain")
        predicted = kernel.get("predicted", {}).get("time_us")
        labels = list(kernel.get("timeline", {}).get("phases", ()))
        names = labels + [""] * (rounds[0][i].shape[1] - ENTRY_STAMPS - len(labels)) + ["exit"]
        # in the order the median block passes them (a joined role's marks are not numbered in that order)
        phases = tuple(sorted((PhaseTimes(name, statistics.median(r["phases"][j][0] for r in rows),
                                          statistics.median(r["phases"][j][1] for r in rows))
                               for j, name in enumerate(names) if name and all(r["phases"][j] for r in rows)),
                              key=lambda p: p.median_us)) if labels else ()
        out.append(KernelTimes(
            index=i, name=kernel["name"], blocks=len(rounds[0][i]), reached=int(med("reached")),
            first_landed_us=med("first"), last_landed_us=med("last"), go_us=med("go"), done_us=done, chain_us=chain,
            early=int(med("early")), predicted_us=float(predicted) if isinstance(predicted, (int, float)) else None,
            onnx_nodes=tuple(kernel.get("onnx_nodes", ())), phases=phases))
    predicted = [k.predicted_us for k in out]
    return TimelineReport(kernels=tuple(out), rounds=len(rounds),
                          last_go_us=statistics.median(m[-1]["go"] for m in measured),
                          predicted_sum_us=None if None in predicted else sum(p for p in predicted if p is not None))


def _one_round(stamps: Sequence[np.ndarray], kernels: Sequence[dict]) -> list[dict[str, float]]:
    rows = []
    for i, s in enumerate(stamps):
        hit = s[(s[:, 0] > 0) & (s[:, 1] > 0)].astype(np.int64)
        exits = hit[:, 2][hit[:, 2] > 0]
        if len(hit) == 0:
            raise RunError(f"kernel {i} ({kernels[i]['name']}): no block stamped its entry in a replay; "
                           f"the bundle's stamps are not being written, {COMPILE_HINT}")
        go = int(hit[:, 1].min())
        marks = [hit[:, j] for j in range(ENTRY_STAMPS, hit.shape[1])] + [hit[:, 2]]   # its phases, then the exits
        rows.append({"reached": len(hit), "first": int(hit[:, 0].min()), "last": int(hit[:, 0].max()), "go": go,
                     "early": int((hit[:, 0] < go - EARLY_NS).sum()),
                     "done": int(exits.max()) if len(exits) == len(hit) else None,
                     "phases": [((float(np.median(t[t > 0])) - go) / 1e3, float(t[t > 0].max() - go) / 1e3)
                                if (t > 0).any() else None for t in marks]})
    start = rows[0]["go"]
    for i, r in enumerate(rows):
        r["chain"] = (rows[i + 1]["go"] - r["go"]) / 1e3 if i + 1 < len(rows) else 0.0
        for key in ("first", "last", "go", "done"):
            if r[key] is not None:
                r[key] = (r[key] - start) / 1e3
    return rows


def format_timeline(report: TimelineReport) -> str:
    """The table `aicf-run --timeline` prints."""
    lines = [f"timeline: {len(report.kernels)} kernels of one plan replay, medians of {report.rounds} replays "
             f"(us from the first kernel's start; a block landed early when it reached the SM before its kernel "
             f"could start)",
             f"{'#':>4}  {'kernel':<8}{'blocks':>7}{'early':>7}  {'landed from':>11}{'to':>9}{'go':>9}{'done':>9}"
             f"{'in chain':>10}{'of it after':>12}{'predicted':>11}  onnx nodes"]
    for k in report.kernels:
        chain = "-" if k.chain_us is None else f"{k.chain_us:.2f}"
        done = "-" if k.done_us is None else f"{k.done_us:.2f}"
        after = "-" if k.chain_us is None or k.done_us is None else f"{k.go_us + k.chain_us - k.done_us:.2f}"
        predicted = "-" if k.predicted_us is None else f"{k.predicted_us:.2f}"
        reached = f"{k.reached}" if k.reached == k.blocks else f"{k.reached}/{k.blocks}"
        nodes = ", ".join(k.onnx_nodes)
        lines.append(f"{k.index:>4}  {k.name:<8}{reached:>7}{k.early:>7}  {k.first_landed_us:>11.2f}"
                     f"{k.last_landed_us:>9.2f}{k.go_us:>9.2f}{done:>9}{chain:>10}{after:>12}{predicted:>11}  "
                     f"{nodes[:60] + ('...' if len(nodes) > 60 else '')}")
    marked = [k for k in report.kernels if k.phases]
    if marked:
        lines.append("  phases, us after each kernel's go (the median block / the last block):")
        lines += [f"{k.index:>4}  {k.name:<8}" + " · ".join(f"{p.name} {p.median_us:.2f}/{p.last_us:.2f}" for p in k.phases)
                  for k in marked]
    chained = sum(k.chain_us for k in report.kernels if k.chain_us is not None)
    bounds = [k.go_us + k.chain_us - k.done_us for k in report.kernels if k.chain_us is not None and k.done_us is not None]
    early = sum(1 for k in report.kernels[1:] if k.early)
    predicted = report.predicted_sum_us
    lines.append(f"  plan up to its last kernel's start {report.last_go_us:.2f} us (the kernels before it: "
                 f"{chained:.2f} us in chain"
                 + (f", {sum(bounds):.2f} of them after a kernel was done" if bounds else "")
                 + ("" if predicted is None else f"; every kernel predicted {predicted:.2f} us in all") + "); "
                 f"{early} of {len(report.kernels) - 1} kernels after the first had blocks land early")
    judged = [k.chain_us / k.predicted_us for k in report.kernels if k.chain_us is not None and k.predicted_us]
    if judged:
        within = sum(BAND[0] <= r <= BAND[1] for r in judged)
        lines.append(f"  in chain / predicted within [{BAND[0]}, {BAND[1]}]: {within} of {len(judged)} kernels (what each "
                     f"adds to the plan, against the cost model's prediction of it)")
    return "\n".join(lines)


def timeline_svg(report: TimelineReport, title: str) -> str:
    """The report as an SVG chart, a row a kernel on one time axis: where its blocks waited on the
    SMs (first landing to go, light), where it ran (go to done, dark), and the boundary until the
    next kernel's go (grey)."""
    from html import escape
    left, width, row, top = 190, 900, 14, 40
    ends = [k.done_us if k.done_us is not None else k.go_us + (k.chain_us or 0.0) for k in report.kernels]
    span = max([1e-3, *ends, *(k.go_us + (k.chain_us or 0.0) for k in report.kernels)])
    start = min(0.0, *(k.first_landed_us for k in report.kernels))
    scale = width / (span - start)

    def x(t: float) -> float:
        return left + (t - start) * scale
    height = top + row * len(report.kernels) + 30
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{left + width + 20}" height="{height}" '
           f'font-family="monospace" font-size="10">',
           f'<text x="10" y="16" font-size="12">{escape(title)}</text>',
           f'<text x="10" y="30">light: blocks landed, waiting; dark: running (go to done); grey: until the next '
           f'kernel starts; orange ticks: the median block passing a phase mark. us from the first kernel\'s start, '
           f'medians of {report.rounds} replays</text>']
    # ticks: the smallest 1, 2 or 5 x 10^k that leaves at most 12 on the axis
    step = next(m * 10 ** e for e in range(-2, 8) for m in (1, 2, 5) if (span - start) / (m * 10 ** e) <= 12)
    t = 0.0
    while t <= span:
        out.append(f'<line x1="{x(t):.1f}" y1="{top - 4}" x2="{x(t):.1f}" y2="{height - 24}" stroke="#eee"/>'
                   f'<text x="{x(t):.1f}" y="{height - 12}" text-anchor="middle">{t:g}</text>')
        t += step
    for i, (k, end) in enumerate(zip(report.kernels, ends)):
        y = top + i * row
        label = f"{k.name} {k.onnx_nodes[0] if k.onnx_nodes else ''}"[:30]
        out.append(f'<text x="{left - 6}" y="{y + 10}" text-anchor="end">{escape(label)}</text>')
        if k.early and k.first_landed_us < k.go_us:
            out.append(f'<rect x="{x(k.first_landed_us):.1f}" y="{y + 3}" width="{(k.go_us - k.first_landed_us) * scale:.1f}" '
                       f'height="6" fill="#9ecae1"/>')
        out.append(f'<rect x="{x(k.go_us):.1f}" y="{y + 1}" width="{max(0.5, (end - k.go_us) * scale):.1f}" height="10" '
                   f'fill="#08519c"><title>{escape(k.name)}: go {k.go_us:.2f} us, '
                   f'{"done " + format(k.done_us, ".2f") + " us, " if k.done_us is not None else ""}'
                   f'in chain {"-" if k.chain_us is None else format(k.chain_us, ".2f")} us, '
                   f'predicted {"-" if k.predicted_us is None else format(k.predicted_us, ".2f")} us</title></rect>')
        for p in k.phases[:-1]:   # the median block passing each phase mark (the last is the exits)
            out.append(f'<line x1="{x(k.go_us + p.median_us):.1f}" y1="{y}" x2="{x(k.go_us + p.median_us):.1f}" '
                       f'y2="{y + 12}" stroke="#fd8d3c" stroke-width="1.5"><title>{escape(k.name)}: {escape(p.name)} '
                       f'{p.median_us:.2f} us after go (median block; last {p.last_us:.2f})</title></line>')
        if k.chain_us is not None and k.done_us is not None and k.go_us + k.chain_us > k.done_us:
            out.append(f'<rect x="{x(k.done_us):.1f}" y="{y + 1}" width="{(k.go_us + k.chain_us - k.done_us) * scale:.1f}" '
                       f'height="10" fill="#bbb"/>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def save_svg(path: str, text: str) -> None:
    """Write `text` to `path` whole or not at all (a temporary file beside it, then renamed)."""
    import os
    import secrets
    temp = f"{path}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
    try:
        with open(temp, "x", encoding="utf-8") as f:
            f.write(text)
        os.replace(temp, path)
    except OSError as err:
        if os.path.exists(temp):
            os.unlink(temp)
        raise RunError(f"cannot write {path}: {err.strerror or err}; check that the folder exists and is "
                       f"writable") from None
