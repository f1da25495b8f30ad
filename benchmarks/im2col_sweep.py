"""Pins that spread ResNet-50 B32's 3x3 convolutions over the TMA im2col engine's tile shapes (issue 17),
so that a few bundles, each kernel profiled alone, time many (shape, schedule) pairs: the five stage-3
3x3s of one bundle take five different schedules, the three stage-2 ones three, and so on.

    python3 benchmarks/im2col_sweep.py pins MODEL.onnx BUNDLE [--device]   # --pin arguments of bundle BUNDLE
    python3 benchmarks/im2col_sweep.py list MODEL.onnx                      # every family's feasible configs
    python3 benchmarks/im2col_sweep.py fit MODEL.onnx DIR [KEY=VALUE ...]   # DIR's profiles re-predicted, the
                                                                            # profile's data set as given
    python3 benchmarks/im2col_sweep.py tune MODEL.onnx TUNE.json [KEY=VALUE ...]  # an `aicfc tune --json` report's
                                                                            # wgmma convolutions re-costed so

Configs that no candidate of a kernel matches are left out for that family, so every bundle compiles.
The local graph (benchmarks/resnet50_graph.py) and the device's torch export name their nodes apart;
--device names them as the export does (the kernels are numbered alike).
"""
from __future__ import annotations

import dataclasses
import functools
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from aicfc.codegen import FAMILIES
from aicfc.driver import load
from aicfc.frontend.onnx_import import import_model
from aicfc.passes.pipeline import Options, run_pipeline
from aicfc.passes.plan_schedules import recost
from aicfc.planner.hardware import load_profile

# kernel: (local node, torch-export node); families: kernels of one shape
NODES = {"k14": ("node_conv_54", "node_Conv_790"), "k18": ("node_conv_70", "node_Conv_802"),
         "k21": ("node_conv_83", "node_Conv_811"), "k24": ("node_conv_96", "node_Conv_820"),
         "k27": ("node_conv_109", "node_Conv_829"), "k31": ("node_conv_125", "node_Conv_841"),
         "k34": ("node_conv_138", "node_Conv_850"), "k37": ("node_conv_151", "node_Conv_859"),
         "k40": ("node_conv_164", "node_Conv_868"), "k43": ("node_conv_177", "node_Conv_877"),
         "k46": ("node_conv_190", "node_Conv_886"), "k50": ("node_conv_206", "node_Conv_898"),
         "k53": ("node_conv_219", "node_Conv_907")}
FAMILIES_K = [["k18", "k21", "k24"], ["k31", "k34", "k37", "k40", "k43"], ["k50", "k53"], ["k14"], ["k27"], ["k46"]]
CONFIGS = [dict(BM=64, BN=128, PP=1, STAGES=4), dict(BM=64, BN=128, PP=1, STAGES=6),
           dict(BM=64, BN=128, PP=1, STAGES=8), dict(BM=128, BN=128, SPLITK=1, STAGES=3),
           dict(BM=128, BN=128, SPLITK=1, STAGES=5), dict(BM=128, BN=64, STAGES=4),
           dict(BM=128, BN=64, STAGES=7), dict(BM=64, BN=256, NWG=1, SPLITK=1, STAGES=4),
           dict(BM=192, BN=128, NWG=3, STAGES=4), dict(BM=64, BN=64, PP=1, STAGES=8),
           dict(BM=128, BN=128, SPLITK=1, STAGES=6), dict(BM=64, BN=128, NWG=1, PP=0, STAGES=6)]
FIXED = dict(unit="wgmma", A="tma", SPLITK=1)


@functools.lru_cache(maxsize=None)
def plan_of(model: str):
    """The model's sm_90 fp16 plan, registers estimated (feasibility and the convolutions' costs need no more)."""
    proto, name, _ = load(model)
    return run_pipeline(import_model(proto, None, name=name),
                        Options("sm_90", load_profile("sm_90", None), "fp16", (), True, None)).plan


def estimate(k, p: dict, types, hw):
    """The cost model's estimate of kernel `k` on schedule `p` (its own launch; a convolution's cost reads no
    register count)."""
    grid, block, dyn = FAMILIES[k.family].launch(k, p)
    return recost(k, p, grid, block, dyn, 0, types, hw)


def feasible(model: str) -> dict[str, list[dict]]:
    """Each family's configs that some candidate of its first kernel matches."""
    plan = plan_of(model)
    out = {}
    for fam in FAMILIES_K:
        k = next((k for k in plan.kernels if k.name == fam[0]), None)
        assert k is not None and k.family == "conv", fam[0]
        space = FAMILIES[k.family].space(k, plan)
        out[fam[0]] = [c for c in CONFIGS
                       if any(all(p.get(a) == v for a, v in {**FIXED, **c}.items()) for p in space)]
    return out


def pins(model: str, bundle: int, device: bool) -> list[str]:
    ok = feasible(model)
    args = []
    for fam in FAMILIES_K:
        configs = ok[fam[0]]
        for j, kname in enumerate(fam):
            c = configs[(bundle * len(fam) + j) % len(configs)]
            node = NODES[kname][1 if device else 0]
            args += [f"--pin={node}:{a}={v}" for a, v in {**FIXED, **c}.items()]
    return args


