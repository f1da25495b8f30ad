"""Runtime benchmark: host overhead of a long launch plan, with and without CUDA graph replay.

    python3 benchmarks/runtime.py [--layers 24] [--precision fp16] [--replays 50] [--json FILE]

Builds a stack of BERT-style encoder layers (examples/build_examples.py `build_encoder`, small
dimensions so that kernels are short and launch overhead matters most), compiles it with aicfc,
and on the GPU measures, in one process:

- the whole plan replayed as one CUDA graph and as one launch call per kernel
  (`Executor.bench`: median and p90 over `--replays` replays, CUDA events on the stream);
- every kernel alone (`Executor.profile`: back-to-back launches of that kernel, median), and
  their sum: the time the GPU needs for the plan with no gaps between kernels; and the plan
  replayed back to back the same way (`ProfileReport.plan_us`).

The goal: graph replay ≤ 1.05 x the sum of the kernel times (≤ ~1 us of host overhead per
kernel). It also prints the memory plan (arena against the intermediates, in-place decisions)
and checks that graph replay and plain launches give identical outputs. `--save FILE` only
compiles (no GPU needed) and `--bundle FILE` runs that bundle, to keep nvcc off the GPU machine.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import aicfc  # noqa: E402
from aicf_run.bundle import Bundle, read_bundle  # noqa: E402
from aicfc.artifact import write_bundle  # noqa: E402
from aicf_run.device import open_device  # noqa: E402
from aicf_run.executor import Executor  # noqa: E402
from examples.build_examples import SEED, build_encoder  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=30)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--seq", type=int, default=32)
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--precision", default="fp16")
    ap.add_argument("--replays", type=int, default=50)
    ap.add_argument("--json", type=Path, help="also write the figures as JSON")
    ap.add_argument("--save", type=Path, help="compile only: write the bundle here and stop (no GPU needed)")
    ap.add_argument("--bundle", type=Path, help="a bundle written by --save with the same options, instead "
                                                "of compiling here")
    args = ap.parse_args(argv)

    model = build_encoder(np.random.default_rng(SEED), layers=args.layers, batch=args.batch, seq=args.seq,
                          hidden=args.hidden, heads=4, ffn=4 * args.hidden, name="stack")
    if args.bundle:
        payload = read_bundle(args.bundle).payload
    else:
        payload = aicfc.compile(model, precision=args.precision)
    if args.save:
        write_bundle(payload, args.save)
        return 0
    mem = payload["memory"]
    x = np.random.default_rng().standard_normal((args.batch, args.seq, args.hidden)).astype(np.float32)

    device = open_device(0)
    try:
        ex = Executor(Bundle.from_payload(payload), device)
        y_graph = ex.run({"x": x})["y"]
        ex.launch(graph=False)
        ex.synchronize()
        bench = ex.bench(args.replays)
        prof = ex.profile()
        y_launch = Executor(Bundle.from_payload(payload), device, graph=False).run({"x": x})["y"]
        gpu = device.name
    finally:
        device.close()

    kernels = len(payload["kernels"])
    sum_us = prof.kernel_sum_us
    graph_us, launch_us = bench.graph.median_us, bench.launches.median_us
    result = {
        "gpu": gpu, "layers": args.layers, "precision": args.precision, "kernels": kernels,
        "graph_median_us": graph_us, "graph_p90_us": bench.graph.p90_us,
        "launches_median_us": launch_us, "launches_p90_us": bench.launches.p90_us,
        "sum_of_kernels_us": sum_us, "plan_back_to_back_us": prof.plan_us,
        "back_to_back_over_sum": prof.plan_us / sum_us, "graph_over_sum": graph_us / sum_us, "launches_over_sum": launch_us / sum_us,
        "graph_overhead_per_kernel_us": (graph_us - sum_us) / kernels,
        "launch_overhead_per_kernel_us": (launch_us - sum_us) / kernels,
        "arena_bytes": mem["arena_bytes"], "intermediate_bytes": mem["intermediate_bytes"],
        "graph_intermediate_bytes": mem["graph_intermediate_bytes"], "inplace": len(mem["inplace"]),
        "identical_graph_vs_launches": bool(np.array_equal(y_graph, y_launch)),
        "finite": bool(np.isfinite(y_graph).all()),
    }
    print(f"GPU: {gpu}; {args.layers}-layer encoder stack (hidden {args.hidden}, seq {args.seq}, "
          f"batch {args.batch}), {args.precision}: {kernels} kernels")
    print(f"  whole plan, CUDA graph replay:   median {graph_us:9.1f} us  p90 {bench.graph.p90_us:9.1f} us")
    print(f"  whole plan, one launch per kernel: median {launch_us:9.1f} us  p90 {bench.launches.p90_us:9.1f} us")
    print(f"  sum of the kernels timed alone (--profile): {sum_us:9.1f} us; the plan replayed back to back "
          f"the same way: {prof.plan_us:9.1f} us ({prof.plan_us / sum_us:.3f} x the sum)")
    print(f"  graph / sum = {result['graph_over_sum']:.3f}  ({result['graph_overhead_per_kernel_us']:+.2f} us per kernel); "
          f"launches / sum = {result['launches_over_sum']:.3f}  ({result['launch_overhead_per_kernel_us']:+.2f} us per kernel)")
    print(f"  memory: arena {mem['arena_bytes']} B = {100 * mem['arena_bytes'] / mem['intermediate_bytes']:.0f}% of "
          f"{mem['intermediate_bytes']} B stored intermediates, "
          f"{100 * mem['arena_bytes'] / mem['graph_intermediate_bytes']:.0f}% of {mem['graph_intermediate_bytes']} B "
          f"ONNX intermediates; {len(mem['inplace'])} in-place decisions")
    print(f"  outputs identical, graph vs launches: {result['identical_graph_vs_launches']}; finite {result['finite']}")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    ok = result["identical_graph_vs_launches"] and result["finite"]
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
