"""Real models end to end: BERT-base, GPT-2 small, a Llama-architecture decoder and ResNet-50
exported by torch, compiled by
aicfc, run by aicf_run, against PyTorch eager and torch.compile on the same GPU, same process.

    source .gpu/env.sh && python3 benchmarks/models.py [--quick] [--json F] [--max-autotune]
    source .gpu/env.sh && python3 benchmarks/models.py --cases bert:8x512,gpt2:1x128,resnet50:32
    python3 benchmarks/models.py --tiny --no-gpu        # CPU: export and compile small configs only

Cases are MODEL:BATCHxSEQ for the transformers (bert, gpt2, llama) and MODEL:BATCH for the CNNs
(resnet50, and torchvision's mobilenet_v2 and efficientnet_b0, timed on request);
the default is BERT-base and GPT-2 small at B8 S512 and B1 S128, the Llama at B1 S512 and B8
S512, ResNet-50 at B1 and B32. The Llama is transformers' LlamaModel(LlamaConfig(hidden 1024,
16 layers, 16 heads over 4 key/value heads, intermediate 2816, vocabulary 32000)): 0.21 B
parameters, grouped-query attention, RoPE, SwiGLU and RMSNorm as Llama, Qwen2 and Mistral
have them.
For each case the model is built with random weights (transformers' BertModel(BertConfig()) and
GPT2Model(GPT2Config()): BERT-base and GPT-2 small, every parameter drawn at random as in a
trained checkpoint; torchvision's resnet50()), exported by
torch.onnx.export (the default, dynamo exporter, opset 18) in float32 at the case's static shape,
and compiled by aicfc at fp16 (`precision="fp16"`: fp16 storage and tensor cores, fp32
accumulation). Timed, every one the same way: CUDA events around each call, the median of
REPS calls after warm-up, the same inputs already on the device:
  - aicf: the compiled plan (`Executor.launch()`: one CUDA graph replay);
  - ro: torch.compile(mode="reduce-overhead") of the torch module in fp16, the peer that
    matters: inductor's kernels replayed as CUDA graphs (cudagraph trees). Called once to
    compile, WARM_CALLS more times so that its graphs are recorded and replayed, then timed;
    each call is preceded by torch.compiler.cudagraph_mark_step_begin() (its outputs are
    overwritten by the next replay: the output checked is cloned first). `x ro` = ro / aicf
    time is the headline column (> 1: aicf faster). A nonzero `ro_cudagraph_skips` in the JSON
    means inductor fell back to launching without graphs, and the row says so;
  - max-autotune (with --max-autotune): torch.compile(mode="max-autotune"), likewise;
  - eager: the torch module in fp16 under inference_mode;
  - compile: torch.compile of that module (default mode), after its compilation.
Between compile modes and between cases torch._dynamo is reset (compile caches and cudagraph
trees) and the CUDA caching allocator emptied, so one's caches do not affect the next.
The check: aicf's output against the fp32 torch module on the same inputs, max|y - ref| /
max|ref| <= 1e-2 (torch's fp16 errors, eager and compiled, are printed beside it). Transformers
take random token ids (batch, seq); ResNet-50 random images (batch, 3, 224, 224).
--json F writes every row (after each case, so a crash keeps the rows before it).
"""
from __future__ import annotations

import argparse
import gc
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.timing import median_us, run_and_time  # noqa: E402

CNNS = ("resnet50", "mobilenet_v2", "efficientnet_b0")
MODELS = ("bert", "gpt2", "llama") + CNNS
TRANSFORMERS = ("bert", "gpt2", "llama")
# BertConfig().max_position_embeddings, GPT2Config().n_positions, LLAMA's max_position_embeddings
MAX_SEQ = {"bert": 512, "gpt2": 1024, "llama": 2048}
VOCAB = {"bert": 30000, "gpt2": 50000, "llama": 32000}   # token ids drawn below these
LLAMA = dict(hidden_size=1024, num_hidden_layers=16, num_attention_heads=16, num_key_value_heads=4,
             intermediate_size=2816, vocab_size=32000, max_position_embeddings=2048)
