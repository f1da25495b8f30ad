"""Summarize an `aicf-run --profile` table of a CNN for issue 17: per convolution kernel (a kernel
whose ONNX nodes include a Conv), measured/predicted, and the issue's bars: above 50% of the
tensor cores' peak or, where the kernel is memory-bound, 80% of the measured copy bandwidth; and
measured / predicted in [0.8, 1.25]. The count holds a memory-bound kernel to its copy bar alone; a second
count reads the issue's "or" as written (a memory-bound kernel above 50% of the tensor peak passes too:
ResNet-50's stage-1 3x3s, whose bytes and FLOPs take about as long, run at 51% of the peak and 60% of
their copy bar), beside it, never in its place. A memory-bound kernel below its bar also shows what its
bar asks of the tensor cores ("needs"): its FLOPs in the time its bytes take at 80% of the copy
bandwidth, as a share of the peak. Where that share is far above what a GEMM of its shape attains (the
stage-4 reduces of ResNet-50 B32 need about 77%), no schedule of that kernel alone reaches the bar; a
join that removes the kernel's traffic can.

    python3 benchmarks/conv_profile_summary.py PROFILE.txt [EXPLAIN.json] [--copy-gbs GBS] [--peak-tflops 989.4]
        [--timeline TIMELINE.json]

A kernel is memory-bound when its bytes (inputs once, outputs once: the profile's GB/s column) at
the copy bandwidth take longer than its FLOPs at the peak. The copy bandwidth is measured
(device-to-device copy, bytes read + written; benchmarks/generate.py and memory_bound.py print it),
the peak is the profile's dense fp16 tensor-core figure. With the bundle's `aicfc explain --json`,
each row also names the family and schedule. With `aicf-run --timeline --json` of the same plan
compiled with --timeline, each convolution is also judged by its time in the chain (from its
start to the next kernel's, [Note: timeline] in aicfc/codegen/timeline.py): what it costs where
the plan runs, its input just written by the kernel before it, not warm in L2 from its own
repeats.
"""
from __future__ import annotations

import json
import re
import sys


def rows(text: str) -> list[dict]:
    out = []
    for line in text.splitlines():
        f = line.split()
        if len(f) < 9 or not f[0].isdigit() or not f[1].startswith("k"):
            continue
        try:
            out.append({"i": int(f[0]), "kernel": f[1], "meas": float(f[2]), "pred": float(f[3]),
                        "ratio": float(f[4]), "gbs": float(f[6]), "tflops": float(f[7]),
                        "roof": float(f[8].rstrip("%")), "nodes": " ".join(f[9:])})
        except ValueError:
            continue
    return out


MEMORY_BAR, COMPUTE_BAR = 0.8, 0.5   # issue 17: of the copy bandwidth where memory-bound, else of the tensor peak


def bar(r: dict, copy_gbs: float, peak_tflops: float) -> tuple[str, float, bool]:
    """(bound, fraction of its bar's figure, passes): memory-bound kernels against 80% of the copy
    bandwidth, the others against 50% of the tensor cores' peak."""
    mem, tc = r["gbs"] / copy_gbs, r["tflops"] / peak_tflops
    if mem > tc:
        return "memory", mem, mem >= MEMORY_BAR
    return "compute", tc, tc >= COMPUTE_BAR


def needs(r: dict, copy_gbs: float, peak_tflops: float) -> float | None:
    """The share of the tensor peak a memory-bound kernel must run at to take no longer than its bytes at
    MEMORY_BAR of the copy bandwidth (None for a compute-bound one): its measured share scaled by the
    measured time over the bar's time."""
    mem, tc = r["gbs"] / copy_gbs, r["tflops"] / peak_tflops
    return tc * MEMORY_BAR / mem if mem > tc else None


