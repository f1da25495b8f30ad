"""Real models end to end: BERT-base, GPT-2 small and ResNet-50 exported by torch, compiled by
aicfc, run by aicf_run, against PyTorch eager and torch.compile on the same GPU, same process.

    source .gpu/env.sh && python3 benchmarks/models.py [--quick] [--json F] [--only bert,gpt2,resnet50]
    python3 benchmarks/models.py --tiny --no-gpu        # CPU: export and compile small configs only

For each case the model is built with random weights (transformers' BertModel(BertConfig()) and
GPT2Model(GPT2Config()): BERT-base and GPT-2 small, every parameter drawn at random as in a
trained checkpoint; torchvision's resnet50()), exported by
torch.onnx.export (the default, dynamo exporter, opset 18) in float32 at the case's static shape,
and compiled by aicfc at fp16 (`precision="fp16"`: fp16 storage and tensor cores, fp32
accumulation). Timed (median of REPS CUDA-event timings after warm-up):
  - aicf: the compiled plan on inputs already on the device (one CUDA graph replay);
  - eager: the torch module in fp16 under inference_mode;
  - compile: torch.compile of that module (default mode), after its compilation.
The check: aicf's output against the fp32 torch module on the same inputs, max|y - ref| /
max|ref| <= 1e-2 (torch fp16 eager's own error is printed beside it). Transformers take random
token ids (batch, seq); ResNet-50 random images (batch, 3, 224, 224).
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.timing import median_us, run_and_time  # noqa: E402

CASES = [("bert", 1, 128), ("bert", 8, 512), ("gpt2", 1, 128), ("gpt2", 8, 512), ("resnet50", 1, 0), ("resnet50", 32, 0)]
QUICK = [("bert", 1, 128), ("gpt2", 1, 128), ("resnet50", 1, 0)]
REPS = 50
TOL = 1e-2


def randomize(module, scale: float, seed: int = 0) -> None:
    """Every parameter of `module` drawn at random, as a trained checkpoint has them: N(0,
    scale²), 1-D weights (norm scales) around 1. No zero biases or unit norm scales, which the
    exporter would deduplicate into one shared constant (a graph unlike a real model's)."""
    import torch
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * scale + (1.0 if p.dim() == 1 and "weight" in name else 0.0))


def build(name: str, tiny: bool):
    """The torch module (fp32, eval) returning one tensor."""
    import torch
    if name == "resnet50":
        import torchvision
        return torchvision.models.resnet18().eval() if tiny else torchvision.models.resnet50().eval()
    import transformers as tf
    if name == "bert":
        cfg = tf.BertConfig(**(dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                    intermediate_size=256) if tiny else {}))
        inner = tf.BertModel(cfg, add_pooling_layer=False)
    else:
        cfg = tf.GPT2Config(**(dict(n_embd=64, n_layer=2, n_head=4) if tiny else {}))
        inner = tf.GPT2Model(cfg)

    randomize(inner, 0.02)

    class LastHidden(torch.nn.Module):
        def __init__(self, m):
            super().__init__()
            self.m = m

        def forward(self, input_ids):
            return self.m(input_ids=input_ids, return_dict=False)[0]
    return LastHidden(inner.eval()).eval()