def fit(model: str, folder: str, sets: list[str]) -> int:
    """Every 3x3 of NODES in each bundle of `folder` (explain_B.json, profile_B.txt from `conv_round.sh
    sweep`): measured against the schedule's prediction now, with the hardware profile's data keys set
    as `sets` says; then per kernel family, the fastest measured schedule against the model's pick."""
    import glob
    import json
    import os
    from benchmarks.conv_repredict import profile_tables
    plan = plan_of(model)
    hw = keyed(sets)
    types = plan.types()
    kernels = {k.name: k for k in plan.kernels}
    rows = []
    for path in sorted(glob.glob(os.path.join(folder, "explain_*.json"))):
        b = os.path.basename(path)[len("explain_"):-len(".json")]
        run, _ = profile_tables(open(os.path.join(folder, f"profile_{b}.txt")).read())
        for o in json.load(open(path))["kernels"]:
            if o["name"] not in NODES or o["name"] not in run:
                continue
            k, p = kernels[o["name"]], o["params"]
            est = estimate(k, p, types, hw)
            # the launch term as the plan charged it (a kernel launched late: passes/late_trigger.py)
            now = est.time_us - est.terms.get("launch_us", 0.0) + o["predicted"].get("launch_us", 0.0)
            rows.append((o["name"], b, p, run[o["name"]][0], o["predicted"]["time_us"], now))
    keys = ("BM", "BN", "NWG", "PP", "MI", "STAGES", "SPLITK", "CL", "CTAS")
    inband = 0
    print(f"{'kernel':>6} {'bundle':>6}  {'schedule':<52} {'meas':>6} {'then':>6} {'now':>6} {'m/now':>5}")
    for name, b, p, meas, then, now in rows:
        inband += 0.8 <= meas / now <= 1.25
        sched = " ".join(f"{a}={p[a]}" for a in keys if a in p)
        print(f"{name:>6} {b:>6}  {sched:<52} {meas:6.2f} {then:6.2f} {now:6.2f} {meas / now:5.2f}")
    print(f"{inband} of {len(rows)} within [0.8, 1.25] now")
    for fam in FAMILIES_K:
        mine = [r for r in rows if r[0] in fam]
        if mine:
            best, pick = min(mine, key=lambda r: r[3]), min(mine, key=lambda r: r[5])
            print(f"{'/'.join(fam)}: fastest measured {best[3]:.2f} us ({best[1]} {best[0]}); the model's pick of "
                  f"these {pick[3]:.2f} us measured ({pick[1]} {pick[0]}, predicted {pick[5]:.2f})")
    return 0


def keyed(sets: list[str]):
    """The sm_90 profile with its data keys set as `sets` (KEY=VALUE) says."""
    hw = load_profile("sm_90", None)
    return dataclasses.replace(hw, data={**hw.data, **{s.split("=")[0]: float(s.split("=")[1]) for s in sets}})


def tune(model: str, report: str, sets: list[str]) -> int:
    """Each convolution of an `aicfc tune --json` report: its measured wgmma candidates re-costed under the
    sm_90 profile and under `sets` (band, Spearman rank correlation, the pick's measured time over the
    fastest), then every 64-row candidate's measured and both predictions."""
    import json
    import numpy as np
    plan = plan_of(model)
    types, kernels = plan.types(), {k.name: k for k in plan.kernels}
    profiles = (("as is", keyed([])), (" ".join(sets) or "as is", keyed(sets)))

    for r in json.load(open(report))["kernels"]:
        cands = [c for c in r["candidates"] if c.get("measured_us") and not c.get("failed")
                 and c["params"].get("unit") == "wgmma"]
        if r["family"] != "conv" or not cands:
            continue
        k, meas = kernels[r["name"]], np.array([c["measured_us"] for c in cands])
        line = []
        for label, hw in profiles:
            pred = np.array([estimate(k, c["params"], types, hw).time_us for c in cands])
            band = int(((meas / pred >= 0.8) & (meas / pred <= 1.25)).sum())
            rho = float(np.corrcoef(np.argsort(np.argsort(pred)), np.argsort(np.argsort(meas)))[0, 1])
            line.append(f"{label}: band {band}/{len(cands)} spearman {rho:.2f} pick {meas[pred.argmin()] / meas.min():.2f}x")
        print(r["name"], " | ".join(line))
        for c in cands:
            p = c["params"]
            if p.get("A") == "tma" and p["BM"] == 64:
                print(f"    {p['BM']}x{p['BN']} PP={p.get('PP')} NWG={p.get('NWG')} STAGES={p['STAGES']} CTAS={p['CTAS']}: "
                      f"measured {c['measured_us']:.2f}, " + ", ".join(f"{label} {estimate(k, p, types, hw).time_us:.2f}" for label, hw in profiles))
    return 0


def main(argv: list[str]) -> int:
    if argv[:1] == ["tune"] and len(argv) >= 3:
        return tune(argv[1], argv[2], argv[3:])
    if argv[:1] == ["fit"] and len(argv) >= 3:
        return fit(argv[1], argv[2], argv[3:])
    if argv[:1] == ["pins"] and len(argv) >= 3:
        print(" ".join(pins(argv[1], int(argv[2]), "--device" in argv)))
        return 0
    if argv[:1] == ["list"] and len(argv) == 2:
        for k, cs in feasible(argv[1]).items():
            print(k, len(cs), "; ".join(" ".join(f"{a}={v}" for a, v in c.items()) for c in cs))
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
