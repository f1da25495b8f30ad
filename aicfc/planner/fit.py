"""Calibrate a hardware profile's coefficients against measured kernel times (`aicfc tune`).

The fitted fields are the coefficients of the cost model (`planner/cost.py`) that no data
sheet gives exactly: FIELDS below. The objective is the mean squared log error between the
model's prediction for every measured candidate, recomputed with `cost()` under the trial
profile, and its measured time:

    msle = mean over candidates of (ln predicted - ln measured)^2

A log error weighs a 2x miss on a 3 us kernel the same as on a 3 ms one, which is what
ranking needs. It is minimized by greedy descent over multiplicative steps: each sweep tries
every field times every factor of COARSE (then, in the last sweeps, FINE), applies the single
best move, and repeats with the fields not yet moved in the sweep; a value changes only on a
strict improvement, so a field the measurements do not exercise (mma_sync in an fp32 model) stays.
Efficiencies are clamped to [0.05, 1], min_warps_per_sm to [1, max warps per SM].
Fitted values are rounded to 4 significant digits before the final statistics.
"""
from __future__ import annotations

import copy
import math
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

from aicfc.planner.cost import LOAD_LATENCY_US, SPLITK_OVERHEAD_US, cost
from aicfc.planner.cost_wgmma import EPILOGUE_RATE, EPILOGUE_US, REG_STORE_GBS, TMA_LATENCY_US
from aicfc.planner.hardware import Profile

if TYPE_CHECKING:
    from aicfc.tune import TuneReport

FIELDS = ("efficiency.dram", "efficiency.fp32_simt", "efficiency.mma_sync", "efficiency.wgmma", "efficiency.min_warps_per_sm",
          "launch_overhead_us", "l2_bandwidth_gbs", "smem_bandwidth_gbs_per_sm", "load_latency_us",
          "splitk_overhead_us", "efficiency.wgmma_gemm", "wgmma_epilogue_us", "tma_latency_us", "wgmma_epilogue_rate",
          "wgmma_reg_store_gbs")
OPTIONAL = {"load_latency_us": LOAD_LATENCY_US, "splitk_overhead_us": SPLITK_OVERHEAD_US,   # older profiles lack them
            "wgmma_epilogue_us": EPILOGUE_US, "tma_latency_us": TMA_LATENCY_US,
            "wgmma_epilogue_rate": EPILOGUE_RATE, "wgmma_reg_store_gbs": REG_STORE_GBS}
EFFICIENCIES = ("efficiency.dram", "efficiency.fp32_simt", "efficiency.mma_sync", "efficiency.wgmma",
                "efficiency.wgmma_gemm")
COARSE = (0.5, 0.7, 0.85, 1.0, 1.2, 1.4, 2.0)
FINE = (0.9, 0.95, 1.0, 1.05, 1.1)
SWEEPS = (COARSE, COARSE, COARSE, FINE, FINE)
WITHIN = 0.10   # a pick "within 10%" of the fastest measured candidate


def spearman(x: Sequence[float], y: Sequence[float]) -> float:
    """Spearman's rank correlation of x and y (ties get their average rank); NaN when it is
    undefined (fewer than two points, or either side constant)."""
    a, b = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    if a.shape != b.shape or a.ndim != 1:
        raise ValueError("spearman needs two sequences of the same length")
    if len(a) < 2:
        return math.nan
    ra, rb = _average_ranks(a), _average_ranks(b)
    ra, rb = ra - ra.mean(), rb - rb.mean()
    denominator = math.sqrt(float((ra * ra).sum() * (rb * rb).sum()))
    return float((ra * rb).sum() / denominator) if denominator > 0 else math.nan


def _average_ranks(a: np.ndarray) -> np.ndarray:
    """1-based ranks; a run of equal values shares the mean of the ranks it spans."""
    values, inverse, counts = np.unique(a, return_inverse=True, return_counts=True)
    first = np.cumsum(counts) - counts          # 0-based rank of each value's first copy
    return (first + (counts + 1) / 2.0)[inverse]


def fields(data: dict[str, Any]) -> tuple[str, ...]:
    """The FIELDS `data` has (`get` finds them): an efficiency a profile lacks (wgmma off
    Hopper) is not fitted."""
    found = []
    for field in FIELDS:
        try:
            get(data, field)
        except KeyError:
            continue
        found.append(field)
    return tuple(found)


def get(data: dict[str, Any], field: str) -> float:
    if field in OPTIONAL:
        return float(data.get(field, OPTIONAL[field]))
    node: Any = data
    for key in field.split("."):
        node = node[key]
    return float(node)


def _set(data: dict[str, Any], field: str, value: float) -> None:
    *path, last = field.split(".")
    node = data
    for key in path:
        node = node[key]
    node[last] = value