LLAMA_TINY = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                  intermediate_size=128, vocab_size=1000, max_position_embeddings=2048)
CASES = [("bert", 8, 512), ("bert", 1, 128), ("gpt2", 8, 512), ("gpt2", 1, 128), ("llama", 1, 512), ("llama", 8, 512),
         ("resnet50", 1, 0), ("resnet50", 32, 0)]
QUICK = [("bert", 1, 128), ("gpt2", 1, 128), ("resnet50", 1, 0)]
REPS = 50
TOL = 1e-2
WARM_CALLS = 5   # after the compiling call: cudagraph trees warm up, record, then replay
# torch.compile modes timed, by the prefix of their row keys (compile_ms, ro_ms, ma_ms, ...)
PEERS = {"default": "compile", "reduce-overhead": "ro", "max-autotune": "ma"}
CUDAGRAPH_MODES = ("reduce-overhead", "max-autotune")   # inductor's modes that use CUDA graphs


def parse_cases(spec: str) -> list[tuple[str, int, int]]:
    """'bert:8x512,gpt2:1x128,resnet50:32' -> [(model, batch, seq)], seq 0 for resnet50.

    A transformer given without a sequence length (bert:8) takes the standard case's of that
    batch (CASES); ValueError for anything else malformed. Duplicates are dropped, order kept."""
    out: list[tuple[str, int, int]] = []
    for item in spec.split(","):
        item = item.strip()
        if not item:
            continue
        name, sep, rest = item.partition(":")
        name = name.strip().lower()
        if name not in MODELS:
            raise ValueError(f"case {item!r}: model {name!r} is not one of {', '.join(MODELS)}")
        b, x, q = rest.strip().lower().partition("x")
        if not sep or not b.isdigit() or int(b) < 1 or (x and (not q.isdigit() or int(q) < 1)):
            raise ValueError(f"case {item!r}: expected MODEL:BATCHxSEQ (transformers) or MODEL:BATCH "
                             f"(resnet50), e.g. bert:8x512, resnet50:32")
        batch = int(b)
        if name in CNNS:
            if x:
                raise ValueError(f"case {item!r}: {name} takes no sequence length ({name}:BATCH)")
            seq = 0
        elif x:
            seq = int(q)
        else:
            std = [c[2] for c in CASES if c[0] == name and c[1] == batch]
            if not std:
                raise ValueError(f"case {item!r}: no standard sequence length for {name} batch {batch}; "
                                 f"give one, e.g. {name}:{batch}x128")
            seq = std[0]
        if name in MAX_SEQ and seq > MAX_SEQ[name]:
            raise ValueError(f"case {item!r}: {name} has {MAX_SEQ[name]} positions, sequence {seq} is longer")
        if (name, batch, seq) not in out:
            out.append((name, batch, seq))
    if not out:
        raise ValueError(f"no cases in {spec!r}")
    return out


def format_case(case: tuple[str, int, int]) -> str:
    """The inverse of parse_cases for one case: ('bert', 8, 512) -> 'bert:8x512'."""
    name, batch, seq = case
    return f"{name}:{batch}x{seq}" if seq else f"{name}:{batch}"


def select_cases(args) -> list[tuple[str, int, int]]:
    """--cases and --case (repeatable, same syntax) if given, else --quick's or the default;
    then --only's models."""
    specs = ([args.cases] if args.cases else []) + (args.case or [])
    if specs:
        cases: list[tuple[str, int, int]] = []
        for c in parse_cases(",".join(specs)):
            if c not in cases:
                cases.append(c)
    else:
        cases = list(QUICK if args.quick else CASES)
    if args.only:
        only = [m.strip() for m in args.only.split(",") if m.strip()]
        unknown = [m for m in only if m not in MODELS]
        if unknown:
            raise ValueError(f"--only {args.only!r}: {', '.join(unknown)} not among {', '.join(MODELS)}")
        cases = [c for c in cases if c[0] in only]
    return cases


def peer_modes(max_autotune: bool) -> list[str]:
    return ["default", "reduce-overhead"] + (["max-autotune"] if max_autotune else [])


