"""What `Executor.run` costs beyond the plan itself, with device tensors and with numpy.

    python3 benchmarks/run_overhead.py [--layers 12 --batch 8 --seq 512 --hidden 768 --heads 12]
                                       [--precision fp16] [--reps 30] [--save F | --bundle F]

Builds a BERT-base-like encoder stack (examples/build_examples.py `build_encoder`: B8 S512,
hidden 768, 12 heads, FFN 3072, 12 layers by default; the input is the embeddings, float32),
compiles it, and on the GPU measures host wall time per call (time.perf_counter, median of
`--reps` after warm-up), in one process:

- `launch()` + `synchronize()`: the plan alone, the floor;
- `run()` with torch tensors already on the device (PyCUDA GPUArrays when torch has no CUDA),
  outputs returned as DeviceArrays; goal <= 1.05 x the floor;
- the same with `outputs=` (the caller's tensors written) and with `stream=` (torch's stream);
- `run()` with numpy: goal = the floor + the input and output bytes at the measured
  page-locked copy bandwidth (host->device and device->host timed here with the same sizes).

It checks that every path gives the same bits as the numpy path. `--save FILE` only compiles
(no GPU needed); `--bundle FILE` runs that bundle, to keep nvcc off the GPU machine. `--case
resnet50:32` (any case of benchmarks/models.py: bert:8x512, resnet50:32, ...) exports that model
with torch instead (random weights, fp32 interface) and compiles it at `--precision`.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import aicfc  # noqa: E402
from aicf_run.bundle import Bundle, read_bundle  # noqa: E402
from aicf_run.device import open_device  # noqa: E402
from aicf_run.executor import Executor  # noqa: E402
from aicfc.artifact import write_bundle  # noqa: E402
from examples.build_examples import SEED, build_encoder  # noqa: E402


def wall_us(call: Callable[[], Any], reps: int, warmup: int = 3) -> float:
    """Median host wall time of `call()` in microseconds; `call` must wait for the GPU itself."""
    for _ in range(warmup):
        call()
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        call()
        times.append((time.perf_counter() - start) * 1e6)
    return statistics.median(times)


def copy_us(cuda: Any, nbytes: int, reps: int) -> tuple[float, float]:
    """(host->device, device->host) median microseconds for `nbytes` through page-locked memory."""
    if not nbytes:
        return 0.0, 0.0
    host = cuda.pagelocked_empty((nbytes,), np.uint8)
    device = cuda.mem_alloc(nbytes)
    stream = cuda.Stream()

    def h2d() -> None:
        cuda.memcpy_htod_async(device, host, stream)
        stream.synchronize()

    def d2h() -> None:
        cuda.memcpy_dtoh_async(host, device, stream)
        stream.synchronize()
    result = wall_us(h2d, reps), wall_us(d2h, reps)
    device.free()
    return result


def device_tensors(arrays: dict[str, np.ndarray]) -> tuple[dict[str, Any], Any, str]:
    """The inputs on the GPU: torch tensors if torch has CUDA, else PyCUDA GPUArrays."""
    try:
        import torch
        if torch.cuda.is_available():
            tensors = {k: torch.from_numpy(v).cuda() for k, v in arrays.items()}
            torch.cuda.synchronize()
            return tensors, torch, "torch"
    except ImportError:
        pass
    import pycuda.gpuarray as gpuarray
    return {k: gpuarray.to_gpu(v) for k, v in arrays.items()}, None, "pycuda.gpuarray"


def compile_case(spec: str, precision: str) -> dict:
    """Export benchmarks/models.py's case `spec` (torch, random weights) and compile it."""
    import tempfile
    from benchmarks.models import build, export, make_inputs, parse_cases
    (name, batch, seq), = parse_cases(spec)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "model.onnx"
        export(build(name, False), make_inputs(name, batch, seq, np.random.default_rng(0)), path)
        return aicfc.compile(str(path), precision=precision)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--hidden", type=int, default=768)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--precision", default="fp16")
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--json", type=Path, help="also write the figures as JSON")
    ap.add_argument("--save", type=Path, help="compile only: write the bundle here and stop")
    ap.add_argument("--bundle", type=Path, help="run this bundle (from --save) instead of compiling")
    ap.add_argument("--case", help="a benchmarks/models.py case (e.g. resnet50:32) exported by torch")
    args = ap.parse_args(argv)

    if args.bundle:
        payload = read_bundle(args.bundle).payload
    elif args.case:
        payload = compile_case(args.case, args.precision)
    else:
        model = build_encoder(np.random.default_rng(SEED), layers=args.layers, batch=args.batch,
                              seq=args.seq, hidden=args.hidden, heads=args.heads,
                              ffn=4 * args.hidden, name="bert_like")
        payload = aicfc.compile(model, precision=args.precision)
    if args.save:
        write_bundle(payload, args.save)
        return 0
    bundle = Bundle.from_payload(payload)
    rng = np.random.default_rng()
    arrays = {item["name"]: rng.standard_normal(item["shape"]).astype(item["dtype"])
              for item in bundle.inputs}

    device = open_device(0)
    try:
        ex = Executor(bundle, device)
        cuda = device.driver
        reference = ex.run(arrays)
        tensors, torch, library = device_tensors(arrays)

        def plan() -> None:
            ex.launch()
            ex.synchronize()

        def on_device() -> dict:
            return ex.run(tensors)

        floor = wall_us(plan, args.reps)
        device_us = wall_us(on_device, args.reps)
        numpy_us = wall_us(lambda: ex.run(arrays), args.reps)
        got = {k: np.asarray(v.numpy()) for k, v in ex.run(tensors).items()}
        same = all(got[k].tobytes() == reference[k].tobytes() for k in reference)
        rows = {"launch()+sync": floor, f"run({library} tensors)": device_us, "run(numpy)": numpy_us}
        if torch is not None:
            outs = {item["name"]: torch.empty(item["shape"], dtype=getattr(torch, item["dtype"]),
                                              device="cuda") for item in bundle.outputs}
            rows["run(torch, outputs=)"] = wall_us(lambda: ex.run(tensors, outputs=outs), args.reps)
            same &= all(outs[k].cpu().numpy().tobytes() == reference[k].tobytes() for k in reference)
            stream = torch.cuda.current_stream()

            def on_stream() -> None:
                ex.run(tensors, outputs=outs, stream=stream.cuda_stream)
                stream.synchronize()
            rows["run(torch, outputs=, stream=)"] = wall_us(on_stream, args.reps)
        in_bytes = sum(a.nbytes for a in arrays.values())
        out_bytes = sum(a.nbytes for a in reference.values())
        h2d_us, _ = copy_us(cuda, in_bytes, args.reps)
        _, d2h_us = copy_us(cuda, out_bytes, args.reps)
        gpu = device.name
        ex.close()
    finally:
        device.close()

    numpy_goal = floor + h2d_us + d2h_us
    print(f"GPU: {gpu}; {bundle.payload['model']['name']} {bundle.payload['precision']}: "
          f"{len(bundle.kernels)} kernels; inputs {in_bytes} B, outputs {out_bytes} B")
    for label, us in rows.items():
        print(f"  {label:32s} {us:10.1f} us  {us / floor:6.3f} x launch()")
    print(f"  numpy goal: launch() + copies at the measured page-locked speed "
          f"({h2d_us:.1f} + {d2h_us:.1f} us) = {numpy_goal:.1f} us; run(numpy) is "
          f"{numpy_us / numpy_goal:.3f} x that")
    print(f"  device results identical to the numpy path: {same}")
    if args.json:
        args.json.write_text(json.dumps({"gpu": gpu, "rows_us": rows, "h2d_us": h2d_us,
                                         "d2h_us": d2h_us, "numpy_goal_us": numpy_goal,
                                         "identical": same}, indent=2))
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
