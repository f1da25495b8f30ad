"""The cost model's GEMM predictions against every GEMM kernel of BERT-base and GPT-2 small, timed alone.

    source .gpu/env.sh && python3 benchmarks/gemm_predictions.py [--json F] [--cases bert:8x512,...]
    python3 benchmarks/gemm_predictions.py --tiny --no-gpu     # CPU: export and compile only

Each case is built and exported as benchmarks/models.py does (random weights, the dynamo
exporter, opset 18, float32 at the case's static shape), compiled by aicfc at fp16 (--pin
KEY=VALUE passed through), loaded by aicf_run and run once on random inputs; then
`Executor.profile()` (aicf_run/profile.py) times every kernel alone: GRAPH_LAUNCHES back-to-back
launches of it captured into a graph, replays between CUDA events, the median per launch.
Then the plan's graph is replayed under torch.profiler and each kernel's slot in it (its end
minus its predecessor's; [Note: in-plan slots] in benchmarks/in_plan.py) is its in-plan time.
For every kernel of a GEMM family (`gemm`; --families to change) printed: its name, M x N x K
(from the bundle's decision IR, the contraction's result shape and reduced extent, else from
the stored buffer and K = predicted FLOPs / (2 M N); N is the last extent, M the others
multiplied, so batch and sequence are folded into M), the chosen schedule (unit,
tile BMxBNxBK, stages, split-k), the predicted time (`predicted.time_us`, launch included), the
measured time, measured / predicted, the in-plan time and in-plan / predicted. Then, per case and
over all cases, the share of those kernels within [0.8, 1.25], and the geometric mean of the
ratio, for both timings.
With --no-gpu the same table is printed with the predictions alone.
"""
from __future__ import annotations

import argparse
import json
import math
import re
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.models import build, export, format_case, make_inputs, parse_cases  # noqa: E402

CASES = [("bert", 8, 512), ("bert", 1, 128), ("gpt2", 8, 512), ("gpt2", 1, 128)]
BAND = (0.8, 1.25)
FAMILIES = ("gemm",)


def within_band(ratios, lo: float = BAND[0], hi: float = BAND[1]) -> tuple[int, int, float | None]:
    """(how many ratios lie in [lo, hi], how many there are, that share or None when there are
    none). A missing (None) or NaN ratio counts in the total and never within."""
    ratios = list(ratios)
    good = sum(1 for r in ratios if r is not None and lo <= r <= hi)
    return good, len(ratios), (good / len(ratios) if ratios else None)


def geomean(ratios) -> float | None:
    vals = [r for r in ratios if r is not None and r > 0 and math.isfinite(r)]
    return math.exp(sum(map(math.log, vals)) / len(vals)) if vals else None


# A kernel's contraction in the decision IR: `kernel k1 gemm {` then its first op,
# `%y: f16[2,64,192] = sum[64] mul(...)` (the result's shape, then the reduced extents).
_IR_CONTRACTION = re.compile(r"kernel (\S+) \w+ \{\n\s*%[^\n]*?: \w+\[([\d, ]*)\] = sum\[([\d, ]+)\]")


def ir_contractions(ir_text: str) -> dict[str, tuple[list[int], int]]:
    """{kernel name: (contraction result shape, K)} for every kernel whose first op is a sum."""
    out = {}
    for name, shape, red in _IR_CONTRACTION.findall(ir_text or ""):
        dims = [int(d) for d in shape.replace(" ", "").split(",") if d]
        out[name] = (dims, math.prod(int(d) for d in red.replace(" ", "").split(",") if d))
    return out


def gemm_dims(kernel: dict, buffers: list[dict], contraction: tuple[list[int], int] | None = None) -> dict | None:
    """{"m", "n", "k", "out_shape"} of a GEMM kernel: from `contraction` (ir_contractions) when
    given, else from its bundle record: the shape of the buffer it stores (its first store) and
    K from the predicted FLOPs (2 M N K, as planner/cost.py counts them). N is the last extent
    of that shape, M the product of the others. None when nothing tells."""
    k = None
    if contraction and contraction[0]:
        shape, k = contraction
    else:
        stores = kernel.get("stores") or []
        by_name = {b.get("name"): b for b in buffers}
        shape = by_name.get(stores[0], {}).get("shape") if stores else None
    if not shape:
        return None
    n = int(shape[-1])
    m = int(math.prod(shape[:-1])) if len(shape) > 1 else 1
    flops = (kernel.get("predicted") or {}).get("flops")
    if k is None and isinstance(flops, (int, float)) and m * n > 0:
        kf = flops / (2.0 * m * n)
        k = int(round(kf)) if kf > 0 and abs(kf - round(kf)) < 1e-6 * max(1.0, kf) else round(kf, 3)
    return {"m": m, "n": n, "k": k, "out_shape": list(shape)}


