"""ResNet-50 B32's stride-1 3x3 convolutions (28x28x128, 14x14x256, 7x7x512; BN + ReLU, a max pool after) compiled
with stream-k pinned (STREAM=1, 128x128 tiles), each into its own bundle with a fresh input beside it: what
`benchmarks/conv_round.sh` times, stamps (--timeline) and runs under compute-sanitizer.

    python3 benchmarks/stream_k_bundles.py OUT_DIR [--timeline]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.conv_ab import CASES  # noqa: E402

PIN = {"unit": "wgmma", "STREAM": 1, "BM": 128, "BN": 128}


def main() -> int:
    import aicfc
    from tests import onnx_builders as B
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--timeline", action="store_true", help="compile with aicfc compile --timeline's stamps")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(76)
    for name in ("s2", "s3", "s4"):
        x, w = CASES[name]
        model = B.conv_model(x, w, bn=True, act="relu", pads=[1, 1, 1, 1], follow="pool")
        aicfc.compile_to_file(model, args.out / f"{name}_sk128.aicf", target="sm_90", precision="fp16", pin=PIN,
                              timeline=args.timeline)
        np.savez(args.out / f"{name}_in.npz", in0=rng.standard_normal(x).astype(np.float32))
        print(f"{name}: {args.out / f'{name}_sk128.aicf'}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