def ratio(peer_us: float | None, aicf_us: float | None) -> float | None:
    """peer time / aicf time (> 1: aicf faster); None when either is missing or aicf's is not > 0."""
    if peer_us is None or aicf_us is None or not aicf_us > 0:
        return None
    return peer_us / aicf_us


def finish_row(row: dict, aicf_us: float, aicf_err: float, eager_us: float, eager_err: float,
               peers: dict[str, dict]) -> dict:
    """Fill a case's row with its timings (us in, ms in the row) and errors. `peers` maps a
    torch.compile mode (PEERS) to {"us", "err", "build_s", "cudagraph_skips"}, or {"error"}
    when that mode failed (its figures are then None)."""
    row.update({"aicf_ms": aicf_us / 1e3, "aicf_err": aicf_err,
                "eager_ms": eager_us / 1e3, "vs_eager": ratio(eager_us, aicf_us), "eager_err": eager_err})
    for mode, r in peers.items():
        p = PEERS[mode]
        us = r.get("us")
        row.update({f"{p}_ms": None if us is None else us / 1e3, f"vs_{p}": ratio(us, aicf_us),
                    f"{p}_err": r.get("err"), f"{p}_build_s": r.get("build_s"),
                    f"{p}_cudagraph_skips": r.get("cudagraph_skips")})
        if "error" in r:
            row[f"{p}_error"] = r["error"]
    return row


def rel_err(y: np.ndarray, ref: np.ndarray) -> float:
    """max|y - ref| / max|ref| in float64; NaN if y has a NaN (never within a tolerance)."""
    diff = np.abs(np.asarray(y, dtype=np.float64) - ref)
    if np.isnan(diff).any():
        return float("nan")
    return float(diff.max() / np.abs(ref).max())


def randomize(module, scale: float, seed: int = 0) -> None:
    """Every parameter of `module` drawn at random, as a trained checkpoint has them: N(0,
    scale²), 1-D weights (norm scales) around 1. No zero biases or unit norm scales, which the
    exporter would deduplicate into one shared constant (a graph unlike a real model's)."""
    import torch
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * scale + (1.0 if p.dim() == 1 and "weight" in name else 0.0))


def calibrate_batchnorm(model, seed: int = 0):
    """`model` in eval mode with every BatchNorm's statistics measured on one random batch, as a
    trained network has them. torchvision's initial statistics (mean 0, variance 1) shrink the
    activations layer after layer in MobileNetV2 and EfficientNet-B0: their outputs are 1e-9 and
    1e-14, which fp16 flushes to zero in every runtime (torch's own fp16 included), so no fp16
    result could be checked against fp32. After this: outputs near 0.4."""
    import torch
    for bn in model.modules():
        if isinstance(bn, torch.nn.modules.batchnorm._BatchNorm):
            bn.reset_running_stats()
            bn.momentum = None          # a cumulative average: exactly this batch's statistics
    model.train()
    with torch.no_grad():
        model(torch.randn(8, 3, 224, 224, generator=torch.Generator().manual_seed(seed)))
    return model.eval()


def build(name: str, tiny: bool):
    """The torch module (fp32, eval) returning one tensor."""
    import torch
    if name in CNNS:
        import torchvision
        if tiny and name == "resnet50":
            return torchvision.models.resnet18().eval()
        model = getattr(torchvision.models, name)()      # MobileNetV2, EfficientNet-B0: small already
        return model.eval() if name == "resnet50" else calibrate_batchnorm(model)
    import transformers as tf
    if name == "bert":
        cfg = tf.BertConfig(**(dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                    intermediate_size=256) if tiny else {}))
        inner = tf.BertModel(cfg, add_pooling_layer=False)
    elif name == "llama":
        inner = tf.LlamaModel(tf.LlamaConfig(**(LLAMA_TINY if tiny else LLAMA)))
    else:
        cfg = tf.GPT2Config(**(dict(n_embd=64, n_layer=2, n_head=4) if tiny else {}))
        inner = tf.GPT2Model(cfg)

    randomize(inner, 0.02)

    class LastHidden(torch.nn.Module):
        def __init__(self, m):
            super().__init__()
            self.m = m

        def forward(self, input_ids):
            return self.m(input_ids=input_ids, return_dict=False)[0]
    return LastHidden(inner.eval()).eval()


