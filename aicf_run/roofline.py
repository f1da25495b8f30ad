"""Roofline plots: each kernel's FLOP/s against the target's memory roof and compute ceilings.

This lives in the runtime so that `aicf-run --profile --roofline` can draw measured points
without importing the compiler; `aicfc explain --roofline` uses it through aicfc.roofline.

A kernel that does `flops` floating-point operations and moves `bytes` through DRAM in
`time_us` has arithmetic intensity I = flops / bytes (FLOP/byte) and attains
P = flops / time (TFLOP/s). The target bounds it by

    P <= min(B · I, peak)

with B the DRAM bandwidth (`dram_bandwidth_gbs`; B · I is the sloped memory roof) and one
horizontal ceiling per entry of `peak_tflops` (fp32_simt, tf32_tc, ...). Both axes are
logarithmic, so the roof is a straight line of slope 1 that meets each ceiling at its ridge
point I = peak / B.

Points are "predicted" (the cost model's estimate stored in the bundle; `time_us` includes the
launch overhead, as a measured time does) or "measured" (aicf_run.profile's timings).
A measured point is joined by a thin line to the predicted point of the same label, so the
gap between model and hardware reads directly off the plot.

matplotlib is optional (the `plot` extra) and imported only when a plot is drawn. The figure is
rendered through matplotlib's object-oriented API on its own Agg canvas, never through pyplot,
so drawing a plot needs no display and leaves the caller's pyplot backend and figures alone.
"""
from __future__ import annotations

import math
import os
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

from aicf_run.errors import RunError
from aicf_run.schema import kernel_records

KINDS = ("predicted", "measured")
FORMATS = (".png", ".svg", ".pdf")


@dataclass(frozen=True, slots=True)
class Point:
    """One kernel on the roofline: what it computes and moves, and how long it took."""

    label: str
    flops: float
    bytes: float
    time_us: float
    kind: str = "predicted"

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"Point.kind must be one of {KINDS}, not {self.kind!r}")

    @property
    def intensity(self) -> float:
        """Arithmetic intensity, FLOP per DRAM byte."""
        return self.flops / self.bytes

    @property
    def tflops(self) -> float:
        """Attained throughput in TFLOP/s: flops / (time_us · 1e-6 s) / 1e12."""
        return self.flops / (self.time_us * 1e6)

    @property
    def plottable(self) -> bool:
        """Whether the point has a place on log-log axes (all three quantities positive)."""
        return self.flops > 0 and self.bytes > 0 and self.time_us > 0


def points_from_payload(payload: dict[str, Any]) -> list[Point]:
    """The predicted point of every kernel of a bundle payload, in launch order.

    Kernels with no bytes, no time or no FLOPs are left out: their intensity or throughput is
    zero or undefined, and a log axis has no place for them.
    """
    points = []
    for kern in kernel_records(payload["kernels"]):   # joined kernels too
        p = kern["predicted"]
        point = Point(kern["name"], float(p["flops"]), float(p["bytes"]), float(p["time_us"]), "predicted")
        if point.plottable:
            points.append(point)
    return points


def check_path(path: str | os.PathLike) -> Path:
    """`path` if matplotlib can write a plot there by its suffix, else RunError."""
    target = Path(path)
    if target.suffix.lower() not in FORMATS:
        raise RunError(f"roofline plot {target}: unknown format {target.suffix or '(no suffix)'!r}; "
                        f"name the file .png, .svg or .pdf")
    return target


def plot_roofline(profile: dict[str, Any], points: Iterable[Point], path: str | os.PathLike,
                  title: str | None = None) -> list[Point]:
    """Draw `points` on the roofline of `profile` (a hardware profile's data) into `path`.

    The format follows the suffix (.png, .svg or .pdf). The file is written to a temporary
    name in the same folder and renamed over `path`, so a reader never sees a partial plot.
    `title` defaults to the target's name and architecture. Returns the points plotted: those
    given, less any that cannot go on log axes (see `Point.plottable`).
    """
    target = check_path(path)
    FigureCanvasAgg, Figure = _matplotlib()
    plotted = [p for p in points if p.plottable]
    fig = Figure(figsize=(9, 6), layout="constrained")
    FigureCanvasAgg(fig)  # a canvas of its own: no pyplot, no global backend
    ax = fig.add_subplot()
    _draw(ax, profile, plotted)
    ax.set_title(title if title is not None else _default_title(profile))
    _save_atomically(fig, target)
    return plotted


def require_matplotlib() -> None:
    """RunError unless matplotlib can be imported; lets a caller refuse before any work."""
    _matplotlib()


def _matplotlib() -> tuple[Any, Any]:
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        raise RunError("--roofline needs matplotlib; install it with pip install 'aicf[plot]'") from None
    return FigureCanvasAgg, Figure


def _default_title(profile: dict[str, Any]) -> str:
    arch = profile.get("arch", "unknown target")
    name = profile.get("name")
    return f"{name} ({arch}) roofline" if name else f"{arch} roofline"


