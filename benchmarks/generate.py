"""Token generation: aicf against transformers' `generate` (StaticCache, torch.compile
"reduce-overhead") in one process on one GPU, and against the bandwidth limit (issue 19).

    python3 benchmarks/generate.py [--layers 20] [--batch 1 8] [--prompt 512] [--new 256]
        [--folder /tmp/aicf-gen] [--jobs 16] [--no-peer] [--profile] [--json FILE] [--no-pdl] [--pin KEY=VALUE]

The model is a Llama architecture with random weights (benchmarks/decoder_graph.py): hidden
2048, 32 heads over 8 key/value heads, FFN 5632, vocabulary 32000, `--layers` layers (20: 1.03
B parameters), a cache of prompt + new slots; its ONNX (the cache as explicit inputs and
outputs, external data) is compiled at fp16 with a prefill plan (S = prompt) and a decode plan
(S = 1) per batch, the cache as state. transformers gets the same weights (LlamaForCausalLM,
fp16, `cache_implementation="static"`, its forward compiled with mode="reduce-overhead").

Both sides are timed the same way, wall-clock around whole `generate` calls that end with the
GPU idle: time to first token = a 1-token generation; decode = (t(new) - t(1)) / (new - 1) per
step; medians of 3 runs after warm-up runs of both lengths. aicf's greedy tokens are chosen on
the device ([Note: greedy feed]); the host path (logits back and argmax on the host every step)
is timed too, as `host greedy`. The bandwidth limit: the bytes one
decode step must read (every weight but the embedding table, which is read by row, plus the
live K/V cache at the mean length, prompt + new / 2) over the copy bandwidth measured here
(a device-to-device copy of 2 GiB, bytes read + written per second). `--profile` also times
every kernel of the decode plan alone (measured / predicted).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.external_data import ExternalData  # noqa: E402
from benchmarks.decoder_graph import DecoderConfig, cache_names, decoder_model, random_weight, weight_shapes  # noqa: E402

def build(folder: Path, cfg: DecoderConfig, weights: dict[str, np.ndarray]) -> Path:
    """model.onnx (batch symbolic) + model.onnx.data in `folder`."""
    folder.mkdir(parents=True, exist_ok=True)
    with ExternalData(folder / "model.onnx.data") as ext:
        model = decoder_model(cfg, lambda n: weights[n], batch="batch", store=ext.store)
    path = folder / "model.onnx"
    path.write_bytes(model.SerializeToString())
    return path


def shape_set(cfg: DecoderConfig, batch: int, seq: int) -> dict[str, tuple[int, ...]]:
    shapes = {"input_ids": (batch, seq), "cache_position": (seq,)}
    return shapes | {n: cfg.cache_shape(batch) for n, _ in cache_names(cfg)}


def timed(fn, reps: int = 3) -> float:
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def copy_bandwidth_gbs() -> float:
    import torch
    a = torch.empty(2 << 30, dtype=torch.uint8, device="cuda")
    b = torch.empty_like(a)
    for _ in range(3):
        b.copy_(a)
    torch.cuda.synchronize()
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    ms = []
    for _ in range(10):
        start.record()
        b.copy_(a)
        stop.record()
        stop.synchronize()
        ms.append(start.elapsed_time(stop))
    del a, b
    return 2 * (2 << 30) / (statistics.median(ms) * 1e-3) / 1e9


def step_bytes(cfg: DecoderConfig, batch: int, live: float) -> float:
    """What one decode step must read: the weights (the embedding only by row) and the cache."""
    weights = 2 * (cfg.parameters - cfg.vocab * cfg.hidden)
    cache = batch * cfg.layers * 2 * cfg.kv_heads * cfg.head_dim * 2 * live
    return weights + cache


def aicf_side(path: Path, cfg: DecoderConfig, batch: int, prompt: np.ndarray, new: int, profile: bool) -> dict:
    import aicf_run
    model = aicf_run.load(path)
    try:
        model.generate(prompt, 4)
        model.generate(prompt, 1)
        t1 = timed(lambda: model.generate(prompt, 1))
        tn = timed(lambda: model.generate(prompt, new))
        result = model.generate(prompt, new)
        # the host path ([Note: generation]): every step's logits back and argmax on the host
        model.generate(prompt, 4, device_greedy=False)
        th = timed(lambda: model.generate(prompt, new, device_greedy=False))
        host = model.generate(prompt, new, device_greedy=False)
        decode_plan = next(i for i, p in enumerate(model.plans) if p.shapes["input_ids"][1] == 1)
        replay = model.bench(50, graph=True, plan=decode_plan)
        out = {"ttft_ms": 1e3 * t1, "step_ms": 1e3 * (tn - t1) / (new - 1),
               "host_greedy_step_ms": 1e3 * (th - t1) / (new - 1),
               "device_equals_host": bool((result.tokens == host.tokens).all()),
               "internal": {k: v for k, v in result.as_dict().items() if k != "tokens"},
               "tokens": result.tokens[:, :32].tolist(),
               "decode_plan_replay_us": replay.graph.median_us}
        if profile:
            report = model.profile(plan=decode_plan)
            out["decode_profile"] = report.as_dict()
            from aicf_run.profile import format_profile
            print(format_profile(report))
        return out
    finally:
        model.device.close()


def peer_side(cfg: DecoderConfig, weights: dict[str, np.ndarray], prompt: np.ndarray, new: int) -> dict:
    import torch
    import transformers as tf
    config = tf.LlamaConfig(vocab_size=cfg.vocab, hidden_size=cfg.hidden, intermediate_size=cfg.ffn,
                            num_hidden_layers=cfg.layers, num_attention_heads=cfg.heads,
                            num_key_value_heads=cfg.kv_heads, max_position_embeddings=cfg.slots,
                            rms_norm_eps=cfg.eps, rope_theta=cfg.theta, tie_word_embeddings=False)
    with torch.device("meta"):
        m = tf.LlamaForCausalLM(config)
    m = m.to_empty(device="cuda").to(torch.float16)
    state = {k: torch.from_numpy(v).to("cuda", torch.float16) for k, v in weights.items()}
    missing, unexpected = m.load_state_dict(state, strict=False)
    assert not unexpected and all("rotary" in k for k in missing), (missing, unexpected)
    m.model.rotary_emb.inv_freq = (1.0 / (cfg.theta ** (torch.arange(0, cfg.head_dim, 2, dtype=torch.float32)
                                                         / cfg.head_dim))).cuda()
    m.eval()
    # transformers' own route: with a static cache, generate compiles the decoding forward
    # itself (CompileConfig; CUDA graphs through mode="reduce-overhead")
    m.generation_config.cache_implementation = "static"
    m.generation_config.compile_config = tf.CompileConfig(fullgraph=True, mode="reduce-overhead")
    ids = torch.from_numpy(prompt).cuda()
    mask = torch.ones_like(ids)

    def run(n: int):
        with torch.no_grad():
            out = m.generate(ids, attention_mask=mask, max_new_tokens=n, min_new_tokens=n, do_sample=False,
                             pad_token_id=0, eos_token_id=None)
        torch.cuda.synchronize()
        return out
    start = time.perf_counter()
    run(new)
    run(1)
    warm = time.perf_counter() - start
    run(new)
    t1 = timed(lambda: run(1))
    tn = timed(lambda: run(new))
    tokens = run(new)[:, prompt.shape[1]:].cpu().numpy()
    compiled = getattr(m, "_compiled_call", None) is not None
    return {"ttft_ms": 1e3 * t1, "step_ms": 1e3 * (tn - t1) / (new - 1), "warmup_s": warm,
            "compiled_decoding": compiled, "tokens": tokens[:, :32].tolist()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--layers", type=int, default=20)
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--new", type=int, default=256)
    ap.add_argument("--folder", default="/tmp/aicf-gen")
    ap.add_argument("--jobs", type=int, default=16)
    ap.add_argument("--no-peer", action="store_true")
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--json", default=None)
    ap.add_argument("--no-pdl", action="store_true", help="compile with aicfc compile --no-pdl (plain launches)")
    ap.add_argument("--pin", action="append", default=[], metavar="KEY=VALUE",
                    help="restrict the schedules as aicfc compile --pin does (an A/B's other side)")
    ap.add_argument("--compile-only", action="store_true", help="build the model and compile its bundles, then stop")
    ap.add_argument("--reuse", action="store_true", help="use the bundles already in --folder (an earlier "
                    "--compile-only with the same options) instead of compiling")
    args = ap.parse_args()
    cfg = DecoderConfig(2048, args.layers, 32, 8, 5632, 32000, args.prompt + args.new)
    folder = Path(args.folder)
    rng = np.random.default_rng(0)
    start = time.perf_counter()
    weights = {n: random_weight(n, s, rng) for n, s in weight_shapes(cfg).items()}
    path = folder / "model.onnx" if args.reuse else build(folder, cfg, weights)
    print(f"model: {cfg.parameters / 1e9:.2f} B parameters, {args.layers} layers, cache {cfg.slots} slots; "
          f"built in {time.perf_counter() - start:.0f} s", flush=True)
    from aicfc.artifact import write_bundle
    from aicfc.driver import compile_plans
    bw = None if args.compile_only else copy_bandwidth_gbs()
    if bw is not None:
        print(f"copy bandwidth: {bw:.0f} GB/s (read + write)", flush=True)
    results = {"config": cfg.__dict__, "parameters": cfg.parameters, "copy_bandwidth_gbs": bw, "runs": []}
    for batch in args.batch:
        start = time.perf_counter()
        bundle = folder / f"model_b{batch}.aicf"
        if args.reuse and bundle.is_file():
            print(f"B{batch}: the bundle compiled earlier, {bundle}", flush=True)
            compiled = float("nan")
        else:
            payload = compile_plans(str(path), [shape_set(cfg, batch, args.prompt), shape_set(cfg, batch, 1)],
                                    precision="fp16", jobs=args.jobs, dependent_launch=not args.no_pdl,
                                    pin=dict(x.split("=", 1) for x in args.pin) or None)
            write_bundle(payload, bundle)
            del payload
            compiled = time.perf_counter() - start
            print(f"B{batch}: compiled 2 plans in {compiled:.0f} s", flush=True)
        if args.compile_only:
            continue
        assert bw is not None
        prompt = np.random.default_rng(batch).integers(0, cfg.vocab, (batch, args.prompt)).astype(np.int64)
        ours = aicf_side(bundle, cfg, batch, prompt, args.new, args.profile)
        row = {"batch": batch, "compile_s": compiled, "aicf": ours}
        live = args.prompt + args.new / 2
        limit_step_ms = step_bytes(cfg, batch, live) / (bw * 1e9) * 1e3
        row["bandwidth_limit_step_ms"] = limit_step_ms
        print(f"B{batch} P{args.prompt} +{args.new}: aicf TTFT {ours['ttft_ms']:.2f} ms, step {ours['step_ms']:.3f} ms "
              f"(greedy on the device), host greedy step {ours['host_greedy_step_ms']:.3f} ms, decode plan replay "
              f"{ours['decode_plan_replay_us'] / 1e3:.3f} ms", flush=True)
        if not args.no_peer:
            peer = peer_side(cfg, weights, prompt, args.new)
            row["peer"] = peer
            agree = [int(np.argmin(np.append(np.asarray(a) == np.asarray(b), False)))
                     for a, b in zip(ours["tokens"], peer["tokens"])]
            row["greedy_agreement_first_32"] = agree
        results["runs"].append(row)
        line = (f"B{batch} P{args.prompt} +{args.new}: aicf TTFT {ours['ttft_ms']:.2f} ms, step {ours['step_ms']:.3f} ms "
                f"({1e3 / ours['step_ms']:.0f} tok/s per sequence; greedy on the device; host greedy "
                f"{ours['host_greedy_step_ms']:.3f} ms, decode plan replay {ours['decode_plan_replay_us'] / 1e3:.3f} ms, "
                f"device tokens == host tokens: {ours['device_equals_host']}); bandwidth limit step "
                f"{limit_step_ms:.3f} ms -> {100 * limit_step_ms / ours['step_ms']:.0f}% of it")
        if "peer" in row:
            p = row["peer"]
            line += (f"; transformers+compile TTFT {p['ttft_ms']:.2f} ms, step {p['step_ms']:.3f} ms: "
                     f"TTFT {p['ttft_ms'] / ours['ttft_ms']:.2f}x, decode {p['step_ms'] / ours['step_ms']:.2f}x; "
                     f"greedy agreement (first 32) {row['greedy_agreement_first_32']}")
        print(line, flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2, default=str))


if __name__ == "__main__":
    main()