def schedule_text(params: dict) -> str:
    """'wgmma 128x256x64 s4' style: unit, BMxBNxBK tile, then stages/split-k/others."""
    p = dict(params)
    unit = p.pop("unit", "?")
    tile = "x".join(str(p.pop(key)) for key in ("BM", "BN", "BK") if key in p)
    extra = []
    if "STAGES" in p:
        extra.append(f"s{p.pop('STAGES')}")
    if p.get("SPLITK", 1) != 1:
        extra.append(f"splitk{p.pop('SPLITK')}")
    p.pop("SPLITK", None)
    p.pop("dtype", None)
    extra += [f"{a}={b}" for a, b in sorted(p.items())]
    return " ".join(x for x in [unit, tile, *extra] if x)


def gemm_rows(payload: dict, measured: list[float | None] | None, families=FAMILIES,
              in_plan: dict[int, float] | None = None) -> list[dict]:
    """One row per kernel of `families` in `payload`; `measured` the profile's times by kernel
    index (None: not measured); `in_plan` each kernel's slot in the plan's replays by index
    (benchmarks/in_plan.py), where it was measured."""
    rows = []
    contractions = ir_contractions((payload.get("ir") or {}).get("decision", ""))
    for i, k in enumerate(payload["kernels"]):
        if k.get("family") not in families:
            continue
        pred = (k.get("predicted") or {}).get("time_us")
        meas = measured[i] if measured is not None else None
        placed = (in_plan or {}).get(i)
        dims = gemm_dims(k, payload.get("buffers", []), contractions.get(k["name"]))
        rows.append({"index": i, "name": k["name"], "family": k.get("family"),
                     "onnx_nodes": list(k.get("onnx_nodes", [])),
                     "m": dims and dims["m"], "n": dims and dims["n"], "k": dims and dims["k"],
                     "out_shape": dims and dims["out_shape"],
                     "params": dict(k.get("params", {})), "unit": k.get("params", {}).get("unit"),
                     "schedule": schedule_text(k.get("params", {})),
                     "predicted_us": pred, "measured_us": meas,
                     "ratio": meas / pred if meas is not None and pred else None,
                     "in_plan_us": placed,
                     "in_plan_ratio": placed / pred if placed is not None and pred else None,
                     "flops": (k.get("predicted") or {}).get("flops")})
    return rows


def format_rows(rows: list[dict]) -> list[str]:
    out = [f"  {'#':>4} {'kernel':<10} {'M x N x K':<20} {'schedule':<34} {'pred us':>9} {'meas us':>9} "
           f"{'meas/pred':>9} {'in plan':>9} {'plan/pred':>9}  onnx nodes"]
    for r in rows:
        dims = f"{r['m']}x{r['n']}x{r['k']}" if r["m"] is not None else "?"
        f = lambda v, p=2: f"{v:>9.{p}f}" if v is not None else f"{'-':>9}"  # noqa: E731
        flag = lambda v: "  " if v is None or BAND[0] <= v <= BAND[1] else " *"  # noqa: E731
        nodes = ", ".join(r["onnx_nodes"][:3]) + (" ..." if len(r["onnx_nodes"]) > 3 else "")
        out.append(f"  {r['index']:>4} {r['name']:<10} {dims:<20} {r['schedule'][:34]:<34} {f(r['predicted_us'])} "
                   f"{f(r['measured_us'])} {f(r['ratio'])}{flag(r['ratio'])}"
                   f"{f(r.get('in_plan_us'))} {f(r.get('in_plan_ratio'))}{flag(r.get('in_plan_ratio'))}  {nodes}")
    return out


