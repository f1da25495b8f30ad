"""Time the compiled examples on the GPU against PyTorch eager (fp32) in the same process.

    source .gpu/env.sh && python3 benchmarks/examples.py

aicf: the bundle's launch plan replayed (`Executor.launch()`: its CUDA graph), timed with CUDA
events over 200 repetitions after warm-up; the median per run is reported. torch: the same
computation written with torch ops on the same weights (fp32, TF32 off), timed the same way.
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
from onnx import numpy_helper

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import aicfc  # noqa: E402
import examples.build_examples as ex  # noqa: E402
from benchmarks.timing import median_us, run_and_time  # noqa: E402

REPS = 200


def torch_block(w, x):
    import torch
    q, k, v = x @ w["Wq"], x @ w["Wk"], x @ w["Wv"]
    p = torch.softmax((q @ k.T) * w["attn_scale"], dim=-1)
    h = x + (p @ v) @ w["Wo"]
    u = h @ w["W1"] + w["b1"]
    g = u * (torch.erf(u / w["gelu_sqrt2"]) + w["gelu_one"]) * w["gelu_half"]
    return torch.tanh(h + g @ w["W2"] + w["b2"])


def torch_mlp(w, x):
    import torch
    h = torch.relu(x @ w["W1"] + w["b1"])
    return torch.sigmoid(h @ w["W2"].T + w["b2"])


def main() -> None:
    import torch
    from aicf_run.device import open_device
    torch.backends.cuda.matmul.allow_tf32 = False
    dev = open_device(0)
    rows = []
    for name, ref_fn in (("mlp", torch_mlp), ("block", torch_block)):
        model = ex.BUILDERS[name]()
        x = np.random.default_rng(0).standard_normal(
            [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]).astype(np.float32)
        outputs, t_aicf = run_and_time(aicfc.compile(model, target=dev.arch), dev, {"x": x}, REPS, 20)
        y = outputs["y"]
        w = {t.name: torch.from_numpy(numpy_helper.to_array(t).copy()).cuda() for t in model.graph.initializer}
        xt = torch.from_numpy(x).cuda()
        yt = ref_fn(w, xt)
        err = float((torch.from_numpy(y).cuda() - yt).abs().max() / yt.abs().max())
        t_torch = median_us(lambda: ref_fn(w, xt), torch.cuda.synchronize,
                            lambda: torch.cuda.Event(enable_timing=True), REPS, 20)
        rows.append((name, t_aicf, t_torch, err))
    print(f"GPU: {dev.name}")
    print(f"{'model':<8}{'aicf us':>10}{'torch eager us':>16}{'torch/aicf':>12}{'rel err':>10}")
    for name, a, t, err in rows:
        print(f"{name:<8}{a:>10.1f}{t:>16.1f}{t / a:>12.2f}{err:>10.1e}")
    dev.close()


if __name__ == "__main__":
    main()