def make_inputs(name: str, batch: int, seq: int, rng: np.random.Generator, tiny: bool = False) -> dict[str, np.ndarray]:
    if name in CNNS:
        return {"x": rng.standard_normal((batch, 3, 224, 224)).astype(np.float32)}
    vocab = LLAMA_TINY["vocab_size"] if tiny and name == "llama" else VOCAB[name]
    return {"input_ids": rng.integers(0, vocab, (batch, seq)).astype(np.int64)}


def export(model, inputs: dict[str, np.ndarray], path: Path) -> float:
    import torch
    t = time.perf_counter()
    args = tuple(torch.from_numpy(v) for v in inputs.values())
    with torch.no_grad():
        torch.onnx.export(model, args, str(path), input_names=list(inputs), output_names=["y"],
                          opset_version=18, dynamo=True, external_data=False)
    return time.perf_counter() - t


def cudagraph_skips() -> int:
    """Inductor's count of graphs it ran without CUDA graphs (0 if torch keeps no such count)."""
    try:
        from torch._dynamo.utils import counters
        return int(counters["inductor"]["cudagraph_skips"])
    except Exception:
        return 0


def release_torch() -> None:
    """Forget every torch.compile cache and cudagraph tree, and free cached GPU memory."""
    try:
        import torch
        import torch._dynamo
    except ImportError:
        return
    torch._dynamo.reset()
    try:   # torch._dynamo.reset() does this too in recent versions
        from torch._inductor.cudagraph_trees import reset_cudagraph_trees
        reset_cudagraph_trees()
    except Exception:
        pass
    gc.collect()
    if torch.cuda.is_initialized():
        torch.cuda.synchronize()
        torch.cuda.empty_cache()


def time_compiled(module, args: list, mode: str, ref: np.ndarray, reps: int) -> dict:
    """torch.compile(module, mode) on `args`: compiled by its first call, WARM_CALLS more
    calls, its output (cloned) checked against `ref`, then the median of `reps` calls between
    CUDA events. CUDA-graph modes mark a new step before each call, as torch asks when a
    replay's outputs are not kept."""
    import torch
    release_torch()
    skips0 = cudagraph_skips()
    compiled = [torch.compile(module, mode=None if mode == "default" else mode)]   # cleared to free it
    step = torch.compiler.cudagraph_mark_step_begin if mode in CUDAGRAPH_MODES else None

    def call():
        if step is not None:
            step()
        return compiled[0](*args)
    sync = torch.cuda.synchronize
    t = time.perf_counter()
    call()
    sync()
    build_s = time.perf_counter() - t
    for _ in range(WARM_CALLS):
        call()
    y = call().detach().clone()   # the next replay overwrites a cudagraph output
    sync()
    err = rel_err(y.double().cpu().numpy(), ref)
    del y
    us = median_us(call, sync, lambda: torch.cuda.Event(enable_timing=True), reps)
    skips = cudagraph_skips() - skips0
    compiled.clear()
    release_torch()
    return {"us": us, "err": err, "build_s": build_s, "cudagraph_skips": skips}


