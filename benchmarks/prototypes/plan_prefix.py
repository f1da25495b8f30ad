"""Prototype (issue 19): the first kernels of a decode plan replayed alone, as a graph of their own.

In the 1 B Llama's decode-plan timeline the cos table (k1, one block) takes about 2.5 us from its go to its exit,
where pdl_chain.py's one-block kernels of the same work take 0.26. Here the decode plan of a bundle compiled with
`--timeline` runs once on real inputs, then only its first N kernels (N = 2, 3, 4, 5) are captured as one graph
(the first launched plainly, the rest as the bundle says, dependent) and replayed; each kernel's go -> exit and
exit -> next go are printed from its stamps, so a kernel's time with the rest of the plan absent can be compared
with its time in the whole plan.

    python3 benchmarks/prototypes/plan_prefix.py BUNDLE [--rounds 20] [--new 4]

Measured on an H200 (session 54, calls 10-13 of benchmarks/results/prologue_session54_h200.txt; the 2-layer
1 B Llama): k1 runs 0.48 us from its go to its exit alone after k0, 0.74 in the whole plan, the same after 4 or
256 generated tokens, and aicf_run's own timeline in this process agrees (k1 done at 1.57 us). The 3.30 us that
decode_ab.py's timeline showed came from the decode plan's inputs: decode_ab timed it after the prefill plan had
run in the arena the two share, so it read the prefill's leftovers as its position.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("bundle")
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--new", type=int, default=4, help="tokens generated before (the decode plan's last position)")
    args = ap.parse_args()
    import aicf_run
    from aicf_run.graph import Graph
    model = aicf_run.load(args.bundle)
    decode = next(i for i, p in enumerate(model.plans) if p.shapes["input_ids"][1] == 1)
    ex = model.plan(decode)
    model.generate(np.random.default_rng(1).integers(0, 32000, (1, 512)), args.new)   # real inputs in the arena
    position = np.empty(1, np.int64)
    pos_buf = next(b for b in ex.bundle.inputs if b["name"] == "cache_position")
    print(f"after generating {args.new} tokens: cache_position buffer {pos_buf['buffer']}", flush=True)
    arrays = ex.stamp_arrays()
    cuda = ex.device.driver
    names = [k["name"] for k in ex.bundle.kernels]
    cases = [(n, False, False) for n in (2, 5, len(names))] + [(len(names), True, True)]
    for n, zero, own in cases:
        graph = Graph.capture(ex.stream, lambda n=n: [ex.launch_kernel(i) for i in range(n)])
        graph.upload(ex.stream)
        rows = []
        for _ in range(args.rounds):
            if zero:   # as aicf_run/timeline.py does before each replay
                for address, blocks in arrays:
                    cuda.memset_d8(address, 0, 8 * 11 * blocks)
            if own:    # the executor's own graph of the plan
                ex.launch()
            else:
                graph.launch(ex.stream)
            ex.synchronize()
            stamps = []
            for address, blocks in arrays[:n]:
                host = np.empty((blocks, 11), np.uint64)
                cuda.memcpy_dtoh(host, address)
                stamps.append(host.astype(np.int64))
            t0 = stamps[0][0, 1]
            rows.append([(s[:, 1].min() - t0, s[:, 2].max() - t0) for s in stamps])
        graph.close()
        med = np.median(np.array(rows, dtype=float), axis=0) / 1e3
        print(f"first {n:3d} kernels{' zeroed' if zero else ''}{' (its graph)' if own else ''}: " + "  ".join(f"{names[i]} go {g:5.2f} exit {e:5.2f}" for i, (g, e) in
                                                    enumerate(med[:6])), flush=True)
    from aicf_run.timeline import format_timeline
    print("\n".join(format_timeline(ex.timeline()).splitlines()[:8]), flush=True)   # aicf_run/timeline.py in the same process
    model.close()


if __name__ == "__main__":
    main()
