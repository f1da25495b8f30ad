"""A ~1 B-parameter Llama graph with external data, compiled by `aicfc compile`: peak memory.

    python3 benchmarks/big_model.py [--folder /tmp/aicf-big] [--layers 22] [--precision fp16]
        [--jobs 2] [--keep] [--json F]

Builds the exporter's Llama graph (tests/llama_graph.py; hidden 2048, 32 heads over 8 key/value
heads, intermediate 5632, vocabulary 32000, 128 tokens, `--layers` decoder layers: 22 is about
TinyLlama's 1.0 B parameters without its LM head, 4.1 GB at fp32) with random fp32 weights,
each written to `model.onnx.data` as it is made (never all in memory), the model itself a few
hundred KB. Then runs `/usr/bin/time -v python3 -m aicfc compile model.onnx -o model.aicf
--precision P -j N` in a subprocess and prints: parameters, the fp32 weights' bytes, the
bundle's bytes, the compile's peak resident set size ("Maximum resident set size") and its
ratio to the weights' bytes (issue 20's bar: <= 1.5 at fp16), and the wall time. Files go to
`--folder` (not the repository) and are removed unless `--keep`.

On the GPU machine, `--run` then runs the bundle on random token ids with `aicf-run --check
model.onnx` (onnxruntime's CPU provider on the fp32 model; the fp16 tolerance 1e-2 of the
output's max), prints the upload and check times, and `--sanitize` runs it once more under
`compute-sanitizer --tool memcheck` (kernels launched one by one), its summary line printed.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.external_data import ExternalData  # noqa: E402
from tests.llama_graph import llama_model  # noqa: E402

def build(folder: Path, layers: int, hidden: int, heads: int, kv_heads: int, inter: int, vocab: int,
          seq: int) -> tuple[Path, int, int]:
    """Write model.onnx + model.onnx.data; (path, parameters, bytes of the external data)."""
    folder.mkdir(parents=True, exist_ok=True)
    with ExternalData(folder / "model.onnx.data") as ext:
        model = llama_model(hidden, heads, kv_heads, seq, inter, layers=layers, vocab=vocab,
                            store=ext.store, dtype=np.dtype(np.float32))
    path = folder / "model.onnx"
    path.write_bytes(model.SerializeToString())
    return path, ext.parameters, ext.bytes


def compile_measured(model: Path, out: Path, precision: str, jobs: int) -> dict[str, float]:
    """Run `aicfc compile` under /usr/bin/time -v; its peak RSS (bytes) and wall time (s)."""
    command = ["/usr/bin/time", "-v", sys.executable, "-m", "aicfc", "compile", str(model), "-o", str(out),
               "--precision", precision, "-j", str(jobs)]
    start = time.perf_counter()
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"aicfc compile failed (exit {done.returncode}):\n{done.stderr[-4000:]}")
    peak_kb = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", done.stderr).group(1))
    return {"peak_rss_bytes": peak_kb * 1024, "wall_s": wall}


def run_checked(folder: Path, model: Path, bundle: Path, vocab: int, seq: int, sanitize: bool) -> dict:
    """`aicf-run BUNDLE --check MODEL` on random ids (and under memcheck); its verdict lines."""
    ids = folder / "input_ids.npy"
    np.save(ids, np.random.default_rng(1).integers(0, vocab, (1, seq), dtype=np.int64))
    run = [sys.executable, "-m", "aicf_run", str(bundle), "--input", f"input_ids={ids}",
           "--output-dir", str(folder / "out"), "--check", str(model)]
    start = time.perf_counter()
    done = subprocess.run(run, cwd=ROOT, capture_output=True, text=True)
    result = {"run_s": round(time.perf_counter() - start, 1), "run_exit": done.returncode,
              "check": (done.stdout + done.stderr).strip().splitlines()[-6:]}
    print("\n".join(["aicf-run --check:", *result["check"]]))
    if sanitize:
        command = ["compute-sanitizer", "--tool", "memcheck", *run[:-2], "--no-graph"]
        done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
        summary = [line for line in (done.stdout + done.stderr).splitlines() if "ERROR SUMMARY" in line]
        result.update(memcheck_exit=done.returncode, memcheck=summary[-1:] or ["no summary line"])
        print("memcheck:", *result["memcheck"])
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--folder", default="/tmp/aicf-big")
    ap.add_argument("--layers", type=int, default=22)
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--inter", type=int, default=5632)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--precision", default="fp16")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--keep", action="store_true", help="keep the model and the bundle")
    ap.add_argument("--json", help="also write the figures to this file")
    ap.add_argument("--run", action="store_true", help="run the bundle on the GPU, checked against onnxruntime")
    ap.add_argument("--sanitize", action="store_true", help="with --run: also under compute-sanitizer memcheck")
    args = ap.parse_args()
    folder = Path(args.folder)
    start = time.perf_counter()
    model, params, weight_bytes = build(folder, args.layers, args.hidden, args.heads, args.kv_heads,
                                        args.inter, args.vocab, args.seq)
    built = time.perf_counter() - start
    out = folder / "model.aicf"
    try:
        figures = compile_measured(model, out, args.precision, args.jobs)
        result = {"layers": args.layers, "hidden": args.hidden, "parameters": params,
                  "weights_fp32_bytes": weight_bytes, "model_file_bytes": model.stat().st_size,
                  "bundle_bytes": out.stat().st_size, "precision": args.precision, "jobs": args.jobs,
                  "build_s": round(built, 1), **figures,
                  "rss_over_weights": figures["peak_rss_bytes"] / weight_bytes}
        if args.run:
            result.update(run_checked(folder, model, out, args.vocab, args.seq, args.sanitize))
    finally:
        if not args.keep:
            shutil.rmtree(folder, ignore_errors=True)
    gb = 1e9
    print(f"Llama {args.layers} layers, hidden {args.hidden}: {params / 1e9:.3f} B parameters, "
          f"fp32 weights {weight_bytes / gb:.2f} GB (external data), built in {built:.0f} s")
    print(f"aicfc compile --precision {args.precision} -j {args.jobs}: {figures['wall_s']:.0f} s, "
          f"bundle {result['bundle_bytes'] / gb:.2f} GB")
    print(f"peak RSS {figures['peak_rss_bytes'] / gb:.2f} GB = {result['rss_over_weights']:.2f} x the fp32 "
          f"weights (bar: 1.5 x)")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
    os.sync()


if __name__ == "__main__":
    main()
