"""Re-predict an `aicf-run --profile` of a CNN with the current cost model (issue 17): plan the
model again (fp16, sm_90, ptxas register counts, no nvcc build of the bundle) and print, for
every kernel the profile measured, measured / predicted under the current model

  - of the schedule the profile measured (its params and ptxas registers from the profiled
    bundle's `aicfc explain --json`), re-costed: how well the model now predicts what ran;
  - of the schedule the planner now picks, where that schedule was measured: the profile's own
    run when the pick is unchanged, or a second table of the same profile file (e.g. a run under
    `--pin unit=wgmma`, `conv_profile_summary.py`'s rows) whose schedule string matches it.

    python3 benchmarks/conv_repredict.py PROFILE.txt MODEL.onnx PROFILED_EXPLAIN.json [HW_PROFILE.json]

HW_PROFILE.json: a hardware profile to re-cost with (`aicfc compile --profile`'s file, e.g. sm_90's figures with a
key set: `{"base": "sm_90", "l2_total_gbs": 9500}`); sm_90's own by default.

Counts are over the convolution kernels (ONNX nodes naming a Conv), band [0.8, 1.25].
"""
from __future__ import annotations

import functools
import json
import re
import sys

from aicfc.codegen import FAMILIES
from aicfc.codegen.module import count_registers
from aicfc.driver import load
from aicfc.frontend.onnx_import import import_model
from aicfc.passes.pipeline import Options, run_pipeline
from aicfc.planner.cost import cost
from aicfc.planner.hardware import load_profile

KEYS = ("unit", "BM", "BN", "NWG", "MI", "STAGES")   # what conv_profile_summary.py prints of a schedule
BAND = (0.8, 1.25)


def short(p: dict) -> str:
    return " ".join(f"{x}={p[x]}" for x in KEYS if x in p)


def profile_tables(text: str) -> tuple[dict[str, tuple[float, str]], list[dict[str, tuple[float, str]]]]:
    """The numbered run ({kernel: (measured us, onnx nodes)}) and every summary table after it
    ({kernel: (measured us, schedule string)}), in file order."""
    run: dict[str, tuple[float, str]] = {}
    summaries: list[dict[str, tuple[float, str]]] = []
    for line in text.splitlines():
        m = re.match(r"\s*\d+\s+(k\d+)\s+([\d.]+)\s+[\d.]+\s+[\d.]+\s+[\d.]+%\s+[\d.]+\s+[\d.]+\s+[\d.]+%\s*(.*)", line)
        if m:
            run.setdefault(m.group(1), (float(m.group(2)), m.group(3)))   # a later note may repeat a row
            continue
        if line.startswith("kernel ") and "meas us" in line:
            summaries.append({})
            continue
        m = re.match(r"\s*(k\d+)\s+([\d.]+)\s+[\d.]+\s+[\d.]+\s+[\d.]+\s+\w+ (unit=.*?)\s{2}", line)
        if m and summaries:
            summaries[-1][m.group(1)] = (float(m.group(2)), m.group(3).strip())
    return run, summaries


def main(argv: list[str]) -> int:
    prof, model, explain, *hw_path = argv
    run, summaries = profile_tables(open(prof).read())
    old = {k["name"]: k for k in json.load(open(explain))["kernels"]}
    hw = load_profile("sm_90", hw_path[0] if hw_path else None)
    proto, name, _ = load(model)
    plan = run_pipeline(import_model(proto, None, name=name),
                        Options("sm_90", hw, "fp16", (), True, functools.partial(count_registers, jobs=4))).plan
    types = plan.types()
    print(f"{'kernel':>6} {'meas':>7} {'old':>7} {'m/old':>6} {'now':>7} {'m/now':>6} | "
          f"{'new pick (if changed)':<44} {'pred':>6} {'meas':>6} {'m/p':>5}  nodes")
    same_in = pick_in = n = 0
    for k in plan.kernels:
        if k.name not in run:
            continue
        meas, nodes = run[k.name]
        o = old[k.name]
        p = o["params"]
        grid, block, dyn = FAMILIES[k.family].launch(k, p)
        smem = FAMILIES[k.family].static_smem(k, p) + dyn
        now = cost(k, p, grid, block, smem, o["registers"], types, hw).time_us
        pick = dict(k.schedule.param)
        changed = short(pick) != short(p)
        pick_meas = meas if not changed else next(
            (s[k.name][0] for s in summaries if k.name in s and s[k.name][1] == short(pick)), None)
        pick_pred = k.schedule.time_us
        conv = "Conv" in nodes
        if conv:
            n += 1
            same_in += BAND[0] <= meas / now <= BAND[1]
            pick_in += pick_meas is not None and BAND[0] <= pick_meas / pick_pred <= BAND[1]
        right = (f"{short(pick) if changed else '(same)':<44} {pick_pred:6.2f} "
                 + (f"{pick_meas:6.2f} {pick_meas / pick_pred:5.2f}" if pick_meas else f"{'-':>6} {'-':>5}"))
        print(f"{k.name:>6} {meas:7.2f} {o['predicted']['time_us']:7.2f} {meas / o['predicted']['time_us']:6.2f} "
              f"{now:7.2f} {meas / now:6.2f} | {right}  {nodes.split(',')[0]}")
    print(f"convolution kernels: {n}; measured schedule, meas/now in {list(BAND)}: {same_in}; "
          f"new picks, measured / predicted in {list(BAND)}: {pick_in}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
