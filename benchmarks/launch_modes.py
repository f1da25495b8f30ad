"""Dependent launches against plain ones ([Note: PDL] in aicfc/codegen/pdl.py): one plan compiled
both ways, both loaded in one process on one GPU, graph replays timed alternately.

    source .gpu/env.sh && python3 benchmarks/launch_modes.py [--layers 8] [--batch 1] [--rounds 5]
    source .gpu/env.sh && python3 benchmarks/launch_modes.py --onnx model.onnx [--shape x=1x3x224x224]

Default: the decode step (S = 1) of benchmarks/generate.py's Llama at --layers layers (cache of
576 slots, fp16). Each round times `--replays` graph replays of each bundle (CUDA events around
one replay, median), the two bundles alternating; printed: both medians per round and the median
over rounds of plain / dependent (> 1: dependent launches faster), and the outputs' agreement.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.decoder_graph import DecoderConfig, random_weight, weight_shapes  # noqa: E402
from benchmarks.generate import build, shape_set  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--onnx", help="an ONNX model instead of the decoder")
    ap.add_argument("--shape", action="append", default=[], help="NAME=AxB (with --onnx)")
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--replays", type=int, default=50)
    ap.add_argument("--jobs", type=int, default=16)
    args = ap.parse_args()
    from aicf_run.bench import time_plan
    from aicf_run.bundle import Bundle
    from aicf_run.device import open_device
    from aicf_run.executor import Executor
    from aicfc.driver import compile_model
    folder = Path(tempfile.mkdtemp(prefix="aicf-launch-"))
    if args.onnx:
        path, shapes, what = args.onnx, args.shape or None, args.onnx
    else:
        cfg = DecoderConfig(2048, args.layers, 32, 8, 5632, 32000, 576)
        rng = np.random.default_rng(0)
        path = build(folder, cfg, {n: random_weight(n, s, rng) for n, s in weight_shapes(cfg).items()})
        shapes = shape_set(cfg, args.batch, 1)
        what = f"Llama decode step, {args.layers} layers, B{args.batch}"
    device = open_device(0)
    executors = {}
    try:
        for mode in ("dependent", "stream"):
            payload = compile_model(str(path), precision="fp16", shapes=shapes, jobs=args.jobs,
                                    dependent_launch=mode == "dependent")
            executors[mode] = Executor(Bundle.from_payload(payload), device)
        kernels = len(executors["stream"].bundle.kernels)
        print(f"{what}: {kernels} kernels a plan", flush=True)
        ratios = []
        for r in range(args.rounds):
            times = {m: time_plan(ex, args.replays, True).median_us for m, ex in executors.items()}
            ratios.append(times["stream"] / times["dependent"])
            print(f"round {r}: dependent {times['dependent']:.1f} us, plain {times['stream']:.1f} us, "
                  f"plain/dependent {ratios[-1]:.3f}", flush=True)
        print(f"median plain/dependent over {args.rounds} rounds: {statistics.median(ratios):.3f} "
              f"({kernels} kernels)")
    finally:
        for ex in executors.values():
            ex.close()
        device.close()


if __name__ == "__main__":
    main()
