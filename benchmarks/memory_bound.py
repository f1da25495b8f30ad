"""Memory-bound kernels against the GPU's copy bandwidth and torch, in the same process.

    source .gpu/env.sh && python3 benchmarks/memory_bound.py [--quick] [--precision fp16 ...]
        [--case layernorm ...] [--pin KEY=VALUE ...] [--json F]
    source .gpu/env.sh && python3 benchmarks/memory_bound.py --tune [--quick] ...

Cases, each an ONNX model of one input x [M, N] (65536 x 4096; --quick: 8192 x 4096):
LayerNormalization over the last axis (opset 17, scale and bias), Softmax over the last axis,
and a GELU-bias chain (u = x + b, u · (erf(u / √2) + 1) · 0.5, node for node as torch exports
it). Each is compiled by aicfc at fp16 and fp32 (`aicfc.compile(model, precision=...)`; the cost
model picks the schedules), loaded with `Bundle.from_payload` + `Executor`, run once on random
normal inputs (the bundle's interface is float32; the executor converts), then the whole plan
is timed with CUDA events around `Executor.launch()` (inputs already on the device, so no
conversion or copy is timed): median of REPS after warm-up. Inputs are far larger than L2.

In the same process: the device-to-device copy bandwidth (torch `dst.copy_(src)` of COPY_BYTES,
bytes read + written / time) and torch's equivalent at the same dtype (F.layer_norm,
torch.softmax, F.gelu(x + b): eager, two kernels for the last), timed the same way. Printed
per case: achieved TB/s (bytes = inputs read once + outputs written once), % of the copy
bandwidth, torch's TB/s, aicf / torch speed ratio, the predicted time, and the error against a
float64 torch reference (max|y - ref| / max|ref|; must be <= 1e-4 at fp32, <= 1e-2 at fp16).

--tune: `aicfc tune` on each case instead: the cost model's candidates measured (its top ones
and a spread through the rest of its ranking, the other `pass` variants included), with how
far its pick is from the fastest measured candidate.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import aicfc  # noqa: E402
from benchmarks.timing import median_us, run_and_time  # noqa: E402

SHAPE, QUICK_SHAPE = (65536, 4096), (8192, 4096)
CASES = ("layernorm", "softmax", "gelu_bias")
PRECISIONS = ("fp16", "fp32")
TORCH_DTYPE = {"fp16": "float16", "fp32": "float32"}
TOLERANCE = {"fp16": 1e-2, "fp32": 1e-4}
EPS = 1e-5
REPS = 30
COPY_BYTES = 1 << 30


def _model(nodes: list, n: int, inits: dict[str, np.ndarray], name: str, m: int) -> onnx.ModelProto:
    g = helper.make_graph(nodes, name, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [m, n])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [m, n])],
                          [numpy_helper.from_array(np.asarray(a, dtype=np.float32), k) for k, a in inits.items()])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def build(case: str, m: int, n: int, rng: np.random.Generator) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """The ONNX model of a case and its constants (for the torch side)."""
    mk = helper.make_node
    if case == "layernorm":
        c = {"scale": 1 + 0.1 * rng.standard_normal(n), "bias": 0.1 * rng.standard_normal(n)}
        return _model([mk("LayerNormalization", ["x", "scale", "bias"], ["y"], axis=-1, epsilon=EPS)], n, c, case, m), c
    if case == "softmax":
        return _model([mk("Softmax", ["x"], ["y"], axis=-1)], n, {}, case, m), {}
    c = {"b": 0.1 * rng.standard_normal(n), "sqrt2": np.sqrt(2.0), "one": 1.0, "half": 0.5}
    nodes = [mk("Add", ["x", "b"], ["u"]), mk("Div", ["u", "sqrt2"], ["ud"]), mk("Erf", ["ud"], ["ue"]),
             mk("Add", ["ue", "one"], ["ua"]), mk("Mul", ["u", "ua"], ["um"]), mk("Mul", ["um", "half"], ["y"])]
    return _model(nodes, n, c, case, m), c


def torch_fn(case: str, consts: dict[str, np.ndarray], dtype):
    """torch's equivalent of a case on tensors of `dtype` (on the GPU)."""
    import torch
    import torch.nn.functional as F
    c = {k: torch.tensor(np.asarray(v), dtype=dtype, device="cuda") for k, v in consts.items()}
    if case == "layernorm":
        return lambda x: F.layer_norm(x, (x.shape[-1],), c["scale"], c["bias"], EPS)
    if case == "softmax":
        return lambda x: torch.softmax(x, dim=-1)
    return lambda x: F.gelu(x + c["b"])


def moved_bytes(case: str, m: int, n: int, itemsize: int) -> int:
    """Inputs read once and outputs written once (the row's constants included)."""
    params = {"layernorm": 2 * n, "softmax": 0, "gelu_bias": n}[case]
    return (2 * m * n + params) * itemsize


