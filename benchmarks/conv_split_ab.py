"""ResNet-50 B32's late 3x3 convolutions (14x14x256 and 7x7x512, BN + ReLU epilogue) compiled with
their k-split pinned and by cost, each kernel timed alone (`aicf-run --profile`'s method), measured
against predicted: whether split-k pays on the Hopper conv engine and whether its cost terms say so.

    python3 benchmarks/conv_split_ab.py [--splits 1 2 3 4]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

CASES = {"s3_3x3": ((32, 256, 14, 14), (256, 256, 3, 3)), "s4_3x3": ((32, 512, 7, 7), (512, 512, 3, 3))}


def main() -> int:
    import aicfc
    from aicf_run.bundle import Bundle
    from aicf_run.device import open_device
    from aicf_run.executor import Executor
    from tests import onnx_builders as B
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--splits", type=int, nargs="+", default=[1, 2, 3, 4])
    args = ap.parse_args()
    device = open_device(0)
    try:
        for name, (x, w) in CASES.items():
            model = B.conv_model(x, w, bn=True, act="relu", pads=[1, 1, 1, 1])
            for sk in [None] + args.splits:
                pin = {"unit": "wgmma"} | ({"SPLITK": sk} if sk else {})
                try:
                    payload = aicfc.compile(model, target="sm_90", precision="fp16", pin=pin)
                except Exception as e:  # noqa: BLE001 - a split outside the space
                    print(f"{name} SPLITK={sk}: {str(e).splitlines()[0][:100]}")
                    continue
                ex = Executor(Bundle.from_payload(payload), device)
                try:
                    rep = ex.profile()
                finally:
                    ex.close()
                conv = next(k for k in payload["kernels"] if k["family"] == "conv")
                kp = next(k for k in rep.kernels if k.name == conv["name"])
                p = conv["params"]
                print(f"{name} {'cost' if sk is None else f'pin SPLITK={sk}'}: BM {p['BM']} BN {p['BN']} A {p['A']} "
                      f"STAGES {p['STAGES']} SPLITK {p.get('SPLITK', 1)} CTAS {p['CTAS']}: measured {kp.measured_us:.2f} us, "
                      f"predicted {kp.predicted_us:.2f} us ({kp.measured_us / kp.predicted_us:.2f}), "
                      f"{kp.tflops:.0f} TFLOP/s", flush=True)
    finally:
        device.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