def make_inputs(name: str, batch: int, seq: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    if name == "resnet50":
        return {"x": rng.standard_normal((batch, 3, 224, 224)).astype(np.float32)}
    return {"input_ids": rng.integers(0, 50000 if name == "gpt2" else 30000, (batch, seq)).astype(np.int64)}


def export(model, inputs: dict[str, np.ndarray], path: Path) -> float:
    import torch
    t = time.perf_counter()
    args = tuple(torch.from_numpy(v) for v in inputs.values())
    with torch.no_grad():
        torch.onnx.export(model, args, str(path), input_names=list(inputs), output_names=["y"],
                          opset_version=18, dynamo=True, external_data=False)
    return time.perf_counter() - t


def bench_case(dev, name: str, batch: int, seq: int, tiny: bool, work: Path) -> dict:
    import torch
    import aicfc
    rng = np.random.default_rng(batch * 1000 + seq)
    torch.manual_seed(0)
    model = build(name, tiny)
    inputs = make_inputs(name, batch, seq, rng)
    path = work / f"{name}_b{batch}_s{seq}.onnx"
    t_export = export(model, inputs, path)
    t = time.perf_counter()
    payload = aicfc.compile(str(path), target=dev.arch if dev else "sm_90", precision="fp16")
    t_compile = time.perf_counter() - t
    row = {"model": name, "batch": batch, "seq": seq, "kernels": len(payload["kernels"]),
           "export_s": t_export, "compile_s": t_compile}
    if dev is None:
        return row
    y, t_aicf = run_and_time(payload, dev, inputs, REPS)
    y = y["y"]
    args32 = [torch.from_numpy(v).cuda() for v in inputs.values()]
    m32 = model.cuda()
    with torch.inference_mode():
        ref = m32(*args32).double().cpu().numpy()
    m16 = model.half()
    args16 = [a.half() if a.is_floating_point() else a for a in args32]
    sync = torch.cuda.synchronize

    def event():
        return torch.cuda.Event(enable_timing=True)
    with torch.inference_mode():
        y_eager = m16(*args16)
        t_eager = median_us(lambda: m16(*args16), sync, event, REPS)
        t = time.perf_counter()
        compiled = torch.compile(m16)
        compiled(*args16)
        sync()
        t_tc_build = time.perf_counter() - t
        t_compiled = median_us(lambda: compiled(*args16), sync, event, REPS)
    scale = float(np.abs(ref).max())
    row.update({"aicf_ms": t_aicf / 1e3, "eager_ms": t_eager / 1e3, "compile_ms": t_compiled / 1e3,
                "vs_eager": t_eager / t_aicf, "vs_compile": t_compiled / t_aicf,
                "aicf_err": float(np.abs(y.astype(np.float64) - ref).max() / scale),
                "eager_err": float(np.abs(y_eager.double().cpu().numpy() - ref).max() / scale),
                "torch_compile_s": t_tc_build})
    del m32, m16, compiled, model
    torch.cuda.empty_cache()
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="batch 1 only")
    ap.add_argument("--only", help="comma-separated models out of bert, gpt2, resnet50")
    ap.add_argument("--case", action="append", help="MODEL:BATCH of the standard cases (repeatable)")
    ap.add_argument("--tiny", action="store_true", help="small configs (2 layers, hidden 64; ResNet-18)")
    ap.add_argument("--no-gpu", action="store_true", help="export and compile only")
    ap.add_argument("--json", type=Path, help="also write the rows as JSON")
    args = ap.parse_args(argv)
    cases = QUICK if args.quick else CASES
    if args.only:
        cases = [c for c in cases if c[0] in args.only.split(",")]
    if args.case:
        cases = [c for c in CASES if f"{c[0]}:{c[1]}" in args.case]
    dev = None
    if not args.no_gpu:
        from aicf_run.device import open_device
        dev = open_device(0)
        print(f"GPU: {dev.name} ({dev.arch}); fp16; medians of {REPS} after warm-up", flush=True)
    print(f"{'model':<9} {'batch':>5} {'seq':>4} {'kernels':>7} {'aicf ms':>8} {'eager ms':>9} {'compile ms':>10} "
          f"{'x eager':>7} {'x compile':>9} {'err':>8} {'eager err':>9} {'export s':>8} {'aicfc s':>7}", flush=True)
    rows, bad = [], []
    with tempfile.TemporaryDirectory(prefix="aicf-models-") as tmp:
        for name, batch, seq in cases:
            try:
                r = bench_case(dev, name, batch, seq, args.tiny, Path(tmp))
            except Exception as e:   # report and go on: one model's failure is a row, not the end
                bad.append(f"{name} b{batch} s{seq}: {type(e).__name__}: {str(e)[:300]}")
                print(f"{name:<9} {batch:>5} {seq:>4} FAILED {bad[-1]}", flush=True)
                continue
            rows.append(r)
            f = lambda k, w, p=2: f"{r[k]:>{w}.{p}f}" if k in r else f"{'-':>{w}}"  # noqa: E731
            print(f"{name:<9} {batch:>5} {seq or '':>4} {r['kernels']:>7} {f('aicf_ms', 8, 3)} {f('eager_ms', 9, 3)} "
                  f"{f('compile_ms', 10, 3)} {f('vs_eager', 7)} {f('vs_compile', 9)} "
                  f"{r['aicf_err'] if 'aicf_err' in r else float('nan'):>8.1e} "
                  f"{r['eager_err'] if 'eager_err' in r else float('nan'):>9.1e} {r['export_s']:>8.1f} "
                  f"{r['compile_s']:>7.1f}", flush=True)
            if "aicf_err" in r and not r["aicf_err"] <= TOL:
                bad.append(f"{name} b{batch} s{seq}: rel err {r['aicf_err']:.2e} > {TOL}")
    if dev is not None:
        dev.close()
    if args.json:
        args.json.write_text(json.dumps({"gpu": dev.name if dev else None, "rows": rows}, indent=1))
    if bad:
        print("FAILURES:\n  " + "\n  ".join(bad))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