def bench_case(dev, name: str, batch: int, seq: int, tiny: bool, work: Path, modes: list[str] | None = None,
               reps: int = REPS, profile: str | None = None) -> dict:
    import torch
    import aicfc
    modes = peer_modes(False) if modes is None else modes
    rng = np.random.default_rng(batch * 1000 + seq)
    torch.manual_seed(0)
    model = build(name, tiny)
    inputs = make_inputs(name, batch, seq, rng, tiny)
    path = work / f"{name}_b{batch}_s{seq}.onnx"
    t_export = export(model, inputs, path)
    t = time.perf_counter()
    payload = aicfc.compile(str(path), target=dev.arch if dev else "sm_90", precision="fp16",
                            profile_path=profile)
    t_compile = time.perf_counter() - t
    path.unlink(missing_ok=True)
    row = {"model": name, "batch": batch, "seq": seq, "tiny": tiny, "kernels": len(payload["kernels"]),
           "export_s": t_export, "compile_s": t_compile}
    if dev is None:
        return row
    y, t_aicf = run_and_time(payload, dev, inputs, reps)
    y = y["y"]
    del payload
    args32 = [torch.from_numpy(v).cuda() for v in inputs.values()]
    m32 = model.cuda()
    with torch.inference_mode():
        ref = m32(*args32).double().cpu().numpy()
    m16 = model.half()   # in place: m32 is the same module, now fp16
    del m32
    args16 = [a.half() if a.is_floating_point() else a for a in args32]
    sync = torch.cuda.synchronize

    def event():
        return torch.cuda.Event(enable_timing=True)
    peers = {}
    with torch.inference_mode():
        y_eager = m16(*args16).double().cpu().numpy()
        t_eager = median_us(lambda: m16(*args16), sync, event, reps)
        for mode in modes:
            try:
                peers[mode] = time_compiled(m16, args16, mode, ref, reps)
            except Exception as e:   # a peer that fails is noted in the row; aicf's figures stand
                peers[mode] = {"error": f"{type(e).__name__}: {' '.join(str(e).split())[:300]}"}
                release_torch()
    return finish_row(row, t_aicf, rel_err(y, ref), t_eager, rel_err(y_eager, ref), peers)


def _num(r: dict, key: str, width: int, prec: int = 2, spec: str = "f") -> str:
    v = r.get(key)
    return f"{v:>{width}.{prec}{spec}}" if isinstance(v, (int, float)) and v is not None else f"{'-':>{width}}"


def header(max_autotune: bool) -> str:
    ma = f" {'ma ms':>8} {'x ma':>6}" if max_autotune else ""
    return (f"{'model':<9} {'batch':>5} {'seq':>4} {'kernels':>7} {'aicf ms':>8} {'ro ms':>8} {'x ro':>6}{ma} "
            f"{'eager ms':>9} {'compile ms':>10} {'x eager':>7} {'x compile':>9} {'err':>8} {'ro err':>8} "
            f"{'eager err':>9} {'export s':>8} {'aicfc s':>7} {'ro build s':>10}")


def format_row(r: dict, max_autotune: bool) -> str:
    ma = f" {_num(r, 'ma_ms', 8, 3)} {_num(r, 'vs_ma', 6)}" if max_autotune else ""
    line = (f"{r['model']:<9} {r['batch']:>5} {r['seq'] or '':>4} {r['kernels']:>7} {_num(r, 'aicf_ms', 8, 3)} "
            f"{_num(r, 'ro_ms', 8, 3)} {_num(r, 'vs_ro', 6)}{ma} {_num(r, 'eager_ms', 9, 3)} "
            f"{_num(r, 'compile_ms', 10, 3)} {_num(r, 'vs_eager', 7)} {_num(r, 'vs_compile', 9)} "
            f"{_num(r, 'aicf_err', 8, 1, 'e')} {_num(r, 'ro_err', 8, 1, 'e')} {_num(r, 'eager_err', 9, 1, 'e')} "
            f"{r['export_s']:>8.1f} {r['compile_s']:>7.1f} {_num(r, 'ro_build_s', 10, 1)}")
    skipped = [f"{p}: {r[f'{p}_cudagraph_skips']}" for p in ("ro", "ma") if r.get(f"{p}_cudagraph_skips")]
    if skipped:
        line += "  (inductor skipped CUDA graphs, " + ", ".join(skipped) + ")"
    failed = [f"{p} failed: {r[f'{p}_error']}" for p in PEERS.values() if r.get(f"{p}_error")]
    if failed:
        line += "  (" + "; ".join(failed) + ")"
    return line


def json_doc(gpu: str | None, rows: list[dict], failures: list[str], cases: list, max_autotune: bool,
             reps: int, versions: dict | None = None) -> dict:
    """What --json writes."""
    return {"gpu": gpu, "versions": versions or {}, "precision": "fp16", "reps": reps, "tol": TOL,
            "cases": [format_case(c) for c in cases], "peers": [PEERS[m] for m in peer_modes(max_autotune)],
            "timing": "CUDA events around each call, median of `reps` after warm-up, inputs on the device; "
                      "vs_X = X time / aicf time",
            "rows": rows, "failures": failures}