def main(argv: list[str]) -> int:
    import argparse
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("profile")
    ap.add_argument("explain", nargs="?")
    ap.add_argument("--copy-gbs", type=float, default=None,
                    help="measured copy bandwidth, GB/s read + written (default: the profile file's 'copy bandwidth N "
                         "GB/s' line, which benchmarks/conv_round.sh appends, else an H200's, session 15, said so)")
    ap.add_argument("--peak-tflops", type=float, default=989.4, help="dense fp16 tensor-core peak (sm_90)")
    ap.add_argument("--timeline", default=None, help="aicf-run --timeline --json of the plan: the in-chain times too")
    args = ap.parse_args(argv)
    text = open(args.profile).read()
    table = rows(text)
    if args.copy_gbs is None:
        # the bars at the copy rate of the GPU that ran the profile (an H100's is 0.7 of an H200's: session 73)
        said = re.search(r"^copy bandwidth ([\d.]+) GB/s", text, re.M)
        args.copy_gbs = float(said.group(1)) if said else 4239.0
        if not said:
            print("no copy bandwidth in the profile file: the bars at an H200's 4239 GB/s (give --copy-gbs)")
    chain = {}
    if args.timeline:
        chain = {k["name"]: k["chain_us"] for k in json.load(open(args.timeline))["timeline"]["kernels"]
                 if k["chain_us"] is not None}
    kinfo = {}
    if args.explain:
        doc = json.load(open(args.explain))
        for k in doc["kernels"]:
            p = k.get("params", {})
            kinfo[k["name"]] = f"{k['family']} " + " ".join(f"{x}={p[x]}" for x in ("unit", "BM", "BN", "NWG", "PP", "STAGES")
                                                           if x in p)
    convs = [r for r in table if "Conv" in r["nodes"]]
    print(f"{'kernel':>6} {'meas us':>9} {'pred us':>9} {'m/p':>6} {'GB/s':>7} {'TFLOP/s':>8} {'bound':>8} {'of bar':>7} "
          f"{'pass':>4} {'needs':>6}  schedule / nodes")
    passed = either = 0
    for r in convs:
        bound, frac, ok = bar(r, args.copy_gbs, args.peak_tflops)
        passed += ok
        either += ok or r["tflops"] / args.peak_tflops >= COMPUTE_BAR
        need = None if ok else needs(r, args.copy_gbs, args.peak_tflops)
        print(f"{r['kernel']:>6} {r['meas']:9.2f} {r['pred']:9.2f} {r['ratio']:6.2f} {r['gbs']:7.0f} {r['tflops']:8.1f} "
              f"{bound:>8} {100 * frac:6.1f}% {'yes' if ok else 'NO':>4} {'' if need is None else f'{100 * need:5.0f}%':>6}  "
              f"{kinfo.get(r['kernel'], '')}  {r['nodes'].split()[0]}")
    n = len(convs)
    band = sum(0.8 <= r["ratio"] <= 1.25 for r in convs)
    if chain:
        # the same rows with the time in chain as the measured time (GB/s and TFLOP/s scale with it)
        timed = [dict(r, meas=chain[r["kernel"]], ratio=chain[r["kernel"]] / r["pred"],
                      gbs=r["gbs"] * r["meas"] / chain[r["kernel"]], tflops=r["tflops"] * r["meas"] / chain[r["kernel"]])
                 for r in convs if r["kernel"] in chain]
        at_bar = sum(bar(r, args.copy_gbs, args.peak_tflops)[2] for r in timed)
        in_band = sum(0.8 <= r["ratio"] <= 1.25 for r in timed)
        print("in the chain: " + " ".join(f"{r['kernel']}:{r['meas']:.2f}/{r['ratio']:.2f}" for r in timed))
        print(f"in the chain ({len(timed)} of {n} with a time in chain): at their bar {at_bar}; chain/pred in "
              f"[0.8, 1.25]: {in_band} ({100 * in_band / max(len(timed), 1):.0f}%)")
    print(f"convolution kernels: {n}; at their bar (compute-bound >= 50% of {args.peak_tflops:.0f} TFLOP/s, memory-bound "
          f">= 80% of {args.copy_gbs:.0f} GB/s): {passed}; meas/pred in [0.8, 1.25]: {band} ({100 * band / max(n, 1):.0f}%); "
          f"conv time {sum(r['meas'] for r in convs):.1f} us of {sum(r['meas'] for r in table):.1f} us")
    print("needs: the share of the tensor peak at which a memory-bound kernel below its bar would take no longer than "
          "its bytes at 80% of the copy bandwidth")
    print(f"read as the issue's 'or' (memory-bound kernels above 50% of the tensor peak counted too): {either} of {n} "
          f"at their bar")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
