"""A bundle's Hopper GEMM and convolution kernels timed alone two ways in one process: as the plan launches
them (a dependent launch: `aicf-run --profile`'s method) and plainly (no dependent-launch attribute, as `aicfc
tune` launches candidates), alternating rounds, each way a graph of back-to-back launches of the one kernel.

Why: on an H100 `aicfc tune` timed ResNet-50 B32's stage-3 3x3 convolutions at 14.3-14.5 us where the profile
timed the same kernels at 15.0-15.3 (session 74; issue 17's bar is 15.0), tune on random inputs and plain
launches, the profile on the model's activations and dependent ones. This separates the launch from the data.

    python3 benchmarks/pdl_alone.py BUNDLE.aicf --input INPUTS.npz [--kernels k31 k43] [--rounds 3]
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> int:
    from aicf_run.bundle import read_bundle
    from aicf_run.device import open_device
    from aicf_run.executor import Executor
    from aicf_run.profile import GRAPH_LAUNCHES, _timed_us
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("bundle")
    ap.add_argument("--input", required=True, help=".npz of the model's inputs by name")
    ap.add_argument("--kernels", nargs="*", help="kernel names (default: every wgmma kernel)")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    with np.load(args.input, allow_pickle=False) as z:
        inputs = {name: z[name] for name in z.files}
    device = open_device(0)
    ex = Executor(read_bundle(args.bundle), device)
    try:
        ex.run(inputs)
        kernels = [(i, k) for i, k in enumerate(ex.bundle.kernels)
                   if (k["name"] in args.kernels if args.kernels else k.get("params", {}).get("unit") == "wgmma")]
        times: dict[tuple[int, bool], list[float]] = {}
        for _ in range(args.rounds):
            for i, _k in kernels:
                for plain in (False, True):
                    def launches(i: int = i, plain: bool = plain) -> None:
                        for _ in range(GRAPH_LAUNCHES):
                            ex.launch_kernel(i, plain)
                    us = _timed_us(ex, launches)
                    times.setdefault((i, plain), []).append(us / GRAPH_LAUNCHES)
        print(f"{'kernel':>7} {'dependent us':>13} {'plain us':>9} {'plain/dep':>9}  schedule")
        for i, k in kernels:
            dep, plain = statistics.median(times[(i, False)]), statistics.median(times[(i, True)])
            p = k["params"]
            sched = " ".join(f"{key}={p[key]}" for key in ("A", "BM", "BN", "NWG", "PP", "CTAS", "CLUSTER", "SPLITK")
                             if key in p)
            print(f"{k['name']:>7} {dep:13.2f} {plain:9.2f} {plain / dep:9.3f}  {sched}")
    finally:
        ex.close()
        device.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