def summary(rows: list[dict]) -> dict:
    ratios = [r["ratio"] for r in rows if r["measured_us"] is not None]
    good, total, frac = within_band(ratios)
    placed = [r.get("in_plan_ratio") for r in rows if r.get("in_plan_us") is not None]
    p_good, p_total, p_frac = within_band(placed)
    return {"kernels": len(rows), "measured": total, "within": good, "fraction": frac,
            "geomean_ratio": geomean(ratios), "band": list(BAND),
            "predicted_sum_us": sum(r["predicted_us"] or 0.0 for r in rows),
            "measured_sum_us": sum(r["measured_us"] for r in rows if r["measured_us"] is not None),
            "in_plan_measured": p_total, "in_plan_within": p_good, "in_plan_fraction": p_frac,
            "in_plan_geomean_ratio": geomean(placed),
            "in_plan_sum_us": sum(r["in_plan_us"] for r in rows if r.get("in_plan_us") is not None)}


def summary_text(s: dict) -> str:
    if not s["measured"]:
        return f"  {s['kernels']} GEMM kernels, predicted sum {s['predicted_sum_us']:.1f} us (not measured)"
    text = (f"  {s['within']}/{s['measured']} GEMM kernels within [{BAND[0]}, {BAND[1]}] of predicted "
            f"({100 * s['fraction']:.0f}%); geometric mean measured/predicted {s['geomean_ratio']:.2f}; "
            f"sums: predicted {s['predicted_sum_us']:.1f} us, measured {s['measured_sum_us']:.1f} us")
    if s.get("in_plan_measured"):
        text += (f"\n  in the plan (each kernel's slot in the graph's replays, benchmarks/in_plan.py): "
                 f"{s['in_plan_within']}/{s['in_plan_measured']} within ({100 * s['in_plan_fraction']:.0f}%); "
                 f"geometric mean {s['in_plan_geomean_ratio']:.2f}; sum {s['in_plan_sum_us']:.1f} us")
    return text


def run_case(dev, name: str, batch: int, seq: int, tiny: bool, work: Path, pin: dict,
             families=FAMILIES, profile: Path | None = None) -> dict:
    import torch

    import aicfc
    rng = np.random.default_rng(batch * 1000 + seq)
    torch.manual_seed(0)
    model = build(name, tiny)
    inputs = make_inputs(name, batch, seq, rng, tiny)
    path = work / f"{name}_b{batch}_s{seq}.onnx"
    t_export = export(model, inputs, path)
    t = time.perf_counter()
    payload = aicfc.compile(str(path), target=dev.arch if dev else "sm_90", precision="fp16", pin=pin or None,
                            profile_path=profile)
    t_compile = time.perf_counter() - t
    path.unlink(missing_ok=True)
    case = {"case": format_case((name, batch, seq)), "model": name, "batch": batch, "seq": seq, "tiny": tiny,
            "kernels": len(payload["kernels"]), "export_s": t_export, "compile_s": t_compile, "pin": pin}
    measured, in_plan = None, None
    if dev is not None:
        from aicf_run.bundle import Bundle
        from aicf_run.executor import Executor
        ex = Executor(Bundle.from_payload(payload), dev)
        try:
            ex.run(inputs)   # the arena holds a real run's values when each kernel is timed
            report = ex.profile()
            try:   # [Note: in-plan slots] in benchmarks/in_plan.py
                from benchmarks.in_plan import measure
                in_plan = measure(ex, [k["symbol"] for k in payload["kernels"]])
                case["in_plan_slot_sum_us"] = sum(in_plan.values()) if len(in_plan) == len(payload["kernels"]) else None
            except Exception as e:   # tracing is a second opinion; its failure is a field, not the end
                case["in_plan_error"] = f"{type(e).__name__}: {' '.join(str(e).split())[:200]}"
        finally:
            ex.close()
        measured = [k.measured_us for k in report.kernels]
        case.update({"plan_us": report.plan_us, "kernel_sum_us": report.kernel_sum_us,
                     "predicted_sum_all_us": report.predicted_sum_us, "profile_mode": report.mode})
    rows = gemm_rows(payload, measured, families, in_plan)
    case["gemms"] = rows
    case["summary"] = summary(rows)
    return case


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", help="comma-separated MODEL:BATCHxSEQ (default: " +
                    ",".join(map(format_case, CASES)) + ")")
    ap.add_argument("--pin", action="append", default=[], metavar="KEY=VALUE",
                    help="passed to aicfc as `aicfc compile --pin` (repeatable), e.g. unit=mma")
    ap.add_argument("--profile", type=Path, metavar="F",
                    help="the hardware profile aicfc plans with (`aicfc compile --profile`: e.g. one that sets "
                         "sm_l2_port_gbs, planner/hardware.py's [Note: L2 share of a small grid])")
    ap.add_argument("--families", default=",".join(FAMILIES),
                    help="comma-separated kernel families to report (default: gemm; e.g. gemm,conv)")
    ap.add_argument("--tiny", action="store_true", help="small configs (2 layers, hidden 64)")
    ap.add_argument("--no-gpu", action="store_true", help="export and compile only (predictions alone)")
    ap.add_argument("--json", type=Path, help="also write every case and kernel as JSON")
    return ap