def _draw(ax: Any, profile: dict[str, Any], points: list[Point]) -> None:
    bw = float(profile["dram_bandwidth_gbs"]) / 1000.0  # GB/s → TFLOP/s per (FLOP/byte)
    # Ceilings of equal height (fp16_tc and bf16_tc, say) are drawn once, named together.
    by_peak: dict[float, list[str]] = {}
    for key, value in profile["peak_tflops"].items():
        by_peak.setdefault(float(value), []).append(key)
    peaks = sorted(((", ".join(keys), peak) for peak, keys in by_peak.items()), key=lambda kv: kv[1])
    ridges = [peak / bw for _, peak in peaks]

    # Axes wide enough for every point and every ridge point, with a margin on both sides.
    xs = [p.intensity for p in points] + ridges + [1.0]
    ys = [p.tflops for p in points] + [peak for _, peak in peaks] + [bw]
    x_lo, x_hi = min(xs) / 4, max(xs) * 4
    y_lo, y_hi = min(ys) / 4, max(ys) * 3
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(x_lo, x_hi)
    ax.set_ylim(y_lo, y_hi)

    # The memory roof rises until the highest ceiling; each ceiling runs right of its ridge.
    x_top = ridges[-1] if ridges else x_hi
    ax.plot([x_lo, x_top], [bw * x_lo, bw * x_top], color="black", linewidth=1.5)
    x_text = max(x_lo * 1.3, y_lo * 1.3 / bw)
    # Below the roof and to the right, where the rising line leaves room for the text.
    ax.annotate(f"DRAM {profile['dram_bandwidth_gbs']:g} GB/s", (x_text, bw * x_text),
                xytext=(8, -4), textcoords="offset points", ha="left", va="top", fontsize=8)
    for (key, peak), ridge in zip(peaks, ridges):
        line, = ax.plot([ridge, x_hi], [peak, peak], linewidth=1.2, linestyle="--")
        ax.annotate(f"{key} {peak:g} TFLOP/s", (x_hi, peak), xytext=(-4, 3), textcoords="offset points",
                    ha="right", va="bottom", fontsize=8, color=line.get_color())

    predicted_points = [p for p in points if p.kind == "predicted"]
    predicted = {p.label: p for p in predicted_points}
    measured = [p for p in points if p.kind == "measured"]
    for m in measured:
        if m.label in predicted:
            p = predicted[m.label]
            ax.plot([p.intensity, m.intensity], [p.tflops, m.tflops], color="grey", linewidth=0.6, zorder=2)
    if predicted_points:
        ax.scatter([p.intensity for p in predicted_points], [p.tflops for p in predicted_points],
                   marker="o", s=28, color="tab:blue", zorder=3, label="predicted")
    if measured:
        ax.scatter([m.intensity for m in measured], [m.tflops for m in measured],
                   marker="D", s=28, facecolors="none", edgecolors="tab:red", zorder=3, label="measured")

    # A measured point is named only when it has no predicted point to be read from.
    named = [p for p in points if p.kind == "predicted" or p.label not in predicted]
    for (x, y), labels in _label_groups(named):
        ax.annotate(", ".join(labels), (x, y), xytext=(5, 5), textcoords="offset points", fontsize=8)

    ax.set_xlabel("arithmetic intensity (FLOP / DRAM byte)")
    ax.set_ylabel("throughput (TFLOP/s)")
    ax.grid(True, which="major", linewidth=0.4, alpha=0.5)
    if points:
        ax.legend(loc="upper left", fontsize=8)


def _label_groups(points: list[Point], decades: float = 0.08) -> list[tuple[tuple[float, float], list[str]]]:
    """Labels of points closer than `decades` on both log axes, joined at the first one's spot.

    Kernels of one shape land on the same spot, and near ones would print their names over
    each other; one label per cluster stays readable.
    """
    groups: list[tuple[tuple[float, float], list[str]]] = []
    for p in points:
        x, y = math.log10(p.intensity), math.log10(p.tflops)
        for (gx, gy), labels in groups:
            if abs(gx - x) < decades and abs(gy - y) < decades:
                labels.append(p.label)
                break
        else:
            groups.append(((x, y), [p.label]))
    return [((10 ** gx, 10 ** gy), labels) for (gx, gy), labels in groups]


def _save_atomically(fig: Any, target: Path) -> None:
    # A dot-prefixed random name in the same folder (os.replace is atomic only within one
    # filesystem); O_EXCL never clobbers someone else's file; 0o666 lets the umask decide.
    temp = target.with_name(f".{target.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    try:
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        try:
            with os.fdopen(fd, "wb") as f:
                fig.savefig(f, format=target.suffix.lower()[1:])
            os.replace(temp, target)
        except BaseException:
            temp.unlink(missing_ok=True)
            raise
    except OSError as err:
        raise RunError(f"cannot write roofline plot {target}: {err.strerror or err}; check that the "
                        f"folder exists and is writable") from None
