"""The decode step's projections (M = 1 and 8 rows) on aicf's gemv unit, against cuBLAS and the
copy bandwidth measured in the same process, with the cost model's prediction beside each.

    source .gpu/env.sh && python3 benchmarks/gemv.py [--rows 1 8] [--top 4] [--json F] [--jobs 16]
        [--cand SHAPE:BN=64,WARPS=8,U=4,SPLITK=3,CL=0 ...]   (these schedules instead of --top's; kmajor=tc,KM=1,TC=1,...
        times the tensor-core steps over a K-major weight, which only that pin offers)

Shapes (a 1 B Llama, hidden 2048, 32 query heads over 8 key/value heads of 64, FFN 5632):
qkv_rope 2048x3072 with the rotary epilogue (q, k, v projections and rotate_half as a Llama
export writes them: `rope_model`), o_proj 2048x2048, gate_up 2048x11264 (plain, no SwiGLU),
down 5632x2048, lm_head 2048x32000.

Per shape and row count: aicf compiles the projection unpinned (its pick) and pinned to each of
`--top` gemv candidates (half the best predicted, half spread over the rest of the planner's
ranking, for the refit), all in parallel processes. Timing, as benchmarks/gemm.py times
(graph-replayed, back to back, CUDA events, median; its helpers): the model holds COPIES
independent copies of the projection on distinct weights, together over L2_BYTES, and one graph
replays every copy's kernel in turn, so each launch streams a weight that is not in L2 (a decode
step streams 2 GB of them); per launch = replay / copies. cuBLAS: torch.matmul on the same
number of copies in turn, in one torch CUDA graph. The copy bandwidth: a 1 GiB device-to-device
copy (bytes read + written), the median of 20 timed with events.

Printed per candidate: measured us, GB/s (the bundle's DRAM bytes over the time), % of the copy
bandwidth, predicted us, measured/predicted, cuBLAS us; plain shapes are checked against float64
(FAIL, exit 1, above 1e-2 of the output's max). Then a summary: per shape the pick, the fastest
candidate and cuBLAS. `--json` adds each candidate's cost terms (planner/cost_gemv.py), which is
what refitting its constants needs.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.timing import events_median_us, torch_graph_us  # noqa: E402

SHAPES = [("qkv_rope", 2048, 3072), ("o_proj", 2048, 2048), ("gate_up", 2048, 11264), ("down", 5632, 2048),
          ("lm_head", 2048, 32000)]
L2_BYTES = 100e6      # copies of a weight together over 1.6 times an H200's 60 MB L2
PER = 10              # graph replays of all the copies' kernels per timing
REPS = 30


def copies_for(k: int, n: int) -> int:
    return max(1, math.ceil(L2_BYTES / (2 * k * n)))


def plain_model(rows: int, k: int, n: int, copies: int, seed: int = 0) -> onnx.ModelProto:
    """y_i = x_i @ w_i for `copies` weights [k, n]; x_i [rows, 1, k] (inputs apart, so that no
    two products merge into one)."""
    rng = np.random.default_rng(seed)
    nodes, inits, ins, outs = [], [], [], []
    for i in range(copies):
        inits.append(numpy_helper.from_array((rng.standard_normal((k, n), dtype=np.float32) / np.sqrt(k)), f"w{i}"))
        nodes.append(helper.make_node("MatMul", [f"x{i}", f"w{i}"], [f"y{i}"]))
        ins.append(helper.make_tensor_value_info(f"x{i}", TensorProto.FLOAT, [rows, 1, k]))
        outs.append(helper.make_tensor_value_info(f"y{i}", TensorProto.FLOAT, [rows, 1, n]))
    g = helper.make_graph(nodes, "gemv_copies", ins, outs, inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def rope_model(rows: int, copies: int, hidden: int = 2048, heads: int = 32, kv_heads: int = 8, d: int = 64,
               position: int = 5, seed: int = 5, weighted: bool = False) -> onnx.ModelProto:
    """`copies` decode-step QKV projections with the rotary embedding of q and k, as a Llama
    export writes them (q, k, v MatMuls of x_i, heads viewed, x·cos + rotate_half(x)·sin at
    one position), each rotated head summed over d so that nothing rotated is a graph output
    (passes/rotary_epilogue.py then makes the maps the merged GEMM's epilogue); `weighted`:
    each d weighted by a random factor first (tests: a misplaced partner changes the sum)."""
    rng = np.random.default_rng(seed)
    half = d // 2
    nodes, inits, outs = [], [], []
    count = [0]

    def const(a) -> str:
        count[0] += 1
        inits.append(numpy_helper.from_array(np.asarray(a), f"c{count[0]}"))
        return f"c{count[0]}"

    def node(op: str, inputs: list[str], **attrs) -> str:
        count[0] += 1
        nodes.append(helper.make_node(op, inputs, [f"{op.lower()}_{count[0]}"], **attrs))
        return f"{op.lower()}_{count[0]}"

    def ints(*v: int) -> str:
        return const(np.asarray(v, np.int64))

    inv = 1.0 / (10000.0 ** (np.arange(0, d, 2) / d))
    angles = np.concatenate([position * inv, position * inv]).astype(np.float32)[None, None, None, :]
    cos, sin = const(np.cos(angles)), const(np.sin(angles))

    def rotate(x: str) -> str:
        lo = node("Slice", [x, ints(0), ints(half), ints(-1)])
        hi = node("Slice", [x, ints(half), ints(d), ints(-1)])
        turned = node("Concat", [node("Neg", [hi]), lo], axis=-1)
        return node("Add", [node("Mul", [x, cos]), node("Mul", [turned, sin])])

    def linear(i: int, n: int) -> str:
        w = (rng.standard_normal((hidden, n), dtype=np.float32) / np.sqrt(hidden)).astype(np.float32)
        return node("MatMul", [f"x{i}", const(w)])

    for i in range(copies):
        q = node("Transpose", [node("Reshape", [linear(i, heads * d), ints(0, 0, heads, d)])], perm=[0, 2, 1, 3])
        k = node("Transpose", [node("Reshape", [linear(i, kv_heads * d), ints(0, 0, kv_heads, d)])], perm=[0, 2, 1, 3])
        v = node("Reshape", [linear(i, kv_heads * d), ints(0, 0, kv_heads, d)])
        for name, t, shape in (("q", rotate(q), [rows, heads, 1]), ("k", rotate(k), [rows, kv_heads, 1]),
                               ("v", v, [rows, 1, kv_heads])):
            if weighted and name != "v":   # v is not rotated (and weighted it becomes a GEMM of its own)
                t = node("Mul", [t, const(rng.standard_normal(d).astype(np.float32))])
            nodes.append(helper.make_node("ReduceSum", [t, ints(-1)], [f"{name}{i}"], keepdims=0))
            outs.append(helper.make_tensor_value_info(f"{name}{i}", TensorProto.FLOAT, shape))
    ins = [helper.make_tensor_value_info(f"x{i}", TensorProto.FLOAT, [rows, 1, hidden]) for i in range(copies)]
    g = helper.make_graph(nodes, "rope_copies", ins, outs, inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def ranked_gemv(model: onnx.ModelProto, top: int) -> list[dict]:
    """`top` gemv candidates of the model's first GEMM (planner.rank): the best predicted half,
    the other half spread over the rest of the ranking."""
    from aicfc.frontend.onnx_import import import_model
    from aicfc.passes.pipeline import Options, run_pipeline
    from aicfc.passes.plan_schedules import rank
    from aicfc.planner.hardware import load_profile
    hw = load_profile("sm_90")
    plan = run_pipeline(import_model(model, {}), Options("sm_90", hw, "fp16")).plan
    k = next(k for k in plan.kernels if k.family == "gemm")
    ranked, _ = rank(k, plan, hw)
    gemv = [dict(r.params) for r in ranked if r.params.get("unit") == "gemv"]
    # the best half of `top`, then the rest spread evenly over the ranking (for the refit)
    best, rest = gemv[:top - top // 2], gemv[top - top // 2:]
    step = max(1, len(rest) // max(1, top // 2))
    return best + rest[::step][:top // 2]


def timed_kernels(payload: dict, rotary: bool) -> list[int]:
    """Indices of the kernels to time: the projections (the rotary QKV ones for qkv_rope)."""
    from aicfc.passes.rotary_epilogue import ROTARY_RULE
    return [i for i, kk in enumerate(payload["kernels"]) if kk["family"] == "gemm"
            and (ROTARY_RULE in kk["rewrites"] if rotary else True)]


def _compile(job: tuple) -> dict:
    """One compile in a worker: (model path, pin) -> payload."""
    import aicfc
    path, pin = job
    return aicfc.compile(onnx.load(path), precision="fp16", pin=pin, target="sm_90")


def time_kernels(ex, indices: list[int]) -> float:
    """us per launch: every kernel of `indices` in turn, PER times, in one graph replay."""
    from aicf_run.graph import Graph
    stream = ex.stream

    def enqueue() -> None:
        for _ in range(PER):
            for i in indices:
                ex.launch_kernel(i)
    graph = Graph.capture(stream, enqueue)
    try:
        graph.upload(stream)
        start, stop = ex.events()
        t = events_median_us(lambda: graph.launch(stream), start, stop, REPS, 5, PER * len(indices), stream)
        ex.synchronize()
        return t
    finally:
        graph.close()


def copy_gbs() -> float:
    """Device-to-device copy of 1 GiB (bytes read + written) / the median of 20 timed copies."""
    import statistics
    import torch
    a = torch.empty(1 << 29, dtype=torch.float16, device="cuda")
    b = torch.empty_like(a)
    a.normal_()
    for _ in range(3):
        b.copy_(a)
    times = []
    for _ in range(20):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        b.copy_(a)
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop) * 1e3)
    del a, b
    torch.cuda.empty_cache()
    return 2 * (1 << 30) / statistics.median(times) / 1e3


def cublas_us(rows: int, k: int, n: int, copies: int) -> float:
    import torch
    x = torch.randn(rows, k, dtype=torch.float16, device="cuda")
    ws = [torch.randn(k, n, dtype=torch.float16, device="cuda") for _ in range(copies)]
    ys = [torch.empty(rows, n, dtype=torch.float16, device="cuda") for _ in range(copies)]

    def fn() -> None:
        for w, y in zip(ws, ys):
            torch.matmul(x, w, out=y)
    return torch_graph_us(fn, per=PER, reps=REPS) / copies


def check(ex, payload: dict, model: onnx.ModelProto, rows: int, k: int) -> float:
    """Max |y0 - ref| / max |ref| of the first copy's output against float64 numpy."""
    x = np.random.default_rng(9).standard_normal((rows, 1, k)).astype(np.float32)
    y = ex.run({f"x{i}": x for i in range(len(model.graph.input))})["y0"]
    w = numpy_helper.to_array(next(i for i in model.graph.initializer if i.name == "w0")).astype(np.float16)
    ref = x.astype(np.float16).astype(np.float64)[:, 0] @ w.astype(np.float64)
    return float(np.max(np.abs(y[:, 0] - ref)) / np.max(np.abs(ref))) if np.isfinite(y).all() else float("inf")


def bench(dev, pool, name: str, rows: int, k: int, n: int, top: int, bw: float, cands: list[dict]) -> list[dict]:
    from aicf_run.bundle import Bundle
    from aicf_run.executor import Executor
    rotary = name == "qkv_rope"
    copies = copies_for(k, n)
    build = (lambda c: rope_model(rows, c)) if rotary else (lambda c: plain_model(rows, k, n, c))
    pins = cands or ranked_gemv(build(1), top)
    model = build(copies)
    with tempfile.TemporaryDirectory() as tmp:
        path = str(Path(tmp) / "m.onnx")
        onnx.save(model, path)
        base = pool.submit(_compile, (path, None))
        payloads = list(pool.map(_compile, [(path, p) for p in pins]))
        base = base.result()
    theirs = cublas_us(rows, k, n, copies)
    out = []
    for label, payload in [("pick", base)] + [("gemv", p) for p in payloads]:
        idx = timed_kernels(payload, rotary)
        kern = payload["kernels"][idx[0]]
        ex = Executor(Bundle.from_payload(payload), dev)
        try:
            err = None if rotary else check(ex, payload, model, rows, k)
            us = time_kernels(ex, idx)
        finally:
            ex.close()
        pred = kern["predicted"]
        gbs = pred["bytes"] / us / 1e3
        row = {"shape": name, "rows": rows, "K": k, "N": n, "copies": copies, "which": label, "params": kern["params"],
               "measured_us": us, "gbs": gbs, "pct_copy": 100 * gbs / bw, "predicted_us": pred["time_us"],
               "meas_over_pred": us / pred["time_us"], "cublas_us": theirs, "cublas_gbs": pred["bytes"] / theirs / 1e3,
               "rel_err": err, "registers": kern["registers"], "terms": pred}
        out.append(row)
        p = kern["params"]
        desc = (f"gemv BN{p['BN']} W{p['WARPS']} U{p['U']} S{p['SPLITK']} CL{p.get('CL', 0)}" if p.get("unit") == "gemv"
                else " ".join(f"{a}={b}" for a, b in sorted(p.items())))
        bad = "" if err is None or err <= 1e-2 else f"  FAIL rel err {err:.1e}"
        print(f"  {name:8s} M{rows} {label:4s} {desc:34s} {us:7.2f} us {gbs:7.0f} GB/s {row['pct_copy']:5.1f}%  "
              f"pred {pred['time_us']:6.2f} ({row['meas_over_pred']:.2f}x)  cuBLAS {theirs:6.2f} us{bad}", flush=True)
    return out


def parse_cands(specs: list[str]) -> dict[str, list[dict]]:
    """`--cand SHAPE:KEY=VALUE,...` as {shape: [gemv pins]}: numbers as ints, words (kmajor=tc) as they are."""
    cands: dict[str, list[dict]] = {}
    for spec in specs:
        shape, _, rest = spec.partition(":")
        pin: dict = {"unit": "gemv"}
        for item in filter(None, rest.split(",")):
            key, _, value = item.partition("=")
            pin[key] = int(value) if value.lstrip("-").isdigit() else value
        cands.setdefault(shape, []).append(pin)
    return cands


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--shapes", nargs="+", default=[s for s, _, _ in SHAPES])
    ap.add_argument("--top", type=int, default=4, help="gemv candidates timed per shape (half the best predicted, "
                    "half spread over the rest); 6 took about 4.7 minutes on the H100 machine, 4 should take under 4")
    ap.add_argument("--cand", action="append", default=[], metavar="SHAPE:KEY=VALUE,...",
                    help="time these gemv pins for SHAPE instead of the planner's --top (repeatable)")
    ap.add_argument("--jobs", type=int, default=16)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    cands = parse_cands(args.cand)
    from aicf_run.device import open_device
    import multiprocessing
    dev = open_device(0)
    bw = copy_gbs()
    print(f"GPU: {dev.name} ({dev.arch}); device-to-device copy {bw:.0f} GB/s", flush=True)
    rows = []
    with ProcessPoolExecutor(args.jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
        for name, k, n in SHAPES:
            if name not in args.shapes:
                continue
            for m in args.rows:
                rows += bench(dev, pool, name, m, k, n, args.top, bw, cands.get(name, []))
    dev.close()
    print("summary: per shape, aicf's pick, the fastest gemv candidate measured, cuBLAS (us); "
          "'ok' when the pick is within 10% of that fastest")
    for key in dict.fromkeys((r["shape"], r["rows"]) for r in rows):
        case = [r for r in rows if (r["shape"], r["rows"]) == key]
        pick = next(r for r in case if r["which"] == "pick")
        best = min(case, key=lambda r: r["measured_us"])
        print(f"  {key[0]:8s} M{key[1]}  pick {pick['measured_us']:7.2f}  best {best['measured_us']:7.2f}  "
              f"cuBLAS {pick['cublas_us']:7.2f}  {'ok' if pick['measured_us'] <= 1.1 * best['measured_us'] else 'MISS'}")
    if args.json:
        args.json.write_text(json.dumps({"gpu": dev.name, "copy_gbs": bw, "rows": rows}, indent=1, default=float))
    return 1 if any(r["rel_err"] is not None and not r["rel_err"] <= 1e-2 for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