def copy_bandwidth(warmup_s: float = 0.0) -> float:
    """Device-to-device copy bandwidth, bytes read + written per second (TB/s), after copying
    for `warmup_s` seconds first (an idle GPU starts at low clocks)."""
    import time
    import torch
    src = torch.randn(COPY_BYTES // 4, device="cuda")
    dst = torch.empty_like(src)
    end = time.perf_counter() + warmup_s
    while time.perf_counter() < end:
        dst.copy_(src)
        torch.cuda.synchronize()
    t = median_us(lambda: dst.copy_(src), torch.cuda.synchronize, lambda: torch.cuda.Event(enable_timing=True),
                  REPS, warmup=20)
    del src, dst
    torch.cuda.empty_cache()
    return 2 * COPY_BYTES / t / 1e6


def bench_one(dev, case: str, precision: str, m: int, n: int, pin: dict) -> dict:
    import torch
    rng = np.random.default_rng(sum(map(ord, case)))
    model, consts = build(case, m, n, rng)
    payload = aicfc.compile(model, target=dev.arch, precision=precision, pin=pin or None)
    x = rng.standard_normal((m, n), dtype=np.float32)
    outputs, t_aicf = run_and_time(payload, dev, {"x": x}, REPS)
    y = outputs["y"]
    dtype = getattr(torch, TORCH_DTYPE[precision])
    xt = torch.from_numpy(x).cuda()
    fn = torch_fn(case, consts, dtype)
    xd = xt.to(dtype)
    t_torch = median_us(lambda: fn(xd), torch.cuda.synchronize, lambda: torch.cuda.Event(enable_timing=True), REPS)
    ref = torch_fn(case, consts, torch.float64)(xt.double())
    err = float((torch.from_numpy(y).cuda().double() - ref).abs().max() / ref.abs().max())
    torch_err = float((fn(xd).double() - ref).abs().max() / ref.abs().max())
    del xt, xd, ref
    torch.cuda.empty_cache()
    nbytes = moved_bytes(case, m, n, 2 if precision == "fp16" else 4)
    kernels = payload["kernels"]
    return {"case": case, "precision": precision, "shape": [m, n], "aicf_us": t_aicf, "torch_us": t_torch,
            "bytes": nbytes, "aicf_tbs": nbytes / t_aicf / 1e6, "torch_tbs": nbytes / t_torch / 1e6,
            "speedup": t_torch / t_aicf, "err": err, "torch_err": torch_err, "ok": err <= TOLERANCE[precision],
            "predicted_us": sum(k["predicted"]["time_us"] for k in kernels),
            "kernels": [{"family": k["family"], "params": k["params"], "registers": k["registers"]} for k in kernels]}


def tune(dev, cases: list[str], precisions: list[str], m: int, n: int) -> None:
    from aicfc.tune import tune_model
    for case in cases:
        model, _ = build(case, m, n, np.random.default_rng(0))
        for precision in precisions:
            report = tune_model(model, precision=precision, device=dev)
            for kt in report.kernels:
                print(f"{case} {precision} {kt.name} {kt.family}: {len(kt.measured)} measured of {kt.feasible}, "
                      f"pick/best {kt.pick_ratio or float('nan'):.2f}, Spearman {kt.spearman:.2f}")
                for c in sorted(kt.measured, key=lambda c: c.measured_us):
                    params = " ".join(f"{a}={b}" for a, b in sorted(c.params.items()))
                    print(f"    rank {c.rank:>3} {params:<40} predicted {c.predicted_us:>9.1f} us  "
                          f"measured {c.measured_us:>9.1f} us  regs {c.registers}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help=f"{QUICK_SHAPE[0]}x{QUICK_SHAPE[1]} instead of "
                    f"{SHAPE[0]}x{SHAPE[1]}")
    ap.add_argument("--case", action="append", choices=CASES)
    ap.add_argument("--precision", action="append", choices=PRECISIONS)
    ap.add_argument("--pin", action="append", default=[], help="KEY=VALUE passed to aicfc (experiments)")
    ap.add_argument("--tune", action="store_true", help="measure the cost model's candidates instead")
    ap.add_argument("--json", type=Path, help="also write the rows as JSON")
    args = ap.parse_args(argv)
    from aicf_run.device import open_device
    dev = open_device(0)
    m, n = QUICK_SHAPE if args.quick else SHAPE
    cases, precisions = args.case or list(CASES), args.precision or list(PRECISIONS)
    print(f"GPU: {dev.name} ({dev.arch}); shape {m}x{n}")
    if args.tune:
        tune(dev, cases, precisions, m, n)
        dev.close()
        return 0
    # The copy is measured before and after the cases, and the faster taken: a first
    # measurement has been seen at 2.7 TB/s where the same process later measured 4.2.
    first = copy_bandwidth(warmup_s=2.0)
    pin = dict(item.split("=", 1) for item in args.pin)
    rows = []
    for precision in precisions:
        for case in cases:
            rows.append(bench_one(dev, case, precision, m, n, pin))
            print(f"  measured {case} {precision}: {rows[-1]['aicf_us']:.1f} us", flush=True)
    last = copy_bandwidth(warmup_s=1.0)
    copy = max(first, last)
    print(f"device-to-device copy: {copy:.2f} TB/s (read + write; {first:.2f} before the cases, {last:.2f} after)")
    print(f"{'case':<10} {'prec':<5} {'aicf us':>9} {'TB/s':>6} {'% copy':>7} {'torch us':>9} {'TB/s':>6} "
          f"{'% copy':>7} {'aicf/torch':>10} {'pred us':>8} {'err':>8}  schedule")
    for r in rows:
        r["copy_tbs"] = copy
        sched = "; ".join(f"{k['family']} " + " ".join(f"{a}={b}" for a, b in sorted(k["params"].items()))
                          for k in r["kernels"])
        print(f"{r['case']:<10} {r['precision']:<5} {r['aicf_us']:>9.1f} {r['aicf_tbs']:>6.2f} "
              f"{100 * r['aicf_tbs'] / copy:>6.1f}% {r['torch_us']:>9.1f} {r['torch_tbs']:>6.2f} "
              f"{100 * r['torch_tbs'] / copy:>6.1f}% {r['speedup']:>10.2f} {r['predicted_us']:>8.1f} "
              f"{r['err']:>8.1e}{'' if r['ok'] else ' FAIL'}  {sched}")
    dev.close()
    if args.json:
        args.json.write_text(json.dumps({"gpu": dev.name, "copy_tbs": copy, "copy_tbs_before": first,
                                         "copy_tbs_after": last, "rows": rows}, indent=1))
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
