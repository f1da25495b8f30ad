"""Whole-plan A/B of bundles of one model (e.g. compiled with and without a `--pin`): in one process,
on one GPU, each bundle's plan replayed as a CUDA graph (`aicf-run --bench`'s timing), the bundles
taking turns for --rounds rounds; the medians and each one's ratio to the first. Every bundle first
runs the same random inputs, and its outputs are compared with the first bundle's (max|y - y0| /
max|y0|), so a variant that computes something else shows. Each step is also reported on stderr as it
ends, with the seconds since the start (a bundle loaded, its first run, each round's times), so a run cut short
by a time limit still says how far it got and which bundle it was on (session 90: a three-way A/B under
`timeout 120` was killed with nothing printed).

    python3 benchmarks/plan_ab.py base=/tmp/a.aicf merged=/tmp/b.aicf [--rounds 5] [--replays 50] [--json F]
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("bundles", nargs="+", metavar="NAME=PATH")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--replays", type=int, default=50, help="timed replays a round (median)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    named = []
    for spec in args.bundles:
        name, eq, path = spec.partition("=")
        if not eq or not name or not Path(path).is_file():
            ap.error(f"{spec!r}: give NAME=PATH of a bundle file")
        named.append((name, path))
    start = time.perf_counter()

    def progress(what: str) -> None:
        print(f"[plan_ab {time.perf_counter() - start:6.1f} s] {what}", file=sys.stderr, flush=True)

    import aicf_run
    from aicf_run.bundle import read_bundle
    from aicf_run.inputs import random_inputs
    inputs = random_inputs(read_bundle(named[0][1]).plans[0], np.random.default_rng(args.seed))
    models = {}
    for name, path in named:
        progress(f"loading {name}")
        models[name] = aicf_run.load(path)
    try:
        outs = {}
        for name, m in models.items():
            progress(f"first run of {name}")
            outs[name] = m.run(inputs)
        ref = next(iter(outs.values()))
        diff = {}
        for name, out in outs.items():
            diff[name] = max(float(np.abs(np.asarray(out[k], np.float64) - np.asarray(ref[k], np.float64)).max()
                                   / max(float(np.abs(np.asarray(ref[k], np.float64)).max()), 1e-30)) for k in ref)
        times: dict[str, list[float]] = {name: [] for name in models}
        for r in range(args.rounds):
            for name, m in models.items():
                times[name].append(m.bench(args.replays, graph=True).graph.median_us)
            progress(f"round {r + 1}: " + "  ".join(f"{name} {t[-1]:.1f} us" for name, t in times.items()))
        base = statistics.median(times[named[0][0]])
        report = {}
        for name, _ in named:
            med = statistics.median(times[name])
            print(f"{name:12} plan replay median {med:9.1f} us  ({base / med:.3f}x of {named[0][0]})  rounds "
                  f"{['%.1f' % t for t in times[name]]}  outputs vs {named[0][0]}: {diff[name]:.1e}", flush=True)
            report[name] = {"replay_us": times[name], "median_us": med, "rel_diff": diff[name]}
        if args.json:
            args.json.write_text(json.dumps(report, indent=2))
    finally:
        for m in models.values():
            m.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
