"""aicfc's GEMM against torch.matmul (cuBLAS) on the same GPU, in the same process.

    source .gpu/env.sh && python3 benchmarks/gemm.py [--precision fp16 ...] [--quick] [--json F]

For every shape and precision: an ONNX MatMul y = x @ w is compiled by aicfc (the cost model
picks the schedule), loaded by aicf_run, and its launch timed with CUDA events (median of
REPS after warm-up; inputs already on the device). torch.matmul runs on tensors of the same
dtype (tf32: allow_tf32 on; fp32: off). Both outputs are checked against a float64 product.
Printed: TFLOP/s of both and aicf/cuBLAS; the geometric mean over the BERT-base shapes.
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
from benchmarks.timing import median_us  # noqa: E402

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


def bench_one(dev, m: int, k: int, n: int, precision: str, pin: dict | None = None) -> dict:
    import pycuda.driver as cuda
    import torch
    from aicf_run.bundle import Bundle
    from aicf_run.executor import Executor
    rng = np.random.default_rng(m + k + n)
    x = rng.standard_normal((m, k)).astype(np.float32)
    w = (rng.standard_normal((k, n)) / math.sqrt(k)).astype(np.float32)
    payload = aicfc.compile(matmul_model(m, k, n, w), target=dev.arch, precision=precision, pin=pin)
    (kern,) = payload["kernels"]
    ex = Executor(Bundle.from_payload(payload), dev)
    try:
        y = ex.run({"x": x})["y"]
        t_aicf = median_us(ex.launch, dev.context.synchronize, cuda.Event, REPS)
    finally:
        ex.close()
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
    args = ap.parse_args(argv)
    from aicf_run.device import open_device
    dev = open_device(0)
    shapes = ([(4096,) * 3] if args.quick else SQUARE) + BERT
    if args.shape:
        shapes = [tuple(int(d) for d in s.split("x")) for s in args.shape]
    pin = dict(item.split("=", 1) for item in args.pin)
    rows = []
    print(f"GPU: {dev.name} ({dev.arch})")
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
