"""Score a cost-model change against a stored `aicfc tune --json` report, without a GPU.

The report holds what a GPU measured for each kernel's candidates. This re-plans the same model
with this tree's planner (and an optional profile), re-ranks every kernel's space as compile
does, with the report's ptxas register counts standing in for the build of the leaders
(`plan_schedules.check_leaders`), and sets the new ranking against the measurements:

- the new pick, and its measured time when the report measured it ("unmeasured" when the model
  now prefers a candidate the GPU never timed: measure it before trusting the change);
- the best measured candidate by the new ranking, against the old pick's and the fastest's time;
- Spearman's rank correlation of the new predictions and the measurements, per kernel.

    python3 benchmarks/tune_rerank.py /tmp/r50/r50_b32.onnx benchmarks/results/tune_resnet50_b32_session29_h200.json \\
        --precision fp16 --profile aicfc/profiles/gpus/h200.json

With --calibration it also prints, over every timed candidate, measured / predicted by group (a `wgmma`
schedule's warpgroup arrangement: cooperative, ping-pong, lone; an `mma` tile's warps a block; every other unit)
and how many of the wgmma schedules timed both as a cluster pair and alone the model orders as measured: what
session 38's two cost changes were found with, and session 42's finding that `mma` runs 1.5-1.7x its prediction
on the H200 (2.3x at one warp a block).

The model must be the one the report was measured on, or one with the same kernels: kernels and
candidates are matched by name and parameters. `benchmarks/resnet50_graph.py` writes ResNet-50
without torch; against session 29's report of the torch export its kernels predict within 1-14%
of the report (their epilogues are not all identical), enough to flip near-ties: run this script
in both trees of an A/B and compare the two outputs, not one output against the report's picks.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from aicfc.passes.plan_schedules import _params as params_key, check_leaders, rank  # noqa: E402
from aicfc.planner.cost import estimate_registers  # noqa: E402
from aicfc.planner.cost_wgmma import cooperative  # noqa: E402
from aicfc.planner.fit import WITHIN, spearman  # noqa: E402


def rerank(plan, hw, report: dict[str, Any], only: set[str] | None = None) -> list[dict[str, Any]]:
    """One row per GEMM or convolution kernel of `report` that `plan` has (see the module doc)."""
    measured = {kt["name"]: kt for kt in report["kernels"]
                if kt["family"] in ("gemm", "conv") and (only is None or kt["name"] in only)}
    problems = [(k, *rank(k, plan, hw)) for k in plan.kernels if k.name in measured]
    problems = [p for p in problems if p[1]]
    regs = {(kt["name"], params_key(c["params"])): c["registers"] for kt in measured.values() for c in kt["candidates"]
            if c.get("registers")}

    def check(plan_, batch):   # the report's ptxas counts, where it has them; no candidate spills
        return [[(regs.get((k.name, params_key(p)), estimate_registers(k, p)), 0) for p in ps] for k, ps in batch]

    rows = []
    for (k, _, _), ranked in zip(problems, check_leaders(plan, hw, problems, check)):
        kt = measured[k.name]
        timed = {params_key(c["params"]): c for c in kt["candidates"] if c.get("measured_us")}
        if not timed:
            continue
        new = [(r, timed.get(params_key(r.params))) for r in ranked]
        pick, pick_timed = new[0]
        best = next(((r, c) for r, c in new if c), None)
        old = next((c for c in timed.values() if c["rank"] == 0), None)
        fastest = min(timed.values(), key=lambda c: c["measured_us"])
        pairs = [(r.time_us, c["measured_us"]) for r, c in new if c]
        rows.append({"kernel": k.name, "old_pick_us": old["measured_us"] if old else None,
                     "new_pick_us": pick_timed["measured_us"] if pick_timed else None,
                     "new_pick_predicted_us": pick.time_us, "new_pick_params": dict(pick.params),
                     "best_measured_by_new_us": best[1]["measured_us"] if best else None,
                     "fastest_us": fastest["measured_us"],
                     "spearman": spearman([p for p, _ in pairs], [m for _, m in pairs])})
    return rows


def arrangement(p: dict[str, Any]) -> str:
    """A wgmma schedule's warpgroups: "cooperative" (NWG = 2 on one tile), "ping-pong" or "lone" (one issuer)."""
    if p.get("PP"):
        return "ping-pong"
    return "cooperative" if cooperative(p) else "lone"


def group(p: dict[str, Any]) -> str:
    """A timed candidate's calibration group: a wgmma schedule's warpgroup arrangement, an `mma` tile's warps
    a block (its error grows as they fall: session 42), else its unit."""
    unit = p.get("unit", "?")
    if unit == "wgmma":
        return arrangement(p)
    if unit == "mma":
        return f"mma, {p['WM'] * p['WN']} warps"
    return unit


