"""Summarize an `aicf-run --profile` table of a CNN for issue 17: per convolution kernel (a kernel
whose ONNX nodes include a Conv), measured/predicted and % of the roofline as the profile printed
them, and the counts against the issue's bars (>= 50% of the roofline; meas/pred in [0.8, 1.25]).

    python3 benchmarks/conv_profile_summary.py PROFILE.txt [EXPLAIN.json]

With the bundle's `aicfc explain --json`, each row also names the family and schedule.
"""
from __future__ import annotations

import json
import sys


def rows(text: str) -> list[dict]:
    out = []
    for line in text.splitlines():
        f = line.split()
        if len(f) < 9 or not f[0].isdigit() or not f[1].startswith("k"):
            continue
        try:
            out.append({"i": int(f[0]), "kernel": f[1], "meas": float(f[2]), "pred": float(f[3]),
                        "ratio": float(f[4]), "roof": float(f[8].rstrip("%")), "nodes": " ".join(f[9:])})
        except ValueError:
            continue
    return out


def main(argv: list[str]) -> int:
    table = rows(open(argv[0]).read())
    kinfo = {}
    if len(argv) > 1:
        doc = json.load(open(argv[1]))
        for k in doc["kernels"]:
            p = k.get("params", {})
            kinfo[k["name"]] = f"{k['family']} " + " ".join(f"{x}={p[x]}" for x in ("unit", "BM", "BN", "NWG", "MI", "STAGES")
                                                           if x in p)
    convs = [r for r in table if "Conv" in r["nodes"]]
    print(f"{'kernel':>6} {'meas us':>9} {'pred us':>9} {'m/p':>6} {'roof%':>6}  schedule / nodes")
    for r in convs:
        print(f"{r['kernel']:>6} {r['meas']:9.2f} {r['pred']:9.2f} {r['ratio']:6.2f} {r['roof']:6.1f}  "
              f"{kinfo.get(r['kernel'], '')}  {r['nodes'].split()[0]}")
    n = len(convs)
    roof = sum(r["roof"] >= 50 for r in convs)
    band = sum(0.8 <= r["ratio"] <= 1.25 for r in convs)
    print(f"convolution kernels: {n}; >= 50% of roofline: {roof}; meas/pred in [0.8, 1.25]: {band} "
          f"({100 * band / max(n, 1):.0f}%); conv time {sum(r['meas'] for r in convs):.1f} us of "
          f"{sum(r['meas'] for r in table):.1f} us")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
