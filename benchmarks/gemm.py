"""aicfc's GEMM against torch.matmul (cuBLAS) on the same GPU, in the same process, timed alike.

    source .gpu/env.sh && python3 benchmarks/gemm.py [--precision fp16 ...] [--quick] [--json F]
    source .gpu/env.sh && python3 benchmarks/gemm.py --edge            # 7x100x257, 1x4096x50257
    source .gpu/env.sh && python3 benchmarks/gemm.py --compare-units   # planner's pick and unit=mma
    source .gpu/env.sh && python3 benchmarks/gemm.py --pin unit=wgmma  # any aicfc --pin KEY=VALUE
    source .gpu/env.sh && python3 benchmarks/gemm.py --tune [--fitted-profile F] ...

For every shape (M x K x N) and precision: an ONNX MatMul y = x @ w is compiled by aicfc (the
cost model picks the schedule, restricted by --pin), loaded by aicf_run; torch.matmul runs on
tensors of the same dtype (tf32: allow_tf32 on; fp32: off). Both sides are timed the same way,
so that small shapes compare kernels, not host launch rates:
  - cuBLAS: PER back-to-back `torch.matmul(a, b, out=c)` (preallocated c) captured into one
    torch.cuda.CUDAGraph; each replay timed between CUDA events, divided by PER;
  - aicf: PER back-to-back runs of the compiled plan (`Executor.launch(graph=False)`, its
    kernels one by one) captured into one CUDA graph on the executor's stream; each replay
    timed between CUDA events on that stream, divided by PER;
the median of REPS replays each (after warm-up), inputs already on the device. PER is 20 (at
most --per-replay), fewer for calls that take longer than 100 us so one replay stays near 2 ms;
both sides use the same PER. Also printed, as `launch us`: PER back-to-back `Executor.launch()`
calls from the host (each one replay of the plan's own graph) between events on its stream,
what a caller looping on launch() sees; at small shapes that is the host's launch rate.

Checked: both outputs against a float64 product of the same (rounded) operands, max|y - ref| /
max|ref| <= RTOL (fp32 1e-5, tf32 1e-3, fp16 and bf16 1e-2; NaN never passes); a failure is
marked FAIL and the script exits 1 (cuBLAS's own error is printed beside aicf's; only aicf's
fails a row). Printed: TFLOP/s of both and cuBLAS/aicf time (ratio > 1:
aicf faster); the geometric mean over the BERT-base shapes.

--tune: all shapes of a precision as one model of independent MatMuls, through `aicfc tune`:
for every shape, is the cost model's pick within 10% of the fastest measured candidate, and
Spearman's rank correlation of predicted and measured over all measured candidates; then the
profile fitted to those measurements, and the same figures under it.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import aicfc  # noqa: E402
from benchmarks.timing import (aicf_graph_us, aicf_launches_us, median_us, paired_graphs_us, replays_for,  # noqa: E402
                               torch_graph_us)

SQUARE = [(n, n, n) for n in (1024, 2048, 4096, 8192)]
BERT = [(m, k, n) for m in (128, 4096) for k, n in ((768, 768), (768, 3072), (3072, 768))]
EDGE = [(7, 100, 257), (1, 4096, 50257)]   # odd sizes; a GEMV with GPT-2's vocabulary
PRECISIONS = ("fp16", "bf16", "tf32", "fp32")
RTOL = {"fp32": 1e-5, "tf32": 1e-3, "fp16": 1e-2, "bf16": 1e-2}   # as tests/test_gemm_gpu.py
TORCH_DTYPE = {"fp16": "float16", "bf16": "bfloat16", "tf32": "float32", "fp32": "float32"}
REPS = 50
PER_REPLAY = 20


def matmul_model(m: int, k: int, n: int, w: np.ndarray) -> onnx.ModelProto:
    g = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], f"mm{m}x{k}x{n}",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [m, k])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [m, n])],
                          [numpy_helper.from_array(w, "w")])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def shapes_model(shapes: list[tuple[int, int, int]]) -> onnx.ModelProto:
    """One independent MatMul per shape, both operands inputs (no weight bytes to carry)."""
    nodes, inputs, outputs = [], [], []
    for i, (m, k, n) in enumerate(shapes):
        nodes.append(helper.make_node("MatMul", [f"x{i}", f"w{i}"], [f"y{i}"], name=f"mm{i}_{m}x{k}x{n}"))
        inputs += [helper.make_tensor_value_info(f"x{i}", TensorProto.FLOAT, [m, k]),
                   helper.make_tensor_value_info(f"w{i}", TensorProto.FLOAT, [k, n])]
        outputs.append(helper.make_tensor_value_info(f"y{i}", TensorProto.FLOAT, [m, n]))
    g = helper.make_graph(nodes, "gemm_shapes", inputs, outputs)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def tune_shapes(dev, shapes: list[tuple[int, int, int]], precision: str, fitted: Path | None,
                top: int = 8, spread: int = 8, report_json: Path | None = None) -> None:
    from aicfc.planner.fit import fit_profile
    from aicfc.tune import tune_model
    report = tune_model(shapes_model(shapes), precision=precision, device=dev, top=top, spread=spread)
    if report_json:
        report_json.write_text(json.dumps(report.to_json(), indent=1))
    print(f"{precision}: cost model vs {sum(len(kt.measured) for kt in report.kernels)} measured candidates")
    print(f"  {'M x K x N':<18} {'measured':>8} {'pick us':>9} {'best us':>9} {'pick/best':>9} {'spearman':>9}")
    for (m, k, n), kt in zip(shapes, report.kernels):
        pick, best = kt.pick, kt.fastest
        print(f"  {f'{m}x{k}x{n}':<18} {len(kt.measured):>8} {pick.measured_us if pick else float('nan'):>9.1f} "
              f"{best.measured_us:>9.1f} {kt.pick_ratio or float('nan'):>9.2f} {kt.spearman:>9.2f}")
    good, total = report.picks_within()
    print(f"  picks within 10% of the best measured: {good}/{total}; Spearman over all measured "
          f"candidates {report.spearman:.3f} (per-kernel mean {report.mean_spearman:.3f})")
    data, stats = fit_profile(report, report.profile)
    print(f"  fitted profile: msle {stats['msle_before']:.3f} -> {stats['msle_after']:.3f}, Spearman "
          f"{stats['spearman_before']:.3f} -> {stats['spearman_after']:.3f}, picks within 10% "
          f"{stats['picks_within_10pct_before']:.2f} -> {stats['picks_within_10pct_after']:.2f}")
    print("  fields: " + ", ".join(f"{f} {a:g}->{b:g}" for f, (a, b) in stats["fields"].items() if a != b))
    if fitted:
        fitted.write_text(json.dumps(data, indent=2) + "\n")
        print(f"  wrote {fitted}")


def parse_shape(text: str) -> tuple[int, int, int]:
    """'MxKxN' -> (M, K, N); ValueError unless three positive integers."""
    parts = text.lower().split("x")
    if len(parts) != 3 or not all(p.strip().isdigit() and int(p) > 0 for p in parts):
        raise ValueError(f"shape {text!r}: expected MxKxN, e.g. 7x100x257")
    m, k, n = (int(p) for p in parts)
    return m, k, n


def parse_pins(items: list[str]) -> dict[str, str]:
    """['KEY=VALUE', ...] -> {KEY: VALUE}, as `aicfc compile --pin` takes them (aicfc.driver.parse_pins;
    a bad item is a ValueError here, for argparse)."""
    from aicfc.driver import parse_pins as compile_pins
    from aicfc.errors import AicfError
    try:
        return compile_pins(items)
    except AicfError as e:
        raise ValueError(str(e)) from None


def variants(pin: dict[str, str], compare_units: bool, precision: str) -> list[tuple[str, dict[str, str]]]:
    """The aicf schedules to run for one shape: (label, pin). The planner's pick under `pin`;
    with `compare_units` also unit=mma (tensor-core mma.sync) under the same pin, unless the
    first already is, or the precision has no tensor-core GEMM (fp32)."""
    label = " ".join(f"{a}={b}" for a, b in sorted(pin.items())) or "planner"
    out = [(label, dict(pin))]
    if compare_units and precision != "fp32" and pin.get("unit") != "mma":
        out.append(("unit=mma", {**pin, "unit": "mma"}))
    return out


def rel_err(y, ref) -> float:
    """max|y - ref| / max|ref| in float64; NaN if y has a NaN (and so never passes)."""
    ref = np.asarray(ref, dtype=np.float64)
    diff = np.abs(np.asarray(y, dtype=np.float64) - ref)
    if diff.size == 0:
        return 0.0
    if np.isnan(diff).any():
        return float("nan")
    scale = float(np.abs(ref).max())
    return float(diff.max() / scale) if scale > 0 else float(diff.max())


def passes(err: float, precision: str) -> bool:
    return bool(err <= RTOL[precision])   # False for NaN


def operands(m: int, k: int, n: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(m + k + n)
    x = rng.standard_normal((m, k), dtype=np.float32)
    w = (rng.standard_normal((k, n), dtype=np.float32) / np.float32(math.sqrt(k))).astype(np.float32)
    return x, w


def torch_side(m: int, k: int, n: int, precision: str, x: np.ndarray, w: np.ndarray,
               per_max: int, reps: int) -> dict:
    """cuBLAS: the float64 reference, torch's own error, a rough single-call time, and the
    graph-of-PER time; PER is returned for the aicf side to use too."""
    import torch
    torch.backends.cuda.matmul.allow_tf32 = precision == "tf32"
    dt = getattr(torch, TORCH_DTYPE[precision])
    xt, wt = torch.from_numpy(x).cuda().to(dt), torch.from_numpy(w).cuda().to(dt)
    ref = torch.matmul(xt.double(), wt.double()).cpu().numpy()
    yt = torch.matmul(xt, wt).float().cpu().numpy()
    rough = median_us(lambda: torch.matmul(xt, wt), torch.cuda.synchronize,
                      lambda: torch.cuda.Event(enable_timing=True), reps=5, warmup=2)
    per = replays_for(rough, per_max)
    c = torch.empty((m, n), dtype=dt, device="cuda")
    t = torch_graph_us(lambda: torch.matmul(xt, wt, out=c), per, reps)
    err_graph = rel_err(c.float().cpu().numpy(), ref)   # the graph's output, for what it is worth
    return {"ref": ref, "torch_us": t, "torch_err": rel_err(yt, ref), "torch_graph_err": err_graph,
            "per": per, "torch_single_us": rough,
            "again": lambda: torch_graph_us(lambda: torch.matmul(xt, wt, out=c), per, reps),
            "fn": lambda: torch.matmul(xt, wt, out=c)}


def aicf_side(dev, payload: dict, x: np.ndarray, per: int, reps: int,
              torch_again=None, rounds: int = 1, paired=None) -> tuple[np.ndarray, list[float], float, list[float]]:
    """aicf: (output of one run, graph-of-PER times, host-launched launch() time, cuBLAS times).
    With `rounds` > 1 the two sides' graph timings alternate (aicf, cuBLAS, aicf, ...), so that
    clock and temperature drift reach both alike (4096^3 fp16 moved 0.85-0.97x between runs).
    With `paired` (cuBLAS's call) the two graphs alternate replay by replay instead
    (timing.paired_graphs_us): the times returned are the `reps` pairs'."""
    from aicf_run.bundle import Bundle
    from aicf_run.executor import Executor
    ex = Executor(Bundle.from_payload(payload), dev)
    try:
        y = ex.run({"x": x})["y"]
        if paired is not None:
            ours, theirs = paired_graphs_us(ex, paired, per, reps)
            return y, ours, aicf_launches_us(ex, per, reps), theirs
        ours, theirs = [aicf_graph_us(ex, per, reps)], []
        for _ in range(rounds - 1):
            theirs.append(torch_again())
            ours.append(aicf_graph_us(ex, per, reps))
        return y, ours, aicf_launches_us(ex, per, reps), theirs
    finally:
        ex.close()


def bench_shape(dev, m: int, k: int, n: int, precision: str, pin: dict, compare_units: bool,
                per_max: int = PER_REPLAY, reps: int = REPS, rounds: int = 1, paired: bool = False) -> list[dict]:
    """One row per aicf variant (see `variants`), against the same cuBLAS timing; with `rounds` > 1,
    both sides timed `rounds` times alternately, the medians compared (`ratio_lo`/`ratio_hi`: the
    rounds' extremes of cuBLAS / aicf, each round against the cuBLAS timing just before it). With
    `paired`, both sides' graphs replayed in turn `reps` times (timing.paired_us): the ratio is the
    median of the pairs' cuBLAS / aicf, `ratio_lo`/`ratio_hi` their quartiles."""
    x, w = operands(m, k, n)
    import torch
    tside = torch_side(m, k, n, precision, x, w, per_max, reps)
    ref, per, again, fn = tside.pop("ref"), tside["per"], tside.pop("again"), tside.pop("fn")
    if rounds == 1 and not paired:
        again = None
        torch.cuda.empty_cache()   # torch_side's tensors are gone; the aicf side gets the memory
    flops = 2.0 * m * n * k
    rows = []
    for label, vpin in variants(pin, compare_units, precision):
        row = {"shape": [m, k, n], "precision": precision, "variant": label, "pin": vpin,
               "per_replay": per, "reps": reps, **tside,
               "torch_tflops": flops / tside["torch_us"] / 1e6, "rtol": RTOL[precision]}
        try:
            payload = aicfc.compile(matmul_model(m, k, n, w), target=dev.arch, precision=precision,
                                    pin=vpin or None)
            kerns = payload["kernels"]
            y, ours, t_launch, theirs = aicf_side(dev, payload, x, per, reps, again, rounds, fn if paired else None)
        except Exception as e:   # one variant's failure is a row, not the end
            row.update(error=f"{type(e).__name__}: {' '.join(str(e).split())[:300]}", ok=False)
            rows.append(row)
            continue
        err = rel_err(y, ref)
        t_aicf = float(np.median(ours))
        if paired:
            row.update(paired_ratio(theirs, ours), torch_us=float(np.median(theirs)), paired=len(ours))
            row["torch_tflops"] = flops / row["torch_us"] / 1e6
        elif theirs:
            ratios = [tside["torch_us"] / ours[0]] + [t / o for t, o in zip(theirs, ours[1:])]
            row.update(torch_us=float(np.median([tside["torch_us"]] + theirs)), rounds=rounds,
                       ratio_lo=min(ratios), ratio_hi=max(ratios))
            row["torch_tflops"] = flops / row["torch_us"] / 1e6
        row.update({"aicf_us": t_aicf, "aicf_launch_us": t_launch, "aicf_tflops": flops / t_aicf / 1e6,
                    "ratio": row.get("ratio", row["torch_us"] / t_aicf), "aicf_err": err,
                    "ok": passes(err, precision), "torch_ok": passes(tside["torch_err"], precision),
                    "kernels": len(kerns),
                    "predicted_us": sum(kk["predicted"]["time_us"] for kk in kerns),
                    "params": kerns[0]["params"] if len(kerns) == 1 else [kk["params"] for kk in kerns]})
        rows.append(row)
    return rows


def paired_ratio(theirs: list[float], ours: list[float]) -> dict:
    """cuBLAS / aicf of each pair of replays timed in turn: the median ("ratio") and the quartiles
    ("ratio_lo", "ratio_hi")."""
    r = sorted(t / o for t, o in zip(theirs, ours))
    q = np.quantile(r, [0.25, 0.5, 0.75])
    return {"ratio": float(q[1]), "ratio_lo": float(q[0]), "ratio_hi": float(q[2])}


HEADER = (f"{'precision':<9} {'M x K x N':<16} {'aicf':<12} {'aicf us':>9} {'launch us':>9} {'cuBLAS us':>9} "
          f"{'aicf TF/s':>9} {'cuBLAS TF/s':>11} {'ratio':>6} {'pred us':>8} {'err':>8} {'cuBLAS err':>10} "
          f"{'per':>3}  schedule")


def format_row(r: dict) -> str:
    m, k, n = r["shape"]
    head = f"{r['precision']:<9} {f'{m}x{k}x{n}':<16} {r['variant'][:12]:<12}"
    if "error" in r:
        return f"{head} FAILED {r['error']}"
    params = r["params"] if isinstance(r["params"], dict) else r["params"][0]
    sched = " ".join(f"{a}={b}" for a, b in sorted(params.items()))
    if r["kernels"] > 1:
        sched += f" (+{r['kernels'] - 1} more kernels)"
    return (f"{head} {r['aicf_us']:>9.2f} {r['aicf_launch_us']:>9.2f} {r['torch_us']:>9.2f} "
            f"{r['aicf_tflops']:>9.1f} {r['torch_tflops']:>11.1f} {r['ratio']:>6.2f} "
            f"{r['predicted_us']:>8.1f} {r['aicf_err']:>8.1e} {r['torch_err']:>10.1e} {r['per_replay']:>3}  "
            f"{sched}{'' if r['ok'] else '  FAIL'}"
            + (f"  [{r['rounds']} rounds: {r['ratio_lo']:.2f}-{r['ratio_hi']:.2f}]" if "rounds" in r else "")
            + (f"  [{r['paired']} pairs, quartiles {r['ratio_lo']:.2f}-{r['ratio_hi']:.2f}]" if "paired" in r else ""))


def geomean(values: list[float]) -> float:
    return math.exp(sum(map(math.log, values)) / len(values)) if values else float("nan")


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--precision", action="append", choices=PRECISIONS)
    ap.add_argument("--quick", action="store_true", help="4096^3 and the BERT shapes only")
    ap.add_argument("--edge", action="store_true", help="the edge shapes " +
                    ", ".join(f"{m}x{k}x{n}" for m, k, n in EDGE) + " instead")
    ap.add_argument("--json", type=Path, help="also write the rows as JSON")
    ap.add_argument("--shape", action="append", help="MxKxN instead of the standard shapes (repeatable)")
    ap.add_argument("--pin", action="append", default=[], metavar="KEY=VALUE",
                    help="passed to aicfc as `aicfc compile --pin` (repeatable), e.g. unit=mma, unit=wgmma")
    ap.add_argument("--compare-units", action="store_true",
                    help="run every shape both as the planner picks (under --pin) and pinned to unit=mma")
    ap.add_argument("--paired", action="store_true", help="replay both sides' graphs in turn, pair by pair "
                    "(--reps pairs); the ratio is the median of the pairs' (timing.paired_us)")
    ap.add_argument("--rounds", type=int, default=1, help="time both sides this many times, alternating "
                    "(clock drift reaches both alike); medians compared, the rounds' range printed")
    ap.add_argument("--reps", type=int, default=REPS, help=f"graph replays timed per side (median; {REPS})")
    ap.add_argument("--per-replay", type=int, default=PER_REPLAY,
                    help=f"most back-to-back calls captured per graph ({PER_REPLAY})")
    ap.add_argument("--tune", action="store_true", help="measure the cost model's candidates instead")
    ap.add_argument("--fitted-profile", type=Path, help="with --tune: write the fitted profile here "
                    "(one file per precision: PATH with the precision before the suffix)")
    ap.add_argument("--top", type=int, default=8, help="with --tune: measure the model's first TOP candidates")
    ap.add_argument("--spread", type=int, default=8, help="with --tune: and SPREAD more through the ranking")
    ap.add_argument("--report-json", type=Path, help="with --tune: write every measured candidate here "
                    "(one file per precision, named as --fitted-profile)")
    return ap


def select_shapes(args) -> list[tuple[int, int, int]]:
    if args.shape:
        return [parse_shape(s) for s in args.shape]
    if args.edge:
        return list(EDGE)
    return ([(4096,) * 3] if args.quick else SQUARE) + BERT


def main(argv: list[str] | None = None) -> int:
    ap = build_parser()
    args = ap.parse_args(argv)
    try:
        shapes = select_shapes(args)
        pin = parse_pins(args.pin)
    except ValueError as e:
        ap.error(str(e))
    if args.reps < 1 or args.per_replay < 1 or args.rounds < 1:
        ap.error("--reps, --per-replay and --rounds must be >= 1")
    if args.paired and args.rounds > 1:
        ap.error("--paired and --rounds are two ways to alternate the sides; give one")
    from aicf_run.device import open_device
    dev = open_device(0)
    gpu = dev.name
    print(f"GPU: {dev.name} ({dev.arch})")
    if args.tune:
        for precision in args.precision or PRECISIONS:
            out, rep = args.fitted_profile, args.report_json
            tune_shapes(dev, shapes, precision, out.with_name(f"{out.stem}_{precision}{out.suffix}") if out else None,
                        args.top, args.spread, rep.with_name(f"{rep.stem}_{precision}{rep.suffix}") if rep else None)
        dev.close()
        return 0
    import torch
    print(f"torch {torch.__version__}; both sides: back-to-back calls in one CUDA graph, CUDA events per replay, "
          f"median of {args.reps}; `per` calls per replay; ratio = cuBLAS us / aicf us"
          + ("; the sides' replays in turn, ratio = the median of the pairs'" if args.paired else "")
          + (f"; pin {pin}" if pin else ""))
    print(HEADER, flush=True)
    rows: list[dict] = []
    for precision in args.precision or PRECISIONS:
        for m, k, n in shapes:
            try:
                new = bench_shape(dev, m, k, n, precision, pin, args.compare_units, args.per_replay, args.reps,
                                  args.rounds, args.paired)
            except Exception as e:   # the torch side failed: a row, not the end
                new = [{"shape": [m, k, n], "precision": precision, "variant": "-", "ok": False,
                        "error": f"{type(e).__name__}: {' '.join(str(e).split())[:300]}"}]
            for r in new:
                print(format_row(r), flush=True)
            rows += new
            if args.json:   # after every shape: a crash keeps what was measured
                write_json(args.json, gpu, rows, args)
        for label in dict.fromkeys(r["variant"] for r in rows if r["precision"] == precision):
            bert = [r["ratio"] for r in rows if r["precision"] == precision and r["variant"] == label
                    and "ratio" in r and tuple(r["shape"]) in BERT]
            if bert:
                print(f"{precision} {label}: BERT-shape geometric mean cuBLAS/aicf = {geomean(bert):.2f}", flush=True)
    dev.close()
    if args.json:
        write_json(args.json, gpu, rows, args)
    bad = [r for r in rows if not r.get("ok")]
    if bad:
        print(f"FAILURES: {len(bad)} of {len(rows)} rows (errors over RTOL, NaN, or a run that failed)")
        return 1
    return 0


def write_json(path: Path, gpu: str, rows: list[dict], args) -> None:
    import torch
    path.write_text(json.dumps({"gpu": gpu, "torch": torch.__version__, "rtol": RTOL, "reps": args.reps,
                                "timing": "graph of `per_replay` back-to-back calls, CUDA events per replay, "
                                          "median of `reps`, / per_replay (both sides)",
                                "rows": rows}, indent=1, default=str))


if __name__ == "__main__":
    sys.exit(main())