def calibration(plan, hw, report: dict[str, Any], offset_us: float = 0.0) -> list[str]:
    """How this tree's predictions sit against the report's times, for every timed candidate of a GEMM or
    convolution: the geometric mean of measured / predicted and the share within [0.8, 1.25] by group (`group`:
    a wgmma schedule's warpgroup arrangement, [Note: two issuing warpgroups] in planner/cost_wgmma.py; an mma
    tile's warps; every other unit), and, of the wgmma schedules timed both as a cluster pair and alone, how
    many the model orders as measured ([Note: a cluster pair in lockstep]). `offset_us` is added to every
    prediction first: what the report's timing adds to a kernel over the launch term the profile is fitted to
    (`aicfc tune` launches on a stream: [Note: launch overhead and the plan gap] in planner/hardware.py)."""
    measured = {kt["name"]: kt for kt in report["kernels"] if kt["family"] in ("gemm", "conv")}
    ratios: dict[str, list[float]] = {}
    units: dict[str, str] = {}
    pairs = right = 0
    for k in plan.kernels:
        if k.name not in measured:
            continue
        by = {params_key(r.params): r.time_us for r in rank(k, plan, hw)[0]}
        timed = {params_key(c["params"]): c["measured_us"] for c in measured[k.name]["candidates"]
                 if c.get("measured_us")}
        for key, us in timed.items():
            if key in by:
                ratios.setdefault(group(dict(key)), []).append(us / (by[key] + offset_us))
                units[group(dict(key))] = dict(key).get("unit", "?")
            if dict(key).get("unit") != "wgmma":
                continue
            alone = params_key({**dict(key), "CLUSTER": 1})
            if dict(key).get("CLUSTER", 1) > 1 and alone in timed and key in by and alone in by:
                pairs += 1
                right += (us > timed[alone]) == (by[key] > by[alone])
    lines = []
    for name, rs in sorted(ratios.items()):
        geo = math.exp(sum(math.log(r) for r in rs) / len(rs))
        band = sum(0.8 <= r <= 1.25 for r in rs) / len(rs)
        what = "wgmma candidates" if units[name] == "wgmma" else "candidates"
        lines.append(f"{name:12s} {len(rs):4d} timed {what}: measured / predicted {geo:.3f} (geometric mean), "
                     f"{band:.0%} in [0.8, 1.25]")
    if offset_us:
        lines.append(f"(every prediction + {offset_us:g} us, the report's timing over the profile's launch term)")
    lines.append(f"cluster pairs timed both ways: {pairs}; ordered as measured: {right}")
    return lines


def summary(rows: list[dict[str, Any]]) -> list[str]:
    lines = []
    for r in rows:
        new = f"{r['new_pick_us']:7.2f}" if r["new_pick_us"] is not None else " unmeas"
        old = f"{r['old_pick_us']:7.2f}" if r["old_pick_us"] is not None else "      -"
        moved = "*" if r["new_pick_us"] != r["old_pick_us"] else " "
        lines.append(f"{moved}{r['kernel']:>5}  old pick {old}  new pick {new} (predicted {r['new_pick_predicted_us']:7.2f})"
                     f"  fastest {r['fastest_us']:7.2f}  Spearman {r['spearman']:5.2f}")
    both = [r for r in rows if r["new_pick_us"] is not None and r["old_pick_us"] is not None]
    within = sum(r["new_pick_us"] <= (1 + WITHIN) * r["fastest_us"] for r in both)
    band = sum(0.8 <= r["new_pick_us"] / r["new_pick_predicted_us"] <= 1.25 for r in both)
    sp = [r["spearman"] for r in rows if not math.isnan(r["spearman"])]
    lines.append(f"kernels {len(rows)}; new picks measured {len(both)} (unmeasured {len(rows) - len(both)}); "
                 f"within {WITHIN:.0%} of the fastest {within}; measured / predicted in [0.8, 1.25] {band}; "
                 f"mean Spearman {sum(sp) / max(len(sp), 1):.3f}")
    lines.append(f"measured time of the picks, where both were measured: old {sum(r['old_pick_us'] for r in both):.1f} us, "
                 f"new {sum(r['new_pick_us'] for r in both):.1f} us")
    return lines


def main(argv: list[str] | None = None) -> int:
    import onnx
    from aicfc.frontend.onnx_import import import_model
    from aicfc.passes.pipeline import Options, run_pipeline
    from aicfc.planner.hardware import load_profile

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", type=Path)
    ap.add_argument("report", type=Path, help="an `aicfc tune --json` report of the same model")
    ap.add_argument("--precision", default="fp16")
    ap.add_argument("--target", default="sm_90")
    ap.add_argument("--profile", help="hardware profile to re-rank under (JSON, or a bundled GPU's name)")
    ap.add_argument("--kernels", help="comma-separated kernel names (default: every GEMM and convolution)")
    ap.add_argument("--calibration", action="store_true",
                    help="also print measured / predicted by group (wgmma arrangement, mma warps, unit) and the "
                         "cluster pairs' order")
    ap.add_argument("--timing-offset-us", type=float, default=0.0, metavar="US",
                    help="with --calibration, add US to every prediction: what the report's timing adds to a kernel "
                         "over the profile's launch term (aicfc tune's stream launches: about 0.9 on an H200 with "
                         "--profile h200, session 10's 1.89 us against the profile's 1.0)")
    args = ap.parse_args(argv)
    if args.timing_offset_us < 0 or not math.isfinite(args.timing_offset_us):
        print("tune_rerank: --timing-offset-us must be a finite number >= 0", file=sys.stderr)
        return 2
    report = json.loads(args.report.read_text())
    hw = load_profile(args.target, args.profile)
    plan = run_pipeline(import_model(onnx.load(str(args.model)), None, name=args.model.stem),
                        Options(args.target, hw, args.precision)).plan
    rows = rerank(plan, hw, report, set(args.kernels.split(",")) if args.kernels else None)
    print("\n".join(summary(rows)))
    if args.calibration:
        print("\n".join(calibration(plan, hw, report, args.timing_offset_us)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
