"""ResNet-50 B32's stride-1 3x3 convolutions (56x56x64 to 7x7x512, BN + ReLU epilogue) compiled by
cost and with schedule keys pinned, each kernel timed alone (`aicf-run --profile`'s method), in one
process: measured against predicted, and the variants against each other (A = tma / halo, k-splits).

    python3 benchmarks/conv_ab.py [--cases s3 s4] [--pins A=tma A=halo SPLITK=2,A=tma ...]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

CASES = {"s1": ((32, 64, 56, 56), (64, 64, 3, 3)), "s2": ((32, 128, 28, 28), (128, 128, 3, 3)),
         "s3": ((32, 256, 14, 14), (256, 256, 3, 3)), "s4": ((32, 512, 7, 7), (512, 512, 3, 3))}


def main() -> int:
    import aicfc
    from aicf_run.bundle import Bundle
    from aicf_run.device import open_device
    from aicf_run.executor import Executor
    from tests import onnx_builders as B
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", nargs="+", default=list(CASES), choices=list(CASES))
    ap.add_argument("--pins", nargs="+", default=["A=tma", "A=halo"],
                    help="pin sets beside the cost's choice, each KEY=VALUE[,KEY=VALUE]")
    args = ap.parse_args()
    pins = [dict(kv.split("=", 1) for kv in spec.split(",")) for spec in args.pins]
    device = open_device(0)
    try:
        for name in args.cases:
            x, w = CASES[name]
            # a max pool follows, so the 3x3 stores channels-last inside the graph as in the model (its epilogue
            # may be staged: OUT) and the pins meet no other GEMM-like kernel
            model = B.conv_model(x, w, bn=True, act="relu", pads=[1, 1, 1, 1], follow="pool")
            for extra in [None] + pins:
                pin = {"unit": "wgmma"} | (extra or {})
                label = "cost" if extra is None else "pin " + ",".join(f"{a}={b}" for a, b in extra.items())
                try:
                    payload = aicfc.compile(model, target="sm_90", precision="fp16", pin=pin)
                except Exception as e:  # noqa: BLE001 - a split outside the space
                    print(f"{name} {label}: {str(e).splitlines()[0][:100]}")
                    continue
                ex = Executor(Bundle.from_payload(payload), device)
                try:
                    rep = ex.profile()
                finally:
                    ex.close()
                conv = next(k for k in payload["kernels"] if k["family"] == "conv" and "A" in k["params"])
                kp = next(k for k in rep.kernels if k.name == conv["name"])
                p = conv["params"]
                print(f"{name} {label}: BM {p['BM']} BN {p['BN']} A {p['A']} NWG {p['NWG']} MI {p['MI']} PP {p.get('PP', 0)} "
                      f"OUT {p.get('OUT', 0)} STAGES {p['STAGES']} SPLITK {p.get('SPLITK', 1)} CTAS {p['CTAS']}: "
                      f"measured {kp.measured_us:.2f} us, "
                      f"predicted {kp.predicted_us:.2f} us ({kp.measured_us / kp.predicted_us:.2f}), "
                      f"{kp.tflops:.0f} TFLOP/s", flush=True)
    finally:
        device.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
