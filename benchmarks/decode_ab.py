"""A/B of decode-step variants of one Llama decoder in one process (issue 19): each variant is a
bundle of the same model compiled with different schedule pins and kernel-entry settings; their
decode plans are replayed as CUDA graphs in alternating rounds, and a greedy generation checks
that every variant produces the same tokens.

    python3 benchmarks/decode_ab.py [--layers 6] [--prompt 512] [--new 256] [--rounds 5]
        [--batch 1] [--variant NAME:KEY=VALUE,...] ... [--bundle NAME=PATH] ... [--compile-only] [--folder /tmp/aicf-ab]
        [--jobs 16] [--json FILE] [--profile] [--marginal] [--timeline]

A variant is `name:` followed by comma-separated settings: `pin.KEY=VALUE` restricts the
schedules (as `aicfc compile --pin`; a key only the decode step's kernels have, such as the
gemv's PRE; `pin.NODE:KEY=VALUE` one kernel, e.g. `pin.node_matmul_115:unit=gemv`, in both plans: a pin of
the decode plan alone is `aicfc compile --shape-sets` with a `pin:` word, see the README), `dpin.[NODE:]KEY=VALUE` pins the decode plan alone (a `pin:` word on its shape set), `env.NAME=VALUE` is set while its bundle compiles and `run.NAME=VALUE` while it
loads (an experiment's switches); `gpu.profile=NAME` plans with a bundled GPU profile (`aicfc compile --profile h200`). Session 10's A/B of gemv weights staged in shared memory, an
early dependent-launch trigger and the shared-memory carveout ran this script on the branch
session10-gemv-staged (results: benchmarks/results/decode_ab*_session10_h200.txt).
The model is benchmarks/generate.py's (hidden 2048, 32 heads over 8 key/value heads, FFN 5632,
vocabulary 32000; cache prompt + new slots), fp16, batch --batch (1).

A bundle's plans share one arena, so before each plan is timed its own inputs are written again (the decode
step at position prompt + new/2); until session 54 the decode plan was timed on what the prefill plan had
left there from the second round on (a garbage position), so earlier sessions' replay figures after round 1
are of that, while their generate steps are not. `--timeline-busy` adds a timeline whose replays each follow
another one.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.decoder_graph import DecoderConfig, random_weight, weight_shapes  # noqa: E402
from benchmarks.generate import build, shape_set  # noqa: E402

DEFAULT_VARIANTS = ["base:"]


def parse_variant(spec: str) -> tuple[str, dict[str, str], dict[str, str], dict[str, str]]:
    """(name, pins, compile environment, load environment) of `name:pin.K=V,dpin.K=V,env.N=V,run.N=V,gpu.profile=P`
    (the decode plan's own pins under the key `dpin.K`, the profile to plan with under `gpu.profile`)."""
    name, _, rest = spec.partition(":")
    if not name:
        raise SystemExit(f"--variant {spec!r}: give it a name, e.g. base:pin.PRE=1")
    pins, env, run = {}, {}, {}
    for item in filter(None, rest.split(",")):
        key, eq, value = item.partition("=")
        kind, _, key = key.partition(".")
        if not eq or kind not in ("pin", "dpin", "env", "run", "gpu") or not key or (kind == "gpu" and key != "profile"):
            raise SystemExit(f"--variant {spec!r}: {item!r} is not pin.KEY=VALUE, dpin.KEY=VALUE, env.NAME=VALUE, "
                             "run.NAME=VALUE or gpu.profile=NAME")
        {"pin": pins, "dpin": pins, "env": env, "run": run, "gpu": pins}[kind][(kind + "." if kind in ("dpin", "gpu") else "") + key] = value
    return name, pins, env, run


@contextlib.contextmanager
def environment(values: dict[str, str]):
    """Sets the variables for the `with` block, then puts back what was there."""
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def compile_variant(path: Path, cfg: DecoderConfig, prompt: int, pins: dict, env: dict, out: Path, jobs: int,
                    timeline: bool = False, batch: int = 1) -> float:
    from aicf_run.schema import kernel_records
    from aicfc.artifact import write_bundle
    from aicfc.driver import compile_plans
    start = time.perf_counter()
    decode_pins = [f"pin:{k[len('dpin.'):]}={v}" for k, v in pins.items() if k.startswith("dpin.")]
    profile = pins.get("gpu.profile")   # a bundled GPU profile (aicfc compile --profile NAME), e.g. h200
    pins = {k: v for k, v in pins.items() if not k.startswith(("dpin.", "gpu."))}
    sets = [shape_set(cfg, batch, prompt), shape_set(cfg, batch, 1)]
    if decode_pins:
        sets = [[f"{n}={'x'.join(map(str, s))}" for n, s in shapes.items()] for shapes in sets]
        sets[1] += decode_pins
    with environment(env):
        payload = compile_plans(str(path), sets, precision="fp16", jobs=jobs, pin=pins or None, timeline=timeline,
                                profile_path=profile)
        write_bundle(payload, out)
    decode = [p for p in payload["plans"] if p["inputs"][0]["shape"][1] == 1]
    for plan in decode:
        picks = [" ".join(f"{k}{v}" for k, v in sorted(k["params"].items()) if k != "unit")
                 for k in kernel_records(plan["kernels"]) if k["params"].get("unit") == "gemv"]
        print(f"  {out.stem} decode gemvs: {' | '.join(dict.fromkeys(picks))}", flush=True)
    return time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--batch", type=int, default=1, help="sequences a step (every variant's plans are for this batch)")
    ap.add_argument("--new", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--replays", type=int, default=100)
    ap.add_argument("--variant", action="append", default=None, metavar="NAME:SETTINGS")
    ap.add_argument("--folder", default="/tmp/aicf-ab")
    ap.add_argument("--jobs", type=int, default=16)
    ap.add_argument("--json", default=None)
    ap.add_argument("--bundle", action="append", default=[], metavar="NAME=PATH",
                    help="a variant compiled beforehand (another checkout's compiler, for an A/B across versions): "
                         "the same model, which `--compile-only` writes with this script's --layers/--prompt/--new")
    ap.add_argument("--compile-only", action="store_true", help="write the variants' bundles into --folder and stop")
    ap.add_argument("--profile", action="store_true", help="also time every decode kernel of each variant alone")
    ap.add_argument("--marginal", action="store_true",
                    help="also time every decode kernel's in-plan marginal cost (the plan less the plan without it)")
    ap.add_argument("--timeline-busy", action="store_true",
                    help="with --timeline, also a timeline whose replays each follow another (a busy GPU, as in generation)")
    ap.add_argument("--timeline", action="store_true",
                    help="compile every variant with aicfc compile --timeline and print each decode plan's timeline "
                         "(aicf_run/timeline.py); the replay times then include the stamps")
    args = ap.parse_args()
    variants = [parse_variant(v) for v in (args.variant or ([] if args.bundle else DEFAULT_VARIANTS))]
    cfg = DecoderConfig(2048, args.layers, 32, 8, 5632, 32000, args.prompt + args.new)
    folder = Path(args.folder)
    rng = np.random.default_rng(0)
    weights = {n: random_weight(n, s, rng) for n, s in weight_shapes(cfg).items()}
    path = build(folder, cfg, weights)
    del weights
    bundles = {}
    loads = {}
    for name, pins, env, run in variants:
        bundles[name], loads[name] = folder / f"{name}.aicf", run
        took = compile_variant(path, cfg, args.prompt, pins, env, bundles[name], args.jobs, args.timeline, args.batch)
        print(f"{name}: compiled in {took:.0f} s (pins {pins or '-'}, env {env or '-'}, at load {run or '-'})", flush=True)
    if args.compile_only:
        return
    for spec in args.bundle:
        name, eq, where = spec.partition("=")
        if not eq or not Path(where).is_file():
            raise SystemExit(f"--bundle {spec!r}: give NAME=PATH of a bundle file")
        bundles[name], loads[name] = Path(where), {}
        variants.append((name, {}, {}, {}))
        print(f"{name}: compiled beforehand ({where})", flush=True)
    import aicf_run
    models = {}
    for name, b in bundles.items():
        with environment(loads[name]):
            models[name] = aicf_run.load(b)
    prompt = np.random.default_rng(1).integers(0, cfg.vocab, (args.batch, args.prompt)).astype(np.int64)
    result = {"config": cfg.__dict__, "variants": {}, "rounds": args.rounds}
    try:
        tokens, decode = {}, {}
        for name, model in models.items():
            with environment(loads[name]):   # the greedy feed is set up at the first generation
                model.generate(prompt, 4)
            tokens[name] = model.generate(prompt, args.new).tokens
            decode[name] = next(i for i, p in enumerate(model.plans) if p.shapes["input_ids"][1] == 1)
        prefill_plan = {name: 1 - decode[name] for name in models}
        replay = {name: [] for name in models}
        prefill = {name: [] for name in models}
        step = {name: [] for name in models}
        # A bundle's plans share one arena, so each plan's inputs are written again right before it is timed:
        # a replay "on the inputs already in the arena" would otherwise read what the other plan left there
        # (a decode step at a garbage position: its rotary tables' cosf/sinf on their slow path).
        step_inputs = {"input_ids": prompt[:, :1], "cache_position": np.array([args.prompt + args.new // 2])}
        prompt_inputs = {"input_ids": prompt, "cache_position": np.arange(args.prompt)}
        for _ in range(args.rounds):
            for name, model in models.items():
                model.run(step_inputs, plan=decode[name])
                replay[name].append(model.bench(args.replays, graph=True, plan=decode[name]).graph.median_us)
                model.run(prompt_inputs, plan=prefill_plan[name])
                prefill[name].append(model.bench(max(1, args.replays // 5), graph=True,
                                                 plan=prefill_plan[name]).graph.median_us)
                start = time.perf_counter()
                model.generate(prompt, args.new)
                t_new = time.perf_counter() - start
                start = time.perf_counter()
                model.generate(prompt, 1)
                t_one = time.perf_counter() - start
                step[name].append(1e3 * (t_new - t_one) / (args.new - 1))
        first = next(iter(tokens.values()))
        same = all(np.array_equal(t, first) for t in tokens.values())
        base = statistics.median(replay[variants[0][0]])
        for name in models:
            r, s = statistics.median(replay[name]), statistics.median(step[name])
            pre, pre_base = statistics.median(prefill[name]), statistics.median(prefill[variants[0][0]])
            print(f"{name:10} decode plan replay median {r:8.1f} us ({base / r:.3f}x of {variants[0][0]}) "
                  f"{['%.1f' % x for x in replay[name]]}; generate step median {s:.4f} ms {['%.4f' % x for x in step[name]]}; "
                  f"prefill plan replay median {pre:.1f} us ({pre_base / pre:.3f}x) {['%.1f' % x for x in prefill[name]]}",
                  flush=True)
            result["variants"][name] = {"replay_us": replay[name], "step_ms": step[name], "replay_median_us": r,
                                        "step_median_ms": s, "prefill_replay_us": prefill[name]}
        print(f"tokens equal across variants: {same}")
        for name, t in tokens.items():   # where a variant's greedy tokens first depart from the first variant's
            if not np.array_equal(t, first):
                t2, f2 = np.asarray(t).reshape(len(t), -1), np.asarray(first).reshape(len(first), -1)
                steps = [int(np.argmax(a != b)) if (a != b).any() else None for a, b in zip(t2, f2)]
                print(f"  {name}: first step that differs, per sequence: {steps}")
        if args.timeline:
            from aicf_run.timeline import format_timeline
            for name, model in models.items():
                print(f"# {name}: the decode plan's timeline", flush=True)
                model.run(step_inputs, plan=decode[name])   # its inputs, not the prefill's leftovers
                print(format_timeline(model.plan(decode[name]).timeline()), flush=True)
                if args.timeline_busy:
                    print(f"# {name}: the decode plan's timeline, each timed replay right after another", flush=True)
                    print(format_timeline(model.plan(decode[name]).timeline(busy=True)), flush=True)
        if args.profile or args.marginal:
            from aicf_run.profile import format_profile, marginals
            for name, model in models.items():
                model.run(step_inputs, plan=decode[name])   # its inputs, not the prefill's leftovers
                alone = model.profile(plan=decode[name])
                if args.profile:
                    print(f"# {name}: each decode kernel alone", flush=True)
                    print(format_profile(alone), flush=True)
                if not args.marginal:
                    continue
                costs = marginals(model.plan(decode[name]))
                print(f"# {name}: each decode kernel in the plan (the plan's replay less the replay without it) "
                      f"and alone; sums {sum(costs):.1f} / {alone.kernel_sum_us:.1f} us, plan {alone.plan_us:.1f} us", flush=True)
                for k, cost in zip(alone.kernels, costs):
                    print(f"  {k.index:3d} {k.name:6} in plan {cost:7.2f} us  alone {k.measured_us:7.2f} us  "
                          f"{', '.join(k.onnx_nodes)[:90]}", flush=True)
                result["variants"][name]["marginal_us"] = costs
        result["tokens_equal"] = same
    finally:
        for model in models.values():
            model.device.close()
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2, default=str))


if __name__ == "__main__":
    main()