def versions() -> dict:
    out = {}
    for mod in ("torch", "transformers", "torchvision", "onnx", "onnxscript"):
        try:
            out[mod] = __import__(mod).__version__
        except Exception:
            pass
    return out


def gpu_profile(name: str | None) -> str | None:
    """The bundled aicfc profile (aicfc/profiles/gpus/) whose name the GPU's name contains, if any."""
    from aicfc.planner.hardware import gpus
    return next((g for g in gpus() if name and g.lower() in name.lower()), None)


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="batch 1 only")
    ap.add_argument("--only", help="comma-separated models out of " + ", ".join(MODELS))
    ap.add_argument("--cases", help="comma-separated MODEL:BATCHxSEQ or resnet50:BATCH, e.g. "
                    "bert:8x512,gpt2:1x128,resnet50:32 (default: " + ",".join(map(format_case, CASES)) + ")")
    ap.add_argument("--case", action="append", help="one more case, as in --cases (repeatable; MODEL:BATCH "
                    "takes the standard sequence length)")
    ap.add_argument("--max-autotune", action="store_true",
                    help="also time torch.compile(mode='max-autotune') (long compiles)")
    ap.add_argument("--reps", type=int, default=REPS, help=f"timed calls per side (median; {REPS})")
    ap.add_argument("--tiny", action="store_true", help="small configs (2 layers, hidden 64; ResNet-18)")
    ap.add_argument("--no-gpu", action="store_true", help="export and compile only")
    ap.add_argument("--json", type=Path, help="also write the rows as JSON")
    ap.add_argument("--profile", help="aicfc's hardware profile: a file from `aicfc tune` or a bundled GPU's "
                                      "(h200) [default: the bundled profile of the GPU it runs on, if there is one, "
                                      "else the target's]")
    return ap


def main(argv: list[str] | None = None) -> int:
    ap = build_parser()
    args = ap.parse_args(argv)
    try:
        cases = select_cases(args)
    except ValueError as e:
        ap.error(str(e))
    if args.reps < 1:
        ap.error("--reps must be >= 1")
    modes = peer_modes(args.max_autotune)
    dev = None
    if not args.no_gpu:
        from aicf_run.device import open_device
        dev = open_device(0)
        print(f"GPU: {dev.name} ({dev.arch}); fp16; medians of {args.reps} after warm-up; "
              f"x PEER = PEER time / aicf time; ro = torch.compile(mode='reduce-overhead')", flush=True)
    gpu = dev.name if dev else None
    profile = args.profile or gpu_profile(gpu)
    if profile:
        print(f"aicfc plans with --profile {profile}", flush=True)
    vers = versions() if args.json else {}
    print(header(args.max_autotune), flush=True)
    rows, bad = [], []
    with tempfile.TemporaryDirectory(prefix="aicf-models-") as tmp:
        for name, batch, seq in cases:
            try:
                r = bench_case(dev, name, batch, seq, args.tiny, Path(tmp), modes, args.reps, profile)
            except Exception as e:   # report and go on: one model's failure is a row, not the end
                bad.append(f"{name} b{batch} s{seq}: {type(e).__name__}: {' '.join(str(e).split())[:300]}")
                print(f"{name:<9} {batch:>5} {seq:>4} FAILED {bad[-1]}", flush=True)
                r = None
            finally:
                release_torch()   # one model's compile caches and memory do not reach the next
            if r is not None:
                rows.append(r)
                print(format_row(r, args.max_autotune), flush=True)
                if "aicf_err" in r and not r["aicf_err"] <= TOL:
                    bad.append(f"{name} b{batch} s{seq}: rel err {r['aicf_err']:.2e} > {TOL}")
            if args.json:
                args.json.write_text(json.dumps(json_doc(gpu, rows, bad, cases, args.max_autotune, args.reps, vers),
                                                indent=1))
    if dev is not None:
        dev.close()
    if bad:
        print("FAILURES:\n  " + "\n  ".join(bad))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
