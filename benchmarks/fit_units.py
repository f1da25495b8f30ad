"""Fit the small-k terms of the `mma`, `thin`, `simt` and `wgmma` GEMM units together against stored `aicfc tune`
reports, and judge the fit by the picks it makes, without a GPU.

Session 42 (an H200) found the units the planner weighs against each other at small K (16-160, the 1x1 GEMMs of
MobileNetV2 and EfficientNet-B0) mispredicted unevenly: `mma` 1.5-1.7x, `thin` 1.5-1.8x, `simt` up to 2.3x, `wgmma`
1.05-1.17x; refitting the mma terms alone moved picks to simt and thin tiles that are just as wrong. This fits, for
each unit u of UNITS at once, a correction of its prediction t (launch L, the mma epilogue's term E):

    t' = t + fixed_u + (scale_u - 1)·(t - L - E) + (epilogue_u - 1)·E

by least squares on ln(t' / measured) over every timed GEMM candidate of that unit with K <= --max-k, on a grid
(GRID). The correction's figures are profile keys (`<unit>_fixed_us`, `<unit>_scale`, `<unit>_epilogue_scale`)
that the tree's cost model does NOT read: this script wraps the units' cost functions in aicfc.planner.cost to
apply them (`install`), so what it prints is what such terms would do, not what the tree does (tune_rerank.py
under such a profile re-ranks exactly as under the base one). It prints the geometric mean of measured / predicted
and the share within [0.8, 1.25] per unit, before and after; then re-plans every model under the base profile
and the fitted one and re-ranks each kernel (`tune_rerank.rerank`, the report's ptxas counts) to count, per report,
the kernels whose pick's measured time got faster or slower, the picks moved to a candidate the GPU never timed
("unmeasured": not judged), the sums of the measured picks' times, and the same for the best timed candidate of each
ranking (the pick among what the GPU timed); and every moved pick as the --pin NODE:KEY=VALUE list that compiles it,
to time it on a GPU.

    python3 benchmarks/fit_units.py --models /tmp/cnn [--max-k 160] [--units mma,thin,simt,wgmma] [--profile h200] \\
        [--write-profile OUT.json]

--models: the folder of the ONNX exports (mobilenet_v2_b32.onnx, mobilenet_v2_b1.onnx, efficientnet_b0_b32.onnx,
resnet50_b32.onnx) the reports of REPORTS were measured on. --write-profile writes the base profile with the fitted
keys only where the fit improves the measured picks (more faster than slower, a smaller sum, no pick moved to an
unmeasured candidate, the timed picks no slower). Session 43's run: benchmarks/results/fit_units_session43.txt.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any, Callable

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import aicfc.planner.cost as cost_module  # noqa: E402
from aicfc.codegen import FAMILIES, gemm  # noqa: E402
from aicfc.errors import AicfError  # noqa: E402
from aicfc.passes.plan_schedules import recost  # noqa: E402
from aicfc.planner.hardware import Profile, load_profile  # noqa: E402
from benchmarks.tune_rerank import rerank  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
REPORTS = (("mobilenet_v2_b32", "tune_mobilenet_v2_b32_session42_h200.json"),
           ("mobilenet_v2_b1", "tune_mobilenet_v2_b1_session42_h200.json"),
           ("efficientnet_b0_b32", "tune_efficientnet_b0_b32_session42_h200.json"),
           ("resnet50_b32", "tune_resnet50_b32_session29_h200.json"),
           ("resnet50_b32", "tune_resnet50_b32_below_bar_session40_h200.json"))
# unit -> its cost function in aicfc/planner/cost.py
UNITS = {"mma": "_mma_cost", "thin": "_thin_cost", "simt": "_gemm_cost", "wgmma": "_wgmma_cost"}
EPILOGUE_UNITS = ("mma",)   # the units whose epilogue term gets its own factor
GRID = {"fixed": np.arange(0.0, 3.01, 0.05), "scale": np.arange(0.8, 2.01, 0.05), "epilogue": np.arange(0.5, 4.01, 0.1)}
BAND = (0.8, 1.25)


def corrected(t: float, launch: float, epi: float, c: dict[str, float]) -> float:
    """The correction of the module doc, applied to one prediction."""
    return t + c.get("fixed", 0.0) + (c.get("scale", 1.0) - 1) * (t - launch - epi) + (c.get("epilogue", 1.0) - 1) * epi


def unit_keys(hw: Profile, unit: str) -> dict[str, float]:
    d = hw.data
    names = (("fixed", "fixed_us"), ("scale", "scale"), ("epilogue", "epilogue_scale"))
    return {name: d[f"{unit}_{key}"] for name, key in names
            if f"{unit}_{key}" in d}


def install() -> None:
    """Wrap each UNITS cost function so a profile's `<unit>_*` keys correct its estimate (every function takes the
    profile last; `cost()` looks them up in the module at each call, so the wrapper is what ranking sees)."""
    for unit, name in UNITS.items():
        fn = getattr(cost_module, name)
        if getattr(fn, "_corrected", False):
            continue

        def wrapped(*a: Any, _fn: Callable = fn, _unit: str = unit) -> cost_module.Estimate:
            est = _fn(*a)
            c = unit_keys(a[-1], _unit)
            if not c:
                return est
            t = corrected(est.time_us, est.terms.get("launch_us", a[-1].launch_overhead_us),
                          est.terms.get("t_epilogue_us", 0.0) if _unit in EPILOGUE_UNITS else 0.0, c)
            return cost_module.Estimate(t, est.flops, est.bytes, est.terms)
        wrapped._corrected = True
        setattr(cost_module, name, wrapped)


def plan_model(onnx_path: Path, hw: Profile):
    import onnx
    from aicfc.frontend.onnx_import import import_model
    from aicfc.passes.pipeline import Options, run_pipeline
    model = import_model(onnx.load(str(onnx_path)), None, name=onnx_path.stem)
    return run_pipeline(model, Options(hw.arch, hw, "fp16")).plan


def timed(plan, report: dict[str, Any], hw: Profile, max_k: int) -> list[dict[str, Any]]:
    """Every timed GEMM candidate of a UNITS unit at K <= max_k: measured, predicted (at ptxas's registers), L, E."""
    types, out = plan.types(), []
    kernels = {k.name: k for k in plan.kernels if k.family == "gemm"}
    for kt in report["kernels"]:
        k = kernels.get(kt["name"])
        if k is None or gemm.dims(k)[3] > max_k:
            continue
        for c in kt["candidates"]:
            p = c["params"]
            if not c.get("measured_us") or p["unit"] not in UNITS:
                continue
            grid, block, dyn = FAMILIES["gemm"].launch(k, p)
            est = recost(k, p, grid, block, dyn, c.get("registers") or c["registers_planned"], types, hw)
            out.append({"unit": p["unit"], "measured": c["measured_us"], "t": est.time_us,
                        "launch": est.terms.get("launch_us", hw.launch_overhead_us),
                        "epi": est.terms.get("t_epilogue_us", 0.0) if p["unit"] in EPILOGUE_UNITS else 0.0})
    return out


def fit(rows: list[dict[str, Any]]) -> dict[str, float]:
    """The correction (module doc) minimising the mean squared log error over `rows` (one unit's), by grid search;
    the epilogue's factor only where the unit has an epilogue term."""
    t, lau, epi, meas = (np.array([r[key] for r in rows]) for key in ("t", "launch", "epi", "measured"))
    with_epi = bool(epi.any())
    f, s, e = np.meshgrid(GRID["fixed"], GRID["scale"], GRID["epilogue"] if with_epi else np.ones(1), indexing="ij")
    pred = t + f[..., None] + (s[..., None] - 1) * (t - lau - epi) + (e[..., None] - 1) * epi
    err = np.mean(np.log(np.maximum(pred, 1e-3) / meas) ** 2, axis=-1)
    i = np.unravel_index(np.argmin(err), err.shape)
    out = {"fixed": round(float(f[i]), 3), "scale": round(float(s[i]), 3)}
    if with_epi:
        out["epilogue"] = round(float(e[i]), 3)
    return out


def band(rows: list[dict[str, Any]], c: dict[str, float]) -> tuple[float, float]:
    """(geometric mean of measured / predicted, share in BAND) under correction c."""
    r = [x["measured"] / corrected(x["t"], x["launch"], x["epi"], c) for x in rows]
    return math.exp(sum(map(math.log, r)) / len(r)), sum(BAND[0] <= v <= BAND[1] for v in r) / len(r)


def fitted_profile(base: dict[str, Any], fits: dict[str, dict[str, float]]) -> dict[str, Any]:
    data = dict(base)
    for unit, c in fits.items():
        data[f"{unit}_fixed_us"] = c["fixed"]
        data[f"{unit}_scale"] = c["scale"]
        if "epilogue" in c:
            data[f"{unit}_epilogue_scale"] = c["epilogue"]
    return data


def compare(base_rows: list[dict[str, Any]], new_rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Per model, over the kernels both plans have: the picks whose measured time got faster / slower (beyond 1%)
    and their sums where both picks were measured; the picks the GPU never timed under the fitted profile that
    it timed under the base one ("unmeasured"); and the same counts and sums for the best measured candidate of
    each ranking (the pick among the candidates the report timed: what a CPU can judge of every kernel)."""
    new = {r["kernel"]: r for r in new_rows}
    out = {"kernels": 0, "better": 0, "worse": 0, "unmeasured": 0, "sum_base": 0.0, "sum_new": 0.0,
           "timed_better": 0, "timed_worse": 0, "timed_sum_base": 0.0, "timed_sum_new": 0.0}
    for r in base_rows:
        n = new.get(r["kernel"])
        if n is None:
            continue
        out["kernels"] += 1
        b, f = r["best_measured_by_new_us"], n["best_measured_by_new_us"]
        if b is not None and f is not None:
            out["timed_sum_base"] += b
            out["timed_sum_new"] += f
            out["timed_better"] += f < 0.99 * b
            out["timed_worse"] += f > 1.01 * b
        if r["new_pick_us"] is None:
            continue
        if n["new_pick_us"] is None:
            out["unmeasured"] += 1
            continue
        out["sum_base"] += r["new_pick_us"]
        out["sum_new"] += n["new_pick_us"]
        out["better"] += n["new_pick_us"] < 0.99 * r["new_pick_us"]
        out["worse"] += n["new_pick_us"] > 1.01 * r["new_pick_us"]
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", type=Path, required=True, help="folder of the reports' ONNX models (<name>.onnx)")
    ap.add_argument("--max-k", type=int, default=160, help="fit the GEMMs with K at most this (default 160)")
    ap.add_argument("--profile", default="h200", help="base hardware profile (a bundled GPU's name or a JSON file)")
    ap.add_argument("--units", default=",".join(UNITS), help=f"units to fit, of {','.join(UNITS)}")
    ap.add_argument("--write-profile", type=Path, help="write the base profile with the fitted keys to this file")
    args = ap.parse_args(argv)
    units = args.units.split(",")
    missing = [f"{name}.onnx" for name, _ in REPORTS if not (args.models / f"{name}.onnx").exists()]
    if bad := [u for u in units if u not in UNITS]:
        print(f"fit_units: --units: {', '.join(bad)} not among {', '.join(UNITS)}", file=sys.stderr)
        return 2
    if missing or args.max_k < 1:
        why = (f"--models {args.models} lacks {', '.join(sorted(set(missing)))}" if missing
               else "--max-k must be positive")
        print(f"fit_units: {why}", file=sys.stderr)
        return 2
    try:
        hw = load_profile("sm_90", args.profile)
    except AicfError as e:
        print(f"fit_units: {e}", file=sys.stderr)
        return 2
    install()
    plans = {name: plan_model(args.models / f"{name}.onnx", hw) for name in dict(REPORTS)}
    reports = [(name, rep, json.loads((RESULTS / rep).read_text())) for name, rep in REPORTS]
    rows = [r for name, _, report in reports for r in timed(plans[name], report, hw, args.max_k)]

    fits = {u: fit([r for r in rows if r["unit"] == u]) for u in units}
    print(f"fit over timed GEMM candidates with K <= {args.max_k}; t' = t + fixed + (scale-1)(t-L-E) + (epilogue-1)E")
    print(f"{'unit':6s} {'n':>4s}  {'before: geo, in band':22s}  {'after: geo, in band':22s}  fitted")
    for u in UNITS:
        rs = [r for r in rows if r["unit"] == u]
        g0, b0 = band(rs, {})
        g1, b1 = band(rs, fits.get(u, {}))
        print(f"{u:6s} {len(rs):4d}  {g0:6.3f} {b0:6.0%}{'':8s}  {g1:6.3f} {b1:6.0%}{'':8s}  {fits.get(u, '-')}")

    new_hw = Profile(fitted_profile(hw.data, fits))
    new_plans = {name: plan_model(args.models / f"{name}.onnx", new_hw) for name in dict(REPORTS)}
    print(f"\nre-ranked picks, base profile ({args.profile}) against fitted (measured times from the reports): "
          f"picks whose\nmeasured time got faster / slower, picks now unmeasured, sums over kernels measured both "
          f"times; then the\nbest timed candidate of each ranking (the pick among what the GPU timed), faster / slower "
          f"and sums")
    keys = ("better", "worse", "unmeasured", "sum_base", "sum_new", "timed_better", "timed_worse", "timed_sum_base",
            "timed_sum_new")
    print(f"{'report':46s} {'kern':>4s} {'bett':>4s} {'wors':>4s} {'unme':>4s} {'sum base':>9s} {'sum fit':>9s} |"
          f" {'bett':>4s} {'wors':>4s} {'timed base':>10s} {'timed fit':>10s}")
    total = dict.fromkeys(keys, 0)
    moved = []
    for name, rep, report in reports:
        base_rows, new_rows = rerank(plans[name], hw, report), rerank(new_plans[name], new_hw, report)
        c = compare(base_rows, new_rows)
        for key in keys:
            total[key] += c[key]
        print(f"{rep:46s} {c['kernels']:4d} {c['better']:4d} {c['worse']:4d} {c['unmeasured']:4d} {c['sum_base']:9.1f} "
              f"{c['sum_new']:9.1f} | {c['timed_better']:4d} {c['timed_worse']:4d} {c['timed_sum_base']:10.1f} "
              f"{c['timed_sum_new']:10.1f}")
        old = {r["kernel"]: r for r in base_rows}
        origins = {k.name: k.origins for k in new_plans[name].kernels}
        moved += [(rep, old[r["kernel"]], r, origins.get(r["kernel"], ())) for r in new_rows
                  if r["kernel"] in old and r["new_pick_params"] != old[r["kernel"]]["new_pick_params"]]
    t = total
    print(f"{'all':46s} {'':4s} {t['better']:4d} {t['worse']:4d} {t['unmeasured']:4d} {t['sum_base']:9.1f} "
          f"{t['sum_new']:9.1f} | {t['timed_better']:4d} {t['timed_worse']:4d} {t['timed_sum_base']:10.1f} "
          f"{t['timed_sum_new']:10.1f}")

    def us(v: float | None) -> str:
        return "unmeasured" if v is None else f"{v:.2f} us"
    print("\npicks the fit moves (the fitted pick as --pin NODE:KEY=VALUE, to time it):")
    for rep, o, n, nodes in moved:
        node = nodes[0] if nodes else "?"
        print(f"  {rep[5:-5]} {n['kernel']}: {o['new_pick_params'].get('unit')} {us(o['new_pick_us'])} -> "
              f"{n['new_pick_params'].get('unit')} {us(n['new_pick_us'])} "
              f"(predicted {n['new_pick_predicted_us']:.2f}); "
              f"fastest timed {n['fastest_us']:.2f} us")
        print("    " + " ".join(f"--pin {node}:{key}={value}" for key, value in n["new_pick_params"].items()))
    good = (total["better"] > total["worse"] and total["sum_new"] < total["sum_base"] and not total["unmeasured"]
            and total["timed_sum_new"] <= total["timed_sum_base"])
    print(f"\nthe fit {'improves' if good else 'does not improve'} the measured picks (needs more better than worse, "
          f"a smaller sum, no pick moved to an unmeasured candidate, and the timed picks no slower)")
    if args.write_profile and good:
        args.write_profile.write_text(json.dumps(new_hw.data, indent=2) + "\n")   # the whole profile, fitted keys included
        print(f"wrote {args.write_profile} (keys the tree's cost model reads only with a change: see the module doc)")
    elif args.write_profile:
        print(f"{args.write_profile} not written")
    return 0


if __name__ == "__main__":
    sys.exit(main())
