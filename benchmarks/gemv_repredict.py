"""The gemv cost model (planner/cost_gemv.py) against the times `benchmarks/gemv.py --json` measured:
every timed schedule repredicted with the current constants and ptxas's registers (as recorded),
measured / predicted printed per schedule and the count within [0.8, 1.25]. No GPU needed.

    python3 benchmarks/gemv_repredict.py RESULT.json [...]
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from aicfc.codegen import gemm_gemv  # noqa: E402
from aicfc.planner.cost_gemv import profile_terms  # noqa: E402
from aicfc.planner.hardware import blocks_per_sm, load_profile  # noqa: E402


def main(paths: list[str]) -> int:
    hw = load_profile("sm_90")
    ok = n = 0
    for path in paths:
        for r in json.loads(Path(path).read_text())["rows"]:
            p = r["params"]
            if p.get("unit") != "gemv":
                continue
            bps, _ = blocks_per_sm(gemm_gemv.threads(p), gemm_gemv.static_smem(p), r["registers"], hw)
            t = profile_terms(p, r["rows"], r["N"], r["K"], 2, r["terms"]["bytes"], bps, hw)
            pred = t["time_us"] + hw.launch_overhead_us
            ratio = r["measured_us"] / pred
            n += 1
            ok += 0.8 <= ratio <= 1.25
            print(f"{r['shape']:8s} M{r['rows']} {r['which']:4s} BN{p['BN']} W{p['WARPS']} U{p['U']} S{p['SPLITK']} "
                  f"CL{p.get('CL', 0)} regs {r['registers']} bps {bps}  measured {r['measured_us']:6.2f}  "
                  f"predicted {pred:6.2f}  meas/pred {ratio:.2f}")
    print(f"{ok} of {n} within [0.8, 1.25]")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
