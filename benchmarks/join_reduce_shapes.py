"""ResNet-50 B32's stage-1 shapes as a two-GEMM block pair (tests/test_join_reduce.block_pair: the expansion with
its shortcut, 100352 rows, K 64, C 256, then a reduce of N2 columns), compiled joined and apart
([Note: a reduce joined into the epilogue] in passes/join_reduce.py) with host tiles pinned, for an A/B on the GPU.

    python3 benchmarks/join_reduce_shapes.py OUT_DIR     # writes OUT_DIR/<case>.aicf, prints the cases
"""
from __future__ import annotations

import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

# name: (N2, pins)
CASES = {
    "n64_apart": (64, {"joinr": 0}),
    "n64_joined": (64, {"joinr": 1}),
    "n128_apart": (128, {"joinr": 0}),
    "n128_joined": (128, {"joinr": 1}),
    "n128_pp": (128, {"joinr": 1, "mm1:PP": 1}),
    "n128_ts0": (128, {"joinr": 1, "mm1:TS": 0}),
}


def build(out: str, name: str) -> str:
    import numpy as np
    import aicfc
    from tests.test_join_reduce import block_pair
    n2, pin = CASES[name]
    payload = aicfc.compile(block_pair(100352, 64, 256, n2, np.random.default_rng(0)), target="sm_90",
                            precision="fp16", pin=pin)
    from aicfc.artifact.writer import write_bundle
    write_bundle(payload, Path(out) / f"{name}.aicf")
    host = [k for k in payload["kernels"] if k["family"] == "gemm"]
    return f"{name}: " + "; ".join(f"{k['name']} {k['params'].get('BM')}x{k['params'].get('BN')} PP={k['params'].get('PP')} "
                                   f"TS={k['params'].get('TS')} J2={k['params'].get('J2', 0)} predicted "
                                   f"{k.get('predicted', {}).get('time_us', float('nan')):.2f} us" for k in host)


def main(argv: list[str]) -> int:
    out = argv[0]
    Path(out).mkdir(parents=True, exist_ok=True)
    with ProcessPoolExecutor(6) as ex:
        for line in ex.map(build, [out] * len(CASES), list(CASES)):
            print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