def _clamp(data: dict[str, Any], field: str, value: float) -> float:
    if field in EFFICIENCIES:
        return min(1.0, max(0.05, value))
    if field == "efficiency.min_warps_per_sm":
        return min(data["max_threads_per_sm"] / 32, max(1.0, value))
    return max(1e-3, value)


def predictions(report: TuneReport, data: dict[str, Any]) -> list[np.ndarray]:
    """Predicted microseconds of every measured candidate under profile `data`, per kernel."""
    hw = Profile(data)
    return [np.array([cost(kt.kernel, c.params, c.grid, c.block, c.smem, c.regs_planned, report.types,
                           hw).time_us for c in kt.measured]) for kt in report.kernels]


def _measurements(report: TuneReport) -> list[np.ndarray]:
    return [np.array([c.measured_us for c in kt.measured], dtype=np.float64) for kt in report.kernels]


def _msle(pred: list[np.ndarray], meas: list[np.ndarray]) -> float:
    p, m = np.concatenate(pred), np.concatenate(meas)
    return float(np.mean((np.log(p) - np.log(m)) ** 2)) if len(m) else math.nan


def picks_within(report: TuneReport, pred: list[np.ndarray], tol: float = WITHIN) -> tuple[int, int]:
    """(kernels whose cheapest-predicted measured candidate is within `tol` of the fastest
    measured one, kernels with a measurement). Ties in prediction go to the better rank."""
    good = total = 0
    for kt, p in zip(report.kernels, pred):
        measured = kt.measured
        if not measured:
            continue
        total += 1
        pick = min(range(len(measured)), key=lambda i: (p[i], measured[i].rank))
        good += measured[pick].measured_us <= (1 + tol) * min(c.measured_us for c in measured)
    return good, total


def _stats(report: TuneReport, data: dict[str, Any]) -> dict[str, float]:
    pred, meas = predictions(report, data), _measurements(report)
    good, total = picks_within(report, pred)
    both = [(x, y) for p, m in zip(pred, meas) for x, y in zip(p, m)]
    rho = spearman([x for x, _ in both], [y for _, y in both]) if both else math.nan
    return {"msle": _msle(pred, meas), "spearman": rho, "picks_within_10pct": good / total if total else math.nan}


def fit_profile(report: TuneReport, profile: Profile | dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the profile with FIELDS fitted to the report's measurements, statistics of the fit).

    The statistics: mean squared log error, pooled Spearman and the fraction of kernels whose
    pick (re-ranked among the measured candidates) is within 10% of the fastest measured,
    each before and after; the candidates and kernels used; every field's old and new value.
    The new profile carries them in a "calibration" record.
    """
    import datetime

    base = copy.deepcopy(profile.data if isinstance(profile, Profile) else profile)
    for key, default in OPTIONAL.items():
        base.setdefault(key, default)
    meas = _measurements(report)
    count = sum(len(m) for m in meas)
    data = copy.deepcopy(base)
    fitted = fields(base)
    if count:
        best = _msle(predictions(report, data), meas)
        for factors in SWEEPS:
            # One sweep: the single best move (field x factor) first, repeatedly, each field
            # moving at most once; a fixed field order would let an early field absorb an
            # error that belongs to a later one (dram efficiency for launch overhead).
            moved: set[str] = set()
            while len(moved) < len(fitted):
                move = None
                for field in fitted:
                    if field in moved:
                        continue
                    start = get(data, field)
                    for factor in factors:
                        value = _clamp(data, field, start * factor)
                        if value == start:
                            continue
                        _set(data, field, value)
                        error = _msle(predictions(report, data), meas)
                        if error < best * (1 - 1e-9):
                            best, move = error, (field, value)
                    _set(data, field, start)
                if move is None:
                    break
                _set(data, *move)
                moved.add(move[0])
        for field in fitted:
            _set(data, field, float(f"{get(data, field):.4g}"))
    before, after = _stats(report, base), _stats(report, data)
    stats: dict[str, Any] = {
        "candidates": count,
        "kernels": sum(1 for m in meas if len(m)),
        **{f"{key}_before": _clean(value) for key, value in before.items()},
        **{f"{key}_after": _clean(value) for key, value in after.items()},
        "fields": {field: [get(base, field), get(data, field)] for field in fitted},
    }
    data["calibration"] = {
        "gpu": report.gpu, "date": datetime.date.today().isoformat(), "model": report.model,
        "precision": report.precision, "candidates_measured": count, "stats": stats,
    }
    return data, stats


def _clean(value: float) -> float | None:
    """NaN (undefined) as None, so the record is valid JSON."""
    return None if value is None or math.isnan(value) else round(float(value), 6)
