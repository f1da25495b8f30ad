"""aicfc's GEMM against torch.matmul (cuBLAS) on the same GPU, in the same process.

    source .gpu/env.sh && python3 benchmarks/gemm.py [--precision fp16 ...] [--quick] [--json F]
    source .gpu/env.sh && python3 benchmarks/gemm.py --tune [--fitted-profile F] ...

For every shape and precision: an ONNX MatMul y = x @ w is compiled by aicfc (the cost model
picks the schedule), loaded by aicf_run, and its launch timed with CUDA events (median of
REPS after warm-up; inputs already on the device). torch.matmul runs on tensors of the same
dtype (tf32: allow_tf32 on; fp32: off). Both outputs are checked against a float64 product.
Printed: TFLOP/s of both and aicf/cuBLAS; the geometric mean over the BERT-base shapes.

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
from benchmarks.timing import median_us, run_and_time  # noqa: E402

SQUARE = [(n, n, n) for n in (1024, 2048, 4096, 8192)]
BERT = [(m, k, n) for m in (128, 4096) for k, n in ((768, 768), (768, 3072), (3072, 768))]
PRECISIONS = ("fp16", "bf16", "tf32", "fp32")
TORCH_DTYPE = {"fp16": "float16", "bf16": "bfloat16", "tf32": "float32", "fp32": "float32"}
REPS = 50


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


def bench_one(dev, m: int, k: int, n: int, precision: str, pin: dict | None = None) -> dict:
    import torch
    rng = np.random.default_rng(m + k + n)
    x = rng.standard_normal((m, k)).astype(np.float32)
    w = (rng.standard_normal((k, n)) / math.sqrt(k)).astype(np.float32)
    payload = aicfc.compile(matmul_model(m, k, n, w), target=dev.arch, precision=precision, pin=pin)
    (kern,) = payload["kernels"]
    outputs, t_aicf = run_and_time(payload, dev, {"x": x}, REPS)
    y = outputs["y"]
    torch.backends.cuda.matmul.allow_tf32 = precision == "tf32"
    dt = getattr(torch, TORCH_DTYPE[precision])
    xt, wt = torch.from_numpy(x).cuda().to(dt), torch.from_numpy(w).cuda().to(dt)
    yt = torch.matmul(xt, wt)
    t_torch = median_us(lambda: torch.matmul(xt, wt), torch.cuda.synchronize,
                        lambda: torch.cuda.Event(enable_timing=True), REPS)
    ref = torch.matmul(xt.double(), wt.double()).cpu().numpy()
    scale = np.abs(ref).max()
    flops = 2.0 * m * n * k
    return {"shape": [m, k, n], "precision": precision, "aicf_us": t_aicf, "torch_us": t_torch,
            "aicf_tflops": flops / t_aicf / 1e6, "torch_tflops": flops / t_torch / 1e6,
            "ratio": t_torch / t_aicf, "aicf_err": float(np.abs(y - ref).max() / scale),
            "torch_err": float(np.abs(yt.float().cpu().numpy() - ref).max() / scale),
            "predicted_us": kern["predicted"]["time_us"], "params": kern["params"]}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--precision", action="append", choices=PRECISIONS)
    ap.add_argument("--quick", action="store_true", help="4096^3 and the BERT shapes only")
    ap.add_argument("--json", type=Path, help="also write the rows as JSON")
    ap.add_argument("--shape", action="append", help="MxKxN instead of the standard shapes")
    ap.add_argument("--pin", action="append", default=[], help="KEY=VALUE passed to aicfc (experiments)")
    ap.add_argument("--tune", action="store_true", help="measure the cost model's candidates instead")
    ap.add_argument("--fitted-profile", type=Path, help="with --tune: write the fitted profile here "
                    "(one file per precision: PATH with the precision before the suffix)")
    ap.add_argument("--top", type=int, default=8, help="with --tune: measure the model's first TOP candidates")
    ap.add_argument("--spread", type=int, default=8, help="with --tune: and SPREAD more through the ranking")
    ap.add_argument("--report-json", type=Path, help="with --tune: write every measured candidate here "
                    "(one file per precision, named as --fitted-profile)")
    args = ap.parse_args(argv)
    from aicf_run.device import open_device
    dev = open_device(0)
    shapes = ([(4096,) * 3] if args.quick else SQUARE) + BERT
    if args.shape:
        shapes = [tuple(int(d) for d in s.split("x")) for s in args.shape]
    pin = dict(item.split("=", 1) for item in args.pin)
    rows = []
    print(f"GPU: {dev.name} ({dev.arch})")
    if args.tune:
        for precision in args.precision or PRECISIONS:
            out, rep = args.fitted_profile, args.report_json
            tune_shapes(dev, shapes, precision, out.with_name(f"{out.stem}_{precision}{out.suffix}") if out else None,
                        args.top, args.spread, rep.with_name(f"{rep.stem}_{precision}{rep.suffix}") if rep else None)
        dev.close()
        return
    print(f"{'precision':<9} {'M x K x N':<18} {'aicf us':>9} {'cuBLAS us':>10} {'aicf TF/s':>10} "
          f"{'cuBLAS TF/s':>12} {'ratio':>6} {'pred us':>8} {'err':>8}  schedule")
    for precision in args.precision or PRECISIONS:
        for m, k, n in shapes:
            r = bench_one(dev, m, k, n, precision, pin)
            rows.append(r)
            sched = " ".join(f"{a}={b}" for a, b in sorted(r["params"].items()))
            print(f"{precision:<9} {f'{m}x{k}x{n}':<18} {r['aicf_us']:>9.1f} {r['torch_us']:>10.1f} "
                  f"{r['aicf_tflops']:>10.1f} {r['torch_tflops']:>12.1f} {r['ratio']:>6.2f} "
                  f"{r['predicted_us']:>8.1f} {r['aicf_err']:>8.1e}  {sched}", flush=True)
        bert = [r["ratio"] for r in rows if r["precision"] == precision and tuple(r["shape"]) in BERT]
        if bert:
                print(f"{precision}: BERT-shape geometric mean aicf/cuBLAS = "
                  f"{math.exp(sum(map(math.log, bert)) / len(bert)):.2f}", flush=True)
    dev.close()
    if args.json:
        args.json.write_text(json.dumps({"gpu": dev.name, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
