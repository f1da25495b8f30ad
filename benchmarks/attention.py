"""aicfc's streaming attention against torch's scaled_dot_product_attention, same GPU, same process.

    source .gpu/env.sh && python3 benchmarks/attention.py [--quick] [--json F] [--precision fp16]

For every shape (B, H, S, D): an ONNX attention y = Softmax(q @ kᵀ · D^-½ (+ a constant causal
mask)) @ v on float32 inputs q, k, v [B,H,S,D] (the form torch.onnx exports) is compiled by
aicfc under the precision policy (the rule "softmax(q@kᵀ·s)@v => streaming_attention" makes it
one kernel; the cost model picks its schedule), loaded by aicf_run, and its launch timed with
CUDA events (median of REPS after warm-up; inputs already on the device).
torch.nn.functional.scaled_dot_product_attention runs on fp16 (bf16) tensors, is_causal for
the causal shapes. Both outputs are checked against SDPA in float32: max|y - ref| / max|ref|
<= 1e-2. Printed: TFLOP/s of both (4·B·H·S²·D, halved for causal) and aicf/SDPA.
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

# (B, H, S, D, causal)
SHAPES = [(8, 12, 512, 64, False), (4, 16, 2048, 128, False), (4, 16, 2048, 128, True), (2, 3, 45, 40, False)]
QUICK = [(8, 12, 512, 64, False), (4, 16, 2048, 128, False)]
TORCH_DTYPE = {"fp16": "float16", "bf16": "bfloat16"}
REPS = 30
TOL = 1e-2


def attention_model(b: int, h: int, s: int, d: int, causal: bool) -> onnx.ModelProto:
    """MatMul(q, Transpose(k)) → Mul scale → (Add causal mask) → Softmax(-1) → MatMul v."""
    n = helper.make_node
    inits = {"scale": np.array(1.0 / math.sqrt(d), dtype=np.float32)}
    nodes = [n("Transpose", ["k"], ["k_t"], name="k_transpose", perm=[0, 1, 3, 2]),
             n("MatMul", ["q", "k_t"], ["scores_raw"], name="scores_matmul"),
             n("Mul", ["scores_raw", "scale"], ["scores"], name="scale_mul")]
    logits = "scores"
    if causal:
        # as torch builds it: the dtype's lowest value above the diagonal
        inits["causal_mask"] = np.triu(np.full((s, s), np.finfo(np.float32).min, dtype=np.float32), k=1)
        nodes.append(n("Add", ["scores", "causal_mask"], ["masked"], name="mask_add"))
        logits = "masked"
    nodes += [n("Softmax", [logits], ["probs"], name="softmax", axis=-1),
              n("MatMul", ["probs", "v"], ["y"], name="pv_matmul")]
    g = helper.make_graph(nodes, f"attn{b}x{h}x{s}x{d}{'c' if causal else ''}",
                          [helper.make_tensor_value_info(x, TensorProto.FLOAT, [b, h, s, d]) for x in "qkv"],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [b, h, s, d])],
                          [numpy_helper.from_array(a, name) for name, a in inits.items()])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def bench_one(dev, b: int, h: int, s: int, d: int, causal: bool, precision: str, pin: dict | None = None) -> dict:
    import torch
    import torch.nn.functional as F
    rng = np.random.default_rng(b * h + s + d)
    q, k, v = (rng.standard_normal((b, h, s, d)).astype(np.float32) for _ in range(3))
    payload = aicfc.compile(attention_model(b, h, s, d, causal), target=dev.arch, precision=precision, pin=pin)
    kern = [x for x in payload["kernels"] if x["family"] == "attention"]
    outputs, t_aicf = run_and_time(payload, dev, {"q": q, "k": k, "v": v}, REPS)
    y = outputs["y"]
    dt = getattr(torch, TORCH_DTYPE[precision])
    q32, k32, v32 = (torch.from_numpy(x).cuda() for x in (q, k, v))
    qt, kt, vt = (x.to(dt) for x in (q32, k32, v32))

    def sdpa():
        return F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)
    yt = sdpa()
    t_torch = median_us(sdpa, torch.cuda.synchronize, lambda: torch.cuda.Event(enable_timing=True), REPS)
    ref = F.scaled_dot_product_attention(q32, k32, v32, is_causal=causal).double().cpu().numpy()
    del q32, k32, v32, qt, kt, vt
    scale = np.abs(ref).max()
    flops = 4.0 * b * h * s * s * d * (0.5 if causal else 1.0)
    return {"shape": [b, h, s, d], "causal": causal, "precision": precision,
            "aicf_us": t_aicf, "torch_us": t_torch,
            "aicf_tflops": flops / t_aicf / 1e6, "torch_tflops": flops / t_torch / 1e6, "ratio": t_torch / t_aicf,
            "aicf_err": float(np.abs(y.astype(np.float64) - ref).max() / scale),
            "torch_err": float(np.abs(yt.double().cpu().numpy() - ref).max() / scale),
            "kernels": len(payload["kernels"]),
            "predicted_us": kern[0]["predicted"]["time_us"] if kern else float("nan"),
            "params": kern[0]["params"] if kern else {}}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--precision", choices=sorted(TORCH_DTYPE), default="fp16")
    ap.add_argument("--quick", action="store_true", help="the two non-causal shapes only")
    ap.add_argument("--json", type=Path, help="also write the rows as JSON")
    ap.add_argument("--shape", action="append", help="BxHxSxD[c] instead of the standard shapes (c: causal)")
    ap.add_argument("--pin", action="append", default=[], help="KEY=VALUE passed to aicfc (experiments)")
    args = ap.parse_args(argv)
    from aicf_run.device import open_device
    dev = open_device(0)
    shapes = QUICK if args.quick else SHAPES
    if args.shape:
        shapes = [tuple(int(x) for x in sh.rstrip("c").split("x")) + (sh.endswith("c"),) for sh in args.shape]
    pin = dict(item.split("=", 1) for item in args.pin)
    print(f"GPU: {dev.name} ({dev.arch}), precision {args.precision}")
    print(f"{'B x H x S x D':<18} {'causal':>6} {'aicf us':>9} {'SDPA us':>9} {'aicf TF/s':>10} {'SDPA TF/s':>10} "
          f"{'ratio':>6} {'pred us':>8} {'err':>8} {'SDPA err':>8}  schedule")
    rows, bad = [], []
    for b, h, s, d, causal in shapes:
        r = bench_one(dev, b, h, s, d, causal, args.precision, pin)
        rows.append(r)
        sched = " ".join(f"{a}={v}" for a, v in sorted(r["params"].items()))
        print(f"{f'{b}x{h}x{s}x{d}':<18} {'yes' if causal else 'no':>6} {r['aicf_us']:>9.1f} {r['torch_us']:>9.1f} "
              f"{r['aicf_tflops']:>10.1f} {r['torch_tflops']:>10.1f} {r['ratio']:>6.2f} {r['predicted_us']:>8.1f} "
              f"{r['aicf_err']:>8.1e} {r['torch_err']:>8.1e}  {sched}", flush=True)
        if not r["aicf_err"] <= TOL:
            bad.append(f"{b}x{h}x{s}x{d}{' causal' if causal else ''}: rel err {r['aicf_err']:.2e} > {TOL}")
    dev.close()
    if args.json:
        args.json.write_text(json.dumps({"gpu": dev.name, "rows": rows}, indent=1))
    if bad:
        print("WRONG RESULTS:\n  " + "\n  ".join(bad))
        sys.exit(1)


if __name__ == "__main__":
    main()