def main(argv: list[str] | None = None) -> int:
    from benchmarks.gemm import parse_pins
    ap = build_parser()
    args = ap.parse_args(argv)
    try:
        cases = parse_cases(args.cases) if args.cases else list(CASES)
        pin = parse_pins(args.pin)
    except ValueError as e:
        ap.error(str(e))
    families = tuple(f.strip() for f in args.families.split(",") if f.strip())
    dev = None
    if not args.no_gpu:
        from aicf_run.device import open_device
        dev = open_device(0)
        print(f"GPU: {dev.name} ({dev.arch}); fp16; each kernel timed alone by Executor.profile()", flush=True)
    results, bad = [], []
    with tempfile.TemporaryDirectory(prefix="aicf-gemm-pred-") as tmp:
        for name, batch, seq in cases:
            label = format_case((name, batch, seq))
            try:
                case = run_case(dev, name, batch, seq, args.tiny, Path(tmp), pin, families, args.profile)
            except Exception as e:   # one case's failure is a line, not the end
                bad.append(f"{label}: {type(e).__name__}: {' '.join(str(e).split())[:300]}")
                print(f"{label}: FAILED {bad[-1]}", flush=True)
                continue
            results.append(case)
            plan = (f"; plan {case['plan_us']:.1f} us, kernels alone {case['kernel_sum_us']:.1f} us"
                    if "plan_us" in case else "")
            if case.get("in_plan_slot_sum_us") is not None:
                plan += f", in-plan slots {case['in_plan_slot_sum_us']:.1f} us"
            if "in_plan_error" in case:
                plan += f"; in-plan slots not measured ({case['in_plan_error']})"
            print(f"{label}{' (tiny)' if args.tiny else ''}: {case['kernels']} kernels, "
                  f"{len(case['gemms'])} {'/'.join(families)}; export {case['export_s']:.1f} s, "
                  f"aicfc {case['compile_s']:.1f} s{plan}", flush=True)
            print("\n".join(format_rows(case["gemms"])), flush=True)
            print(summary_text(case["summary"]), flush=True)
            if args.json:
                write_json(args.json, dev, results, bad, pin)
    overall = summary([r for c in results for r in c["gemms"]])
    print("all cases:\n" + summary_text(overall))
    if args.json:
        write_json(args.json, dev, results, bad, pin)
    if dev is not None:
        dev.close()
    if bad:
        print("FAILURES:\n  " + "\n  ".join(bad))
        return 1
    return 0


def json_doc(gpu: str | None, results: list[dict], failures: list[str], pin: dict) -> dict:
    return {"gpu": gpu, "precision": "fp16", "pin": pin, "band": list(BAND),
            "timing": "Executor.profile(): each kernel alone, graph of back-to-back launches, CUDA events; "
                      "in_plan: each kernel's slot in replays of the plan's graph (benchmarks/in_plan.py)",
            "cases": results, "overall": summary([r for c in results for r in c["gemms"]]),
            "failures": failures}


def write_json(path: Path, dev, results: list[dict], failures: list[str], pin: dict) -> None:
    path.write_text(json.dumps(json_doc(dev.name if dev else None, results, failures, pin), indent=1))


if __name__ == "__main__":
    sys.exit(main())
