"""BERT's FFN1 (4096x768x3072 + bias + erf-GELU, tests/test_cost_wgmma._gelu) under ping-pong and cooperative
tiles, staged or TMA-stored, in one process: each graph-replayed 20 back to back, 5 alternating rounds, the median
with the rounds' range and the cost model's prediction (planner/cost_wgmma.py COOP_EPILOGUE_SCALE).

    source .gpu/env.sh && python3 benchmarks/gelu_ab.py
"""
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import numpy as np  # noqa: E402
import aicfc
from aicf_run.device import open_device
from aicf_run.bundle import Bundle
from aicf_run.executor import Executor
from benchmarks.timing import aicf_graph_us
from tests.test_cost_wgmma import _gelu
dev = open_device(0)
model = _gelu(4096, 768, 3072)
exs = {}
for name, pin in (("PP=1", {"unit": "wgmma", "PP": "1"}), ("PP=0 TS=1", {"unit": "wgmma", "PP": "0", "TS": "1"}),
                  ("PP=0 TS=0", {"unit": "wgmma", "PP": "0", "TS": "0"})):
    p = aicfc.compile(model, target="sm_90", precision="fp16", pin=pin)
    k = [k for k in p["kernels"] if k["family"] == "gemm"][0]
    ex = Executor(Bundle.from_payload(p), dev)
    ex.run({"x": np.random.default_rng(1).standard_normal((4096, 768)).astype(np.float32)})
    exs[name] = (ex, k["predicted"]["time_us"], " ".join(f"{a}={b}" for a, b in sorted(k["params"].items())))
t = {n: [] for n in exs}
for _ in range(5):
    for n, (ex, _, _) in exs.items():
        t[n].append(aicf_graph_us(ex, 20, 50))
for n, (ex, pred, params) in exs.items():
    print(f"{n}: {statistics.median(t[n]):.2f} us [{min(t[n]):.2f}-{max(t[n]):.2f}] predicted {pred:.2f}  {params}", flush=True)
    ex.close()
